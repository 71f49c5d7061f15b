#!/bin/bash
# The test suite on the GPU machine, one file at a time, each under its own time limit, with a
# total at the end. Why: on a freshly started machine the Triton cache is empty and the suite
# compiles every kernel variant it touches; the whole suite in one pytest then took over 260 s,
# and one time limit over all of it lost every result, while the same files took ~180 s on a
# machine whose cache was warm (H200, 2026-12-04). Per file, a slow file costs only itself, and
# a second call on the still-warm machine can finish the rest (FILES= the ones left). JOBS files
# run at once (default 1): the GPU machine's cores compile while another file's kernels run.
# Usage: bash benchmarks/gpu_suite.sh OUTDIR [pytest args]
#   LIMIT (seconds per file, default 170); FILES (default: every tests/test_*.py but the
#   CPU-side sm_90 compile checks, which need triton's sm_90 compiler only and run in CI).
set -u
out=${1:?usage: gpu_suite.sh OUTDIR [pytest args]}; shift
mkdir -p "$out"
files=${FILES:-$(ls tests/test_*.py | grep -v test_sm90_compile)}
one() {  # FILE: its log, then one line: name, exit status, seconds, pytest's last line
  local f=$1 n s rc
  n=$(basename "$f" .py); s=$SECONDS
  timeout "${LIMIT:-170}" python3 -m pytest "$f" -q -rfEs --durations=4 -p no:cacheprovider "$@" \
    > "$out/$n.log" 2>&1
  rc=$?
  # pytest's summary line, not the log's last line: a library's message at exit can follow it
  # (triton 3.9's nanobind reports leaked objects after pytest has printed its totals)
  summary=$(grep -E '^=* ?[0-9]+ (passed|failed|skipped|errors?|deselected|xfailed|xpassed)' \
    "$out/$n.log" | tail -n 1)
  echo "$n rc=$rc $((SECONDS - s))s ${summary:-no pytest summary}" > "$out/$n.status"
  cat "$out/$n.status"
}
args=("$@")
for f in $files; do
  while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-1}" ]; do wait -n; done
  one "$f" "${args[@]}" &
done
wait
# Totals from each file's pytest summary line ("3 failed, 40 passed, 2 skipped in 9.1s").
for f in $files; do cat "$out/$(basename "$f" .py).status"; done | awk '
  { for (i = 1; i < NF; i++) { k = $(i + 1); sub(/[,;]$/, "", k); if ($i ~ /^[0-9]+$/) n[k] += $i } }
  / rc=124 / { unfinished = unfinished " " $1; next }
  # any other exit status but 0 and 5 (no test collected: a file whose tests all need an engine
  # that is not installed) is a failed file, whatever its counts say
  $2 != "rc=0" && $2 != "rc=5" { broken = broken " " $1 }
  END {
    printf "total: %d passed, %d failed, %d skipped, %d errors\n",
      n["passed"], n["failed"], n["skipped"], n["error"] + n["errors"]
    if (unfinished != "") { print "unfinished (time limit):" unfinished; exit 124 }
    if (broken != "") { print "failed files (exit status):" broken; exit 1 }
    exit (n["failed"] + n["error"] + n["errors"] > 0)
  }' > "$out/summary.tail"
rc=$?
cat "$out/summary.tail"
exit $rc
