//! `cargo xtask bench gpu --real-node`: what a real node pays for NVML. The 8-GPU scenario
//! through the fake library with `FAKE_NVML_COST=measured` (each call spins for the CPU a
//! real driver took for it), a few real processes per GPU. The agent's CPU is read from
//! /proc after each cycle, whose start the fake library's call counts (FAKE_NVML_CALLS) tell,
//! so each cycle's cost is known.
//! With `GPU_AGENT_BENCH_PAIR=PATH` the agent at PATH runs beside this tree's over the same
//! window and processes: the same-run pair.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;
use tests::{random_hex, Agent};

use crate::benchkit::host::{cpu_ns, machine, median, release_agent, require_root, write_section};

/// One poll of one agent: cycles begun (the device count's calls), the whole process's CPU
/// and the NVML threads' (the sampler and its readers), ns.
struct Poll {
    cycles: u64,
    cpu: u64,
    nvml: u64,
    calls: Value,
}

/// One agent's figures over the window.
struct Figures {
    cycles: u64,
    /// Per cycle, ms: the whole agent's CPU.
    cpu: Vec<f64>,
    mean_ms: f64,
    nvml_mean_ms: f64,
    /// Calls per cycle by function, and all of them.
    calls: BTreeMap<String, f64>,
    calls_total: f64,
}

impl Figures {
    fn median_ms(&self) -> f64 {
        median(&mut self.cpu.clone())
    }

    /// The worst cycle of each 10-cycle (10 s) window.
    fn worst_by_window(&self) -> Vec<f64> {
        (self.cpu.chunks(10))
            .map(|w| w.iter().copied().fold(0.0, f64::max))
            .collect()
    }

    fn worst_ms(&self) -> f64 {
        self.cpu.iter().copied().fold(0.0, f64::max)
    }
}

