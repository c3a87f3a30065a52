//! Usage records summed per workload and GPU model over a window: the `Usage` that
//! `recommend` reads. Anything that can say the same things (Prometheus' recording rules)
//! can build a `Usage` and get the same recommendation.
use std::collections::BTreeMap;

use gpu_model::UsageRecord;
use serde::Serialize;

use super::profiles::Profiles;

/// What a `Usage` is about: a workload (its namespace, kind and name) on one GPU model.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct WorkloadKey {
    pub namespace: String,
    /// A Kubernetes kind (`Deployment`, ..., `Pod`), or `Container` outside Kubernetes.
    pub workload_kind: String,
    pub workload: String,
    /// NVML's name of the GPU (the parent GPU's under MIG).
    pub device_model: String,
}

/// One workload's use of one GPU model over the window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Usage {
    pub key: WorkloadKey,
    /// Seconds of its records inside the window, its containers and devices together.
    pub coverage_s: f64,
    /// From its first record's start to its last record's end inside the window, seconds.
    pub lifespan_s: f64,
    /// GPUs it held at once, on average over its lifespan: sum(allocation x duration) /
    /// lifespan. A record without a known allocation counts what it held: 1 for a whole
    /// GPU, the MIG profile's part under MIG.
    pub gpus_allocated: f64,
    /// Containers on a device at once, on average: sum(duration) / lifespan.
    pub instances: f64,
    /// The most memory one container held on one device.
    pub memory_peak_bytes: u64,
    /// The highest 95th percentile of SM utilization of any of its stretches, as a part of
    /// a whole GPU (0-1; a MIG device's percentage times its part of the GPU); None where
    /// no stretch said.
    pub sm_p95: Option<f64>,
    /// The largest part of a GPU held by a stretch that used its device without saying its
    /// SM utilization (a MIG device without GPM); None when every stretch said. `need`
    /// reads it only where no stretch said (`sm_p95` None).
    pub sm_unknown_share: Option<f64>,
    /// Whether any stretch held memory or ran a kernel.
    pub used: bool,
    /// The GPU's memory, bytes (the largest a record said).
    pub device_memory_bytes: Option<u64>,
    /// The MIG profile of the largest MIG device it held, if it was on MIG.
    pub mig_profile: Option<String>,
    /// Its containers' names, sorted (none where the source does not say them).
    pub containers: Vec<String>,
}

/// The window, unix ms: records are clipped to [from_ms, to_ms].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub from_ms: u64,
    pub to_ms: u64,
}

/// The workload a record belongs to: its controller where the agent inferred one, else its
/// pod (kind `Pod`, named by the pod), else its container outside Kubernetes (namespace
/// `-`, kind `Container`, named by the container). Host processes have none.
pub fn workload_key(r: &UsageRecord) -> Option<WorkloadKey> {
    let short = |id: &Option<String>| id.as_ref().map(|i| i.chars().take(12).collect::<String>());
    let namespace = r.namespace.clone().unwrap_or_else(|| "-".into());
    let (namespace, kind, name) = match (&r.workload_kind, &r.workload) {
        (Some(kind), Some(name)) => (namespace, kind.clone(), name.clone()),
        _ if r.pod_uid.is_some() || r.pod_name.is_some() => {
            let pod = r.pod_name.clone().or_else(|| short(&r.pod_uid));
            (namespace, "Pod".into(), pod.unwrap_or_default())
        }
        _ if r.container_id.is_some() => {
            let c = r.container_name.clone().or_else(|| short(&r.container_id));
            ("-".into(), "Container".into(), c.unwrap_or_default())
        }
        _ => return None,
    };
    Some(WorkloadKey {
        namespace,
        workload_kind: kind,
        workload: name,
        device_model: r.device_model.clone().unwrap_or_else(|| "-".into()),
    })
}

/// Sums while the records are read.
#[derive(Default)]
struct Sums {
    coverage_ms: f64,
    alloc_ms: f64,
    first_ms: Option<u64>,
    last_ms: u64,
    records: u32,
    alloc_sum: f64,
    peak: u64,
    sm: Option<f64>,
    sm_unknown: Option<f64>,
    used: bool,
    device_memory: Option<u64>,
    mig: Option<(f64, String)>,
    containers: std::collections::BTreeSet<String>,
}

/// The larger of `a` (where there is one) and `b`.
pub(super) fn max_opt(a: Option<f64>, b: f64) -> Option<f64> {
    Some(a.map_or(b, |a| a.max(b)))
}

