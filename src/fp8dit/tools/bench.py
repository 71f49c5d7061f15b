"""``fp8dit bench``: fp8dit against SDPA cuDNN / flash and SageAttention, in one process.

Every backend runs on the same fresh random inputs (several sets, rotated between calls so that
L2 does not flatter anyone), is checked against SDPA cuDNN's output (cosine) so a broken backend
shows, and is timed with ``triton.testing.do_bench`` (median). fp8dit is timed three ways:

- ``fp8dit``: ``fp8dit.attention(q, k, v, backend="fp8")``, bf16 in and out, quantization,
  allocation and host work included (what a model sees);
- ``fp8dit-auto``: ``backend="auto"``, what a user gets by default: FP8 where it was measured
  to pay, SDPA otherwise (short sequences, head dim 256; ``fp8dit.dispatch``);
- ``fp8dit-kernel``: only the persistent attention kernel and the split-KV merge, on inputs
  already quantized (``fp8dit.attend.attention_stage``);
- ``fp8dit-quant``: only the quantization kernels (K/V channel statistics, K/V and Q quantize;
  ``fp8dit.quantize.quantize_stage``, workspace allocation included as in a real call).

TFLOPS = 4*B*H*Sq*Sk*D / time. One JSON row per (preset, backend) is merged into
``benchmarks/results/<gpu-name>.json`` (older runs are kept with their dates); the table is
printed last. ``benchmarks/bench_attention.py`` is the stand-alone script around :func:`main`.

Example
-------
$ fp8dit bench --preset flux-1024 --preset wan-480p
$ fp8dit bench --preset all --plot bench.png
$ fp8dit bench --smoke            # no GPU: tiny shape through Triton's CPU interpreter
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import itertools
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .presets import PRESETS, Shape, ShapeError, parse_shape, resolve_shapes

BACKENDS = {
    "fp8dit": "fp8dit.attention(backend='fp8'): bf16 in/out, quantization included",
    "fp8dit-auto": "fp8dit.attention(backend='auto'): FP8 where it pays, else SDPA",
    "fp8dit-kernel": "fp8dit persistent attention kernel + merge only, inputs pre-quantized",
    "fp8dit-quant": "fp8dit quantization kernels only (K/V stats, K/V and Q quantize)",
    "sdpa-cudnn": "torch SDPA, SDPBackend.CUDNN_ATTENTION, bf16",
    "sdpa-flash": "torch SDPA, SDPBackend.FLASH_ATTENTION (FA2), bf16",
    "sageattn": "SageAttention sageattn (int8 QK, fp16 PV, Triton), when importable",
    "cudnn-fp8": "cuDNN FP8 SDPA (frontend), per-tensor scales, quantized with torch ops; "
                 "bf16 in/out",
    "cudnn-fp8-kernel": "cuDNN FP8 SDPA kernel only, inputs pre-quantized, fp8 out",
    "sdpa-math": "torch SDPA, SDPBackend.MATH (the CPU reference of --smoke)",
}
GPU_BACKENDS = ("fp8dit", "fp8dit-auto", "fp8dit-kernel", "fp8dit-quant", "sdpa-cudnn",
                "sdpa-flash", "sageattn", "cudnn-fp8", "cudnn-fp8-kernel")
SMOKE_BACKENDS = ("fp8dit", "fp8dit-kernel", "fp8dit-quant", "sdpa-math", "sdpa-cudnn",
                  "sdpa-flash", "sageattn", "cudnn-fp8")
SMOKE_SHAPE = "1,2,128,64"
# Below this cosine against the reference a backend is flagged as broken (8-bit attention on
# these inputs sits above 0.99; a wrong kernel lands far lower).
MIN_COS = 0.99
NO_GPU_MESSAGE = (
    "fp8dit bench: no CUDA GPU found (torch.cuda.is_available() is False); "
    "use --smoke for a tiny run through Triton's CPU interpreter"
)


class Unavailable(RuntimeError):
    """A backend that cannot run here (not an error of the backend itself)."""


# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", action="append", metavar="NAME",
                   help="preset shape (repeatable or comma-separated): " + ", ".join(PRESETS)
                        + "; or a group: 'all' (the README's six), 'models' (one per model). "
                        "Default: all (or the --smoke shape)")
    p.add_argument("--shape", action="append", metavar="B,H,S,D",
                   help="custom shape, e.g. 1,24,4608,128 (repeatable)")
    p.add_argument("--backends", metavar="A,B",
                   help="comma-separated subset of: " + ", ".join(BACKENDS)
                        + f". Default: {','.join(GPU_BACKENDS)}")
    p.add_argument("--recipe", help="fp8dit recipe (fp8dit.recipes.RECIPES); default: "
                   "FP8DIT_RECIPE or the library default")
    p.add_argument("--repeats", type=int, help="timed runs per backend (default 100; 3 with "
                   "--smoke), capped by --max-ms")
    p.add_argument("--warmup", type=int, help="warm-up runs per backend (default 10; 1 with "
                   "--smoke)")
    p.add_argument("--max-ms", type=float, default=1500.0,
                   help="cap of the timed runs' total time per backend, in ms (default 1500; "
                        "keeps an all-preset H200 run within about 4 minutes)")
    p.add_argument("--rounds", type=int, default=3,
                   help="timing rounds per shape (default 3): each times every backend once, "
                        "in a rotating order, so GPU warm-up and power capping weigh on all "
                        "alike; ms is the median of the rounds' medians")
    p.add_argument("--sets", type=int, help="input sets rotated between calls (default 3, "
                   "2 when one set is over 2 GiB)")
    p.add_argument("--family", default="normal", help="input family of fp8dit.testing "
                   "(normal, dit); default normal")
    p.add_argument("--layout", default="HND", choices=("HND", "NHD"),
                   help="tensor layout of all backends' inputs: HND [B,H,S,D] (default, SDPA's) "
                        "or NHD [B,S,H,D] (diffusers'; SDPA then gets transposed views)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-json", metavar="PATH",
                   help="results file (default benchmarks/results/<gpu-name>.json)")
    p.add_argument("--no-save", action="store_true", help="do not write the results file")
    p.add_argument("--plot", metavar="PNG", help="grouped bar chart of TFLOPS (needs matplotlib)")
    p.add_argument("--from-json", metavar="PATH",
                   help="print (and --plot) the latest run stored in a results file; runs nothing")
    p.add_argument("--smoke", action="store_true",
                   help=f"tiny run ({SMOKE_SHAPE}) of fp8dit through Triton's CPU interpreter "
                        "against CPU SDPA: checks the wiring; its times are not kernel speed")


# ---------------------------------------------------------------------------------------------
# Re-running under Triton's interpreter (TRITON_INTERPRET must be set before triton is imported)
# ---------------------------------------------------------------------------------------------


def _kernels_in(module) -> dict:
    from triton.runtime.jit import KernelInterface

    return {
        name: obj for name, obj in vars(module).items()
        if isinstance(obj, KernelInterface) or type(obj).__name__ == "InterpretedFunction"
    }


def interpreter_active() -> bool:
    """True when fp8dit's kernels were built for Triton's CPU interpreter."""
    from .. import attend

    kernels = _kernels_in(attend)
    return bool(kernels) and all(
        type(k).__name__ == "InterpretedFunction" for k in kernels.values()
    )


def rerun_interpreted(module: str, args: argparse.Namespace) -> int:
    """Run ``module.run(args)`` in a child Python with ``TRITON_INTERPRET=1``."""
    if getattr(args, "_interpreted_child", False):
        print(f"fp8dit {module.rsplit('.', 1)[-1]}: error: TRITON_INTERPRET=1 did not put "
              "Triton in interpreter mode", file=sys.stderr)
        return 1
    payload = {k: v for k, v in vars(args).items() if not callable(v)}
    payload["_interpreted_child"] = True
    pkg_root = str(Path(__file__).resolve().parent.parent)
    child_env = dict(os.environ, TRITON_INTERPRET="1")
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (pkg_root, os.environ.get("PYTHONPATH", "")) if p
    )
    code = "import sys; from fp8dit.tools.bench import _child_main; sys.exit(_child_main())"
    sys.stdout.flush()
    sys.stderr.flush()
    proc = subprocess.run(
        [sys.executable, "-c", code, module, json.dumps(payload)], env=child_env
    )
    return proc.returncode


def _child_main() -> int:
    module, payload = sys.argv[1], json.loads(sys.argv[2])
    return int(importlib.import_module(module).run(argparse.Namespace(**payload)) or 0)


# ---------------------------------------------------------------------------------------------
# Backends: each makes fn(i) -> output of input set i (or None when there is no output)
# ---------------------------------------------------------------------------------------------


@dataclass
class Staged:
    """One input set run through fp8dit's quantization stage, ready for the attention stage."""

    qkv: tuple
    strides: tuple  # (q, k, v, out) strides as (batch, token, head, dim)
    ws: object  # fp8dit.quantize.Workspace
    out: torch.Tensor
    lse: torch.Tensor


