"""Boolean key-padding masks run FP8 as key lengths.

HunyuanVideo (diffusers) hands every attention call a ``[B, 1, 1, S]`` boolean mask that keeps
the video tokens and the prompt's real text tokens and drops the text padding, which comes
last. Such a mask is a key length per sequence: the first ``n_b`` keys of sequence ``b``. The
FP8 kernels take per-sequence key lengths from their plan, so these calls run FP8 over exactly
the kept keys (the padded keys are never read) instead of falling back to SDPA.

HunyuanVideo 1.5 instead builds a ``[B, 1, S, S]`` mask in every call: (valid query) & (valid
key), its valid tokens moved first. Per query row that is the same prefix of keys, or nothing;
it runs FP8 over the prefix too, and the rows that keep no key get zeros (LSE -inf), fp8dit's
result for a row without keys (SDPA's is undefined there). (``fp8dit.enable`` spares that model
the mask: its processor then passes the key mask, ``integrations.diffusers_processors``.)

Reading the lengths needs the mask's values on the host: one small device-to-host copy, made
once per mask tensor (a model builds its mask once per forward and passes it to every layer)
and cached while the tensor lives and is not modified in place (its version counter). Inference
tensors have no version counter, so theirs are read on every call. Everything else goes to
SDPA with the mask, with the reason: masks that are not a prefix of keys (holes, per-query or
per-head masks), float (additive) masks, and a sequence with no key kept (SDPA's own result
for it).

Inside CUDA-graph capture the host cannot read the mask, and a replay must follow the mask's
values then (a new prompt keeps other tokens). There the lengths stay on the device: torch ops
take each row's first dropped key, the kernels read it from a copy of the plan's table, and the
plan is the one for all keys (built by the eager calls before capture). That needs a mask whose
shape the eager calls saw as a prefix; a replayed mask that is no prefix, or that drops every
key of a sequence, turns that sequence's output to NaN (loud, not a wrong answer). Masks of a
shape not seen as a prefix run SDPA with the mask under capture.
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import torch
import triton

from . import env, tuning
from .attend import fp8_attention_fwd, plan_for
from .dispatch import _log_once
from .kernels.mask_stats import (
    mask_row_counts_col_any_kernel,
    mask_row_counts_col_any_words_kernel,
)
from .recipes import Recipe
from .rope import rotate_first
from .sdpa import sdpa_attention

# Masks whose lengths were read: id(mask) -> (weak reference, version, result). Bounded: a
# model passes one mask to all its layers, so a few entries cover a forward.
_CACHE_SIZE = 8
_cache: dict[int, tuple[weakref.ref, int, tuple]] = {}
_lock = threading.Lock()  # threads may share a model (the plan cache is thread-safe too)
# (mask shape, device) of masks an eager call read as a prefix of keys: under capture these
# keep their lengths on the device; a read that found another pattern takes the shape out.
_prefix_shapes: set[tuple] = set()


def _key_rows(mask: torch.Tensor, batch: int, sk: int):
    """The mask as [B or 1, Sk] rows when it masks keys only, else None."""
    shape = tuple(mask.shape)
    if len(shape) == 2 and shape == (batch, sk):  # diffusers' [B, Sk] convention
        return mask
    if len(shape) == 4 and shape[1:] == (1, 1, sk) and shape[0] in (1, batch):
        return mask[:, 0, 0, :]
    return None


def _query_key_rows(mask: torch.Tensor, batch: int, sq: int | None, sk: int):
    """The mask as [B or 1, Sq, Sk] when it is per query, one for all heads, else None."""
    shape = tuple(mask.shape)
    if (sq is not None and sq > 1 and len(shape) == 4 and shape[1:] == (1, sq, sk)
            and shape[0] in (1, batch)):
        return mask[:, 0]
    return None


def key_padding_reason(mask: torch.Tensor, batch: int, sk: int,
                       sq: int | None = None) -> str | None:
    """Why ``mask`` cannot become key lengths from its dtype and shape alone (None: it may).

    With ``sq`` (the queries), a per-query ``[B or 1, 1, Sq, Sk]`` mask may too: HunyuanVideo
    1.5 builds (valid query) & (valid key) per call, the valid tokens first."""
    if mask.dtype != torch.bool:
        return (f"attn_mask has dtype {mask.dtype}; the FP8 kernels read boolean key-padding "
                "masks only")
    if _key_rows(mask, batch, sk) is None and _query_key_rows(mask, batch, sq, sk) is None:
        return (f"attn_mask of shape {tuple(mask.shape)} is not a key-padding mask ([B, Sk], "
                f"[B, 1, 1, Sk] or [B, 1, Sq, Sk] with Sk = {sk}, Sq = {sq})")
    return None


def _read_lengths(rows: torch.Tensor) -> tuple:
    """(lengths, None) when every row keeps a non-empty prefix of keys, else (None, reason)."""
    n = rows.sum(-1)
    cols = torch.arange(rows.shape[-1], device=rows.device)
    prefix = (rows == (cols[None, :] < n[:, None])).all(-1)
    lens, ok = torch.stack([n, prefix.to(n.dtype)]).tolist()  # the one host read
    return _checked(lens, ok)


def _checked(lens, prefix_ok) -> tuple:
    if not all(prefix_ok):
        return None, "attn_mask keeps keys that are not a prefix (the padding must come last)"
    if min(lens) == 0:
        return None, "attn_mask drops every key of a sequence"
    return tuple(int(x) for x in lens), None


def _row_counts_and_key_any(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row True counts (int64 ``[B', Sq]``) and per-column ``any`` (bool ``[B', Sk]``)
    of a boolean ``[B', Sq, Sk]`` mask. On a GPU (and in the interpreter) one kernel reads
    each byte once (``kernels.mask_stats``: as words where rows are contiguous); elsewhere
    torch."""
    if m.device.type != "cuda" and not env.triton_interpret():
        return m.sum(-1), m.any(-2)
    # (launch shapes: tuning.mask_words / mask_bytes; the byte kernel's partial table is Sk bytes
    # per `rows` rows: 82 MB at 480p, 0.4 GB at 720p, against a 2.6 / 12.9 GB mask)
    tuned = tuning.current()
    if m.stride(-1) == 1 and m.shape[-1] > 1:
        t = tuned.mask_words
        return _mask_stats_words_launch(m, t.rows, t.cols, t.num_warps)
    t = tuned.mask_bytes
    return _mask_stats_launch(m, t.rows, t.cols, t.num_warps)


def _mask_stats_launch(m: torch.Tensor, block_r: int, block_c: int,
                       warps: int) -> tuple[torch.Tensor, torch.Tensor]:
    B, Sq, Sk = m.shape
    counts = torch.empty(B, Sq, dtype=torch.int32, device=m.device)
    part = torch.empty(B, triton.cdiv(Sq, block_r), Sk, dtype=torch.int8, device=m.device)
    u8 = m.view(torch.uint8)  # bool's bytes are 0 or 1
    with torch.cuda.device(m.device) if m.is_cuda else contextlib.nullcontext():
        mask_row_counts_col_any_kernel[(part.shape[1], B)](
            u8, *u8.stride(), Sq, Sk, counts, part,
            BLOCK_R=block_r, BLOCK_C=block_c, num_warps=warps)
    return counts.long(), part.amax(1) > 0


def _mask_stats_words_launch(m: torch.Tensor, block_r: int, block_w: int,
                             warps: int) -> tuple[torch.Tensor, torch.Tensor]:
    B, Sq, Sk = m.shape
    u8 = m.view(torch.uint8)
    base_phase, sb, sq = u8.data_ptr() % 4, u8.stride(0), u8.stride(1)
    n_words = triton.cdiv(Sk + 3, 4)  # a row's words at its worst phase
    n_pid = triton.cdiv(triton.cdiv(Sq, 4), block_r)
    counts = torch.empty(B, Sq, dtype=torch.int32, device=m.device)
    # Every program writes its row's words up to its class's phase + Sk: all the host reads.
    part = torch.empty(B, 4, n_pid, n_words, dtype=torch.int32, device=m.device)
    with torch.cuda.device(m.device) if m.is_cuda else contextlib.nullcontext():
        mask_row_counts_col_any_words_kernel[(n_pid, 4, B)](
            u8, base_phase, sb, sq, Sq, Sk, n_words, counts, part,
            BLOCK_R=block_r, BLOCK_W=block_w, num_warps=warps)
    # [B, class, bytes]: each class's column c at byte phase + c (classes beyond Sq are zeros)
    table = part.view(torch.int8).amax(2)
    keys = torch.zeros(B, Sk, dtype=torch.bool, device=m.device)
    for b in range(B):
        for g in range(min(4, Sq)):
            p = (base_phase + b * sb + g * sq) % 4
            keys[b] |= table[b, g, p:p + Sk] > 0
    return counts.long(), keys


