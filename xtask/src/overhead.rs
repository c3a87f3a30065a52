//! `cargo xtask bench [--quick]`: gpu-agent against the /proc-based approaches on one
//! synthetic node built from real parts, in one run: N sleeping processes in pod cgroups
//! (kubelet shapes), the fake NVML library with 8 GPUs and a few hundred GPU processes among
//! them, the agent collecting at 1 Hz and pushing OTLP to an in-process receiver. The
//! baselines run in this process on the same node state:
//!   (a) per cycle, read and parse /proc/PID/cgroup for each GPU process (a script that runs
//!       nvidia-smi then looks each PID up; dcgm-exporter's per-process mode);
//!   (b) per cycle, scan every /proc/PID/cgroup (Kepler's current approach);
//!   (c) the classic script: NVML listing, (a), and a Docker API call per container
//!       (classic.rs).
//! Then the largest node, 50,000 processes in 1,000 pods on 8 GPUs x 7 MIG (bignode.rs), and
//! the issue-15 targets against what was measured (report.rs).
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use gpu_agent::stats::thread_cpu_ns;
use serde_json::{json, Value};
use tests::{
    cgroups::TestCgroup,
    otlp_receiver::{Kind, Receiver},
    random_hex, Agent, TempDir,
};

use crate::{
    bench::{
        self, counter, cpu_ns, machine, make_pods, release_agent, require_root, rss_kib, settle,
        storm_with, write_section, Pod,
    },
    bignode::{self, PidMax, Sleepers},
    cargo, classic,
    report::{self, Report},
    workspace_root,
};

/// `per_pod` pausing processes in each pod, started by one sleeper (killed on drop).
fn fill(pods: &[Pod], per_pod: usize) -> Result<Sleepers> {
    let cgroups: Vec<&TestCgroup> = pods.iter().map(|p| &p.cg).collect();
    let mut sleepers = Sleepers::spawn(&cgroups, per_pod)?;
    let deadline = Instant::now() + Duration::from_secs(300);
    for p in pods {
        while p.cg.procs().len() < per_pod {
            if Instant::now() > deadline {
                bail!("processes did not start in time");
            }
            sleepers.check()?;
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(sleepers)
}

/// Where the GPU processes go: round robin over the 8 GPUs of h100-8gpu.json, or over the
/// 56 MIG devices of h100-8gpu-mig.json.
#[derive(Clone, Copy)]
pub(crate) enum Layout {
    Gpus,
    Mig,
}

pub(crate) fn write_scenario(path: &Path, layout: Layout, gpu_pids: &[u32]) -> Result<()> {
    let file = match layout {
        Layout::Gpus => "tests/scenarios/h100-8gpu.json",
        Layout::Mig => "tests/scenarios/h100-8gpu-mig.json",
    };
    let mut v: Value =
        serde_json::from_str(&std::fs::read_to_string(workspace_root().join(file))?)?;
    let devices = v["devices"].as_array_mut().context("devices")?;
    let mut slots: Vec<&mut Value> = match layout {
        Layout::Gpus => devices.iter_mut().collect(),
        Layout::Mig => devices
            .iter_mut()
            .flat_map(|d| d["mig_devices"].as_array_mut().unwrap().iter_mut())
            .collect(),
    };
    for s in slots.iter_mut() {
        s["processes"] = json!([]);
    }
    let n = slots.len();
    for (i, pid) in gpu_pids.iter().enumerate() {
        // MIG devices have no per-process utilization: the library ignores the fields.
        slots[i % n]["processes"]
            .as_array_mut()
            .unwrap()
            .push(json!({"pid": pid, "used_memory": 1u64 << 28, "sm_util": i % 90, "mem_util": 3, "enc_util": 0, "dec_util": 0}));
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, v.to_string())?;
    std::fs::rename(tmp, path)?;
    Ok(())
}

fn pod_uid_of(cgroup_file: &str) -> Option<String> {
    cgroup_file
        .lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .filter_map(gpu_agent::process::cgroup::parse_cgroup_path)
        .find_map(|c| c.pod_uid.as_deref().map(str::to_string))
}

/// Baseline (a): per cycle, read and parse /proc/PID/cgroup for each GPU process.
fn baseline_pid_read(pids: &[u32], cycles: u32) -> (f64, usize) {
    let mut found = 0;
    let t0 = thread_cpu_ns();
    for _ in 0..cycles {
        found = 0;
        for pid in pids {
            if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
                found += pod_uid_of(&s).is_some() as usize;
            }
        }
    }
    ((thread_cpu_ns() - t0) as f64 / cycles as f64, found)
}

/// Baseline (b): per cycle, scan every /proc/PID/cgroup.
fn baseline_proc_scan(cycles: u32) -> (f64, usize) {
    let mut map: HashMap<u32, Option<String>> = HashMap::new();
    let t0 = thread_cpu_ns();
    for _ in 0..cycles {
        map.clear();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
                map.insert(pid, pod_uid_of(&s));
            }
        }
    }
    ((thread_cpu_ns() - t0) as f64 / cycles as f64, map.len())
}

