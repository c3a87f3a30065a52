//! The NVML binding: nvml-wrapper, loaded from the system or a given path. Failures degrade:
//! no library or driver -> unavailable with a reason and retried with backoff; a lost GPU or
//! an unsupported call -> that device or metric is marked and skipped, the others go on.
use std::{
    collections::HashMap,
    path::PathBuf,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use nvml_wrapper::{
    enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor},
    enums::device::UsedGpuMemory,
    error::NvmlError,
    struct_wrappers::device::ProcessInfo,
    Device, Nvml,
};

use gpu_model::{AccountingSample, DeviceStatus, NvmlFeatures, SourceStatus};

use super::{
    fields::{self, NvlinkRates},
    gpm::Gpm,
    xid::Xids,
    DeviceSample, GpuSample, MigSample, ProcessSample,
};

/// How often a requested accounting read is retried while NVML still says the process runs
/// (the driver may lag the kernel's exit by a cycle).
const ACCOUNTING_TRIES: u8 = 5;

const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

pub struct NvmlSampler {
    lib_path: Option<PathBuf>,
    nvml: Option<Nvml>,
    status: SourceStatus,
    next_init: Instant,
    backoff: Duration,
    /// Per device uuid: the newest process-utilization timestamp seen (NVML's µs clock).
    last_seen: HashMap<String, u64>,
    /// Per device index: the uuid last seen, to name a device that is lost.
    known: HashMap<u32, (String, String)>,
    /// dcgm-exporter's further fields.
    extras: Extras,
    /// Per-process accounting: what the join asked for, and the lists already seen.
    accounting: Accounting,
}

/// What dcgm-exporter's further fields keep between cycles: profiling samples, the XID
/// event set, NVLink counters (gpm.rs, xid.rs, fields.rs).
struct Extras {
    gpm: Gpm,
    xids: Xids,
    nvlink: NvlinkRates,
}

/// Accounting state across cycles.
#[derive(Debug, Default)]
pub struct Accounting {
    /// Off by configuration: no accounting calls at all.
    pub enabled: bool,
    /// (device uuid, pid, tries left): stats to read, for processes the kernel saw exit.
    pending: Vec<(String, u32, u8)>,
    /// Per device uuid: the accounting PIDs listed last cycle.
    listed: HashMap<String, Vec<u32>>,
}

enum Metric<T> {
    Value(T),
    Unsupported,
    Lost,
    Failed,
}

fn metric<T>(r: Result<T, NvmlError>) -> Metric<T> {
    match r {
        Ok(v) => Metric::Value(v),
        Err(NvmlError::NotSupported) | Err(NvmlError::FunctionNotFound) => Metric::Unsupported,
        Err(NvmlError::FailedToLoadSymbol(_)) => Metric::Unsupported,
        Err(NvmlError::GpuLost) => Metric::Lost,
        Err(e) => {
            tracing::debug!("nvml: {e}");
            Metric::Failed
        }
    }
}

impl NvmlSampler {
    pub fn new(lib_path: Option<PathBuf>) -> NvmlSampler {
        NvmlSampler {
            lib_path,
            nvml: None,
            status: SourceStatus::Unavailable("not initialised yet".into()),
            next_init: Instant::now(),
            backoff: BACKOFF_MIN,
            last_seen: HashMap::new(),
            known: HashMap::new(),
            extras: Extras {
                gpm: Gpm::default(),
                xids: Xids::new(None),
                nvlink: NvlinkRates::default(),
            },
            accounting: Accounting::default(),
        }
    }

    /// Turns the accounting reads on (`usage.accounting`).
    pub fn enable_accounting(&mut self, on: bool) {
        self.accounting.enabled = on;
    }

    /// Asks for the accounting stats of these (device uuid, pid): processes the kernel
    /// reported exited. Read on the next cycle.
    pub fn request_accounting(&mut self, requests: Vec<(String, u32)>) {
        let pending = &mut self.accounting.pending;
        for (uuid, pid) in requests {
            if !pending.iter().any(|(u, p, _)| *u == uuid && *p == pid) {
                pending.push((uuid, pid, ACCOUNTING_TRIES));
            }
        }
        // Bounded: a flood of exits must not grow this without end.
        if pending.len() > 4096 {
            pending.drain(..pending.len() - 4096);
        }
    }

