//! What the join accounts to each container on each device besides its sampled use: its
//! share of the GPU's energy, its peak memory, its memory limit, NVML's accounting stats of
//! its exited processes, and the usage record of each stretch of use. Pure, like the join:
//! the carried state goes in and comes out in `Counters`.
use std::collections::{HashMap, HashSet, VecDeque};

use gpu_model::{
    AccountingSample, ContainerUsage, DeviceSample, GpuAccount, GpuSample, LimitSource, Name,
    UsageRecord,
};

use super::{
    join::{same, Accumulated, Counters, DeviceNames, KeyRef, Owner},
    spare::Spare,
};
use crate::metadata::{hami::HamiLimits, Metadata};

/// The largest value over a sliding window: a deque of decreasing values.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PeakWindow(VecDeque<(u64, u64)>);

impl PeakWindow {
    pub fn push(&mut self, t_ms: u64, v: u64, window_ms: u64) {
        while self.0.back().is_some_and(|(_, b)| *b <= v) {
            self.0.pop_back();
        }
        self.0.push_back((t_ms, v));
        let oldest = t_ms.saturating_sub(window_ms);
        while self.0.len() > 1 && self.0.front().is_some_and(|(t, _)| *t < oldest) {
            self.0.pop_front();
        }
    }

    pub fn max(&self) -> Option<u64> {
        self.0.front().map(|(_, v)| *v)
    }
}

/// Who a record names: the container's identity and names when the session last saw it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordNames {
    pub container_id: Option<Name>,
    pub pod_uid: Option<Name>,
    pub pod_name: Option<Name>,
    pub namespace: Option<Name>,
    pub container_name: Option<Name>,
}

impl RecordNames {
    /// Asked of every container each cycle: are these the container's names, the very
    /// same shared strings? Equal strings in other allocations (a runtime's names come anew
    /// with each metadata refresh) answer no, and the caller takes the container's: a
    /// comparison by content would read both strings every cycle from then on.
    pub fn shares(&self, c: &ContainerUsage) -> bool {
        let eq = |a: &Option<Name>, b: &Option<Name>| match (a, b) {
            (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
            (a, b) => a.is_none() && b.is_none(),
        };
        eq(&self.pod_name, &c.pod_name)
            && eq(&self.namespace, &c.namespace)
            && eq(&self.container_name, &c.container_name)
            && eq(&self.pod_uid, &c.pod_uid)
            && eq(&self.container_id, &c.container_id)
    }

    /// A record that names them, and nothing else yet.
    fn record(&self) -> UsageRecord {
        let text = |n: &Option<Name>| n.as_deref().map(str::to_string);
        UsageRecord {
            container_id: text(&self.container_id),
            pod_uid: text(&self.pod_uid),
            pod_name: text(&self.pod_name),
            namespace: text(&self.namespace),
            container_name: text(&self.container_name),
            ..Default::default()
        }
    }

    pub fn of(c: &ContainerUsage) -> RecordNames {
        RecordNames {
            container_id: c.container_id.clone(),
            pod_uid: c.pod_uid.clone(),
            pod_name: c.pod_name.clone(),
            namespace: c.namespace.clone(),
            container_name: c.container_name.clone(),
        }
    }
}

/// One stretch of use of a device by a container: from its first process there to its
/// last. The totals at its start, to subtract at its end.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Session {
    /// The physical GPU of the device.
    pub gpu_uuid: Name,
    pub start_ms: u64,
    pub end_ms: u64,
    pub gpu_seconds: f64,
    pub byte_seconds: f64,
    pub energy_j: f64,
    pub accounted_processes: u64,
    pub accounted_gpu_seconds: f64,
    pub peak: u64,
    pub names: RecordNames,
}

/// Per (owner, device): what this module carries across cycles, and the join's
/// cumulative counters (`acc`: None until the owner used the device, and again once they
/// were forgotten).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ledger {
    pub acc: Option<Accumulated>,
    pub energy_j: f64,
    pub energy_since_ms: u64,
    /// Last cycle that charged it anything (energy, accounting), ms.
    pub last_charged_ms: u64,
    /// Last cycle the owner had a process on the device, ms.
    pub last_used_ms: u64,
    pub accounted_processes: u64,
    pub accounted_gpu_seconds: f64,
    pub peak: PeakWindow,
    pub session: Option<Session>,
}

/// An owner's ledgers: one per device.
pub type Devices = Vec<(Name, Ledger)>;

/// Where an owner's ledgers sit in `Ledgers`: stable while the owner has any, so that
/// each pass of a cycle reaches them without a lookup.
pub type Slot = u32;

/// Ledgers by owner, then by device: at most one hash lookup per owner a cycle (the
/// grouping's, where its hint from the cycle before does not hold), which hands out the
/// owner's `Slot`, and a short scan of its few devices. The counters were a map of their
/// own, looked up per (owner, device) each cycle: 7 % of the large node's agent, each
/// lookup a cache miss in memory gone cold since the cycle before.
#[derive(Debug, Clone, Default)]
pub struct Ledgers {
    index: hashbrown::HashMap<Owner, Slot, rustc_hash::FxBuildHasher>,
    /// (owner, its devices) by slot; a freed slot has neither and waits in `free`.
    slots: Vec<(Option<Owner>, Devices)>,
    free: Vec<Slot>,
}

