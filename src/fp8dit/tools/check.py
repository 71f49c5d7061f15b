"""``fp8dit check``: accuracy of every recipe against an fp64 reference, and its speed on a GPU.

One row per (recipe, input family): cosine, rel-L1, RMSE and max-abs error of the output, max
error of the log-sum-exp, the worst head, and ``ring rel-L1``: the rel-L1 of the output merged
by LSE from calls on four kv chunks (:func:`fp8dit.testing.ring_merge`, what ring attention
does with the LSE), all against :func:`fp8dit.testing.attention_ref` in float64; ``vs emul``,
the kernel's rel-L1 over that of a pure-torch emulation of the same recipe
(:func:`fp8dit.testing.attention_emulated`; near 1x is precision, far above is a bug); with a
GPU also the median time of each recipe. ``sdpa`` (torch SDPA in bf16) is the
baseline every FP8 recipe is compared with; ``cudnn-fp8`` (asked for by name in
``--recipes``) adds cuDNN's own FP8 attention with per-tensor scales
(:mod:`fp8dit.tools.cudnn_fp8`; Hopper GPU, ``nvidia-cudnn-frontend`` installed, q, k and v of one
shape), which returns no LSE.

Inputs come from the families of :mod:`fp8dit.testing` (``normal``, ``dit``) or from a file of
tensors captured from a real model (``--inputs``)::

    torch.save({"q": q, "k": k, "v": v}, "qkv.pt")

with q ``[B, Sq, H, D]`` and k, v ``[B, Sk, Hkv, D]`` (NHD, the layout diffusers' attention
processors hold after ``unflatten``); a ``(q, k, v)`` tuple or list works too, and a dict may
add ``"layout": "HND"`` for ``[B, H, S, D]`` tensors. float32 inputs are cast to bfloat16 for
the kernels (the fp64 reference uses them as saved).

Without a GPU the kernels run through Triton's CPU interpreter on a small default shape.

``--stress`` runs the stress suite instead (:data:`fp8dit.testing.STRESS_SUITE`: outlier
channels, channel biases, FlashAttention-3's benchmark, peaked and flat softmax, attention sinks,
head dim 64, GQA; docs/accuracy.md): one row per recipe x case with the output's errors,
the mean and max LSE error, the output merged from four kv chunks against one call's, the
``floor`` (the recipe's emulation with exact Q and K: what its P and V rounding alone leave) and
the bounds of :data:`fp8dit.testing.STRESS_BOUNDS` that the case breaks; rows sorted by how far
they are from the bounds, worst last, then each recipe's worst cases, the worst recipe last.
``--emulate`` measures the recipes' pure-torch emulation instead of the kernels (seconds on a
CPU, where the interpreter takes ~30 s per recipe and case at the default 1k tokens).

Example
-------
$ fp8dit check                                   # every recipe x {normal, dit}
$ fp8dit check --inputs qkv.pt --plot check.png  # captured tensors; error vs length and per head
$ fp8dit check --stress --emulate                # every recipe x stress case, in torch
$ fp8dit check --stress --recipes int8qk-fp8pv --families dit,fa3   # the kernels
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from .presets import PRESETS, ShapeError, get_preset, parse_shape

GPU_SHAPE = "1,4,8192,128"
CPU_SHAPE = "1,2,512,64"
# --stress: the suite's cases fix their own head dim or kv heads where they test them.
STRESS_GPU_SHAPE = "1,4,8192,128"
STRESS_CPU_SHAPE = "1,2,1024,128"
BASELINE = "sdpa"
# Peers that run only when named in --recipes (they need a GPU and an optional package).
PEERS = ("cudnn-fp8",)


class InputsError(ValueError):
    """An ``--inputs`` file that cannot be used; the message says why and what is expected."""


INPUTS_FORMAT = (
    "expected a file written by torch.save({'q': q, 'k': k, 'v': v}, path) (or a (q, k, v) "
    "tuple) with q [B, Sq, H, D] and k, v [B, Sk, Hkv, D] floating-point tensors (NHD; add "
    "'layout': 'HND' to the dict for [B, H, S, D])"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", metavar="B,H,S,D",
                   help=f"shape of the generated inputs (default {GPU_SHAPE} on a GPU, "
                        f"{CPU_SHAPE} through the CPU interpreter)")
    p.add_argument("--preset", metavar="NAME",
                   help="a preset shape instead of --shape (GPU only): " + ", ".join(PRESETS))
    p.add_argument("--recipes", metavar="A,B",
                   help="comma-separated recipes of fp8dit.recipes.RECIPES and 'sdpa' "
                        "(default: all of them); 'cudnn-fp8' adds cuDNN's per-tensor FP8 "
                        "attention (Hopper, nvidia-cudnn-frontend)")
    p.add_argument("--families", metavar="A,B",
                   help="comma-separated input families of fp8dit.testing (default: all); with "
                        "--stress, cases of fp8dit.testing.STRESS_SUITE")
    p.add_argument("--stress", action="store_true",
                   help="the stress suite (fp8dit.testing.STRESS_SUITE): recipe x case against "
                        "the bounds of docs/accuracy.md, worst case last")
    p.add_argument("--emulate", action="store_true",
                   help="with --stress: the recipes' pure-torch emulation "
                        "(fp8dit.testing.attention_emulated) instead of the kernels")
    p.add_argument("--inputs", metavar="QKV.PT",
                   help="captured tensors instead of the families: a dict {'q','k','v'} or a "
                        "(q, k, v) tuple saved with torch.save, NHD [B, S, H, D]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-speed", action="store_true", help="skip the GPU timing")
    p.add_argument("--plot", metavar="PNG",
                   help="error against sequence length and per head (needs matplotlib)")
    p.add_argument("--sweep", metavar="S1,S2",
                   help="sequence lengths of the --plot sweep, each at most S (the inputs are "
                        "cut to the first S tokens); default S/8, S/4, S/2, S")
    p.add_argument("--out-json", metavar="PATH", help="also write the rows as JSON")


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


def load_inputs(path: str) -> tuple:
    """(q, k, v) in NHD from a ``torch.save`` file; raises :class:`InputsError`."""
    p = Path(path)
    if not p.is_file():
        raise InputsError(f"--inputs: no such file: {path}")
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same clear message
        msg = str(e).strip().splitlines()
        raise InputsError(
            f"--inputs: could not read {path} with torch.load "
            f"({type(e).__name__}: {msg[0] if msg else ''}); {INPUTS_FORMAT}"
        ) from None
    layout = "NHD"
    if isinstance(obj, dict):
        missing = [n for n in "qkv" if n not in obj]
        if missing:
            raise InputsError(
                f"--inputs: {path} is a dict without key(s) {', '.join(map(repr, missing))} "
                f"(has {', '.join(map(repr, obj)) or 'none'}); {INPUTS_FORMAT}"
            )
        layout = obj.get("layout", "NHD")
        if layout not in ("NHD", "HND"):
            raise InputsError(f"--inputs: 'layout' must be 'NHD' or 'HND', got {layout!r}")
        tensors = [obj["q"], obj["k"], obj["v"]]
    elif isinstance(obj, (tuple, list)):
        if len(obj) != 3:
            raise InputsError(
                f"--inputs: {path} holds a {type(obj).__name__} of {len(obj)} items, "
                f"expected 3 (q, k, v); {INPUTS_FORMAT}"
            )
        tensors = list(obj)
    else:
        raise InputsError(f"--inputs: {path} holds a {type(obj).__name__}; {INPUTS_FORMAT}")
    for name, t in zip("qkv", tensors):
        if not isinstance(t, torch.Tensor):
            raise InputsError(f"--inputs: {name} is a {type(t).__name__}, expected a tensor")
        if not t.is_floating_point():
            raise InputsError(f"--inputs: {name} has dtype {t.dtype}, expected floating point")
        if t.dim() != 4:
            raise InputsError(
                f"--inputs: {name} has shape {tuple(t.shape)}, expected 4-D "
                + ("[B, S, H, D] (NHD)" if layout == "NHD" else "[B, H, S, D] (HND)")
            )
        if t.numel() == 0:
            raise InputsError(f"--inputs: {name} is empty (shape {tuple(t.shape)})")
        if not bool(torch.isfinite(t).all()):
            raise InputsError(f"--inputs: {name} holds NaN or inf values")
    if layout == "HND":
        tensors = [t.transpose(1, 2) for t in tensors]
    q, k, v = (t.contiguous() for t in tensors)
    (B, _, H, D), (Bk, _, Hkv, Dk) = q.shape, k.shape
    if v.shape != k.shape:
        raise InputsError(f"--inputs: v has shape {tuple(v.shape)}, expected k's "
                          f"{tuple(k.shape)}")
    if Bk != B or Dk != D:
        raise InputsError(f"--inputs: k has shape {tuple(k.shape)}; expected batch {B} and "
                          f"head_dim {D} like q {tuple(q.shape)} (NHD)")
    if H % Hkv:
        raise InputsError(f"--inputs: q has {H} heads, k has {Hkv}: expected q's heads to be a "
                          "multiple of k's (GQA)")
    return q, k, v


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------


def _ref_chunk(B: int, H: int, Sk: int) -> int:
    # Keep each fp64 score chunk near 1 GiB (several live at once) on long sequences.
    return max(16, min(2048, 2**27 // max(B * H * Sk, 1)))


# Largest per-kv-head score matrix (elements) for which the recipe emulation is computed.
EMULATION_MAX = 2**28


def emulation_rel_l1(recipe: str, q, k, v, ref_out) -> float | None:
    """rel-L1 of :func:`fp8dit.testing.attention_emulated` (the recipe's rounding in torch).

    Computed one kv head (and its q heads) at a time; ``None`` when that is still too large.
    """
    from ..recipes import RECIPES
    from ..testing import attention_emulated, error_stats, tensor_abs_max

    B, Sq, H, _ = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    g = H // Hkv
    if recipe not in RECIPES or B * g * Sq * Sk > EMULATION_MAX:
        return None
    amax = tensor_abs_max(q, k, v)  # per-tensor recipes scale by the whole tensors, not a slice
    outs = [
        attention_emulated(q[:, :, j * g:(j + 1) * g], k[:, :, j:j + 1], v[:, :, j:j + 1],
                           RECIPES[recipe], layout="NHD", tensor_amax=amax)
        for j in range(Hkv)
    ]
    return error_stats(torch.cat(outs, dim=2), ref_out).rel_l1


_PEER_CACHE: dict = {}


def _run_cudnn_fp8(q, k, v):
    """cuDNN's FP8 attention on NHD q, k, v (one graph per shape, cached): (out, None)."""
    from .cudnn_fp8 import CudnnFp8Attention

    hn = [t.transpose(1, 2) for t in (q, k, v)]
    key = (tuple(q.shape), tuple(q.stride()), q.dtype, q.device)
    if key not in _PEER_CACHE:
        _PEER_CACHE.clear()  # one shape at a time: a graph holds a workspace
        _PEER_CACHE[key] = CudnnFp8Attention(*hn)
    return _PEER_CACHE[key](*hn).transpose(1, 2), None


def _run_recipe(recipe: str, q, k, v, return_lse: bool = True):
    import fp8dit

    if recipe == "cudnn-fp8":
        out, _ = _run_cudnn_fp8(q, k, v)
        return (out, None) if return_lse else out
    if recipe == BASELINE:
        return fp8dit.attention(q, k, v, backend="sdpa", return_lse=return_lse)
    return fp8dit.attention(q, k, v, backend="fp8", recipe=recipe, return_lse=return_lse)


RING_CHUNKS = 4


def measure(recipe: str, q, k, v, ref_out, ref_lse, *, speed: bool) -> dict:
    from ..testing import error_stats, error_stats_per_head, ring_merge

    out, lse = _run_recipe(recipe, q, k, v)
    st = error_stats(out, ref_out)
    heads = error_stats_per_head(out, ref_out, layout="NHD")
    worst = max(range(len(heads)), key=lambda h: heads[h].rel_l1)
    if lse is None:  # a peer without LSE
        lse_err, lse_nan = None, False
    else:
        fin = torch.isfinite(ref_lse)
        d = (lse.double() - ref_lse)[fin].abs()
        lse_err, lse_nan = (float(d.max()) if d.numel() else 0.0), bool(torch.isnan(lse).any())
    row = dict(st.as_dict(), recipe=recipe, lse_max_err=lse_err, lse_nan=lse_nan,
               worst_head=worst, worst_head_rel_l1=heads[worst].rel_l1,
               per_head_rel_l1=[h.rel_l1 for h in heads], ms=None)
    has_lse = lse is not None
    del out, lse
    row["ring_rel_l1"] = None
    if has_lse:
        merged = ring_merge(lambda qq, kk, vv: _run_recipe(recipe, qq, kk, vv), q, k, v,
                            chunks=RING_CHUNKS)
        row["ring_rel_l1"] = error_stats(merged, ref_out).rel_l1
        del merged
    emu = emulation_rel_l1(recipe, q, k, v, ref_out)
    row["emulation_rel_l1"] = emu
    row["vs_emulation"] = st.rel_l1 / emu if emu else None
    if speed:
        import triton.testing

        # Without the LSE: SDPA has none and computes it separately (slowly) when asked.
        row["ms"] = float(triton.testing.do_bench(
            lambda: _run_recipe(recipe, q, k, v, return_lse=False), return_mode="median"
        ))
    return row


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def format_table(rows: list[dict]) -> str:
    def f(v, spec):
        return "-" if v is None else format(v, spec)

    header = ("recipe", "inputs", "cos", "rel-L1", "RMSE", "max-abs", "LSE max err",
              f"ring rel-L1 ({RING_CHUNKS})", "worst head rel-L1", "vs emul", "ms", "note")
    cells = []
    for r in rows:
        if r.get("error"):
            cells.append((r["recipe"], r["inputs"], *["-"] * 9, r["error"]))
            continue
        note = "NaN in output!" if r["nan"] or r["lse_nan"] else ""
        cells.append((
            r["recipe"], r["inputs"], f(r["cos"], ".6f"), f(r["rel_l1"], ".4f"),
            f(r["rmse"], ".3e"), f(r["max_abs"], ".3e"), f(r["lse_max_err"], ".3e"),
            f(r.get("ring_rel_l1"), ".4f"),
            f"{r['worst_head_rel_l1']:.4f} (h{r['worst_head']})",
            "-" if r.get("vs_emulation") is None else f"{r['vs_emulation']:.2f}x",
            f(r.get("ms"), ".3f"), note,
        ))
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h)
              for i, h in enumerate(header)]

    def fmt(row):
        return "  ".join(
            c.ljust(w) if i in (0, 1, 11) else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths))
        ).rstrip()

    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(c) for c in cells])


