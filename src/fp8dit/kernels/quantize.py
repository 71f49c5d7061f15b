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

Other recipes switch parts of this with constexpr flags (the default compiles as before):
``PV_BF16`` stores V in bf16 without a scale (same transposed layout); ``TENSOR_SCALES`` takes
one scale per tensor for Q, K and V from :func:`qkv_abs_max_kernel` +
:func:`abs_max_finalize_kernel` (the per-tensor baseline).

The device's constants arrive as constexprs too (``fp8dit.device``; the defaults are NVIDIA's):
``FP8_MAX``, what an fp8 scale maps the largest magnitude to (448; 224 in fnuz), and
``FP8_FNUZ``, fp8 codes in float8e4b8 (e4m3fnuz, AMD gfx942) instead of float8e4nv;
``HIP``, an AMD GPU: no inline PTX (``common.mul_rn``, ``common.rotate_pair_bf16``).
"""

import triton
import triton.language as tl

from .common import (
    cast_for_store,
    finite_or,
    mul_rn,
    quantize_tile,
    residual_int8,
    rotate_pair_bf16,
    to_bf16,
    to_fp8_e4m3,
    v_block_log2_scale,
)

# Columns of the plan's int32 ``seq`` table.
SEQ_Q_LEN = 0
SEQ_K_LEN = 1
SEQ_Q_SRC = 2  # first token of the sequence in the user's tensor (varlen offset, 0 when dense)
SEQ_K_SRC = 3
SEQ_Q_PAD = 4  # first row of the sequence in the padded internal q buffer
SEQ_K_PAD = 5
SEQ_K_BLK = 6  # first kv block of the sequence (index into the per-block K scales)
# the plan's key length: SEQ_K_LEN's unless a call's copy of the table holds shorter lengths
# that only the device knows (attend.launch_fp8_attention(device_k_lens)); the blocks between
# the two are quantized as zeros
SEQ_K_PLAN = 7
SEQ_FIELDS = 8

# Scales never drop below this amax: keeps products of scales normal in fp32, so a masked
# -inf score times its scale stays -inf instead of becoming NaN.
AMAX_FLOOR = tl.constexpr(1e-8)

# Channel statistics per chunk: [sum K, sum V, max V, min V].
N_STATS = 4


# Rotary position embedding fused into the loads (``ROPE``): 0 none; 1 Wan's with fp32 tables,
# rounded once to the input's dtype; 2 Wan's with bf16 tables and inputs, every product and sum
# rounded to bf16; 3 diffusers' apply_rotary_emb (whole cos and sin rows: four table columns per
# pair, fp32 math, one rounding).
ROPE_NONE = 0
ROPE_FP32 = 1
ROPE_ROUNDED = 2
ROPE_FOUR = 3


@triton.jit
def _rope_pairs(x, cos_ptr, sin_ptr, x_ptr, row0, loc, rmask, rope_lo, rope_n,
                DP: tl.constexpr, ROWS: tl.constexpr, HALF_D: tl.constexpr, ROPE: tl.constexpr,
                ROPE_RANGE: tl.constexpr, SOFT_CAST: tl.constexpr, HIP: tl.constexpr = False):
    """Rows ``row0 + loc`` of one head (``x``: fp32 [ROWS, DP], zeros where masked) rotated
    pairwise the way diffusers rotates q and k before attention (``fp8dit.rope``), in the same
    arithmetic and with the same roundings, so the quantization sees bitwise the tensor
    diffusers would have passed (and no rotated copy is written or read back).

    Output 2i is ``x[2i] * c[i] - x[2i+1] * s2[i]``, output 2i+1 is ``x[2i] * s[i] + x[2i+1] *
    c2[i]`` (``rope.rope_tables``). Wan (``ROPE_FP32``, ``ROPE_ROUNDED``): tables of ``HALF_D``
    values per token, c = cos[2i] = c2, s = sin[2i+1] = s2. ``ROPE_FOUR``: whole rows of cos
    and sin (``2 * HALF_D`` values per token) loaded as x is and split as x is into their even
    and odd columns, c = cos[2i], c2 = cos[2i+1], s2 = sin[2i], s = sin[2i+1]: four half-width
    tables loaded on their own made each a layout conversion through shared memory (sm_90
    SASS of triton 3.6, quantize_q: 15 barriers against 5, 116 registers against 80).
    A constant row length lets the loads go 16 bytes at a time (a runtime one made them
    2-byte loads, sm_90 SASS of triton 3.9). ``ROPE_FP32`` / ``ROPE_FOUR``: fp32 products and
    sums rounded once to x's dtype, each product rounded on its own (``mul_rn``) as torch
    rounds it. ``ROPE_ROUNDED``: bf16 tables and inputs, each product and sum rounded to bf16
    (torch's element-wise ops on bf16 tensors: a model cast to bf16 casts its rotary buffers
    too), rounded by ``cvt.rn.bf16x2.f32`` in inline PTX (``rotate_pair_bf16``).

    ``ROPE_RANGE``: only tokens ``rope_lo .. rope_lo + rope_n`` turn (table row = token -
    ``rope_lo``); the others keep their values.

    Q's LSE correction (q . mean K) may differ from the unfused path's in its last bits: the
    rotated tile's register layout changes the order of that sum (H200, 2026-12-04; with
    ``ROPE_FOUR``'s whole rows, for Wan's fp32 tables only).
    """
    HALF: tl.constexpr = DP // 2
    tok = row0 + loc
    if ROPE_RANGE:
        inr = (tok >= rope_lo) & (tok < rope_lo + rope_n)
        rm = rmask & inr
        row = tok - rope_lo
    else:
        rm = rmask
        row = tok
    if ROPE == 3:  # ROPE_FOUR
        j = tl.arange(0, DP)
        m = rm[:, None] & (j < 2 * HALF_D)[None, :]
        at = row[:, None] * (2 * HALF_D) + j[None, :]
        c, c2 = tl.split(tl.reshape(tl.load(cos_ptr + at, mask=m, other=0.0).to(tl.float32),
                                    [ROWS, HALF, 2]))
        s2, s = tl.split(tl.reshape(tl.load(sin_ptr + at, mask=m, other=0.0).to(tl.float32),
                                    [ROWS, HALF, 2]))
    else:
        i = tl.arange(0, HALF)
        m = rm[:, None] & (i < HALF_D)[None, :]
        at = row[:, None] * HALF_D + i[None, :]
        c = tl.load(cos_ptr + at, mask=m, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + at, mask=m, other=0.0).to(tl.float32)
        c2 = c
        s2 = s
    xe, xo = tl.split(tl.reshape(x, [ROWS, HALF, 2]))
    if ROPE == 2:  # ROPE_ROUNDED (a product of two bf16 values is exact in fp32)
        oe, oo = rotate_pair_bf16(xe, xo, c, s, SOFT_CAST, HIP)
    else:
        oe = cast_for_store(mul_rn(xe, c, SOFT_CAST, HIP) - mul_rn(xo, s2, SOFT_CAST, HIP),
                            x_ptr, SOFT_CAST).to(tl.float32)
        oo = cast_for_store(mul_rn(xe, s, SOFT_CAST, HIP) + mul_rn(xo, c2, SOFT_CAST, HIP),
                            x_ptr, SOFT_CAST).to(tl.float32)
    out = tl.reshape(tl.join(oe, oo), [ROWS, DP])
    if ROPE_RANGE:
        out = tl.where(inr[:, None], out, x)
    return out


@triton.jit
def _block_and_head(HEADS_FIRST: tl.constexpr):
    """(block, head, number of heads, sequence) of this program: the grid is (blocks, heads,
    sequences), or (heads, blocks, sequences) with ``HEADS_FIRST`` (with ``ROPE``: the programs
    running at once then share the same rows of the rotary table in L2)."""
    if HEADS_FIRST:
        blk = tl.program_id(1)
        h = tl.program_id(0)
        n_heads = tl.num_programs(0)
    else:
        blk = tl.program_id(0)
        h = tl.program_id(1)
        n_heads = tl.num_programs(1)
    b = tl.program_id(2)
    return blk, h, n_heads, b


@triton.jit
def _fwht(x, ROWS: tl.constexpr, DP: tl.constexpr):
    """``x @ H`` for the unnormalized Sylvester-Hadamard matrix H [DP, DP] (DP a power of two)
    along each of the ``ROWS`` rows, in fp32 adds: a butterfly on the lowest bit of the channel
    index, then a cyclic rotation of the index bits (the transformed bit becomes the highest),
    log2(DP) times, which leaves the channels in their order."""
    for _ in tl.static_range(DP.bit_length() - 1):
        a, b = tl.split(tl.reshape(x, [ROWS, DP // 2, 2]))
        x = tl.reshape(tl.permute(tl.join(a + b, a - b), [0, 2, 1]), [ROWS, DP])
    return x


@triton.jit
def _row_sum_order_free(p, ROWS: tl.constexpr, DP: tl.constexpr):
    """Each of the ``ROWS`` rows' sum over its ``DP`` channels (a power of two, at most 256),
    the same whatever order the adds run in: each term is put on one fixed-point grid per row,
    set by the row's largest term (its exponent; ``max`` is exact in any order), truncated to an
    int32 there, and the integers are added (exact, so in any order). The largest term gets
    ``30 - log2(DP)`` bits, so the sum cannot overflow; a term below the grid's step is lost, as
    in a float sum. ``tl.sum`` of the floats adds in the order of the register layout, which
    the fused rotary embedding changes."""
    K: tl.constexpr = 31 - DP.bit_length()
    m = tl.max(tl.abs(p), 1)
    e = (m.to(tl.int32, bitcast=True) >> 23) & 0xFF  # biased exponent: m in [2^(e-127), 2^(e-126))
    e = tl.minimum(tl.maximum(e, K), 254)  # a row of zeros or of tiny terms: the coarsest grid
    up = ((K + 253 - e) << 23).to(tl.float32, bitcast=True)  # 2^(K + 126 - e): m*up < 2^K
    down = ((e + 1 - K) << 23).to(tl.float32, bitcast=True)  # 1 / up
    n = (p * up[:, None]).to(tl.int32)
    return tl.sum(n, 1).to(tl.float32) * down


@triton.jit
def _rotate(x, bal_ptr, ROWS: tl.constexpr, DP: tl.constexpr, BALANCE: tl.constexpr = False,
            SOFT_CAST: tl.constexpr = False, HIP: tl.constexpr = False):
    """``x @ R`` for the orthonormal Hadamard matrix R = H / sqrt(DP) (recipes with ``rotate``,
    ``quantize.hadamard``): spreads outlier channels over all channels before the per-token /
    per-block scale is taken, so one large channel no longer coarsens the others' int8 steps.
    Scores are unchanged (R R^T = I). A fast Walsh-Hadamard transform (``_fwht``): fp32 adds in
    registers, log2(DP) per value, where a tf32 dot with the matrix read R from memory in every
    program, spilled, and rounded each product to tf32 (docs/design.md).

    ``BALANCE`` (the balance recipes, ``fp8dit.balance``): ``bal_ptr`` holds (u, c u, w)
    [3, DP] of this (sequence, kv head) and side, and the transform is
    ``((x + (x . u) c u) * w) @ R``: the matrix ``(I + c u u^T) diag(w) R`` applied as a rank-one
    update, a channel scale and the rotation. Each product is rounded on its own (``mul_rn``):
    contracted into FMAs with the adds that follow, as the compiler chose per kernel, the fused
    rotary embedding's programs rounded otherwise than the unfused ones (H100, triton 3.6).
    ``x . u`` is summed as integers (``_row_sum_order_free``) for the same reason."""
    if BALANCE:
        offs = tl.arange(0, DP)
        u = tl.load(bal_ptr + offs)
        cu = tl.load(bal_ptr + DP + offs)
        w = tl.load(bal_ptr + 2 * DP + offs)
        xu = _row_sum_order_free(mul_rn(x, u[None, :], SOFT_CAST, HIP), ROWS, DP)
        x = x + mul_rn(xu[:, None], cu[None, :], SOFT_CAST, HIP)
        x = mul_rn(x, w[None, :], SOFT_CAST, HIP)
    return _fwht(x, ROWS, DP) * (1.0 / tl.sqrt(DP * 1.0))


@triton.jit
def _load_kv_sub(kb, vb, k_st, k_sd, v_st, v_sd, k_src, t, end, offs_d, dmask, loc):
    """K and V's rows [t, t + len(loc)) of one head (masked at ``end``), in their dtype."""
    # 64-bit scalar base, 32-bit offsets within the tile: per-element 64-bit addresses cost
    # two registers each and made these kernels spill.
    tok0 = (k_src + t).to(tl.int64)
    m = (t + loc < end)[:, None] & dmask[None, :]
    k = tl.load(kb + tok0 * k_st + loc[:, None] * k_st + offs_d[None, :] * k_sd, mask=m,
                other=0.0)
    v = tl.load(vb + tok0 * v_st + loc[:, None] * v_st + offs_d[None, :] * v_sd, mask=m,
                other=0.0)
    return k, v


