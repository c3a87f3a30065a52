//! What a benchmark node yields: its row (the agent's window, then, with the agent stopped,
//! the three /proc baselines on the same node state), the large node's own figures, and
//! the short-lived processes' counts.
use std::{collections::HashMap, path::Path};

use anyhow::{bail, Result};
use gpu_agent::stats::thread_cpu_ns;
use serde_json::Value;

use crate::{
    benchkit::{
        agent::{Calls, Running, Window},
        host::{attributed_in, rss_kib},
    },
    classic,
};

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
    /// The bench's agent's memory after its window.
    pub memory: Memory,
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
    pub memory: Memory,
}

/// Where an agent's RSS is (`host::memory_map`), its live heap (`/debug/stats?heap=true`)
/// and its per-entity state's lengths.
pub(crate) struct Memory {
    pub map: crate::benchkit::host::MemoryMap,
    pub heap_live_kib: u64,
    pub lengths: Vec<(String, u64)>,
}

impl Memory {
    /// An agent's `Memory` as the table's cells: MiB by mapping, then the state lengths.
    pub(crate) fn cells(&self) -> Vec<String> {
        let mib = |k: u64| format!("{:.1}", k as f64 / 1024.0);
        let lengths: Vec<String> = self
            .lengths
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        vec![
            mib(self.map.binary),
            mib(self.map.libraries),
            mib(self.map.heap),
            mib(self.heap_live_kib),
            mib(self.map.bpf),
            mib(self.map.other),
            lengths.join(", "),
        ]
    }

    pub(crate) fn read(agent: &tests::Agent) -> anyhow::Result<Memory> {
        let stats = agent.json("/debug/stats?heap=true");
        let lengths = stats["state_lengths"]
            .as_object()
            .map(|o| {
                let v = o.iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)));
                v.filter(|(_, n)| *n > 0).collect()
            })
            .unwrap_or_default();
        Ok(Memory {
            map: crate::benchkit::host::memory_map(agent.pid())?,
            heap_live_kib: stats["heap_bytes"].as_u64().unwrap_or(0) / 1024,
            lengths,
        })
    }
}

/// The large node over the protocol the bench's agents do not use (`other_protocol`).
pub(crate) struct OtherProtocol {
    pub protocol: String,
    /// Its cost a cycle over the bench's protocol's, side by side (median of the rounds).
    pub ratio: f64,
    /// The agent's figure times that ratio, % of a core.
    pub cpu_pct: f64,
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
    let attributed = attributed_in(&r.agent.json("/debug/snapshot"));
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

pub(crate) struct ShortLived {
    pub total: usize,
    pub agent: usize,
    pub pid_read: usize,
    pub proc_scan: usize,
}

/// The short-lived GPU processes run and are looked up this many at a time.
pub(crate) const SHORT_ROUND: usize = 25;
