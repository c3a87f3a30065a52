//! containerd 1.6 (Debian's) with its CRI plugin, started by the harness, and pods run
//! through CRI the way the kubelet runs them: RunPodSandbox with a kubelet-style
//! `cgroup_parent`, CreateContainer with the kubelet's `io.kubernetes.*` labels,
//! StartContainer; and torn down the same way (StopContainer, RemoveContainer,
//! StopPodSandbox, RemovePodSandbox).
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{bail, Context, Result};

use super::proc::{output, Daemon};
use crate::on_path;

pub mod cri {
    tonic::include_proto!("runtime.v1");
}

use cri::runtime_service_client::RuntimeServiceClient;

pub struct Containerd {
    daemon: Daemon,
    /// `containerd.sock` in the state directory, as in /run/containerd.
    pub sock: PathBuf,
    rt: tokio::runtime::Runtime,
    /// Sandboxes this harness started, with the cgroup directories their start created,
    /// for teardown.
    sandboxes: Vec<(String, Vec<PathBuf>)>,
}

/// A container started through CRI, with what the kubelet gave it.
#[derive(Debug, Clone)]
pub struct CriContainer {
    pub id: String,
    pub pod_name: String,
    pub namespace: String,
    pub pod_uid: String,
    pub container_name: String,
    pub cgroup_parent: String,
    /// The pod's cgroup directories, and the ancestors that did not exist before it.
    pub created_cgroups: Vec<PathBuf>,
    pub pid: u32,
}

impl Containerd {
    /// Starts containerd with root and state under `dir`, and the CRI plugin's pause image
    /// set to `sandbox_image` (imported later with [`Containerd::import`]).
    pub fn start(dir: &Path, state: &Path, sandbox_image: &str) -> Result<Containerd> {
        let bin = on_path("containerd").context(
            "containerd is not installed: apt-get install containerd (cargo xtask \
             e2e-container installs it when run as root)",
        )?;
        std::fs::create_dir_all(dir)?;
        std::fs::create_dir_all(state)?;
        let sock = state.join("containerd.sock");
        let config = dir.join("config.toml");
        std::fs::write(&config, config_toml(dir, state, &sock, sandbox_image))?;
        let mut cmd = Command::new(bin);
        cmd.arg("--config").arg(&config);
        let daemon = Daemon::spawn(
            "containerd",
            cmd,
            dir.join("containerd.log"),
            Duration::from_secs(20),
        )?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut c = Containerd {
            daemon,
            sock,
            rt,
            sandboxes: vec![],
        };
        let s = c.sock.clone();
        c.daemon
            .wait_ready(Duration::from_secs(30), || s.exists())?;
        let mut v = None;
        let sock = c.sock.clone();
        let rt = &c.rt;
        c.daemon.wait_ready(Duration::from_secs(30), || {
            v = rt
                .block_on(async {
                    let mut client = client(&sock)?;
                    let r = client
                        .version(cri::VersionRequest {
                            version: "v1".into(),
                        })
                        .await?;
                    anyhow::Ok(r.into_inner())
                })
                .ok();
            v.is_some()
        })?;
        let v = v.expect("ready");
        eprintln!(
            "e2e: {} {} (CRI {}) ready on {}",
            v.runtime_name,
            v.runtime_version,
            v.runtime_api_version,
            c.sock.display()
        );
        Ok(c)
    }

    /// `ctr -n k8s.io images import` of a `docker save` archive.
    pub fn import(&self, archive: &Path) -> Result<()> {
        output(
            Command::new("ctr")
                .arg("--address")
                .arg(&self.sock)
                .args(["--namespace", "k8s.io", "images", "import"])
                .arg(archive),
        )?;
        Ok(())
    }

