//! OTLP export end to end: the real agent (real eBPF, processes in pod cgroups, the fake
//! NVML library) pushing to an in-process receiver built from opentelemetry-proto (exact
//! assertions) and to a real collector, rotel.
use std::{
    path::PathBuf,
    process::{Child, Command},
    time::{Duration, Instant},
};

use serde_json::json;
use tests::{
    cgroups::{sleeper, systemd_container, Proc, TestCgroup},
    fake_nvml_lib,
    otlp_receiver::{attr_str, container_resource, metric, points, value, Kind, Receiver},
    prom::free_port,
    random_hex, random_uid, Agent,
};

const GIB: u64 = 1 << 30;
const GPU: &str = "GPU-6663f2bc-da9f-4cff-88fe-d84cc95fe598";

/// A pod with one GPU process, and a scenario that shows it holding 3 GiB.
struct Fixture {
    id: String,
    uid: String,
    _cg: TestCgroup,
    _proc: Proc,
    scenario: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let (uid, id) = (random_uid(), random_hex(64));
        let cg = TestCgroup::v2(&systemd_container(&uid, &id));
        let p = Proc(cg.spawn(&mut sleeper()));
        let scenario = std::env::temp_dir().join(format!("otlp-{}.json", random_hex(8)));
        let v = json!({"driver_version": "580.159.04", "devices": [{
            "uuid": GPU, "name": "NVIDIA H100 80GB HBM3", "memory_total": 85520809984u64,
            "memory_used": 3 * GIB, "utilization_gpu": 40, "utilization_memory": 10,
            "power_mw": 300000, "temperature_c": 50, "energy_mj": 5000,
            "processes": [{"pid": p.pid(), "used_memory": 3 * GIB, "sm_util": 40, "mem_util": 10, "enc_util": 0, "dec_util": 0}]
        }]});
        std::fs::write(&scenario, v.to_string()).unwrap();
        Fixture {
            id,
            uid,
            _cg: cg,
            _proc: p,
            scenario,
        }
    }

    fn agent(&self, env: &[(&str, &str)]) -> Agent {
        self.agent_with("[nvml]\ninterval_ms = 200\n", env)
    }

    fn agent_with(&self, config: &str, env: &[(&str, &str)]) -> Agent {
        let lib = fake_nvml_lib();
        let mut all = vec![
            ("FAKE_NVML_SCENARIO", self.scenario.to_str().unwrap()),
            ("NODE_NAME", "gpu-node-1"),
        ];
        all.extend_from_slice(env);
        Agent::start_env(config, &["--nvml-lib", lib.to_str().unwrap()], &all)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.scenario);
    }
}

fn has_container_bytes(
    req: &opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest,
    id: &str,
) -> bool {
    container_resource(req, id)
        .and_then(|rm| metric(rm, "container.gpu.memory.usage"))
        .is_some_and(|m| points(m).iter().any(|p| value(p) == (3 * GIB) as f64))
}