@dataclass
class Case:
    shape: Shape
    layout: str
    device: torch.device
    recipe: str
    sets: list  # [(q, k, v)] in ``layout``
    _staged: tuple | None = None  # (plan, launch, recipe, scale, [Staged per set])
    _cudnn_fp8: object = None  # cudnn_fp8.CudnnFp8Attention, built by the first cuDNN FP8 row

    def swap_hn(self, t):
        """[B,S,H,D] <-> [B,H,S,D] view when the inputs are NHD (SDPA wants HND)."""
        return t if self.layout == "HND" else t.transpose(1, 2)

    def staged(self):
        """The launcher's plan and, per input set, a quantized workspace and output buffers.

        Built with the same pieces as ``fp8dit.attention`` (``attend.plan_for``,
        ``quantize_stage``, ``attention_stage``), so the stages time exactly what it runs.
        """
        if self._staged is None:
            from .. import attend, quantize
            from ..recipes import get_recipe

            B, H, S, D = self.shape.B, self.shape.H, self.shape.S, self.shape.D
            rec, scale = get_recipe(self.recipe), 1.0 / math.sqrt(D)
            plan, launch = attend.plan_for(
                [S] * B, [S] * B, varlen=False, num_heads=H, num_kv_heads=H, head_dim=D,
                is_causal=False, device=self.device, recipe=rec,
            )
            staged = []
            for q, k, v in self.sets:
                out = torch.empty_like(q)
                lse = torch.empty(B, H, S, device=self.device, dtype=torch.float32)
                st = tuple(attend._bthd_strides(t, self.layout) for t in (q, k, v, out))
                ws = quantize.quantize_stage(plan, rec, scale, q, st[0], k, st[1], v, st[2],
                                             kv_perm16=launch.kernel == "gluon-ws")
                staged.append(Staged((q, k, v), st, ws, out, lse))
            self._staged = (plan, launch, rec, scale, staged)
        return self._staged


