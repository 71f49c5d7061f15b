"""The two-term (precise-LSE) recipe on the H200: LSE and output error, and speed per tile config.

    python3 benchmarks/gpu_two_term.py [--out $OUT/two_term.json]

Accuracy at B1 H4 S8192 D128 (the accuracy issue's shape) on both input families against fp64;
speed at Wan 720p and CogVideoX against SDPA cuDNN in the same process, for the recipe's tiles
(``launch.TWO_TERM_TILES``) and alternatives set through ``launch.TILE_OVERRIDES``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

import fp8dit
from fp8dit import launch
from fp8dit.testing import attention_ref, error_stats, make_qkv

sys.path.insert(0, os.path.dirname(__file__))
from gpu_variants import ROWS, bench, cudnn_fn, fp8_fn, record, rotated, tflops  # noqa: E402

RECIPE = "int8x2qk-fp8pv"
CONFIGS = {
    "recipe tiles": {},
    "bn128-2s": {"block_n": 128, "num_stages": 2},
    "bn128-3s": {"block_n": 128, "num_stages": 3},
    "bn64-3s": {"block_n": 64, "num_stages": 3},
}
PRESETS = {"wan2.2-a14b-720p": (1, 40, 75600, 128), "cogvideox-5b": (2, 48, 17776, 64)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    rec = record
    for fam in ("normal", "dit"):
        q, k, v = make_qkv(1, 4, 8192, 128, family=fam, device="cuda", seed=0)
        ref, lse_ref = attention_ref(q, k, v, return_lse=True)
        for name, over in CONFIGS.items():
            launch.TILE_OVERRIDES[128] = dict(over)
            out, lse = fp8dit.attention(q, k, v, backend="fp8", recipe=RECIPE, return_lse=True)
            st = error_stats(out, ref)
            rec(part="accuracy", family=fam, config=name, rel_l1=st.rel_l1, cos=st.cos,
                lse_max_err=(lse.double() - lse_ref).abs().max().item())
        launch.TILE_OVERRIDES.clear()
    for preset, (B, H, S, D) in PRESETS.items():
        sets = [make_qkv(B, H, S, D, device="cuda", seed=i) for i in range(2)]
        nxt = rotated(sets)
        est = 4 * B * H * S * S * D / 300e12 * 1e3
        cud = bench(cudnn_fn(nxt), est)
        rec(part="speed", preset=preset, backend="sdpa-cudnn", ms=cud)
        for name, over in CONFIGS.items():
            launch.TILE_OVERRIDES[D] = dict(over)
            run = fp8_fn(nxt, RECIPE)
            try:
                run()
                torch.cuda.synchronize()
                ms = bench(run, est)
                rec(part="speed", preset=preset, config=name, ms=ms,
                    tflops=tflops(B, H, S, D, ms), vs_cudnn=cud / ms)
            except Exception as e:  # noqa: BLE001 - a failing config is a result
                rec(part="speed", preset=preset, config=name,
                    error=f"{type(e).__name__}: {e}"[:300])
            launch.TILE_OVERRIDES.clear()
        del sets, nxt
        torch.cuda.empty_cache()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(ROWS, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
