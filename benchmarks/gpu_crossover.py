"""One H200 call: where each attention path pays, by sequence length (session 14).

    python3 benchmarks/gpu_crossover.py [--out F] [--rounds 3] [--shape B,H,S,D ...]

Why: ``auto`` picks SDPA below ``dispatch.FP8_MIN_TOKENS`` (D=128: 8,192; D=64: 17,000) and
the Triton kernel below ``launch.WS_MIN_KV_TOKENS`` (D=128: 32,000 keys), thresholds measured
in sessions 2-4 against kernels that have since gained 20-40% (run s14-2: the warp-specialized
kernel at 1,000 TFLOPS on Wan, the Triton kernel at 697 on Flux's 4,608 tokens). Lengths
between Flux (4,608) and Wan 480p (32,760) were never timed on today's kernels.

Per shape, same process, in ``--rounds`` rounds of rotating order: SDPA cuDNN, and
``fp8dit.attention(backend="fp8")`` end to end with ``FP8DIT_KERNEL=triton`` and
``=gluon-ws``; cuDNN's FP8 SDPA end to end and kernel alone (``fp8dit.cudnn_fp8``,
per-tensor scales) when its frontend is importable. Each timing is triton's do_bench median
(L2 flushed between calls).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import gpu_gluon  # noqa: E402
from gpu_variants import bench, cudnn_fn, fp8_fn, rotated, tflops  # noqa: E402

from fp8dit.cudnn_fp8 import CudnnFp8Attention, CudnnFp8Unavailable, quantize_inputs  # noqa: E402
from fp8dit.testing import make_qkv  # noqa: E402

# (B, H, S, D): Flux's 24 heads at D=128 (Flux 1024 px is 4,608 tokens, 2048 px 16,896),
# CogVideoX's 48 heads at D=64
SHAPES = [(1, 24, s, 128) for s in (4608, 8192, 12288, 16896, 24576, 32768)] + \
         [(1, 48, s, 64) for s in (8192, 12288, 17776)]


def cudnn_fp8_runs(sets) -> dict:
    """cuDNN FP8 end to end (per-tensor quantization in torch ops) and its kernel alone."""
    hn = [tuple(t.transpose(1, 2) for t in qkv) for qkv in sets]  # [B, H, S, D] views
    att = CudnnFp8Attention(*hn[0])
    pre = [quantize_inputs(*x) for x in hn]
    out8 = att.run_fp8(pre[0])
    turn = rotated(list(range(len(sets))))
    return {"cudnn-fp8": lambda: att(*hn[turn()]),
            "cudnn-fp8-kernel": lambda: att.run_fp8(pre[turn()], out8)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shape", action="append", default=[],
                    help="B,H,S,D to time instead of the built-in list (repeatable)")
    a = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split(",")) for s in a.shape] or SHAPES
    gpu_gluon.record_env()
    for B, H, S, D in shapes:
        sets = [make_qkv(B, H, S, D, device="cuda", seed=i) for i in range(2)]
        nxt = rotated(sets)
        est = 4 * B * H * S * S * D / 700e12 * 1e3
        fp8 = fp8_fn(nxt, None)
        runs = {"sdpa-cudnn": cudnn_fn(nxt)}
        for kname in ("triton", "gluon-ws"):
            def run(kname=kname, fp8=fp8):
                os.environ["FP8DIT_KERNEL"] = kname  # read per call (env.attention_kernel)
                return fp8()
            runs[f"fp8dit[{kname}]"] = run
        try:  # the FP8 peer, when the cuDNN frontend is importable
            runs.update(cudnn_fp8_runs(sets))
        except CudnnFp8Unavailable as e:
            gpu_gluon.record(part="speed", shape=[B, H, S, D], backend="cudnn-fp8",
                             error=str(e)[:300])
        times = {name: [] for name in runs}
        try:
            for fn in runs.values():  # compile and warm every path first
                fn()
            torch.cuda.synchronize()
            names = list(runs)
            for r in range(a.rounds):
                k = r % len(names)
                for name in names[k:] + names[:k]:
                    t0 = time.time()
                    times[name].append(bench(runs[name], est))
                    gpu_gluon.record(part="round", shape=[B, H, S, D], backend=name, round=r,
                                     ms=times[name][-1], t0=t0, t1=time.time())
            cud = statistics.median(times["sdpa-cudnn"])
            for name, t in times.items():
                ms = statistics.median(t)
                gpu_gluon.record(part="speed", shape=[B, H, S, D], backend=name, ms=ms,
                                 ms_rounds=t, tflops=tflops(B, H, S, D, ms),
                                 vs_cudnn=cud / ms)
        except Exception as e:  # noqa: BLE001 - keep the other shapes
            gpu_gluon.record(part="speed", shape=[B, H, S, D],
                             error=f"{type(e).__name__}: {e}"[:400])
        os.environ["FP8DIT_KERNEL"] = "auto"
        del sets, nxt, runs
        torch.cuda.empty_cache()
    gpu_gluon.write_rows(a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
