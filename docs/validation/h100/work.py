# A CUDA workload of known size. mode: busy (matmuls), idle (holds memory only),
# forked (forks first; only the child touches CUDA: the fork-without-exec case).
import os, sys, time
mode, gib, secs = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
if mode == "forked":
    pid = os.fork()
    if pid:
        print(f"parent {os.getpid()} forked child {pid}", flush=True)
        os.waitpid(pid, 0)
        sys.exit(0)
import torch
x = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
print(f"{mode} pid {os.getpid()} holds {gib} GiB", flush=True)
end = time.time() + secs
if mode in ("busy", "forked"):
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while time.time() < end:
        for _ in range(20):
            b = a @ a
        torch.cuda.synchronize()
        time.sleep(0.05)
else:
    time.sleep(secs)
