//! gpu-agent's sinks: each snapshot as OpenTelemetry metrics, pushed over OTLP (gRPC or
//! HTTP/protobuf), and as Prometheus text. Sinks only read snapshots; they never reach
//! back into the sources.
pub mod catalogue;
pub mod dcgm;
pub mod export;
mod grpc;
pub mod otlp;
mod pb;
pub mod prometheus;
pub mod settings;
pub mod usage;

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

#[cfg(test)]
mod drop_rule_tests {
    use gpu_model::{AgentStats, ContainerGpu, ContainerUsage, DeviceSample, Snapshot};

    use super::*;

    /// Either name of an attribute drops it from both sinks.
    #[test]
    fn an_otlp_key_or_a_label_name_drops_the_attribute_everywhere() {
        let snap = Snapshot {
            devices: vec![DeviceSample {
                uuid: "GPU-a".into(),
                name: "H100".into(),
                memory_used_bytes: Some(5),
                ..Default::default()
            }],
            containers: vec![ContainerUsage {
                container_id: Some("c1".into()),
                container_name: Some("main".into()),
                gpus: vec![ContainerGpu {
                    uuid: "GPU-a".into(),
                    gpu_uuid: "GPU-a".into(),
                    memory_used_bytes: 3,
                    sm_util: None,
                    mem_util: None,
                    enc_util: None,
                    dec_util: None,
                    pids: vec![1],
                    gpu_time_seconds: None,
                    memory_byte_seconds: 0.0,
                    counters_since_ms: 0,
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let groups = Groups {
            drop_attributes: vec!["hw.gpu.index".into(), "container".into()],
            ..Default::default()
        };
        let prom = prometheus::PromOptions {
            groups: groups.clone(),
            ..Default::default()
        };
        let text = prometheus::render(&snap, &AgentStats::default(), &prom);
        assert!(
            text.contains(r#"hw_gpu_memory_usage_bytes{hw_id="GPU-a",model="H100""#),
            "{text}"
        );
        assert!(
            !text.contains("gpu=\"") && !text.contains("container=\""),
            "{text}"
        );
        let ctx = otlp::ExportContext {
            groups,
            ..Default::default()
        };
        let req = otlp::build_request(&snap, &AgentStats::default(), &ctx, 1);
        let keys: Vec<&str> = req
            .resource_metrics
            .iter()
            .flat_map(|rm| {
                let resource = rm.resource.iter().flat_map(|r| &r.attributes);
                let points = rm
                    .scope_metrics
                    .iter()
                    .flat_map(|s| &s.metrics)
                    .flat_map(|m| {
                        use opentelemetry_proto::tonic::metrics::v1::metric::Data;
                        match &m.data {
                            Some(Data::Gauge(g)) => g.data_points.iter(),
                            Some(Data::Sum(s)) => s.data_points.iter(),
                            _ => [].iter(),
                        }
                    });
                resource.chain(points.flat_map(|p| &p.attributes))
            })
            .map(|kv| kv.key.as_str())
            .collect();
        assert!(
            keys.contains(&"hw.id") && keys.contains(&"container.id"),
            "{keys:?}"
        );
        assert!(!keys.contains(&"hw.gpu.index"), "{keys:?}");
        assert!(!keys.contains(&"k8s.container.name"), "{keys:?}");
    }
}
