"""Model forward benchmark: torch SDPA vs fp8dit inside one diffusers transformer, bf16.

``--model`` picks the transformer (``wan``, ``hunyuanvideo``, ``hunyuanvideo15``, ``cogvideox``,
``flux``; ``--model NAME --help`` describes it and lists its own options). The model is built at
its released width with a few blocks and seeded random weights, once per backend (the same
weights): the baselines ``sdpa-<kernel>`` run diffusers' ``native`` backend (SDPA) under each
``--sdpa`` kernel ("auto": torch's own choice), ``fp8dit`` runs ``fp8dit.enable(model)``, and a
model may add fp8dit variants (``--rotate-first``, ``--diffusers-rope``). Every model's
attention layers are checked to run the backend its name says.

Each row, per mode (eager; torch.compile with ``--compile``, whose rows also count graph breaks
with ``torch._dynamo.explain``; CUDA-graph replay with ``--cuda-graph``) and backend: median and
min of ``--repeats`` CUDA-event-timed forwards after ``--warmup`` untimed ones, the backends
called in turn (A B, B A, ...: the GPU runs at its power cap and its clock drifts as it warms;
one forward is far longer than any cache, so inputs are not rotated), peak memory, the output's
cosine and rel-L1 against the first baseline's eager forward, fp8dit's speed-up over every
baseline, and which backend each attention call of one fp8dit forward took. Rows are merged
into ``benchmarks/results/<gpu>-forward.json`` with the GPU, driver, software versions, commit
and date; a table is printed last. Exit status 1 when a row failed or gave NaN.

    python benchmarks/bench_forward.py --model wan --layers 2 --repeats 5 --compile --cuda-graph
    python benchmarks/bench_forward.py --model flux --size 1024 --repeats 10
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

SCRIPT = "bench_forward"
RESULTS = Path(__file__).resolve().parent / "results"
ROTATE_FIRST = "fp8dit-rotate-first"
ROTATE_FIRST_VARIANT = (
    "--rotate-first", ROTATE_FIRST,
    "add a model on fp8dit whose processors rotate q and k in torch first (fuse_rotary off: the "
    "rotary embedding not fused into fp8dit's quantization)")


# ---------------------------------------------------------------------------------------------
# The models: arguments, model, inputs and row fields of each --model
# ---------------------------------------------------------------------------------------------


def seeded_model(cls_name: str, seed: int, device, **config):
    """``diffusers.<cls_name>(**config)`` with weights seeded by ``seed``, built on ``device``,
    in eval mode, bf16, without gradients: the same weights for every backend's model."""
    import diffusers

    torch.manual_seed(seed)
    with torch.device(device):
        model = getattr(diffusers, cls_name)(**config)
    return model.eval().requires_grad_(False).to(torch.bfloat16)


def _randn(gen, device, *shape):
    return torch.randn(shape, generator=gen, device=device).to(torch.bfloat16)


