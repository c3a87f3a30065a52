//! What billing carries per (owner, device) from one cycle to the next (`Ledger`: the
//! join's totals last seen, energy, peaks, accounting, the open stretch of use), held by
//! owner in the join's kind of `Ledgers`, and the pending energy shares per GPU
//! (`EnergyShares`).
use std::collections::{HashMap, VecDeque};

use gpu_model::{ContainerGpu, ContainerUsage, Name, UsageRecord, Workload};

use super::profile::Profile;
use crate::gpu::join::owner::{KeyRef, Owner};

pub use crate::gpu::join::ledger::{device, position, Slot};

/// Billing's ledgers by owner, then by device.
pub type Ledgers = crate::gpu::join::ledger::Ledgers<Ledger>;

/// One owner's ledgers, by device.
pub type Devices = crate::gpu::join::ledger::Devices<Ledger>;

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

/// Who a record names: the container's identity and names when the stretch last saw it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordNames {
    pub container_id: Option<Name>,
    pub pod_uid: Option<Name>,
    pub pod_name: Option<Name>,
    pub namespace: Option<Name>,
    pub container_name: Option<Name>,
    pub workload: Option<std::sync::Arc<Workload>>,
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
            && match (&self.workload, &c.workload) {
                (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
                (a, b) => a.is_none() && b.is_none(),
            }
    }

    /// A record that names them, and nothing else yet.
    pub(super) fn record(&self) -> UsageRecord {
        let text = |n: &Option<Name>| n.as_deref().map(str::to_string);
        let w = self.workload.as_deref();
        UsageRecord {
            container_id: text(&self.container_id),
            pod_uid: text(&self.pod_uid),
            pod_name: text(&self.pod_name),
            namespace: text(&self.namespace),
            container_name: text(&self.container_name),
            workload_kind: w.map(|w| w.kind.as_str().to_string()),
            workload: w.map(|w| w.name.to_string()),
            replicaset: w.and_then(|w| text(&w.replicaset)),
            job: w.and_then(|w| text(&w.job)),
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
            workload: c.workload.clone(),
        }
    }
}

/// The device a stretch is on, and what the container was given of it: the usage record's
/// `device_model`, `device_memory_bytes`, `mig_profile`, `gpus_allocated` and its claim.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceFacts {
    /// The GPU's model and memory (a MIG device's parent's).
    pub model: Option<String>,
    pub memory_bytes: Option<u64>,
    pub mig_profile: Option<String>,
    pub gpus_allocated: Option<f64>,
    /// The device's part of its GPU: 1, or a MIG profile's compute slices over the GPU's.
    pub part: f64,
    /// The DRA claim's device it was allocated through.
    pub claim: Option<std::sync::Arc<gpu_model::DraDevice>>,
}

impl DeviceFacts {
    /// The part of a GPU the stretch holds: its allocation, else its device's part.
    pub fn held(&self) -> f64 {
        self.gpus_allocated.unwrap_or(self.part)
    }
}

/// An open stretch's device facts, the allocation they were read with (read again when it
/// changes), and its profile.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Detail {
    pub device: DeviceFacts,
    pub allocated: std::sync::Arc<[Name]>,
    pub profile: Profile,
}

/// One stretch of use of a device by a container: from its first process there, or the
/// first cycle the device was allocated to it, to the last of either. The totals at its
/// start, to subtract at its end.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stretch {
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
    /// Whether any of its cycles had a process of the container on the device.
    pub used: bool,
    /// What Prometheus is shown of it (`container.gpu.share`, `.sm.share`): the part of a
    /// GPU it holds, and its last SM figure as a part of a whole GPU. Kept here, beside
    /// what the account pass reads, not in `detail`: a pointer chased per stretch a cycle
    /// there cost the large node's join (docs/benchmarks.md).
    pub held: f64,
    pub sm_share: Option<f64>,
    /// Boxed: what only an open stretch needs stays out of every ledger.
    pub detail: Box<Detail>,
}

/// The join's cumulative counters of a device as billing last saw them in a snapshot:
/// where a stretch that opens starts, and where one that ends stops.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    /// When the join's counters started (`counters_since_ms`): another start means they
    /// were forgotten and started again from zero.
    pub since_ms: u64,
    pub gpu_seconds: Option<f64>,
    pub byte_seconds: f64,
}

