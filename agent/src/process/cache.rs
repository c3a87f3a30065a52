//! The PID -> process cache userspace keeps from the kernel's notifications. Identity is
//! (tgid, start time): a PID seen again with another start time is another process.
use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use agent_common::ProcInfo;

use crate::ebpf::events::comm_str;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessEntry {
    pub pid: u32,
    /// Nanoseconds since boot; 0 while unknown.
    pub start_ns: u64,
    pub ppid: u32,
    pub comm: String,
    pub cgroup_v2: Option<u64>,
    pub cgroup_v1: Option<u64>,
    /// Set when the process exited: a tombstone, joinable until it expires.
    pub exited_at: Option<Instant>,
}

impl ProcessEntry {
    fn from_kernel(pid: u32, info: &ProcInfo, comm: String) -> ProcessEntry {
        ProcessEntry {
            pid,
            start_ns: if info.start_known() { info.start_ns } else { 0 },
            ppid: info.ppid,
            comm,
            cgroup_v2: info.v2_known().then_some(info.cgroup_id),
            cgroup_v1: info.v1_known().then_some(info.cgroup_v1_id),
            exited_at: None,
        }
    }

    pub fn is_live(&self) -> bool {
        self.exited_at.is_none()
    }
}

#[derive(Debug)]
pub struct ProcessCache {
    procs: HashMap<u32, ProcessEntry>,
    tombstone: Duration,
}

impl ProcessCache {
    pub fn new(tombstone: Duration) -> ProcessCache {
        ProcessCache {
            procs: HashMap::new(),
            tombstone,
        }
    }

    /// A new thread group. It replaces whatever the PID meant before (reuse).
    pub fn on_fork(&mut self, tgid: u32, info: &ProcInfo, comm: String) {
        self.procs
            .insert(tgid, ProcessEntry::from_kernel(tgid, info, comm));
    }

    /// exec keeps the process (same tgid, same start) but refreshes its image and cgroup.
    pub fn on_exec(&mut self, tgid: u32, info: &ProcInfo, comm: String) {
        match self.procs.get_mut(&tgid) {
            Some(e) if e.is_live() => {
                e.comm = comm;
                if info.v2_known() {
                    e.cgroup_v2 = Some(info.cgroup_id);
                }
                if info.v1_known() {
                    e.cgroup_v1 = Some(info.cgroup_v1_id);
                }
                if e.start_ns == 0 && info.start_known() {
                    e.start_ns = info.start_ns;
                }
            }
            _ => {
                self.procs
                    .insert(tgid, ProcessEntry::from_kernel(tgid, info, comm));
            }
        }
    }

    pub fn on_exit(&mut self, tgid: u32, now: Instant) {
        if let Some(e) = self.procs.get_mut(&tgid) {
            e.exited_at.get_or_insert(now);
        }
    }

    /// A migration. Returns false when the PID is unknown to the cache.
    pub fn on_attach(&mut self, tgid: u32, v2: bool, cgroup_id: u64) -> bool {
        match self.procs.get_mut(&tgid) {
            Some(e) if e.is_live() => {
                if v2 {
                    e.cgroup_v2 = Some(cgroup_id);
                } else {
                    e.cgroup_v1 = Some(cgroup_id);
                }
                true
            }
            _ => false,
        }
    }

    /// Resync: make the entry equal to the kernel's, keeping what only userspace knows.
    pub fn upsert_kernel(&mut self, tgid: u32, info: &ProcInfo) {
        let fresh = ProcessEntry::from_kernel(tgid, info, comm_str(&info.comm));
        match self.procs.get_mut(&tgid) {
            Some(e) if e.is_live() && (fresh.start_ns == 0 || e.start_ns == fresh.start_ns) => {
                // An exec whose notification was lost renamed it.
                if !fresh.comm.is_empty() {
                    e.comm = fresh.comm;
                }
                if fresh.cgroup_v2.is_some() {
                    e.cgroup_v2 = fresh.cgroup_v2;
                }
                if fresh.cgroup_v1.is_some() {
                    e.cgroup_v1 = fresh.cgroup_v1;
                }
                if e.ppid == 0 {
                    e.ppid = fresh.ppid;
                }
            }
            _ => {
                self.procs.insert(tgid, fresh);
            }
        }
    }

