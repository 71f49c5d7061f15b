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
    "README.md": {"readme-speed", "readme-quality", "triton-fallback"},
    "docs/performance.md": {"speed", "repeat", "kernels", "by-length", "forward"},
    "docs/accuracy.md": {"quality-by-preset"},
}
# Files whose every table of speed figures must be generated (the others also hold hand-kept
# measurements that no results file has: fp64 errors, decisions' A/B timings).
GENERATED_ONLY = ("README.md", "docs/performance.md")
RATIO = re.compile(r"\d+\.\d\dx")


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
    last = end - 1  # the block's last line: a table row, or its sentence
    m = re.search(r"\d(?=[\d.,]*x)|\d", lines[last])  # a ratio's digit where there is one
    assert m, f"block {name!r} of {rel} ends without a figure"
    lines[last] = lines[last][:m.start()] + str((int(m.group(0)) + 1) % 10) + lines[last][m.end():]
    edited = "\n".join(lines)
    made = report.render(edited, results, rel)
    assert made != edited, "the check did not see a figure edited by hand"
    assert made == report.render(text, results, rel)  # and the generator puts it back


def test_the_readme_speed_table_is_the_named_run():
    """Independently of the generator's formatting code: every ratio of the README's speed table
    is the row of the run ``RUNS["headline"]`` names, read with ``fp8dit bench``'s loader and
    rounded as printed; the run is one run (one date)."""
    rows = [r for r in bench.load_results(ROOT / "benchmarks/results/nvidia-h200.json")
            if r.get("commit") == report.RUNS["headline"]]
    assert rows and len({r["date"] for r in rows}) == 1, "the headline must be one bench run"
    by = {(r["preset"], r["backend"]): r for r in rows}
    labels = {v: k for k, v in report.MODEL_LABELS.items()}
    table = [ln for ln in _block(_text("README.md"), "readme-speed") if ln.startswith("| ")]
    body = [[c.strip() for c in ln.strip("|").split("|")] for ln in table[1:]]
    assert len(body) == len({p for p, _ in by}), "one README row per preset of the run"
    for label, f8, vs, auto, kernel, cud8, sage in body:
        preset = labels[label.split(" (")[0]]

        def x(backend, preset=preset):
            return f"{by[(preset, backend)]['speedup_vs_cudnn']:.2f}x"

        assert vs.strip("*") == x("fp8dit"), label
        assert auto.split(" ")[0] == x("fp8dit-auto"), label
        assert kernel == x("fp8dit-kernel"), label
        assert cud8 == x("cudnn-fp8"), label
        assert sage == x("sageattn"), label
        assert f"{by[(preset, 'fp8dit')]['tflops']:,.0f} TFLOPS" in f8, label


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
