"""One H200 call: what the rotary embedding fused into the quantization costs, kernel by kernel,
and this tree's quantization kernels against a previous revision's with it.

    git show REV:src/fp8dit/kernels/quantize.py > benchmarks/_quantize_prev.py   # untracked
    python3 benchmarks/gpu_quant_rope.py --prev prev=benchmarks/_quantize_prev.py [--out F]

(``--prev NAME=FILE`` again for more variants; the device call must ``carry`` the files.)

Per case, in diffusers' NHD layout (``quant.quantize_stage`` as ``fp8dit.attention`` runs it
with the warp-specialized kernel's plan):
- ``rope``: the tables handed to the quantization (``rope_tables``), q and k unrotated;
- ``plain``: q and k rotated first (``rope.apply_rope``), no tables: the quantization alone.
Each with every revision's kernels, timed in turn twice (median of 20 CUDA-event timings), a
torch.profiler breakdown per kernel, and the workspaces compared bitwise (rope against plain:
the fusion's promise; the tree against each variant with tables).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys

import torch

from fp8dit import launch, quant
from fp8dit import plan as plan_mod
from fp8dit.recipes import get_recipe
from fp8dit.rope import Rotary, apply_rope, rope_tables
from fp8dit.testing import make_qkv

sys.path.insert(0, os.path.dirname(__file__))
from gpu_gluon import record, record_env, write_rows  # noqa: E402
from gpu_quant_ab import KERNELS, _load_prev, _profile, _use, same_bits  # noqa: E402
from gpu_quant_warps import time_ms  # noqa: E402

# name: (B, H, S, D, style, table dtype, first rotated token)
CASES = {
    "wan2.2-a14b-720p": (1, 40, 75600, 128, "wan", torch.bfloat16, 0),
    "cogvideox-5b": (2, 48, 17776, 64, "apply_rotary_emb", torch.float32, 226),
}


def _tables(S, D, start, style, dtype, device):
    """Rotary tables of the models' form: each pair's angle repeated in both columns."""
    rows = S - start
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device=device, dtype=torch.float64) / D))
    ang = torch.arange(rows, device=device, dtype=torch.float64)[:, None] * inv[None, :]
    cos = ang.cos().repeat_interleave(2, -1).to(dtype)
    sin = ang.sin().repeat_interleave(2, -1).to(dtype)
    return Rotary(cos, sin, start, style)


def case_runs(name, rec, device="cuda"):
    """(run with tables, run of pre-rotated q and k) for ``name``: partials of
    ``quant.quantize_stage``."""
    B, H, S, D, style, dtype, start = CASES[name]
    q, k, v = make_qkv(B, H, S, D, device=device, seed=0, layout="NHD")
    rot = _tables(S, D, start, style, dtype, q.device)
    tabs = rope_tables(rot)
    qr, kr = apply_rope(q, tabs, start, "NHD"), apply_rope(k, tabs, start, "NHD")
    st = launch._bthd_strides(q, "NHD")
    plan_mod.clear_plan_cache()
    plan, _ = launch.plan_for([S] * B, [S] * B, varlen=False, num_heads=H, num_kv_heads=H,
                              head_dim=D, is_causal=False, device=q.device, recipe=rec)
    run = functools.partial(quant.quantize_stage, plan, rec, 1.0 / math.sqrt(D),
                            kv_perm16=True)
    return (functools.partial(run, q, st, k, st, v, st, rope=tabs, rope_start=start),
            functools.partial(run, qr, st, kr, st, v, st))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prev", action="append", default=[],
                    help="NAME=FILE: a variant's kernels/quantize.py (repeatable; one that reads "
                         "the tables in another form than this tree's rope_tables cannot run)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_quant_rope: no CUDA device; nothing measured")
        return 2
    impls = {}
    for spec in a.prev:
        name, _, path = spec.partition("=")
        mod = _load_prev(path)
        impls[name] = {n: getattr(mod, n) for n in KERNELS}
    impls["new"] = {n: getattr(quant, n) for n in KERNELS}
    os.environ["FP8DIT_KERNEL"] = "gluon-ws"
    rec = get_recipe(None)
    record_env(variants=a.prev)
    for name in CASES:
        runs = dict(zip(("rope", "plain"), case_runs(name, rec)))
        ms, wss, prof = {}, {}, {}
        for impl in list(impls) * 2:
            _use(impls[impl])
            for path, run in runs.items():
                ms.setdefault(f"{impl}-{path}", []).append(round(time_ms(run), 4))
                wss[impl, path] = run()
        for impl in impls:
            _use(impls[impl])
            for path, run in runs.items():
                prof[f"{impl}-{path}"] = _profile(run)
        record(part="quant-rope", case=name, ms=ms, per_kernel_ms=prof,
               new_vs_variant_rope={i: same_bits(wss["new", "rope"], wss[i, "rope"])
                                    for i in impls if i != "new"},
               rope_vs_plain=same_bits(wss["new", "rope"], wss["new", "plain"]))
        _use(impls["new"])
        del runs, wss
        torch.cuda.empty_cache()
    write_rows(a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