/// The same ledgers of the same owners, wherever their slots are (an owner with none, just
/// given its slot, counts as absent).
impl PartialEq for Ledgers {
    fn eq(&self, other: &Ledgers) -> bool {
        let held = |l: &Ledgers| l.slots.iter().filter(|(_, v)| !v.is_empty()).count();
        held(self) == held(other)
            && self.index.iter().all(|(o, &s)| {
                let mine = &self.slots[s as usize].1;
                let theirs = other.index.get(o).map(|&t| &other.slots[t as usize].1);
                mine.is_empty() || theirs == Some(mine)
            })
    }
}

impl Ledgers {
    pub fn get(&self, owner: &Owner, uuid: &Name) -> Option<&Ledger> {
        let devices = &self.slots[*self.index.get(owner)? as usize].1;
        Some(&devices[position(devices, uuid)?].1)
    }

    pub fn get_mut(&mut self, owner: &Owner, uuid: &Name) -> Option<&mut Ledger> {
        let devices = &mut self.slots[*self.index.get(owner)? as usize].1;
        let i = position(devices, uuid)?;
        Some(&mut devices[i].1)
    }

    /// Whether `slot` is that of the owner named (`join::owner_name`: a container, else a
    /// pod, and its id; None for the host) by this very name, not an equal one.
    pub fn holds(&self, slot: Slot, name: Option<(bool, &Name)>) -> bool {
        let owner = self.slots.get(slot as usize).and_then(|(o, _)| o.as_ref());
        match (owner, name) {
            (Some(Owner::Container(a)), Some((true, b)))
            | (Some(Owner::Pod(a)), Some((false, b))) => std::sync::Arc::ptr_eq(a, b),
            (Some(Owner::Host), None) => true,
            _ => false,
        }
    }

    /// Makes `slot`'s owner this very name (`holds`), where it holds another copy of it:
    /// `owner` makes it (a reference count).
    pub fn adopt(
        &mut self,
        slot: Slot,
        name: Option<(bool, &Name)>,
        owner: impl FnOnce() -> Owner,
    ) {
        if !self.holds(slot, name) {
            if let Some((o, _)) = self.slots.get_mut(slot as usize) {
                *o = Some(owner());
            }
        }
    }

    /// The owner's slot, if it has one.
    pub fn find(&self, owner: &Owner) -> Option<Slot> {
        self.index.get(owner).copied()
    }

    /// The owner's slot, made on first use: `key` is the owner, borrowed, and `owner` makes
    /// it (cloned, a reference count) only for a new one.
    pub fn slot<Q>(&mut self, key: &Q, owner: impl FnOnce() -> Owner) -> Slot
    where
        Q: std::hash::Hash + hashbrown::Equivalent<Owner> + ?Sized,
    {
        if let Some(&s) = self.index.get(key) {
            return s;
        }
        let owner = owner();
        let s = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize].0 = Some(owner.clone());
                s
            }
            None => {
                self.slots.push((Some(owner.clone()), vec![]));
                (self.slots.len() - 1) as Slot
            }
        };
        self.index.insert(owner, s);
        s
    }

    /// The devices of the owner in `slot`.
    pub fn at(&mut self, slot: Slot) -> &mut Devices {
        &mut self.slots[slot as usize].1
    }

    /// The devices of the owner in `slot`, to read.
    pub fn read(&self, slot: Slot) -> &[(Name, Ledger)] {
        &self.slots[slot as usize].1
    }

    /// The owner's devices, made on first use.
    pub fn of(&mut self, owner: &Owner) -> &mut Devices {
        let s = self.slot(owner, || owner.clone());
        self.at(s)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Owner, &Name, &Ledger)> {
        self.slots
            .iter()
            .filter_map(|(o, v)| Some((o.as_ref()?, v)))
            .flat_map(|(o, v)| v.iter().map(move |(u, l)| (o, u, l)))
    }

    pub fn len(&self) -> usize {
        self.slots.iter().map(|(_, v)| v.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps the ledgers `keep` says to (it may also change them); an owner left with none
    /// gives its slot back.
    pub fn retain(&mut self, mut keep: impl FnMut(&mut Ledger) -> bool) {
        for (s, (owner, v)) in self.slots.iter_mut().enumerate() {
            v.retain_mut(|(_, l)| keep(l));
            if v.is_empty() {
                if let Some(o) = owner.take() {
                    self.index.remove(&o);
                    *v = vec![];
                    self.free.push(s as Slot);
                }
            }
        }
    }
}

/// Where the device's ledger is in an owner's list.
fn position(devices: &[(Name, Ledger)], uuid: &Name) -> Option<usize> {
    devices.iter().position(|(u, _)| same(u, uuid))
}

/// The device's ledger in an owner's list, made on first use.
pub fn device<'a>(devices: &'a mut Vec<(Name, Ledger)>, uuid: &Name) -> &'a mut Ledger {
    let i = match position(devices, uuid) {
        Some(i) => i,
        None => {
            // Most owners use one device: room for one, not the four (a KiB) a push makes.
            devices.reserve_exact(1);
            devices.push((uuid.clone(), Ledger::default()));
            devices.len() - 1
        }
    };
    &mut devices[i].1
}

