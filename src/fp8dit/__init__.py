"""fp8dit: fast and accurate FP8 attention for diffusion transformers."""

from . import ops as _ops  # noqa: F401  (registers the torch.library custom ops)
from .api import attention, attention_varlen, select_backend
from .dispatch import BackendUnavailableError
from .recipes import DEFAULT_RECIPE, RECIPES
from .rope import Rotary
from .warmup import warmup

__version__ = "0.1.0"


def enable(pipe_or_model, policy=None):
    """Route a diffusers pipeline's or model's attention through fp8dit (needs diffusers).

    Imported lazily: diffusers is an optional extra (``pip install fp8dit[diffusers]``).
    """
    from .integrations.diffusers import enable as _enable

    return _enable(pipe_or_model, policy=policy)


__all__ = [
    "BackendUnavailableError",
    "DEFAULT_RECIPE",
    "RECIPES",
    "Rotary",
    "attention",
    "enable",
    "attention_varlen",
    "select_backend",
    "warmup",
]
