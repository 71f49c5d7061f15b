"""One H200 call: the 256-key loop with P read from registers by the PV dots.

    python3 benchmarks/gpu_p_regs.py [--parts same,check,speed,repeat] [--out F]

``ws256``: the warp-specialized loop as it was before run s8-4 (``_consumer_step_wide``: fp8 P
stored to shared memory, a fence and a warpgroup barrier, then the two PV dots read it).
``ws256r``: the PV dots take P from registers (``sm90_p_regs``; V^T's kv order already
matches the registers, as in the one-warpgroup kernel): no P store, fence or barrier, no P
buffers (32 KB less shared memory), and ptxas issues PV of the first half under the second
half's exponentials (sm_90 SASS, triton 3.6). ``ws256r3``: the same with three ring stages.

same:   ws256 and ws256r outputs and LSE bitwise equal (same values, same dots).
check:  ``gpu_gluon.part_check`` (fp64 and the Triton kernel) for each variant.
speed:  DiT presets, each variant timed twice in one process with cuDNN before and after.
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


def _tiles(**kw):
    return {dp: {**t, **kw} for dp, t in DEFAULT_TILES.items()}


TILINGS = {
    # explicit: P in registers became the D=128 default after run s8-4
    "ws256": ("gluon-ws", _tiles(sm90_p_regs=False, sm90_stages=2)),
    "ws256r": ("gluon-ws", _tiles(sm90_p_regs=True, sm90_stages=2)),
    "ws256r3": ("gluon-ws", _tiles(sm90_p_regs=True, sm90_stages=3)),
    "triton": ("triton", DEFAULT_TILES),  # gpu_gluon's reference; restores the defaults
}


use = functools.partial(gpu_gluon.use_tiling, TILINGS)


VARIANTS = {t: functools.partial(use, t) for t in TILINGS}


def part_same():
    cases = [("wan-like", 1, 4, 4, 8192, 128, None, "normal"),
             ("dit-like", 1, 4, 4, 8192, 128, None, "dit"),
             ("odd-4500-d64", 1, 3, 3, 4500, 64, None, "normal"),
             ("split3", 1, 2, 2, 9000, 128, 3, "normal"), ("gqa", 1, 8, 2, 5000, 128, None,
                                                           "normal"),
             ("d72", 2, 2, 2, 3001, 72, None, "normal")]
    for name, B, H, Hkv, S, D, splits, fam in cases:
        q, _, _ = make_qkv(B, H, S, D, Hkv=Hkv, family=fam, device="cuda", seed=1)
        _, k, v = make_qkv(B, H, S, D, Hkv=Hkv, family=fam, device="cuda", seed=2)
        outs = {}
        for t in ("ws256", "ws256r", "ws256r3"):
            use(t)
            outs[t] = fp8dit.attention(q, k, v, backend="fp8", num_splits=splits,
                                       return_lse=True)
        o1, l1 = outs["ws256"]
        record(part="same", case=name, **{
            t: dict(out_equal=torch.equal(o1, o), lse_equal=torch.equal(l1, lse),
                    max_abs=(o1.float() - o.float()).abs().max().item())
            for t, (o, lse) in outs.items() if t != "ws256"})
    use("triton")


def part_check():
    gpu_gluon.part_check({t: VARIANTS[t] for t in ("ws256", "ws256r", "triton")})


def part_speed():
    gpu_gluon.part_speed(["wan2.2-a14b-720p", "wan-480p", "hunyuanvideo-720p", "cogvideox-5b"],
                         VARIANTS, ("ws256", "ws256r", "ws256r3", "ws256r", "ws256"))


def part_repeat():
    gpu_gluon.part_repeat(use, "ws256r")


def main() -> int:
    return gpu_gluon.run_parts(globals(), "same,check,speed,repeat",
                               after_part=functools.partial(use, "triton"))


if __name__ == "__main__":
    raise SystemExit(main())
