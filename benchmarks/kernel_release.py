"""The attention kernels on the installed Triton release: correctness against fp64, and one
launch to profile.

``benchmarks/triton_release.sh`` runs this beside ``fp8dit bench`` for each Triton release, on
one GPU machine, so that releases are compared on the same card and inputs.

    python benchmarks/kernel_release.py check              # both kernels against fp64
    python benchmarks/kernel_release.py profile --preset wan2.2-a14b-720p --kernel gluon-ws

``check`` prints one JSON line per (kernel, case) with rel-L1, cos, RMSE and the largest LSE
error against fp64 (the whole output at medium lengths; chosen query rows of every head at the
presets' lengths, where fp64 of the whole call would take minutes), and the two kernels against
each other on the same call. It exits 1 when a kernel misses the test suite's bounds.
``profile`` quantizes the preset's inputs once and runs the attention stage (``--launches``
times): the launches ``ncu --launch-skip`` picks from.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

# The test suite's bounds for an fp8 call on i.i.d. normal inputs (tests/test_attention_fp8.py).
REL_L1_MAX = 0.07
COS_MIN = 0.997
LSE_ABS_MAX = 0.05
# Medium lengths: both kernels' unmasked main loops run (8,192 keys and up), fp64 of the whole
# output stays cheap. (B, H, S, D)
CASES = [(1, 4, 8192, 128), (2, 3, 9000, 128), (1, 4, 8192, 64), (1, 3, 12345, 64)]
ROWS_PER_HEAD = 512  # query rows of every head checked against fp64 at the presets' lengths


def _run(q, k, v, kernel: str):
    """(out, lse) of ``fp8dit.attention`` with ``kernel`` forced (NHD), and the kernel that ran."""
    import fp8dit
    from fp8dit import attend

    os.environ["FP8DIT_KERNEL"] = kernel
    B, S, H, D = q.shape
    _, launch = attend.plan_for([S] * B, [k.shape[1]] * B, varlen=False, num_heads=H,
                                num_kv_heads=k.shape[2], head_dim=D, is_causal=False,
                                device=q.device)
    out, lse = fp8dit.attention(q, k, v, backend="fp8", return_lse=True)
    return out, lse, launch.kernel


def _stats(out, ref, lse=None, ref_lse=None) -> dict:
    from fp8dit.testing import error_stats

    st = error_stats(out, ref)
    row = dict(rel_l1=round(st.rel_l1, 5), cos=round(st.cos, 6), rmse=float(f"{st.rmse:.4g}"),
               nan=st.nan)
    if lse is not None:
        row["lse_max_err"] = float(f"{(lse.double() - ref_lse).abs().max().item():.4g}")
    return row


def _ok(row: dict) -> bool:
    return (not row["nan"] and row["rel_l1"] <= REL_L1_MAX and row["cos"] >= COS_MIN
            and row.get("lse_max_err", 0.0) <= LSE_ABS_MAX)


def check(presets: list[str]) -> int:
    from fp8dit.testing import attention_ref, attention_ref_rows, make_qkv
    from fp8dit.tools.presets import PRESETS

    dev = torch.device("cuda")
    bad = 0
    for B, H, S, D in CASES:
        q, k, v = make_qkv(B, H, S, D, device=dev, seed=S + D)
        ref, ref_lse = attention_ref(q, k, v, return_lse=True)
        outs = {}
        for kernel in ("gluon-ws", "triton"):
            out, lse, ran = _run(q, k, v, kernel)
            row = dict(case=f"B{B}-H{H}-S{S}-D{D}", kernel=ran, vs="fp64",
                       **_stats(out, ref, lse, ref_lse))
            row["ok"] = _ok(row) and ran == kernel
            bad += not row["ok"]
            outs[kernel] = out
            print(json.dumps(row), flush=True)
        print(json.dumps(dict(case=f"B{B}-H{H}-S{S}-D{D}", kernel="gluon-ws", vs="triton",
                              **_stats(outs["gluon-ws"], outs["triton"]))), flush=True)
        del q, k, v, ref, outs
    for name in presets:
        p = PRESETS[name]
        q, k, v = make_qkv(p.B, p.H, p.S, p.D, device=dev, seed=p.S)
        rows = torch.linspace(0, p.S - 1, ROWS_PER_HEAD, device=dev).round().long()
        ref, ref_lse = attention_ref_rows(q, k, v, rows)
        outs = {}
        for kernel in ("gluon-ws", "triton"):
            out, lse, ran = _run(q, k, v, kernel)
            row = dict(case=name, kernel=ran, vs=f"fp64 ({ROWS_PER_HEAD} rows per head)",
                       **_stats(out[0, rows], ref, lse[0][:, rows], ref_lse))
            row["ok"] = _ok(row) and ran == kernel
            bad += not row["ok"]
            outs[kernel] = out
            print(json.dumps(row), flush=True)
        print(json.dumps(dict(case=name, kernel="gluon-ws", vs="triton (whole output)",
                              **_stats(outs["gluon-ws"], outs["triton"]))), flush=True)
        del q, k, v, outs
        torch.cuda.empty_cache()
    return 1 if bad else 0


def profile(preset: str, kernel: str, launches: int) -> int:
    from fp8dit import attend, quantize
    from fp8dit.recipes import get_recipe
    from fp8dit.testing import make_qkv
    from fp8dit.tools.presets import PRESETS

    os.environ["FP8DIT_KERNEL"] = kernel
    p, dev = PRESETS[preset], torch.device("cuda")
    q, k, v = make_qkv(p.B, p.H, p.S, p.D, device=dev, seed=1)
    rec = get_recipe(None)
    plan, launch = attend.plan_for([p.S] * p.B, [p.S] * p.B, varlen=False, num_heads=p.H,
                                   num_kv_heads=p.H, head_dim=p.D, is_causal=False, device=dev,
                                   recipe=rec)
    if launch.kernel != kernel:
        print(f"profile: {kernel} was asked for, {launch.kernel} runs", file=sys.stderr)
        return 1
    out = torch.empty_like(q)
    lse = torch.empty(p.B, p.H, p.S, device=dev, dtype=torch.float32)
    st = [attend._bthd_strides(t, "NHD") for t in (q, k, v, out)]
    ws = quantize.quantize_stage(plan, rec, 1.0 / math.sqrt(p.D), q, st[0], k, st[1], v, st[2],
                                 kv_perm16=kernel == "gluon-ws")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(launches):
        start.record()
        attend.attention_stage(plan, launch, ws, out, st[3], lse,
                               (lse.stride(0), lse.stride(1), lse.stride(2)))
        end.record()
        torch.cuda.synchronize()
        print(f"launch {i}: {start.elapsed_time(end):.2f} ms", flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("--preset", action="append", default=None,
                   help="presets checked on sampled rows (default wan2.2-a14b-720p, cogvideox-5b)")
    pr = sub.add_parser("profile")
    pr.add_argument("--preset", default="wan2.2-a14b-720p")
    pr.add_argument("--kernel", default="gluon-ws", choices=("gluon-ws", "triton"))
    pr.add_argument("--launches", type=int, default=3)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernel_release.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    if a.cmd == "check":
        return check(a.preset or ["wan2.2-a14b-720p", "cogvideox-5b"])
    return profile(a.preset, a.kernel, a.launches)


if __name__ == "__main__":
    sys.exit(main())
