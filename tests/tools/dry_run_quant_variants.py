"""``benchmarks/gpu_quant_variants.py`` run on a machine without a GPU, before device time is
spent on it: Triton's interpreter, CPU tensors, two tiny presets (D=128 and D=64), the CUDA
timings and the profiler stubbed out. Every variant is set, run and compared bitwise with the
defaults as on the H200; exits non-zero if a variant other than a statistics sub-tile change
(``sub16``, ``stats_fast_sub8``, which may reorder the means' sums on the GPU; the
interpreter keeps its own sub-tile) changes a byte of the workspace.

    TRITON_INTERPRET=1 PYTHONPATH=src python tests/tools/dry_run_quant_variants.py [--variants a,b]

About 2 minutes for every variant on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import gpu_quant_ab as ab  # noqa: E402
import gpu_quant_variants as gv  # noqa: E402

REORDERS_SUMS = {"sub16", "stats_fast_sub8"}


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("set TRITON_INTERPRET=1: this runs the kernels in Triton's interpreter")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(gv.VARIANTS))
    a = ap.parse_args()
    ab.PRESETS.clear()
    ab.PRESETS.update({"tiny-d128": (1, 2, 1100, 128), "tiny-d64": (1, 2, 1100, 64)})
    make_qkv = ab.make_qkv
    ab.make_qkv = lambda *args, device=None, **kw: make_qkv(*args, device="cpu", **kw)
    gv.time_ms = lambda run: 0.0
    gv._profile = lambda run: {}
    gv.record_env = lambda **kw: None
    torch.cuda.empty_cache = lambda: None
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "variants.json")
        sys.argv = [sys.argv[0], "--variants", a.variants, "--presets", ",".join(ab.PRESETS),
                    "--out", out]
        gv.main()
        with open(out) as f:
            rows = [r for r in json.load(f) if "variant" in r]
    bad = [(r["preset"], r["variant"]) for r in rows
           if not r["bitwise_equal"] and r["variant"] not in REORDERS_SUMS]
    print(f"{len(rows)} rows, bitwise_equal false (not allowed): {bad or 'none'}")
    return 1 if bad or not rows else 0


if __name__ == "__main__":
    raise SystemExit(main())
