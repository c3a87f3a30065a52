//! The JSON scenario format (documented in docs/fake-nvml.md).

use std::collections::HashSet;

use serde::{Deserialize, Deserializer};

use crate::calls::Scope;

/// JSON has no hex literals: accept 4660 or "0x1234" for ids and bitmasks.
#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrHex {
    Num(u64),
    Text(String),
}

fn hex_u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match NumOrHex::deserialize(d)? {
        NumOrHex::Num(n) => Ok(n),
        NumOrHex::Text(s) => {
            let digits = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"));
            let parsed = match digits {
                Some(h) => u64::from_str_radix(h, 16),
                None => s.parse(),
            };
            parsed.map_err(|_| serde::de::Error::custom(format!("bad number {s:?}")))
        }
    }
}

fn hex_u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    u32::try_from(hex_u64(d)?).map_err(|_| serde::de::Error::custom("value exceeds 32 bits"))
}

fn yes() -> bool {
    true
}

fn default_driver_version() -> String {
    "580.159.04".into()
}

fn default_name() -> String {
    "NVIDIA H100 80GB HBM3".into()
}

fn default_memory_total() -> u64 {
    85_520_809_984
}

fn default_pci_device_id() -> u32 {
    0x2330_10DE
}

fn default_pci_subsystem_id() -> u32 {
    0x16C1_10DE
}

/// NVML_GPU_INSTANCE_PROFILE_COUNT: profile indexes run 0..17 (1_SLICE .. 2_SLICE_ALL_ME).
pub const PROFILE_COUNT: u32 = 17;

/// `gpuInstanceId`/`computeInstanceId` value meaning "not a MIG process".
pub const NO_INSTANCE: u32 = 0xFFFF_FFFF;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Free text for humans; accepted so scenario files can explain themselves.
    #[serde(default)]
    #[allow(dead_code)]
    pub description: Option<String>,
    #[serde(default = "default_driver_version")]
    pub driver_version: String,
    #[serde(default = "yes")]
    pub driver_loaded: bool,
    /// e.g. 13000 for CUDA 13.0; derived from the driver branch when absent.
    #[serde(default)]
    pub cuda_driver_version: Option<i32>,
    /// Defaults to "<cuda major>.<driver_version>", as the real library reports.
    #[serde(default)]
    pub nvml_version: Option<String>,
    #[serde(default = "yes")]
    pub energy_grows: bool,
    #[serde(default)]
    pub devices: Vec<DeviceSpec>,
    /// Calls that block while listed: a wedged driver (`crate::hang`).
    #[serde(default)]
    pub hang: Vec<HangSpec>,
}

/// A `hang` entry's `call` that names every call on a device.
const ANY_CALL: &str = "*";

