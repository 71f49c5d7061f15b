"""The figures of README.md and docs/*.md, generated from ``benchmarks/results/*.json``.

Every generated part of a Markdown file sits between ``<!-- report:NAME -->`` and
``<!-- /report -->``, where NAME is a key of :data:`BLOCKS`; nothing between the markers is
typed by hand. ``docs/speed.png`` is drawn from the same rows and carries a digest of the data
it plots. A new measurement reaches the docs this way: merge its rows into the results file
(``fp8dit bench`` does), name its commit in :data:`RUNS` and run the generator. Each GPU's rows
are in a file of their own (:data:`BENCH_FILES`) and a run reads one file, so no table mixes two
GPUs.

Example
-------
$ python -m fp8dit.tools.report            # rewrite every block and docs/speed.png
$ python -m fp8dit.tools.report --check    # exit 1 with a diff where a block or the plot is stale

``tests/test_readme_figures.py`` runs the check, so a figure edited by hand, or a results file
changed without the docs following, fails the tests.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import re
import struct
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

# The runs the docs show, by the commit each results row records. The warp-specialized kernel's
# figures are one `fp8dit bench --preset all` run with all nine backends; the Triton kernel's,
# the last run of the default recipe on it at the long presets (before the Gluon kernel existed);
# `repeat` is a second run of the headline's code, the same evening, for the run-to-run spread.
RUNS = {
    "headline": "2e910f9",
    "repeat": "969c502",
    "triton-kernel": "0aa92d8",
    "by-length": "3c17f97",
    # One H100 80GB HBM3: one `fp8dit bench --preset all,models` call (RUN_SOURCES).
    "h100": "0782e1d",
}

# The `fp8dit bench` results files, by the key of load_results' answer that holds their rows.
BENCH_FILES = {"attention": "nvidia-h200.json", "h100": "nvidia-h100-80gb-hbm3.json"}

# Runs that are not every row of their commit in nvidia-h200.json: run -> (the BENCH_FILES key
# of their file, the date `fp8dit bench` gave their rows). The H100 file holds several runs of
# one commit on some days (bench calls, interleaved comparisons of Triton releases): the date
# keeps each table to one call.
RUN_SOURCES = {
    "h100": ("h100", "2026-12-07T08:33:00Z"),
}

# Preset (bench name) -> how the docs name the model and resolution.
MODEL_LABELS = {
    "wan2.2-a14b-720p": "Wan2.2-A14B 720p",
    "wan-480p": "Wan 480p",
    "wan2.1-1.3b-480p": "Wan2.1-1.3B 480p",
    "hunyuanvideo-720p": "HunyuanVideo 720p",
    "cogvideox-5b": "CogVideoX-5B",
    "flux-1024": "Flux 1024 px",
    "flux-2048": "Flux 2048 px",
    "flux.2-dev-1024": "FLUX.2-dev 1024 px",
    "sd3.5-large-1024": "SD3.5 Large 1024 px",
    "qwen-image-1328": "Qwen-Image 1328 px",
    "hunyuanimage-2.1-2048": "HunyuanImage 2.1 2048 px",
    "ltx-video-2b": "LTX-Video 2B",
    "wan2.2-ti2v-5b-720p": "Wan2.2-TI2V-5B 720p",
    "mochi-1": "Mochi 1",
    "cogvideox1.5-5b": "CogVideoX1.5-5B",
    "cosmos-predict2-14b": "Cosmos-Predict2 14B",
    "hunyuanvideo-1.5-720p": "HunyuanVideo 1.5 720p",
    "skyreels-v2-14b-720p": "SkyReels-V2 14B 720p",
}
# Every preset, in this order; a table shows only those its run has rows for (_presets).
PRESET_ORDER = tuple(MODEL_LABELS)

# Whole-model forwards through diffusers (the forward benchmarks), one table row each:
# (model, commit, row filter, peer backend, how the docs name the peer). The newest measurement
# of each model and peer, and the only ones in a CUDA graph.
FORWARD_ROWS = (
    ("Wan2.2-A14B", "70961f5", {}, "sdpa-cudnn", "SDPA cuDNN"),
    ("Wan2.2-A14B", "1a954da", {}, "sdpa-cudnn", "SDPA cuDNN"),
    ("HunyuanVideo", "996cae4", {}, "sdpa-cudnn-kept", "cuDNN over the kept keys"),
    ("HunyuanVideo", "92d8737+", {}, "sdpa-auto", "`native` (SDPA with the mask)"),
    ("HunyuanVideo", "e4f7940", {}, "sdpa-auto", "`native` (SDPA with the mask)"),
    ("HunyuanVideo-1.5", "996cae4", {}, "sdpa-auto-keymask", "`native` given the key mask"),
    ("HunyuanVideo-1.5", "794dcf9", {}, "sdpa-auto", "`native` (its [B, 1, S, S] mask)"),
    ("HunyuanVideo-1.5", "e191e91", {"resolution": "720p"}, "sdpa-auto",
     "`native` (its [B, 1, S, S] mask)"),
    ("CogVideoX-5B", "dcb41e9", {}, "sdpa-auto", "SDPA (diffusers' processor)"),
    ("CogVideoX-5B", "1493020", {}, "sdpa-auto", "SDPA (diffusers' processor)"),
    ("FLUX.1-dev", "1cdf831", {"size": 1024, "fp8dit_backend": "auto"}, "sdpa-cudnn",
     "SDPA cuDNN"),
    ("FLUX.1-dev", "1cdf831", {"size": 2048}, "sdpa-cudnn", "SDPA cuDNN"),
)
MODES = (("eager", "eager"), ("compile", "torch.compile"), ("cuda-graph", "CUDA graph"))

KERNEL_NAMES = {"gluon-ws": "warp-specialized", "triton": "Triton"}

BEGIN = re.compile(r"^<!-- report:([a-z0-9-]+) -->$")
END = "<!-- /report -->"
PLOT = "docs/speed.png"
PLOT_KEY = "fp8dit-data"  # PNG text chunk: digest of the rows the plot was drawn from


class ReportError(ValueError):
    """The results or a Markdown file do not hold what a block needs; the message says what."""


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


def _read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    try:
        rows = json.loads(path.read_text())
    except ValueError as e:
        raise ReportError(f"{path}: not a readable JSON results file ({e})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ReportError(f"{path}: expected a JSON list of row objects")
    return rows


def load_results(root: Path) -> dict[str, list[dict]]:
    """``{"attention": the rows of nvidia-h200.json, "h100": the rows of
    nvidia-h100-80gb-hbm3.json (each GPU's `fp8dit bench` rows, :data:`BENCH_FILES`), "forward":
    the rows of every nvidia-h200*forward*.json (the whole-model benchmarks)}`` from
    ``root/benchmarks/results``."""
    folder = Path(root) / "benchmarks" / "results"
    out = {key: _read_rows(folder / name) for key, name in BENCH_FILES.items()}
    out["forward"] = [r for path in sorted(folder.glob("nvidia-h200*forward*.json"))
                      for r in _read_rows(path)]
    for key, name in BENCH_FILES.items():
        if not out[key]:
            raise ReportError(f"{folder}: no rows in {name} (the `fp8dit bench` rows)")
    return out


def run_rows(results, run: str) -> dict[tuple[str, str], dict]:
    """The attention rows of ``RUNS[run]`` in its GPU's file (:data:`RUN_SOURCES`; else
    nvidia-h200.json), by (preset, backend); the latest row of a commit where it has several."""
    commit = RUNS[run]
    source, date = RUN_SOURCES.get(run, ("attention", None))
    rows = sorted((r for r in results[source] if r.get("commit") == commit
                   and date in (None, r.get("date"))), key=lambda r: r["date"])
    if not rows:
        dated = f" dated {date}" if date else ""
        raise ReportError(f"RUNS[{run!r}]: no row of commit {commit}{dated} in "
                          f"{BENCH_FILES[source]}")
    return {(r["preset"], r["backend"]): r for r in rows}


def _row(rows, preset: str, backend: str, run: str) -> dict:
    r = rows.get((preset, backend))
    if r is None or r.get("error") or r.get("ms") is None:
        why = "no row" if r is None else f"its row says {r.get('error')!r}"
        raise ReportError(f"run {run} ({RUNS[run]}): {why} for {preset} / {backend}")
    return r


def _presets(rows) -> list[str]:
    found = {p for p, _ in rows}
    return [p for p in PRESET_ORDER if p in found]


# cudnn_fp8.import_cudnn's words where the frontend is not installed
NO_FRONTEND = "the cuDNN frontend is not importable"


def _absent(rows, backend: str) -> str | None:
    """None where ``backend`` has a time at some preset of the run; else the line under a table
    that leaves it out, saying why from its rows (a peer that could not run on that machine)."""
    got = [r for (_, b), r in rows.items() if b == backend]
    if any(r.get("ms") is not None and not r.get("error") for r in got):
        return None
    errors = sorted({str(r.get("error")) for r in got})
    if backend == "cudnn-fp8" and errors and all(NO_FRONTEND in e for e in errors):
        return ("cuDNN FP8 is left out: its frontend (`nvidia-cudnn-frontend`) was not installed "
                "when these rows were measured.")
    return f"{backend} is left out: {'; '.join(errors) or 'the run has no row of it'}."


# ---------------------------------------------------------------------------------------------
# Number formats
# ---------------------------------------------------------------------------------------------


def ratio(x: float) -> str:
    return f"{x:.2f}x"


def ms(x: float) -> str:
    if x < 1:
        return f"{x:.3f}"
    return f"{x:.2f}" if x < 100 else f"{x:,.1f}"


def thousands(x: float) -> str:
    return f"{x:,.0f}"


def _span(values, fmt: str) -> str:
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}-{hi}"


def _shape(r: dict) -> str:
    return f"{r['H']} x {r['S']:,}, d{r['D']}"


def _label(r: dict) -> str:
    return f"{MODEL_LABELS.get(r['preset'], r['preset'])} ({_shape(r)})"


def _day(r: dict) -> str:
    return r["date"][:10]


def _cudnn(r: dict) -> str:
    v = r.get("cudnn")
    return f"{v // 10000}.{v % 10000 // 100}" if isinstance(v, int) else "?"


def _auto_ran_sdpa(auto: dict) -> bool:
    # `auto` took SDPA where its output is SDPA cuDNN's own, bit for bit.
    return auto.get("rel_l1_vs_ref") == 0.0


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _run_line(rows, run: str) -> str:
    r = next(iter(rows.values()))
    return (f"One {r['gpu']}, {_day(r)}, commit {RUNS[run]}: torch {r['torch']}, "
            f"triton {r['triton']}, cuDNN {_cudnn(r)}")


def _with_notes(table: str, notes: list[str]) -> str:
    # a blank line ends the table: a line right under it would read as one more row
    return "\n\n".join([table, *dict.fromkeys(notes)])


# ---------------------------------------------------------------------------------------------
# Blocks
# ---------------------------------------------------------------------------------------------


def readme_speed(results, run: str = "headline") -> str:
    """The README's speed table of ``run``; a peer with no time in the run (not installed on
    its machine) gets a line under the table instead of a column."""
    rows = run_rows(results, run)
    first = next(iter(rows.values()))
    peers = {"cudnn-fp8": f"cuDNN FP8 (frontend {first.get('cudnn_frontend')})",
             "sageattn": f"SageAttention {first.get('sageattention')}"}
    absent = {b: _absent(rows, b) for b in peers}
    peers = {b: name for b, name in peers.items() if not absent[b]}
    header = ["DiT shape (heads x tokens, head dim)", "fp8dit", "vs cuDNN", "`auto`",
              "kernel alone", *peers.values()]
    body = []
    for p in _presets(rows):
        f8 = _row(rows, p, "fp8dit", run)
        auto = _row(rows, p, "fp8dit-auto", run)
        auto_cell = ratio(auto["speedup_vs_cudnn"])
        if _auto_ran_sdpa(auto):
            auto_cell += " (SDPA)"
        body.append([
            _label(f8), f"{ms(f8['ms'])} ms, {thousands(f8['tflops'])} TFLOPS",
            f"**{ratio(f8['speedup_vs_cudnn'])}**", auto_cell,
            ratio(_row(rows, p, "fp8dit-kernel", run)["speedup_vs_cudnn"]),
            *(ratio(_row(rows, p, b, run)["speedup_vs_cudnn"]) for b in peers),
        ])
    notes = [why for why in absent.values() if why]
    return _run_line(rows, run) + ".\n\n" + _with_notes(_table(header, body), notes)


def _quality_rows(rows):
    first = next(iter(rows.values()))
    return (("fp8dit", f"fp8dit (`{first.get('recipe') or 'int8qk-fp8pv'}`)"),
            ("cudnn-fp8", "cuDNN FP8 (one scale per tensor)"),
            ("sageattn", f"SageAttention {first.get('sageattention')}"),
            ("sdpa-flash", "SDPA flash (FA2, bf16)"))


def readme_quality(results, runs: tuple[str, ...] = ("headline",),
                   scope: str = "every preset above") -> str:
    """Cosine and rel-L1 against SDPA cuDNN, the span over every preset of ``runs`` (runs of
    one GPU); a backend with no figures in them gets a line under the table instead of a row."""
    sets = [(run, run_rows(results, run)) for run in runs]
    run, rows = sets[0]
    recipe = _row(rows, "wan2.2-a14b-720p", "fp8dit", run).get("recipe")
    names = dict(_quality_rows(rows))
    names["fp8dit"] = f"fp8dit (`{recipe}`)"
    body, notes = [], []
    for backend, name in names.items():
        absent = [_absent(rs, backend) for _, rs in sets]
        if all(absent):
            notes += absent
            continue
        got = [_row(rs, p, backend, each) for each, rs in sets for p in _presets(rs)]
        body.append([name, _span([r["cos_vs_ref"] for r in got], ".5f"),
                     _span([r["rel_l1_vs_ref"] for r in got], ".4f")])
    return _with_notes(_table([f"against SDPA cuDNN (bf16), same inputs, {scope}", "cosine",
                               "rel-L1"], body), notes)


def h100_quality(results) -> str:
    return (_run_line(run_rows(results, "h100"), "h100") + "; i.i.d. normal inputs.\n\n"
            + readme_quality(results, ("h100",),
                             "every preset of performance.md's H100 table"))


def h100_headline(results) -> str:
    p = "wan2.2-a14b-720p"
    f8 = _row(run_rows(results, "h100"), p, "fp8dit", "h100")
    return (f"On one {f8['gpu']} ({_day(f8)}, commit {RUNS['h100']}) fp8dit ran {MODEL_LABELS[p]} "
            f"at {ratio(f8['speedup_vs_cudnn'])} SDPA cuDNN's speed on the same card: "
            "[docs/performance.md](docs/performance.md#on-an-h100).")


def quality_by_preset(results) -> str:
    rows = run_rows(results, "headline")
    names = _quality_rows(rows)[:3]
    body = []
    for p in _presets(rows):
        cells = [_label(_row(rows, p, "fp8dit", "headline"))]
        for backend, _ in names:
            r = _row(rows, p, backend, "headline")
            cells.append(f"{r['cos_vs_ref']:.5f} / {r['rel_l1_vs_ref']:.4f}")
        body.append(cells)
    return (_run_line(rows, "headline") + "; i.i.d. normal inputs.\n\n"
            + _table(["preset"] + [f"{n}: cos / rel-L1" for _, n in names], body))


def speed(results) -> str:
    rows = run_rows(results, "headline")
    first = next(iter(rows.values()))
    header = ["preset", "fp8dit ms", "TFLOPS", "vs cuDNN", "`auto`", "kernel alone",
              "quantization ms", "cuDNN ms (TFLOPS)", "cuDNN FP8 end to end / kernel",
              "flash (FA2)", f"SageAttention {first.get('sageattention')}",
              "MHz fp8dit / cuDNN", "kernel"]
    body = []
    for p in _presets(rows):
        def get(b, p=p):
            return _row(rows, p, b, "headline")
        f8, cud = get("fp8dit"), get("sdpa-cudnn")
        auto = get("fp8dit-auto")
        quant = get("fp8dit-quant")
        auto_cell = ratio(auto["speedup_vs_cudnn"]) + (" (SDPA)" if _auto_ran_sdpa(auto) else "")
        clocks = [r.get("sm_clock_mhz") for r in (f8, cud)]
        body.append([
            _label(f8), ms(f8["ms"]), thousands(f8["tflops"]),
            f"**{ratio(f8['speedup_vs_cudnn'])}**", auto_cell,
            ratio(get("fp8dit-kernel")["speedup_vs_cudnn"]),
            f"{ms(quant['ms'])} ({quant['ms'] / f8['ms']:.0%})",
            f"{ms(cud['ms'])} ({thousands(cud['tflops'])})",
            f"{ratio(get('cudnn-fp8')['speedup_vs_cudnn'])} / "
            f"{ratio(get('cudnn-fp8-kernel')['speedup_vs_cudnn'])}",
            ratio(get("sdpa-flash")["speedup_vs_cudnn"]),
            ratio(get("sageattn")["speedup_vs_cudnn"]),
            " / ".join("-" if c is None else thousands(c) for c in clocks),
            KERNEL_NAMES.get(f8.get("kernel"), str(f8.get("kernel"))),
        ])
    return _run_line(rows, "headline") + ".\n\n" + _table(header, body)


def repeat(results) -> str:
    a, b = run_rows(results, "repeat"), run_rows(results, "headline")
    ra, rb = next(iter(a.values())), next(iter(b.values()))
    header = ["preset", f"{ra['date'][:16].replace('T', ' ')} UTC, {RUNS['repeat']}",
              f"{rb['date'][:16].replace('T', ' ')} UTC, {RUNS['headline']}"]
    body = []
    for p in _presets(a):
        cells = [_label(_row(a, p, "fp8dit", "repeat"))]
        for rows, run in ((a, "repeat"), (b, "headline")):
            f8 = _row(rows, p, "fp8dit", run)
            kern = _row(rows, p, "fp8dit-kernel", run)
            auto = _row(rows, p, "fp8dit-auto", run)
            if _auto_ran_sdpa(auto):
                cells.append(f"`auto` {ratio(auto['speedup_vs_cudnn'])} (SDPA); FP8 "
                             f"{ratio(f8['speedup_vs_cudnn'])}, kernel "
                             f"{ratio(kern['speedup_vs_cudnn'])}")
            else:
                cells.append(f"{ratio(f8['speedup_vs_cudnn'])} (kernel "
                             f"{ratio(kern['speedup_vs_cudnn'])})")
        body.append(cells)
    return _table(header, body)


def kernels(results) -> str:
    tri, ws = run_rows(results, "triton-kernel"), run_rows(results, "headline")
    rt = next(iter(tri.values()))
    header = ["preset", f"Triton kernel ({_day(rt)}, commit {RUNS['triton-kernel']})",
              f"warp-specialized kernel ({_day(next(iter(ws.values())))}, commit "
              f"{RUNS['headline']})"]
    body = []
    for p in _presets(tri):
        w = ws.get((p, "fp8dit"))
        if w is None or w.get("kernel") != "gluon-ws":
            continue
        t = _row(tri, p, "fp8dit", "triton-kernel")
        body.append([_label(w), f"{ratio(t['speedup_vs_cudnn'])} ({thousands(t['tflops'])} "
                     f"TFLOPS)", f"{ratio(w['speedup_vs_cudnn'])} ({thousands(w['tflops'])} "
                     f"TFLOPS)"])
    return _table(header, body)


def triton_fallback(results) -> str:
    p = "wan2.2-a14b-720p"
    t = _row(run_rows(results, "triton-kernel"), p, "fp8dit", "triton-kernel")
    w = _row(run_rows(results, "headline"), p, "fp8dit", "headline")
    return (f"At {MODEL_LABELS[p]} the Triton kernel measured {ratio(t['speedup_vs_cudnn'])} "
            f"SDPA cuDNN's speed (H200, {_day(t)}, commit {RUNS['triton-kernel']}), the "
            f"warp-specialized kernel {ratio(w['speedup_vs_cudnn'])} ({_day(w)}, commit "
            f"{RUNS['headline']}).")


def by_length(results) -> str:
    rows = run_rows(results, "by-length")
    shapes = sorted({p for p, _ in rows}, key=lambda p: (-rows[(p, "fp8dit")]["D"],
                                                         rows[(p, "fp8dit")]["S"]))
    body = []
    for p in shapes:
        f8 = _row(rows, p, "fp8dit", "by-length")
        auto = _row(rows, p, "fp8dit-auto", "by-length")
        cud = _row(rows, p, "sdpa-cudnn", "by-length")
        c8 = _row(rows, p, "cudnn-fp8", "by-length")
        body.append([_shape(f8), ms(cud["ms"]),
                     f"{ratio(f8['speedup_vs_cudnn'])} "
                     f"({KERNEL_NAMES.get(f8.get('kernel'), f8.get('kernel'))})",
                     ratio(auto["speedup_vs_cudnn"]) + (" (SDPA)" if _auto_ran_sdpa(auto)
                                                          else ""),
                     ratio(c8["speedup_vs_cudnn"])])
    return (_run_line(rows, "by-length") + "; batch 1, non-causal.\n\n"
            + _table(["heads x tokens, head dim", "cuDNN ms", "fp8dit", "`auto`",
                      "cuDNN FP8 end to end"], body))


def _forward_model(r: dict) -> str:
    res = r.get("resolution") or (f"{r['size']} px" if r.get("size") else "")
    if "layers" in r:
        blocks = f"{r['layers']} blocks"
    else:
        dual = r.get("dual_layers", 0)
        blocks = f"{dual + r.get('single_layers', 0)} blocks ({dual} dual-stream)"
    batch = f", batch {r['batch']}" if r.get("batch", 1) != 1 else ""
    return f"{r['model']} {res}, {blocks}, {r['tokens']:,} tokens{batch}"


def forward(results) -> str:
    body = []
    for model, commit, where, peer, peer_name in FORWARD_ROWS:
        rows = [r for r in results["forward"] if r.get("model") == model
                and r.get("commit") == commit and all(r.get(k) == v for k, v in where.items())]
        if not rows:
            raise ReportError(f"FORWARD_ROWS: no {model} row of commit {commit} {where} in "
                              "the forward results")
        by = {(r["mode"], r["backend"]): r for r in sorted(rows, key=lambda r: r["date"])}
        cells = []
        for mode, _ in MODES:
            a, b = by.get((mode, peer)), by.get((mode, "fp8dit"))
            if a is None or b is None or a.get("ms_median") is None \
                    or b.get("ms_median") is None:
                cells.append("")
                continue
            cells.append(f"{ms(a['ms_median'])} / {ms(b['ms_median'])}, "
                         f"**{ratio(a['ms_median'] / b['ms_median'])}**")
        if not any(cells):
            raise ReportError(f"FORWARD_ROWS: commit {commit} of {model} has no {peer} and "
                              "fp8dit rows of one mode")
        first = min(rows, key=lambda r: r["date"])
        body.append([_forward_model(first), peer_name, *cells,
                     f"{_day(first)}, {commit}"])
    header = ["model (diffusers, seeded random weights)", "peer",
              *[f"{label}: peer / fp8dit ms" for _, label in MODES], "H200 run"]
    return _table(header, body)


BLOCKS: dict[str, Callable[[dict], str]] = {
    "readme-speed": readme_speed,
    "readme-quality": readme_quality,
    "triton-fallback": triton_fallback,
    "speed": speed,
    "repeat": repeat,
    "kernels": kernels,
    "by-length": by_length,
    "forward": forward,
    "quality-by-preset": quality_by_preset,
    "h100-speed": partial(readme_speed, run="h100"),
    "h100-quality": h100_quality,
    "h100-headline": h100_headline,
}


# ---------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------


def blocks_in(text: str, where: str = "text") -> list[tuple[str, int, int]]:
    """(name, first line, end line) of each generated block: the content is
    ``lines[first:end]``, between its two marker lines."""
    lines = text.split("\n")
    out, open_ = [], None
    for i, line in enumerate(lines):
        m = BEGIN.match(line.strip())
        if m:
            if open_ is not None:
                raise ReportError(f"{where}:{i + 1}: block {m.group(1)!r} opens inside "
                                  f"block {open_[0]!r}")
            if m.group(1) not in BLOCKS:
                raise ReportError(f"{where}:{i + 1}: unknown block {m.group(1)!r} (known: "
                                  f"{', '.join(BLOCKS)})")
            open_ = (m.group(1), i + 1)
        elif line.strip() == END:
            if open_ is None:
                raise ReportError(f"{where}:{i + 1}: {END} without a block to close")
            out.append((open_[0], open_[1], i))
            open_ = None
    if open_ is not None:
        raise ReportError(f"{where}: block {open_[0]!r} is not closed with {END}")
    return out


def render(text: str, results, where: str = "text") -> str:
    """``text`` with every generated block's content made from ``results``."""
    lines = text.split("\n")
    made: dict[str, str] = {}
    for name, first, end in reversed(blocks_in(text, where)):
        if name not in made:
            made[name] = BLOCKS[name](results)
        lines[first:end] = made[name].split("\n")
    return "\n".join(lines)


