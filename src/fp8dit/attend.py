"""The FP8 path's launchers: quantize (:mod:`fp8dit.quantize`) -> persistent attention ->
merge (:mod:`fp8dit.merge`), driven by a plan.

Layers (quack's habit): ``launch_fp8_attention`` writes into tensors it is given and trusts
them; ``fp8_attention_fwd`` allocates exactly what the plan sized and calls it. Validation
happens once, in :mod:`fp8dit.api`.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from . import dispatch, env, prebuilt, tuning
from .device import Target, target_of
from .dispatch import BackendUnavailableError
from .kernels.attention import attention_fwd_persistent_kernel
from .kernels.quantize import SEQ_FIELDS, SEQ_K_LEN
from .merge import merge_stage
from .plan import Plan, PlanKey, get_plan, padded_head_dim
from .quantize import Workspace, quantize_stage
from .recipes import Recipe
from .tuning import GluonTiles, TritonTiles


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@dataclass(frozen=True)
class LaunchConfig:
    """How the attention of one plan launches: the kernel (:func:`fp8dit.dispatch.choose_kernel`),
    its tiles (:mod:`fp8dit.tuning`), and the number of persistent programs."""

    kernel: str  # "triton" or "gluon-ws"
    block_m: int  # query rows per work item
    block_n: int  # keys per kv block
    num_programs: int
    tiles: TritonTiles | GluonTiles


# The warp-specialized kernel's structure: 128-row work items (64 rows per consumer warpgroup),
# one program of three partitions per SM.
GLUON_WS_BLOCK_M = 128
GLUON_WS_PROGRAMS_PER_SM = 1


def tile_config(head_dim_padded: int, device: torch.device, kernel: str = "triton",
                recipe: Recipe | None = None, is_causal: bool = False) -> LaunchConfig:
    """The launch of a padded head dim's calls on ``kernel`` (the plan's block sizes come from
    here): ``tuning.gluon_tiles`` (``gluon_causal_tiles`` for causal calls) for the
    warp-specialized kernel; for the Triton kernel ``tuning.tiles``, or ``two_term_tiles`` for
    a two-term ``recipe`` where it has them; on an AMD GPU (or the interpreter standing in for
    one, ``fp8dit.device.interpret_as``) its architecture's ``tuning.hip_tiles``, and on the
    NVIDIA architectures other than sm_90 that have them ``tuning.nvidia_tiles``, for every
    recipe."""
    tuned = tuning.current()
    tgt = target_of(device)
    if kernel == "gluon-ws":
        tiles = (tuned.gluon_causal_tiles if is_causal else tuned.gluon_tiles)[head_dim_padded]
        block_m, per_sm = GLUON_WS_BLOCK_M, GLUON_WS_PROGRAMS_PER_SM
    elif tgt.hip:
        tiles = tuned.hip_tiles[tgt.arch][head_dim_padded]
        block_m, per_sm = tiles.block_m, tiles.programs_per_sm
    elif head_dim_padded in tuned.nvidia_tiles.get(_nvidia_arch(tgt, device), {}):
        tiles = tuned.nvidia_tiles[_nvidia_arch(tgt, device)][head_dim_padded]
        block_m, per_sm = tiles.block_m, tiles.programs_per_sm
    else:
        tiles = tuned.tiles[head_dim_padded]
        if recipe is not None and recipe.qk_terms == 2:
            tiles = tuned.two_term_tiles.get(head_dim_padded, tiles)
        block_m, per_sm = tiles.block_m, tiles.programs_per_sm
    if device.type == "cuda":
        num_programs = _sm_count(device.index or 0) * per_sm
    else:
        # Interpreter: programs run one after another; a few still exercise the persistence.
        num_programs = 4
    return LaunchConfig(kernel, block_m, tiles.block_n, num_programs, tiles)


def _nvidia_arch(tgt: Target, device: torch.device) -> str | None:
    """The NVIDIA architecture whose tiles a call takes: the GPU's, or the one the
    interpreter stands in for (None: the interpreter's own, sm_90's tiles)."""
    if device.type == "cuda":
        return dispatch.nvidia_arch_of(device)
    return tgt.arch if tgt.arch.startswith("sm_") else None


def plan_for(
    q_lens, k_lens, *, varlen: bool, num_heads: int, num_kv_heads: int, head_dim: int,
    is_causal: bool, device: torch.device, num_splits: int | None = None,
    num_programs: int | None = None, recipe: Recipe | None = None, kernel: str | None = None,
) -> tuple[Plan, LaunchConfig]:
    """The cached plan of a call and its launch. ``recipe``: the call's (None: the default).
    ``kernel``: what :func:`fp8dit.dispatch.choose` chose for the call (None: chosen here, by
    :func:`fp8dit.dispatch.choose_kernel`)."""
    dp = padded_head_dim(head_dim)
    if kernel is None:
        kernel, _ = dispatch.choose_kernel(head_dim, max((int(x) for x in k_lens), default=0),
                                           is_causal, recipe, device)
    launch = tile_config(dp, device, kernel, recipe, is_causal)
    key = PlanKey(
        q_lens=tuple(int(x) for x in q_lens),
        k_lens=tuple(int(x) for x in k_lens),
        varlen=varlen,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        is_causal=is_causal,
        block_m=launch.block_m,
        block_n=launch.block_n,
        num_programs=num_programs or launch.num_programs,
        num_splits=num_splits,
        device=str(device),
    )
    return get_plan(key), launch


def _import_gluon_ws():
    """The warp-specialized kernel, imported on its first launch. Gluon is experimental: a
    Triton release may lack what it uses (``auto`` runs it only on verified releases)."""
    try:
        from .kernels.attention_sm90_ws import attention_fwd_sm90_ws_kernel
    except Exception as e:  # noqa: BLE001 - any import failure means "not on this Triton"
        raise BackendUnavailableError(
            f"the warp-specialized Gluon kernel does not import with triton "
            f"{dispatch.triton_release()} ({type(e).__name__}: {e}); FP8DIT_KERNEL=triton runs "
            "the Triton kernel") from e
    return attention_fwd_sm90_ws_kernel


def gluon_ws_constexprs(head_dim_padded: int, tiles: GluonTiles, is_causal: bool) -> dict:
    """The warp-specialized kernel's compile-time arguments for ``tiles`` (also what
    ``tests/tools/sm90_compile.py`` compiles)."""
    wide = tiles.block_n > 128  # 256-key steps: two dots of 128
    return dict(
        DP=head_dim_padded, BLOCK_M=GLUON_WS_BLOCK_M // 2, BLOCK_N=tiles.block_n,
        IS_CAUSAL=is_causal, STAGES=tiles.stages, CONSUMER_REGS=tiles.consumer_regs,
        P_REGS=tiles.p_regs, ROWSUM_DOT=tiles.rowsum_dot and wide and tiles.p_regs,
        SPLIT_KV=tiles.split_kv and wide, num_warps=4,
    )


def _attention_gluon_ws(plan: Plan, launch: LaunchConfig, ws: Workspace, tabs,
                        out, out_strides, lse, lse_strides) -> None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

    kernel = _import_gluon_ws()
    key = plan.key
    H, Hkv, D = key.num_heads, key.num_kv_heads, key.head_dim
    Dp, BN = plan.head_dim_padded, key.block_n
    if key.block_m != GLUON_WS_BLOCK_M or BN not in (128, 256):
        raise ValueError(f"the warp-specialized kernel takes {GLUON_WS_BLOCK_M}-row work items "
                         f"and kv blocks of 128 or 256 keys, this plan {key.block_m} x {BN}")

    def desc(t, block, dtype):
        layout = gl.NVMMASharedLayout.get_default_for(block, dtype)
        return GluonDescriptor.from_tensor(t, block, layout)

    # Each consumer warpgroup takes half of the plan's 128-row work item; K and V^T tiles of at
    # most 128 keys (one dot each; a 256-key kv block loads two).
    rows = GLUON_WS_BLOCK_M // 2
    sub_n = min(BN, 128)
    pointers = dict(q_scale_ptr=ws.q_scale, q_lse_corr_ptr=ws.q_corr, k_scale_ptr=ws.k_scale,
                    v_scale_ptr=ws.v_scale, v_mean_ptr=ws.v_mean, seq_ptr=tabs["seq"],
                    work_ptr=tabs["work"], work_indptr_ptr=tabs["work_indptr"], out_ptr=out,
                    lse_ptr=lse, part_o_ptr=ws.part_o, part_lse_ptr=ws.part_lse)
    ints = dict(zip(("o_sb", "o_st", "o_sh", "o_sd"), out_strides),
                **dict(zip(("l_sb", "l_sh", "l_st"), lse_strides)),
                D=D, Tq_pad=plan.q_total_padded, Tk_pad=plan.k_total_padded,
                n_kblocks=ws.k_scale.shape[1], group=H // Hkv, Hkv=Hkv)
    constexprs = gluon_ws_constexprs(Dp, launch.tiles, key.is_causal)
    descs = dict(
        desc_q=desc(ws.q8.view(-1, Dp), [rows, Dp], gl.int8),
        desc_k=desc(ws.k8.view(-1, Dp), [sub_n, Dp], gl.int8),
        desc_v=desc(ws.v8t.view(-1, plan.k_total_padded), [Dp, sub_n], gl.float8e4nv))
    unfit = prebuilt.unfit_reason(Dp, key.is_causal, constexprs, ints, pointers)
    if unfit is None:
        with prebuilt.assembler(out.device, Dp, key.is_causal):
            kernel[(plan.num_programs,)](**descs, **pointers, **ints, **constexprs,
                                         ir_override=prebuilt.ptx_path(Dp, key.is_causal))
        return
    if prebuilt.applies_to_release():  # a launch the release's own build serves instead
        dispatch._log_once(f"fp8dit: warp-specialized kernel built by triton "
                           f"{dispatch.triton_release()} itself, not from triton 3.6's PTX: "
                           f"{unfit}")
    kernel[(plan.num_programs,)](**descs, **pointers, **ints, **constexprs)


def attention_stage(plan: Plan, launch: LaunchConfig, ws: Workspace,
                    out, out_strides, lse, lse_strides, tabs: dict | None = None) -> None:
    """Persistent attention over the plan's work list, then the split-KV merge."""
    key = plan.key
    tabs = tabs or plan.tables(out.device)
    H, Hkv, D = key.num_heads, key.num_kv_heads, key.head_dim
    Dp, BM, BN = plan.head_dim_padded, key.block_m, key.block_n
    if plan.n_work and launch.kernel == "gluon-ws":
        _attention_gluon_ws(plan, launch, ws, tabs, out, out_strides, lse, lse_strides)
    elif plan.n_work:
        tiles = launch.tiles
        tgt = target_of(out.device)
        two_term = ws.q8lo is not None
        if tiles.ptr_loads:  # the tensors themselves, no descriptors (GPUs without TMA)
            desc_q = desc_k = desc_v = desc_qlo = desc_klo = None
            ptrs = dict(q_ptr=ws.q8, k_ptr=ws.k8, v_ptr=ws.v8t, qlo_ptr=ws.q8lo,
                        klo_ptr=ws.k8lo, PTR_LOADS=True)
        else:
            desc_q = TensorDescriptor.from_tensor(ws.q8.view(-1, Dp), [BM, Dp])
            desc_k = TensorDescriptor.from_tensor(ws.k8.view(-1, Dp), [BN, Dp])
            desc_v = TensorDescriptor.from_tensor(ws.v8t.view(-1, plan.k_total_padded),
                                                  [Dp, BN])
            if two_term:
                desc_qlo = TensorDescriptor.from_tensor(ws.q8lo.view(-1, Dp), [BM, Dp])
                desc_klo = TensorDescriptor.from_tensor(ws.k8lo.view(-1, Dp), [BN, Dp])
            else:
                desc_qlo, desc_klo = desc_q, desc_k  # not read
            ptrs = {}  # the kernel's defaults: the sm_90 launch as it always was
        attention_fwd_persistent_kernel[(plan.num_programs,)](
            desc_q, ws.q_scale, ws.q_corr, desc_k, ws.k_scale, desc_v, ws.v_scale, ws.v_mean,
            tabs["seq"], tabs["work"], tabs["work_indptr"],
            out, *out_strides, lse, *lse_strides, ws.part_o, ws.part_lse,
            D, plan.q_total_padded, plan.k_total_padded, ws.k_scale.shape[1], H // Hkv, Hkv,
            DP=Dp, BLOCK_M=BM, BLOCK_N=BN, IS_CAUSAL=key.is_causal, QK_INT8=ws.qk_int8,
            SOFT_FP8_CAST=env.triton_interpret(), PV_BF16=ws.pv_bf16,
            desc_qlo=desc_qlo, desc_klo=desc_klo, QK_TWO_TERM=two_term,
            P_SHIFT=tgt.fp8.p_shift, FP8_FNUZ=tgt.fp8.fnuz,
            num_warps=tiles.num_warps, num_stages=_num_stages(tiles, ws),
            **_launch_options(tiles, tgt), **ptrs,
        )
    merge_stage(plan, ws, tabs, out, out_strides, lse, lse_strides)


