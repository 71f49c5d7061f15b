"""The warp-specialized Gluon Hopper kernel (``kernels.attention_sm90_ws``) and the
quantization it reads.

Gluon does not run in Triton's interpreter, so on CPU this checks what can be checked without a
GPU: the quantizer's layouts the kernel relies on (interpreter), that the kernel compiles for
sm_90 with this Triton in every configuration the dispatcher launches it with, that its kv loops
use the Hopper tensor-core MMAs and how many instructions and spills they take per step (SASS,
bounds per Triton release: docs/triton_releases.md), that its compile leaves no IR object alive
at exit beyond Triton's own, and where ``dispatch.choose_kernel`` runs it.
Its outputs were compared with the Triton kernel's and fp64 on the H200 (triton 3.6;
tests/test_attention_fp8.py's GPU tests).
"""

import functools
import json
import os
import re
import subprocess
import sys

import pytest
import torch
import triton

from fp8dit import attend, dispatch, env, quantize, tuning
from fp8dit.recipes import DEFAULT_RECIPE, get_recipe


def _workspace(kv_perm16, S=300, D=64):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, S, 2, D, generator=g).bfloat16() for _ in range(3))
    plan, _ = attend.plan_for([S], [S], varlen=False, num_heads=2, num_kv_heads=2, head_dim=D,
                              is_causal=False, device=q.device)
    st = attend._bthd_strides(q, "NHD")
    return quantize.quantize_stage(plan, get_recipe(DEFAULT_RECIPE), 0.125, q, st, k, st, v, st,
                                kv_perm16=kv_perm16)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1", reason="interpreter test")
def test_kv_perm16_stores_v_in_the_p_register_order():
    plain, perm = _workspace(False), _workspace(True)
    j = torch.arange(plain.v8t.shape[-1])
    # token j = 16a + 8h + 2c + e sits at column 16a + 4c + 2h + e
    col = (j & ~15) | (((j >> 1) & 3) << 2) | (((j >> 3) & 1) << 1) | (j & 1)
    assert sorted(col.tolist()) == j.tolist()
    assert torch.equal(perm.v8t[..., col].view(torch.uint8), plain.v8t.view(torch.uint8))
    assert not torch.equal(perm.v8t.view(torch.uint8), plain.v8t.view(torch.uint8))
    for name in ("q8", "k8", "k_scale", "v_scale", "v_mean"):
        assert torch.equal(getattr(perm, name).view(torch.uint8),
                           getattr(plain, name).view(torch.uint8)), name


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1", reason="interpreter test")
def test_256_key_blocks_k_scales_and_empty_halves(monkeypatch):
    """The warp-specialized kernel's 256-key blocks: K has one scale per block, the larger of
    the two 128-key halves' scales; V's grid factor follows the 256-key block, and the empty
    second half of the last block is written (zeros), never left uninitialized."""
    S, D = 300, 128  # the last 256-key block holds 44 keys: its second half is empty

    def ws_for(block_n):
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, S, 2, D, generator=g).bfloat16() for _ in range(3))
        with tuning.override(tiles={128: dict(block_n=block_n)}):
            plan, _ = attend.plan_for([S], [S], varlen=False, num_heads=2, num_kv_heads=2,
                                      head_dim=D, is_causal=False, device=q.device)
        st = attend._bthd_strides(q, "NHD")
        # poison the workspace memory the quantizer must overwrite
        with monkeypatch.context() as m:
            m.setattr(torch, "empty", _poisoned(torch.empty))
            ws = quantize.quantize_stage(plan, get_recipe(DEFAULT_RECIPE), 0.125, q, st, k, st,
                                         v, st, kv_perm16=True)
        return plan, ws, v

    plan128, ws128, v = ws_for(128)
    plan256, ws256, _ = ws_for(256)
    assert plan256.key.block_n == 256 and plan256.k_total_padded == 512
    assert ws256.k_scale.shape == (2, 2)
    assert torch.equal(ws256.k_scale[:, 0], ws128.k_scale[:, :2].amax(1))
    assert torch.equal(ws256.k_scale[:, 1], ws128.k_scale[:, 2])
    assert ws256.k8[:, S:].eq(0).all()
    v8 = ws256.v8t.float()  # [Hkv, D, T_pad], kv index permuted in groups of 16
    j = torch.arange(plan256.k_total_padded)
    col = (j & ~15) | (((j >> 1) & 3) << 2) | (((j >> 3) & 1) << 1) | (j & 1)  # token -> column
    assert torch.isfinite(v8).all()
    assert torch.equal(v8[:, :, col[S:]], torch.zeros_like(v8[:, :, col[S:]]))
    # dequantized V matches V - mean with the 256-key block's grid factor
    from fp8dit.testing import _v_block_log2_scale

    grid = torch.exp2(_v_block_log2_scale(S, 256, "cpu"))
    deq = v8[0][:, col[:S]] * ws256.v_scale[0, 0][:, None] * grid[None, :]
    ref = v[0, :, 0].float().T - ws256.v_mean[0, 0][:, None]
    assert (deq - ref).abs().max() <= 0.07 * ref.abs().max()


