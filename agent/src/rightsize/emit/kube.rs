//! The Kubernetes objects `--emit` writes: a ConfigMap, strategic-merge patches of the
//! workloads, and `resource.k8s.io/v1` ResourceClaimTemplates for NVIDIA's DRA driver
//! (device classes `gpu.nvidia.com` and `mig.nvidia.com`; attributes `productName` and
//! `profile` in the `gpu.nvidia.com` domain, as its kubelet plugin publishes them).
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{json, Map, Value};

use super::{plugin_key, PLUGIN_CONFIG_LABEL, SHARED_RESOURCE};
use crate::rightsize::plan::{Sharing, Target, WorkloadPlan};

#[derive(Debug, Serialize)]
pub struct Metadata {
    pub name: String,
    pub namespace: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMap {
    api_version: &'static str,
    kind: &'static str,
    metadata: Metadata,
    data: BTreeMap<String, String>,
}

impl ConfigMap {
    pub fn new(name: &str, namespace: &str, data: BTreeMap<String, String>) -> ConfigMap {
        ConfigMap {
            api_version: "v1",
            kind: "ConfigMap",
            metadata: Metadata {
                name: name.into(),
                namespace: namespace.into(),
            },
            data,
        }
    }
}

/// The API group of a workload kind the agent infers; None for `Container` (outside
/// Kubernetes) and kinds it does not know.
pub fn api_version(kind: &str) -> Option<&'static str> {
    match kind {
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" => Some("apps/v1"),
        "Job" | "CronJob" => Some("batch/v1"),
        "Pod" => Some("v1"),
        _ => None,
    }
}

/// The resource a workload asks for now: its MIG profile's under the mixed strategy, else
/// a whole GPU.
fn current_resource(w: &WorkloadPlan) -> String {
    match &w.mig_profile {
        Some(p) => format!("nvidia.com/mig-{p}"),
        None => "nvidia.com/gpu".into(),
    }
}

/// A strategic-merge patch of `w`'s GPU containers: the old resource removed (`null`),
/// the new one asked for, and for a shared GPU the node label of its replica count. None
/// where no container is named (the source did not say them) or nothing changes.
pub fn patch(w: &WorkloadPlan) -> Option<Value> {
    let api = api_version(&w.key.workload_kind)?;
    if w.containers.is_empty() {
        return None;
    }
    let mut resources = Map::new();
    resources.insert(current_resource(w), Value::Null);
    let mut selector = None;
    match &w.target {
        Target::Mig { profile } => {
            resources.insert(format!("nvidia.com/mig-{profile}"), json!(1));
        }
        Target::Shared { sharing, replicas } => {
            resources.insert(SHARED_RESOURCE.into(), json!(1));
            selector = Some(json!({PLUGIN_CONFIG_LABEL: plugin_key(*sharing, *replicas)}));
        }
        Target::Release => {}
        Target::AsIs => return None,
    }
    let resources = Value::Object(resources);
    let containers: Vec<Value> = (w.containers.iter())
        .map(|c| json!({"name": c, "resources": {"limits": resources, "requests": resources}}))
        .collect();
    let mut pod = json!({ "containers": containers });
    if let Some(s) = selector {
        pod["nodeSelector"] = s;
    }
    let spec = match w.key.workload_kind.as_str() {
        "Pod" => pod,
        "CronJob" => json!({"jobTemplate": {"spec": {"template": {"spec": pod}}}}),
        _ => json!({"template": {"spec": pod}}),
    };
    Some(json!({
        "apiVersion": api,
        "kind": w.key.workload_kind,
        "metadata": {"name": w.key.workload, "namespace": w.key.namespace},
        "spec": spec,
    }))
}

/// `'` escaped for a CEL string literal.
fn cel_str(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// A ResourceClaimTemplate `<workload>-gpu` asking for one device of the plan: the MIG
/// profile on this GPU model (`mig.nvidia.com`), or a GPU of the model shared by
/// time-slicing or MPS (`gpu.nvidia.com`, its sharing in the driver's `GpuConfig`). None
/// for a release (nothing to ask for) and as-is.
pub fn claim_template(w: &WorkloadPlan) -> Option<Value> {
    api_version(&w.key.workload_kind)?;
    let attr = |name: &str, v: &str| {
        format!(
            "device.attributes['gpu.nvidia.com'].{name} == {}",
            cel_str(v)
        )
    };
    let model = attr("productName", &w.key.device_model);
    let (class, expression, config) = match &w.target {
        Target::Mig { profile } => (
            "mig.nvidia.com",
            format!("{} && {model}", attr("profile", profile)),
            None,
        ),
        Target::Shared { sharing, .. } => {
            let sharing = match (sharing, w.mps_limits) {
                (Sharing::Mps, Some((pct, bytes))) => json!({
                    "strategy": "MPS",
                    "mpsConfig": {
                        "defaultActiveThreadPercentage": pct,
                        "defaultPinnedDeviceMemoryLimit": format!("{}Mi", bytes >> 20),
                    },
                }),
                (Sharing::Mps, None) => json!({"strategy": "MPS"}),
                (Sharing::TimeSlicing, _) => json!({
                    "strategy": "TimeSlicing",
                    "timeSlicingConfig": {"interval": "Default"},
                }),
            };
            let config = json!([{
                "requests": ["gpu"],
                "opaque": {
                    "driver": "gpu.nvidia.com",
                    "parameters": {
                        "apiVersion": "resource.nvidia.com/v1beta1",
                        "kind": "GpuConfig",
                        "sharing": sharing,
                    },
                },
            }]);
            ("gpu.nvidia.com", model, Some(config))
        }
        Target::Release | Target::AsIs => return None,
    };
    let mut devices = json!({
        "requests": [{
            "name": "gpu",
            "exactly": {
                "deviceClassName": class,
                "selectors": [{"cel": {"expression": expression}}],
            },
        }],
    });
    if let Some(c) = config {
        devices["config"] = c;
    }
    Some(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": format!("{}-gpu", w.key.workload), "namespace": w.key.namespace},
        "spec": {"spec": {"devices": devices}},
    }))
}
