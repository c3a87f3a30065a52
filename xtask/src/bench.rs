//! `cargo xtask bench ...`: overhead measured on this machine, written to
//! docs/benchmarks.md. Targets live here, not in timed tests.
use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use serde_json::Value;
use tests::{
    cgroups::{systemd_container, TestCgroup},
    random_hex, random_uid, Agent,
};

use crate::{
    benchkit::host::{
        attributed_in, counter, cpu_ns, machine, make_pods, median, release_agent, require_root,
        rss_kib, run_storm, settle, write_section, Pod,
    },
    cargo, cargo_command, workspace_root,
};

#[derive(Subcommand)]
pub enum Which {
    /// Exec storm: N fork+exec of /bin/true inside a pod cgroup, with and without the
    /// agent. Reports events lost, the storm's slowdown, the agent's CPU per lifecycle
    /// event and each eBPF program's run time per event (kernel statistics).
    /// GPU_AGENT_BENCH_CLASSIC=1: the programs' run times of the classic tracepoints
    /// (`ebpf.btf_tracepoints = false`, as on a kernel without BTF).
    Storm {
        /// fork+exec per storm.
        #[arg(long, default_value_t = 20_000)]
        processes: u32,
        /// Rounds of (without agent, with agent); medians are reported.
        #[arg(long, default_value_t = 3)]
        rounds: u32,
        /// Print only; do not rewrite docs/benchmarks.md.
        #[arg(long)]
        no_write: bool,
    },
    /// The floor under the eBPF figures: the fork, exec and exit programs' work as
    /// cumulative prefixes (a calibration object the agent never loads), each alone on its
    /// tracepoint for a storm, so that each step's cost, cold caches and all, is the
    /// difference of two medians. The BTF programs (the agent's where the kernel has BTF).
    Floor {
        /// fork+exec per prefix and round.
        #[arg(long, default_value_t = 10_000)]
        processes: u32,
        /// Rounds over the prefixes, the order alternated; medians are reported.
        #[arg(long, default_value_t = 3)]
        rounds: u32,
        /// The classic tracepoint programs (the agent's without BTF) instead.
        #[arg(long)]
        classic: bool,
        #[arg(long)]
        no_write: bool,
    },
    /// OTLP export: cost of building and encoding one export for 200 containers x 8 GPUs,
    /// and the agent's RSS while the collector is down for a long time.
    Export {
        #[arg(long, default_value_t = 200)]
        containers: u32,
        /// Minutes of dead collector.
        #[arg(long, default_value_t = 10)]
        minutes: u32,
        #[arg(long)]
        no_write: bool,
    },
    /// One NVML collection + join cycle: the 8-GPU H100 scenario (fake libnvidia-ml.so)
    /// with GPU processes that are real processes spread over pod cgroups.
    /// `--real-node`: what a real node pays, each call charged the CPU a real driver takes
    /// (`FAKE_NVML_COST=measured`), 5 processes per GPU: the agent's CPU per cycle (mean,
    /// median, the worst of each 10 s) and the calls per cycle by function;
    /// `GPU_AGENT_BENCH_PAIR=PATH` runs that agent beside this tree's, and
    /// `GPU_AGENT_BENCH_CONFIG=TOML` configures this tree's agent alone.
    Gpu {
        /// GPU processes, spread over the 8 GPUs (default 400; 40 with --real-node).
        #[arg(long)]
        processes: Option<u32>,
        /// Pods (cgroups) they live in (default 50; 40 with --real-node).
        #[arg(long)]
        pods: Option<u32>,
        /// Cycles measured, 1 Hz (default 20; 50 with --real-node).
        #[arg(long)]
        cycles: Option<u32>,
        /// A real node's cost through the measured-cost model (section `gpu-cost`).
        #[arg(long)]
        real_node: bool,
        /// With --real-node: the GPUs answer GPM profiling, as a real H100's do (1.6 ms a
        /// sample); printed only, the section's node has none.
        #[arg(long)]
        gpm: bool,
        #[arg(long)]
        no_write: bool,
    },
    /// `gpu-agent rightsize --prometheus` on a synthetic cluster's history (500 nodes, 4,000
    /// GPUs, about 6,000 containers, 14 days) in a real Prometheus, its recording rules
    /// backfilled by promtool: its time against the generator's known answer, Prometheus's
    /// RSS and the series count.
    Rightsize(crate::rightsize_bench::Args),
    /// A busy node's month, compressed: pods churned at a fixed rate (real processes and
    /// cgroups, names from a CRI server with rolling ReplicaSet hashes, allocations from
    /// pod-resources, usage records, GPUs whole, time-sliced and MIG in turn); reports the
    /// agent's RSS slope per 1,000 pods over the second half and fails past a bound.
    Soak(crate::soak::Args),
}