    /// Reads the kernel log at `path` to name the process of each XID; None: does not.
    pub fn with_kmsg(mut self, path: Option<PathBuf>) -> NvmlSampler {
        self.extras.xids = Xids::new(path);
        self
    }

    pub fn status(&self) -> &SourceStatus {
        &self.status
    }

    /// What the optional features (profiling, XID events) gave, and why not: /debug/stats.
    pub fn features(&self) -> NvmlFeatures {
        let x = &self.extras;
        NvmlFeatures {
            gpm: x.gpm.status.clone(),
            xid_events: x.xids.events_status.clone(),
            kmsg: x.xids.kmsg_status.clone(),
        }
    }

    /// Drops NVML, freeing first what was allocated from it.
    fn shut_down(&mut self) {
        if let Some(nvml) = self.nvml.take() {
            self.extras.gpm.release(&nvml);
            self.extras.xids.release(&nvml);
            self.extras.nvlink.clear();
        }
    }

    fn try_init(&mut self) -> bool {
        if self.nvml.is_some() {
            return true;
        }
        if Instant::now() < self.next_init {
            return false;
        }
        let mut builder = Nvml::builder();
        if let Some(p) = &self.lib_path {
            builder.lib_path(p.as_os_str());
        }
        match builder.init() {
            Ok(nvml) => {
                tracing::info!(lib = ?self.lib_path, "NVML initialised");
                self.nvml = Some(nvml);
                self.status = SourceStatus::Ok;
                self.backoff = BACKOFF_MIN;
                true
            }
            Err(e) => {
                let reason = describe_init_error(&e, self.lib_path.as_ref());
                if self.status.reason() != Some(reason.as_str()) {
                    tracing::warn!(%reason, retry_in = ?self.backoff, "NVML unavailable; GPU metrics paused");
                }
                self.status = SourceStatus::Unavailable(reason);
                self.next_init = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                false
            }
        }
    }

    /// One cycle. None while NVML is unavailable (see `status`).
    pub fn sample(&mut self) -> Option<GpuSample> {
        if !self.try_init() {
            return None;
        }
        let nvml = self.nvml.as_ref().unwrap();
        let count = match nvml.device_count() {
            Ok(c) => c,
            Err(e) => {
                // The driver went away under us: start over, with backoff.
                self.status = SourceStatus::Unavailable(e.to_string());
                tracing::warn!("NVML device count failed: {e}; reinitialising");
                self.shut_down();
                self.next_init = Instant::now() + self.backoff;
                return None;
            }
        };
        let driver_version = nvml.sys_driver_version().ok();
        let mut devices = Vec::with_capacity(count as usize);
        for index in 0..count {
            let d = match nvml.device_by_index(index) {
                Ok(dev) => {
                    let mut d = sample_device(nvml, &dev, index, &mut self.last_seen);
                    if self.accounting.enabled && d.status.is_ok() && !d.mig_enabled {
                        read_accounting(&dev, &mut d, &mut self.accounting);
                    }
                    self.extras.device(nvml, &dev, d)
                }
                Err(e) => DeviceSample {
                    index,
                    status: if matches!(e, NvmlError::GpuLost) {
                        DeviceStatus::Lost
                    } else {
                        DeviceStatus::Error(e.to_string())
                    },
                    ..Default::default()
                },
            };
            devices.push(d);
        }
        // A lost device may no longer tell its name: use what it said before.
        for d in &mut devices {
            if d.uuid.is_empty() {
                if let Some((uuid, name)) = self.known.get(&d.index) {
                    d.uuid = uuid.clone();
                    d.name = name.clone();
                }
            } else {
                self.known.insert(d.index, (d.uuid.clone(), d.name.clone()));
            }
        }
        self.extras.xids.collect(nvml, &mut devices);
        Some(GpuSample {
            taken_at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            driver_version,
            devices,
        })
    }
}

impl Extras {
    /// dcgm-exporter's further fields of a device that answers: health, profiling, and its
    /// registration for XID events.
    fn device(&mut self, nvml: &Nvml, dev: &Device, mut d: DeviceSample) -> DeviceSample {
        if !d.status.is_ok() {
            return d;
        }
        let mut r = Reader {
            unsupported: std::mem::take(&mut d.unsupported),
            lost: false,
        };
        fields::read(&mut r, nvml, dev, &mut d, &mut self.nvlink);
        d.unsupported = r.unsupported;
        d.unsupported.dedup();
        if r.lost {
            d.status = DeviceStatus::Lost;
            d.processes.clear();
            return d;
        }
        self.gpm.sample(nvml, dev, &mut d);
        self.xids.register(nvml, dev, &d.uuid);
        d
    }
}