impl Totals {
    /// Takes the totals of an entry's device this cycle, and gives back those before this
    /// cycle's credit: the last seen, or none where the join's counters started again.
    pub fn take(&mut self, g: &ContainerGpu) -> Totals {
        let fresh = Totals {
            since_ms: g.counters_since_ms,
            gpu_seconds: g.gpu_time_seconds,
            byte_seconds: g.memory_byte_seconds,
        };
        let before = std::mem::replace(self, fresh);
        match before.since_ms == self.since_ms {
            true => before,
            false => Totals::default(),
        }
    }
}

/// Ledgers idle for this long are forgotten, as the join forgets its counters.
const FORGET_AFTER_MS: u64 = crate::gpu::join::joiner::FORGET_AFTER_MS;

/// Per (owner, device): what billing carries across cycles.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ledger {
    pub totals: Totals,
    pub energy_j: f64,
    pub energy_since_ms: u64,
    /// Last cycle that charged it anything (energy, accounting), ms.
    pub last_charged_ms: u64,
    /// Last cycle the owner had a process on the device, ms.
    pub last_used_ms: u64,
    /// Last cycle the device was allocated to the owner, ms.
    pub last_allocated_ms: u64,
    pub accounted_processes: u64,
    pub accounted_gpu_seconds: f64,
    pub peak: PeakWindow,
    pub stretch: Option<Stretch>,
}

impl Ledger {
    /// Whether the ledger is kept at `now`. The totals of a device neither used nor held for
    /// a while are forgotten, as the join forgets its counters; the ledger goes unless
    /// charged lately (an allocated, idle GPU's energy) or in the middle of a stretch.
    pub fn kept(&mut self, now: u64) -> bool {
        let seen = self.last_used_ms.max(self.last_allocated_ms);
        if now.saturating_sub(seen) >= FORGET_AFTER_MS && self.stretch.is_none() {
            self.totals = Totals::default();
        }
        self.stretch.is_some()
            || now.saturating_sub(self.last_used_ms.max(self.last_charged_ms)) < FORGET_AFTER_MS
    }
}

/// What billing carries from one cycle to the next, updated in place.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Books {
    /// Per (owner, device): totals seen, energy, peaks, accounting and open stretches.
    pub ledgers: Ledgers,
    /// Per GPU uuid: its energy counter at the last sample, mJ.
    pub energy_mj: HashMap<String, u64>,
    /// Per GPU uuid: energy charged to nobody (idle, not allocated), J.
    pub idle_energy: HashMap<String, f64>,
    /// Per GPU uuid: the shares of the cycles since its energy counter last moved.
    pub energy_shares: HashMap<String, EnergyShares>,
    /// The slot of each snapshot entry's owner last cycle, by position.
    pub hints: Vec<Slot>,
    /// How many stretches the last pass left open (counted as it closed the others).
    pub open_stretches: usize,
}

/// The shares of the cycles since a GPU's energy counter last moved: energy is read every
/// `nvml.energy_interval_ms` and held in between, and each increase is split by the mean of
/// the shares of the cycles it spans, so that a container that ran between two reads is
/// charged its part. Fractions of one cycle each.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EnergyShares {
    /// (owner, the device charged: the GPU or one of its MIG devices) -> summed shares.
    pub(super) owners: Shares,
    pub(super) idle: f64,
    pub(super) cycles: u32,
}

/// Summed shares by (owner, device), in the order they first came. A cycle's shares come in
/// the order of the one before while the owners stay, so each is looked for first where the
/// one before it was found, plus one: by pointer, in a list read in order. A map lookup per
/// share and cycle (the energy is read every few cycles: the others only add up shares),
/// in memory gone cold since, was a visible part of the large node's agent. The map finds the others.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Shares {
    pub(super) entries: Vec<(Owner, Name, f64)>,
    pub(super) index: hashbrown::HashMap<(Owner, Name), usize, rustc_hash::FxBuildHasher>,
    /// Where the next share of this cycle is looked for first.
    pub(super) next: usize,
}

impl Shares {
    pub(super) fn add(&mut self, owner: &Owner, name: &Name, f: f64) {
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
        l.retain(|_, x| x.energy_j > 1.5);
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
        let mut devices: Vec<(Name, Ledger)> = vec![];
        let (a, b): (Name, Name) = ("GPU-a".into(), "GPU-b".into());
        device(&mut devices, &a).energy_j = 1.0;
        assert_eq!((devices.len(), devices.capacity()), (1, 1));
        device(&mut devices, &b);
        device(&mut devices, &a).energy_j += 1.0;
        assert_eq!(devices.len(), 2);
        assert_eq!(devices[0].1.energy_j, 2.0);
    }
}