/// An exited process's accounting stats, and whom to charge: its owner when it exited.
#[derive(Debug, Clone, PartialEq)]
pub struct Accounted {
    pub owner: Owner,
    pub names: RecordNames,
    /// The GPU (accounting is per GPU).
    pub uuid: String,
    pub sample: AccountingSample,
}

/// What the account pass needs besides the join's own inputs.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// HAMi limits of the sample's processes, by pid.
    pub hami: &'a HashMap<u32, HamiLimits>,
    pub accounted: &'a [Accounted],
    /// The window of `memory_peak_bytes` (the export interval).
    pub peak_window_ms: u64,
}

impl Default for Inputs<'_> {
    fn default() -> Self {
        static NONE: std::sync::OnceLock<HashMap<u32, HamiLimits>> = std::sync::OnceLock::new();
        Inputs {
            hami: NONE.get_or_init(HashMap::new),
            accounted: &[],
            peak_window_ms: 60_000,
        }
    }
}

/// What one cycle's pass reads: the sample, its devices' shared names (in the sample's
/// order), the metadata and the inputs above.
pub struct Pass<'a> {
    pub sample: &'a GpuSample,
    pub names: &'a DeviceNames,
    pub metadata: &'a Metadata,
    pub inputs: &'a Inputs<'a>,
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

/// The ledger of (owner, device), made on first use; no key is built for a present one.
fn ledger<'a>(counters: &'a mut Counters, owner: &Owner, uuid: &Name) -> &'a mut Ledger {
    device(counters.ledgers.of(owner), uuid)
}

/// Energy charged to a container this cycle: (its index, the device, joules). The device's
/// name is borrowed (the sample's or the container's): no reference count per charge.
type Charge<'a> = (usize, &'a Name, f64);

/// The whole pass, in order: the energy split computed, then per container one pass over
/// its devices (sessions opened at their first cycle's totals, energy charged, peaks and
/// sessions advanced), accounting charged, ended sessions closed into records, and each
/// container's `accounts` filled. `owners` are the containers' (`owner_key` of each),
/// which the join already holds, and `slots` those of the first containers' owners.
pub fn account(
    containers: &mut Vec<ContainerUsage>,
    owners: Vec<Option<Owner>>,
    slots: Vec<Slot>,
    counters: &mut Counters,
    pass: &Pass,
) -> Vec<UsageRecord> {
    debug_assert!(containers.iter().map(owner_key).eq(owners.iter().cloned()));
    let now = pass.sample.taken_at_ms;
    let mut slots: Vec<Option<Slot>> = slots.into_iter().map(Some).collect();
    slots_of(&mut slots, &owners, &mut counters.ledgers);
    let users = DeviceUsers::of(containers, &owners, pass.names);
    let mut split = Split::default();
    let mut index = None;
    for (i, d) in pass.sample.devices.iter().enumerate() {
        let owners = (&owners[..], &mut index);
        split_energy(d, &users, owners, i, counters, &mut split, now);
    }
    let Split { this_cycle, held } = split;
    let mut charges = this_cycle;
    charges.extend(held.iter().map(|(c, name, j)| (*c, name, *j)));
    // By container (a stable sort): this cycle's charges in device order, then those of
    // held energy reads.
    charges.sort_by_key(|c| c.0);
    let mut rest = &charges[..];
    for (i, (c, slot)) in containers.iter().zip(&slots).enumerate() {
        let n = rest.iter().take_while(|c| c.0 == i).count();
        let (mine, later) = rest.split_at(n);
        rest = later;
        if let Some(slot) = slot {
            advance(c, *slot, mine, counters, pass.inputs.peak_window_ms, now);
        }
    }
    let mut records = charge_accounting(containers, &owners, counters, pass, now);
    records.extend(close_ended(counters, now));
    let mut spare = counters.spare.take_accounts();
    let accounted = accounted_devices(counters);
    let added = accounted_owners(&owners, &accounted, pass.metadata);
    let mut owners = owners;
    owners.extend(added.iter().map(owner_key));
    containers.extend(added);
    // Charged accounting, so holding a ledger: their slots are there to find.
    let found = owners[slots.len()..].iter();
    let found: Vec<_> = found.map(|o| counters.ledgers.find(o.as_ref()?)).collect();
    slots.extend(found);
    // One list of each container's devices, reused (not a list made and freed per entry).
    let mut devices = vec![];
    for ((c, owner), slot) in containers.iter_mut().zip(&owners).zip(&slots) {
        if let (Some(owner), Some(slot)) = (owner, slot) {
            fill_accounts(
                c,
                (owner, *slot),
                counters,
                &accounted,
                pass,
                &mut devices,
                &mut spare,
            );
        }
    }
    counters.spare.put_back(spare);
    records
}

