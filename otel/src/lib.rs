//! gpu-agent's sinks: each snapshot as OpenTelemetry metrics, pushed over OTLP (gRPC or
//! HTTP/protobuf), and as Prometheus text. Sinks only read snapshots; they never reach
//! back into the sources.
pub mod export;
pub mod otlp;
pub mod prometheus;

/// Which metric groups a sink emits (dcgm-exporter's field lists, coarser).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Groups {
    pub device: bool,
    pub container: bool,
    /// Per-process series (cardinality): off by default.
    pub process: bool,
    #[serde(rename = "self")]
    pub self_metrics: bool,
    /// Attributes (OTLP names, e.g. "hw.gpu.index", or Prometheus label names, e.g.
    /// "pci_bus_id") left off every data point, resource and series: cardinality control.
    pub drop_attributes: Vec<String>,
}

impl Groups {
    /// Whether `key` (an OTLP attribute or a Prometheus label) is configured away.
    pub fn drops(&self, key: &str) -> bool {
        !self.drop_attributes.is_empty()
            && self
                .drop_attributes
                .iter()
                .any(|d| d == key || d.replace('.', "_") == key)
    }
}

impl Default for Groups {
    fn default() -> Self {
        Groups {
            device: true,
            container: true,
            process: false,
            self_metrics: true,
            drop_attributes: vec![],
        }
    }
}

/// Node identity shared by every sink.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeIdentity {
    pub host_name: String,
    /// k8s.node.name (downward API NODE_NAME), if any.
    pub node_name: Option<String>,
}
