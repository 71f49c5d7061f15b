"""The loop the compile tools share: every launch recorded by tests/tools/launches.py, compiled
for one GPU target and described as one JSON line, a failed compile reported as data."""

from __future__ import annotations

import json
import os
from collections.abc import Callable


def compile_each(path: str, header: Callable[[dict], dict],
                 describe: Callable[[dict], dict]) -> int:
    """For each launch in the JSON file ``path``: ``header(launch)`` names it, ``describe(launch)``
    compiles it and returns what the code holds; prints one JSON line per launch (``ok``, and
    ``error`` where the compile raised) and returns 1 if any launch failed, else 0. Compiled, not
    interpreted, kernels: run without TRITON_INTERPRET."""
    assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "run without TRITON_INTERPRET"
    with open(path) as f:
        launches = json.load(f)
    status = 0
    for rec in launches:
        out = header(rec)
        try:
            out.update(ok=True, **describe(rec))
        except Exception as e:  # noqa: BLE001 - reported to the test
            out.update(ok=False, error=f"{type(e).__name__}: {str(e)[:2000]}")
            status = 1
        print(json.dumps(out), flush=True)
    return status
