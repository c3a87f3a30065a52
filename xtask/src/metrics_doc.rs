//! `cargo xtask metrics-doc [--check]`: the tables of docs/metrics.md, generated from the
//! metric catalogue (otel/src/catalogue.rs). Each table sits between a pair of markers,
//!
//! ```text
//! <!-- BEGIN GENERATED device: cargo xtask metrics-doc, from otel/src/catalogue.rs -->
//! <!-- END GENERATED device -->
//! ```
//!
//! and the prose around them is left alone. `--check` writes nothing and fails, naming
//! each stale table, when the file differs from what the command would write.
use std::fmt::Write;

use anyhow::Result;
use otel::catalogue::{
    dcgm_fields_of, Attr, AttrSet, Attribute, Group, Metric, MetricId, Place, Source, ATTRIBUTES,
    CATALOGUE, DCGM_UNSERVED,
};

use crate::generated::Generated;

const DOC: &str = "docs/metrics.md";

const GEN: Generated = Generated {
    doc: DOC,
    command: "metrics-doc",
    source: "otel/src/catalogue.rs",
};

pub fn run(check: bool) -> Result<()> {
    GEN.run(check, &tables(&CATALOGUE, &ATTRIBUTES))
}

/// Every generated table, by marker name, rendered from `metrics` and `attributes` (the
/// catalogue, or a modified copy of it in tests).
pub fn tables(metrics: &[Metric], attributes: &[Attribute]) -> Vec<(&'static str, String)> {
    let doc = Doc {
        metrics,
        attributes,
    };
    vec![
        ("attributes", doc.attributes()),
        ("device", doc.group(Group::Device)),
        ("container", doc.group(Group::Container)),
        ("process", doc.group(Group::Process)),
        ("self", doc.group(Group::SelfMetrics)),
        ("dcgm", doc.dcgm()),
    ]
}

struct Doc<'a> {
    metrics: &'a [Metric],
    attributes: &'a [Attribute],
}

/// `name` in backticks; `—` for none.
fn code(name: Option<&str>) -> String {
    name.map_or_else(|| "—".to_string(), |n| format!("`{n}`"))
}

fn codes<'s>(names: impl IntoIterator<Item = &'s str>) -> String {
    let v: Vec<String> = names.into_iter().map(|n| format!("`{n}`")).collect();
    v.join(", ")
}

/// A table cell: no line breaks, pipes escaped.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

