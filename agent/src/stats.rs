//! The agent's own counters. Each is written by the part of the agent that owns what it
//! counts; `report` reads them all into the one stats type (`gpu_model::AgentStats`) that
//! `/debug/stats` serves, `gpu-agent top` shows and the sinks export.
use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc, RwLock,
    },
};

use gpu_model::{AgentStats, ExportTarget, NvmlFeatures, ProgramStats, SourceStatus, TrackingMode};

#[derive(Debug, Default)]
pub struct Stats {
    pub events_received: AtomicU64,
    /// Notifications the kernel could not put in the ring buffer (its own count).
    pub events_lost: AtomicU64,
    pub resyncs: AtomicU64,
    pub procfs_fallback_lookups: AtomicU64,
    pub procfs_rescans: AtomicU64,
    pub cgroup_walks: AtomicU64,
    /// Cgroups nobody announced, looked up by id.
    pub cgroup_lookups: AtomicU64,
    pub kernel_map_full: AtomicU64,
    pub kernel_read_errors: AtomicU64,
    pub cached_processes: AtomicU64,
    pub tombstones: AtomicU64,
    pub tombstones_evicted: AtomicU64,
    pub cgroups_known: AtomicU64,
    pub startup_walk_ms: AtomicU64,
    pub startup_source: RwLock<&'static str>,
    pub process_programs: RwLock<&'static str>,
    pub ebpf_load_ms: AtomicU64,
    pub nvml_samples: AtomicU64,
    /// CPU time (thread clock) of the NVML thread and its GPU readers, NVML's calls included.
    pub nvml_sample_cpu_ns: AtomicU64,
    /// CPU time of joining samples, billing and publishing snapshots.
    pub join_cpu_ns: AtomicU64,
    /// CPU time of the pipeline task: the join, applying kernel notifications, gc.
    pub pipeline_cpu_ns: AtomicU64,
    /// CPU time of the OTLP export task: encoding and sending.
    pub export_cpu_ns: AtomicU64,
    pub gpu_processes: AtomicU64,
    pub gpu_processes_unresolved: AtomicU64,
    /// Written by the join: DRA devices that match no device now.
    pub dra_devices_unmatched: AtomicU64,
    pub export: Arc<otel::export::ExportCounters>,
    /// Usage records: written by the usage sink and its OTLP logs exporter.
    pub usage: Arc<otel::usage::UsageCounters>,
    pub otlp: RwLock<ExportTarget>,
    pub otlp_logs: RwLock<ExportTarget>,
    /// Written by the metadata source, the one owner of its sockets' health.
    pub metadata: Arc<RwLock<BTreeMap<String, SourceStatus>>>,
    /// Containers the metadata sources can name right now.
    pub metadata_names: AtomicU64,
    mode: RwLock<(TrackingMode, Option<String>)>,
    pub programs: RwLock<Vec<ProgramStats>>,
    /// Unix ms when the agent started.
    pub started_ms: AtomicU64,
    /// Written by the NVML sampler: profiling and XID events, and why not.
    pub nvml_features: RwLock<NvmlFeatures>,
    /// The length of each per-entity structure, set by its owner (`set_lengths`).
    lengths: RwLock<BTreeMap<&'static str, u64>>,
}

impl Stats {
    pub fn new(started_ms: u64) -> Stats {
        let s = Stats::default();
        s.started_ms.store(started_ms, Relaxed);
        s
    }

    /// The tracking mode, and why the agent is degraded (in /proc mode) if it is.
    pub fn set_mode(&self, mode: TrackingMode, reason: Option<String>) {
        *self.mode.write().unwrap() = (mode, reason);
    }

