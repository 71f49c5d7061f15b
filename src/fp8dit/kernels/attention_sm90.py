"""Hopper (sm_90) FP8 attention forward in Gluon: the persistent kernel with asynchronous WGMMA.

Same plan, work list, workspace and outputs as :mod:`fp8dit.kernels.attention` (read its
docstring for the math), for the recipes with int8 QK and fp8 PV at padded head dims 64 and
128. Why a second kernel: Triton's pipeliner keeps a WGMMA in flight only when its accumulator
is fp32 and only a later dot reads it, so there both the int32 QK dot and the PV dot end in
``wgmma.wait_group 0`` and the tensor cores idle through the softmax (benchmarks/NOTES.md,
session 2). Here the loop is written out (FlashAttention-3's intra-warpgroup overlap):

    wait K/V(j)                        TMA ring of STAGES slots, one mbarrier per slot
    S_j   = QK(j)      async           int32 accumulator preset to the int->float magic bits
    O    += P_{j-1} V_{j-1}   async    P from registers (fp8 A operand)
    wait until only the PV dot is in flight
    softmax(S_j) -> P_j, alpha_j       runs while the tensor cores do PV(j-1)
    wait PV(j-1); refill slot j-1 with block j-1+STAGES; O *= alpha_j

PV goes straight into O through the tensor core's accumulator, which is narrower than fp32: the
output drifts at 200k tokens (rel-L1 0.0495 vs 0.0390; a per-block fp32 sum needs 64 more
registers and spilled). ``attention_sm90_ws`` keeps the per-block sum.

P needs no register shuffle into the A-operand layout: the quantizer stores V with the kv index
permuted inside each group of 16 (``kv_perm16``), so the accumulator registers of S already hold
P in the order the PV dot's A operand reads them (``convert_layout(..., assert_trivial=True)``).

Gluon's API is experimental and moves between Triton releases; :mod:`fp8dit.attend` uses this
kernel only when asked (``FP8DIT_KERNEL=gluon``, ``use_gluon_sm90``) and keeps the Triton kernel
everywhere else (the CPU interpreter cannot run Gluon).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# TMA load into shared memory: ``async_load`` in newer Gluon (triton 3.9, which removed the old
# name), ``async_copy_global_to_shared`` in triton 3.6 (the H200 image's).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
# CTA-wide barrier: ``barrier`` in triton 3.9, ``thread_barrier`` in 3.6.
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

# Same constants as the Triton kernel (see its module for why).
P_SHIFT = gl.constexpr(8.0)
I2F_MAGIC_BITS = gl.constexpr(0x4B400000)
I2F_MAGIC = gl.constexpr(12582912.0)
V_GRID_PHI = gl.constexpr(0.6180339887498949)
LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _v_grid_log2(blk):
    # Bit-identical to common.v_block_log2_scale (same fp32 operations).
    r = blk.to(gl.float32) * V_GRID_PHI
    return r - gl.floor(r)


@gluon.jit
def _issue_kv(desc_k, desc_v, k_bufs, v_bufs, bars, idx, k_row, v_row, v_col,
              pred, STAGES: gl.constexpr):
    """TMA loads of one kv block's K and V^T tiles into ring slot ``idx % STAGES``."""
    slot = idx % STAGES
    bar = bars.index(slot)
    mbarrier.expect(bar, desc_k.block_type.nbytes + desc_v.block_type.nbytes, pred=pred)
    _tma_load(desc_k, [k_row, 0], bar, k_bufs.index(slot), pred=pred)
    _tma_load(desc_v, [v_row, v_col], bar, v_bufs.index(slot), pred=pred)


