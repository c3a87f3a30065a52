//! Snapshot -> OTLP `ExportMetricsServiceRequest`: one resource for the node (device and
//! self metrics, and the host entry's GPU use) and one per container or pod, because the
//! Collector's k8sattributes processor enriches resources, not data points.
use gpu_model::{AgentStats, ContainerUsage, DeviceSample, Snapshot};
use opentelemetry_proto::tonic::{
    collector::metrics::v1::ExportMetricsServiceRequest,
    common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue},
    metrics::v1::{
        metric::Data, number_data_point, AggregationTemporality, Gauge, Metric, NumberDataPoint,
        ResourceMetrics, ScopeMetrics, Sum,
    },
    resource::v1::Resource,
};

use crate::{Groups, NodeIdentity};

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

fn kv_int(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(value)),
        }),
        ..Default::default()
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Gauge,
    /// Non-monotonic cumulative sum (an UpDownCounter).
    UpDown,
    /// Monotonic cumulative sum (a Counter).
    Counter,
}

/// Accumulates data points per metric name, in first-seen order.
#[derive(Default)]
struct Metrics {
    list: Vec<(
        &'static str,
        &'static str,
        &'static str,
        Kind,
        Vec<NumberDataPoint>,
    )>,
    /// Attributes configured away (metrics.drop_attributes).
    drop: Vec<String>,
}

impl Metrics {
    #[allow(clippy::too_many_arguments)]
    fn point(
        &mut self,
        name: &'static str,
        unit: &'static str,
        description: &'static str,
        kind: Kind,
        value: f64,
        attributes: Vec<KeyValue>,
        start_ns: u64,
        time_ns: u64,
    ) {
        let mut attributes = attributes;
        if !self.drop.is_empty() {
            attributes.retain(|kv| !self.drop.iter().any(|d| d == &kv.key));
        }
        let dp = NumberDataPoint {
            attributes,
            start_time_unix_nano: match kind {
                Kind::Gauge => 0,
                _ => start_ns,
            },
            time_unix_nano: time_ns,
            value: Some(number_data_point::Value::AsDouble(value)),
            ..Default::default()
        };
        match self.list.iter_mut().find(|m| m.0 == name) {
            Some(m) => m.4.push(dp),
            None => self.list.push((name, unit, description, kind, vec![dp])),
        }
    }

    fn into_scope(self) -> ScopeMetrics {
        let metrics = self
            .list
            .into_iter()
            .map(|(name, unit, description, kind, data_points)| Metric {
                name: name.into(),
                unit: unit.into(),
                description: description.into(),
                data: Some(match kind {
                    Kind::Gauge => Data::Gauge(Gauge { data_points }),
                    Kind::UpDown | Kind::Counter => Data::Sum(Sum {
                        data_points,
                        aggregation_temporality: AggregationTemporality::Cumulative as i32,
                        is_monotonic: matches!(kind, Kind::Counter),
                    }),
                }),
                ..Default::default()
            })
            .collect();
        ScopeMetrics {
            scope: Some(InstrumentationScope {
                name: "gpu-agent".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                ..Default::default()
            }),
            metrics,
            ..Default::default()
        }
    }

    fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

const MS: u64 = 1_000_000;

fn node_attributes(ctx: &ExportContext) -> Vec<KeyValue> {
    let mut a = node_attributes_all(ctx);
    a.retain(|kv| !ctx.groups.drops(&kv.key));
    a
}

fn node_attributes_all(ctx: &ExportContext) -> Vec<KeyValue> {
    let mut a = vec![kv("service.name", ctx.service_name.clone())];
    a.push(kv("service.version", env!("CARGO_PKG_VERSION")));
    if !ctx.node.host_name.is_empty() {
        a.push(kv("host.name", ctx.node.host_name.clone()));
    }
    if let Some(n) = &ctx.node.node_name {
        a.push(kv("k8s.node.name", n.clone()));
    }
    for (k, v) in &ctx.resource_attributes {
        if !a.iter().any(|x| &x.key == k) {
            a.push(kv(k, v.clone()));
        }
    }
    a
}

/// Resource attributes of one container (or pod-level cgroup).
pub fn container_attributes(ctx: &ExportContext, c: &ContainerUsage) -> Vec<KeyValue> {
    let mut a = node_attributes_all(ctx);
    if let Some(id) = &c.container_id {
        a.push(kv("container.id", id.clone()));
    }
    if let Some(uid) = &c.pod_uid {
        a.push(kv("k8s.pod.uid", uid.clone()));
    }
    if let Some(n) = &c.pod_name {
        a.push(kv("k8s.pod.name", n.clone()));
    }
    if let Some(n) = &c.namespace {
        a.push(kv("k8s.namespace.name", n.clone()));
    }
    if let Some(n) = &c.container_name {
        a.push(kv("k8s.container.name", n.clone()));
    }
    if let Some(r) = c.runtime {
        a.push(kv("container.runtime.name", r));
    }
    a.retain(|kv| !ctx.groups.drops(&kv.key));
    a
}

fn device_attributes(d: &DeviceSample) -> Vec<KeyValue> {
    vec![
        kv("hw.id", d.uuid.clone()),
        kv("hw.type", "gpu"),
        kv("hw.vendor", "NVIDIA"),
        kv("hw.model", d.name.clone()),
        kv_int("hw.gpu.index", d.index as i64),
    ]
}

fn with(mut base: Vec<KeyValue>, extra: KeyValue) -> Vec<KeyValue> {
    base.push(extra);
    base
}

fn device_metrics(m: &mut Metrics, snap: &Snapshot, start_ns: u64, t: u64) {
    for d in &snap.devices {
        let a = device_attributes(d);
        let failed = !d.status.is_ok();
        for (state, v) in [("ok", !failed), ("failed", failed)] {
            m.point(
                "hw.status",
                "1",
                "Operational state of the GPU (1 for the current state)",
                Kind::UpDown,
                v as u8 as f64,
                with(a.clone(), kv("hw.state", state)),
                start_ns,
                t,
            );
        }
        if let Some(v) = d.memory_used_bytes {
            m.point(
                "hw.gpu.memory.usage",
                "By",
                "GPU memory in use",
                Kind::UpDown,
                v as f64,
                a.clone(),
                start_ns,
                t,
            );
        }
        if let Some(v) = d.memory_total_bytes {
            m.point(
                "hw.gpu.memory.limit",
                "By",
                "GPU memory size",
                Kind::UpDown,
                v as f64,
                a.clone(),
                start_ns,
                t,
            );
        }
        if let (Some(u), Some(l)) = (d.memory_used_bytes, d.memory_total_bytes) {
            if l > 0 {
                m.point(
                    "hw.gpu.memory.utilization",
                    "1",
                    "Fraction of GPU memory in use",
                    Kind::Gauge,
                    u as f64 / l as f64,
                    a.clone(),
                    start_ns,
                    t,
                );
            }
        }
        for (task, v) in [
            ("general", d.utilization_gpu),
            ("memory_controller", d.utilization_memory),
        ] {
            if let Some(v) = v {
                m.point(
                    "hw.gpu.utilization",
                    "1",
                    "Fraction of time the GPU was busy, per task",
                    Kind::Gauge,
                    v as f64 / 100.0,
                    with(a.clone(), kv("hw.gpu.task", task)),
                    start_ns,
                    t,
                );
            }
        }
        if let Some(v) = d.power_mw {
            m.point(
                "hw.power",
                "W",
                "Power drawn by the GPU",
                Kind::Gauge,
                v as f64 / 1000.0,
                a.clone(),
                start_ns,
                t,
            );
        }
        if let Some(v) = d.energy_mj {
            m.point(
                "hw.energy",
                "J",
                "Energy consumed by the GPU since the driver loaded",
                Kind::Counter,
                v as f64 / 1000.0,
                a.clone(),
                start_ns,
                t,
            );
        }
        if let Some(v) = d.temperature_c {
            m.point(
                "hw.temperature",
                "Cel",
                "GPU temperature",
                Kind::Gauge,
                v as f64,
                a.clone(),
                start_ns,
                t,
            );
        }
        for (ty, v) in [
            ("corrected", d.ecc_corrected),
            ("uncorrected", d.ecc_uncorrected),
        ] {
            if let Some(v) = v {
                m.point(
                    "hw.errors",
                    "{error}",
                    "ECC memory errors since the driver loaded",
                    Kind::Counter,
                    v as f64,
                    with(a.clone(), kv("error.type", ty)),
                    start_ns,
                    t,
                );
            }
        }
        for (clock, v) in [("sm", d.sm_clock_mhz), ("memory", d.mem_clock_mhz)] {
            if let Some(v) = v {
                m.point(
                    "hw.gpu.clock",
                    "Hz",
                    "Current clock frequency",
                    Kind::Gauge,
                    v as f64 * 1e6,
                    with(a.clone(), kv("clock", clock)),
                    start_ns,
                    t,
                );
            }
        }
        for mig in &d.mig_devices {
            let ma = vec![
                kv("hw.id", mig.uuid.clone()),
                kv("hw.type", "gpu"),
                kv("hw.vendor", "NVIDIA"),
                kv("hw.model", d.name.clone()),
                kv("hw.parent", d.uuid.clone()),
            ];
            if let Some(v) = mig.memory_used_bytes {
                m.point(
                    "hw.gpu.memory.usage",
                    "By",
                    "GPU memory in use",
                    Kind::UpDown,
                    v as f64,
                    ma.clone(),
                    start_ns,
                    t,
                );
            }
            if let Some(v) = mig.memory_total_bytes {
                m.point(
                    "hw.gpu.memory.limit",
                    "By",
                    "GPU memory size",
                    Kind::UpDown,
                    v as f64,
                    ma.clone(),
                    start_ns,
                    t,
                );
            }
        }
    }
}

fn container_metrics(m: &mut Metrics, c: &ContainerUsage, t: u64, start_ns: u64) {
    for g in &c.gpus {
        let mut a = vec![kv("hw.id", g.uuid.clone())];
        if g.gpu_uuid != g.uuid {
            a.push(kv("hw.parent", g.gpu_uuid.clone()));
        }
        m.point(
            "container.gpu.memory.usage",
            "By",
            "GPU memory held by the container's processes",
            Kind::UpDown,
            g.memory_used_bytes as f64,
            a.clone(),
            start_ns,
            t,
        );
        for (task, v) in [
            ("general", g.sm_util),
            ("memory_controller", g.mem_util),
            ("encoder", g.enc_util),
            ("decoder", g.dec_util),
        ] {
            if let Some(v) = v {
                m.point("container.gpu.utilization", "1",
                    "Fraction of the device's time the container's processes kept it busy, per task",
                    Kind::Gauge, v as f64 / 100.0, with(a.clone(), kv("hw.gpu.task", task)), start_ns, t);
            }
        }
        let since = if g.counters_since_ms > 0 {
            g.counters_since_ms * MS
        } else {
            start_ns
        };
        m.point(
            "container.gpu.time",
            "s",
            "GPU time used: seconds weighted by SM utilization",
            Kind::Counter,
            g.gpu_time_seconds,
            a.clone(),
            since,
            t,
        );
        m.point(
            "container.gpu.memory.time",
            "By.s",
            "GPU memory held over time (byte-seconds)",
            Kind::Counter,
            g.memory_byte_seconds,
            a.clone(),
            since,
            t,
        );
        m.point(
            "container.gpu.processes",
            "{process}",
            "Processes of the container using the device",
            Kind::UpDown,
            g.pids.len() as f64,
            a,
            start_ns,
            t,
        );
    }
}

fn allocation_metrics(m: &mut Metrics, c: &ContainerUsage, t: u64, start_ns: u64) {
    let idle = c.idle_allocations();
    for u in &c.allocated_gpus {
        let a = vec![kv("hw.id", u.clone())];
        m.point(
            "container.gpu.allocated",
            "{gpu}",
            "Devices the kubelet allocated to the container",
            Kind::UpDown,
            1.0,
            a.clone(),
            start_ns,
            t,
        );
        m.point("container.gpu.allocated.idle", "1",
            "1 when the container holds this allocated device but used neither its memory nor its SMs this sample",
            Kind::Gauge, idle.contains(&u.as_str()) as u8 as f64, a, start_ns, t);
    }
}

fn process_metrics(m: &mut Metrics, snap: &Snapshot, c: &ContainerUsage, start_ns: u64, t: u64) {
    for p in snap
        .processes
        .iter()
        .filter(|p| p.container_id == c.container_id && p.pod_uid == c.pod_uid)
    {
        let a = vec![
            kv_int("process.pid", p.pid as i64),
            kv("hw.id", p.uuid.clone()),
        ];
        m.point(
            "process.gpu.memory.usage",
            "By",
            "GPU memory held by the process",
            Kind::UpDown,
            p.used_memory_bytes as f64,
            a.clone(),
            start_ns,
            t,
        );
        for (task, v) in [
            ("general", p.sm_util),
            ("memory_controller", p.mem_util),
            ("encoder", p.enc_util),
            ("decoder", p.dec_util),
        ] {
            if let Some(v) = v {
                m.point(
                    "process.gpu.utilization",
                    "1",
                    "Fraction of the device's time the process kept it busy, per task",
                    Kind::Gauge,
                    v as f64 / 100.0,
                    with(a.clone(), kv("hw.gpu.task", task)),
                    start_ns,
                    t,
                );
            }
        }
    }
}

fn self_metrics(m: &mut Metrics, s: &AgentStats, start_ns: u64, t: u64) {
    let counters = [
        (
            "gpu_agent.events.received",
            "Process and cgroup notifications received from the kernel",
            s.events_received,
        ),
        (
            "gpu_agent.events.lost",
            "Notifications the kernel could not deliver (ring buffer full)",
            s.events_lost,
        ),
        (
            "gpu_agent.resyncs",
            "Resyncs of the process cache from the kernel map",
            s.resyncs,
        ),
        (
            "gpu_agent.procfs.fallback_lookups",
            "Single-PID /proc lookups",
            s.procfs_fallback_lookups,
        ),
        (
            "gpu_agent.export.failures",
            "Failed OTLP export attempts",
            s.export_failures,
        ),
        (
            "gpu_agent.export.dropped_batches",
            "Export batches dropped (queue full or rejected)",
            s.export_dropped_batches,
        ),
    ];
    for (name, description, v) in counters {
        m.point(
            name,
            "1",
            description,
            Kind::Counter,
            v as f64,
            vec![],
            start_ns,
            t,
        );
    }
    m.point(
        "gpu_agent.cache.processes",
        "{process}",
        "Live processes in the cache",
        Kind::UpDown,
        s.cached_processes as f64,
        vec![],
        start_ns,
        t,
    );
    m.point(
        "gpu_agent.nvml.up",
        "1",
        "1 when NVML answers",
        Kind::Gauge,
        s.nvml.is_ok() as u8 as f64,
        vec![],
        start_ns,
        t,
    );
    m.point(
        "gpu_agent.mode",
        "1",
        "Process tracking mode (1 for the current one)",
        Kind::Gauge,
        1.0,
        vec![kv("mode", s.mode.as_str())],
        start_ns,
        t,
    );
}

/// Builds the request for one export. `now_ms` stamps it when the snapshot has no time yet.
pub fn build_request(
    snap: &Snapshot,
    stats: &AgentStats,
    ctx: &ExportContext,
    now_ms: u64,
) -> ExportMetricsServiceRequest {
    let t = if snap.taken_at_ms > 0 {
        snap.taken_at_ms
    } else {
        now_ms
    } * MS;
    let start_ns = stats.started_ms.max(1) * MS;
    let fresh = || Metrics {
        drop: ctx.groups.drop_attributes.clone(),
        ..Default::default()
    };
    let mut node = fresh();
    if ctx.groups.device {
        device_metrics(&mut node, snap, start_ns, t);
    }
    if ctx.groups.self_metrics {
        self_metrics(&mut node, stats, start_ns, t);
    }
    let mut resource_metrics = vec![];
    for c in &snap.containers {
        let host = c.container_id.is_none() && c.pod_uid.is_none();
        // The host entry's GPU use goes on the node resource, without container.id.
        let mut m = fresh();
        let target = if host { &mut node } else { &mut m };
        if ctx.groups.container {
            container_metrics(target, c, t, start_ns);
            allocation_metrics(target, c, t, start_ns);
        }
        if ctx.groups.process {
            process_metrics(target, snap, c, start_ns, t);
        }
        if !host && !m.is_empty() {
            resource_metrics.push(ResourceMetrics {
                resource: Some(Resource {
                    attributes: container_attributes(ctx, c),
                    ..Default::default()
                }),
                scope_metrics: vec![m.into_scope()],
                ..Default::default()
            });
        }
    }
    if !node.is_empty() {
        resource_metrics.insert(
            0,
            ResourceMetrics {
                resource: Some(Resource {
                    attributes: node_attributes(ctx),
                    ..Default::default()
                }),
                scope_metrics: vec![node.into_scope()],
                ..Default::default()
            },
        );
    }
    ExportMetricsServiceRequest { resource_metrics }
}

#[cfg(test)]
mod tests {
    use gpu_model::{ContainerGpu, ContainerUsage, DeviceSample, DeviceStatus};

    use super::*;

    fn snap() -> Snapshot {
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
                        gpu_time_seconds: 1.5,
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

    fn ctx() -> ExportContext {
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

    fn names(rm: &ResourceMetrics) -> Vec<&str> {
        rm.scope_metrics[0]
            .metrics
            .iter()
            .map(|m| m.name.as_str())
            .collect()
    }

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
            .find(|m| m.name == "container.gpu.time")
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
        // No utilization known: no point rather than a zero.
        assert!(!names(c).contains(&"container.gpu.utilization"));
        assert!(names(&r.resource_metrics[0]).contains(&"hw.gpu.memory.usage"));
    }

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
}
