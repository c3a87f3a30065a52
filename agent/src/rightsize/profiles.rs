//! The MIG profiles each GPU model can be partitioned into: read from NVML where this node
//! has the model (and its driver lists them), else the built-in table (mig_table.rs). A
//! model neither knows is taken as not MIG-capable.
use std::fmt;

use serde::Serialize;

use super::mig_table;

/// Where one GPU instance may sit: its first memory slice and how many it takes
/// (`nvmlGpuInstancePlacement_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Placement {
    pub start: u32,
    pub size: u32,
}

/// One GPU instance profile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MigProfile {
    /// `1g.10gb`, `1g.10gb+me`: NVML's name without its `MIG ` prefix.
    pub name: String,
    /// Compute slices.
    pub slices: u32,
    pub memory_mib: u64,
    /// Where its instances may be placed; empty where neither NVML nor the table says.
    pub placements: Vec<Placement>,
}

impl MigProfile {
    /// Neither a `+me`/`+gfx` variant nor a `-me` one.
    pub fn is_plain(&self) -> bool {
        !self.name.contains(['+', '-'])
    }

    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib << 20
    }
}

/// Where a model's profiles come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Nvml,
    Table,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Nvml => "nvml",
            Source::Table => "table",
        })
    }
}

/// One GPU model's profiles.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelProfiles {
    /// NVML's device name (read from NVML), or the table's entry ("H100 80GB").
    pub model: String,
    /// The whole GPU's compute slices: 7, or 4 on the A30.
    pub total_slices: u32,
    /// The whole GPU's memory slices, which placements count in: 8, or 4 on the A30; 0
    /// where no profile has placements.
    pub memory_slices: u32,
    pub profiles: Vec<MigProfile>,
    pub source: Source,
}

impl ModelProfiles {
    fn from_table(m: &mig_table::TableModel) -> ModelProfiles {
        ModelProfiles {
            model: m.name.to_string(),
            total_slices: m.total_slices,
            memory_slices: m.memory_slices,
            profiles: (m.profiles.iter())
                .map(|&(name, slices, memory_mib, (starts, size))| MigProfile {
                    name: name.to_string(),
                    slices,
                    memory_mib,
                    placements: (starts.iter())
                        .map(|&start| Placement { start, size })
                        .collect(),
                })
                .collect(),
            source: Source::Table,
        }
    }

    /// Profiles with the same slices and memory as a plain one are left out: a `+me`
    /// variant takes the GPU's one media engine set and buys nothing more here.
    pub fn candidates(&self) -> impl Iterator<Item = &MigProfile> {
        self.profiles.iter().filter(|p| {
            p.is_plain()
                || !self
                    .profiles
                    .iter()
                    .any(|q| q.is_plain() && q.slices == p.slices && q.memory_mib == p.memory_mib)
        })
    }

    /// Whether the plan can place its instances: every profile has placements.
    pub fn has_placements(&self) -> bool {
        self.memory_slices > 0 && self.profiles.iter().all(|p| !p.placements.is_empty())
    }

    pub fn profile(&self, name: &str) -> Option<&MigProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }
}

/// A GPU model NVML was asked about, with what it said.
#[derive(Debug, Clone, PartialEq)]
pub struct NvmlModel {
    /// NVML's device name, as records carry it in `device_model`.
    pub name: String,
    pub memory_bytes: u64,
    /// Empty where the driver listed none (MIG mode off, or a GPU without MIG).
    pub profiles: Vec<MigProfile>,
    /// Why reading its profiles failed, if it did.
    pub error: Option<String>,
}

/// Every model's profiles: NVML's first, then the table.
#[derive(Debug, Clone, Default)]
pub struct Profiles {
    /// What this node's NVML listed, one entry per model that has profiles.
    pub nvml: Vec<ModelProfiles>,
    /// The GPU models on this node, profiles or not.
    pub node_models: Vec<NvmlModel>,
    /// Why NVML gave nothing (unavailable, no answer in time); None when it was read.
    pub nvml_error: Option<String>,
    table: Vec<ModelProfiles>,
}

impl Profiles {
    /// The built-in table alone.
    pub fn table() -> Profiles {
        Profiles {
            table: mig_table::TABLE
                .iter()
                .map(ModelProfiles::from_table)
                .collect(),
            ..Default::default()
        }
    }

    /// The table, and over it what NVML said about this node's models (`Err`: why it said
    /// nothing).
    pub fn with_nvml(read: Result<Vec<NvmlModel>, String>) -> Profiles {
        let mut p = Profiles::table();
        match read {
            Ok(models) => {
                let nvml = (models.iter())
                    .filter(|m| !m.profiles.is_empty())
                    .map(|m| p.read_from_nvml(m))
                    .collect();
                p.nvml = nvml;
                p.node_models = models;
            }
            Err(e) => p.nvml_error = Some(e),
        }
        p
    }

