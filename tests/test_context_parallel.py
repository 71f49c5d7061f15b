"""Context parallelism through diffusers with backend "fp8dit": 2 real processes, gloo, CPU.

One spawn of 2 ranks (torch.multiprocessing, gloo on a free localhost port) runs everything
distributed once, saves what it saw, and the tests below judge it against single-process
forwards computed here:

* a tiny ``WanTransformer3DModel`` (10 heads x 64, 126 tokens: 63 per rank, no tile multiple)
  under ``ContextParallelConfig(ulysses_degree=2)`` (5 heads per rank, an odd count) and under
  ``ContextParallelConfig(ring_degree=2)`` (fp8dit partials merged by their LSE), against the
  single-process fp8dit forward and the bf16 ``native`` forward;
* diffusers' ring and Ulysses attention (and their "anything" variants: uneven tokens and
  heads per rank) called directly with ``return_lse=True``, against fp64.

The ranks run the real Triton kernels through Triton's interpreter (TRITON_INTERPRET=1, set by
conftest.py in this process and inherited by the spawned ones, which import triton afresh).
Two shims make diffusers 0.42's context parallelism run on a CPU-only torch (see
``_diffusers_cpu_shims``); everything else is diffusers' own code.
"""

import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")

import torch.distributed as dist  # noqa: E402
from conftest import TINY_WAN_TEXT, build_tiny_wan  # noqa: E402
from diffusers import ContextParallelConfig  # noqa: E402
from engines import ranks as engine_ranks  # noqa: E402

import fp8dit  # noqa: E402
from fp8dit.integrations import diffusers as fd  # noqa: E402
from fp8dit.integrations.capture import attention_layer_outputs  # noqa: E402
from fp8dit.testing import attention_ref, error_stats  # noqa: E402

WORLD = 2
TIMEOUT_S = 150  # the spawn takes 20-40 s on 2 CPU cores; a hang fails instead of blocking CI
HEADS = 10  # Ulysses: 5 per rank
LAYERS = 2
LATENT = (2, 14, 18)  # -> 2 x 7 x 9 = 126 tokens, 63 per rank
TOKENS = LATENT[0] * (LATENT[1] // 2) * (LATENT[2] // 2)
TEXT = TINY_WAN_TEXT  # cross-attention keys; diffusers' Wan plan does not split the text
# Random weights give near-uniform attention (scores of std ~1 over 126 keys), under which even a
# ring merge with the LSE in log2 units stayed at cos 0.9997: sharper scores (x4) make the tiny
# model see a wrong merge (cos 0.998, error x2.4).
QK_GAIN = 2.0
MODES = {"ulysses": dict(ulysses_degree=WORLD), "ring": dict(ring_degree=WORLD)}
# Direct attention calls with return_lse: config, batch, tokens in all (113 + 113 or 113 + 112
# per rank), heads (Ulysses: 5 per rank; anything: 3 + 2), seed.
LSE_CASES = {
    "ulysses": (dict(ulysses_degree=WORLD), 2, 226, HEADS, 11),
    "ring": (dict(ring_degree=WORLD), 2, 226, 3, 12),
    "ulysses-anything": (dict(ulysses_degree=WORLD, ulysses_anything=True), 1, 225, 5, 13),
    "ring-anything": (dict(ring_degree=WORLD, ring_anything=True), 1, 225, 3, 14),
}

# Thresholds. Measured (interpreter, int8qk-fp8pv): per attention layer, Ulysses equals the
# single-process fp8dit forward exactly (every head sees all tokens, as in one process); ring
# quantizes each key chunk on its own, cos >= 0.99938 against it. Against bf16 both reach cos
# >= 0.9996 per layer, the same error as single-process fp8dit (rel-L1 ratio 0.93-1.0).
COS_VS_SINGLE_FP8DIT = 0.999
COS_VS_BF16 = 0.995
ERROR_RATIO_VS_BF16 = 1.25  # rel-L1 vs bf16 over single-process fp8dit's; wrong merge: 2.4
LSE_MAX_ABS = 0.03  # like test_diffusers.py's single-process LSE test


def _kernels_interpreted() -> bool:
    from fp8dit.kernels import attention as kernels

    return type(kernels.attention_fwd_persistent_kernel).__name__ == "InterpretedFunction"


def _tiny_wan():
    return build_tiny_wan(heads=HEADS, num_layers=LAYERS, latent=LATENT, qk_gain=QK_GAIN,
                          device="cpu")


def _qkv(case):
    _, B, S, H, seed = LSE_CASES[case]
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, S, H, 64, generator=g).bfloat16() for _ in range(3))


