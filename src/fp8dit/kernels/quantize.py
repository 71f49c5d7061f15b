"""Fused FP8 quantization of Q, K and V into the padded head-major buffers the attention reads.

Inputs are read once in their own layout through strides (NHD, HND or packed varlen), so no
transpose, pad or ``.contiguous()`` runs in torch. Per-sequence metadata comes from the plan's
``seq`` table (one int32 row per sequence, fields named by the ``SEQ_*`` constants below).

Recipe (the default, see ``fp8dit.recipes``):
- K: subtract the per-(sequence, kv head, channel) mean over tokens ("smooth K"; exact because
  softmax is shift-invariant per row), then one int8 (or fp8) scale per block of ``BLOCK_N``
  tokens.
- Q: one int8 (or fp8) scale per token, multiplied by ``softmax_scale * log2(e)`` so the
  attention kernel turns scores into exp2 arguments with a single FMA.
- A token (Q) or block (K) holding a non-finite value gets a NaN scale: int8 cannot carry NaN,
  and the scale carries it into exactly the scores that the bad value reaches (for K, the
  block's scores).
- V: optional per-channel mean removal (added back after PV), then one fp8 scale per channel;
  stored transposed ([head, channel, token]) because fp8 wgmma wants V K-major.
"""

import triton
import triton.language as tl

from .common import finite_or, quantize_tile, to_fp8_e4m3

# Columns of the plan's int32 ``seq`` table.
SEQ_Q_LEN = 0
SEQ_K_LEN = 1
SEQ_Q_SRC = 2  # first token of the sequence in the user's tensor (varlen offset, 0 when dense)
SEQ_K_SRC = 3
SEQ_Q_PAD = 4  # first row of the sequence in the padded internal q buffer
SEQ_K_PAD = 5
SEQ_K_BLK = 6  # first kv block of the sequence (index into the per-block K scales)
SEQ_FIELDS = 8

# Scales never drop below this amax: keeps products of scales normal in fp32, so a masked
# -inf score times its scale stays -inf instead of becoming NaN.
AMAX_FLOOR = tl.constexpr(1e-8)

# Channel statistics per chunk: [sum K, sum V, max V, min V].
N_STATS = 4


@triton.jit
def kv_channel_stats_kernel(
    k_ptr, v_ptr, stats_ptr, seq_ptr,
    k_sb, k_st, k_sh, k_sd,
    v_sb, v_st, v_sh, v_sd,
    n_chunks, D,
    DP: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr,
):
    """Per (chunk of tokens, kv head, sequence): channel sums of K and V, max and min of V.

    Partial results go to ``stats[b, h, chunk]``; consumers add the chunks up in a fixed order,
    so the result is deterministic (no atomics). Non-finite values are left out of the sums.
    """
    c = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    Hkv = tl.num_programs(1)
    k_len = tl.load(seq_ptr + b * 8 + 1)
    k_src = tl.load(seq_ptr + b * 8 + 3)
    t0 = c * CHUNK
    if t0 < k_len:
        offs_d = tl.arange(0, DP)
        dmask = offs_d < D
        ksum = tl.zeros([DP], dtype=tl.float32)
        vsum = tl.zeros([DP], dtype=tl.float32)
        vmax = tl.full([DP], float("-inf"), dtype=tl.float32)
        vmin = tl.full([DP], float("inf"), dtype=tl.float32)
        kb = k_ptr + b.to(tl.int64) * k_sb + h.to(tl.int64) * k_sh
        vb = v_ptr + b.to(tl.int64) * v_sb + h.to(tl.int64) * v_sh
        for i in range(0, CHUNK, SUB):
            rows = t0 + i + tl.arange(0, SUB)
            m = (rows < k_len)[:, None] & dmask[None, :]
            tok = (k_src + rows).to(tl.int64)
            k = tl.load(kb + tok[:, None] * k_st + offs_d[None, :] * k_sd, mask=m, other=0.0)
            v = tl.load(vb + tok[:, None] * v_st + offs_d[None, :] * v_sd, mask=m, other=0.0)
            k = k.to(tl.float32)
            v = v.to(tl.float32)
            ksum += tl.sum(finite_or(k, 0.0), 0)
            vsum += tl.sum(finite_or(v, 0.0), 0)
            v_hi = tl.where(m, finite_or(v, float("-inf")), float("-inf"))
            v_lo = tl.where(m, finite_or(v, float("inf")), float("inf"))
            vmax = tl.maximum(vmax, tl.max(v_hi, 0))
            vmin = tl.minimum(vmin, tl.min(v_lo, 0))
        out = stats_ptr + (((b * Hkv + h) * n_chunks + c) * 4) * DP + offs_d
        tl.store(out, ksum)
        tl.store(out + DP, vsum)
        tl.store(out + 2 * DP, vmax)
        tl.store(out + 3 * DP, vmin)


