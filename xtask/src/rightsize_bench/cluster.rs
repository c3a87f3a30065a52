//! The synthetic cluster of `cargo xtask bench rightsize`: nodes of eight GPUs (H100s whole
//! or cut into MIG devices, A100s, L4s whole or time-sliced), the workloads on them, each of
//! a class whose recommendation is known, and their containers' lives over the history.
//!
//! Every life starts and ends on a multiple of the rules' interval (5 minutes), so that
//! the recording rules see each container at exactly (end - start) / 5 m evaluations: the
//! answer below is the usage records' arithmetic on these lives, and rightsize must give
//! it from Prometheus.

/// The recording rules' evaluation interval, seconds (deploy/prometheus/).
pub const STEP: u64 = 300;
pub const HOUR: u64 = 3600;
pub const DAY: u64 = 86_400;
/// rightsize's `--min-coverage`: less is `insufficient-data`, whatever the class.
pub const MIN_COVERAGE: (&str, u64) = ("1d", DAY);
const GIB: u64 = 1 << 30;

/// A GPU model as NVML names it, and its memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Model {
    pub name: &'static str,
    pub memory: u64,
}

pub const H100: Model = Model {
    name: "NVIDIA H100 80GB HBM3",
    memory: 85_520_809_984,
};
pub const A100: Model = Model {
    name: "NVIDIA A100-SXM4-80GB",
    memory: 80 * GIB,
};
pub const L4: Model = Model {
    name: "NVIDIA L4",
    memory: 23_034 << 20,
};

/// A MIG device's profile: its name, compute slices (of 7) and memory (MiB, the driver's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mig {
    pub profile: &'static str,
    pub slices: u32,
    pub memory_mib: u64,
}

const MIG_1G: Mig = Mig {
    profile: "1g.10gb",
    slices: 1,
    memory_mib: 9984,
};
const MIG_3G: Mig = Mig {
    profile: "3g.40gb",
    slices: 3,
    memory_mib: 40448,
};
/// Each MIG H100 is cut alike: one 3g.40gb and four 1g.10gb (7 compute, 8 memory slices).
const MIG_LAYOUT: [Mig; 5] = [MIG_3G, MIG_1G, MIG_1G, MIG_1G, MIG_1G];
/// Time-slicing replicas of each time-sliced L4.
pub const L4_REPLICAS: u32 = 4;

/// A device series: a whole GPU or a MIG device.
#[derive(Debug, Clone)]
pub struct Device {
    pub node: u32,
    /// The GPU's index on its node.
    pub gpu: u32,
    /// `hw_id`: the GPU's UUID, or the MIG device's.
    pub uuid: String,
    /// The GPU's UUID under MIG (`hw_parent`, `gpu_uuid`).
    pub parent: Option<String>,
    pub model: Model,
    pub mig: Option<Mig>,
}

impl Device {
    /// The physical GPU's UUID.
    pub fn gpu_uuid(&self) -> &str {
        self.parent.as_deref().unwrap_or(&self.uuid)
    }

    pub fn memory(&self) -> u64 {
        self.mig.map_or(self.model.memory, |m| m.memory_mib << 20)
    }
}

/// Where a class's containers go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    H100,
    Mig1g,
    Mig3g,
    A100,
    L4,
    /// One of an L4's time-slicing replicas.
    L4Sliced,
}

/// When a workload's containers live.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Life {
    /// The whole history, replaced once by a rollout (new pods on the same devices).
    Rolled,
    /// The whole history, the same pods (a StatefulSet's).
    Steady,
    /// A run of this many hours every day, each a new pod (a CronJob's).
    Daily(u64),
    /// One run of some days (a training Job's).
    Days,
    /// One run of this many hours (a Job too short to judge).
    Once(u64),
}

/// The answer a class must get.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Expect {
    Release,
    Mig(Mig),
    /// One of k time-slicing replicas.
    TimeSlice(u32),
    Keep,
    InsufficientData,
}

