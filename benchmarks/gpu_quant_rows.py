"""One H200 call: the K/V quantizer's programs of 128 or 256 rows with 256-key kv blocks.

    python3 benchmarks/gpu_quant_rows.py [--out F]

With the warp-specialized kernel's 256-key blocks and one K scale per block, ``quantize_kv``
either runs programs spanning the block (256 rows, ``quant.KV_QUANT_ROWS`` 0) or 128-row
programs that take the block's K amax from the statistics pass (``KAMAX_FROM_STATS``). This
times ``quant.quantize_stage`` (all its launches) per variant (also: stats chunk 256 or 512,
stats warps 4 or 8), twice each, and checks the workspaces against the 256-row one bitwise
(a 256-token chunk sums the channel means in another order, so those differ in the last bit).

Run s8-1/s8-2 ran this file as ``benchmarks/gpu_pv_overlap.py`` (commit 0aeacbf), which also
checked and timed an opt-in D=64 loop with PV under the next softmax (slower, removed).
"""

from __future__ import annotations

import functools
import math
import os
import sys

import torch

from fp8dit import launch, quant
from fp8dit import plan as plan_mod
from fp8dit.recipes import get_recipe
from fp8dit.testing import make_qkv

sys.path.insert(0, os.path.dirname(__file__))
import gpu_gluon  # noqa: E402
from gpu_gluon import record  # noqa: E402
from gpu_quant_warps import time_ms  # noqa: E402

# name -> (rows per program, stats chunks offered, stats warps); run s8-1 timed the first two
# (Wan 720p 3.67-3.74 / 3.22-3.24 ms), run s8-2 all
QUANT_VARIANTS = {
    "rows256": (0, plan_mod.STATS_CHUNKS, 4),
    "rows128-c512": (128, plan_mod.STATS_CHUNKS, 4),
    "rows128-c256": (128, (256, 128, 64), 4),
    "rows128-c256-w8": (128, (256, 128, 64), 8),
    "rows128-c512-w8": (128, plan_mod.STATS_CHUNKS, 8),
}


def part_quant():
    os.environ["FP8DIT_KERNEL"] = "gluon-ws"
    rec = get_recipe(None)
    presets = {"wan2.2-a14b-720p": (1, 40, 75600, 128), "wan2.1-1.3b-480p": (1, 12, 32760, 128),
               "cogvideox-5b": (2, 48, 17776, 64)}
    saved = dict(quant.KV_QUANT_ROWS), plan_mod.STATS_CHUNKS, quant.KV_STATS_WARPS
    for name, (B, H, S, D) in presets.items():
        q, k, v = make_qkv(B, H, S, D, device="cuda", seed=0, layout="HND")
        st = launch._bthd_strides(q, "HND")
        wss, res = {}, {}
        for vname in (*QUANT_VARIANTS, *QUANT_VARIANTS):
            rows, plan_mod.STATS_CHUNKS, quant.KV_STATS_WARPS = QUANT_VARIANTS[vname]
            quant.KV_QUANT_ROWS[D] = rows
            plan_mod.clear_plan_cache()
            plan, _ = launch.plan_for([S] * B, [S] * B, varlen=False, num_heads=H,
                                      num_kv_heads=H, head_dim=D, is_causal=False,
                                      device=q.device, recipe=rec)
            run = functools.partial(quant.quantize_stage, plan, rec, 1.0 / math.sqrt(D), q, st,
                                    k, st, v, st, kv_perm16=True)
            res.setdefault(vname, []).append(round(time_ms(run), 4))
            res[vname + "_chunk"] = plan.stats_chunk
            wss[vname] = run()
        ref = wss["rows256"]
        same = {vn: all(torch.equal(getattr(ref, n).view(torch.uint8),
                                    getattr(ws, n).view(torch.uint8))
                        for n in ("q8", "q_scale", "k8", "k_scale", "v8t", "v_scale"))
                for vn, ws in wss.items()}
        record(part="quant", preset=name, ms=res, bitwise_equal_to_rows256=same)
        del q, k, v, wss
        torch.cuda.empty_cache()
    rows, plan_mod.STATS_CHUNKS, quant.KV_STATS_WARPS = saved
    quant.KV_QUANT_ROWS.clear()
    quant.KV_QUANT_ROWS.update(rows)
    plan_mod.clear_plan_cache()
    os.environ["FP8DIT_KERNEL"] = "auto"


def main() -> int:
    return gpu_gluon.run_parts(globals(), "quant")


if __name__ == "__main__":
    raise SystemExit(main())
