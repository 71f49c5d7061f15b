"""Wan2.2-A14B transformer forward on 2 GPUs: fp8dit under diffusers' Ulysses and ring attention.

Run with one process per GPU::

    torchrun --nproc-per-node 2 benchmarks/bench_context_parallel.py --layers 2

diffusers' ``WanTransformer3DModel`` at the A14B width (40 heads x 128, ffn 13824, text 4096;
``fp8dit.tools.demo.PRESETS``) with ``--layers`` blocks and seeded random weights, on 720p 81-frame
latents (75,600 tokens) or 480p. Every rank builds the same model and gets rank 0's inputs. Rows:

* ``single``: each GPU runs the whole forward alone (no collectives): fp8dit, and bf16 through
  diffusers' ``_native_cudnn`` backend (cuDNN SDPA), the accuracy reference;
* ``ulysses`` / ``ring``: ``model.enable_parallelism(config=ContextParallelConfig(
  ulysses_degree=2))`` or ``(ring_degree=2)`` on a fresh copy, fp8dit (and bf16 cuDNN for
  comparison); each rank computes half the tokens, diffusers gathers the output on every rank.

Each row: median and min of ``--repeats`` CUDA-event-timed forwards after ``--warmup`` untimed
ones, all ranks released together by a barrier before each; a context-parallel row's time is the
slower rank's. Accuracy on rank 0's gathered output: cosine and rel-L1 against the single-GPU
fp8dit and bf16 forwards (an fp8dit row is ``accuracy_ok`` at cosines of at least 0.999 and
0.995, every rank's output the same and every attention call on FP8: a silent SDPA fallback
shows); speed-up against the single-GPU forward of the same backend measured in this run. Rows
are merged into ``benchmarks/results/<gpu>-context-parallel.json`` with the GPU, driver,
software versions, commit and date; a table is printed last. Exit status 1 when a row failed,
produced NaN or is not ``accuracy_ok``.

NCCL's NVLink multicast (NVLS) and symmetric-memory multicast stay off: the script sets
``NCCL_NVLS_ENABLE=0`` and ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` unless they are set.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import sys
import time
import traceback
from pathlib import Path

import torch
from bench_forward import (  # same directory as this script
    cell,
    error_text,
    print_table,
    time_ms,
    wan_inputs,
)

RESULTS = Path(__file__).resolve().parent / "results"
WORLD = 2
MIN_COS_VS_SINGLE_FP8DIT = 0.999
MIN_COS_VS_BF16 = 0.995
BACKENDS = {"fp8dit": "fp8dit", "bf16": "_native_cudnn"}  # row name -> diffusers backend
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
COMMAND = "torchrun --nproc-per-node 2 benchmarks/bench_context_parallel.py"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolution", choices=("720p", "480p"), default="720p")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks (A14B has 40)")
    p.add_argument("--repeats", type=int, default=5, help="timed forwards per row")
    p.add_argument("--warmup", type=int, default=2, help="untimed forwards before timing")
    p.add_argument("--modes", default="ulysses,ring",
                   help="context-parallel modes, comma-separated (default ulysses,ring)")
    p.add_argument("--no-bf16-cp", action="store_true",
                   help="skip the bf16 cuDNN context-parallel rows (the single-GPU bf16 row "
                        "stays: it is the accuracy reference)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None,
                   help="JSON file (default results/<gpu>-context-parallel.json)")
    args = p.parse_args(argv)
    for name in ("layers", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name}: expected an integer of at least 1, got {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup: expected an integer of at least 0, got {args.warmup}")
    args.modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in args.modes if m not in ("ulysses", "ring")]
    if bad or not args.modes:
        p.error(f"--modes: expected a comma-separated subset of ulysses,ring, "
                f"got {bad or '(none)'}")
    return args


def _say(msg: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(msg, flush=True)


def _warning_once_shim() -> None:
    # diffusers 0.42's context-parallel hook calls logger.warning_once when an input is not split
    # (Wan's 1-D timestep); that method exists only once transformers is imported.
    import diffusers.hooks.context_parallel as hooks

    if not hasattr(hooks.logger, "warning_once"):
        hooks.logger.warning_once = functools.lru_cache(None)(hooks.logger.warning)


def _ranks_together() -> None:
    """Ranks start each timed forward together."""
    import torch.distributed as dist

    dist.barrier()
    torch.cuda.synchronize()


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        _say("bench_context_parallel: needs CUDA GPUs; torch sees none (nothing measured)")
        return 2
    if os.environ.get("WORLD_SIZE") != str(WORLD) or "LOCAL_RANK" not in os.environ:
        _say(f"bench_context_parallel: run {WORLD} processes with torchrun: {COMMAND} "
             f"(WORLD_SIZE={os.environ.get('WORLD_SIZE')})")
        return 2
    if torch.cuda.device_count() < WORLD:
        _say(f"bench_context_parallel: needs {WORLD} GPUs, torch sees "
             f"{torch.cuda.device_count()}")
        return 2
    for name, value in MULTICAST_OFF.items():  # before NCCL's first communicator
        os.environ.setdefault(name, value)

    import torch.distributed as dist

    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(minutes=5))
    try:
        return run(args, device)
    finally:
        dist.destroy_process_group()


def _nccl_version() -> str:
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def _build(preset, args, device, backend, mode):
    """The model with rank 0's weights, on ``backend``, context-parallel unless ``single``."""
    import torch.distributed as dist
    from diffusers import ContextParallelConfig

    from fp8dit.tools.demo import build_model

    model = build_model(preset, args.layers, args.seed, device)
    for t in list(model.parameters()) + list(model.buffers()):
        dist.broadcast(t.data, src=0)  # seeded init agrees anyway; this makes sure
    model.set_attention_backend(backend)
    if mode != "single":
        model.enable_parallelism(config=ContextParallelConfig(**{f"{mode}_degree": WORLD}))
    return model


