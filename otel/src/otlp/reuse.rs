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
//! Encoding afresh is most of an export on a large node (docs/benchmarks.md). Debug
//! builds (the tests) encode every patched resource afresh too and compare the bytes.
use std::{collections::HashMap, sync::Arc, time::Duration};

use gpu_model::{same, same_opt, ClaimDevice, ContainerUsage, GpuAccount, Name, Workload};

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
    /// The last export's size, all its requests together: the next one's buffers are made
    /// that big at once (`batch::buffer`). Kept also when `off`: a number, not a buffer.
    pub(super) last_len: usize,
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
/// gone cold were most of the patching's time on the large node.
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
    /// The claims of the allocation (their attributes are on its points).
    claims: Arc<[ClaimDevice]>,
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
            claims: c.claims.clone(),
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
            && (Arc::ptr_eq(&self.claims, &c.claims) || self.claims == c.claims)
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

#[cfg(test)]
mod tests {
    use gpu_model::{AgentStats, ContainerGpu, ContainerXid, Snapshot};

    use super::*;
    use crate::otlp::{
        batch::{is_host, MAX_MOVES},
        encode_request,
        fixtures::{ctx, deployment, snap},
        requests,
    };

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
