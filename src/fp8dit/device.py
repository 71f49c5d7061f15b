"""What a tensor's device is and what the FP8 path can do on it.

The rest of the package asks here instead of reading capabilities itself:

==========  ======================  ====================  =======================================
vendor      architecture            FP8 format            status
==========  ======================  ====================  =======================================
NVIDIA      sm_90 (H100, H200)      OCP e4m3 (e4m3fn)     run and measured (H100, H200)
NVIDIA      sm_89, sm_100, sm_120   OCP e4m3 (e4m3fn)     compiled and checked, not yet run
NVIDIA      other, 8.9 or newer     OCP e4m3 (e4m3fn)     neither compiled nor run
AMD         gfx942 (MI300X/MI325X)  e4m3fnuz              compiled and checked, not yet run
AMD         gfx950 (MI350X/MI355X)  OCP e4m3 (e4m3fn)     compiled and checked, not yet run
==========  ======================  ====================  =======================================

Other GPUs (NVIDIA before sm_89, AMD gfx90a, RDNA) have no FP8 matrix instructions the
kernels use: :func:`fp8_unsupported_reason` says so and ``auto`` runs SDPA there (docs/amd.md).
On an NVIDIA architecture where nothing was timed ``auto`` runs SDPA too
(:func:`fp8dit.dispatch.fp8_not_preferred_reason`, docs/gpus.md).

ROCm builds of torch report AMD GPUs as ``device.type == "cuda"``; ``torch.version.hip`` tells
them apart (:func:`is_hip`), and their "compute capability" is the gfx number (gfx90a reads
(9, 0), like Hopper): nothing here compares capabilities on AMD.

**The fnuz format.** gfx942's matrix cores and conversions take float8_e4m3fnuz (exponent bias
8, no infinities, no negative zero, one NaN 0x80, largest value 240), not the OCP e4m3fn of
NVIDIA and gfx950 (bias 7, largest 448). Every OCP e4m3fn value x is the fnuz value x / 2, with
the same bits when positive (OCP's 448 is fnuz's 224; fnuz's 240 has no OCP counterpart). So
the FP8 path maps scales to 224 instead of 448 and P to [0, 2^7] instead of [0, 2^8] in fnuz
(:data:`E4M3FNUZ`): every fp8 code is the OCP path's halved, every scale doubled, and the
outputs are the OCP path's wherever the arithmetic is the same (tests/test_fnuz.py). One code
of 127 (240) goes unused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import env


@dataclass(frozen=True)
class Fp8Format:
    """An fp8 e4m3 format as the kernels use it.

    ``scale_max``: what a quantization scale maps a block's largest magnitude to (the kernels'
    ``FP8_MAX``); ``p_shift``: P = exp2(s - m + p_shift) lies in [0, 2^p_shift] (the attention
    kernel's ``P_SHIFT``), within ``scale_max``.
    """

    name: str
    dtype: torch.dtype
    max: float  # largest finite value
    scale_max: float
    p_shift: float
    fnuz: bool

    def constexprs(self) -> dict:
        """The format's constants as the quantization kernels take them."""
        return dict(FP8_MAX=self.scale_max, FP8_FNUZ=self.fnuz)


E4M3FN = Fp8Format("e4m3fn", torch.float8_e4m3fn, 448.0, 448.0, 8.0, False)
# the OCP format halved (module docstring)
E4M3FNUZ = Fp8Format("e4m3fnuz", torch.float8_e4m3fnuz, 240.0, 224.0, 7.0, True)

# NVIDIA compute capability with FP8 tensor cores (Ada 8.9, Hopper 9.0 and newer).
NVIDIA_FP8_MIN_CAPABILITY = (8, 9)
# NVIDIA architectures with tiles of their own (tuning.nvidia_tiles), compiled and checked
# without the hardware (tests/test_nvidia_compile.py); sm_90 runs tuning.tiles.
NVIDIA_CHECKED_ARCHS = ("sm_89", "sm_100", "sm_120")
NVIDIA_NAMES = {"sm_89": "L40S, RTX 4090", "sm_90": "H100, H200", "sm_100": "B200",
                "sm_120": "RTX 5090, RTX PRO 6000"}
# AMD architectures the kernels are compiled and checked for (tests/test_hip_compile.py), and
# their fp8 format.
AMD_FP8_ARCHS = {"gfx942": E4M3FNUZ, "gfx950": E4M3FN}
AMD_NAMES = {"gfx942": "MI300X/MI325X", "gfx950": "MI350X/MI355X"}
# LDS (shared memory) per CU, bytes: what one program may hold
AMD_LDS_BYTES = {"gfx942": 65536, "gfx950": 163840}
# Shared memory one program may hold on sm_90 (H100, H200): 227 KB
NVIDIA_SHARED_BYTES = {"sm_90": 232448}


@dataclass(frozen=True)
class Target:
    """What the kernels are compiled for on a device.

    ``hip``: an AMD GPU through ROCm (or the interpreter standing in for one,
    :func:`interpret_as`): 64-wide wavefronts (``num_warps`` counts them), HIP launch options
    (``waves_per_eu``, no ``maxnreg``), no inline PTX. ``fp8``: the format of its FP8 matrix
    instructions, None where it has none.
    """

    # "nvidia" (a GPU: its capability names the architecture), "gfx942", "gfx950", other gfx
    # names, "interpreter", or an NVIDIA architecture the interpreter stands in for ("sm_89")
    arch: str
    hip: bool
    fp8: Fp8Format | None
    warp_size: int
    interpreted: bool = False
    lds_bytes: int | None = None  # shared memory one program may hold (AMD; None: not checked)

    @property
    def max_warps(self) -> int:
        """Warps (wavefronts) one program may have: 1,024 threads."""
        return 1024 // self.warp_size


# Every NVIDIA GPU the kernels run on: one format and warp size (which of them has FP8 tensor
# cores is the capability's business, fp8_unsupported_reason).
NVIDIA = Target("nvidia", hip=False, fp8=E4M3FN, warp_size=32)
INTERPRETER = Target("interpreter", hip=False, fp8=E4M3FN, warp_size=32, interpreted=True)

# Plain dicts rather than functools caches: torch.compile traces the dispatcher, and dynamo
# handles dict look-ups but not cache wrappers (as dispatch._CAPABILITY).
_AMD_TARGETS: dict[int, Target] = {}
_INTERPRET_AS: dict[str, Target] = {}


def is_hip() -> bool:
    """True under a ROCm build of torch (whose AMD GPUs are ``"cuda"`` devices)."""
    return torch.version.hip is not None


def amd_target(arch: str, interpreted: bool = False) -> Target:
    """An AMD architecture's target (``gfx942``: fnuz; architectures without the kernels'
    FP8 matrix instructions: ``fp8`` None)."""
    return Target(arch, hip=True, fp8=AMD_FP8_ARCHS.get(arch), warp_size=64,
                  interpreted=interpreted, lds_bytes=AMD_LDS_BYTES.get(arch))


def nvidia_arch(capability: tuple[int, int]) -> str:
    """An NVIDIA compute capability as the architecture name tables are keyed by: (8, 9) ->
    ``"sm_89"``, (10, 0) -> ``"sm_100"`` (compiled for as sm_100a)."""
    return f"sm_{capability[0]}{capability[1]}"


def _gpu_index(dev: torch.device) -> int:
    return dev.index if dev.index is not None else torch.cuda.current_device()


def target_of(dev: torch.device) -> Target:
    """The target of a tensor's device: an AMD GPU's architecture under ROCm, :data:`NVIDIA`
    for other GPUs, the interpreter's for CPU tensors (an NVIDIA-like one with OCP e4m3, unless
    :func:`interpret_as` says otherwise)."""
    if dev.type != "cuda":
        return _INTERPRET_AS.get("target", INTERPRETER)
    if not is_hip():
        return NVIDIA
    index = _gpu_index(dev)
    tgt = _AMD_TARGETS.get(index)
    if tgt is None:
        # "gfx942:sramecc+:xnack-": the architecture before the feature flags
        arch = torch.cuda.get_device_properties(index).gcnArchName.split(":")[0]
        tgt = _AMD_TARGETS[index] = amd_target(arch)
    return tgt


@contextlib.contextmanager
def interpret_as(arch: str):
    """Run CPU tensors (Triton's interpreter) as ``arch`` would run: an AMD architecture's
    FP8 format, tiles and launch options (``gfx942``: the fnuz format), or an NVIDIA one's
    tiles (:data:`NVIDIA_CHECKED_ARCHS`), so the CPU tests cover them. The interpreter's own
    arithmetic is unchanged. For tests; not thread-safe."""
    if arch.startswith("sm_"):
        if arch not in NVIDIA_CHECKED_ARCHS:
            raise ValueError(f"arch: expected one of {', '.join(NVIDIA_CHECKED_ARCHS)}, "
                             f"got {arch!r}")
        tgt = Target(arch, hip=False, fp8=E4M3FN, warp_size=32, interpreted=True)
    elif arch not in AMD_FP8_ARCHS:
        raise ValueError(f"arch: expected one of {', '.join(AMD_FP8_ARCHS)}, got {arch!r}")
    else:
        tgt = amd_target(arch, interpreted=True)
    old = _INTERPRET_AS.get("target")
    _INTERPRET_AS["target"] = tgt
    try:
        yield _INTERPRET_AS["target"]
    finally:
        if old is None:
            _INTERPRET_AS.pop("target", None)
        else:
            _INTERPRET_AS["target"] = old


def fp8_unsupported_reason(dev: torch.device,
                           capability: Callable[[torch.device], tuple[int, int]]) -> str | None:
    """Why the FP8 kernels cannot run on ``dev`` (None: they can). ``capability``: an NVIDIA
    GPU's compute capability (``fp8dit.dispatch`` passes its cached read); never asked on
    ROCm, where the capability is the gfx number."""
    if dev.type == "cpu":
        if not env.triton_interpret():
            return "CPU tensors need TRITON_INTERPRET=1 to run the Triton kernels (interpreter)"
        return None
    if dev.type != "cuda":
        return f"device type {dev.type!r} is not supported by the FP8 kernels"
    if is_hip():
        tgt = target_of(dev)
        if tgt.fp8 is None:
            known = ", ".join(f"{a} ({AMD_NAMES[a]})" for a in AMD_FP8_ARCHS)
            return (f"AMD {tgt.arch}: the FP8 kernels are built for {known} only "
                    "(FP8 matrix instructions)")
        return None
    cap = capability(dev)
    if cap < NVIDIA_FP8_MIN_CAPABILITY:
        need = NVIDIA_FP8_MIN_CAPABILITY
        return (f"GPU compute capability {cap[0]}.{cap[1]} has no FP8 tensor cores "
                f"(needs {need[0]}.{need[1]} or newer)")
    return None


def fp8_format(dev: torch.device) -> Fp8Format:
    """The fp8 format the kernels store and multiply on ``dev`` (raises where there is none)."""
    tgt = target_of(dev)
    if tgt.fp8 is None:
        known = ", ".join(AMD_FP8_ARCHS)
        raise ValueError(f"device {dev}: AMD {tgt.arch} has no FP8 format the kernels use "
                         f"(built for {known})")
    return tgt.fp8
