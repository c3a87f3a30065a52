//! The join: GPU samples (by host PID) x the process state -> an immutable snapshot per
//! container and GPU. `join` is pure: the same inputs give the same snapshot, and the
//! cumulative counters go in and come out as values. `Joiner` owns what carries over from
//! one cycle to the next: those counters, and the GPU PIDs nobody could place.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use rustc_hash::FxHashSet;

pub use gpu_model::{ContainerGpu, ContainerUsage, ProcessUsage, Snapshot};
use gpu_model::{Name, SourceStatus, UsageRecord};

use super::{
    account::{self, Inputs},
    counters::Counters,
    group::{fill_entry, group_processes, Group, AHEAD},
    ledger::{device, Accumulated, Ledger, Ledgers, Slot},
    naming,
    owner::{DeviceNames, Owner},
    sharing::Sharing,
    stretch, GpuSample,
};
use crate::{
    metadata::Metadata,
    process::{Lookup, Resolver},
};

/// Counters of an (owner, device) not seen for this long are forgotten.
const FORGET_AFTER_MS: u64 = 10 * 60 * 1000;

/// What accumulating group `i + AHEAD` reads first: its owner's ledgers (a list of their
/// own, cold since the cycle before; the first miss of each group was 2 % of the large
/// node's agent) and the recycled entry it fills.
fn prefetch_group(ledgers: &Ledgers, slots: &[Slot], containers: &[ContainerUsage], i: usize) {
    use gpu_model::prefetch;
    if let Some(&s) = slots.get(i + AHEAD) {
        let devices = ledgers.read(s);
        if let Some(d) = devices.first() {
            let p: *const u8 = (d as *const (Name, Ledger)).cast();
            // About 300 bytes: the first three lines hold what this pass and the forgetting
            // after it read (the name, the counters, when it was last used or charged,
            // whether a session is open).
            for line in 0..3 {
                prefetch(p.wrapping_add(64 * line));
            }
        }
    }
    if let Some(c) = containers.get(i + AHEAD) {
        prefetch(c);
    }
}

