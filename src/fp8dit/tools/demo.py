"""``fp8dit demo``: denoise with a Wan transformer twice, bf16 attention vs fp8dit, side by side.

The model is diffusers' ``WanTransformer3DModel`` with seeded random weights (nothing is
downloaded): ``tiny`` by default (runs on a CPU through Triton's interpreter), or the real
Wan2.2-A14B width with only ``--layers`` blocks on 480p/720p latents (GPU). The same seeded noise
goes through a flow-matching Euler loop once with diffusers' ``native`` attention (torch SDPA,
bf16) and once with backend ``fp8dit``; the demo prints per-step times, which backend ran in each
attention layer and why, the agreement of the final latents, and plots the per-step error.

Random weights show the plumbing and the error of the attention itself, not the quality of a
trained model's video.
"""

from __future__ import annotations

import argparse
import math
import os
import struct
import subprocess
import sys
import time
import zlib

# Wan2.2-A14B transformer (diffusers' convert_wan_to_diffusers.py, "Wan2.2-T2V-A14B"): both
# experts (transformer, transformer_2) share it. The I2V model differs only in in_channels=36.
A14B = dict(
    patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16,
    out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40,
    cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None,
    added_kv_proj_dim=None, rope_max_seq_len=1024,
)
TINY = dict(A14B, num_attention_heads=2, attention_head_dim=64, in_channels=4, out_channels=4,
            text_dim=32, freq_dim=32, ffn_dim=256, num_layers=2, rope_max_seq_len=64)

# latent (frames, height, width) after the Wan VAE (stride 4, 8, 8): 81 frames -> 21;
# patch (1, 2, 2) then gives the token count. Text: UMT5 context of 512 tokens.
PRESETS = {
    "tiny": dict(config=TINY, latent=(4, 16, 16), text_len=32, steps=10),
    "wan2.2-a14b-480p": dict(config=A14B, latent=(21, 60, 104), text_len=512, steps=4),
    "wan2.2-a14b-720p": dict(config=A14B, latent=(21, 90, 160), text_len=512, steps=4),
}


def _at_least_1(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer of at least 1, got {text!r}")
    return value


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _png_path(text: str) -> str:
    # Checked up front: the plot is written after the whole run.
    parent = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(parent) or os.path.isdir(text):
        raise argparse.ArgumentTypeError(
            f"expected a file path in an existing directory, got {text!r}"
        )
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                        help="model width and latent shape (default: tiny, runs on a CPU)")
    parser.add_argument("--layers", type=_at_least_1, default=None,
                        help="transformer blocks to build (default: 2)")
    parser.add_argument("--steps", type=_at_least_1, default=None,
                        help="denoising steps (default: 10 for tiny, 4 for the A14B presets)")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights, noise and text")
    parser.add_argument("--shift", type=_positive, default=5.0,
                        help="flow-matching sigma shift (default: 5.0)")
    parser.add_argument("--device", default=None,
                        help="cuda, cuda:N or cpu (default: cuda when available)")
    parser.add_argument("--out", type=_png_path, default="fp8dit-demo.png",
                        help="PNG of the per-step error")
    # Set when the demo re-runs itself under TRITON_INTERPRET=1 (no loop if that fails).
    parser.add_argument("--_reexec", action="store_true", help=argparse.SUPPRESS)


def _argv(args) -> list[str]:
    argv = ["--preset", args.preset, "--seed", str(args.seed), "--shift", str(args.shift),
            "--out", args.out, "--device", str(args.device)]
    for flag, value in (("--layers", args.layers), ("--steps", args.steps)):
        if value is not None:
            argv += [flag, str(value)]
    return argv


def _kernels_interpreted() -> bool:
    # Triton decides at decoration time (when fp8dit's kernels are imported) whether a kernel
    # is compiled for a GPU or interpreted, so TRITON_INTERPRET set later changes nothing.
    from ..kernels import attention as kernels

    return type(kernels.attention_fwd_persistent_kernel).__name__ == "InterpretedFunction"


