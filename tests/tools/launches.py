"""Record the FP8 path's kernel launches under Triton's interpreter, to compile them for a GPU.

``record(monkeypatch, calls)`` replaces every kernel the FP8 path launches (quantization,
attention, split-KV merge, mask statistics) by a recorder, runs ``calls()``, and returns each
distinct launch once: module, kernel name, argument types, constexprs and launch options, what
``triton.compile`` needs (tests/tools/hip_compile.py), and which arguments the launcher would
specialize as divisible by 16.
``execute=False`` records without running the kernels: the host code decides every launch from
shapes alone, so the outputs (left unwritten) do not change what is recorded.
"""

from __future__ import annotations

import inspect
import json

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from fp8dit import attend, balance, key_padding, merge, quantize

DTYPES = {
    torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32",
    torch.int64: "i64", torch.int8: "i8", torch.uint8: "u8", torch.float8_e4m3fn: "fp8e4nv",
    torch.float8_e4m3fnuz: "fp8e4b8",
}
# every kernel the FP8 path launches: quantization (with the balance recipes' channel sums),
# attention, the split-KV merge, and the mask statistics of key-padding masks
KERNELS = [(mod, name) for mod in (quantize, attend, merge, balance, key_padding)
           for name in dir(mod) if name.endswith("_kernel")]
# launch options (not kernel arguments) a launch may pass
OPTIONS = ("num_warps", "num_stages", "maxnreg", "waves_per_eu")


def arg_type(value) -> str:
    """A kernel argument's type as ``triton.compile``'s signature spells it."""
    if isinstance(value, torch.Tensor):
        return "*" + DTYPES[value.dtype]
    if isinstance(value, TensorDescriptor):
        shape = ", ".join(str(int(s)) for s in value.block_shape)
        return f"tensordesc<{DTYPES[value.base.dtype]}[{shape}]>"
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"unexpected kernel argument {type(value).__name__}")


def _divisible_by_16(value) -> bool:
    """Whether Triton's launcher specializes the argument as divisible by 16 (a pointer
    16-byte aligned, an integer multiple of 16): what lets pointer loads be 16 bytes wide.
    tests/tools/nvidia_compile.py compiles with it; the other tools read descriptors only."""
    if isinstance(value, torch.Tensor):
        return value.data_ptr() % 16 == 0
    return isinstance(value, int) and not isinstance(value, bool) and value % 16 == 0


class Recorder:
    """Stands in for a jitted kernel: ``kernel[grid](...)`` appends the launch to ``sink`` and
    runs it (interpreted)."""

    def __init__(self, kernel, sink: list, execute: bool = True):
        self.kernel, self.sink, self.execute = kernel, sink, execute
        fn = getattr(kernel, "fn", kernel)
        params = inspect.signature(fn).parameters
        self.names = list(params)
        # parameters a launch may leave out (the rotary tables' pointers): their defaults
        self.defaults = {n: p.default for n, p in params.items()
                         if p.default is not inspect.Parameter.empty}
        self.constexpr = {n for n, p in params.items() if "constexpr" in str(p.annotation)}
        self.module, self.name = fn.__module__, fn.__name__

    def __getitem__(self, grid):
        launcher = self.kernel[grid]

        def run(*args, **kwargs):
            opts = {k: kwargs.pop(k) for k in OPTIONS if k in kwargs}
            bound = dict(self.defaults)
            bound.update(zip(self.names, args))
            bound.update(kwargs)
            sig, const, aligned = {}, {}, []
            for n in self.names:
                if n in self.constexpr:
                    sig[n] = "constexpr"
                    # The interpreter's cast workarounds are off in compiled kernels.
                    const[n] = False if n in ("SOFT_FP8_CAST", "SOFT_CAST") else bound[n]
                elif bound[n] is None:  # a pointer left out: Triton makes it a constant
                    sig[n], const[n] = "constexpr", None
                else:
                    sig[n] = arg_type(bound[n])
                    if _divisible_by_16(bound[n]):
                        aligned.append(n)
            self.sink.append(dict(module=self.module, name=self.name, signature=sig,
                                  constexprs=const, aligned=aligned,
                                  num_warps=opts.get("num_warps", 4),
                                  num_stages=opts.get("num_stages", 3),
                                  maxnreg=opts.get("maxnreg"),
                                  waves_per_eu=opts.get("waves_per_eu")))
            return launcher(*args, **kwargs, **opts) if self.execute else None

        return run


def record(monkeypatch, calls, execute: bool = True) -> list[dict]:
    """The distinct launches ``calls()`` makes (kernels replaced through ``monkeypatch``)."""
    sink: list[dict] = []
    for mod, name in KERNELS:
        monkeypatch.setattr(mod, name, Recorder(getattr(mod, name), sink, execute))
    calls()
    for mod, name in KERNELS:
        monkeypatch.setattr(mod, name, getattr(mod, name).kernel)
    unique = {json.dumps(r, sort_keys=True): r for r in sink}
    return list(unique.values())
