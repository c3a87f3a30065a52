//! How the agent meets bad input and missing privileges: clear errors, or a degraded mode
//! that says so and keeps answering.
use std::{
    os::unix::process::CommandExt,
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::json;
use tests::{
    agent_binary,
    cgroups::{Proc, TestCgroup},
    random_hex, random_uid, Agent,
};

fn run_agent(args: &[&str]) -> (i32, String) {
    let out = Command::new(agent_binary())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running gpu-agent");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn temp_config(text: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("gpu-agent-cli-{}.toml", random_hex(10)));
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn unknown_flag_exits_non_zero_naming_it() {
    let (code, err) = run_agent(&["run", "--http-adr", "127.0.0.1:1"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--http-adr"), "{err}");
}

#[test]
fn bad_config_exits_non_zero_naming_the_field() {
    let unknown = temp_config("[ebpf]\nring_bufer_bytes = 4096\n");
    let (code, err) = run_agent(&["run", "--config", unknown.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("ring_bufer_bytes"), "{err}");

    let invalid = temp_config("[ebpf]\nring_buffer_bytes = 1000\n");
    let (code, err) = run_agent(&["check-config", invalid.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("ebpf.ring_buffer_bytes"), "{err}");

    let good = temp_config("[http]\naddr = \"127.0.0.1:9999\"\n[cache]\ntombstone_secs = 3\n");
    let (code, err) = run_agent(&["check-config", good.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");

    let (code, err) = run_agent(&["run", "--config", "/nonexistent/gpu-agent.toml"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/nonexistent/gpu-agent.toml"), "{err}");
    for p in [unknown, invalid, good] {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
#[ignore = "needs root: creates a pod cgroup"]
fn proc_mode_keeps_answering_and_says_why() {
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&format!("/kubepods/pod{uid}/{id}"));
    let before = Proc(cg.spawn(Command::new("sleep").arg("600")));
    let agent = Agent::start_with("[cache]\nprocfs_rescan_secs = 1\n", &["--no-ebpf"]);
    let stats = agent.stats();
    assert_eq!(stats["mode"], "procfs", "{stats}");
    assert!(
        stats["degraded_reason"]
            .as_str()
            .unwrap()
            .contains("ebpf.enabled"),
        "{stats}"
    );
    assert!(agent.log().contains("/proc mode"), "{}", agent.log());
    let row = agent.wait_for_process(before.pid(), "container_id", &json!(id));
    assert_eq!(row["qos"], "guaranteed");
    // New processes appear with the next rescan.
    let after = Proc(cg.spawn(Command::new("sleep").arg("600")));
    agent.wait_for_process(after.pid(), "pod_uid", &json!(uid));
    assert!(agent.stats()["procfs_rescans"].as_u64().unwrap() >= 1);
    assert!(agent.stop().success(), "SIGTERM exits 0");
}

#[test]
#[ignore = "needs root: starts the agent as nobody (setuid)"]
fn without_privilege_it_names_the_missing_capability_and_runs_on() {
    let cfg = temp_config("");
    // SAFETY: permission bits for the unprivileged agent to read its config.
    std::fs::set_permissions(&cfg, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let mut cmd = Command::new(agent_binary());
    cmd.args(["run", "--http-addr", "127.0.0.1:0", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .uid(65534)
        .gid(65534);
    let agent = Agent::spawn(cmd, None);
    let stats = agent.stats();
    assert_eq!(stats["mode"], "procfs", "{stats}");
    let reason = stats["degraded_reason"].as_str().unwrap();
    assert!(reason.contains("CAP_BPF"), "{reason}");
    assert!(agent.log().contains("CAP_BPF"), "{}", agent.log());
    // Still answers: its own process is there.
    let me = agent.processes();
    assert!(!me.is_empty());
    let _ = std::fs::remove_file(cfg);
}

#[test]
#[ignore = "needs root: loads the eBPF programs"]
fn sigterm_exits_zero_in_ebpf_mode() {
    let agent = Agent::start("");
    assert_eq!(agent.stats()["mode"], "ebpf");
    let (code, body) = tests::http::get(&agent.addr, "/healthz").unwrap();
    assert_eq!((code, body.trim()), (200, "ok"));
    std::thread::sleep(Duration::from_millis(100));
    assert!(agent.stop().success());
}

/// What check-config and run both refuse (one validation), each naming the field: values
/// that used to pass and then crash the agent or fail every export.
#[test]
fn check_config_and_run_refuse_values_that_would_crash_or_fail_forever() {
    let not_pem = temp_config("not a certificate");
    let not_pem_ca = format!(
        "[otlp]\nendpoint = \"https://c:4318\"\ncertificate = \"{}\"\n",
        not_pem.display()
    );
    let cases: &[(&str, &str)] = &[
        (
            "[cache]\ntombstone_secs = 9223372036854775807\n",
            "cache.tombstone_secs",
        ),
        (
            "[ebpf]\nring_buffer_bytes = 2147483648\n",
            "ebpf.ring_buffer_bytes",
        ),
        (
            "[otlp]\nendpoint = \"http://c:4318\"\ninterval_ms = 1\n",
            "otlp.interval_ms",
        ),
        (
            "[cgroup]\nv1_hierarchy = \"memroy\"\n",
            "cgroup.v1_hierarchy",
        ),
        (
            "[cgroup]\nproc_root = \"/nonexistent/proc\"\n",
            "cgroup.proc_root",
        ),
        ("[otlp]\nendpoint = \"http://[::1\"\n", "otlp.endpoint"),
        (
            "[otlp]\nendpoint = \"http://c:4318\"\n[otlp.headers]\n\"x api\" = \"1\"\n",
            "otlp.headers",
        ),
        (
            "[otlp]\nendpoint = \"http://c:4318\"\n[otlp.headers]\nx-key = \"a\\nb\"\n",
            "otlp.headers",
        ),
        (&not_pem_ca, "otlp.certificate"),
    ];
    for (text, field) in cases {
        let file = temp_config(text);
        for cmd in [&["check-config"][..], &["run", "--no-ebpf", "--config"][..]] {
            let mut args = cmd.to_vec();
            args.push(file.to_str().unwrap());
            let (code, err) = run_agent(&args);
            assert_eq!(code, 2, "{cmd:?} on {text:?}: {err}");
            assert!(
                err.contains(field),
                "{cmd:?} on {text:?} names no {field}: {err}"
            );
        }
        let _ = std::fs::remove_file(file);
    }
    // The environment is configuration too: a %0A in a header value is refused, unechoed.
    let file = temp_config("");
    let out = Command::new(agent_binary())
        .args(["check-config", file.to_str().unwrap()])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")
        .env("OTEL_EXPORTER_OTLP_HEADERS", "x-key=s3cr3t%0Aevil")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("OTEL_EXPORTER_OTLP_HEADERS") && !err.contains("s3cr3t"),
        "{err}"
    );
    let _ = std::fs::remove_file(file);
    let _ = std::fs::remove_file(not_pem);
}