pub fn run(which: Which) -> Result<()> {
    match which {
        Which::Storm {
            processes,
            rounds,
            no_write,
        } => storm(processes, rounds.max(1), no_write).map(|_| ()),
        Which::Floor {
            processes,
            rounds,
            classic,
            no_write,
        } => crate::floor::floor(processes.max(1), rounds.max(1), classic, no_write),
        Which::Gpu {
            processes,
            pods,
            cycles,
            real_node: true,
            gpm,
            no_write,
        } => crate::gpu_cost::run(
            processes.unwrap_or(40),
            pods.unwrap_or(40).max(1),
            cycles.unwrap_or(50).max(10),
            gpm,
            no_write || gpm,
        ),
        Which::Gpu {
            processes,
            pods,
            cycles,
            real_node: false,
            no_write,
            ..
        } => gpu(
            processes.unwrap_or(400),
            pods.unwrap_or(50).max(1),
            cycles.unwrap_or(20).max(1),
            no_write,
        ),
        Which::Export {
            containers,
            minutes,
            no_write,
        } => export(containers.max(1), minutes.max(1), no_write),
        Which::Rightsize(args) => crate::rightsize_bench::run(args),
        Which::Soak(args) => crate::soak::run(args),
    }
}

struct ProgramRow {
    name: String,
    runs: u64,
    ns_per_run: f64,
}

/// The storm's headline figures, for the combined benchmark.
pub(crate) struct StormFigures {
    pub lost: u64,
    pub slowdown: f64,
    pub cpu_us_per_event: f64,
    pub bpf_ns_per_event: f64,
    /// proc_fork's run time per run (the kernel's per-program statistics).
    pub fork_ns: f64,
    /// The storm section of docs/benchmarks.md, and its RESULT line.
    pub md: String,
    pub result: String,
}

/// Per-program kernel run time, in a separate run: enabling the statistics costs a little
/// on every program run and must not colour the slowdown.
fn program_stats(bin: &Path, cg: &TestCgroup, n: u32) -> Result<Vec<ProgramRow>> {
    // GPU_AGENT_BENCH_CLASSIC: the classic tracepoints' programs, as a kernel without BTF.
    let cfg = match std::env::var_os("GPU_AGENT_BENCH_CLASSIC") {
        Some(_) => "[ebpf]\nprogram_stats = true\nbtf_tracepoints = false\n",
        None => "[ebpf]\nprogram_stats = true\n",
    };
    let agent = Agent::start_binary(bin, cfg, &[]);
    let p0 = settle(&agent)["programs"].clone();
    run_storm(cg, n)?;
    let p1 = settle(&agent)["programs"].clone();
    drop(agent);
    let mut programs = vec![];
    for (a, b) in p0.as_array().unwrap().iter().zip(p1.as_array().unwrap()) {
        let runs = counter(b, "run_count") - counter(a, "run_count");
        let ns = counter(b, "run_time_ns") - counter(a, "run_time_ns");
        programs.push(ProgramRow {
            name: b["name"].as_str().unwrap_or("?").to_string(),
            runs,
            ns_per_run: if runs > 0 {
                ns as f64 / runs as f64
            } else {
                0.0
            },
        });
    }
    Ok(programs)
}