def _two_sequences_256_key_blocks(bad, outlier=1.0):
    """Varlen Q, K, V of two sequences (300 and 520 tokens; the second starts at kv block 2),
    GQA, D=72 (padded channels), K with a channel bias and channel 3 times ``outlier``, and
    ``bad`` (if not None) at the second sequence's key 400 (block 1, second half); with the
    plan of the warp-specialized kernel's 256-key blocks, whole blocks per statistics chunk."""
    lens = [300, 520]
    T, D = sum(lens), 72
    g = torch.Generator().manual_seed(1)
    q = torch.randn(T, 4, D, generator=g).bfloat16()
    k = torch.randn(T, 2, D, generator=g) * 2 + torch.randn(D, generator=g) * 5
    k[..., 3] *= outlier
    k = k.bfloat16()
    v = torch.randn(T, 2, D, generator=g).bfloat16()
    if bad is not None:
        k[300 + 400, 1, 7] = bad
    with tuning.override(tiles={128: dict(block_n=256)}):
        plan, _ = attend.plan_for(lens, lens, varlen=True, num_heads=4, num_kv_heads=2,
                                  head_dim=D, is_causal=False, device=q.device)
    assert plan.key.block_n == 256 and plan.stats_chunk == 256
    return q, k, v, plan


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1", reason="interpreter test")
@pytest.mark.parametrize("bad", [None, float("nan"), float("-inf")])
def test_256_key_block_k_amax_from_the_stats_pass_is_bitwise_the_spanning_one(monkeypatch,
                                                                               bad):
    """One K scale per 256-key block taken by 128-row programs from the statistics pass's
    per-block channel max and min (``tuning.Quantization.kv_rows``) equals what 256-row
    programs compute,
    bit for bit: varlen with a second sequence starting at kv block 2, GQA, D=72 (padded
    channels), and a NaN or infinite key in the second half of a block, which must make that
    block's scale NaN and no other's (that block's int8 values, which no score uses, may
    differ)."""
    q, k, v, plan = _two_sequences_256_key_blocks(bad)

    def ws(rows):
        st = attend._bthd_strides(q, "varlen")
        with monkeypatch.context() as m, tuning.override(quantization=dict(kv_rows={128: rows})):
            m.setattr(torch, "empty", _poisoned(torch.empty))
            return quantize.quantize_stage(plan, get_recipe(DEFAULT_RECIPE), 0.125, q, st, k,
                                        attend._bthd_strides(k, "varlen"), v,
                                        attend._bthd_strides(v, "varlen"), kv_perm16=True)

    spanning, from_stats = ws(0), ws(128)
    live = from_stats.k_scale.isfinite().repeat_interleave(256, 1)[..., None]  # [Hkv, T, 1]
    for name in ("q8", "q_scale", "q_corr", "k8", "k_scale", "v8t", "v_scale", "v_mean"):
        a, b = getattr(spanning, name), getattr(from_stats, name)
        if name == "k_scale":
            assert torch.equal(a.isnan(), b.isnan()), name
            a, b = a.nan_to_num(0.0), b.nan_to_num(0.0)
        if name == "k8":
            a, b = a * live, b * live
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
    # kv blocks: sequence 0 holds 0-1, sequence 1 holds 2-4 (key 400 is in its block 1)
    nan_blocks = from_stats.k_scale.isnan().nonzero().tolist()
    assert nan_blocks == ([] if bad is None else [[1, 3]])


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1", reason="interpreter test")
@pytest.mark.parametrize("bad", [None, float("nan")])
@pytest.mark.parametrize("recipe", ["int8qk-fp8pv-rot", "int8qk-fp8pv-bal"])
def test_rotated_k_amax_from_the_stats_pass_matches_the_spanning_one(monkeypatch, recipe, bad):
    """The rotating recipes' K scale per 256-key block from the statistics pass's max and min
    of the rotated K, less the rotated mean, against 256-row programs that rotate K minus its
    mean and take the amax themselves: the same up to fp32 rounding (the two subtract the mean
    on either side of the rotation), the same non-finite block flagged, and the int8 keys at
    most one step apart in a few places. Varlen, GQA, D=72 (every rotated channel counts, the
    padded ones included), an outlier channel."""
    q, k, v, plan = _two_sequences_256_key_blocks(bad, outlier=8.0)

    def ws(rows):
        st = [attend._bthd_strides(t, "varlen") for t in (q, k, v)]
        with monkeypatch.context() as m, tuning.override(quantization=dict(kv_rows={128: rows})):
            m.setattr(torch, "empty", _poisoned(torch.empty))
            return quantize.quantize_stage(plan, get_recipe(recipe), 0.125, q, st[0], k, st[1],
                                           v, st[2], kv_perm16=True)

    spanning, from_stats = ws(0), ws(128)
    a, b = spanning.k_scale, from_stats.k_scale
    assert torch.equal(a.isnan(), b.isnan())
    assert b.isnan().nonzero().tolist() == ([] if bad is None else [[1, 3]])
    torch.testing.assert_close(b, a, rtol=1e-6, atol=0, equal_nan=True)
    assert not torch.equal(a, b)  # the stats path ran: its rounding differs somewhere
    live = b.isfinite().repeat_interleave(256, 1)[..., None]  # [Hkv, T, 1]
    diff = ((spanning.k8.float() - from_stats.k8.float()) * live).abs()
    assert diff.max() <= 1 and diff.gt(0).float().mean() < 1e-3
    for name in ("q8", "q_scale", "v8t", "v_scale", "v_mean"):
        x, y = getattr(spanning, name), getattr(from_stats, name)
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), name


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1", reason="interpreter test")
@pytest.mark.parametrize("knob", ["stats_sub", "kv_rows", "q_rows"])
def test_quantization_launch_shape_gives_the_same_workspace_bitwise(monkeypatch, knob):
    """The quantization's launch shape (``tuning.Quantization``: the GPU's K/V and Q program
    rows) changes only how the work is cut, never a byte of the workspace; the GPU's statistics
    sub-tile (the interpreter keeps a larger one) only the order of the sums. Varlen with an
    empty query sequence and lengths that end mid-block, GQA, D=72, and a NaN key (its block's
    scale NaN)."""
    q_lens, k_lens = [300, 0, 77], [300, 520, 77]
    D = 72
    g = torch.Generator().manual_seed(2)
    q = torch.randn(sum(q_lens), 4, D, generator=g).bfloat16()
    k = (torch.randn(sum(k_lens), 2, D, generator=g) * 2
         + torch.randn(D, generator=g) * 5).bfloat16()
    v = torch.randn(sum(k_lens), 2, D, generator=g).bfloat16()
    k[300 + 130, 0, 3] = float("nan")
    with tuning.override(tiles={128: dict(block_n=256)}):
        plan, _ = attend.plan_for(q_lens, k_lens, varlen=True, num_heads=4, num_kv_heads=2,
                                  head_dim=D, is_causal=False, device=q.device)
    assert plan.key.block_n == 256 and plan.stats_chunk == 256

    def ws():
        st = [attend._bthd_strides(t, "varlen") for t in (q, k, v)]
        with monkeypatch.context() as m:
            m.setattr(torch, "empty", _poisoned(torch.empty))
            return quantize.quantize_stage(plan, get_recipe(DEFAULT_RECIPE), 0.125, q, st[0], k,
                                        st[1], v, st[2], kv_perm16=True)

    shipped = tuning.current().quantization
    changes = {  # (the shipped value, the one it is compared with)
        # the GPU's sub-tile against the interpreter's default
        "stats_sub": (dict(stats_sub_elems_interpret=shipped.stats_sub_elems),
                      dict(stats_sub_elems_interpret=2048)),
        "kv_rows": (dict(kv_rows={128: shipped.kv_rows[128]}), dict(kv_rows={128: 128})),
        "q_rows": (dict(q_rows={128: shipped.q_rows[128]}), dict(q_rows={128: 64})),
    }[knob]
    assert (shipped.kv_rows[128] < 128 and shipped.q_rows[128] < 64
            and shipped.stats_sub_elems < 2048)

    def with_knob(on):
        with tuning.override(quantization=changes[0 if on else 1]):
            return ws()

    base, other = with_knob(False), with_knob(True)
    assert base.k_scale.isnan().sum() == 1
    for name in ("q8", "q_scale", "q_corr", "k8", "k_scale", "v8t", "v_scale", "v_mean"):
        a, b = getattr(base, name), getattr(other, name)
        if knob == "stats_sub" and name not in ("q8", "q_scale"):
            # sums in another order: the means, and what they shift, agree to rounding
            if a.dtype.is_floating_point and a.element_size() == 4:
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)
            else:
                diff = (a.float() - b.float()).abs()
                assert diff.nan_to_num(0).le(a.float().abs().nan_to_num(0) * 0.07 + 1).all()
                assert diff.nan_to_num(0).gt(0).float().mean() < 0.01, name
            continue
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name


