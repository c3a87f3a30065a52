//! The metadata task: refreshes names from the runtime (CRI, else Docker) when the pipeline
//! asks and on a timer, allocations from the kubelet's pod-resources on the timer, each
//! source backed off on its own, and publishes a new `Metadata` for the join.
use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::{atomic::Ordering::Relaxed, Arc, RwLock},
    time::{Duration, Instant},
};

use gpu_model::{Name, SourceStatus};
use tokio_util::sync::CancellationToken;

use super::{
    cri, docker,
    model::{ContainerNames, Metadata},
    owners, podresources,
    requests::NameRequest,
};
use crate::{config::MetadataConfig, stats::Stats};

pub const CRI_CANDIDATES: [&str; 6] = [
    "/run/containerd/containerd.sock",
    "/run/crio/crio.sock",
    "/run/k3s/containerd/containerd.sock",
    "/var/run/containerd/containerd.sock",
    "/var/run/crio/crio.sock",
    "/run/cri-dockerd.sock",
];

/// Listings that may miss a pending id before it is given up.
const PENDING_MISSES: u32 = 5;

/// One source's health, logged on change only ("logs once"). `ok` only after a call
/// succeeded; `not found` while there is no socket to call (and there never was);
/// `unavailable: <reason>` after a failed call, or when a socket that answered is gone.
#[derive(Debug, Default)]
struct Health {
    last: Option<SourceStatus>,
    ever_ok: bool,
    next_try: Option<Instant>,
    backoff: Duration,
}

impl Health {
    fn ok(&mut self, what: &str) {
        if matches!(self.last, Some(SourceStatus::Unavailable(_))) {
            tracing::info!("{what}: reachable again");
        }
        self.last = Some(SourceStatus::Ok);
        self.ever_ok = true;
        self.next_try = None;
        self.backoff = Duration::ZERO;
    }

    fn fail(&mut self, what: &str, err: String) {
        if self.last.as_ref().and_then(SourceStatus::reason) != Some(err.as_str()) {
            tracing::warn!("{what}: {err}; running on with container ids only, retrying");
        }
        self.last = Some(SourceStatus::Unavailable(err));
        self.backoff = (self.backoff * 2).clamp(Duration::from_secs(2), Duration::from_secs(60));
        self.next_try = Some(Instant::now() + self.backoff);
    }

    /// No socket (`place` says where it was looked for): never there is `not found`; gone
    /// after answering is a failure.
    fn missing(&mut self, what: &str, place: &str) {
        if self.ever_ok {
            self.fail(what, format!("{place}: socket gone"));
        } else {
            if self.last != Some(SourceStatus::NotFound) {
                tracing::info!("{what}: no socket at {place}; not used until one appears");
            }
            self.last = Some(SourceStatus::NotFound);
        }
    }

    fn failing(&self) -> bool {
        matches!(self.last, Some(SourceStatus::Unavailable(_)))
    }

    fn may_try(&self) -> bool {
        self.next_try.is_none_or(|t| Instant::now() >= t)
    }

    fn status(&self) -> SourceStatus {
        self.last.clone().unwrap_or(SourceStatus::Starting)
    }
}

/// The metadata owner: refreshes on request (an unknown container id appeared) and on a
/// slow timer (allocations), and publishes an immutable `Metadata`.
pub struct MetadataSource {
    cfg: MetadataConfig,
    published: Arc<RwLock<Arc<Metadata>>>,
    cri: Health,
    podres: Health,
    docker: Health,
    last_cri_list: Option<Instant>,
    /// The CRI runtime's name (its `Version` answer), asked once per connection.
    cri_runtime: Option<&'static str>,
    /// Ids asked about that no source could name yet, with how many answered listings
    /// did not know them: retried on the timer, given up after a few.
    pending: Vec<(String, u32)>,
    /// Where each source's health ("cri", "pod_resources", "docker") and the count of
    /// names known are shown (/debug/stats).
    stats: Arc<Stats>,
    /// Containers the runtime named: forgotten when a listing no longer has them.
    from_cri: HashSet<Name>,
    /// Containers Docker named: asked again on the timer, forgotten once Docker says gone.
    from_docker: HashSet<String>,
    /// Each pod sandbox's owner, from the last `ListPodSandbox`.
    owners: owners::PodOwners,
}

