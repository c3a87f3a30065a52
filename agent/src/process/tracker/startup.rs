//! The tracker's one start-up walk: the kernel iterates its own tasks into its map where it
//! can, else /proc is read (stat files on a few threads) and the cgroup hierarchy walked.
use std::{sync::atomic::Ordering::Relaxed, time::Instant};

use super::{entry_from_record, kernel_info, Tracker};
use crate::{
    process::{
        cache::ProcessEntry,
        cgroup::{CgroupRegistry, Hierarchies, Hierarchy},
        procfs::Procfs,
    },
    stats::Stats,
};

impl Tracker {
    /// The one start-up walk. In eBPF mode the programs are already attached, and where
    /// the kernel can iterate its tasks it fills its own map (`startup_iterated`);
    /// otherwise /proc is read (`startup_from_procfs`). Then the cache is read back from
    /// the kernel map.
    pub fn startup(&mut self) {
        let started = Instant::now();
        let (source, phases) = match self.startup_iterated(started) {
            Some(p) => ("task_iterator", p),
            None => ("procfs", self.startup_from_procfs(started)),
        };
        // Processes that exited while the walk ran: the seed or the iterator may have written
        // their entries after the kernel deleted them at exit.
        self.apply_queued_with(true);
        let seeded = started.elapsed().as_millis() as u64;
        if self.source.is_some() {
            self.read_counters();
            self.resync_from_kernel();
        }
        self.publish_gauges();
        let total = started.elapsed().as_millis() as u64;
        self.stats.startup_walk_ms.store(total, Relaxed);
        *self.stats.startup_source.write().unwrap() = source;
        let Phases {
            cgroups_ms,
            processes_ms,
        } = phases;
        tracing::info!(
            source,
            total_ms = total,
            cgroups_ms,
            processes_ms,
            seed_ms = seeded.saturating_sub(cgroups_ms.max(processes_ms)),
            kernel_resync_ms = total - seeded,
            processes = self.state.read().unwrap().cache.live_count(),
            "start-up walk done"
        );
        // The walk's transient buffers are freed: give the pages back.
        // SAFETY: malloc_trim has no preconditions.
        unsafe { libc::malloc_trim(0) };
    }

    /// The kernel's task iterator fills the kernel map (no /proc read and no insert from
    /// here per process) while this thread's helper walks the cgroup filesystem. None
    /// where it cannot run: no eBPF, no BTF, a kernel before 5.8, or an agent outside the
    /// initial PID namespace (the iterator sees only the reader's namespace).
    fn startup_iterated(&mut self, started: Instant) -> Option<Phases> {
        let src = self.source.as_mut()?;
        let why_not = match (src.task_iter_unavailable(), in_initial_pid_namespace()) {
            (Some(why), _) => Some(why.to_string()),
            (None, false) => Some("the agent is not in the host's PID namespace".into()),
            (None, true) => None,
        };
        if let Some(why) = why_not {
            tracing::info!(reason = %why, "no task iterator: the start-up walk reads /proc");
            return None;
        }
        let mut guard = self.state.write().unwrap();
        let st = &mut *guard;
        let hier = st.hierarchies.clone();
        let registry = &mut st.registry;
        let (procfs, stats) = (&self.procfs, &self.stats);
        let (tasks, cgroups_ms, processes_ms) = std::thread::scope(|s| {
            let walker = s.spawn(|| {
                Members::walk(registry, &hier, false, stats);
                started.elapsed().as_millis() as u64
            });
            // The kernel's list, then /proc's (names only: one readdir) to find what the
            // iterator did not visit.
            let tasks = src.iterate_tasks().map(|mut t| {
                t.sort_unstable();
                (t, procfs.pids())
            });
            let processes_ms = started.elapsed().as_millis() as u64;
            (tasks, walker.join().unwrap_or(0), processes_ms)
        });
        let (visited, listed) = match tasks {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "the task iterator failed: the start-up walk reads /proc");
                return None;
            }
        };
        // Some kernels never show PID 1 to the iterator (6.18 here), and a full map holds
        // only some of what it visited: the rest is read from /proc, as the walk without an
        // iterator reads every process, and kept in the cache if the map has no room.
        let known = match src.counters().map_full {
            0 => visited,
            _ => {
                let mut in_map: Vec<u32> = src.snapshot().into_iter().map(|(k, _)| k).collect();
                in_map.sort_unstable();
                in_map
            }
        };
        let mut seed = vec![];
        for pid in listed {
            if known.binary_search(&pid).is_ok() {
                continue;
            }
            if let Some(rec) = self.procfs.read_running(pid) {
                let entry = entry_from_record(&mut st.registry, &hier, &rec);
                seed.push((pid, kernel_info(&entry)));
                st.cache.upsert(entry);
            }
        }
        tracing::debug!(
            known = known.len(),
            from_procfs = seed.len(),
            "task iterator"
        );
        self.seed_failures += src.insert_all_absent(&seed);
        Some(Phases {
            cgroups_ms,
            processes_ms,
        })
    }

    /// One cgroup-filesystem walk, which reads each cgroup's members, and one read of
    /// /proc/PID/stat per process, on two threads while the walk runs. In eBPF mode the
    /// walk then fills kernel entries that do not exist yet (the kernel's are fresher).
    fn startup_from_procfs(&mut self, started: Instant) -> Phases {
        let mut guard = self.state.write().unwrap();
        let st = &mut *guard;
        let hier = st.hierarchies.clone();
        let pids = self.procfs.pids();
        let procfs = &self.procfs;
        // cgroup.procs names PIDs as our PID namespace sees them: of use only when /proc is
        // of the same namespace. Else each process is read whole below, and no stat first.
        let same_ns = procfs.self_pid() == Some(std::process::id());
        let (members, rows, cgroups_ms, processes_ms) = std::thread::scope(|s| {
            let readers: Vec<_> = pids
                .chunks(pids.len().div_ceil(STAT_READERS).max(1))
                .filter(|_| same_ns)
                .map(|chunk| s.spawn(move || read_stats(procfs, chunk)))
                .collect();
            let members = Members::walk(&mut st.registry, &hier, same_ns, &self.stats);
            let cgroups_ms = started.elapsed().as_millis() as u64;
            let rows: Vec<StatRow> = match same_ns {
                true => readers
                    .into_iter()
                    .flat_map(|r| r.join().unwrap_or_default())
                    .collect(),
                false => pids.iter().map(|&pid| (pid, None)).collect(),
            };
            (
                members,
                rows,
                cgroups_ms,
                started.elapsed().as_millis() as u64,
            )
        });
        let mut seed = Vec::with_capacity(if self.source.is_some() { rows.len() } else { 0 });
        for (pid, stat) in rows {
            let entry = match (members.of(pid), stat) {
                (Some((cgroup_v2, cgroup_v1)), Some((comm, ppid, start_ns))) => {
                    ProcessEntry::new(pid, start_ns, ppid, comm.into(), cgroup_v2, cgroup_v1)
                }
                (Some(_), None) => continue, // exited meanwhile
                // Not in a cgroup.procs read (it moved, started after, or none was read):
                // all from /proc.
                (None, _) => match self.procfs.read_running(pid) {
                    Some(rec) => entry_from_record(&mut st.registry, &hier, &rec),
                    None => continue,
                },
            };
            if self.source.is_some() {
                seed.push((pid, kernel_info(&entry)));
            }
            // The cache keeps what only /proc knows (comm); the resync below makes the rest
            // equal to the kernel map.
            st.cache.upsert(entry);
        }
        drop(members);
        if let Some(src) = self.source.as_mut() {
            // Map full: the cache still knows them; lookups fall back to /proc.
            self.seed_failures += src.insert_all_absent(&seed);
        }
        Phases {
            cgroups_ms,
            processes_ms,
        }
    }
}