def _poisoned(empty):
    def f(*shape, **kw):
        t = empty(*shape, **kw)
        if t.dtype.is_floating_point:
            t.fill_(float("nan"))
        elif t.dtype == torch.int8:
            t.fill_(-128)
        return t
    return f


def test_kernel_choice_is_auto_by_default_and_named_kernels_are_checked(monkeypatch):
    monkeypatch.delenv("FP8DIT_KERNEL", raising=False)
    assert env.attention_kernel() == "auto"
    monkeypatch.setenv("FP8DIT_KERNEL", "gluon-ws")
    assert env.attention_kernel() == "gluon-ws"
    for bad in ("cutlass", "gluon"):  # "gluon": the one-warpgroup kernel, no longer shipped
        monkeypatch.setenv("FP8DIT_KERNEL", bad)
        with pytest.raises(ValueError, match="FP8DIT_KERNEL: expected one of auto, triton, "
                                             f"gluon-ws, got '{bad}'"):
            env.attention_kernel()


def test_auto_runs_the_warp_specialized_kernel_only_where_it_measured_faster(monkeypatch):
    """``dispatch.choose_kernel`` on a (pretended) sm_90 GPU: long dense non-causal calls at
    head dims up to 128 with the one-term int8-QK/fp8-PV recipes go to the Gluon kernel on a
    verified Triton release, everything else to the Triton one; the tiles follow the choice."""
    monkeypatch.delenv("FP8DIT_KERNEL", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cap = {"value": (9, 0)}
    monkeypatch.setattr(dispatch, "_capability", lambda index: cap["value"])
    gpu = torch.device("cuda", 0)
    default = get_recipe(DEFAULT_RECIPE)
    here = (tuning.VerifiedRelease(dispatch.triton_release(), "(this test)", "", ""),)
    floors = {dp: c.gluon_ws for dp, c in tuning.current().crossovers.items()}

    def choice(head_dim=128, k_len=75600, causal=False, recipe=default, device=gpu,
               releases=here):
        with tuning.override(gluon_releases=releases):
            return dispatch.choose_kernel(head_dim, k_len, causal, recipe, device)[0]

    assert choice() == "gluon-ws"  # Wan 720p
    assert choice(k_len=floors[128]) == "gluon-ws"
    assert choice(k_len=floors[128] - 1) == "triton"  # Flux-like lengths measured slower on it
    assert choice(head_dim=64, k_len=17776) == "gluon-ws"  # CogVideoX
    assert choice(head_dim=64, k_len=floors[64] - 1) == "triton"
    assert choice(head_dim=256) == "triton"  # not written for it
    assert choice(head_dim=72) == "gluon-ws"  # padded to 128
    assert choice(causal=True) == "triton"  # not measured
    assert choice(recipe=get_recipe("int8qk-bf16pv")) == "triton"  # not supported
    assert choice(recipe=get_recipe("int8x2qk-fp8pv")) == "triton"  # one int8 QK dot only
    assert choice(device=torch.device("cpu")) == "triton"
    assert choice(releases=()) == "triton"  # a Triton not run on a GPU
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert choice() == "triton"
    monkeypatch.delenv("TRITON_INTERPRET")
    cap["value"] = (10, 0)
    assert choice() == "triton"
    cap["value"] = (9, 0)
    for name in ("triton", "gluon-ws"):  # a named kernel is taken as asked
        monkeypatch.setenv("FP8DIT_KERNEL", name)
        assert choice(head_dim=64, k_len=100, causal=True, releases=()) == name
    # ... where it can run; elsewhere the reason says why not
    kernel, why = dispatch.choose_kernel(128, 100, False, get_recipe("int8qk-bf16pv"), gpu)
    assert kernel == "triton" and "FP8DIT_KERNEL=gluon-ws" in why and "int8qk-bf16pv" in why
    # The tiles follow the choice: 128-row work items, one program per SM for the Gluon kernel.
    monkeypatch.delenv("FP8DIT_KERNEL")
    monkeypatch.setattr(attend, "_sm_count", lambda index: 132)
    launch = attend.tile_config(128, gpu, "gluon-ws")
    assert (launch.block_m, launch.num_programs) == (128, 132)
    assert launch.block_n == tuning.current().gluon_tiles[128].block_n == 256
    assert attend.tile_config(128, gpu, "gluon-ws", is_causal=True).block_n == 128
    launch = attend.tile_config(128, gpu, "triton")
    assert (launch.block_m, launch.num_programs) == (64, 264)


def test_gluon_kernel_never_runs_off_an_sm90_gpu(monkeypatch):
    # Asked for, it still never runs off an sm_90 GPU (here: CPU tensors), and the plan keeps
    # the Triton kernel's tiles.
    monkeypatch.setenv("FP8DIT_KERNEL", "gluon-ws")
    plan, launch = attend.plan_for([256], [256], varlen=False, num_heads=2, num_kv_heads=2,
                                   head_dim=128, is_causal=False, device=torch.device("cpu"))
    assert launch.kernel == "triton" and plan.key.block_m == launch.block_m == 64


# What the warp-specialized kernel's sm_90 SASS holds when each Triton release builds it itself
# (major.minor; the x.y.0 wheel with the ptxas it bundles: 3.6 12.8, 3.8 12.9, 3.9 13.4), per
# shipped configuration (padded head dim, causal), specialized as real launches are: the main kv
# loop's instructions per step and spills (LDL/STL), and the masked tail loop's spills (run once
# per work item: 1 of ~300 steps at Wan 720p), both consumer warpgroups' worst. 3.8 and 3.9 run
# the kernel built from triton 3.6's PTX instead (fp8dit.prebuilt, tests/test_prebuilt.py); their
# own builds are the fallback. docs/triton_releases.md compares the releases.
WS_SASS_BOUNDS = {
    "3.6": {(64, False): (768, 0, 0), (128, False): (806, 1, 15),
            (64, True): (545, 0, 0), (128, True): (584, 0, 0)},
    "3.8": {(64, False): (768, 0, 0), (128, False): (806, 2, 58),
            (64, True): (543, 0, 0), (128, True): (577, 0, 0)},
    "3.9": {(64, False): (767, 0, 0), (128, False): (808, 0, 17),
            (64, True): (525, 0, 0), (128, True): (566, 0, 0)},
}


@pytest.fixture(scope="module")
def ws_compile(tmp_path_factory):
    """``tests/tools/sm90_compile.py --gluon``, run once for this module in a process of its own
    (compiled, so without TRITON_INTERPRET) and with an empty Triton cache: a cache hit builds
    no IR, and the exit report below needs it built."""
    tool = os.path.join(os.path.dirname(__file__), "tools", "sm90_compile.py")
    environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    environ["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton-cache"))
    return subprocess.run([sys.executable, tool, "--gluon"], capture_output=True, text=True,
                          env=environ, timeout=900)


