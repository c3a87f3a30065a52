//! `rightsize --plan`: the recommendations as a layout per GPU model, and the GPUs that
//! layout frees (docs/rightsizing.md, "The plan").
//!
//! Per GPU model:
//! - each instance of a `mig` workload (its containers on a device at once, on average,
//!   rounded) needs one device of its profile; they are packed onto GPUs under the model's
//!   placement rules (pack.rs);
//! - the `time-slice` and `mps` workloads that fit k replicas of a GPU go to GPUs cut into
//!   k replicas: ceil(instances / k) GPUs for each k;
//! - `keep` needs a whole GPU per instance; `insufficient-data` stays as it is (its MIG
//!   profile, else whole GPUs); `release` needs nothing.
//!
//! GPUs held = the allocations summed, rounded up; freed = held - needed.
pub mod pack;
pub mod render;

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    profiles::{ModelProfiles, Profiles},
    recommend::{recommend, Kind, Recommendation, Settings},
    usage::{Usage, WorkloadKey},
};
use pack::{pack, Rules};

/// Float slack, as in recommend.rs.
const EPS: f64 = 1e-9;

/// How a GPU is shared among the containers that get a replica of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sharing {
    TimeSlicing,
    Mps,
}

impl Sharing {
    pub fn as_str(self) -> &'static str {
        match self {
            Sharing::TimeSlicing => "time-slicing",
            Sharing::Mps => "mps",
        }
    }
}

/// What one layout's GPUs are.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cut {
    /// MIG devices; the mig-parted config's name.
    Mig { config: String },
    /// Replicas of the whole GPU.
    Shared { sharing: Sharing, replicas: u32 },
    /// Whole GPUs, as they are.
    Whole,
}

/// GPUs cut alike, and the workloads on them: the JSON's `layouts[]`, field for field.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Layout {
    pub gpus: u32,
    /// Devices per GPU by MIG profile (spares included); empty where not MIG.
    pub mig_devices: BTreeMap<String, u32>,
    /// Replicas per GPU under time-slicing or MPS.
    pub replicas: Option<u32>,
    /// `<namespace>/<kind>/<name>`.
    pub workloads: Vec<String>,
    #[serde(skip)]
    pub cut: Cut,
}

/// One GPU model's plan: the JSON's `plan` object, field for field.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelPlan {
    pub model: String,
    pub gpus_held: u32,
    pub gpus_needed: u32,
    pub gpus_freed: u32,
    pub layouts: Vec<Layout>,
    /// Whether the MIG packing is the fewest GPUs possible; None where there is none.
    #[serde(skip)]
    pub exact: Option<bool>,
}

/// What a workload should ask for under the plan.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// One device of this profile per container.
    Mig { profile: String },
    /// One replica per container, on GPUs cut into `replicas`.
    Shared { sharing: Sharing, replicas: u32 },
    /// Its GPUs as they are (keep, insufficient data).
    AsIs,
    /// No GPU.
    Release,
}

/// One workload's part in the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadPlan {
    pub key: WorkloadKey,
    /// The containers its records name.
    pub containers: Vec<String>,
    pub target: Target,
    /// The MIG profile it holds now, if it is on MIG.
    pub mig_profile: Option<String>,
    /// Its MPS limits (thread percentage, pinned memory bytes), under MPS.
    pub mps_limits: Option<(u32, u64)>,
}

/// The whole plan.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub models: Vec<ModelPlan>,
    pub workloads: Vec<WorkloadPlan>,
    /// For the footer: how each model was packed, and what could not be planned as advised.
    pub notes: Vec<String>,
}

impl Plan {
    pub fn held(&self) -> u32 {
        self.models.iter().map(|m| m.gpus_held).sum()
    }

    pub fn freed(&self) -> u32 {
        self.models.iter().map(|m| m.gpus_freed).sum()
    }
}

/// `<namespace>/<kind>/<name>`.
pub fn workload_name(k: &WorkloadKey) -> String {
    format!("{}/{}/{}", k.namespace, k.workload_kind, k.workload)
}

/// A workload's instances: its containers on a device at once, on average, rounded (at
/// least one).
fn instances(u: &Usage) -> u32 {
    (u.instances.round() as u32).max(1)
}

/// What one workload needs of its model.
enum Need {
    Mig(String, u32),
    Shared(Sharing, u32, u32),
    Whole(u32),
    None,
}

