"""diffusers adapter: an attention backend named ``"fp8dit"`` in diffusers' dispatcher.

Importing this module registers the backend (:func:`register`, idempotent; ``enable`` calls it
too), after which each of diffusers' ways to pick a backend works::

    fp8dit.enable(pipe)                              # pipe.transformer (+ transformer_2, Wan2.2)
    pipe.transformer.set_attention_backend("fp8dit")
    with attention_backend("fp8dit"): ...            # diffusers.models.attention_dispatch
    DIFFUSERS_ATTN_BACKEND=fp8dit                    # see below

``DIFFUSERS_ATTN_BACKEND=fp8dit`` needs ``import fp8dit.integrations.diffusers`` before anything
imports ``diffusers.models``: diffusers turns the variable into an ``AttentionBackendName`` when
its dispatcher module is imported, and before fp8dit registers, ``"fp8dit"`` is no member.

Per call the backend runs :func:`fp8dit.attention` (``layout="NHD"``, ``backend="auto"``): the FP8
kernels where they can run, torch SDPA otherwise, with the reason logged once by fp8dit's
dispatcher. Cross-attention to short keys (Wan: 512 text tokens) runs SDPA: its effective length
(``dispatch.effective_tokens``, ~1,000) is under the FP8 floor, and on the H200 at Wan 720p
(75,600 queries x 512 keys x 40 heads, 2026-12-03) FP8 took 2.46 ms (kernel 1.65, quantizing Q
0.50) against cuDNN's 1.56. ``backend="fp8"`` still runs it FP8: the kernels take any key
length (off CUDA there is no floor, and the tiny-Wan test runs those layers FP8). A boolean
key-padding ``attn_mask`` that keeps a prefix of keys (HunyuanVideo's ``[B, 1, 1, S]`` mask,
which drops the prompt's padding) runs FP8 over the kept keys (:mod:`fp8dit.key_padding`: the
lengths are read on the host once per mask tensor, and kept on the device inside CUDA-graph
capture), and so does a per-query ``[B, 1, Sq, Sk]`` mask that is (kept query) & (kept key)
(HunyuanVideo 1.5's, built in every call: one read of it on the GPU and one host read per call;
the dropped query rows get zeros). :func:`enable` spares HunyuanVideo 1.5 that mask: its
processor is replaced by one that passes fp8dit the key mask (:func:`route_through_dispatcher`).
Any other mask, a masked causal call, or a non-zero ``dropout_p`` goes to torch SDPA
(reason logged once on logger ``"fp8dit"``). ``return_lse=True`` also returns the log-sum-exp
``[B, S, H]`` float32, the layout diffusers' ring attention merges.
Context parallelism (Ulysses, ring) is declared supported, forward only: its backward raises.

diffusers (0.42) has no public way to add a backend, so :func:`register` adds a member to
``AttentionBackendName`` and calls ``_AttentionBackendRegistry.register``. Everything private it
relies on is listed by :func:`diffusers_internals_problems`; ``register`` raises with that list
when diffusers changed, instead of failing inside a forward.
"""

from __future__ import annotations

import contextlib
import logging
import sys

import torch
import torch.nn.functional as F

from .. import dispatch as fp8_dispatch
from ..api import _check_scale, attention, check_recipe, select_backend
from ..key_padding import key_padding_attention, key_padding_reason
from ..rope import check_rotary, fused_rotary, rope_tables, rotate_first
from ..sdpa import sdpa_mask
from .registry import add_member, enum_problems, params

BACKEND_NAME = "fp8dit"
TORCH_SDPA = "torch-sdpa"  # layer_backends' name for layers that bypass diffusers' dispatcher
_MEMBER_NAME = "FP8DIT"
_DISPATCH = "diffusers.models.attention_dispatch"
# The parameter names diffusers passes to a backend and, with a context-parallel config, to the
# forward op of its templated ring/Ulysses attention (checked against diffusers' own ops).
_BACKEND_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                   "enable_gqa", "return_lse", "_parallel_config")
_FORWARD_OP_PARAMS = ("ctx", "query", "key", "value", "attn_mask", "dropout_p", "is_causal",
                      "scale", "enable_gqa", "return_lse", "_save_ctx", "_parallel_config")

