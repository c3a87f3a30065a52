//! Kernel events: loads the programs, attaches them to the lifecycle tracepoints and
//! exposes the kernel's process entries (the truth: `SLOTS`, and `PROCS` beside it), the
//! decoded notifications of the ring buffer (`events`), when they are ready to read, and
//! the in-kernel drop counters.
mod batch;
mod btf;
pub mod caps;
pub mod events;
pub mod tracefs;

use std::{
    os::fd::{AsFd, AsRawFd, OwnedFd, RawFd},
    time::Duration,
};

use agent_common::{
    Config as KernelConfig, IterConfig, ProcInfo, Slot, ABSENT, CONFIG_GLOBAL, COUNTERS_MAP,
    COUNTER_MAP_FULL, COUNTER_READ_ERRORS, COUNTER_RINGBUF_LOST, EVENTS_MAP, ITER_CONFIG_GLOBAL,
    PROCS_MAP, SLOTS_MAP, TASK_ITER_PROGRAM,
};
use aya::{
    maps::{Array, HashMap, IterableMap, MapData, MapError, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, Iter, ProgramError, TracePoint},
    Btf, Ebpf, EbpfLoader, Endianness,
};
use serde::Serialize;
use tokio::io::unix::AsyncFd;

use self::events::KernelEvent;
use crate::config::EbpfConfig;

/// The object built by `cargo xtask build-ebpf`, or empty when the agent was built without it.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/agent-ebpf.o"));

/// (program, tracepoint category, tracepoint name)
pub const PROGRAMS: [(&str, &str, &str); 6] = [
    ("proc_exec", "sched", "sched_process_exec"),
    ("proc_fork", "task", "task_newtask"),
    ("proc_exit", "sched", "sched_process_exit"),
    ("cg_attach", "cgroup", "cgroup_attach_task"),
    ("cg_mkdir", "cgroup", "cgroup_mkdir"),
    ("cg_rmdir", "cgroup", "cgroup_rmdir"),
];

/// The process programs that attach to BTF tracepoints (`tp_btf`), in the order of
/// `PROGRAMS`' first three: (program, tracepoint). They read the task itself with plain
/// loads where the classic programs call helpers and read the tracepoint's record.
pub const BTF_PROGRAMS: [(&str, &str); 3] = [
    ("proc_exec_btf", "sched_process_exec"),
    ("proc_fork_btf", "task_newtask"),
    ("proc_exit_btf", "sched_process_exit"),
];

/// Which programs follow the processes: the BTF tracepoints', or the classic ones (why
/// not the BTF ones is logged when they attach).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessPrograms {
    Btf,
    Classic,
}

impl ProcessPrograms {
    pub fn as_str(&self) -> &'static str {
        match self {
            ProcessPrograms::Btf => "tp_btf",
            ProcessPrograms::Classic => "tracepoint",
        }
    }
}

pub struct EbpfSource {
    ebpf: Ebpf,
    /// Which process programs are attached.
    pub process_programs: ProcessPrograms,
    procs: HashMap<MapData, u32, ProcInfo>,
    /// The entries of processes that hold their slot (`agent_common::Slot`); userspace
    /// reads them, updates and frees them, but never claims one (the programs do).
    slots: Array<MapData, Slot>,
    slots_mask: u32,
    ring: RingBuf<MapData>,
    counters: PerCpuArray<MapData, u64>,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    _stats: Option<OwnedFd>,
    capacity: u32,
    /// Why the start-up task iterator cannot run here (None: it is loaded).
    task_iter: Option<String>,
    pub load_time: Duration,
}

#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct KernelCounters {
    pub ringbuf_lost: u64,
    pub map_full: u64,
    pub read_errors: u64,
}

pub use gpu_model::ProgramStats;

