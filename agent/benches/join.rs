//! `cargo bench -p agent --bench join [CONTAINERS] [CYCLES]`: CPU of one join cycle (the
//! pipeline's work per GPU sample: join, billing, publish, refill the previous snapshot) on the large
//! node's shape: CONTAINERS (default 2,000) containers with one GPU process each, spread
//! over 8 GPUs with 7 MIG devices each, every process placed through the real process
//! cache and cgroup registry. With `--named`, as on a Kubernetes node: every container has
//! the runtime's names and the kubelet's allocation of its MIG device, and most containers
//! are allocated before their process starts, as pods start on a node. Prints one
//! `BENCH ...` line.
use std::{sync::Arc, time::Duration};

use gpu_agent::{
    billing::Billing,
    gpu::{join::Joiner, DeviceSample, GpuSample, MigSample, ProcessSample},
    metadata::{Allocation, ContainerNames, Metadata},
    process::{
        cache::{ProcessCache, ProcessEntry},
        cgroup::CgroupRegistry,
        State,
    },
    stats::thread_cpu_ns,
};
use gpu_model::{DeviceStatus, Name, SourceStatus};

const GPUS: u32 = 8;
const MIG: u32 = 7;
const MAX_GAP: Duration = Duration::from_secs(3);

/// splitmix64: a fixed pseudo-random sequence.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// With `filler`, as on the large node: 24 more processes a GPU container (in its own cgroup
/// or in one of four others, of its pod), so the cache holds 50,000 processes and the
/// registry 10,000 cgroups, as the agent's do there.
fn state(containers: u32, filler: bool) -> State {
    let mut registry = CgroupRegistry::default();
    let mut cache = ProcessCache::new(Duration::from_secs(5), 1000);
    let mut next_pid = 200_000;
    for c in 0..containers {
        // Random-looking, like real ids: ordered compares end at the first bytes.
        let h = |i: u64| mix(c as u64 * 4 + i);
        let pod = format!(
            "{:08x}_{:04x}_4{:03x}_8{:03x}_{:012x}",
            h(0) as u32,
            h(0) >> 48,
            h(1) & 0xfff,
            h(2) & 0xfff,
            h(3) >> 16
        );
        let id = container_id(c);
        let path = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod}.slice/cri-containerd-{id}.scope"
        );
        registry.insert(0, 1000 + c as u64, &path);
        cache.upsert(ProcessEntry::new(
            10_000 + c,
            1,
            1,
            "python3".into(),
            Some(1000 + c as u64),
            None,
        ));
        if !filler {
            continue;
        }
        for k in 0..4u64 {
            let other = format!("{path}.{k}.scope");
            let id = 1_000_000 + c as u64 * 4 + k;
            registry.insert(0, id, &other);
            for _ in 0..5 {
                next_pid += 1;
                let entry = ProcessEntry::new(next_pid, 1, 1, "sleep".into(), Some(id), None);
                cache.upsert(entry);
            }
        }
        for _ in 0..4 {
            next_pid += 1;
            let entry =
                ProcessEntry::new(next_pid, 1, 1, "sleep".into(), Some(1000 + c as u64), None);
            cache.upsert(entry);
        }
    }
    State::on_cgroup2(cache, registry)
}

/// Container `c`'s id, as `state` makes it.
fn container_id(c: u32) -> String {
    let h = |i: u64| mix(c as u64 * 4 + i);
    format!("{:016x}{:016x}{:016x}{:016x}", h(0), h(1), h(2), h(3))
}

/// Every container named by the runtime and allocated its MIG device by the kubelet.
fn named(containers: u32) -> Metadata {
    let mut md = Metadata::default();
    let mut allocations = vec![];
    for c in 0..containers {
        let (ns, pod, name) = ("ml".to_string(), format!("trainer-{c}"), "main".to_string());
        let id = container_id(c);
        allocations.push(Allocation {
            namespace: ns.clone(),
            pod_name: pod.clone(),
            container_name: name.clone(),
            resource_name: "nvidia.com/mig-1g.10gb".into(),
            device_ids: vec![uuid(c % GPUS, Some(c / GPUS % MIG)).into()],
            claim: None,
        });
        let names = ContainerNames {
            pod_name: Some(pod.into()),
            namespace: Some(ns.into()),
            container_name: Some(name.into()),
            pod_uid: None,
            runtime: Some("containerd"),
            workload: None,
        };
        md.learn(id.into(), names);
    }
    md.set_allocations(allocations);
    md
}

