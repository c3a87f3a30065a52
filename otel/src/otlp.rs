//! Snapshot -> OTLP `ExportMetricsServiceRequest`: one resource for the node (device and
//! self metrics, and the host entry's GPU use) and one per container or pod, because the
//! Collector's k8sattributes processor enriches resources, not data points.
//!
//! The request is encoded straight to protobuf bytes (pb.rs): each attribute set is
//! encoded once and shared by the points that carry it, and one `Metrics` is reused for
//! every container, so an export allocates almost nothing however many points it holds.
use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering::Relaxed},
        OnceLock,
    },
};

use gpu_model::{
    AgentStats, ContainerUsage, ContainerXid, DeviceSample, DeviceStatus, ProcessUsage, Snapshot,
    Workload, WorkloadKind,
};
use opentelemetry_proto::tonic::{
    collector::metrics::v1::ExportMetricsServiceRequest,
    common::v1::{any_value, AnyValue, KeyValue},
    resource::v1::Resource,
};
use prost::Message;

mod reuse;
pub use reuse::Reuse;

use crate::{
    catalogue::{
        Attr, Dropped, Kind, MetricId as M, MetricId, CLOCKS, DIRECTIONS, ECC_ERROR_TYPES,
        ERROR_TYPES, GPU_ENGINES, GPU_LINKS, GPU_TASKS, HW_STATES, HW_TYPE_GPU, HW_VENDOR_NVIDIA,
        OWNER_IDLE, THROTTLE_REASONS,
    },
    pb::{self, Value},
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
type Attribute<'a> = (Attr, Value<'a>);

fn s(a: Attr, v: &str) -> Attribute<'_> {
    (a, Value::Str(v))
}

fn int(a: Attr, v: i64) -> Attribute<'static> {
    (a, Value::Int(v))
}

/// Data-point attributes encoded in the resource's arena: a byte range of `KeyValue`
/// fields, shared by every point that carries them, and which attributes they are.
#[derive(Debug, Clone, Copy)]
struct Attrs {
    start: u32,
    len: u32,
    set: u128,
}

struct Point {
    attrs: Attrs,
    /// 0 for gauges (proto3 leaves it out).
    start_ns: u64,
    value: f64,
}

/// Accumulates one resource's data points per metric, in first-seen order. One is reused
/// for every container of a request: `clear` keeps its buffers.
struct Metrics {
    list: Vec<(MetricId, Vec<Point>)>,
    /// Per metric, its index in `list` plus one; 0 while it has no point.
    slot: Vec<u16>,
    /// The encoded attribute sets of this resource's points.
    arena: Vec<u8>,
    /// Point lists of cleared resources, kept for their capacity.
    spare: Vec<Vec<Point>>,
    /// Per metric of `list`, its data's encoded length (`scope_len` fills it).
    data_lens: Vec<usize>,
    /// The agent's start: the start time of every sum.
    start_ns: u64,
    time_ns: u64,
    drop: Dropped,
    /// Replaying a resource kept from the last export: the points only give their
    /// numbers, to `values`, and nothing is encoded.
    replay: bool,
    /// Each point's start time (0 for gauges) and value, in the order they came.
    values: Vec<(u64, f64)>,
    /// Each point's place in `list` (metric, point), in the order they came.
    order: Vec<(u16, u16)>,
    /// Where `write_scope` wrote each point's fixed fields, in the order written.
    written: Vec<usize>,
}

impl Metrics {
    fn new(start_ns: u64, time_ns: u64, drop: Dropped) -> Metrics {
        Metrics {
            list: vec![],
            slot: vec![0; MetricId::ALL.len()],
            arena: vec![],
            spare: vec![],
            data_lens: vec![],
            start_ns,
            time_ns,
            drop,
            replay: false,
            values: vec![],
            order: vec![],
            written: vec![],
        }
    }

    fn clear(&mut self) {
        for (id, mut points) in self.list.drain(..) {
            self.slot[id as usize] = 0;
            points.clear();
            self.spare.push(points);
        }
        self.arena.clear();
        self.values.clear();
        self.order.clear();
        self.written.clear();
    }

