//! `gpu-agent rightsize` on a usage-record file this test writes: the known answers from
//! the built-in MIG table, the same records read against the MIG profiles the (fake) NVML
//! library lists for this node's GPU, and bad input refused naming the flag.
use std::path::Path;

use serde_json::{json, Value};
use tests::{
    fake_nvml_lib,
    nvml::Scenario,
    rightsize::{line, rightsize, rightsize_json},
    TempDir,
};

const GIB: u64 = 1 << 30;
const MIN: u64 = 60_000;
const H100: &str = "NVIDIA H100 80GB HBM3";
const H100_MEMORY: u64 = 85_520_809_984;
const L4: &str = "NVIDIA L4";
const L4_MEMORY: u64 = 23034 << 20;
const A100: &str = "NVIDIA A100-SXM4-80GB";

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// What one workload's records say.
struct Workload {
    namespace: &'static str,
    kind: Option<&'static str>,
    name: &'static str,
    model: &'static str,
    memory: u64,
    peak: u64,
    sm_p95: Option<u32>,
    pods: u32,
    minutes: u64,
}

fn w(
    namespace: &'static str,
    kind: &'static str,
    name: &'static str,
    model: &'static str,
) -> Workload {
    let memory = if model == L4 { L4_MEMORY } else { H100_MEMORY };
    Workload {
        namespace,
        kind: Some(kind),
        name,
        model,
        memory,
        peak: 0,
        sm_p95: Some(0),
        pods: 1,
        minutes: 60,
    }
}

/// Each pod's records: two 30-minute checkpoints back to back (or one short record),
/// ending 5 minutes ago, each on a whole GPU the kubelet allocated.
fn records(w: &Workload, now: u64) -> Vec<Value> {
    let mut out = vec![];
    for pod in 0..w.pods {
        let pod_name = format!("{}-{pod}", w.name);
        let end = now - 5 * MIN;
        let start = end - w.minutes * MIN;
        let cuts: Vec<(u64, u64)> = match w.minutes >= 60 {
            true => vec![(start, start + 30 * MIN), (start + 30 * MIN, end)],
            false => vec![(start, end)],
        };
        for (s, e) in cuts {
            let used = w.peak > 0;
            out.push(json!({
                "container_id": format!("{pod_name}-0123456789abcdef"), "pod_uid": format!("uid-{pod_name}"),
                "pod_name": pod_name, "namespace": w.namespace, "container_name": "main",
                "uuid": format!("GPU-{pod_name}"), "gpu_uuid": format!("GPU-{pod_name}"),
                "start_ms": s, "end_ms": e, "gpu_seconds": if used { 60.0 } else { 0.0 },
                "memory_byte_seconds": 0.0, "memory_peak_bytes": w.peak, "energy_joules": 0.0,
                "reason": "checkpoint", "workload_kind": w.kind, "workload": w.kind.map(|_| w.name),
                "sm_p50": w.sm_p95, "sm_p95": w.sm_p95, "sm_max": w.sm_p95, "memory_p95_bytes": w.peak,
                "device_model": w.model, "device_memory_bytes": w.memory, "gpus_allocated": 1.0,
            }));
        }
    }
    out
}

/// The known-answer workloads, a MIG one, a short one, and a host record.
fn write_records(path: &Path) {
    let now = now_ms();
    let mut small = w("ml", "Deployment", "small", H100);
    (small.peak, small.sm_p95) = (7 * GIB, Some(10));
    let mut replicas = w("ml", "Deployment", "replicas", H100);
    (replicas.peak, replicas.sm_p95, replicas.pods) = (7 * GIB, Some(10), 2);
    let mut mid = w("ml", "StatefulSet", "mid", H100);
    (mid.peak, mid.sm_p95) = (30 * GIB, Some(35));
    let mut train = w("ml", "Job", "train", H100);
    (train.peak, train.sm_p95) = (75 * GIB, Some(95));
    let idle = w("web", "Deployment", "idle", H100);
    let mut infer = w("web", "Deployment", "infer", L4);
    (infer.peak, infer.sm_p95) = (6 * GIB, Some(15));
    let mut short = w("web", "Pod", "short", L4);
    (short.kind, short.peak, short.sm_p95, short.minutes) = (None, GIB, Some(5), 0);
    let mut lines: Vec<Value> = [small, replicas, mid, train, idle, infer, short]
        .iter()
        .flat_map(|w| records(w, now))
        .collect();
    // 20 s of a bare pod: under --min-coverage 30s.
    lines.last_mut().unwrap()["start_ms"] = json!(now - 5 * MIN - 20_000);
    // A 3g.40gb MIG device without GPM: its SM use unknown, so it needs its whole slice.
    let mut mig = records(&w("ml", "Deployment", "on-mig", A100), now);
    for r in &mut mig {
        r["memory_peak_bytes"] = json!(5 * GIB);
        (r["sm_p50"], r["sm_p95"], r["sm_max"]) = (Value::Null, Value::Null, Value::Null);
        (r["mig_profile"], r["gpus_allocated"]) = (json!("3g.40gb"), json!(3.0 / 7.0));
        r["device_memory_bytes"] = json!(80 * GIB);
    }
    lines.extend(mig);
    // The host's own processes are nobody's workload.
    let mut host = records(&w("-", "Pod", "host", H100), now).remove(0);
    for k in [
        "container_id",
        "pod_uid",
        "pod_name",
        "namespace",
        "workload_kind",
        "workload",
    ] {
        host[k] = Value::Null;
    }
    lines.push(host);
    let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    std::fs::write(path, text.join("\n") + "\n").unwrap();
}

