//! The machine side of a benchmark: pod cgroups, the agent build under test, exec storms,
//! a process's CPU time and RSS from /proc, the agent's counters, and the sections of
//! docs/benchmarks.md.
use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;
use tests::{
    cgroups::{systemd_container, TestCgroup},
    random_hex, random_uid, Agent,
};

use crate::{cargo, ebpf, workspace_root};

/// A pod cgroup in kubelet's systemd shape, with the container id the agent should find.
pub(crate) struct Pod {
    pub cg: TestCgroup,
    pub id: String,
}

pub(crate) fn make_pods(n: usize) -> Vec<Pod> {
    (0..n)
        .map(|_| {
            let id = random_hex(64);
            Pod {
                cg: TestCgroup::v2(&systemd_container(&random_uid(), &id)),
                id,
            }
        })
        .collect()
}

pub(crate) fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("benchmarks load eBPF programs and create cgroups: run them as root");
    }
    Ok(())
}

/// The agent under test: this tree's release build, or GPU_AGENT_BENCH_BIN (another
/// commit's build, for a before/after on the same kernel and machine state).
pub(crate) fn release_agent() -> Result<std::path::PathBuf> {
    if let Some(bin) = std::env::var_os("GPU_AGENT_BENCH_BIN") {
        eprintln!("xtask: benchmarking {}", bin.to_string_lossy());
        return Ok(bin.into());
    }
    ebpf::build()?;
    cargo(&["build", "--release", "-p", "agent"])?;
    Ok(workspace_root().join("target/release/gpu-agent"))
}

/// Runs `n` fork+exec of /bin/true from a shell placed in `cg`; returns the wall time.
pub(crate) fn run_storm(cg: &TestCgroup, n: u32) -> Result<Duration> {
    let script = format!("i=0; while [ $i -lt {n} ]; do /bin/true; i=$((i+1)); done");
    let mut cmd = Command::new("/bin/sh");
    cmd.args(["-c", &script]).stdout(Stdio::null());
    let started = Instant::now();
    let status = cg.spawn(&mut cmd).wait()?;
    let elapsed = started.elapsed();
    if !status.success() {
        bail!("storm shell failed: {status}");
    }
    Ok(elapsed)
}

/// CPU time of a process in nanoseconds (schedstat: ns resolution, all threads).
pub(crate) fn cpu_ns(pid: u32) -> Result<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let s = std::fs::read_to_string(task?.path().join("schedstat"))?;
        total += s
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(total)
}

pub(crate) fn rss_kib(pid: u32) -> Result<u64> {
    status_kib(pid, "VmRSS")
}

/// The most RSS the process has had (VmHWM), KiB.
pub(crate) fn hwm_kib(pid: u32) -> Result<u64> {
    status_kib(pid, "VmHWM")
}

fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no {field}"))
}

pub(crate) fn counter(stats: &Value, name: &str) -> u64 {
    stats[name].as_u64().unwrap_or(0)
}

/// Waits until the agent has drained what the storm queued (the count stops moving).
/// Longer than the ring's poll (500 ms) and the gc that refreshes the program statistics
/// (1 s): a count that barely moved for this long has settled.
const SETTLED_AFTER: Duration = Duration::from_millis(1200);
/// What the rest of the machine may add meanwhile (a shell loop, a cron job): a storm is
/// thousands.
const BACKGROUND_EVENTS: u64 = 100;

pub(crate) fn settle(agent: &Agent) -> Value {
    let mut last = agent.stats();
    loop {
        std::thread::sleep(SETTLED_AFTER);
        let now = agent.stats();
        let moved = counter(&now, "events_received") - counter(&last, "events_received");
        if moved < BACKGROUND_EVENTS {
            return now;
        }
        last = now;
    }
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

pub(crate) fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{} cores of {cpu}, kernel {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        kernel.trim()
    )
}

/// Replaces the text between `<!-- NAME:begin -->` and `<!-- NAME:end -->`.
pub(crate) fn write_section(name: &str, body: &str) -> Result<()> {
    let path = workspace_root().join("docs/benchmarks.md");
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let (begin, end) = (
        format!("<!-- {name}:begin -->"),
        format!("<!-- {name}:end -->"),
    );
    let new = match (text.find(&begin), text.find(&end)) {
        (Some(b), Some(e)) if b < e => {
            format!("{}{begin}\n{body}{}", &text[..b], &text[e..])
        }
        _ => format!("{text}\n{begin}\n{body}{end}\n"),
    };
    std::fs::write(&path, new)?;
    eprintln!("wrote {}", Path::new(&path).display());
    Ok(())
}

/// GPU processes a snapshot attributes to a container.
pub(crate) fn attributed_in(snap: &Value) -> usize {
    snap["containers"].as_array().map_or(0, |cs| {
        cs.iter()
            .filter(|c| !c["container_id"].is_null())
            .flat_map(|c| c["gpus"].as_array().unwrap().iter())
            .map(|g| g["pids"].as_array().unwrap().len())
            .sum()
    })
}

/// Where a process's resident memory is, KiB, from /proc/PID/smaps: the agent's own
/// binary, shared libraries, the heap (glibc's main arena and its other arenas, which are
/// anonymous maps, as thread stacks are), BPF maps and rings, the rest.
#[derive(Debug)]
pub(crate) struct MemoryMap {
    pub binary: u64,
    pub libraries: u64,
    pub heap: u64,
    pub bpf: u64,
    pub other: u64,
}

pub(crate) fn memory_map(pid: u32) -> Result<MemoryMap> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))?;
    let exe = exe.to_string_lossy();
    // binary, libraries, heap, BPF, other
    let mut kib = [0u64; 5];
    let mut class = 0;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or_default();
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            let path = line.split_whitespace().nth(5).unwrap_or_default();
            class = match path {
                p if p == exe => 0,
                p if p.contains(".so") => 1,
                "[heap]" | "" => 2,
                p if p.contains("bpf") => 3,
                _ => 4,
            };
        } else if let Some(v) = line.strip_prefix("Rss:") {
            kib[class] += v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
        }
    }
    let [binary, libraries, heap, bpf, other] = kib;
    Ok(MemoryMap {
        binary,
        libraries,
        heap,
        bpf,
        other,
    })
}

#[cfg(test)]
mod memory_tests {
    use super::*;

    #[test]
    fn a_process_memory_is_split_by_mapping() {
        // 64 MiB touched on the heap shows as heap (other tests' threads may free theirs
        // meanwhile: no comparison with a reading before).
        let block = vec![1u8; 64 << 20];
        let m = memory_map(std::process::id()).unwrap();
        assert!(m.heap >= 64 * 1024, "{m:?}");
        assert!(m.binary > 0 && m.libraries > 0, "{m:?}");
        assert!(m.binary + m.libraries < 64 * 1024, "{m:?}");
        drop(block);
    }
}
