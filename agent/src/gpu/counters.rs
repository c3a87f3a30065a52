//! What the join carries from one cycle to the next, updated in place: the ledgers, the
//! energy counters, the names kept per owner, the spare lists and the owners' order.
use std::collections::HashMap;

use rustc_hash::FxHashSet;

use gpu_model::Name;

use super::{
    ledger::{EnergyShares, Ledgers, Slot},
    naming::Naming,
    owner::Owner,
    spare::Spare,
};

/// What the join carries from one cycle to the next, updated in place.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    pub last_sample_ms: u64,
    /// Cumulative counters, energy, peaks, accounting and open sessions per (owner,
    /// device): see `account`.
    pub ledgers: Ledgers,
    /// Per GPU uuid: its energy counter at the last sample, mJ.
    pub energy_mj: HashMap<String, u64>,
    /// Per GPU uuid: energy charged to nobody (idle, not allocated), J.
    pub idle_energy: HashMap<String, f64>,
    /// Per GPU uuid: the shares of the cycles since its energy counter last moved.
    pub energy_shares: HashMap<String, EnergyShares>,
    /// The last sample's GPU uuids, shared by every entry, key and ledger on them (a MIG
    /// device's is shared by the sample itself).
    pub uuids: FxHashSet<Name>,
    /// Each owner's names and allocated devices, kept while they hold.
    pub naming: Naming,
    /// The lists of the snapshot before, to fill again.
    pub spare: Spare,
    pub order: Order,
    /// The slot of each process of the last sample, by position (`slot_of`).
    pub hints: Vec<Slot>,
}

/// The owners' order of the cycle before: its groups as they came (their owners), and where
/// each went once sorted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Order {
    pub(super) came: Vec<Owner>,
    pub(super) sorted: Vec<u32>,
}
