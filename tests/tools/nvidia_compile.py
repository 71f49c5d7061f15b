"""Compile recorded fp8dit kernel launches for NVIDIA GPUs other than Hopper, without one.

    python tests/tools/nvidia_compile.py launches.json sm_89     # L40S, RTX 4090 (Ada)
    python tests/tools/nvidia_compile.py launches.json sm_100    # B200 (compiled as sm_100a)
    python tests/tools/nvidia_compile.py launches.json sm_120    # RTX 5090, RTX PRO 6000

Reads launches recorded by tests/tools/launches.py under ``fp8dit.device.interpret_as(arch)``
(argument types and alignment, constexprs, warps, stages), compiles each with Triton's own
compiler for the architecture, disassembles the cubin with the cuobjdump Triton ships, and
prints one JSON line per launch with what the SASS holds: tensor-core instructions by kind,
global loads by width, registers, shared memory and tensor memory, and per kv loop its
instructions, spills, byte-wide loads and barriers. Must run without TRITON_INTERPRET.
"""

from __future__ import annotations

import collections
import importlib
import os
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.dirname(__file__))
from compile_each import compile_each  # noqa: E402
from sm90_compile import _disassemble  # noqa: E402

CAPABILITY = {"sm_89": 89, "sm_100": 100, "sm_120": 120}
# tensor-core instructions by operand type: mma.sync (HMMA/IMMA/QMMA, sm_89 and sm_120) and
# tcgen05 (UTC*MMA, sm_100a: accumulators in tensor memory)
INT8_MMA = ("IMMA", "UTCIMMA")
FP8_MMA = ("QMMA", "UTCQMMA")
BF16_MMA = ("HMMA", "UTCHMMA")
_INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s*([^;]*);")


def _opcode(text: str) -> str:
    """The opcode with its modifiers (``LDG.E.U8``), past a predicate (``@!P0``)."""
    parts = text.split()
    return parts[1] if parts[0].startswith("@") and len(parts) > 1 else parts[0]


def _is_mma(op: str) -> bool:
    return op.split(".")[0] in INT8_MMA + FP8_MMA + BF16_MMA


def mma_loops(sass: str) -> list[list[str]]:
    """Bodies (opcodes) of the innermost loops that issue tensor-core MMAs: the kv loops."""
    ins = [(int(m.group(1), 16), m.group(2).strip()) for m in _INS.finditer(sass)]
    loops = []
    for addr, text in ins:
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            loops.append((int(m.group(1), 16), addr))
    inner = [(a, b) for a, b in loops
             if not any((a, b) != (c, d) and a <= c and d <= b for c, d in loops)]
    bodies = [[_opcode(t) for addr, t in ins if a <= addr <= b] for a, b in inner]
    return [b for b in bodies if any(_is_mma(op) for op in b)]


def _count(ops, prefixes) -> int:
    return sum(1 for op in ops if op.split(".")[0] in prefixes)


def loop_report(body: list[str]) -> dict:
    return dict(
        instructions=len(body),
        spills=sum(1 for op in body if op.split(".")[0] in ("LDL", "STL")),
        byte_loads=sum(1 for op in body if op.startswith("LDG") and op.endswith((".U8", ".S8"))),
        barriers=sum(1 for op in body if op.split(".")[0] == "BAR"),
        int8_mma=_count(body, INT8_MMA), fp8_mma=_count(body, FP8_MMA),
        bf16_mma=_count(body, BF16_MMA),
    )


def summary(sass: str, resources: str) -> dict:
    ops = collections.Counter(_opcode(m.group(2).strip()) for m in _INS.finditer(sass))
    reg = re.search(r"REG:(\d+)", resources)
    return dict(
        mma={k: v for k, v in ops.items() if _is_mma(k)},
        loads={k: v for k, v in ops.items() if k.startswith(("LDG", "LDGSTS", "UTMALDG"))},
        spill_ops=sum(v for k, v in ops.items() if k.split(".")[0] in ("LDL", "STL")),
        registers=int(reg.group(1)) if reg else None,
        loops=[loop_report(b) for b in mma_loops(sass)],
    )


def compile_launch(rec: dict, arch: str):
    """``triton.compile`` of one recorded launch for ``arch``, specialized as the launcher
    would (arguments divisible by 16)."""
    fn = getattr(importlib.import_module(rec["module"]), rec["name"])
    names = list(rec["signature"])
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in rec.get("aligned", ())}
    src = ASTSource(fn=fn, signature=rec["signature"], constexprs=rec["constexprs"], attrs=attrs)
    opts = {"num_warps": rec["num_warps"], "num_stages": rec["num_stages"]}
    if rec.get("maxnreg"):
        opts["maxnreg"] = rec["maxnreg"]
    return triton.compile(src, target=GPUTarget("cuda", CAPABILITY[arch], 32), options=opts)


def main(path: str, arch: str) -> int:
    def describe(rec):
        ck = compile_launch(rec, arch)
        cubin = ck.asm["cubin"]
        return dict(shared=ck.metadata.shared, tmem=getattr(ck.metadata, "tmem_size", 0) or 0,
                    **summary(_disassemble(cubin), _disassemble(cubin, "-res-usage")))

    return compile_each(path, lambda rec: {
        "name": rec["name"], "arch": arch, "constexprs": rec["constexprs"],
        "num_warps": rec["num_warps"], "num_stages": rec["num_stages"],
        "maxnreg": rec.get("maxnreg")}, describe)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
