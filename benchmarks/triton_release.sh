#!/bin/bash
# One Triton release on the GPU machine: correctness of both attention kernels against fp64,
# their speed beside SDPA cuDNN in one process per kernel, Nsight Compute of one
# warp-specialized launch at Wan2.2 720p, and the compiled kernel's SASS and PTX; everything
# under OUTDIR/<release>/. Run it once per release on one machine to compare releases.
# Usage: bash benchmarks/triton_release.sh OUTDIR [PACK.tar.xz]
#   PACK: a release packed by shared/tools/slim_triton.sh (unpacked and put first on the path);
#   without it, the installed Triton.
#   STEPS (default "check bench ncu"), KERNELS (bench's, default "gluon-ws triton"), PRESETS
#   (the bench's), ROUNDS (default 2), NCU_SET (default full) or NCU_SECTIONS (ncu's
#   --section arguments, instead of a set).
set -u
out=${1:?usage: triton_release.sh OUTDIR [PACK.tar.xz]}
pack=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "$pack" ]; then
  dir=/tmp/$(basename "$pack" .tar.xz)
  [ -d "$dir" ] || python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$pack" "$dir"
  export PYTHONPATH="$dir:$root/src:${PYTHONPATH:-}"
else
  export PYTHONPATH="$root/src:${PYTHONPATH:-}"
fi
export PYTHONUNBUFFERED=1
rel=$(python3 -c "import triton; print(triton.__version__)")
o=$out/triton-$rel
mkdir -p "$o"
# a cache of this release's own: the SASS below is what this run compiled
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache-$rel}
python3 - <<'EOF' | tee "$o/versions.txt"
import torch, triton
from triton.backends.nvidia import compiler as c
ptxas = getattr(c, "get_ptxas", None)
p = ptxas(torch.cuda.get_device_capability()[0] * 10) if ptxas else None
print("gpu", torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__,
      "cudnn", torch.backends.cudnn.version(), "ptxas", getattr(p, "path", p), getattr(p, "version", ""))
EOF
steps=${STEPS:-check bench ncu}
presets=${PRESETS:-wan2.2-a14b-720p,hunyuanvideo-720p,wan-480p,cogvideox-5b}
for step in $steps; do
  s=$SECONDS
  case $step in
    check)
      python3 "$root/benchmarks/kernel_release.py" check > "$o/check.jsonl" 2> "$o/check.err"
      echo "check rc=$? $((SECONDS - s))s"; cat "$o/check.jsonl" ;;
    bench)
      for kernel in ${KERNELS:-gluon-ws triton}; do
        FP8DIT_KERNEL=$kernel python3 -m fp8dit bench --preset "$presets" \
          --backends fp8dit,fp8dit-kernel,sdpa-cudnn --rounds "${ROUNDS:-2}" --max-ms 800 \
          --out-json "$o/bench-$kernel.json" > "$o/bench-$kernel.txt" 2>&1
        echo "bench $kernel rc=$? $((SECONDS - s))s"; tail -n 16 "$o/bench-$kernel.txt"
      done ;;
    ncu)
      ncu --clock-control none -k regex:attention_fwd_sm90_ws --launch-skip 1 --launch-count 1 \
        ${NCU_SECTIONS:---set ${NCU_SET:-full}} --import-source no -f -o "$o/ws" \
        python3 "$root/benchmarks/kernel_release.py" profile --kernel gluon-ws \
        > "$o/ncu.log" 2>&1
      echo "ncu rc=$? $((SECONDS - s))s"; tail -n 5 "$o/ncu.log"
      ncu -i "$o/ws.ncu-rep" --page details > "$o/ncu-details.txt" 2>&1
      ncu -i "$o/ws.ncu-rep" --page raw --csv > "$o/ncu-raw.csv" 2>&1
      ncu -i "$o/ws.ncu-rep" --page source --print-source sass --csv > "$o/ncu-sass.csv" 2>&1
      grep -E "Duration|SM Frequency|Elapsed Cycles|Registers Per|Issue Slots Busy|Executed Ipc A|No Eligible|Warp Cycles Per Issued|Dynamic Shared|Block Size|Grid Size" \
        "$o/ncu-details.txt" | head -30 ;;
  esac
done
# the compiled warp-specialized kernel of this run, for diffing releases
for f in $(find "$TRITON_CACHE_DIR" -name 'attention_fwd_sm90_ws_kernel.cubin'); do
  h=$(basename "$(dirname "$f")" | cut -c1-12)
  cuobjdump -sass "$f" > "$o/ws-$h.sass" 2>/dev/null
  cp "$(dirname "$f")/attention_fwd_sm90_ws_kernel.ptx" "$o/ws-$h.ptx" 2>/dev/null
  cp "$(dirname "$f")/attention_fwd_sm90_ws_kernel.json" "$o/ws-$h.json" 2>/dev/null
done
ls -la "$o"
