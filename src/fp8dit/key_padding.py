"""Boolean key-padding masks run FP8 as key lengths.

HunyuanVideo (diffusers) hands every attention call a ``[B, 1, 1, S]`` boolean mask that keeps
the video tokens and the prompt's real text tokens and drops the text padding, which comes
last. Such a mask is a key length per sequence: the first ``n_b`` keys of sequence ``b``. The
FP8 kernels take per-sequence key lengths from their plan, so these calls run FP8 over exactly
the kept keys (the padded keys are never read) instead of falling back to SDPA.

Reading the lengths needs the mask's values on the host: one small device-to-host copy, made
once per mask tensor (a model builds its mask once per forward and passes it to every layer)
and cached while the tensor lives and is not modified in place (its version counter). Inference
tensors have no version counter, so theirs are read on every call. Everything else goes to
SDPA with the mask, with the reason: masks that are not a prefix of keys (holes, per-query or
per-head masks), float (additive) masks, a sequence with no key kept (SDPA's own result for
it), and calls during CUDA-graph capture, where the host cannot read the mask and a replay
could not see a changed mask.
"""

from __future__ import annotations

import threading
import weakref

import torch

from .dispatch import _log_once
from .launch import fp8_attention_fwd
from .recipes import Recipe
from .sdpa import sdpa_attention

# Masks whose lengths were read: id(mask) -> (weak reference, version, result). Bounded: a
# model passes one mask to all its layers, so a few entries cover a forward.
_CACHE_SIZE = 8
_cache: dict[int, tuple[weakref.ref, int, tuple]] = {}
_lock = threading.Lock()  # threads may share a model (the plan cache is thread-safe too)


def _key_rows(mask: torch.Tensor, batch: int, sk: int):
    """The mask as [B or 1, Sk] rows when it masks keys only, else None."""
    shape = tuple(mask.shape)
    if len(shape) == 2 and shape == (batch, sk):  # diffusers' [B, Sk] convention
        return mask
    if len(shape) == 4 and shape[1:] == (1, 1, sk) and shape[0] in (1, batch):
        return mask[:, 0, 0, :]
    return None


def key_padding_reason(mask: torch.Tensor, batch: int, sk: int) -> str | None:
    """Why ``mask`` cannot become key lengths from its dtype and shape alone (None: it may)."""
    if mask.dtype != torch.bool:
        return (f"attn_mask has dtype {mask.dtype}; the FP8 kernels read boolean key-padding "
                "masks only")
    if _key_rows(mask, batch, sk) is None:
        return (f"attn_mask of shape {tuple(mask.shape)} is not a key-padding mask ([B, Sk] or "
                f"[B, 1, 1, Sk] with Sk = {sk})")
    return None


def _read_lengths(rows: torch.Tensor) -> tuple:
    """(lengths, None) when every row keeps a non-empty prefix of keys, else (None, reason)."""
    n = rows.sum(-1)
    cols = torch.arange(rows.shape[-1], device=rows.device)
    prefix = (rows == (cols[None, :] < n[:, None])).all(-1)
    lens, ok = torch.stack([n, prefix.to(n.dtype)]).tolist()  # the one host read
    if not all(ok):
        return None, "attn_mask keeps keys that are not a prefix (the padding must come last)"
    if min(lens) == 0:
        return None, "attn_mask drops every key of a sequence"
    return tuple(int(x) for x in lens), None


def key_lengths(mask: torch.Tensor, batch: int, sk: int) -> tuple:
    """(per-sequence key lengths, None), or (None, reason) when the mask is no key padding.

    ``mask``: boolean, ``[B, Sk]`` or ``[B or 1, 1, 1, Sk]``, True where a key is attended."""
    reason = key_padding_reason(mask, batch, sk)
    if reason is not None:
        return None, reason
    if mask.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None, ("CUDA-graph capture: the mask's key lengths must be read on the host, "
                      "and a replay would not see a changed mask")
    tracked = not mask.is_inference()  # inference tensors have no version counter
    with _lock:
        hit = _cache.get(id(mask)) if tracked else None
    if hit is not None and hit[0]() is mask and hit[1] == mask._version:
        lens, reason = hit[2]
    else:
        lens, reason = result = _read_lengths(_key_rows(mask, batch, sk))
        if tracked:
            with _lock:
                _cache.pop(id(mask), None)
                if len(_cache) >= _CACHE_SIZE:
                    _cache.pop(next(iter(_cache)))
                _cache[id(mask)] = (weakref.ref(mask), mask._version, result)
    if lens is not None and len(lens) == 1 and batch > 1:  # one row for the whole batch
        lens = lens * batch
    return lens, reason


def key_padding_attention(q, k, v, mask, *, scale: float, recipe: Recipe, return_lse: bool,
                          num_splits: int | None = None):
    """Attention of NHD ``q, k, v`` under a boolean mask that keeps some keys.

    Returns ``(out, lse, reason)``: FP8 over each sequence's kept prefix of keys (``reason``
    None), or SDPA with the mask when it is no key padding (``reason`` says why). ``lse``
    ``[B, H, Sq]`` fp32 when ``return_lse``, else None. A fallback's reason is logged once
    (logger ``"fp8dit"``).
    """
    B, Sk = q.shape[0], k.shape[1]
    lens, reason = key_lengths(mask, B, Sk)
    if lens is None:
        _log_once(f"fp8dit: torch SDPA instead of FP8 for a masked call: {reason}")
        if mask.dim() == 2 and tuple(mask.shape) == (B, Sk):  # diffusers' [B, Sk] convention
            mask = mask[:, None, None, :]
        out, lse = sdpa_attention(q, k, v, layout="NHD", scale=scale, is_causal=False,
                                  return_lse=return_lse, attn_mask=mask)
        return out, lse, reason
    out, lse = fp8_attention_fwd(q, k, v, layout="NHD", scale=scale, is_causal=False,
                                 recipe=recipe, num_splits=num_splits,
                                 k_lens=None if min(lens) == Sk else lens)
    return out, (lse if return_lse else None), None