logger = logging.getLogger("fp8dit")
_logged: set[str] = set()
_records: list[dict] | None = None
_recipe: str | None = None  # recipe of every FP8 call (set_recipe); None: FP8DIT_RECIPE or default
_previous_active = None  # diffusers' active backend before enable() first changed it
_activate_after_register = False  # DIFFUSERS_ATTN_BACKEND=fp8dit was deferred by _dispatch()


def _log_once(msg: str) -> None:
    fp8_dispatch._log_once(msg, _logged)  # not while torch.compile traces (see there)


# ---------------------------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------------------------


def _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    # Same mask handling as diffusers' "native" backend: [B, Sk] -> [B, 1, 1, Sk].
    if (attn_mask is not None and attn_mask.ndim == 2
            and attn_mask.shape[0] == query.shape[0] and attn_mask.shape[1] == key.shape[1]):
        attn_mask = attn_mask[:, None, None, :]
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))
    try:
        torch.broadcast_shapes(attn_mask.shape, q.shape[:3] + k.shape[2:3])
    except RuntimeError:
        raise ValueError(
            f"attn_mask: expected a shape that broadcasts to [B, H, Sq, Sk] = "
            f"{tuple(q.shape[:3] + k.shape[2:3])} (or [B, Sk]), got {tuple(attn_mask.shape)}"
        ) from None
    gqa = {"enable_gqa": True} if (enable_gqa or q.shape[1] != k.shape[1]) else {}
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=sdpa_mask(attn_mask, q.dtype), dropout_p=dropout_p,
        is_causal=is_causal, scale=scale, **gqa
    )
    return out.transpose(1, 2)


def _check_fallback_args(query, key, value, attn_mask, dropout_p, is_causal, scale):
    # The FP8 path validates in fp8dit.attention; the SDPA fallback gets the same checks here,
    # so a bad input raises the same error whichever path the call takes.
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        raise TypeError(
            f"attn_mask: expected None or a torch.Tensor, got {type(attn_mask).__name__}"
        )
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p: expected a float in [0, 1], got {type(dropout_p).__name__}")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout_p: expected a float in [0, 1], got {dropout_p}")
    if attn_mask is not None or dropout_p:
        select_backend(query, key, value, is_causal=is_causal, layout="NHD", backend="sdpa")
        _check_scale(scale, query.shape[-1])


# A per-query [B, 1, Sq, Sk] mask costs its builder an S^2 write and fp8dit an S^2 read per
# call; HunyuanVideo 1.5's processor builds one in every call (22 ms at 480p on an H200, as long
# as the attention), and enable() swaps in a processor that passes the key mask instead.
_PER_QUERY_MASK_HINT = (
    "fp8dit diffusers backend: FP8 over the kept keys of a per-query [B, 1, Sq, Sk] mask; "
    "building and reading such a mask in every call costs about as much as the attention. For "
    "HunyuanVideo 1.5, fp8dit.enable(model) (instead of set_attention_backend) swaps in a "
    "processor that hands fp8dit the [B, 1, 1, S] key mask")


def _rotated(query, key, rotary):
    """q and k rotated first (diffusers' arithmetic): for paths that do not fuse it."""
    if rotary is None:
        return query, key
    return rotate_first(query, key, rope_tables(rotary), rotary.start)


