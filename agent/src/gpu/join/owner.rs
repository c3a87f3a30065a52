//! Who a GPU process is charged to (`Owner`), found from its placement in the process
//! state, and the sample's device names (`DeviceNames`): the types that the join, the
//! account pass, the naming and the sharing all use. Nothing here calls up into them.
use gpu_model::{ContainerUsage, GpuSample, MigSample, Name, ProcessSample};
use rustc_hash::{FxHashMap, FxHashSet};

use crate::process::Placement;

/// Who a GPU process is charged to. The ids are the cgroup registry's own: a clone is a
/// reference count, and two of the same cgroup compare by pointer.
#[derive(Debug, Clone, Eq, PartialOrd, Ord)]
pub enum Owner {
    Container(Name),
    Pod(Name),
    Host,
}

impl PartialEq for Owner {
    fn eq(&self, other: &Owner) -> bool {
        match (self, other) {
            (Owner::Container(a), Owner::Container(b)) | (Owner::Pod(a), Owner::Pod(b)) => {
                same(a, b)
            }
            (Owner::Host, Owner::Host) => true,
            _ => false,
        }
    }
}

impl Owner {
    /// The same owner, the very same name: no byte is read.
    pub fn ptr_eq(&self, other: &Owner) -> bool {
        match (self, other) {
            (Owner::Container(a), Owner::Container(b)) | (Owner::Pod(a), Owner::Pod(b)) => {
                std::sync::Arc::ptr_eq(a, b)
            }
            (Owner::Host, Owner::Host) => true,
            _ => false,
        }
    }
}

/// For the maps keyed by owner: a key is cloned only when an entry is made.
impl From<&Owner> for Owner {
    fn from(o: &Owner) -> Owner {
        o.clone()
    }
}

/// By content, as `eq` compares when the pointers differ, and as `OwnerKey` hashes, so
/// that either finds an owner.
impl std::hash::Hash for Owner {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        match self {
            Owner::Container(s) => OwnerKey(Some((true, s))).hash(h),
            Owner::Pod(s) => OwnerKey(Some((false, s))).hash(h),
            Owner::Host => OwnerKey(None).hash(h),
        }
    }
}

/// The grouping's key: the owner's kind (a container, else a pod) and id, borrowed; None
/// for the host.
#[derive(PartialEq, Eq)]
pub struct OwnerKey<'a>(pub Option<(bool, &'a str)>);

impl std::hash::Hash for OwnerKey<'_> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        match self.0 {
            Some((container, id)) => {
                h.write_u8(container as u8);
                h.write(id.as_bytes());
            }
            None => h.write_u8(2),
        }
    }
}

/// By pointer first: the key borrows the very name the owner holds, mostly.
impl hashbrown::Equivalent<Owner> for OwnerKey<'_> {
    fn equivalent(&self, o: &Owner) -> bool {
        let eq = |a: &str, b: &Name| std::ptr::eq(a, &**b) || a == &**b;
        match (self.0, o) {
            (Some((true, id)), Owner::Container(n)) | (Some((false, id)), Owner::Pod(n)) => {
                eq(id, n)
            }
            (None, Owner::Host) => true,
            _ => false,
        }
    }
}

pub use gpu_model::same;

/// Where `name` is in `names`: by pointer first, by content only where no pointer matches.
/// `same` in a scan compares the bytes of every name before the match; where the names
/// are shared, as the sample's devices' are, none is read.
pub(super) fn position_of<'a, I>(names: I, name: &Name) -> Option<usize>
where
    I: IntoIterator<Item = &'a Name>,
    I::IntoIter: Clone,
{
    let names = names.into_iter();
    (names.clone().position(|n| std::sync::Arc::ptr_eq(n, name)))
        .or_else(|| names.into_iter().position(|n| n == name))
}

/// A counters key, borrowed: it hashes and compares as the `(Owner, Name)` it stands for.
#[derive(Hash)]
pub struct KeyRef<'a>(pub &'a Owner, pub &'a Name);

impl hashbrown::Equivalent<(Owner, Name)> for KeyRef<'_> {
    fn equivalent(&self, key: &(Owner, Name)) -> bool {
        *self.0 == key.0 && same(self.1, &key.1)
    }
}

