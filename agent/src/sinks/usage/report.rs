//! `gpu-agent report`: usage per namespace (pod, container, node, GPU) over a window, from
//! the local JSON-lines file and its rotated files. A record that straddles the window's
//! start counts in proportion to its time inside the window.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    time::Duration,
};

use gpu_model::UsageRecord;
use serde::Serialize;

use super::read;

/// What to group by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    Namespace,
    Pod,
    Container,
    Node,
    Gpu,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Csv,
    Json,
}

pub struct Options {
    pub file: PathBuf,
    pub since: Duration,
    pub by: Vec<By>,
    pub format: Format,
    /// The window's end, unix ms (now).
    pub now_ms: u64,
}

/// `30s`, `15m`, `24h`, `7d`, `2w`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let unit_at = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{s:?}: give a unit (s, m, h, d or w), e.g. 24h"))?;
    let n: u64 = s[..unit_at]
        .parse()
        .map_err(|_| format!("{s:?}: expected a number then a unit, e.g. 24h"))?;
    let secs = match &s[unit_at..] {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 604_800,
        u => return Err(format!("{s:?}: unknown unit {u:?} (s, m, h, d or w)")),
    };
    Ok(Duration::from_secs(n * secs))
}

/// One group's totals.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Row {
    #[serde(flatten)]
    pub key: BTreeMap<&'static str, String>,
    pub records: u64,
    /// None where no record of the group knew its GPU time (MIG devices cannot say it).
    pub gpu_hours: Option<f64>,
    pub accounted_gpu_hours: f64,
    pub memory_gib_hours: f64,
    pub peak_memory_gib: f64,
    pub energy_kwh: f64,
}

fn by_name(b: By) -> &'static str {
    match b {
        By::Namespace => "namespace",
        By::Pod => "pod",
        By::Container => "container",
        By::Node => "node",
        By::Gpu => "gpu",
    }
}

fn key_of(r: &UsageRecord, b: By) -> String {
    let or_id = |name: &Option<String>, id: &Option<String>| {
        name.clone()
            .or_else(|| id.as_ref().map(|i| i.chars().take(12).collect()))
            .unwrap_or_else(|| "-".into())
    };
    match b {
        By::Namespace => r.namespace.clone().unwrap_or_else(|| "-".into()),
        By::Pod => or_id(&r.pod_name, &r.pod_uid),
        By::Container => or_id(&r.container_name, &r.container_id),
        By::Node => r.node.clone().unwrap_or_else(|| "-".into()),
        By::Gpu => r.uuid.clone(),
    }
}

/// Every good record of the file and its rotated files, oldest first, in memory, and how
/// many lines were left out (read.rs says why). `report` and `rightsize` stream instead.
pub fn read_records(file: &Path) -> Result<(Vec<UsageRecord>, usize), String> {
    let mut records = vec![];
    let left = read::for_each_record(file, u64::MAX / 2, |r| records.push(r))?;
    Ok((records, left.total()))
}

/// Totals per group over [now - since, now], largest GPU-hours first.
pub fn summarize(records: &[UsageRecord], o: &Options) -> Vec<Row> {
    let mut s = Summary::new(o);
    for r in records {
        s.add(r);
    }
    s.finish()
}

/// The groups' totals as the records stream by: memory grows with the groups.
pub struct Summary<'a> {
    o: &'a Options,
    from: u64,
    rows: BTreeMap<Vec<String>, Row>,
}

