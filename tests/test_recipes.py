"""Named recipes against fp64 and their emulations: the per-tensor baseline, the bf16-PV one.

Shape B=1 H=2 S=512 D=64 (and D=128 for the LSE bound), through the interpreter on CPU
(the compiled kernels on a GPU machine).
Measured here (kernel rel-L1 normal / dit): int8qk-bf16pv 0.011 / 0.008, int8qk-fp8pv 0.037 /
0.013, per-tensor-fp8 0.053 / 0.050. The interpreter stores bf16 outputs by truncation (the GPU
rounds to nearest), which adds ~0.001-0.002 to every recipe's rel-L1 here.
"""

import math

import pytest
import torch
import triton
import triton.language as tl

import fp8dit
from fp8dit import attend, quantize, testing
from fp8dit.kernels.common import to_bf16
from fp8dit.kernels.quantize import _row_sum_order_free
from fp8dit.recipes import DEFAULT_RECIPE, RECIPES, Recipe, get_recipe
from fp8dit.testing import (
    attention_emulated,
    attention_ref,
    attention_varlen_ref,
    error_stats,
    make_qkv,
)

EMULATION_FACTOR = 1.5
HIGH_ACCURACY = "int8qk-bf16pv"
BASELINE = "per-tensor-fp8"
ROTATED = "int8qk-fp8pv-rot"
PRECISE_LSE = "int8x2qk-fp8pv"
# The interpreter on CPU (CI); the compiled kernels on a GPU machine.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (recipe, family) -> (rel-L1 max, cos min) at B1 H2 S512 D64. The bf16-PV bound is the rel-L1
# 0.015 asked of it; the others sit ~1.5x above what they measure, to catch regressions, not noise.
BOUNDS = {
    (HIGH_ACCURACY, "normal"): (0.015, 0.9998),
    (HIGH_ACCURACY, "dit"): (0.015, 0.9998),
    (DEFAULT_RECIPE, "normal"): (0.055, 0.998),
    (DEFAULT_RECIPE, "dit"): (0.02, 0.9997),
    (BASELINE, "normal"): (0.08, 0.997),
    (BASELINE, "dit"): (0.08, 0.995),
    (ROTATED, "normal"): (0.055, 0.998),
    (ROTATED, "dit"): (0.014, 0.9998),
    (PRECISE_LSE, "normal"): (0.05, 0.998),
    (PRECISE_LSE, "dit"): (0.013, 0.9998),
}


@pytest.fixture(scope="module")
def measured():
    """Kernel and emulation errors of each recipe of BOUNDS on both families, computed once."""
    out = {}
    for family in ("normal", "dit"):
        q, k, v = make_qkv(1, 2, 512, 64, family=family, seed=0, device=DEVICE)
        ref = attention_ref(q, k, v)
        for name in (HIGH_ACCURACY, DEFAULT_RECIPE, BASELINE, ROTATED, PRECISE_LSE):
            got = fp8dit.attention(q, k, v, backend="fp8", recipe=name)
            emu = attention_emulated(q, k, v, RECIPES[name])
            out[(name, family)] = (error_stats(got, ref), error_stats(emu, ref))
    return out


@pytest.mark.parametrize("name,family", sorted(BOUNDS))
def test_recipe_error_vs_fp64_and_emulation(measured, name, family):
    st, emu = measured[(name, family)]
    rel_max, cos_min = BOUNDS[(name, family)]
    assert not st.nan, st
    assert st.rel_l1 <= rel_max and st.cos >= cos_min, (name, family, str(st))
    assert st.rel_l1 <= EMULATION_FACTOR * emu.rel_l1 + 1e-3, (name, family, str(st), str(emu))


