//! The PID -> process cache userspace keeps from the kernel's notifications. Identity is
//! (tgid, start time): a PID seen again with another start time is another process.
use std::{
    collections::{HashSet, VecDeque},
    num::{NonZeroU32, NonZeroU64},
    time::{Duration, Instant},
};

use hashbrown::hash_table::{Entry, HashTable};
use rustc_hash::FxBuildHasher;

use agent_common::ProcInfo;

use crate::ebpf::events::comm_str;
pub use crate::ebpf::events::Comm;

/// 56 bytes, stored in the table as they are (the PID is the key): a large node keeps
/// 50,000 of them, and each byte here is 64 KiB of its table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessEntry {
    pub pid: u32,
    /// Nanoseconds since boot; 0 while unknown.
    pub start_ns: u64,
    pub ppid: u32,
    pub comm: Comm,
    /// The kernel numbers cgroups from 1: none is 0, so "unknown" costs no extra word.
    cgroup_v2: Option<NonZeroU64>,
    cgroup_v1: Option<NonZeroU64>,
    /// Set when the process exited: a tombstone, joinable until it expires. The cache's
    /// count of exits, not a time: the time is kept once, in the cache's exit queue.
    exit: Option<NonZeroU32>,
}

impl ProcessEntry {
    pub fn new(
        pid: u32,
        start_ns: u64,
        ppid: u32,
        comm: Comm,
        cgroup_v2: Option<u64>,
        cgroup_v1: Option<u64>,
    ) -> ProcessEntry {
        ProcessEntry {
            pid,
            start_ns,
            ppid,
            comm,
            cgroup_v2: cgroup_v2.and_then(NonZeroU64::new),
            cgroup_v1: cgroup_v1.and_then(NonZeroU64::new),
            exit: None,
        }
    }

    fn from_kernel(pid: u32, info: &ProcInfo, comm: Comm) -> ProcessEntry {
        ProcessEntry::new(
            pid,
            if info.start_known() { info.start_ns } else { 0 },
            info.ppid,
            comm,
            info.v2_known().then_some(info.cgroup_id),
            info.v1_known().then_some(info.cgroup_v1_id),
        )
    }

    /// The cgroup2 cgroup's id, when known.
    pub fn cgroup_v2(&self) -> Option<u64> {
        self.cgroup_v2.map(NonZeroU64::get)
    }

    /// The followed v1 hierarchy's cgroup id, when known.
    pub fn cgroup_v1(&self) -> Option<u64> {
        self.cgroup_v1.map(NonZeroU64::get)
    }

    pub fn set_cgroup_v2(&mut self, id: u64) {
        self.cgroup_v2 = NonZeroU64::new(id).or(self.cgroup_v2);
    }

    pub fn set_cgroup_v1(&mut self, id: u64) {
        self.cgroup_v1 = NonZeroU64::new(id).or(self.cgroup_v1);
    }

    pub fn is_live(&self) -> bool {
        self.exit.is_none()
    }
}

fn hash(pid: u32) -> u64 {
    use std::hash::BuildHasher;
    FxBuildHasher.hash_one(pid)
}

#[derive(Debug)]
pub struct ProcessCache {
    /// Keyed by the entry's own PID (a map would keep it twice, with padding: 88 bytes a
    /// slot, 56 here). Fx: PIDs are the kernel's, looked up per event and per GPU process
    /// each cycle.
    procs: HashTable<ProcessEntry>,
    tombstone: Duration,
    /// Exits in order, for the cap and the expiry: (pid, exit number, when); an entry whose
    /// PID was reused or collected since is skipped.
    exits: VecDeque<(u32, NonZeroU32, Instant)>,
    /// The last exit's number (wraps, skipping 0).
    exit_seq: u32,
    tombstones: usize,
    max_tombstones: usize,
    evicted: u64,
}

impl ProcessCache {
    /// Exited processes stay joinable for `tombstone`, at most `max_tombstones` of them (an
    /// exit storm evicts the oldest first).
    pub fn new(tombstone: Duration, max_tombstones: usize) -> ProcessCache {
        ProcessCache {
            procs: HashTable::new(),
            tombstone,
            exits: VecDeque::new(),
            exit_seq: 0,
            tombstones: 0,
            max_tombstones,
            evicted: 0,
        }
    }

    /// Every insert goes through here, so that the tombstone count stays exact.
    fn put(&mut self, entry: ProcessEntry) {
        let pid = entry.pid;
        match self
            .procs
            .entry(hash(pid), |e| e.pid == pid, |e| hash(e.pid))
        {
            Entry::Occupied(mut o) => {
                if !o.get().is_live() {
                    self.tombstones -= 1;
                }
                *o.get_mut() = entry;
            }
            Entry::Vacant(v) => {
                v.insert(entry);
            }
        }
    }