/// The plan for `items` (each workload's usage and recommendation).
pub fn plan(items: &[(&Usage, &Recommendation)], s: &Settings, profiles: &Profiles) -> Plan {
    let mut by_model: BTreeMap<&str, Vec<(&Usage, &Recommendation)>> = BTreeMap::new();
    for (u, r) in items {
        by_model
            .entry(&u.key.device_model)
            .or_default()
            .push((u, r));
    }
    let mut out = Plan::default();
    for (model, items) in by_model {
        let mig = profiles.for_model(model, items[0].0.device_memory_bytes);
        let needs: Vec<Need> = (items.iter())
            .map(|(u, r)| need(u, r, s, profiles, mig, &mut out.notes))
            .collect();
        let (m, targets) = model_plan(model, &items, &needs, mig);
        if let Some(exact) = m.exact {
            out.notes.push(format!(
                "MIG packing of {model}: {}",
                match exact {
                    true => "exact (the fewest GPUs the placements allow)",
                    false => "first-fit decreasing (too many instances to be exact)",
                }
            ));
        }
        out.models.push(m);
        for ((u, r), target) in items.iter().zip(targets) {
            let mps = matches!(
                target,
                Target::Shared {
                    sharing: Sharing::Mps,
                    ..
                }
            );
            out.workloads.push(WorkloadPlan {
                key: u.key.clone(),
                containers: u.containers.clone(),
                target,
                mig_profile: u.mig_profile.clone(),
                mps_limits: (r.mps_thread_pct.zip(r.mps_mem_limit_bytes)).filter(|_| mps),
            });
        }
    }
    out
}

/// What `u` needs under its recommendation `r`. A `mig` one on a model without
/// placements is planned as time-slicing instead, and said in `notes`.
fn need(
    u: &Usage,
    r: &Recommendation,
    s: &Settings,
    profiles: &Profiles,
    mig: Option<&ModelProfiles>,
    notes: &mut Vec<String>,
) -> Need {
    let n = instances(u);
    let placed =
        |p: &str| mig.is_some_and(|m| m.profile(p).is_some_and(|p| !p.placements.is_empty()));
    match r.kind {
        Kind::Release => Need::None,
        Kind::Keep => Need::Whole(n),
        Kind::InsufficientData => match &u.mig_profile {
            Some(p) if placed(p) => Need::Mig(p.clone(), n),
            _ => Need::Whole(((u.gpus_allocated - 0.05).ceil() as u32).max(1)),
        },
        Kind::Mig => match r.profile.as_deref() {
            Some(p) if placed(p) => Need::Mig(p.to_string(), n),
            _ => {
                let note = format!(
                    "{}: no MIG placements for {} (neither NVML nor the table): planned as time-slicing",
                    workload_name(&u.key),
                    u.key.device_model
                );
                if !notes.contains(&note) {
                    notes.push(note);
                }
                let plain = Settings {
                    mig: false,
                    mps: false,
                    ..s.clone()
                };
                need(
                    u,
                    &recommend(u, &plain, profiles),
                    &plain,
                    profiles,
                    None,
                    notes,
                )
            }
        },
        Kind::TimeSlice => {
            let k = (1.0 / r.share.unwrap_or(1.0)).round() as u32;
            shared(Sharing::TimeSlicing, k, n)
        }
        Kind::Mps => {
            let k = (1.0 / r.fraction.max(EPS) + EPS)
                .floor()
                .min(f64::from(u32::MAX)) as u32;
            shared(Sharing::Mps, k, n)
        }
    }
}

fn shared(sharing: Sharing, k: u32, n: u32) -> Need {
    match k >= 2 {
        true => Need::Shared(sharing, k, n),
        false => Need::Whole(n),
    }
}

/// One model's layouts, and each workload's target.
fn model_plan(
    model: &str,
    items: &[(&Usage, &Recommendation)],
    needs: &[Need],
    mig: Option<&ModelProfiles>,
) -> (ModelPlan, Vec<Target>) {
    let held: f64 = items.iter().map(|(u, _)| u.gpus_allocated).sum();
    let held = ((held * 1e4).round() / 1e4 - EPS).ceil().max(0.0) as u32;
    let mut layouts = vec![];
    let mut exact = None;
    if let Some(m) = mig {
        if let Some((l, e)) = mig_layouts(model, m, items, needs) {
            layouts.extend(l);
            exact = Some(e);
        }
    }
    layouts.extend(shared_layouts(items, needs));
    let whole: Vec<String> = (items.iter().zip(needs))
        .filter(|(_, n)| matches!(n, Need::Whole(_)))
        .map(|((u, _), _)| workload_name(&u.key))
        .collect();
    let whole_gpus: u32 = (needs.iter())
        .map(|n| match n {
            Need::Whole(g) => *g,
            _ => 0,
        })
        .sum();
    if whole_gpus > 0 {
        layouts.push(Layout {
            gpus: whole_gpus,
            mig_devices: BTreeMap::new(),
            replicas: None,
            workloads: whole,
            cut: Cut::Whole,
        });
    }
    let needed = layouts.iter().map(|l| l.gpus).sum();
    let targets = (needs.iter())
        .map(|n| match n {
            Need::Mig(p, _) => Target::Mig { profile: p.clone() },
            Need::Shared(sharing, k, _) => Target::Shared {
                sharing: *sharing,
                replicas: *k,
            },
            Need::Whole(_) => Target::AsIs,
            Need::None => Target::Release,
        })
        .collect();
    let plan = ModelPlan {
        model: model.to_string(),
        gpus_held: held,
        gpus_needed: needed,
        gpus_freed: held.saturating_sub(needed),
        layouts,
        exact,
    };
    (plan, targets)
}

