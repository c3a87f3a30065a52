//! The one owner of the process state. It applies the kernel's notifications to the cache,
//! seeds the kernel map at start-up, resyncs from it after lost notifications, and in /proc
//! mode rescans /proc instead.
use std::{
    collections::{HashMap, HashSet},
    sync::{atomic::Ordering::Relaxed, Arc, RwLock, RwLockReadGuard},
    time::{Duration, Instant},
};

use agent_common::ProcInfo;
use gpu_model::TrackingMode;

use super::{
    cache::{ProcessCache, ProcessEntry},
    cgroup::{CgroupRegistry, Hierarchies, Hierarchy},
    procfs::{Liveness, ProcRecord, Procfs},
    state::State,
};
use crate::{
    config::CacheConfig,
    ebpf::{events::KernelEvent, EbpfSource},
    stats::Stats,
};

mod startup;

/// A cgroup id nobody told us about triggers at most one walk of its hierarchy this often.
const WALK_INTERVAL: Duration = Duration::from_secs(1);
/// A kernel map that keeps filling up is said again at most this often.
const MAP_FULL_REPEAT: Duration = Duration::from_secs(60);

/// /proc gives start times in clock ticks, the kernel in nanoseconds: the same process
/// if they agree within two ticks (or one side does not know).
fn same_start(a: u64, b: u64) -> bool {
    a == 0 || b == 0 || a.abs_diff(b) <= 20_000_000
}

pub struct Tracker {
    state: Arc<RwLock<State>>,
    stats: Arc<Stats>,
    procfs: Procfs,
    source: Option<EbpfSource>,
    /// Decoded notifications, reused between drains.
    events: Vec<KernelEvent>,
    last_lost: u64,
    last_walk: HashMap<u32, Instant>,
    tombstone: Duration,
    /// Processes the start-up walk could not put in the kernel map (full).
    seed_failures: u64,
    /// The failed inserts last said in the log, and when.
    map_full_said: (u64, Option<Instant>),
}

impl Tracker {
    pub fn new(
        hierarchies: Hierarchies,
        procfs: Procfs,
        source: Option<EbpfSource>,
        cfg: &CacheConfig,
        stats: Arc<Stats>,
    ) -> Tracker {
        let tombstone = cfg.tombstone();
        let state = State {
            cache: ProcessCache::new(tombstone, cfg.max_tombstones),
            registry: CgroupRegistry::default(),
            hierarchies,
        };
        Tracker {
            state: Arc::new(RwLock::new(state)),
            stats,
            procfs,
            source,
            events: Vec::new(),
            last_lost: 0,
            last_walk: HashMap::new(),
            tombstone,
            seed_failures: 0,
            map_full_said: (0, None),
        }
    }

    /// The state, for readers (the join, /debug/processes).
    pub fn shared_state(&self) -> Arc<RwLock<State>> {
        self.state.clone()
    }

    pub fn state(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap()
    }

    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    pub fn source(&self) -> Option<&EbpfSource> {
        self.source.as_ref()
    }

    pub fn is_ebpf(&self) -> bool {
        self.source.is_some()
    }

    /// Applies every queued notification; after lost ones, resyncs from the kernel map.
    /// Returns the number of notifications read.
    pub fn drain(&mut self) -> usize {
        if self.source.is_none() {
            return 0;
        }
        let n = self.apply_queued();
        // Notifications are lost only when the ring is full, so a loss leaves data to read:
        // an empty drain need not ask the kernel for its counters (a syscall; gc still
        // reads them every second).
        if n == 0 {
            return 0;
        }
        n + self.check_counters()
    }

    /// Reads the kernel's counters; after lost notifications, resyncs from the kernel map.
    /// Returns the number of notifications applied meanwhile.
    fn check_counters(&mut self) -> usize {
        let mut n = 0;
        loop {
            let counters = self.read_counters();
            if counters.ringbuf_lost <= self.last_lost {
                break;
            }
            self.last_lost = counters.ringbuf_lost;
            tracing::warn!(
                lost = counters.ringbuf_lost,
                "ring buffer overflowed; resyncing from the kernel map"
            );
            // Whatever is still queued predates the resync; applying it first keeps order.
            n += self.apply_queued();
            self.resync_from_kernel();
            self.stats.resyncs.fetch_add(1, Relaxed);
            self.publish_gauges();
        }
        n
    }

