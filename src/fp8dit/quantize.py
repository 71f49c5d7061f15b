"""Host side of the fused quantization: the plan-sized workspace and the launches of
:mod:`fp8dit.kernels.quantize` (channel statistics -> K/V -> Q) that fill it.

The attention launches (:mod:`fp8dit.attend`) read the workspace. The launch shape (rows per
program, the statistics pass's sub-tile and warps) is :class:`fp8dit.tuning.Quantization`: it
changes speed only, the workspace stays bitwise the same, except that the statistics' sub-tile
sets the order of its fp32 sums (the channel means' last bits). ``tests/test_sm90_gluon.py``
runs the GPU's sizes against the interpreter's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import env, tuning
from .device import fp8_format, target_of
from .kernels.quantize import (
    N_STATS,
    ROPE_FOUR,
    ROPE_FP32,
    ROPE_NONE,
    ROPE_ROUNDED,
    abs_max_finalize_kernel,
    kv_channel_stats_kernel,
    kv_stats_finalize_kernel,
    qkv_abs_max_kernel,
    quantize_kv_kernel,
    quantize_q_kernel,
)
from .plan import Plan
from .recipes import Recipe

BAL_MODE = 6  # x . u: 1 tl.sum, 5 the halving tree, 6 integers on a per-row grid

LOG2E = 1.4426950408889634


_HADAMARD: dict[tuple[int, str], torch.Tensor] = {}


def hadamard(n: int, device: torch.device) -> torch.Tensor:
    """Orthonormal Sylvester-Hadamard matrix [n, n] fp32 (n a power of two), cached per device:
    the rotation of the ``rotate`` recipes, which the quantization kernels apply without it
    (``kernels.quantize._rotate``, a fast Walsh-Hadamard transform); the emulation's reference
    (``fp8dit.testing``)."""
    key = (n, str(device))
    h = _HADAMARD.get(key)
    if h is None:
        h = torch.ones(1, 1, dtype=torch.float64)
        while h.shape[0] < n:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        h = _HADAMARD[key] = (h / n ** 0.5).to(device=device, dtype=torch.float32)
    return h


@dataclass
class Workspace:
    """Quantized operands and partial buffers of one call, sized by the plan."""

    q8: torch.Tensor  # [H, Tq_pad, Dp] int8 or fp8
    q_scale: torch.Tensor  # [H, Tq_pad] fp32, softmax scale * log2(e) folded in
    q_corr: torch.Tensor  # [H, Tq_pad] fp32, K-smoothing shift of the LSE
    k8: torch.Tensor  # [Hkv, Tk_pad, Dp]
    k_scale: torch.Tensor  # [Hkv, n_kblocks] fp32, one per kv block
    v8t: torch.Tensor  # [Hkv, Dp, Tk_pad] fp8, or bf16 when pv_bf16 (transposed)
    v_scale: torch.Tensor  # [B, Hkv, Dp] fp32
    v_mean: torch.Tensor  # [B, Hkv, Dp] fp32
    part_o: torch.Tensor  # [n_partials, BLOCK_M, Dp] fp32
    part_lse: torch.Tensor  # [n_partials, BLOCK_M] fp32
    qk_int8: bool
    pv_bf16: bool = False
    # recipes with qk_terms=2: the int8 rounding residuals of q8 and k8 (same layouts)
    q8lo: torch.Tensor | None = None
    k8lo: torch.Tensor | None = None

    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size() for t in vars(self).values()
            if isinstance(t, torch.Tensor)
        )


def tile_warps(rows: int, cols: int, warp_size: int = 32) -> int:
    """Warps for an elementwise kernel holding an fp32 [rows, cols] tile: about 32 values per
    thread. With more, the sm_90 SASS of the quantization and merge kernels spilled registers
    (tests/test_sm90_compile.py reads it). ``warp_size``: 64 on AMD GPUs (wavefronts), where a
    program has at most 16 of them."""
    return min(1024 // warp_size, max(4, rows * cols // (32 * warp_size)))


def quantize_stage(plan: Plan, recipe: Recipe, scale: float,
                   q, q_strides, k, k_strides, v, v_strides, kv_perm16: bool = False,
                   tabs: dict | None = None, rope: torch.Tensor | None = None,
                   rope_start: int = 0) -> Workspace:
    """Fused quantization of Q, K, V (three launches) into a plan-sized workspace. ``tabs``:
    the plan's device tables, or a call's copy (``device_k_lens``). ``rope``: rotary tables
    (:func:`fp8dit.rope.rope_tables`) that Q and K are rotated by as they are loaded, from
    token ``rope_start`` on."""
    key = plan.key
    dev = q.device
    B, H, Hkv, D = len(key.q_lens), key.num_heads, key.num_kv_heads, key.head_dim
    Dp, BM, BN = plan.head_dim_padded, key.block_m, key.block_n
    soft = env.triton_interpret()
    tgt, fmt = target_of(dev), fp8_format(dev)
    qk_int8 = recipe.qk == "int8"
    pv_bf16 = recipe.pv == "bf16"
    tensor_scales = recipe.scales == "tensor"
    tabs = tabs or plan.tables(dev)
    f32 = torch.float32
    qk_dtype = torch.int8 if qk_int8 else fmt.dtype
    quant = tuning.current().quantization
    # One K scale per kv block, the warp-specialized kernel's 256-key blocks included (H200,
    # 2026-12-03: 836 / 844 TFLOPS at Wan 720p / HunyuanVideo against 802 / 804 with one per
    # 128 keys). Over more rows than a quantize_kv program holds, the block's amax comes from
    # the statistics pass (with rotation, of the rotated K: the rotation is linear), not with
    # tensor-wide scales.
    kv_rows = quant.kv_rows.get(Dp, 0)
    kamax_stats = (0 < kv_rows < BN and BN % kv_rows == 0
                   and plan.stats_chunk % BN == 0 and not tensor_scales)
    n_prog = BN // kv_rows if kamax_stats else 1
    rope_mode, rope_args = ROPE_NONE, {}
    if rope is not None:  # fp8dit.rope.rope_tables: [2, rows, D / 2] (Wan) or [2, rows, D]
        whole = rope.shape[2] == D  # apply_rotary_emb's whole cos and sin rows
        rope_mode = (ROPE_FOUR if whole else ROPE_FP32 if rope.dtype == torch.float32
                     else ROPE_ROUNDED)
        rope_args = dict(cos_ptr=rope[0], sin_ptr=rope[1], rope_lo=rope_start,
                         rope_n=rope.shape[1], HALF_D=D // 2, ROPE=rope_mode,
                         ROPE_RANGE=rope_start > 0 or rope.shape[1] < max(key.q_lens))

    def grid(blocks, heads):  # with rope, heads first: they share the table's rows in L2
        return (heads, blocks, B) if rope_mode else (blocks, heads, B)
    bal_q = bal_k = tabs["seq"]  # read only by the balance recipes
    if recipe.balance:  # per (sequence, kv head) vectors, applied before the rotation
        from .balance import balance_tables

        bal_q, bal_k = balance_tables(plan, q, q_strides, k, k_strides, tabs, rope_args, soft,
                                      tgt.hip)
    ws = Workspace(
        q8=torch.empty(H, plan.q_total_padded, Dp, device=dev, dtype=qk_dtype),
        q_scale=torch.empty(H, plan.q_total_padded, device=dev, dtype=f32),
        q_corr=torch.empty(H, plan.q_total_padded, device=dev, dtype=f32),
        k8=torch.empty(Hkv, plan.k_total_padded, Dp, device=dev, dtype=qk_dtype),
        k_scale=torch.empty(Hkv, max(plan.n_kblocks, 1), device=dev, dtype=f32),
        v8t=torch.empty(Hkv, Dp, plan.k_total_padded, device=dev,
                        dtype=torch.bfloat16 if pv_bf16 else fmt.dtype),
        v_scale=torch.empty(B, Hkv, Dp, device=dev, dtype=f32),
        v_mean=torch.empty(B, Hkv, Dp, device=dev, dtype=f32),
        part_o=torch.empty(max(plan.n_partials, 1), BM, Dp, device=dev, dtype=f32),
        part_lse=torch.empty(max(plan.n_partials, 1), BM, device=dev, dtype=f32),
        qk_int8=qk_int8,
        pv_bf16=pv_bf16,
    )
    two_term = recipe.qk_terms == 2
    if two_term:
        ws.q8lo, ws.k8lo = torch.empty_like(ws.q8), torch.empty_like(ws.k8)
    stats = torch.empty(B, Hkv, max(plan.n_chunks, 1), N_STATS, Dp, device=dev, dtype=f32)
    # per kv block: K's channel max and min (kamax_stats)
    kblk = (torch.empty(Hkv, plan.n_kblocks, 2, Dp, device=dev, dtype=f32) if kamax_stats
            else stats)
    # written by the finalize pass whenever there are keys; zeros (a memset launch) only for
    # the quantize_q pass of a plan without any
    k_mean = (torch.empty if plan.n_chunks else torch.zeros)(B, Hkv, Dp, device=dev, dtype=f32)
    # amax[0:3] = tensor-wide max |q|, |k|, |v|; read only with TENSOR_SCALES.
    amax = torch.empty(3, device=dev, dtype=f32)
    if tensor_scales:
        _tensor_abs_max(plan, q, q_strides, k, k_strides, v, v_strides, tabs, amax)
    if plan.n_chunks:
        kv_channel_stats_kernel[grid(plan.n_chunks, Hkv)](
            k, v, stats, tabs["seq"], *k_strides, *v_strides, plan.n_chunks, D,
            kblk, plan.n_kblocks,
            DP=Dp, CHUNK=plan.stats_chunk,
            SUB=(quant.stats_sub_elems_interpret if soft else quant.stats_sub_elems) // Dp,
            KBLK=BN if kamax_stats else 0,
            bal_ptr=bal_k, ROTATE=recipe.rotate and kamax_stats, BALANCE=recipe.balance and BAL_MODE,
            num_warps=quant.stats_warps, SOFT_CAST=soft, HIP=tgt.hip, **rope_args,
        )
        kv_stats_finalize_kernel[(Hkv, B)](
            stats, tabs["seq"], k_mean, ws.v_mean, ws.v_scale, amax, plan.n_chunks, D,
            DP=Dp, CHUNK=plan.stats_chunk, ROWS=8, SMOOTH_K=recipe.smooth_k,
            CENTER_V=recipe.center_v,
            TENSOR_SCALES=tensor_scales, PV_BF16=pv_bf16, num_warps=4,
            FP8_MAX=fmt.scale_max,
        )
        rows = BN // n_prog
        quantize_kv_kernel[grid(plan.max_k_blocks * n_prog, Hkv)](
            k, v, k_mean, tabs["seq"], ws.k8, ws.k_scale, ws.v8t, ws.v_scale, ws.v_mean, amax,
            bal_k, *k_strides, *v_strides, D, plan.k_total_padded, ws.k_scale.shape[1],
            DP=Dp, BLOCK_N=rows, QK_INT8=qk_int8, SOFT_FP8_CAST=soft,
            TENSOR_SCALES=tensor_scales, PV_BF16=pv_bf16, ROTATE=recipe.rotate,
            KV_PERM16=kv_perm16, k8lo_ptr=ws.k8lo if two_term else ws.k8, TWO_TERM=two_term,
            SUBBLOCKS=n_prog, kblk_ptr=kblk, KAMAX_FROM_STATS=kamax_stats,
            BALANCE=recipe.balance and BAL_MODE,
            num_warps=tile_warps(rows, Dp, tgt.warp_size), HIP=tgt.hip,
            **fmt.constexprs(), **rope_args,
        )
    if plan.max_q_blocks:
        q_rows = quant.q_rows.get(Dp, BM)
        q_sub = BM // q_rows if 0 < q_rows < BM and BM % q_rows == 0 else 1
        quantize_q_kernel[grid(plan.max_q_blocks * q_sub, H)](
            q, k_mean, tabs["seq"], ws.q8, ws.q_scale, ws.q_corr, amax, bal_q, *q_strides,
            D, plan.q_total_padded, H // Hkv, scale, scale * LOG2E,
            DP=Dp, BLOCK_M=BM // q_sub, SMOOTH_K=recipe.smooth_k,
            QK_INT8=qk_int8, SOFT_FP8_CAST=soft, TENSOR_SCALES=tensor_scales,
            ROTATE=recipe.rotate, q8lo_ptr=ws.q8lo if two_term else ws.q8, TWO_TERM=two_term,
            SUBBLOCKS=q_sub, BALANCE=recipe.balance and BAL_MODE,
            num_warps=tile_warps(BM // q_sub, Dp, tgt.warp_size), HIP=tgt.hip,
            **fmt.constexprs(), **rope_args,
        )
    return ws


def _tensor_abs_max(plan: Plan, q, q_strides, k, k_strides, v, v_strides, tabs, amax) -> None:
    """amax[0:3] = the largest finite |q|, |k|, |v| over all tokens, heads and sequences.

    Only the per-tensor baseline recipe runs this (two small launches and a partial buffer of
    3 * B * H * chunks floats); the default recipe's scales come out of its quantization passes.
    """
    key = plan.key
    B, H, Hkv = len(key.q_lens), key.num_heads, key.num_kv_heads
    chunk = plan.stats_chunk
    n_chunks = max(1, -(-max(*key.q_lens, *key.k_lens) // chunk))
    part = torch.empty(3, B, H, n_chunks, device=amax.device, dtype=torch.float32)
    qkv_abs_max_kernel[(n_chunks, H, B)](
        q, k, v, tabs["seq"], part, *q_strides, *k_strides, *v_strides,
        key.head_dim, n_chunks, H // Hkv,
        # 2048-element tiles (16 per thread): larger ones spill on sm_90 (compiled, not run).
        DP=plan.head_dim_padded, CHUNK=chunk, SUB=2048 // plan.head_dim_padded,
        num_warps=4,
    )
    abs_max_finalize_kernel[(3,)](part, amax, B * H * n_chunks, BLOCK=1024, num_warps=4)
