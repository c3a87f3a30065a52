//! The Helm chart, deploy/helm/gpu-agent, as Helm v4 renders it: helm-python-sdk's libhelm
//! (no helm binary, no cluster), driven by tests/tests/helm/chart.py with the python3 on PATH
//! (`cargo xtask test` puts its venv first). The chart is rendered with its defaults, with
//! each switch on alone, and with all of them on; every render is linted (--strict),
//! validated by kubernetes-validate, and put through the same gpu-agent checks as the
//! kustomizations (tests/src/manifests/). The default render must be the kustomize base,
//! field by field; the chart's rules and dashboard must be deploy/'s files, byte for byte;
//! bad values must be refused at install time, naming the key. docs/deploy.md, "What CI
//! checks".
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
};

use serde_json::{json, Value as Json};
use serde_yaml::Value;
use tests::{flag, manifests::*};

const CHART: &str = "deploy/helm/gpu-agent";
const RELEASE: &str = "gpu-agent";
const NAMESPACE: &str = "gpu-agent";
/// The oldest Kubernetes the chart supports (its kubeVersion), for lint.
const KUBE_VERSION: &str = "v1.30.0";
const HELM_SDK: &str = "helm-python-sdk==0.2.2";

const TLS_SECRET: &str = "gpu-agent-metrics-tls";
const TOKEN_SECRET: &str = "gpu-agent-metrics-token";
const OTLP_SECRET: &str = "gpu-agent-otlp";
const COUNTERS_CSV: &str = "# DCGM FIELD, Prometheus metric type, help message\n\
    DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n\
    DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).\n";

const OVERRIDDEN_NAMESPACE: &str = "monitoring";
static SERVICE_ANNOTATIONS: std::sync::LazyLock<Json> = std::sync::LazyLock::new(
    || json!({"prometheus.io/scrape": "true", "prometheus.io/port": "9464"}),
);

/// One set of values the chart is rendered with.
struct Variant {
    name: &'static str,
    values: Json,
    /// Objects this render has beyond the default's (`+Kind/name`) or lacks (`-Kind/name`).
    objects: Vec<&'static str>,
    /// Problems the gpu-agent checks must find in it (a protection switched off on
    /// purpose), and no others.
    expected: &'static [&'static str],
}

/// Each switch on alone (or, for what is on by default, off alone).
fn switches() -> Vec<Variant> {
    let v = |name: &'static str,
             values: Json,
             objects: &[&'static str],
             expected: &'static [&'static str]| Variant {
        name,
        values,
        objects: objects.to_vec(),
        expected,
    };
    vec![
        v(
            "serviceMonitor.enabled",
            json!({"serviceMonitor": {"enabled": true, "labels": {"release": "prometheus"}}}),
            &["+Service/gpu-agent-metrics", "+ServiceMonitor/gpu-agent"],
            &[],
        ),
        v(
            "podMonitor.enabled",
            json!({"podMonitor": {"enabled": true}}),
            &["+PodMonitor/gpu-agent"],
            &[],
        ),
        v(
            "prometheusRule.enabled",
            json!({"prometheusRule": {"enabled": true}}),
            &["+PrometheusRule/gpu-agent"],
            &[],
        ),
        v(
            "grafanaDashboard.enabled",
            json!({"grafanaDashboard": {"enabled": true, "annotations": {"grafana_folder": "GPU"}}}),
            &["+ConfigMap/gpu-agent-dashboards"],
            &[],
        ),
        v(
            "tracefsMount.enabled",
            json!({"tracefsMount": {"enabled": true}}),
            &[],
            &[],
        ),
        v(
            "privileged.enabled",
            json!({"privileged": {"enabled": true}}),
            &[],
            &[],
        ),
        v("dcgm.compat", json!({"dcgm": {"compat": "dcgm"}}), &[], &[]),
        v(
            "dcgm.compat=dcgm-virtual-gpus",
            json!({"dcgm": {"compat": "dcgm-virtual-gpus"}}),
            &[],
            &[],
        ),
        v(
            "dcgm.counters.enabled",
            json!({"dcgm": {"counters": {"enabled": true, "csv": COUNTERS_CSV}}}),
            &["+ConfigMap/gpu-agent-dcgm-counters"],
            &[],
        ),
        v(
            "metrics.tls.enabled",
            json!({"metrics": {"tls": {"enabled": true, "existingSecret": TLS_SECRET,
                "clientAuthType": "RequireAndVerifyClientCert"}}}),
            &[],
            &[],
        ),
        v(
            "metrics.auth.bearerToken",
            json!({"metrics": {"auth": {"bearerToken": {"existingSecret": TOKEN_SECRET}}}}),
            &[],
            &[],
        ),
        v(
            "otlp.existingSecret",
            json!({"otlp": {"existingSecret": OTLP_SECRET, "endpointKey": "endpoint",
                "headersKey": "headers"}}),
            &[],
            &[],
        ),
        v(
            "service.enabled",
            json!({"service": {"enabled": true, "annotations": SERVICE_ANNOTATIONS.clone()}}),
            &["+Service/gpu-agent-metrics"],
            &[],
        ),
        v(
            "dra.adminAccess.enabled",
            json!({"dra": {"adminAccess": {"enabled": true}}}),
            &["+ResourceClaimTemplate/gpu-agent-admin-access"],
            &[],
        ),
        v(
            "namespaceOverride",
            json!({"namespaceOverride": OVERRIDDEN_NAMESPACE}),
            &[],
            &[],
        ),
        v(
            "criticalPodsQuota.enabled=false",
            json!({"criticalPodsQuota": {"enabled": false}}),
            &["-ResourceQuota/gpu-agent-critical-pods"],
            &[],
        ),
        v(
            "serviceAccount.create=false",
            json!({"serviceAccount": {"create": false}}),
            &["-ServiceAccount/gpu-agent"],
            &[],
        ),
        v(
            "networkPolicy.enabled=false",
            json!({"networkPolicy": {"enabled": false}}),
            &["-NetworkPolicy/gpu-agent"],
            &["no NetworkPolicy selects the agent's pods"],
        ),
    ]
}

