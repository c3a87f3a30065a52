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

use gpu_model::{AccountingSample, DeviceStatus, GpmMetrics, NvmlFeatures, SourceStatus};

use super::{
    fields::{self, NvlinkRates},
    gpm::Gpm,
    xid::Xids,
    DeviceSample, GpuSample, MigSample, ProcessSample,
};
use gpu_model::Name;

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
    /// The costly, slowly changing readings: when they are due, and what they last were.
    slow: Slow,
    /// What each device's uuid fixes, read once.
    fixed: Fixed,
    /// Crowded GPUs' process lists, held between reads.
    lists: Lists,
}

/// A GPU listing at least this many processes has its process lists held between reads:
/// on a real driver the compute list costs about 49 µs per process (docs/validation: 3.3 ms
/// for 64 on an H200), so 32 cost about what the per-process utilization call does, and
/// 250 (a GPU of the benchmark's large node) would cost 12 ms a cycle.
const CROWDED_GPU_PROCESSES: usize = 32;

/// The device's memory in use moving by more than this since the lists were read means a
/// process came, went or grew: they are read again at once. A CUDA context alone is about
/// 500 MiB.
const LISTS_MEMORY_MOVED: u64 = 64 << 20;

/// Per GPU uuid, its process lists as last read, while it is crowded.
#[derive(Debug, Default)]
struct Lists {
    interval: Duration,
    held: HashMap<String, HeldLists>,
}

#[derive(Debug)]
struct HeldLists {
    /// Merged (compute, graphics, MPS), before this cycle's utilization.
    procs: Vec<ProcessSample>,
    /// Which of the lists the device does not support, as `Reader` named them.
    unsupported: Vec<&'static str>,
    /// The device's memory in use when they were read.
    memory_used: Option<u64>,
    /// Its MIG devices then, whose positions the processes name.
    migs: Vec<Name>,
    at: Instant,
}

impl HeldLists {
    /// Whether the held lists still stand for the device as read this cycle.
    fn stand(&self, d: &DeviceSample, now: Instant, interval: Duration) -> bool {
        let moved = match (self.memory_used, d.memory_used_bytes) {
            (Some(a), Some(b)) => a.abs_diff(b) > LISTS_MEMORY_MOVED,
            _ => true,
        };
        let same_migs = self.migs.len() == d.mig_devices.len()
            && self
                .migs
                .iter()
                .zip(&d.mig_devices)
                .all(|(a, m)| super::join::same(a, &m.uuid));
        !moved && same_migs && now.saturating_duration_since(self.at) < interval
    }
}

/// What a device's uuid fixes, read once per uuid rather than every cycle: a GPU's name,
/// PCI bus id and minor number; a MIG device's instance ids and profile. A uuid names one
/// device for its life (a MIG device made again gets a new one), and each cycle reads the
/// uuid at the device's index. A reading that failed is not kept: it is asked again, with
/// the rest, next cycle. On the large node's 8 GPUs x 7 MIG devices this is 192 of 533
/// NVML calls a cycle.
#[derive(Debug, Default)]
struct Fixed {
    gpus: Kept<GpuFixed>,
    migs: Kept<MigFixed>,
}

/// Per uuid, what it fixes and the last cycle that saw it.
#[derive(Debug)]
struct Kept<T> {
    by_uuid: HashMap<String, (T, u64)>,
    cycle: u64,
}

impl<T> Default for Kept<T> {
    fn default() -> Self {
        Kept {
            by_uuid: HashMap::new(),
            cycle: 0,
        }
    }
}

impl<T: Clone> Kept<T> {
    /// What `uuid` fixes, if kept; this cycle saw it.
    fn get(&mut self, uuid: &str) -> Option<T> {
        let (v, seen) = self.by_uuid.get_mut(uuid).filter(|_| !uuid.is_empty())?;
        *seen = self.cycle;
        Some(v.clone())
    }

    fn keep(&mut self, uuid: &str, v: &T) {
        if !uuid.is_empty() {
            self.by_uuid
                .insert(uuid.to_string(), (v.clone(), self.cycle));
        }
    }

    /// Forgets the uuids not seen this cycle, once there are more than twice those seen.
    fn end_cycle(&mut self, seen: usize) {
        let cycle = self.cycle;
        if self.by_uuid.len() > 2 * seen {
            self.by_uuid.retain(|_, (_, s)| *s == cycle);
        }
        self.cycle += 1;
    }
}

