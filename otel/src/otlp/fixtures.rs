//! What the encoding's tests encode: a snapshot of one GPU and a container on a MIG device
//! of it, and the context of its export.
use gpu_model::{
    ContainerGpu, ContainerUsage, DeviceSample, DeviceStatus, Snapshot, Workload, WorkloadKind,
};
use opentelemetry_proto::tonic::metrics::v1::ResourceMetrics;

use super::ExportContext;
use crate::{Groups, NodeIdentity};

pub(super) fn snap() -> Snapshot {
    Snapshot {
        taken_at_ms: 2_000,
        devices: vec![DeviceSample {
            uuid: "GPU-a".into(),
            name: "H100".into(),
            status: DeviceStatus::Ok,
            memory_used_bytes: Some(7),
            ..Default::default()
        }],
        containers: vec![
            ContainerUsage {
                container_id: Some("c1".into()),
                pod_uid: Some("p1".into()),
                runtime: Some("cri-o"),
                gpus: vec![ContainerGpu {
                    uuid: "MIG-1".into(),
                    gpu_uuid: "GPU-a".into(),
                    memory_used_bytes: 3,
                    sm_util: None,
                    mem_util: None,
                    enc_util: None,
                    dec_util: None,
                    pids: vec![1],
                    // A MIG device cannot say its processes' SM utilization.
                    gpu_time_seconds: None,
                    memory_byte_seconds: 9.0,
                    counters_since_ms: 1_000,
                }],
                ..Default::default()
            },
            ContainerUsage {
                ..Default::default()
            },
        ],
        ..Default::default()
    }
}

pub(super) fn ctx() -> ExportContext {
    ExportContext {
        node: NodeIdentity {
            host_name: "h".into(),
            node_name: Some("n".into()),
        },
        service_name: "gpu-agent".into(),
        groups: Groups::default(),
        ..Default::default()
    }
}

pub(super) fn names(rm: &ResourceMetrics) -> Vec<&str> {
    rm.scope_metrics[0]
        .metrics
        .iter()
        .map(|m| m.name.as_str())
        .collect()
}

pub(super) fn deployment(name: &str, replicaset: &str) -> std::sync::Arc<Workload> {
    std::sync::Arc::new(Workload {
        kind: WorkloadKind::Deployment,
        name: name.into(),
        replicaset: Some(replicaset.into()),
        job: None,
    })
}