/// `b` merged into `a`, maps key by key, as Helm merges values.
fn merge(a: &mut Json, b: &Json) {
    match (a, b) {
        (Json::Object(a), Json::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(Json::Null), v);
            }
        }
        (a, b) => *a = b.clone(),
    }
}

/// Values that reach the pod and objects as given: extra environment, volumes and mounts,
/// affinity, pod annotations, pull secrets, an image digest and a global registry, keys of
/// the container's securityContext and probes, a dashboard label of the user's.
fn pod_extras() -> Json {
    json!({
        "extraEnv": [{"name": "RUST_BACKTRACE", "value": "1"}],
        "extraVolumes": [{"name": "scratch", "emptyDir": {}}],
        "extraVolumeMounts": [{"name": "scratch", "mountPath": "/var/tmp/gpu-agent"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu-pool",
                "operator": "In", "values": ["a100", "h100"]}]}]}}},
        "podAnnotations": {"example.com/team": "ml-platform"},
        "image": {"pullSecrets": [{"name": "regcred"}], "digest": IMAGE_DIGEST},
        "global": {"imageRegistry": "registry.example.com:5000"},
        "securityContext": {"seLinuxOptions": {"type": "spc_t"}},
        "readinessProbe": {"periodSeconds": 30},
        "livenessProbe": {"timeoutSeconds": null, "failureThreshold": 6},
        "grafanaDashboard": {"enabled": true, "label": "example.com/dashboard",
            "labelValue": "gpu"},
    })
}

const IMAGE_DIGEST: &str =
    "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// Helm merges a user's map with the default's: the NetworkPolicy's namespace selector with
/// labels of one's own, with and without the default's label dropped (set to null).
fn selector(drop_default: bool) -> Json {
    let mut labels = json!({"team": "obs"});
    if drop_default {
        labels["kubernetes.io/metadata.name"] = Json::Null;
    }
    json!({"networkPolicy": {"namespaceSelector": {"matchLabels": labels}}})
}

/// The default, each switch alone, all on (unprivileged, with tracefsMount), all on
/// privileged, and the values of [`pod_extras`] and [`selector`].
fn variants() -> Vec<Variant> {
    let switches = switches();
    let mut all = json!({});
    let mut objects: Vec<&'static str> = vec![];
    // A switch that turns something off or picks another value is not "on".
    let on = |s: &&Variant| s.expected.is_empty() && !s.name.contains('=');
    for s in switches.iter().filter(on) {
        if s.name != "privileged.enabled" {
            merge(&mut all, &s.values);
            objects.extend(&s.objects);
        }
    }
    let mut privileged = all.clone();
    merge(&mut privileged, &json!({"privileged": {"enabled": true}}));
    let mut out = vec![Variant {
        name: "default",
        values: json!({}),
        objects: vec![],
        expected: &[],
    }];
    out.extend(switches);
    out.push(Variant {
        name: "all on",
        values: all,
        objects: objects.clone(),
        expected: &[],
    });
    out.push(Variant {
        name: "all on, privileged",
        values: privileged,
        objects,
        expected: &[],
    });
    out.push(Variant {
        name: "pod extras",
        values: pod_extras(),
        objects: vec!["+ConfigMap/gpu-agent-dashboards"],
        expected: &[],
    });
    for (name, drop_default) in [
        ("namespaceSelector, the default dropped", true),
        ("namespaceSelector, merged with the default", false),
    ] {
        out.push(Variant {
            name,
            values: selector(drop_default),
            objects: vec![],
            expected: &[],
        });
    }
    out
}

/// Values the chart must refuse: (what, values, where the refusal is, what it must say).
/// By the schema unless `Template`: then by the templates, with `fail`.
#[derive(Clone, Copy, PartialEq)]
enum By {
    Schema,
    Template,
}

