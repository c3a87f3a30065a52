//! The join: GPU samples (by host PID) x the process state -> an immutable snapshot per
//! container and GPU. `join` is pure: the same inputs give the same snapshot, and the
//! cumulative counters go in and come out as values. `Joiner` owns what carries over from
//! one cycle to the next: those counters, the lists of the snapshot before, and the GPU
//! PIDs nobody could place.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use rustc_hash::FxHashSet;

pub use gpu_model::{ContainerGpu, ContainerUsage, ProcessUsage, Snapshot};
use gpu_model::{Name, SourceStatus};

use super::{
    claims::Unmatched,
    counters::Counters,
    group::{fill_entry, group_processes, Group, AHEAD},
    ledger::{device, position, Accumulated, Ledgers, Slot},
    naming,
    owner::{held_idle, owner_key, DeviceNames, Owner},
    spare::Spare,
    xid_charge::XidCharges,
    GpuSample,
};
use crate::{
    metadata::Metadata,
    process::{Lookup, Resolver},
};

/// Counters of an (owner, device) not used for this long are forgotten.
pub const FORGET_AFTER_MS: u64 = 10 * 60 * 1000;

/// What accumulating group `i + AHEAD` reads first: its owner's counters (a list of their
/// own, cold since the cycle before) and the recycled entry it fills.
fn prefetch_group(
    ledgers: &Ledgers<Accumulated>,
    slots: &[Slot],
    containers: &[ContainerUsage],
    i: usize,
) {
    use gpu_model::prefetch;
    if let Some(&s) = slots.get(i + AHEAD) {
        if let Some(d) = ledgers.read(s).first() {
            prefetch((d as *const (Name, Accumulated)).cast::<u8>());
        }
    }
    if let Some(c) = containers.get(i + AHEAD) {
        prefetch(c);
    }
}

/// The entries of one cycle, with the owner and the slot of each grouped one.
struct Entries {
    containers: Vec<ContainerUsage>,
    owners: Vec<Option<Owner>>,
    slots: Vec<Slot>,
}

/// One entry per owner, its cumulative counters advanced by `dt` seconds in place; the
/// counters of owners idle this cycle are kept (they must not reset) until forgotten.
fn accumulate(
    groups: Vec<Group<'_>>,
    counters: &mut Counters,
    spare: &mut Spare,
    dt: f64,
    taken_at_ms: u64,
) -> Entries {
    // The entries of the snapshot before last, names in place: each is filled again.
    let mut containers = spare.containers(groups.len());
    let mut owners = Vec::with_capacity(groups.len());
    let slots: Vec<Slot> = groups.iter().map(|g| g.slot).collect();
    for (i, g) in groups.into_iter().enumerate() {
        prefetch_group(&counters.ledgers, &slots, &containers, i);
        let mut gpus = g.gpus;
        gpus.sort_unstable_by(|a, b| a.uuid.cmp(&b.uuid));
        let devices = counters.ledgers.at(g.slot);
        for cg in &mut gpus {
            let acc = device(devices, &cg.uuid);
            // Used now: not forgotten this cycle.
            acc.last_seen_ms = taken_at_ms;
            if let Some(sm) = cg.sm_util {
                *acc.gpu_seconds.get_or_insert(0.0) += sm as f64 / 100.0 * dt;
            }
            acc.byte_seconds += cg.memory_used_bytes as f64 * dt;
            if acc.since_ms == 0 {
                acc.since_ms = taken_at_ms;
            }
            cg.counters_since_ms = acc.since_ms;
            cg.gpu_time_seconds = acc.gpu_seconds;
            cg.memory_byte_seconds = acc.byte_seconds;
            cg.pids.sort_unstable();
        }
        let meta = match g.owner {
            Owner::Host => None,
            _ => g.meta,
        };
        owners.push(Some(g.owner));
        if i == containers.len() {
            containers.push(ContainerUsage::default());
        }
        fill_entry(&mut containers[i], meta, gpus, spare.accounts(0));
    }
    counters.last_sample_ms = taken_at_ms;
    Entries {
        containers,
        owners,
        slots,
    }
}

/// Containers the kubelet gave a GPU that run no GPU process at all: allocated, idle.
fn allocated_but_idle(metadata: &Metadata, containers: &[ContainerUsage]) -> Vec<ContainerUsage> {
    // One set of the names present, not a scan of the containers per allocation.
    let mut named: FxHashSet<(&str, &str, &str)> = containers
        .iter()
        .filter_map(|c| {
            Some((
                c.namespace.as_deref()?,
                c.pod_name.as_deref()?,
                c.container_name.as_deref()?,
            ))
        })
        .collect();
    let mut out = vec![];
    for a in metadata.allocations() {
        let key = (
            a.namespace.as_str(),
            a.pod_name.as_str(),
            a.container_name.as_str(),
        );
        if !named.insert(key) {
            continue;
        }
        let id = metadata.allocated_id(key.0, key.1, key.2);
        // The runtime's names where it named the container (shared), else the kubelet's.
        let known = id.and_then(|id| metadata.names_of(id));
        let or = |n: Option<&Name>, s: &str| Some(n.cloned().unwrap_or_else(|| s.into()));
        out.push(ContainerUsage {
            container_id: id.cloned(),
            pod_uid: known.and_then(|n| n.pod_uid.clone()),
            pod_name: or(known.and_then(|n| n.pod_name.as_ref()), &a.pod_name),
            namespace: or(known.and_then(|n| n.namespace.as_ref()), &a.namespace),
            container_name: or(
                known.and_then(|n| n.container_name.as_ref()),
                &a.container_name,
            ),
            ..Default::default()
        });
    }
    out
}

