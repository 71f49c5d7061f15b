"""One H200 call: three consumer warpgroups (192-row items) against two at D=64 (session 13).

    python3 benchmarks/gpu_three_consumers.py [--parts check,speed] [--out F]

Why: at D=64 the warp-specialized kernel is latency-bound, not power-capped (run s13-4:
1,980 MHz, CogVideoX 1.28x against the 1.4x target); a third consumer warpgroup gives the
schedulers more warps to hide the softmax behind. Registers: three 4-warp consumers and the
producer warp fit 168 per consumer thread, which the 256-key step's S (128 registers) and fp32
sum do not leave, so the three-warpgroup loop runs 128-key steps. sm_90 SASS (triton 3.6,
before any run): the two worker consumers' loops spill nothing at 168; the default partition
(consumer 0) keeps the launch's uniform ~152 and spills 9 per step (40 in the masked loop).

Variants (D=64 only; D=128 keeps its default): ``default`` (two warpgroups, 256-key steps),
``two-128`` (two warpgroups, 128-key steps: the fair control for the loop shape), ``three``
(three warpgroups, 128-key steps, 168 registers). ``check`` runs gpu_gluon's 13 cases against
fp64 under each; ``speed`` times CogVideoX against cuDNN.
"""

from __future__ import annotations

import functools
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import gpu_gluon  # noqa: E402

from fp8dit import launch  # noqa: E402

DEFAULT_TILES = {dp: dict(t) for dp, t in launch.WS_TILES.items()}
_LOOP_128 = dict(block_n=128, sm90_stages=3, sm90_p_regs=False, sm90_rowsum_dot=False)
TILINGS = {
    "default": ("gluon-ws", DEFAULT_TILES),
    "two-128": ("gluon-ws", {**DEFAULT_TILES, 64: dict(_LOOP_128)}),
    "three": ("gluon-ws", {**DEFAULT_TILES, 64: dict(_LOOP_128, sm90_consumers=3,
                                                     sm90_consumer_regs=168)}),
    "triton": ("triton", DEFAULT_TILES),  # gpu_gluon's reference; restores the defaults
}
use = functools.partial(gpu_gluon.use_tiling, TILINGS)
VARIANTS = {t: functools.partial(use, t) for t in TILINGS}


def part_check():
    gpu_gluon.part_check({k: VARIANTS[k] for k in ("default", "two-128", "three", "triton")})


def part_speed():
    gpu_gluon.part_speed(["cogvideox-5b"], VARIANTS,
                         ("default", "two-128", "three", "default"))


def main() -> int:
    return gpu_gluon.run_parts(globals(), "check,speed",
                               after_part=functools.partial(use, "triton"))


if __name__ == "__main__":
    raise SystemExit(main())