def _tokens(latent, patch: int = 2) -> int:
    """Video tokens of ``(frames, height, width)`` latents in ``patch`` x ``patch`` patches."""
    frames, height, width = latent
    return frames * (height // patch) * (width // patch)


def _kept_mask(kept: int, total: int, device):
    """A prompt's ``[1, total]`` attention mask: the first ``kept`` tokens real."""
    mask = torch.zeros(1, total, dtype=torch.int64, device=device)
    mask[:, :kept] = 1
    return mask


def _at_least(parser, args, **minimum) -> None:
    for name, low in minimum.items():
        value = getattr(args, name)
        if value < low:
            parser.error(f"--{name.replace('_', '-')}: expected an integer of at least {low}, "
                         f"got {value}")


class ForwardModel:
    """One ``--model``: its options, model, inputs, baselines and row fields."""

    name = ""
    title = ""  # the rows' "model"
    diffusers_class, config = "", {}
    released: int | tuple[int, int] = 0  # the released model's blocks: all, or (dual, single)
    sdpa_allowed = ("auto", "cudnn", "flash", "efficient")
    sdpa_default = "auto,cudnn"
    sdpa_help = ""  # what the model's own baselines are
    repeats, warmup = 5, 2
    cuda_graph_help = ""
    variant: tuple[str, str, str] | None = None  # (option, fp8dit model name, help)

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        """The model's own options (here: how many blocks, ``--layers`` or ``--dual`` and
        ``--single``)."""
        if isinstance(self.released, tuple):
            p.add_argument("--dual", type=int, default=1,
                           help=f"dual-stream blocks (the model has {self.released[0]})")
            p.add_argument("--single", type=int, default=2,
                           help=f"single-stream blocks (the model has {self.released[1]})")
        else:
            p.add_argument("--layers", type=int, default=2,
                           help=f"transformer blocks (the model has {self.released})")

    def check(self, parser, args) -> None:
        """parser.error for values out of range (after argparse's own checks)."""
        if not isinstance(self.released, tuple):
            _at_least(parser, args, layers=1)
            return
        _at_least(parser, args, dual=0, single=0)
        if args.dual + args.single < 1:
            parser.error(f"--dual, --single: expected at least one block in all, got "
                         f"{args.dual} and {args.single}")

    def build(self, args, device):
        """The model with ``args``' blocks and weights seeded by ``--seed``."""
        blocks = (dict(num_layers=args.dual, num_single_layers=args.single)
                  if isinstance(self.released, tuple) else dict(num_layers=args.layers))
        return seeded_model(self.diffusers_class, args.seed, device, **self.config, **blocks)

    def describe(self, args) -> str:
        raise NotImplementedError

    def inputs(self, args, device) -> dict:
        raise NotImplementedError

    def fields(self, args) -> dict:
        """The model's own fields of every row."""
        raise NotImplementedError

    def prepare(self, models: dict, args) -> dict:
        """Work on the built models before their backends are pinned; the diffusers backend of
        any baseline that does not run "native" (:func:`pin_backends`)."""
        return {}

    def variants(self, args) -> list[str]:
        if self.variant is None:
            return []
        option, model_name, _ = self.variant
        return [model_name] if getattr(args, option[2:].replace("-", "_")) else []


def wan_inputs(preset: dict, seed: int, device) -> dict:
    """One denoising step's inputs for a Wan preset of ``fp8dit.tools.demo.PRESETS``: random bf16
    latents of its 720p/480p shape, timestep 500, random text embeddings."""
    cfg = preset["config"]
    gen = torch.Generator(device=device).manual_seed(seed)
    return dict(
        hidden_states=_randn(gen, device, 1, cfg["in_channels"], *preset["latent"]),
        timestep=torch.full((1,), 500.0, device=device),
        encoder_hidden_states=_randn(gen, device, 1, preset["text_len"], cfg["text_dim"]),
    )


class Wan(ForwardModel):
    """Wan2.2-A14B: diffusers' ``WanTransformer3DModel`` at the A14B width (40 heads x 128, ffn
    13824, text 4096; ``fp8dit.tools.demo.PRESETS``) on 720p 81-frame latents (16x21x90x160 ->
    75,600 tokens) or 480p. The baselines call ``F.scaled_dot_product_attention`` on permuted
    [B, H, S, D] views. ``--diffusers-rope`` adds fp8dit behind diffusers' own Wan processors
    (q and k rotated by diffusers' eager ops, then fp8dit): the path before fp8dit fused the
    rotation into its quantization (``fp8dit.enable`` swaps in ``WanRotaryProcessor``)."""

    name, title = "wan", "Wan2.2-A14B"
    sdpa_allowed, sdpa_default = ("cudnn", "flash", "efficient"), "cudnn"
    variant = ("--diffusers-rope", "fp8dit-diffusers-rope",
               "also fp8dit behind diffusers' own processors (eager rotation)")

    released = 40

    def add_arguments(self, p):
        p.add_argument("--resolution", choices=("720p", "480p"), default="720p")
        super().add_arguments(p)

    def _preset(self, args):
        from fp8dit.tools.demo import PRESETS

        return PRESETS[f"wan2.2-a14b-{args.resolution}"]

    def describe(self, args):
        return (f"Wan2.2-A14B transformer, {args.layers} blocks, {args.resolution} "
                f"({_tokens(self._preset(args)['latent'])} tokens)")

    def build(self, args, device):
        from fp8dit.tools.demo import build_model

        return build_model(self._preset(args), args.layers, args.seed, device)

    def inputs(self, args, device):
        return wan_inputs(self._preset(args), args.seed + 1, device)

    def fields(self, args):
        cfg = self._preset(args)["config"]
        return dict(model=self.title, layers=args.layers, resolution=args.resolution,
                    tokens=_tokens(self._preset(args)["latent"]), heads=cfg["num_attention_heads"],
                    head_dim=cfg["attention_head_dim"])


HUNYUAN_CONFIG = dict(
    in_channels=16, out_channels=16, num_attention_heads=24, attention_head_dim=128,
    num_refiner_layers=2, mlp_ratio=4.0, patch_size=2, patch_size_t=1, qk_norm="rms_norm",
    guidance_embeds=True, text_embed_dim=4096, pooled_projection_dim=768,
    rope_axes_dim=(16, 56, 56))
HUNYUAN_LATENTS = {"720p": (33, 90, 160), "540p": (33, 68, 120)}  # 129 frames


class HunyuanVideo(ForwardModel):
    """HunyuanVideo: diffusers' ``HunyuanVideoTransformer3DModel`` at the 13B width (24 heads x
    128, mlp ratio 4, text 4096) on 720p 129-frame latents (16x33x90x160 -> 118,800 tokens)
    and ``--text`` prompt tokens of which ``--kept`` are real. Every attention call gets the
    model's ``[B, 1, 1, S]`` boolean mask that drops the prompt's padding: fp8dit runs it FP8
    over the kept keys (``fp8dit.key_padding``); the baselines get SDPA with the mask, and
    ``cudnn-kept`` is SDPA cuDNN without a mask over the kept keys."""

    name, title = "hunyuanvideo", "HunyuanVideo"
    diffusers_class, config, released = "HunyuanVideoTransformer3DModel", HUNYUAN_CONFIG, (20, 40)
    sdpa_allowed = ("auto", "cudnn", "efficient", "cudnn-kept")
    sdpa_default = "auto,cudnn,cudnn-kept"
    sdpa_help = ("; cudnn-kept: cuDNN without a mask over the kept keys "
                 "(register_kept_keys_baseline)")
    cuda_graph_help = (
        " (fp8dit keeps the mask's key lengths on the device there; the cudnn-kept baseline, "
        "which reads them on the host, cannot be captured and reports an error row)")
    variant = ROTATE_FIRST_VARIANT

    def add_arguments(self, p):
        p.add_argument("--resolution", choices=sorted(HUNYUAN_LATENTS), default="720p")
        super().add_arguments(p)
        p.add_argument("--text", type=int, default=256, help="prompt tokens, padding included")
        p.add_argument("--kept", type=int, default=100, help="real prompt tokens (the mask keeps)")

    def check(self, parser, args):
        super().check(parser, args)
        _at_least(parser, args, text=1)
        if not 1 <= args.kept <= args.text:
            parser.error(f"--kept: expected 1..--text ({args.text}), got {args.kept}")

    def describe(self, args):
        return (f"HunyuanVideo transformer, {args.dual} dual + {args.single} single blocks, "
                f"{args.resolution} ({_tokens(HUNYUAN_LATENTS[args.resolution])} video tokens "
                f"+ {args.text} text, {args.kept} kept)")

    def inputs(self, args, device):
        gen = torch.Generator(device=device).manual_seed(args.seed + 1)
        return dict(
            hidden_states=_randn(gen, device, 1, HUNYUAN_CONFIG["in_channels"],
                                 *HUNYUAN_LATENTS[args.resolution]),
            timestep=torch.full((1,), 500, device=device, dtype=torch.int64),
            encoder_hidden_states=_randn(gen, device, 1, args.text,
                                         HUNYUAN_CONFIG["text_embed_dim"]),
            encoder_attention_mask=_kept_mask(args.kept, args.text, device),
            pooled_projections=_randn(gen, device, 1, HUNYUAN_CONFIG["pooled_projection_dim"]),
            guidance=torch.full((1,), 6000.0, device=device),
        )

    def prepare(self, models, args):
        if "cudnn-kept" not in args.sdpa:
            return {}
        return {"sdpa-cudnn-kept": register_kept_keys_baseline()}

    def fields(self, args):
        video = _tokens(HUNYUAN_LATENTS[args.resolution])
        return dict(model=self.title, dual_layers=args.dual, single_layers=args.single,
                    resolution=args.resolution, tokens=video + args.text,
                    kept_keys=video + args.kept, heads=HUNYUAN_CONFIG["num_attention_heads"],
                    head_dim=HUNYUAN_CONFIG["attention_head_dim"])


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
    # recompile at every forward's new mask, up to its recompile limit (H200, 2026-12-03).
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


HUNYUAN15_CONFIG = dict(
    in_channels=65, out_channels=32, num_attention_heads=16, attention_head_dim=128,
    num_refiner_layers=2, mlp_ratio=4.0, patch_size=1, patch_size_t=1, qk_norm="rms_norm",
    text_embed_dim=3584, text_embed_2_dim=1472, image_embed_dim=1152, rope_theta=256.0,
    rope_axes_dim=(16, 56, 56))
HUNYUAN15_LATENTS = {"480p": (31, 30, 53), "720p": (31, 45, 80)}  # 121 frames
TEXT, TEXT_2, IMAGE = 1000, 256, 729  # HunyuanVideo15Pipeline's token counts


class HunyuanVideo15(ForwardModel):
    """HunyuanVideo 1.5: diffusers' ``HunyuanVideo15Transformer3DModel`` at its released width
    (16 heads x 128, text 3584, glyph text 1472, image 1152; the class defaults),
    text-to-video as ``HunyuanVideo15Pipeline`` calls it: latents of 121 frames at 480p (16x
    spatial, 4x temporal compression: 31 x 30 x 53 -> 49,290 tokens) or 720p (31 x 45 x 80 ->
    111,600), concatenated with their condition channels (65 in all), 1,000 prompt tokens of
    which ``--kept`` are real, 256 glyph tokens of which ``--kept-2``, and 729 zero image tokens
    (text-to-video: all dropped). Every attention call builds a ``[B, 1, S, S]`` mask, (valid
    query) & (valid key) with the valid tokens first: the baselines run SDPA with it.
    ``fp8dit.enable`` replaces that processor (``HunyuanVideo15KeyMaskProcessor``): fp8dit gets
    the ``[B, 1, 1, S]`` key mask and runs FP8 over the kept keys, with no S^2 mask built. The
    baseline ``auto-keymask`` is the fairer peer: SDPA with that processor too, so it also gets
    the key mask."""

    name, title = "hunyuanvideo15", "HunyuanVideo-1.5"
    diffusers_class, config, released = "HunyuanVideo15Transformer3DModel", HUNYUAN15_CONFIG, 54
    sdpa_allowed, sdpa_default = ("auto", "cudnn", "efficient", "auto-keymask"), "auto"
    sdpa_help = "; auto-keymask: SDPA given the [B, 1, 1, S] key mask instead"
    variant = ROTATE_FIRST_VARIANT
    cuda_graph_help = (
        "; fails with every backend (H200, 2026-12-04): the model's forward reads tensors on "
        "the host (if torch.all(image_embeds == 0), boolean indexing of the text), which "
        "capture forbids")

    def add_arguments(self, p):
        p.add_argument("--resolution", choices=sorted(HUNYUAN15_LATENTS), default="480p")
        super().add_arguments(p)
        p.add_argument("--kept", type=int, default=120, help=f"real prompt tokens (of {TEXT})")
        p.add_argument("--kept-2", type=int, default=16, help=f"real glyph tokens (of {TEXT_2})")

    def check(self, parser, args):
        super().check(parser, args)
        if not 1 <= args.kept <= TEXT or not 0 <= args.kept_2 <= TEXT_2:
            parser.error(f"--kept: expected 1..{TEXT}, --kept-2 0..{TEXT_2}, got {args.kept} "
                         f"and {args.kept_2}")

    def describe(self, args):
        video = _tokens(HUNYUAN15_LATENTS[args.resolution], patch=1)
        return (f"HunyuanVideo 1.5 transformer, {args.layers} blocks, {args.resolution} "
                f"({video} video + {TEXT + TEXT_2 + IMAGE} conditioning tokens, "
                f"{video + args.kept + args.kept_2} kept)")

    def inputs(self, args, device):
        gen = torch.Generator(device=device).manual_seed(args.seed + 1)
        cfg = HUNYUAN15_CONFIG
        return dict(
            hidden_states=_randn(gen, device, 1, cfg["in_channels"],
                                 *HUNYUAN15_LATENTS[args.resolution]),
            timestep=torch.full((1,), 500.0, device=device).to(torch.bfloat16),
            encoder_hidden_states=_randn(gen, device, 1, TEXT, cfg["text_embed_dim"]),
            encoder_attention_mask=_kept_mask(args.kept, TEXT, device),
            encoder_hidden_states_2=_randn(gen, device, 1, TEXT_2, cfg["text_embed_2_dim"]),
            encoder_attention_mask_2=_kept_mask(args.kept_2, TEXT_2, device),
            image_embeds=torch.zeros(1, IMAGE, cfg["image_embed_dim"], device=device,
                                     dtype=torch.bfloat16),
        )

    def prepare(self, models, args):
        for name, model in models.items():
            if name.endswith("-keymask"):
                give_sdpa_the_key_mask(model)
        return {}

    def fields(self, args):
        video = _tokens(HUNYUAN15_LATENTS[args.resolution], patch=1)
        return dict(model=self.title, layers=args.layers, resolution=args.resolution,
                    tokens=video + TEXT + TEXT_2 + IMAGE,
                    kept_keys=video + args.kept + args.kept_2,
                    heads=HUNYUAN15_CONFIG["num_attention_heads"],
                    head_dim=HUNYUAN15_CONFIG["attention_head_dim"])


def give_sdpa_the_key_mask(model) -> None:
    """HunyuanVideo 1.5's processors replaced as ``fp8dit.enable`` does, but handing the key
    mask to diffusers' native backend (SDPA) as well."""
    from fp8dit.integrations import diffusers as fd
    from fp8dit.integrations.diffusers_processors import HunyuanVideo15KeyMaskProcessor

    fd.route_through_dispatcher(model)
    for module in model.modules():
        if isinstance(getattr(module, "processor", None), HunyuanVideo15KeyMaskProcessor):
            module.processor.key_mask_backends = frozenset({"native"})


# CogVideoX-5B's transformer (THUDM/CogVideoX-5b, transformer/config.json), without num_layers.
COGVIDEOX_CONFIG = dict(
    num_attention_heads=48, attention_head_dim=64, in_channels=16, out_channels=16,
    flip_sin_to_cos=True, freq_shift=0, time_embed_dim=512, text_embed_dim=4096, dropout=0.0,
    attention_bias=True, sample_width=90, sample_height=60, sample_frames=49, patch_size=2,
    temporal_compression_ratio=4, max_text_seq_length=226, activation_fn="gelu-approximate",
    timestep_activation_fn="silu", norm_elementwise_affine=True, norm_eps=1e-5,
    spatial_interpolation_scale=1.875, temporal_interpolation_scale=1.0,
    use_rotary_positional_embeddings=True, use_learned_positional_embeddings=False)
COGVIDEOX_LATENT = (13, 60, 90)  # 49 frames (1 + 48 / 4), 480 / 8, 720 / 8


class CogVideoX(ForwardModel):
    """CogVideoX-5B: diffusers' ``CogVideoXTransformer3DModel`` at the 5B width (48 heads x 64,
    text 4096, RoPE) on the latents of a 49-frame 720x480 video (16 x 13 x 60 x 90 -> 17,550
    video tokens, plus 226 text tokens in one joint attention) at batch ``--batch`` (2: the
    pipeline's classifier-free guidance runs the conditional and unconditional inputs as one
    batch). diffusers' CogVideoX processors call ``F.scaled_dot_product_attention`` themselves,
    so no attention backend reaches them; ``fp8dit.enable`` first replaces them with processors
    that go through diffusers' dispatcher (``fp8dit.integrations.diffusers_processors``). Every
    model here is routed that way, so the baselines' ``native`` backend computes bitwise what
    diffusers' own processor does (``tests/test_diffusers_processors.py``)."""

    name, title = "cogvideox", "CogVideoX-5B"
    diffusers_class, config, released = "CogVideoXTransformer3DModel", COGVIDEOX_CONFIG, 42
    variant = ROTATE_FIRST_VARIANT

    def add_arguments(self, p):
        super().add_arguments(p)
        p.add_argument("--batch", type=int, default=2,
                       help="batch (2: classifier-free guidance, as CogVideoXPipeline runs it)")

    def check(self, parser, args):
        super().check(parser, args)
        _at_least(parser, args, batch=1)

    def describe(self, args):
        return (f"CogVideoX-5B transformer, {args.layers} blocks, batch {args.batch}, 49 frames "
                f"720x480 ({_tokens(COGVIDEOX_LATENT)} video + "
                f"{COGVIDEOX_CONFIG['max_text_seq_length']} text tokens)")

    def inputs(self, args, device):
        """One denoising step's inputs as CogVideoXPipeline builds them: random bf16 latents
        and text embeddings, timestep 500, and the 3-D RoPE of the latent grid (the pipeline's
        ``_prepare_rotary_positional_embeddings``: the grid equals the model's sample size, so
        the crop region is the whole grid)."""
        from diffusers.models.embeddings import get_3d_rotary_pos_embed

        cfg = COGVIDEOX_CONFIG
        frames, height, width = COGVIDEOX_LATENT
        grid = (height // cfg["patch_size"], width // cfg["patch_size"])
        cos, sin = get_3d_rotary_pos_embed(embed_dim=cfg["attention_head_dim"],
                                           crops_coords=((0, 0), grid), grid_size=grid,
                                           temporal_size=frames, device=device)
        gen = torch.Generator(device=device).manual_seed(args.seed + 1)
        return dict(
            hidden_states=_randn(gen, device, args.batch, frames, cfg["in_channels"], height,
                                 width),
            encoder_hidden_states=_randn(gen, device, args.batch, cfg["max_text_seq_length"],
                                         cfg["text_embed_dim"]),
            timestep=torch.full((args.batch,), 500, device=device, dtype=torch.int64),
            image_rotary_emb=(cos, sin),
        )

    def prepare(self, models, args):
        from fp8dit.integrations import diffusers as fd

        for model in models.values():
            fd.route_through_dispatcher(model)  # the baselines too: "native" is diffusers' own
        return {}

    def fields(self, args):
        tokens = _tokens(COGVIDEOX_LATENT) + COGVIDEOX_CONFIG["max_text_seq_length"]
        return dict(model=self.title, layers=args.layers, batch=args.batch, frames=49,
                    resolution="720x480", tokens=tokens,
                    heads=COGVIDEOX_CONFIG["num_attention_heads"],
                    head_dim=COGVIDEOX_CONFIG["attention_head_dim"])


FLUX_CONFIG = dict(patch_size=1, in_channels=64, attention_head_dim=128, num_attention_heads=24,
                   joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                   axes_dims_rope=(16, 56, 56))
FLUX_TEXT = 512


class Flux(ForwardModel):
    """FLUX.1-dev: diffusers' ``FluxTransformer2DModel`` at FLUX.1-dev's width (24 heads x 128,
    text 4096) on the packed latents of a ``--size`` x ``--size`` image (1024: 4,096 image
    tokens; 2048: 16,384) and 512 text tokens in one joint attention, no mask. At 1024 px
    fp8dit's ``auto`` runs SDPA (4,608 tokens are under the length where FP8 pays on the H200,
    ``dispatch.FP8_MIN_TOKENS``); ``FP8DIT_BACKEND=fp8`` in the environment forces FP8 there,
    and the rows record which was used."""

    name, title = "flux", "FLUX.1-dev"
    diffusers_class, config, released = "FluxTransformer2DModel", FLUX_CONFIG, (19, 38)
    sdpa_default = "cudnn,flash"
    repeats, warmup = 10, 3

    def add_arguments(self, p):
        p.add_argument("--size", type=int, choices=(1024, 1536, 2048), default=1024,
                       help="image side in pixels (latents: size / 8, packed 2 x 2)")
        super().add_arguments(p)
        p.add_argument("--batch", type=int, default=1)

    def check(self, parser, args):
        from fp8dit.env import default_backend

        _at_least(parser, args, batch=1)
        super().check(parser, args)
        try:
            args.fp8dit_backend = default_backend()
        except ValueError as e:
            parser.error(str(e))

    def describe(self, args):
        return (f"Flux transformer, {args.dual} dual + {args.single} single blocks, {args.size} "
                f"px ({(args.size // 16) ** 2} image + {FLUX_TEXT} text tokens), batch "
                f"{args.batch}, fp8dit backend {args.fp8dit_backend}")

    def inputs(self, args, device):
        """One denoising step's inputs as FluxPipeline builds them: packed latents (2 x 2
        patches of the size / 8 latent), their (0, row, column) ids, zero text ids, timestep
        0.5, guidance 3.5."""
        side = args.size // 16  # packed tokens per side
        rows, cols = torch.meshgrid(torch.arange(side, device=device),
                                    torch.arange(side, device=device), indexing="ij")
        img_ids = torch.stack([torch.zeros_like(rows), rows, cols], -1).reshape(-1, 3).float()
        gen = torch.Generator(device=device).manual_seed(args.seed + 1)
        return dict(
            hidden_states=_randn(gen, device, args.batch, side * side, FLUX_CONFIG["in_channels"]),
            encoder_hidden_states=_randn(gen, device, args.batch, FLUX_TEXT,
                                         FLUX_CONFIG["joint_attention_dim"]),
            pooled_projections=_randn(gen, device, args.batch,
                                      FLUX_CONFIG["pooled_projection_dim"]),
            timestep=torch.full((args.batch,), 0.5, device=device),
            guidance=torch.full((args.batch,), 3.5, device=device),
            img_ids=img_ids, txt_ids=torch.zeros(FLUX_TEXT, 3, device=device),
        )

    def fields(self, args):
        return dict(model=self.title, dual_layers=args.dual, single_layers=args.single,
                    size=args.size, batch=args.batch, tokens=(args.size // 16) ** 2 + FLUX_TEXT,
                    heads=FLUX_CONFIG["num_attention_heads"],
                    head_dim=FLUX_CONFIG["attention_head_dim"], fp8dit_backend=args.fp8dit_backend)


MODELS = {m.name: m for m in (Wan(), HunyuanVideo(), HunyuanVideo15(), CogVideoX(), Flux())}


# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    """The common options, then ``--model``'s own (``args.sdpa`` becomes a list)."""
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--model")
    model = MODELS.get(first.parse_known_args(argv)[0].model)
    m = model or ForwardModel()  # without a valid --model: the common options, for --help
    p = argparse.ArgumentParser(
        prog=f"{SCRIPT}.py", description=__doc__.splitlines()[0],
        epilog=inspect.cleandoc(model.__doc__) if model
        else "--model NAME --help: that model and its own options",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, choices=MODELS, help="the transformer")
    def default(value) -> str:
        return f"default {value}" if model else "default: --model's"

    p.add_argument("--repeats", type=int, default=m.repeats,
                   help=f"timed forwards per row ({default(m.repeats)})")
    p.add_argument("--warmup", type=int, default=m.warmup,
                   help=f"untimed forwards before timing ({default(m.warmup)})")
    auto = "; auto: torch's own choice" if "auto" in m.sdpa_allowed else ""
    p.add_argument("--sdpa", default=m.sdpa_default,
                   help="baselines, comma-separated, among " + ", ".join(m.sdpa_allowed)
                        + f" (diffusers' native backend with that SDPA kernel forced{auto}"
                        f"{m.sdpa_help}); the first is the reference and the speed-up's "
                        f"denominator ({default(m.sdpa_default)})")
    p.add_argument("--compile", action="store_true", help="also torch.compile every model")
    p.add_argument("--cuda-graph", action="store_true",
                   help="also capture and replay" + m.cuda_graph_help)
    if m.variant is not None:
        option, _, text = m.variant
        p.add_argument(option, action="store_true", help=text)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None,
                   help="JSON file (default benchmarks/results/<gpu>-forward.json)")
    if model is not None:
        model.add_arguments(p)
    args = p.parse_args(argv)
    _at_least(p, args, repeats=1, warmup=0)
    model.check(p, args)
    names = [s.strip() for s in args.sdpa.split(",") if s.strip()]
    bad = [s for s in names if s not in model.sdpa_allowed]
    if bad or not names:
        p.error(f"--sdpa: expected baselines among {', '.join(model.sdpa_allowed)} for "
                f"--model {model.name}, got {', '.join(bad) if bad else 'none'}")
    args.sdpa = list(dict.fromkeys(names))
    return args


# ---------------------------------------------------------------------------------------------
# Models per backend, pinned
# ---------------------------------------------------------------------------------------------


def backend_models(baselines, build, fp8dit_variants=()) -> dict:
    """``{"sdpa-<kernel>": build(), ..., "fp8dit": build(), "fp8dit-<variant>": build()}``: one
    model per backend (``build`` seeds its weights, so they are the same), since the backends
    alternate call by call and a compiled model or captured graph cannot switch its attention
    backend. A ``fp8dit-<variant>`` model runs fp8dit through diffusers' own processors
    (``set_attention_backend``, not ``fp8dit.enable``); ``fp8dit-rotate-first`` through
    ``fp8dit.enable``'s processors with ``fuse_rotary`` off (q and k rotated in torch first,
    in diffusers' arithmetic: the same work as diffusers' processors, the same masks)."""
    return {name: build()
            for name in [f"sdpa-{s}" for s in baselines] + ["fp8dit", *fp8dit_variants]}


def pin_backends(models: dict, layer_backends: dict | None = None) -> None:
    """The attention layers of ``models["fp8dit"]`` on fp8dit, every other model's (the
    ``sdpa-<kernel>`` baselines) on diffusers' "native" or ``layer_backends[name]``. Layers
    whose processor calls torch SDPA itself and has no dispatching replacement (HunyuanVideo's
    token refiner) run SDPA in every model and are left out of the check."""
    from fp8dit.integrations import diffusers as fd

    fd.register()
    # diffusers' set_attention_backend also sets the process-wide active backend, which layers
    # without their own follow: the baselines' layers are pinned to "native" explicitly, and
    # checked, or every model would run fp8dit.
    layer_backends = dict(layer_backends or {}, fp8dit="fp8dit")
    enabled = ["fp8dit"] + [n for n in models if n == ROTATE_FIRST]
    for name in models:
        if name.startswith("fp8dit-"):  # diffusers' processors, fp8dit's backend
            layer_backends[name] = "fp8dit"
    for name, model in models.items():
        if name not in enabled:
            model.set_attention_backend(layer_backends.get(name, "native"))
    for name in enabled:
        fd.enable(models[name])
    if ROTATE_FIRST in models:
        from fp8dit.integrations.diffusers_processors import REPLACEMENT_TYPES

        for _, proc in fd._attention_processors(models[ROTATE_FIRST]):
            if isinstance(proc, REPLACEMENT_TYPES):
                proc.fuse_rotary = False
    for name in models:
        want = layer_backends.get(name, "native")
        got = set(fd.layer_backends(models[name]).values()) - {fd.TORCH_SDPA}
        if got != {want}:
            raise RuntimeError(f"the {name} model's attention layers run {sorted(got)}, "
                               f"expected only {want!r}")


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


def cuda_device(what):
    """The GPU a forward benchmark runs on, after one line with the GPU, ``what()`` runs and
    the software versions; None, after one line saying so, when torch sees no CUDA GPU."""
    if not torch.cuda.is_available():
        print(f"{SCRIPT}: needs a CUDA GPU; torch sees none (nothing measured)")
        return None
    import diffusers
    import triton

    import fp8dit

    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(device)}: {what()}, bf16; torch {torch.__version__}, "
          f"triton {triton.__version__}, diffusers {diffusers.__version__}, fp8dit "
          f"{fp8dit.__version__}", flush=True)
    return device


