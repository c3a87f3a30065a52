//! Critical XID errors through NVML's event API: one event set, every GPU registered for
//! `nvmlEventTypeXidCriticalError`, drained without waiting each cycle. Counts per GPU and
//! code since the agent started, and the last code (dcgm-exporter's XID field). Where the
//! kernel log names the process (`NVRM: Xid (PCI:...): N, pid=...`), the event carries it,
//! so that the join can charge it to the process's container.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    mem,
    path::PathBuf,
    time::{Duration, Instant},
};

use gpu_model::{SourceStatus, XidCount, XidProcess};
use nvml_wrapper::{
    error::{nvml_try, NvmlError},
    Device, Nvml,
};
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t, nvmlEventTypeXidCriticalError,
};

use super::{
    kmsg::{self, Kmsg, XidLine},
    DeviceSample,
};

/// How long a kernel-log line waits for its NVML event, and an event for its line.
const MATCH_WINDOW: Duration = Duration::from_secs(10);
/// Events drained per cycle at most (a storm must not stall sampling).
const MAX_EVENTS: usize = 1024;

/// Registers `dev` in `set` (`Xids::set_for`) for critical XID events.
pub fn register_device(nvml: &Nvml, dev: &Device, set: nvmlEventSet_t) -> Result<(), NvmlError> {
    let register = nvml.lib().nvmlDeviceRegisterEvents.as_ref();
    let register = register.map_err(|_| NvmlError::FunctionNotFound)?;
    // SAFETY: a live device handle and event set from this library.
    nvml_try(unsafe { register(dev.handle(), u64::from(nvmlEventTypeXidCriticalError), set) })
}

/// An XID NVML delivered, waiting for the kernel log to name its process.
struct Pending {
    gpu: String,
    gpu_instance: Option<u32>,
    xid: u64,
    at: Instant,
}

pub struct Xids {
    set: Option<nvmlEventSet_t>,
    registered: HashSet<String>,
    /// The UUID of each device handle registered: an event's device is named from here,
    /// not asked (a call on a GPU that fell off the bus does not return).
    handles: HashMap<usize, String>,
    /// Per GPU UUID: count per code, and the last code and when it came.
    counts: HashMap<String, Counts>,
    /// Per PCI (domain, bus, device): the last XID the kernel log showed, and when.
    kmsg_last: HashMap<(u32, u32, u32), (u64, Instant)>,
    pending: Vec<Pending>,
    lines: Vec<(XidLine, Instant)>,
    kmsg_path: Option<PathBuf>,
    kmsg: Option<Kmsg>,
    pub events_status: SourceStatus,
    pub kmsg_status: SourceStatus,
}

/// One GPU's XIDs from NVML's events.
#[derive(Default)]
struct Counts {
    by_code: BTreeMap<u64, u64>,
    last: Option<(u64, Instant)>,
}

// SAFETY: the event set is a handle of NVML's, whose calls are thread-safe; the readers
// register their devices and the sampler drains it, one at a time behind a mutex.
unsafe impl Send for Xids {}

impl Xids {
    /// `kmsg`: where the kernel log is read; None: not read.
    pub fn new(kmsg: Option<PathBuf>) -> Xids {
        let kmsg_status = match &kmsg {
            None => SourceStatus::Disabled,
            Some(_) => SourceStatus::Starting,
        };
        Xids {
            set: None,
            registered: HashSet::new(),
            handles: HashMap::new(),
            counts: HashMap::new(),
            kmsg_last: HashMap::new(),
            pending: vec![],
            lines: vec![],
            kmsg_path: kmsg,
            kmsg: None,
            events_status: SourceStatus::Starting,
            kmsg_status,
        }
    }

    /// The event set to register device `uuid` in, made on first use; None if it is
    /// registered already or events are unavailable. The registration itself
    /// (`register_device`) runs without this lock: a call on a wedged GPU never returns.
    pub fn set_for(&mut self, nvml: &Nvml, uuid: &str) -> Option<nvmlEventSet_t> {
        if self.registered.contains(uuid) || self.events_status.reason().is_some() {
            return None;
        }
        let lib = nvml.lib();
        let (Ok(create), Ok(_)) = (
            lib.nvmlEventSetCreate.as_ref(),
            lib.nvmlDeviceRegisterEvents.as_ref(),
        ) else {
            self.events_status =
                SourceStatus::Unavailable("this NVML has no event API: no XID counts".into());
            return None;
        };
        if self.set.is_none() {
            let mut set: nvmlEventSet_t = std::ptr::null_mut();
            // SAFETY: a valid out-pointer; the set is freed in `release`.
            match nvml_try(unsafe { create(&mut set) }) {
                Ok(()) => self.set = Some(set),
                Err(e) => {
                    self.events_status =
                        SourceStatus::Unavailable(format!("nvmlEventSetCreate: {e}"));
                    return None;
                }
            }
        }
        self.set
    }