/// The counters of a device whose allocation an entry holds, used this cycle or not, are
/// kept while it holds it: its next stretch of use goes on counting where the last ended.
/// A device not read this cycle (stalled, lost) says nothing of its allocation.
fn keep_held(
    counters: &mut Counters,
    containers: &[ContainerUsage],
    slots: &[Slot],
    sample: &GpuSample,
    names: &DeviceNames,
) {
    let now = sample.taken_at_ms;
    for (i, c) in containers.iter().enumerate() {
        let mut held = held_idle(c, sample, names).peekable();
        if held.peek().is_none() {
            continue;
        }
        let slot = match slots.get(i) {
            Some(&s) => Some(s),
            None => owner_key(c).and_then(|o| counters.ledgers.find(&o)),
        };
        let Some(slot) = slot else { continue };
        let devices = counters.ledgers.at(slot);
        for (_, uuid) in held {
            if let Some(k) = position(devices, uuid) {
                devices[k].1.last_seen_ms = now;
            }
        }
    }
}

/// How the join runs: `max_gap` caps the time credited to the counters when samples were
/// missed (NVML unavailable, the agent paused); `process_detail` adds per-process rows.
#[derive(Debug, Clone, Copy)]
pub struct JoinOptions {
    pub max_gap: Duration,
    pub process_detail: bool,
}

/// Joins one GPU sample with the process state, from the counters of the cycle before.
pub fn join(
    procs: &impl Resolver,
    metadata: &Metadata,
    sample: &GpuSample,
    nvml_status: &SourceStatus,
    prev: &Counters,
    max_gap: Duration,
    process_detail: bool,
) -> (Snapshot, Counters) {
    let opts = JoinOptions {
        max_gap,
        process_detail,
    };
    let mut counters = prev.clone();
    let mut spare = Spare::default();
    let input = Input {
        metadata,
        sample,
        nvml_status,
        opts,
    };
    let (snap, _) = join_in_place(procs, &input, &mut counters, &mut spare);
    (snap, counters)
}

/// What a join reads besides the process state: the metadata, the sample, NVML's status
/// and how it runs.
struct Input<'a> {
    metadata: &'a Metadata,
    sample: &'a GpuSample,
    nvml_status: &'a SourceStatus,
    opts: JoinOptions,
}

/// The join, updating the counters in place and filling the lists `spare` kept; with the
/// owners of the entries it grouped, in their order.
fn join_in_place(
    procs: &impl Resolver,
    input: &Input,
    counters: &mut Counters,
    spare: &mut Spare,
) -> (Snapshot, Vec<Option<Owner>>) {
    let Input {
        metadata,
        sample,
        nvml_status,
        opts,
    } = *input;
    let last = counters.last_sample_ms;
    let dt = if last == 0 || sample.taken_at_ms <= last {
        0.0
    } else {
        ((sample.taken_at_ms - last) as f64 / 1000.0).min(opts.max_gap.as_secs_f64())
    };
    let names = DeviceNames::new(sample, &counters.uuids);
    let (groups, processes, mps_servers) =
        group_processes(procs, sample, &names, opts.process_detail, counters, spare);
    let Entries {
        mut containers,
        owners,
        slots,
    } = accumulate(groups, counters, spare, dt, sample.taken_at_ms);
    counters.uuids = names.set();
    counters
        .naming
        .name_all(&mut containers, &owners, &slots, metadata, sample, &names);
    let idle = counters.naming.idle(|| {
        let mut idle = allocated_but_idle(metadata, &containers);
        for c in &mut idle {
            naming::name_and_allocate(c, metadata, &sample.devices, &names);
        }
        // Allocated nothing the sample has (a DRA claim's MIG device not made yet).
        idle.retain(|c| !c.allocated_gpus.is_empty());
        idle
    });
    containers.extend(idle);
    keep_held(counters, &containers, &slots, sample, &names);
    // Counters neither used nor held for a while are forgotten; an owner left with none
    // gives its slot back.
    let now = sample.taken_at_ms;
    (counters.ledgers).retain(|_, a| now.saturating_sub(a.last_seen_ms) < FORGET_AFTER_MS);
    let devices = sample
        .devices
        .iter()
        .map(|d| {
            let mut d = d.readings();
            d.sharing.accounting.clear();
            d.sharing.accounting_pids.clear();
            d.sharing.mps_server_pids = mps_servers
                .iter()
                .filter(|(u, _)| *u == d.uuid)
                .map(|(_, p)| *p)
                .collect();
            d
        })
        .collect();
    let snap = Snapshot {
        taken_at_ms: sample.taken_at_ms,
        nvml: nvml_status.clone(),
        driver_version: sample.driver_version.clone(),
        devices,
        containers,
        processes,
        container_xids: vec![],
    };
    (snap, owners)
}

/// What a join found out about its snapshot's entries besides the snapshot itself.
#[derive(Debug, Clone, Copy)]
pub struct Joined<'a> {
    /// The sample's GPU uuids as the entries share them: a later stage that looks the
    /// entries' devices up in these compares by pointer.
    pub gpu_names: &'a FxHashSet<Name>,
    /// The owner of each entry the join grouped (the first ones), in their order: the
    /// same as `owner_key` of each, shared rather than made again.
    pub owners: &'a [Option<Owner>],
}