def test_gluon_ws_kernel_compiles_for_sm90_with_tensor_core_loops(ws_compile):
    """Every configuration ``attend`` launches the warp-specialized kernel with (recorded from
    its launch code) compiles for sm_90 with this Triton; its kv loops are tensor-core loops
    (the wgmma counts the tile shapes give), and those that spill on no measured release have
    no spills. The per-step numbers are checked against this release's measured bounds, or
    skipped on a release that has none."""
    proc = ws_compile
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    shipped = {(dp, causal) for causal, table in ((False, tuning.current().gluon_tiles),
                                                   (True, tuning.current().gluon_causal_tiles))
               for dp in table}
    assert {(r["dp"], r["causal"]) for r in reports} == shipped, proc.stderr[-3000:]
    for rep in reports:
        assert rep["ok"], rep
        # the unmasked main loop and the masked tail loop, per consumer warpgroup
        assert len(rep["loops"]) == 4, rep
        tuned = tuning.current()
        tiles = (tuned.gluon_causal_tiles if rep["causal"] else tuned.gluon_tiles)[rep["dp"]]
        assert rep["block_n"] == tiles.block_n, rep
        halves = rep["block_n"] // 128  # dots of 128 keys per kv step
        rowsum_dot = tiles.rowsum_dot and tiles.p_regs and rep["block_n"] > 128
        for loop in rep["loops"]:
            # QK: K = head dim in steps of 32; PV (and the row-sum dot): 128 keys in steps of 32
            assert loop["igmma"] == halves * rep["dp"] // 32, rep
            assert loop["qgmma"] == halves * 4 * (2 if rowsum_dot else 1), rep
            if rep["block_n"] == 128:  # the softmax runs under the previous block's PV dot
                assert loop["exp_under_pv"] >= 64, rep
            if (rep["dp"], rep["causal"]) != (128, False):  # no spills on any release
                assert loop["spills"] == 0, rep
        # one warp-specialized program per SM
        assert rep["shared"] <= 227 * 1024, rep
    release = ".".join(triton.__version__.split(".")[:2])
    if release not in WS_SASS_BOUNDS:
        pytest.skip(f"SASS bounds measured on triton {', '.join(WS_SASS_BOUNDS)}, not "
                    f"{triton.__version__}: the version-independent checks passed, the "
                    "per-step instruction and spill bounds were not checked")
    for rep in reports:
        main_instr, main_spills, tail_spills = WS_SASS_BOUNDS[release][rep["dp"], rep["causal"]]
        main, tail = rep["loops"][0::2], rep["loops"][1::2]
        assert max(lp["instructions"] for lp in main) <= main_instr, rep
        assert max(lp["spills"] for lp in main) <= main_spills, rep
        assert max(lp["spills"] for lp in tail) <= tail_spills, rep