@triton.jit
def kv_stats_finalize_kernel(
    stats_ptr, seq_ptr, k_mean_ptr, v_mean_ptr, v_scale_ptr,
    n_chunks, D,
    DP: tl.constexpr, CHUNK: tl.constexpr, SMOOTH_K: tl.constexpr, CENTER_V: tl.constexpr,
):
    """Per (kv head, sequence): add the chunks up (fixed order) into K's channel mean and V's
    channel mean and fp8 scale, once, so the quantization programs read one row each."""
    h = tl.program_id(0)
    b = tl.program_id(1)
    Hkv = tl.num_programs(0)
    k_len = tl.load(seq_ptr + b * 8 + 1)
    offs_d = tl.arange(0, DP)
    dmask = offs_d < D
    ksum = tl.zeros([DP], dtype=tl.float32)
    vsum = tl.zeros([DP], dtype=tl.float32)
    vmax = tl.full([DP], float("-inf"), dtype=tl.float32)
    vmin = tl.full([DP], float("inf"), dtype=tl.float32)
    base = stats_ptr + ((b * Hkv + h) * n_chunks) * 4 * DP + offs_d
    for c in range(0, tl.cdiv(k_len, CHUNK)):
        p = base + c * 4 * DP
        ksum += tl.load(p)
        vsum += tl.load(p + DP)
        vmax = tl.maximum(vmax, tl.load(p + 2 * DP))
        vmin = tl.minimum(vmin, tl.load(p + 3 * DP))
    inv_len = 1.0 / tl.maximum(k_len, 1).to(tl.float32)
    if SMOOTH_K:
        k_mean = tl.where(dmask, ksum * inv_len, 0.0)
    else:
        k_mean = tl.zeros([DP], dtype=tl.float32)
    if CENTER_V:
        v_mean = tl.where(dmask, vsum * inv_len, 0.0)
    else:
        v_mean = tl.zeros([DP], dtype=tl.float32)
    v_amax = tl.maximum(vmax - v_mean, v_mean - vmin)
    v_amax = tl.maximum(finite_or(v_amax, 0.0), AMAX_FLOOR)
    out = (b * Hkv + h) * DP + offs_d
    tl.store(k_mean_ptr + out, k_mean)
    tl.store(v_mean_ptr + out, v_mean)
    tl.store(v_scale_ptr + out, v_amax / 448.0)


@triton.jit
def quantize_kv_kernel(
    k_ptr, v_ptr, k_mean_ptr, seq_ptr,
    k8_ptr, k_scale_ptr, v8t_ptr, v_scale_ptr, v_mean_ptr,
    k_sb, k_st, k_sh, k_sd,
    v_sb, v_st, v_sh, v_sd,
    D, Tk_pad, n_kblocks,
    DP: tl.constexpr, BLOCK_N: tl.constexpr, QK_INT8: tl.constexpr,
    SOFT_FP8_CAST: tl.constexpr,
):
    """One block of ``BLOCK_N`` tokens of one kv head: smooth + quantize K, center + quantize V."""
    QMAX: tl.constexpr = 127.0 if QK_INT8 else 448.0
    blk = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    Hkv = tl.num_programs(1)
    k_len = tl.load(seq_ptr + b * 8 + 1)
    k_src = tl.load(seq_ptr + b * 8 + 3)
    k_pad = tl.load(seq_ptr + b * 8 + 5)
    k_blk = tl.load(seq_ptr + b * 8 + 6)
    if blk * BLOCK_N < k_len:
        offs_d = tl.arange(0, DP)
        dmask = offs_d < D
        stat = (b * Hkv + h) * DP + offs_d
        k_mean = tl.load(k_mean_ptr + stat)
        v_mean = tl.load(v_mean_ptr + stat)
        v_scale = tl.load(v_scale_ptr + stat)

        rows = blk * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < k_len
        m = rmask[:, None] & dmask[None, :]
        tok = (k_src + rows).to(tl.int64)
        k = tl.load(
            k_ptr + b.to(tl.int64) * k_sb + h.to(tl.int64) * k_sh
            + tok[:, None] * k_st + offs_d[None, :] * k_sd,
            mask=m, other=0.0,
        ).to(tl.float32)
        ks = tl.where(m, k - k_mean[None, :], 0.0)
        k_amax = tl.max(tl.max(tl.abs(finite_or(ks, 0.0)), 1), 0)
        k_scale = tl.maximum(k_amax, AMAX_FLOOR) / QMAX
        k8 = quantize_tile(ks, 1.0 / k_scale, QK_INT8, SOFT_FP8_CAST)
        n_bad = tl.sum(tl.sum(tl.where(finite_or(ks, 0.0) == ks, 0, 1), 1), 0)
        k_scale = tl.where(n_bad > 0, float("nan"), k_scale)
        prow = (k_pad + rows).to(tl.int64)
        tl.store(k8_ptr + h.to(tl.int64) * Tk_pad * DP + prow[:, None] * DP + offs_d[None, :], k8)
        tl.store(k_scale_ptr + h * n_kblocks + k_blk + blk, k_scale)

        v = tl.load(
            v_ptr + b.to(tl.int64) * v_sb + h.to(tl.int64) * v_sh
            + tok[:, None] * v_st + offs_d[None, :] * v_sd,
            mask=m, other=0.0,
        ).to(tl.float32)
        vc = tl.where(m, (v - v_mean[None, :]) / v_scale[None, :], 0.0)
        # Transposed in registers so the store runs along tokens (contiguous in v8t).
        v8t = tl.trans(to_fp8_e4m3(vc, SOFT_FP8_CAST))
        tl.store(
            v8t_ptr + h.to(tl.int64) * DP * Tk_pad + offs_d[:, None] * Tk_pad + prow[None, :],
            v8t,
        )