    /// What `register_device` gave for `uuid`, whose handle is `dev`.
    pub fn registered(&mut self, uuid: &str, dev: nvmlDevice_t, r: Result<(), NvmlError>) {
        match r {
            Ok(()) => {
                self.registered.insert(uuid.to_string());
                self.handles.insert(dev as usize, uuid.to_string());
                self.counts.entry(uuid.to_string()).or_default();
                self.events_status = SourceStatus::Ok;
            }
            // This GPU cannot deliver XIDs; the others may.
            Err(e) => tracing::info!(uuid, "no XID events from this GPU: {e}"),
        }
    }

    /// Drains the delivered events and the kernel log, and puts on each device its counts,
    /// its last code and the events whose process the log named this cycle. Returns the
    /// uuids of the GPUs that had an event delivered.
    pub fn collect(&mut self, nvml: &Nvml, devices: &mut [DeviceSample]) -> Vec<String> {
        let now = Instant::now();
        self.read_kmsg(now);
        let mut delivered = vec![];
        for (handle_uuid, gi, xid) in self.drain(nvml) {
            if !delivered.contains(&handle_uuid) {
                delivered.push(handle_uuid.clone());
            }
            let e = self.counts.entry(handle_uuid.clone()).or_default();
            *e.by_code.entry(xid).or_default() += 1;
            e.last = Some((xid, now));
            self.pending.push(Pending {
                gpu: handle_uuid,
                gpu_instance: gi,
                xid,
                at: now,
            });
        }
        self.match_pending(devices, now);
        for d in devices.iter_mut() {
            let Some(c) = self.counts.get(&d.uuid) else {
                continue;
            };
            let list = (c.by_code.iter()).map(|(&xid, &count)| XidCount { xid, count });
            d.fields.xid_errors = Some(list.collect());
            d.fields.last_xid = Some(c.last.map_or(0, |l| l.0));
        }
        delivered
    }

    /// Reads the kernel log's new XID lines (opening it first, when it is not yet open).
    pub(super) fn read_kmsg(&mut self, now: Instant) {
        if self.kmsg.is_none() {
            if let Some(path) = &self.kmsg_path {
                match Kmsg::open(path) {
                    Ok(k) => {
                        self.kmsg = Some(k);
                        self.kmsg_status = SourceStatus::Ok;
                    }
                    Err(reason) => {
                        if self.kmsg_status.reason() != Some(reason.as_str()) {
                            tracing::warn!(%reason, "XIDs are counted per GPU, not charged to containers");
                        }
                        self.kmsg_status = SourceStatus::Unavailable(reason);
                        // Not retried: a missing privilege does not come back by itself.
                        self.kmsg_path = None;
                    }
                }
            }
        }
        if let Some(k) = &mut self.kmsg {
            for l in k.read_xids() {
                self.kmsg_last.insert(l.pci, (l.xid, now));
                self.lines.push((l, now));
            }
        }
        self.lines
            .retain(|(_, t)| now.duration_since(*t) < MATCH_WINDOW);
    }

    /// Delivered events: (GPU UUID, GPU instance, XID code).
    fn drain(&mut self, nvml: &Nvml) -> Vec<(String, Option<u32>, u64)> {
        let (Some(set), Ok(wait)) = (self.set, nvml.lib().nvmlEventSetWait_v2.as_ref()) else {
            return vec![];
        };
        let mut out = vec![];
        for _ in 0..MAX_EVENTS {
            // SAFETY: a plain C struct; all-zero is a valid value.
            let mut data: nvmlEventData_t = unsafe { mem::zeroed() };
            // SAFETY: a live event set; a valid out-pointer; timeout 0 never blocks.
            if nvml_try(unsafe { wait(set, &mut data, 0) }).is_err() {
                break; // NVML_ERROR_TIMEOUT: nothing (more) delivered
            }
            if data.eventType & u64::from(nvmlEventTypeXidCriticalError) == 0 {
                continue;
            }
            // Only registered handles deliver events.
            let Some(uuid) = self.handles.get(&(data.device as usize)) else {
                continue;
            };
            let gi = (data.gpuInstanceId != u32::MAX).then_some(data.gpuInstanceId);
            out.push((uuid.clone(), gi, data.eventData));
        }
        out
    }

