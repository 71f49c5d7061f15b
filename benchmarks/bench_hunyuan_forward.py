"""End-to-end HunyuanVideo transformer forward: torch SDPA vs fp8dit, bf16, with its text mask.

diffusers' ``HunyuanVideoTransformer3DModel`` at the 13B width (24 heads x 128, mlp ratio 4,
text 4096) with ``--dual`` dual-stream and ``--single`` single-stream blocks (the model has 20
and 40) and seeded random weights, on 720p 129-frame latents (16x33x90x160 -> 118,800 tokens)
and ``--text`` prompt tokens of which ``--kept`` are real. Every attention call gets the
model's ``[B, 1, 1, S]`` boolean mask that drops the prompt's padding: fp8dit runs it FP8 over
the kept keys (``fp8dit.key_padding``); the baselines are diffusers' ``native`` backend (SDPA
with the mask) under each ``--sdpa`` kernel ("auto": torch's own choice for a masked call).
Timing, memory and accuracy as ``bench_wan_forward.py`` (whose helpers this uses): the backends
alternate call by call, the output is compared with the first baseline's eager forward.

    python benchmarks/bench_hunyuan_forward.py --dual 1 --single 2 --repeats 5 --compile
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

CONFIG = dict(in_channels=16, out_channels=16, num_attention_heads=24, attention_head_dim=128,
              num_refiner_layers=2, mlp_ratio=4.0, patch_size=2, patch_size_t=1,
              qk_norm="rms_norm", guidance_embeds=True, text_embed_dim=4096,
              pooled_projection_dim=768, rope_axes_dim=(16, 56, 56))
LATENTS = {"720p": (33, 90, 160), "540p": (33, 68, 120)}  # 129 frames


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolution", choices=sorted(LATENTS), default="720p")
    p.add_argument("--dual", type=int, default=1, help="dual-stream blocks (the model has 20)")
    p.add_argument("--single", type=int, default=2, help="single-stream blocks (it has 40)")
    p.add_argument("--text", type=int, default=256, help="prompt tokens, padding included")
    p.add_argument("--kept", type=int, default=100, help="real prompt tokens (the mask keeps)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--sdpa", default="auto,cudnn,cudnn-kept",
                   help="baselines, comma-separated: auto, cudnn, efficient (diffusers' native "
                        "backend, SDPA with the mask, that kernel forced; auto: torch's choice), "
                        "cudnn-kept (cuDNN without a mask over the kept keys, "
                        "register_kept_keys_baseline); the first is the reference and the "
                        "speed-up's denominator")
    p.add_argument("--compile", action="store_true", help="also torch.compile every model")
    p.add_argument("--cuda-graph", action="store_true",
                   help="also capture and replay (fp8dit keeps the mask's key lengths on the "
                        "device there; the cudnn-kept baseline, which reads them on the host, "
                        "cannot be captured and reports an error row)")
    p.add_argument("--rotate-first", action="store_true",
                   help="add a model on fp8dit whose processors rotate q and k in torch first "
                        "(fuse_rotary off: the rotary embedding not fused into fp8dit's "
                        "quantization)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None,
                   help="JSON file (default results/<gpu>-hunyuan-forward.json)")
    args = p.parse_args(argv)
    for name in ("dual", "single", "text", "repeats"):
        if getattr(args, name) < (0 if name in ("dual", "single") else 1):
            p.error(f"--{name}: expected a positive integer, got {getattr(args, name)}")
    if args.dual + args.single < 1:
        p.error("--dual, --single: expected at least one block in all")
    if not 1 <= args.kept <= args.text:
        p.error(f"--kept: expected 1..--text ({args.text}), got {args.kept}")
    args.sdpa = sdpa_baselines(p, args.sdpa, ("auto", "cudnn", "efficient", "cudnn-kept"))
    return args


def register_kept_keys_baseline() -> str:
    """A diffusers backend "sdpa_kept_keys" for the baseline a careful user could write: SDPA
    with no mask over the keys the mask keeps (sliced; equal lengths across the batch), so
    cuDNN's unmasked kernel runs. Registered through fp8dit's adapter internals."""
    import torch.nn.functional as F

    from fp8dit.integrations import diffusers as fd
    from fp8dit.key_padding import key_lengths

    dispatch = fd._dispatch()
    member = fd._add_backend_name(dispatch.AttentionBackendName, "sdpa_kept_keys",
                                  "SDPA_KEPT_KEYS")

    # Not traced: dynamo would guard on the mask's identity (fp8dit's cache is keyed by it) and
    # recompile at every forward's new mask (run s15-2 hit the recompile limit so).
    @torch.compiler.disable
    def kept(attn_mask, batch: int, sk: int) -> int:
        lens, why = key_lengths(attn_mask, batch, sk)
        if lens is None or len(set(lens)) != 1:
            raise ValueError(f"sdpa_kept_keys: needs one key length per batch ({why})")
        return lens[0]

    def sdpa_kept_keys(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                       scale=None, enable_gqa=False, return_lse=False, _parallel_config=None):
        n = key.shape[1]
        if attn_mask is not None:
            n = kept(attn_mask, query.shape[0], key.shape[1])
        q, k, v = (t.transpose(1, 2) for t in (query, key[:, :n], value[:, :n]))
        return F.scaled_dot_product_attention(q, k, v, scale=scale).transpose(1, 2)

    registry = dispatch._AttentionBackendRegistry
    if member not in registry._backends:
        registry.register(member, constraints=[])(sdpa_kept_keys)
    return member.value


def build_model(args, device):
    return seeded_model("HunyuanVideoTransformer3DModel", args.seed, device, **CONFIG,
                        num_layers=args.dual, num_single_layers=args.single)


def forward_inputs(args, device) -> dict:
    gen = torch.Generator(device=device).manual_seed(args.seed + 1)
    text_mask = torch.zeros(1, args.text, dtype=torch.int64, device=device)
    text_mask[:, :args.kept] = 1
    return dict(
        hidden_states=torch.randn((1, CONFIG["in_channels"], *LATENTS[args.resolution]),
                                  generator=gen, device=device).to(torch.bfloat16),
        timestep=torch.full((1,), 500, device=device, dtype=torch.int64),
        encoder_hidden_states=torch.randn((1, args.text, CONFIG["text_embed_dim"]),
                                          generator=gen, device=device).to(torch.bfloat16),
        encoder_attention_mask=text_mask,
        pooled_projections=torch.randn((1, CONFIG["pooled_projection_dim"]), generator=gen,
                                       device=device).to(torch.bfloat16),
        guidance=torch.full((1,), 6000.0, device=device),
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    frames, height, width = LATENTS[args.resolution]
    video = frames * (height // 2) * (width // 2)
    device = cuda_device("bench_hunyuan_forward", (
        f"HunyuanVideo transformer, {args.dual} dual + {args.single} single blocks, "
        f"{args.resolution} ({video} video tokens + {args.text} text, {args.kept} kept)"))
    if device is None:
        return 2
    models = backend_models(args.sdpa, lambda: build_model(args, device),
                            [ROTATE_FIRST] if args.rotate_first else [])
    inputs = forward_inputs(args, device)
    kept = {"sdpa-cudnn-kept": register_kept_keys_baseline()} if "cudnn-kept" in args.sdpa \
        else {}
    pin_backends(models, kept)
    return run_and_report(models, inputs, args, "hunyuan-forward", dict(
        model="HunyuanVideo", dual_layers=args.dual, single_layers=args.single,
        resolution=args.resolution, tokens=video + args.text, kept_keys=video + args.kept,
        heads=CONFIG["num_attention_heads"], head_dim=CONFIG["attention_head_dim"]))


if __name__ == "__main__":
    sys.exit(main())
