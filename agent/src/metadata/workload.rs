//! A pod's top-level owner, inferred on the node from what the runtime keeps of the pod:
//! the labels of its sandbox (the kubelet passes the pod's own labels to the runtime) and
//! its name. The controllers label their pods and name them after themselves, so the owner
//! can be told without asking the API server (no RBAC), and a wrong guess is documented
//! in docs/metrics.md ("Workloads"):
//!
//! - `pod-template-hash` H (the Deployment controller's): a pod named `<prefix>-H-<suffix>`
//!   belongs to Deployment `<prefix>` through ReplicaSet `<prefix>-H`; without `-H-` in its
//!   name, to the ReplicaSet named as the pod less its last `-segment`.
//! - `controller-revision-hash` with `statefulset.kubernetes.io/pod-name`: StatefulSet, the
//!   pod's name less its `-<ordinal>`.
//! - `controller-revision-hash` with `pod-template-generation`: DaemonSet, the pod's name
//!   less its random `-suffix`.
//! - `batch.kubernetes.io/job-name` (or the older `job-name`): that Job, and its CronJob
//!   where the Job's name ends in the CronJob controller's `-<scheduled minute>` suffix
//!   (`cronjob_of`).
//! - Anything else: the pod itself.
use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use gpu_model::{Workload, WorkloadKind};

pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
pub const CONTROLLER_REVISION_HASH: &str = "controller-revision-hash";
pub const STATEFULSET_POD_NAME: &str = "statefulset.kubernetes.io/pod-name";
pub const POD_TEMPLATE_GENERATION: &str = "pod-template-generation";
pub const JOB_NAME: &str = "batch.kubernetes.io/job-name";
pub const LEGACY_JOB_NAME: &str = "job-name";

/// The minutes since the Unix epoch a CronJob's Job name may end in: 2015-01-01 to
/// 2100-01-01, eight digits. The CronJob controller names each Job
/// `<cronjob>-<scheduled time in minutes since the epoch>` (getJobName).
pub const CRONJOB_MINUTES: std::ops::Range<u64> = 23_667_840..68_374_080;

/// The owner of pod `pod` whose sandbox has `labels`.
pub fn infer(labels: &HashMap<String, String>, pod: &str) -> Workload {
    let get = |k: &str| labels.get(k).map(String::as_str).filter(|v| !v.is_empty());
    let revision = get(CONTROLLER_REVISION_HASH).is_some();
    let owner = if let Some(hash) = get(POD_TEMPLATE_HASH) {
        replicaset(pod, hash)
    } else if revision && get(STATEFULSET_POD_NAME).is_some() {
        statefulset(pod)
    } else if revision && get(POD_TEMPLATE_GENERATION).is_some() {
        daemonset(pod)
    } else {
        get(JOB_NAME).or_else(|| get(LEGACY_JOB_NAME)).map(job)
    };
    owner.unwrap_or_else(|| of(WorkloadKind::Pod, pod))
}

fn of(kind: WorkloadKind, name: &str) -> Workload {
    Workload {
        kind,
        name: name.into(),
        replicaset: None,
        job: None,
    }
}

/// `name` less its last `-segment`, where both parts are there.
fn less_suffix(name: &str) -> Option<&str> {
    let (base, suffix) = name.rsplit_once('-')?;
    (!base.is_empty() && !suffix.is_empty()).then_some(base)
}

/// A Deployment's pod is `<deployment>-<hash>-<suffix>`: its ReplicaSet is
/// `<deployment>-<hash>`.
fn replicaset(pod: &str, hash: &str) -> Option<Workload> {
    let at = pod
        .rmatch_indices(hash)
        .map(|(i, _)| i)
        .find(|&i| i >= 2 && pod[..i].ends_with('-') && pod[i + hash.len()..].starts_with('-'));
    match at {
        Some(i) => Some(Workload {
            replicaset: Some(pod[..i + hash.len()].into()),
            ..of(WorkloadKind::Deployment, &pod[..i - 1])
        }),
        None => less_suffix(pod).map(|rs| of(WorkloadKind::ReplicaSet, rs)),
    }
}

/// A StatefulSet's pod is `<statefulset>-<ordinal>`.
fn statefulset(pod: &str) -> Option<Workload> {
    let (set, ordinal) = pod.rsplit_once('-')?;
    let ordinal = !ordinal.is_empty() && ordinal.bytes().all(|b| b.is_ascii_digit());
    (ordinal && !set.is_empty()).then(|| of(WorkloadKind::StatefulSet, set))
}

/// A DaemonSet's pod is `<daemonset>-<random suffix>`.
fn daemonset(pod: &str) -> Option<Workload> {
    less_suffix(pod).map(|ds| of(WorkloadKind::DaemonSet, ds))
}

