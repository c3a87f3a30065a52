//! What billing accounts to each container on each device besides its sampled use: its
//! share of the GPU's energy, its peak memory, its memory limit, NVML's accounting stats of
//! its exited processes, and the usage record of each stretch of use. The carried state
//! goes in and comes out in `Books`.
use std::{
    borrow::Cow,
    collections::{HashMap, HashSet},
};

use gpu_model::{
    AccountingSample, ContainerGpu, ContainerUsage, DeviceSample, GpuAccount, GpuSample,
    LimitSource, Name, UsageRecord,
};

use super::{
    ledger::{device, position, Books, Ledger, RecordNames, Slot},
    profile::SmSource,
    stretch::{self, Cycle},
    Settings,
};
use crate::{
    gpu::join::{
        naming,
        owner::{held_idle, owner_key, same, DeviceNames, Owner, OwnerKey},
    },
    metadata::{hami::HamiLimits, Metadata},
};

/// An exited process's accounting stats, and whom to charge: its owner when it exited.
#[derive(Debug, Clone, PartialEq)]
pub struct Accounted {
    pub owner: Owner,
    pub names: RecordNames,
    /// The GPU (accounting is per GPU).
    pub uuid: String,
    pub sample: AccountingSample,
}

/// What the account pass reads besides the snapshot and the sample.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// HAMi limits of the sample's processes, by pid.
    pub hami: &'a HashMap<u32, HamiLimits>,
    pub accounted: &'a [Accounted],
    pub settings: &'a Settings,
}

/// What one cycle's pass reads: the sample, its devices' shared names (in the sample's
/// order), the owners of the entries the join grouped (in their order), the metadata and
/// the inputs above.
pub struct Pass<'a> {
    pub sample: &'a GpuSample,
    pub names: &'a DeviceNames,
    pub owners: &'a [Option<Owner>],
    pub metadata: &'a Metadata,
    pub inputs: &'a Inputs<'a>,
}

/// The ledger of (owner, device), made on first use; no key is built for a present one.
fn ledger<'a>(books: &'a mut Books, owner: &Owner, uuid: &Name) -> &'a mut Ledger {
    device(books.ledgers.of(owner), uuid)
}

/// Energy charged to a container this cycle: (its index, the device, joules). The device's
/// name is borrowed (the sample's or the container's): no reference count per charge.
type Charge<'a> = (usize, &'a Name, f64);

/// A snapshot entry's owner (`owner_key`) and where its ledgers are: one row per entry, in
/// the entries' order. The owner is the join's where it has one (no reference count a
/// cycle per entry), else made here.
#[derive(Debug, Clone)]
struct Row<'a> {
    owner: Option<Cow<'a, Owner>>,
    slot: Option<Slot>,
}

/// How many entries ahead the passes ask for the ledgers they will read.
const AHEAD: usize = 4;

/// The entry's owner, borrowed: whether a container (else a pod) and its id; None for the
/// host.
fn owner_name(c: &ContainerUsage) -> Option<(bool, &Name)> {
    match (&c.container_id, &c.pod_uid) {
        (Some(id), _) => Some((true, id)),
        (None, Some(uid)) => Some((false, uid)),
        _ => None,
    }
}

/// Each entry's row: its owner (the join's, `owners`, for the entries it grouped), and its
/// slot, that of the entry at the same position the cycle before where it holds the very
/// same name (no byte of the id read, no map probed), else the ledgers' lookup (made for a
/// new owner).
fn rows<'a>(
    containers: &[ContainerUsage],
    owners: &'a [Option<Owner>],
    books: &mut Books,
) -> Vec<Row<'a>> {
    let last = std::mem::take(&mut books.hints);
    books.hints.reserve(containers.len());
    let mut rows = Vec::with_capacity(containers.len());
    for (i, c) in containers.iter().enumerate() {
        if let Some(&s) = last.get(i + AHEAD) {
            books.ledgers.prefetch(s, 0);
        }
        let owner = match owners.get(i) {
            Some(o) => o.as_ref().map(Cow::Borrowed),
            None => owner_key(c).map(Cow::Owned),
        };
        debug_assert_eq!(owner.as_deref(), owner_key(c).as_ref());
        let slot = owner.as_deref().map(|o| {
            let name = owner_name(c);
            match last
                .get(i)
                .copied()
                .filter(|&s| books.ledgers.holds(s, name))
            {
                Some(s) => s,
                None => {
                    let key = OwnerKey(name.map(|(c, n)| (c, &**n)));
                    let s = books.ledgers.slot(&key, || o.clone());
                    books.ledgers.adopt(s, name, || o.clone());
                    s
                }
            }
        });
        books.hints.push(slot.unwrap_or(Slot::MAX));
        rows.push(Row { owner, slot });
    }
    rows
}