impl MetadataSource {
    pub fn new(cfg: MetadataConfig, stats: Arc<Stats>) -> MetadataSource {
        MetadataSource {
            cfg,
            published: Arc::new(RwLock::new(Arc::new(Metadata::default()))),
            cri: Health::default(),
            podres: Health::default(),
            docker: Health::default(),
            last_cri_list: None,
            cri_runtime: None,
            pending: vec![],
            stats,
            from_cri: HashSet::new(),
            from_docker: HashSet::new(),
            owners: Default::default(),
        }
    }

    pub fn published(&self) -> Arc<RwLock<Arc<Metadata>>> {
        self.published.clone()
    }

    fn cri_socket(&self) -> Option<PathBuf> {
        self.cfg.cri_socket.clone().or_else(|| {
            CRI_CANDIDATES
                .iter()
                .map(PathBuf::from)
                .find(|p| p.exists())
        })
    }

    /// Re-reads names for `unknown` container ids (and everything else the runtime lists).
    pub async fn refresh_names(&mut self, unknown: &[String]) {
        // A set, not a scan of the pending per id: a node no runtime names asks about all
        // its containers (2,000 on the large node) once a minute.
        let pending: HashSet<&str> = self.pending.iter().map(|(p, _)| p.as_str()).collect();
        // Ids the join asked about before a listing that named them came out: named now.
        // Kept pending, they cost the timer a listing of every container 30 s later (130
        // ms on the large node's 9,000).
        let named = self.published.read().unwrap().clone();
        let unnamed: Vec<&String> = (unknown.iter())
            .filter(|id| named.names_of(id).is_none())
            .collect();
        if !unknown.is_empty() && unnamed.is_empty() {
            return;
        }
        let new: Vec<String> = (unnamed.into_iter())
            .filter(|id| !pending.contains(id.as_str()))
            .cloned()
            .collect();
        self.pending.extend(new.into_iter().map(|id| (id, 0)));
        // A burst of unknown ids costs one listing, not one per id.
        if self
            .last_cri_list
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        let mut md = (**self.published.read().unwrap()).clone();
        let mut still_unknown: Vec<String> =
            self.pending.iter().map(|(id, _)| id.clone()).collect();
        let answered = self.names_from_cri(&mut md, &mut still_unknown).await;
        self.names_from_docker(&mut md, &still_unknown).await;
        // Ids nobody could name (sources down, or a container no runtime knows) are retried
        // a bounded number of times: pending is capped.
        self.pending.retain(|(id, _)| md.names_of(id).is_none());
        if answered {
            for (_, misses) in &mut self.pending {
                *misses += 1;
            }
            // Not a container any source knows (a plain runc or LXC cgroup): stop asking.
            self.pending.retain(|(_, misses)| *misses < PENDING_MISSES);
        }
        if self.pending.len() > 1024 {
            self.pending.drain(..self.pending.len() - 1024);
        }
        self.publish(md);
    }

