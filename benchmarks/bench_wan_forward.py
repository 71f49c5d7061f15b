"""End-to-end Wan2.2-A14B transformer forward: torch SDPA (cuDNN forced) vs fp8dit, bf16.

diffusers' ``WanTransformer3DModel`` at the A14B width (40 heads x 128, ffn 13824, text 4096)
with ``--layers`` blocks and seeded random weights, on 720p 81-frame latents (16x21x90x160 ->
75,600 tokens) or 480p. The baseline is diffusers' ``native`` backend (it calls
``F.scaled_dot_product_attention`` on permuted [B, H, S, D] views) inside
``sdpa_kernel(SDPBackend.CUDNN_ATTENTION)``; fp8dit is ``fp8dit.enable(model)`` on a second
model with the same weights. Each row: median and min of ``--repeats`` CUDA-event-timed
forwards after ``--warmup`` untimed ones, the two backends called in turn (A B, B A, ...: the
GPU runs at its power cap and its clock drifts as it warms; one forward is far longer than
any cache, so inputs are not rotated), peak memory, and the output's cosine and rel-L1
against the eager bf16 SDPA forward.

``--diffusers-rope`` adds a third model on fp8dit through diffusers' own Wan processors (q and
k rotated by diffusers' eager ops, then fp8dit), the path before fp8dit fused the rotation into
its quantization (``fp8dit.enable`` swaps in ``WanRotaryProcessor``).

``--compile`` adds torch.compile'd rows (both backends) and counts each model's graph breaks with
``torch._dynamo.explain``; ``--cuda-graph`` captures each forward after warm-up and replays it.
Rows are appended to ``benchmarks/results/<gpu>-wan-forward.json``; a table is printed last.

    python benchmarks/bench_wan_forward.py --layers 2 --repeats 5 --compile --cuda-graph
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
SDPA_BACKENDS = ("cudnn", "flash", "efficient")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolution", choices=("720p", "480p"), default="720p")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks (A14B has 40)")
    p.add_argument("--repeats", type=int, default=5, help="timed forwards per row")
    p.add_argument("--warmup", type=int, default=2, help="untimed forwards before timing")
    p.add_argument("--sdpa", choices=SDPA_BACKENDS, default="cudnn",
                   help="SDPA kernel forced for the baseline (default cudnn)")
    p.add_argument("--compile", action="store_true", help="also torch.compile both backends")
    p.add_argument("--cuda-graph", action="store_true", help="also capture and replay")
    p.add_argument("--diffusers-rope", action="store_true",
                   help="also fp8dit behind diffusers' own processors (eager rotation)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON file (default results/<gpu>-wan-forward.json)")
    args = p.parse_args(argv)
    for name in ("layers", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name}: expected an integer of at least 1, got {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup: expected an integer of at least 0, got {args.warmup}")
    return args


def seeded_model(cls_name: str, seed: int, device, **config):
    """``diffusers.<cls_name>(**config)`` with weights seeded by ``seed``, built on ``device``,
    in eval mode, bf16, without gradients: the same weights for every backend's model."""
    import diffusers

    torch.manual_seed(seed)
    with torch.device(device):
        model = getattr(diffusers, cls_name)(**config)
    return model.eval().requires_grad_(False).to(torch.bfloat16)


def cuda_device(script: str, what: str):
    """The GPU a forward benchmark runs on, after one line with the GPU, ``what`` runs and the
    software versions; None, after one line saying so, when torch sees no CUDA GPU."""
    if not torch.cuda.is_available():
        print(f"{script}: needs a CUDA GPU; torch sees none (nothing measured)")
        return None
    import diffusers
    import triton

    import fp8dit

    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(device)}: {what}, bf16; torch {torch.__version__}, "
          f"triton {triton.__version__}, diffusers {diffusers.__version__}, fp8dit "
          f"{fp8dit.__version__}", flush=True)
    return device


