//! The metadata as the join reads it: each container's names, the kubelet's allocations
//! and the time-slicing replicas, with the indexes that make the join's per-container
//! lookups cheap. A value: the task in `sources.rs` changes a copy and publishes it whole.
use std::{
    collections::HashMap,
    sync::{atomic::Ordering, Arc},
};

use gpu_model::{DraDevice, Name, Workload};
use serde::Serialize;

use super::devices::{parse_device_id, parse_dra_device, DeviceRef};

/// What the runtime says about one container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ContainerNames {
    pub pod_name: Option<Name>,
    pub namespace: Option<Name>,
    pub container_name: Option<Name>,
    pub pod_uid: Option<Name>,
    /// The runtime that named it: CRI's `Version` answer, or `docker`.
    pub runtime: Option<&'static str>,
    /// Its pod's owner, one `Arc` for every container of the pod; None where the runtime
    /// lists no pod sandboxes (Docker, a CRI without `ListPodSandbox`).
    pub workload: Option<Arc<Workload>>,
}

/// The kubelet's allocation of devices to one container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Allocation {
    pub namespace: String,
    pub pod_name: String,
    pub container_name: String,
    pub resource_name: String,
    /// As the device plugin names them: `GPU-<uuid>`, `MIG-<uuid>`, an index, with an
    /// optional `::N` time-slicing replica suffix, or GKE's `nvidia0/gi0`. For a DRA
    /// claim: its one device, as NVIDIA's DRA driver names it (`gpu-0`,
    /// `gpu-0-mig-1g10gb-19-0`; `devices::parse_dra_device`).
    pub device_ids: Vec<Name>,
    /// The DRA claim's device this allocation is (one per `ClaimResource`); None for device
    /// plugins.
    pub claim: Option<Arc<DraDevice>>,
}

impl Allocation {
    /// The devices as the join can match them.
    pub fn device_refs(&self) -> impl Iterator<Item = DeviceRef> + '_ {
        self.device_ids.iter().filter_map(|id| match self.claim {
            Some(_) => parse_dra_device(id),
            None => parse_device_id(id),
        })
    }

    /// How many time-slicing replicas of GPU `uuid` it holds (`<uuid>::N` ids).
    pub fn replicas_of(&self, uuid: &str) -> u32 {
        self.device_ids
            .iter()
            .filter(|id| id.split_once("::").is_some_and(|(u, _)| u == uuid))
            .count() as u32
    }
}

/// The latest metadata, published to the join.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Metadata {
    /// Fx: looked up by 64-character container id for every container every cycle. Shared
    /// with the copies that the refreshes make (`Arc::make_mut` copies it for a change): the
    /// allocations' refresh every 30 s copied the names of every container the runtime
    /// lists, 9,000 on the large node. Keyed by a shared id, which `MetadataSource` keeps
    /// too.
    names: Arc<rustc_hash::FxHashMap<Name, ContainerNames>>,
    /// The kubelet's allocations (`set_allocations`).
    allocations: Vec<Allocation>,
    /// Where each container's allocations are in `allocations`, by `container_key`: the
    /// join looks a container's up every cycle, and a scan of every allocation for each
    /// container made the join 20.6 ms a cycle at 2,000 allocated containers, against
    /// 2.5-2.9 ms with it (`cargo bench -p agent --bench join -- --named`).
    #[serde(skip)]
    by_container: rustc_hash::FxHashMap<u64, Vec<u32>>,
    /// Each allocation's devices as the join matches them, parsed once per listing.
    #[serde(skip)]
    refs: Vec<Vec<DeviceRef>>,
    /// The ids of the containers allocated a device, by `container_key` of their names: to
    /// name allocated-but-idle containers. Only the allocated ones: a map of every
    /// container's names to its id held about 2 MB on a node of 9,000 containers.
    #[serde(skip)]
    allocated_ids: rustc_hash::FxHashMap<u64, Name>,
    /// How many containers hold each DRA claim's device (`claim_holders`).
    #[serde(skip)]
    holders: HashMap<Arc<DraDevice>, u32>,
    /// Time-slicing replicas per GPU UUID (the kubelet's allocatable `<uuid>::N` devices).
    replicas: HashMap<String, u32>,
    /// Set anew by every change of the above (each goes through a method here), and unique
    /// to it (`generation`).
    #[serde(skip)]
    generation: u64,
}

