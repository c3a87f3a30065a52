//! `cargo xtask bench rightsize`: `gpu-agent rightsize --prometheus` on a synthetic cluster's
//! history in a real Prometheus (docs/benchmarks.md).
//!
//! 1. The cluster (cluster.rs): 500 nodes of 8 GPUs, about 6,000 containers of workloads
//!    whose recommendations are known, over 14 days.
//! 2. Its series as OpenMetrics (openmetrics.rs), one file per 18-hour block, written on a
//!    thread while `promtool tsdb create-blocks-from openmetrics` imports the one before.
//! 3. Prometheus on those blocks; `promtool tsdb create-blocks-from rules` evaluates the
//!    recording rules (deploy/prometheus/gpu-agent-rightsizing.yaml) over the history.
//! 4. Prometheus restarted with the rules' blocks (it merges them into the raw ones).
//! 5. `gpu-agent rightsize --prometheus` three times, timed; its answer must be the
//!    generator's (check.rs); Prometheus's RSS, the series and the data's size.
mod check;
mod cluster;
mod openmetrics;
mod prom;

use std::{
    io::{BufWriter, Write},
    path::{Path, PathBuf},
    process::Command,
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::{
    benchkit::host::{machine, release_agent, write_section},
    workspace_root,
};
use cluster::{Cluster, HOUR, STEP};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Nodes of 8 GPUs (a small number for a quick run: 20 has every workload class).
    #[arg(long, default_value_t = 500)]
    pub nodes: u32,
    /// Days of history.
    #[arg(long, default_value_t = 14)]
    pub days: u64,
    /// Seconds between scrapes: a divisor of the rules' 300.
    #[arg(long, default_value_t = 300)]
    pub scrape: u64,
    /// Keep target/bench-rightsize/ (the TSDB) afterwards.
    #[arg(long)]
    pub keep: bool,
    /// Print only; do not rewrite docs/benchmarks.md.
    #[arg(long)]
    pub no_write: bool,
}

/// The blocks promtool writes and Prometheus keeps at its default retention.
const BLOCK: u64 = 18 * HOUR;
const RUNS: usize = 3;

/// What the bench measured.
#[derive(Default, Debug)]
struct Figures {
    containers: usize,
    workloads: usize,
    gpus: usize,
    samples: u64,
    openmetrics_bytes: u64,
    generate: Duration,
    import: Duration,
    load_wall: Duration,
    rules: Duration,
    merge: Duration,
    runs: Vec<Duration>,
    rss_mib: f64,
    hwm_mib: f64,
    series: Vec<(String, usize)>,
    data_bytes: u64,
    saved: f64,
    total: Duration,
}

pub fn run(a: Args) -> Result<()> {
    if a.scrape == 0 || !STEP.is_multiple_of(a.scrape) {
        bail!("--scrape {}: give a divisor of {STEP}", a.scrape);
    }
    if a.days < 2 || a.days > 14 {
        bail!("--days {}: give 2 to 14", a.days);
    }
    for tool in ["prometheus", "promtool"] {
        if crate::on_path(tool).is_none() && !crate::tools::ensure_prometheus() {
            bail!("{tool} is not installed: {}", tests::prom::INSTALL);
        }
    }
    let bin = release_agent()?;
    let started = Instant::now();
    let dir = workspace_root().join("target/bench-rightsize");
    let _ = std::fs::remove_dir_all(&dir);
    let data = dir.join("data");
    std::fs::create_dir_all(&data)?;
    // The history ends an hour ago: live rule evaluations (5 m lookback) see none of it.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let end = now.as_secs() / STEP * STEP - HOUR;
    let c = Cluster::new(a.nodes, a.days, end);
    let answers = cluster::answers(&c);
    let mut f = Figures {
        containers: c.containers(),
        workloads: c.workloads.len(),
        gpus: c.gpus(),
        saved: answers.iter().map(|x| x.gpus_saved).sum(),
        ..Default::default()
    };
    eprintln!(
        "xtask: {} nodes, {} GPUs, {} devices, {} workloads, {} containers ({} on devices) over {} days",
        c.nodes,
        f.gpus,
        c.devices.len(),
        f.workloads,
        f.containers,
        c.container_series(),
        a.days
    );
    load(&c, &dir, &data, a.scrape, &mut f)?;
    let rules = workspace_root().join("deploy/prometheus/gpu-agent-rightsizing.yaml");
    let server = backfill_rules(&c, &dir, &data, &rules, &mut f)?;
    check_phase(&server, c.end)?;
    let out = time_rightsize(&bin, &server, &mut f)?;
    (f.rss_mib, f.hwm_mib) = server.memory_mib()?;
    f.series = server.series_by_name(c.start, c.end + STEP)?;
    for (name, n) in &f.series {
        eprintln!("xtask: {n} series {name}");
    }
    f.data_bytes = prom::size(&data);
    server.stop()?;
    f.total = started.elapsed();
    let diff = check::differences(&answers, &out);
    if !a.keep {
        std::fs::remove_dir_all(&dir)?;
    }
    if !diff.is_empty() {
        for d in diff.iter().take(20) {
            eprintln!("xtask: {d}");
        }
        bail!(
            "rightsize --prometheus did not reproduce the generator's answer: {} of {} workloads differ (above, the first 20)",
            diff.len(),
            answers.len()
        );
    }
    let md = markdown(&a, &f);
    println!("{md}");
    println!("{}", result_line(&f));
    if !a.no_write {
        write_section("rightsize", &md)?;
    }
    Ok(())
}