impl<'a> Summary<'a> {
    pub fn new(o: &'a Options) -> Summary<'a> {
        Summary {
            o,
            from: o.now_ms.saturating_sub(o.since.as_millis() as u64),
            rows: BTreeMap::new(),
        }
    }

    /// Counts `r` in its group, in proportion to its time inside the window.
    pub fn add(&mut self, r: &UsageRecord) {
        let (o, from, rows) = (self.o, self.from, &mut self.rows);
        let (start, end) = (r.start_ms, r.end_ms.max(r.start_ms));
        if end < from || start > o.now_ms {
            return;
        }
        let span = (end - start) as f64;
        let inside = (end.min(o.now_ms) - start.max(from)) as f64;
        let f = if span > 0.0 { inside / span } else { 1.0 };
        let key: Vec<String> = o.by.iter().map(|b| key_of(r, *b)).collect();
        let row = rows.entry(key.clone()).or_insert_with(|| Row {
            key: o.by.iter().map(|b| by_name(*b)).zip(key).collect(),
            ..Default::default()
        });
        row.records += 1;
        if let Some(s) = r.gpu_seconds {
            *row.gpu_hours.get_or_insert(0.0) += s * f / 3600.0;
        }
        row.accounted_gpu_hours += r.accounted_gpu_seconds * f / 3600.0;
        row.memory_gib_hours += r.memory_byte_seconds * f / (1u64 << 30) as f64 / 3600.0;
        row.peak_memory_gib = row
            .peak_memory_gib
            .max(r.memory_peak_bytes as f64 / (1u64 << 30) as f64);
        row.energy_kwh += r.energy_joules * f / 3.6e6;
    }

    /// The rows, largest GPU-hours first (unknown last).
    pub fn finish(self) -> Vec<Row> {
        let mut out: Vec<Row> = self.rows.into_values().collect();
        let hours = |r: &Row| r.gpu_hours.unwrap_or(f64::NEG_INFINITY);
        out.sort_by(|a, b| hours(b).total_cmp(&hours(a)));
        out
    }
}

const COLUMNS: [&str; 6] = [
    "records",
    "gpu_hours",
    "accounted_gpu_hours",
    "memory_gib_hours",
    "peak_memory_gib",
    "energy_kwh",
];

fn cells(r: &Row) -> [String; 6] {
    [
        r.records.to_string(),
        // Empty where unknown (CSV); the table shows "-".
        r.gpu_hours.map_or(String::new(), |h| format!("{h:.4}")),
        format!("{:.4}", r.accounted_gpu_hours),
        format!("{:.4}", r.memory_gib_hours),
        format!("{:.3}", r.peak_memory_gib),
        format!("{:.6}", r.energy_kwh),
    ]
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The rows in the chosen format.
pub fn render(rows: &[Row], o: &Options) -> String {
    let keys: Vec<&str> = o.by.iter().map(|b| by_name(*b)).collect();
    let header: Vec<&str> = keys.iter().copied().chain(COLUMNS).collect();
    let lines: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let k = keys
                .iter()
                .map(|k| r.key.get(k).cloned().unwrap_or_default());
            k.chain(cells(r)).collect()
        })
        .collect();
    let mut s = String::new();
    match o.format {
        Format::Json => {
            s = serde_json::to_string_pretty(rows).unwrap_or_default();
            s.push('\n');
        }
        Format::Csv => {
            let _ = writeln!(s, "{}", header.join(","));
            for l in &lines {
                let fields: Vec<String> = l.iter().map(|f| csv_field(f)).collect();
                let _ = writeln!(s, "{}", fields.join(","));
            }
        }
        Format::Table => {
            let widths: Vec<usize> = (0..header.len())
                .map(|i| {
                    lines
                        .iter()
                        .map(|l| l[i].len())
                        .chain([header[i].len()])
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            let upper: Vec<String> = header.iter().map(|h| h.to_uppercase()).collect();
            for l in std::iter::once(&upper).chain(&lines) {
                let mut line = String::new();
                for (i, (cell, w)) in l.iter().zip(&widths).enumerate() {
                    // Keys left-aligned, numbers right-aligned; an unknown number is "-".
                    let _ = match i < keys.len() {
                        true => write!(line, "{cell:<w$}  "),
                        false if cell.is_empty() => write!(line, "{:>w$}  ", "-"),
                        false => write!(line, "{cell:>w$}  "),
                    };
                }
                let _ = writeln!(s, "{}", line.trim_end());
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ns: &str, start_s: u64, end_s: u64, gpu_s: f64) -> UsageRecord {
        UsageRecord {
            namespace: Some(ns.into()),
            pod_name: Some(format!("{ns}-pod")),
            uuid: "GPU-1".into(),
            gpu_uuid: "GPU-1".into(),
            start_ms: start_s * 1000,
            end_ms: end_s * 1000,
            gpu_seconds: Some(gpu_s),
            memory_byte_seconds: (1u64 << 30) as f64 * 3600.0,
            memory_peak_bytes: 2 << 30,
            energy_joules: 3.6e6,
            reason: "exited".into(),
            ..Default::default()
        }
    }

    fn opts(format: Format) -> Options {
        Options {
            file: PathBuf::new(),
            since: Duration::from_secs(3600),
            by: vec![By::Namespace],
            format,
            now_ms: 10_000 * 1000,
        }
    }

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration("24h").unwrap(), Duration::from_secs(86_400));
        assert_eq!(
            parse_duration("2w").unwrap(),
            Duration::from_secs(1_209_600)
        );
        assert!(parse_duration("24").unwrap_err().contains("unit"));
        assert!(parse_duration("3y").unwrap_err().contains("unknown unit"));
    }

    #[test]
    fn groups_prorate_at_the_window_start_and_skip_what_is_outside() {
        let records = [
            rec("ml", 9_000, 9_600, 7200.0),
            // Half inside the window (which starts at 6400 s).
            rec("ml", 6_000, 6_800, 3600.0),
            rec("web", 9_900, 9_990, 360.0),
            rec("old", 1_000, 2_000, 99.0),
        ];
        let rows = summarize(&records, &opts(Format::Table));
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].key["namespace"], "ml");
        assert_eq!(rows[0].records, 2);
        assert!(
            (rows[0].gpu_hours.unwrap() - 2.5).abs() < 1e-9,
            "{:?}",
            rows[0].gpu_hours
        );
        assert!((rows[0].energy_kwh - 1.5).abs() < 1e-9);
        assert!((rows[0].peak_memory_gib - 2.0).abs() < 1e-9);
        let table = render(&rows, &opts(Format::Table));
        let first = table.lines().next().unwrap();
        assert!(
            first.starts_with("NAMESPACE  RECORDS  GPU_HOURS"),
            "{table}"
        );
        assert!(table.lines().nth(1).unwrap().starts_with("ml "), "{table}");
        let csv = render(&rows, &opts(Format::Csv));
        assert!(
            csv.starts_with("namespace,records,gpu_hours,accounted_gpu_hours"),
            "{csv}"
        );
        assert!(csv.contains("\nweb,1,0.1000,"), "{csv}");
        let json: serde_json::Value =
            serde_json::from_str(&render(&rows, &opts(Format::Json))).unwrap();
        assert_eq!(json[1]["namespace"], "web");
        assert_eq!(json[1]["records"], 1);
    }

