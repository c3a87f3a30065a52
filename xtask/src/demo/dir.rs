//! The demo's own directory, /run/gpu-agent-demo: its sockets, scenario, configuration,
//! logs, and the names its processes run under. One demo at a time holds it (an flock on
//! the directory). Each cgroup directory the demo makes is written down there as it is
//! made, so that what a demo killed outright (SIGKILL, where no handler runs) left is
//! removed by the next one before it starts.
use std::{
    fs::{self, File, OpenOptions},
    io::Write,
    os::unix::{fs::PermissionsExt, io::AsRawFd},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use tests::cgroups::TestCgroup;

pub const DIR: &str = "/run/gpu-agent-demo";
const LEDGER: &str = "cgroups";

pub struct DemoDir {
    path: PathBuf,
    _lock: File,
}

impl DemoDir {
    /// Takes the directory, after sweeping what a killed demo left in and beside it.
    pub fn claim() -> Result<DemoDir> {
        let path = PathBuf::from(DIR);
        fs::create_dir_all(&path).with_context(|| format!("creating {DIR}"))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o700))?;
        let lock = File::open(&path)?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            bail!("another `cargo xtask demo` is running (it holds {DIR})");
        }
        let swept = sweep(&path.join(LEDGER));
        if swept > 0 {
            eprintln!("xtask: removed {swept} cgroups that a killed demo left");
        }
        for entry in fs::read_dir(&path)? {
            let p = entry?.path();
            let _ = fs::remove_dir_all(&p).or_else(|_| fs::remove_file(&p));
        }
        Ok(DemoDir { path, _lock: lock })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn ledger(&self) -> Ledger {
        Ledger(self.path.join(LEDGER))
    }

    /// Removes what is left of the demo's cgroups, then the directory; returns the
    /// cgroups that could not go (another program's cgroups are inside them now).
    pub fn finish(mut self) -> Vec<PathBuf> {
        self.remove()
    }

    /// The ledger's cgroups first, while the ledger is there to name them; then the
    /// directory, ledger and all. Once: `finish` and drop both come here.
    fn remove(&mut self) -> Vec<PathBuf> {
        if !self.path.exists() {
            return vec![];
        }
        let ledger = self.path.join(LEDGER);
        sweep(&ledger);
        let left = read_ledger(&ledger)
            .into_iter()
            .filter(|d| d.exists())
            .collect();
        let _ = fs::remove_dir_all(&self.path);
        left
    }
}

/// On a panic, where `finish` is not reached, the ledger's cgroups go too, before the
/// directory and the ledger with it: the ledger is the only list of them.
impl Drop for DemoDir {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Where the demo writes down the cgroup directories it makes.
#[derive(Clone)]
pub struct Ledger(PathBuf);

impl Ledger {
    pub fn record(&self, cgroup: &TestCgroup) -> Result<()> {
        let mut f = OpenOptions::new().create(true).append(true).open(&self.0)?;
        for dir in cgroup.created() {
            writeln!(f, "{}", dir.display())?;
        }
        Ok(())
    }
}

fn read_ledger(path: &Path) -> Vec<PathBuf> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(PathBuf::from)
        .collect()
}

/// Kills what is left in the ledger's cgroups and removes them, deepest first; returns how
/// many it removed.
fn sweep(ledger: &Path) -> usize {
    let mut removed = 0;
    for dir in read_ledger(ledger).iter().rev() {
        if !dir.starts_with(tests::cgroups::v2_mount()) || !dir.is_dir() || has_children(dir) {
            continue;
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                // SAFETY: signalling a process left in the demo's own cgroup.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            if fs::remove_dir(dir).is_ok() {
                removed += 1;
                break;
            }
            if Instant::now() > deadline {
                eprintln!("xtask: could not remove {}", dir.display());
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    removed
}

/// A cgroup with cgroups below it (someone else's, when the demo's are gone): left alone.
fn has_children(dir: &Path) -> bool {
    fs::read_dir(dir)
        .map(|mut r| r.any(|e| e.is_ok_and(|e| e.path().is_dir())))
        .unwrap_or(false)
}