    /// One CRI listing: every container's names (with the runtime's name), and those it no
    /// longer lists forgotten; asks for ids not listed, drops what it named from
    /// `still_unknown`. Whether the runtime answered.
    async fn names_from_cri(&mut self, md: &mut Metadata, still_unknown: &mut Vec<String>) -> bool {
        let Some(sock) = self.cri_socket() else {
            self.cri_runtime = None;
            self.cri
                .missing("CRI", "the usual containerd and CRI-O paths");
            return false;
        };
        if !sock.exists() {
            self.cri_runtime = None;
            let place = sock.display().to_string();
            self.cri.missing(&format!("CRI at {place}"), &place);
            return false;
        }
        if !self.cri.may_try() {
            return false;
        }
        self.last_cri_list = Some(Instant::now());
        let list = match cri::list(&sock).await {
            Ok(list) => list,
            Err(e) => {
                self.cri_runtime = None;
                self.cri.fail(&format!("CRI at {}", sock.display()), e);
                return false;
            }
        };
        self.cri.ok("CRI");
        if self.cri_runtime.is_none() {
            match cri::runtime_name(&sock).await {
                Ok(r) => self.cri_runtime = Some(r),
                Err(e) => tracing::debug!("CRI Version: {e}"),
            }
        }
        self.owners.refresh(&sock, &list).await;
        // Ids and names shared: a known id's own, and one copy of each name the listing
        // repeats (a pod's namespace, name and uid in each of its containers).
        let mut interned: rustc_hash::FxHashSet<Name> = Default::default();
        let listed: HashSet<Name> = list
            .into_iter()
            .map(|c| {
                let (id, mut names) = (c.id, c.names);
                let id = md.known_id(&id).map_or_else(|| Name::from(id), Name::clone);
                names.runtime = self.cri_runtime;
                names.workload = self.owners.of_sandbox(&c.sandbox);
                share_names(&mut names, &mut interned);
                md.learn(id.clone(), names);
                id
            })
            .collect();
        // Removed containers: their names go, so the map holds what exists.
        for gone in self.from_cri.difference(&listed) {
            md.forget(gone);
        }
        self.from_cri = listed;
        still_unknown.retain(|id| md.names_of(id).is_none());
        // Not listed (e.g. already removed): ask for its status directly.
        for id in still_unknown.clone() {
            if let Ok(Some(mut names)) = cri::status(&sock, &id).await {
                names.runtime = self.cri_runtime;
                names.workload = names.pod_uid.as_deref().and_then(|u| self.owners.of_pod(u));
                md.learn(id.as_str().into(), names);
                still_unknown.retain(|u| u != &id);
            }
        }
        true
    }

    /// The Docker API for ids the runtime did not name; a ping when there is nothing to
    /// ask, so that its status is `ok` only after a call.
    async fn names_from_docker(&mut self, md: &mut Metadata, still_unknown: &[String]) {
        let sock = self.cfg.docker_socket.clone();
        let what = format!("Docker at {}", sock.display());
        if !sock.exists() {
            self.docker.missing(&what, &sock.display().to_string());
            return;
        }
        if !self.docker.may_try() {
            return;
        }
        if still_unknown.is_empty() {
            if self.docker.last.is_none() || self.docker.failing() {
                match docker::ping(&sock).await {
                    Ok(()) => self.docker.ok(&what),
                    Err(e) => self.docker.fail(&what, e),
                }
            }
            return;
        }
        for id in still_unknown {
            match docker::inspect(&sock, id).await {
                Ok(Some(names)) => {
                    self.docker.ok(&what);
                    md.learn(id.as_str().into(), names);
                    self.from_docker.insert(id.clone());
                }
                Ok(None) => {
                    self.docker.ok(&what);
                    if self.from_docker.remove(id) {
                        md.forget(id);
                    }
                }
                Err(e) => {
                    self.docker.fail(&what, e);
                    break;
                }
            }
        }
    }

    /// The timer's work: allocations, and names still pending after a failure.
    pub async fn tick(&mut self) {
        self.refresh_allocations().await;
        if !self.pending.is_empty() && self.cri.may_try() {
            self.refresh_names(&[]).await;
        }
    }

    /// Containers whose cgroups are gone: their names are forgotten.
    pub fn forget(&mut self, ids: &[String]) {
        let mut md = (**self.published.read().unwrap()).clone();
        for id in ids {
            self.from_cri.remove(id.as_str());
            self.from_docker.remove(id);
            md.forget(id);
        }
        self.publish(md);
    }