def _plot(cases, recipes, sweeps, per_head, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    n = len(cases)
    fig, axes = plt.subplots(n, 2, figsize=(11, 3.6 * n), squeeze=False)
    for i, (label, *_rest) in enumerate(cases):
        ax_s, ax_h = axes[i]
        for rec in recipes:
            pts = sweeps.get((label, rec), [])
            if pts:
                ax_s.plot([s for s, _ in pts], [e for _, e in pts], marker="o", label=rec)
            heads = per_head.get((label, rec))
            if heads:
                ax_h.plot(range(len(heads)), heads, marker=".", label=rec)
        ax_s.set_xscale("log", base=2)
        ax_s.set_yscale("log")
        ax_s.set_xlabel("sequence length S")
        ax_s.set_ylabel("rel-L1 vs fp64")
        ax_s.set_title(f"{label}: error against sequence length")
        ax_h.set_yscale("log")
        ax_h.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax_h.set_xlabel("head")
        ax_h.set_ylabel("rel-L1 vs fp64")
        ax_h.set_title(f"{label}: error per head")
        ax_s.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def _error(msg: str) -> int:
    print(f"fp8dit check: error: {msg}", file=sys.stderr)
    return 2


def _parse_list(text, allowed, what: str, extra=()) -> list[str]:
    """Names from ``text`` (default: all of ``allowed``; ``extra`` only when named)."""
    if not text:
        return list(allowed)
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in allowed and n not in extra]
    if bad or not names:
        raise ValueError(f"--{what}: unknown {', '.join(map(repr, bad)) or 'empty list'}; "
                         f"expected a comma-separated subset of: "
                         f"{', '.join([*allowed, *extra])}")
    return list(dict.fromkeys(names))


