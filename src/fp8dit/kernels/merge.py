"""Merge split-KV partial outputs by their log-sum-exp into the final output and LSE."""

import triton
import triton.language as tl

from .common import cast_for_store

# Reduce-map fields (int32 columns of the plan's reduce table).
R_SEQ = 0
R_HEAD = 1
R_QTILE = 2
R_SLOT0 = 3  # first partial slot; the item's pieces occupy consecutive slots in kv order
R_NSLOTS = 4
R_FIELDS = 5


@triton.jit
def merge_partials_kernel(
    part_o_ptr, part_lse_ptr, reduce_ptr, seq_ptr,
    out_ptr, o_sb, o_st, o_sh, o_sd,
    lse_ptr, l_sb, l_sh, l_st,
    q_lse_corr_ptr, Tq_pad, D,
    DP: tl.constexpr, BLOCK_M: tl.constexpr, SOFT_FP8_CAST: tl.constexpr,
):
    """One program per split item; pieces merged in slot order (deterministic). The pieces'
    LSEs leave out the row's K-smoothing shift (``q_lse_corr``), added to the merged LSE only:
    the output's weights then do not depend on that shift's last bits."""
    r = tl.program_id(0)
    item = reduce_ptr + r * 5
    b = tl.load(item + 0)
    h = tl.load(item + 1)
    qt = tl.load(item + 2)
    slot0 = tl.load(item + 3)
    n = tl.load(item + 4)
    q_len = tl.load(seq_ptr + b * 8 + 0)
    q_src = tl.load(seq_ptr + b * 8 + 2)
    q_pad = tl.load(seq_ptr + b * 8 + 4)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, DP)

    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    for i in range(0, n):
        m = tl.maximum(m, tl.load(part_lse_ptr + (slot0 + i).to(tl.int64) * BLOCK_M + offs_m))
    m_ref = tl.where(m == float("-inf"), 0.0, m)
    wsum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DP], dtype=tl.float32)
    for i in range(0, n):
        base = (slot0 + i).to(tl.int64) * BLOCK_M
        w = tl.exp(tl.load(part_lse_ptr + base + offs_m) - m_ref)
        o = tl.load(part_o_ptr + (base + offs_m)[:, None] * DP + offs_d[None, :])
        acc += w[:, None] * o
        wsum += w
    empty = wsum == 0.0
    o = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, wsum)[:, None])
    corr = tl.load(q_lse_corr_ptr + h * Tq_pad + q_pad + qt * BLOCK_M + offs_m)
    lse = tl.where(empty, float("-inf"), m_ref + tl.log(wsum) + corr)

    rows = qt * BLOCK_M + offs_m
    rmask = rows < q_len
    tok0 = (q_src + qt * BLOCK_M).to(tl.int64)
    optr = (
        out_ptr + b.to(tl.int64) * o_sb + h.to(tl.int64) * o_sh + tok0 * o_st
        + offs_m[:, None] * o_st + offs_d[None, :] * o_sd
    )
    tl.store(optr, cast_for_store(o, out_ptr, SOFT_FP8_CAST),
             mask=rmask[:, None] & (offs_d < D)[None, :])
    lptr = lse_ptr + b.to(tl.int64) * l_sb + h.to(tl.int64) * l_sh + tok0 * l_st
    tl.store(lptr + offs_m * l_st, lse, mask=rmask)
