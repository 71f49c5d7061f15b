"""One H200 call: the quantization's time with 256-key kv blocks, by warps per program.

    python3 benchmarks/gpu_quant_warps.py

With the warp-specialized kernel's 256-key blocks the K/V quantizer runs programs of 256 rows
at 32 warps (``quant.tile_warps``) and took 3.7 ms at Wan 720p against 2.5 ms for 128-row
programs (session 6). This times ``quant.quantize_stage`` (all three launches, as the end-to-
end call runs them) with 8, 16 and 32 warps for the 256-row programs, and with one K scale
per 128 keys (128-row programs) for reference. Prints one JSON line per (preset, variant).
"""

from __future__ import annotations

import functools
import json
import math
import os

import torch

from fp8dit import launch, quant
from fp8dit.recipes import get_recipe
from fp8dit.testing import make_qkv

PRESETS = {
    "wan2.2-a14b-720p": (1, 40, 75600, 128),
    "wan2.1-1.3b-480p": (1, 12, 32760, 128),
    "cogvideox-5b": (2, 48, 17776, 64),
}


def time_ms(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


def main() -> int:
    os.environ.setdefault("FP8DIT_KERNEL", "gluon-ws")
    tile_warps = quant.tile_warps
    rec = get_recipe(None)
    for name, (B, H, S, D) in PRESETS.items():
        q, k, v = make_qkv(B, H, S, D, device="cuda", seed=0, layout="HND")
        for variant, warps, k_keys in (("w32", None, 256), ("w16", 16, 256), ("w8", 8, 256),
                                       ("k128", None, 128)):
            quant.K_SCALE_KEYS = k_keys
            quant.tile_warps = (tile_warps if warps is None else
                                  lambda r, c, w=warps: w if r == 256 else tile_warps(r, c))
            try:
                plan, cfg = launch.plan_for([S] * B, [S] * B, varlen=False, num_heads=H,
                                            num_kv_heads=H, head_dim=D, is_causal=False,
                                            device=q.device, recipe=rec)
                st = launch._bthd_strides(q, "HND")
                ms = time_ms(functools.partial(quant.quantize_stage, plan, rec,
                                               1.0 / math.sqrt(D), q, st, k, st, v, st,
                                               kv_perm16=True))
                print(json.dumps(dict(preset=name, variant=variant, block_n=plan.key.block_n,
                                      ms=round(ms, 4))), flush=True)
            except Exception as e:  # noqa: BLE001 - a failure is a result
                print(json.dumps(dict(preset=name, variant=variant,
                                      error=f"{type(e).__name__}: {e}"[:300])), flush=True)
        quant.tile_warps, quant.K_SCALE_KEYS = tile_warps, 256
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
