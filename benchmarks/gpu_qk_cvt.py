"""One H200 call: the 256-key loop with QK accumulators from zero, made scores after the dot.

    python3 benchmarks/gpu_qk_cvt.py [--parts check,speed] [--out F]

``default``: each int32 QK accumulator is preset to the magic constant 0x4B400000 (128
IMAD.MOV per step at D=128, before the dots can issue), so the scores read as floats for free.
``cvt`` (``sm90_qk_cvt=1``): the dots start from zero and the scores are converted after them
(128 I2FP per step instead; sm_90 SASS, triton 3.6, D=128 with two K scales per step: 929
instructions against 933). ``add`` (``sm90_qk_cvt=2``): from zero, the constant's bits added
after the dot (130 VIADD, 934 instructions; the same floats as the default, so bitwise equal).
The timing-only ablation of run s9-4 (no preset, no conversion: wrong scores) ran +9% at Wan
720p; this asks how much of that a correct conversion keeps. ``cvt`` differs from the default
in fp32 rounding only.

check: fp64 error of default, cvt and add (D=128 normal and DiT-like, D=64, 3-way split), and
whether add equals default bitwise.
speed: Wan 720p and CogVideoX, each variant twice in one process, cuDNN before and after.
"""

from __future__ import annotations

import functools
import os
import sys

import torch

import fp8dit
from fp8dit import launch
from fp8dit.testing import attention_ref, error_stats, make_qkv

sys.path.insert(0, os.path.dirname(__file__))
import gpu_gluon  # noqa: E402
from gpu_gluon import record  # noqa: E402

DEFAULT_TILES = {dp: dict(t) for dp, t in launch.WS_TILES.items()}
TILINGS = {
    "default": ("gluon-ws", DEFAULT_TILES),
    "cvt": ("gluon-ws", {dp: {**t, "sm90_qk_cvt": 1} for dp, t in DEFAULT_TILES.items()}),
    "add": ("gluon-ws", {dp: {**t, "sm90_qk_cvt": 2} for dp, t in DEFAULT_TILES.items()}),
    "triton": ("triton", DEFAULT_TILES),  # restores the defaults
}
use = functools.partial(gpu_gluon.use_tiling, TILINGS)
VARIANTS = {t: functools.partial(use, t) for t in TILINGS}


def part_check():
    cases = [("wan-like", 4, 8192, 128, None, "normal"), ("dit-like", 4, 8192, 128, None, "dit"),
             ("odd-4500-d64", 3, 4500, 64, None, "normal"),
             ("split3", 2, 9000, 128, 3, "normal")]
    for name, H, S, D, splits, fam in cases:
        q, _, _ = make_qkv(1, H, S, D, family=fam, device="cuda", seed=1)
        _, k, v = make_qkv(1, H, S, D, family=fam, device="cuda", seed=2)
        ref, lse_ref = attention_ref(q, k, v, return_lse=True)
        rec, outs = {}, {}
        for t in ("default", "cvt", "add"):
            use(t)
            o, lse = fp8dit.attention(q, k, v, backend="fp8", num_splits=splits,
                                      return_lse=True)
            outs[t] = o
            st = error_stats(o, ref)
            rec[t] = dict(rel_l1=st.rel_l1, cos=st.cos, nan=st.nan,
                          lse_max=(lse.double() - lse_ref).abs().max().item())
        record(part="check", case=name, add_bitwise=bool(torch.equal(outs["add"], outs["default"])),
               **rec)


def part_speed():
    gpu_gluon.part_speed(["wan2.2-a14b-720p", "cogvideox-5b"], VARIANTS,
                         ("default", "cvt", "add", "default", "cvt", "add"))


def main() -> int:
    return gpu_gluon.run_parts(globals(), "check,speed",
                               after_part=functools.partial(use, "triton"))


if __name__ == "__main__":
    raise SystemExit(main())