def _key_padding_call(query, key, value, attn_mask, is_causal, scale, return_lse, rotary=None):
    """A masked call through FP8 where it can take it (``fp8dit.key_padding``): (result, None),
    or (None, why not) when the mask's dtype or shape rules it out or ``auto`` prefers SDPA.
    ``rotary`` (checked, :func:`rotary_attention`): fused where the recipe allows."""
    if is_causal:
        return None, "attn_mask with is_causal=True"
    why = key_padding_reason(attn_mask, query.shape[0], key.shape[1], query.shape[1])
    if why is not None:
        return None, why
    name, why = select_backend(query, key, value, layout="NHD")
    if name != "fp8":
        return None, why
    recipe = check_recipe(_recipe)
    scale = _check_scale(scale, query.shape[-1])
    rope, start = None, 0
    if rotary is not None:
        if fused_rotary(query, rotary, recipe):
            rope, start = rope_tables(rotary), rotary.start
        else:
            query, key = _rotated(query, key, rotary)
    if torch.compiler.is_compiling():
        out, lse = torch.ops.fp8dit.attention_fp8_key_padding(
            query, key, value, attn_mask, scale, recipe.name, return_lse, rope, start)
        reason = None  # decided inside the op; a fallback there is logged there
    else:
        out, lse, reason = key_padding_attention(query, key, value, attn_mask, scale=scale,
                                                 recipe=recipe, return_lse=return_lse,
                                                 rope=rope, rope_start=start)
        if reason is None and attn_mask.dim() == 4 and attn_mask.shape[-2] > 1:
            _log_once(_PER_QUERY_MASK_HINT)
    if _records is not None:
        _records.append(dict(
            backend="sdpa" if reason else "fp8", q=tuple(query.shape), k=tuple(key.shape),
            mask=tuple(attn_mask.shape), reason=("fallback: " + reason) if reason
            else "key-padding mask: FP8 over the kept keys",
            recipe=None if reason else recipe.name,
            kernel=None if reason else fp8_dispatch.choose_kernel(
                query.shape[-1], key.shape[1], False, recipe, query.device)[0],
            **_rotary_record(rotary, rope is not None and not reason)))
    if return_lse:
        return (out, lse.transpose(1, 2).contiguous()), None
    return out, None


def _rotary_record(rotary, fused: bool) -> dict:
    if rotary is None:
        return {}
    return dict(rotary="fused" if fused else "rotated first")


def _attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
               return_lse, rotary=None):
    # rotary: only from rotary_attention (checked; no dropout)
    _check_fallback_args(query, key, value, attn_mask, dropout_p, is_causal, scale)
    fallback = None
    if dropout_p:
        fallback = f"dropout_p={dropout_p} (the FP8 kernels are inference-only)"
    elif attn_mask is not None:
        res, why = _key_padding_call(query, key, value, attn_mask, is_causal, scale,
                                     return_lse, rotary)
        if why is None:
            return res
        fallback = f"attn_mask is set: {why}"
    if fallback is not None:
        if return_lse:
            raise NotImplementedError(
                f"fp8dit diffusers backend: return_lse=True is not supported when {fallback}"
            )
        _log_once(f"fp8dit diffusers backend: torch SDPA instead of FP8: {fallback}")
        if _records is not None:
            _records.append(dict(backend="sdpa", reason="fallback: " + fallback,
                                 q=tuple(query.shape), k=tuple(key.shape),
                                 **_rotary_record(rotary, False)))
        query, key = _rotated(query, key, rotary)
        return _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if _records is not None:
        name, why = select_backend(query, key, value, is_causal=is_causal, layout="NHD")
        rec = check_recipe(_recipe) if name == "fp8" else None
        _records.append(dict(backend=name, reason=why, q=tuple(query.shape), k=tuple(key.shape),
                             recipe=rec.name if rec else None,
                             kernel=fp8_dispatch.choose_kernel(
                                 query.shape[-1], key.shape[1], is_causal, rec,
                                 query.device)[0] if rec else None,
                             **_rotary_record(rotary, rec is not None and rotary is not None
                                              and fused_rotary(query, rotary, rec))))
    out = attention(query, key, value, layout="NHD", scale=scale, is_causal=is_causal,
                    return_lse=return_lse, recipe=_recipe, rotary=rotary)
    if return_lse:
        out, lse = out
        return out, lse.transpose(1, 2).contiguous()  # fp8dit [B, H, S] -> diffusers [B, S, H]
    return out


def fp8dit_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    return_lse: bool = False,
    _parallel_config=None,
):
    """The function diffusers' dispatcher calls for backend ``"fp8dit"``.

    Parameters
    ----------
    query : Tensor ``[B, Sq, H, D]``; key, value : Tensor ``[B, Sk, Hkv, D]`` (diffusers' layout)
    attn_mask, dropout_p : a boolean key-padding mask that keeps a prefix of keys runs FP8 over
        the kept keys; any other mask, or a non-zero dropout, runs torch SDPA.
    return_lse : bool
        Also return the log-sum-exp ``[B, Sq, H]`` float32 (natural log).

    Returns
    -------
    out ``[B, Sq, H, D]`` in query's dtype, or ``(out, lse)``.

    Example
    -------
    >>> with attention_backend("fp8dit"):
    ...     out = dispatch_attention_fn(q, k, v)
    """
    if _parallel_config is not None:
        dispatch = sys.modules[_DISPATCH]
        return dispatch._templated_context_parallel_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse,
            forward_op=_cp_forward_op, backward_op=_cp_backward_op,
            _parallel_config=_parallel_config,
        )
    return _attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                      return_lse)


