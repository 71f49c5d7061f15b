#!/usr/bin/env bash
# Nsight Compute on the attention kernel: where the warps stall, which pipes are busy.
# Usage (on the H200, PYTHONPATH set): bash benchmarks/gpu_ncu.sh OUTDIR "name:args" ...
#   e.g. bash benchmarks/gpu_ncu.sh $OUT "ws:--kernel gluon-ws" "triton:--kernel triton"
# KERNELS (a regex of kernel names, default the attention kernel), SKIP and COUNT (launches of
# them skipped, then profiled; default 1 and 1) choose other kernels: the quantization's four
# launches of the second call, e.g. at Wan 480p (the quantization is its gap to 1.7x):
#   KERNELS="kv_channel_stats|kv_stats_finalize|quantize_kv|quantize_q" SKIP=4 COUNT=4 \
#     bash benchmarks/gpu_ncu.sh $OUT "quant480:--heads 40 --seq 32760"
set -uo pipefail
out=${1:?outdir}; shift
for spec in "$@"; do
  name=${spec%%:*}; args=${spec#*:}
  # shellcheck disable=SC2086
  ncu --clock-control none -k "regex:${KERNELS:-attention_fwd}" -s "${SKIP:-1}" \
      -c "${COUNT:-1}" --set full \
      --import-source no -o "$out/$name" -f \
      python3 benchmarks/ncu_driver.py $args > "$out/$name.log" 2>&1
  ncu -i "$out/$name.ncu-rep" --page details > "$out/$name.details.txt" 2>&1
  ncu -i "$out/$name.ncu-rep" --page raw --csv > "$out/$name.raw.csv" 2>&1
  ncu -i "$out/$name.ncu-rep" --page source --csv --print-source sass \
      > "$out/$name.sass.csv" 2>&1
  grep -E "Duration|Throughput|Stall|Issue|Warp Cycles|Eligible|Active Warps|Pipe" \
      "$out/$name.details.txt" | head -60
  rm -f "$out/$name.ncu-rep"  # the text pages above are what comes back
done
