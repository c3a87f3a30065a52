//! What the harness changes on the host, and how it gives it back: its work directory (a
//! shared mount of its own), the cgroups the runtimes create, and the files the daemons
//! leave outside their state directories.
use std::{
    ffi::CString,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context, Result};

/// The harness's scratch directory, bind-mounted onto itself and made `rshared`.
///
/// `mountPropagation: HostToContainer` becomes a bind with `rslave` propagation, which
/// dockerd (like containerd's CRI) refuses unless the source sits on a shared or slave
/// mount. systemd makes `/` shared; this VM has no systemd and a private `/`. Rather than
/// change the host's own mounts, the sources live in (or are rbind-mounted into) this
/// shared mount.
pub struct WorkDir {
    pub path: PathBuf,
    mounted: bool,
}

impl WorkDir {
    pub fn create() -> Result<WorkDir> {
        let path = PathBuf::from(format!(
            "/tmp/gpu-agent-e2e-{}-{}",
            std::process::id(),
            tests::random_hex(6)
        ));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        let mut w = WorkDir {
            path,
            mounted: false,
        };
        mount(Some(&w.path), &w.path, None, libc::MS_BIND)?;
        w.mounted = true;
        mount(None, &w.path, None, libc::MS_SHARED | libc::MS_REC)?;
        Ok(w)
    }

    pub fn join(&self, p: &str) -> PathBuf {
        self.path.join(p)
    }

    /// `src` (a host mount tree, e.g. /sys/fs/cgroup) rbind-mounted at `name` inside the
    /// shared work directory: the same filesystems, on a mount that propagates.
    pub fn rbind(&self, src: &Path, name: &str) -> Result<PathBuf> {
        let dst = self.join(name);
        std::fs::create_dir_all(&dst)?;
        mount(Some(src), &dst, None, libc::MS_BIND | libc::MS_REC)?;
        mount(None, &dst, None, libc::MS_SHARED | libc::MS_REC)?;
        Ok(dst)
    }

    /// Unmounts everything under the directory (deepest first) and removes it.
    pub fn remove(&mut self) {
        if !self.mounted && !self.path.exists() {
            return;
        }
        for m in mounts_under(&self.path) {
            let c = CString::new(m.as_os_str().as_encoded_bytes()).expect("no NUL in a path");
            // SAFETY: umount2 with a valid path.
            if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
                eprintln!(
                    "e2e: umount {}: {}",
                    m.display(),
                    std::io::Error::last_os_error()
                );
            }
        }
        self.mounted = false;
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            eprintln!("e2e: removing {}: {e}", self.path.display());
        }
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        self.remove();
    }
}

