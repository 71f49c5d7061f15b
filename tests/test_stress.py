"""The stress suite (``fp8dit.testing.STRESS_SUITE``): its families, its bounds, the recipes'
emulation as the kernels' yardstick on it, and ``fp8dit check --stress``.

Kernels run through the interpreter on CPU at B=1 H=2 S=1024 (~15 s a call); the whole suite
runs only in emulation (~1 s a case). docs/accuracy_stress.md has the tables.
"""

import re

import pytest
import torch

import fp8dit
from fp8dit.recipes import DEFAULT_RECIPE, RECIPES
from fp8dit.testing import (
    STRESS_BOUNDS,
    STRESS_CASES,
    STRESS_SUITE,
    attention_emulated,
    emulated_runner,
    make_stress_qkv,
    stress_badness,
    stress_metrics,
    stress_violations,
)
from fp8dit.tools import check

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
S = 1024


def _spread(x):
    """Per-channel spread over tokens of NHD x, averaged over batch and heads: [D]."""
    return x.float().std(dim=1).mean(dim=(0, 1))


def test_suite_covers_the_families_it_promises():
    names = set(STRESS_CASES)
    for where in ("q", "k", "same", "diff"):
        for n in (1, 4, 16):
            for mag in (4, 32):
                assert f"outliers-{where}-n{n}-x{mag}" in names
    for name in ("normal", "flat", "peaked", "fa3", "bias-q", "bias-k", "bias-qk",
                 "bias-qk-rope", "kbias-x20", "sinks", "massive-kv-x8", "v-outliers", "dit",
                 "dit-peaked", "normal-d64", "dit-d64", "dit-gqa"):
        assert name in names
    assert len(names) == len(STRESS_SUITE)  # no two cases share a name
    assert {c.D for c in STRESS_SUITE} >= {None, 64}
    assert any(c.group is not None for c in STRESS_SUITE)


def test_make_stress_qkv_shapes_and_determinism():
    q, k, v = make_stress_qkv("dit", 2, 4, 100, 128, seed=3)
    assert q.shape == (2, 100, 4, 128) and k.shape == v.shape == (2, 100, 4, 128)
    assert q.dtype == torch.bfloat16 and q.is_contiguous()
    q2, _, _ = make_stress_qkv("dit", 2, 4, 100, 128, seed=3)
    q3, _, _ = make_stress_qkv("dit", 2, 4, 100, 128, seed=4)
    assert torch.equal(q, q2) and not torch.equal(q, q3)
    q, k, _ = make_stress_qkv("dit-d64", 1, 2, 64, 128)
    assert q.shape[-1] == 64 and k.shape[-1] == 64
    q, k, v = make_stress_qkv("dit-gqa", 1, 4, 64)
    assert q.shape[2] == 4 and k.shape[2] == 1 and v.shape[2] == 1
    q, _, _ = make_stress_qkv(STRESS_CASES["normal"], 1, 1, 8, 64, dtype=torch.float32)
    assert q.dtype == torch.float32
    with pytest.raises(ValueError, match="case: expected one of"):
        make_stress_qkv("gaussian")


def test_outlier_channels_sit_where_the_name_says():
    def big(x):  # channels whose spread is over 3x the median channel's
        s = _spread(x)
        return set(torch.nonzero(s > 3 * s.median()).flatten().tolist())

    q, k, _ = make_stress_qkv("outliers-q-n4-x32", 1, 1, S)
    assert len(big(q)) == 4 and not big(k)
    q, k, _ = make_stress_qkv("outliers-k-n16-x4", 1, 1, S)
    assert not big(q) and len(big(k)) == 16
    q, k, _ = make_stress_qkv("outliers-same-n4-x32", 1, 1, S)
    assert len(big(q)) == 4 and big(q) == big(k)
    q, k, _ = make_stress_qkv("outliers-diff-n4-x32", 1, 1, S)
    assert len(big(q)) == 4 and len(big(k)) == 4 and not big(q) & big(k)
    # rescaled: the spread averaged over channels is 1 (the structure sets the softmax's scale)
    assert abs(float(_spread(q).pow(2).mean()) - 1) < 0.05