impl Drop for NvmlSampler {
    fn drop(&mut self) {
        self.shut_down();
    }
}

fn describe_init_error(e: &NvmlError, path: Option<&PathBuf>) -> String {
    match e {
        NvmlError::LibloadingError(le) => match path {
            Some(p) => format!("cannot load {}: {le}", p.display()),
            None => format!("cannot load libnvidia-ml.so.1 (no NVIDIA driver?): {le}"),
        },
        NvmlError::DriverNotLoaded => "the NVIDIA driver is not loaded".into(),
        NvmlError::NoPermission => "no permission to talk to the NVIDIA driver".into(),
        other => other.to_string(),
    }
}

/// Reads metrics off one device: records the unsupported ones, and stops asking once the
/// device is lost.
pub struct Reader {
    unsupported: Vec<&'static str>,
    lost: bool,
}

impl Reader {
    pub fn read<T>(
        &mut self,
        name: &'static str,
        call: impl FnOnce() -> Result<T, NvmlError>,
    ) -> Option<T> {
        if self.lost {
            return None;
        }
        match metric(call()) {
            Metric::Value(v) => Some(v),
            Metric::Unsupported => {
                self.unsupported.push(name);
                None
            }
            Metric::Lost => {
                self.lost = true;
                None
            }
            Metric::Failed => None,
        }
    }
}

fn sample_device(
    nvml: &Nvml,
    dev: &Device,
    index: u32,
    last_seen: &mut HashMap<String, u64>,
) -> DeviceSample {
    let mut d = DeviceSample {
        index,
        status: DeviceStatus::Ok,
        ..Default::default()
    };
    let mut r = Reader {
        unsupported: vec![],
        lost: false,
    };
    read_device_metrics(&mut r, dev, &mut d);
    if d.mig_enabled && !r.lost {
        read_mig_devices(&mut r, nvml, dev, &mut d);
    }
    // Compute and graphics contexts; a process with both is one process.
    let mut procs: Vec<ProcessSample> = vec![];
    let lists = [
        r.read("processes", || dev.running_compute_processes()),
        r.read("graphics_processes", || dev.running_graphics_processes()),
    ];
    for p in lists.into_iter().flatten().flatten() {
        merge_process(&mut procs, &p, &d.mig_devices);
    }
    read_mps_processes(&mut r, dev, &d.mig_devices, &mut procs);
    // MIG devices cannot say per-process utilization.
    if !r.lost && !d.mig_enabled {
        read_process_utilization(&mut r, dev, &d.uuid, last_seen, &mut procs);
    }
    procs.sort_by_key(|p| p.pid);
    d.processes = procs;
    d.unsupported = r.unsupported;
    d.unsupported.dedup();
    if r.lost {
        d.status = DeviceStatus::Lost;
        d.processes.clear();
    }
    d
}

fn read_device_metrics(r: &mut Reader, dev: &Device, d: &mut DeviceSample) {
    d.uuid = r.read("uuid", || dev.uuid()).unwrap_or_default();
    d.name = r.read("name", || dev.name()).unwrap_or_default();
    d.pci_bus_id = r.read("pci_info", || dev.pci_info()).map(|p| p.bus_id);
    if let Some(m) = r.read("memory", || dev.memory_info()) {
        d.memory_total_bytes = Some(m.total);
        d.memory_used_bytes = Some(m.used);
        d.fields.memory_reserved_bytes = Some(m.reserved);
    }
    if let Some(u) = r.read("utilization", || dev.utilization_rates()) {
        d.utilization_gpu = Some(u.gpu);
        d.utilization_memory = Some(u.memory);
    }
    d.power_mw = r.read("power", || dev.power_usage());
    d.energy_mj = r.read("energy", || dev.total_energy_consumption());
    d.temperature_c = r.read("temperature", || dev.temperature(TemperatureSensor::Gpu));
    d.sm_clock_mhz = r.read("clocks", || dev.clock_info(Clock::SM));
    d.mem_clock_mhz = r.read("clocks", || dev.clock_info(Clock::Memory));
    d.ecc_corrected = r.read("ecc", || {
        dev.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
    });
    d.ecc_uncorrected = r.read("ecc", || {
        dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
    });
    d.throttle_reasons = r
        .read("throttle", || dev.current_throttle_reasons())
        .map(|t| t.bits());
    d.mig_enabled = r
        .read("mig", || dev.mig_mode())
        .is_some_and(|m| m.current == 1);
    d.sharing.minor_number = r.read("minor_number", || dev.minor_number());
}

