"""The FP8 path's launches compile for sm_89, sm_100a and sm_120 with their own tiles, checked
without those GPUs.

The launches of real calls are recorded under the interpreter as each architecture would make
them (``fp8dit.device.interpret_as``: its ``tuning.nvidia_tiles``), then a subprocess per
architecture without TRITON_INTERPRET compiles each with Triton's compiler for it and reads the
SASS (tests/tools/nvidia_compile.py). Asserted for the attention kernel: QK on int8 tensor cores
(IMMA; UTCIMMA on sm_100a) and PV on fp8 ones (QMMA, UTCQMMA; bf16 for the bf16-PV recipe),
both inside both kv loops; no byte-wide global loads; no spills in the kv loops (or within the
per-loop bound of ``LOOP_SPILLS``, with its reason); shared memory and tensor memory within the
architecture's; instructions per kv step within the per-release bounds of
``LOOP_INSTRUCTIONS`` (a release without them skips only that check). Every other kernel must
compile and keep its loads wide.

The calls: the default recipe at padded head dims 64, 128 and 256, causal, with a key-padding
mask (its statistics and the shortened call) and varlen, and each recipe whose attention launch
differs (fp8 QK, bf16 PV, two-term QK) at head dim 96 (padded to 128): ~20 launches per
architecture, the three compiled two at a time (~1 CPU-minute each).
"""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import triton

import fp8dit
from fp8dit import attend, device, key_padding, tuning
from fp8dit.recipes import RECIPES, get_recipe

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from launches import record  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1",
                                reason="records launches in the interpreter")
ARCHS = device.NVIDIA_CHECKED_ARCHS
RELEASE = ".".join(triton.__version__.split(".")[:2])
# Shared memory one program may hold (the opt-in maximum per block), and tensor memory columns
# per SM (sm_100a only): CUDA C Programming Guide, compute capabilities 8.9, 10.0, 12.0.
SMEM_BYTES = {"sm_89": 101376, "sm_100": 232448, "sm_120": 101376}
TMEM_COLUMNS = {"sm_100": 512}

# Instructions per thread and kv step of the attention kernel's unmasked and masked loops,
# (arch, padded head dim) -> (unmasked, masked), per Triton release (x.y.0 wheels, 2026-12-06),
# default recipe; ~5% above what was compiled, so a regression of the tiles shows.
LOOP_INSTRUCTIONS = {
    "3.8": {("sm_89", 64): (385, 455), ("sm_89", 128): (490, 575), ("sm_89", 256): (840, 865),
            ("sm_100", 64): (580, 790), ("sm_100", 128): (645, 840),
            ("sm_100", 256): (590, 680),
            ("sm_120", 64): (400, 470), ("sm_120", 128): (495, 600),
            ("sm_120", 256): (810, 835)},
    "3.9": {("sm_89", 64): (370, 440), ("sm_89", 128): (480, 560), ("sm_89", 256): (810, 840),
            ("sm_100", 64): (570, 780), ("sm_100", 128): (640, 840),
            ("sm_100", 256): (630, 740),
            ("sm_120", 64): (400, 470), ("sm_120", 128): (500, 600),
            ("sm_120", 256): (800, 820)},
}
# Spills per kv step allowed in a loop, (arch, padded head dim, variant) -> (unmasked, masked),
# each with why; everything not listed must not spill in its kv loops.
LOOP_SPILLS = {
    # fp8-QK recipe on sm_100a's tcgen05 path with the default recipe's 3-stage 64 x 128 tiles:
    # 158 and 69 per step with triton 3.9 (2026-12-06); auto never runs it there (SDPA until a
    # B200 has timed it), and tiles per recipe wait for that timing
    ("sm_100", 128, "fp8/fp8"): (160, 70),
    # the masked loop (the last kv block of a row tile) with triton 3.8: 1 at D=256, 9 for the
    # two-term recipe; none with 3.9
    ("sm_100", 256, "int8/fp8"): (0, 1),
    ("sm_100", 128, "int8x2/fp8"): (0, 9),
}


