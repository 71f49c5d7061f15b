"""One H200 call: one step of the row-sum dot, element by element (session 11).

    python3 benchmarks/gpu_rowsum_dump.py [--out-dir DIR]

Runs the warp-specialized kernel with ``sm90_rowsum_dot`` = 8 and ``sm90_debug_buf`` set: the
first step of program 0's first work item (warpgroup 0, 64 rows) writes its row-sum dot result
l_blk [64, 8], the same two dots waited for one at a time, an N=8 dot of the same P with V^T's
first 8 rows, the PV accumulator [64, D] and both halves' fp8 P (as fp32). Prints per case how
l_blk compares with the sum of the dumped P (what the dot should give) and how the narrow V dot
compares with PV's first 8 columns; ``--out-dir`` keeps the dumps (``torch.save``) for a closer
look on a CPU.
"""

from __future__ import annotations

import argparse
import os

import torch

import fp8dit
from fp8dit import launch
from fp8dit.testing import make_qkv


def _stats(x):
    x = x[torch.isfinite(x)]
    if x.numel() == 0:
        return "all non-finite"
    return f"min {x.min().item():.4f} med {x.median().item():.4f} max {x.max().item():.4f}"


def dump_case(D, S, family, seed=0):
    bm, ln = 64, 8
    buf = torch.full((4 * bm * ln + bm * D + 2 * bm * 128,), float("nan"), device="cuda")
    tiles = {dp: dict(t) for dp, t in launch.WS_TILES.items()}
    saved = {dp: dict(t) for dp, t in launch.WS_TILES.items()}
    tiles[D].update(sm90_p_regs=True, sm90_rowsum_dot=8, sm90_debug_buf=buf)
    q, k, v = make_qkv(1, 2, S, D, device="cuda", seed=seed)
    if family == "zeros":
        q = torch.zeros_like(q)
    os.environ["FP8DIT_KERNEL"] = "gluon-ws"
    launch.WS_TILES.clear()
    launch.WS_TILES.update(tiles)
    try:
        fp8dit.attention(q, k, v, backend="fp8")
        torch.cuda.synchronize()
    finally:
        launch.WS_TILES.clear()
        launch.WS_TILES.update(saved)
    n = bm * ln
    d = dict(l_blk=buf[:n].view(bm, ln), l_a=buf[n:2 * n].view(bm, ln),
             l_b=buf[2 * n:3 * n].view(bm, ln), v8=buf[3 * n:4 * n].view(bm, ln))
    o = 4 * n
    d["acc"] = buf[o:o + bm * D].view(bm, D)
    o += bm * D
    d["pa"] = buf[o:o + bm * 128].view(bm, 128)
    d["pb"] = buf[o + bm * 128:o + 2 * bm * 128].view(bm, 128)
    d = {key: val.cpu() for key, val in d.items()}
    sa, sb = d["pa"].double().sum(1), d["pb"].double().sum(1)
    s = sa + sb
    ok = s > 0
    print(f"D={D} S={S} {family}: dumped={bool(torch.isfinite(d['pa']).all())} "
          f"rows with P {int(ok.sum())}/64; columns of l_blk equal: "
          f"{bool((d['l_blk'] == d['l_blk'][:, :1]).all())}", flush=True)
    if ok.any():
        print(f"  l_blk / sum(P8):      {_stats(d['l_blk'][ok, 0].double() / s[ok])}")
        print(f"  l_a alone / sum(Pa):  {_stats(d['l_a'][ok, 0].double() / sa[ok])}")
        print(f"  l_b alone / sum(Pb):  "
              f"{_stats(d['l_b'][sb > 0, 0].double() / sb[sb > 0]) if (sb > 0).any() else '-'}")
        small = torch.cat([d["pa"], d["pb"]], 1).double()
        lt = (small * (small < 128)).sum(1)
        print(f"  sum(P8 < 128)/sum(P8): {_stats(lt[ok] / s[ok])}")
        print(f"  P8 max per row:        {_stats(small.max(1).values)}")
        acc8 = d["acc"][:, :8]
        err = (d["v8"] - acc8).abs().max().item()
        print(f"  N=8 V dot vs PV cols 0-7: max|diff| {err:.4g} (max |acc| "
              f"{acc8.abs().max().item():.4g})", flush=True)
        print(f"  first rows l_blk {[round(x, 2) for x in d['l_blk'][:4, 0].tolist()]} "
              f"sum(P8) {[round(x, 2) for x in s[:4].tolist()]}")
    return d


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default="")
    a = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    dumps = {}
    for D in (128, 64):
        for S, fam in ((32, "zeros"), (32, "normal"), (256, "normal"), (1000, "normal")):
            try:
                dumps[f"D{D}-S{S}-{fam}"] = dump_case(D, S, fam)
            except Exception as e:  # noqa: BLE001 - a failure is a result
                print(f"D={D} S={S} {fam}: {type(e).__name__}: {str(e)[:400]}", flush=True)
    if a.out_dir:
        torch.save(dumps, os.path.join(a.out_dir, "rowsum_dump.pt"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
