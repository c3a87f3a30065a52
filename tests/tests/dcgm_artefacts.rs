//! dcgm-exporter's users' artefacts against gpu-agent's `--prometheus-compat dcgm` through a
//! real Prometheus: Grafana dashboard 12239 (NVIDIA's `grafana/dcgm-exporter-dashboard.json`,
//! the released one and the `Hostname` one: every panel's query returns data with the
//! labels its legend shows) and the prometheus-adapter chart's default rules (an HPA on
//! DCGM_FI_DEV_GPU_UTIL and DCGM_FI_DEV_FB_USED per pod gets each pod's value, the idle
//! allocated pod's included).
//!
//! The files are NVIDIA's and the Prometheus community's: this repository does not hold
//! them, and no package ships them. The tests that always run use the variables, queries
//! and legends, and the adapter's default rules, transcribed below from the versions named
//! in [`ARTEFACTS`]. Where the files themselves are present (`GPU_AGENT_DCGM_ARTEFACTS`, or
//! `shared/dcgm-exporter/` beside the checkout, as in CI), one more test checks that the
//! transcription still matches them and runs the same checks on the files as they are;
//! `cargo xtask test` runs it in CI, and elsewhere leaves it out, saying so, when they are
//! absent.
use std::{collections::BTreeMap, path::PathBuf};

use serde_json::Value as Json;
use serde_yaml::Value;
use tests::{
    dcgm_node::{artefacts_dir, uuid, DcgmNode, ARTEFACTS, GPUS},
    prom::{Prometheus, Sample},
    Agent,
};

/// A dashboard as the checks read it: its query variables (name, query) in order, and each
/// panel's targets (panel title, expression, legend format).
#[derive(Debug, PartialEq)]
struct Dashboard {
    vars: Vec<(String, String)>,
    targets: Vec<(String, String, String)>,
}

type Transcript = (
    &'static [(&'static str, &'static str)],
    &'static [(&'static str, &'static str, &'static str)],
);

/// `grafana/dcgm-exporter-dashboard.json` at NVIDIA/dcgm-exporter tag 4.5.3-4.8.2 (the
/// released dashboard 12239), transcribed.
const RELEASED: Transcript = (
    &[
        ("instance", "label_values(DCGM_FI_DEV_GPU_TEMP, instance)"),
        ("gpu", "label_values(DCGM_FI_DEV_GPU_TEMP, gpu)"),
    ],
    &[
        (
            "GPU Temperature",
            r#"DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}"#,
            "GPU {{gpu}}",
        ),
        (
            "GPU Avg. Temp",
            r#"avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})"#,
            "",
        ),
        (
            "GPU Power Usage",
            r#"DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}"#,
            "GPU {{gpu}}",
        ),
        (
            "GPU Power Total",
            r#"sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})"#,
            "",
        ),
        (
            "GPU SM Clocks",
            r#"DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000"#,
            "GPU {{gpu}}",
        ),
        (
            "GPU Utilization",
            r#"DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}"#,
            "GPU {{gpu}}",
        ),
        (
            "GPU Framebuffer Mem Used",
            r#"DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}"#,
            "GPU {{gpu}}",
        ),
        (
            "Tensor Core Utilization",
            r#"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}"#,
            "GPU {{gpu}}",
        ),
    ],
);

