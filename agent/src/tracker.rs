//! The one owner of the process state. It applies the kernel's notifications to the cache,
//! seeds the kernel map at start-up, resyncs from it after lost notifications, and in /proc
//! mode rescans /proc instead.
use std::{
    collections::{HashMap, HashSet},
    sync::{atomic::Ordering::Relaxed, Arc, RwLock},
    time::{Duration, Instant},
};

use agent_common::{
    CgroupEvent, ProcEvent, ProcInfo, CGROUP_PATH_MAX, EVENT_CGROUP_ATTACH, EVENT_CGROUP_MKDIR,
    EVENT_CGROUP_RMDIR, EVENT_EXEC, EVENT_EXIT, EVENT_FORK, F_CGROUP_SUSPECT, F_START_KNOWN,
    F_V1_KNOWN, F_V2_KNOWN,
};

use crate::{
    cache::{comm_str, ProcessCache, ProcessEntry},
    cgroup::{CgroupRegistry, Hierarchies},
    ebpf::EbpfSource,
    gpu::GpuSample,
    join::{join, Counters, Snapshot},
    procfs::{ProcRecord, Procfs},
    state::State,
    stats::Stats,
};

/// A cgroup id nobody told us about triggers at most one walk of its hierarchy this often.
const WALK_INTERVAL: Duration = Duration::from_secs(1);

pub struct Tracker {
    pub state: Arc<RwLock<State>>,
    stats: Arc<Stats>,
    procfs: Procfs,
    source: Option<EbpfSource>,
    last_lost: u64,
    last_walk: HashMap<u32, Instant>,
    tombstone: Duration,
    counters: Counters,
    /// GPU PIDs /proc could not place either, and when: not asked again for a while.
    unresolved: HashMap<u32, Instant>,
}

/// How long a GPU PID that nobody could place is left alone before /proc is asked again.
const UNRESOLVED_RETRY: Duration = Duration::from_secs(30);

impl Tracker {
    pub fn new(
        hierarchies: Hierarchies,
        procfs: Procfs,
        source: Option<EbpfSource>,
        tombstone: Duration,
        stats: Arc<Stats>,
    ) -> Tracker {
        let state = State {
            cache: ProcessCache::new(tombstone),
            registry: CgroupRegistry::default(),
            hierarchies,
        };
        Tracker {
            state: Arc::new(RwLock::new(state)),
            stats,
            procfs,
            source,
            last_lost: 0,
            last_walk: HashMap::new(),
            tombstone,
            counters: Counters::default(),
            unresolved: HashMap::new(),
        }
    }

    pub fn source(&self) -> Option<&EbpfSource> {
        self.source.as_ref()
    }

    pub fn is_ebpf(&self) -> bool {
        self.source.is_some()
    }

    /// One cgroup-filesystem walk and one /proc walk. In eBPF mode the programs are already
    /// attached: the walk only fills kernel entries that do not exist yet (the kernel's are
    /// fresher), then the cache is read back from the kernel map.
    pub fn startup(&mut self) {
        let started = Instant::now();
        let mut guard = self.state.write().unwrap();
        let st = &mut *guard;
        let hier = st.hierarchies.clone();
        for h in hier.all() {
            st.registry.walk(h);
            self.stats.cgroup_walks.fetch_add(1, Relaxed);
        }
        for pid in self.procfs.pids() {
            let Some(rec) = self.procfs.read(pid) else {
                continue; // exited meanwhile
            };
            let entry = entry_from_record(&mut st.registry, &hier, &rec);
            if let Some(src) = self.source.as_mut() {
                if let Err(e) = src.insert_if_absent(pid, kernel_info(&entry)) {
                    // Map full: the cache still knows it; lookups fall back to /proc.
                    tracing::debug!(pid, "seeding the kernel map: {e}");
                }
            }
            // The cache keeps what only /proc knows (comm); the resync below makes the rest
            // equal to the kernel map.
            st.cache.upsert(entry);
        }
        drop(guard);
        if self.source.is_some() {
            self.resync_from_kernel();
        }
        self.publish_gauges();
        self.stats
            .startup_walk_ms
            .store(started.elapsed().as_millis() as u64, Relaxed);
    }