def _calls(arch: str):
    """The dispatcher's launches on ``arch`` (the module docstring's list)."""

    def run():
        g = torch.Generator().manual_seed(0)

        def qkv(d, n=300):
            return (torch.randn(1, n, 2, d, generator=g).bfloat16() for _ in range(3))

        with device.interpret_as(arch):
            for d in (64, 128, 200):
                q, k, v = qkv(d)
                fp8dit.attention(q, k, v, backend="fp8", num_splits=2)
            q, k, v = qkv(128)
            fp8dit.attention(q, k, v, backend="fp8", is_causal=True)
            # a key-padding mask: its statistics, then the call it becomes (keys cut short)
            mask = torch.rand(1, 300, 300, generator=g) < 0.9
            key_padding._row_counts_and_key_any(mask)
            key_padding._row_counts_and_key_any(mask.transpose(1, 2))
            attend.fp8_attention_fwd(q, k, v, layout="NHD", scale=0.1, is_causal=False,
                                     recipe=get_recipe(None), k_lens=[250])
            lens = torch.tensor([0, 100, 300], dtype=torch.int32)
            qp, kp, vp = (torch.randn(300, 2, 128, generator=g).bfloat16() for _ in range(3))
            fp8dit.attention_varlen(qp, kp, vp, lens, lens, 200, 200, backend="fp8")
            # the recipes whose attention launch differs from the default's (the rotated and
            # balance ones run its launch; their quantization is arch-independent code that
            # the sm_90 and HIP compile tests cover)
            seen = {("int8", 1, "fp8")}
            for name, recipe in RECIPES.items():
                if (recipe.qk, recipe.qk_terms, recipe.pv) not in seen:
                    seen.add((recipe.qk, recipe.qk_terms, recipe.pv))
                    q, k, v = qkv(96)
                    fp8dit.attention(q, k, v, backend="fp8", recipe=name)

    return run


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, list[dict]]:
    """Each architecture's launches recorded, then compiled, two architectures at a time."""
    mp = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    tool = os.path.join(os.path.dirname(__file__), "tools", "nvidia_compile.py")
    paths = {}
    try:
        for arch in ARCHS:
            launches = record(mp, _calls(arch), execute=False)
            paths[arch] = (tmp / f"{arch}.json", len(launches))
            paths[arch][0].write_text(json.dumps(launches))
    finally:
        mp.undo()

    def compile_arch(arch):
        proc = subprocess.run([sys.executable, tool, str(paths[arch][0]), arch], env=env,
                              capture_output=True, text=True, timeout=900)
        res = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        assert len(res) == paths[arch][1], proc.stderr[-3000:]
        return res

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(ARCHS, pool.map(compile_arch, ARCHS)))


def _variant(c: dict) -> str:
    return ("int8x2" if c["QK_TWO_TERM"] else "int8" if c["QK_INT8"] else "fp8") + (
        "/bf16" if c["PV_BF16"] else "/fp8") + (" causal" if c["IS_CAUSAL"] else "")