/// The same file at NVIDIA/dcgm-exporter commit a52c9c0 (pull request 355: MIG support,
/// `Hostname`, GR_ENGINE_ACTIVE for utilization), transcribed.
const HOSTNAME: Transcript = (
    &[
        ("Hostname", "label_values(DCGM_FI_DEV_FB_FREE, Hostname)"),
        (
            "gpu",
            r#"label_values(DCGM_FI_DEV_FB_FREE{Hostname=~"$Hostname"}, gpu)"#,
        ),
    ],
    &[
        (
            "GPU Temperature",
            r#"max(DCGM_FI_DEV_GPU_TEMP{Hostname=~"$Hostname", gpu=~"$gpu"}) by (Hostname, gpu, uuid)"#,
            "{{Hostname}} - GPU {{gpu}}",
        ),
        (
            "GPU Avg. Temp",
            r#"avg(DCGM_FI_DEV_GPU_TEMP{Hostname=~"$Hostname", gpu=~"$gpu"})"#,
            "",
        ),
        (
            "GPU Power Usage",
            r#"max(DCGM_FI_DEV_POWER_USAGE{Hostname=~"$Hostname", gpu=~"$gpu"}) by (Hostname, gpu, uuid)"#,
            "{{Hostname}} - GPU {{gpu}}",
        ),
        (
            "GPU Power Total",
            r#"sum(max(DCGM_FI_DEV_POWER_USAGE{Hostname=~"$Hostname", gpu=~"$gpu"}) by (gpu))"#,
            "",
        ),
        (
            "GPU SM Clocks",
            r#"max(DCGM_FI_DEV_SM_CLOCK{Hostname=~"$Hostname", gpu=~"$gpu"} * 1000000) by (Hostname, UUID, gpu)"#,
            "{{Hostname}} - GPU {{gpu}}",
        ),
        (
            "GPU Utilization",
            r#"max(DCGM_FI_PROF_GR_ENGINE_ACTIVE{Hostname=~"$Hostname", gpu=~"$gpu"}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)"#,
            "GPU {{gpu}}/{{GPU_I_ID}} ({{GPU_I_PROFILE}})",
        ),
        (
            "Tensor Core Utilization",
            r#"max(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname=~"$Hostname", gpu=~"$gpu"}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)"#,
            "{{Hostname}} GPU {{gpu}}/{{GPU_I_ID}} ({{GPU_I_PROFILE}})",
        ),
        (
            "GPU Framebuffer Mem Used",
            r#"max(DCGM_FI_DEV_FB_USED{Hostname=~"$Hostname", gpu=~"$gpu"}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)"#,
            "{{Hostname}} - GPU {{gpu}}/{{GPU_I_ID}} ({{GPU_I_PROFILE}})",
        ),
    ],
);

/// The `rules.default` block of prometheus-community/helm-charts'
/// `charts/prometheus-adapter/templates/configmap.yaml` at commit cf408a2 (chart 5.3.0),
/// transcribed.
const ADAPTER_DEFAULT_RULES: &str = r#"
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  seriesFilters: []
  resources:
    overrides:
      namespace:
        resource: namespace
      pod:
        resource: pod
  name:
    matches: ^container_(.*)_seconds_total$
    as: ""
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>,container!="POD"}[5m]))
    by (<<.GroupBy>>)
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  seriesFilters:
  - isNot: ^container_.*_seconds_total$
  resources:
    overrides:
      namespace:
        resource: namespace
      pod:
        resource: pod
  name:
    matches: ^container_(.*)_total$
    as: ""
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>,container!="POD"}[5m]))
    by (<<.GroupBy>>)
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  seriesFilters:
  - isNot: ^container_.*_total$
  resources:
    overrides:
      namespace:
        resource: namespace
      pod:
        resource: pod
  name:
    matches: ^container_(.*)$
    as: ""
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>,container!="POD"}) by (<<.GroupBy>>)
- seriesQuery: '{namespace!="",__name__!~"^container_.*"}'
  seriesFilters:
  - isNot: .*_total$
  resources:
    template: <<.Resource>>
  name:
    matches: ""
    as: ""
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)
- seriesQuery: '{namespace!="",__name__!~"^container_.*"}'
  seriesFilters:
  - isNot: .*_seconds_total
  resources:
    template: <<.Resource>>
  name:
    matches: ^(.*)_total$
    as: ""
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>}[5m])) by (<<.GroupBy>>)
- seriesQuery: '{namespace!="",__name__!~"^container_.*"}'
  seriesFilters: []
  resources:
    template: <<.Resource>>
  name:
    matches: ^(.*)_seconds_total$
    as: ""
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>}[5m])) by (<<.GroupBy>>)
"#;

fn transcript((vars, targets): Transcript) -> Dashboard {
    Dashboard {
        vars: vars
            .iter()
            .map(|(n, q)| (n.to_string(), q.to_string()))
            .collect(),
        targets: targets
            .iter()
            .map(|(t, e, l)| (t.to_string(), e.to_string(), l.to_string()))
            .collect(),
    }
}

