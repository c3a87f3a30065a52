//! The manifests under deploy/ as a cluster receives them: every kustomization rendered with
//! `kubectl kustomize` (or `kustomize build`) and read with serde_yaml. The first checks are
//! what is specific to gpu-agent, each with a test that it fails on a broken copy; the
//! generic schemas are left to kubernetes-validate, promtool and tsc with @grafana/schema.
//! Tools come from PATH; a missing one fails its test with one line naming it. The checks
//! themselves live in tests/src/manifests/, shared with the Helm chart's tests
//! (tests/tests/helm.rs). docs/deploy.md, "What CI checks". `cargo xtask check-deploy` runs
//! this file.
use std::{collections::BTreeSet, fs, path::PathBuf, process::Command};

use serde_json::{json, Value as Json};
use serde_yaml::Value;
use tests::{flag, manifests::*};

const TYPESCRIPT: &str = "5.9.3";
const GRAFANA_SCHEMA: &str = "13.2.3";

/// Every Prometheus family the agent can emit, from the metric catalogue that drives both
/// sinks.
/// The agent's series, and the recording rules' that deploy/prometheus ships (the
/// dashboard's rightsizing row reads those).
fn emitted_metric_names() -> BTreeSet<String> {
    let mut names: BTreeSet<String> = otel::catalogue::prometheus_names()
        .map(String::from)
        .collect();
    for f in files_in(&root().join("deploy/prometheus"), "yaml") {
        let rules: Value = serde_yaml::from_str(&fs::read_to_string(&f).unwrap()).unwrap();
        for g in seq(&rules["groups"]) {
            let recorded = seq(&g["rules"]).iter().filter_map(|r| r["record"].as_str());
            names.extend(recorded.map(String::from));
        }
    }
    names
}

/// Every object of deploy/examples/*.yaml, with its file.
fn examples() -> Vec<(String, Value)> {
    let files = files_in(&root().join("deploy/examples"), "yaml");
    let docs = files
        .iter()
        .map(|f| (rel(f), fs::read_to_string(f).unwrap()));
    docs.flat_map(|(f, text)| {
        yaml_docs(&text, &f)
            .into_iter()
            .map(move |d| (f.clone(), d))
    })
    .collect()
}

/// deploy/examples/dra/*.yaml: (file, text, objects).
fn dra_examples() -> Vec<(String, String, Vec<Value>)> {
    let files = files_in(&root().join("deploy/examples/dra"), "yaml");
    assert!(!files.is_empty(), "no deploy/examples/dra/*.yaml");
    files
        .iter()
        .map(|f| {
            let text = fs::read_to_string(f).unwrap();
            let objs = yaml_docs(&text, &rel(f));
            (rel(f), text, objs)
        })
        .collect()
}

