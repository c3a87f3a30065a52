//! `cargo xtask kernel-matrix`: the eBPF programs and the agent on other kernels than the
//! running one. Each kernel of Debian's packages (5.10, 6.1, 6.12) boots under qemu with
//! virtme-ng against this machine's filesystem (read-only, TCG: KVM does not nest here);
//! the host kernel runs the same checks directly. Inside, `guest.rs` runs one end-to-end
//! agent check and the prebuilt root-only test binaries. docs/compatibility.md has the
//! results and how to add a kernel.
mod docs;
mod guest;
mod install;

use std::{
    io::{BufRead, BufReader, Read, Write},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::{cargo, cargo_command, ebpf, is_root, workspace_root};
use install::{Series, SERIES};

/// Run on the host kernel only: it needs fork+exec to outpace a one-page ring drained every
/// 1.5 s, which an emulated CPU on a busy host does not reliably do (5.10 under TCG: once no
/// overflow at all, once the cache still catching up when the wait ended). The overflow
/// accounting is the programs' own and the same on every kernel from 5.8.
const VM_LEFT_OUT: &[(&str, &str)] = &[(
    "ring_buffer_overflow_is_repaired_by_a_resync",
    "needs a fork+exec storm faster than TCG runs; run on the host kernel (--all-tests: here too)",
)];

/// How much longer the tests wait in an emulated VM (`GPU_AGENT_TEST_TIME_SCALE`).
const TCG_TIME_SCALE: u32 = 4;

#[derive(clap::Args)]
pub struct Args {
    /// Only these kernels: a series (5.10, 6.1, 6.12) or `host`; repeatable. Default: all.
    #[arg(long = "kernel", value_name = "SERIES")]
    kernels: Vec<String>,
    /// Seconds one kernel may take (boot, checks, power-off) before it is stopped and failed.
    #[arg(long, default_value_t = 480)]
    timeout_secs: u64,
    /// Also run, in the VMs, the tests left to the host kernel (see VM_LEFT_OUT).
    #[arg(long)]
    all_tests: bool,
    /// Rewrite the results table in docs/compatibility.md with this run's rows.
    #[arg(long)]
    write_docs: bool,
    /// Internal: run the checks in the running kernel with DIR/plan.json (what each VM runs).
    #[arg(long, value_name = "DIR", hide = true)]
    guest: Option<PathBuf>,
}

/// One kernel's outcome, from its result.json (or its absence).
pub struct Outcome {
    /// "host" or the series ("6.1").
    pub name: String,
    /// Where the kernel comes from, for the docs.
    pub source: String,
    pub release: String,
    pub result: Value,
    pub seconds: u64,
}

impl Outcome {
    pub fn passed(&self) -> u64 {
        self.result["passed"].as_u64().unwrap_or(0)
    }
    pub fn failed(&self) -> u64 {
        self.result["failed"].as_u64().unwrap_or(1)
    }
    pub fn mode(&self) -> &str {
        self.result["mode"].as_str().unwrap_or("none")
    }
}

pub fn run(args: Args) -> Result<()> {
    if let Some(dir) = args.guest {
        return guest::run(&dir);
    }
    if !is_root() {
        bail!(
            "kernel-matrix needs root: it installs packages, boots VMs and loads eBPF programs \
             (sudo env \"PATH=$PATH\" cargo xtask kernel-matrix)"
        );
    }
    let started = Instant::now();
    let (host, series) = select(&args.kernels)?;
    let releases = install::ensure(&series)?;
    let vng = if releases.is_empty() {
        None
    } else {
        Some(install::virtme_ng()?)
    };
    let plan = build()?;
    let out = workspace_root().join("target/kernel-matrix");
    let timeout = Duration::from_secs(args.timeout_secs);
    let mut outcomes = vec![];
    if host {
        outcomes.push(run_one(
            "host",
            "the machine's own kernel",
            None,
            &out,
            &plan,
            timeout,
            args.all_tests,
        )?);
    }
    for (s, rel) in &releases {
        let src = SERIES.iter().find(|x| x.series == s).unwrap();
        let source = format!("{} ({})", src.distro, src.suite);
        let vm = Some((rel.as_str(), vng.as_deref().unwrap()));
        outcomes.push(run_one(
            s,
            &source,
            vm,
            &out,
            &plan,
            timeout,
            args.all_tests,
        )?);
    }
    println!();
    for o in &outcomes {
        print_kernel_line(o);
        for f in o.result["failures"].as_array().into_iter().flatten() {
            println!("  failed: {}", f.as_str().unwrap_or_default());
        }
        for l in o.result["left_out"].as_array().into_iter().flatten() {
            println!(
                "  left out: {} ({})",
                l[0].as_str().unwrap_or_default(),
                l[1].as_str().unwrap_or_default()
            );
        }
    }
    let failed = outcomes.iter().filter(|o| o.failed() > 0).count();
    println!(
        "RESULT kernel-matrix kernels={} failed={failed} ({} s)",
        outcomes.len(),
        started.elapsed().as_secs()
    );
    if args.write_docs {
        docs::write(&outcomes)?;
    }
    if failed > 0 {
        bail!("{failed} kernel(s) failed: logs under {}", out.display());
    }
    Ok(())
}

fn print_kernel_line(o: &Outcome) {
    println!(
        "KERNEL {} passed={} failed={} mode={}",
        o.release,
        o.passed(),
        o.failed(),
        o.mode()
    );
}

/// (the host kernel too?, the series to boot), from `--kernel` (default: all).
fn select(kernels: &[String]) -> Result<(bool, Vec<&'static Series>)> {
    if kernels.is_empty() {
        return Ok((true, SERIES.iter().collect()));
    }
    let mut series = vec![];
    for k in kernels.iter().filter(|k| *k != "host") {
        let s = SERIES.iter().find(|s| s.series == k).with_context(|| {
            let known: Vec<&str> = SERIES.iter().map(|s| s.series).collect();
            format!(
                "--kernel {k}: not in the matrix (host, {})",
                known.join(", ")
            )
        })?;
        series.push(s);
    }
    Ok((kernels.iter().any(|k| k == "host"), series))
}

/// Builds the eBPF object, the debug agent, fake-nvml and the test binaries the guest
/// runs; returns the plan each guest reads (absolute paths on the shared filesystem).
fn build() -> Result<Value> {
    ebpf::build()?;
    cargo(&["build", "-p", "agent", "-p", "fake-nvml"])?;
    // The same package selection as `cargo xtask test`, so that features resolve alike and
    // CI, which runs that first, finds these binaries built.
    let out = cargo_command()
        .args(["test", "--workspace", "--exclude", "agent-ebpf", "--no-run"])
        .arg("--message-format=json")
        .args(["--test", "process_cache", "--test", "agent_cli"])
        .stderr(Stdio::inherit())
        .output()
        .context("building the test binaries")?;
    if !out.status.success() {
        bail!("building the test binaries failed ({})", out.status);
    }
    let mut plan = json!({});
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(m) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if m["reason"] == "compiler-artifact" && m["target"]["kind"] == json!(["test"]) {
            if let (Some(name), Some(exe)) =
                (m["target"]["name"].as_str(), m["executable"].as_str())
            {
                plan[name] = json!(exe);
            }
        }
    }
    let root = workspace_root();
    let debug = root.join("target/debug");
    plan["agent"] = json!(debug.join("gpu-agent"));
    plan["fake_nvml"] = json!(debug.join("libnvidia_ml.so"));
    plan["scenario"] = json!(root.join("tests/scenarios/h100-8gpu.json"));
    for k in [
        "process_cache",
        "agent_cli",
        "agent",
        "fake_nvml",
        "scenario",
    ] {
        let p = plan[k].as_str().map(PathBuf::from);
        if !p.as_ref().is_some_and(|p| p.is_file()) {
            bail!("the kernel matrix needs {k}, but {p:?} is not there after the build");
        }
    }
    Ok(plan)
}