fn exact_assertions(kind: Kind, protocol: &str) {
    let fx = Fixture::new();
    let rx = Receiver::start(kind, 0);
    let url = rx.url();
    let agent = fx.agent(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &url),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
        ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=s3cret"),
        ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test"),
    ]);
    let req = rx
        .received
        .wait_for(Duration::from_secs(20), |r| has_container_bytes(r, &fx.id))
        .unwrap_or_else(|| panic!("no export with the container's bytes\n{}", agent.log()));
    // One resource per container, with the attributes k8sattributes associates on.
    let rm = container_resource(&req, &fx.id).unwrap();
    let attrs = &rm.resource.as_ref().unwrap().attributes;
    assert_eq!(attr_str(attrs, "k8s.pod.uid"), Some(fx.uid.as_str()));
    assert_eq!(
        attr_str(attrs, "container.runtime.name"),
        Some("containerd")
    );
    assert_eq!(attr_str(attrs, "k8s.node.name"), Some("gpu-node-1"));
    assert_eq!(attr_str(attrs, "service.name"), Some("gpu-agent"));
    assert_eq!(attr_str(attrs, "deployment.environment"), Some("test"));
    assert!(attr_str(attrs, "host.name").is_some());
    let mem = metric(rm, "container.gpu.memory.usage").unwrap();
    assert_eq!(mem.unit, "By");
    assert_eq!(attr_str(&points(mem)[0].attributes, "hw.id"), Some(GPU));
    let util = metric(rm, "container.gpu.utilization").unwrap();
    let general = points(util)
        .iter()
        .find(|p| attr_str(&p.attributes, "hw.gpu.task") == Some("general"))
        .unwrap();
    assert!((value(general) - 0.40).abs() < 1e-9);
    let time = metric(rm, "container.gpu.time").unwrap();
    match &time.data {
        Some(opentelemetry_proto::tonic::metrics::v1::metric::Data::Sum(s)) => {
            assert!(s.is_monotonic);
            assert_eq!(s.aggregation_temporality, 2, "cumulative");
            assert!(s.data_points[0].start_time_unix_nano > 0);
            assert!(s.data_points[0].start_time_unix_nano <= s.data_points[0].time_unix_nano);
        }
        other => panic!("container.gpu.time is {other:?}"),
    }
    assert!(metric(rm, "container.gpu.memory.time").is_some());
    // The node resource: devices by the semantic conventions, and self-metrics.
    let node = req
        .resource_metrics
        .iter()
        .find(|rm| attr_str(&rm.resource.as_ref().unwrap().attributes, "container.id").is_none())
        .expect("a node resource");
    let usage = metric(node, "hw.gpu.memory.usage").unwrap();
    let p = &points(usage)[0];
    assert_eq!(value(p), (3 * GIB) as f64);
    assert_eq!(attr_str(&p.attributes, "hw.id"), Some(GPU));
    assert_eq!(attr_str(&p.attributes, "hw.vendor"), Some("NVIDIA"));
    assert_eq!(
        attr_str(&p.attributes, "hw.model"),
        Some("NVIDIA H100 80GB HBM3")
    );
    for m in [
        "hw.gpu.memory.limit",
        "hw.gpu.utilization",
        "hw.power",
        "hw.energy",
        "hw.temperature",
        "gpu_agent.events.received",
        "gpu_agent.nvml.up",
    ] {
        assert!(metric(node, m).is_some(), "{m} missing");
    }
    assert_eq!(value(&points(metric(node, "hw.power").unwrap())[0]), 300.0);
    // Headers reached the receiver.
    let (_, headers) = rx.received.all().into_iter().last().unwrap();
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "x-api-key" && v == "s3cret"),
        "{headers:?}"
    );
    // The exporter names itself, as the OTLP exporter spec asks.
    let transport = if protocol == "grpc" { "gRPC" } else { "HTTP" };
    let agent_ua = format!(
        "gpu-agent/{} (Rust; OTLP/{transport})",
        env!("CARGO_PKG_VERSION")
    );
    // Over gRPC the channel adds its own after it ("... tonic/0.14").
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "user-agent" && v.starts_with(&agent_ua)),
        "no user-agent {agent_ua:?}: {headers:?}"
    );
    // The receiver has the request before the agent has read the response: wait for it.
    agent.wait_until(
        "the export counted as sent",
        Duration::from_secs(10),
        || agent.stats()["export_sent"].as_u64().unwrap() >= 1,
    );
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn grpc_export_carries_one_resource_per_container() {
    exact_assertions(Kind::Grpc, "grpc");
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn http_protobuf_export_carries_one_resource_per_container() {
    exact_assertions(Kind::Http, "http/protobuf");
}

/// HTTP/protobuf with gzip, as deploy/kubernetes configures it: the body is gzipped, says
/// so, and unzips to the request (the receiver refuses a body that does not).
#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn http_protobuf_gzip_arrives_zipped_and_whole() {
    let fx = Fixture::new();
    let rx = Receiver::start(Kind::Http, 0);
    let url = rx.url();
    let agent = fx.agent(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &url),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
    ]);
    rx.received
        .wait_for(Duration::from_secs(20), |r| has_container_bytes(r, &fx.id))
        .unwrap_or_else(|| panic!("no gzipped export\n{}", agent.log()));
    let (_, headers) = rx.received.all().into_iter().last().unwrap();
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "content-encoding" && v == "gzip"),
        "{headers:?}"
    );
    assert_eq!(agent.stats()["export_failures"], 0, "{}", agent.log());
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn sigterm_flushes_one_last_export_and_exits_zero() {
    let fx = Fixture::new();
    let rx = Receiver::start(Kind::Grpc, 0);
    let url = rx.url();
    // An interval far longer than the test: only the final flush can deliver.
    let agent = fx.agent(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &url),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "600000"),
    ]);
    agent.wait_until("a GPU sample", Duration::from_secs(10), || {
        agent.json("/debug/snapshot")["containers"]
            .as_array()
            .is_some_and(|c| !c.is_empty())
    });
    assert_eq!(rx.received.count(), 0);
    let status = agent.stop();
    assert!(status.success(), "{status}");
    let req = rx.received.last().expect("the final export");
    assert!(has_container_bytes(&req, &fx.id));
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn collector_down_then_up_resumes_without_restart() {
    let fx = Fixture::new();
    // Reserve a port, then free it: nothing listens there yet.
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let agent = fx.agent(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &url),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
    ]);
    agent.wait_until("export failures", Duration::from_secs(15), || {
        agent.stats()["export_failures"].as_u64() >= Some(1)
    });
    assert!(
        agent.log().contains("OTLP export failed"),
        "{}",
        agent.log()
    );
    let rx = Receiver::start(Kind::Http, port);
    // Backoff starts at 1 s and doubles: it must come back within a few attempts.
    rx.received
        .wait_for(Duration::from_secs(30), |r| has_container_bytes(r, &fx.id))
        .unwrap_or_else(|| panic!("no export after the collector came back\n{}", agent.log()));
    assert_eq!(agent.stats()["mode"], "ebpf", "the agent lived through it");
    let status = agent.stop();
    assert!(status.success());
}

