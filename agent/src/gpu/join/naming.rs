//! Names and allocated devices of the join's entries, from the metadata, and kept per
//! owner from one cycle to the next while neither the metadata nor the sample's devices
//! change (`Naming`).
use std::{
    hash::{Hash, Hasher},
    sync::Arc,
};

use gpu_model::{ClaimDevice, ContainerUsage, Name, Workload};

use super::{
    ledger::Slot,
    owner::{set_name, DeviceNames, Owner},
    DeviceSample, GpuSample,
};
use crate::metadata::{DeviceRef, Metadata};

/// Each owner's names and allocated devices as the last cycle found them. On a named
/// node, finding them again every cycle (the names by 64-character id, the allocations
/// by names and each device by uuid, all in memory gone cold since the last cycle) was a
/// fifth of the agent's CPU time with 2,000 GPU containers named and allocated a device.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Naming {
    /// (the metadata's generation, `devices_signature` of the sample) that the entries
    /// were found under: either changes, and all are found again.
    found_under: (u64, u64),
    /// By the owner's ledger slot, with the owner it was found for: a cycle finds each
    /// owner's entry by index and pointer, where a map by owner hashed and compared ids
    /// in memory cold since the last cycle (a tenth of the large node's join).
    entries: Vec<Option<(Owner, Named)>>,
    /// How many entries there are.
    live: usize,
    /// No owner came, went or was named anew in the last `name_all`: the names present
    /// are those of the cycle before.
    stable: bool,
    /// The allocated-but-idle entries found last, named (`idle`).
    idle: Option<Vec<ContainerUsage>>,
}

/// What naming gave one owner's entry.
#[derive(Debug, Clone, PartialEq)]
struct Named {
    /// The entry's own pod uid and runtime (its cgroup's) that the names completed.
    pod_uid_before: Option<Name>,
    runtime_before: Option<&'static str>,
    pod_name: Option<Name>,
    namespace: Option<Name>,
    container_name: Option<Name>,
    pod_uid: Option<Name>,
    runtime: Option<&'static str>,
    allocated_gpus: Arc<[Name]>,
    allocated_device_ids: Arc<[Name]>,
    claims: Arc<[ClaimDevice]>,
    workload: Option<Arc<Workload>>,
    seen_ms: u64,
}

