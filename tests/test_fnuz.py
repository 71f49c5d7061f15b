"""The FP8 path in gfx942's fp8 format (float8_e4m3fnuz), through Triton's interpreter.

``fp8dit.device.interpret_as("gfx942")`` makes CPU calls run as an MI300X would: fnuz codes
(scale limit 224, P in [0, 2^7]), its tiles and launch options. Core tests of
tests/test_attention_fp8.py and tests/test_api.py run again here under it, with the same
bounds (a covering subset of the shapes: the fnuz path differs from the OCP one only in its
format's constants, which tests below check exactly); the interpreter's fp32 -> fp8 casts are
checked against torch's on every bfloat16 value in both formats, and the fnuz workspace
against the OCP one (gfx950, the same tiles): its codes are those halved.
"""

import pytest
import test_api
import test_attention_fp8 as t8
import torch
import triton
import triton.language as tl

import fp8dit
from fp8dit import attend, device, tuning
from fp8dit.kernels.common import fp8_cast, to_fp8_e4m3
from fp8dit.recipes import RECIPES
from fp8dit.testing import attention_ref, error_stats, make_qkv

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's fnuz path")
_RELEASE = tuple(int(x) for x in triton.__version__.split(".")[:2])
needs_fnuz = pytest.mark.skipif(
    _RELEASE < (3, 8),
    reason=f"Triton's interpreter has float8e4b8 (fnuz) from 3.8 on, this is {triton.__version__}")

# test_attention_fp8's cases short enough for the interpreter at 256-row tiles: causal, GQA
# with forced splits, a padded head dim, one-row queries
CASES = [t8.CASES[i] for i in (1, 2, 7, 11)]


@pytest.fixture(autouse=True)
def _gfx942():
    with device.interpret_as("gfx942"):
        yield


@needs_fnuz
@pytest.mark.parametrize("case", CASES, ids=[t8._ids(c) for c in CASES])
def test_fp8_matches_fp64(case, device):
    t8.test_fp8_matches_fp64(case, device)


@needs_fnuz
@pytest.mark.parametrize("name", ["int8qk-fp8pv", "fp8"])
def test_recipes_track_their_emulation(name, device):
    # fnuz V (the default recipe), fnuz Q, K and V (fp8); the emulation is OCP's: fnuz codes
    # are its codes halved, scales doubled (test_fnuz_codes_are_the_ocp_codes_halved checks
    # the other recipes' workspaces)
    t8.test_each_recipe_tracks_its_emulation(name, device)


@needs_fnuz
def test_layouts_lse_nan_and_extremes(device):
    t8.test_layouts_agree("HND", device)
    t8.test_float16_inputs(device)
    t8.test_lse_is_of_the_true_scores_despite_k_smoothing(device)
    t8.test_nan_stays_in_its_row(device, None)
    t8.test_nan_in_keys_stays_in_its_head(device, None)
    t8.test_extreme_magnitudes_and_degenerate_rows(device)
    t8.test_varlen_empty_key_sequence_gives_zeros_and_minus_inf(device)


@needs_fnuz
def test_select_backend_and_fallback_reasons(monkeypatch, caplog):
    test_api.test_select_backend_and_fallback_reasons(monkeypatch, caplog)


