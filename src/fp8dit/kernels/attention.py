"""Persistent FP8 attention forward: each program walks its slice of the plan's work list.

A work item is one query tile of one head of one sequence against a contiguous range of kv
blocks (fields ``W_*``). An item that covers the whole kv range writes the final output (in the
user's dtype and layout, head-dim padding dropped) and the final LSE; a split-KV piece writes an
fp32 partial output and its LSE to the plan-sized partial buffers for the reduce kernel.

Q, K and V tiles arrive through tensor descriptors (TMA on Hopper): no per-element address
registers, asynchronous copies that the compiler pipelines over ``num_stages`` buffers. (On AMD
GPUs Triton lowers the host descriptors to ordinary global loads.)

``PTR_LOADS`` (GPUs without TMA, sm_89): the tiles are read through pointers instead
(``q_ptr``, ``k_ptr``, ``v_ptr`` and the two-term residuals' ``qlo_ptr``, ``klo_ptr``: the
same workspace tensors the descriptors view). Below sm_90 Triton lowers a descriptor load to
per-element loads whose alignment it cannot see: with triton 3.9 K and V arrived one byte at a
time (256 ``LDG.E.U8`` per thread per kv step at D=128) and spilled ~400 registers a step.
Rows of DP bytes and V^T's rows of ``Tk_pad`` (a multiple of the kv block) keep 16-byte vector
loads that Triton pipelines with ``cp.async``. The default (descriptors) is the sm_90 code,
unchanged.

Inner loop per kv block b (scores kept in log2 units, scales folded):
    s = dot(q8, k8^T)                        int8 x int8 -> int32 (or fp8 x fp8 -> fp32)
    t = s * (q_scale[row] * k_scale[b])      q_scale already holds softmax_scale * log2(e)
    p = exp2(t - m + P_SHIFT)                P in [0, 2^P_SHIFT]: fp8's range, not just [0, 1]
    l = l * alpha + rowsum(p)
    acc = acc * alpha * 2^(g_{b-1} - g_b) + dot(fp8(p), v8)     two-level: fresh fp32 per block
where 2^g_b in [1, 2) is block b's V grid factor (``common.v_block_log2_scale``): V of block b
was quantized divided by it, so acc is kept in block b's frame (true acc = acc * 2^g_b) and the
change of frame rides on the per-row rescale: no per-element cost.

``PV_BF16`` (recipe ``int8qk-bf16pv``): P is rounded to bf16 instead of fp8 and V arrives in
bf16 (same transposed layout, no grid factor), so the PV dot is bf16 x bf16 -> fp32.

``QK_TWO_TERM`` (recipe ``int8x2qk-fp8pv``): Q and K also arrive as their int8 rounding
residuals (``lo``, on a grid LO_SCALE times finer), and
    s = LO_SCALE * dot(q8, k8^T) + dot(q8, klo^T) + dot(qlo, k8^T)     int32, exact
scores the scale ``c / LO_SCALE`` turns into finer ones (lo * lo is left out: ~1 unit of the
int8 grid, the product of two rounding residuals, which the recipe's Hadamard rotation keeps
small).
"""

import triton
import triton.language as tl

from .common import LO_SCALE, LO_SCALE_INT, cast_for_store, p_to_fp8, to_bf16, v_block_log2_scale

# Work-item fields (int32 columns of the plan's work table).
W_SEQ = 0
W_HEAD = 1
W_QTILE = 2
W_KV_LO = 3  # first kv block (inclusive)
W_KV_HI = 4  # last kv block (exclusive)
W_SLOT = 5  # partial-output slot, or -1 when the item writes the final output
W_FIELDS = 6

# p = exp2(t - m + P_SHIFT) is at most 2^P_SHIFT = 256 < 448 (e4m3's max): small probabilities
# keep more mantissa in fp8 than they would in [0, 1]. The kernel takes its fp8 format's as the
# constexpr P_SHIFT (this one by default; 7 in fnuz, whose scale limit is 224: fp8dit.device).
P_SHIFT = tl.constexpr(8.0)

# int32 -> fp32 without the conversion unit (16/clk/SM on Hopper, as slow as exp2): for
# |x| < 2^22, the bits of x + 0x4B400000 are the float 1.5 * 2^23 + x exactly.
I2F_MAGIC_BITS = tl.constexpr(0x4B400000)
I2F_MAGIC = tl.constexpr(12582912.0)