def rotary_attention(query, key, value, rotary, attn_mask=None):
    """fp8dit's diffusers backend for a self-attention whose q and k still need their rotary
    embedding (``rotary``: what ``fp8dit.attention(rotary=...)`` takes, a ``(cos, sin)`` pair
    in diffusers' Wan arithmetic or an :class:`fp8dit.Rotary`): what the dispatcher's call with
    the rotated q and k gives, bitwise, without the rotated copies. ``attn_mask``: a key mask
    (HunyuanVideo's), taken as the dispatcher's call takes it. The processors of
    :mod:`~fp8dit.integrations.diffusers_processors` call it."""
    rotary = check_rotary(rotary, query, query.shape[1], key.shape[1], query.shape[-1])
    return _attention(query, key, value, attn_mask, 0.0, False, None, False, False,
                      rotary=rotary)


def _wait_collectives(*tensors):
    # Ring attention hands over key/value as views of an all-gather that may still be in flight
    # (torch's AsyncCollectiveTensor). A torch op waits on first use; the eager Triton launch
    # bypasses torch's dispatcher and would read the raw buffer (on CPU: no storage at all).
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    return tuple(t.wait() if isinstance(t, AsyncCollectiveTensor) else t for t in tensors)


def _cp_forward_op(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                   scale=None, enable_gqa=False, return_lse=False, _save_ctx=True,
                   _parallel_config=None):
    # Forward only, so nothing is saved on ctx for a backward.
    query, key, value = _wait_collectives(query, key, value)
    return _attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                      return_lse)


def _cp_backward_op(ctx, grad_out, *args, **kwargs):
    raise NotImplementedError(
        "fp8dit's diffusers backend is forward-only (inference); for training under context "
        "parallelism use a backend with a backward, e.g. 'flash' or '_native_cudnn'"
    )


def set_recipe(name: str | None) -> None:
    """Accuracy recipe of every call of the ``"fp8dit"`` backend, process-wide.

    ``name`` is a key of ``fp8dit.recipes.RECIPES``; ``None`` restores ``FP8DIT_RECIPE`` or the
    default. :func:`enable` calls it with ``policy.recipe`` when the policy has one.
    """
    global _recipe
    _recipe = None if name is None else check_recipe(name).name  # raises on an unknown name


@contextlib.contextmanager
def record_calls():
    """Collect one dict per call of the backend: ``backend`` ("fp8" or "sdpa"), ``reason``,
    ``q`` and ``k`` shapes, ``mask``'s shape (masked calls that reach FP8's mask reading),
    ``recipe`` and ``kernel`` (FP8 calls). For inspection (``fp8dit
    demo``); it adds a dispatch check per call.

    Example
    -------
    >>> with record_calls() as calls:
    ...     model(**inputs)
    """
    global _records
    previous, _records = _records, []
    try:
        yield _records
    finally:
        _records = previous


# ---------------------------------------------------------------------------------------------
# Registration in diffusers' dispatcher
# ---------------------------------------------------------------------------------------------


def _dispatch():
    """diffusers' dispatcher module, imported so that DIFFUSERS_ATTN_BACKEND=fp8dit works."""
    global _activate_after_register
    module = sys.modules.get(_DISPATCH)
    if module is not None:
        return module
    import diffusers.utils.constants as constants

    wanted = getattr(constants, "DIFFUSERS_ATTN_BACKEND", None)
    if wanted != BACKEND_NAME:
        import diffusers.models.attention_dispatch as module

        return module
    # The dispatcher turns the variable into an enum member at import, before fp8dit's member
    # exists: import it with "native" and make fp8dit active once registered.
    constants.DIFFUSERS_ATTN_BACKEND = "native"
    try:
        import diffusers.models.attention_dispatch as module
    finally:
        constants.DIFFUSERS_ATTN_BACKEND = wanted
    _activate_after_register = True
    return module


