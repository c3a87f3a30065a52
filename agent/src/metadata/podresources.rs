//! kubelet pod-resources v1: which container is allocated which GPU.
use std::path::Path;

use node_api::podresources::{
    pod_resources_lister_client::PodResourcesListerClient, ListPodResourcesRequest,
};

use super::{is_gpu_resource, Allocation};

pub async fn list(socket: &Path) -> Result<Vec<Allocation>, String> {
    if !socket.exists() {
        return Err("socket not found".into());
    }
    let channel = node_api::unix_channel(socket).map_err(|e| e.to_string())?;
    let mut client = PodResourcesListerClient::new(channel);
    let resp = client
        .list(ListPodResourcesRequest {})
        .await
        .map_err(|s| format!("List: {}", s.message()))?;
    let mut out = vec![];
    for pod in resp.into_inner().pod_resources {
        for c in pod.containers {
            for d in c.devices {
                if is_gpu_resource(&d.resource_name) && !d.device_ids.is_empty() {
                    out.push(Allocation {
                        namespace: pod.namespace.clone(),
                        pod_name: pod.name.clone(),
                        container_name: c.name.clone(),
                        resource_name: d.resource_name,
                        device_ids: d.device_ids,
                    });
                }
            }
        }
    }
    Ok(out)
}
