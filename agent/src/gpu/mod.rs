//! GPU samples: what NVML says each cycle, as small value types the join consumes. The
//! NVIDIA binding (nvml.rs) is a thin layer under these; nothing else sees NVML.
pub mod nvml;

pub use gpu_model::{DeviceSample, GpuSample, MigSample, ProcessSample};
