"""End-to-end HunyuanVideo 1.5 transformer forward: diffusers' masked SDPA vs fp8dit, bf16.

diffusers' ``HunyuanVideo15Transformer3DModel`` at its released width (16 heads x 128, text
3584, glyph text 1472, image 1152; the class defaults) with ``--layers`` blocks (the model has
54) and seeded random weights, text-to-video as ``HunyuanVideo15Pipeline`` calls it: latents of
121 frames at 480p (16x spatial, 4x temporal compression: 31 x 30 x 53 -> 49,290 tokens) or
720p (31 x 45 x 80 -> 111,600), concatenated with their condition channels (65 in all), 1,000
prompt tokens of which ``--kept`` are real, 256 glyph tokens of which ``--kept-2``, and 729
zero image tokens (text-to-video: all dropped). Every attention call builds a ``[B, 1, S, S]``
mask, (valid query) & (valid key) with the valid tokens first: diffusers' ``native`` backend
runs SDPA with it (``--sdpa``: torch's choice, or a kernel forced). ``fp8dit.enable`` replaces
that processor (session 18, ``HunyuanVideo15KeyMaskProcessor``): fp8dit gets the ``[B, 1, 1, S]``
key mask and runs FP8 over the kept keys (``fp8dit.key_padding``), with no S^2 mask built. The
baseline ``auto-keymask`` is the fairer peer: diffusers' native backend with that processor
too, so SDPA also gets the key mask. Timing, memory and accuracy as ``bench_wan_forward.py``
(whose helpers this uses).

    python benchmarks/bench_hunyuan15_forward.py --layers 2 --repeats 5 --warmup 2
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

CONFIG = dict(in_channels=65, out_channels=32, num_attention_heads=16, attention_head_dim=128,
              num_refiner_layers=2, mlp_ratio=4.0, patch_size=1, patch_size_t=1,
              qk_norm="rms_norm", text_embed_dim=3584, text_embed_2_dim=1472,
              image_embed_dim=1152, rope_theta=256.0, rope_axes_dim=(16, 56, 56))
LATENTS = {"480p": (31, 30, 53), "720p": (31, 45, 80)}  # 121 frames
TEXT, TEXT_2, IMAGE = 1000, 256, 729  # HunyuanVideo15Pipeline's token counts


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolution", choices=sorted(LATENTS), default="480p")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks (the model has 54)")
    p.add_argument("--kept", type=int, default=120, help="real prompt tokens (of 1,000)")
    p.add_argument("--kept-2", type=int, default=16, help="real glyph tokens (of 256)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--sdpa", default="auto",
                   help="baselines, comma-separated: auto, cudnn, efficient (diffusers' native "
                        "backend, SDPA with the mask, that kernel forced; auto: torch's choice), "
                        "auto-keymask (SDPA given the [B, 1, 1, S] key mask instead)")
    p.add_argument("--compile", action="store_true", help="also torch.compile every model")
    p.add_argument("--cuda-graph", action="store_true",
                   help="also capture and replay; fails with every backend (run s18-3): the "
                        "model's forward reads tensors on the host (if torch.all(image_embeds "
                        "== 0), boolean indexing of the text), which capture forbids")
    p.add_argument("--rotate-first", action="store_true",
                   help="add a model on fp8dit whose processors rotate q and k in torch first "
                        "(fuse_rotary off: the rotary embedding not fused into fp8dit's "
                        "quantization)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None,
                   help="JSON file (default results/<gpu>-hunyuan15-forward.json)")
    args = p.parse_args(argv)
    if args.layers < 1 or args.repeats < 1:
        p.error(f"--layers, --repeats: expected integers of at least 1, got {args.layers} and "
                f"{args.repeats}")
    if not 1 <= args.kept <= TEXT or not 0 <= args.kept_2 <= TEXT_2:
        p.error(f"--kept: expected 1..{TEXT}, --kept-2 0..{TEXT_2}, got {args.kept} and "
                f"{args.kept_2}")
    args.sdpa = sdpa_baselines(p, args.sdpa, ("auto", "cudnn", "efficient", "auto-keymask"))
    return args


def build_model(args, device):
    return seeded_model("HunyuanVideo15Transformer3DModel", args.seed, device, **CONFIG,
                        num_layers=args.layers)


def forward_inputs(args, device) -> dict:
    gen = torch.Generator(device=device).manual_seed(args.seed + 1)

    def randn(*shape):
        return torch.randn(shape, generator=gen, device=device).to(torch.bfloat16)

    def kept(n, total):
        mask = torch.zeros(1, total, dtype=torch.int64, device=device)
        mask[:, :n] = 1
        return mask

    return dict(
        hidden_states=randn(1, CONFIG["in_channels"], *LATENTS[args.resolution]),
        timestep=torch.full((1,), 500.0, device=device).to(torch.bfloat16),
        encoder_hidden_states=randn(1, TEXT, CONFIG["text_embed_dim"]),
        encoder_attention_mask=kept(args.kept, TEXT),
        encoder_hidden_states_2=randn(1, TEXT_2, CONFIG["text_embed_2_dim"]),
        encoder_attention_mask_2=kept(args.kept_2, TEXT_2),
        image_embeds=torch.zeros(1, IMAGE, CONFIG["image_embed_dim"], device=device,
                                 dtype=torch.bfloat16),
    )


def give_sdpa_the_key_mask(model) -> None:
    """The blocks' processors replaced as ``fp8dit.enable`` does, but handing the key mask to
    diffusers' native backend (SDPA) as well."""
    from fp8dit.integrations import diffusers as fd
    from fp8dit.integrations.diffusers_processors import HunyuanVideo15KeyMaskProcessor

    fd.route_through_dispatcher(model)
    for module in model.modules():
        if isinstance(getattr(module, "processor", None), HunyuanVideo15KeyMaskProcessor):
            module.processor.key_mask_backends = frozenset({"native"})


def main(argv=None) -> int:
    args = parse_args(argv)
    frames, height, width = LATENTS[args.resolution]
    video = frames * height * width
    device = cuda_device("bench_hunyuan15_forward", (
        f"HunyuanVideo 1.5 transformer, {args.layers} blocks, {args.resolution} ({video} video + "
        f"{TEXT + TEXT_2 + IMAGE} conditioning tokens, {video + args.kept + args.kept_2} kept)"))
    if device is None:
        return 2
    models = backend_models(args.sdpa, lambda: build_model(args, device),
                            [ROTATE_FIRST] if args.rotate_first else [])
    inputs = forward_inputs(args, device)
    for name, model in models.items():
        if name.endswith("-keymask"):
            give_sdpa_the_key_mask(model)
    pin_backends(models)
    return run_and_report(models, inputs, args, "hunyuan15-forward", dict(
        model="HunyuanVideo-1.5", layers=args.layers, resolution=args.resolution,
        tokens=video + TEXT + TEXT_2 + IMAGE, kept_keys=video + args.kept + args.kept_2,
        heads=CONFIG["num_attention_heads"], head_dim=CONFIG["attention_head_dim"]))


if __name__ == "__main__":
    sys.exit(main())
