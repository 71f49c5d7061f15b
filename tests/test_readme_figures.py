"""The README's speed tables are the committed bench rows, not figures typed by hand.

The Speed section names the `fp8dit bench --preset all` run it shows by commit; every ratio in
its table and in the at-a-glance table must be that run's row in
``benchmarks/results/nvidia-h200.json``, rounded as printed. A table edited without a run, or a
run merged without the README following, fails here.
"""

import re
from pathlib import Path

import pytest

from fp8dit.tools import bench

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

# README row label (its start) -> preset
PRESETS = {
    "Wan2.2-A14B 720p": "wan2.2-a14b-720p",
    "Wan 480p": "wan-480p",
    "Wan2.1-1.3B 480p": "wan2.1-1.3b-480p",
    "HunyuanVideo 720p": "hunyuanvideo-720p",
    "CogVideoX-5B": "cogvideox-5b",
    "Flux 1024": "flux-1024",
}
RATIO = re.compile(r"(\d+\.\d\d)x")


def _section(title: str) -> str:
    start = README.index(title)
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


def _table(text: str) -> list[list[str]]:
    """Body rows of the first markdown table in ``text``, as lists of cells."""
    lines, started = [], False
    for ln in text.splitlines():
        if ln.startswith("|"):
            lines.append(ln)
            started = True
        elif started:
            break
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]


def _preset(label: str) -> str:
    for start, name in PRESETS.items():
        if label.startswith(start):
            return name
    raise AssertionError(f"README row {label!r} names no known preset")


def _ratio(cell: str) -> str:
    m = RATIO.search(cell)
    assert m, f"no ratio in README cell {cell!r}"
    return m.group(1)


@pytest.fixture(scope="module")
def run_rows() -> dict[tuple[str, str], dict]:
    speed = _section("## Speed on an H200")
    m = re.search(r"One `fp8dit bench --preset all` run \([^)]*?commit ([0-9a-f]{7,})", speed)
    assert m, "the Speed section must name the bench run's commit"
    rows = [r for r in bench.load_results(ROOT / "benchmarks/results/nvidia-h200.json")
            if r.get("commit") == m.group(1)]
    assert rows, f"no committed rows of commit {m.group(1)}"
    assert len({r["date"] for r in rows}) == 1, "one run per commit expected"
    return {(r["preset"], r["backend"]): r for r in rows}


def _speedup(rows, preset, backend) -> str:
    return f"{rows[(preset, backend)]['speedup_vs_cudnn']:.2f}"


def test_speed_table_is_the_named_run(run_rows):
    table = _table(_section("## Speed on an H200"))
    assert len(table) == len(PRESETS)
    for cells in table:
        p = _preset(cells[0])
        (fp8, auto, kernel, cud8, flash, sage) = (cells[i] for i in (3, 4, 5, 7, 8, 9))
        assert _ratio(fp8) == _speedup(run_rows, p, "fp8dit"), cells[0]
        assert _ratio(auto) == _speedup(run_rows, p, "fp8dit-auto"), cells[0]
        assert _ratio(kernel) == _speedup(run_rows, p, "fp8dit-kernel"), cells[0]
        e2e, k = RATIO.findall(cud8)
        assert (e2e, k) == (_speedup(run_rows, p, "cudnn-fp8"),
                            _speedup(run_rows, p, "cudnn-fp8-kernel")), cells[0]
        assert _ratio(flash) == _speedup(run_rows, p, "sdpa-flash"), cells[0]
        assert _ratio(sage) == _speedup(run_rows, p, "sageattn"), cells[0]
        assert f"{run_rows[(p, 'fp8dit')]['tflops']:.0f}" == cells[2], cells[0]


def test_at_a_glance_table_is_the_named_run(run_rows):
    table = _table(_section("## At a glance"))
    assert len(table) >= 4
    for label, fp8, cud8, sage in table:
        p = _preset(label)
        # where `auto` runs SDPA the cell says so and shows auto's ratio
        backend = "fp8dit-auto" if "`auto`" in fp8 else "fp8dit"
        assert _ratio(fp8) == _speedup(run_rows, p, backend), label
        if "kernel alone" in fp8:
            assert RATIO.findall(fp8)[1] == _speedup(run_rows, p, "fp8dit-kernel"), label
        assert _ratio(cud8) == _speedup(run_rows, p, "cudnn-fp8"), label
        assert _ratio(sage) == _speedup(run_rows, p, "sageattn"), label