impl From<&KeyRef<'_>> for (Owner, Name) {
    fn from(k: &KeyRef<'_>) -> (Owner, Name) {
        (k.0.clone(), k.1.clone())
    }
}

/// What the cgroup says about an owner: its container's id and pod's UID.
#[derive(Debug, Clone, Default)]
pub struct OwnerMeta {
    pub container_id: Option<Name>,
    pub pod_uid: Option<Name>,
}

/// The MPS server's command as the kernel keeps it (15 characters of
/// `nvidia-cuda-mps-server`): infrastructure, not a workload.
pub const MPS_SERVER_COMM: &str = "nvidia-cuda-mps";

/// Is this the MPS server (its GPU memory is the clients' shared context)?
pub fn is_mps_server(comm: &str) -> bool {
    comm.starts_with(MPS_SERVER_COMM)
}

/// One sample's devices by position: each GPU's uuid and its MIG devices' uuids, as
/// shared names carried from the last cycle (`Counters::uuids` for a GPU; the sample's own
/// for a MIG device, which the NVML thread keeps), so that every entry and key made from
/// them this cycle costs no copy, and compares by pointer.
pub struct DeviceNames {
    devices: Vec<(Name, Vec<Name>)>,
    /// Each GPU's and MIG device's uuid, to its GPU's position: the allocated devices of
    /// every container are looked up by content each cycle, and a scan compared a uuid
    /// with up to 64 names (a seventh of the join with 2,000 allocated containers).
    by_uuid: FxHashMap<Name, usize>,
}

impl DeviceNames {
    pub fn new(sample: &GpuSample, last: &FxHashSet<Name>) -> DeviceNames {
        // A MIG device's uuid is shared already (the NVML thread keeps it, and its
        // processes point to it); a GPU's is a string of the sample's.
        let name = |u: &str| last.get(u).cloned().unwrap_or_else(|| u.into());
        let devices: Vec<(Name, Vec<Name>)> = sample
            .devices
            .iter()
            .map(|d| {
                let migs = d.mig_devices.iter().map(|m| m.uuid.clone()).collect();
                (name(&d.uuid), migs)
            })
            .collect();
        let mut by_uuid = FxHashMap::default();
        for (i, (g, migs)) in devices.iter().enumerate() {
            // The first of a uuid named twice, as a scan in order would find.
            for n in std::iter::once(g).chain(migs) {
                by_uuid.entry(n.clone()).or_insert(i);
            }
        }
        DeviceNames { devices, by_uuid }
    }

    /// The sample's GPU uuids: what the next cycle looks its GPUs' names up in.
    pub(super) fn set(&self) -> FxHashSet<Name> {
        self.devices.iter().map(|(g, _)| g.clone()).collect()
    }

    /// GPU `i`'s uuid.
    pub fn gpu(&self, i: usize) -> &Name {
        &self.devices[i].0
    }

    pub fn len(&self) -> usize {
        self.devices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The position of GPU `gpu` (by pointer for the sample's own names).
    pub fn gpu_index(&self, gpu: &Name) -> Option<usize> {
        position_of(self.devices.iter().map(|(g, _)| g), gpu)
    }

    /// The position of MIG device `uuid` among GPU `i`'s.
    pub fn mig_index(&self, i: usize, uuid: &Name) -> Option<usize> {
        position_of(&self.devices[i].1, uuid)
    }

    /// MIG device `uuid` of GPU `i`, as `sample` read it.
    pub fn mig<'s>(&self, sample: &'s GpuSample, i: usize, uuid: &Name) -> Option<&'s MigSample> {
        sample.devices[i].mig_devices.get(self.mig_index(i, uuid)?)
    }

    /// The device a process of GPU `i` is charged to: its MIG device, else the GPU.
    pub(super) fn of(&self, i: usize, p: &ProcessSample) -> Name {
        let (gpu, migs) = &self.devices[i];
        p.mig
            .and_then(|j| migs.get(usize::from(j)))
            .unwrap_or(gpu)
            .clone()
    }

    /// The position of the GPU that `uuid` is, or is a MIG device of, and its shared name.
    pub fn lookup(&self, uuid: &str) -> Option<(usize, &Name)> {
        self.by_uuid.get_key_value(uuid).map(|(n, &i)| (i, n))
    }