def table(results: list[dict]) -> str:
    """The attention launches' SASS, one line each (``-s`` prints it): tiles, registers,
    shared memory, TMEM columns, and per kv loop (unmasked, then masked) instructions /
    spills / barriers per thread and step."""
    rows = [("arch", "DP", "variant", "tile", "w/st", "loads", "REG", "smem KB", "TMEM",
             "kv loops: instr/spill/bar")]
    for r in results:
        if r["name"] != "attention_fwd_persistent_kernel" or not r["ok"]:
            continue
        c = r["constexprs"]
        rows.append((r["arch"], str(c["DP"]), _variant(c), f"{c['BLOCK_M']}x{c['BLOCK_N']}",
                     f"{r['num_warps']}/{r['num_stages']}",
                     "ptr" if c.get("PTR_LOADS") else "desc", str(r["registers"]),
                     f"{r['shared'] / 1024:.1f}", str(r["tmem"]),
                     " ".join(f"{lp['instructions']}/{lp['spills']}/{lp['barriers']}"
                              for lp in r["loops"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(f.ljust(w) for f, w in zip(row, widths)).rstrip() for row in rows)


# Releases whose code for an architecture is not held to these checks, and why (2026-12-06).
UNCHECKED = {
    ("3.6", "sm_100"): "triton 3.6's tcgen05 lowering spills 63-389 per kv step at every head "
                       "dim with these tiles (1,014-2,433 instructions); checked with 3.8, 3.9",
    ("3.6", "sm_120"): "triton 3.6 spills 2-3 per kv step in every loop with these tiles; "
                       "checked with 3.8, 3.9",
}


@pytest.mark.parametrize("arch", ARCHS)
def test_every_launch_compiles_on_tensor_cores_without_byte_loads_or_loop_spills(
        compiled, arch):
    res = compiled[arch]
    if (RELEASE, arch) in UNCHECKED:
        print("\n" + table(res))
        assert all(r["ok"] for r in res), [r for r in res if not r["ok"]][0]
        pytest.skip(f"compiled, not checked further: {UNCHECKED[RELEASE, arch]}")
    print("\n" + table(res))
    failed = [r for r in res if not r["ok"]]
    assert not failed, failed[0]
    attn = [r for r in res if r["name"] == "attention_fwd_persistent_kernel"]
    assert {r["constexprs"]["DP"] for r in attn} == {64, 128, 256}
    assert {_variant(r["constexprs"]) for r in attn} >= {
        "int8/fp8", "int8/fp8 causal", "fp8/fp8", "int8/bf16", "int8x2/fp8"}
    for r in res:
        assert r["shared"] <= SMEM_BYTES[arch], f"shared memory over {arch}'s: {r}"
        assert r["tmem"] <= TMEM_COLUMNS.get(arch, 0), f"TMEM over {arch}'s: {r}"
        # Q/K/V tiles and the bf16 inputs never one byte at a time (the byte kernel of the
        # mask statistics reads a bool mask of any strides by the byte, by design)
        byte_loads = {k: n for k, n in r["loads"].items() if k.endswith((".U8", ".S8"))}
        assert r["name"] == "mask_row_counts_col_any_kernel" or not byte_loads, (
            r["name"], r["constexprs"], byte_loads)
    for r in attn:
        c = r["constexprs"]
        want = tuning.current().nvidia_tiles[arch][c["DP"]]
        assert (c["BLOCK_M"], c["BLOCK_N"], r["num_warps"], bool(c.get("PTR_LOADS"))) == (
            want.block_m, want.block_n, want.num_warps, want.ptr_loads), r
        assert r["maxnreg"] is None, r  # sm_90's register cap stays on sm_90
        assert len(r["loops"]) == 2, r["loops"]  # the unmasked and the masked kv loop
        for i, lp in enumerate(r["loops"]):
            assert lp[("fp8" if not c["QK_INT8"] else "int8") + "_mma"] > 0, (c, lp)
            assert lp[("bf16" if c["PV_BF16"] else "fp8") + "_mma"] > 0, (c, lp)
            assert not lp["byte_loads"], (c, lp)
            bound = LOOP_SPILLS.get((arch, c["DP"], _variant(c)), (0, 0))[i]
            assert lp["spills"] <= bound, f"{arch} {_variant(c)} D={c['DP']}: {r['loops']}"


@pytest.mark.parametrize("arch", ARCHS)
def test_default_recipe_kv_steps_within_release_bounds(compiled, arch):
    if RELEASE not in LOOP_INSTRUCTIONS:
        pytest.skip(f"kv-step bounds compiled with triton {', '.join(LOOP_INSTRUCTIONS)}, not "
                    f"{triton.__version__}: the other checks ran, these bounds did not")
    for r in compiled[arch]:
        c = r["constexprs"]
        if r["name"] == "attention_fwd_persistent_kernel" and _variant(c) == "int8/fp8":
            bounds = LOOP_INSTRUCTIONS[RELEASE][arch, c["DP"]]
            got = tuple(lp["instructions"] for lp in r["loops"])
            assert all(n <= b for n, b in zip(got, bounds)), (arch, c["DP"], got, bounds)
