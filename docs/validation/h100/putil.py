# How many per-process utilization samples does NVML keep, and over what span?
import time, collections
from pynvml import *
nvmlInit(); h = nvmlDeviceGetHandleByIndex(0)
def show(label, since):
    try: s = nvmlDeviceGetProcessUtilization(h, since)
    except NVMLError as e: print(label, "error", e); return 0
    by = collections.defaultdict(list)
    for x in s: by[x.pid].append((x.timeStamp, x.smUtil, x.memUtil))
    print(label, "since", since, "->", len(s), "samples")
    for pid, v in by.items():
        v.sort(); ts = [t for t, _, _ in v]
        print("  pid", pid, "n", len(v), "span_ms", (ts[-1]-ts[0])/1e3, "sm", [u for _, u, _ in v][:40])
        if len(ts) > 1: print("  gaps_ms", [round((b-a)/1e3) for a, b in zip(ts, ts[1:])][:40])
    return max((x.timeStamp for x in s), default=since)
t = show("all (since 0)", 0)
time.sleep(5)
t2 = show("after 5 s (since last)", t)
time.sleep(1)
show("after 1 s", t2)
show("since ts-10s", t2 - 10_000_000)