/// How long a GPU PID that nobody could place is left alone before /proc is asked again.
const UNRESOLVED_RETRY: Duration = Duration::from_secs(30);

/// The join's owner across cycles: the cumulative counters, the lists of the snapshot
/// before, the XIDs charged, the GPU PIDs that neither the cache nor /proc could place
/// (not asked about again for a while), and the DRA devices that match no device.
#[derive(Debug, Default)]
pub struct Joiner {
    counters: Counters,
    /// The owners of the last snapshot's grouped entries, in their order.
    owners: Vec<Option<Owner>>,
    spare: Spare,
    unresolved: HashMap<u32, Instant>,
    xids: XidCharges,
    /// DRA devices that match no device of the sample.
    unmatched: Unmatched,
}

/// What one cycle found out about the sample's PIDs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Coverage {
    pub gpu_processes: u64,
    /// Charged to the host entry: nobody could say where they belong.
    pub unresolved: u64,
}

impl Joiner {
    /// Gives every GPU PID the state lacks one chance to be placed (from the kernel map,
    /// else /proc for that PID alone). A PID nobody could place is not looked up again for
    /// `UNRESOLVED_RETRY`: it stays charged to the host entry meanwhile.
    pub fn look_up_missing(&mut self, sample: &GpuSample, procs: &mut impl Lookup) -> Coverage {
        let now = Instant::now();
        let pids = sample.pids();
        let mut cov = Coverage {
            gpu_processes: pids.clone().count() as u64,
            unresolved: 0,
        };
        // A process on two GPUs is named twice: placed at its first, it is not again.
        let mut placed = vec![];
        for pid in procs.missing(pids) {
            let recent = self
                .unresolved
                .get(&pid)
                .is_some_and(|t| now.duration_since(*t) < UNRESOLVED_RETRY);
            if recent {
                cov.unresolved += 1;
            } else if placed.contains(&pid) {
                continue;
            } else if procs.look_up(pid) {
                placed.push(pid);
            } else {
                self.unresolved.insert(pid, now);
                cov.unresolved += 1;
            }
        }
        self.unresolved
            .retain(|_, t| now.duration_since(*t) < UNRESOLVED_RETRY);
        cov
    }

    /// The join, with this owner's counters and lists carried over, and the XIDs charged
    /// to the containers of their processes.
    pub fn join(
        &mut self,
        procs: &impl Resolver,
        metadata: &Metadata,
        sample: &GpuSample,
        nvml_status: &SourceStatus,
        max_gap: Duration,
        process_detail: bool,
    ) -> Snapshot {
        let opts = JoinOptions {
            max_gap,
            process_detail,
        };
        let input = Input {
            metadata,
            sample,
            nvml_status,
            opts,
        };
        let (mut snap, owners) = join_in_place(procs, &input, &mut self.counters, &mut self.spare);
        self.owners = owners;
        snap.container_xids = self.xids.charge(procs, metadata, sample);
        self.unmatched.check(metadata, sample);
        snap
    }

    /// How many devices of the DRA claims the kubelet lists matched no device of the last
    /// sample (each said once per claim at WARN).
    pub fn dra_devices_unmatched(&self) -> usize {
        self.unmatched.count()
    }

    /// A snapshot nobody holds any more: its lists are filled again by the next join.
    pub fn recycle(&mut self, snap: Snapshot) {
        self.spare.recycle(snap);
    }

