//! gpu-agent: which container holds this GPU memory, who burns this GPU.
//!
//! The data flows down this list, and no module imports one above it (tests/layers.rs
//! checks that):
//! 1. `ebpf`: kernel events (programs, the PROCS map, decoded notifications);
//! 2. `process`: process state (cache, cgroups, /proc), and `metadata`: names and GPU
//!    allocations from the node's sockets;
//! 3. `gpu`: NVML samples (`gpu::nvml`) and the join (`gpu::join`);
//! 4. `billing`: what is owed, read from each snapshot (energy, stretches, usage records);
//! 5. `pipeline`: owns the state, runs the join and billing, publishes each snapshot;
//! 6. `sinks`: the HTTP endpoints, the OTLP push, `gpu-agent top`, usage records;
//! 7. `rightsize`: `gpu-agent rightsize`, over the usage records (and NVML's MIG profiles);
//! 8. `run`: the wiring.
//!
//! `config` and `stats` sit under all of them.
pub mod config;
pub mod stats;

pub mod ebpf;

pub mod metadata;
pub mod process;

pub mod gpu;

pub mod billing;

pub mod pipeline;

pub mod sinks;

pub mod rightsize;

pub mod run;
