"""Every kernel launch the FP8 path makes compiles for sm_90 (H100/H200), checked without a GPU.

The interpreter runs Python semantics and accepts things compiled Triton rejects (a plain
global inside a kernel passed the CPU suite and failed on the H200). Here the launches of real
calls are recorded under the interpreter (argument types, constexprs, warps, stages), then a
subprocess without TRITON_INTERPRET compiles each with Triton's compiler for sm_90 and reads the
SASS: the attention kernel must use Hopper tensor-core MMAs (IGMMA/QGMMA) and TMA, and must not
spill (no LDL/STL) on the measured path; spills elsewhere are reported as a warning. The
measured path's instructions per kv step are held to bounds measured per Triton release
(``HOT_LOOP_INSTRUCTIONS``); on a release without them only that check is skipped.
"""

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
import triton

import fp8dit
from fp8dit import attend, device, quantize, tuning
from fp8dit.recipes import DEFAULT_RECIPE, RECIPES

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from launches import record  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET", "0") != "1", reason="records launches in the interpreter"
)


def _record(monkeypatch):
    launches = record(monkeypatch, _calls)
    assert any(r["constexprs"].get("KAMAX_FROM_STATS") for r in launches)
    assert {r["constexprs"].get("ROPE") for r in launches} >= {0, 1, 2, 3}
    assert any(r["constexprs"].get("ROPE_RANGE") for r in launches)
    # the balance recipes: channel sums, then their vectors
    assert {"channel_moments_kernel", "balance_vectors_kernel"} <= {r["name"] for r in launches}
    return launches


