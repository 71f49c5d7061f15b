"""xDiT (xfuser 0.7.0) adapter: attention backend ``fp8dit``.

Importing this module registers it (:func:`register`, idempotent)::

    import fp8dit.integrations.xdit   # before xDiT builds its runtime state

after which every way xDiT picks an attention backend takes the name ``fp8dit``:
``--attention_backend fp8dit`` (and ``--cross_attention_backend``), the runtime state's
``set_attention_backend("fp8dit")``, and per-step hybrid schedules
(``--hybrid_attn_low_precision_backend fp8dit``, ``--hybrid_attn_schedule fp8dit,flash_3,...``,
``AttentionSchedule``). xDiT's USP runs it under Ulysses (all-to-all over heads) and ring
attention (torch's templated ring, merged with the LSE fp8dit returns whenever the ring has more
than one rank).

Per call: :func:`fp8dit.attention` on xDiT's ``[B, H, S, D]`` with xDiT's scale ``D**-0.5``;
keys packed by a mask (``attention_kwargs["indices_k"]``, xDiT's varlen convention) run
:func:`fp8dit.attention_varlen`; ``attention_kwargs["attn_mask"]`` that is boolean key padding
(``[B or 1, 1, 1, Sk]``, a prefix of keys kept) runs FP8 over the kept keys
(:mod:`.engine_core`); any other mask or a dropout runs torch SDPA (reason logged once).

xDiT has no public way to add a backend name: :func:`register` adds a member to its
``AttentionBackendType`` enum and an entry to ``ATTENTION_FUNCTION_REGISTRY`` (what its
``register_attention_function`` does). What it relies on is listed by
:func:`xdit_internals_problems`.
"""

from __future__ import annotations

import sys

import torch

from .engine_core import Engine, attend, attend_varlen
from .registry import add_member, enum_problems, import_engine, params, raise_if_unfit

BACKEND_NAME = "fp8dit"
MEMBER_NAME = "FP8DIT"
SUPPORTED_VERSION = "0.7.0"

ENGINE = Engine("xDiT", causal_alignment="top-left")

# xDiT's modules this adapter touches; the private names in them are checked by
# xdit_internals_problems().
_BACKENDS = "xfuser.core.distributed.attention_backend"  # AttentionBackendType, registry
_RUNTIME = "xfuser.core.distributed.runtime_state"  # RuntimeState.set_attention_backend
_SCHEDULE = "xfuser.core.distributed.attention_schedule"  # AttentionSchedule
_USP = "xfuser.model_executor.layers.usp"  # USP, ring_attn, _get_attention_function
_FUNCTION_PARAMS = ["query", "key", "value", "dropout_p", "is_causal", "attention_kwargs"]


def xdit_internals_problems() -> list[str]:
    """What this adapter needs from xDiT's internals and did not find (empty: fits)."""
    import importlib

    problems = []
    backends = importlib.import_module(_BACKENDS)
    names = getattr(backends, "AttentionBackendType", None)
    problems += enum_problems(f"{_BACKENDS}.AttentionBackendType", names)
    registry = getattr(backends, "ATTENTION_FUNCTION_REGISTRY", None)
    if not isinstance(registry, dict):
        problems.append(f"{_BACKENDS}.ATTENTION_FUNCTION_REGISTRY is no longer a dict")
    else:
        sdpa = registry.get(getattr(names, "SDPA", None))
        if sdpa is None or params(sdpa) != _FUNCTION_PARAMS:
            problems.append(f"attention functions no longer take {_FUNCTION_PARAMS} (the SDPA "
                            f"one takes {None if sdpa is None else params(sdpa)})")
    runtime = importlib.import_module(_RUNTIME)
    state = getattr(runtime, "RuntimeState", None)
    for attr in ("set_attention_backend", "set_cross_attention_backend",
                 "_check_if_backend_compatible_with_current_configuration"):
        if not callable(getattr(state, attr, None)):
            problems.append(f"{_RUNTIME}.RuntimeState.{attr} is gone")
    schedule = importlib.import_module(_SCHEDULE)
    if not callable(getattr(getattr(schedule, "AttentionSchedule", None),
                            "from_comma_delimited_string", None)):
        problems.append(f"{_SCHEDULE}.AttentionSchedule.from_comma_delimited_string is gone")
    usp = importlib.import_module(_USP)
    for attr in ("USP", "ring_attn", "_get_attention_function"):
        if not callable(getattr(usp, attr, None)):
            problems.append(f"{_USP}.{attr} is gone")
    if getattr(usp, "ATTENTION_FUNCTION_REGISTRY", None) is not registry:
        problems.append(f"{_USP} no longer dispatches through ATTENTION_FUNCTION_REGISTRY")
    return problems