/// One entry per owner, its cumulative counters advanced by `dt` seconds in place; the
/// counters of owners idle this cycle are kept (they must not reset) until forgotten. The
/// owners and their slots come back beside their entries, for the account pass.
fn accumulate(
    groups: Vec<Group<'_>>,
    counters: &mut Counters,
    dt: f64,
    taken_at_ms: u64,
) -> (Vec<ContainerUsage>, Vec<Option<Owner>>, Vec<Slot>) {
    // The entries of the snapshot before last, names in place: each is filled again.
    let mut containers = counters.spare.containers(groups.len());
    let mut owners = Vec::with_capacity(groups.len());
    let slots: Vec<Slot> = groups.iter().map(|g| g.slot).collect();
    for (i, g) in groups.into_iter().enumerate() {
        prefetch_group(&counters.ledgers, &slots, &containers, i);
        let mut gpus = g.gpus;
        gpus.sort_unstable_by(|a, b| a.uuid.cmp(&b.uuid));
        let devices = counters.ledgers.at(g.slot);
        for cg in &mut gpus {
            let l = device(devices, &cg.uuid);
            // Used now: neither its counters nor its ledger are forgotten this cycle.
            l.last_used_ms = taken_at_ms;
            let acc = l.acc.get_or_insert_with(Accumulated::default);
            acc.before = (acc.gpu_seconds.unwrap_or(0.0), acc.byte_seconds);
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
        fill_entry(&mut containers[i], meta, gpus);
    }
    counters.last_sample_ms = taken_at_ms;
    (containers, owners, slots)
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

/// How the join runs: `max_gap` caps the time credited to the counters when samples were
/// missed (NVML unavailable, the agent paused); `process_detail` adds per-process rows.
#[derive(Debug, Clone, Copy)]
pub struct JoinOptions {
    pub max_gap: Duration,
    pub process_detail: bool,
}

/// Joins one GPU sample with the process state.
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
    let (snap, counters, _) = join_with(
        procs,
        metadata,
        sample,
        nvml_status,
        prev.clone(),
        opts,
        &Inputs::default(),
    );
    (snap, counters)
}

/// The join, with what the account pass needs (HAMi limits, accounting stats), and the
/// usage records of the stretches of use that ended. Takes the previous counters by value
/// and updates them in place.
pub fn join_with(
    procs: &impl Resolver,
    metadata: &Metadata,
    sample: &GpuSample,
    nvml_status: &SourceStatus,
    mut counters: Counters,
    opts: JoinOptions,
    inputs: &Inputs,
) -> (Snapshot, Counters, Vec<UsageRecord>) {
    let last = counters.last_sample_ms;
    let dt = if last == 0 || sample.taken_at_ms <= last {
        0.0
    } else {
        ((sample.taken_at_ms - last) as f64 / 1000.0).min(opts.max_gap.as_secs_f64())
    };
    let names = DeviceNames::new(sample, &counters.uuids);
    let (groups, processes, mps_servers) =
        group_processes(procs, sample, &names, opts.process_detail, &mut counters);
    let (mut containers, mut owners, slots) =
        accumulate(groups, &mut counters, dt, sample.taken_at_ms);
    counters.uuids = names.set();
    // Counters unused for a while are forgotten; their ledger goes with them, unless
    // charged lately (an allocated, idle GPU's energy) or in the middle of a session.
    let now = sample.taken_at_ms;
    counters.ledgers.retain(|l| {
        // An open session's record still needs them (no cycle ran for that long).
        if now.saturating_sub(l.last_used_ms) >= FORGET_AFTER_MS && l.session.is_none() {
            l.acc = None;
        }
        l.session.is_some()
            || now.saturating_sub(l.last_used_ms.max(l.last_charged_ms)) < FORGET_AFTER_MS
    });
    counters
        .naming
        .name_all(&mut containers, &owners, &slots, metadata, sample, &names);
    let idle = counters.naming.idle(|| {
        let mut idle = allocated_but_idle(metadata, &containers);
        for c in &mut idle {
            naming::name_and_allocate(c, metadata, &sample.devices, &names);
        }
        idle
    });
    owners.extend(idle.iter().map(account::owner_key));
    containers.extend(idle);
    let pass = account::Pass {
        sample,
        names: &names,
        metadata,
        inputs,
    };
    let records = account::account(&mut containers, owners, slots, &mut counters, &pass);
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
            d.sharing.idle_energy_joules = counters.idle_energy.get(&d.uuid).copied();
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
    (snap, counters, records)
}

/// How long a GPU PID that nobody could place is left alone before /proc is asked again.
const UNRESOLVED_RETRY: Duration = Duration::from_secs(30);

/// The join's owner across cycles: the cumulative counters, and the GPU PIDs that neither
/// the cache nor /proc could place (not asked about again for a while).
#[derive(Debug, Default)]
pub struct Joiner {
    counters: Counters,
    unresolved: HashMap<u32, Instant>,
    xids: super::xid_charge::XidCharges,
    /// HAMi limits, exits for NVML accounting, and where usage records go.
    pub sharing: Sharing,
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

    /// The pure join, with this owner's counters carried over; then the exits it noticed
    /// go to the NVML thread and the records of ended stretches to the usage sink.
    pub fn join(
        &mut self,
        procs: &impl Resolver,
        metadata: &Metadata,
        sample: &GpuSample,
        nvml_status: &SourceStatus,
        max_gap: Duration,
        process_detail: bool,
    ) -> Snapshot {
        let peak_window_ms = self.sharing.peak_window_ms;
        let max_record_ms = self.sharing.max_record_ms;
        let (hami, accounted) = self.sharing.before(sample);
        let inputs = Inputs {
            hami,
            accounted: &accounted,
            peak_window_ms,
            max_record_ms,
        };
        let opts = JoinOptions {
            max_gap,
            process_detail,
        };
        let (mut snap, counters, records) = join_with(
            procs,
            metadata,
            sample,
            nvml_status,
            std::mem::take(&mut self.counters),
            opts,
            &inputs,
        );
        self.counters = counters;
        snap.container_xids = self.xids.charge(procs, metadata, sample);
        self.sharing.after(sample, procs, metadata);
        self.sharing.emit(records);
        snap
    }

    /// A snapshot nobody holds any more: its lists are filled again by the next join.
    pub fn recycle(&mut self, snap: Snapshot) {
        self.counters.spare.recycle(snap);
    }
}

impl Drop for Joiner {
    /// Stretches still open when the agent stops: a record each (`agent_stopped`), so that
    /// a restart loses no usage; the rest comes in a later record.
    fn drop(&mut self) {
        let open: Vec<(Owner, Name)> = self
            .counters
            .ledgers
            .iter()
            .filter(|(_, _, l)| l.session.is_some())
            .map(|(o, u, _)| (o.clone(), u.clone()))
            .collect();
        let records = open
            .iter()
            .filter_map(|k| stretch::close(&mut self.counters, k, "agent_stopped"))
            .collect();
        self.sharing.emit(records);
    }
}

#[cfg(test)]
mod tests {
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
            let before = refilled.counters.spare.kept();
            let got = refilled.join(&st, &md, s, &ok, gap, true);
            used += before - refilled.counters.spare.kept();
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
        let named = super::sharing_tests::allocated_to_a("nvidia.com/gpu", "GPU-1", None);
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
            let mut md = super::sharing_tests::allocated_to_a("nvidia.com/gpu", "GPU-1", None);
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
}

#[cfg(test)]
mod sharing_tests {
    use super::*;
    use crate::gpu::{account::Accounted, ledger::RecordNames};
    use crate::gpu::{DeviceSample, ProcessSample};
    use crate::metadata::{Allocation, ContainerNames};
    use crate::process::{cgroup::ContainerRef, Placement};
    use gpu_model::{AccountingSample, DeviceStatus, LimitSource};

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    /// pid -> (comm, container id): 1x in A, 2x in B.
    struct Procs;

    impl Resolver for Procs {
        fn place(&self, pid: u32) -> Option<Placement<'_>> {
            static REFS: std::sync::OnceLock<[ContainerRef; 2]> = std::sync::OnceLock::new();
            let refs = REFS.get_or_init(|| {
                [A, B].map(|id| ContainerRef {
                    container_id: Some(id.into()),
                    pod_uid: None,
                    qos: None,
                    runtime: None,
                })
            });
            let (comm, c) = match pid {
                100..=199 => ("python", &refs[0]),
                200..=299 => ("python", &refs[1]),
                900 => ("nvidia-cuda-mps", &refs[1]),
                _ => return None,
            };
            Some(Placement {
                comm,
                live: true,
                container: Some(c),
                cgroup_path: None,
            })
        }
    }

    fn p(pid: u32, mem: u64, sm: Option<u32>) -> ProcessSample {
        ProcessSample {
            pid,
            used_memory_bytes: mem,
            sm_util: sm,
            ..Default::default()
        }
    }

    fn sample(t: u64, energy_mj: u64, procs: Vec<ProcessSample>) -> GpuSample {
        GpuSample {
            taken_at_ms: t,
            driver_version: None,
            devices: vec![DeviceSample {
                uuid: "GPU-1".into(),
                status: DeviceStatus::Ok,
                memory_total_bytes: Some(1000),
                energy_mj: Some(energy_mj),
                processes: procs,
                ..Default::default()
            }],
        }
    }

    const OPTS: JoinOptions = JoinOptions {
        max_gap: Duration::from_secs(10),
        process_detail: false,
    };

    fn run(
        md: &Metadata,
        samples: &[GpuSample],
        inputs: &Inputs,
    ) -> (Snapshot, Counters, Vec<UsageRecord>) {
        let mut c = Counters::default();
        let mut all = vec![];
        let mut snap = Snapshot::default();
        for s in samples {
            let (sn, next, records) = join_with(&Procs, md, s, &SourceStatus::Ok, c, OPTS, inputs);
            (snap, c) = (sn, next);
            all.extend(records);
        }
        (snap, c, all)
    }

    fn energy(s: &Snapshot, id: &str) -> f64 {
        let c = s
            .containers
            .iter()
            .find(|c| c.container_id.as_deref() == Some(id))
            .unwrap();
        c.accounts.iter().map(|a| a.energy_joules).sum()
    }

    #[test]
    fn energy_is_split_by_sm_share_and_the_idle_rest_kept_apart() {
        let procs = || vec![p(100, 10, Some(30)), p(200, 10, Some(20))];
        let samples = [
            sample(1000, 1_000_000, procs()),
            sample(2000, 1_100_000, procs()),
        ];
        let (snap, _, _) = run(&Metadata::default(), &samples, &Inputs::default());
        assert!((energy(&snap, A) - 30.0).abs() < 1e-9);
        assert!((energy(&snap, B) - 20.0).abs() < 1e-9);
        let idle = snap.devices[0].sharing.idle_energy_joules.unwrap();
        assert!((idle - 50.0).abs() < 1e-9, "{idle}");
    }

    #[test]
    fn a_stalled_gpu_is_credited_nothing_for_the_stall() {
        let procs = || vec![p(100, 10, Some(30)), p(200, 10, Some(20))];
        let mut stalled = sample(3000, 0, vec![]);
        stalled.devices[0].energy_mj = None;
        stalled.devices[0].status = DeviceStatus::Stalled {
            call: "power".into(),
            secs: 5,
        };
        let samples = [
            sample(1000, 1_000_000, procs()),
            sample(2000, 1_100_000, procs()),
            stalled,
            // 900 J drawn while it did not answer, then 100 J in the cycle after.
            sample(4000, 2_000_000, procs()),
            sample(5000, 2_100_000, procs()),
        ];
        let (snap, _, records) = run(&Metadata::default(), &samples, &Inputs::default());
        // 30 + 30 J and 20 + 20 J: the first increase after the stall starts the count.
        assert!(
            (energy(&snap, A) - 60.0).abs() < 1e-9,
            "{}",
            energy(&snap, A)
        );
        assert!(
            (energy(&snap, B) - 40.0).abs() < 1e-9,
            "{}",
            energy(&snap, B)
        );
        let gpu = |c: &ContainerUsage| c.gpus[0].gpu_time_seconds.unwrap();
        let a = snap
            .containers
            .iter()
            .find(|c| c.container_id.as_deref() == Some(A));
        // 0.3 s a cycle for the cycles it was read, none for the stall.
        assert!((gpu(a.unwrap()) - 0.9).abs() < 1e-9, "{:?}", a);
        // Its stretch of use ended at its last good sample; a new one began after.
        let ended: Vec<_> = records
            .iter()
            .filter(|r| r.container_id.as_deref() == Some(A))
            .collect();
        assert_eq!(ended.len(), 1, "{records:?}");
        assert_eq!(ended[0].end_ms, 2000, "{:?}", ended[0]);
    }

    /// A GPU allocated to A, which runs nothing there, stalls for a cycle: the stretch of
    /// the allocation ends at the last good sample (nothing says how it was used meanwhile),
    /// and a new one is open once the GPU answers.
    #[test]
    fn an_allocated_gpu_that_stalls_ends_its_stretch_at_the_last_good_sample() {
        let md = allocated_to_a("nvidia.com/gpu", "GPU-1", None);
        let mut stalled = sample(3000, 0, vec![]);
        stalled.devices[0].status = DeviceStatus::Stalled {
            call: "power".into(),
            secs: 5,
        };
        let samples = [
            sample(1000, 1_000_000, vec![]),
            sample(2000, 1_100_000, vec![]),
            stalled,
            sample(4000, 2_000_000, vec![]),
        ];
        let (snap, _, records) = run(&md, &samples, &Inputs::default());
        let ended: Vec<_> = records
            .iter()
            .filter(|r| r.container_id.as_deref() == Some(A))
            .collect();
        assert_eq!(ended.len(), 1, "{records:?}");
        assert_eq!((ended[0].start_ms, ended[0].end_ms), (1000, 2000));
        let a = snap
            .containers
            .iter()
            .find(|c| c.container_id.as_deref() == Some(A));
        assert_eq!(a.unwrap().accounts[0].gpus_held, Some(1.0), "open again");
    }

    #[test]
    fn an_energy_read_after_held_cycles_is_split_by_their_mean_shares() {
        // Energy read at 1 s and 4 s, held at 2 s and 3 s (nvml.slow_interval_ms): A alone
        // at 90% in the cycles at 2 and 3 s, then B alone at 60% at 4 s, when A has gone.
        let samples = [
            sample(1000, 1_000_000, vec![p(100, 10, Some(90))]),
            sample(2000, 1_000_000, vec![p(100, 10, Some(90))]),
            sample(3000, 1_000_000, vec![p(100, 10, Some(90))]),
            sample(4000, 1_300_000, vec![p(200, 10, Some(60))]),
        ];
        let (snap, counters, _) = run(&Metadata::default(), &samples, &Inputs::default());
        // 300 J over three cycles: 100 J each, A 90 + 90, B 60, the idle rest 10 + 10 + 40.
        let a = counters
            .ledgers
            .iter()
            .find(|(o, _, _)| **o == Owner::Container(A.into()))
            .map(|(_, _, l)| l.energy_j)
            .unwrap();
        assert!((a - 180.0).abs() < 1e-9, "{a}");
        assert!((energy(&snap, B) - 60.0).abs() < 1e-9);
        let idle = snap.devices[0].sharing.idle_energy_joules.unwrap();
        assert!((idle - 60.0).abs() < 1e-9, "{idle}");
        assert!(counters.energy_shares.is_empty(), "split, then forgotten");
    }

    /// Container A named ns/p/a and allocated `device` of `resource` (through `claim`).
    pub(super) fn allocated_to_a(resource: &str, device: &str, claim: Option<&str>) -> Metadata {
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
            claim: claim.map(String::from),
        }]);
        md
    }

    /// Ten minutes without a process on the GPU: B, charged nothing since, loses its
    /// counters and its ledger; A, which holds the GPU's allocation all along, keeps them
    /// (its stretch of the allocation is open) and is charged the idle GPU's energy.
    #[test]
    fn unused_counters_are_forgotten_and_an_allocated_owners_stay() {
        let md = allocated_to_a("nvidia.com/gpu", "GPU-1", None);
        let both = || vec![p(100, 10, Some(50)), p(200, 10, Some(50))];
        let gone = 2000 + FORGET_AFTER_MS;
        let samples = [
            sample(1000, 1_000_000, both()),
            sample(2000, 1_100_000, both()),
            sample(3000, 1_200_000, vec![]),
            sample(gone, 1_300_000, vec![]),
            sample(gone + 1000, 1_400_000, both()),
        ];
        let a = Owner::Container(A.into());
        let b = Owner::Container(B.into());
        let gpu: Name = "GPU-1".into();
        let (_, c, _) = run(&md, &samples[..3], &Inputs::default());
        assert!(c.ledgers.get(&a, &gpu).unwrap().acc.is_some());
        assert!(c.ledgers.get(&b, &gpu).unwrap().acc.is_some());
        let (_, c, _) = run(&md, &samples[..4], &Inputs::default());
        let la = c.ledgers.get(&a, &gpu).expect("allocated: kept");
        assert!(la.acc.is_some() && la.session.is_some());
        assert_eq!(c.ledgers.get(&b, &gpu), None);
        let (snap, _, _) = run(&md, &samples, &Inputs::default());
        let g = &snap
            .containers
            .iter()
            .find(|c| c.container_id.as_deref() == Some(A));
        let g = &g.unwrap().gpus[0];
        assert_eq!(g.counters_since_ms, 1000, "carried on");
        assert!(
            (g.gpu_time_seconds.unwrap() - 1.0).abs() < 1e-9,
            "{:?}",
            g.gpu_time_seconds
        );
        // 100 J a cycle: at 2 s half A's, at 3 s and at `gone` all A's (idle, and allocated
        // to A), at the end half A's.
        assert!(
            (energy(&snap, A) - 300.0).abs() < 1e-9,
            "{}",
            energy(&snap, A)
        );
    }

    #[test]
    fn the_idle_rest_goes_to_the_allocated_container_and_memory_share_without_util() {
        let md = allocated_to_a("nvidia.com/gpu", "GPU-1", None);
        // No utilization known (MIG-like): memory shares of the GPU's 1000 bytes.
        let procs = || vec![p(100, 100, None), p(200, 300, None)];
        let samples = [
            sample(1000, 1_000_000, procs()),
            sample(2000, 1_100_000, procs()),
        ];
        let (snap, _, _) = run(&md, &samples, &Inputs::default());
        assert!((energy(&snap, A) - (10.0 + 60.0)).abs() < 1e-9);
        assert!((energy(&snap, B) - 30.0).abs() < 1e-9);
        assert_eq!(snap.devices[0].sharing.idle_energy_joules, Some(0.0));
    }

    #[test]
    fn a_stretch_of_use_ends_in_one_record() {
        let samples = [
            sample(1000, 0, vec![p(100, 10, Some(50)), p(200, 5, Some(0))]),
            sample(2000, 0, vec![p(100, 30, Some(50)), p(200, 5, Some(0))]),
            sample(3000, 0, vec![p(200, 5, Some(0))]),
            sample(4000, 0, vec![p(200, 5, Some(0))]),
        ];
        let (snap, mut counters, records) = run(&Metadata::default(), &samples, &Inputs::default());
        assert_eq!(records.len(), 1, "{records:?}");
        let r = &records[0];
        assert_eq!(r.container_id.as_deref(), Some(A));
        assert_eq!((r.start_ms, r.end_ms), (1000, 2000));
        let gpu_s = r.gpu_seconds.unwrap();
        assert!((gpu_s - 0.5).abs() < 1e-9, "{gpu_s}");
        assert!((r.memory_byte_seconds - 30.0).abs() < 1e-9);
        assert_eq!(r.memory_peak_bytes, 30);
        assert_eq!(r.reason, "exited");
        assert_eq!(snap.containers.len(), 1);
        // B is still running: its record comes when it stops (or the agent does).
        let key = (Owner::Container(B.into()), "GPU-1".into());
        let open = stretch::close(&mut counters, &key, "agent_stopped").unwrap();
        assert_eq!((open.start_ms, open.end_ms), (1000, 4000));
    }

    #[test]
    fn gpu_time_is_unknown_where_the_device_never_says_the_sm_utilization() {
        // A's process has no SM utilization (a MIG device cannot say it); B's is idle (0 %,
        // known). A's memory time is known all the same.
        let samples = [
            sample(1000, 0, vec![p(100, 10, None), p(200, 5, Some(0))]),
            sample(2000, 0, vec![p(100, 10, None), p(200, 5, Some(0))]),
            sample(3000, 0, vec![p(200, 5, Some(0))]),
        ];
        let run_to = |n: usize| run(&Metadata::default(), &samples[..n], &Inputs::default());
        let (snap, _, _) = run_to(2);
        let gpu = |id: &str| {
            let mut c = snap.containers.iter();
            let c = c.find(|c| c.container_id.as_deref() == Some(id));
            c.unwrap().gpus[0].clone()
        };
        let (a, b) = (gpu(A), gpu(B));
        assert_eq!(a.gpu_time_seconds, None, "{a:?}");
        assert!((a.memory_byte_seconds - 10.0).abs() < 1e-9, "{a:?}");
        assert_eq!(b.gpu_time_seconds, Some(0.0), "{b:?}");
        // A's stretch ends: its record does not say 0 GPU seconds either.
        let (_, _, records) = run_to(3);
        assert_eq!(records.len(), 1, "{records:?}");
        assert_eq!(records[0].container_id.as_deref(), Some(A));
        assert_eq!(records[0].gpu_seconds, None);
        assert!((records[0].memory_byte_seconds - 10.0).abs() < 1e-9);
    }

    #[test]
    fn accounting_stats_are_charged_and_a_job_no_sample_saw_gets_its_record() {
        let accounted = [Accounted {
            owner: Owner::Container(A.into()),
            names: RecordNames {
                container_id: Some(A.into()),
                ..Default::default()
            },
            uuid: "GPU-1".into(),
            sample: AccountingSample {
                pid: 150,
                gpu_util: Some(80),
                mem_util: Some(10),
                max_memory_bytes: Some(512),
                time_ms: 300,
                start_time_us: 5_000_000,
            },
        }];
        let inputs = Inputs {
            accounted: &accounted,
            ..Inputs::default()
        };
        let (snap, _, records) = run(
            &Metadata::default(),
            &[sample(9000, 0, vec![p(200, 5, Some(1))])],
            &inputs,
        );
        assert_eq!(records.len(), 1);
        let r = &records[0];
        assert_eq!((r.start_ms, r.end_ms), (5000, 5300));
        assert!((r.accounted_gpu_seconds - 0.24).abs() < 1e-9);
        assert_eq!((r.accounted_processes, r.memory_peak_bytes), (1, 512));
        assert_eq!(r.reason, "accounting");
        // A has no process now: an entry of its own carries the charge.
        let a = snap
            .containers
            .iter()
            .find(|c| c.container_id.as_deref() == Some(A))
            .unwrap();
        assert!(a.gpus.is_empty());
        assert_eq!(a.accounts[0].accounted_processes, 1);
        assert!((a.accounts[0].accounted_gpu_seconds - 0.24).abs() < 1e-9);
    }

    #[test]
    fn the_mps_server_is_charged_to_nobody() {
        let mut s = sample(1000, 0, vec![p(900, 300, None), p(200, 5, Some(1))]);
        s.devices[0].processes[1].mps = true;
        let (snap, _, _) = run(&Metadata::default(), &[s], &Inputs::default());
        assert_eq!(snap.devices[0].sharing.mps_server_pids, [900]);
        let b = snap
            .containers
            .iter()
            .find(|c| c.container_id.as_deref() == Some(B))
            .unwrap();
        assert_eq!(b.gpus[0].pids, [200]);
        assert_eq!(b.gpus[0].memory_used_bytes, 5);
    }

    #[test]
    fn dra_devices_by_minor_number_feed_the_allocation() {
        let md = allocated_to_a("gpu.nvidia.com", "gpu-7", Some("ns/claim"));
        let mut s = sample(1000, 0, vec![p(100, 1, Some(1))]);
        s.devices[0].sharing.minor_number = Some(7);
        let (snap, _, _) = run(&md, &[s], &Inputs::default());
        assert_eq!(snap.containers[0].allocated_gpus.to_vec(), ["GPU-1".into()]);
    }

    #[test]
    fn a_mig_device_size_is_its_containers_memory_limit() {
        let mut mig = p(100, 10, None);
        mig.mig = Some(0);
        let mut s = sample(1000, 0, vec![mig, p(200, 20, Some(5))]);
        s.devices[0].mig_devices = vec![gpu_model::MigSample {
            uuid: "MIG-1".into(),
            memory_total_bytes: Some(400),
            ..Default::default()
        }];
        let (snap, _, _) = run(&Metadata::default(), &[s], &Inputs::default());
        let account = |id: &str| {
            let c = snap
                .containers
                .iter()
                .find(|c| c.container_id.as_deref() == Some(id));
            c.unwrap().accounts[0].clone()
        };
        let a = account(A);
        assert_eq!((&*a.uuid, &*a.gpu_uuid), ("MIG-1", "GPU-1"));
        assert_eq!(a.memory_limit_bytes, Some(400));
        assert_eq!(a.memory_limit_source, Some(LimitSource::Mig));
        // A whole GPU, neither time-sliced nor under HAMi: no limit is known.
        let b = account(B);
        assert_eq!((b.memory_limit_bytes, b.memory_limit_source), (None, None));
    }

    /// Joins `samples`, each with its own metadata, and returns every record.
    fn run_with(steps: &[(&Metadata, GpuSample)], inputs: &Inputs) -> Vec<UsageRecord> {
        let mut c = Counters::default();
        let mut all = vec![];
        for (md, s) in steps {
            let (_, next, records) = join_with(&Procs, md, s, &SourceStatus::Ok, c, OPTS, inputs);
            c = next;
            all.extend(records);
        }
        all
    }

    fn h100(t: u64, procs: Vec<ProcessSample>) -> GpuSample {
        let mut s = sample(t, 0, procs);
        s.devices[0].name = "NVIDIA H100 80GB HBM3".into();
        s.devices[0].memory_total_bytes = Some(80 << 30);
        s
    }

    /// A's stretch keeps the distribution of its SM utilization and memory, and the facts
    /// of its device and allocation; 20 samples: 18 at 10 % and 1 GiB, two at 60 % and
    /// 3 GiB.
    #[test]
    fn a_stretch_records_its_percentiles_device_and_allocation() {
        let md = allocated_to_a("nvidia.com/gpu", "GPU-1", None);
        let mut steps: Vec<(&Metadata, GpuSample)> = (0..20u64)
            .map(|i| {
                let (sm, mem) = if i % 10 == 9 {
                    (60, 3 << 30)
                } else {
                    (10, 1 << 30)
                };
                (&md, h100(1000 * (i + 1), vec![p(100, mem, Some(sm))]))
            })
            .collect();
        let none = Metadata::default();
        steps.push((&none, h100(21_000, vec![])));
        let records = run_with(&steps, &Inputs::default());
        assert_eq!(records.len(), 1, "{records:?}");
        let r = &records[0];
        assert_eq!(
            (r.start_ms, r.end_ms, r.reason.as_str()),
            (1000, 20_000, "exited")
        );
        assert_eq!(
            (r.sm_p50, r.sm_p95, r.sm_max),
            (Some(10), Some(60), Some(60))
        );
        assert_eq!(r.sm_source.as_deref(), Some("process_utilization"));
        assert_eq!(
            (r.memory_peak_bytes, r.memory_p95_bytes),
            (3 << 30, 3 << 30)
        );
        assert_eq!(r.device_model.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(r.device_memory_bytes, Some(80 << 30));
        assert_eq!(
            (r.gpus_allocated, r.mig_profile.as_deref()),
            (Some(1.0), None)
        );
        assert_eq!(r.namespace.as_deref(), Some("ns"));
    }

    /// Allocated a GPU, running nothing on it: a stretch of the allocation, with no GPU
    /// time, no memory and 0 % SM; it ends when the allocation does.
    #[test]
    fn an_allocated_device_nobody_uses_gets_a_record_of_its_allocation() {
        let md = allocated_to_a("nvidia.com/gpu", "GPU-1", None);
        let none = Metadata::default();
        let steps = [
            (&md, h100(1000, vec![])),
            (&md, h100(2000, vec![])),
            (&md, h100(3000, vec![])),
            (&none, h100(4000, vec![])),
        ];
        let records = run_with(&steps, &Inputs::default());
        assert_eq!(records.len(), 1, "{records:?}");
        let r = &records[0];
        assert_eq!(r.container_id.as_deref(), Some(A));
        assert_eq!(
            (r.start_ms, r.end_ms, r.reason.as_str()),
            (1000, 3000, "exited")
        );
        assert_eq!((r.gpu_seconds, r.memory_peak_bytes), (Some(0.0), 0));
        assert_eq!((r.sm_p95, r.sm_max), (Some(0), Some(0)));
        assert_eq!(r.gpus_allocated, Some(1.0));
    }

    /// A stretch longer than `max_record_ms` is cut into records that follow on each
    /// other and add up to what one record would say.
    #[test]
    fn a_long_stretch_is_cut_into_checkpoints_that_add_up() {
        let md = Metadata::default();
        let steps: Vec<(&Metadata, GpuSample)> = (1..=7u64)
            .map(|i| {
                let procs = if i < 7 {
                    vec![p(100, 10, Some(50))]
                } else {
                    vec![]
                };
                (&md, sample(1000 * i, 100_000 * i, procs))
            })
            .collect();
        let inputs = Inputs {
            max_record_ms: 2000,
            ..Inputs::default()
        };
        let records = run_with(&steps, &inputs);
        let spans: Vec<(u64, u64, &str)> = records
            .iter()
            .map(|r| (r.start_ms, r.end_ms, r.reason.as_str()))
            .collect();
        let want = [
            (1000, 3000, "checkpoint"),
            (3000, 5000, "checkpoint"),
            (5000, 6000, "exited"),
        ];
        assert_eq!(spans, want);
        let sum = |f: fn(&UsageRecord) -> f64| records.iter().map(f).sum::<f64>();
        let (gpu_s, byte_s) = (
            sum(|r| r.gpu_seconds.unwrap()),
            sum(|r| r.memory_byte_seconds),
        );
        assert!((gpu_s - 2.5).abs() < 1e-9, "{gpu_s}");
        assert!((byte_s - 50.0).abs() < 1e-9, "{byte_s}");
        // 100 J a cycle from the second to the sixth, A's share half (its 50 % SM).
        let energy = sum(|r| r.energy_joules);
        assert!((energy - 250.0).abs() < 1e-9, "{energy}");
    }

    /// GPM's SM activity stands for the container's SM utilization where it has the
    /// device to itself; beside another, its processes' utilization does.
    #[test]
    fn gpm_sm_activity_is_used_where_the_container_has_the_device_alone() {
        let gpm = |t: u64, procs: Vec<ProcessSample>| {
            let mut s = h100(t, procs);
            s.devices[0].fields.gpm = Some(gpu_model::GpmMetrics {
                sm_active: Some(0.3),
                ..Default::default()
            });
            s
        };
        let md = Metadata::default();
        let alone = [
            (&md, gpm(1000, vec![p(100, 10, Some(90))])),
            (&md, gpm(2000, vec![])),
        ];
        let r = &run_with(&alone, &Inputs::default())[0];
        assert_eq!((r.sm_max, r.sm_source.as_deref()), (Some(30), Some("gpm")));
        let shared = [
            (
                &md,
                gpm(1000, vec![p(100, 10, Some(90)), p(200, 10, Some(5))]),
            ),
            (&md, gpm(2000, vec![])),
        ];
        let records = run_with(&shared, &Inputs::default());
        let a = records
            .iter()
            .find(|r| r.container_id.as_deref() == Some(A));
        let a = a.unwrap();
        assert_eq!(
            (a.sm_max, a.sm_source.as_deref()),
            (Some(90), Some("process_utilization"))
        );
    }

    /// An open stretch's account says what it holds and its last SM figure (part of a
    /// whole GPU), for Prometheus: a quarter of a time-sliced GPU at 20 %; 3 of 7 slices of
    /// a MIG device that says no SM figure.
    #[test]
    fn an_open_stretchs_account_holds_its_share_and_last_sm() {
        let held = |md: &Metadata, s: &GpuSample| {
            let c = Counters::default();
            let (snap, _, _) = join_with(
                &Procs,
                md,
                s,
                &SourceStatus::Ok,
                c,
                OPTS,
                &Inputs::default(),
            );
            let a = &snap
                .containers
                .iter()
                .find(|c| c.container_id.as_deref() == Some(A));
            let a = &a.unwrap().accounts[0];
            (a.gpus_held, a.sm_share)
        };
        let mut md = allocated_to_a("nvidia.com/gpu", "GPU-1::1", None);
        md.set_replicas(HashMap::from([("GPU-1".to_string(), 4)]));
        let s = h100(1000, vec![p(100, 10, Some(20))]);
        assert_eq!(held(&md, &s), (Some(0.25), Some(0.2)));
        let md = allocated_to_a("nvidia.com/mig-3g.40gb", "MIG-1", None);
        let mut on_mig = p(100, 10, None);
        on_mig.mig = Some(0);
        let mut s = h100(1000, vec![on_mig]);
        s.devices[0].mig_devices = vec![gpu_model::MigSample {
            uuid: "MIG-1".into(),
            profile: Some("3g.40gb".into()),
            ..Default::default()
        }];
        assert_eq!(held(&md, &s), (Some(3.0 / 7.0), None));
    }

    /// One of four time-slicing replicas of the GPU: a quarter; a MIG device: its profile's
    /// compute slices over the GPU's seven.
    #[test]
    fn the_allocated_share_is_the_replicas_held_or_the_mig_profiles_slices() {
        let mut md = allocated_to_a("nvidia.com/gpu", "GPU-1::1", None);
        md.set_replicas(HashMap::from([("GPU-1".to_string(), 4)]));
        let none = Metadata::default();
        let steps = [
            (&md, h100(1000, vec![p(100, 10, Some(20))])),
            (&none, h100(2000, vec![])),
        ];
        let r = &run_with(&steps, &Inputs::default())[0];
        assert_eq!(r.gpus_allocated, Some(0.25), "{r:?}");
        let md = allocated_to_a("nvidia.com/mig-3g.40gb", "MIG-1", None);
        let mig = |t: u64, procs: Vec<ProcessSample>| {
            let mut s = h100(t, procs);
            s.devices[0].mig_devices = vec![gpu_model::MigSample {
                uuid: "MIG-1".into(),
                memory_total_bytes: Some(40 << 30),
                profile: Some("3g.40gb".into()),
                ..Default::default()
            }];
            s
        };
        let mut on_mig = p(100, 10, None);
        on_mig.mig = Some(0);
        let steps = [(&md, mig(1000, vec![on_mig])), (&none, mig(2000, vec![]))];
        let r = &run_with(&steps, &Inputs::default())[0];
        assert_eq!(
            (r.uuid.as_str(), r.mig_profile.as_deref()),
            ("MIG-1", Some("3g.40gb"))
        );
        assert_eq!(r.gpus_allocated, Some(3.0 / 7.0));
        assert_eq!(r.device_memory_bytes, Some(80 << 30), "the GPU's");
        assert_eq!(
            (r.sm_p95, r.sm_source.as_deref()),
            (None, None),
            "MIG without GPM"
        );
    }
}
