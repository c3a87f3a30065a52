//! The pipeline: the one task that owns the process state, the join and billing. It
//! applies the kernel's notifications as they come, joins each GPU sample with the
//! processes and the metadata, bills the snapshot, and publishes every snapshot on one
//! watch channel that all sinks read.
use std::{
    sync::{atomic::Ordering::Relaxed, Arc, RwLock},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::Result;
use gpu_model::Snapshot;
use tokio::{
    sync::{mpsc, watch},
    time::MissedTickBehavior,
};
use tokio_util::sync::CancellationToken;

use crate::{
    billing::Billing,
    config::Config,
    gpu::{join::Joiner, nvml::sampler::GpuMessage},
    metadata::{Metadata, NameRequests},
    process::Tracker,
    stats::{thread_cpu_ns, Stats},
};

/// How often expired tombstones and cgroups are forgotten and the kernel's counters read.
const GC_EVERY: Duration = Duration::from_secs(1);
/// A timer tick a little early still counts as due.
const TICK_SLACK: Duration = Duration::from_millis(20);

/// Where the snapshots are published; every sink holds a receiver.
pub type Published = watch::Receiver<Arc<Snapshot>>;

pub struct Pipeline {
    pub tracker: Tracker,
    pub joiner: Joiner,
    pub billing: Billing,
    /// The metadata source's latest names and allocations.
    pub metadata: Arc<RwLock<Arc<Metadata>>>,
    /// Asks the metadata source about containers it could not name (None: no metadata).
    pub names: Option<NameRequests>,
    pub publish: watch::Sender<Arc<Snapshot>>,
    pub stats: Arc<Stats>,
    /// Caps the time credited to the counters when samples were missed.
    pub max_gap: Duration,
    pub process_detail: bool,
    /// How often the ring buffer is drained when the kernel did not wake us (eBPF mode), or
    /// /proc is rescanned (/proc mode).
    pub poll_every: Duration,
}

impl Pipeline {
    pub fn new(
        tracker: Tracker,
        billing: Billing,
        publish: watch::Sender<Arc<Snapshot>>,
        config: &Config,
    ) -> Self {
        let poll_every = if tracker.is_ebpf() {
            Duration::from_millis(config.ebpf.poll_interval_ms)
        } else {
            Duration::from_secs(config.cache.procfs_rescan_secs)
        };
        Pipeline {
            stats: tracker.stats(),
            tracker,
            joiner: Joiner::default(),
            billing,
            metadata: Default::default(),
            names: None,
            publish,
            max_gap: Duration::from_millis(config.nvml.interval_ms * 3),
            process_detail: config.nvml.process_detail,
            poll_every,
        }
    }

    /// Runs until `stop`. `gpu` closes when NVML sampling is off. The stretches still open
    /// then are billed, however it stops.
    pub async fn run(
        mut self,
        gpu: mpsc::Receiver<GpuMessage>,
        stop: CancellationToken,
    ) -> Result<()> {
        let r = self.cycles(gpu, stop).await;
        self.billing.finish();
        r
    }

    async fn cycles(
        &mut self,
        mut gpu: mpsc::Receiver<GpuMessage>,
        stop: CancellationToken,
    ) -> Result<()> {
        let ring = match self.tracker.source() {
            Some(s) => Some(s.readiness()?),
            None => None,
        };
        // One timer for the drain and the gc: each wake-up of an idle agent costs tens of
        // microseconds on a VM, so they are few.
        let mut tick = tokio::time::interval(self.poll_every.min(GC_EVERY));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let (mut polled, mut collected) = (Instant::now(), Instant::now());
        loop {
            tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                r = async { ring.as_ref().unwrap().wait().await }, if ring.is_some() => {
                    r?;
                    self.tracker.drain();
                }
                _ = tick.tick() => {
                    let now = Instant::now();
                    if now + TICK_SLACK >= polled + self.poll_every {
                        polled = now;
                        if self.tracker.is_ebpf() {
                            self.tracker.drain();
                        } else {
                            self.tracker.rescan_procfs();
                        }
                    }
                    if now + TICK_SLACK >= collected + GC_EVERY {
                        collected = now;
                        self.gc();
                    }
                }
                Some(msg) = gpu.recv() => self.on_gpu(msg),
            }
        }
    }

    fn gc(&mut self) {
        let gone = self.tracker.gc();
        if !gone.is_empty() {
            self.joiner.gone(&gone, now_ms());
            self.billing.gone(&gone);
            if let Some(names) = self.names.as_mut() {
                names.gone(gone);
            }
        }
        let asked = self.names.as_ref().map_or(0, NameRequests::kept);
        self.stats.set_lengths(&[("names_asked", asked)]);
        self.stats.set_lengths(&self.joiner.lengths());
        self.stats.set_lengths(&self.billing.lengths());
    }

    /// One GPU message: a new snapshot, published.
    fn on_gpu(&mut self, (sample, nvml): GpuMessage) {
        let cpu0 = thread_cpu_ns();
        let snap = match sample {
            Some(s) => {
                self.stats.nvml_samples.fetch_add(1, Relaxed);
                // Apply what the kernel queued before the sample, so new GPU processes are
                // already in the cache.
                self.tracker.drain();
                let cov = self.joiner.look_up_missing(&s, &mut self.tracker);
                self.stats.gpu_processes.store(cov.gpu_processes, Relaxed);
                let unresolved = &self.stats.gpu_processes_unresolved;
                unresolved.store(cov.unresolved, Relaxed);
                let md = self.metadata.read().unwrap().clone();
                let state = self.tracker.state();
                let j = &mut self.joiner;
                let mut snap = j.join(&*state, &md, &s, &nvml, self.max_gap, self.process_detail);
                let unmatched = j.dra_devices_unmatched() as u64;
                self.stats.dra_devices_unmatched.store(unmatched, Relaxed);
                (self.billing).bill(&mut snap, &s, j.joined(), &*state, &md);
                drop(state);
                if let Some(r) = self.names.as_mut() {
                    r.ask(&snap);
                }
                snap
            }
            None => Snapshot {
                taken_at_ms: now_ms(),
                nvml,
                ..Default::default()
            },
        };
        // The one before, where nobody holds it any more: its lists go to the next join.
        if let Ok(old) = Arc::try_unwrap(self.publish.send_replace(Arc::new(snap))) {
            self.joiner.recycle(old);
        }
        let cpu = thread_cpu_ns() - cpu0;
        self.stats.join_cpu_ns.fetch_add(cpu, Relaxed);
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
