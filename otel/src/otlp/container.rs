//! What a container's (or pod-level cgroup's) resource reports: its GPU use, allocations,
//! XID charges, accounts and, opted in, its processes; and the resources of containers gone
//! that XIDs were charged to.
use std::collections::HashMap;

use gpu_model::{ContainerUsage, ContainerXid, ProcessUsage, Snapshot};

use crate::catalogue::{Attr, MetricId as M, ERROR_TYPES, GPU_TASKS};

use super::{
    metrics::{int, s, write_resource, Attrs, Metrics},
    resource::container_resource_bytes,
    ExportContext, MS,
};

/// The four engines NVML samples per process, as fractions.
fn tasks(v: [Option<u32>; 4]) -> [(&'static str, Option<f64>); 4] {
    let mut out = GPU_TASKS.map(|t| (t, None));
    for (o, v) in out.iter_mut().zip(v) {
        o.1 = v.map(|v| v as f64 / 100.0);
    }
    out
}

/// The device a container's figure is of: a GPU, or a MIG device and its parent GPU.
fn device_of(m: &mut Metrics, uuid: &str, gpu_uuid: &str) -> Attrs {
    let parent = (gpu_uuid != uuid).then(|| s(Attr::HwParent, gpu_uuid));
    m.attrs(std::iter::once(s(Attr::HwId, uuid)).chain(parent))
}

fn container_metrics(m: &mut Metrics, c: &ContainerUsage) {
    for g in &c.gpus {
        let a = device_of(m, &g.uuid, &g.gpu_uuid);
        m.point(M::ContainerGpuMemoryUsage, g.memory_used_bytes as f64, a);
        let util = [g.sm_util, g.mem_util, g.enc_util, g.dec_util];
        m.points(M::ContainerGpuUtilization, a, Attr::HwGpuTask, tasks(util));
        // The counters start when the agent first saw this container on this device.
        let since = if g.counters_since_ms > 0 {
            g.counters_since_ms * MS
        } else {
            m.start_ns
        };
        // Absent where the device cannot say its processes' SM utilization (MIG).
        if let Some(t) = g.gpu_time_seconds {
            m.point_since(M::ContainerGpuTime, t, a, since);
        }
        m.point_since(M::ContainerGpuMemoryTime, g.memory_byte_seconds, a, since);
        m.point(M::ContainerGpuProcesses, g.pids.len() as f64, a);
    }
}

/// XID errors the kernel log charged to the container's processes.
fn xid_metrics(m: &mut Metrics, xids: &[&ContainerXid]) {
    for x in xids {
        let a = device_of(m, &x.uuid, &x.gpu_uuid);
        let a = m.with(
            a,
            [
                s(Attr::ErrorType, ERROR_TYPES[3]),
                int(Attr::Xid, x.xid as i64),
            ],
        );
        m.point(M::ContainerGpuErrors, x.count as f64, a);
    }
}

fn allocation_metrics(m: &mut Metrics, c: &ContainerUsage) {
    let idle = c.idle_allocations();
    for u in c.allocated_gpus.iter() {
        let claim = c.claim_of(u).map(|d| {
            [
                s(Attr::ClaimName, &d.dra.claim_name),
                s(Attr::ClaimNamespace, &d.dra.claim_namespace),
            ]
        });
        let a = m.attrs(std::iter::once(s(Attr::HwId, u)).chain(claim.into_iter().flatten()));
        m.point(M::ContainerGpuAllocated, 1.0, a);
        let is_idle = idle.contains(&&**u);
        m.point(M::ContainerGpuAllocatedIdle, is_idle as u8 as f64, a);
    }
}

/// Energy, peak memory, limits and NVML accounting of each device the container used or
/// was allocated.
fn account_metrics(m: &mut Metrics, c: &ContainerUsage) {
    for a in &c.accounts {
        let at = device_of(m, &a.uuid, &a.gpu_uuid);
        if a.energy_since_ms > 0 {
            let since = a.energy_since_ms * MS;
            m.point_since(M::ContainerGpuEnergy, a.energy_joules, at, since);
        }
        if let Some(p) = a.memory_peak_bytes {
            m.point(M::ContainerGpuMemoryPeak, p as f64, at);
        }
        if let (Some(l), Some(src)) = (a.memory_limit_bytes, a.memory_limit_source) {
            let la = m.with(at, [s(Attr::LimitSource, src.as_str())]);
            m.point(M::ContainerGpuMemoryLimit, l as f64, la);
        }
        if let Some(p) = a.sm_limit_percent {
            m.point(M::ContainerGpuUtilizationLimit, p as f64 / 100.0, at);
        }
        if a.accounted_processes > 0 {
            m.point(M::ContainerGpuAccountingTime, a.accounted_gpu_seconds, at);
            let n = a.accounted_processes as f64;
            m.point(M::ContainerGpuAccountingProcesses, n, at);
        }
    }
}

fn process_metrics(m: &mut Metrics, processes: &[&ProcessUsage]) {
    for p in processes {
        let a = m.attrs([int(Attr::ProcessPid, p.pid as i64), s(Attr::HwId, &p.uuid)]);
        m.point(M::ProcessGpuMemoryUsage, p.used_memory_bytes as f64, a);
        let util = [p.sm_util, p.mem_util, p.enc_util, p.dec_util];
        m.points(M::ProcessGpuUtilization, a, Attr::HwGpuTask, tasks(util));
    }
}

/// A container's key in the snapshot's per-container lists.
type Owner<'a> = (Option<&'a str>, Option<&'a str>);

fn owner<'a, A: AsRef<str>, B: AsRef<str>>(
    container_id: &'a Option<A>,
    pod_uid: &'a Option<B>,
) -> Owner<'a> {
    (
        container_id.as_ref().map(AsRef::as_ref),
        pod_uid.as_ref().map(AsRef::as_ref),
    )
}