/// A file from [`artefacts_dir`], or a failure naming where it comes from.
fn artefact(name: &str) -> PathBuf {
    let dir = artefacts_dir().expect("no GPU_AGENT_DCGM_ARTEFACTS nor ../shared/dcgm-exporter");
    let path = dir.join(name);
    let from = ARTEFACTS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or("", |a| a.1);
    assert!(
        path.is_file(),
        "{} is missing: it is {from}",
        path.display()
    );
    path
}

/// Every panel of a dashboard, rows' panels included.
fn panels(list: &Json, out: &mut Vec<Json>) {
    for p in list.as_array().into_iter().flatten() {
        out.push(p.clone());
        panels(&p["panels"], out);
    }
}

/// A Grafana dashboard JSON as the checks read it.
fn read_dashboard(d: &Json) -> Dashboard {
    let vars = d["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            let q = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .unwrap();
            (v["name"].as_str().unwrap().to_string(), q.to_string())
        })
        .collect();
    let mut all = vec![];
    panels(&d["panels"], &mut all);
    let mut targets = vec![];
    for p in &all {
        let title = p["title"].as_str().unwrap_or("?");
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                let legend = t["legendFormat"].as_str().unwrap_or("");
                targets.push((title.to_string(), expr.to_string(), legend.to_string()));
            }
        }
    }
    Dashboard { vars, targets }
}

/// The node (no processes: device values and allocations are what these read), its agent
/// in dcgm mode, and a Prometheus scraping it once the allocations show.
fn setup() -> (DcgmNode, Agent, Prometheus) {
    tests::prom::which("prometheus");
    let node = DcgmNode::start(false);
    let agent = node.agent("[xid]\nkmsg = \"\"\n", &["--prometheus-compat", "dcgm"]);
    let prom = Prometheus::start(&[("gpu-agent", &agent.addr)]);
    prom.wait("count(DCGM_FI_DEV_GPU_UTIL{pod!=\"\"})", |r| {
        r.first().is_some_and(|s| s.value == 4.0)
    });
    prom.wait("count(DCGM_FI_PROF_GR_ENGINE_ACTIVE)", |r| {
        r.first().is_some_and(|s| s.value == 8.0)
    });
    (node, agent, prom)
}

/// `label_values(METRIC{sel}, label)`: (selector, label).
fn label_values_query(q: &str) -> (String, String) {
    let inner = q
        .trim()
        .strip_prefix("label_values(")
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("not a label_values query: {q}"));
    let (sel, label) = inner.rsplit_once(',').unwrap();
    (sel.trim().to_string(), label.trim().to_string())
}

fn substitute(expr: &str, vars: &BTreeMap<String, String>) -> String {
    let mut e = expr
        .replace("$__rate_interval", "5m")
        .replace("$__interval", "1m");
    // Longest names first: `$gpu` must not eat into `$gpu_id`.
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for n in names {
        e = e
            .replace(&format!("${{{n}}}"), &vars[n])
            .replace(&format!("${n}"), &vars[n]);
    }
    e
}

/// The dashboard's variables as Grafana sets them with "All" chosen: each a regex of all
/// its values, asked of Prometheus in order (a variable may use the ones before it).
fn variables(d: &Dashboard, prom: &Prometheus) -> BTreeMap<String, String> {
    let mut vars = BTreeMap::new();
    for (name, q) in &d.vars {
        let (sel, label) = label_values_query(&substitute(q, &vars));
        let values = prom.label_values(&label, &sel);
        assert!(!values.is_empty(), "variable {name}: {q} has no values");
        if label == "gpu" {
            assert_eq!(values.len(), GPUS.len(), "variable {name}: {values:?}");
        }
        vars.insert(name.clone(), values.join("|"));
    }
    vars
}

/// The labels a legend format shows: `{{gpu}}` -> gpu.
fn legend_labels(legend: &str) -> Vec<String> {
    legend
        .split("{{")
        .skip(1)
        .filter_map(|p| p.split("}}").next())
        .map(|l| l.trim().to_string())
        .collect()
}

