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
    let yaml = |v: &dyn erased::Yaml| v.to_yaml();
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

/// YAML through serde, for any of the files' types.
mod erased {
    pub trait Yaml {
        fn to_yaml(&self) -> Result<String, String>;
    }

    impl<T: serde::Serialize> Yaml for T {
        fn to_yaml(&self) -> Result<String, String> {
            serde_yaml::to_string(self).map_err(|e| e.to_string())
        }
    }
}