    /// One pass over the ring buffer. With `reap_exits`, the kernel entries of processes that
    /// exited are removed too: the start-up seed or task iterator may have written them after
    /// the kernel deleted them at exit.
    fn apply_queued_with(&mut self, reap_exits: bool) -> usize {
        let Some(src) = self.source.as_mut() else {
            return 0;
        };
        let mut events = std::mem::take(&mut self.events);
        let n = src.read_events(&mut events);
        let mut later = Deferred::default();
        let mut exited: HashSet<u32> = HashSet::new();
        {
            let mut guard = self.state.write().unwrap();
            let st = &mut *guard;
            for (at, ev) in events.drain(..).enumerate() {
                if reap_exits {
                    match ev {
                        KernelEvent::Exit { tgid } => exited.insert(tgid),
                        KernelEvent::Fork { tgid, .. } | KernelEvent::Exec { tgid, .. } => {
                            exited.remove(&tgid)
                        }
                        _ => false,
                    };
                }
                apply(st, ev, at, &mut later);
            }
        }
        self.events = events;
        for tgid in exited {
            src.remove(tgid);
        }
        self.stats.events_received.fetch_add(n as u64, Relaxed);
        for (pid, hierarchy, id, known) in later.attaches_of_the_running() {
            self.apply_attach(pid, hierarchy, id, known);
        }
        for pid in later.suspects_of_the_running() {
            self.stats.procfs_fallback_lookups.fetch_add(1, Relaxed);
            self.lookup_from_procfs(pid);
        }
        self.learn_cgroups(later.unknown, false);
        if let Some(src) = self.source.as_mut() {
            src.flush_logs();
        }
        n
    }

    /// One pass over the ring buffer.
    fn apply_queued(&mut self) -> usize {
        self.apply_queued_with(false)
    }

    /// The kernel's drop counters, copied into the stats; a full map is said loudly.
    fn read_counters(&mut self) -> crate::ebpf::KernelCounters {
        let counters = self
            .source
            .as_ref()
            .map(|s| s.counters())
            .unwrap_or_default();
        self.stats.events_lost.store(counters.ringbuf_lost, Relaxed);
        let map_full = counters.map_full + self.seed_failures;
        self.stats.kernel_map_full.store(map_full, Relaxed);
        self.stats
            .kernel_read_errors
            .store(counters.read_errors, Relaxed);
        if map_full > self.map_full_said.0
            && self
                .map_full_said
                .1
                .is_none_or(|t| t.elapsed() >= MAP_FULL_REPEAT)
        {
            self.map_full_said = (map_full, Some(Instant::now()));
            let capacity = self.source.as_ref().map_or(0, |s| s.capacity());
            let reason = format!(
                "the kernel process map is full: {map_full} inserts failed at \
                 ebpf.max_processes = {capacity}; processes beyond it are looked up in /proc \
                 one at a time (raise ebpf.max_processes)"
            );
            tracing::warn!("{reason}");
            self.stats.set_mode(TrackingMode::Ebpf, Some(reason));
        }
        counters
    }

    /// Whether some processes could not be put in the kernel map.
    fn map_overflowed(&self) -> bool {
        self.map_full_said.0 > 0
    }

