# A crowded GPU on a real driver: the agent's held process lists
# (`nvml.crowded_list_interval_ms`) against reading them every cycle.
#
# 64 idle CUDA processes in four kubelet-shaped containers (16 each), plus three
# containers of one process each: G grows its memory on demand, K is killed, N starts
# while the agent runs. Per phase (the agent started afresh with the interval given):
# - the NVML thread's CPU per cycle and the whole agent's, over 20 s;
# - every process in its container, its memory against nvidia-smi's;
# - how long the agent takes to show a new process, a growth of 32 MiB (under the 64 MiB
#   that re-reads held lists), one of 256 MiB, and a process killed.
# Run as root from the repository root, after `cargo xtask build`. argv: the phases'
# intervals (ms). HOLD_CMD replaces the CUDA holder and AGENT_ARGS adds `gpu-agent run`
# arguments: a dry run of the script on fake-nvml, where nothing is placed.
import json, os, shlex, subprocess, sys, time, urllib.request

BIN = os.path.abspath("target/release/gpu-agent")
OUT = os.environ.get("OUT", "/tmp/gpu-validation")
AGENT_ARGS = shlex.split(os.environ.get("AGENT_ARGS", ""))
HOLD = os.environ.get("HOLD_CMD") or (
    'import sys, torch\n'
    'bufs = [torch.empty(16 << 20, dtype=torch.uint8, device="cuda")]\n'
    'torch.cuda.synchronize(); print("ok", flush=True)\n'
    'for line in sys.stdin:\n'
    '    bufs.append(torch.empty(int(line) << 20, dtype=torch.uint8, device="cuda"))\n'
    '    torch.cuda.synchronize(); print("ok", flush=True)\n')
MiB = 1 << 20
CG = "/sys/fs/cgroup" if os.path.exists("/sys/fs/cgroup/cgroup.controllers") else "/sys/fs/cgroup/unified"


def cgroup(i, make=True):
    """A burstable pod's containerd scope (systemd driver), as kubelet makes it."""
    cid = f"{i:02x}" * 32
    uid = f"{i:08x}-0000-4000-8000-{i:012x}"
    pod = f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
    path = f"{CG}/kubepods.slice/kubepods-burstable.slice/{pod}/cri-containerd-{cid}.scope"
    if make:
        os.makedirs(path, exist_ok=True)
    return cid, path


class Holder:
    def __init__(self, path):
        self.p = subprocess.Popen(
            ["sh", "-c", f'echo $$ > {path}/cgroup.procs; exec python3 -c "$HOLD"'],
            env={**os.environ, "HOLD": HOLD}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True)
        self.pid = self.p.pid

    def ready(self):
        line = self.p.stdout.readline()
        if line.strip() != "ok":
            raise SystemExit(f"holder {self.pid}: {line!r}")
        return time.time()

    def grow(self, mib):
        self.p.stdin.write(f"{mib}\n"); self.p.stdin.flush()
        return self.ready()

    def kill(self):
        self.p.kill(); self.p.wait()


def get(port, what):
    return json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/{what}", timeout=5))


def cpu_s(pid):
    """The whole agent's CPU seconds, every thread's, those ended too (10 ms ticks)."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def containers(port):
    """container id -> (pids, memory) from the agent's snapshot."""
    out = {}
    for c in get(port, "snapshot")["containers"]:
        for g in c["gpus"]:
            pids, mem = out.get(c["container_id"], ([], 0))
            out[c["container_id"]] = (pids + g["pids"], mem + g["memory_used_bytes"])
    return out


def wait_for(port, cond, limit=15.0):
    """Seconds until cond(containers) holds, polled every 50 ms; None past the limit."""
    t0 = time.time()
    while time.time() - t0 < limit:
        try:
            if cond(containers(port)):
                return time.time()
        except OSError:
            pass
        time.sleep(0.05)
    return None


def smi_memory():
    try:
        rows = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                               "--format=csv,noheader,nounits"], capture_output=True,
                              text=True).stdout
    except FileNotFoundError:
        return {}
    return {int(p): int(m) * MiB for p, m in (r.split(",") for r in rows.splitlines() if r)}


def since(t0, t1):
    return "not in time" if t1 is None else f"{t1 - t0:.2f} s"


