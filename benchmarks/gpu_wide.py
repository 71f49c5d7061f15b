"""One H200 call: the warp-specialized kernel with 256-key steps against its 128-key loop.

    python3 benchmarks/gpu_wide.py [--parts check,speed,drift,repeat] [--out $OUT/wide.json]

``launch.WS_TILES`` picks the kv block of the warp-specialized kernel (``attention_sm90_ws``):
128 keys per step (PV of block j-1 under the softmax of block j), or 256 keys as two dots of
128 with both PV dots waited for inside the step (``_consumer_step_wide``).

check:  odd lengths, GQA, causal, split-KV, head dims 64/72/128, varlen with an empty
        sequence, all forced onto the warp-specialized kernel (``FP8DIT_KERNEL=gluon-ws``),
        each tiling against fp64 and against the Triton kernel.
speed:  DiT presets: SDPA cuDNN, fp8dit end to end with each tiling and the Triton kernel,
        cuDNN again (run s6-1 also had D=64 with three ring stages: 460 TFLOPS, two: 479).
drift:  8k and 200k tokens (normal and DiT-like), each tiling.
repeat: 10 calls bitwise equal at 40k tokens, with and without a 3-way split-KV.
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
# name -> (kernel, WS_TILES entries); "triton" last: gpu_gluon's reference, whose setup also
# restores the default tiles
TILINGS = {
    "ws128": ("gluon-ws", {64: dict(block_n=128, sm90_stages=3),
                           128: dict(block_n=128, sm90_stages=3)}),
    "ws256": ("gluon-ws", {64: dict(block_n=256, sm90_stages=2),
                           128: dict(block_n=256, sm90_stages=2)}),
    "triton": ("triton", DEFAULT_TILES),
}


use = functools.partial(gpu_gluon.use_tiling, TILINGS)


VARIANTS = {t: functools.partial(use, t) for t in TILINGS}


def part_check():
    gpu_gluon.part_check(VARIANTS)


def part_drift():
    gpu_gluon.part_drift(VARIANTS, lengths=(8192, 200000))


def part_speed():
    gpu_gluon.part_speed(["wan2.2-a14b-720p", "wan-480p", "hunyuanvideo-720p", "cogvideox-5b"],
                         VARIANTS, ("ws128", "ws256", "triton", "ws256", "ws128"))


def part_repeat():
    q, k, v = make_qkv(1, 4, 40000, 128, device="cuda", seed=5)
    use("ws256")
    for splits in (None, 3):
        outs = [fp8dit.attention(q, k, v, backend="fp8", num_splits=splits) for _ in range(10)]
        same = all(torch.equal(outs[0], o) for o in outs[1:])
        record(part="repeat", tiling="ws256", splits=splits, bitwise_equal_10=same)
    use("triton")


def main() -> int:
    return gpu_gluon.run_parts(globals(), "check,speed,drift,repeat")


if __name__ == "__main__":
    raise SystemExit(main())