def test_per_tensor_baseline_is_clearly_worse_on_dit(measured):
    base, _ = measured[(BASELINE, "dit")]
    default, _ = measured[(DEFAULT_RECIPE, "dit")]
    # Measured 0.050 vs 0.013 rel-L1 and 1-cos 2.7e-3 vs 1.1e-4.
    assert base.rel_l1 >= 2.5 * default.rel_l1, (str(base), str(default))
    assert 1 - base.cos >= 5 * (1 - default.cos), (str(base), str(default))


def test_high_accuracy_recipe_beats_the_default(measured):
    for family in ("normal", "dit"):
        best, _ = measured[(HIGH_ACCURACY, family)]
        default, _ = measured[(DEFAULT_RECIPE, family)]
        assert best.rel_l1 < 0.8 * default.rel_l1, (family, str(best), str(default))


def test_rotation_helps_on_outlier_channels_and_costs_nothing_without(measured):
    # Measured (S=512, D=64): DiT-like 0.0091 vs 0.0120; normal 0.0362 vs 0.0362. On the H200
    # (8k-65k tokens): 0.0096 / 0.0087 vs 0.0148 / 0.0139, LSE max error 0.21 vs 0.44.
    rot, _ = measured[(ROTATED, "dit")]
    default, _ = measured[(DEFAULT_RECIPE, "dit")]
    assert rot.rel_l1 < 0.85 * default.rel_l1, (str(rot), str(default))
    rot, _ = measured[(ROTATED, "normal")]
    default, _ = measured[(DEFAULT_RECIPE, "normal")]
    assert rot.rel_l1 < 1.05 * default.rel_l1, (str(rot), str(default))


@pytest.mark.parametrize("family", ["normal", "dit"])
def test_high_accuracy_target_at_d128(family):
    q, k, v = make_qkv(1, 2, 512, 128, family=family, seed=1, device=DEVICE)
    st = error_stats(fp8dit.attention(q, k, v, backend="fp8", recipe=HIGH_ACCURACY),
                     attention_ref(q, k, v))
    assert not st.nan and st.rel_l1 <= 0.015 and st.cos >= 0.9998, str(st)


@pytest.mark.parametrize("family", ["normal", "dit"])
def test_two_term_qk_meets_the_lse_bound(family):
    # The precise-LSE recipe: LSE within 0.01 of fp64. Measured here (S=512, D=128): DiT-like
    # 0.0007 (the one-term default: 0.39; two terms without rotation 0.006, 0.011 at S=2048
    # and 0.013 on the H200 at 8k), normal < 1e-4 (default 0.003).
    q, k, v = make_qkv(1, 2, 512, 128, family=family, seed=0, device=DEVICE)
    ref, ref_lse = attention_ref(q, k, v, return_lse=True)
    out, lse = fp8dit.attention(q, k, v, backend="fp8", recipe=PRECISE_LSE, return_lse=True)
    err = (lse.double() - ref_lse).abs().max().item()
    assert err <= 0.004, err
    _, lse_default = fp8dit.attention(q, k, v, backend="fp8", return_lse=True)
    err_default = (lse_default.double() - ref_lse).abs().max().item()
    assert err <= err_default / 5, (err, err_default)
    # the output is no worse than the default's either (its scores are finer)
    default = error_stats(fp8dit.attention(q, k, v, backend="fp8"), ref)
    assert error_stats(out, ref).rel_l1 <= default.rel_l1 * 1.02