fn rec(l: &Value) -> (&str, Option<&str>) {
    let r = &l["recommendation"];
    (r["kind"].as_str().unwrap(), r["profile"].as_str())
}

#[test]
fn the_known_answers_from_the_built_in_table() {
    let dir = TempDir::new("rightsize");
    let file = dir.0.join("usage.jsonl");
    write_records(&file);
    // No NVML here: the built-in table answers.
    let args = [
        "--min-coverage",
        "30s",
        "--nvml-lib",
        "/nonexistent/libnvidia-ml.so.1",
    ];
    let lines = rightsize_json(&file, &args, &[]);
    assert_eq!(lines.len(), 8, "the host record is nobody's: {lines:#?}");

    let small = line(&lines, "small");
    assert_eq!(rec(small), ("mig", Some("1g.10gb")));
    assert_eq!(small["gpus_saved"], 0.8571);
    assert_eq!(small["gpus_allocated"], 1.0);
    assert_eq!(small["coverage_s"], 3600.0);
    assert_eq!(small["memory_peak_bytes"], 7 * GIB);
    assert_eq!(small["sm_p95"], 10.0);
    assert_eq!(
        (small["namespace"].as_str(), small["workload_kind"].as_str()),
        (Some("ml"), Some("Deployment"))
    );
    assert_eq!(small["device_model"], H100);
    // Two replicas at once: two GPUs held, each fits 1/7 of one.
    let replicas = line(&lines, "replicas");
    assert_eq!(
        (
            replicas["gpus_allocated"].as_f64(),
            replicas["coverage_s"].as_f64()
        ),
        (Some(2.0), Some(7200.0))
    );
    assert_eq!(replicas["gpus_saved"], 1.7143);
    assert_eq!(rec(line(&lines, "mid")), ("mig", Some("3g.40gb")));
    assert_eq!(line(&lines, "mid")["gpus_saved"], 0.5714);
    assert_eq!(rec(line(&lines, "train")), ("keep", None));
    assert_eq!(line(&lines, "train")["gpus_saved"], 0.0);
    assert_eq!(rec(line(&lines, "idle")), ("release", None));
    assert_eq!(line(&lines, "idle")["gpus_saved"], 1.0);
    let infer = line(&lines, "infer");
    assert_eq!(rec(infer), ("time-slice", None));
    assert_eq!(infer["recommendation"]["share"], 0.3333);
    assert_eq!(infer["gpus_saved"], 0.6667);
    let on_mig = line(&lines, "on-mig");
    assert_eq!(
        rec(on_mig),
        ("mig", Some("3g.40gb")),
        "unknown SM use keeps its slice"
    );
    assert_eq!(
        (on_mig["sm_p95"].clone(), on_mig["gpus_saved"].clone()),
        (Value::Null, json!(0.0))
    );
    // A pod no controller owns is its own workload, named by the pod.
    let short = line(&lines, "short-0");
    assert_eq!(
        (rec(short), short["workload_kind"].as_str()),
        (("insufficient-data", None), Some("Pod"))
    );
    let order: Vec<&str> = lines
        .iter()
        .map(|l| l["workload"].as_str().unwrap())
        .collect();
    assert_eq!(order[..2], ["replicas", "idle"], "largest saving first");

    // --no-mig: time-slicing on the H100 too; --mps: limits instead.
    let no_mig = rightsize_json(&file, &[&args[..], &["--no-mig"]].concat(), &[]);
    let small = line(&no_mig, "small");
    assert_eq!(
        (rec(small).0, small["recommendation"]["share"].as_f64()),
        ("time-slice", Some(0.125))
    );
    let mps = rightsize_json(&file, &[&args[..], &["--mps"]].concat(), &[]);
    let r = &line(&mps, "small")["recommendation"];
    assert_eq!(
        (r["kind"].as_str(), r["mps_thread_pct"].as_u64()),
        (Some("mps"), Some(12))
    );
    assert_eq!(r["mps_mem_limit_bytes"].as_u64(), Some(8602 << 20));

    // Per namespace, and the table a person reads.
    let ns = rightsize_json(&file, &[&args[..], &["--by", "namespace"]].concat(), &[]);
    let ml = ns.iter().find(|n| n["namespace"] == "ml").unwrap();
    assert_eq!(
        (ml["workloads"].as_u64(), ml["gpus_allocated"].as_f64()),
        (Some(5), Some(5.4286))
    );
    assert_eq!(ml["gpus_saved"], 3.1428);
    let table = rightsize(
        &[
            "--file",
            file.to_str().unwrap(),
            "--min-coverage",
            "30s",
            "--nvml-lib",
            "/nonexistent/x.so",
        ],
        &[],
    );
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert!(
        table
            .stdout
            .contains("total: 4.81 of 8.43 GPUs reclaimable"),
        "{}",
        table.stdout
    );
    assert!(
        table
            .stdout
            .contains("MIG profiles of NVIDIA H100 80GB HBM3: the built-in table (H100 80GB)"),
        "{}",
        table.stdout
    );
    assert!(
        table.stdout.contains("NVML: cannot load /nonexistent/x.so"),
        "{}",
        table.stdout
    );
}

