//! The plan as a table section, CSV rows or JSON lines (`{"plan": {...}}` per model).
use std::fmt::Write as _;

use super::{Cut, Layout, ModelPlan, Plan};

/// `2 GPUs as 3g.40gb + 3g.40gb`, `1 GPU as time-slicing x3`, `3 GPUs whole`.
pub fn describe(l: &Layout) -> String {
    let gpus = gpus(l.gpus);
    match &l.cut {
        Cut::Mig { .. } => {
            let mut devices: Vec<(&String, &u32)> = l.mig_devices.iter().collect();
            // Largest first: the profile's compute slices lead its name.
            devices.sort_by_key(|(p, _)| std::cmp::Reverse(leading_number(p)));
            let each: Vec<&str> = (devices.iter())
                .flat_map(|(p, c)| std::iter::repeat_n(p.as_str(), **c as usize))
                .collect();
            format!("{gpus} as {}", each.join(" + "))
        }
        Cut::Shared { sharing, replicas } => {
            format!("{gpus} as {} x{replicas}", sharing.as_str())
        }
        Cut::Whole => format!("{gpus} whole"),
    }
}

/// `1 GPU`, `2 GPUs`.
pub fn gpus(n: u32) -> String {
    match n {
        1 => "1 GPU".to_string(),
        n => format!("{n} GPUs"),
    }
}

fn leading_number(p: &str) -> u32 {
    let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or(0)
}

/// `ml/infer-a`: the namespace and name of `<namespace>/<kind>/<name>`.
fn short(w: &str) -> String {
    let mut parts = w.splitn(3, '/');
    let (ns, _, name) = (parts.next(), parts.next(), parts.next());
    format!("{}/{}", ns.unwrap_or(""), name.unwrap_or(""))
}

/// The table's plan section: per model its figures, then one line per layout.
pub fn table(plan: &Plan) -> String {
    let mut s = String::from("\nplan:\n");
    for m in &plan.models {
        let _ = writeln!(
            s,
            "{}: {} held, {} needed, {} freed",
            m.model,
            gpus(m.gpus_held),
            m.gpus_needed,
            m.gpus_freed
        );
        for l in &m.layouts {
            let names: Vec<String> = l.workloads.iter().map(|w| short(w)).collect();
            let _ = writeln!(s, "  {}: {}", describe(l), names.join(", "));
        }
    }
    s
}

/// One JSON object per model: `{"plan": {...}}`.
pub fn json_lines(plan: &Plan) -> String {
    #[derive(serde::Serialize)]
    struct Wrapped<'a> {
        plan: &'a ModelPlan,
    }
    let mut s = String::new();
    for m in &plan.models {
        s += &serde_json::to_string(&Wrapped { plan: m }).unwrap_or_default();
        s.push('\n');
    }
    s
}

pub const CSV_HEADER: &str =
    "model,gpus_held,gpus_needed,gpus_freed,layout_gpus,mig_devices,replicas,workloads";

/// A header, then one row per layout (a model without layouts: one row, its layout fields
/// empty). `mig_devices` is `profile:count` space-separated; `workloads` space-separated.
pub fn csv(plan: &Plan, field: impl Fn(&str) -> String) -> String {
    let mut s = format!("{CSV_HEADER}\n");
    for m in &plan.models {
        let head = [
            field(&m.model),
            m.gpus_held.to_string(),
            m.gpus_needed.to_string(),
            m.gpus_freed.to_string(),
        ]
        .join(",");
        if m.layouts.is_empty() {
            let _ = writeln!(s, "{head},,,,");
        }
        for l in &m.layouts {
            let devices: Vec<String> = (l.mig_devices.iter())
                .map(|(p, c)| format!("{p}:{c}"))
                .collect();
            let replicas = l.replicas.map_or(String::new(), |r| r.to_string());
            let _ = writeln!(
                s,
                "{head},{},{},{replicas},{}",
                l.gpus,
                field(&devices.join(" ")),
                field(&l.workloads.join(" "))
            );
        }
    }
    s
}