/// The slots of the owners past those `slots` has, looked up (made for a new owner).
fn slots_of(slots: &mut Vec<Option<Slot>>, owners: &[Option<Owner>], ledgers: &mut Ledgers) {
    for o in &owners[slots.len()..] {
        slots.push(o.as_ref().map(|o| ledgers.slot(o, || o.clone())));
    }
}

/// The energy split's charges: this cycle's by borrowed names; those of the cycles an
/// energy read spans, by the names their shares kept.
#[derive(Default)]
struct Split<'a> {
    this_cycle: Vec<Charge<'a>>,
    held: Vec<(usize, Name, f64)>,
}

/// Each present owner's container index.
type OwnerIndex<'o> = rustc_hash::FxHashMap<&'o Owner, usize>;

/// A container's use of a device: (its index, the device, SM utilization, memory).
type Use<'a> = (usize, &'a Name, Option<u32>, u64);

/// Per GPU of the sample (by position), found in one pass over the containers: who used
/// it (container, device, SM utilization, memory) and who holds an allocation of it or of
/// one of its MIG devices.
struct DeviceUsers<'a> {
    users: Vec<Vec<Use<'a>>>,
    holders: Vec<Vec<(usize, &'a Name)>>,
}

impl<'a> DeviceUsers<'a> {
    fn of(
        containers: &'a [ContainerUsage],
        owners: &[Option<Owner>],
        names: &'a DeviceNames,
    ) -> DeviceUsers<'a> {
        let mut users = vec![vec![]; names.len()];
        let mut holders = vec![vec![]; names.len()];
        for (i, (c, owner)) in containers.iter().zip(owners).enumerate() {
            if owner.is_none() {
                continue;
            }
            for g in &c.gpus {
                if let Some(j) = names.gpu_index(&g.gpu_uuid) {
                    users[j].push((i, &g.uuid, g.sm_util, g.memory_used_bytes));
                }
            }
            // `allocated_gpus` holds each uuid once.
            for u in c.allocated_gpus.iter() {
                if let Some((j, name)) = names.lookup(u) {
                    holders[j].push((i, name));
                }
            }
        }
        DeviceUsers { users, holders }
    }
}

/// The devices each owner was charged NVML accounting on.
type ChargedDevices<'a> = rustc_hash::FxHashMap<&'a Owner, Vec<&'a Name>>;

fn accounted_devices(counters: &Counters) -> ChargedDevices<'_> {
    let mut out = ChargedDevices::default();
    for (o, u, l) in counters.ledgers.iter() {
        if l.accounted_processes > 0 {
            out.entry(o).or_default().push(u);
        }
    }
    out
}

/// Owners with no process now whose exited processes were charged through NVML accounting
/// (a job shorter than a sample): an entry of their own, so that their accounting series
/// go on, until their counters are forgotten.
fn accounted_owners(
    present: &[Option<Owner>],
    accounted: &ChargedDevices,
    metadata: &Metadata,
) -> Vec<ContainerUsage> {
    if accounted.is_empty() {
        return vec![];
    }
    let present: HashSet<&Owner> = present.iter().flatten().collect();
    let mut added = vec![];
    let mut owners: Vec<&Owner> = accounted
        .keys()
        .copied()
        .filter(|o| !present.contains(*o))
        .collect();
    owners.sort();
    for o in owners {
        let mut c = match o {
            Owner::Container(id) => ContainerUsage {
                container_id: Some(id.clone()),
                ..Default::default()
            },
            Owner::Pod(uid) => ContainerUsage {
                pod_uid: Some(uid.clone()),
                ..Default::default()
            },
            Owner::Host => ContainerUsage::default(),
        };
        super::naming::name(&mut c, metadata);
        added.push(c);
    }
    added
}

/// The shares of the cycles since a GPU's energy counter last moved: energy is read every
/// `nvml.slow_interval_ms` and held in between, and each increase is split by the mean of
/// the shares of the cycles it spans, so that a container that ran between two reads is
/// charged its part. Fractions of one cycle each.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EnergyShares {
    /// (owner, the device charged: the GPU or one of its MIG devices) -> summed shares.
    owners: Shares,
    idle: f64,
    cycles: u32,
}

/// Summed shares by (owner, device), in the order they first came. A cycle's shares come in
/// the order of the one before while the owners stay, so each is looked for first where the
/// one before it was found, plus one: by pointer, in a list read in order. A map lookup per
/// share and cycle (the energy is read every few cycles: the others only add up shares),
/// in memory gone cold since, was 3 % of the large node's agent. The map finds the others.
#[derive(Debug, Clone, Default, PartialEq)]
struct Shares {
    entries: Vec<(Owner, Name, f64)>,
    index: hashbrown::HashMap<(Owner, Name), usize, rustc_hash::FxBuildHasher>,
    /// Where the next share of this cycle is looked for first.
    next: usize,
}

