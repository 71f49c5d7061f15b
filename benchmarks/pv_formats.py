"""P·V formats in emulation: the tables of docs/accuracy.md ("P·V formats, in emulation").

Every format of :data:`fp8dit.testing.PV_FORMATS` (or ``--formats``) on every case of the
stress suite (:data:`fp8dit.testing.STRESS_SUITE`, plus ``family:dit``, the DiT-like family of
:func:`fp8dit.testing.make_qkv`), through :func:`fp8dit.testing.attention_blockwise_emulated`
(the kernels' blockwise online softmax, 256-key blocks, in torch, float64 sums), with Q and K
rounded per ``--qk``: ``exact`` (the P·V rounding alone), ``default`` (``int8qk-fp8pv``),
``bal`` (``int8qk-fp8pv-bal``) or ``x2`` (``int8x2qk-fp8pv``, two int8 terms each). Against
:func:`fp8dit.testing.attention_ref` (float64): rel-L1, cos, mean |LSE error|. CPU only.

Prints, per Q·K rounding: each format's worst case per metric and the cases it leaves outside
the bounds below, the worst per kind of case, then rel-L1 / mean LSE error per case and format
(markdown). ``--json`` writes every number; ``--from-json`` prints the tables of such a file.

Bounds (this comparison's): rel-L1 <= 0.025 on the i.i.d. normal cases, <= 0.03 on every other
one; cos >= 0.999; mean |LSE error| <= 0.02.

    python benchmarks/pv_formats.py            # S=2048, H=2, 3 Q·K roundings: ~45 min, 2 cores
    python benchmarks/pv_formats.py --S 8192 --H 4 --rows 512 --cases normal,fa3,sinks \\
        --formats fp8,u8-block-vrot-b-f16sum --qk bal
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from fp8dit.recipes import RECIPES
from fp8dit.testing import (
    PV_FORMATS,
    STRESS_CASES,
    STRESS_NORMAL,
    attention_blockwise_emulated,
    attention_ref,
    error_stats,
    make_qkv,
    make_stress_qkv,
)

QK = {"exact": ("int8qk-fp8pv", True), "default": ("int8qk-fp8pv", False),
      "bal": ("int8qk-fp8pv-bal", False), "x2": ("int8x2qk-fp8pv", False)}
BOUNDS = {"rel_l1_normal": 0.025, "rel_l1": 0.03, "cos": 0.999, "lse_mean": 0.02}
EXTRA = ("family:dit",)


def draw(case: str, H: int, S: int, D: int, seed: int):
    if case.startswith("family:"):
        return make_qkv(1, H, S, D, family=case.split(":", 1)[1], seed=seed)
    return make_stress_qkv(case, 1, H, S, D, seed=seed)


def violations(case: str, m: dict) -> list[str]:
    rel = BOUNDS["rel_l1_normal"] if case in STRESS_NORMAL else BOUNDS["rel_l1"]
    out = []
    if not m["rel_l1"] <= rel:
        out.append("rel-L1")
    if not m["cos"] >= BOUNDS["cos"]:
        out.append("cos")
    if not m["lse_mean"] <= BOUNDS["lse_mean"]:
        out.append("LSE")
    return out


def measure(cases, formats, qks, H, S, D, seed, n_rows, log=sys.stderr) -> dict:
    """{qk: {format: {case: metrics}}}."""
    res = {qk: {f: {} for f in formats} for qk in qks}
    for case in cases:
        t0 = time.time()
        q, k, v = draw(case, H, S, D, seed)
        rows = None
        if n_rows and n_rows < q.shape[1]:
            rows = torch.linspace(0, q.shape[1] - 1, n_rows).round().long()
        ref, ref_lse = attention_ref(q if rows is None else q[:, rows], k, v, return_lse=True)
        for qk in qks:
            recipe, exact = QK[qk]
            for f in formats:
                out, lse = attention_blockwise_emulated(q, k, v, RECIPES[recipe], PV_FORMATS[f],
                                                        exact_qk=exact, rows=rows)
                st = error_stats(out, ref)
                res[qk][f][case] = dict(rel_l1=st.rel_l1, cos=st.cos, rmse=st.rmse,
                                        lse_mean=float((lse - ref_lse).abs().mean()))
        print(f"{case}: {time.time() - t0:.0f} s", file=log, flush=True)
    return res


def summary(res_qk: dict, cases) -> list[str]:
    lines = ["| format | worst rel-L1 | min cos | worst LSE mean | fa3 RMSE | cases outside |",
             "|---|---|---|---|---|---|"]
    for f, per in res_qk.items():
        wr = max(cases, key=lambda c: per[c]["rel_l1"])
        wc = min(cases, key=lambda c: per[c]["cos"])
        wl = max(cases, key=lambda c: per[c]["lse_mean"])
        bad = [c for c in cases if violations(c, per[c])]
        fa3 = f"{per['fa3']['rmse']:.2e}" if "fa3" in per else "-"
        shown = ", ".join(f"{c} ({'/'.join(violations(c, per[c]))})" for c in bad[:4])
        lines.append(f"| {f} | {per[wr]['rel_l1']:.4f} ({wr}) | {per[wc]['cos']:.5f} ({wc}) | "
                     f"{per[wl]['lse_mean']:.4f} ({wl}) | {fa3} | "
                     f"{len(bad)} of {len(cases)}{': ' + shown if bad else ''}"
                     f"{', ...' if len(bad) > 4 else ''} |")
    return lines


def kind(case: str) -> str:
    return STRESS_CASES[case].kind if case in STRESS_CASES else case


def per_kind(res_qk: dict, cases) -> list[str]:
    """Per format, the worst rel-L1 and worst mean LSE error over each kind of case."""
    kinds = list(dict.fromkeys(kind(c) for c in cases))
    groups = {k: [c for c in cases if kind(c) == k] for k in kinds}
    lines = ["| format | " + " | ".join(f"{k} ({len(g)})" for k, g in groups.items()) + " |",
             "|---" * (len(kinds) + 1) + "|"]
    for f, per in res_qk.items():
        cells = []
        for g in groups.values():
            rel = max(per[c]["rel_l1"] for c in g)
            lse = max(per[c]["lse_mean"] for c in g)
            mark = " *" if any(violations(c, per[c]) for c in g) else ""
            cells.append(f"{rel:.4f} / {lse:.3f}{mark}")
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    return lines


def per_case(res_qk: dict, cases) -> list[str]:
    formats = list(res_qk)
    lines = ["| case | " + " | ".join(formats) + " |", "|---" * (len(formats) + 1) + "|"]
    for c in cases:
        cells = []
        for f in formats:
            m = res_qk[f][c]
            mark = " *" if violations(c, m) else ""
            cells.append(f"{m['rel_l1']:.4f} / {m['lse_mean']:.3f}{mark}")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--S", type=int, default=2048)
    p.add_argument("--H", type=int, default=2)
    p.add_argument("--D", type=int, default=128, help="head dim (cases that set theirs keep it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rows", type=int, default=0,
                   help="measure this many query rows, evenly spaced (0: all)")
    p.add_argument("--cases", default="all",
                   help="comma-separated stress cases and family:NAME (default: all)")
    p.add_argument("--formats", default="all", help="comma-separated PV_FORMATS names")
    p.add_argument("--qk", default="exact,default,bal",
                   help=f"comma-separated, of {', '.join(QK)}")
    p.add_argument("--json", help="write every number here")
    p.add_argument("--from-json", help="print the tables of a --json file (measures nothing)")
    a = p.parse_args(argv)
    if a.from_json:
        with open(a.from_json) as fh:
            saved = json.load(fh)
        for k, v in saved["config"].items():
            if k not in ("json", "from_json"):
                setattr(a, k, v)
        report(a, saved["results"])
        return 0
    cases = list(STRESS_CASES) + list(EXTRA) if a.cases == "all" else a.cases.split(",")
    formats = list(PV_FORMATS) if a.formats == "all" else a.formats.split(",")
    qks = a.qk.split(",")
    for f in formats:
        if f not in PV_FORMATS:
            p.error(f"--formats: {f!r} is not one of {', '.join(PV_FORMATS)}")
    for qk in qks:
        if qk not in QK:
            p.error(f"--qk: {qk!r} is not one of {', '.join(QK)}")
    res = measure(cases, formats, qks, a.H, a.S, a.D, a.seed, a.rows)
    report(a, res)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(config=vars(a), torch=torch.__version__, bounds=BOUNDS, results=res),
                      fh, indent=1)
    return 0


def report(a, res: dict) -> None:
    qks = list(res)
    cases = list(next(iter(next(iter(res.values())).values())))
    head = (f"B=1 H={a.H} S={a.S} D={a.D} (unless the case sets D or GQA), seed {a.seed}"
            f"{f', {a.rows} query rows' if a.rows else ''}; torch {torch.__version__}, CPU")
    for qk in qks:
        recipe, exact = QK[qk]
        what = "Q, K exact" if exact else f"Q, K as {recipe}"
        print(f"\n## {what}: {head}\n")
        print("\n".join(summary(res[qk], cases)))
        print(f"\nworst rel-L1 / worst mean |LSE error| per kind of case ({what}; *: a case "
              "outside a bound)\n")
        print("\n".join(per_kind(res[qk], cases)))
        print(f"\nrel-L1 / mean |LSE error| ({what}; *: outside a bound)\n")
        print("\n".join(per_case(res[qk], cases)))


if __name__ == "__main__":
    sys.exit(main())