/// The last generation given to a change of any `Metadata`.
static GENERATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Metadata {
    /// What a runtime says about container `id`. The same names again change nothing: a
    /// listing of unchanged containers neither copies the map shared with the published
    /// metadata nor replaces its names.
    pub fn learn(&mut self, id: Name, names: ContainerNames) {
        if self.names.get(&id) == Some(&names) {
            return;
        }
        self.changed();
        if let Some(key) = names_key(&names).filter(|k| self.by_container.contains_key(k)) {
            self.allocated_ids.insert(key, id.clone());
        }
        Arc::make_mut(&mut self.names).insert(id, names);
    }

    /// Forgets a container: its names, and its id among the allocated where it is still
    /// the one of its names (a restarted container's new id keeps them). One lookup, not a
    /// scan of every id per forgotten one: a listing that finds hundreds gone on a node of
    /// thousands was quadratic.
    pub(super) fn forget(&mut self, id: &str) {
        // Looked up first: an unknown id must not copy the map shared with the published one.
        let Some(key) = self.names.get(id).map(names_key) else {
            return;
        };
        self.changed();
        Arc::make_mut(&mut self.names).remove(id);
        if let Some(key) = key.filter(|k| self.allocated_ids.get(k).is_some_and(|v| &**v == id)) {
            self.allocated_ids.remove(&key);
        }
    }

    /// How many allocated containers' ids are kept.
    pub fn allocated_ids_len(&self) -> usize {
        self.allocated_ids.len()
    }

    /// The id of the container with these names, where it was allocated a device.
    pub fn allocated_id(&self, namespace: &str, pod: &str, container: &str) -> Option<&Name> {
        let id = self
            .allocated_ids
            .get(&container_key(namespace, pod, container))?;
        // A key is a hash: the id is that of these names.
        let n = self.names.get(id)?;
        (n.namespace.as_deref() == Some(namespace)
            && n.pod_name.as_deref() == Some(pod)
            && n.container_name.as_deref() == Some(container))
        .then_some(id)
    }

    pub fn names_of(&self, container_id: &str) -> Option<&ContainerNames> {
        self.names.get(container_id)
    }

    /// How many containers are named.
    pub fn names_len(&self) -> usize {
        self.names.len()
    }

    /// The map's own copy of a known container id, for a listing to share.
    pub(super) fn known_id(&self, id: &str) -> Option<&Name> {
        self.names.get_key_value(id).map(|(k, _)| k)
    }

    /// Time-slicing replicas of GPU `uuid` the kubelet can allocate (0: not time-sliced).
    pub fn replicas_of(&self, uuid: &str) -> u32 {
        self.replicas.get(uuid).copied().unwrap_or(0)
    }

    pub fn set_replicas(&mut self, replicas: HashMap<String, u32>) {
        self.changed();
        self.replicas = replicas;
    }

    /// Which change of the metadata this is: equal generations hold equal metadata (one
    /// copy's and its clones'), so what the join derives from it can be kept while the
    /// generation stays.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn changed(&mut self) {
        self.generation = GENERATIONS.fetch_add(1, Ordering::Relaxed) + 1;
    }

    pub fn allocations(&self) -> &[Allocation] {
        &self.allocations
    }

    /// Each allocation's devices as the join matches them, in `allocations`' order.
    pub fn refs(&self) -> &[Vec<DeviceRef>] {
        &self.refs
    }

    /// Whether a listing says what this holds already.
    pub(super) fn holds(
        &self,
        allocations: &[Allocation],
        replicas: &HashMap<String, u32>,
    ) -> bool {
        self.allocations == allocations && self.replicas == *replicas
    }

    pub fn set_allocations(&mut self, allocations: Vec<Allocation>) {
        self.changed();
        self.refs = allocations
            .iter()
            .map(|a| a.device_refs().collect())
            .collect();
        self.by_container.clear();
        for (i, a) in allocations.iter().enumerate() {
            let key = container_key(&a.namespace, &a.pod_name, &a.container_name);
            self.by_container.entry(key).or_default().push(i as u32);
        }
        self.holders.clear();
        for a in &allocations {
            if let Some(d) = &a.claim {
                *self.holders.entry(d.clone()).or_default() += 1;
            }
        }
        self.allocations = allocations;
        // Once per listing (every 30 s): one hash of each container's names.
        self.allocated_ids = self
            .names
            .iter()
            .filter_map(|(id, n)| {
                let key = names_key(n).filter(|k| self.by_container.contains_key(k))?;
                Some((key, id.clone()))
            })
            .collect();
    }

    /// How many containers the kubelet lists holding DRA claim device `d`: a claim shared by
    /// several pods (time-slicing or MPS in its config), or by several containers of one,
    /// names the same device in each (at least 1).
    pub fn claim_holders(&self, d: &DraDevice) -> u32 {
        self.holders.get(d).copied().unwrap_or(0).max(1)
    }

    /// Whether the kubelet lists any device of a DRA claim.
    pub fn has_claims(&self) -> bool {
        !self.holders.is_empty()
    }

    /// How many of GPU `uuid`'s time-slicing replicas the container with these names holds.
    pub fn replicas_held(&self, namespace: &str, pod: &str, container: &str, uuid: &str) -> u32 {
        self.allocations_of(namespace, pod, container)
            .map(|(al, _)| al.replicas_of(uuid))
            .sum()
    }

    /// Allocations of the container with these names, in the kubelet's order, each with
    /// its devices as the join matches them (`Allocation::device_refs`).
    pub fn allocations_of<'a>(
        &'a self,
        namespace: &'a str,
        pod: &'a str,
        container: &'a str,
    ) -> impl Iterator<Item = (&'a Allocation, &'a [DeviceRef])> + 'a {
        let at = self
            .by_container
            .get(&container_key(namespace, pod, container));
        at.into_iter()
            .flatten()
            .map(|&i| (&self.allocations[i as usize], &self.refs[i as usize][..]))
            // A key is a hash: its allocations are those of these names.
            .filter(move |(a, _)| {
                a.namespace == namespace && a.pod_name == pod && a.container_name == container
            })
    }
}

