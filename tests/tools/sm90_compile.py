"""Compile recorded fp8dit kernel launches for sm_90 on a machine without a GPU.

    python tests/tools/sm90_compile.py launches.json

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

SASS_OPS = ("IGMMA", "QGMMA", "HGMMA", "HMMA", "IMMA", "LDL", "STL", "UTMALDG")


def inner_loop_spills(sass: str) -> int:
    """LDL/STL inside the innermost loops that issue tensor-core MMAs (the kv-block loops).

    Spills in a work item's prologue or epilogue run once per item (hundreds of kv blocks);
    inside the MMA loop they run every block.
    """
    ins = [(int(m.group(1), 16), m.group(2)) for m in
           re.finditer(r"/\*([0-9a-f]{4,})\*/\s*([^;]*);", sass)]
    loops = []
    for addr, text in ins:
        m = re.search(r"BRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            loops.append((int(m.group(1), 16), addr))
    inner = [(a, b) for a, b in loops
             if not any((a, b) != (c, d) and a <= c and d <= b for c, d in loops)]
    count = 0
    for a, b in inner:
        body = [t for addr, t in ins if a <= addr <= b]
        if any("GMMA" in t for t in body):
            count += sum(1 for t in body if re.search(r"\b(LDL|STL)\b", t))
    return count


def main(path: str) -> int:
    assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "run without TRITON_INTERPRET"
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with open(path) as f:
        launches = json.load(f)
    status = 0
    for rec in launches:
        mod = importlib.import_module(rec["module"])
        fn = getattr(mod, rec["name"])
        out = {"name": rec["name"], "constexprs": rec["constexprs"]}
        try:
            src = ASTSource(fn=fn, signature=rec["signature"], constexprs=rec["constexprs"])
            ck = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": rec["num_warps"],
                                         "num_stages": rec["num_stages"],
                                         **({"maxnreg": rec["maxnreg"]}
                                            if rec.get("maxnreg") else {})})
            with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
                f.write(ck.asm["cubin"])
            sass = subprocess.run([os.path.join(bindir, "cuobjdump"), "-sass", f.name],
                                  capture_output=True, text=True, check=True).stdout
            os.unlink(f.name)
            ops = collections.Counter(re.findall(r"\b(" + "|".join(SASS_OPS) + r")\b", sass))
            out.update(ok=True, sass=dict(ops), shared=ck.metadata.shared,
                       loop_spills=inner_loop_spills(sass))
        except Exception as e:  # noqa: BLE001 - reported to the test
            out.update(ok=False, error=f"{type(e).__name__}: {str(e)[:2000]}")
            status = 1
        print(json.dumps(out), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
