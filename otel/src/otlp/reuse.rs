//! The last export's requests, patched for the next one's. A container whose names,
//! devices and series are what they were encodes to the same bytes but for its values and
//! time stamps, and those are protobuf `fixed64` fields, of fixed width: the request that
//! went out a second ago (handed back by the exporter once sent) holds the container's
//! encoding already, and only its points' numbers are written again, in place. A
//! container whose shape changed, or that came, is encoded afresh and put in at its place;
//! the resources of containers gone are taken out; each such change moves the rest of the
//! request once. Past `MAX_MOVES` changes in one request the rest of it is encoded afresh,
//! as every export was before: a request never needs a second buffer.
//!
//! An export split into requests (gRPC's 1 MiB) patches each of the last export's at the
//! same place: the requests close where they did while the containers keep their sizes.
//! A container that crosses a border (one before it grew or shrank) is encoded afresh in
//! the request it now falls in, and taken out of the one it was in.
//!
//! On the large node (2,000 containers) encoding was a quarter of the agent's CPU. Debug
//! builds (the tests) encode every patched resource afresh too and compare the bytes.
use std::{collections::HashMap, sync::Arc, time::Duration};

use gpu_model::{same, same_opt, ContainerUsage, GpuAccount, Name, Workload};

use crate::catalogue::Dropped;

/// A point's offset in its resource, with the fields it has (`Metrics::offsets`).
pub(super) const HAS_START: u32 = 1 << 31;
pub(super) const HAS_TIME: u32 = 1 << 30;
const OFFSET: u32 = HAS_TIME - 1;

/// One export's encoding kept for the next (see the module's comment). Owned by the
/// export loop, which gives each request back once it is sent
/// ([`crate::export::OtlpExporter::take_sent`]).
#[derive(Default)]
pub struct Reuse {
    /// The last export's requests, in order: what each was made of, and its buffer once
    /// handed back.
    requests: Vec<Last>,
    /// What every resource of those requests was encoded with: the node's attributes and
    /// the drop rule.
    context: (Vec<u8>, Dropped),
    /// How many resources the last export patched from the one before (the tests read it).
    pub(super) patched: usize,
    /// Keeps nothing (`off`).
    off: bool,
}

/// Exports at most this far apart patch the last one's requests; further apart, each is
/// encoded afresh. Keeping them holds about 2 KiB a container between exports (4 MB on the
/// large node's 2,000, in 8 MiB of buffers grown by doubling) to save one encoding (about
/// 0.6 us a container) per export: worth it at an export a second, not at deploy/'s every
/// 30 s or the default's 60 s.
const REUSE_UP_TO: Duration = Duration::from_secs(10);

impl Reuse {
    /// For exports `interval` apart: on where they are close (`REUSE_UP_TO`), else `off`.
    pub fn for_interval(interval: Duration) -> Reuse {
        match interval <= REUSE_UP_TO {
            true => Reuse::default(),
            false => Reuse::off(),
        }
    }

    /// Keeps nothing: every export is encoded afresh and no request outlives its sending.
    /// For exports far apart, where the requests kept (about 2 KiB a container, megabytes
    /// on a large node) would be held a long time to save one encoding each.
    pub fn off() -> Reuse {
        Reuse {
            off: true,
            ..Reuse::default()
        }
    }

    /// Whether it keeps the last export's requests.
    pub fn is_on(&self) -> bool {
        !self.off
    }

    /// Takes back a request once it was sent: kept when it is one of the last export's
    /// requests, dropped otherwise.
    pub fn give_back(&mut self, sent: Vec<u8>) {
        let id = (sent.as_ptr() as usize, sent.len());
        if let Some(r) = self.requests.iter_mut().find(|r| r.sent == id) {
            r.buffer = Some(sent);
        }
    }

    /// The last export's requests, each with its node resource's length and its
    /// containers' entries, for an export encoded with the node's attributes `node_attrs`
    /// and `drop`: none where a request was not handed back, or when these changed.
    /// Nothing is left here.
    pub(super) fn start(&mut self, node_attrs: &[u8], drop: Dropped) -> Vec<Last> {
        let mut last = std::mem::take(&mut self.requests);
        if self.context.0 != node_attrs || self.context.1 != drop {
            self.context = (node_attrs.to_vec(), drop);
            last.clear();
        }
        for r in last.iter_mut().filter(|r| r.buffer.is_none()) {
            r.entries = vec![];
        }
        last
    }

