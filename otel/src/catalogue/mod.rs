//! The metric catalogue: every metric and every attribute gpu-agent can emit, once. The
//! OTLP encoding (`otlp`), the Prometheus text (`prometheus`: family order, HELP, TYPE), the
//! dcgm-exporter compatibility names and docs/metrics.md (`cargo xtask metrics-doc`) are
//! all driven by these two tables; code names an entry by its [`MetricId`] or [`Attr`],
//! never by a string.
//!
//! Conventions: OTLP names and units follow the OpenTelemetry semantic conventions (`hw.*`)
//! where one exists. Prometheus names are spelled out, not derived, because a few differ
//! from the OpenTelemetry mapping (`gpu_agent.cache.processes` is
//! `gpu_agent_cached_processes`). The Prometheus type follows the kind: a Counter is a
//! `counter`, a Gauge or an UpDownCounter a `gauge`.
//!
//! The two tables are `attributes` and `metrics`; the types of their entries, and the
//! lookups by [`MetricId`] and [`Attr`], are here.

/// Declares an enum naming the rows of a table, and the table (a static array indexed by the
/// enum's discriminant), from one list, so that the two cannot disagree.
macro_rules! table {
    (
        $(#[$meta:meta])*
        pub enum $Id:ident in $TABLE:ident: [$Row:ty] {
            $($(#[$vmeta:meta])* $variant:ident => $row:expr,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $Id {
            $($(#[$vmeta])* $variant,)*
        }

        impl $Id {
            /// Every row, in table order.
            pub const ALL: &'static [$Id] = &[$($Id::$variant,)*];
        }

        /// Indexed by the discriminant of the enum naming its rows.
        pub static $TABLE: [$Row; $Id::ALL.len()] = [$($row,)*];
    };
}

mod attributes;
mod metrics;

pub use attributes::{
    Attr, AGENT, ALLOCATION, ATTRIBUTES, CLOCKS, CONTAINER, DCGM, DEVICE, DIRECTIONS,
    ECC_ERROR_TYPES, ERROR_TYPES, GPU_ENGINES, GPU_LINKS, GPU_TASKS, HELD, HW_STATES, HW_TYPE_GPU,
    HW_VENDOR_NVIDIA, LIMIT_SOURCES, OWNERS, OWNER_IDLE, OWNER_VALUES, PROCESS, THROTTLE_REASONS,
    WORKLOAD_KINDS, XID_CHARGE,
};
pub use metrics::{MetricId, CATALOGUE, DCGM_UNSERVED};

// ---------------------------------------------------------------------------------------
// Attributes

/// Where an attribute travels in OTLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// On every resource (the node's and each container's).
    EveryResource,
    /// On each container (or pod-level cgroup) resource.
    ContainerResource,
    /// On each data point.
    DataPoint,
    /// Not in OTLP: a Prometheus label only.
    PrometheusOnly,
}

/// One attribute (OTLP) / label (Prometheus). Either name may be absent where that sink
/// does not carry it.
#[derive(Clone, Debug)]
pub struct Attribute {
    pub otlp: Option<&'static str>,
    pub prometheus: Option<&'static str>,
    pub place: Place,
    /// The closed set of values, where there is one.
    pub values: &'static [&'static str],
    /// Its value, and where it comes from.
    pub doc: &'static str,
}

impl Attr {
    pub fn def(self) -> &'static Attribute {
        &ATTRIBUTES[self as usize]
    }

    /// The OTLP key. Panics (a bug) for a Prometheus-only label.
    pub fn otlp(self) -> &'static str {
        self.def()
            .otlp
            .unwrap_or_else(|| panic!("{self:?} has no OTLP key"))
    }

    /// The Prometheus label name. Panics (a bug) for an OTLP-only attribute.
    pub fn label(self) -> &'static str {
        self.def()
            .prometheus
            .unwrap_or_else(|| panic!("{self:?} has no Prometheus label"))
    }
}

/// The attributes configured away (`metrics.drop_attributes`), resolved once per export
/// through [`crate::Groups::drops`]: a bit per [`Attr`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropped(u128);

const _: () = assert!(Attr::ALL.len() <= 128, "Dropped holds a bit per attribute");

impl Dropped {
    pub fn of(groups: &crate::Groups) -> Dropped {
        let mut bits = 0;
        if !groups.drop_attributes.is_empty() {
            for &a in Attr::ALL {
                let d = a.def();
                if groups.drops(d.otlp, d.prometheus) {
                    bits |= 1 << a as u32;
                }
            }
        }
        Dropped(bits)
    }

