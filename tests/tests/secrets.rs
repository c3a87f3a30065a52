//! Secrets never leave the process: credentials planted in the OTLP URL, in
//! OTEL_EXPORTER_OTLP_HEADERS and in the config file appear in no endpoint and nowhere in
//! the log, also while every export fails.
use std::time::Duration;

use tests::{http, prom::free_port, Agent};

const PLANTED: [&str; 3] = ["s3cr3t-url-pw", "s3cr3t-env-token", "s3cr3t-config-key"];

fn assert_clean(what: &str, text: &str) {
    for s in PLANTED {
        assert!(!text.contains(s), "{s} leaked in {what}:\n{text}");
    }
}

#[test]
#[ignore = "needs root: loads the eBPF programs"]
fn planted_secrets_appear_in_no_endpoint_and_no_log() {
    for protocol in ["http/protobuf", "grpc"] {
        // A freed port: nothing listens there, so every export fails and is logged.
        let url = format!("http://gpu:{}@127.0.0.1:{}", PLANTED[0], free_port());
        let header = format!("authorization=Bearer {}", PLANTED[1]);
        let config = format!(
            "[otlp]\ninterval_ms = 200\n[otlp.headers]\nx-api-key = \"{}\"\n",
            PLANTED[2]
        );
        let agent = Agent::start_full(
            &tests::agent_binary(),
            &config,
            &["--prometheus"],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", &url),
                ("OTEL_EXPORTER_OTLP_HEADERS", &header),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
                // Everything the agent and its libraries log, not only warnings.
                ("RUST_LOG", "debug"),
            ],
        );
        agent.wait_until("failed exports", Duration::from_secs(15), || {
            agent.stats()["export_failures"].as_u64() >= Some(2)
        });
        let stats = agent.stats();
        assert!(
            stats["otlp"].as_str().unwrap().contains("127.0.0.1"),
            "{stats}"
        );
        for path in [
            "/healthz",
            "/readyz",
            "/metrics",
            "/debug/stats",
            "/debug/snapshot",
            "/debug/processes?all=true",
        ] {
            let (_, body) = http::get(&agent.addr, path).unwrap();
            assert_clean(path, &body);
        }
        let log = agent.log();
        assert!(log.contains("OTLP export failed"), "{log}");
        assert_clean("the log", &log);
    }
}