# ---------------------------------------------------------------------------------------------
# The ranks
# ---------------------------------------------------------------------------------------------


def _diffusers_cpu_shims():
    """What diffusers 0.42's context parallelism lacks on a CPU-only torch (not fp8dit's part).

    * ``ModelMixin._resolve_parallel_config`` computes ``rank % torch.accelerator.device_count()``,
      which is ``rank % 0`` without an accelerator: count 1 gives device ``cpu:0``.
    * ``hooks.context_parallel`` calls ``logger.warning_once`` (a method transformers adds to
      ``logging.Logger`` on import) when an input is not split, here Wan's 1-D ``timestep``.
    """
    import diffusers.hooks.context_parallel as hooks

    if torch.accelerator.device_count() == 0:
        torch.accelerator.device_count = lambda: 1
    if not hasattr(hooks.logger, "warning_once"):
        hooks.logger.warning_once = functools.lru_cache(None)(hooks.logger.warning)


def _parallel_config(rank, **degrees):
    """A diffusers ParallelConfig on its own mesh, as ``enable_parallelism`` builds one."""
    from diffusers.models._modeling_parallel import ParallelConfig
    from torch.distributed.device_mesh import init_device_mesh

    cp = ContextParallelConfig(**degrees)
    config = ParallelConfig(context_parallel_config=cp)
    mesh = init_device_mesh("cpu", cp.mesh_shape, mesh_dim_names=cp.mesh_dim_names)
    config.setup(rank, WORLD, torch.device("cpu"), mesh=mesh)
    return config


def _run_rank(rank):
    assert _kernels_interpreted(), "TRITON_INTERPRET=1 did not reach the spawned rank"
    _diffusers_cpu_shims()
    fd.register()
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    results = {}
    for mode, degrees in MODES.items():
        model, inputs = _tiny_wan()
        fp8dit.enable(model)
        model.enable_parallelism(config=ContextParallelConfig(**degrees))
        with fd.record_calls() as calls:
            t0 = time.perf_counter()
            out, layers = attention_layer_outputs(model, inputs)  # layers: this rank's tokens only
            seconds = time.perf_counter() - t0
        results[mode] = dict(out=out, layers=layers, calls=list(calls), seconds=seconds)

    # diffusers' templated attention called as Wan's processor calls it, plus return_lse.
    for case, (degrees, *_) in LSE_CASES.items():
        q, k, v = _qkv(case)
        local = torch.arange(q.shape[1]).tensor_split(WORLD)[rank]  # diffusers' split
        with fd.record_calls() as calls:
            o, lse = dispatch_attention_fn(
                q[:, local], k[:, local], v[:, local], backend="fp8dit",
                attention_kwargs={"return_lse": True},
                parallel_config=_parallel_config(rank, **degrees),
            )
        results["lse-" + case] = dict(out=o, lse=lse, local=local, calls=list(calls))
    return results


