//! What the join accounts to each container on each device besides its sampled use: its
//! share of the GPU's energy, its peak memory, its memory limit, NVML's accounting stats of
//! its exited processes, and the usage record of each stretch of use. Pure, like the join:
//! the carried state goes in and comes out in `Counters`.
use std::collections::{HashMap, VecDeque};

use gpu_model::{
    AccountingSample, ContainerUsage, DeviceSample, GpuAccount, GpuSample, LimitSource, UsageRecord,
};

use super::join::{Counters, Owner};
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
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    pub pod_name: Option<String>,
    pub namespace: Option<String>,
    pub container_name: Option<String>,
}

impl RecordNames {
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
    pub gpu_uuid: String,
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

/// Per (owner, device): what this module carries across cycles.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ledger {
    pub energy_j: f64,
    pub energy_since_ms: u64,
    /// Last cycle that charged it anything (energy, accounting), ms.
    pub last_charged_ms: u64,
    pub accounted_processes: u64,
    pub accounted_gpu_seconds: f64,
    pub peak: PeakWindow,
    pub session: Option<Session>,
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

fn ledger<'a>(counters: &'a mut Counters, owner: &Owner, uuid: &str) -> &'a mut Ledger {
    counters
        .ledgers
        .entry((owner.clone(), uuid.to_string()))
        .or_default()
}

/// The whole pass, in order: sessions opened at their first cycle's totals, energy split,
/// accounting charged, peaks and sessions advanced, ended sessions closed into records,
/// and each container's `accounts` filled.
pub fn account(
    containers: &mut Vec<ContainerUsage>,
    counters: &mut Counters,
    prev: &Counters,
    sample: &GpuSample,
    metadata: &Metadata,
    inputs: &Inputs,
) -> Vec<UsageRecord> {
    let now = sample.taken_at_ms;
    open_sessions(containers, counters, prev, now);
    for d in &sample.devices {
        split_energy(d, containers, counters, prev, now);
    }
    let mut records = charge_accounting(containers, counters, inputs, now);
    advance(containers, counters, inputs.peak_window_ms, now);
    records.extend(close_ended(containers, counters));
    add_accounted_owners(containers, counters, metadata);
    for c in containers.iter_mut() {
        fill_accounts(c, counters, sample, metadata, inputs);
    }
    records
}

/// Owners with no process now whose exited processes were charged through NVML accounting
/// (a job shorter than a sample): an entry of their own, so that their accounting series
/// go on, until their counters are forgotten.
fn add_accounted_owners(
    containers: &mut Vec<ContainerUsage>,
    counters: &Counters,
    metadata: &Metadata,
) {
    let mut owners: Vec<&Owner> = counters
        .ledgers
        .iter()
        .filter(|(_, l)| l.accounted_processes > 0)
        .map(|((o, _), _)| o)
        .filter(|o| !containers.iter().any(|c| owner_key(c).as_ref() == Some(*o)))
        .collect();
    owners.sort();
    owners.dedup();
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
        if let Some(n) = c
            .container_id
            .as_deref()
            .and_then(|id| metadata.names_of(id))
        {
            c.pod_name = n.pod_name.clone();
            c.namespace = n.namespace.clone();
            c.container_name = n.container_name.clone();
            c.pod_uid = n.pod_uid.clone();
            c.runtime = n.runtime;
        }
        containers.push(c);
    }
}

/// A session opens when a container first has processes on a device, from the totals
/// before this cycle, so that it includes this cycle's credit.
fn open_sessions(
    containers: &[ContainerUsage],
    counters: &mut Counters,
    prev: &Counters,
    now: u64,
) {
    for c in containers {
        let Some(owner) = owner_key(c) else { continue };
        for g in &c.gpus {
            let key = (owner.clone(), g.uuid.clone());
            let before = prev.map.get(&key).cloned().unwrap_or_default();
            let l = counters.ledgers.entry(key).or_default();
            if l.session.is_none() {
                l.session = Some(Session {
                    gpu_uuid: g.gpu_uuid.clone(),
                    start_ms: now,
                    end_ms: now,
                    gpu_seconds: before.gpu_seconds,
                    byte_seconds: before.byte_seconds,
                    energy_j: l.energy_j,
                    accounted_processes: l.accounted_processes,
                    accounted_gpu_seconds: l.accounted_gpu_seconds,
                    peak: 0,
                    names: RecordNames::of(c),
                });
            }
        }
    }
}