def diffusers_internals_problems(dispatch=None) -> list[str]:
    """What this adapter needs from diffusers' private dispatcher and did not find (empty: fits)."""
    dispatch = dispatch or _dispatch()
    problems = []
    names = getattr(dispatch, "AttentionBackendName", None)
    problems += enum_problems("AttentionBackendName", names, str_valued=True)
    registry = getattr(dispatch, "_AttentionBackendRegistry", None)
    if registry is None:
        problems.append("_AttentionBackendRegistry is gone")
    else:
        for attr in ("_backends", "_supported_arg_names", "_supports_context_parallel",
                     "_active_backend", "set_active_backend", "get_active_backend"):
            if not hasattr(registry, attr):
                problems.append(f"_AttentionBackendRegistry.{attr} is gone")
        register = getattr(registry, "register", None)
        need = {"backend", "constraints", "supports_context_parallel"}
        if register is None or not need <= set(params(register)):
            problems.append(f"_AttentionBackendRegistry.register no longer takes {sorted(need)}")
    fn = getattr(dispatch, "dispatch_attention_fn", None)
    if fn is None:
        problems.append("dispatch_attention_fn is gone")
    else:
        # The dispatcher silently drops arguments a backend does not name: a renamed one (say
        # attn_mask) would be lost without an error.
        passed = [p for p in params(fn)[:8] if p not in _BACKEND_PARAMS]
        if passed:
            problems.append(f"dispatch_attention_fn passes arguments fp8dit lacks: {passed}")
    templated = getattr(dispatch, "_templated_context_parallel_attention", None)
    need = {"forward_op", "backward_op", "return_lse", "_parallel_config"}
    if templated is None or not need <= set(params(templated)):
        problems.append(f"_templated_context_parallel_attention no longer takes {sorted(need)}")
    native_op = getattr(dispatch, "_native_attention_forward_op", None)
    if native_op is None or tuple(params(native_op)) != _FORWARD_OP_PARAMS:
        got = None if native_op is None else params(native_op)
        problems.append(
            f"context-parallel forward ops changed: expected parameters {list(_FORWARD_OP_PARAMS)}"
            f" like _native_attention_forward_op, got {got}"
        )
    return problems


def _add_backend_name(names, value: str = BACKEND_NAME, member_name: str = _MEMBER_NAME):
    """Add FP8DIT = "fp8dit" (or ``member_name = value``: benchmarks register baselines) to the
    AttentionBackendName enum (idempotent)."""
    return add_member(names, member_name, value)


def register():
    """Register backend ``"fp8dit"`` in diffusers' dispatcher (idempotent); returns its name member.

    Raises
    ------
    RuntimeError
        diffusers' private dispatcher changed in a way this adapter does not fit.
    """
    global _activate_after_register
    dispatch = _dispatch()
    problems = diffusers_internals_problems(dispatch)
    if problems:
        import diffusers

        raise RuntimeError(
            f"fp8dit's diffusers adapter does not fit diffusers {diffusers.__version__} "
            f"(written against 0.42): " + "; ".join(problems)
            + ". Install diffusers<0.43 or update fp8dit/integrations/diffusers.py."
        )
    member = _add_backend_name(dispatch.AttentionBackendName)
    registry = dispatch._AttentionBackendRegistry
    if registry._backends.get(member) is not fp8dit_attention:
        registry.register(member, constraints=[], supports_context_parallel=True)(fp8dit_attention)
    if _activate_after_register:
        registry.set_active_backend(member)
        _activate_after_register = False
    return member


# ---------------------------------------------------------------------------------------------
# enable / disable on pipelines and models
# ---------------------------------------------------------------------------------------------


def _models(pipe_or_model) -> list[tuple[str, object]]:
    if hasattr(pipe_or_model, "set_attention_backend") and hasattr(pipe_or_model, "modules"):
        return [("", pipe_or_model)]
    found = [(name, getattr(pipe_or_model, name, None)) for name in ("transformer", "transformer_2")
             if getattr(pipe_or_model, name, None) is not None]
    if not found:
        raise TypeError(
            "pipe_or_model: expected a diffusers model (with set_attention_backend) or a pipeline "
            f"with .transformer (and optionally .transformer_2), got {type(pipe_or_model).__name__}"
        )
    return found


def _attention_processors(model):
    for name, module in model.named_modules():
        processor = getattr(module, "processor", None)
        if processor is not None and hasattr(processor, "_attention_backend"):
            yield name, processor