@gluon.jit
def _row_max(x, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, row_layout: gl.constexpr):
    # Column groups of 16 first: within a thread the max runs as 4 independent chains, not one
    # 32-deep chain (this loop has one warpgroup per scheduler slot to hide latency with).
    x3 = gl.reshape(x, [BLOCK_M, BLOCK_N // 16, 16])
    r = gl.max(gl.max(x3, axis=1), axis=1)
    return gl.convert_layout(r, row_layout, assert_trivial=True)


@gluon.jit
def _row_sum(x, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, row_layout: gl.constexpr):
    x3 = gl.reshape(x, [BLOCK_M, BLOCK_N // 16, 16])
    r = gl.sum(gl.sum(x3, axis=1), axis=1)
    return gl.convert_layout(r, row_layout, assert_trivial=True)


@gluon.jit
def _scores(s_i, col0, masked, k_len, rows, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
            s_layout: gl.constexpr):
    """The int32 QK accumulator (preset to I2F_MAGIC_BITS) as the floats MAGIC + s; with
    ``masked``, columns from ``col0`` past ``k_len`` (and above the diagonal) at -inf."""
    s = s_i.to(gl.float32, bitcast=True)
    if masked:
        cols = col0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        if IS_CAUSAL:  # cols < k_len and cols <= rows in one compare per score: the two
            # compares spilled 5 per main-loop step and 32 in the tail of the causal
            # warp-specialized kernel (sm_90, triton 3.6), none with this form
            valid = gl.expand_dims(cols, 0) < gl.expand_dims(gl.minimum(rows + 1, k_len), 1)
        else:
            valid = gl.expand_dims(cols < k_len, 0)
        s = gl.where(valid, s, float("-inf"))
    return s


@gluon.jit
def _to_a_operand(p, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, p_layout: gl.constexpr):
    """S-accumulator-layout P as the PV dot's A operand: a relabeling. Accumulator column
    16a + 8h + 2c + e sits in the register the A operand reads as k = 16a + 4c + 2h + e; V^T
    was stored in that order (kv_perm16)."""
    p = gl.reshape(p, [BLOCK_M, BLOCK_N // 16, 2, 4, 2])
    p = gl.reshape(gl.permute(p, [0, 1, 3, 2, 4]), [BLOCK_M, BLOCK_N])
    return gl.convert_layout(p, p_layout, assert_trivial=True)


@gluon.jit
def _softmax_block(s_i, m_i, l_i, c, kb, masked, k_len, rows,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
                   s_layout: gl.constexpr, p_layout: gl.constexpr,
                   ABLATE_EXP: gl.constexpr = 0, ABLATE_MISC: gl.constexpr = 0):
    """Scores of kv block ``kb`` -> (fp32 P in the PV dot's A layout, m, l, alpha).

    ``ABLATE_EXP`` (benchmarks only, wrong results): 1 replaces P's exp2 by an FFMA (the
    kernel without its MUFU work); 2 (and 3) skip the softmax (P = S: only the dots and the
    pipeline). ``ABLATE_MISC & 4``: no row sum (l stays as it was).

    ``s_i`` holds the int32 dot plus I2F_MAGIC_BITS, i.e. the float MAGIC + s exactly.
    """
    if ABLATE_EXP >= 2:
        alpha = gl.full_like(m_i, 1.0)
        p = _to_a_operand(s_i.to(gl.float32, bitcast=True), BLOCK_M, BLOCK_N, p_layout)
        return p, m_i, l_i, alpha
    s = _scores(s_i, kb * BLOCK_N, masked, k_len, rows, BLOCK_N, IS_CAUSAL, s_layout)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    m_new = gl.maximum(m_i, (_row_max(s, BLOCK_M, BLOCK_N, row_layout) - I2F_MAGIC) * c)
    m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_ref)
    x = s * gl.expand_dims(c, 1) - gl.expand_dims(m_ref - P_SHIFT + I2F_MAGIC * c, 1)
    if ABLATE_EXP == 1:
        p = x * 0.015625 + 1.0
    else:
        p = gl.exp2(x)
    if (ABLATE_MISC & 4) == 0:
        l_i = l_i * alpha + _row_sum(p, BLOCK_M, BLOCK_N, row_layout)
    return _to_a_operand(p, BLOCK_M, BLOCK_N, p_layout), m_new, l_i, alpha


@gluon.jit
def _p_to_fp8(p):
    """fp32 P (A-operand layout) -> fp8: four consecutive k of a thread make one A register.

    Two cvt and a byte merge per register; the generic fp32->fp8 path masked and re-permuted
    every byte. Called right before the PV dot: an fp8 tensor carried across loop iterations
    is split into single bytes at the loop edge and reassembled (~6 extra instructions per 4).
    """
    return gl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\n"
        "mov.b32 $0, {lo, hi}; }",
        "=r,r,r,r,r", [p], dtype=gl.float8e4nv, is_pure=True, pack=4)


@gluon.jit
def _hold(p, p8, zero_i):
    """``p`` unchanged (p | (p8 & 0), one LOP3 per four values) but read after ``p8``'s
    wgmma: keeps ptxas from reusing P's fp8 registers, still read by the in-flight PV dot,
    for the softmax temporaries. When it did, it placed the PV wait before the softmax and the
    overlap was gone (sm_90 SASS, triton 3.6). ``zero_i`` is a zero ptxas cannot fold."""
    return gl.inline_asm_elementwise(
        "lop3.b32 $0, $4, $9, $5, 0xEA;\n"
        "mov.b32 $1, $6;\nmov.b32 $2, $7;\nmov.b32 $3, $8;",
        "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r", [p8, p, zero_i], dtype=gl.float32, is_pure=True,
        pack=4)


@gluon.jit
def _kv_step(kb, idx, kv_hi, p, m_i, l_i, acc, q_scale, ks_base,
             q_smem, k_bufs, v_bufs, bars, desc_k, desc_v, k_row0, v_row, k_pad, k_len,
             rows, zero_i, s_init, MASKED: gl.constexpr,
             BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
             STAGES: gl.constexpr,
             s_layout: gl.constexpr, p_layout: gl.constexpr, row_o: gl.constexpr):
    """One kv block: QK(kb) and PV(kb-1) in flight together, softmax(kb) under PV(kb-1).

    ``MASKED`` is a compile-time choice (two loops), not a branch: with the mask's branch
    inside the loop ptxas put the PV wait at the branch's join, before the softmax.
    """
    slot = idx % STAGES
    prev = (idx - 1) % STAGES
    mbarrier.wait(bars.index(slot), (idx // STAGES) & 1)
    s_tok = warpgroup_mma(q_smem, k_bufs.index(slot).permute((1, 0)), s_init, is_async=True)
    p8 = _p_to_fp8(p)
    acc_tok = warpgroup_mma(p8, v_bufs.index(prev).permute((1, 0)), acc, is_async=True)
    c = q_scale * gl.load(ks_base + kb)
    s_i = warpgroup_mma_wait(1, deps=[s_tok])
    p, m_i, l_i, alpha = _softmax_block(
        s_i, m_i, l_i, c, kb, MASKED, k_len, rows,
        BLOCK_M, BLOCK_N, IS_CAUSAL, s_layout, p_layout)
    p = _hold(p, p8, zero_i)
    # From block kb-1's frame (max and V grid) to block kb's.
    step = gl.convert_layout(alpha, row_o) * gl.exp2(_v_grid_log2(kb - 1) - _v_grid_log2(kb))
    acc = warpgroup_mma_wait(0, deps=[acc_tok])
    acc = acc * gl.expand_dims(step, 1)
    # Every warp of the warpgroup is past its wait: slot `prev` is free for the TMA refill.
    _cta_barrier()
    nxt = kb - 1 + STAGES
    col0 = nxt * BLOCK_N
    _issue_kv(desc_k, desc_v, k_bufs, v_bufs, bars, idx - 1 + STAGES, k_row0 + col0,
              v_row, k_pad + col0, nxt < kv_hi, STAGES)
    return p, m_i, l_i, acc


@gluon.jit
def _load_item(work_ptr, seq_ptr, w, group):
    """Work item ``w`` (columns W_* of ``kernels.attention``) and its sequence's table row:
    (b, h, q tile, kv_lo, kv_hi, partial slot, kv head, q_len, k_len, q_src, q_pad, k_pad,
    first k block)."""
    item = work_ptr + w * 6
    b = gl.load(item + 0)
    h = gl.load(item + 1)
    seq = seq_ptr + b * 8
    return (b, h, gl.load(item + 2), gl.load(item + 3), gl.load(item + 4), gl.load(item + 5),
            h // group, gl.load(seq + 0), gl.load(seq + 1), gl.load(seq + 2), gl.load(seq + 4),
            gl.load(seq + 5), gl.load(seq + 6))


@gluon.jit
def _write_rows(acc, m_i, l_i, kv_hi, b, h, hk, row0, q_row, q_len, q_src, slot_out, part_row0,
                v_scale_ptr, v_mean_ptr, q_lse_corr_ptr, out_ptr, o_sb, o_st, o_sh, o_sd,
                lse_ptr, l_sb, l_sh, l_st, part_o_ptr, part_lse_ptr, D, Hkv,
                offs_m, offs_mo, offs_d, DP: gl.constexpr, row_o: gl.constexpr):
    """Epilogue of one tile of query rows: out of the V grid frame, V scale and mean, the LSE;
    into the output (whole kv range) or partial rows ``part_row0`` onwards (split-KV).
    ``offs_m``/``offs_mo``: row indices in the S and O row layouts; ``offs_d``: columns."""
    vbase = (b * Hkv + hk) * DP
    v_scale = gl.load(v_scale_ptr + vbase + offs_d)
    v_mean = gl.load(v_mean_ptr + vbase + offs_d)
    empty = l_i == 0.0
    inv_l = gl.where(empty, 0.0, 1.0 / l_i) * gl.exp2(_v_grid_log2(kv_hi - 1))
    o = acc * gl.expand_dims(gl.convert_layout(inv_l, row_o), 1) \
        * gl.expand_dims(v_scale, 0) + gl.expand_dims(v_mean, 0)
    o = gl.where(gl.expand_dims(gl.convert_layout(empty, row_o), 1), 0.0, o)
    # a split-KV piece's LSE without the K-smoothing shift: the merge adds it once
    # (kernels.attention)
    lse = (m_i + gl.log2(l_i) - P_SHIFT) * LN2
    lse = gl.where(empty, float("-inf"), lse)
    if slot_out < 0:
        lse = lse + gl.load(q_lse_corr_ptr + q_row + offs_m)
        tok0 = (q_src + row0).to(gl.int64)
        hq64 = h.to(gl.int64)
        optr = (out_ptr + b.to(gl.int64) * o_sb + hq64 * o_sh + tok0 * o_st
                + gl.expand_dims(offs_mo, 1) * o_st + gl.expand_dims(offs_d, 0) * o_sd)
        omask = gl.expand_dims((row0 + offs_mo) < q_len, 1) & gl.expand_dims(offs_d < D, 0)
        gl.store(optr, o.to(out_ptr.dtype.element_ty), mask=omask)
        lptr = lse_ptr + b.to(gl.int64) * l_sb + hq64 * l_sh + tok0 * l_st
        gl.store(lptr + offs_m * l_st, lse, mask=(row0 + offs_m) < q_len)
    else:
        gl.store(part_o_ptr + gl.expand_dims(part_row0 + offs_mo, 1) * DP
                 + gl.expand_dims(offs_d, 0), o)
        gl.store(part_lse_ptr + part_row0 + offs_m, lse)


@gluon.jit
def attention_fwd_sm90_kernel(
    desc_q, q_scale_ptr, q_lse_corr_ptr,
    desc_k, k_scale_ptr, desc_v, v_scale_ptr, v_mean_ptr,
    seq_ptr, work_ptr, work_indptr_ptr,
    out_ptr, o_sb, o_st, o_sh, o_sd,
    lse_ptr, l_sb, l_sh, l_st,
    part_o_ptr, part_lse_ptr,
    D, Tq_pad, Tk_pad, n_kblocks, group, Hkv,
    DP: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    IS_CAUSAL: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr,
):
    gl.static_assert(num_warps == 4, "one warpgroup per program")
    gl.static_assert(BLOCK_M == 64, "m64 WGMMA, one warpgroup")
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DP, 32])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)

    q_smem = gl.allocate_shared_memory(desc_q.dtype, desc_q.block_type.shape, desc_q.layout)
    k_bufs = gl.allocate_shared_memory(desc_k.dtype, [STAGES, BLOCK_N, DP], desc_k.layout)
    v_bufs = gl.allocate_shared_memory(desc_v.dtype, [STAGES, DP, BLOCK_N], desc_v.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    mbarrier.init(q_bar, count=1)

    # The int32 QK accumulator starts at the magic bits: S's registers then read as floats.
    s_init = gl.full([BLOCK_M, BLOCK_N], I2F_MAGIC_BITS, gl.int32, s_layout)
    offs_m = gl.arange(0, BLOCK_M, layout=row_s)
    offs_mo = gl.arange(0, BLOCK_M, layout=row_o)
    offs_d = gl.arange(0, DP, layout=col_o)

    pid = gl.program_id(0)
    w_begin = gl.load(work_indptr_ptr + pid)
    w_end = gl.load(work_indptr_ptr + pid + 1)
    base = 0  # kv blocks consumed so far by this program: ring slot and barrier phase
    q_phase = 0
    for w in range(w_begin, w_end):
        (b, h, qt, kv_lo, kv_hi, slot_out, hk, q_len, k_len, q_src, q_pad, k_pad,
         k_blk) = _load_item(work_ptr, seq_ptr, w, group)

        row0 = qt * BLOCK_M
        q_row = h * Tq_pad + q_pad + row0
        k_row0 = hk * Tk_pad + k_pad
        v_row = hk * DP
        ks_base = k_scale_ptr + hk * n_kblocks + k_blk
        n = kv_hi - kv_lo
        hi_fast = k_len // BLOCK_N
        if IS_CAUSAL:
            hi_fast = gl.minimum(hi_fast, (row0 + 1) // BLOCK_N)

        mbarrier.expect(q_bar, desc_q.block_type.nbytes)
        _tma_load(desc_q, [q_row, 0], q_bar, q_smem)
        for i in gl.static_range(STAGES):
            col0 = (kv_lo + i) * BLOCK_N
            _issue_kv(desc_k, desc_v, k_bufs, v_bufs, bars, base + i, k_row0 + col0, v_row,
                      k_pad + col0, i < n, STAGES)
        q_scale = gl.load(q_scale_ptr + q_row + offs_m)
        rows = row0 + offs_m
        mbarrier.wait(q_bar, q_phase)
        q_phase ^= 1

        # Block kv_lo: its QK alone (nothing to overlap with yet).
        mbarrier.wait(bars.index(base % STAGES), (base // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_bufs.index(base % STAGES).permute((1, 0)), s_init,
                              is_async=True)
        s_i = warpgroup_mma_wait(0, deps=[s_tok])
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
        c = q_scale * gl.load(ks_base + kv_lo)
        p, m_i, l_i, alpha = _softmax_block(
            s_i, m_i, l_i, c, kv_lo, kv_lo >= hi_fast, k_len, rows,
            BLOCK_M, BLOCK_N, IS_CAUSAL, s_layout, p_layout)
        acc = gl.zeros([BLOCK_M, DP], gl.float32, o_layout)
        # A zero the compiler cannot see through (k_len > 0 for every work item).
        zero_i = gl.full([BLOCK_M, BLOCK_N], 0, gl.int32, p_layout) + (k_len < 0).to(gl.int32)

        # Unmasked blocks first, then the masked tail (the last partial block, the causal
        # diagonal): no branch inside the main loop (see _kv_step).
        hi_main = gl.maximum(gl.minimum(hi_fast, kv_hi), kv_lo + 1)
        for kb in range(kv_lo + 1, hi_main):
            p, m_i, l_i, acc = _kv_step(
                kb, kb - kv_lo + base, kv_hi, p, m_i, l_i, acc, q_scale, ks_base,
                q_smem, k_bufs, v_bufs, bars, desc_k, desc_v, k_row0, v_row, k_pad, k_len,
                rows, zero_i, s_init, False,
                BLOCK_M, BLOCK_N, IS_CAUSAL, STAGES,
                s_layout, p_layout, row_o)
        for kb in range(hi_main, kv_hi):
            p, m_i, l_i, acc = _kv_step(
                kb, kb - kv_lo + base, kv_hi, p, m_i, l_i, acc, q_scale, ks_base,
                q_smem, k_bufs, v_bufs, bars, desc_k, desc_v, k_row0, v_row, k_pad, k_len,
                rows, zero_i, s_init, True,
                BLOCK_M, BLOCK_N, IS_CAUSAL, STAGES,
                s_layout, p_layout, row_o)

        last = base + n - 1
        acc = warpgroup_mma(_p_to_fp8(p), v_bufs.index(last % STAGES).permute((1, 0)), acc)
        base += n
        # Slots are reused by the next item's prologue only after this thread barrier.
        _cta_barrier()
        _write_rows(acc, m_i, l_i, kv_hi, b, h, hk, row0, q_row, q_len, q_src, slot_out,
                    slot_out.to(gl.int64) * BLOCK_M,
                    v_scale_ptr, v_mean_ptr, q_lse_corr_ptr, out_ptr, o_sb, o_st, o_sh, o_sd,
                    lse_ptr, l_sb, l_sh, l_st, part_o_ptr, part_lse_ptr, D, Hkv,
                    offs_m, offs_mo, offs_d, DP, row_o)

    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))
    mbarrier.invalidate(q_bar)