/// The 18-hour ranges of the history, aligned as promtool and Prometheus align blocks.
fn ranges(c: &Cluster) -> Vec<(u64, u64)> {
    let mut v = vec![];
    let mut at = c.start / BLOCK * BLOCK;
    while at < c.end {
        v.push((at.max(c.start), (at + BLOCK).min(c.end)));
        at += BLOCK;
    }
    v
}

/// Writes each range's OpenMetrics file on a thread, one ahead of promtool, which turns
/// each into a block of `data`; each file is removed once imported.
fn load(c: &Cluster, dir: &Path, data: &Path, scrape: u64, f: &mut Figures) -> Result<()> {
    let all = openmetrics::series(c);
    let series = &all;
    let wall = Instant::now();
    let (tx, rx) = mpsc::sync_channel::<Result<(PathBuf, u64, u64, Duration)>>(1);
    let max_block = format!("--max-block-duration={}h", BLOCK / HOUR);
    std::thread::scope(|s| -> Result<()> {
        s.spawn(move || {
            for (i, range) in ranges(c).into_iter().enumerate() {
                let path = dir.join(format!("history-{i:02}.om"));
                let t = Instant::now();
                let r = write_file(&path, series, range, scrape);
                let sent = tx.send(r.map(|(n, bytes)| (path, n, bytes, t.elapsed())));
                if sent.is_err() {
                    return;
                }
            }
        });
        for msg in rx {
            let (path, n, bytes, took) = msg?;
            (f.samples, f.openmetrics_bytes) = (f.samples + n, f.openmetrics_bytes + bytes);
            f.generate += took;
            let t = Instant::now();
            let p = path.to_string_lossy();
            let d = data.to_string_lossy();
            let args = [
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                "-q",
                &max_block,
                &p,
                &d,
            ];
            prom::promtool(&args)?;
            f.import += t.elapsed();
            std::fs::remove_file(&path)?;
            eprintln!(
                "xtask: imported {p}: {n} samples in {:.1} s",
                t.elapsed().as_secs_f64()
            );
        }
        Ok(())
    })?;
    f.load_wall = wall.elapsed();
    let want = openmetrics::samples(series, scrape);
    if f.samples != want {
        bail!("wrote {} samples, the series have {want}", f.samples);
    }
    Ok(())
}

fn write_file(
    path: &Path,
    series: &[openmetrics::Series],
    range: (u64, u64),
    scrape: u64,
) -> Result<(u64, u64)> {
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let n = openmetrics::write_range(&mut w, series, range, scrape)?;
    openmetrics::write_eof(&mut w)?;
    w.flush()?;
    Ok((n, std::fs::metadata(path)?.len()))
}