fn uuid(g: u32, m: Option<u32>) -> String {
    match m {
        None => format!("GPU-{g:08x}-0000-0000-0000-000000000000"),
        Some(m) => format!("MIG-{g:08x}-{m:04x}-0000-0000-000000000000"),
    }
}

/// The MIG devices' uuids, made once: the NVML thread keeps them from one cycle to the next
/// and its processes share them.
fn mig_names() -> Vec<Vec<Name>> {
    (0..GPUS)
        .map(|g| (0..MIG).map(|m| uuid(g, Some(m)).into()).collect())
        .collect()
}

/// The sample of a node whose first `busy` containers run their GPU process.
fn sample(containers: u32, busy: u32, t: u64, migs: &[Vec<Name>]) -> GpuSample {
    let devices = (0..GPUS)
        .map(|g| DeviceSample {
            index: g,
            uuid: uuid(g, None),
            status: DeviceStatus::Ok,
            memory_total_bytes: Some(85_520_809_984),
            // 400 W, read every 10 s (nvml.slow_interval_ms) and held in between.
            energy_mj: Some(t / 10_000 * 10_000 * 400),
            mig_devices: (0..MIG)
                .map(|m| MigSample {
                    uuid: migs[g as usize][m as usize].clone(),
                    gpu_instance_id: m,
                    compute_instance_id: 0,
                    memory_total_bytes: Some(10 << 30),
                    ..Default::default()
                })
                .collect(),
            processes: (0..containers)
                .filter(|c| c % GPUS == g && *c < busy)
                .map(|c| ProcessSample {
                    pid: 10_000 + c,
                    used_memory_bytes: 1 << 28,
                    // As the fake library reports them on the large node.
                    sm_util: Some(c * 34 % 90),
                    mem_util: Some(3),
                    enc_util: Some(0),
                    dec_util: Some(0),
                    gpu_instance_id: Some(c / GPUS % MIG),
                    compute_instance_id: Some(0),
                    mig: Some((c / GPUS % MIG) as u8),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    GpuSample {
        taken_at_ms: t,
        driver_version: Some("580.65.06".into()),
        devices,
    }
}

fn main() {
    let arg = |i: usize, default: u32| {
        std::env::args()
            .filter(|a| !a.starts_with('-'))
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(default)
    };
    let (containers, cycles) = (arg(1, 2000), arg(2, 200));
    let state = state(containers, std::env::args().any(|a| a == "--filler"));
    let migs = mig_names();
    let is_named = std::env::args().any(|a| a == "--named");
    let metadata = match is_named {
        true => named(containers),
        false => Metadata::default(),
    };
    let mut joiner = Joiner::default();
    let mut billing = Billing::default();
    let mut published = Arc::new(gpu_model::Snapshot::default());
    let mut t = 1_700_000_000_000;
    // Per cycle, the join, billing and the publish (which hands the snapshot before last to the
    // join for its lists, as the pipeline does); the sample is built outside the measured
    // time, as NVML's thread makes it.
    let mut run = |n: u32, busy: u32| {
        let mut spent = 0;
        for _ in 0..n {
            t += 1000;
            let s = sample(containers, busy, t, &migs);
            let cpu = thread_cpu_ns();
            let mut snap = joiner.join(&state, &metadata, &s, &SourceStatus::Ok, MAX_GAP, false);
            billing.bill(&mut snap, &s, joiner.joined(), &state, &metadata);
            let old = std::mem::replace(&mut published, Arc::new(snap));
            if let Ok(old) = Arc::try_unwrap(old) {
                joiner.recycle(old);
            }
            spent += thread_cpu_ns() - cpu;
        }
        spent as f64 / n as f64
    };
    // Named, as a Kubernetes node starts: the containers are allocated their devices
    // before most of them run a GPU process (the join keeps ledgers for them meanwhile).
    if is_named {
        run(5, containers / 8);
    }
    run(5, containers);
    let per_cycle = run(cycles, containers);
    assert_eq!(published.containers.len(), containers as usize);
    println!(
        "BENCH join_ms={:.3} containers={containers} cycles={cycles}",
        per_cycle / 1e6
    );
}
