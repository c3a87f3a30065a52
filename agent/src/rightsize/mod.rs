//! `gpu-agent rightsize`: which workloads fit a smaller share of a GPU (a MIG profile, a
//! time-slicing replica, MPS limits), and how many GPUs that gives back, from the usage
//! records (docs/rightsizing.md).
//!
//! The arithmetic is in three steps that another source of the same figures (Prometheus'
//! recording rules) can share:
//! 1. usage.rs: records -> one `Usage` per workload and GPU model (`aggregate`), or
//!    prometheus.rs: the recording rules' series -> the same `Usage`s (`usages`);
//! 2. recommend.rs: `recommend(&Usage, &Settings, &Profiles) -> Recommendation`, pure;
//! 3. render.rs: `Line::new(&Usage, Recommendation)`, then a table, CSV or JSON lines.
//!
//! With `--plan`, plan/ turns the recommendations into a layout per GPU model (the MIG
//! devices packed under the placement rules, the time-slicing and MPS replicas), and
//! emit/ writes the files that apply it.
//!
//! The MIG profiles come from profiles.rs: this node's NVML (nvml.rs) where it has the
//! model, else the built-in table (mig_table.rs).
pub mod emit;
pub mod mig_table;
pub mod nvml;
pub mod plan;
pub mod profiles;
pub mod prometheus;
pub mod recommend;
pub mod render;
pub mod usage;

use std::{fmt::Write as _, path::PathBuf, time::Duration};

pub use profiles::{MigProfile, ModelProfiles, NvmlModel, Profiles, Source};
pub use recommend::{recommend, Kind, Recommendation, Settings};
pub use render::Line;
pub use usage::{aggregate, Aggregate, Usage, Window, WorkloadKey};

use crate::sinks::usage::{read, report::Format};

/// What to sum the recommendations by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    Workload,
    Namespace,
}

/// Where the usage comes from.
pub enum From {
    /// The usage-record file (its rotated files are read too).
    File(PathBuf),
    /// The recording rules' series in Prometheus.
    Prometheus(prometheus::Source),
}

pub struct Options {
    pub from: From,
    pub since: Duration,
    /// The window's end, unix ms (now).
    pub now_ms: u64,
    pub settings: Settings,
    pub by: By,
    pub format: Format,
    /// Plan the layout per GPU model (`--plan`).
    pub plan: bool,
}

/// What a run gives: the output, the plan where asked, and what was left out of the input.
pub struct Outcome {
    pub out: String,
    pub plan: Option<plan::Plan>,
    /// What was left out of the input, by reason, one line each (for stderr).
    pub left_out: Vec<String>,
}

/// `--headroom`: a number from 0 to 10 (0.2 is 20 %).
pub fn parse_headroom(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(h) if h.is_finite() && (0.0..=10.0).contains(&h) => Ok(h),
        _ => Err(format!(
            "{s:?}: give a number from 0 to 10, e.g. 0.2 for 20 %"
        )),
    }
}

/// The recommendations (and the plan), rendered, and how many lines of the files could not
/// be read.
pub fn run(o: &Options, profiles: &Profiles) -> Result<Outcome, String> {
    let window = Window {
        from_ms: o.now_ms.saturating_sub(o.since.as_millis() as u64),
        to_ms: o.now_ms,
    };
    let (usages, left_out, notes) = match &o.from {
        From::File(file) => {
            let mut a = usage::Aggregate::new(window, profiles);
            let left = read::for_each_record(file, o.now_ms, |r| a.add(&r))?;
            (a.finish(), left.lines(), vec![])
        }
        From::Prometheus(src) => {
            let (usages, left, notes) = prometheus::usages(src, window, profiles)?;
            (usages, left, notes)
        }
    };
    let recs: Vec<Recommendation> = (usages.iter())
        .map(|u| recommend(u, &o.settings, profiles))
        .collect();
    let mut lines: Vec<Line> = (usages.iter().zip(&recs))
        .map(|(u, r)| Line::new(u, r.clone()))
        .collect();
    render::sort(&mut lines);
    let mut footer = footer(o, &usages, profiles);
    footer.notes.extend(notes);
    let plan = o.plan.then(|| {
        let items: Vec<(&Usage, &Recommendation)> = usages.iter().zip(&recs).collect();
        plan::plan(&items, &o.settings, profiles)
    });
    if let Some(p) = &plan {
        footer.notes.extend(p.notes.iter().cloned());
        footer.plan = Some((plan::render::table(p), p.freed(), p.held()));
    }
    let mut out = match o.by {
        By::Workload => render::workloads(&lines, o.format, &footer),
        By::Namespace => render::namespaces(&lines, o.format, &footer),
    };
    match (&plan, o.format) {
        (Some(p), Format::Json) => out += &plan::render::json_lines(p),
        (Some(p), Format::Csv) => out += &format!("\n{}", plan::render::csv(p, render::csv_field)),
        _ => {}
    }
    Ok(Outcome {
        out,
        plan,
        left_out,
    })
}

