"""Which backend and which attention kernel a call runs, and why: :func:`choose`.

Each requirement check returns ``None`` when a backend or kernel can run or a reason string
when it cannot (FlashInfer's ``backend_requirement`` idea). ``auto`` takes FP8 where it can
run and measured faster than SDPA (``tuning.crossovers``, on the NVIDIA architectures of
``tuning.measured_archs``; SDPA on the others), logging once why it did not; a
backend asked for by name raises :class:`BackendUnavailableError` with the reason instead. The
FP8 path's kernel (:func:`choose_kernel`) is decided here too, from the same table, and the
plan and the launch take it. Which GPUs can run the FP8 path at all is :mod:`fp8dit.device`'s
answer (NVIDIA sm_89 and newer, AMD gfx942 and gfx950); the Gluon kernel runs on NVIDIA sm_90
only, never on ROCm, whose GPUs read capabilities like 9.0 too.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch

from . import env, tuning
from .device import fp8_unsupported_reason as device_fp8_unsupported_reason
from .device import is_hip, nvidia_arch, target_of
from .plan import MAX_HEAD_DIM, padded_head_dim
from .recipes import Recipe, get_recipe

logger = logging.getLogger("fp8dit")

FP8_INPUT_DTYPES = (torch.bfloat16, torch.float16)


class BackendUnavailableError(RuntimeError):
    """A backend requested by name cannot run these inputs; the message says why."""


class Choice(NamedTuple):
    """What a call runs: the backend (``"fp8"`` or ``"sdpa"``), the FP8 path's attention
    kernel (``"gluon-ws"`` or ``"triton"``; None on SDPA), and why."""

    backend: str
    kernel: str | None
    reason: str


# Plain dict rather than functools.lru_cache: torch.compile traces through this module, and
# dynamo ignores lru_cache wrappers (with a warning) but handles dict look-ups.
_CAPABILITY: dict[int, tuple[int, int]] = {}


def _capability(index: int) -> tuple[int, int]:
    cap = _CAPABILITY.get(index)
    if cap is None:
        cap = _CAPABILITY[index] = tuple(torch.cuda.get_device_capability(index))
    return cap


def _device_capability(device: torch.device) -> tuple[int, int]:
    return _capability(device.index if device.index is not None
                       else torch.cuda.current_device())


def nvidia_arch_of(device: torch.device) -> str:
    """An NVIDIA GPU's architecture name (``"sm_89"``), from its cached capability."""
    return nvidia_arch(_device_capability(device))


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
    # NVIDIA sm_89 and newer, AMD gfx942 and gfx950 (fp8dit.device)
    why = device_fp8_unsupported_reason(q.device, _device_capability)
    if why is not None:
        return why
    if q.dtype not in FP8_INPUT_DTYPES:
        return f"dtype {q.dtype} is not supported (FP8 path takes bfloat16 or float16)"
    D = q.shape[-1]
    if D > MAX_HEAD_DIM:
        return f"head_dim {D} is over {MAX_HEAD_DIM}"
    if q.requires_grad or k.requires_grad or v.requires_grad:
        return "inputs require grad; the FP8 path is forward-only (inference)"
    return None


def effective_tokens(q_lens, k_lens) -> float:
    """2 * sum(Sq * Sk) / sum(Sq + Sk): attention work per quantized token, scaled so that a
    self-attention of length S gives S (cross-attention to 512 keys gives about 1,000)."""
    num = sum(int(a) * int(b) for a, b in zip(q_lens, k_lens))
    den = sum(int(a) + int(b) for a, b in zip(q_lens, k_lens))
    return 2.0 * num / den if den else 0.0


# Triton's release as "major.minor", read once. A dict, not functools.cache: choose() runs in
# code that torch.compile traces, and dynamo does not trace through cache wrappers.
_TRITON_RELEASE: dict[str, str] = {}


def triton_release() -> str:
    if "v" not in _TRITON_RELEASE:
        import triton

        _TRITON_RELEASE["v"] = ".".join(triton.__version__.split(".")[:2])
    return _TRITON_RELEASE["v"]