/// The MIG instances packed, and the GPUs grouped by their devices; whether the packing is
/// exact. None where no workload needs a MIG device.
fn mig_layouts(
    model: &str,
    m: &ModelProfiles,
    items: &[(&Usage, &Recommendation)],
    needs: &[Need],
) -> Option<(Vec<Layout>, bool)> {
    // Profiles in the model's order; each workload's instances, in the items' order.
    let mut names: Vec<String> = vec![];
    for p in &m.profiles {
        if needs
            .iter()
            .any(|n| matches!(n, Need::Mig(q, _) if *q == p.name))
        {
            names.push(p.name.clone());
        }
    }
    if names.is_empty() {
        return None;
    }
    let rules = Rules::of(m, &names)?;
    let mut queue: Vec<Vec<String>> = vec![vec![]; names.len()];
    for ((u, _), n) in items.iter().zip(needs) {
        if let Need::Mig(p, count) = n {
            let s = names.iter().position(|q| q == p)?;
            queue[s].extend(std::iter::repeat_n(workload_name(&u.key), *count as usize));
        }
    }
    let demand: Vec<u32> = queue.iter().map(|q| q.len() as u32).collect();
    let packing = pack(&rules, &demand);
    let mut next = vec![0usize; names.len()];
    let mut groups: BTreeMap<Vec<u32>, Layout> = BTreeMap::new();
    for gpu in &packing.gpus {
        let counts = gpu.counts(names.len());
        let l = groups.entry(counts.clone()).or_insert_with(|| Layout {
            gpus: 0,
            mig_devices: (names.iter().zip(&counts))
                .filter(|(_, c)| **c > 0)
                .map(|(n, c)| (n.clone(), *c))
                .collect(),
            replicas: None,
            workloads: vec![],
            cut: Cut::Mig {
                config: config_name(model, &names, &counts),
            },
        });
        l.gpus += 1;
        for (s, _) in &gpu.devices {
            if let Some(w) = queue[*s].get(next[*s]) {
                next[*s] += 1;
                if !l.workloads.contains(w) {
                    l.workloads.push(w.clone());
                }
            }
        }
    }
    let mut layouts: Vec<Layout> = groups.into_values().collect();
    layouts.sort_by(|a, b| b.gpus.cmp(&a.gpus).then_with(|| a.cut.cmp(&b.cut)));
    Some((layouts, packing.exact))
}

/// Per sharing and replica count k: ceil(instances / k) GPUs.
fn shared_layouts(items: &[(&Usage, &Recommendation)], needs: &[Need]) -> Vec<Layout> {
    let mut groups: BTreeMap<(Sharing, u32), (u32, Vec<String>)> = BTreeMap::new();
    for ((u, _), n) in items.iter().zip(needs) {
        if let Need::Shared(sharing, k, count) = n {
            let g = groups.entry((*sharing, *k)).or_default();
            g.0 += count;
            g.1.push(workload_name(&u.key));
        }
    }
    (groups.into_iter().rev())
        .map(|((sharing, k), (count, workloads))| Layout {
            gpus: count.div_ceil(k),
            mig_devices: BTreeMap::new(),
            replicas: Some(k),
            workloads,
            cut: Cut::Shared {
                sharing,
                replicas: k,
            },
        })
        .collect()
}

/// A GPU model as a label value's part: `NVIDIA H100 80GB HBM3` -> `h100-80gb-hbm3`.
pub fn slug(model: &str) -> String {
    let lower = model.to_ascii_lowercase();
    let lower = lower.strip_prefix("nvidia ").unwrap_or(&lower);
    let mut s = String::new();
    for c in lower.chars() {
        match c.is_ascii_alphanumeric() {
            true => s.push(c),
            false if !s.ends_with('-') && !s.is_empty() => s.push('-'),
            false => {}
        }
    }
    s.trim_end_matches('-').to_string()
}