    fn find_mut(&mut self, pid: u32) -> Option<&mut ProcessEntry> {
        self.procs.find_mut(hash(pid), |e| e.pid == pid)
    }

    /// Marks a live entry exited, evicting the oldest tombstones beyond the cap.
    fn bury(&mut self, pid: u32, now: Instant) {
        let seq = NonZeroU32::new(self.exit_seq.wrapping_add(1)).unwrap_or(NonZeroU32::MIN);
        let Some(e) = self.find_mut(pid).filter(|e| e.is_live()) else {
            return;
        };
        e.exit = Some(seq);
        self.exit_seq = seq.get();
        self.tombstones += 1;
        self.exits.push_back((pid, seq, now));
        while self.tombstones > self.max_tombstones {
            match self.forget_oldest_exit() {
                Some(true) => self.evicted += 1,
                Some(false) => {}
                None => break,
            }
        }
    }

    /// Pops the oldest exit and removes its tombstone if it is still that one (the pid may
    /// have been reused). None when there is no exit left; else whether one was removed.
    fn forget_oldest_exit(&mut self) -> Option<bool> {
        let (pid, seq, _) = self.exits.pop_front()?;
        let same = self
            .procs
            .find_entry(hash(pid), |e| e.pid == pid && e.exit == Some(seq))
            .map(|o| o.remove())
            .is_ok();
        if same {
            self.tombstones -= 1;
        }
        Some(same)
    }

