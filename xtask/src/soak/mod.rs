//! `cargo xtask bench soak`: a busy node's month, compressed. Pods are churned at a fixed
//! rate (`node.rs`) under the release agent with names, allocations, usage records, OTLP
//! export and Prometheus scrapes on; the agent's RSS is read every second against the pods
//! churned. Memory bounded by what is live is a flat line in the second half, once every
//! window (tombstones, the gone containers' series) is full.
mod node;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;
use tests::{
    fake_node::{metadata_config, FakeNode, World},
    otlp_receiver::{Kind, Receiver},
    Agent, TempDir,
};

use crate::benchkit::host::{machine, release_agent, require_root, rss_kib, write_section};
use node::{ChurnNode, Phase};

/// The bound on the second half's slope of the live heap, KiB per 1,000 pods churned.
/// Growth that is a bug is hundreds of bytes a pod (the 1,100 KiB per 1,000 this soak was
/// made to find); a bounded agent's heap still moves with what each cycle holds (a
/// snapshot, an export, a listing) and with the phases of the GPUs, which the release
/// build's line over 15,000 pods reads as +8 to +20.
const MAX_SLOPE_KIB: f64 = 32.0;
/// The short form's: the debug build over about 4,000 pods read +68, +75 and +92 in three
/// runs; a leak of the size found reads +1,100. A quarter of that keeps CI from failing on
/// the debug build's scatter and still catches it.
const MAX_SHORT_SLOPE_KIB: f64 = 256.0;
/// The bound on the RSS slope, checked over at least `RSS_CHECKED_FROM` pods: RSS also
/// moves with the pages the allocator keeps or gives back (128 KiB and more at a time, and
/// a cycle's buffers of about a MiB), so its readings scatter by half a MiB, and a line
/// over fewer pods is that scatter.
const MAX_RSS_SLOPE_KIB: f64 = 64.0;
const RSS_CHECKED_FROM: f64 = 10_000.0;

#[derive(clap::Args)]
pub struct Args {
    /// Pods started a second.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// Seconds of churn.
    #[arg(long, default_value_t = 300)]
    secs: u64,
    /// Each pod's life, seconds.
    #[arg(long, default_value_t = 4.0)]
    lifetime: f64,
    /// Seconds of each phase of the GPUs: whole, time-sliced (2 to 4 replicas), MIG (new
    /// MIG devices each time), in turn.
    #[arg(long, default_value_t = 20)]
    phase_secs: u64,
    /// The short form CI runs: 90 s of the debug build, phases of 6 s, nothing written.
    #[arg(long)]
    short: bool,
    /// Fail past this slope of the live heap (KiB per 1,000 pods, second half).
    #[arg(long, default_value_t = MAX_SLOPE_KIB)]
    max_slope: f64,
    /// Print only; do not rewrite docs/benchmarks.md.
    #[arg(long)]
    no_write: bool,
}

/// One reading: pods churned (retired) so far, the agent's RSS and live heap (KiB).
#[derive(Clone, Copy)]
struct Reading {
    pods: f64,
    rss: f64,
    heap: f64,
    /// What the GPUs were (0 whole, 1 time-sliced, 2 MIG): each holds its own level of
    /// memory (a MIG device is a device of its own in every snapshot and export).
    phase: u8,
}

pub fn run(mut args: Args) -> Result<()> {
    require_root()?;
    if args.short {
        // Each phase of the GPUs comes five times, so that the second half holds each
        // more than once.
        (args.secs, args.phase_secs, args.no_write) = (90, 6, true);
        args.max_slope = args.max_slope.max(MAX_SHORT_SLOPE_KIB);
    }
    let (bin, lib) = builds(args.short)?;
    let dir = TempDir::new("soak");
    let world = World::default();
    let fake = FakeNode::start(&dir.0, world.clone());
    let scenario = dir.0.join("scenario.json");
    let lifetime = Duration::from_secs_f64(args.lifetime);
    let mut node = ChurnNode::new(world, scenario.clone(), lifetime)?;
    let rx = Receiver::start(Kind::Http, 0);
    let agent = start(&bin, &lib, &dir.0, &fake, &scenario, &rx)?;
    let pid = agent_pid(agent.pid(), &bin);
    eprintln!(
        "soak: {} pods a second for {} s, each living {} s; agent pid {pid}",
        args.rate, args.secs, args.lifetime
    );
    let start = End::read(&agent, pid, &node)?;
    let readings = churn(&args, &mut node, &agent, pid, &rx)?;
    let end = End::read(&agent, pid, &node)?;
    drop(node);
    if pid != agent.pid() {
        stop_wrapped(pid);
    }
    report(&args, &readings, (&start, &end))
}