/// The OTLP exporter spec's own example of per-signal endpoints: the metrics go to their
/// custom path as is, the usage records (logs) to the base's /v1/logs, never to a URL made
/// from the metrics', and the agent stays up through many exports.
#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn a_custom_metrics_path_leaves_the_logs_at_the_base_and_the_agent_up() {
    let fx = Fixture::new();
    // 404 anywhere but the custom metrics path and /v1/logs.
    let rx = Receiver::start_at(Kind::Http, 0, "/custom/metrics/path");
    let base = rx.url();
    let metrics = format!("{base}/custom/metrics/path");
    let mut agent = fx.agent(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &base),
        ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", &metrics),
        ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
    ]);
    rx.received
        .wait_for(Duration::from_secs(20), |r| has_container_bytes(r, &fx.id))
        .unwrap_or_else(|| panic!("no export at the custom path\n{}", agent.log()));
    // The container stops using the GPU: its usage record is sent.
    let mut sc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&fx.scenario).unwrap()).unwrap();
    sc["devices"][0]["processes"] = json!([]);
    let tmp = fx.scenario.with_extension("tmp");
    std::fs::write(&tmp, sc.to_string()).unwrap();
    std::fs::rename(&tmp, &fx.scenario).unwrap();
    agent.wait_until(
        "the usage record at /v1/logs",
        Duration::from_secs(20),
        || !rx.logs.records().is_empty(),
    );
    // Many export cycles later: still up, still exporting.
    let before = rx.received.count();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(agent.exited(), None, "the agent exited:\n{}", agent.log());
    assert!(
        rx.received.count() >= before + 5,
        "{} exports in 3 s",
        rx.received.count() - before
    );
    let st = agent.stats();
    assert_eq!(st["otlp"], metrics.as_str());
    assert_eq!(st["otlp_logs"], format!("{base}/v1/logs").as_str());
    assert_eq!(
        (&st["export_status"], &st["usage_logs"]),
        (&json!("ok"), &json!("ok"))
    );
    assert_eq!(st["usage_records_dropped"], 0, "{st}");
    assert!(!agent.log().contains("ERROR"), "{}", agent.log());
}

