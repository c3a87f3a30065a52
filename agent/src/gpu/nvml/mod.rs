//! The NVML side, alone in calling NVML. `cycle.rs` (init, backoff, one cycle over the
//! devices) reads each device (`device.rs`) and its processes (`processes.rs`) through a
//! `reader::Reader`, on a reader thread per device that the cycle waits for until its
//! deadline and retires when it is stuck in a call (`readers.rs`); `fields.rs`, `gpm.rs`
//! and `xid.rs` (with `kmsg.rs`) add dcgm-exporter's fields; `sampler.rs` runs the cycle
//! on its thread, watched for stalls, and sends each `GpuSample`.
pub mod cycle;
pub mod device;
pub mod fields;
pub mod gpm;
pub mod kmsg;
pub mod processes;
pub mod reader;
pub mod readers;
pub mod sampler;
pub mod slow;
pub mod xid;

pub use cycle::{describe_init_error, open};
pub use gpu_model::{DeviceSample, GpuSample, MigSample, ProcessSample};
