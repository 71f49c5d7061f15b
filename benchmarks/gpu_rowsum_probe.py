"""One H200 call: where the row-sum dot's sums go wrong (run s10-2 found them wrong).

    python3 benchmarks/gpu_rowsum_probe.py [--parts probe] [--out F]

The row-sum dot changes nothing but the normalizer: with the same P and V the default's output
divided by the row-sum variant's, row by row, is l_dot / l_fadd (the dot's row sum over the
FADD row sum). ``zeros``: q = 0, so every score is 0 and every P is exactly 256 (2^P_SHIFT):
the ratio then reads the ones tile as the dot sees it. Lengths around the dot's k-steps of 32
keys, its 128-key halves and the 256-key block; tile widths N = 8, 16, 64.
"""

from __future__ import annotations

import functools
import os
import sys

import torch

import fp8dit
from fp8dit import launch
from fp8dit.testing import make_qkv

sys.path.insert(0, os.path.dirname(__file__))
import gpu_gluon  # noqa: E402
from gpu_gluon import record  # noqa: E402

DEFAULT_TILES = {dp: dict(t) for dp, t in launch.WS_TILES.items()}
TILINGS = {
    "default": ("gluon-ws", DEFAULT_TILES),
    **{f"rowsum{n}": ("gluon-ws", {dp: {**t, "sm90_p_regs": True, "sm90_rowsum_dot": n}
                                   for dp, t in DEFAULT_TILES.items()})
       for n in (8, 16, 64)},
    # the row-sum dots issued after PV's wait and waited for alone (ABLATE_MISC 8)
    "rowsum8sync": ("gluon-ws", {dp: {**t, "sm90_p_regs": True, "sm90_rowsum_dot": 8,
                                      "sm90_ablate_misc": 8}
                                 for dp, t in DEFAULT_TILES.items()}),
    "triton": ("triton", DEFAULT_TILES),
}
use = functools.partial(gpu_gluon.use_tiling, TILINGS)


def _ratio(o_def, o_var):
    """Per row: median over columns of o_def / o_var (columns where both are not tiny)."""
    a, b = o_def.float()[0], o_var.float()[0]  # [S, H, D]
    ok = (a.abs() > 1e-3) & (b.abs() > 1e-3)
    r = torch.where(ok, a / b, torch.full_like(a, float("nan")))
    return r.nanmedian(dim=-1).values  # [S, H]


def part_probe(lengths=(32, 33, 64, 65, 96, 128, 129, 160, 256, 257, 512, 1000, 4096),
               names=("rowsum8", "rowsum16", "rowsum64")):
    for D in (128, 64):
        for S in lengths:
            for fam in ("zeros", "normal"):
                q, k, v = make_qkv(1, 2, S, D, device="cuda", seed=S)
                if fam == "zeros":
                    q = torch.zeros_like(q)
                use("default")
                o_def = fp8dit.attention(q, k, v, backend="fp8")
                rec = {}
                for n in names:
                    use(n)
                    try:
                        o = fp8dit.attention(q, k, v, backend="fp8")
                        r = _ratio(o_def, o)
                        fin = r[torch.isfinite(r)]
                        rec[n] = dict(
                            nan_rows=int((~torch.isfinite(r)).sum()),
                            min=fin.min().item() if fin.numel() else None,
                            median=fin.median().item() if fin.numel() else None,
                            max=fin.max().item() if fin.numel() else None,
                            first_rows=[round(x, 4) for x in r[:4, 0].tolist()],
                            equal=bool(torch.equal(o, o_def)))
                    except Exception as e:  # noqa: BLE001 - a failure is a result
                        rec[n] = dict(error=f"{type(e).__name__}: {e}"[:300])
                record(part="probe", D=D, S=S, family=fam, **rec)
    use("triton")


def part_sync():
    part_probe((32, 256, 4096), ("rowsum8", "rowsum8sync"))


def main() -> int:
    return gpu_gluon.run_parts(globals(), "probe", after_part=functools.partial(use, "triton"))


if __name__ == "__main__":
    raise SystemExit(main())