# The smallest Gluon kernel whose compile asks Triton for a layout back (``gl.expand_dims``):
# with it Triton 3.9's exit report is Triton's alone (docs/triton_releases.md).
_EXIT_REPORT_REFERENCE = """\
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource


@gluon.jit
def kernel(ptr):
    layout: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [4, 1], [1, 0])
    offs = gl.arange(0, 32, layout=gl.SliceLayout(0, layout))
    gl.store(ptr + gl.expand_dims(offs, 0), 0.0)


triton.compile(GluonASTSource(fn=kernel, signature={"ptr": "*fp32"}),
               target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
"""


def _nanobind_exit_report(stderr: str) -> list[str]:
    """nanobind's report of the objects still alive at interpreter exit: its counts and the
    leaked instances' and types' names (addresses dropped, sorted); empty without one."""
    return sorted(re.sub(r"0x[0-9a-f]+ ", "", line) for line in stderr.splitlines()
                  if line.startswith(("nanobind: leaked", " - leaked instance",
                                      " - leaked type")))


def test_gluon_ws_compile_keeps_no_ir_object_alive_past_exit(ws_compile, tmp_path):
    """A process that compiled the warp-specialized kernel ends with the same nanobind exit
    report as one that compiled a three-line Gluon kernel. Triton's C++ holds references to its
    Gluon layout classes that it never drops, and through them its IR builder's type, which
    nanobind (Triton's bindings from 3.9) lists at exit (``nanobind: leaked``,
    docs/triton_releases.md). Anything more in the report is an IR object (context, builder,
    value, module) fp8dit holds past interpreter shutdown. Both compiles start from an empty
    Triton cache: a cache hit builds no IR and prints nothing."""
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 9):
        pytest.skip(f"triton {triton.__version__} binds its IR with pybind11, which reports "
                    "nothing at exit (nanobind from 3.9)")
    proc = ws_compile
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not any(r["ok"] for r in reports):
        pytest.skip("tests/tools/sm90_compile.py --gluon compiled nothing here: "
                    + proc.stderr[-1000:])
    script = tmp_path / "reference.py"
    script.write_text(_EXIT_REPORT_REFERENCE)
    environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    ref = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env={**environ, "TRITON_CACHE_DIR": str(tmp_path / "cache")},
                         timeout=300)
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert _nanobind_exit_report(proc.stderr) == _nanobind_exit_report(ref.stderr), (
        "the kernel's compile leaves more alive at exit than Triton's own:\n"
        + proc.stderr[-3000:])


