"""Real DiT self-attention shapes (the models' published configurations) as data, and
``--shape`` parsing.

Every preset is non-causal self-attention on bfloat16 inputs with ``Sq == Sk``: one call of a
model at its default resolution, the tokens that attend together (joint attention: image or
video tokens and the prompt's). ``bench`` and ``check`` take ``--preset NAME`` and
``--shape B,H,S,D``; ``bench`` also takes the groups of :data:`GROUPS` (``all``: the six shapes
of the README's tables; ``models``: one shape per model that DiT users run today).

Example
-------
>>> from fp8dit.tools.presets import resolve_shapes
>>> [(s.name, s.S) for s in resolve_shapes(["flux-1024"], ["1,4,1024,64"])]
[('flux-1024', 4608), ('B1-H4-S1024-D64', 1024)]
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "GROUPS",
    "PRESETS",
    "Shape",
    "ShapeError",
    "attention_flops",
    "parse_shape",
    "resolve_shapes",
]


class ShapeError(ValueError):
    """A ``--preset`` or ``--shape`` argument that cannot be used; the message says why."""


@dataclass(frozen=True)
class Shape:
    """One attention problem: ``B`` batch, ``H`` heads, ``S`` tokens (q and kv), ``D`` head dim."""

    name: str
    B: int
    H: int
    S: int
    D: int
    model: str = ""
    note: str = ""

    @property
    def flops(self) -> int:
        return attention_flops(self.B, self.H, self.S, self.S, self.D)

    def dims(self) -> str:
        return f"B{self.B} H{self.H} S{self.S} D{self.D}"


PRESETS: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("wan2.2-a14b-720p", 1, 40, 75600, 128,
              "Wan2.2-T2V-A14B, 1280x720, 81 frames", "21x45x80 latent patches"),
        Shape("wan-480p", 1, 40, 32760, 128, "Wan2.x 14B, 832x480, 81 frames"),
        Shape("wan2.1-1.3b-480p", 1, 12, 32760, 128, "Wan2.1-T2V-1.3B, 832x480, 81 frames"),
        Shape("hunyuanvideo-720p", 1, 24, 118800, 128, "HunyuanVideo, 720p, 129 frames",
              "joint attention; up to 256 text tokens not included"),
        Shape("flux-1024", 1, 24, 4608, 128, "Flux.1-dev 1024x1024", "4096 image + 512 text"),
        Shape("cogvideox-5b", 1, 48, 17776, 64, "CogVideoX-5B", "head_dim 64"),
        # The models of diffusers' transformer files and their released configurations;
        # tokens = latent frames x latent patches (+ the prompt's where attention is joint).
        Shape("flux-2048", 1, 24, 16896, 128, "FLUX.1-dev 2048x2048",
              "joint: 16,384 image + 512 text"),
        Shape("flux.2-dev-1024", 1, 48, 4608, 128, "FLUX.2-dev (32B) 1024x1024",
              "joint: 4,096 image + 512 text"),
        Shape("sd3.5-large-1024", 1, 38, 4429, 64, "Stable Diffusion 3.5 Large 1024x1024",
              "joint: 4,096 image + 333 text; head_dim 64, no RoPE"),
        Shape("qwen-image-1328", 1, 24, 7100, 128, "Qwen-Image 1328x1328",
              "joint: 6,889 image + ~211 prompt tokens (up to 512)"),
        Shape("hunyuanimage-2.1-2048", 1, 28, 5224, 128, "HunyuanImage 2.1 2048x2048",
              "joint; text masked"),
        Shape("ltx-video-2b", 1, 32, 7392, 64, "LTX-Video 2B",
              "head_dim 64; plus cross-attention to 128-1,024 text keys"),
        Shape("wan2.2-ti2v-5b-720p", 1, 24, 27280, 128, "Wan2.2-TI2V-5B, 1280x704, 121 frames",
              "31x22x40 latent patches; plus cross-attention to 512 text keys"),
        Shape("mochi-1", 1, 24, 44776, 128, "Mochi 1, 848x480, 163 frames",
              "joint: 44,520 video + 256 prompt tokens (its longest prompt)"),
        Shape("cogvideox1.5-5b", 1, 48, 45106, 64, "CogVideoX1.5-5B, 1360x768, 81 frames",
              "joint: 44,880 video + 226 text; head_dim 64"),
        Shape("cosmos-predict2-14b", 1, 40, 84480, 128,
              "Cosmos-Predict2 14B, 1280x704, 93 frames",
              "24x44x80 latent patches; plus cross-attention to 512 text keys"),
        Shape("hunyuanvideo-1.5-720p", 1, 16, 113585, 128, "HunyuanVideo 1.5, 720p, 121 frames",
              "joint: 111,600 video + 1,985 text tokens, text masked"),
        Shape("skyreels-v2-14b-720p", 1, 40, 111600, 128, "SkyReels-V2 14B, 720p, 121 frames",
              "31x45x80 latent patches; frame-block causal under diffusion forcing"),
    )
}

# Named groups for ``--preset``. ``all`` stays the six shapes that every results file and the
# README's tables were measured on; ``models``: one shape per model DiT users run today
# (FLUX.1 at 1024 and 2048 px).
GROUPS: dict[str, tuple[str, ...]] = {
    "all": ("wan2.2-a14b-720p", "wan-480p", "wan2.1-1.3b-480p", "hunyuanvideo-720p",
            "flux-1024", "cogvideox-5b"),
    "models": ("flux-1024", "flux-2048", "flux.2-dev-1024", "sd3.5-large-1024",
               "qwen-image-1328", "hunyuanimage-2.1-2048", "ltx-video-2b",
               "wan2.2-ti2v-5b-720p", "mochi-1", "cogvideox1.5-5b", "cosmos-predict2-14b",
               "hunyuanvideo-1.5-720p", "skyreels-v2-14b-720p"),
}


def attention_flops(B: int, H: int, Sq: int, Sk: int, D: int) -> int:
    """FLOPs of non-causal attention forward: two matmuls of 2*Sq*Sk*D each, per (batch, head)."""
    return 4 * B * H * Sq * Sk * D


_SHAPE_HELP = "B,H,S,D: four positive integers, e.g. 1,24,4608,128"


def parse_shape(text: str) -> Shape:
    """``"B,H,S,D"`` -> :class:`Shape` named ``B1-H24-S4608-D128``; raises :class:`ShapeError`."""
    if not isinstance(text, str):
        raise ShapeError(f"--shape: expected {_SHAPE_HELP}, got {text!r}")
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 4:
        raise ShapeError(
            f"--shape: expected {_SHAPE_HELP}; got {text!r} ({len(parts)} value"
            f"{'' if len(parts) == 1 else 's'})"
        )
    values = []
    for label, p in zip("BHSD", parts):
        try:
            n = int(p)
        except ValueError:
            raise ShapeError(
                f"--shape: {label} must be an integer, got {p!r} in {text!r} ({_SHAPE_HELP})"
            ) from None
        if n < 1:
            raise ShapeError(f"--shape: {label} must be at least 1, got {n} in {text!r}")
        values.append(n)
    B, H, S, D = values
    return Shape(f"B{B}-H{H}-S{S}-D{D}", B, H, S, D, "custom shape")


def get_preset(name: str) -> Shape:
    try:
        return PRESETS[name]
    except KeyError:
        raise ShapeError(
            f"--preset: unknown preset {name!r}; expected "
            + ", ".join(repr(g) for g in GROUPS) + " or one of: " + ", ".join(PRESETS)
        ) from None


def resolve_shapes(presets=None, shapes=None) -> list[Shape]:
    """Presets (a group of :data:`GROUPS` expands to its presets) then custom shapes, in order,
    without repeats.

    Each item of ``presets`` may itself be a comma-separated list of names.
    """
    out: list[Shape] = []
    for item in presets or ():
        for name in (n.strip() for n in item.split(",")):
            if not name:
                continue
            chosen = ([PRESETS[n] for n in GROUPS[name]] if name in GROUPS
                      else [get_preset(name)])
            out.extend(s for s in chosen if s not in out)
    for text in shapes or ():
        s = parse_shape(text)
        if s not in out:
            out.append(s)
    return out
