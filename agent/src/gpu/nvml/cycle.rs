//! The NVML binding: nvml-wrapper, loaded from the system or a given path. Failures degrade:
//! no library or driver -> unavailable with a reason and retried with backoff; a lost GPU or
//! an unsupported call -> that device or metric is marked and skipped, the others go on; a
//! GPU whose calls do not return -> left out, then reported stalled (readers.rs).
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use nvml_wrapper::{error::NvmlError, Nvml};

use gpu_model::{DeviceStatus, NvmlFeatures, SourceStatus};

use super::{
    reader::in_call,
    readers::{Readers, Settings},
    slow::{Due, Slow},
    xid::Xids,
    DeviceSample, GpuSample,
};

const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// At most this many accounting requests wait for their device (a flood of exits).
const MAX_ACCOUNTING_REQUESTS: usize = 4096;

/// What a device said of itself when it last answered.
#[derive(Debug, Clone, Default)]
struct Known {
    uuid: String,
    name: String,
    pci_bus_id: Option<String>,
}

pub struct NvmlSampler {
    lib_path: Option<PathBuf>,
    /// Shared with the readers: a reader stuck in a call keeps the library loaded.
    nvml: Option<Arc<Nvml>>,
    status: SourceStatus,
    next_init: Instant,
    backoff: Duration,
    /// Per device index: who it was last seen as, to name a device that is lost or does
    /// not answer.
    known: HashMap<u32, Known>,
    /// The GPUs' reading states and the thread that reads them; made at init.
    readers: Option<Readers>,
    settings: Settings,
    /// The GPUs reported stalled, until they answer.
    stalled: HashSet<u32>,
    cycle: u64,
    /// How long a cycle waits for its readers' answers.
    wait: Duration,
    /// A device that has not answered for this long is reported stalled.
    stall_timeout: Duration,
    /// XID events: the readers register their devices, each cycle drains them.
    xids: Arc<Mutex<Xids>>,
    /// Profiling's status per device, as the readers last said.
    gpm: BTreeMap<String, SourceStatus>,
    /// (device uuid, pid): accounting stats the join asked for, until their device's reader
    /// takes them.
    accounting: Vec<(String, u32)>,
    /// When the costly, slowly changing readings are due.
    slow: Slow,
    /// The readers' CPU time since `take_reader_cpu_ns` last took it.
    reader_cpu_ns: u64,
}

impl NvmlSampler {
    pub fn new(lib_path: Option<PathBuf>) -> NvmlSampler {
        NvmlSampler {
            lib_path,
            nvml: None,
            status: SourceStatus::Unavailable("not initialised yet".into()),
            next_init: Instant::now(),
            backoff: BACKOFF_MIN,
            known: HashMap::new(),
            readers: None,
            stalled: HashSet::new(),
            settings: Settings {
                crowded_list_interval: Duration::from_secs(5),
                accounting: false,
            },
            cycle: 0,
            wait: Duration::from_secs(1),
            stall_timeout: Duration::from_secs(5),
            xids: Arc::new(Mutex::new(Xids::new(None))),
            gpm: BTreeMap::new(),
            accounting: vec![],
            slow: Slow::new(
                Duration::from_secs(10),
                Duration::from_secs(30),
                Duration::from_secs(60),
            ),
            reader_cpu_ns: 0,
        }
    }

    /// Holds a crowded GPU's process lists up to `interval` between reads
    /// (`nvml.crowded_list_interval_ms`; zero reads them every cycle).
    pub fn with_crowded_list_interval(mut self, interval: Duration) -> NvmlSampler {
        self.settings.crowded_list_interval = interval;
        self
    }

    /// Reads each GPU's own readings every `interval` (`nvml.slow_interval_ms`), each GPU at
    /// its own point of it, GPM every `gpm` and the energy counter every `energy`
    /// (`nvml.gpm_interval_ms`, `nvml.energy_interval_ms`; slow.rs).
    pub fn with_slow_interval(
        mut self,
        interval: Duration,
        gpm: Duration,
        energy: Duration,
    ) -> NvmlSampler {
        self.slow = Slow::new(interval, gpm, energy);
        self
    }

