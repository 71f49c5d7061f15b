"""Compile recorded fp8dit kernel launches for AMD Instinct GPUs on a machine without one.

    python tests/tools/hip_compile.py launches.json gfx942    # MI300X / MI325X
    python tests/tools/hip_compile.py launches.json gfx950    # MI350X / MI355X

Reads launches recorded by tests/tools/launches.py under ``fp8dit.device.interpret_as(arch)``
(argument types, constexprs, wavefronts, stages, waves_per_eu), compiles each with Triton's own
compiler for the HIP target (64-wide wavefronts), and prints one JSON line per launch with what
its AMDGPU ISA holds: matrix (MFMA) instructions by kind, fp8 conversions, registers, spills,
and the kv loops' spills. Must run without TRITON_INTERPRET (compiled, not interpreted, kernels).
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

# fp32 -> fp8 conversions: gfx942's (fnuz) and gfx950's (OCP, with a scale operand)
FP8_CVT = ("v_cvt_pk_fp8_f32", "v_cvt_scalef32_pk_fp8_f32")
SPILL = re.compile(r"scratch_(load|store)_\w+")


def _instructions(isa: str) -> list[tuple[str, str]]:
    """(label of the enclosing basic block, instruction text) of the kernel's code."""
    out, label = [], ""
    for line in isa.splitlines():
        s = line.split(";")[0].strip()
        if not s or s.startswith("."):
            m = re.match(r"(\.LBB\w+):", s)
            if m:
                label = m.group(1)
            continue
        if s.endswith(":"):
            continue
        out.append((label, s))
    return out


def mfma_loops(isa: str) -> list[list[str]]:
    """Bodies of the innermost loops (a branch back to an earlier block) that issue MFMAs:
    the kv-block loops of the attention kernel."""
    ins = _instructions(isa)
    first = {}
    for i, (label, _) in enumerate(ins):
        first.setdefault(label, i)
    loops = []
    for i, (_, text) in enumerate(ins):
        m = re.match(r"s_(cbranch_\w+|branch)\s+(\.LBB\w+)", text)
        if m and m.group(2) in first and first[m.group(2)] <= i:
            loops.append((first[m.group(2)], i))
    inner = [(a, b) for a, b in loops
             if not any((a, b) != (c, d) and a <= c and d <= b for c, d in loops)]
    bodies = [[t for _, t in ins[a:b + 1]] for a, b in inner]
    return [b for b in bodies if any(t.startswith("v_mfma") for t in b)]


def _meta(isa: str, key: str) -> int | None:
    m = re.search(rf"^\s*;?\s*\.?{re.escape(key)}:?\s+(\d+)", isa, re.M)
    return int(m.group(1)) if m else None


def summary(isa: str) -> dict:
    """What a kernel's ISA holds (the JSON fields this tool prints)."""
    text = [t for _, t in _instructions(isa)]
    mnem = collections.Counter(t.split()[0] for t in text)
    loops = mfma_loops(isa)
    return dict(
        mfma={k: v for k, v in mnem.items() if k.startswith("v_mfma")},
        fp8_cvt=sum(mnem.get(k, 0) for k in FP8_CVT),
        vgprs=_meta(isa, "NumVgprs"), agprs=_meta(isa, "NumAgprs"),
        sgprs=_meta(isa, "TotalNumSgprs"), occupancy=_meta(isa, "Occupancy"),
        scratch=_meta(isa, "ScratchSize"),
        vgpr_spills=_meta(isa, "vgpr_spill_count"), sgpr_spills=_meta(isa, "sgpr_spill_count"),
        spill_ops=sum(1 for t in text if SPILL.match(t)),
        loops=[dict(instructions=len(b), spill_ops=sum(1 for t in b if SPILL.match(t)),
                    mfma=sum(1 for t in b if t.startswith("v_mfma")),
                    fp8_cvt=sum(1 for t in b if t.split()[0] in FP8_CVT),
                    lds_ops=sum(1 for t in b if t.startswith("ds_")))
               for b in loops],
    )


def compile_launch(rec: dict, arch: str):
    """``triton.compile`` of one recorded launch for ``arch``."""
    fn = getattr(importlib.import_module(rec["module"]), rec["name"])
    src = ASTSource(fn=fn, signature=rec["signature"], constexprs=rec["constexprs"])
    opts = {"num_warps": rec["num_warps"], "num_stages": rec["num_stages"]}
    if rec.get("waves_per_eu"):
        opts["waves_per_eu"] = rec["waves_per_eu"]
    return triton.compile(src, target=GPUTarget("hip", arch, 64), options=opts)


def table(results: list[dict]) -> str:
    """A fixed-width table of compiled launches (tests/test_hip_compile.py prints it): per kernel
    its variant, registers, spills, LDS, matrix instructions, and each kv loop's instructions /
    spill instructions (the unmasked loop first)."""
    rows = [("arch", "kernel", "DP", "variant", "tile", "w/st", "VGPR", "spill", "LDS KB",
             "MFMA", "cvt/loop", "kv loops: instr/spill")]
    for r in results:
        c = r["constexprs"]
        variant = ("int8x2" if c.get("QK_TWO_TERM") or c.get("TWO_TERM") else
                   "int8" if c.get("QK_INT8") else "fp8" if "QK_INT8" in c else "")
        if "PV_BF16" in c:
            variant += "/bf16" if c["PV_BF16"] else "/fp8"
        if c.get("BALANCE"):
            variant += " bal"
        elif c.get("ROTATE"):
            variant += " rot"
        if c.get("TENSOR_SCALES"):
            variant += " tensor"
        if c.get("IS_CAUSAL"):
            variant += " causal"
        if r.get("out") == "*fp16":
            variant += " fp16"
        if c.get("ROPE"):
            variant += f" rope{c['ROPE']}"
        tile = (f"{c['BLOCK_M']}x{c['BLOCK_N']}" if "BLOCK_M" in c and "BLOCK_N" in c
                else str(c.get("BLOCK_M") or c.get("BLOCK_N") or ""))
        if not r.get("ok"):
            rows.append((r["arch"], r["name"], str(c.get("DP")), variant, tile, "", "", "", "",
                         "FAILED", "", ""))
            continue
        mfma = " ".join(f"{n}:{k.removeprefix('v_mfma_')}" for k, n in sorted(r["mfma"].items()))
        loops = " ".join(f"{lp['instructions']}/{lp['spill_ops']}" for lp in r["loops"])
        rows.append((r["arch"], r["name"].removesuffix("_kernel"), str(c.get("DP")), variant,
                     tile, f"{r['num_warps']}/{r['num_stages']}", str(r["vgprs"]),
                     str(r["vgpr_spills"]), f"{r['shared'] / 1024:g}", mfma or "-",
                     "/".join(str(lp["fp8_cvt"]) for lp in r["loops"]) or str(r["fp8_cvt"]),
                     loops or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(f.ljust(w) for f, w in zip(row, widths)).rstrip() for row in rows)


def main(path: str, arch: str) -> int:
    def describe(rec):
        ck = compile_launch(rec, arch)
        return dict(shared=ck.metadata.shared, **summary(ck.asm["amdgcn"]))

    return compile_each(path, lambda rec: {
        "name": rec["name"], "arch": arch, "constexprs": rec["constexprs"],
        "num_warps": rec["num_warps"], "num_stages": rec["num_stages"],
        "waves_per_eu": rec.get("waves_per_eu"), "out": rec["signature"].get("out_ptr")},
        describe)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