impl Expect {
    pub fn kind(self) -> &'static str {
        match self {
            Expect::Release => "release",
            Expect::Mig(_) => "mig",
            Expect::TimeSlice(_) => "time-slice",
            Expect::Keep => "keep",
            Expect::InsufficientData => "insufficient-data",
        }
    }

    /// The part of a GPU each container would hold; None: nothing is saved.
    fn fraction(self) -> Option<f64> {
        match self {
            Expect::Release => Some(0.0),
            Expect::Mig(m) => Some(f64::from(m.slices) / 7.0),
            Expect::TimeSlice(k) => Some(1.0 / f64::from(k)),
            Expect::Keep | Expect::InsufficientData => None,
        }
    }
}

/// A kind of workload: where it runs, what it uses, and what it should be told.
#[derive(Debug, Clone, Copy)]
pub struct Class {
    pub name: &'static str,
    pub kind: &'static str,
    pub pool: Pool,
    pub replicas: u32,
    /// Devices per container.
    pub gpus: u32,
    /// The most memory a container holds, MiB (replicas after the first hold a bit less).
    pub peak_mib: u64,
    /// SM use, part of a whole GPU; None where unknown (MIG without GPM).
    pub sm: Option<f64>,
    pub life: Life,
    pub expect: Expect,
}

const fn class(
    name: &'static str,
    kind: &'static str,
    pool: Pool,
    (replicas, gpus): (u32, u32),
    (peak_gib, sm): (u64, Option<f64>),
    life: Life,
    expect: Expect,
) -> Class {
    Class {
        name,
        kind,
        pool,
        replicas,
        gpus,
        peak_mib: peak_gib * 1024,
        sm,
        life,
        expect,
    }
}

use Expect as E;
use Life as L;
use Pool as P;

/// The classes, with their answers at the default headroom (0.2) and a minimum coverage of
/// a day: 7 GiB and 10 % on an H100 fit a 1g.10gb (8.4 GiB, 12 % <= 1/7), and so on.
#[rustfmt::skip]
pub const CLASSES: &[Class] = &[
    class("train", "Job", P::H100, (1, 8), (75, Some(0.95)), L::Days, E::Keep),
    class("chat", "Deployment", P::H100, (4, 1), (7, Some(0.10)), L::Rolled, E::Mig(MIG_1G)),
    class("embed", "StatefulSet", P::H100, (3, 1), (30, Some(0.35)), L::Steady, E::Mig(MIG_3G)),
    class("notebook", "Deployment", P::H100, (2, 1), (0, Some(0.0)), L::Rolled, E::Release),
    class("eval", "CronJob", P::H100, (1, 1), (20, Some(0.20)), L::Daily(2), E::Mig(MIG_3G)),
    class("probe", "Job", P::H100, (1, 1), (40, Some(0.50)), L::Once(3), E::InsufficientData),
    class("tok", "Deployment", P::Mig1g, (5, 1), (8, None), L::Rolled, E::Mig(MIG_1G)),
    class("rank", "StatefulSet", P::Mig3g, (3, 1), (30, Some(0.30)), L::Steady, E::Mig(MIG_3G)),
    class("ocr", "Deployment", P::Mig3g, (2, 1), (5, Some(0.05)), L::Rolled, E::Mig(MIG_1G)),
    class("asr", "StatefulSet", P::A100, (3, 1), (15, Some(0.20)), L::Steady, E::Mig(A100_2G)),
    class("finetune", "Deployment", P::A100, (4, 1), (60, Some(0.80)), L::Rolled, E::Keep),
    class("sandbox", "Deployment", P::A100, (2, 1), (0, Some(0.0)), L::Rolled, E::Release),
    class("vision", "Deployment", P::A100, (2, 1), (25, Some(0.45)), L::Rolled, E::Mig(A100_4G)),
    class("infer", "Deployment", P::L4, (4, 1), (6, Some(0.15)), L::Rolled, E::TimeSlice(3)),
    class("tiny", "Deployment", P::L4, (2, 1), (2, Some(0.05)), L::Rolled, E::TimeSlice(8)),
    class("render", "StatefulSet", P::L4, (2, 1), (20, Some(0.70)), L::Steady, E::Keep),
    class("batch", "CronJob", P::L4, (1, 1), (3, Some(0.30)), L::Daily(4), E::TimeSlice(2)),
    class("shard", "Deployment", P::L4Sliced, (5, 1), (4, Some(0.10)), L::Rolled, E::TimeSlice(4)),
];

