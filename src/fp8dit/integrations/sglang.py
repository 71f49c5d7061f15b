"""SGLang diffusion adapter: attention backend ``fp8dit`` for ``sglang.multimodal_gen``.

After ``pip install fp8dit`` next to SGLang (0.5.23) nothing else is needed::

    sglang serve --model-path Wan-AI/Wan2.1-T2V-14B-Diffusers --attention-backend fp8dit
    sglang generate ... --attention-backend fp8dit --ulysses-degree 4
    sglang serve ... --attention-backend fp8dit --ring-degree 2         # LSE-merged ring

fp8dit declares the entry point ``fp8dit = fp8dit.integrations.sglang:register`` in SGLang's
plugin group ``sglang.multimodal_gen.plugins``; SGLang runs :func:`register` in the CLI, the
server and every worker (``SGLANG_PLUGINS``, when set, is an allowlist: include ``fp8dit``).

SGLang-native pipelines: every attention layer that selects ``fp8dit`` (``--attention-backend``,
``--component-attention-backends``, a per-request override) runs :func:`fp8dit.attention` on
SGLang's ``[B, S, H, D]``; ring attention gets ``(out, lse [B, H, S])``, varlen calls
(``forward_varlen``, ring KV chunks) :func:`fp8dit.attention_varlen`. Layers whose masks SGLang
serves itself (joint attention with a key mask) keep SGLang's own SDPA path.
``--backend diffusers``: the name goes to :func:`fp8dit.enable` on the diffusers pipeline (the
diffusers adapter, :mod:`fp8dit.integrations.diffusers`).

What fp8dit cannot run falls back to torch SDPA (:mod:`.engine_core`), the reason logged once.

SGLang has no public way to add an attention backend name: :func:`register` adds a member to its
closed ``AttentionBackendEnum`` and registers three hooks (:data:`HOOK_TARGETS`) through SGLang's
plugin hook registry. Everything private it relies on is listed by
:func:`sglang_internals_problems`.

Known limit (SGLang 0.5.23): the top-level ``sglang generate`` builds its ``ServerArgs`` before it
loads plugins, so its check ``--ring-degree > 1`` needs a ring-capable backend name runs before
fp8dit is declared ring-capable (``ValueError: Ring Attention requires one of the ring-capable
backends (fa, sage_attn), got 'fp8dit'``); ``sglang serve``, ``DiffGenerator.from_pretrained(...)``
and ``python -m sglang.multimodal_gen.runtime.entrypoints.cli.main generate`` load plugins first
(docs/integrations.md).
"""

from __future__ import annotations

import inspect
import logging
import sys

from . import registry
from .engine_core import Engine, attend, attend_varlen
from .registry import add_member, enum_problems, params, raise_if_unfit

BACKEND_NAME = "fp8dit"
MEMBER_NAME = "FP8DIT"
PLUGIN_GROUP = "sglang.multimodal_gen.plugins"
SUPPORTED_VERSION = "0.5.23"

ENGINE = Engine("SGLang", causal_alignment="bottom-right")

# SGLang's modules this adapter touches. Private names in them, each checked by
# sglang_internals_problems():
_PLUGINS = "sglang.multimodal_gen.runtime.platforms.plugins"  # HookRegistry, HookType (public)
_INTERFACE = "sglang.multimodal_gen.runtime.platforms.interface"  # AttentionBackendEnum (closed)
_BACKENDS = "sglang.multimodal_gen.runtime.layers.attention.backends.attention_backend"
_SELECTOR = "sglang.multimodal_gen.runtime.layers.attention.selector"
_SERVER_ARGS = "sglang.multimodal_gen.runtime.server_args.server_args"
_DIFFUSERS_PIPELINE = "sglang.multimodal_gen.runtime.pipelines.diffusers_pipeline"
_USP = "sglang.multimodal_gen.runtime.layers.usp"