@triton.jit
def quantize_q_kernel(
    q_ptr, k_mean_ptr, seq_ptr,
    q8_ptr, q_scale_ptr, q_lse_corr_ptr,
    q_sb, q_st, q_sh, q_sd,
    D, Tq_pad, group, sm_scale, sm_scale_log2,
    DP: tl.constexpr, BLOCK_M: tl.constexpr,
    SMOOTH_K: tl.constexpr, QK_INT8: tl.constexpr, SOFT_FP8_CAST: tl.constexpr,
):
    """One block of ``BLOCK_M`` query tokens of one head: per-token fp8 scale.

    Also stores ``sm_scale * q . mean(K)`` per row: K smoothing shifted every score of the row by
    that amount, and the true log-sum-exp needs it back.
    """
    QMAX: tl.constexpr = 127.0 if QK_INT8 else 448.0
    blk = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    H = tl.num_programs(1)
    Hkv = H // group
    q_len = tl.load(seq_ptr + b * 8 + 0)
    k_len = tl.load(seq_ptr + b * 8 + 1)
    q_src = tl.load(seq_ptr + b * 8 + 2)
    q_pad = tl.load(seq_ptr + b * 8 + 4)
    if blk * BLOCK_M < q_len:
        offs_d = tl.arange(0, DP)
        dmask = offs_d < D
        rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < q_len
        m = rmask[:, None] & dmask[None, :]
        tok = (q_src + rows).to(tl.int64)
        q = tl.load(
            q_ptr + b.to(tl.int64) * q_sb + h.to(tl.int64) * q_sh
            + tok[:, None] * q_st + offs_d[None, :] * q_sd,
            mask=m, other=0.0,
        ).to(tl.float32)
        amax = tl.max(tl.abs(finite_or(q, 0.0)), 1)
        scale = tl.maximum(amax, AMAX_FLOOR) / QMAX
        q8 = quantize_tile(q, (1.0 / scale)[:, None], QK_INT8, SOFT_FP8_CAST)
        n_bad = tl.sum(tl.where(finite_or(q, 0.0) == q, 0, 1), 1)
        scale = tl.where(n_bad > 0, float("nan"), scale)
        prow = (q_pad + rows).to(tl.int64)
        hq = h.to(tl.int64)
        tl.store(q8_ptr + hq * Tq_pad * DP + prow[:, None] * DP + offs_d[None, :], q8)
        tl.store(q_scale_ptr + hq * Tq_pad + prow, scale * sm_scale_log2)
        corr = tl.zeros([BLOCK_M], dtype=tl.float32)
        if SMOOTH_K:
            if k_len > 0:
                k_mean = tl.load(k_mean_ptr + (b * Hkv + h // group) * DP + offs_d)
                corr = tl.sum(q * k_mean[None, :], 1) * sm_scale
        tl.store(q_lse_corr_ptr + hq * Tq_pad + prow, corr)