/// Job `name`, or its CronJob's.
fn job(name: &str) -> Workload {
    match cronjob_of(name) {
        Some(cronjob) => Workload {
            job: Some(name.into()),
            ..of(WorkloadKind::CronJob, cronjob)
        },
        None => of(WorkloadKind::Job, name),
    }
}

/// The CronJob whose Job this is, where the name ends in `-<minutes>` in
/// `CRONJOB_MINUTES`. A Job made by hand with such a name (`backup-28948930`) is taken
/// for a CronJob's; a Job made from a CronJob by hand (`kubectl create job --from`) is
/// not.
pub fn cronjob_of(job: &str) -> Option<&str> {
    let (cronjob, minutes) = job.rsplit_once('-')?;
    let digits = minutes.len() == 8 && minutes.bytes().all(|b| b.is_ascii_digit());
    let minutes: u64 = minutes.parse().ok().filter(|_| digits)?;
    (CRONJOB_MINUTES.contains(&minutes) && !cronjob.is_empty()).then_some(cronjob)
}

/// Each pod sandbox's owner, kept from one listing to the next: the same owner is the
/// same `Arc`, so a container's names compare equal (and the join keeps them) while its
/// pod's owner holds, and every container of a pod shares one.
#[derive(Debug, Default)]
pub struct PodWorkloads {
    /// By sandbox id: the pod's uid, and its owner.
    by_sandbox: HashMap<String, (String, Arc<Workload>)>,
}

/// What the runtime says of one pod sandbox.
#[derive(Debug, Clone, Default)]
pub struct Sandbox {
    pub id: String,
    pub pod_uid: String,
    pub pod_name: String,
    pub labels: HashMap<String, String>,
}

impl PodWorkloads {
    /// A new listing of every sandbox: those no longer listed are forgotten.
    pub fn update(&mut self, sandboxes: Vec<Sandbox>) {
        let mut next = HashMap::with_capacity(sandboxes.len());
        for s in sandboxes {
            let pod = match s.labels.get("io.kubernetes.pod.name") {
                Some(label) if s.pod_name.is_empty() => label.as_str(),
                _ => s.pod_name.as_str(),
            };
            if pod.is_empty() {
                continue;
            }
            let w = infer(&s.labels, pod);
            let w = match self.by_sandbox.remove(&s.id) {
                Some((_, kept)) if *kept == w => kept,
                _ => Arc::new(w),
            };
            next.insert(s.id, (s.pod_uid, w));
        }
        self.by_sandbox = next;
    }

    /// How many sandboxes' owners are kept.
    pub fn kept(&self) -> usize {
        self.by_sandbox.len()
    }

    /// Whether sandbox `id` was listed.
    pub fn knows(&self, id: &str) -> bool {
        self.by_sandbox.contains_key(id)
    }

    /// Forgets the sandboxes not in `ids`.
    pub fn retain(&mut self, ids: &HashSet<&str>) {
        self.by_sandbox.retain(|id, _| ids.contains(id.as_str()));
    }

    /// The owner of the pod of sandbox `id`.
    pub fn of_sandbox(&self, id: &str) -> Option<Arc<Workload>> {
        self.by_sandbox.get(id).map(|(_, w)| w.clone())
    }

    /// The owner of the pod with uid `uid` (a scan: for the odd container a listing
    /// missed).
    pub fn of_pod(&self, uid: &str) -> Option<Arc<Workload>> {
        let mut all = self.by_sandbox.values();
        all.find(|(u, _)| !u.is_empty() && u == uid)
            .map(|(_, w)| w.clone())
    }
}