def run(args: argparse.Namespace) -> int:
    from ..recipes import RECIPES
    from ..testing import FAMILIES, attention_ref, error_stats, make_qkv
    from .bench import (
        check_output_path,
        check_plot_available,
        interpreter_active,
        rerun_interpreted,
    )

    on_gpu = torch.cuda.is_available()
    if getattr(args, "stress", False) or getattr(args, "emulate", False):
        return run_stress(args)
    if args.plot:
        missing = check_plot_available()
        if missing:
            return _error(missing)
    try:
        recipes = _parse_list(args.recipes, [*RECIPES, BASELINE], "recipes", extra=PEERS)
        families = _parse_list(args.families, list(FAMILIES), "families")
        if args.preset and args.shape:
            raise ShapeError("give --shape or --preset, not both")
        if args.preset:
            shape = get_preset(args.preset)  # an unknown name first, on any machine
            if not on_gpu:
                raise ShapeError(f"--preset {args.preset}: too large for the CPU interpreter; "
                                 "use a small --shape")
        else:
            shape = parse_shape(args.shape or (GPU_SHAPE if on_gpu else CPU_SHAPE))
        check_output_path("--out-json", args.out_json)
        check_output_path("--plot", args.plot)
        inputs = load_inputs(args.inputs) if args.inputs else None
    except ValueError as e:
        return _error(str(e))

    if not on_gpu and not interpreter_active():
        _log("[check] no CUDA GPU: re-running under TRITON_INTERPRET=1 (Triton's CPU interpreter)")
        return rerun_interpreted(__name__, args)
    device = torch.device("cuda" if on_gpu else "cpu")
    speed = on_gpu and not args.no_speed

    if inputs is not None:
        q, k, v = inputs
        label = f"file:{Path(args.inputs).name}"
        cases = [(label, q.to(device), k.to(device), v.to(device))]
        _log(f"[check] {label}: q {tuple(q.shape)} k {tuple(k.shape)} {q.dtype} (NHD)")
    else:
        cases = []
        for fam in families:
            q, k, v = make_qkv(shape.B, shape.H, shape.S, shape.D, family=fam, layout="NHD",
                               dtype=torch.bfloat16, device=device, seed=args.seed)
            cases.append((fam, q, k, v))
    if not on_gpu:
        B, S, H, D = cases[0][1].shape
        _log(f"[check] note: no GPU, so the kernels run through Triton's CPU interpreter on "
             f"B{B} H{H} S{S} D{D}; a GPU run defaults to B1 H4 S8192 D128 and adds timings")

    sweep = None
    if args.plot:
        S = min(t.shape[1] for t in cases[0][1:])
        try:
            sweep = ([int(x) for x in args.sweep.split(",")] if args.sweep
                     else [S // 8, S // 4, S // 2, S])
        except ValueError:
            return _error(f"--sweep: expected comma-separated integers, got {args.sweep!r}")
        bad = [s for s in sweep if not 1 <= s <= S]
        if bad:
            return _error(f"--sweep: lengths must be between 1 and S={S}, got {bad}")
        sweep = sorted(set(s for s in sweep if s >= 1))

    rows, per_head, sweeps = [], {}, {}
    total = len(cases) * len(recipes)
    step = 0
    t_start = time.perf_counter()
    for label, q, k, v in cases:
        t0 = time.perf_counter()
        B, Sq, H, _ = q.shape
        ref_out, ref_lse = attention_ref(q, k, v, return_lse=True,
                                         chunk=_ref_chunk(B, H, k.shape[1]))
        _log(f"[check] {label}: fp64 reference ({time.perf_counter() - t0:.1f} s)")
        # One kernel dtype for all three (a file may mix them): q's when it is 16-bit, else bf16.
        kdt = q.dtype if q.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        qk, kk, vk = (t.to(kdt) for t in (q, k, v))
        for rec in recipes:
            step += 1
            t0 = time.perf_counter()
            try:
                row = measure(rec, qk, kk, vk, ref_out, ref_lse, speed=speed)
                per_head[(label, rec)] = row["per_head_rel_l1"]
                msg = f"rel_l1={row['rel_l1']:.4f} cos={row['cos']:.6f}"
            except Exception as e:  # noqa: BLE001 - one failing recipe must not end the check
                lines = str(e).strip().splitlines()
                row = dict(recipe=rec, error=f"{type(e).__name__}: {lines[0] if lines else ''}")
                msg = row["error"]
            row.update(inputs=label, B=B, S=Sq, H=H, D=q.shape[3], Sk=k.shape[1],
                       Hkv=k.shape[2], device=device.type)
            rows.append(row)
            _log(f"[check] {step}/{total} {label} {rec}: {msg} "
                 f"({time.perf_counter() - t0:.1f} s)")
        del ref_out, ref_lse
        if sweep:
            for s in sweep:
                qs, ks, vs = (t[:, :s] for t in (q, k, v))
                r_out = attention_ref(qs, ks, vs, chunk=_ref_chunk(B, H, s))
                qb, kb, vb = (t[:, :s] for t in (qk, kk, vk))
                for rec in recipes:
                    try:
                        e = error_stats(_run_recipe(rec, qb, kb, vb, False), r_out).rel_l1
                        sweeps.setdefault((label, rec), []).append((s, e))
                    except Exception as ex:  # noqa: BLE001
                        _log(f"[check] sweep S={s} {rec}: {type(ex).__name__}: {ex}")
                _log(f"[check] {label}: sweep S={s} done")

    _log(f"[check] done in {time.perf_counter() - t_start:.0f} s")
    rc = 0
    if args.plot:
        try:
            _plot(cases, recipes, sweeps, per_head, args.plot)
            _log(f"[check] wrote {args.plot}")
        except Exception as e:  # noqa: BLE001 - the table still matters
            _log(f"[check] --plot failed: {type(e).__name__}: {e}")
            rc = 1
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(rows, indent=1) + "\n")
    B, S, H, D = cases[0][1].shape
    where = (f"{torch.cuda.get_device_name(device)}; ms = median of do_bench" if speed
             else "CPU, Triton interpreter: no timings" if not on_gpu else "timing skipped")
    print(f"accuracy against fp64 (B{B} S{S} H{H} D{D}), {where}")
    print(format_table(rows))
    broken = [r for r in rows if r.get("error") or r.get("nan") or r.get("lse_nan")]
    return rc or (1 if broken else 0)


# ---------------------------------------------------------------------------------------------
# --stress
# ---------------------------------------------------------------------------------------------


def _stress_runner(recipe: str, emulate: bool):
    """``run(q, k, v) -> (out, lse)`` of a recipe: its kernels, or its emulation."""
    from ..recipes import RECIPES
    from ..testing import emulated_runner

    if emulate:
        return emulated_runner(RECIPES[recipe])
    return lambda q, k, v: _run_recipe(recipe, q, k, v)


def format_stress_table(rows: list[dict]) -> str:
    """Rows grouped by recipe, each group sorted by badness (worst last); then each recipe's
    worst values and broken bounds, the worst recipe last; then the worst case."""
    def f(v, spec):
        return "-" if v is None else format(v, spec)

    header = ("recipe", "case", "cos", "rel-L1", "floor", "RMSE", "LSE mean", "LSE max",
              f"ring/one ({RING_CHUNKS})", "bounds broken")
    order = {}
    for r in rows:
        order[r["recipe"]] = max(order.get(r["recipe"], 0.0), r.get("badness", float("inf")))
    body = []
    for rec in sorted(order, key=order.get):
        group = sorted((r for r in rows if r["recipe"] == rec),
                       key=lambda r: r.get("badness", float("inf")))
        for r in group:
            if r.get("error"):
                body.append((rec, r["inputs"], *["-"] * 7, r["error"]))
                continue
            body.append((rec, r["inputs"], f(r["cos"], ".6f"), f(r["rel_l1"], ".4f"),
                         f(r["floor_rel_l1"], ".4f"), f(r["rmse"], ".2e"),
                         f(r["lse_mean"], ".4f"), f(r["lse_max"], ".3f"),
                         f(r["ring_ratio"], ".3f"), "; ".join(r["violations"]) or "ok"))
    lines = _columns(header, body, left=(0, 1, 9))

    sh = ("recipe", "worst rel-L1", "worst rel-L1 / floor", "min cos", "worst LSE mean",
          "worst ring/one", "fa3 RMSE", "cases out of bounds (worst first)")
    sb = []
    for rec in sorted(order, key=order.get):
        ok = [r for r in rows if r["recipe"] == rec and not r.get("error")]
        if not ok:
            sb.append((rec, *["-"] * 6, "all failed"))
            continue
        wr = max(ok, key=lambda r: r["rel_l1"])
        fl = [r for r in ok if r.get("floor_rel_l1")]
        wf = max(fl, key=lambda r: r["rel_l1"] / r["floor_rel_l1"]) if fl else None
        wc = min(ok, key=lambda r: r["cos"])
        wl = max(ok, key=lambda r: r["lse_mean"])
        wg = max(ok, key=lambda r: r["ring_ratio"])
        fa3 = [r["rmse"] for r in ok if r["inputs"] == "fa3"]
        bad = [r["inputs"] for r in sorted(ok, key=lambda r: -r["badness"]) if r["violations"]]
        bad = [r["inputs"] + " (error)" for r in rows
               if r["recipe"] == rec and r.get("error")] + bad
        shown = ", ".join(bad[:3]) + (f", +{len(bad) - 3}" if len(bad) > 3 else "")
        sb.append((rec, f"{wr['rel_l1']:.4f} ({wr['inputs']})",
                   f"{wf['rel_l1'] / wf['floor_rel_l1']:.2f} ({wf['inputs']})" if wf else "-",
                   f"{wc['cos']:.5f} ({wc['inputs']})",
                   f"{wl['lse_mean']:.4f} ({wl['inputs']})",
                   f"{wg['ring_ratio']:.3f} ({wg['inputs']})",
                   f"{fa3[0]:.2e}" if fa3 else "-",
                   f"{len(bad)} of {len(ok)}: {shown}" if bad else "none"))
    lines += ["", "per recipe, worst last:"] + _columns(sh, sb, left=(0, 7))
    worst = max(rows, key=lambda r: r.get("badness", float("inf")))
    why = worst.get("error") or "; ".join(worst.get("violations", [])) or "within every bound"
    lines += ["", f"worst case: {worst['recipe']} on {worst['inputs']}: {why}"]
    return "\n".join(lines)


def _columns(header, body, left=()) -> list[str]:
    widths = [max(len(h), *(len(c[i]) for c in body)) if body else len(h)
              for i, h in enumerate(header)]

    def fmt(row):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    return [fmt(header), fmt(["-" * w for w in widths])] + [fmt(c) for c in body]


def run_stress(args: argparse.Namespace) -> int:
    """``fp8dit check --stress``: every recipe x stress case, worst last (module docstring)."""
    from ..recipes import RECIPES
    from ..testing import (
        STRESS_BOUNDS,
        STRESS_CASES,
        emulated_runner,
        make_stress_qkv,
        stress_badness,
        stress_metrics,
        stress_violations,
    )
    from .bench import check_output_path, interpreter_active, rerun_interpreted

    on_gpu = torch.cuda.is_available()
    try:
        if not args.stress:
            raise ValueError("--emulate: only with --stress")
        if args.inputs or args.plot or args.sweep or args.preset:
            raise ValueError("--stress: draws its own inputs; --inputs, --preset, --plot and "
                             "--sweep do not apply")
        recipes = _parse_list(args.recipes, list(RECIPES), "recipes", extra=(BASELINE,))
        if args.emulate and BASELINE in recipes:
            raise ValueError(f"--recipes: {BASELINE!r} has no emulation (--emulate); expected "
                             f"a subset of: {', '.join(RECIPES)}")
        cases = _parse_list(args.families, list(STRESS_CASES), "families")
        shape = parse_shape(args.shape or (STRESS_GPU_SHAPE if on_gpu else STRESS_CPU_SHAPE))
        check_output_path("--out-json", args.out_json)
    except ValueError as e:
        return _error(str(e))
    if not args.emulate and not on_gpu and not interpreter_active():
        _log("[check] no CUDA GPU: re-running under TRITON_INTERPRET=1 (Triton's CPU interpreter)")
        return rerun_interpreted(__name__, args)
    device = torch.device("cuda" if on_gpu else "cpu")
    where = ("the recipes' torch emulation" if args.emulate else
             torch.cuda.get_device_name(device) if on_gpu else "Triton's CPU interpreter")
    if not args.emulate and not on_gpu:
        _log(f"[check] the kernels through Triton's CPU interpreter: ~30 s per recipe and case "
             f"at 1k tokens ({len(recipes) * len(cases)} here); --emulate takes ~1 s each")
    rows = []
    t_start = time.perf_counter()
    total, step = len(cases) * len(recipes), 0
    for name in cases:
        case = STRESS_CASES[name]
        try:
            q, k, v = make_stress_qkv(case, shape.B, shape.H, shape.S, shape.D, seed=args.seed,
                                      device=device)
        except ValueError as e:
            return _error(f"--shape: {e}")
        for rec in recipes:
            step += 1
            t0 = time.perf_counter()
            row = dict(recipe=rec, inputs=name, kind=case.kind, B=q.shape[0], S=q.shape[1],
                       H=q.shape[2], D=q.shape[3], Hkv=k.shape[2],
                       mode="emulation" if args.emulate else device.type)
            try:
                floor = emulated_runner(RECIPES[rec], exact_qk=True) if rec in RECIPES else None
                m = stress_metrics(_stress_runner(rec, args.emulate), q, k, v, floor=floor)
                row.update(m, violations=stress_violations(name, m),
                           badness=stress_badness(name, m))
                msg = f"rel_l1={m['rel_l1']:.4f} lse={m['lse_mean']:.4f}"
            except Exception as e:  # noqa: BLE001 - one failing recipe must not end the check
                lines = str(e).strip().splitlines()
                row.update(error=f"{type(e).__name__}: {lines[0] if lines else ''}",
                           badness=float("inf"))
                msg = row["error"]
            rows.append(row)
            _log(f"[check] {step}/{total} {name} {rec}: {msg} ({time.perf_counter() - t0:.1f} s)")
    _log(f"[check] done in {time.perf_counter() - t_start:.0f} s")
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(rows, indent=1) + "\n")
    b = STRESS_BOUNDS
    print(f"stress suite against fp64 (B{shape.B} S{shape.S} H{shape.H} D{shape.D} unless the "
          f"case sets D or GQA; seed {args.seed}), {where}")
    print(f"bounds: rel-L1 <= {b['rel_l1']} (i.i.d. normal <= {b['rel_l1_normal']}), cos >= "
          f"{b['cos']}, mean |LSE error| <= {b['lse_mean']}, ring merge <= {b['ring_ratio']}x one "
          f"call, fa3 RMSE <= {b['fa3_rmse']:.1e}; floor = the recipe with exact Q and K")
    print(format_stress_table(rows))
    broken = [r for r in rows if r.get("error") or r.get("nan") or r.get("lse_nan")]
    return 1 if broken else 0