/// Stops the agent under a wrapper itself, and waits for it (heaptrack writes its file
/// then): the wrapper, stopped on drop, would leave it running.
fn stop_wrapped(pid: u32) {
    // SAFETY: signalling the agent this run started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The agent and the fake NVML library: the release builds, or for the short form the
/// debug ones `cargo xtask test` made just before it in CI (a release build there would
/// cost minutes more than the run).
fn builds(short: bool) -> Result<(PathBuf, PathBuf)> {
    let root = crate::workspace_root();
    if short {
        crate::ebpf::build()?;
        crate::cargo(&["build", "-p", "agent", "-p", "fake-nvml"])?;
        let debug = root.join("target/debug");
        return Ok((debug.join("gpu-agent"), debug.join("libnvidia_ml.so")));
    }
    let bin = release_agent()?;
    crate::cargo(&["build", "--release", "-p", "fake-nvml"])?;
    Ok((bin, root.join("target/release/libnvidia_ml.so")))
}

/// The agent, with everything that keeps state per container on.
fn start(
    bin: &Path,
    lib: &Path,
    dir: &Path,
    fake: &FakeNode,
    scenario: &Path,
    rx: &Receiver,
) -> Result<Agent> {
    let config = format!(
        "[nvml]\ninterval_ms = 1000\n\n[prometheus]\nenabled = true\n\n{}\n[usage]\nrecords = true\nfile = \"{}\"\n\
         file_max_bytes = 1048576\nfile_keep = 1\nmax_record_secs = 2\n",
        metadata_config(dir, Some(fake)),
        dir.join("usage.jsonl").display(),
    );
    let path = dir.join("agent.toml");
    std::fs::write(&path, config)?;
    // GPU_AGENT_SOAK_WRAP="heaptrack -o FILE": the agent runs under that command.
    let wrap = std::env::var("GPU_AGENT_SOAK_WRAP").unwrap_or_default();
    let mut words = wrap.split_whitespace();
    let mut cmd = match words.next() {
        Some(w) => {
            let mut c = Command::new(w);
            c.args(words).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    cmd.args(["run", "--http-addr", "127.0.0.1:0", "--config"])
        .arg(&path)
        .arg("--nvml-lib")
        .arg(lib)
        // The line `Agent::spawn` waits for, and warnings.
        .env("RUST_LOG", "warn,gpu_agent::run=info")
        .env("FAKE_NVML_SCENARIO", scenario)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", rx.url())
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "1000")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    Ok(Agent::spawn(cmd, None))
}

/// The agent's own pid: `pid`, or its descendant running `bin` under a wrapper.
fn agent_pid(pid: u32, bin: &Path) -> u32 {
    // The kernel keeps 15 bytes of the command's name.
    let name = bin.file_name().map(|n| n.to_string_lossy().into_owned());
    let want: String = name.unwrap_or_default().chars().take(15).collect();
    let comm = |p: u32| std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        if comm(p).trim() == want {
            return p;
        }
        let kids = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children"));
        todo.extend(
            kids.unwrap_or_default()
                .split_whitespace()
                .filter_map(|k| k.parse::<u32>().ok()),
        );
    }
    pid
}

/// Churns pods for `args.secs`, reading the agent's RSS every second.
fn churn(
    args: &Args,
    node: &mut ChurnNode,
    agent: &Agent,
    pid: u32,
    rx: &Receiver,
) -> Result<Vec<Reading>> {
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(args.secs);
    let (mut next_read, mut next_publish) = (t0, t0);
    let mut next_phase = t0 + Duration::from_secs(args.phase_secs);
    let mut next_roll = t0;
    let (mut phases, mut readings) = (0u32, vec![]);
    while Instant::now() < end {
        let due = (t0.elapsed().as_secs_f64() * args.rate) as u64;
        while node.started < due {
            node.start_pod()?;
        }
        node.retire_due();
        let now = Instant::now();
        if now >= next_publish {
            node.publish()?;
            next_publish = now + Duration::from_millis(500);
        }
        if now >= next_roll {
            node.roll();
            next_roll = now + Duration::from_secs(2);
        }
        if now >= next_phase {
            phases += 1;
            node.set_phase(match phases % 3 {
                0 => Phase::Gpus,
                1 => Phase::Replicas(2 + phases / 3 % 3),
                _ => Phase::Mig,
            });
            next_phase = now + Duration::from_secs(args.phase_secs);
        }
        if now >= next_read {
            let heap = heap_kib(agent);
            readings.push(Reading {
                pods: node.retired as f64,
                rss: rss_kib(pid)? as f64,
                heap,
                phase: match node.phase() {
                    Phase::Gpus => 0,
                    Phase::Replicas(_) => 1,
                    Phase::Mig => 2,
                },
            });
            next_read = now + Duration::from_secs(1);
            // What Prometheus would scrape; the receiver keeps only the last export.
            if readings.len() % 5 == 0 {
                series(agent)?;
                rx.received.keep_last();
                rx.logs.clear();
                let cached = agent.stats()["cached_processes"].as_u64().unwrap_or(0);
                eprintln!(
                    "soak: {:>4.0} s, {} pods churned, {} live ({} being removed; the agent \
                     has {cached} processes), RSS {:.1} MiB, {:?}",
                    t0.elapsed().as_secs_f64(),
                    node.retired,
                    node.live(),
                    node.backlog(),
                    readings.last().unwrap().rss / 1024.0,
                    node.phase()
                );
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(readings)
}

/// The agent's live heap, KiB: the least of three reads 50 ms apart, so that what one
/// export or listing holds for a moment is not read as what the agent keeps.
fn heap_kib(agent: &Agent) -> f64 {
    let read = || {
        agent.json("/debug/stats?heap=true")["heap_bytes"]
            .as_u64()
            .unwrap_or(0) as f64
            / 1024.0
    };
    let mut least = read();
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(50));
        least = least.min(read());
    }
    least
}

/// Series on /metrics, and the containers they name.
fn series(agent: &Agent) -> Result<(usize, usize)> {
    let (status, body) = tests::http::get(&agent.addr, "/metrics")?;
    if status != 200 {
        bail!("/metrics answered {status}");
    }
    let samples = body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty());
    let (mut all, mut ids) = (0, std::collections::HashSet::new());
    for l in samples {
        all += 1;
        if let Some((_, rest)) = l.split_once("container_id=\"") {
            ids.insert(rest.split('"').next().unwrap_or_default().to_string());
        }
    }
    Ok((all, ids.len()))
}

/// What the agent holds at the start and the end of the churn.
struct End {
    fds: usize,
    threads: usize,
    series: (usize, usize),
    lengths: Vec<(String, u64)>,
    live_pods: usize,
}

impl End {
    fn read(agent: &Agent, pid: u32, node: &ChurnNode) -> Result<End> {
        let count = |d: String| std::fs::read_dir(d).map_or(0, |r| r.count());
        let stats = agent.stats();
        let mut lengths: Vec<(String, u64)> = match &stats["state_lengths"] {
            Value::Object(m) => m
                .iter()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                .collect(),
            _ => vec![],
        };
        for k in [
            "cached_processes",
            "tombstones",
            "cgroups_known",
            "metadata_names",
        ] {
            lengths.push((k.into(), stats[k].as_u64().unwrap_or(0)));
        }
        lengths.sort();
        Ok(End {
            fds: count(format!("/proc/{pid}/fd")),
            threads: count(format!("/proc/{pid}/task")),
            series: series(agent).context("/metrics")?,
            lengths,
            live_pods: node.live(),
        })
    }
}

/// Least squares: `y` per pod churned, with a level of its own for each phase of the GPUs
/// (the slope within phases, so that where the half starts and ends in their turn does not
/// read as growth).
fn slope(points: &[Reading], y: fn(&Reading) -> f64) -> f64 {
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for phase in 0..3 {
        let of: Vec<&Reading> = points.iter().filter(|p| p.phase == phase).collect();
        let n = of.len() as f64;
        if n < 2.0 {
            continue;
        }
        let mx = of.iter().map(|p| p.pods).sum::<f64>() / n;
        let my = of.iter().map(|p| y(p)).sum::<f64>() / n;
        for p in of {
            sxy += (p.pods - mx) * (y(p) - my);
            sxx += (p.pods - mx) * (p.pods - mx);
        }
    }
    if sxx == 0.0 {
        0.0
    } else {
        sxy / sxx
    }
}

/// Every reading, for a plot: target/soak-readings.csv.
fn save(readings: &[Reading]) -> Result<()> {
    let mut csv = String::from("pods,rss_kib,heap_kib,phase\n");
    for r in readings {
        csv.push_str(&format!("{},{},{:.0},{}\n", r.pods, r.rss, r.heap, r.phase));
    }
    let path = crate::workspace_root().join("target/soak-readings.csv");
    std::fs::write(&path, csv).with_context(|| format!("writing {}", path.display()))
}

/// The state's lengths at the start and the end, as a table.
fn lengths_table(start: &End, end: &End) -> String {
    let mut t = String::from("| structure | at the start | at the end |\n| --- | --- | --- |\n");
    for (k, v) in &end.lengths {
        let before = start
            .lengths
            .iter()
            .find(|(j, _)| j == k)
            .map_or(0, |x| x.1);
        t.push_str(&format!("| `{k}` | {before} | {v} |\n"));
    }
    t
}

fn report(args: &Args, readings: &[Reading], (start, end): (&End, &End)) -> Result<()> {
    if readings.len() < 4 {
        bail!("too few readings ({})", readings.len());
    }
    save(readings)?;
    let half = &readings[readings.len() / 2..];
    let rss_slope = slope(half, |r| r.rss) * 1000.0;
    let heap_slope = slope(half, |r| r.heap) * 1000.0;
    let (first, last) = (readings[0], *readings.last().unwrap());
    let pods = last.pods as u64;
    let half_pods = last.pods - half[0].pods;
    let mib = |k: f64| k / 1024.0;
    let body = format!(
        "{pods} pods churned in {} s ({} a second, each living {} s; {} live at the end), \
         GPUs whole, time-sliced and MIG in turn every {} s. Second half ({half_pods:.0} pods):\n\n\
         | figure | at the start | half-way | at the end | slope, second half (KiB per 1,000 pods) |\n\
         | --- | --- | --- | --- | --- |\n\
         | RSS (MiB) | {:.1} | {:.1} | {:.1} | **{rss_slope:+.1}** (bound {MAX_RSS_SLOPE_KIB}) |\n\
         | live heap (MiB) | {:.1} | {:.1} | {:.1} | **{heap_slope:+.1}** (bound {}) |\n\
         | fds | {} | | {} | |\n\
         | threads | {} | | {} | |\n\
         | series on /metrics (containers named) | {} ({}) | | {} ({}) | |\n\n\
         {}\n{}\n",
        args.secs, args.rate, args.lifetime, end.live_pods, args.phase_secs,
        mib(first.rss), mib(half[0].rss), mib(last.rss),
        mib(first.heap), mib(half[0].heap), mib(last.heap), args.max_slope,
        start.fds, end.fds, start.threads, end.threads,
        start.series.0, start.series.1, end.series.0, end.series.1,
        lengths_table(start, end),
        machine(),
    );
    println!("{body}");
    println!(
        "RESULT soak pods={pods} rss_slope_kib_per_1000={rss_slope:.2} \
         heap_slope_kib_per_1000={heap_slope:.2} rss_start_kib={} rss_end_kib={} fds={} threads={}",
        first.rss, last.rss, end.fds, end.threads
    );
    if !args.no_write {
        let cmd = format!(
            "cargo xtask bench soak --rate {} --secs {}",
            args.rate, args.secs
        );
        write_section("soak", &format!("```sh\n{cmd}\n```\n\n{body}"))?;
    }
    if heap_slope > args.max_slope {
        bail!(
            "the live heap grew {heap_slope:.1} KiB per 1,000 pods over the second half (bound {})",
            args.max_slope
        );
    }
    if half_pods >= RSS_CHECKED_FROM && rss_slope > MAX_RSS_SLOPE_KIB {
        bail!("RSS grew {rss_slope:.1} KiB per 1,000 pods over the second half (bound {MAX_RSS_SLOPE_KIB})");
    }
    Ok(())
}