/// Splits the GPU's energy since the last sample over the containers on it by their
/// SM-utilization share (memory share where no utilization is known); the rest (idle)
/// goes to the containers the GPU is allocated to, in equal parts, else to the GPU's
/// idle entry. Every joule of the delta lands somewhere.
fn split_energy(
    d: &DeviceSample,
    containers: &[ContainerUsage],
    counters: &mut Counters,
    prev: &Counters,
    now: u64,
) {
    let Some(e) = d.energy_mj.filter(|_| d.status.is_ok()) else {
        return;
    };
    counters.energy_mj.insert(d.uuid.clone(), e);
    counters.idle_energy.entry(d.uuid.clone()).or_insert(0.0);
    let Some(before) = prev.energy_mj.get(&d.uuid).copied().filter(|b| *b <= e) else {
        return; // first sample, or the counter restarted (driver reload)
    };
    let delta = (e - before) as f64 / 1000.0;
    let mut users: Vec<(Owner, String, Option<u32>, u64)> = vec![];
    for c in containers {
        let Some(owner) = owner_key(c) else { continue };
        for g in c.gpus.iter().filter(|g| g.gpu_uuid == d.uuid) {
            users.push((
                owner.clone(),
                g.uuid.clone(),
                g.sm_util,
                g.memory_used_bytes,
            ));
        }
    }
    let by_sm = users.iter().any(|u| u.2.is_some());
    let total = d.memory_total_bytes.unwrap_or(0).max(1) as f64;
    let weights: Vec<f64> = users
        .iter()
        .map(|u| match by_sm {
            true => u.2.unwrap_or(0) as f64 / 100.0,
            false => u.3 as f64 / total,
        })
        .collect();
    let sum: f64 = weights.iter().sum();
    let scale = if sum > 1.0 { 1.0 / sum } else { 1.0 };
    let mut charged = 0.0;
    for (u, w) in users.iter().zip(&weights) {
        let j = delta * w * scale;
        charge_energy(ledger(counters, &u.0, &u.1), j, now);
        charged += j;
    }
    let idle = (delta - charged).max(0.0);
    let holders = allocated_holders(d, containers);
    if holders.is_empty() {
        *counters.idle_energy.entry(d.uuid.clone()).or_insert(0.0) += idle;
    } else {
        let part = idle / holders.len() as f64;
        for (owner, uuid) in holders {
            charge_energy(ledger(counters, &owner, &uuid), part, now);
        }
    }
}

fn charge_energy(l: &mut Ledger, j: f64, now: u64) {
    if l.energy_since_ms == 0 {
        l.energy_since_ms = now;
    }
    l.energy_j += j;
    l.last_charged_ms = now;
}

/// The containers the kubelet allocated this GPU (or one of its MIG devices) to, each with
/// the device it holds.
fn allocated_holders(d: &DeviceSample, containers: &[ContainerUsage]) -> Vec<(Owner, String)> {
    let ours = |u: &str| u == d.uuid || d.mig_devices.iter().any(|m| m.uuid == u);
    let mut out = vec![];
    for c in containers {
        let Some(owner) = owner_key(c) else { continue };
        for u in c.allocated_gpus.iter().filter(|u| ours(u)) {
            if !out.iter().any(|(o, x)| *o == owner && x == u) {
                out.push((owner.clone(), u.clone()));
            }
        }
    }
    out
}

