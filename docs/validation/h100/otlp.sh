#!/bin/bash
# OTLP on a real driver: the agent pushes to rotel (a real OpenTelemetry collector) over
# HTTP/protobuf, then over gRPC, while a CUDA process runs in a kubelet-shaped cgroup.
# What rotel received is kept per protocol, beside nvidia-smi's view of the same seconds.
# ROTEL: the rotel-agent binary (default: the rotel Python package's); NVML_ARGS: extra
# `gpu-agent run` arguments (`--nvml-lib ...` to try the script on fake-nvml); WORK: the
# workload's command.
set -x
OUT=${OUT:-/tmp/gpu-validation}; R=$OUT/otlp; mkdir -p $R
BIN=$PWD/target/release/gpu-agent; V=$PWD/docs/validation/h100
ROTEL=${ROTEL:-$(python3 -c 'import os, rotel; print(os.path.dirname(rotel.__file__))')/rotel-agent}
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then C=/sys/fs/cgroup; else C=/sys/fs/cgroup/unified; fi
ID=$(printf 'd4%.0s' {1..32}); U=12121212-3434-5656-7878-909090909090
P=$C/kubepods.slice/kubepods-guaranteed.slice/kubepods-pod${U//-/_}.slice/cri-containerd-$ID.scope
mkdir -p $P
sh -c "echo \$\$ > $P/cgroup.procs; exec ${WORK:-python3 $V/work.py busy 3 45}" > $R/work.log 2>&1 &
W=$!
sleep 10   # CUDA's start-up
for proto in http/protobuf grpc; do
  n=${proto%%/*}; port=4318; [ $n = grpc ] && port=4317
  $ROTEL start --otlp-grpc-endpoint 127.0.0.1:4317 --otlp-http-endpoint 127.0.0.1:4318 \
    --exporter blackhole --debug-log metrics --debug-log-verbosity detailed > $R/rotel_$n.out 2>&1 &
  RO=$!; sleep 1
  printf '[otlp]\nendpoint = "http://127.0.0.1:%s"\nprotocol = "%s"\ninterval_ms = 1000\n' $port $proto > $R/$n.toml
  # shellcheck disable=SC2086
  RUST_LOG=info $BIN run --config $R/$n.toml --http-addr 127.0.0.1:9468 $NVML_ARGS > $R/agent_$n.log 2>&1 &
  A=$!; sleep 8
  command -v nvidia-smi > /dev/null && nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader > $R/smi_$n.csv
  curl -s 127.0.0.1:9468/debug/stats > $R/stats_$n.json
  curl -s 127.0.0.1:9468/debug/snapshot > $R/snapshot_$n.json
  sleep 2
  kill -TERM $A; wait $A; echo "agent exit $?" >> $R/agent_$n.log
  sleep 1; kill -TERM $RO; wait $RO
done
kill $W 2> /dev/null; wait $W; rmdir $P
# Per protocol: the requests rotel logged, and the workload container's last values.
set +x
for n in http grpc; do
  python3 - $R/rotel_$n.out $ID $n <<'PY'
import re, sys
text, cid, proto = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
resources = text.split("ResourceMetrics #")
ours = [r for r in resources if f"container.id: Str({cid})" in r]
print(f"{proto}: {text.count('ResourceMetrics #0')} requests, {len(resources) - 1} resources, "
      f"{len(ours)} of them the workload's container")
if ours:
    last = ours[-1]
    for attr in ("k8s.pod.uid", "container.runtime.name"):
        print(" ", attr, re.search(attr + r": Str\(([^)]*)\)", last).group(1))
    for metric in last.split("Metric #")[1:]:
        name = re.search(r"Name: (\S+)", metric).group(1)
        for point in metric.split("NumberDataPoints #")[1:]:
            tags = [t for k, t in re.findall(r"-> (\S+): Str\(([^)]*)\)", point) if k != "hw.id"]
            value = re.search(r"Value: (\S+)", point).group(1)
            print(f"  {name}{'{' + ','.join(tags) + '}' if tags else ''} = {value}")
PY
  [ -f $R/smi_$n.csv ] && echo "  nvidia-smi: $(cat $R/smi_$n.csv)"
done > $R/summary.txt 2>&1
cat $R/summary.txt