    /// Drains the ring buffer. Returns the number of notifications applied.
    pub fn drain(&mut self) -> usize {
        let Some(src) = self.source.as_mut() else {
            return 0;
        };
        let mut guard = self.state.write().unwrap();
        let st = &mut *guard;
        let v1_id = st.hierarchies.v1.as_ref().map(|h| h.id);
        let mut n = 0usize;
        let mut attaches: Vec<(u32, u32, u64)> = vec![];
        let mut need_walk: HashSet<u32> = HashSet::new();
        while let Some(item) = src.ring.next() {
            n += 1;
            let bytes: &[u8] = &item;
            if bytes.len() < 4 {
                continue;
            }
            let kind = u32::from_ne_bytes(bytes[..4].try_into().unwrap());
            match kind {
                EVENT_EXEC | EVENT_FORK | EVENT_EXIT if bytes.len() >= size_of::<ProcEvent>() => {
                    // SAFETY: length checked; ProcEvent is plain old data.
                    let ev: ProcEvent =
                        unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const ProcEvent) };
                    match kind {
                        EVENT_FORK => st.cache.on_fork(ev.tgid, &ev.info, comm_str(&ev.comm)),
                        EVENT_EXEC => st.cache.on_exec(ev.tgid, &ev.info, comm_str(&ev.comm)),
                        _ => st.cache.on_exit(ev.tgid, Instant::now()),
                    }
                    if kind != EVENT_EXIT
                        && ev.info.flags & F_V2_KNOWN != 0
                        && !st.registry.contains(0, ev.info.cgroup_id)
                    {
                        need_walk.insert(0);
                    }
                }
                EVENT_CGROUP_MKDIR | EVENT_CGROUP_RMDIR | EVENT_CGROUP_ATTACH
                    if bytes.len() >= size_of::<CgroupEvent>() =>
                {
                    // SAFETY: length checked; CgroupEvent is plain old data.
                    let ev: CgroupEvent =
                        unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const CgroupEvent) };
                    let truncated = ev.path_len as usize > CGROUP_PATH_MAX;
                    let end = ev.path.iter().position(|&b| b == 0).unwrap_or(0);
                    let path = String::from_utf8_lossy(&ev.path[..end]);
                    if kind == EVENT_CGROUP_RMDIR {
                        st.registry.mark_removed(ev.hierarchy, ev.id);
                    } else if truncated || path.is_empty() {
                        need_walk.insert(ev.hierarchy);
                    } else {
                        st.registry.insert(ev.hierarchy, ev.id, &path);
                    }
                    if kind == EVENT_CGROUP_ATTACH
                        && (ev.hierarchy == 0 || Some(ev.hierarchy) == v1_id)
                    {
                        attaches.push((ev.pid, ev.hierarchy, ev.id));
                    }
                }
                _ => tracing::debug!(kind, len = bytes.len(), "unknown notification"),
            }
        }
        drop(guard);
        self.stats.events_received.fetch_add(n as u64, Relaxed);
        for (pid, hierarchy, id) in attaches {
            self.apply_attach(pid, hierarchy, id);
        }
        for h in need_walk {
            self.walk_hierarchy(h);
        }
        let src = self.source.as_mut().unwrap();
        src.flush_logs();
        let counters = src.counters();
        self.stats.events_lost.store(counters.ringbuf_lost, Relaxed);
        self.stats.kernel_map_full.store(counters.map_full, Relaxed);
        self.stats
            .kernel_read_errors
            .store(counters.read_errors, Relaxed);
        if counters.ringbuf_lost > self.last_lost {
            self.last_lost = counters.ringbuf_lost;
            tracing::warn!(
                lost = counters.ringbuf_lost,
                "ring buffer overflowed; resyncing from the kernel map"
            );
            // Whatever is still queued predates the resync; applying it first keeps order.
            self.drain();
            self.resync_from_kernel();
            self.stats.resyncs.fetch_add(1, Relaxed);
            self.publish_gauges();
        }
        n
    }

    /// A migration: the cache follows it, and the kernel entry too when the program found
    /// none (a process that the start-up walk had not seeded yet).
    fn apply_attach(&mut self, pid: u32, hierarchy: u32, id: u64) {
        let v2 = hierarchy == 0;
        let known = self.state.write().unwrap().cache.on_attach(pid, v2, id);
        let src = self.source.as_mut().unwrap();
        if known {
            if let Some(mut info) = src.get(pid) {
                let stale = if v2 {
                    info.cgroup_id != id || info.flags & F_V2_KNOWN == 0
                } else {
                    info.cgroup_v1_id != id || info.flags & F_V1_KNOWN == 0
                };
                if stale {
                    if v2 {
                        info.cgroup_id = id;
                        info.flags = (info.flags | F_V2_KNOWN) & !F_CGROUP_SUSPECT;
                    } else {
                        info.cgroup_v1_id = id;
                        info.flags |= F_V1_KNOWN;
                    }
                    let _ = src.update_existing(pid, info);
                }
            }
            return;
        }
        // Unknown pid: a process we have not seen, or a lone thread moved through `tasks`.
        self.stats.procfs_fallback_lookups.fetch_add(1, Relaxed);
        if self.procfs.tgid_of(pid) != Some(pid) {
            return;
        }
        self.lookup_from_procfs(pid);
    }

    /// Reads one process from /proc into the cache and the kernel map. Counted by callers.
    fn lookup_from_procfs(&mut self, pid: u32) -> Option<()> {
        let rec = self.procfs.read(pid)?;
        let mut guard = self.state.write().unwrap();
        let st = &mut *guard;
        let hier = st.hierarchies.clone();
        let entry = entry_from_record(&mut st.registry, &hier, &rec);
        if let Some(src) = self.source.as_mut() {
            let info = kernel_info(&entry);
            if !src.insert_if_absent(pid, info).unwrap_or(true) {
                let _ = src.update_existing(pid, info);
            }
        }
        st.cache.upsert(entry);
        Some(())
    }

    /// The cache becomes exactly the kernel map; holes the kernel could not fill (processes
    /// it first saw at exec, or whose cgroup it could not trust) are read from /proc, one
    /// PID at a time.
    pub fn resync_from_kernel(&mut self) {
        let Some(src) = self.source.as_ref() else {
            return;
        };
        let snapshot = src.snapshot();
        let now = Instant::now();
        let (v1_tracked, v2_tracked) = {
            let mut st = self.state.write().unwrap();
            let live: HashSet<u32> = snapshot.iter().map(|(k, _)| *k).collect();
            for (tgid, info) in &snapshot {
                let mut info = *info;
                if info.flags & F_CGROUP_SUSPECT != 0 {
                    info.flags &= !F_V2_KNOWN;
                }
                st.cache.upsert_kernel(*tgid, &info);
            }
            st.cache.retire_missing(&live, now);
            (st.hierarchies.v1.is_some(), st.hierarchies.v2.is_some())
        };
        let holes: Vec<u32> = {
            let st = self.state.read().unwrap();
            snapshot
                .iter()
                .filter(|(_, i)| {
                    i.flags & F_START_KNOWN == 0
                        || (v2_tracked && i.flags & F_V2_KNOWN == 0)
                        || i.flags & F_CGROUP_SUSPECT != 0
                        || (v1_tracked && i.flags & F_V1_KNOWN == 0)
                })
                .map(|(k, _)| *k)
                .filter(|k| st.cache.get(*k).is_some_and(|e| e.is_live()))
                .collect()
        };
        for pid in holes {
            self.stats.procfs_fallback_lookups.fetch_add(1, Relaxed);
            if self.lookup_from_procfs(pid).is_none() && self.procfs.tgid_of(pid) != Some(pid) {
                // Gone, or a thread id: not a process to keep.
                if let Some(src) = self.source.as_mut() {
                    src.remove(pid);
                }
                self.state.write().unwrap().cache.on_exit(pid, now);
            }
        }
    }

    /// /proc mode: the only way to see new processes is to look again.
    pub fn rescan_procfs(&mut self) {
        let mut guard = self.state.write().unwrap();
        let st = &mut *guard;
        let hier = st.hierarchies.clone();
        let mut live = HashSet::new();
        for pid in self.procfs.pids() {
            let Some(rec) = self.procfs.read(pid) else {
                continue;
            };
            live.insert(pid);
            let entry = entry_from_record(&mut st.registry, &hier, &rec);
            st.cache.upsert(entry);
        }
        st.cache.retire_missing(&live, Instant::now());
        drop(guard);
        self.stats.procfs_rescans.fetch_add(1, Relaxed);
        self.publish_gauges();
    }

    /// A process for a PID someone (the GPU join) asks about. A PID the cache cannot place
    /// is read from /proc for that PID alone, and counted.
    pub fn resolve(&mut self, pid: u32) -> Option<ProcessEntry> {
        if let Some(e) = self.state.read().unwrap().cache.get(pid) {
            return Some(e.clone());
        }
        // The kernel map may know it before its notification was applied: no /proc read.
        let v1_tracked = self.state.read().unwrap().hierarchies.v1.is_some();
        if let Some(info) = self.source.as_ref().and_then(|s| s.get(pid)) {
            let complete = info.flags & (F_START_KNOWN | F_V2_KNOWN) == F_START_KNOWN | F_V2_KNOWN
                && info.flags & F_CGROUP_SUSPECT == 0
                && (!v1_tracked || info.flags & F_V1_KNOWN != 0);
            if complete {
                let mut st = self.state.write().unwrap();
                st.cache.upsert_kernel(pid, &info);
                return st.cache.get(pid).cloned();
            }
        }
        self.stats.procfs_fallback_lookups.fetch_add(1, Relaxed);
        self.lookup_from_procfs(pid)?;
        self.state.read().unwrap().cache.get(pid).cloned()
    }

    /// Joins a GPU sample with the cache. GPU PIDs the cache does not know are looked up
    /// in /proc first, one PID at a time, so a process the kernel map could not hold (map
    /// full) is still placed.
    pub fn join_gpu(
        &mut self,
        metadata: &crate::metadata::Metadata,
        sample: &GpuSample,
        nvml_status: &gpu_model::SourceStatus,
        max_gap: Duration,
        process_detail: bool,
    ) -> Snapshot {
        let now = Instant::now();
        let pids: Vec<u32> = sample
            .devices
            .iter()
            .flat_map(|d| d.processes.iter().map(|p| p.pid))
            .collect();
        let mut unresolved = 0;
        for &pid in &pids {
            if self.state.read().unwrap().cache.get(pid).is_some() {
                continue;
            }
            if self
                .unresolved
                .get(&pid)
                .is_some_and(|t| now.duration_since(*t) < UNRESOLVED_RETRY)
            {
                unresolved += 1;
                continue;
            }
            if self.resolve(pid).is_none() {
                self.unresolved.insert(pid, now);
                unresolved += 1;
            }
        }
        self.unresolved
            .retain(|_, t| now.duration_since(*t) < UNRESOLVED_RETRY);
        self.stats.gpu_processes.store(pids.len() as u64, Relaxed);
        self.stats
            .gpu_processes_unresolved
            .store(unresolved, Relaxed);
        let st = self.state.read().unwrap();
        let (snap, counters) = join(
            &st,
            metadata,
            sample,
            nvml_status,
            &self.counters,
            max_gap,
            process_detail,
        );
        drop(st);
        self.counters = counters;
        snap
    }

    fn walk_hierarchy(&mut self, id: u32) {
        let now = Instant::now();
        if self
            .last_walk
            .get(&id)
            .is_some_and(|t| now.duration_since(*t) < WALK_INTERVAL)
        {
            return;
        }
        self.last_walk.insert(id, now);
        let mut st = self.state.write().unwrap();
        if let Some(h) = st.hierarchies.by_id(id).cloned() {
            st.registry.walk(&h);
            self.stats.cgroup_walks.fetch_add(1, Relaxed);
        }
    }

    pub fn gc(&mut self) {
        let now = Instant::now();
        let mut st = self.state.write().unwrap();
        st.cache.gc(now);
        st.registry.gc(self.tombstone * 2);
        drop(st);
        if let Some(src) = self.source.as_ref().filter(|s| s.stats_enabled()) {
            *self.stats.programs.write().unwrap() = src.program_stats();
        }
        self.publish_gauges();
    }

    fn publish_gauges(&self) {
        let st = self.state.read().unwrap();
        let live = st.cache.live_count();
        self.stats.cached_processes.store(live as u64, Relaxed);
        self.stats
            .tombstones
            .store((st.cache.len() - live) as u64, Relaxed);
        self.stats
            .cgroups_known
            .store(st.registry.len() as u64, Relaxed);
    }
}