/// The whole pass, in order: the energy split computed, then per container one pass over
/// its devices (the join's totals taken, stretches opened at their first cycle's totals,
/// energy charged, peaks and stretches advanced), accounting charged, ended stretches closed
/// into records, and each container's `accounts` filled.
pub fn account(
    containers: &mut Vec<ContainerUsage>,
    books: &mut Books,
    pass: &Pass,
) -> Vec<UsageRecord> {
    let now = pass.sample.taken_at_ms;
    let mut rows = rows(containers, pass.owners, books);
    let users = DeviceUsers::of(containers, &rows, pass.names);
    let mut split = Split::default();
    for (i, d) in pass.sample.devices.iter().enumerate() {
        split_energy(d, &users, &rows, i, books, &mut split, now);
    }
    let Split {
        this_cycle, held, ..
    } = split;
    let mut charges = this_cycle;
    charges.extend(held.iter().map(|(c, name, j)| (*c, name, *j)));
    // By container (a stable sort): this cycle's charges in device order, then those of
    // held energy reads.
    charges.sort_by_key(|c| c.0);
    let mut rest = &charges[..];
    let cycle = Cycle {
        sample: pass.sample,
        names: pass.names,
        metadata: pass.metadata,
        now,
        max_record_ms: pass.inputs.settings.max_record_ms,
    };
    let mut records = vec![];
    let ctx = Advance {
        users: &users,
        cy: &cycle,
        window_ms: pass.inputs.settings.peak_window_ms,
    };
    for (i, (c, row)) in containers.iter().zip(&rows).enumerate() {
        if let Some(s) = rows.get(i + AHEAD).and_then(|r| r.slot) {
            books.ledgers.prefetch(s, 4);
        }
        let n = rest.iter().take_while(|c| c.0 == i).count();
        let (mine, later) = rest.split_at(n);
        rest = later;
        if let Some(slot) = row.slot {
            advance(c, slot, mine, books, &ctx, &mut records);
        }
    }
    records.extend(charge_accounting(containers, &rows, books, pass, now));
    let (closed, open) = stretch::close_ended(&mut books.ledgers, now);
    records.extend(closed);
    books.open_stretches = open;
    let accounted = accounted_devices(books);
    let added = accounted_owners(&rows, &accounted, pass.metadata);
    for c in &added {
        // Charged accounting, so holding a ledger: their slots are there to find.
        let owner = owner_key(c);
        let slot = owner.as_ref().and_then(|o| books.ledgers.find(o));
        rows.push(Row {
            owner: owner.map(Cow::Owned),
            slot,
        });
    }
    containers.extend(added);
    // One list of each container's devices, reused (not a list made and freed per entry).
    let mut devices = vec![];
    for (c, row) in containers.iter_mut().zip(&rows) {
        if let (Some(owner), Some(slot)) = (row.owner.as_deref(), row.slot) {
            fill_accounts(c, owner, slot, books, &accounted, pass, &mut devices);
        }
    }
    records
}