    /// What the last join found out about its snapshot's entries, for a later stage.
    pub fn joined(&self) -> Joined<'_> {
        Joined {
            gpu_names: &self.counters.uuids,
            owners: &self.owners,
        }
    }

    /// Containers whose cgroups are gone (`Tracker::gc`): no process of theirs can be
    /// joined again, so their counters are forgotten now, and their XID counts
    /// `xid_charge::KEEP_GONE_MS` after `now_ms`.
    pub fn gone(&mut self, ids: &[String], now_ms: u64) {
        for id in ids {
            let owner = Owner::Container(id.as_str().into());
            self.counters.ledgers.forget(&owner, |_| true);
        }
        self.xids.gone(ids, now_ms);
    }

    /// The length of each structure the join keeps per owner, device or PID.
    pub fn lengths(&self) -> [(&'static str, usize); 4] {
        let c = &self.counters;
        [
            ("join_ledgers", c.ledgers.len()),
            ("join_owners", c.ledgers.owners()),
            ("xid_charges", self.xids.kept()),
            ("unresolved_pids", self.unresolved.len()),
        ]
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Instant;

    use super::*;
    use crate::gpu::{DeviceSample, ProcessSample};
    use crate::metadata::{Allocation, ContainerNames};
    use crate::process::Placement;
    use crate::process::{
        cache::{ProcessCache, ProcessEntry},
        cgroup::CgroupRegistry,
        cgroup::ContainerRef,
        State,
    };
    use gpu_model::DeviceStatus;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    const UID: &str = "12345678-1234-1234-1234-123456789abc";

    fn state() -> State {
        let mut registry = CgroupRegistry::default();
        let u = UID.replace('-', "_");
        registry.insert(0, 10, &format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{A}.scope"));
        registry.insert(0, 11, &format!("/kubepods/besteffort/pod{UID}/{B}"));
        registry.insert(0, 1, "/");
        let mut cache = ProcessCache::new(Duration::from_secs(5), 1000);
        for (pid, cg) in [(100, 10), (101, 10), (200, 11), (300, 1)] {
            cache.upsert(ProcessEntry::new(
                pid,
                1,
                1,
                format!("p{pid}").as_str().into(),
                Some(cg),
                None,
            ));
        }
        State::on_cgroup2(cache, registry)
    }

    fn proc(pid: u32, mem: u64, sm: u32) -> ProcessSample {
        ProcessSample {
            pid,
            used_memory_bytes: mem,
            sm_util: Some(sm),
            mem_util: Some(1),
            enc_util: Some(0),
            dec_util: Some(0),
            ..Default::default()
        }
    }

    fn sample(t: u64, procs: Vec<ProcessSample>) -> GpuSample {
        GpuSample {
            taken_at_ms: t,
            driver_version: Some("580".into()),
            devices: vec![DeviceSample {
                uuid: "GPU-1".into(),
                status: DeviceStatus::Ok,
                processes: procs,
                ..Default::default()
            }],
        }
    }

    /// A first join of `s` (no counters before, nothing named), NVML fine.
    fn first_join(st: &State, s: &GpuSample, process_detail: bool) -> Snapshot {
        let ok = SourceStatus::Ok;
        let gap = Duration::from_secs(3);
        let md = Metadata::default();
        join(st, &md, s, &ok, &Counters::default(), gap, process_detail).0
    }

    fn find<'a>(s: &'a Snapshot, id: Option<&str>) -> &'a ContainerUsage {
        s.containers
            .iter()
            .find(|c| c.container_id.as_deref() == id)
            .unwrap_or_else(|| panic!("no container {id:?} in {:?}", s.containers))
    }

    #[test]
    fn sums_processes_per_container_and_keeps_host_processes() {
        let st = state();
        let s = sample(
            1000,
            vec![
                proc(100, 1 << 30, 30),
                proc(101, 1 << 29, 20),
                proc(200, 5, 1),
                proc(300, 7, 2),
                proc(999, 9, 3),
            ],
        );
        let snap = first_join(&st, &s, true);
        let a = find(&snap, Some(A));
        assert_eq!(a.pod_uid.as_deref(), Some(UID));
        assert_eq!(a.qos, Some("burstable"));
        assert_eq!(a.gpus[0].memory_used_bytes, (1 << 30) + (1 << 29));
        assert_eq!(a.gpus[0].sm_util, Some(50));
        assert_eq!(a.gpus[0].pids, vec![100, 101]);
        assert_eq!(find(&snap, Some(B)).gpus[0].memory_used_bytes, 5);
        // A host process and an unknown pid both land under the host entry: nothing dropped.
        let host = find(&snap, None);
        assert_eq!(host.pod_uid, None);
        assert_eq!(host.gpus[0].memory_used_bytes, 16);
        assert_eq!(host.gpus[0].pids, vec![300, 999]);
        assert_eq!(snap.processes.len(), 5);
        assert!(snap.devices[0].processes.is_empty());
    }

    /// `n` containers of one process each (pid 1000 + i), and their ids.
    fn many(n: u32) -> (State, Vec<String>) {
        let mut registry = CgroupRegistry::default();
        let mut cache = ProcessCache::new(Duration::from_secs(5), 1000);
        let ids: Vec<String> = (0..n).map(|i| format!("{i:064x}")).collect();
        for (i, id) in (0..n).zip(&ids) {
            let cg = 1000 + i as u64;
            registry.insert(0, cg, &format!("/kubepods/besteffort/pod{UID}/{id}"));
            let e = ProcessEntry::new(1000 + i, 1, 1, "p".into(), Some(cg), None);
            cache.upsert(e);
        }
        (State::on_cgroup2(cache, registry), ids)
    }

    #[test]
    fn containers_gone_leave_no_counters_and_their_xids_go_later() {
        let (st, ids) = many(200);
        let (md, ok, gap) = (
            Metadata::default(),
            SourceStatus::Ok,
            Duration::from_secs(3),
        );
        let mut j = Joiner::default();
        let mut s = sample(1000, (1000..1200).map(|p| proc(p, 1 << 20, 1)).collect());
        s.devices[0].fields.xid_processes = vec![gpu_model::XidProcess {
            xid: 79,
            pid: 1000,
            ..Default::default()
        }];
        let snap = j.join(&st, &md, &s, &ok, gap, false);
        assert_eq!(snap.container_xids.len(), 1);
        let kept = |j: &Joiner| j.lengths().map(|(_, n)| n);
        assert_eq!(kept(&j), [200, 200, 1, 0]);
        j.gone(&ids, 2000);
        assert_eq!(kept(&j), [0, 0, 1, 0], "the XID count is still exported");
        s.devices[0].processes.clear();
        s.devices[0].fields.xid_processes.clear();
        s.taken_at_ms = 2000 + crate::gpu::join::xid_charge::KEEP_GONE_MS - 1;
        assert_eq!(
            j.join(&st, &md, &s, &ok, gap, false).container_xids.len(),
            1
        );
        s.taken_at_ms += 1;
        assert!(j
            .join(&st, &md, &s, &ok, gap, false)
            .container_xids
            .is_empty());
        assert_eq!(kept(&j), [0; 4]);
    }

    #[test]
    fn counters_accumulate_with_elapsed_time_and_survive_idle_cycles() {
        let st = state();
        // One cycle of `sample` after `c`.
        let step = |s: GpuSample, c: &Counters| {
            let (status, gap) = (SourceStatus::Ok, Duration::from_secs(3));
            join(&st, &Metadata::default(), &s, &status, c, gap, false)
        };
        let (_, c1) = step(
            sample(1000, vec![proc(100, 1000, 50)]),
            &Counters::default(),
        );
        let (s2, c2) = step(sample(3000, vec![proc(100, 1000, 50)]), &c1);
        let g = &find(&s2, Some(A)).gpus[0];
        assert!(
            (g.gpu_time_seconds.unwrap() - 1.0).abs() < 1e-9,
            "{:?}",
            g.gpu_time_seconds
        );
        assert!((g.memory_byte_seconds - 2000.0).abs() < 1e-9);
        // Idle cycle: the container is absent, its totals are kept for when it returns.
        let (s3, c3) = step(sample(4000, vec![]), &c2);
        assert!(s3.containers.is_empty());
        // A long gap is capped at max_gap.
        let (s4, _) = step(sample(100_000, vec![proc(100, 1000, 100)]), &c3);
        let g = &find(&s4, Some(A)).gpus[0];
        assert!(
            (g.gpu_time_seconds.unwrap() - 4.0).abs() < 1e-9,
            "{:?}",
            g.gpu_time_seconds
        );
    }

    #[test]
    fn exited_process_still_joins_through_its_tombstone() {
        let mut st = state();
        st.cache.on_exit(100, Instant::now());
        let (snap, _) = join(
            &st,
            &Metadata::default(),
            &sample(1000, vec![proc(100, 42, 0)]),
            &SourceStatus::Ok,
            &Counters::default(),
            Duration::from_secs(3),
            true,
        );
        assert_eq!(find(&snap, Some(A)).gpus[0].memory_used_bytes, 42);
        assert!(snap.processes[0].exited);
    }

    #[test]
    fn mig_processes_are_charged_to_their_mig_device() {
        let st = state();
        let mut p = proc(100, 10, 0);
        p.mig = Some(1);
        p.sm_util = None;
        let mut s = sample(1000, vec![p, proc(101, 20, 0)]);
        s.devices[0].mig_devices = ["MIG-0", "MIG-1"]
            .map(|u| gpu_model::MigSample {
                uuid: u.into(),
                ..Default::default()
            })
            .into();
        let snap = first_join(&st, &s, false);
        let a = find(&snap, Some(A));
        let uuids: Vec<_> = a
            .gpus
            .iter()
            .map(|g| (&*g.uuid, &*g.gpu_uuid, g.memory_used_bytes))
            .collect();
        assert_eq!(uuids, vec![("GPU-1", "GPU-1", 20), ("MIG-1", "GPU-1", 10)]);
        assert_eq!(a.gpus[1].sm_util, None);
    }

    #[test]
    fn names_allocations_and_allocated_but_idle_containers() {
        let st = state();
        let mut md = Metadata::default();
        md.learn(
            A.into(),
            ContainerNames {
                pod_name: Some("trainer-0".into()),
                namespace: Some("ml".into()),
                container_name: Some("main".into()),
                pod_uid: None,
                runtime: None,
                workload: None,
            },
        );
        md.set_allocations(vec![
            Allocation {
                namespace: "ml".into(),
                pod_name: "trainer-0".into(),
                container_name: "main".into(),
                resource_name: "nvidia.com/gpu".into(),
                device_ids: vec!["GPU-1::2".into(), "1".into()],
                claim: None,
            },
            Allocation {
                namespace: "ml".into(),
                pod_name: "idle-0".into(),
                container_name: "sleepy".into(),
                resource_name: "nvidia.com/gpu".into(),
                device_ids: vec!["GPU-9".into()],
                claim: None,
            },
        ]);
        md.learn(
            "c".repeat(64).into(),
            ContainerNames {
                pod_name: Some("idle-0".into()),
                namespace: Some("ml".into()),
                container_name: Some("sleepy".into()),
                pod_uid: Some("u-idle".into()),
                runtime: None,
                workload: None,
            },
        );
        let mut sample = sample(1000, vec![proc(100, 10, 5)]);
        sample.devices.push(DeviceSample {
            index: 1,
            uuid: "GPU-2".into(),
            status: DeviceStatus::Ok,
            ..Default::default()
        });
        let (snap, _) = join(
            &st,
            &md,
            &sample,
            &SourceStatus::Ok,
            &Counters::default(),
            Duration::from_secs(3),
            false,
        );
        let c = snap
            .containers
            .iter()
            .find(|c| c.container_id.as_deref() == Some(A))
            .unwrap();
        assert_eq!(c.pod_name.as_deref(), Some("trainer-0"));
        assert_eq!(c.namespace.as_deref(), Some("ml"));
        assert_eq!(
            c.allocated_gpus.to_vec(),
            vec!["GPU-1".into(), "GPU-2".into()] as Vec<Name>
        );
        // Uses GPU-1, holds GPU-2 without using it.
        assert_eq!(c.idle_allocations(), vec!["GPU-2"]);
        let idle = snap
            .containers
            .iter()
            .find(|c| c.pod_name.as_deref() == Some("idle-0"))
            .unwrap();
        assert_eq!(idle.container_id.as_deref(), Some("c".repeat(64).as_str()));
        assert_eq!(
            idle.pod_uid.as_deref(),
            Some("u-idle"),
            "the runtime's names"
        );
        assert!(idle.gpus.is_empty());
        assert_eq!(idle.idle_allocations(), vec!["GPU-9"]);
    }

    #[test]
    fn names_and_allocations_kept_between_cycles_follow_the_metadata_and_the_devices() {
        let st = state();
        let names = |pod: &str| ContainerNames {
            pod_name: Some(pod.into()),
            namespace: Some("ml".into()),
            container_name: Some("main".into()),
            ..Default::default()
        };
        // Allocated the GPU of NVML index 1, by index.
        let alloc = |pod: &str, device: &str| Allocation {
            namespace: "ml".into(),
            pod_name: pod.into(),
            container_name: "main".into(),
            resource_name: "nvidia.com/gpu".into(),
            device_ids: vec![device.into()],
            claim: None,
        };
        let mut md = Metadata::default();
        md.learn(A.into(), names("p"));
        md.set_allocations(vec![alloc("p", "1")]);
        let at = |t: u64, second: &str| {
            let mut s = sample(t, vec![proc(100, 10, 5)]);
            s.devices.push(DeviceSample {
                index: 1,
                uuid: second.into(),
                status: DeviceStatus::Ok,
                ..Default::default()
            });
            s
        };
        let mut counters = Counters::default();
        let mut run = |md: &Metadata, s: &GpuSample| {
            let (snap, next) = join(
                &st,
                md,
                s,
                &SourceStatus::Ok,
                &counters,
                Duration::from_secs(3),
                false,
            );
            counters = next;
            let c = find(&snap, Some(A));
            (
                c.pod_name.as_deref().map(String::from),
                c.allocated_gpus.to_vec(),
                !c.gpus.is_empty(),
            )
        };
        let gpu = |u: &str| vec![Name::from(u)];
        assert_eq!(
            run(&md, &at(1000, "GPU-2")),
            (Some("p".into()), gpu("GPU-2"), true)
        );
        assert_eq!(
            run(&md, &at(2000, "GPU-2")),
            (Some("p".into()), gpu("GPU-2"), true),
            "kept"
        );
        // Index 1 is another GPU now (a GPU replaced): the allocation follows it.
        assert_eq!(
            run(&md, &at(3000, "GPU-3")),
            (Some("p".into()), gpu("GPU-3"), true)
        );
        // A new listing of allocations, then new names.
        md.set_allocations(vec![alloc("p", "GPU-1")]);
        assert_eq!(
            run(&md, &at(4000, "GPU-3")),
            (Some("p".into()), gpu("GPU-1"), true)
        );
        md.learn(A.into(), names("q"));
        assert_eq!(
            run(&md, &at(5000, "GPU-3")),
            (Some("q".into()), vec![], true)
        );
        md.set_allocations(vec![alloc("q", "1")]);
        assert_eq!(
            run(&md, &at(6000, "GPU-3")),
            (Some("q".into()), gpu("GPU-3"), true)
        );
        // A's process ends: still allocated, A is an idle entry (found anew, as an owner
        // went), kept while nothing changes, then busy again.
        let idle = |t| {
            let mut s = at(t, "GPU-3");
            s.devices[0].processes.clear();
            s
        };
        let q3 = |busy| (Some("q".into()), gpu("GPU-3"), busy);
        assert_eq!(run(&md, &idle(7000)), q3(false));
        assert_eq!(run(&md, &idle(8000)), q3(false));
        assert_eq!(run(&md, &at(9000, "GPU-3")), q3(true));
        // Idle again, then its allocation gone: no entry.
        assert_eq!(run(&md, &idle(10000)), q3(false));
        md.set_allocations(vec![]);
        let (snap, _) = join(
            &st,
            &md,
            &idle(11000),
            &SourceStatus::Ok,
            &counters,
            Duration::from_secs(3),
            false,
        );
        assert!(snap
            .containers
            .iter()
            .all(|c| c.container_id.as_deref() != Some(A)));
    }

    /// A resolver of the join's own: no kernel, no cgroup filesystem.
    #[derive(Default)]
    struct Fake {
        procs: HashMap<u32, (String, Option<ContainerRef>)>,
        looked_up: Vec<u32>,
    }

    impl Resolver for Fake {
        fn place(&self, pid: u32) -> Option<Placement<'_>> {
            let (comm, c) = self.procs.get(&pid)?;
            Some(Placement {
                comm,
                live: true,
                container: c.as_ref(),
                cgroup_path: None,
            })
        }
    }

    impl Lookup for Fake {
        fn missing(&self, pids: impl Iterator<Item = u32>) -> Vec<u32> {
            pids.filter(|pid| !self.procs.contains_key(pid)).collect()
        }

        /// Only even PIDs can be found "in /proc".
        fn look_up(&mut self, pid: u32) -> bool {
            self.looked_up.push(pid);
            let found = pid.is_multiple_of(2);
            if found {
                self.procs.insert(pid, ("late".into(), None));
            }
            found
        }
    }

    #[test]
    fn joins_against_any_resolver() {
        let c = ContainerRef {
            container_id: Some(A.into()),
            pod_uid: Some(UID.into()),
            qos: None,
            runtime: None,
        };
        let mut fake = Fake::default();
        fake.procs.insert(7, ("python".into(), Some(c)));
        let mut j = Joiner::default();
        let s = sample(1000, vec![proc(7, 10, 5), proc(9, 1, 0)]);
        let snap = j.join(
            &fake,
            &Metadata::default(),
            &s,
            &SourceStatus::Ok,
            Duration::from_secs(3),
            true,
        );
        assert_eq!(find(&snap, Some(A)).gpus[0].memory_used_bytes, 10);
        assert_eq!(find(&snap, None).gpus[0].pids, vec![9]);
        assert_eq!(snap.processes[0].comm.as_deref(), Some("python"));
        assert_eq!(snap.processes[1].comm, None);
    }

    #[test]
    fn a_join_that_refills_the_lists_of_the_snapshot_before_makes_the_same_snapshots() {
        let st = state();
        let md = Metadata::default();
        // Containers come and go, gain and lose processes and devices between cycles.
        let cycles: Vec<GpuSample> = [
            vec![
                vec![proc(100, 10, 5), proc(101, 20, 5)],
                vec![proc(200, 1, 1)],
            ],
            vec![
                vec![proc(100, 10, 5)],
                vec![proc(101, 5, 1), proc(300, 7, 0)],
            ],
            vec![vec![], vec![proc(200, 1, 1)]],
            vec![
                vec![
                    proc(100, 1, 9),
                    proc(101, 2, 9),
                    proc(200, 3, 9),
                    proc(300, 4, 9),
                ],
                vec![proc(100, 1, 1)],
            ],
            vec![vec![proc(200, 3, 3)], vec![]],
        ]
        .into_iter()
        .enumerate()
        .map(|(k, per_gpu)| {
            let mut s = sample(1000 * (k as u64 + 1), vec![]);
            s.devices = per_gpu
                .into_iter()
                .enumerate()
                .map(|(i, processes)| DeviceSample {
                    uuid: format!("GPU-{i}"),
                    index: i as u32,
                    status: DeviceStatus::Ok,
                    processes,
                    ..Default::default()
                })
                .collect();
            s
        })
        .collect();
        let (mut fresh, mut refilled) = (Joiner::default(), Joiner::default());
        let ok = SourceStatus::Ok;
        let gap = Duration::from_secs(3);
        let mut used = 0;
        for s in &cycles {
            let want = fresh.join(&st, &md, s, &ok, gap, true);
            let before = refilled.spare.kept();
            let got = refilled.join(&st, &md, s, &ok, gap, true);
            used += before - refilled.spare.kept();
            let json = |s: &Snapshot| serde_json::to_value(s).unwrap();
            assert_eq!(json(&got), json(&want), "at {}", s.taken_at_ms);
            refilled.recycle(got);
        }
        // The later joins filled lists of the snapshots before.
        assert!(used >= 10, "{used}");
    }

    #[test]
    fn entries_filled_again_in_place_keep_their_names_and_lose_what_is_no_longer_so() {
        let st = state();
        let named = allocated_to_a("nvidia.com/gpu", "GPU-1", None);
        let unnamed = Metadata::default();
        // A and B trade places with the host entry, and are named, then not, then again.
        let cycles = [
            (&named, vec![proc(100, 1, 1), proc(200, 2, 2)]),
            (&unnamed, vec![proc(200, 2, 2), proc(300, 3, 3)]),
            (&named, vec![proc(300, 3, 3), proc(100, 1, 1)]),
            (
                &unnamed,
                vec![proc(100, 1, 1), proc(200, 2, 2), proc(300, 3, 3)],
            ),
            (
                &named,
                vec![proc(100, 1, 1), proc(200, 2, 2), proc(300, 3, 3)],
            ),
            (
                &named,
                vec![proc(100, 1, 1), proc(200, 2, 2), proc(300, 3, 3)],
            ),
            (&unnamed, vec![proc(200, 2, 2)]),
        ];
        let (mut fresh, mut refilled) = (Joiner::default(), Joiner::default());
        let (ok, gap) = (SourceStatus::Ok, Duration::from_secs(3));
        let mut before_last: Option<Snapshot> = None;
        let mut recycled = None;
        for (k, (md, procs)) in cycles.into_iter().enumerate() {
            let s = sample(1000 * (k as u64 + 1), procs);
            let want = fresh.join(&st, md, &s, &ok, gap, false);
            let got = refilled.join(&st, md, &s, &ok, gap, false);
            let json = |s: &Snapshot| serde_json::to_value(s).unwrap();
            assert_eq!(json(&got), json(&want), "cycle {k}");
            // Filled where the snapshot before last was (room enough: 4 entries at most).
            if let Some(at) = recycled.take() {
                assert_eq!(got.containers.as_ptr(), at, "cycle {k}");
            }
            // Joins alternate between two snapshots' entries, as the pipeline's do.
            if let Some(old) = before_last.replace(got) {
                recycled = Some(old.containers.as_ptr());
                refilled.recycle(old);
            }
        }
    }

    #[test]
    fn a_pods_owner_follows_its_names_is_shared_and_never_outlives_them() {
        use gpu_model::{Workload, WorkloadKind};
        use std::sync::Arc;
        let st = state();
        let owner = |kind, name: &str| {
            Some(Arc::new(Workload {
                kind,
                name: name.into(),
                replicaset: None,
                job: None,
            }))
        };
        let idle_id: Name = "c".repeat(64).into();
        // A named with its pod's owner, and an allocated, idle container with another.
        let named = |w: &Option<Arc<Workload>>| {
            let mut md = allocated_to_a("nvidia.com/gpu", "GPU-1", None);
            let mut a = md.names_of(A).unwrap().clone();
            a.workload = w.clone();
            md.learn(A.into(), a);
            let mut allocs = md.allocations().to_vec();
            allocs.push(Allocation {
                namespace: "ns".into(),
                pod_name: "db-0".into(),
                container_name: "db".into(),
                resource_name: "nvidia.com/gpu".into(),
                device_ids: vec!["GPU-9".into()],
                claim: None,
            });
            md.set_allocations(allocs);
            let idle = ContainerNames {
                pod_name: Some("db-0".into()),
                namespace: Some("ns".into()),
                container_name: Some("db".into()),
                workload: owner(WorkloadKind::StatefulSet, "db"),
                ..Default::default()
            };
            md.learn(idle_id.clone(), idle);
            md
        };
        let web = owner(WorkloadKind::Deployment, "web");
        let batch = owner(WorkloadKind::Job, "batch");
        let (md_web, md_batch, md_none) = (named(&web), named(&batch), named(&None));
        let unnamed = Metadata::default();
        let cycles = [
            (&md_web, "web"),
            (&md_web, "web"),
            (&md_batch, "batch"),
            (&md_none, ""),
            (&unnamed, ""),
            (&md_web, "web"),
        ];
        let (mut fresh, mut refilled) = (Joiner::default(), Joiner::default());
        let (ok, gap) = (SourceStatus::Ok, Duration::from_secs(3));
        let mut before_last: Option<Snapshot> = None;
        for (k, (md, want_a)) in cycles.into_iter().enumerate() {
            // A on GPU-1 every cycle, B (unnamed) only every other one: entries move.
            let mut procs = vec![proc(100, 1, 1)];
            if k % 2 == 0 {
                procs.insert(0, proc(200, 2, 2));
            }
            let s = sample(1000 * (k as u64 + 1), procs);
            let want = fresh.join(&st, md, &s, &ok, gap, false);
            let got = refilled.join(&st, md, &s, &ok, gap, false);
            let json = |s: &Snapshot| serde_json::to_value(s).unwrap();
            assert_eq!(json(&got), json(&want), "cycle {k}");
            let a = find(&got, Some(A));
            let a_owner = a.workload.as_ref().map(|w| w.name.to_string());
            assert_eq!(a_owner.unwrap_or_default(), want_a, "cycle {k}");
            // The metadata's own Arc: a pointer cloned, no names copied.
            if let Some(w) = md.names_of(A).and_then(|n| n.workload.as_ref()) {
                assert!(Arc::ptr_eq(w, a.workload.as_ref().unwrap()), "cycle {k}");
            }
            let b = got
                .containers
                .iter()
                .find(|c| c.container_id.as_deref() == Some(B));
            assert!(b.is_none_or(|b| b.workload.is_none()), "cycle {k}");
            let idle = got
                .containers
                .iter()
                .find(|c| c.pod_name.as_deref() == Some("db-0"));
            match md.names_len() {
                0 => assert!(idle.is_none_or(|c| c.workload.is_none()), "cycle {k}"),
                _ => {
                    let w = idle
                        .and_then(|c| c.workload.as_ref())
                        .expect("the idle entry's owner");
                    assert_eq!((w.kind, &*w.name), (WorkloadKind::StatefulSet, "db"));
                }
            }
            // Joins alternate between two snapshots' entries, as the pipeline's do.
            if let Some(old) = before_last.replace(got) {
                refilled.recycle(old);
            }
        }
    }

    #[test]
    fn a_pid_nobody_can_place_is_not_looked_up_again_at_once() {
        let mut fake = Fake::default();
        let mut j = Joiner::default();
        let s = sample(1000, vec![proc(2, 1, 0), proc(3, 1, 0)]);
        let cov = j.look_up_missing(&s, &mut fake);
        assert_eq!((cov.gpu_processes, cov.unresolved), (2, 1));
        assert_eq!(fake.looked_up, vec![2, 3]);
        // Next cycle: 2 is known now, 3 is remembered as unplaceable and not asked about.
        let cov = j.look_up_missing(&s, &mut fake);
        assert_eq!((cov.gpu_processes, cov.unresolved), (2, 1));
        assert_eq!(fake.looked_up, vec![2, 3]);
    }

    #[test]
    fn a_pid_on_two_gpus_is_looked_up_once() {
        let mut fake = Fake::default();
        let mut j = Joiner::default();
        let mut s = sample(1000, vec![proc(4, 1, 0), proc(5, 1, 0)]);
        let mut second = s.devices[0].clone();
        second.uuid = "GPU-2".into();
        s.devices.push(second);
        let cov = j.look_up_missing(&s, &mut fake);
        // 4 is placed at its first GPU; 5, unplaceable, counts once per GPU.
        assert_eq!(fake.looked_up, vec![4, 5]);
        assert_eq!((cov.gpu_processes, cov.unresolved), (4, 2));
    }

    /// Container A named ns/p/a and allocated `device` of `resource` (through DRA claim
    /// ns/`claim`, where one is given).
    pub(crate) fn allocated_to_a(resource: &str, device: &str, claim: Option<&str>) -> Metadata {
        let mut md = Metadata::default();
        md.learn(
            A.into(),
            ContainerNames {
                pod_name: Some("p".into()),
                namespace: Some("ns".into()),
                container_name: Some("a".into()),
                ..Default::default()
            },
        );
        md.set_allocations(vec![Allocation {
            namespace: "ns".into(),
            pod_name: "p".into(),
            container_name: "a".into(),
            resource_name: resource.into(),
            device_ids: vec![device.into()],
            claim: claim.map(|name| {
                std::sync::Arc::new(gpu_model::DraDevice {
                    claim_namespace: "ns".into(),
                    claim_name: name.into(),
                    driver: resource.into(),
                    pool: "node-1".into(),
                    device: device.into(),
                })
            }),
        }]);
        md
    }
}