impl EbpfSource {
    /// Loads and attaches everything; any failure is a reason to run in /proc mode. `v1`:
    /// the tracked cgroup v1 hierarchy's id and controllers ("memory", "cpu,cpuacct").
    pub fn load(cfg: &EbpfConfig, v1: Option<(u32, &str)>) -> Result<EbpfSource, String> {
        let started = std::time::Instant::now();
        if OBJECT.is_empty() {
            return Err("this build has no eBPF object (build with `cargo xtask build`)".into());
        }
        let missing = caps::missing_for_ebpf();
        if !missing.is_empty() {
            return Err(format!(
                "missing capability {} (run as root, or grant CAP_BPF and CAP_PERFMON)",
                missing.join(" and ")
            ));
        }
        // The classic tracepoint programs need no BTF; the BTF programs and the start-up
        // task iterator do (their attach points and offsets): without it the classic ones
        // follow the processes and the walk reads /proc. Read once: aya parses it for the
        // loader and the attach points, our reader for the offsets.
        let vmlinux = std::fs::read(btf::VMLINUX).map_err(|e| format!("no kernel BTF: {e}"));
        let btf = match &vmlinux {
            Ok(data) => Btf::parse(data, Endianness::default()).map_err(|e| format!("{e}")),
            Err(e) => Err(e.clone()),
        };
        // This kernel's offsets (for the BTF programs and the iterator), and whether the
        // iterator can use them.
        let offsets = btf
            .as_ref()
            .map_err(Clone::clone)
            .and(vmlinux)
            .and_then(|data| btf_offsets(&btf::Btf::parse(data)?, v1));
        // Why the task iterator cannot run here (Ok: it can).
        let iterator: Result<(), String> = match (cfg.task_iterator, &offsets) {
            (false, _) => Err("disabled by configuration (ebpf.task_iterator = false)".into()),
            (true, Err(e)) => Err(e.clone()),
            (true, Ok((_, Some(why)))) => Err(why.clone()),
            (true, Ok((_, None))) => Ok(()),
        };
        let iter_config = iter_config(&offsets, iterator.is_ok());
        let tracefs = tracefs::find().ok_or(
            "tracefs is not mounted and could not be mounted (needs CAP_SYS_ADMIN)".to_string(),
        )?;
        let mut kcfg: KernelConfig = tracefs::offsets(&tracefs)?;
        kcfg.v1_hierarchy = v1.map_or(ABSENT, |(id, _)| id);
        kcfg.wakeup_bytes = cfg.wakeup_bytes;
        kcfg.slots_mask = cfg.slots() - 1;
        let stats = if cfg.program_stats {
            Some(
                aya::sys::enable_stats(aya::sys::Stats::RunTime)
                    .map_err(|e| format!("enabling program statistics: {e}"))?,
            )
        } else {
            None
        };

        let mut ebpf = EbpfLoader::new()
            .btf(btf.as_ref().ok())
            .override_global(CONFIG_GLOBAL, &kcfg, true)
            .override_global(ITER_CONFIG_GLOBAL, &iter_config, true)
            .map_max_entries(PROCS_MAP, cfg.capacity())
            .map_max_entries(SLOTS_MAP, cfg.slots())
            .map_max_entries(EVENTS_MAP, cfg.ring_buffer_bytes)
            .load(OBJECT)
            .map_err(|e| format!("loading the eBPF object: {e:#}"))?;
        // aya-log: the programs log on error paths only.
        let logger = aya_log::EbpfLogger::init(&mut ebpf)
            .map_err(|e| tracing::debug!("aya-log not initialised: {e}"))
            .ok();
        let btf_wanted = match (&offsets, cfg.btf_tracepoints) {
            (_, false) => Err("disabled by configuration (ebpf.btf_tracepoints = false)".into()),
            (Err(e), true) => Err(e.clone()),
            (Ok(_), true) => Ok(btf.as_ref().unwrap()),
        };
        let process_programs = attach_programs(&mut ebpf, btf_wanted)?;
        // After the tracepoints: a process that starts meanwhile is theirs.
        let task_iter = iterator
            .and_then(|_| load_task_iter(&mut ebpf, btf.as_ref().unwrap()))
            .err();
        let procs = HashMap::try_from(take(&mut ebpf, PROCS_MAP)?).map_err(|e| e.to_string())?;
        let slots = Array::try_from(take(&mut ebpf, SLOTS_MAP)?).map_err(|e| e.to_string())?;
        let ring = RingBuf::try_from(take(&mut ebpf, EVENTS_MAP)?).map_err(|e| e.to_string())?;
        let counters =
            PerCpuArray::try_from(take(&mut ebpf, COUNTERS_MAP)?).map_err(|e| e.to_string())?;
        Ok(EbpfSource {
            ebpf,
            process_programs,
            procs,
            slots,
            slots_mask: kcfg.slots_mask,
            ring,
            counters,
            logger,
            _stats: stats,
            capacity: cfg.capacity(),
            task_iter,
            load_time: started.elapsed(),
        })
    }