@triton.jit
def _row_max(x, BLOCK_N: tl.constexpr):
    """Row max of a [BLOCK_M, BLOCK_N] tile as short independent chains.

    A plain ``tl.max`` compiled to one serial FMNMX chain per row (32 deep per thread at 64x128
    with 4 warps), which the 1-2 warps per scheduler of this kernel cannot hide. The reshape
    keeps the accumulator layout (no data movement; checked in the sm_90 SASS).
    """
    x4 = tl.reshape(x, [x.shape[0], 4, BLOCK_N // 32, 8])
    return tl.max(tl.max(tl.max(x4, 2), 1), 1)


@triton.jit
def _row_sum(x, BLOCK_N: tl.constexpr):
    x4 = tl.reshape(x, [x.shape[0], 4, BLOCK_N // 32, 8])
    return tl.sum(tl.sum(tl.sum(x4, 2), 1), 1)


@triton.jit
def _load_rows(ptr, row, offs_r, COLS: tl.constexpr):
    """Rows ``row + offs_r`` of a row-major matrix ``COLS`` wide (``PTR_LOADS``: Q and K). The
    tiles lie inside the plan's padded buffers, so no mask. The row offset is 64-bit, once per
    tile: heads x padded tokens x DP can pass 2^31."""
    base = ptr + row.to(tl.int64) * COLS
    return tl.load(base + offs_r[:, None] * COLS + tl.arange(0, COLS)[None, :])


@triton.jit
def _load_vt(ptr, row, col, ROWS: tl.constexpr, COLS: tl.constexpr, stride):
    """The [ROWS, COLS] tile at (``row``, ``col``) of V^T, ``stride`` (the padded key count)
    wide (``PTR_LOADS``). Both are multiples of the kv block, so of 16. The launcher tells
    Triton so of ``stride`` (an argument divisible by 16); ``col`` is written as a multiple of
    16 (a no-op on its value) because a ``tl.multiple_of`` hint on it did not survive to the
    loads: with it V still arrived one byte at a time (triton 3.9, sm_89)."""
    base = ptr + row.to(tl.int64) * stride + (col // 16) * 16
    return tl.load(base + tl.arange(0, ROWS)[:, None] * stride + tl.arange(0, COLS)[None, :])


@triton.jit
def _attn_block(
    acc, l_i, m_i, q, q_scale, desc_k, desc_v, k_row, v_row, v_col, k_scale,
    kb, kv_col0, rows, k_len, offs_n,
    MASK: tl.constexpr, IS_CAUSAL: tl.constexpr, QK_INT8: tl.constexpr,
    SOFT_FP8_CAST: tl.constexpr, PV_BF16: tl.constexpr,
    qlo=None, desc_klo=None, QK_TWO_TERM: tl.constexpr = False,
    P_SHIFT: tl.constexpr = 8.0, FP8_FNUZ: tl.constexpr = False,
    k_ptr=None, v_ptr=None, klo_ptr=None, Tk_pad=0, PTR_LOADS: tl.constexpr = False,
):
    BLOCK_N: tl.constexpr = offs_n.shape[0]
    if PTR_LOADS:
        k = _load_rows(k_ptr, k_row, offs_n, q.shape[1])
    else:
        k = desc_k.load([k_row, 0])  # [BLOCK_N, DP] int8 or fp8
    c = q_scale * k_scale  # [BLOCK_M], > 0
    if QK_TWO_TERM:
        # |LO_SCALE * hi.hi| <= 254 * DP * 127^2 < 2^31 for DP <= 256; the float conversion
        # keeps fp32's relative precision (the magic offset below would not: it is ~1e7).
        if PTR_LOADS:
            klo = _load_rows(klo_ptr, k_row, offs_n, q.shape[1])
        else:
            klo = desc_klo.load([k_row, 0])
        s_x = tl.dot(q, klo.T, out_dtype=tl.int32)
        s_x = tl.dot(qlo, k.T, s_x, out_dtype=tl.int32)
        s_i = tl.dot(q, k.T, out_dtype=tl.int32) * LO_SCALE_INT + s_x
        s = s_i.to(tl.float32)
        c = c * (1.0 / LO_SCALE)
        offset = 0.0
    elif QK_INT8:
        # Scores stay offset by I2F_MAGIC: s_f = s + MAGIC exactly. max() commutes with the
        # offset and exp2's per-row bias absorbs it, so there is no per-element subtraction.
        # MAGIC * c rounds by at most 0.75 * c: under one unit of the integer dot.
        s_i = tl.dot(q, k.T, out_dtype=tl.int32)
        s = (s_i + I2F_MAGIC_BITS).to(tl.float32, bitcast=True)
        offset = I2F_MAGIC
    else:
        s = tl.dot(q, k.T)  # [BLOCK_M, BLOCK_N] fp32
        offset = 0.0
    if MASK:
        cols = kv_col0 + offs_n
        valid = (cols < k_len)[None, :]
        if IS_CAUSAL:
            valid = valid & (cols[None, :] <= rows[:, None])
        s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m_i, (_row_max(s, BLOCK_N) - offset) * c)
    # A row with no valid column yet (split piece above the causal diagonal) keeps m = -inf;
    # use 0 as its reference so exp2 sees -inf - 0 instead of -inf - -inf.
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_ref)
    p = tl.math.exp2(s * c[:, None] - (m_ref - P_SHIFT + offset * c)[:, None])
    l_i = l_i * alpha + _row_sum(p, BLOCK_N)
    if PV_BF16:
        acc_alpha = alpha
        p16 = to_bf16(p, SOFT_FP8_CAST)
        if PTR_LOADS:
            vt = _load_vt(v_ptr, v_row, v_col, q.shape[1], BLOCK_N, Tk_pad)
        else:
            vt = desc_v.load([v_row, v_col])  # [DP, BLOCK_N] bf16
        if SOFT_FP8_CAST:
            # Triton's interpreter multiplies bf16 operands as their raw uint16 bits; in fp32
            # the products of bf16 values are exact, so this is the same dot.
            pv = tl.dot(p16.to(tl.float32), vt.to(tl.float32).T)
        else:
            pv = tl.dot(p16, vt.T)
    else:
        # From block kb-1's V grid frame to block kb's (a scalar per block).
        acc_alpha = alpha * tl.math.exp2(v_block_log2_scale(kb - 1) - v_block_log2_scale(kb))
        p8 = p_to_fp8(p, SOFT_FP8_CAST, FP8_FNUZ)  # p <= 2^P_SHIFT: no clamp needed
        if PTR_LOADS:
            vt = _load_vt(v_ptr, v_row, v_col, q.shape[1], BLOCK_N, Tk_pad)
        else:
            vt = desc_v.load([v_row, v_col])  # [DP, BLOCK_N] fp8: V transposed, K-major for the dot
        pv = tl.dot(p8, vt.T)
    acc = acc * acc_alpha[:, None] + pv
    return acc, l_i, m_new


@triton.jit
def attention_fwd_persistent_kernel(
    desc_q, q_scale_ptr, q_lse_corr_ptr,
    desc_k, k_scale_ptr, desc_v, v_scale_ptr, v_mean_ptr,
    seq_ptr, work_ptr, work_indptr_ptr,
    out_ptr, o_sb, o_st, o_sh, o_sd,
    lse_ptr, l_sb, l_sh, l_st,
    part_o_ptr, part_lse_ptr,
    D, Tq_pad, Tk_pad, n_kblocks, group, Hkv,
    DP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, QK_INT8: tl.constexpr, SOFT_FP8_CAST: tl.constexpr,
    PV_BF16: tl.constexpr, desc_qlo=None, desc_klo=None, QK_TWO_TERM: tl.constexpr = False,
    P_SHIFT: tl.constexpr = 8.0, FP8_FNUZ: tl.constexpr = False,
    q_ptr=None, k_ptr=None, v_ptr=None, qlo_ptr=None, klo_ptr=None,
    PTR_LOADS: tl.constexpr = False,
):
    pid = tl.program_id(0)
    w_begin = tl.load(work_indptr_ptr + pid)
    w_end = tl.load(work_indptr_ptr + pid + 1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, DP)
    for w in range(w_begin, w_end):
        item = work_ptr + w * 6
        b = tl.load(item + 0)
        h = tl.load(item + 1)
        qt = tl.load(item + 2)
        kv_lo = tl.load(item + 3)
        kv_hi = tl.load(item + 4)
        slot = tl.load(item + 5)
        hk = h // group
        q_len = tl.load(seq_ptr + b * 8 + 0)
        k_len = tl.load(seq_ptr + b * 8 + 1)
        q_src = tl.load(seq_ptr + b * 8 + 2)
        q_pad = tl.load(seq_ptr + b * 8 + 4)
        k_pad = tl.load(seq_ptr + b * 8 + 5)
        k_blk = tl.load(seq_ptr + b * 8 + 6)

        row0 = qt * BLOCK_M
        rows = row0 + offs_m
        q_row = h * Tq_pad + q_pad + row0  # row of the [H * Tq_pad, DP] q view
        if PTR_LOADS:
            q = _load_rows(q_ptr, q_row, offs_m, DP)
        else:
            q = desc_q.load([q_row, 0])
        if QK_TWO_TERM and PTR_LOADS:
            qlo = _load_rows(qlo_ptr, q_row, offs_m, DP)
        elif QK_TWO_TERM:
            qlo = desc_qlo.load([q_row, 0])
        else:
            qlo = q  # unused
        q_scale = tl.load(q_scale_ptr + q_row + offs_m)
        k_row0 = hk * Tk_pad + k_pad  # row of the [Hkv * Tk_pad, DP] k view
        v_row = hk * DP  # row of the [Hkv * DP, Tk_pad] v^T view
        ks_base = k_scale_ptr + hk * n_kblocks + k_blk

        # Blocks before `hi_fast` need no mask: inside the sequence and, when causal, entirely
        # at or below the diagonal for every row of the tile.
        hi_fast = k_len // BLOCK_N
        if IS_CAUSAL:
            hi_fast = tl.minimum(hi_fast, (row0 + 1) // BLOCK_N)
        hi_fast = tl.maximum(tl.minimum(hi_fast, kv_hi), kv_lo)

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, DP], dtype=tl.float32)
        for kb in range(kv_lo, hi_fast):
            col0 = kb * BLOCK_N
            acc, l_i, m_i = _attn_block(
                acc, l_i, m_i, q, q_scale, desc_k, desc_v, k_row0 + col0, v_row,
                k_pad + col0, tl.load(ks_base + kb), kb, col0, rows, k_len, offs_n,
                False, IS_CAUSAL, QK_INT8, SOFT_FP8_CAST, PV_BF16, qlo, desc_klo, QK_TWO_TERM,
                P_SHIFT, FP8_FNUZ, k_ptr, v_ptr, klo_ptr, Tk_pad, PTR_LOADS,
            )
        for kb in range(hi_fast, kv_hi):
            col0 = kb * BLOCK_N
            acc, l_i, m_i = _attn_block(
                acc, l_i, m_i, q, q_scale, desc_k, desc_v, k_row0 + col0, v_row,
                k_pad + col0, tl.load(ks_base + kb), kb, col0, rows, k_len, offs_n,
                True, IS_CAUSAL, QK_INT8, SOFT_FP8_CAST, PV_BF16, qlo, desc_klo, QK_TWO_TERM,
                P_SHIFT, FP8_FNUZ, k_ptr, v_ptr, klo_ptr, Tk_pad, PTR_LOADS,
            )

        vbase = (b * Hkv + hk) * DP
        v_scale = tl.load(v_scale_ptr + vbase + offs_d)
        v_mean = tl.load(v_mean_ptr + vbase + offs_d)
        empty = l_i == 0.0
        inv_l = tl.where(empty, 0.0, 1.0 / l_i)
        if not PV_BF16:
            inv_l = inv_l * tl.math.exp2(v_block_log2_scale(kv_hi - 1))  # out of the V frame
        o = acc * inv_l[:, None] * v_scale[None, :] + v_mean[None, :]
        o = tl.where(empty[:, None], 0.0, o)
        # lse in natural log: (m + log2(l) - P_SHIFT) * ln 2, plus the K-smoothing shift; a
        # split-KV piece's without it (the merge adds it once: a shift common to the pieces
        # would only round their weights differently)
        lse = (m_i + tl.math.log2(l_i) - P_SHIFT) * 0.6931471805599453
        lse = tl.where(empty, float("-inf"), lse)
        if slot < 0:
            lse = lse + tl.load(q_lse_corr_ptr + q_row + offs_m)
            rmask = rows < q_len
            tok0 = (q_src + row0).to(tl.int64)
            hq64 = h.to(tl.int64)
            optr = (
                out_ptr + b.to(tl.int64) * o_sb + hq64 * o_sh + tok0 * o_st
                + offs_m[:, None] * o_st + offs_d[None, :] * o_sd
            )
            tl.store(optr, cast_for_store(o, out_ptr, SOFT_FP8_CAST),
                     mask=rmask[:, None] & (offs_d < D)[None, :])
            lptr = lse_ptr + b.to(tl.int64) * l_sb + hq64 * l_sh + tok0 * l_st
            tl.store(lptr + offs_m * l_st, lse, mask=rmask)
        else:
            pbase = slot.to(tl.int64) * BLOCK_M
            tl.store(part_o_ptr + (pbase + offs_m)[:, None] * DP + offs_d[None, :], o)
            tl.store(part_lse_ptr + pbase + offs_m, lse)
