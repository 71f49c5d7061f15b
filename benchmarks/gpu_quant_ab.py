"""One H200 call: the quantization launches of this tree against a previous revision's, same
process, same inputs (session 11: the statistics pass without its non-finite count, the K/V
quantizer with V's load asked for before K's work).

    git show REV:src/fp8dit/kernels/quantize.py > benchmarks/_quantize_prev.py   # untracked
    python3 benchmarks/gpu_quant_ab.py --prev benchmarks/_quantize_prev.py

Per preset: ``quant.quantize_stage`` (all its launches, as ``fp8dit.attention`` runs them with
the warp-specialized kernel's plan) timed with each revision's kernels in turn, twice each
(median of 20 CUDA-event timings), the workspaces compared bitwise, and a torch.profiler
breakdown per kernel for both.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import math
import os
import sys

import torch

import fp8dit.kernels
from fp8dit import launch, quant
from fp8dit import plan as plan_mod
from fp8dit.recipes import get_recipe
from fp8dit.testing import make_qkv

sys.path.insert(0, os.path.dirname(__file__))
from gpu_gluon import record, record_env  # noqa: E402
from gpu_quant_warps import time_ms  # noqa: E402

KERNELS = ("kv_channel_stats_kernel", "kv_stats_finalize_kernel", "quantize_kv_kernel",
           "quantize_q_kernel")
PRESETS = {"wan2.2-a14b-720p": (1, 40, 75600, 128), "wan-480p": (1, 40, 32760, 128),
           "wan2.1-1.3b-480p": (1, 12, 32760, 128), "cogvideox-5b": (1, 48, 17776, 64)}
WS_NAMES = ("q8", "q_scale", "q_corr", "k8", "k_scale", "v8t", "v_scale", "v_mean")


def _load_prev(path):
    # as a module of the kernels package, so its relative imports resolve
    spec = importlib.util.spec_from_file_location("fp8dit.kernels._quantize_prev", path,
                                                  submodule_search_locations=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = fp8dit.kernels.__name__
    spec.loader.exec_module(mod)
    return mod


def stage_run(preset, rec, layout="HND"):
    """``quant.quantize_stage`` as ``fp8dit.attention`` runs it with the warp-specialized
    kernel's plan, on fresh inputs of ``preset`` in ``layout`` (the strides describe the layout
    made; NHD is what diffusers hands over)."""
    B, H, S, D = PRESETS[preset]
    q, k, v = make_qkv(B, H, S, D, device="cuda", seed=0, layout=layout)
    st = launch._bthd_strides(q, layout)
    plan_mod.clear_plan_cache()
    plan, _ = launch.plan_for([S] * B, [S] * B, varlen=False, num_heads=H, num_kv_heads=H,
                              head_dim=D, is_causal=False, device=q.device, recipe=rec)
    return functools.partial(quant.quantize_stage, plan, rec, 1.0 / math.sqrt(D), q, st,
                             k, st, v, st, kv_perm16=True)


def same_bits(a, b) -> dict:
    """Per workspace buffer (``WS_NAMES``): whether two quantization workspaces hold the same
    bytes."""
    return {n: torch.equal(getattr(a, n).view(torch.uint8), getattr(b, n).view(torch.uint8))
            for n in WS_NAMES}


def _use(kernels):
    for name in KERNELS:
        setattr(quant, name, kernels[name])


def _profile(run):
    from torch.profiler import ProfilerActivity, profile
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            run()
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        if any(ev.key.startswith(k) for k in KERNELS):
            out[ev.key] = round(ev.device_time_total / 5 / 1000, 4)  # ms per call
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prev", required=True)
    a = ap.parse_args()
    prev = _load_prev(a.prev)
    impls = {"prev": {n: getattr(prev, n) for n in KERNELS},
             "new": {n: getattr(quant, n) for n in KERNELS}}
    os.environ["FP8DIT_KERNEL"] = "gluon-ws"
    rec = get_recipe(None)
    record_env(prev=a.prev)
    for name in PRESETS:
        run = stage_run(name, rec)
        ms, wss, prof = {}, {}, {}
        for impl in ("prev", "new", "prev", "new"):
            _use(impls[impl])
            ms.setdefault(impl, []).append(round(time_ms(run), 4))
            wss[impl] = run()
        for impl in ("prev", "new"):
            _use(impls[impl])
            prof[impl] = _profile(run)
        record(part="quant", preset=name, ms=ms, per_kernel_ms=prof,
               bitwise_equal=same_bits(wss["prev"], wss["new"]))
        _use(impls["new"])
        del run, wss
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
