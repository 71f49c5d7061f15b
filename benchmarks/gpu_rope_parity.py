"""One H200 call: where the fused rotary embedding's quantization differs from rotating first.

    python3 benchmarks/gpu_rope_parity.py [--tokens 8192]

In the interpreter ``attention(q, k, v, rotary=...)`` is bitwise ``attention`` of q and k
rotated by diffusers' arithmetic (tests/test_rope.py); on the H200 the outputs differed in the
last bits (run s19-1). This runs the quantization stage both ways on the same inputs and says
which workspace buffers differ: the quantized Q and K with their scales (the rotation itself),
Q's LSE correction (K's channel mean), V's. Cases: Wan's arithmetic with fp32 and bf16 tables
over every token; diffusers' ``apply_rotary_emb`` with fp32 tables over the tokens before a
text tail (HunyuanVideo, D=128) and after a text head (CogVideoX, D=64).
"""

from __future__ import annotations

import argparse
import sys

import torch

from fp8dit import launch, quant
from fp8dit.recipes import DEFAULT_RECIPE, RECIPES
from fp8dit.rope import Rotary, apply_rotary, rope_tables


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--heads", type=int, default=4)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_rope_parity: no CUDA device; nothing measured")
        return 2
    dev = torch.device("cuda")
    S, H = args.tokens, args.heads
    recipe = RECIPES[DEFAULT_RECIPE]
    g = torch.Generator(device=dev).manual_seed(0)
    cases = [("wan", torch.float32, 0, S, 128), ("wan", torch.bfloat16, 0, S, 128),
             ("apply_rotary_emb", torch.float32, 0, S - 256, 128),
             ("apply_rotary_emb", torch.float32, 226, S - 226, 64)]
    for style, dtype, start, rows, D in cases:
        q, k, v = (torch.randn(1, S, H, D, generator=g, device=dev).bfloat16() for _ in range(3))
        k += 2.0 * torch.randn(D, generator=g, device=dev).bfloat16()
        ang = (torch.rand(rows, D // 2, generator=g, device=dev) * 20).repeat_interleave(2, -1)
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
        plan, cfg = launch.plan_for([S], [S], varlen=False, num_heads=H, num_kv_heads=H,
                                    head_dim=D, is_causal=False, device=dev, recipe=recipe)
        sm90 = launch.use_gluon_sm90(plan, recipe, dev, cfg.get("kernel"))
        st = launch._bthd_strides(q, "NHD")
        qr, kr = (apply_rotary(t, cos, sin, start=start, style=style) for t in (q, k))
        tables = rope_tables(Rotary(cos, sin, start, style))
        ws = {}
        for way, args_ in (("rotated first", (qr, kr, None)), ("fused", (q, k, tables))):
            ws[way] = quant.quantize_stage(plan, recipe, D ** -0.5, args_[0], st, args_[1], st,
                                           v, st, kv_perm16=sm90 is not None, rope=args_[2],
                                           rope_start=start)
        a, b = ws["rotated first"], ws["fused"]
        print(f"{style}, {dtype} tables, tokens {start}..{start + rows} of {S} x {H} heads, "
              f"D={D}:")
        for name in ("q8", "q_scale", "q_corr", "k8", "k_scale", "v8t", "v_scale", "v_mean"):
            x, y = getattr(a, name), getattr(b, name)
            if x.element_size() == 1:  # int8 / fp8 bytes
                x, y = x.view(torch.uint8), y.view(torch.uint8)
            xf, yf = x, y
            diff = (xf.float() - yf.float()).abs()
            print(f"  {name:8s} equal {torch.equal(xf, yf)}  differing {(diff > 0).sum().item()}"
                  f" of {diff.numel()}  max |diff| {diff.max().item():.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
