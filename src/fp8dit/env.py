"""Every ``FP8DIT_*`` environment variable is read here and nowhere else.

=====================  =====================================================================
variable               meaning
=====================  =====================================================================
``FP8DIT_BACKEND``     default backend for ``backend="auto"`` calls: ``auto`` | ``fp8`` | ``sdpa``
``FP8DIT_DISABLE``     ``1`` turns the FP8 path off everywhere (auto always picks ``sdpa``)
``FP8DIT_RECIPE``      default accuracy recipe name (see :mod:`fp8dit.recipes`)
``FP8DIT_PLAN_CACHE``  how many plans the LRU plan cache keeps (default 64)
``FP8DIT_KERNEL``      attention kernel: ``auto`` (default: ``dispatch.choose_kernel``) |
                       ``triton`` | ``gluon-ws`` (the warp-specialized Hopper kernel, sm_90
                       only, kernels/attention_sm90_ws.py) for every call
``FP8DIT_PREBUILT``    ``0`` builds the warp-specialized kernel with the installed Triton's own
                       code generation, never from the PTX shipped in :mod:`fp8dit.prebuilt`
``TRITON_INTERPRET``   ``1`` runs the Triton kernels on CPU tensors through Triton's interpreter
=====================  =====================================================================

Values are read at call time (cheap dictionary look-ups), so tests and users can change them
without re-importing the package.
"""

from __future__ import annotations

import os

BACKENDS = ("auto", "fp8", "sdpa")
_TRUE = {"1", "true", "yes", "on"}


def default_backend() -> str:
    value = os.environ.get("FP8DIT_BACKEND", "auto").strip().lower() or "auto"
    if value not in BACKENDS:
        raise ValueError(
            f"FP8DIT_BACKEND: expected one of {', '.join(BACKENDS)}, got {value!r}"
        )
    return value


def fp8_disabled() -> bool:
    return os.environ.get("FP8DIT_DISABLE", "0").strip().lower() in _TRUE


def default_recipe() -> str | None:
    value = os.environ.get("FP8DIT_RECIPE", "").strip()
    return value or None


def plan_cache_size() -> int:
    raw = os.environ.get("FP8DIT_PLAN_CACHE", "64")
    try:
        size = int(raw)
    except ValueError:
        raise ValueError(f"FP8DIT_PLAN_CACHE: expected an integer, got {raw!r}") from None
    if size < 1:
        raise ValueError(f"FP8DIT_PLAN_CACHE: expected at least 1, got {size}")
    return size


KERNELS = ("auto", "triton", "gluon-ws")


def attention_kernel() -> str:
    """``FP8DIT_KERNEL``: ``auto`` (default: the kernel measured fastest for the call's shape,
    see ``dispatch.choose_kernel``) or one kernel for every call."""
    value = os.environ.get("FP8DIT_KERNEL", "auto").strip().lower() or "auto"
    if value not in KERNELS:
        raise ValueError(f"FP8DIT_KERNEL: expected one of {', '.join(KERNELS)}, got {value!r}")
    return value


def prebuilt_enabled() -> bool:
    """``FP8DIT_PREBUILT``: ``1`` (default) lets the warp-specialized kernel be built from the
    PTX fp8dit ships (:mod:`fp8dit.prebuilt`) on the releases where that was measured faster;
    ``0`` never does."""
    value = os.environ.get("FP8DIT_PREBUILT", "1").strip().lower() or "1"
    if value not in ("0", "1"):
        raise ValueError(f"FP8DIT_PREBUILT: expected 0 or 1, got {value!r}")
    return value == "1"


def triton_interpret() -> bool:
    """True when Triton kernels run through the CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE
