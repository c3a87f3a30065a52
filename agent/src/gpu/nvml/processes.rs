//! One device's processes: the compute, graphics and MPS lists merged by PID, their
//! utilization since the last sample, the lists held between reads while nothing moved, and
//! NVML's accounting stats of processes that exited.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use nvml_wrapper::{
    enums::device::UsedGpuMemory,
    error::{nvml_try, NvmlError},
    struct_wrappers::device::ProcessInfo,
    Device,
};
use nvml_wrapper_sys::bindings::nvmlProcessUtilizationSample_t as RawSample;

use gpu_model::{AccountingSample, Name};

use super::{reader::Reader, DeviceSample, MigSample, ProcessSample};

/// How often a requested accounting read is retried while NVML still says the process runs
/// (the driver may lag the kernel's exit by a cycle).
const ACCOUNTING_TRIES: u8 = 5;

/// A GPU listing at least this many processes is crowded: its lists are held while its
/// memory moves by less than `LISTS_MEMORY_MOVED`, for `nvml.crowded_list_interval_ms`. On
/// a real driver the compute list costs about 49 µs per process (docs/validation: 3.3 ms
/// for 64 on an H200), so 32 cost about what the per-process utilization call does, and
/// 250 (a GPU of the benchmark's large node) would cost 12 ms a cycle.
const CROWDED_GPU_PROCESSES: usize = 32;

/// The device's memory in use moving by more than this since the lists were read means a
/// process came, went or grew: they are read again at once. A CUDA context alone is about
/// 500 MiB.
const LISTS_MEMORY_MOVED: u64 = 64 << 20;

/// A GPU listing fewer processes has its lists held only while nothing at all moved: its
/// memory in use to the byte, the PIDs in its utilization samples, its MIG devices; and at
/// most this long.
const LISTS_MAX_AGE: Duration = Duration::from_secs(10);

/// Per GPU uuid, its process lists as last read, while they are held.
#[derive(Debug, Default)]
pub(super) struct Lists {
    /// A crowded GPU's most time between reads (zero: every GPU's lists read every cycle).
    pub(super) interval: Duration,
    held: HashMap<String, HeldLists>,
}

impl Lists {
    /// Holds a crowded GPU's lists up to `interval` between reads, another's up to
    /// `LISTS_MAX_AGE`; none with a zero `interval`.
    pub(super) fn new(interval: Duration) -> Lists {
        Lists {
            interval,
            held: HashMap::new(),
        }
    }
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
    /// The PIDs in the last utilization samples, sorted; a GPU with fewer than
    /// `CROWDED_GPU_PROCESSES` has its lists held only while these stay the same.
    util_pids: Vec<u32>,
}

impl HeldLists {
    fn crowded(&self) -> bool {
        self.procs.len() >= CROWDED_GPU_PROCESSES
    }

    /// Whether the held lists still stand for the device as read this cycle: a crowded
    /// GPU's while its memory in use stays within `LISTS_MEMORY_MOVED`, for `interval`;
    /// another's while it does not move at all, for `LISTS_MAX_AGE`.
    fn stand(&self, d: &DeviceSample, now: Instant, interval: Duration) -> bool {
        let (tolerance, max_age) = match self.crowded() {
            true => (LISTS_MEMORY_MOVED, interval),
            false => (0, LISTS_MAX_AGE),
        };
        let moved = match (self.memory_used, d.memory_used_bytes) {
            (Some(a), Some(b)) => a.abs_diff(b) > tolerance,
            _ => true,
        };
        let same_migs = self.migs.len() == d.mig_devices.len()
            && self
                .migs
                .iter()
                .zip(&d.mig_devices)
                .all(|(a, m)| gpu_model::same(a, &m.uuid));
        !moved && same_migs && now.saturating_duration_since(self.at) < max_age
    }

    /// Whether this cycle's utilization samples name a process the lists may have missed:
    /// a PID they lack; on a GPU that is not crowded, any change of the PIDs sampled.
    fn missed(&self, util: &Utilization) -> bool {
        let lacks = |pid: &u32| self.procs.binary_search_by_key(pid, |p| p.pid).is_err();
        util.keys().any(lacks) || (!self.crowded() && sorted_pids(util) != self.util_pids)
    }
}

