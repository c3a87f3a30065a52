#!/bin/bash
# The NVML thread per cycle (the sampler and its reader, NVML's calls included) and the whole
# agent's CPU, of two builds on this machine's GPUs: BEFORE, AFTER, AFTER, BEFORE, each a fresh
# agent for SECS seconds from its 12th (after the first slow readings).
# Usage: bash nvml_ab.sh BEFORE_BIN AFTER_BIN [SECS=60]
B=$1; A=$2; SECS=${3:-60}; PORT=9471
[ -x "$B" ] && [ -x "$A" ] || { echo "usage: $0 BEFORE_BIN AFTER_BIN [SECS]"; exit 2; }
: > /tmp/nvml_ab.toml
nvs() { curl -s 127.0.0.1:$PORT/debug/stats | python3 -c "import json,sys; s=json.load(sys.stdin); print(s['nvml_samples'], s['nvml_sample_cpu_ns'])"; }
cpu() { cat /proc/$1/task/*/schedstat | awk '{s += $1} END {print s}'; }
phase() {
  $2 run --config /tmp/nvml_ab.toml --http-addr 127.0.0.1:$PORT > /dev/null 2>&1 & P=$!; sleep 12
  read n0 c0 < <(nvs); p0=$(cpu $P); sleep "$SECS"
  read n1 c1 < <(nvs); p1=$(cpu $P)
  python3 -c "print('$1: NVML thread %.2f ms CPU per cycle over %d cycles; whole agent %.2f ms per cycle' % (($c1-$c0)/($n1-$n0)/1e6, $n1-$n0, ($p1-$p0)/($n1-$n0)/1e6))"
  kill -TERM $P; wait $P
}
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader
phase "before" "$B"; phase "after" "$A"; phase "after" "$A"; phase "before" "$B"
