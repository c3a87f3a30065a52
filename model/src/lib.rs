//! The data the agent produces and every sink reads: GPU samples and the joined snapshot.
//! Plain values, no behaviour that reaches back into sources.
use serde::Serialize;

/// One collection cycle over every device.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct GpuSample {
    /// Unix time of the sample, milliseconds.
    pub taken_at_ms: u64,
    pub driver_version: Option<String>,
    pub devices: Vec<DeviceSample>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct DeviceSample {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub pci_bus_id: Option<String>,
    /// "ok", "lost" (fell off the bus: skipped until it answers again) or "error: ...".
    pub status: String,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    /// Percent of time a kernel ran over the last sample period.
    pub utilization_gpu: Option<u32>,
    pub utilization_memory: Option<u32>,
    pub power_mw: Option<u32>,
    pub energy_mj: Option<u64>,
    pub temperature_c: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub ecc_corrected: Option<u64>,
    pub ecc_uncorrected: Option<u64>,
    pub throttle_reasons: Option<u64>,
    /// Metrics this device does not support: marked once, then skipped.
    pub unsupported: Vec<&'static str>,
    pub mig_enabled: bool,
    pub mig_devices: Vec<MigSample>,
    pub processes: Vec<ProcessSample>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct MigSample {
    pub uuid: String,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
}

/// A process NVML reports on a device, by host PID.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ProcessSample {
    pub pid: u32,
    pub used_memory_bytes: u64,
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
    /// The MIG device the process runs on, from its GPU/compute instance ids.
    pub mig_uuid: Option<String>,
    /// Utilization since the previous sample; None when the device cannot say (MIG,
    /// unsupported), Some(0) when it had no samples for the process.
    pub sm_util: Option<u32>,
    pub mem_util: Option<u32>,
    pub enc_util: Option<u32>,
    pub dec_util: Option<u32>,
}

impl ProcessSample {
    /// The device a process is charged to: its MIG device if any, else the GPU.
    pub fn device_uuid<'a>(&'a self, gpu: &'a DeviceSample) -> &'a str {
        self.mig_uuid.as_deref().unwrap_or(&gpu.uuid)
    }
}

/// Published to every sink; never mutated after the join.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Snapshot {
    pub taken_at_ms: u64,
    /// "ok" or "unavailable: <reason>".
    pub nvml: String,
    pub driver_version: Option<String>,
    /// Devices without their process lists (those are joined into `containers`).
    pub devices: Vec<DeviceSample>,
    /// One entry per container (or pod, or the host) using a GPU.
    pub containers: Vec<ContainerUsage>,
    /// Per-process detail, only when enabled (cardinality).
    pub processes: Vec<ProcessUsage>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ContainerUsage {
    /// Full 64-hex id; null for the host entry and for pod-level cgroups.
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    pub qos: Option<&'static str>,
    pub runtime: Option<&'static str>,
    pub cgroup_path: Option<String>,
    /// Names, when the node's runtime or kubelet told us (null otherwise).
    pub pod_name: Option<String>,
    pub namespace: Option<String>,
    pub container_name: Option<String>,
    pub gpus: Vec<ContainerGpu>,
    /// Devices the kubelet allocated to this container (GPU or MIG UUIDs), whether it uses
    /// them or not; empty when unknown or none.
    pub allocated_gpus: Vec<String>,
}

impl ContainerUsage {
    /// Allocated devices the container used neither memory nor SM time on this sample.
    pub fn idle_allocations(&self) -> Vec<&str> {
        self.allocated_gpus
            .iter()
            .filter(|u| {
                !self.gpus.iter().any(|g| {
                    (&g.uuid == *u || &g.gpu_uuid == *u)
                        && (g.memory_used_bytes > 0 || g.sm_util.unwrap_or(0) > 0)
                })
            })
            .map(String::as_str)
            .collect()
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ContainerGpu {
    /// The device charged: the MIG device UUID under MIG, else the GPU UUID.
    pub uuid: String,
    /// The physical GPU.
    pub gpu_uuid: String,
    pub memory_used_bytes: u64,
    /// Summed over the container's processes, capped at 100 (percent of this device).
    pub sm_util: Option<u32>,
    pub mem_util: Option<u32>,
    pub enc_util: Option<u32>,
    pub dec_util: Option<u32>,
    pub pids: Vec<u32>,
    /// Cumulative: SM-utilization-weighted seconds on this device.
    pub gpu_time_seconds: f64,
    /// Cumulative: memory held x seconds.
    pub memory_byte_seconds: f64,
    /// When the two cumulative counters started (first sight of this owner on this
    /// device), unix ms: the OTLP start time of those series.
    pub counters_since_ms: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProcessUsage {
    pub pid: u32,
    pub comm: Option<String>,
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    pub uuid: String,
    pub used_memory_bytes: u64,
    pub sm_util: Option<u32>,
    pub mem_util: Option<u32>,
    pub enc_util: Option<u32>,
    pub dec_util: Option<u32>,
    /// The process had exited when joined (kept as a tombstone).
    pub exited: bool,
}

/// The agent's own health, for self-metrics. Counters are cumulative since start.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct AgentStats {
    /// Unix ms when the agent started: start time of its cumulative series.
    pub started_ms: u64,
    /// "ebpf" or "procfs".
    pub mode: String,
    pub events_received: u64,
    pub events_lost: u64,
    pub resyncs: u64,
    pub procfs_fallback_lookups: u64,
    pub cached_processes: u64,
    /// "ok", "disabled" or "unavailable: <reason>".
    pub nvml: String,
    pub export_failures: u64,
    pub export_dropped_batches: u64,
}
