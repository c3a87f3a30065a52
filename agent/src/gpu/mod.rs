//! GPU sample + join: what NVML says each cycle, as small value types, sampled on a thread
//! of its own, and joined with the process state into a snapshot.
//!
//! The NVML side (nothing else sees NVML): nvml.rs (init, backoff, the cycle) reads each
//! device (device.rs) and its processes (processes.rs) through reader.rs, on a reader
//! thread the cycle waits for until its deadline and retires when it is stuck in a call
//! (readers.rs); fields.rs, gpm.rs and xid.rs add dcgm-exporter's fields; sampler.rs runs
//! the cycle on its thread, watched for stalls.
//!
//! The join side, lowest first: owner.rs (who a process is charged to, the sample's device
//! names), profile.rs (a stretch's SM and memory histograms), ledger.rs (per owner and
//! device, what carries across cycles), naming.rs, spare.rs, counters.rs (all the join
//! carries), stretch.rs (stretches of use and their usage records), account.rs (energy,
//! GPU time, peaks, limits), group.rs (processes grouped by owner), sharing.rs and xid_charge.rs (the join
//! owner's side across cycles), join.rs (the join and its owner, `Joiner`). A file uses
//! only those below it: join calls account, naming and sharing; none of them calls back
//! (agent/tests/layers.rs checks it).
pub mod account;
pub mod counters;
pub mod device;
pub mod fields;
pub mod gpm;
pub mod group;
pub mod join;
pub mod kmsg;
pub mod ledger;
pub mod naming;
pub mod nvml;
pub mod owner;
pub mod processes;
pub mod profile;
pub mod reader;
pub mod readers;
pub mod sampler;
pub mod sharing;
pub mod spare;
pub mod stretch;
pub mod xid;
pub mod xid_charge;

pub use gpu_model::{DeviceSample, GpuSample, MigSample, ProcessSample};
