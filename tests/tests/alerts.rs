//! The alert rules under deploy/: promtool's unit tests of every rule (input series, the
//! alerts expected), the PrometheusRule equal to the plain rules file, and every metric
//! they read one the agent emits. promtool is Debian's (`cargo xtask test` installs it).
use std::collections::BTreeSet;

use serde_yaml::Value;
use tests::rules::{assert_promtool, root, rules, test_broken, yaml};

const RULES: &str = "deploy/prometheus/gpu-agent-alerts.yaml";
const UNIT_TESTS: &str = "deploy/prometheus/gpu-agent-alerts.test.yaml";
const OPERATOR: &str = "deploy/kubernetes/components/prometheus/prometheusrule.yaml";

#[test]
fn every_alert_rule_passes_its_promtool_unit_tests() {
    let dir = root().join("deploy/prometheus");
    assert_promtool(&dir, &["test", "rules", "gpu-agent-alerts.test.yaml"]);
    // Every rule has a test that expects it to fire.
    let tests = yaml(UNIT_TESTS);
    let tested: BTreeSet<&str> = tests["tests"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_sequence().unwrap())
        .filter(|a| !a["exp_alerts"].as_sequence().unwrap().is_empty())
        .filter_map(|a| a["alertname"].as_str())
        .collect();
    for r in rules(&yaml(RULES)) {
        let name = r["alert"].as_str().unwrap();
        assert!(
            tested.contains(name),
            "{name} has no test that makes it fire"
        );
    }
}

/// The unit tests fail on a broken rule: a GPU lost for a minute no longer alerts when
/// the rule waits ten.
#[test]
fn the_unit_tests_catch_a_broken_rule() {
    let (ok, text) = test_broken(
        "gpu-agent-alerts.yaml",
        "gpu-agent-alerts.test.yaml",
        "expr: hw_status{hw_state=\"failed\"} == 1\n        for: 1m",
        "expr: hw_status{hw_state=\"failed\"} == 1\n        for: 10m",
    );
    assert!(!ok && text.contains("alertname: GpuLost"), "{text}");
}

#[test]
fn the_prometheus_rule_holds_the_same_rules() {
    let op = yaml(OPERATOR);
    assert_eq!(op["kind"], "PrometheusRule");
    assert_eq!(op["metadata"]["namespace"], "gpu-agent");
    // The alerts' groups, then rightsizing's (deploy/prometheus's files in name order, as
    // the Helm chart renders them).
    let mut groups = yaml(RULES)["groups"].as_sequence().unwrap().clone();
    let recording = yaml("deploy/prometheus/gpu-agent-rightsizing.yaml");
    groups.extend(recording["groups"].as_sequence().unwrap().iter().cloned());
    assert_eq!(
        op["spec"]["groups"],
        Value::Sequence(groups),
        "{OPERATOR} differs from deploy/prometheus's rules"
    );
    let kustomization = std::fs::read_to_string(
        root().join("deploy/kubernetes/components/prometheus/kustomization.yaml"),
    )
    .unwrap();
    assert!(kustomization.contains("- prometheusrule.yaml"));
}

#[test]
fn alerts_read_only_metrics_the_agent_emits() {
    let emitted: BTreeSet<&str> = otel::catalogue::prometheus_names().collect();
    let mut used = BTreeSet::new();
    for r in rules(&yaml(RULES)) {
        let expr = r["expr"].as_str().unwrap();
        // Metric names: identifiers followed by a selector.
        for (i, _) in expr.match_indices('{') {
            let name: String = expr[..i]
                .chars()
                .rev()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            if !name.is_empty() {
                used.insert(name);
            }
        }
        for bare in [
            "gpu_agent_nvml_up",
            "hw_gpu_memory_row_remap_failed",
            "container_gpu_allocated_idle",
            "hw_gpu_memory_utilization_ratio",
        ] {
            if expr.starts_with(bare) {
                used.insert(bare.to_string());
            }
        }
    }
    assert!(used.len() >= 6, "{used:?}");
    for n in &used {
        assert!(
            emitted.contains(n.as_str()),
            "{n} is not a metric the agent emits"
        );
    }
}