impl Shares {
    fn add(&mut self, owner: &Owner, name: &Name, f: f64) {
        let hit = self
            .entries
            .get(self.next)
            .is_some_and(|(o, n, _)| std::sync::Arc::ptr_eq(n, name) && o.ptr_eq(owner));
        let i = match hit {
            true => self.next,
            false => match self.index.get(&KeyRef(owner, name)) {
                Some(&i) => i,
                None => {
                    // The key is cloned only for an owner new to the pending shares.
                    self.entries.push((owner.clone(), name.clone(), 0.0));
                    let i = self.entries.len() - 1;
                    self.index.insert((owner.clone(), name.clone()), i);
                    i
                }
            },
        };
        self.entries[i].2 += f;
        self.next = i + 1;
    }
}

const MAX_PENDING_CYCLES: u32 = 3600;

/// One cycle's shares of a GPU's energy: (container index, device charged, fraction), and
/// the fraction charged to nobody.
type CycleShares<'a> = (Vec<(usize, &'a Name, f64)>, f64);

/// Splits GPU `i`'s energy over the containers on it by their SM-utilization share
/// (memory share where no utilization is known); the rest (idle) goes to the containers the
/// GPU is allocated to, in equal parts, else to the GPU's idle entry. Every joule of each
/// increase lands somewhere: by this cycle's shares when the counter was read last cycle
/// too, else by the mean of the cycles since (`EnergyShares`).
fn split_energy<'a, 'o>(
    d: &DeviceSample,
    users: &DeviceUsers<'a>,
    (owners, index): (&'o [Option<Owner>], &mut Option<OwnerIndex<'o>>),
    i: usize,
    counters: &mut Counters,
    charges: &mut Split<'a>,
    now: u64,
) {
    let Some(e) = d.energy_mj.filter(|_| d.status.is_ok()) else {
        return;
    };
    // The map holds the last sample's values: the one replaced is "before".
    let before = counters.energy_mj.insert(d.uuid.clone(), e);
    counters.idle_energy.entry(d.uuid.clone()).or_insert(0.0);
    let Some(before) = before.filter(|b| *b <= e) else {
        // First sample, or the counter restarted (driver reload): nothing to split.
        counters.energy_shares.remove(&d.uuid);
        return;
    };
    let (shares, idle) = cycle_shares(d, users, i);
    let delta = (e - before) as f64 / 1000.0;
    // Read last cycle too: this cycle's shares are the mean, and the containers are this
    // cycle's, so no map is kept or built (a read every cycle costs what it did before).
    if e > before && !counters.energy_shares.contains_key(&d.uuid) {
        for (c, name, f) in shares {
            charges.this_cycle.push((c, name, delta * f));
        }
        *counters.idle_energy.entry(d.uuid.clone()).or_insert(0.0) += delta * idle;
        return;
    }
    let pending = counters.energy_shares.entry(d.uuid.clone()).or_default();
    pending.cycles += 1;
    pending.idle += idle;
    pending.owners.next = 0;
    for (c, name, f) in shares {
        if let Some(owner) = &owners[c] {
            pending.owners.add(owner, name, f);
        }
    }
    if e == before {
        // Held, or no increase yet. A counter that never moves has nothing to split: its
        // shares are not kept beyond an hour of 1 s cycles.
        if pending.cycles > MAX_PENDING_CYCLES {
            counters.energy_shares.remove(&d.uuid);
        }
        return;
    }
    let pending = counters.energy_shares.remove(&d.uuid).unwrap_or_default();
    let per_cycle = delta / pending.cycles.max(1) as f64;
    *counters.idle_energy.entry(d.uuid.clone()).or_insert(0.0) += per_cycle * pending.idle;
    // Made once a cycle, for the first GPU whose held energy moved.
    let index = index.get_or_insert_with(|| {
        let owners = owners.iter().enumerate();
        owners.filter_map(|(c, o)| Some((o.as_ref()?, c))).collect()
    });
    for (owner, name, f) in pending.owners.entries {
        match index.get(&owner) {
            Some(c) => charges.held.push((*c, name, per_cycle * f)),
            // Gone since: its ledger is charged all the same.
            None => charge_energy(ledger(counters, &owner, &name), per_cycle * f, now),
        }
    }
}

/// GPU `i`'s shares this cycle (see `split_energy`).
fn cycle_shares<'a>(d: &DeviceSample, users: &DeviceUsers<'a>, i: usize) -> CycleShares<'a> {
    let on = &users.users[i];
    let by_sm = on.iter().any(|u| u.2.is_some());
    let total = d.memory_total_bytes.unwrap_or(0).max(1) as f64;
    let weight = |u: &Use| match by_sm {
        true => u.2.unwrap_or(0) as f64 / 100.0,
        false => u.3 as f64 / total,
    };
    let sum: f64 = on.iter().map(weight).sum();
    let scale = if sum > 1.0 { 1.0 / sum } else { 1.0 };
    let mut shares: Vec<(usize, &Name, f64)> =
        on.iter().map(|u| (u.0, u.1, weight(u) * scale)).collect();
    let idle = (1.0 - shares.iter().map(|s| s.2).sum::<f64>()).max(0.0);
    let holders = &users.holders[i];
    if holders.is_empty() {
        return (shares, idle);
    }
    let part = idle / holders.len() as f64;
    shares.extend(holders.iter().map(|(c, uuid)| (*c, *uuid, part)));
    (shares, 0.0)
}