def _need_cuda(case: Case, what: str) -> None:
    if case.device.type != "cuda":
        raise Unavailable(f"{what} needs a CUDA GPU")


def _make_fp8dit(case: Case, backend: str = "fp8"):
    import fp8dit

    def fn(i):
        q, k, v = case.sets[i]
        return fp8dit.attention(q, k, v, layout=case.layout, backend=backend,
                                recipe=case.recipe)

    return fn


def _make_fp8dit_auto(case: Case):
    return _make_fp8dit(case, backend="auto")


def _make_fp8dit_kernel(case: Case):
    from ..attend import attention_stage

    plan, launch, _, _, staged = case.staged()

    def fn(i):
        x = staged[i]
        lse_strides = (x.lse.stride(0), x.lse.stride(1), x.lse.stride(2))
        attention_stage(plan, launch, x.ws, x.out, x.strides[3], x.lse, lse_strides)
        return x.out

    def poisoned_fn(i):  # the check call: every output element must be written by the kernel
        staged[i].out.fill_(float("nan"))
        return fn(i)

    fn.check_call = poisoned_fn
    return fn


def _make_fp8dit_quant(case: Case):
    from ..quantize import quantize_stage

    plan, launch, rec, scale, staged = case.staged()

    def fn(i):
        x = staged[i]
        (q, k, v), st = x.qkv, x.strides
        quantize_stage(plan, rec, scale, q, st[0], k, st[1], v, st[2],  # allocates, as e2e
                       kv_perm16=launch.kernel == "gluon-ws")
        return None

    return fn


def _make_sdpa(backend_name: str):
    def make(case: Case):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        if backend_name != "MATH":
            _need_cuda(case, f"SDPA {backend_name.lower()}")
        backend = getattr(SDPBackend, f"{backend_name}_ATTENTION" if backend_name != "MATH"
                          else "MATH")

        def fn(i):
            q, k, v = (case.swap_hn(t) for t in case.sets[i])
            with sdpa_kernel(backend):
                out = sdpa(q, k, v, is_causal=False)
            return case.swap_hn(out)

        return fn

    return make


def _make_sage(case: Case):
    _need_cuda(case, "SageAttention")
    try:
        from sageattention import sageattn
    except ImportError as e:
        raise Unavailable(f"sageattention is not importable ({e})") from None

    def fn(i):
        q, k, v = case.sets[i]
        return sageattn(q, k, v, tensor_layout=case.layout, is_causal=False)

    return fn


def _cudnn_fp8(case: Case):
    """The cached cuDNN FP8 graph of this case (built once for both cuDNN FP8 rows)."""
    from .cudnn_fp8 import CudnnFp8Attention, CudnnFp8Unavailable

    _need_cuda(case, "cuDNN FP8 attention")
    if case._cudnn_fp8 is None:
        q, k, v = (case.swap_hn(t) for t in case.sets[0])
        try:
            case._cudnn_fp8 = CudnnFp8Attention(q, k, v)
        except CudnnFp8Unavailable as e:
            raise Unavailable(str(e)) from None
    return case._cudnn_fp8


def _make_cudnn_fp8(case: Case):
    att = _cudnn_fp8(case)

    def fn(i):
        return case.swap_hn(att(*(case.swap_hn(t) for t in case.sets[i])))

    return fn


def _make_cudnn_fp8_kernel(case: Case):
    from .cudnn_fp8 import dequantize_output, quantize_inputs

    att = _cudnn_fp8(case)
    staged = [quantize_inputs(*(case.swap_hn(t) for t in qkv)) for qkv in case.sets]
    outs = [att.run_fp8(x) for x in staged]

    def fn(i):
        return att.run_fp8(staged[i], outs[i])

    def dequantized_fn(i):  # the check call: the same kernel output, in bf16 for the cosine
        return case.swap_hn(dequantize_output(fn(i), staged[i], case.sets[i][0].dtype))

    fn.check_call = dequantized_fn
    return fn


MAKERS = {
    "fp8dit": _make_fp8dit,
    "fp8dit-auto": _make_fp8dit_auto,
    "fp8dit-kernel": _make_fp8dit_kernel,
    "fp8dit-quant": _make_fp8dit_quant,
    "sdpa-cudnn": _make_sdpa("CUDNN"),
    "sdpa-flash": _make_sdpa("FLASH"),
    "sdpa-math": _make_sdpa("MATH"),
    "sageattn": _make_sage,
    "cudnn-fp8": _make_cudnn_fp8,
    "cudnn-fp8-kernel": _make_cudnn_fp8_kernel,
}
# Reference output for the cosine column, first that runs.
REFERENCE_ORDER = {"cuda": ("sdpa-cudnn", "sdpa-flash"), "cpu": ("sdpa-math",)}


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------


