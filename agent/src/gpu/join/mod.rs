//! The join: a GPU sample (by host PID) and the process state become an immutable
//! snapshot per container and GPU. It says who uses what, now, and the cumulative
//! counters of that use; it knows nothing of energy, stretches or records (the billing
//! stage's, `crate::billing`).
//!
//! Lowest first: `owner.rs` (who a process is charged to; the sample's device names),
//! `ledger.rs` (the owners' slots and each one's counters per device), `naming.rs`,
//! `spare.rs`, `counters.rs` (all the join carries), `group.rs` (processes grouped by
//! owner), `xid_charge.rs` (XIDs by container), `claims.rs` (DRA devices that match
//! nothing), `joiner.rs` (the join and its owner, `Joiner`). A file uses only those below it (agent/tests/layers.rs checks it).
pub mod claims;
pub mod counters;
pub mod group;
pub mod joiner;
pub mod ledger;
pub mod naming;
pub mod owner;
pub mod spare;
pub mod xid_charge;

pub use gpu_model::{DeviceSample, GpuSample, MigSample, ProcessSample};
pub use joiner::{join, Coverage, JoinOptions, Joined, Joiner};
