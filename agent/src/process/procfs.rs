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
        let stat = fs::read_to_string(dir.join("stat")).ok()?;
        let (comm, ppid, start_ticks) = parse_stat(&stat)?;
        let cgroup = fs::read_to_string(dir.join("cgroup")).ok()?;
        Some(ProcRecord {
            pid,
            ppid,
            comm,
            start_ns: start_ticks * self.ns_per_tick,
            cgroups: parse_cgroup_file(&cgroup),
        })
    }

    /// (comm, ppid, start ns) from /proc/PID/stat alone: the start-up walk, which has the
    /// cgroups from `cgroup.procs`. `buf` is reused across calls.
    pub fn read_stat(&self, pid: u32, buf: &mut String) -> Option<(String, u32, u64)> {
        use std::io::Read;
        let path = self.root.join(pid.to_string()).join("stat");
        buf.clear();
        fs::File::open(path).ok()?.read_to_string(buf).ok()?;
        let (comm, ppid, start_ticks) = parse_stat(buf)?;
        Some((comm, ppid, start_ticks * self.ns_per_tick))
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

    /// The thread-group id of a task id, from /proc/TID/status.
    pub fn tgid_of(&self, tid: u32) -> Option<u32> {
        let status = fs::read_to_string(self.root.join(tid.to_string()).join("status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("Tgid:"))
            .and_then(|v| v.trim().parse().ok())
    }
}

/// (comm, ppid, starttime in ticks) from /proc/PID/stat. comm may hold spaces and ')'.
pub fn parse_stat(stat: &str) -> Option<(String, u32, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state); ppid is field 4, starttime field 22.
    let ppid = rest.get(1)?.parse().ok()?;
    let start = rest.get(19)?.parse().ok()?;
    Some((comm, ppid, start))
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
        let (comm, ppid, start) = parse_stat(s).unwrap();
        assert_eq!(comm, "my (odd) prog");
        assert_eq!(ppid, 1);
        assert_eq!(start, 98765);
        assert!(parse_stat("garbage").is_none());
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
