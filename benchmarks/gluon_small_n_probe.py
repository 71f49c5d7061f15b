"""Does a Gluon warpgroup_mma with a narrow B (N = 8 or 16, fp8, from shared memory) give
A @ B on this GPU? (Session 7: P's row sums as P @ ones, two such dots after the PV dots of
the warp-specialized kernel's 256-key step, came out wrong there, commits 4a274e6/26dab6a.)

    python3 benchmarks/gluon_small_n_probe.py

Prints, per N and B (ones, random): max |gluon - torch| against the fp32 reference. Run s7-3
(H200, triton 3.6): exact to fp32 rounding for N = 8, 16, 32 (max error 0.08 on sums up to
577), so the narrow dot alone is not what broke the kernel. Session 10 adds A ranges up to the
e4m3 maximum (the kernel's P reaches 256).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)


@gluon.jit
def small_n_kernel(a_ptr, b_ptr, c_ptr, M: gl.constexpr, K: gl.constexpr, N: gl.constexpr,
                   A_REGS: gl.constexpr = False):
    ld: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])
    rm = gl.arange(0, M, layout=gl.SliceLayout(1, ld))
    rk = gl.arange(0, K, layout=gl.SliceLayout(0, ld))
    rn = gl.arange(0, N, layout=gl.SliceLayout(1, ld))
    a = gl.load(a_ptr + gl.expand_dims(rm, 1) * K + gl.expand_dims(rk, 0))
    b = gl.load(b_ptr + gl.expand_dims(rn, 1) * K + gl.expand_dims(rk, 0))  # [N, K]
    a_s = gl.allocate_shared_memory(gl.float8e4nv, [M, K],
                                    gl.NVMMASharedLayout.get_default_for([M, K], gl.float8e4nv))
    b_s = gl.allocate_shared_memory(gl.float8e4nv, [N, K],
                                    gl.NVMMASharedLayout.get_default_for([N, K], gl.float8e4nv))
    a_s.store(a)
    b_s.store(b)
    fence_async_shared()
    gl.thread_barrier()
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, N, 32])
    acc = gl.zeros([M, N], gl.float32, acc_l)
    if A_REGS:  # A from registers (the RS form of the row-sum dot)
        a_r = a_s.load(gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=4))
        tok = warpgroup_mma(a_r, b_s.permute((1, 0)), acc, use_acc=False, is_async=True)
    else:
        tok = warpgroup_mma(a_s, b_s.permute((1, 0)), acc, use_acc=False, is_async=True)
    acc = warpgroup_mma_wait(0, deps=[tok])
    om = gl.arange(0, M, layout=gl.SliceLayout(1, acc_l))
    on = gl.arange(0, N, layout=gl.SliceLayout(0, acc_l))
    gl.store(c_ptr + gl.expand_dims(om, 1) * N + gl.expand_dims(on, 0), acc)


def main() -> int:
    torch.manual_seed(0)
    M, K = 64, 128
    # A ranges: session 7's (< 8), the softmax P of the 256-key loop (2^(8 - x), up to 256) and
    # the whole e4m3 range (run s10-3 read the row-sum dot as if P >= 128 were lost)
    a_kinds = {
        "small": lambda: torch.rand(M, K, device="cuda") * 8,
        "p-like": lambda: torch.exp2(8 - torch.rand(M, K, device="cuda") * 6),
        "large": lambda: torch.rand(M, K, device="cuda") * 448,
    }
    for a_kind, make_a in a_kinds.items():
        a = make_a().to(torch.float8_e4m3fn)
        cases = [(n, k, r) for n in (8, 16, 32, 128) for k in ("ones", "random")
                 for r in (False, True)]
        for N, kind, regs in cases:
            name = f"A={a_kind}{' regs' if regs else ''} N={N} B={kind}"
            b = (torch.ones(N, K, device="cuda") if kind == "ones"
                 else torch.randn(N, K, device="cuda")).to(torch.float8_e4m3fn)
            c = torch.empty(M, N, device="cuda")
            try:
                small_n_kernel[(1,)](a, b, c, M, K, N, regs, num_warps=4)
                ref = a.float() @ b.float().T
                print(f"{name}: max|err| {(c - ref).abs().max().item():.3g} (ref max "
                      f"{ref.abs().max().item():.3g}; sum ratio "
                      f"{(c.sum() / ref.sum()).item():.4f})", flush=True)
            except Exception as e:  # noqa: BLE001 - a failure is a result
                print(f"{name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