    /// A cycle waits up to `wait` for each device (the sampling interval); a device that
    /// has not answered for `stall_timeout` is reported stalled.
    pub fn with_deadlines(mut self, wait: Duration, stall_timeout: Duration) -> NvmlSampler {
        self.wait = wait.min(stall_timeout);
        self.stall_timeout = stall_timeout;
        self
    }

    /// Turns the accounting reads on (`usage.accounting`).
    pub fn enable_accounting(&mut self, on: bool) {
        self.settings.accounting = on;
    }

    /// Asks for the accounting stats of these (device uuid, pid): processes the kernel
    /// reported exited. Read on the next cycle by their device's reader.
    pub fn request_accounting(&mut self, requests: Vec<(String, u32)>) {
        self.accounting.extend(requests);
        let n = self.accounting.len();
        if n > MAX_ACCOUNTING_REQUESTS {
            self.accounting.drain(..n - MAX_ACCOUNTING_REQUESTS);
        }
    }

    /// Reads the kernel log at `path` to name the process of each XID; None: does not.
    pub fn with_kmsg(self, path: Option<PathBuf>) -> NvmlSampler {
        *self.xids.lock().unwrap() = Xids::new(path);
        self
    }

    /// The CPU time the reader threads spent on the answers taken since the last call:
    /// with the NVML thread's own, NVML's whole cost.
    pub fn take_reader_cpu_ns(&mut self) -> u64 {
        std::mem::take(&mut self.reader_cpu_ns)
    }

    pub fn status(&self) -> &SourceStatus {
        &self.status
    }

    /// What the optional features (profiling, XID events) gave, and why not: /debug/stats.
    pub fn features(&self) -> NvmlFeatures {
        let x = self.xids.lock().unwrap();
        NvmlFeatures {
            gpm: self.gpm.clone(),
            xid_events: x.events_status.clone(),
            kmsg: x.kmsg_status.clone(),
        }
    }

    /// Drops NVML, freeing first what was allocated from it. The reader goes: an idle one
    /// at once, one stuck in a call once it returns.
    fn shut_down(&mut self) {
        if let Some(mut r) = self.readers.take() {
            r.release();
        }
        self.stalled.clear();
        if let Some(nvml) = self.nvml.take() {
            self.xids.lock().unwrap().release(&nvml);
        }
        self.gpm.clear();
        self.slow.forget();
    }