def _register_cap(tiles: TritonTiles) -> dict:
    """``maxnreg`` when the tiles cap registers (three programs per SM need at most
    65,536 / (3 * 128) = 170 per thread; ptxas otherwise takes all 255). The interpreter
    ignores it; passing it there lets the sm_90 SASS test record it."""
    if tiles.maxnreg:
        return {"maxnreg": tiles.maxnreg}
    return {}


def _launch_options(tiles: TritonTiles, tgt: Target) -> dict:
    """The launch options of the tiles beyond warps and stages: ``maxnreg`` on NVIDIA (and the
    interpreter, which ignores it), ``waves_per_eu`` on AMD (HIP has no ``maxnreg``: Triton's
    HIP launcher rejects it)."""
    if tgt.hip:
        return {"waves_per_eu": tiles.waves_per_eu} if tiles.waves_per_eu else {}
    return _register_cap(tiles)


def _num_stages(tiles: TritonTiles, ws: Workspace) -> int:
    # bf16 V doubles the V tile: at 64x128 tiles, D128 and 3 stages that is ~152 KB of shared
    # memory per program, too much for the two programs per SM the tiles were tuned with. Two
    # stages bring it back to the default recipe's ~104 KB (arithmetic, not timed).
    if ws.pv_bf16 and tiles.programs_per_sm > 1:
        return min(tiles.num_stages, 2)
    return tiles.num_stages


