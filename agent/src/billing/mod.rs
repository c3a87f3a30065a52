//! The billing stage: what is owed, read from each snapshot and its sample after the join,
//! as a transform reads events. It owns its own ledgers and adds its part to the snapshot
//! (each entry's `accounts`, the GPUs' idle energy, entries of owners charged only through
//! NVML accounting) before the pipeline publishes it, and hands usage records to the usage
//! sink.
//!
//! Lowest first: `profile.rs` (a stretch's SM and memory histograms), `ledger.rs` (per
//! owner and device, what carries across cycles: `Books`), `stretch.rs` (stretches of use
//! and their records), `account.rs` (the energy split, peaks, accounting, limits: the pass
//! over a snapshot), `hami.rs` (HAMi's limits from the processes' environments),
//! `exits.rs` (exited processes' NVML accounting stats), and `Billing` here, which runs
//! them each cycle. A file uses only those below it (agent/tests/layers.rs checks it).
use std::path::Path;

use gpu_model::{GpuSample, Name, Snapshot, UsageRecord};

pub mod account;
#[cfg(test)]
mod dra_tests;
pub mod exits;
pub mod hami;
pub mod ledger;
pub mod profile;
pub mod stretch;
#[cfg(test)]
mod tests;

use crate::{
    config::UsageConfig,
    gpu::{
        join::{
            owner::{DeviceNames, Owner},
            Joined,
        },
        nvml::sampler::AccountingRequests,
    },
    metadata::Metadata,
    process::Resolver,
};

/// Where usage records go: the usage sink's queue, counted by whoever built it.
pub type Deliver = Box<dyn FnMut(UsageRecord) + Send>;

/// How billing runs (`[usage]`).
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// The window of the peak-memory gauge (`usage.peak_window_secs`), ms.
    pub peak_window_ms: u64,
    /// A stretch of use longer than this is cut into records (`usage.max_record_secs`).
    pub max_record_ms: u64,
}

impl Settings {
    pub fn of(usage: &UsageConfig) -> Settings {
        Settings {
            peak_window_ms: usage.peak_window_secs * 1000,
            max_record_ms: usage.max_record_secs * 1000,
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings::of(&UsageConfig::default())
    }
}

/// The billing stage and all it carries across cycles.
#[derive(Default)]
pub struct Billing {
    pub settings: Settings,
    books: ledger::Books,
    hami: hami::Hami,
    exits: exits::Exits,
    /// None: records are off.
    records: Option<Deliver>,
    /// Containers gone whose ledgers wait for a stretch to close or energy to be charged.
    gone: Vec<Owner>,
}

impl std::fmt::Debug for Billing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Billing")
            .field("settings", &self.settings)
            .field("books", &self.books)
            .field("records", &self.records.is_some())
            .finish()
    }
}

impl Billing {
    /// Set up from `[usage]`: where records go (None: nowhere). Returns the queue the NVML
    /// thread reads accounting requests from (None: accounting off).
    pub fn new(
        usage: &UsageConfig,
        proc_root: &Path,
        records: Option<Deliver>,
    ) -> (Billing, Option<AccountingRequests>) {
        let requests = usage.accounting.then(AccountingRequests::default);
        let billing = Billing {
            settings: Settings::of(usage),
            books: ledger::Books::default(),
            hami: hami::Hami::new(usage.hami_limits, proc_root.to_path_buf()),
            exits: exits::Exits::new(requests.clone()),
            records: records.filter(|_| usage.records),
            gone: vec![],
        };
        (billing, requests)
    }

    /// Bills one snapshot, in place, before it is published, with what the join found out
    /// about its entries (`Joiner::joined`). Then the exits noticed go to the NVML thread
    /// and the records of ended stretches to the sink.
    pub fn bill(
        &mut self,
        snap: &mut Snapshot,
        sample: &GpuSample,
        joined: Joined,
        procs: &impl Resolver,
        metadata: &Metadata,
    ) {
        let records = self.account(snap, sample, joined, metadata);
        self.forget_gone();
        self.exits.watch(sample, procs, metadata);
        self.emit(records);
    }

