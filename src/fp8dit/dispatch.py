"""Backends as data: name -> (requirements check, implementation), and the auto fallback.

Each requirement check returns ``None`` when the backend can run or a reason string when it
cannot (FlashInfer's ``backend_requirement`` idea). ``auto`` walks the preference list and
takes the first backend that can run, logging once why a preferred one was skipped; a backend
asked for by name raises :class:`BackendUnavailableError` with the reason instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import device, env
from .plan import MAX_HEAD_DIM, padded_head_dim

logger = logging.getLogger("fp8dit")

FP8_INPUT_DTYPES = (torch.bfloat16, torch.float16)


class BackendUnavailableError(RuntimeError):
    """A backend requested by name cannot run these inputs; the message says why."""


@dataclass(frozen=True)
class Backend:
    name: str
    description: str
    check: Callable[..., str | None]  # (q, k, v, is_causal) -> None or reason
    # Only for backend="auto": a reason to prefer the next backend although this one can run
    # (measured slower there). (q, k, v, is_causal, tokens) -> None or reason, where tokens is
    # the call's effective sequence length (see effective_tokens). A backend asked for by name
    # ignores it.
    auto_check: Callable[..., str | None] | None = None


# Plain dict rather than functools.lru_cache: torch.compile traces through this module, and
# dynamo ignores lru_cache wrappers (with a warning) but handles dict look-ups.
_CAPABILITY: dict[int, tuple[int, int]] = {}


def _capability(index: int) -> tuple[int, int]:
    cap = _CAPABILITY.get(index)
    if cap is None:
        cap = _CAPABILITY[index] = tuple(torch.cuda.get_device_capability(index))
    return cap


def _probe_triton() -> str | None:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as e:  # pragma: no cover - depends on the install
        return f"triton is not importable ({type(e).__name__}: {e})"
    return None


_TRITON_ERROR = _probe_triton()


def fp8_unsupported_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           is_causal: bool = False) -> str | None:
    if env.fp8_disabled():
        return "FP8DIT_DISABLE=1 is set"
    if _TRITON_ERROR:
        return _TRITON_ERROR
    # the GPU's FP8 support: NVIDIA sm_89 and newer, AMD gfx942 and gfx950 (fp8dit.device)
    reason = device.fp8_unsupported_reason(q.device)
    if reason is not None:
        return reason
    if q.dtype not in FP8_INPUT_DTYPES:
        return f"dtype {q.dtype} is not supported (FP8 path takes bfloat16 or float16)"
    D = q.shape[-1]
    if D > MAX_HEAD_DIM:
        return f"head_dim {D} is over {MAX_HEAD_DIM}"
    if q.requires_grad or k.requires_grad or v.requires_grad:
        return "inputs require grad; the FP8 path is forward-only (inference)"
    return None


# Padded head dims where the FP8 kernel is slower than cuDNN on the GPUs it was measured on
# (H200, 2026-12-02, benchmarks/NOTES.md: D=256 at 0.62x of SDPA cuDNN, best tile config).
FP8_SLOWER_HEAD_DIMS = (256,)
# Below these effective lengths (tokens; key: padded head dim) quantization and launches cost
# more than FP8 saves: measured crossovers against SDPA cuDNN on the H200 (benchmarks/NOTES.md).
# On the warp-specialized kernel (run s14-3, `benchmarks/gpu_crossover.py`, end to end): D=128,
# 24 heads: 0.44x at 4,608 tokens (Flux), 1.36x at 8,192, 1.49x at 16,896; D=64, 48 heads:
# 1.14x at 8,192 and 12,288, 1.28x at 17,776 (CogVideoX). On the Triton kernel, which runs
# where that one does not (causal calls, GPUs other than Hopper, unverified Triton releases):
# D=128 1.08x at 8,192 (1.03x in session 2); D=64 1.00x at 8,192, 0.98x at 12,288, 1.12x at
# 17,776. Cross-attention to short text keys (Wan: 512, ~1,000 effective tokens) lands here.
FP8_MIN_TOKENS = {64: 8192, 128: 8192}
FP8_MIN_TOKENS_TRITON_KERNEL = {64: 17000, 128: 8192}


def _warp_specialized_kernel_likely(q, is_causal: bool) -> bool:
    """Whether ``attend.kernel_for`` will pick the warp-specialized kernel for a dense call:
    its conditions that the call's tensors decide (non-causal, Hopper, a Triton release it was
    verified on, the kernel not forced to another), without its shape and recipe tests."""
    from . import attend

    if is_causal or env.attention_kernel() not in ("auto", "gluon-ws"):
        return False
    return (not device.is_hip() and _capability(q.device.index or 0) == (9, 0)
            and attend.triton_release() in attend.WS_VERIFIED_TRITON)


def effective_tokens(q_lens, k_lens) -> float:
    """2 * sum(Sq * Sk) / sum(Sq + Sk): attention work per quantized token, scaled so that a
    self-attention of length S gives S (cross-attention to 512 keys gives about 1,000)."""
    num = sum(int(a) * int(b) for a, b in zip(q_lens, k_lens))
    den = sum(int(a) + int(b) for a, b in zip(q_lens, k_lens))
    return 2.0 * num / den if den else 0.0


def fp8_not_preferred_reason(q, k, v, is_causal=False, tokens=None) -> str | None:
    if q.device.type != "cuda":
        return None
    dp = padded_head_dim(q.shape[-1])
    if dp in FP8_SLOWER_HEAD_DIMS:
        return (f"head_dim {q.shape[-1]} runs in 256-wide tiles, where the FP8 kernel measured "
                "0.62x the speed of SDPA cuDNN on an H200; backend='fp8' still runs it")
    if tokens is None:
        return None
    floors = (FP8_MIN_TOKENS if _warp_specialized_kernel_likely(q, is_causal)
              else FP8_MIN_TOKENS_TRITON_KERNEL)
    floor = floors.get(dp)
    if floor is not None and tokens < floor:
        return (f"sequence too short for FP8 to pay: {tokens:.0f} effective tokens, under the "
                f"{floor} where it measured faster than SDPA cuDNN on an H200 at head_dim <= "
                f"{dp}; backend='fp8' still runs it")
    return None


def _always(q, k, v, is_causal=False) -> str | None:
    return None


BACKENDS: dict[str, Backend] = {
    "fp8": Backend(
        "fp8",
        "fp8dit persistent kernel: INT8/FP8 QK, FP8 PV",
        fp8_unsupported_reason,
        auto_check=fp8_not_preferred_reason,
    ),
    "sdpa": Backend("sdpa", "torch scaled_dot_product_attention in the input dtype", _always),
}
AUTO_ORDER = ("fp8", "sdpa")

_logged: set[str] = set()


def _log_once(msg: str, logged: set[str] | None = None) -> None:
    """Warn once per message (per ``logged`` set). Not while torch.compile traces: dynamo
    cannot trace a logger call, so one would break the graph (an error under
    ``fullgraph=True``, as the first GPU run of the whole suite found); the first eager call
    that meets the message logs it, and ``select_backend`` / ``record_calls`` say it anyway."""
    if torch.compiler.is_compiling():
        return
    logged = _logged if logged is None else logged
    if msg not in logged:
        logged.add(msg)
        logger.warning(msg)


def resolve(backend: str, q, k, v, is_causal: bool = False,
            tokens: float | None = None) -> tuple[str, str]:
    """(backend name, reason) for a call; raises if a named backend cannot run.

    ``tokens``: the call's effective length (:func:`effective_tokens`), for ``auto``'s
    preferences; None skips the length preference."""
    if backend == "auto":
        backend = env.default_backend()
    if backend == "auto":
        skipped = []
        for name in AUTO_ORDER:
            be = BACKENDS[name]
            reason = be.check(q, k, v, is_causal)
            if reason is None and be.auto_check is not None:
                reason = be.auto_check(q, k, v, is_causal, tokens)
            if reason is None:
                why = f"auto: {BACKENDS[name].description}"
                if skipped:
                    why += " (" + "; ".join(skipped) + ")"
                    _log_once(f"fp8dit: falling back to {name}: " + "; ".join(skipped))
                return name, why
            skipped.append(f"{name} unavailable: {reason}")
        raise BackendUnavailableError("no backend can run these inputs: " + "; ".join(skipped))
    if backend not in BACKENDS:
        raise ValueError(
            f"backend: expected one of auto, {', '.join(BACKENDS)}, got {backend!r}"
        )
    reason = BACKENDS[backend].check(q, k, v, is_causal)
    if reason is not None:
        raise BackendUnavailableError(f"backend={backend!r} cannot run these inputs: {reason}")
    return backend, f"requested: {BACKENDS[backend].description}"