impl Sums {
    fn add(&mut self, r: &UsageRecord, (start, end): (u64, u64), profiles: &Profiles) {
        let model = r.device_model.as_deref().unwrap_or("");
        let part = (r.mig_profile.as_deref()).map_or(1.0, |p| {
            profiles.mig_fraction(model, r.device_memory_bytes, p)
        });
        let alloc = r
            .gpus_allocated
            .filter(|a| a.is_finite() && *a >= 0.0)
            .unwrap_or(part);
        let dur = (end - start) as f64;
        self.coverage_ms += dur;
        self.alloc_ms += alloc * dur;
        self.alloc_sum += alloc;
        self.records += 1;
        self.first_ms = Some(self.first_ms.map_or(start, |f| f.min(start)));
        self.last_ms = self.last_ms.max(end);
        self.peak = self.peak.max(r.memory_peak_bytes);
        let ran = [r.sm_max, r.sm_p95]
            .iter()
            .any(|s| s.is_some_and(|s| s > 0))
            || r.gpu_seconds.is_some_and(|s| s > 0.0);
        let used = r.memory_peak_bytes > 0 || ran;
        self.used |= used;
        match r.sm_p95 {
            Some(p) => self.sm = max_opt(self.sm, f64::from(p.min(100)) / 100.0 * part),
            None if used => self.sm_unknown = max_opt(self.sm_unknown, part),
            None => {}
        }
        if let Some(m) = r.device_memory_bytes {
            self.device_memory = Some(self.device_memory.map_or(m, |d| d.max(m)));
        }
        if let Some(p) = &r.mig_profile {
            if self.mig.as_ref().is_none_or(|(f, _)| part > *f) {
                self.mig = Some((part, p.clone()));
            }
        }
        if let Some(c) = &r.container_name {
            if !self.containers.contains(c) {
                self.containers.insert(c.clone());
            }
        }
    }

    fn finish(self, key: WorkloadKey) -> Usage {
        let lifespan = (self.last_ms - self.first_ms.unwrap_or(self.last_ms)) as f64;
        // Records of an instant each (no duration): each is one container at that instant.
        let (gpus_allocated, instances) = match lifespan > 0.0 {
            true => (self.alloc_ms / lifespan, self.coverage_ms / lifespan),
            false => (self.alloc_sum, f64::from(self.records)),
        };
        Usage {
            key,
            coverage_s: self.coverage_ms / 1000.0,
            lifespan_s: lifespan / 1000.0,
            gpus_allocated,
            instances,
            memory_peak_bytes: self.peak,
            sm_p95: self.sm,
            sm_unknown_share: self.sm_unknown,
            used: self.used,
            device_memory_bytes: self.device_memory,
            mig_profile: self.mig.map(|(_, p)| p),
            containers: self.containers.into_iter().collect(),
        }
    }
}

/// The records of each workload and GPU model inside `window`, summed. A record that
/// straddles an edge counts the part of its time inside; its peaks count whole (they may
/// fall either side: the larger is assumed). Host records are left out.
pub fn aggregate(records: &[UsageRecord], window: Window, profiles: &Profiles) -> Vec<Usage> {
    let mut a = Aggregate::new(window, profiles);
    for r in records {
        a.add(r);
    }
    a.finish()
}

/// `aggregate` as the records stream by: memory grows with the workloads, not the records.
pub struct Aggregate<'a> {
    window: Window,
    profiles: &'a Profiles,
    sums: BTreeMap<WorkloadKey, Sums>,
}