    /// Re-reads the kubelet's device allocations (device plugins and DRA claims) and the
    /// time-slicing replicas of each GPU.
    pub async fn refresh_allocations(&mut self) {
        let sock = self.cfg.pod_resources_socket.clone();
        let what = format!("kubelet pod-resources at {}", sock.display());
        if !sock.exists() {
            self.podres.missing(&what, &sock.display().to_string());
            self.report_health();
            return;
        }
        if !self.podres.may_try() {
            return;
        }
        match podresources::list(&sock).await {
            Ok(allocs) => {
                self.podres.ok(&what);
                // Older kubelets may not answer this one: the shares are then unknown.
                let replicas = podresources::replicas(&sock).await.unwrap_or_else(|e| {
                    tracing::debug!("{what}: {e}");
                    HashMap::new()
                });
                let published = self.published.read().unwrap().clone();
                // Unchanged (most refreshes): no copy, and the join keeps what it found.
                if published.holds(&allocs, &replicas) {
                    self.report_health();
                    return;
                }
                let mut md = (*published).clone();
                md.set_allocations(allocs);
                md.set_replicas(replicas);
                self.publish(md);
            }
            Err(e) => {
                self.podres.fail(&what, e);
                self.report_health();
            }
        }
    }

    fn publish(&self, md: Metadata) {
        *self.published.write().unwrap() = Arc::new(md);
        self.report_health();
    }

    fn report_health(&self) {
        let md = self.published.read().unwrap().clone();
        self.stats
            .metadata_names
            .store(md.names_len() as u64, Relaxed);
        self.stats.set_lengths(&[
            ("metadata_allocations", md.allocations().len()),
            ("metadata_allocated_ids", md.allocated_ids_len()),
            ("metadata_pending", self.pending.len()),
            ("metadata_from_cri", self.from_cri.len()),
            ("metadata_from_docker", self.from_docker.len()),
            ("metadata_pod_owners", self.owners.kept()),
        ]);
        let mut st = self.stats.metadata.write().unwrap();
        st.insert("cri".into(), self.cri.status());
        st.insert("pod_resources".into(), self.podres.status());
        st.insert("docker".into(), self.docker.status());
    }
}

/// The names of `n` that `seen` holds already take its copy; the others go into it.
fn share_names(n: &mut ContainerNames, seen: &mut rustc_hash::FxHashSet<Name>) {
    let names = [
        &mut n.namespace,
        &mut n.pod_name,
        &mut n.pod_uid,
        &mut n.container_name,
    ];
    for name in names.into_iter().flatten() {
        match seen.get(&**name) {
            Some(same) => *name = same.clone(),
            None => {
                seen.insert(name.clone());
            }
        }
    }
}

/// Runs the metadata source until `stop`: refreshes names when asked, allocations on a timer.
pub async fn run(
    mut src: MetadataSource,
    mut requests: tokio::sync::mpsc::Receiver<NameRequest>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(src.cfg.allocation_interval());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Names of the containers that exist at start-up, once.
    src.refresh_names(&[]).await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => src.tick().await,
            Some(r) = requests.recv() => match r {
                NameRequest::Unknown(ids) => src.refresh_names(&ids).await,
                NameRequest::Gone(ids) => src.forget(&ids),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listings_repeated_names_are_one_copy() {
        let names = |c: &str| ContainerNames {
            namespace: Some("ml".into()),
            pod_name: Some("p".into()),
            pod_uid: Some("u".into()),
            container_name: Some(c.into()),
            runtime: None,
            workload: None,
        };
        let mut seen = Default::default();
        let (mut a, mut b) = (names("main"), names("side"));
        share_names(&mut a, &mut seen);
        share_names(&mut b, &mut seen);
        let same = |x: &Option<Name>, y: &Option<Name>| {
            Arc::ptr_eq(x.as_ref().unwrap(), y.as_ref().unwrap())
        };
        assert!(same(&a.namespace, &b.namespace));
        assert!(same(&a.pod_name, &b.pod_name));
        assert!(same(&a.pod_uid, &b.pod_uid));
        assert!(!same(&a.container_name, &b.container_name));
        assert_eq!((a, b), (names("main"), names("side")), "the same names");
    }
}
