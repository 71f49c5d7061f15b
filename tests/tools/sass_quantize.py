"""The quantization kernels' sm_90 SASS as the H200 runs them, on a machine without a GPU.

    PYTHONPATH=src python tests/tools/sass_quantize.py kv [--rows 32] [--dp 128]
    PYTHONPATH=src python tests/tools/sass_quantize.py q [--rows 32]
    PYTHONPATH=src python tests/tools/sass_quantize.py stats [--sub 4]

``--rope 1`` / ``--rope 2``: with Wan's rotary embedding fused in (fp32 / bf16 tables);
``--rope 3``: diffusers' ``apply_rotary_emb`` (whole fp32 cos and sin rows); ``--rope-range``:
tokens outside the tables' rows left as they are (HunyuanVideo's and CogVideoX's text).

Compiles one kernel with the constexprs of the warp-specialized path at Wan 720p and the
specializations a launch gets (pointers and the named integers divisible by 16, unit strides
constant), and prints its registers, shared memory and global/local memory instruction counts
(V^T's store went byte-wise once, ``STG.E.U8``, and showed here). ``--dump FILE`` writes the
SASS. Any Triton release (tests/test_sm90_compile.py runs it with the installed one).
"""

from __future__ import annotations

import argparse
import collections
import inspect
import json
import os
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fp8dit.kernels import quantize as Q

sys.path.insert(0, os.path.dirname(__file__))
from sm90_compile import _disassemble  # noqa: E402

OPS = r"\b(LDL|STL|LDG\.E[.\w]*|STG\.E[.\w]*|LDS[.\w]*|STS[.\w]*|BAR[.\w]*|SHFL[.\w]*)"


def compile_sm90(fn, types, const, warps, div16):
    # constexprs not named here compile at their defaults (NVIDIA's: FP8_MAX, FP8_FNUZ, HIP);
    # left out they would become runtime arguments
    const = {**{n: p.default for n, p in inspect.signature(fn.fn).parameters.items()
                if "constexpr" in str(p.annotation) and p.default is not inspect.Parameter.empty},
             **const}
    params = list(inspect.signature(fn.fn).parameters)
    sig = {n: "constexpr" if n in const
           else types.get(n, "*fp32" if n.endswith("_ptr") else "i32") for n in params}
    attrs = {(params.index(n),): [["tt.divisibility", 16]] for n in params
             if n not in const and (sig[n].startswith("*") or n in div16)}
    src = ASTSource(fn=fn, signature=sig, attrs=attrs,
                    constexprs={(params.index(k),): v for k, v in const.items()})
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    sass = _disassemble(ck.asm["cubin"])
    regs = int(re.search(r"REG:(\d+)", _disassemble(ck.asm["cubin"], "-res-usage")).group(1))
    return sass, dict(registers=regs, shared=ck.metadata.shared,
                      ops=dict(collections.Counter(re.findall(OPS, sass))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("kernel", choices=("kv", "q", "stats"))
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--dp", type=int, default=128)
    ap.add_argument("--sub", type=int, default=4)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"), help="q, k, v")
    ap.add_argument("--rope", type=int, default=0, choices=(0, 1, 2, 3))
    ap.add_argument("--rope-range", action="store_true")
    ap.add_argument("--rotate", action="store_true", help="the rotating recipes' transform")
    ap.add_argument("--balance", action="store_true", help="with --rotate: the balance recipes'")
    ap.add_argument("--dump", default="")
    a = ap.parse_args()
    rot = dict(ROTATE=a.rotate, BALANCE=a.rotate and a.balance)
    x = "*" + a.dtype
    ptr_types = dict(k_ptr=x, v_ptr=x, q_ptr=x, seq_ptr="*i32",
                   k8_ptr="*i8", q8_ptr="*i8", v8t_ptr="*fp8e4nv", bal_ptr="*fp32",
                   k8lo_ptr="*i8", q8lo_ptr="*i8", sm_scale="fp32", sm_scale_log2="fp32",
                   **{n: "*bf16" if a.rope == 2 else "*fp32" for n in ("cos_ptr", "sin_ptr")})
    rope = dict(ROPE=a.rope, HALF_D=a.dp // 2, ROPE_RANGE=a.rope_range)
    if a.kernel == "kv":
        const = dict(DP=a.dp, BLOCK_N=a.rows, QK_INT8=True, SOFT_FP8_CAST=False,
                     TENSOR_SCALES=False, PV_BF16=False, KV_PERM16=True,
                     TWO_TERM=False, SUBBLOCKS=256 // a.rows, KAMAX_FROM_STATS=a.rows < 256,
                     k_sd=1, v_sd=1, **rope, **rot)
        args = (Q.quantize_kv_kernel, ptr_types, const, max(4, a.rows * a.dp // 1024),
                ("k_sb", "k_st", "k_sh", "v_sb", "v_st", "v_sh", "D", "Tk_pad"))
    elif a.kernel == "q":
        const = dict(DP=a.dp, BLOCK_M=a.rows, SMOOTH_K=True, QK_INT8=True, SOFT_FP8_CAST=False,
                     TENSOR_SCALES=False, TWO_TERM=False,
                     SUBBLOCKS=max(1, 64 // a.rows), q_sd=1, **rope, **rot)
        args = (Q.quantize_q_kernel, ptr_types, const, max(4, a.rows * a.dp // 1024),
                ("q_sb", "q_st", "q_sh", "D", "Tq_pad"))
    else:
        const = dict(DP=a.dp, CHUNK=512, SUB=a.sub, KBLK=256,
                     k_sd=1, v_sd=1, SOFT_CAST=False, **rope, **rot)
        args = (Q.kv_channel_stats_kernel, ptr_types, const, 4,
                ("k_sb", "k_st", "k_sh", "v_sb", "v_st", "v_sh", "D"))
    sass, rep = compile_sm90(*args)
    print(json.dumps(dict(kernel=a.kernel, **{k: v for k, v in const.items()
                                               if k in ("DP", "BLOCK_N", "BLOCK_M", "SUB")},
                      **rep)))
    if a.dump:
        with open(a.dump, "w") as f:
            f.write(sass)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
