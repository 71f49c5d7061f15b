"""``fp8dit demo`` (in process and from a fresh process) and the model forward benchmark's
arguments and exit without a GPU (``benchmarks/bench_forward.py``)."""

# TRITON_INTERPRET=1 (no GPU) is set by conftest.py before triton is imported.

import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")

import fp8dit.tools.cli  # noqa: E402
from fp8dit.tools import demo  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HAS_CUDA = torch.cuda.is_available()
TINY_RUN = ["--layers", "1", "--steps", "2"]

# On a GPU the tiny demo's rows are too short for auto to pick FP8 (the demo says so); the
# tests check the FP8 run, so they ask for it (the fresh process inherits the variable).
pytestmark = pytest.mark.usefixtures("fp8_at_any_length")


def _png(path: Path) -> tuple[int, int, bytes]:
    """(width, height, raw scanlines) of a PNG; asserts the signature and the chunk CRCs."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, size = 8, b"", None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, f"bad CRC in {kind!r}"
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    return size[0], size[1], zlib.decompress(idat) if idat else b""


def _check_output(text: str) -> None:
    assert "attention layers, fp8dit run" in text
    layers = re.findall(r"^\s+(blocks\.\d+\.attn\d)\s+(self|cross).*-> (\w+)", text, re.M)
    assert layers == [("blocks.0.attn1", "self", "fp8"), ("blocks.0.attn2", "cross", "fp8")], text
    # the self-attention's rotary embedding fused into fp8dit's quantization (WanRotaryProcessor)
    assert re.findall(r"^\s+(blocks\.\d+\.attn\d) .*\[rotary embedding (\w+)\]", text, re.M) \
        == [("blocks.0.attn1", "fused")], text
    assert len(re.findall(r"^\s+(native|fp8dit)\s+step\s+\d+/2 \[", text, re.M)) == 4
    m = re.search(r"final latents, fp8dit vs native: cos ([\d.]+), PSNR ([\d.]+) dB", text)
    assert m, text
    assert float(m.group(1)) >= 0.99 and float(m.group(2)) > 20


def _need_cli_modules():
    # fp8dit.tools.cli builds every subcommand's parser, so it needs all their modules.
    import importlib.util

    missing = [m for m, _ in fp8dit.tools.cli.SUBCOMMANDS.values()
               if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"fp8dit.tools.cli needs {missing}, not written yet")


def test_demo_through_cli(tmp_path, capsys):
    _need_cli_modules()
    png = tmp_path / "demo.png"
    assert fp8dit.tools.cli.main(["demo", *TINY_RUN, "--out", str(png)]) == 0
    text = capsys.readouterr().out
    _check_output(text)
    if _has_matplotlib():
        assert f"per-step error plot: {png} (matplotlib)" in text
    width, height, _ = _png(png)
    assert width > 100 and height > 100


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_demo_plain_png_without_matplotlib(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    png = tmp_path / "plain.png"
    assert demo.main([*TINY_RUN, "--out", str(png), "--seed", "3"]) == 0
    text = capsys.readouterr().out
    _check_output(text)
    assert "matplotlib is not installed" in text and f"{png} (plain PNG)" in text
    width, height, raw = _png(png)
    assert (width, height) == (640, 360) and len(raw) == height * (1 + 3 * width)
    for rgb in demo._COLORS:  # both series drew bars
        assert bytes(rgb) in raw


def test_plot_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "mpl.png"
    assert demo.write_plot(str(png), [1e-4, 2e-4, 4e-4], [1e-3, 1e-3, 2e-3]) == "matplotlib"
    assert _png(png)[0] > 100


def test_demo_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit):
        demo.main(["--steps", "0"])
    assert "argument --steps: expected an integer of at least 1, got '0'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        demo.main(["--shift", "-1"])
    assert "argument --shift: expected a positive number, got '-1'" in capsys.readouterr().err
    assert demo.main(["--device", "tpu"]) == 2
    assert "--device: expected cuda, cuda:N or cpu, got 'tpu'" in capsys.readouterr().out


def test_demo_fresh_process_sets_interpreter(tmp_path):
    """`fp8dit demo` from a new process: no TRITON_INTERPRET in the environment."""
    _need_cli_modules()
    png = tmp_path / "fresh.png"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-m", "fp8dit", "demo", *TINY_RUN, "--out", str(png)],
                         env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    if not HAS_CUDA:
        assert "re-running under TRITON_INTERPRET=1" in res.stdout
    _check_output(res.stdout)
    assert png.exists()


FORWARD_MODELS = ("wan", "hunyuanvideo", "hunyuanvideo15", "cogvideox", "flux")


@pytest.fixture
def bench_forward(monkeypatch):
    """benchmarks/bench_forward.py as a module (its arguments are parsed without a GPU)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.delitem(sys.modules, "bench_forward", raising=False)
    import bench_forward

    return bench_forward


@pytest.mark.skipif(HAS_CUDA, reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("model", FORWARD_MODELS)
def test_forward_benchmarks_exit_without_cuda(model):
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_forward.py"),
                          "--model", model], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stdout.strip() == \
        "bench_forward: needs a CUDA GPU; torch sees none (nothing measured)"


