"""Compile recorded fp8dit kernel launches for sm_90 on a machine without a GPU.

    python tests/tools/sm90_compile.py launches.json
    python tests/tools/sm90_compile.py --gluon [--dump DIR]   # the warp-specialized kernel

Reads launches recorded by tests/test_sm90_compile.py (argument types, constexprs, warps,
stages), compiles each kernel with Triton's own compiler for an H100/H200 target, disassembles
the cubin with the cuobjdump that Triton ships, and prints one JSON line per launch with what
the SASS holds. Must run without TRITON_INTERPRET (compiled, not interpreted, kernels).

``--gluon`` first records, in a subprocess under the interpreter, the launches of the
warp-specialized Gluon kernel (``kernels.attention_sm90_ws``) exactly as ``attend`` makes them
for every tile configuration it ships (``attend.WS_TILES``, ``attend.WS_CAUSAL_TILES``: head
dims 64 and 128, causal and not; the launch itself needs a GPU and is not made), then compiles
each and describes its kv loops. ``--dump DIR`` also writes each compile's TTGIR, LLVM IR, PTX
and SASS there (docs/triton_releases.md compares them across Triton releases).
"""

from __future__ import annotations

import collections
import hashlib
import importlib
import inspect
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


def triton_release() -> str:
    """This Triton's release, "major.minor" (the key of the tests' per-release bounds)."""
    return ".".join(triton.__version__.split(".")[:2])


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


def _instructions(sass: str) -> list[tuple[int, str]]:
    return [(int(m.group(1), 16), m.group(2).strip()) for m in
            re.finditer(r"/\*([0-9a-f]{4,})\*/\s*([^;]*);", sass)]


def sass_sha256(sass: str) -> str:
    """Hash of the instruction text (line info and encodings left out): equal hashes, equal
    code."""
    text = "\n".join(t for _, t in _instructions(sass))
    return hashlib.sha256(text.encode()).hexdigest()


def mma_loops(sass: str) -> list[list[str]]:
    """Bodies (instruction texts) of the innermost loops that issue tensor-core MMAs."""
    ins = _instructions(sass)
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


# --- the warp-specialized Gluon kernel ------------------------------------------------------

WS_FLAGS = ("P_REGS", "ROWSUM_DOT", "SPLIT_KV", "K_SUB", "CONSUMER_REGS", "TWO_LEVEL")


def record_ws_launches() -> list[dict]:
    """The warp-specialized kernel's launches as ``attend._attention_sm90`` makes them, one per
    shipped tile configuration (head dims 64 and 128, causal and not), with the kernel swapped
    for a recorder: argument types and constexprs. Runs under the interpreter (CPU tensors: the
    quantization runs, the Gluon kernel is never launched)."""
    import torch

    from fp8dit import attend
    from fp8dit.recipes import DEFAULT_RECIPE, get_recipe

    mod = attend._gluon_sm90_module("attention_sm90_ws")
    assert mod is not None, "kernels.attention_sm90_ws does not import with this Triton"
    kernel = mod.attention_fwd_sm90_ws_kernel
    params = inspect.signature(kernel.fn).parameters
    names = list(params)
    constexpr = {n for n, p in params.items() if "constexpr" in str(p.annotation)}
    dtypes = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
              torch.int32: "i32", torch.int8: "i8", torch.float8_e4m3fn: "fp8e4nv"}
    sink = []

    def arg_type(value):
        if isinstance(value, torch.Tensor):
            return "*" + dtypes[value.dtype]
        if hasattr(value, "block_shape") and hasattr(value, "layout"):  # Gluon descriptor
            shape = ", ".join(str(int(s)) for s in value.block_shape)
            return f"tensordesc<{dtypes[value.base.dtype]}[{shape}],{value.layout!r}>"
        if isinstance(value, int):
            return "i32" if -(2**31) <= value < 2**31 else "i64"
        raise TypeError(f"unexpected kernel argument {type(value).__name__}")

    class Recorder:
        fn = kernel.fn

        def __getitem__(self, grid):
            def run(*args, **kwargs):
                num_warps = kwargs.get("num_warps", 4)
                bound = {n: p.default for n, p in params.items()
                         if p.default is not inspect.Parameter.empty}
                bound.update(zip(names, args))
                bound.update(kwargs)
                sink.append(dict(
                    signature={n: "constexpr" if n in constexpr else arg_type(bound[n])
                               for n in names},
                    constexprs={n: bound[n] for n in names if n in constexpr},
                    num_warps=num_warps))
            return run

    g = torch.Generator().manual_seed(0)
    recipe = get_recipe(DEFAULT_RECIPE)
    saved = (mod.attention_fwd_sm90_ws_kernel, attend._gluon_ws_possible,
             os.environ.get("FP8DIT_KERNEL"))
    mod.attention_fwd_sm90_ws_kernel = Recorder()
    attend._gluon_ws_possible = lambda device: True  # the tiles of an sm_90 GPU
    os.environ["FP8DIT_KERNEL"] = "gluon-ws"
    try:
        for causal in (False, True):
            for dp in sorted(attend.WS_TILES):
                S, H = 600, 2
                q, k, v = (torch.randn(1, S, H, dp, generator=g).bfloat16() for _ in range(3))
                plan, cfg = attend.plan_for([S], [S], varlen=False, num_heads=H,
                                            num_kv_heads=H, head_dim=dp, is_causal=causal,
                                            device=q.device, recipe=recipe)
                assert cfg["kernel"] == "gluon-ws" and plan.key.block_m == 128, cfg
                st = attend._bthd_strides(q, "NHD")
                ws = attend.quantize_stage(plan, recipe, dp ** -0.5, q, st, k, st, v, st,
                                           kv_perm16=True)
                out = torch.empty_like(q)
                lse = torch.empty(1, H, S)
                # its Gluon kernel's name, where it still takes one
                which = (("gluon-ws",) if "sm90" in
                         inspect.signature(attend._attention_sm90).parameters else ())
                attend._attention_sm90(plan, cfg, ws, plan.tables(q.device), out, st, lse,
                                       (lse.stride(0), lse.stride(1), lse.stride(2)), *which)
                sink[-1].update(dp=dp, causal=causal)
    finally:
        mod.attention_fwd_sm90_ws_kernel, attend._gluon_ws_possible = saved[:2]
        if saved[2] is None:
            os.environ.pop("FP8DIT_KERNEL")
        else:
            os.environ["FP8DIT_KERNEL"] = saved[2]
    return sink


