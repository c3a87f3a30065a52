//! An export's requests: the node's resource, then one per container, batched into
//! requests of at most `max_bytes` (whole resources), each patched in place from the last
//! export's request at the same place where its containers are unchanged but for their
//! numbers (`reuse`).
use gpu_model::{AgentStats, ContainerUsage, Snapshot};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use prost::Message;

use crate::catalogue::Dropped;

use super::{
    container::{container_group, xids_of_gone_containers, ByOwner},
    metrics::{write_resource, Metrics},
    node::{device_metrics, idle_energy, self_metrics},
    resource::{container_resource_bytes, node_resource_bytes},
    reuse, ExportContext, Reuse, MS,
};

/// Encodes the request for one export, all of it in one (`requests` splits it). `now_ms`
/// stamps it when the snapshot has no time yet. Its buffer grows as it is written: there is
/// no last export's size to make it at once (`requests` has one, in its `Reuse`).
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
    mut reuse: Option<&'a mut Reuse>,
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
    let keep =
        reuse.as_ref().is_some_and(|r| r.is_on()) && ctx.groups.container && !ctx.groups.process;
    let last = (reuse.as_deref_mut())
        .filter(|_| keep)
        .map(|r| r.start(&node_attrs, drop));
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
        last_len: reuse.as_ref().map_or(0, |r| r.last_len),
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
        keep,
        kept,
    }
}

/// A request's buffer. The requests of one export, and of one export after another, get the
/// same size (that of the last export, or the most a request may hold), so that malloc
/// hands back the space the last one freed (a size above the last freed one is mapped
/// afresh, its pages faulted in, every cycle). `last_len` is the last
/// export's size, 0 where none is known.
fn buffer(max_bytes: usize, last_len: usize) -> Vec<u8> {
    // Room for the resource that takes a request past its size.
    let over = if max_bytes == usize::MAX {
        4096
    } else {
        64 << 10
    };
    Vec::with_capacity(last_len.min(max_bytes) + over)
}

pub(super) fn is_host(c: &ContainerUsage) -> bool {
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
    /// What the export loop keeps from one export to the next: the last export's size,
    /// and its requests where `keep`.
    reuse: Option<&'a mut Reuse>,
    /// Whether this export's requests are kept for the next, and the last one's patched.
    keep: bool,
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
    /// The last export's size (`Reuse`'s), 0 where none is known: what a buffer is made
    /// for.
    last_len: usize,
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
pub(super) const MAX_MOVES: u32 = 8;

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
                let mut out = buffer(max_bytes, self.last_len);
                out.extend_from_slice(head);
                out
            }
        }
    }

    /// Keeps what request `out` is made of for the next export, in `reuse`.
    fn end(&mut self, out: &[u8], reuse: &mut Reuse) {
        reuse.keep(out, self.node_len, std::mem::take(&mut self.entries));
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
        let keep = self.keep && !self.by.has_xids(c);
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
            let room = self.kept.last_len.min(self.max_bytes) + (64 << 10);
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
            // the resource attributes waited on them otherwise).
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
                if let Some(r) = self.reuse.as_deref_mut().filter(|_| self.keep) {
                    self.kept.end(&self.out, r);
                }
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
        if let Some(r) = self.reuse.as_deref_mut() {
            r.last_len = self.sent_bytes + self.out.len();
        }
        if self.out.is_empty() && !first {
            return None;
        }
        if let Some(r) = self.reuse.as_deref_mut().filter(|_| self.keep) {
            self.kept.end(&self.out, r);
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
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use prost::Message;

    use super::*;
    use crate::otlp::fixtures::{ctx, snap};

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
}