def _read_query_key_lengths(m: torch.Tensor) -> tuple:
    """``m`` [B', Sq, Sk]: (lengths, None, dropped query rows or None) when it is (kept query)
    & (kept key) with the kept keys a non-empty prefix, else (None, reason, None).

    One read of the mask (it is S^2 bytes: that read is the cost) and one host read, nothing
    of the mask's size allocated: the mask lies inside the outer product of its rows' and
    columns' ``any``, so it equals it exactly when its count is (kept rows) x (kept keys)."""
    per_row, keys = _row_counts_and_key_any(m)
    rows = per_row > 0
    n, r = keys.sum(-1), rows.sum(-1)
    cols = torch.arange(m.shape[-1], device=m.device)
    prefix = (keys == (cols[None, :] < n[:, None])).all(-1)
    outer = per_row.sum(-1) == r * n
    lens, ok, is_outer, r = torch.stack([n, prefix.to(n.dtype), outer.to(n.dtype), r]).tolist()
    if not all(is_outer):
        return None, ("attn_mask is per query and not (kept queries) x (kept keys): its rows "
                      "keep different keys"), None
    lens, reason = _checked(lens, ok)
    return lens, reason, (None if min(r) == m.shape[1] else ~rows)


def key_lengths(mask: torch.Tensor, batch: int, sk: int, sq: int | None = None) -> tuple:
    """(per-sequence key lengths, None), or (None, reason) when the mask is no key padding.

    ``mask``: boolean, ``[B, Sk]`` or ``[B or 1, 1, 1, Sk]``, True where a key is attended;
    with ``sq``, also ``[B or 1, 1, Sq, Sk]`` that is (kept query) & (kept key)."""
    lens, reason, _ = _lengths(mask, batch, sq, sk)
    return lens, reason


def _lengths(mask: torch.Tensor, batch: int, sq: int | None, sk: int) -> tuple:
    """:func:`key_lengths` and, for a per-query mask, its dropped query rows ([B or 1, Sq]
    bool on the device; None when it drops none)."""
    reason = key_padding_reason(mask, batch, sk, sq)
    if reason is not None:
        return None, reason, None
    if _capturing(mask):
        return None, ("CUDA-graph capture of a mask not seen as key padding before (the key "
                      "lengths stay on the device only for shapes an eager call read)"), None
    tracked = not mask.is_inference()  # inference tensors have no version counter
    with _lock:
        hit = _cache.get(id(mask)) if tracked else None
    if hit is not None and hit[0]() is mask and hit[1] == mask._version:
        lens, reason, dropped = hit[2]
    else:
        rows = _key_rows(mask, batch, sk)
        if rows is not None:
            lens, reason, dropped = result = (*_read_lengths(rows), None)
        else:
            lens, reason, dropped = result = _read_query_key_lengths(
                _query_key_rows(mask, batch, sq, sk))
        with _lock:
            if rows is not None:  # under capture only key rows keep their lengths on device
                (_prefix_shapes.add if lens is not None else _prefix_shapes.discard)(
                    (tuple(mask.shape), str(mask.device)))
            if tracked:
                _cache.pop(id(mask), None)
                if len(_cache) >= _CACHE_SIZE:
                    _cache.pop(next(iter(_cache)))
                _cache[id(mask)] = (weakref.ref(mask), mask._version, result)
    if lens is not None and len(lens) == 1 and batch > 1:  # one row for the whole batch
        lens = lens * batch
    return lens, reason, dropped


