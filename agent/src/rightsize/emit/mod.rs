//! `rightsize --plan --emit DIR`: the files that apply a plan, rendered from it through
//! serde (docs/rightsizing.md, "From plan to cluster"):
//! - `mig-parted.yaml`: mig-parted's `version: v1` / `mig-configs`, one config per MIG layout,
//!   named for the GPU Operator's `nvidia.com/mig.config` node label;
//! - `device-plugin-sharing.yaml`: a ConfigMap of the NVIDIA device plugin's configs, one
//!   `version: v1` config per sharing and replica count, for the GPU Operator's
//!   `devicePlugin.config` and the `nvidia.com/device-plugin.config` node label;
//! - `workloads/<namespace>-<kind>-<name>.yaml`: a strategic-merge patch of each workload's
//!   GPU containers' resources;
//! - `dra/<namespace>-<kind>-<name>.yaml`: the same request as a `resource.k8s.io/v1`
//!   ResourceClaimTemplate, for a cluster on NVIDIA's DRA driver;
//! - `README.md`: what each file is, the order to apply them, and what to check after.
pub mod kube;
mod readme;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::Serialize;

use super::plan::{Cut, Plan, Sharing, Target, WorkloadPlan};

/// mig-parted's config file.
#[derive(Debug, Serialize)]
struct MigParted {
    version: &'static str,
    #[serde(rename = "mig-configs")]
    mig_configs: BTreeMap<String, Vec<MigConfig>>,
}

#[derive(Debug, Serialize)]
struct MigConfig {
    devices: &'static str,
    #[serde(rename = "mig-enabled")]
    mig_enabled: bool,
    #[serde(rename = "mig-devices")]
    mig_devices: BTreeMap<String, u32>,
}

/// The device plugin's config (k8s-device-plugin `api/config/v1`), sharing only.
#[derive(Debug, Serialize)]
struct PluginConfig {
    version: &'static str,
    sharing: PluginSharing,
}

/// One of the two (a struct, not an enum: serde_yaml writes an enum as a YAML tag).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PluginSharing {
    #[serde(skip_serializing_if = "Option::is_none")]
    time_slicing: Option<Replicated>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mps: Option<Replicated>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Replicated {
    /// `nvidia.com/gpu.shared`: a shared replica is asked for by its own name.
    rename_by_default: bool,
    resources: Vec<ReplicatedResource>,
}

#[derive(Debug, Serialize)]
struct ReplicatedResource {
    name: &'static str,
    replicas: u32,
}

/// The node label that picks a device plugin config, and the ConfigMap that holds them.
pub const PLUGIN_CONFIG_LABEL: &str = "nvidia.com/device-plugin.config";
pub const PLUGIN_CONFIGMAP: &str = "gpu-agent-sharing";
pub const PLUGIN_NAMESPACE: &str = "gpu-operator";
/// What a replica of a shared GPU is advertised as (`renameByDefault`).
pub const SHARED_RESOURCE: &str = "nvidia.com/gpu.shared";

/// The device plugin config's key for a sharing and replica count: `time-slicing-3`.
pub fn plugin_key(sharing: Sharing, replicas: u32) -> String {
    format!("{}-{replicas}", sharing.as_str())
}

/// Whether the files may go into `dir`: missing, empty, or `force`; never a file.
pub fn check_dir(dir: &Path, force: bool) -> Result<(), String> {
    let shown = dir.display();
    match std::fs::read_dir(dir).map(|mut e| e.next().is_some()) {
        Ok(true) if !force => Err(format!(
            "--emit {shown}: the directory is not empty; give --force to write into it"
        )),
        Ok(_) => Ok(()),
        Err(_) if dir.exists() => Err(format!("--emit {shown}: not a directory")),
        Err(_) => Ok(()),
    }
}

/// Writes the files into `dir` (made if missing), as `check_dir` allows. Returns the paths
/// written.
pub fn emit(dir: &Path, force: bool, plan: &Plan) -> Result<Vec<PathBuf>, String> {
    check_dir(dir, force)?;
    let mut written = vec![];
    let mut write = |rel: &str, text: String| -> Result<(), String> {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        written.push(path);
        Ok(())
    };
    let files = render(plan)?;
    for (rel, text) in files {
        write(&rel, text)?;
    }
    Ok(written)
}

