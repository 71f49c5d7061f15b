"""One H200 call: what fp8dit's host (Python) side costs per call, where the GPU time is short.

    python3 benchmarks/gpu_host_overhead.py [--parts host] [--out F]

Why: at Flux's shape one attention takes ~0.4 ms of GPU time, and the end-to-end figure of
`fp8dit bench` moved between 0.52 and 0.82 ms across runs with SASS-identical kernels.
``do_bench`` clears the L2 between calls, so host time beyond that clear shows up as GPU idle.

Per shape and path (fp8dit fp8, fp8dit auto, SDPA cuDNN called directly):
- host_us: wall time of one call with an idle GPU (synchronized before), median of 50;
- do_bench_ms: ``triton.testing.do_bench`` median (as `fp8dit bench` times);
- stream_ms: 50 calls back to back between two events, divided by 50 (host ahead of the GPU
  unless host_us exceeds the GPU time);
- graph_ms (fp8 path): the call replayed from a CUDA graph, the GPU time alone.
Then a cProfile of 50 fp8 calls at the Flux shape (top 25 functions by own time).
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

import fp8dit

sys.path.insert(0, os.path.dirname(__file__))
import gpu_gluon  # noqa: E402
from bench_wan_forward import capture  # noqa: E402
from gpu_gluon import record  # noqa: E402

SHAPES = {"flux-1024": (1, 24, 4608, 128), "cogvideox-5b": (1, 48, 17776, 64),
          "wan2.1-1.3b-480p": (1, 12, 32760, 128)}


def host_us(fn, n=50):
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(ts) * 1e6


def stream_ms(fn, n=50):
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / n


def graph_ms(fn):
    graph, _ = capture(fn)
    return stream_ms(graph.replay)


def _paths(q, k, v) -> dict:
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))

    def sdpa():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qh, kh, vh)

    return {"fp8": lambda: fp8dit.attention(q, k, v, backend="fp8"),
            "auto": lambda: fp8dit.attention(q, k, v, backend="auto"),
            "sdpa-cudnn": sdpa}


def _profile(fn, calls=50):
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    print(buf.getvalue(), flush=True)


def part_host():
    for name, (B, H, S, D) in SHAPES.items():
        q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        paths = _paths(q, k, v)
        for pname, fn in paths.items():
            fn()
            torch.cuda.synchronize()
            row = dict(part="host", shape=name, path=pname, host_us=host_us(fn),
                       do_bench_ms=triton.testing.do_bench(fn, return_mode="median"),
                       stream_ms=stream_ms(fn))
            if pname == "fp8":
                try:
                    row["graph_ms"] = graph_ms(fn)
                except Exception as e:  # noqa: BLE001 - a failure is a result
                    row["graph_error"] = f"{type(e).__name__}: {e}"[:300]
            record(**row)
        if name == "flux-1024":
            _profile(paths["fp8"])
        del q, k, v, paths
        torch.cuda.empty_cache()


def main() -> int:
    return gpu_gluon.run_parts(globals(), "host")


if __name__ == "__main__":
    raise SystemExit(main())