/// An H100 whose driver lists a smaller 1g.10gb than the table's, and no 1g.20gb.
fn node_with_mig_profiles() -> Value {
    let p = |profile: u32, id: u32, name: &str, slices: u32, mib: u64| json!({"profile": profile, "id": id, "name": name, "slices": slices, "memory_mib": mib});
    json!({"devices": [{
        "uuid": "GPU-0a0a0a0a-1111-2222-3333-444444444444", "name": H100, "memory_total": H100_MEMORY,
        "mig_profiles": [
            p(0, 19, "MIG 1g.10gb", 1, 8192),
            p(7, 20, "MIG 1g.10gb+me", 1, 8192),
            p(1, 14, "MIG 2g.20gb", 2, 20096),
            p(4, 0, "MIG 7g.80gb", 7, 81152)]
    }]})
}

#[test]
fn the_mig_profiles_this_nodes_nvml_lists_win_over_the_table() {
    let dir = TempDir::new("rightsize-nvml");
    let file = dir.0.join("usage.jsonl");
    write_records(&file);
    let sc = Scenario::new(&node_with_mig_profiles());
    let lib = fake_nvml_lib();
    let lib = lib.to_str().unwrap();
    let env = [("FAKE_NVML_SCENARIO", sc.path())];
    let lines = rightsize_json(&file, &["--min-coverage", "30s", "--nvml-lib", lib], &env);
    // 8.4 GiB no longer fits this driver's 1g.10gb (8 GiB), and there is no 1g.20gb.
    let small = line(&lines, "small");
    assert_eq!(rec(small), ("mig", Some("2g.20gb")));
    assert_eq!(small["gpus_saved"], 0.7143);
    // 36 GiB fits nothing short of the whole GPU here.
    assert_eq!(rec(line(&lines, "mid")), ("keep", None));
    // The other models still come from the table.
    assert_eq!(rec(line(&lines, "on-mig")), ("mig", Some("3g.40gb")));

    let listed = rightsize(&["--profiles", "--nvml-lib", lib], &env);
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let rows: Vec<&str> = listed
        .stdout
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect();
    let nvml: Vec<&str> = rows
        .iter()
        .copied()
        .filter(|l| l.ends_with("\tnvml"))
        .collect();
    assert_eq!(
        nvml,
        [
            "NVIDIA H100 80GB HBM3\t1g.10gb\t1\t7\t8192\tnvml",
            "NVIDIA H100 80GB HBM3\t1g.10gb+me\t1\t7\t8192\tnvml",
            "NVIDIA H100 80GB HBM3\t2g.20gb\t2\t7\t20096\tnvml",
            "NVIDIA H100 80GB HBM3\t7g.80gb\t7\t7\t81152\tnvml",
        ]
    );
    assert!(
        rows.contains(&"NVIDIA H100 80GB HBM3\t1g.10gb\t1\t7\t9984\ttable:H100 80GB"),
        "{}",
        listed.stdout
    );
    assert!(
        rows.contains(&"B200 180GB\t1g.23gb\t1\t7\t20608\ttable"),
        "{}",
        listed.stdout
    );
}