fn sorted_pids(util: &Utilization) -> Vec<u32> {
    let mut v: Vec<u32> = util.keys().copied().collect();
    v.sort_unstable();
    v
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

impl Accounting {
    pub(super) fn new(enabled: bool) -> Accounting {
        Accounting {
            enabled,
            ..Accounting::default()
        }
    }

    /// Asks for the accounting stats of these (device uuid, pid): processes the kernel
    /// reported exited. Read on the next cycle.
    pub(super) fn request(&mut self, requests: Vec<(String, u32)>) {
        for (uuid, pid) in requests {
            if !self.pending.iter().any(|(u, p, _)| *u == uuid && *p == pid) {
                self.pending.push((uuid, pid, ACCOUNTING_TRIES));
            }
        }
        // Bounded: a flood of exits must not grow this without end.
        if self.pending.len() > 4096 {
            self.pending.drain(..self.pending.len() - 4096);
        }
    }
}

/// The device's processes by PID, with this cycle's utilization. The lists are held
/// (`Lists`) while the device's memory in use stays put and its utilization samples name
/// no PID the lists lack (on a GPU that is not crowded: the same PIDs as the cycle before).
/// On the GPU's `slow` cycle a GPU that is not crowded has them read afresh: each GPU at its
/// own point of the slow interval, where their age alone would have every GPU read read
/// them on one cycle, all having been read on the first.
pub(super) fn sample_processes(
    r: &mut Reader,
    dev: &Device,
    d: &DeviceSample,
    (last_seen, lists): (&mut HashMap<String, u64>, &mut Lists),
    slow: bool,
) -> Vec<ProcessSample> {
    let now = Instant::now();
    let interval = lists.interval;
    let held =
        (lists.held.get(&d.uuid)).filter(|h| h.stand(d, now, interval) && (h.crowded() || !slow));
    let mut unsupported = vec![];
    let mut util_pids = None;
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
        let util = read_process_utilization(r, dev, &d.uuid, procs.len(), last_seen);
        // Without utilization samples only a crowded GPU's lists are held.
        let missed = |h: &HeldLists| util.as_ref().map_or(!h.crowded(), |u| h.missed(u));
        if held.is_some_and(missed) {
            procs = read(r);
            from_held = false;
        }
        if let Some(u) = &util {
            apply_utilization(u, &mut procs);
            util_pids = Some(sorted_pids(u));
        }
    }
    let crowded = procs.len() >= CROWDED_GPU_PROCESSES;
    if r.lost || interval.is_zero() || procs.is_empty() || !(crowded || util_pids.is_some()) {
        lists.held.remove(&d.uuid);
    } else if from_held {
        if let Some(h) = lists.held.get_mut(&d.uuid) {
            h.util_pids = util_pids.unwrap_or_default();
        }
    } else {
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
            util_pids: util_pids.unwrap_or_default(),
        };
        // One GPU's state: the lists of another uuid at this index are of a GPU gone.
        lists.held.retain(|uuid, _| *uuid == d.uuid);
        let was_crowded = (lists.held.insert(d.uuid.clone(), held)).is_some_and(|h| h.crowded());
        // Logged as it becomes crowded.
        if crowded && !was_crowded {
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
        r.read(&"processes", || dev.running_compute_processes()),
        r.read(&"graphics_processes", || dev.running_graphics_processes()),
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

/// Utilization since our last look (`last_seen`, per device uuid) of a device listing
/// `listed` processes. NotFound means "no samples": every process idle. Unsupported (None):
/// the processes' utilization stays unknown.
fn read_process_utilization(
    r: &mut Reader,
    dev: &Device,
    uuid: &str,
    listed: usize,
    last_seen: &mut HashMap<String, u64>,
) -> Option<Utilization> {
    let mut util: Utilization = HashMap::new();
    let since = last_seen.get(uuid).copied().unwrap_or(0);
    match utilization_samples(dev, since, listed + 8) {
        Ok(samples) => {
            for s in samples {
                let e = util.entry(s.pid).or_insert((0, [0; 4]));
                if s.timeStamp >= e.0 {
                    *e = (s.timeStamp, [s.smUtil, s.memUtil, s.encUtil, s.decUtil]);
                }
                let seen = last_seen.entry(uuid.to_string()).or_insert(0);
                *seen = (*seen).max(s.timeStamp);
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

/// The per-process utilization samples since `since`, in one call where they fit `room`:
/// nvml.h lets the caller size the buffer, so the size query (a NULL buffer) is made only
/// when they did not fit. A real driver takes 1.6-1.9 ms for the two calls together, and
/// returns one sample per process that ran (5 for 8 processes, 21 for 64 on an H200).
fn utilization_samples(dev: &Device, since: u64, room: usize) -> Result<Vec<RawSample>, NvmlError> {
    let f = (dev.nvml().lib().nvmlDeviceGetProcessUtilization.as_ref())
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    // SAFETY: a plain C struct; all-zero is a valid value.
    let zero: RawSample = unsafe { std::mem::zeroed() };
    let mut buf = vec![zero; room];
    // Samples can appear between a too-small call and the next: a few tries.
    for _ in 0..3 {
        let mut count = buf.len() as u32;
        // SAFETY: a live handle from this library; `buf` holds `count` samples.
        match nvml_try(unsafe { f(dev.handle(), buf.as_mut_ptr(), &mut count, since) }) {
            Ok(()) => {
                buf.truncate(count as usize);
                return Ok(buf);
            }
            Err(NvmlError::InsufficientSize(_)) if count as usize > buf.len() => {
                buf.resize(count as usize + 8, zero)
            }
            Err(e) => return Err(e),
        }
    }
    Err(NvmlError::InsufficientSize(None))
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

// ---------------------------------------------------------------------------------------
// Sharing and accounting (MPS clients, per-process accounting at exit)

/// MPS clients, merged into the per-process list: a PID the compute list already has is
/// the same process (marked `mps`), attributed by host PID like any other.
fn read_mps_processes(r: &mut Reader, dev: &Device, migs: &[MigSample], merged: &mut Merged) {
    let Some(list) = r.read(&"mps_processes", || dev.mps_running_compute_processes()) else {
        return;
    };
    for p in &list {
        merged.merge(p, migs).mps = true;
    }
}

/// Accounting mode (`held`: as last read, a slow reading); the PIDs new in NVML's
/// accounting list; and the stats of the processes the join saw exit. A process still
/// running per NVML is asked about again next cycle, a few times; one NVML no longer knows
/// is dropped.
pub(super) fn read_accounting(
    dev: &Device,
    d: &mut DeviceSample,
    acc: &mut Accounting,
    held: Option<Option<bool>>,
) {
    let read = match held {
        Some(mode) => Ok(mode),
        None => dev.is_accounting_enabled().map(Some),
    };
    let mode = match read {
        Ok(m) => m,
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
    if let Ok(mut pids) = dev.accounting_pids() {
        pids.sort_unstable();
        d.sharing.accounting_pids = new_accounting_pids(acc.listed.get(&d.uuid), &pids);
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

/// The PIDs of NVML's accounting list (`now`, sorted) that the last list (`before`,
/// sorted) lacked. The first list of a run is where counting starts, so none of it is new:
/// its processes either run (and are watched as listed processes) or ended before this run
/// started, charged by the run before or by nobody. Taken as new, an old PID that a live
/// process has taken since would be charged again, at that process's exit, with the old
/// one's stats: written twice across a restart.
fn new_accounting_pids(before: Option<&Vec<u32>>, now: &[u32]) -> Vec<u32> {
    match before {
        None => vec![],
        Some(b) => now
            .iter()
            .copied()
            .filter(|p| b.binary_search(p).is_err())
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_accounting_list_of_a_run_has_no_new_pid() {
        assert_eq!(new_accounting_pids(None, &[3, 7, 9]), Vec::<u32>::new());
        assert_eq!(
            new_accounting_pids(Some(&vec![3, 7, 9]), &[3, 5, 9, 11]),
            [5, 11]
        );
        assert_eq!(new_accounting_pids(Some(&vec![]), &[4]), [4]);
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
        let procs = |n: u32| {
            (1..=n).map(|pid| ProcessSample {
                pid,
                ..Default::default()
            })
        };
        let mut held = HeldLists {
            procs: procs(CROWDED_GPU_PROCESSES as u32).collect(),
            unsupported: vec![],
            memory_used: Some(10 << 30),
            migs: vec!["MIG-a".into(), "MIG-b".into()],
            at: t0,
            util_pids: vec![],
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

        // Fewer processes: held only while the memory holds to the byte, for 10 s at most.
        held.procs = procs(5).collect();
        let same = device(Some(10 << 30), &["MIG-a", "MIG-b"]);
        let one_byte = device(Some((10 << 30) + 1), &["MIG-a", "MIG-b"]);
        let minute = Duration::from_secs(60);
        assert!(held.stand(&same, at(9_999), minute));
        assert!(
            !held.stand(&same, at(10_000), minute),
            "LISTS_MAX_AGE is up"
        );
        assert!(
            held.stand(&same, at(9_999), five_s),
            "whatever the crowded interval"
        );
        assert!(
            !held.stand(&one_byte, at(1), minute),
            "the memory moved a byte"
        );
    }

    #[test]
    fn held_lists_miss_a_new_pid_and_when_not_crowded_any_change_of_the_pids_sampled() {
        let util =
            |pids: &[u32]| -> Utilization { pids.iter().map(|p| (*p, (1, [0; 4]))).collect() };
        let mut held = HeldLists {
            procs: (1..=5)
                .map(|pid| ProcessSample {
                    pid,
                    ..Default::default()
                })
                .collect(),
            unsupported: vec![],
            memory_used: Some(1 << 30),
            migs: vec![],
            at: Instant::now(),
            util_pids: vec![2, 3],
        };
        assert!(!held.missed(&util(&[3, 2])), "the same PIDs sampled");
        assert!(held.missed(&util(&[2, 3, 9])), "a PID the lists lack");
        assert!(
            held.missed(&util(&[2])),
            "a PID no longer sampled: it may have ended"
        );
        assert!(held.missed(&util(&[2, 3, 4])), "a listed PID sampled again");
        held.procs = (1..=CROWDED_GPU_PROCESSES as u32)
            .map(|pid| ProcessSample {
                pid,
                ..Default::default()
            })
            .collect();
        assert!(
            !held.missed(&util(&[2])),
            "crowded: only a PID the lists lack"
        );
        assert!(held.missed(&util(&[2, 900])));
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
}
