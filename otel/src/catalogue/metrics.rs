//! The metric table: gpu-agent's metrics by group (device, container, process, self), then
//! dcgm-exporter's fields, and the dcgm-exporter fields not served.
use super::{
    Attr, Dcgm, Group, Kind, Kind::*, Metric, MetricId as M, Source, AGENT, ALLOCATION, CLOCKS,
    CONTAINER, DCGM, DEVICE, DIRECTIONS, ECC_ERROR_TYPES, ERROR_TYPES, GPU_ENGINES, GPU_LINKS,
    GPU_TASKS, HELD, PROCESS, XID_CHARGE,
};

const DCGM_DEFAULT: Dcgm = Dcgm {
    source: Source::Derived(""),
    per: 1.0,
    nvml: "",
    default: true,
    mig: false,
    per_pod: None,
};

/// dcgm-exporter fields gpu-agent does not serve, and why: a counters CSV naming one is
/// refused with the reason.
pub const DCGM_UNSERVED: &[(&str, &str)] = &[
    ("DCGM_FI_DEV_POWER_VIOLATION", "not in dcgm-exporter's default set, and not read (NVML has it: nvmlDeviceGetViolationStatus); `hw_gpu_clock_throttled{hw_gpu_throttle_reason=\"sw_power_cap\"}` says the same"),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "not in dcgm-exporter's default set, and not read; `hw_gpu_clock_throttled{hw_gpu_throttle_reason=~\".*thermal.*\"}` says the same"),
    ("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "not in dcgm-exporter's default set, and not read"),
    ("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "not in dcgm-exporter's default set, and not read"),
    ("DCGM_FI_DEV_LOW_UTIL_VIOLATION", "not in dcgm-exporter's default set, and not read"),
    ("DCGM_FI_DEV_RELIABILITY_VIOLATION", "not in dcgm-exporter's default set, and not read"),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "aggregate ECC counts are not read (volatile ones are: DCGM_FI_DEV_ECC_SBE_VOL_TOTAL)"),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "aggregate ECC counts are not read (volatile ones are: DCGM_FI_DEV_ECC_DBE_VOL_TOTAL)"),
    ("DCGM_FI_DEV_RETIRED_SBE", "page retirement predates row remapping (Ampere and later use DCGM_FI_DEV_*_REMAPPED_ROWS)"),
    ("DCGM_FI_DEV_RETIRED_DBE", "page retirement predates row remapping (Ampere and later use DCGM_FI_DEV_*_REMAPPED_ROWS)"),
    ("DCGM_FI_DEV_RETIRED_PENDING", "page retirement predates row remapping (Ampere and later use DCGM_FI_DEV_ROW_REMAP_PENDING)"),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "per-link NVLink error counters are not read"),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "per-link NVLink error counters are not read"),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "per-link NVLink error counters are not read"),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "per-link NVLink error counters are not read"),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_L0", "per-link NVLink bandwidth is not read (all links: DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL)"),
    ("DCGM_FI_NVML_VERSION", "only DCGM_FI_DRIVER_VERSION is served as a label"),
    ("DCGM_FI_DEV_BRAND", "only DCGM_FI_DRIVER_VERSION is served as a label"),
    ("DCGM_FI_DEV_SERIAL", "only DCGM_FI_DRIVER_VERSION is served as a label"),
    ("DCGM_FI_DEV_OEM_INFOROM_VER", "only DCGM_FI_DRIVER_VERSION is served as a label"),
    ("DCGM_FI_DEV_ECC_INFOROM_VER", "only DCGM_FI_DRIVER_VERSION is served as a label"),
    ("DCGM_FI_DEV_POWER_INFOROM_VER", "only DCGM_FI_DRIVER_VERSION is served as a label"),
    ("DCGM_FI_DEV_INFOROM_IMAGE_VER", "only DCGM_FI_DRIVER_VERSION is served as a label"),
    ("DCGM_FI_DEV_VBIOS_VERSION", "only DCGM_FI_DRIVER_VERSION is served as a label"),
    ("DCGM_EXP_CLOCK_EVENTS_COUNT", "dcgm-exporter's own counter of DCGM clock events, which need DCGM's policy engine"),
    ("DCGM_EXP_XID_ERRORS_COUNT", "dcgm-exporter's own windowed count; gpu-agent counts every XID: `hw_errors_total{error_type=\"xid\"}`"),
    ("DCGM_EXP_GPU_HEALTH_STATUS", "DCGM's health watches, which need the DCGM host engine"),
    ("DCGM_EXP_P2P_STATUS", "DCGM's P2P status, which needs the DCGM host engine"),
    ("DCGM_FI_PROF_PIPE_INT_ACTIVE", "not among the GPM metrics gpu-agent samples"),
    ("DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE", "not among the GPM metrics gpu-agent samples"),
    ("DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE", "not among the GPM metrics gpu-agent samples"),
    ("DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE", "not among the GPM metrics gpu-agent samples"),
];