    /// What NVML listed for `m`; a profile it gave no placements for takes the table's
    /// (of the same name, for the same model), if the table has it.
    fn read_from_nvml(&self, m: &NvmlModel) -> ModelProfiles {
        let table = self.table_entry(&m.name, Some(m.memory_bytes));
        let profiles: Vec<MigProfile> = (m.profiles.iter())
            .map(|p| match (p.placements.is_empty(), table) {
                (true, Some(t)) => MigProfile {
                    placements: (t.profile(&p.name)).map_or(vec![], |q| q.placements.clone()),
                    ..p.clone()
                },
                _ => p.clone(),
            })
            .collect();
        let memory_slices = (profiles.iter())
            .flat_map(|p| &p.placements)
            .map(|x| x.start + x.size)
            .max()
            .unwrap_or(0);
        ModelProfiles {
            model: m.name.clone(),
            total_slices: m.profiles.iter().map(|p| p.slices).max().unwrap_or(0),
            memory_slices,
            profiles,
            source: Source::Nvml,
        }
    }

    /// The profiles of `device_model` (NVML's name; `device_memory` its memory, bytes):
    /// NVML's where this node has it, else the table's; None: not MIG-capable as far as
    /// either knows.
    pub fn for_model(
        &self,
        device_model: &str,
        device_memory: Option<u64>,
    ) -> Option<&ModelProfiles> {
        if let Some(m) = self.nvml.iter().find(|m| m.model == device_model) {
            return Some(m);
        }
        let t = mig_table::lookup(device_model, device_memory)?;
        self.table.iter().find(|m| m.model == t.name)
    }

    /// The table's entry of a model, whatever NVML said (`--profiles` compares them).
    pub fn table_entry(
        &self,
        device_model: &str,
        device_memory: Option<u64>,
    ) -> Option<&ModelProfiles> {
        let t = mig_table::lookup(device_model, device_memory)?;
        self.table.iter().find(|m| m.model == t.name)
    }

    pub fn table_models(&self) -> &[ModelProfiles] {
        &self.table
    }

    /// The part of a whole GPU a MIG device of profile `profile` (`1g.10gb`, or a compute
    /// instance's `1c.2g.20gb`) holds: its compute slices over the model's (from its
    /// table, else `gpu_model::mig_gpu_slices`).
    pub fn mig_fraction(
        &self,
        device_model: &str,
        device_memory: Option<u64>,
        profile: &str,
    ) -> f64 {
        let total = self.for_model(device_model, device_memory).map_or_else(
            || gpu_model::mig_gpu_slices(device_model),
            |m| m.total_slices,
        );
        gpu_model::mig_part(profile, total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1 << 30;

    fn mig(name: &str, slices: u32, memory_mib: u64) -> MigProfile {
        MigProfile {
            name: name.into(),
            slices,
            memory_mib,
            placements: vec![],
        }
    }

    #[test]
    fn nvml_wins_over_the_table_for_the_models_it_read() {
        let read = vec![
            NvmlModel {
                name: "NVIDIA H200".into(),
                memory_bytes: 141 * GB,
                profiles: vec![mig("1g.18gb", 1, 16384), mig("7g.141gb", 7, 143000)],
                error: None,
            },
            NvmlModel {
                name: "NVIDIA L4".into(),
                memory_bytes: 23034 << 20,
                profiles: vec![],
                error: None,
            },
        ];
        let p = Profiles::with_nvml(Ok(read));
        let h200 = p.for_model("NVIDIA H200", Some(141 * GB)).unwrap();
        assert_eq!((h200.source, h200.total_slices), (Source::Nvml, 7));
        assert_eq!(h200.profiles[0].memory_mib, 16384);
        assert_eq!(
            p.table_entry("NVIDIA H200", None).unwrap().source,
            Source::Table
        );
        // A model NVML did not read comes from the table; one neither knows has none.
        let h100 = p.for_model("NVIDIA H100 80GB HBM3", None).unwrap();
        assert_eq!(
            (h100.source, h100.model.as_str()),
            (Source::Table, "H100 80GB")
        );
        assert!(p.for_model("NVIDIA L4", Some(23034 << 20)).is_none());
        assert_eq!(p.node_models.len(), 2);
        let failed = Profiles::with_nvml(Err("no driver".into()));
        assert_eq!(failed.nvml_error.as_deref(), Some("no driver"));
        assert!(failed.nvml.is_empty());
    }

    #[test]
    fn variants_give_way_to_the_plain_profile_of_the_same_size() {
        let m = ModelProfiles {
            model: "x".into(),
            total_slices: 7,
            memory_slices: 8,
            profiles: vec![
                mig("1g.10gb+me", 1, 9984),
                mig("1g.10gb", 1, 9984),
                mig("1g.10gb-me", 1, 9984),
                mig("1g.20gb+gfx", 1, 20096),
            ],
            source: Source::Nvml,
        };
        let names: Vec<&str> = m.candidates().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["1g.10gb", "1g.20gb+gfx"]);
    }

    #[test]
    fn a_mig_device_holds_its_compute_slices_over_the_models() {
        let p = Profiles::table();
        let f = |model: &str, profile: &str| p.mig_fraction(model, None, profile);
        assert!((f("NVIDIA H100 80GB HBM3", "3g.40gb") - 3.0 / 7.0).abs() < 1e-12);
        assert!((f("NVIDIA A30", "1g.6gb") - 0.25).abs() < 1e-12);
        assert!((f("NVIDIA A100-SXM4-80GB", "1c.3g.40gb") - 1.0 / 7.0).abs() < 1e-12);
        assert!((f("unknown GPU", "2g.20gb") - 2.0 / 7.0).abs() < 1e-12);
    }
}
