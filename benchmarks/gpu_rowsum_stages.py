"""One H200 call: the ring depth of the warp-specialized kernel's 256-key loop now that the
row sums come from the tensor cores (session 11; sessions 6 and 8 chose two stages for the
loop with FADD sums: three were 1-2% slower at D=128, 4% at D=64).

    python3 benchmarks/gpu_rowsum_stages.py [--out F]

Each preset's kernel with two and three stages, twice each, cuDNN timed before and after.
"""

from __future__ import annotations

import functools
import os
import sys

from fp8dit import launch

sys.path.insert(0, os.path.dirname(__file__))
import gpu_gluon  # noqa: E402

DEFAULT_TILES = {dp: dict(t) for dp, t in launch.WS_TILES.items()}
TILINGS = {
    "2-stages": ("gluon-ws", DEFAULT_TILES),
    "3-stages": ("gluon-ws", {dp: {**t, "sm90_stages": 3} for dp, t in DEFAULT_TILES.items()}),
    "triton": ("triton", DEFAULT_TILES),  # gpu_gluon's reference; restores the defaults
}
use = functools.partial(gpu_gluon.use_tiling, TILINGS)
VARIANTS = {t: functools.partial(use, t) for t in TILINGS}


def part_speed():
    gpu_gluon.part_speed(["wan2.2-a14b-720p", "hunyuanvideo-720p", "cogvideox-5b"], VARIANTS,
                         ("2-stages", "3-stages", "2-stages", "3-stages"))


def main() -> int:
    return gpu_gluon.run_parts(globals(), "speed", after_part=functools.partial(use, "triton"))


if __name__ == "__main__":
    raise SystemExit(main())