    pub fn contains(self, a: Attr) -> bool {
        self.0 & (1 << a as u32) != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

// ---------------------------------------------------------------------------------------
// Metrics

/// The instrument. The Prometheus type follows: `counter` for a Counter, else `gauge`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    /// Non-monotonic cumulative sum.
    UpDownCounter,
    /// Monotonic cumulative sum.
    Counter,
}

impl Kind {
    pub fn prometheus_type(self) -> &'static str {
        match self {
            Kind::Gauge | Kind::UpDownCounter => "gauge",
            Kind::Counter => "counter",
        }
    }

    pub fn otlp_name(self) -> &'static str {
        match self {
            Kind::Gauge => "Gauge",
            Kind::UpDownCounter => "UpDownCounter",
            Kind::Counter => "Counter",
        }
    }
}

/// The switch that turns a metric on: a `[metrics]` group, or `--prometheus-compat dcgm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    Device,
    Container,
    Process,
    SelfMetrics,
    /// dcgm-exporter's names, Prometheus only (`--prometheus-compat dcgm`).
    Dcgm,
}

/// The attributes every series of a kind may carry, per sink, named for the docs. OTLP
/// lists resource attributes too (see [`Attribute::place`]).
#[derive(Clone, Copy, Debug)]
pub struct AttrSet {
    pub name: &'static str,
    pub otlp: &'static [Attr],
    pub prometheus: &'static [Attr],
}

/// Which gpu-agent value a dcgm-exporter series restates (converted to the dcgm unit).
#[derive(Clone, Copy, Debug)]
pub enum Source {
    /// The metric's value; its data point with the attribute at that value, where it has
    /// several.
    Metric(MetricId, Option<(Attr, &'static str)>),
    /// The metric's data point with the attributes at these values.
    Metrics(MetricId, &'static [(Attr, &'static str)]),
    /// The first metric's value minus the others'.
    Difference(MetricId, &'static [MetricId]),
    /// No gpu-agent metric carries it: how it is made.
    Derived(&'static str),
}

/// A dcgm-exporter field (the entry's Prometheus name is the field name; its `unit`,
/// `kind` and `help` are dcgm-exporter's, as its default counters CSV declares them).
#[derive(Clone, Copy, Debug)]
pub struct Dcgm {
    /// What its series restate.
    pub source: Source,
    /// gpu-agent's value per dcgm-exporter unit (MiB: 1048576 bytes; %: 0.01).
    pub per: f64,
    /// The NVML call behind it.
    pub nvml: &'static str,
    /// In dcgm-exporter's default counters CSV, so served without `-f`.
    pub default: bool,
    /// Also served per MIG device (GPU instance), as DCGM does.
    pub mig: bool,
    /// Under `dcgm-virtual-gpus`, a pod's own series carries this instead of the device's
    /// value (dcgm-exporter's per-process fields: FB_USED and GPU_UTIL).
    pub per_pod: Option<Source>,
}

/// One metric. `otlp` or `prometheus` is None where that sink does not emit it.
#[derive(Clone, Debug)]
pub struct Metric {
    pub otlp: Option<&'static str>,
    pub prometheus: Option<&'static str>,
    /// UCUM, as OTLP sends it; dcgm fields: dcgm-exporter's unit.
    pub unit: &'static str,
    pub kind: Kind,
    pub group: Group,
    /// OTLP description and Prometheus HELP.
    pub help: &'static str,
    /// The attributes its series share with the others of their kind.
    pub base: AttrSet,
    /// The attributes that tell its data points apart.
    pub extra: &'static [Attr],
    pub dcgm: Option<Dcgm>,
    /// Docs only: what the help text leaves out (a sentence, without its final stop).
    pub note: &'static str,
}

impl Metric {
    /// Whether its OTLP data points or resources may carry `a`.
    pub fn carries_otlp(&self, a: Attr) -> bool {
        self.base.otlp.contains(&a) || self.extra.contains(&a)
    }

    /// Whether its Prometheus series may carry the label of `a`.
    pub fn carries_label(&self, a: Attr) -> bool {
        self.base.prometheus.contains(&a) || self.extra.contains(&a)
    }
}

impl MetricId {
    pub fn def(self) -> &'static Metric {
        &CATALOGUE[self as usize]
    }

    /// The OTLP name. Panics (a bug) for a Prometheus-only metric.
    pub fn otlp(self) -> &'static str {
        self.def()
            .otlp
            .unwrap_or_else(|| panic!("{self:?} has no OTLP name"))
    }

    /// The Prometheus family name. Panics (a bug) for an OTLP-only metric.
    pub fn prometheus(self) -> &'static str {
        self.def()
            .prometheus
            .unwrap_or_else(|| panic!("{self:?} has no Prometheus name"))
    }
}

/// Every Prometheus family name the agent can emit, dcgm-exporter's included, in output
/// order.
pub fn prometheus_names() -> impl Iterator<Item = &'static str> {
    CATALOGUE.iter().filter_map(|m| m.prometheus)
}