impl Named {
    fn of(c: &ContainerUsage, before: (Option<Name>, Option<&'static str>), now: u64) -> Named {
        Named {
            pod_uid_before: before.0,
            runtime_before: before.1,
            pod_name: c.pod_name.clone(),
            namespace: c.namespace.clone(),
            container_name: c.container_name.clone(),
            pod_uid: c.pod_uid.clone(),
            runtime: c.runtime,
            allocated_gpus: c.allocated_gpus.clone(),
            allocated_device_ids: c.allocated_device_ids.clone(),
            claims: c.claims.clone(),
            workload: c.workload.clone(),
            seen_ms: now,
        }
    }

    /// Found for an entry like `c` (the same cgroup's pod uid and runtime).
    fn fits(&self, c: &ContainerUsage) -> bool {
        gpu_model::same_opt(&self.pod_uid_before, &c.pod_uid) && self.runtime_before == c.runtime
    }

    /// Gives `c` these names, touching only those it does not hold already: the recycled
    /// entry of the same owner holds them all, cycle after cycle.
    fn apply(&self, c: &mut ContainerUsage) {
        set_name(&mut c.pod_name, self.pod_name.as_ref());
        set_name(&mut c.namespace, self.namespace.as_ref());
        set_name(&mut c.container_name, self.container_name.as_ref());
        set_name(&mut c.pod_uid, self.pod_uid.as_ref());
        c.runtime = self.runtime;
        set_list(&mut c.allocated_gpus, &self.allocated_gpus);
        set_list(&mut c.allocated_device_ids, &self.allocated_device_ids);
        set_list(&mut c.claims, &self.claims);
        set_workload(&mut c.workload, self.workload.as_ref());
    }
}

/// `set_name` for the pod's owner: one `Arc` per pod, the same cycle after cycle.
fn set_workload(slot: &mut Option<Arc<Workload>>, w: Option<&Arc<Workload>>) {
    match (slot.as_ref(), w) {
        (Some(a), Some(b)) if Arc::ptr_eq(a, b) => {}
        (None, None) => {}
        _ => *slot = w.cloned(),
    }
}

/// `set_name` for a list: two empty ones are the same, whichever allocation holds them.
fn set_list<T>(slot: &mut Arc<[T]>, list: &Arc<[T]>) {
    if !(Arc::ptr_eq(slot, list) || slot.is_empty() && list.is_empty()) {
        *slot = list.clone();
    }
}

/// Takes off the entry the names and allocations a recycled entry may still hold (those
/// of its owner two cycles ago), before they are found anew or where there are none:
/// `fill_entry` leaves them to the naming.
fn unnamed(c: &mut ContainerUsage) {
    for n in [&mut c.pod_name, &mut c.namespace, &mut c.container_name] {
        set_name(n, None);
    }
    set_workload(&mut c.workload, None);
    for a in [&mut c.allocated_gpus, &mut c.allocated_device_ids] {
        if !a.is_empty() {
            *a = Arc::default();
        }
    }
    if !c.claims.is_empty() {
        c.claims = Arc::default();
    }
}

impl Naming {
    /// Names the entries of `owners` (`name_and_allocate`), from what was found for the
    /// same owner (in the same ledger slot, `slots`) last cycle where it still holds.
    pub(super) fn name_all(
        &mut self,
        containers: &mut [ContainerUsage],
        owners: &[Option<Owner>],
        slots: &[Slot],
        metadata: &Metadata,
        sample: &GpuSample,
        names: &DeviceNames,
    ) {
        // Nothing named (no runtime answers): nothing to find, or to keep.
        if metadata.names_len() == 0 {
            containers.iter_mut().for_each(unnamed);
            self.clear();
            self.stable = false;
            return;
        }
        let under = (metadata.generation(), devices_signature(&sample.devices));
        let mut stable = under == self.found_under;
        if !stable {
            self.clear();
            self.found_under = under;
        }
        let now = sample.taken_at_ms;
        for ((c, owner), &slot) in containers.iter_mut().zip(owners).zip(slots) {
            let Some(owner) = owner else {
                unnamed(c);
                name_and_allocate(c, metadata, &sample.devices, names);
                continue;
            };
            let slot = slot as usize;
            if slot >= self.entries.len() {
                self.entries.resize(slot + 1, None);
            }
            match &mut self.entries[slot] {
                Some((o, n)) if (o.ptr_eq(owner) || o == owner) && n.fits(c) => {
                    // Another copy of the id (the cgroup's node made anew): this one is
                    // kept, so that the next cycle compares pointers, as the slots do.
                    if !o.ptr_eq(owner) {
                        *o = owner.clone();
                    }
                    n.apply(c);
                    n.seen_ms = now;
                }
                e => {
                    stable = false;
                    let before = (c.pod_uid.clone(), c.runtime);
                    unnamed(c);
                    name_and_allocate(c, metadata, &sample.devices, names);
                    self.live += usize::from(e.is_none());
                    *e = Some((owner.clone(), Named::of(c, before, now)));
                }
            }
        }
        // Owners gone since: their entries go (a scan only when some are gone).
        if self.live > containers.len() {
            stable = false;
            for e in &mut self.entries {
                if e.as_ref().is_some_and(|(_, n)| n.seen_ms != now) {
                    *e = None;
                    self.live -= 1;
                }
            }
        }
        self.stable = stable;
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.live = 0;
    }

    /// The allocated-but-idle entries, named: those `find` gave last while the names
    /// present and the metadata are those it saw (its set of the names present cost a part of
    /// a named node's agent every cycle), else `find`'s anew.
    pub(super) fn idle(
        &mut self,
        find: impl FnOnce() -> Vec<ContainerUsage>,
    ) -> Vec<ContainerUsage> {
        match &self.idle {
            Some(idle) if self.stable => idle.clone(),
            _ => {
                let idle = find();
                self.idle = Some(idle.clone());
                idle
            }
        }
    }
}

/// What naming reads of the sample's devices: each one's index, minor number and uuid,
/// and its MIG devices' uuids and GPU instances (allocations name devices by any of
/// these). A MIG device made (dynamic MIG makes them as a claim is prepared) changes it,
/// and every allocation is matched again.
pub(super) fn devices_signature(devices: &[DeviceSample]) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    for d in devices {
        (d.index, d.sharing.minor_number, &d.uuid).hash(&mut h);
        for m in &d.mig_devices {
            (
                &m.uuid,
                m.gpu_instance.map(|g| (g.profile_id, g.placement_start)),
            )
                .hash(&mut h);
        }
    }
    h.finish()
}