fn entry_from_record(
    registry: &mut CgroupRegistry,
    hier: &Hierarchies,
    rec: &ProcRecord,
) -> ProcessEntry {
    let id_in = |registry: &mut CgroupRegistry, h: Option<&crate::cgroup::Hierarchy>| {
        let h = h?;
        let path = rec.cgroup_path(h.id)?;
        registry.id_of(h, path)
    };
    ProcessEntry {
        pid: rec.pid,
        start_ns: rec.start_ns,
        ppid: rec.ppid,
        comm: rec.comm.clone(),
        cgroup_v2: id_in(registry, hier.v2.as_ref()),
        cgroup_v1: id_in(registry, hier.v1.as_ref()),
        exited_at: None,
    }
}

fn kernel_info(e: &ProcessEntry) -> ProcInfo {
    let mut flags = F_START_KNOWN;
    if e.cgroup_v2.is_some() {
        flags |= F_V2_KNOWN;
    }
    if e.cgroup_v1.is_some() {
        flags |= F_V1_KNOWN;
    }
    ProcInfo {
        cgroup_id: e.cgroup_v2.unwrap_or(0),
        cgroup_v1_id: e.cgroup_v1.unwrap_or(0),
        start_ns: e.start_ns,
        ppid: e.ppid,
        flags,
    }
}
