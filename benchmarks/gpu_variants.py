"""One H200 call that A/B-tests kernel variants: speed, accuracy, crossover, profile, etc.

    python3 benchmarks/gpu_variants.py --parts speed,drift,rot,crossover,quant_profile,\
        determinism,d256,flux,speed_cog,speed_rot [--out $OUT/variants.json]

A variant is a recipe plus a tile config (``launch.TILE_OVERRIDES``). Variants measured once and
then removed from the kernels are described in benchmarks/NOTES.md (session 2). Every timed
backend runs in this one process on the same inputs, rotated over two input sets; accuracy is
against fp64 on sampled query rows. Prints one line per measurement and a JSON list (``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys

import torch
import torch.nn.functional as F
import triton

import fp8dit
from fp8dit import launch
from fp8dit.testing import attention_ref_rows, error_stats, make_qkv

BASE128 = dict(block_m=64, block_n=128, num_warps=4, num_stages=3, programs_per_sm=2)
# name -> (recipe, tile config for D<=128). Variants measured once and then removed from the
# kernel (old softmax, PV promotion every 32, alternating V sign) are in benchmarks/NOTES.md.
SPEED_VARIANTS = {
    "default": ("int8qk-fp8pv", dict(BASE128)),
    "fp8-qk": ("fp8", dict(BASE128)),
    "bf16-pv": ("int8qk-bf16pv", dict(BASE128)),
    "128x128-8w": ("int8qk-fp8pv", dict(block_m=128, block_n=128, num_warps=8, num_stages=3,
                                        programs_per_sm=1)),
    # Three programs per SM (12 warps) with registers capped at 168 per thread.
    "64x128-2s-2p": ("int8qk-fp8pv", dict(BASE128, num_stages=2)),
    "64x128-2s-3p-r168": ("int8qk-fp8pv", dict(BASE128, num_stages=2, programs_per_sm=3,
                                               maxnreg=168)),
    "64x64-3s-3p-r168": ("int8qk-fp8pv", dict(BASE128, block_n=64, programs_per_sm=3,
                                              maxnreg=168)),
    "64x64-2s-3p-r168": ("int8qk-fp8pv", dict(BASE128, block_n=64, num_stages=2,
                                              programs_per_sm=3, maxnreg=168)),
    "rot": ("int8qk-fp8pv-rot", dict(BASE128)),
    "fp8-plain": ("fp8-plain", dict(BASE128)),
    "per-tensor-fp8": ("per-tensor-fp8", dict(BASE128)),
}
DRIFT_VARIANTS = ("default", "fp8-qk", "bf16-pv")
D256_CONFIGS = {
    "64x64-8w-2s-2p": dict(block_m=64, block_n=64, num_warps=8, num_stages=2, programs_per_sm=2),
    "64x64-4w-2s-2p": dict(block_m=64, block_n=64, num_warps=4, num_stages=2, programs_per_sm=2),
    "128x64-8w-2s-1p": dict(block_m=128, block_n=64, num_warps=8, num_stages=2,
                            programs_per_sm=1),
    "64x128-8w-2s-1p": dict(block_m=64, block_n=128, num_warps=8, num_stages=2,
                            programs_per_sm=1),
}
ROWS = []


def log(*a):
    print(*a, flush=True)


def record(**kw):
    ROWS.append(kw)
    log(json.dumps(kw))


def tflops(B, H, S, D, ms):
    return 4 * B * H * S * S * D / (ms * 1e-3) / 1e12


def parse_overrides(text: str) -> dict:
    """``"sm90_pingpong=false,sm90_stages=4"`` -> tile overrides (true/false, else integers)."""
    out = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        flag = value.lower()
        out[key] = flag == "true" if flag in ("true", "false") else int(value)
    return out


def bench(fn, est_ms: float) -> float:
    return triton.testing.do_bench(fn, warmup=max(50.0, 3 * est_ms),
                                   rep=max(300.0, 20 * est_ms), return_mode="median")


def use(variant_cfg: dict | None, head_dim_padded: int = 128) -> None:
    launch.TILE_OVERRIDES.clear()
    if variant_cfg is not None:
        launch.TILE_OVERRIDES[head_dim_padded] = dict(variant_cfg)


def rotated(sets):
    state = {"i": 0}

    def nxt():
        state["i"] = (state["i"] + 1) % len(sets)
        return sets[state["i"]]
    return nxt


def cudnn_fn(nxt):
    def run():
        q, k, v = nxt()
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                  v.transpose(1, 2))
    return run


def fp8_fn(nxt, recipe):
    def run():
        q, k, v = nxt()
        return fp8dit.attention(q, k, v, backend="fp8", recipe=recipe)
    return run


def part_speed(shape=(1, 40, 75600, 128), name="wan2.2-a14b-720p", only=None):
    B, H, S, D = shape
    dp = 64 if D <= 64 else 128
    sets = [make_qkv(B, H, S, D, device="cuda", seed=i) for i in range(2)]
    nxt = rotated(sets)
    use(None)
    ms = bench(cudnn_fn(nxt), 200)
    base = ms
    record(part="speed", shape=name, variant="sdpa-cudnn", ms=ms, tflops=tflops(B, H, S, D, ms))
    for vname, (recipe, cfg) in SPEED_VARIANTS.items():
        if only and vname not in only:
            continue
        use(cfg, dp)
        try:
            fn = fp8_fn(nxt, recipe)
            fn()
            torch.cuda.synchronize()
            ms = bench(fn, 180)
            record(part="speed", shape=name, variant=vname, recipe=recipe, ms=ms,
                   tflops=tflops(B, H, S, D, ms), vs_cudnn=base / ms)
        except Exception as e:  # noqa: BLE001 - a failing variant is a result too
            record(part="speed", shape=name, variant=vname, error=f"{type(e).__name__}: {e}"[:300])
    use(None)
    ms = bench(cudnn_fn(nxt), 200)
    record(part="speed", shape=name, variant="sdpa-cudnn-again", ms=ms,
           tflops=tflops(B, H, S, D, ms))
    del sets
    torch.cuda.empty_cache()


def part_speed_rot():
    part_speed(only=("default", "rot"))


def part_rot():
    """Hadamard-rotated Q/K against the default: accuracy vs fp64 (with LSE) on both families."""
    for family in ("normal", "dit"):
        for H, S in ((4, 8192), (2, 65536)):
            q, k, v = make_qkv(1, H, S, 128, device="cuda", family=family, seed=S)
            rows = torch.randperm(S, device="cuda")[:1024]
            ref, lse_ref = attention_ref_rows(q, k, v, rows)
            use(None)
            for recipe in ("int8qk-fp8pv", "int8qk-fp8pv-rot"):
                out, lse = fp8dit.attention(q, k, v, backend="fp8", recipe=recipe,
                                            return_lse=True)
                lerr = (lse[0][:, rows].double() - lse_ref).abs()
                record(part="rot", family=family, H=H, S=S, recipe=recipe,
                       **error_stats(out[0, rows], ref).as_dict(),
                       lse_max_err=lerr.max().item(), lse_mean_err=lerr.mean().item())
            del q, k, v
            torch.cuda.empty_cache()


def part_speed_cog():
    part_speed((1, 48, 17776, 64), "cogvideox-5b",
               only=("default", "64x128-2s-3p-r168", "64x64-3s-3p-r168", "64x64-2s-3p-r168"))


def part_speed_hunyuan():
    part_speed((1, 24, 118800, 128), "hunyuanvideo-720p",
               only=("default", "64x128-2s-3p-r168", "64x64-3s-3p-r168"))


def part_determinism():
    """10 calls bitwise equal (plain and forced split-KV), CUDA-graph replay equal to eager."""
    for D, H, S, splits in ((128, 8, 8192, None), (128, 8, 8192, 3), (64, 16, 5000, 3)):
        q, k, v = make_qkv(1, H, S, D, device="cuda", seed=7)
        use(None)
        first = fp8dit.attention(q, k, v, backend="fp8", num_splits=splits)
        same = all(torch.equal(first, fp8dit.attention(q, k, v, backend="fp8",
                                                       num_splits=splits)) for _ in range(9))
        out = torch.empty_like(first)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fp8dit.attention(q, k, v, backend="fp8", num_splits=splits)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out.copy_(fp8dit.attention(q, k, v, backend="fp8", num_splits=splits))
        out.zero_()
        g.replay()
        torch.cuda.synchronize()
        record(part="determinism", D=D, H=H, S=S, num_splits=splits, bitwise_10_runs=same,
               graph_equal=torch.equal(out, first))


def part_drift():
    D = 128
    for family in ("normal", "dit"):
        for S in (8192, 65536, 200000):
            q, k, v = make_qkv(1, 2, S, D, device="cuda", family=family, seed=S)
            rows = torch.randperm(S, device="cuda")[:1024]
            ref, lse_ref = attention_ref_rows(q, k, v, rows)
            for vname in DRIFT_VARIANTS:
                recipe, cfg = SPEED_VARIANTS[vname]
                use(cfg)
                out, lse = fp8dit.attention(q, k, v, backend="fp8", recipe=recipe,
                                            return_lse=True)
                st = error_stats(out[0, rows], ref)
                lerr = (lse[0][:, rows].double() - lse_ref).abs()
                record(part="drift", family=family, S=S, variant=vname, **st.as_dict(),
                       lse_max_err=lerr.max().item(), lse_mean_err=lerr.mean().item())
            del q, k, v
            torch.cuda.empty_cache()


def part_quant_profile():
    """CUDA time of each kernel of one fp8dit call (torch.profiler), at short and long shapes."""
    from torch.profiler import ProfilerActivity, profile
    for name, (B, H, S, D) in {"flux-1024": (1, 24, 4608, 128),
                               "cogvideox-5b": (1, 48, 17776, 64),
                               "wan2.2-a14b-720p": (1, 40, 75600, 128)}.items():
        qkv = make_qkv(B, H, S, D, device="cuda", seed=3)
        q, k, v = qkv
        use(None)
        for _ in range(3):
            fp8dit.attention(q, k, v, backend="fp8")
        torch.cuda.synchronize()
        reps = 10
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fp8dit.attention(q, k, v, backend="fp8")
            torch.cuda.synchronize()
        per = {}
        for e in prof.key_averages():
            t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if t:
                per[e.key[:60]] = round(t / reps / 1e3, 4)  # ms per call
        record(part="quant_profile", shape=name, kernels_ms=per)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            f_c = cudnn_fn(lambda qkv=qkv: qkv)
            f_c()
            ms_c = bench(f_c, 1)
        f_f = fp8_fn(lambda qkv=qkv: qkv, None)
        ms_f = bench(f_f, 1)
        record(part="quant_profile", shape=name, cudnn_ms=ms_c, fp8dit_ms=ms_f,
               vs_cudnn=ms_c / ms_f)
        del q, k, v, qkv
        torch.cuda.empty_cache()


def part_crossover():
    """fp8dit (explicit fp8) against cuDNN over sequence length, D=128 and D=64: where does FP8
    start to pay? (auto dispatch falls back to SDPA below the crossover)."""
    for D, H in ((128, 24), (64, 48)):
        for S in (2048, 4096, 6144, 8192, 12288, 16384):
            qkv = make_qkv(1, H, S, D, device="cuda", seed=S)
            use(None)
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
                f_c = cudnn_fn(lambda qkv=qkv: qkv)
                f_c()
                ms_c = bench(f_c, 1)
            f_f = fp8_fn(lambda qkv=qkv: qkv, "int8qk-fp8pv")
            f_f()
            ms_f = bench(f_f, 1)
            record(part="crossover", D=D, H=H, S=S, cudnn_ms=ms_c, fp8dit_ms=ms_f,
                   vs_cudnn=ms_c / ms_f)
            del qkv
    torch.cuda.empty_cache()


def part_d256():
    B, H, S, D = 1, 16, 16384, 256
    sets = [make_qkv(B, H, S, D, device="cuda", seed=i) for i in range(2)]
    nxt = rotated(sets)
    use(None)
    try:
        ms = bench(cudnn_fn(nxt), 20)
        base = ms
        record(part="d256", variant="sdpa-cudnn", ms=ms, tflops=tflops(B, H, S, D, ms))
    except Exception as e:  # noqa: BLE001
        base = None
        record(part="d256", variant="sdpa-cudnn", error=str(e)[:200])
    q, k, v = sets[0]
    ref_rows = torch.arange(0, S, 37, device="cuda")[:512]
    for cname, cfg in D256_CONFIGS.items():
        use(cfg, 256)
        try:
            fn = fp8_fn(nxt, "int8qk-fp8pv")
            fn()
            ms = bench(fn, 20)
            out = fp8dit.attention(q, k, v, backend="fp8")
            s = (q[0, ref_rows].double().transpose(0, 1) @ k[0].double().permute(1, 2, 0)) \
                / math.sqrt(D)
            ref = (torch.softmax(s, -1) @ v[0].double().transpose(0, 1)).transpose(0, 1)
            st = error_stats(out[0, ref_rows], ref)
            record(part="d256", variant=cname, ms=ms, tflops=tflops(B, H, S, D, ms),
                   vs_cudnn=(base / ms) if base else None, rel_l1=st.rel_l1, cos=st.cos)
        except Exception as e:  # noqa: BLE001
            record(part="d256", variant=cname, error=f"{type(e).__name__}: {e}"[:300])
    use(None)
    del sets
    torch.cuda.empty_cache()


def part_flux(shape=(1, 24, 4608, 128)):
    """Eager vs CUDA-graph replay: how much of the short-sequence gap is host launch overhead."""
    B, H, S, D = shape
    q, k, v = make_qkv(B, H, S, D, device="cuda", seed=1)
    use(None)
    fns = {
        "sdpa-cudnn": lambda: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)),
        "fp8dit": lambda: fp8dit.attention(q, k, v, backend="fp8"),
    }
    for name, fn in fns.items():
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            fn()
            torch.cuda.synchronize()
            eager = bench(fn, 1)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            graph = bench(g.replay, 1)
        record(part="flux", variant=name, eager_ms=eager, graph_ms=graph,
               tflops_graph=tflops(B, H, S, D, graph))
    # The parts of fp8dit's time under a graph: quantization alone vs the whole call.
    from fp8dit import launch as L
    plan, cfg = L.plan_for([S], [S], varlen=False, num_heads=H, num_kv_heads=H, head_dim=D,
                           is_causal=False, device=q.device)
    recipe = fp8dit.recipes.get_recipe(None)
    strides = L._bthd_strides(q, "NHD")

    def quant():
        return L.quantize_stage(plan, recipe, 1 / math.sqrt(D), q, strides, k, strides, v,
                                strides)
    quant()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        quant()
    record(part="flux", variant="fp8dit-quantize-only", graph_ms=bench(g.replay, 1),
           eager_ms=bench(quant, 1))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="speed,drift,quant_profile,crossover")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_variants: no CUDA GPU here")
        return 1
    log(f"gpu={torch.cuda.get_device_name()} torch={torch.__version__} "
        f"triton={triton.__version__} date={datetime.datetime.now().isoformat()}")
    for part in args.parts.split(","):
        try:
            globals()[f"part_{part}"]()
        except Exception as e:  # noqa: BLE001 - keep the other parts' results
            record(part=part, error=f"{type(e).__name__}: {e}"[:500])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(ROWS, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