/// Threads reading /proc/PID/stat at start-up, beside the cgroup walk.
const STAT_READERS: usize = 2;

/// How long the start-up walk's two concurrent parts took, from its start.
struct Phases {
    cgroups_ms: u64,
    processes_ms: u64,
}

/// The initial PID namespace has a fixed inode (PROC_PID_INIT_INO) since Linux 3.8.
fn in_initial_pid_namespace() -> bool {
    std::fs::read_link("/proc/self/ns/pid").is_ok_and(|l| l.as_os_str() == "pid:[4026531836]")
}

/// A PID and its (comm, ppid, start ns); None when it exited before the read.
type StatRow = (u32, Option<(String, u32, u64)>);

fn read_stats(procfs: &Procfs, pids: &[u32]) -> Vec<StatRow> {
    let mut buf = String::new();
    pids.iter()
        .map(|&pid| (pid, procfs.read_stat(pid, &mut buf)))
        .collect()
}

/// Who is in which cgroup, from each cgroup's `cgroup.procs`: (pid, id) sorted by pid, per
/// tracked hierarchy.
struct Members {
    read: bool,
    v2: Option<Vec<(u32, u64)>>,
    v1: Option<Vec<(u32, u64)>>,
}

impl Members {
    /// The cgroup walk (counted in `stats`); the members too when `read` (else every
    /// process is read whole).
    fn walk(
        registry: &mut CgroupRegistry,
        hier: &Hierarchies,
        read: bool,
        stats: &Stats,
    ) -> Members {
        let mut walk = |h: &Hierarchy| {
            stats.cgroup_walks.fetch_add(1, Relaxed);
            if !read {
                registry.walk(h);
                return None;
            }
            let mut m = vec![];
            registry.walk_members(h, &mut m);
            m.sort_unstable();
            Some(m)
        };
        let (v2, v1) = (
            hier.v2.as_ref().map(&mut walk),
            hier.v1.as_ref().map(&mut walk),
        );
        Members {
            read,
            v2: v2.flatten(),
            v1: v1.flatten(),
        }
    }

    /// (cgroup2 id, v1 id) of a process found in every tracked hierarchy, else None.
    fn of(&self, pid: u32) -> Option<(Option<u64>, Option<u64>)> {
        if !self.read {
            return None;
        }
        let find = |m: &Option<Vec<(u32, u64)>>| -> Option<Option<u64>> {
            match m {
                None => Some(None),
                Some(m) => {
                    let at = m.binary_search_by_key(&pid, |(p, _)| *p).ok()?;
                    Some(Some(m[at].1))
                }
            }
        };
        Some((find(&self.v2)?, find(&self.v1)?))
    }
}
