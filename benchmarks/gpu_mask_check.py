"""One H200 call: what reading HunyuanVideo 1.5's per-query mask costs against the attention.

    python3 benchmarks/gpu_mask_check.py [--resolution 480p] [--repeats 10]

HunyuanVideo 1.5 builds a new ``[B, 1, S, S]`` mask, (valid query) & (valid key), in every
attention call; fp8dit reads its key lengths from it (S^2 bytes, 2.6 GB at 480p: torch's sum
and any until run s17-1, one kernel pass since, ``kernels.mask_stats``) and one host read
(``key_padding._read_query_key_lengths``), then runs FP8 over the kept keys. This times, at
the model's shape (16 heads x 128, batch 1), each in the same process: the check alone,
fp8dit with the mask (cache cleared before each call, as a new mask each call misses it),
fp8dit on the kept tokens without a mask, and SDPA with the mask (what diffusers' native
backend runs), so the check's share of the call shows. Also (session 18): diffusers' own build
of that mask from the ``[B, S]`` token mask (``repeat``, then ``&`` with its transpose, in every
call, whatever the backend), and fp8dit and SDPA given the ``[B, 1, 1, S]`` key mask instead,
which keeps the valid rows' result and builds nothing of size S^2.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from bench_hunyuan15_forward import IMAGE, LATENTS, TEXT, TEXT_2  # noqa: E402
from bench_wan_forward import print_times  # noqa: E402

import fp8dit  # noqa: E402
from fp8dit import key_padding  # noqa: E402
from fp8dit.recipes import get_recipe  # noqa: E402


def tokens(resolution: str, kept_text: int = 120 + 16) -> tuple[int, int]:
    """(all tokens, kept tokens) of a HunyuanVideo 1.5 text-to-video call at ``resolution``:
    the video, then the prompt, glyph and image tokens, of which ``kept_text`` are real."""
    f, h, w = LATENTS[resolution]
    return f * h * w + TEXT + TEXT_2 + IMAGE, f * h * w + kept_text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolution", choices=sorted(LATENTS), default="480p")
    p.add_argument("--kept", type=int, default=120 + 16, help="real text + glyph tokens")
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_mask_check: no CUDA device; nothing measured")
        return 2
    s, kept = tokens(args.resolution, args.kept)
    heads, dim = 16, 128
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(1, s, heads, dim, generator=gen, device=dev, dtype=torch.bfloat16)
               for _ in range(3))  # NHD, as diffusers hands them over
    valid = torch.arange(s, device=dev) < kept
    mask = (valid[:, None] & valid[None, :])[None, None]  # [1, 1, S, S]
    print(f"{args.resolution}: {s} tokens, {kept} kept, mask {mask.numel() / 1e9:.2f} GB; "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}")

    def check():
        return key_padding._read_query_key_lengths(mask[:, 0])

    lens, reason, dropped = check()
    assert reason is None and list(lens) == [kept], (lens, reason)

    def fp8_masked():
        key_padding._cache.clear()  # the model's mask is new each call
        return key_padding.key_padding_attention(q, k, v, mask, scale=dim ** -0.5,
                                                 recipe=recipe, return_lse=False)[0]

    def sdpa(*t, **kw):
        return F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in t), **kw)

    def diffusers_build():  # HunyuanVideo15AttnProcessor2_0, diffusers 0.42.1
        m1 = valid.view(1, 1, 1, s).repeat(1, 1, s, 1)
        return (m1 & m1.transpose(2, 3)).bool()

    key_mask = valid.view(1, 1, 1, s)

    def fp8_key_mask():
        key_padding._cache.clear()  # a new key mask each call too (the processor pads it)
        return key_padding.key_padding_attention(q, k, v, key_mask, scale=dim ** -0.5,
                                                 recipe=recipe, return_lse=False)[0]

    recipe = get_recipe(None)
    assert torch.equal(diffusers_build(), mask)
    qk, kk, vk = (t[:, :kept].contiguous() for t in (q, k, v))
    rows = {
        "check (mask read + host read)": check,
        "fp8dit, mask": fp8_masked,
        "fp8dit, kept tokens, no mask": lambda: fp8dit.attention(qk, kk, vk),
        "SDPA, mask (diffusers native)": lambda: sdpa(q, k, v, attn_mask=mask),
        "diffusers' S^2 mask build": diffusers_build,
        "fp8dit, [1, 1, 1, S] key mask": fp8_key_mask,
        "SDPA, [1, 1, 1, S] key mask": lambda: sdpa(q, k, v, attn_mask=key_mask),
    }
    out = fp8_masked()
    ref = sdpa(qk.float(), kk.float(), vk.float()).transpose(1, 2)
    cos = F.cosine_similarity(out[:, :kept].float().flatten(), ref.flatten(), dim=0)
    print(f"fp8dit with the mask vs fp32 SDPA over the kept tokens: cos {cos.item():.6f}; "
          f"dropped rows all zero: {bool((out[:, kept:] == 0).all())}")
    same = torch.equal(fp8_key_mask()[:, :kept], out[:, :kept])
    print(f"fp8dit with the key mask: valid rows bitwise equal to the S^2 mask's: {same}")
    del ref
    print_times(rows, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