def markdown_files(root: Path) -> list[Path]:
    root = Path(root)
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


# ---------------------------------------------------------------------------------------------
# The plot
# ---------------------------------------------------------------------------------------------

PLOT_SERIES = (("fp8dit", "fp8dit, FP8 forced"), ("fp8dit-auto", "fp8dit, auto (default)"),
               ("sdpa-cudnn", "SDPA cuDNN (bf16)"), ("cudnn-fp8", "cuDNN FP8 (per tensor)"),
               ("sageattn", "SageAttention"))


def plot_data(results) -> dict:
    """What docs/speed.png shows: the headline run's head-dim-128 presets (one per length: the
    one with most heads), TFLOPS and speed-up against SDPA cuDNN per backend."""
    rows = run_rows(results, "headline")
    by_len: dict[int, str] = {}
    for p in _presets(rows):
        r = _row(rows, p, "sdpa-cudnn", "headline")
        if r["D"] == 128 and (r["S"] not in by_len
                              or r["H"] > rows[(by_len[r["S"]], "sdpa-cudnn")]["H"]):
            by_len[r["S"]] = p
    presets = [by_len[s] for s in sorted(by_len)]
    series = {}
    for backend, _ in PLOT_SERIES:
        got = [_row(rows, p, backend, "headline") for p in presets]
        series[backend] = {"tflops": [round(r["tflops"], 1) for r in got],
                           "ratio": [round(r["speedup_vs_cudnn"], 3) for r in got]}
    first = next(iter(rows.values()))
    return {"commit": RUNS["headline"], "date": _day(first), "presets": presets,
            "tokens": [rows[(p, "fp8dit")]["S"] for p in presets],
            "heads": [rows[(p, "fp8dit")]["H"] for p in presets], "series": series}