#[test]
fn a_wedged_driver_leaves_the_table_to_answer() {
    let dir = TempDir::new("rightsize-hang");
    let file = dir.0.join("usage.jsonl");
    write_records(&file);
    let mut sc = node_with_mig_profiles();
    sc["hang"] = json!([{"call": "nvmlDeviceGetGpuInstanceProfileInfoV"}]);
    let sc = Scenario::new(&sc);
    let lib = fake_nvml_lib();
    let env = [("FAKE_NVML_SCENARIO", sc.path())];
    let started = std::time::Instant::now();
    let args = ["--min-coverage", "30s", "--nvml-lib", lib.to_str().unwrap()];
    let lines = rightsize_json(&file, &args, &env);
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    assert_eq!(rec(line(&lines, "small")), ("mig", Some("1g.10gb")));
    let table = rightsize(
        &[&["--file", file.to_str().unwrap()], &args[..]].concat(),
        &env,
    );
    assert!(
        table.stdout.contains("NVML did not answer within 5 s"),
        "{}",
        table.stdout
    );
}

#[test]
fn bad_input_is_refused_naming_the_flag() {
    let dir = TempDir::new("rightsize-bad");
    let file = dir.0.join("usage.jsonl");
    write_records(&file);
    let f = file.to_str().unwrap();
    let cases: [(&[&str], &str); 6] = [
        (&["--file", f, "--headroom", "-0.5"], "--headroom"),
        (&["--file", f, "--headroom", "lots"], "--headroom"),
        (&["--file", f, "--since", "7y"], "--since"),
        (&["--file", f, "--since", "0d"], "--since"),
        (&["--file", f, "--by", "pod"], "--by"),
        (&[], "--file"),
    ];
    for (args, flag) in cases {
        let out = rightsize(args, &[]);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(flag), "{args:?}: {}", out.stderr);
    }
    let missing = rightsize(&["--file", "/nonexistent/usage.jsonl"], &[]);
    assert_eq!(missing.code, 1);
    assert!(
        missing.stderr.contains("/nonexistent/usage.jsonl"),
        "{}",
        missing.stderr
    );
}

/// `--prometheus`: a URL nothing answers at, and a Prometheus without the rules, are said
/// with the URL (exit 1); a bad header or a file beside it is refused naming the flag (2);
/// with the interval given, a Prometheus with no rules' series gives no lines, and says so.
#[test]
fn prometheus_without_the_rules_or_unreachable_is_said() {
    let dead = format!("http://127.0.0.1:{}", tests::prom::free_port());
    let out = rightsize(&["--prometheus", &dead], &[]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains(&dead), "{}", out.stderr);
    let prom = tests::prom::Prometheus::start(&[]);
    let url = format!("http://{}", prom.addr);
    prom.wait("vector(1)", |r| !r.is_empty());
    let out = rightsize(&["--prometheus", &url], &[]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("no rule group gpu-agent-rightsizing")
            && out
                .stderr
                .contains("deploy/prometheus/gpu-agent-rightsizing.yaml"),
        "{}",
        out.stderr
    );
    let out = rightsize(&["--prometheus", &url, "--rule-interval", "5m"], &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("no workload series in the window"),
        "{}",
        out.stdout
    );
    let dir = TempDir::new("rightsize-prom-bad");
    let file = dir.0.join("usage.jsonl");
    write_records(&file);
    let cases: [(&[&str], &str); 3] = [
        (
            &["--prometheus", &url, "--prometheus-header", "no colon"],
            "--prometheus-header",
        ),
        (
            &["--prometheus", &url, "--file", file.to_str().unwrap()],
            "--file",
        ),
        (
            &["--file", file.to_str().unwrap(), "--rule-interval", "5m"],
            "--prometheus",
        ),
    ];
    for (args, flag) in cases {
        let out = rightsize(args, &[]);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(flag), "{args:?}: {}", out.stderr);
    }
}