@pytest.mark.parametrize("name", [HIGH_ACCURACY, BASELINE, ROTATED, PRECISE_LSE])
def test_new_recipes_causal_gqa_split_kv(name):
    # Odd length, GQA 4:1, causal, forced split-KV merge, against fp64 and the emulation.
    q, k, v = make_qkv(1, 4, 239, 64, Hkv=1, family="dit", seed=5, device=DEVICE)
    out, lse = fp8dit.attention(q, k, v, backend="fp8", recipe=name, is_causal=True,
                                num_splits=3, return_lse=True)
    ref, ref_lse = attention_ref(q, k, v, is_causal=True, return_lse=True)
    st = error_stats(out, ref)
    emu = error_stats(attention_emulated(q, k, v, RECIPES[name], is_causal=True), ref)
    assert not st.nan and st.rel_l1 <= EMULATION_FACTOR * emu.rel_l1 + 1e-3, (str(st), str(emu))
    # The LSE comes from QK alone. bf16 PV shares the default's int8 QK, so its LSE is the
    # default's (0.34 off fp64 here: dit scores reach ~50); per-tensor fp8 QK is 3.6 off.
    lse_err = (lse.double() - ref_lse).abs().max()
    if name == HIGH_ACCURACY:
        _, lse_default = fp8dit.attention(q, k, v, backend="fp8", is_causal=True, num_splits=3,
                                          return_lse=True)
        torch.testing.assert_close(lse, lse_default, rtol=0, atol=1e-5)
        assert lse_err <= 0.5
    elif name == PRECISE_LSE:
        assert lse_err <= 0.01
    else:
        assert lse_err <= 6.0


@pytest.mark.parametrize("name", [HIGH_ACCURACY, BASELINE, ROTATED, PRECISE_LSE])
def test_new_recipes_keep_nan_in_its_row(name):
    q, k, v = make_qkv(1, 2, 200, 64, seed=2, device=DEVICE)
    q[0, 17, 1, 5] = float("nan")
    out = fp8dit.attention(q, k, v, backend="fp8", recipe=name)
    bad = ~torch.isfinite(out.float()).all(dim=-1)
    expected = torch.zeros_like(bad)
    expected[0, 17, 1] = True
    assert torch.equal(bad, expected)


@pytest.mark.parametrize("name", [n for n, r in RECIPES.items() if r.rotate])
def test_rotating_recipes_run_at_head_dim_256(name):
    # The rotation is a Walsh-Hadamard transform in registers, no [Dp, Dp] matrix in shared
    # memory: at padded head dim 256 the rotating recipes run as at 128, compiled as
    # interpreted (their launches' shared memory: tests/test_sm90_compile.py and
    # tests/test_hip_compile.py), and follow their emulation.
    q, k, v = make_qkv(1, 2, 150, 200, family="dit", seed=4, device=DEVICE)
    ref = attention_ref(q, k, v)
    st = error_stats(fp8dit.attention(q, k, v, backend="fp8", recipe=name), ref)
    emu = error_stats(attention_emulated(q, k, v, RECIPES[name]), ref)
    assert not st.nan and st.rel_l1 <= EMULATION_FACTOR * emu.rel_l1 + 1e-3, (str(st), str(emu))


# ---------------------------------------------------------------------------------------------
# What the kernels store: per-tensor scales really are per tensor; bf16 V is the input
# ---------------------------------------------------------------------------------------------


def _varlen_workspace(recipe, q, k, v, q_lens, k_lens, scale):
    H, Hkv, D = q.shape[1], k.shape[1], q.shape[2]
    plan, _ = attend.plan_for(q_lens, k_lens, varlen=True, num_heads=H, num_kv_heads=Hkv,
                              head_dim=D, is_causal=False, device=q.device)
    st = [attend._bthd_strides(t, "varlen") for t in (q, k, v)]
    ws = quantize.quantize_stage(plan, recipe, scale, q, st[0], k, st[1], v, st[2])
    return plan, ws


