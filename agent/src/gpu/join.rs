//! The join: GPU samples (by host PID) x the process state -> an immutable snapshot per
//! container and GPU. `join` is pure: the same inputs give the same snapshot, and the
//! cumulative counters go in and come out as values. `Joiner` owns what carries over from
//! one cycle to the next: those counters, and the GPU PIDs nobody could place.
use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use gpu_model::SourceStatus;
pub use gpu_model::{ContainerGpu, ContainerUsage, ProcessUsage, Snapshot};

use super::{DeviceSample, GpuSample, ProcessSample};
use crate::{
    metadata::{parse_device_id, DeviceRef, Metadata},
    process::{Lookup, Placement, Resolver},
};

/// Who a GPU process is charged to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Owner {
    Container(String),
    Pod(String),
    Host,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Accumulated {
    pub gpu_seconds: f64,
    pub byte_seconds: f64,
    /// Last sample that saw this (owner, device), ms; stale ones are dropped.
    pub last_seen_ms: u64,
    /// First sample that saw it: when its counters started.
    pub since_ms: u64,
}

/// Cumulative counters per (owner, device uuid).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    pub map: HashMap<(Owner, String), Accumulated>,
    pub last_sample_ms: u64,
}

/// Counters of an (owner, device) not seen for this long are forgotten.
const FORGET_AFTER_MS: u64 = 10 * 60 * 1000;

/// What the cgroup says about an owner, copied into its snapshot entry.
#[derive(Debug, Clone, Default)]
struct OwnerMeta {
    container_id: Option<String>,
    pod_uid: Option<String>,
    qos: Option<&'static str>,
    runtime: Option<&'static str>,
    cgroup_path: Option<String>,
}

#[derive(Default)]
struct Group {
    meta: Option<OwnerMeta>,
    gpus: BTreeMap<String, ContainerGpu>,
}

/// Names from the runtime, and the devices the kubelet allocated, as UUIDs.
fn name_and_allocate(c: &mut ContainerUsage, metadata: &Metadata, devices: &[DeviceSample]) {
    if let Some(n) = c
        .container_id
        .as_deref()
        .and_then(|id| metadata.names_of(id))
    {
        c.pod_name = c.pod_name.take().or_else(|| n.pod_name.clone());
        c.namespace = c.namespace.take().or_else(|| n.namespace.clone());
        c.container_name = c.container_name.take().or_else(|| n.container_name.clone());
        c.pod_uid = c.pod_uid.take().or_else(|| n.pod_uid.clone());
    }
    let (Some(ns), Some(pod), Some(name)) = (&c.namespace, &c.pod_name, &c.container_name) else {
        return;
    };
    let mut uuids = vec![];
    for a in metadata.allocations_of(ns, pod, name) {
        c.allocated_device_ids.extend(a.device_ids.iter().cloned());
        for id in &a.device_ids {
            let uuid = match parse_device_id(id) {
                Some(DeviceRef::Uuid(u)) => Some(u),
                Some(DeviceRef::Index(i)) => devices
                    .iter()
                    .find(|d| d.index == i)
                    .map(|d| d.uuid.clone()),
                None => None,
            };
            if let Some(u) = uuid.filter(|u| !uuids.contains(u)) {
                uuids.push(u);
            }
        }
    }
    uuids.sort();
    c.allocated_gpus = uuids;
}

fn add_util(a: Option<u32>, b: Option<u32>) -> Option<u32> {
    match (a, b) {
        (None, None) => None,
        (x, y) => Some((x.unwrap_or(0) + y.unwrap_or(0)).min(100)),
    }
}

/// Who a placed process is charged to, and what its cgroup says about that owner.
fn owner_of(placed: Option<Placement<'_>>) -> (Owner, Option<OwnerMeta>) {
    let Some(pl) = placed else {
        return (Owner::Host, None);
    };
    let c = pl.container;
    let owner = match c {
        Some(c) if c.container_id.is_some() => Owner::Container(c.container_id.clone().unwrap()),
        Some(c) if c.pod_uid.is_some() => Owner::Pod(c.pod_uid.clone().unwrap()),
        _ => Owner::Host,
    };
    let meta = c.map(|c| OwnerMeta {
        container_id: c.container_id.clone(),
        pod_uid: c.pod_uid.clone(),
        qos: c.qos.map(|q| q.as_str()),
        runtime: c.runtime.map(|r| r.as_str()),
        cgroup_path: pl.cgroup_path.map(str::to_string),
    });
    (owner, meta)
}

