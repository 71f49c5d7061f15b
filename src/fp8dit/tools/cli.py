"""``fp8dit demo | bench | check | warmup``.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args)``;
modules are imported only when their subcommand runs (diffusers and matplotlib stay optional).
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = {
    "demo": ("fp8dit.tools.demo",
             "denoise with a small Wan transformer, bf16 vs fp8dit, side by side"),
    "bench": ("fp8dit.tools.bench", "time fp8dit against SDPA cuDNN/flash and SageAttention"),
    "check": ("fp8dit.tools.check",
              "accuracy of each recipe against fp64 on chosen input families"),
    "warmup": ("fp8dit.tools.warmup",
               "compile the kernels and plans of given shapes before the first step"),
}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors on stderr (``fp8dit demo: error: argument --steps: ...``,
    exit 2), the form of the subcommands' own errors; the usage is in ``--help``."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    # Subparsers are built with the parent's class, so they get the one-line errors too.
    parser = _Parser(prog="fp8dit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name, (module, help_) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        try:
            importlib.import_module(module).add_arguments(p)
        except ImportError as e:  # one broken subcommand must not take the others down
            p.set_defaults(_import_error=f"fp8dit {name}: cannot import {module}: {e}")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "_import_error", None):
        print(args._import_error, file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