/// What every row says; `big` only for the 50k-process node.
pub(crate) struct Row {
    pub n: usize,
    pub pods: usize,
    pub agent_ns_per_cycle: f64,
    pub agent_cpu_pct: f64,
    pub rss_mb: f64,
    pub pid_read_ns: f64,
    pub proc_scan_ns: f64,
    pub classic: classic::Cost,
    pub attributed: usize,
    pub gpu_procs: usize,
    /// Of the agent's cycle: the NVML thread (fake library included) and the join.
    pub nvml_ns: f64,
    pub join_ns: f64,
    /// The OTLP export task (encode and send).
    pub export_ns: f64,
    /// Agent start to /readyz answering 200.
    pub ready_s: f64,
    pub calls: Option<Calls>,
    pub stats: Value,
    pub big: Option<BigFigures>,
}

pub(crate) struct BigFigures {
    pub cgroups: usize,
    /// The same node and build exporting with the other protocol (`bignode::protocols`).
    pub other: Option<OtherProtocol>,
    /// The same node and build with the export as deployed.
    pub deployed: Option<Deployed>,
    /// NVML calls per cycle with 320 GPU processes, same MIG layout, same agent.
    pub calls_320: Option<Calls>,
    pub node_mem_mib: f64,
    pub node_start_s: f64,
}

/// The large node with the agent as deploy/kubernetes configures its export
/// (`bignode::deployed`).
pub(crate) struct Deployed {
    pub protocol: String,
    pub interval_ms: u64,
    pub compression: String,
    /// Windows of one export interval each, and the exports in them.
    pub windows: usize,
    pub exports: u64,
    /// Its cost a cycle over the bench's agent's, side by side (summed over the windows).
    pub ratio: f64,
    /// The agent's figure times that ratio, % of a core.
    pub cpu_pct: f64,
    /// Its containers named by the node's runtime and kubelet, as deploy/'s `[metadata]`
    /// has it.
    pub named: bool,
    /// Its RSS after the windows, and its peak (VmHWM), MiB.
    pub rss_mib: f64,
    pub peak_mib: f64,
}

/// The large node over the protocol the bench's agents do not use (`other_protocol`).
pub(crate) struct OtherProtocol {
    pub protocol: String,
    /// Its cost a cycle over the bench's protocol's, side by side (median of the rounds).
    pub ratio: f64,
    /// The agent's figure times that ratio, % of a core.
    pub cpu_pct: f64,
}

/// NVML calls per cycle between two FAKE_NVML_CALLS snapshots (both cycle starts).
#[derive(Clone)]
pub(crate) struct Calls {
    pub per_cycle: f64,
    /// Busiest functions, calls per cycle.
    pub top: Vec<(String, f64)>,
}

/// The fake library's counts, Null when no whole record could be read.
fn read_calls(path: &Path) -> Value {
    tests::nvml::read_calls(path).unwrap_or(Value::Null)
}

