"""Every kernel launch the FP8 path makes on AMD Instinct compiles for it, checked without one.

The launches of real calls (and of key-padding masks' statistics) are recorded under the
interpreter as gfx942 (MI300X, fnuz fp8) and gfx950 (MI355X, OCP fp8) would make them
(``fp8dit.device.interpret_as``: their fp8 format, tiles, wavefronts and waves_per_eu), then a
subprocess per architecture without TRITON_INTERPRET compiles each with Triton's HIP backend
(``triton.compile(..., target=GPUTarget("hip", arch, 64))``) and reads the ISA
(tests/tools/hip_compile.py). Asserted: both attention dots on native matrix instructions (int8
or fp8 MFMA for QK, fp8 or bf16 MFMA for PV, never the f16 fallback that a foreign fp8 format
takes), P and V converted to fp8 by the native instruction, no spills in the unmasked kv loop
of the path that auto runs (default recipe, head dim <= 128, non-causal), and every program's
LDS within the CU's. Spills elsewhere are reported in the ISA table (``-s`` prints it).

CI compiles every recipe at head dim 128 and the default one at 64, 128 (causal too) and 256
(~50 launches per architecture, the two compiled side by side); ``HIP_COMPILE_ALL=1`` compiles
every recipe at every head dim (~110 launches per architecture). Needs triton 3.8 or newer
(the HIP backend of older releases does not know gfx950).
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
from fp8dit import attend, device, key_padding, tuning
from fp8dit.recipes import DEFAULT_RECIPE, RECIPES, get_recipe

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from hip_compile import table  # noqa: E402
from launches import record  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1",
                                reason="records launches in the interpreter")
_RELEASE = tuple(int(x) for x in triton.__version__.split(".")[:2])
needs_hip_compiler = pytest.mark.skipif(
    _RELEASE < (3, 8),
    reason=f"compiling for gfx942/gfx950 needs triton 3.8 or newer, this is {triton.__version__}")

ARCHS = ("gfx942", "gfx950")
ALL = os.environ.get("HIP_COMPILE_ALL", "0") == "1"
# matrix instructions by operand type, as the ISA spells them
QK_INT8_MFMA = ("_i8",)
FP8_MFMA = ("_fp8_fp8", "_f8f6f4")
BF16_MFMA = ("_bf16",)


def _calls(arch: str, everything: bool = ALL):
    """The dispatcher's launches on ``arch``: the default recipe at padded head dims 64, 128
    and 256, causal and not, with a split-KV merge, and every other recipe at 128 (the rotating
    ones at 256 too; all at every head dim with ``everything``); the fused rotary's three
    arithmetics (one with a token range, and the balance recipe's channel sums with it);
    float16 inputs; a key-padding mask's statistics."""

    def run():
        g = torch.Generator().manual_seed(0)
        with device.interpret_as(arch):
            for recipe in RECIPES:
                for D, causal in ((64, False), (128, False), (128, True), (200, False)):
                    # the rotating recipes at 256 too: their LDS is checked below
                    wanted = ((128, False), (200, False)) if RECIPES[recipe].rotate \
                        else ((128, False),)
                    if recipe != DEFAULT_RECIPE and (D, causal) not in wanted \
                            and not everything:
                        continue
                    q, k, v = (torch.randn(1, 300, 2, D, generator=g).bfloat16()
                               for _ in range(3))
                    fp8dit.attention(q, k, v, backend="fp8", recipe=recipe, is_causal=causal,
                                     num_splits=2)
            for D in ((64, 128) if everything else (128,)):
                q, k, v = (torch.randn(1, 300, 2, D, generator=g).bfloat16() for _ in range(3))
                for dtype in (torch.float32, torch.bfloat16):  # Wan's tables, fp32 and bf16
                    cos, sin = (torch.randn(300, D, generator=g).to(dtype) for _ in range(2))
                    fp8dit.attention(q, k, v, backend="fp8", rotary=(cos, sin))
                cos, sin = (torch.randn(200, D, generator=g) for _ in range(2))
                for recipe in (DEFAULT_RECIPE, "int8qk-fp8pv-bal"):
                    fp8dit.attention(q, k, v, backend="fp8", recipe=recipe,
                                     rotary=fp8dit.Rotary(cos, sin, 100, "apply_rotary_emb"))
            fp8dit.attention(q[..., :64].half(), k[..., :64].half(), v[..., :64].half(),
                             backend="fp8")
            # a key-padding mask's statistics: rows as words, and a transposed mask as bytes
            mask = torch.rand(1, 300, 300, generator=g) < 0.9
            key_padding._row_counts_and_key_any(mask)
            key_padding._row_counts_and_key_any(mask.transpose(1, 2))

    return run


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, list[dict]]:
    """Each architecture's launches recorded, then compiled, the two side by side (once per
    module: ~1 CPU-minute each with triton 3.8)."""
    mp = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("hip")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    tool = os.path.join(os.path.dirname(__file__), "tools", "hip_compile.py")
    procs, counts = {}, {}
    try:
        for arch in ARCHS:
            launches = record(mp, _calls(arch), execute=False)
            counts[arch] = len(launches)
            path = tmp / f"{arch}.json"
            path.write_text(json.dumps(launches))
            procs[arch] = subprocess.Popen([sys.executable, tool, str(path), arch], env=env,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           text=True)
    finally:
        mp.undo()
    results = {}
    for arch, proc in procs.items():
        out, err = proc.communicate(timeout=1200)
        results[arch] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert len(results[arch]) == counts[arch], err[-3000:]
    return results