def launch_fp8_attention(
    plan: Plan, launch: LaunchConfig, recipe: Recipe, scale: float,
    q, q_strides, k, k_strides, v, v_strides,
    out, out_strides, lse, lse_strides, device_k_lens: torch.Tensor | None = None,
    rope: torch.Tensor | None = None, rope_start: int = 0,
) -> None:
    """Run the FP8 path into ``out``/``lse``. Strides are (batch, token, head, dim).

    ``device_k_lens``: an int32 [B] tensor of key lengths, each at most the plan's, read by the
    kernels on the device (a copy of the plan's ``seq`` table with them): nothing is read on the
    host, so a CUDA graph can replay the call with other lengths. Keys between a sequence's
    length and the plan's are quantized as zeros with a unit scale and masked by the kernels
    (a kv block or split piece with no key left gives an empty partial, as causal ones can).
    ``rope``: rotary tables Q and K are rotated by as they are quantized, from token
    ``rope_start`` on (:mod:`fp8dit.rope`)."""
    tabs = None
    if device_k_lens is not None:
        tabs = dict(plan.tables(q.device))
        seq = tabs["seq"].view(-1, SEQ_FIELDS).clone()
        seq[:, SEQ_K_LEN] = device_k_lens.to(device=seq.device, dtype=seq.dtype)
        tabs["seq"] = seq.view(-1)
    # Triton launches on the current CUDA device, not on the tensors' one.
    with torch.cuda.device(q.device) if q.device.type == "cuda" else contextlib.nullcontext():
        ws = quantize_stage(plan, recipe, scale, q, q_strides, k, k_strides, v, v_strides,
                            kv_perm16=launch.kernel == "gluon-ws", tabs=tabs, rope=rope,
                            rope_start=rope_start)
        attention_stage(plan, launch, ws, out, out_strides, lse, lse_strides, tabs=tabs)