@pytest.mark.parametrize("argv, fragment", [
    ([], "the following arguments are required: --model"),
    (["--model", "flux", "--layers", "2"], "unrecognized arguments: --layers 2"),
    (["--model", "wan", "--resolution", "540p"], "argument --resolution: invalid choice: '540p'"),
    (["--model", "wan", "--sdpa", "auto"],
     "--sdpa: expected baselines among cudnn, flash, efficient for --model wan, got auto"),
    (["--model", "cogvideox", "--sdpa", " , "],
     "--sdpa: expected baselines among auto, cudnn, flash, efficient for --model cogvideox, "
     "got none"),
    (["--model", "wan", "--repeats", "0"], "--repeats: expected an integer of at least 1, got 0"),
    (["--model", "cogvideox", "--warmup", "-1"],
     "--warmup: expected an integer of at least 0, got -1"),
    (["--model", "cogvideox", "--batch", "0"], "--batch: expected an integer of at least 1, got 0"),
    (["--model", "hunyuanvideo", "--kept", "300"], "--kept: expected 1..--text (256), got 300"),
    (["--model", "hunyuanvideo15", "--kept-2", "257"],
     "--kept: expected 1..1000, --kept-2 0..256, got 120 and 257"),
    (["--model", "flux", "--dual", "0", "--single", "0"],
     "--dual, --single: expected at least one block in all, got 0 and 0"),
    (["--model", "flux", "--single", "-1"], "--single: expected an integer of at least 0, got -1"),
])
def test_forward_benchmark_argument_errors(bench_forward, capsys, argv, fragment):
    with pytest.raises(SystemExit) as exc:
        bench_forward.parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"bench_forward.py: error: {fragment}" in err, err


def test_forward_benchmark_bad_model_names_the_choices(bench_forward, capsys):
    with pytest.raises(SystemExit) as exc:
        bench_forward.parse_args(["--model", "sd3", "--layers", "2"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "bench_forward.py: error: argument --model: invalid choice: 'sd3'" in err, err
    choices = err.split("choose from", 1)[1]
    assert all(re.search(rf"\b{m}\b", choices) for m in FORWARD_MODELS), err


def test_forward_benchmark_flux_names_a_bad_fp8dit_backend(bench_forward, capsys, monkeypatch):
    monkeypatch.setenv("FP8DIT_BACKEND", "cudnn")
    with pytest.raises(SystemExit):
        bench_forward.parse_args(["--model", "flux"])
    assert "FP8DIT_BACKEND: expected one of auto, fp8, sdpa, got 'cudnn'" in \
        capsys.readouterr().err


def test_forward_benchmark_arguments_per_model(bench_forward, monkeypatch):
    monkeypatch.setenv("FP8DIT_BACKEND", "fp8")
    parse = bench_forward.parse_args
    assert {m: parse(["--model", m]).sdpa for m in FORWARD_MODELS} == {
        "wan": ["cudnn"], "hunyuanvideo": ["auto", "cudnn", "cudnn-kept"],
        "hunyuanvideo15": ["auto"], "cogvideox": ["auto", "cudnn"], "flux": ["cudnn", "flash"]}
    flux = parse(["--model", "flux", "--size", "2048", "--dual", "0"])
    assert (flux.repeats, flux.warmup, flux.single) == (10, 3, 2)
    assert bench_forward.MODELS["flux"].fields(flux) == dict(
        model="FLUX.1-dev", dual_layers=0, single_layers=2, size=2048, batch=1,
        tokens=128 * 128 + 512, heads=24, head_dim=128, fp8dit_backend="fp8")
    cog = parse(["--model", "cogvideox", "--rotate-first", "--sdpa", "cudnn, auto,cudnn"])
    assert cog.sdpa == ["cudnn", "auto"] and (cog.repeats, cog.warmup) == (5, 2)
    assert bench_forward.MODELS["cogvideox"].variants(cog) == [bench_forward.ROTATE_FIRST]
    wan = parse(["--model", "wan", "--diffusers-rope", "--resolution", "480p"])
    assert bench_forward.MODELS["wan"].variants(wan) == ["fp8dit-diffusers-rope"]
    assert bench_forward.MODELS["wan"].fields(wan)["tokens"] == 21 * 30 * 52


def test_forward_benchmark_rows_match_the_committed_ones(bench_forward, monkeypatch):
    """Each model's row fields are those of its committed rows, and where a committed row ran
    a model's default configuration, the token counts agree."""
    from fp8dit.tools import bench

    monkeypatch.delenv("FP8DIT_BACKEND", raising=False)
    rows = bench.load_results(ROOT / "benchmarks" / "results" / "nvidia-h200-forward.json")
    for name in FORWARD_MODELS:
        fields = bench_forward.MODELS[name].fields(bench_forward.parse_args(["--model", name]))
        mine = [r for r in rows if r["model"] == fields["model"]]
        assert mine and all(set(fields) <= set(r) for r in mine), name
        config = {k: v for k, v in fields.items() if k not in ("tokens", "kept_keys")}
        same = [r for r in mine if all(r[k] == v for k, v in config.items())]
        assert all(r["tokens"] == fields["tokens"] and r.get("kept_keys") == fields.get(
            "kept_keys") for r in same), name