@dataclass
class Row:
    preset: str
    B: int
    H: int
    S: int
    D: int
    backend: str
    ms: float | None = None
    tflops: float | None = None
    speedup_vs_cudnn: float | None = None
    peak_mem_bytes: int | None = None
    cos_vs_ref: float | None = None
    rel_l1_vs_ref: float | None = None
    ref: str | None = None
    quant_share: float | None = None
    note: str = ""
    error: str | None = None
    layout: str = "HND"
    family: str = "normal"
    n_sets: int = 0
    recipe: str | None = None
    kernel: str | None = None  # the attention kernel an fp8dit row ran (dispatch.choose_kernel)
    # how the warp-specialized kernel was built: from triton 3.6's PTX (fp8dit.prebuilt) or by
    # the installed Triton itself
    kernel_build: str | None = None
    interpreter: bool = False
    bad: bool = False  # failed, NaN or cos vs ref below MIN_COS
    ms_rounds: list | None = None  # each timing round's median (``ms`` is their median)
    sm_clock_mhz: float | None = None  # mean over the backend's timed rounds (nvidia-smi)
    power_w: float | None = None
    power_capped: float | None = None  # share of samples at the software power cap


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        try:
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - a dead context fails here; the row already says why
            pass


def _first_line(e: BaseException, limit: int = 160) -> str:
    msg = str(e).strip().splitlines()
    text = f"{type(e).__name__}: {msg[0] if msg else ''}".strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_call_gpu(fn, device) -> tuple[float, int]:
    """(ms of one call, peak memory delta in bytes of it)."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    out = fn(0)
    end.record()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del out
    return max(start.elapsed_time(end), 1e-3), int(peak)


def _time_gpu(fn, n_sets: int, warmup: int, repeats: int, max_ms: float, est: float) -> float:
    """Median ms of ``fn`` with rotated input sets (one round of ``bench_shape``)."""
    import triton.testing

    counter = itertools.count()
    rep_ms = min(est * max(repeats, 1), max_ms)
    warm_ms = min(est * max(warmup, 0), max_ms / 4)
    return float(triton.testing.do_bench(
        lambda: fn(next(counter) % n_sets), warmup=warm_ms, rep=rep_ms, return_mode="median"
    ))


class _GpuClocks:
    """SM clock, board power and power-cap flag sampled by ``nvidia-smi -lms`` while a backend
    is timed. Why: an H200 running these kernels sits at its 700 W cap (2026-12-03: the FP8
    kernel at ~1.82 GHz, cuDNN at ~1.65 GHz), so a time is only comparable with its clock next
    to it. Without nvidia-smi every figure is None."""

    QUERY = "clocks.sm,power.draw,clocks_event_reasons.active"
    SW_POWER_CAP = 0x4

    def __init__(self, device):
        self.proc = None
        # (perf_counter time, MHz, W, event-reason bits), None where not reported
        self.samples: list[tuple[float, float | None, float | None, float | None]] = []
        exe = shutil.which("nvidia-smi")
        if exe is None or device.type != "cuda":
            return
        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
        # UUIDs survive CUDA_VISIBLE_DEVICES's renumbering; indices do not
        gpu_id = str(uuid) if uuid is not None else str(device.index or 0)
        if uuid is not None and not gpu_id.startswith("GPU-"):
            gpu_id = "GPU-" + gpu_id
        cmd = [exe, f"--id={gpu_id}", f"--query-gpu={self.QUERY}",
               "--format=csv,noheader,nounits", "-lms", "100"]
        try:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            fields = [x.strip() for x in line.split(",")]
            if len(fields) != 3:
                continue
            # a field the GPU does not report reads "[N/A]" (or "[Not Supported]"): None
            clk, watts, reasons = (_number(x, base) for x, base in zip(fields, (10, 10, 16)))
            self.samples.append((time.perf_counter(), clk, watts, reasons))

    def summary(self, t0: float, t1: float) -> dict:
        """Means over the samples taken between perf_counter times ``t0`` and ``t1`` (keys
        only for fields that were reported)."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        out = {}
        for i, key, digits in ((1, "sm_clock_mhz", 0), (2, "power_w", 1), (3, "power_capped", 2)):
            vals = [s[i] for s in inside if s[i] is not None]
            if i == 3:
                vals = [float(bool(int(v) & self.SW_POWER_CAP)) for v in vals]
            if vals:
                out[key] = round(sum(vals) / len(vals), digits)
        return out

    def close(self):
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()


def _number(text: str, base: int) -> float | None:
    try:
        return float(int(text, 16)) if base == 16 else float(text)
    except ValueError:
        return None


def _time_cpu(fn, n_sets: int, warmup: int, repeats: int) -> tuple:
    for i in range(warmup):
        fn(i % n_sets)
    times = []
    for i in range(max(repeats, 1)):
        t0 = time.perf_counter()
        fn(i % n_sets)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), None


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _n_sets(shape: Shape, requested: int | None) -> int:
    if requested is not None:
        return requested
    set_bytes = 3 * shape.B * shape.H * shape.S * shape.D * 2
    return 3 if set_bytes < 2 * 2**30 else 2


