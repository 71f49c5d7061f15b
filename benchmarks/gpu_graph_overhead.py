"""How much of fp8dit's end-to-end time at small shapes is host launch overhead.

    python3 benchmarks/gpu_graph_overhead.py [--presets flux-1024,cogvideox-5b] [--out F]

Times SDPA cuDNN and fp8dit (default kernel and recipe) per preset, eager and replayed from a
CUDA graph (one graph per rotated input set, captured after warm-up), in one process. The gap
between eager and graph is what the host spends launching (fp8dit: four quantization launches,
the attention kernel, the reduce); a graph-captured model (``torch.compile`` with
``mode="reduce-overhead"``, or a captured denoising step) does not pay it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch
import triton

import fp8dit
from fp8dit.testing import make_qkv

sys.path.insert(0, os.path.dirname(__file__))
from gpu_variants import bench, cudnn_fn, tflops  # noqa: E402

PRESETS = {
    "flux-1024": (1, 24, 4608, 128),
    "wan2.1-1.3b-480p": (1, 12, 32760, 128),
    "cogvideox-5b": (2, 48, 17776, 64),
    "wan-480p": (1, 40, 32760, 128),
}


def backends():
    def fp8(q, k, v):
        return fp8dit.attention(q, k, v, backend="fp8")

    def cudnn(q, k, v):
        return cudnn_fn(lambda: (q, k, v))()

    return {"sdpa-cudnn": cudnn, "fp8dit": fp8}


def graphed(fn, sets):
    """One CUDA graph per input set, replayed in rotation."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for qkv in sets:
            for _ in range(3):
                fn(*qkv)
    torch.cuda.current_stream().wait_stream(side)
    graphs = []
    for qkv in sets:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn(*qkv)
        graphs.append(g)
    state = {"i": 0}

    def replay():
        state["i"] = (state["i"] + 1) % len(graphs)
        graphs[state["i"]].replay()
    return replay


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    rows = [dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                 triton=triton.__version__, fp8dit=fp8dit.__version__,
                 date=datetime.datetime.now().isoformat(timespec="seconds"))]
    print(json.dumps(rows[0]), flush=True)
    for name in a.presets.split(","):
        B, H, S, D = PRESETS[name]
        sets = [make_qkv(B, H, S, D, device="cuda", seed=i) for i in range(2)]
        est = 4 * B * H * S * S * D / 600e12 * 1e3
        for bname, fn in backends().items():
            state = {"i": 0}

            def eager(fn=fn, state=state, sets=sets):
                state["i"] = (state["i"] + 1) % len(sets)
                return fn(*sets[state["i"]])
            for mode, run in (("eager", eager), ("graph", graphed(fn, sets))):
                ms = bench(run, est)
                row = dict(preset=name, backend=bname, mode=mode, ms=ms,
                           tflops=tflops(B, H, S, D, ms))
                rows.append(row)
                print(json.dumps(row), flush=True)
        del sets
        torch.cuda.empty_cache()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
