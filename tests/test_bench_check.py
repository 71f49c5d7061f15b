"""``fp8dit bench`` / ``fp8dit check`` on the CPU: presets, errors, smoke runs, captured inputs."""

# TRITON_INTERPRET=1 (no GPU) is set by conftest.py before triton is imported. Setting it here,
# at collection, leaked into every later test on a GPU machine: the dispatcher then sent CPU
# tensors to compiled kernels (found by the first run of the whole suite on the H200).

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fp8dit.recipes import RECIPES
from fp8dit.tools import bench, check, report
from fp8dit.tools.presets import (
    GROUPS,
    PRESETS,
    ShapeError,
    attention_flops,
    parse_shape,
    resolve_shapes,
)

REPO = Path(__file__).resolve().parent.parent
needs_interpreter = pytest.mark.skipif(
    not bench.interpreter_active(), reason="fp8dit kernels were not built for the interpreter"
)
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")


def _run(module, argv):
    p = argparse.ArgumentParser()
    module.add_arguments(p)
    return module.run(p.parse_args(argv))


def _table(text: str, first_col: str) -> list[list[str]]:
    """Rows of a printed table (split on runs of 2+ spaces), from the header line on."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first_col + " "))
    return [re.split(r"\s{2,}", line.strip()) for line in lines[start + 2:] if line.strip()]


# ---------------------------------------------------------------------------------------------
# presets and --shape
# ---------------------------------------------------------------------------------------------


README_SHAPES = {
    "wan2.2-a14b-720p": (1, 40, 75600, 128),
    "wan-480p": (1, 40, 32760, 128),
    "wan2.1-1.3b-480p": (1, 12, 32760, 128),
    "hunyuanvideo-720p": (1, 24, 118800, 128),
    "flux-1024": (1, 24, 4608, 128),
    "cogvideox-5b": (1, 48, 17776, 64),
}
# (B, heads, tokens, head dim) of one self-attention call at the default resolution, from the
# models' configurations (FLUX.1 also at 2048 px).
MODEL_SHAPES = {
    "flux-1024": (1, 24, 4608, 128),
    "flux-2048": (1, 24, 16896, 128),
    "flux.2-dev-1024": (1, 48, 4608, 128),
    "sd3.5-large-1024": (1, 38, 4429, 64),
    "qwen-image-1328": (1, 24, 7100, 128),
    "hunyuanimage-2.1-2048": (1, 28, 5224, 128),
    "ltx-video-2b": (1, 32, 7392, 64),
    "wan2.2-ti2v-5b-720p": (1, 24, 27280, 128),
    "mochi-1": (1, 24, 44776, 128),
    "cogvideox1.5-5b": (1, 48, 45106, 64),
    "cosmos-predict2-14b": (1, 40, 84480, 128),
    "hunyuanvideo-1.5-720p": (1, 16, 113585, 128),
    "skyreels-v2-14b-720p": (1, 40, 111600, 128),
}


def test_presets_match_the_anchor_shapes():
    # an exact comparison: a preset dropped, renamed or overwritten by a repeated name fails
    got = {n: (s.B, s.H, s.S, s.D) for n, s in PRESETS.items()}
    assert got == README_SHAPES | MODEL_SHAPES


def test_groups_all_is_the_readme_set_and_models_one_per_model():
    # "all" is what every results file was run with (the README's rows), in the order it was
    assert GROUPS["all"] == tuple(README_SHAPES)
    assert set(GROUPS["all"]) == set(report.PRESET_ORDER[:6])  # the README's rows come first
    assert [s.name for s in resolve_shapes(["all"])] == list(README_SHAPES)
    assert [s.name for s in resolve_shapes(["models"])] == list(MODEL_SHAPES)
    both = [s.name for s in resolve_shapes(["all,models"])]  # flux-1024 in both, once
    assert both == list(dict.fromkeys([*README_SHAPES, *MODEL_SHAPES]))
    assert not set(GROUPS) & set(PRESETS), "a group would hide the preset of the same name"


def test_each_preset_is_distinct_parses_and_is_labelled():
    dims = [(s.B, s.H, s.S, s.D) for s in PRESETS.values()]
    assert len(set(dims)) == len(dims), "two names for one shape"
    for name, s in PRESETS.items():
        assert s.name == name and s.model, name
        parsed = parse_shape(f"{s.B},{s.H},{s.S},{s.D}")
        assert (parsed.B, parsed.H, parsed.S, parsed.D) == (s.B, s.H, s.S, s.D)
        assert parsed.flops == s.flops
        assert resolve_shapes([name]) == [s]
    # the docs' tables name every preset a run may measure (none is dropped from them)
    assert set(report.MODEL_LABELS) == set(PRESETS)


def test_flops_formula():
    assert attention_flops(2, 3, 5, 7, 11) == 4 * 2 * 3 * 5 * 7 * 11
    assert PRESETS["flux-1024"].flops == 4 * 24 * 4608 * 4608 * 128


def test_parse_shape():
    s = parse_shape(" 2, 24 ,4608,128")
    assert (s.B, s.H, s.S, s.D) == (2, 24, 4608, 128)
    assert s.name == "B2-H24-S4608-D128"


@pytest.mark.parametrize("text, fragment", [
    ("1,24,4608", "3 values"),
    ("1,24,4608,128,5", "5 values"),
    ("1,24,x,128", "S must be an integer"),
    ("1,24,4608,1.5", "D must be an integer"),
    ("0,24,4608,128", "B must be at least 1"),
    ("1,-2,4608,128", "H must be at least 1"),
    ("", "B,H,S,D"),
])
def test_parse_shape_errors(text, fragment):
    with pytest.raises(ShapeError, match=re.escape(fragment)):
        parse_shape(text)


def test_resolve_shapes():
    got = resolve_shapes(["flux-1024,cogvideox-5b", "flux-1024"], ["1,2,64,32"])
    assert [s.name for s in got] == ["flux-1024", "cogvideox-5b", "B1-H2-S64-D32"]
    assert resolve_shapes(None, None) == []
    with pytest.raises(ShapeError, match="unknown preset 'wan-1080p'.*flux-1024"):
        resolve_shapes(["wan-1080p"])


# ---------------------------------------------------------------------------------------------
# bench
# ---------------------------------------------------------------------------------------------


@no_gpu
def test_bench_without_gpu_says_so_in_one_line(capsys):
    assert _run(bench, ["--preset", "flux-1024"]) != 0
    out, err = capsys.readouterr()
    lines = [x for x in (out + err).splitlines() if x.strip()]
    assert lines == [bench.NO_GPU_MESSAGE]


@pytest.mark.parametrize("argv, fragment", [
    (["--smoke", "--backends", "fp8dit,cudnn"], "--backends: unknown 'cudnn'"),
    (["--smoke", "--shape", "1,2,64"], "--shape: expected B,H,S,D"),
    (["--smoke", "--preset", "flux-1024"], "use a tiny --shape"),
    (["--smoke", "--recipe", "fp4"], "recipe: expected one of"),
    (["--smoke", "--family", "uniform"], "--family: expected one of"),
    (["--smoke", "--repeats", "0"], "--repeats"),
])
def test_bench_argument_errors(capsys, argv, fragment):
    assert _run(bench, argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.startswith("fp8dit bench: error:")


@needs_interpreter
def test_bench_smoke_prints_a_table(capsys):
    rc = _run(bench, ["--smoke", "--shape", "1,2,64,64", "--repeats", "1", "--warmup", "0"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "CPU interpreter" in out
    rows = {r[1]: r for r in _table(out, "preset")}
    assert set(rows) == set(bench.SMOKE_BACKENDS)
    for name in ("fp8dit", "fp8dit-kernel"):  # kernel-only output was poisoned before the run
        assert rows[name][0] == "B1-H2-S64-D64"
        assert float(rows[name][2]) > 0
        assert 0.99 < float(rows[name][6]) <= 1.0 + 1e-9
    assert float(rows["sdpa-math"][6]) == pytest.approx(1.0, abs=1e-6)
    for name in ("sdpa-cudnn", "sdpa-flash", "sageattn", "cudnn-fp8"):
        assert "unavailable" in rows[name][-1] and "CUDA" in rows[name][-1]
    assert "of e2e" in rows["fp8dit"][-1]
    assert "triton kernel" in rows["fp8dit"][-1]  # the interpreter runs the Triton kernel


@needs_interpreter
def test_bench_flags_a_kernel_that_leaves_its_output_unwritten(monkeypatch, capsys):
    import fp8dit.attend

    monkeypatch.setattr(fp8dit.attend, "attention_stage", lambda *a, **k: None)
    rc = _run(bench, ["--smoke", "--shape", "1,1,64,64", "--backends",
                      "fp8dit-kernel,sdpa-math", "--repeats", "1"])
    rows = {r[1]: r for r in _table(capsys.readouterr().out, "preset")}
    assert rc == 1
    assert rows["fp8dit-kernel"][-1] == "NaN in output!"


@pytest.mark.skipif(torch.cuda.is_available(), reason=(
    "checks the CPU machine's path; the H200 image's triton 3.6 interpreter fails under its "
    "numpy 2.4 (shared/GPU.md)"))
def test_bench_smoke_script_reexecs_under_the_interpreter(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # the script runs from tmp_path: a relative PYTHONPATH (PYTHONPATH=src) would not reach fp8dit
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) if p else p
                                            for p in env["PYTHONPATH"].split(os.pathsep))
    res = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_attention.py"), "--smoke",
         "--shape", "1,1,64,64", "--backends", "fp8dit,sdpa-math", "--repeats", "1"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )
    assert res.returncode == 0, res.stderr
    rows = {r[1]: r for r in _table(res.stdout, "preset")}
    assert set(rows) == {"fp8dit", "sdpa-math"}
    assert float(rows["fp8dit"][6]) > 0.99
    assert not (tmp_path / "benchmarks").exists()  # smoke runs save nothing


def _row(date, preset, backend, tflops):
    return dict(date=date, preset=preset, backend=backend, recipe=None, ms=1.0, tflops=tflops,
                speedup_vs_cudnn=None, peak_mem_bytes=2**20, cos_vs_ref=0.999, note="",
                error=None, gpu="Test GPU")


def test_results_merge_keeps_older_runs(tmp_path):
    path = tmp_path / "results" / "test-gpu.json"
    assert bench.save_results(path, [_row("d1", "flux-1024", "fp8dit", 1.0)]) == 1
    assert bench.save_results(path, [_row("d2", "flux-1024", "fp8dit", 2.0),
                                     _row("d2", "flux-1024", "sdpa-cudnn", 3.0)]) == 3
    # the same run saved again (after its next preset) replaces its own rows
    assert bench.save_results(path, [_row("d2", "flux-1024", "fp8dit", 4.0)]) == 3
    rows = json.loads(path.read_text())
    assert sorted((r["date"], r["backend"], r["tflops"]) for r in rows) == [
        ("d1", "fp8dit", 1.0), ("d2", "fp8dit", 4.0), ("d2", "sdpa-cudnn", 3.0)]
    assert {r["date"] for r in bench.latest_run(rows)} == {"d2"}
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a readable JSON results file"):
        bench.save_results(path, [_row("d3", "flux-1024", "fp8dit", 1.0)])


def test_gpu_slug():
    assert bench.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert bench.gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def test_result_rows_name_the_commit_from_fp8dit_commit_first(monkeypatch):
    # A copied working tree (the GPU machine's) can carry an older .git HEAD than its files.
    monkeypatch.setenv("FP8DIT_COMMIT", "abc1234")
    assert bench.run_metadata(torch.device("cpu"))["commit"] == "abc1234"
    monkeypatch.delenv("FP8DIT_COMMIT")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=REPO).stdout.strip()
    assert bench.run_metadata(torch.device("cpu"))["commit"] == (head or None)


def test_bench_from_json_prints_the_latest_run(tmp_path, capsys):
    path = tmp_path / "r.json"
    bench.save_results(path, [_row("2026-01-01", "flux-1024", "fp8dit", 111.0),
                              _row("2026-02-01", "wan-480p", "fp8dit", 222.0)])
    assert _run(bench, ["--from-json", str(path)]) == 0
    rows = _table(capsys.readouterr().out, "preset")
    assert [(r[0], r[3]) for r in rows] == [("wan-480p", "222.0")]
    assert _run(bench, ["--from-json", str(tmp_path / "missing.json")]) == 2


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    for module in (bench, check):
        assert _run(module, ["--plot", str(tmp_path / "x.png")]) == 2
        assert "--plot needs matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_bench_plot_from_json(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "r.json"
    bench.save_results(path, [_row("d", p, b, t) for p, b, t in (
        ("flux-1024", "fp8dit", 500.0), ("flux-1024", "sdpa-cudnn", 400.0),
        ("wan-480p", "fp8dit", 600.0), ("wan-480p", "sdpa-cudnn", 560.0))])
    png = tmp_path / "bench.png"
    assert _run(bench, ["--from-json", str(path), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------------------------


def _check_rows(out):
    return {(r[0], r[1]): r for r in _table(out, "recipe")}


@needs_interpreter
def test_check_rows_for_every_recipe_and_family(capsys):
    assert _run(check, ["--shape", "1,2,128,64"]) == 0
    out = capsys.readouterr().out
    assert "B1 S128 H2 D64" in out
    rows = _check_rows(out)
    recipes = [*RECIPES, "sdpa"]
    assert set(rows) == {(r, f) for r in recipes for f in ("normal", "dit")}
    for (rec, fam), r in rows.items():
        cos, rel_l1, rmse, max_abs, lse_err = (float(x) for x in r[2:7])
        assert 0.99 < cos <= 1.0 + 1e-9, (rec, fam, cos)
        assert 0 < rel_l1 < 0.2 and 0 < rmse <= max_abs and 0 <= lse_err < 10, (rec, fam)
        # merged from four kv chunks by the LSE, the output is as accurate as in one call
        assert float(r[7]) <= rel_l1 * 1.25 + 2e-3, (rec, fam, r[7], rel_l1)
        worst = float(r[8].split()[0])
        assert worst >= rel_l1 * 0.999  # the worst head is no better than the whole
        if rec in RECIPES:  # the kernel's error is the recipe's rounding, not a bug
            assert 0.5 < float(r[9].rstrip("x")) < 2.0, (rec, fam, r[9])
        else:
            assert r[9] == "-"
    for fam in ("normal", "dit"):
        base = rows[("sdpa", fam)]
        assert float(base[6]) < 1e-3  # SDPA's LSE is computed in fp32
        for rec in RECIPES:
            # bf16 P and V leave far less than fp8's rounding (int8qk-bf16pv-bal: 2.7x SDPA's)
            factor = 2 if RECIPES[rec].pv == "bf16" else 3
            assert float(base[3]) * factor < float(rows[(rec, fam)][3]), (rec, fam)
            assert float(base[6]) < float(rows[(rec, fam)][6]), (rec, fam)


def test_check_argument_errors(capsys):
    assert _run(check, ["--recipes", "int8qk-fp8pv,bf16"]) == 2
    err = capsys.readouterr().err
    assert "--recipes: unknown 'bf16'" in err and "cudnn-fp8" in err  # the peer is listed
    assert _run(check, ["--families", "gaussian"]) == 2
    assert "--families: unknown 'gaussian'" in capsys.readouterr().err
    assert _run(check, ["--shape", "1,2,x,64"]) == 2
    assert "S must be an integer" in capsys.readouterr().err


@needs_interpreter
def test_check_names_why_the_cudnn_fp8_peer_cannot_run(capsys):
    """Asked for by name without a GPU, the peer gets an error row with the reason (exit 1);
    the other rows are unaffected."""
    rc = _run(check, ["--shape", "1,2,64,64", "--families", "normal", "--recipes",
                      "sdpa,cudnn-fp8"])
    rows = _check_rows(capsys.readouterr().out)
    assert rc == 1
    assert set(rows) == {("sdpa", "normal"), ("cudnn-fp8", "normal")}
    assert "CUDA GPU" in rows[("cudnn-fp8", "normal")][-1]
    assert 0.99 < float(rows[("sdpa", "normal")][2]) <= 1.0 + 1e-9


def _save(path, obj):
    torch.save(obj, path)
    return str(path)


def _qkv(B=1, S=96, H=2, Hkv=None, D=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, H, D, generator=g).to(torch.bfloat16)
    k = torch.randn(B, S, Hkv or H, D, generator=g).to(torch.bfloat16)
    v = torch.randn(B, S, Hkv or H, D, generator=g).to(torch.bfloat16)
    return q, k, v


def test_load_inputs_formats(tmp_path):
    q, k, v = _qkv(H=4, Hkv=2)
    for obj in ({"q": q, "k": k, "v": v}, (q, k, v), [q, k, v]):
        got = check.load_inputs(_save(tmp_path / "a.pt", obj))
        assert all(torch.equal(a, b) for a, b in zip(got, (q, k, v)))
    hnd = {"q": q.transpose(1, 2).contiguous(), "k": k.transpose(1, 2).contiguous(),
           "v": v.transpose(1, 2).contiguous(), "layout": "HND"}
    got = check.load_inputs(_save(tmp_path / "b.pt", hnd))
    assert all(torch.equal(a, b) for a, b in zip(got, (q, k, v)))


@pytest.mark.parametrize("make, fragment", [
    (lambda q, k, v: {"q": q, "k": k}, "without key(s) 'v'"),
    (lambda q, k, v: (q, k), "2 items, expected 3"),
    (lambda q, k, v: {"q": q, "k": k, "v": v.tolist()}, "v is a list, expected a tensor"),
    (lambda q, k, v: {"q": q[0], "k": k, "v": v}, "expected 4-D [B, S, H, D]"),
    (lambda q, k, v: {"q": q, "k": k, "v": v[:, :50]}, "v has shape"),
    (lambda q, k, v: {"q": q[..., :32], "k": k, "v": v}, "head_dim 32"),
    (lambda q, k, v: {"q": torch.cat([q, q[:, :, :1]], 2), "k": k, "v": v}, "multiple of"),
    (lambda q, k, v: {"q": q.to(torch.int32), "k": k, "v": v}, "expected floating point"),
    (lambda q, k, v: {"q": q.float().fill_(float("nan")), "k": k, "v": v}, "NaN or inf"),
    (lambda q, k, v: {"q": q, "k": k, "v": v, "layout": "BSHD"}, "'layout' must be"),
    (lambda q, k, v: q, "holds a Tensor"),
])
def test_load_inputs_errors(tmp_path, make, fragment):
    path = _save(tmp_path / "bad.pt", make(*_qkv()))
    with pytest.raises(check.InputsError, match=re.escape(fragment)):
        check.load_inputs(path)


def test_check_inputs_unreadable_file(tmp_path, capsys):
    bad = tmp_path / "notes.pt"
    bad.write_text("q, k and v are in another file")
    assert _run(check, ["--inputs", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "could not read" in err and "torch.save({'q': q, 'k': k, 'v': v}" in err
    assert _run(check, ["--inputs", str(tmp_path / "missing.pt")]) == 2
    assert "no such file" in capsys.readouterr().err


@needs_interpreter
def test_check_on_captured_inputs(tmp_path, capsys):
    q, k, v = _qkv(S=96, H=4, Hkv=2)  # GQA and a length that is not a tile multiple
    path = _save(tmp_path / "qkv.pt", {"q": q, "k": k.float(), "v": v})
    rc = _run(check, ["--inputs", path, "--recipes", "int8qk-fp8pv,sdpa"])
    out = capsys.readouterr().out
    assert rc == 0
    rows = _check_rows(out)
    assert set(rows) == {("int8qk-fp8pv", "file:qkv.pt"), ("sdpa", "file:qkv.pt")}
    assert "B1 S96 H4 D64" in out
    assert float(rows[("int8qk-fp8pv", "file:qkv.pt")][2]) > 0.99
    assert float(rows[("sdpa", "file:qkv.pt")][3]) < float(
        rows[("int8qk-fp8pv", "file:qkv.pt")][3])


@needs_interpreter
def test_check_plot_and_json(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png, js = tmp_path / "check.png", tmp_path / "check.json"
    rc = _run(check, ["--shape", "1,2,128,64", "--families", "dit", "--recipes",
                      "fp8,sdpa", "--sweep", "32,128", "--plot", str(png),
                      "--out-json", str(js)])
    assert rc == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = json.loads(js.read_text())
    assert [(r["recipe"], r["inputs"]) for r in rows] == [("fp8", "dit"), ("sdpa", "dit")]
    assert all(len(r["per_head_rel_l1"]) == 2 for r in rows)
    assert _run(check, ["--shape", "1,2,128,64", "--sweep", "64,256", "--plot", str(png)]) == 2
    assert "--sweep: lengths must be between 1 and S=128" in capsys.readouterr().err


def test_cli_wires_bench_and_check(capsys):
    pytest.importorskip("fp8dit.tools.demo")  # the cli imports every subcommand's module
    from fp8dit.tools import cli

    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    assert "--smoke" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["check", "--help"])
    assert "--inputs" in capsys.readouterr().out


def test_committed_results_files_are_readable():
    """Every committed results file loads as one JSON list of rows (a merge that leaves rows
    after the closing bracket makes the next `fp8dit bench --out-json` on that file refuse to
    save), and every row names its GPU, driver, versions, commit and date (None where a run
    did not record one), as new rows do."""
    files = sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "results").glob("*.json"))
    assert files
    for path in files:
        rows = bench.load_results(path)
        assert rows and all(isinstance(r, dict) for r in rows), path
        assert all(set(bench.METADATA_FIELDS) <= set(r) for r in rows), path
        assert all(r["gpu"] and r["date"] and r["torch"] and r["triton"] for r in rows), path
        keys = [bench._row_key(r) for r in rows]
        assert len(set(keys)) == len(keys), f"{path}: two rows that a save would merge"
    assert set(bench.run_metadata(torch.device("cpu"))) == set(bench.METADATA_FIELDS)


def test_driver_version_from_nvidia_smi_or_proc(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 570.124.06\necho 570.124.06\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert bench.driver_version(torch.device("cuda")) == "570.124.06"
    assert bench.driver_version(torch.device("cpu")) is None
    assert bench.run_metadata(torch.device("cpu"))["driver"] is None
    assert bench.driver_from_proc(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.124.06  Release Build  "
        "(dvs-builder@U16)  Tue Mar  4 2025\nGCC version:  gcc 12\n") == "570.124.06"
    assert bench.driver_from_proc(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 2024\n") \
        == "550.54.15"
    assert bench.driver_from_proc("no driver here") is None


def test_results_of_two_models_in_one_second_are_both_kept(tmp_path):
    path = tmp_path / "forward.json"
    rows = [dict(date="d", gpu="g", model=m, mode="eager", backend="fp8dit") for m in "ab"]
    assert bench.save_results(path, rows) == 2


def test_gpu_clocks_sampler_reads_nvidia_smi(tmp_path, monkeypatch):
    """`fp8dit bench` records each backend's SM clock, power and power-cap share from
    `nvidia-smi -lms` (the H200 runs these kernels at its power cap, docs/performance.md): the
    device is named by UUID, fields the GPU does not report ("[N/A]") are left out, not taken
    as zero, and a window without samples gives nothing."""
    import time
    import types

    args_file = tmp_path / "args"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        f"echo \"$@\" > {args_file}\n"
        "for i in 1 2 3; do\n"
        "  echo '1830, 690.5, 0x0000000000000004'\n"
        "  echo '1980, [N/A], 0x0000000000000000'\n"
        "  echo 'garbage line'\n"
        "done\n"
        "sleep 30\n"
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: types.SimpleNamespace(uuid="1234-abcd"))
    t0 = time.perf_counter()
    clocks = bench._GpuClocks(types.SimpleNamespace(type="cuda", index=0))
    try:
        deadline = time.time() + 10
        while len(clocks.samples) < 6 and time.time() < deadline:
            time.sleep(0.02)
        got = clocks.summary(t0, time.perf_counter())
    finally:
        clocks.close()
    assert "--id=GPU-1234-abcd" in args_file.read_text()
    assert got == {"sm_clock_mhz": 1905.0, "power_w": 690.5, "power_capped": 0.5}
    assert clocks.summary(t0 - 10, t0 - 5) == {}
    assert bench._GpuClocks(types.SimpleNamespace(type="cpu", index=None)).samples == []


def test_table_shows_the_clock_only_when_measured():
    base = dict(preset="p", backend="fp8dit", ms=1.0, tflops=2.0, speedup_vs_cudnn=1.5,
                peak_mem_bytes=0, cos_vs_ref=0.9999)
    plain = bench.format_table([base])
    assert "MHz" not in plain.splitlines()[0]
    rows = [dict(base, sm_clock_mhz=1843.3, power_capped=0.9),
            dict(base, backend="sageattn", sm_clock_mhz=1978.0, power_capped=0.0),
            dict(base, backend="sdpa-flash")]
    lines = bench.format_table(rows).splitlines()
    assert "MHz" in lines[0]
    assert "1843 cap" in lines[2] and "1978" in lines[3] and "cap" not in lines[3]
    assert lines[4].split()[-1] == "-"  # a row without samples


def test_table_names_a_backend_unavailable_everywhere_once():
    reason = "unavailable: the cuDNN frontend is not importable; pip install nvidia-cudnn-frontend"
    # sageattn unavailable in one preset only (a shape it refuses): its rows stay
    sage = {"a": dict(error="unavailable: head_dim 256"), "b": dict(ms=2.0)}
    rows = []
    for preset in ("a", "b"):
        rows += [dict(preset=preset, backend="fp8dit", ms=1.0, speedup_vs_cudnn=1.5),
                 dict(preset=preset, backend="cudnn-fp8", error=reason),
                 dict(preset=preset, backend="cudnn-fp8-kernel", error=reason),
                 dict(preset=preset, backend="sageattn", **sage[preset])]
    text = bench.format_table(rows)
    assert text.count(reason) == 1
    assert text.splitlines()[-1] == f"cudnn-fp8, cudnn-fp8-kernel: {reason} (every preset)"
    assert "unavailable: head_dim 256" in text
    body = [line.split()[1] for line in text.splitlines()[2:-2] if line]
    assert body == ["fp8dit", "sageattn", "fp8dit", "sageattn"]
    # one preset: every row shown as before
    one = bench.format_table([r for r in rows if r["preset"] == "a"])
    assert one.count(reason) == 2 and "every preset" not in one