fn calls_between(a: &Value, b: &Value) -> Option<Calls> {
    let f = |v: &Value, k: &str| v["calls"][k].as_u64().unwrap_or(0) as f64;
    let count = |v: &Value| f(v, "nvmlDeviceGetCount_v2") + f(v, "nvmlDeviceGetCount");
    let cycles = count(b) - count(a);
    if cycles < 1.0 {
        return None;
    }
    let mut top: Vec<(String, f64)> = b["calls"]
        .as_object()?
        .keys()
        .map(|k| (k.clone(), (f(b, k) - f(a, k)) / cycles))
        .filter(|(_, n)| *n > 0.0)
        .collect();
    top.sort_by(|x, y| y.1.total_cmp(&x.1));
    top.truncate(8);
    let total = |v: &Value| v["total"].as_u64().unwrap_or(0) as f64;
    Some(Calls {
        per_cycle: (total(b) - total(a)) / cycles,
        top,
    })
}

/// Every row's agent: 1 Hz, OTLP every second, FAKE_NVML_CALLS on (one small file written
/// per cycle by the library, in the agent's NVML thread: part of what is measured).
const AGENT_CONFIG: &str = "[nvml]\ninterval_ms = 1000\n\n[ebpf]\n\
    # Room for the 50k-process node (the default follows kernel.pid_max, raised for the run).\n\
    max_processes = 131072\n";

/// The `[metadata]` table the bench's agents get while a named large node stands
/// (`bignode`, GPU_AGENT_BENCH_NAMED=1); none otherwise, as the default bench runs.
static METADATA: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

pub(crate) fn set_metadata(table: Option<String>) {
    *METADATA.lock().unwrap() = table;
}

/// The `[metadata]` table the next agent gets (`set_metadata`).
pub(crate) fn metadata() -> Option<String> {
    METADATA.lock().unwrap().clone()
}

pub(crate) struct Running {
    pub agent: Agent,
    pub ready_s: f64,
    pub calls_file: PathBuf,
    pub rx: Receiver,
}

pub(crate) fn start_agent(bin: &Path, lib: &Path) -> Result<Running> {
    start_agent_with(bin, lib, &protocol())
}

/// The export protocol of the bench's agents: the agent's default, HTTP/protobuf, which is
/// also what deploy/ configures; GPU_AGENT_BENCH_PROTOCOL=grpc for gRPC. (Until 26 November
/// the bench used gRPC, which costs more on the large node: its 16 KiB HTTP/2 frames each
/// go out with a write of their own. The large node is measured with both.)
pub(crate) fn protocol() -> String {
    std::env::var("GPU_AGENT_BENCH_PROTOCOL").unwrap_or_else(|_| "http/protobuf".into())
}

/// The protocol that is not `protocol`.
pub(crate) fn other_protocol(protocol: &str) -> &'static str {
    match protocol {
        "grpc" => "http/protobuf",
        _ => "grpc",
    }
}

/// `start_agent`, exporting with `protocol` (`grpc` or `http/protobuf`).
pub(crate) fn start_agent_with(bin: &Path, lib: &Path, protocol: &str) -> Result<Running> {
    start_agent_env(bin, lib, protocol, &[])
}

/// `start_agent_with`, with `env` set after the bench's own (which it overrides).
pub(crate) fn start_agent_env(
    bin: &Path,
    lib: &Path,
    protocol: &str,
    env: &[(&str, &str)],
) -> Result<Running> {
    let kind = if protocol == "http/protobuf" {
        Kind::Http
    } else {
        Kind::Grpc
    };
    let rx = Receiver::start(kind, 0);
    let url = rx.url();
    let calls_file = std::env::temp_dir().join(format!("bench-calls-{}.json", random_hex(8)));
    let scenario = classic::scenario_path();
    let t0 = Instant::now();
    let config = format!(
        "{AGENT_CONFIG}{}",
        METADATA.lock().unwrap().as_deref().unwrap_or_default()
    );
    let agent = Agent::start_full(
        bin,
        &config,
        &["--nvml-lib", lib.to_str().unwrap()],
        &[
            ("FAKE_NVML_SCENARIO", scenario.to_str().unwrap()),
            ("FAKE_NVML_CALLS", calls_file.to_str().unwrap()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &url),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
            ("OTEL_METRIC_EXPORT_INTERVAL", "1000"),
        ]
        .into_iter()
        .chain(env.iter().copied())
        .collect::<Vec<_>>(),
    );
    let ready_s = t0.elapsed().as_secs_f64();
    Ok(Running {
        agent,
        ready_s,
        calls_file,
        rx,
    })
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.calls_file);
    }
}