    /// Appends the attributes that are not configured away to the arena.
    fn encode<'a>(&mut self, attributes: impl IntoIterator<Item = Attribute<'a>>) -> u128 {
        let mut set = 0;
        for (a, v) in attributes {
            if !self.drop.contains(a) {
                pb::key_value(&mut self.arena, 7, a.otlp(), v);
                set |= 1u128 << a as usize;
            }
        }
        set
    }

    /// Data-point attributes, encoded once for the points that share them.
    fn attrs<'a>(&mut self, attributes: impl IntoIterator<Item = Attribute<'a>>) -> Attrs {
        if self.replay {
            return NO_ATTRS;
        }
        let start = self.arena.len();
        let set = self.encode(attributes);
        Attrs {
            start: start as u32,
            len: (self.arena.len() - start) as u32,
            set,
        }
    }

    /// `base` and more attributes.
    fn with<'a>(&mut self, base: Attrs, extra: impl IntoIterator<Item = Attribute<'a>>) -> Attrs {
        if self.replay {
            return NO_ATTRS;
        }
        let start = self.arena.len();
        let b = base.start as usize;
        self.arena.extend_from_within(b..b + base.len as usize);
        let set = base.set | self.encode(extra);
        Attrs {
            start: start as u32,
            len: (self.arena.len() - start) as u32,
            set,
        }
    }

    fn point(&mut self, id: MetricId, value: f64, attrs: Attrs) {
        self.point_since(id, value, attrs, self.start_ns);
    }

    /// A point of a sum that started counting at `start_ns`.
    fn point_since(&mut self, id: MetricId, value: f64, attrs: Attrs, start_ns: u64) {
        let def = id.def();
        debug_assert!(
            Attr::ALL
                .iter()
                .filter(|&&a| attrs.set & (1u128 << a as usize) != 0)
                .all(|&a| def.carries_otlp(a)),
            "{id:?}: attributes {:#x} not all in the catalogue",
            attrs.set
        );
        let start_ns = match def.kind {
            Kind::Gauge => 0,
            Kind::UpDownCounter | Kind::Counter => start_ns,
        };
        if self.replay {
            self.values.push((start_ns, value));
            return;
        }
        let p = Point {
            attrs,
            start_ns,
            value,
        };
        match self.slot[id as usize] {
            0 => {
                let mut points = self.spare.pop().unwrap_or_default();
                points.push(p);
                self.list.push((id, points));
                self.slot[id as usize] = self.list.len() as u16;
                self.order.push((self.list.len() as u16 - 1, 0));
            }
            i => {
                let points = &mut self.list[i as usize - 1].1;
                points.push(p);
                self.order.push((i - 1, points.len() as u16 - 1));
            }
        }
    }

    /// A point for each value known; an unknown one gets no point rather than a zero.
    fn points<const N: usize>(
        &mut self,
        id: MetricId,
        base: Attrs,
        by: Attr,
        values: [(&'static str, Option<f64>); N],
    ) {
        for (v, value) in values {
            if let Some(value) = value {
                let a = self.with(base, [s(by, v)]);
                self.point(id, value, a);
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Each point's offset from `base` (where its resource starts) in the order the points
    /// came, with the fixed fields it has: a kept resource's places to patch
    /// (`reuse::patch`). After `write_scope`.
    fn offsets(&self, base: usize) -> Vec<u32> {
        let mut first = Vec::with_capacity(self.list.len());
        let mut n = 0;
        for (_, points) in &self.list {
            first.push(n);
            n += points.len();
        }
        let time = if self.time_ns != 0 {
            reuse::HAS_TIME
        } else {
            0
        };
        let offset = |&(i, k): &(u16, u16)| {
            let (i, k) = (i as usize, k as usize);
            let start = match self.list[i].1[k].start_ns {
                0 => 0,
                _ => reuse::HAS_START,
            };
            (self.written[first[i] + k] - base) as u32 | start | time
        };
        self.order.iter().map(offset).collect()
    }
}

/// What a replayed point's attributes are: none are encoded.
const NO_ATTRS: Attrs = Attrs {
    start: 0,
    len: 0,
    set: 0,
};

/// The encoding of `Metrics` as a `ScopeMetrics`. Lengths come first in protobuf, so each
/// is computed from the points (cheap arithmetic) before the bytes are written: each
/// metric's once, by `scope_len`, and kept for `write_scope` (computed again at every
/// level, the lengths were a fifth of the encoding on the large node).
impl Metrics {
    fn point_len(&self, p: &Point) -> usize {
        let fixed = |v: u64| if v != 0 { 9 } else { 0 };
        fixed(p.start_ns) + fixed(self.time_ns) + 9 + p.attrs.len as usize
    }

    fn data_len(&self, id: MetricId, points: &[Point]) -> usize {
        let points: usize = points
            .iter()
            .map(|p| pb::len_field(self.point_len(p)))
            .sum();
        points + sum_trailer(id).len()
    }

    /// The scope's length; each metric's data length is kept in `data_lens`.
    fn scope_len(&mut self) -> usize {
        self.data_lens.clear();
        let mut metrics = 0;
        for (id, points) in &self.list {
            let data = self.data_len(*id, points);
            self.data_lens.push(data);
            metrics += pb::len_field(metric_header(*id).len() + pb::len_field(data));
        }
        scope_bytes().len() + metrics
    }

    /// Writes the scope `scope_len` measured.
    fn write_scope(&mut self, out: &mut Vec<u8>) {
        debug_assert_eq!(self.data_lens.len(), self.list.len());
        let mut written = std::mem::take(&mut self.written);
        written.clear();
        out.extend_from_slice(scope_bytes());
        for ((id, points), &data) in self.list.iter().zip(&self.data_lens) {
            pb::len_header(out, 2, metric_header(*id).len() + pb::len_field(data));
            out.extend_from_slice(metric_header(*id));
            // Metric.data: gauge (5) or sum (7).
            let field = if id.def().kind == Kind::Gauge { 5 } else { 7 };
            pb::len_header(out, field, data);
            for p in points {
                pb::len_header(out, 1, self.point_len(p));
                written.push(out.len());
                if p.start_ns != 0 {
                    pb::fixed64(out, 2, p.start_ns);
                }
                if self.time_ns != 0 {
                    pb::fixed64(out, 3, self.time_ns);
                }
                pb::fixed64(out, 4, p.value.to_bits());
                let a = p.attrs.start as usize;
                out.extend_from_slice(&self.arena[a..a + p.attrs.len as usize]);
            }
            out.extend_from_slice(sum_trailer(*id));
        }
        self.written = written;
    }
}

/// ScopeMetrics.scope: the same for every resource.
fn scope_bytes() -> &'static [u8] {
    static SCOPE: OnceLock<Vec<u8>> = OnceLock::new();
    SCOPE.get_or_init(|| {
        let mut body = vec![];
        pb::string(&mut body, 1, "gpu-agent");
        pb::string(&mut body, 2, env!("CARGO_PKG_VERSION"));
        let mut out = vec![];
        pb::bytes(&mut out, 1, &body);
        out
    })
}

/// Metric name (1), description (2) and unit (3), encoded once per metric.
fn metric_header(id: MetricId) -> &'static [u8] {
    static HEADERS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    &HEADERS.get_or_init(|| {
        MetricId::ALL
            .iter()
            .map(|id| {
                let (def, mut out) = (id.def(), vec![]);
                pb::string(&mut out, 1, def.otlp.unwrap_or_default());
                pb::string(&mut out, 2, def.help);
                pb::string(&mut out, 3, def.unit);
                out
            })
            .collect()
    })[id as usize]
}

/// What follows a sum's points: cumulative temporality (2) and, for counters, monotonic.
fn sum_trailer(id: MetricId) -> &'static [u8] {
    // AggregationTemporality::Cumulative is 2; is_monotonic is true.
    const UP_DOWN: [u8; 2] = [pb::key(2, pb::VARINT), 2];
    const COUNTER: [u8; 4] = [pb::key(2, pb::VARINT), 2, pb::key(3, pb::VARINT), 1];
    match id.def().kind {
        Kind::Gauge => &[],
        Kind::UpDownCounter => &UP_DOWN,
        Kind::Counter => &COUNTER,
    }
}

/// One `ResourceMetrics` of the request: `attrs` are the resource's encoded `KeyValue`s.
fn write_resource(out: &mut Vec<u8>, attrs: &[u8], m: &mut Metrics) {
    let scope = m.scope_len();
    pb::len_header(out, 1, pb::len_field(attrs.len()) + pb::len_field(scope));
    pb::bytes(out, 1, attrs);
    pb::len_header(out, 2, scope);
    m.write_scope(out);
}

const MS: u64 = 1_000_000;

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
fn node_resource_bytes(ctx: &ExportContext, drop: Dropped) -> Vec<u8> {
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
fn container_resource_bytes(out: &mut Vec<u8>, node: &[u8], c: &ContainerUsage, drop: Dropped) {
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

fn device_attributes(d: &DeviceSample) -> [Attribute<'_>; 5] {
    [
        s(Attr::HwId, &d.uuid),
        s(Attr::HwType, HW_TYPE_GPU),
        s(Attr::HwVendor, HW_VENDOR_NVIDIA),
        s(Attr::HwModel, &d.name),
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
            a,
            Attr::HwState,
            [(ok_state, Some(ok)), (failed_state, Some(1.0 - ok))],
        );
        let stalled = matches!(d.status, DeviceStatus::Stalled { .. });
        m.point(M::NvmlStalled, stalled as u8 as f64, a);
        memory(m, a, d.memory_used_bytes, d.memory_total_bytes);
        let [general, memctl, ..] = GPU_TASKS;
        let [.., encoder, decoder] = GPU_TASKS;
        m.points(
            M::HwGpuUtilization,
            a,
            Attr::HwGpuTask,
            [
                (general, pct(d.utilization_gpu)),
                (memctl, pct(d.utilization_memory)),
                (encoder, pct(d.fields.encoder_util)),
                (decoder, pct(d.fields.decoder_util)),
            ],
        );
        if let Some(v) = d.power_mw {
            m.point(M::HwPower, v as f64 / 1000.0, a);
        }
        if let Some(v) = d.energy_mj {
            m.point(M::HwEnergy, v as f64 / 1000.0, a);
        }
        if let Some(v) = d.temperature_c {
            m.point(M::HwTemperature, v as f64, a);
        }
        let [corrected, uncorrected] = ECC_ERROR_TYPES;
        m.points(
            M::HwErrors,
            a,
            Attr::ErrorType,
            [
                (corrected, f(d.ecc_corrected)),
                (uncorrected, f(d.ecc_uncorrected)),
            ],
        );
        let [sm, memory_clock] = CLOCKS;
        m.points(
            M::HwGpuClock,
            a,
            Attr::Clock,
            [
                (sm, mhz(d.sm_clock_mhz)),
                (memory_clock, mhz(d.mem_clock_mhz)),
            ],
        );
        health_metrics(m, a, d);
        if let Some(g) = &d.fields.gpm {
            gpm_metrics(m, a, g);
        }
        for mig in &d.mig_devices {
            let ma = m.attrs([
                s(Attr::HwId, &mig.uuid),
                s(Attr::HwType, HW_TYPE_GPU),
                s(Attr::HwVendor, HW_VENDOR_NVIDIA),
                s(Attr::HwModel, &d.name),
                s(Attr::HwParent, &d.uuid),
            ]);
            // NVML tells a MIG device's memory (and GPM) only; no utilization of it.
            if let Some(g) = &mig.gpm {
                gpm_metrics(m, ma, g);
            }
            if let Some(v) = mig.memory_used_bytes {
                m.point(M::HwGpuMemoryUsage, v as f64, ma);
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
fn health_metrics(m: &mut Metrics, a: Attrs, d: &DeviceSample) {
    let x = &d.fields;
    let one = |m: &mut Metrics, id, v: Option<f64>| {
        if let Some(v) = v {
            m.point(id, v, a);
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
        let pa = m.with(a, [s(Attr::ErrorType, xid), int(Attr::Xid, c.xid as i64)]);
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
    let nvlink = m.with(a, [s(Attr::HwGpuLink, GPU_LINKS[1])]);
    let [tx, rx] = DIRECTIONS;
    let kib = |v: Option<u64>| v.map(|k| k as f64 * 1024.0);
    m.points(
        M::HwGpuIo,
        nvlink,
        Attr::NetworkIoDirection,
        [(tx, kib(x.nvlink_tx_kib)), (rx, kib(x.nvlink_rx_kib))],
    );
    if let Some(mask) = d.throttle_reasons {
        for (bit, reason) in THROTTLE_REASONS {
            let pa = m.with(a, [s(Attr::ThrottleReason, reason)]);
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
fn gpm_metrics(m: &mut Metrics, a: Attrs, g: &gpu_model::GpmMetrics) {
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
        m.point(M::HwGpuSmOccupancy, v, a);
    }
    let [tx, rx] = DIRECTIONS;
    let bps = |v: Option<f64>| v.map(|v| v * 1_048_576.0);
    for (link, t, r) in [
        (GPU_LINKS[0], g.pcie_tx_mibps, g.pcie_rx_mibps),
        (GPU_LINKS[1], g.nvlink_tx_mibps, g.nvlink_rx_mibps),
    ] {
        let la = m.with(a, [s(Attr::HwGpuLink, link)]);
        m.points(
            M::HwGpuBandwidth,
            la,
            Attr::NetworkIoDirection,
            [(tx, bps(t)), (rx, bps(r))],
        );
    }
}

/// A GPU's memory usage, size and their ratio.
fn memory(m: &mut Metrics, a: Attrs, used: Option<u64>, total: Option<u64>) {
    if let Some(v) = used {
        m.point(M::HwGpuMemoryUsage, v as f64, a);
    }
    if let Some(v) = total {
        m.point(M::HwGpuMemoryLimit, v as f64, a);
    }
    if let (Some(u), Some(l)) = (used, total) {
        if l > 0 {
            m.point(M::HwGpuMemoryUtilization, u as f64 / l as f64, a);
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
        let a = m.attrs([s(Attr::HwId, u)]);
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

/// Each GPU's energy charged to no container: the idle entry, on the node resource.
fn idle_energy(m: &mut Metrics, snap: &Snapshot) {
    for d in &snap.devices {
        if let Some(j) = d.sharing.idle_energy_joules {
            let a = m.attrs([s(Attr::HwId, &d.uuid), s(Attr::Owner, OWNER_IDLE)]);
            m.point(M::ContainerGpuEnergy, j, a);
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
        let none = m.attrs([]);
        m.point(id, v as f64, none);
    }
    let none = m.attrs([]);
    m.point(M::NvmlUp, st.nvml.is_ok() as u8 as f64, none);
    let mode = m.attrs([s(Attr::Mode, st.mode.as_str())]);
    m.point(M::Mode, 1.0, mode);
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
struct ByOwner<'a> {
    xids: HashMap<Owner<'a>, Vec<&'a ContainerXid>>,
    processes: HashMap<Owner<'a>, Vec<&'a ProcessUsage>>,
}

impl<'a> ByOwner<'a> {
    fn has_xids(&self, c: &ContainerUsage) -> bool {
        !self.xids.is_empty() && self.xids.contains_key(&owner(&c.container_id, &c.pod_uid))
    }

    fn of(snap: &'a Snapshot) -> ByOwner<'a> {
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
fn container_group(m: &mut Metrics, c: &ContainerUsage, ctx: &ExportContext, by: &ByOwner) {
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
fn xids_of_gone_containers(
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

/// The size of the previous whole export: a request's buffer is made that big at once, or
/// as big as a request may grow when that is less.
static LAST_LEN: AtomicUsize = AtomicUsize::new(0);

/// Encodes the request for one export, all of it in one (`requests` splits it). `now_ms`
/// stamps it when the snapshot has no time yet.
pub fn encode_request(
    snap: &Snapshot,
    stats: &AgentStats,
    ctx: &ExportContext,
    now_ms: u64,
) -> Vec<u8> {
    let mut all = encode(snap, stats, ctx, now_ms, usize::MAX, None);
    let out = all.next().unwrap_or_default();
    debug_assert!(all.next().is_none());
    out
}

/// The requests of one export, in order: the node's resource first, then one resource per
/// container, a request closed once it holds `max_bytes` (whole resources, so the last one
/// in it may go past; the settings' `max_request_bytes`, under the collector's message
/// limit). Together they are exactly `encode_request`'s bytes: a
/// request is its resources' fields one after the other. An export with nothing to say is
/// one empty request.
///
/// Each request patches the last export's at the same place, handed back to `reuse` once
/// sent, where its containers are unchanged but for their numbers (see [`Reuse`]).
pub fn requests<'a>(
    snap: &'a Snapshot,
    stats: &AgentStats,
    ctx: &'a ExportContext,
    now_ms: u64,
    max_bytes: usize,
    reuse: &'a mut Reuse,
) -> Requests<'a> {
    encode(snap, stats, ctx, now_ms, max_bytes, Some(reuse))
}

fn encode<'a>(
    snap: &'a Snapshot,
    stats: &AgentStats,
    ctx: &'a ExportContext,
    now_ms: u64,
    max_bytes: usize,
    reuse: Option<&'a mut Reuse>,
) -> Requests<'a> {
    let t = if snap.taken_at_ms > 0 {
        snap.taken_at_ms
    } else {
        now_ms
    } * MS;
    let drop = Dropped::of(&ctx.groups);
    let start = stats.started_ms.max(1) * MS;
    let by = ByOwner::of(snap);
    let mut node = Metrics::new(start, t, drop);
    if ctx.groups.device {
        device_metrics(&mut node, snap);
    }
    if ctx.groups.self_metrics {
        self_metrics(&mut node, stats);
    }
    if ctx.groups.container {
        idle_energy(&mut node, snap);
    }
    // The host entry's GPU use goes on the node resource, without container.id.
    for c in snap.containers.iter().filter(|c| is_host(c)) {
        container_group(&mut node, c, ctx, &by);
    }
    let node_attrs = node_resource_bytes(ctx, drop);
    // Per-process detail is not kept: its processes come and go too often.
    let mut reuse = reuse.filter(|r| r.is_on() && ctx.groups.container && !ctx.groups.process);
    let last = reuse.as_deref_mut().map(|r| r.start(&node_attrs, drop));
    let mut node_bytes = vec![];
    if !node.is_empty() {
        write_resource(&mut node_bytes, &node_attrs, &mut node);
    }
    let mut kept = Kept {
        last: last.unwrap_or_default().into_iter(),
        in_place: false,
        w: 0,
        shift: 0,
        moves: 0,
        patched: 0,
        scratch: vec![],
        node_len: 0,
        old_entries: vec![],
        hint: 0,
        lookup: reuse::Lookup::new(),
        entries: vec![],
    };
    let out = kept.begin(&node_bytes, max_bytes);
    Requests {
        snap,
        ctx,
        by,
        node_attrs,
        // One `Metrics` and one attribute buffer for all the containers.
        m: node,
        attrs: vec![],
        next: 0,
        out,
        sent_bytes: 0,
        max_bytes,
        state: Batching::Filling,
        reuse,
        kept,
    }
}

/// A request's buffer. The requests of one export, and of one export after another, get the
/// same size (that of the last export, or the most a request may hold), so that malloc
/// hands back the space the last one freed (a size above the last freed one is mapped
/// afresh, its pages faulted in: 1.5 ms a cycle on the large node).
fn buffer(max_bytes: usize) -> Vec<u8> {
    // Room for the resource that takes a request past its size.
    let over = if max_bytes == usize::MAX {
        4096
    } else {
        64 << 10
    };
    Vec::with_capacity(LAST_LEN.load(Relaxed).min(max_bytes) + over)
}

fn is_host(c: &ContainerUsage) -> bool {
    c.container_id.is_none() && c.pod_uid.is_none()
}

/// An export's requests, encoded one at a time (see `requests`).
pub struct Requests<'a> {
    snap: &'a Snapshot,
    ctx: &'a ExportContext,
    by: ByOwner<'a>,
    node_attrs: Vec<u8>,
    m: Metrics,
    attrs: Vec<u8>,
    /// The next container to encode.
    next: usize,
    /// The request being filled.
    out: Vec<u8>,
    /// The bytes of the requests handed out.
    sent_bytes: usize,
    max_bytes: usize,
    state: Batching,
    reuse: Option<&'a mut Reuse>,
    kept: Kept,
}

/// What an export takes from the last one's requests, and keeps of its own.
struct Kept {
    /// The last export's requests not yet reached (none when nothing is kept): the next
    /// request patches the first.
    last: std::vec::IntoIter<reuse::Last>,
    /// `out` is the last export's request at its place, patched in place up to `w`, where
    /// the next container's resource goes. Past too many changes (`MAX_MOVES`) the rest of
    /// it is let go and encoded afresh: a second buffer to copy into would hold the agent's
    /// largest allocation twice.
    in_place: bool,
    w: usize,
    /// How far the last request's resources not yet reached moved: where `old_entries`
    /// put one at `start`, it is at `start + shift`.
    shift: isize,
    /// Resources put in or taken out of this request in place so far.
    moves: u32,
    /// Resources patched so far, in all requests.
    patched: usize,
    /// A resource put in place is written here first.
    scratch: Vec<u8>,
    /// The node resource's length at this request's head (the first request's; 0 in the
    /// others): what the next export puts its own in place of.
    node_len: usize,
    /// The last export's resources at this request's place, taken as they are found.
    old_entries: Vec<Option<reuse::Entry>>,
    /// Where the next container's is likely to be.
    hint: usize,
    lookup: reuse::Lookup,
    /// This request's resources.
    entries: Vec<Option<reuse::Entry>>,
}

#[derive(PartialEq)]
enum Batching {
    Filling,
    /// At least one request was handed out.
    Sent,
    Done,
}

/// In place, at most this many resources are put in or taken out of one of the last
/// export's requests (each moves the rest of it); past them the rest of the request is
/// encoded afresh in the same buffer.
const MAX_MOVES: u32 = 8;

/// Puts `bytes` in place of `out[range]`, moving the rest once. Room the buffer's slack does
/// not cover is made exactly: doubling a buffer of megabytes would double the agent's
/// largest allocation.
fn replace(out: &mut Vec<u8>, range: std::ops::Range<usize>, bytes: &[u8]) {
    let more = bytes.len().saturating_sub(range.len());
    if out.capacity() - out.len() < more {
        out.reserve_exact(more + (64 << 10));
    }
    out.splice(range, bytes.iter().copied());
}

impl Kept {
    /// The next request's buffer, with `head` (the node's resource in the first request,
    /// nothing in the others) at its head: the last export's request at the same place,
    /// patched in place from `head` on, or a new one.
    fn begin(&mut self, head: &[u8], max_bytes: usize) -> Vec<u8> {
        (self.w, self.shift, self.moves, self.hint) = (0, 0, 0, 0);
        (self.in_place, self.node_len) = (false, head.len());
        self.lookup = reuse::Lookup::new();
        match self.last.next() {
            Some(reuse::Last {
                buffer: Some(mut old),
                entries,
                node_len,
                ..
            }) if old.len() >= node_len => {
                // The node's resource may change length.
                replace(&mut old, 0..node_len, head);
                self.shift = head.len() as isize - node_len as isize;
                (self.in_place, self.w) = (true, head.len());
                // This request's list takes the last one's room.
                self.entries = Vec::with_capacity(entries.len());
                self.old_entries = entries;
                old
            }
            _ => {
                let mut out = buffer(max_bytes);
                out.extend_from_slice(head);
                out
            }
        }
    }

    /// Keeps what request `out` is made of for the next export, where exports are kept.
    fn end(&mut self, out: &[u8], reuse: Option<&mut Reuse>) {
        if let Some(r) = reuse {
            r.keep(out, self.node_len, std::mem::take(&mut self.entries));
        }
    }

    /// The next container's entry is likely the one after this one's: its lists arrive
    /// while this one is patched.
    fn prefetch_next(&self) {
        if let Some(Some(e)) = self.old_entries.get(self.hint + 2) {
            e.prefetch();
        }
        if let Some(Some(e)) = self.old_entries.get(self.hint + 1) {
            e.prefetch_lists();
        }
    }
}

impl Requests<'_> {
    /// Encodes one container's resource, or patches the last request's.
    fn container(&mut self, c: &ContainerUsage) {
        let keep = self.reuse.is_some() && !self.by.has_xids(c);
        if keep && !self.kept.old_entries.is_empty() {
            let k = &mut self.kept;
            if let Some((i, e)) = k.lookup.find(&mut k.old_entries, k.hint, c) {
                if self.patched(c, i, e) {
                    return;
                }
            }
        }
        self.m.clear();
        container_group(&mut self.m, c, self.ctx, &self.by);
        if self.m.is_empty() {
            return;
        }
        container_resource_bytes(&mut self.attrs, &self.node_attrs, c, self.m.drop);
        let k = &mut self.kept;
        let (start, len, points) = if k.in_place && k.moves < MAX_MOVES {
            // Written aside, then put in at `w`: the rest of the request moves once.
            k.scratch.clear();
            write_resource(&mut k.scratch, &self.attrs, &mut self.m);
            let (start, len) = (k.w, k.scratch.len());
            replace(&mut self.out, start..start, &k.scratch);
            k.moves += 1;
            k.w += len;
            k.shift += len as isize;
            (start, len, keep.then(|| self.m.offsets(0)))
        } else {
            self.leave_in_place();
            let start = self.out.len();
            write_resource(&mut self.out, &self.attrs, &mut self.m);
            let len = self.out.len() - start;
            (start, len, keep.then(|| self.m.offsets(start)))
        };
        if let Some(points) = points {
            let e = reuse::Entry::new(start, len, points, c);
            self.kept.entries.push(Some(e));
        }
    }

    /// The last request's resource `e` (its `i`th), patched in place with `c`'s numbers.
    /// False when it cannot be (nothing is kept of it then).
    fn patched(&mut self, c: &ContainerUsage, i: usize, mut e: reuse::Entry) -> bool {
        self.m.clear();
        self.m.replay = true;
        container_group(&mut self.m, c, self.ctx, &self.by);
        self.m.replay = false;
        let k = &mut self.kept;
        debug_assert!(k.in_place, "entries are looked up in place only");
        // Where its bytes are now.
        let at = e.start.wrapping_add_signed(k.shift);
        if at > k.w && k.moves < MAX_MOVES {
            // The resources before it are of containers gone (or that come later): out.
            replace(&mut self.out, k.w..at, &[]);
            k.shift -= (at - k.w) as isize;
            k.moves += 1;
            for gone in &mut k.old_entries[k.hint.min(i)..i] {
                *gone = None;
            }
        } else if at != k.w {
            self.leave_in_place();
            return false;
        }
        k.hint = i + 1;
        let (points, values) = (&e.layout.points, &self.m.values);
        if !reuse::patch(&mut self.out, k.w, points, values, self.m.time_ns) {
            return false;
        }
        e.start = k.w;
        k.w += e.len;
        k.patched += 1;
        self.check(c, &e);
        self.kept.entries.push(Some(e));
        true
    }

    /// Debug builds encode every patched resource afresh too, and compare.
    fn check(&self, c: &ContainerUsage, e: &reuse::Entry) {
        if cfg!(debug_assertions) {
            let mut m = Metrics::new(self.m.start_ns, self.m.time_ns, self.m.drop);
            container_group(&mut m, c, self.ctx, &self.by);
            let (mut attrs, mut want) = (vec![], vec![]);
            container_resource_bytes(&mut attrs, &self.node_attrs, c, m.drop);
            write_resource(&mut want, &attrs, &mut m);
            let got = &self.out[e.start..e.start + e.len];
            assert!(got == want, "a patched resource differs from its encoding");
        }
    }

    /// The request ends at `w`: the last one's resources past it are of containers gone,
    /// or (too many changes) encoded afresh from here on.
    fn close_in_place(&mut self) {
        let k = &mut self.kept;
        if k.in_place {
            self.out.truncate(k.w);
            k.in_place = false;
            k.old_entries.clear();
        }
    }

    /// Past too many changes: the rest of the request is encoded afresh after `w`.
    fn leave_in_place(&mut self) {
        if self.kept.in_place {
            self.close_in_place();
            // Room for the rest at once, as `buffer` makes it: grown by doubling, the kept
            // buffer would stay twice the request's size.
            let room = LAST_LEN.load(Relaxed).min(self.max_bytes) + (64 << 10);
            self.out.reserve_exact(room.saturating_sub(self.out.len()));
        }
    }
}

impl Iterator for Requests<'_> {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        if self.state == Batching::Done {
            return None;
        }
        let snap = self.snap;
        while let Some(c) = snap.containers.get(self.next) {
            self.next += 1;
            // Its names and lists arrive while this one is encoded (the memory copies of
            // the resource attributes, waiting on them, were a fifth of the encoding).
            if let Some(after) = snap.containers.get(self.next) {
                gpu_model::prefetch_container(after);
            }
            if is_host(c) {
                continue;
            }
            self.kept.prefetch_next();
            self.container(c);
            let len = match self.kept.in_place {
                true => self.kept.w,
                false => self.out.len(),
            };
            if len >= self.max_bytes {
                self.close_in_place();
                self.kept.end(&self.out, self.reuse.as_deref_mut());
                self.state = Batching::Sent;
                self.sent_bytes += self.out.len();
                let next = self.kept.begin(&[], self.max_bytes);
                return Some(std::mem::replace(&mut self.out, next));
            }
        }
        self.close_in_place();
        if self.ctx.groups.container {
            let (by, node) = (&self.by, &self.node_attrs);
            xids_of_gone_containers(snap, by, node, &mut self.m, &mut self.out);
        }
        let first = self.state == Batching::Filling;
        self.state = Batching::Done;
        LAST_LEN.store(self.sent_bytes + self.out.len(), Relaxed);
        if self.out.is_empty() && !first {
            return None;
        }
        self.kept.end(&self.out, self.reuse.as_deref_mut());
        if let Some(r) = &mut self.reuse {
            r.patched = self.kept.patched;
        }
        Some(std::mem::take(&mut self.out))
    }
}

/// The request for one export, decoded: for tests and tools that inspect it.
pub fn build_request(
    snap: &Snapshot,
    stats: &AgentStats,
    ctx: &ExportContext,
    now_ms: u64,
) -> ExportMetricsServiceRequest {
    let bytes = encode_request(snap, stats, ctx, now_ms);
    ExportMetricsServiceRequest::decode(&bytes[..]).expect("the agent's own encoding decodes")
}

#[cfg(test)]
mod tests {
    use gpu_model::{ContainerGpu, ContainerUsage, DeviceSample, DeviceStatus};
    use opentelemetry_proto::tonic::metrics::v1::{
        metric::Data, number_data_point, ResourceMetrics,
    };

    use super::*;

    #[test]
    fn an_export_splits_into_requests_of_whole_resources_that_add_up_to_the_one() {
        let mut sn = snap();
        let c = sn.containers.iter().find(|c| !is_host(c)).unwrap().clone();
        sn.containers = (0..60)
            .map(|i| ContainerUsage {
                container_id: Some(format!("{i:064x}").into()),
                ..c.clone()
            })
            .collect();
        let stats = AgentStats::default();
        let whole = encode_request(&sn, &stats, &ctx(), 1);
        let max = whole.len() / 5;
        let parts: Vec<Vec<u8>> =
            requests(&sn, &stats, &ctx(), 1, max, &mut Reuse::default()).collect();
        assert!(parts.len() >= 5, "{} requests", parts.len());
        assert_eq!(
            parts.concat(),
            whole,
            "the same resources, in the same order"
        );
        let resources = |b: &[u8]| {
            ExportMetricsServiceRequest::decode(b)
                .unwrap()
                .resource_metrics
                .len()
        };
        assert_eq!(
            parts.iter().map(|p| resources(p)).sum::<usize>(),
            resources(&whole)
        );
        assert!(parts[..parts.len() - 1].iter().all(|p| p.len() >= max));
        assert!(
            parts.iter().all(|p| p.len() < max + 4096),
            "closed at max_bytes"
        );
        // Nothing to say: one empty request, as before.
        let quiet = ExportContext {
            groups: crate::Groups {
                device: false,
                container: false,
                process: false,
                self_metrics: false,
                drop_attributes: vec![],
            },
            ..ctx()
        };
        let empty: Vec<Vec<u8>> = requests(
            &Snapshot::default(),
            &stats,
            &quiet,
            1,
            max,
            &mut Reuse::default(),
        )
        .collect();
        assert_eq!(
            empty,
            [encode_request(&Snapshot::default(), &stats, &quiet, 1)]
        );
    }

    /// The hand-written encoding is byte for byte what prost writes for the same message.
    #[test]
    fn the_encoding_is_what_prost_writes() {
        use gpu_model::{ContainerXid, GpmMetrics, MigSample, XidCount};
        let mut sn = snap();
        let d = &mut sn.devices[0];
        d.fields.xid_errors = Some(vec![XidCount { xid: 79, count: 2 }]);
        d.fields.gpm = Some(GpmMetrics {
            sm_active: Some(0.5),
            ..Default::default()
        });
        d.throttle_reasons = Some(0x20);
        d.sharing.idle_energy_joules = Some(4.0);
        d.mig_devices = vec![MigSample {
            uuid: "MIG-1".into(),
            memory_used_bytes: Some(0),
            ..Default::default()
        }];
        sn.containers[0].allocated_gpus = vec!["GPU-a".into()].into();
        sn.containers[0].accounts = vec![gpu_model::GpuAccount {
            uuid: "GPU-a".into(),
            gpu_uuid: "GPU-a".into(),
            energy_joules: 6.0,
            energy_since_ms: 1_500,
            ..Default::default()
        }];
        sn.container_xids = ["c1", "gone"]
            .map(|id| ContainerXid {
                container_id: Some(id.into()),
                pod_uid: Some("p1".into()),
                uuid: "GPU-a".into(),
                gpu_uuid: "GPU-a".into(),
                xid: 43,
                count: 1,
                ..Default::default()
            })
            .into();
        sn.processes = vec![gpu_model::ProcessUsage {
            pid: 7,
            container_id: Some("c1".into()),
            pod_uid: Some("p1".into()),
            uuid: "GPU-a".into(),
            comm: None,
            used_memory_bytes: 1 << 20,
            sm_util: Some(3),
            mem_util: None,
            enc_util: None,
            dec_util: None,
            exited: false,
        }];
        let mut cx = ctx();
        cx.groups.process = true;
        cx.resource_attributes = vec![("deployment.environment".into(), "prod".into())];
        let stats = AgentStats {
            started_ms: 5,
            events_received: 3,
            ..Default::default()
        };
        for drop in [
            vec![],
            vec!["hw.gpu.index".to_string(), "k8s.pod.uid".into()],
        ] {
            cx.groups.drop_attributes = drop;
            let bytes = encode_request(&sn, &stats, &cx, 9);
            let decoded = ExportMetricsServiceRequest::decode(&bytes[..]).unwrap();
            assert_eq!(
                decoded.resource_metrics.len(),
                3,
                "the node (with the host entry), c1, gone"
            );
            assert_eq!(decoded.encode_to_vec(), bytes);
        }
    }

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
        // A stalled GPU (the sampler sends it without readings): said stalled and failed;
        // the same GPU answering says 0.
        assert!(has(
            &points(node, "gpu_agent.nvml.stalled"),
            ("hw.id", "GPU-a"),
            0.0
        ));
        let mut sn = snap();
        sn.devices[0].status = gpu_model::DeviceStatus::Stalled {
            call: "nvmlDeviceGetPowerUsage".into(),
            secs: 7,
        };
        let r = build_request(&sn, &AgentStats::default(), &ctx(), 0);
        let node = &r.resource_metrics[0];
        assert!(has(
            &points(node, "gpu_agent.nvml.stalled"),
            ("hw.id", "GPU-a"),
            1.0
        ));
        assert!(has(&points(node, "hw.status"), ("hw.state", "failed"), 1.0));
    }

    fn deployment(name: &str, replicaset: &str) -> std::sync::Arc<Workload> {
        std::sync::Arc::new(Workload {
            kind: WorkloadKind::Deployment,
            name: name.into(),
            replicaset: Some(replicaset.into()),
            job: None,
        })
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

    /// A container of the kept-request test: `i` picks its devices and figures.
    fn kept_container(i: u32, names: &[gpu_model::Name]) -> ContainerUsage {
        use gpu_model::{GpuAccount, LimitSource};
        let n = |k: usize| names[k % names.len()].clone();
        let mig = !i.is_multiple_of(3);
        let (uuid, gpu) = if mig { (n(1), n(0)) } else { (n(0), n(0)) };
        ContainerUsage {
            container_id: Some(format!("{i:064x}").into()),
            pod_uid: Some(format!("pod-{i}").into()),
            pod_name: (!i.is_multiple_of(4)).then(|| format!("trainer-{i}").into()),
            namespace: Some(n(2)),
            container_name: Some(n(3)),
            runtime: Some("containerd"),
            gpus: vec![ContainerGpu {
                uuid: uuid.clone(),
                gpu_uuid: gpu.clone(),
                memory_used_bytes: 1 << 30,
                sm_util: Some(10),
                mem_util: (i.is_multiple_of(2)).then_some(5),
                enc_util: None,
                dec_util: None,
                pids: vec![i, i + 1],
                gpu_time_seconds: Some(1.0),
                memory_byte_seconds: 2.0,
                counters_since_ms: 1_000 + i as u64,
            }],
            allocated_gpus: if i.is_multiple_of(5) {
                vec![uuid.clone()].into()
            } else {
                Default::default()
            },
            accounts: vec![GpuAccount {
                uuid,
                gpu_uuid: gpu,
                energy_joules: 3.0,
                energy_since_ms: if i.is_multiple_of(2) { 900 } else { 0 },
                memory_peak_bytes: Some(1 << 31),
                memory_limit_bytes: (i % 3 == 1).then_some(10 << 30),
                memory_limit_source: (i % 3 == 1).then_some(LimitSource::Mig),
                sm_limit_percent: None,
                accounted_processes: 0,
                accounted_gpu_seconds: 0.0,
                gpus_held: Some(1.0),
                sm_share: None,
            }],
            ..Default::default()
        }
    }

    /// `n` containers of the kept-request tests, the names they share, and the stats.
    fn kept_snapshot(n: u32) -> (Snapshot, Vec<gpu_model::Name>, AgentStats) {
        let names: Vec<gpu_model::Name> = ["GPU-a", "MIG-b", "ml", "main"]
            .into_iter()
            .map(Into::into)
            .collect();
        let mut sn = snap();
        sn.containers = (0..n).map(|i| kept_container(i, &names)).collect();
        let stats = AgentStats {
            started_ms: 5,
            ..Default::default()
        };
        (sn, names, stats)
    }

    /// An XID charged to `c`.
    fn xid_of(c: &ContainerUsage) -> ContainerXid {
        ContainerXid {
            container_id: c.container_id.as_deref().map(Into::into),
            pod_uid: c.pod_uid.as_deref().map(Into::into),
            uuid: "MIG-b".into(),
            gpu_uuid: "GPU-a".into(),
            xid: 79,
            count: 1,
            ..Default::default()
        }
    }

    /// An export of `sn` through `reuse`, in requests of `max` bytes, checked against a
    /// fresh encoding and handed back: its requests' addresses, and how many resources it
    /// patched.
    fn export_kept(
        sn: &Snapshot,
        stats: &AgentStats,
        max: usize,
        reuse: &mut Reuse,
        what: &str,
    ) -> (Vec<usize>, usize) {
        let all: Vec<Vec<u8>> = requests(sn, stats, &ctx(), 1, max, reuse).collect();
        let want = encode_request(sn, stats, &ctx(), 1);
        assert!(
            all.concat() == want,
            "{what}: the requests are what a fresh encoding writes"
        );
        let n = all.len();
        let ptrs = all.iter().map(|r| r.as_ptr() as usize).collect();
        for r in all {
            reuse.give_back(r);
        }
        assert_eq!(reuse.holds(), n, "{what}: every request is taken back");
        (ptrs, reuse.patched)
    }

    #[test]
    fn a_request_patched_from_the_last_is_what_a_fresh_encoding_writes() {
        patched_through_changes(false);
    }

    #[test]
    fn an_export_of_several_requests_patches_each_from_the_last_export_s() {
        patched_through_changes(true);
    }

    #[test]
    fn reuse_off_keeps_no_request_and_patches_nothing() {
        let (sn, _, stats) = kept_snapshot(12);
        let want = encode_request(&sn, &stats, &ctx(), 1);
        let mut reuse = Reuse::off();
        for round in 0..3 {
            let all: Vec<Vec<u8>> =
                requests(&sn, &stats, &ctx(), 1, want.len() / 3, &mut reuse).collect();
            assert!(all.len() > 1, "round {round}: {} requests", all.len());
            assert!(all.concat() == want, "round {round}: a fresh encoding");
            for r in all {
                reuse.give_back(r);
            }
            assert_eq!(reuse.holds(), 0, "round {round}: nothing kept");
            assert_eq!(reuse.patched, 0, "round {round}: nothing patched");
        }
        assert!(!reuse.is_on() && Reuse::default().is_on());
    }

    /// Seventeen changes in turn, each export checked (`export_kept`): in one request, or
    /// (`split`) in requests of about three containers each.
    fn patched_through_changes(split: bool) {
        use gpu_model::LimitSource;
        let (mut sn, _, stats) = kept_snapshot(12);
        sn.containers.insert(3, ContainerUsage::default());
        let one = encode_request(&sn, &stats, &ctx(), 1).len();
        let max = if split { one / 4 } else { 8 << 20 };
        let mut reuse = Reuse::default();
        let (mut last, none) = export_kept(&sn, &stats, max, &mut reuse, "first");
        assert_eq!(none, 0);
        assert_eq!(last.len() > 3, split, "{} requests", last.len());
        // Each change, and the request after it: the last one patched, in its buffer (past
        // more changes than are moved in place, the rest of it is encoded afresh).
        type Change = fn(&mut Snapshot);
        let changes: [(&str, Change); 20] = [
            ("numbers", |s| {
                s.taken_at_ms += 1_000;
                for (k, c) in s.containers.iter_mut().enumerate() {
                    for g in &mut c.gpus {
                        g.memory_used_bytes += k as u64;
                        g.sm_util = Some(g.sm_util.unwrap_or(0) + 1);
                        *g.gpu_time_seconds.get_or_insert(0.0) += 0.5;
                        g.counters_since_ms += 1;
                        g.pids.push(7);
                    }
                    for a in &mut c.accounts {
                        a.energy_joules += 1.0;
                        a.memory_peak_bytes = Some(k as u64);
                    }
                }
            }),
            ("a name the same, in another string", |s| {
                s.containers[5].namespace = Some("ml".into());
            }),
            ("a utilization now known", |s| {
                s.containers[2].gpus[0].enc_util = Some(1)
            }),
            ("a GPU time unknown (a MIG device's)", |s| {
                s.containers[4].gpus[0].gpu_time_seconds = None
            }),
            ("that GPU time known", |s| {
                s.containers[4].gpus[0].gpu_time_seconds = Some(3.0)
            }),
            (
                "a GPU time gone as a utilization came: as many points",
                |s| {
                    let g = &mut s.containers[4].gpus[0];
                    (g.gpu_time_seconds, g.dec_util) = (None, Some(2));
                },
            ),
            ("a pod named", |s| {
                s.containers[5].pod_name = Some("named".into())
            }),
            ("a pod's owner known", |s| {
                s.containers[5].workload = Some(deployment("web", "web-5d8f"))
            }),
            ("the same owner, in another Arc", |s| {
                s.containers[5].workload = Some(deployment("web", "web-5d8f"))
            }),
            ("another owner", |s| {
                s.containers[5].workload = Some(deployment("web", "web-7c9d"))
            }),
            ("a limit from another source", |s| {
                s.containers[2].accounts[0].memory_limit_bytes = Some(1);
                s.containers[2].accounts[0].memory_limit_source = Some(LimitSource::Hami);
            }),
            ("a container gone", |s| {
                s.containers.remove(6);
            }),
            ("nothing", |_| {}),
            ("a container come", |s| {
                let names = ["GPU-a", "MIG-b", "ml", "main"].map(Into::into);
                s.containers.insert(1, kept_container(40, &names));
            }),
            ("an allocation", |s| {
                s.containers[9].allocated_gpus = vec!["GPU-z".into()].into()
            }),
            ("the same two containers swapped", |s| {
                s.containers.swap(10, 11)
            }),
            ("the last container gone", |s| {
                s.containers.pop();
            }),
            ("an XID charged", |s| {
                let x = xid_of(&s.containers[8]);
                s.container_xids.push(x);
            }),
            ("most containers changed", |s| {
                for c in &mut s.containers {
                    for g in &mut c.gpus {
                        g.dec_util = Some(g.dec_util.unwrap_or(0) + 1);
                    }
                }
            }),
            ("nothing", |_| {}),
        ];
        for (what, change) in changes {
            change(&mut sn);
            let (now, patched) = export_kept(&sn, &stats, max, &mut reuse, what);
            // Each change touches two containers at most, but the last one's; the last
            // one, encoded afresh past the first ones, gets room for it (it may move).
            // Split, a request that closes a container earlier or later than it did
            // moves one container across the border to the next.
            let kept = sn.containers.iter().filter(|c| !is_host(c)).count();
            let slack = if split { 2 + now.len() } else { 2 };
            match what {
                "most containers changed" if !split => {
                    assert!(patched < MAX_MOVES as usize, "{what}")
                }
                "most containers changed" => {}
                _ => {
                    assert!(
                        patched + slack >= kept,
                        "{what}: {patched} of {kept} patched"
                    );
                    let n = now.len().min(last.len());
                    assert_eq!(now[..n], last[..n], "{what}: the same buffers");
                }
            }
            last = now;
        }
    }

    #[test]
    fn requests_patched_through_random_changes_are_what_fresh_encodings_write() {
        random_changes(false);
    }

    #[test]
    fn split_requests_patched_through_random_changes_are_what_fresh_encodings_write() {
        random_changes(true);
    }

    /// 300 rounds of up to three random changes each, every export checked
    /// (`export_kept`): in one request, or (`split`) in requests of about six containers.
    fn random_changes(split: bool) {
        let (mut sn, names, stats) = kept_snapshot(30);
        let one = encode_request(&sn, &stats, &ctx(), 1).len();
        let max = if split { one / 5 } else { 8 << 20 };
        let mut reuse = Reuse::default();
        let mut patched = 0;
        // xorshift: the same sequence every run.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n.max(1) as u64) as usize
        };
        let mut next_id = 100;
        for round in 0..300 {
            sn.taken_at_ms += 1_000;
            for c in &mut sn.containers {
                for g in &mut c.gpus {
                    g.memory_used_bytes += 1;
                    if let Some(t) = &mut g.gpu_time_seconds {
                        *t += 0.25;
                    }
                }
            }
            for _ in 0..rand(4) {
                let n = sn.containers.len();
                let i = rand(n);
                match rand(7) {
                    0 if n > 2 => drop(sn.containers.remove(i)),
                    1 => {
                        next_id += 1;
                        sn.containers.insert(i, kept_container(next_id, &names));
                    }
                    2 => sn.containers.swap(i, rand(n)),
                    3 => {
                        let g = &mut sn.containers[i].gpus[0];
                        g.enc_util = g.enc_util.xor(Some(3));
                        // Its GPU time unknown, or known again.
                        g.gpu_time_seconds = g.gpu_time_seconds.xor(Some(1.0));
                    }
                    4 => {
                        let c = &mut sn.containers[i];
                        c.pod_name = Some(format!("p{round}").into());
                        let rs = format!("p-{}", round % 3);
                        c.workload = (round % 2 == 1).then(|| deployment("p", &rs));
                    }
                    5 => {
                        let a = &mut sn.containers[i].accounts[0];
                        a.sm_limit_percent = a.sm_limit_percent.xor(Some(50));
                    }
                    _ if sn.container_xids.is_empty() => {
                        let x = xid_of(&sn.containers[i]);
                        sn.container_xids.push(x);
                    }
                    _ => sn.container_xids.clear(),
                }
            }
            let (ptrs, n) = export_kept(&sn, &stats, max, &mut reuse, &format!("{round}"));
            assert_eq!(
                ptrs.len() > 3,
                split,
                "round {round}: {} requests",
                ptrs.len()
            );
            patched += n;
        }
        // Most of them are patched: about 30 containers and three changes a round.
        assert!(patched > 300 * 20, "{patched} patched");
    }
}
