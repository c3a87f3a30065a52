#!/bin/bash
# The eBPF programs' run time per event on this machine's CPU, as `cargo xtask bench storm`
# measures it on the development VM: the agent with program statistics on
# (`ebpf.program_stats`), N fork+exec of /bin/true from a shell in a pod-shaped cgroup,
# then each program's run time over its runs from /debug/stats. The same storm without
# the agent gives the slowdown. pid_max is printed: it sets the number of slots.
OUT=${OUT:-/tmp/gpu-validation}; mkdir -p $OUT
BIN=$PWD/target/release/gpu-agent; N=${N:-20000}
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then C=/sys/fs/cgroup; else C=/sys/fs/cgroup/unified; fi
ID=$(printf 'e5%.0s' {1..32}); U=13131313-2424-3535-4646-575757575757
P=$C/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod${U//-/_}.slice/cri-containerd-$ID.scope
mkdir -p $P
echo "kernel $(uname -r), pid_max $(cat /proc/sys/kernel/pid_max), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo)"
storm() { local t0 t1; t0=$(date +%s.%N)
  sh -c "echo \$\$ > $P/cgroup.procs; i=0; while [ \$i -lt $N ]; do /bin/true; i=\$((i+1)); done"
  t1=$(date +%s.%N); python3 -c "print($t1 - $t0)"; }
printf '[ebpf]\nprogram_stats = true\n' > $OUT/program_stats.toml
without=$(storm)
$BIN run --config $OUT/program_stats.toml --http-addr 127.0.0.1:9490 > $OUT/agent_storm.log 2>&1 & A=$!
sleep 3
curl -s 127.0.0.1:9490/debug/stats > $OUT/storm_before.json
with=$(storm)
sleep 2
curl -s 127.0.0.1:9490/debug/stats > $OUT/storm_after.json
kill -TERM $A; wait $A
without2=$(storm)
python3 - "$OUT" "$N" "$without" "$with" "$without2" <<'EOF'
import json, sys
out, n, wo, w, wo2 = sys.argv[1], int(sys.argv[2]), *map(float, sys.argv[3:])
b, a = (json.load(open(f"{out}/storm_{x}.json")) for x in ("before", "after"))
prog = lambda s: {p["name"]: p for p in s["programs"]}
pb, pa = prog(b), prog(a)
per = {}
for name in ("proc_fork", "proc_exec", "proc_exit"):
    runs = pa[name]["run_count"] - pb[name]["run_count"]
    per[name] = (pa[name]["run_time_ns"] - pb[name]["run_time_ns"]) / runs
    print(f"{name}: {runs} runs, {per[name]:.0f} ns per run")
print(f"mean of the three: {sum(per.values()) / 3:.0f} ns; events lost {a['events_lost']}; "
      f"storm of {n}: {wo:.2f} s without the agent, {w:.2f} s with it, {wo2:.2f} s without "
      f"again (slowdown {w / ((wo + wo2) / 2):.3f}x)")
EOF
rmdir $P