/// Charges each exited process's accounting stats to its owner. A process no sample ever
/// caught (it lived between two) gets a record of its own when its owner has no session
/// open on the GPU.
fn charge_accounting(
    containers: &[ContainerUsage],
    counters: &mut Counters,
    inputs: &Inputs,
    now: u64,
) -> Vec<UsageRecord> {
    let mut records = vec![];
    for a in inputs.accounted {
        let s = &a.sample;
        let gpu_s = s.gpu_util.unwrap_or(0) as f64 / 100.0 * s.time_ms as f64 / 1000.0;
        let max_mem = s.max_memory_bytes.unwrap_or(0);
        let l = ledger(counters, &a.owner, &a.uuid);
        l.accounted_processes += 1;
        l.accounted_gpu_seconds += gpu_s;
        l.peak.push(now, max_mem, inputs.peak_window_ms);
        l.last_charged_ms = now;
        if let Some(session) = &mut l.session {
            session.peak = session.peak.max(max_mem);
            continue;
        }
        let using = containers.iter().any(|c| {
            owner_key(c).as_ref() == Some(&a.owner) && c.gpus.iter().any(|g| g.uuid == a.uuid)
        });
        if using {
            continue;
        }
        let start_ms = s.start_time_us / 1000;
        records.push(UsageRecord {
            container_id: a.names.container_id.clone(),
            pod_uid: a.names.pod_uid.clone(),
            pod_name: a.names.pod_name.clone(),
            namespace: a.names.namespace.clone(),
            container_name: a.names.container_name.clone(),
            uuid: a.uuid.clone(),
            gpu_uuid: a.uuid.clone(),
            start_ms,
            end_ms: start_ms + s.time_ms,
            memory_peak_bytes: max_mem,
            accounted_processes: 1,
            accounted_gpu_seconds: gpu_s,
            reason: "accounting".into(),
            ..Default::default()
        });
    }
    records
}

/// Peaks and open sessions of the devices each container uses this cycle.
fn advance(containers: &[ContainerUsage], counters: &mut Counters, window_ms: u64, now: u64) {
    for c in containers {
        let Some(owner) = owner_key(c) else { continue };
        for g in &c.gpus {
            let l = ledger(counters, &owner, &g.uuid);
            l.peak.push(now, g.memory_used_bytes, window_ms);
            if let Some(s) = &mut l.session {
                s.end_ms = now;
                s.peak = s.peak.max(g.memory_used_bytes);
                s.names = RecordNames::of(c);
            }
        }
    }
}

/// Sessions whose container has no process on the device any more: one record each.
fn close_ended(containers: &[ContainerUsage], counters: &mut Counters) -> Vec<UsageRecord> {
    let using = |owner: &Owner, uuid: &str| {
        containers
            .iter()
            .any(|c| owner_key(c).as_ref() == Some(owner) && c.gpus.iter().any(|g| g.uuid == uuid))
    };
    let ended: Vec<(Owner, String)> = counters
        .ledgers
        .iter()
        .filter(|((o, u), l)| l.session.is_some() && !using(o, u))
        .map(|(k, _)| k.clone())
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
pub fn close(counters: &mut Counters, key: &(Owner, String), reason: &str) -> Option<UsageRecord> {
    let acc = counters.map.get(key).cloned().unwrap_or_default();
    let l = counters.ledgers.get_mut(key)?;
    let s = l.session.take()?;
    Some(UsageRecord {
        container_id: s.names.container_id,
        pod_uid: s.names.pod_uid,
        pod_name: s.names.pod_name,
        namespace: s.names.namespace,
        container_name: s.names.container_name,
        node: None,
        uuid: key.1.clone(),
        gpu_uuid: s.gpu_uuid,
        start_ms: s.start_ms,
        end_ms: s.end_ms,
        gpu_seconds: (acc.gpu_seconds - s.gpu_seconds).max(0.0),
        memory_byte_seconds: (acc.byte_seconds - s.byte_seconds).max(0.0),
        memory_peak_bytes: s.peak,
        energy_joules: (l.energy_j - s.energy_j).max(0.0),
        accounted_processes: l.accounted_processes - s.accounted_processes,
        accounted_gpu_seconds: (l.accounted_gpu_seconds - s.accounted_gpu_seconds).max(0.0),
        reason: reason.into(),
    })
}

/// Each device the container used or was allocated: its ledger and its limits.
fn fill_accounts(
    c: &mut ContainerUsage,
    counters: &Counters,
    sample: &GpuSample,
    metadata: &Metadata,
    inputs: &Inputs,
) {
    let Some(owner) = owner_key(c) else { return };
    let mut uuids: Vec<(String, String)> = c
        .gpus
        .iter()
        .map(|g| (g.uuid.clone(), g.gpu_uuid.clone()))
        .collect();
    let accounted = counters
        .ledgers
        .iter()
        .filter(|((o, _), l)| *o == owner && l.accounted_processes > 0)
        .map(|((_, u), _)| u);
    for u in c.allocated_gpus.iter().chain(accounted) {
        if !uuids.iter().any(|(x, _)| x == u) {
            let gpu = parent_of(sample, u).unwrap_or(u).to_string();
            uuids.push((u.clone(), gpu));
        }
    }
    let mut accounts = vec![];
    for (uuid, gpu_uuid) in uuids {
        let l = counters.ledgers.get(&(owner.clone(), uuid.clone()));
        let mut a = GpuAccount {
            uuid: uuid.clone(),
            gpu_uuid: gpu_uuid.clone(),
            ..Default::default()
        };
        if let Some(l) = l {
            a.energy_joules = l.energy_j;
            a.energy_since_ms = l.energy_since_ms;
            a.memory_peak_bytes = l.peak.max();
            a.accounted_processes = l.accounted_processes;
            a.accounted_gpu_seconds = l.accounted_gpu_seconds;
        }
        limits(&mut a, c, sample, metadata, inputs);
        if l.is_some() || a.memory_limit_bytes.is_some() {
            accounts.push(a);
        }
    }
    c.accounts = accounts;
}

/// The GPU a MIG device belongs to.
fn parent_of<'a>(sample: &'a GpuSample, uuid: &str) -> Option<&'a str> {
    sample
        .devices
        .iter()
        .find(|d| d.mig_devices.iter().any(|m| m.uuid == uuid))
        .map(|d| d.uuid.as_str())
}