    /// Why the start-up task iterator cannot run on this kernel, if it cannot.
    pub fn task_iter_unavailable(&self) -> Option<&str> {
        self.task_iter.as_deref()
    }

    /// Runs the task iterator once: every process the kernel map has no entry for gets one
    /// (see `proc_iter`). Returns the tgids it visited.
    pub fn iterate_tasks(&mut self) -> Result<Vec<u32>, String> {
        use std::io::Read;
        if let Some(why) = &self.task_iter {
            return Err(why.clone());
        }
        let prog: &mut Iter = self
            .ebpf
            .program_mut(TASK_ITER_PROGRAM)
            .ok_or("no task iterator program")?
            .try_into()
            .map_err(|e| format!("{e}"))?;
        let link = prog.attach().map_err(|e| format!("attaching: {e}"))?;
        let link = prog.take_link(link).map_err(|e| format!("{e}"))?;
        let mut file = link.into_file().map_err(|e| format!("{e}"))?;
        let mut bytes = Vec::with_capacity(256 << 10);
        let mut chunk = vec![0u8; 1 << 20];
        // EAGAIN: a million tasks went by without output in one read; go on, a few times.
        let mut again = 0;
        loop {
            match file.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => bytes.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && again < 16 => again += 1,
                Err(e) => return Err(format!("reading the iterator: {e}")),
            }
        }
        Ok(bytes
            .chunks_exact(4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    /// How many processes the kernel map holds at most.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Appends the queued notifications to `out`, decoded. Returns how many records were
    /// read (records this build cannot decode are counted and skipped).
    pub fn read_events(&mut self, out: &mut Vec<KernelEvent>) -> usize {
        let mut n = 0;
        while let Some(record) = self.ring.next() {
            n += 1;
            match events::decode(&record) {
                Some(ev) => out.push(ev),
                None => tracing::debug!(len = record.len(), "unknown notification"),
            }
        }
        n
    }

    /// Wakes when the kernel signals queued notifications (see `ebpf.wakeup_bytes`).
    pub fn readiness(&self) -> std::io::Result<RingReady> {
        let fd: OwnedFd = self.ring.as_fd().try_clone_to_owned()?;
        // SAFETY: `fd` is our own duplicate, open until the AsyncFd drops it.
        let afd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) };
        Ok(RingReady(afd.map_err(|e| e.into_parts().1)?))
    }

    /// Whether kernel per-program statistics were enabled (ebpf.program_stats).
    pub fn stats_enabled(&self) -> bool {
        self._stats.is_some()
    }

    pub fn counters(&self) -> KernelCounters {
        let sum = |i: u32| -> u64 {
            self.counters
                .get(&i, 0)
                .map(|v| v.iter().sum())
                .unwrap_or(0)
        };
        KernelCounters {
            ringbuf_lost: sum(COUNTER_RINGBUF_LOST),
            map_full: sum(COUNTER_MAP_FULL),
            read_errors: sum(COUNTER_READ_ERRORS),
        }
    }

    /// Every process entry, the slots' and the hash map's: the state a resync restores. In
    /// batches (Linux 5.6), else one entry at a time. A tgid in both (a hash entry that
    /// userspace wrote and a fork's slot outlived) is its slot's.
    pub fn snapshot(&self) -> Vec<(u32, ProcInfo)> {
        let held = |s: Slot| (s.tgid != 0).then_some((s.tgid, s.info));
        let mut all = match batch::lookup_kept(fd(self.slots.map()), |_, s| held(s)) {
            Ok(v) => v,
            Err(_) => (0..=self.slots_mask)
                .filter_map(|i| self.slots.get(&i, 0).ok().and_then(held))
                .collect(),
        };
        let in_slots = all.len();
        match batch::lookup_all::<ProcInfo>(fd(self.procs.map())) {
            Ok(v) => all.extend(v),
            Err(_) => all.extend(self.procs.iter().filter_map(Result::ok)),
        }
        if all.len() > in_slots {
            // Stable: of two entries of a tgid, the slot's (first) stays.
            all.sort_by_key(|(tgid, _)| *tgid);
            all.dedup_by_key(|(tgid, _)| *tgid);
        }
        all
    }