impl Doc<'_> {
    fn attr(&self, a: Attr) -> &Attribute {
        &self.attributes[a as usize]
    }

    fn metric(&self, id: MetricId) -> &Metric {
        &self.metrics[id as usize]
    }

    fn attributes(&self) -> String {
        let mut s = String::from(
            "| OTLP attribute | in OTLP | Prometheus label | value |\n| --- | --- | --- | --- |\n",
        );
        for a in self.attributes {
            let place = match a.place {
                Place::EveryResource => "every resource",
                Place::ContainerResource => "container resource",
                Place::DataPoint => "data point",
                Place::PrometheusOnly => "—",
            };
            let mut value = a.doc.to_string();
            if !a.values.is_empty() {
                let sep = if value.is_empty() { "" } else { "; one of " };
                value = format!("{value}{sep}{}", codes(a.values.iter().copied()));
            }
            let _ = writeln!(
                s,
                "| {} | {place} | {} | {} |",
                code(a.otlp),
                code(a.prometheus),
                cell(&value)
            );
        }
        s
    }

    /// One line per attribute set the group's metrics share.
    fn sets(&self, group: Group) -> String {
        let mut seen: Vec<&str> = vec![];
        let mut s = String::new();
        for m in self.metrics.iter().filter(|m| m.group == group) {
            let set = m.base;
            if (set.otlp.is_empty() && set.prometheus.is_empty()) || seen.contains(&set.name) {
                continue;
            }
            seen.push(set.name);
            let _ = writeln!(s, "{}\n", self.set_line(set));
        }
        s
    }

    fn set_line(&self, set: AttrSet) -> String {
        let defs = |list: &'static [Attr]| list.iter().map(|&a| self.attr(a));
        let otlp = |place: Place| {
            let keys = defs(set.otlp).filter(|d| d.place == place);
            codes(keys.filter_map(|d| d.otlp))
        };
        let mut parts = vec![];
        for (what, place) in [
            ("OTLP resource", Place::ContainerResource),
            ("OTLP data point", Place::DataPoint),
        ] {
            let names = otlp(place);
            if !names.is_empty() {
                parts.push(format!("{what}: {names}"));
            }
        }
        let labels = codes(defs(set.prometheus).filter_map(|d| d.prometheus));
        if !labels.is_empty() {
            parts.push(format!("Prometheus labels: {labels}"));
        }
        format!("**{}** attributes. {}.", set.name, parts.join("; "))
    }

    /// The attributes column: the shared set's name, then those that tell points apart.
    fn attrs_cell(&self, m: &Metric) -> String {
        let mut parts = vec![];
        if !(m.base.otlp.is_empty() && m.base.prometheus.is_empty()) {
            parts.push(m.base.name.to_string());
        }
        for &a in m.extra {
            let d = self.attr(a);
            let name = code(d.otlp.or(d.prometheus));
            let values: Vec<String> = d.values.iter().map(|v| format!("`{v}`")).collect();
            parts.push(if values.is_empty() {
                name
            } else {
                format!("{name} = {}", values.join(" / "))
            });
        }
        parts.join(" + ")
    }

    fn group(&self, group: Group) -> String {
        let ids: Vec<MetricId> = MetricId::ALL
            .iter()
            .copied()
            .filter(|&id| self.metric(id).group == group)
            .collect();
        let dcgm = ids
            .iter()
            .any(|&id| !dcgm_fields_of(self.metrics, id).is_empty());
        let mut s = self.sets(group);
        s.push_str("| OTLP name | Prometheus name | type | unit | attributes |");
        s.push_str(if dcgm {
            " dcgm-exporter | what |\n"
        } else {
            " what |\n"
        });
        s.push_str("| --- | --- | --- | --- | --- |");
        s.push_str(if dcgm { " --- | --- |\n" } else { " --- |\n" });
        for id in ids {
            let m = self.metric(id);
            let _ = write!(
                s,
                "| {} | {} | {} | {} | {} |",
                code(m.otlp),
                code(m.prometheus),
                m.kind.otlp_name(),
                m.unit,
                self.attrs_cell(m)
            );
            if dcgm {
                let _ = write!(s, " {} |", codes(dcgm_fields_of(self.metrics, id)));
            }
            let _ = writeln!(s, " {} |", cell(&what(m)));
        }
        s
    }

    /// A dcgm series' source, in Prometheus terms (the dcgm names are Prometheus only).
    fn source(&self, src: Option<&Source>) -> String {
        let name = |id: MetricId| self.metric(id).prometheus.unwrap_or("?");
        let sel = |id: MetricId, sel: &[(Attr, &str)]| {
            let labels: Vec<String> = sel
                .iter()
                .map(|(a, v)| format!("{}=\"{v}\"", self.attr(*a).prometheus.unwrap_or("?")))
                .collect();
            match labels.is_empty() {
                true => format!("`{}`", name(id)),
                false => format!("`{}{{{}}}`", name(id), labels.join(",")),
            }
        };
        match src {
            None => String::new(),
            Some(Source::Metric(id, s)) => sel(*id, s.as_slice()),
            Some(Source::Metrics(id, s)) => sel(*id, s),
            Some(Source::Difference(a, b)) => {
                let rest: Vec<String> = b.iter().map(|b| format!(" - `{}`", name(*b))).collect();
                format!("`{}`{}", name(*a), rest.concat())
            }
            Some(Source::Derived(how)) => how.to_string(),
        }
    }

    /// Every dcgm-exporter field: what gpu-agent restates it from and through which NVML
    /// call, dcgm-exporter's type and unit, whether its default CSV has it; then the fields
    /// not served, and why.
    fn dcgm(&self) -> String {
        let mut s = self.sets(Group::Dcgm);
        s.push_str("| dcgm field | gpu-agent source (NVML call) | type | unit | default CSV | MIG | under `dcgm-virtual-gpus`, a pod's own value | served |\n");
        s.push_str("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
        for m in self.metrics.iter().filter(|m| m.group == Group::Dcgm) {
            let Some(d) = &m.dcgm else { continue };
            let yes = |b: bool| if b { "yes" } else { "" };
            let _ = writeln!(
                s,
                "| {} | {} ({}) | {} | {} | {} | {} | {} | yes |",
                code(m.prometheus),
                cell(&self.source(Some(&d.source))),
                cell(d.nvml),
                m.kind.prometheus_type(),
                m.unit,
                yes(d.default),
                yes(d.mig),
                cell(&self.source(d.per_pod.as_ref())),
            );
        }
        for (name, why) in DCGM_UNSERVED {
            let _ = writeln!(s, "| `{name}` | {} | | | | | | no |", cell(why));
        }
        s
    }
}