/// Runs every panel's query: each returns data with its legend's labels. Returns how many.
fn check_dashboard(name: &str, d: &Dashboard, prom: &Prometheus) -> usize {
    let vars = variables(d, prom);
    for (title, expr, legend) in &d.targets {
        let e = substitute(expr, &vars);
        let r = prom
            .query(&e)
            .unwrap_or_else(|| panic!("{name}: {title}: Prometheus refused {e}"));
        assert!(!r.is_empty(), "{name}: panel {title}: no data for {e}");
        panel_labels(name, title, legend, &r);
    }
    d.targets.len()
}

/// Every series has what its legend shows: `gpu`, `Hostname` on all; the MIG instance's
/// `GPU_I_ID` and `GPU_I_PROFILE` on the MIG device's series, which the panel must have.
/// No GPU (or MIG instance) is drawn twice, and the power total counts each GPU once.
fn panel_labels(name: &str, title: &str, legend: &str, r: &[Sample]) {
    let wanted = legend_labels(legend);
    for s in r {
        for l in wanted.iter().filter(|l| !l.starts_with("GPU_I_")) {
            assert!(!s.label(l).is_empty(), "{name}: {title}: no {l} on {s:?}");
        }
    }
    if !wanted.is_empty() {
        let mut keys: Vec<(&str, &str)> = r
            .iter()
            .map(|s| (s.label("gpu"), s.label("GPU_I_ID")))
            .collect();
        keys.sort();
        let n = keys.len();
        keys.dedup();
        assert_eq!(keys.len(), n, "{name}: {title}: a GPU drawn twice: {r:?}");
    }
    if wanted.iter().any(|l| l.starts_with("GPU_I_")) {
        let mig = r.iter().find(|s| !s.label("GPU_I_ID").is_empty());
        let mig = mig.unwrap_or_else(|| panic!("{name}: {title}: no MIG series in {r:?}"));
        assert_eq!(
            (mig.label("GPU_I_ID"), mig.label("GPU_I_PROFILE")),
            ("1", "1g.10gb")
        );
    }
    if title.contains("Power Total") {
        let watts: f64 = GPUS.iter().map(|g| g.1 as f64).sum();
        assert_eq!(r[0].value, watts, "{name}: {title}: each GPU once");
    }
}

/// Go's `regexp.MatchString`, which the adapter uses: unanchored unless the pattern says.
fn matches(re: &str, name: &str) -> bool {
    regex::Regex::new(re)
        .unwrap_or_else(|e| panic!("the chart's pattern {re}: {e}"))
        .is_match(name)
}

/// The metrics query the adapter makes for pods of `namespace` on `metric`: the first
/// default rule whose series query lists it, whose filters keep it and whose name it keeps.
fn adapter_query(
    rules: &[Value],
    prom: &Prometheus,
    metric: &str,
    namespace: &str,
    pods: &[&str],
) -> String {
    for r in rules {
        let listed = prom
            .series(r["seriesQuery"].as_str().unwrap())
            .iter()
            .any(|s| s["__name__"] == metric);
        let filtered = r["seriesFilters"]
            .as_sequence()
            .into_iter()
            .flatten()
            .any(|f| {
                f["isNot"].as_str().is_some_and(|re| matches(re, metric))
                    || f["is"].as_str().is_some_and(|re| !matches(re, metric))
            });
        // The name the metric gets: kept when the pattern is "" (or `as` is the whole match).
        let name_re = r["name"]["matches"].as_str().unwrap_or("");
        let kept = name_re.is_empty()
            || (matches(name_re, metric) && !name_re.contains('(') && r["name"]["as"] == "");
        if !listed || filtered || !kept {
            continue;
        }
        let resource = r["resources"]["template"]
            .as_str()
            .unwrap_or("<<.Resource>>");
        let label = |res: &str| resource.replace("<<.Resource>>", res);
        let matchers = format!(
            "{}=\"{namespace}\",{}=~\"{}\"",
            label("namespace"),
            label("pod"),
            pods.join("|")
        );
        return r["metricsQuery"]
            .as_str()
            .unwrap()
            .replace("<<.Series>>", metric)
            .replace("<<.LabelMatchers>>", &matchers)
            .replace("<<.GroupBy>>", &label("pod"));
    }
    panic!("no default rule of prometheus-adapter serves {metric}");
}