fn refused() -> Vec<(&'static str, Json, By, &'static str)> {
    use By::*;
    vec![
        (
            "a string for an integer key",
            json!({"config": {"nvml": {"interval_ms": "fast"}}}),
            Schema,
            "/config/nvml/interval_ms",
        ),
        (
            "an unknown key in a config table",
            json!({"config": {"nvml": {"intervall_ms": 1000}}}),
            Schema,
            "intervall_ms",
        ),
        (
            "an unknown config table",
            json!({"config": {"nvmll": {"enabled": true}}}),
            Schema,
            "nvmll",
        ),
        (
            "an unknown nested config table",
            json!({"config": {"http": {"tsl": {"cert_file": "/a"}}}}),
            Schema,
            "tsl",
        ),
        (
            "a config value below the key's range",
            json!({"config": {"nvml": {"interval_ms": 1}}}),
            Schema,
            "/config/nvml/interval_ms",
        ),
        (
            "a config value the key does not take",
            json!({"config": {"otlp": {"protocol": "http/json"}}}),
            Schema,
            "/config/otlp/protocol",
        ),
        (
            "a list for a table of strings",
            json!({"config": {"otlp": {"headers": ["x-api-key=secret"]}}}),
            Schema,
            "/config/otlp/headers",
        ),
        (
            "a misspelt switch",
            json!({"serviceMonitr": {"enabled": true}}),
            Schema,
            "serviceMonitr",
        ),
        (
            "a string for a switch",
            json!({"serviceMonitor": {"enabled": "yes"}}),
            Schema,
            "/serviceMonitor/enabled",
        ),
        (
            "a GPU for the agent",
            json!({"resources": {"limits": {"nvidia.com/gpu": 1}}}),
            Schema,
            "/resources/limits/nvidia.com~1gpu",
        ),
        (
            "TLS without its Secret",
            json!({"metrics": {"tls": {"enabled": true}}}),
            Schema,
            "/metrics/tls/existingSecret",
        ),
        (
            "an unknown dcgm layout",
            json!({"dcgm": {"compat": "dcgm-exporter"}}),
            Schema,
            "/dcgm/compat",
        ),
        (
            "an unknown update strategy",
            json!({"updateStrategy": {"type": "Recreate"}}),
            Schema,
            "/updateStrategy/type",
        ),
        (
            "an unknown Service type",
            json!({"service": {"type": "ExternalName"}}),
            Schema,
            "/service/type",
        ),
        (
            "an admin-access claim without a device class",
            json!({"dra": {"adminAccess": {"enabled": true, "deviceClassName": ""}}}),
            Schema,
            "/dra/adminAccess/deviceClassName",
        ),
        (
            "a namespace Kubernetes refuses",
            json!({"namespaceOverride": "GPU_Agent"}),
            Schema,
            "/namespaceOverride",
        ),
        (
            "no metrics address",
            json!({"config": {"http": {"metrics_addr": null}}}),
            Template,
            "config.http.metrics_addr is required",
        ),
        (
            "TLS set twice",
            json!({"metrics": {"tls": {"enabled": true, "existingSecret": TLS_SECRET}},
                "config": {"http": {"tls": {"cert_file": "/a", "key_file": "/b"}}}}),
            Template,
            "metrics.tls.enabled and config.http.tls both set TLS",
        ),
    ]
}

// ---------------------------------------------------------------------------------------
// Rendering

struct Helm {
    /// By variant: {"manifests": {template: YAML} | null, "render_error", "lint"}.
    variants: BTreeMap<String, Json>,
    /// By name: {"schema_error", "render_error"}.
    refused: BTreeMap<String, Json>,
    /// Each variant's render, as the gpu-agent checks read it.
    renders: Vec<Rendered>,
}

/// Every variant and refused set through chart.py, once per test binary.
fn helm() -> &'static Helm {
    static HELM: OnceLock<Helm> = OnceLock::new();
    HELM.get_or_init(|| {
        let how = format!(
            "pip install {HELM_SDK} (`cargo xtask test` installs it into a venv under target/ \
             and puts the venv first on PATH; `eval \"$(cargo xtask test-tools)\"` does the \
             same for a direct `cargo test`)"
        );
        let python = tool("python3", &how);
        let variants = variants();
        let request = json!({
            "chart": root().join(CHART),
            "release": RELEASE,
            "namespace": NAMESPACE,
            "kube_version": KUBE_VERSION,
            "variants": variants.iter().map(|v| json!({"name": v.name, "values": v.values}))
                .collect::<Vec<_>>(),
            "refused": refused().iter().map(|(name, values, _, _)| json!({"name": name, "values": values}))
                .collect::<Vec<_>>(),
        });
        let script = root().join("tests/tests/helm/chart.py");
        let mut child = Command::new(&python)
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
        child
            .stdin
            .take()
            .unwrap()
            .write_all(request.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("No module named 'helm_python'"),
            "{} cannot import helm_python: {how}",
            python.display()
        );
        assert!(
            out.status.success(),
            "{} {}: {err}",
            python.display(),
            rel(&script)
        );
        let answer: Json = serde_json::from_slice(&out.stdout).expect("chart.py's JSON");
        let map = |k: &str| -> BTreeMap<String, Json> {
            serde_json::from_value(answer[k].clone()).unwrap()
        };
        let (variant_out, refused) = (map("variants"), map("refused"));
        let dir = scratch("helm/rendered");
        let renders = variants
            .iter()
            .filter_map(|v| {
                let manifests = variant_out[v.name]["manifests"].as_object()?;
                Some(rendered(v, manifests, &dir))
            })
            .collect();
        Helm {
            variants: variant_out,
            refused,
            renders,
        }
    })
}

/// A variant's manifests as one file (NOTES.txt left out) and its objects.
fn rendered(v: &Variant, manifests: &serde_json::Map<String, Json>, dir: &Path) -> Rendered {
    let mut text = String::new();
    for (template, yaml) in manifests {
        let yaml = yaml.as_str().unwrap_or("");
        if template.ends_with("NOTES.txt") || yaml.trim().is_empty() {
            continue;
        }
        text.push_str(&format!("---\n# Source: {template}\n{yaml}\n"));
    }
    let name = format!("{CHART} ({})", v.name);
    let file = dir.join(format!(
        "{}.yaml",
        v.name.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    ));
    fs::write(&file, &text).unwrap();
    Rendered {
        objs: yaml_docs(&text, &name),
        name,
        file,
        namespace: Some(
            v.values["namespaceOverride"]
                .as_str()
                .unwrap_or(NAMESPACE)
                .into(),
        ),
        tracefs_mount: v.values["tracefsMount"]["enabled"] == true,
    }
}