def sdpa_baselines(parser, text: str, allowed=("auto", "cudnn", "flash", "efficient")) -> list:
    """``--sdpa a,b,...`` of the forward benchmarks as a list, or a parser error naming what
    was not allowed."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in allowed]
    if bad or not names:
        parser.error(f"--sdpa: expected baselines among {', '.join(allowed)}, got "
                     f"{bad or 'none'}")
    return names


def forward_inputs(preset: dict, seed: int, device) -> dict:
    """One denoising step's inputs for a Wan preset of ``fp8dit.tools.demo.PRESETS``: random bf16
    latents of its 720p/480p shape, timestep 500, random text embeddings."""
    cfg = preset["config"]
    gen = torch.Generator(device=device).manual_seed(seed)
    return dict(
        hidden_states=torch.randn((1, cfg["in_channels"], *preset["latent"]),
                                  generator=gen, device=device).to(torch.bfloat16),
        timestep=torch.full((1,), 500.0, device=device),
        encoder_hidden_states=torch.randn((1, preset["text_len"], cfg["text_dim"]),
                                          generator=gen, device=device).to(torch.bfloat16),
    )


def sdpa_context(name: str):
    """SDPA limited to one kernel; "auto": torch's own choice (masked calls, which flash and
    some cuDNN versions do not take)."""
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name == "auto":
        return contextlib.nullcontext()

    kernel = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]
    return sdpa_kernel(kernel)


def event_ms(fn) -> float:
    """One call of ``fn`` timed with CUDA events (waits for it)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def time_ms(fn, warmup: int, repeats: int, before_each=None) -> tuple[float, float]:
    """Median and min of CUDA-event times of ``fn``; ``before_each`` runs untimed before each
    timed call (the context-parallel benchmark lines its ranks up there)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        if before_each is not None:
            before_each()
        times.append(event_ms(fn))
    return statistics.median(times), min(times)


def print_times(rows: dict, repeats: int, width: int = 34) -> None:
    """Time each ``rows[name]()`` (:func:`time_ms`, 2 warm-up calls) and print its median and
    min, one line each, in order."""
    for name, fn in rows.items():
        med, low = time_ms(fn, warmup=2, repeats=repeats)
        print(f"{name:{width}s} median {med:8.3f} ms  min {low:8.3f} ms")


def capture(fn):
    """A CUDA graph of ``fn`` (after two warm-up calls on a side stream) and its output."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def alternate_ms(calls: dict, warmup: int, repeats: int) -> dict:
    """{name: (median ms, min ms)} of each ``calls[name] = (row, fn)``, the backends called in
    turn (A B, then B A, ...), each call timed alone with CUDA events. Why: the H200 runs
    these forwards at its 700 W power cap, and its clock drifts as it warms (run s13-2); timing
    one backend's forwards in a block and then the other's gave the second a warmer GPU."""
    names = list(calls)
    for _ in range(warmup):
        for name in names:
            calls[name][1]()
    torch.cuda.synchronize()
    times = {name: [] for name in names}
    for i in range(repeats):
        for name in (names if i % 2 == 0 else names[::-1]):
            times[name].append(event_ms(calls[name][1]))
    return {name: (statistics.median(t), min(t)) for name, t in times.items()}


def graph_breaks(model, inputs) -> tuple[int, list[str]]:
    import torch._dynamo

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(**inputs, return_dict=False)
    reasons = [str(getattr(r, "reason", r)).splitlines()[0] for r in explanation.break_reasons]
    torch._dynamo.reset()
    return explanation.graph_break_count, reasons