def phase(i, interval_ms, port, pods, solo):
    """solo: role -> [container id, cgroup path, holder] for G, K and N (N: no holder)."""
    cfg = f"{OUT}/crowded_{interval_ms}.toml"
    open(cfg, "w").write(f"[nvml]\ncrowded_list_interval_ms = {interval_ms}\n")
    t0 = time.time()
    a = subprocess.Popen([BIN, "run", "--config", cfg, "--http-addr", f"127.0.0.1:{port}",
                          *AGENT_ARGS], stdout=open(f"{OUT}/agent_{i}_{interval_ms}.log", "w"),
                         stderr=subprocess.STDOUT, env={**os.environ, "RUST_LOG": "info"})
    every = {cid: {h.pid for h in hs} for cid, hs in pods.items()}
    every.update({solo[r][0]: {solo[r][2].pid} for r in ("G", "K")})
    pids_of = lambda cs, cid: cs.get(cid, ([], 0))[0]
    placed = lambda cs: all(set(pids_of(cs, cid)) == p for cid, p in every.items())
    t = wait_for(port, placed, 20)
    print(f"== interval {interval_ms} ms: all {sum(map(len, every.values()))} processes in "
          f"their containers after {since(t0, t)} (agent started at 0)", flush=True)
    time.sleep(max(0, t0 + 4 - time.time()))
    s0, c0, w0 = get(port, "stats"), cpu_s(a.pid), time.time()
    time.sleep(20)
    s1, c1, w1 = get(port, "stats"), cpu_s(a.pid), time.time()
    n = s1["nvml_samples"] - s0["nvml_samples"]
    print(f"NVML thread {(s1['nvml_sample_cpu_ns'] - s0['nvml_sample_cpu_ns']) / n / 1e6:.2f} ms "
          f"CPU per cycle over {n} cycles; whole agent {(c1 - c0) / (w1 - w0) * 100:.3f} % of a "
          f"core; {s1['gpu_processes']} GPU processes, {s1['gpu_processes_unresolved']} unresolved",
          flush=True)
    json.dump(s1, open(f"{OUT}/stats_{i}_{interval_ms}.json", "w"))
    # Memory against nvidia-smi, per container, read back to back.
    smi, cs = smi_memory(), containers(port)
    off = [(cid[:4], cs.get(cid, ([], 0))[1], sum(smi.get(p, 0) for p in pids))
           for cid, pids in every.items()]
    bad = [o for o in off if o[1] != o[2]]
    print(f"memory: {len(off) - len(bad)} of {len(off)} containers equal to nvidia-smi's "
          f"sum; differing (container, agent, nvidia-smi): {bad[:5]}", flush=True)
    # A new process in a new container.
    cid_n, path_n, _ = solo["N"]
    h = Holder(path_n); t_ok = h.ready()
    t = wait_for(port, lambda cs: h.pid in pids_of(cs, cid_n))
    print(f"new process: shown {since(t_ok, t)} after its CUDA context existed", flush=True)
    # Growths under and over what re-reads held lists.
    cid_g, _, g = solo["G"]
    for mib in (32, 256):
        before = containers(port).get(cid_g, ([], 0))[1]
        t_ok = g.grow(mib)
        t = wait_for(port, lambda cs: cs.get(cid_g, ([], 0))[1] >= before + mib * MiB)
        print(f"growth of {mib} MiB: shown {since(t_ok, t)} after the allocation", flush=True)
    # A process killed.
    cid_k, path_k, k = solo["K"]
    k.kill(); t_k = time.time()
    t = wait_for(port, lambda cs: k.pid not in pids_of(cs, cid_k))
    print(f"killed process: gone {since(t_k, t)} after it was killed", flush=True)
    a.terminate(); a.wait()
    # The next phase starts as this one did: N gone, K again.
    h.kill()
    solo["K"][2] = Holder(path_k); solo["K"][2].ready()


def main():
    os.makedirs(OUT, exist_ok=True)
    smi = subprocess.run("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader",
                         shell=True, capture_output=True, text=True)
    print(smi.stdout or smi.stderr, flush=True)
    t0 = time.time()
    pods = {}
    for i in range(1, 5):
        cid, path = cgroup(i)
        pods[cid] = [Holder(path) for _ in range(16)]
    solo = {r: [*cgroup(i), None] for r, i in (("G", 5), ("K", 6), ("N", 7))}
    for r in ("G", "K"):
        solo[r][2] = Holder(solo[r][1])
    every = lambda: [h for hs in pods.values() for h in hs] + [solo["G"][2], solo["K"][2]]
    for h in every():
        h.ready()
    print(f"{sum(map(len, pods.values())) + 2} holders ready after {time.time() - t0:.1f} s",
          flush=True)
    intervals = [int(a) for a in sys.argv[1:]] or [5000, 0, 5000]
    try:
        for i, ms in enumerate(intervals):
            phase(i, ms, 9480 + i, pods, solo)
    finally:
        for h in every():
            h.kill()
        time.sleep(1)
        for cid, path in [cgroup(i, make=False) for i in range(1, 8)]:
            for d in (path, os.path.dirname(path)):
                try:
                    os.rmdir(d)
                except OSError as e:
                    print(f"rmdir {d}: {e}")


if __name__ == "__main__":
    main()