fn variant(name: &str) -> &'static Rendered {
    let r = helm()
        .renders
        .iter()
        .find(|r| r.name == format!("{CHART} ({name})"));
    r.unwrap_or_else(|| panic!("{CHART} ({name}) did not render: {}", render_error(name)))
}

fn render_error(name: &str) -> String {
    helm().variants[name]["render_error"].to_string()
}

/// What a test Secret holds: a certificate and key made by openssl (the certificate is its
/// own CA), a token, an OTLP endpoint and headers.
fn secret_data(name: &str, key: &str) -> Option<Vec<u8>> {
    let read = |f: &str| fs::read(certificate().join(f)).ok();
    match (name, key) {
        (TLS_SECRET, "tls.crt" | "ca.crt") => read("tls.crt"),
        (TLS_SECRET, "tls.key") => read("tls.key"),
        (TOKEN_SECRET, "token") => Some(b"helm-test-token".to_vec()),
        (OTLP_SECRET, "endpoint") => Some(b"https://collector.example:4318".to_vec()),
        (OTLP_SECRET, "headers") => Some(b"x-api-key=helm-test".to_vec()),
        _ => None,
    }
}

/// A self-signed EC certificate for the agent's metrics address, made once.
fn certificate() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch("helm/tls");
        let openssl = tool(
            "openssl",
            "apt-get install openssl (`cargo xtask test` does when root)",
        );
        let (ok, text) = run(Command::new(openssl)
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=gpu-agent",
                "-addext",
                "subjectAltName=DNS:gpu-agent",
                "-keyout",
                "tls.key",
                "-out",
                "tls.crt",
            ])
            .current_dir(&dir));
        assert!(ok, "openssl req: {text}");
        dir
    })
}