    /// The slot `tgid` holds, with its index.
    fn held_slot(&self, tgid: u32) -> Option<(u32, Slot)> {
        let i = tgid & self.slots_mask;
        self.slots
            .get(&i, 0)
            .ok()
            .filter(|s| s.tgid == tgid)
            .map(|s| (i, s))
    }

    /// Inserts each entry whose process the kernel has no (fresher) entry for. Returns how
    /// many the map had no room for.
    pub fn insert_all_absent(&mut self, entries: &[(u32, ProcInfo)]) -> u64 {
        let mut failed = 0;
        for (tgid, info) in entries {
            if self.insert_if_absent(*tgid, *info).is_err() {
                failed += 1;
            }
        }
        failed
    }

    pub fn get(&self, tgid: u32) -> Option<ProcInfo> {
        match self.held_slot(tgid) {
            Some((_, s)) => Some(s.info),
            None => self.procs.get(&tgid, 0).ok(),
        }
    }

    /// Insert unless the kernel already has a (fresher) entry. Returns false if one exists.
    /// Into the hash map: a slot is the programs' to claim.
    pub fn insert_if_absent(&mut self, tgid: u32, info: ProcInfo) -> Result<bool, MapError> {
        const BPF_NOEXIST: u64 = 1;
        if self.held_slot(tgid).is_some() {
            return Ok(false);
        }
        match self.procs.insert(tgid, info, BPF_NOEXIST) {
            Ok(()) => Ok(true),
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::EEXIST) => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Overwrite an existing entry (userspace filling in what the kernel could not know).
    pub fn update_existing(&mut self, tgid: u32, info: ProcInfo) -> Result<(), MapError> {
        const BPF_EXIST: u64 = 2;
        if let Some((i, s)) = self.held_slot(tgid) {
            return self.slots.set(i, Slot { info, ..s }, 0);
        }
        self.procs.insert(tgid, info, BPF_EXIST)
    }

    /// Removes the entry of a process that exited: its slot freed if it holds it, and any
    /// hash entry of its tgid.
    pub fn remove(&mut self, tgid: u32) {
        if let Some((i, _)) = self.held_slot(tgid) {
            let _ = self.slots.set(i, Slot::default(), 0);
        }
        let _ = self.procs.remove(&tgid);
    }

    pub fn flush_logs(&mut self) {
        if let Some(l) = self.logger.as_mut() {
            l.flush();
        }
    }

    /// Per-program run count and run time from the kernel (when program_stats is on).
    /// The BTF programs report under the classic programs' names: they do the same work.
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        PROGRAMS
            .iter()
            .enumerate()
            .filter_map(|(i, (name, _, _))| {
                let info = match (&self.process_programs, BTF_PROGRAMS.get(i)) {
                    (ProcessPrograms::Btf, Some((btf_name, _))) => {
                        let p: &BtfTracePoint = self.ebpf.program(btf_name)?.try_into().ok()?;
                        p.info().ok()?
                    }
                    _ => {
                        let tp: &TracePoint = self.ebpf.program(name)?.try_into().ok()?;
                        tp.info().ok()?
                    }
                };
                Some(ProgramStats {
                    name: name.to_string(),
                    run_count: info.run_count(),
                    run_time_ns: info.run_time().as_nanos() as u64,
                })
            })
            .collect()
    }
}

/// A map's file descriptor, for the batched lookups.
fn fd(map: &MapData) -> RawFd {
    map.fd().as_fd().as_raw_fd()
}

/// A map of the loaded object, taken out of it.
fn take(ebpf: &mut Ebpf, name: &str) -> Result<aya::maps::Map, String> {
    ebpf.take_map(name)
        .ok_or_else(|| format!("map {name} missing from the object"))
}

