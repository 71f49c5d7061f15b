#!/bin/bash
# experiment: time the warp-specialized kernel under variants (env), one process each
set -u
out=${OUT:-/tmp/out}; mkdir -p $out/sass
root=$(pwd)
pack=${PACK:-}
if [ -n "$pack" ]; then
  d=/tmp/$(basename $pack .tar.xz); [ -d $d ] || python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" $pack $d
  PP="$d:$root/src"
else PP="$root/src"; fi
NATIVE="$root/src"
presets=${PRESETS:-wan2.2-a14b-720p,cogvideox-5b}
v() { # name pythonpath env...
  name=$1; pp=$2; shift 2
  s=$SECONDS
  env "$@" PYTHONPATH=$pp TRITON_CACHE_DIR=/tmp/tc-$name FP8DIT_KERNEL=gluon-ws PYTHONUNBUFFERED=1 \
    python3 -m fp8dit bench --preset $presets --backends fp8dit-kernel,sdpa-cudnn --rounds ${ROUNDS:-2} \
    --max-ms 600 --warmup 3 --no-save > $out/$name.txt 2>&1
  echo "== $name ($((SECONDS-s))s) $*"; grep -E "^(wan|cog|hun).*(fp8dit-kernel|sdpa-cudnn)" $out/$name.txt | awk '{print $1, $2, $3, $5, $8, $9}'
  grep -iE "error|Traceback" $out/$name.txt | head -3
  f=$(find /tmp/tc-$name -name 'attention_fwd_sm90_ws_kernel.cubin' | head -4)
  i=0; for c in $f; do cuobjdump -sass $c > $out/sass/$name-$i.sass 2>/dev/null; i=$((i+1)); done
}
eval "$VARIANTS"
true; tar czf $out/sass.tgz -C $out sass && rm -rf $out/sass
w() { # name pythonpath : cold-start warmup, twice (empty cache, then the disk cache)
  name=$1; pp=$2; rm -rf /tmp/tcw-$name
  for i in 1 2; do s=$SECONDS
    PYTHONPATH=$pp TRITON_CACHE_DIR=/tmp/tcw-$name PYTHONUNBUFFERED=1 python3 -m fp8dit warmup \
      --preset ${WPRESETS:-wan2.2-a14b-720p,cogvideox-5b} --rotary wan > $out/warm-$name-$i.txt 2>&1
    echo "== warmup $name #$i ($((SECONDS-s))s)"; cat $out/warm-$name-$i.txt | cut -c1-220
  done
}
eval "${WARMS:-}"