pub(crate) fn storm(n: u32, rounds: u32, no_write: bool) -> Result<StormFigures> {
    require_root()?;
    let st = storm_with(&release_agent()?, n, rounds)?;
    println!("{}", st.md);
    println!("{}", st.result);
    if !no_write {
        write_section("storm", &st.md)?;
    }
    Ok(st)
}

/// The storm with a given agent build (the combined benchmark built it already).
pub(crate) fn storm_with(bin: &Path, n: u32, rounds: u32) -> Result<StormFigures> {
    let path = systemd_container(&random_uid(), &random_hex(64));
    let cg = TestCgroup::v2(&path);
    eprintln!("bench storm: {n} fork+exec in {path}, {rounds} rounds");
    run_storm(&cg, n / 10)?; // warm the page cache

    let (mut base, mut with, mut ratios, mut cpu_per_event, mut lost, mut events) =
        (vec![], vec![], vec![], vec![], 0u64, 0u64);
    let mut rss = 0;
    for round in 0..rounds {
        // Without, with, with, without: this VM's speed drifts by 10-30 % over minutes,
        // and a drift within the round cancels out of the sums (one storm each way had the
        // agent's always second, and gave 0.96x to 1.09x for one build).
        let b1 = run_storm(&cg, n)?;
        let agent = Agent::start_binary(bin, "", &[]);
        let s0 = settle(&agent);
        let c0 = cpu_ns(agent.pid())?;
        let w1 = run_storm(&cg, n)?;
        let w2 = run_storm(&cg, n)?;
        let s1 = settle(&agent);
        let c1 = cpu_ns(agent.pid())?;
        rss = rss.max(rss_kib(agent.pid())?);
        let ev = counter(&s1, "events_received") - counter(&s0, "events_received");
        let l = counter(&s1, "events_lost") - counter(&s0, "events_lost");
        if s1["mode"] != "ebpf" {
            bail!("agent not in eBPF mode: {s1}");
        }
        drop(agent);
        let b2 = run_storm(&cg, n)?;
        let secs = |d: [Duration; 2]| d.iter().map(Duration::as_secs_f64).sum::<f64>() / 2.0;
        let (b, w) = (secs([b1, b2]), secs([w1, w2]));
        eprintln!(
            "round {round}: without {:.2}s and {:.2}s, with {:.2}s and {:.2}s ({:.3}x), {ev} events, {l} lost, agent {:.1} ms CPU",
            b1.as_secs_f64(),
            b2.as_secs_f64(),
            w1.as_secs_f64(),
            w2.as_secs_f64(),
            w / b,
            (c1 - c0) as f64 / 1e6
        );
        base.push(b);
        with.push(w);
        ratios.push(w / b);
        cpu_per_event.push((c1 - c0) as f64 / ev.max(1) as f64 / 1000.0);
        lost += l;
        events += ev;
    }

    let programs = program_stats(bin, &cg, n)?;
    let (tb, tw) = (median(&mut base), median(&mut with));
    let slowdown = median(&mut ratios);
    let cpu_us = median(&mut cpu_per_event);
    let total_runs: u64 = programs.iter().map(|p| p.runs).sum();
    let mean_ns = programs
        .iter()
        .map(|p| p.ns_per_run * p.runs as f64)
        .sum::<f64>()
        / total_runs.max(1) as f64;

    let mut md = String::new();
    md.push_str(&format!(
        "Measured by `cargo xtask bench storm` ({n} fork+exec of /bin/true from a shell in a \
         pod cgroup; {rounds} rounds, each without, with, with and without the agent; the \
         slowdown is the median of the rounds' ratios, the times medians of their means) on {}.\n\n",
        machine()
    ));
    md.push_str("| figure | value | goal |\n| --- | --- | --- |\n");
    md.push_str(&format!(
        "| storm without agent | {tb:.2} s | |\n| storm with agent | {tw:.2} s | |\n"
    ));
    md.push_str(&format!("| slowdown | {slowdown:.3}x | <= 1.15x |\n"));
    md.push_str(&format!(
        "| notifications received ({rounds} rounds) | {events} | |\n| notifications lost | {lost} | 0 |\n"
    ));
    md.push_str(&format!(
        "| agent CPU per lifecycle event | {cpu_us:.2} us | <= 5 us |\n| agent RSS after the storms | {:.1} MiB | |\n",
        rss as f64 / 1024.0
    ));
    md.push_str(&format!(
        "| eBPF run time per event, all programs | {mean_ns:.0} ns | <= 1000 ns |\n\n"
    ));
    md.push_str("| program | runs | ns per run |\n| --- | --- | --- |\n");
    for p in &programs {
        md.push_str(&format!(
            "| {} | {} | {:.0} |\n",
            p.name, p.runs, p.ns_per_run
        ));
    }
    let result = format!(
        "RESULT lost={lost} slowdown={slowdown:.3} agent_us_per_event={cpu_us:.2} bpf_ns_per_event={mean_ns:.0}"
    );
    Ok(StormFigures {
        lost,
        slowdown,
        cpu_us_per_event: cpu_us,
        bpf_ns_per_event: mean_ns,
        fork_ns: programs
            .iter()
            .find(|p| p.name == "proc_fork")
            .map_or(f64::NAN, |p| p.ns_per_run),
        md,
        result,
    })
}