/// Attaches the process programs (the BTF ones where `btf` allows and they load, else the
/// classic ones) and the cgroup programs; says which process programs.
fn attach_programs(ebpf: &mut Ebpf, btf: Result<&Btf, String>) -> Result<ProcessPrograms, String> {
    let process_programs = match btf.map(|b| attach_btf(ebpf, b)) {
        Ok(Ok(())) => ProcessPrograms::Btf,
        Err(why) => {
            tracing::info!(reason = %why, "process programs on the classic tracepoints");
            ProcessPrograms::Classic
        }
        // Unexpected where BTF is there: worth a look, though nothing is lost.
        Ok(Err(why)) => {
            tracing::warn!(reason = %why, "BTF process programs did not load: on the classic tracepoints");
            ProcessPrograms::Classic
        }
    };
    let classic = match process_programs {
        ProcessPrograms::Btf => &PROGRAMS[3..],
        ProcessPrograms::Classic => &PROGRAMS[..],
    };
    for &(prog, category, name) in classic {
        let tp: &mut TracePoint = ebpf
            .program_mut(prog)
            .ok_or_else(|| format!("program {prog} missing from the object"))?
            .try_into()
            .map_err(|e| format!("program {prog}: {e}"))?;
        tp.load()
            .map_err(|e| format!("loading {prog} (verifier): {e:#}"))?;
        tp.attach(category, name)
            .map_err(|e| format!("attaching {prog} to {category}/{name}: {e:#}"))?;
    }
    Ok(process_programs)
}

/// What the programs get in `ITER_CONFIG`: this kernel's offsets (zeros without BTF), the
/// iterator enabled where it can run.
fn iter_config(offsets: &Result<(IterConfig, Option<String>), String>, run: bool) -> IterConfig {
    match offsets {
        Ok((o, _)) => IterConfig {
            enabled: run as u32,
            ..*o
        },
        Err(_) => IterConfig::zeroed(),
    }
}

/// Loads and attaches the BTF process programs, all or none: where one fails, those
/// attached are detached again and the reason is returned.
fn attach_btf(ebpf: &mut Ebpf, btf: &Btf) -> Result<(), String> {
    let attach = |ebpf: &mut Ebpf, prog: &str, tp: &str| -> Result<(), String> {
        let p: &mut BtfTracePoint = ebpf
            .program_mut(prog)
            .ok_or_else(|| format!("program {prog} missing from the object"))?
            .try_into()
            .map_err(|e: ProgramError| format!("program {prog}: {e}"))?;
        p.load(tp, btf)
            .map_err(|e| format!("loading {prog} (verifier): {e:#}"))?;
        p.attach()
            .map_err(|e| format!("attaching {prog} to {tp}: {e:#}"))?;
        Ok(())
    };
    let result = BTF_PROGRAMS
        .iter()
        .try_for_each(|&(prog, tp)| attach(ebpf, prog, tp));
    if result.is_err() {
        // Unloading detaches; one that never loaded refuses, which is nothing to undo.
        for (prog, _) in BTF_PROGRAMS {
            let p: Option<&mut BtfTracePoint> =
                ebpf.program_mut(prog).and_then(|p| p.try_into().ok());
            if let Some(p) = p {
                let _ = p.unload();
            }
        }
    }
    result
}

/// This kernel's offsets for the BTF programs, as `load` gives them (`cargo xtask bench
/// floor` loads its calibration programs with them). `v1`: as for `load`.
pub fn kernel_offsets(v1: Option<(u32, &str)>) -> Result<IterConfig, String> {
    let data = std::fs::read(btf::VMLINUX).map_err(|e| format!("no kernel BTF: {e}"))?;
    btf_offsets(&btf::Btf::parse(data)?, v1).map(|(c, _)| c)
}

