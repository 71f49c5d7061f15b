"""One H200 call: the quantization's layout knobs against the defaults, same process, same
inputs (session 12).

    python3 benchmarks/gpu_quant_variants.py [--variants base,prefetch,...] [--out FILE]

Per preset and variant: ``launch.quantize_stage`` (all its launches, as ``fp8dit.attention``
runs them with the warp-specialized kernel's plan) timed twice, interleaved with the other
variants (median of 20 CUDA-event timings each), a torch.profiler breakdown per kernel, and
the workspace compared bitwise with the defaults' (the knobs only cut the work differently).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys

import torch

from fp8dit import launch
from fp8dit import plan as plan_mod
from fp8dit.recipes import get_recipe
from fp8dit.testing import make_qkv

sys.path.insert(0, os.path.dirname(__file__))
from gpu_gluon import ROWS, record  # noqa: E402
from gpu_quant_ab import PRESETS, WS_NAMES, _profile  # noqa: E402
from gpu_quant_warps import time_ms  # noqa: E402

# name -> launch attributes to set (dict entries are merged into the dicts)
VARIANTS = {
    "base": {},
    "prefetch0": {"KV_STATS_PREFETCH": 0},
    "prefetch2": {"KV_STATS_PREFETCH": 2},
    "sub4": {"KV_STATS_SUB_ELEMS": 512},
    "prefetch2_sub4": {"KV_STATS_PREFETCH": 2, "KV_STATS_SUB_ELEMS": 512},
    "prefetch2_sub16": {"KV_STATS_PREFETCH": 2, "KV_STATS_SUB_ELEMS": 2048},
    "q64": {"Q_QUANT_ROWS": {128: 64}},
    "kv64": {"KV_QUANT_ROWS": {128: 64}},
    "kv32_d64": {"KV_QUANT_ROWS": {64: 32}},
    "kv128_d64": {"KV_QUANT_ROWS": {64: 128}},
}


def _defaults():
    return {name: (dict(v) if isinstance(v, dict) else v)
            for name, v in vars(launch).items()
            if name in {a for var in VARIANTS.values() for a in var}}


def _use(defaults, variant):
    for name, val in defaults.items():
        cur = getattr(launch, name)
        if isinstance(val, dict):
            cur.clear()
            cur.update(val)
        else:
            setattr(launch, name, val)
    for name, val in VARIANTS[variant].items():
        if isinstance(val, dict):
            getattr(launch, name).update(val)
        else:
            setattr(launch, name, val)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    names = a.variants.split(",")
    os.environ["FP8DIT_KERNEL"] = "gluon-ws"
    rec = get_recipe(None)
    defaults = _defaults()
    record(part="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__,
           commit=os.environ.get("FP8DIT_COMMIT", ""), defaults=defaults)
    for preset in a.presets.split(","):
        B, H, S, D = PRESETS[preset]
        q, k, v = make_qkv(B, H, S, D, device="cuda", seed=0, layout="HND")
        st = launch._bthd_strides(q, "HND")
        plan_mod.clear_plan_cache()
        plan, _ = launch.plan_for([S] * B, [S] * B, varlen=False, num_heads=H, num_kv_heads=H,
                                  head_dim=D, is_causal=False, device=q.device, recipe=rec)
        run = functools.partial(launch.quantize_stage, plan, rec, 1.0 / math.sqrt(D), q, st,
                                k, st, v, st, kv_perm16=True)
        ms = {n: [] for n in names}
        for _ in range(2):
            for n in names:
                _use(defaults, n)
                ms[n].append(round(time_ms(run), 4))
        _use(defaults, "base")
        ref = run()
        for n in names:
            _use(defaults, n)
            ws = run()
            same = all(torch.equal(getattr(ref, w).view(torch.uint8),
                                   getattr(ws, w).view(torch.uint8)) for w in WS_NAMES)
            record(part="quant", preset=preset, variant=n, ms=ms[n],
                   per_kernel_ms=_profile(run), bitwise_equal=same)
            del ws
        _use(defaults, "base")
        del q, k, v, ref
        torch.cuda.empty_cache()
    if a.out:
        import json
        with open(a.out, "w") as f:
            json.dump(ROWS, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