    /// RunPodSandbox + CreateContainer + StartContainer, as the kubelet does for a pod of
    /// one container. `qos` is `besteffort`, `burstable` or `guaranteed` (the last has no
    /// QoS level in the kubelet's cgroupfs layout).
    #[allow(clippy::too_many_arguments)]
    pub fn run_pod(
        &mut self,
        namespace: &str,
        pod_name: &str,
        container_name: &str,
        qos: &str,
        image: &str,
        command: &[&str],
    ) -> Result<CriContainer> {
        let uid = tests::random_uid();
        let cgroup_parent = match qos {
            "guaranteed" => format!("/kubepods/pod{uid}"),
            q => format!("/kubepods/{q}/pod{uid}"),
        };
        let sandbox_config = sandbox_config(namespace, pod_name, &uid, &cgroup_parent);
        let created_cgroups = super::host::missing_cgroup_dirs(&cgroup_parent);
        let sock = self.sock.clone();
        let (sandbox_id, id, pid) = self.rt.block_on(async {
            let mut c = client(&sock)?;
            let sandbox_id = c
                .run_pod_sandbox(cri::RunPodSandboxRequest {
                    config: Some(sandbox_config.clone()),
                    runtime_handler: String::new(),
                })
                .await
                .context("RunPodSandbox")?
                .into_inner()
                .pod_sandbox_id;
            let config =
                container_config(namespace, pod_name, &uid, container_name, image, command);
            let id = c
                .create_container(cri::CreateContainerRequest {
                    pod_sandbox_id: sandbox_id.clone(),
                    config: Some(config),
                    sandbox_config: Some(sandbox_config),
                })
                .await
                .context("CreateContainer")?
                .into_inner()
                .container_id;
            c.start_container(cri::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .context("StartContainer")?;
            let status = c
                .container_status(cri::ContainerStatusRequest {
                    container_id: id.clone(),
                    verbose: true,
                })
                .await
                .context("ContainerStatus")?
                .into_inner();
            anyhow::Ok((sandbox_id, id, pid_from_info(&status.info)?))
        })?;
        self.sandboxes.push((sandbox_id, created_cgroups.clone()));
        Ok(CriContainer {
            id,
            pod_name: pod_name.into(),
            namespace: namespace.into(),
            pod_uid: uid,
            container_name: container_name.into(),
            cgroup_parent,
            created_cgroups,
            pid,
        })
    }

    /// The kubelet's teardown of every pod this harness ran, and of the pod cgroups (the
    /// kubelet removes those it made; here runc made them, and leaves them).
    pub fn remove_pods(&mut self) {
        let sock = self.sock.clone();
        // Removed once every pod is gone: an ancestor one pod created (`/kubepods`) holds
        // the others' cgroups too.
        let mut created = vec![];
        for (sb, cgroups) in std::mem::take(&mut self.sandboxes) {
            let r = self.rt.block_on(async {
                let mut c = client(&sock)?;
                c.stop_pod_sandbox(cri::StopPodSandboxRequest {
                    pod_sandbox_id: sb.clone(),
                })
                .await
                .context("StopPodSandbox")?;
                c.remove_pod_sandbox(cri::RemovePodSandboxRequest {
                    pod_sandbox_id: sb.clone(),
                })
                .await
                .context("RemovePodSandbox")?;
                anyhow::Ok(())
            });
            match r {
                Ok(()) => created.extend(cgroups),
                Err(e) => eprintln!("e2e: removing pod sandbox {sb}: {e:#}"),
            }
        }
        created.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        created.dedup();
        super::host::remove_cgroup_dirs(&created);
    }

    pub fn stop(&mut self) {
        self.remove_pods();
        self.daemon.stop();
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.stop();
    }
}

fn client(sock: &Path) -> Result<RuntimeServiceClient<tonic::transport::Channel>> {
    Ok(RuntimeServiceClient::new(node_api::unix_channel(sock)?))
}

/// containerd's verbose ContainerStatus info carries the task's host PID.
fn pid_from_info(info: &HashMap<String, String>) -> Result<u32> {
    let raw = info
        .get("info")
        .context("ContainerStatus(verbose) without info")?;
    let v: serde_json::Value = serde_json::from_str(raw).context("ContainerStatus info")?;
    match v["pid"].as_u64() {
        Some(p) if p > 0 => Ok(p as u32),
        _ => bail!("ContainerStatus info has no pid: {raw}"),
    }
}

/// The sandbox the kubelet asks for: metadata, its labels, the pod's cgroup parent, the
/// node's network (no CNI here) and the pod's own PID namespace.
fn sandbox_config(ns: &str, pod: &str, uid: &str, cgroup_parent: &str) -> cri::PodSandboxConfig {
    let labels = HashMap::from([
        ("io.kubernetes.pod.name".to_string(), pod.to_string()),
        ("io.kubernetes.pod.namespace".to_string(), ns.to_string()),
        ("io.kubernetes.pod.uid".to_string(), uid.to_string()),
    ]);
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: pod.into(),
            uid: uid.into(),
            namespace: ns.into(),
            attempt: 0,
        }),
        // Host network: the hostname must be empty.
        hostname: String::new(),
        log_directory: String::new(),
        labels,
        annotations: HashMap::from([(
            "kubernetes.io/config.source".to_string(),
            "api".to_string(),
        )]),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.into(),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: cri::NamespaceMode::Node as i32,
                    pid: cri::NamespaceMode::Container as i32,
                    ipc: cri::NamespaceMode::Pod as i32,
                    target_id: String::new(),
                }),
                seccomp: Some(cri::SecurityProfile {
                    profile_type: cri::security_profile::ProfileType::RuntimeDefault as i32,
                    localhost_ref: String::new(),
                }),
                ..Default::default()
            }),
        }),
    }
}