def _calls():
    # One call per recipe and padded head dim, causal and not, with a split-KV merge.
    g = torch.Generator().manual_seed(0)
    for recipe in RECIPES:
        for D, causal in ((64, False), (128, False), (128, True), (200, False)):
            q, k, v = (torch.randn(1, 150, 2, D, generator=g).bfloat16() for _ in range(3))
            fp8dit.attention(q, k, v, backend="fp8", recipe=recipe, is_causal=causal,
                             num_splits=2)
    # The warp-specialized kernel's 256-key blocks (its launch needs a GPU): the quantization
    # they take, with each block's K amax from the statistics pass.
    for D in (64, 128):
        q, k, v = (torch.randn(1, 600, 2, D, generator=g).bfloat16() for _ in range(3))
        with tuning.override(tiles={D: dict(block_n=256)}):
            plan, _ = attend.plan_for([600], [600], varlen=False, num_heads=2, num_kv_heads=2,
                                      head_dim=D, is_causal=False, device=q.device)
        st = attend._bthd_strides(q, "NHD")
        quantize.quantize_stage(plan, RECIPES[DEFAULT_RECIPE], 0.1, q, st, k, st, v, st,
                             kv_perm16=True)
        for dtype in (torch.float32, torch.bfloat16):  # with Wan's rotary tables fused in
            tables = torch.randn(2, 600, D // 2, generator=g).to(dtype)
            quantize.quantize_stage(plan, RECIPES[DEFAULT_RECIPE], 0.1, q, st, k, st, v, st,
                                 kv_perm16=True, rope=tables)
        # diffusers' apply_rotary_emb on the tokens after a text prefix (CogVideoX)
        tables = torch.randn(2, 500, D, generator=g)  # whole cos and sin rows
        quantize.quantize_stage(plan, RECIPES[DEFAULT_RECIPE], 0.1, q, st, k, st, v, st,
                             kv_perm16=True, rope=tables, rope_start=100)
        # the balance recipe's channel sums with the rotation fused in
        quantize.quantize_stage(plan, RECIPES["int8qk-fp8pv-bal"], 0.1, q, st, k, st, v, st,
                                kv_perm16=True, rope=tables, rope_start=100)


def _compile_for_sm90(launches, tmp_path, timeout):
    """Each recorded launch compiled for sm_90 by tests/tools/sm90_compile.py in a process of
    its own (compiled, so without TRITON_INTERPRET): one result dict per launch."""
    path = tmp_path / "launches.json"
    path.write_text(json.dumps(launches))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    tool = os.path.join(os.path.dirname(__file__), "tools", "sm90_compile.py")
    proc = subprocess.run([sys.executable, tool, str(path)], capture_output=True, text=True,
                          env=env, timeout=timeout)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(launches), proc.stderr[-3000:]
    return results


def test_every_launch_compiles_for_sm90_hot_path_without_spills(monkeypatch, tmp_path):
    launches = _record(monkeypatch)
    assert {r["name"] for r in launches} >= {
        "attention_fwd_persistent_kernel", "merge_partials_kernel", "quantize_q_kernel"
    }
    results = _compile_for_sm90(launches, tmp_path, timeout=900)
    failed = [r for r in results if not r["ok"]]
    assert not failed, failed[0]
    spills = [r for r in results if r["sass"].get("LDL") or r["sass"].get("STL")]
    # The path measured on the H200 (non-causal, int8 QK and fp8 PV, head dim <= 128) does
    # not spill inside its kv-block loops on any release measured (a few spills in a work
    # item's prologue/epilogue run once per item); other variants' spills are reported.
    hot = [r for r in results if r["name"] == "attention_fwd_persistent_kernel"
           and not r["constexprs"]["IS_CAUSAL"] and r["constexprs"]["DP"] <= 128
           and r["constexprs"]["QK_INT8"] and not r["constexprs"].get("PV_BF16", False)]
    assert {r["constexprs"]["DP"] for r in hot} == {64, 128}
    assert not [r for r in hot if r["loop_spills"]], f"spills in the hot loop: {hot}"
    if spills:
        warnings.warn("register spills (outside the hot loop): " + "; ".join(
            f"{r['name']} {r['constexprs']} LDL={r['sass'].get('LDL', 0)} "
            f"in-loop={r['loop_spills']}" for r in spills), stacklevel=1)
    for r in results:
        sass = r["sass"]
        if r["name"] == "attention_fwd_persistent_kernel":
            assert sass.get("IGMMA", 0) + sass.get("QGMMA", 0) + sass.get("HGMMA", 0) > 0, r
            assert sass.get("UTMALDG", 0) > 0, f"tiles not loaded by TMA: {r}"
            # the unmasked kv loop and the masked one, both on tensor cores
            assert len(r["loops"]) == 2 and all(lp["igmma"] + lp["qgmma"] for lp in r["loops"])
    release = ".".join(triton.__version__.split(".")[:2])
    if release not in HOT_LOOP_INSTRUCTIONS:
        pytest.skip(f"hot-loop instruction bounds measured on triton "
                    f"{', '.join(HOT_LOOP_INSTRUCTIONS)}, not {triton.__version__}: the "
                    "version-independent checks passed, the bounds were not checked")
    for r in hot:
        c = r["constexprs"]
        bound = HOT_LOOP_INSTRUCTIONS[release][c["DP"], bool(c.get("QK_TWO_TERM"))]
        assert min(lp["instructions"] for lp in r["loops"]) <= bound, r


# Instructions per kv step of the Triton attention kernel's unmasked loop on the measured path
# (recorded launches: head dim 64 with 128-key blocks and 168 registers, 128 with 128-key
# blocks; the two-term recipe's 64-key blocks), per Triton release (major.minor, measured on
# the x.y.0 wheel; docs/triton_releases.md).
HOT_LOOP_INSTRUCTIONS = {  # (padded head dim, two-term QK) -> instructions
    "3.6": {(64, False): 623, (128, False): 659, (64, True): 478, (128, True): 531},
    "3.8": {(64, False): 611, (128, False): 651, (64, True): 480, (128, True): 529},
    "3.9": {(64, False): 606, (128, False): 653, (64, True): 484, (128, True): 519},
}


@pytest.mark.parametrize("args", [["kv"], ["kv", "--dp", "64", "--rows", "64"], ["q"],
                                  ["stats"], ["stats", "--dp", "64", "--sub", "8"],
                                  ["kv", "--rope", "2"], ["q", "--rope", "2"],
                                  ["stats", "--rope", "2"], ["stats", "--rope", "1"],
                                  ["kv", "--rope", "3", "--rope-range"],
                                  ["q", "--rope", "3", "--rope-range"],
                                  ["stats", "--rope", "3", "--rope-range"],
                                  ["stats", "--dtype", "fp16"],
                                  ["kv", "--rotate", "--balance"],
                                  ["kv", "--dp", "64", "--rows", "64", "--rotate"],
                                  ["q", "--rotate", "--balance"],
                                  ["stats", "--rotate", "--balance"],
                                  ["stats", "--dp", "64", "--sub", "8", "--rotate"]],
                         ids=["kv-d128", "kv-d64", "q", "stats-d128", "stats-d64",
                              "kv-d128-rope", "q-rope", "stats-d128-rope", "stats-rope-fp32",
                              "kv-rope-four", "q-rope-four", "stats-rope-four", "stats-fp16",
                              "kv-d128-bal", "kv-d64-rot", "q-bal", "stats-d128-bal",
                              "stats-d64-rot"])
def test_quantizers_store_16_bytes_at_a_time_without_spills_on_sm90(args):
    """The quantization kernels as the H200 runs them (the launch's specializations included),
    the rotating recipes' in the same program shapes: global stores vectorized and no spills,
    with every Triton release measured (3.6, 3.8, 3.9). V^T's store went byte-wise once when
    its base's alignment was unknown (32 STG.E.U8 per thread, a spilling program)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    tool = os.path.join(os.path.dirname(__file__), "tools", "sass_quantize.py")
    proc = subprocess.run([sys.executable, tool, *args], capture_output=True, text=True,
                          env=env, timeout=600)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert rows, proc.stderr[-3000:]
    ops = rows[0]["ops"]
    assert not [op for op in ops if op.startswith(("STG.E.U8", "STG.E.U16", "LDL", "STL"))], ops
    if args[0] != "stats":
        assert ops.get("STG.E.128", 0) >= 2, ops


def test_rotation_fits_sm90_shared_memory_at_every_head_dim(monkeypatch, tmp_path):
    """The rotating recipes' quantization launches, compiled for sm_90, at padded head dims 64,
    128 and 256 and with one and two QK terms: each within the shared memory a program may hold.
    The rotation is a Walsh-Hadamard transform in registers; the tf32 dot with a [Dp, Dp] fp32
    matrix it replaced needed 320 KB (640 KB with two terms) at 256, over sm_90's 227 KB."""

    def calls():
        g = torch.Generator().manual_seed(0)
        for name, recipe in RECIPES.items():
            if recipe.rotate:
                for D in (64, 128, 256):
                    q = torch.randn(1, 150, 2, D, generator=g).bfloat16()
                    fp8dit.attention(q, q, q, backend="fp8", recipe=name)

    launches = [r for r in record(monkeypatch, calls, execute=False)
                if r["name"].startswith("quantize_") and r["constexprs"].get("ROTATE")]
    results = _compile_for_sm90(launches, tmp_path, timeout=600)
    assert all(r["ok"] for r in results), [r for r in results if not r["ok"]][:1]
    seen = {(r["constexprs"]["DP"], 2 if r["constexprs"]["TWO_TERM"] else 1) for r in results}
    assert seen == {(dp, terms) for dp in (64, 128, 256) for terms in (1, 2)}
    limit = device.NVIDIA_SHARED_BYTES["sm_90"]
    over = [(r["name"], r["constexprs"]["DP"], r["shared"]) for r in results
            if r["shared"] > limit]
    assert not over, over