/// The dcgm-exporter fields that restate `id` (in `table`, the catalogue or a copy).
pub fn dcgm_fields_of(table: &[Metric], id: MetricId) -> Vec<&'static str> {
    let restates = |s: &Source| match *s {
        Source::Metric(m, _) | Source::Metrics(m, _) => m == id,
        Source::Difference(a, b) => a == id || b.contains(&id),
        Source::Derived(_) => false,
    };
    table
        .iter()
        .filter(|m| {
            m.dcgm
                .is_some_and(|d| restates(&d.source) || d.per_pod.as_ref().is_some_and(restates))
        })
        .filter_map(|m| m.prometheus)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn names_are_unique_per_sink() {
        for (what, names) in [
            (
                "OTLP",
                CATALOGUE.iter().filter_map(|m| m.otlp).collect::<Vec<_>>(),
            ),
            ("Prometheus", prometheus_names().collect()),
            (
                "OTLP attribute",
                ATTRIBUTES.iter().filter_map(|a| a.otlp).collect(),
            ),
            (
                "label",
                ATTRIBUTES.iter().filter_map(|a| a.prometheus).collect(),
            ),
        ] {
            let mut seen = HashSet::new();
            for n in names {
                assert!(seen.insert(n), "{what} name {n} twice");
            }
        }
    }

    #[test]
    fn every_entry_is_complete_and_consistent() {
        for &id in MetricId::ALL {
            let m = id.def();
            assert!(
                m.otlp.is_some() || m.prometheus.is_some(),
                "{id:?}: no name"
            );
            assert!(!m.help.is_empty() && !m.unit.is_empty(), "{id:?}");
            assert!(!m.help.contains('\n'), "{id:?}: one-line help");
            assert_eq!(m.group == Group::Dcgm, m.dcgm.is_some(), "{id:?}");
            if m.group == Group::Dcgm {
                assert!(m.otlp.is_none(), "{id:?}: dcgm names are Prometheus only");
            }
            // dcgm-exporter's names are its own: DCGM_FI_DEV_PCIE_REPLAY_COUNTER is a counter.
            if let Some(p) = m.prometheus.filter(|_| m.group != Group::Dcgm) {
                assert_eq!(
                    p.ends_with("_total"),
                    m.kind == Kind::Counter,
                    "{p}: a Prometheus counter, and only a counter, ends in _total"
                );
            }
            for &a in m
                .base
                .otlp
                .iter()
                .chain(m.extra.iter().filter(|_| m.otlp.is_some()))
            {
                let place = a.def().place;
                assert!(a.def().otlp.is_some(), "{id:?}: {a:?} has no OTLP key");
                assert_ne!(place, Place::EveryResource, "{id:?}: {a:?}");
            }
            for &a in m
                .base
                .prometheus
                .iter()
                .chain(m.extra.iter().filter(|_| m.prometheus.is_some()))
            {
                assert!(a.def().prometheus.is_some(), "{id:?}: {a:?} has no label");
            }
            if m.otlp.is_none() {
                assert!(
                    m.base.otlp.is_empty(),
                    "{id:?}: OTLP attributes on a Prometheus-only metric"
                );
            }
        }
    }

    #[test]
    fn attributes_have_a_name_in_some_sink() {
        for &a in Attr::ALL {
            let d = a.def();
            assert_eq!(d.otlp.is_none(), d.place == Place::PrometheusOnly, "{a:?}");
            assert!(d.otlp.is_some() || d.prometheus.is_some(), "{a:?}");
            assert!(
                !d.doc.is_empty() || !d.values.is_empty(),
                "{a:?}: say what it is"
            );
        }
    }

    #[test]
    fn mode_values_are_the_models() {
        use gpu_model::TrackingMode;
        let modes = [TrackingMode::Ebpf, TrackingMode::Procfs].map(TrackingMode::as_str);
        assert_eq!(Attr::Mode.def().values, modes);
    }

    #[test]
    fn workload_kinds_are_the_models() {
        let kinds = gpu_model::WorkloadKind::ALL.map(gpu_model::WorkloadKind::as_str);
        assert_eq!(Attr::WorkloadKind.def().values, kinds);
    }

    #[test]
    fn prometheus_names_include_dcgm_and_prometheus_only_families() {
        let names: Vec<_> = prometheus_names().collect();
        assert!(names.contains(&MetricId::Info.prometheus()));
        assert!(names.contains(&MetricId::DcgmFbUsed.prometheus()));
        assert_eq!(names.len(), CATALOGUE.len(), "no OTLP-only metric today");
        assert_eq!(
            dcgm_fields_of(&CATALOGUE, MetricId::HwGpuUtilization),
            [
                MetricId::DcgmGpuUtil.prometheus(),
                MetricId::DcgmMemCopyUtil.prometheus(),
                MetricId::DcgmEncUtil.prometheus(),
                MetricId::DcgmDecUtil.prometheus(),
            ]
        );
    }
}