def main(argv=None) -> int:
    args = parse_args(argv)
    from fp8dit.tools.demo import PRESETS, build_model

    preset = PRESETS[f"wan2.2-a14b-{args.resolution}"]
    cfg = preset["config"]
    frames, height, width = preset["latent"]
    tokens = frames * (height // 2) * (width // 2)
    device = cuda_device("bench_wan_forward", f"Wan2.2-A14B transformer, {args.layers} blocks, "
                         f"{args.resolution} ({tokens} tokens)")
    if device is None:
        return 2

    models = backend_models([args.sdpa],
                            lambda: build_model(preset, args.layers, args.seed, device),
                            ["fp8dit-diffusers-rope"] if args.diffusers_rope else [])
    inputs = forward_inputs(preset, args.seed + 1, device)
    pin_backends(models)
    return run_and_report(models, inputs, args, "wan-forward", dict(
        model="Wan2.2-A14B", layers=args.layers, resolution=args.resolution, tokens=tokens,
        heads=cfg["num_attention_heads"], head_dim=cfg["attention_head_dim"]))


def run_and_report(models: dict, inputs: dict, args, suffix: str, meta: dict) -> int:
    """The rest of every forward benchmark once :func:`pin_backends` has run: one fp8dit
    forward under ``record_calls`` (which backend and kernel each attention call took, printed
    and kept in the rows), :func:`compare_forwards` over the modes ``args`` asks for
    (``--compile``, ``--cuda-graph``; the first model is the baseline), then :func:`report` to
    ``args.out`` or results/<gpu>-<suffix>.json. ``meta``: the model's own row fields."""
    import diffusers

    from fp8dit.integrations import diffusers as fd
    from fp8dit.tools.bench import run_metadata

    baseline = next(iter(models))
    with fd.record_calls() as calls, torch.no_grad():
        models["fp8dit"](**inputs, return_dict=False)
    for c in calls:
        print(f"  fp8dit call: {c['backend']} ({c.get('kernel')}) q {c['q']} k {c['k']}: "
              f"{c['reason']}")
    device = next(models["fp8dit"].parameters()).device
    common = dict(run_metadata(device), diffusers=diffusers.__version__, **meta,
                  repeats=args.repeats, warmup=args.warmup, timing="alternating",
                  fp8dit_calls=[c["backend"] for c in calls])
    modes = ["eager"] + (["compile"] if args.compile else []) + (
        ["cuda-graph"] if args.cuda_graph else [])
    model_bytes = sum(p.numel() * p.element_size() for p in models["fp8dit"].parameters())
    rows = compare_forwards(models, inputs, baseline, modes, args.warmup, args.repeats, common,
                            model_bytes)
    return report(rows, baseline, Path(args.out) if args.out else None, suffix)


ROTATE_FIRST = "fp8dit-rotate-first"


def backend_models(baselines, build, fp8dit_variants=()) -> dict:
    """``{"sdpa-<kernel>": build(), ..., "fp8dit": build(), "fp8dit-<variant>": build()}``: one
    model per backend (``build`` seeds its weights, so they are the same), since the backends
    alternate call by call and a compiled model or captured graph cannot switch its attention
    backend. A ``fp8dit-<variant>`` model runs fp8dit through diffusers' own processors
    (``set_attention_backend``, not ``fp8dit.enable``); ``fp8dit-rotate-first`` through
    ``fp8dit.enable``'s processors with ``fuse_rotary`` off (q and k rotated in torch first,
    in diffusers' arithmetic: the same work as diffusers' processors, the same masks)."""
    return {name: build()
            for name in [f"sdpa-{s}" for s in baselines] + ["fp8dit", *fp8dit_variants]}


def pin_backends(models: dict, layer_backends: dict | None = None) -> None:
    """The attention layers of ``models["fp8dit"]`` on fp8dit, every other model's (the
    ``sdpa-<kernel>`` baselines) on diffusers' "native" or ``layer_backends[name]``. Layers
    whose processor calls torch SDPA itself and has no dispatching replacement (HunyuanVideo's
    token refiner) run SDPA in every model and are left out of the check."""
    from fp8dit.integrations import diffusers as fd

    fd.register()
    # diffusers' set_attention_backend also sets the process-wide active backend, which layers
    # without their own follow: the baselines' layers are pinned to "native" explicitly, and
    # checked, or every model would run fp8dit (as a first version of this script did).
    layer_backends = dict(layer_backends or {}, fp8dit="fp8dit")
    enabled = ["fp8dit"] + [n for n in models if n == ROTATE_FIRST]
    for name in models:
        if name.startswith("fp8dit-"):  # diffusers' processors, fp8dit's backend
            layer_backends[name] = "fp8dit"
    for name, model in models.items():
        if name not in enabled:
            model.set_attention_backend(layer_backends.get(name, "native"))
    for name in enabled:
        fd.enable(models[name])
    if ROTATE_FIRST in models:
        from fp8dit.integrations.diffusers_processors import REPLACEMENT_TYPES

        for _, proc in fd._attention_processors(models[ROTATE_FIRST]):
            if isinstance(proc, REPLACEMENT_TYPES):
                proc.fuse_rotary = False
    for name in models:
        want = layer_backends.get(name, "native")
        got = set(fd.layer_backends(models[name]).values()) - {fd.TORCH_SDPA}
        if got != {want}:
            raise RuntimeError(f"the {name} model's attention layers run {sorted(got)}, "
                               f"expected only {want!r}")


def compare_forwards(models: dict, inputs: dict, baseline: str, modes, warmup: int,
                     repeats: int, common: dict, model_bytes: int) -> list[dict]:
    """One row per (mode, backend) of ``models = {"sdpa-<kernel>": model, ..., "fp8dit": model}``
    (same weights, layers pinned by :func:`pin_backends`): alternating CUDA-event times, peak
    memory and the output against the eager ``baseline``'s, fp8dit's speed-up over it. A mode
    that fails is a row with ``error``."""
    from fp8dit.testing import error_stats

    device = torch.device("cuda")
    names = list(models)

    def forward(fn, name):
        def call():
            if name.startswith("fp8dit"):
                return fn(**inputs, return_dict=False)[0]
            # "sdpa-<kernel>[-variant]": the variant is the layers' backend (pin_backends)
            with sdpa_context(name.removeprefix("sdpa-").split("-")[0]):
                return fn(**inputs, return_dict=False)[0]
        return call

    rows, ref = [], None
    with torch.no_grad():
        for mode in modes:
            torch._dynamo.reset()
            if mode == "compile":  # explain() resets dynamo: before any model compiles
                # every model's: a break the model itself makes shows in the baselines too
                breaks = {name: graph_breaks(models[name], inputs) for name in names}
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated(device)  # both models and the inputs
            calls, keep = {}, []
            for name in names:
                row = dict(common, mode=mode, backend=name)
                before = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
                t0 = time.perf_counter()
                try:
                    model = models[name]
                    if mode == "compile":
                        row["graph_breaks"], row["break_reasons"] = breaks[name]
                        call = forward(torch.compile(model), name)
                        out = call()  # compiles
                    elif mode == "cuda-graph":
                        graph, out = capture(forward(model, name))
                        graph.replay()
                        call = graph.replay
                        keep.append(graph)
                    else:
                        call = forward(model, name)
                        out = call()
                    torch.cuda.synchronize()
                except Exception as e:  # a failed mode is a result, not a crash
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                    traceback.print_exc()
                    rows.append(row)
                    print(f"  {mode:10s} {name:12s} FAILED: {row['error']}", flush=True)
                    continue
                row["setup_s"] = round(time.perf_counter() - t0, 2)
                # as if this backend's model and the inputs were alone on the GPU
                peak = (torch.cuda.max_memory_allocated(device) - (before - base)
                        - model_bytes)
                row["peak_mem_gib"] = round(peak / 2**30, 2)
                if mode == "eager" and name == baseline:
                    ref = out.detach().clone()  # eager bf16 SDPA: the reference of every row
                if ref is not None:
                    stats = error_stats(out, ref)
                    row.update(cos_vs_bf16=stats.cos, rel_l1_vs_bf16=stats.rel_l1,
                               nan=stats.nan)
                calls[name] = (row, call)
                out = None
            timed = alternate_ms(calls, warmup, repeats)
            for name, (row, _) in calls.items():
                row["ms_median"], row["ms_min"] = timed[name]
                rows.append(row)
                print(f"  {mode:10s} {name:12s} {row['ms_median']:9.1f} ms  "
                      f"cos {row.get('cos_vs_bf16', float('nan')):.6f}  "
                      f"peak {row['peak_mem_gib']} GiB", flush=True)
            calls = keep = None  # frees captured graphs' memory pools
            torch._dynamo.reset()

    by_key = {(r["mode"], r["backend"]): r for r in rows}
    for r in rows:
        if not r["backend"].startswith("fp8dit") or "ms_median" not in r:
            continue
        for name in (n for n in names if n != r["backend"]):  # "speedup": against ``baseline``
            base = by_key.get((r["mode"], name))
            if base and "ms_median" in base:
                ratio = round(base["ms_median"] / r["ms_median"], 3)
                r.setdefault("speedup_vs", {})[name] = ratio
                if name == baseline:
                    r["speedup"] = ratio
    return rows


def report(rows: list[dict], baseline: str, out_path: Path | None, suffix: str) -> int:
    """Append ``rows`` to ``out_path`` (default results/<gpu>-<suffix>.json), print the table;
    the exit code: 1 when a row failed or gave NaN."""
    from fp8dit.tools.bench import gpu_slug, save_results

    if out_path is None:
        out_path = RESULTS / f"{gpu_slug(rows[0]['gpu'])}-{suffix}.json"
    save_results(out_path, rows)

    print(f"\nwrote {len(rows)} rows to {out_path}")
    for r in rows:
        if r.get("graph_breaks") is not None:
            print(f"{r['backend']} graph breaks under torch.compile: {r['graph_breaks']}"
                  + (" (" + "; ".join(r["break_reasons"][:5]) + ")" if r["break_reasons"] else ""))
    print(f"\n{'mode':11s} {'backend':12s} {'median ms':>10s} {'min ms':>9s} {'speed-up':>9s} "
          f"{'cos vs bf16':>12s} {'peak GiB':>9s}")
    for r in rows:
        if "error" in r:
            print(f"{r['mode']:11s} {r['backend']:12s} failed: {r['error']}")
            continue
        speed = f"{r['speedup']:.2f}x" if "speedup" in r else "-"
        cos = r.get("cos_vs_bf16", float("nan"))
        print(f"{r['mode']:11s} {r['backend']:12s} {r['ms_median']:10.1f} {r['ms_min']:9.1f} "
              f"{speed:>9s} {cos:12.6f} {r['peak_mem_gib']:9.2f}")
    return 1 if any("error" in r or r.get("nan") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