@triton.jit
def _stats_chunk(kb, vb, k_st, k_sd, v_st, v_sd, k_src, t0, k_len, offs_d, dmask, loc,
                 out, kout, cos_ptr, sin_ptr, k_ptr, rope_lo, rope_n,
                 DP: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr,
                 KBLK: tl.constexpr, HALF_D: tl.constexpr,
                 ROPE: tl.constexpr, ROPE_RANGE: tl.constexpr, SOFT_CAST: tl.constexpr,
                 HIP: tl.constexpr = False, bal_ptr=None, ROTATE: tl.constexpr = False,
                 BALANCE: tl.constexpr = False):
    """One chunk of ``kv_channel_stats_kernel``: rows past ``k_len`` masked, non-finite values
    left out (and K's flagged per block). Stores the chunk's four rows at ``out`` and, with
    ``KBLK``, each block's K max and min from ``kout`` on (``ROTATE``: of the rotated K).

    The next sub-tile's loads are issued before the current one's work, so each program keeps
    two sub-tiles of K and V in flight (H200, 2026-12-03: Wan 720p 0.86 ms against 1.06
    without; two ahead no better)."""
    # Element-wise partials over the chunk, reduced across rows once at the end: a
    # cross-warp reduction per tile (four of them) ran this pass at ~400 GB/s.
    ksum = tl.zeros([SUB, DP], dtype=tl.float32)
    vsum = tl.zeros([SUB, DP], dtype=tl.float32)
    vmax = tl.full([SUB, DP], float("-inf"), dtype=tl.float32)
    vmin = tl.full([SUB, DP], float("inf"), dtype=tl.float32)
    KB: tl.constexpr = KBLK if KBLK > 0 else CHUNK
    end = tl.minimum(k_len, t0 + CHUNK)  # the prefetch stops at the chunk's end
    k_nxt, v_nxt = _load_kv_sub(kb, vb, k_st, k_sd, v_st, v_sd, k_src, t0, end,
                                offs_d, dmask, loc)
    for j in range(0, CHUNK, KB):
        if KBLK > 0:
            kmax = tl.full([SUB, DP], float("-inf"), dtype=tl.float32)
            kmin = tl.full([SUB, DP], float("inf"), dtype=tl.float32)
            kbad = tl.zeros([SUB, DP], dtype=tl.int32)
        for i in range(j, j + KB, SUB):
            m = (t0 + i + loc < k_len)[:, None] & dmask[None, :]
            k = k_nxt
            v = v_nxt
            k_nxt, v_nxt = _load_kv_sub(kb, vb, k_st, k_sd, v_st, v_sd, k_src,
                                        t0 + i + SUB, end, offs_d, dmask, loc)
            k = k.to(tl.float32)
            v = v.to(tl.float32)
            if ROPE:
                k = _rope_pairs(k, cos_ptr, sin_ptr, k_ptr, t0 + i,
                                loc, t0 + i + loc < k_len, rope_lo, rope_n, DP, SUB,
                                HALF_D, ROPE, ROPE_RANGE, SOFT_CAST, HIP)
            ksum += finite_or(k, 0.0)
            vsum += finite_or(v, 0.0)
            vmax = tl.maximum(vmax, tl.where(m, finite_or(v, float("-inf")), float("-inf")))
            vmin = tl.minimum(vmin, tl.where(m, finite_or(v, float("inf")), float("inf")))
            if KBLK > 0:
                # as the quantizer's own amax: non-finite values left out (and flagged)
                ok = m & (finite_or(k, 0.0) == k)
                if ROTATE:  # every channel of the rotated rows; non-finite values left out
                    kr = _rotate(tl.where(ok, k, 0.0), bal_ptr, SUB, DP, BALANCE, SOFT_CAST, HIP)
                    live = (t0 + i + loc < k_len)[:, None]
                    kmax = tl.maximum(kmax, tl.where(live, kr, float("-inf")))
                    kmin = tl.minimum(kmin, tl.where(live, kr, float("inf")))
                else:
                    kmax = tl.maximum(kmax, tl.where(ok, k, float("-inf")))
                    kmin = tl.minimum(kmin, tl.where(ok, k, float("inf")))
                kbad += tl.where(m & ~ok, 1, 0)
        if KBLK > 0:
            if t0 + j < k_len:
                bad = tl.sum(tl.sum(kbad, 0), 0)
                kmx = tl.where(bad > 0, float("nan"), tl.max(kmax, 0))
                ko = kout + (j // KBLK) * 2 * DP
                tl.store(ko + offs_d, kmx)
                tl.store(ko + DP + offs_d, tl.min(kmin, 0))
    tl.store(out, tl.sum(ksum, 0))
    tl.store(out + DP, tl.sum(vsum, 0))
    tl.store(out + 2 * DP, tl.max(vmax, 0))
    tl.store(out + 3 * DP, tl.min(vmin, 0))


@triton.jit
def kv_channel_stats_kernel(
    k_ptr, v_ptr, stats_ptr, seq_ptr,
    k_sb, k_st, k_sh, k_sd,
    v_sb, v_st, v_sh, v_sd,
    n_chunks, D, kblk_ptr, n_kblocks,
    DP: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr, KBLK: tl.constexpr,
    cos_ptr=None, sin_ptr=None, rope_lo=0, rope_n=0,
    HALF_D: tl.constexpr = 0, ROPE: tl.constexpr = 0, ROPE_RANGE: tl.constexpr = False,
    SOFT_CAST: tl.constexpr = False, HIP: tl.constexpr = False,
    bal_ptr=None, ROTATE: tl.constexpr = False, BALANCE: tl.constexpr = False,
):
    """Per (chunk of tokens, kv head, sequence): channel sums of K and V, max and min of V.

    Partial results go to ``stats[b, h, chunk]``; consumers add the chunks up in a fixed order,
    so the result is deterministic (no atomics). Non-finite values are left out of the sums.

    ``KBLK`` > 0 (a divisor of ``CHUNK``): also K's per-channel max and min over each block of
    ``KBLK`` tokens, into ``kblk[h, k_blk + block, 0 / 1]`` (max NaN where the block holds a
    non-finite K). The quantizer derives each block's amax of K minus its mean from them
    exactly (rounding is monotonic: fl(max k - m) = max fl(k - m)), so its programs need not
    span the attention kernel's 256-key blocks (``quantize_kv_kernel(KAMAX_FROM_STATS)``).
    ``ROTATE`` (the rotating recipes, ``BALANCE`` and ``bal`` as ``quantize_kv_kernel``'s):
    the max and min over every channel of the rotated K (``_rotate``); the quantizer subtracts
    the rotated mean (T(k - m) = T(k) - T(m), equal up to fp32 rounding).

    ``ROPE`` (``_rope_pairs``): K is rotated as loaded; heads first in the grid
    (``_block_and_head``).
    """
    c, h, Hkv, b = _block_and_head(ROPE != 0)
    k_len = tl.load(seq_ptr + b * 8 + 1)
    k_src = tl.load(seq_ptr + b * 8 + 3)
    t0 = c * CHUNK
    if t0 < k_len:
        offs_d = tl.arange(0, DP)
        dmask = offs_d < D
        kb = k_ptr + b.to(tl.int64) * k_sb + h.to(tl.int64) * k_sh
        vb = v_ptr + b.to(tl.int64) * v_sb + h.to(tl.int64) * v_sh
        loc = tl.arange(0, SUB)
        out = stats_ptr + (((b * Hkv + h) * n_chunks + c) * 4) * DP + offs_d
        kout = kblk_ptr
        bp = bal_ptr
        if BALANCE:
            bp = bal_ptr + (b * Hkv + h).to(tl.int64) * (3 * DP)
        if KBLK > 0:
            k_blk = tl.load(seq_ptr + b * 8 + 6)
            kout = kblk_ptr + ((h * n_kblocks + k_blk + t0 // KBLK) * 2) * DP
        # Always true; the compare and its branch are part of the code timed on the H200
        # (without them this pass compiles to other sm_90 SASS, 2026-12-05).
        if t0 >= 0:
            _stats_chunk(kb, vb, k_st, k_sd, v_st, v_sd, k_src, t0, k_len, offs_d, dmask, loc,
                         out, kout, cos_ptr, sin_ptr, k_ptr, rope_lo, rope_n, DP, CHUNK, SUB,
                         KBLK, HALF_D, ROPE, ROPE_RANGE, SOFT_CAST, HIP, bp, ROTATE, BALANCE)


@triton.jit
def kv_stats_finalize_kernel(
    stats_ptr, seq_ptr, k_mean_ptr, v_mean_ptr, v_scale_ptr, amax_ptr,
    n_chunks, D,
    DP: tl.constexpr, CHUNK: tl.constexpr, ROWS: tl.constexpr, SMOOTH_K: tl.constexpr,
    CENTER_V: tl.constexpr, TENSOR_SCALES: tl.constexpr, PV_BF16: tl.constexpr,
    FP8_MAX: tl.constexpr = 448.0,
):
    """Per (kv head, sequence): add the chunks up (fixed order) into K's channel mean and V's
    channel mean and fp8 scale, once, so the quantization programs read one row each.

    Chunks are read ``ROWS`` at a time as [ROWS, DP] tiles: with short chunks there are dozens
    per head, and one dependent load per chunk left this latency-bound.
    ``PV_BF16``: V's scale is 1 (bf16 V is not scaled). ``TENSOR_SCALES``: V's scale is V's
    tensor-wide amax (``amax_ptr[2]``) / ``FP8_MAX`` in every channel (the fp8 format's scale
    limit, ``fp8dit.device.Fp8Format.scale_max``)."""
    h = tl.program_id(0)
    b = tl.program_id(1)
    Hkv = tl.num_programs(0)
    k_len = tl.load(seq_ptr + b * 8 + 1)
    offs_d = tl.arange(0, DP)
    dmask = offs_d < D
    offs_r = tl.arange(0, ROWS)
    ksum = tl.zeros([ROWS, DP], dtype=tl.float32)
    vsum = tl.zeros([ROWS, DP], dtype=tl.float32)
    vmax = tl.full([ROWS, DP], float("-inf"), dtype=tl.float32)
    vmin = tl.full([ROWS, DP], float("inf"), dtype=tl.float32)
    base = stats_ptr + ((b * Hkv + h) * n_chunks) * 4 * DP
    n_used = tl.cdiv(k_len, CHUNK)
    for c0 in range(0, n_used, ROWS):
        rows = c0 + offs_r
        rm = (rows < n_used)[:, None]
        p = base + rows[:, None] * (4 * DP) + offs_d[None, :]
        ksum += tl.load(p, mask=rm, other=0.0)
        vsum += tl.load(p + DP, mask=rm, other=0.0)
        vmax = tl.maximum(vmax, tl.load(p + 2 * DP, mask=rm, other=float("-inf")))
        vmin = tl.minimum(vmin, tl.load(p + 3 * DP, mask=rm, other=float("inf")))
    ksum = tl.sum(ksum, 0)
    vsum = tl.sum(vsum, 0)
    vmax = tl.max(vmax, 0)
    vmin = tl.min(vmin, 0)
    inv_len = 1.0 / tl.maximum(k_len, 1).to(tl.float32)
    if SMOOTH_K:
        k_mean = tl.where(dmask, ksum * inv_len, 0.0)
    else:
        k_mean = tl.zeros([DP], dtype=tl.float32)
    if CENTER_V:
        v_mean = tl.where(dmask, vsum * inv_len, 0.0)
    else:
        v_mean = tl.zeros([DP], dtype=tl.float32)
    if PV_BF16:
        v_scale = tl.full([DP], 1.0, dtype=tl.float32)
    elif TENSOR_SCALES:
        v_scale = tl.zeros([DP], dtype=tl.float32) + tl.load(amax_ptr + 2) / FP8_MAX
    else:
        v_amax = tl.maximum(vmax - v_mean, v_mean - vmin)
        v_amax = tl.maximum(finite_or(v_amax, 0.0), AMAX_FLOOR)
        v_scale = v_amax / FP8_MAX
    out = (b * Hkv + h) * DP + offs_d
    tl.store(k_mean_ptr + out, k_mean)
    tl.store(v_mean_ptr + out, v_mean)
    tl.store(v_scale_ptr + out, v_scale)


@triton.jit
def _kv_block_at(x_ptr, b, h, x_sb, x_st, x_sh, x_sd, k_src, k_len, blk, rows, offs_d, dmask,
                 BLOCK_N: tl.constexpr):
    """Addresses and mask of block ``blk`` of ``BLOCK_N`` tokens of one kv head of K or V, its
    row i being token ``rows[i]`` of the block (masked at ``k_len``)."""
    tok0 = (k_src + blk * BLOCK_N).to(tl.int64)
    at = (x_ptr + b.to(tl.int64) * x_sb + h.to(tl.int64) * x_sh + tok0 * x_st
          + rows[:, None] * x_st + offs_d[None, :] * x_sd)
    return at, (blk * BLOCK_N + rows < k_len)[:, None] & dmask[None, :]


@triton.jit
def quantize_kv_kernel(
    k_ptr, v_ptr, k_mean_ptr, seq_ptr,
    k8_ptr, k_scale_ptr, v8t_ptr, v_scale_ptr, v_mean_ptr, amax_ptr, bal_ptr,
    k_sb, k_st, k_sh, k_sd,
    v_sb, v_st, v_sh, v_sd,
    D, Tk_pad, n_kblocks,
    DP: tl.constexpr, BLOCK_N: tl.constexpr, QK_INT8: tl.constexpr,
    SOFT_FP8_CAST: tl.constexpr, TENSOR_SCALES: tl.constexpr, PV_BF16: tl.constexpr,
    ROTATE: tl.constexpr = False, KV_PERM16: tl.constexpr = False,
    k8lo_ptr=None, TWO_TERM: tl.constexpr = False, SUBBLOCKS: tl.constexpr = 1,
    kblk_ptr=None, KAMAX_FROM_STATS: tl.constexpr = False,
    cos_ptr=None, sin_ptr=None, rope_lo=0, rope_n=0,
    HALF_D: tl.constexpr = 0, ROPE: tl.constexpr = 0, ROPE_RANGE: tl.constexpr = False,
    BALANCE: tl.constexpr = False,
    FP8_MAX: tl.constexpr = 448.0, FP8_FNUZ: tl.constexpr = False, HIP: tl.constexpr = False,
):
    """A block of ``BLOCK_N`` tokens of one kv head: smooth + quantize K, center + quantize V.

    ``KAMAX_FROM_STATS``: the attention kernel's kv blocks hold ``SUBBLOCKS`` of these blocks,
    and K still takes one scale per kv block, from the block's channel max and min that
    ``kv_channel_stats_kernel(KBLK)`` stored in ``kblk`` (bitwise the amax a program spanning
    the block would take, and its non-finite flag; with ``ROTATE``, of the rotated K, equal to
    it up to fp32 rounding, since the rotated mean is subtracted after the rotation): programs
    of fewer rows, which spill far less than 256-row ones at D=128 (H200, 2026-12-03: the Wan
    720p quantization 3.2 ms against 3.7; ``tuning.Quantization.kv_rows`` says where it runs).
    V's grid factor follows the attention kernel's block.

    ``KV_PERM16`` (the Gluon sm_90 kernel): V^T's token j = 16a + 8h + 2c + e is stored at
    column 16a + 4c + 2h + e, the order in which that kernel's P registers feed the PV dot.

    ``TENSOR_SCALES``: K's scale is its tensor-wide amax (``amax_ptr[1]``) instead of the
    block's. ``PV_BF16``: V (minus its mean, zero unless centered) is stored in bf16, unscaled.
    ``TWO_TERM``: K's int8 rounding residual goes to ``k8lo`` (``common.residual_int8``).
    ``ROPE`` (``_rope_pairs``): K is rotated as loaded, bitwise as the statistics pass rotated
    it; heads first in the grid (``_block_and_head``). ``BALANCE`` (with ``ROTATE``, the
    ``balance`` recipes): ``bal`` holds K's balance vectors, [3, DP] per (sequence, kv head)
    (``_rotate``, ``fp8dit.balance``).
    """
    QMAX: tl.constexpr = 127.0 if QK_INT8 else FP8_MAX
    blk, h, Hkv, b = _block_and_head(ROPE != 0)
    k_len = tl.load(seq_ptr + b * 8 + 1)
    k_src = tl.load(seq_ptr + b * 8 + 3)
    # a multiple of the plan's kv block: said so, or the V^T store along tokens, whose base
    # it offsets, is not vectorized (sm_90 SASS of triton 3.6: 32 byte stores per thread)
    k_pad = tl.multiple_of(tl.load(seq_ptr + b * 8 + 5), 16)
    k_blk = tl.load(seq_ptr + b * 8 + 6)
    k_plan = tl.load(seq_ptr + b * 8 + 7)
    offs_d = tl.arange(0, DP)
    dmask = offs_d < D
    stat = (b * Hkv + h) * DP + offs_d
    k_mean = tl.load(k_mean_ptr + stat)
    v_mean = tl.load(v_mean_ptr + stat)
    v_scale = tl.load(v_scale_ptr + stat)
    loc = tl.arange(0, BLOCK_N)
    if KV_PERM16:
        # V's rows are read in the order the attention kernel's P registers want them
        # (row i of the tile is token vloc[i]), so V^T is stored straight along tokens:
        # permuting the stored tile in registers made that store byte-wise (sm_90 SASS of
        # triton 3.6: 32 STG.E.U8 per thread, each with its own 64-bit address).
        r16 = loc % 16
        vloc = loc - r16 + ((r16 // 2) % 2) * 8 + (r16 // 4) * 2 + r16 % 2
    else:
        vloc = loc
    # Every sub-block of a live attention block is written, empty ones as zeros: the kernel
    # masks their scores, but P = 0 times a NaN byte left in V^T would still be NaN. So are
    # the blocks between the call's key length and the plan's (SEQ_K_PLAN), which the
    # attention kernel visits masked.
    blk_start = (blk // SUBBLOCKS) * (SUBBLOCKS * BLOCK_N)
    if blk_start < k_plan:
        rmask = blk * BLOCK_N + loc < k_len
        k_at, m = _kv_block_at(k_ptr, b, h, k_sb, k_st, k_sh, k_sd, k_src, k_len, blk, loc,
                               offs_d, dmask, BLOCK_N)
        k = tl.load(k_at, mask=m, other=0.0).to(tl.float32)
        if ROPE:
            k = _rope_pairs(k, cos_ptr, sin_ptr, k_ptr, blk * BLOCK_N,
                            loc, rmask, rope_lo, rope_n, DP, BLOCK_N, HALF_D, ROPE, ROPE_RANGE,
                            SOFT_FP8_CAST, HIP)
        v_at, mv = _kv_block_at(v_ptr, b, h, v_sb, v_st, v_sh, v_sd, k_src, k_len, blk,
                                vloc, offs_d, dmask, BLOCK_N)
        if KAMAX_FROM_STATS and not ROPE:  # (with ROPE, V in flight too made it spill)
            # Programs of fewer rows: V's tile asked for now overlaps K's work (Triton keeps a
            # load after the K store in program order); 256-row programs (D=64) measured slower
            # so (H200, 2026-12-03: 0.18 -> 0.19 ms at CogVideoX, 1.64 -> 1.34 ms at Wan 720p
            # with the count below left out)
            v = tl.load(v_at, mask=mv, other=0.0)
        ks = tl.where(m, k - k_mean[None, :], 0.0)
        if not KAMAX_FROM_STATS:
            n_bad = tl.sum(tl.sum(tl.where(finite_or(ks, 0.0) == ks, 0, 1), 1), 0)
        if ROTATE:  # non-finite values stay out of the dot; the NaN scale below flags the block
            # the balance recipes' vectors of this (sequence, kv head)
            bp = bal_ptr + (b * Hkv + h).to(tl.int64) * (3 * DP)
            ks = _rotate(finite_or(ks, 0.0), bp, BLOCK_N, DP, BALANCE, SOFT_FP8_CAST, HIP)
        if TENSOR_SCALES:
            k_scale = tl.load(amax_ptr + 1) / QMAX  # floored by abs_max_finalize_kernel
        elif KAMAX_FROM_STATS:
            kst = kblk_ptr + ((h * n_kblocks + k_blk + blk // SUBBLOCKS) * 2) * DP + offs_d
            kmx = tl.load(kst)
            kmn = tl.load(kst + DP)
            # a non-finite K anywhere in the block (the stats' max is NaN then) or K minus
            # its mean overflowing is flagged here, so the tile's own count is not taken
            km = k_mean
            chan = dmask
            if ROTATE:  # the rotated K's max and min: against the rotated mean, every channel
                km = tl.reshape(_rotate(k_mean[None, :], bp, 1, DP, BALANCE, SOFT_FP8_CAST, HIP),
                                [DP])
                chan = offs_d >= 0
            span = tl.maximum(kmx - km, km - kmn)  # tl.maximum drops a NaN operand
            ok = (kmx == kmx) & (finite_or(span, -1.0) == span)
            n_bad = tl.sum(tl.where(chan & ~ok, 1, 0), 0)
            k_amax = tl.max(tl.where(chan & ok, span, 0.0), 0)
            k_scale = tl.maximum(k_amax, AMAX_FLOOR) / QMAX
            # a block past the call's keys: its statistics were never written; a unit scale
            # keeps its (masked) scores finite
            n_bad = tl.where(blk_start < k_len, n_bad, 0)
            k_scale = tl.where(blk_start < k_len, k_scale, 1.0)
        else:
            k_amax = tl.max(tl.max(tl.abs(finite_or(ks, 0.0)), 1), 0)
            k_scale = tl.maximum(k_amax, AMAX_FLOOR) / QMAX
        k8 = quantize_tile(ks, 1.0 / k_scale, QK_INT8, SOFT_FP8_CAST, FP8_MAX, FP8_FNUZ)
        prow0 = (k_pad + blk * BLOCK_N).to(tl.int64)
        k_at = (h.to(tl.int64) * Tk_pad + prow0) * DP + loc[:, None] * DP + offs_d[None, :]
        if TWO_TERM:
            tl.store(k8lo_ptr + k_at, residual_int8(finite_or(ks, 0.0), 1.0 / k_scale, k8))
        k_scale = tl.where(n_bad > 0, float("nan"), k_scale)
        tl.store(k8_ptr + k_at, k8)
        if blk % SUBBLOCKS == 0:  # the kv block's scale, from its first program
            tl.store(k_scale_ptr + h * n_kblocks + k_blk + blk // SUBBLOCKS, k_scale)

        if ROPE or not KAMAX_FROM_STATS:
            v = tl.load(v_at, mask=mv, other=0.0)
        v = v.to(tl.float32)
        # Transposed in registers so the store runs along tokens (contiguous in v8t).
        if PV_BF16:
            v8t = tl.trans(to_bf16(tl.where(mv, v - v_mean[None, :], 0.0), SOFT_FP8_CAST))
        else:
            # Each block's fp8 grid is stretched by its own factor in [1, 2) (the attention
            # kernel multiplies P by it): see v_block_log2_scale.
            inv = 1.0 / (v_scale * tl.math.exp2(v_block_log2_scale(blk // SUBBLOCKS)))
            vc = tl.where(mv, (v - v_mean[None, :]) * inv[None, :], 0.0)
            v8t = tl.trans(to_fp8_e4m3(vc, SOFT_FP8_CAST, FP8_MAX, FP8_FNUZ))
        tl.store(
            v8t_ptr + h.to(tl.int64) * DP * Tk_pad + prow0
            + offs_d[:, None] * Tk_pad + loc[None, :],
            v8t,
        )


@triton.jit
def _load_q_rows(q_ptr, b, h, q_src, q_len, blk, q_sb, q_st, q_sh, q_sd, D,
                 DP: tl.constexpr, BLOCK_M: tl.constexpr):
    """Rows [blk * BLOCK_M, (blk + 1) * BLOCK_M) of one head of Q in its dtype (masked at
    ``q_len``: a block past the sequence loads nothing)."""
    offs_d = tl.arange(0, DP)
    loc = tl.arange(0, BLOCK_M)
    m = (blk * BLOCK_M + loc < q_len)[:, None] & (offs_d < D)[None, :]
    # 64-bit scalar base, 32-bit offsets within the tile (see _load_kv_sub)
    tok0 = (q_src + blk * BLOCK_M).to(tl.int64)
    return tl.load(q_ptr + b.to(tl.int64) * q_sb + h.to(tl.int64) * q_sh + tok0 * q_st
                   + loc[:, None] * q_st + offs_d[None, :] * q_sd, mask=m, other=0.0)


@triton.jit
def quantize_q_kernel(
    q_ptr, k_mean_ptr, seq_ptr,
    q8_ptr, q_scale_ptr, q_lse_corr_ptr, amax_ptr, bal_ptr,
    q_sb, q_st, q_sh, q_sd,
    D, Tq_pad, group, sm_scale, sm_scale_log2,
    DP: tl.constexpr, BLOCK_M: tl.constexpr,
    SMOOTH_K: tl.constexpr, QK_INT8: tl.constexpr, SOFT_FP8_CAST: tl.constexpr,
    TENSOR_SCALES: tl.constexpr, ROTATE: tl.constexpr = False,
    q8lo_ptr=None, TWO_TERM: tl.constexpr = False, SUBBLOCKS: tl.constexpr = 1,
    cos_ptr=None, sin_ptr=None, rope_lo=0, rope_n=0,
    HALF_D: tl.constexpr = 0, ROPE: tl.constexpr = 0, ROPE_RANGE: tl.constexpr = False,
    BALANCE: tl.constexpr = False,
    FP8_MAX: tl.constexpr = 448.0, FP8_FNUZ: tl.constexpr = False, HIP: tl.constexpr = False,
):
    """A block of ``BLOCK_M`` query tokens of one head: per-token scale.

    ``SUBBLOCKS``: the plan's query tiles (padded per sequence) hold this many of these blocks;
    every block of a live tile is written, rows past the sequence as zeros.

    Also stores ``sm_scale * q . mean(K)`` per row: K smoothing shifted every score of the row by
    that amount, and the true log-sum-exp needs it back. ``TENSOR_SCALES``: every row gets Q's
    tensor-wide scale (``amax_ptr[0]``), still stored per row for the attention kernel.
    ``TWO_TERM``: Q's int8 rounding residual goes to ``q8lo`` (``common.residual_int8``).
    ``ROPE`` (``_rope_pairs``): Q is rotated as loaded; heads first in the grid
    (``_block_and_head``). ``BALANCE`` (with ``ROTATE``): ``bal`` holds Q's balance vectors,
    [3, DP] per (sequence, kv head) (``_rotate``, ``fp8dit.balance``).
    """
    QMAX: tl.constexpr = 127.0 if QK_INT8 else FP8_MAX
    blk, h, H, b = _block_and_head(ROPE != 0)
    Hkv = H // group
    q_len = tl.load(seq_ptr + b * 8 + 0)
    k_len = tl.load(seq_ptr + b * 8 + 1)
    q_src = tl.load(seq_ptr + b * 8 + 2)
    q_pad = tl.multiple_of(tl.load(seq_ptr + b * 8 + 4), 16)  # a multiple of the q tile
    offs_d = tl.arange(0, DP)
    loc = tl.arange(0, BLOCK_M)
    if (blk // SUBBLOCKS) * (SUBBLOCKS * BLOCK_M) < q_len:
        q = _load_q_rows(q_ptr, b, h, q_src, q_len, blk, q_sb, q_st, q_sh, q_sd,
                         D, DP, BLOCK_M).to(tl.float32)
        rmask = blk * BLOCK_M + loc < q_len
        if ROPE:
            q = _rope_pairs(q, cos_ptr, sin_ptr, q_ptr, blk * BLOCK_M,
                            loc, rmask, rope_lo, rope_n, DP, BLOCK_M, HALF_D, ROPE,
                            ROPE_RANGE, SOFT_FP8_CAST, HIP)
        if ROTATE:
            # the balance recipes' vectors of this (sequence, kv head); masked rows: already 0
            bp = bal_ptr + (b * Hkv + h // group).to(tl.int64) * (3 * DP)
            qr = _rotate(finite_or(q, 0.0), bp, BLOCK_M, DP, BALANCE, SOFT_FP8_CAST, HIP)
        else:
            qr = q
        if TENSOR_SCALES:
            scale = tl.zeros([BLOCK_M], dtype=tl.float32) + tl.load(amax_ptr) / QMAX
        else:
            amax = tl.max(tl.abs(finite_or(qr, 0.0)), 1)
            scale = tl.maximum(amax, AMAX_FLOOR) / QMAX
        q8 = quantize_tile(qr, (1.0 / scale)[:, None], QK_INT8, SOFT_FP8_CAST, FP8_MAX,
                           FP8_FNUZ)
        n_bad = tl.sum(tl.where(finite_or(q, 0.0) == q, 0, 1), 1)
        prow0 = h.to(tl.int64) * Tq_pad + q_pad + blk * BLOCK_M  # row in [H*Tq_pad]
        q_at = prow0 * DP + loc[:, None] * DP + offs_d[None, :]
        if TWO_TERM:
            tl.store(q8lo_ptr + q_at,
                     residual_int8(finite_or(qr, 0.0), (1.0 / scale)[:, None], q8))
        scale = tl.where(n_bad > 0, float("nan"), scale)
        tl.store(q8_ptr + q_at, q8)
        tl.store(q_scale_ptr + prow0 + loc, scale * sm_scale_log2)
        corr = tl.zeros([BLOCK_M], dtype=tl.float32)
        if SMOOTH_K:
            if k_len > 0:
                k_mean = tl.load(k_mean_ptr + (b * Hkv + h // group) * DP + offs_d)
                # summed as integers (``_row_sum_order_free``), each product rounded on its
                # own: the fused rotary embedding's register layout then leaves the LSE as is
                corr = _row_sum_order_free(mul_rn(q, k_mean[None, :], SOFT_FP8_CAST, HIP),
                                           BLOCK_M, DP) * sm_scale
        tl.store(q_lse_corr_ptr + prow0 + loc, corr)


# ---------------------------------------------------------------------------------------------
# Per-tensor scales (the "per-tensor-fp8" baseline recipe only)
# ---------------------------------------------------------------------------------------------


@triton.jit
def _chunk_abs_max(base, s_t, s_d, src, t0, length, D,
                   DP: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr):
    """Largest finite |x| over tokens [t0, t0 + CHUNK) of one head (0 when none)."""
    offs_d = tl.arange(0, DP)
    loc = tl.arange(0, SUB)
    # Element-wise maximum over the chunk, reduced once at the end (as kv_channel_stats).
    acc = tl.zeros([SUB, DP], dtype=tl.float32)
    for i in range(0, CHUNK, SUB):
        # 64-bit scalar base, 32-bit offsets within the tile (as in the other passes).
        tok0 = (src + t0 + i).to(tl.int64)
        m = (t0 + i + loc < length)[:, None] & (offs_d < D)[None, :]
        x = tl.load(base + tok0 * s_t + loc[:, None] * s_t + offs_d[None, :] * s_d, mask=m,
                    other=0.0)
        acc = tl.maximum(acc, tl.abs(finite_or(x.to(tl.float32), 0.0)))
    return tl.max(tl.max(acc, 1), 0)


@triton.jit
def qkv_abs_max_kernel(
    q_ptr, k_ptr, v_ptr, seq_ptr, part_ptr,
    q_sb, q_st, q_sh, q_sd,
    k_sb, k_st, k_sh, k_sd,
    v_sb, v_st, v_sh, v_sd,
    D, n_chunks, group,
    DP: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr,
):
    """Per (chunk of tokens, head, sequence): the largest finite |q|, |k| and |v|.

    Writes ``part[t, b, h, chunk]`` for t = q, k, v, every slot (0 where the chunk is past the
    sequence or ``h`` is no kv head), so the buffer needs no zero fill.
    """
    c = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    H = tl.num_programs(1)
    B = tl.num_programs(2)
    Hkv = H // group
    q_len = tl.load(seq_ptr + b * 8 + 0)
    k_len = tl.load(seq_ptr + b * 8 + 1)
    q_src = tl.load(seq_ptr + b * 8 + 2)
    k_src = tl.load(seq_ptr + b * 8 + 3)
    # Heads past Hkv read nothing (length 0) at an in-bounds head.
    hk = tl.minimum(h, Hkv - 1).to(tl.int64)
    k_len = tl.where(h < Hkv, k_len, 0)
    t0 = c * CHUNK
    b64 = b.to(tl.int64)
    qa = _chunk_abs_max(q_ptr + b64 * q_sb + h.to(tl.int64) * q_sh, q_st, q_sd, q_src, t0,
                        q_len, D, DP, CHUNK, SUB)
    ka = _chunk_abs_max(k_ptr + b64 * k_sb + hk * k_sh, k_st, k_sd, k_src, t0, k_len, D,
                        DP, CHUNK, SUB)
    va = _chunk_abs_max(v_ptr + b64 * v_sb + hk * v_sh, v_st, v_sd, k_src, t0, k_len, D,
                        DP, CHUNK, SUB)
    n_part = B * H * n_chunks
    idx = (b * H + h) * n_chunks + c
    tl.store(part_ptr + idx, qa)
    tl.store(part_ptr + n_part + idx, ka)
    tl.store(part_ptr + 2 * n_part + idx, va)


@triton.jit
def abs_max_finalize_kernel(part_ptr, amax_ptr, n_part, BLOCK: tl.constexpr):
    """Program t (0: q, 1: k, 2: v): max over its partials, floored, into ``amax[t]``."""
    t = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, n_part, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        acc = tl.maximum(acc, tl.load(part_ptr + t * n_part + offs, mask=offs < n_part,
                                      other=0.0))
    tl.store(amax_ptr + t, tl.maximum(tl.max(acc, 0), AMAX_FLOOR))
