//! Billing over joined snapshots: the join runs as the pipeline runs it, then billing
//! reads each snapshot.
use std::{collections::HashMap, time::Duration};

use gpu_model::{
    AccountingSample, ContainerUsage, DeviceStatus, GpuSample, LimitSource, Name, ProcessSample,
    Snapshot, SourceStatus, UsageRecord,
};

use super::{
    account::{self, Accounted},
    bill_snapshot,
    ledger::{Books, RecordNames},
    stretch, Settings,
};
use crate::{
    gpu::{
        join::{
            counters::Counters,
            joiner::{tests::allocated_to_a, FORGET_AFTER_MS},
            owner::Owner,
            JoinOptions, Joined,
        },
        DeviceSample,
    },
    metadata::{hami::HamiLimits, Metadata},
    process::{cgroup::ContainerRef, Placement, Resolver},
};

/// What the account pass is given besides the snapshot: NVML accounting's stats, and how
/// long a stretch runs before it is cut.
pub(super) struct Inputs<'a> {
    accounted: &'a [Accounted],
    max_record_ms: u64,
}

impl Default for Inputs<'_> {
    fn default() -> Self {
        Inputs {
            accounted: &[],
            max_record_ms: Settings::default().max_record_ms,
        }
    }
}

/// What the join and billing carry after a run.
#[derive(Default)]
pub(super) struct Carried {
    join: Counters,
    books: Books,
}

/// One cycle: the join, then billing's pass over its snapshot.
pub(super) fn cycle(
    md: &Metadata,
    s: &GpuSample,
    c: &mut Carried,
    inputs: &Inputs,
) -> (Snapshot, Vec<UsageRecord>) {
    let (mut snap, next) = crate::gpu::join::join(
        &Procs,
        md,
        s,
        &SourceStatus::Ok,
        &c.join,
        OPTS.max_gap,
        OPTS.process_detail,
    );
    c.join = next;
    let hami = HashMap::<u32, HamiLimits>::new();
    let settings = Settings {
        max_record_ms: inputs.max_record_ms,
        ..Settings::default()
    };
    let inputs = account::Inputs {
        hami: &hami,
        accounted: inputs.accounted,
        settings: &settings,
    };
    let names = c.join.uuids.clone();
    let joined = Joined {
        gpu_names: &names,
        owners: &[],
    };
    let records = bill_snapshot(&mut c.books, &mut snap, s, joined, md, &inputs);
    (snap, records)
}

pub(super) const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
pub(super) const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

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

pub(super) fn p(pid: u32, mem: u64, sm: Option<u32>) -> ProcessSample {
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
) -> (Snapshot, Carried, Vec<UsageRecord>) {
    let mut c = Carried::default();
    let mut all = vec![];
    let mut snap = Snapshot::default();
    for s in samples {
        let (sn, records) = cycle(md, s, &mut c, inputs);
        snap = sn;
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
        .books
        .ledgers
        .iter()
        .find(|(o, _, _)| **o == Owner::Container(A.into()))
        .map(|(_, _, l)| l.energy_j)
        .unwrap();
    assert!((a - 180.0).abs() < 1e-9, "{a}");
    assert!((energy(&snap, B) - 60.0).abs() < 1e-9);
    let idle = snap.devices[0].sharing.idle_energy_joules.unwrap();
    assert!((idle - 60.0).abs() < 1e-9, "{idle}");
    assert!(
        counters.books.energy_shares.is_empty(),
        "split, then forgotten"
    );
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
    assert!(c.join.ledgers.get(&a, &gpu).is_some());
    assert!(c.join.ledgers.get(&b, &gpu).is_some());
    let (_, c, _) = run(&md, &samples[..4], &Inputs::default());
    let la = c.books.ledgers.get(&a, &gpu).expect("allocated: kept");
    assert!(c.join.ledgers.get(&a, &gpu).is_some() && la.stretch.is_some());
    assert_eq!(c.books.ledgers.get(&b, &gpu), None);
    assert_eq!(c.join.ledgers.get(&b, &gpu), None);
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
    let open = stretch::close(&mut counters.books.ledgers, &key, "agent_stopped").unwrap();
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
    let md = allocated_to_a("gpu.nvidia.com", "gpu-7", Some("claim"));
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
pub(super) fn run_with(steps: &[(&Metadata, GpuSample)], inputs: &Inputs) -> Vec<UsageRecord> {
    let mut c = Carried::default();
    let mut all = vec![];
    for (md, s) in steps {
        let (_, records) = cycle(md, s, &mut c, inputs);
        all.extend(records);
    }
    all
}

pub(super) fn h100(t: u64, procs: Vec<ProcessSample>) -> GpuSample {
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
        let (snap, _) = cycle(md, s, &mut Carried::default(), &Inputs::default());
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

#[test]
fn the_ledgers_of_containers_gone_go_once_their_record_and_energy_are_done() {
    let mut b = super::Billing::default();
    let gpu: Name = "GPU-1".into();
    let ids: Vec<String> = (0..100).map(|i| format!("{i:064x}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let owner = Owner::Container(id.as_str().into());
        let l = super::ledger::device(b.books.ledgers.of(&owner), &gpu);
        l.energy_j = 1.0;
        if i == 7 {
            l.stretch = Some(Default::default());
        }
    }
    // billing_ledgers, the stretches open and billing_gone_waiting (`open_stretches` is
    // counted by the account pass, which this test does not run).
    let kept = |b: &super::Billing| {
        let l = b.lengths().map(|(_, n)| n);
        let open = b
            .books
            .ledgers
            .iter()
            .filter(|(_, _, l)| l.stretch.is_some());
        [l[0], open.count(), l[6]]
    };
    assert_eq!(kept(&b), [100, 1, 0]);
    // Another's energy share waits for the GPU's counter to move.
    let shared = Owner::Container(ids[8].as_str().into());
    let shares = b.books.energy_shares.entry("GPU-1".into()).or_default();
    shares.owners.add(&shared, &gpu, 0.5);
    b.gone(&ids);
    let what = "a record and a share are still to come";
    assert_eq!(kept(&b), [2, 1, 2], "{what}");
    // The stretch closes, the energy is charged: both go at the next pass.
    let owner = Owner::Container(ids[7].as_str().into());
    b.books.ledgers.get_mut(&owner, &gpu).unwrap().stretch = None;
    b.books.energy_shares.clear();
    b.forget_gone();
    assert_eq!(kept(&b), [0, 0, 0]);
}
