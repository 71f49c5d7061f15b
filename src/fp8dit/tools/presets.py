"""Real DiT self-attention shapes (the models' published configurations) as data, and
``--shape`` parsing.

Every preset is non-causal self-attention on bfloat16 inputs with ``Sq == Sk``. ``bench`` and
``check`` take ``--preset NAME`` (repeatable, or ``all``) and ``--shape B,H,S,D``.

Example
-------
>>> from fp8dit.tools.presets import resolve_shapes
>>> [(s.name, s.S) for s in resolve_shapes(["flux-1024"], ["1,4,1024,64"])]
[('flux-1024', 4608), ('B1-H4-S1024-D64', 1024)]
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
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
    )
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
            f"--preset: unknown preset {name!r}; expected 'all' or one of: "
            + ", ".join(PRESETS)
        ) from None


def resolve_shapes(presets=None, shapes=None) -> list[Shape]:
    """Presets (``"all"`` expands to every one) then custom shapes, in order, without repeats.

    Each item of ``presets`` may itself be a comma-separated list of names.
    """
    out: list[Shape] = []
    for item in presets or ():
        for name in (n.strip() for n in item.split(",")):
            if not name:
                continue
            chosen = list(PRESETS.values()) if name == "all" else [get_preset(name)]
            out.extend(s for s in chosen if s not in out)
    for text in shapes or ():
        s = parse_shape(text)
        if s not in out:
            out.append(s)
    return out