    #[test]
    fn gpu_hours_no_record_knew_are_unknown_not_zero() {
        // A MIG device cannot say its processes' SM utilization: its records have no GPU
        // seconds, and a group of such records only has no GPU hours.
        let mut mig = rec("mig", 9_000, 9_600, 0.0);
        mig.gpu_seconds = None;
        let records = [mig.clone(), rec("web", 9_900, 9_990, 360.0)];
        let rows = summarize(&records, &opts(Format::Table));
        let keys: Vec<_> = rows.iter().map(|r| r.key["namespace"].as_str()).collect();
        assert_eq!(keys, ["web", "mig"], "unknown sorts last");
        assert_eq!(rows[1].gpu_hours, None);
        assert!(
            (rows[1].memory_gib_hours - 1.0).abs() < 1e-9,
            "{:?}",
            rows[1]
        );
        let table = render(&rows, &opts(Format::Table));
        let line = table.lines().find(|l| l.starts_with("mig")).unwrap();
        assert_eq!(line.split_whitespace().nth(2), Some("-"), "{table}");
        let csv = render(&rows, &opts(Format::Csv));
        assert!(csv.contains("\nmig,1,,0.0000,"), "{csv}");
        let json: serde_json::Value =
            serde_json::from_str(&render(&rows, &opts(Format::Json))).unwrap();
        assert!(json[1]["gpu_hours"].is_null(), "{json}");
        // One known record makes the group's hours known: its own.
        let rows = summarize(&[mig, rec("mig", 9_000, 9_600, 36.0)], &opts(Format::Table));
        assert!((rows[0].gpu_hours.unwrap() - 0.01).abs() < 1e-9);
    }
}