/// Every file, by its path relative to DIR.
pub fn render(plan: &Plan) -> Result<BTreeMap<String, String>, String> {
    let mut files = BTreeMap::new();
    if let Some(m) = mig_parted(plan) {
        files.insert("mig-parted.yaml".to_string(), yaml(&m)?);
    }
    if let Some(c) = plugin_configmap(plan)? {
        files.insert("device-plugin-sharing.yaml".to_string(), yaml(&c)?);
    }
    let mut by_hand = vec![];
    for w in &plan.workloads {
        let Some(file) = workload_file(w) else {
            continue;
        };
        // The patch names the containers; the claim does not need them.
        match kube::patch(w) {
            Some(p) => {
                files.insert(format!("workloads/{file}"), yaml(&p)?);
            }
            None => by_hand.push(w),
        }
        if let Some(c) = kube::claim_template(w) {
            files.insert(format!("dra/{file}"), yaml(&c)?);
        }
    }
    let listed: Vec<&String> = files.keys().collect();
    files.insert("README.md".into(), readme::render(plan, &listed, &by_hand));
    Ok(files)
}

/// `<namespace>-<kind>-<name>.yaml` for a workload whose request changes and that
/// Kubernetes runs; None otherwise (as it is, or a container outside Kubernetes).
pub fn workload_file(w: &WorkloadPlan) -> Option<String> {
    if matches!(w.target, Target::AsIs) || kube::api_version(&w.key.workload_kind).is_none() {
        return None;
    }
    if let (Target::Mig { profile }, Some(now)) = (&w.target, &w.mig_profile) {
        if profile == now {
            return None;
        }
    }
    let k = &w.key;
    let kind = k.workload_kind.to_ascii_lowercase();
    Some(format!("{}-{kind}-{}.yaml", k.namespace, k.workload))
}

fn mig_parted(plan: &Plan) -> Option<MigParted> {
    let mut configs = BTreeMap::new();
    for l in plan.models.iter().flat_map(|m| &m.layouts) {
        if let Cut::Mig { config } = &l.cut {
            let c = MigConfig {
                devices: "all",
                mig_enabled: true,
                mig_devices: l.mig_devices.clone(),
            };
            configs.insert(config.clone(), vec![c]);
        }
    }
    (!configs.is_empty()).then_some(MigParted {
        version: "v1",
        mig_configs: configs,
    })
}

/// The ConfigMap of the device plugin's configs, one per sharing and replica count.
fn plugin_configmap(plan: &Plan) -> Result<Option<kube::ConfigMap>, String> {
    let mut data = BTreeMap::new();
    for l in plan.models.iter().flat_map(|m| &m.layouts) {
        let Cut::Shared { sharing, replicas } = l.cut else {
            continue;
        };
        let r = Replicated {
            rename_by_default: true,
            resources: vec![ReplicatedResource {
                name: "nvidia.com/gpu",
                replicas,
            }],
        };
        let config = PluginConfig {
            version: "v1",
            sharing: match sharing {
                Sharing::TimeSlicing => PluginSharing {
                    time_slicing: Some(r),
                    mps: None,
                },
                Sharing::Mps => PluginSharing {
                    time_slicing: None,
                    mps: Some(r),
                },
            },
        };
        let text = serde_yaml::to_string(&config).map_err(|e| e.to_string())?;
        data.insert(plugin_key(sharing, replicas), text);
    }
    Ok((!data.is_empty()).then(|| kube::ConfigMap::new(PLUGIN_CONFIGMAP, PLUGIN_NAMESPACE, data)))
}

