"""Row counts and column ``any`` of a boolean ``[B, Sq, Sk]`` attention mask in one read.

HunyuanVideo 1.5 hands every attention call a new ``[B, 1, S, S]`` mask (S^2 bytes: 2.6 GB at
480p, 13 GB at 720p); ``fp8dit.key_padding`` needs each row's count and each column's ``any``
to see it as (kept queries) x (kept keys). torch's ``mask.sum(-1)`` and ``mask.any(-2)`` took
14.8 ms there on the H200, against 21 ms for the FP8 attention itself (run s17-1): the sum of a
bool tensor goes through int64. This reads each byte once: one program per ``BLOCK_R`` rows
counts them and writes its rows' column ``any`` as one row of a small partial table
(``Sq / BLOCK_R`` rows), which torch then reduces (no atomics: the same result every run).
"""

import triton
import triton.language as tl


@triton.jit
def mask_row_counts_col_any_kernel(
    m_ptr, m_sb, m_sq, m_sk, Sq, Sk,
    count_ptr,  # [B, Sq] int32: True entries per row
    part_ptr,  # [B, cdiv(Sq, BLOCK_R), Sk] int8: 1 where a column holds a True in the rows
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Each step reduces its rows' column ``any`` across the warps: that reduction, not the
    read, sets the speed (run s17-4, ``benchmarks/gpu_mask_kernel_sweep.py``: 64 x 256 bytes
    with 8 warps 3.3 ms at 480p, 32 x 512 with 4 warps 2.1 ms, 16 x 1024 1.8 ms; reading the
    mask as int32 words, a quarter of the elements, 0.8 ms where rows are 4-byte aligned,
    which the model's odd length rules out; packing a thread's bytes into words in registers
    first was slower, 2.6-7.8 ms)."""
    pid = tl.program_id(0)
    b = tl.program_id(1)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < Sq
    base = m_ptr + b.to(tl.int64) * m_sb + rows.to(tl.int64)[:, None] * m_sq
    part = part_ptr + (b * tl.num_programs(0) + pid).to(tl.int64) * Sk
    count = tl.zeros([BLOCK_R], tl.int32)
    for c0 in range(0, Sk, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        col_ok = cols < Sk
        x = tl.load(base + cols.to(tl.int64)[None, :] * m_sk,
                    mask=row_ok[:, None] & col_ok[None, :], other=0).to(tl.int32)
        count += tl.sum(x, 1)
        tl.store(part + cols, tl.max(x, 0).to(tl.int8), mask=col_ok)
    tl.store(count_ptr + b.to(tl.int64) * Sq + rows, count, mask=row_ok)
