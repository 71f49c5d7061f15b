"""Rotary position embedding applied by fp8dit itself: ``attention(..., rotary=(cos, sin))``.

Wan's diffusers processor rotates q and k with a handful of eager element-wise ops (strided
reads and writes of both tensors: 12.6 ms per layer at Wan2.2 720p on an H200, run s18-5) and
hands the rotated copies to attention, whose quantization then reads them once more. Given the
tables instead, the FP8 path rotates each row as its quantization loads it
(``kernels.quantize._rope_pairs``): nothing rotated is written or read back.

The rotation is diffusers' Wan one, in its arithmetic: channels (2i, 2i + 1) turn by
``cos[..., 2i]`` and ``sin[..., 2i + 1]``, products and sums in the tables' precision (fp32
tables promote bf16 inputs; tables in the input's dtype round every op to it), the result
rounded to the input's dtype. So the FP8 path quantizes bitwise the tensors diffusers would
have passed, and every other path (SDPA, the per-tensor recipe) gets them from
:func:`apply_rotary`.
"""

from __future__ import annotations

import torch


def _shape(t) -> str:
    return "x".join(map(str, t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def check_rotary(rotary, q: torch.Tensor, Sq: int, Sk: int, D: int):
    """``rotary`` validated: None, or ``(cos, sin)`` as two ``[S, D]`` views."""
    if rotary is None:
        return None
    if not isinstance(rotary, (tuple, list)) or len(rotary) != 2 or not all(
            isinstance(t, torch.Tensor) for t in rotary):
        raise TypeError("rotary: expected None or a (cos, sin) pair of tensors, got "
                        f"{type(rotary).__name__}")
    if Sq != Sk:
        raise ValueError(f"rotary: expected q and k of one length (self-attention), got "
                         f"{Sq} queries and {Sk} keys")
    if D % 2:
        raise ValueError(f"rotary: expected an even head dim (channels turn in pairs), got {D}")
    out = []
    for name, t in zip(("cos", "sin"), rotary):
        if t.dtype not in (torch.float32, q.dtype):
            raise TypeError(f"rotary {name}: expected float32 or q's dtype {q.dtype}, got "
                            f"{t.dtype}")
        if t.device != q.device:
            raise ValueError(f"rotary {name}: expected a tensor on q's device {q.device}, got "
                             f"{t.device}")
        if t.dim() < 2 or t.shape[-1] != D or t.numel() != Sq * D:
            raise ValueError(f"rotary {name}: expected {Sq} rows of {D} channels ([S, D], or "
                             f"diffusers' [1, S, 1, D]), got shape {_shape(t)}")
        out.append(t.reshape(Sq, D))
    if out[0].dtype != out[1].dtype:
        raise TypeError(f"rotary: expected cos and sin of one dtype, got {out[0].dtype} and "
                        f"{out[1].dtype}")
    return tuple(out)


def fused_rotary(q: torch.Tensor, cos_sin, recipe) -> bool:
    """Whether the FP8 path's quantization rotates q and k itself for ``recipe``: not with
    tensor-wide scales (their amax pass reads q and k unrotated), and only for fp32 tables
    (rounded once to q's dtype) or bf16 tables with bf16 q and k (each op rounded to bf16, in
    the fp32 bits: ``kernels.common.round_to_bf16_grid``). Otherwise :func:`apply_rotary`
    rotates them first."""
    return recipe.scales != "tensor" and (cos_sin[0].dtype == torch.float32
                                          or q.dtype == torch.bfloat16)


def rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The ``[2, S, D / 2]`` table the kernels read: ``cos[:, 0::2]`` then ``sin[:, 1::2]``,
    the only columns the rotation uses (half the bytes; one pointer)."""
    return torch.stack((cos[:, 0::2], sin[:, 1::2]))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 layout: str = "NHD") -> torch.Tensor:
    """``x`` (``[B, S, H, D]``, or ``[B, H, S, D]`` with ``layout="HND"``) rotated by ``[S, D]``
    tables (or diffusers' ``[1, S, 1, D]``) with diffusers' Wan arithmetic (module docstring)."""
    D = cos.shape[-1]
    S = cos.numel() // D
    shape = (1, S, 1, D) if layout == "NHD" else (1, 1, S, D)
    c = cos.reshape(shape)[..., 0::2]
    s = sin.reshape(shape)[..., 1::2]
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * c - x2 * s
    out[..., 1::2] = x1 * s + x2 * c
    return out
