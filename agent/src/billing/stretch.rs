//! Stretches of use and their usage records. A container's stretch on a device runs while
//! it has a process there or holds the device's allocation, and ends in one record; one
//! longer than `usage.max_record_secs` is cut into records (`checkpoint`), each starting
//! where the last ended. A stretch keeps its profile (SM and memory histograms) and the
//! facts of its device.
use std::sync::Arc;

use gpu_model::{mig_gpu_slices, mig_part, ContainerUsage, GpuSample, Name, UsageRecord};

use super::{
    ledger::{Detail, DeviceFacts, Ledger, Ledgers, RecordNames, Stretch, Totals},
    profile::{Profile, SmSource},
};
use crate::{
    gpu::join::owner::{same, DeviceNames, Owner},
    metadata::Metadata,
};

/// What a cycle's stretches read of it.
#[derive(Clone, Copy)]
pub struct Cycle<'a> {
    pub sample: &'a GpuSample,
    pub names: &'a DeviceNames,
    pub metadata: &'a Metadata,
    pub now: u64,
    /// A stretch open this long is cut (`usage.max_record_secs`).
    pub max_record_ms: u64,
}

/// A device and the GPU it is (the same name) or is a MIG device of.
#[derive(Debug, Clone, Copy)]
pub struct Device<'a> {
    pub uuid: &'a Name,
    pub gpu_uuid: &'a Name,
}

/// One cycle of a container on a device: its SM utilization (where known, and whence),
/// the memory it held, whether it had a process there, and the join's totals a stretch
/// opened this cycle starts from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Use<'a> {
    pub sm: Option<(u32, SmSource)>,
    pub memory_bytes: u64,
    pub used: bool,
    pub from: &'a Totals,
}

/// Advances the container's stretch on device `on` by this cycle's use, opening it at the
/// first from `u.from`: the join's totals before this cycle's credit where the device was
/// used this cycle, else the totals now.
pub fn advance(l: &mut Ledger, c: &ContainerUsage, on: Device, u: Use, cy: &Cycle) {
    let gpu_uuid = on.gpu_uuid;
    let totals = u.from;
    if l.stretch.is_none() {
        l.stretch = Some(Stretch {
            gpu_uuid: gpu_uuid.clone(),
            start_ms: cy.now,
            end_ms: cy.now,
            gpu_seconds: totals.gpu_seconds.unwrap_or(0.0),
            byte_seconds: totals.byte_seconds,
            energy_j: l.energy_j,
            accounted_processes: l.accounted_processes,
            accounted_gpu_seconds: l.accounted_gpu_seconds,
            names: RecordNames::of(c),
            detail: Box::new(Detail {
                device: facts(c, on, cy),
                allocated: c.allocated_gpus.clone(),
                profile: Profile::default(),
            }),
            ..Default::default()
        });
    }
    let Some(s) = &mut l.stretch else { return };
    s.end_ms = cy.now;
    s.peak = s.peak.max(u.memory_bytes);
    s.used |= u.used;
    let d = &mut *s.detail;
    d.profile.add(u.sm, u.memory_bytes);
    s.sm_share = (u.sm).map(|(pct, _)| f64::from(pct.min(100)) / 100.0 * d.device.part);
    // Names arrive after the first sample, and come anew with each metadata refresh; the
    // allocation with them. An empty allocation may be a new empty list each cycle.
    let same_allocation = Arc::ptr_eq(&d.allocated, &c.allocated_gpus)
        || (d.allocated.is_empty() && c.allocated_gpus.is_empty());
    if !s.names.shares(c) || !same_allocation {
        s.names = RecordNames::of(c);
        d.allocated = c.allocated_gpus.clone();
        d.device = facts(c, on, cy);
    }
    s.held = d.device.held();
}

/// The device's model and memory (the GPU's), its MIG profile, and the part of a GPU the
/// container was allocated on it.
fn facts(c: &ContainerUsage, on: Device, cy: &Cycle) -> DeviceFacts {
    let Device { uuid, gpu_uuid } = on;
    let gpu = cy.names.gpu_index(gpu_uuid);
    let device = gpu.map(|i| &cy.sample.devices[i]);
    let mig = match same(uuid, gpu_uuid) {
        true => None,
        false => gpu.and_then(|i| cy.names.mig(cy.sample, i, uuid)),
    };
    let mig_profile = mig.and_then(|m| m.profile.clone());
    // A MIG device's part of its GPU: its profile's compute slices over the GPU's.
    let mig_part = (mig_profile.as_deref())
        .map(|p| mig_part(p, mig_gpu_slices(device.map_or("", |d| &d.name))));
    DeviceFacts {
        model: device.map(|d| d.name.clone()),
        memory_bytes: device.and_then(|d| d.memory_total_bytes),
        gpus_allocated: allocated_share(c, on, mig_part, cy.metadata),
        mig_profile,
        part: mig_part.unwrap_or(1.0),
        claim: c.claim_of(uuid).map(|d| d.dra.clone()),
    }
}

/// The part of a GPU the container was allocated on device `on`: the device's part of its
/// GPU (1, or a MIG device's; None where its profile is unknown) over the containers it is
/// shared among. A DRA claim's device held by N containers is shared N ways (each holds
/// 1/N of it); a time-sliced GPU, by the replicas the container holds over the GPU's. None
/// where the device is not allocated to the container.
fn allocated_share(
    c: &ContainerUsage,
    on: Device,
    mig_part: Option<f64>,
    metadata: &Metadata,
) -> Option<f64> {
    let Device { uuid, gpu_uuid } = on;
    if !c.allocated_gpus.iter().any(|a| **a == **uuid) {
        return None;
    }
    let whole_gpu = same(uuid, gpu_uuid);
    let device = if whole_gpu { Some(1.0) } else { mig_part };
    let (held, of) = match c.claim_of(uuid) {
        Some(d) => (1, d.holders),
        None if whole_gpu => time_slices(c, gpu_uuid, metadata),
        None => (1, 1),
    };
    device.map(|p| p * f64::from(held) / f64::from(of.max(1)))
}

