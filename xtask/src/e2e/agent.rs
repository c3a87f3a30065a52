//! The agent's container: run with the flags derived from the DaemonSet and placed on
//! the harness's directories, then checked to be ready, in eBPF mode and holding exactly
//! the DaemonSet's privileges.
use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use anyhow::{bail, Context, Result};

use super::{
    checks,
    dockerd::Dockerd,
    host::WorkDir,
    manifest::{AgentSpec, MountSource, Placement},
    otlp, plain, proc,
    tally::Tally,
    workloads,
};

pub struct AgentContainer {
    pub id: String,
    pub addr: String,
}

/// What running the agent's container needs.
pub struct AgentRun<'a> {
    pub dockerd: &'a Dockerd,
    pub work: &'a WorkDir,
    pub spec: &'a AgentSpec,
    pub tag: &'a str,
    pub nvml: &'a std::path::Path,
    pub scenario_dir: &'a std::path::Path,
    pub receiver: &'a otlp::Receiver,
    pub oci_dir: &'a std::path::Path,
}

/// Runs the agent's container with the DaemonSet's flags; checks it came up with exactly
/// the DaemonSet's privileges and loaded its programs.
pub fn run_agent(t: &mut Tally, r: &AgentRun) -> Result<AgentContainer> {
    let port = free_port()?;
    // A capability outside this process's bounding set can be given to no container (this
    // sandbox lacks CAP_SYS_RESOURCE); one dockerd cannot name goes through the wrapper.
    let bounding = own_bounding_set();
    let (grantable, not_here): (Vec<String>, Vec<String>) = r
        .spec
        .cap_add
        .iter()
        .cloned()
        .partition(|c| bounding.contains(c));
    let unnamed = workloads::caps_unknown_to(r.dockerd, &grantable);
    workloads::write_caps_wrapper(r.oci_dir, &unnamed)?;
    let mut left_out = unnamed.clone();
    left_out.extend(not_here.iter().cloned());
    // Always the wrapper: it grants capabilities the way a CRI runtime does (see there).
    let placement = e2e_placement(r, port, &left_out, true)?;
    let mut cli = vec!["run".to_string()];
    cli.extend(r.spec.docker_run_args(&placement)?);
    eprintln!("e2e: docker {}", plain::shell_words(&cli));
    if !unnamed.is_empty() {
        eprintln!(
            "e2e: dockerd {} cannot name {}: runtime {} adds them (Docker 23+ takes \
             --cap-add for them)",
            r.dockerd.server_version().unwrap_or_default(),
            unnamed.join(", "),
            workloads::CAPS_RUNTIME
        );
    }
    if !not_here.is_empty() {
        eprintln!(
            "e2e: NOTE {} left out: not in this host's capability bounding set, so no \
             runtime can grant it here (the agent needs it only on kernels before 5.11)",
            not_here.join(", ")
        );
    }
    let cli_ref: Vec<&str> = cli.iter().map(String::as_str).collect();
    let id = t
        .step(
            "agent",
            "docker run with the DaemonSet's securityContext and mounts",
            || r.dockerd.run(&cli_ref),
        )
        .context("the agent's container did not start")?;
    let addr = format!("127.0.0.1:{port}");
    let ready = proc::wait_for("the agent's /readyz", Duration::from_secs(60), || {
        tests::http::get(&addr, "/readyz").is_ok_and(|(s, _)| s == 200)
    });
    t.case(
        "agent",
        "/readyz answers 200 (programs attached, start-up walk done)",
        ready.map_err(|e| format!("{e:#}; container log:\n{}", agent_logs(r.dockerd, &id))),
    );
    let pid: u32 = r
        .dockerd
        .run(&["inspect", "--format", "{{.State.Pid}}", &id])?
        .parse()
        .context("docker inspect pid")?;
    let what = match not_here.as_slice() {
        [] => "holds exactly the DaemonSet's privileges".to_string(),
        n => format!(
            "holds exactly the DaemonSet's privileges, less {} (not in this host's bounding set)",
            n.join(", ")
        ),
    };
    t.case("agent", &what, checks::privileges(r.spec, pid, &not_here));
    t.case(
        "agent",
        "tracks processes with eBPF, NVML up",
        agent_mode(&addr),
    );
    eprintln!("e2e: the agent's log (docker logs):");
    for l in agent_logs(r.dockerd, &id).lines() {
        eprintln!("e2e: | {l}");
    }
    Ok(AgentContainer { id, addr })
}

/// Capability names in this process's bounding set.
fn own_bounding_set() -> Vec<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    checks::cap_names(mask)
}

