//! `cargo xtask demo`: a GPU node made of real parts on any Linux machine, and gpu-agent on
//! it. Real processes in the kubelet's cgroups, the CRI and pod-resources servers the tests
//! use naming and allocating them, the fake NVML library listing their PIDs on eight GPUs,
//! and a scenario that moves every tick. `top` by default, `--serve` for the HTTP
//! endpoints, `--once` for one plain frame.
//!
//! Cleanup: everything the demo makes belongs to a guard that removes it on drop (the
//! node's thread owns the processes, cgroups, sockets and scenario; [`dir::DemoDir`] the
//! directory), and drops run on a normal end, an error and a panic alike. Ctrl-C, SIGTERM,
//! SIGHUP and SIGQUIT are noted by a handler ([`signals`]) and end the wait the same way.
//! The sleepers die with the node's thread even when xtask is SIGKILLed, and the next demo
//! removes the cgroups such a one left.
mod cast;
mod dir;
mod node;
mod scenario;
mod signals;
mod timeline;

use std::{
    io::{IsTerminal, Write},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::{cargo, ebpf, is_root};
use dir::DemoDir;
use node::{Moving, Paths};

#[derive(clap::Args)]
pub struct Args {
    /// Run the agent (`gpu-agent run --prometheus`, usage records to a file) instead of
    /// `top`, print what to try, and stop at Ctrl-C.
    #[arg(long, conflicts_with = "once")]
    serve: bool,
    /// Print one plain-text frame of `top`, then remove the node.
    #[arg(long)]
    once: bool,
    /// Use the agent and fake-nvml as built beside xtask (target/debug), without building.
    #[arg(long)]
    no_build: bool,
}

/// Runs the demo; returns the exit code (2 without root, 128 + the signal that ended it).
pub fn run(args: Args) -> Result<i32> {
    if !is_root() {
        eprintln!(
            "xtask demo: needs root: it makes cgroups for its pods and the agent loads eBPF \
             programs (as another user: sudo env \"PATH=$PATH\" cargo xtask demo)"
        );
        return Ok(2);
    }
    let bins = Bins::get(args.no_build)?;
    signals::catch();
    let dir = DemoDir::claim()?;
    let code = show(&args, &bins, &dir);
    let left = dir.finish();
    if left.is_empty() {
        say("xtask: demo node removed (processes, cgroups, sockets, files)");
    } else {
        say(&format!(
            "xtask: these cgroups the demo made stay, with other cgroups inside now: {left:?}"
        ));
    }
    code
}

/// Brings the node up, runs the agent on it as asked, and takes the node down again.
fn show(args: &Args, bins: &Bins, dir: &DemoDir) -> Result<i32> {
    let (moving, paths) = Moving::start(dir.path(), dir.ledger())?;
    let config = write_config(dir.path(), &paths, args.serve)?;
    let agent = |sub: &str| agent_command(bins, &config, &paths, sub);
    if args.once {
        let mut top = agent("top");
        top.arg("--once").stdin(Stdio::null());
        Child::spawn(&mut top)?.wait(&moving)
    } else if args.serve {
        serve(agent("run"), bins, dir.path(), &moving)
    } else {
        live_top(agent("top"), dir.path(), &moving)
    }
}

/// Says it on stderr, which may be gone (a closed terminal): never a panic over that.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The agent and the fake NVML library, from the directory xtask runs from.
struct Bins {
    agent: PathBuf,
    lib: PathBuf,
}

impl Bins {
    fn get(no_build: bool) -> Result<Bins> {
        if !no_build {
            ebpf::build()?;
            cargo(&["build", "-p", "agent", "-p", "fake-nvml"])?;
        }
        let exe = std::env::current_exe().context("finding xtask's own directory")?;
        let dir = exe.parent().context("xtask has no directory")?;
        let bins = Bins {
            agent: dir.join("gpu-agent"),
            lib: dir.join("libnvidia_ml.so"),
        };
        for p in [&bins.agent, &bins.lib] {
            if !p.is_file() {
                bail!(
                    "{} is missing: run `cargo xtask demo` without --no-build",
                    p.display()
                );
            }
        }
        Ok(bins)
    }
}

/// The agent's configuration for the node's sockets (and, to serve, a usage-record file).
fn write_config(dir: &Path, paths: &Paths, usage: bool) -> Result<PathBuf> {
    let mut toml = format!(
        "# cargo xtask demo: the demo node's sockets\n\
         [metadata]\ncri_socket = \"{}\"\npod_resources_socket = \"{}\"\n\
         docker_socket = \"{}\"\nallocation_interval_secs = 2\n",
        paths.cri.display(),
        paths.pod_resources.display(),
        dir.join("no-docker.sock").display(),
    );
    if usage {
        toml += &format!("\n[usage]\nfile = \"{}\"\n", usage_file(dir).display());
    }
    let path = dir.join("agent.toml");
    std::fs::write(&path, toml)?;
    Ok(path)
}

fn usage_file(dir: &Path) -> PathBuf {
    dir.join("usage.jsonl")
}

fn agent_command(bins: &Bins, config: &Path, paths: &Paths, sub: &str) -> Command {
    let mut cmd = Command::new(&bins.agent);
    cmd.arg(sub)
        .arg("--config")
        .arg(config)
        .arg("--nvml-lib")
        .arg(&bins.lib)
        .env("FAKE_NVML_SCENARIO", &paths.scenario);
    if std::env::var_os("NODE_NAME").is_none() {
        cmd.env("NODE_NAME", "demo-gpu-node");
    }
    cmd
}

/// `gpu-agent top`, live, on this terminal until `q`.
fn live_top(mut top: Command, dir: &Path, moving: &Moving) -> Result<i32> {
    if !std::io::stdout().is_terminal() {
        bail!("`gpu-agent top` needs a terminal: use --once for a plain frame, or --serve");
    }
    let log = dir.join("top.log");
    top.arg("--log-file").arg(&log);
    say("xtask: the demo node is up; `gpu-agent top` on it (q quits)");
    let mut terminal = Terminal::save();
    let code = Child::spawn(&mut top)?.wait(moving)?;
    terminal.clean = code == 0;
    drop(terminal);
    // Stopped by a signal to the demo, it has nothing to explain.
    if code != 0 && signals::caught().is_none() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        say(&format!(
            "xtask: top ended with {code}; its log ends:\n{}",
            tail.join("\n")
        ));
    }
    Ok(code)
}

