"""The core shared by the serving-engine adapters (SGLang, xDiT, cache-dit).

Each engine hands attention to a backend in its own layout and wants the log-sum-exp back in its
own layout; this module does the conversions once, and the fallback, so that each engine's
module only speaks its engine's contract:

=============  =================  ===================  ==========================================
engine         q, k, v            LSE (ring attention)  causal with Sq != Sk
=============  =================  ===================  ==========================================
SGLang         ``[B, S, H, D]``   ``[B, H, S]``         bottom-right (flash-attn's, its SDPA's)
  (varlen)     ``[T, H, D]``      ``[H, T]``
xDiT           ``[B, H, S, D]``   ``[B, H, S]``         top-left (torch SDPA's)
cache-dit      ``[B, S, H, D]``   ``[B, S, H]``         top-left
=============  =================  ===================  ==========================================

A call runs :func:`fp8dit.attention` (``backend="auto"``): the FP8 kernels where they can run,
torch SDPA where they cannot, with the reason logged once by fp8dit's dispatcher. An attention
mask that is key padding in SDPA's convention (boolean ``[B or 1, 1, 1, Sk]``, each row keeping
a non-empty prefix of the keys) runs FP8 over the kept keys (:mod:`fp8dit.key_padding`: the
padded keys are never read; the same attention as SDPA with that mask). What the FP8 kernels do
not take at all goes to torch SDPA here, with the reason logged once per engine (logger
``"fp8dit"``): any other mask (float, per query or per head, holes, a sequence with no key
kept, a masked causal call), a non-zero dropout, a causal call with ``Sq != Sk`` under an
engine that aligns it bottom-right. With ``return_lse`` the SDPA fallback computes the LSE in
fp32 as well (except with dropout, which has no LSE to give: that raises).

The kernels are forward-only: inputs that require grad run SDPA (fp8dit's dispatcher says so).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .. import dispatch as fp8_dispatch
from ..api import _check_scale, attention, attention_varlen, check_recipe, select_backend
from ..key_padding import key_padding_attention, key_padding_reason
from ..sdpa import sdpa_attention, sdpa_mask

LAYOUTS = ("NHD", "HND")
LSE_LAYOUTS = ("BHS", "BSH")
CAUSAL_ALIGNMENTS = ("top-left", "bottom-right")


@dataclass
class Engine:
    """One engine's adapter state: its name (in log lines), how it aligns a causal mask when
    ``Sq != Sk``, the recipe of its FP8 calls, what it logged and, inside
    :meth:`record_calls`, one dict per call."""

    name: str
    causal_alignment: str = "top-left"
    recipe: str | None = None
    logged: set = field(default_factory=set)
    records: list | None = None

    def __post_init__(self):
        if self.causal_alignment not in CAUSAL_ALIGNMENTS:
            raise ValueError(f"causal_alignment: expected one of {CAUSAL_ALIGNMENTS}, "
                             f"got {self.causal_alignment!r}")

    def log_once(self, msg: str) -> None:
        fp8_dispatch._log_once(msg, self.logged)

    def set_recipe(self, name: str | None) -> None:
        """Accuracy recipe of this engine's FP8 calls (``None``: ``FP8DIT_RECIPE`` or the
        default); raises on an unknown name."""
        self.recipe = None if name is None else check_recipe(name).name

    @contextlib.contextmanager
    def record_calls(self):
        """Collect one dict per call: ``backend`` ("fp8" or "sdpa"), ``reason``, ``q`` and
        ``k`` shapes (as the engine passed them), ``lse`` (the LSE shape returned, or None).

        Example
        -------
        >>> with fp8dit.integrations.sglang.ENGINE.record_calls() as calls:
        ...     pipe(...)
        """
        previous, self.records = self.records, []
        try:
            yield self.records
        finally:
            self.records = previous

    def _record(self, backend, reason, q, k, lse=None):
        if self.records is not None:
            self.records.append(dict(backend=backend, reason=reason, q=tuple(q.shape),
                                     k=tuple(k.shape),
                                     lse=None if lse is None else tuple(lse.shape)))


def wait_collectives(*tensors):
    """Ring attention may hand over key/value as views of a collective still in flight (torch's
    ``AsyncCollectiveTensor``). A torch op waits on first use; the eager Triton launch bypasses
    torch's dispatcher and would read the raw buffer (on CPU: no storage at all)."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    return tuple(t.wait() if isinstance(t, AsyncCollectiveTensor) else t for t in tensors)


def _lse_out(lse_bhs: torch.Tensor, lse_layout: str) -> torch.Tensor:
    if lse_layout == "BHS":
        return lse_bhs
    return lse_bhs.transpose(1, 2).contiguous()


def _causal_mask(sq: int, sk: int, alignment: str, device) -> torch.Tensor:
    diagonal = sk - sq if alignment == "bottom-right" else 0
    return torch.ones(sq, sk, dtype=torch.bool, device=device).tril(diagonal=diagonal)