HOOK_TARGETS = {
    # AROUND: returns fp8dit's backend class when the selected enum member is FP8DIT.
    "selector": f"{_SELECTOR}._cached_get_attn_backend",
    # BEFORE: adds "fp8dit" to RING_CAPABLE_ATTENTION_BACKENDS before the ring check reads it.
    "ring": f"{_SERVER_ARGS}.ServerArgs._adjust_attention_backend",
    # AROUND: --backend diffusers with "fp8dit" -> fp8dit.enable(pipe) (SGLang skips the name).
    "diffusers": f"{_DIFFUSERS_PIPELINE}.DiffusersPipeline._apply_attention_backend",
}

logger = logging.getLogger("fp8dit")
_registered = False
_classes: dict = {}


def _problems_light() -> list[str]:
    """What register() needs (modules SGLang's plugin loader has imported already)."""
    problems = []
    interface = sys.modules.get(_INTERFACE) or __import__(_INTERFACE, fromlist=["_"])
    names = getattr(interface, "AttentionBackendEnum", None)
    problems += enum_problems(f"{_INTERFACE}.AttentionBackendEnum", names)
    if not problems:
        if not all(isinstance(m.value, int) for m in names):
            problems.append("AttentionBackendEnum values are no longer integers (enum.auto())")
    plugins = sys.modules.get(_PLUGINS) or __import__(_PLUGINS, fromlist=["_"])
    registry, kinds = getattr(plugins, "HookRegistry", None), getattr(plugins, "HookType", None)
    if registry is None or not callable(getattr(registry, "register", None)):
        problems.append(f"{_PLUGINS}.HookRegistry.register is gone")
    if kinds is None or not {"AROUND", "BEFORE"} <= set(getattr(kinds, "__members__", {})):
        problems.append(f"{_PLUGINS}.HookType lacks AROUND or BEFORE")
    return problems


def sglang_internals_problems() -> list[str]:
    """What this adapter needs from SGLang's internals and did not find (empty: fits).

    Imports SGLang's attention runtime (seconds): the plugin entry point checks only the light
    part (:func:`register`); the backend classes check theirs when first built.
    """
    import importlib

    problems = _problems_light()
    backends = importlib.import_module(_BACKENDS)
    base, impl = getattr(backends, "AttentionBackend", None), getattr(backends, "AttentionImpl",
                                                                        None)
    if base is None or impl is None or not hasattr(backends, "AttentionMetadata"):
        problems.append(f"{_BACKENDS}: AttentionBackend, AttentionImpl or AttentionMetadata gone")
    else:
        implemented = {"get_enum", "get_impl_cls", "get_metadata_cls", "get_builder_cls"}
        extra = set(getattr(base, "__abstractmethods__", ())) - implemented
        if extra:
            problems.append(f"AttentionBackend has new abstract methods: {sorted(extra)}")
        if not callable(getattr(base, "supports_ring_rotation", None)):
            problems.append("AttentionBackend.supports_ring_rotation is gone")
        extra = set(getattr(impl, "__abstractmethods__", ())) - {"__init__", "forward"}
        if extra:
            problems.append(f"AttentionImpl has new abstract methods: {sorted(extra)}")
        for name, need in (("forward_varlen", ["self", "query", "key", "value", "cu_seqlens",
                                               "max_seqlen", "cu_seqlens_host"]),
                           ("forward_ring_kv_chunk", ["self", "query", "key", "value"])):
            fn = getattr(impl, name, None)
            if fn is None or params(fn) != need:
                problems.append(f"AttentionImpl.{name} changed: expected parameters {need}, "
                                f"got {None if fn is None else params(fn)}")
    selector = importlib.import_module(_SELECTOR)
    fn = getattr(selector, "_cached_get_attn_backend", None)
    if fn is None or "selected_backend" not in params(getattr(fn, "__wrapped__", fn)):
        problems.append(f"{HOOK_TARGETS['selector']} is gone or takes no selected_backend")
    server_args = importlib.import_module(_SERVER_ARGS)
    if not isinstance(getattr(server_args, "RING_CAPABLE_ATTENTION_BACKENDS", None), tuple):
        problems.append(f"{_SERVER_ARGS}.RING_CAPABLE_ATTENTION_BACKENDS is no longer a tuple")
    if not callable(getattr(getattr(server_args, "ServerArgs", None),
                            "_adjust_attention_backend", None)):
        problems.append(f"{HOOK_TARGETS['ring']} is gone")
    usp = importlib.import_module(_USP)
    src = inspect.getsource(usp.ring_attn) if hasattr(usp, "ring_attn") else ""
    if "return_softmax_lse=True" not in src:
        problems.append(f"{_USP}.ring_attn no longer asks the backend for return_softmax_lse")
    try:
        pipeline = importlib.import_module(_DIFFUSERS_PIPELINE)
    except ImportError as e:  # SGLang without its diffusers extra: that hook stays unresolved
        problems.append(f"{_DIFFUSERS_PIPELINE} does not import ({e})")
    else:
        fn = getattr(getattr(pipeline, "DiffusersPipeline", None), "_apply_attention_backend",
                     None)
        if fn is None or params(fn)[:3] != ["self", "pipe", "server_args"]:
            problems.append(f"{HOOK_TARGETS['diffusers']} changed")
    return problems


