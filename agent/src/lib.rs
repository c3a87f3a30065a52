//! gpu-agent: which container holds this GPU memory, who burns this GPU.
//!
//! The data flows down this list, and no module imports one above it (tests/layers.rs
//! checks that):
//! 1. `ebpf`: kernel events (programs, the PROCS map, decoded notifications);
//! 2. `process`: process state (cache, cgroups, /proc), and `metadata`: names and GPU
//!    allocations from the node's sockets;
//! 3. `gpu`: NVML samples and the join;
//! 4. `pipeline`: owns the state and the join, publishes each snapshot;
//! 5. `sinks`: the HTTP endpoints, the OTLP push, `gpu-agent top`, usage records;
//! 6. `rightsize`: `gpu-agent rightsize`, over the usage records (and NVML's MIG profiles);
//! 7. `run`: the wiring.
//!
//! `config` and `stats` sit under all of them.
pub mod config;
pub mod stats;

pub mod ebpf;

pub mod metadata;
pub mod process;

pub mod gpu;

pub mod pipeline;

pub mod sinks;

pub mod rightsize;

pub mod run;