def gluon_ws_report(rec: dict, dump: str | None = None) -> dict:
    """Compile one recorded launch of the warp-specialized kernel for sm_90 and describe its
    kv loops: per loop (main, then masked tail, for each consumer warpgroup) instructions,
    spills (LDL/STL), registers named, tensor-core instructions; the SASS hash."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from fp8dit.kernels import attention_sm90_ws

    kernel = attention_sm90_ws.attention_fwd_sm90_ws_kernel
    names = list(inspect.signature(kernel.fn).parameters)
    const = rec["constexprs"]
    src = GluonASTSource(fn=kernel, signature=rec["signature"],
                         constexprs={(names.index(k),): v for k, v in const.items()})
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": rec["num_warps"]})
    sass = _disassemble(ck.asm["cubin"])
    usage = _disassemble(ck.asm["cubin"], "-res-usage")
    stack = re.search(r"STACK:(\d+)", usage)
    out = {"dp": rec["dp"], "causal": rec["causal"], "block_n": const["BLOCK_N"],
           "stages": const["STAGES"],
           "flags": {k: const[k] for k in WS_FLAGS if k in const},
           "shared": ck.metadata.shared, "stack": int(stack.group(1)) if stack else None,
           "spills": _spills([t for _, t in _instructions(sass)]),
           "sass_sha256": sass_sha256(sass),
           "loops": [_loop_report(body) for body in mma_loops(sass)]}
    if dump:
        os.makedirs(dump, exist_ok=True)
        tag = f"ws_d{rec['dp']}_{'causal' if rec['causal'] else 'dense'}"
        for ext, text in list(ck.asm.items()) + [("sass", sass)]:
            if isinstance(text, str):
                with open(os.path.join(dump, f"{tag}.{ext}"), "w") as f:
                    f.write(text)
    return out


def _gluon(dump: str | None) -> int:
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, __file__, "--record-gluon"], capture_output=True,
                          text=True, env=env, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[")]
    if proc.returncode or not lines:
        print(proc.stderr[-3000:], file=sys.stderr)
        return 1
    status = 0
    for rec in json.loads(lines[-1]):
        try:
            rep = dict(ok=True, **gluon_ws_report(rec, dump))
        except Exception as e:  # noqa: BLE001 - reported to the test
            rep = dict(ok=False, dp=rec["dp"], causal=rec["causal"],
                       error=f"{type(e).__name__}: {str(e)[:2000]}")
            status = 1
        print(json.dumps(dict(triton=triton.__version__, **rep)), flush=True)
    return status


def main(argv: list[str]) -> int:
    if argv[0] == "--record-gluon":
        print(json.dumps(record_ws_launches()), flush=True)
        return 0
    assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "run without TRITON_INTERPRET"
    if argv[0] == "--gluon":
        return _gluon(argv[2] if argv[1:2] == ["--dump"] else None)
    with open(argv[0]) as f:
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
            sass = _disassemble(ck.asm["cubin"])
            ops = collections.Counter(re.findall(r"\b(" + "|".join(SASS_OPS) + r")\b", sass))
            out.update(ok=True, sass=dict(ops), shared=ck.metadata.shared,
                       loop_spills=inner_loop_spills(sass),
                       loops=[_loop_report(body) for body in mma_loops(sass)],
                       sass_sha256=sass_sha256(sass))
        except Exception as e:  # noqa: BLE001 - reported to the test
            out.update(ok=False, error=f"{type(e).__name__}: {str(e)[:2000]}")
            status = 1
        print(json.dumps(out), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
