# What the fake library's cost model (fake-nvml/src/cost.rs) guesses, measured on the real
# driver with nothing but the Python standard library (ctypes against libnvidia-ml.so.1):
#   1. each call the agent makes per GPU and cycle: thread CPU per call;
#   2. the size call (NULL buffer, count 0) against the data call, for per-process
#      utilization and the compute, graphics and MPS process lists;
#   3. one nvmlDeviceGetFieldValues with the ids that could be folded into it (ECC, remapped
#      rows, power, energy, PCIe replays) against the separate calls, values side by side;
#   4. with exactly one compute process on the GPU: the device's utilization against that
#      process's SM figure, each cycle (could the device's figure stand for the process's?).
# Usage: python3 nvml_calls.py [CYCLES=8] [GPU_INDEX=0]; medians of CYCLES cycles 1 s apart.
import ctypes as C, statistics as st, sys, time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 8
INDEX = int(sys.argv[2]) if len(sys.argv) > 2 else 0
nv = C.CDLL("libnvidia-ml.so.1")
U, ULL = C.c_uint, C.c_ulonglong
SUCCESS, INSUFFICIENT_SIZE, NOT_FOUND = 0, 7, 6


class ProcessInfo(C.Structure):  # nvmlProcessInfo_t (v2/v3), 24 bytes
    _fields_ = [("pid", U), ("usedGpuMemory", ULL), ("gi", U), ("ci", U)]


class UtilSample(C.Structure):  # nvmlProcessUtilizationSample_t, 32 bytes
    _fields_ = [("pid", U), ("timeStamp", ULL), ("sm", U), ("mem", U), ("enc", U), ("dec", U)]


class FieldValue(C.Structure):  # nvmlFieldValue_t, 40 bytes
    _fields_ = [("fieldId", U), ("scopeId", U), ("timestamp", C.c_longlong),
                ("latencyUsec", C.c_longlong), ("valueType", C.c_int), ("nvmlReturn", C.c_int),
                ("value", ULL)]


class Memory2(C.Structure):  # nvmlMemory_v2_t
    _fields_ = [("version", U), ("total", ULL), ("reserved", ULL), ("free", ULL), ("used", ULL)]


class Utilization(C.Structure):
    _fields_ = [("gpu", U), ("memory", U)]


assert C.sizeof(ProcessInfo) == 24 and C.sizeof(UtilSample) == 32 and C.sizeof(FieldValue) == 40
assert nv.nvmlInit_v2() == SUCCESS
h = C.c_void_p()
assert nv.nvmlDeviceGetHandleByIndex_v2(U(INDEX), C.byref(h)) == SUCCESS
last_seen = [0]


def list_call(name):
    """The size call, then the data call with room for what it said (and 5 more, as
    nvml-wrapper asks): timed apart."""
    f, said = getattr(nv, name), [0]
    def size():
        n = U(0)
        r = f(h, C.byref(n), None)
        said[0] = n.value
        return r, n.value
    def data():
        n = U(said[0] + 5)
        buf = (ProcessInfo * n.value)()
        r = f(h, C.byref(n), buf)
        return r, [buf[i].pid for i in range(n.value)] if r == SUCCESS else []
    return size, data


def putil_size():
    n = U(0)
    return nv.nvmlDeviceGetProcessUtilization(h, None, C.byref(n), ULL(last_seen[0])), n.value


def putil_data(n=64):
    cnt = U(n); buf = (UtilSample * n)()
    r = nv.nvmlDeviceGetProcessUtilization(h, buf, C.byref(cnt), ULL(last_seen[0]))
    out = [(buf[i].pid, buf[i].timeStamp, buf[i].sm) for i in range(cnt.value)] if r == SUCCESS else []
    for _, ts, _ in out:
        last_seen[0] = max(last_seen[0], ts)
    return r, out