def _valid_rows(lens, block):
    rows, pad = [], 0
    for n in lens:
        rows += range(pad, pad + n)
        pad += -(-n // block) * block
    return torch.tensor(rows, dtype=torch.long)


def test_per_tensor_scales_span_sequences_and_heads():
    # Varlen with an empty sequence, GQA 2:1, and one sequence/head far larger than the rest:
    # each tensor's single scale must come from its largest value anywhere.
    q_lens, k_lens = [113, 0, 200], [150, 50, 139]
    H, Hkv, D = 4, 2, 40
    g = torch.Generator().manual_seed(3)
    q = torch.randn(sum(q_lens), H, D, generator=g)
    k = torch.randn(sum(k_lens), Hkv, D, generator=g)
    v = torch.randn(sum(k_lens), Hkv, D, generator=g)
    q[200, 3, 39] = 40.0  # third sequence, last head, last real channel (D < padded 64)
    k[180, 1] *= 9.0  # second sequence (the one without queries)
    v[5, 0, 0] = -30.0
    q, k, v = (t.bfloat16().to(DEVICE) for t in (q, k, v))
    scale = 1 / math.sqrt(D)
    plan, ws = _varlen_workspace(get_recipe(BASELINE), q, k, v, q_lens, k_lens, scale)
    qa, ka, va = (float(t.float().abs().max()) for t in (q, k, v))
    rows = _valid_rows(q_lens, plan.key.block_m)
    q_scale = ws.q_scale[:, rows]
    torch.testing.assert_close(q_scale, torch.full_like(q_scale, qa / 448 * scale * quantize.LOG2E))
    n_blocks = sum(-(-n // plan.key.block_n) for n in k_lens)
    k_scale = ws.k_scale[:, :n_blocks]
    torch.testing.assert_close(k_scale, torch.full_like(k_scale, ka / 448))
    v_scale = ws.v_scale[:, :, :D]
    torch.testing.assert_close(v_scale, torch.full_like(v_scale, va / 448))
    assert torch.all(ws.v_mean == 0) and ws.q8.dtype == torch.float8_e4m3fn
    # And the attention built on them is still right.
    cu = [torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32,
                       device=DEVICE) for n in (q_lens, k_lens)]
    out = fp8dit.attention_varlen(q, k, v, cu[0], cu[1], max(q_lens), max(k_lens),
                                  backend="fp8", recipe=BASELINE)
    ref = attention_varlen_ref(q, k, v, cu[0], cu[1])
    assert error_stats(out, ref).cos >= 0.99


def test_two_term_recipe_varlen_with_an_empty_sequence():
    # Packed sequences (one without keys, one without queries), DiT-like, D=128: the residual
    # terms land in the right rows of the padded buffers and the LSE stays precise.
    q_lens, k_lens = [200, 0, 77], [150, 40, 0]
    q1, k1, v1 = make_qkv(1, 2, 200, 128, Sk=150, family="dit", seed=7, device=DEVICE)
    _, k2, v2 = make_qkv(1, 2, 1, 128, Sk=40, family="dit", seed=8, device=DEVICE)
    q3, _, _ = make_qkv(1, 2, 77, 128, Sk=1, family="dit", seed=9, device=DEVICE)
    q = torch.cat([q1[0], q3[0]])
    k, v = torch.cat([k1[0], k2[0]]), torch.cat([v1[0], v2[0]])
    cu = [torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32,
                       device=DEVICE) for n in (q_lens, k_lens)]
    out, lse = fp8dit.attention_varlen(q, k, v, cu[0], cu[1], max(q_lens), max(k_lens),
                                       backend="fp8", recipe=PRECISE_LSE, return_lse=True)
    ref, ref_lse = attention_varlen_ref(q, k, v, cu[0], cu[1], return_lse=True)
    assert error_stats(out, ref).rel_l1 <= 0.012
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse))  # the sequence without keys: -inf
    assert (lse.double() - ref_lse)[fin].abs().max().item() <= 0.004
    assert torch.all(out[200:] == 0)


def test_bf16_pv_stores_v_as_is_and_unscaled():
    q_lens = k_lens = [150, 37]
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(187, 2, 64, generator=g).bfloat16().to(DEVICE) for _ in range(3))
    v = (v.float() + 3.0).bfloat16()  # an offset that centering would have removed
    plan, ws = _varlen_workspace(get_recipe(HIGH_ACCURACY), q, k, v, q_lens, k_lens, 0.125)
    assert ws.pv_bf16 and ws.v8t.dtype == torch.bfloat16
    rows = _valid_rows(k_lens, plan.key.block_n)
    assert torch.equal(ws.v8t[:, :, rows].permute(2, 0, 1), v)  # [Hkv, Dp, T] -> [T, Hkv, D]
    assert torch.all(ws.v_scale == 1) and torch.all(ws.v_mean == 0)
    assert ws.q8.dtype == torch.int8 and ws.k8.dtype == torch.int8


