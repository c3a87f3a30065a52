//! Snapshot -> OTLP `ExportMetricsServiceRequest`: one resource for the node (device and
//! self metrics, and the host entry's GPU use) and one per container or pod, because the
//! Collector's k8sattributes processor enriches resources, not data points.
//!
//! The request is encoded straight to protobuf bytes (pb.rs): each attribute set is
//! encoded once and shared by the points that carry it, and one `Metrics` is reused for
//! every container, so an export allocates almost nothing however many points it holds.
//!
//! `metrics` gathers one resource's points and encodes them; `resource` makes the resource
//! attributes; `node` and `container` say what each resource reports; `batch` makes an
//! export's requests, of a bounded size, patched from the last export's (`reuse`).
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};

use crate::{Groups, NodeIdentity};

mod batch;
mod container;
mod metrics;
mod node;
mod resource;
mod reuse;

pub use batch::{build_request, encode_request, requests, Requests};
pub use resource::container_attributes;
pub use reuse::Reuse;

/// What every request carries besides the snapshot.
#[derive(Debug, Clone, Default)]
pub struct ExportContext {
    pub node: NodeIdentity,
    pub service_name: String,
    /// OTEL_RESOURCE_ATTRIBUTES and the config's resource attributes.
    pub resource_attributes: Vec<(String, String)>,
    pub groups: Groups,
}

pub fn kv(key: &str, value: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        ..Default::default()
    }
}

const MS: u64 = 1_000_000;

#[cfg(test)]
mod fixtures;