def _member():
    """The FP8DIT member of SGLang's AttentionBackendEnum (added once)."""
    import importlib

    names = importlib.import_module(_INTERFACE).AttentionBackendEnum
    member = names._member_map_.get(MEMBER_NAME)
    if member is not None:
        return member
    # the enum's values are enum.auto() integers
    return add_member(names, MEMBER_NAME, max(m.value for m in names) + 1)


def _raise_if(problems: list[str]) -> None:
    raise_if_unfit(problems, "SGLang", "sglang", SUPPORTED_VERSION, "sglang")


# ---------------------------------------------------------------------------------------------
# Hooks (applied by SGLang's apply_plugin_hooks)
# ---------------------------------------------------------------------------------------------


def _selector_hook(original, *args, **kwargs):
    bound = inspect.signature(getattr(original, "__wrapped__", original)).bind(*args, **kwargs)
    selected = bound.arguments.get("selected_backend")
    if selected is not None and getattr(selected, "name", None) == MEMBER_NAME:
        return backend_classes()[0]
    return original(*args, **kwargs)


def _ring_hook(*args, **kwargs):
    module = sys.modules[_SERVER_ARGS]
    names = module.RING_CAPABLE_ATTENTION_BACKENDS
    if BACKEND_NAME not in names:
        module.RING_CAPABLE_ATTENTION_BACKENDS = (*names, BACKEND_NAME)
    return None  # BEFORE hook: arguments unchanged


def _diffusers_hook(original, self, pipe, server_args, *args, **kwargs):
    name = server_args.attention_backend
    if name is None:
        name = getattr(server_args.pipeline_config, "diffusers_attention_backend", None)
    if name is None or name.lower() != BACKEND_NAME:
        return original(self, pipe, server_args, *args, **kwargs)
    from .diffusers import enable

    try:
        enable(pipe)
    except Exception as e:  # as SGLang does for a backend diffusers refuses: warn, go on
        logger.warning("fp8dit SGLang adapter: fp8dit.enable on the diffusers pipeline "
                       "failed (%s: %s); it keeps its attention backend", type(e).__name__, e)
        return None
    logger.info("fp8dit SGLang adapter: diffusers pipeline routed through fp8dit")
    return None


