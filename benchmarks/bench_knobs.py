"""`fp8dit bench` with some of ``fp8dit.quant``'s knobs set otherwise, to see what a knob not
yet on by default does end to end, against cuDNN in the same process, before turning it on.

    python3 benchmarks/bench_knobs.py --set KV_STATS_FULL_FAST=1 --set Q_QUANT_ITERS=128:4 \
        -- --preset wan-480p --out-json $OUT/knobs.json

Everything after ``--`` goes to ``fp8dit bench``. Its rows are not written to the committed
results file (``--out-json`` is required): they are not the library's defaults. Values: ``0`` /
``1`` for flags, ``D:N[,D:N]`` for the per-head-dim dicts, integers otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys

from fp8dit import bench, quant


def parse_knob(text: str) -> tuple[str, object]:
    name, sep, value = text.partition("=")
    if not sep or not hasattr(quant, name) or not name.isupper():
        raise SystemExit(f"--set: expected NAME=VALUE with NAME one of fp8dit.quant's knobs, "
                         f"got {text!r}")
    current = getattr(quant, name)
    if isinstance(current, bool):
        return name, value not in ("0", "false", "False", "")
    if isinstance(current, dict):
        return name, {int(d): int(n) for d, n in (p.split(":") for p in value.split(","))}
    return name, int(value)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    a = ap.parse_args(ours)
    if "--out-json" not in rest and "--no-save" not in rest:
        raise SystemExit("bench_knobs.py: pass --out-json PATH (or --no-save) after --: these "
                         "rows are not the defaults and do not go to the committed results")
    knobs = dict(parse_knob(t) for t in a.set)
    for name, value in knobs.items():
        current = getattr(quant, name)
        if isinstance(current, dict):
            current.update(value)
        else:
            setattr(quant, name, value)
    print(json.dumps({"fp8dit.quant knobs set": {k: str(v) for k, v in knobs.items()}}))
    return bench.main(rest)


if __name__ == "__main__":
    raise SystemExit(main())