/// Which of a case's receivers: `H` takes HTTP/protobuf at the paths the case expects,
/// `G` takes gRPC and HTTP/protobuf (at /v1/metrics, /v1/logs) on one port.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Rx {
    H,
    G,
}

/// Where a signal's requests must land.
#[derive(Clone, Copy, Debug)]
enum Land {
    /// Not pushed at all.
    Nowhere,
    Http(Rx, &'static str),
    Grpc(Rx),
}

/// One documented combination of OTEL_* variables ("{H}", "{G}": the receivers' URLs),
/// where each signal lands, and the headers each must carry (a name's only value).
struct Combination {
    what: &'static str,
    env: &'static [(&'static str, &'static str)],
    metrics: (Land, &'static [(&'static str, &'static str)]),
    logs: (Land, &'static [(&'static str, &'static str)]),
}

const BASE: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
const HEADERS: &str = "OTEL_EXPORTER_OTLP_HEADERS";

#[rustfmt::skip]
const COMBINATIONS: &[Combination] = &[
    Combination { what: "a base over HTTP, with general headers",
        env: &[(BASE, "{H}"), (HEADERS, "x-api-key=base,x-team=gpu%20ops")],
        metrics: (Land::Http(Rx::H, "/v1/metrics"), &[("x-api-key", "base"), ("x-team", "gpu ops")]),
        logs: (Land::Http(Rx::H, "/v1/logs"), &[("x-api-key", "base"), ("x-team", "gpu ops")]) },
    Combination { what: "a base over gRPC; the metrics' own headers replace the general ones",
        env: &[(BASE, "{G}"), (PROTOCOL, "grpc"), (HEADERS, "x-api-key=base"),
               ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-api-key=metrics%3D1")],
        metrics: (Land::Grpc(Rx::G), &[("x-api-key", "metrics=1")]),
        logs: (Land::Grpc(Rx::G), &[("x-api-key", "base")]) },
    Combination { what: "a metrics endpoint alone: the records are not pushed",
        env: &[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "{H}/custom/metrics")],
        metrics: (Land::Http(Rx::H, "/custom/metrics"), &[]),
        logs: (Land::Nowhere, &[]) },
    Combination { what: "a logs endpoint alone, as is, with the logs' own headers",
        env: &[("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "{H}/custom/logs"),
               ("OTEL_EXPORTER_OTLP_LOGS_HEADERS", "x-logs=1")],
        metrics: (Land::Nowhere, &[]),
        logs: (Land::Http(Rx::H, "/custom/logs"), &[("x-logs", "1")]) },
    Combination { what: "one base, the logs' own protocol",
        env: &[(BASE, "{G}"), (PROTOCOL, "grpc"), ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "http/protobuf")],
        metrics: (Land::Grpc(Rx::G), &[]),
        logs: (Land::Http(Rx::G, "/v1/logs"), &[]) },
    Combination { what: "one base, the metrics' own protocol",
        env: &[(BASE, "{G}"), ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc")],
        metrics: (Land::Grpc(Rx::G), &[]),
        logs: (Land::Http(Rx::G, "/v1/logs"), &[]) },
    Combination { what: "metrics over gRPC elsewhere, the logs at the HTTP base with their own headers",
        env: &[(BASE, "{H}"), ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "{G}"),
               ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc"), (HEADERS, "x-api-key=base"),
               ("OTEL_EXPORTER_OTLP_LOGS_HEADERS", "x-api-key=logs")],
        metrics: (Land::Grpc(Rx::G), &[("x-api-key", "base")]),
        logs: (Land::Http(Rx::H, "/v1/logs"), &[("x-api-key", "logs")]) },
    Combination { what: "a logs endpoint over gRPC, as is, beside an HTTP base",
        env: &[(BASE, "{H}"), ("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "{G}"),
               ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "grpc")],
        metrics: (Land::Http(Rx::H, "/v1/metrics"), &[]),
        logs: (Land::Grpc(Rx::G), &[]) },
];

type Headers = Vec<(String, String)>;

/// The headers of each request of a signal that reached `rx`.
fn arrivals(rx: &Receiver, logs: bool) -> Vec<Headers> {
    match logs {
        true => rx.logs.all().into_iter().map(|(_, h)| h).collect(),
        false => rx.received.all().into_iter().map(|(_, h)| h).collect(),
    }
}

/// One signal's requests landed where `land` says, over its protocol, each with `want`.
fn check_landing(c: &Combination, logs: bool, (h, g): (&Receiver, &Receiver), log: &str) {
    let (signal, (land, want)) = match logs {
        true => ("logs", c.logs),
        false => ("metrics", c.metrics),
    };
    let at = |rx: Rx| arrivals(if rx == Rx::H { h } else { g }, logs);
    let (to, content_type) = match land {
        Land::Nowhere => {
            let stray = (at(Rx::H).len(), at(Rx::G).len());
            assert_eq!(stray, (0, 0), "{}: {signal} pushed\n{log}", c.what);
            return;
        }
        Land::Http(rx, _) => (rx, "application/x-protobuf"),
        Land::Grpc(rx) => (rx, "application/grpc"),
    };
    let other = if to == Rx::H { Rx::G } else { Rx::H };
    assert!(at(other).is_empty(), "{}: {signal} at {other:?}", c.what);
    let got = at(to);
    assert!(!got.is_empty(), "{}: no {signal} at {to:?}\n{log}", c.what);
    for headers in &got {
        let values = |k: &str| -> Vec<&str> {
            let named = headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(k));
            named.map(|(_, v)| v.as_str()).collect()
        };
        let ct = values("content-type");
        assert!(
            ct.len() == 1 && ct[0].starts_with(content_type),
            "{}: {signal} {ct:?}",
            c.what
        );
        for (k, v) in want {
            assert_eq!(
                values(k),
                [*v],
                "{}: {signal}, header {k}: {headers:?}",
                c.what
            );
        }
    }
}

/// Runs the agent on one combination: where each signal lands, and the agent up after
/// five export intervals, still pushing and with nothing logged as an error.
fn run_combination(fx: &Fixture, c: &Combination) {
    let path = |land: Land, default| match land {
        Land::Http(Rx::H, p) => p,
        _ => default,
    };
    let (metrics_path, logs_path) = (path(c.metrics.0, "/v1/metrics"), path(c.logs.0, "/v1/logs"));
    let h = Receiver::start_paths(Kind::Http, 0, metrics_path, logs_path);
    let g = Receiver::start(Kind::GrpcAndHttp, 0);
    let urls = |v: &str| v.replace("{H}", &h.url()).replace("{G}", &g.url());
    let vars: Vec<(&str, String)> = c.env.iter().map(|(k, v)| (*k, urls(v))).collect();
    let mut env: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.push(("OTEL_METRIC_EXPORT_INTERVAL", "300"));
    // A record every second (a checkpoint of the pod's stretch), so the logs flow too.
    let mut agent = fx.agent_with(
        "[nvml]\ninterval_ms = 200\n[usage]\nmax_record_secs = 1\n",
        &env,
    );
    let pushes = |logs: bool| arrivals(&h, logs).len() + arrivals(&g, logs).len();
    let expected = |land: Land| !matches!(land, Land::Nowhere) as usize;
    let (m, l) = (expected(c.metrics.0), expected(c.logs.0));
    agent.wait_until(c.what, Duration::from_secs(20), || {
        pushes(false) >= m && pushes(true) >= l
    });
    let before = (pushes(false), pushes(true));
    std::thread::sleep(Duration::from_millis(1500));
    let log = agent.log();
    assert_eq!(agent.exited(), None, "{}: the agent exited\n{log}", c.what);
    let after = (pushes(false), pushes(true));
    assert!(
        after.0 >= before.0 + 3 * m && after.1 >= before.1 + l,
        "{}: {before:?} then {after:?}",
        c.what
    );
    check_landing(c, false, (&h, &g), &log);
    check_landing(c, true, (&h, &g), &log);
    let misses = (
        h.misses.lock().unwrap().clone(),
        g.misses.lock().unwrap().clone(),
    );
    assert!(
        misses.0.is_empty() && misses.1.is_empty(),
        "{}: {misses:?}",
        c.what
    );
    let st = agent.stats();
    let status = |on: usize| if on == 1 { "ok" } else { "disabled" };
    let got = (st["export_status"].as_str(), st["usage_logs"].as_str());
    assert_eq!(got, (Some(status(m)), Some(status(l))), "{}: {st}", c.what);
    assert!(!log.contains("ERROR"), "{}: {log}", c.what);
    let unsent = log.matches("usage records are not sent over OTLP").count();
    assert_eq!(
        unsent,
        1 - l,
        "{}: said once where no logs go\n{log}",
        c.what
    );
    assert!(agent.stop().success(), "{}", c.what);
}

/// Each documented combination of base, per-signal endpoints, protocols and headers, end
/// to end (the spec's own per-signal example has a test of its own, above).
#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn each_documented_otlp_combination_lands_where_the_spec_says_and_the_agent_stays_up() {
    let fx = Fixture::new();
    for c in COMBINATIONS {
        run_combination(&fx, c);
    }
}

/// A throwaway CA and a server certificate for 127.0.0.1/localhost, made with openssl.
fn test_pki(dir: &std::path::Path) -> (PathBuf, Vec<u8>, Vec<u8>) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl is needed for the TLS test (apt-get install openssl)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=gpu-agent test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        "-out",
        "server.pem",
    ]);
    (
        dir.join("ca.pem"),
        std::fs::read(dir.join("server.pem")).unwrap(),
        std::fs::read(dir.join("server.key")).unwrap(),
    )
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn grpc_over_tls_verifies_the_collector_with_the_given_ca() {
    let dir = std::env::temp_dir().join(format!("otlp-tls-{}", random_hex(8)));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, cert, key) = test_pki(&dir);
    let fx = Fixture::new();
    let rx = Receiver::start(Kind::GrpcTls { cert, key }, 0);
    let url = format!("https://localhost:{}", rx.addr.port());
    let agent = fx.agent(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &url),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.to_str().unwrap()),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
    ]);
    rx.received
        .wait_for(Duration::from_secs(20), |r| has_container_bytes(r, &fx.id))
        .unwrap_or_else(|| panic!("no export over TLS\n{}", agent.log()));
    drop(agent);
    // Without the CA the same collector is not trusted: exports fail, nothing arrives.
    let before = rx.received.count();
    let untrusting = fx.agent(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &url),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
    ]);
    untrusting.wait_until("a TLS failure", Duration::from_secs(15), || {
        untrusting.stats()["export_failures"].as_u64() >= Some(1)
    });
    assert_eq!(rx.received.count(), before);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- rotel: a real OpenTelemetry collector ----