/// One `hang` entry: `call` (an exported function's name, or `"*"` for every call on a
/// device) blocks on device `device`, or on every device when absent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HangSpec {
    pub call: String,
    #[serde(default)]
    pub device: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSpec {
    pub uuid: String,
    #[serde(default = "default_name")]
    pub name: String,
    #[serde(default)]
    pub index: Option<u32>,
    #[serde(default)]
    pub minor_number: Option<u32>,
    #[serde(default)]
    pub pci_bus_id: Option<String>,
    #[serde(default = "default_pci_device_id", deserialize_with = "hex_u32")]
    pub pci_device_id: u32,
    #[serde(default = "default_pci_subsystem_id", deserialize_with = "hex_u32")]
    pub pci_subsystem_id: u32,
    #[serde(default = "default_memory_total")]
    pub memory_total: u64,
    #[serde(default)]
    pub memory_used: Option<u64>,
    #[serde(default, alias = "fb_reserved")]
    pub memory_reserved: u64,
    #[serde(default)]
    pub utilization_gpu: u32,
    #[serde(default)]
    pub utilization_memory: u32,
    #[serde(default)]
    pub power_mw: u32,
    #[serde(default)]
    pub energy_mj: u64,
    #[serde(default)]
    pub temperature_c: u32,
    #[serde(default)]
    pub sm_clock_mhz: u32,
    #[serde(default)]
    pub mem_clock_mhz: u32,
    #[serde(default)]
    pub graphics_clock_mhz: Option<u32>,
    #[serde(default)]
    pub video_clock_mhz: Option<u32>,
    #[serde(default)]
    pub ecc_corrected: EccCount,
    #[serde(default)]
    pub ecc_uncorrected: EccCount,
    #[serde(default, deserialize_with = "hex_u64")]
    pub throttle_reasons: u64,
    #[serde(default)]
    pub lost: bool,
    #[serde(default)]
    pub unsupported: Vec<Feature>,
    #[serde(default)]
    pub processes: Vec<ProcessSpec>,
    #[serde(default)]
    pub graphics_processes: Vec<ProcessSpec>,
    #[serde(default)]
    pub mig_mode: Option<bool>,
    #[serde(default)]
    pub max_mig_devices: Option<u32>,
    #[serde(default)]
    pub mig_devices: Vec<MigSpec>,
    /// The GPU instance profiles it can be partitioned into (`nvmlDeviceGetGpuInstanceProfileInfo[V]`).
    #[serde(default)]
    pub mig_profiles: Vec<MigProfileSpec>,
    // Health, profiling and XIDs (dcgm-exporter's fields): fields.rs, gpm.rs, events.rs.
    #[serde(default)]
    pub memory_temperature_c: Option<u32>,
    #[serde(default)]
    pub encoder_util: u32,
    #[serde(default)]
    pub decoder_util: u32,
    #[serde(default)]
    pub pcie_replay: u32,
    #[serde(default)]
    pub remapped_rows: RemappedRowsSpec,
    #[serde(default)]
    pub nvlink_bandwidth: Option<NvlinkSpec>,
    #[serde(default)]
    pub vgpu_licensed: Option<bool>,
    #[serde(default)]
    pub gpm: Option<GpmSpec>,
    #[serde(default)]
    pub xid_events: Vec<XidEventSpec>,
    /// MPS clients (and the server), as `nvmlDeviceGetMPSComputeRunningProcesses_v3` lists them.
    #[serde(default)]
    pub mps_processes: Vec<ProcessSpec>,
    /// Per-process accounting mode (`nvmlDeviceGetAccountingMode`).
    #[serde(default)]
    pub accounting_mode: bool,
    /// Accounting records of processes that ended (or still run), by pid.
    #[serde(default)]
    pub accounting: Vec<AccountingSpec>,
}

/// `nvmlDeviceGetRemappedRows`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemappedRowsSpec {
    #[serde(default)]
    pub correctable: u32,
    #[serde(default)]
    pub uncorrectable: u32,
    #[serde(default)]
    pub pending: bool,
    #[serde(default)]
    pub failure: bool,
}

/// NVLink data counters (KiB, all links): a start value and a rate, like `energy_mj`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NvlinkSpec {
    #[serde(default)]
    pub tx_kib: u64,
    #[serde(default)]
    pub rx_kib: u64,
    #[serde(default)]
    pub tx_kib_per_s: u64,
    #[serde(default)]
    pub rx_kib_per_s: u64,
}

/// GPM metrics as DCGM names them: activities are ratios (0-1), bandwidths bytes per
/// second. `nvmlGpmMetricsGet` answers in NVML's units (percent, MiB/s). An absent key
/// answers NOT_SUPPORTED for that metric.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpmSpec {
    pub sm_active: Option<f64>,
    pub sm_occupancy: Option<f64>,
    pub tensor_active: Option<f64>,
    pub dram_active: Option<f64>,
    pub fp64_active: Option<f64>,
    pub fp32_active: Option<f64>,
    pub fp16_active: Option<f64>,
    pub gr_engine_active: Option<f64>,
    pub pcie_tx_bytes: Option<f64>,
    pub pcie_rx_bytes: Option<f64>,
    pub nvlink_tx_bytes: Option<f64>,
    pub nvlink_rx_bytes: Option<f64>,
}

