"""Rotary position embedding applied by fp8dit itself: ``attention(..., rotary=...)``.

diffusers' video DiTs rotate q and k with eager element-wise ops (strided reads and writes of
both tensors: 12.6 ms per layer at Wan2.2 720p on an H200, 2026-12-04) and hand the rotated
copies to attention, whose quantization then reads them once more. Given the tables instead, the
FP8 path rotates each row as its quantization loads it (``kernels.quantize._rope_pairs``):
nothing rotated is written or read back.

Two arithmetics, each diffusers' own, so that the FP8 path quantizes bitwise the tensors
diffusers would have passed (every other path, SDPA and the per-tensor recipe, gets them from
:func:`apply_rope`):

- ``style="wan"`` (``WanAttnProcessor``): channels (2i, 2i + 1) turn by ``cos[..., 2i]`` and
  ``sin[..., 2i + 1]``, products and sums in the tables' precision (fp32 tables promote bf16
  inputs; tables in the input's dtype round every op to it), the result rounded to the input's
  dtype. A bare ``(cos, sin)`` pair means this style.
- ``style="apply_rotary_emb"`` (``diffusers.models.embeddings.apply_rotary_emb`` with
  ``use_real=True, use_real_unbind_dim=-1``: HunyuanVideo 1.0 / 1.5, CogVideoX, Flux): output
  2i reads ``cos[2i]``, ``sin[2i]``, output 2i + 1 ``cos[2i + 1]``, ``sin[2i + 1]``; fp32 math
  whatever the tables' dtype, rounded once to the input's dtype.

``start``: the tables' first row turns token ``start``; tokens outside ``[start, start + rows)``
keep their values (CogVideoX puts its text tokens before the video tokens, HunyuanVideo after).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

STYLES = ("wan", "apply_rotary_emb")


class Rotary(NamedTuple):
    """A rotary position embedding for :func:`fp8dit.attention` (module docstring).

    cos, sin : Tensor
        ``[rows, D]`` tables (or diffusers' ``[1, rows, 1, D]``); row r turns token
        ``start + r``.
    start : int
        The first token turned; the others keep their values.
    style : {"wan", "apply_rotary_emb"}
        Whose arithmetic (module docstring).
    """

    cos: torch.Tensor
    sin: torch.Tensor
    start: int = 0
    style: str = "wan"


def _shape(t) -> str:
    return "x".join(map(str, t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def check_rotary(rotary, q: torch.Tensor, Sq: int, Sk: int, D: int) -> Rotary | None:
    """``rotary`` validated: None, or a :class:`Rotary` with ``[rows, D]`` views of its
    tables (a bare ``(cos, sin)`` pair: ``Rotary(cos, sin)``)."""
    if rotary is None:
        return None
    if not isinstance(rotary, Rotary):
        if not isinstance(rotary, (tuple, list)) or len(rotary) != 2 or not all(
                isinstance(t, torch.Tensor) for t in rotary):
            raise TypeError("rotary: expected None, a (cos, sin) pair of tensors or an "
                            f"fp8dit.Rotary, got {type(rotary).__name__}")
        rotary = Rotary(*rotary)
    elif not all(isinstance(t, torch.Tensor) for t in rotary[:2]):
        raise TypeError(f"rotary: expected cos and sin tensors, got "
                        f"{type(rotary.cos).__name__} and {type(rotary.sin).__name__}")
    if rotary.style not in STYLES:
        raise ValueError(f"rotary style: expected one of {', '.join(STYLES)}, got "
                         f"{rotary.style!r}")
    start = rotary.start
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < Sq:
        raise ValueError(f"rotary start: expected an int in [0, {Sq}) (the first token "
                         f"turned), got {start!r}")
    if Sq != Sk:
        raise ValueError(f"rotary: expected q and k of one length (self-attention), got "
                         f"{Sq} queries and {Sk} keys")
    if D % 2:
        raise ValueError(f"rotary: expected an even head dim (channels turn in pairs), got {D}")
    wan = rotary.style == "wan"
    out = []
    for name, t in zip(("cos", "sin"), rotary[:2]):
        if wan and t.dtype not in (torch.float32, q.dtype):
            raise TypeError(f"rotary {name}: expected float32 or q's dtype {q.dtype}, got "
                            f"{t.dtype}")
        if not wan and t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"rotary {name}: expected float32, float16 or bfloat16, got "
                            f"{t.dtype}")
        if t.device != q.device:
            raise ValueError(f"rotary {name}: expected a tensor on q's device {q.device}, got "
                             f"{t.device}")
        rows = t.numel() // D if t.dim() >= 2 and t.shape[-1] == D else 0
        if out:  # sin: as many rows as cos
            if rows * D != t.numel() or rows != out[0].shape[0]:
                raise ValueError(f"rotary sin: expected {out[0].shape[0]} rows of {D} channels "
                                 f"(as cos), got shape {_shape(t)}")
        elif rows * D != t.numel() or not 0 < rows <= Sq - start:
            raise ValueError(f"rotary cos: expected 1 to {Sq - start} rows of {D} channels "
                             f"([rows, D], or diffusers' [1, rows, 1, D]) from token {start} of "
                             f"{Sq}, got shape {_shape(t)}")
        out.append(t.reshape(rows, D))
    if out[0].dtype != out[1].dtype:
        raise TypeError(f"rotary: expected cos and sin of one dtype, got {out[0].dtype} and "
                        f"{out[1].dtype}")
    return Rotary(out[0], out[1], start, rotary.style)


def fused_rotary(q: torch.Tensor, rotary: Rotary, recipe) -> bool:
    """Whether the FP8 path's quantization rotates q and k itself for ``recipe``: not with
    tensor-wide scales (their amax pass reads q and k unrotated); in the Wan style only for
    fp32 tables (rounded once to q's dtype) or bf16 tables with bf16 q and k (each op rounded
    to bf16: ``kernels.common.rotate_pair_bf16``); the
    ``apply_rotary_emb`` style always (fp32 math). Otherwise :func:`apply_rope` rotates them
    first."""
    return recipe.scales != "tensor" and (rotary.style == "apply_rotary_emb"
                                          or rotary.cos.dtype == torch.float32
                                          or q.dtype == torch.bfloat16)


def rope_tables(rotary: Rotary) -> torch.Tensor:
    """The ``[2, rows, W]`` table the kernels read, only what the rotation uses. Wan
    (``W = D / 2``): ``cos[:, 0::2]`` and ``sin[:, 1::2]``; output 2i is ``x[2i] * T[0][i] -
    x[2i + 1] * T[1][i]``, output 2i + 1 is ``x[2i] * T[1][i] + x[2i + 1] * T[0][i]``.
    ``apply_rotary_emb`` (``W = D``): the whole cos and sin rows, as the kernels load x (its
    four columns per pair as two half-width tables each would be a layout conversion per
    load); output 2i is ``x[2i] * cos[2i] - x[2i + 1] * sin[2i]``, output 2i + 1 is ``x[2i] *
    sin[2i + 1] + x[2i + 1] * cos[2i + 1]``."""
    cos, sin = rotary.cos, rotary.sin
    if rotary.style == "wan":
        return torch.stack((cos[:, 0::2], sin[:, 1::2]))
    return torch.stack((cos, sin))


def apply_rope(x: torch.Tensor, tables: torch.Tensor, start: int = 0,
               layout: str = "NHD") -> torch.Tensor:
    """``x`` (``[B, S, H, D]``, or ``[B, H, S, D]`` with ``layout="HND"``) with tokens
    ``start .. start + rows`` rotated by :func:`rope_tables` ``tables``, in the arithmetic of
    their style (module docstring; whole rows, ``W = D``, are ``apply_rotary_emb``'s); a new
    tensor."""
    _, n, w = tables.shape
    seq = 1 if layout == "NHD" else 2
    shape = (1, n, 1, w) if layout == "NHD" else (1, 1, n, w)
    cos, sin = (tables[i].view(shape) for i in range(2))
    xe, xo = x.narrow(seq, start, n).unflatten(-1, (-1, 2)).unbind(-1)
    out = torch.empty_like(x) if start == 0 and n == x.shape[seq] else x.clone()
    rot = out.narrow(seq, start, n)
    if w == x.shape[-1]:  # apply_rotary_emb: x.float() * cos + rotated(x).float() * sin, fp32
        xe, xo, cos, sin = xe.float(), xo.float(), cos.float(), sin.float()
        rot[..., 0::2] = xe * cos[..., 0::2] - xo * sin[..., 0::2]
        rot[..., 1::2] = xe * sin[..., 1::2] + xo * cos[..., 1::2]
    else:
        rot[..., 0::2] = xe * cos - xo * sin
        rot[..., 1::2] = xe * sin + xo * cos
    return out


def rotate_first(q: torch.Tensor, k: torch.Tensor, tables: torch.Tensor, start: int = 0,
                 layout: str = "NHD") -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` and ``k`` rotated by :func:`rope_tables` ``tables`` in torch (:func:`apply_rope`):
    what every path that does not fuse the rotation runs first."""
    return apply_rope(q, tables, start, layout), apply_rope(k, tables, start, layout)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 layout: str = "NHD", start: int = 0, style: str = "wan") -> torch.Tensor:
    """``x`` rotated by ``[rows, D]`` tables (or diffusers' ``[1, rows, 1, D]``) from token
    ``start`` in ``style``'s arithmetic (module docstring)."""
    D = cos.shape[-1]
    rows = cos.numel() // D
    rot = Rotary(cos.reshape(rows, D), sin.reshape(rows, D), start, style)
    return apply_rope(x, rope_tables(rot), start, layout)