/// The settings, and where each GPU model's MIG profiles came from.
fn footer(o: &Options, usages: &[Usage], profiles: &Profiles) -> render::Footer {
    let s = &o.settings;
    let mode = match (s.mps, s.mig) {
        (true, _) => "MPS",
        (false, true) => "MIG where the GPU has it, else time-slicing",
        (false, false) => "time-slicing (--no-mig)",
    };
    let settings = format!(
        "window {}, headroom {}%, min coverage {}, {mode}",
        render::human_secs(o.since.as_secs_f64()),
        (s.headroom * 100.0).round(),
        render::human_secs(s.min_coverage_s),
    );
    let mut notes = vec![];
    let mut seen: Vec<&str> = vec![];
    for u in usages {
        let model = u.key.device_model.as_str();
        if seen.contains(&model) {
            continue;
        }
        seen.push(model);
        let from = match profiles.for_model(model, u.device_memory_bytes) {
            Some(m) if m.source == Source::Nvml => "this node's NVML".to_string(),
            Some(m) => format!("the built-in table ({})", m.model),
            None => "none (no MIG: time-slicing)".to_string(),
        };
        notes.push(format!("MIG profiles of {model}: {from}"));
    }
    if let Some(e) = &profiles.nvml_error {
        notes.push(format!("NVML: {e}"));
    }
    render::Footer {
        settings,
        notes,
        plan: None,
    }
}

/// `--profiles`: one line per profile, tab-separated (model, profile, slices, total slices,
/// memory MiB, source): each GPU model on this node as its NVML lists it and as the table
/// has it, then the rest of the table. `#` lines say what NVML said.
pub fn list_profiles(p: &Profiles) -> String {
    let mut s = String::from("# model\tprofile\tslices\ttotal_slices\tmemory_mib\tsource\n");
    let line = |s: &mut String, model: &str, m: &ModelProfiles, source: &str| {
        for x in &m.profiles {
            let (n, sl, t, mib) = (&x.name, x.slices, m.total_slices, x.memory_mib);
            let _ = writeln!(s, "{model}\t{n}\t{sl}\t{t}\t{mib}\t{source}");
        }
    };
    if let Some(e) = &p.nvml_error {
        let _ = writeln!(s, "# NVML: {e}");
    }
    let mut shown: Vec<&str> = vec![];
    for n in &p.node_models {
        let mem = Some(n.memory_bytes);
        match (&n.error, n.profiles.is_empty()) {
            (Some(e), _) => {
                let _ = writeln!(s, "# {}: NVML: {e}", n.name);
            }
            (None, true) => {
                let _ = writeln!(s, "# {}: NVML lists no MIG profiles", n.name);
            }
            (None, false) => {}
        }
        if let Some(m) = p.nvml.iter().find(|m| m.model == n.name) {
            line(&mut s, &n.name, m, "nvml");
        }
        if let Some(t) = p.table_entry(&n.name, mem) {
            line(&mut s, &n.name, t, &format!("table:{}", t.model));
            shown.push(&t.model);
        }
    }
    for t in p
        .table_models()
        .iter()
        .filter(|t| !shown.contains(&t.model.as_str()))
    {
        line(&mut s, &t.model, t, "table");
    }
    s
}
