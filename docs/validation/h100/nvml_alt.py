# Cheaper ways to the costly readings? Median thread CPU / wall per call, N cycles 1 s apart.
import time, sys, statistics as st
from pynvml import *
nvmlInit()
N = int(sys.argv[1]) if len(sys.argv) > 1 else 6
h = nvmlDeviceGetHandleByIndex(0)
FI = lambda *ids: (lambda: nvmlDeviceGetFieldValues(h, list(ids)))
def fv_check():
    for v in nvmlDeviceGetFieldValues(h, [NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, NVML_FI_DEV_PCIE_REPLAY_COUNTER, NVML_FI_DEV_MEMORY_TEMP]):
        print("field", v.fieldId, "ret", v.nvmlReturn, "type", v.valueType, "ull", v.value.ullVal, "ts", v.timestamp, "lat", v.latencyUsec)
    print("energy api", nvmlDeviceGetTotalEnergyConsumption(h), "replay api", nvmlDeviceGetPcieReplayCounter(h))
fv_check()
def util_info():
    try:
        return nvmlDeviceGetProcessesUtilizationInfo(h, 0)
    except Exception as e:
        return e
calls = {
 "energy API": lambda: nvmlDeviceGetTotalEnergyConsumption(h),
 "energy API again (at once)": lambda: nvmlDeviceGetTotalEnergyConsumption(h),
 "FV energy": FI(NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION),
 "FV pcie replay": FI(NVML_FI_DEV_PCIE_REPLAY_COUNTER),
 "FV mem temp + nvlink tx/rx": FI(NVML_FI_DEV_MEMORY_TEMP, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX),
 "FV all 5": FI(NVML_FI_DEV_MEMORY_TEMP, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, NVML_FI_DEV_PCIE_REPLAY_COUNTER),
 "FV power instant": FI(NVML_FI_DEV_POWER_INSTANT),
 "pcie replay API": lambda: nvmlDeviceGetPcieReplayCounter(h),
 "MigMode": lambda: nvmlDeviceGetMigMode(h),
 "ProcessUtilization(0)": lambda: nvmlDeviceGetProcessUtilization(h, 0),
 "ProcessesUtilizationInfo": util_info,
 "ComputeRunningProcesses": lambda: nvmlDeviceGetComputeRunningProcesses(h),
}
def run(label):
    res = {k: ([], []) for k in calls}
    for it in range(N):
        for k, f in calls.items():
            c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
            try: f()
            except Exception as e:
                if it == 0: print("ERR", k, repr(e)[:80])
            res[k][0].append(time.thread_time_ns() - c0); res[k][1].append(time.perf_counter_ns() - w0)
        time.sleep(1)
    print(f"== {label}: {'call':30} {'cpu us':>9} {'wall us':>9} (median of {N})")
    for k, (c, w) in res.items():
        print(f"{k:40} {st.median(c)/1e3:9.1f} {st.median(w)/1e3:9.1f}")
run(sys.argv[2] if len(sys.argv) > 2 else "")