#[derive(Debug, Clone)]
struct GpuFixed {
    name: Option<String>,
    pci_bus_id: Option<String>,
    minor_number: Option<u32>,
    /// The readings among these the device does not support, as `Reader` names them.
    unsupported: Vec<&'static str>,
}

#[derive(Debug, Clone)]
struct MigFixed {
    /// The uuid itself, shared by every cycle's sample and the processes on the device.
    uuid: gpu_model::Name,
    gpu_instance_id: u32,
    compute_instance_id: u32,
    profile: Option<String>,
}

/// Readings that cost milliseconds of CPU per call on a real driver and are counters or
/// change slowly (H100, driver 580, docs/validation: energy 3-6 ms, GPM 1.6 ms, PCIe replays
/// 0.2-0.4 ms, MIG mode 0.3 ms, against 10 ms for a whole cycle of one GPU). They are read
/// every `interval`, and held in between: a counter's rate and GPM's averages then span the
/// interval, and the energy split charges each read's increase by the mean of the shares of
/// the cycles since the last read (`account::EnergyShares`).
struct Slow {
    interval: Duration,
    last: Option<Instant>,
    /// Reads since NVML was initialised: the first two cycles read everything, so that
    /// rates (GPM, the energy split) are known from the second cycle on.
    reads: u32,
    /// Per device index: what its last read gave.
    held: HashMap<u32, Held>,
}

/// Names of the slow readings, as `DeviceSample::unsupported` lists them.
const SLOW_READINGS: [&str; 3] = ["energy", "mig", "pcie_replay"];

/// One device's slow readings, as last read.
#[derive(Debug, Default, PartialEq)]
struct Held {
    uuid: String,
    energy_mj: Option<u64>,
    mig_enabled: bool,
    pcie_replay: Option<u64>,
    gpm: Option<GpmMetrics>,
    /// Per GPU instance id.
    mig_gpm: Vec<(u32, Option<GpmMetrics>)>,
    unsupported: Vec<&'static str>,
}

impl Slow {
    /// Whether this cycle reads the slow readings (and records that it does).
    fn due(&mut self, now: Instant) -> bool {
        let due = self.reads < 2 || self.last.is_none_or(|t| now >= t + self.interval);
        if due {
            self.last = Some(now);
            self.reads += 1;
        }
        due
    }

    /// What to hold for device `index` this cycle: None reads it afresh.
    fn held(&self, due: bool, index: u32) -> Option<&Held> {
        (!due).then(|| self.held.get(&index)).flatten()
    }

    fn forget(&mut self) {
        self.last = None;
        self.reads = 0;
        self.held.clear();
    }
}

impl Held {
    fn of(d: &DeviceSample) -> Held {
        Held {
            uuid: d.uuid.clone(),
            energy_mj: d.energy_mj,
            mig_enabled: d.mig_enabled,
            pcie_replay: d.fields.pcie_replay,
            gpm: d.fields.gpm,
            mig_gpm: d
                .mig_devices
                .iter()
                .map(|m| (m.gpu_instance_id, m.gpm))
                .collect(),
            unsupported: d
                .unsupported
                .iter()
                .filter(|n| SLOW_READINGS.contains(n))
                .copied()
                .collect(),
        }
    }

    /// The device's own slow readings (read before its MIG devices are listed).
    fn restore_device(&self, d: &mut DeviceSample) {
        d.energy_mj = self.energy_mj;
        d.mig_enabled = self.mig_enabled;
        d.unsupported.extend(&self.unsupported);
    }