const DEVICE_METRIC: Metric = Metric {
    otlp: None,
    prometheus: None,
    unit: "1",
    kind: Kind::Gauge,
    group: Group::Device,
    help: "",
    base: DEVICE,
    extra: &[],
    dcgm: None,
    note: "",
};
const CONTAINER_METRIC: Metric = Metric {
    group: Group::Container,
    base: CONTAINER,
    ..DEVICE_METRIC
};
const PROCESS_METRIC: Metric = Metric {
    group: Group::Process,
    base: PROCESS,
    ..DEVICE_METRIC
};
const SELF_METRIC: Metric = Metric {
    group: Group::SelfMetrics,
    base: AGENT,
    ..DEVICE_METRIC
};
const DCGM_FIELD: Metric = Metric {
    group: Group::Dcgm,
    base: DCGM,
    ..DEVICE_METRIC
};

/// A dcgm-exporter field: its name, unit, type and help as its counters CSV declares them.
const fn dcgm(
    name: &'static str,
    unit: &'static str,
    kind: Kind,
    help: &'static str,
    d: Dcgm,
) -> Metric {
    Metric {
        prometheus: Some(name),
        unit,
        kind,
        help,
        dcgm: Some(d),
        ..DCGM_FIELD
    }
}

/// A field that restates `id` (its point with `sel`), `per` of ours to one of theirs.
const fn restates(
    id: MetricId,
    sel: Option<(Attr, &'static str)>,
    per: f64,
    nvml: &'static str,
) -> Dcgm {
    Dcgm {
        source: Source::Metric(id, sel),
        per,
        nvml,
        ..DCGM_DEFAULT
    }
}

/// The same, also per MIG device.
const fn restates_mig(
    id: MetricId,
    sel: Option<(Attr, &'static str)>,
    per: f64,
    nvml: &'static str,
) -> Dcgm {
    Dcgm {
        mig: true,
        ..restates(id, sel, per, nvml)
    }
}

/// Not in dcgm-exporter's default CSV: served when a counters CSV names it.
const fn optional(d: Dcgm) -> Dcgm {
    Dcgm {
        default: false,
        ..d
    }
}

const MIB_: f64 = 1_048_576.0;
const PCT: f64 = 0.01;
const GPM: &str = "nvmlGpmSampleGet, nvmlGpmMigSampleGet, nvmlGpmMetricsGet";

table! {
    /// Names a metric in [`CATALOGUE`]. Table order is the Prometheus family order.
    pub enum MetricId in CATALOGUE: [Metric] {
        // Device group (node resource).
        HwGpuMemoryUsage => Metric {
            otlp: Some("hw.gpu.memory.usage"),
            prometheus: Some("hw_gpu_memory_usage_bytes"),
            unit: "By",
            kind: UpDownCounter,
            help: "GPU memory in use, bytes.",
            note: "GPU and MIG devices",
            ..DEVICE_METRIC
        },
        HwGpuMemoryLimit => Metric {
            otlp: Some("hw.gpu.memory.limit"),
            prometheus: Some("hw_gpu_memory_limit_bytes"),
            unit: "By",
            kind: UpDownCounter,
            help: "GPU memory size, bytes.",
            note: "GPU and MIG devices",
            ..DEVICE_METRIC
        },
        HwGpuMemoryUtilization => Metric {
            otlp: Some("hw.gpu.memory.utilization"),
            prometheus: Some("hw_gpu_memory_utilization_ratio"),
            help: "GPU memory in use over its size (0-1).",
            note: "GPU and MIG devices",
            ..DEVICE_METRIC
        },
        HwGpuUtilization => Metric {
            otlp: Some("hw.gpu.utilization"),
            prometheus: Some("hw_gpu_utilization_ratio"),
            help: "Fraction of the last sample period the GPU was busy (general: a kernel ran; memory_controller: memory was read or written).",
            extra: &[Attr::HwGpuTask],
            note: "Devices report `general` and `memory_controller` (NVML utilization rates); absent under MIG",
            ..DEVICE_METRIC
        },
        HwPower => Metric {
            otlp: Some("hw.power"),
            prometheus: Some("hw_power_watts"),
            unit: "W",
            help: "GPU power draw, watts.",
            ..DEVICE_METRIC
        },
        HwEnergy => Metric {
            otlp: Some("hw.energy"),
            prometheus: Some("hw_energy_joules_total"),
            unit: "J",
            kind: Counter,
            help: "GPU energy consumed since the driver loaded, joules.",
            ..DEVICE_METRIC
        },
        HwTemperature => Metric {
            otlp: Some("hw.temperature"),
            prometheus: Some("hw_temperature_celsius"),
            unit: "Cel",
            help: "GPU core temperature, degrees Celsius.",
            ..DEVICE_METRIC
        },
        HwErrors => Metric {
            otlp: Some("hw.errors"),
            prometheus: Some("hw_errors_total"),
            unit: "{error}",
            kind: Counter,
            help: "GPU errors: memory ECC (since the driver loaded), PCIe link replays, XIDs (since the agent started).",
            extra: &[Attr::ErrorType, Attr::Xid],
            note: "ECC: volatile counts, `error.type` = `corrected` / `uncorrected`; `pcie_replay`: link-level retries; `xid`: critical XID errors from NVML's event API, one series per code (`xid`)",
            ..DEVICE_METRIC
        },
        HwStatus => Metric {
            otlp: Some("hw.status"),
            prometheus: Some("hw_status"),
            kind: UpDownCounter,
            help: "1 for the GPU's current state (ok, or failed when lost or unreachable), 0 for the other.",
            extra: &[Attr::HwState],
            note: "A lost GPU gets this metric only",
            ..DEVICE_METRIC
        },
        NvmlStalled => Metric {
            otlp: Some("gpu_agent.nvml.stalled"),
            prometheus: Some("gpu_agent_nvml_stalled"),
            kind: UpDownCounter,
            help: "1 while an NVML call on the GPU has not returned for nvml.stall_timeout_ms (a wedged driver), else 0.",
            note: "A stalled GPU is `failed` in `hw.status` and has no other series: its last readings are not repeated",
            ..DEVICE_METRIC
        },
        HwGpuClock => Metric {
            otlp: Some("hw.gpu.clock"),
            prometheus: Some("hw_gpu_clock_hertz"),
            unit: "Hz",
            help: "GPU clock frequency, hertz.",
            extra: &[Attr::Clock],
            ..DEVICE_METRIC
        },
        // Health, profiling and interconnect (dcgm-exporter's fields, in our names).
        HwGpuMemoryReserved => Metric {
            otlp: Some("hw.gpu.memory.reserved"),
            prometheus: Some("hw_gpu_memory_reserved_bytes"),
            unit: "By",
            kind: UpDownCounter,
            help: "GPU memory the driver reserves for itself, bytes.",
            ..DEVICE_METRIC
        },
        HwGpuMemoryTemperature => Metric {
            otlp: Some("hw.gpu.memory.temperature"),
            prometheus: Some("hw_gpu_memory_temperature_celsius"),
            unit: "Cel",
            help: "GPU memory (HBM) temperature, degrees Celsius.",
            ..DEVICE_METRIC
        },
        HwGpuMemoryRemappedRows => Metric {
            otlp: Some("hw.gpu.memory.remapped_rows"),
            prometheus: Some("hw_gpu_memory_remapped_rows_total"),
            unit: "{row}",
            kind: Counter,
            help: "GPU memory rows remapped after ECC errors, by the kind of error.",
            extra: &[Attr::ErrorType],
            note: "Ampere and later; `error.type` = `corrected` / `uncorrected`",
            ..DEVICE_METRIC
        },
        HwGpuMemoryRowRemapPending => Metric {
            otlp: Some("hw.gpu.memory.row_remap.pending"),
            prometheus: Some("hw_gpu_memory_row_remap_pending"),
            help: "1 while a row remapping waits for the next GPU reset.",
            ..DEVICE_METRIC
        },
        HwGpuMemoryRowRemapFailed => Metric {
            otlp: Some("hw.gpu.memory.row_remap.failed"),
            prometheus: Some("hw_gpu_memory_row_remap_failed"),
            help: "1 when a row remapping failed: the GPU needs service.",
            ..DEVICE_METRIC
        },
        HwGpuIo => Metric {
            otlp: Some("hw.gpu.io"),
            prometheus: Some("hw_gpu_io_bytes_total"),
            unit: "By",
            kind: Counter,
            help: "Bytes moved over the GPU's NVLinks since the driver loaded, all links.",
            extra: &[Attr::HwGpuLink, Attr::NetworkIoDirection],
            note: "`hw.gpu.link` = `nvlink`; NVML counts KiB (`NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX`/`_RX`)",
            ..DEVICE_METRIC
        },
        HwGpuBandwidth => Metric {
            otlp: Some("hw.gpu.bandwidth"),
            prometheus: Some("hw_gpu_bandwidth_bytes_per_second"),
            unit: "By/s",
            help: "PCIe and NVLink traffic over the last profiling period (nvml.gpm_interval_ms), bytes per second (NVML GPM).",
            extra: &[Attr::HwGpuLink, Attr::NetworkIoDirection],
            note: "GPU and MIG devices, Hopper and later; absent where GPM is unsupported (`/debug/stats` says why)",
            ..DEVICE_METRIC
        },
        HwGpuActivity => Metric {
            otlp: Some("hw.gpu.activity"),
            prometheus: Some("hw_gpu_activity_ratio"),
            help: "Fraction of the last profiling period (nvml.gpm_interval_ms) each unit was active (NVML GPM).",
            extra: &[Attr::HwGpuEngine],
            note: "GPU and MIG devices, Hopper and later; absent where GPM is unsupported (`/debug/stats` says why)",
            ..DEVICE_METRIC
        },
        HwGpuSmOccupancy => Metric {
            otlp: Some("hw.gpu.sm.occupancy"),
            prometheus: Some("hw_gpu_sm_occupancy_ratio"),
            help: "Warps resident on the SMs over the maximum, averaged over the last profiling period (nvml.gpm_interval_ms; NVML GPM).",
            note: "As `hw.gpu.activity`",
            ..DEVICE_METRIC
        },
        HwGpuClockThrottled => Metric {
            otlp: Some("hw.gpu.clock.throttled"),
            prometheus: Some("hw_gpu_clock_throttled"),
            help: "1 while the clocks are held down for this reason, 0 otherwise.",
            extra: &[Attr::ThrottleReason],
            note: "One series per reason NVML knows",
            ..DEVICE_METRIC
        },
        HwGpuVgpuLicensed => Metric {
            otlp: Some("hw.gpu.vgpu.licensed"),
            prometheus: Some("hw_gpu_vgpu_licensed"),
            help: "1 when the vGPU license is held, 0 otherwise (also where the GPU has no GRID licensing).",
            ..DEVICE_METRIC
        },
        // Container group (container resource; the host entry's on the node resource).
        ContainerGpuMemoryUsage => Metric {
            otlp: Some("container.gpu.memory.usage"),
            prometheus: Some("container_gpu_memory_usage_bytes"),
            unit: "By",
            kind: UpDownCounter,
            help: "GPU memory held by the container's processes, bytes.",
            ..CONTAINER_METRIC
        },
        ContainerGpuUtilization => Metric {
            otlp: Some("container.gpu.utilization"),
            prometheus: Some("container_gpu_utilization_ratio"),
            help: "The container's share of the device's engines over the last sample period (0-1).",
            extra: &[Attr::HwGpuTask],
            note: "Its processes' utilization since the last sample, summed and capped at 1; absent where the device cannot say (MIG)",
            ..CONTAINER_METRIC
        },
        ContainerGpuTime => Metric {
            otlp: Some("container.gpu.time"),
            prometheus: Some("container_gpu_time_seconds_total"),
            unit: "s",
            kind: Counter,
            help: "GPU time used: seconds weighted by SM utilization.",
            note: "Absent where the device cannot say its processes' SM utilization (MIG: see the MIG device's `hw.gpu.activity`), never 0 for unknown. OTLP start time: when the agent first saw this container on this device",
            ..CONTAINER_METRIC
        },
        ContainerGpuMemoryTime => Metric {
            otlp: Some("container.gpu.memory.time"),
            prometheus: Some("container_gpu_memory_byte_seconds_total"),
            unit: "By.s",
            kind: Counter,
            help: "GPU memory held over time, byte-seconds.",
            note: "For chargeback; OTLP start time as `container.gpu.time`",
            ..CONTAINER_METRIC
        },
        ContainerGpuProcesses => Metric {
            otlp: Some("container.gpu.processes"),
            prometheus: Some("container_gpu_processes"),
            unit: "{process}",
            kind: UpDownCounter,
            help: "Processes of the container on the device.",
            ..CONTAINER_METRIC
        },
        ContainerGpuAllocated => Metric {
            otlp: Some("container.gpu.allocated"),
            prometheus: Some("container_gpu_allocated"),
            unit: "{gpu}",
            kind: UpDownCounter,
            help: "1 for each device the kubelet allocated to the container.",
            base: ALLOCATION,
            note: "Through a device plugin or a DRA claim (`claim`, `claim_namespace`); a device one claim gives several containers is 1 in each",
            ..CONTAINER_METRIC
        },
        ContainerGpuAllocatedIdle => Metric {
            otlp: Some("container.gpu.allocated.idle"),
            prometheus: Some("container_gpu_allocated_idle"),
            help: "1 when the container holds this allocated device but used neither its memory nor its SMs.",
            base: ALLOCATION,
            ..CONTAINER_METRIC
        },
        ContainerGpuErrors => Metric {
            otlp: Some("container.gpu.errors"),
            prometheus: Some("container_gpu_errors_total"),
            unit: "{error}",
            kind: Counter,
            help: "XID errors of the device that the kernel log charged to the container's processes.",
            base: XID_CHARGE,
            extra: &[Attr::ErrorType, Attr::Xid],
            note: "From `NVRM: Xid (...): N, pid=P` lines of /dev/kmsg, since the agent started; the series stays after the process (or container) is gone",
            ..CONTAINER_METRIC
        },
        // Sharing and billing (container resource; the idle entry on the node resource).
        ContainerGpuEnergy => Metric {
            otlp: Some("container.gpu.energy"),
            prometheus: Some("container_gpu_energy_joules_total"),
            unit: "J",
            kind: Counter,
            help: "The container's share of the GPU's energy, joules.",
            extra: &[Attr::Owner],
            note: "Each interval's energy is split by SM-utilization share (memory share where none is known, e.g. MIG); the idle rest goes to the containers the GPU is allocated to, else to an `owner=\"idle\"` entry per GPU, so the containers and the idle entry sum to `hw.energy`. OTLP start time: the first charge",
            ..CONTAINER_METRIC
        },
        ContainerGpuMemoryPeak => Metric {
            otlp: Some("container.gpu.memory.peak"),
            prometheus: Some("container_gpu_memory_peak_bytes"),
            unit: "By",
            help: "Most GPU memory the container held on the device over the peak window, bytes.",
            note: "Window: `usage.peak_window_secs` (match it to the export interval); includes NVML accounting's max memory of processes that exited",
            ..CONTAINER_METRIC
        },
        // Rightsizing's inputs (deploy/prometheus/gpu-agent-rightsizing.yaml): what an
        // open stretch holds, with the GPU's model, as the usage records say it.
        ContainerGpuShare => Metric {
            prometheus: Some("container_gpu_share"),
            unit: "{gpu}",
            help: "The part of a GPU the container holds on the device while it has a process there or holds its allocation.",
            base: HELD,
            note: "Its allocation: 1 for a whole GPU, the time-slicing replicas it holds over the GPU's, a MIG profile's compute slices over the GPU's, and of a device one DRA claim gives N containers, 1/N of that (see [Shared DRA claims](#shared-dra-claims)); a device it uses without an allocation counts its part of the GPU. `model` is the GPU's (a MIG device's parent's). As the usage records' `gpus_allocated`; Prometheus only (OTLP has the records' logs)",
            ..CONTAINER_METRIC
        },
        ContainerGpuSmShare => Metric {
            prometheus: Some("container_gpu_sm_share"),
            unit: "{gpu}",
            help: "The container's SM use on the device as a part of a whole GPU (0-1), over the last sample period.",
            base: HELD,
            note: "The figure its usage profile takes (GPM's SM activity where the container is the device's only user, else its processes' utilization), times a MIG device's part of the GPU. Absent where unknown. Prometheus only",
            ..CONTAINER_METRIC
        },
        ContainerGpuMemoryLimit => Metric {
            otlp: Some("container.gpu.memory.limit"),
            prometheus: Some("container_gpu_memory_limit_bytes"),
            unit: "By",
            kind: UpDownCounter,
            help: "The container's GPU memory limit on the device, bytes, where one is known.",
            extra: &[Attr::LimitSource],
            note: "HAMi's `CUDA_DEVICE_MEMORY_LIMIT[_N]`, else the MIG device's size, else the container's time-slicing replicas over the GPU's, times its memory. `container_gpu_memory_usage_bytes / container_gpu_memory_limit_bytes` is how near its quota it is",
            ..CONTAINER_METRIC
        },
        ContainerGpuUtilizationLimit => Metric {
            otlp: Some("container.gpu.utilization.limit"),
            prometheus: Some("container_gpu_utilization_limit_ratio"),
            help: "The container's SM utilization limit on the device (0-1): HAMi's CUDA_DEVICE_SM_LIMIT.",
            ..CONTAINER_METRIC
        },
        ContainerGpuAccountingTime => Metric {
            otlp: Some("container.gpu.accounting.time"),
            prometheus: Some("container_gpu_accounting_time_seconds_total"),
            unit: "s",
            kind: Counter,
            help: "GPU time of the container's exited processes from NVML accounting: run time x average utilization.",
            note: "Read when the kernel reports the exit of a process NVML listed, on GPUs in accounting mode; catches jobs shorter than the sampling interval",
            ..CONTAINER_METRIC
        },
        ContainerGpuAccountingProcesses => Metric {
            otlp: Some("container.gpu.accounting.processes"),
            prometheus: Some("container_gpu_accounting_processes_total"),
            unit: "{process}",
            kind: Counter,
            help: "Exited processes of the container whose NVML accounting stats were charged.",
            ..CONTAINER_METRIC
        },
        // Process group (opt-in; container resource).
        ProcessGpuMemoryUsage => Metric {
            otlp: Some("process.gpu.memory.usage"),
            prometheus: Some("process_gpu_memory_usage_bytes"),
            unit: "By",
            kind: UpDownCounter,
            help: "GPU memory held by the process on the device, bytes.",
            ..PROCESS_METRIC
        },
        ProcessGpuUtilization => Metric {
            otlp: Some("process.gpu.utilization"),
            prometheus: Some("process_gpu_utilization_ratio"),
            help: "The process's share of the device's engines over the last sample period (0-1).",
            extra: &[Attr::HwGpuTask],
            ..PROCESS_METRIC
        },
        // Self group (node resource).
        EventsReceived => Metric {
            otlp: Some("gpu_agent.events.received"),
            prometheus: Some("gpu_agent_events_received_total"),
            kind: Counter,
            help: "Process and cgroup notifications received from the kernel.",
            ..SELF_METRIC
        },
        EventsLost => Metric {
            otlp: Some("gpu_agent.events.lost"),
            prometheus: Some("gpu_agent_events_lost_total"),
            kind: Counter,
            help: "Kernel notifications lost (ring buffer full).",
            note: "The kernel's own count; each loss triggers a resync",
            ..SELF_METRIC
        },
        Resyncs => Metric {
            otlp: Some("gpu_agent.resyncs"),
            prometheus: Some("gpu_agent_resyncs_total"),
            kind: Counter,
            help: "Resyncs of the process cache from the kernel map after lost notifications.",
            ..SELF_METRIC
        },
        ProcfsFallbackLookups => Metric {
            otlp: Some("gpu_agent.procfs.fallback_lookups"),
            prometheus: Some("gpu_agent_procfs_fallback_lookups_total"),
            kind: Counter,
            help: "Processes looked up in /proc because no kernel notification described them.",
            ..SELF_METRIC
        },
        CachedProcesses => Metric {
            otlp: Some("gpu_agent.cache.processes"),
            prometheus: Some("gpu_agent_cached_processes"),
            unit: "{process}",
            kind: UpDownCounter,
            help: "Processes in the agent's cache.",
            ..SELF_METRIC
        },
        ExportFailures => Metric {
            otlp: Some("gpu_agent.export.failures"),
            prometheus: Some("gpu_agent_export_failures_total"),
            kind: Counter,
            help: "OTLP exports that failed.",
            ..SELF_METRIC
        },
        ExportDroppedBatches => Metric {
            otlp: Some("gpu_agent.export.dropped_batches"),
            prometheus: Some("gpu_agent_export_dropped_batches_total"),
            kind: Counter,
            help: "OTLP batches dropped: the queue over its byte budget, or refused by the collector.",
            ..SELF_METRIC
        },
        UsageRecordsEmitted => Metric {
            otlp: Some("gpu_agent.usage.records.emitted"),
            prometheus: Some("gpu_agent_usage_records_emitted_total"),
            unit: "{record}",
            kind: Counter,
            help: "Usage records emitted: a container stopped using a device.",
            ..SELF_METRIC
        },
        UsageRecordsDropped => Metric {
            otlp: Some("gpu_agent.usage.records.dropped"),
            prometheus: Some("gpu_agent_usage_records_dropped_total"),
            unit: "{record}",
            kind: Counter,
            help: "Usage records given up for good, once per destination (the file, the collector): a queue over its bound while it failed, refused by the collector, or still queued at exit.",
            ..SELF_METRIC
        },
        Mode => Metric {
            otlp: Some("gpu_agent.mode"),
            prometheus: Some("gpu_agent_mode"),
            help: "1 for the agent's current process-tracking mode.",
            extra: &[Attr::Mode],
            ..SELF_METRIC
        },
        NvmlUp => Metric {
            otlp: Some("gpu_agent.nvml.up"),
            prometheus: Some("gpu_agent_nvml_up"),
            help: "1 when NVML answers, 0 otherwise.",
            ..SELF_METRIC
        },
        Info => Metric {
            prometheus: Some("gpu_agent_info"),
            help: "The agent's version, value 1.",
            extra: &[Attr::Version],
            ..SELF_METRIC
        },
        // dcgm-exporter's fields: its names, units, types and help, Prometheus only. Table
        // order is dcgm-exporter's default counters CSV; the optional ones follow.
        DcgmSmClock => dcgm("DCGM_FI_DEV_SM_CLOCK", "MHz", Gauge, "SM clock frequency (in MHz).",
            restates(M::HwGpuClock, Some((Attr::Clock, CLOCKS[0])), 1e6, "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)")),
        DcgmMemClock => dcgm("DCGM_FI_DEV_MEM_CLOCK", "MHz", Gauge, "Memory clock frequency (in MHz).",
            restates(M::HwGpuClock, Some((Attr::Clock, CLOCKS[1])), 1e6, "nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)")),
        DcgmMemoryTemp => dcgm("DCGM_FI_DEV_MEMORY_TEMP", "C", Gauge, "Memory temperature (in C).",
            restates(M::HwGpuMemoryTemperature, None, 1.0, "nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)")),
        DcgmGpuTemp => dcgm("DCGM_FI_DEV_GPU_TEMP", "C", Gauge, "GPU temperature (in C).",
            restates(M::HwTemperature, None, 1.0, "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)")),
        DcgmPowerUsage => dcgm("DCGM_FI_DEV_POWER_USAGE", "W", Gauge, "Power draw (in W).",
            restates(M::HwPower, None, 1.0, "nvmlDeviceGetPowerUsage")),
        DcgmTotalEnergy => dcgm("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "mJ", Counter, "Total energy consumption since boot (in mJ).",
            restates(M::HwEnergy, None, 0.001, "nvmlDeviceGetTotalEnergyConsumption")),
        DcgmPcieReplay => dcgm("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "{retry}", Counter, "Total number of PCIe retries.",
            restates(M::HwErrors, Some((Attr::ErrorType, ERROR_TYPES[2])), 1.0, "nvmlDeviceGetPcieReplayCounter")),
        DcgmGpuUtil => dcgm("DCGM_FI_DEV_GPU_UTIL", "%", Gauge, "GPU utilization (in %).",
            Dcgm {
                per_pod: Some(Source::Metric(M::ContainerGpuUtilization, Some((Attr::HwGpuTask, GPU_TASKS[0])))),
                ..restates(M::HwGpuUtilization, Some((Attr::HwGpuTask, GPU_TASKS[0])), PCT, "nvmlDeviceGetUtilizationRates")
            }),
        DcgmMemCopyUtil => dcgm("DCGM_FI_DEV_MEM_COPY_UTIL", "%", Gauge, "Memory utilization (in %).",
            restates(M::HwGpuUtilization, Some((Attr::HwGpuTask, GPU_TASKS[1])), PCT, "nvmlDeviceGetUtilizationRates")),
        DcgmEncUtil => dcgm("DCGM_FI_DEV_ENC_UTIL", "%", Gauge, "Encoder utilization (in %).",
            restates(M::HwGpuUtilization, Some((Attr::HwGpuTask, GPU_TASKS[2])), PCT, "nvmlDeviceGetEncoderUtilization")),
        DcgmDecUtil => dcgm("DCGM_FI_DEV_DEC_UTIL", "%", Gauge, "Decoder utilization (in %).",
            restates(M::HwGpuUtilization, Some((Attr::HwGpuTask, GPU_TASKS[3])), PCT, "nvmlDeviceGetDecoderUtilization")),
        DcgmXidErrors => dcgm("DCGM_FI_DEV_XID_ERRORS", "{xid}", Gauge, "Value of the last XID error encountered.",
            Dcgm {
                source: Source::Derived("the last XID code NVML's event API delivered since the agent started, 0 before any, with `err_code` and `err_msg` (every XID is counted in `hw_errors_total{error_type=\"xid\"}`)"),
                nvml: "nvmlDeviceRegisterEvents(nvmlEventTypeXidCriticalError), nvmlEventSetWait_v2",
                ..DCGM_DEFAULT
            }),
        DcgmFbFree => dcgm("DCGM_FI_DEV_FB_FREE", "MiB", Gauge, "Framebuffer memory free (in MiB).",
            Dcgm {
                source: Source::Difference(M::HwGpuMemoryLimit, &[M::HwGpuMemoryUsage, M::HwGpuMemoryReserved]),
                ..restates_mig(M::HwGpuMemoryLimit, None, MIB_, "nvmlDeviceGetMemoryInfo_v2")
            }),
        DcgmFbUsed => dcgm("DCGM_FI_DEV_FB_USED", "MiB", Gauge, "Framebuffer memory used (in MiB).",
            Dcgm {
                per_pod: Some(Source::Metric(M::ContainerGpuMemoryUsage, None)),
                ..restates_mig(M::HwGpuMemoryUsage, None, MIB_, "nvmlDeviceGetMemoryInfo_v2")
            }),
        DcgmFbReserved => dcgm("DCGM_FI_DEV_FB_RESERVED", "MiB", Gauge, "Framebuffer memory reserved (in MiB).",
            restates(M::HwGpuMemoryReserved, None, MIB_, "nvmlDeviceGetMemoryInfo_v2")),
        DcgmNvlinkBandwidthTotal => dcgm("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "MB/s", Counter, "Total number of NVLink bandwidth counters for all lanes.",
            Dcgm {
                source: Source::Derived("the rate of `hw_gpu_io_bytes_total{hw_gpu_link=\"nvlink\"}`, both directions, over the last sample: KiB per second / 1000, truncated, as DCGM computes it (a rate, though the CSV says counter); absent at the first sample"),
                nvml: "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _RX; all links)",
                ..DCGM_DEFAULT
            }),
        DcgmVgpuLicenseStatus => dcgm("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "1", Gauge, "vGPU License status",
            restates(M::HwGpuVgpuLicensed, None, 1.0, "nvmlDeviceGetGridLicensableFeatures_v4")),
        DcgmUncorrectableRemappedRows => dcgm("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "{row}", Counter, "Number of remapped rows for uncorrectable errors",
            restates(M::HwGpuMemoryRemappedRows, Some((Attr::ErrorType, ECC_ERROR_TYPES[1])), 1.0, "nvmlDeviceGetRemappedRows")),
        DcgmCorrectableRemappedRows => dcgm("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "{row}", Counter, "Number of remapped rows for correctable errors",
            restates(M::HwGpuMemoryRemappedRows, Some((Attr::ErrorType, ECC_ERROR_TYPES[0])), 1.0, "nvmlDeviceGetRemappedRows")),
        DcgmRowRemapFailure => dcgm("DCGM_FI_DEV_ROW_REMAP_FAILURE", "1", Gauge, "Whether remapping of rows has failed",
            restates(M::HwGpuMemoryRowRemapFailed, None, 1.0, "nvmlDeviceGetRemappedRows")),
        DcgmProfGrEngineActive => dcgm("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "1", Gauge, "Ratio of time the graphics engine is active.",
            restates_mig(M::HwGpuActivity, Some((Attr::HwGpuEngine, GPU_ENGINES[0])), 1.0, GPM)),
        DcgmProfPipeTensorActive => dcgm("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "1", Gauge, "Ratio of cycles the tensor (HMMA) pipe is active.",
            restates_mig(M::HwGpuActivity, Some((Attr::HwGpuEngine, GPU_ENGINES[2])), 1.0, GPM)),
        DcgmProfDramActive => dcgm("DCGM_FI_PROF_DRAM_ACTIVE", "1", Gauge, "Ratio of cycles the device memory interface is active sending or receiving data.",
            restates_mig(M::HwGpuActivity, Some((Attr::HwGpuEngine, GPU_ENGINES[3])), 1.0, GPM)),
        DcgmProfPcieTxBytes => dcgm("DCGM_FI_PROF_PCIE_TX_BYTES", "B/s", Gauge, "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
            Dcgm {
                source: Source::Metrics(M::HwGpuBandwidth, &[(Attr::HwGpuLink, GPU_LINKS[0]), (Attr::NetworkIoDirection, DIRECTIONS[0])]),
                ..restates_mig(M::HwGpuBandwidth, None, MIB_, GPM)
            }),
        DcgmProfPcieRxBytes => dcgm("DCGM_FI_PROF_PCIE_RX_BYTES", "B/s", Gauge, "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
            Dcgm {
                source: Source::Metrics(M::HwGpuBandwidth, &[(Attr::HwGpuLink, GPU_LINKS[0]), (Attr::NetworkIoDirection, DIRECTIONS[1])]),
                ..restates_mig(M::HwGpuBandwidth, None, MIB_, GPM)
            }),
        // Optional: served when a counters CSV names them.
        DcgmProfSmActive => dcgm("DCGM_FI_PROF_SM_ACTIVE", "1", Gauge, "The ratio of cycles an SM has at least 1 warp assigned.",
            optional(restates_mig(M::HwGpuActivity, Some((Attr::HwGpuEngine, GPU_ENGINES[1])), 1.0, GPM))),
        DcgmProfSmOccupancy => dcgm("DCGM_FI_PROF_SM_OCCUPANCY", "1", Gauge, "The ratio of number of warps resident on an SM.",
            optional(restates_mig(M::HwGpuSmOccupancy, None, 1.0, GPM))),
        DcgmProfPipeFp64Active => dcgm("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "1", Gauge, "Ratio of cycles the fp64 pipes are active.",
            optional(restates_mig(M::HwGpuActivity, Some((Attr::HwGpuEngine, GPU_ENGINES[4])), 1.0, GPM))),
        DcgmProfPipeFp32Active => dcgm("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "1", Gauge, "Ratio of cycles the fp32 pipes are active.",
            optional(restates_mig(M::HwGpuActivity, Some((Attr::HwGpuEngine, GPU_ENGINES[5])), 1.0, GPM))),
        DcgmProfPipeFp16Active => dcgm("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "1", Gauge, "Ratio of cycles the fp16 pipes are active.",
            optional(restates_mig(M::HwGpuActivity, Some((Attr::HwGpuEngine, GPU_ENGINES[6])), 1.0, GPM))),
        DcgmProfNvlinkTxBytes => dcgm("DCGM_FI_PROF_NVLINK_TX_BYTES", "B/s", Gauge, "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
            optional(Dcgm {
                source: Source::Metrics(M::HwGpuBandwidth, &[(Attr::HwGpuLink, GPU_LINKS[1]), (Attr::NetworkIoDirection, DIRECTIONS[0])]),
                ..restates_mig(M::HwGpuBandwidth, None, MIB_, GPM)
            })),
        DcgmProfNvlinkRxBytes => dcgm("DCGM_FI_PROF_NVLINK_RX_BYTES", "B/s", Gauge, "The rate of data received over NVLink, not including protocol headers, in bytes per second.",
            optional(Dcgm {
                source: Source::Metrics(M::HwGpuBandwidth, &[(Attr::HwGpuLink, GPU_LINKS[1]), (Attr::NetworkIoDirection, DIRECTIONS[1])]),
                ..restates_mig(M::HwGpuBandwidth, None, MIB_, GPM)
            })),
        DcgmClockThrottleReasons => dcgm("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "1", Gauge, "Current clock throttle reasons (bitmask of DCGM_CLOCKS_THROTTLE_REASON_*).",
            optional(Dcgm {
                source: Source::Derived("the bitmask NVML returns (`hw_gpu_clock_throttled` has one series per reason)"),
                nvml: "nvmlDeviceGetCurrentClocksThrottleReasons",
                ..DCGM_DEFAULT
            })),
        DcgmRowRemapPending => dcgm("DCGM_FI_DEV_ROW_REMAP_PENDING", "1", Gauge, "Whether remapping of rows is pending.",
            optional(restates(M::HwGpuMemoryRowRemapPending, None, 1.0, "nvmlDeviceGetRemappedRows"))),
        DcgmEccSbeVolTotal => dcgm("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "{error}", Counter, "Total number of single-bit volatile ECC errors.",
            optional(restates(M::HwErrors, Some((Attr::ErrorType, ECC_ERROR_TYPES[0])), 1.0, "nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE_ECC)"))),
        DcgmEccDbeVolTotal => dcgm("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "{error}", Counter, "Total number of double-bit volatile ECC errors.",
            optional(restates(M::HwErrors, Some((Attr::ErrorType, ECC_ERROR_TYPES[1])), 1.0, "nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE_ECC)"))),
    }
}
