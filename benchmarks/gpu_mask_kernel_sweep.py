"""One H200 call: launch parameters and layouts of the mask-reading kernel.

    python3 benchmarks/gpu_mask_kernel_sweep.py [--resolution 480p]

``kernels.mask_stats`` reads HunyuanVideo 1.5's ``[1, S, S]`` boolean mask once (row counts,
column any): 3.6 ms at 480p (2.6 GB) in run s17-2, where the read alone would take ~0.7 ms at
the H200's ~4 TB/s. Run s17-3 (commit a794d50 of this script) found the cost in the cross-warp
reduction of every column's ``any`` each step: bytes 64 x 256 with 8 warps 3.2 ms, 16 x 1024
with 4 warps 1.7 ms; the same mask read as int32 words (four keys a word, a quarter of the
elements to reduce) 0.78-0.82 ms, and programs owning a block of columns 1.7-2.0 ms. Words
need rows aligned to 4 bytes; the model's length (51,275) is odd. Run s17-4 (commit 271c8dd)
tried packing each thread's four neighbouring bytes into a word in registers before the
reduction: 2.6-7.8 ms, slower than bytes (removed); its check of the library's rows printed
WRONG because the library returns the keys reduced (fixed: ``run_library``). This times, same
process and checked against torch, the library kernel at the model's length for several
(rows, columns, warps) and the word kernel at the model's length and at the nearest multiple of
4; the library times include torch's reduction of the partial table. ``phases`` (session 17:
word loads at the model's length, each program taking the rows that start at one phase of a
4-byte word) ran 0.92 ms in run s18-1, against 0.78 ms for a words-only kernel at the aligned
length (removed since), and is now the library's word kernel (``library words``), which every
mask with contiguous rows takes.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(__file__))
from bench_hunyuan15_forward import LATENTS  # noqa: E402
from bench_wan_forward import time_ms  # noqa: E402
from gpu_mask_check import tokens  # noqa: E402

from fp8dit import key_padding  # noqa: E402


def run_library(m, br, bc, warps):
    """The library's launch; its keys come reduced ([1, Sk]), as the table's amax over a
    one-row axis gives them back."""
    counts, keys = key_padding._mask_stats_launch(m, br, bc, warps)
    return counts, keys[:, None]


def run_library_words(m, br, bw, warps):
    """The library's word launch (the ``phases`` variant of session 17, adopted in session 18)."""
    counts, keys = key_padding._mask_stats_words_launch(m, br, bw, warps)
    return counts, keys[:, None]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolution", choices=sorted(LATENTS), default="480p")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_mask_kernel_sweep: no CUDA device; nothing measured")
        return 2
    s, kept = tokens(args.resolution)
    print(f"{args.resolution}: mask [1, {s}, {s}], {s * s / 1e9:.2f} GB; "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    for size in (s, s - s % 4):  # the model's length, then one the word variant can read
        valid = torch.arange(size, device="cuda") < kept
        m = (valid[:, None] & valid[None, :])[None]
        m[0, 7, 11] = False  # a hole, so a wrong count shows
        ref_counts, ref_any = m.sum(-1), m.any(-2)
        med, _ = time_ms(lambda m=m: (m.sum(-1), m.any(-2)), 2, 5)
        print(f"S = {size}: {'torch sum + any':28s} {med:7.3f} ms")
        if size == s:
            variants = [("library", run_library, cfg) for cfg in (
                (64, 256, 8), (16, 1024, 4), (32, 512, 4), (32, 1024, 8), (16, 512, 2))]
            variants += [("library words", run_library_words, cfg) for cfg in (
                (16, 128, 1), (32, 128, 1), (16, 256, 4), (32, 128, 4), (64, 128, 2))]
        else:
            variants = [("library words", run_library_words, cfg)
                        for cfg in ((16, 128, 1), (32, 128, 1))]
        for name, fn, cfg in variants:
            try:
                counts, part = fn(m, *cfg)
                ok = (torch.equal(counts.long(), ref_counts)
                      and torch.equal(part.amax(1) > 0, ref_any))
                med, low = time_ms(lambda fn=fn, cfg=cfg, m=m: fn(m, *cfg), 3, args.repeats)
                print(f"{name} rows {cfg[0]:4d} cols {cfg[1]:5d} warps {cfg[2]} {cfg[3:]}: "
                      f"{med:7.3f} ms (min {low:.3f}, {m.numel() / med / 1e6:.0f} GB/s) "
                      f"{'ok' if ok else 'WRONG'}")
            except Exception as e:  # noqa: BLE001 - one variant's failure is reported
                print(f"{name} {cfg}: {type(e).__name__}: {str(e)[:200]}")
        del m
    return 0


if __name__ == "__main__":
    sys.exit(main())