@triton.jit
def _casts_kernel(x_ptr, round_ptr, sat_ptr, FP8_MAX: tl.constexpr, FP8_FNUZ: tl.constexpr,
                  N: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(x_ptr + i)
    tl.store(round_ptr + i, fp8_cast(x, True, FP8_FNUZ))
    tl.store(sat_ptr + i, to_fp8_e4m3(x, True, FP8_MAX, FP8_FNUZ))


@pytest.mark.parametrize("fmt", [pytest.param(device.E4M3FNUZ, marks=needs_fnuz), device.E4M3FN],
                         ids=lambda f: f.name)
def test_soft_fp8_cast_matches_torch_on_every_bfloat16(fmt):
    """The interpreter's own fp32 -> fp8 casts lose rounding carries and truncate subnormals;
    in fnuz they also turn -0 and small negatives into 0x80 (fnuz's NaN), and in both formats
    NaN into a finite byte. The soft cast in front of them gives torch's bytes for all 65,536
    bfloat16 values clamped to the scale limit (and ``to_fp8_e4m3``, which clamps first, for
    the raw values): NaN to NaN, -0 to -0 in OCP and to 0 in fnuz, ties to even."""
    x = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    clamped = x.clamp(-fmt.scale_max, fmt.scale_max)  # keeps NaN
    ref = clamped.to(fmt.dtype).view(torch.uint8)
    rounded, saturated = (torch.empty(65536, dtype=fmt.dtype) for _ in range(2))
    _casts_kernel[(1,)](clamped, rounded, saturated, fmt.scale_max, fmt.fnuz, N=65536)
    assert torch.equal(rounded.view(torch.uint8), ref)
    _casts_kernel[(1,)](x, rounded, saturated, fmt.scale_max, fmt.fnuz, N=65536)
    assert torch.equal(saturated.view(torch.uint8), ref)
    assert ref.unique().numel() > 200  # every code of the format's range was met


def _same_tiles():
    """gfx950 given gfx942's tiles: the two formats compared on the same blocks."""
    return tuning.override(hip_tiles={"gfx950": tuning.current().hip_tiles["gfx942"]})


def _workspace(arch, recipe, q, k, v):
    with device.interpret_as(arch), _same_tiles():
        plan, _ = attend.plan_for([q.shape[1]], [k.shape[1]], varlen=False,
                                  num_heads=q.shape[2], num_kv_heads=k.shape[2],
                                  head_dim=q.shape[3], is_causal=False,
                                  device=torch.device("cpu"))
        st = attend._bthd_strides(q, "NHD")
        return attend.quantize_stage(plan, RECIPES[recipe], 0.125, q, st, k, st, v, st)


@needs_fnuz
@pytest.mark.parametrize("recipe", ["int8qk-fp8pv", "fp8", "per-tensor-fp8", "int8x2qk-fp8pv",
                                    "int8qk-fp8pv-bal"])
def test_fnuz_codes_are_the_ocp_codes_halved(recipe):
    """gfx942 (fnuz) against gfx950 (OCP) with the same tiles: every fp8 code is halved and
    every fp8 scale doubled, exactly, NaN where the OCP one is NaN."""
    q, k, v = make_qkv(1, 2, 160, 128, device="cpu", seed=21)
    v[0, 7, 1, 3] = float("nan")
    v[0, 9, 0, 5] = 3e4  # an outlier channel: the rest of it quantizes to tiny codes
    fz = _workspace("gfx942", recipe, q, k, v)
    fn = _workspace("gfx950", recipe, q, k, v)
    assert fz.v8t.dtype == torch.float8_e4m3fnuz and fn.v8t.dtype == torch.float8_e4m3fn

    def same(a, b):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)

    same(fz.v8t.float() * 2, fn.v8t.float())
    same(fz.v_scale, fn.v_scale * 2)
    assert fz.v8t.float().isnan().any()
    if RECIPES[recipe].qk_terms == 2:
        same(fz.q8lo, fn.q8lo)
        same(fz.k8lo, fn.k8lo)
    if RECIPES[recipe].qk == "fp8":
        assert fz.q8.dtype == fz.k8.dtype == torch.float8_e4m3fnuz
        same(fz.q8.float() * 2, fn.q8.float())
        same(fz.k8.float() * 2, fn.k8.float())
        same(fz.q_scale, fn.q_scale * 2)
        same(fz.k_scale, fn.k_scale * 2)
    else:
        same(fz.q8, fn.q8)
        same(fz.k8, fn.k8)


@needs_fnuz
def test_fnuz_is_as_accurate_as_ocp():
    """End to end against fp64, gfx942 (fnuz) and gfx950 (OCP, the same tiles) err alike: they
    differ only where P's exponent bias rounds (P_SHIFT 7 against 8, added to the int8 path's
    magic offset in one per-row sum), by a fraction of an fp8 step in a few P values."""
    q, k, v = make_qkv(1, 2, 250, 128, device="cpu", seed=5)
    ref, ref_lse = attention_ref(q, k, v, return_lse=True)
    st, lse = {}, {}
    for arch in ("gfx942", "gfx950"):
        with device.interpret_as(arch), _same_tiles():
            out, lse[arch] = fp8dit.attention(q, k, v, backend="fp8", return_lse=True)
        st[arch] = error_stats(out, ref)
        assert (lse[arch].double() - ref_lse).abs().max() <= t8.LSE_ABS_MAX
    assert abs(st["gfx942"].rel_l1 - st["gfx950"].rel_l1) <= 0.02 * st["gfx950"].rel_l1, st
    assert (lse["gfx942"] - lse["gfx950"]).abs().max() <= 2e-4
