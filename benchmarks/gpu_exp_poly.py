"""One H200 call: part of the 256-key loop's exponentials on the FMA pipe (polynomial).

    python3 benchmarks/gpu_exp_poly.py [--parts check,speed] [--out F]

``mufu``: the default loop (every exp2 on MUFU). ``eNd``: of every four elements of a thread,
N by a degree-d polynomial (``sm90_exp_mode`` = 10 N + d, kernels/exp2_poly.py), the rest on
MUFU. ``e43``: all by the polynomial (accuracy only). ``noexp``: no exponential at all (timing
only, wrong results): the bound on what taking MUFU off the critical path can give.

check:  ``gpu_gluon.part_check`` (fp64 and the Triton kernel) for mufu, e13, e23, e43.
speed:  DiT presets, each variant in one process with cuDNN before and after.
"""

from __future__ import annotations

import functools
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import gpu_gluon  # noqa: E402

from fp8dit import launch  # noqa: E402

DEFAULT_TILES = {dp: dict(t) for dp, t in launch.WS_TILES.items()}


def _tiles(**kw):
    return {dp: {**t, **kw} for dp, t in DEFAULT_TILES.items()}


TILINGS = {
    "mufu": ("gluon-ws", _tiles(sm90_exp_mode=0)),
    **{f"e{m}": ("gluon-ws", _tiles(sm90_exp_mode=m)) for m in (12, 13, 22, 23, 43)},
    "noexp": ("gluon-ws", _tiles(sm90_exp_mode=-1)),
    "triton": ("triton", DEFAULT_TILES),  # gpu_gluon's reference; restores the defaults
}

use = functools.partial(gpu_gluon.use_tiling, TILINGS)
VARIANTS = {t: functools.partial(use, t) for t in TILINGS}


def part_check():
    gpu_gluon.part_check({t: VARIANTS[t] for t in ("mufu", "e13", "e23", "e43", "triton")})


def part_speed():
    gpu_gluon.part_speed(["wan2.2-a14b-720p", "wan-480p", "hunyuanvideo-720p", "cogvideox-5b"],
                         VARIANTS, ("mufu", "e13", "e23", "e12", "e22", "noexp", "mufu"))


def main() -> int:
    return gpu_gluon.run_parts(globals(), "check,speed",
                               after_part=functools.partial(use, "triton"))


if __name__ == "__main__":
    raise SystemExit(main())
