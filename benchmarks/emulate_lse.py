"""CPU emulation: which QK quantization would bring the DiT-like LSE within 0.01 of fp64?

    python3 benchmarks/emulate_lse.py [--seq 4096] [--heads 2]

The accuracy issue asks for the LSE within 0.01; the default recipe (int8 Q per token, K
smoothed and int8 per 128-token block) is off by up to ~0.5 on the DiT-like family, whose
scores reach ~100. Computes, in float64, the LSE from Q and K as each candidate rounds them
(K smoothing's shift added back exactly, as the kernels do) and prints the max and mean error
against the exact LSE. "Two-term" stores x as hi + lo, both int8 on the same grid as hi, the
second with its own scale: three int8 dots per block (hi*hi, hi*lo, lo*hi) instead of one.
"""

from __future__ import annotations

import argparse
import math

import torch

from fp8dit.testing import make_qkv


def int8_rows(x):
    s = x.abs().amax(-1, keepdim=True).clamp_min(1e-30) / 127
    return torch.round(x / s).clamp(-127, 127) * s


def int8_blocks(x, blk=128):
    h, n, d = x.shape
    xb = x.view(h, n // blk, blk, d)
    s = xb.abs().amax((-1, -2), keepdim=True).clamp_min(1e-30) / 127
    return (torch.round(xb / s).clamp(-127, 127) * s).view(h, n, d)


def two_term(rounder, x):
    hi = rounder(x)
    return hi + rounder(x - hi)


def hadamard(n):
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    D = 128
    q, k, _ = make_qkv(1, a.heads, a.seq, D, family="dit", seed=a.seed)
    q, k = (t.double()[0].transpose(0, 1) for t in (q, k))  # [H, S, D]
    scale = 1 / math.sqrt(D)

    def lse(qq, kk):
        return torch.logsumexp((qq @ kk.transpose(-1, -2)) * scale, -1)

    ref = lse(q, k)
    k_mean = k.mean(1, keepdim=True)
    ks = k - k_mean
    shift = (q @ k_mean.transpose(-1, -2)).squeeze(-1) * scale  # exact, as in the kernels
    rot = hadamard(D)
    cases = {
        "default: Q int8/token, K int8/block": (int8_rows(q), int8_blocks(ks)),
        "K int8 per token": (int8_rows(q), int8_rows(ks)),
        "Q two-term": (two_term(int8_rows, q), int8_blocks(ks)),
        "K two-term": (int8_rows(q), two_term(int8_blocks, ks)),
        "Q and K two-term": (two_term(int8_rows, q), two_term(int8_blocks, ks)),
        "Hadamard-rotated, default": (int8_rows(q @ rot), int8_blocks(ks @ rot)),
        "Hadamard-rotated, Q and K two-term": (two_term(int8_rows, q @ rot),
                                               two_term(int8_blocks, ks @ rot)),
        "bf16 Q and smoothed K (no int8)": (q.float().bfloat16().double(),
                                            ks.float().bfloat16().double()),
    }
    print(f"DiT-like family, {a.heads} heads x {a.seq} tokens, D={D}: |LSE - fp64 LSE|")
    for name, (qq, kk) in cases.items():
        err = (lse(qq, kk) + shift - ref).abs()
        print(f"  {name:40s} max {err.max():.4f}  mean {err.mean():.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