/// The snapshot's XID charges and per-process detail by container, made once per request:
/// looking them up per container would cost containers x processes.
#[derive(Default)]
pub(super) struct ByOwner<'a> {
    xids: HashMap<Owner<'a>, Vec<&'a ContainerXid>>,
    processes: HashMap<Owner<'a>, Vec<&'a ProcessUsage>>,
}

impl<'a> ByOwner<'a> {
    pub(super) fn has_xids(&self, c: &ContainerUsage) -> bool {
        !self.xids.is_empty() && self.xids.contains_key(&owner(&c.container_id, &c.pod_uid))
    }

    pub(super) fn of(snap: &'a Snapshot) -> ByOwner<'a> {
        let mut by = ByOwner::default();
        for x in &snap.container_xids {
            let k = owner(&x.container_id, &x.pod_uid);
            by.xids.entry(k).or_default().push(x);
        }
        for p in &snap.processes {
            let k = owner(&p.container_id, &p.pod_uid);
            by.processes.entry(k).or_default().push(p);
        }
        by
    }
}

/// Everything one container (or the host entry) reports, onto `m`.
pub(super) fn container_group(
    m: &mut Metrics,
    c: &ContainerUsage,
    ctx: &ExportContext,
    by: &ByOwner,
) {
    let key = owner(&c.container_id, &c.pod_uid);
    if ctx.groups.container {
        container_metrics(m, c);
        allocation_metrics(m, c);
        xid_metrics(m, by.xids.get(&key).map_or(&[], Vec::as_slice));
        account_metrics(m, c);
    }
    if ctx.groups.process {
        process_metrics(m, by.processes.get(&key).map_or(&[], Vec::as_slice));
    }
}

/// XID charges of containers no longer in the snapshot (the process, or the container,
/// died of it): a resource of their own, so that their counters go on.
pub(super) fn xids_of_gone_containers(
    snap: &Snapshot,
    by: &ByOwner,
    node: &[u8],
    m: &mut Metrics,
    out: &mut Vec<u8>,
) {
    // Nearly always: then the set of every container present is not built.
    if snap.container_xids.is_empty() {
        return;
    }
    let present: std::collections::HashSet<Owner> = snap
        .containers
        .iter()
        .map(|c| owner(&c.container_id, &c.pod_uid))
        .collect();
    let mut done = std::collections::HashSet::new();
    let mut attrs = vec![];
    for x in &snap.container_xids {
        let key = owner(&x.container_id, &x.pod_uid);
        if present.contains(&key) || !done.insert(key) {
            continue;
        }
        m.clear();
        xid_metrics(m, &by.xids[&key]);
        let c = ContainerUsage {
            container_id: x.container_id.as_deref().map(Into::into),
            pod_uid: x.pod_uid.as_deref().map(Into::into),
            pod_name: x.pod_name.as_deref().map(Into::into),
            namespace: x.namespace.as_deref().map(Into::into),
            container_name: x.container_name.as_deref().map(Into::into),
            ..Default::default()
        };
        container_resource_bytes(&mut attrs, node, &c, m.drop);
        write_resource(out, &attrs, m);
    }
}

#[cfg(test)]
mod tests {
    use gpu_model::AgentStats;
    use opentelemetry_proto::tonic::{
        common::v1::{any_value, AnyValue},
        metrics::v1::{metric::Data, ResourceMetrics},
    };

    use super::*;
    use crate::otlp::{
        build_request,
        fixtures::{ctx, names, snap},
    };