    /// `uuid` as a shared name: the sample's own where it is one of its devices.
    pub fn name(&self, uuid: &str) -> Name {
        self.lookup(uuid)
            .map_or_else(|| uuid.into(), |(_, n)| n.clone())
    }

    /// The GPU a MIG device belongs to; the uuid itself for a GPU or an unknown device.
    pub fn parent(&self, uuid: &Name) -> Name {
        match self.lookup(uuid) {
            Some((i, _)) => self.devices[i].0.clone(),
            None => uuid.clone(),
        }
    }
}

/// Who a placed process is charged to, and what its cgroup says about that owner.
pub fn owner_of(placed: Option<Placement<'_>>) -> (Owner, Option<OwnerMeta>) {
    (owner(placed), placed.and_then(meta_of))
}

/// `owner`, borrowed from the placement: whether a container (else a pod) and its name;
/// None for the host.
pub(super) fn owner_name<'a>(placed: Option<Placement<'a>>) -> Option<(bool, &'a Name)> {
    let c = placed.and_then(|pl| pl.container)?;
    match (&c.container_id, &c.pod_uid) {
        (Some(id), _) => Some((true, id)),
        (None, Some(uid)) => Some((false, uid)),
        _ => None,
    }
}

pub(super) fn owner(placed: Option<Placement<'_>>) -> Owner {
    match owner_name(placed) {
        Some((true, id)) => Owner::Container(id.clone()),
        Some((false, uid)) => Owner::Pod(uid.clone()),
        None => Owner::Host,
    }
}

/// What a placed process's cgroup says about its owner (shared names, no copies).
fn meta_of(pl: Placement<'_>) -> Option<OwnerMeta> {
    pl.container.map(|c| OwnerMeta {
        container_id: c.container_id.clone(),
        pod_uid: c.pod_uid.clone(),
    })
}

/// Sets a name, cloning it only when `slot` holds another: the entry a recycled snapshot
/// left in place holds the same names cycle after cycle, and neither their reference counts
/// nor the memory they sit in (cold a second later) are touched then.
pub(super) fn set_name(slot: &mut Option<Name>, name: Option<&Name>) {
    match (slot.as_ref(), name) {
        (Some(a), Some(b)) if std::sync::Arc::ptr_eq(a, b) => {}
        (None, None) => {}
        _ => *slot = name.cloned(),
    }
}

/// The devices entry `c` holds the allocation of and ran nothing on this cycle, as the
/// sample read them: (its GPU's position, the device's shared name). A device the sample
/// does not have (gone), or did not read (stalled, lost), says nothing of the allocation.
pub fn held_idle<'a>(
    c: &'a ContainerUsage,
    sample: &'a GpuSample,
    names: &'a DeviceNames,
) -> impl Iterator<Item = (usize, &'a Name)> + 'a {
    let used = |a: &Name| c.gpus.iter().any(|g| *g.uuid == **a || *g.gpu_uuid == **a);
    (c.allocated_gpus.iter())
        .filter(move |a| !used(a))
        .filter_map(|a| names.lookup(a))
        .filter(|(i, _)| sample.devices[*i].status.is_ok())
}

/// The owner a snapshot entry stands for; None for an allocated container nobody can
/// identify (no id: its names are all we have).
pub fn owner_key(c: &ContainerUsage) -> Option<Owner> {
    match (&c.container_id, &c.pod_uid) {
        (Some(id), _) => Some(Owner::Container(id.clone())),
        (None, Some(uid)) => Some(Owner::Pod(uid.clone())),
        (None, None) if c.pod_name.is_some() => None,
        (None, None) => Some(Owner::Host),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_found_by_pointer_first_and_by_content_otherwise() {
        let (a, b): (Name, Name) = ("MIG-a".into(), "MIG-b".into());
        let names = vec![a.clone(), b.clone()];
        assert_eq!(position_of(&names, &b), Some(1));
        assert_eq!(position_of(&names, &"MIG-b".into()), Some(1), "by content");
        assert_eq!(position_of(&names, &"MIG-c".into()), None);
        // Equal contents twice: the shared name is the one found.
        let twice = vec!["MIG-b".into(), b.clone()];
        assert_eq!(position_of(&twice, &b), Some(1));
    }
}
