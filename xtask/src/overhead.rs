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
//! the overhead targets against what was measured (report.rs).
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use tests::{cgroups::TestCgroup, random_hex, Agent, TempDir};

use crate::{
    bench::{self, storm_with},
    benchkit::{
        agent::{start_agent, window, write_scenario, Layout},
        figures::{finish, Row, ShortLived, SHORT_ROUND},
        host::{machine, make_pods, release_agent, require_root, settle, write_section, Pod},
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
