"""``fp8dit warmup``: compile the kernels and build the plans of given shapes now, so that the
first denoising step does not pay for them (:func:`fp8dit.warmup`).

    fp8dit warmup --preset wan2.2-a14b-720p --rotary wan
    fp8dit warmup --shape 1,24,118800,128 --rotary apply_rotary_emb --layout NHD

In the process that will run the model, call :func:`fp8dit.warmup` instead: the compiled kernels
and plans stay in memory. This command fills Triton's on-disk cache (``TRITON_CACHE_DIR``) for
later processes on the same machine, Triton release and GPU.
"""

from __future__ import annotations

import argparse
import sys

DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from fp8dit.rope import STYLES
    from fp8dit.tools.presets import GROUPS, PRESETS

    p.add_argument("--preset", action="append", metavar="NAME",
                   help="preset shape (repeatable or comma-separated): " + ", ".join(PRESETS)
                        + f"; or a group: {', '.join(GROUPS)}")
    p.add_argument("--shape", action="append", metavar="B,H,S,D",
                   help="custom shape, e.g. 1,24,4608,128 (repeatable)")
    p.add_argument("--layout", default="NHD", choices=("NHD", "HND"),
                   help="the calls' tensor layout (default NHD, diffusers')")
    p.add_argument("--dtype", default="bf16", choices=tuple(DTYPES))
    p.add_argument("--rotary", choices=STYLES,
                   help="the rotary tables' style the calls pass (fp8dit.enable passes Wan's, "
                        "HunyuanVideo's and CogVideoX's); default none")
    p.add_argument("--recipe", help="fp8dit recipe (default FP8DIT_RECIPE or the library's)")
    p.add_argument("--causal", action="store_true", help="causal calls")


def run(args: argparse.Namespace) -> int:
    import torch

    import fp8dit
    from fp8dit.tools.presets import PRESETS, ShapeError, resolve_shapes

    try:
        shapes = resolve_shapes(args.preset, args.shape)
    except ShapeError as e:
        print(f"fp8dit warmup: error: {e}", file=sys.stderr)
        return 2
    if not shapes:
        print("fp8dit warmup: error: give at least one --preset or --shape", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("fp8dit warmup: no CUDA GPU: the kernels would run through Triton's interpreter, "
              "where nothing is compiled", file=sys.stderr)
    names = {(s.B, s.H, s.S, s.D): s.name for s in shapes if s.name in PRESETS}

    def show(r):
        print(f"{names[r.shape]}: {r}" if r.shape in names else str(r), flush=True)

    try:
        fp8dit.warmup([(s.B, s.H, s.S, s.D) for s in shapes], layout=args.layout,
                      dtype=getattr(torch, DTYPES[args.dtype]), rotary=args.rotary,
                      recipe=args.recipe, is_causal=args.causal, progress=show)
    except (ValueError, TypeError) as e:
        print(f"fp8dit warmup: error: {e}", file=sys.stderr)
        return 2
    return 0