fn charge_energy(l: &mut Ledger, j: f64, now: u64) {
    if l.energy_since_ms == 0 {
        l.energy_since_ms = now;
    }
    l.energy_j += j;
    l.last_charged_ms = now;
}

/// Charges each exited process's accounting stats to its owner. A process no sample ever
/// caught (it lived between two) gets a record of its own when its owner has no session
/// open on the GPU.
fn charge_accounting(
    containers: &[ContainerUsage],
    owners: &[Option<Owner>],
    counters: &mut Counters,
    pass: &Pass,
    now: u64,
) -> Vec<UsageRecord> {
    let mut records = vec![];
    for a in pass.inputs.accounted {
        let s = &a.sample;
        let gpu_s = s.gpu_util.unwrap_or(0) as f64 / 100.0 * s.time_ms as f64 / 1000.0;
        let max_mem = s.max_memory_bytes.unwrap_or(0);
        let l = ledger(counters, &a.owner, &pass.names.name(&a.uuid));
        l.accounted_processes += 1;
        l.accounted_gpu_seconds += gpu_s;
        l.peak.push(now, max_mem, pass.inputs.peak_window_ms);
        l.last_charged_ms = now;
        if let Some(session) = &mut l.session {
            session.peak = session.peak.max(max_mem);
            continue;
        }
        let using = containers.iter().zip(owners).any(|(c, o)| {
            o.as_ref() == Some(&a.owner) && c.gpus.iter().any(|g| *g.uuid == *a.uuid)
        });
        if using {
            continue;
        }
        let start_ms = s.start_time_us / 1000;
        records.push(UsageRecord {
            uuid: a.uuid.clone(),
            gpu_uuid: a.uuid.clone(),
            start_ms,
            end_ms: start_ms + s.time_ms,
            memory_peak_bytes: max_mem,
            accounted_processes: 1,
            accounted_gpu_seconds: gpu_s,
            reason: "accounting".into(),
            ..a.names.record()
        });
    }
    records
}

/// One container's devices this cycle, with one lookup of its owner: a session opens at
/// the first cycle with a process (from the totals before it, so that it includes this
/// cycle's credit), energy is charged, the peak and the open session advance.
fn advance(
    c: &ContainerUsage,
    slot: Slot,
    charges: &[Charge],
    counters: &mut Counters,
    window_ms: u64,
    now: u64,
) {
    let devices = counters.ledgers.at(slot);
    for g in &c.gpus {
        let l = device(devices, &g.uuid);
        if l.session.is_none() {
            let before = l.acc.as_ref().map(|a| a.before).unwrap_or_default();
            l.session = Some(Session {
                gpu_uuid: g.gpu_uuid.clone(),
                start_ms: now,
                end_ms: now,
                gpu_seconds: before.0,
                byte_seconds: before.1,
                energy_j: l.energy_j,
                accounted_processes: l.accounted_processes,
                accounted_gpu_seconds: l.accounted_gpu_seconds,
                peak: 0,
                names: RecordNames::of(c),
            });
        }
        l.peak.push(now, g.memory_used_bytes, window_ms);
        if let Some(s) = &mut l.session {
            s.end_ms = now;
            s.peak = s.peak.max(g.memory_used_bytes);
            // Names arrive after the first sample, and come anew with each metadata refresh.
            if !s.names.shares(c) {
                s.names = RecordNames::of(c);
            }
        }
    }
    for (_, uuid, j) in charges {
        charge_energy(device(devices, uuid), *j, now);
    }
}

/// Sessions whose container had no process on the device this cycle: one record each.
fn close_ended(counters: &mut Counters, now: u64) -> Vec<UsageRecord> {
    let ended: Vec<(Owner, Name)> = counters
        .ledgers
        .iter()
        .filter(|(_, _, l)| l.session.is_some() && l.last_used_ms != now)
        .map(|(o, u, _)| (o.clone(), u.clone()))
        .collect();
    let mut records = vec![];
    for key in ended {
        if let Some(r) = close(counters, &key, "exited") {
            records.push(r);
        }
    }
    records
}

/// Ends the session of `key` and returns its record.
pub fn close(counters: &mut Counters, key: &(Owner, Name), reason: &str) -> Option<UsageRecord> {
    let l = counters.ledgers.get_mut(&key.0, &key.1)?;
    let acc = l.acc.clone().unwrap_or_default();
    let s = l.session.take()?;
    Some(UsageRecord {
        uuid: key.1.to_string(),
        gpu_uuid: s.gpu_uuid.to_string(),
        start_ms: s.start_ms,
        end_ms: s.end_ms,
        gpu_seconds: acc.gpu_seconds.map(|g| (g - s.gpu_seconds).max(0.0)),
        memory_byte_seconds: (acc.byte_seconds - s.byte_seconds).max(0.0),
        memory_peak_bytes: s.peak,
        energy_joules: (l.energy_j - s.energy_j).max(0.0),
        accounted_processes: l.accounted_processes - s.accounted_processes,
        accounted_gpu_seconds: (l.accounted_gpu_seconds - s.accounted_gpu_seconds).max(0.0),
        reason: reason.into(),
        ..s.names.record()
    })
}

