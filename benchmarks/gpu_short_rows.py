"""One H200 call: why the warp-specialized kernel loses at Flux's 4,608 keys (session 14).

    python3 benchmarks/gpu_short_rows.py [--out F] [--parts plan,stream]

Run s14-3: from 8,192 keys the warp-specialized kernel beats the Triton kernel by 26-33% end
to end, at 4,608 keys (18 of its 256-key steps per item) it loses (0.99 against 0.86 ms). This
prints, for each kernel at Flux's shape and at 8,192 keys, the plan (programs, work items,
split-KV partials and merges, the most kv blocks per program against the mean) and the
device time of every kernel of a call (torch.profiler, 20 calls), so the next change aims at
the part that costs: the items' prologue and epilogue, the balance, or a merge.

``stream`` (run s14-6 left it open: back to back, the warp-specialized call took 0.72 ms at
Flux against 458 us of host time and 0.40 ms of GPU time): per kernel, 50 calls back to back
between two events, and each call's host time with an idle GPU, for the whole call, the
quantization alone and the attention stage alone (pre-quantized), so the piece that makes the
host wait for the GPU shows.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import gpu_gluon  # noqa: E402
from gpu_forward_profile import kernel_times  # noqa: E402

import fp8dit  # noqa: E402
from fp8dit import launch  # noqa: E402
from fp8dit.recipes import get_recipe  # noqa: E402
from fp8dit.testing import make_qkv  # noqa: E402

SHAPES = [(1, 24, 4608, 128), (1, 24, 8192, 128)]


def _pieces(q, k, v) -> tuple[dict, object]:
    """The whole call, the quantization alone and the attention stage alone (pre-quantized),
    under the kernel ``FP8DIT_KERNEL`` names now; and which sm_90 kernel the stage runs."""
    B, S, H, D = q.shape
    rec, scale = get_recipe(None), D ** -0.5
    plan, cfg = launch.plan_for([S] * B, [S] * B, varlen=False, num_heads=H, num_kv_heads=H,
                                head_dim=D, is_causal=False, device=q.device, recipe=rec)
    sm90 = launch.use_gluon_sm90(plan, rec, q.device, cfg.get("kernel"))
    st = [launch._bthd_strides(t, "NHD") for t in (q, k, v, q)]
    out = torch.empty_like(q)
    lse = torch.empty(B, H, S, device=q.device, dtype=torch.float32)
    lse_st = (lse.stride(0), lse.stride(1), lse.stride(2))

    def quant():
        return quant.quantize_stage(plan, rec, scale, q, st[0], k, st[1], v, st[2],
                                    kv_perm16=sm90 is not None)

    ws = quant()

    def attn():
        launch.attention_stage(plan, cfg, ws, out, st[3], lse, lse_st, sm90=sm90)

    return {"call": lambda: fp8dit.attention(q, k, v, backend="fp8"),
            "quantize": quant, "attention": attn}, sm90


def part_stream():
    from gpu_host_overhead import host_us, stream_ms

    B, H, S, D = SHAPES[0]
    q, k, v = make_qkv(B, H, S, D, device="cuda", seed=0)
    for kname in ("triton", "gluon-ws"):
        os.environ["FP8DIT_KERNEL"] = kname
        pieces, sm90 = _pieces(q, k, v)
        for name, fn in pieces.items():
            fn()
            torch.cuda.synchronize()
            gpu_gluon.record(part="stream", kernel=kname, sm90=sm90, piece=name,
                             host_us=host_us(fn), stream_ms=stream_ms(fn))
    os.environ["FP8DIT_KERNEL"] = "auto"


def part_plan():
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


def main() -> int:
    return gpu_gluon.run_parts(globals(), "plan,stream")


if __name__ == "__main__":
    raise SystemExit(main())