/// (kind/name) of every object of a render.
fn object_names(r: &Rendered) -> BTreeSet<String> {
    r.objs
        .iter()
        .map(|o| format!("{}/{}", s(&o["kind"]), s(&o["metadata"]["name"])))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Helm's own checks

#[test]
fn every_variant_renders_and_lints_clean_and_has_the_objects_its_switch_promises() {
    let h = helm();
    let default = object_names(variant("default"));
    let want = BTreeSet::from(
        [
            "ConfigMap/gpu-agent-config",
            "DaemonSet/gpu-agent",
            "NetworkPolicy/gpu-agent",
            "ResourceQuota/gpu-agent-critical-pods",
            "ServiceAccount/gpu-agent",
        ]
        .map(String::from),
    );
    assert_eq!(default, want, "the default render");
    let mut p = vec![];
    for v in variants() {
        let out = &h.variants[v.name];
        if !out["render_error"].is_null() {
            p.push(format!(
                "{} does not render: {}",
                v.name, out["render_error"]
            ));
            continue;
        }
        // Severity 1 is INFO ("icon is recommended"); 2 WARNING and 3 ERROR fail --strict.
        let lint = &out["lint"];
        for m in lint["messages"].as_array().into_iter().flatten() {
            flag!(
                p,
                m["severity"].as_u64() != Some(1),
                "helm lint --strict ({}): {} {}",
                v.name,
                m["path"],
                m["error"]
            );
        }
        for e in lint["errors"].as_array().into_iter().flatten() {
            p.push(format!("helm lint --strict ({}): {e}", v.name));
        }
        let mut want = default.clone();
        for o in &v.objects {
            let (sign, name) = o.split_at(1);
            match sign {
                "+" => want.insert(name.to_string()),
                _ => want.remove(name),
            };
        }
        let got = object_names(variant(v.name));
        flag!(
            p,
            got != want,
            "{}: objects {:?}, not {:?}",
            v.name,
            got.symmetric_difference(&want).collect::<Vec<_>>(),
            v.objects
        );
    }
    assert_none(p);
}

#[test]
fn the_pods_extras_reach_the_daemonset_and_the_dashboards_configmap() {
    let r = variant("pod extras");
    let want = serde_yaml::to_value(pod_extras()).unwrap();
    let (_, pod, c) = agent(r).expect("the gpu-agent DaemonSet");
    let mut p = vec![];
    let has = |list: &Value, item: &Value| seq(list).contains(item);
    flag!(
        p,
        !has(&c["env"], &want["extraEnv"][0]),
        "env lacks {:?}",
        want["extraEnv"][0]
    );
    flag!(
        p,
        !has(&pod["volumes"], &want["extraVolumes"][0]),
        "volumes lack {:?}",
        want["extraVolumes"][0]
    );
    flag!(
        p,
        !has(&c["volumeMounts"], &want["extraVolumeMounts"][0]),
        "volumeMounts lack {:?}",
        want["extraVolumeMounts"][0]
    );
    flag!(
        p,
        pod["affinity"] != want["affinity"],
        "affinity {:?}",
        pod["affinity"]
    );
    let ds = object(r, "DaemonSet", "gpu-agent");
    let annotations = &ds["spec"]["template"]["metadata"]["annotations"];
    flag!(
        p,
        annotations["example.com/team"] != "ml-platform",
        "pod annotations {annotations:?}"
    );
    flag!(
        p,
        pod["imagePullSecrets"] != want["image"]["pullSecrets"],
        "imagePullSecrets {:?}",
        pod["imagePullSecrets"]
    );
    let image = format!("registry.example.com:5000/example/gpu-agent@{IMAGE_DIGEST}");
    flag!(
        p,
        c["image"] != image.as_str(),
        "image {:?}, not {image}",
        c["image"]
    );
    // Each key given replaces the chart's; the others stay.
    let sc = &c["securityContext"];
    flag!(
        p,
        sc["seLinuxOptions"] != want["securityContext"]["seLinuxOptions"]
            || sc["runAsUser"] != 65534
            || sc["readOnlyRootFilesystem"] != true,
        "securityContext {sc:?}"
    );
    let (ready, live) = (&c["readinessProbe"], &c["livenessProbe"]);
    flag!(
        p,
        ready["periodSeconds"] != 30 || ready["httpGet"]["path"] != "/readyz",
        "readinessProbe {ready:?}"
    );
    flag!(
        p,
        !live["timeoutSeconds"].is_null()
            || live["failureThreshold"] != 6
            || live["periodSeconds"] != 20,
        "livenessProbe {live:?}"
    );
    let labels = &object(r, "ConfigMap", "gpu-agent-dashboards")["metadata"]["labels"];
    flag!(
        p,
        labels["example.com/dashboard"] != "gpu" || !labels["grafana_dashboard"].is_null(),
        "the dashboards' ConfigMap's labels {labels:?}"
    );
    assert_none(p);
}

/// service.enabled makes the Service alone, with its annotations, headless on the metrics
/// port; namespaceOverride moves every namespaced object (namespace_problems checks each
/// against it) and leaves the release's namespace empty.
#[test]
fn the_service_and_namespace_override_render_as_their_values_say() {
    let r = variant("service.enabled");
    let svc = object(r, "Service", "gpu-agent-metrics");
    let mut p = vec![];
    let annotations = serde_yaml::to_value(&*SERVICE_ANNOTATIONS).unwrap();
    flag!(
        p,
        svc["metadata"]["annotations"] != annotations,
        "annotations {:?}",
        svc["metadata"]["annotations"]
    );
    flag!(
        p,
        svc["spec"]["type"] != "ClusterIP"
            || svc["spec"]["clusterIP"] != "None"
            || svc["spec"]["ports"][0]["targetPort"] != "metrics",
        "spec {:?}",
        svc["spec"]
    );
    flag!(
        p,
        r.of_kind("ServiceMonitor").next().is_some(),
        "a ServiceMonitor without serviceMonitor.enabled"
    );
    let moved = variant("namespaceOverride");
    let namespaces: BTreeSet<&str> = moved
        .objs
        .iter()
        .map(|o| s(&o["metadata"]["namespace"]))
        .collect();
    flag!(
        p,
        namespaces != BTreeSet::from([OVERRIDDEN_NAMESPACE]),
        "namespaceOverride: the objects' namespaces are {namespaces:?}"
    );
    assert_none(p);
}

/// dra.adminAccess.enabled: the pod claims every gpu.nvidia.com device of its node through
/// the template, with admin access, and the container uses the claim; the privilege check
/// refuses a claim without admin access, or one whose template is not rendered.
#[test]
fn the_admin_access_claim_reaches_the_pod_and_the_check_refuses_one_without_it() {
    let r = variant("dra.adminAccess.enabled");
    let (_, pod, c) = agent(r).expect("the gpu-agent DaemonSet");
    let claim = &seq(&pod["resourceClaims"])[0];
    assert_eq!(
        s(&claim["resourceClaimTemplateName"]),
        "gpu-agent-admin-access"
    );
    let used: Vec<&str> = seq(&c["resources"]["claims"])
        .iter()
        .map(|u| s(&u["name"]))
        .collect();
    assert_eq!(used, [s(&claim["name"])]);
    let template = object(r, "ResourceClaimTemplate", "gpu-agent-admin-access");
    let exactly = &template["spec"]["spec"]["devices"]["requests"][0]["exactly"];
    assert_eq!(
        (
            s(&exactly["deviceClassName"]),
            s(&exactly["allocationMode"]),
            &exactly["adminAccess"]
        ),
        ("gpu.nvidia.com", "All", &Value::Bool(true))
    );
    assert!(
        privilege_problems(r).is_empty(),
        "{:#?}",
        privilege_problems(r)
    );
    let taken = r.edited("ResourceClaimTemplate", "gpu-agent-admin-access", |t| {
        t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] = false.into();
    });
    assert_found(
        &privilege_problems(&taken),
        "request gpus lacks exactly.adminAccess: true",
    );
    let mut missing = r.clone();
    missing
        .objs
        .retain(|o| o["kind"] != "ResourceClaimTemplate");
    assert_found(
        &privilege_problems(&missing),
        "its ResourceClaimTemplate or ResourceClaim is not in this rendering",
    );
}

#[test]
fn a_namespace_selector_of_ones_own_replaces_the_default_only_with_its_key_set_to_null() {
    let from = |name: &str| {
        let np = object(variant(name), "NetworkPolicy", "gpu-agent");
        np["spec"]["ingress"][0]["from"][0]["namespaceSelector"].clone()
    };
    let selector = |labels: Json| serde_yaml::to_value(json!({"matchLabels": labels})).unwrap();
    assert_eq!(
        from("namespaceSelector, the default dropped"),
        selector(json!({"team": "obs"})),
    );
    // Without the null, Helm merges the two maps: both labels must match.
    assert_eq!(
        from("namespaceSelector, merged with the default"),
        selector(json!({"kubernetes.io/metadata.name": "monitoring", "team": "obs"})),
    );
}