const A100_2G: Mig = Mig {
    profile: "2g.20gb",
    slices: 2,
    memory_mib: 19968,
};
const A100_4G: Mig = Mig {
    profile: "4g.40gb",
    slices: 4,
    memory_mib: 40192,
};

/// One container's life on its devices.
#[derive(Debug, Clone)]
pub struct Container {
    pub pod: String,
    pub pod_uid: String,
    pub id: String,
    pub name: &'static str,
    /// Indices into `Cluster::devices`, and the part of the GPU held on each.
    pub devices: Vec<(usize, f64)>,
    /// Unix seconds, multiples of `STEP`: [from, to).
    pub from: u64,
    pub to: u64,
    pub peak_bytes: u64,
}

#[derive(Debug, Clone)]
pub struct Workload {
    pub class: &'static Class,
    pub namespace: String,
    pub name: String,
    pub model: Model,
    pub containers: Vec<Container>,
}

#[derive(Debug, Clone)]
pub struct Cluster {
    pub nodes: u32,
    /// The history: [start, end), unix seconds, multiples of `STEP`.
    pub start: u64,
    pub end: u64,
    pub devices: Vec<Device>,
    pub workloads: Vec<Workload>,
}

/// A deterministic 64-bit mix (splitmix64): names and ids without a random source.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn hex(seed: u64, len: usize) -> String {
    let mut s = String::with_capacity(len + 16);
    let mut i = 0;
    while s.len() < len {
        s.push_str(&format!("{:016x}", mix(seed ^ (i << 56))));
        i += 1;
    }
    s.truncate(len);
    s
}