    #[cfg(test)]
    pub(super) fn holds(&self) -> usize {
        self.requests.iter().filter(|r| r.buffer.is_some()).count()
    }

    /// Keeps the entries of this export's next request, `request`.
    pub(super) fn keep(&mut self, request: &[u8], node_len: usize, entries: Vec<Option<Entry>>) {
        self.requests.push(Last {
            buffer: None,
            entries,
            node_len,
            sent: (request.as_ptr() as usize, request.len()),
        });
    }
}

/// What an export finds of one of the last one's requests.
pub(super) struct Last {
    pub buffer: Option<Vec<u8>>,
    pub entries: Vec<Option<Entry>>,
    /// The node resource's length at its head (the first request's; 0 in the others).
    pub node_len: usize,
    /// Its address and length when it was handed out: only that very buffer is taken back.
    sent: (usize, usize),
}

/// One container's resource in the last request. Small, since each export moves its
/// entries into the next one's list: unboxed, those moves of 200-byte layouts into memory
/// gone cold were half of the patching's samples on the large node.
pub(super) struct Entry {
    pub start: usize,
    pub len: usize,
    pub layout: Box<Layout>,
}

/// What a resource is made of.
pub(super) struct Layout {
    /// Each point's offset in the resource, in the order the points were added, with
    /// `HAS_START` and `HAS_TIME`.
    pub points: Vec<u32>,
    pub shape: Shape,
}

impl Entry {
    pub fn new(start: usize, len: usize, points: Vec<u32>, c: &ContainerUsage) -> Entry {
        let shape = Shape::of(c);
        let layout = Box::new(Layout { points, shape });
        Entry { start, len, layout }
    }

    /// Asks for the layout, then (a step later) for its lists.
    pub fn prefetch(&self) {
        gpu_model::prefetch(&*self.layout);
    }

    pub fn prefetch_lists(&self) {
        gpu_model::prefetch(self.layout.points.as_ptr());
        gpu_model::prefetch(self.layout.shape.devices.as_ptr());
    }
}

/// What a container's encoding depends on besides its numbers. Names are compared by
/// pointer first (the join hands out the same names cycle after cycle), then by content.
pub(super) struct Shape {
    names: [Option<Name>; 5],
    runtime: Option<&'static str>,
    /// The pod's owner: one `Arc` per pod from the metadata, the same cycle after cycle.
    workload: Option<Arc<Workload>>,
    allocated: Arc<[Name]>,
    /// Per device used, its UUID, its GPU's and which utilizations are known; then per
    /// account, its device, its GPU's and which figures it has.
    devices: Vec<(Name, Name, u8)>,
    /// How many of `devices` are devices used.
    used: usize,
}

fn identity(c: &ContainerUsage) -> [&Option<Name>; 5] {
    [
        &c.container_id,
        &c.pod_uid,
        &c.pod_name,
        &c.namespace,
        &c.container_name,
    ]
}

/// Which of a device's utilizations, and whether its GPU time, have a point.
fn util_bits(g: &gpu_model::ContainerGpu) -> u8 {
    let known = [g.sm_util, g.mem_util, g.enc_util, g.dec_util].map(|u| u.is_some());
    let bits = known
        .iter()
        .enumerate()
        .fold(0, |b, (i, &k)| b | (k as u8) << i);
    bits | (g.gpu_time_seconds.is_some() as u8) << 4
}

/// Which of an account's figures have a point, and the limit's source (an attribute).
fn account_bits(a: &GpuAccount) -> u8 {
    let source = match (a.memory_limit_bytes, a.memory_limit_source) {
        (Some(_), Some(s)) => 1 + s as u8,
        _ => 0,
    };
    (a.energy_since_ms > 0) as u8
        | (a.memory_peak_bytes.is_some() as u8) << 1
        | (a.sm_limit_percent.is_some() as u8) << 2
        | ((a.accounted_processes > 0) as u8) << 3
        | source << 4
}

/// The same pod owner: the very same, mostly.
fn same_workload(a: &Option<Arc<Workload>>, b: &Option<Arc<Workload>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
        (a, b) => a.is_none() && b.is_none(),
    }
}

/// A runtime's name is one of a few constants: the same pointer, mostly.
fn same_runtime(a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => std::ptr::eq(a, b) || a == b,
        (a, b) => a.is_none() && b.is_none(),
    }
}