def _gluon_ws_unfit(dp: int, recipe: Recipe, device: torch.device) -> str | None:
    """Why the warp-specialized Gluon kernel cannot run a call (None: it can)."""
    if device.type != "cuda" or env.triton_interpret():
        return "the Gluon kernel needs a GPU (Triton's interpreter cannot run it)"
    if is_hip():  # an AMD GPU, whatever its capability reads (gfx90a: 9.0)
        return (f"the Gluon kernel is written for NVIDIA sm_90, this GPU is AMD "
                f"{target_of(device).arch}")
    cap = _device_capability(device)
    if cap != (9, 0):
        return f"the Gluon kernel is written for sm_90, this GPU is sm_{cap[0]}{cap[1]}"
    if recipe.qk != "int8" or recipe.qk_terms != 1 or recipe.pv != "fp8":
        return f"the Gluon kernel runs one int8 QK dot and fp8 PV, recipe {recipe.name!r} not"
    if dp not in tuning.current().gluon_tiles:
        return f"the Gluon kernel has no tiles for head dims padded to {dp}"
    return None


def choose_kernel(head_dim: int, max_k_len: int, is_causal: bool, recipe: Recipe | None,
                  device: torch.device) -> tuple[str, str]:
    """(kernel, reason): the attention kernel an FP8 call runs, ``"gluon-ws"`` or ``"triton"``.

    ``FP8DIT_KERNEL`` when it names one (``gluon-ws`` falls back to the Triton kernel where it
    cannot run). ``auto``: the warp-specialized Gluon kernel on sm_90, for non-causal calls
    with the one-term int8-QK / fp8-PV recipes whose longest key sequence reaches its
    ``tuning.Crossover.gluon_ws``, on a Triton release in ``tuning.gluon_releases``; the
    Triton kernel everywhere else. The plan and the launch take this choice.
    """
    named = env.attention_kernel()
    if named == "triton":
        return "triton", "FP8DIT_KERNEL=triton"
    recipe = recipe if recipe is not None else get_recipe(None)
    dp = padded_head_dim(head_dim)
    unfit = _gluon_ws_unfit(dp, recipe, device)
    if named == "gluon-ws":
        if unfit:
            return "triton", f"FP8DIT_KERNEL=gluon-ws, but {unfit}: the Triton kernel"
        return "gluon-ws", "FP8DIT_KERNEL=gluon-ws"
    if unfit:
        return "triton", unfit
    if is_causal:
        return "triton", "causal calls run the Triton kernel (the Gluon one is not measured)"
    tuned = tuning.current()
    release = next((r for r in tuned.gluon_releases if r.triton == triton_release()), None)
    if release is None:
        return "triton", (f"the Gluon kernel is verified on Triton "
                          f"{', '.join(r.triton for r in tuned.gluon_releases) or 'no release'}, "
                          f"not {triton_release()}")
    floor = tuned.crossovers[dp].gluon_ws
    if floor is None or max_k_len < floor:
        return "triton", (f"{max_k_len} keys: the Gluon kernel measured faster from {floor} "
                          f"at head_dim <= {dp}")
    built = ("; built from triton 3.6's PTX, fp8dit.prebuilt"
             if any(r.triton == release.triton for r in tuned.prebuilt_releases)
             and env.prebuilt_enabled() else "")
    return "gluon-ws", (f"warp-specialized Gluon kernel: faster from {floor} keys at head_dim "
                        f"<= {dp} (verified with Triton {release.triton} on an {release.gpu}, "
                        f"{release.date}{built})")


def unmeasured_arch_reason(arch: str) -> str | None:
    """Why ``auto`` runs SDPA on an NVIDIA architecture where FP8 was never timed (None: it
    was, ``tuning.measured_archs``). One line, the same for every call on the GPU, so it is
    logged once."""
    tuned = tuning.current()
    if arch in tuned.measured_archs:
        return None
    timed = "; ".join(f"{a} ({m.gpus}, {m.date})" for a, m in tuned.measured_archs.items())
    if arch in tuned.nvidia_tiles:
        return (f"FP8 compiled and checked for {arch} but never timed there (timed on "
                f"{timed or 'no GPU'}); backend='fp8' runs it")
    return (f"FP8 neither compiled nor timed for {arch} (timed on {timed or 'no GPU'}); "
            "backend='fp8' runs it with sm_90's tiles")


