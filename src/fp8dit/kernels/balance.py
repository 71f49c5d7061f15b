"""Channel sums of the ``balance`` recipes (``fp8dit.balance``): per chunk of tokens, head and
sequence, the sum of x and of x**2 over each channel, of Q or of K as the quantization will see
them (rotary embedding applied as it applies it)."""

import triton
import triton.language as tl

from .common import finite_or
from .quantize import _block_and_head, _rope_pairs


@triton.jit
def channel_moments_kernel(
    x_ptr, seq_ptr, out_ptr,
    x_sb, x_st, x_sh, x_sd,
    n_chunks, D,
    LEN_COL: tl.constexpr, SRC_COL: tl.constexpr,
    DP: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr,
    cos_ptr=None, sin_ptr=None, rope_lo=0, rope_n=0,
    HALF_D: tl.constexpr = 0, ROPE: tl.constexpr = 0, ROPE_RANGE: tl.constexpr = False,
    SOFT_CAST: tl.constexpr = False, HIP: tl.constexpr = False,
):
    """``out[b, h, chunk] = (sum x, sum x**2)`` over tokens [chunk * CHUNK, (chunk + 1) * CHUNK)
    of head ``h`` of sequence ``b`` (length and first token in the plan's ``seq`` table columns
    ``LEN_COL`` and ``SRC_COL``: Q's or K's). Every slot is written (zeros past the sequence),
    non-finite values are left out, and consumers add the chunks in a fixed order, so the sums
    are deterministic. ``ROPE``: x rotated as loaded, as the quantization rotates it
    (``quantize._rope_pairs``); heads first in the grid then (``quantize._block_and_head``).
    ``HIP``: an AMD GPU (no inline PTX in the rotary)."""
    c, h, H, b = _block_and_head(ROPE != 0)
    length = tl.load(seq_ptr + b * 8 + LEN_COL)
    src = tl.load(seq_ptr + b * 8 + SRC_COL)
    t0 = c * CHUNK
    offs_d = tl.arange(0, DP)
    dmask = offs_d < D
    loc = tl.arange(0, SUB)
    base = x_ptr + b.to(tl.int64) * x_sb + h.to(tl.int64) * x_sh
    s1 = tl.zeros([SUB, DP], dtype=tl.float32)
    s2 = tl.zeros([SUB, DP], dtype=tl.float32)
    if t0 < length:
        for i in range(0, CHUNK, SUB):
            # 64-bit scalar base, 32-bit offsets within the tile (as the quantization passes)
            tok0 = (src + t0 + i).to(tl.int64)
            rmask = t0 + i + loc < length
            m = rmask[:, None] & dmask[None, :]
            x = tl.load(base + tok0 * x_st + loc[:, None] * x_st + offs_d[None, :] * x_sd,
                        mask=m, other=0.0).to(tl.float32)
            if ROPE:
                x = _rope_pairs(x, cos_ptr, sin_ptr, x_ptr, t0 + i, loc, rmask, rope_lo, rope_n,
                                DP, SUB, HALF_D, ROPE, ROPE_RANGE, SOFT_CAST, HIP)
            x = finite_or(x, 0.0)
            s1 += x
            s2 += x * x
    out = out_ptr + (((b * H + h) * n_chunks + c) * 2) * DP + offs_d
    tl.store(out, tl.sum(s1, 0))
    tl.store(out + DP, tl.sum(s2, 0))
