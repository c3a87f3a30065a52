//! CRI runtime v1 (containerd, CRI-O): container id -> the `io.kubernetes.*` labels, and
//! each pod sandbox's labels (the pod's own, which name its owner: `workload.rs`).
use std::{collections::HashMap, path::Path};

use node_api::cri::{
    runtime_service_client::RuntimeServiceClient, ContainerStatusRequest, ListContainersRequest,
    ListPodSandboxRequest, VersionRequest,
};

use super::{workload::Sandbox, ContainerNames};

fn names_from_labels(labels: &HashMap<String, String>) -> ContainerNames {
    let get = |k: &str| {
        labels
            .get(k)
            .filter(|v| !v.is_empty())
            .map(|v| v.as_str().into())
    };
    ContainerNames {
        pod_name: get("io.kubernetes.pod.name"),
        namespace: get("io.kubernetes.pod.namespace"),
        container_name: get("io.kubernetes.container.name"),
        pod_uid: get("io.kubernetes.pod.uid"),
        runtime: None,
        workload: None,
    }
}

/// The runtime's name from CRI `Version` (`containerd`, `cri-o`, `docker` for
/// cri-dockerd), as the snapshot spells runtimes.
pub async fn runtime_name(socket: &Path) -> Result<&'static str, String> {
    let channel = node_api::unix_channel(socket).map_err(|e| e.to_string())?;
    let mut client = RuntimeServiceClient::new(channel);
    let v = client
        .version(VersionRequest {
            version: "v1".into(),
        })
        .await
        .map_err(|s| format!("Version: {}", s.message()))?
        .into_inner();
    Ok(intern_runtime(&v.runtime_name))
}

/// Runtimes as `&'static str`, like the cgroup parser's: the known ones by name, any other
/// kept once (a node talks to one runtime; at most a handful of names are ever kept).
fn intern_runtime(name: &str) -> &'static str {
    use std::sync::Mutex;
    static OTHERS: Mutex<Vec<&'static str>> = Mutex::new(vec![]);
    let name = name.trim().to_ascii_lowercase();
    match name.as_str() {
        "containerd" => "containerd",
        "cri-o" | "crio" => "cri-o",
        "docker" | "cri-dockerd" => "docker",
        "podman" => "podman",
        _ => {
            let mut others = OTHERS.lock().unwrap();
            if let Some(s) = others.iter().find(|s| **s == name) {
                return s;
            }
            if others.len() >= 8 {
                return "other";
            }
            let s: &'static str = Box::leak(name.into_boxed_str());
            others.push(s);
            s
        }
    }
}

/// One container of a listing: its id, its pod sandbox's and its names.
pub struct Listed {
    pub id: String,
    pub sandbox: String,
    pub names: ContainerNames,
}

/// Every container the runtime knows, with its names.
pub async fn list(socket: &Path) -> Result<Vec<Listed>, String> {
    let channel = node_api::unix_channel(socket).map_err(|e| e.to_string())?;
    let mut client = RuntimeServiceClient::new(channel);
    let resp = client
        .list_containers(ListContainersRequest { filter: None })
        .await
        .map_err(|s| format!("ListContainers: {}", s.message()))?;
    Ok(resp
        .into_inner()
        .containers
        .into_iter()
        .map(|c| {
            let mut n = names_from_labels(&c.labels);
            if n.container_name.is_none() {
                n.container_name = c
                    .metadata
                    .map(|m| m.name)
                    .filter(|s| !s.is_empty())
                    .map(Into::into);
            }
            Listed {
                id: c.id,
                sandbox: c.pod_sandbox_id,
                names: n,
            }
        })
        .collect())
}

/// Every pod sandbox the runtime knows, with its labels; None from a runtime that does
/// not implement `ListPodSandbox`.
pub async fn sandboxes(socket: &Path) -> Result<Option<Vec<Sandbox>>, String> {
    let channel = node_api::unix_channel(socket).map_err(|e| e.to_string())?;
    let mut client = RuntimeServiceClient::new(channel);
    let resp = match client
        .list_pod_sandbox(ListPodSandboxRequest { filter: None })
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) if s.code() == node_api::tonic::Code::Unimplemented => return Ok(None),
        Err(s) => return Err(format!("ListPodSandbox: {}", s.message())),
    };
    let all = resp.items.into_iter().map(|s| {
        let m = s.metadata.unwrap_or_default();
        Sandbox {
            id: s.id,
            pod_uid: m.uid,
            pod_name: m.name,
            labels: s.labels,
        }
    });
    Ok(Some(all.collect()))
}

/// One container's names through ContainerStatus; None when the runtime does not know it.
pub async fn status(socket: &Path, id: &str) -> Result<Option<ContainerNames>, String> {
    let channel = node_api::unix_channel(socket).map_err(|e| e.to_string())?;
    let mut client = RuntimeServiceClient::new(channel);
    match client
        .container_status(ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: false,
        })
        .await
    {
        Ok(r) => Ok(r.into_inner().status.map(|s| names_from_labels(&s.labels))),
        Err(s) if s.code() == node_api::tonic::Code::NotFound => Ok(None),
        Err(s) => Err(format!("ContainerStatus: {}", s.message())),
    }
}