    /// A migration, after its batch: the cache followed it in the batch where it `known`
    /// the process; the kernel entry follows too when the program found none (a process
    /// that the start-up walk had not seeded yet). An unknown process is read from /proc.
    fn apply_attach(&mut self, pid: u32, hierarchy: u32, id: u64, known: bool) {
        let v2 = hierarchy == 0;
        let Some(src) = self.source.as_mut() else {
            return;
        };
        if known {
            if let Some(mut info) = src.get(pid).filter(|i| !i.knows_cgroup(v2, id)) {
                info.set_cgroup(v2, id);
                let _ = src.update_existing(pid, info);
                self.check_after_write(pid, info.start_ns);
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
    /// None when there is no live process `pid` to keep: gone, or exiting (a zombie its
    /// parent has not reaped is still in /proc); then it is retired here.
    fn lookup_from_procfs(&mut self, pid: u32) -> Option<()> {
        // A second try when the PID went to a new process meanwhile: the write may have
        // put the old one's facts in the new one's entry.
        for _ in 0..2 {
            let rec = self.procfs.read(pid)?;
            if rec.exited {
                self.forget_exited(pid, rec.start_ns);
                return None;
            }
            let entry = {
                let mut guard = self.state.write().unwrap();
                let st = &mut *guard;
                let hier = st.hierarchies.clone();
                entry_from_record(&mut st.registry, &hier, &rec)
            };
            let info = kernel_info(&entry);
            if let Some(src) = self.source.as_mut() {
                if !src.insert_if_absent(pid, info).unwrap_or(true) {
                    let _ = src.update_existing(pid, info);
                }
            }
            match self.check_after_write(pid, rec.start_ns) {
                Liveness::Running => {
                    self.state.write().unwrap().cache.upsert(entry);
                    return Some(());
                }
                Liveness::Exited => return None,
                Liveness::Replaced => continue,
            }
        }
        None
    }

    /// After a write of `pid`'s kernel entry from userspace: the exit program may have run
    /// between the read the write came from and the write (a slot it freed is claimed
    /// again, a hash entry it deleted made again), and then nobody would delete the entry.
    /// Asked after the write, /proc tells; an exited process is forgotten here.
    fn check_after_write(&mut self, pid: u32, start_ns: u64) -> Liveness {
        let l = self.procfs.liveness(pid, start_ns);
        if l == Liveness::Exited {
            self.forget_exited(pid, start_ns);
        }
        l
    }

    /// A process found exited in /proc, maybe after its entry was written: its kernel entry
    /// goes (unless a new process under the PID has one) and the cache has it exited.
    fn forget_exited(&mut self, pid: u32, start_ns: u64) {
        if let Some(src) = self.source.as_mut() {
            if src
                .get(pid)
                .is_some_and(|i| same_start(i.start_ns, start_ns))
            {
                src.remove(pid);
            }
        }
        self.state
            .write()
            .unwrap()
            .cache
            .on_exit(pid, Instant::now());
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
            let mut live: HashSet<u32> = snapshot.iter().map(|(k, _)| *k).collect();
            for (tgid, info) in &snapshot {
                st.cache.upsert_kernel(*tgid, &info.trusted());
            }
            if self.map_overflowed() {
                // Missing from a full map is not gone: ask /proc before retiring.
                let procfs = &self.procfs;
                let alive: Vec<u32> = st
                    .cache
                    .iter()
                    .filter(|e| e.is_live() && !live.contains(&e.pid))
                    .filter(|e| {
                        procfs
                            .read_running(e.pid)
                            .is_some_and(|r| same_start(r.start_ns, e.start_ns))
                    })
                    .map(|e| e.pid)
                    .collect();
                live.extend(alive);
            }
            st.cache.retire_missing(&live, now);
            (st.hierarchies.v1.is_some(), st.hierarchies.v2.is_some())
        };
        let holes: Vec<u32> = {
            let st = self.state.read().unwrap();
            snapshot
                .iter()
                .filter(|(_, i)| !i.is_complete(v2_tracked, v1_tracked))
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
        self.fill_what_was_missed();
    }

    /// After lost notifications: the cgroups nobody announced are looked up by id, and
    /// the commands of processes the cache only knows from the kernel map are read.
    fn fill_what_was_missed(&mut self) {
        let (unknown, no_comm) = {
            let st = self.state.read().unwrap();
            let mut unknown = HashSet::new();
            let mut no_comm = vec![];
            let v1 = st.hierarchies.v1.as_ref().map(|h| h.id);
            for e in st.cache.iter().filter(|e| e.is_live()) {
                for (h, id) in [(Some(0), e.cgroup_v2()), (v1, e.cgroup_v1())] {
                    if let (Some(h), Some(id)) = (h, id) {
                        if !st.registry.contains(h, id) {
                            unknown.insert((h, id));
                        }
                    }
                }
                if e.comm.is_empty() {
                    no_comm.push(e.pid);
                }
            }
            (unknown, no_comm)
        };
        self.learn_cgroups(unknown, true);
        let comms: Vec<(u32, String)> = no_comm
            .into_iter()
            .filter_map(|pid| Some((pid, self.procfs.comm(pid)?)))
            .collect();
        let mut st = self.state.write().unwrap();
        for (pid, comm) in comms {
            st.cache.set_comm(pid, comm.into());
        }
    }

    /// Registers cgroups the registry does not know, by id: asked of the kernel one by one
    /// (`Hierarchy::path_of_id`), else by a walk of their hierarchy (at most once a second
    /// unless `now`).
    fn learn_cgroups(&mut self, unknown: HashSet<(u32, u64)>, now: bool) {
        let mut walk: HashSet<u32> = HashSet::new();
        for (h, id) in unknown {
            let hierarchy = {
                let st = self.state.read().unwrap();
                if st.registry.contains(h, id) {
                    continue;
                }
                st.hierarchies.by_id(h).cloned()
            };
            let Some(hierarchy) = hierarchy else {
                continue;
            };
            self.stats.cgroup_lookups.fetch_add(1, Relaxed);
            match hierarchy.path_of_id(id) {
                Some(path) => self.state.write().unwrap().registry.insert(h, id, &path),
                None => {
                    walk.insert(h);
                }
            }
        }
        for h in walk {
            self.walk_hierarchy(h, now);
        }
    }

    /// /proc mode: the only way to see new processes is to look again.
    pub fn rescan_procfs(&mut self) {
        let mut guard = self.state.write().unwrap();
        let st = &mut *guard;
        let hier = st.hierarchies.clone();
        let mut live = HashSet::new();
        for pid in self.procfs.pids() {
            // A zombie is retired with the gone.
            let Some(rec) = self.procfs.read_running(pid) else {
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
        let (v2_tracked, v1_tracked) = {
            let h = &self.state.read().unwrap().hierarchies;
            (h.v2.is_some(), h.v1.is_some())
        };
        if let Some(info) = self.source.as_ref().and_then(|s| s.get(pid)) {
            if info.is_complete(v2_tracked, v1_tracked) {
                let mut st = self.state.write().unwrap();
                st.cache.upsert_kernel(pid, &info);
                return st.cache.get(pid).cloned();
            }
        }
        self.stats.procfs_fallback_lookups.fetch_add(1, Relaxed);
        self.lookup_from_procfs(pid)?;
        self.state.read().unwrap().cache.get(pid).cloned()
    }

    /// A cgroup nobody told us about, that its id could not name: walk its hierarchy, at
    /// most once a second unless `force`.
    fn walk_hierarchy(&mut self, id: u32, force: bool) {
        let now = Instant::now();
        if !force
            && self
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

    /// Forgets expired tombstones and removed cgroups. Returns the containers whose last
    /// cgroup went.
    pub fn gc(&mut self) -> Vec<String> {
        if self.source.is_some() {
            self.check_counters();
        }
        let now = Instant::now();
        let mut st = self.state.write().unwrap();
        st.cache.gc(now);
        let gone = st.registry.gc(self.tombstone.saturating_mul(2));
        drop(st);
        if let Some(src) = self.source.as_ref().filter(|s| s.stats_enabled()) {
            *self.stats.programs.write().unwrap() = src.program_stats();
        }
        self.publish_gauges();
        gone
    }

    fn publish_gauges(&self) {
        let st = self.state.read().unwrap();
        let live = st.cache.live_count();
        self.stats.cached_processes.store(live as u64, Relaxed);
        let tombstones = st.cache.tombstone_count() as u64;
        self.stats.tombstones.store(tombstones, Relaxed);
        let evicted = st.cache.evicted();
        self.stats.tombstones_evicted.store(evicted, Relaxed);
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
    let id_in = |registry: &mut CgroupRegistry, h: Option<&Hierarchy>| {
        let h = h?;
        let path = rec.cgroup_path(h.id)?;
        registry.id_of(h, path)
    };
    let cgroup_v2 = id_in(registry, hier.v2.as_ref());
    let cgroup_v1 = id_in(registry, hier.v1.as_ref());
    ProcessEntry::new(
        rec.pid,
        rec.start_ns,
        rec.ppid,
        rec.comm.as_str().into(),
        cgroup_v2,
        cgroup_v1,
    )
}

fn kernel_info(e: &ProcessEntry) -> ProcInfo {
    ProcInfo::new(e.cgroup_v2(), e.cgroup_v1(), Some(e.start_ns), e.ppid)
        .with_comm(e.comm.as_bytes())
}

/// What a batch of notifications leaves for after the state lock: migrations, which need
/// the kernel map or a /proc read, and cgroups the registry cannot name yet.
#[derive(Default)]
struct Deferred {
    /// (pid, hierarchy, cgroup id, whether the cache knew the process) and the
    /// migration's place in the batch.
    attaches: Vec<(u32, u32, u64, bool, usize)>,
    unknown: HashSet<(u32, u64)>,
    /// The place of each exit that came after a migration or a suspect fork, by tgid (the
    /// last one).
    exited_at: rustc_hash::FxHashMap<u32, usize>,
    /// Forks whose cgroup the program could not know (`CLONE_INTO_CGROUP` on the classic
    /// tracepoints: the parent's is not the child's), and their place in the batch.
    suspects: Vec<(u32, usize)>,
}

impl Deferred {
    /// The migrations of processes that did not exit later in the batch: followed after
    /// it, an exited one's would read /proc for a process whose exit was already applied
    /// (a zombie is still there).
    fn attaches_of_the_running(&self) -> impl Iterator<Item = (u32, u32, u64, bool)> + '_ {
        self.attaches
            .iter()
            .filter(|&&(pid, _, _, _, at)| self.running_after(pid, at))
            .map(|&(pid, hierarchy, id, known, _)| (pid, hierarchy, id, known))
    }

    /// Whether the process of notification `at` did not exit later in the batch.
    fn running_after(&self, pid: u32, at: usize) -> bool {
        self.exited_at.get(&pid).is_none_or(|&e| e < at)
    }

    /// The suspect forks of processes that did not exit later in the batch: /proc says
    /// where they are.
    fn suspects_of_the_running(&self) -> impl Iterator<Item = u32> + '_ {
        self.suspects
            .iter()
            .filter(|&&(pid, at)| self.running_after(pid, at))
            .map(|&(pid, _)| pid)
    }
}

/// Notification `at` of its batch applied to the state. Attaches, and cgroups the registry
/// cannot name yet, are collected: they need the kernel map or a lookup, after the lock.
fn apply(st: &mut State, ev: KernelEvent, at: usize, later: &mut Deferred) {
    let Deferred {
        attaches,
        unknown,
        exited_at,
        suspects,
    } = later;
    let v1_id = st.hierarchies.v1.as_ref().map(|h| h.id);
    let mut note = |st: &State, info: &ProcInfo| {
        if info.v2_known() && !st.registry.contains(0, info.cgroup_id) {
            unknown.insert((0, info.cgroup_id));
        }
        if let Some(v1) = v1_id.filter(|_| info.v1_known()) {
            if !st.registry.contains(v1, info.cgroup_v1_id) {
                unknown.insert((v1, info.cgroup_v1_id));
            }
        }
    };
    match ev {
        KernelEvent::Fork { tgid, info, comm } => {
            if info.cgroup_suspect() {
                suspects.push((tgid, at));
            }
            // A suspect cgroup2 id is unknown until /proc tells it, after the batch.
            let info = info.trusted();
            st.cache.on_fork(tgid, &info, comm);
            note(st, &info);
        }
        KernelEvent::Exec { tgid, info, comm } => {
            st.cache.on_exec(tgid, &info, comm);
            note(st, &info);
        }
        KernelEvent::Exit { tgid } => {
            st.cache.on_exit(tgid, Instant::now());
            if !attaches.is_empty() || !suspects.is_empty() {
                exited_at.insert(tgid, at);
            }
        }
        KernelEvent::CgroupRmdir { hierarchy, id } => st.registry.mark_removed(hierarchy, id),
        KernelEvent::CgroupMkdir {
            hierarchy,
            id,
            path,
        } => match path {
            Some(p) => st.registry.insert(hierarchy, id, &p),
            None => {
                unknown.insert((hierarchy, id));
            }
        },
        KernelEvent::CgroupAttach {
            pid,
            hierarchy,
            id,
            path,
        } => {
            match path {
                Some(p) => st.registry.insert(hierarchy, id, &p),
                None => {
                    unknown.insert((hierarchy, id));
                }
            }
            if hierarchy == 0 || Some(hierarchy) == v1_id {
                // Followed here, in the batch's order, where the cache knows the process: an
                // exit later in the batch keeps this cgroup. The kernel map (or /proc, for a
                // process the cache does not know) waits for the batch's end.
                let known = st.cache.on_attach(pid, hierarchy == 0, id);
                attaches.push((pid, hierarchy, id, known, at));
            }
        }
    }
}

impl super::Lookup for Tracker {
    fn missing(&self, pids: impl Iterator<Item = u32>) -> Vec<u32> {
        let state = self.state();
        pids.filter(|&pid| state.cache.get(pid).is_none()).collect()
    }

    fn look_up(&mut self, pid: u32) -> bool {
        self.resolve(pid).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attach(pid: u32) -> KernelEvent {
        KernelEvent::CgroupAttach {
            pid,
            hierarchy: 0,
            id: 77,
            path: Some("/kubepods.slice/x".into()),
        }
    }

    #[test]
    fn a_migration_is_followed_unless_its_process_exited_later_in_the_batch() {
        let cache = ProcessCache::new(Duration::from_secs(60), 100);
        let mut st = State::on_cgroup2(cache, CgroupRegistry::default());
        let mut later = Deferred::default();
        let batch = [
            KernelEvent::Exit { tgid: 30 }, // before its migration: a reused PID's
            attach(10),
            attach(20),
            attach(30),
            KernelEvent::Exit { tgid: 10 },
            attach(40),
            KernelEvent::Exit { tgid: 40 },
            attach(40), // a new process under the PID
        ];
        for (at, ev) in batch.into_iter().enumerate() {
            apply(&mut st, ev, at, &mut later);
        }
        let followed: Vec<u32> = later.attaches_of_the_running().map(|a| a.0).collect();
        assert_eq!(followed, vec![20, 30, 40]);
    }

    /// A runtime's child moves into its pod and exits within one batch: the exit keeps the
    /// pod's cgroup for the join (the migration is the cache's in the batch's order; only
    /// what needs the kernel map or /proc waits for the batch's end, and not for it).
    #[test]
    fn a_process_that_moved_and_exited_in_one_batch_exits_in_its_new_cgroup() {
        let cache = ProcessCache::new(Duration::from_secs(60), 100);
        let mut st = State::on_cgroup2(cache, CgroupRegistry::default());
        let mut later = Deferred::default();
        let info = ProcInfo::new(Some(5), None, Some(1_000), 1);
        let batch = [
            KernelEvent::Fork {
                tgid: 10,
                info,
                comm: "sleep".into(),
            },
            attach(10),
            KernelEvent::Exit { tgid: 10 },
        ];
        for (at, ev) in batch.into_iter().enumerate() {
            apply(&mut st, ev, at, &mut later);
        }
        let e = st.cache.get(10).expect("its tombstone");
        assert!(!e.is_live());
        assert_eq!(e.cgroup_v2(), Some(77));
        assert_eq!(later.attaches_of_the_running().count(), 0);
    }
}