def bench_shape(shape: Shape, backends, *, device, recipe, layout, family, seed, n_sets,
                warmup, repeats, max_ms, rounds: int = 3) -> list[Row]:
    from ..testing import error_stats, make_qkv

    interp = device.type == "cpu"
    _log(f"[bench] {shape.name} ({shape.dims()}): {n_sets} input sets, layout {layout}, "
         f"family {family}")
    sets = [
        make_qkv(shape.B, shape.H, shape.S, shape.D, family=family, layout=layout,
                 dtype=torch.bfloat16, device=device, seed=seed + i)
        for i in range(n_sets)
    ]
    case = Case(shape, layout, device, recipe, sets)
    common = dict(preset=shape.name, B=shape.B, H=shape.H, S=shape.S, D=shape.D, layout=layout,
                  family=family, n_sets=n_sets, interpreter=interp)

    ref, ref_name = None, None
    for name in REFERENCE_ORDER[device.type]:
        try:
            ref = MAKERS[name](case)(0)
            _sync(device)
            ref_name = name
            break
        except Exception as e:  # noqa: BLE001 - any failure means: try the next reference
            _log(f"[bench]   reference {name} failed: {_first_line(e)}")
            ref = None
    from ..dispatch import choose_kernel
    from ..recipes import get_recipe

    kernel, _ = choose_kernel(shape.D, shape.S, False, get_recipe(recipe), device)
    build = None
    if kernel == "gluon-ws":
        from .. import prebuilt

        build = ("built from triton 3.6's PTX (fp8dit.prebuilt)" if prebuilt.applies_to_release()
                 else "the installed Triton's own build")
    rows, ready = [], []
    for name in backends:
        ours = name in ("fp8dit", "fp8dit-kernel")
        row = Row(backend=name, recipe=recipe if name.startswith("fp8dit") else None,
                  kernel=kernel if ours else None, kernel_build=build if ours else None,
                  **common)
        rows.append(row)
        t0 = time.perf_counter()
        try:
            fn = MAKERS[name](case)
            out = getattr(fn, "check_call", fn)(0)
            _sync(device)
            if out is not None and ref is not None:
                st = error_stats(out, ref)
                row.cos_vs_ref, row.rel_l1_vs_ref, row.ref = st.cos, st.rel_l1, ref_name
                if st.nan or not st.cos >= MIN_COS:
                    row.bad = True
                    row.note = "NaN in output!" if st.nan else f"cos below {MIN_COS}!"
            del out
            if interp:
                row.ms, row.peak_mem_bytes = _time_cpu(fn, n_sets, warmup, repeats)
            else:
                est, row.peak_mem_bytes = _first_call_gpu(fn, device)
                ready.append((row, fn, est))
        except Unavailable as e:
            row.error = f"unavailable: {e}"
        except torch.cuda.OutOfMemoryError as e:
            row.error, row.bad = f"out of memory: {_first_line(e, 100)}", True
        except Exception as e:  # noqa: BLE001 - one broken backend must not end the run
            row.error, row.bad = _first_line(e), True
        if row.error or interp:
            _empty_cache(device)
            status = row.error or f"{row.ms:.3f} ms"
            _log(f"[bench]   {name:14s} {status}  ({time.perf_counter() - t0:.1f} s)")
    if ready:
        _time_rounds(ready, shape, n_sets, warmup, repeats, max_ms, rounds, device)
    del ready
    _finish_rows(rows, interp)
    del case, sets, ref
    _empty_cache(device)
    return rows