def test_biases_sinks_and_fa3_have_their_structure():
    q, k, _ = make_stress_qkv("bias-qk", 1, 1, S, dtype=torch.float32)
    # a bias 3x the spread: |channel mean| over tokens averages ~3 * sqrt(2/pi) spreads
    assert 1.5 < float(q.mean(1).abs().mean()) < 4 and 1.5 < float(k.mean(1).abs().mean()) < 4
    _, k, _ = make_stress_qkv("kbias-x20", 1, 1, S, dtype=torch.float32)
    assert float(k.mean(1).abs().mean()) > 10
    q, k, v = make_stress_qkv("sinks", 1, 2, S, dtype=torch.float32)
    big_v = (v.abs().amax(-1) > 20).sum().item()
    assert 4 <= big_v <= 8  # the 4 sink tokens' V, in both heads
    # every row gives the sinks a large share of its weight
    w = torch.softmax((q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)) / 128 ** 0.5, -1)
    sinks = torch.nonzero(v[0, :, 0].abs().amax(-1) > 20).flatten()
    assert float(w[..., sinks].sum(-1).mean()) > 0.3
    q, _, _ = make_stress_qkv("fa3", 1, 2, S, dtype=torch.float32)
    spikes = (q.abs() > 6).float().mean().item()  # N(0,1) beyond 6 is ~2e-9: the 0.1% spikes
    assert 2e-4 < spikes < 2e-3


def test_bounds_flag_each_broken_bound():
    ok = dict(cos=0.9995, rel_l1=0.02, rmse=1e-3, lse_mean=0.01, ring_ratio=1.0)
    assert stress_violations("dit", ok) == [] and stress_badness("dit", ok) < 1
    assert stress_violations("normal", dict(ok, rel_l1=0.035)) == []
    assert stress_violations("dit", dict(ok, rel_l1=0.035)) == ["rel-L1 0.0350 > 0.03"]
    assert stress_violations("dit", dict(ok, cos=0.998))[0].startswith("cos")
    assert stress_violations("dit", dict(ok, lse_mean=0.06))[0].startswith("LSE")
    assert stress_violations("dit", dict(ok, ring_ratio=1.1))[0].startswith("ring")
    assert stress_violations("fa3", dict(ok, rmse=5e-3))[0].startswith("RMSE")
    assert stress_violations("dit", dict(ok, rmse=5e-3)) == []  # RMSE only bounds fa3
    assert stress_violations("dit", dict(ok, nan=True)) == ["NaN"]
    assert stress_badness("dit", dict(ok, nan=True)) == float("inf")
    assert stress_badness("dit", dict(ok, lse_mean=0.1)) == pytest.approx(2.0)
    assert STRESS_BOUNDS["rel_l1"] == 0.03 and STRESS_BOUNDS["fa3_rmse"] == 4.5e-3


def test_emulated_lse_is_the_reference_lse_without_rounding():
    # exact Q and K: the emulation's LSE is fp64's up to its fp32 smoothing of K
    q, k, v = make_stress_qkv("dit", 1, 2, 256, dtype=torch.float32)
    _, lse = attention_emulated(q, k, v, RECIPES[DEFAULT_RECIPE], return_lse=True,
                                exact_qk=True)
    _, ref = fp8dit.testing.attention_ref(q, k, v, return_lse=True)
    torch.testing.assert_close(lse, ref, rtol=0, atol=1e-5)


# The default recipe's hardest cases in emulation (docs/accuracy_stress.md): its worst rel-L1
# (K outlier channel), its worst LSE (peaked DiT-like scores), and FA3's benchmark.
KERNEL_CASES = ("outliers-k-n1-x32", "dit-peaked", "fa3")