fn uuid(prefix: &str, seed: u64) -> String {
    let h = hex(seed, 32);
    format!(
        "{prefix}{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// Pod-name suffixes as Kubernetes makes them.
fn suffix(seed: u64, len: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut x = mix(seed);
    (0..len)
        .map(|_| {
            let c = ALPHABET[(x % ALPHABET.len() as u64) as usize];
            x /= ALPHABET.len() as u64;
            c as char
        })
        .collect()
}

/// The nodes of each pool: H100s (2 of 5), MIG H100s (1 of 10), A100s (3 of 10), L4s the
/// rest, a quarter of them time-sliced; at least one of each.
fn node_counts(nodes: u32) -> [(Pool, u32); 5] {
    let h100 = (nodes * 2 / 5).max(1);
    let mig = (nodes / 10).max(1);
    let a100 = (nodes * 3 / 10).max(1);
    let l4 = nodes.saturating_sub(h100 + mig + a100).max(2);
    let sliced = (l4 / 4).max(1);
    [
        (P::H100, h100),
        (P::Mig1g, mig),
        (P::A100, a100),
        (P::L4, l4 - sliced),
        (P::L4Sliced, sliced),
    ]
}

/// The slots a pool offers: a device and the part of its GPU one container holds there.
type Slots = Vec<(usize, f64)>;

impl Cluster {
    /// `nodes` nodes of 8 GPUs, `days` of history ending at `end` (a multiple of `STEP`).
    pub fn new(nodes: u32, days: u64, end: u64) -> Cluster {
        assert!(end.is_multiple_of(STEP) && days >= 2);
        let mut c = Cluster {
            nodes: 0,
            start: end - days * DAY,
            end,
            devices: vec![],
            workloads: vec![],
        };
        let mut pools: Vec<(Pool, Slots)> = vec![];
        for (pool, n) in node_counts(nodes) {
            for _ in 0..n {
                c.add_node(pool, &mut pools);
            }
        }
        for (pool, slots) in &pools {
            c.fill(*pool, slots);
        }
        c
    }

    fn add_node(&mut self, pool: Pool, pools: &mut Vec<(Pool, Slots)>) {
        let node = self.nodes;
        self.nodes += 1;
        let slot = |pools: &mut Vec<(Pool, Slots)>, p: Pool, s: (usize, f64)| match pools
            .iter_mut()
            .find(|(q, _)| *q == p)
        {
            Some((_, v)) => v.push(s),
            None => pools.push((p, vec![s])),
        };
        for gpu in 0..8u32 {
            let seed = u64::from(node) << 8 | u64::from(gpu);
            let model = match pool {
                P::H100 | P::Mig1g | P::Mig3g => H100,
                P::A100 => A100,
                P::L4 | P::L4Sliced => L4,
            };
            let gpu_uuid = uuid("GPU-", seed);
            let device = |uuid: String, parent: Option<String>, mig: Option<Mig>| Device {
                node,
                gpu,
                uuid,
                parent,
                model,
                mig,
            };
            if pool == P::Mig1g {
                self.devices.push(device(gpu_uuid.clone(), None, None));
                for (i, m) in MIG_LAYOUT.iter().enumerate() {
                    let id = uuid("MIG-", seed ^ (i as u64 + 1) << 40);
                    let p = if m.slices == 1 { P::Mig1g } else { P::Mig3g };
                    slot(pools, p, (self.devices.len(), f64::from(m.slices) / 7.0));
                    self.devices
                        .push(device(id, Some(gpu_uuid.clone()), Some(*m)));
                }
                continue;
            }
            let at = self.devices.len();
            self.devices.push(device(gpu_uuid, None, None));
            match pool {
                P::L4Sliced => {
                    for _ in 0..L4_REPLICAS {
                        slot(pools, pool, (at, 1.0 / f64::from(L4_REPLICAS)));
                    }
                }
                _ => slot(pools, pool, (at, 1.0)),
            }
        }
    }

    /// The pool's classes in turn, a workload each, until nine tenths of its slots are
    /// taken; a container of several GPUs starts on a node's first.
    fn fill(&mut self, pool: Pool, slots: &[(usize, f64)]) {
        let classes: Vec<&'static Class> = CLASSES.iter().filter(|c| c.pool == pool).collect();
        let mut at = 0usize;
        for turn in 0.. {
            let class = classes[turn % classes.len()];
            if class.gpus > 1 {
                at = at.next_multiple_of(8);
            }
            let need = (class.replicas * class.gpus) as usize;
            if at * 10 >= slots.len() * 9 || at + need > slots.len() {
                break;
            }
            self.add_workload(class, &slots[at..at + need]);
            at += need;
        }
    }

    fn add_workload(&mut self, class: &'static Class, slots: &[(usize, f64)]) {
        let w = self.workloads.len() as u64;
        let name = format!("{}-{w}", class.name);
        let namespace = format!("team-{}", mix(w) % 40);
        let model = self.devices[slots[0].0].model;
        let mut containers = vec![];
        for r in 0..class.replicas {
            let devices = slots[(r * class.gpus) as usize..][..class.gpus as usize].to_vec();
            // Replicas after the first hold up to 10 % less memory.
            let peak_mib = class.peak_mib * (100 - u64::from(r % 3) * 5) / 100;
            for (g, (from, to)) in self.lives(class.life, w).into_iter().enumerate() {
                let seed = w << 24 | u64::from(r) << 12 | g as u64;
                let pod = match (class.kind, class.life) {
                    ("StatefulSet", _) => format!("{name}-{r}"),
                    ("Deployment", _) => {
                        format!(
                            "{name}-{}-{}",
                            suffix(w << 8 | g as u64, 10),
                            suffix(seed, 5)
                        )
                    }
                    (_, L::Daily(_)) => format!("{name}-{}-{}", from / 60, suffix(seed, 5)),
                    _ => format!("{name}-{}", suffix(seed, 5)),
                };
                containers.push(Container {
                    pod,
                    pod_uid: uuid("", seed ^ 0x5eed),
                    id: hex(seed ^ 0xc0de, 64),
                    name: "main",
                    devices: devices.clone(),
                    from,
                    to,
                    peak_bytes: peak_mib << 20,
                });
            }
        }
        self.workloads.push(Workload {
            class,
            namespace,
            name,
            model,
            containers,
        });
    }

    /// The [from, to) of each generation of a workload's pods.
    fn lives(&self, life: Life, w: u64) -> Vec<(u64, u64)> {
        let (start, end) = (self.start, self.end);
        let days = (end - start) / DAY;
        match life {
            L::Steady => vec![(start, end)],
            L::Rolled => {
                let at = start + (1 + w % (days - 1)) * DAY - (w % 12) * HOUR;
                vec![(start, at), (at, end)]
            }
            L::Daily(hours) => (0..days)
                .map(|d| start + d * DAY + (w % (24 - hours)) * HOUR)
                .map(|from| (from, from + hours * HOUR))
                .collect(),
            L::Days => {
                let from = start + (w % 4) * 6 * HOUR + (w % 6) * STEP;
                let run = (days * DAY / 2).max(DAY) + (w % 5) * 8 * HOUR;
                vec![(from, (from + run).min(end))]
            }
            L::Once(hours) => {
                let from = start + (w % (days - 1)) * DAY + (w % 20) * HOUR;
                vec![(from, from + hours * HOUR)]
            }
        }
    }

    /// Container series on devices: a container on n devices counts n.
    pub fn container_series(&self) -> usize {
        let each = |c: &Container| c.devices.len();
        (self.workloads.iter())
            .flat_map(|w| &w.containers)
            .map(each)
            .sum()
    }

    pub fn containers(&self) -> usize {
        self.workloads.iter().map(|w| w.containers.len()).sum()
    }

    /// GPUs: devices that are not MIG devices.
    pub fn gpus(&self) -> usize {
        self.devices.iter().filter(|d| d.parent.is_none()).count()
    }
}

/// What rightsize must say of one workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub namespace: String,
    pub workload_kind: String,
    pub workload: String,
    pub device_model: String,
    pub kind: &'static str,
    pub profile: Option<&'static str>,
    /// 1/k, to 4 places as rightsize prints it.
    pub share: Option<f64>,
    pub coverage_s: f64,
    pub gpus_allocated: f64,
    pub memory_peak_bytes: u64,
    pub gpus_saved: f64,
}

/// The usage records' arithmetic on each workload's lives: coverage the sum of its device
/// stretches, GPUs allocated their shares over its lifespan (first start to last end), the
/// saving max(0, allocated - instances x the part of a GPU recommended).
pub fn answers(c: &Cluster) -> Vec<Answer> {
    c.workloads.iter().map(answer).collect()
}

fn answer(w: &Workload) -> Answer {
    let (mut coverage, mut held) = (0.0, 0.0);
    let (mut first, mut last, mut peak) = (u64::MAX, 0, 0);
    for k in &w.containers {
        let d = (k.to - k.from) as f64;
        for (_, share) in &k.devices {
            coverage += d;
            held += share * d;
        }
        (first, last) = (first.min(k.from), last.max(k.to));
        peak = peak.max(k.peak_bytes);
    }
    let lifespan = (last - first) as f64;
    let (allocated, instances) = (held / lifespan, coverage / lifespan);
    let expect = match coverage < MIN_COVERAGE.1 as f64 {
        true => E::InsufficientData,
        false => w.class.expect,
    };
    let saved = expect
        .fraction()
        .map_or(0.0, |f| (allocated - instances * f).max(0.0));
    Answer {
        namespace: w.namespace.clone(),
        workload_kind: w.class.kind.into(),
        workload: w.name.clone(),
        device_model: w.model.name.into(),
        kind: expect.kind(),
        profile: match expect {
            E::Mig(m) => Some(m.profile),
            _ => None,
        },
        share: match expect {
            E::TimeSlice(k) => Some((1e4 / f64::from(k)).round() / 1e4),
            _ => None,
        },
        coverage_s: coverage,
        gpus_allocated: allocated,
        memory_peak_bytes: peak,
        gpus_saved: saved,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const END: u64 = 1_800_000_000 - 1_800_000_000 % STEP;

    #[test]
    fn a_small_cluster_has_every_class_and_known_answers() {
        let c = Cluster::new(20, 2, END);
        assert_eq!((c.nodes, c.gpus()), (20, 160));
        for class in CLASSES {
            assert!(
                c.workloads.iter().any(|w| w.class.name == class.name),
                "{} missing",
                class.name
            );
        }
        let a = answers(&c);
        let find = |class: &str| {
            let w = c
                .workloads
                .iter()
                .position(|w| w.class.name == class)
                .unwrap();
            a[w].clone()
        };
        // A Deployment of 4 whole H100s all along: 4 GPUs, each to a 1g.10gb (1/7).
        let chat = find("chat");
        assert_eq!((chat.kind, chat.profile), ("mig", Some("1g.10gb")));
        assert!((chat.gpus_allocated - 4.0).abs() < 1e-9);
        assert!((chat.gpus_saved - 4.0 * 6.0 / 7.0).abs() < 1e-9);
        assert_eq!(chat.coverage_s, 4.0 * 2.0 * DAY as f64);
        assert_eq!(chat.memory_peak_bytes, 7 << 30, "the first replica's");
        let idle = find("notebook");
        assert_eq!((idle.kind, idle.gpus_saved), ("release", 2.0));
        // Five of an L4's four replicas: each stays one of four.
        let shard = find("shard");
        assert_eq!((shard.kind, shard.share), ("time-slice", Some(0.25)));
        assert!((shard.gpus_allocated - 1.25).abs() < 1e-9 && shard.gpus_saved < 1e-9);
        assert_eq!(find("tiny").share, Some(0.125));
        assert_eq!(find("probe").kind, "insufficient-data");
        // Two days of a daily 2-hour run: 4 hours, too little to judge.
        assert_eq!(find("eval").kind, "insufficient-data");
        // A MIG 3g.40gb user that fits a 1g.10gb gives back 2/7 a container.
        let ocr = find("ocr");
        assert!((ocr.gpus_saved - 2.0 * 2.0 / 7.0).abs() < 1e-9);
    }

    #[test]
    fn lives_lie_on_the_rules_grid_inside_the_history() {
        let c = Cluster::new(20, 3, END);
        for w in &c.workloads {
            for k in &w.containers {
                assert!(
                    k.from.is_multiple_of(STEP) && k.to.is_multiple_of(STEP),
                    "{}",
                    w.name
                );
                assert!(c.start <= k.from && k.from + STEP <= k.to && k.to <= c.end);
            }
        }
        // The daily runs: one a day, each a pod of its own.
        let cron = c.workloads.iter().find(|w| w.class.name == "eval").unwrap();
        assert_eq!(cron.containers.len(), 3);
        assert_ne!(cron.containers[0].pod, cron.containers[1].pod);
    }

    #[test]
    fn the_full_size_cluster() {
        let c = Cluster::new(500, 14, END);
        assert_eq!(c.gpus(), 4000);
        let n = c.containers();
        assert!((8000..12000).contains(&n), "{n} containers");
        let mut ids: Vec<&str> = (c.workloads.iter())
            .flat_map(|w| w.containers.iter().map(|k| k.id.as_str()))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), n, "container ids are unique");
    }
}
