//! What the join carries from one cycle to the next, updated in place: the cumulative
//! counters, the names kept per owner and the owners' order.
use rustc_hash::FxHashSet;

use gpu_model::Name;

use super::{
    ledger::{Accumulated, Ledgers, Slot},
    naming::Naming,
    owner::Owner,
};

/// What the join carries from one cycle to the next, updated in place.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    pub last_sample_ms: u64,
    /// Cumulative counters per (owner, device).
    pub ledgers: Ledgers<Accumulated>,
    /// The last sample's GPU uuids, shared by every entry, key and ledger on them (a MIG
    /// device's is shared by the sample itself).
    pub uuids: FxHashSet<Name>,
    /// Each owner's names and allocated devices, kept while they hold.
    pub naming: Naming,
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
