//! gpu-agent: which container holds this GPU memory, who burns this GPU.
pub mod cache;
pub mod cgroup;
pub mod config;
pub mod ebpf;
pub mod gpu;
pub mod http;
pub mod join;
pub mod metadata;
pub mod procfs;
pub mod run;
pub mod state;
pub mod stats;
pub mod top;
pub mod tracker;