/// Runs the guest checks on the host kernel (`vm` None) or in a VM booting
/// /boot/vmlinuz-<release> with virtme-ng from `vng_bin`.
fn run_one(
    name: &str,
    source: &str,
    vm: Option<(&str, &Path)>,
    out: &Path,
    plan: &Value,
    timeout: Duration,
    all_tests: bool,
) -> Result<Outcome> {
    let dir = out.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut plan = plan.clone();
    if vm.is_some() {
        // Under TCG a verifier pass takes seconds; agents loading at once on a busy host ran
        // past the tests' 30 s start-up limit: longer waits.
        plan["time_scale"] = json!(TCG_TIME_SCALE);
        if !all_tests {
            plan["left_out"] = json!(VM_LEFT_OUT);
        }
    }
    std::fs::write(dir.join("plan.json"), serde_json::to_vec_pretty(&plan)?)?;
    let exe = std::env::current_exe().context("xtask's own path")?;
    let release = match vm {
        Some((rel, _)) => rel.to_string(),
        None => std::fs::read_to_string("/proc/sys/kernel/osrelease")?
            .trim()
            .to_string(),
    };
    let cmd = match vm {
        None => {
            let mut c = Command::new(&exe);
            c.args(["kernel-matrix", "--guest"]).arg(&dir);
            c
        }
        Some((rel, vng_bin)) => vng_command(rel, vng_bin, &exe, &dir),
    };
    eprintln!("xtask: == kernel {release} ({name}: {source})");
    let started = Instant::now();
    let (status, timed_out) = run_logged(cmd, &dir.join("console.log"), name, timeout)?;
    let ended = if timed_out {
        format!("stopped after {} s", timeout.as_secs())
    } else {
        status.to_string()
    };
    let seconds = started.elapsed().as_secs();
    let result = match std::fs::read(dir.join("result.json")) {
        Ok(b) => serde_json::from_slice(&b).context("reading result.json")?,
        Err(_) => json!({
            "release": release, "passed": 0, "failed": 1, "mode": "none",
            "failures": [format!("no result from the kernel ({ended}); see {}",
                dir.join("console.log").display())],
        }),
    };
    let o = Outcome {
        name: name.to_string(),
        source: source.to_string(),
        release,
        result,
        seconds,
    };
    print_kernel_line(&o);
    Ok(o)
}

