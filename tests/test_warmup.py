"""``fp8dit.warmup`` and ``fp8dit warmup``: one call per shape before a model's first step."""

import pytest
import torch

import fp8dit
from fp8dit.tools import cli


def test_warmup_runs_each_shape_and_reports_what_ran(capsys):
    seen = []
    reports = fp8dit.warmup([(1, 2, 300, 64), (1, 2, 130, 128)], backend="fp8",
                            rotary="wan", progress=seen.append)
    assert [r.shape for r in reports] == [(1, 2, 300, 64), (1, 2, 130, 128)] and seen == reports
    for r in reports:
        assert r.backend == "fp8" and r.first_s > 0 and r.second_s > 0
        assert "fp8dit persistent kernel" in r.reason
        assert str(r).startswith(f"B1 H2 S{r.shape[2]} D{r.shape[3]}: fp8, first call ")
    sdpa, = fp8dit.warmup([(1, 2, 64, 64)], backend="sdpa", dtype=torch.float16)
    assert sdpa.backend == "sdpa"


@pytest.mark.parametrize("bad, match", [
    ([(1, 2, 64)],
     r"shapes: expected \(B, H, S, D\) tuples of positive integers, got \(1, 2, 64\)"),
    ([(1, 0, 64, 64)], "got \\(1, 0, 64, 64\\)"),
    ([(1, 2, 64.5, 64)], "got \\(1, 2, 64.5, 64\\)"),
])
def test_warmup_rejects_bad_shapes(bad, match):
    with pytest.raises(ValueError, match=match):
        fp8dit.warmup(bad)


def test_warmup_rejects_unknown_rotary_and_layout():
    with pytest.raises(ValueError, match="rotary: expected None or one of"):
        fp8dit.warmup([(1, 2, 64, 64)], rotary="rope")
    with pytest.raises(ValueError, match="layout: expected 'NHD' or 'HND', got 'BSHD'"):
        fp8dit.warmup([(1, 2, 64, 64)], layout="BSHD")


def test_warmup_command(capsys):
    assert cli.main(["warmup", "--shape", "1,2,200,64", "--layout", "HND"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("B1 H2 S200 D64: ") and "first call" in out.out
    assert cli.main(["warmup"]) == 2
    assert "give at least one --preset or --shape" in capsys.readouterr().err
    assert cli.main(["warmup", "--preset", "no-such-model"]) == 2
    assert "no-such-model" in capsys.readouterr().err