/// The help text, and the note when there is one.
fn what(m: &Metric) -> String {
    match m.note {
        "" => m.help.to_string(),
        note => format!("{} {note}.", m.help),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repository_doc() -> String {
        std::fs::read_to_string(crate::workspace_root().join(DOC)).unwrap()
    }

    /// `cargo xtask test` runs this: a catalogue change without `cargo xtask metrics-doc`
    /// fails the build.
    #[test]
    fn docs_metrics_md_matches_the_catalogue() {
        let tables = tables(&CATALOGUE, &ATTRIBUTES);
        if let Err(e) = GEN.check(&repository_doc(), &tables) {
            panic!("{e:#}");
        }
    }

    #[test]
    fn a_changed_entry_makes_its_table_stale() {
        let mut metrics = CATALOGUE.to_vec();
        metrics[MetricId::HwPower as usize].help = "Something else.";
        let err = GEN
            .check(&repository_doc(), &tables(&metrics, &ATTRIBUTES))
            .unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("block(s) device differ"), "{msg}");

        let mut attributes = ATTRIBUTES.to_vec();
        attributes[Attr::Node as usize].prometheus = Some("node_name");
        let err = GEN
            .check(&repository_doc(), &tables(&CATALOGUE, &attributes))
            .unwrap_err();
        let msg = format!("{err:#}");
        // The label is listed in the attribute table and in every set that has it.
        for t in ["attributes", "device", "container", "process"] {
            assert!(msg.contains(t), "{t}: {msg}");
        }
        assert!(!msg.contains("self"), "{msg}");
    }

    #[test]
    fn regenerating_replaces_only_the_tables() {
        let mut metrics = CATALOGUE.to_vec();
        metrics[MetricId::DcgmGpuTemp as usize].unit = "F";
        let t = tables(&metrics, &ATTRIBUTES);
        let doc = repository_doc();
        let (new, stale) = GEN.splice(&doc, &t).unwrap();
        assert_eq!(stale, ["dcgm"]);
        assert!(
            new.contains("| gauge | F | yes |") && new.contains("`DCGM_FI_DEV_GPU_TEMP`"),
            "{new}"
        );
        GEN.check(&new, &t).unwrap();
        // Outside the dcgm table, line for line the same.
        let outside = |s: &str| {
            let (b, e) = (GEN.begin("dcgm"), GEN.end("dcgm"));
            let (i, j) = (s.find(&b).unwrap(), s.find(&e).unwrap());
            format!("{}{}", &s[..i], &s[j..])
        };
        assert_eq!(outside(&new), outside(&doc));
    }

    #[test]
    fn markers_are_checked() {
        let t = tables(&CATALOGUE, &ATTRIBUTES);
        let err = GEN.splice("# Metrics\n", &t).unwrap_err();
        assert!(
            format!("{err}").contains("no marker for block `attributes`"),
            "{err}"
        );
        let doc = repository_doc();
        let unknown = format!("{doc}\n<!-- BEGIN GENERATED nonsense: x -->\n");
        let err = GEN.splice(&unknown, &t).unwrap_err();
        assert!(format!("{err}").contains("names no block"), "{err}");
        let twice = format!("{doc}\n{}\n", GEN.end("self"));
        let err = GEN.splice(&twice, &t).unwrap_err();
        assert!(format!("{err}").contains("twice"), "{err}");
    }
}