/// The time-slicing replicas of GPU `gpu_uuid` the container holds and the GPU's; (1, 1)
/// for a GPU not time-sliced.
fn time_slices(c: &ContainerUsage, gpu_uuid: &Name, metadata: &Metadata) -> (u32, u32) {
    let replicas = metadata.replicas_of(gpu_uuid);
    if replicas < 2 {
        return (1, 1);
    }
    let (Some(ns), Some(pod), Some(name)) = (&c.namespace, &c.pod_name, &c.container_name) else {
        return (1, replicas);
    };
    let held = metadata.replicas_held(ns, pod, name, gpu_uuid);
    (held.clamp(1, replicas), replicas)
}

/// Ends the stretch in `l` (on device `uuid`) and returns its record.
pub fn end(l: &mut Ledger, uuid: &Name, reason: &str) -> Option<UsageRecord> {
    let acc = &l.totals;
    let s = l.stretch.take()?;
    // A stretch that never had a process ran nothing: no GPU time, known to be none.
    let gpu_seconds = match s.used {
        true => acc.gpu_seconds.map(|g| (g - s.gpu_seconds).max(0.0)),
        false => Some(0.0),
    };
    let Detail {
        device, profile: p, ..
    } = *s.detail;
    Some(UsageRecord {
        uuid: uuid.to_string(),
        gpu_uuid: s.gpu_uuid.to_string(),
        start_ms: s.start_ms,
        end_ms: s.end_ms,
        gpu_seconds,
        memory_byte_seconds: (acc.byte_seconds - s.byte_seconds).max(0.0),
        memory_peak_bytes: s.peak,
        energy_joules: (l.energy_j - s.energy_j).max(0.0),
        accounted_processes: l.accounted_processes - s.accounted_processes,
        accounted_gpu_seconds: (l.accounted_gpu_seconds - s.accounted_gpu_seconds).max(0.0),
        reason: reason.into(),
        sm_p50: p.sm(0.5),
        sm_p95: p.sm(0.95),
        sm_max: p.sm_max(),
        sm_source: p.sm_source().map(str::to_string),
        memory_p95_bytes: p.memory(0.95, s.peak),
        device_model: device.model,
        device_memory_bytes: device.memory_bytes,
        gpus_allocated: device.gpus_allocated,
        mig_profile: device.mig_profile,
        claim: device.claim.as_ref().map(|d| d.claim_name.clone()),
        claim_namespace: device.claim.as_ref().map(|d| d.claim_namespace.clone()),
        ..s.names.record()
    })
}

/// Ends the stretch in `l` at its last cycle into a `checkpoint` record, and opens the
/// next where it ended, from the totals now: nothing is counted twice.
fn checkpoint(l: &mut Ledger, uuid: &Name) -> Option<UsageRecord> {
    let s = l.stretch.as_ref()?;
    let acc = &l.totals;
    let next = Stretch {
        gpu_uuid: s.gpu_uuid.clone(),
        start_ms: s.end_ms,
        end_ms: s.end_ms,
        gpu_seconds: acc.gpu_seconds.unwrap_or(0.0),
        byte_seconds: acc.byte_seconds,
        energy_j: l.energy_j,
        accounted_processes: l.accounted_processes,
        accounted_gpu_seconds: l.accounted_gpu_seconds,
        peak: 0,
        names: s.names.clone(),
        used: false,
        held: s.held,
        sm_share: s.sm_share,
        detail: Box::new(Detail {
            device: s.detail.device.clone(),
            allocated: s.detail.allocated.clone(),
            profile: Profile::default(),
        }),
    };
    let record = end(l, uuid, "checkpoint");
    l.stretch = Some(next);
    record
}

/// The stretches of the owner's devices open for `max_record_ms` or more are cut
/// (`checkpoint`): after the cycle was credited and charged, while they are at hand.
pub fn cut_due(devices: &mut [(Name, Ledger)], cy: &Cycle, records: &mut Vec<UsageRecord>) {
    for (uuid, l) in devices {
        let due = l.stretch.as_ref().is_some_and(|s| {
            s.end_ms == cy.now && cy.now.saturating_sub(s.start_ms) >= cy.max_record_ms
        });
        if due {
            records.extend(checkpoint(l, uuid));
        }
    }
}

/// Stretches whose container neither used nor held the device this cycle end (`exited`),
/// and the ledgers no longer kept (`Ledger::kept`) are forgotten, in one pass; with how
/// many stretches stay open.
pub fn close_ended(ledgers: &mut Ledgers, now: u64) -> (Vec<UsageRecord>, usize) {
    let mut records = vec![];
    let mut open = 0;
    ledgers.retain(|uuid, l| {
        let ended = l.stretch.is_some() && l.last_used_ms != now && l.last_allocated_ms != now;
        if ended {
            records.extend(end(l, uuid, "exited"));
        }
        open += usize::from(l.stretch.is_some());
        l.kept(now)
    });
    (records, open)
}

/// Ends the stretch of `key` and returns its record.
pub fn close(ledgers: &mut Ledgers, key: &(Owner, Name), reason: &str) -> Option<UsageRecord> {
    let l = ledgers.get_mut(&key.0, &key.1)?;
    end(l, &key.1, reason)
}