#[test]
fn kubernetes_validate_strict_passes_every_render() {
    let renders = &helm().renders;
    assert_eq!(renders.len(), variants().len(), "every variant rendered");
    let files: Vec<(String, Vec<&Value>)> = renders
        .iter()
        .map(|r| (rel(&r.file), r.objs.iter().collect()))
        .collect();
    assert_none(kubernetes_validate_problems(&files));
}

#[test]
fn the_schema_and_the_templates_refuse_bad_values_naming_the_key() {
    let h = helm();
    let mut p = vec![];
    for (what, values, by, needle) in refused() {
        let out = &h.refused[what];
        let (schema, render) = (&out["schema_error"], &out["render_error"]);
        let render_text = render.as_str().unwrap_or("");
        flag!(
            p,
            render.is_null(),
            "{what} ({values}): the chart renders it"
        );
        match by {
            By::Schema => {
                let text = schema.as_str().unwrap_or("");
                flag!(
                    p,
                    !text.contains(needle) || !render_text.contains(needle),
                    "{what} ({values}): the schema's refusal does not name {needle:?}: \
                     validate_schema: {schema}; render: {render}"
                );
            }
            By::Template => flag!(
                p,
                !render_text.contains(needle),
                "{what} ({values}): the render's refusal does not say {needle:?}: {render}"
            ),
        }
    }
    assert_none(p);
}

#[test]
fn the_chart_version_is_the_workspace_version() {
    let text = fs::read_to_string(root().join(CHART).join("Chart.yaml")).unwrap();
    let chart: Value = serde_yaml::from_str(&text).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(s(&chart["version"]), version, "Chart.yaml version");
    assert_eq!(s(&chart["appVersion"]), version, "Chart.yaml appVersion");
}

// ---------------------------------------------------------------------------------------
// The gpu-agent checks, on every render

#[test]
fn every_render_passes_the_gpu_agent_checks() {
    let checks: [fn(&Rendered) -> Vec<String>; 4] = [
        namespace_problems,
        port_problems,
        network_policy_problems,
        privilege_problems,
    ];
    let collector = render("deploy/collector");
    let mut p = vec![];
    for v in variants() {
        let r = variant(v.name);
        let mut found: Vec<String> = checks.iter().flat_map(|c| c(r)).collect();
        // The Collector receives what the agent sends, where the endpoint is in the manifest.
        let (_, _, c) = agent(r).expect("the gpu-agent DaemonSet");
        let endpoint = seq(&c["env"])
            .iter()
            .find(|e| e["name"] == "OTEL_EXPORTER_OTLP_ENDPOINT");
        if endpoint.is_some_and(|e| e["value"].is_string()) {
            found.extend(collector_problems(r, collector));
        }
        for want in v.expected {
            flag!(
                p,
                !found.iter().any(|f| f.contains(want)),
                "{}: no problem says {want:?}",
                r.name
            );
        }
        p.extend(
            found
                .into_iter()
                .filter(|f| !v.expected.iter().any(|w| f.contains(w))),
        );
    }
    assert_none(p);
}

#[test]
fn the_agent_accepts_every_rendered_config_environment_and_mounted_file() {
    let mut p = vec![];
    for r in &helm().renders {
        let (ok, out) = check_config(r, &secret_data);
        flag!(p, !ok, "{out}");
    }
    assert_none(p);
}

#[test]
fn the_checks_catch_a_broken_pod_monitor_and_a_counters_csv_the_agent_refuses() {
    let r = variant("podMonitor.enabled").edited("PodMonitor", "gpu-agent", |pm| {
        let ep = &mut pm["spec"]["podMetricsEndpoints"][0];
        ep["port"] = "http-metrics".into();
        ep["honorLabels"] = false.into();
    });
    let p = port_problems(&r);
    assert_found(&p, "podMetricsEndpoints[0].honorLabels must be true");
    assert_found(
        &p,
        "podMetricsEndpoints[0].port http-metrics is not the name of the container port",
    );
    assert_eq!(p.len(), 2, "{p:#?}");
    let r = variant("podMonitor.enabled").edited("PodMonitor", "gpu-agent", |pm| {
        pm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] = "other".into();
    });
    assert_found(
        &port_problems(&r),
        "spec.selector.matchLabels does not select the agent's pods",
    );
    let r = variant("dcgm.counters.enabled").edited("ConfigMap", "gpu-agent-dcgm-counters", |cm| {
        cm["data"]["counters.csv"] = "DCGM_FI_DEV_POWER_VIOLATION, counter, y\n".into();
    });
    let (ok, out) = check_config(&r, &secret_data);
    assert!(
        !ok && out.contains("gpu-agent does not serve DCGM_FI_DEV_POWER_VIOLATION"),
        "{out}"
    );
    let r = variant("metrics.tls.enabled");
    let (ok, out) = check_config(r, &|name, key| match key {
        "tls.key" => Some(b"not a key".to_vec()),
        _ => secret_data(name, key),
    });
    assert!(!ok && out.contains("tls.key"), "{out}");
}

// ---------------------------------------------------------------------------------------
// One source: the kustomize base, deploy/prometheus and deploy/grafana

