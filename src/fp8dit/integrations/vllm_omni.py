"""vLLM-Omni (0.30.0) adapter: diffusion attention backend ``fp8dit``.

After ``pip install fp8dit`` next to vLLM-Omni nothing else is needed; any of vLLM-Omni's three
ways to pick a diffusion attention backend takes the name::

    vllm serve Wan-AI/Wan2.2-TI2V-5B-Diffusers --omni --diffusion-attention-backend fp8dit
    DIFFUSION_ATTENTION_BACKEND=fp8dit vllm serve ... --omni
    vllm serve ... --omni \
        --diffusion-attention-config '{"per_role": {"self": {"backend": "fp8dit"}}}'

fp8dit declares the entry point ``fp8dit = fp8dit.integrations.vllm_omni:register_plugin`` in
vLLM-Omni's plugin group ``vllm_omni.general_plugins``, which vLLM-Omni loads in its engine and
in every diffusion worker before the model is built (``VLLM_PLUGINS``, when set, is an
allowlist: include ``fp8dit``).

Per call: :func:`fp8dit.attention` on vLLM-Omni's ``[B, S, H, D]`` (``H`` a multiple of the
key/value heads: GQA) with the layer's softmax scale. A key mask in vLLM-Omni's convention
(``[B, Sk]``, made boolean as its SDPA backend does) or SDPA's (``[B or 1, 1, 1, Sk]``) that
keeps a prefix of the keys runs FP8 over the kept keys; any other mask runs torch SDPA, the
reason logged once (:mod:`.engine_core`). A causal call with ``Sq != Sk`` aligns bottom-right,
as vLLM-Omni's FLASH_ATTN does (torch SDPA with that mask).

Sequence parallelism: vLLM-Omni's Ulysses (all-to-all over heads, joint text tokens appended)
and all-gather-KV hand each rank's attention to the backend, so fp8dit runs there. Its ring
attention bypasses backends: with fp8dit selected it runs its own FlashAttention ring kernels
(or, where it has none for the device, refuses the explicit selection); fp8dit is not called.

vLLM-Omni's ``DiffusionAttentionBackendEnum`` is closed (``register_diffusion_backend`` only
overrides members): :func:`register` adds the member ``FP8DIT`` whose value is the backend's
class path, as vLLM-Omni's own members are. What it relies on is listed by
:func:`vllm_omni_internals_problems`.
"""

from __future__ import annotations

import logging
import sys

from . import registry
from .engine_core import Engine, attend
from .registry import add_member, enum_problems, import_engine, params, raise_if_unfit

BACKEND_NAME = "fp8dit"
MEMBER_NAME = "FP8DIT"
PLUGIN_GROUP = "vllm_omni.general_plugins"
SUPPORTED_VERSION = "0.30.0"
BACKEND_PATH = f"{__name__}.Fp8ditAttentionBackend"
# The platforms whose forward vLLM-Omni routes to ``forward_cuda`` (ROCm through forward_hip).
SUPPORTED_PLATFORMS = ("cuda", "rocm")

ENGINE = Engine("vLLM-Omni", causal_alignment="bottom-right")

# vLLM-Omni's modules this adapter touches; the private names in them are checked by
# vllm_omni_internals_problems().
_REGISTRY = "vllm_omni.diffusion.attention.backends.registry"  # DiffusionAttentionBackendEnum
_ABSTRACT = "vllm_omni.diffusion.attention.backends.abstract"  # AttentionBackend, AttentionImpl
_SELECTOR = "vllm_omni.diffusion.attention.selector"  # get_attn_backend_for_role
_PLATFORM = "vllm_omni.platforms.interface"  # OmniPlatform.validate_diffusion_attn_backend

_BACKEND_ABSTRACTS = {"get_name", "get_impl_cls", "get_metadata_cls", "get_builder_cls",
                      "get_supported_head_sizes"}
_IMPL_PARAMS = ["self", "num_heads", "head_size", "softmax_scale", "causal", "num_kv_heads",
                "prefix", "qkv_layout", "backend_kwargs"]
_FORWARD_PARAMS = ["self", "query", "key", "value", "attn_metadata"]

