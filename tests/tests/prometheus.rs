//! /metrics end to end: the real agent (fake NVML, a real process in a pod cgroup) is
//! linted by promtool and scraped by a real Prometheus (Debian's), then queried in PromQL.
//! `cargo xtask test` installs both as root (`apt-get install -y --no-install-recommends
//! prometheus`); without them the test fails, it does not skip.
use std::{
    io::Write,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::json;
use tests::{
    cgroups::{sleeper, systemd_container, Proc, TestCgroup},
    fake_nvml_lib, http,
    nvml::Scenario,
    prom::{which, Prometheus},
    random_hex, random_uid, Agent,
};

const GIB: u64 = 1 << 30;

/// Polls `promql` until one of its series has `label` = `want_label` and value `want`.
fn wait_for(prom: &Prometheus, promql: &str, label: &str, want_label: &str, want: f64) {
    prom.wait(promql, |r| {
        r.iter()
            .any(|s| s.label(label) == want_label && s.value == want)
    });
}

/// `promtool check metrics` on `text`: (success, what it printed).
fn promtool(bin: &Path, text: &str) -> (bool, String) {
    let mut child = Command::new(bin)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), printed)
}

/// The sample line of `family` whose labels contain every `labels` pair.
fn sample<'a>(text: &'a str, family: &str, labels: &[(&str, &str)]) -> Option<&'a str> {
    text.lines().find(|l| {
        l.starts_with(&format!("{family}{{"))
            && labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
    })
}

fn value(line: &str) -> f64 {
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Polls /metrics until `cond` holds; returns that text.
fn wait_metrics(agent: &Agent, mut cond: impl FnMut(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, text) = http::get(&agent.addr, "/metrics").expect("GET /metrics");
        assert_eq!(status, 200, "{text}");
        if cond(&text) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "timed out; last /metrics:\n{text}\nagent log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn metrics_pass_promtool_and_prometheus_scrapes_them() {
    // Fail early, before anything is started, if the tools are missing.
    let promtool_bin = which("promtool");
    which("prometheus");

    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&systemd_container(&uid, &id));
    let a = Proc(cg.spawn(&mut sleeper()));
    let b = Proc(cg.spawn(&mut sleeper()));
    let host = Proc(sleeper().spawn().unwrap());
    let mem = 3 * GIB + GIB / 2;
    let p = |pid: u32, mem: u64, sm: u32| {
        json!({"pid": pid, "used_memory": mem, "sm_util": sm, "mem_util": 5,
               "enc_util": 0, "dec_util": 0})
    };
    let sc = Scenario::new(&json!({
        "driver_version": "580.159.04",
        "devices": [{
            "uuid": "GPU-11111111-2222-3333-4444-555555555555",
            "name": "NVIDIA H100 80GB HBM3", "memory_total": 85520809984u64,
            "utilization_gpu": 60, "utilization_memory": 20, "power_mw": 350000,
            "temperature_c": 45, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619,
            "processes": [p(a.pid(), 3 * GIB, 30), p(b.pid(), GIB / 2, 20), p(host.pid(), GIB, 1)]
        }]
    }));
    let lib = fake_nvml_lib();
    let agent = Agent::start_env(
        "[nvml]\ninterval_ms = 200\n",
        &[
            "--nvml-lib",
            lib.to_str().unwrap(),
            "--prometheus",
            "--prometheus-compat",
            "dcgm",
        ],
        &[("FAKE_NVML_SCENARIO", sc.path())],
    );

    // The container's memory, summed over its two processes.
    let text = wait_metrics(&agent, |t| {
        sample(
            t,
            "container_gpu_memory_usage_bytes",
            &[("container_id", &id)],
        )
        .is_some_and(|l| value(l) == mem as f64)
    });
    let line = sample(
        &text,
        "container_gpu_memory_usage_bytes",
        &[("container_id", &id)],
    )
    .unwrap();
    for label in [
        format!("pod_uid=\"{uid}\""),
        "qos=\"burstable\"".into(),
        "owner=\"container\"".into(),
        "hw_id=\"GPU-11111111-2222-3333-4444-555555555555\"".into(),
    ] {
        assert!(line.contains(&label), "{label} in {line}");
    }
    let util = sample(
        &text,
        "container_gpu_utilization_ratio",
        &[("container_id", &id), ("hw_gpu_task", "general")],
    )
    .expect("the container's SM utilization");
    assert_eq!(value(util), 0.5, "{util}");
    let host_line = sample(
        &text,
        "container_gpu_memory_usage_bytes",
        &[("owner", "host")],
    )
    .expect("the host entry");
    assert_eq!(value(host_line), GIB as f64, "{host_line}");
    assert!(text.contains("\ngpu_agent_nvml_up 1\n"), "{text}");
    // dcgm-exporter's names, its default layout: one series for the device, with no pod
    // labels (the kubelet allocated it to nobody here), never one per container.
    let dcgm: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("DCGM_FI_DEV_FB_USED{"))
        .collect();
    assert_eq!(dcgm.len(), 1, "{dcgm:?}");
    let device = dcgm[0];
    for label in [
        "pod=",
        "namespace=",
        "container=",
        "pod_uid=",
        "container_id=",
    ] {
        assert!(!device.contains(label), "{label} in {device}");
    }
    assert_eq!(value(device), 4608.0, "{device}");

    // promtool: its only findings are dcgm-exporter's own names, kept for compatibility:
    // the camelCase label `modelName`, and counters without `_total` (one named
    // ..._COUNTER); gpu-agent's own families pass clean.
    let (ok, printed) = promtool(&promtool_bin, &text);
    for problem in printed.lines() {
        assert!(
            problem.starts_with("DCGM_FI_")
                && (problem
                    .ends_with("label names should be written in 'snake_case' not 'camelCase'")
                    || problem.ends_with("counter metrics should have \"_total\" suffix")
                    || problem.ends_with("metric name should not include type 'counter'")),
            "promtool: {problem}\nin:\n{text}"
        );
    }
    assert_eq!(ok, printed.is_empty(), "promtool:\n{printed}");
    let without_dcgm: String = text
        .lines()
        .filter(|l| !l.contains("DCGM_FI_"))
        .map(|l| format!("{l}\n"))
        .collect();
    let (ok, printed) = promtool(&promtool_bin, &without_dcgm);
    assert!(
        ok && printed.is_empty(),
        "promtool:\n{printed}\nin:\n{text}"
    );

    // A real Prometheus scrapes it and answers PromQL.
    let prom = Prometheus::start(&[("gpu-agent", &agent.addr)]);
    wait_for(
        &prom,
        "sum by (pod_uid) (container_gpu_memory_usage_bytes)",
        "pod_uid",
        &uid,
        mem as f64,
    );
    wait_for(
        &prom,
        "DCGM_FI_DEV_FB_USED",
        "UUID",
        "GPU-11111111-2222-3333-4444-555555555555",
        4608.0,
    );
    drop(prom);
    drop(agent);
}
