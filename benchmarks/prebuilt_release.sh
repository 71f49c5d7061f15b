#!/bin/bash
# The warp-specialized kernel on one Triton release, on the GPU machine: built from the PTX fp8dit
# ships (fp8dit.prebuilt) and by the release itself (FP8DIT_PREBUILT=0), beside triton 3.6's
# build (the image's Triton) of this source and of a baseline source tree; each bench process
# times SDPA cuDNN beside fp8dit. Then both kernels against fp64 and the GPU tests of the FP8
# path with the warp-specialized kernel forced, on the release with the shipped PTX, and the
# first call's cost (an empty Triton cache, then the cache the first process filled).
# Usage: bash benchmarks/prebuilt_release.sh OUTDIR PACK.tar.xz [BASELINE_SRC]
#   PACK: a release packed by shared/tools/slim_triton.sh; BASELINE_SRC: another checkout's src/
#   (e.g. `git archive COMMIT src | tar -x -C .old`, then .old/src). PRESETS, ROUNDS (default 2),
#   STEPS (default "bench check tests warmup"), BENCHES (default "this36 prebuilt own"), TESTS
#   (the test files of the tests step), JOBS (test files at once, default 1). Pass FP8DIT_COMMIT=$(git rev-parse --short HEAD)
#   from the checkout: the rows name that commit (the GPU machine's copy of the tree may carry
#   an older .git).
set -u
out=${1:?usage: prebuilt_release.sh OUTDIR PACK.tar.xz [BASELINE_SRC]}
pack=${2:?usage: prebuilt_release.sh OUTDIR PACK.tar.xz [BASELINE_SRC]}
base=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
dir=/tmp/$(basename "$pack" .tar.xz)
[ -d "$dir" ] || python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$pack" "$dir"
rel="$dir:$root/src"
export PYTHONUNBUFFERED=1
presets=${PRESETS:-wan2.2-a14b-720p,hunyuanvideo-720p,wan-480p,cogvideox-5b}
version() { PYTHONPATH=$1 python3 -c "import torch, triton; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; }
bench() {  # NAME PYTHONPATH [VAR=VALUE ...]
  local name=$1 pp=$2; shift 2
  local s=$SECONDS
  env "$@" PYTHONPATH="$pp" TRITON_CACHE_DIR=/tmp/tc-$name python3 -m fp8dit bench \
    --preset "$presets" --backends fp8dit,fp8dit-kernel,sdpa-cudnn --rounds "${ROUNDS:-2}" \
    --max-ms 600 --out-json "$out/bench-$name.json" > "$out/bench-$name.txt" 2>&1
  echo "== bench $name ($((SECONDS - s)) s) $*: $(version "$pp")"
  grep -E "^(wan|hun|cog)" "$out/bench-$name.txt" | awk '{print $1, $2, $3, $5, $8, $9, $10}'
}
for step in ${STEPS:-bench check tests warmup}; do
  case $step in
    bench)
      [ -n "$base" ] && bench base36 "$base"
      for b in ${BENCHES:-this36 prebuilt own}; do
        case $b in
          this36) bench this36 "$root/src" ;;
          prebuilt) bench prebuilt "$rel" ;;
          own) bench own "$rel" FP8DIT_PREBUILT=0 ;;
        esac
      done ;;
    check)
      PYTHONPATH="$rel" python3 "$root/benchmarks/kernel_release.py" check > "$out/check.jsonl" 2> "$out/check.err"
      echo "== check rc=$?"; python3 -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    if r.get('vs') == 'fp64': print(r['case'], r['kernel'], r['rel_l1'], r['cos'], r['lse_max_err'], r['ok'])" "$out/check.jsonl" ;;
    tests)
      PYTHONPATH="$rel" FP8DIT_KERNEL=gluon-ws \
        FILES="${TESTS:-tests/test_attention_fp8.py tests/test_recipes.py tests/test_stress.py tests/test_sm90_gluon.py tests/test_prebuilt.py}" \
        bash "$root/benchmarks/gpu_suite.sh" "$out/tests" ;;
    warmup)
      rm -rf /tmp/tc-warm
      for i in 1 2; do
        PYTHONPATH="$rel" TRITON_CACHE_DIR=/tmp/tc-warm python3 -m fp8dit warmup \
          --preset wan2.2-a14b-720p,cogvideox-5b --rotary wan 2>&1 | grep -v Warn | cut -c1-160
      done ;;
  esac
done
tar czf "$out/all.tgz" -C "$out" --exclude all.tgz . 2>/dev/null
