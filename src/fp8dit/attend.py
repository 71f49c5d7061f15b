"""The FP8 path's launchers: quantize (:mod:`fp8dit.quantize`) -> persistent attention ->
merge (:mod:`fp8dit.merge`), driven by a plan.

Layers (quack's habit): ``launch_fp8_attention`` writes into tensors it is given and trusts
them; ``fp8_attention_fwd`` allocates exactly what the plan sized and calls it. Validation
happens once, in :mod:`fp8dit.api`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from . import env, quantize
from .device import Target, is_hip, target_of
from .kernels.attention import attention_fwd_persistent_kernel
from .kernels.quantize import SEQ_FIELDS, SEQ_K_LEN
from .merge import merge_stage
from .plan import Plan, PlanKey, get_plan, padded_head_dim
from .quantize import Workspace, quantize_stage
from .recipes import Recipe, get_recipe


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# Benchmarks set entries here to sweep tile configurations (key: padded head dim).
TILE_OVERRIDES: dict[int, dict] = {}


# With FP8DIT_KERNEL=auto, the warp-specialized Gluon kernel runs dense non-causal calls at
# padded head dim 64 or 128 whose key sequences reach these lengths (benchmarks/NOTES.md).
# Run s14-3 (`benchmarks/gpu_crossover.py`, same process, fp8dit end to end, ms): D=128, 24
# heads: 4,608 keys (Flux) 0.99 against 0.86 on the Triton kernel; 8,192: 1.01 / 1.27;
# 12,288: 2.12 / 2.69; 16,896: 3.82 / 4.95; 24,576: 7.87 / 10.27; 32,768: 13.73 / 18.24.
# D=64, 48 heads: 8,192: 1.67 / 1.91; 12,288: 3.54 / 4.12; 17,776: 7.32 / 8.37. Below 8,192
# keys only 4,608 was measured, where the Triton kernel wins.
WS_MIN_KV_TOKENS = {64: 8192, 128: 8192}
# Triton releases (major.minor) on which the warp-specialized kernel has run on a GPU and
# matched the Triton kernel (benchmarks/gpu_gluon.py --parts check). Gluon is experimental
# and changes between releases; on others it compiles for sm_90 in CI at best, so ``auto``
# keeps the Triton kernel there (``FP8DIT_KERNEL=gluon-ws`` still asks for it).
WS_VERIFIED_TRITON = ("3.6",)


# Triton's release as "major.minor", read once. A dict, not functools.cache: dispatch asks for
# it from code that torch.compile traces, and dynamo does not trace through cache wrappers.
_TRITON_RELEASE: dict[str, str] = {}


def triton_release() -> str:
    if "v" not in _TRITON_RELEASE:
        import triton

        _TRITON_RELEASE["v"] = ".".join(triton.__version__.split(".")[:2])
    return _TRITON_RELEASE["v"]


def kernel_for(head_dim: int, max_k_len: int, is_causal: bool, recipe: Recipe | None,
               device: torch.device) -> str:
    """The attention kernel a call runs: ``FP8DIT_KERNEL`` when it names one, else (``auto``)
    the warp-specialized Gluon kernel where it measured faster, the Triton kernel elsewhere.

    A named Gluon kernel may still fall back to the Triton one at launch (``use_gluon_sm90``).
    """
    kernel = env.attention_kernel()
    if kernel != "auto":
        return kernel
    recipe = recipe if recipe is not None else get_recipe(None)
    dp = padded_head_dim(head_dim)
    if (dp in WS_MIN_KV_TOKENS and max_k_len >= WS_MIN_KV_TOKENS[dp] and not is_causal
            and recipe.qk == "int8" and recipe.qk_terms == 1 and recipe.pv == "fp8"
            and _gluon_ws_possible(device)
            and triton_release() in WS_VERIFIED_TRITON
            and _gluon_sm90_module("attention_sm90_ws") is not None):
        return "gluon-ws"
    return "triton"


# Two-term QK (recipe int8x2qk-fp8pv): two int32 score accumulators, Q and K twice. With the
# default tiles the sm_90 SASS spilled in the kv loop (89 spills at D=64, 4 at D=128; triton 3.9)
# and took 161 KB of shared memory at D=128 (one program per SM). 64-key blocks, three stages:
# no spills, and the fastest of 64/128 keys x 2/3 stages at Wan 720p and CogVideoX (run s5-7,
# benchmarks/gpu_two_term.py).
TWO_TERM_TILES = dict(block_n=64, num_stages=3, programs_per_sm=2, maxnreg=None)


# The warp-specialized kernel's kv block (keys per loop step: 128, or 256 as two dots of 128)
# and its ring depth, per padded head dim.
# 256 keys (run s6-1): +8-10% at D=128 over 128-key steps with PV under the next softmax;
# at D=64 a tie with three stages, +4% with two. Shared memory: D=128 two stages 176 KB.
# D=128: the PV dots read P from registers (``sm90_p_regs``, run s8-4, same process, bitwise
# equal outputs): Wan 720p 912 / 907 TFLOPS against 852 / 846 with P in shared memory, Wan 480p
# 894 / 890 against 826 / 821, HunyuanVideo 913 / 913 against 854 / 851 (three stages 1-2% less);
# at D=64 (CogVideoX) 463 / 464 against 474 / 478 alone, but the row-sum dot below needs it.
# Both: P's row sums from two N=8 dots of the fp8 P registers with a tile of ones
# (``sm90_rowsum_dot``, needs P in registers) instead of 128 FADDs and a row reduction per step.
# Same process (run s11-3, accuracy within 1e-4 rel-L1 of the FADD sums, 10 repeats bitwise
# equal): Wan 720p 960 / 958 TFLOPS against 898 / 894, Wan 480p 931 / 919 against 871 / 871,
# HunyuanVideo 967 / 968 against 898 / 900, CogVideoX (D=64, P in registers too) 527 / 526
# against 475 / 477.
# D=64 only: K and V of a ring slot on their own barriers, V's waited for after the row max and
# before the exponentials (``sm90_split_kv``; outputs and LSE bitwise the default's). Run
# s22-9, same process, CogVideoX end to end: 13.29 / 13.23 ms against 14.19 / 14.13 with the
# wait after the exponentials (where ptxas issued no PV dot under them; 14.52 with one barrier
# per slot in s22-4). At D=128 every form ran slower (this one spills 16 registers per step
# there: Wan 480p 28.5 against 22.9 ms; the wait after the exponentials 7-16% slower).
WS_TILES: dict[int, dict] = {
    64: dict(block_n=256, sm90_stages=2, sm90_p_regs=True, sm90_rowsum_dot=True,
             sm90_split_kv=True),
    128: dict(block_n=256, sm90_stages=2, sm90_p_regs=True, sm90_rowsum_dot=True),
}
# Causal calls (only when FP8DIT_KERNEL=gluon-ws names the kernel): the 256-key step's masked
# loop spills ~40 registers at D=128 (sm_90 SASS, triton 3.6); the 128-key loop does not.
WS_CAUSAL_TILES: dict[int, dict] = {
    64: dict(block_n=128, sm90_stages=3),
    128: dict(block_n=128, sm90_stages=3),
}


# AMD Instinct, not yet measured on hardware. The starting point is AMD's own int8-QK /
# fp8-PV Triton attention (ROCm/aiter, aiter/ops/triton/attention/fav3_sage.py,
# get_sage_fwd_configs): 256 x 128 tiles, 8 wavefronts, waves_per_eu=2, 3 stages on gfx950 and
# 2 on gfx942. Triton gives a kernel at most 256 VGPRs there (no AGPRs), and this kernel's kv
# loop spilled at D=128 with 128-key blocks (gfx942: 19 spill instructions per step, 83 in the
# masked loop; tests/test_hip_compile.py): 64-key blocks, none in the unmasked loop. D=256
# (auto runs SDPA there): 64 x 64 tiles with 4 wavefronts, as on NVIDIA; 128 x 64 spilled
# ~150 instructions per step on gfx942, this none (gfx950: 73, docs/amd.md). One program per
# CU: waves_per_eu=2 leaves room for two wavefronts per SIMD, one 8-wavefront program per CU.
AMD_TILES: dict[int, dict] = {
    64: dict(block_m=256, block_n=128, num_warps=8),
    128: dict(block_m=256, block_n=64, num_warps=8),
    256: dict(block_m=64, block_n=64, num_warps=4),
}
AMD_STAGES = {"gfx942": 2, "gfx950": 3}


def _amd_tile_config(tgt: Target, head_dim_padded: int, device: torch.device) -> dict:
    """``tile_config`` on an AMD GPU (or the interpreter standing in for one): ``AMD_TILES``
    for every recipe (``num_warps`` counts 64-wide wavefronts)."""
    cfg = dict(AMD_TILES[head_dim_padded], num_stages=AMD_STAGES[tgt.arch], waves_per_eu=2,
               programs_per_sm=1)
    cfg.update(TILE_OVERRIDES.get(head_dim_padded, {}))
    if device.type == "cuda":
        cfg["num_programs"] = _sm_count(device.index or 0) * cfg["programs_per_sm"]
    else:
        cfg["num_programs"] = 4
    return cfg


def tile_config(head_dim_padded: int, device: torch.device, kernel: str | None = None,
                recipe: Recipe | None = None, is_causal: bool = False) -> dict:
    """Tile sizes and launch shape for a padded head dim (the plan's block sizes come from here).

    ``kernel``: what ``kernel_for`` chose; None reads ``FP8DIT_KERNEL`` (``auto`` gives the
    Triton kernel's tiles when the call's shape is not known). ``recipe``: the call's; a
    two-term one takes ``TWO_TERM_TILES`` (it never runs a Gluon kernel). ``is_causal``: the
    warp-specialized kernel keeps 128-key steps for causal calls (``WS_CAUSAL_TILES``)."""
    # Measured on an H200 (benchmarks/NOTES.md, 2026-12-02): 64-row query tiles, 4 warps and two
    # programs per SM beat 128-row tiles with 8 warps by 1.2-1.3x at Wan 720p (741 vs 583
    # TFLOPS). D=64 (CogVideoX): three programs per SM, registers capped at 168 and two stages
    # (shared memory), 460 against 438 TFLOPS; at D=128 the same is a tie (738 vs 741).
    # D=256: 64x64 tiles with 4 warps, 412 TFLOPS against 299-405 for 8 warps or 128-wide tiles
    # (still 0.62x cuDNN, so auto prefers SDPA at D=256).
    tgt = target_of(device)
    if tgt.hip:
        return _amd_tile_config(tgt, head_dim_padded, device)
    if kernel is None:
        kernel = env.attention_kernel()
    if head_dim_padded in (64, 128) and kernel == "gluon-ws" and _gluon_ws_possible(device):
        # the warp-specialized kernel: 128-row work items, one program (3 partitions) per SM
        cfg = dict(block_m=128, num_warps=4, num_stages=2, programs_per_sm=1,
                   **(WS_CAUSAL_TILES if is_causal else WS_TILES)[head_dim_padded])
    elif head_dim_padded >= 256:
        cfg = dict(block_m=64, block_n=64, num_warps=4, num_stages=2, programs_per_sm=2)
    elif head_dim_padded <= 64:
        cfg = dict(block_m=64, block_n=128, num_warps=4, num_stages=2, programs_per_sm=3,
                   maxnreg=168)
    else:
        cfg = dict(block_m=64, block_n=128, num_warps=4, num_stages=3, programs_per_sm=2)
    if recipe is not None and recipe.qk_terms == 2 and head_dim_padded <= 128:
        cfg.update(TWO_TERM_TILES)
    cfg.update(TILE_OVERRIDES.get(head_dim_padded, {}))
    if device.type == "cuda":
        cfg["num_programs"] = _sm_count(device.index or 0) * cfg["programs_per_sm"]
    else:
        # Interpreter: programs run one after another; a few still exercise the persistence.
        cfg["num_programs"] = 4
    return cfg


def _gluon_ws_possible(device: torch.device) -> bool:
    return (device.type == "cuda" and not env.triton_interpret() and not is_hip()
            and torch.cuda.get_device_capability(device) == (9, 0))


def plan_for(
    q_lens, k_lens, *, varlen: bool, num_heads: int, num_kv_heads: int, head_dim: int,
    is_causal: bool, device: torch.device, num_splits: int | None = None,
    num_programs: int | None = None, recipe: Recipe | None = None,
) -> tuple[Plan, dict]:
    """The cached plan of a call and its launch config. ``recipe``: the call's (None: the
    default), which decides with the shape which kernel runs (``kernel_for``)."""
    dp = padded_head_dim(head_dim)
    kernel = kernel_for(dp, max((int(x) for x in k_lens), default=0), is_causal, recipe, device)
    cfg = tile_config(dp, device, kernel, recipe, is_causal)
    cfg["kernel"] = kernel  # what use_gluon_sm90 reads at launch
    key = PlanKey(
        q_lens=tuple(int(x) for x in q_lens),
        k_lens=tuple(int(x) for x in k_lens),
        varlen=varlen,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        is_causal=is_causal,
        block_m=cfg["block_m"],
        block_n=cfg["block_n"],
        num_programs=num_programs or cfg["num_programs"],
        num_splits=num_splits,
        device=str(device),
    )
    return get_plan(key), cfg


@functools.cache
def _gluon_sm90_module(name: str = "attention_sm90"):
    """A Gluon sm_90 kernel module, or None where this Triton has no (compatible) Gluon."""
    try:
        return importlib.import_module(f".kernels.{name}", __package__)
    except Exception:  # noqa: BLE001 - an experimental API: any import failure means "absent"
        return None


def use_gluon_sm90(plan: Plan, recipe: Recipe, device: torch.device,
                   kernel: str | None = None) -> str | None:
    """Which Gluon Hopper kernel this call runs ("gluon-ws", "gluon"), or None (Triton).

    ``kernel_for`` decides: the warp-specialized one by default for long dense D=128 calls;
    the one-warpgroup one (``FP8DIT_KERNEL=gluon``) only when asked for (no faster than the
    Triton kernel, and its PV sum drifts at 200k tokens: benchmarks/NOTES.md, session 3). Only
    on an sm_90 GPU, for int8 QK + fp8 PV at padded head dims 64/128 and the tile shape it was
    written for; everything else, the CPU interpreter included, runs the Triton kernel.
    ``kernel``: the choice ``plan_for`` made (its ``cfg["kernel"]``); None makes it again.
    """
    key = plan.key
    if kernel is None:
        kernel = kernel_for(plan.head_dim_padded, max(key.k_lens, default=0), key.is_causal,
                            recipe, device)
    if device.type != "cuda" or is_hip() or env.triton_interpret() or kernel == "triton":
        return None
    if recipe.qk != "int8" or recipe.qk_terms != 1 or recipe.pv != "fp8":
        return None
    block_m = 128 if kernel == "gluon-ws" else 64
    block_ns = (128, 256) if kernel == "gluon-ws" else (128,)
    if (plan.head_dim_padded not in (64, 128) or key.block_m != block_m
            or key.block_n not in block_ns):
        return None
    if torch.cuda.get_device_capability(device) != (9, 0):
        return None
    name = "attention_sm90_ws" if kernel == "gluon-ws" else "attention_sm90"
    return kernel if _gluon_sm90_module(name) is not None else None


# Gluon kernel's ring of K/V stages (shared memory: (16 + 16) KB per stage at D=128, plus Q).
SM90_STAGES = 3


def _attention_sm90(plan: Plan, cfg: dict, ws: Workspace, tabs,
                    out, out_strides, lse, lse_strides, sm90: str) -> None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

    ws_kernel = sm90 == "gluon-ws"
    mod = _gluon_sm90_module("attention_sm90_ws" if ws_kernel else "attention_sm90")
    key = plan.key
    H, Hkv, D = key.num_heads, key.num_kv_heads, key.head_dim
    Dp, BM, BN = plan.head_dim_padded, key.block_m, key.block_n

    def desc(t, block, dtype):
        layout = gl.NVMMASharedLayout.get_default_for(block, dtype)
        return GluonDescriptor.from_tensor(t, block, layout)

    # One query tile's rows per program; the warp-specialized kernel's plan tile (128 rows)
    # is split between its two consumer warpgroups.
    rows = BM // 2 if ws_kernel else BM
    # K and V^T tiles of at most 128 keys (one dot each; a 256-key kv block loads two).
    sub_n = min(BN, 128)
    args = (
        desc(ws.q8.view(-1, Dp), [rows, Dp], gl.int8), ws.q_scale, ws.q_corr,
        desc(ws.k8.view(-1, Dp), [sub_n, Dp], gl.int8), ws.k_scale,
        desc(ws.v8t.view(-1, plan.k_total_padded), [Dp, sub_n], gl.float8e4nv),
        ws.v_scale, ws.v_mean,
        tabs["seq"], tabs["work"], tabs["work_indptr"],
        out, *out_strides, lse, *lse_strides, ws.part_o, ws.part_lse,
        D, plan.q_total_padded, plan.k_total_padded, ws.k_scale.shape[1], H // Hkv, Hkv,
    )
    meta = dict(DP=Dp, BLOCK_M=rows, BLOCK_N=BN, IS_CAUSAL=key.is_causal,
                STAGES=cfg.get("sm90_stages", SM90_STAGES), num_warps=4)
    if ws_kernel:
        mod.attention_fwd_sm90_ws_kernel[(plan.num_programs,)](
            *args, **meta,
            CONSUMER_REGS=cfg.get("sm90_consumer_regs", 240),
            TWO_LEVEL=cfg.get("sm90_two_level", True),
            # benchmarks only (wrong results): 1 = no exp2, 2 = no softmax, 3 = no softmax
            # and no P store
            ABLATE_EXP=cfg.get("sm90_ablate_exp", 0),
            PINGPONG=cfg.get("sm90_pingpong", False),
            # benchmarks only (wrong results), bits: 1 = no magic preset of the QK accumulator,
            # 2 = no per-block O rescale (with sm90_two_level=False; 256-key steps: no fold of
            # the block's PV sum into the fp32 sum), 4 = no row sum (128-key steps)
            ABLATE_MISC=cfg.get("sm90_ablate_misc", 0),
            K_SUB=ws.k_sub,
            # 256-key steps: the PV dots read P from registers instead of shared memory
            P_REGS=cfg.get("sm90_p_regs", False),
            # 256-key steps with P from registers: P's row sums from N=8 dots with a tile of
            # ones (off: FADDs and a row reduction)
            ROWSUM_DOT=bool(cfg.get("sm90_rowsum_dot", False) and BN > 128
                            and cfg.get("sm90_p_regs", False)),
            # 256-key steps: K and V of a ring slot on their own barriers, V's waited for
            # before the exponentials
            SPLIT_KV=bool(cfg.get("sm90_split_kv", False) and BN > 128),
        )
    else:
        mod.attention_fwd_sm90_kernel[(plan.num_programs,)](*args, **meta, **_register_cap(cfg))


def attention_stage(plan: Plan, cfg: dict, ws: Workspace,
                    out, out_strides, lse, lse_strides, sm90: str | None = None,
                    tabs: dict | None = None) -> None:
    """Persistent attention over the plan's work list, then the split-KV merge."""
    key = plan.key
    tabs = tabs or plan.tables(out.device)
    H, Hkv, D = key.num_heads, key.num_kv_heads, key.head_dim
    Dp, BM, BN = plan.head_dim_padded, key.block_m, key.block_n
    if plan.n_work and sm90:
        _attention_sm90(plan, cfg, ws, tabs, out, out_strides, lse, lse_strides, sm90)
    elif plan.n_work:
        if ws.k_sub != 1:
            raise ValueError(f"the Triton kernel reads one K scale per kv block of {BN} keys; "
                             f"this workspace has {ws.k_sub} "
                             f"(quantize.K_SCALE_KEYS={quantize.K_SCALE_KEYS})")
        tgt = target_of(out.device)
        desc_q = TensorDescriptor.from_tensor(ws.q8.view(-1, Dp), [BM, Dp])
        desc_k = TensorDescriptor.from_tensor(ws.k8.view(-1, Dp), [BN, Dp])
        desc_v = TensorDescriptor.from_tensor(ws.v8t.view(-1, plan.k_total_padded), [Dp, BN])
        two_term = ws.q8lo is not None
        if two_term:
            desc_qlo = TensorDescriptor.from_tensor(ws.q8lo.view(-1, Dp), [BM, Dp])
            desc_klo = TensorDescriptor.from_tensor(ws.k8lo.view(-1, Dp), [BN, Dp])
        else:
            desc_qlo, desc_klo = desc_q, desc_k  # not read
        attention_fwd_persistent_kernel[(plan.num_programs,)](
            desc_q, ws.q_scale, ws.q_corr, desc_k, ws.k_scale, desc_v, ws.v_scale, ws.v_mean,
            tabs["seq"], tabs["work"], tabs["work_indptr"],
            out, *out_strides, lse, *lse_strides, ws.part_o, ws.part_lse,
            D, plan.q_total_padded, plan.k_total_padded, ws.k_scale.shape[1], H // Hkv, Hkv,
            DP=Dp, BLOCK_M=BM, BLOCK_N=BN, IS_CAUSAL=key.is_causal, QK_INT8=ws.qk_int8,
            SOFT_FP8_CAST=env.triton_interpret(), PV_BF16=ws.pv_bf16,
            desc_qlo=desc_qlo, desc_klo=desc_klo, QK_TWO_TERM=two_term,
            P_SHIFT=tgt.fp8.p_shift, FP8_FNUZ=tgt.fp8.fnuz,
            num_warps=cfg["num_warps"], num_stages=_num_stages(cfg, ws),
            **_launch_options(cfg, tgt),
        )
    merge_stage(plan, ws, tabs, out, out_strides, lse, lse_strides)


