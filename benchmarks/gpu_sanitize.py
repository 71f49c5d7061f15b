"""Small odd shapes for compute-sanitizer (memcheck, racecheck) over all fp8dit kernels.

    compute-sanitizer --tool memcheck  python3 benchmarks/gpu_sanitize.py
    compute-sanitizer --tool racecheck python3 benchmarks/gpu_sanitize.py --quick
    compute-sanitizer --tool memcheck  python3 benchmarks/gpu_sanitize.py --quant-fast

Every case also checks the output against fp64, so a silent wrong answer fails here too.
"""

from __future__ import annotations

import argparse
import sys

import torch

import fp8dit
from fp8dit.testing import attention_ref, attention_varlen_ref, error_stats, make_qkv

DEV = "cuda"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer cases (racecheck is slow)")
    ap.add_argument("--ws-control", action="store_true",
                    help="only a Gluon kernel with nothing but warp_specialize (racecheck's "
                         "control, benchmarks/gluon_ws_control.py)")
    ap.add_argument("--quant-fast", action="store_true",
                    help="with the quantization's session-24 and -25 knobs on (paths for "
                         "finite data, two blocks per program, quantize_kv walked backwards), "
                         "which load without row masks")
    args = ap.parse_args()
    if args.quant_fast:
        from fp8dit import quantize

        quantize.KV_STATS_FULL_FAST = quantize.Q_QUANT_FINITE_FAST = True
        quantize.KV_QUANT_FINITE_FAST = quantize.KV_QUANT_REVERSE = True
        quantize.Q_QUANT_ITERS.update({64: 2, 128: 2})
        quantize.KV_QUANT_ITERS.update({64: 2, 128: 2})
    if not torch.cuda.is_available():
        print("gpu_sanitize: no CUDA GPU here")
        return 1
    if args.ws_control:
        import os

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from gluon_ws_control import run_control, run_control_mbarrier

        bad = 0
        for like in (False, True):
            ok = run_control(like)
            bad += not ok
            print(f"warp_specialize control kernel (attention's partitions: {like}): "
                  f"{'ok' if ok else 'BAD'}", flush=True)
        ok = run_control_mbarrier()
        bad += not ok
        print(f"warp_specialize control kernel with an mbarrier ping-pong: "
              f"{'ok' if ok else 'BAD'}", flush=True)
        return 1 if bad else 0
    cases = [(1, 64, None, False), (113, 72, 3, True), (1000, 72, 1, False), (1000, 128, 3, True)]
    if args.quick:
        cases = cases[1:3]
    bad = runs = 0
    for S, D, splits, causal in cases:
        q, k, v = make_qkv(1, 3, S, D, device="cuda", seed=S)
        out = fp8dit.attention(q, k, v, backend="fp8", num_splits=splits, is_causal=causal)
        st = error_stats(out, attention_ref(q, k, v, is_causal=causal))
        ok = st.rel_l1 <= 0.07 and not st.nan
        bad, runs = bad + (not ok), runs + 1
        print(f"dense S={S} D={D} splits={splits} causal={causal}: {st} {'ok' if ok else 'BAD'}")
    # CogVideoX's processor hands over NHD views of [B, H, S, D] memory (strided tokens)
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2)
               for t in make_qkv(2, 3, 1000, 64, device=DEV, seed=5))
    assert q.stride(2) == 1000 * 64  # heads 1000 tokens apart, tokens 64 elements apart
    out = fp8dit.attention(q, k, v, backend="fp8", num_splits=3)
    st = error_stats(out, attention_ref(q, k, v))
    ok = st.rel_l1 <= 0.07 and not st.nan
    bad, runs = bad + (not ok), runs + 1
    print(f"dense NHD views of HND memory S=1000 D=64 splits=3: {st} {'ok' if ok else 'BAD'}")
    q_lens, k_lens = [113, 0, 300], [200, 17, 0]
    q = torch.randn(sum(q_lens), 2, 72, device="cuda").bfloat16()
    k = torch.randn(sum(k_lens), 2, 72, device="cuda").bfloat16()
    cu_q = torch.tensor([0, 113, 113, 413], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 200, 217, 217], dtype=torch.int32, device="cuda")
    out = fp8dit.attention_varlen(q, k, k, cu_q, cu_k, 300, 200, backend="fp8", num_splits=3)
    ref = attention_varlen_ref(q, k, k, cu_q, cu_k)
    st = error_stats(out, ref)
    ok = st.rel_l1 <= 0.07 and not st.nan
    bad, runs = bad + (not ok), runs + 1
    print(f"varlen with empty sequences: {st} {'ok' if ok else 'BAD'}")
    # key-padding masks (fp8dit.key_padding): dense inputs, per-sequence key lengths, the
    # dropped keys non-finite so that a read of them shows in the output too; each case also
    # with the lengths kept on the device, as under CUDA-graph capture (the plan for all keys;
    # blocks and split pieces past a sequence's keys are zeros, visited masked)
    import fp8dit.key_padding as kp
    from fp8dit.recipes import get_recipe

    capturing = kp._capturing
    for S, D, lens in ((1000, 128, [1000, 257, 1]), (300, 72, [299, 13])):
        q, k, v = make_qkv(len(lens), 3, S, D, device=DEV, seed=S + 1)
        kg, vg = k.clone(), v.clone()
        for b, n in enumerate(lens):
            kg[b, n:] = float("nan")
            vg[b, n:] = float("inf")
        mask = (torch.arange(S, device=DEV)[None, :]
                < torch.tensor(lens, device=DEV)[:, None])[:, None, None, :]
        for where in ("host", "device"):  # the host path runs first: it marks the mask shape
            kp._capturing = (lambda m: True) if where == "device" else capturing
            try:
                out, _, why = kp.key_padding_attention(q, kg, vg, mask, scale=D ** -0.5,
                                                       recipe=get_recipe(None),
                                                       return_lse=False, num_splits=3)
            finally:
                kp._capturing = capturing
            worst = max(error_stats(out[b:b + 1], attention_ref(q[b:b + 1], k[b:b + 1, :n],
                                                                 v[b:b + 1, :n])).rel_l1
                        for b, n in enumerate(lens))
            ok = why is None and worst <= 0.07 and bool(torch.isfinite(out).all())
            bad, runs = bad + (not ok), runs + 1
            print(f"key padding, lengths on the {where}, S={S} D={D} kept={lens} splits=3: "
                  f"worst rel_l1 {worst:.4f} {'ok' if ok else 'BAD'}")
    # the rotary embedding fused into the quantization (fp8dit.rope): table rows read per token
    # (masked at the sequence's end and, with a range, outside it), padded head dims (a half
    # row of 36 of the tables' 64 columns), both styles, split pieces, a key mask
    from fp8dit.rope import Rotary, apply_rotary, rope_tables

    for S, D, style, dtype, start, rows, splits in (
            (113, 72, "wan", torch.bfloat16, 0, 113, 3),
            (1000, 128, "wan", torch.float32, 0, 1000, 1),
            (113, 64, "apply_rotary_emb", torch.float32, 17, 80, 3),
            (1000, 72, "apply_rotary_emb", torch.float32, 0, 990, 3)):
        q, k, v = make_qkv(2, 3, S, D, device=DEV, seed=S + D, layout="NHD")
        ang = torch.rand(rows, D // 2, device=DEV).mul(20.0).repeat_interleave(2, -1)
        rot = Rotary(ang.cos().to(dtype), ang.sin().to(dtype), start, style)
        qr, kr = (apply_rotary(t, rot.cos, rot.sin, "NHD", start, style) for t in (q, k))
        out = fp8dit.attention(q, k, v, backend="fp8", num_splits=splits, rotary=rot)
        st = error_stats(out, attention_ref(qr, kr, v, layout="NHD"))
        ok = st.rel_l1 <= 0.07 and not st.nan
        bad, runs = bad + (not ok), runs + 1
        print(f"rotary {style} {str(dtype)[6:]} tables, tokens {start}..{start + rows} of "
              f"S={S} D={D} splits={splits}: {st} {'ok' if ok else 'BAD'}")
    S, D, lens = 300, 72, [299, 13]
    q, k, v = make_qkv(len(lens), 3, S, D, device=DEV, seed=7, layout="NHD")
    ang = torch.rand(S, D // 2, device=DEV).mul(20.0).repeat_interleave(2, -1)
    rot = Rotary(ang.cos(), ang.sin())
    kg = k.clone()
    for b, n in enumerate(lens):
        kg[b, n:] = float("nan")
    mask = (torch.arange(S, device=DEV)[None, :]
            < torch.tensor(lens, device=DEV)[:, None])[:, None, None, :]
    out, _, why = kp.key_padding_attention(q, kg, v, mask, scale=D ** -0.5,
                                           recipe=get_recipe(None), return_lse=False,
                                           num_splits=3, rope=rope_tables(rot))
    qr, kr = (apply_rotary(t, rot.cos, rot.sin) for t in (q, k))
    worst = max(error_stats(out[b:b + 1], attention_ref(qr[b:b + 1], kr[b:b + 1, :n],
                                                         v[b:b + 1, :n], layout="NHD")).rel_l1
                for b, n in enumerate(lens))
    ok = why is None and worst <= 0.07 and bool(torch.isfinite(out).all())
    bad, runs = bad + (not ok), runs + 1
    print(f"rotary with key padding S={S} D={D} kept={lens} splits=3: worst rel_l1 "
          f"{worst:.4f} {'ok' if ok else 'BAD'}")
    torch.cuda.synchronize()
    print(f"{runs - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