/// `$GPU_AGENT_ROTEL` (set by `cargo xtask test`, which installs rotel into a virtualenv
/// under target/), else the rotel package of `python3`.
fn rotel_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("GPU_AGENT_ROTEL") {
        let bin = PathBuf::from(bin);
        assert!(
            bin.is_file(),
            "GPU_AGENT_ROTEL={}: no such file",
            bin.display()
        );
        return bin;
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import rotel, os; print(os.path.dirname(rotel.__file__))",
        ])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "rotel is not installed: `cargo xtask test` installs it (into target/test-tools/venv), \
         or `pip install --pre rotel==0.0.1a15` and run this test directly"
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()).join("rotel-agent")
}

struct Rotel {
    child: Child,
    out: PathBuf,
}

impl Rotel {
    fn start(grpc: u16, http: u16, out: &PathBuf) -> Rotel {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(out)
            .unwrap();
        let child = Command::new(rotel_binary())
            .args([
                "start",
                "--otlp-grpc-endpoint",
                &format!("127.0.0.1:{grpc}"),
            ])
            .args(["--otlp-http-endpoint", &format!("127.0.0.1:{http}")])
            .args([
                "--exporter",
                "blackhole",
                "--debug-log",
                "metrics",
                "--debug-log-verbosity",
                "detailed",
            ])
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .expect("starting rotel-agent");
        // Wait until both ports accept connections.
        let deadline = Instant::now() + Duration::from_secs(20);
        while [grpc, http]
            .iter()
            .any(|p| std::net::TcpStream::connect(("127.0.0.1", *p)).is_err())
        {
            assert!(Instant::now() < deadline, "rotel did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Rotel {
            child,
            out: out.clone(),
        }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }
}

impl Drop for Rotel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_output(r: &Rotel, from: usize, needles: &[&str], agent: &Agent) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let out = r.output();
        let new = out.get(from..).unwrap_or("");
        if needles.iter().all(|n| new.contains(n)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = r.output();
    panic!(
        "rotel never showed {needles:?}; its output tail:\n{}\nagent log:\n{}",
        &out[out.len().saturating_sub(3000)..],
        agent.log()
    );
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn rotel_receives_over_grpc_and_http_and_survives_a_restart() {
    let fx = Fixture::new();
    let (grpc, http) = (free_port(), free_port());
    let out = std::env::temp_dir().join(format!("rotel-{}.out", random_hex(8)));
    let bytes = (3 * GIB).to_string();
    let needles = [
        fx.id.as_str(),
        fx.uid.as_str(),
        "container.gpu.memory.usage",
        bytes.as_str(),
    ];
    let rotel = Rotel::start(grpc, http, &out);
    for (protocol, port) in [("grpc", grpc), ("http/protobuf", http)] {
        let from = rotel.output().len();
        let url = format!("http://127.0.0.1:{port}");
        let agent = fx.agent(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &url),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
            ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
        ]);
        wait_output(&rotel, from, &needles, &agent);
        assert!(agent.stop().success());
    }
    // Kill the collector under a running agent, let exports fail, bring it back on the
    // same ports: data resumes, the agent never died.
    drop(rotel);
    let rotel = Rotel::start(grpc, http, &out);
    let url = format!("http://127.0.0.1:{grpc}");
    let agent = fx.agent(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &url),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
    ]);
    wait_output(&rotel, 0, &needles, &agent);
    drop(rotel);
    agent.wait_until(
        "failed exports while rotel is down",
        Duration::from_secs(15),
        || agent.stats()["export_failures"].as_u64() >= Some(1),
    );
    let from = std::fs::metadata(&out)
        .map(|m| m.len() as usize)
        .unwrap_or(0);
    let rotel = Rotel::start(grpc, http, &out);
    wait_output(&rotel, from, &needles, &agent);
    assert_eq!(agent.stats()["mode"], "ebpf");
    assert!(agent.stop().success());
    let _ = std::fs::remove_file(&out);
}
