"""Pay the first call's cost before the first denoising step: ``fp8dit.warmup``.

The first FP8 call of a shape compiles the kernels it launches (Triton specializes them on the
call's sizes) and builds its plan: seconds on a GPU (the warp-specialized kernel alone takes
most of them, docs/triton_releases.md), inside the first denoising step unless it was paid
before. ``warmup`` makes one call per shape on random inputs, so that the same process's later
calls find the compiled kernels and the cached plan, and later processes find the kernels in
Triton's on-disk cache (``TRITON_CACHE_DIR``, by default ``~/.triton/cache``).

Example
-------
>>> import fp8dit
>>> for r in fp8dit.warmup([(1, 40, 75600, 128)], rotary="wan"):  # Wan2.2 720p
...     print(r)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from . import dispatch
from .api import attention, check_recipe
from .rope import STYLES, Rotary

__all__ = ["WarmupReport", "warmup"]


@dataclass(frozen=True)
class WarmupReport:
    """What one warm-up call ran and what it cost.

    ``first_s``: the first call (compilation, plan, launch); ``second_s``: the same call again,
    what a denoising step pays per call from then on."""

    shape: tuple[int, int, int, int]  # (B, H, S, D)
    backend: str  # "fp8" or "sdpa"
    reason: str
    first_s: float
    second_s: float

    def __str__(self) -> str:
        B, H, S, D = self.shape
        return (f"B{B} H{H} S{S} D{D}: {self.backend}, first call {self.first_s:.2f} s, "
                f"then {self.second_s * 1e3:.2f} ms ({self.reason})")


def _check_shape(shape) -> tuple[int, int, int, int]:
    try:
        dims = tuple(int(x) for x in shape)
    except (TypeError, ValueError):
        dims = ()
    if len(dims) != 4 or min(dims) < 1 or any(float(x) != int(x) for x in shape):
        raise ValueError(f"shapes: expected (B, H, S, D) tuples of positive integers, got "
                         f"{shape!r}")
    return dims


def _tables(style: str, S: int, D: int, device) -> Rotary:
    """Rotary tables of the kind ``style`` names, for the warm-up call: the kernels compiled
    depend on the style and the tables' dtype (fp32, as diffusers builds them), not their
    values."""
    pos = torch.arange(S, device=device, dtype=torch.float32)[:, None]
    freq = torch.arange(D, device=device, dtype=torch.float32)[None, :] / D
    angle = pos * torch.pow(10000.0, -freq)
    return Rotary(angle.cos(), angle.sin(), 0, style)


def _timed(fn) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _warm_one(dims, dtype, layout, is_causal, recipe, rotary, backend, device) -> WarmupReport:
    """One shape's two calls; the inputs are freed on return."""
    B, H, S, D = dims
    g = torch.Generator(device=device).manual_seed(0)
    size = (B, S, H, D) if layout == "NHD" else (B, H, S, D)
    q, k, v = (torch.randn(size, generator=g, device=device, dtype=dtype) for _ in range(3))
    tables = _tables(rotary, S, D, device) if rotary else None

    def call():
        attention(q, k, v, layout=layout, is_causal=is_causal, recipe=recipe, backend=backend,
                  rotary=tables)

    choice = dispatch.choose(backend, q, k, v, is_causal=is_causal, q_lens=[S] * B,
                             k_lens=[S] * B, recipe=check_recipe(recipe))
    first = _timed(call)
    return WarmupReport(dims, choice.backend, choice.reason, first, _timed(call))


def warmup(shapes: Iterable, *, dtype: torch.dtype = torch.bfloat16, layout: str = "NHD",
           is_causal: bool = False, recipe: str | None = None, rotary: str | None = None,
           backend: str = "auto", device=None,
           progress: Callable[[WarmupReport], None] | None = None) -> list[WarmupReport]:
    """Run one :func:`fp8dit.attention` call per shape, twice, on random inputs.

    Parameters
    ----------
    shapes : iterable of (B, H, S, D)
        Self-attention problems (``Sq == Sk``) as the model will call them: the kernels are
        compiled for these sizes (a shape with other sizes may compile again).
    dtype, layout, is_causal, recipe, backend
        As the model's calls pass them to :func:`fp8dit.attention`.
    rotary : {None, "wan", "apply_rotary_emb"}
        The style of rotary tables the model's calls pass (``fp8dit.enable`` hands Wan's,
        HunyuanVideo's and CogVideoX's to fp8dit): those calls launch quantization kernels
        that rotate as they read.
    device : torch.device or str, optional
        Default: the current CUDA device, else the CPU (where the kernels run through
        Triton's interpreter, ``TRITON_INTERPRET=1``, and nothing is compiled).
    progress : callable, optional
        Called with each shape's :class:`WarmupReport` as it completes.

    Returns
    -------
    list of WarmupReport, one per shape, in order.
    """
    if rotary is not None and rotary not in STYLES:
        raise ValueError(f"rotary: expected None or one of {STYLES}, got {rotary!r}")
    if layout not in ("NHD", "HND"):
        raise ValueError(f"layout: expected 'NHD' or 'HND', got {layout!r}")
    dims = [_check_shape(s) for s in shapes]
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    reports = []
    for dims_ in dims:
        report = _warm_one(dims_, dtype, layout, is_causal, recipe, rotary, backend, device)
        reports.append(report)
        if progress is not None:
            progress(report)
    return reports
