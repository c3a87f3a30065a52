#!/bin/bash
# Real-driver validation: the agent against nvidia-smi, workloads in kubelet-shaped cgroups.
set -x
OUT=${OUT:-/tmp/gpu-validation}; R=$OUT/r; mkdir -p $R
exec > >(tee $OUT/run.log) 2>&1
BIN=$PWD/target/release/gpu-agent; V=$PWD/docs/validation/h100
uname -a; nvidia-smi; nvidia-smi -L; python3 -c 'import torch; print(torch.__version__)'
grep -E 'cgroup|tracefs|bpf' /proc/mounts; ls -la /sys/kernel/btf/vmlinux; cat /proc/sys/kernel/pid_max
ls -la /usr/lib/x86_64-linux-gnu/libnvidia-ml* /usr/local/nvidia/lib64/libnvidia-ml* 2>&1 | head
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then C=/sys/fs/cgroup; else C=/sys/fs/cgroup/unified; mkdir -p $C; mountpoint -q $C || mount -t cgroup2 none $C; fi
ID1=$(printf 'a1%.0s' {1..32}); ID2=$(printf 'b2%.0s' {1..32}); ID3=$(printf 'c3%.0s' {1..32})
U1=11111111-2222-3333-4444-555555555555; U2=66666666-7777-8888-9999-000000000000
P1=$C/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod${U1//-/_}.slice/cri-containerd-$ID1.scope
P2=$C/kubepods/besteffort/pod$U2/$ID2
P3=$C/system.slice/docker-$ID3.scope
mkdir -p $P1 $P2 $P3
nv() { curl -s 127.0.0.1:${1:-9464}/debug/stats | python3 -c "import json,sys; s=json.load(sys.stdin); print(s['nvml_samples'], 'samples', s['nvml_sample_cpu_ns']/s['nvml_samples']/1e6, 'ms of NVML thread CPU per sample')"; }
# Idle GPU, no process: the NVML thread's cost per cycle.
$BIN run --http-addr 127.0.0.1:9466 > $R/agent_idle.log 2>&1 & I=$!; sleep 12; nv 9466 > $R/nvml_idle.txt; kill -TERM $I; wait $I
inc() { local p=$1; shift; sh -c "echo \$\$ > $p/cgroup.procs; exec python3 $V/work.py $*"; }
# Before the agent: found by the start-up walk.
inc $P2 idle 2 100 > $R/w_idle.log 2>&1 &
python3 $V/work.py idle 1 100 > $R/w_host.log 2>&1 &
sleep 8
RUST_LOG=info $BIN run --http-addr 127.0.0.1:9464 --prometheus > $R/agent.log 2>&1 &
AG=$!
sleep 3
# After the agent: seen by the exec and fork tracepoints.
inc $P1 busy 4 60 > $R/w_busy.log 2>&1 &
inc $P3 forked 3 60 > $R/w_forked.log 2>&1 &
sleep 25
cpu() { awk '{print $14+$15}' /proc/$AG/stat; }
c0=$(cpu); t0=$(date +%s.%N)
for f in snapshot processes stats; do curl -s 127.0.0.1:9464/debug/$f > $R/$f.json; done
curl -s 127.0.0.1:9464/metrics > $R/metrics.txt
nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv > $R/smi_apps.csv
nvidia-smi --query-gpu=uuid,name,driver_version,memory.used,memory.total,utilization.gpu,utilization.memory,power.draw,temperature.gpu,clocks.sm --format=csv > $R/smi_gpu.csv
nvidia-smi pmon -c 3 > $R/smi_pmon.txt
for p in $(pgrep -f work.py); do echo "$p $(cat /proc/$p/cgroup | tr '\n' ' ')"; done > $R/pids_cgroups.txt
COLUMNS=160 $BIN top --once > $R/top.txt 2> $R/top.err
sleep 20
c1=$(cpu); t1=$(date +%s.%N)
echo "agent cpu ticks $c0 -> $c1 over $(python3 -c "print($t1 - $t0)") s; clk $(getconf CLK_TCK)" > $R/agent_cpu.txt
nv > $R/nvml_busy.txt
grep -E 'VmRSS|VmHWM|Threads' /proc/$AG/status >> $R/agent_cpu.txt
printf '[nvml]\nslow_interval_ms = 100\n' > /tmp/every.toml
$BIN run --config /tmp/every.toml --http-addr 127.0.0.1:9467 > $R/agent_every.log 2>&1 & E=$!; sleep 10; nv 9467 > $R/nvml_every_cycle.txt; kill -TERM $E; wait $E
sleep 10   # busy and forked have ended
curl -s 127.0.0.1:9464/debug/snapshot > $R/snapshot_after.json
curl -s 127.0.0.1:9464/metrics > $R/metrics_after.txt
nvidia-smi --query-compute-apps=pid,used_memory --format=csv > $R/smi_apps_after.csv
kill -TERM $AG; wait $AG; echo "agent exit $?" >> $R/agent_cpu.txt
$BIN run --http-addr 127.0.0.1:9465 --prometheus-compat dcgm > $R/agent_dcgm.log 2>&1 &
D=$!; sleep 12
curl -s 127.0.0.1:9465/metrics > $R/dcgm_metrics.txt
nvidia-smi -q > $R/smi_q.txt
kill -TERM $D; wait $D
pkill -f work.py; sleep 2; rmdir $P1 $P2 $P3 2>/dev/null
tar -C $OUT -czf $OUT/val.tgz r && rm -rf $R