def run(args, device) -> int:
    import diffusers
    import torch.distributed as dist
    import triton

    import fp8dit
    from fp8dit.integrations import diffusers as fd
    from fp8dit.testing import error_stats
    from fp8dit.tools.bench import run_metadata
    from fp8dit.tools.demo import PRESETS

    _warning_once_shim()
    fd.register()
    rank = dist.get_rank()
    preset = PRESETS[f"wan2.2-a14b-{args.resolution}"]
    cfg = preset["config"]
    frames, height, width = preset["latent"]
    tokens = frames * (height // 2) * (width // 2)
    gpu = torch.cuda.get_device_name(device)
    _say(f"{WORLD} x {gpu}: Wan2.2-A14B transformer, {args.layers} blocks, {args.resolution} "
         f"({tokens} tokens), bf16; torch {torch.__version__}, triton {triton.__version__}, "
         f"diffusers {diffusers.__version__}, fp8dit {fp8dit.__version__}, NCCL "
         f"{_nccl_version()}; " + " ".join(f"{k}={os.environ[k]}" for k in MULTICAST_OFF))

    inputs = wan_inputs(preset, args.seed + 1, device)
    for t in inputs.values():  # every rank gets rank 0's inputs
        dist.broadcast(t, src=0)

    common = dict(
        run_metadata(device), world_size=WORLD, diffusers=diffusers.__version__,
        nccl=_nccl_version(), model="Wan2.2-A14B", layers=args.layers,
        resolution=args.resolution, tokens=tokens,
        heads=cfg["num_attention_heads"], head_dim=cfg["attention_head_dim"],
        repeats=args.repeats, warmup=args.warmup,
        **{k.lower(): os.environ[k] for k in MULTICAST_OFF},
    )
    # The single-GPU rows come first: they are the references of the others.
    plan = [("single", "bf16"), ("single", "fp8dit")]
    for mode in args.modes:
        plan += [(mode, "fp8dit")] + ([] if args.no_bf16_cp else [(mode, "bf16")])

    rows, refs = [], {}
    with torch.no_grad():
        for mode, name in plan:
            row = dict(common, mode=mode, backend=name, diffusers_backend=BACKENDS[name])
            model = call = out = None
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            dist.barrier()
            t0 = time.perf_counter()
            try:
                model = _build(preset, args, device, BACKENDS[name], mode)

                def call(model=model):
                    return model(**inputs, return_dict=False)[0]

                with fd.record_calls() as calls:
                    out = call()  # first forward: Triton compiles, plans are cached
                torch.cuda.synchronize()
                row["setup_s"] = round(time.perf_counter() - t0, 2)
                if name == "fp8dit":
                    row["attention_calls"] = {b: sum(c["backend"] == b for c in calls)
                                              for b in sorted({c["backend"] for c in calls})}
                median, low = time_ms(call, args.warmup, args.repeats, _ranks_together)
                agree = True
                if mode != "single":  # diffusers gathered the output on every rank
                    other = out.clone()
                    dist.broadcast(other, src=0)
                    agree = bool(torch.equal(other, out))
            except Exception as e:  # a failed row is a result, not a crash
                row["error"] = error_text(e)
                traceback.print_exc()
                rows.append(row)
                _say(f"  {mode:8s} {name:7s} FAILED: {row['error']}")
                model = call = out = None
                continue
            # A context-parallel step takes as long as its slower rank; a single row ran on each
            # GPU alone (at the same time), reported the same way.
            per_rank = [None] * WORLD
            peak = torch.cuda.max_memory_allocated(device)
            dist.all_gather_object(per_rank, (median, low, peak, agree))
            row["ms_median_per_rank"] = [round(m[0], 2) for m in per_rank]
            row["ms_median"] = max(m[0] for m in per_rank)
            row["ms_min"] = max(m[1] for m in per_rank)
            row["peak_mem_gib"] = round(max(m[2] for m in per_rank) / 2**30, 2)
            if mode != "single":
                row["ranks_agree"] = all(m[3] for m in per_rank)
            for ref_name, key in (("fp8dit", "single_fp8dit"), ("bf16", "bf16")):
                if ref_name in refs:
                    stats = error_stats(out, refs[ref_name])
                    row[f"cos_vs_{key}"] = stats.cos
                    row[f"rel_l1_vs_{key}"] = stats.rel_l1
                    row["nan"] = row.get("nan", False) or stats.nan
            if mode == "single":
                refs[name] = out.detach().clone()
            rows.append(row)
            _say(f"  {mode:8s} {name:7s} {row['ms_median']:9.1f} ms  "
                 f"cos vs bf16 {row.get('cos_vs_bf16', float('nan')):.6f}  "
                 f"peak {row['peak_mem_gib']} GiB  calls {row.get('attention_calls', '-')}")
            model = call = out = None

    by_key = {(r["mode"], r["backend"]): r for r in rows}
    for r in rows:
        if r["mode"] == "single" or "error" in r:
            continue
        single = by_key.get(("single", r["backend"]))
        if single and "ms_median" in single:
            r["speedup_vs_single"] = round(single["ms_median"] / r["ms_median"], 3)
        if r["backend"] == "fp8dit":
            r["accuracy_ok"] = bool(
                not r.get("nan") and r.get("ranks_agree")
                and r.get("cos_vs_single_fp8dit", 0) >= MIN_COS_VS_SINGLE_FP8DIT
                and r.get("cos_vs_bf16", 0) >= MIN_COS_VS_BF16
                and set(r.get("attention_calls", {})) == {"fp8"})
    if rank == 0:
        _write(rows, gpu, args.out)
        _table(rows)
    failed = any("error" in r or r.get("nan") or r.get("accuracy_ok") is False for r in rows)
    return 1 if failed else 0


def _write(rows, gpu, out):
    from fp8dit.tools.bench import gpu_slug, save_results

    out_path = Path(out) if out else RESULTS / f"{gpu_slug(gpu)}-context-parallel.json"
    total = save_results(out_path, rows)
    print(f"\nwrote {len(rows)} rows to {out_path} ({total} in the file)")


def _table(rows):
    status = {True: "accuracy ok", False: "ACCURACY MISSED"}
    print_table(rows, [
        ("mode", 8, cell("mode")), ("backend", 8, cell("backend")),
        ("median ms", 10, cell("ms_median", ".1f")), ("min ms", 9, cell("ms_min", ".1f")),
        ("speed-up", 9, cell("speedup_vs_single", ".2f", "x")),
        ("cos vs 1-GPU fp8dit", 20, cell("cos_vs_single_fp8dit", ".6f")),
        ("cos vs bf16", 12, cell("cos_vs_bf16", ".6f")),
        ("peak GiB", 9, cell("peak_mem_gib", ".2f")),
        ("  status", 0, lambda r: "  " + status.get(r.get("accuracy_ok"), ""))])

if __name__ == "__main__":
    sys.exit(main())