def _nhd(layout, *tensors):
    return tuple(t if layout == "NHD" else t.transpose(1, 2) for t in tensors)


def _key_padding_reason(q, k, v, layout, attn_mask) -> str | None:
    """Why a masked call cannot run FP8 over its kept keys (None: it can; whether the kept keys
    are a prefix is read from the mask's values in :func:`key_padding_attention`)."""
    q, k, v = _nhd(layout, q, k, v)
    B, Sk = q.shape[0], k.shape[1]
    shape = tuple(attn_mask.shape)
    # SDPA's convention only: a 2-D mask is [Sq, Sk] there, not diffusers' [B, Sk].
    if not (len(shape) == 4 and shape[1:] == (1, 1, Sk) and shape[0] in (1, B)):
        return (f"attn_mask of shape {shape} is no key-padding mask ([B or 1, 1, 1, Sk] with "
                f"B = {B}, Sk = {Sk})")
    why = key_padding_reason(attn_mask, B, Sk)
    if why is not None:
        return why
    name, why = select_backend(q, k, v, layout="NHD")
    return None if name == "fp8" else why


def _key_padding(engine, q, k, v, layout, scale, return_lse, lse_layout, attn_mask):
    """A key-padding-masked call: FP8 over each sequence's kept prefix of keys, or SDPA with
    the mask when its values are no prefix (:func:`key_padding_attention` says why, once)."""
    qn, kn, vn = _nhd(layout, q, k, v)
    recipe = check_recipe(engine.recipe)
    scale = _check_scale(scale, q.shape[-1])
    if torch.compiler.is_compiling():
        out, lse = torch.ops.fp8dit.attention_fp8_key_padding(qn, kn, vn, attn_mask, scale,
                                                              recipe.name, return_lse)
        reason = None  # decided inside the op; a fallback there is logged there
    else:
        out, lse, reason = key_padding_attention(qn, kn, vn, attn_mask, scale=scale,
                                                 recipe=recipe, return_lse=return_lse)
    out = out if layout == "NHD" else out.transpose(1, 2)
    lse = _lse_out(lse, lse_layout) if return_lse else None
    if engine.records is not None:
        engine._record("sdpa" if reason else "fp8",
                       "fallback: " + reason if reason
                       else "key-padding mask: FP8 over the kept keys", q, k, lse)
    return (out, lse) if return_lse else out


def _fallback_reason(q, k, layout, is_causal, attn_mask, dropout_p, engine,
                     mask_why=None) -> str | None:
    if dropout_p:
        return f"dropout_p={dropout_p} (the FP8 kernels are inference-only)"
    if attn_mask is not None and is_causal:
        return "an attention mask with is_causal=True (the FP8 kernels take key padding only)"
    if attn_mask is not None:
        return f"an attention mask is set and FP8 cannot serve it: {mask_why}"
    sq, sk = (q.shape[1], k.shape[1]) if layout == "NHD" else (q.shape[2], k.shape[2])
    if is_causal and sq != sk and engine.causal_alignment == "bottom-right":
        return (f"causal with {sq} queries and {sk} keys: {engine.name} aligns the mask "
                "bottom-right, the FP8 kernels top-left")
    return None


