//! Snapshot -> OTLP `ExportMetricsServiceRequest`: one resource for the node (device and
//! self metrics, and the host entry's GPU use) and one per container or pod, because the
//! Collector's k8sattributes processor enriches resources, not data points.
use gpu_model::{AgentStats, ContainerUsage, ContainerXid, DeviceSample, Snapshot};
use opentelemetry_proto::tonic::{
    collector::metrics::v1::ExportMetricsServiceRequest,
    common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue},
    metrics::v1::{
        metric::Data, number_data_point, AggregationTemporality, Gauge, Metric, NumberDataPoint,
        ResourceMetrics, ScopeMetrics, Sum,
    },
    resource::v1::Resource,
};

use crate::{
    catalogue::{
        Attr, Dropped, Kind, MetricId as M, MetricId, CLOCKS, DIRECTIONS, ECC_ERROR_TYPES,
        ERROR_TYPES, GPU_ENGINES, GPU_LINKS, GPU_TASKS, HW_STATES, HW_TYPE_GPU, HW_VENDOR_NVIDIA,
        OWNER_IDLE, THROTTLE_REASONS,
    },
    Groups, NodeIdentity,
};

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

/// An attribute before encoding: a catalogue entry, so that the drop rule applies to it.
type Attribute = (Attr, any_value::Value);

fn s(a: Attr, v: impl Into<String>) -> Attribute {
    (a, any_value::Value::StringValue(v.into()))
}

fn int(a: Attr, v: i64) -> Attribute {
    (a, any_value::Value::IntValue(v))
}

/// Encodes onto `out` the attributes that are not configured away.
fn encode_onto(
    out: &mut Vec<KeyValue>,
    attributes: impl IntoIterator<Item = Attribute>,
    drop: Dropped,
) {
    let kept = attributes.into_iter().filter(|(a, _)| !drop.contains(*a));
    out.extend(kept.map(|(a, v)| KeyValue {
        key: a.otlp().to_string(),
        value: Some(AnyValue { value: Some(v) }),
        ..Default::default()
    }));
}

/// Accumulates one resource's data points per metric, in first-seen order.
struct Metrics {
    list: Vec<(MetricId, Vec<NumberDataPoint>)>,
    /// The agent's start: the start time of every sum.
    start_ns: u64,
    time_ns: u64,
    drop: Dropped,
}

impl Metrics {
    fn new(start_ns: u64, time_ns: u64, drop: Dropped) -> Metrics {
        Metrics {
            list: vec![],
            start_ns,
            time_ns,
            drop,
        }
    }

    /// Data-point attributes, encoded once for the points that share them.
    fn attrs(&self, attributes: impl IntoIterator<Item = Attribute>) -> Vec<KeyValue> {
        let mut a = vec![];
        encode_onto(&mut a, attributes, self.drop);
        a
    }

    /// `base` and one more attribute.
    fn with(&self, base: &[KeyValue], extra: Attribute) -> Vec<KeyValue> {
        let mut a = Vec::with_capacity(base.len() + 1);
        a.extend_from_slice(base);
        encode_onto(&mut a, [extra], self.drop);
        a
    }

    fn point(&mut self, id: MetricId, value: f64, attributes: Vec<KeyValue>) {
        self.point_since(id, value, attributes, self.start_ns);
    }

    /// A point of a sum that started counting at `start_ns`.
    fn point_since(&mut self, id: MetricId, value: f64, attributes: Vec<KeyValue>, start_ns: u64) {
        let def = id.def();
        debug_assert!(
            attributes.iter().all(|kv| Attr::ALL
                .iter()
                .any(|&a| a.def().otlp == Some(kv.key.as_str()) && def.carries_otlp(a))),
            "{id:?}: {attributes:?} not all in the catalogue"
        );
        let dp = NumberDataPoint {
            attributes,
            start_time_unix_nano: match def.kind {
                Kind::Gauge => 0,
                Kind::UpDownCounter | Kind::Counter => start_ns,
            },
            time_unix_nano: self.time_ns,
            value: Some(number_data_point::Value::AsDouble(value)),
            ..Default::default()
        };
        match self.list.iter_mut().find(|m| m.0 == id) {
            Some(m) => m.1.push(dp),
            None => self.list.push((id, vec![dp])),
        }
    }