/// The energy split's charges: this cycle's by borrowed names; those of the cycles an
/// energy read spans, by the names their shares kept; and each present owner's entry,
/// found once a cycle where a held read needs it.
#[derive(Default)]
struct Split<'a, 'o> {
    this_cycle: Vec<Charge<'a>>,
    held: Vec<(usize, Name, f64)>,
    index: Option<OwnerIndex<'o>>,
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
        rows: &[Row],
        names: &'a DeviceNames,
    ) -> DeviceUsers<'a> {
        let mut users = vec![vec![]; names.len()];
        let mut holders = vec![vec![]; names.len()];
        for (i, (c, row)) in containers.iter().zip(rows).enumerate() {
            if row.owner.is_none() {
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

fn accounted_devices(books: &Books) -> ChargedDevices<'_> {
    let mut out = ChargedDevices::default();
    for (o, u, l) in books.ledgers.iter() {
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
    present: &[Row],
    accounted: &ChargedDevices,
    metadata: &Metadata,
) -> Vec<ContainerUsage> {
    if accounted.is_empty() {
        return vec![];
    }
    let present: HashSet<&Owner> = present.iter().filter_map(|r| r.owner.as_deref()).collect();
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
        naming::name(&mut c, metadata);
        added.push(c);
    }
    added
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
    rows: &'o [Row],
    i: usize,
    books: &mut Books,
    charges: &mut Split<'a, 'o>,
    now: u64,
) {
    if !d.status.is_ok() {
        // Not read (stalled, lost): what it drew meanwhile is charged to nobody, and its
        // next reading starts the count again.
        books.energy_mj.remove(&d.uuid);
        books.energy_shares.remove(&d.uuid);
        return;
    }
    let Some(e) = d.energy_mj else {
        return;
    };
    // The map holds the last sample's values: the one replaced is "before".
    let before = books.energy_mj.insert(d.uuid.clone(), e);
    books.idle_energy.entry(d.uuid.clone()).or_insert(0.0);
    let Some(before) = before.filter(|b| *b <= e) else {
        // First sample, or the counter restarted (driver reload): nothing to split.
        books.energy_shares.remove(&d.uuid);
        return;
    };
    let (shares, idle) = cycle_shares(d, users, i);
    let delta = (e - before) as f64 / 1000.0;
    // Read last cycle too: this cycle's shares are the mean, and the containers are this
    // cycle's, so no map is kept or built (a read every cycle costs what it did before).
    if e > before && !books.energy_shares.contains_key(&d.uuid) {
        for (c, name, f) in shares {
            charges.this_cycle.push((c, name, delta * f));
        }
        *books.idle_energy.entry(d.uuid.clone()).or_insert(0.0) += delta * idle;
        return;
    }
    let pending = books.energy_shares.entry(d.uuid.clone()).or_default();
    pending.cycles += 1;
    pending.idle += idle;
    pending.owners.next = 0;
    for (c, name, f) in shares {
        if let Some(owner) = rows[c].owner.as_deref() {
            pending.owners.add(owner, name, f);
        }
    }
    if e == before {
        // Held, or no increase yet. A counter that never moves has nothing to split: its
        // shares are not kept beyond an hour of 1 s cycles.
        if pending.cycles > MAX_PENDING_CYCLES {
            books.energy_shares.remove(&d.uuid);
        }
        return;
    }
    let pending = books.energy_shares.remove(&d.uuid).unwrap_or_default();
    let per_cycle = delta / pending.cycles.max(1) as f64;
    *books.idle_energy.entry(d.uuid.clone()).or_insert(0.0) += per_cycle * pending.idle;
    // Made once a cycle, for the first GPU whose held energy moved.
    let index = charges.index.get_or_insert_with(|| {
        let rows = rows.iter().enumerate();
        rows.filter_map(|(c, r)| Some((r.owner.as_deref()?, c)))
            .collect()
    });
    for (owner, name, f) in pending.owners.entries {
        match index.get(&owner) {
            Some(c) => charges.held.push((*c, name, per_cycle * f)),
            // Gone since: its ledger is charged all the same.
            None => charge_energy(ledger(books, &owner, &name), per_cycle * f, now),
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
/// caught (it lived between two) gets a record of its own when its owner has no stretch
/// open on the GPU.
fn charge_accounting(
    containers: &[ContainerUsage],
    rows: &[Row],
    books: &mut Books,
    pass: &Pass,
    now: u64,
) -> Vec<UsageRecord> {
    let mut records = vec![];
    for a in pass.inputs.accounted {
        let s = &a.sample;
        let gpu_s = s.gpu_util.unwrap_or(0) as f64 / 100.0 * s.time_ms as f64 / 1000.0;
        let max_mem = s.max_memory_bytes.unwrap_or(0);
        let l = ledger(books, &a.owner, &pass.names.name(&a.uuid));
        l.accounted_processes += 1;
        l.accounted_gpu_seconds += gpu_s;
        l.peak
            .push(now, max_mem, pass.inputs.settings.peak_window_ms);
        l.last_charged_ms = now;
        if let Some(stretch) = &mut l.stretch {
            stretch.peak = stretch.peak.max(max_mem);
            continue;
        }
        let using = containers.iter().zip(rows).any(|(c, r)| {
            r.owner.as_deref() == Some(&a.owner) && c.gpus.iter().any(|g| *g.uuid == *a.uuid)
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

/// What advancing a container reads of its cycle: the GPUs' users, the cycle, and the
/// window of the memory peak.
struct Advance<'a> {
    users: &'a DeviceUsers<'a>,
    cy: &'a Cycle<'a>,
    window_ms: u64,
}

/// One container's devices this cycle, with one lookup of its owner (`slot`): its stretch
/// on each device it used or holds advances (`stretch::advance`), its `charges` of energy
/// are made, the peak advances, and a stretch due is cut into a record.
fn advance(
    c: &ContainerUsage,
    slot: Slot,
    charges: &[Charge],
    books: &mut Books,
    ctx: &Advance,
    records: &mut Vec<UsageRecord>,
) {
    let Advance {
        users,
        cy,
        window_ms,
    } = *ctx;
    let now = cy.now;
    let devices = books.ledgers.at(slot);
    for g in &c.gpus {
        let l = device(devices, &g.uuid);
        l.last_used_ms = now;
        let before = l.totals.take(g);
        let u = stretch::Use {
            sm: sm_sample(g, users, cy),
            memory_bytes: g.memory_used_bytes,
            used: true,
            from: &before,
        };
        let on = stretch::Device {
            uuid: &g.uuid,
            gpu_uuid: &g.gpu_uuid,
        };
        stretch::advance(l, c, on, u, cy);
        l.peak.push(now, g.memory_used_bytes, window_ms);
    }
    // Devices it holds and ran nothing on: a stretch of the allocation. One gone or not
    // read this cycle has none (the stretch ends at its last good sample).
    for (i, uuid) in held_idle(c, cy.sample, cy.names) {
        let (uuid, gpu_uuid) = (uuid.clone(), cy.names.gpu(i).clone());
        let l = device(devices, &uuid);
        l.last_allocated_ms = now;
        let now_totals = l.totals.clone();
        let u = stretch::Use {
            sm: idle_sm(&uuid, &gpu_uuid, cy),
            memory_bytes: 0,
            used: false,
            from: &now_totals,
        };
        let on = stretch::Device {
            uuid: &uuid,
            gpu_uuid: &gpu_uuid,
        };
        stretch::advance(l, c, on, u, cy);
    }
    for (_, uuid, j) in charges {
        charge_energy(device(devices, uuid), *j, now);
    }
    stretch::cut_due(devices, cy, records);
}

/// A container's SM utilization on a device this cycle: GPM's SM activity of the device
/// (GPU or MIG instance) where GPM gives it and the container is the device's only user,
/// else its processes' utilization.
fn sm_sample(g: &ContainerGpu, users: &DeviceUsers, cy: &Cycle) -> Option<(u32, SmSource)> {
    let process = g.sm_util.map(|s| (s, SmSource::Process));
    let Some(j) = cy.names.gpu_index(&g.gpu_uuid) else {
        return process;
    };
    let d = &cy.sample.devices[j];
    let whole = same(&g.uuid, &g.gpu_uuid);
    let gpm = match whole {
        true => d.fields.gpm.as_ref(),
        false => cy
            .names
            .mig(cy.sample, j, &g.uuid)
            .and_then(|m| m.gpm.as_ref()),
    };
    // Looked for first: the users of a GPU are counted only where GPM has a figure (a
    // large node's MIG GPUs have hundreds of users each).
    let Some(active) = gpm.and_then(|m| m.sm_active) else {
        return process;
    };
    let on = &users.users[j];
    let alone = match whole {
        true => on.len() == 1,
        false => on.iter().filter(|u| same(u.1, &g.uuid)).count() == 1,
    };
    match alone {
        true => Some((
            (active * 100.0).round().clamp(0.0, 100.0) as u32,
            SmSource::Gpm,
        )),
        false => process,
    }
}

/// The SM utilization of a device that runs none of the container's processes: 0, where
/// the device says SM figures at all (a whole GPU; a MIG device with GPM).
fn idle_sm(uuid: &Name, gpu_uuid: &Name, cy: &Cycle) -> Option<(u32, SmSource)> {
    if same(uuid, gpu_uuid) {
        return Some((0, SmSource::Process));
    }
    let m = cy
        .names
        .mig(cy.sample, cy.names.gpu_index(gpu_uuid)?, uuid)?;
    m.gpm.as_ref()?.sm_active.map(|_| (0, SmSource::Gpm))
}

/// Each device the container used or was allocated: its ledger and its limits.
fn fill_accounts(
    c: &mut ContainerUsage,
    owner: &Owner,
    slot: Slot,
    books: &Books,
    accounted: &ChargedDevices,
    pass: &Pass,
    uuids: &mut Vec<(Name, Name)>,
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
    // The entry's own list, empty: the join gave it the one of a recycled snapshot.
    let mut accounts = std::mem::take(&mut c.accounts);
    accounts.clear();
    accounts.reserve_exact(uuids.len());
    let ledgers = books.ledgers.read(slot);
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
            if let Some(s) = &l.stretch {
                (a.gpus_held, a.sm_share) = (Some(s.held), s.sm_share);
            }
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
        let mig = gpu.and_then(|(i, _)| pass.names.mig(pass.sample, i, &a.uuid));
        // Set only where known: the `Option` assigned whole compiled into 8 KiB of bit
        // shuffles, a visible part of the join on the large node (`--bench join`).
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
    let held = pass.metadata.replicas_held(ns, pod, name, &a.gpu_uuid);
    let total = gpu.and_then(|(_, d)| d.memory_total_bytes);
    if let (true, Some(total)) = (held >= 1, total) {
        a.memory_limit_bytes = Some(total / replicas as u64 * held.min(replicas) as u64);
        a.memory_limit_source = Some(LimitSource::Timeslice);
    }
}
