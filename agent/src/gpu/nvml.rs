//! The NVML binding: nvml-wrapper, loaded from the system or a given path. Failures degrade:
//! no library or driver -> unavailable with a reason and retried with backoff; a lost GPU or
//! an unsupported call -> that device or metric is marked and skipped, the others go on.
use std::{
    collections::HashMap,
    path::PathBuf,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use nvml_wrapper::{error::NvmlError, Nvml};

use gpu_model::{DeviceStatus, NvmlFeatures, SourceStatus};

use super::{
    device::{sample_device, DeviceCtx, Extras, Fixed, Held, Slow},
    fields::NvlinkRates,
    gpm::Gpm,
    processes::{read_accounting, Accounting, Lists, ACCOUNTING_TRIES},
    xid::Xids,
    DeviceSample, GpuSample,
};

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
        self.lists.forget();
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
        self.fixed.end_cycle(&devices);
        Some(GpuSample {
            taken_at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            driver_version,
            devices,
        })
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