/// YAML through serde.
fn yaml<T: Serialize>(v: &T) -> Result<String, String> {
    serde_yaml::to_string(v).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rightsize::{plan::Layout, usage::WorkloadKey};

    fn workload(kind: &str, target: Target) -> WorkloadPlan {
        WorkloadPlan {
            key: WorkloadKey {
                namespace: "ml".into(),
                workload_kind: kind.into(),
                workload: "serve".into(),
                device_model: "NVIDIA L4".into(),
            },
            containers: vec!["main".into(), "sidecar".into()],
            target,
            mig_profile: None,
            mps_limits: Some((12, 8602 << 20)),
        }
    }

    #[test]
    fn mps_gets_its_plugin_config_and_its_limits_in_the_claim() {
        let mps = Target::Shared {
            sharing: Sharing::Mps,
            replicas: 8,
        };
        let plan = Plan {
            models: vec![crate::rightsize::plan::ModelPlan {
                model: "NVIDIA L4".into(),
                gpus_held: 1,
                gpus_needed: 1,
                gpus_freed: 0,
                layouts: vec![Layout {
                    gpus: 1,
                    mig_devices: BTreeMap::new(),
                    replicas: Some(8),
                    workloads: vec!["ml/CronJob/serve".into()],
                    cut: Cut::Shared {
                        sharing: Sharing::Mps,
                        replicas: 8,
                    },
                }],
                exact: None,
            }],
            workloads: vec![workload("CronJob", mps)],
            notes: vec![],
        };
        let files = render(&plan).unwrap();
        let keys: Vec<&str> = files.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "README.md",
                "device-plugin-sharing.yaml",
                "dra/ml-cronjob-serve.yaml",
                "workloads/ml-cronjob-serve.yaml"
            ]
        );
        let cm: serde_yaml::Value =
            serde_yaml::from_str(&files["device-plugin-sharing.yaml"]).unwrap();
        let config: serde_yaml::Value =
            serde_yaml::from_str(cm["data"]["mps-8"].as_str().unwrap()).unwrap();
        assert_eq!(config["sharing"]["mps"]["resources"][0]["replicas"], 8);
        assert!(config["sharing"].get("timeSlicing").is_none());
        let claim: serde_yaml::Value =
            serde_yaml::from_str(&files["dra/ml-cronjob-serve.yaml"]).unwrap();
        let sharing =
            &claim["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"];
        assert_eq!(sharing["strategy"], "MPS");
        assert_eq!(sharing["mpsConfig"]["defaultActiveThreadPercentage"], 12);
        assert_eq!(
            sharing["mpsConfig"]["defaultPinnedDeviceMemoryLimit"],
            "8602Mi"
        );
        let patch: serde_yaml::Value =
            serde_yaml::from_str(&files["workloads/ml-cronjob-serve.yaml"]).unwrap();
        let pod = &patch["spec"]["jobTemplate"]["spec"]["template"]["spec"];
        assert_eq!(pod["containers"][1]["name"], "sidecar");
        assert_eq!(pod["nodeSelector"][PLUGIN_CONFIG_LABEL], "mps-8");
        assert!(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"].is_null());
    }

    #[test]
    fn release_removes_the_request_and_containers_outside_kubernetes_get_nothing() {
        let p = kube::patch(&workload("Pod", Target::Release)).unwrap();
        let limits = p["spec"]["containers"][0]["resources"]["limits"]
            .as_object()
            .unwrap();
        assert_eq!(limits.len(), 1);
        assert!(limits["nvidia.com/gpu"].is_null());
        assert!(kube::claim_template(&workload("Pod", Target::Release)).is_none());
        assert!(workload_file(&workload("Container", Target::Release)).is_none());
        let mut unnamed = workload("Deployment", Target::Release);
        unnamed.containers.clear();
        assert!(kube::patch(&unnamed).is_none());
    }

    #[test]
    fn a_directory_with_anything_in_it_is_refused_without_force() {
        let dir = std::env::temp_dir().join(format!("emit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(check_dir(&dir, false).is_ok(), "empty");
        std::fs::write(dir.join("x"), "").unwrap();
        let e = check_dir(&dir, false).unwrap_err();
        assert!(e.contains("--force") && e.contains("not empty"), "{e}");
        assert!(check_dir(&dir, true).is_ok());
        assert!(check_dir(&dir.join("x"), true)
            .unwrap_err()
            .contains("not a directory"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