@pytest.mark.parametrize("name", KERNEL_CASES)
def test_kernel_follows_its_emulation_on_hard_cases(name):
    q, k, v = make_stress_qkv(name, 1, 2, S, device=DEVICE)
    ref, ref_lse = fp8dit.testing.attention_ref(q, k, v, return_lse=True)
    out, lse = fp8dit.attention(q, k, v, backend="fp8", recipe=DEFAULT_RECIPE, return_lse=True)
    emu, emu_lse = attention_emulated(q, k, v, RECIPES[DEFAULT_RECIPE], return_lse=True)
    got, want = fp8dit.testing.error_stats(out, ref), fp8dit.testing.error_stats(emu, ref)
    assert not got.nan
    # the kernel's running max and bf16 output rounding against the emulation's exact max
    assert 0.85 * want.rel_l1 <= got.rel_l1 <= 1.1 * want.rel_l1 + 1e-3, (str(got), str(want))
    lse_got = (lse.double() - ref_lse).abs().mean().item()
    lse_want = (emu_lse - ref_lse).abs().mean().item()
    assert lse_got <= 1.2 * lse_want + 2e-3, (lse_got, lse_want)


def test_kernel_ring_merge_on_the_suite_metrics():
    # stress_metrics with the kernels: one call and the merge of four kv-chunk calls
    q, k, v = make_stress_qkv("dit", 1, 2, 512, device=DEVICE)

    def run(q, k, v):
        return fp8dit.attention(q, k, v, backend="fp8", return_lse=True)

    m = stress_metrics(run, q, k, v, floor=emulated_runner(RECIPES[DEFAULT_RECIPE],
                                                           exact_qk=True))
    emu = stress_metrics(emulated_runner(RECIPES[DEFAULT_RECIPE]), q, k, v)
    assert m["ring_ratio"] <= STRESS_BOUNDS["ring_ratio"], m
    assert abs(m["ring_ratio"] - emu["ring_ratio"]) < 0.05, (m, emu)
    assert m["floor_rel_l1"] < m["rel_l1"]


def _stress_rows(out):
    rows, summary = [], False
    for line in out.splitlines():
        if line.startswith("per recipe"):
            summary = True
        if summary or not line or line.startswith(("stress", "bounds", "recipe", "---")):
            continue
        rows.append(line.split()[:2])
    return rows


def test_check_stress_emulated_prints_worst_last(capsys):
    argv = ["--stress", "--emulate", "--shape", "1,2,128,64", "--recipes",
            "int8qk-fp8pv,per-tensor-fp8", "--families", "normal,outliers-k-n1-x32,fa3"]
    assert check.run(_parse(argv)) == 0
    out = capsys.readouterr().out
    rows = _stress_rows(out)
    assert len(rows) == 6 and {r[0] for r in rows} == {"int8qk-fp8pv", "per-tensor-fp8"}
    # the per-tensor baseline is worse: its group comes last, and so does the worst case
    assert rows[-1][0] == "per-tensor-fp8"
    last = out.strip().splitlines()[-1]
    assert re.match(r"worst case: per-tensor-fp8 on \S+: ", last), last
    summary = out.split("per recipe, worst last:")[1].strip().splitlines()
    assert summary[2].startswith("int8qk-fp8pv") and summary[3].startswith("per-tensor-fp8")


def _parse(argv):
    import argparse

    p = argparse.ArgumentParser()
    check.add_arguments(p)
    return p.parse_args(argv)


def test_check_stress_argument_errors(capsys):
    assert check.run(_parse(["--emulate"])) == 2
    assert "only with --stress" in capsys.readouterr().err
    assert check.run(_parse(["--stress", "--emulate", "--recipes", "sdpa"])) == 2
    assert "no emulation" in capsys.readouterr().err
    assert check.run(_parse(["--stress", "--families", "gaussian"])) == 2
    assert "unknown 'gaussian'" in capsys.readouterr().err
    assert check.run(_parse(["--stress", "--inputs", "x.pt"])) == 2
    assert "draws its own inputs" in capsys.readouterr().err