def _register_cap(cfg: dict) -> dict:
    """``maxnreg`` when the config caps registers (three programs per SM need at most
    65,536 / (3 * 128) = 170 per thread; ptxas otherwise takes all 255). The interpreter
    ignores it; passing it there lets the sm_90 SASS test record it."""
    if cfg.get("maxnreg"):
        return {"maxnreg": cfg["maxnreg"]}
    return {}


def _launch_options(cfg: dict, tgt: Target) -> dict:
    """The launch options of a tile config beyond warps and stages: ``maxnreg`` on NVIDIA (and
    the interpreter, which ignores it), ``waves_per_eu`` on AMD (HIP has no ``maxnreg``)."""
    if tgt.hip:
        return {"waves_per_eu": cfg["waves_per_eu"]} if cfg.get("waves_per_eu") else {}
    return _register_cap(cfg)


def _num_stages(cfg: dict, ws: Workspace) -> int:
    # bf16 V doubles the V tile: at 64x128 tiles, D128 and 3 stages that is ~152 KB of shared
    # memory per program, too much for the two programs per SM the tiles were tuned with. Two
    # stages bring it back to the default recipe's ~104 KB. Not measured on a GPU yet.
    if ws.pv_bf16 and cfg["programs_per_sm"] > 1:
        return min(cfg["num_stages"], 2)
    return cfg["num_stages"]


