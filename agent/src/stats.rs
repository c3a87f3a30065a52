//! The agent's own counters, served at /debug/stats.
use std::sync::{
    atomic::{AtomicU64, Ordering::Relaxed},
    RwLock,
};

use serde::Serialize;

use crate::ebpf::ProgramStats;

#[derive(Debug, Default)]
pub struct Stats {
    pub events_received: AtomicU64,
    /// Notifications the kernel could not put in the ring buffer (its own count).
    pub events_lost: AtomicU64,
    pub resyncs: AtomicU64,
    pub procfs_fallback_lookups: AtomicU64,
    pub procfs_rescans: AtomicU64,
    pub cgroup_walks: AtomicU64,
    pub kernel_map_full: AtomicU64,
    pub kernel_read_errors: AtomicU64,
    pub cached_processes: AtomicU64,
    pub tombstones: AtomicU64,
    pub cgroups_known: AtomicU64,
    pub startup_walk_ms: AtomicU64,
    pub ebpf_load_ms: AtomicU64,
    pub nvml_samples: AtomicU64,
    /// CPU time (thread clock) of the NVML sampling thread, NVML's own calls included.
    pub nvml_sample_cpu_ns: AtomicU64,
    /// CPU time of joining samples and publishing snapshots.
    pub join_cpu_ns: AtomicU64,
    pub gpu_processes: AtomicU64,
    pub gpu_processes_unresolved: AtomicU64,
    pub nvml: RwLock<String>,
    pub export: std::sync::Arc<otel::export::ExportCounters>,
    /// "disabled" or the OTLP URL pushed to.
    pub otlp: RwLock<String>,
    /// Metadata sources' health: "cri", "pod_resources", "docker" -> "ok" | "unavailable: ...".
    pub metadata: std::sync::Arc<RwLock<std::collections::BTreeMap<String, String>>>,
    pub mode: RwLock<Mode>,
    pub programs: RwLock<Vec<ProgramStats>>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Mode {
    /// "ebpf" or "procfs" ("starting" before either).
    pub mode: &'static str,
    /// Why the agent is in /proc mode.
    pub reason: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct StatsView {
    pub mode: &'static str,
    pub degraded_reason: Option<String>,
    pub events_received: u64,
    pub events_lost: u64,
    pub resyncs: u64,
    pub procfs_fallback_lookups: u64,
    pub procfs_rescans: u64,
    pub cgroup_walks: u64,
    pub kernel_map_full: u64,
    pub kernel_read_errors: u64,
    pub cached_processes: u64,
    pub tombstones: u64,
    pub cgroups_known: u64,
    pub startup_walk_ms: u64,
    pub ebpf_load_ms: u64,
    /// "ok", "disabled" or "unavailable: <reason>".
    pub nvml: String,
    pub nvml_samples: u64,
    pub nvml_sample_cpu_ns: u64,
    pub join_cpu_ns: u64,
    pub gpu_processes: u64,
    /// GPU processes neither the cache nor /proc could place (charged to the host entry).
    pub gpu_processes_unresolved: u64,
    pub otlp: String,
    pub metadata: std::collections::BTreeMap<String, String>,
    pub export_sent: u64,
    pub export_failures: u64,
    pub export_dropped_batches: u64,
    pub export_queued_bytes: u64,
    pub programs: Vec<ProgramStats>,
}

impl Stats {
    pub fn set_mode(&self, mode: &'static str, reason: Option<String>) {
        *self.mode.write().unwrap() = Mode { mode, reason };
    }

    /// The self-metrics the sinks export.
    pub fn agent_stats(&self, started_ms: u64) -> gpu_model::AgentStats {
        let v = self.view();
        gpu_model::AgentStats {
            started_ms,
            mode: v.mode.to_string(),
            events_received: v.events_received,
            events_lost: v.events_lost,
            resyncs: v.resyncs,
            procfs_fallback_lookups: v.procfs_fallback_lookups,
            cached_processes: v.cached_processes,
            nvml: v.nvml,
            export_failures: self.export.failures.load(Relaxed),
            export_dropped_batches: self.export.dropped_batches.load(Relaxed),
        }
    }

    pub fn view(&self) -> StatsView {
        let mode = self.mode.read().unwrap().clone();
        StatsView {
            mode: if mode.mode.is_empty() {
                "starting"
            } else {
                mode.mode
            },
            degraded_reason: mode.reason,
            events_received: self.events_received.load(Relaxed),
            events_lost: self.events_lost.load(Relaxed),
            resyncs: self.resyncs.load(Relaxed),
            procfs_fallback_lookups: self.procfs_fallback_lookups.load(Relaxed),
            procfs_rescans: self.procfs_rescans.load(Relaxed),
            cgroup_walks: self.cgroup_walks.load(Relaxed),
            kernel_map_full: self.kernel_map_full.load(Relaxed),
            kernel_read_errors: self.kernel_read_errors.load(Relaxed),
            cached_processes: self.cached_processes.load(Relaxed),
            tombstones: self.tombstones.load(Relaxed),
            cgroups_known: self.cgroups_known.load(Relaxed),
            startup_walk_ms: self.startup_walk_ms.load(Relaxed),
            ebpf_load_ms: self.ebpf_load_ms.load(Relaxed),
            nvml: self.nvml.read().unwrap().clone(),
            nvml_samples: self.nvml_samples.load(Relaxed),
            nvml_sample_cpu_ns: self.nvml_sample_cpu_ns.load(Relaxed),
            join_cpu_ns: self.join_cpu_ns.load(Relaxed),
            gpu_processes: self.gpu_processes.load(Relaxed),
            gpu_processes_unresolved: self.gpu_processes_unresolved.load(Relaxed),
            otlp: self.otlp.read().unwrap().clone(),
            metadata: self.metadata.read().unwrap().clone(),
            export_sent: self.export.sent.load(Relaxed),
            export_failures: self.export.failures.load(Relaxed),
            export_dropped_batches: self.export.dropped_batches.load(Relaxed),
            export_queued_bytes: self.export.queued_bytes.load(Relaxed),
            programs: self.programs.read().unwrap().clone(),
        }
    }
}

/// CPU time of the calling thread, in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
