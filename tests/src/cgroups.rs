//! Real cgroups shaped like kubelet's, created for a test and removed after it, with the
//! processes put in them.
use std::{
    ffi::CString,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use cgroups_rs::{
    fs::{hierarchies::V1, Cgroup},
    CgroupPid,
};

/// The cgroup2 mount point (/sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts).
pub fn v2_mount() -> PathBuf {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mi.lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            post.starts_with("cgroup2 ")
                .then(|| PathBuf::from(pre.split(' ').nth(4).unwrap()))
        })
        .expect("no cgroup2 mount")
}

/// The v1 memory hierarchy's mount, if this host has one (the agent follows it).
pub fn v1_memory_mount() -> Option<PathBuf> {
    cgroups_rs::fs::hierarchies::mountinfo_self()
        .into_iter()
        .find(|m| m.super_opts.iter().any(|o| o == "memory"))
        .map(|m| m.mount_point)
}

pub struct TestCgroup {
    /// The path as the kernel writes it (relative to the hierarchy root).
    pub path: String,
    pub dir: PathBuf,
    created: Vec<PathBuf>,
    v1: Option<Cgroup>,
}

impl TestCgroup {
    /// A cgroup2 cgroup at `path` (e.g. "/kubepods.slice/.../cri-containerd-<id>.scope").
    pub fn v2(path: &str) -> TestCgroup {
        let mount = v2_mount();
        let created = mkdirs(&mount, path);
        TestCgroup {
            path: path.to_string(),
            dir: mount.join(path.trim_start_matches('/')),
            created,
            v1: None,
        }
    }

    /// A cgroup in the v1 memory hierarchy only, made with cgroups-rs.
    pub fn v1_memory(path: &str) -> Option<TestCgroup> {
        let mount = v1_memory_mount()?;
        let rel = path.trim_start_matches('/');
        // Record which parents we create, so that cleanup removes exactly those.
        let mut created = vec![];
        let mut cur = mount.clone();
        for part in Path::new(rel).components() {
            cur.push(part);
            if !cur.exists() {
                created.push(cur.clone());
            }
        }
        let cg = Cgroup::new_with_specified_controllers(
            Box::new(V1::new()),
            rel,
            Some(vec!["memory".to_string()]),
        )
        .expect("creating the v1 memory cgroup");
        Some(TestCgroup {
            path: path.to_string(),
            dir: mount.join(rel),
            created,
            v1: Some(cg),
        })
    }

    /// The directories this cgroup's creation made, outermost first (what drop removes).
    pub fn created(&self) -> &[PathBuf] {
        &self.created
    }

    pub fn procs(&self) -> Vec<u32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Moves a running process here (a migration: cgroup_attach_task).
    pub fn add(&self, pid: u32) {
        match &self.v1 {
            Some(cg) => cg
                .add_task_by_tgid(CgroupPid::from(pid as u64))
                .expect("moving into the v1 cgroup"),
            None => std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
                .expect("moving into the v2 cgroup"),
        }
    }