def fp8_not_preferred_reason(q, kernel: str, tokens: float) -> str | None:
    """For ``backend="auto"``: why SDPA is preferred although FP8 can run (measured faster
    there, ``tuning.crossovers``; on an NVIDIA architecture where nothing was timed, always,
    :func:`unmeasured_arch_reason`), else None. CPU (interpreter) calls are never
    redirected."""
    if q.device.type != "cuda":
        return None
    if not is_hip():
        unmeasured = unmeasured_arch_reason(nvidia_arch_of(q.device))
        if unmeasured is not None:
            return unmeasured
    dp = padded_head_dim(q.shape[-1])
    cross = tuning.current().crossovers[dp]
    floor = cross.gluon_ws if kernel == "gluon-ws" else cross.triton
    # AMD GPUs take the H200's crossovers until they are measured there (docs/amd.md)
    amd = " (taken on AMD too, where it is not yet measured)" if is_hip() else ""
    if floor is None:
        return (f"head_dim {q.shape[-1]} runs in {dp}-wide tiles, where FP8 measured slower "
                f"than SDPA cuDNN ({cross.measured}){amd}; backend='fp8' still runs it")
    if tokens < floor:
        return (f"sequence too short for FP8 to pay: {tokens:.0f} effective tokens, under the "
                f"{floor} where the {kernel} kernel measured faster than SDPA cuDNN on an H200 "
                f"at head_dim <= {dp}{amd}; backend='fp8' still runs it")
    return None


BACKENDS = {
    "fp8": "fp8dit persistent kernel: INT8/FP8 QK, FP8 PV",
    "sdpa": "torch scaled_dot_product_attention in the input dtype",
}


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


def choose(backend: str, q, k, v, *, is_causal: bool, q_lens, k_lens,
           recipe: Recipe | None = None) -> Choice:
    """The one place a call's backend and attention kernel are decided.

    ``backend``: ``auto`` (``FP8DIT_BACKEND``, else FP8 where it runs and measured faster,
    SDPA otherwise, logging once why), ``fp8`` (raises :class:`BackendUnavailableError` when it
    cannot run) or ``sdpa``. ``q_lens`` / ``k_lens``: the sequences' lengths; ``auto`` prefers
    SDPA below the chosen kernel's measured crossover (:func:`effective_tokens`). ``recipe``:
    the call's (None: the default). The FP8 path's kernel comes from :func:`choose_kernel`.
    """
    if backend == "auto":
        backend = env.default_backend()
    if backend not in ("auto", *BACKENDS):
        raise ValueError(f"backend: expected one of auto, {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "sdpa":
        return Choice("sdpa", None, f"requested: {BACKENDS['sdpa']}")
    why_not = fp8_unsupported_reason(q, k, v, is_causal)
    if why_not is not None:
        if backend == "fp8":
            raise BackendUnavailableError(f"backend='fp8' cannot run these inputs: {why_not}")
        return _fall_back(f"fp8 unavailable: {why_not}")
    max_k_len = 0
    for n in k_lens:  # not max(generator, default=0): dynamo before torch 2.14 cannot trace it
        max_k_len = max(max_k_len, int(n))
    kernel, why_kernel = choose_kernel(q.shape[-1], max_k_len, is_causal, recipe, q.device)
    if backend == "fp8":
        return Choice("fp8", kernel, f"requested: {BACKENDS['fp8']}; {kernel} kernel: "
                      f"{why_kernel}")
    slower = fp8_not_preferred_reason(q, kernel, effective_tokens(q_lens, k_lens))
    if slower is not None:
        return _fall_back(f"fp8 unavailable: {slower}")
    return Choice("fp8", kernel, f"auto: {BACKENDS['fp8']}; {kernel} kernel: {why_kernel}")


def _fall_back(why: str) -> Choice:
    _log_once(f"fp8dit: falling back to sdpa: {why}")
    return Choice("sdpa", None, f"auto: {BACKENDS['sdpa']} ({why})")
