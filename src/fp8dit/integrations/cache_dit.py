"""cache-dit (1.5.3) adapter: attention backend ``fp8dit``.

Importing this module registers it (:func:`register`, idempotent)::

    import fp8dit.integrations.cache_dit
    cache_dit.enable_cache(pipe, attention_backend="fp8dit")                # one process
    cache_dit.enable_cache(pipe, parallelism_config=ParallelismConfig(
        ulysses_size=2, attention_backend="fp8dit"))                        # or ring_size=2
    cache_dit.set_attn_backend(pipe, "fp8dit")

cache-dit resolves ``"fp8dit"`` in its own registry and sets it on the diffusers model
(``set_attention_backend``, where fp8dit's diffusers adapter answers,
:mod:`fp8dit.integrations.diffusers`); processors cache-dit patches for its context parallelism
call :func:`fp8dit_attention` through cache-dit's dispatcher, which runs it under cache-dit's own
Ulysses and ring attention (``forward_op``: fp8dit with the LSE ``[B, S, H]`` the ring merges).

Per call :func:`fp8dit.attention` on ``[B, S, H, D]``. In one process a boolean key-padding
mask (``[B or 1, 1, 1, Sk]``, a prefix of keys kept) runs FP8 over the kept keys, any other mask
or a dropout torch SDPA (:mod:`.engine_core`, reason logged once); under context parallelism
any mask runs cache-dit's ``native`` backend (cache-dit admits masks there only into its own
forward ops), reason logged once.

cache-dit has no public way to add a backend name: :func:`register` adds a member to its
``_AttnBackend`` enum and registers with ``_AttnBackendRegistry.register`` (without bridging
it to diffusers: diffusers' ``"fp8dit"`` stays fp8dit's diffusers adapter). What it relies on
is listed by :func:`cache_dit_internals_problems`.
"""

from __future__ import annotations

import sys

from .engine_core import Engine, attend, wait_collectives
from .registry import add_member, enum_problems, import_engine, params, raise_if_unfit

BACKEND_NAME = "fp8dit"
MEMBER_NAME = "FP8DIT"
SUPPORTED_VERSION = "1.5.3"

ENGINE = Engine("cache-dit", causal_alignment="top-left")

# cache-dit's module this adapter touches; the private names in it are checked by
# cache_dit_internals_problems().
_REGISTER = "cache_dit.attention.backends.register"  # _AttnBackend, _AttnBackendRegistry, ...
_NATIVE = "cache_dit.attention.backends.native"  # the fallback under context parallelism
_BACKEND_PARAMS = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                   "enable_gqa", "return_lse", "cp_gqa_strategy", "_cp_config"]
_FORWARD_OP_PARAMS = ["ctx", "query", "key", "value", "attn_mask", "dropout_p", "is_causal",
                      "scale", "enable_gqa", "return_lse", "_save_ctx", "_cp_config"]


def cache_dit_internals_problems() -> list[str]:
    """What this adapter needs from cache-dit's internals and did not find (empty: fits)."""
    import importlib

    problems = []
    reg = importlib.import_module(_REGISTER)
    names = getattr(reg, "_AttnBackend", None)
    problems += enum_problems(f"{_REGISTER}._AttnBackend", names, str_valued=True)
    registry = getattr(reg, "_AttnBackendRegistry", None)
    register = getattr(registry, "register", None)
    need = {"backend", "constraints", "supports_context_parallel", "bridge_to_diffusers"}
    if register is None or not need <= set(params(register)):
        problems.append(f"_AttnBackendRegistry.register no longer takes {sorted(need)}")
    for attr in ("_backends", "get_backend", "is_context_parallel_available"):
        if not hasattr(registry, attr):
            problems.append(f"_AttnBackendRegistry.{attr} is gone")
    cp = getattr(reg, "_context_parallel_attention", None)
    need = {"forward_op", "backward_op", "_cp_config", "return_lse", "cp_gqa_strategy"}
    if cp is None or not need <= set(params(cp)):
        problems.append(f"{_REGISTER}._context_parallel_attention no longer takes {sorted(need)}")
    native = importlib.import_module(_NATIVE)
    fn, op = getattr(native, "_native_attention", None), getattr(
        native, "_native_attention_forward_op", None)
    if fn is None or params(fn) != _BACKEND_PARAMS:
        problems.append(f"backends no longer take {_BACKEND_PARAMS} (native takes "
                        f"{None if fn is None else params(fn)})")
    if op is None or params(op) != _FORWARD_OP_PARAMS:
        problems.append(f"forward ops no longer take {_FORWARD_OP_PARAMS} (native's takes "
                        f"{None if op is None else params(op)})")
    return problems


def _forward_op(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                scale=None, enable_gqa=False, return_lse=False, _save_ctx=True, _cp_config=None):
    # Forward only: nothing saved on ctx. cache-dit's ring merges the LSE as [B, S, H].
    query, key, value = wait_collectives(query, key, value)
    return attend(ENGINE, query, key, value, scale=scale, is_causal=is_causal,
                  return_lse=return_lse, lse_layout="BSH", attn_mask=attn_mask,
                  dropout_p=dropout_p)


def _backward_op(ctx, grad_out, *args, **kwargs):
    raise NotImplementedError(
        "fp8dit's cache-dit backend is forward-only (inference); for training under context "
        "parallelism use cache-dit's 'native' backend")


def fp8dit_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                     scale=None, enable_gqa=False, return_lse=False, cp_gqa_strategy=None,
                     _cp_config=None):
    """The function cache-dit's dispatcher calls for backend ``fp8dit``.

    Parameters
    ----------
    query : Tensor ``[B, Sq, H, D]``; key, value : Tensor ``[B, Sk, Hkv, D]``
    _cp_config : cache-dit's context-parallel config, or None (one process)
    return_lse : bool
        Also return the log-sum-exp ``[B, Sq, H]`` float32.

    Returns
    -------
    out ``[B, Sq, H, D]``, or ``(out, lse)``.
    """
    if _cp_config is None:
        return attend(ENGINE, query, key, value, scale=scale, is_causal=is_causal,
                      return_lse=return_lse, lse_layout="BSH", attn_mask=attn_mask,
                      dropout_p=dropout_p)
    reg = sys.modules[_REGISTER]
    if attn_mask is not None:
        ENGINE.log_once("fp8dit cache-dit backend: cache-dit's native backend (torch SDPA) "
                        "instead of FP8: an attention mask under context parallelism")
        native = reg._AttnBackendRegistry.get_backend(reg._AttnBackend.NATIVE)
        return native(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                      is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                      return_lse=return_lse, cp_gqa_strategy=cp_gqa_strategy,
                      _cp_config=_cp_config)
    return reg._context_parallel_attention(
        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse,
        cp_gqa_strategy, forward_op=_forward_op, backward_op=_backward_op,
        _cp_config=_cp_config)



def register():
    """Register ``"fp8dit"`` in cache-dit's attention registry (context parallelism declared
    supported) and in diffusers' (fp8dit's diffusers adapter); idempotent. Returns cache-dit's
    enum member.

    Raises
    ------
    RuntimeError
        cache-dit's internals changed in a way this adapter does not fit.
    """
    import_engine(_REGISTER, "cache-dit", "cache-dit", SUPPORTED_VERSION, "cache-dit")
    raise_if_unfit(cache_dit_internals_problems(), "cache-dit", "cache-dit", SUPPORTED_VERSION,
                   "cache_dit")
    from .diffusers import register as register_diffusers

    register_diffusers()
    reg = sys.modules[_REGISTER]
    member = add_member(reg._AttnBackend, MEMBER_NAME, BACKEND_NAME)
    if reg._AttnBackendRegistry._backends.get(member) is not fp8dit_attention:
        reg._AttnBackendRegistry.register(member, constraints=[], supports_context_parallel=True,
                                          bridge_to_diffusers=False)(fp8dit_attention)
    return member


register()