def fields(ids):
    vals = (FieldValue * len(ids))()
    for i, (fid, scope) in enumerate(ids):
        vals[i].fieldId, vals[i].scopeId = fid, scope
    r = nv.nvmlDeviceGetFieldValues(h, len(ids), vals)
    return r, [(v.fieldId, v.nvmlReturn, v.value) for v in vals]


def out1(name, *types):
    vals = [t() for t in types]
    return lambda *a: (getattr(nv, name)(h, *a, *[C.byref(v) for v in vals]), [v.value for v in vals])


def memory():
    m = Memory2(); m.version = C.sizeof(Memory2) | (2 << 24)
    return nv.nvmlDeviceGetMemoryInfo_v2(h, C.byref(m)), m.used


def utilization():
    x = Utilization()
    return nv.nvmlDeviceGetUtilizationRates(h, C.byref(x)), x.gpu


def grid():
    buf = C.create_string_buffer(860)
    return nv.nvmlDeviceGetGridLicensableFeatures_v4(h, buf), None


def driver():
    buf = C.create_string_buffer(96)
    return nv.nvmlSystemGetDriverVersion(buf, 96), buf.value


def uuid():
    buf = C.create_string_buffer(96)
    return nv.nvmlDeviceGetUUID(h, buf, 96), buf.value


def handle():
    x = C.c_void_p()
    return nv.nvmlDeviceGetHandleByIndex_v2(U(INDEX), C.byref(x)), None


ALL = 0xFFFFFFFF
THREE = [(82, 0), (138, ALL), (139, ALL)]  # memory temperature, NVLink tx/rx: what the agent asks
# nvml.h: 3/4 ECC single/double bit volatile totals (nvmlDeviceGetTotalEccErrors corrected /
# uncorrected, volatile), 142-145 remapped rows (nvmlDeviceGetRemappedRows), 185/186 power
# average/instant (nvmlDeviceGetPowerUsage is the 1 s average from Ampere on, except GA100),
# 83 energy, 94 PCIe replays.
FOLD = THREE + [(3, 0), (4, 0), (142, 0), (143, 0), (144, 0), (145, 0), (185, 0), (186, 0)]
cs, cd = list_call("nvmlDeviceGetComputeRunningProcesses_v3")
gs, gd = list_call("nvmlDeviceGetGraphicsRunningProcesses_v3")
ms, md = list_call("nvmlDeviceGetMPSComputeRunningProcesses_v3")
calls = {
    "SystemGetDriverVersion": driver,
    "DeviceGetCount_v2": lambda: (nv.nvmlDeviceGetCount_v2(C.byref(U())), None),
    "DeviceGetHandleByIndex_v2": handle,
    "DeviceGetUUID": uuid,
    "DeviceGetMemoryInfo_v2": memory,
    "DeviceGetUtilizationRates": utilization,
    "DeviceGetPowerUsage": out1("nvmlDeviceGetPowerUsage", U),
    "DeviceGetTemperature": lambda: out1("nvmlDeviceGetTemperature", U)(0),
    "DeviceGetClockInfo (SM)": lambda: out1("nvmlDeviceGetClockInfo", U)(1),
    "DeviceGetTotalEccErrors (corrected)": lambda: out1("nvmlDeviceGetTotalEccErrors", ULL)(0, 0),
    "DeviceGetTotalEccErrors (uncorrected)": lambda: out1("nvmlDeviceGetTotalEccErrors", ULL)(1, 0),
    "DeviceGetCurrentClocksEventReasons": out1("nvmlDeviceGetCurrentClocksEventReasons", ULL),
    "DeviceGetEncoderUtilization": out1("nvmlDeviceGetEncoderUtilization", U, U),
    "DeviceGetRemappedRows": out1("nvmlDeviceGetRemappedRows", U, U, U, U),
    "DeviceGetGridLicensableFeatures_v4": grid,
    "DeviceGetFieldValues (the 3 ids the agent asks)": lambda: fields(THREE),
    "DeviceGetFieldValues (the 3 + ECC, remapped, power)": lambda: fields(FOLD),
    "DeviceGetFieldValues (energy alone)": lambda: fields([(83, 0)]),
    "DeviceGetTotalEnergyConsumption": out1("nvmlDeviceGetTotalEnergyConsumption", ULL),
    "DeviceGetPcieReplayCounter": out1("nvmlDeviceGetPcieReplayCounter", U),
    "DeviceGetMigMode": out1("nvmlDeviceGetMigMode", U, U),
    "ComputeRunningProcesses: size call": cs,
    "ComputeRunningProcesses: data call": cd,
    "GraphicsRunningProcesses: size call": gs,
    "GraphicsRunningProcesses: data call": gd,
    "MPSComputeRunningProcesses: size call": ms,
    "MPSComputeRunningProcesses: data call": md,
    "ProcessUtilization: size call": putil_size,
    "ProcessUtilization: data call": putil_data,
}
cpu = {k: [] for k in calls}
answers = {}
single = []  # (device %, the one process's SM %) per cycle
for it in range(N):
    for k, f in calls.items():
        c0 = time.thread_time_ns()
        r = f()
        cpu[k].append(time.thread_time_ns() - c0)
        answers[k] = r
    procs = answers["ComputeRunningProcesses: data call"][1]
    if len(procs) == 1:
        samples = [s for s in answers["ProcessUtilization: data call"][1] if s[0] == procs[0]]
        dev = answers["DeviceGetUtilizationRates"][1]
        single.append((dev, samples[-1][2] if samples else None))
    time.sleep(1)

