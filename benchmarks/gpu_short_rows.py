"""One H200 call: why the warp-specialized kernel loses at Flux's 4,608 keys (session 14).

    python3 benchmarks/gpu_short_rows.py [--out F]

Run s14-3: from 8,192 keys the warp-specialized kernel beats the Triton kernel by 26-33% end
to end, at 4,608 keys (18 of its 256-key steps per item) it loses (0.99 against 0.86 ms). This
prints, for each kernel at Flux's shape and at 8,192 keys, the plan (programs, work items,
split-KV partials and merges, the most kv blocks per program against the mean) and the
device time of every kernel of a call (torch.profiler, 20 calls), so the next change aims at
the part that costs: the items' prologue and epilogue, the balance, or a merge.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import gpu_gluon  # noqa: E402
from gpu_forward_profile import kernel_times  # noqa: E402

import fp8dit  # noqa: E402
from fp8dit import launch  # noqa: E402
from fp8dit.recipes import get_recipe  # noqa: E402
from fp8dit.testing import make_qkv  # noqa: E402

SHAPES = [(1, 24, 4608, 128), (1, 24, 8192, 128)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    gpu_gluon.record_env()
    for B, H, S, D in SHAPES:
        q, k, v = make_qkv(B, H, S, D, device="cuda", seed=0)
        for kname in ("triton", "gluon-ws"):
            os.environ["FP8DIT_KERNEL"] = kname
            try:
                plan, cfg = launch.plan_for([S] * B, [S] * B, varlen=False, num_heads=H,
                                            num_kv_heads=H, head_dim=D, is_causal=False,
                                            device=q.device, recipe=get_recipe(None))
                loads = plan.program_loads
                fp8dit.attention(q, k, v, backend="fp8")  # compile, plan cached
                per, total = kernel_times(
                    lambda q=q, k=k, v=v: fp8dit.attention(q, k, v, backend="fp8"), 20)
                gpu_gluon.record(
                    part="short-rows", shape=[B, H, S, D], kernel=kname,
                    block_m=plan.key.block_m, block_n=plan.key.block_n,
                    programs=plan.num_programs, work_items=plan.n_work,
                    partials=plan.n_partials, merges=plan.n_reduce,
                    kv_blocks_max=int(loads.max()), kv_blocks_mean=float(loads.mean()),
                    device_ms=total, kernels_ms={n: round(t, 4) for n, t in per.items()})
            except Exception as e:  # noqa: BLE001 - keep the other kernel's row
                gpu_gluon.record(part="short-rows", shape=[B, H, S, D], kernel=kname,
                                 error=f"{type(e).__name__}: {e}"[:400])
        os.environ["FP8DIT_KERNEL"] = "auto"
    gpu_gluon.write_rows(a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