def sdpa_context(name: str):
    """SDPA limited to one kernel; "auto": torch's own choice (masked calls, which flash and
    some cuDNN versions do not take)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name == "auto":
        return contextlib.nullcontext()
    kernel = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]
    return sdpa_kernel(kernel)


def event_ms(fn) -> float:
    """One call of ``fn`` timed with CUDA events (waits for it)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def time_ms(fn, warmup: int, repeats: int, before_each=None) -> tuple[float, float]:
    """Median and min of CUDA-event times of ``fn``; ``before_each`` runs untimed before each
    timed call (the context-parallel benchmark lines its ranks up there)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        if before_each is not None:
            before_each()
        times.append(event_ms(fn))
    return statistics.median(times), min(times)


def alternate_ms(calls: dict, warmup: int, repeats: int) -> dict:
    """{name: (median ms, min ms)} of each ``calls[name] = (row, fn)``, the backends called in
    turn (A B, then B A, ...), each call timed alone with CUDA events. Why: the H200 runs
    these forwards at its 700 W power cap, and its clock drifts as it warms (H200,
    2026-12-03); timing one backend's forwards in a block and then the other's gave the second
    a warmer GPU."""
    names = list(calls)
    for _ in range(warmup):
        for name in names:
            calls[name][1]()
    torch.cuda.synchronize()
    times = {name: [] for name in names}
    for i in range(repeats):
        for name in (names if i % 2 == 0 else names[::-1]):
            times[name].append(event_ms(calls[name][1]))
    return {name: (statistics.median(t), min(t)) for name, t in times.items()}


def capture(fn):
    """A CUDA graph of ``fn`` (after two warm-up calls on a side stream) and its output."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def graph_breaks(model, inputs) -> tuple[int, list[str]]:
    import torch._dynamo

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(**inputs, return_dict=False)
    reasons = [str(getattr(r, "reason", r)).splitlines()[0] for r in explanation.break_reasons]
    torch._dynamo.reset()
    return explanation.graph_break_count, reasons


