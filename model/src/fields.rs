//! The further NVML fields that dcgm-exporter serves: health counters, profiling (GPM) and
//! XID errors, per device; and the XID errors charged to containers.
use std::collections::BTreeMap;

use serde::Serialize;

use crate::SourceStatus;

/// A device's fields beyond the basics. Each is None where the device or driver cannot say
/// (never a made-up 0).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct DeviceFields {
    /// Framebuffer the driver reserves for itself (`nvmlMemory_v2_t.reserved`).
    pub memory_reserved_bytes: Option<u64>,
    /// HBM temperature (NVML field `NVML_FI_DEV_MEMORY_TEMP`).
    pub memory_temperature_c: Option<u32>,
    /// Percent of the driver's sample period the encoder / decoder was busy.
    pub encoder_util: Option<u32>,
    pub decoder_util: Option<u32>,
    /// PCIe replays (link-level retries) since the driver loaded.
    pub pcie_replay: Option<u64>,
    pub remapped_rows: Option<RemappedRows>,
    /// NVLink data moved since the driver loaded, all links, KiB
    /// (`NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX` / `_RX`).
    pub nvlink_tx_kib: Option<u64>,
    pub nvlink_rx_kib: Option<u64>,
    /// NVLink rx + tx over the last sample period, as DCGM computes its
    /// `DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`: KiB per second / 1000 ("MB/s"), truncated.
    pub nvlink_bandwidth_total: Option<u64>,
    /// Whether the vGPU license is held (false where the device has no GRID licensing).
    pub vgpu_licensed: Option<bool>,
    /// Profiling over the last profiling period (`nvml.gpm_interval_ms`); None where GPM is
    /// unsupported or has only one sample yet (the agent's stats say why).
    pub gpm: Option<GpmMetrics>,
    /// Critical XID errors since the agent started, by code (NVML's event API); None
    /// where the event API is unavailable.
    pub xid_errors: Option<Vec<XidCount>>,
    /// The most recent XID code, 0 before any (dcgm-exporter's `DCGM_FI_DEV_XID_ERRORS`).
    pub last_xid: Option<u64>,
    /// XIDs first delivered this cycle whose process the kernel log named: the join charges
    /// them to that process's container.
    pub xid_processes: Vec<XidProcess>,
}

/// An XID the kernel log charged to a process (`NVRM: Xid (...): N, pid=P, name=C`).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct XidProcess {
    pub xid: u64,
    /// Host PID, as the driver prints it.
    pub pid: u32,
    pub comm: Option<String>,
    /// The MIG device, when NVML named the GPU instance.
    pub mig_uuid: Option<String>,
}

/// Row remapping (Ampere and later): rows of HBM replaced after ECC errors.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct RemappedRows {
    pub correctable: u64,
    pub uncorrectable: u64,
    /// A remapping waits for the next GPU reset.
    pub pending: bool,
    /// A remapping failed: the GPU needs service.
    pub failure: bool,
}

/// NVML GPM metrics over one sample period. Activities are ratios (0-1); bandwidths are
/// MiB per second, as NVML reports them.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct GpmMetrics {
    pub gr_engine_active: Option<f64>,
    pub sm_active: Option<f64>,
    pub sm_occupancy: Option<f64>,
    pub tensor_active: Option<f64>,
    pub dram_active: Option<f64>,
    pub fp64_active: Option<f64>,
    pub fp32_active: Option<f64>,
    pub fp16_active: Option<f64>,
    pub pcie_tx_mibps: Option<f64>,
    pub pcie_rx_mibps: Option<f64>,
    pub nvlink_tx_mibps: Option<f64>,
    pub nvlink_rx_mibps: Option<f64>,
}

/// How many XID errors of one code a device (or container) had.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct XidCount {
    pub xid: u64,
    pub count: u64,
}

/// XID errors the kernel log charged to a process of this container (`NVRM: Xid (...): N,
/// pid=...`), cumulative since the agent started.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ContainerXid {
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    pub pod_name: Option<String>,
    pub namespace: Option<String>,
    pub container_name: Option<String>,
    /// The device: the MIG device under MIG, else the GPU.
    pub uuid: String,
    pub gpu_uuid: String,
    pub xid: u64,
    pub count: u64,
}

/// What the agent could use of NVML's optional features, and why not: `/debug/stats`.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct NvmlFeatures {
    /// Per GPU UUID: profiling through GPM (`ok`, or `unavailable: <why>`).
    pub gpm: BTreeMap<String, SourceStatus>,
    /// NVML's event API, which delivers critical XID errors.
    pub xid_events: SourceStatus,
    /// The kernel log, which names the process an XID hit.
    pub kmsg: SourceStatus,
}
