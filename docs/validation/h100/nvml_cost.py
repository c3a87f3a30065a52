# Per-call cost of the NVML calls the agent makes each cycle, on the real driver:
# thread CPU and wall time, median of N cycles spaced like the agent's (1 s apart).
import time, sys, statistics as st
from pynvml import *
nvmlInit()
N = int(sys.argv[1]) if len(sys.argv) > 1 else 8
h = nvmlDeviceGetHandleByIndex(0)
last = [0]
def putil():
    try:
        s = nvmlDeviceGetProcessUtilization(h, last[0])
        for x in s: last[0] = max(last[0], x.timeStamp)
        return len(s)
    except NVMLError_NotFound:
        return 0
gpm_prev = [None]
def gpm():
    s = nvmlGpmSampleAlloc(); nvmlGpmSampleGet(h, s)
    if gpm_prev[0] is not None:
        m = c_nvmlGpmMetricsGet_t(); m.version = NVML_GPM_METRICS_GET_VERSION
        m.numMetrics = 12; m.sample1 = gpm_prev[0]; m.sample2 = s
        ids = [NVML_GPM_METRIC_GRAPHICS_UTIL, NVML_GPM_METRIC_SM_UTIL, NVML_GPM_METRIC_SM_OCCUPANCY,
               NVML_GPM_METRIC_ANY_TENSOR_UTIL, NVML_GPM_METRIC_DRAM_BW_UTIL, NVML_GPM_METRIC_FP64_UTIL,
               NVML_GPM_METRIC_FP32_UTIL, NVML_GPM_METRIC_FP16_UTIL, NVML_GPM_METRIC_PCIE_TX_PER_SEC,
               NVML_GPM_METRIC_PCIE_RX_PER_SEC, NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC]
        for i, x in enumerate(ids): m.metrics[i].metricId = x
        nvmlGpmMetricsGet(m)
        nvmlGpmSampleFree(gpm_prev[0])
    gpm_prev[0] = s
es = nvmlEventSetCreate(); nvmlDeviceRegisterEvents(h, nvmlEventTypeXidCriticalError, es)
def ev():
    try: nvmlEventSetWait_v2(es, 0)
    except NVMLError: pass
calls = {
 "DeviceGetCount": lambda: nvmlDeviceGetCount(),
 "SystemGetDriverVersion": lambda: nvmlSystemGetDriverVersion(),
 "DeviceGetHandleByIndex": lambda: nvmlDeviceGetHandleByIndex(0),
 "UUID": lambda: nvmlDeviceGetUUID(h), "Name": lambda: nvmlDeviceGetName(h),
 "PciInfo": lambda: nvmlDeviceGetPciInfo(h), "MemoryInfo_v2": lambda: nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2),
 "UtilizationRates": lambda: nvmlDeviceGetUtilizationRates(h), "PowerUsage": lambda: nvmlDeviceGetPowerUsage(h),
 "TotalEnergyConsumption": lambda: nvmlDeviceGetTotalEnergyConsumption(h),
 "Temperature": lambda: nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU),
 "ClockInfo SM": lambda: nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM), "ClockInfo MEM": lambda: nvmlDeviceGetClockInfo(h, NVML_CLOCK_MEM),
 "TotalEccErrors corr": lambda: nvmlDeviceGetTotalEccErrors(h, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC),
 "TotalEccErrors unc": lambda: nvmlDeviceGetTotalEccErrors(h, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC),
 "CurrentClocksThrottleReasons": lambda: nvmlDeviceGetCurrentClocksThrottleReasons(h),
 "MigMode": lambda: nvmlDeviceGetMigMode(h), "MinorNumber": lambda: nvmlDeviceGetMinorNumber(h),
 "ComputeRunningProcesses": lambda: nvmlDeviceGetComputeRunningProcesses(h),
 "GraphicsRunningProcesses": lambda: nvmlDeviceGetGraphicsRunningProcesses(h),
 "MPSComputeRunningProcesses": lambda: nvmlDeviceGetMPSComputeRunningProcesses(h),
 "ProcessUtilization": putil,
 "EncoderUtilization": lambda: nvmlDeviceGetEncoderUtilization(h), "DecoderUtilization": lambda: nvmlDeviceGetDecoderUtilization(h),
 "PcieReplayCounter": lambda: nvmlDeviceGetPcieReplayCounter(h), "RemappedRows": lambda: nvmlDeviceGetRemappedRows(h),
 "FieldValues(3)": lambda: nvmlDeviceGetFieldValues(h, [NVML_FI_DEV_MEMORY_TEMP, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX]),
 "GpmQueryDeviceSupport": lambda: nvmlGpmQueryDeviceSupport(h),
 "GpmSampleGet+MetricsGet": gpm, "EventSetWait_v2(0)": ev,
}
res = {k: ([], []) for k in calls}
for it in range(N):
    for k, f in calls.items():
        c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
        try: f(); err = ""
        except Exception as e: err = repr(e)[:60]
        c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
        res[k][0].append(c1 - c0); res[k][1].append(w1 - w0)
        if it == 0 and err: print("ERR", k, err)
    time.sleep(1)
tc = tw = 0
print(f"{'call':32} {'cpu us':>9} {'wall us':>9}   (median of {N})")
for k, (c, w) in sorted(res.items(), key=lambda kv: -st.median(kv[1][0])):
    mc, mw = st.median(c) / 1e3, st.median(w) / 1e3; tc += mc; tw += mw
    print(f"{k:32} {mc:9.1f} {mw:9.1f}")
print(f"{'TOTAL':32} {tc:9.1f} {tw:9.1f}")