def run(args) -> int:
    import torch

    from .. import env
    from ..api import check_recipe

    try:  # the FP8DIT_* variables the denoising loop reads, before minutes of model building
        check_recipe(None)
        env.default_backend()
        env.plan_cache_size()
    except ValueError as e:
        print(f"fp8dit demo: error: {e}", file=sys.stderr)
        return 2
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(args.device)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        print(f"fp8dit demo: --device: expected cuda, cuda:N or cpu, got {args.device!r}")
        return 2
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"fp8dit demo: --device {args.device} asked for, but torch sees no CUDA device")
        return 1
    if device.type == "cpu" and not _kernels_interpreted():
        if args._reexec:
            print("fp8dit demo: the Triton kernels are still compiled for a GPU under "
                  "TRITON_INTERPRET=1; cannot run them on the CPU")
            return 1
        print("fp8dit demo: no GPU; re-running under TRITON_INTERPRET=1 (Triton's CPU "
              "interpreter, slow, timings are not speed)", flush=True)
        env = dict(os.environ, TRITON_INTERPRET="1")
        # fp8dit.tools.demo, not fp8dit's CLI: the CLI imports every subcommand's module.
        cmd = [sys.executable, "-m", "fp8dit.tools.demo", *_argv(args), "--_reexec"]
        return subprocess.call(cmd, env=env)
    try:
        import diffusers  # noqa: F401
    except ImportError:
        print("fp8dit demo: needs diffusers (pip install 'fp8dit[diffusers]')")
        return 1
    return _demo(args, device)


# ---------------------------------------------------------------------------------------------


def build_model(preset: dict, layers: int, seed: int, device):
    """``WanTransformer3DModel`` of a preset with ``layers`` blocks, seeded random bf16 weights."""
    import torch
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    with torch.device(device):
        model = WanTransformer3DModel(**dict(preset["config"], num_layers=layers))
    # bf16 except the modules diffusers keeps in fp32 when it loads Wan with torch_dtype=bf16.
    keep = set(model._keep_in_fp32_modules or ())
    with torch.no_grad():
        for name, p in model.named_parameters():
            fp32 = any(part in keep for part in name.split("."))
            p.data = p.data.to(torch.float32 if fp32 else torch.bfloat16)
    return model.eval().requires_grad_(False)


def _sigmas(steps: int, shift: float) -> list[float]:
    s = [1.0 - i / steps for i in range(steps + 1)]
    return [shift * x / (1.0 + (shift - 1.0) * x) for x in s]


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = round(width * done / total)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def _denoise(model, noise, text, sigmas, device, label, on_step):
    """Flow-matching Euler loop; ``on_step(i, latents, velocity)``; returns per-step seconds."""
    import torch

    x = noise.clone()
    times = []
    steps = len(sigmas) - 1
    for i in range(steps):
        t = torch.full((x.shape[0],), sigmas[i] * 1000.0, device=device)
        _sync(device)
        t0 = time.perf_counter()
        v = model(x, t, text, return_dict=False)[0]
        _sync(device)
        times.append(time.perf_counter() - t0)
        x = (x.float() + (sigmas[i + 1] - sigmas[i]) * v.float()).to(x.dtype)
        on_step(i, x, v)
        print(f"  {label:7s} step {i + 1:2d}/{steps} {_bar(i + 1, steps)} "
              f"{times[-1] * 1e3:9.1f} ms", flush=True)
    return x, times


def _attention_modules(model):
    for name, module in model.named_modules():
        if hasattr(getattr(module, "processor", None), "_attention_backend"):
            yield name, module


def _label_calls(model, calls, first_forward):
    """Run ``first_forward()`` and return [(layer name, call record)] of the backend calls."""
    starts = []
    hooks = [m.register_forward_pre_hook(lambda mod, a, n=name: starts.append((len(calls), n)))
             for name, m in _attention_modules(model)]
    try:
        first_forward()
    finally:
        for h in hooks:
            h.remove()
    labelled = []
    for j, (start, name) in enumerate(starts):
        end = starts[j + 1][0] if j + 1 < len(starts) else len(calls)
        labelled += [(name, c) for c in calls[start:end]]
    return labelled