def _bthd_strides(t: torch.Tensor, layout: str) -> tuple[int, int, int, int]:
    if layout == "NHD":  # [B, S, H, D]
        return t.stride(0), t.stride(1), t.stride(2), t.stride(3)
    if layout == "HND":  # [B, H, S, D]
        return t.stride(0), t.stride(2), t.stride(1), t.stride(3)
    # packed varlen [T, H, D]
    return 0, t.stride(0), t.stride(1), t.stride(2)


def fp8_attention_fwd(
    q, k, v, *, layout: str, scale: float, is_causal: bool, recipe: Recipe,
    num_splits: int | None = None, k_lens=None, device_k_lens: torch.Tensor | None = None,
    rope: torch.Tensor | None = None, rope_start: int = 0, kernel: str | None = None,
):
    """Dense FP8 attention; returns (out in q's layout and dtype, lse [B, H, Sq] fp32).

    ``k_lens``: keys each sequence attends to, a prefix of its ``Sk`` (a key-padding mask that
    keeps the first ``k_lens[b]`` keys, ``fp8dit.key_padding``); None: all. The plan carries the
    lengths, so the kernels never read the keys past them; a sequence with none gets zeros and
    lse -inf. ``device_k_lens``: the same as an int32 [B] device tensor, each in [1, Sk], that
    the host never reads (CUDA-graph capture): the plan is the one for all ``Sk`` keys, built
    beforehand (:func:`launch_fp8_attention`). ``rope``: rotary tables
    (:func:`fp8dit.rope.rope_tables`, Sq == Sk) that Q and K are rotated by first, from token
    ``rope_start`` on. ``kernel``: :func:`fp8dit.dispatch.choose`'s (None: chosen here)."""
    if layout == "NHD":
        B, Sq, H, D = q.shape
        Sk, Hkv = k.shape[1], k.shape[2]
    else:
        B, H, Sq, D = q.shape
        Hkv, Sk = k.shape[1], k.shape[2]
    out = torch.empty_like(q)
    lse = torch.empty(B, H, Sq, device=q.device, dtype=torch.float32)
    if B == 0 or Sq == 0:
        return out, lse
    k_lens = [Sk] * B if k_lens is None else [int(n) for n in k_lens]
    if len(k_lens) != B or not all(0 <= n <= Sk for n in k_lens):
        raise ValueError(f"k_lens: expected {B} lengths in [0, {Sk}], got {k_lens}")
    if not any(k_lens):
        return out.zero_(), lse.fill_(-math.inf)
    plan, launch = plan_for(
        [Sq] * B, k_lens, varlen=False, num_heads=H, num_kv_heads=Hkv, head_dim=D,
        is_causal=is_causal, device=q.device, num_splits=num_splits, recipe=recipe,
        kernel=kernel,
    )
    if plan.needs_zero_fill:
        out.zero_()
        lse.fill_(-math.inf)
    if device_k_lens is not None and (is_causal or k_lens != [Sk] * B):
        raise ValueError("device_k_lens: expected a non-causal call without k_lens")
    launch_fp8_attention(
        plan, launch, recipe, scale,
        q, _bthd_strides(q, layout), k, _bthd_strides(k, layout), v, _bthd_strides(v, layout),
        out, _bthd_strides(out, layout), lse, (lse.stride(0), lse.stride(1), lse.stride(2)),
        device_k_lens=device_k_lens, rope=rope, rope_start=rope_start,
    )
    return out, lse