/// Every scalar of a value by its path (`spec.template.spec.containers[0].image`).
fn flatten(v: &Value, at: &str, out: &mut BTreeMap<String, String>) {
    match v {
        Value::Mapping(m) => {
            for (k, v) in m {
                flatten(v, &format!("{at}.{}", s(k)), out);
            }
        }
        Value::Sequence(items) => {
            for (i, v) in items.iter().enumerate() {
                flatten(v, &format!("{at}[{i}]"), out);
            }
        }
        v => {
            out.insert(at.to_string(), scalar(v));
        }
    }
}

/// Where `chart` and `kustomize` differ, path by path, leaving out the paths in `ignore`.
fn differences(what: &str, kustomize: &Value, chart: &Value, ignore: &[String]) -> Vec<String> {
    let (mut k, mut c) = (BTreeMap::new(), BTreeMap::new());
    flatten(kustomize, what, &mut k);
    flatten(chart, what, &mut c);
    let paths: BTreeSet<&String> = k.keys().chain(c.keys()).collect();
    let none = "(none)".to_string();
    let mut p = vec![];
    for path in paths.into_iter().filter(|p| !ignore.contains(p)) {
        let (a, b) = (k.get(path).unwrap_or(&none), c.get(path).unwrap_or(&none));
        flag!(p, a != b, "{path}: kustomize {a}, chart {b}");
    }
    p
}

fn object<'a>(r: &'a Rendered, kind: &str, prefix: &str) -> &'a Value {
    let o = r
        .objs
        .iter()
        .find(|o| o["kind"] == kind && s(&o["metadata"]["name"]).starts_with(prefix));
    o.unwrap_or_else(|| panic!("{}: no {kind} {prefix}", r.name))
}

const INSTANCE: &str = "app.kubernetes.io/instance";

/// Where a kustomization's DaemonSet spec and a chart variant's differ, but for the release's
/// `instance` label, the chart's config checksum and kustomize's hashed ConfigMap name (the
/// two ways of rolling the pods when the config changes).
fn daemonset_differences(kustomization: &str, chart_variant: &str) -> Vec<String> {
    let mut k = object(render(kustomization), "DaemonSet", "gpu-agent")["spec"].clone();
    let volumes = k["template"]["spec"]["volumes"].as_sequence_mut().unwrap();
    let config = volumes.iter_mut().find(|v| v["name"] == "config").unwrap();
    let name = s(&config["configMap"]["name"]).to_string();
    assert!(name.starts_with("gpu-agent-config-"), "{name}");
    config["configMap"]["name"] = "gpu-agent-config".into();
    let c = &object(variant(chart_variant), "DaemonSet", "gpu-agent")["spec"];
    let ds = format!("DaemonSet.spec ({kustomization} against {chart_variant})");
    differences(
        &ds,
        &k,
        c,
        &[
            format!("{ds}.selector.matchLabels.{INSTANCE}"),
            format!("{ds}.template.metadata.labels.{INSTANCE}"),
            format!("{ds}.template.metadata.annotations.checksum/config"),
        ],
    )
}

/// The default render against the kustomize base, the tracefsMount and privileged switches
/// against their components, and the monitoring switches against the Prometheus overlay.
#[test]
fn the_chart_renders_the_kustomize_objects_field_by_field() {
    let (base, chart) = (render("deploy/kubernetes"), variant("default"));
    let mut p = daemonset_differences("deploy/kubernetes", "default");
    // The components as the chart's switches.
    for (component, switch) in [
        ("tracefs-mount", "tracefsMount.enabled"),
        ("privileged", "privileged.enabled"),
        ("dra-admin-access", "dra.adminAccess.enabled"),
    ] {
        let kustomization = format!("deploy/kubernetes + components/{component}");
        p.extend(daemonset_differences(&kustomization, switch));
    }
    let rct = "ResourceClaimTemplate.spec";
    p.extend(differences(
        rct,
        &object(
            render("deploy/kubernetes + components/dra-admin-access"),
            "ResourceClaimTemplate",
            "gpu-agent-admin-access",
        )["spec"],
        &object(
            variant("dra.adminAccess.enabled"),
            "ResourceClaimTemplate",
            "gpu-agent-admin-access",
        )["spec"],
        &[],
    ));
    let np = "NetworkPolicy.spec";
    p.extend(differences(
        np,
        &object(base, "NetworkPolicy", "gpu-agent")["spec"],
        &object(chart, "NetworkPolicy", "gpu-agent")["spec"],
        &[format!("{np}.podSelector.matchLabels.{INSTANCE}")],
    ));
    p.extend(differences(
        "ResourceQuota.spec",
        &object(base, "ResourceQuota", "gpu-agent")["spec"],
        &object(chart, "ResourceQuota", "gpu-agent")["spec"],
        &[],
    ));
    let sa = |r: &Rendered| {
        object(r, "ServiceAccount", "gpu-agent")["automountServiceAccountToken"].clone()
    };
    p.extend(differences(
        "ServiceAccount.automountServiceAccountToken",
        &sa(base),
        &sa(chart),
        &[],
    ));
    // The Prometheus component's objects against the chart's switches.
    let (overlay, all) = (
        render("deploy/overlays/prometheus-operator"),
        variant("all on"),
    );
    let sm = "ServiceMonitor.spec";
    p.extend(differences(
        sm,
        &object(overlay, "ServiceMonitor", "gpu-agent")["spec"],
        &object(
            variant("serviceMonitor.enabled"),
            "ServiceMonitor",
            "gpu-agent",
        )["spec"],
        &[
            format!("{sm}.selector.matchLabels.{INSTANCE}"),
            // The chart says the scheme (https with metrics.tls); kustomize leaves the default.
            format!("{sm}.endpoints[0].scheme"),
        ],
    ));
    let svc = "Service.spec";
    p.extend(differences(
        svc,
        &object(overlay, "Service", "gpu-agent-metrics")["spec"],
        &object(all, "Service", "gpu-agent-metrics")["spec"],
        &[format!("{svc}.selector.{INSTANCE}")],
    ));
    p.extend(differences(
        "PrometheusRule.spec",
        &object(overlay, "PrometheusRule", "gpu-agent")["spec"],
        &object(all, "PrometheusRule", "gpu-agent")["spec"],
        &[],
    ));
    assert_none(p);
}