/// Each device the container used or was allocated: its ledger and its limits.
fn fill_accounts(
    c: &mut ContainerUsage,
    (owner, slot): (&Owner, Slot),
    counters: &Counters,
    accounted: &ChargedDevices,
    pass: &Pass,
    uuids: &mut Vec<(Name, Name)>,
    spare: &mut Spare,
) {
    uuids.clear();
    uuids.extend(c.gpus.iter().map(|g| (g.uuid.clone(), g.gpu_uuid.clone())));
    let allocated = c.allocated_gpus.iter().map(|u| pass.names.name(u));
    let charged = accounted
        .get(owner)
        .into_iter()
        .flatten()
        .map(|u| (*u).clone());
    for u in allocated.chain(charged) {
        if !uuids.iter().any(|(x, _)| same(x, &u)) {
            let parent = pass.names.parent(&u);
            uuids.push((u, parent));
        }
    }
    let mut accounts = spare.accounts(uuids.len());
    let ledgers = counters.ledgers.read(slot);
    for (uuid, gpu_uuid) in uuids.drain(..) {
        let l = position(ledgers, &uuid).map(|i| &ledgers[i].1);
        let mut a = GpuAccount {
            uuid,
            gpu_uuid,
            ..Default::default()
        };
        if let Some(l) = l {
            a.energy_joules = l.energy_j;
            a.energy_since_ms = l.energy_since_ms;
            a.memory_peak_bytes = l.peak.max();
            a.accounted_processes = l.accounted_processes;
            a.accounted_gpu_seconds = l.accounted_gpu_seconds;
        }
        limits(&mut a, c, pass);
        if l.is_some() || a.memory_limit_bytes.is_some() {
            accounts.push(a);
        }
    }
    c.accounts = accounts;
}

/// HAMi's limit (enforced in the container) first, then the MIG device's size, then the
/// container's share of a time-sliced GPU.
fn limits(a: &mut GpuAccount, c: &ContainerUsage, pass: &Pass) {
    // No pid is hashed where no process has HAMi limits (most nodes).
    if !pass.inputs.hami.is_empty() {
        hami_limits(a, c, pass);
    }
    if a.memory_limit_bytes.is_some() {
        return;
    }
    device_limits(a, c, pass);
}

/// HAMi's limits, from the container's processes on the device.
fn hami_limits(a: &mut GpuAccount, c: &ContainerUsage, pass: &Pass) {
    let only_device = c.gpus.len() == 1;
    let pids = c
        .gpus
        .iter()
        .filter(|g| same(&g.uuid, &a.uuid))
        .flat_map(|g| &g.pids);
    for l in pids.filter_map(|p| pass.inputs.hami.get(p)) {
        a.sm_limit_percent = a.sm_limit_percent.or(l.sm_percent);
        if a.memory_limit_bytes.is_none() {
            a.memory_limit_bytes = l
                .memory_for(&a.uuid, only_device)
                .or_else(|| l.memory_for(&a.gpu_uuid, only_device));
            a.memory_limit_source = a.memory_limit_bytes.map(|_| LimitSource::Hami);
        }
    }
}

