"""Channel sums of the ``balance`` recipes (``fp8dit.balance``): per chunk of tokens, head and
sequence, the sum of x and of x**2 over each channel, of Q or of K as the quantization will see
them (rotary embedding applied as it applies it)."""

import triton
import triton.language as tl

from .common import finite_or, is_finite
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


@triton.jit
def _sum_moments(m_ptr, row0, n_rows, n_chunks, offs_d, DP: tl.constexpr):
    """(sum x, sum x**2) [DP] float64 over ``n_rows`` consecutive (head) rows of the channel
    sums [.., heads, n_chunks, 2, DP] from row ``row0`` on, every chunk of each, in order."""
    s1 = tl.zeros([DP], dtype=tl.float64)
    s2 = tl.zeros([DP], dtype=tl.float64)
    for r in range(n_rows):
        for c in range(n_chunks):
            p = m_ptr + ((row0 + r) * n_chunks + c) * 2 * DP + offs_d
            s1 += tl.load(p).to(tl.float64)
            s2 += tl.load(p + DP).to(tl.float64)
    return s1, s2


@triton.jit
def _div_or(num, den, other):
    """num / den where den > 0, else ``other`` (no division by zero taken)."""
    ok = den > 0
    return tl.where(ok, num / tl.where(ok, den, 1.0), other)


@triton.jit
def balance_vectors_kernel(
    qm_ptr, km_ptr, seq_ptr, vq_ptr, vk_ptr,
    Hkv, group, nq_chunks, nk_chunks,
    DP: tl.constexpr, ALPHA_MIN: tl.constexpr, S_LIMIT: tl.constexpr,
):
    """The transform of ``fp8dit.balance.balance_matrices`` for one (sequence, kv head) per
    program, from the channel sums as :func:`channel_moments_kernel` writes them (Q: [B,
    Hkv * group, nq_chunks, 2, DP], K: [B, Hkv, nk_chunks, 2, DP]), as the vectors the
    quantization applies it with (``kernels.quantize._rotate``): ``vq`` = (u, (a - 1) u, 1/s),
    ``vk`` = (u, (1/a - 1) u, s), [B, Hkv, 3, DP] float32 each, for ``Mq = (I + (a - 1) u u^T)
    diag(1/s) R`` and ``Mk = (I + (1/a - 1) u u^T) diag(s) R``.

    One launch for what was ~60 small torch ops, whose launches the GPU waited on: -bal cost
    +10.1% at CogVideoX-5B with them, +5.4% with one kernel building the matrices (H100,
    docs/design.md). The statistics are float64 as there; the vectors float32."""
    pid = tl.program_id(0)
    b = pid // Hkv
    hk = pid % Hkv
    offs = tl.arange(0, DP)
    q_sum, q_sq = _sum_moments(qm_ptr, (b * Hkv + hk) * group, group, nq_chunks, offs, DP)
    k_sum, k_sq = _sum_moments(km_ptr, b * Hkv + hk, 1, nk_chunks, offs, DP)
    # a head whose sums overflowed or met no finite value: no balance
    good = tl.min((is_finite(q_sum) & is_finite(q_sq) & is_finite(k_sum)
                   & is_finite(k_sq)).to(tl.int32), 0) == 1
    q_sum = tl.where(good, q_sum, 0.0)
    q_sq = tl.where(good, q_sq, 0.0)
    k_sum = tl.where(good, k_sum, 0.0)
    k_sq = tl.where(good, k_sq, 0.0)
    nq = tl.maximum(tl.load(seq_ptr + b * 8).to(tl.float64) * group, 1.0)
    nk = tl.maximum(tl.load(seq_ptr + b * 8 + 1).to(tl.float64), 1.0)
    mq = q_sum / nq
    eq2 = q_sq / nq
    vq = tl.maximum(eq2 - mq * mq, 0.0)
    mk = k_sum / nk
    vk = tl.maximum(k_sq / nk - mk * mk, 0.0)

    # 1. rank one along Q's mean direction
    norm2 = tl.sum(mq * mq, 0)
    total_q = tl.sum(eq2, 0)
    has_mean = norm2 > 1e-6 * total_q
    u = tl.where(has_mean, _div_or(mq, tl.sqrt(norm2), 0.0), 0.0)
    u2 = u * u
    uvq = tl.sum(u2 * vq, 0)
    m = norm2 + uvq
    big_m = tl.maximum(total_q - m, 0.0)
    n = tl.sum(u2 * vk, 0)
    big_n = tl.maximum(tl.sum(vk, 0) - n, 0.0)
    a4 = tl.maximum(_div_or(big_m * n, m * big_n, 0.0), 0.0)
    a = tl.where(has_mean & (n > 0) & (big_n > 0), tl.sqrt(tl.sqrt(a4)), 1.0)
    a = tl.minimum(tl.maximum(a, ALPHA_MIN), 1.0)
    bk = 1.0 / a - 1.0
    a1 = a - 1.0

    # 2. per-channel balance on the second moments after step 1
    eq2p = (a * mq) * (a * mq) + vq + 2 * a1 * u2 * vq + a1 * a1 * u2 * uvq
    vkp = vk + 2 * bk * u2 * vk + bk * bk * u2 * n
    ok = (eq2p > 0) & (vkp > 0)
    s = tl.where(ok, tl.sqrt(tl.sqrt(_div_or(eq2p, vkp, 1.0))), 1.0)
    s = tl.minimum(tl.maximum(s, 1.0 / S_LIMIT), S_LIMIT)

    # 3. the vectors
    out = pid.to(tl.int64) * 3 * DP + offs
    u32 = u.to(tl.float32)
    tl.store(vq_ptr + out, u32)
    tl.store(vq_ptr + out + DP, a1.to(tl.float32) * u32)
    tl.store(vq_ptr + out + 2 * DP, (1.0 / s).to(tl.float32))
    tl.store(vk_ptr + out, u32)
    tl.store(vk_ptr + out + DP, bk.to(tl.float32) * u32)
    tl.store(vk_ptr + out + 2 * DP, s.to(tl.float32))