/// The e2e run's placement: the harness's directories behind the hostPaths, the rendered
/// ConfigMap's files, the Docker socket (names), the fake NVML library and scenario, the
/// OTLP receiver, a port of its own.
fn e2e_placement(
    r: &AgentRun,
    port: u16,
    caps_left_out: &[String],
    use_wrapper: bool,
) -> Result<Placement> {
    let mut host_path = BTreeMap::new();
    let mut config_dir = BTreeMap::new();
    for m in &r.spec.mounts {
        match &m.source {
            MountSource::HostPath { path, kind } => {
                let src = e2e_host_path(r.work, path, kind.as_deref(), m.propagation.is_some())?;
                host_path.insert(path.clone(), src);
            }
            MountSource::ConfigMap { files } => {
                let dir = r.work.join(&format!("configmap-{}", m.volume));
                std::fs::create_dir_all(&dir)?;
                for (name, content) in files {
                    std::fs::write(dir.join(name), content)?;
                }
                config_dir.insert(m.volume.clone(), dir);
            }
        }
    }
    let mut extra_flags = vec![
        // Names on a plain Docker host come from the Docker API (README's docker run line).
        format!(
            "--mount=type=bind,source={},target=/var/run/docker.sock,readonly",
            r.dockerd.sock.display()
        ),
        // This machine has no GPU: the fake NVML library and its scenario.
        format!(
            "--mount=type=bind,source={},target=/opt/fake-nvml/libnvidia_ml.so,readonly",
            r.nvml.display()
        ),
        format!(
            "--mount=type=bind,source={},target=/etc/fake-nvml,readonly",
            r.scenario_dir.display()
        ),
    ];
    if use_wrapper {
        extra_flags.push(format!("--runtime={}", workloads::CAPS_RUNTIME));
    }
    Ok(Placement {
        node_name: std::fs::read_to_string("/proc/sys/kernel/hostname")?
            .trim()
            .to_string(),
        host_ip: "127.0.0.1".into(),
        image: r.tag.into(),
        name: format!("gpu-agent-e2e-{}", tests::random_hex(6)),
        host_path,
        skip_host_paths: vec![],
        config_dir,
        caps_elsewhere: caps_left_out.to_vec(),
        extra_flags,
        extra_env: vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), r.receiver.url()),
            ("OTEL_METRIC_EXPORT_INTERVAL".into(), "2000".into()),
            (
                "FAKE_NVML_SCENARIO".into(),
                "/etc/fake-nvml/scenario.json".into(),
            ),
        ],
        extra_args: vec![
            // Host network: a port of its own instead of the config's 0.0.0.0:9464.
            "--http-addr".into(),
            format!("127.0.0.1:{port}"),
            "--nvml-lib".into(),
            "/opt/fake-nvml/libnvidia_ml.so".into(),
        ],
        user: None,
    })
}

/// The host directory behind a manifest hostPath in the harness: containerd's state
/// directory is the harness's containerd; a `DirectoryOrCreate` path this host lacks is an
/// empty directory (what the kubelet would create) of the harness's own; a path mounted
/// with propagation is rbind-mounted into the harness's shared work directory (see
/// `WorkDir`); anything else is the host's own.
fn e2e_host_path(
    work: &WorkDir,
    path: &str,
    kind: Option<&str>,
    propagates: bool,
) -> Result<PathBuf> {
    let name = path.trim_start_matches('/').replace('/', "-");
    if path == "/run/containerd" {
        return Ok(work.join("run-containerd"));
    }
    let exists = std::path::Path::new(path).exists();
    if !exists {
        if kind == Some("DirectoryOrCreate") {
            let d = work.join(&format!("hostpath-{name}"));
            std::fs::create_dir_all(&d)?;
            return Ok(d);
        }
        bail!("hostPath {path} does not exist on this host");
    }
    if propagates {
        return work.rbind(std::path::Path::new(path), &format!("host-{name}"));
    }
    Ok(PathBuf::from(path))
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub fn agent_logs(dockerd: &Dockerd, id: &str) -> String {
    let mut c = dockerd.cmd(&["logs", "--tail", "40", id]);
    match c.output() {
        Ok(o) => format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => e.to_string(),
    }
}

/// `/debug/stats`: eBPF mode (not the /proc fallback), and NVML up once its first sample
/// is in (it says "starting" until then).
fn agent_mode(addr: &str) -> Result<(), String> {
    let mut last = String::new();
    let done = proc::wait_for("eBPF mode and NVML ok", Duration::from_secs(20), || {
        let stats = tests::http::get(addr, "/debug/stats")
            .map_err(|e| e.to_string())
            .and_then(|(_, body)| {
                serde_json::from_str::<serde_json::Value>(&body).map_err(|e| e.to_string())
            });
        match stats {
            Ok(v) if v["mode"] == "ebpf" && v["nvml"] == "ok" => true,
            Ok(v) => {
                last = format!(
                    "mode {} (degraded_reason {}), nvml {}",
                    v["mode"], v["degraded_reason"], v["nvml"]
                );
                false
            }
            Err(e) => {
                last = format!("/debug/stats: {e}");
                false
            }
        }
    });
    done.map_err(|e| format!("{last} ({e:#})"))
}