/// The MIG device's size, else the container's share of a time-sliced GPU.
fn device_limits(a: &mut GpuAccount, c: &ContainerUsage, pass: &Pass) {
    let gpu = pass
        .names
        .gpu_index(&a.gpu_uuid)
        .map(|i| (i, &pass.sample.devices[i]));
    if !same(&a.uuid, &a.gpu_uuid) {
        let mig = gpu.and_then(|(i, d)| d.mig_devices.get(pass.names.mig_index(i, &a.uuid)?));
        // Set only where known: the `Option` assigned whole compiled into 8 KiB of bit
        // shuffles, 14 % of the join's samples on the large node (`--bench join`).
        if let Some(total) = mig.and_then(|m| m.memory_total_bytes) {
            a.memory_limit_bytes = Some(total);
            a.memory_limit_source = Some(LimitSource::Mig);
        }
        return;
    }
    // Only a time-sliced GPU has shares (and only then are the allocations scanned).
    let replicas = pass.metadata.replicas_of(&a.gpu_uuid);
    if replicas < 2 {
        return;
    }
    let (Some(ns), Some(pod), Some(name)) = (&c.namespace, &c.pod_name, &c.container_name) else {
        return;
    };
    let held: u32 = pass
        .metadata
        .allocations_of(ns, pod, name)
        .map(|(al, _)| al.replicas_of(&a.gpu_uuid))
        .sum();
    let total = gpu.and_then(|(_, d)| d.memory_total_bytes);
    if let (true, Some(total)) = (held >= 1, total) {
        a.memory_limit_bytes = Some(total / replicas as u64 * held.min(replicas) as u64);
        a.memory_limit_source = Some(LimitSource::Timeslice);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_names_are_shared_with_the_container_or_taken_again() {
        let c = ContainerUsage {
            container_id: Some("c1".into()),
            pod_uid: Some("u1".into()),
            pod_name: Some("p".into()),
            ..Default::default()
        };
        let names = RecordNames::of(&c);
        assert!(names.shares(&c), "the same names");
        // Equal strings that are not the same allocation: taken again, equal all the same.
        let mut copy = c.clone();
        copy.container_id = Some("c1".into());
        assert!(!names.shares(&copy));
        assert_eq!(RecordNames::of(&copy), names);
        assert!(RecordNames::of(&copy).shares(&copy));
        for change in [
            |c: &mut ContainerUsage| c.pod_name = Some("q".into()),
            |c: &mut ContainerUsage| c.pod_name = None,
            |c: &mut ContainerUsage| c.namespace = Some("ns".into()),
            |c: &mut ContainerUsage| c.container_id = Some("c2".into()),
        ] {
            let mut other = c.clone();
            change(&mut other);
            assert!(!names.shares(&other), "{other:?}");
            assert_ne!(RecordNames::of(&other), names);
        }
    }

    #[test]
    fn the_peak_window_keeps_the_largest_recent_value() {
        let mut p = PeakWindow::default();
        p.push(0, 5, 1000);
        p.push(100, 9, 1000);
        p.push(200, 3, 1000);
        assert_eq!(p.max(), Some(9));
        p.push(1150, 4, 1000);
        assert_eq!(p.max(), Some(4), "9 fell out of the window");
        p.push(1200, 2, 1000);
        assert_eq!(p.max(), Some(4));
    }

    #[test]
    fn an_owner_keeps_its_slot_while_it_has_ledgers_and_a_freed_slot_is_taken_again() {
        let mut l = Ledgers::default();
        let (a, b) = (Owner::Container("a".into()), Owner::Pod("b".into()));
        let gpu: Name = "GPU-1".into();
        let sa = l.slot(&a, || a.clone());
        device(l.at(sa), &gpu).energy_j = 1.0;
        let sb = l.slot(&b, || b.clone());
        device(l.at(sb), &gpu).energy_j = 2.0;
        assert_ne!(sa, sb);
        // Found by content too: an equal id in another allocation.
        let a2 = Owner::Container("a".into());
        assert_eq!(l.slot(&a2, || unreachable!("a has a slot")), sa);
        l.retain(|x| x.energy_j > 1.5);
        assert_eq!(l.get(&a, &gpu), None);
        assert_eq!((l.len(), l.iter().count()), (1, 1));
        assert_eq!(
            l.slot(&Owner::Host, || Owner::Host),
            sa,
            "a's slot, given back"
        );
        assert_eq!(l.get(&b, &gpu).map(|x| x.energy_j), Some(2.0));
        // The same ledgers of the same owners, in other slots: equal.
        let mut m = Ledgers::default();
        device(m.of(&Owner::Host), &gpu);
        device(m.of(&b), &gpu).energy_j = 2.0;
        assert_ne!(l, m, "the host has a ledger in m only");
        device(l.of(&Owner::Host), &gpu);
        assert_eq!(l, m);
    }

    #[test]
    fn pending_shares_add_up_by_owner_and_device_whatever_their_order() {
        let a = Owner::Container("a".into());
        let b = Owner::Container("b".into());
        let c = Owner::Pod("c".into());
        let (gpu, mig): (Name, Name) = ("GPU-1".into(), "MIG-1".into());
        let mut s = Shares::default();
        for (o, d, f) in [(&a, &gpu, 0.5), (&b, &gpu, 0.25), (&a, &mig, 0.125)] {
            s.add(o, d, f);
        }
        // The next cycle: another order, a new owner, and a's id in another allocation.
        s.next = 0;
        let a2 = Owner::Container("a".into());
        for (o, d, f) in [(&b, &gpu, 0.25), (&c, &gpu, 0.1), (&a2, &gpu, 0.5)] {
            s.add(o, d, f);
        }
        s.add(&a, &mig, 0.125);
        let sums: Vec<(&Owner, &str, f64)> =
            s.entries.iter().map(|(o, d, f)| (o, &**d, *f)).collect();
        let want = [
            (&a, "GPU-1", 1.0),
            (&b, "GPU-1", 0.5),
            (&a, "MIG-1", 0.25),
            (&c, "GPU-1", 0.1),
        ];
        assert_eq!(sums, want);
    }

    /// A ledger is about 250 bytes, and a large node has 2,000 owners of one device each.
    #[test]
    fn an_owners_first_device_takes_room_for_one() {
        let mut devices = vec![];
        let (a, b): (Name, Name) = ("GPU-a".into(), "GPU-b".into());
        device(&mut devices, &a).energy_j = 1.0;
        assert_eq!((devices.len(), devices.capacity()), (1, 1));
        device(&mut devices, &b);
        device(&mut devices, &a).energy_j += 1.0;
        assert_eq!(devices.len(), 2);
        assert_eq!(devices[0].1.energy_j, 2.0);
    }
}