    /// The fields' and profiling's slow readings.
    fn restore_extras(&self, d: &mut DeviceSample) {
        d.fields.pcie_replay = self.pcie_replay;
        d.fields.gpm = self.gpm;
        for m in &mut d.mig_devices {
            m.gpm = self
                .mig_gpm
                .iter()
                .find(|(gi, _)| *gi == m.gpu_instance_id)
                .and_then(|(_, g)| *g);
        }
    }
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
            slow: Slow {
                interval: Duration::from_secs(10),
                last: None,
                reads: 0,
                held: HashMap::new(),
            },
            fixed: Fixed::default(),
            lists: Lists::default(),
        }
    }

    /// Holds a crowded GPU's process lists up to `interval` between reads
    /// (`nvml.crowded_list_interval_ms`; zero reads them every cycle).
    pub fn with_crowded_list_interval(mut self, interval: Duration) -> NvmlSampler {
        self.lists.interval = interval;
        self
    }

    /// Reads energy, GPM, PCIe replays and MIG mode every `interval` (`nvml.slow_interval_ms`).
    pub fn with_slow_interval(mut self, interval: Duration) -> NvmlSampler {
        self.slow.interval = interval;
        self
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
        self.slow.forget();
        self.fixed = Fixed::default();
        // A driver that comes back is listed afresh.
        self.lists.held.clear();
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
        let due = self.slow.due(Instant::now());
        let mut devices = Vec::with_capacity(count as usize);
        for index in 0..count {
            let d = match nvml.device_by_index(index) {
                Ok(dev) => {
                    let held = self.slow.held(due, index);
                    let mut ctx = DeviceCtx {
                        last_seen: &mut self.last_seen,
                        fixed: &mut self.fixed,
                        lists: &mut self.lists,
                    };
                    let (mut d, held) = sample_device(nvml, &dev, index, &mut ctx, held);
                    if self.accounting.enabled && d.status.is_ok() && !d.mig_enabled {
                        read_accounting(&dev, &mut d, &mut self.accounting);
                    }
                    let fresh = held.is_none();
                    let d = self.extras.device(nvml, &dev, d, held);
                    if fresh && d.status.is_ok() {
                        self.slow.held.insert(index, Held::of(&d));
                    }
                    d
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
        let migs = devices.iter().map(|d| d.mig_devices.len()).sum();
        self.fixed.gpus.end_cycle(devices.len());
        self.fixed.migs.end_cycle(migs);
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
    /// With `held`, the slow readings (PCIe replays, GPM) are those and are not read.
    fn device(
        &mut self,
        nvml: &Nvml,
        dev: &Device,
        mut d: DeviceSample,
        held: Option<&Held>,
    ) -> DeviceSample {
        if !d.status.is_ok() {
            return d;
        }
        let mut r = Reader {
            unsupported: std::mem::take(&mut d.unsupported),
            lost: false,
        };
        fields::read(&mut r, nvml, dev, &mut d, &mut self.nvlink, held.is_none());
        d.unsupported = r.unsupported;
        d.unsupported.dedup();
        if r.lost {
            d.status = DeviceStatus::Lost;
            d.processes.clear();
            return d;
        }
        match held {
            Some(h) => h.restore_extras(&mut d),
            None => self.gpm.sample(nvml, dev, &mut d),
        }
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

/// What `sample_device` keeps across cycles.
struct DeviceCtx<'a> {
    /// Per device uuid: the newest process-utilization timestamp seen.
    last_seen: &'a mut HashMap<String, u64>,
    fixed: &'a mut Fixed,
    lists: &'a mut Lists,
}

/// One device's sample. With `held` (and the same uuid), the slow readings are those and
/// are not read; the `held` returned is what was used.
fn sample_device<'h>(
    nvml: &Nvml,
    dev: &Device,
    index: u32,
    ctx: &mut DeviceCtx,
    held: Option<&'h Held>,
) -> (DeviceSample, Option<&'h Held>) {
    let mut d = DeviceSample {
        index,
        status: DeviceStatus::Ok,
        ..Default::default()
    };
    let mut r = Reader {
        unsupported: vec![],
        lost: false,
    };
    read_device_metrics(&mut r, dev, &mut d, ctx.fixed);
    // A device that was replaced at this index since (another uuid) is read afresh.
    let held = held.filter(|h| h.uuid == d.uuid);
    match held {
        Some(h) => h.restore_device(&mut d),
        None => read_slow_device_metrics(&mut r, dev, &mut d),
    }
    if d.mig_enabled && !r.lost {
        read_mig_devices(&mut r, nvml, dev, &mut d, ctx.fixed);
    }
    d.processes = sample_processes(&mut r, dev, &d, ctx);
    debug_assert!(d.processes.is_sorted_by_key(|p| p.pid));
    d.unsupported = r.unsupported;
    d.unsupported.dedup();
    if r.lost {
        d.status = DeviceStatus::Lost;
        d.processes.clear();
    }
    (d, held)
}

fn read_device_metrics(r: &mut Reader, dev: &Device, d: &mut DeviceSample, fixed: &mut Fixed) {
    d.uuid = r.read("uuid", || dev.uuid()).unwrap_or_default();
    let f = match fixed.gpus.get(&d.uuid) {
        Some(f) => f,
        None => read_gpu_fixed(r, dev, d, &mut fixed.gpus),
    };
    d.name = f.name.unwrap_or_default();
    d.pci_bus_id = f.pci_bus_id;
    // Where `Reader` would have named them, in the order of the reads.
    let unsupported = |name| f.unsupported.contains(&name).then_some(name);
    r.unsupported
        .extend(["name", "pci_info"].into_iter().filter_map(unsupported));
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
    d.sharing.minor_number = f.minor_number;
    r.unsupported.extend(unsupported("minor_number"));
}

/// A GPU's fixed readings, read now and kept when every one answered (or is unsupported).
/// The reader's unsupported list is left as it was: the caller names them in their places.
fn read_gpu_fixed(
    r: &mut Reader,
    dev: &Device,
    d: &DeviceSample,
    kept: &mut Kept<GpuFixed>,
) -> GpuFixed {
    let mut own = Reader {
        unsupported: vec![],
        lost: r.lost,
    };
    let f = GpuFixed {
        name: own.read("name", || dev.name()),
        pci_bus_id: own.read("pci_info", || dev.pci_info()).map(|p| p.bus_id),
        minor_number: own.read("minor_number", || dev.minor_number()),
        unsupported: own.unsupported,
    };
    r.lost |= own.lost;
    let answered = |v: bool, name| v || f.unsupported.contains(&name);
    let complete = answered(f.name.is_some(), "name")
        && answered(f.pci_bus_id.is_some(), "pci_info")
        && answered(f.minor_number.is_some(), "minor_number");
    if complete && !r.lost {
        kept.keep(&d.uuid, &f);
    }
    f
}

/// The device's readings of `SLOW_READINGS` (the fields' and GPM's are read with them).
fn read_slow_device_metrics(r: &mut Reader, dev: &Device, d: &mut DeviceSample) {
    d.energy_mj = r.read("energy", || dev.total_energy_consumption());
    d.mig_enabled = r
        .read("mig", || dev.mig_mode())
        .is_some_and(|m| m.current == 1);
}

fn read_mig_devices(
    r: &mut Reader,
    nvml: &Nvml,
    dev: &Device,
    d: &mut DeviceSample,
    fixed: &mut Fixed,
) {
    let n = r.read("mig", || dev.mig_device_count()).unwrap_or(0);
    for i in 0..n {
        // Empty slots answer NotFound: skip them.
        let Ok(mig) = dev.mig_device_by_index(i) else {
            continue;
        };
        let mem = mig.memory_info().ok();
        let uuid = mig.uuid().unwrap_or_default();
        let f = match fixed.migs.get(&uuid) {
            Some(f) => f,
            None => read_mig_fixed(nvml, &mig, &uuid, &mut fixed.migs),
        };
        d.mig_devices.push(MigSample {
            uuid: f.uuid,
            gpu_instance_id: f.gpu_instance_id,
            compute_instance_id: f.compute_instance_id,
            memory_total_bytes: mem.as_ref().map(|m| m.total),
            memory_used_bytes: mem.as_ref().map(|m| m.used),
            profile: f.profile,
            gpm: None,
        });
    }
}

/// A MIG device's instance ids and profile, read now; kept when all three answered.
fn read_mig_fixed(nvml: &Nvml, mig: &Device, uuid: &str, kept: &mut Kept<MigFixed>) -> MigFixed {
    let (gi, ci) = instance_ids(nvml, mig);
    let name = mig.name().ok();
    let f = MigFixed {
        uuid: uuid.into(),
        gpu_instance_id: gi.unwrap_or(u32::MAX),
        compute_instance_id: ci.unwrap_or(u32::MAX),
        profile: name.as_deref().and_then(mig_profile),
    };
    if gi.is_some() && ci.is_some() && name.is_some() {
        kept.keep(uuid, &f);
    }
    f
}

/// The profile in a MIG device's name: `NVIDIA A100-SXM4-80GB MIG 1g.10gb` -> `1g.10gb`.
fn mig_profile(name: &str) -> Option<String> {
    let p = name.rsplit_once("MIG ")?.1.trim();
    (!p.is_empty()).then(|| p.to_string())
}

/// The device's processes by PID, with this cycle's utilization. A crowded GPU's lists are held
/// (`Lists`) while its memory in use stays put and no new PID shows up in its utilization.
fn sample_processes(
    r: &mut Reader,
    dev: &Device,
    d: &DeviceSample,
    ctx: &mut DeviceCtx,
) -> Vec<ProcessSample> {
    let now = Instant::now();
    let interval = ctx.lists.interval;
    let held = (ctx.lists.held.get(&d.uuid)).filter(|h| h.stand(d, now, interval));
    let mut unsupported = vec![];
    // By PID, as the sample's lists are: sorted once as read, and held so (a crowded GPU's
    // held lists were sorted again every cycle).
    let mut read = |r: &mut Reader| {
        let n = r.unsupported.len();
        let mut procs = read_process_lists(r, dev, d);
        procs.sort_by_key(|p| p.pid);
        unsupported = r.unsupported[n..].to_vec();
        procs
    };
    let (mut procs, mut from_held) = match held {
        Some(h) => {
            r.unsupported.extend(&h.unsupported);
            (h.procs.clone(), true)
        }
        None => (read(r), false),
    };
    // MIG devices cannot say per-process utilization. A device with no process has none to
    // say: the call costs 2-3 ms on a real driver all the same (it answers NotFound).
    if !r.lost && !d.mig_enabled && !procs.is_empty() {
        let util = read_process_utilization(r, dev, &d.uuid, ctx.last_seen);
        // A PID the held lists do not name is a process they missed: read them now.
        let missed = |u: &Utilization| u.keys().any(|pid| procs.iter().all(|p| p.pid != *pid));
        if from_held && util.as_ref().is_some_and(missed) {
            procs = read(r);
            from_held = false;
        }
        if let Some(u) = &util {
            apply_utilization(u, &mut procs);
        }
    }
    if r.lost || procs.len() < CROWDED_GPU_PROCESSES || interval.is_zero() {
        ctx.lists.held.remove(&d.uuid);
    } else if !from_held {
        let mut kept = procs.clone();
        for p in &mut kept {
            (p.sm_util, p.mem_util, p.enc_util, p.dec_util) = (None, None, None, None);
        }
        let held = HeldLists {
            procs: kept,
            unsupported,
            memory_used: d.memory_used_bytes,
            migs: d.mig_devices.iter().map(|m| m.uuid.clone()).collect(),
            at: now,
        };
        // Logged as it becomes crowded: its lists were not held before.
        if ctx.lists.held.insert(d.uuid.clone(), held).is_none() {
            tracing::info!(
                uuid = d.uuid,
                processes = procs.len(),
                "a crowded GPU: its process lists are read at most every {} ms while its \
                 memory in use holds still (nvml.crowded_list_interval_ms)",
                interval.as_millis()
            );
        }
    }
    procs
}

/// The device's processes as its compute, graphics and MPS lists name them, merged.
fn read_process_lists(r: &mut Reader, dev: &Device, d: &DeviceSample) -> Vec<ProcessSample> {
    // Compute and graphics contexts; a process with both is one process.
    let lists = [
        r.read("processes", || dev.running_compute_processes()),
        r.read("graphics_processes", || dev.running_graphics_processes()),
    ];
    // Sized for them at once: grown from empty, the list and its index were reallocated
    // and rehashed eight times a cycle on a GPU of 250 processes.
    let mut merged = Merged::with_capacity(lists.iter().flatten().map(Vec::len).sum());
    for p in lists.into_iter().flatten().flatten() {
        merged.merge(&p, &d.mig_devices);
    }
    read_mps_processes(r, dev, &d.mig_devices, &mut merged);
    merged.procs
}

/// Per PID, its newest utilization sample since the last one seen (timestamp; SM, memory,
/// encoder, decoder).
type Utilization = HashMap<u32, (u64, [u32; 4])>;

/// Utilization since our last look (`last_seen`, per device uuid). NotFound means "no
/// samples": every process idle. Unsupported (None): the processes' utilization stays
/// unknown.
fn read_process_utilization(
    r: &mut Reader,
    dev: &Device,
    uuid: &str,
    last_seen: &mut HashMap<String, u64>,
) -> Option<Utilization> {
    let mut util: Utilization = HashMap::new();
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
            return None;
        }
        Err(e) => tracing::debug!(uuid, "process utilization: {e}"),
    }
    (!r.lost).then_some(util)
}

/// Each process's utilization from `util`: zero where it had no sample.
fn apply_utilization(util: &Utilization, procs: &mut [ProcessSample]) {
    for p in procs {
        let u = util.get(&p.pid).map(|(_, u)| *u).unwrap_or([0; 4]);
        p.sm_util = Some(u[0]);
        p.mem_util = Some(u[1]);
        p.enc_util = Some(u[2]);
        p.dec_util = Some(u[3]);
    }
}

/// A device's processes as NVML lists them (compute, graphics, MPS), merged: a process with
/// several contexts on one device (or MIG device) is one entry.
#[derive(Debug, Default)]
struct Merged {
    procs: Vec<ProcessSample>,
    /// (pid, index of its MIG device) -> its entry: one lookup per context, where a scan of
    /// the list per context was quadratic (250 processes a GPU on a large node).
    index: rustc_hash::FxHashMap<(u32, Option<usize>), usize>,
}

impl Merged {
    fn with_capacity(n: usize) -> Merged {
        Merged {
            procs: Vec::with_capacity(n),
            index: rustc_hash::FxHashMap::with_capacity_and_hasher(n, Default::default()),
        }
    }

    /// Returns the merged entry.
    fn merge(&mut self, p: &ProcessInfo, migs: &[MigSample]) -> &mut ProcessSample {
        let used = match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => b,
            UsedGpuMemory::Unavailable => 0,
        };
        let gi_is = |gi| move |m: &MigSample| m.gpu_instance_id == gi;
        let mig = match (p.gpu_instance_id, p.compute_instance_id) {
            (Some(gi), Some(ci)) => migs
                .iter()
                .position(|m| m.gpu_instance_id == gi && m.compute_instance_id == ci)
                .or_else(|| migs.iter().position(gi_is(gi))),
            (Some(gi), None) => migs.iter().position(gi_is(gi)),
            _ => None,
        };
        let i = *self.index.entry((p.pid, mig)).or_insert_with(|| {
            self.procs.push(ProcessSample {
                pid: p.pid,
                gpu_instance_id: p.gpu_instance_id,
                compute_instance_id: p.compute_instance_id,
                mig: mig.and_then(|i| u8::try_from(i).ok()),
                ..Default::default()
            });
            self.procs.len() - 1
        });
        let e = &mut self.procs[i];
        e.used_memory_bytes = e.used_memory_bytes.max(used);
        e
    }
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
fn read_mps_processes(r: &mut Reader, dev: &Device, migs: &[MigSample], merged: &mut Merged) {
    let Some(list) = r.read("mps_processes", || dev.mps_running_compute_processes()) else {
        return;
    };
    for p in &list {
        merged.merge(p, migs).mps = true;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn slow(interval_ms: u64) -> Slow {
        Slow {
            interval: Duration::from_millis(interval_ms),
            last: None,
            reads: 0,
            held: HashMap::new(),
        }
    }

    #[test]
    fn held_lists_stand_until_the_memory_moves_the_mig_devices_change_or_time_is_up() {
        let t0 = Instant::now();
        let mig = |u: &str| MigSample {
            uuid: u.into(),
            ..Default::default()
        };
        let device = |used: Option<u64>, migs: &[&str]| DeviceSample {
            memory_used_bytes: used,
            mig_devices: migs.iter().map(|u| mig(u)).collect(),
            ..Default::default()
        };
        let held = HeldLists {
            procs: vec![],
            unsupported: vec![],
            memory_used: Some(10 << 30),
            migs: vec!["MIG-a".into(), "MIG-b".into()],
            at: t0,
        };
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let five_s = Duration::from_secs(5);
        let d = device(Some((10 << 30) + LISTS_MEMORY_MOVED), &["MIG-a", "MIG-b"]);
        assert!(held.stand(&d, at(4_999), five_s), "within the bounds");
        assert!(!held.stand(&d, at(5_000), five_s), "the interval is up");
        let moved = device(
            Some((10 << 30) - LISTS_MEMORY_MOVED - 1),
            &["MIG-a", "MIG-b"],
        );
        assert!(!held.stand(&moved, at(1), five_s), "memory moved");
        assert!(!held.stand(&device(None, &["MIG-a", "MIG-b"]), at(1), five_s));
        let remade = device(Some(10 << 30), &["MIG-a", "MIG-c"]);
        assert!(
            !held.stand(&remade, at(1), five_s),
            "a MIG device made again"
        );
        assert!(!held.stand(&device(Some(10 << 30), &["MIG-a"]), at(1), five_s));
    }

    #[test]
    fn slow_readings_are_due_at_the_first_two_cycles_then_once_per_interval() {
        let mut s = slow(1000);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let due: Vec<bool> = [0, 200, 400, 1000, 1199, 1200, 1400, 2200]
            .into_iter()
            .map(|ms| s.due(at(ms)))
            .collect();
        assert_eq!(
            due,
            [true, true, false, false, false, true, false, true],
            "reads at 0 and 200 ms, then 1 s after the last read"
        );
        s.held.insert(0, Held::default());
        assert!(s.held(false, 0).is_some() && s.held(true, 0).is_none());
        s.forget();
        assert!(s.due(at(2300)), "NVML restarted: read at once");
        assert!(s.held(false, 0).is_none());
    }

    #[test]
    fn contexts_of_one_process_merge_per_device_and_keep_the_most_memory() {
        let mig = |gi, ci| MigSample {
            uuid: format!("MIG-{gi}-{ci}").into(),
            gpu_instance_id: gi,
            compute_instance_id: ci,
            ..Default::default()
        };
        let migs = [mig(1, 0), mig(2, 0)];
        let ctx = |pid, mib: u64, gi: Option<u32>| ProcessInfo {
            pid,
            used_gpu_memory: UsedGpuMemory::Used(mib << 20),
            gpu_instance_id: gi,
            compute_instance_id: gi.map(|_| 0),
        };
        let mut m = Merged::default();
        m.merge(&ctx(10, 100, Some(1)), &migs);
        m.merge(&ctx(11, 50, Some(2)), &migs);
        // A graphics context of 10 on the same MIG device, and 10 on the other one.
        m.merge(&ctx(10, 300, Some(1)), &migs);
        m.merge(&ctx(10, 20, Some(2)), &migs);
        m.merge(&ctx(11, 10, Some(2)), &migs).mps = true;
        let rows: Vec<_> = m
            .procs
            .iter()
            .map(|p| {
                (
                    p.pid,
                    p.mig.map(|i| &*migs[usize::from(i)].uuid),
                    p.used_memory_bytes >> 20,
                    p.mps,
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                (10, Some("MIG-1-0"), 300, false),
                (11, Some("MIG-2-0"), 50, true),
                (10, Some("MIG-2-0"), 20, false),
            ]
        );
        // Without MIG: one entry per pid.
        let mut m = Merged::default();
        m.merge(&ctx(7, 1, None), &[]);
        m.merge(&ctx(7, 2, None), &[]);
        assert_eq!(m.procs.len(), 1);
        assert_eq!(m.procs[0].used_memory_bytes, 2 << 20);
    }

    #[test]
    fn held_readings_restore_what_was_read_and_only_that() {
        let gpm = |v: f64| GpmMetrics {
            sm_active: Some(v),
            ..Default::default()
        };
        let mig = |gi: u32, g: Option<GpmMetrics>| MigSample {
            gpu_instance_id: gi,
            gpm: g,
            ..Default::default()
        };
        let mut read = DeviceSample {
            uuid: "GPU-a".into(),
            energy_mj: Some(7_000),
            mig_enabled: true,
            unsupported: vec!["ecc", "pcie_replay"],
            mig_devices: vec![mig(1, Some(gpm(0.5))), mig(2, None)],
            ..Default::default()
        };
        read.fields.pcie_replay = None;
        read.fields.gpm = Some(gpm(0.75));
        let held = Held::of(&read);
        assert_eq!(held.unsupported, ["pcie_replay"], "only the slow readings'");

        // A later cycle: the fast readings are new, the slow ones are not read.
        let mut later = DeviceSample {
            uuid: "GPU-a".into(),
            unsupported: vec!["ecc"],
            mig_devices: vec![mig(2, None), mig(1, None)],
            ..Default::default()
        };
        held.restore_device(&mut later);
        held.restore_extras(&mut later);
        assert_eq!(later.energy_mj, Some(7_000));
        assert!(later.mig_enabled);
        assert_eq!(later.unsupported, ["ecc", "pcie_replay"]);
        assert_eq!(later.fields.gpm, Some(gpm(0.75)));
        assert_eq!(later.mig_devices[0].gpm, None);
        assert_eq!(later.mig_devices[1].gpm, Some(gpm(0.5)), "by GPU instance");
    }
}