/// A critical XID error, delivered through `nvmlEventSetWait_v2` `at_ms` after the event
/// first appeared in a loaded scenario.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct XidEventSpec {
    pub xid: u64,
    #[serde(default)]
    pub at_ms: u64,
}

/// One `nvmlAccountingStats_t`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountingSpec {
    pub pid: u32,
    /// Absent means NVML_VALUE_NOT_AVAILABLE.
    #[serde(default)]
    pub gpu_util: Option<u32>,
    #[serde(default)]
    pub mem_util: Option<u32>,
    #[serde(default)]
    pub max_memory: Option<u64>,
    /// Run time in ms (the driver reports 0 while the process runs).
    #[serde(default)]
    pub time_ms: u64,
    /// Start, µs since the Unix epoch; 0: when the scenario was loaded.
    #[serde(default)]
    pub start_time_us: u64,
    #[serde(default)]
    pub running: bool,
}

/// A plain number sets both counters; an object sets them separately.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
pub enum EccCount {
    Both(u64),
    Split {
        #[serde(default)]
        volatile: u64,
        #[serde(default)]
        aggregate: u64,
    },
}

impl Default for EccCount {
    fn default() -> Self {
        EccCount::Both(0)
    }
}

impl EccCount {
    pub fn get(self, aggregate: bool) -> u64 {
        match self {
            EccCount::Both(n) => n,
            EccCount::Split {
                volatile,
                aggregate: agg,
            } => {
                if aggregate {
                    agg
                } else {
                    volatile
                }
            }
        }
    }
}

/// Names accepted in a device's `unsupported` list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Feature {
    Memory,
    Utilization,
    #[serde(alias = "compute_processes")]
    Processes,
    GraphicsProcesses,
    ProcessUtilization,
    #[serde(alias = "power")]
    PowerUsage,
    Energy,
    Temperature,
    Clocks,
    Ecc,
    Throttle,
    Mig,
    Pci,
    EncoderUtilization,
    DecoderUtilization,
    PcieReplay,
    RemappedRows,
    FieldValues,
    VgpuLicense,
    Gpm,
    Events,
    MpsProcesses,
    Accounting,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessSpec {
    pub pid: u32,
    /// Absent means NVML_VALUE_NOT_AVAILABLE.
    #[serde(default)]
    pub used_memory: Option<u64>,
    #[serde(default)]
    pub sm_util: Option<u32>,
    #[serde(default)]
    pub mem_util: Option<u32>,
    #[serde(default)]
    pub enc_util: Option<u32>,
    #[serde(default)]
    pub dec_util: Option<u32>,
    #[serde(default)]
    pub gpu_instance_id: Option<u32>,
    #[serde(default)]
    pub compute_instance_id: Option<u32>,
}