def launch_fp8_attention(
    plan: Plan, cfg: dict, recipe: Recipe, scale: float,
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
        sm90 = use_gluon_sm90(plan, recipe, q.device, cfg.get("kernel"))
        ws = quantize_stage(plan, recipe, scale, q, q_strides, k, k_strides, v, v_strides,
                            kv_perm16=sm90 is not None, tabs=tabs, rope=rope,
                            rope_start=rope_start)
        attention_stage(plan, cfg, ws, out, out_strides, lse, lse_strides, sm90=sm90,
                        tabs=tabs)


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
    rope: torch.Tensor | None = None, rope_start: int = 0,
):
    """Dense FP8 attention; returns (out in q's layout and dtype, lse [B, H, Sq] fp32).

    ``k_lens``: keys each sequence attends to, a prefix of its ``Sk`` (a key-padding mask that
    keeps the first ``k_lens[b]`` keys, ``fp8dit.key_padding``); None: all. The plan carries the
    lengths, so the kernels never read the keys past them; a sequence with none gets zeros and
    lse -inf. ``device_k_lens``: the same as an int32 [B] device tensor, each in [1, Sk], that
    the host never reads (CUDA-graph capture): the plan is the one for all ``Sk`` keys, built
    beforehand (:func:`launch_fp8_attention`). ``rope``: rotary tables
    (:func:`fp8dit.rope.rope_tables`, Sq == Sk) that Q and K are rotated by first, from token
    ``rope_start`` on."""
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
    plan, cfg = plan_for(
        [Sq] * B, k_lens, varlen=False, num_heads=H, num_kv_heads=Hkv, head_dim=D,
        is_causal=is_causal, device=q.device, num_splits=num_splits, recipe=recipe,
    )
    if plan.needs_zero_fill:
        out.zero_()
        lse.fill_(-math.inf)
    if device_k_lens is not None and (is_causal or k_lens != [Sk] * B):
        raise ValueError("device_k_lens: expected a non-causal call without k_lens")
    launch_fp8_attention(
        plan, cfg, recipe, scale,
        q, _bthd_strides(q, layout), k, _bthd_strides(k, layout), v, _bthd_strides(v, layout),
        out, _bthd_strides(out, layout), lse, (lse.stride(0), lse.stride(1), lse.stride(2)),
        device_k_lens=device_k_lens, rope=rope, rope_start=rope_start,
    )
    return out, lse


def fp8_attention_varlen_fwd(
    q, k, v, q_lens, k_lens, *, scale: float, is_causal: bool, recipe: Recipe,
    num_splits: int | None = None,
):
    """Packed [T, H, D] FP8 attention; returns (out [Tq, H, D], lse [H, Tq] fp32)."""
    T, H, D = q.shape
    Hkv = k.shape[1]
    out = torch.empty_like(q)
    lse = torch.empty(H, T, device=q.device, dtype=torch.float32)
    if T == 0:
        return out, lse
    plan, cfg = plan_for(
        q_lens, k_lens, varlen=True, num_heads=H, num_kv_heads=Hkv, head_dim=D,
        is_causal=is_causal, device=q.device, num_splits=num_splits, recipe=recipe,
    )
    if plan.needs_zero_fill:
        out.zero_()
        lse.fill_(-math.inf)
    launch_fp8_attention(
        plan, cfg, recipe, scale,
        q, _bthd_strides(q, "varlen"), k, _bthd_strides(k, "varlen"),
        v, _bthd_strides(v, "varlen"),
        out, _bthd_strides(out, "varlen"), lse, (0, lse.stride(0), lse.stride(1)),
    )
    return out, lse