/// A container's key among the allocations (`container_key`), where all its names are known.
fn names_key(n: &ContainerNames) -> Option<u64> {
    Some(container_key(
        n.namespace.as_ref()?,
        n.pod_name.as_ref()?,
        n.container_name.as_ref()?,
    ))
}

/// A container's key among the allocations: a hash of its names.
fn container_key(namespace: &str, pod: &str, container: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    (namespace, pod, container).hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forgotten_container_takes_its_allocated_id_unless_a_new_id_holds_it() {
        let names = |pod: &str| ContainerNames {
            namespace: Some("ml".into()),
            pod_name: Some(pod.into()),
            container_name: Some("main".into()),
            ..Default::default()
        };
        let alloc = |pod: &str| Allocation {
            namespace: "ml".into(),
            pod_name: pod.into(),
            container_name: "main".into(),
            device_ids: vec!["GPU-1".into()],
            ..Default::default()
        };
        let id =
            |md: &Metadata, pod: &str| md.allocated_id("ml", pod, "main").map(|n| n.to_string());
        let mut md = Metadata::default();
        // Named before the listing of allocations, and after it.
        md.learn("a".into(), names("p1"));
        md.set_allocations(vec![alloc("p1"), alloc("p2")]);
        md.learn("b".into(), names("p2"));
        md.learn("d".into(), names("p3"));
        assert_eq!(id(&md, "p1").as_deref(), Some("a"));
        assert_eq!(id(&md, "p3"), None, "not allocated: not indexed");
        md.forget("a");
        assert!(!md.names.contains_key("a"));
        assert_eq!(id(&md, "p1"), None);
        assert_eq!(id(&md, "p2").as_deref(), Some("b"));
        // b restarted as c under the same names; b's later forgetting leaves c's id.
        md.learn("c".into(), names("p2"));
        md.forget("b");
        assert_eq!(id(&md, "p2").as_deref(), Some("c"));
        md.forget("unknown");
        assert_eq!(md.names.len(), 2);
    }
    #[test]
    fn the_same_names_again_leave_the_shared_map_alone() {
        let names = ContainerNames {
            namespace: Some("ml".into()),
            pod_name: Some("p".into()),
            ..Default::default()
        };
        let mut md = Metadata::default();
        md.learn("a".into(), names.clone());
        let published = md.clone();
        md.learn("a".into(), names.clone());
        assert!(Arc::ptr_eq(&md.names, &published.names), "not copied");
        md.learn(
            "a".into(),
            ContainerNames {
                pod_uid: Some("u".into()),
                ..names
            },
        );
        assert!(!Arc::ptr_eq(&md.names, &published.names));
        assert_eq!(md.names["a"].pod_uid.as_deref(), Some("u"));
    }

    #[test]
    fn a_containers_allocations_are_found_by_its_names_and_follow_a_new_listing() {
        let alloc = |pod: &str, c: &str, dev: &str| Allocation {
            namespace: "ml".into(),
            pod_name: pod.into(),
            container_name: c.into(),
            resource_name: "nvidia.com/gpu".into(),
            device_ids: vec![dev.into()],
            claim: None,
        };
        let mut md = Metadata::default();
        md.set_allocations(vec![
            alloc("p1", "main", "GPU-1"),
            alloc("p2", "main", "GPU-2"),
            alloc("p1", "main", "GPU-3"),
            alloc("p1", "side", "GPU-4"),
        ]);
        let devices = |md: &Metadata, pod: &str, c: &str| -> Vec<String> {
            let of = md.allocations_of("ml", pod, c);
            of.flat_map(|(a, refs)| {
                assert!(refs.iter().eq(&a.device_refs().collect::<Vec<_>>()));
                a.device_ids.iter().map(|d| d.to_string())
            })
            .collect()
        };
        assert_eq!(devices(&md, "p1", "main"), ["GPU-1", "GPU-3"]);
        assert_eq!(devices(&md, "p1", "side"), ["GPU-4"]);
        assert!(devices(&md, "p3", "main").is_empty());
        assert!(md.allocations_of("other", "p1", "main").next().is_none());
        // A clone given a new listing, as the pod-resources refresh makes one.
        let mut next = md.clone();
        next.set_allocations(vec![alloc("p3", "main", "GPU-1")]);
        assert!(devices(&next, "p1", "main").is_empty());
        assert_eq!(devices(&next, "p3", "main"), ["GPU-1"]);
        assert_eq!(devices(&md, "p1", "main"), ["GPU-1", "GPU-3"]);
    }
}
