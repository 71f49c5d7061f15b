"""fp8dit: fast and accurate FP8 attention for diffusion transformers."""

from . import ops as _ops  # noqa: F401  (registers the torch.library custom ops)
from .api import attention, attention_varlen, select_backend
from .dispatch import BackendUnavailableError
from .recipes import DEFAULT_RECIPE, RECIPES

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailableError",
    "DEFAULT_RECIPE",
    "RECIPES",
    "attention",
    "attention_varlen",
    "select_backend",
]