    #[test]
    fn one_resource_for_the_node_and_one_per_container() {
        let stats = AgentStats {
            started_ms: 500,
            ..Default::default()
        };
        let r = build_request(&snap(), &stats, &ctx(), 0);
        assert_eq!(r.resource_metrics.len(), 2);
        let c = &r.resource_metrics[1];
        let keys: Vec<&str> = c
            .resource
            .as_ref()
            .unwrap()
            .attributes
            .iter()
            .map(|k| k.key.as_str())
            .collect();
        assert!(
            keys.contains(&"container.id")
                && keys.contains(&"k8s.pod.uid")
                && keys.contains(&"k8s.node.name")
        );
        let time = c.scope_metrics[0]
            .metrics
            .iter()
            .find(|m| m.name == "container.gpu.memory.time")
            .unwrap();
        let Some(Data::Sum(s)) = &time.data else {
            panic!()
        };
        assert_eq!(
            s.data_points[0].start_time_unix_nano,
            1_000 * MS,
            "since the container was first seen"
        );
        assert_eq!(s.data_points[0].time_unix_nano, 2_000 * MS);
        // MIG: charged to the MIG device, parent named.
        let a = &s.data_points[0].attributes;
        assert!(a.iter().any(|k| k.key == "hw.parent"));
        // No utilization known, nor GPU time: no point rather than a zero.
        assert!(!names(c).contains(&"container.gpu.utilization"));
        assert!(!names(c).contains(&"container.gpu.time"));
        assert!(names(&r.resource_metrics[0]).contains(&"hw.gpu.memory.usage"));
    }

    #[test]
    fn energy_limits_and_the_idle_entry() {
        let mut sn = snap();
        sn.devices[0].sharing.idle_energy_joules = Some(40.0);
        sn.containers[0].accounts = vec![gpu_model::GpuAccount {
            uuid: "MIG-1".into(),
            gpu_uuid: "GPU-a".into(),
            energy_joules: 60.0,
            energy_since_ms: 1_500,
            memory_limit_bytes: Some(10),
            memory_limit_source: Some(gpu_model::LimitSource::Mig),
            ..Default::default()
        }];
        let r = build_request(&sn, &AgentStats::default(), &ctx(), 0);
        let point = |rm: &ResourceMetrics, name: &str| {
            let m = rm.scope_metrics[0].metrics.iter().find(|m| m.name == name);
            match m.and_then(|m| m.data.clone()) {
                Some(Data::Sum(s)) => s.data_points[0].clone(),
                other => panic!("{name}: {other:?}"),
            }
        };
        let e = point(&r.resource_metrics[1], "container.gpu.energy");
        assert_eq!(e.start_time_unix_nano, 1_500 * MS);
        assert!(e.attributes.iter().any(|k| k.key == "hw.parent"));
        let l = point(&r.resource_metrics[1], "container.gpu.memory.limit");
        assert!(l.attributes.iter().any(|k| k.key == "limit.source"));
        // The idle entry is on the node resource, told apart by its owner.
        let idle = point(&r.resource_metrics[0], "container.gpu.energy");
        assert!(idle.attributes.iter().any(|k| k.key == "gpu_agent.owner"
            && k.value
                == Some(AnyValue {
                    value: Some(any_value::Value::StringValue("idle".into()))
                })));
    }

    /// A device a DRA claim allocated carries the claim on its allocation points; a device
    /// plugin's does not.
    #[test]
    fn a_claimed_devices_allocation_names_its_claim() {
        let mut sn = snap();
        sn.containers[0].allocated_gpus = vec!["GPU-a".into(), "MIG-1".into()].into();
        sn.containers[0].claims = vec![gpu_model::ClaimDevice {
            uuid: "MIG-1".into(),
            dra: std::sync::Arc::new(gpu_model::DraDevice {
                claim_namespace: "ml".into(),
                claim_name: "trainer-gpu".into(),
                driver: "gpu.nvidia.com".into(),
                pool: "node-1".into(),
                device: "gpu-0-mig-1g10gb-19-0".into(),
            }),
            holders: 1,
        }]
        .into();
        let r = build_request(&sn, &AgentStats::default(), &ctx(), 0);
        let m = r.resource_metrics[1].scope_metrics[0].metrics.iter();
        let m = m
            .clone()
            .find(|m| m.name == "container.gpu.allocated")
            .unwrap();
        let Some(Data::Sum(s)) = &m.data else {
            panic!("{m:?}")
        };
        let attrs: Vec<Vec<(&str, String)>> = (s.data_points.iter())
            .map(|p| {
                (p.attributes.iter())
                    .map(|k| {
                        let v = match k.value.as_ref().and_then(|v| v.value.as_ref()) {
                            Some(any_value::Value::StringValue(s)) => s.clone(),
                            v => format!("{v:?}"),
                        };
                        (k.key.as_str(), v)
                    })
                    .collect()
            })
            .collect();
        let s = |v: &str| v.to_string();
        assert_eq!(
            attrs,
            [
                vec![("hw.id", s("GPU-a"))],
                vec![
                    ("hw.id", s("MIG-1")),
                    ("k8s.resourceclaim.name", s("trainer-gpu")),
                    ("k8s.resourceclaim.namespace", s("ml")),
                ],
            ]
        );
    }
}