    /// Spawns `cmd` so that it enters this cgroup after fork and before exec, as container
    /// runtimes put a container's first process in place.
    pub fn spawn(&self, cmd: &mut Command) -> Child {
        let procs = CString::new(self.dir.join("cgroup.procs").to_str().unwrap()).unwrap();
        // SAFETY: only async-signal-safe calls between fork and exec (no allocation).
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
                libc::close(fd);
                if ok {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        cmd.spawn().expect("spawning into the cgroup")
    }
}

fn mkdirs(mount: &Path, path: &str) -> Vec<PathBuf> {
    let mut created = vec![];
    let mut cur = mount.to_path_buf();
    for part in Path::new(path.trim_start_matches('/')).components() {
        cur.push(part);
        // Tests run in parallel: another may make a shared parent (kubepods.slice) between
        // the check and the mkdir. Then it is that test's to remove.
        if !cur.exists() {
            match std::fs::create_dir(&cur) {
                Ok(()) => created.push(cur.clone()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => panic!("mkdir {}: {e}", cur.display()),
            }
        }
    }
    created
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // Kill what is left inside, then remove the cgroups this test made, deepest first.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let procs = self.procs();
            if procs.is_empty() || Instant::now() > deadline {
                break;
            }
            for p in procs {
                // SAFETY: signalling a test process.
                unsafe { libc::kill(p as i32, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(cg) = self.v1.take() {
            let _ = cg.delete();
        }
        for dir in self.created.iter().rev() {
            for _ in 0..50 {
                if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// A child process that is killed and reaped on drop.
pub struct Proc(pub Child);

impl Proc {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Ground truth: the cgroup path of `pid` in hierarchy `h` ("0" for cgroup2).
pub fn proc_cgroup(pid: u32, h: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()?
        .lines()
        .find_map(|l| {
            let mut it = l.splitn(3, ':');
            let id = it.next()?;
            let ctrls = it.next()?;
            let path = it.next()?;
            (id == h || ctrls.split(',').any(|c| c == h)).then(|| path.to_string())
        })
}

/// `sleep 600`, quiet.
pub fn sleeper() -> Command {
    let mut c = Command::new("sleep");
    c.arg("600").stdout(std::process::Stdio::null());
    c
}

/// Forces the next PID to be `want` through ns_last_pid; retries while other forks race.
pub fn spawn_with_pid(want: u32, cg: &TestCgroup) -> Option<Proc> {
    for _ in 0..200 {
        // Another process has it (another test's, forked meanwhile): it cannot be had.
        if std::path::Path::new(&format!("/proc/{want}")).exists() {
            return None;
        }
        std::fs::write("/proc/sys/kernel/ns_last_pid", (want - 1).to_string()).ok()?;
        let p = Proc(cg.spawn(&mut sleeper()));
        if p.pid() == want {
            return Some(p);
        }
    }
    None
}

/// kubelet, systemd driver, containerd: a burstable pod's container.
pub fn systemd_container(uid: &str, id: &str) -> String {
    let u = uid.replace('-', "_");
    format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{id}.scope"
    )
}

/// kubelet, cgroupfs driver: a best-effort pod's container.
pub fn cgroupfs_container(uid: &str, id: &str) -> String {
    format!("/kubepods/besteffort/pod{uid}/{id}")
}

/// The kubelet's cgroup driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    Systemd,
    Cgroupfs,
}

/// A pod's QoS class, as the kubelet names its cgroups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// A containerd container's cgroup as the kubelet lays it out for `driver` and `qos`
/// (guaranteed pods sit directly under kubepods).
pub fn kubelet_container(driver: Driver, qos: QosClass, uid: &str, id: &str) -> String {
    let class = match qos {
        QosClass::Guaranteed => None,
        QosClass::Burstable => Some("burstable"),
        QosClass::BestEffort => Some("besteffort"),
    };
    match (driver, class) {
        (Driver::Systemd, None) => format!(
            "/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{id}.scope",
            uid.replace('-', "_")
        ),
        (Driver::Systemd, Some(q)) => format!(
            "/kubepods.slice/kubepods-{q}.slice/kubepods-{q}-pod{}.slice/cri-containerd-{id}.scope",
            uid.replace('-', "_")
        ),
        (Driver::Cgroupfs, None) => format!("/kubepods/pod{uid}/{id}"),
        (Driver::Cgroupfs, Some(q)) => format!("/kubepods/{q}/pod{uid}/{id}"),
    }
}

/// The first child of `pid` (e.g. the payload `unshare --fork` starts), waiting for it.
pub fn first_child(pid: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(child) = c.split_whitespace().next() {
            return child.parse().unwrap();
        }
        assert!(Instant::now() < deadline, "{pid} never forked");
        std::thread::sleep(Duration::from_millis(20));
    }
}
