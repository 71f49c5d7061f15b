"""Hopper FP8 attention, warp-specialized (Gluon): one TMA warp, two consumer warpgroups.

Same plan, work list, workspace and outputs as :mod:`fp8dit.kernels.attention` (read its
docstring for the math), for the recipes with int8 QK and fp8 PV at padded head dims 64 and
128, on sm_90. Why a second kernel: Triton's pipeliner keeps a WGMMA in flight only when its
accumulator is fp32 and only a later dot reads it, so there both the int32 QK dot and the PV
dot end in ``wgmma.wait_group 0`` and the tensor cores idle through the softmax (H200,
2026-12-02). Here the loop is written out, on FlashAttention-3's structure with 128-row query
tiles: warpgroup 0 takes rows 0-63 of a work item, warpgroup 1 rows 64-127, and both read the
same K/V tiles, loaded once by a producer warp into a ring of ``STAGES`` slots. The two
warpgroups run free of each other: taking turns to issue their dots (FlashAttention-3's
ping-pong) measured 3% slower (H200, 2026-12-02: 728-736 against 751-758 TFLOPS at Wan 720p).

128-key steps (causal calls, ``tuning.gluon_causal_tiles``): inside a warpgroup the softmax of
block j runs under the PV dot of block j-1 (``_consumer_step``), and each block's PV sum is
folded into an fp32 sum (with the sum in the tensor core's narrower accumulator the output
drifted at 200k tokens: rel-L1 0.0495 against 0.0390, H200, 2026-12-02).

256-key steps (the default, ``tuning.gluon_tiles``): a loop step covers 256 keys as two dots
of 128 over two 128-key K and V^T tiles per ring slot, and both PV dots are waited for inside
the step (``_consumer_step_wide``): per key, half the max reductions, rescales, folds, barriers
and ring bookkeeping of the 128-key loop, at the cost of the in-warpgroup PV overlap, which the
240-register budget cannot keep next to 128 registers of S (H200, 2026-12-03: 8-10% faster at
D=128). With ``P_REGS`` those PV dots read P from registers (V^T's kv order matches them): no
P store, fence or warpgroup barrier before them, and ptxas issues the first half's PV under the
second half's exponentials (H200, 2026-12-03: 7-8% faster at D=128, 2% slower at D=64 alone).
With ``ROWSUM_DOT`` (with P in registers) P's row sums come from two N=8 dots of those
registers with a tile of ones instead of 128 FADDs and a row reduction per thread and step
(H200, 2026-12-03: +7% at D=128, +11% at D=64). With ``SPLIT_KV`` (D=64) a slot's K and V
have barriers of their own: the QK dots wait for K alone, and V is waited for after the row
max, before the exponentials; placed after the exponentials, ptxas issued no PV dot under them
and the step lost (H200, 2026-12-04: +10% at CogVideoX; at D=128 it spills 16 registers per
step and every form ran slower).

P needs no register shuffle into the A-operand layout: the quantizer stores V with the kv index
permuted inside each group of 16 (``kv_perm16``), so the accumulator registers of S already hold
P in the order the PV dot's A operand reads them (``convert_layout(..., assert_trivial=True)``).

Barriers (mbarriers in shared memory, one arrival per partition unless noted):
    kv_full[s]   producer -> consumers: K/V of slot s landed (TMA transaction count; with
                 SPLIT_KV: K only)
    kv_empty[s]  consumers -> producer: both warpgroups are done with slot s (count 2)
    v_full[s], v_empty[s]  the same for V, with SPLIT_KV only
    q_full       producer -> consumers: this item's two Q halves landed
    q_empty      consumers -> producer: both warpgroups are done with the item's Q (count 2)

Gluon's API is experimental and moves between Triton releases: ``FP8DIT_KERNEL=auto`` runs this
kernel only on the releases in ``tuning.DEFAULT.gluon_releases`` (the CPU interpreter cannot run
Gluon).
"""

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
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
def _row_max(x, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, row_layout: gl.constexpr):
    # Column groups of 16 first: within a thread the max runs as 4 independent chains, not one
    # 32-deep chain.
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
                   s_layout: gl.constexpr, p_layout: gl.constexpr):
    """Scores of kv block ``kb`` -> (fp32 P in the PV dot's A layout, m, l, alpha).

    ``s_i`` holds the int32 dot plus I2F_MAGIC_BITS, i.e. the float MAGIC + s exactly.
    """
    s = _scores(s_i, kb * BLOCK_N, masked, k_len, rows, BLOCK_N, IS_CAUSAL, s_layout)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    m_new = gl.maximum(m_i, (_row_max(s, BLOCK_M, BLOCK_N, row_layout) - I2F_MAGIC) * c)
    m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_ref)
    x = s * gl.expand_dims(c, 1) - gl.expand_dims(m_ref - P_SHIFT + I2F_MAGIC * c, 1)
    p = gl.exp2(x)
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