    fn try_init(&mut self) -> bool {
        if self.nvml.is_some() {
            return true;
        }
        if Instant::now() < self.next_init {
            return false;
        }
        match in_call(&"nvmlInit_v2", || open(self.lib_path.as_deref())) {
            Ok(nvml) => {
                tracing::info!(lib = ?self.lib_path, "NVML initialised");
                self.nvml = Some(Arc::new(nvml));
                self.status = SourceStatus::Ok;
                self.backoff = BACKOFF_MIN;
                true
            }
            Err(e) => {
                let reason = describe_init_error(&e, self.lib_path.as_deref());
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
        let nvml = self.nvml.clone().unwrap();
        let count = match in_call(&"nvmlDeviceGetCount", || nvml.device_count()) {
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
        let driver_version = in_call(&"nvmlSystemGetDriverVersion", || nvml.sys_driver_version());
        let due = self.slow.due(Instant::now(), count as usize);
        let mut devices = self.read_devices(&nvml, count, &due);
        // A lost device may no longer tell its name: use what it said before.
        for d in &mut devices {
            if d.uuid.is_empty() {
                if let Some(k) = self.known.get(&d.index) {
                    d.uuid = k.uuid.clone();
                    d.name = k.name.clone();
                }
            } else {
                let k = Known {
                    uuid: d.uuid.clone(),
                    name: d.name.clone(),
                    pci_bus_id: d.pci_bus_id.clone(),
                };
                self.known.insert(d.index, k);
            }
        }
        let faulted = in_call(&"XID events", || {
            self.xids.lock().unwrap().collect(&nvml, &mut devices)
        });
        // Its health readings (ECC, remapped rows, throttle reasons, ...) move with a fault:
        // read the next cycle, not up to a slow interval later.
        for d in devices.iter().filter(|d| faulted.contains(&d.uuid)) {
            self.slow.soon(d.index as usize);
        }
        self.status = self.stalled_status(&devices);
        Some(GpuSample {
            taken_at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            driver_version: driver_version.ok(),
            devices,
        })
    }

    /// Every device's sample of this cycle, in index order: the readers are asked and
    /// awaited until the cycle's deadlines. A device a stuck read holds is left out, and
    /// reported stalled once it has been for the stall timeout.
    fn read_devices(&mut self, nvml: &Arc<Nvml>, count: u32, due: &[Due]) -> Vec<DeviceSample> {
        self.cycle += 1;
        let (xids, settings) = (&self.xids, &self.settings);
        let readers = (self.readers)
            .get_or_insert_with(|| Readers::new(nvml.clone(), xids.clone(), settings.clone()));
        let accounting = route(&mut self.accounting, &self.known);
        let cycle = readers.read(self.cycle, count, due, accounting, self.wait);
        let mut out = Vec::with_capacity(count as usize);
        self.reader_cpu_ns += readers.take_cpu_ns();
        for a in cycle.answers {
            self.gpm.extend(a.gpm.into_iter().flatten());
            out.push(a.sample);
        }
        for (index, after) in cycle.recovered {
            self.recovered(index, after);
        }
        let stuck: Vec<_> = (cycle.stuck.into_iter())
            .filter(|(_, _, waited)| *waited >= self.stall_timeout)
            .collect();
        self.stalled
            .retain(|i| stuck.iter().any(|(j, _, _)| i == j));
        for (index, call, waited) in stuck {
            out.push(self.stalled_sample(index, call, waited));
        }
        out.sort_by_key(|d| d.index);
        out
    }

    /// A device a stuck read held answered again, `after` it was asked: said where it was
    /// reported stalled (a device that is merely slow at times is not worth a WARN).
    fn recovered(&self, index: u32, after: Duration) {
        let uuid = self.known.get(&index).map_or("", |k| k.uuid.as_str());
        if self.stalled.contains(&index) {
            tracing::warn!(
                index,
                uuid,
                "GPU {index} answers again, after {} s without an answer",
                after.as_secs()
            );
        } else {
            tracing::debug!(
                index,
                uuid,
                "GPU {index} answered {} ms late",
                after.as_millis()
            );
        }
    }

    /// The last XID NVML or the kernel log reported for device `index`.
    fn last_xid(&self, index: u32) -> Option<u64> {
        let k = self.known.get(&index)?;
        let pci = k.pci_bus_id.as_deref();
        self.xids.lock().unwrap().last_xid(&k.uuid, pci)
    }

    /// A stalled device's sample: its identity and `stalled`, no reading. Said once per
    /// stall.
    fn stalled_sample(&mut self, index: u32, call: &'static str, waited: Duration) -> DeviceSample {
        let k = self.known.get(&index).cloned().unwrap_or_default();
        let (uuid, name) = (k.uuid, k.name);
        if self.stalled.insert(index) {
            let xid = self.last_xid(index);
            tracing::warn!(
                index,
                uuid,
                call,
                "GPU {index} not answering: {call} has not returned for {} s{}; its readings \
                 are left out until it answers",
                waited.as_secs(),
                xid_note(xid)
            );
        }
        DeviceSample {
            index,
            uuid,
            name,
            status: DeviceStatus::Stalled {
                call: call.to_string(),
                secs: waited.as_secs(),
            },
            ..Default::default()
        }
    }

    /// NVML's status: `stalled` naming the first stalled device (and how many more), else
    /// ok.
    fn stalled_status(&self, devices: &[DeviceSample]) -> SourceStatus {
        let mut stalled = devices.iter().filter_map(|d| match &d.status {
            DeviceStatus::Stalled { call, secs } => Some((d, call, secs)),
            _ => None,
        });
        let Some((d, call, secs)) = stalled.next() else {
            return SourceStatus::Ok;
        };
        let more = match stalled.count() {
            0 => String::new(),
            n => format!(" (and {n} more GPUs)"),
        };
        let xid = self.last_xid(d.index);
        SourceStatus::Stalled(format!(
            "{call} on GPU {} ({}) for {secs} s{}{more}",
            d.index,
            d.uuid,
            xid_note(xid)
        ))
    }
}

/// Each exit's accounting request, by the GPU index its uuid was last seen at; the others
/// wait for their GPU. Nothing is built on the cycles with none waiting (most).
fn route(
    pending: &mut Vec<(String, u32)>,
    known: &HashMap<u32, Known>,
) -> HashMap<u32, Vec<(String, u32)>> {
    let mut out: HashMap<u32, Vec<(String, u32)>> = HashMap::new();
    if pending.is_empty() {
        return out;
    }
    let by_uuid: HashMap<&str, u32> = known.iter().map(|(i, k)| (k.uuid.as_str(), *i)).collect();
    pending.retain(|(uuid, pid)| match by_uuid.get(uuid.as_str()) {
        Some(i) => {
            out.entry(*i).or_default().push((uuid.clone(), *pid));
            false
        }
        None => true,
    });
    out
}

/// What the device's last XID (from NVML or the kernel log) says about a stall: Xid 79 is
/// a GPU fallen off the bus.
fn xid_note(xid: Option<u64>) -> String {
    match xid {
        Some(79) => "; Xid 79: the GPU has fallen off the bus".into(),
        Some(x) => format!("; last Xid {x}"),
        None => String::new(),
    }
}

impl Drop for NvmlSampler {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// Loads and initialises NVML from `lib_path` (`nvml.lib_path`, `--nvml-lib`), else the
/// system's libnvidia-ml.so.1: the one load path of the agent and its commands.
pub fn open(lib_path: Option<&Path>) -> Result<Nvml, NvmlError> {
    let mut builder = Nvml::builder();
    if let Some(p) = lib_path {
        builder.lib_path(p.as_os_str());
    }
    builder.init()
}

/// Why NVML could not be opened, in words (a missing library, no driver, no permission).
pub fn describe_init_error(e: &NvmlError, path: Option<&Path>) -> String {
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

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn a_stall_names_the_xid_the_kernel_log_shows_for_that_gpu() {
        let path = std::env::temp_dir().join(format!("kmsg-stall-{}", std::process::id()));
        std::fs::write(&path, "").unwrap();
        let mut s = NvmlSampler::new(None).with_kmsg(Some(path.clone()));
        for (index, bus) in [(3, 0x48), (4, 0x58)] {
            let k = Known {
                uuid: format!("GPU-{index}"),
                name: "NVIDIA H100 80GB HBM3".into(),
                pci_bus_id: Some(format!("00000000:{bus:02X}:00.0")),
            };
            s.known.insert(index, k);
        }
        s.xids.lock().unwrap().read_kmsg(Instant::now());
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        writeln!(f, "NVRM: Xid (PCI:0000:48:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.").unwrap();
        writeln!(
            f,
            "NVRM: Xid (PCI:0000:58:00): 43, pid=7, name=python3, Ch 00000008"
        )
        .unwrap();
        s.xids.lock().unwrap().read_kmsg(Instant::now());
        let call = "nvmlDeviceGetPowerUsage";
        let d3 = s.stalled_sample(3, call, Duration::from_secs(42));
        assert_eq!(
            s.stalled_status(&[d3]),
            SourceStatus::Stalled(
                "nvmlDeviceGetPowerUsage on GPU 3 (GPU-3) for 42 s; Xid 79: the GPU has \
                 fallen off the bus"
                    .into()
            )
        );
        let d4 = s.stalled_sample(4, call, Duration::from_secs(6));
        let status = s.stalled_status(&[d4]);
        assert!(
            status.to_string().ends_with("for 6 s; last Xid 43"),
            "{status:?}"
        );
        s.known.get_mut(&4).unwrap().pci_bus_id = Some("00000000:68:00.0".into());
        let d4 = s.stalled_sample(4, call, Duration::from_secs(6));
        let status = s.stalled_status(&[d4]);
        assert!(
            status.to_string().ends_with("for 6 s"),
            "another GPU's XID: {status:?}"
        );
        let _ = std::fs::remove_file(&path);
    }
}