def _time_rounds(ready, shape, n_sets, warmup, repeats, max_ms, rounds, device) -> None:
    """Times every ready (row, fn, first-call ms) in ``rounds`` rounds whose order rotates, so
    a GPU that warms up, or sits at its power cap, weighs on every backend alike (H200, 2026-12-03:
    the FP8 kernel slowed 116 -> 119 ms over 40 s of Wan 720p calls while cuDNN held 208 ms;
    one block per backend, in a fixed order, favoured whichever ran first). ``row.ms`` is the
    median of the rounds' medians, each round ``repeats / rounds`` runs long."""
    clocks = _GpuClocks(device)
    seen: dict[str, list] = {row.backend: [] for row, _, _ in ready}
    times: dict[str, list[float]] = {row.backend: [] for row, _, _ in ready}
    try:
        for r in range(rounds):
            k = r % len(ready)
            for row, fn, est in ready[k:] + ready[:k]:
                t0 = time.perf_counter()
                try:
                    ms = _time_gpu(fn, n_sets, warmup, max(1, repeats // rounds),
                                   max_ms / rounds, est)
                except Exception as e:  # noqa: BLE001 - a failure in a later round
                    row.error, row.bad = _first_line(e), True
                    continue
                seen[row.backend].append((t0, time.perf_counter()))
                times[row.backend].append(ms)
    finally:
        clocks.close()
    for row, _, _ in ready:
        t = times[row.backend]
        if row.error or not t:
            _log(f"[bench]   {row.backend:14s} {row.error}")
            continue
        row.ms = statistics.median(t)
        row.ms_rounds = [round(x, 4) for x in t]
        spans = [clocks.summary(a, b) for a, b in seen[row.backend]]
        spans = [x for x in spans if x]
        for key in ("sm_clock_mhz", "power_w", "power_capped"):
            vals = [x[key] for x in spans if key in x]
            if vals:
                setattr(row, key, round(statistics.mean(vals), 2))
        if row.backend != "fp8dit-quant":
            row.tflops = shape.flops / (row.ms * 1e-3) / 1e12
        clock = f", {row.sm_clock_mhz:.0f} MHz" if row.sm_clock_mhz else ""
        _log(f"[bench]   {row.backend:14s} {row.ms:.3f} ms (rounds "
             + " / ".join(f"{x:.3f}" for x in t) + f"{clock})")


def _finish_rows(rows: list[Row], interp: bool) -> None:
    by = {r.backend: r for r in rows if r.ms is not None}
    cudnn = by.get("sdpa-cudnn")
    if cudnn is not None and not interp:
        for r in rows:
            if r.ms is not None and r.backend != "fp8dit-quant":
                r.speedup_vs_cudnn = cudnn.ms / r.ms
    e2e = by.get("fp8dit")
    if e2e is None:
        return
    notes = []
    if "fp8dit-quant" in by:
        e2e.quant_share = by["fp8dit-quant"].ms / e2e.ms
        notes.append(f"quant {100 * e2e.quant_share:.0f}%")
        by["fp8dit-quant"].note = f"{100 * e2e.quant_share:.0f}% of fp8dit"
    if "fp8dit-kernel" in by:
        share = by["fp8dit-kernel"].ms / e2e.ms
        notes.append(f"kernel {100 * share:.0f}%")
        by["fp8dit-kernel"].note = f"{100 * share:.0f}% of fp8dit"
    e2e.note = "; ".join(filter(None, [e2e.note, " ".join(notes) + " of e2e" if notes else "",
                                       f"{e2e.kernel} kernel" if e2e.kernel else ""]))


# ---------------------------------------------------------------------------------------------
# Output: table, JSON, plot
# ---------------------------------------------------------------------------------------------


def _fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _unavailable_everywhere(rows: list[dict]) -> dict[str, list[str]]:
    """Backends unavailable with one and the same reason in every preset of a multi-preset
    run (a peer that is not installed), by reason: the table names them once instead of
    repeating the reason under every preset. The JSON rows keep every one."""
    if len({r["preset"] for r in rows}) < 2:
        return {}
    errors: dict[str, set] = {}
    for r in rows:
        errors.setdefault(r["backend"], set()).add(r.get("error"))
    by_reason: dict[str, list[str]] = {}
    for name, errs in errors.items():
        err = next(iter(errs))
        if len(errs) == 1 and isinstance(err, str) and err.startswith("unavailable:"):
            by_reason.setdefault(err, []).append(name)
    return by_reason


def format_table(rows: list[dict]) -> str:
    def f(v, spec):
        return "-" if v is None else format(v, spec)

    absent = _unavailable_everywhere(rows)
    hidden = {name for names in absent.values() for name in names}
    rows = [r for r in rows if r["backend"] not in hidden]

    # The SM clock (and whether the power cap held it down) next to the time: at the cap, a
    # time is only comparable with the clock it ran at. Only when a row has one (GPU runs).
    clocks = any(r.get("sm_clock_mhz") is not None for r in rows)
    header = ("preset", "backend", "ms", "TFLOPS", "vs cuDNN", "peak mem", "cos vs ref",
              *(("MHz",) if clocks else ()), "note")
    lines = []
    for r in rows:
        note = r.get("error") or r.get("note") or ""
        clock = ()
        if clocks:
            mhz = r.get("sm_clock_mhz")
            capped = (r.get("power_capped") or 0) >= 0.5
            clock = ("-" if mhz is None else f"{mhz:.0f}" + (" cap" if capped else ""),)
        lines.append((
            r["preset"], r["backend"], f(r.get("ms"), ".3f"), f(r.get("tflops"), ".1f"),
            "-" if r.get("speedup_vs_cudnn") is None else f"{r['speedup_vs_cudnn']:.2f}x",
            _fmt_bytes(r.get("peak_mem_bytes")), f(r.get("cos_vs_ref"), ".5f"), *clock, note,
        ))
    widths = [max(len(h), *(len(x[i]) for x in lines)) if lines else len(h)
              for i, h in enumerate(header)]
    right = set(range(2, len(header) - 1))

    def fmt(cells):
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    out = [fmt(header), fmt(["-" * w for w in widths])]
    prev = None
    for r, cells in zip(rows, lines):
        if prev is not None and r["preset"] != prev:
            out.append("")
        prev = r["preset"]
        out.append(fmt(cells))
    if absent:
        out.append("")
    for reason, names in absent.items():
        out.append(f"{', '.join(names)}: {reason} (every preset)")
    return "\n".join(out)


def gpu_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def _git_commit() -> str | None:
    # FP8DIT_COMMIT first: a copy of a working tree (a GPU machine's) can carry a .git whose
    # HEAD is older than the files it runs, and its rows would name that older commit.
    if os.environ.get("FP8DIT_COMMIT"):
        return os.environ["FP8DIT_COMMIT"]
    try:
        res = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5, cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() or None if res.returncode == 0 else None


def driver_version(device: torch.device) -> str | None:
    """The NVIDIA driver's version (e.g. "570.124.06") from ``nvidia-smi``, else from
    ``/proc/driver/nvidia/version``; None off CUDA or where neither tells."""
    if device.type != "cuda":
        return None
    exe = shutil.which("nvidia-smi")
    if exe is not None:
        try:
            res = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            lines = res.stdout.split() if res.returncode == 0 else []
            if lines and re.fullmatch(r"\d+(\.\d+)+", lines[0]):
                return lines[0]
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        return driver_from_proc(Path("/proc/driver/nvidia/version").read_text())
    except OSError:
        return None


def driver_from_proc(text: str) -> str | None:
    """The version in ``/proc/driver/nvidia/version``'s "NVRM version: ... Kernel Module
    570.124.06 ..." line (closed and open kernel modules word it differently)."""
    m = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s", text)
    return m.group(1) if m else None


# Every results row (attention, model forward, context parallel) carries these fields; a value
# a run could not read, or an older row did not record, is None.
METADATA_FIELDS = ("gpu", "driver", "torch", "triton", "cuda", "cudnn", "cudnn_frontend",
                   "sageattention", "fp8dit", "commit", "date")


def run_metadata(device: torch.device) -> dict:
    """The :data:`METADATA_FIELDS` of this process on ``device``: what a results row names."""
    import triton

    from .. import __version__

    meta = {
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu-interpreter",
        "driver": driver_version(device),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "fp8dit": __version__,
        "commit": _git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    from importlib.metadata import version

    for key, dist in (("sageattention", "sageattention"),
                      ("cudnn_frontend", "nvidia-cudnn-frontend")):
        try:
            meta[key] = version(dist)
        except Exception:  # noqa: BLE001 - not installed
            meta[key] = None
    # the cuDNN library under both SDPA cuDNN and cuDNN FP8 (None without one)
    meta["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return meta


def _row_key(r: dict) -> tuple:
    # "model" and "mode" tell apart rows of the model benchmarks (which transformer; eager /
    # compile / cuda-graph / ulysses / ring).
    return (r.get("date"), r.get("preset"), r.get("backend"), r.get("recipe"), r.get("model"),
            r.get("mode"))


def load_results(path: Path) -> list[dict]:
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable JSON results file ({e})") from None
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ValueError(f"{path}: expected a JSON list of row objects")
    return data


def save_results(path: Path, rows: list[dict]) -> int:
    """Merge ``rows`` into the JSON list at ``path`` (same date/preset/backend/recipe replaced)."""
    old = load_results(path)
    new_keys = {_row_key(r) for r in rows}
    merged = [r for r in old if _row_key(r) not in new_keys] + rows
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("[\n" + ",\n".join(json.dumps(r, sort_keys=True) for r in merged) + "\n]\n")
    tmp.replace(path)
    return len(merged)


def latest_run(rows: list[dict]) -> list[dict]:
    dates = [r.get("date") for r in rows if r.get("date")]
    if not dates:
        return rows
    last = max(dates)
    return [r for r in rows if r.get("date") == last]


def check_plot_available() -> str | None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return ("--plot needs matplotlib, which is not installed "
                "(pip install 'fp8dit[plot]' or pip install matplotlib)")
    return None


def check_output_path(option: str, path: str | None) -> None:
    """Raise ValueError when ``path`` cannot be written (checked before a run, written after)."""
    if path and (not Path(path).resolve().parent.is_dir() or Path(path).is_dir()):
        raise ValueError(f"{option}: expected a file path in an existing directory, got {path!r}")


def plot_rows(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # TFLOPS where there are any (GPU runs); interpreter runs only have times.
    metric = "tflops" if any(r.get("tflops") is not None for r in rows) else "ms"
    rows = [r for r in rows if r.get(metric) is not None]
    if not rows:
        raise ValueError("nothing to plot: no row has a time")
    presets = list(dict.fromkeys(r["preset"] for r in rows))
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    val = {(r["preset"], r["backend"]): r[metric] for r in rows}
    width = 0.8 / max(len(backends), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(presets) * max(1, len(backends) / 3)), 4.5))
    for j, b in enumerate(backends):
        xs = [i + (j - (len(backends) - 1) / 2) * width for i in range(len(presets))]
        ys = [val.get((p, b), 0.0) for p in presets]
        bars = ax.bar(xs, ys, width, label=b)
        ax.bar_label(bars, labels=[f"{y:.3g}" if y else "" for y in ys], fontsize=7)
    ax.set_ylim(top=1.3 * max(val.values()))  # room for the legend above the bars
    ax.set_xticks(range(len(presets)))
    ax.set_xticklabels(presets, rotation=15)
    ax.set_ylabel("TFLOPS (4*B*H*S^2*D / time)" if metric == "tflops"
                  else "ms (CPU interpreter, not kernel speed)")
    first = rows[0]
    ax.set_title(f"attention forward, {first.get('gpu', '')}, {first.get('date', '')}")
    ax.legend(fontsize=8, ncol=min(len(backends), 3))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------


def _error(msg: str) -> int:
    print(f"fp8dit bench: error: {msg}", file=sys.stderr)
    return 2


def _parse_backends(text: str | None, default) -> list[str]:
    if not text:
        return list(default)
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in BACKENDS]
    if bad or not names:
        raise ValueError(
            f"--backends: unknown {', '.join(map(repr, bad)) or 'empty list'}; expected "
            "a comma-separated subset of: " + ", ".join(BACKENDS)
        )
    return list(dict.fromkeys(names))


def _report(rows: list[dict], *, interp: bool, plot: str | None, note: str | None) -> int:
    rc = 0
    if plot:
        try:
            plot_rows(rows, plot)
            _log(f"[bench] wrote {plot}")
        except Exception as e:  # noqa: BLE001 - the table still matters
            _log(f"[bench] --plot failed: {_first_line(e)}")
            rc = 1
    if note:
        print(note)
    if interp:
        print("CPU interpreter run (TRITON_INTERPRET=1): ms are Python interpreter times, "
              "not kernel speed; no TFLOPS or speed-up figures.")
    print(format_table(rows))
    return rc


def run(args: argparse.Namespace) -> int:
    if args.plot:
        missing = check_plot_available()
        if missing:
            return _error(missing)
    if args.from_json:
        try:
            check_output_path("--plot", args.plot)
            rows = latest_run(load_results(Path(args.from_json)))
        except ValueError as e:
            return _error(str(e))
        if not rows:
            return _error(f"--from-json: {args.from_json}: no rows (missing or empty file)")
        return _report(rows, interp=bool(rows[0].get("interpreter")), plot=args.plot,
                       note=f"{args.from_json}: run of {rows[0].get('date')} on "
                            f"{rows[0].get('gpu')}")

    smoke = bool(args.smoke)
    try:  # arguments first: a typo gets its own message on any machine
        from ..api import check_recipe

        recipe = check_recipe(args.recipe, "--recipe").name
        backends = _parse_backends(args.backends, SMOKE_BACKENDS if smoke else GPU_BACKENDS)
        if smoke and args.preset:
            raise ShapeError("--smoke runs through the CPU interpreter: use a tiny --shape, "
                             "not a --preset")
        shapes = resolve_shapes(args.preset, args.shape)
        if not shapes:
            shapes = [parse_shape(SMOKE_SHAPE)] if smoke else resolve_shapes(["all"])
        from ..testing import FAMILIES

        if args.family not in FAMILIES:
            raise ValueError(f"--family: expected one of {', '.join(FAMILIES)}, "
                             f"got {args.family!r}")
        for opt in ("repeats", "warmup", "sets", "rounds"):
            val = getattr(args, opt)
            if val is not None and val < (0 if opt == "warmup" else 1):
                raise ValueError(f"--{opt}: expected a positive number, got {val}")
        if not args.max_ms > 0:
            raise ValueError(f"--max-ms: expected a positive number, got {args.max_ms}")
        check_output_path("--plot", args.plot)  # --out-json: save_results makes its folder
    except ValueError as e:
        return _error(str(e))
    if not smoke and not torch.cuda.is_available():
        print(NO_GPU_MESSAGE, file=sys.stderr)
        return 1

    if smoke and not interpreter_active():
        _log("[bench] --smoke: re-running under TRITON_INTERPRET=1 (Triton's CPU interpreter)")
        return rerun_interpreted(__name__, args)

    device = torch.device("cpu") if smoke else torch.device("cuda", torch.cuda.current_device())
    repeats = args.repeats if args.repeats is not None else (3 if smoke else 100)
    warmup = args.warmup if args.warmup is not None else (1 if smoke else 10)
    meta = run_metadata(device)
    out_path = None
    if not smoke and not args.no_save:
        out_path = Path(args.out_json or Path("benchmarks", "results", gpu_slug(meta["gpu"])
                                               + ".json"))
    all_rows: list[dict] = []
    saved_note = None
    t_start = time.perf_counter()
    for shape in shapes:
        try:
            rows = bench_shape(
                shape, backends, device=device, recipe=recipe, layout=args.layout,
                family=args.family, seed=args.seed, n_sets=_n_sets(shape, args.sets),
                warmup=warmup, repeats=repeats, max_ms=args.max_ms, rounds=args.rounds,
            )
        except Exception as e:  # noqa: BLE001 - e.g. inputs that do not fit: next shape
            _log(f"[bench] {shape.name}: {_first_line(e)}")
            rows = [Row(shape.name, shape.B, shape.H, shape.S, shape.D, "(inputs)",
                        error=_first_line(e), bad=True, layout=args.layout,
                        family=args.family, interpreter=smoke)]
            _empty_cache(device)
        dict_rows = [dict(asdict(r), **meta) for r in rows]
        all_rows.extend(dict_rows)
        if out_path is not None:  # after every shape, so a crash later keeps what was measured
            try:
                total = save_results(out_path, all_rows)
                saved_note = f"saved {len(all_rows)} rows to {out_path} ({total} in the file)"
            except (OSError, ValueError) as e:
                saved_note = f"could not save results: {e}"
    _log(f"[bench] done in {time.perf_counter() - t_start:.0f} s")
    ref_note = (f"{meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, recipe "
                f"{recipe}; cos vs ref: against "
                + ("SDPA cuDNN (flash if cuDNN failed)" if not smoke else "CPU SDPA (math)"))
    if saved_note:
        ref_note = saved_note + "\n" + ref_note
    rc = _report(all_rows, interp=smoke, plot=args.plot, note=ref_note)
    # A broken fp8dit fails the run (CI's smoke test relies on it); other peers only report.
    broken = [r for r in all_rows
              if r.get("bad") and (r["backend"].startswith("fp8dit") or r["backend"] == "(inputs)")]
    return rc or (1 if broken else 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_attention.py", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