/// The mig-parted config of a layout: `h100-80gb-hbm3-1x4g.40gb-1x3g.40gb`, a valid label
/// value (63 characters at most: longer ones are cut and end in a hash of the whole).
fn config_name(model: &str, names: &[String], counts: &[u32]) -> String {
    let mut s = slug(model);
    for (n, c) in names.iter().zip(counts).rev() {
        if *c > 0 {
            s += &format!("-{c}x{n}");
        }
    }
    let s: String = (s.chars())
        .map(
            |c| match c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                true => c,
                false => '_',
            },
        )
        .collect();
    if s.len() <= 63 {
        return s;
    }
    let hash = s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    format!("{}-{:08x}", &s[..54], hash as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rightsize::{
        profiles::{MigProfile, NvmlModel},
        recommend::tests::{settings, usage as week_of},
    };

    const GIB: u64 = 1 << 30;
    const H100: &str = "NVIDIA H100 80GB HBM3";
    const L4: &str = "NVIDIA L4";

    fn usage(name: &str, model: &str, peak_gib: u64, sm_pct: u32) -> Usage {
        let memory = match model {
            L4 => 23034 << 20,
            _ => 85_520_809_984,
        };
        let mut u = week_of(model, memory, peak_gib, sm_pct);
        u.key.workload = name.into();
        u.containers = vec!["main".into()];
        u
    }

    fn plan_of(usages: &[Usage], profiles: &Profiles) -> Plan {
        let recs: Vec<Recommendation> = (usages.iter())
            .map(|u| recommend(u, &settings(), profiles))
            .collect();
        let items: Vec<(&Usage, &Recommendation)> = usages.iter().zip(&recs).collect();
        plan(&items, &settings(), profiles)
    }

    #[test]
    fn three_3g_workloads_free_one_h100_not_one_point_seven() {
        // 30 GiB and 35 % each: 3g.40gb, 4/7 of a GPU saved each on paper.
        let u: Vec<Usage> = ["infer-a", "infer-b", "infer-c"]
            .iter()
            .map(|n| usage(n, H100, 30, 35))
            .collect();
        let p = plan_of(&u, &Profiles::table());
        let m = &p.models[0];
        assert_eq!(
            (m.gpus_held, m.gpus_needed, m.gpus_freed),
            (3, 2, 1),
            "{m:#?}"
        );
        assert_eq!(m.exact, Some(true));
        assert_eq!(m.layouts.len(), 1);
        let l = &m.layouts[0];
        assert_eq!(l.gpus, 2);
        assert_eq!(l.mig_devices, BTreeMap::from([("3g.40gb".to_string(), 2)]));
        assert_eq!(
            l.workloads,
            [
                "ml/Deployment/infer-a",
                "ml/Deployment/infer-b",
                "ml/Deployment/infer-c"
            ]
        );
        assert_eq!(
            render::table(&p),
            "\nplan:\nNVIDIA H100 80GB HBM3: 3 GPUs held, 2 needed, 1 freed\n  \
             2 GPUs as 3g.40gb + 3g.40gb: ml/infer-a, ml/infer-b, ml/infer-c\n"
        );
        assert_eq!(
            l.cut,
            Cut::Mig {
                config: "h100-80gb-hbm3-2x3g.40gb".into()
            }
        );
        assert!(p.workloads.iter().all(|w| w.target
            == Target::Mig {
                profile: "3g.40gb".into()
            }));
    }

    #[test]
    fn mixed_profiles_share_gpus_and_keep_release_and_time_slice_count_whole() {
        let mut u = vec![
            usage("big", H100, 30, 45),   // 4g.40gb
            usage("mid", H100, 30, 35),   // 3g.40gb
            usage("train", H100, 75, 95), // keep
            usage("idle", H100, 0, 0),    // release
        ];
        u[3].used = false;
        // An L4 has no MIG: four workloads that fit a third of one.
        for n in ["ocr-a", "ocr-b", "ocr-c", "ocr-d"] {
            u.push(usage(n, L4, 6, 15));
        }
        let p = plan_of(&u, &Profiles::table());
        let h100 = p.models.iter().find(|m| m.model == H100).unwrap();
        assert_eq!(
            (h100.gpus_held, h100.gpus_needed, h100.gpus_freed),
            (4, 2, 2)
        );
        let described: Vec<String> = h100.layouts.iter().map(render::describe).collect();
        assert_eq!(described, ["1 GPU as 4g.40gb + 3g.40gb", "1 GPU whole"]);
        let l4 = p.models.iter().find(|m| m.model == L4).unwrap();
        assert_eq!((l4.gpus_held, l4.gpus_needed, l4.gpus_freed), (4, 2, 2));
        assert_eq!(l4.layouts[0].replicas, Some(3));
        assert_eq!(l4.exact, None);
        assert_eq!((p.freed(), p.held()), (4, 8));
        let json = render::json_lines(&p);
        let first: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
        let keys: Vec<&String> = first["plan"].as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            ["gpus_freed", "gpus_held", "gpus_needed", "layouts", "model"]
        );
        let l = first["plan"]["layouts"][0].as_object().unwrap();
        let keys: Vec<&String> = l.keys().collect();
        assert_eq!(keys, ["gpus", "mig_devices", "replicas", "workloads"]);
        assert!(l["replicas"].is_null());
        assert_eq!(l["mig_devices"]["4g.40gb"], 1);
        let csv = render::csv(&p, |s| s.to_string());
        assert!(csv.contains("\nNVIDIA L4,4,2,2,2,,3,ml/Deployment/ocr-a ml/Deployment/ocr-b"));
    }

    #[test]
    fn a_model_without_placements_is_time_sliced_with_a_note() {
        // This node's NVML lists profiles for a GPU the table does not know, and no
        // placements: the plan cannot pack them.
        let model = "NVIDIA Future GPU";
        let read = vec![NvmlModel {
            name: model.into(),
            memory_bytes: 80 * GIB,
            profiles: vec![
                MigProfile {
                    name: "1g.10gb".into(),
                    slices: 1,
                    memory_mib: 10240,
                    placements: vec![],
                },
                MigProfile {
                    name: "7g.80gb".into(),
                    slices: 7,
                    memory_mib: 81920,
                    placements: vec![],
                },
            ],
            error: None,
        }];
        let profiles = Profiles::with_nvml(Ok(read));
        let mut u = usage("small", model, 7, 10);
        u.device_memory_bytes = Some(80 * GIB);
        let r = recommend(&u, &settings(), &profiles);
        assert_eq!(r.kind, Kind::Mig, "advice still names the profile");
        let p = plan_of(&[u], &profiles);
        assert_eq!(
            p.workloads[0].target,
            Target::Shared {
                sharing: Sharing::TimeSlicing,
                replicas: 8
            }
        );
        assert!(
            p.notes
                .iter()
                .any(|n| n.contains("no MIG placements for NVIDIA Future GPU")),
            "{:?}",
            p.notes
        );
    }

    #[test]
    fn nvml_placements_win_and_missing_ones_come_from_the_table() {
        use crate::rightsize::profiles::Placement;
        let at = |starts: &[u32], size| -> Vec<Placement> {
            starts
                .iter()
                .map(|&start| Placement { start, size })
                .collect()
        };
        // This driver lets 3g.40gb start at 0 only (a made-up rule) and says nothing of
        // 7g.80gb's placements.
        let read = vec![NvmlModel {
            name: H100.into(),
            memory_bytes: 85_520_809_984,
            profiles: vec![
                MigProfile {
                    name: "3g.40gb".into(),
                    slices: 3,
                    memory_mib: 40448,
                    placements: at(&[0], 4),
                },
                MigProfile {
                    name: "7g.80gb".into(),
                    slices: 7,
                    memory_mib: 81152,
                    placements: vec![],
                },
            ],
            error: None,
        }];
        let profiles = Profiles::with_nvml(Ok(read));
        let m = profiles.for_model(H100, None).unwrap();
        assert_eq!(m.memory_slices, 8);
        assert_eq!(m.profile("7g.80gb").unwrap().placements, at(&[0], 8));
        let u: Vec<Usage> = ["a", "b"].iter().map(|n| usage(n, H100, 30, 35)).collect();
        let p = plan_of(&u, &profiles);
        assert_eq!(p.models[0].gpus_needed, 2, "{:#?}", p.models[0]);
    }

    #[test]
    fn slugs_and_config_names_are_label_values() {
        assert_eq!(slug("NVIDIA H100 80GB HBM3"), "h100-80gb-hbm3");
        assert_eq!(slug("NVIDIA A100-SXM4-40GB"), "a100-sxm4-40gb");
        let names: Vec<String> = (1..=9).map(|i| format!("{i}g.{i}00gb+me")).collect();
        let long = config_name("NVIDIA Some Very Long GPU Name 80GB", &names, &[1; 9]);
        assert!(long.len() <= 63, "{long}");
        assert!(long
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c)));
    }
}
