//! `gpu-agent rightsize` and `report` stream the records: 200,000 of them (a large node's few
//! months, about 140 MB) are read in well under 64 MiB of memory, which grows with the
//! workloads, not the records.
use std::{
    io::{BufWriter, Write},
    process::{Command, Stdio},
};

use serde_json::json;
use tests::{agent_binary, TempDir};

const RECORDS: u64 = 200_000;
const LIMIT_KIB: i64 = 64 * 1024;

/// The child's peak resident set, KiB, from wait4's rusage (wait4 reaps it: std's wait
/// would not give the rusage).
#[allow(clippy::zombie_processes)]
fn peak_rss_kib(cmd: &mut Command) -> i64 {
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut status = 0;
    // SAFETY: all-zero is a valid rusage; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a child of this process not yet waited for; valid out-pointers.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{cmd:?}: {status}"
    );
    usage.ru_maxrss
}

#[test]
fn two_hundred_thousand_records_take_a_bounded_memory() {
    let dir = TempDir::new("rightsize-memory");
    let file = dir.0.join("usage.jsonl");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut w = BufWriter::new(std::fs::File::create(&file).unwrap());
    // 500 workloads of 2,000 containers on 8 GPUs, hourly records over 100 hours.
    for i in 0..RECORDS {
        let (c, hour) = (i % 2000, i / 2000);
        let r = json!({
            "container_id": format!("{c:064x}"), "pod_uid": format!("uid-{c}"),
            "pod_name": format!("pod-{c}"), "namespace": "ml", "container_name": "main",
            "node": "node-a", "uuid": format!("GPU-{:08}-aaaa-bbbb-cccc-dddddddddddd", i % 8),
            "gpu_uuid": "GPU-x", "start_ms": now - (hour + 1) * 3_600_000,
            "end_ms": now - hour * 3_600_000, "gpu_seconds": 60.0,
            "memory_byte_seconds": 1e12, "memory_peak_bytes": 6u64 << 30, "energy_joules": 1000.0,
            "reason": "checkpoint", "workload_kind": "Deployment",
            "workload": format!("w-{}", i % 500), "replicaset": "w-abc",
            "sm_p50": 10, "sm_p95": 12, "sm_max": 30, "sm_source": "process_utilization",
            "memory_p95_bytes": 5u64 << 30, "device_model": "NVIDIA H100 80GB HBM3",
            "device_memory_bytes": 85_520_809_984u64, "gpus_allocated": 1.0,
        });
        writeln!(w, "{r}").unwrap();
    }
    w.flush().unwrap();
    drop(w);
    let f = file.to_str().unwrap();
    let rightsize = peak_rss_kib(Command::new(agent_binary()).args([
        "rightsize",
        "--file",
        f,
        "--since",
        "30d",
        "--plan",
        "--nvml-lib",
        "/nonexistent/x.so",
    ]));
    assert!(rightsize < LIMIT_KIB, "rightsize: {rightsize} KiB");
    let report = peak_rss_kib(
        Command::new(agent_binary()).args(["report", "--file", f, "--since", "30d", "--by", "pod"]),
    );
    assert!(report < LIMIT_KIB, "report: {report} KiB");
}
