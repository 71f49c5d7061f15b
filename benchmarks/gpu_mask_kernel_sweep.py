"""One H200 call: launch parameters and a word-wise variant of the mask-reading kernel.

    python3 benchmarks/gpu_mask_kernel_sweep.py [--resolution 480p]

``kernels.mask_stats`` reads HunyuanVideo 1.5's ``[1, S, S]`` boolean mask once (row counts,
column any): 3.6 ms at 480p (2.6 GB) in run s17-2, where the read alone would take ~0.7 ms at
the H200's ~4 TB/s. Each program reduces its rows' column ``any`` across warps every step.
This times, same process, the library kernel at several (rows, columns, warps) and a variant
that reads the mask as int32 words (four keys a word: a row's count from one multiply per
word, the column ``any`` as a bitwise OR of words, a quarter of the elements to reduce), each
checked against torch, and a third layout: programs that own a block of columns (their
column ``any`` accumulates elementwise, reduced once; each step's row sums go to a small table,
a reduction within a warp). The ``cols`` times include torch's sum of that table.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(__file__))
from bench_hunyuan15_forward import IMAGE, LATENTS, TEXT, TEXT_2  # noqa: E402
from bench_wan_forward import time_ms  # noqa: E402

from fp8dit.kernels.mask_stats import mask_row_counts_col_any_kernel  # noqa: E402


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def words_kernel(m_ptr, m_sb, m_sq, Sq, Wk, count_ptr, part_ptr,
                 BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr):
    """The mask as int32 words (4 keys each, contiguous rows, Sk % 4 == 0)."""
    pid = tl.program_id(0)
    b = tl.program_id(1)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < Sq
    base = m_ptr + b.to(tl.int64) * m_sb + rows.to(tl.int64)[:, None] * m_sq
    part = part_ptr + (b * tl.num_programs(0) + pid).to(tl.int64) * Wk
    count = tl.zeros([BLOCK_R], tl.int32)
    for w0 in range(0, Wk, BLOCK_W):
        ws = w0 + tl.arange(0, BLOCK_W)
        w_ok = ws < Wk
        x = tl.load(base + ws[None, :], mask=row_ok[:, None] & w_ok[None, :], other=0)
        count += tl.sum((x * 0x01010101) >> 24, 1)  # bytes are 0/1: their sum, top byte
        tl.store(part + ws, tl.reduce(x, 0, _or), mask=w_ok)
    tl.store(count_ptr + b.to(tl.int64) * Sq + rows, count, mask=row_ok)


@triton.jit
def cols_kernel(m_ptr, m_sb, m_sq, Sq, Sk, rows_per_prog, rowpart_ptr, colpart_ptr,
                BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """A program owns BLOCK_C columns of ``rows_per_prog`` rows (batch 1): the column ``any``
    accumulates elementwise over its steps (reduced once), each step's row sums go to a
    [column blocks, Sq] table (a reduction along the columns, within a warp)."""
    pid_c = tl.program_id(0)
    pid_r = tl.program_id(1)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < Sk
    acc = tl.zeros([BLOCK_R, BLOCK_C], tl.int32)
    r_begin = pid_r * rows_per_prog
    r_end = tl.minimum(r_begin + rows_per_prog, Sq)
    for r0 in range(r_begin, r_end, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        row_ok = rows < r_end
        x = tl.load(m_ptr + rows.to(tl.int64)[:, None] * m_sq + cols[None, :],
                    mask=row_ok[:, None] & col_ok[None, :], other=0).to(tl.int32)
        acc = tl.maximum(acc, x)
        tl.store(rowpart_ptr + pid_c.to(tl.int64) * Sq + rows, tl.sum(x, 1), mask=row_ok)
    tl.store(colpart_ptr + pid_r.to(tl.int64) * Sk + cols, tl.max(acc, 0).to(tl.int8),
             mask=col_ok)


def run_cols(m, br, bc, warps, rows_per_prog=2048):
    _, Sq, Sk = m.shape
    u8 = m.view(torch.uint8)
    n_c, n_r = triton.cdiv(Sk, bc), triton.cdiv(Sq, rows_per_prog)
    rowpart = torch.empty(n_c, Sq, dtype=torch.int32, device=m.device)
    colpart = torch.empty(n_r, Sk, dtype=torch.int8, device=m.device)
    cols_kernel[(n_c, n_r)](u8, u8.stride(0), u8.stride(1), Sq, Sk, rows_per_prog, rowpart,
                            colpart, BLOCK_R=br, BLOCK_C=bc, num_warps=warps)
    return rowpart.sum(0, keepdim=True), colpart[None]


def run_bytes(m, br, bc, warps):
    B, Sq, Sk = m.shape
    counts = torch.empty(B, Sq, dtype=torch.int32, device=m.device)
    part = torch.empty(B, triton.cdiv(Sq, br), Sk, dtype=torch.int8, device=m.device)
    u8 = m.view(torch.uint8)
    mask_row_counts_col_any_kernel[(part.shape[1], B)](u8, *u8.stride(), Sq, Sk, counts, part,
                                                      BLOCK_R=br, BLOCK_C=bc, num_warps=warps)
    return counts, part


def run_words(m, br, bw, warps):
    B, Sq, Sk = m.shape
    w = m.view(torch.uint8).view(torch.int32)
    counts = torch.empty(B, Sq, dtype=torch.int32, device=m.device)
    part = torch.empty(B, triton.cdiv(Sq, br), Sk // 4, dtype=torch.int32, device=m.device)
    words_kernel[(part.shape[1], B)](w, w.stride(0), w.stride(1), Sq, Sk // 4, counts, part,
                                     BLOCK_R=br, BLOCK_W=bw, num_warps=warps)
    return counts, part.view(torch.int8)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolution", choices=sorted(LATENTS), default="480p")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_mask_kernel_sweep: no CUDA device; nothing measured")
        return 2
    f, h, w = LATENTS[args.resolution]
    s = f * h * w + TEXT + TEXT_2 + IMAGE
    s4 = s - s % 4  # the word variant needs Sk % 4 == 0
    kept = f * h * w + 136
    valid = torch.arange(s4, device="cuda") < kept
    m = (valid[:, None] & valid[None, :])[None]
    m[0, 7, 11] = False  # a hole, so a wrong count shows
    ref_counts, ref_any = m.sum(-1), m.any(-2)
    print(f"{args.resolution}: mask [1, {s4}, {s4}], {m.numel() / 1e9:.2f} GB; "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    med, _ = time_ms(lambda: (m.sum(-1), m.any(-2)), 2, 5)
    print(f"{'torch sum + any':28s} {med:7.3f} ms")
    variants = [("bytes", run_bytes, cfg) for cfg in
                ((64, 256, 8), (32, 512, 4), (32, 256, 4), (16, 1024, 4), (128, 128, 8),
                 (64, 512, 8), (128, 256, 8), (16, 512, 1), (32, 512, 1), (64, 512, 2),
                 (32, 1024, 2))]
    variants += [("words", run_words, cfg) for cfg in
                 ((64, 64, 8), (32, 128, 4), (16, 256, 4), (64, 128, 8), (128, 64, 8),
                  (32, 64, 4), (16, 128, 1), (32, 128, 1), (64, 128, 2))]
    variants += [("cols", run_cols, cfg) for cfg in
                 ((16, 512, 4), (32, 512, 4), (8, 1024, 4), (32, 256, 4), (16, 512, 1),
                  (64, 512, 8), (16, 512, 4, 1024), (16, 512, 4, 4096))]
    for name, fn, cfg in variants:
        try:
            counts, part = fn(m, *cfg)
            ok = (torch.equal(counts.long(), ref_counts)
                  and torch.equal(part.amax(1) > 0, ref_any))
            med, low = time_ms(lambda fn=fn, cfg=cfg: fn(m, *cfg), 3, args.repeats)
            print(f"{name} rows {cfg[0]:4d} cols {cfg[1]:5d} warps {cfg[2]} {cfg[3:]}: "
                  f"{med:7.3f} ms "
                  f"(min {low:.3f}, {m.numel() / med / 1e6:.0f} GB/s) {'ok' if ok else 'WRONG'}")
        except Exception as e:  # noqa: BLE001 - one variant's failure is reported, not fatal
            print(f"{name} {cfg}: {type(e).__name__}: {str(e)[:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
