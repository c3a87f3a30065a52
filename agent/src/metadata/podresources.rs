//! kubelet pod-resources v1: which container is allocated which GPU, through device
//! plugins (`devices`) and DRA claims (`dynamic_resources`), and how many time-slicing
//! replicas each GPU is cut into (`GetAllocatableResources`).
use std::{collections::HashMap, path::Path, sync::Arc};

use gpu_model::DraDevice;
use node_api::podresources::{
    pod_resources_lister_client::PodResourcesListerClient, AllocatableResourcesRequest,
    DynamicResource, ListPodResourcesRequest,
};

use super::{
    devices::{is_gpu_resource, parse_device_id, DeviceRef},
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
    let own = own_pod();
    for pod in resp.into_inner().pod_resources {
        if is_own(own, &pod.namespace, &pod.name) {
            continue;
        }
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
                out.extend(dra_allocations(&pod.namespace, &pod.name, &c.name, d));
            }
        }
    }
    Ok(out)
}

/// The agent's own pod (POD_NAMESPACE and POD_NAME, from the downward API): its
/// admin-access claim on every GPU reaches the driver and allocates nothing to a workload,
/// so the listing leaves it out.
fn own_pod() -> Option<&'static (String, String)> {
    static OWN: std::sync::OnceLock<Option<(String, String)>> = std::sync::OnceLock::new();
    OWN.get_or_init(|| {
        let ns = std::env::var("POD_NAMESPACE")
            .ok()
            .filter(|v| !v.is_empty())?;
        let name = std::env::var("POD_NAME").ok().filter(|v| !v.is_empty())?;
        Some((ns, name))
    })
    .as_ref()
}

fn is_own(own: Option<&(String, String)>, namespace: &str, name: &str) -> bool {
    own.is_some_and(|(ns, n)| ns == namespace && n == name)
}

/// The name of NVIDIA's DRA driver for GPUs and MIG devices.
pub const NVIDIA_DRA_DRIVER: &str = "gpu.nvidia.com";