def _hot(r: dict) -> bool:
    """The attention launch ``auto`` runs for DiT shapes (as the sm_90 test's hot path)."""
    c = r["constexprs"]
    return (not c["IS_CAUSAL"] and c["DP"] <= 128 and c["QK_INT8"] and not c["PV_BF16"]
            and not c["QK_TWO_TERM"])


@needs_hip_compiler
@pytest.mark.parametrize("arch", ARCHS)
def test_every_launch_compiles_on_native_matrix_instructions(compiled, arch):
    res = compiled[arch]
    print("\n" + table(res))
    failed = [r for r in res if not r["ok"]]
    assert not failed, failed[0]
    names = {r["name"] for r in res}
    assert names >= {"attention_fwd_persistent_kernel", "merge_partials_kernel",
                     "quantize_q_kernel", "quantize_kv_kernel", "kv_channel_stats_kernel",
                     "kv_stats_finalize_kernel", "channel_moments_kernel",
                     "balance_vectors_kernel", "mask_row_counts_col_any_kernel",
                     "mask_row_counts_col_any_words_kernel"}
    assert {r["constexprs"].get("ROPE") for r in res} >= {0, 1, 2, 3}
    fnuz = arch == "gfx942"
    for r in res:
        c = r["constexprs"]
        assert r["shared"] <= device.AMD_LDS_BYTES[arch], f"LDS over the CU's: {r}"
        if "HIP" in c:  # no inline PTX reached the HIP compiler
            assert c["HIP"], r
        if "FP8_FNUZ" in c:  # the device's format reached the kernel
            assert c["FP8_FNUZ"] == fnuz, r
        if "FP8_MAX" in c:
            assert c["FP8_MAX"] == device.AMD_FP8_ARCHS[arch].scale_max, r
        if r["name"] != "attention_fwd_persistent_kernel":
            continue
        assert c["P_SHIFT"] == device.AMD_FP8_ARCHS[arch].p_shift, r
        assert r["waves_per_eu"] == 2, r
        mfma = r["mfma"]
        # never the f16 fallback of a foreign fp8 format (nor any f16 dot: inputs are int8,
        # fp8 or bf16)
        assert not [k for k in mfma if k.endswith("_f16")], mfma
        qk = QK_INT8_MFMA if c["QK_INT8"] else FP8_MFMA
        pv = BF16_MFMA if c["PV_BF16"] else FP8_MFMA
        assert any(k.endswith(qk) for k in mfma), f"QK not on {qk} MFMA: {mfma}"
        assert any(k.endswith(pv) for k in mfma), f"PV not on {pv} MFMA: {mfma}"
        assert len(r["loops"]) == 2, r["loops"]  # the unmasked and the masked kv loop
        for lp in r["loops"]:  # both dots inside each kv loop
            assert lp["mfma"] > 0, r["loops"]
        if not c["PV_BF16"]:
            # P to fp8 by the native conversion: one instruction per one or two values of the
            # BLOCK_M x BLOCK_N tile, as the layout pairs them (a foreign format takes a
            # ~34-instruction sequence without it)
            per_lane = c["BLOCK_M"] * c["BLOCK_N"] // (64 * r["num_warps"])
            for lp in r["loops"]:
                assert per_lane // 2 <= lp["fp8_cvt"] <= per_lane, (per_lane, r["loops"])
    kv = [r for r in res if r["name"] == "quantize_kv_kernel" and not r["constexprs"]["PV_BF16"]]
    assert kv and all(r["fp8_cvt"] > 0 for r in kv)  # V to fp8, natively
    hot = [r for r in res if r["name"] == "attention_fwd_persistent_kernel" and _hot(r)]
    assert {r["constexprs"]["DP"] for r in hot} == {64, 128}
    assert not [r for r in hot if r["loops"][0]["spill_ops"]], \
        f"{arch}: spills in the unmasked kv loop: {hot}"
    spills = [r for r in res if r["vgpr_spills"]]
    if spills:
        warnings.warn(f"{arch} register spills (outside the unmasked hot loop): " + "; ".join(
            f"{r['name']} DP={r['constexprs'].get('DP')} {r['vgpr_spills']} VGPRs, loops "
            + "/".join(str(lp["spill_ops"]) for lp in r["loops"]) for r in spills),
            stacklevel=1)


def test_amd_tiles_reach_the_plan_and_the_nvidia_kernels_stay_off():
    """Under ``interpret_as``, the plan takes ``tuning.hip_tiles`` of the architecture and the
    Gluon kernel is never chosen; the launch options are HIP's (waves_per_eu, no maxnreg)."""
    cpu = torch.device("cpu")
    for arch in ARCHS:
        with device.interpret_as(arch) as tgt:
            assert tgt.hip and tgt.warp_size == 64 and tgt.max_warps == 16
            for dp in (64, 128, 256):
                plan, launch = attend.plan_for([1000], [1000], varlen=False, num_heads=2,
                                                num_kv_heads=2, head_dim=dp, is_causal=False,
                                                device=cpu, kernel="triton")
                want = tuning.current().hip_tiles[arch][dp]
                assert launch.tiles == want and "not yet executed on the hardware" in want.measured
                assert (plan.key.block_m, plan.key.block_n) == (want.block_m, want.block_n)
                assert attend._launch_options(launch.tiles, tgt) == {"waves_per_eu": 2}
                assert want.maxnreg is None and want.num_warps <= tgt.max_warps
    # the NVIDIA interpreter default is untouched
    plan, launch = attend.plan_for([1000], [1000], varlen=False, num_heads=2, num_kv_heads=2,
                                   head_dim=64, is_causal=False, device=cpu, kernel="triton")
    assert launch.tiles == tuning.current().tiles[64]
    assert attend._launch_options(launch.tiles, device.INTERPRETER) == {"maxnreg": 168}
    assert get_recipe(DEFAULT_RECIPE).qk == "int8"