fn read_mig_devices(r: &mut Reader, nvml: &Nvml, dev: &Device, d: &mut DeviceSample) {
    let n = r.read("mig", || dev.mig_device_count()).unwrap_or(0);
    for i in 0..n {
        // Empty slots answer NotFound: skip them.
        let Ok(mig) = dev.mig_device_by_index(i) else {
            continue;
        };
        let mem = mig.memory_info().ok();
        let (gi, ci) = instance_ids(nvml, &mig);
        d.mig_devices.push(MigSample {
            uuid: mig.uuid().unwrap_or_default(),
            gpu_instance_id: gi.unwrap_or(u32::MAX),
            compute_instance_id: ci.unwrap_or(u32::MAX),
            memory_total_bytes: mem.as_ref().map(|m| m.total),
            memory_used_bytes: mem.as_ref().map(|m| m.used),
            profile: mig.name().ok().as_deref().and_then(mig_profile),
            gpm: None,
        });
    }
}

/// The profile in a MIG device's name: `NVIDIA A100-SXM4-80GB MIG 1g.10gb` -> `1g.10gb`.
fn mig_profile(name: &str) -> Option<String> {
    let p = name.rsplit_once("MIG ")?.1.trim();
    (!p.is_empty()).then(|| p.to_string())
}

/// Utilization since our last look (`last_seen`, per device uuid). NotFound means "no
/// samples": every process idle. Unsupported: the processes' utilization stays unknown.
fn read_process_utilization(
    r: &mut Reader,
    dev: &Device,
    uuid: &str,
    last_seen: &mut HashMap<String, u64>,
    procs: &mut [ProcessSample],
) {
    let mut util: HashMap<u32, (u64, [u32; 4])> = HashMap::new();
    let since = last_seen.get(uuid).copied();
    match dev.process_utilization_stats(since) {
        Ok(samples) => {
            for s in samples {
                let e = util.entry(s.pid).or_insert((0, [0; 4]));
                if s.timestamp >= e.0 {
                    *e = (s.timestamp, [s.sm_util, s.mem_util, s.enc_util, s.dec_util]);
                }
                let seen = last_seen.entry(uuid.to_string()).or_insert(0);
                *seen = (*seen).max(s.timestamp);
            }
        }
        Err(NvmlError::NotFound) => {}
        Err(NvmlError::GpuLost) => r.lost = true,
        Err(NvmlError::NotSupported) | Err(NvmlError::FailedToLoadSymbol(_)) => {
            r.unsupported.push("process_utilization");
            return;
        }
        Err(e) => tracing::debug!(uuid, "process utilization: {e}"),
    }
    if r.lost {
        return;
    }
    for p in procs {
        let u = util.get(&p.pid).map(|(_, u)| *u).unwrap_or([0; 4]);
        p.sm_util = Some(u[0]);
        p.mem_util = Some(u[1]);
        p.enc_util = Some(u[2]);
        p.dec_util = Some(u[3]);
    }
}