    /// The account pass over one snapshot, and the records it closed.
    fn account(
        &mut self,
        snap: &mut Snapshot,
        sample: &GpuSample,
        joined: Joined,
        metadata: &Metadata,
    ) -> Vec<UsageRecord> {
        let accounted = self.exits.accounted(sample);
        let inputs = account::Inputs {
            hami: self.hami.of(sample),
            accounted: &accounted,
            settings: &self.settings,
        };
        let books = &mut self.books;
        bill_snapshot(books, snap, sample, joined, metadata, &inputs)
    }

    /// Stretches still open: a record each (`agent_stopped`), so that a restart loses no
    /// usage; the rest comes in a later record. Called once, when the pipeline stops.
    pub fn finish(&mut self) {
        let open: Vec<(Owner, Name)> = (self.books.ledgers.iter())
            .filter(|(_, _, l)| l.stretch.is_some())
            .map(|(o, u, _)| (o.clone(), u.clone()))
            .collect();
        let records = open
            .iter()
            .filter_map(|k| stretch::close(&mut self.books.ledgers, k, "agent_stopped"))
            .collect();
        self.emit(records);
    }

    /// Hands records to the usage sink.
    fn emit(&mut self, records: Vec<UsageRecord>) {
        if let Some(deliver) = &mut self.records {
            records.into_iter().for_each(deliver);
        }
    }

    /// Containers whose cgroups are gone (`Tracker::gc`): their ledgers are forgotten once
    /// nothing is still to come for them, at once for most (`forget_gone`).
    pub fn gone(&mut self, ids: &[String]) {
        let owners = ids.iter().map(|id| Owner::Container(id.as_str().into()));
        self.gone.extend(owners);
        self.forget_gone();
    }

    /// Forgets the ledgers of the gone owners that have no stretch open (its record is yet
    /// to be written) and no energy share pending (charged when the GPU's energy counter
    /// next moves, within `nvml.energy_interval_ms`); the others are asked again each cycle.
    fn forget_gone(&mut self) {
        if self.gone.is_empty() {
            return;
        }
        let ledger::Books {
            ledgers,
            energy_shares,
            ..
        } = &mut self.books;
        let pending: rustc_hash::FxHashSet<&Owner> = (energy_shares.values())
            .flat_map(|s| s.owners.entries.iter().map(|(o, _, _)| o))
            .collect();
        let closed = |d: &ledger::Devices| d.iter().all(|(_, l)| l.stretch.is_none());
        self.gone.retain(|o| {
            let waits = pending.contains(o) || !ledgers.forget(o, closed);
            waits && ledgers.find(o).is_some()
        });
    }

    /// The length of each structure billing keeps per owner, device or PID.
    pub fn lengths(&self) -> [(&'static str, usize); 7] {
        let b = &self.books;
        let shares = b.energy_shares.values().map(|s| s.owners.entries.len());
        let (watched, awaiting) = self.exits.lengths();
        [
            ("billing_ledgers", b.ledgers.len()),
            ("open_stretches", b.open_stretches),
            ("energy_shares", shares.sum()),
            ("exits_watched", watched),
            ("exits_awaiting", awaiting),
            ("hami_pids", self.hami.kept()),
            ("billing_gone_waiting", self.gone.len()),
        ]
    }
}

/// One cycle's billing of a snapshot from what billing carries (`books`): what was
/// forgotten goes, the account pass runs, and each GPU's idle energy is set.
pub fn bill_snapshot(
    books: &mut ledger::Books,
    snap: &mut Snapshot,
    sample: &GpuSample,
    joined: Joined,
    metadata: &Metadata,
    inputs: &account::Inputs,
) -> Vec<UsageRecord> {
    let names = DeviceNames::new(sample, joined.gpu_names);
    let pass = account::Pass {
        sample,
        names: &names,
        owners: joined.owners,
        metadata,
        inputs,
    };
    let records = account::account(&mut snap.containers, books, &pass);
    for d in &mut snap.devices {
        d.sharing.idle_energy_joules = books.idle_energy.get(&d.uuid).copied();
    }
    records
}
