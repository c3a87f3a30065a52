//! One resource's data points, gathered per metric, and their protobuf encoding as a
//! `ScopeMetrics`: each attribute set is encoded once, in the resource's arena, and shared
//! by the points that carry it.
use std::sync::OnceLock;

use crate::{
    catalogue::{Attr, Dropped, Kind, MetricId},
    pb::{self, Value},
};

use super::reuse;

/// An attribute before encoding: a catalogue entry, so that the drop rule applies to it.
pub(super) type Attribute<'a> = (Attr, Value<'a>);

pub(super) fn s(a: Attr, v: &str) -> Attribute<'_> {
    (a, Value::Str(v))
}

pub(super) fn int(a: Attr, v: i64) -> Attribute<'static> {
    (a, Value::Int(v))
}

/// Data-point attributes encoded in the resource's arena: a byte range of `KeyValue`
/// fields, shared by every point that carries them, and which attributes they are.
#[derive(Debug, Clone, Copy)]
pub(super) struct Attrs {
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
pub(super) struct Metrics {
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
    pub(super) start_ns: u64,
    pub(super) time_ns: u64,
    pub(super) drop: Dropped,
    /// Replaying a resource kept from the last export: the points only give their
    /// numbers, to `values`, and nothing is encoded.
    pub(super) replay: bool,
    /// Each point's start time (0 for gauges) and value, in the order they came.
    pub(super) values: Vec<(u64, f64)>,
    /// Each point's place in `list` (metric, point), in the order they came.
    order: Vec<(u16, u16)>,
    /// Where `write_scope` wrote each point's fixed fields, in the order written.
    written: Vec<usize>,
}

impl Metrics {
    pub(super) fn new(start_ns: u64, time_ns: u64, drop: Dropped) -> Metrics {
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

    pub(super) fn clear(&mut self) {
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
    pub(super) fn attrs<'a>(
        &mut self,
        attributes: impl IntoIterator<Item = Attribute<'a>>,
    ) -> Attrs {
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
    pub(super) fn with<'a>(
        &mut self,
        base: Attrs,
        extra: impl IntoIterator<Item = Attribute<'a>>,
    ) -> Attrs {
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

    pub(super) fn point(&mut self, id: MetricId, value: f64, attrs: Attrs) {
        self.point_since(id, value, attrs, self.start_ns);
    }

    /// A point of a sum that started counting at `start_ns`.
    pub(super) fn point_since(&mut self, id: MetricId, value: f64, attrs: Attrs, start_ns: u64) {
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
    pub(super) fn points<const N: usize>(
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

    pub(super) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Each point's offset from `base` (where its resource starts) in the order the points
    /// came, with the fixed fields it has: a kept resource's places to patch
    /// (`reuse::patch`). After `write_scope`.
    pub(super) fn offsets(&self, base: usize) -> Vec<u32> {
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
/// level, the lengths were a large part of the encoding).
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
pub(super) fn write_resource(out: &mut Vec<u8>, attrs: &[u8], m: &mut Metrics) {
    let scope = m.scope_len();
    pb::len_header(out, 1, pb::len_field(attrs.len()) + pb::len_field(scope));
    pb::bytes(out, 1, attrs);
    pb::len_header(out, 2, scope);
    m.write_scope(out);
}

#[cfg(test)]
mod tests {
    use gpu_model::AgentStats;
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use prost::Message;

    use crate::otlp::{
        encode_request,
        fixtures::{ctx, snap},
    };

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
}