logger = logging.getLogger("fp8dit")
_classes: dict = {}


def _problems_light() -> list[str]:
    """What :func:`register` needs: the backend enum (imported with vLLM-Omni's plugin loader)."""
    import importlib

    reg = importlib.import_module(_REGISTRY)
    names = getattr(reg, "DiffusionAttentionBackendEnum", None)
    problems = enum_problems(f"{_REGISTRY}.DiffusionAttentionBackendEnum", names)
    if problems:
        return problems
    if not all(isinstance(m.value, str) and "." in m.value for m in names):
        problems.append("DiffusionAttentionBackendEnum values are no longer class paths")
    if not callable(getattr(names, "get_class", None)):
        problems.append("DiffusionAttentionBackendEnum.get_class is gone")
    return problems


def vllm_omni_internals_problems() -> list[str]:
    """What this adapter needs from vLLM-Omni's internals and did not find (empty: fits).

    Imports vLLM-Omni's attention selector (seconds): the plugin entry point checks only the
    light part (:func:`register`); the backend classes check the rest when first built.
    """
    import importlib

    problems = _problems_light()
    abstract = importlib.import_module(_ABSTRACT)
    base, impl = getattr(abstract, "AttentionBackend", None), getattr(abstract, "AttentionImpl",
                                                                        None)
    metadata = getattr(abstract, "AttentionMetadata", None)
    if base is None or impl is None or metadata is None:
        return problems + [f"{_ABSTRACT}: AttentionBackend, AttentionImpl or AttentionMetadata "
                           "gone"]
    extra = set(getattr(base, "__abstractmethods__", ())) - _BACKEND_ABSTRACTS
    if extra:
        problems.append(f"AttentionBackend has new abstract methods: {sorted(extra)}")
    for attr in ("supports_attention_mask", "validate_available"):
        if not callable(getattr(base, attr, None)):
            problems.append(f"AttentionBackend.{attr} is gone")
    if not hasattr(base, "supported_platforms"):
        problems.append("AttentionBackend.supported_platforms is gone")
    extra = set(getattr(impl, "__abstractmethods__", ())) - {"__init__"}
    if extra:
        problems.append(f"AttentionImpl has new abstract methods: {sorted(extra)}")
    got = params(impl.__init__)[:len(_IMPL_PARAMS)]
    if got != _IMPL_PARAMS:
        problems.append(f"AttentionImpl.__init__ changed: expected parameters {_IMPL_PARAMS}, "
                        f"got {got}")
    for name in ("forward_cuda", "forward_hip"):
        fn = getattr(impl, name, None)
        if fn is None or params(fn) != _FORWARD_PARAMS:
            problems.append(f"AttentionImpl.{name} changed: expected parameters "
                            f"{_FORWARD_PARAMS}, got {None if fn is None else params(fn)}")
    if "attn_mask" not in getattr(metadata, "__dataclass_fields__", {}):
        problems.append("AttentionMetadata.attn_mask is gone")
    selector = importlib.import_module(_SELECTOR)
    fn = getattr(selector, "get_attn_backend_for_role", None)
    if fn is None or params(fn)[:3] != ["role", "head_size", "attention_config"]:
        problems.append(f"{_SELECTOR}.get_attn_backend_for_role is gone or changed")
    platform = getattr(importlib.import_module(_PLATFORM), "OmniPlatform", None)
    if not callable(getattr(platform, "validate_diffusion_attn_backend", None)):
        problems.append(f"{_PLATFORM}.OmniPlatform.validate_diffusion_attn_backend is gone")
    return problems


def _raise_if(problems: list[str]) -> None:
    raise_if_unfit(problems, "vLLM-Omni", "vllm-omni", SUPPORTED_VERSION, "vllm_omni")


def register():
    """Add ``FP8DIT`` (value: the backend's class path) to vLLM-Omni's
    ``DiffusionAttentionBackendEnum``; idempotent. Returns the member.

    Raises
    ------
    ImportError
        vLLM-Omni is not installed.
    RuntimeError
        vLLM-Omni's internals changed in a way this adapter does not fit.
    """
    import_engine(_REGISTRY, "vLLM-Omni", "vllm-omni", SUPPORTED_VERSION, "vllm-omni")
    _raise_if(_problems_light())
    names = sys.modules[_REGISTRY].DiffusionAttentionBackendEnum
    return add_member(names, MEMBER_NAME, BACKEND_PATH)


