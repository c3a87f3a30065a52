//! The owners' slots (`Ledgers`): per owner, a short list of what is kept per device,
//! reached by a `Slot` that stays while the owner has any. The join keeps its cumulative
//! counters here (`Accumulated`); the billing stage keeps its own ledgers in another
//! `Ledgers` of the same kind.
use gpu_model::Name;

use super::owner::{same, Owner};

/// The cumulative counters of one (owner, device); forgotten (and started again) when the
/// owner has not used the device for `FORGET_AFTER_MS`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Accumulated {
    /// None until a cycle since `since_ms` knew the SM utilization: a MIG device never
    /// does, and its GPU time is unknown rather than 0.
    pub gpu_seconds: Option<f64>,
    pub byte_seconds: f64,
    /// First sample that saw it: when its counters started.
    pub since_ms: u64,
    /// Last cycle the owner had a process on the device or held its allocation, ms.
    pub last_seen_ms: u64,
}

/// An owner's ledgers: one per device.
pub type Devices<L> = Vec<(Name, L)>;

/// Where an owner's ledgers sit in `Ledgers`: stable while the owner has any, so that
/// each pass of a cycle reaches them without a lookup.
pub type Slot = u32;

/// Ledgers by owner, then by device: at most one hash lookup per owner a cycle (the
/// grouping's, where its hint from the cycle before does not hold), which hands out the
/// owner's `Slot`, and a short scan of its few devices. The counters were a map of their
/// own, looked up per (owner, device) each cycle, each
/// lookup a cache miss in memory gone cold since the cycle before.
#[derive(Debug, Clone)]
pub struct Ledgers<L> {
    index: hashbrown::HashMap<Owner, Slot, rustc_hash::FxBuildHasher>,
    /// (owner, its devices) by slot; a freed slot has neither and waits in `free`.
    slots: Vec<(Option<Owner>, Devices<L>)>,
    free: Vec<Slot>,
}

/// The same ledgers of the same owners, wherever their slots are (an owner with none, just
/// given its slot, counts as absent).
impl<L: PartialEq> PartialEq for Ledgers<L> {
    fn eq(&self, other: &Ledgers<L>) -> bool {
        let held = |l: &Ledgers<L>| l.slots.iter().filter(|(_, v)| !v.is_empty()).count();
        held(self) == held(other)
            && self.index.iter().all(|(o, &s)| {
                let mine = &self.slots[s as usize].1;
                let theirs = other.index.get(o).map(|&t| &other.slots[t as usize].1);
                mine.is_empty() || theirs == Some(mine)
            })
    }
}

impl<L> Default for Ledgers<L> {
    fn default() -> Self {
        Ledgers {
            index: Default::default(),
            slots: vec![],
            free: vec![],
        }
    }
}

impl<L> Ledgers<L> {
    pub fn get(&self, owner: &Owner, uuid: &Name) -> Option<&L> {
        let devices = &self.slots[*self.index.get(owner)? as usize].1;
        Some(&devices[position(devices, uuid)?].1)
    }

    pub fn get_mut(&mut self, owner: &Owner, uuid: &Name) -> Option<&mut L> {
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

    /// Asks for the memory a pass will read of `slot` (its owner and list) and, where
    /// `devices`, its first ledger's first `lines` cache lines: each a miss otherwise, in
    /// memory gone cold since the cycle before.
    pub fn prefetch(&self, slot: Slot, lines: usize) {
        let Some(entry) = self.slots.get(slot as usize) else {
            return;
        };
        gpu_model::prefetch(entry);
        // The list's address is in the entry: read only where its lines are asked for.
        if lines == 0 {
            return;
        }
        if let Some(d) = entry.1.first() {
            let p: *const u8 = (d as *const (Name, L)).cast();
            for line in 0..lines {
                gpu_model::prefetch(p.wrapping_add(64 * line));
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
    pub fn at(&mut self, slot: Slot) -> &mut Devices<L> {
        &mut self.slots[slot as usize].1
    }

    /// The devices of the owner in `slot`, to read.
    pub fn read(&self, slot: Slot) -> &[(Name, L)] {
        &self.slots[slot as usize].1
    }

    /// The owner's devices, made on first use.
    pub fn of(&mut self, owner: &Owner) -> &mut Devices<L> {
        let s = self.slot(owner, || owner.clone());
        self.at(s)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Owner, &Name, &L)> {
        self.slots
            .iter()
            .filter_map(|(o, v)| Some((o.as_ref()?, v)))
            .flat_map(|(o, v)| v.iter().map(move |(u, l)| (o, u, l)))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&Owner, &Name, &mut L)> {
        self.slots
            .iter_mut()
            .filter_map(|(o, v)| Some((o.as_ref()?, v)))
            .flat_map(|(o, v)| v.iter_mut().map(move |(u, l)| (o, &*u, l)))
    }

    pub fn len(&self) -> usize {
        self.slots.iter().map(|(_, v)| v.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many owners have ledgers.
    pub fn owners(&self) -> usize {
        self.index.len()
    }

    /// Forgets `owner`'s ledgers where `all` says so of them (an owner that is gone), and
    /// gives its slot back. Returns whether it had any and they went.
    pub fn forget(&mut self, owner: &Owner, all: impl FnOnce(&Devices<L>) -> bool) -> bool {
        let Some(&s) = self.index.get(owner) else {
            return false;
        };
        let (o, v) = &mut self.slots[s as usize];
        if !all(v) {
            return false;
        }
        *o = None;
        *v = vec![];
        self.index.remove(owner);
        self.free.push(s);
        true
    }

    /// Keeps the ledgers `keep` says to (given each one's device; it may also change them);
    /// an owner left with none
    /// gives its slot back.
    pub fn retain(&mut self, mut keep: impl FnMut(&Name, &mut L) -> bool) {
        for (s, (owner, v)) in self.slots.iter_mut().enumerate() {
            v.retain_mut(|(n, l)| keep(n, l));
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
pub fn position<L>(devices: &[(Name, L)], uuid: &Name) -> Option<usize> {
    devices.iter().position(|(u, _)| same(u, uuid))
}

/// The device's ledger in an owner's list, made on first use.
pub fn device<'a, L: Default>(devices: &'a mut Vec<(Name, L)>, uuid: &Name) -> &'a mut L {
    let i = match position(devices, uuid) {
        Some(i) => i,
        None => {
            // Most owners use one device: room for one, not the four (a KiB) a push makes.
            devices.reserve_exact(1);
            devices.push((uuid.clone(), L::default()));
            devices.len() - 1
        }
    };
    &mut devices[i].1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_forgotten_give_their_slots_to_the_next() {
        let mut l: Ledgers<u64> = Ledgers::default();
        let gpu: Name = "GPU-1".into();
        // Ten owners at a time, churned a thousand times over.
        for round in 0..100u64 {
            let owners: Vec<Owner> = (0..10)
                .map(|i| Owner::Container(format!("c{round}-{i}").as_str().into()))
                .collect();
            for o in &owners {
                *device(l.of(o), &gpu) = round;
            }
            assert_eq!((l.owners(), l.len()), (10, 10));
            for o in &owners {
                assert!(l.forget(o, |_| true));
                assert!(!l.forget(o, |_| true), "forgotten already");
            }
            assert_eq!((l.owners(), l.len()), (0, 0));
        }
        assert_eq!(l.slots.len(), 10, "slots are taken again, not added");
        let kept = Owner::Pod("p".into());
        device(l.of(&kept), &gpu);
        assert!(!l.forget(&kept, |_| false), "kept where the caller says so");
        assert_eq!(l.owners(), 1);
    }
}