    /// Tombstones evicted by the cap before they expired.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    pub fn tombstone_count(&self) -> usize {
        self.tombstones
    }

    /// A new thread group. It replaces whatever the PID meant before (reuse).
    pub fn on_fork(&mut self, tgid: u32, info: &ProcInfo, comm: Comm) {
        self.put(ProcessEntry::from_kernel(tgid, info, comm));
    }

    /// exec keeps the process (same tgid, same start) but refreshes its image and cgroup.
    pub fn on_exec(&mut self, tgid: u32, info: &ProcInfo, comm: Comm) {
        match self.find_mut(tgid) {
            Some(e) if e.is_live() => {
                e.comm = comm;
                if info.v2_known() {
                    e.set_cgroup_v2(info.cgroup_id);
                }
                if info.v1_known() {
                    e.set_cgroup_v1(info.cgroup_v1_id);
                }
                if e.start_ns == 0 && info.start_known() {
                    e.start_ns = info.start_ns;
                }
            }
            _ => self.put(ProcessEntry::from_kernel(tgid, info, comm)),
        }
    }

    pub fn on_exit(&mut self, tgid: u32, now: Instant) {
        self.bury(tgid, now);
    }

    /// A migration. Returns false when the PID is unknown to the cache.
    pub fn on_attach(&mut self, tgid: u32, v2: bool, cgroup_id: u64) -> bool {
        match self.find_mut(tgid) {
            Some(e) if e.is_live() => {
                if v2 {
                    e.set_cgroup_v2(cgroup_id);
                } else {
                    e.set_cgroup_v1(cgroup_id);
                }
                true
            }
            _ => false,
        }
    }

    /// Resync: make the entry equal to the kernel's, keeping what only userspace knows.
    pub fn upsert_kernel(&mut self, tgid: u32, info: &ProcInfo) {
        let fresh = ProcessEntry::from_kernel(tgid, info, comm_str(&info.comm));
        match self.find_mut(tgid) {
            Some(e) if e.is_live() && (fresh.start_ns == 0 || e.start_ns == fresh.start_ns) => {
                // An exec whose notification was lost renamed it.
                if !fresh.comm.is_empty() {
                    e.comm = fresh.comm;
                }
                e.cgroup_v2 = fresh.cgroup_v2.or(e.cgroup_v2);
                e.cgroup_v1 = fresh.cgroup_v1.or(e.cgroup_v1);
                if e.ppid == 0 {
                    e.ppid = fresh.ppid;
                }
            }
            _ => self.put(fresh),
        }
    }

    /// Insert or replace from a /proc record (start-up walk, fallback lookups, /proc mode).
    pub fn upsert(&mut self, entry: ProcessEntry) {
        self.put(entry);
    }

    /// After a resync or rescan: live entries not in `live` have exited while nobody was
    /// told. Returns how many were retired.
    pub fn retire_missing(&mut self, live: &HashSet<u32>, now: Instant) -> usize {
        let gone: Vec<u32> = self
            .procs
            .iter()
            .filter(|e| e.is_live() && !live.contains(&e.pid))
            .map(|e| e.pid)
            .collect();
        for &pid in &gone {
            self.bury(pid, now);
        }
        gone.len()
    }

    pub fn gc(&mut self, now: Instant) {
        // Every tombstone is in `exits`, oldest first: only the expired ones are visited,
        // never the (tens of thousands of) live processes.
        while self
            .exits
            .front()
            .is_some_and(|&(_, _, at)| now.duration_since(at) >= self.tombstone)
        {
            self.forget_oldest_exit();
        }
    }

    pub fn get(&self, pid: u32) -> Option<&ProcessEntry> {
        self.procs.find(hash(pid), |e| e.pid == pid)
    }

    /// A live process's command, learnt late (from /proc, after lost notifications).
    pub fn set_comm(&mut self, pid: u32, comm: Comm) {
        if let Some(e) = self.find_mut(pid).filter(|e| e.is_live()) {
            e.comm = comm;
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &ProcessEntry> {
        self.procs.iter()
    }

    pub fn live_count(&self) -> usize {
        self.procs.len() - self.tombstones
    }

    pub fn len(&self) -> usize {
        self.procs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A large node keeps 50,000 of these: the command is inline, not a heap string.
    #[test]
    fn an_entry_is_small() {
        assert!(
            size_of::<ProcessEntry>() <= 56,
            "{}",
            size_of::<ProcessEntry>()
        );
    }

    fn info(cg: u64, start: u64) -> ProcInfo {
        ProcInfo::new(Some(cg), None, Some(start), 1)
    }

    #[test]
    fn fork_exec_exit_tombstone() {
        let mut c = ProcessCache::new(Duration::from_secs(5), 1000);
        let t0 = Instant::now();
        c.on_fork(10, &info(100, 5), "sh".into());
        c.on_exec(10, &info(200, 0), "python".into());
        let e = c.get(10).unwrap();
        assert_eq!(
            (e.cgroup_v2(), e.start_ns, e.comm.as_str()),
            (Some(200), 5, "python")
        );
        c.on_exit(10, t0);
        assert!(!c.get(10).unwrap().is_live());
        assert_eq!(c.live_count(), 0);
        c.gc(t0 + Duration::from_secs(1));
        assert!(c.get(10).is_some(), "tombstone still joinable");
        c.gc(t0 + Duration::from_secs(6));
        assert!(c.get(10).is_none());
    }

    #[test]
    fn pid_reuse_replaces_tombstone() {
        let mut c = ProcessCache::new(Duration::from_secs(5), 1000);
        c.on_fork(10, &info(100, 5), "a".into());
        c.on_exit(10, Instant::now());
        c.on_fork(10, &info(300, 9), "b".into());
        let e = c.get(10).unwrap();
        assert!(e.is_live());
        assert_eq!((e.cgroup_v2(), e.start_ns), (Some(300), 9));
        // An attach for a tombstoned or unknown pid is not applied.
        assert!(!c.on_attach(11, true, 1));
    }

    #[test]
    fn resync_replaces_other_identity_and_retires_missing() {
        let mut c = ProcessCache::new(Duration::from_secs(5), 1000);
        c.on_fork(10, &info(100, 5), "a".into());
        c.on_fork(11, &info(100, 6), "b".into());
        // The kernel says pid 10 is now another process, and 11 is gone.
        c.upsert_kernel(10, &info(400, 50));
        let live: HashSet<u32> = [10].into();
        assert_eq!(c.retire_missing(&live, Instant::now()), 1);
        assert_eq!(c.get(10).unwrap().cgroup_v2(), Some(400));
        assert_eq!(c.get(10).unwrap().start_ns, 50);
        assert!(!c.get(11).unwrap().is_live());
    }

    #[test]
    fn exec_without_known_process_creates_partial_entry() {
        let mut c = ProcessCache::new(Duration::from_secs(5), 1000);
        let partial = ProcInfo::new(Some(7), None, None, 0);
        c.on_exec(42, &partial, "x".into());
        let e = c.get(42).unwrap();
        assert_eq!(
            (e.cgroup_v2(), e.cgroup_v1(), e.start_ns),
            (Some(7), None, 0)
        );
    }

    #[test]
    fn an_exit_storm_evicts_the_oldest_tombstones_beyond_the_cap() {
        let mut c = ProcessCache::new(Duration::from_secs(600), 3);
        let t0 = Instant::now();
        for pid in 1..=10 {
            c.on_fork(pid, &info(1, pid as u64), "x".into());
        }
        for pid in 1..=8 {
            c.on_exit(pid, t0 + Duration::from_millis(pid as u64));
        }
        assert_eq!((c.tombstone_count(), c.evicted()), (3, 5));
        assert!(c.get(5).is_none() && c.get(6).is_some_and(|e| !e.is_live()));
        assert_eq!(c.live_count(), 2);
        // A reused PID is live again: it leaves the count, and the cap still holds.
        c.on_fork(8, &info(1, 99), "y".into());
        assert_eq!((c.tombstone_count(), c.live_count()), (2, 3));
        c.gc(t0 + Duration::from_secs(601));
        assert_eq!((c.tombstone_count(), c.len()), (0, 3));
    }
}