def register_plugin() -> None:
    """vLLM-Omni's general-plugin entry point: :func:`register`, with a misfit logged instead of
    raised. vLLM-Omni calls general plugins unguarded in every process, so an exception here
    would stop it whichever backend is selected; selecting ``fp8dit`` then fails in vLLM-Omni's
    selector ("Unknown diffusion attention backend"), after this warning."""
    try:
        register()
    except RuntimeError as e:
        logger.warning("%s The diffusion attention backend 'fp8dit' is not registered.", e)


# ---------------------------------------------------------------------------------------------
# The backend (classes built on first use: they subclass vLLM-Omni's)
# ---------------------------------------------------------------------------------------------


def _sdpa_mask(query, key, attn_metadata):
    """The metadata's mask in SDPA's convention. vLLM-Omni's key mask ``[B, Sk]`` becomes
    boolean ``[B, 1, 1, Sk]`` as its SDPA backend makes it; any other shape is SDPA's already."""
    mask = None if attn_metadata is None else attn_metadata.attn_mask
    if mask is None:
        return None
    if mask.ndim == 2 and tuple(mask.shape) == (query.shape[0], key.shape[1]):
        import torch

        return mask.to(torch.bool)[:, None, None, :]
    return mask


def backend_classes():
    """(Fp8ditAttentionBackend, Fp8ditAttentionImpl), vLLM-Omni subclasses, built once."""
    if _classes:
        return _classes["backend"], _classes["impl"]
    import importlib

    from ..plan import MAX_HEAD_DIM

    import_engine(_ABSTRACT, "vLLM-Omni", "vllm-omni", SUPPORTED_VERSION, "vllm-omni")
    _raise_if(vllm_omni_internals_problems())
    abstract = importlib.import_module(_ABSTRACT)

    class Fp8ditAttentionImpl(abstract.AttentionImpl):
        """fp8dit on vLLM-Omni's ``[B, S, H, D]`` q and ``[B, S, Hkv, D]`` k, v."""

        def __init__(self, num_heads, head_size, softmax_scale, causal=False,
                     num_kv_heads=None, prefix="", qkv_layout=None, backend_kwargs=None,
                     **extra_impl_args):
            self.num_heads, self.head_size = num_heads, head_size
            self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
            self.softmax_scale = softmax_scale
            self.causal = causal
            self.prefix = prefix
            if backend_kwargs:  # vLLM-Omni's config has none for fp8dit; its SDPA warns too
                ENGINE.log_once(f"fp8dit vLLM-Omni backend: backend_kwargs ignored: "
                                f"{sorted(backend_kwargs)}")

        def forward_cuda(self, query, key, value, attn_metadata=None):
            return attend(ENGINE, query, key, value, layout="NHD", scale=self.softmax_scale,
                          is_causal=self.causal,
                          attn_mask=_sdpa_mask(query, key, attn_metadata))

    class Fp8ditAttentionBackend(abstract.AttentionBackend):
        """vLLM-Omni diffusion attention backend ``fp8dit`` (masks taken: key padding FP8,
        others torch SDPA)."""

        accept_output_buffer = False
        supported_platforms = SUPPORTED_PLATFORMS

        @classmethod
        def supports_attention_mask(cls, attention_spec=None) -> bool:
            return True

        @staticmethod
        def get_name() -> str:
            return MEMBER_NAME

        @staticmethod
        def get_impl_cls():
            return Fp8ditAttentionImpl

        @staticmethod
        def get_metadata_cls():
            return abstract.AttentionMetadata

        @staticmethod
        def get_builder_cls():
            return None

        @staticmethod
        def get_supported_head_sizes() -> list[int]:
            return list(range(1, MAX_HEAD_DIM + 1))

    return registry.publish(__name__, _classes, Fp8ditAttentionBackend, Fp8ditAttentionImpl)


# the engine resolves fp8dit's classes by import path, built on first use
__getattr__ = registry.lazy_classes(__name__, backend_classes)