    /// A point for each value known; an unknown one gets no point rather than a zero.
    fn points<const N: usize>(
        &mut self,
        id: MetricId,
        base: &[KeyValue],
        by: Attr,
        values: [(&'static str, Option<f64>); N],
    ) {
        for (v, value) in values {
            if let Some(value) = value {
                let a = self.with(base, s(by, v));
                self.point(id, value, a);
            }
        }
    }

    fn into_scope(self) -> ScopeMetrics {
        let metrics = self
            .list
            .into_iter()
            .map(|(id, data_points)| {
                let def = id.def();
                Metric {
                    name: id.otlp().into(),
                    unit: def.unit.into(),
                    description: def.help.into(),
                    data: Some(match def.kind {
                        Kind::Gauge => Data::Gauge(Gauge { data_points }),
                        Kind::UpDownCounter | Kind::Counter => Data::Sum(Sum {
                            data_points,
                            aggregation_temporality: AggregationTemporality::Cumulative as i32,
                            is_monotonic: def.kind == Kind::Counter,
                        }),
                    }),
                    ..Default::default()
                }
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

/// The node resource's attributes, then the configured ones that do not name one of them:
/// the start of every resource's.
fn node_attributes(ctx: &ExportContext, drop: Dropped) -> Vec<KeyValue> {
    let mut a = vec![
        s(Attr::ServiceName, ctx.service_name.clone()),
        s(Attr::ServiceVersion, env!("CARGO_PKG_VERSION")),
    ];
    if !ctx.node.host_name.is_empty() {
        a.push(s(Attr::HostName, ctx.node.host_name.clone()));
    }
    if let Some(n) = &ctx.node.node_name {
        a.push(s(Attr::K8sNodeName, n.clone()));
    }
    let configured: Vec<KeyValue> = ctx
        .resource_attributes
        .iter()
        .filter(|(k, _)| !a.iter().any(|(x, _)| x.otlp() == k))
        .filter(|(k, _)| !ctx.groups.drops(Some(k), None))
        .map(|(k, v)| kv(k, v.clone()))
        .collect();
    let mut out = Vec::with_capacity(a.len() + configured.len());
    encode_onto(&mut out, a, drop);
    out.extend(configured);
    out
}

/// A container (or pod-level cgroup) resource: the node's attributes and its identity.
fn container_resource(node: &[KeyValue], c: &ContainerUsage, drop: Dropped) -> Resource {
    let known = [
        (Attr::ContainerId, c.container_id.as_deref()),
        (Attr::PodUid, c.pod_uid.as_deref()),
        (Attr::PodName, c.pod_name.as_deref()),
        (Attr::Namespace, c.namespace.as_deref()),
        (Attr::ContainerName, c.container_name.as_deref()),
        (Attr::Runtime, c.runtime),
    ];
    let mut attributes = Vec::with_capacity(node.len() + known.len());
    attributes.extend_from_slice(node);
    let identity = known.into_iter().filter_map(|(a, v)| v.map(|v| s(a, v)));
    encode_onto(&mut attributes, identity, drop);
    Resource {
        attributes,
        ..Default::default()
    }
}

/// Resource attributes of one container (or pod-level cgroup).
pub fn container_attributes(ctx: &ExportContext, c: &ContainerUsage) -> Vec<KeyValue> {
    let drop = Dropped::of(&ctx.groups);
    container_resource(&node_attributes(ctx, drop), c, drop).attributes
}

fn device_attributes(d: &DeviceSample) -> [Attribute; 5] {
    [
        s(Attr::HwId, d.uuid.clone()),
        s(Attr::HwType, HW_TYPE_GPU),
        s(Attr::HwVendor, HW_VENDOR_NVIDIA),
        s(Attr::HwModel, d.name.clone()),
        int(Attr::GpuIndex, d.index as i64),
    ]
}

fn device_metrics(m: &mut Metrics, snap: &Snapshot) {
    let f = |v: Option<u64>| v.map(|v| v as f64);
    let pct = |v: Option<u32>| v.map(|v| v as f64 / 100.0);
    let mhz = |v: Option<u32>| v.map(|v| v as f64 * 1e6);
    for d in &snap.devices {
        let a = m.attrs(device_attributes(d));
        let ok = d.status.is_ok() as u8 as f64;
        let [ok_state, failed_state] = HW_STATES;
        m.points(
            M::HwStatus,
            &a,
            Attr::HwState,
            [(ok_state, Some(ok)), (failed_state, Some(1.0 - ok))],
        );
        memory(m, &a, d.memory_used_bytes, d.memory_total_bytes);
        let [general, memctl, ..] = GPU_TASKS;
        let [.., encoder, decoder] = GPU_TASKS;
        m.points(
            M::HwGpuUtilization,
            &a,
            Attr::HwGpuTask,
            [
                (general, pct(d.utilization_gpu)),
                (memctl, pct(d.utilization_memory)),
                (encoder, pct(d.fields.encoder_util)),
                (decoder, pct(d.fields.decoder_util)),
            ],
        );
        if let Some(v) = d.power_mw {
            m.point(M::HwPower, v as f64 / 1000.0, a.clone());
        }
        if let Some(v) = d.energy_mj {
            m.point(M::HwEnergy, v as f64 / 1000.0, a.clone());
        }
        if let Some(v) = d.temperature_c {
            m.point(M::HwTemperature, v as f64, a.clone());
        }
        let [corrected, uncorrected] = ECC_ERROR_TYPES;
        m.points(
            M::HwErrors,
            &a,
            Attr::ErrorType,
            [
                (corrected, f(d.ecc_corrected)),
                (uncorrected, f(d.ecc_uncorrected)),
            ],
        );
        let [sm, memory_clock] = CLOCKS;
        m.points(
            M::HwGpuClock,
            &a,
            Attr::Clock,
            [
                (sm, mhz(d.sm_clock_mhz)),
                (memory_clock, mhz(d.mem_clock_mhz)),
            ],
        );
        health_metrics(m, &a, d);
        if let Some(g) = &d.fields.gpm {
            gpm_metrics(m, &a, g);
        }
        for mig in &d.mig_devices {
            let ma = m.attrs([
                s(Attr::HwId, mig.uuid.clone()),
                s(Attr::HwType, HW_TYPE_GPU),
                s(Attr::HwVendor, HW_VENDOR_NVIDIA),
                s(Attr::HwModel, d.name.clone()),
                s(Attr::HwParent, d.uuid.clone()),
            ]);
            // NVML tells a MIG device's memory (and GPM) only; no utilization of it.
            if let Some(g) = &mig.gpm {
                gpm_metrics(m, &ma, g);
            }
            if let Some(v) = mig.memory_used_bytes {
                m.point(M::HwGpuMemoryUsage, v as f64, ma.clone());
            }
            if let Some(v) = mig.memory_total_bytes {
                m.point(M::HwGpuMemoryLimit, v as f64, ma);
            }
        }
    }
}

/// The health fields dcgm-exporter serves, in our names: reserved memory, memory
/// temperature, PCIe replays, XIDs per code, remapped rows, NVLink bytes, throttling, vGPU
/// licensing.
fn health_metrics(m: &mut Metrics, a: &[KeyValue], d: &DeviceSample) {
    let x = &d.fields;
    let one = |m: &mut Metrics, id, v: Option<f64>| {
        if let Some(v) = v {
            m.point(id, v, a.to_vec());
        }
    };
    one(
        m,
        M::HwGpuMemoryReserved,
        x.memory_reserved_bytes.map(|v| v as f64),
    );
    one(
        m,
        M::HwGpuMemoryTemperature,
        x.memory_temperature_c.map(f64::from),
    );
    let [.., replay, xid] = ERROR_TYPES;
    m.points(
        M::HwErrors,
        a,
        Attr::ErrorType,
        [(replay, x.pcie_replay.map(|v| v as f64))],
    );
    for c in x.xid_errors.iter().flatten() {
        let mut pa = m.with(a, s(Attr::ErrorType, xid));
        encode_onto(&mut pa, [int(Attr::Xid, c.xid as i64)], m.drop);
        m.point(M::HwErrors, c.count as f64, pa);
    }
    if let Some(r) = x.remapped_rows {
        let [corrected, uncorrected] = ECC_ERROR_TYPES;
        m.points(
            M::HwGpuMemoryRemappedRows,
            a,
            Attr::ErrorType,
            [
                (corrected, Some(r.correctable as f64)),
                (uncorrected, Some(r.uncorrectable as f64)),
            ],
        );
        one(
            m,
            M::HwGpuMemoryRowRemapPending,
            Some(r.pending as u8 as f64),
        );
        one(
            m,
            M::HwGpuMemoryRowRemapFailed,
            Some(r.failure as u8 as f64),
        );
    }
    let nvlink = m.with(a, s(Attr::HwGpuLink, GPU_LINKS[1]));
    let [tx, rx] = DIRECTIONS;
    let kib = |v: Option<u64>| v.map(|k| k as f64 * 1024.0);
    m.points(
        M::HwGpuIo,
        &nvlink,
        Attr::NetworkIoDirection,
        [(tx, kib(x.nvlink_tx_kib)), (rx, kib(x.nvlink_rx_kib))],
    );
    if let Some(mask) = d.throttle_reasons {
        for (bit, reason) in THROTTLE_REASONS {
            let pa = m.with(a, s(Attr::ThrottleReason, reason));
            m.point(M::HwGpuClockThrottled, (mask & bit != 0) as u8 as f64, pa);
        }
    }
    one(
        m,
        M::HwGpuVgpuLicensed,
        x.vgpu_licensed.map(|b| b as u8 as f64),
    );
}

/// NVML GPM's profiling of a GPU or MIG device; bandwidths in bytes per second.
fn gpm_metrics(m: &mut Metrics, a: &[KeyValue], g: &gpu_model::GpmMetrics) {
    let activity = [
        g.gr_engine_active,
        g.sm_active,
        g.tensor_active,
        g.dram_active,
        g.fp64_active,
        g.fp32_active,
        g.fp16_active,
    ];
    let [e0, e1, e2, e3, e4, e5, e6] = GPU_ENGINES;
    let [a0, a1, a2, a3, a4, a5, a6] = activity;
    m.points(
        M::HwGpuActivity,
        a,
        Attr::HwGpuEngine,
        [
            (e0, a0),
            (e1, a1),
            (e2, a2),
            (e3, a3),
            (e4, a4),
            (e5, a5),
            (e6, a6),
        ],
    );
    if let Some(v) = g.sm_occupancy {
        m.point(M::HwGpuSmOccupancy, v, a.to_vec());
    }
    let [tx, rx] = DIRECTIONS;
    let bps = |v: Option<f64>| v.map(|v| v * 1_048_576.0);
    for (link, t, r) in [
        (GPU_LINKS[0], g.pcie_tx_mibps, g.pcie_rx_mibps),
        (GPU_LINKS[1], g.nvlink_tx_mibps, g.nvlink_rx_mibps),
    ] {
        let la = m.with(a, s(Attr::HwGpuLink, link));
        m.points(
            M::HwGpuBandwidth,
            &la,
            Attr::NetworkIoDirection,
            [(tx, bps(t)), (rx, bps(r))],
        );
    }
}

/// A GPU's memory usage, size and their ratio.
fn memory(m: &mut Metrics, a: &[KeyValue], used: Option<u64>, total: Option<u64>) {
    if let Some(v) = used {
        m.point(M::HwGpuMemoryUsage, v as f64, a.to_vec());
    }
    if let Some(v) = total {
        m.point(M::HwGpuMemoryLimit, v as f64, a.to_vec());
    }
    if let (Some(u), Some(l)) = (used, total) {
        if l > 0 {
            m.point(M::HwGpuMemoryUtilization, u as f64 / l as f64, a.to_vec());
        }
    }
}

/// The four engines NVML samples per process, as fractions.
fn tasks(v: [Option<u32>; 4]) -> [(&'static str, Option<f64>); 4] {
    let mut out = GPU_TASKS.map(|t| (t, None));
    for (o, v) in out.iter_mut().zip(v) {
        o.1 = v.map(|v| v as f64 / 100.0);
    }
    out
}

fn container_metrics(m: &mut Metrics, c: &ContainerUsage) {
    for g in &c.gpus {
        let mut a = vec![s(Attr::HwId, g.uuid.clone())];
        if g.gpu_uuid != g.uuid {
            a.push(s(Attr::HwParent, g.gpu_uuid.clone()));
        }
        let a = m.attrs(a);
        m.point(
            M::ContainerGpuMemoryUsage,
            g.memory_used_bytes as f64,
            a.clone(),
        );
        let util = [g.sm_util, g.mem_util, g.enc_util, g.dec_util];
        m.points(M::ContainerGpuUtilization, &a, Attr::HwGpuTask, tasks(util));
        // The counters start when the agent first saw this container on this device.
        let since = if g.counters_since_ms > 0 {
            g.counters_since_ms * MS
        } else {
            m.start_ns
        };
        m.point_since(M::ContainerGpuTime, g.gpu_time_seconds, a.clone(), since);
        m.point_since(
            M::ContainerGpuMemoryTime,
            g.memory_byte_seconds,
            a.clone(),
            since,
        );
        m.point(M::ContainerGpuProcesses, g.pids.len() as f64, a);
    }
}

/// XID errors the kernel log charged to the container's processes.
fn xid_metrics(m: &mut Metrics, xids: &[&ContainerXid]) {
    for x in xids {
        let mut a = vec![s(Attr::HwId, x.uuid.clone())];
        if x.gpu_uuid != x.uuid {
            a.push(s(Attr::HwParent, x.gpu_uuid.clone()));
        }
        a.push(s(Attr::ErrorType, ERROR_TYPES[3]));
        a.push(int(Attr::Xid, x.xid as i64));
        let a = m.attrs(a);
        m.point(M::ContainerGpuErrors, x.count as f64, a);
    }
}

fn allocation_metrics(m: &mut Metrics, c: &ContainerUsage) {
    let idle = c.idle_allocations();
    for u in &c.allocated_gpus {
        let a = m.attrs([s(Attr::HwId, u.clone())]);
        m.point(M::ContainerGpuAllocated, 1.0, a.clone());
        let is_idle = idle.contains(&u.as_str());
        m.point(M::ContainerGpuAllocatedIdle, is_idle as u8 as f64, a);
    }
}

/// Energy, peak memory, limits and NVML accounting of each device the container used or
/// was allocated.
fn account_metrics(m: &mut Metrics, c: &ContainerUsage) {
    for a in &c.accounts {
        let mut attrs = vec![s(Attr::HwId, a.uuid.clone())];
        if a.gpu_uuid != a.uuid {
            attrs.push(s(Attr::HwParent, a.gpu_uuid.clone()));
        }
        let at = m.attrs(attrs);
        if a.energy_since_ms > 0 {
            let since = a.energy_since_ms * MS;
            m.point_since(M::ContainerGpuEnergy, a.energy_joules, at.clone(), since);
        }
        if let Some(p) = a.memory_peak_bytes {
            m.point(M::ContainerGpuMemoryPeak, p as f64, at.clone());
        }
        if let (Some(l), Some(src)) = (a.memory_limit_bytes, a.memory_limit_source) {
            let la = m.with(&at, s(Attr::LimitSource, src.as_str()));
            m.point(M::ContainerGpuMemoryLimit, l as f64, la);
        }
        if let Some(p) = a.sm_limit_percent {
            m.point(
                M::ContainerGpuUtilizationLimit,
                p as f64 / 100.0,
                at.clone(),
            );
        }
        if a.accounted_processes > 0 {
            m.point(
                M::ContainerGpuAccountingTime,
                a.accounted_gpu_seconds,
                at.clone(),
            );
            let n = a.accounted_processes as f64;
            m.point(M::ContainerGpuAccountingProcesses, n, at);
        }
    }
}

/// Each GPU's energy charged to no container: the idle entry, on the node resource.
fn idle_energy(m: &mut Metrics, snap: &Snapshot) {
    for d in &snap.devices {
        if let Some(j) = d.sharing.idle_energy_joules {
            let a = m.attrs([s(Attr::HwId, d.uuid.clone()), s(Attr::Owner, OWNER_IDLE)]);
            m.point(M::ContainerGpuEnergy, j, a);
        }
    }
}

fn process_metrics(m: &mut Metrics, snap: &Snapshot, c: &ContainerUsage) {
    for p in snap
        .processes
        .iter()
        .filter(|p| p.container_id == c.container_id && p.pod_uid == c.pod_uid)
    {
        let a = m.attrs([
            int(Attr::ProcessPid, p.pid as i64),
            s(Attr::HwId, p.uuid.clone()),
        ]);
        m.point(
            M::ProcessGpuMemoryUsage,
            p.used_memory_bytes as f64,
            a.clone(),
        );
        let util = [p.sm_util, p.mem_util, p.enc_util, p.dec_util];
        m.points(M::ProcessGpuUtilization, &a, Attr::HwGpuTask, tasks(util));
    }
}

fn self_metrics(m: &mut Metrics, st: &AgentStats) {
    let counters = [
        (M::EventsReceived, st.events_received),
        (M::EventsLost, st.events_lost),
        (M::Resyncs, st.resyncs),
        (M::ProcfsFallbackLookups, st.procfs_fallback_lookups),
        (M::ExportFailures, st.export_failures),
        (M::ExportDroppedBatches, st.export_dropped_batches),
        (M::CachedProcesses, st.cached_processes),
        (M::UsageRecordsEmitted, st.usage_records),
        (M::UsageRecordsDropped, st.usage_records_dropped),
    ];
    for (id, v) in counters {
        m.point(id, v as f64, vec![]);
    }
    m.point(M::NvmlUp, st.nvml.is_ok() as u8 as f64, vec![]);
    let mode = m.attrs([s(Attr::Mode, st.mode.as_str())]);
    m.point(M::Mode, 1.0, mode);
}

/// XID charges of containers no longer in the snapshot (the process, or the container,
/// died of it): a resource of their own, so that their counters go on.
fn xids_of_gone_containers(
    snap: &Snapshot,
    node: &[KeyValue],
    fresh: impl Fn() -> Metrics,
    drop: Dropped,
    out: &mut Vec<ResourceMetrics>,
) {
    let present = |x: &ContainerXid| {
        snap.containers
            .iter()
            .any(|c| c.container_id == x.container_id && c.pod_uid == x.pod_uid)
    };
    let mut done: Vec<(&Option<String>, &Option<String>)> = vec![];
    for x in snap.container_xids.iter().filter(|x| !present(x)) {
        if done.contains(&(&x.container_id, &x.pod_uid)) {
            continue;
        }
        done.push((&x.container_id, &x.pod_uid));
        let same = |y: &&ContainerXid| y.container_id == x.container_id && y.pod_uid == x.pod_uid;
        let mut m = fresh();
        xid_metrics(
            &mut m,
            &snap.container_xids.iter().filter(same).collect::<Vec<_>>(),
        );
        let c = ContainerUsage {
            container_id: x.container_id.clone(),
            pod_uid: x.pod_uid.clone(),
            pod_name: x.pod_name.clone(),
            namespace: x.namespace.clone(),
            container_name: x.container_name.clone(),
            ..Default::default()
        };
        out.push(ResourceMetrics {
            resource: Some(container_resource(node, &c, drop)),
            scope_metrics: vec![m.into_scope()],
            ..Default::default()
        });
    }
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
    let drop = Dropped::of(&ctx.groups);
    let fresh = || Metrics::new(stats.started_ms.max(1) * MS, t, drop);
    let mut node = fresh();
    if ctx.groups.device {
        device_metrics(&mut node, snap);
    }
    if ctx.groups.self_metrics {
        self_metrics(&mut node, stats);
    }
    if ctx.groups.container {
        idle_energy(&mut node, snap);
    }
    let node_resource = node_attributes(ctx, drop);
    let mut resource_metrics = vec![];
    for c in &snap.containers {
        let host = c.container_id.is_none() && c.pod_uid.is_none();
        // The host entry's GPU use goes on the node resource, without container.id.
        let mut m = fresh();
        let target = if host { &mut node } else { &mut m };
        if ctx.groups.container {
            container_metrics(target, c);
            allocation_metrics(target, c);
            let mine =
                |x: &&ContainerXid| x.container_id == c.container_id && x.pod_uid == c.pod_uid;
            xid_metrics(
                target,
                &snap.container_xids.iter().filter(mine).collect::<Vec<_>>(),
            );
            account_metrics(target, c);
        }
        if ctx.groups.process {
            process_metrics(target, snap, c);
        }
        if !host && !m.is_empty() {
            resource_metrics.push(ResourceMetrics {
                resource: Some(container_resource(&node_resource, c, drop)),
                scope_metrics: vec![m.into_scope()],
                ..Default::default()
            });
        }
    }
    if ctx.groups.container {
        xids_of_gone_containers(snap, &node_resource, fresh, drop, &mut resource_metrics);
    }
    if !node.is_empty() {
        resource_metrics.insert(
            0,
            ResourceMetrics {
                resource: Some(Resource {
                    attributes: node_resource,
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

    /// The health, profiling and XID values reach OTLP under their semantic-convention
    /// style names, and an XID charged to a container that is gone keeps a resource.
    #[test]
    fn health_profiling_and_xids_in_otlp() {
        use gpu_model::{ContainerXid, GpmMetrics, XidCount};
        let mut sn = snap();
        let f = &mut sn.devices[0].fields;
        f.pcie_replay = Some(4);
        f.xid_errors = Some(vec![XidCount { xid: 79, count: 2 }]);
        f.gpm = Some(GpmMetrics {
            sm_active: Some(0.5),
            pcie_tx_mibps: Some(2.0),
            ..Default::default()
        });
        sn.devices[0].throttle_reasons = Some(0x20);
        sn.container_xids = vec![ContainerXid {
            container_id: Some("gone".into()),
            pod_uid: Some("p9".into()),
            uuid: "GPU-a".into(),
            gpu_uuid: "GPU-a".into(),
            xid: 43,
            count: 1,
            ..Default::default()
        }];
        let r = build_request(&sn, &AgentStats::default(), &ctx(), 0);
        let points = |rm: &ResourceMetrics, name: &str| -> Vec<(Vec<(String, String)>, f64)> {
            let m = rm.scope_metrics[0].metrics.iter().find(|m| m.name == name);
            let pts = match m.and_then(|m| m.data.as_ref()) {
                Some(Data::Gauge(g)) => &g.data_points,
                Some(Data::Sum(s)) => &s.data_points,
                _ => return vec![],
            };
            pts.iter()
                .map(|p| {
                    let a = p.attributes.iter().map(|kv| {
                        let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                            Some(any_value::Value::StringValue(s)) => s.clone(),
                            Some(any_value::Value::IntValue(i)) => i.to_string(),
                            _ => String::new(),
                        };
                        (kv.key.clone(), v)
                    });
                    let v = match p.value {
                        Some(number_data_point::Value::AsDouble(v)) => v,
                        _ => f64::NAN,
                    };
                    (a.collect(), v)
                })
                .collect()
        };
        let node = &r.resource_metrics[0];
        let has = |pts: &[(Vec<(String, String)>, f64)], kv: (&str, &str), v: f64| {
            pts.iter()
                .any(|(a, x)| *x == v && a.iter().any(|(k, val)| k == kv.0 && val == kv.1))
        };
        let errors = points(node, "hw.errors");
        assert!(
            has(&errors, ("error.type", "pcie_replay"), 4.0),
            "{errors:?}"
        );
        assert!(has(&errors, ("xid", "79"), 2.0), "{errors:?}");
        let activity = points(node, "hw.gpu.activity");
        assert!(has(&activity, ("hw.gpu.engine", "sm"), 0.5), "{activity:?}");
        assert_eq!(
            activity.len(),
            1,
            "unknown activities have no point: {activity:?}"
        );
        let bw = points(node, "hw.gpu.bandwidth");
        assert!(
            has(&bw, ("network.io.direction", "transmit"), 2.0 * 1_048_576.0),
            "{bw:?}"
        );
        let throttled = points(node, "hw.gpu.clock.throttled");
        assert!(has(
            &throttled,
            ("hw.gpu.throttle_reason", "sw_thermal_slowdown"),
            1.0
        ));
        assert!(has(&throttled, ("hw.gpu.throttle_reason", "gpu_idle"), 0.0));
        // The gone container: a resource of its own with its XID count.
        let gone = r
            .resource_metrics
            .iter()
            .find(|rm| {
                rm.resource.as_ref().unwrap().attributes.iter().any(|kv| {
                    kv.key == "container.id"
                        && kv.value.as_ref().and_then(|v| v.value.as_ref())
                            == Some(&any_value::Value::StringValue("gone".into()))
                })
            })
            .expect("a resource for the gone container");
        assert!(has(
            &points(gone, "container.gpu.errors"),
            ("xid", "43"),
            1.0
        ));
    }
}
