"""Error against sequence length (8k -> 200k tokens) vs fp64 on sampled query rows.

    python3 benchmarks/gpu_length_drift.py
"""

import sys

import torch

import fp8dit
from fp8dit.testing import attention_ref_rows, error_stats, make_qkv


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_length_drift: no CUDA GPU here")
        return 1
    D = 128
    for family in ("normal", "dit"):
        for S in (8192, 32768, 200000):
            q, k, v = make_qkv(1, 2, S, D, device="cuda", family=family, seed=S)
            out, lse = fp8dit.attention(q, k, v, backend="fp8", return_lse=True)
            rows = torch.randperm(S, device="cuda")[:1024]
            ref, lse_ref = attention_ref_rows(q, k, v, rows)
            st = error_stats(out[0, rows], ref)
            lerr = (lse[0][:, rows].double() - lse_ref).abs().max().item()
            print(f"{family:6s} S={S:6d} {st} lse_max_err={lerr:.4f}", flush=True)
            del q, k, v, out
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