    /// Pairs NVML's events with the kernel log's lines (same GPU and code); a paired event
    /// that names a process goes on its device for the join.
    fn match_pending(&mut self, devices: &mut [DeviceSample], now: Instant) {
        let pending = mem::take(&mut self.pending);
        for p in pending {
            let Some(d) = devices.iter_mut().find(|d| d.uuid == p.gpu) else {
                continue;
            };
            let pci = d.pci_bus_id.as_deref().and_then(kmsg::parse_pci);
            let line = self
                .lines
                .iter()
                .position(|(l, _)| Some(l.pci) == pci && l.xid == p.xid)
                .map(|i| self.lines.remove(i).0);
            match line {
                Some(l) => {
                    let Some(pid) = l.pid else { continue };
                    let mig = p.gpu_instance.and_then(|gi| {
                        d.mig_devices
                            .iter()
                            .find(|m| m.gpu_instance_id == gi)
                            .map(|m| m.uuid.to_string())
                    });
                    d.fields.xid_processes.push(XidProcess {
                        xid: p.xid,
                        pid,
                        comm: l.comm,
                        mig_uuid: mig,
                    });
                }
                None if now.duration_since(p.at) < MATCH_WINDOW && self.kmsg.is_some() => {
                    self.pending.push(p);
                }
                None => {}
            }
        }
    }

    /// The last critical XID since the agent started of the GPU `uuid` at `pci_bus_id`,
    /// from NVML's events or the kernel log, whichever came later; None if neither has one.
    pub fn last_xid(&self, uuid: &str, pci_bus_id: Option<&str>) -> Option<u64> {
        let event = self.counts.get(uuid).and_then(|c| c.last);
        let pci = pci_bus_id.and_then(kmsg::parse_pci);
        let line = pci.and_then(|p| self.kmsg_last.get(&p).copied());
        let (xid, _) = [event, line]
            .into_iter()
            .flatten()
            .max_by_key(|(_, at)| *at)?;
        Some(xid)
    }

    /// Frees the event set: NVML is about to shut down or restart.
    pub fn release(&mut self, nvml: &Nvml) {
        if let (Some(set), Ok(free)) = (self.set.take(), nvml.lib().nvmlEventSetFree.as_ref()) {
            // SAFETY: created by this library, freed once (taken above).
            unsafe { free(set) };
        }
        self.registered.clear();
        self.handles.clear();
        if self.events_status.is_ok() {
            self.events_status = SourceStatus::Starting;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_xid_is_the_newer_of_nvmls_event_and_the_kernel_logs_line() {
        let mut x = Xids::new(None);
        let t = Instant::now();
        let pci = Some("00000000:48:00.0");
        assert_eq!(x.last_xid("GPU-3", pci), None);
        x.counts.insert("GPU-3".into(), Counts::default());
        assert_eq!(x.last_xid("GPU-3", pci), None, "registered, no XID yet");
        x.counts.get_mut("GPU-3").unwrap().last = Some((43, t));
        assert_eq!(x.last_xid("GPU-3", pci), Some(43));
        // The kernel log, matched by PCI bus, as the driver writes it.
        x.kmsg_last
            .insert((0, 0x48, 0), (79, t + Duration::from_millis(1)));
        assert_eq!(x.last_xid("GPU-3", pci), Some(79));
        assert_eq!(
            x.last_xid("GPU-3", None),
            Some(43),
            "no bus id: NVML's alone"
        );
        assert_eq!(x.last_xid("GPU-4", Some("00000000:58:00.0")), None);
        x.counts.get_mut("GPU-3").unwrap().last = Some((13, t + Duration::from_millis(2)));
        assert_eq!(x.last_xid("GPU-3", pci), Some(13));
    }
}
