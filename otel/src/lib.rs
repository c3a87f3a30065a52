//! gpu-agent's sinks: each snapshot as OpenTelemetry metrics, pushed over OTLP (gRPC or
//! HTTP/protobuf), and as Prometheus text. Sinks only read snapshots; they never reach
//! back into the sources.
pub mod catalogue;
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
    /// Attributes left off every resource, data point and series (cardinality control),
    /// by OTLP key (e.g. "hw.gpu.index") or Prometheus label name (e.g. "gpu"): see
    /// [`Groups::drops`].
    pub drop_attributes: Vec<String>,
}

impl Groups {
    /// The one drop rule, for OTLP resources, OTLP data points and Prometheus labels alike:
    /// an attribute is dropped when its OTLP key or its Prometheus label name is listed. The
    /// catalogue's attributes have both names where both sinks carry them (`hw.gpu.index`
    /// is the label `gpu`); a resource attribute from the environment has its key only.
    pub fn drops(&self, otlp_key: Option<&str>, label: Option<&str>) -> bool {
        self.drop_attributes
            .iter()
            .any(|d| Some(d.as_str()) == otlp_key || Some(d.as_str()) == label)
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