/// The agent's cost over `secs` of sleeping (polling it would be measured as its cost).
pub(crate) struct Window {
    pub cpu_ns: f64,
    pub wall_ns: f64,
    pub cycles: f64,
    pub nvml_ns: f64,
    pub join_ns: f64,
    pub export_ns: f64,
    pub calls: Option<Calls>,
}

pub(crate) fn window(r: &Running, secs: u64) -> Result<Window> {
    let m = Mark::take(r)?;
    std::thread::sleep(Duration::from_secs(secs));
    m.window(r)
}

/// An agent's counters at the start of a window: several agents can be measured over the
/// same one (the pair bench).
pub(crate) struct Mark {
    stats: Value,
    calls: Value,
    cpu_ns: u64,
    at: Instant,
}

impl Mark {
    pub(crate) fn take(r: &Running) -> Result<Mark> {
        let (stats, calls) = (r.agent.stats(), read_calls(&r.calls_file));
        let cpu_ns = cpu_ns(r.agent.pid())?;
        Ok(Mark {
            stats,
            calls,
            cpu_ns,
            at: Instant::now(),
        })
    }

    /// The window from this mark to now.
    pub(crate) fn window(&self, r: &Running) -> Result<Window> {
        let c1 = cpu_ns(r.agent.pid())?;
        let wall = self.at.elapsed();
        let k1 = read_calls(&r.calls_file);
        let (s0, s1) = (&self.stats, r.agent.stats());
        let cycles = (counter(&s1, "nvml_samples") - counter(s0, "nvml_samples")).max(1) as f64;
        let per = |k: &str| (counter(&s1, k) - counter(s0, k)) as f64 / cycles;
        Ok(Window {
            cpu_ns: (c1 - self.cpu_ns) as f64,
            wall_ns: wall.as_nanos() as f64,
            cycles,
            nvml_ns: per("nvml_sample_cpu_ns"),
            join_ns: per("join_cpu_ns"),
            export_ns: per("export_cpu_ns"),
            calls: calls_between(&self.calls, &k1),
        })
    }
}

/// The agent's figures, then (agent stopped) the three baselines on the same node.
pub(crate) fn finish(
    r: Running,
    w: &Window,
    lib: &Path,
    gpu_pids: &[u32],
    n: usize,
) -> Result<Row> {
    if r.rx.received.count() == 0 {
        bail!("the agent exported nothing to the receiver");
    }
    let rss_mb = rss_kib(r.agent.pid())? as f64 / 1024.0;
    let attributed = bench::attributed_in(&r.agent.json("/debug/snapshot"));
    let stats = r.agent.stats();
    let ready_s = r.ready_s;
    drop(r);
    let (pid_read_ns, _) = baseline_pid_read(gpu_pids, 20);
    let (proc_scan_ns, scanned) = baseline_proc_scan(3);
    let classic = classic::measure(lib, 10)?;
    let row = Row {
        n,
        pods: 0,
        agent_ns_per_cycle: w.cpu_ns / w.cycles,
        agent_cpu_pct: w.cpu_ns / w.wall_ns * 100.0,
        rss_mb,
        pid_read_ns,
        proc_scan_ns,
        classic,
        attributed,
        gpu_procs: gpu_pids.len(),
        nvml_ns: w.nvml_ns,
        join_ns: w.join_ns,
        export_ns: w.export_ns,
        ready_s,
        calls: w.calls.clone(),
        stats,
        big: None,
    };
    eprintln!(
        "  agent {:.0} us/cycle ({:.3}% of a core; NVML {:.0} / join {:.0} / export {:.0} us), \
         RSS {:.1} MiB, {:.1} NVML calls/cycle, pid-read {:.0} us, \
         proc-scan {:.0} us over {scanned} processes, classic {:.0} us CPU / {:.0} us wall",
        row.agent_ns_per_cycle / 1000.0,
        row.agent_cpu_pct,
        row.nvml_ns / 1000.0,
        row.join_ns / 1000.0,
        row.export_ns / 1000.0,
        row.rss_mb,
        row.calls.as_ref().map_or(f64::NAN, |c| c.per_cycle),
        pid_read_ns / 1000.0,
        proc_scan_ns / 1000.0,
        row.classic.cpu_ns / 1000.0,
        row.classic.wall_ns / 1000.0
    );
    Ok(row)
}

