//! The recommendations as a table for people, CSV or JSON lines, per workload or summed
//! per namespace.
use std::{collections::BTreeMap, fmt::Write as _};

use serde::Serialize;

use super::{
    recommend::{Kind, Recommendation},
    usage::Usage,
};
use crate::sinks::usage::report::Format;

/// One workload on one GPU model: the JSON output's object, field for field.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Line {
    pub namespace: String,
    pub workload_kind: String,
    pub workload: String,
    pub device_model: String,
    /// GPUs held at once, on average over its lifespan.
    pub gpus_allocated: f64,
    pub coverage_s: f64,
    pub memory_peak_bytes: u64,
    /// The highest p95 of SM use of any stretch, percent of a whole GPU.
    pub sm_p95: Option<f64>,
    pub recommendation: Recommendation,
    pub gpus_saved: f64,
}

/// Rounded to `places` decimals, so that the output reads the same whatever the sum's order.
fn round(x: f64, places: i32) -> f64 {
    let m = 10f64.powi(places);
    (x * m).round() / m
}

impl Line {
    pub fn new(u: &Usage, mut r: Recommendation) -> Line {
        r.share = r.share.map(|s| round(s, 4));
        Line {
            namespace: u.key.namespace.clone(),
            workload_kind: u.key.workload_kind.clone(),
            workload: u.key.workload.clone(),
            device_model: u.key.device_model.clone(),
            gpus_allocated: round(u.gpus_allocated, 4),
            coverage_s: round(u.coverage_s, 3),
            memory_peak_bytes: u.memory_peak_bytes,
            sm_p95: u.sm_p95.map(|s| round(s * 100.0, 2)),
            gpus_saved: round(r.gpus_saved, 4),
            recommendation: r,
        }
    }
}

/// Largest saving first; then by name, so that the order is stable.
pub fn sort(lines: &mut [Line]) {
    lines.sort_by(|a, b| {
        (b.gpus_saved.total_cmp(&a.gpus_saved)).then_with(|| {
            let key = |l: &Line| {
                (
                    l.namespace.clone(),
                    l.workload_kind.clone(),
                    l.workload.clone(),
                )
            };
            key(a)
                .cmp(&key(b))
                .then_with(|| a.device_model.cmp(&b.device_model))
        })
    });
}

/// A namespace's workloads summed.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NamespaceLine {
    pub namespace: String,
    pub workloads: usize,
    pub gpus_allocated: f64,
    pub gpus_saved: f64,
}

/// Per namespace, largest saving first.
pub fn by_namespace(lines: &[Line]) -> Vec<NamespaceLine> {
    let mut m: BTreeMap<&str, NamespaceLine> = BTreeMap::new();
    for l in lines {
        let n = m.entry(&l.namespace).or_insert_with(|| NamespaceLine {
            namespace: l.namespace.clone(),
            ..Default::default()
        });
        n.workloads += 1;
        n.gpus_allocated += l.gpus_allocated;
        n.gpus_saved += l.gpus_saved;
    }
    let mut out: Vec<NamespaceLine> = m.into_values().collect();
    for n in &mut out {
        (n.gpus_allocated, n.gpus_saved) = (round(n.gpus_allocated, 4), round(n.gpus_saved, 4));
    }
    out.sort_by(|a, b| b.gpus_saved.total_cmp(&a.gpus_saved));
    out
}

/// What the table's footer says besides the totals: the settings and where the MIG
/// profiles came from.
#[derive(Debug, Clone, Default)]
pub struct Footer {
    pub settings: String,
    pub notes: Vec<String>,
    /// With `--plan`: its section of the table, and (GPUs freed, GPUs held) for the total.
    pub plan: Option<(String, u32, u32)>,
}

/// `7d`, `36h`, `45m`, `30s`: the largest unit that keeps a whole number above 1.
pub fn human_secs(s: f64) -> String {
    let s = s.max(0.0);
    for (unit, n) in [("d", 86_400.0), ("h", 3600.0), ("m", 60.0)] {
        if s >= 2.0 * n || (s >= n && (s % n).abs() < 1e-6) {
            return format!("{}{unit}", (s / n).floor());
        }
    }
    format!("{}s", s.round())
}