/// HAMi's limit (enforced in the container) first, then the MIG device's size, then the
/// container's share of a time-sliced GPU.
fn limits(
    a: &mut GpuAccount,
    c: &ContainerUsage,
    sample: &GpuSample,
    metadata: &Metadata,
    inputs: &Inputs,
) {
    let only_device = c.gpus.len() == 1;
    let pids = c
        .gpus
        .iter()
        .filter(|g| g.uuid == a.uuid)
        .flat_map(|g| &g.pids);
    for l in pids.filter_map(|p| inputs.hami.get(p)) {
        a.sm_limit_percent = a.sm_limit_percent.or(l.sm_percent);
        if a.memory_limit_bytes.is_none() {
            a.memory_limit_bytes = l
                .memory_for(&a.uuid, only_device)
                .or_else(|| l.memory_for(&a.gpu_uuid, only_device));
            a.memory_limit_source = a.memory_limit_bytes.map(|_| LimitSource::Hami);
        }
    }
    if a.memory_limit_bytes.is_some() {
        return;
    }
    let gpu = sample.devices.iter().find(|d| d.uuid == a.gpu_uuid);
    if a.uuid != a.gpu_uuid {
        let mig = gpu.and_then(|d| d.mig_devices.iter().find(|m| m.uuid == a.uuid));
        a.memory_limit_bytes = mig.and_then(|m| m.memory_total_bytes);
        a.memory_limit_source = a.memory_limit_bytes.map(|_| LimitSource::Mig);
        return;
    }
    let replicas = metadata.replicas.get(&a.gpu_uuid).copied().unwrap_or(0);
    let (Some(ns), Some(pod), Some(name)) = (&c.namespace, &c.pod_name, &c.container_name) else {
        return;
    };
    let held: u32 = metadata
        .allocations_of(ns, pod, name)
        .iter()
        .map(|al| al.replicas_of(&a.gpu_uuid))
        .sum();
    let total = gpu.and_then(|d| d.memory_total_bytes);
    if let (true, Some(total)) = (replicas >= 2 && held >= 1, total) {
        a.memory_limit_bytes = Some(total / replicas as u64 * held.min(replicas) as u64);
        a.memory_limit_source = Some(LimitSource::Timeslice);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
