"""Determinism, CUDA-graph replay and torch.compile for each attention kernel, one H200 call.

    python3 benchmarks/gpu_kernel_reliability.py [--kernels triton,gluon-ws] [--seq 40000]
    FP8DIT_KERNEL=gluon-ws compute-sanitizer --tool racecheck \
        python3 benchmarks/gpu_sanitize.py --quick

Since ``FP8DIT_KERNEL=auto`` sends long D=128 calls to the warp-specialized Gluon kernel, the
reliability checks of the core (benchmarks/gpu_core_check.py, at 3,000 tokens: the Triton
kernel) no longer cover the default path of the DiT shapes. Per kernel, at a length where
``auto`` picks the Gluon kernel: 10 runs bitwise equal (with and without a forced 3-way
split-KV), a CUDA graph captured after warm-up replays fresh inputs bit-exactly, a
``torch.compile(fullgraph=True)`` call equals eager, and the output is within the accuracy
bounds against an fp64 reference on sampled rows. Exit status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

import fp8dit
from fp8dit import launch
from fp8dit.testing import attention_ref_rows, error_stats, make_qkv


def check_kernel(name: str, S: int, H: int) -> dict:
    os.environ["FP8DIT_KERNEL"] = name
    q, k, v = make_qkv(1, H, S, 128, device="cuda", seed=11)
    plan, _ = launch.plan_for([S], [S], varlen=False, num_heads=H, num_kv_heads=H, head_dim=128,
                              is_causal=False, device=q.device)
    ran = launch.use_gluon_sm90(plan, fp8dit.recipes.get_recipe(None), q.device) or "triton"
    res = {"kernel": name, "ran": ran, "S": S, "H": H}
    for splits in (None, 3):
        outs = [fp8dit.attention(q, k, v, backend="fp8", num_splits=splits) for _ in range(10)]
        res[f"deterministic_splits_{splits}"] = all(torch.equal(outs[0], o) for o in outs[1:])
        del outs
    rows = torch.randperm(S, device="cuda")[:512]
    ref, _ = attention_ref_rows(q, k, v, rows)
    st = error_stats(fp8dit.attention(q, k, v, backend="fp8")[0, rows], ref)
    res["rel_l1"], res["cos"] = st.rel_l1, st.cos
    res["accurate"] = st.rel_l1 <= 0.045 and st.cos >= 0.999 and not st.nan
    static_out = fp8dit.attention(q, k, v, backend="fp8")  # warm-up: plan and compile
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = fp8dit.attention(q, k, v, backend="fp8")
    q2, k2, v2 = make_qkv(1, H, S, 128, device="cuda", seed=12)
    q.copy_(q2)
    k.copy_(k2)
    v.copy_(v2)
    g.replay()
    torch.cuda.synchronize()
    res["cuda_graph_replay_equal"] = torch.equal(static_out,
                                                 fp8dit.attention(q, k, v, backend="fp8"))
    compiled = torch.compile(lambda a, b, c: fp8dit.attention(a, b, c, backend="fp8") * 1.0,
                             fullgraph=True)
    res["compile_fullgraph_equal"] = torch.equal(
        compiled(q, k, v), fp8dit.attention(q, k, v, backend="fp8") * 1.0)
    torch._dynamo.reset()
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", default="triton,gluon-ws")
    ap.add_argument("--seq", type=int, default=40000,
                    help="tokens; at least launch.WS_MIN_KV_TOKENS so auto picks the Gluon one")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_kernel_reliability: no CUDA GPU here")
        return 1
    results, bad = [], 0
    for name in a.kernels.split(","):
        try:
            res = check_kernel(name, a.seq, a.heads)
        except Exception as e:  # noqa: BLE001 - a failure is a result
            res = {"kernel": name, "error": f"{type(e).__name__}: {e}"[:400]}
        checks = [v for key, v in res.items() if isinstance(v, bool)]
        res["ok"] = "error" not in res and all(checks)
        bad += not res["ok"]
        results.append(res)
        print(json.dumps(res), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