/// HPAs on DCGM_FI_DEV_GPU_UTIL and DCGM_FI_DEV_FB_USED per pod, through the adapter's
/// `rules`: each pod gets its GPU's value, the pod that holds a GPU and runs nothing too.
fn check_adapter(rules: &[Value], prom: &Prometheus) {
    // Per namespace, the pods an HPA scales, and each one's GPU.
    let hpas = [
        ("team-a", vec![("trainer-a", 0usize)]),
        ("team-b", vec![("trainer-b", 1)]),
        ("team-c", vec![("idle-d", 3)]),
    ];
    for (ns, pods) in hpas {
        let names: Vec<&str> = pods.iter().map(|p| p.0).collect();
        // Utilization %, and memory in MiB: the device's, on its pod's series.
        let util: fn(usize) -> f64 = |g| GPUS[g].0 as f64;
        let fb: fn(usize) -> f64 = |g| (GPUS[g].2 * 1024) as f64;
        for (metric, want) in [("DCGM_FI_DEV_GPU_UTIL", util), ("DCGM_FI_DEV_FB_USED", fb)] {
            let q = adapter_query(rules, prom, metric, ns, &names);
            let r = prom
                .query(&q)
                .unwrap_or_else(|| panic!("Prometheus refused {q}"));
            for (pod, gpu) in &pods {
                let got = r.iter().find(|s| s.label("pod") == *pod);
                let got = got
                    .unwrap_or_else(|| panic!("{metric}: no value for {ns}/{pod} from {q}: {r:?}"));
                assert_eq!(
                    got.value,
                    want(*gpu),
                    "{metric} of {ns}/{pod} (GPU {})",
                    uuid(*gpu)
                );
            }
        }
    }
}

fn transcribed_adapter_rules() -> Vec<Value> {
    serde_yaml::from_str(ADAPTER_DEFAULT_RULES).expect("the transcribed rules as YAML")
}

#[test]
#[ignore = "needs root: Debian's prometheus, which cargo xtask test installs as root"]
fn dcgm_artefacts_dashboard_12239_panels_return_data_with_their_labels() {
    let (_node, _agent, prom) = setup();
    for (name, t) in [("released", RELEASED), ("Hostname", HOSTNAME)] {
        let n = check_dashboard(name, &transcript(t), &prom);
        assert_eq!(n, 8, "{name}");
    }
}

#[test]
#[ignore = "needs root: Debian's prometheus, which cargo xtask test installs as root"]
fn dcgm_artefacts_adapter_rules_give_each_pod_its_value() {
    let (_node, _agent, prom) = setup();
    check_adapter(&transcribed_adapter_rules(), &prom);
}

/// The chart's default rules (`rules.default: true`), from its configmap template.
fn file_adapter_rules() -> Vec<Value> {
    let text = std::fs::read_to_string(artefact("prometheus-adapter-configmap.yaml")).unwrap();
    let start = text
        .find("{{- if .Values.rules.default }}")
        .expect("the default rules block");
    let block = &text[start..];
    let block = &block[block.find('\n').unwrap() + 1..block.find("{{- end -}}").unwrap()];
    serde_yaml::from_str(block).expect("the default rules as YAML")
}

/// The files themselves, where present: the transcriptions above are still theirs, and the
/// same checks pass on the files as they are.
#[test]
#[ignore = "needs NVIDIA's dashboard files and the adapter chart in GPU_AGENT_DCGM_ARTEFACTS or ../shared/dcgm-exporter (docs/metrics.md)"]
fn dcgm_real_artefact_files_match_the_transcription_and_pass() {
    let (_node, _agent, prom) = setup();
    for (file, t) in [
        ("dcgm-exporter-dashboard.json", RELEASED),
        ("dcgm-exporter-dashboard-hostname.json", HOSTNAME),
    ] {
        let text = std::fs::read_to_string(artefact(file)).unwrap();
        let d = read_dashboard(&serde_json::from_str(&text).unwrap());
        assert_eq!(d, transcript(t), "{file} differs from its transcription");
        check_dashboard(file, &d, &prom);
    }
    let rules = file_adapter_rules();
    assert_eq!(
        rules,
        transcribed_adapter_rules(),
        "the chart's default rules changed"
    );
    check_adapter(&rules, &prom);
}