fn measure(bin: &Path, lib: &Path, n: usize, secs: u64) -> Result<Row> {
    let pods_n = (n / 50).clamp(20, 200);
    let per_pod = n / pods_n;
    eprintln!(
        "overhead: N={} processes in {pods_n} pods",
        per_pod * pods_n
    );
    bignode::check_memory(n)?;
    let pods = make_pods(pods_n);
    let sleepers = fill(&pods, per_pod)?;
    // A few hundred GPU processes among them, spread over the pods and the 8 GPUs.
    let gpu_n = 320.min(per_pod * pods_n);
    let mut gpu_pids = vec![];
    'outer: for round in 0.. {
        for p in &pods {
            if let Some(pid) = p.cg.procs().into_iter().filter(|x| *x != 0).nth(round + 1) {
                gpu_pids.push(pid);
                if gpu_pids.len() == gpu_n {
                    break 'outer;
                }
            }
        }
        if round > per_pod {
            break;
        }
    }
    write_scenario(&classic::scenario_path(), Layout::Gpus, &gpu_pids)?;
    let r = start_agent(bin, lib)?;
    settle(&r.agent);
    std::thread::sleep(Duration::from_secs(3));
    let w = window(&r, secs)?;
    bignode::hold(&r);
    let mut row = finish(r, &w, lib, &gpu_pids, per_pod * pods_n)?;
    row.pods = pods_n;
    drop(pods);
    drop(sleepers);
    Ok(row)
}

pub(crate) struct ShortLived {
    pub total: usize,
    pub agent: usize,
    pub pid_read: usize,
    pub proc_scan: usize,
}

/// The short-lived GPU processes run and are looked up this many at a time.
pub(crate) const SHORT_ROUND: usize = 25;

/// GPU processes that live 5-50 ms: NVML saw them during its sampling window; by the time a
/// per-scrape collector looks them up in /proc they are gone. How many does each attribute
/// to the right pod? They run in rounds of `SHORT_ROUND`, each listed by NVML once it is over and
/// joined at the next sample, as a 1 Hz sampler would see them: one listing of all of them
/// after the last had run made the first ones' exits as old as the spawning took (4.6 s for
/// 300 after the large node, more in a slow hour), past the agent's tombstones
/// (`cache.tombstone_secs`, 5 s), and measured the harness's speed, not the agent.
fn short_lived(bin: &Path, lib: &Path, count: usize) -> Result<ShortLived> {
    let pods = make_pods(10);
    let scenario = std::env::temp_dir().join(format!("bench-short-{}.json", random_hex(8)));
    write_scenario(&scenario, Layout::Gpus, &[])?;
    let agent = Agent::start_full(
        bin,
        "[nvml]\ninterval_ms = 1000\n",
        &["--nvml-lib", lib.to_str().unwrap()],
        &[("FAKE_NVML_SCENARIO", scenario.to_str().unwrap())],
    );
    settle(&agent);
    let mut out = ShortLived {
        total: count,
        agent: 0,
        pid_read: 0,
        proc_scan: 0,
    };
    for first in (0..count).step_by(SHORT_ROUND) {
        let truth = short_round(&pods, first..count.min(first + SHORT_ROUND))?;
        let pids: Vec<u32> = truth.keys().copied().collect();
        // NVML's sample listed them; the join happens now, after they exited.
        write_scenario(&scenario, Layout::Gpus, &pids)?;
        let written = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis() as u64;
        let (pid_read, proc_scan) = short_baselines(&truth)?;
        out.pid_read += pid_read;
        out.proc_scan += proc_scan;
        out.agent += short_attributed(&agent, &truth, written);
    }
    drop(agent);
    let _ = std::fs::remove_file(&scenario);
    Ok(out)
}