def test_bf16_stages_fit_two_programs_per_sm():
    # bf16 V doubles the V tile; two stages keep the shared memory of the default's three.
    tiles = attend.tile_config(128, torch.device("cpu")).tiles
    ws = type("W", (), {"pv_bf16": True})()
    assert tiles.programs_per_sm == 2 and attend._num_stages(tiles, ws) == 2
    ws.pv_bf16 = False
    assert attend._num_stages(tiles, ws) == tiles.num_stages


# ---------------------------------------------------------------------------------------------
# Pieces
# ---------------------------------------------------------------------------------------------


@triton.jit
def _to_bf16_kernel(x_ptr, y_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    y = to_bf16(tl.load(x_ptr + offs), True)
    tl.store(y_ptr + offs, y.to(tl.float32))


def test_soft_bf16_cast_rounds_to_nearest_even():
    # The interpreter's own fp32->bf16 cast truncates; to_bf16 must match torch (RNE). Not
    # tested: subnormals, which the interpreter's cast flushes to zero (the GPU's does not).
    one = 1.0
    vals = [one + 2**-8, one + 3 * 2**-8, one + 2**-8 + 2**-20, -(one + 3 * 2**-8), 255.9,
            3.0e38, -3.4e38, 1e-30, 0.0, -0.0, float("inf"), float("-inf"), float("nan"),
            0.1, -7.77, 65504.0]
    x = torch.tensor(vals, dtype=torch.float32)
    x = torch.cat([x, torch.randn(48) * 100]).to(DEVICE)
    y = torch.empty_like(x)
    _to_bf16_kernel[(1,)](x, y, N=64)
    want = x.bfloat16().float()
    assert torch.equal(torch.isnan(y), torch.isnan(want))
    fin = ~torch.isnan(want)
    assert torch.equal(y[fin], want[fin])


@triton.jit
def _row_sum_kernel(p_ptr, out_ptr, ROWS: tl.constexpr, DP: tl.constexpr):
    r = tl.arange(0, ROWS)
    c = tl.arange(0, DP)
    tl.store(out_ptr + r, _row_sum_order_free(tl.load(p_ptr + r[:, None] * DP + c[None, :]),
                                              ROWS, DP))


@pytest.mark.parametrize("dp", [16, 64, 256])
def test_balance_row_sum_is_the_same_in_any_channel_order(dp):
    """The balance transform's x . u: the same bits whatever order the channels come in (a
    float sum follows it: compiled, the register layout's, which the fused rotary changes), and
    within the fixed-point grid's steps of the exact sum."""
    g = torch.Generator().manual_seed(dp)
    p = torch.randn(16, dp, generator=g) * 10.0 ** (torch.rand(16, dp, generator=g) * 6 - 3)
    p[1] = 0.0  # no terms
    p[2] = 0.0
    p[2, 5] = -3.25  # one term
    p[3] *= 1e-36  # tiny terms, some below the coarsest grid
    p[4] *= 3e38 / dp / p[4].abs().max()  # the largest terms whose sum stays finite
    p[5] = torch.where(torch.arange(dp) % 2 == 0, 1e6, -1e6) + torch.arange(dp)  # cancellation
    perm = torch.randperm(dp, generator=g)
    sums = []
    for x in (p, p[:, perm].contiguous(), p.flip(1).contiguous()):
        out = torch.empty(16, device=DEVICE)
        _row_sum_kernel[(1,)](x.to(DEVICE), out, ROWS=16, DP=dp)
        sums.append(out.cpu())
    assert torch.equal(sums[0], sums[1]) and torch.equal(sums[0], sums[2])
    exact = p.double().sum(1)
    k = 31 - dp.bit_length()  # bits of the row's largest term on the grid
    m = p.abs().amax(1).double()
    top = torch.floor(torch.log2(m.clamp_min(1e-300))).clamp_min(k - 127)
    step = 2.0 ** (top + 1 - k)  # the grid's unit: each term loses less than one
    bound = dp * step + exact.abs() * 2.0**-23
    assert torch.all((sums[0].double() - exact).abs() <= bound), (sums[0], exact)
    assert sums[0][1] == 0 and sums[0][2] == -3.25


def test_recipe_validation():
    with pytest.raises(ValueError, match="per-tensor scales exclude smooth_k"):
        Recipe("x", "", scales="tensor")
    with pytest.raises(ValueError, match="unknown qk/scales/pv"):
        Recipe("x", "", pv="fp16")
    assert get_recipe(None).name == DEFAULT_RECIPE == "int8qk-fp8pv"
    assert RECIPES[BASELINE].scales == "tensor" and RECIPES[HIGH_ACCURACY].pv == "bf16"


# Per-tensor scales read their amax with .item(), which meta tensors do not have.
@pytest.mark.parametrize("name", [n for n, r in RECIPES.items() if r.scales != "tensor"])
def test_emulation_builds_every_tensor_on_the_inputs_device(name):
    """On a GPU a CPU tensor built inside the emulation meets CUDA ones and raises (the
    balance recipes' row counts did). Inputs on the "meta" device make any such tensor raise
    on the CPU too: torch refuses to mix meta and CPU tensors."""
    q = torch.empty(1, 40, 4, 64, device="meta", dtype=torch.bfloat16)
    k, v = (torch.empty(1, 33, 2, 64, device="meta", dtype=torch.bfloat16) for _ in range(2))
    out, lse = attention_emulated(q, k, v, RECIPES[name], return_lse=True)
    assert out.device.type == lse.device.type == "meta"
    assert out.shape == q.shape and lse.shape == (1, 4, 40)


def test_v_rounding_error_does_not_add_up_over_tokens():
    """fp8 V's rounding error must average out over a long sequence, channel by channel.

    bf16 tokens of a channel, centered and put on one fp8 grid, all erred the same way, and PV
    summed that bias over the sequence (rel-L1 on i.i.d. normal inputs 0.040 at 8k, 0.082 at
    200k tokens on the H200). Each kv block's grid is now stretched by its own factor. Measured
    on the dequantized output of the real kernels: coherence (mean error over tokens / its
    random-walk size) ~1 with the stretch; 2.2 (here) to 3.6 (zero mean) without.
    """
    S, D = 65536, 64
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 1, D, generator=g).bfloat16()
    v = (torch.randn(1, S, 1, D, generator=g) + 0.3).bfloat16()  # a mean off the grid
    k = torch.randn(1, S, 1, D, generator=g).bfloat16()
    q, k, v = (t.to(DEVICE) for t in (q, k, v))
    plan, _ = attend.plan_for([1], [S], varlen=False, num_heads=1, num_kv_heads=1, head_dim=D,
                              is_causal=False, device=q.device)
    st = attend._bthd_strides(q, "NHD")
    ws = quantize.quantize_stage(plan, get_recipe(DEFAULT_RECIPE), 1.0, q, st, k, st, v, st)
    tau = torch.exp2(testing._v_block_log2_scale(S, plan.key.block_n, DEVICE))[:, None]
    deq = ws.v8t[0, :D, :S].float().T * tau * ws.v_scale[0, 0] + ws.v_mean[0, 0]
    err = deq - v[0, :, 0].float()
    coherence = err.mean(0) / (err.std(0) / math.sqrt(S))
    assert coherence.pow(2).mean().sqrt() < 1.5, coherence