def _ring_world_size() -> int:
    from xfuser.core.distributed import get_ring_parallel_world_size

    try:
        return get_ring_parallel_world_size()
    except AssertionError:  # no model-parallel groups (a single-process call)
        return 1


def fp8dit_attention(query, key, value, dropout_p, is_causal, attention_kwargs=None):
    """The function xDiT's USP calls for backend ``fp8dit``.

    Parameters
    ----------
    query : Tensor ``[B, H, Sq, D]``; key, value : Tensor ``[B, Hkv, Sk, D]`` (xDiT's layout)
    attention_kwargs : dict, optional
        ``attn_mask`` (SDPA's convention): FP8 over the kept keys when it is boolean key
        padding, else torch SDPA. ``indices_k``, ``cu_seqlens_k``, ``max_seqlen_k`` (keys packed
        by a padding mask): :func:`fp8dit.attention_varlen`.

    Returns
    -------
    (out ``[B, H, Sq, D]``, lse ``[B, H, Sq]`` float32), lse ``None`` outside ring attention.
    """
    kwargs = attention_kwargs or {}
    want_lse = _ring_world_size() > 1
    if kwargs.get("indices_k") is not None and not dropout_p:
        return _packed_keys(query, key, value, is_causal, kwargs, want_lse)
    res = attend(ENGINE, query, key, value, layout="HND", is_causal=is_causal,
                 return_lse=want_lse, attn_mask=kwargs.get("attn_mask"), dropout_p=dropout_p)
    return res if want_lse else (res, None)


def _packed_keys(query, key, value, is_causal, kwargs, want_lse):
    """xDiT's varlen convention: every query row kept, keys packed by ``indices_k``."""
    B, H, S, D = query.shape
    Sk = key.shape[2]
    q = query.transpose(1, 2).reshape(B * S, H, D)
    k, v = (t.transpose(1, 2).reshape(B * Sk, t.shape[1], D).index_select(0, kwargs["indices_k"])
            for t in (key, value))
    cu_q = torch.arange(B + 1, dtype=torch.int32, device=query.device) * S
    res = attend_varlen(ENGINE, q, k, v, cu_q, kwargs["cu_seqlens_k"], S, kwargs["max_seqlen_k"],
                        is_causal=is_causal, return_lse=want_lse)
    out, lse = res if want_lse else (res, None)
    out = out.reshape(B, S, H, D).transpose(1, 2)
    if lse is not None:
        lse = lse.reshape(H, B, S).transpose(0, 1)
    return out, lse


def register():
    """Add ``FP8DIT`` to xDiT's ``AttentionBackendType`` and :func:`fp8dit_attention` to its
    ``ATTENTION_FUNCTION_REGISTRY`` (idempotent); returns the enum member.

    Raises
    ------
    RuntimeError
        xDiT's internals changed in a way this adapter does not fit.
    """
    import_engine(_BACKENDS, "xDiT", "xfuser", SUPPORTED_VERSION, "xdit")
    raise_if_unfit(xdit_internals_problems(), "xDiT", "xfuser", SUPPORTED_VERSION, "xdit")
    backends = sys.modules[_BACKENDS]
    member = add_member(backends.AttentionBackendType, MEMBER_NAME, BACKEND_NAME)
    backends.register_attention_function(member)(fp8dit_attention)
    return member


register()