fn dashboards() -> Vec<(String, Json)> {
    let files = files_in(&root().join("deploy/grafana"), "json");
    assert!(!files.is_empty(), "no deploy/grafana/*.json");
    let parse = |f: &PathBuf| serde_json::from_str(&fs::read_to_string(f).unwrap());
    files
        .iter()
        .map(|f| {
            (
                rel(f),
                parse(f).unwrap_or_else(|e| panic!("{}: {e}", rel(f))),
            )
        })
        .collect()
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

// ---------------------------------------------------------------------------------------
// What is specific to gpu-agent (tests/src/manifests/)

#[test]
fn every_rendered_object_has_its_kustomizations_namespace() {
    assert!(
        renders().len() >= 5,
        "expected the base, 2 components, an overlay, the collector"
    );
    assert_none(renders().iter().flat_map(namespace_problems).collect());
}

#[test]
fn probes_container_port_and_service_monitor_are_on_the_agents_metrics_addr() {
    let agents = renders().iter().filter(|r| agent(r).is_some()).count();
    assert!(
        agents >= 4,
        "only {agents} renderings have the gpu-agent DaemonSet"
    );
    assert!(
        renders()
            .iter()
            .any(|r| r.of_kind("ServiceMonitor").next().is_some()),
        "no ServiceMonitor"
    );
    assert_none(renders().iter().flat_map(port_problems).collect());
}

#[test]
fn a_network_policy_admits_only_prometheus_to_the_metrics_port() {
    assert_none(renders().iter().flat_map(network_policy_problems).collect());
}

#[test]
fn agent_requests_no_gpu_and_keeps_host_pid_read_only_mounts_and_capabilities() {
    assert_none(renders().iter().flat_map(privilege_problems).collect());
}

#[test]
fn collector_receives_where_the_agent_sends_and_associates_its_resources() {
    assert_none(collector_problems(
        render("deploy/kubernetes"),
        render("deploy/collector"),
    ));
}

#[test]
fn the_agent_accepts_its_deployed_config_and_environment() {
    let (ok, out) = check_config(render("deploy/kubernetes"), &no_secrets);
    assert!(ok, "{out}");
}

// ---------------------------------------------------------------------------------------
// Dashboards and examples against the metrics the agent emits

/// Metric names in a PromQL expression: identifiers (outside strings, not `$variables`) right
/// before `{` or `[`, or the whole expression when it is one name. The dashboards write every
/// selector with braces, so a bare name elsewhere (a label, a function) is not taken.
fn metric_names(expr: &str) -> Vec<String> {
    let (b, mut out, mut i) = (expr.as_bytes(), vec![], 0);
    while i < b.len() {
        let start = i;
        if matches!(b[i], b'"' | b'\'' | b'`') {
            i += 1;
            while i < b.len() && b[i] != b[start] {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if is_ident(b[i]) && !b[i].is_ascii_digit() {
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            let selector = matches!(expr[i..].trim_start().bytes().next(), Some(b'{' | b'['));
            if selector && (start == 0 || b[start - 1] != b'$') {
                out.push(expr[start..i].to_string());
            }
        } else {
            i += 1;
        }
    }
    let bare = expr.trim();
    if out.is_empty() && !bare.is_empty() && bare.bytes().all(is_ident) {
        out.push(bare.to_string());
    }
    out
}

/// Every PromQL expression of a dashboard, and where it is: the panels' targets (rows' panels
/// too) and the selectors of `label_values(SELECTOR, label)` variables.
fn dashboard_exprs(d: &Json) -> Vec<(String, String)> {
    let list = |v: &Json| v.as_array().cloned().unwrap_or_default();
    let mut panels = list(&d["panels"]);
    panels.extend(panels.clone().iter().flat_map(|p| list(&p["panels"])));
    let mut out = vec![];
    for p in &panels {
        for t in list(&p["targets"]) {
            let what = format!("panel {} {} target {}", p["id"], p["title"], t["refId"]);
            out.push((what, t["expr"].as_str().unwrap_or("").to_string()));
        }
    }
    for v in list(&d["templating"]["list"])
        .iter()
        .filter(|v| v["type"] == "query")
    {
        let q = v["query"]
            .as_str()
            .or(v["query"]["query"].as_str())
            .unwrap_or("");
        if let Some((sel, _)) = q
            .strip_prefix("label_values(")
            .and_then(|q| q.rsplit_once(','))
        {
            out.push((format!("variable {}", v["name"]), sel.trim().to_string()));
        }
    }
    out
}

fn dashboard_problems(file: &str, d: &Json, emitted: &BTreeSet<String>) -> Vec<String> {
    let exprs = dashboard_exprs(d);
    let mut p = vec![];
    flag!(p, exprs.is_empty(), "{file}: no PromQL expressions");
    for (what, expr) in exprs {
        let names = metric_names(&expr);
        flag!(
            p,
            names.is_empty(),
            "{file}: {what}: no metric selector in {expr:?}"
        );
        for n in names.iter().filter(|n| !emitted.contains(*n)) {
            p.push(format!(
                "{file}: {what}: metric {n} is not one the agent emits"
            ));
        }
    }
    p
}

#[test]
fn dashboards_use_only_metrics_the_agent_emits() {
    let emitted = emitted_metric_names();
    assert_none(
        dashboards()
            .iter()
            .flat_map(|(f, d)| dashboard_problems(f, d, &emitted))
            .collect(),
    );
}

/// The Prometheus Adapter rules of deploy/examples (config.yaml of a ConfigMap), and where.
fn adapter_rules(objs: &[(String, Value)]) -> Vec<(String, Value)> {
    let mut out = vec![];
    for (file, o) in objs.iter().filter(|(_, o)| o["kind"] == "ConfigMap") {
        let Some(text) = o["data"]["config.yaml"].as_str() else {
            continue;
        };
        let at = format!(
            "{file}: ConfigMap {} config.yaml",
            s(&o["metadata"]["name"])
        );
        let conf: Value = serde_yaml::from_str(text).unwrap_or_else(|e| panic!("{at}: {e}"));
        out.extend(
            seq(&conf["rules"])
                .iter()
                .enumerate()
                .map(|(i, r)| (format!("{at} rules[{i}]"), r.clone())),
        );
    }
    out
}

/// A rule's metricsQuery with its templates filled in as the adapter would.
fn adapter_query(rule: &Value) -> String {
    let series = metric_names(s(&rule["seriesQuery"]))
        .into_iter()
        .next()
        .unwrap_or_default();
    let q = s(&rule["metricsQuery"])
        .replace("<<.Series>>", &series)
        .replace("<<.GroupBy>>", "pod");
    q.replace("<<.LabelMatchers>>", r#"namespace="default",pod=~"a|b""#)
}

/// The adapter's rules query metrics the agent emits, and each HPA metric is one they serve.
fn example_problems(objs: &[(String, Value)], emitted: &BTreeSet<String>) -> Vec<String> {
    let (rules, mut p, mut served) = (adapter_rules(objs), vec![], BTreeSet::new());
    flag!(
        p,
        rules.is_empty(),
        "deploy/examples: no Prometheus Adapter rule"
    );
    for (at, rule) in &rules {
        let series = metric_names(s(&rule["seriesQuery"]));
        for (field, names) in [
            ("seriesQuery", &series),
            ("metricsQuery", &metric_names(&adapter_query(rule))),
        ] {
            flag!(p, names.is_empty(), "{at}: {field} names no metric");
            for n in names.iter().filter(|n| !emitted.contains(*n)) {
                p.push(format!(
                    "{at}: {field} metric {n} is not one the agent emits"
                ));
            }
        }
        served.extend(
            rule["name"]["as"]
                .as_str()
                .map(String::from)
                .or(series.into_iter().next()),
        );
    }
    let hpas: Vec<_> = objs
        .iter()
        .filter(|(_, o)| o["kind"] == "HorizontalPodAutoscaler")
        .collect();
    flag!(
        p,
        hpas.is_empty(),
        "deploy/examples: no HorizontalPodAutoscaler"
    );
    for (file, hpa) in hpas {
        for m in seq(&hpa["spec"]["metrics"]) {
            let name = s(&m[s(&m["type"]).to_ascii_lowercase().as_str()]["metric"]["name"]);
            let at = format!(
                "{file}: HorizontalPodAutoscaler {}",
                s(&hpa["metadata"]["name"])
            );
            flag!(
                p,
                !served.contains(name),
                "{at}: metric {name:?} is served by no adapter rule in deploy/examples"
            );
        }
    }
    p
}

#[test]
fn adapter_and_hpa_examples_use_metrics_the_agent_emits() {
    assert_none(example_problems(&examples(), &emitted_metric_names()));
}

// ---------------------------------------------------------------------------------------
// Each check above fails on a broken copy of the manifests.

/// A copy of a rendering with one object changed.
fn edited(name: &str, kind: &str, obj: &str, edit: impl FnOnce(&mut Value)) -> Rendered {
    render(name).edited(kind, obj, edit)
}

#[test]
fn namespace_check_catches_objects_without_their_namespace() {
    // What `kubectl kustomize deploy/overlays/prometheus-operator` rendered before the fix.
    let mut r = render("deploy/overlays/prometheus-operator").clone();
    for o in r
        .objs
        .iter_mut()
        .filter(|o| o["kind"] == "Service" || o["kind"] == "ServiceMonitor")
    {
        o["metadata"].as_mapping_mut().unwrap().remove("namespace");
    }
    let p = namespace_problems(&r);
    assert_found(
        &p,
        "Service gpu-agent-metrics: no metadata.namespace (must be gpu-agent)",
    );
    assert_found(&p, "ServiceMonitor gpu-agent: no metadata.namespace");
    let r = edited(
        "deploy/collector",
        "ClusterRoleBinding",
        "gpu-agent-otel-collector",
        |b| {
            b["subjects"][0]["namespace"] = "default".into();
        },
    );
    assert_found(
        &namespace_problems(&r),
        "subject ServiceAccount default/otel-collector",
    );
}

#[test]
fn port_check_catches_a_moved_metrics_addr_an_exposed_http_addr_and_lost_workload_labels() {
    let config = |from: &'static str, to: &'static str| {
        edited(
            "deploy/overlays/prometheus-operator",
            "ConfigMap",
            "gpu-agent-config",
            move |o| {
                o["data"]["config.toml"] = s(&o["data"]["config.toml"]).replace(from, to).into();
            },
        )
    };
    let p = port_problems(&config(":9464\"", ":9000\""));
    let from = "http.metrics_addr in /etc/gpu-agent/config.toml";
    assert_found(&p, &format!("no containerPort for {from} (0.0.0.0:9000)"));
    assert_found(
        &p,
        &format!("livenessProbe.httpGet is /healthz on port metrics, not /healthz on {from}"),
    );
    assert_found(
        &p,
        "endpoints[0].port http-metrics does not reach the agent's pods",
    );
    let p = port_problems(&config(
        "addr = \"127.0.0.1:9465\"",
        "addr = \"0.0.0.0:9465\"",
    ));
    assert_found(
        &p,
        "http.addr in /etc/gpu-agent/config.toml is 0.0.0.0:9465: it serves /debug/*",
    );
    assert_eq!(p.len(), 1, "{p:#?}");
    let p = port_problems(&config("metrics_addr = \"0.0.0.0:9464\"", ""));
    assert_found(&p, "the agent has no --metrics-addr or http.metrics_addr");
    let r = edited(
        "deploy/overlays/prometheus-operator",
        "ServiceMonitor",
        "gpu-agent",
        |o| {
            o["spec"]["endpoints"][0]["honorLabels"] = false.into();
        },
    );
    assert_found(&port_problems(&r), "endpoints[0].honorLabels must be true");
}

#[test]
fn privilege_check_catches_a_gpu_request_no_host_pid_a_writable_mount_missing_caps() {
    let r = edited("deploy/kubernetes", "DaemonSet", "gpu-agent", |ds| {
        let pod = &mut ds["spec"]["template"]["spec"];
        pod["hostPID"] = false.into();
        let c = &mut pod["containers"][0];
        c["resources"]["limits"]["nvidia.com/gpu"] = 1.into();
        c["volumeMounts"][1]["readOnly"] = false.into();
        c["securityContext"]["capabilities"]["add"] =
            serde_yaml::from_str("[PERFMON, DAC_READ_SEARCH, DAC_OVERRIDE, SYS_RESOURCE]").unwrap();
        let env = c["env"].as_sequence_mut().unwrap();
        env.retain(|e| e["name"] != "NVIDIA_VISIBLE_DEVICES");
        for e in env {
            if e["name"] == "NVIDIA_DRIVER_CAPABILITIES" {
                e["value"] = "compute".into();
            }
        }
    });
    let p = privilege_problems(&r);
    assert_found(&p, "hostPID must be true");
    assert_found(&p, "NVIDIA_VISIBLE_DEVICES is \"\", not \"all\"");
    assert_found(&p, "NVIDIA_DRIVER_CAPABILITIES \"compute\" lacks utility");
    assert_found(
        &p,
        "resources.limits.nvidia.com/gpu: the agent must never take a GPU",
    );
    assert_found(&p, "hostPath mount /sys/fs/cgroup must be readOnly");
    assert_found(&p, "lacks BPF (load the eBPF programs and maps)");
    assert_eq!(p.len(), 6, "{p:#?}");
}

#[test]
fn privilege_check_catches_root_escalation_sys_admin_and_caps_the_image_lacks() {
    let r = edited("deploy/kubernetes", "DaemonSet", "gpu-agent", |ds| {
        let sc = &mut ds["spec"]["template"]["spec"]["containers"][0]["securityContext"];
        sc["runAsUser"] = 0.into();
        sc["runAsNonRoot"] = false.into();
        sc.as_mapping_mut()
            .unwrap()
            .remove("allowPrivilegeEscalation");
        sc["capabilities"]["add"] = serde_yaml::from_str(
            "[BPF, PERFMON, DAC_READ_SEARCH, DAC_OVERRIDE, SYS_RESOURCE, NET_ADMIN]",
        )
        .unwrap();
    });
    let p = privilege_problems(&r);
    assert_found(
        &p,
        "securityContext runs as root (runAsUser 0, runAsNonRoot false)",
    );
    assert_found(&p, "allowPrivilegeEscalation must be false");
    assert_found(
        &p,
        "capabilities.add NET_ADMIN is not in deploy/Dockerfile's setcap",
    );
    assert_eq!(p.len(), 3, "{p:#?}");
    let r = edited("deploy/kubernetes", "DaemonSet", "gpu-agent", |ds| {
        let sc = &mut ds["spec"]["template"]["spec"]["containers"][0]["securityContext"];
        let add = sc["capabilities"]["add"].as_sequence_mut().unwrap();
        add.push("SYS_ADMIN".into());
    });
    let p = privilege_problems(&r);
    assert_found(&p, "allowPrivilegeEscalation: false with SYS_ADMIN");
    assert_found(
        &p,
        "SYS_ADMIN or AppArmor Unconfined outside components/tracefs-mount",
    );
    assert_eq!(p.len(), 2, "{p:#?}");
    // The component itself passes.
    assert_none(privilege_problems(render(
        "deploy/kubernetes + components/tracefs-mount",
    )));
}

#[test]
fn network_policy_check_catches_an_open_source_another_port_and_no_policy() {
    let r = edited("deploy/kubernetes", "NetworkPolicy", "gpu-agent", |np| {
        let rule = &mut np["spec"]["ingress"][0];
        rule.as_mapping_mut().unwrap().remove("from");
        rule["ports"][0]["port"] = 9465.into();
    });
    let p = network_policy_problems(&r);
    assert_found(
        &p,
        "NetworkPolicy gpu-agent: ingress[0] admits every namespace",
    );
    assert_found(&p, "ingress[0].ports must be the metrics port only (9464)");
    assert_eq!(p.len(), 2, "{p:#?}");
    let mut r = render("deploy/kubernetes").clone();
    r.objs.retain(|o| o["kind"] != "NetworkPolicy");
    assert_found(
        &network_policy_problems(&r),
        "no NetworkPolicy selects the agent's pods",
    );
}

#[test]
fn collector_check_catches_a_wrong_port_and_a_missing_association() {
    let agent_r = edited("deploy/kubernetes", "DaemonSet", "gpu-agent", |ds| {
        let env = ds["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_sequence_mut()
            .unwrap();
        let e = env
            .iter_mut()
            .find(|e| e["name"] == "OTEL_EXPORTER_OTLP_ENDPOINT")
            .unwrap();
        e["value"] = "http://$(HOST_IP):4317".into();
    });
    let p = collector_problems(&agent_r, render("deploy/collector"));
    assert_found(
        &p,
        "no otlp receiver's protocols.http.endpoint is on port 4317",
    );
    let col = edited(
        "deploy/collector",
        "ConfigMap",
        "otel-collector-config",
        |o| {
            o["data"]["config.yaml"] = s(&o["data"]["config.yaml"])
                .replace("name: container.id", "name: k8s.pod.ip")
                .into();
        },
    );
    let p = collector_problems(render("deploy/kubernetes"), &col);
    assert_found(&p, "pod_association has no resource_attribute container.id");
    assert_eq!(p.len(), 1, "{p:#?}");
}

#[test]
fn config_check_catches_a_key_the_agent_refuses() {
    let r = edited("deploy/kubernetes", "ConfigMap", "gpu-agent-config", |o| {
        o["data"]["config.toml"] = s(&o["data"]["config.toml"])
            .replace("interval_ms = 1000", "intervall_ms = 1000")
            .into();
    });
    let (ok, out) = check_config(&r, &no_secrets);
    assert!(!ok && out.contains("intervall_ms"), "{out}");
}

#[test]
fn metric_checks_catch_a_name_the_agent_does_not_emit() {
    let emitted = emitted_metric_names();
    assert!(
        emitted.contains("container_gpu_time_seconds_total")
            && emitted.contains("DCGM_FI_DEV_FB_USED")
    );
    let expr = r#"sum by (pod) (rate(container_gpu_seconds_total{pod=~"$pod", x="y{z"}[$__rate_interval]))"#;
    let d = json!({"panels": [{"id": 3, "title": "x", "targets": [{"refId": "A", "expr": expr}]}]});
    let p = dashboard_problems("d.json", &d, &emitted);
    assert_eq!(
        p,
        [
            r#"d.json: panel 3 "x" target "A": metric container_gpu_seconds_total is not one the agent emits"#
        ]
    );
    let mut objs = examples();
    for (_, o) in objs.iter_mut() {
        if let Some(t) = o["data"]["config.yaml"].as_str() {
            o["data"]["config.yaml"] = t
                .replace("'container_gpu_time_seconds_total{", "'container_gpu_time{")
                .into();
        } else if o["kind"] == "HorizontalPodAutoscaler" {
            o["spec"]["metrics"][0]["pods"]["metric"]["name"] = "pod_gpu_util".into();
        }
    }
    let p = example_problems(&objs, &emitted);
    assert_found(
        &p,
        "seriesQuery metric container_gpu_time is not one the agent emits",
    );
    assert_found(
        &p,
        r#"HorizontalPodAutoscaler inference: metric "pod_gpu_util" is served by no adapter rule"#,
    );
}

// ---------------------------------------------------------------------------------------
// Generic schemas: the standard tools

#[test]
fn kubernetes_validate_strict_passes_every_rendered_object_and_example() {
    let mut files: Vec<(String, Vec<&Value>)> = renders()
        .iter()
        .map(|r| (rel(&r.file), r.objs.iter().collect()))
        .collect();
    let examples = examples();
    for f in files_in(&root().join("deploy/examples"), "yaml") {
        let f = rel(&f);
        let objs = examples.iter().filter(|(e, _)| *e == f).map(|(_, o)| o);
        files.push((f.clone(), objs.collect()));
    }
    let dra = dra_examples();
    files.extend(
        dra.iter()
            .map(|(f, _, objs)| (f.clone(), objs.iter().collect())),
    );
    assert!(
        files
            .iter()
            .any(|(_, objs)| objs.iter().any(|o| uses_dra(o))),
        "no rendering or example claims devices through DRA: the 1.34 schemas check nothing"
    );
    assert_none(kubernetes_validate_problems(&files));
}

/// docs/rightsizing.md shows each DRA example as it is, in a yaml block (kubernetes-validate
/// checks the files, above; tests/tests/rightsize_plan.rs that their claims are what
/// `rightsize --emit` writes).
#[test]
fn the_dra_examples_are_in_rightsizing_md_as_they_are() {
    let doc = fs::read_to_string(root().join("docs/rightsizing.md")).unwrap();
    let blocks: Vec<&str> = doc
        .split("```yaml\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .collect();
    let mut p = vec![];
    for (file, text, objs) in dra_examples() {
        flag!(
            p,
            !blocks.contains(&text.as_str()),
            "docs/rightsizing.md has no yaml block that is {file} as it is"
        );
        flag!(
            p,
            !objs.iter().any(uses_dra),
            "{file}: no DRA object (resource.k8s.io/v1, or a pod with resourceClaims)"
        );
    }
    assert_none(p);
}

/// Grafana's variables replaced with values a query could get.
fn substitute(expr: &str, d: &Json) -> String {
    let mut vars = vec![
        ("__rate_interval".to_string(), "5m".to_string()),
        ("__range".into(), "1h".into()),
        ("__range_s".into(), "3600".into()),
    ];
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        let current = &v["current"]["value"];
        let value = match v["type"].as_str() {
            Some("query") => v["allValue"].as_str().unwrap_or(".*"),
            _ => current.as_str().or(current[0].as_str()).unwrap_or(""),
        };
        vars.push((
            v["name"].as_str().unwrap_or("").to_string(),
            value.to_string(),
        ));
    }
    vars.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
    let subst = |e: String, (k, v): (String, String)| {
        e.replace(&format!("${{{k}}}"), &v)
            .replace(&format!("${k}"), &v)
    };
    vars.into_iter().fold(expr.to_string(), subst)
}

/// promtool parses every PromQL expression of the dashboards and the adapter rules: the
/// metric-name checks above do not, and a missing parenthesis breaks a panel silently.
#[test]
fn promtool_parses_every_promql_expression() {
    let promtool = tool(
        "promtool",
        "apt-get install prometheus (`cargo xtask test` does when root)",
    );
    let mut exprs: Vec<(String, String)> = vec![];
    for (file, d) in dashboards() {
        exprs.extend(
            dashboard_exprs(&d)
                .into_iter()
                .map(|(what, e)| (format!("{file}: {what}"), substitute(&e, &d))),
        );
    }
    for (at, rule) in adapter_rules(&examples()) {
        exprs.push((
            format!("{at} seriesQuery"),
            s(&rule["seriesQuery"]).to_string(),
        ));
        exprs.push((format!("{at} metricsQuery"), adapter_query(&rule)));
    }
    assert!(exprs.len() > 20, "only {} expressions", exprs.len());
    let rules: Vec<Json> = exprs
        .iter()
        .enumerate()
        .map(|(i, (_, e))| json!({"record": format!("check:expr_{i}"), "expr": e}))
        .collect();
    let file = scratch("promql").join("rules.json");
    fs::write(
        &file,
        json!({"groups": [{"name": "deploy", "rules": rules}]}).to_string(),
    )
    .unwrap();
    let (ok, text) = run(Command::new(&promtool).args(["check", "rules"]).arg(&file));
    // promtool names each rule it cannot parse: `..., "check:expr_N": could not parse ...`.
    let mut p = vec![];
    for line in text.lines().filter(|l| l.contains("\"check:expr_")) {
        let i: usize = line
            .split("check:expr_")
            .nth(1)
            .and_then(|r| r.split('"').next()?.parse().ok())
            .unwrap();
        let msg = line.rsplit_once("\": ").map_or(line, |(_, m)| m);
        p.push(format!("{}: {msg}\n  expr: {}", exprs[i].0, exprs[i].1));
    }
    flag!(
        p,
        !ok && p.is_empty(),
        "promtool check rules {}: {text}",
        rel(&file)
    );
    assert_none(p);
}

/// tsc checks every dashboard against @grafana/schema (npm packages under target/): the
/// dashboard type, and each panel's options against its panel type's own schema.
#[test]
fn dashboards_satisfy_grafana_schema() {
    let npm = tool(
        "npm",
        "apt-get install nodejs npm (`cargo xtask test` does when root)",
    );
    let node = tool(
        "node",
        "apt-get install nodejs npm (`cargo xtask test` does when root)",
    );
    let dir = scratch("grafana");
    let version = |pkg: &str| {
        let text = fs::read_to_string(dir.join("node_modules").join(pkg).join("package.json"))
            .unwrap_or_default();
        serde_json::from_str::<Json>(&text)
            .ok()
            .map(|v| v["version"].clone())
    };
    if version("typescript") != Some(json!(TYPESCRIPT))
        || version("@grafana/schema") != Some(json!(GRAFANA_SCHEMA))
    {
        let deps = json!({"typescript": TYPESCRIPT, "@grafana/schema": GRAFANA_SCHEMA});
        fs::write(
            dir.join("package.json"),
            json!({"private": true, "dependencies": deps}).to_string(),
        )
        .unwrap();
        let (ok, text) = run(Command::new(&npm)
            .args(["install", "--no-audit", "--no-fund"])
            .current_dir(&dir));
        assert!(
            ok,
            "npm install typescript@{TYPESCRIPT} @grafana/schema@{GRAFANA_SCHEMA} in {}: {text}",
            rel(&dir)
        );
    }
    fs::write(
        dir.join("grafana-schema.ts"),
        include_str!("deploy/grafana-schema.ts"),
    )
    .unwrap();
    let options = json!({
        "strict": true, "noEmit": true, "module": "nodenext", "moduleResolution": "nodenext",
        "target": "es2022", "skipLibCheck": true, "types": []
    });
    let tsconfig = json!({"compilerOptions": options, "files": ["dashboard.ts"]});
    fs::write(dir.join("tsconfig.json"), tsconfig.to_string()).unwrap();
    let mut p = vec![];
    for f in files_in(&root().join("deploy/grafana"), "json") {
        // The JSON starts on the first line: tsc's line numbers are the file's.
        let json = fs::read_to_string(&f).unwrap();
        let import = "import type { Dashboard } from './grafana-schema.js';";
        let ts = format!(
            "{import} export const d = {} satisfies Dashboard;\n",
            json.trim_end()
        );
        fs::write(dir.join("dashboard.ts"), ts).unwrap();
        let (ok, text) = run(Command::new(&node)
            .args(["node_modules/typescript/bin/tsc", "-p", "."])
            .current_dir(&dir));
        flag!(
            p,
            !ok,
            "{} against @grafana/schema {GRAFANA_SCHEMA}:\n{}",
            rel(&f),
            text.replace("dashboard.ts(", &format!("{}(", rel(&f)))
        );
    }
    assert_none(p);
}
