# What the device's own utilization samples cost, beside per-process utilization: could a
# cycle ask the cheaper one whether the GPU was busy at all since the last cycle? A child
# holds 1 GiB and runs no kernel; 14 cycles 1 s apart, thread CPU of each call.
import time, os
from pynvml import *
if os.fork() == 0:
    import torch
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    time.sleep(40); os._exit(0)
nvmlInit(); h = nvmlDeviceGetHandleByIndex(0); time.sleep(8)
last = 0; cs = []; cp = []
for i in range(14):
    time.sleep(1)
    c0 = time.thread_time_ns()
    try:
        _, d = nvmlDeviceGetSamples(h, NVML_GPU_UTILIZATION_SAMPLES, last)
        if d: last = max(s.timeStamp for s in d)
        n = len(d); mx = max((s.sampleValue.uiVal for s in d), default=None)
    except NVMLError as e:
        n = -1; mx = str(e)
    c1 = time.thread_time_ns()
    try:
        ps = nvmlDeviceGetProcessUtilization(h, 0); r = [(p.pid, p.smUtil, p.memUtil) for p in ps]
    except NVMLError as e:
        r = str(e)
    c2 = time.thread_time_ns()
    cs.append(c1 - c0); cp.append(c2 - c1)
    print("samples", n, "max", mx, "| processes", r, "| us", (c1 - c0) // 1000, (c2 - c1) // 1000, flush=True)
print("median us: GetSamples", sorted(cs)[7] // 1000, "ProcessUtilization", sorted(cp)[7] // 1000)