def _sdpa_direct_layers(model):
    """(name, module) of attention layers whose processor ignores diffusers' backends."""
    for name, module in model.named_modules():
        processor = getattr(module, "processor", None)
        if (processor is not None and callable(processor) and callable(
                getattr(module, "set_processor", None))
                and not hasattr(processor, "_attention_backend")):
            yield name, module


def route_through_dispatcher(pipe_or_model) -> list[str]:
    """Replace attention processors that call torch SDPA directly (CogVideoX's) by ones that
    go through diffusers' dispatcher (:mod:`fp8dit.integrations.diffusers_processors`), so that
    ``set_attention_backend`` reaches those layers, and HunyuanVideo 1.5's by one that hands
    fp8dit a key mask instead of building a ``[B, 1, S, S]`` mask in every call;
    :func:`enable` calls it. Returns the layers replaced now. Layers whose processor calls
    torch SDPA and has no replacement keep running torch SDPA: a warning names their processor
    once. :func:`restore_processors` puts the originals back.

    With diffusers' ``"native"`` backend the replaced layers compute bitwise what they did.
    """
    from .diffusers_processors import replacement_for

    replaced, left = [], {}
    for prefix, model in _models(pipe_or_model):
        for name, module in model.named_modules():
            processor = getattr(module, "processor", None)
            if processor is None or not callable(getattr(module, "set_processor", None)):
                continue
            new = replacement_for(processor)
            if new is not None:
                module.set_processor(new)
                replaced.append(".".join(p for p in (prefix, name) if p))
            elif callable(processor) and not hasattr(processor, "_attention_backend"):
                left.setdefault(type(processor).__name__, []).append(name)
    for cls, layers in left.items():
        _log_once(f"fp8dit: {len(layers)} attention layer(s) ({layers[0]}, ...) use diffusers' "
                  f"{cls}, which calls torch SDPA directly and ignores attention backends: "
                  f"they run torch SDPA, not fp8dit")
    return replaced


def restore_processors(pipe_or_model, layers=None) -> list[str]:
    """Put back the processors :func:`route_through_dispatcher` replaced (only those of
    ``layers``, names as it returned them, when given); returns the layers restored. A
    dispatching original gets the backend and context-parallel settings its replacement had."""
    from .diffusers_processors import REPLACEMENT_TYPES

    try:
        names = None if layers is None or isinstance(layers, str) else list(layers)
    except TypeError:  # not iterable
        names = None
    if layers is not None and (names is None or not all(isinstance(n, str) for n in names)):
        raise TypeError(f"layers: expected None or a list of layer names, got {layers!r}")
    wanted = None if names is None else set(names)
    restored = []
    for prefix, model in _models(pipe_or_model):
        for name, module in model.named_modules():
            processor = getattr(module, "processor", None)
            layer = ".".join(p for p in (prefix, name) if p)
            if (isinstance(processor, REPLACEMENT_TYPES)
                    and processor.original is not None
                    and (wanted is None or layer in wanted)):
                original = processor.original
                for attr in ("_attention_backend", "_parallel_config"):
                    if hasattr(original, attr):  # CogVideoX's have neither
                        setattr(original, attr, getattr(processor, attr))
                module.set_processor(original)
                restored.append(layer)
    return restored