def fp8_attention_varlen_fwd(
    q, k, v, q_lens, k_lens, *, scale: float, is_causal: bool, recipe: Recipe,
    num_splits: int | None = None, kernel: str | None = None,
):
    """Packed [T, H, D] FP8 attention; returns (out [Tq, H, D], lse [H, Tq] fp32).
    ``kernel``: :func:`fp8dit.dispatch.choose`'s (None: chosen here)."""
    T, H, D = q.shape
    Hkv = k.shape[1]
    out = torch.empty_like(q)
    lse = torch.empty(H, T, device=q.device, dtype=torch.float32)
    if T == 0:
        return out, lse
    plan, launch = plan_for(
        q_lens, k_lens, varlen=True, num_heads=H, num_kv_heads=Hkv, head_dim=D,
        is_causal=is_causal, device=q.device, num_splits=num_splits, recipe=recipe,
        kernel=kernel,
    )
    if plan.needs_zero_fill:
        out.zero_()
        lse.fill_(-math.inf)
    launch_fp8_attention(
        plan, launch, recipe, scale,
        q, _bthd_strides(q, "varlen"), k, _bthd_strides(k, "varlen"),
        v, _bthd_strides(v, "varlen"),
        out, _bthd_strides(out, "varlen"), lse, (0, lse.stride(0), lse.stride(1)),
    )
    return out, lse