impl Group {
    /// Adds one process's use of device `uuid` (of GPU `gpu_uuid`).
    fn add(&mut self, uuid: &str, gpu_uuid: &str, p: &ProcessSample) {
        let cg = self
            .gpus
            .entry(uuid.to_string())
            .or_insert_with(|| ContainerGpu {
                uuid: uuid.to_string(),
                gpu_uuid: gpu_uuid.to_string(),
                memory_used_bytes: 0,
                sm_util: None,
                mem_util: None,
                enc_util: None,
                dec_util: None,
                pids: vec![],
                gpu_time_seconds: 0.0,
                memory_byte_seconds: 0.0,
                counters_since_ms: 0,
            });
        cg.memory_used_bytes += p.used_memory_bytes;
        cg.sm_util = add_util(cg.sm_util, p.sm_util);
        cg.mem_util = add_util(cg.mem_util, p.mem_util);
        cg.enc_util = add_util(cg.enc_util, p.enc_util);
        cg.dec_util = add_util(cg.dec_util, p.dec_util);
        cg.pids.push(p.pid);
    }
}

/// Every GPU process grouped by owner, and the per-process rows when asked for.
fn group_processes(
    procs: &impl Resolver,
    sample: &GpuSample,
    process_detail: bool,
) -> (BTreeMap<Owner, Group>, Vec<ProcessUsage>) {
    let mut groups: BTreeMap<Owner, Group> = BTreeMap::new();
    let mut processes = vec![];
    for dev in &sample.devices {
        for p in &dev.processes {
            let placed = procs.place(p.pid);
            let (owner, meta) = owner_of(placed);
            let uuid = p.device_uuid(dev);
            if process_detail {
                let m = meta.as_ref();
                processes.push(ProcessUsage {
                    pid: p.pid,
                    comm: placed.map(|pl| pl.comm.to_string()),
                    container_id: m.and_then(|m| m.container_id.clone()),
                    pod_uid: m.and_then(|m| m.pod_uid.clone()),
                    uuid: uuid.to_string(),
                    used_memory_bytes: p.used_memory_bytes,
                    sm_util: p.sm_util,
                    mem_util: p.mem_util,
                    enc_util: p.enc_util,
                    dec_util: p.dec_util,
                    exited: placed.is_some_and(|pl| !pl.live),
                });
            }
            let g = groups.entry(owner).or_default();
            if g.meta.is_none() {
                g.meta = meta;
            }
            g.add(uuid, &dev.uuid, p);
        }
    }
    (groups, processes)
}

/// One entry per owner, its cumulative counters advanced by `dt` seconds.
fn accumulate(
    groups: BTreeMap<Owner, Group>,
    prev: &Counters,
    dt: f64,
    taken_at_ms: u64,
) -> (Vec<ContainerUsage>, Counters) {
    let mut counters = Counters {
        map: HashMap::with_capacity(prev.map.len()),
        last_sample_ms: taken_at_ms,
    };
    let mut containers = Vec::with_capacity(groups.len());
    for (owner, g) in groups {
        let mut gpus = Vec::with_capacity(g.gpus.len());
        for (uuid, mut cg) in g.gpus {
            let key = (owner.clone(), uuid);
            let mut acc = prev.map.get(&key).copied().unwrap_or_default();
            acc.gpu_seconds += cg.sm_util.unwrap_or(0) as f64 / 100.0 * dt;
            acc.byte_seconds += cg.memory_used_bytes as f64 * dt;
            acc.last_seen_ms = taken_at_ms;
            if acc.since_ms == 0 {
                acc.since_ms = taken_at_ms;
            }
            cg.counters_since_ms = acc.since_ms;
            cg.gpu_time_seconds = acc.gpu_seconds;
            cg.memory_byte_seconds = acc.byte_seconds;
            cg.pids.sort_unstable();
            counters.map.insert(key, acc);
            gpus.push(cg);
        }
        let m = match owner {
            Owner::Host => OwnerMeta::default(),
            _ => g.meta.unwrap_or_default(),
        };
        containers.push(ContainerUsage {
            container_id: m.container_id,
            pod_uid: m.pod_uid,
            qos: m.qos,
            runtime: m.runtime,
            cgroup_path: m.cgroup_path,
            gpus,
            ..Default::default()
        });
    }
    // Owners idle this cycle keep their totals (counters must not reset) until forgotten.
    for (k, acc) in &prev.map {
        if !counters.map.contains_key(k)
            && taken_at_ms.saturating_sub(acc.last_seen_ms) < FORGET_AFTER_MS
        {
            counters.map.insert(k.clone(), *acc);
        }
    }
    (containers, counters)
}

