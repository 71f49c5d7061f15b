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

import argparse
import datetime
import json
import os
import sys

import torch
import triton

import fp8dit
from fp8dit import launch
from fp8dit.testing import (
    attention_ref,
    attention_ref_rows,
    attention_varlen_ref,
    error_stats,
    make_qkv,
)

sys.path.insert(0, os.path.dirname(__file__))
from gpu_gluon import PRESETS  # noqa: E402
from gpu_variants import bench, cudnn_fn, fp8_fn, rotated, tflops  # noqa: E402

ROWS = []
DEFAULT_TILES = {dp: dict(t) for dp, t in launch.WS_TILES.items()}
# name -> (kernel, WS_TILES entries)
TILINGS = {
    "ws128": ("gluon-ws", {64: dict(block_n=128, sm90_stages=3),
                           128: dict(block_n=128, sm90_stages=3)}),
    "ws256": ("gluon-ws", {64: dict(block_n=256, sm90_stages=2),
                           128: dict(block_n=256, sm90_stages=2)}),
    "triton": ("triton", DEFAULT_TILES),
}


def record(**kw):
    ROWS.append(kw)
    print(json.dumps(kw), flush=True)


def use(tiling):
    kname, tiles = TILINGS[tiling]
    os.environ["FP8DIT_KERNEL"] = kname
    launch.WS_TILES.clear()
    launch.WS_TILES.update({dp: dict(t) for dp, t in tiles.items()})


def each(fn):
    out = {}
    for t in TILINGS:
        use(t)
        out[t] = fn()
        torch.cuda.synchronize()
    use("triton")
    return out


def part_check():
    cases = [
        # name, B, H, Hkv, Sq, Sk, D, causal, family, splits
        ("wan-like", 1, 4, 4, 8192, 8192, 128, False, "normal", None),
        ("dit-like", 1, 4, 4, 8192, 8192, 128, False, "dit", None),
        ("odd-1000", 2, 3, 3, 1000, 1000, 128, False, "normal", None),
        ("odd-113-d64", 1, 2, 2, 113, 113, 64, False, "normal", None),
        ("s1", 1, 2, 2, 1, 1, 128, False, "normal", None),
        ("d72", 1, 2, 2, 777, 777, 72, False, "normal", None),
        ("gqa", 1, 8, 2, 2048, 2048, 128, False, "normal", None),
        ("cross", 1, 4, 4, 3000, 512, 128, False, "normal", None),
        ("causal", 1, 2, 2, 1000, 1000, 128, True, "normal", None),
        ("split3", 1, 2, 2, 4096, 4096, 128, False, "normal", 3),
        ("split3-d64", 1, 2, 2, 4000, 4000, 64, False, "normal", 3),
        ("d64-cog", 1, 4, 4, 4096, 4096, 64, False, "dit", None),
        ("d64-odd", 1, 3, 3, 4500, 4500, 64, False, "normal", None),
    ]
    for name, B, H, Hkv, Sq, Sk, D, causal, family, splits in cases:
        q, _, _ = make_qkv(B, H, Sq, D, Hkv=Hkv, Sk=Sk, family=family, device="cuda", seed=1)
        _, k, v = make_qkv(B, H, Sq, D, Hkv=Hkv, Sk=Sk, family=family, device="cuda", seed=2)
        ref, lse_ref = attention_ref(q, k, v, is_causal=causal, return_lse=True)
        rec = {}
        try:
            outs = each(lambda q=q, k=k, v=v, c=causal, n=splits: fp8dit.attention(
                q, k, v, backend="fp8", is_causal=c, num_splits=n, return_lse=True))
            for t, (o, lse) in outs.items():
                st = error_stats(o, ref)
                rec[t] = dict(rel_l1=round(st.rel_l1, 5), cos=round(st.cos, 6), nan=st.nan,
                              lse_max=(lse.double() - lse_ref).abs().max().item())
            ot = outs["triton"][0].float()
            for t in ("ws128", "ws256"):
                rec[f"{t}_vs_triton_max_abs"] = (outs[t][0].float() - ot).abs().max().item()
        except Exception as e:  # noqa: BLE001 - a failure is a result
            rec["error"] = f"{type(e).__name__}: {e}"[:400]
        record(part="check", case=name, shape=[B, H, Hkv, Sq, Sk, D], causal=causal,
               family=family, splits=splits, **rec)
    lens = [300, 0, 2000, 129]
    T, H, D = sum(lens), 4, 128
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(T, H, D, device="cuda", generator=g, dtype=torch.bfloat16)
               for _ in range(3))
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
    ref = attention_varlen_ref(q, k, v, cu, cu)
    try:
        outs = each(lambda: fp8dit.attention_varlen(q, k, v, cu, cu, max(lens), max(lens),
                                                    backend="fp8"))
        rec = {t: round(error_stats(o, ref).rel_l1, 5) for t, o in outs.items()}
    except Exception as e:  # noqa: BLE001
        rec = {"error": f"{type(e).__name__}: {e}"[:400]}
    record(part="check", case="varlen-empty", lens=lens, **rec)


