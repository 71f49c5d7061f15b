#!/usr/bin/env bash
# Session 24's quantization paths (and session 25's reversed quantize_kv: all_fast_rev against
# all_fast) on the H200 in one device call (benchmarks/NOTES.md, "Session 24"): the stage A/B
# with bitwise checks and TB/s per launch, the end-to-end ratio against cuDNN with the
# candidates on, and memcheck of the new loads.
# Usage (PYTHONPATH set as in NOTES): bash benchmarks/gpu_quant_session.sh OUTDIR
# Before spending device time on it: TRITON_INTERPRET=1 PYTHONPATH=src python
# tests/tools/dry_run_quant_variants.py (the variants part on CPU, bitwise checks included) and
# python benchmarks/bench_knobs.py --set ... -- --smoke --no-save (the knobs part).
# PARTS (default "variants knobs memcheck") picks parts; each has its own time limit.
set -uo pipefail
out=${1:?outdir}
part() {  # name, seconds, command...
  local name=$1 limit=$2; shift 2
  case " ${PARTS:-variants knobs memcheck} " in *" $name "*) ;; *) return 0 ;; esac
  echo "== $name (limit ${limit}s)"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  echo "== $name rc=$? in $((SECONDS - t0))s"
  tail -n 40 "$out/$name.log"
}
part variants 300 python3 benchmarks/gpu_quant_variants.py \
  --variants base,stats_fast,stats_fast_sub8,q_fast,kv_fast,all_fast,q_it4,kv_it4,all_fast_q_it4,all_fast_rev \
  --presets wan-480p,wan2.2-a14b-720p,cogvideox-5b --out "$out/variants.jsonl"
part knobs 180 python3 benchmarks/bench_knobs.py --set KV_STATS_FULL_FAST=1 \
  --set Q_QUANT_FINITE_FAST=1 --set KV_QUANT_FINITE_FAST=1 -- --preset wan-480p \
  --preset cogvideox-5b --backends fp8dit,fp8dit-kernel,fp8dit-quant,sdpa-cudnn \
  --out-json "$out/knobs.json"
part memcheck 100 compute-sanitizer --tool memcheck python3 benchmarks/gpu_sanitize.py \
  --quant-fast