/// One allocation per device of a DRA claim that NVIDIA's driver gave, named as the driver
/// names it (`devices::parse_dra_device` reads the name). The device's own `ClaimResource`
/// alone says which device it is: the kubelet declares a claim's CDI list outside its loop
/// over the devices, so the Nth carries the CDI names of devices 1 to N, and none of
/// NVIDIA's carries a UUID (`k8s.gpu.nvidia.com/claim=<claim UID>-gpu-0`, before v25.12
/// `k8s.gpu.nvidia.com/device=gpu-0`).
fn dra_allocations<'a>(
    ns: &'a str,
    pod: &'a str,
    container: &'a str,
    d: &'a DynamicResource,
) -> impl Iterator<Item = Allocation> + 'a {
    (d.claim_resources.iter())
        .filter(|r| r.driver_name == NVIDIA_DRA_DRIVER)
        .map(move |r| Allocation {
            namespace: ns.to_string(),
            pod_name: pod.to_string(),
            container_name: container.to_string(),
            resource_name: r.driver_name.clone(),
            device_ids: vec![r.device_name.as_str().into()],
            claim: Some(Arc::new(DraDevice {
                claim_namespace: d.claim_namespace.clone(),
                claim_name: d.claim_name.clone(),
                driver: r.driver_name.clone(),
                pool: r.pool_name.clone(),
                device: r.device_name.clone(),
            })),
        })
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
    use node_api::podresources::{CdiDevice, ClaimResource};

    use super::*;
    use crate::metadata::devices::parse_dra_device;

    fn resource(driver: &str, device: &str, cdi: &[String]) -> ClaimResource {
        ClaimResource {
            cdi_devices: (cdi.iter())
                .map(|n| CdiDevice { name: n.clone() })
                .collect(),
            driver_name: driver.into(),
            pool_name: "node-1".into(),
            device_name: device.into(),
        }
    }

    /// A claim of `devices` as the kubelet reports it: each `ClaimResource` carries the CDI
    /// names of the devices up to its own (`cdi` gives a device's).
    fn kubelet_claim(devices: &[&str], cdi: impl Fn(&str) -> String) -> DynamicResource {
        let mut names = vec![];
        let claim_resources = (devices.iter())
            .map(|d| {
                names.push(cdi(d));
                resource(NVIDIA_DRA_DRIVER, d, &names)
            })
            .collect();
        DynamicResource {
            claim_name: "gpu-claim".into(),
            claim_namespace: "ml".into(),
            claim_resources,
        }
    }

    const UID: &str = "5a8b3f7e-1f1a-4c5e-9e44-0c6f2a3b9d11";

    #[test]
    fn each_claim_resource_is_its_own_device_whatever_its_cdi_list() {
        // v25.12 (`claim=` CDI names) and before (`device=`), a claim of two GPUs.
        let v25_12 = kubelet_claim(&["gpu-0", "gpu-1"], |d| {
            format!("k8s.gpu.nvidia.com/claim={UID}-{d}")
        });
        let v25_8 = kubelet_claim(&["gpu-0", "gpu-1"], |d| {
            format!("k8s.gpu.nvidia.com/device={d}")
        });
        for d in [v25_12, v25_8] {
            assert_eq!(d.claim_resources[1].cdi_devices.len(), 2, "accumulated");
            let a: Vec<Allocation> = dra_allocations("ml", "p", "main", &d).collect();
            let ids: Vec<&str> = a.iter().map(|a| &*a.device_ids[0]).collect();
            assert_eq!(ids, ["gpu-0", "gpu-1"]);
            let refs: Vec<DeviceRef> = a.iter().flat_map(|a| a.device_refs()).collect();
            assert_eq!(refs, [DeviceRef::Minor(0), DeviceRef::Minor(1)]);
            let dra = a[1].claim.as_deref().unwrap();
            assert_eq!(
                (
                    &*dra.claim_namespace,
                    &*dra.claim_name,
                    &*dra.pool,
                    &*dra.device
                ),
                ("ml", "gpu-claim", "node-1", "gpu-1")
            );
            assert_eq!(a[1].resource_name, "gpu.nvidia.com");
        }
    }

    #[test]
    fn mig_devices_of_both_driver_versions_and_nothing_of_other_drivers() {
        let v25_12 = kubelet_claim(&["gpu-0-mig-1g10gb-19-0", "gpu-1-mig-2g47gb-14-0"], |d| {
            format!("k8s.gpu.nvidia.com/claim={UID}-{d}")
        });
        let v25_8 = kubelet_claim(&["gpu-0-mig-19-0-1"], |d| {
            format!("k8s.gpu.nvidia.com/device={d}")
        });
        let refs = |d: &DynamicResource| -> Vec<DeviceRef> {
            dra_allocations("ml", "p", "main", d)
                .flat_map(|a| a.device_refs().collect::<Vec<_>>())
                .collect()
        };
        let mig = |parent_minor, profile_id, placement_start| DeviceRef::Mig {
            parent_minor,
            profile_id,
            placement_start,
        };
        assert_eq!(refs(&v25_12), [mig(0, 19, 0), mig(1, 14, 0)]);
        assert_eq!(refs(&v25_8), [mig(0, 19, 0)]);
        assert_eq!(
            parse_dra_device("gpu-0-mig-1g10gb-me-20-0"),
            Some(mig(0, 20, 0))
        );
        // Another vendor's device with a GPU-like name is not one of NVIDIA's GPUs, nor is
        // NVIDIA's compute-domain driver's.
        let other = DynamicResource {
            claim_resources: vec![
                resource(
                    "gpu.example.com",
                    "gpu-1",
                    &["example.com/gpu=gpu-1".into()],
                ),
                resource("compute-domain.nvidia.com", "channel-0", &[]),
            ],
            ..kubelet_claim(&[], |d| d.into())
        };
        assert_eq!(dra_allocations("ml", "p", "main", &other).count(), 0);
    }
}