def data_digest(data: dict) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def write_plot(results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = plot_data(results)
    x = data["tokens"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.6))
    styles = {"fp8dit": ("o-", 2.2), "fp8dit-auto": ("o:", 1.4), "sdpa-cudnn": ("s-", 1.6),
              "cudnn-fp8": ("^-", 1.6), "sageattn": ("d-", 1.6)}
    for backend, label in PLOT_SERIES:
        fmt, lw = styles[backend]
        ax1.plot(x, data["series"][backend]["tflops"], fmt, lw=lw, label=label)
        ax2.plot(x, data["series"][backend]["ratio"], fmt, lw=lw, label=label)
    for ax in (ax1, ax2):
        ax.set_xticks(x)
        ax.set_xticklabels([f"{n:,}\n{MODEL_LABELS[p].split(' ')[0]}" for n, p in
                            zip(x, data["presets"])], fontsize=7)
        ax.set_xlim(0, 1.05 * max(x))
        ax.set_xlabel("tokens (self-attention, head dim 128)")
        ax.grid(alpha=0.3)
    ax1.set_ylabel("TFLOPS (4*H*S^2*D / time)")
    ax2.set_ylabel("speed against SDPA cuDNN (bf16)")
    ax2.axhline(1.0, color="grey", lw=0.8)
    handles, labels = ax1.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.suptitle(f"Attention forward, bf16 in and out, one H200 ({data['date']}, commit "
                 f"{data['commit']})", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110, metadata={PLOT_KEY: data_digest(data), "Software": None})
    plt.close(fig)


