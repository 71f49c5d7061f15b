"""One H200 call: the quantization's layout knobs against the defaults, same process, same
inputs (session 12; session 24's blocks per program and paths for finite data).

    python3 benchmarks/gpu_quant_variants.py [--variants base,no_prefetch,...] [--out FILE]

Per preset and variant: ``quant.quantize_stage`` (all its launches, as ``fp8dit.attention``
runs them with the warp-specialized kernel's plan) timed twice, interleaved with the other
variants (median of 20 CUDA-event timings each), a torch.profiler breakdown per kernel, and
the workspace compared bitwise with the defaults' (the knobs only cut the work differently;
a different statistics sub-tile, ``sub16`` or ``stats_fast_sub8``, reorders the sums of the
means, so those two may differ in last bits), and each launch's TB/s by its least traffic.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from fp8dit import quant
from fp8dit.recipes import get_recipe

sys.path.insert(0, os.path.dirname(__file__))
from gpu_gluon import record, record_env, write_rows  # noqa: E402
from gpu_quant_ab import PRESETS, _profile, same_bits, stage_run  # noqa: E402
from gpu_quant_warps import time_ms  # noqa: E402

# name -> fp8dit.quant attributes to set (dict entries are merged into the dicts)
VARIANTS = {
    "base": {},
    "no_prefetch": {"KV_STATS_PREFETCH": False},
    "sub16": {"KV_STATS_SUB_ELEMS": 2048},
    "q64": {"Q_QUANT_ROWS": {128: 64}},
    "kv64": {"KV_QUANT_ROWS": {128: 64}},
    "kv32_d64": {"KV_QUANT_ROWS": {64: 32}},
    "kv128_d64": {"KV_QUANT_ROWS": {64: 128}},
    # session 24: programs walking several blocks, the next one's loads issued first
    "q_it2": {"Q_QUANT_ITERS": {128: 2, 64: 2}},
    "q_it4": {"Q_QUANT_ITERS": {128: 4, 64: 4}},
    "q_it8": {"Q_QUANT_ITERS": {128: 8, 64: 8}},
    "kv_it2": {"KV_QUANT_ITERS": {128: 2, 64: 2}},
    "kv_it4": {"KV_QUANT_ITERS": {128: 4, 64: 4}},
    "kv_it8": {"KV_QUANT_ITERS": {128: 8, 64: 8}},
    "both_it4": {"Q_QUANT_ITERS": {128: 4, 64: 4}, "KV_QUANT_ITERS": {128: 4, 64: 4}},
    # session 24: unmasked / untested paths for finite data (fewer instructions per byte)
    "stats_fast": {"KV_STATS_FULL_FAST": True},
    "stats_fast_sub8": {"KV_STATS_FULL_FAST": True, "KV_STATS_SUB_ELEMS": 1024},
    "q_fast": {"Q_QUANT_FINITE_FAST": True},
    "kv_fast": {"KV_QUANT_FINITE_FAST": True},
    "all_fast": {"KV_STATS_FULL_FAST": True, "Q_QUANT_FINITE_FAST": True,
                 "KV_QUANT_FINITE_FAST": True},
    "all_fast_q_it4": {"KV_STATS_FULL_FAST": True, "Q_QUANT_FINITE_FAST": True,
                       "KV_QUANT_FINITE_FAST": True, "Q_QUANT_ITERS": {128: 4, 64: 4}},
    # session 25: quantize_kv starting where the statistics pass ended (L2 reuse)
    "kv_rev": {"KV_QUANT_REVERSE": True},
    "all_fast_rev": {"KV_STATS_FULL_FAST": True, "Q_QUANT_FINITE_FAST": True,
                     "KV_QUANT_FINITE_FAST": True, "KV_QUANT_REVERSE": True},
}


def _defaults():
    return {name: (dict(v) if isinstance(v, dict) else v)
            for name, v in vars(quant).items()
            if name in {a for var in VARIANTS.values() for a in var}}


def _dram_bytes(preset) -> dict:
    """Bytes each launch must move at least (bf16 in, int8 / fp8 out; HND, one sequence)."""
    B, H, S, D = PRESETS[preset]
    n = B * H * S * D
    return {"kv_channel_stats": 4 * n, "quantize_kv": 4 * n + 2 * n,
            "quantize_q": 2 * n + n + 8 * B * H * S}


def _tbps(per_kernel_ms, preset) -> dict:
    """TB/s each launch reached, by its minimum traffic (``_dram_bytes``)."""
    out = {}
    for name, ms in per_kernel_ms.items():
        for prefix, nbytes in _dram_bytes(preset).items():
            if name.startswith(prefix) and ms:
                out[prefix] = round(nbytes / (ms * 1e-3) / 1e12, 2)
    return out


def _use(defaults, variant):
    for name, val in defaults.items():
        cur = getattr(quant, name)
        if isinstance(val, dict):
            cur.clear()
            cur.update(val)
        else:
            setattr(quant, name, val)
    for name, val in VARIANTS[variant].items():
        if isinstance(val, dict):
            getattr(quant, name).update(val)
        else:
            setattr(quant, name, val)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--layout", default="HND", choices=("HND", "NHD"))
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    names = a.variants.split(",")
    os.environ["FP8DIT_KERNEL"] = "gluon-ws"
    rec = get_recipe(None)
    defaults = _defaults()
    record_env(defaults=defaults, layout=a.layout)
    for preset in a.presets.split(","):
        run = stage_run(preset, rec, a.layout)
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
            per_kernel = _profile(run)
            record(part="quant", preset=preset, variant=n, ms=ms[n], per_kernel_ms=per_kernel,
                   per_kernel_tbps=_tbps(per_kernel, preset),
                   bitwise_equal=all(same_bits(ref, ws).values()))
            del ws
        _use(defaults, "base")
        del run, ref
        torch.cuda.empty_cache()
    write_rows(a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
