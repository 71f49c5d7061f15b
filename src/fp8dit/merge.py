"""Split-KV merge: the pieces of a work item split over the kv axis, combined by log-sum-exp.

Only a short last wave of the persistent schedule is split (:mod:`fp8dit.plan`); its partial
outputs and LSEs, in buffers the plan sized from the real number of pieces, are merged here
into the output and LSE in the caller's layout.
"""

from __future__ import annotations

from . import env
from .device import target_of
from .kernels.merge import merge_partials_kernel
from .plan import Plan
from .quantize import Workspace, tile_warps


def merge_stage(plan: Plan, ws: Workspace, tabs: dict, out, out_strides, lse,
                lse_strides) -> None:
    """Merge the plan's split pieces (``plan.n_reduce`` of them) into ``out`` and ``lse``."""
    if not plan.n_reduce:
        return
    key = plan.key
    Dp, BM = plan.head_dim_padded, key.block_m
    merge_partials_kernel[(plan.n_reduce,)](
        ws.part_o, ws.part_lse, tabs["reduce"], tabs["seq"],
        out, *out_strides, lse, *lse_strides, ws.q_corr, plan.q_total_padded, key.head_dim,
        DP=Dp, BLOCK_M=BM, SOFT_FP8_CAST=env.triton_interpret(),
        num_warps=tile_warps(BM, Dp, target_of(out.device).warp_size),
    )
