#!/bin/bash
# The test suite on the GPU machine, one file at a time, each under its own time limit, with a
# total at the end. Why: on a freshly started machine the Triton cache is empty and the suite
# compiles every kernel variant it touches; the whole suite in one pytest then took over 260 s,
# and one time limit over all of it lost every result, while the same files took ~180 s on a
# machine whose cache was warm (H200, 2026-12-04). Per file, a slow file costs only itself, and
# a second call on the still-warm machine can finish the rest (FILES= the ones left).
# Usage: bash benchmarks/gpu_suite.sh OUTDIR [pytest args]
#   LIMIT (seconds per file, default 170); FILES (default: every tests/test_*.py but the
#   CPU-side sm_90 compile checks, which need triton's sm_90 compiler only and run in CI).
set -u
out=${1:?usage: gpu_suite.sh OUTDIR [pytest args]}; shift
mkdir -p "$out"
files=${FILES:-$(ls tests/test_*.py | grep -v test_sm90_compile)}
passed=0; failed=0; skipped=0; errors=0; unfinished=()
for f in $files; do
  n=$(basename "$f" .py)
  s=$SECONDS
  timeout "${LIMIT:-170}" python3 -m pytest "$f" -q -rfEs --durations=4 -p no:cacheprovider "$@" \
    > "$out/$n.log" 2>&1
  rc=$?
  last=$(tail -n 1 "$out/$n.log")
  echo "$n rc=$rc $((SECONDS - s))s $last"
  [ $rc -eq 124 ] && unfinished+=("$f")
  for kind in passed failed skipped error; do
    k=$(grep -oE "[0-9]+ $kind" <<< "$last" | grep -oE "^[0-9]+" || true)
    case $kind in
      passed) passed=$((passed + ${k:-0})) ;;
      failed) failed=$((failed + ${k:-0})) ;;
      skipped) skipped=$((skipped + ${k:-0})) ;;
      error) errors=$((errors + ${k:-0})) ;;
    esac
  done
done
echo "total: $passed passed, $failed failed, $skipped skipped, $errors errors"
if [ ${#unfinished[@]} -gt 0 ]; then
  echo "unfinished (time limit): ${unfinished[*]}"
  exit 124
fi
[ $failed -eq 0 ] && [ $errors -eq 0 ]