def register() -> None:
    """SGLang's plugin entry point: adds ``fp8dit`` to ``AttentionBackendEnum`` and registers
    the hooks of :data:`HOOK_TARGETS` with SGLang's plugin hook registry (applied by SGLang's
    ``apply_plugin_hooks``). Idempotent.

    Raises
    ------
    RuntimeError
        SGLang changed what this adapter relies on (SGLang logs it and goes on without fp8dit).
    """
    global _registered
    if _registered:
        return
    _raise_if(_problems_light())
    import importlib

    plugins = importlib.import_module(_PLUGINS)
    _member()
    around, before = plugins.HookType.AROUND, plugins.HookType.BEFORE
    plugins.HookRegistry.register(HOOK_TARGETS["selector"], _selector_hook, around)
    plugins.HookRegistry.register(HOOK_TARGETS["ring"], _ring_hook, before)
    plugins.HookRegistry.register(HOOK_TARGETS["diffusers"], _diffusers_hook, around)
    _registered = True


# ---------------------------------------------------------------------------------------------
# The backend (classes built on first use: they subclass SGLang's)
# ---------------------------------------------------------------------------------------------


def backend_classes():
    """(Fp8ditAttentionBackend, Fp8ditAttentionImpl), SGLang subclasses, built once."""
    if _classes:
        return _classes["backend"], _classes["impl"]
    import importlib

    from ..plan import MAX_HEAD_DIM

    problems = [p for p in sglang_internals_problems() if "diffusers_pipeline" not in p]
    _raise_if(problems)
    base = importlib.import_module(_BACKENDS)
    member = _member()

    class Fp8ditAttentionImpl(base.AttentionImpl):
        """fp8dit on SGLang's ``[B, S, H, D]`` (and packed ``[T, H, D]``) layouts."""

        def __init__(self, num_heads, head_size, softmax_scale=None, causal=False,
                     num_kv_heads=None, prefix="", **extra_impl_args):
            self.num_heads, self.head_size = num_heads, head_size
            self.softmax_scale = softmax_scale
            self.causal = causal
            self.dropout = extra_impl_args.get("dropout_p", 0.0)
            self.prefix = prefix

        def forward(self, query, key, value, attn_metadata=None, *, return_softmax_lse=False):
            return attend(ENGINE, query, key, value, layout="NHD", scale=self.softmax_scale,
                          is_causal=self.causal, return_lse=return_softmax_lse,
                          dropout_p=self.dropout)

        def forward_varlen(self, query, key, value, *, cu_seqlens, max_seqlen,
                           cu_seqlens_host=None):
            if cu_seqlens_host is not None:  # the host copy spares a device read
                import torch

                cu_seqlens = torch.tensor(cu_seqlens_host, dtype=torch.int64)
            return attend_varlen(ENGINE, query, key, value, cu_seqlens, cu_seqlens, max_seqlen,
                                 max_seqlen, scale=self.softmax_scale, is_causal=self.causal)

        def forward_ring_kv_chunk(self, query, key, value):
            out, lse = attend(ENGINE, query[None], key[None], value[None],
                              scale=self.softmax_scale, return_lse=True)
            return out[0], lse[0]  # [Tq, H, D], [H, Tq]

    class Fp8ditAttentionBackend(base.AttentionBackend):
        """SGLang attention backend ``fp8dit`` (ring-capable: returns the LSE)."""

        accept_output_buffer = False

        @staticmethod
        def get_supported_head_sizes() -> list[int]:
            return list(range(1, MAX_HEAD_DIM + 1))

        @staticmethod
        def get_enum():
            return member

        @staticmethod
        def get_impl_cls():
            return Fp8ditAttentionImpl

        @staticmethod
        def get_metadata_cls():
            return base.AttentionMetadata

        @staticmethod
        def get_builder_cls():
            return None

        @classmethod
        def supports_ring_rotation(cls) -> bool:
            return True

    return registry.publish(__name__, _classes, Fp8ditAttentionBackend, Fp8ditAttentionImpl)


# the engine resolves fp8dit's classes by import path, built on first use
__getattr__ = registry.lazy_classes(__name__, backend_classes)