/// Processes `range` of the short-lived ones, each in its pod, run and reaped: pid -> the
/// container it ran in.
fn short_round(pods: &[Pod], range: std::ops::Range<usize>) -> Result<HashMap<u32, String>> {
    let mut truth = HashMap::new();
    let mut children = vec![];
    for i in range {
        let p = &pods[i % pods.len()];
        let ms = 5 + (i * 7919) % 46;
        let mut c = Command::new("sleep");
        c.arg(format!("0.{ms:03}"));
        let child = p.cg.spawn(&mut c);
        truth.insert(child.id(), p.id.clone());
        children.push(child);
    }
    for mut c in children {
        c.wait()?;
    }
    Ok(truth)
}

/// What the /proc baselines find of them now: (per-PID reads, full scan).
fn short_baselines(truth: &HashMap<u32, String>) -> Result<(usize, usize)> {
    let mut pid_read = 0;
    for (pid, id) in truth {
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
            pid_read += s.contains(id.as_str()) as usize;
        }
    }
    let mut proc_scan = 0;
    for e in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(id) = truth.get(&pid) {
            if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
                proc_scan += s.contains(id.as_str()) as usize;
            }
        }
    }
    Ok((pid_read, proc_scan))
}

/// How many of them the agent charged to their container, in the first snapshot sampled
/// after the scenario listed them.
fn short_attributed(agent: &Agent, truth: &HashMap<u32, String>, written: u64) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let snap = agent.json("/debug/snapshot");
        if snap["taken_at_ms"].as_u64().unwrap_or(0) > written + 300 {
            let mut ok = 0;
            for c in snap["containers"].as_array().unwrap() {
                let Some(id) = c["container_id"].as_str() else {
                    continue;
                };
                for g in c["gpus"].as_array().unwrap() {
                    for pid in g["pids"].as_array().unwrap() {
                        let pid = pid.as_u64().unwrap() as u32;
                        ok += (truth.get(&pid).map(String::as_str) == Some(id)) as usize;
                    }
                }
            }
            return ok;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    0
}