    /// Insert or replace from a /proc record (start-up walk, fallback lookups, /proc mode).
    pub fn upsert(&mut self, entry: ProcessEntry) {
        self.procs.insert(entry.pid, entry);
    }

    /// After a resync or rescan: live entries not in `live` have exited while nobody was
    /// told. Returns how many were retired.
    pub fn retire_missing(&mut self, live: &HashSet<u32>, now: Instant) -> usize {
        let mut n = 0;
        for e in self.procs.values_mut() {
            if e.is_live() && !live.contains(&e.pid) {
                e.exited_at = Some(now);
                n += 1;
            }
        }
        n
    }

    pub fn gc(&mut self, now: Instant) {
        let keep = self.tombstone;
        self.procs
            .retain(|_, e| e.exited_at.is_none_or(|t| now.duration_since(t) < keep));
    }

    pub fn get(&self, pid: u32) -> Option<&ProcessEntry> {
        self.procs.get(&pid)
    }

    pub fn get_mut(&mut self, pid: u32) -> Option<&mut ProcessEntry> {
        self.procs.get_mut(&pid)
    }

    pub fn iter(&self) -> impl Iterator<Item = &ProcessEntry> {
        self.procs.values()
    }

    pub fn live_count(&self) -> usize {
        self.procs.values().filter(|e| e.is_live()).count()
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

    fn info(cg: u64, start: u64) -> ProcInfo {
        ProcInfo::new(Some(cg), None, Some(start), 1)
    }

    #[test]
    fn fork_exec_exit_tombstone() {
        let mut c = ProcessCache::new(Duration::from_secs(5));
        let t0 = Instant::now();
        c.on_fork(10, &info(100, 5), "sh".into());
        c.on_exec(10, &info(200, 0), "python".into());
        let e = c.get(10).unwrap();
        assert_eq!(
            (e.cgroup_v2, e.start_ns, e.comm.as_str()),
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
        let mut c = ProcessCache::new(Duration::from_secs(5));
        c.on_fork(10, &info(100, 5), "a".into());
        c.on_exit(10, Instant::now());
        c.on_fork(10, &info(300, 9), "b".into());
        let e = c.get(10).unwrap();
        assert!(e.is_live());
        assert_eq!((e.cgroup_v2, e.start_ns), (Some(300), 9));
        // An attach for a tombstoned or unknown pid is not applied.
        assert!(!c.on_attach(11, true, 1));
    }

    #[test]
    fn resync_replaces_other_identity_and_retires_missing() {
        let mut c = ProcessCache::new(Duration::from_secs(5));
        c.on_fork(10, &info(100, 5), "a".into());
        c.on_fork(11, &info(100, 6), "b".into());
        // The kernel says pid 10 is now another process, and 11 is gone.
        c.upsert_kernel(10, &info(400, 50));
        let live: HashSet<u32> = [10].into();
        assert_eq!(c.retire_missing(&live, Instant::now()), 1);
        assert_eq!(c.get(10).unwrap().cgroup_v2, Some(400));
        assert_eq!(c.get(10).unwrap().start_ns, 50);
        assert!(!c.get(11).unwrap().is_live());
    }

    #[test]
    fn exec_without_known_process_creates_partial_entry() {
        let mut c = ProcessCache::new(Duration::from_secs(5));
        let partial = ProcInfo::new(Some(7), None, None, 0);
        c.on_exec(42, &partial, "x".into());
        let e = c.get(42).unwrap();
        assert_eq!((e.cgroup_v2, e.cgroup_v1, e.start_ns), (Some(7), None, 0));
    }
}
