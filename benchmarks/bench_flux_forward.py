"""End-to-end Flux transformer forward: torch SDPA vs fp8dit, bf16.

diffusers' ``FluxTransformer2DModel`` at FLUX.1-dev's width (24 heads x 128, text 4096) with
``--dual`` dual-stream and ``--single`` single-stream blocks (the model has 19 and 38) and seeded
random weights, on the packed latents of a ``--size`` x ``--size`` image (1024: 4,096 image
tokens; 2048: 16,384) and 512 text tokens in one joint attention, no mask. The baselines are
diffusers' ``native`` backend under each ``--sdpa`` kernel; fp8dit is ``fp8dit.enable``. At
1024 px ``auto`` runs SDPA (4,608 tokens are under the length where FP8 pays on the H200,
``dispatch.FP8_MIN_TOKENS``); ``FP8DIT_BACKEND=fp8`` in the environment forces FP8 there, and
the rows record which was used. Timing, memory and accuracy as ``bench_wan_forward.py`` (whose
helpers this uses).

    python benchmarks/bench_flux_forward.py --size 1024 --repeats 10 --compile --cuda-graph
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from bench_wan_forward import (
    backend_models,
    cuda_device,
    pin_backends,
    run_and_report,
    sdpa_baselines,
    seeded_model,
)

CONFIG = dict(patch_size=1, in_channels=64, attention_head_dim=128, num_attention_heads=24,
              joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
              axes_dims_rope=(16, 56, 56))
TEXT_TOKENS = 512


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, choices=(1024, 1536, 2048), default=1024,
                   help="image side in pixels (latents: size / 8, packed 2 x 2)")
    p.add_argument("--dual", type=int, default=1, help="dual-stream blocks (FLUX.1 has 19)")
    p.add_argument("--single", type=int, default=2, help="single-stream blocks (it has 38)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--sdpa", default="cudnn,flash",
                   help="baselines, comma-separated: auto, cudnn, flash, efficient; the first "
                        "is the reference and the speed-up's denominator")
    p.add_argument("--compile", action="store_true", help="also torch.compile every model")
    p.add_argument("--cuda-graph", action="store_true", help="also capture and replay")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None,
                   help="JSON file (default results/<gpu>-flux-forward.json)")
    args = p.parse_args(argv)
    for name in ("batch", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name}: expected an integer of at least 1, got {getattr(args, name)}")
    if args.dual < 0 or args.single < 0 or args.dual + args.single < 1:
        p.error(f"--dual, --single: expected at least one block in all, got {args.dual} and "
                f"{args.single}")
    args.sdpa = sdpa_baselines(p, args.sdpa)
    return args


def build_model(args, device):
    return seeded_model("FluxTransformer2DModel", args.seed, device, **CONFIG,
                        num_layers=args.dual, num_single_layers=args.single)


def forward_inputs(args, device) -> dict:
    """One denoising step's inputs as FluxPipeline builds them: packed latents (2 x 2 patches
    of the size / 8 latent), their (0, row, column) ids, zero text ids, timestep 0.5,
    guidance 3.5."""
    side = args.size // 16  # packed tokens per side
    rows, cols = torch.meshgrid(torch.arange(side, device=device),
                                torch.arange(side, device=device), indexing="ij")
    img_ids = torch.stack([torch.zeros_like(rows), rows, cols], -1).reshape(-1, 3).float()
    gen = torch.Generator(device=device).manual_seed(args.seed + 1)

    def randn(*shape):
        return torch.randn(shape, generator=gen, device=device).to(torch.bfloat16)

    return dict(
        hidden_states=randn(args.batch, side * side, CONFIG["in_channels"]),
        encoder_hidden_states=randn(args.batch, TEXT_TOKENS, CONFIG["joint_attention_dim"]),
        pooled_projections=randn(args.batch, CONFIG["pooled_projection_dim"]),
        timestep=torch.full((args.batch,), 0.5, device=device),
        guidance=torch.full((args.batch,), 3.5, device=device),
        img_ids=img_ids, txt_ids=torch.zeros(TEXT_TOKENS, 3, device=device),
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    image = (args.size // 16) ** 2
    fp8dit_backend = os.environ.get("FP8DIT_BACKEND", "auto")
    device = cuda_device("bench_flux_forward", (
        f"Flux transformer, {args.dual} dual + {args.single} single blocks, {args.size} px "
        f"({image} image + {TEXT_TOKENS} text tokens), batch {args.batch}, fp8dit backend "
        f"{fp8dit_backend}"))
    if device is None:
        return 2
    models = backend_models(args.sdpa, lambda: build_model(args, device))
    inputs = forward_inputs(args, device)
    pin_backends(models)
    return run_and_report(models, inputs, args, "flux-forward", dict(
        model="FLUX.1-dev", dual_layers=args.dual, single_layers=args.single, size=args.size,
        batch=args.batch, tokens=image + TEXT_TOKENS, heads=CONFIG["num_attention_heads"],
        head_dim=CONFIG["attention_head_dim"], fp8dit_backend=fp8dit_backend))


if __name__ == "__main__":
    sys.exit(main())
