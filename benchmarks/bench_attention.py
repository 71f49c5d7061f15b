#!/usr/bin/env python3
"""Attention forward benchmark: fp8dit against SDPA cuDNN / flash and SageAttention.

The engine is :mod:`fp8dit.tools.bench` (also ``fp8dit bench``); this script runs it on its
own, from a checkout without installing (``src/`` is put on the path when fp8dit is not importable).

    python benchmarks/bench_attention.py --preset all            # every preset, one process
    python benchmarks/bench_attention.py --preset flux-1024 --backends fp8dit,sdpa-cudnn
    python benchmarks/bench_attention.py --smoke                 # no GPU: CPU interpreter run

Results are merged into benchmarks/results/<gpu-name>.json; the table is printed last.
"""

import sys
from pathlib import Path

try:
    import fp8dit  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from fp8dit.tools.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