def part_speed():
    order = ["wan2.2-a14b-720p", "wan-480p", "hunyuanvideo-720p", "cogvideox-5b"]
    for name in order:
        B, H, S, D = PRESETS[name]
        sets = [make_qkv(B, H, S, D, device="cuda", seed=i) for i in range(2)]
        nxt = rotated(sets)
        est = 4 * B * H * S * S * D / 700e12 * 1e3
        cud = bench(cudnn_fn(nxt), est)
        record(part="speed", preset=name, backend="sdpa-cudnn", ms=cud,
               tflops=tflops(B, H, S, D, cud))
        for t in ("ws128", "ws256", "triton", "ws256", "ws128"):
            use(t)
            run = fp8_fn(nxt, None)
            try:
                run()
                torch.cuda.synchronize()
                ms = bench(run, est)
                record(part="speed", preset=name, backend=f"fp8dit[{t}]", ms=ms,
                       tflops=tflops(B, H, S, D, ms), vs_cudnn=cud / ms)
            except Exception as e:  # noqa: BLE001
                record(part="speed", preset=name, backend=f"fp8dit[{t}]",
                       error=f"{type(e).__name__}: {e}"[:400])
        use("triton")
        cud2 = bench(cudnn_fn(nxt), est)
        record(part="speed", preset=name, backend="sdpa-cudnn-again", ms=cud2,
               tflops=tflops(B, H, S, D, cud2))
        del sets, nxt
        torch.cuda.empty_cache()


def part_drift():
    for family in ("normal", "dit"):
        for S in (8192, 200000):
            q, k, v = make_qkv(1, 2, S, 128, device="cuda", family=family, seed=S)
            rows = torch.randperm(S, device="cuda")[:1024]
            ref, lse_ref = attention_ref_rows(q, k, v, rows)
            outs = each(lambda q=q, k=k, v=v: fp8dit.attention(q, k, v, backend="fp8",
                                                               return_lse=True))
            for t, (out, lse) in outs.items():
                st = error_stats(out[0, rows], ref)
                lerr = (lse[0][:, rows].double() - lse_ref).abs()
                record(part="drift", family=family, S=S, tiling=t, rel_l1=st.rel_l1,
                       cos=st.cos, lse_max_err=lerr.max().item())
            del q, k, v
            torch.cuda.empty_cache()


def part_repeat():
    q, k, v = make_qkv(1, 4, 40000, 128, device="cuda", seed=5)
    use("ws256")
    for splits in (None, 3):
        outs = [fp8dit.attention(q, k, v, backend="fp8", num_splits=splits) for _ in range(10)]
        same = all(torch.equal(outs[0], o) for o in outs[1:])
        record(part="repeat", tiling="ws256", splits=splits, bitwise_equal_10=same)
    use("triton")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="check,speed,drift,repeat")
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
    if a.out:
        with open(a.out, "w") as f:
            json.dump(ROWS, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
