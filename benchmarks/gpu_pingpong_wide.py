"""One H200 call: the two consumer warpgroups of the 256-key loop taking turns at the tensor
cores (``sm90_pingpong``), against the free-running default.

    python3 benchmarks/gpu_pingpong_wide.py [--parts check,speed] [--out F]

Why (benchmarks/NOTES.md, session 21): a 256-key step takes ~4,100 SM clocks at D=128 and
at D=64 alike, about QK (1,024 clocks of tensor work for both warpgroups) + both softmaxes at
once (2,048 clocks of MUFU exponentials) + PV (1,024): the warpgroups look to run in phase.
Taking turns (FlashAttention-3's ping-pong, tried in session 4 with 128-key steps: 3% slower)
should put one warpgroup's PV and next QK under the other's softmax. ``check``: the 13 cases and
varlen against fp64 under both loops; ``speed``: Wan 720p / 480p, CogVideoX, default timed
before and after.
"""

from __future__ import annotations

import functools
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import gpu_gluon  # noqa: E402

from fp8dit import launch  # noqa: E402

DEFAULT_TILES = {dp: dict(t) for dp, t in launch.WS_TILES.items()}
TILINGS = {
    "default": ("gluon-ws", DEFAULT_TILES),
    "pingpong": ("gluon-ws", {dp: {**t, "sm90_pingpong": True}
                              for dp, t in DEFAULT_TILES.items()}),
    "triton": ("triton", DEFAULT_TILES),  # gpu_gluon's reference; restores the defaults
}
use = functools.partial(gpu_gluon.use_tiling, TILINGS)
VARIANTS = {t: functools.partial(use, t) for t in TILINGS}


def part_check():
    gpu_gluon.part_check(VARIANTS)


def part_speed():
    gpu_gluon.part_speed(["wan2.2-a14b-720p", "wan-480p", "cogvideox-5b"], VARIANTS,
                         ("default", "pingpong", "default", "pingpong"))


def main() -> int:
    return gpu_gluon.run_parts(globals(), "check,speed",
                               after_part=functools.partial(use, "triton"))


if __name__ == "__main__":
    raise SystemExit(main())