def attend(engine: Engine, q, k, v, *, layout: str = "NHD", scale=None, is_causal=False,
           return_lse=False, lse_layout: str = "BHS", attn_mask=None, dropout_p=0.0):
    """Attention for ``engine``: fp8dit where it can run, torch SDPA otherwise.

    Parameters
    ----------
    q : Tensor ``[B, Sq, H, D]`` (``layout="NHD"``) or ``[B, H, Sq, D]`` (``"HND"``)
    k, v : Tensor ``[B, Sk, Hkv, D]`` or ``[B, Hkv, Sk, D]``; ``H`` a multiple of ``Hkv``
    scale : float, optional
        Softmax scale, default ``1 / sqrt(D)``.
    return_lse : bool
        Also return the log-sum-exp (natural log, float32) in ``lse_layout``: ``"BHS"``
        (``[B, H, Sq]``) or ``"BSH"`` (``[B, Sq, H]``).
    attn_mask : Tensor, optional
        SDPA's convention. Boolean ``[B or 1, 1, 1, Sk]`` keeping a non-empty prefix of keys per
        sequence: FP8 over the kept keys; any other mask: torch SDPA (reason logged once).
    dropout_p : float
        Non-zero: torch SDPA (reason logged once).

    Returns
    -------
    out in q's layout and dtype, or ``(out, lse)``.
    """
    if lse_layout not in LSE_LAYOUTS:
        raise ValueError(f"lse_layout: expected one of {LSE_LAYOUTS}, got {lse_layout!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected 'NHD' or 'HND', got {layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    q, k, v = wait_collectives(q, k, v)
    mask_why = None
    if attn_mask is not None and not dropout_p and not is_causal:
        mask_why = _key_padding_reason(q, k, v, layout, attn_mask)
        if mask_why is None:
            return _key_padding(engine, q, k, v, layout, scale, return_lse, lse_layout,
                                attn_mask)
    why = _fallback_reason(q, k, layout, is_causal, attn_mask, dropout_p, engine, mask_why)
    if why is not None:
        return _sdpa_fallback(engine, why, q, k, v, layout, scale, is_causal, return_lse,
                              lse_layout, attn_mask, dropout_p)
    if engine.records is not None:
        name, reason = select_backend(q, k, v, is_causal=is_causal, layout=layout)
    res = attention(q, k, v, layout=layout, scale=scale, is_causal=is_causal,
                    return_lse=return_lse, recipe=engine.recipe)
    if not return_lse:
        if engine.records is not None:
            engine._record(name, reason, q, k)
        return res
    out, lse = res
    lse = _lse_out(lse, lse_layout)
    if engine.records is not None:
        engine._record(name, reason, q, k, lse)
    return out, lse


def _sdpa_fallback(engine, why, q, k, v, layout, scale, is_causal, return_lse, lse_layout,
                   attn_mask, dropout_p):
    # fp8dit's own checks first, so a bad input raises the same error on either path.
    select_backend(q, k, v, is_causal=is_causal, layout=layout, backend="sdpa")
    D = q.shape[-1]
    scale = _check_scale(scale, D)
    engine.log_once(f"fp8dit {engine.name} backend: torch SDPA instead of FP8: {why}")
    sq, sk = (q.shape[1], k.shape[1]) if layout == "NHD" else (q.shape[2], k.shape[2])
    if is_causal and (sq != sk or attn_mask is not None):
        causal = _causal_mask(sq, sk, engine.causal_alignment, q.device)
        if attn_mask is None:
            attn_mask = causal
        elif attn_mask.dtype == torch.bool:
            attn_mask = attn_mask & causal
        else:
            attn_mask = attn_mask.masked_fill(~causal, -math.inf)
        is_causal = False
    if dropout_p:
        if return_lse:
            raise NotImplementedError(
                f"fp8dit {engine.name} backend: return_lse=True with dropout_p={dropout_p}")
        qh, kh, vh = (t if layout == "HND" else t.transpose(1, 2) for t in (q, k, v))
        gqa = {"enable_gqa": True} if qh.shape[1] != kh.shape[1] else {}
        out = F.scaled_dot_product_attention(qh, kh, vh,
                                             attn_mask=sdpa_mask(attn_mask, qh.dtype),
                                             dropout_p=dropout_p, is_causal=is_causal,
                                             scale=scale, **gqa)
        out = out if layout == "HND" else out.transpose(1, 2)
        engine._record("sdpa", "fallback: " + why, q, k)
        return out
    out, lse = sdpa_attention(q, k, v, layout=layout, scale=scale, is_causal=is_causal,
                              return_lse=return_lse, attn_mask=attn_mask)
    if not return_lse:
        engine._record("sdpa", "fallback: " + why, q, k)
        return out
    lse = _lse_out(lse, lse_layout)
    engine._record("sdpa", "fallback: " + why, q, k, lse)
    return out, lse


def attend_varlen(engine: Engine, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                  max_seqlen_k, *, scale=None, is_causal=False, return_lse=False):
    """Packed ``[T, H, D]`` attention (flash-attn's varlen convention) for ``engine``: fp8dit's
    :func:`fp8dit.attention_varlen`; lse ``[H, Tq]``. A causal call whose sequences have
    ``Sq != Sk`` under an engine that aligns bottom-right runs torch SDPA per sequence."""
    q, k, v = wait_collectives(q, k, v)
    if is_causal and engine.causal_alignment == "bottom-right" and not torch.equal(
            cu_seqlens_q.cpu(), cu_seqlens_k.cpu()):
        return _varlen_by_sequence(engine, q, k, v, cu_seqlens_q, cu_seqlens_k, scale,
                                   return_lse)
    if engine.records is not None:
        name = select_backend(q[None], k[None], v[None], is_causal=is_causal)
    res = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           scale=scale, is_causal=is_causal, return_lse=return_lse,
                           recipe=engine.recipe)
    if engine.records is not None:
        engine._record(name[0], "varlen: " + name[1], q, k,
                       res[1] if return_lse else None)
    return res


def _varlen_by_sequence(engine, q, k, v, cu_q, cu_k, scale, return_lse):
    out = torch.zeros_like(q)
    lse = torch.full((q.shape[1], q.shape[0]), -math.inf, device=q.device, dtype=torch.float32)
    bq, bk = cu_q.tolist(), cu_k.tolist()
    for q0, q1, k0, k1 in zip(bq[:-1], bq[1:], bk[:-1], bk[1:]):
        if q1 > q0 and k1 > k0:
            res = attend(engine, q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], scale=scale,
                         is_causal=True, return_lse=return_lse)
            o, l_ = res if return_lse else (res, None)
            out[q0:q1] = o[0]
            if return_lse:
                lse[:, q0:q1] = l_[0]
    return (out, lse) if return_lse else out