/// Prometheus on the raw blocks; promtool evaluates the rules over the history into blocks
/// of their own; Prometheus restarted with them, once it has merged them into the raw ones.
fn backfill_rules(
    c: &Cluster,
    dir: &Path,
    data: &Path,
    rules: &Path,
    f: &mut Figures,
) -> Result<prom::Server> {
    let raw_blocks = prom::blocks(data).len();
    let server = prom::Server::start(dir, data, rules)?;
    let t = Instant::now();
    let out = dir.join("rule-blocks");
    let (url, o) = (format!("--url={}", server.url()), out.to_string_lossy());
    let (start, end) = (
        format!("--start={}", c.start),
        format!("--end={}", c.end + STEP),
    );
    let max_block = format!("--max-block-duration={}h", BLOCK / HOUR);
    let rules_file = rules.to_string_lossy();
    let args = [
        "tsdb",
        "create-blocks-from",
        "rules",
        "-q",
        &url,
        &start,
        &end,
        &max_block,
        "--output-dir",
        &o,
        &rules_file,
    ];
    prom::promtool(&args)?;
    f.rules = t.elapsed();
    eprintln!("xtask: rules backfilled in {:.1} s", f.rules.as_secs_f64());
    server.stop()?;
    let t = Instant::now();
    for b in prom::blocks(&out) {
        std::fs::rename(&b, data.join(b.file_name().context("block name")?))?;
    }
    let server = prom::Server::start(dir, data, rules)?;
    // It merges overlapping blocks a minute after start, then one group after another.
    let deadline = Instant::now() + Duration::from_secs(1200);
    while prom::blocks(data).len() > raw_blocks
        || server.own_metric("prometheus_tsdb_blocks_loaded") != Some(raw_blocks as f64)
    {
        if Instant::now() > deadline {
            bail!(
                "Prometheus did not merge the rules' blocks in 20 minutes: {}",
                server.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    f.merge = t.elapsed();
    eprintln!(
        "xtask: Prometheus merged the rules' blocks in {:.1} s",
        f.merge.as_secs_f64()
    );
    Ok(server)
}

/// The rules' evaluations must fall between the scrapes' 5-minute marks (Prometheus puts
/// a group at a phase of its name's hash): one on a mark would see a container's first
/// sample and, its lookback inclusive, its last one 5 minutes later once more.
fn check_phase(server: &prom::Server, end: u64) -> Result<()> {
    let q = "max(timestamp(model:hw_gpu_memory_limit_bytes:max))";
    let at = server.query(q, end)?;
    match at.first().map(|(_, t)| *t) {
        Some(t) if !((t * 1000.0).round() as u64).is_multiple_of(STEP * 1000) => Ok(()),
        t => bail!("the rules' evaluation at {t:?} is not between the scrapes' 5-minute marks"),
    }
}

/// `gpu-agent rightsize --prometheus` RUNS times; the last answer.
fn time_rightsize(bin: &Path, server: &prom::Server, f: &mut Figures) -> Result<String> {
    let mut last = String::new();
    for i in 0..RUNS {
        let t = Instant::now();
        let out = Command::new(bin)
            .args(["rightsize", "--prometheus", &server.url()])
            .args(["--since", "15d", "--min-coverage", cluster::MIN_COVERAGE.0])
            .args(["--format", "json"])
            .output()
            .with_context(|| format!("running {}", bin.display()))?;
        let took = t.elapsed();
        if !out.status.success() {
            bail!(
                "gpu-agent rightsize --prometheus failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let text = String::from_utf8(out.stdout)?;
        if i > 0 && text != last {
            bail!(
                "gpu-agent rightsize --prometheus answered differently on run {}",
                i + 1
            );
        }
        eprintln!(
            "xtask: rightsize --prometheus: {:.2} s, {} lines",
            took.as_secs_f64(),
            text.lines().count()
        );
        f.runs.push(took);
        last = text;
    }
    Ok(last)
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn series_counts(f: &Figures) -> (usize, usize) {
    let recorded = |n: &str| n.contains(':');
    let count = |want: bool| {
        (f.series.iter())
            .filter(|(n, _)| recorded(n) == want)
            .map(|(_, k)| k)
            .sum()
    };
    (count(false), count(true))
}

fn markdown(a: &Args, f: &Figures) -> String {
    let (raw, recorded) = series_counts(f);
    let runs: Vec<String> = f.runs.iter().map(|d| format!("{:.2}", secs(*d))).collect();
    let best = f.runs.iter().min().copied().unwrap_or_default();
    let met = if secs(best) < 30.0 { "met" } else { "not met" };
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    format!(
        "Measured by `cargo xtask bench rightsize` on {} in {:.0} s: {} nodes, {} GPUs, {} \
         workloads' {} containers over {} days, scraped every {} s: {:.1} M samples ({:.1} GiB \
         of OpenMetrics), written in {:.0} s and imported in {:.0} s side by side ({:.0} s); the \
         rules backfilled in {:.0} s; Prometheus restarted and their blocks merged in {:.0} s. \
         Series: {raw} raw, {recorded} recorded; TSDB {:.2} GiB. Prometheus after the queries: \
         VmRSS {:.0} MiB, VmHWM {:.0} MiB (the merge's peak). rightsize's three runs: {} s; \
         its answer the generator's ({:.1} GPUs reclaimable).\n\n\
         | target | goal | measured | |\n| --- | --- | --- | --- |\n\
         | `gpu-agent rightsize --prometheus`, {} GPUs, {} days | < 30 s, the known answer | \
         {:.2} s, reproduced | {met} |\n",
        machine(),
        secs(f.total),
        a.nodes,
        f.gpus,
        f.workloads,
        f.containers,
        a.days,
        a.scrape,
        f.samples as f64 / 1e6,
        gib(f.openmetrics_bytes),
        secs(f.generate),
        secs(f.import),
        secs(f.load_wall),
        secs(f.rules),
        secs(f.merge),
        gib(f.data_bytes),
        f.rss_mib,
        f.hwm_mib,
        runs.join(", "),
        f.saved,
        f.gpus,
        a.days,
        secs(best),
    )
}

fn result_line(f: &Figures) -> String {
    let (raw, recorded) = series_counts(f);
    let best = f.runs.iter().min().copied().unwrap_or_default();
    let worst = f.runs.iter().max().copied().unwrap_or_default();
    format!(
        "RESULT rightsize_s={:.2} rightsize_s_max={:.2} prometheus_rss_mb={:.0} prometheus_hwm_mb={:.0} \
         series_raw={raw} series_recorded={recorded} samples={} workloads={} gpus_saved={:.3} \
         load_s={:.0} rules_s={:.0} merge_s={:.0} bench_s={:.0}",
        secs(best),
        secs(worst),
        f.rss_mib,
        f.hwm_mib,
        f.samples,
        f.workloads,
        f.saved,
        secs(f.load_wall),
        secs(f.rules),
        secs(f.merge),
        secs(f.total)
    )
}
