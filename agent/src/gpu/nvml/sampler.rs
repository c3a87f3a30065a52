//! The NVML thread: NVML calls block, so sampling runs on a thread of its own and sends one
//! message per cycle to the pipeline. The GPUs are read on a reader thread that a stuck
//! call retires (readers.rs); the calls this thread makes itself (init, the device count)
//! are watched by a second thread, which says so when one does not return (a wedged driver
//! at start).
use std::{
    sync::{atomic::Ordering::Relaxed, Arc, Mutex},
    time::{Duration, Instant},
};

use gpu_model::SourceStatus;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{
    cycle::NvmlSampler,
    reader::{track, Progress},
    GpuSample,
};
use crate::{
    config::{NvmlConfig, XidConfig},
    stats::{thread_cpu_ns, Stats},
};

/// One cycle: the sample (None while NVML is unavailable) and NVML's health.
pub type GpuMessage = (Option<GpuSample>, SourceStatus);

/// (device uuid, pid) of GPU processes the kernel reported exited: the join asks, the NVML
/// thread reads their accounting stats on its next cycle (NVML calls stay on that thread).
#[derive(Debug, Clone, Default)]
pub struct AccountingRequests(Arc<Mutex<Vec<(String, u32)>>>);

impl AccountingRequests {
    /// Bounded: beyond 4096 waiting requests the oldest go.
    pub fn push(&self, uuid: String, pid: u32) {
        let mut q = self.0.lock().unwrap();
        q.push((uuid, pid));
        if q.len() > 4096 {
            q.remove(0);
        }
    }

    pub fn take(&self) -> Vec<(String, u32)> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// Samples every `interval_ms` until `stop`, or until the receiver is gone. With
/// `accounting`, reads NVML's accounting stats of the processes the join asks about.
pub fn spawn(
    cfg: NvmlConfig,
    xid: XidConfig,
    tx: mpsc::Sender<GpuMessage>,
    stats: Arc<Stats>,
    stop: CancellationToken,
    accounting: Option<AccountingRequests>,
) -> std::io::Result<()> {
    let interval = Duration::from_millis(cfg.interval_ms);
    let stall_timeout = cfg.stall_timeout();
    let progress = Arc::new(Progress::default());
    watch(
        progress.clone(),
        interval,
        stall_timeout,
        tx.clone(),
        stop.clone(),
    )?;
    // The thread's own timer, to sleep until the next cycle or until the agent stops.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    std::thread::Builder::new()
        .name("nvml".into())
        .spawn(move || {
            track(progress);
            let mut sampler = NvmlSampler::new(cfg.lib_path)
                .with_deadlines(interval, stall_timeout)
                .with_kmsg(xid.kmsg_path())
                .with_slow_interval(
                    Duration::from_millis(cfg.slow_interval_ms),
                    Duration::from_millis(cfg.gpm_interval_ms),
                    Duration::from_millis(cfg.energy_interval_ms),
                )
                .with_crowded_list_interval(Duration::from_millis(cfg.crowded_list_interval_ms));
            sampler.enable_accounting(accounting.is_some());
            let mut next = Instant::now();
            while !stop.is_cancelled() {
                let cpu0 = thread_cpu_ns();
                if let Some(a) = &accounting {
                    sampler.request_accounting(a.take());
                }
                let sample = sampler.sample();
                let cpu = thread_cpu_ns() - cpu0 + sampler.take_reader_cpu_ns();
                stats.nvml_sample_cpu_ns.fetch_add(cpu, Relaxed);
                *stats.nvml_features.write().unwrap() = sampler.features();
                if tx
                    .blocking_send((sample, sampler.status().clone()))
                    .is_err()
                {
                    return; // the pipeline is gone
                }
                next += interval;
                let now = Instant::now();
                if next > now {
                    let wait = next - now;
                    // The timer is created inside the runtime, which drives it.
                    rt.block_on(async {
                        let _ = tokio::time::timeout(wait, stop.cancelled()).await;
                    });
                } else {
                    next = now; // fell behind (slow driver): do not burst
                }
            }
        })?;
    Ok(())
}

/// Watches the NVML thread's own calls: one that has not returned for `stall_timeout`
/// (NVML's init or the device count on a wedged driver) is said once, and every interval
/// the pipeline gets a message without a sample that says what is stalled, so that nothing
/// is served as current meanwhile.
fn watch(
    progress: Arc<Progress>,
    interval: Duration,
    stall_timeout: Duration,
    tx: mpsc::Sender<GpuMessage>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("nvml-watchdog".into())
        .spawn(move || {
            // The call seen in flight, its number, and since when it has been seen.
            let mut seen: Option<(&'static str, u64, Instant)> = None;
            // Since when the call said stalled had been in flight.
            let mut stalled: Option<Instant> = None;
            while !stop.is_cancelled() {
                std::thread::sleep(interval);
                seen = match (progress.now(), seen) {
                    ((Some(c), n), Some((_, m, t))) if n == m => Some((c, n, t)),
                    ((Some(c), n), _) => Some((c, n, Instant::now())),
                    ((None, _), _) => None,
                };
                match seen {
                    Some((call, _, t)) if t.elapsed() >= stall_timeout => {
                        let why = format!("{call} for {} s", t.elapsed().as_secs());
                        if stalled.is_none() {
                            tracing::warn!(
                                call,
                                "NVML not answering: {why}; no GPU data until it returns"
                            );
                            stalled = Some(t);
                        }
                        let status = SourceStatus::Stalled(why);
                        if tx.blocking_send((None, status)).is_err() {
                            return;
                        }
                    }
                    _ => {
                        if let Some(t) = stalled.take() {
                            tracing::warn!(
                                "NVML answers again, after {} s without an answer",
                                t.elapsed().as_secs()
                            );
                        }
                    }
                }
            }
        })?;
    Ok(())
}
