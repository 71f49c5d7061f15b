"""One H200 call: what a work item costs the warp-specialized kernel beyond its kv steps.

    python3 benchmarks/gpu_item_overhead.py [--out F]

Why: each program of the persistent kernel runs a list of work items (128 query rows x a kv
range); between two items both consumer warpgroups write their rows out, load the next item's
fields and Q scales, and wait for its Q tile, while the tensor cores idle. At Wan 720p an item
is ~296 steps of 256 keys, at CogVideoX ~70, at Flux 1024 ~18: if an item boundary costs a few
microseconds, the short presets lose several percent to it, and a prefetch of the next item
(its fields, Q scales, a second Q buffer) would win it back.

Per shape (one sequence length per row, no split-KV: ``partials`` must be 0 for the fit):
the kernel alone (``fp8dit bench``'s ``fp8dit-kernel`` backend, inputs pre-quantized), the
mean SM clock, and the plan's busiest program (its kv steps and items). Then per head dim a
least-squares fit of SM clocks = a * steps + b * items over the shapes: ``a`` is the clocks of
one 256-key step, ``b`` the clocks of one item boundary.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

from fp8dit import bench
from fp8dit.launch import plan_for
from fp8dit.presets import parse_shape

sys.path.insert(0, os.path.dirname(__file__))
from gpu_gluon import record, run_parts  # noqa: E402

# (B, H, S, D): D=64 at CogVideoX's 48 heads, D=128 at Flux's / HunyuanVideo's 24; lengths
# where the plan hands out whole items (no split-KV) and items run 40-260 steps.
SHAPES = {
    64: [(1, 48, 12288, 64), (2, 48, 17776, 64), (1, 48, 32768, 64), (1, 48, 49152, 64),
         (1, 48, 65536, 64)],
    128: [(1, 24, 16896, 128), (1, 24, 24576, 128), (1, 24, 32768, 128), (1, 24, 49152, 128),
          (1, 24, 65536, 128)],
}


def _busiest(B, H, S, D):
    plan, _ = plan_for([S] * B, [S] * B, varlen=False, num_heads=H, num_kv_heads=H,
                       head_dim=D, is_causal=False, device=torch.device("cuda"))
    items = np.diff(plan.work_indptr)
    j = int(np.argmax(plan.program_loads))
    return int(plan.program_loads[j]), int(items[j]), int(plan.n_partials), plan.key.block_n


def part_sweep():
    dev = torch.device("cuda")
    for d, shapes in SHAPES.items():
        pts = []
        for B, H, S, D in shapes:
            steps, items, partials, bn = _busiest(B, H, S, D)
            rows = bench.bench_shape(
                parse_shape(f"{B},{H},{S},{D}"), ["fp8dit-kernel"], device=dev, recipe=None,
                layout="HND", family="normal", seed=0, n_sets=2, warmup=5, repeats=30,
                max_ms=1500.0, rounds=2)
            r = rows[0]
            if r.ms is None:
                record(part="sweep", shape=[B, H, S, D], error=r.error)
                continue
            mhz = r.sm_clock_mhz
            clocks = r.ms * 1e3 * mhz if mhz else None
            record(part="sweep", shape=[B, H, S, D], block_n=bn, steps=steps, items=items,
                   steps_per_item=round(steps / items, 1), partials=partials, ms=r.ms,
                   tflops=r.tflops, mhz=mhz, clocks=clocks,
                   clocks_per_step=clocks / steps if clocks else None)
            if clocks and partials == 0:
                pts.append((steps, items, clocks))
        if len(pts) >= 3:
            a_mat = np.array([[s, i] for s, i, _ in pts], dtype=float)
            y = np.array([c for _, _, c in pts])
            (a, b), *_ = np.linalg.lstsq(a_mat, y, rcond=None)
            resid = y - a_mat @ np.array([a, b])
            record(part="fit", head_dim=d, clocks_per_step=a, clocks_per_item=b,
                   max_rel_resid=float(np.max(np.abs(resid) / y)), n=len(pts))


# Fewer programs than SMs: the busiest program's time per kv step. If the full-width step at
# D=128 (~2.2 us whatever the SM clock, 1,843-1,980 MHz in the sweep) is bound by the K/V feed
# from L2 (64 KB per step and SM, ~3.9 TB/s for 132 SMs), it shortens when fewer SMs share that
# feed; if it is bound inside the SM, it stays. D=64 (half the bytes per step) is the control.
PROGRAM_SHAPES = [(1, 24, 32768, 128), (2, 48, 17776, 64)]
PROGRAMS = (132, 112, 88, 66, 33)


def part_programs():
    import functools

    from fp8dit import launch

    dev = torch.device("cuda")
    full = launch.plan_for
    try:
        for B, H, S, D in PROGRAM_SHAPES:
            for n in PROGRAMS if D == 128 else (132, 66):
                launch.plan_for = functools.partial(full, num_programs=n)
                plan, _ = launch.plan_for([S] * B, [S] * B, varlen=False, num_heads=H,
                                          num_kv_heads=H, head_dim=D, is_causal=False,
                                          device=dev)
                j = int(np.argmax(plan.program_loads))
                steps = int(plan.program_loads[j])
                rows = bench.bench_shape(
                    parse_shape(f"{B},{H},{S},{D}"), ["fp8dit-kernel"], device=dev,
                    recipe=None, layout="HND", family="normal", seed=0, n_sets=2, warmup=3,
                    repeats=20, max_ms=1500.0, rounds=2)
                r = rows[0]
                if r.ms is None:
                    record(part="programs", shape=[B, H, S, D], programs=n, error=r.error)
                    continue
                us = r.ms * 1e3 / steps
                kv_bytes = 2 * plan.key.block_n * plan.head_dim_padded  # K and V^T, fp8
                record(part="programs", shape=[B, H, S, D], programs=n, steps=steps,
                       partials=plan.n_partials, ms=r.ms, mhz=r.sm_clock_mhz,
                       us_per_step=us, clocks_per_step=us * r.sm_clock_mhz if r.sm_clock_mhz
                       else None, kv_tb_per_s=n * kv_bytes / us / 1e6)
    finally:
        launch.plan_for = full


def main() -> int:
    return run_parts(globals(), "sweep,programs")


if __name__ == "__main__":
    raise SystemExit(main())
