//! `cargo xtask bench [--quick]`: gpu-agent against the /proc-based approaches on one
//! synthetic node built from real parts, in one run: N sleeping processes in pod cgroups
//! (kubelet shapes), the fake NVML library with 8 GPUs and a few hundred GPU processes among
//! them, the agent collecting at 1 Hz and pushing OTLP to an in-process receiver. The
//! baselines run in this process on the same node state:
//!   (a) per cycle, read and parse /proc/PID/cgroup for each GPU process (a script that runs
//!       nvidia-smi then looks each PID up; dcgm-exporter's per-process mode);
//!   (b) per cycle, scan every /proc/PID/cgroup (Kepler's current approach).
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
    otlp_receiver::{Kind, Receiver},
    random_hex, Agent,
};

use crate::{
    bench::{
        counter, cpu_ns, machine, make_pods, release_agent, require_root, rss_kib, settle, storm,
        write_section, Pod,
    },
    cargo, workspace_root,
};

const GPUS: usize = 8;

/// `per_pod` sleeping processes in each pod, started by one shell per pod.
fn fill(pods: &[Pod], per_pod: usize) -> Result<()> {
    for p in pods {
        let script =
            format!("i=0; while [ $i -lt {per_pod} ]; do sleep 7200 & i=$((i+1)); done; wait");
        let mut c = Command::new("/bin/sh");
        c.args(["-c", &script]);
        // The shell is reaped when the cgroup is emptied on drop.
        std::mem::forget(p.cg.spawn(&mut c));
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    for p in pods {
        while p.cg.procs().len() < per_pod + 1 {
            if Instant::now() > deadline {
                bail!("processes did not start in time");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

fn write_scenario(path: &Path, gpu_pids: &[u32]) -> Result<()> {
    let template: Value = serde_json::from_str(&std::fs::read_to_string(
        workspace_root().join("tests/scenarios/h100-8gpu.json"),
    )?)?;
    let mut v = template;
    let devices = v["devices"].as_array_mut().context("devices")?;
    for d in devices.iter_mut() {
        d["processes"] = json!([]);
    }
    for (i, pid) in gpu_pids.iter().enumerate() {
        devices[i % GPUS]["processes"]
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
        .find_map(|c| c.pod_uid)
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

struct Row {
    n: usize,
    agent_ns_per_cycle: f64,
    agent_cpu_pct: f64,
    rss_mb: f64,
    pid_read_ns: f64,
    proc_scan_ns: f64,
    attributed: usize,
    gpu_procs: usize,
    /// Of the agent's cycle: the NVML thread (fake library included) and the join.
    nvml_ns: f64,
    join_ns: f64,
}

fn measure(bin: &Path, lib: &Path, n: usize, secs: u64) -> Result<Row> {
    let pods_n = (n / 50).clamp(20, 200);
    let per_pod = n / pods_n;
    eprintln!(
        "overhead: N={} processes in {pods_n} pods",
        per_pod * pods_n
    );
    let pods = make_pods(pods_n);
    fill(&pods, per_pod)?;
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
    let scenario = std::env::temp_dir().join(format!("bench-overhead-{}.json", random_hex(8)));
    write_scenario(&scenario, &gpu_pids)?;
    let rx = Receiver::start(Kind::Grpc, 0);
    let url = rx.url();
    let agent = Agent::start_full(
        bin,
        "[nvml]\ninterval_ms = 1000\n",
        &["--nvml-lib", lib.to_str().unwrap()],
        &[
            ("FAKE_NVML_SCENARIO", scenario.to_str().unwrap()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &url),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "1000"),
        ],
    );
    settle(&agent);
    std::thread::sleep(Duration::from_secs(3));
    let s0 = agent.stats();
    let c0 = cpu_ns(agent.pid())?;
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let c1 = cpu_ns(agent.pid())?;
    let wall = t0.elapsed();
    let s1 = agent.stats();
    let rss = rss_kib(agent.pid())? as f64 / 1024.0;
    let snap = agent.json("/debug/snapshot");
    let attributed: usize = snap["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| !c["container_id"].is_null())
        .flat_map(|c| c["gpus"].as_array().unwrap().iter())
        .map(|g| g["pids"].as_array().unwrap().len())
        .sum();
    if rx.received.count() == 0 {
        bail!("the agent exported nothing to the receiver");
    }
    drop(agent);
    let cycles = (counter(&s1, "nvml_samples") - counter(&s0, "nvml_samples")).max(1) as f64;
    let agent_ns = (c1 - c0) as f64;
    let (pid_read_ns, _) = baseline_pid_read(&gpu_pids, 20);
    let (proc_scan_ns, scanned) = baseline_proc_scan(3);
    eprintln!(
        "  agent {:.0} us/cycle ({:.3}% of a core), pid-read {:.0} us, proc-scan {:.0} us over {scanned} processes",
        agent_ns / cycles / 1000.0,
        agent_ns / wall.as_nanos() as f64 * 100.0,
        pid_read_ns / 1000.0,
        proc_scan_ns / 1000.0
    );
    let _ = std::fs::remove_file(&scenario);
    drop(pods);
    Ok(Row {
        n: per_pod * pods_n,
        agent_ns_per_cycle: agent_ns / cycles,
        agent_cpu_pct: agent_ns / wall.as_nanos() as f64 * 100.0,
        rss_mb: rss,
        pid_read_ns,
        proc_scan_ns,
        attributed,
        gpu_procs: gpu_pids.len(),
        nvml_ns: (counter(&s1, "nvml_sample_cpu_ns") - counter(&s0, "nvml_sample_cpu_ns")) as f64
            / cycles,
        join_ns: (counter(&s1, "join_cpu_ns") - counter(&s0, "join_cpu_ns")) as f64 / cycles,
    })
}

struct ShortLived {
    total: usize,
    agent: usize,
    pid_read: usize,
    proc_scan: usize,
}

/// GPU processes that live 5-50 ms: NVML saw them during its sampling window; by the time a
/// per-scrape collector looks them up in /proc they are gone. How many does each attribute
/// to the right pod?
fn short_lived(bin: &Path, lib: &Path, count: usize) -> Result<ShortLived> {
    let pods = make_pods(10);
    let scenario = std::env::temp_dir().join(format!("bench-short-{}.json", random_hex(8)));
    write_scenario(&scenario, &[])?;
    let agent = Agent::start_full(
        bin,
        "[nvml]\ninterval_ms = 1000\n",
        &["--nvml-lib", lib.to_str().unwrap()],
        &[("FAKE_NVML_SCENARIO", scenario.to_str().unwrap())],
    );
    settle(&agent);
    let mut truth: HashMap<u32, String> = HashMap::new();
    let mut children = vec![];
    for i in 0..count {
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
    let pids: Vec<u32> = truth.keys().copied().collect();
    // NVML's sample listed them; the join happens now, after they exited.
    write_scenario(&scenario, &pids)?;
    let written = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64;
    // Baselines look now.
    let mut pid_read = 0;
    for (pid, id) in &truth {
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
    // The agent: the first snapshot sampled after the scenario changed.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut agent_ok = 0;
    while Instant::now() < deadline {
        let snap = agent.json("/debug/snapshot");
        if snap["taken_at_ms"].as_u64().unwrap_or(0) > written + 300 {
            for c in snap["containers"].as_array().unwrap() {
                let Some(id) = c["container_id"].as_str() else {
                    continue;
                };
                for g in c["gpus"].as_array().unwrap() {
                    for pid in g["pids"].as_array().unwrap() {
                        let pid = pid.as_u64().unwrap() as u32;
                        agent_ok += (truth.get(&pid).map(String::as_str) == Some(id)) as usize;
                    }
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(agent);
    let _ = std::fs::remove_file(&scenario);
    Ok(ShortLived {
        total: count,
        agent: agent_ok,
        pid_read,
        proc_scan,
    })
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
    ];
    for (name, color, which) in series {
        let value = |r: &Row| match which {
            0 => ms(r.agent_ns_per_cycle),
            1 => ms(r.pid_read_ns),
            _ => ms(r.proc_scan_ns),
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

pub fn run(quick: bool, no_write: bool) -> Result<()> {
    require_root()?;
    let bin = release_agent()?;
    cargo(&["build", "--release", "-p", "fake-nvml"])?;
    let lib: PathBuf = workspace_root().join("target/release/libnvidia_ml.so");
    let sizes: &[usize] = if quick { &[5000] } else { &[1000, 5000, 20000] };
    let secs = if quick { 15 } else { 40 };
    let started = Instant::now();
    let mut rows = vec![];
    for &n in sizes {
        rows.push(measure(&bin, &lib, n, secs)?);
    }
    let short = short_lived(&bin, &lib, if quick { 100 } else { 300 })?;
    let st = storm(if quick { 5000 } else { 20000 }, 1, true)?;
    let r5 = rows
        .iter()
        .find(|r| r.n >= 4000 && r.n <= 6000)
        .unwrap_or(&rows[0]);
    let ratio_scan = r5.proc_scan_ns / r5.agent_ns_per_cycle;
    let ratio_pid = r5.pid_read_ns / r5.agent_ns_per_cycle;

    let mut md = format!(
        "Measured by `cargo xtask bench{}` on {} in {:.0} s. The agent's figures are its whole \
         process (eBPF cache, NVML sampling through the fake library, join, OTLP push to an \
         in-process receiver) from its schedstat; the baselines time only their /proc work, in \
         the harness, on the same node state, so the comparison favours them.\n\n",
        if quick { " --quick" } else { "" },
        machine(),
        started.elapsed().as_secs_f64()
    );
    md.push_str("| N processes | GPU processes (attributed) | agent CPU per cycle (NVML thread / join) | agent % of a core at 1 Hz | agent RSS | (a) per-PID /proc reads | (b) full /proc scan | (b) / agent | (a) / agent |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for r in &rows {
        md.push_str(&format!(
            "| {} | {} ({}) | {:.2} ms ({:.2} / {:.2}) | {:.3} % | {:.1} MiB | {:.2} ms | {:.1} ms | {:.1}x | {:.2}x |\n",
            r.n,
            r.gpu_procs,
            r.attributed,
            r.agent_ns_per_cycle / 1e6,
            r.nvml_ns / 1e6,
            r.join_ns / 1e6,
            r.agent_cpu_pct,
            r.rss_mb,
            r.pid_read_ns / 1e6,
            r.proc_scan_ns / 1e6,
            r.proc_scan_ns / r.agent_ns_per_cycle,
            r.pid_read_ns / r.agent_ns_per_cycle
        ));
    }
    md.push_str(&format!(
        "\nShort-lived GPU processes (5-50 ms, {} of them, looked up after NVML listed them): \
         gpu-agent attributed {} ({:.0}%), per-PID /proc reads {} ({:.0}%), full /proc scan {} ({:.0}%).\n\n\
         Exec storm ({} fork+exec): {} notifications lost, slowdown {:.3}x, agent {:.2} us CPU \
         per event, eBPF {:.0} ns per event (mean of the programs).\n",
        short.total,
        short.agent,
        100.0 * short.agent as f64 / short.total as f64,
        short.pid_read,
        100.0 * short.pid_read as f64 / short.total as f64,
        short.proc_scan,
        100.0 * short.proc_scan as f64 / short.total as f64,
        if quick { 5000 } else { 20000 },
        st.lost,
        st.slowdown,
        st.cpu_us_per_event,
        st.bpf_ns_per_event
    ));
    if !quick {
        let png = workspace_root().join("docs/img/overhead.png");
        std::fs::create_dir_all(png.parent().unwrap())?;
        match plot(&rows, &png) {
            Ok(()) => md.push_str("\n![CPU per cycle vs N](img/overhead.png)\n"),
            Err(e) => eprintln!("no plot: {e:#}"),
        }
    }
    println!("{md}");
    println!(
        "RESULT agent_cpu_pct={:.3} rss_mb={:.1} ratio_vs_procscan={:.1} ratio_vs_pidread={:.2} lost={} bpf_ns_per_event={:.0}",
        r5.agent_cpu_pct, r5.rss_mb, ratio_scan, ratio_pid, st.lost, st.bpf_ns_per_event
    );
    if !no_write && !quick {
        write_section("overhead", &md)?;
    }
    Ok(())
}