def _rel_l2(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _psnr(approx, ref) -> float:
    """PSNR in dB with the reference's value range as peak."""
    a, r = approx.double(), ref.double()
    mse = float((a - r).pow(2).mean())
    peak = float(r.max() - r.min())
    return math.inf if mse == 0 else 10.0 * math.log10(peak * peak / mse)


def _demo(args, device) -> int:
    import torch

    import fp8dit
    from fp8dit.integrations import diffusers as fd
    from fp8dit.testing import error_stats

    preset = PRESETS[args.preset]
    layers = args.layers or 2
    steps = args.steps or preset["steps"]
    cfg = preset["config"]
    frames, height, width = preset["latent"]
    pt, ph, pw = cfg["patch_size"]
    tokens = (frames // pt) * (height // ph) * (width // pw)
    heads, head_dim = cfg["num_attention_heads"], cfg["attention_head_dim"]
    interp = device.type == "cpu"
    print(f"fp8dit demo: {args.preset}, WanTransformer3DModel with {layers} of "
          f"{cfg['num_layers']} blocks, {heads} heads x {head_dim}, seeded random weights")
    print(f"  latent {cfg['in_channels']}x{frames}x{height}x{width} -> {tokens} tokens; "
          f"text {preset['text_len']} tokens; {steps} Euler steps (shift {args.shift}); "
          f"bf16 on {device}{' (Triton interpreter)' if interp else ''}")

    fd.register()
    t0 = time.perf_counter()
    model = build_model(preset, layers, args.seed, device)
    gen = torch.Generator(device=device).manual_seed(args.seed + 1)
    shape = (1, cfg["in_channels"], frames, height, width)
    noise = torch.randn(shape, generator=gen, device=device).to(torch.bfloat16)
    text = torch.randn((1, preset["text_len"], cfg["text_dim"]), generator=gen, device=device)
    text = text.to(torch.bfloat16)
    sigmas = _sigmas(steps, args.shift)
    print(f"  model built in {time.perf_counter() - t0:.1f} s")

    t_first = torch.full((1,), sigmas[0] * 1000.0, device=device)
    ref_steps = []
    with torch.no_grad():
        # Warm-up forward per backend (plans, Triton compilation), not timed.
        fd.disable(model)
        model(noise, t_first, text, return_dict=False)
        x_ref, t_ref = _denoise(model, noise, text, sigmas, device, "native",
                                lambda i, x, v: ref_steps.append((x, v)))

        fd.enable(model)
        with fd.record_calls() as calls:
            labelled = _label_calls(
                model, calls, lambda: model(noise, t_first, text, return_dict=False))
        lat_err, vel_err = [], []

        def compare(i, x, v):
            lat_err.append(_rel_l2(x, ref_steps[i][0]))
            vel_err.append(_rel_l2(v, ref_steps[i][1]))

        x_fp8, t_fp8 = _denoise(model, noise, text, sigmas, device, "fp8dit", compare)
        fd.disable(model)

    print("\nattention layers, fp8dit run (the native run uses torch SDPA in bf16 everywhere):")
    for name, call in labelled:
        kind = "self " if call["q"][1] == call["k"][1] else "cross"
        print(f"  {name:16s} {kind} q {'x'.join(map(str, call['q']))} keys {call['k'][1]:>6d}"
              f"  -> {call['backend']:4s}  {call['reason']}"
              + (f" [{call['kernel']} kernel]" if call.get("kernel") else "")
              + (f" [rotary embedding {call['rotary']}]" if call.get("rotary") else ""))

    print("\nper step (after one untimed warm-up forward each)")
    print("  step      native ms   fp8dit ms   latent rel-L2   velocity rel-L2")
    for i in range(steps):
        print(f"  {i + 1:3d}      {t_ref[i] * 1e3:11.1f} {t_fp8[i] * 1e3:11.1f}"
              f"   {lat_err[i]:13.3e}   {vel_err[i]:15.3e}")
    mean_ref, mean_fp8 = sum(t_ref) / steps, sum(t_fp8) / steps
    speed = f"speed-up {mean_ref / mean_fp8:.2f}x" if not interp else (
        "CPU interpreter timings: not a speed measurement")
    print(f"  mean     {mean_ref * 1e3:11.1f} {mean_fp8 * 1e3:11.1f}   ({speed})")

    stats = error_stats(x_fp8, x_ref)
    print(f"\nfinal latents, fp8dit vs native: cos {stats.cos:.6f}, "
          f"PSNR {_psnr(x_fp8, x_ref):.1f} dB, rel-L1 {stats.rel_l1:.4f}"
          f"{'  NaN!' if stats.nan else ''}")
    fp8_layers = sum(1 for _, c in labelled if c["backend"] == "fp8")
    print(f"  {fp8_layers}/{len(labelled)} attention calls ran FP8; fp8dit {fp8dit.__version__}")
    if fp8_layers == 0 and not interp:
        print("  (these sequences are too short for FP8 to pay on this GPU, so every call ran "
              "SDPA; try --preset wan2.2-a14b-720p --layers 2)")

    written = write_plot(args.out, lat_err, vel_err, title=f"fp8dit vs native, {args.preset}")
    if written:
        print(f"  per-step error plot: {args.out} ({written})")
    return 0 if not stats.nan else 1


# ---------------------------------------------------------------------------------------------
# The plot: matplotlib when installed (extra "plot"), else a plain PNG written with zlib.
# ---------------------------------------------------------------------------------------------

_COLORS = ((31, 119, 180), (255, 127, 14))  # latent, velocity


def write_plot(path: str, latent_err, velocity_err, title: str = "") -> str:
    """Write the per-step error PNG; returns what drew it ("matplotlib" or "plain PNG")."""
    try:
        import matplotlib
    except ImportError:
        print("  matplotlib is not installed (pip install 'fp8dit[plot]'): writing a plain bar "
              "chart without labels (blue: latent rel-L2, orange: velocity rel-L2, log scale)")
        _write_bar_png(path, [latent_err, velocity_err])
        return "plain PNG"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = range(1, len(latent_err) + 1)
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    ax.semilogy(steps, latent_err, "o-", label="latents", color=[c / 255 for c in _COLORS[0]])
    ax.semilogy(steps, velocity_err, "s-", label="model output (velocity)",
                color=[c / 255 for c in _COLORS[1]])
    ax.set_xlabel("denoising step")
    ax.set_ylabel("relative L2 error vs bf16")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return "matplotlib"


def _write_bar_png(path: str, series, width: int = 640, height: int = 360) -> None:
    """Grouped bars (log10 scale over the data's range) on white, axes in grey."""
    img = [bytearray(b"\xff" * (3 * width)) for _ in range(height)]

    def fill(x0, y0, x1, y1, rgb):
        for y in range(max(0, y0), min(height, y1)):
            row = img[y]
            for x in range(max(0, x0), min(width, x1)):
                row[3 * x:3 * x + 3] = bytes(rgb)

    margin = 30
    fill(margin, height - margin, width - margin, height - margin + 2, (90, 90, 90))
    fill(margin - 2, margin, margin, height - margin, (90, 90, 90))
    values = [v for s in series for v in s if v > 0 and math.isfinite(v)]
    if values:
        lo = math.log10(min(values)) - 0.5
        hi = math.log10(max(values)) + 0.1
        n = max(len(s) for s in series)
        slot = (width - 2 * margin) / n
        bar = max(1, int(slot * 0.8 / len(series)))
        for k, s in enumerate(series):
            for i, v in enumerate(s):
                if not (v > 0 and math.isfinite(v)):
                    continue
                frac = (math.log10(v) - lo) / (hi - lo)
                top = height - margin - int(frac * (height - 2 * margin))
                x0 = margin + int(i * slot + slot * 0.1) + k * bar
                fill(x0, top, x0 + bar, height - margin, _COLORS[k % len(_COLORS)])
    raw = b"".join(b"\x00" + bytes(row) for row in img)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    png = (b"\x89PNG\r\n\x1a\n"
           + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    with open(path, "wb") as f:
        f.write(png)


def main(argv: list[str] | None = None) -> int:
    """``python -m fp8dit.tools.demo [options]``, the same as ``fp8dit demo [options]``."""
    parser = argparse.ArgumentParser(prog="fp8dit demo", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return int(run(parser.parse_args(argv)) or 0)


if __name__ == "__main__":
    sys.exit(main())
