//! GPU sample + join: what NVML says each cycle, as small value types (nvml.rs is the thin
//! NVIDIA binding under them; nothing else sees NVML), sampled on a thread of its own
//! (sampler.rs), and joined with the process state into a snapshot (join.rs). The join
//! also accounts energy, peaks, limits and NVML accounting per container and device, and
//! closes usage records (account.rs); its owner's side of that, across cycles, is
//! sharing.rs.
pub mod account;
pub mod join;
pub mod naming;
pub mod nvml;
pub mod sampler;
pub mod spare;
// dcgm-exporter's fields from NVML: health fields, profiling (GPM), XID errors.
pub mod fields;
pub mod gpm;
pub mod kmsg;
pub mod sharing;
pub mod xid;
pub mod xid_charge;

pub use gpu_model::{DeviceSample, GpuSample, MigSample, ProcessSample};
