# Can a cycle skip per-process utilization when the device says it was idle?
# A child runs short bursts of matmuls at random times; every second, as the agent does,
# read the device's utilization, then the processes' samples since the last one. Prints
# each cycle, the device's own sample spacing, what each call cost, and every cycle where
# the device said 0 % but a process sample since the last cycle was busy.
import os, random, sys, time
from pynvml import *

SECS = float(sys.argv[1]) if len(sys.argv) > 1 else 40

if os.fork() == 0:
    import torch
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    rnd = random.Random(7)
    end = time.time() + SECS + 5
    while time.time() < end:
        time.sleep(rnd.uniform(0.2, 2.5))
        t = time.time() + rnd.uniform(0.02, 0.15)
        while time.time() < t:
            b = a @ a
        torch.cuda.synchronize()
    os._exit(0)

nvmlInit()
h = nvmlDeviceGetHandleByIndex(0)
time.sleep(8)  # the child's CUDA start-up
last_ts, last_dev = 0, 0
missed, cycles, cost_u, cost_p = 0, 0, [], []
spacing = []
end = time.time() + SECS
while time.time() < end:
    time.sleep(1.0)
    c0 = time.thread_time_ns()
    u = nvmlDeviceGetUtilizationRates(h)
    c1 = time.thread_time_ns()
    try:
        samples = nvmlDeviceGetProcessUtilization(h, last_ts)
    except NVMLError_NotFound:
        samples = []
    c2 = time.thread_time_ns()
    cost_u.append(c1 - c0); cost_p.append(c2 - c1)
    try:
        _, dev = nvmlDeviceGetSamples(h, NVML_GPU_UTILIZATION_SAMPLES, last_dev)
        ts = [s.timeStamp for s in dev]
        spacing += [b - a for a, b in zip(ts, ts[1:])]
        if ts: last_dev = max(ts)
        dev_max = max((s.sampleValue.uiVal for s in dev), default=None)
    except NVMLError:
        dev_max = None
    busy = [(s.pid, s.smUtil, s.memUtil) for s in samples if s.smUtil or s.memUtil]
    for s in samples: last_ts = max(last_ts, s.timeStamp)
    cycles += 1
    flag = ""
    if u.gpu == 0 and u.memory == 0 and busy:
        missed += 1; flag = "  <- device idle, a process busy"
    print(f"gpu {u.gpu:3d}% mem {u.memory:3d}%  device samples max {dev_max}  processes {busy}{flag}", flush=True)
med = lambda v: sorted(v)[len(v) // 2]
print(f"{cycles} cycles, {missed} with the device at 0 % and a process busy")
print(f"device utilization samples every {med(spacing) / 1e3 if spacing else float('nan'):.0f} ms (median of {len(spacing)})")
print(f"cost per call (thread CPU, median): UtilizationRates {med(cost_u) / 1e3:.0f} us, ProcessUtilization {med(cost_p) / 1e3:.0f} us")
