//! GPU samples: what NVML says each cycle, as small value types the join consumes. The
//! NVIDIA binding (nvml.rs) is a thin layer under these; nothing else sees NVML.
pub mod nvml;

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
