"""The figures of README.md and docs/*.md are the committed results, not figures typed by hand.

Every table made from ``benchmarks/results/*.json`` sits between ``<!-- report:NAME -->`` and
``<!-- /report -->`` and must be exactly what ``python -m fp8dit.tools.report`` makes from the
results; ``docs/speed.png`` must carry the digest of the rows it was drawn from. A figure edited
by hand, or results merged without the docs following, fails here; the fix is to run the
generator (and, for a new run, to name its commit in ``fp8dit.tools.report.RUNS``).
"""

import re
from pathlib import Path

import pytest

from fp8dit.tools import bench, report

ROOT = Path(__file__).resolve().parents[1]

# Generated blocks each file must keep (deleting a block would silently drop its check).
REQUIRED = {
    "README.md": {"readme-speed", "readme-quality", "triton-fallback", "h100-headline"},
    "docs/performance.md": {"speed", "repeat", "kernels", "by-length", "forward", "h100-speed"},
    "docs/accuracy.md": {"quality-by-preset", "h100-quality"},
}
# Files whose every table of speed figures must be generated (the others also hold hand-kept
# measurements that no results file has: fp64 errors, decisions' A/B timings).
GENERATED_ONLY = ("README.md", "docs/performance.md")
RATIO = re.compile(r"\d+\.\d\dx")
H100_FILE = "nvidia-h100-80gb-hbm3.json"
# The speed tables in README's columns: (file, block, run, the results file of its GPU).
SPEED_TABLES = (
    ("README.md", "readme-speed", "headline", "nvidia-h200.json"),
    ("docs/performance.md", "h100-speed", "h100", H100_FILE),
)
# Their peers' columns, by how the header begins.
PEER_COLUMNS = {"cuDNN FP8": "cudnn-fp8", "SageAttention": "sageattn"}
H100_BLOCKS = (("README.md", "h100-headline"), ("docs/performance.md", "h100-speed"),
               ("docs/accuracy.md", "h100-quality"))


@pytest.fixture(scope="module")
def results():
    return report.load_results(ROOT)


def _text(rel: str) -> str:
    return (ROOT / rel).read_text()


def _block(text: str, name: str) -> list[str]:
    lines = text.split("\n")
    for got, first, end in report.blocks_in(text):
        if got == name:
            return lines[first:end]
    raise AssertionError(f"no generated block {name!r}")


def test_every_generated_block_and_the_plot_are_what_the_results_give(results):
    problems = report.stale(ROOT, results)
    assert not problems, ("stale figures; run `python -m fp8dit.tools.report`:\n"
                          + "\n".join(problems))


@pytest.mark.parametrize("rel", sorted(REQUIRED))
def test_docs_keep_their_generated_tables(rel):
    names = {name for name, _, _ in report.blocks_in(_text(rel), rel)}
    assert REQUIRED[rel] <= names, f"{rel} lost generated blocks {REQUIRED[rel] - names}"


@pytest.mark.parametrize("rel", GENERATED_ONLY)
def test_no_speed_table_is_typed_by_hand(rel):
    text = _text(rel)
    inside = set()
    for _, first, end in report.blocks_in(text, rel):
        inside.update(range(first, end))
    for i, line in enumerate(text.split("\n")):
        if line.startswith("|") and i not in inside:
            assert not RATIO.search(line) and "TFLOPS" not in line, (
                f"{rel}:{i + 1}: a table row with speed figures outside a generated block: "
                f"{line!r}")


@pytest.mark.parametrize("rel,name", sorted((r, n) for r, ns in REQUIRED.items() for n in ns))
def test_an_edited_figure_is_caught(results, rel, name):
    """Change one digit inside the block, as a hand edit would: the generator's check sees it."""
    text = _text(rel)
    lines = text.split("\n")
    first, end = next((a, b) for n, a, b in report.blocks_in(text, rel) if n == name)
    # the block's last line with a figure: a table row, or its sentence (not a note under it)
    last = max(i for i in range(first, end) if re.search(r"\d", lines[i]))
    m = re.search(r"\d(?=[\d.,]*x)|\d", lines[last])  # a ratio's digit where there is one
    assert m, f"block {name!r} of {rel} ends without a figure"
    lines[last] = lines[last][:m.start()] + str((int(m.group(0)) + 1) % 10) + lines[last][m.end():]
    edited = "\n".join(lines)
    made = report.render(edited, results, rel)
    assert made != edited, "the check did not see a figure edited by hand"
    assert made == report.render(text, results, rel)  # and the generator puts it back


def _bench_run(results_file: str, run: str) -> list[dict]:
    """The rows of ``run`` read with ``fp8dit bench``'s loader: those of its commit in its GPU's
    file and, where ``RUN_SOURCES`` names one, of its date. One bench call (one date) on one
    card with one set of versions."""
    date = report.RUN_SOURCES.get(run, (None, None))[1]
    rows = [r for r in bench.load_results(ROOT / "benchmarks/results" / results_file)
            if r.get("commit") == report.RUNS[run] and date in (None, r.get("date"))]
    assert rows, f"RUNS[{run!r}] has no rows in {results_file}"
    for field in ("date", "gpu", "gpu_uuid", "torch", "triton", "cudnn"):
        assert len({r.get(field) for r in rows}) == 1, f"{run}: rows of several {field}s"
    return rows