/// The names the runtime gave the entry's container, where the entry has none of its own
/// (the cgroup's pod uid comes first).
pub fn name(c: &mut ContainerUsage, metadata: &Metadata) {
    if let Some(n) = c
        .container_id
        .as_deref()
        .and_then(|id| metadata.names_of(id))
    {
        c.pod_name = c.pod_name.take().or_else(|| n.pod_name.clone());
        c.namespace = c.namespace.take().or_else(|| n.namespace.clone());
        c.container_name = c.container_name.take().or_else(|| n.container_name.clone());
        c.pod_uid = c.pod_uid.take().or_else(|| n.pod_uid.clone());
        // The cgroupfs driver's paths do not name the runtime: the one that named it does.
        c.runtime = c.runtime.or(n.runtime);
        if c.workload.is_none() {
            c.workload = n.workload.clone();
        }
    }
}

/// Names from the runtime, and the devices the kubelet allocated, as UUIDs, with the DRA
/// claims they came through.
pub(super) fn name_and_allocate(
    c: &mut ContainerUsage,
    metadata: &Metadata,
    devices: &[DeviceSample],
    names: &DeviceNames,
) {
    name(c, metadata);
    let (Some(ns), Some(pod), Some(name)) = (&c.namespace, &c.pod_name, &c.container_name) else {
        return;
    };
    let mut uuids = vec![];
    let mut ids = vec![];
    let mut claims = vec![];
    for (a, refs) in metadata.allocations_of(ns, pod, name) {
        ids.extend(a.device_ids.iter().cloned());
        for r in refs {
            let Some(uuid) = resolve(r, devices, names) else {
                continue;
            };
            if let Some(dra) = &a.claim {
                claims.push(ClaimDevice {
                    uuid: uuid.clone(),
                    holders: metadata.claim_holders(dra),
                    dra: dra.clone(),
                });
            }
            if !uuids.contains(&uuid) {
                uuids.push(uuid);
            }
        }
    }
    uuids.sort();
    c.allocated_gpus = uuids.into();
    c.allocated_device_ids = ids.into();
    c.claims = claims.into();
}

/// The device `r` names, as the sample's own shared name where it is one of its devices (later
/// comparisons are a pointer's). A UUID is taken as it is, listed or not; an index, a minor
/// number or a MIG device's DRA key only where the sample has that device.
fn resolve(r: &DeviceRef, devices: &[DeviceSample], names: &DeviceNames) -> Option<Name> {
    match *r {
        DeviceRef::Uuid(ref u) => Some(
            names
                .lookup(u)
                .map_or_else(|| u.clone(), |(_, n)| n.clone()),
        ),
        DeviceRef::Index(i) => devices
            .iter()
            .position(|d| d.index == i)
            .map(|j| names.gpu(j).clone()),
        _ => locate(r, devices).map(|(i, mig)| match mig {
            Some(m) => devices[i].mig_devices[m].uuid.clone(),
            None => names.gpu(i).clone(),
        }),
    }
}

/// Where a device NVIDIA's DRA driver names is in the sample: its GPU's position, and its
/// position among the GPU's MIG devices for a MIG device. A GPU by its minor number; a MIG
/// device by its parent's minor number, its GPU instance's profile id and placement start.
pub(super) fn locate(r: &DeviceRef, devices: &[DeviceSample]) -> Option<(usize, Option<usize>)> {
    let gpu_of = |minor| (devices.iter()).position(|d| d.sharing.minor_number == Some(minor));
    match *r {
        DeviceRef::Minor(m) => gpu_of(m).map(|i| (i, None)),
        DeviceRef::Mig {
            parent_minor,
            profile_id,
            placement_start,
        } => {
            let i = gpu_of(parent_minor)?;
            let m = devices[i].mig_devices.iter().position(|m| {
                m.gpu_instance.is_some_and(|g| {
                    g.profile_id == profile_id && g.placement_start == placement_start
                })
            })?;
            Some((i, Some(m)))
        }
        DeviceRef::Uuid(_) | DeviceRef::Index(_) => None,
    }
}