    /// Sets these structures' lengths (each owner sets its own, named after them).
    pub fn set_lengths(&self, lengths: &[(&'static str, usize)]) {
        let mut all = self.lengths.write().unwrap();
        for &(name, n) in lengths {
            all.insert(name, n as u64);
        }
    }

    /// Everything, with NVML's health as the latest snapshot carries it (its one owner).
    pub fn report(&self, nvml: &SourceStatus) -> AgentStats {
        let (mode, tracking) = self.mode.read().unwrap().clone();
        // A wedged driver degrades the agent as much as a tracking fallback does.
        let stalled = matches!(nvml, SourceStatus::Stalled(_)).then(|| nvml.to_string());
        let degraded_reason = match (tracking, stalled) {
            (Some(t), Some(s)) => Some(format!("{t}; {s}")),
            (t, s) => t.or(s),
        };
        let n = |c: &AtomicU64| c.load(Relaxed);
        AgentStats {
            started_ms: n(&self.started_ms),
            mode,
            degraded_reason,
            events_received: n(&self.events_received),
            events_lost: n(&self.events_lost),
            resyncs: n(&self.resyncs),
            procfs_fallback_lookups: n(&self.procfs_fallback_lookups),
            procfs_rescans: n(&self.procfs_rescans),
            cgroup_walks: n(&self.cgroup_walks),
            cgroup_lookups: n(&self.cgroup_lookups),
            kernel_map_full: n(&self.kernel_map_full),
            kernel_read_errors: n(&self.kernel_read_errors),
            cached_processes: n(&self.cached_processes),
            tombstones: n(&self.tombstones),
            tombstones_evicted: n(&self.tombstones_evicted),
            cgroups_known: n(&self.cgroups_known),
            startup_walk_ms: n(&self.startup_walk_ms),
            startup_source: self.startup_source.read().unwrap().to_string(),
            process_programs: self.process_programs.read().unwrap().to_string(),
            ebpf_load_ms: n(&self.ebpf_load_ms),
            nvml: nvml.clone(),
            nvml_samples: n(&self.nvml_samples),
            nvml_sample_cpu_ns: n(&self.nvml_sample_cpu_ns),
            join_cpu_ns: n(&self.join_cpu_ns),
            pipeline_cpu_ns: n(&self.pipeline_cpu_ns),
            export_cpu_ns: n(&self.export_cpu_ns),
            gpu_processes: n(&self.gpu_processes),
            gpu_processes_unresolved: n(&self.gpu_processes_unresolved),
            dra_devices_unmatched: n(&self.dra_devices_unmatched),
            otlp: self.otlp.read().unwrap().clone(),
            export_status: self.export.status.read().unwrap().clone(),
            otlp_logs: self.otlp_logs.read().unwrap().clone(),
            metadata: self.metadata.read().unwrap().clone(),
            metadata_names: n(&self.metadata_names),
            export_sent: n(&self.export.sent),
            export_failures: n(&self.export.failures),
            export_dropped_batches: n(&self.export.dropped_batches),
            export_queued_bytes: n(&self.export.queued_bytes),
            programs: self.programs.read().unwrap().clone(),
            nvml_features: self.nvml_features.read().unwrap().clone(),
            usage_records: n(&self.usage.emitted),
            usage_records_dropped: n(&self.usage.dropped),
            usage_records_queued: n(&self.usage.queued),
            usage_records_written: n(&self.usage.written),
            usage_file_queued: n(&self.usage.file_queued),
            usage_file: self.usage.file.read().unwrap().clone(),
            usage_logs: self.usage.logs.read().unwrap().clone(),
            state_lengths: (self.lengths.read().unwrap().iter())
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            // `/debug/stats` alone asks for it (`heap_bytes`).
            heap_bytes: 0,
        }
    }
}

/// A task's future whose polls' thread CPU time is added to one of the stats: the cost of
/// one task on a runtime that runs several.
pub struct CpuTimed<F> {
    inner: std::pin::Pin<Box<F>>,
    stats: Arc<Stats>,
    field: fn(&Stats) -> &AtomicU64,
}

impl<F: std::future::Future> CpuTimed<F> {
    pub fn new(inner: F, stats: Arc<Stats>, field: fn(&Stats) -> &AtomicU64) -> Self {
        CpuTimed {
            inner: Box::pin(inner),
            stats,
            field,
        }
    }
}

impl<F: std::future::Future> std::future::Future for CpuTimed<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let t0 = thread_cpu_ns();
        let r = self.inner.as_mut().poll(cx);
        let spent = thread_cpu_ns().saturating_sub(t0);
        (self.field)(&self.stats).fetch_add(spent, Relaxed);
        r
    }
}

/// Bytes glibc's allocator has handed out and not had back, in all its arenas and its own
/// mappings. It walks the free lists (a few microseconds to a millisecond): asked for by
/// `/debug/stats` only.
#[cfg(target_env = "gnu")]
pub fn heap_bytes() -> u64 {
    // SAFETY: no preconditions; it locks each arena while it reads it.
    let m = unsafe { libc::mallinfo2() };
    (m.uordblks + m.hblkhd) as u64
}

#[cfg(not(target_env = "gnu"))]
pub fn heap_bytes() -> u64 {
    0
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