/// The agent's CPU per second with GPU sampling off.
fn idle_cost(bin: &Path, env: &[(&str, &str)]) -> Result<f64> {
    let idle_secs = 10.0;
    let agent = Agent::start_full(bin, "[nvml]\nenabled = false\n", &[], env);
    settle(&agent);
    let c0 = cpu_ns(agent.pid())?;
    std::thread::sleep(Duration::from_secs_f64(idle_secs));
    let idle_ns_per_s = (cpu_ns(agent.pid())? - c0) as f64 / idle_secs;
    Ok(idle_ns_per_s)
}

fn gpu(n: u32, pods: u32, cycles: u32, no_write: bool) -> Result<()> {
    require_root()?;
    let bin = release_agent()?;
    let node = crate::benchkit::agent::GpuNode::build(n, pods)?;
    let lib = &node.lib;
    let env = [("FAKE_NVML_SCENARIO", node.scenario.to_str().unwrap())];
    let lib_arg = lib.to_str().unwrap();

    // Baseline: the same agent with GPU sampling off.
    let idle_ns_per_s = idle_cost(&bin, &env)?;

    let agent = Agent::start_full(&bin, "", &["--nvml-lib", lib_arg], &env);
    let wait_samples = |agent: &Agent, k: u64| {
        let deadline = Instant::now() + Duration::from_secs(k * 3 + 10);
        loop {
            let s = agent.stats();
            if counter(&s, "nvml_samples") >= k || Instant::now() > deadline {
                return s;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let s0 = wait_samples(&agent, 3);
    let c0 = cpu_ns(agent.pid())?;
    let t0 = Instant::now();
    // Sleep through the window: polling the agent would be measured as its cost.
    std::thread::sleep(Duration::from_millis(cycles as u64 * 1000 + 200));
    let c1 = cpu_ns(agent.pid())?;
    let secs = t0.elapsed().as_secs_f64();
    let s1 = agent.stats();
    let rss = rss_kib(agent.pid())?;
    let snap = agent.json("/debug/snapshot");
    drop(agent);

    let k = (counter(&s1, "nvml_samples") - counter(&s0, "nvml_samples")).max(1) as f64;
    let join_us = (counter(&s1, "join_cpu_ns") - counter(&s0, "join_cpu_ns")) as f64 / k / 1000.0;
    let sample_us = (counter(&s1, "nvml_sample_cpu_ns") - counter(&s0, "nvml_sample_cpu_ns"))
        as f64
        / k
        / 1000.0;
    let total_us = ((c1 - c0) as f64 - idle_ns_per_s * secs) / k / 1000.0;
    let joined = attributed_in(&snap);
    if joined != n as usize {
        bail!("only {joined} of {n} GPU processes were attributed to their containers");
    }

    let mut md = format!(
        "Measured by `cargo xtask bench gpu` ({} GPUs from tests/scenarios/h100-8gpu.json \
         through the fake libnvidia-ml.so, {n} GPU processes that are real processes in {pods} \
         pod cgroups, 1 Hz, {k} cycles) on {}.\n\n",
        node.gpus,
        machine()
    );
    md.push_str("| figure (per cycle) | value | goal |\n| --- | --- | --- |\n");
    md.push_str(&format!(
        "| join + snapshot publish (agent's own work) | {join_us:.0} us | < 1000 us |\n"
    ));
    md.push_str(&format!(
        "| NVML sampling thread (nvml-wrapper and the library's calls included) | {sample_us:.0} us | |\n"
    ));
    md.push_str(&format!(
        "| whole agent, above its idle cost | {total_us:.0} us | |\n| agent idle cost | {:.0} us/s | |\n",
        idle_ns_per_s / 1000.0
    ));
    md.push_str(&format!(
        "| processes attributed | {joined} of {n} | all |\n| agent RSS | {:.1} MiB | |\n",
        rss as f64 / 1024.0
    ));
    println!("{md}");
    println!(
        "RESULT join_us={join_us:.0} sample_us={sample_us:.0} total_us={total_us:.0} rss_mb={:.1}",
        rss as f64 / 1024.0
    );
    if !no_write {
        write_section("gpu", &md)?;
    }
    Ok(())
}

/// `cargo bench -p otel --bench export -- N` (release profile): building and encoding one
/// OTLP export, and rendering /metrics, for N containers x 8 GPUs.
pub(crate) struct ExportBench {
    pub build_us: f64,
    pub bytes: f64,
    pub prom_us: f64,
    pub prom_bytes: f64,
}

pub(crate) fn export_bench(n: u32) -> Result<ExportBench> {
    // cargo_command: with xtask's CARGO_* variables, ring's build script would rerun, and
    // every crate above it be rebuilt here and again by the next `cargo build`.
    let out = cargo_command()
        .args([
            "bench",
            "-q",
            "-p",
            "otel",
            "--bench",
            "export",
            "--",
            &n.to_string(),
        ])
        .stderr(Stdio::inherit())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("BENCH "))
        .with_context(|| format!("no BENCH line from cargo bench: {text}"))?;
    let field = |k: &str| -> f64 {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    eprintln!("{line}");
    Ok(ExportBench {
        build_us: field("build_us"),
        bytes: field("bytes"),
        prom_us: field("prom_us"),
        prom_bytes: field("prom_bytes"),
    })
}

/// The agent's RSS and export counters every 30 s while its collector is unreachable:
/// (seconds since start, RSS MiB, /debug/stats).
fn dead_collector(n: u32, minutes: u32) -> Result<Vec<(u64, f64, Value)>> {
    require_root()?;
    let bin = release_agent()?;
    cargo(&["build", "--release", "-p", "fake-nvml"])?;
    let lib = workspace_root().join("target/release/libnvidia_ml.so");
    let pods = make_pods(n as usize);
    let procs: Vec<tests::cgroups::Proc> = pods
        .iter()
        .map(|Pod { cg, .. }| {
            let mut c = Command::new("sleep");
            c.arg("7200");
            tests::cgroups::Proc(cg.spawn(&mut c))
        })
        .collect();
    let devices: Vec<Value> = (0..8)
        .map(|i| {
            let ps: Vec<Value> = procs
                .iter()
                .map(|p| serde_json::json!({"pid": p.pid(), "used_memory": 1u64 << 28, "sm_util": 3, "mem_util": 1, "enc_util": 0, "dec_util": 0}))
                .collect();
            serde_json::json!({"uuid": format!("GPU-{i:08x}-1111-2222-3333-444444444444"), "name": "NVIDIA H100 80GB HBM3",
                "memory_total": 85520809984u64, "memory_used": 1u64 << 36, "utilization_gpu": 60, "utilization_memory": 20,
                "power_mw": 500000, "temperature_c": 55, "processes": ps})
        })
        .collect();
    let path = std::env::temp_dir().join(format!("bench-export-{}.json", random_hex(8)));
    std::fs::write(&path, serde_json::json!({"devices": devices}).to_string())?;
    let dead = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let endpoint = format!("http://127.0.0.1:{dead}");
    let agent = Agent::start_full(
        &bin,
        "",
        &["--nvml-lib", lib.to_str().unwrap()],
        &[
            ("FAKE_NVML_SCENARIO", path.to_str().unwrap()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_METRIC_EXPORT_INTERVAL", "1000"),
        ],
    );
    let mut samples = vec![];
    let started = Instant::now();
    let total = Duration::from_secs(minutes as u64 * 60);
    while started.elapsed() < total {
        std::thread::sleep(
            Duration::from_secs(30)
                .min(total.saturating_sub(started.elapsed()))
                .max(Duration::from_secs(1)),
        );
        let s = agent.stats();
        let rss = rss_kib(agent.pid())? as f64 / 1024.0;
        eprintln!(
            "{:>4.0}s rss {rss:.1} MiB, queued {} KiB, dropped {}, failures {}",
            started.elapsed().as_secs_f64(),
            counter(&s, "export_queued_bytes") / 1024,
            counter(&s, "export_dropped_batches"),
            counter(&s, "export_failures")
        );
        samples.push((started.elapsed().as_secs(), rss, s));
    }
    drop(agent);
    let _ = std::fs::remove_file(&path);
    drop(procs);
    drop(pods);
    Ok(samples)
}

fn export(n: u32, minutes: u32, no_write: bool) -> Result<()> {
    // 1. Building and encoding one export.
    let ExportBench {
        build_us,
        bytes: size,
        prom_us,
        prom_bytes: prom_size,
    } = export_bench(n)?;

    // 2. The real agent pushing to a dead collector for `minutes`.
    let samples = dead_collector(n, minutes)?;
    let first = samples.first().map(|s| s.1).unwrap_or(0.0);
    let max = samples.iter().map(|s| s.1).fold(0.0, f64::max);
    let last = samples.last().unwrap();
    let mid = &samples[samples.len() / 2];
    let mut md = format!(
        "Measured by `cargo xtask bench export` on {}.\n\n| figure | value | goal |\n| --- | --- | --- |\n",
        machine()
    );
    md.push_str(&format!(
        "| build + encode one OTLP export, {n} containers x 8 GPUs | {build_us:.0} us CPU, {:.0} KiB | |\n",
        size / 1024.0
    ));
    md.push_str(&format!(
        "| render /metrics for the same (dcgm names on) | {prom_us:.0} us CPU, {:.0} KiB | |\n",
        prom_size / 1024.0
    ));
    md.push_str(&format!(
        "| agent RSS, dead collector: after 30 s / at {} s / at {} s (max) | {first:.1} / {:.1} / {:.1} MiB ({max:.1}) | no growth |\n",
        mid.0, last.0, mid.1, last.1
    ));
    md.push_str(&format!(
        "| export queue at the end (bounded at 8 MiB) | {} KiB, {} batches dropped, {} failed attempts | |\n",
        counter(&last.2, "export_queued_bytes") / 1024,
        counter(&last.2, "export_dropped_batches"),
        counter(&last.2, "export_failures")
    ));
    println!("{md}");
    println!("RESULT build_us={build_us:.0} rss_first_mb={first:.1} rss_last_mb={:.1} rss_max_mb={max:.1}", last.1);
    if !no_write {
        write_section("export", &md)?;
    }
    Ok(())
}