/// The terminal's settings before `top`. Unless top ended well, they are put back with
/// the main screen and the cursor: a top stopped by a signal (the demo's Ctrl-C handler
/// sends SIGTERM) leaves raw mode and the alternate screen on.
struct Terminal {
    saved: Option<libc::termios>,
    clean: bool,
}

impl Terminal {
    fn save() -> Terminal {
        // SAFETY: tcgetattr fills the struct it is given; an all-zero termios is valid.
        let saved = unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            (libc::tcgetattr(libc::STDOUT_FILENO, &mut t) == 0).then_some(t)
        };
        Terminal {
            saved,
            clean: false,
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let Some(t) = self.saved.filter(|_| !self.clean) else {
            return;
        };
        // SAFETY: settings read from the same descriptor.
        unsafe { libc::tcsetattr(libc::STDOUT_FILENO, libc::TCSANOW, &t) };
        let mut out = std::io::stdout();
        let _ = out.write_all(b"\x1b[?1049l\x1b[?25h");
        let _ = out.flush();
    }
}

/// `gpu-agent run` with Prometheus and usage records, until Ctrl-C.
fn serve(mut run: Command, bins: &Bins, dir: &Path, moving: &Moving) -> Result<i32> {
    let addr = http_addr();
    let log = dir.join("agent.log");
    run.args(["--prometheus", "--http-addr", &addr])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        // The terminal's Ctrl-C is ours: we stop the agent, then remove the node.
        .process_group(0);
    let mut agent = Child::spawn(&mut run)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !tests::http::get(&addr, "/readyz").is_ok_and(|(s, _)| s == 200) {
        if let Some(code) = agent.ended(moving)? {
            say(&std::fs::read_to_string(&log).unwrap_or_default());
            return Ok(code);
        }
        if Instant::now() > deadline {
            bail!(
                "the agent was not ready in 30 s; its log: {}",
                log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let usage = usage_file(dir);
    say(&format!(
        "xtask: gpu-agent runs on the demo node (its log: {log}). In another terminal:\n\
         \n  curl -s {addr}/debug/snapshot | jq '.containers[] | {{namespace, pod_name, container_name, gpus}}'\
         \n  curl -s {addr}/metrics | grep '^container_gpu_memory_usage_bytes'\
         \n  sudo {agent_bin} report --file {usage} --by namespace,pod\n\
         \nUsage records appear as evaluation jobs finish (about every {job} s), in {dir}, \
         which only root reads. Ctrl-C stops the agent and removes the node.",
        log = log.display(),
        agent_bin = bins.agent.display(),
        usage = usage.display(),
        dir = dir.display(),
        job = (timeline::JOB_TICKS + timeline::JOB_GAP) * timeline::TICK.as_secs(),
    ));
    agent.wait(moving)
}

/// 127.0.0.1:9464, the agent's default, when it is free; else a free port.
fn http_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:9464")
        .or_else(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .and_then(|l| l.local_addr())
        .map_or(9464, |a| a.port());
    format!("127.0.0.1:{port}")
}

/// The agent or `top`: stopped with SIGTERM (top then restores the terminal), and SIGKILL
/// after 5 s, when the demo ends for any reason; SIGTERM too if xtask dies first.
struct Child(std::process::Child);

impl Child {
    fn spawn(cmd: &mut Command) -> Result<Child> {
        // SAFETY: prctl is async-signal-safe and touches nothing of the parent's.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("running {:?}", cmd.get_program()))?;
        Ok(Child(child))
    }

    /// Its exit code once it ended, or ours once a signal came or the node failed.
    fn ended(&mut self, moving: &Moving) -> Result<Option<i32>> {
        if let Some(status) = self.0.try_wait()? {
            use std::os::unix::process::ExitStatusExt;
            return Ok(Some(
                status
                    .code()
                    .or(status.signal().map(|s| 128 + s))
                    .unwrap_or(1),
            ));
        }
        if let Some(sig) = signals::caught() {
            self.stop();
            return Ok(Some(128 + sig));
        }
        if moving.failed() {
            self.stop();
            bail!("the demo node stopped (the reason is above)");
        }
        Ok(None)
    }

    fn wait(mut self, moving: &Moving) -> Result<i32> {
        loop {
            if let Some(code) = self.ended(moving)? {
                return Ok(code);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop(&mut self) {
        if !matches!(self.0.try_wait(), Ok(None)) {
            return;
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.0.try_wait(), Ok(None)) {
            if Instant::now() > deadline {
                let _ = self.0.kill();
                let _ = self.0.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.stop();
    }
}
