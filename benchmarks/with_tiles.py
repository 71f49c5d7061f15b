"""Run a benchmark with tile overrides, without editing ``launch.py``.

    python3 benchmarks/with_tiles.py --tiles "128:sm90_rowsum_dot=true;64:sm90_p_regs=true" \
        -m fp8dit bench --preset all
    python3 benchmarks/with_tiles.py --tiles "..." benchmarks/bench_wan_forward.py --layers 2

``--tiles``: ``dp:key=value,...`` per padded head dim, ``;``-separated (values true/false or
integers), put into ``launch.TILE_OVERRIDES`` (applied on top of the defaults of every call at
that head dim); empty: the defaults. For one device call that checks a candidate default
and then runs the standard benchmarks with it (commit a48bd80's ``gate_rowsum.py`` did).
"""

from __future__ import annotations

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(__file__))
from gpu_variants import parse_overrides  # noqa: E402

from fp8dit import launch  # noqa: E402


def parse_tiles(text: str) -> dict[int, dict]:
    out = {}
    for part in filter(None, text.split(";")):
        dp, _, items = part.partition(":")
        out[int(dp)] = parse_overrides(items)
    return out


def main() -> None:
    argv = sys.argv[1:]
    if len(argv) < 3 or argv[0] != "--tiles":
        raise SystemExit("usage: with_tiles.py --tiles SPEC (-m MODULE | SCRIPT) [ARGS...]")
    launch.TILE_OVERRIDES.update(parse_tiles(argv[1]))
    print(f"with_tiles: TILE_OVERRIDES={launch.TILE_OVERRIDES}", file=sys.stderr, flush=True)
    rest = argv[2:]
    if rest[0] == "-m":
        sys.argv = [rest[1], *rest[2:]]
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = rest
        runpy.run_path(rest[0], run_name="__main__")


if __name__ == "__main__":
    main()
