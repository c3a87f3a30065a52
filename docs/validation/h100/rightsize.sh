#!/bin/bash
# Rightsizing on a real GPU: the MIG profiles NVML gives (the agent's own reading, beside
# `nvidia-smi mig -lgip`) against the built-in table, then the known-answer flow with real
# CUDA processes of known memory in pod cgroups: records cut every 10 s, read back by
# `gpu-agent rightsize`. About 70 s. Summary in $OUT/rightsize/summary.txt.
set -x
OUT=${OUT:-/tmp/gpu-validation}; R=$OUT/rightsize; mkdir -p $R
exec > >(tee $R/run.log) 2>&1
BIN=$PWD/target/release/gpu-agent; V=$PWD/docs/validation/h100
nvidia-smi -L; nvidia-smi --query-gpu=name,memory.total,mig.mode.current --format=csv
nvidia-smi mig -lgip > $R/lgip.txt 2>&1
$BIN rightsize --profiles > $R/profiles.txt 2>&1
# The agent's NVML lines and the table's entry for this GPU, side by side.
grep -v '^#' $R/profiles.txt | awk -F"\t" '$6=="nvml" && $2 !~ /[+]/' | cut -f2-5 | sort > $R/nvml.txt
grep -v '^#' $R/profiles.txt | awk -F"\t" '$6 ~ /^table:/ && $2 !~ /[+]/' | cut -f2-5 | sort > $R/table.txt
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then C=/sys/fs/cgroup; else C=/sys/fs/cgroup/unified; mkdir -p $C; mountpoint -q $C || mount -t cgroup2 none $C; fi
pod() { echo $C/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod${1//-/_}.slice/cri-containerd-$(printf "$2%.0s" {1..32}).scope; }
U1=aaaaaaa1-0000-4000-8000-000000000001; U2=aaaaaaa2-0000-4000-8000-000000000002; U3=aaaaaaa3-0000-4000-8000-000000000003
P1=$(pod $U1 a1); P2=$(pod $U2 b2); P3=$(pod $U3 c3); mkdir -p $P1 $P2 $P3
inc() { local p=$1; shift; sh -c "echo \$\$ > $p/cgroup.procs; exec python3 $V/work.py $*"; }
cat > $R/config.toml <<EOF
[nvml]
interval_ms = 200
[usage]
file = "$R/usage.jsonl"
max_record_secs = 10
EOF
RUST_LOG=info $BIN run --http-addr 127.0.0.1:9464 --config $R/config.toml > $R/agent.log 2>&1 &
AG=$!
sleep 3
# Holds 7 GiB and runs nothing; holds 30 GiB and runs nothing; holds 4 GiB and multiplies.
inc $P1 idle 7 40 > $R/w1.log 2>&1 &
inc $P2 idle 30 40 > $R/w2.log 2>&1 &
inc $P3 busy 4 40 > $R/w3.log 2>&1 &
sleep 36
nvidia-smi --query-compute-apps=pid,used_memory --format=csv > $R/apps.txt
kill -TERM $AG; wait $AG
wait
$BIN rightsize --file $R/usage.jsonl --format json --min-coverage 20s --since 1h > $R/answer.jsonl 2> $R/answer.err
$BIN rightsize --file $R/usage.jsonl --min-coverage 20s --since 1h > $R/answer.txt 2>&1
{
  echo "== NVML (the agent) vs the table: profile, slices, total, MiB"
  diff $R/nvml.txt $R/table.txt && echo "identical"
  echo "== records: pod, reason, start..end, peak GiB, sm p50/p95/max, model, allocated"
  python3 - "$R/usage.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print((r.get("pod_uid") or "host")[:8], r["reason"], r["start_ms"], r["end_ms"],
          round(r["memory_peak_bytes"] / 2**30, 2), r.get("sm_p50"), r.get("sm_p95"),
          r.get("sm_max"), r.get("sm_source"), r.get("device_model"), r.get("gpus_allocated"))
PY
  echo "== rightsize (expected: a1 mig 1g.*, b2 mig 3g.*, c3 keep)"
  cat $R/answer.txt
} > $R/summary.txt 2>&1
cat $R/summary.txt
rmdir $P1 $P2 $P3 2>/dev/null
