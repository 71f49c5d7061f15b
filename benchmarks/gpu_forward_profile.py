"""Where the Wan2.2-A14B forward's time goes, per GPU kernel, with SDPA cuDNN and with fp8dit.

Issue 5's 1.45x is a few ms per forward away; this says which kernels differ between the two
backends (torch.profiler, device time per forward, kernels grouped by name) and times Wan's
cross-attention shape (75,600 queries x 512 text keys) on SDPA cuDNN and on fp8dit's FP8 path,
which ``backend="auto"`` does not take there (``dispatch.FP8_MIN_TOKENS``).

    python benchmarks/gpu_forward_profile.py --modes eager compile --out results.json
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_wan_forward import forward_inputs, sdpa_context, time_ms  # noqa: E402
from gpu_gluon import ROWS, record_env, write_rows  # noqa: E402


def kernel_times(fn, n: int) -> tuple[dict, float]:
    """Device ms per call of each kernel name over ``n`` profiled calls, and their sum."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    per = collections.Counter()
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name] += ev.device_time / 1e3 / n
    return dict(per), sum(per.values())


def group(name: str) -> str:
    n = name.lower()
    if "attention_fwd" in n or "sdpa" in n or "fmha" in n or "flash" in n:
        return "attention"
    if any(k in n for k in ("kv_channel_stats", "kv_stats", "quantize_", "attention_reduce")):
        return "fp8dit quant/reduce"
    if "gemm" in n or "sm90_xmma" in n or "cutlass" in n or "nvjet" in n:
        return "gemm"
    return "other"


def profile_forward(mode: str, layers: int, repeats: int) -> list[dict]:
    from fp8dit.demo import PRESETS, build_model
    from fp8dit.integrations import diffusers as fd

    preset = PRESETS["wan2.2-a14b-720p"]
    model = build_model(preset, layers, 0, torch.device("cuda"))
    inputs = forward_inputs(preset, 1, torch.device("cuda"))
    fd.register()
    rows = []
    for name in ("sdpa-cudnn", "fp8dit"):
        (fd.enable if name == "fp8dit" else fd.disable)(model)
        torch._dynamo.reset()
        fn = torch.compile(model) if mode == "compile" else model

        def call(fn=fn, name=name):
            if name == "fp8dit":
                return fn(**inputs, return_dict=False)[0]
            with sdpa_context("cudnn"):
                return fn(**inputs, return_dict=False)[0]

        with torch.no_grad():
            ms = time_ms(call, 2, repeats)[0]
            per, total = kernel_times(call, 2)
        groups = collections.Counter()
        for k, v in per.items():
            groups[group(k)] += v
        print(f"\n== {mode} {name}: {ms:.1f} ms per forward (events), kernels {total:.1f} ms",
              flush=True)
        for g, v in sorted(groups.items(), key=lambda x: -x[1]):
            print(f"   {g:22s} {v:9.2f} ms")
        for k, v in sorted(per.items(), key=lambda x: -x[1])[:25]:
            print(f"   {v:9.3f}  {k[:120]}")
        rows.append(dict(part="forward", mode=mode, backend=name, ms=round(ms, 2),
                         kernel_ms=round(total, 2),
                         groups={g: round(v, 3) for g, v in groups.items()},
                         kernels={k[:160]: round(v, 4) for k, v in per.items()}))
    fd.disable(model)
    torch._dynamo.reset()
    return rows


def cross_attention(repeats: int) -> list[dict]:
    """Wan 720p cross-attention: 75,600 queries, 512 text keys, 40 heads x 128, NHD."""
    import fp8dit
    from fp8dit.sdpa import sdpa_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    sets = []
    for _ in range(3):  # q alone is 774 MB: three sets keep L2 from flattering
        q = torch.randn(1, 75600, 40, 128, device="cuda", generator=g).to(torch.bfloat16)
        k = torch.randn(1, 512, 40, 128, device="cuda", generator=g).to(torch.bfloat16)
        v = torch.randn(1, 512, 40, 128, device="cuda", generator=g).to(torch.bfloat16)
        sets.append((q, k, v))
    it = [0]

    def runner(kind):
        def fn():
            q, k, v = sets[it[0] % 3]
            it[0] += 1
            if kind == "sdpa-cudnn":
                with sdpa_context("cudnn"):
                    return sdpa_attention(q, k, v, layout="NHD", scale=None, is_causal=False,
                                          return_lse=False)
            return fp8dit.attention(q, k, v, backend=kind)
        return fn

    rows = []
    ref = None
    for kind in ("sdpa-cudnn", "fp8", "auto"):
        fn = runner(kind)
        ms = time_ms(fn, 3, repeats)[0]
        per, total = kernel_times(fn, 3)
        it[0] = 0
        out = fn()
        out = out[0] if isinstance(out, tuple) else out
        if ref is None:
            ref = out.float()
        cos = torch.nn.functional.cosine_similarity(out.float().flatten(), ref.flatten(),
                                                    dim=0).item()
        print(f"\n== cross-attention {kind}: {ms:.3f} ms (events), kernels {total:.3f} ms, "
              f"cos vs cudnn {cos:.6f}", flush=True)
        for k, v in sorted(per.items(), key=lambda x: -x[1])[:8]:
            print(f"   {v:8.3f}  {k[:110]}")
        rows.append(dict(part="cross-attention", backend=kind, ms=round(ms, 3),
                         kernel_ms=round(total, 3), cos_vs_cudnn=cos,
                         kernels={k[:160]: round(v, 4) for k, v in per.items()}))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", nargs="+", default=["eager", "compile"],
                   choices=("eager", "compile"))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-cross", action="store_true", help="skip the cross-attention timing")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_forward_profile: needs a CUDA GPU; torch sees none (nothing measured)")
        return 2
    record_env()
    if not args.no_cross:
        ROWS.extend(cross_attention(max(args.repeats, 10)))
    for mode in args.modes:
        ROWS.extend(profile_forward(mode, args.layers, args.repeats))
    write_rows(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
