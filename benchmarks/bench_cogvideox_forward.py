"""End-to-end CogVideoX-5B transformer forward: torch SDPA vs fp8dit, bf16.

diffusers' ``CogVideoXTransformer3DModel`` at the 5B width (48 heads x 64, text 4096, RoPE)
with ``--layers`` blocks (the model has 42) and seeded random weights, on the latents of a
49-frame 720x480 video (16 x 13 x 60 x 90 -> 17,550 video tokens, plus 226 text tokens in one
joint attention) at batch ``--batch`` (2: the pipeline's classifier-free guidance runs the
conditional and unconditional inputs as one batch).

diffusers' CogVideoX processors call ``F.scaled_dot_product_attention`` themselves, so no
attention backend reaches them; ``fp8dit.enable`` first replaces them with processors that go
through diffusers' dispatcher (``fp8dit.integrations.diffusers_processors``). Every model here
is routed that way and the baselines run diffusers' ``native`` backend, which computes bitwise
what diffusers' own processor does (``tests/test_diffusers_processors.py``), under each
``--sdpa`` kernel ("auto": torch's own choice, what a CogVideoX user gets). Timing, memory and
accuracy as ``bench_wan_forward.py`` (whose helpers this uses): the backends alternate call by
call, the output is compared with the first baseline's eager forward.

    python benchmarks/bench_cogvideox_forward.py --layers 2 --repeats 5 --compile
"""

from __future__ import annotations

import argparse
import sys

import torch
from bench_wan_forward import (
    ROTATE_FIRST,
    backend_models,
    cuda_device,
    pin_backends,
    run_and_report,
    sdpa_baselines,
    seeded_model,
)

# CogVideoX-5B's transformer (THUDM/CogVideoX-5b, transformer/config.json), without num_layers.
CONFIG = dict(num_attention_heads=48, attention_head_dim=64, in_channels=16, out_channels=16,
              flip_sin_to_cos=True, freq_shift=0, time_embed_dim=512, text_embed_dim=4096,
              dropout=0.0, attention_bias=True, sample_width=90, sample_height=60,
              sample_frames=49, patch_size=2, temporal_compression_ratio=4,
              max_text_seq_length=226, activation_fn="gelu-approximate",
              timestep_activation_fn="silu", norm_elementwise_affine=True, norm_eps=1e-5,
              spatial_interpolation_scale=1.875, temporal_interpolation_scale=1.0,
              use_rotary_positional_embeddings=True, use_learned_positional_embeddings=False)
LATENT = (13, 60, 90)  # 49 frames (1 + 48 / 4), 480 / 8, 720 / 8


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2, help="transformer blocks (the model has 42)")
    p.add_argument("--batch", type=int, default=2,
                   help="batch (2: classifier-free guidance, as CogVideoXPipeline runs it)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--sdpa", default="auto,cudnn",
                   help="baselines, comma-separated: auto, cudnn, flash, efficient (diffusers' "
                        "native backend with that SDPA kernel forced; auto: torch's choice); "
                        "the first is the reference and the speed-up's denominator")
    p.add_argument("--compile", action="store_true", help="also torch.compile every model")
    p.add_argument("--cuda-graph", action="store_true", help="also capture and replay")
    p.add_argument("--rotate-first", action="store_true",
                   help="add a model on fp8dit whose processors rotate q and k in torch first "
                        "(fuse_rotary off: the rotary embedding not fused into fp8dit's "
                        "quantization)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None,
                   help="JSON file (default results/<gpu>-cogvideox-forward.json)")
    args = p.parse_args(argv)
    for name in ("layers", "batch", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name}: expected an integer of at least 1, got {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup: expected an integer of at least 0, got {args.warmup}")
    args.sdpa = sdpa_baselines(p, args.sdpa)
    return args


def build_model(args, device):
    return seeded_model("CogVideoXTransformer3DModel", args.seed, device, **CONFIG,
                        num_layers=args.layers)


def forward_inputs(args, device) -> dict:
    """One denoising step's inputs as CogVideoXPipeline builds them: random bf16 latents and
    text embeddings, timestep 500, and the 3-D RoPE of the latent grid (the pipeline's
    ``_prepare_rotary_positional_embeddings``: the grid equals the model's sample size, so
    the crop region is the whole grid)."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    frames, height, width = LATENT
    p = CONFIG["patch_size"]
    grid = (height // p, width // p)
    cos, sin = get_3d_rotary_pos_embed(embed_dim=CONFIG["attention_head_dim"],
                                       crops_coords=((0, 0), grid), grid_size=grid,
                                       temporal_size=frames, device=device)
    gen = torch.Generator(device=device).manual_seed(args.seed + 1)
    return dict(
        hidden_states=torch.randn((args.batch, frames, CONFIG["in_channels"], height, width),
                                  generator=gen, device=device).to(torch.bfloat16),
        encoder_hidden_states=torch.randn(
            (args.batch, CONFIG["max_text_seq_length"], CONFIG["text_embed_dim"]),
            generator=gen, device=device).to(torch.bfloat16),
        timestep=torch.full((args.batch,), 500, device=device, dtype=torch.int64),
        image_rotary_emb=(cos, sin),
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    frames, height, width = LATENT
    video = frames * (height // 2) * (width // 2)
    tokens = video + CONFIG["max_text_seq_length"]
    device = cuda_device("bench_cogvideox_forward", (
        f"CogVideoX-5B transformer, {args.layers} blocks, batch {args.batch}, 49 frames 720x480 "
        f"({video} video + {CONFIG['max_text_seq_length']} text tokens)"))
    if device is None:
        return 2
    from fp8dit.integrations import diffusers as fd

    models = backend_models(args.sdpa, lambda: build_model(args, device),
                            [ROTATE_FIRST] if args.rotate_first else [])
    for model in models.values():
        fd.route_through_dispatcher(model)  # the baselines too: "native" is then diffusers' own
    inputs = forward_inputs(args, device)
    pin_backends(models)
    return run_and_report(models, inputs, args, "cogvideox-forward", dict(
        model="CogVideoX-5B", layers=args.layers, batch=args.batch, frames=49,
        resolution="720x480", tokens=tokens, heads=CONFIG["num_attention_heads"],
        head_dim=CONFIG["attention_head_dim"]))


if __name__ == "__main__":
    sys.exit(main())
