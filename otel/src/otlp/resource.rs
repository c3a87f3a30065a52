//! Resource attributes: the node's (and the configured ones), then each container's
//! identity and its pod's owner.
use gpu_model::{ContainerUsage, Workload, WorkloadKind};
use opentelemetry_proto::tonic::{common::v1::KeyValue, resource::v1::Resource};
use prost::Message;

use crate::{
    catalogue::{Attr, Dropped},
    pb,
};

use super::{kv, metrics::s, metrics::Attribute, ExportContext};

/// The node resource's attributes, then the configured ones that do not name one of them:
/// the start of every resource's.
fn node_attributes(ctx: &ExportContext, drop: Dropped) -> Vec<KeyValue> {
    let mut a = vec![
        (Attr::ServiceName, ctx.service_name.as_str()),
        (Attr::ServiceVersion, env!("CARGO_PKG_VERSION")),
    ];
    if !ctx.node.host_name.is_empty() {
        a.push((Attr::HostName, &ctx.node.host_name));
    }
    if let Some(n) = &ctx.node.node_name {
        a.push((Attr::K8sNodeName, n));
    }
    let mut out: Vec<KeyValue> = a
        .iter()
        .filter(|(x, _)| !drop.contains(*x))
        .map(|(x, v)| kv(x.otlp(), *v))
        .collect();
    let configured = ctx
        .resource_attributes
        .iter()
        .filter(|(k, _)| !a.iter().any(|(x, _)| x.otlp() == k))
        .filter(|(k, _)| !ctx.groups.drops(Some(k), None))
        .map(|(k, v)| kv(k, v.clone()));
    out.extend(configured);
    out
}

/// The node's resource attributes, encoded as `Resource.attributes` fields.
pub(super) fn node_resource_bytes(ctx: &ExportContext, drop: Dropped) -> Vec<u8> {
    let mut out = vec![];
    for kv in node_attributes(ctx, drop) {
        prost::encoding::message::encode(1, &kv, &mut out);
    }
    out
}

/// What names a container (or pod-level cgroup) resource besides the node's attributes.
fn identity(c: &ContainerUsage) -> impl Iterator<Item = Attribute<'_>> {
    [
        (Attr::ContainerId, c.container_id.as_deref()),
        (Attr::PodUid, c.pod_uid.as_deref()),
        (Attr::PodName, c.pod_name.as_deref()),
        (Attr::Namespace, c.namespace.as_deref()),
        (Attr::ContainerName, c.container_name.as_deref()),
        (Attr::Runtime, c.runtime),
    ]
    .into_iter()
    .chain(workload_attributes(c.workload.as_deref()))
    .filter_map(|(a, v)| v.map(|v| s(a, v)))
}

/// The pod's owner in the semantic conventions' `k8s.*.name`: a Deployment's with its
/// ReplicaSet, a CronJob's with its Job; nothing for a pod no controller owns.
fn workload_attributes(w: Option<&Workload>) -> [(Attr, Option<&str>); 2] {
    let none = (Attr::JobName, None);
    let Some(w) = w else {
        return [none, none];
    };
    let name = Some(&*w.name);
    let attr = match w.kind {
        WorkloadKind::Deployment => {
            let rs = (Attr::ReplicaSetName, w.replicaset.as_deref());
            return [(Attr::DeploymentName, name), rs];
        }
        WorkloadKind::CronJob => {
            return [(Attr::CronJobName, name), (Attr::JobName, w.job.as_deref())];
        }
        WorkloadKind::ReplicaSet => Attr::ReplicaSetName,
        WorkloadKind::StatefulSet => Attr::StatefulSetName,
        WorkloadKind::DaemonSet => Attr::DaemonSetName,
        WorkloadKind::Job => Attr::JobName,
        WorkloadKind::Pod => return [none, none],
    };
    [(attr, name), none]
}

/// A container resource's encoded attributes: the node's, then its identity.
pub(super) fn container_resource_bytes(
    out: &mut Vec<u8>,
    node: &[u8],
    c: &ContainerUsage,
    drop: Dropped,
) {
    out.clear();
    out.extend_from_slice(node);
    for (a, v) in identity(c).filter(|(a, _)| !drop.contains(*a)) {
        pb::key_value(out, 1, a.otlp(), v);
    }
}