/// This kernel's offsets from its BTF (`enabled` 0), and why the task iterator cannot use
/// them (None: it can); Err where a field the programs read is missing.
fn btf_offsets(
    btf: &btf::Btf,
    v1: Option<(u32, &str)>,
) -> Result<(IterConfig, Option<String>), String> {
    let off = |s: &str, m: &str| {
        btf.offset_of(s, m)
            .ok_or_else(|| format!("this kernel's BTF has no {s}.{m}"))
    };
    let mut c = IterConfig {
        enabled: 0,
        cset_v1_css: ABSENT,
        task_pid: off("task_struct", "pid")?,
        task_tgid: off("task_struct", "tgid")?,
        task_start: off("task_struct", "start_boottime")?,
        task_comm: off("task_struct", "comm")?,
        task_parent: off("task_struct", "real_parent")?,
        task_cgroups: off("task_struct", "cgroups")?,
        cset_dfl_cgrp: off("css_set", "dfl_cgrp")?,
        cgroup_kn: off("cgroup", "kn")?,
        kn_id: off("kernfs_node", "id")?,
        task_signal: off("task_struct", "signal")?,
        signal_live: off("signal_struct", "live")?,
        ..IterConfig::zeroed()
    };
    if let Some((_, controllers)) = v1 {
        // The v1 cgroup is reached through one of the hierarchy's controllers; a named
        // hierarchy (name=systemd) has none: the iterator cannot know a process's v1
        // cgroup, and fork takes its parent's.
        let Some(controller) = controllers.split(',').find(|c| !c.starts_with("name=")) else {
            return Ok((
                c,
                Some(format!("the v1 hierarchy {controllers} has no controller")),
            ));
        };
        // The block controller's subsystem is `io` in the kernel, `blkio` in v1's name.
        let subsys = if controller == "blkio" {
            "io"
        } else {
            controller
        };
        let ssid = btf
            .enumerator(&format!("{subsys}_cgrp_id"))
            .ok_or_else(|| format!("this kernel's BTF has no {subsys}_cgrp_id"))?;
        c.cset_v1_css = off("css_set", "subsys")? + 8 * ssid as u32;
        c.css_cgroup = off("cgroup_subsys_state", "cgroup")?;
    }
    Ok((c, None))
}

fn load_task_iter(ebpf: &mut Ebpf, btf: &Btf) -> Result<(), String> {
    let prog: &mut Iter = ebpf
        .program_mut(TASK_ITER_PROGRAM)
        .ok_or("no task iterator in the object")?
        .try_into()
        .map_err(|e| format!("{e}"))?;
    prog.load("task", btf)
        .map_err(|e| format!("loading the task iterator: {e:#}"))
}

/// The ring buffer's readiness, on a duplicate of its fd.
pub struct RingReady(AsyncFd<OwnedFd>);

impl RingReady {
    /// Returns once the kernel has signalled notifications. Readiness is cleared before the
    /// caller drains, so a notification that arrives during the drain wakes it again.
    pub async fn wait(&self) -> std::io::Result<()> {
        let mut guard = self.0.readable().await?;
        guard.clear_ready();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The BTF programs' offsets do not depend on the task iterator: a v1 hierarchy
    /// without a controller leaves them whole (fork takes the parent's v1 id) and only
    /// the iterator gets a reason not to run.
    #[test]
    fn offsets_for_the_btf_programs_with_each_kind_of_v1_hierarchy() {
        let btf = btf::Btf::from_sys_fs().expect("this kernel's BTF");
        let (plain, why) = btf_offsets(&btf, None).unwrap();
        assert_eq!((plain.enabled, plain.cset_v1_css, why), (0, ABSENT, None));
        assert_eq!(
            Some(plain.task_signal),
            btf.offset_of("task_struct", "signal")
        );
        let (named, why) = btf_offsets(&btf, Some((1, "name=systemd"))).unwrap();
        assert_eq!(named, plain, "the programs' offsets are the same");
        assert!(why.unwrap().contains("no controller"));
        let (memory, why) = btf_offsets(&btf, Some((4, "memory"))).unwrap();
        assert_eq!(why, None);
        let subsys = btf.offset_of("css_set", "subsys").unwrap();
        let ssid = btf.enumerator("memory_cgrp_id").unwrap() as u32;
        assert_eq!(memory.cset_v1_css, subsys + 8 * ssid);
        assert_eq!(
            IterConfig {
                cset_v1_css: ABSENT,
                css_cgroup: 0,
                ..memory
            },
            plain
        );
    }
}