def _worker(rank, port):
    # "cpu:gloo", not "gloo": CPU tensors over gloo whatever torch.accelerator says (a CUDA build
    # of torch on a machine without a GPU names cuda, and diffusers gathers sizes there unless the
    # backend string names the CPU).
    dist.init_process_group("cpu:gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    try:
        results = _run_rank(rank)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return results


# ---------------------------------------------------------------------------------------------
# Fixtures: one spawn, single-process references
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ranks():
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with the gloo backend is not available in this torch")
    if os.environ.get("TRITON_INTERPRET") != "1" or not _kernels_interpreted():
        pytest.skip("the CPU ranks need Triton's interpreter (TRITON_INTERPRET=1, set by "
                    "conftest.py without a GPU); on GPUs run benchmarks/bench_context_parallel.py")
    return engine_ranks.run(_worker, timeout_s=TIMEOUT_S)


@pytest.fixture(scope="module")
def single():
    """Single-process forwards of the same model: fp8dit and bf16 native."""
    fd.register()
    model, inputs = _tiny_wan()
    fd.disable(model)
    out = {"native": attention_layer_outputs(model, inputs)}
    fp8dit.enable(model)
    with fd.record_calls() as calls:
        out["fp8dit"] = attention_layer_outputs(model, inputs)
    fd.disable(model)
    assert {c["backend"] for c in calls} == {"fp8"}, calls
    return out


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------


def _check_model(results, single, mode):
    """Every attention layer (ranks' tokens concatenated) and the gathered final output: close
    to single-process fp8dit and bf16, and no further from bf16 than single-process fp8dit."""
    outs = [r[mode]["out"] for r in results]
    assert outs[0].shape == single["fp8dit"][0].shape  # gathered by the plan's proto_out hook
    assert torch.equal(outs[0], outs[1])
    failures = []
    pairs = [(name, torch.cat([r[mode]["layers"][name] for r in results], dim=1),
              single["fp8dit"][1][name], single["native"][1][name])
             for name in single["fp8dit"][1]]
    pairs.append(("output", outs[0], single["fp8dit"][0], single["native"][0]))
    for name, got, fp8, bf16 in pairs:
        vs_fp8, vs_bf16, fp8_vs_bf16 = error_stats(got, fp8), error_stats(got, bf16), \
            error_stats(fp8, bf16)
        ratio = vs_bf16.rel_l1 / max(fp8_vs_bf16.rel_l1, 1e-12)
        print(f"{mode} {name}: vs single fp8dit {vs_fp8} | vs bf16 {vs_bf16} "
              f"(x{ratio:.2f} single fp8dit's rel-L1)")
        if vs_fp8.nan or vs_fp8.cos < COS_VS_SINGLE_FP8DIT:
            failures.append(f"{name} vs single-process fp8dit: {vs_fp8}")
        if vs_bf16.nan or vs_bf16.cos < COS_VS_BF16 or ratio > ERROR_RATIO_VS_BF16:
            failures.append(f"{name} vs bf16: {vs_bf16}, x{ratio:.2f} single fp8dit's rel-L1")
    print(f"{mode}: forward {results[0][mode]['seconds']:.1f} s (interpreter)")
    assert not failures, failures


def _shapes(calls):
    return sorted((c["q"], c["k"]) for c in calls)


def test_ulysses_tiny_wan_matches_single_process(ranks, single):
    local_q = TOKENS // WORLD
    for r in ranks:
        calls = r["ulysses"]["calls"]
        # FP8 everywhere, 5 heads per rank included. Self-attention: all tokens, half the
        # heads; cross-attention keeps all heads (diffusers' Wan passes no parallel config).
        assert {c["backend"] for c in calls} == {"fp8"}, calls
        self_attn = ((1, TOKENS, HEADS // WORLD, 64), (1, TOKENS, HEADS // WORLD, 64))
        cross = ((1, local_q, HEADS, 64), (1, TEXT, HEADS, 64))
        assert _shapes(calls) == sorted([self_attn, cross] * LAYERS), calls
    _check_model(ranks, single, "ulysses")


def test_ring_tiny_wan_matches_single_process(ranks, single):
    local = TOKENS // WORLD
    for r in ranks:
        calls = r["ring"]["calls"]
        # Per layer: one FP8 call per key chunk of the ring (all heads), then cross-attention.
        assert {c["backend"] for c in calls} == {"fp8"}, calls
        chunk = ((1, local, HEADS, 64), (1, local, HEADS, 64))
        cross = ((1, local, HEADS, 64), (1, TEXT, HEADS, 64))
        assert _shapes(calls) == sorted([chunk, chunk, cross] * LAYERS), calls
    _check_model(ranks, single, "ring")


@pytest.mark.parametrize("case", list(LSE_CASES))
def test_context_parallel_lse_against_fp64(ranks, case):
    q, k, v = _qkv(case)
    _, B, S, H, _ = LSE_CASES[case]
    ref, ref_lse = attention_ref(q, k, v, return_lse=True)
    for rank, r in enumerate(ranks):
        res = r["lse-" + case]
        local = res["local"]
        assert {c["backend"] for c in res["calls"]} == {"fp8"}, res["calls"]
        heads = sorted({c["q"][2] for c in res["calls"]})
        split_heads = len(torch.arange(H).tensor_split(WORLD)[rank])  # Ulysses' share
        assert heads == [H if case.startswith("ring") else split_heads], res["calls"]
        out, lse = res["out"], res["lse"]
        assert out.shape == (B, len(local), H, 64) and out.dtype == torch.bfloat16
        assert lse.shape == (B, len(local), H) and lse.dtype == torch.float32  # [B, S, H]
        stats = error_stats(out, ref[:, local])
        err = (lse.double() - ref_lse.transpose(1, 2)[:, local]).abs().max().item()
        print(f"{case} rank {rank}: {len(local)} tokens, fp8dit calls on {heads} heads; "
              f"out {stats}; lse max abs err {err:.2e}")
        assert not stats.nan and stats.cos >= 0.999, str(stats)
        assert err < LSE_MAX_ABS, err


def test_ring_key_value_views_of_an_all_gather_are_waited_for(fp8_at_any_length):
    """diffusers' ring hands fp8dit views of an AsyncCollectiveTensor (its all-gather); the
    eager Triton launch must not get the wrapper (on CPU it has no storage; on GPU the gather
    may still be in flight)."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    g = torch.Generator().manual_seed(3)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v = (torch.randn(1, n, 3, 64, generator=g).bfloat16().to(device)
               for n in (70, 50, 50))
    gathered = AsyncCollectiveTensor(torch.cat([k.flatten(), v.flatten()]))
    k_view = gathered[:k.numel()].reshape_as(k)
    v_view = gathered[k.numel():].reshape_as(v)
    assert isinstance(k_view, AsyncCollectiveTensor) and isinstance(v_view, AsyncCollectiveTensor)
    with fd.record_calls() as calls:
        out, lse = fd._cp_forward_op(None, q, k_view, v_view, return_lse=True)
    assert [c["backend"] for c in calls] == ["fp8"]
    ref, ref_lse = attention_ref(q, k, v, return_lse=True)
    assert error_stats(out, ref).cos >= 0.999
    assert (lse.double() - ref_lse.transpose(1, 2)).abs().max().item() < LSE_MAX_ABS


def test_benchmark_exits_with_one_line_outside_torchrun_or_without_cuda():
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_context_parallel.py"
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "LOCAL_RANK", "RANK")}
    res = subprocess.run([sys.executable, str(script), "--layers", "1"], env=env,
                         capture_output=True, text=True, timeout=120)
    lines = res.stdout.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, (res.stdout, res.stderr[-2000:])
    expected = ("needs CUDA GPUs; torch sees none" if not torch.cuda.is_available()
                else "run 2 processes with torchrun: torchrun --nproc-per-node 2")
    assert lines[0].startswith("bench_context_parallel: ") and expected in lines[0], lines
