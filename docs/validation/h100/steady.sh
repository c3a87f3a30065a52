#!/bin/bash
# Steady-state NVML thread CPU per cycle and whole-agent CPU, default vs. slow readings every cycle.
BIN=$PWD/target/release/gpu-agent; V=$PWD/docs/validation/h100
printf '[nvml]\nslow_interval_ms = 100\n' > /tmp/every.toml; : > /tmp/default.toml
nvs() { curl -s 127.0.0.1:9470/debug/stats | python3 -c "import json,sys; s=json.load(sys.stdin); print(s['nvml_samples'], s['nvml_sample_cpu_ns'])"; }
# The whole agent: every thread's run time (/proc/PID/schedstat is the main thread's alone).
cpu() { cat /proc/$1/task/*/schedstat | awk '{s += $1} END {print s}'; }
phase() {
  $BIN run --config $2 --http-addr 127.0.0.1:9470 > /dev/null 2>&1 & A=$!; sleep 4
  read n0 c0 < <(nvs); p0=$(cpu $A); sleep 20
  read n1 c1 < <(nvs); p1=$(cpu $A)
  python3 -c "print('$1: NVML thread %.2f ms CPU per cycle over %d cycles; whole agent %.3f %% of a core' % (($c1-$c0)/($n1-$n0)/1e6, $n1-$n0, ($p1-$p0)/20e9*100))"
  kill -TERM $A; wait $A
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
phase "idle GPU, default (slow readings every 10 s)" /tmp/default.toml
phase "idle GPU, slow readings every cycle" /tmp/every.toml
python3 $V/work.py busy 4 120 > /dev/null 2>&1 & python3 $V/work.py idle 2 120 > /dev/null 2>&1 &
sleep 12; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
phase "2 GPU processes (one busy), default" /tmp/default.toml
phase "2 GPU processes (one busy), slow readings every cycle" /tmp/every.toml
pkill -f work.py