def error_text(e: BaseException) -> str:
    """A failed row's ``error``: the exception's type and first line."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def _prepare_mode(mode: str, name: str, model, forward):
    """(the call to time, its first output, a graph to keep alive) of one model in ``mode``."""
    if mode == "compile":
        call = forward(torch.compile(model), name)
        return call, call(), None  # the first call compiles
    if mode == "cuda-graph":
        graph, out = capture(forward(model, name))
        graph.replay()
        return graph.replay, out, graph
    call = forward(model, name)
    return call, call(), None


def compare_forwards(models: dict, inputs: dict, baseline: str, modes, warmup: int,
                     repeats: int, common: dict, model_bytes: int) -> list[dict]:
    """One row per (mode, backend) of ``models = {"sdpa-<kernel>": model, ..., "fp8dit": model}``
    (same weights, layers pinned by :func:`pin_backends`): alternating CUDA-event times, peak
    memory and the output against the eager ``baseline``'s, fp8dit's speed-up over it. A mode
    that fails is a row with ``error``."""
    from fp8dit.testing import error_stats

    device = torch.device("cuda")
    names = list(models)

    def forward(fn, name):
        def call():
            if name.startswith("fp8dit"):
                return fn(**inputs, return_dict=False)[0]
            # "sdpa-<kernel>[-variant]": the variant is the layers' backend (pin_backends)
            with sdpa_context(name.removeprefix("sdpa-").split("-")[0]):
                return fn(**inputs, return_dict=False)[0]
        return call

    rows, ref = [], None
    with torch.no_grad():
        for mode in modes:
            torch._dynamo.reset()
            if mode == "compile":  # explain() resets dynamo: before any model compiles
                # every model's: a break the model itself makes shows in the baselines too
                breaks = {name: graph_breaks(models[name], inputs) for name in names}
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated(device)  # every model and the inputs
            calls, keep = {}, []
            for name in names:
                row = dict(common, mode=mode, backend=name)
                before = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
                t0 = time.perf_counter()
                try:
                    if mode == "compile":
                        row["graph_breaks"], row["break_reasons"] = breaks[name]
                    call, out, graph = _prepare_mode(mode, name, models[name], forward)
                    keep.append(graph)
                    torch.cuda.synchronize()
                except Exception as e:  # a failed mode is a result, not a crash
                    row["error"] = error_text(e)
                    traceback.print_exc()
                    rows.append(row)
                    print(f"  {mode:10s} {name:12s} FAILED: {row['error']}", flush=True)
                    continue
                row["setup_s"] = round(time.perf_counter() - t0, 2)
                # as if this backend's model and the inputs were alone on the GPU
                peak = torch.cuda.max_memory_allocated(device) - (before - base) - model_bytes
                row["peak_mem_gib"] = round(peak / 2**30, 2)
                if mode == "eager" and name == baseline:
                    ref = out.detach().clone()  # eager bf16 SDPA: the reference of every row
                if ref is not None:
                    stats = error_stats(out, ref)
                    row.update(cos_vs_bf16=stats.cos, rel_l1_vs_bf16=stats.rel_l1,
                               nan=stats.nan)
                calls[name] = (row, call)
                out = None
            timed = alternate_ms(calls, warmup, repeats)
            for name, (row, _) in calls.items():
                row["ms_median"], row["ms_min"] = timed[name]
                rows.append(row)
                print(f"  {mode:10s} {name:12s} {row['ms_median']:9.1f} ms  "
                      f"cos {row.get('cos_vs_bf16', float('nan')):.6f}  "
                      f"peak {row['peak_mem_gib']} GiB", flush=True)
            calls = keep = None  # frees captured graphs' memory pools
            torch._dynamo.reset()
    _speedups(rows, names, baseline)
    return rows


def _speedups(rows: list[dict], names: list[str], baseline: str) -> None:
    """Every fp8dit row's ``speedup_vs`` each other backend of its mode and ``speedup`` (vs
    ``baseline``)."""
    by_key = {(r["mode"], r["backend"]): r for r in rows}
    for r in rows:
        if not r["backend"].startswith("fp8dit") or "ms_median" not in r:
            continue
        for name in (n for n in names if n != r["backend"]):
            base = by_key.get((r["mode"], name))
            if base and "ms_median" in base:
                ratio = round(base["ms_median"] / r["ms_median"], 3)
                r.setdefault("speedup_vs", {})[name] = ratio
                if name == baseline:
                    r["speedup"] = ratio


# ---------------------------------------------------------------------------------------------
# Running and reporting
# ---------------------------------------------------------------------------------------------


def run_and_report(models: dict, inputs: dict, args, fields: dict) -> int:
    """The rest of a forward benchmark once :func:`pin_backends` has run: one fp8dit forward
    under ``record_calls`` (which backend and kernel each attention call took, printed and kept
    in the rows), :func:`compare_forwards` over the modes ``args`` asks for (``--compile``,
    ``--cuda-graph``; the first model is the baseline), then :func:`report` to ``args.out`` or
    results/<gpu>-forward.json. ``fields``: the model's own row fields."""
    import diffusers

    from fp8dit.integrations import diffusers as fd
    from fp8dit.tools.bench import run_metadata

    baseline = next(iter(models))
    with fd.record_calls() as calls, torch.no_grad():
        models["fp8dit"](**inputs, return_dict=False)
    for c in calls:
        print(f"  fp8dit call: {c['backend']} ({c.get('kernel')}) q {c['q']} k {c['k']}: "
              f"{c['reason']}")
    device = next(models["fp8dit"].parameters()).device
    common = dict(run_metadata(device), diffusers=diffusers.__version__, **fields,
                  repeats=args.repeats, warmup=args.warmup, timing="alternating",
                  fp8dit_calls=[c["backend"] for c in calls])
    modes = ["eager"] + (["compile"] if args.compile else []) + (
        ["cuda-graph"] if args.cuda_graph else [])
    model_bytes = sum(p.numel() * p.element_size() for p in models["fp8dit"].parameters())
    rows = compare_forwards(models, inputs, baseline, modes, args.warmup, args.repeats, common,
                            model_bytes)
    return report(rows, Path(args.out) if args.out else None)