fn vng_command(release: &str, vng_bin: &Path, exe: &Path, dir: &Path) -> Command {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let path = std::env::join_paths(
        std::iter::once(vng_bin.to_path_buf()).chain(std::env::split_paths(&path)),
    )
    .expect("PATH entries without ':'");
    let q = |p: &Path| format!("'{}'", p.display().to_string().replace('\'', r"'\''"));
    let mut c = Command::new(vng_bin.join("vng"));
    c.arg("--run")
        .arg(format!("/boot/vmlinuz-{release}"))
        .args(["--memory", "2G", "--cpus", "2"])
        // KVM fails in this nested setup (`failed to set MSR 0x10a`): TCG.
        .arg("--disable-kvm")
        // The guest would load kvm for qemu's virtual CPU: seconds of TCG for nothing.
        .args(["--append", "modprobe.blacklist=kvm,kvm_amd,kvm_intel"])
        // The filesystem is read-only inside, except the result directory.
        .arg("--rwdir")
        .arg(dir)
        .arg("--")
        .arg(format!("{} kernel-matrix --guest {}", q(exe), q(dir)))
        .env("PATH", path);
    c
}

/// Runs `cmd` in its own process group, copying its output to `log` and to ours (prefixed),
/// and kills the whole group after `timeout`. Returns (status, whether it timed out).
fn run_logged(
    mut cmd: Command,
    log: &Path,
    prefix: &str,
    timeout: Duration,
) -> Result<(std::process::ExitStatus, bool)> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let started = Instant::now();
    let mut child = cmd.spawn().context("starting the kernel's run")?;
    let _group = ChildGroup::register(child.id());
    let file = Arc::new(Mutex::new(std::fs::File::create(log)?));
    let pumps: Vec<_> = [
        Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ]
    .into_iter()
    .map(|r| {
        let (file, prefix) = (file.clone(), prefix.to_string());
        std::thread::spawn(move || {
            for line in BufReader::new(r).split(b'\n').map_while(Result::ok) {
                let line = String::from_utf8_lossy(&line);
                let line = line.trim_end_matches('\r');
                // Seconds since the start: where a slow kernel spends its time.
                let t = started.elapsed().as_secs();
                let _ = writeln!(file.lock().unwrap(), "+{t:>3}s {line}");
                println!("[{prefix} +{t}s] {line}");
            }
        })
    })
    .collect();
    let status = wait_or_kill(&mut child, timeout)?;
    for p in pumps {
        let _ = p.join();
    }
    Ok(status)
}

fn wait_or_kill(child: &mut Child, timeout: Duration) -> Result<(std::process::ExitStatus, bool)> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok((s, false));
        }
        if Instant::now() > deadline {
            eprintln!(
                "xtask: still running after {} s: stopping it",
                timeout.as_secs()
            );
            // SAFETY: the child leads its own process group (qemu included).
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            return Ok((child.wait()?, true));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The process group of the kernel being run: a Ctrl-C or SIGTERM to xtask takes the VM
/// (qemu runs in that group, outside the terminal's) down with it.
static CHILD_GROUP: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

struct ChildGroup;

impl ChildGroup {
    fn register(pid: u32) -> ChildGroup {
        extern "C" fn on_signal(sig: libc::c_int) {
            let g = CHILD_GROUP.load(std::sync::atomic::Ordering::SeqCst);
            // SAFETY: kill and _exit are async-signal-safe.
            unsafe {
                if g > 0 {
                    libc::kill(-g, libc::SIGKILL);
                }
                libc::_exit(128 + sig);
            }
        }
        CHILD_GROUP.store(pid as i32, std::sync::atomic::Ordering::SeqCst);
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: installing a handler that only calls async-signal-safe functions.
        unsafe {
            libc::signal(libc::SIGINT, handler);
            libc::signal(libc::SIGTERM, handler);
        }
        ChildGroup
    }
}

impl Drop for ChildGroup {
    fn drop(&mut self) {
        CHILD_GROUP.store(0, std::sync::atomic::Ordering::SeqCst);
    }
}