#[cfg(test)]
mod tests {
    use gpu_model::Name;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        (pairs.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// (kind, name, replicaset, job) of the owner inferred.
    fn owner(pairs: &[(&str, &str)], pod: &str) -> (WorkloadKind, String, String, String) {
        let w = infer(&labels(pairs), pod);
        let text = |n: Option<Name>| n.as_deref().unwrap_or_default().to_string();
        (w.kind, w.name.to_string(), text(w.replicaset), text(w.job))
    }

    fn is(
        kind: WorkloadKind,
        name: &str,
        rs: &str,
        job: &str,
    ) -> (WorkloadKind, String, String, String) {
        (kind, name.into(), rs.into(), job.into())
    }

    use WorkloadKind::*;

    #[test]
    fn a_deployments_pod_climbs_to_the_deployment_through_its_replicaset() {
        let hash = [("pod-template-hash", "6f7d9c5b4"), ("app", "vllm")];
        assert_eq!(
            owner(&hash, "vllm-llama3-8b-6f7d9c5b4-x2k8p"),
            is(Deployment, "vllm-llama3-8b", "vllm-llama3-8b-6f7d9c5b4", "")
        );
        // The hash elsewhere in the name too: the last one before the suffix counts.
        let h = [("pod-template-hash", "abc12")];
        assert_eq!(
            owner(&h, "abc12-web-abc12-q7wzn"),
            is(Deployment, "abc12-web", "abc12-web-abc12", "")
        );
        // A hash that is only a part of a segment is not climbed.
        assert_eq!(
            owner(&h, "web-xabc12-q7wzn"),
            is(ReplicaSet, "web-xabc12", "", "")
        );
    }

    #[test]
    fn a_hash_the_name_does_not_hold_is_a_replicasets_pod() {
        // A ReplicaSet made by hand with the label, or a name cut short by the API
        // server's 63 characters.
        let hash = [("pod-template-hash", "6f7d9c5b4")];
        assert_eq!(
            owner(&hash, "frontend-x2k8p"),
            is(ReplicaSet, "frontend", "", "")
        );
        // Nothing to take off: the pod itself.
        assert_eq!(owner(&hash, "frontend"), is(Pod, "frontend", "", ""));
        assert_eq!(owner(&hash, "-x2k8p"), is(Pod, "-x2k8p", "", ""));
        // At the very start of the name there is no Deployment before it.
        assert_eq!(
            owner(&hash, "6f7d9c5b4-x2k8p"),
            is(ReplicaSet, "6f7d9c5b4", "", "")
        );
    }

    #[test]
    fn a_statefulsets_pod_loses_its_ordinal() {
        let set = [
            ("controller-revision-hash", "whisper-large-v3-7c9d"),
            ("statefulset.kubernetes.io/pod-name", "whisper-large-v3-12"),
        ];
        assert_eq!(
            owner(&set, "whisper-large-v3-12"),
            is(StatefulSet, "whisper-large-v3", "", "")
        );
        // No ordinal: not a name the controller makes.
        assert_eq!(owner(&set, "whisper-x"), is(Pod, "whisper-x", "", ""));
        assert_eq!(owner(&set, "whisper"), is(Pod, "whisper", "", ""));
        // The pod-name label alone (no revision hash) says nothing.
        assert_eq!(owner(&set[1..], "db-0"), is(Pod, "db-0", "", ""));
    }

    #[test]
    fn a_daemonsets_pod_loses_its_random_suffix() {
        let ds = [
            ("controller-revision-hash", "5d8f7c"),
            ("pod-template-generation", "3"),
        ];
        assert_eq!(
            owner(&ds, "nvidia-device-plugin-daemonset-8mnpz"),
            is(DaemonSet, "nvidia-device-plugin-daemonset", "", "")
        );
        assert_eq!(owner(&ds, "plugin"), is(Pod, "plugin", "", ""));
        // The generation alone says nothing.
        assert_eq!(owner(&ds[1..], "a-b"), is(Pod, "a-b", "", ""));
        // Both StatefulSet and DaemonSet labels: the StatefulSet's is the more specific.
        let both = [ds[0], ds[1], ("statefulset.kubernetes.io/pod-name", "x-1")];
        assert_eq!(owner(&both, "x-1"), is(StatefulSet, "x", "", ""));
    }

    #[test]
    fn a_jobs_pod_is_its_jobs_and_a_cronjobs_job_climbs_to_the_cronjob() {
        let job = |name| {
            [
                ("batch.kubernetes.io/job-name", name),
                ("controller-uid", "u"),
            ]
        };
        assert_eq!(
            owner(&job("llama3-eval-7"), "llama3-eval-7-4xk2z"),
            is(Job, "llama3-eval-7", "", "")
        );
        // 2025-01-15T10:30Z is minute 28,948,930 of the epoch.
        assert_eq!(
            owner(&job("nightly-eval-28948930"), "nightly-eval-28948930-9cd7w"),
            is(CronJob, "nightly-eval", "", "nightly-eval-28948930")
        );
        // The older label, alone.
        assert_eq!(
            owner(&[("job-name", "backfill")], "backfill-abcde"),
            is(Job, "backfill", "", "")
        );
        // The newer label wins where both are there.
        let both = [("job-name", "old"), ("batch.kubernetes.io/job-name", "new")];
        assert_eq!(owner(&both, "new-x"), is(Job, "new", "", ""));
        // An empty label is no label.
        assert_eq!(owner(&[("job-name", "")], "p"), is(Pod, "p", "", ""));
    }

    #[test]
    fn only_a_scheduled_minute_makes_a_cronjobs_job() {
        assert_eq!(cronjob_of("report-28948930"), Some("report"));
        assert_eq!(cronjob_of("a-b-23667840"), Some("a-b"), "2015-01-01");
        assert_eq!(cronjob_of("x-23667839"), None, "before 2015");
        assert_eq!(
            cronjob_of("x-68374079"),
            Some("x"),
            "the last minute of 2099"
        );
        assert_eq!(cronjob_of("x-68374080"), None, "2100");
        assert_eq!(cronjob_of("x-2894893"), None, "seven digits");
        assert_eq!(cronjob_of("x-289489300"), None, "nine digits");
        assert_eq!(cronjob_of("x-2894893a"), None);
        assert_eq!(cronjob_of("x-+2894893"), None, "a sign is no digit");
        assert_eq!(cronjob_of("-28948930"), None, "no CronJob name");
        assert_eq!(cronjob_of("28948930"), None);
        assert_eq!(cronjob_of("manual-run-123"), None);
        // Where it is wrong: a Job made by hand and named like a CronJob's.
        assert_eq!(cronjob_of("x-12345678"), None, "1993: out of range");
        assert_eq!(cronjob_of("backup-28948930"), Some("backup"));
    }

    #[test]
    fn a_pod_no_controller_labels_is_its_own_owner() {
        let kubelet = [
            ("io.kubernetes.pod.name", "jupyter-alice"),
            ("io.kubernetes.pod.namespace", "research"),
            ("app", "notebook"),
        ];
        assert_eq!(
            owner(&kubelet, "jupyter-alice"),
            is(Pod, "jupyter-alice", "", "")
        );
        assert_eq!(
            owner(&[], "static-pod-node1"),
            is(Pod, "static-pod-node1", "", "")
        );
    }

    #[test]
    fn the_deployment_label_comes_before_the_others() {
        // A Deployment whose template carries a `job-name` label of its own.
        let l = [("pod-template-hash", "h1"), ("job-name", "x")];
        assert_eq!(
            owner(&l, "web-h1-abcde"),
            is(Deployment, "web", "web-h1", "")
        );
    }

    fn sandbox(id: &str, uid: &str, pod: &str, pairs: &[(&str, &str)]) -> Sandbox {
        Sandbox {
            id: id.into(),
            pod_uid: uid.into(),
            pod_name: pod.into(),
            labels: labels(pairs),
        }
    }

    #[test]
    fn a_pods_owner_is_one_arc_kept_while_it_holds() {
        let hash = [("pod-template-hash", "h1")];
        let mut pods = PodWorkloads::default();
        pods.update(vec![
            sandbox("s1", "u1", "web-h1-aaaaa", &hash),
            sandbox("s2", "u2", "solo", &[]),
        ]);
        let first = pods.of_sandbox("s1").unwrap();
        assert_eq!(first.kind, Deployment);
        assert!(Arc::ptr_eq(&first, &pods.of_pod("u1").unwrap()));
        assert_eq!(pods.of_pod("u2").unwrap().kind, Pod);
        // The same owner in the next listing: the same Arc.
        pods.update(vec![sandbox("s1", "u1", "web-h1-aaaaa", &hash)]);
        assert!(Arc::ptr_eq(&first, &pods.of_sandbox("s1").unwrap()));
        assert!(pods.of_sandbox("s2").is_none(), "no longer listed");
        assert!(pods.knows("s1") && !pods.knows("s2"));
        // Only the sandboxes of the containers listed are kept.
        pods.retain(&HashSet::from(["s3"]));
        assert!(!pods.knows("s1"));
        pods.update(vec![sandbox("s1", "u1", "web-h1-aaaaa", &hash)]);
        assert!(
            !Arc::ptr_eq(&first, &pods.of_sandbox("s1").unwrap()),
            "found anew"
        );
        // Another owner (a new sandbox with other labels): another Arc.
        pods.update(vec![sandbox(
            "s1",
            "u1",
            "web-h1-aaaaa",
            &[("job-name", "j")],
        )]);
        assert_eq!(pods.of_sandbox("s1").unwrap().kind, Job);
        assert!(pods.of_pod("").is_none());
    }

    #[test]
    fn a_sandbox_without_metadata_is_named_by_its_label_or_left_out() {
        let mut pods = PodWorkloads::default();
        pods.update(vec![
            sandbox("s1", "", "", &[("io.kubernetes.pod.name", "db-0")]),
            sandbox("s2", "", "", &[("app", "x")]),
        ]);
        assert_eq!(&*pods.of_sandbox("s1").unwrap().name, "db-0");
        assert!(pods.of_sandbox("s2").is_none());
    }
}
