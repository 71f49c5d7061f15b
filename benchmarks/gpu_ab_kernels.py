"""One H200 call: the Gluon kernels of an older commit against this tree's, same process.

    mkdir -p benchmarks/_ab_old && touch benchmarks/_ab_old/__init__.py
    for f in attention_sm90 attention_sm90_ws; do
        git show REV:src/fp8dit/kernels/$f.py > benchmarks/_ab_old/$f.py; done
    python3 benchmarks/gpu_ab_kernels.py [--old benchmarks/_ab_old] [--rounds 4]

Session 17 changed the masked steps of the sm_90 kernels (the masked keys preset into the QK
dot, no select over S; SASS without spills); the main loops' code did not change, but their
register allocation did. This loads the older kernel modules as a package beside the library,
checks that both give bitwise equal outputs and LSE at the DiT presets (a masked tail at each:
75,600, 32,760 and 17,776 keys are no multiple of 256), and times fp8dit's whole call with each
in alternating rounds (CUDA events, median of each round's calls).
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys

import torch

import fp8dit
from fp8dit import launch
from fp8dit.testing import make_qkv

SHAPES = {"wan2.2-a14b-720p": (1, 40, 75600, 128), "wan-480p": (1, 40, 32760, 128),
          "cogvideox-5b": (1, 48, 17776, 64)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default=os.path.join(os.path.dirname(__file__), "_ab_old"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--calls", type=int, default=10)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_ab_kernels: no CUDA device; nothing measured")
        return 2
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.old)))
    pkg = os.path.basename(os.path.abspath(args.old))
    old = {n: importlib.import_module(f"{pkg}.{n}") for n in ("attention_sm90",
                                                             "attention_sm90_ws")}
    new_lookup = launch._gluon_sm90_module

    def use(which):
        launch._gluon_sm90_module = (new_lookup if which == "new"
                                     else lambda name="attention_sm90": old[name])

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, old kernels from "
          f"{args.old}")
    status = 0
    for preset, (B, H, S, D) in SHAPES.items():
        q, k, v = make_qkv(B, H, S, D, layout="HND", device="cuda", seed=5)
        outs = {}
        for which in ("old", "new"):
            use(which)
            outs[which] = fp8dit.attention(q, k, v, layout="HND", backend="fp8",
                                           return_lse=True)
        same = all(torch.equal(a, b) for a, b in zip(outs["old"], outs["new"]))
        status |= not same
        times = {"old": [], "new": []}
        for _ in range(args.rounds):
            for which in ("old", "new"):
                use(which)
                fp8dit.attention(q, k, v, layout="HND", backend="fp8")
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(True), torch.cuda.Event(True)
                start.record()
                for _ in range(args.calls):
                    fp8dit.attention(q, k, v, layout="HND", backend="fp8")
                end.record()
                end.synchronize()
                times[which].append(start.elapsed_time(end) / args.calls)
        med = {w: statistics.median(t) for w, t in times.items()}
        print(f"{preset:18s} bitwise equal: {same}; old {med['old']:8.3f} ms, new "
              f"{med['new']:8.3f} ms: new/old {med['new'] / med['old']:.4f}  rounds old "
              + " / ".join(f"{t:.3f}" for t in times["old"]) + ", new "
              + " / ".join(f"{t:.3f}" for t in times["new"]))
    use("new")
    return status


if __name__ == "__main__":
    sys.exit(main())