impl ProcessSpec {
    /// Real NVML only samples processes that were active in the window.
    pub fn has_utilization(&self) -> bool {
        self.sm_util.is_some()
            || self.mem_util.is_some()
            || self.enc_util.is_some()
            || self.dec_util.is_some()
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigSpec {
    pub uuid: String,
    #[serde(default)]
    pub name: Option<String>,
    pub gpu_instance_id: u32,
    #[serde(default)]
    pub compute_instance_id: u32,
    pub memory_total: u64,
    #[serde(default)]
    pub memory_used: Option<u64>,
    #[serde(default)]
    pub processes: Vec<ProcessSpec>,
    /// This GPU instance's profiling (`nvmlGpmMigSampleGet`).
    #[serde(default)]
    pub gpm: Option<GpmSpec>,
    /// Its GPU instance's profile id and placement (`nvmlGpuInstanceGetInfo`); absent: from
    /// its profile (gpu_instance.rs).
    #[serde(default)]
    pub profile_id: Option<u32>,
    #[serde(default)]
    pub placement_start: Option<u32>,
    #[serde(default)]
    pub placement_size: Option<u32>,
}

/// One `nvmlGpuInstanceProfileInfo_v2_t`, answered for its profile index.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigProfileSpec {
    /// The NVML_GPU_INSTANCE_PROFILE_* index asked for (0..=16).
    pub profile: u32,
    /// The profile id the driver reports (`nvidia-smi mig -lgip`'s ID column).
    pub id: u32,
    /// e.g. "MIG 1g.10gb".
    pub name: String,
    pub slices: u32,
    #[serde(default = "one")]
    pub instances: u32,
    #[serde(default)]
    pub multiprocessors: u32,
    #[serde(default)]
    pub copy_engines: u32,
    #[serde(default)]
    pub decoders: u32,
    #[serde(default)]
    pub encoders: u32,
    #[serde(default)]
    pub jpegs: u32,
    #[serde(default)]
    pub ofas: u32,
    pub memory_mib: u64,
    #[serde(default)]
    pub p2p: bool,
    /// Where its GPU instances may start and how many memory slices each takes
    /// (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`), as `[start, size]` pairs; empty:
    /// the call answers NOT_SUPPORTED.
    #[serde(default)]
    pub placements: Vec<[u32; 2]>,
}

fn one() -> u32 {
    1
}

fn process_memory(procs: &[ProcessSpec]) -> u64 {
    procs
        .iter()
        .filter_map(|p| p.used_memory)
        .fold(0u64, u64::saturating_add)
}

impl MigSpec {
    pub fn used(&self) -> u64 {
        self.memory_used
            .unwrap_or_else(|| process_memory(&self.processes))
    }
}

impl DeviceSpec {
    pub fn mig_enabled(&self) -> bool {
        self.mig_mode.unwrap_or(!self.mig_devices.is_empty())
    }

    pub fn max_migs(&self) -> u32 {
        if self.mig_enabled() {
            self.max_mig_devices.unwrap_or(7)
        } else {
            0
        }
    }

    pub fn supports(&self, f: Feature) -> bool {
        !self.unsupported.contains(&f)
    }

    pub fn used(&self) -> u64 {
        self.memory_used.unwrap_or_else(|| {
            // An MPS process also in the compute list is one process.
            let mps: Vec<ProcessSpec> = self
                .mps_processes
                .iter()
                .filter(|m| !self.processes.iter().any(|p| p.pid == m.pid))
                .cloned()
                .collect();
            self.mig_devices.iter().map(MigSpec::used).fold(
                process_memory(&self.processes)
                    .saturating_add(process_memory(&self.graphics_processes))
                    .saturating_add(process_memory(&mps)),
                u64::saturating_add,
            )
        })
    }

    pub fn bus_id(&self, index: u32) -> String {
        self.pci_bus_id
            .clone()
            .unwrap_or_else(|| format!("00000000:{:02X}:00.0", index + 1))
    }
}

/// Parses "DDDDDDDD:BB:DD.F" (or the 4-digit-domain legacy form).
pub fn parse_bus_id(s: &str) -> Option<(u32, u32, u32, u32)> {
    let mut parts = s.split(':');
    let (domain, bus, devfn) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let (dev, func) = devfn.split_once('.')?;
    Some((
        u32::from_str_radix(domain, 16).ok()?,
        u32::from_str_radix(bus, 16).ok()?,
        u32::from_str_radix(dev, 16).ok()?,
        u32::from_str_radix(func, 16).ok()?,
    ))
}

impl Scenario {
    pub fn parse(text: &str) -> Result<Scenario, String> {
        let s: Scenario = serde_json::from_str(text).map_err(|e| e.to_string())?;
        s.validate()?;
        Ok(s)
    }

