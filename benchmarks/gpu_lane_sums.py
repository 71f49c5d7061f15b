"""One H200 call: the 256-key loop with per-thread row sums and one max exchange per step.

    python3 benchmarks/gpu_lane_sums.py [--parts check,speed,repeat] [--out F]

``default``: ``launch.WS_TILES`` as shipped. ``lane``: ``sm90_lane_sums``: each thread keeps
its own partial row sums ([64, 4] per warpgroup: one per lane of a row's quad) until the work
item ends, and the block's max is taken over both 128-key halves inside the thread before the
one exchange within the quad: 16 -> 4 shuffles per step, 923 -> 899 instructions at D=128
(sm_90 SASS, triton 3.6), 892 -> ~870 at D=64. The sums are added in another order, so the
outputs differ from the default's in fp32 rounding only.

check:  ``gpu_gluon.part_check`` (fp64 and the Triton kernel) for default and lane.
speed:  DiT presets, default and lane twice each in one process, cuDNN before and after.
repeat: 10 calls bitwise equal at 40k tokens, D=128 and D=64, with and without a 3-way split.
"""

from __future__ import annotations

import functools
import os
import sys

import torch

import fp8dit
from fp8dit import launch
from fp8dit.testing import make_qkv

sys.path.insert(0, os.path.dirname(__file__))
import gpu_gluon  # noqa: E402
from gpu_gluon import record  # noqa: E402

DEFAULT_TILES = {dp: dict(t) for dp, t in launch.WS_TILES.items()}
TILINGS = {
    "default": ("gluon-ws", DEFAULT_TILES),
    "lane": ("gluon-ws", {dp: {**t, "sm90_lane_sums": True} for dp, t in DEFAULT_TILES.items()}),
    "triton": ("triton", DEFAULT_TILES),  # gpu_gluon's reference; restores the defaults
}
use = functools.partial(gpu_gluon.use_tiling, TILINGS)
VARIANTS = {t: functools.partial(use, t) for t in TILINGS}


def part_check():
    gpu_gluon.part_check(VARIANTS)


def part_speed():
    gpu_gluon.part_speed(["wan2.2-a14b-720p", "wan-480p", "hunyuanvideo-720p", "cogvideox-5b"],
                         VARIANTS, ("default", "lane", "default", "lane"))


def part_repeat():
    for D in (128, 64):
        q, k, v = make_qkv(1, 4, 40000, D, device="cuda", seed=5)
        use("lane")
        for splits in (None, 3):
            outs = [fp8dit.attention(q, k, v, backend="fp8", num_splits=splits)
                    for _ in range(10)]
            record(part="repeat", tiling="lane", D=D, splits=splits,
                   bitwise_equal_10=all(torch.equal(outs[0], o) for o in outs[1:]))
    use("triton")


def main() -> int:
    return gpu_gluon.run_parts(globals(), "check,speed,repeat",
                               after_part=functools.partial(use, "triton"))


if __name__ == "__main__":
    raise SystemExit(main())