/// Returns the merged entry: a process with several contexts is one process.
fn merge_process<'a>(
    procs: &'a mut Vec<ProcessSample>,
    p: &ProcessInfo,
    migs: &[MigSample],
) -> &'a mut ProcessSample {
    let used = match p.used_gpu_memory {
        UsedGpuMemory::Used(b) => b,
        UsedGpuMemory::Unavailable => 0,
    };
    let mig_uuid = match (p.gpu_instance_id, p.compute_instance_id) {
        (Some(gi), Some(ci)) => migs
            .iter()
            .find(|m| m.gpu_instance_id == gi && m.compute_instance_id == ci)
            .or_else(|| migs.iter().find(|m| m.gpu_instance_id == gi))
            .map(|m| m.uuid.clone()),
        (Some(gi), None) => migs
            .iter()
            .find(|m| m.gpu_instance_id == gi)
            .map(|m| m.uuid.clone()),
        _ => None,
    };
    if let Some(i) = procs
        .iter()
        .position(|e| e.pid == p.pid && e.mig_uuid == mig_uuid)
    {
        let e = &mut procs[i];
        e.used_memory_bytes = e.used_memory_bytes.max(used);
        return e;
    }
    procs.push(ProcessSample {
        pid: p.pid,
        used_memory_bytes: used,
        gpu_instance_id: p.gpu_instance_id,
        compute_instance_id: p.compute_instance_id,
        mig_uuid,
        ..Default::default()
    });
    procs.last_mut().unwrap()
}

/// GPU and compute instance ids of a MIG device handle. nvml-wrapper has no method for
/// these, so the library's own symbols are called, checked first (a missing one panics).
fn instance_ids(nvml: &Nvml, mig: &Device) -> (Option<u32>, Option<u32>) {
    let lib = nvml.lib();
    // SAFETY: `mig` is a live handle from this library; the out-pointers are valid.
    unsafe {
        let handle = mig.handle();
        let gi = lib.nvmlDeviceGetGpuInstanceId.as_ref().ok().and_then(|f| {
            let mut id = 0;
            (f(handle, &mut id) == 0).then_some(id)
        });
        let ci = lib
            .nvmlDeviceGetComputeInstanceId
            .as_ref()
            .ok()
            .and_then(|f| {
                let mut id = 0;
                (f(handle, &mut id) == 0).then_some(id)
            });
        (gi, ci)
    }
}

// ---------------------------------------------------------------------------------------
// Sharing and accounting (MPS clients, per-process accounting at exit)

/// MPS clients, merged into the per-process list: a PID the compute list already has is
/// the same process (marked `mps`), attributed by host PID like any other.
fn read_mps_processes(
    r: &mut Reader,
    dev: &Device,
    migs: &[MigSample],
    procs: &mut Vec<ProcessSample>,
) {
    let Some(list) = r.read("mps_processes", || dev.mps_running_compute_processes()) else {
        return;
    };
    for p in &list {
        merge_process(procs, p, migs).mps = true;
    }
}

/// Accounting mode; the PIDs new in NVML's accounting list; and the stats of the
/// processes the join saw exit. A process still running per NVML is asked about again next
/// cycle, a few times; one NVML no longer knows is dropped.
fn read_accounting(dev: &Device, d: &mut DeviceSample, acc: &mut Accounting) {
    let mode = match dev.is_accounting_enabled() {
        Ok(m) => Some(m),
        Err(NvmlError::NotSupported)
        | Err(NvmlError::FunctionNotFound)
        | Err(NvmlError::FailedToLoadSymbol(_)) => {
            d.unsupported.push("accounting");
            None
        }
        Err(e) => {
            tracing::debug!(uuid = %d.uuid, "accounting mode: {e}");
            None
        }
    };
    d.sharing.accounting_mode = mode;
    if mode != Some(true) {
        acc.pending.retain(|(u, _, _)| *u != d.uuid);
        return;
    }
    if let Ok(pids) = dev.accounting_pids() {
        let before = acc.listed.get(&d.uuid);
        d.sharing.accounting_pids = pids
            .iter()
            .copied()
            .filter(|p| !before.is_some_and(|b| b.contains(p)))
            .collect();
        acc.listed.insert(d.uuid.clone(), pids);
    }
    let uuid = d.uuid.clone();
    acc.pending.retain_mut(|(u, pid, tries)| {
        if *u != uuid {
            return true;
        }
        match dev.accounting_stats_for(*pid) {
            Ok(s) if !s.is_running => {
                d.sharing.accounting.push(AccountingSample {
                    pid: *pid,
                    gpu_util: s.gpu_utilization,
                    mem_util: s.memory_utilization,
                    max_memory_bytes: s.max_memory_usage,
                    time_ms: s.time,
                    start_time_us: s.start_time,
                });
                false
            }
            Ok(_) => {
                *tries -= 1;
                *tries > 0
            }
            Err(e) => {
                tracing::debug!(uuid = %u, pid, "accounting stats: {e}");
                false
            }
        }
    });
}