def enable(pipe_or_model, policy=None):
    """Route a diffusers pipeline's transformer(s), or a diffusers model, through fp8dit.

    Parameters
    ----------
    pipe_or_model : DiffusionPipeline or ModelMixin
        A pipeline: its ``transformer`` and, when present, ``transformer_2`` (Wan2.2's low-noise
        expert). A model: the model itself. Calls diffusers' ``set_attention_backend("fp8dit")``,
        which also makes ``"fp8dit"`` diffusers' active backend (:func:`disable` undoes both).
        First, processors that call torch SDPA directly and so ignore any backend (CogVideoX's)
        are replaced by ones that go through diffusers' dispatcher, and HunyuanVideo 1.5's by
        one that hands fp8dit the key mask instead of building a ``[B, 1, S, S]`` mask in every
        call (:func:`route_through_dispatcher`).
    policy : object, optional
        Per-layer choice, asked once per attention layer here (per-step switching: see
        :class:`fp8dit.integrations.guard.QualityPolicy`):
        ``policy.backend_for(layer_name) -> str`` returns a diffusers backend name for the layer
        (``"fp8dit"``, ``"native"``, ...); ``layer_name`` is the module path, prefixed with the
        pipeline attribute for a pipeline (``"transformer.blocks.0.attn1"``). ``None``: all layers
        use fp8dit. A ``policy.recipe`` that is not ``None`` goes to :func:`set_recipe`.
        :class:`fp8dit.integrations.guard.QualityPolicy` is such a policy, with per-step switching.

    Returns
    -------
    pipe_or_model, for chaining.

    Example
    -------
    >>> pipe = fp8dit.enable(WanPipeline.from_pretrained(...).to("cuda"))
    """
    global _previous_active
    if policy is not None and not callable(getattr(policy, "backend_for", None)):
        raise TypeError(
            "policy: expected None or an object with a backend_for(layer_name) method, "
            f"got {type(policy).__name__}"
        )
    models = _models(pipe_or_model)
    recipe = None
    if getattr(policy, "recipe", None) is not None:
        recipe = check_recipe(policy.recipe, "policy.recipe").name
    member = register()
    dispatch = sys.modules[_DISPATCH]
    names = dispatch.AttentionBackendName
    routed = route_through_dispatcher(pipe_or_model)  # CogVideoX: see the function
    # Every layer's choice is asked and checked before anything else changes, so a bad answer
    # for a late layer leaves the model (and the recipe) as it was.
    choices = []
    try:
        for prefix, model in models:
            if policy is None:
                continue
            for name, processor in _attention_processors(model):
                layer = ".".join(p for p in (prefix, name) if p)
                choice = policy.backend_for(layer)
                if choice not in names._value2member_map_ or choice not in \
                        dispatch._AttentionBackendRegistry._backends:
                    raise ValueError(
                        f"policy.backend_for({layer!r}): expected a registered diffusers "
                        f"backend name (e.g. 'fp8dit', 'native'), got {choice!r}"
                    )
                choices.append((processor, names(choice)))
    except BaseException:
        restore_processors(pipe_or_model, routed)
        raise
    if recipe is not None:
        set_recipe(recipe)
    active = dispatch._AttentionBackendRegistry.get_active_backend()[0]
    if _previous_active is None and active != member:
        _previous_active = active
    for _, model in models:
        model.set_attention_backend(BACKEND_NAME)
    for processor, backend in choices:
        processor._attention_backend = backend
    return pipe_or_model


def disable(pipe_or_model):
    """Undo :func:`enable`: layers back to diffusers' active backend, which is restored too,
    replaced processors back to diffusers' own (:func:`restore_processors`), and the recipe back
    to the default (:func:`set_recipe`).

    diffusers' own ``reset_attention_backend`` leaves ``"fp8dit"`` active globally (its
    ``set_attention_backend`` sets both), so the layers would still run fp8dit.
    """
    global _previous_active, _recipe
    models = _models(pipe_or_model)
    dispatch = _dispatch()
    _recipe = None
    for _, model in models:
        model.reset_attention_backend()
    restore_processors(pipe_or_model)
    registry = dispatch._AttentionBackendRegistry
    if registry.get_active_backend()[0] == BACKEND_NAME:
        registry.set_active_backend(_previous_active or dispatch.AttentionBackendName.NATIVE)
    _previous_active = None
    return pipe_or_model


def layer_backends(pipe_or_model) -> dict[str, str]:
    """The diffusers backend each attention layer dispatches to now, by layer name; layers whose
    processor calls torch SDPA itself (:func:`route_through_dispatcher`) read ``"torch-sdpa"``."""
    dispatch = _dispatch()
    active = dispatch._AttentionBackendRegistry.get_active_backend()[0]
    out = {}
    for prefix, model in _models(pipe_or_model):
        for name, processor in _attention_processors(model):
            backend = processor._attention_backend or active
            out[".".join(p for p in (prefix, name) if p)] = getattr(backend, "value", backend)
        for name, _ in _sdpa_direct_layers(model):
            out[".".join(p for p in (prefix, name) if p)] = TORCH_SDPA
    return out


# Registered at import, so that ``import fp8dit.integrations.diffusers`` is all
# ``set_attention_backend("fp8dit")`` and ``DIFFUSERS_ATTN_BACKEND=fp8dit`` (diffusers' variable,
# read when its dispatcher is first imported: see the module docstring) need.
register()