def _capturing(mask: torch.Tensor) -> bool:
    return mask.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def device_key_lengths(mask: torch.Tensor, batch: int, sk: int):
    """(int32 [B] lengths, bool [B] bad) of a key-padding-shaped mask, on its device, nothing
    read on the host: each row's first dropped key (``sk`` when none), and whether the row is
    no prefix or keeps no key."""
    rows = _key_rows(mask, batch, sk).expand(batch, sk)
    cols = torch.arange(sk, device=mask.device, dtype=torch.int32)
    first_dropped = torch.where(rows, sk, cols[None, :]).amin(-1)
    kept = rows.sum(-1, dtype=torch.int32)
    return first_dropped.to(torch.int32), (kept != first_dropped) | (kept == 0)


def key_padding_attention(q, k, v, mask, *, scale: float, recipe: Recipe, return_lse: bool,
                          num_splits: int | None = None, rope: torch.Tensor | None = None,
                          rope_start: int = 0):
    """Attention of NHD ``q, k, v`` under a boolean mask that keeps some keys.

    ``rope``, ``rope_start``: rotary tables (:func:`fp8dit.rope.rope_tables`) q and k are
    turned by first, fused into the FP8 path's quantization (the SDPA one rotates them first).

    Returns ``(out, lse, reason)``: FP8 over each sequence's kept prefix of keys (``reason``
    None), or SDPA with the mask when it is no key padding (``reason`` says why). ``lse``
    ``[B, H, Sq]`` fp32 when ``return_lse``, else None. A fallback's reason is logged once
    (logger ``"fp8dit"``).
    """
    B, Sk = q.shape[0], k.shape[1]
    if (_capturing(mask) and key_padding_reason(mask, B, Sk) is None
            and (tuple(mask.shape), str(mask.device)) in _prefix_shapes):
        dev_lens, bad = device_key_lengths(mask, B, Sk)
        out, lse = fp8_attention_fwd(q, k, v, layout="NHD", scale=scale, is_causal=False,
                                     recipe=recipe, num_splits=num_splits,
                                     device_k_lens=dev_lens.clamp_(min=1), rope=rope,
                                     rope_start=rope_start)
        out.masked_fill_(bad.view(B, 1, 1, 1), float("nan"))
        lse.masked_fill_(bad.view(B, 1, 1), float("nan"))
        return out, (lse if return_lse else None), None
    lens, reason, dropped = _lengths(mask, B, q.shape[1], Sk)
    if lens is None:
        _log_once(f"fp8dit: torch SDPA instead of FP8 for a masked call: {reason}")
        if mask.dim() == 2 and tuple(mask.shape) == (B, Sk):  # diffusers' [B, Sk] convention
            mask = mask[:, None, None, :]
        if rope is not None:
            q, k = rotate_first(q, k, rope, rope_start)
        out, lse = sdpa_attention(q, k, v, layout="NHD", scale=scale, is_causal=False,
                                  return_lse=return_lse, attn_mask=mask)
        return out, lse, reason
    if q.device.type == "cuda" and min(lens) < Sk:  # the plan a capture would run: all keys
        _prepare_capture(q, k, Sk, recipe, num_splits)
    out, lse = fp8_attention_fwd(q, k, v, layout="NHD", scale=scale, is_causal=False,
                                 recipe=recipe, num_splits=num_splits,
                                 k_lens=None if min(lens) == Sk else lens, rope=rope,
                                 rope_start=rope_start)
    if dropped is not None:  # query rows that keep no key: fp8dit's empty-row result
        dropped = dropped.expand(B, q.shape[1])
        out.masked_fill_(dropped[:, :, None, None], 0.0)
        lse.masked_fill_(dropped[:, None, :], float("-inf"))
    return out, (lse if return_lse else None), None


def _prepare_capture(q, k, sk: int, recipe: Recipe, num_splits) -> None:
    """Build and upload the all-keys plan now: capture cannot (``Plan.tables``)."""
    B, _, H, D = q.shape
    plan, _ = plan_for([q.shape[1]] * B, [sk] * B, varlen=False, num_heads=H,
                       num_kv_heads=k.shape[2], head_dim=D, is_causal=False, device=q.device,
                       num_splits=num_splits, recipe=recipe)
    plan.tables(q.device)