def _on_sm90() -> bool:
    # (a ROCm GPU's capability is its gfx number: gfx90a reads 9.0)
    return (torch.cuda.is_available() and torch.version.hip is None
            and torch.cuda.get_device_capability() == (9, 0))


@pytest.mark.gpu
@pytest.mark.skipif(not _on_sm90(), reason="the warp-specialized kernel needs an sm_90 GPU")
def test_split_kv_barriers_change_no_output_bit(monkeypatch):
    """K and V of a ring slot on their own barriers (``GluonTiles.split_kv``, the default at head
    dim 64) only change when the consumers wait, never a bit of the output or LSE: both head dims,
    an odd length (a masked last 256-key step), a 3-way split, and varlen with an empty
    sequence, each against one barrier per slot."""
    import fp8dit
    from fp8dit.testing import make_qkv

    monkeypatch.setenv("FP8DIT_KERNEL", "gluon-ws")

    def run(split, call):
        with tuning.override(gluon_tiles={dp: dict(split_kv=split) for dp in (64, 128)}):
            return call()

    for D in (64, 128):
        q, k, v = make_qkv(1, 2, 3001, D, device="cuda", seed=D)
        plan, launch = attend.plan_for([3001], [3001], varlen=False, num_heads=2,
                                       num_kv_heads=2, head_dim=D, is_causal=False,
                                       device=q.device)
        assert launch.kernel == "gluon-ws" and plan.key.block_n == 256
        for splits in (None, 3):
            call = functools.partial(fp8dit.attention, q, k, v, backend="fp8",
                                     num_splits=splits, return_lse=True)
            (o0, l0), (o1, l1) = run(False, call), run(True, call)
            assert torch.equal(o0, o1) and torch.equal(l0, l1), (D, splits)
    lens = [300, 0, 2000, 129]
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(sum(lens), 4, 64, device="cuda", generator=g, dtype=torch.bfloat16)
               for _ in range(3))
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)

    def varlen():
        return fp8dit.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), backend="fp8")
    assert torch.equal(run(False, varlen), run(True, varlen))
