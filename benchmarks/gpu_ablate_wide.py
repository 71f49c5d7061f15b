"""One H200 call: what the accuracy recipe's per-score work costs in the 256-key loop.

    python3 benchmarks/gpu_ablate_wide.py [--parts speed] [--out F]

Timing only, wrong results (``sm90_ablate_misc`` bits in ``_consumer_step_wide``):
``nopreset`` (1): the int32 QK accumulators start at zero, not at the magic constant that
turns them into floats for free (128 IMAD.MOV less per step at D=128: 923 -> 795 instructions);
``nofold`` (2): the block's PV sum is not folded into the fp32 sum (64 FFMA less: 844);
``neither`` (3): both (716). The gap to ``default`` bounds what a recipe without the int8 QK
preset or without the two-level PV sum could gain.
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
    **{name: ("gluon-ws", {dp: {**t, "sm90_ablate_misc": bits}
                           for dp, t in DEFAULT_TILES.items()})
       for name, bits in (("nopreset", 1), ("nofold", 2), ("neither", 3))},
    "triton": ("triton", DEFAULT_TILES),  # gpu_gluon's reference; restores the defaults
}
use = functools.partial(gpu_gluon.use_tiling, TILINGS)
VARIANTS = {t: functools.partial(use, t) for t in TILINGS}


def part_speed():
    gpu_gluon.part_speed(["wan2.2-a14b-720p", "cogvideox-5b"], VARIANTS,
                         ("default", "nopreset", "nofold", "neither", "default"))


def main() -> int:
    return gpu_gluon.run_parts(globals(), "speed", after_part=functools.partial(use, "triton"))


if __name__ == "__main__":
    raise SystemExit(main())
