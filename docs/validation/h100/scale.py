# NVML's per-cycle process calls against the number of processes on one GPU (the large
# node of `cargo xtask bench` has 250 a GPU). Idle CUDA processes are added in steps; at
# each step, thread CPU per call (median of 5, 0.2 s apart). Then, with them all, the
# agent's NVML thread per cycle (`/debug/stats`, cycles 3 to 12). argv: the steps.
import json, os, subprocess, sys, time, urllib.request
import statistics as st
from pynvml import *

steps = [int(a) for a in sys.argv[1:]] or [0, 8, 16, 32, 64]
HOLD = 'import torch, time; x = torch.empty(1 << 24, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize(); print("ok", flush=True); time.sleep(900)'
workers = []

def spawn(k):
    new = [subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE) for _ in range(k)]
    for w in new:
        w.stdout.readline()
    workers.extend(new)

def timed(f, reps=5):
    cpu = []
    for _ in range(reps):
        t = time.thread_time_ns(); r = f(); cpu.append(time.thread_time_ns() - t)
        time.sleep(0.2)
    return st.median(cpu) / 1e3, r

def putil(h):
    try:
        return nvmlDeviceGetProcessUtilization(h, 0)
    except NVMLError_NotFound:
        return []

nvmlInit()
h = nvmlDeviceGetHandleByIndex(0)
for n in steps:
    spawn(n - len(workers))
    time.sleep(2)
    cp, procs = timed(lambda: nvmlDeviceGetComputeRunningProcesses(h))
    cu, samples = timed(lambda: putil(h))
    cm, _ = timed(lambda: nvmlDeviceGetMemoryInfo(h))
    print(f"{n:3d} processes (NVML lists {len(procs)}, {len(samples)} utilization samples): "
          f"ComputeRunningProcesses {cp:.0f} us, ProcessUtilization {cu:.0f} us, "
          f"MemoryInfo {cm:.0f} us", flush=True)

agent = os.environ.get("AGENT")
if agent:
    a = subprocess.Popen([agent, "run", "--http-addr", "127.0.0.1:9471"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stats = lambda: json.load(urllib.request.urlopen("http://127.0.0.1:9471/debug/stats"))
    time.sleep(3.5); s0 = stats(); time.sleep(10); s1 = stats()
    n = s1["nvml_samples"] - s0["nvml_samples"]
    ms = (s1["nvml_sample_cpu_ns"] - s0["nvml_sample_cpu_ns"]) / n / 1e6
    print(f"agent with {len(workers)} processes: NVML thread {ms:.2f} ms CPU per cycle over "
          f"{n} cycles, {s1['gpu_processes']} GPU processes, {s1['gpu_processes_unresolved']} "
          f"unresolved", flush=True)
    a.terminate(); a.wait()
for w in workers:
    w.kill()