@pytest.mark.parametrize("rel,name,run,results_file", SPEED_TABLES)
def test_each_speed_table_is_its_named_run(rel, name, run, results_file):
    """Independently of the generator's formatting code: every ratio of a speed table is the row
    of the run it names in its GPU's results file, read with ``fp8dit bench``'s loader and
    rounded as printed; the line above the table names that run's GPU, day, commit, versions."""
    rows = _bench_run(results_file, run)
    by = {(r["preset"], r["backend"]): r for r in rows}
    labels = {v: k for k, v in report.MODEL_LABELS.items()}
    block = _block(_text(rel), name)
    first = rows[0]
    assert block[0].startswith(f"One {first['gpu']}, {first['date'][:10]}, commit "
                               f"{report.RUNS[run]}: torch {first['torch']}, triton "
                               f"{first['triton']}, "), block[0]
    header, *body = [[c.strip() for c in ln.strip("|").split("|")] for ln in block
                     if ln.startswith("| ")]
    assert len(body) == len({p for p, _ in by}), f"one {name} row per preset of the run"
    peers = {col: b for col in header for start, b in PEER_COLUMNS.items()
             if col.startswith(start)}
    for cells in body:
        got = dict(zip(header, cells))
        label = cells[0]
        preset = labels[label.split(" (")[0]]

        def x(backend, preset=preset):
            return f"{by[(preset, backend)]['speedup_vs_cudnn']:.2f}x"

        assert got["vs cuDNN"].strip("*") == x("fp8dit"), label
        assert got["`auto`"].split(" ")[0] == x("fp8dit-auto"), label
        assert got["kernel alone"] == x("fp8dit-kernel"), label
        for col, backend in peers.items():
            assert got[col] == x(backend), (label, col)
        assert f"{by[(preset, 'fp8dit')]['tflops']:,.0f} TFLOPS" in got["fp8dit"], label
    for backend in set(PEER_COLUMNS.values()) - set(peers.values()):  # a peer left out ran nowhere
        assert all(r.get("ms") is None for r in rows if r["backend"] == backend), backend


@pytest.mark.parametrize("rel,name", H100_BLOCKS)
def test_the_h100_blocks_are_the_h100_run_alone(rel, name):
    """The H100's figures stay apart from the H200's: each H100 block names the H100 run's
    commit and no commit of a run or forward benchmark measured on the H200."""
    text = "\n".join(_block(_text(rel), name))
    h100 = {c for run, c in report.RUNS.items() if run in report.RUN_SOURCES}
    h200 = ({c for run, c in report.RUNS.items() if run not in report.RUN_SOURCES}
            | {commit for _, commit, *_ in report.FORWARD_ROWS})
    (commit,) = h100
    assert commit not in h200
    assert "H100 80GB HBM3" in text and commit in text and "H200" not in text
    assert not [c for c in h200 if c in text], f"{name} names an H200 run"


def test_the_h100_quality_spans_the_h100_rows():
    """The fp8dit row of the H100's quality table is the span over the H100 run's rows."""
    rows = _bench_run(H100_FILE, "h100")
    line = next(ln for ln in _block(_text("docs/accuracy.md"), "h100-quality")
                if ln.startswith("| fp8dit"))
    for key, fmt in (("cos_vs_ref", ".5f"), ("rel_l1_vs_ref", ".4f")):
        got = [r[key] for r in rows if r["backend"] == "fp8dit"]
        assert f"| {min(got):{fmt}}-{max(got):{fmt}} |" in line, (key, line)


def test_every_named_run_is_in_the_results(results):
    for run, commit in report.RUNS.items():
        assert report.run_rows(results, run), f"RUNS[{run!r}] = {commit} has no rows"


def test_the_plot_carries_the_digest_of_its_data(results):
    digest = report.png_text(ROOT / report.PLOT).get(report.PLOT_KEY)
    assert digest == report.data_digest(report.plot_data(results))


@pytest.mark.parametrize("text,error", [
    ("<!-- report:no-such-block -->\n<!-- /report -->", "unknown block"),
    ("<!-- report:speed -->\n| a |", "not closed"),
    ("<!-- /report -->", "without a block"),
    ("<!-- report:speed -->\n<!-- report:forward -->\n<!-- /report -->", "opens inside"),
])
def test_malformed_markers_are_errors(text, error):
    with pytest.raises(report.ReportError, match=error):
        report.blocks_in(text)


def test_a_run_without_rows_is_an_error(results, monkeypatch):
    monkeypatch.setitem(report.RUNS, "headline", "0000000")
    with pytest.raises(report.ReportError, match="no row of commit 0000000"):
        report.readme_speed(results)
