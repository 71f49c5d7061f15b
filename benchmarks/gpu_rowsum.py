"""One H200 call: P's row sums on the tensor cores, and one or two K scales per 256-key step.

    python3 benchmarks/gpu_rowsum.py [--parts check,drift,speed] [--out $OUT/rowsum.json]

The warp-specialized kernel's 256-key step (``attention_sm90_ws._consumer_step_wide``) sums
each row of P with 128 FADDs and a shuffle reduction per thread. ``sm90_rowsum_mma`` has the
tensor cores do it instead: the stored fp8 P times a [128, 8] tile of ones, two n8 dots
issued after the PV dots (sm_90 SASS of triton 3.6: 941 -> 858 instructions per step at
D=128, 902 -> 801 at D=64; an [N, 128] tile, N = 8 or 16). ``launch.K_SCALE_KEYS`` picks
one K scale per 128 keys (the quantizer's sub-blocks, two per step) or per 256.

check:  gpu_gluon's cases (odd lengths, GQA, causal, split-KV, D=64/72, varlen with an empty
        sequence), each variant against fp64 and against the Triton kernel.
drift:  8k and 200k tokens, normal and DiT-like.
speed:  SDPA cuDNN and each variant at the long presets, interleaved, cuDNN again.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import sys

import torch
import triton

from fp8dit import launch

sys.path.insert(0, os.path.dirname(__file__))
import gpu_gluon  # noqa: E402
from gpu_gluon import ROWS, record  # noqa: E402

DEFAULT_TILES = {dp: dict(t) for dp, t in launch.WS_TILES.items()}
DEFAULT_K_SCALE_KEYS = launch.K_SCALE_KEYS


def _tiles(rowsum: int, stages64: int = 2) -> dict:
    return {64: dict(block_n=256, sm90_stages=stages64, sm90_rowsum_mma=rowsum),
            128: dict(block_n=256, sm90_stages=2, sm90_rowsum_mma=rowsum)}


# name -> (kernel, WS_TILES, K_SCALE_KEYS); "triton" last: gpu_gluon's reference, whose setup
# also restores the defaults. "-rsN": row sums by a dot with an [N, 128] tile of ones (run
# s7-2: N=8 gave wrong sums, see gluon_small_n_probe.py).
VARIANTS_SPEC = {
    "k256": ("gluon-ws", _tiles(0), 256),
    "k128-rs8": ("gluon-ws", _tiles(8), 128),
    "k256-rs16": ("gluon-ws", _tiles(16), 256),
    "k128-rs16": ("gluon-ws", _tiles(16), 128),
    "triton": ("triton", DEFAULT_TILES, DEFAULT_K_SCALE_KEYS),
}
# timed only
SPEED_ONLY = {"k128": ("gluon-ws", _tiles(0), 128)}


def use(name):
    kname, tiles, k_keys = {**VARIANTS_SPEC, **SPEED_ONLY}[name]
    os.environ["FP8DIT_KERNEL"] = kname
    launch.WS_TILES.clear()
    launch.WS_TILES.update({dp: dict(t) for dp, t in tiles.items()})
    launch.K_SCALE_KEYS = k_keys


VARIANTS = {t: functools.partial(use, t) for t in VARIANTS_SPEC}


def part_check():
    gpu_gluon.part_check(VARIANTS)


def part_drift():
    gpu_gluon.part_drift(VARIANTS, lengths=(8192, 200000))


def part_speed():
    timed = {**VARIANTS, **{t: functools.partial(use, t) for t in SPEED_ONLY}}
    gpu_gluon.part_speed(["wan2.2-a14b-720p", "wan-480p", "hunyuanvideo-720p", "cogvideox-5b"],
                         timed, ("k256", "k128-rs16", "k256-rs16", "k128-rs8", "k128", "k256",
                                 "k128-rs16"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="check,drift,speed")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    record(part="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__,
           triton=triton.__version__, commit=os.environ.get("FP8DIT_COMMIT", ""),
           date=datetime.datetime.now().isoformat(timespec="seconds"))
    for part in a.parts.split(","):
        try:
            globals()[f"part_{part}"]()
        except Exception as e:  # noqa: BLE001 - keep the other parts' results
            record(part=part, error=f"{type(e).__name__}: {e}"[:600])
    if a.out:
        with open(a.out, "w") as f:
            json.dump(ROWS, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
