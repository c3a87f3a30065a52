//! kubelet pod-resources v1: which container is allocated which GPU, through device
//! plugins (`devices`) and DRA claims (`dynamic_resources`), and how many time-slicing
//! replicas each GPU is cut into (`GetAllocatableResources`).
use std::{collections::HashMap, path::Path};

use node_api::podresources::{
    pod_resources_lister_client::PodResourcesListerClient, AllocatableResourcesRequest,
    ClaimResource, DynamicResource, ListPodResourcesRequest,
};

use super::{
    devices::{is_gpu_resource, parse_device_id, parse_dra_minor, DeviceRef},
    Allocation,
};

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
                        device_ids: d.device_ids.iter().map(|id| id.as_str().into()).collect(),
                        claim: None,
                    });
                }
            }
            for d in &c.dynamic_resources {
                if let Some(a) = dra_allocation(&pod.namespace, &pod.name, &c.name, d) {
                    out.push(a);
                }
            }
        }
    }
    Ok(out)
}

/// The NVIDIA DRA driver's name for its GPU devices' driver.
pub const NVIDIA_DRA_DRIVER: &str = "gpu.nvidia.com";

/// One DRA claim's NVIDIA GPUs as an allocation: each device by the UUID its CDI device
/// name (or device name) carries, else by the driver's `gpu-<minor>` name.
fn dra_allocation(ns: &str, pod: &str, container: &str, d: &DynamicResource) -> Option<Allocation> {
    let mut ids = vec![];
    let mut driver = None;
    for r in &d.claim_resources {
        if let Some(id) = dra_device_id(r) {
            driver.get_or_insert_with(|| r.driver_name.clone());
            ids.push(id.into());
        }
    }
    if ids.is_empty() {
        return None;
    }
    Some(Allocation {
        namespace: ns.to_string(),
        pod_name: pod.to_string(),
        container_name: container.to_string(),
        resource_name: driver.unwrap_or_default(),
        device_ids: ids,
        claim: Some(format!("{}/{}", d.claim_namespace, d.claim_name)),
    })
}

/// A GPU or MIG UUID anywhere in `s` (`k8s.gpu.nvidia.com/gpu=GPU-…`, `…-MIG-…`).
pub fn find_uuid(s: &str) -> Option<String> {
    for prefix in ["GPU-", "MIG-"] {
        if let Some(i) = s.find(prefix) {
            let rest = &s[i + prefix.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_hexdigit() || c == '-'))
                .unwrap_or(rest.len());
            let hex = rest[..end].trim_end_matches('-');
            if hex.chars().filter(char::is_ascii_hexdigit).count() >= 32 {
                return Some(format!("{prefix}{hex}"));
            }
        }
    }
    None
}

/// The id the join can resolve for one DRA device, if it is an NVIDIA GPU: its UUID, or
/// `gpu-<minor>` (how the NVIDIA DRA driver names a whole GPU).
fn dra_device_id(r: &ClaimResource) -> Option<String> {
    let nvidia = r.driver_name == NVIDIA_DRA_DRIVER
        || r.cdi_devices.iter().any(|c| {
            c.name
                .split('=')
                .next()
                .is_some_and(|kind| kind.ends_with("nvidia.com/gpu"))
        });
    let uuid = r
        .cdi_devices
        .iter()
        .find_map(|c| find_uuid(&c.name))
        .or_else(|| find_uuid(&r.device_name));
    match uuid {
        Some(u) => Some(u),
        None if nvidia && parse_dra_minor(&r.device_name).is_some() => Some(r.device_name.clone()),
        None => None,
    }
}

/// Time-slicing replicas per GPU UUID, from the kubelet's allocatable devices
/// (`GPU-<uuid>::0` … `::N-1`); GPUs not time-sliced are absent.
pub async fn replicas(socket: &Path) -> Result<HashMap<String, u32>, String> {
    let channel = node_api::unix_channel(socket).map_err(|e| e.to_string())?;
    let mut client = PodResourcesListerClient::new(channel);
    let resp = client
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .map_err(|s| format!("GetAllocatableResources: {}", s.message()))?;
    let mut out: HashMap<String, u32> = HashMap::new();
    for d in resp.into_inner().devices {
        if !is_gpu_resource(&d.resource_name) {
            continue;
        }
        for id in d.device_ids.iter().filter(|id| id.contains("::")) {
            if let Some(DeviceRef::Uuid(u)) = parse_device_id(id) {
                *out.entry(u.to_string()).or_default() += 1;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use node_api::podresources::CdiDevice;

    use super::*;
    use crate::metadata::devices::parse_dra_device;

    const U: &str = "GPU-6663f2bc-da9f-4cff-88fe-d84cc95fe598";

    fn claim(driver: &str, device: &str, cdi: &[&str]) -> ClaimResource {
        ClaimResource {
            cdi_devices: cdi
                .iter()
                .map(|n| CdiDevice {
                    name: n.to_string(),
                })
                .collect(),
            driver_name: driver.into(),
            pool_name: "node-1".into(),
            device_name: device.into(),
        }
    }

    #[test]
    fn dra_devices_by_uuid_or_minor_and_nothing_else() {
        let by_cdi = claim(
            "gpu.nvidia.com",
            "gpu-0",
            &[&format!("k8s.gpu.nvidia.com/gpu={U}")],
        );
        assert_eq!(dra_device_id(&by_cdi).as_deref(), Some(U));
        let by_minor = claim(
            "gpu.nvidia.com",
            "gpu-3",
            &["k8s.gpu.nvidia.com/claim=abc-gpu-3"],
        );
        assert_eq!(dra_device_id(&by_minor).as_deref(), Some("gpu-3"));
        assert_eq!(parse_dra_device("gpu-3"), Some(DeviceRef::Minor(3)));
        assert_eq!(parse_dra_device(U), Some(DeviceRef::Uuid(U.into())));
        // Another vendor's device with a minor-like name is not a GPU of ours.
        let other = claim("gpu.example.com", "gpu-1", &["example.com/gpu=gpu-1"]);
        assert_eq!(dra_device_id(&other), None);
        let mig = "MIG-4f06c904-75ca-4d7d-a0bb-51f2b99055b2";
        assert_eq!(
            find_uuid(&format!("k8s.gpu.nvidia.com/mig={mig}")).as_deref(),
            Some(mig)
        );
        assert_eq!(find_uuid("GPU-12"), None);
        let d = DynamicResource {
            claim_name: "gpu-claim".into(),
            claim_namespace: "ml".into(),
            claim_resources: vec![by_cdi, other],
        };
        let a = dra_allocation("ml", "p", "c", &d).unwrap();
        assert_eq!(a.device_ids, [U.into()]);
        assert_eq!(a.claim.as_deref(), Some("ml/gpu-claim"));
        assert_eq!(a.resource_name, "gpu.nvidia.com");
    }
}