print(f"== per call, thread CPU, median of {N} (return code of the last)")
for k, v in cpu.items():
    print(f"{k:55} {st.median(v)/1e3:9.1f} us   ret {answers[k][0]}")
a = {k: st.median(v) / 1e3 for k, v in cpu.items()}
print("\n== size call against data call (us)")
for n in ["ProcessUtilization", "ComputeRunningProcesses", "GraphicsRunningProcesses",
          "MPSComputeRunningProcesses"]:
    s, d = a[f"{n}: size call"], a[f"{n}: data call"]
    print(f"{n:30} size {s:8.1f}  data {d:8.1f}  size share {s / max(s + d, 1e-9):.0%}")
print("\n== field values against the separate calls (us)")
sep = (a["DeviceGetTotalEccErrors (corrected)"] + a["DeviceGetTotalEccErrors (uncorrected)"]
       + a["DeviceGetRemappedRows"] + a["DeviceGetPowerUsage"])
print(f"3 ids {a['DeviceGetFieldValues (the 3 ids the agent asks)']:.1f} + ECC x2, remapped rows, power {sep:.1f}"
      f" = {a['DeviceGetFieldValues (the 3 ids the agent asks)'] + sep:.1f}"
      f"  against one call of {len(FOLD)} ids {a['DeviceGetFieldValues (the 3 + ECC, remapped, power)']:.1f}")
fv = dict((fid, (ret, v)) for fid, ret, v in answers["DeviceGetFieldValues (the 3 + ECC, remapped, power)"][1])
pairs = [("ECC corrected / id 3", answers["DeviceGetTotalEccErrors (corrected)"][1][0], fv.get(3)),
         ("ECC uncorrected / id 4", answers["DeviceGetTotalEccErrors (uncorrected)"][1][0], fv.get(4)),
         ("remapped rows / ids 142-145", answers["DeviceGetRemappedRows"][1], [fv.get(i) for i in range(142, 146)]),
         ("power mW / ids 185 (avg), 186 (instant)", answers["DeviceGetPowerUsage"][1][0], [fv.get(185), fv.get(186)])]
for name, call, field in pairs:
    print(f"{name:42} call {call}  field (ret, value) {field}")
print("\n== one compute process: device utilization against the process's SM")
if not single:
    print("not measured: the GPU did not run exactly one compute process")
else:
    diffs = [abs(d - p) for d, p in single if p is not None]
    print("per cycle (device %, process SM %):", single)
    if diffs:
        print(f"|device - process|: median {st.median(diffs)}, max {max(diffs)} over {len(diffs)} cycles with a sample")