impl Shape {
    pub fn of(c: &ContainerUsage) -> Shape {
        Shape {
            names: identity(c).map(Clone::clone),
            runtime: c.runtime,
            workload: c.workload.clone(),
            allocated: c.allocated_gpus.clone(),
            devices: (c.gpus.iter())
                .map(|g| (g.uuid.clone(), g.gpu_uuid.clone(), util_bits(g)))
                .chain(
                    (c.accounts.iter())
                        .map(|a| (a.uuid.clone(), a.gpu_uuid.clone(), account_bits(a))),
                )
                .collect(),
            used: c.gpus.len(),
        }
    }

    /// Does `c` encode as this shape did, but for its numbers?
    pub fn fits(&self, c: &ContainerUsage) -> bool {
        let names = self
            .names
            .iter()
            .zip(identity(c))
            .all(|(a, b)| same_opt(a, b));
        names
            && same_runtime(self.runtime, c.runtime)
            && same_workload(&self.workload, &c.workload)
            && self.used == c.gpus.len()
            && self.devices.len() == c.gpus.len() + c.accounts.len()
            && (self.devices.iter().zip(&c.gpus)).all(|((u, p, b), g)| {
                same(u, &g.uuid) && same(p, &g.gpu_uuid) && *b == util_bits(g)
            })
            && (self.devices[self.used..].iter().zip(&c.accounts)).all(|((u, p, b), a)| {
                same(u, &a.uuid) && same(p, &a.gpu_uuid) && *b == account_bits(a)
            })
            && self.allocated.len() == c.allocated_gpus.len()
            && (self.allocated.iter().zip(c.allocated_gpus.iter())).all(|(a, b)| same(a, b))
    }

    /// The owner's names: the key of the last request's entries when they are looked up.
    fn owner(&self) -> OwnerKey {
        (self.names[0].clone(), self.names[1].clone())
    }
}

/// A container's id and pod UID.
type OwnerKey = (Option<Name>, Option<Name>);

/// The last request's entries, looked up by owner once the containers came in another
/// order or some came or went.
pub(super) struct Lookup {
    by_owner: Option<HashMap<OwnerKey, usize>>,
}

impl Lookup {
    pub fn new() -> Lookup {
        Lookup { by_owner: None }
    }

    /// The entry for `c`: the one at `hint` if it fits, else the owner's.
    pub fn find(
        &mut self,
        entries: &mut [Option<Entry>],
        hint: usize,
        c: &ContainerUsage,
    ) -> Option<(usize, Entry)> {
        if let Some(Some(e)) = entries.get(hint) {
            if e.layout.shape.fits(c) {
                return Some((hint, entries[hint].take()?));
            }
        }
        let by_owner = self.by_owner.get_or_insert_with(|| {
            (entries.iter().enumerate())
                .filter_map(|(i, e)| Some((e.as_ref()?.layout.shape.owner(), i)))
                .collect()
        });
        let i = *by_owner.get(&(c.container_id.clone(), c.pod_uid.clone()))?;
        match &entries[i] {
            Some(e) if e.layout.shape.fits(c) => Some((i, entries[i].take()?)),
            _ => None,
        }
    }
}

fn put(buf: &mut [u8], at: usize, v: u64) {
    // The field's one-byte key stays; its eight bytes follow.
    buf[at + 1..at + 9].copy_from_slice(&v.to_le_bytes());
}

/// Writes a resource's new numbers over its old ones at `base`: each point's start (sums)
/// and value, and the time. False, having written part of it, when the points are not
/// those the resource was encoded with.
pub(super) fn patch(
    buf: &mut [u8],
    base: usize,
    points: &[u32],
    values: &[(u64, f64)],
    time_ns: u64,
) -> bool {
    if points.len() != values.len() {
        return false;
    }
    for (&p, &(start_ns, value)) in points.iter().zip(values) {
        let mut at = base + (p & OFFSET) as usize;
        if (p & HAS_START != 0) != (start_ns != 0) || (p & HAS_TIME != 0) != (time_ns != 0) {
            return false;
        }
        if start_ns != 0 {
            put(buf, at, start_ns);
            at += 9;
        }
        if time_ns != 0 {
            put(buf, at, time_ns);
            at += 9;
        }
        put(buf, at, value.to_bits());
    }
    true
}
