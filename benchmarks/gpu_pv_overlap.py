"""One H200 call (session 8): the D=64 256-key loop with PV under the next softmax, and the
quantizer's 128-row programs with K's block amax from the statistics pass.

    python3 benchmarks/gpu_pv_overlap.py [--parts quant,same,check,speed,repeat] [--out F]

``ws256``: the default warp-specialized loop (``_consumer_step_wide``: both PV dots of a
256-key block waited for inside the step). ``ws256ov``: ``_consumer_item_wide_ov`` (PV of
block kb-1 issued with QK of block kb, waited for at the top of block kb+1), two ring stages;
``ws256ov3``: three. D=128 keeps the default in every variant (no registers for the overlap).

quant:  ``launch.quantize_stage`` (all launches) with 256-row programs (``KV_QUANT_ROWS=0``)
        and with 128-row programs taking K's amax from the statistics pass (the default),
        and whether the two workspaces are bitwise equal.
same:   ws256 and ws256ov outputs and LSE bitwise equal (same arithmetic, other order of
        issue), D=64 shapes: odd length, 3-way split-KV, GQA, varlen with an empty sequence.
check:  ``gpu_gluon.part_check`` (fp64 and the Triton kernel) for each variant.
speed:  CogVideoX (D=64) and Wan 720p, each variant timed twice in one process with cuDNN.
repeat: 10 calls bitwise equal at D=64, 40k tokens, with and without a 3-way split.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import sys

import torch
import triton

import fp8dit
from fp8dit import launch
from fp8dit import plan as plan_mod
from fp8dit.recipes import get_recipe
from fp8dit.testing import make_qkv

sys.path.insert(0, os.path.dirname(__file__))
import gpu_gluon  # noqa: E402
from gpu_gluon import ROWS, record  # noqa: E402
from gpu_quant_warps import time_ms  # noqa: E402

DEFAULT_TILES = {dp: dict(t) for dp, t in launch.WS_TILES.items()}
TILINGS = {
    "ws256": ("gluon-ws", DEFAULT_TILES),
    "ws256ov": ("gluon-ws", {**DEFAULT_TILES, 64: dict(block_n=256, sm90_stages=2,
                                                       sm90_pv_overlap=True)}),
    "ws256ov3": ("gluon-ws", {**DEFAULT_TILES, 64: dict(block_n=256, sm90_stages=3,
                                                        sm90_pv_overlap=True)}),
    "ws256ov4": ("gluon-ws", {**DEFAULT_TILES, 64: dict(block_n=256, sm90_stages=4,
                                                        sm90_pv_overlap=True)}),
    "ws256-3": ("gluon-ws", {**DEFAULT_TILES, 64: dict(block_n=256, sm90_stages=3)}),
    "triton": ("triton", DEFAULT_TILES),  # gpu_gluon's reference; restores the defaults
}


def use(tiling):
    kname, tiles = TILINGS[tiling]
    os.environ["FP8DIT_KERNEL"] = kname
    launch.WS_TILES.clear()
    launch.WS_TILES.update({dp: dict(t) for dp, t in tiles.items()})


VARIANTS = {t: functools.partial(use, t) for t in ("ws256", "ws256ov", "triton")}


# name -> (KV_QUANT_ROWS, stats chunks offered, stats warps); run s8-1 timed the first two
QUANT_VARIANTS = {
    "rows256": (0, plan_mod.STATS_CHUNKS, 4),
    "rows128-c512": (128, plan_mod.STATS_CHUNKS, 4),
    "rows128-c256": (128, (256, 128, 64), 4),
    "rows128-c256-w8": (128, (256, 128, 64), 8),
    "rows128-c512-w8": (128, plan_mod.STATS_CHUNKS, 8),
}


def part_quant():
    os.environ["FP8DIT_KERNEL"] = "gluon-ws"
    rec = get_recipe(None)
    presets = {"wan2.2-a14b-720p": (1, 40, 75600, 128), "wan2.1-1.3b-480p": (1, 12, 32760, 128),
               "cogvideox-5b": (2, 48, 17776, 64)}
    saved = launch.KV_QUANT_ROWS, plan_mod.STATS_CHUNKS, launch.KV_STATS_WARPS
    for name, (B, H, S, D) in presets.items():
        q, k, v = make_qkv(B, H, S, D, device="cuda", seed=0)
        st = launch._bthd_strides(q, "HND")
        wss, res = {}, {}
        for vname in (*QUANT_VARIANTS, *QUANT_VARIANTS):
            launch.KV_QUANT_ROWS, plan_mod.STATS_CHUNKS, launch.KV_STATS_WARPS = \
                QUANT_VARIANTS[vname]
            plan_mod.clear_plan_cache()
            plan, _ = launch.plan_for([S] * B, [S] * B, varlen=False, num_heads=H,
                                      num_kv_heads=H, head_dim=D, is_causal=False,
                                      device=q.device, recipe=rec)
            run = functools.partial(launch.quantize_stage, plan, rec, 1.0 / math.sqrt(D), q, st,
                                    k, st, v, st, kv_perm16=True)
            res.setdefault(vname, []).append(round(time_ms(run), 4))
            res[vname + "_chunk"] = plan.stats_chunk
            wss[vname] = run()
        ref = wss["rows256"]
        same = {vn: all(torch.equal(getattr(ref, n).view(torch.uint8),
                                    getattr(ws, n).view(torch.uint8))
                        for n in ("q8", "q_scale", "k8", "k_scale", "v8t", "v_scale"))
                for vn, ws in wss.items()}
        record(part="quant", preset=name, ms=res, bitwise_equal_to_rows256=same)
        del q, k, v, wss
        torch.cuda.empty_cache()
    launch.KV_QUANT_ROWS, plan_mod.STATS_CHUNKS, launch.KV_STATS_WARPS = saved
    plan_mod.clear_plan_cache()
    os.environ["FP8DIT_KERNEL"] = "auto"


def part_same():
    cases = [("odd-4500", 1, 3, 3, 4500, 64, None), ("split3", 1, 2, 2, 9000, 64, 3),
             ("gqa", 1, 8, 2, 5000, 64, None), ("d48", 2, 2, 2, 3001, 48, None)]
    for name, B, H, Hkv, S, D, splits in cases:
        q, _, _ = make_qkv(B, H, S, D, Hkv=Hkv, device="cuda", seed=1)
        _, k, v = make_qkv(B, H, S, D, Hkv=Hkv, device="cuda", seed=2)
        outs = {}
        for t in ("ws256", "ws256ov"):
            use(t)
            outs[t] = fp8dit.attention(q, k, v, backend="fp8", num_splits=splits,
                                       return_lse=True)
        (o1, l1), (o2, l2) = outs["ws256"], outs["ws256ov"]
        record(part="same", case=name, out_equal=torch.equal(o1, o2),
               lse_equal=torch.equal(l1, l2),
               max_abs=(o1.float() - o2.float()).abs().max().item(), nan=bool(o2.isnan().any()))
    lens = [300, 0, 5000, 129]
    T, H, D = sum(lens), 4, 64
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(T, H, D, device="cuda", generator=g, dtype=torch.bfloat16)
               for _ in range(3))
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
    outs = {}
    for t in ("ws256", "ws256ov"):
        use(t)
        outs[t] = fp8dit.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), backend="fp8")
    record(part="same", case="varlen-empty", out_equal=torch.equal(outs["ws256"],
                                                                   outs["ws256ov"]))
    use("triton")


def part_check():
    gpu_gluon.part_check(VARIANTS)


def part_speed():
    variants = {t: functools.partial(use, t) for t in TILINGS}
    # run s8-1: ws256 473.6 / 472.2, ws256ov 307.8 / 308.7, ws256ov3 435.8, triton 461.0
    gpu_gluon.part_speed(["cogvideox-5b"], variants,
                         ("ws256", "ws256ov4", "ws256ov3", "ws256-3", "ws256ov4", "ws256"))


def part_repeat():
    q, k, v = make_qkv(1, 4, 40000, 64, device="cuda", seed=5)
    use("ws256ov")
    for splits in (None, 3):
        outs = [fp8dit.attention(q, k, v, backend="fp8", num_splits=splits) for _ in range(10)]
        record(part="repeat", tiling="ws256ov", splits=splits,
               bitwise_equal_10=all(torch.equal(outs[0], o) for o in outs[1:]))
    use("triton")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="quant,same,check,speed,repeat")  # s8-2: quant,speed
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    record(part="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__,
           triton=triton.__version__, commit=os.environ.get("FP8DIT_COMMIT", ""),
           date=datetime.datetime.now().isoformat(timespec="seconds"))
    for part in a.parts.split(","):
        try:
            globals()[f"part_{part}"]()
        except Exception as e:  # noqa: BLE001 - keep the other parts' results
            record(part=part, error=f"{type(e).__name__}: {e}"[:600])
        finally:
            use("triton")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(ROWS, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