fn plot(rows: &[Row], out: &Path) -> Result<()> {
    use plotters::prelude::*;
    let font = ["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"]
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .context("no DejaVuSans.ttf for the plot's text (apt-get install fonts-dejavu-core)")?;
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| anyhow::anyhow!("registering the font"))?;
    let root = BitMapBackend::new(out, (900, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let max_n = rows.iter().map(|r| r.n).max().unwrap_or(1) as f64;
    let ms = |ns: f64| (ns / 1e6).max(0.001);
    let max_y = rows
        .iter()
        .map(|r| ms(r.proc_scan_ns).max(ms(r.agent_ns_per_cycle)))
        .fold(0.01, f64::max)
        * 2.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "CPU per 1 Hz cycle vs processes on the node",
            ("sans-serif", 24),
        )
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..max_n * 1.05, (0.001f64..max_y).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("processes on the node (N)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("CPU ms per cycle (log)")
        .label_style(("sans-serif", 15))
        .draw()?;
    let series = [
        ("gpu-agent (whole agent: NVML, join, OTLP)", BLUE, 0),
        ("(a) read /proc/PID/cgroup per GPU process", GREEN, 1),
        ("(b) scan every /proc/PID/cgroup", RED, 2),
        (
            "(c) classic script: NVML listing, /proc per GPU process",
            MAGENTA,
            3,
        ),
    ];
    for (name, color, which) in series {
        let value = |r: &Row| match which {
            0 => ms(r.agent_ns_per_cycle),
            1 => ms(r.pid_read_ns),
            2 => ms(r.proc_scan_ns),
            _ => ms(r.classic.cpu_ns),
        };
        let pts: Vec<(f64, f64)> = rows.iter().map(|r| (r.n as f64, value(r))).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(3)))?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 5, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

/// kernel.pid_max for the run: 50,000 processes and the rest of the machine.
const PID_MAX_RUN: u64 = 131_072;

pub fn run(quick: bool, no_write: bool) -> Result<()> {
    require_root()?;
    // The harness's NVML scenario (baseline (c)): set before any thread exists; every node
    // rewrites the file, the agent reads the same one.
    let tmp = TempDir::new("bench-overhead");
    std::env::set_var("FAKE_NVML_SCENARIO", tmp.0.join("scenario.json"));
    let bin = release_agent()?;
    cargo(&["build", "--release", "-p", "fake-nvml"])?;
    let lib: PathBuf = workspace_root().join("target/release/libnvidia_ml.so");
    let started = Instant::now();
    // First, on a quiet machine; a failure (say, otel/ mid-edit) must not cost the run.
    let export = bench::export_bench(200)
        .map_err(|e| eprintln!("no export figures: {e:#}"))
        .ok();
    let pid_max = PidMax::raise(PID_MAX_RUN)?;
    // GPU_AGENT_BENCH_ONLY=big, or a process count: that node alone, for profiling
    // (with GPU_AGENT_BENCH_HOLD); prints its figures and stops.
    let only = std::env::var("GPU_AGENT_BENCH_ONLY").ok();
    let big_only = only.as_deref() == Some("big");
    let only_n: Option<usize> = only.as_deref().and_then(|v| v.parse().ok());
    let sizes: &[usize] = match (big_only, &only_n, quick) {
        (true, _, _) => &[],
        (_, Some(n), _) => std::slice::from_ref(n),
        (_, None, true) => &[5000],
        (_, None, false) => &[1000, 5000, 20000, 50000],
    };
    let secs = if quick { 15 } else { 40 };
    let mut rows = vec![];
    for &n in sizes {
        rows.push(measure(&bin, &lib, n, secs)?);
    }
    if only_n.is_some() {
        return Ok(());
    }
    if let (true, Some(other)) = (big_only, std::env::var_os("GPU_AGENT_BENCH_PAIR")) {
        return bignode::pair(&bin, Path::new(&other), &lib, secs);
    }
    let big = bignode::measure(&bin, &lib, secs)?;
    drop(pid_max);
    if big_only {
        return Ok(());
    }
    let short = short_lived(&bin, &lib, if quick { 100 } else { 300 })?;
    let storm_n = if quick { 5000 } else { 20000 };
    // Three rounds: one round's ratio moved by 5-10 % with the VM.
    let st = storm_with(&bin, storm_n, 3)?;
    let report = Report {
        quick,
        machine: machine(),
        elapsed_s: started.elapsed().as_secs_f64(),
        rows: &rows,
        big: &big,
        short: &short,
        storm: &st,
        storm_n,
        export: export.as_ref(),
    };
    let mut md = report::markdown(&report);
    // `--no-write` leaves the tree as it was: the plot too.
    if !quick && !no_write {
        let png = workspace_root().join("docs/img/overhead.png");
        std::fs::create_dir_all(png.parent().unwrap())?;
        match plot(&rows, &png) {
            Ok(()) => md.push_str("\n![CPU per cycle vs N](img/overhead.png)\n"),
            Err(e) => eprintln!("no plot: {e:#}"),
        }
    }
    println!("{md}");
    println!("{}", report::result_line(&report));
    if !no_write && !quick {
        write_section("overhead", &md)?;
    }
    Ok(())
}
