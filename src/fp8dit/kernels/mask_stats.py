"""Row counts and column ``any`` of a boolean ``[B, Sq, Sk]`` attention mask in one read.

HunyuanVideo 1.5 hands every attention call a new ``[B, 1, S, S]`` mask (S^2 bytes: 2.6 GB at
480p, 13 GB at 720p); ``fp8dit.key_padding`` needs each row's count and each column's ``any``
to see it as (kept queries) x (kept keys). torch's ``mask.sum(-1)`` and ``mask.any(-2)`` took
14.8 ms there on the H200, against 21 ms for the FP8 attention itself (2026-12-04): the sum of a
bool tensor goes through int64. This reads each byte once: one program per ``BLOCK_R`` rows
counts them and writes its rows' column ``any`` as one row of a small partial table
(``Sq / BLOCK_R`` rows), which torch then reduces (no atomics: the same result every run).

Masks whose rows are contiguous (every model's) are read as int32 words, four keys a word, by
:func:`mask_row_counts_col_any_words_kernel`: 0.92 ms at 480p against 2.0 ms for bytes (H200,
2026-12-04). Others (transposed, stride-0 keys) take the byte kernel. Launch shapes:
``tuning.mask_bytes`` and ``tuning.mask_words``.
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
    read, sets the speed (H200, 2026-12-04: 64 x 256 bytes with 8 warps 3.3 ms at 480p,
    32 x 512 with 4 warps 2.1 ms, 16 x 1024 1.8 ms; reading the mask as int32 words, a quarter
    of the elements, 0.8 ms where rows are 4-byte aligned, which the model's odd length rules
    out; packing a thread's bytes into words in registers first was slower, 2.6-7.8 ms)."""
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


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def mask_row_counts_col_any_words_kernel(
    m_ptr, base_phase, m_sb, m_sq, Sq, Sk, n_words,
    count_ptr,  # [B, Sq] int32
    part_ptr,  # [B, 4, n_pid, n_words] int32: per phase class, the OR of its rows' words
    BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr,
):
    """The byte kernel's result from int32 word loads, for rows of contiguous bytes at any
    length. A row starts at byte ``base_phase + b m_sb + r m_sq`` of the 4-byte aligned base;
    rows r = g, g + 4, g + 8, ... start at the same phase p of a word (4 m_sq is a multiple of
    4), so program (pid, g, b) takes ``BLOCK_R`` rows of class g: their words hold the same
    columns, ORed over the rows, and the host reads class g's columns from byte p of its row of
    the table. A row's first and last words are masked to its own bytes (a neighbour's bytes
    share them). The aligned words around a row's ends lie in its tensor's 4-byte granules."""
    pid = tl.program_id(0)
    g = tl.program_id(1)
    b = tl.program_id(2)
    start = base_phase + b.to(tl.int64) * m_sb  # the batch's first byte from the aligned base
    p = (start + g * m_sq) % 4
    rows = g + 4 * (pid * BLOCK_R + tl.arange(0, BLOCK_R))
    row_ok = rows < Sq
    words = (m_ptr - base_phase).to(tl.pointer_type(tl.int32))
    word0 = (start + rows.to(tl.int64) * m_sq - p) // 4
    part = part_ptr + ((b * 4 + g) * tl.num_programs(0) + pid).to(tl.int64) * n_words
    count = tl.zeros([BLOCK_R], tl.int32)
    row_words = (p + Sk + 3) // 4
    one = tl.full([BLOCK_W], 1, tl.int64)
    for j0 in range(0, row_words, BLOCK_W):
        j = j0 + tl.arange(0, BLOCK_W)
        j_ok = j < row_words
        x = tl.load(words + word0[:, None] + j[None, :], mask=row_ok[:, None] & j_ok[None, :],
                    other=0)
        lo = tl.minimum(tl.maximum(p - 4 * j, 0), 4).to(tl.int64)  # bytes before the row
        hi = tl.minimum(tl.maximum(p + Sk - 4 * j, 0), 4).to(tl.int64)  # bytes up to its end
        keep = (((one << (8 * hi)) - 1) - ((one << (8 * lo)) - 1)).to(tl.int32)
        x = x & keep[None, :]
        count += tl.sum((x * 0x01010101) >> 24, 1)  # bytes are 0/1: their sum, top byte
        tl.store(part + j, tl.reduce(x, 0, _or), mask=j_ok)
    tl.store(count_ptr + b.to(tl.int64) * Sq + rows, count, mask=row_ok)