/// The container the kubelet asks for, with the labels it sets (which CRI's
/// ListContainers returns, and the agent reads names from).
fn container_config(
    ns: &str,
    pod: &str,
    uid: &str,
    name: &str,
    image: &str,
    command: &[&str],
) -> cri::ContainerConfig {
    let labels = HashMap::from([
        ("io.kubernetes.pod.name".to_string(), pod.to_string()),
        ("io.kubernetes.pod.namespace".to_string(), ns.to_string()),
        ("io.kubernetes.pod.uid".to_string(), uid.to_string()),
        ("io.kubernetes.container.name".to_string(), name.to_string()),
    ]);
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: image.into(),
        }),
        command: command.iter().map(|s| s.to_string()).collect(),
        labels,
        annotations: HashMap::from([(
            "io.kubernetes.container.restartCount".to_string(),
            "0".to_string(),
        )]),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(cri::LinuxContainerResources {
                // BestEffort: the kubelet's minimum shares, no limits.
                cpu_shares: 2,
                oom_score_adj: 1000,
                ..Default::default()
            }),
            security_context: Some(cri::LinuxContainerSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: cri::NamespaceMode::Node as i32,
                    pid: cri::NamespaceMode::Container as i32,
                    ipc: cri::NamespaceMode::Pod as i32,
                    target_id: String::new(),
                }),
                seccomp: Some(cri::SecurityProfile {
                    profile_type: cri::security_profile::ProfileType::RuntimeDefault as i32,
                    localhost_ref: String::new(),
                }),
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

/// containerd's config: everything under the harness's directories, the CRI plugin with
/// the cgroupfs driver, no CNI (pods use the node's network), and
/// `restrict_oom_score_adj` (without it RunPodSandbox fails in this sandbox, whose own
/// oom_score_adj is raised: "can't get final child's PID from pipe: EOF").
fn config_toml(dir: &Path, state: &Path, sock: &Path, sandbox_image: &str) -> String {
    let d = dir.display();
    format!(
        r#"version = 2
root = "{d}/root"
state = "{state}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{sock}"

[ttrpc]
  address = "{sock}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        # runc's state (default /run/containerd/runc) with the rest of the harness's.
        Root = "{d}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/cni/bin"
    conf_dir = "{d}/cni/conf"
"#,
        state = state.display(),
        sock = sock.display(),
    )
}
