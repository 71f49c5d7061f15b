"""One H200 call: P's row sums on the tensor cores in the 256-key loop (P from registers).

    python3 benchmarks/gpu_rowsum_dot.py [--parts check,drift,repeat,speed] [--out F]

``default`` (the name run s11-3 recorded; the default until then): each thread sums its
exponentials with FADDs (128 per 256-key step) and a row reduction across the four lanes of a
row; P from registers at D=128 only.
``rowsum`` (``sm90_rowsum_dot``, with ``sm90_p_regs`` at D=64 too): two N=8 dots of the fp8 P
(the PV dots' A registers) with a [128 keys, 8] tile of ones after the PV dots; the [64, 8]
fp32 accumulator is folded like the output and its equal columns are read once per item.
sm_90 SASS (triton 3.6): main loop 923 -> 800 instructions at D=128 (one spill reload per
step), 898 -> 754 at D=64. Sessions 7 and 10 measured wrong sums: the ones tile was filled
with half its bytes unset (an fp32 -> fp8 splat conversion, found in run s11-2); since
session 11 it is filled with 0x38 bytes.
``rowsum`` normalizes by the sum of the fp8 P that the PV dots weigh V with (the default by
the sum of the fp32 P), so outputs differ from the default by rounding.

check:  ``gpu_gluon.part_check`` (fp64 and the Triton kernel) for each variant.
drift:  8k / 65k / 200k tokens, normal and DiT-like, default against rowsum.
repeat: 10 calls bitwise equal at 40k tokens, D=128 and D=64, with and without a 3-way split.
speed:  DiT presets, each variant twice in one process, cuDNN before and after.
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
    "default": ("gluon-ws", {dp: {**t, "sm90_p_regs": dp == 128, "sm90_rowsum_dot": False}
                             for dp, t in DEFAULT_TILES.items()}),
    "rowsum": ("gluon-ws", {dp: {**t, "sm90_p_regs": True, "sm90_rowsum_dot": True}
                            for dp, t in DEFAULT_TILES.items()}),
    "triton": ("triton", DEFAULT_TILES),  # gpu_gluon's reference; restores the defaults
}
use = functools.partial(gpu_gluon.use_tiling, TILINGS)
VARIANTS = {t: functools.partial(use, t) for t in TILINGS}


def part_check():
    gpu_gluon.part_check(VARIANTS)


def part_drift():
    gpu_gluon.part_drift({t: VARIANTS[t] for t in ("default", "rowsum", "triton")})


def part_repeat():
    gpu_gluon.part_repeat(use, "rowsum")


def part_speed():
    gpu_gluon.part_speed(["wan2.2-a14b-720p", "wan-480p", "hunyuanvideo-720p", "cogvideox-5b"],
                         VARIANTS, ("default", "rowsum", "default", "rowsum"))


def main() -> int:
    return gpu_gluon.run_parts(globals(), "check,drift,repeat,speed",
                               after_part=functools.partial(use, "triton"))


if __name__ == "__main__":
    raise SystemExit(main())