fn mount(src: Option<&Path>, dst: &Path, fstype: Option<&str>, flags: libc::c_ulong) -> Result<()> {
    let c = |p: &Path| CString::new(p.as_os_str().as_encoded_bytes()).expect("no NUL in a path");
    let src_c = src.map(c);
    let dst_c = c(dst);
    let fs_c = fstype.map(|f| CString::new(f).unwrap());
    // SAFETY: valid NUL-terminated strings or null.
    let rc = unsafe {
        libc::mount(
            src_c.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            dst_c.as_ptr(),
            fs_c.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            flags,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        bail!(
            "mount({:?}, {}, flags {flags:#x}): {}",
            src,
            dst.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Mount points at or under `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut v: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mountinfo)
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    v.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    v.dedup();
    v
}

fn unescape_mountinfo(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Host paths that the daemons create outside their own directories (dockerd 20.10 writes
/// its trust key to /etc/docker/key.json and makes /run/docker/plugins; runc under podman
/// keeps its state in /run/runc; containerd its shims' sockets in /run/containerd/s), and the
/// top cgroups the runtimes create in every hierarchy. Whatever did not exist before the
/// run is removed after it, when empty (cgroups) or when it holds only what the harness's
/// daemons left there.
pub struct HostLeftovers {
    created: Vec<PathBuf>,
    cgroups: Vec<PathBuf>,
}

/// Files and directories that appear on the host when these daemons run here.
const DAEMON_PATHS: &[&str] = &[
    "/etc/docker/key.json",
    "/etc/docker",
    "/run/docker/plugins",
    "/run/docker",
    "/run/runc",
    "/run/libpod",
    "/run/containers/storage",
    "/run/containers",
    "/run/crun",
    "/var/lib/containers/storage",
    "/var/lib/containers",
    "/var/lib/cni",
    "/run/netns",
    "/run/user/0/libpod",
    // containerd 1.6 keeps its shims' sockets in /run/containerd/s whatever its state dir.
    "/run/containerd/s",
    "/run/containerd/runc",
    "/run/containerd",
];

/// Cgroups the runtimes make under each hierarchy root: dockerd `/docker`, podman
/// `/libpod_parent`, the harness's kubelet-style parents `/kubepods`.
const TOP_CGROUPS: &[&str] = &["docker", "libpod_parent", "kubepods"];

impl HostLeftovers {
    pub fn snapshot() -> HostLeftovers {
        let absent = |p: &Path| std::fs::symlink_metadata(p).is_err();
        let created = DAEMON_PATHS
            .iter()
            .map(PathBuf::from)
            .filter(|p| absent(p))
            .collect();
        let cgroups = cgroup_roots()
            .into_iter()
            .flat_map(|r| TOP_CGROUPS.iter().map(move |t| r.join(t)))
            .filter(|p| absent(p))
            .collect();
        HostLeftovers { created, cgroups }
    }

    /// Removes what appeared since the snapshot; says what it could not remove.
    pub fn remove(&self) {
        for cg in &self.cgroups {
            if cg.exists() {
                remove_cgroup_tree(cg);
            }
        }
        // DAEMON_PATHS lists children before parents.
        for p in &self.created {
            let Ok(meta) = std::fs::symlink_metadata(p) else {
                continue;
            };
            let r = if meta.is_dir() {
                std::fs::remove_dir_all(p)
            } else {
                std::fs::remove_file(p)
            };
            if let Err(e) = r {
                eprintln!("e2e: could not remove {}: {e}", p.display());
            }
        }
    }
}

/// Every cgroup hierarchy's root: each v1 controller and the v2 mount.
pub fn cgroup_roots() -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut v = vec![];
    for l in info.lines() {
        let Some((pre, post)) = l.split_once(" - ") else {
            continue;
        };
        let fstype = post.split(' ').next().unwrap_or("");
        let root = pre.split(' ').nth(3).unwrap_or("");
        if (fstype == "cgroup" || fstype == "cgroup2") && root == "/" {
            if let Some(mp) = pre.split(' ').nth(4) {
                v.push(PathBuf::from(unescape_mountinfo(mp)));
            }
        }
    }
    v.sort();
    v.dedup();
    v
}

/// rmdir of a cgroup and its children, deepest first. A cgroup stays busy for a moment
/// after its last process was killed (it is still exiting): retried for up to 5 s, then
/// reported.
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e)
                if e.raw_os_error() == Some(libc::EBUSY)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(e) => {
                eprintln!("e2e: could not remove cgroup {}: {e}", dir.display());
                return;
            }
        }
    }
}

/// `rel` (e.g. `/docker/<id>`) in every hierarchy.
pub fn in_every_hierarchy(rel: &str) -> Vec<PathBuf> {
    cgroup_roots()
        .into_iter()
        .map(|r| r.join(rel.trim_start_matches('/')))
        .collect()
}

/// The directories of `rel` and of its ancestors that do not exist yet, in every
/// hierarchy, deepest first: what a runtime will create for a cgroup parent such as
/// `/kubepods/besteffort/pod<uid>`, and what is the harness's to remove afterwards (an
/// ancestor that already existed is someone else's).
pub fn missing_cgroup_dirs(rel: &str) -> Vec<PathBuf> {
    let mut v = vec![];
    for root in cgroup_roots() {
        let mut p = PathBuf::from(rel.trim_start_matches('/'));
        while !p.as_os_str().is_empty() && !root.join(&p).exists() {
            v.push(root.join(&p));
            p.pop();
        }
    }
    v.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    v
}

/// Removes these cgroup directories (each with what is under it), deepest first.
pub fn remove_cgroup_dirs(dirs: &[PathBuf]) {
    for d in dirs {
        if d.exists() {
            remove_cgroup_tree(d);
        }
    }
}

/// tracefs on the host's /sys/kernel/tracing, as systemd mounts it at boot on a node: the
/// DaemonSet mounts that path read-only and no longer carries CAP_SYS_ADMIN to mount it
/// itself (components/tracefs-mount does). Mounted here only when missing, and unmounted
/// after.
pub struct HostTracefs {
    mounted_here: bool,
}

const TRACEFS: &str = "/sys/kernel/tracing";

impl HostTracefs {
    pub fn ensure() -> Result<HostTracefs> {
        let mounted = std::fs::read_to_string("/proc/self/mountinfo")?
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(TRACEFS) && l.contains(" - tracefs "));
        if mounted {
            return Ok(HostTracefs {
                mounted_here: false,
            });
        }
        let ok = std::process::Command::new("mount")
            .args(["-t", "tracefs", "tracefs", TRACEFS])
            .status()?
            .success();
        anyhow::ensure!(ok, "mount -t tracefs tracefs {TRACEFS} failed");
        eprintln!("e2e: mounted tracefs on {TRACEFS} (as systemd does on a node); unmounted after");
        Ok(HostTracefs { mounted_here: true })
    }

    pub fn restore(self) {
        if self.mounted_here {
            let _ = std::process::Command::new("umount").arg(TRACEFS).status();
        }
    }
}

/// After cleanup: no container cgroup, mount, process or directory of the run is left.
pub fn nothing_left(work: &Path, cgroups: &[PathBuf]) -> Result<(), String> {
    let mut left = vec![];
    if work.exists() {
        left.push(format!("{} still exists", work.display()));
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let w = work.to_string_lossy();
    if info.lines().any(|l| l.contains(&*w)) {
        left.push(format!("mounts under {w} remain"));
    }
    for p in cgroups {
        if p.exists() {
            left.push(format!("cgroup {}", p.display()));
        }
    }
    // Daemons and shims whose command line names the work directory.
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&*w) {
                left.push(format!(
                    "process {} still runs",
                    e.file_name().to_string_lossy()
                ));
            }
        }
    }
    if left.is_empty() {
        Ok(())
    } else {
        Err(left.join("; "))
    }
}
