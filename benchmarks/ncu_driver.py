"""One fp8dit attention call to be profiled by Nsight Compute (benchmarks/gpu_ncu.sh).

    python3 benchmarks/ncu_driver.py --kernel gluon-ws [--ablate 2] [--heads 8] [--seq 75600]
        [--quant-iters 4] [--quant-fast]

Runs the call twice (the first compiles and plans); the profiler skips the first launch of the
attention kernel and records the second.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

import fp8dit
from fp8dit import launch
from fp8dit.testing import make_qkv

sys.path.insert(0, os.path.dirname(__file__))
from gpu_variants import parse_overrides  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", default="gluon-ws")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=75600)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--over", default="", help="tile overrides, e.g. sm90_ablate_exp=2")
    ap.add_argument("--quant-iters", type=int, default=0,
                    help="blocks per quantize_q / quantize_kv program (quant.*_QUANT_ITERS)")
    ap.add_argument("--quant-fast", action="store_true",
                    help="the quantization's paths for finite data (quant.*_FAST)")
    a = ap.parse_args()
    from fp8dit import quant
    if a.quant_iters:
        quant.Q_QUANT_ITERS[a.dim] = quant.KV_QUANT_ITERS[a.dim] = a.quant_iters
    if a.quant_fast:
        quant.KV_STATS_FULL_FAST = quant.Q_QUANT_FINITE_FAST = True
        quant.KV_QUANT_FINITE_FAST = True
    os.environ["FP8DIT_KERNEL"] = a.kernel
    if a.over:
        launch.TILE_OVERRIDES[a.dim] = parse_overrides(a.over)
    q, k, v = make_qkv(1, a.heads, a.seq, a.dim, device="cuda", seed=0)
    for _ in range(2):
        fp8dit.attention(q, k, v, backend="fp8")
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