fn gib(bytes: u64) -> String {
    format!("{:.1}GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// `mig 1g.10gb`, `time-slice 1/3`, `mps 12% 8602MiB`, `keep`, ...
pub fn describe(r: &Recommendation) -> String {
    match r.kind {
        Kind::Mig => format!("mig {}", r.profile.as_deref().unwrap_or("?")),
        Kind::TimeSlice => format!("time-slice 1/{}", (1.0 / r.share.unwrap_or(1.0)).round()),
        Kind::Mps => format!(
            "mps {}% {}MiB",
            r.mps_thread_pct.unwrap_or(100),
            r.mps_mem_limit_bytes.unwrap_or(0) >> 20
        ),
        k => k.as_str().to_string(),
    }
}

pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Columns left-aligned where `left[i]`, else right-aligned, two spaces apart.
fn aligned(rows: &[Vec<String>], left: &[bool]) -> String {
    let widths: Vec<usize> = (0..left.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut s = String::new();
    for r in rows {
        let mut line = String::new();
        for ((cell, w), l) in r.iter().zip(&widths).zip(left) {
            let _ = match l {
                true => write!(line, "{cell:<w$}  "),
                false => write!(line, "{cell:>w$}  "),
            };
        }
        let _ = writeln!(s, "{}", line.trim_end());
    }
    s
}

const HEADER: [&str; 14] = [
    "namespace",
    "workload_kind",
    "workload",
    "device_model",
    "gpus_allocated",
    "coverage_s",
    "memory_peak_bytes",
    "sm_p95",
    "kind",
    "profile",
    "share",
    "mps_thread_pct",
    "mps_mem_limit_bytes",
    "gpus_saved",
];

fn csv_cells(l: &Line) -> Vec<String> {
    let opt = |v: Option<String>| v.unwrap_or_default();
    let r = &l.recommendation;
    vec![
        l.namespace.clone(),
        l.workload_kind.clone(),
        l.workload.clone(),
        l.device_model.clone(),
        l.gpus_allocated.to_string(),
        l.coverage_s.to_string(),
        l.memory_peak_bytes.to_string(),
        opt(l.sm_p95.map(|s| s.to_string())),
        r.kind.as_str().to_string(),
        opt(r.profile.clone()),
        opt(r.share.map(|s| s.to_string())),
        opt(r.mps_thread_pct.map(|p| p.to_string())),
        opt(r.mps_mem_limit_bytes.map(|b| b.to_string())),
        l.gpus_saved.to_string(),
    ]
}

fn table_cells(l: &Line) -> Vec<String> {
    vec![
        l.namespace.clone(),
        l.workload_kind.clone(),
        l.workload.clone(),
        l.device_model.clone(),
        format!("{:.2}", l.gpus_allocated),
        human_secs(l.coverage_s),
        gib(l.memory_peak_bytes),
        l.sm_p95.map_or("-".into(), |s| format!("{s:.0}%")),
        describe(&l.recommendation),
        format!("{:.2}", l.gpus_saved),
    ]
}

/// "N of M GPUs reclaimable", per namespace (unless the rows are the namespaces) then
/// overall, and the footer's lines.
fn totals(lines: &[Line], footer: &Footer, per_namespace: bool) -> String {
    let mut s = String::from("\n");
    let (mut saved, mut held) = (0.0, 0.0);
    for n in &by_namespace(lines) {
        if per_namespace {
            let _ = writeln!(
                s,
                "{}: {:.2} of {:.2} GPUs reclaimable",
                n.namespace, n.gpus_saved, n.gpus_allocated
            );
        }
        (saved, held) = (saved + n.gpus_saved, held + n.gpus_allocated);
    }
    match &footer.plan {
        Some((section, freed, gpus)) => {
            s += section;
            let _ = writeln!(
                s,
                "\ntotal: {saved:.2} of {held:.2} GPUs reclaimable (fractional); the plan frees {freed} of {gpus} GPUs"
            );
        }
        None => {
            let _ = writeln!(s, "total: {saved:.2} of {held:.2} GPUs reclaimable");
        }
    }
    let _ = writeln!(s, "\n{}", footer.settings);
    for n in &footer.notes {
        let _ = writeln!(s, "{n}");
    }
    s
}

/// Per workload, sorted as `sort` does, in `format`.
pub fn workloads(lines: &[Line], format: Format, footer: &Footer) -> String {
    match format {
        Format::Json => json_lines(lines),
        Format::Csv => {
            let mut rows = vec![HEADER.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
            rows.extend(lines.iter().map(csv_cells));
            let mut s = String::new();
            for r in rows {
                let fields: Vec<String> = r.iter().map(|f| csv_field(f)).collect();
                let _ = writeln!(s, "{}", fields.join(","));
            }
            s
        }
        Format::Table => {
            let header = [
                "NAMESPACE",
                "KIND",
                "WORKLOAD",
                "GPU",
                "ALLOCATED",
                "COVERAGE",
                "PEAK_MEM",
                "SM_P95",
                "RECOMMENDATION",
                "SAVED",
            ];
            let mut rows = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
            rows.extend(lines.iter().map(table_cells));
            let left = [
                true, true, true, true, false, false, false, false, true, false,
            ];
            aligned(&rows, &left) + &totals(lines, footer, true)
        }
    }
}

/// Per namespace, in `format`.
pub fn namespaces(lines: &[Line], format: Format, footer: &Footer) -> String {
    let ns = by_namespace(lines);
    let cells = |n: &NamespaceLine| {
        vec![
            n.namespace.clone(),
            n.workloads.to_string(),
            format!("{:.4}", n.gpus_allocated),
            format!("{:.4}", n.gpus_saved),
        ]
    };
    match format {
        Format::Json => json_lines(&ns),
        Format::Csv => {
            let mut s = String::from("namespace,workloads,gpus_allocated,gpus_saved\n");
            for n in &ns {
                let fields: Vec<String> = cells(n).iter().map(|f| csv_field(f)).collect();
                let _ = writeln!(s, "{}", fields.join(","));
            }
            s
        }
        Format::Table => {
            let header = ["NAMESPACE", "WORKLOADS", "ALLOCATED", "SAVED"];
            let mut rows = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
            rows.extend(ns.iter().map(|n| {
                let mut c = cells(n);
                (c[2], c[3]) = (
                    format!("{:.2}", n.gpus_allocated),
                    format!("{:.2}", n.gpus_saved),
                );
                c
            }));
            aligned(&rows, &[true, false, false, false]) + &totals(lines, footer, false)
        }
    }
}

fn json_lines<T: Serialize>(items: &[T]) -> String {
    let mut s = String::new();
    for i in items {
        s += &serde_json::to_string(i).unwrap_or_default();
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rightsize::usage::WorkloadKey;

    const GIB: u64 = 1 << 30;

    fn line(ns: &str, name: &str, kind: Kind, saved: f64) -> Line {
        let u = Usage {
            key: WorkloadKey {
                namespace: ns.into(),
                workload_kind: "Deployment".into(),
                workload: name.into(),
                device_model: "NVIDIA H100 80GB HBM3".into(),
            },
            coverage_s: 2.0 * 86400.0,
            lifespan_s: 2.0 * 86400.0,
            gpus_allocated: 1.0,
            instances: 1.0,
            memory_peak_bytes: 7 * GIB,
            sm_p95: Some(0.1),
            sm_unknown_share: None,
            used: true,
            device_memory_bytes: None,
            mig_profile: None,
            containers: vec![],
        };
        let r = Recommendation {
            kind,
            profile: (kind == Kind::Mig).then(|| "1g.10gb".into()),
            share: (kind == Kind::TimeSlice).then_some(1.0 / 3.0),
            mps_thread_pct: None,
            mps_mem_limit_bytes: None,
            fraction: 1.0 - saved,
            gpus_saved: saved,
        };
        Line::new(&u, r)
    }

    fn lines() -> Vec<Line> {
        let mut l = vec![
            line("web", "infer", Kind::TimeSlice, 2.0 / 3.0),
            line("ml", "train", Kind::Keep, 0.0),
            line("ml", "small", Kind::Mig, 6.0 / 7.0),
        ];
        sort(&mut l);
        l
    }

    fn footer() -> Footer {
        Footer {
            settings: "window 7d, headroom 20%".into(),
            notes: vec!["MIG profiles of NVIDIA H100 80GB HBM3: the built-in table".into()],
            plan: None,
        }
    }

    #[test]
    fn json_lines_have_exactly_the_documented_fields() {
        let out = workloads(&lines(), Format::Json, &footer());
        let rows: Vec<serde_json::Value> = (out.lines())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows.len(), 3);
        let keys: Vec<&str> = rows[0]
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        let mut want = [
            "namespace",
            "workload_kind",
            "workload",
            "device_model",
            "gpus_allocated",
            "coverage_s",
            "memory_peak_bytes",
            "sm_p95",
            "recommendation",
            "gpus_saved",
        ];
        want.sort();
        let mut keys = keys;
        keys.sort();
        assert_eq!(keys, want);
        assert_eq!(rows[0]["workload"], "small", "largest saving first");
        assert_eq!(rows[0]["gpus_saved"], 0.8571);
        assert_eq!(rows[0]["sm_p95"], 10.0);
        let r = rows[0]["recommendation"].as_object().unwrap();
        let mut rk: Vec<&str> = r.keys().map(|k| k.as_str()).collect();
        rk.sort();
        assert_eq!(
            rk,
            [
                "kind",
                "mps_mem_limit_bytes",
                "mps_thread_pct",
                "profile",
                "share"
            ]
        );
        assert_eq!(
            (r["kind"].as_str(), r["profile"].as_str()),
            (Some("mig"), Some("1g.10gb"))
        );
        assert_eq!(rows[1]["recommendation"]["share"], 0.3333);
        assert_eq!(rows[2]["recommendation"]["kind"], "keep");
    }

    #[test]
    fn the_table_sorts_by_saving_and_ends_with_totals_and_settings() {
        let out = workloads(&lines(), Format::Table, &footer());
        let rows: Vec<&str> = out.lines().collect();
        assert!(rows[0].starts_with("NAMESPACE  KIND"), "{out}");
        assert!(
            rows[1].starts_with("ml ") && rows[1].contains("mig 1g.10gb"),
            "{out}"
        );
        assert!(rows[1].ends_with("0.86"), "{out}");
        assert!(rows[2].contains("time-slice 1/3"), "{out}");
        assert!(rows[3].contains("keep"), "{out}");
        assert!(
            out.contains("\nml: 0.86 of 2.00 GPUs reclaimable\n"),
            "{out}"
        );
        assert!(
            out.contains("\nweb: 0.67 of 1.00 GPUs reclaimable\n"),
            "{out}"
        );
        assert!(
            out.contains("\ntotal: 1.52 of 3.00 GPUs reclaimable\n"),
            "{out}"
        );
        assert!(
            out.contains("window 7d, headroom 20%\nMIG profiles of"),
            "{out}"
        );
        let csv = workloads(&lines(), Format::Csv, &footer());
        assert!(
            csv.starts_with("namespace,workload_kind,workload,device_model,"),
            "{csv}"
        );
        assert!(
            csv.contains("\nweb,Deployment,infer,NVIDIA H100 80GB HBM3,1,172800,7516192768,10,time-slice,,0.3333,,,0.6667\n"),
            "{csv}"
        );
    }

    #[test]
    fn by_namespace_sums_allocated_and_saved() {
        let ns = by_namespace(&lines());
        assert_eq!(ns[0].namespace, "ml");
        assert_eq!(
            (ns[0].workloads, ns[0].gpus_allocated, ns[0].gpus_saved),
            (2, 2.0, 0.8571)
        );
        let out = namespaces(&lines(), Format::Table, &footer());
        assert!(
            out.starts_with("NAMESPACE  WORKLOADS  ALLOCATED  SAVED\nml "),
            "{out}"
        );
        assert!(
            !out.contains("ml: "),
            "the rows are the namespaces' totals: {out}"
        );
        assert!(out.contains("total: 1.52 of 3.00"), "{out}");
        let json = namespaces(&lines(), Format::Json, &footer());
        let first: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
        assert_eq!(first["gpus_saved"], 0.8571);
        let csv = namespaces(&lines(), Format::Csv, &footer());
        assert!(
            csv.starts_with("namespace,workloads,gpus_allocated,gpus_saved\nml,2,"),
            "{csv}"
        );
    }

    #[test]
    fn durations_read_in_their_largest_whole_unit() {
        assert_eq!(human_secs(7.0 * 86400.0), "7d");
        assert_eq!(human_secs(86400.0), "1d");
        assert_eq!(human_secs(36.0 * 3600.0), "36h");
        assert_eq!(human_secs(90.0), "90s");
        assert_eq!(human_secs(120.0), "2m");
    }
}
