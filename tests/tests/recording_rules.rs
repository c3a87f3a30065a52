//! The recording rules for rightsizing under deploy/: `promtool check rules`, promtool's unit
//! tests (input series whose answers are known), and every series they read one the agent
//! emits (tests/tests/alerts.rs holds the PrometheusRule to the rules files). promtool is
//! Debian's (`cargo xtask test` installs it).
use std::collections::BTreeSet;

use tests::rules::{assert_promtool, root, rules, test_broken, yaml};

const RULES: &str = "deploy/prometheus/gpu-agent-rightsizing.yaml";
const UNIT_TESTS: &str = "deploy/prometheus/gpu-agent-rightsizing.test.yaml";

#[test]
fn the_rules_pass_promtool_check_and_every_rule_has_a_unit_test() {
    let dir = root().join("deploy/prometheus");
    assert_promtool(&dir, &["check", "rules", "gpu-agent-rightsizing.yaml"]);
    assert_promtool(&dir, &["test", "rules", "gpu-agent-rightsizing.test.yaml"]);
    // Every recorded series is expected, with samples, by some test.
    let tests = yaml(UNIT_TESTS);
    let tested: BTreeSet<&str> = tests["tests"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|t| t["promql_expr_test"].as_sequence().unwrap())
        .filter(|e| !e["exp_samples"].as_sequence().unwrap().is_empty())
        .filter_map(|e| e["expr"].as_str())
        .collect();
    for r in rules(&yaml(RULES)) {
        let name = r["record"].as_str().unwrap();
        assert!(
            tested.iter().any(|e| e.contains(name)),
            "{name} has no unit test"
        );
    }
}

/// The unit tests fail on a broken rule: an idle allocation counted by its memory use
/// (not by holding none) is no longer idle.
#[test]
fn the_unit_tests_catch_a_broken_rule() {
    let (ok, text) = test_broken(
        "gpu-agent-rightsizing.yaml",
        "gpu-agent-rightsizing.test.yaml",
        "unless ignoring (model, mig_profile) (container_gpu_memory_peak_bytes > 0)",
        "unless ignoring (model, mig_profile) (container_gpu_memory_peak_bytes >= 0)",
    );
    assert!(
        !ok && text.contains("workload_model:container_gpu_share_idle:sum"),
        "{text}"
    );
}

/// Each metric name the rules read (an identifier that is not a recorded series, a
/// function, a keyword or a label they group or select by) is one the agent emits.
#[test]
fn the_rules_read_only_series_the_agent_emits() {
    let emitted: BTreeSet<&str> = otel::catalogue::prometheus_names().collect();
    let not_metrics = [
        "by",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "unless",
        "and",
        "or",
        "max",
        "sum",
        "count",
        "max_over_time",
        "quantile_over_time",
        "time",
        "namespace",
        "workload_kind",
        "workload",
        "model",
        "mig_profile",
        "hw_parent",
    ];
    let (file, mut used) = (yaml(RULES), BTreeSet::new());
    for r in rules(&file) {
        let expr = r["expr"].as_str().unwrap();
        let idents = expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .filter(|w| w.starts_with(|c: char| c.is_ascii_alphabetic()) && !w.contains(':'));
        used.extend(idents.filter(|w| !not_metrics.contains(w)));
    }
    for want in [
        "container_gpu_share",
        "container_gpu_sm_share",
        "container_gpu_memory_peak_bytes",
        "hw_gpu_memory_limit_bytes",
    ] {
        assert!(used.contains(want), "{want} not read: {used:?}");
    }
    for n in &used {
        assert!(emitted.contains(n), "{n} is not a metric the agent emits");
    }
}
