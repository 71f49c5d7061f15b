"""Host side of the fused quantization: the plan-sized workspace and the launches of
:mod:`fp8dit.kernels.quantize` (channel statistics -> K/V -> Q) that fill it.

The attention launches (:mod:`fp8dit.attend`) read the workspace. The knobs here (rows per
program, the statistics pass's sub-tiles and prefetch, warps) were measured on the H200 and
change speed only: the workspace stays bitwise the same, except that the statistics' sub-tile
sets the order of its fp32 sums (the channel means' last bits). ``tests/test_sm90_gluon.py``
runs the GPU's sizes against the interpreter's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import env
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

LOG2E = 1.4426950408889634


_HADAMARD: dict[tuple[int, str], torch.Tensor] = {}


def hadamard(n: int, device: torch.device) -> torch.Tensor:
    """Orthonormal Sylvester-Hadamard matrix [n, n] fp32 (n a power of two), one per device;
    made on the first call with a rotating recipe (before any CUDA-graph capture, like the
    plan's tables)."""
    key = (n, str(device))
    h = _HADAMARD.get(key)
    if h is None:
        h = torch.ones(1, 1, dtype=torch.float64)
        while h.shape[0] < n:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        h = _HADAMARD[key] = (h / n ** 0.5).to(device=device, dtype=torch.float32)
    return h


# Keys per K scale in the warp-specialized kernel's 256-key blocks: 256 (one scale per
# block), or 128 (two per block: the quantizer's sub-blocks). Same process (run s7-2, Wan
# 720p / HunyuanVideo): 836 / 844 TFLOPS with one scale against 802 / 804 with two (the
# kernel's loop schedules worse), though the quantization takes 3.7 ms instead of 2.6 at Wan
# 720p and the DiT-like rel-L1 is 0.0154 instead of 0.0150 (8k tokens).
K_SCALE_KEYS = 256
# Rows per quantize_kv program, by padded head dim, when one K scale spans a longer kv block:
# the block's amax then comes from the channel-statistics pass (``KAMAX_FROM_STATS``), bitwise
# the same scale; absent or 0: programs span the block. Same process (run s8-2, all three
# quantization launches, with inputs whose heads overlapped, see NOTES session 12): 128 rows
# against 256 at D=128. Run s12-3 (real inputs; V^T stored 16 bytes at a time since commit
# 3c08bcd), quantize_kv alone: Wan 720p 0.79 ms with 64 rows against 1.07 with 128 and 1.23
# with 256; CogVideoX (D=64) 0.103 with 64 rows against 0.169 with 256 (its statistics pass
# then takes the K block max/min: +0.03 ms, net -0.03).
# Run s12-4: 32 rows at D=128, 0.71 ms at Wan 720p against 0.79 for 64 (Wan 480p 0.31 / 0.34).
KV_QUANT_ROWS: dict[int, int] = {128: 32, 64: 64}
# Blocks walked by one quantize_kv program, the next block's K and V loads issued before the
# current one's work (``quantize_kv_kernel(ITERS)``), by padded head dim; absent: 1. Bitwise
# the same workspace either way.
KV_QUANT_ITERS: dict[int, int] = {}
# Warps of the channel-statistics pass (8 measured slower in runs s8-2 and s12-2).
KV_STATS_WARPS = 4
# Elements per sub-tile of the channel-statistics pass (its rows: this / padded head dim), and
# whether it loads the next sub-tile before the current one's work (``PREFETCH``). Run s12-3,
# Wan 720p: 1.06 ms (16 rows, no prefetch), 0.86 (prefetch), 0.68 (8 rows and prefetch: 96
# registers instead of 168, 48% of the DRAM bandwidth instead of 31%, ncu s12-2). Run s12-5:
# 4-row sub-tiles 0.61 ms (CogVideoX 0.110 -> 0.104); prefetching two no better (0.606).
KV_STATS_SUB_ELEMS = 512
# Under Triton's interpreter every loop step costs Python time: 4-row sub-tiles made a 65k-token
# CPU test take 66 s instead of 28. The sub-tile only changes the order of the fp32 sums (the
# means' last bits); tests/test_sm90_gluon.py runs the GPU's size against this one.
KV_STATS_SUB_ELEMS_INTERPRET = 2048
KV_STATS_PREFETCH = True
# Whole chunks of finite values through the statistics pass's unmasked loop
# (``kv_channel_stats_kernel(FULL_FAST)``; bitwise the same statistics): ~1/3 of the masked
# loop's instructions (sm_90 SASS), which issued as many as the DRAM bandwidth leaves time for.
# Off until measured on the H200.
KV_STATS_FULL_FAST = False
# Rows per quantize_q program, by padded head dim; absent: the plan's query tile (block_m).
# Run s12-3: 32 rows at D=128, Wan 720p 0.49 ms against 0.58 for 64; D=64 no faster.
Q_QUANT_ROWS: dict[int, int] = {128: 32}
# Blocks of Q_QUANT_ROWS rows walked by one quantize_q program, the next block's loads issued
# before the current one's work (``quantize_q_kernel(ITERS)``), by padded head dim; absent: 1.
# Bitwise the same workspace either way.
Q_QUANT_ITERS: dict[int, int] = {}
# quantize_q's blocks of finite values without finiteness tests and clamps
# (``quantize_q_kernel(FINITE_FAST)``; bitwise the same workspace): its SASS spent ~24
# instructions per element (sm_90, 32-row programs), about as many as the DRAM bandwidth
# leaves time for. Off until measured on the H200.
Q_QUANT_FINITE_FAST = False
# The same for K's codes in quantize_kv (blocks the statistics pass found finite), and V's
# codes without the clamp that the GPU's saturating fp8 cast makes redundant.
KV_QUANT_FINITE_FAST = False
# quantize_kv walks its grid backwards: it is launched right after the statistics pass (and
# its small finalize), which read the same K and V forwards, so its first programs find the
# last ~tens of MB that pass read still in the 50 MB L2 (at Wan 480p the passes read 671 MB
# each: a few percent of quantize_kv's reads, ~0.01 ms by bandwidth). Same workspace, bitwise.
# Off until measured on the H200.
KV_QUANT_REVERSE = False


@dataclass
class Workspace:
    """Quantized operands and partial buffers of one call, sized by the plan."""

    q8: torch.Tensor  # [H, Tq_pad, Dp] int8 or fp8
    q_scale: torch.Tensor  # [H, Tq_pad] fp32, softmax scale * log2(e) folded in
    q_corr: torch.Tensor  # [H, Tq_pad] fp32, K-smoothing shift of the LSE
    k8: torch.Tensor  # [Hkv, Tk_pad, Dp]
    k_scale: torch.Tensor  # [Hkv, n_kblocks] fp32
    v8t: torch.Tensor  # [Hkv, Dp, Tk_pad] fp8, or bf16 when pv_bf16 (transposed)
    v_scale: torch.Tensor  # [B, Hkv, Dp] fp32
    v_mean: torch.Tensor  # [B, Hkv, Dp] fp32
    part_o: torch.Tensor  # [n_partials, BLOCK_M, Dp] fp32
    part_lse: torch.Tensor  # [n_partials, BLOCK_M] fp32
    qk_int8: bool
    pv_bf16: bool = False
    k_sub: int = 1  # K scales per kv block (2: one per 128 keys of a 256-key block)
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
    if recipe.rotate and tgt.lds_bytes and 4 * Dp * Dp > tgt.lds_bytes:
        raise ValueError(
            f"recipe {recipe.name!r}: its Hadamard rotation at padded head dim {Dp} holds a "
            f"{4 * Dp * Dp // 1024} KB fp32 matrix in shared memory, more than {tgt.arch} has "
            f"({tgt.lds_bytes // 1024} KB); use a recipe without rotation at this head dim")
    qk_int8 = recipe.qk == "int8"
    pv_bf16 = recipe.pv == "bf16"
    tensor_scales = recipe.scales == "tensor"
    tabs = tabs or plan.tables(dev)
    rot = hadamard(Dp, dev) if recipe.rotate else tabs["seq"]  # read only when rotating
    f32 = torch.float32
    qk_dtype = torch.int8 if qk_int8 else fmt.dtype
    # kv blocks longer than K_SCALE_KEYS (the warp-specialized kernel's 256-key steps) are
    # quantized in k_sub programs of K_SCALE_KEYS rows, one K scale each (see K_SCALE_KEYS).
    k_sub = BN // K_SCALE_KEYS if BN > K_SCALE_KEYS else 1
    qbn = BN // k_sub
    # One K scale over more rows than a quantize_kv program holds: the block's amax from the
    # statistics pass (not with rotation, whose amax is taken after the rotation, nor with
    # tensor-wide scales).
    kv_rows = KV_QUANT_ROWS.get(Dp, 0)
    kamax_stats = (0 < kv_rows < qbn and qbn % kv_rows == 0
                   and plan.stats_chunk % BN == 0 and k_sub == 1
                   and not recipe.rotate and not tensor_scales)
    n_prog = qbn // kv_rows if kamax_stats else 1
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
    ws = Workspace(
        q8=torch.empty(H, plan.q_total_padded, Dp, device=dev, dtype=qk_dtype),
        q_scale=torch.empty(H, plan.q_total_padded, device=dev, dtype=f32),
        q_corr=torch.empty(H, plan.q_total_padded, device=dev, dtype=f32),
        k8=torch.empty(Hkv, plan.k_total_padded, Dp, device=dev, dtype=qk_dtype),
        k_scale=torch.empty(Hkv, max(plan.n_kblocks * k_sub, 1), device=dev, dtype=f32),
        v8t=torch.empty(Hkv, Dp, plan.k_total_padded, device=dev,
                        dtype=torch.bfloat16 if pv_bf16 else fmt.dtype),
        v_scale=torch.empty(B, Hkv, Dp, device=dev, dtype=f32),
        v_mean=torch.empty(B, Hkv, Dp, device=dev, dtype=f32),
        part_o=torch.empty(max(plan.n_partials, 1), BM, Dp, device=dev, dtype=f32),
        part_lse=torch.empty(max(plan.n_partials, 1), BM, device=dev, dtype=f32),
        qk_int8=qk_int8,
        pv_bf16=pv_bf16, k_sub=k_sub,
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
            SUB=(KV_STATS_SUB_ELEMS_INTERPRET if soft else KV_STATS_SUB_ELEMS) // Dp,
            KBLK=BN if kamax_stats else 0, PREFETCH=KV_STATS_PREFETCH,
            FULL_FAST=KV_STATS_FULL_FAST,
            num_warps=KV_STATS_WARPS, SOFT_CAST=soft, HIP=tgt.hip, **rope_args,
        )
        kv_stats_finalize_kernel[(Hkv, B)](
            stats, tabs["seq"], k_mean, ws.v_mean, ws.v_scale, amax, plan.n_chunks, D,
            DP=Dp, CHUNK=plan.stats_chunk, ROWS=8, SMOOTH_K=recipe.smooth_k,
            CENTER_V=recipe.center_v,
            TENSOR_SCALES=tensor_scales, PV_BF16=pv_bf16, FP8_MAX=fmt.scale_max, num_warps=4,
        )
        rows = qbn // n_prog
        kv_iters = KV_QUANT_ITERS.get(Dp, 1)
        quantize_kv_kernel[grid(-(-plan.max_k_blocks * k_sub * n_prog // kv_iters), Hkv)](
            k, v, k_mean, tabs["seq"], ws.k8, ws.k_scale, ws.v8t, ws.v_scale, ws.v_mean, amax,
            rot, *k_strides, *v_strides, D, plan.k_total_padded, ws.k_scale.shape[1],
            DP=Dp, BLOCK_N=rows, QK_INT8=qk_int8, SOFT_FP8_CAST=soft,
            TENSOR_SCALES=tensor_scales, PV_BF16=pv_bf16, ROTATE=recipe.rotate,
            KV_PERM16=kv_perm16, k8lo_ptr=ws.k8lo if two_term else ws.k8, TWO_TERM=two_term,
            SUBBLOCKS=k_sub * n_prog, kblk_ptr=kblk, KAMAX_FROM_STATS=kamax_stats,
            ITERS=kv_iters, FINITE_FAST=KV_QUANT_FINITE_FAST, REVERSE=KV_QUANT_REVERSE,
            num_warps=tile_warps(rows, Dp, tgt.warp_size), HIP=tgt.hip, **fmt.constexprs(),
            **rope_args,
        )
    if plan.max_q_blocks:
        q_rows = Q_QUANT_ROWS.get(Dp, BM)
        q_sub = BM // q_rows if 0 < q_rows < BM and BM % q_rows == 0 else 1
        q_iters = Q_QUANT_ITERS.get(Dp, 1)
        quantize_q_kernel[grid(-(-plan.max_q_blocks * q_sub // q_iters), H)](
            q, k_mean, tabs["seq"], ws.q8, ws.q_scale, ws.q_corr, amax, rot, *q_strides,
            D, plan.q_total_padded, H // Hkv, scale, scale * LOG2E,
            DP=Dp, BLOCK_M=BM // q_sub, SMOOTH_K=recipe.smooth_k,
            QK_INT8=qk_int8, SOFT_FP8_CAST=soft, TENSOR_SCALES=tensor_scales,
            ROTATE=recipe.rotate, q8lo_ptr=ws.q8lo if two_term else ws.q8, TWO_TERM=two_term,
            SUBBLOCKS=q_sub, ITERS=q_iters, FINITE_FAST=Q_QUANT_FINITE_FAST,
            num_warps=tile_warps(BM // q_sub, Dp, tgt.warp_size), HIP=tgt.hip,
            **fmt.constexprs(),
            **rope_args,
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