def cell(key: str, spec: str = "", suffix: str = ""):
    """A table column's cell of a row: ``row[key]`` formatted, "-" where it has none."""
    return lambda r: "-" if r.get(key) is None else format(r[key], spec) + suffix


def print_table(rows: list[dict], columns) -> None:
    """A header and one line per row; ``columns``: ``(title, width, cell(row) -> str)``, the
    first two (mode and backend) left-aligned. A failed row shows its error after them."""
    def line(cells, widths):
        return " ".join(c.ljust(w) if i < 2 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    widths = [w for _, w, _ in columns]
    print("\n" + line([title for title, _, _ in columns], widths))
    for r in rows:
        first = [fn(r) for _, _, fn in columns[:2]]
        if "error" in r:
            print(" ".join(c.ljust(w) for c, w in zip(first, widths)) + f" failed: {r['error']}")
        else:
            print(line(first + [fn(r) for _, _, fn in columns[2:]], widths))


def report(rows: list[dict], out_path: Path | None) -> int:
    """Merge ``rows`` into ``out_path`` (default results/<gpu>-forward.json), print the table;
    the exit code: 1 when a row failed or gave NaN."""
    from fp8dit.tools.bench import gpu_slug, save_results

    if out_path is None:
        out_path = RESULTS / f"{gpu_slug(rows[0]['gpu'])}-forward.json"
    total = save_results(out_path, rows)
    print(f"\nwrote {len(rows)} rows to {out_path} ({total} in the file)")
    for r in rows:
        if r.get("graph_breaks") is not None:
            print(f"{r['backend']} graph breaks under torch.compile: {r['graph_breaks']}"
                  + (" (" + "; ".join(r["break_reasons"][:5]) + ")" if r["break_reasons"] else ""))
    print_table(rows, [
        ("mode", 11, cell("mode")), ("backend", 12, cell("backend")),
        ("median ms", 10, cell("ms_median", ".1f")), ("min ms", 9, cell("ms_min", ".1f")),
        ("speed-up", 9, cell("speedup", ".2f", "x")),
        ("cos vs bf16", 12, cell("cos_vs_bf16", ".6f")),
        ("peak GiB", 9, cell("peak_mem_gib", ".2f"))])
    return 1 if any("error" in r or r.get("nan") for r in rows) else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    model = MODELS[args.model]
    device = cuda_device(lambda: model.describe(args))
    if device is None:
        return 2
    models = backend_models(args.sdpa, lambda: model.build(args, device), model.variants(args))
    inputs = model.inputs(args, device)
    pin_backends(models, model.prepare(models, args))
    return run_and_report(models, inputs, args, model.fields(args))


if __name__ == "__main__":
    sys.exit(main())
