//! What NVML says each cycle and who it is: two halves that know nothing of each other.
//!
//! - `nvml/`: the NVML side. Devices, their processes, dcgm-exporter's fields, GPM and
//!   XIDs, read on reader threads with deadlines and sent as a `GpuSample` each cycle.
//!   Nothing else calls NVML.
//! - `join/`: the join. A sample and the process state become a `Snapshot`: who uses
//!   which GPU, now, by container and pod. It knows nothing of money: energy, stretches
//!   and usage records are the billing stage's (`crate::billing`), which reads each
//!   snapshot after the join.
//!
//! agent/tests/layers.rs checks that neither half imports the other and that no file of
//! either uses one that uses it.
pub mod join;
pub mod nvml;

pub use gpu_model::{DeviceSample, GpuSample, MigSample, ProcessSample};