/// Resource attributes of one container (or pod-level cgroup).
pub fn container_attributes(ctx: &ExportContext, c: &ContainerUsage) -> Vec<KeyValue> {
    let drop = Dropped::of(&ctx.groups);
    let mut bytes = vec![];
    container_resource_bytes(&mut bytes, &node_resource_bytes(ctx, drop), c, drop);
    Resource::decode(&bytes[..])
        .expect("the agent's own encoding decodes")
        .attributes
}

#[cfg(test)]
mod tests {
    use gpu_model::AgentStats;
    use opentelemetry_proto::tonic::{common::v1::any_value, metrics::v1::metric::Data};

    use super::*;
    use crate::otlp::{
        build_request,
        fixtures::{ctx, deployment, names, snap},
    };

    #[test]
    fn groups_and_dropped_attributes_apply() {
        let mut cx = ctx();
        cx.groups.device = false;
        cx.groups.drop_attributes = vec!["k8s.node.name".into(), "hw.parent".into()];
        let r = build_request(&snap(), &AgentStats::default(), &cx, 0);
        assert!(!names(&r.resource_metrics[0]).contains(&"hw.gpu.memory.usage"));
        for rm in &r.resource_metrics {
            assert!(rm
                .resource
                .as_ref()
                .unwrap()
                .attributes
                .iter()
                .all(|k| k.key != "k8s.node.name"));
            for m in &rm.scope_metrics[0].metrics {
                let pts = match &m.data {
                    Some(Data::Gauge(g)) => &g.data_points,
                    Some(Data::Sum(s)) => &s.data_points,
                    _ => continue,
                };
                assert!(pts
                    .iter()
                    .all(|p| p.attributes.iter().all(|k| k.key != "hw.parent")));
            }
        }
    }

    #[test]
    fn a_containers_resource_names_its_pods_owner_in_the_semantic_conventions() {
        let of = |kind, rs: Option<&str>, job: Option<&str>| {
            let c = ContainerUsage {
                container_id: Some("c".into()),
                workload: Some(std::sync::Arc::new(Workload {
                    kind,
                    name: "w".into(),
                    replicaset: rs.map(Into::into),
                    job: job.map(Into::into),
                })),
                ..Default::default()
            };
            let attrs = container_attributes(&ctx(), &c);
            let k8s = attrs
                .iter()
                .filter(|kv| kv.key.starts_with("k8s.") && kv.key != "k8s.node.name");
            let text = |kv: &KeyValue| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(v)) => format!("{}={v}", kv.key),
                v => panic!("{v:?}"),
            };
            k8s.map(text).collect::<Vec<_>>()
        };
        use WorkloadKind::*;
        assert_eq!(
            of(Deployment, Some("w-5d8f"), None),
            ["k8s.deployment.name=w", "k8s.replicaset.name=w-5d8f"]
        );
        assert_eq!(of(ReplicaSet, None, None), ["k8s.replicaset.name=w"]);
        assert_eq!(of(StatefulSet, None, None), ["k8s.statefulset.name=w"]);
        assert_eq!(of(DaemonSet, None, None), ["k8s.daemonset.name=w"]);
        assert_eq!(of(Job, None, None), ["k8s.job.name=w"]);
        assert_eq!(
            of(CronJob, None, Some("w-28948930")),
            ["k8s.cronjob.name=w", "k8s.job.name=w-28948930"]
        );
        assert!(
            of(Pod, None, None).is_empty(),
            "a bare pod has no owner to name"
        );
        // An attribute dropped by the config goes from every resource.
        let mut cx = ctx();
        cx.groups.drop_attributes = vec!["k8s.replicaset.name".into()];
        let c = ContainerUsage {
            container_id: Some("c".into()),
            workload: Some(deployment("w", "w-5d8f")),
            ..Default::default()
        };
        let keys: Vec<String> = container_attributes(&cx, &c)
            .into_iter()
            .map(|kv| kv.key)
            .collect();
        assert!(keys.contains(&"k8s.deployment.name".into()), "{keys:?}");
        assert!(!keys.contains(&"k8s.replicaset.name".into()), "{keys:?}");
    }
}
