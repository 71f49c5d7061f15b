"""One H200 call: K and V of a ring slot on their own barriers in the 256-key loop.

    python3 benchmarks/gpu_split_kv.py [--parts same,check,speed,repeat,len64,stages] [--out F]

Why (session 22, runs s22-1/s22-2): at D=128 a 256-key step takes ~5% longer with all 132 SMs
streaming K/V from L2 than with 33 (2.19 against 2.08 us at 1,980 MHz), and nothing at D=64
(half the bytes). With one barrier per slot the consumers wait for K and V (64 KB) before the
QK dots. ``sm90_split_kv``: K on the slot's barrier, V on its own (``v_full``), waited for
after the row max, before the exponentials (FlashAttention-3 keeps separate K and V pipelines
as well). Outputs must be bitwise the default's: only the synchronization changes.
Session 22 measured three more forms with this script (commits d29be0d, 66e961a; NOTES.md):
V's wait just before the PV dots, with or without K's half of the slot freed after the QK dots,
and the early wait with K freed there; all slower, and removed from the kernel. The kept form
is the default at D=64 (+10%); at D=128 it spills and loses, so D=128 keeps one barrier.

same:   outputs and LSE of split off / on against the default, bitwise (D=128, D=64, an odd
        length, split-KV, varlen with an empty sequence).
check:  gpu_gluon's 13 cases against fp64 under each variant.
speed:  Wan 720p, Wan 480p, HunyuanVideo, CogVideoX; cuDNN before and after.
repeat: 10 calls bitwise equal with the default tiles (gpu_gluon.part_repeat).
len64:  D=64 at 8k / 12k / 32k tokens, split off and on.
stages: the split with three / four ring stages (D=64: CogVideoX; D=128: Wan 480p).
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


def _tiles(**over):
    return {dp: {**t, **over} for dp, t in DEFAULT_TILES.items()}


TILINGS = {
    "default": ("gluon-ws", DEFAULT_TILES),  # split on at D=64, off at D=128
    "off": ("gluon-ws", _tiles(sm90_split_kv=False)),
    "on": ("gluon-ws", _tiles(sm90_split_kv=True)),
    "on-3st": ("gluon-ws", _tiles(sm90_split_kv=True, sm90_stages=3)),
    "on-4st": ("gluon-ws", {dp: {**t, "sm90_split_kv": True, "sm90_stages": 4 if dp == 64 else 3}
                            for dp, t in DEFAULT_TILES.items()}),
    "triton": ("triton", DEFAULT_TILES),  # gpu_gluon's reference; restores the defaults
}
use = functools.partial(gpu_gluon.use_tiling, TILINGS)
VARIANTS = {t: functools.partial(use, t) for t in TILINGS}
COMPARED = ("default", "off", "on")


def part_same():
    cases = [  # name, B, H, Sq/Sk, D, splits
        ("d128-8k", 1, 4, 8192, 128, None), ("d64-8k", 1, 4, 8192, 64, None),
        ("d128-odd", 2, 3, 9001, 128, None), ("d128-split3", 1, 2, 16384, 128, 3),
        ("d64-split3", 1, 2, 16000, 64, 3),
    ]
    for name, B, H, S, D, splits in cases:
        q, k, v = make_qkv(B, H, S, D, device="cuda", seed=5)
        outs = {}
        for t in COMPARED:
            use(t)
            outs[t] = fp8dit.attention(q, k, v, backend="fp8", num_splits=splits,
                                       return_lse=True)
        use("triton")
        o0, l0 = outs["default"]
        record(part="same", case=name, **{
            t: bool(torch.equal(o, o0) and torch.equal(lse, l0))
            for t, (o, lse) in outs.items() if t != "default"})
    lens = [300, 0, 20000, 129]
    q, k, v, cu = gpu_gluon.varlen_inputs(lens)
    outs = {}
    for t in COMPARED:
        use(t)
        outs[t] = fp8dit.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), backend="fp8")
    use("triton")
    record(part="same", case="varlen-empty", **{
        t: bool(torch.equal(o, outs["default"])) for t, o in outs.items() if t != "default"})


def part_check():
    gpu_gluon.part_check({t: VARIANTS[t] for t in (*COMPARED, "triton")})


def part_speed():
    gpu_gluon.part_speed(["wan2.2-a14b-720p", "wan-480p", "hunyuanvideo-720p", "cogvideox-5b"],
                         VARIANTS, ("off", "on", "off", "on"))


def part_stages():
    gpu_gluon.part_speed(["cogvideox-5b"], VARIANTS,
                         ("on", "on-3st", "on-4st", "on", "on-3st", "on-4st"))
    gpu_gluon.part_speed(["wan-480p"], VARIANTS, ("off", "on-3st", "off", "on-3st"))


def part_repeat():
    gpu_gluon.part_repeat(use, "default")


# D=64 lengths where ``auto`` runs FP8 (from 8,192 keys), 48 heads as CogVideoX
LENGTHS_64 = (8192, 12288, 32768)


def part_len64():
    from gpu_variants import bench, cudnn_fn, fp8_fn, rotated, tflops

    for S in LENGTHS_64:
        B, H, D = 1, 48, 64
        sets = [make_qkv(B, H, S, D, device="cuda", seed=i) for i in range(2)]
        nxt = rotated(sets)
        est = 4 * B * H * S * S * D / 500e12 * 1e3
        cud = bench(cudnn_fn(nxt), est)
        record(part="len64", S=S, backend="sdpa-cudnn", ms=cud)
        for t in ("off", "on", "off", "on"):
            use(t)
            run = fp8_fn(nxt, None)
            run()
            torch.cuda.synchronize()
            ms = bench(run, est)
            record(part="len64", S=S, backend=f"fp8dit[{t}]", ms=ms,
                   tflops=tflops(B, H, S, D, ms), vs_cudnn=cud / ms)
        use("triton")
        del sets
        torch.cuda.empty_cache()


def main() -> int:
    return gpu_gluon.run_parts(globals(), "same,check,speed",
                               after_part=functools.partial(use, "triton"))


if __name__ == "__main__":
    raise SystemExit(main())
