"""One H200 call: what Wan's self-attention processor spends around the attention, eager.

    python3 benchmarks/gpu_wan_rope_cost.py [--latent 21,90,160]

The Wan2.2-A14B forward is 1.39x faster with fp8dit eager and 1.43x compiled (session 13);
the gap between the two modes is elementwise work both backends share. This times, at Wan2.2
720p (75,600 tokens, 40 heads x 128) on one diffusers ``WanAttention`` of the A14B width, each
on its own in the same process: the q/k/v projections, diffusers' RMS norms of q and k, Wan's
rotary embedding of q and k written as diffusers computes it (interleaved pairs, fp32 math,
bf16 out), the same norms + rotation under torch.compile (one fused kernel each), fp8dit's
attention call, and the whole processor call. It says how much a rotation fused into fp8dit's
quantization could take off an eager and a compiled forward.

Since session 19 it also times that fusion (``fp8dit.attention(rotary=...)``, fp32 and bf16
tables) against the attention of pre-rotated q and k, and the processor fp8dit.enable swaps in
(``WanRotaryProcessor``) against diffusers' own, and checks that each gives the same bits.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_wan_forward import print_times  # noqa: E402

import fp8dit  # noqa: E402
from fp8dit.rope import apply_rotary  # noqa: E402  (diffusers 0.42 Wan arithmetic)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--latent", default="21,90,160", help="frames,height,width after the VAE")
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_wan_rope_cost: no CUDA device; nothing measured")
        return 2
    from diffusers.models.transformers.transformer_wan import (
        WanAttention,
        WanAttnProcessor,
        WanRotaryPosEmbed,
    )

    from fp8dit.integrations import diffusers as fd

    fd.register()
    f, h, w = (int(x) for x in args.latent.split(","))
    dev = torch.device("cuda")
    torch.manual_seed(0)
    attn = WanAttention(dim=5120, heads=40, dim_head=128, eps=1e-6, processor=WanAttnProcessor())
    attn = attn.to(dev, torch.bfloat16)
    attn.eval().requires_grad_(False)
    latent = torch.zeros(1, 16, f, h, w, device=dev, dtype=torch.bfloat16)
    cos, sin = WanRotaryPosEmbed(128, (1, 2, 2), 1024).to(dev)(latent)
    s = f * (h // 2) * (w // 2)
    x = torch.randn(1, s, 5120, device=dev, dtype=torch.bfloat16)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {s} tokens, 40 x 128; "
          f"freqs {tuple(cos.shape)} {cos.dtype}")

    def project():
        return attn.to_q(x), attn.to_k(x), attn.to_v(x)

    q, k, v = project()

    def norms():
        return attn.norm_q(q), attn.norm_k(k)

    qn, kn = (t.unflatten(2, (40, -1)) for t in norms())

    def rope():
        return apply_rotary(qn, cos, sin), apply_rotary(kn, cos, sin)

    def norm_rope(t, norm):
        return apply_rotary(norm(t).unflatten(2, (40, -1)), cos, sin)

    fused_q = torch.compile(lambda t: norm_rope(t, attn.norm_q))
    fused_k = torch.compile(lambda t: norm_rope(t, attn.norm_k))
    qr, kr = rope()
    vh = v.unflatten(2, (40, -1))
    assert torch.allclose(fused_q(q).float(), norm_rope(q, attn.norm_q).float(), atol=0.05)
    attn.set_attention_backend("fp8dit")
    from fp8dit.integrations.diffusers_processors import WanRotaryProcessor
    fused_attn = WanAttention(dim=5120, heads=40, dim_head=128, eps=1e-6,
                              processor=WanRotaryProcessor(WanAttnProcessor()))
    fused_attn.load_state_dict(attn.state_dict())
    fused_attn = fused_attn.to(dev, torch.bfloat16).eval().requires_grad_(False)
    fused_attn.set_attention_backend("fp8dit")
    cos16, sin16 = cos.bfloat16(), sin.bfloat16()
    qr16, kr16 = apply_rotary(qn, cos16, sin16), apply_rotary(kn, cos16, sin16)
    with torch.no_grad():
        for what, got, want in [
            ("fused rotation, fp32 tables", fp8dit.attention(qn, kn, vh, rotary=(cos, sin)),
             fp8dit.attention(qr, kr, vh)),
            ("fused rotation, bf16 tables",
             fp8dit.attention(qn, kn, vh, rotary=(cos16, sin16)), fp8dit.attention(qr16, kr16, vh)),
            ("WanRotaryProcessor vs diffusers' processor", fused_attn(x, rotary_emb=(cos, sin)),
             attn(x, rotary_emb=(cos, sin))),
        ]:
            diff = (got.float() - want.float()).abs()
            print(f"check {what}: bitwise {torch.equal(got, want)}, max |diff| "
                  f"{diff.max().item():.3g}, elements differing {(diff > 0).sum().item()}")
    rows = {
        "q, k, v projections (3 GEMMs)": project,
        "RMS norms of q and k, eager": norms,
        "rotation of q and k, eager (diffusers' ops)": rope,
        "norms + rotation, eager": lambda: (norm_rope(q, attn.norm_q),
                                            norm_rope(k, attn.norm_k)),
        "norms + rotation, torch.compile": lambda: (fused_q(q), fused_k(k)),
        "fp8dit attention (NHD, quantization included)": lambda: fp8dit.attention(qr, kr, vh),
        "fp8dit attention, rotary fused, fp32 tables":
            lambda: fp8dit.attention(qn, kn, vh, rotary=(cos, sin)),
        "fp8dit attention, rotary fused, bf16 tables":
            lambda: fp8dit.attention(qn, kn, vh, rotary=(cos16, sin16)),
        "whole processor call, fp8dit, eager": lambda: attn(x, rotary_emb=(cos, sin)),
        "whole processor call, fp8dit, WanRotaryProcessor":
            lambda: fused_attn(x, rotary_emb=(cos, sin)),
        "whole processor call, fp8dit, eager, bf16 tables":
            lambda: attn(x, rotary_emb=(cos16, sin16)),
        "whole processor call, WanRotaryProcessor, bf16 tables":
            lambda: fused_attn(x, rotary_emb=(cos16, sin16)),
    }
    with torch.no_grad():
        print_times(rows, args.repeats, width=56)
    return 0


if __name__ == "__main__":
    sys.exit(main())
