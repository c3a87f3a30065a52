//! Running commands and daemons for the container harness: every failure names the
//! command and carries its stderr; every wait is bounded and gives way to Ctrl-C.
use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Seconds since the run started, for the log: `[  12.3s]`.
pub fn stamp() -> String {
    format!(
        "[{:6.1}s]",
        START.get_or_init(Instant::now).elapsed().as_secs_f64()
    )
}

/// Routes SIGINT, SIGTERM and SIGHUP to a flag that every wait checks, so an interrupted run
/// still cleans up. Call before any thread starts (the mask is inherited by threads; std
/// resets it in children).
pub fn catch_signals() {
    START.get_or_init(Instant::now);
    // SAFETY: sigset manipulation on a local set; pthread_sigmask on this thread only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let set_copy = set;
        std::thread::spawn(move || loop {
            let mut sig = 0;
            if libc::sigwait(&set_copy, &mut sig) == 0 {
                if INTERRUPTED.swap(true, Ordering::SeqCst) {
                    eprintln!("e2e: interrupted again; still cleaning up");
                } else {
                    eprintln!("e2e: interrupted (signal {sig}); cleaning up");
                }
            }
        });
    }
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Fails once interrupted; called between steps.
pub fn check_interrupt() -> Result<()> {
    if interrupted() {
        bail!("interrupted");
    }
    Ok(())
}

/// The command line, for messages.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd` to completion; its stdout (trimmed) on success, an error with its stderr
/// otherwise.
pub fn output(cmd: &mut Command) -> Result<String> {
    let what = describe(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running `{what}`"))?;
    if !out.status.success() {
        bail!(
            "`{what}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Runs `cmd` with its output appended to `log`; an error naming the log on failure.
pub fn logged(cmd: &mut Command, log: &Path) -> Result<()> {
    let what = describe(cmd);
    let f = File::options().create(true).append(true).open(log)?;
    let status = cmd
        .stdin(Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f)
        .status()
        .with_context(|| format!("running `{what}`"))?;
    if !status.success() {
        bail!(
            "`{what}` failed ({status}); its output: {}\n{}",
            log.display(),
            tail(log, 20)
        );
    }
    Ok(())
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Polls `cond` every 100 ms until it holds, `timeout` passes or the run is interrupted.
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return Ok(());
        }
        check_interrupt()?;
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A background daemon in its own process group (Ctrl-C reaches only xtask, which stops
/// the daemons in order), its output in a log file. Stopped on drop.
pub struct Daemon {
    pub name: String,
    child: Option<Child>,
    pub log: PathBuf,
    grace: Duration,
}

impl Daemon {
    pub fn spawn(name: &str, mut cmd: Command, log: PathBuf, grace: Duration) -> Result<Daemon> {
        use std::os::unix::process::CommandExt;
        let f = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let what = describe(&cmd);
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {name}: `{what}`"))?;
        eprintln!(
            "e2e: {} started {name} (pid {}): {what}",
            stamp(),
            child.id()
        );
        Ok(Daemon {
            name: name.into(),
            child: Some(child),
            log,
            grace,
        })
    }

    /// Fails with the log's tail when the daemon has exited.
    pub fn alive(&mut self) -> Result<()> {
        if let Some(c) = self.child.as_mut() {
            if let Some(status) = c.try_wait()? {
                bail!(
                    "{} exited ({status}); the end of {}:\n{}",
                    self.name,
                    self.log.display(),
                    tail(&self.log, 30)
                );
            }
        }
        Ok(())
    }

    /// Waits until `ready` holds, failing early if the daemon dies.
    pub fn wait_ready(&mut self, timeout: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            self.alive()?;
            if ready() {
                return Ok(());
            }
            check_interrupt()?;
            if Instant::now() > deadline {
                bail!(
                    "{} not ready after {timeout:?}; the end of {}:\n{}",
                    self.name,
                    self.log.display(),
                    tail(&self.log, 30)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM, then SIGKILL after the grace period.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + self.grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                eprintln!("e2e: stopped {}", self.name);
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "e2e: {} did not stop within {:?}: killed",
            self.name, self.grace
        );
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}
