"""Compile recorded fp8dit kernel launches for sm_90 on a machine without a GPU.

    python tests/tools/sm90_compile.py launches.json
    python tests/tools/sm90_compile.py --gluon          # the warp-specialized Gluon kernel
    python tests/tools/sm90_compile.py --gluon --dump DIR   # and its TTGIR, LLVM IR, PTX, SASS

Reads launches recorded by tests/test_sm90_compile.py (argument types, constexprs, warps,
stages), compiles each kernel with Triton's own compiler for an H100/H200 target, disassembles
the cubin with the cuobjdump that Triton ships, and prints one JSON line per launch with what
the SASS holds. Must run without TRITON_INTERPRET (compiled, not interpreted, kernels).
"""

from __future__ import annotations

import collections
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.dirname(__file__))
from compile_each import compile_each  # noqa: E402

SASS_OPS = ("IGMMA", "QGMMA", "HGMMA", "HMMA", "IMMA", "LDL", "STL", "UTMALDG")


def _disassemble(cubin: bytes, what: str = "-sass") -> str:
    """cuobjdump's ``what`` page of a cubin (``-sass``, or ``-res-usage`` for registers)."""
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        return subprocess.run([os.path.join(bindir, "cuobjdump"), what, f.name],
                              capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)


def mma_loops(sass: str) -> list[list[str]]:
    """Bodies (instruction texts) of the innermost loops that issue tensor-core MMAs."""
    ins = [(int(m.group(1), 16), m.group(2)) for m in
           re.finditer(r"/\*([0-9a-f]{4,})\*/\s*([^;]*);", sass)]
    loops = []
    for addr, text in ins:
        m = re.search(r"BRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            loops.append((int(m.group(1), 16), addr))
    inner = [(a, b) for a, b in loops
             if not any((a, b) != (c, d) and a <= c and d <= b for c, d in loops)]
    bodies = [[t for addr, t in ins if a <= addr <= b] for a, b in inner]
    return [b for b in bodies if any("GMMA" in t for t in b)]


def inner_loop_spills(sass: str) -> int:
    """LDL/STL inside the innermost loops that issue tensor-core MMAs (the kv-block loops).

    Spills in a work item's prologue or epilogue run once per item (hundreds of kv blocks);
    inside the MMA loop they run every block.
    """
    return sum(_spills(body) for body in mma_loops(sass))


def _spills(body: list[str]) -> int:
    return sum(1 for t in body if re.search(r"\b(LDL|STL)\b", t))


def loop_registers(body: list[str]) -> int:
    """Distinct registers a loop body names (a wgmma's accumulator and A-operand ranges
    counted whole): what the loop holds, out of the warpgroup's register budget."""
    regs = set()
    for t in body:
        regs.update(int(r) for r in re.findall(r"\bR(\d+)\b", t))
        m = re.search(r"GMMA\.64x(\d+)x\d+\S* R(\d+), (R(\d+)|gdesc)", t)
        if m:  # 64xN fp32/int32 accumulator: N / 2 registers a thread; A from registers: 4
            regs.update(range(int(m.group(2)), int(m.group(2)) + int(m.group(1)) // 2))
            if m.group(4):
                regs.update(range(int(m.group(4)), int(m.group(4)) + 4))
    return len(regs)


def _loop_report(body: list[str]) -> dict:
    """``exp_under_pv``: MUFU.EX2 between the wait for the QK dot (``DEPBAR.LE gsb0, 0x1``,
    PV still in flight) and the wait for the PV dot (``0x0``): the softmax the 128-key loop
    exists to overlap with the PV dot (ptxas moves that wait when it reuses the P registers or
    meets a branch, and then this drops to ~0; the 256-key step waits for its PV dots within
    the step, so 0 there)."""
    waits = [i for i, t in enumerate(body) if "WARPGROUP.DEPBAR.LE" in t]
    under = 0
    for i in waits:
        if body[i].rstrip().endswith("0x1"):
            j = next((w for w in waits if w > i and body[w].rstrip().endswith("0x0")),
                     len(body))
            under = max(under, sum("MUFU.EX2" in t for t in body[i:j]))
    return {
        "instructions": len(body),
        "spills": _spills(body),
        "stl": sum(1 for t in body if re.search(r"\bSTL\b", t)),
        "registers": loop_registers(body),
        "exp_under_pv": under,
        "igmma": sum("IGMMA" in t for t in body), "qgmma": sum("QGMMA" in t for t in body),
    }


def gluon_attention_report(dp: int, causal: bool, dump: str | None = None) -> dict:
    """Compile ``kernels.attention_sm90_ws`` for sm_90 with this Triton's own code generation,
    as the dispatcher launches it at padded head dim ``dp`` (``tuning.gluon_tiles``,
    ``gluon_causal_tiles`` when ``causal``) and specialized as real launches are
    (``fp8dit.prebuilt.ast_source``), and describe its kv loops' SASS (:func:`_loop_report`).
    ``dump``: a folder that receives the compiled stages (``D<dp>-<dense|causal>.ttgir``,
    ``.llir``, ``.ptx``, ``.sass``)."""
    from fp8dit import prebuilt

    const = prebuilt.config_constexprs(dp, causal)
    ck = triton.compile(prebuilt.ast_source(dp, causal), target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": 4})
    out = {"dp": dp, "causal": causal, "block_n": const["BLOCK_N"],
           "shared": ck.metadata.shared, "loops": []}
    sass = _disassemble(ck.asm["cubin"])
    out["loops"] = [_loop_report(body) for body in mma_loops(sass)]
    if dump:
        os.makedirs(dump, exist_ok=True)
        stem = os.path.join(dump, f"D{dp}-{'causal' if causal else 'dense'}")
        for ext in ("ttgir", "llir", "ptx"):
            with open(f"{stem}.{ext}", "w") as f:
                f.write(ck.asm[ext])
        with open(f"{stem}.sass", "w") as f:
            f.write(sass)
    return out


def main(path: str, dump: str | None = None) -> int:
    if path == "--gluon":
        for dp in (64, 128):
            for causal in (False, True):
                try:
                    rep = dict(ok=True, **gluon_attention_report(dp, causal, dump))
                except Exception as e:  # noqa: BLE001 - reported to the test
                    rep = dict(ok=False, dp=dp, causal=causal,
                               error=f"{type(e).__name__}: {str(e)[:2000]}")
                print(json.dumps(rep), flush=True)
        return 0

    def describe(rec):
        fn = getattr(importlib.import_module(rec["module"]), rec["name"])
        src = ASTSource(fn=fn, signature=rec["signature"], constexprs=rec["constexprs"])
        ck = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": rec["num_warps"],
                                     "num_stages": rec["num_stages"],
                                     **({"maxnreg": rec["maxnreg"]}
                                        if rec.get("maxnreg") else {})})
        sass = _disassemble(ck.asm["cubin"])
        ops = collections.Counter(re.findall(r"\b(" + "|".join(SASS_OPS) + r")\b", sass))
        return dict(sass=dict(ops), shared=ck.metadata.shared,
                    loop_spills=inner_loop_spills(sass),
                    loops=[_loop_report(body) for body in mma_loops(sass)])

    return compile_each(path, lambda rec: {"name": rec["name"],
                                           "constexprs": rec["constexprs"]}, describe)


if __name__ == "__main__":
    args = sys.argv[1:]
    dump = args[args.index("--dump") + 1] if "--dump" in args else None
    sys.exit(main(args[0], dump))