#[test]
fn the_field_by_field_comparison_names_each_difference() {
    let yaml = |t: &str| -> Value { serde_yaml::from_str(t).unwrap() };
    let p = differences(
        "x",
        &yaml("{a: {b: 1, l: [p, q]}, d: 4}"),
        &yaml("{a: {b: 2, c: 3, l: [p]}, d: 4, e: 5}"),
        &["x.e".to_string()],
    );
    assert_eq!(
        p,
        [
            "x.a.b: kustomize 1, chart 2",
            "x.a.c: kustomize (none), chart 3",
            "x.a.l[1]: kustomize q, chart (none)",
        ]
    );
}

#[test]
fn the_default_config_is_deploy_kubernetes_config_toml() {
    let file = root().join("deploy/kubernetes/config.toml");
    let want: toml::Table = toml::from_str(&fs::read_to_string(&file).unwrap()).unwrap();
    let chart = variant("default");
    let (_, pod, c) = agent(chart).unwrap();
    let (path, got) = agent_config(chart, pod, c).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(path, "/etc/gpu-agent/config.toml");
    assert_eq!(
        got,
        want,
        "the chart's default config.toml against {}",
        rel(&file)
    );
}

/// The files of `dir` named *.ext, by name, but those named *.test.ext (promtool's unit tests).
fn sources(dir: &Path, ext: &str) -> BTreeMap<String, Vec<u8>> {
    files_in(dir, ext)
        .into_iter()
        .map(|f| (f.file_name().unwrap().to_string_lossy().into_owned(), f))
        .filter(|(n, _)| !n.ends_with(&format!(".test.{ext}")))
        .map(|(n, f)| (n, fs::read(f).unwrap()))
        .collect()
}

/// The chart keeps copies of deploy/prometheus's rules and deploy/grafana's dashboards (a
/// chart must be self-contained: Helm does not follow symlinks out of it): the copies are
/// the files byte for byte, and the rendered PrometheusRule and ConfigMap carry them.
#[test]
fn the_charts_rules_and_dashboards_are_deploys_files_byte_for_byte() {
    let chart = root().join(CHART);
    let mut p = vec![];
    for (from, to, ext) in [
        ("deploy/prometheus", "files/prometheus", "yaml"),
        ("deploy/grafana", "files/grafana", "json"),
    ] {
        let (want, got) = (
            sources(&root().join(from), ext),
            sources(&chart.join(to), ext),
        );
        assert!(!want.is_empty(), "no {from}/*.{ext}");
        for name in want.keys().chain(got.keys()).collect::<BTreeSet<_>>() {
            let fix = format!("cp {from}/{name} {CHART}/{to}/");
            match (want.get(name), got.get(name)) {
                (Some(a), Some(b)) => {
                    flag!(
                        p,
                        a != b,
                        "{CHART}/{to}/{name} differs from {from}/{name}: {fix}"
                    )
                }
                (Some(_), None) => p.push(format!("{CHART}/{to} lacks {name}: {fix}")),
                (None, _) => p.push(format!(
                    "{CHART}/{to}/{name} has no source in {from}: remove it"
                )),
            }
        }
    }
    let all = variant("all on");
    let mut groups = vec![];
    for (name, text) in sources(&root().join("deploy/prometheus"), "yaml") {
        let rules: Value = serde_yaml::from_slice(&text).unwrap();
        flag!(p, seq(&rules["groups"]).is_empty(), "{name}: no groups");
        groups.extend(seq(&rules["groups"]).iter().cloned());
    }
    flag!(
        p,
        object(all, "PrometheusRule", "gpu-agent")["spec"]["groups"] != Value::Sequence(groups),
        "the PrometheusRule's groups are not deploy/prometheus's"
    );
    let cm = object(all, "ConfigMap", "gpu-agent-dashboards");
    flag!(
        p,
        cm["metadata"]["labels"]["grafana_dashboard"] != "1",
        "the dashboards' ConfigMap lacks the sidecar's label grafana_dashboard: \"1\""
    );
    let dashboards = sources(&root().join("deploy/grafana"), "json");
    flag!(
        p,
        cm["data"].as_mapping().map(|m| m.len()) != Some(dashboards.len()),
        "the dashboards' ConfigMap does not hold exactly deploy/grafana's dashboards"
    );
    for (name, text) in dashboards {
        flag!(
            p,
            cm["data"][name.as_str()].as_str().map(str::as_bytes) != Some(&text[..]),
            "the dashboards' ConfigMap's {name} is not deploy/grafana/{name}"
        );
    }
    assert_none(p);
}
