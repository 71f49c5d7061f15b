"""One H200 call: the Gluon sm_90 kernel against the Triton kernel and cuDNN, same process.

    python3 benchmarks/gpu_gluon.py [--parts check,speed,drift,stages] [--presets a,b] \
        [--out $OUT/gluon.json]

check:  every case runs through ``fp8dit.attention`` twice, ``FP8DIT_KERNEL=gluon`` and
        ``=triton``; both against the fp64 reference (rel-L1, cosine, LSE) and
        against each other. Odd lengths, GQA, causal, varlen, split-KV, head dims 64/72/128.
speed:  DiT presets; SDPA cuDNN, fp8dit with each kernel, timed around each other.
drift:  8k / 65k / 200k tokens, both kernels (the Gluon kernel accumulates PV straight into
        the fp32 accumulator through the tensor core, the Triton one per block).
stages: Gluon kernel launch configs (ring depth, programs per SM, register cap).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import sys
import time

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
from gpu_variants import (  # noqa: E402
    bench,
    cudnn_fn,
    fp8_fn,
    parse_overrides,
    rotated,
    tflops,
)

ROWS = []


def record(**kw):
    ROWS.append(kw)
    print(json.dumps(kw), flush=True)


def record_env(**extra):
    """The first row of a one-call script: GPU, versions, commit (FP8DIT_COMMIT), date."""
    record(part="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__,
           triton=triton.__version__, commit=os.environ.get("FP8DIT_COMMIT", ""),
           date=datetime.datetime.now().isoformat(timespec="seconds"), **extra)


def write_rows(path):
    """Every recorded row as one JSON list (``--out``; nothing when ``path`` is empty)."""
    if path:
        with open(path, "w") as f:
            json.dump(ROWS, f, indent=1)


def kernel(name):
    os.environ["FP8DIT_KERNEL"] = name


KERNELS = ("gluon-ws", "gluon", "triton")
# name -> setup: what the check and drift parts compare; "triton" is the reference and its
# setup also restores the defaults afterwards (benchmarks/gpu_wide.py passes tilings instead)
VARIANTS = {name: functools.partial(kernel, name) for name in KERNELS}
REF = "triton"


def each_kernel(fn, variants=None):
    """fn() under each variant (default: each kernel): {'gluon-ws': ..., 'triton': ...}."""
    variants = variants or VARIANTS
    res = {}
    for name, setup in variants.items():
        setup()
        res[name] = fn()
        torch.cuda.synchronize()
    variants[REF]()
    return res


def varlen_inputs(lens, H=4, D=128):
    """Packed bf16 q, k, v of sequences ``lens`` (seeded) and their int32 cumulative lengths."""
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(sum(lens), H, D, device="cuda", generator=g, dtype=torch.bfloat16)
               for _ in range(3))
    return q, k, v, torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)


def part_check(variants=None):
    variants = variants or VARIANTS
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
            outs = each_kernel(lambda q=q, k=k, v=v, c=causal, n=splits: fp8dit.attention(
                q, k, v, backend="fp8", is_causal=c, num_splits=n, return_lse=True), variants)
            for kname, setup in variants.items():
                setup()
                plan, _ = launch.plan_for([Sq] * B, [Sk] * B, varlen=False, num_heads=H,
                                          num_kv_heads=Hkv, head_dim=D, is_causal=causal,
                                          device=q.device, num_splits=splits)
                rec[f"{kname}_used"] = launch.use_gluon_sm90(
                    plan, fp8dit.recipes.get_recipe(None), q.device)
            variants[REF]()
            for kname, (o, lse) in outs.items():
                st = error_stats(o, ref)
                rec[kname] = dict(rel_l1=st.rel_l1, cos=st.cos, nan=st.nan,
                                  lse_max=(lse.double() - lse_ref).abs().max().item())
            ot = outs[REF][0].float()
            for kname in outs:
                if kname != REF:
                    rec[f"{kname}_vs_{REF}_max_abs"] = \
                        (outs[kname][0].float() - ot).abs().max().item()
        except Exception as e:  # noqa: BLE001 - a failure is a result
            rec["error"] = f"{type(e).__name__}: {e}"[:400]
        record(part="check", case=name, shape=[B, H, Hkv, Sq, Sk, D], causal=causal,
               family=family, splits=splits, **rec)
    # varlen with an empty sequence
    lens = [300, 0, 2000, 129]
    q, k, v, cu = varlen_inputs(lens)
    ref = attention_varlen_ref(q, k, v, cu, cu)
    try:
        outs = each_kernel(lambda: fp8dit.attention_varlen(q, k, v, cu, cu, max(lens), max(lens),
                                                    backend="fp8"), variants)
        rec = {kname: error_stats(o, ref).rel_l1 for kname, o in outs.items()}
        for kname in outs:
            if kname != REF:
                diff = (outs[kname].float() - outs[REF].float()).abs().max().item()
                rec[f"{kname}_vs_{REF}_max_abs"] = diff
    except Exception as e:  # noqa: BLE001
        rec = {"error": f"{type(e).__name__}: {e}"[:400]}
    record(part="check", case="varlen-empty", lens=lens, **rec)


PRESETS = {
    "wan2.2-a14b-720p": (1, 40, 75600, 128),
    "wan-480p": (1, 40, 32760, 128),
    "hunyuanvideo-720p": (1, 24, 119880, 128),
    "cogvideox-5b": (2, 48, 17776, 64),
    "flux-1024": (1, 24, 4608, 128),
}


def part_speed(names=None, variants=None, sequence=("gluon-ws", "triton", "gluon-ws")):
    """``sequence``: the variants timed, in order (one timed before and after the others
    shows drift during the run)."""
    variants = variants or VARIANTS
    for name, (B, H, S, D) in PRESETS.items():
        if names and name not in names:
            continue
        sets = [make_qkv(B, H, S, D, device="cuda", seed=i) for i in range(2)]
        nxt = rotated(sets)
        est = 4 * B * H * S * S * D / 700e12 * 1e3
        t0 = time.time()
        cud = bench(cudnn_fn(nxt), est)
        record(part="speed", preset=name, backend="sdpa-cudnn", ms=cud,
               tflops=tflops(B, H, S, D, cud), t0=t0, t1=time.time())
        for kname in sequence:
            variants[kname]()
            run = fp8_fn(nxt, None)
            try:
                run()
                torch.cuda.synchronize()
                t0 = time.time()
                ms = bench(run, est)
                # wall-clock window: power and clocks from an nvidia-smi log can be matched
                record(part="speed", preset=name, backend=f"fp8dit[{kname}]", ms=ms,
                       tflops=tflops(B, H, S, D, ms), vs_cudnn=cud / ms, t0=t0,
                       t1=time.time())
            except Exception as e:  # noqa: BLE001
                record(part="speed", preset=name, backend=f"fp8dit[{kname}]",
                       error=f"{type(e).__name__}: {e}"[:400])
        variants[REF]()
        cud2 = bench(cudnn_fn(nxt), est)
        record(part="speed", preset=name, backend="sdpa-cudnn-again", ms=cud2,
               tflops=tflops(B, H, S, D, cud2))
        del sets
        torch.cuda.empty_cache()



def part_repeat(use, tiling):
    """10 calls at 40k tokens bitwise equal under ``use(tiling)``, D=128 and D=64, with and
    without a 3-way split; ``use("triton")`` afterwards restores the defaults."""
    for D in (128, 64):
        q, k, v = make_qkv(1, 4, 40000, D, device="cuda", seed=5)
        use(tiling)
        for splits in (None, 3):
            outs = [fp8dit.attention(q, k, v, backend="fp8", num_splits=splits)
                    for _ in range(10)]
            record(part="repeat", tiling=tiling, D=D, splits=splits,
                   bitwise_equal_10=all(torch.equal(outs[0], o) for o in outs[1:]))
    use("triton")


# name -> (preset, padded head dim, tile overrides) for the Gluon kernel
GLUON_CONFIGS = {
    "ws-d128-2s": ("wan2.2-a14b-720p", 128, {"sm90_stages": 2}, "gluon-ws"),
    "ws-d128-3s": ("wan2.2-a14b-720p", 128, {"sm90_stages": 3}, "gluon-ws"),
    "ws-d128-4s": ("wan2.2-a14b-720p", 128, {"sm90_stages": 4}, "gluon-ws"),
    "ws-d128-3s-r232": ("wan2.2-a14b-720p", 128, {"sm90_stages": 3, "sm90_consumer_regs": 232},
                        "gluon-ws"),
    "ws-d128-3s-direct": ("wan2.2-a14b-720p", 128, {"sm90_stages": 3, "sm90_two_level": False},
                          "gluon-ws"),
    "ws-d64-3s": ("cogvideox-5b", 64, {"sm90_stages": 3}, "gluon-ws"),
    # timing only, wrong results: the kernel without its exp2 (MUFU) work
    "ws-d128-3s-noexp": ("wan2.2-a14b-720p", 128, {"sm90_stages": 3, "sm90_ablate_exp": 1},
                         "gluon-ws"),
    "ws-d128-3s-nosoftmax": ("wan2.2-a14b-720p", 128, {"sm90_stages": 3, "sm90_ablate_exp": 2},
                             "gluon-ws"),
    "ws-d128-3s-nosoftmax-nopstore": ("wan2.2-a14b-720p", 128,
                                      {"sm90_stages": 3, "sm90_ablate_exp": 3}, "gluon-ws"),
    "ws-d128-3s-pingpong": ("wan2.2-a14b-720p", 128, {"sm90_stages": 3, "sm90_pingpong": True},
                            "gluon-ws"),
    "ws-d128-3s-nopingpong": ("wan2.2-a14b-720p", 128,
                              {"sm90_stages": 3, "sm90_pingpong": False}, "gluon-ws"),
    "ws-d128-3s-nopingpong-nosoftmax": ("wan2.2-a14b-720p", 128,
                                        {"sm90_stages": 3, "sm90_pingpong": False,
                                         "sm90_ablate_exp": 2}, "gluon-ws"),
    # timing only, wrong results: what each per-block overhead of the loop costs (session 4)
    "ws-nopp-noinit": ("wan2.2-a14b-720p", 128, {"sm90_pingpong": False, "sm90_ablate_misc": 1},
                       "gluon-ws"),
    "ws-nopp-norescale": ("wan2.2-a14b-720p", 128,
                          {"sm90_pingpong": False, "sm90_two_level": False,
                           "sm90_ablate_misc": 2}, "gluon-ws"),
    "ws-nopp-nosum": ("wan2.2-a14b-720p", 128, {"sm90_pingpong": False, "sm90_ablate_misc": 4},
                      "gluon-ws"),
    "ws-nopp-none-of-3": ("wan2.2-a14b-720p", 128,
                          {"sm90_pingpong": False, "sm90_two_level": False,
                           "sm90_ablate_misc": 7}, "gluon-ws"),
    "ws-nopp-none-of-3-noexp": ("wan2.2-a14b-720p", 128,
                                {"sm90_pingpong": False, "sm90_two_level": False,
                                 "sm90_ablate_misc": 7, "sm90_ablate_exp": 1}, "gluon-ws"),
    "ws-hunyuan-nopingpong": ("hunyuanvideo-720p", 128, {"sm90_pingpong": False}, "gluon-ws"),
    # session 5 (lazy rescaling, sm90_lazy_fold, commit 3169f58, reverted): the baseline row
    "ws-default": ("wan2.2-a14b-720p", 128, {}, "gluon-ws"),
    "ws-480-nopingpong": ("wan-480p", 128, {"sm90_pingpong": False}, "gluon-ws"),
    # the default Triton kernel at D=64: a fourth program per SM (registers capped at 128)
    "tri-d64-default": ("cogvideox-5b", 64, {}, "triton"),
    "tri-d64-4p-r128-2s": ("cogvideox-5b", 64,
                           {"programs_per_sm": 4, "maxnreg": 128, "num_stages": 2}, "triton"),
    "tri-d64-4p-r128-3s": ("cogvideox-5b", 64,
                           {"programs_per_sm": 4, "maxnreg": 128, "num_stages": 3}, "triton"),
    "tri-d64-3p-r168-3s": ("cogvideox-5b", 64, {"num_stages": 3}, "triton"),
    "d128-3s-2p": ("wan2.2-a14b-720p", 128, {"sm90_stages": 3}),
    "d128-2s-3p-r168": ("wan2.2-a14b-720p", 128,
                        {"sm90_stages": 2, "programs_per_sm": 3, "maxnreg": 168}),
    "d64-3s-3p-r168": ("cogvideox-5b", 64, {"sm90_stages": 3}),  # the D=64 default config
    "d64-3s-2p": ("cogvideox-5b", 64, {"sm90_stages": 3, "programs_per_sm": 2,
                                        "maxnreg": None}),
}


def part_stages(only=None):
    for cname, (preset, dp, over, *kname) in GLUON_CONFIGS.items():
        if only and cname not in only:
            continue
        kernel(kname[0] if kname else "gluon")
        B, H, S, D = PRESETS[preset]
        sets = [make_qkv(B, H, S, D, device="cuda", seed=i) for i in range(2)]
        nxt = rotated(sets)
        launch.TILE_OVERRIDES[dp] = over
        run = fp8_fn(nxt, None)
        try:
            run()
            torch.cuda.synchronize()
            ms = bench(run, 60)
            record(part="stages", config=cname, preset=preset, ms=ms,
                   tflops=tflops(B, H, S, D, ms))
        except Exception as e:  # noqa: BLE001
            record(part="stages", config=cname, error=f"{type(e).__name__}: {e}"[:400])
        launch.TILE_OVERRIDES.clear()
        del sets, nxt
        torch.cuda.empty_cache()
    kernel("triton")


def part_drift(variants=None, lengths=(8192, 65536, 200000)):
    D = 128
    for family in ("normal", "dit"):
        for S in lengths:
            q, k, v = make_qkv(1, 2, S, D, device="cuda", family=family, seed=S)
            rows = torch.randperm(S, device="cuda")[:1024]
            ref, lse_ref = attention_ref_rows(q, k, v, rows)
            outs = each_kernel(lambda q=q, k=k, v=v: fp8dit.attention(q, k, v, backend="fp8",
                                                               return_lse=True), variants)
            for kname, (out, lse) in outs.items():
                st = error_stats(out[0, rows], ref)
                lerr = (lse[0][:, rows].double() - lse_ref).abs()
                record(part="drift", family=family, S=S, kernel=kname, rel_l1=st.rel_l1,
                       cos=st.cos, lse_max_err=lerr.max().item())
            del q, k, v
            torch.cuda.empty_cache()


def use_tiling(tilings, name):
    """Select ``tilings[name]`` = (FP8DIT_KERNEL, launch.WS_TILES entries) for the next calls
    (the scripts that compare loops of the warp-specialized kernel pass theirs)."""
    kname, tiles = tilings[name]
    os.environ["FP8DIT_KERNEL"] = kname
    launch.WS_TILES.clear()
    launch.WS_TILES.update({dp: dict(t) for dp, t in tiles.items()})


def run_parts(namespace, default_parts, after_part=None) -> int:
    """main() of a one-call GPU script: ``--parts`` (functions ``part_<name>`` in
    ``namespace``), each failure recorded and the others still run, ``--out`` JSON rows."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default=default_parts)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    record_env()
    for part in a.parts.split(","):
        try:
            namespace[f"part_{part}"]()
        except Exception as e:  # noqa: BLE001 - keep the other parts' results
            record(part=part, error=f"{type(e).__name__}: {e}"[:600])
        if after_part:
            after_part()
    write_rows(a.out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="check,speed,drift,stages")
    ap.add_argument("--presets", default="")
    ap.add_argument("--configs", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--over", default="",
                    help="warp-specialized kernel settings for check/drift/speed, e.g. "
                         "sm90_pingpong=false,sm90_stages=4")
    a = ap.parse_args()
    over = parse_overrides(a.over)
    record(part="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__,
           triton=triton.__version__, date=datetime.datetime.now().isoformat(timespec="seconds"))
    for part in a.parts.split(","):
        launch.TILE_OVERRIDES.clear()
        if part != "stages" and over:
            launch.TILE_OVERRIDES.update({64: dict(over), 128: dict(over)})
            record(part=part, overrides=over)
        try:
            if part == "speed":
                part_speed([p for p in a.presets.split(",") if p] or None)
            elif part == "stages":
                part_stages([c for c in a.configs.split(",") if c] or None)
            else:
                globals()[f"part_{part}"]()
        except Exception as e:  # noqa: BLE001 - keep the other parts' results
            record(part=part, error=f"{type(e).__name__}: {e}"[:600])
    if a.out:
        with open(a.out, "w") as f:
            json.dump(ROWS, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
