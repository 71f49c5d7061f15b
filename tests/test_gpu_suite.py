"""benchmarks/gpu_suite.sh's totals: what it reports as passed is what pytest said passed.

The GPU suite is the proof that the library works on a GPU machine, so its summary must fail
whenever a file failed, however the file's log ends.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

FILES = {
    # a message after pytest's totals (triton 3.9's nanobind prints leaked objects at exit)
    "test_ok_then_message.py": """
import atexit, sys
atexit.register(lambda: print("nanobind: leaked 3 instances!", file=sys.stderr))
def test_one():
    pass
""",
    "test_fails.py": "def test_one():\n    assert 1 == 2\n",
    # a process that dies without a pytest summary
    "test_dies.py": "import os\ndef test_one():\n    os._exit(3)\n",
}


def _suite(tmp_path: Path, names: list[str]) -> tuple[int, str]:
    for name in names:
        (tmp_path / name).write_text(FILES[name])
    env = dict(os.environ, FILES=" ".join(str(tmp_path / n) for n in names), JOBS="2",
               LIMIT="120", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    out = subprocess.run(["bash", str(REPO / "benchmarks/gpu_suite.sh"), str(tmp_path / "out")],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    return out.returncode, out.stdout


@pytest.mark.skipif(sys.platform == "win32", reason="gpu_suite.sh is a bash script")
def test_passes_count_past_a_message_after_the_totals(tmp_path):
    rc, out = _suite(tmp_path, ["test_ok_then_message.py"])
    assert rc == 0, out
    assert "total: 1 passed, 0 failed" in out, out


@pytest.mark.skipif(sys.platform == "win32", reason="gpu_suite.sh is a bash script")
def test_a_failed_or_dead_file_fails_the_suite(tmp_path):
    rc, out = _suite(tmp_path, ["test_ok_then_message.py", "test_fails.py", "test_dies.py"])
    assert rc == 1, out
    assert "total: 1 passed, 1 failed" in out, out
    assert "test_dies rc=3" in out and "no pytest summary" in out, out
    failed = next(ln for ln in out.splitlines() if ln.startswith("failed files"))
    assert "test_fails" in failed and "test_dies" in failed, out