/// Containers the kubelet gave a GPU that run no GPU process at all: allocated, idle.
fn allocated_but_idle(metadata: &Metadata, containers: &[ContainerUsage]) -> Vec<ContainerUsage> {
    let mut out = vec![];
    for a in &metadata.allocations {
        let named = |c: &ContainerUsage| {
            c.namespace.as_deref() == Some(a.namespace.as_str())
                && c.pod_name.as_deref() == Some(a.pod_name.as_str())
                && c.container_name.as_deref() == Some(a.container_name.as_str())
        };
        if containers.iter().chain(&out).any(named) {
            continue;
        }
        let key = (
            a.namespace.clone(),
            a.pod_name.clone(),
            a.container_name.clone(),
        );
        let id = metadata.ids_by_name.get(&key).cloned();
        let pod_uid = id
            .as_ref()
            .and_then(|id| metadata.names_of(id))
            .and_then(|n| n.pod_uid.clone());
        out.push(ContainerUsage {
            container_id: id,
            pod_uid,
            pod_name: Some(a.pod_name.clone()),
            namespace: Some(a.namespace.clone()),
            container_name: Some(a.container_name.clone()),
            ..Default::default()
        });
    }
    out
}

/// Joins one GPU sample with the process state. `max_gap` caps the time credited to the
/// counters when samples were missed (NVML unavailable, the agent paused).
pub fn join(
    procs: &impl Resolver,
    metadata: &Metadata,
    sample: &GpuSample,
    nvml_status: &SourceStatus,
    prev: &Counters,
    max_gap: Duration,
    process_detail: bool,
) -> (Snapshot, Counters) {
    let dt = if prev.last_sample_ms == 0 || sample.taken_at_ms <= prev.last_sample_ms {
        0.0
    } else {
        ((sample.taken_at_ms - prev.last_sample_ms) as f64 / 1000.0).min(max_gap.as_secs_f64())
    };
    let (groups, processes) = group_processes(procs, sample, process_detail);
    let (mut containers, counters) = accumulate(groups, prev, dt, sample.taken_at_ms);
    for c in &mut containers {
        name_and_allocate(c, metadata, &sample.devices);
    }
    let mut idle = allocated_but_idle(metadata, &containers);
    for c in &mut idle {
        name_and_allocate(c, metadata, &sample.devices);
    }
    containers.extend(idle);
    let devices = sample
        .devices
        .iter()
        .map(|d| DeviceSample {
            processes: vec![],
            ..d.clone()
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
    (snap, counters)
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
        let mut cov = Coverage::default();
        for p in sample.devices.iter().flat_map(|d| &d.processes) {
            cov.gpu_processes += 1;
            if procs.knows(p.pid) {
                continue;
            }
            let recent = self
                .unresolved
                .get(&p.pid)
                .is_some_and(|t| now.duration_since(*t) < UNRESOLVED_RETRY);
            if recent {
                cov.unresolved += 1;
            } else if !procs.look_up(p.pid) {
                self.unresolved.insert(p.pid, now);
                cov.unresolved += 1;
            }
        }
        self.unresolved
            .retain(|_, t| now.duration_since(*t) < UNRESOLVED_RETRY);
        cov
    }

    /// The pure join, with this owner's counters carried over.
    pub fn join(
        &mut self,
        procs: &impl Resolver,
        metadata: &Metadata,
        sample: &GpuSample,
        nvml_status: &SourceStatus,
        max_gap: Duration,
        process_detail: bool,
    ) -> Snapshot {
        let (mut snap, counters) = join(
            procs,
            metadata,
            sample,
            nvml_status,
            &self.counters,
            max_gap,
            process_detail,
        );
        self.counters = counters;
        snap.container_xids = self.xids.charge(procs, metadata, sample);
        snap
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::metadata::{Allocation, ContainerNames};
    use crate::{
        gpu::ProcessSample,
        process::{
            cache::{ProcessCache, ProcessEntry},
            cgroup::ContainerRef,
            cgroup::{CgroupRegistry, Hierarchies, Hierarchy},
            State,
        },
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
            cache.upsert(ProcessEntry {
                pid,
                start_ns: 1,
                ppid: 1,
                comm: format!("p{pid}"),
                cgroup_v2: Some(cg),
                cgroup_v1: None,
                exited_at: None,
            });
        }
        State {
            cache,
            registry,
            hierarchies: Hierarchies {
                v2: Some(Hierarchy {
                    id: 0,
                    name: "cgroup2".into(),
                    mount_point: "/sys/fs/cgroup".into(),
                    mount_root: "/".into(),
                }),
                v1: None,
            },
        }
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
        let (snap, _) = join(
            &st,
            &Metadata::default(),
            &s,
            &SourceStatus::Ok,
            &Counters::default(),
            Duration::from_secs(3),
            true,
        );
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
        let (_, c1) = join(
            &st,
            &Metadata::default(),
            &sample(1000, vec![proc(100, 1000, 50)]),
            &SourceStatus::Ok,
            &Counters::default(),
            Duration::from_secs(3),
            false,
        );
        let (s2, c2) = join(
            &st,
            &Metadata::default(),
            &sample(3000, vec![proc(100, 1000, 50)]),
            &SourceStatus::Ok,
            &c1,
            Duration::from_secs(3),
            false,
        );
        let g = &find(&s2, Some(A)).gpus[0];
        assert!(
            (g.gpu_time_seconds - 1.0).abs() < 1e-9,
            "{}",
            g.gpu_time_seconds
        );
        assert!((g.memory_byte_seconds - 2000.0).abs() < 1e-9);
        // Idle cycle: the container is absent, its totals are kept for when it returns.
        let (s3, c3) = join(
            &st,
            &Metadata::default(),
            &sample(4000, vec![]),
            &SourceStatus::Ok,
            &c2,
            Duration::from_secs(3),
            false,
        );
        assert!(s3.containers.is_empty());
        // A long gap is capped at max_gap.
        let (s4, _) = join(
            &st,
            &Metadata::default(),
            &sample(100_000, vec![proc(100, 1000, 100)]),
            &SourceStatus::Ok,
            &c3,
            Duration::from_secs(3),
            false,
        );
        let g = &find(&s4, Some(A)).gpus[0];
        assert!(
            (g.gpu_time_seconds - 4.0).abs() < 1e-9,
            "{}",
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
        p.mig_uuid = Some("MIG-1".into());
        p.sm_util = None;
        let (snap, _) = join(
            &st,
            &Metadata::default(),
            &sample(1000, vec![p, proc(101, 20, 0)]),
            &SourceStatus::Ok,
            &Counters::default(),
            Duration::from_secs(3),
            false,
        );
        let a = find(&snap, Some(A));
        let uuids: Vec<_> = a
            .gpus
            .iter()
            .map(|g| (g.uuid.as_str(), g.gpu_uuid.as_str(), g.memory_used_bytes))
            .collect();
        assert_eq!(uuids, vec![("GPU-1", "GPU-1", 20), ("MIG-1", "GPU-1", 10)]);
        assert_eq!(a.gpus[1].sm_util, None);
    }

    #[test]
    fn names_allocations_and_allocated_but_idle_containers() {
        let st = state();
        let mut md = Metadata::default();
        let a = A.to_string();
        md.names.insert(
            a.clone(),
            ContainerNames {
                pod_name: Some("trainer-0".into()),
                namespace: Some("ml".into()),
                container_name: Some("main".into()),
                pod_uid: None,
            },
        );
        md.allocations = vec![
            Allocation {
                namespace: "ml".into(),
                pod_name: "trainer-0".into(),
                container_name: "main".into(),
                resource_name: "nvidia.com/gpu".into(),
                device_ids: vec!["GPU-1::2".into(), "1".into()],
            },
            Allocation {
                namespace: "ml".into(),
                pod_name: "idle-0".into(),
                container_name: "sleepy".into(),
                resource_name: "nvidia.com/gpu".into(),
                device_ids: vec!["GPU-9".into()],
            },
        ];
        md.ids_by_name.insert(
            ("ml".into(), "idle-0".into(), "sleepy".into()),
            "c".repeat(64),
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
            .find(|c| c.container_id.as_deref() == Some(a.as_str()))
            .unwrap();
        assert_eq!(c.pod_name.as_deref(), Some("trainer-0"));
        assert_eq!(c.namespace.as_deref(), Some("ml"));
        assert_eq!(
            c.allocated_gpus,
            vec!["GPU-1".to_string(), "GPU-2".to_string()]
        );
        // Uses GPU-1, holds GPU-2 without using it.
        assert_eq!(c.idle_allocations(), vec!["GPU-2"]);
        let idle = snap
            .containers
            .iter()
            .find(|c| c.pod_name.as_deref() == Some("idle-0"))
            .unwrap();
        assert_eq!(idle.container_id.as_deref(), Some("c".repeat(64).as_str()));
        assert!(idle.gpus.is_empty());
        assert_eq!(idle.idle_allocations(), vec!["GPU-9"]);
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
        fn knows(&self, pid: u32) -> bool {
            self.procs.contains_key(&pid)
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
}
