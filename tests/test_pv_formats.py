"""The blockwise P·V emulator (``fp8dit.testing.attention_blockwise_emulated``): exact where
nothing is rounded, today's recipe as attention_emulated has it, and the effects of the P·V
formats that docs/accuracy.md ("P·V formats, in emulation") reports. CPU, ~5 s."""

import pytest
import torch

from fp8dit.recipes import DEFAULT_RECIPE, RECIPES
from fp8dit.testing import (
    PV_FORMATS,
    PV_TODAY,
    PVFormat,
    attention_blockwise_emulated,
    attention_emulated,
    attention_ref,
    error_stats,
    make_stress_qkv,
)

RECIPE = RECIPES[DEFAULT_RECIPE]
S = 1024


def _err(case, fmt, S=S, exact_qk=True):
    q, k, v = make_stress_qkv(case, 1, 2, S, 128)
    ref, ref_lse = attention_ref(q, k, v, return_lse=True)
    out, lse = attention_blockwise_emulated(q, k, v, RECIPE, PV_FORMATS[fmt], exact_qk=exact_qk)
    return error_stats(out, ref).rel_l1, float((lse - ref_lse).abs().mean())


@pytest.mark.parametrize("fmt", [
    PVFormat("exact", p="exact", v="exact"),
    PVFormat("exact-block-rot", p="exact", p_ref="block", v="exact", v_rotate="rms"),
])
def test_nothing_rounded_is_the_reference(fmt):
    # 600 keys: a partial last block; GQA; a row subset. Q and K exact up to the fp32 smoothing
    q, k, v = make_stress_qkv("dit-gqa", 1, 2, 600, 128, dtype=torch.float32)
    rows = torch.arange(3, 600, 7)
    ref, ref_lse = attention_ref(q[:, rows], k, v, return_lse=True)
    out, lse = attention_blockwise_emulated(q, k, v, RECIPE, fmt, exact_qk=True, rows=rows,
                                            chunk=40)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=1e-5)


@pytest.mark.parametrize("case", ["normal", "dit"])
def test_todays_format_reproduces_attention_emulated(case):
    # the running max instead of the final one moves fp8's rounding of P, not its size
    q, k, v = make_stress_qkv(case, 1, 2, S, 128)
    ref, ref_lse = attention_ref(q, k, v, return_lse=True)
    emu, emu_lse = attention_emulated(q, k, v, RECIPE, block_n=256, return_lse=True)
    out, lse = attention_blockwise_emulated(q, k, v, RECIPE, PV_TODAY)
    got, want = error_stats(out, ref).rel_l1, error_stats(emu, ref).rel_l1
    assert 0.96 * want <= got <= 1.04 * want, (got, want)
    # same Q and K, exact row sums: the same LSE
    torch.testing.assert_close(lse, emu_lse, rtol=0, atol=1e-6)
    assert error_stats(out, emu).rel_l1 < 0.5 * want  # close to the emulation, not just as far


def test_integer_p_and_v_cut_the_floor_on_normal_inputs():
    fp8, _ = _err("normal", "fp8")
    u8, _ = _err("normal", "u8-block")
    assert fp8 > 0.03 and u8 < 0.45 * fp8, (fp8, u8)


def test_seven_bit_p_keeps_most_of_the_gain():
    """P in [0, 127] (what an int8 x int8 dot takes without an offset): half the steps of u8,
    more error than u8, still well under fp8's floor on normal inputs."""
    fp8, _ = _err("normal", "fp8")
    u8, _ = _err("normal", "u8-block-vrot-b-f16sum")
    s7, _ = _err("normal", "s7-block-vrot-b-f16sum")
    assert u8 < s7 < 0.7 * fp8, (fp8, u8, s7)


def test_rounded_row_sum_loses_the_mass_of_small_p():
    # sinks: next to a sink key the other keys' P round to 0 in 8 bits
    _, lse_exact = _err("sinks", "u8-block")
    _, lse_rounded = _err("sinks", "u8-block-rowsum-dot")
    assert lse_exact < 1e-4 and lse_rounded > 0.01, (lse_exact, lse_rounded)


def test_v_rotation_spreads_fa3_spikes():
    plain, _ = _err("fa3", "u8-block")
    rot, _ = _err("fa3", "u8-block-vrot-b")
    assert rot < 0.8 * plain, (plain, rot)


def test_format_fields_are_checked():
    with pytest.raises(ValueError, match="unknown"):
        PVFormat("x", p="int4")
    with pytest.raises(ValueError, match="running max"):
        PVFormat("x", p="fp8", p_ref="block")
    with pytest.raises(ValueError, match="int8 V"):
        PVFormat("x", v="fp8", v_scale="block")


def test_fp8_p_alone_sits_at_the_normal_bound():
    """Each operand's share of fp8's floor (docs/accuracy.md, "What the numbers say"): with V
    exact, e4m3 P alone is ~2/3 of today's P·V error on normal inputs, at the 0.025 bound with Q
    and K exact and above it with the default's int8 Q·K; V's share is as large."""
    fp8, _ = _err("normal", "fp8")
    p_only, _ = _err("normal", "fp8-p-only")
    v_only, _ = _err("normal", "fp8-v-only")
    p_only_int8qk, _ = _err("normal", "fp8-p-only", exact_qk=False)
    assert 0.6 * fp8 < p_only < 0.75 * fp8 and 0.022 < p_only < 0.027, (fp8, p_only)
    assert 0.6 * fp8 < v_only < 0.8 * fp8, (fp8, v_only)
    assert p_only_int8qk > 0.025, p_only_int8qk