    /// Rejects scenarios the handle encoding or NVML semantics cannot represent,
    /// so a typo fails loudly instead of producing odd answers.
    fn validate(&self) -> Result<(), String> {
        if self.devices.len() > 256 {
            return Err("at most 256 devices".into());
        }
        let mut uuids = HashSet::new();
        let mut indexes = HashSet::new();
        for (pos, d) in self.devices.iter().enumerate() {
            let idx = d.index.unwrap_or(pos as u32);
            if idx as usize >= self.devices.len() || !indexes.insert(idx) {
                return Err(format!(
                    "device {}: index {idx} must be unique and below the device count",
                    d.uuid
                ));
            }
            if !uuids.insert(d.uuid.as_str()) {
                return Err(format!("duplicate uuid {}", d.uuid));
            }
            if parse_bus_id(&d.bus_id(idx)).is_none() {
                return Err(format!("device {}: bad pci_bus_id", d.uuid));
            }
            if d.mig_mode == Some(false) && !d.mig_devices.is_empty() {
                return Err(format!(
                    "device {}: mig_devices given with mig_mode false",
                    d.uuid
                ));
            }
            if d.mig_devices.len() > d.max_migs() as usize {
                return Err(format!(
                    "device {}: more mig_devices than max_mig_devices",
                    d.uuid
                ));
            }
            let mut profiles = HashSet::new();
            for p in &d.mig_profiles {
                if p.profile >= PROFILE_COUNT || !profiles.insert(p.profile) {
                    return Err(format!(
                        "device {}: mig_profiles: profile {} must be below {} and given once",
                        d.uuid, p.profile, PROFILE_COUNT
                    ));
                }
            }
            let mut ids = HashSet::new();
            for m in &d.mig_devices {
                if !uuids.insert(m.uuid.as_str()) {
                    return Err(format!("duplicate uuid {}", m.uuid));
                }
                if m.gpu_instance_id >= 255 || m.compute_instance_id >= 256 {
                    return Err(format!("mig {}: instance ids out of range", m.uuid));
                }
                if !ids.insert((m.gpu_instance_id, m.compute_instance_id)) {
                    return Err(format!(
                        "mig {}: duplicate gpu/compute instance id pair",
                        m.uuid
                    ));
                }
            }
        }
        for h in &self.hang {
            let on_device = match crate::calls::scope(&h.call) {
                _ if h.call == ANY_CALL => true,
                Some(scope) => scope == Scope::Device,
                None => return Err(format!("hang: no exported function {:?}", h.call)),
            };
            if let Some(d) = h
                .device
                .filter(|&d| on_device && d as usize >= self.devices.len())
            {
                return Err(format!("hang {}: no device {d}", h.call));
            }
        }
        Ok(())
    }

    /// Whether the scenario blocks `call` on the device with NVML index `index`, or,
    /// with `None`, a call that takes no device (there `"*"` and `device` do not apply).
    pub fn hangs(&self, call: &str, index: Option<u32>) -> bool {
        self.hang.iter().any(|h| match index {
            None => h.call == call,
            Some(i) => (h.call == call || h.call == ANY_CALL) && h.device.is_none_or(|d| d == i),
        })
    }

    pub fn cuda_version(&self) -> i32 {
        self.cuda_driver_version.unwrap_or_else(|| {
            let major: u32 = self
                .driver_version
                .split('.')
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            // Driver branch to the CUDA version it ships with.
            match major {
                580.. => 13000,
                575..=579 => 12090,
                570..=574 => 12080,
                565..=569 => 12070,
                560..=564 => 12060,
                555..=559 => 12050,
                550..=554 => 12040,
                545..=549 => 12030,
                535..=544 => 12020,
                _ => 12000,
            }
        })
    }

    pub fn nvml_version_string(&self) -> String {
        self.nvml_version
            .clone()
            .unwrap_or_else(|| format!("{}.{}", self.cuda_version() / 1000, self.driver_version))
    }
}
