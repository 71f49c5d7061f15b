"""Small odd shapes for compute-sanitizer (memcheck, racecheck) over all fp8dit kernels.

    compute-sanitizer --tool memcheck  python3 benchmarks/gpu_sanitize.py
    compute-sanitizer --tool racecheck python3 benchmarks/gpu_sanitize.py --quick

Every case also checks the output against fp64, so a silent wrong answer fails here too: a
case passes at rel-L1 of at most 0.07 with no NaN (and, with key padding, a finite output).
"""

from __future__ import annotations

import argparse
import sys

import torch

import fp8dit
from fp8dit.testing import attention_ref, attention_varlen_ref, error_stats, make_qkv

DEV = "cuda"
MAX_REL_L1 = 0.07


class Tally:
    """Counts the cases and prints one line each."""

    def __init__(self):
        self.runs = self.bad = 0

    def case(self, label: str, ok: bool, detail) -> None:
        self.runs += 1
        self.bad += not ok
        print(f"{label}: {detail} {'ok' if ok else 'BAD'}", flush=True)

    def against(self, label: str, out, ref) -> None:
        """A case whose output is checked against the fp64 reference ``ref``."""
        st = error_stats(out, ref)
        self.case(label, st.rel_l1 <= MAX_REL_L1 and not st.nan, st)

    def per_sequence(self, label: str, out, why, refs) -> None:
        """A key-padding case: ``refs[b]`` is sequence b's reference over its kept keys."""
        worst = max(error_stats(out[b:b + 1], ref).rel_l1 for b, ref in enumerate(refs))
        ok = why is None and worst <= MAX_REL_L1 and bool(torch.isfinite(out).all())
        self.case(label, ok, f"worst rel_l1 {worst:.4f}")


def _key_mask(lens: list[int], S: int):
    """The [B, 1, 1, S] boolean mask keeping each sequence's first ``lens[b]`` keys."""
    return (torch.arange(S, device=DEV)[None, :]
            < torch.tensor(lens, device=DEV)[:, None])[:, None, None, :]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer cases (racecheck is slow)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_sanitize: needs a CUDA GPU; torch sees none (nothing checked)")
        return 1
    tally = Tally()
    cases = [(1, 64, None, False), (113, 72, 3, True), (1000, 72, 1, False), (1000, 128, 3, True)]
    if args.quick:
        cases = cases[1:3]
    for S, D, splits, causal in cases:
        q, k, v = make_qkv(1, 3, S, D, device=DEV, seed=S)
        out = fp8dit.attention(q, k, v, backend="fp8", num_splits=splits, is_causal=causal)
        tally.against(f"dense S={S} D={D} splits={splits} causal={causal}", out,
                      attention_ref(q, k, v, is_causal=causal))
    # CogVideoX's processor hands over NHD views of [B, H, S, D] memory (strided tokens)
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2)
               for t in make_qkv(2, 3, 1000, 64, device=DEV, seed=5))
    assert q.stride(2) == 1000 * 64  # heads 1000 tokens apart, tokens 64 elements apart
    out = fp8dit.attention(q, k, v, backend="fp8", num_splits=3)
    tally.against("dense NHD views of HND memory S=1000 D=64 splits=3", out,
                  attention_ref(q, k, v))
    q_lens, k_lens = [113, 0, 300], [200, 17, 0]
    q = torch.randn(sum(q_lens), 2, 72, device=DEV).bfloat16()
    k = torch.randn(sum(k_lens), 2, 72, device=DEV).bfloat16()
    cu_q = torch.tensor([0, 113, 113, 413], dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0, 200, 217, 217], dtype=torch.int32, device=DEV)
    out = fp8dit.attention_varlen(q, k, k, cu_q, cu_k, 300, 200, backend="fp8", num_splits=3)
    tally.against("varlen with empty sequences", out, attention_varlen_ref(q, k, k, cu_q, cu_k))
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
        refs = [attention_ref(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n])
                for b, n in enumerate(lens)]
        for where in ("host", "device"):  # the host path runs first: it marks the mask shape
            kp._capturing = (lambda m: True) if where == "device" else capturing
            try:
                out, _, why = kp.key_padding_attention(q, kg, vg, _key_mask(lens, S),
                                                       scale=D ** -0.5, recipe=get_recipe(None),
                                                       return_lse=False, num_splits=3)
            finally:
                kp._capturing = capturing
            tally.per_sequence(f"key padding, lengths on the {where}, S={S} D={D} kept={lens} "
                               "splits=3", out, why, refs)
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
        tally.against(f"rotary {style} {str(dtype)[6:]} tables, tokens {start}..{start + rows} "
                      f"of S={S} D={D} splits={splits}", out,
                      attention_ref(qr, kr, v, layout="NHD"))
    S, D, lens = 300, 72, [299, 13]
    q, k, v = make_qkv(len(lens), 3, S, D, device=DEV, seed=7, layout="NHD")
    ang = torch.rand(S, D // 2, device=DEV).mul(20.0).repeat_interleave(2, -1)
    rot = Rotary(ang.cos(), ang.sin())
    kg = k.clone()
    for b, n in enumerate(lens):
        kg[b, n:] = float("nan")
    out, _, why = kp.key_padding_attention(q, kg, v, _key_mask(lens, S), scale=D ** -0.5,
                                           recipe=get_recipe(None), return_lse=False,
                                           num_splits=3, rope=rope_tables(rot))
    qr, kr = (apply_rotary(t, rot.cos, rot.sin) for t in (q, k))
    tally.per_sequence(f"rotary with key padding S={S} D={D} kept={lens} splits=3", out, why,
                       [attention_ref(qr[b:b + 1], kr[b:b + 1, :n], v[b:b + 1, :n], layout="NHD")
                        for b, n in enumerate(lens)])
    torch.cuda.synchronize()
    print(f"{tally.runs - tally.bad} passed, {tally.bad} failed")
    return 1 if tally.bad else 0

if __name__ == "__main__":
    sys.exit(main())
