"""Decide from ``gpu_rowsum_dot.py``'s rows where the row-sum dot may become the default.

    python3 benchmarks/gate_rowsum.py rowsum.json   # prints a --tiles spec for with_tiles.py

Per padded head dim (128: Wan, HunyuanVideo; 64: CogVideoX), ``rowsum`` passes when
- every check case of that head dim ran it without error or NaN, with rel-L1 at most 0.002
  above the default's and cosine at most 1e-4 below it (the Triton kernel's rows for causal
  cases are not the Gluon kernel's and are skipped);
- the varlen case, the drift rows (D=128) and the 10-call repeats are within the same bounds
  or bitwise equal;
- its median TFLOPS over that head dim's presets is at least 1% above the default's.
Details go to stderr; stdout is the spec (empty when nothing passes).
"""

from __future__ import annotations

import json
import statistics
import sys

D_OF = {"wan2.2-a14b-720p": 128, "wan-480p": 128, "hunyuanvideo-720p": 128, "cogvideox-5b": 64}


def _dp(d: int) -> int:
    return 64 if d <= 64 else 128


def gate(rows: list[dict]) -> dict[int, bool]:
    ok = {128: True, 64: True}
    why = {128: [], 64: []}

    def fail(dp, msg):
        ok[dp] = False
        why[dp].append(msg)

    for r in rows:
        if "error" in r:
            for dp in ok:
                fail(dp, f"{r.get('part')}: {r['error'][:120]}")
            continue
        if r.get("part") == "check" and "rowsum" in r and r.get("case") != "varlen-empty":
            dp = _dp(r["shape"][-1])
            a, b = r["rowsum"], r["default"]
            if r.get("causal"):
                continue
            if a["nan"] or a["rel_l1"] > b["rel_l1"] + 0.002 or a["cos"] < b["cos"] - 1e-4:
                fail(dp, f"check {r['case']}: {a} vs {b}")
        elif r.get("part") == "check" and r.get("case") == "varlen-empty":
            if not r["rowsum"] <= r["default"] + 0.002:
                fail(128, f"varlen {r['rowsum']} vs {r['default']}")
        elif r.get("part") == "repeat" and not r["bitwise_equal_10"]:
            fail(_dp(r["D"]), f"repeat D={r['D']} splits={r['splits']}")
    drift = {}
    for r in rows:
        if r.get("part") == "drift":
            drift[(r["family"], r["S"], r["kernel"])] = r["rel_l1"]
    for (fam, S, k), v in drift.items():
        if k == "rowsum" and v > drift.get((fam, S, "default"), 0) + 0.002:
            fail(128, f"drift {fam} {S}: {v}")
    speed = {}
    for r in rows:
        if r.get("part") == "speed" and r.get("backend", "").startswith("fp8dit[") \
                and "tflops" in r:
            name = r["backend"][7:-1]
            speed.setdefault((D_OF[r["preset"]], name), []).append(r["tflops"])
    for dp in ok:
        a, b = speed.get((dp, "rowsum")), speed.get((dp, "default"))
        if not a or not b:
            fail(dp, "no speed rows")
        elif statistics.median(a) < 1.01 * statistics.median(b):
            fail(dp, f"speed {statistics.median(a):.1f} vs {statistics.median(b):.1f}")
        else:
            why[dp].append(f"speed {statistics.median(a):.1f} vs {statistics.median(b):.1f}")
    for dp in ok:
        print(f"D={dp}: {'pass' if ok[dp] else 'fail'}; " + "; ".join(why[dp]),
              file=sys.stderr)
    return ok


def main() -> None:
    with open(sys.argv[1]) as f:
        ok = gate(json.load(f))
    spec = []
    if ok[128]:
        spec.append("128:sm90_rowsum_dot=true")
    if ok[64]:
        spec.append("64:sm90_p_regs=true,sm90_rowsum_dot=true")
    print(";".join(spec))


if __name__ == "__main__":
    main()
