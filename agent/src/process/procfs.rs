//! /proc readers: the one start-up walk, single-PID fallback lookups, and the /proc mode.
use std::{
    fs,
    path::{Path, PathBuf},
};

/// What /proc says about one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcRecord {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    /// Nanoseconds since boot, at clock-tick resolution.
    pub start_ns: u64,
    /// (hierarchy id, path) from /proc/PID/cgroup; 0 is cgroup2.
    pub cgroups: Vec<(u32, String)>,
    /// It has exited: a zombie its parent has not reaped yet, or on its way to one.
    pub exited: bool,
}

impl ProcRecord {
    pub fn cgroup_path(&self, hierarchy: u32) -> Option<&str> {
        self.cgroups
            .iter()
            .find(|(h, _)| *h == hierarchy)
            .map(|(_, p)| p.as_str())
    }
}

#[derive(Debug, Clone)]
pub struct Procfs {
    root: PathBuf,
    ns_per_tick: u64,
}

impl Procfs {
    pub fn new(root: &Path) -> Procfs {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let hz = if hz > 0 { hz as u64 } else { 100 };
        Procfs {
            root: root.to_path_buf(),
            ns_per_tick: 1_000_000_000 / hz,
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Thread-group ids (the numeric directories of /proc).
    pub fn pids(&self) -> Vec<u32> {
        let Ok(dir) = fs::read_dir(&self.root) else {
            return vec![];
        };
        dir.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect()
    }

    /// Reads one process; None if it is gone (or `pid` names a thread, not a process).
    pub fn read(&self, pid: u32) -> Option<ProcRecord> {
        let dir = self.root.join(pid.to_string());
        let stat = parse_stat(&fs::read_to_string(dir.join("stat")).ok()?)?;
        let cgroup = fs::read_to_string(dir.join("cgroup")).ok()?;
        Some(ProcRecord {
            pid,
            ppid: stat.ppid,
            exited: stat.exited(),
            start_ns: stat.start_ticks * self.ns_per_tick,
            comm: stat.comm,
            cgroups: parse_cgroup_file(&cgroup),
        })
    }

    /// `read`, None for a process that has exited too (a zombie is still in /proc).
    pub fn read_running(&self, pid: u32) -> Option<ProcRecord> {
        self.read(pid).filter(|r| !r.exited)
    }

    /// (comm, ppid, start ns) from /proc/PID/stat alone: the start-up walk, which has the
    /// cgroups from `cgroup.procs`. None if it is gone or has exited. `buf` is reused
    /// across calls.
    pub fn read_stat(&self, pid: u32, buf: &mut String) -> Option<(String, u32, u64)> {
        use std::io::Read;
        let path = self.root.join(pid.to_string()).join("stat");
        buf.clear();
        fs::File::open(path).ok()?.read_to_string(buf).ok()?;
        let s = parse_stat(buf).filter(|s| !s.exited())?;
        Some((s.comm, s.ppid, s.start_ticks * self.ns_per_tick))
    }

    /// Our own PID as this /proc sees it: not ours when it is another PID namespace's
    /// /proc (a host /proc mounted into the agent's container without hostPID).
    pub fn self_pid(&self) -> Option<u32> {
        fs::read_link(self.root.join("self"))
            .ok()?
            .to_str()?
            .parse()
            .ok()
    }

    /// The command name of a process, from /proc/PID/comm.
    pub fn comm(&self, pid: u32) -> Option<String> {
        let comm = fs::read_to_string(self.root.join(pid.to_string()).join("comm")).ok()?;
        Some(comm.trim_end_matches('\n').to_string())
    }

    /// Whether process `pid`, which started at `start_ns` (0: not known), is still running (not
    /// exiting as a whole), has exited, or is gone with its PID now another process's.
    ///
    /// A thread sets PF_EXITING before it counts itself out of its group, and the kernel's
    /// exit tracepoint runs for the group after the last one has: while any thread is not
    /// exiting, an entry written into the kernel map is one the exit program will delete.
    pub fn liveness(&self, pid: u32, start_ns: u64) -> Liveness {
        let dir = self.root.join(pid.to_string());
        let Some(s) = fs::read_to_string(dir.join("stat"))
            .ok()
            .and_then(|t| parse_stat(&t))
        else {
            return Liveness::Exited;
        };
        // Within two ticks: `start_ns` may be the kernel's, in nanoseconds.
        if start_ns != 0
            && (s.start_ticks * self.ns_per_tick).abs_diff(start_ns) > 2 * self.ns_per_tick
        {
            return Liveness::Replaced;
        }
        if !s.exiting() {
            return Liveness::Running;
        }
        if s.threads <= 1 {
            return Liveness::Exited;
        }
        // The leader is done but other threads may run on (pthread_exit in main): the
        // group lives while any of them is not exiting.
        let Ok(tasks) = fs::read_dir(dir.join("task")) else {
            return Liveness::Exited;
        };
        let running = tasks.flatten().any(|t| {
            fs::read_to_string(t.path().join("stat"))
                .ok()
                .and_then(|t| parse_stat(&t))
                .is_some_and(|s| !s.exiting())
        });
        if running {
            Liveness::Running
        } else {
            Liveness::Exited
        }
    }

    /// The thread-group id of a task id, from /proc/TID/status.
    pub fn tgid_of(&self, tid: u32) -> Option<u32> {
        let status = fs::read_to_string(self.root.join(tid.to_string()).join("status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("Tgid:"))
            .and_then(|v| v.trim().parse().ok())
    }
}

/// See `Procfs::liveness`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    Running,
    /// Exiting, a zombie, or gone.
    Exited,
    /// The PID names a process that started later.
    Replaced,
}

/// PF_EXITING in /proc/PID/stat's flags (field 9), unchanged since Linux 2.6.
const PF_EXITING: u32 = 0x4;

/// What the agent reads of /proc/PID/stat (of a process, or of a thread under task/).
pub struct Stat {
    /// May hold spaces and ')'.
    pub comm: String,
    pub ppid: u32,
    pub start_ticks: u64,
    state: char,
    flags: u32,
    threads: u32,
}

impl Stat {
    /// This task is exiting or has exited.
    fn exiting(&self) -> bool {
        self.flags & PF_EXITING != 0 || matches!(self.state, 'Z' | 'X' | 'x')
    }

    /// The process has exited as a whole: its only thread is exiting or a zombie. (A
    /// leader that exits before its other threads is `Procfs::liveness`'s case.)
    pub fn exited(&self) -> bool {
        self.exiting() && self.threads <= 1
    }
}

pub fn parse_stat(stat: &str) -> Option<Stat> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state); ppid field 4, flags 9, num_threads 20, starttime 22.
    Some(Stat {
        comm,
        ppid: rest.get(1)?.parse().ok()?,
        start_ticks: rest.get(19)?.parse().ok()?,
        state: rest.first()?.chars().next()?,
        flags: rest.get(6)?.parse().ok()?,
        threads: rest.get(17)?.parse().ok()?,
    })
}

/// "hierarchy:controllers:path" lines.
pub fn parse_cgroup_file(text: &str) -> Vec<(u32, String)> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let id = it.next()?.parse().ok()?;
            let _ctrls = it.next()?;
            Some((id, it.next()?.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_odd_comm() {
        let s = "1234 (my (odd) prog) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10";
        let st = parse_stat(s).unwrap();
        assert_eq!(st.comm, "my (odd) prog");
        assert_eq!(st.ppid, 1);
        assert_eq!(st.start_ticks, 98765);
        assert!(!st.exited());
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn stat_says_when_a_process_has_exited() {
        let s = "1234 (a) b) Z 1 1234 1234 0 -1 4194564 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10";
        let t = parse_stat(s).unwrap();
        assert_eq!((t.state, t.flags, t.threads), ('Z', 4194564, 1));
        assert!(t.exited());
        let running = s.replace(" Z ", " S ").replace("4194564", "4194560");
        assert!(!parse_stat(&running).unwrap().exited());
        let flagged = s.replace(" Z ", " R ");
        assert!(parse_stat(&flagged).unwrap().exited(), "PF_EXITING alone");
        // A leader gone before its two other threads: the process may live on.
        let leader_gone = s.replace(" 20 0 1 0 ", " 20 0 3 0 ");
        let t = parse_stat(&leader_gone).unwrap();
        assert!(t.exiting() && !t.exited());
    }

    #[test]
    fn liveness_of_running_exited_and_replaced_processes() {
        let p = Procfs::new(Path::new("/proc"));
        let me = p.read(std::process::id()).unwrap();
        assert_eq!(p.liveness(me.pid, me.start_ns), Liveness::Running);
        assert_eq!(p.liveness(me.pid, me.start_ns + 1), Liveness::Running);
        assert_eq!(
            p.liveness(me.pid, me.start_ns + 3_000_000_000),
            Liveness::Replaced
        );
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let rec = p.read(pid).unwrap();
        // Not reaped yet: a zombie, still in /proc.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while p.liveness(pid, rec.start_ns) != Liveness::Exited {
            assert!(std::time::Instant::now() < deadline, "true never exited");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(
            p.read(pid).unwrap().exited,
            "the zombie is still in /proc, exited"
        );
        assert!(p.read_stat(pid, &mut String::new()).is_none());
        child.wait().unwrap();
        assert_eq!(p.liveness(pid, rec.start_ns), Liveness::Exited);
    }

    #[test]
    fn cgroup_file_hybrid() {
        let v = parse_cgroup_file("6:memory:/kubepods/pod1\n1:name=systemd:/a:b\n0::/\n");
        assert_eq!(
            v,
            vec![
                (6, "/kubepods/pod1".to_string()),
                (1, "/a:b".to_string()),
                (0, "/".to_string())
            ]
        );
    }

    #[test]
    fn reads_self() {
        let p = Procfs::new(Path::new("/proc"));
        let me = p.read(std::process::id()).expect("own /proc entry");
        assert_eq!(me.pid, std::process::id());
        assert!(me.start_ns > 0);
        assert!(me.cgroup_path(0).is_some());
        assert_eq!(p.tgid_of(std::process::id()), Some(std::process::id()));
        assert_eq!(p.comm(std::process::id()), Some(me.comm.clone()));
        assert!(p.pids().contains(&std::process::id()));
    }
}