def png_text(path: Path) -> dict[str, str]:
    """The tEXt chunks of a PNG file."""
    blob = Path(path).read_bytes()
    if blob[:8] != b"\x89PNG\r\n\x1a\n":
        raise ReportError(f"{path}: not a PNG file")
    out, i = {}, 8
    while i + 8 <= len(blob):
        (length,) = struct.unpack(">I", blob[i:i + 4])
        kind, data = blob[i + 4:i + 8], blob[i + 8:i + 8 + length]
        if kind == b"tEXt" and b"\0" in data:
            key, value = data.split(b"\0", 1)
            out[key.decode("latin-1")] = value.decode("latin-1")
        i += 12 + length
    return out


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def stale(root: Path, results=None) -> list[str]:
    """What differs from what the generator makes: unified diffs of Markdown files and a line
    for the plot. Empty when every block and the plot are current."""
    root = Path(root)
    results = load_results(root) if results is None else results
    problems = []
    for path in markdown_files(root):
        if not path.exists():
            continue
        text = path.read_text()
        rel = str(path.relative_to(root))
        made = render(text, results, rel)
        if made != text:
            problems.append("".join(difflib.unified_diff(
                text.splitlines(True), made.splitlines(True), rel, rel + " (generated)")))
    plot = root / PLOT
    want = data_digest(plot_data(results))
    if not plot.exists():
        problems.append(f"{PLOT}: missing (python -m fp8dit.tools.report draws it)")
    elif png_text(plot).get(PLOT_KEY) != want:
        problems.append(f"{PLOT}: drawn from other data (digest "
                        f"{png_text(plot).get(PLOT_KEY)!r}, the results give {want!r})")
    return problems


def _root(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    for candidate in (Path.cwd(), Path(__file__).resolve().parents[3]):
        if (candidate / "benchmarks" / "results").is_dir():
            return candidate
    raise ReportError("no benchmarks/results here: run from the repository root or pass --root")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fp8dit.tools.report",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 and show what differs")
    parser.add_argument("--root", help="repository root (default: the current directory)")
    args = parser.parse_args(argv)
    try:
        root = _root(args.root)
        results = load_results(root)
        if args.check:
            problems = stale(root, results)
            for p in problems:
                print(p, file=sys.stderr)
            return 1 if problems else 0
        for path in markdown_files(root):
            if path.exists():
                text = path.read_text()
                made = render(text, results, str(path.relative_to(root)))
                if made != text:
                    path.write_text(made)
                    print(f"wrote {path.relative_to(root)}")
        plot = root / PLOT
        if not plot.exists() or png_text(plot).get(PLOT_KEY) != data_digest(
                plot_data(results)):
            plot.parent.mkdir(parents=True, exist_ok=True)
            write_plot(results, plot)
            print(f"wrote {PLOT}")
    except ReportError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