/// The CPU of the agent's NVML threads (`nvml`, `nvml-reader`), ns.
fn nvml_threads_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    let mut total = 0;
    for t in tasks.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !matches!(comm.trim(), "nvml" | "nvml-reader") {
            continue;
        }
        let s = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
        total += (s.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

fn poll(pid: u32, calls: &Path) -> Result<Poll> {
    let c = tests::nvml::read_calls(calls).context("no whole FAKE_NVML_CALLS record")?;
    let n = |k: &str| c["calls"][k].as_u64().unwrap_or(0);
    Ok(Poll {
        cycles: n("nvmlDeviceGetCount_v2") + n("nvmlDeviceGetCount"),
        cpu: cpu_ns(pid)?,
        nvml: nvml_threads_ns(pid),
        calls: c,
    })
}

/// Reads one agent 450 ms after each cycle starts (its work done by then) for `cycles`
/// cycles, after `warm`: each reading then spans whole cycles, whatever the agent's timer
/// drifts by. The counts file is read every 10 ms meanwhile, at the bench's own cost.
fn watch(pid: u32, calls: &Path, warm: u64, cycles: u64) -> Result<Vec<Poll>> {
    let deadline = Instant::now() + Duration::from_secs(warm + 2 * cycles + 30);
    let started = |n: u64| -> Result<Instant> {
        loop {
            if Instant::now() > deadline {
                bail!("the agent did not reach {n} cycles");
            }
            if tests::nvml::read_calls(calls).is_some_and(|c| {
                let k = |f: &str| c["calls"][f].as_u64().unwrap_or(0);
                k("nvmlDeviceGetCount_v2") + k("nvmlDeviceGetCount") >= n
            }) {
                return Ok(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let mut polls: Vec<Poll> = vec![];
    let mut next = warm + 1;
    while polls.len() as u64 <= cycles {
        let at = started(next)? + Duration::from_millis(450);
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        let p = poll(pid, calls)?;
        next = p.cycles + 1;
        polls.push(p);
    }
    Ok(polls)
}

/// Each cycle's cost from the polls: a reading that spans n cycles gives each 1/n of its
/// CPU.
fn figures(polls: &[Poll]) -> Figures {
    let mut cpu = vec![];
    let mut from = &polls[0];
    for p in &polls[1..] {
        let n = p.cycles - from.cycles;
        if n == 0 {
            continue;
        }
        for _ in 0..n {
            cpu.push((p.cpu - from.cpu) as f64 / n as f64 / 1e6);
        }
        from = p;
    }
    let (a, b) = (&polls[0], polls.last().unwrap());
    let cycles = (b.cycles - a.cycles).max(1);
    let count = |v: &Value, k: &str| v["calls"][k].as_u64().unwrap_or(0) as f64;
    let calls = (b.calls["calls"].as_object().into_iter().flatten())
        .map(|(k, _)| {
            (
                k.clone(),
                (count(&b.calls, k) - count(&a.calls, k)) / cycles as f64,
            )
        })
        .filter(|(_, n)| *n > 0.0)
        .collect();
    let total = |v: &Value| v["total"].as_u64().unwrap_or(0) as f64;
    Figures {
        cycles,
        cpu,
        mean_ms: (b.cpu - a.cpu) as f64 / cycles as f64 / 1e6,
        nvml_mean_ms: (b.nvml - a.nvml) as f64 / cycles as f64 / 1e6,
        calls,
        calls_total: (total(&b.calls) - total(&a.calls)) / cycles as f64,
    }
}

/// A running agent and its counts file.
struct Running {
    agent: Agent,
    calls: PathBuf,
}

fn start(bin: &Path, config: &str, lib: &Path, scenario: &Path) -> Running {
    let calls = std::env::temp_dir().join(format!("bench-gpu-calls-{}.json", random_hex(8)));
    let agent = Agent::start_full(
        bin,
        config,
        &["--nvml-lib", lib.to_str().unwrap()],
        &[
            ("FAKE_NVML_SCENARIO", scenario.to_str().unwrap()),
            ("FAKE_NVML_COST", "measured"),
            ("FAKE_NVML_CALLS", calls.to_str().unwrap()),
        ],
    );
    Running { agent, calls }
}

pub(crate) fn run(n: u32, pods: u32, cycles: u32, gpm: bool, no_write: bool) -> Result<()> {
    require_root()?;
    let bin = release_agent()?;
    let pair = std::env::var_os("GPU_AGENT_BENCH_PAIR").map(PathBuf::from);
    let config = std::env::var("GPU_AGENT_BENCH_CONFIG").unwrap_or_default();
    let node = crate::benchkit::agent::GpuNode::build(n, pods)?;
    let (lib, path) = (&node.lib, &node.scenario);
    if gpm {
        with_gpm(path)?;
    }

    let mut agents = vec![("this build".to_string(), start(&bin, &config, lib, path))];
    if let Some(p) = &pair {
        agents.push((p.display().to_string(), start(p, "", lib, path)));
    }
    // Both watched over the same seconds, each at its own phase.
    let figs: Vec<Figures> = std::thread::scope(|s| {
        let hs: Vec<_> = (agents.iter())
            .map(|(_, r)| s.spawn(|| watch(r.agent.pid(), &r.calls, 3, cycles as u64)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("watcher").map(|p| figures(&p)))
            .collect::<Result<_>>()
    })?;
    for (_, r) in &agents {
        let _ = std::fs::remove_file(&r.calls);
    }
    drop(agents);

    let md = report(n, &figs, pair.is_some());
    println!("{md}");
    let f = &figs[0];
    let mut result = format!(
        "RESULT mean_ms={:.2} median_ms={:.2} worst_ms={:.2} worst_over_median={:.2} nvml_ms={:.2} calls_per_cycle={:.1}",
        f.mean_ms,
        f.median_ms(),
        f.worst_ms(),
        f.worst_ms() / f.median_ms(),
        f.nvml_mean_ms,
        f.calls_total
    );
    if let Some(o) = figs.get(1) {
        result.push_str(&format!(
            " pair_mean_ms={:.2} pair_median_ms={:.2} pair_worst_ms={:.2} pair_nvml_ms={:.2} \
             pair_ratio={:.3} pair_median_ratio={:.3}",
            o.mean_ms,
            o.median_ms(),
            o.worst_ms(),
            o.nvml_mean_ms,
            o.mean_ms / f.mean_ms,
            o.median_ms() / f.median_ms()
        ));
    }
    println!("{result}");
    if !no_write && pair.is_none() {
        write_section("gpu-cost", &md)?;
    }
    Ok(())
}

/// Every GPU of the scenario at `path` answers GPM profiling (busy, as under training).
fn with_gpm(path: &Path) -> Result<()> {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let gpm = serde_json::json!({"sm_active": 0.6, "sm_occupancy": 0.4, "tensor_active": 0.3,
        "dram_active": 0.5, "pcie_tx_bytes": 1e9, "pcie_rx_bytes": 2e9});
    for d in v["devices"].as_array_mut().context("no devices")? {
        d["gpm"] = gpm.clone();
    }
    std::fs::write(path, serde_json::to_vec(&v)?)?;
    Ok(())
}

fn report(n: u32, figs: &[Figures], paired: bool) -> String {
    let f = &figs[0];
    let mut md = format!(
        "Measured by `cargo xtask bench gpu --real-node` (tests/scenarios/h100-8gpu.json's 8 \
         GPUs through the fake libnvidia-ml.so with `FAKE_NVML_COST=measured`, {n} GPU \
         processes that are real processes, 1 Hz, {} cycles after 3 of warm-up; the whole \
         agent's CPU from /proc after each cycle) on {}.\n\n",
        f.cycles,
        machine()
    );
    let ms = |v: f64| format!("{v:.1} ms");
    let col = |g: &dyn Fn(&Figures) -> String| figs.iter().map(g).collect::<Vec<_>>().join(" | ");
    md.push_str(if paired {
        "| per cycle | this build | the pair's |\n| --- | --- | --- |\n"
    } else {
        "| per cycle | value |\n| --- | --- |\n"
    });
    md.push_str(&format!(
        "| agent CPU, mean | {} |\n",
        col(&|f| ms(f.mean_ms))
    ));
    md.push_str(&format!(
        "| agent CPU, median | {} |\n",
        col(&|f| ms(f.median_ms()))
    ));
    md.push_str(&format!(
        "| agent CPU, worst cycle of each 10 s | {} |\n",
        col(&|f| (f.worst_by_window().iter().map(|w| format!("{w:.1}")))
            .collect::<Vec<_>>()
            .join(", ")
            + " ms")
    ));
    md.push_str(&format!(
        "| worst / median | {} |\n",
        col(&|f| format!("{:.2}x", f.worst_ms() / f.median_ms()))
    ));
    md.push_str(&format!(
        "| NVML threads, mean | {} |\n",
        col(&|f| ms(f.nvml_mean_ms))
    ));
    md.push_str(&format!(
        "| NVML calls | {} |\n\n",
        col(&|f| format!("{:.1}", f.calls_total))
    ));
    md.push_str(if paired {
        "| function | calls per cycle | the pair's |\n| --- | --- | --- |\n"
    } else {
        "| function | calls per cycle |\n| --- | --- |\n"
    });
    let mut names: Vec<&String> = figs.iter().flat_map(|f| f.calls.keys()).collect();
    names.sort();
    names.dedup();
    let per = |f: &Figures, name: &str| f.calls.get(name).copied().unwrap_or(0.0);
    names.sort_by(|a, b| per(f, b).total_cmp(&per(f, a)).then(a.cmp(b)));
    for name in names {
        md.push_str(&format!(
            "| {name} | {} |\n",
            col(&|f| format!("{:.2}", per(f, name)))
        ));
    }
    md
}
