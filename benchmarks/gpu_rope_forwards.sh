#!/bin/bash
# The rotary embedding fused into fp8dit's quantization, in the forwards of HunyuanVideo 1.0,
# CogVideoX and HunyuanVideo 1.5 (session 20): each against SDPA and against fp8dit whose
# processors rotate q and k in torch first (``--rotate-first``: the same work as diffusers'
# processors). Usage: bash benchmarks/gpu_rope_forwards.sh OUTDIR {hv|cog|hv15}... [-- ARGS]
# (ARGS, e.g. --compile, go to every benchmark). Each benchmark under its own time limit.
set -u
out=$1; shift
models=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do models+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
for m in "${models[@]}"; do
  case $m in
    hv) cmd=(benchmarks/bench_hunyuan_forward.py --dual 1 --single 2 --sdpa cudnn-kept) ;;
    cog) cmd=(benchmarks/bench_cogvideox_forward.py --layers 2 --sdpa auto) ;;
    hv15) cmd=(benchmarks/bench_hunyuan15_forward.py --layers 2 --sdpa auto-keymask) ;;
    *) echo "unknown model $m"; exit 2 ;;
  esac
  echo "=== $m: ${cmd[*]} --rotate-first $*"
  timeout "${LIMIT:-280}" python3 "${cmd[@]}" --rotate-first --out "$out/$m.json" "$@" \
    > "$out/$m.log" 2>&1
  echo "exit $?"; tail -n 14 "$out/$m.log"
done