# Triton 3.8 only: its sm_90 code for the 256-key steps at D=128 spilled the PV sum and row
# sums carried by the main kv loop on every step (15 LDL/STL; ptxas 12.9 as 3.8 ships it),
# because ptxas spilled those values over their whole range, the masked tail loop's included,
# where it ran out of registers. A copy of the PV sum between the two loops (one PTX mov per
# register) gives the tail loop a range of its own: the main loop then keeps one reload per
# step, as with 3.6. Off elsewhere: 3.6's code is the one measured on the H200 (unchanged),
# and with 3.9 the copy leaves the main loop as it is and adds 8 spills to the tail loop
# (sm_90 SASS, docs/triton_releases.md).
TAIL_OWN_RANGE = gl.constexpr(".".join(triton.__version__.split(".")[:2]) == "3.8")


@gluon.jit
def _producer(desc_q, desc_k, desc_v, q_smem, k_bufs, v_bufs, kv_full, kv_empty, q_full,
              q_empty, v_full, v_empty, seq_ptr, work_ptr, work_indptr_ptr, Tq_pad, Tk_pad,
              group, DP: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, SPLIT_KV: gl.constexpr = False):
    SUB_N: gl.constexpr = desc_k.block_type.shape[0]
    HALVES: gl.constexpr = BLOCK_N // SUB_N
    pid = gl.program_id(0)
    w_begin = gl.load(work_indptr_ptr + pid)
    w_end = gl.load(work_indptr_ptr + pid + 1)
    cnt = 0
    it = 0
    for w in range(w_begin, w_end):
        (b, h, qt, kv_lo, kv_hi, _slot, hk, _q_len, _k_len, _q_src, q_pad, k_pad,
         _k_blk) = _load_item(work_ptr, seq_ptr, w, group)
        q_row = h * Tq_pad + q_pad + qt * (2 * BLOCK_M)
        k_row0 = hk * Tk_pad + k_pad
        v_row = hk * DP
        # Both warpgroups released the previous item's Q (a fresh barrier passes parity 1).
        mbarrier.wait(q_empty, (it & 1) ^ 1)
        mbarrier.expect(q_full, 2 * desc_q.block_type.nbytes)
        _tma_load(desc_q, [q_row, 0], q_full, q_smem.index(0))
        _tma_load(desc_q, [q_row + BLOCK_M, 0], q_full, q_smem.index(1))
        for kb in range(kv_lo, kv_hi):
            slot = cnt % STAGES
            free = ((cnt // STAGES) & 1) ^ 1
            mbarrier.wait(kv_empty.index(slot), free)
            bar = kv_full.index(slot)
            if SPLIT_KV:
                # K first, on its own barrier: the QK dots start when K has landed, and V has
                # until the row max to arrive
                mbarrier.expect(bar, HALVES * desc_k.block_type.nbytes)
                for half in gl.static_range(HALVES):
                    _tma_load(desc_k, [k_row0 + kb * BLOCK_N + half * SUB_N, 0], bar,
                              k_bufs.index(slot * HALVES + half))
                mbarrier.wait(v_empty.index(slot), free)
                vbar = v_full.index(slot)
                mbarrier.expect(vbar, HALVES * desc_v.block_type.nbytes)
                for half in gl.static_range(HALVES):
                    _tma_load(desc_v, [v_row, k_pad + kb * BLOCK_N + half * SUB_N], vbar,
                              v_bufs.index(slot * HALVES + half))
            else:
                mbarrier.expect(bar, HALVES * (desc_k.block_type.nbytes
                                               + desc_v.block_type.nbytes))
                for half in gl.static_range(HALVES):
                    col0 = kb * BLOCK_N + half * SUB_N
                    _tma_load(desc_k, [k_row0 + col0, 0], bar, k_bufs.index(slot * HALVES + half))
                    _tma_load(desc_v, [v_row, k_pad + col0], bar,
                              v_bufs.index(slot * HALVES + half))
            cnt += 1
        it += 1


@gluon.jit
def _consumer_step(kb, kv_lo, cnt, p, m_i, l_i, acc_tok, acc_m, step, step_prev, q_scale,
                   ks_base, q_s, k_bufs, v_bufs, p_smem, kv_full, kv_empty,
                   k_len, rows, s_init, zero_o, MASKED: gl.constexpr,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
                   STAGES: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr,
                   row_o: gl.constexpr):
    """kv block kb (ring index cnt): QK(kb) and PV(kb-1) issued together.

    The PV dot issued here is waited for at the top of the next step, after this step's
    softmax: ptxas moved a wait placed right after the softmax above it (unmasked loop,
    sm_90 SASS, triton 3.6), and it does not move it across the loop's back edge.
    """
    slot = cnt % STAGES
    # P of block kb-1 into the buffer PV(kb-2) does not read.
    p_buf = p_smem.index(cnt % 2)
    p_buf.store(_p_to_fp8(p))
    acc = warpgroup_mma_wait(0, deps=[acc_tok])  # PV(kb-2)
    # PV(kb-2) came from a fresh accumulator: fold it into the fp32 sum (frame kb-2).
    acc_m = acc_m * gl.expand_dims(step_prev, 1) + acc
    fence_async_shared()
    _cta_barrier()
    # Every warp of this warpgroup is past PV(kb-2): block kb-2's slot is free.
    mbarrier.arrive(kv_empty.index((cnt - 2) % STAGES), pred=kb >= kv_lo + 2)
    mbarrier.wait(kv_full.index(slot), (cnt // STAGES) & 1)
    s_tok = warpgroup_mma(q_s, k_bufs.index(slot).permute((1, 0)), s_init, is_async=True)
    acc_tok = warpgroup_mma(p_buf, v_bufs.index((cnt - 1) % STAGES).permute((1, 0)),
                            zero_o, use_acc=False, is_async=True)
    c = q_scale * gl.load(ks_base + kb)
    s_i = warpgroup_mma_wait(1, deps=[s_tok])
    p, m_i, l_i, alpha = _softmax_block(
        s_i, m_i, l_i, c, kb, MASKED, k_len, rows,
        BLOCK_M, BLOCK_N, IS_CAUSAL, s_layout, p_layout)
    step_prev = step
    step = gl.convert_layout(alpha, row_o) * gl.exp2(_v_grid_log2(kb - 1) - _v_grid_log2(kb))
    return p, m_i, l_i, acc_tok, acc_m, step, step_prev


@gluon.jit
def _exp_half(s, c, bias, BLOCK_M: gl.constexpr, SUB_N: gl.constexpr,
              row_layout: gl.constexpr, p_layout: gl.constexpr, ROW_SUM: gl.constexpr = True):
    """P of one 128-key half (fp8 in the PV dot's A layout, see ``_softmax_block``) and its
    row sum (0 unless ``ROW_SUM``: the row-sum dot sums the fp8 P instead)."""
    p = gl.exp2(s * gl.expand_dims(c, 1) - gl.expand_dims(bias, 1))
    if ROW_SUM:
        l_part = _row_sum(p, BLOCK_M, SUB_N, row_layout)
    else:
        l_part = gl.zeros_like(c)
    return _p_to_fp8(_to_a_operand(p, BLOCK_M, SUB_N, p_layout)), l_part


@gluon.jit
def _copy(x):
    """``x`` through one mov per register (``TAIL_OWN_RANGE``): LLVM keeps it, so ptxas sees
    a new value whose registers it may spill apart from ``x``'s."""
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=gl.float32,
                                     is_pure=False, pack=1)


@gluon.jit
def _magic_preset(like):
    """A fresh int32 tensor of I2F_MAGIC_BITS for one QK accumulator. Both QK dots of a wide
    step preset from one shared constant made LLVM use that constant's register as one of
    the second dot's accumulators, and ptxas then waited for the first dot before issuing
    the second (C7517, sm_90, triton 3.6); an opaque mov per register keeps them apart."""
    return gl.inline_asm_elementwise("mov.b32 $0, 0x4B400000;", "=r,r", [like],
                                     dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _wide_block_softmax(sa_tok, sb_tok, kb, m_i, l_i, q_scale, ks_base, p_a, p_b, k_len, rows,
                        MASKED: gl.constexpr, BLOCK_M: gl.constexpr,
                        BLOCK_N: gl.constexpr, SUB_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
                        s_layout: gl.constexpr, p_layout: gl.constexpr,
                        P_REGS: gl.constexpr = False, ROW_SUM: gl.constexpr = True,
                        v_full=None, slot=0, v_phase=0, SPLIT_KV: gl.constexpr = False):
    """Softmax of a 256-key block from its two QK dots: one max over both halves, both
    halves' fp8 P (the PV dots' A operands) stored into ``p_a``/``p_b`` unless ``P_REGS``;
    returns (m, l, alpha, P of each half). ``ROW_SUM`` False: l is returned unchanged (the
    caller sums P with the row-sum dot). ``SPLIT_KV``: V's barrier waited for here, after the
    max and before the exponentials, so the exponentials and the PV dots stay in one stretch
    of code that ptxas can interleave."""
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    s_a = _scores(warpgroup_mma_wait(1, deps=[sa_tok]), kb * BLOCK_N, MASKED, k_len,
                  rows, SUB_N, IS_CAUSAL, s_layout)
    # one K scale for the block: the max over both halves' raw scores, then scaled
    c = q_scale * gl.load(ks_base + kb)
    mx = _row_max(s_a, BLOCK_M, SUB_N, row_s)
    s_b = _scores(warpgroup_mma_wait(0, deps=[sb_tok]), kb * BLOCK_N + SUB_N,
                  MASKED, k_len, rows, SUB_N, IS_CAUSAL, s_layout)
    mx = gl.maximum(mx, _row_max(s_b, BLOCK_M, SUB_N, row_s))
    m_new = gl.maximum(m_i, (mx - I2F_MAGIC) * c)
    m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_ref)
    if SPLIT_KV:
        mbarrier.wait(v_full.index(slot), v_phase)
    bias = m_ref - P_SHIFT + I2F_MAGIC * c
    p8a, l_a = _exp_half(s_a, c, bias, BLOCK_M, SUB_N, row_s, p_layout, ROW_SUM)
    if not P_REGS:
        p_a.store(p8a)
    p8b, l_b = _exp_half(s_b, c, bias, BLOCK_M, SUB_N, row_s, p_layout, ROW_SUM)
    if not P_REGS:
        p_b.store(p8b)
    if ROW_SUM:
        l_i = l_i * alpha + (l_a + l_b)
    return m_new, l_i, alpha, p8a, p8b


@gluon.jit
def _consumer_step_wide(kb, cnt, m_i, l_i, acc_m, q_scale, ks_base, q_s, k_bufs, v_bufs, p_a,
                        p_b, kv_full, kv_empty, k_len, rows, s_init, zero_o,
                        MASKED: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                        SUB_N: gl.constexpr, IS_CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                        s_layout: gl.constexpr, p_layout: gl.constexpr, row_o: gl.constexpr,
                        P_REGS: gl.constexpr, ones_t=None, zero_l=None,
                        ROWSUM_DOT: gl.constexpr = False, l_layout: gl.constexpr = None,
                        v_full=None, v_empty=None, SPLIT_KV: gl.constexpr = False):
    """kv block kb of 2 * SUB_N keys (ring index cnt), self-contained: both QK halves, one
    max over the block, both halves' P, two PV dots into a fresh accumulator, and the
    block's sum folded into the fp32 sum.

    Why: a 256-key step halves the per-key share of the per-step work (max reduction,
    rescale, fold, barriers, ring bookkeeping), but S then takes 128 registers, and with the
    previous block's PV in flight next to it (``_consumer_step``'s overlap) the 240-register
    budget would not hold S, the PV accumulator and the fp32 sum. So the PV dots are waited
    for within the step (the other warpgroup's softmax covers them). Issuing PV_a before the
    second half's exponentials does not help: ptxas moves those above the issue, and carrying
    the second half across the loop's back edge instead spilled 4 KB (sm_90, triton 3.6).

    ``P_REGS``: the PV dots read P from registers (V^T's kv order already matches them),
    not from shared memory: no P store, fence or warpgroup barrier before them.
    ``ROWSUM_DOT`` (with ``P_REGS``): ``l_i`` is a [BLOCK_M, 8] accumulator whose columns are
    equal: P's row sums come from two N=8 dots of the fp8 P with ``ones_t`` (8 wgmma
    instructions instead of 128 FADDs and the row reduction), and are the sums of the very
    fp8 P the PV dots weigh V with.
    """
    slot = cnt % STAGES
    mbarrier.wait(kv_full.index(slot), (cnt // STAGES) & 1)
    sa_tok = warpgroup_mma(q_s, k_bufs.index(2 * slot).permute((1, 0)),
                           _magic_preset(s_init), is_async=True)
    sb_tok = warpgroup_mma(q_s, k_bufs.index(2 * slot + 1).permute((1, 0)),
                           _magic_preset(s_init), is_async=True)
    m_new, l_new, alpha, p8a, p8b = _wide_block_softmax(
        sa_tok, sb_tok, kb, m_i, l_i, q_scale, ks_base, p_a, p_b, k_len, rows, MASKED,
        BLOCK_M, BLOCK_N, SUB_N, IS_CAUSAL, s_layout, p_layout, P_REGS,
        not ROWSUM_DOT, v_full, slot, (cnt // STAGES) & 1, SPLIT_KV)
    if P_REGS:
        acc_tok = warpgroup_mma(p8a, v_bufs.index(2 * slot).permute((1, 0)), zero_o,
                                use_acc=False, is_async=True)
        acc_tok = warpgroup_mma(p8b, v_bufs.index(2 * slot + 1).permute((1, 0)), acc_tok,
                                is_async=True)
    else:
        fence_async_shared()
        _cta_barrier()
        acc_tok = warpgroup_mma(p_a, v_bufs.index(2 * slot).permute((1, 0)), zero_o,
                                use_acc=False, is_async=True)
        acc_tok = warpgroup_mma(p_b, v_bufs.index(2 * slot + 1).permute((1, 0)), acc_tok,
                                is_async=True)
    # From block kb-1's frame (max and V grid) to block kb's.
    step = gl.convert_layout(alpha, row_o) * gl.exp2(_v_grid_log2(kb - 1) - _v_grid_log2(kb))
    if ROWSUM_DOT:
        pl_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=l_layout,
                                                      k_width=4)
        ones = ones_t.index(slot).permute((1, 0))
        l_tok = warpgroup_mma(gl.convert_layout(p8a, pl_layout, assert_trivial=True), ones,
                              zero_l, use_acc=False, is_async=True)
        l_tok = warpgroup_mma(gl.convert_layout(p8b, pl_layout, assert_trivial=True), ones,
                              l_tok, is_async=True)
        acc, l_blk = warpgroup_mma_wait(0, deps=[acc_tok, l_tok])
        row_l: gl.constexpr = gl.SliceLayout(1, l_layout)
        l_new = l_i * gl.expand_dims(gl.convert_layout(alpha, row_l, assert_trivial=True),
                                     1) + l_blk
    else:
        acc = warpgroup_mma_wait(0, deps=[acc_tok])
    acc_m = acc_m * gl.expand_dims(step, 1) + acc
    # Every warp of this warpgroup is past both PV dots: the slot and P's buffers are free.
    _cta_barrier()
    mbarrier.arrive(kv_empty.index(slot))
    if SPLIT_KV:
        mbarrier.arrive(v_empty.index(slot))
    return m_new, l_new, acc_m


@gluon.jit
def _consumer(wg: gl.constexpr, q_smem, k_bufs, v_bufs, kv_full, kv_empty, q_full, q_empty,
              v_full, v_empty, q_scale_ptr, q_lse_corr_ptr, k_scale_ptr, v_scale_ptr,
              v_mean_ptr, seq_ptr, work_ptr, work_indptr_ptr,
              out_ptr, o_sb, o_st, o_sh, o_sd, lse_ptr, l_sb, l_sh, l_st,
              part_o_ptr, part_lse_ptr, D, Tq_pad, n_kblocks, group, Hkv,
              DP: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              IS_CAUSAL: gl.constexpr, STAGES: gl.constexpr, P_REGS: gl.constexpr,
              ROWSUM_DOT: gl.constexpr, SPLIT_KV: gl.constexpr):
    # QK and PV dots are SUB_N (128) keys wide; a kv block of 256 keys takes two of each.
    SUB_N: gl.constexpr = k_bufs.shape[1]
    WIDE: gl.constexpr = BLOCK_N != SUB_N
    gl.static_assert(BLOCK_N == SUB_N or BLOCK_N == 2 * SUB_N, "kv block of 1 or 2 dots")
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, SUB_N, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DP, 32])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)

    s_init = gl.full([BLOCK_M, SUB_N], I2F_MAGIC_BITS, gl.int32, s_layout)
    zero_o = gl.zeros([BLOCK_M, DP], gl.float32, o_layout)
    offs_m = gl.arange(0, BLOCK_M, layout=row_s)
    offs_mo = gl.arange(0, BLOCK_M, layout=row_o)
    offs_d = gl.arange(0, DP, layout=col_o)
    q_s = q_smem.index(wg)
    # P's buffers: double-buffered across blocks (one dot per block), or the block's two
    # halves (WIDE: both PV dots are waited for within the block).
    p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, SUB_N], gl.float8e4nv)
    if WIDE:
        # separate allocations: Triton's membar pass puts a barrier between a store and an
        # async read of one allocation even where the indices differ
        p_a = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_M, SUB_N], p_sl)
        p_b = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_M, SUB_N], p_sl)
        p_smem = p_a
    else:
        p_smem = gl.allocate_shared_memory(gl.float8e4nv, [2, BLOCK_M, SUB_N], p_sl)
        p_a = p_smem
        p_b = p_smem
    # ROWSUM_DOT: P's row sums from N=8 dots with a tile of ones ([SUB_N keys, 8])
    L_N: gl.constexpr = 8
    l_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, L_N, 32])
    if ROWSUM_DOT:
        zero_l = gl.zeros([BLOCK_M, L_N], gl.float32, l_layout)
        gl.static_assert(WIDE and P_REGS, "the row-sum dot takes P from registers")
        # One tile per ring slot, read as ``ones_t.index(slot)`` (a slot-dependent address, as
        # V's): the form measured on the H200 (2026-12-03); a single loop-invariant tile was
        # suspected of a fault that turned out to be the fill below.
        ones_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([L_N, SUB_N],
                                                                     gl.float8e4nv)
        ones_t = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, L_N, SUB_N], ones_sl)
        fill: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [1, 4], [1, 0])
        # 1.0's e4m3 bits (0x38) as int8, bitcast: converting a splat of fp32 1.0 to fp8 made
        # one F2FP pair (PACK_AB_MERGE_C) whose other half came from an unset register, and
        # that word was stored as four bytes (sm_90, triton 3.6 + ptxas), so every other pair
        # of keys weighed 0 or junk (H200, 2026-12-03: wrong row sums).
        for i in gl.static_range(STAGES):
            ones_t.index(i).store(gl.full([L_N, SUB_N], 0x38, gl.int8, fill)
                                  .to(gl.float8e4nv, bitcast=True))
        # every thread's part of the tiles visible to the async proxy before any warp's dot
        fence_async_shared()
        _cta_barrier()
    else:
        ones_t = None
        zero_l = None

    pid = gl.program_id(0)
    w_begin = gl.load(work_indptr_ptr + pid)
    w_end = gl.load(work_indptr_ptr + pid + 1)
    cnt = 0
    it = 0
    for w in range(w_begin, w_end):
        (b, h, qt, kv_lo, kv_hi, slot_out, hk, q_len, k_len, q_src, q_pad, _k_pad,
         k_blk) = _load_item(work_ptr, seq_ptr, w, group)
        row0 = qt * (2 * BLOCK_M) + wg * BLOCK_M
        q_row = h * Tq_pad + q_pad + row0
        ks_base = k_scale_ptr + hk * n_kblocks + k_blk
        hi_fast = k_len // BLOCK_N
        if IS_CAUSAL:
            # the whole 128-row item shares one kv range: mask from the first row of the item
            hi_fast = gl.minimum(hi_fast, (qt * (2 * BLOCK_M) + 1) // BLOCK_N)
        q_scale = gl.load(q_scale_ptr + q_row + offs_m)
        rows = row0 + offs_m
        mbarrier.wait(q_full, it & 1)
        if WIDE:
            m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
            if ROWSUM_DOT:
                l_i = zero_l
            else:
                l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
            acc = zero_o
            hi_main = gl.maximum(gl.minimum(hi_fast, kv_hi), kv_lo)
            for kb in range(kv_lo, hi_main):
                m_i, l_i, acc = _consumer_step_wide(
                    kb, cnt, m_i, l_i, acc, q_scale, ks_base, q_s, k_bufs, v_bufs, p_a, p_b,
                    kv_full, kv_empty, k_len, rows, s_init, zero_o, False,
                    BLOCK_M, BLOCK_N, SUB_N, IS_CAUSAL, STAGES, s_layout, p_layout, row_o,
                    P_REGS, ones_t, zero_l, ROWSUM_DOT, l_layout,
                    v_full, v_empty, SPLIT_KV)
                cnt += 1
            if TAIL_OWN_RANGE:
                acc = _copy(acc)
            for kb in range(hi_main, kv_hi):
                m_i, l_i, acc = _consumer_step_wide(
                    kb, cnt, m_i, l_i, acc, q_scale, ks_base, q_s, k_bufs, v_bufs, p_a, p_b,
                    kv_full, kv_empty, k_len, rows, s_init, zero_o, True,
                    BLOCK_M, BLOCK_N, SUB_N, IS_CAUSAL, STAGES, s_layout, p_layout, row_o,
                    P_REGS, ones_t, zero_l, ROWSUM_DOT, l_layout,
                    v_full, v_empty, SPLIT_KV)
                cnt += 1
            if ROWSUM_DOT:  # the columns are equal
                l_i = gl.convert_layout(gl.max(l_i, axis=1), row_s, assert_trivial=True)
            mbarrier.arrive(q_empty)
        else:
            acc, m_i, l_i, cnt = _consumer_item(
                kv_lo, kv_hi, hi_fast, cnt, q_scale, ks_base, q_s, k_bufs, v_bufs,
                p_smem, kv_full, kv_empty, k_len, rows, s_init, zero_o,
                BLOCK_M, BLOCK_N, IS_CAUSAL, STAGES, s_layout, p_layout, row_o)
            mbarrier.arrive(q_empty)
        it += 1

        # partial slots hold 2 * BLOCK_M rows: this warpgroup's half
        _write_rows(acc, m_i, l_i, kv_hi, b, h, hk, row0, q_row, q_len, q_src, slot_out,
                    slot_out.to(gl.int64) * (2 * BLOCK_M) + wg * BLOCK_M,
                    v_scale_ptr, v_mean_ptr, q_lse_corr_ptr, out_ptr, o_sb, o_st, o_sh, o_sd,
                    lse_ptr, l_sb, l_sh, l_st, part_o_ptr, part_lse_ptr, D, Hkv,
                    offs_m, offs_mo, offs_d, DP, row_o)


@gluon.jit
def _consumer_item(kv_lo, kv_hi, hi_fast, cnt, q_scale, ks_base, q_s, k_bufs, v_bufs,
                   p_smem, kv_full, kv_empty, k_len, rows, s_init, zero_o,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
                   STAGES: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr,
                   row_o: gl.constexpr):
    """One work item's kv range in 128-key blocks, PV(kb-1) under softmax(kb): returns the
    output accumulator (frame of block kv_hi - 1), m, l, and the ring counter."""
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    # Block kv_lo: QK alone.
    slot = cnt % STAGES
    mbarrier.wait(kv_full.index(slot), (cnt // STAGES) & 1)
    s_tok = warpgroup_mma(q_s, k_bufs.index(slot).permute((1, 0)), s_init, is_async=True)
    s_i = warpgroup_mma_wait(0, deps=[s_tok])
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    c = q_scale * gl.load(ks_base + kv_lo)
    p, m_i, l_i, alpha = _softmax_block(
        s_i, m_i, l_i, c, kv_lo, kv_lo >= hi_fast, k_len, rows,
        BLOCK_M, BLOCK_N, IS_CAUSAL, s_layout, p_layout)
    acc_tok = warpgroup_mma_init(zero_o)
    acc_m = zero_o  # the fp32 sum of the blocks' PV
    step = gl.convert_layout(alpha, row_o)  # multiplies a zero acc
    step_prev = step
    cnt += 1

    hi_main = gl.maximum(gl.minimum(hi_fast, kv_hi), kv_lo + 1)
    for kb in range(kv_lo + 1, hi_main):
        p, m_i, l_i, acc_tok, acc_m, step, step_prev = _consumer_step(
            kb, kv_lo, cnt, p, m_i, l_i, acc_tok, acc_m, step, step_prev, q_scale, ks_base,
            q_s, k_bufs, v_bufs, p_smem, kv_full, kv_empty, k_len, rows, s_init, zero_o,
            False, BLOCK_M, BLOCK_N, IS_CAUSAL, STAGES, s_layout, p_layout, row_o)
        cnt += 1
    for kb in range(hi_main, kv_hi):
        p, m_i, l_i, acc_tok, acc_m, step, step_prev = _consumer_step(
            kb, kv_lo, cnt, p, m_i, l_i, acc_tok, acc_m, step, step_prev, q_scale, ks_base,
            q_s, k_bufs, v_bufs, p_smem, kv_full, kv_empty, k_len, rows, s_init, zero_o,
            True, BLOCK_M, BLOCK_N, IS_CAUSAL, STAGES, s_layout, p_layout, row_o)
        cnt += 1

    # PV of the last block, then release its slot and the item's Q.
    last = (cnt - 1) % STAGES
    p_buf = p_smem.index(cnt % 2)
    p_buf.store(_p_to_fp8(p))
    acc = warpgroup_mma_wait(0, deps=[acc_tok])
    acc_m = acc_m * gl.expand_dims(step_prev, 1) + acc
    fence_async_shared()
    _cta_barrier()
    mbarrier.arrive(kv_empty.index((cnt - 2) % STAGES), pred=kv_hi - kv_lo >= 2)
    acc_tok = warpgroup_mma(p_buf, v_bufs.index(last).permute((1, 0)), zero_o,
                            use_acc=False, is_async=True)
    acc = warpgroup_mma_wait(0, deps=[acc_tok])
    acc = acc_m * gl.expand_dims(step, 1) + acc
    _cta_barrier()
    mbarrier.arrive(kv_empty.index(last))
    return acc, m_i, l_i, cnt


# Sizes whose divisibility by 16 varies from model to model: not specialized on where the
# kernel is built from the PTX fp8dit ships (fp8dit.prebuilt, built for any of their values),
# so that every launch's specialization is the one the PTX was built for; none of them is used
# inside the kv loop. Triton 3.6 builds the kernel itself, specialized on them: the code
# measured (H100, 2026-12-06: unspecialized, CogVideoX-5B's kernel ran 2.9% slower).
PREBUILT_UNSPECIALIZED = ("l_sb", "l_sh", "n_kblocks", "group", "Hkv")
UNSPECIALIZED = (() if ".".join(triton.__version__.split(".")[:2]) == "3.6"
                 else PREBUILT_UNSPECIALIZED)


@gluon.jit(do_not_specialize=UNSPECIALIZED)
def attention_fwd_sm90_ws_kernel(
    desc_q, q_scale_ptr, q_lse_corr_ptr,
    desc_k, k_scale_ptr, desc_v, v_scale_ptr, v_mean_ptr,
    seq_ptr, work_ptr, work_indptr_ptr,
    out_ptr, o_sb, o_st, o_sh, o_sd,
    lse_ptr, l_sb, l_sh, l_st,
    part_o_ptr, part_lse_ptr,
    D, Tq_pad, Tk_pad, n_kblocks, group, Hkv,
    DP: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    IS_CAUSAL: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    num_warps: gl.constexpr, P_REGS: gl.constexpr = False, ROWSUM_DOT: gl.constexpr = False,
    SPLIT_KV: gl.constexpr = False,
):
    """``BLOCK_M`` is one warpgroup's rows (64); a work item (plan tile) has 2 * BLOCK_M."""
    gl.static_assert(num_warps == 4, "the default partition is consumer warpgroup 0")
    q_smem = gl.allocate_shared_memory(desc_q.dtype, [2, BLOCK_M, DP], desc_q.layout)
    # K and V^T tiles of SUB_N (128) keys, one per dot: BLOCK_N // SUB_N per ring slot.
    SUB_N: gl.constexpr = desc_k.block_type.shape[0]
    HALVES: gl.constexpr = BLOCK_N // SUB_N
    k_bufs = gl.allocate_shared_memory(desc_k.dtype, [STAGES * HALVES, SUB_N, DP],
                                       desc_k.layout)
    v_bufs = gl.allocate_shared_memory(desc_v.dtype, [STAGES * HALVES, DP, SUB_N],
                                       desc_v.layout)
    kv_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    # Two barriers no partition uses (the warpgroups' issue turns of a ping-pong schedule that
    # measured slower): the kernel timed on the H200 allocates and initializes them, and
    # without them ptxas schedules the whole kernel differently (sm_90 SASS, 2026-12-05).
    # They go when the kernel is timed without them.
    unused_turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(kv_full.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(unused_turns.index(i), count=1)
    mbarrier.init(q_full, count=1)
    mbarrier.init(q_empty, count=2)
    # SPLIT_KV: V's own full/empty ring; kv_full/kv_empty then count K's half of a slot
    gl.static_assert(not SPLIT_KV or BLOCK_N == 2 * SUB_N, "split K/V barriers: 256-key steps")
    if SPLIT_KV:
        v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(v_full.index(i), count=1)
            mbarrier.init(v_empty.index(i), count=2)
    else:
        v_full = kv_full
        v_empty = kv_empty

    # The partitions' argument tuples are written out: building them once and prepending the
    # warpgroup index, `(0,) + args`, does not compile in Gluon (triton 3.6), nor does a
    # (function, args) pair held in a variable.
    gl.warp_specialize([
        (_consumer, (0, q_smem, k_bufs, v_bufs, kv_full, kv_empty, q_full, q_empty,
                     v_full, v_empty,
                     q_scale_ptr, q_lse_corr_ptr, k_scale_ptr, v_scale_ptr, v_mean_ptr,
                     seq_ptr, work_ptr, work_indptr_ptr,
                     out_ptr, o_sb, o_st, o_sh, o_sd, lse_ptr, l_sb, l_sh, l_st,
                     part_o_ptr, part_lse_ptr, D, Tq_pad, n_kblocks, group, Hkv,
                     DP, BLOCK_M, BLOCK_N, IS_CAUSAL, STAGES, P_REGS, ROWSUM_DOT, SPLIT_KV)),
        (_consumer, (1, q_smem, k_bufs, v_bufs, kv_full, kv_empty, q_full, q_empty,
                     v_full, v_empty,
                     q_scale_ptr, q_lse_corr_ptr, k_scale_ptr, v_scale_ptr, v_mean_ptr,
                     seq_ptr, work_ptr, work_indptr_ptr,
                     out_ptr, o_sb, o_st, o_sh, o_sd, lse_ptr, l_sb, l_sh, l_st,
                     part_o_ptr, part_lse_ptr, D, Tq_pad, n_kblocks, group, Hkv,
                     DP, BLOCK_M, BLOCK_N, IS_CAUSAL, STAGES, P_REGS, ROWSUM_DOT, SPLIT_KV)),
        (_producer, (desc_q, desc_k, desc_v, q_smem, k_bufs, v_bufs, kv_full, kv_empty, q_full,
                     q_empty, v_full, v_empty, seq_ptr, work_ptr, work_indptr_ptr, Tq_pad,
                     Tk_pad, group, DP, BLOCK_M, BLOCK_N, STAGES, SPLIT_KV)),
    ], [4, 1], [CONSUMER_REGS, 24])