impl<'a> Aggregate<'a> {
    pub fn new(window: Window, profiles: &'a Profiles) -> Aggregate<'a> {
        Aggregate {
            window,
            profiles,
            sums: BTreeMap::new(),
        }
    }

    pub fn add(&mut self, r: &UsageRecord) {
        let window = self.window;
        let (start, end) = (r.start_ms, r.end_ms.max(r.start_ms));
        if end < window.from_ms || start > window.to_ms {
            return;
        }
        let Some(key) = workload_key(r) else {
            return;
        };
        let clipped = (start.max(window.from_ms), end.min(window.to_ms));
        (self.sums.entry(key).or_default()).add(r, clipped, self.profiles);
    }

    pub fn finish(self) -> Vec<Usage> {
        self.sums.into_iter().map(|(k, s)| s.finish(k)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const H: u64 = 3_600_000;

    fn rec(pod: &str, start_ms: u64, end_ms: u64) -> UsageRecord {
        UsageRecord {
            namespace: Some("ml".into()),
            pod_uid: Some(format!("uid-{pod}")),
            pod_name: Some(pod.into()),
            container_id: Some(format!("{pod}-container-id-0123456789")),
            container_name: Some("main".into()),
            workload_kind: Some("Deployment".into()),
            workload: Some("serve".into()),
            device_model: Some("NVIDIA H100 80GB HBM3".into()),
            device_memory_bytes: Some(85_520_809_984),
            gpus_allocated: Some(1.0),
            start_ms,
            end_ms,
            memory_peak_bytes: 7 * GIB,
            sm_p95: Some(10),
            sm_max: Some(30),
            gpu_seconds: Some(1.0),
            reason: "checkpoint".into(),
            ..Default::default()
        }
    }

    fn window(from_h: u64, to_h: u64) -> Window {
        Window {
            from_ms: from_h * H,
            to_ms: to_h * H,
        }
    }

    #[test]
    fn two_replicas_hold_two_gpus_and_a_record_across_the_start_counts_in_part() {
        let mut big = rec("b", 10 * H, 20 * H);
        big.memory_peak_bytes = 9 * GIB;
        big.sm_p95 = Some(20);
        let records = [rec("a", 0, 10 * H), rec("a", 10 * H, 20 * H), big];
        // The window starts at 5 h: half of the first record is inside.
        let u = aggregate(&records, window(5, 30), &Profiles::table());
        assert_eq!(u.len(), 1);
        let u = &u[0];
        assert_eq!(u.key.workload, "serve");
        assert!((u.coverage_s - 25.0 * 3600.0).abs() < 1e-6, "{u:?}");
        assert!((u.lifespan_s - 15.0 * 3600.0).abs() < 1e-6);
        // 5 h of one replica, then 10 h of two: 25 GPU-hours over 15 h.
        assert!((u.gpus_allocated - 25.0 / 15.0).abs() < 1e-9, "{u:?}");
        assert!((u.instances - 25.0 / 15.0).abs() < 1e-9);
        assert_eq!(u.memory_peak_bytes, 9 * GIB);
        assert_eq!(u.sm_p95, Some(0.2));
        assert!(u.used && u.sm_unknown_share.is_none());
    }

    #[test]
    fn a_mig_device_counts_its_part_of_the_gpu() {
        let mut gpm = rec("a", 0, H);
        (gpm.mig_profile, gpm.gpus_allocated) = (Some("3g.40gb".into()), None);
        gpm.sm_p95 = Some(70);
        let mut blind = rec("b", 0, H);
        blind.mig_profile = Some("2g.20gb".into());
        blind.sm_p95 = None;
        let u = aggregate(&[gpm, blind], window(0, 1), &Profiles::table());
        let u = &u[0];
        // 70 % of a 3-slice instance; its allocation, unknown, is what it held.
        assert!((u.sm_p95.unwrap() - 0.7 * 3.0 / 7.0).abs() < 1e-12, "{u:?}");
        assert!((u.sm_unknown_share.unwrap() - 2.0 / 7.0).abs() < 1e-12);
        assert!((u.gpus_allocated - (3.0 / 7.0 + 1.0)).abs() < 1e-12);
        assert_eq!(u.mig_profile.as_deref(), Some("3g.40gb"));
    }

    #[test]
    fn an_allocation_never_used_is_unused() {
        let mut idle = rec("a", 0, H);
        (idle.memory_peak_bytes, idle.sm_p95, idle.sm_max) = (0, None, Some(0));
        idle.gpu_seconds = Some(0.0);
        let u = &aggregate(&[idle.clone()], window(0, 1), &Profiles::table())[0];
        assert!(!u.used);
        assert!(
            u.sm_unknown_share.is_none(),
            "an idle stretch says nothing of SM"
        );
        let mut busy = idle;
        busy.sm_max = Some(1);
        assert!(aggregate(&[busy], window(0, 1), &Profiles::table())[0].used);
    }

    #[test]
    fn records_without_a_workload_group_by_pod_then_container_and_host_ones_go() {
        let mut pod = rec("p-1", 0, H);
        (pod.workload_kind, pod.workload) = (None, None);
        let mut docker = pod.clone();
        (docker.pod_uid, docker.pod_name, docker.namespace) = (None, None, None);
        docker.container_name = Some("trainer".into());
        let mut host = docker.clone();
        host.container_id = None;
        let mut outside = rec("late", 2 * H, 3 * H);
        outside.workload = Some("other".into());
        let u = aggregate(
            &[pod, docker, host, outside],
            window(0, 1),
            &Profiles::table(),
        );
        let keys: Vec<(&str, &str, &str)> = (u.iter())
            .map(|u| (&*u.key.namespace, &*u.key.workload_kind, &*u.key.workload))
            .collect();
        assert_eq!(keys, [("-", "Container", "trainer"), ("ml", "Pod", "p-1")]);
    }
}
