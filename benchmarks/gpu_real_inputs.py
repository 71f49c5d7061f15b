"""fp8dit and SDPA cuDNN on the q, k, v a Wan2.2-A14B forward really makes, against randn.

Run s13-1 found fp8dit's attention kernel ~3.5% slower per call inside the Wan forward (121 ms)
than in ``fp8dit bench`` on randn inputs of the same shape (117 ms), while cuDNN took the same
208 ms in both. This captures the self-attention inputs of a 2-block 720p forward (seeded random
weights, as ``bench_wan_forward.py``) and times, in rounds so drift hits every set alike: the
captured tensors, randn of the same shape (also in [B, H, S, D] memory, the bench's layout),
and the two mixed (captured q with randn k/v, and the
reverse), per kernel (torch.profiler). Run it under ``nvidia-smi --query-gpu=... -lms 100`` to
see clocks and power next to the printed phase times.

    python benchmarks/gpu_real_inputs.py --rounds 3 --out results.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_wan_forward import forward_inputs, sdpa_context, time_ms  # noqa: E402
from gpu_forward_profile import kernel_times  # noqa: E402
from gpu_gluon import record, record_env, write_rows  # noqa: E402


def capture_self_attention(layers: int) -> list[tuple]:
    """(q, k, v) NHD of each FP8 self-attention call of one forward, GPU clones."""
    import fp8dit.api as api
    from fp8dit.demo import PRESETS, build_model
    from fp8dit.integrations import diffusers as fd

    preset = PRESETS["wan2.2-a14b-720p"]
    model = build_model(preset, layers, 0, torch.device("cuda"))
    inputs = forward_inputs(preset, 1, torch.device("cuda"))
    fd.register()
    fd.enable(model)
    seen = []
    inner = api.fp8_attention_fwd

    def spy(q, k, v, **kw):
        seen.append((q.clone(), k.clone(), v.clone()))
        return inner(q, k, v, **kw)

    api.fp8_attention_fwd = spy
    try:
        with torch.no_grad():
            model(**inputs, return_dict=False)
    finally:
        api.fp8_attention_fwd = inner
        fd.disable(model)
    del model
    torch.cuda.empty_cache()
    return seen


def describe(t: torch.Tensor) -> dict:
    f = t.float()
    return dict(std=round(f.std().item(), 4), absmax=round(f.abs().max().item(), 2),
                chan_mean_absmax=round(f.mean(dim=(0, 1)).abs().max().item(), 3))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_real_inputs: needs a CUDA GPU; torch sees none (nothing measured)")
        return 2
    import fp8dit
    from fp8dit.sdpa import sdpa_attention

    record_env()
    captured = capture_self_attention(args.layers)
    q0, k0, v0 = captured[0]
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn_like(t):
        return torch.randn(t.shape, generator=g, device=t.device).to(t.dtype)

    rq, rk, rv = randn_like(q0), randn_like(k0), randn_like(v0)
    sets = {"randn": (rq, rk, rv)}
    # fp8dit bench's layout: [B, H, S, D] memory passed as NHD views (out follows q's strides)
    sets["randn-hnd"] = tuple(t.transpose(1, 2).contiguous().transpose(1, 2)
                              for t in (rq, rk, rv))
    for i, (q, k, v) in enumerate(captured):
        sets[f"wan-block{i}"] = (q, k, v)
        for name, t in (("q", q), ("k", k), ("v", v)):
            record(part="stats", set=f"wan-block{i}", tensor=name, **describe(t))
    sets["wan-q+randn-kv"] = (q0, rk, rv)
    sets["randn-q+wan-kv"] = (rq, k0, v0)
    sets["wan-qk+randn-v"] = (q0, k0, rv)
    for name, t in (("q", rq), ("k", rk), ("v", rv)):
        record(part="stats", set="randn", tensor=name, **describe(t))

    def fp8(q, k, v):
        return fp8dit.attention(q, k, v, backend="fp8")

    def cudnn(q, k, v):
        with sdpa_context("cudnn"):
            return sdpa_attention(q, k, v, layout="NHD", scale=None, is_causal=False,
                                  return_lse=False)[0]

    t0 = time.time()
    record(part="clock", t0_unix=t0,
           t0_local=time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t0)))
    for r in range(args.rounds):
        for backend, fn in (("fp8dit", fp8), ("sdpa-cudnn", cudnn)):
            for name, (q, k, v) in sets.items():
                if backend == "sdpa-cudnn" and name not in ("randn", "randn-hnd", "wan-block0"):
                    continue
                start = time.time() - t0
                ms = time_ms(lambda q=q, k=k, v=v, fn=fn: fn(q, k, v), 2, args.repeats)[0]
                per, _ = kernel_times(lambda q=q, k=k, v=v, fn=fn: fn(q, k, v), 2)
                attn = sum(t for kname, t in per.items()
                           if "attention_fwd" in kname or "sdpa" in kname)
                record(part="time", round=r, backend=backend, set=name, ms=round(ms, 3),
                       attention_kernel_ms=round(attn, 3), t_start=round(start, 1),
                       t_end=round(time.time() - t0, 1))
    write_rows(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
