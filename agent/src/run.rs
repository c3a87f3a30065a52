//! `gpu-agent run`: wires the sources, the state owner and the endpoints together.
use std::{
    os::fd::{AsFd, OwnedFd},
    sync::{atomic::AtomicBool, atomic::Ordering, Arc, RwLock},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result};
use gpu_model::{ExportTarget, SourceStatus, TrackingMode};
use tokio::{io::unix::AsyncFd, net::TcpListener, signal::unix::SignalKind};

use crate::{
    cgroup::Hierarchies,
    config::{Config, NvmlConfig},
    ebpf::EbpfSource,
    gpu::{nvml::NvmlSampler, GpuSample},
    http::{self, AppState},
    join::Snapshot,
    procfs::Procfs,
    stats::{thread_cpu_ns, Stats},
    tracker::Tracker,
};

/// What an embedding caller (`gpu-agent top`) reads: the same state the daemon serves.
#[derive(Clone)]
pub struct Handles {
    pub snapshot: Arc<RwLock<Arc<Snapshot>>>,
    pub stats: Arc<Stats>,
    pub state: Arc<RwLock<crate::state::State>>,
}

/// Running the sources without the HTTP endpoint and the exporter.
pub struct Embedded {
    /// Receives the handles once the start-up walk is done.
    pub handles_tx: std::sync::mpsc::Sender<Handles>,
    /// Set to true to stop.
    pub stop: tokio::sync::watch::Receiver<bool>,
}

/// Starts the sources (eBPF cache, NVML, join) on a thread of their own, for a caller that
/// only reads. Returns once the start-up walk is done.
pub fn spawn_embedded(
    config: Config,
    prep_error: Option<String>,
) -> Result<(
    Handles,
    tokio::sync::watch::Sender<bool>,
    std::thread::JoinHandle<()>,
)> {
    let (handles_tx, handles_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let thread = std::thread::Builder::new()
        .name("sources".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            if let Err(e) = rt.block_on(run_with(
                config,
                prep_error,
                Some(Embedded { handles_tx, stop }),
            )) {
                tracing::error!("sources stopped: {e:#}");
            }
        })?;
    let handles = handles_rx
        .recv()
        .map_err(|_| anyhow::anyhow!("the sources failed to start (see the log)"))?;
    Ok((handles, stop_tx, thread))
}

/// Runs until SIGTERM or SIGINT. `prep_error`: why tracefs could not be prepared, if so.
pub async fn run(config: Config, prep_error: Option<String>) -> Result<()> {
    run_with(config, prep_error, None).await
}

async fn run_with(
    config: Config,
    prep_error: Option<String>,
    embedded: Option<Embedded>,
) -> Result<()> {
    let started_ms = now_ms();
    let stats = Arc::new(Stats::new(started_ms));
    let ready = Arc::new(AtomicBool::new(false));
    let procfs = Procfs::new(&config.cgroup.proc_root);
    let hierarchies = Hierarchies::detect(procfs.root(), &config.cgroup.v1_hierarchy);
    tracing::info!(
        cgroup2 = ?hierarchies.v2.as_ref().map(|h| &h.mount_point),
        v1 = ?hierarchies.v1.as_ref().map(|h| (&h.name, h.id, &h.mount_point)),
        "cgroup hierarchies"
    );

    // Attach first, walk second: nothing that happens during the walk is missed.
    let source = if !config.ebpf.enabled {
        Err("disabled by configuration (ebpf.enabled = false)".to_string())
    } else {
        let v1 = hierarchies.v1.as_ref().map(|h| h.id);
        EbpfSource::load(&config.ebpf, v1).map_err(|e| match &prep_error {
            Some(p) => format!("{e} ({p})"),
            None => e,
        })
    };
    let source = match source {
        Ok(s) => {
            tracing::info!(
                load_ms = s.load_time.as_millis() as u64,
                "eBPF programs attached"
            );
            stats
                .ebpf_load_ms
                .store(s.load_time.as_millis() as u64, Ordering::Relaxed);
            stats.set_mode(TrackingMode::Ebpf, None);
            Some(s)
        }
        Err(reason) => {
            tracing::warn!(%reason, "eBPF unavailable: running in /proc mode (degraded: rescans /proc)");
            stats.set_mode(TrackingMode::Procfs, Some(reason));
            None
        }
    };
    let mut tracker = Tracker::new(
        hierarchies,
        procfs,
        source,
        Duration::from_secs(config.cache.tombstone_secs),
        stats.clone(),
    );

    let snapshot = Arc::new(RwLock::new(Arc::new(Snapshot {
        nvml: if config.nvml.enabled {
            SourceStatus::default()
        } else {
            SourceStatus::Disabled
        },
        ..Default::default()
    })));
    let node = node_identity(&config);
    let prometheus = config.prometheus.enabled.then(|| {
        Arc::new(otel::prometheus::PromOptions {
            node: node.clone(),
            groups: config.metrics.clone(),
            dcgm_compat: config.prometheus.compat.as_deref() == Some("dcgm"),
        })
    });
    let app = http::router(AppState {
        state: tracker.state.clone(),
        stats: stats.clone(),
        ready: ready.clone(),
        snapshot: snapshot.clone(),
        prometheus,
    });
    let server = if embedded.is_none() {
        let listener = TcpListener::bind(config.http.addr)
            .await
            .with_context(|| format!("binding the HTTP endpoint {}", config.http.addr))?;
        tracing::info!(addr = %listener.local_addr()?, "http server listening");
        Some(tokio::spawn(
            async move { axum::serve(listener, app).await },
        ))
    } else {
        None
    };

    tracker.startup();
    ready.store(true, Ordering::Release);
    let mut stop = match embedded {
        Some(e) => {
            let _ = e.handles_tx.send(Handles {
                snapshot: snapshot.clone(),
                stats: stats.clone(),
                state: tracker.state.clone(),
            });
            Some(e.stop)
        }
        None => None,
    };
    let st = stats.report(&snapshot.read().unwrap().nvml);
    tracing::info!(
        mode = %st.mode,
        processes = st.cached_processes,
        cgroups = st.cgroups_known,
        walk_ms = st.startup_walk_ms,
        "ready"
    );

    let mut sigterm = tokio::signal::unix::signal(SignalKind::terminate())?;
    let mut sigint = tokio::signal::unix::signal(SignalKind::interrupt())?;
    let mut gc = tokio::time::interval(Duration::from_secs(1));
    let poll_every = if tracker.is_ebpf() {
        Duration::from_millis(config.ebpf.poll_interval_ms)
    } else {
        Duration::from_secs(config.cache.procfs_rescan_secs)
    };
    let mut poll = tokio::time::interval(poll_every);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // NVML calls block: they run on a thread of their own and send samples here.
    let (gpu_tx, mut gpu_rx) = tokio::sync::mpsc::channel(2);
    if config.nvml.enabled {
        spawn_nvml_thread(config.nvml.clone(), gpu_tx, stats.clone())?;
    } else {
        drop(gpu_tx);
    }
    let max_gap = Duration::from_millis(config.nvml.interval_ms * 3);
    // Names and allocations: their own task, asked when an unknown container id shows up.
    let (meta_tx, meta_rx) = tokio::sync::mpsc::channel::<Vec<String>>(4);
    let (meta_stop_tx, meta_stop_rx) = tokio::sync::watch::channel(false);
    let metadata_src = crate::metadata::MetadataSource::new(
        crate::metadata::MetadataConfig {
            cri_socket: config.metadata.cri_socket.clone(),
            pod_resources_socket: config.metadata.pod_resources_socket.clone(),
            docker_socket: config.metadata.docker_socket.clone(),
            allocation_interval: Duration::from_secs(config.metadata.allocation_interval_secs),
        },
        stats.metadata.clone(),
    );
    let metadata = metadata_src.published();
    let mut name_requests = config.metadata.enabled.then(|| {
        tokio::spawn(crate::metadata::run(metadata_src, meta_rx, meta_stop_rx));
        crate::metadata::NameRequests::new(meta_tx)
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Embedded (top) looks, it does not export.
    let exporter = if stop.is_some() {
        None
    } else {
        match config.otlp.resolve(|k| std::env::var(k).ok()) {
            Ok(Some(settings)) => {
                *stats.otlp.write().unwrap() = ExportTarget::Url(settings.url.clone());
                let ctx = otel::otlp::ExportContext {
                    node: node.clone(),
                    service_name: settings.service_name.clone(),
                    resource_attributes: settings.resource_attributes.clone(),
                    groups: config.metrics.clone(),
                };
                tracing::info!(url = %settings.url, protocol = ?settings.protocol,
                    interval = ?settings.interval, "pushing OTLP metrics");
                let ex = otel::export::OtlpExporter::new(settings, stats.export.clone())
                    .map_err(|e| anyhow::anyhow!("OTLP exporter: {e}"))?;
                Some(tokio::spawn(run_exporter(
                    ex,
                    ctx,
                    snapshot.clone(),
                    stats.clone(),
                    stop_rx,
                )))
            }
            Ok(None) => {
                *stats.otlp.write().unwrap() = ExportTarget::Disabled;
                tracing::info!("no OTLP endpoint configured (OTEL_EXPORTER_OTLP_ENDPOINT or [otlp] endpoint): not pushing");
                None
            }
            Err(e) => anyhow::bail!("invalid OTLP configuration: {e}"),
        }
    };
    let ring = match tracker.source() {
        Some(s) => {
            let fd: OwnedFd = s.ring.as_fd().try_clone_to_owned()?;
            // SAFETY: `fd` is our own duplicate, open until the AsyncFd drops it.
            let afd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) };
            Some(afd.map_err(|e| e.into_parts().1)?)
        }
        None => None,
    };
    loop {
        tokio::select! {
            _ = sigterm.recv() => break,
            _ = async { stop.as_mut().unwrap().changed().await }, if stop.is_some() => break,
            _ = sigint.recv() => break,
            r = async { ring.as_ref().unwrap().readable().await }, if ring.is_some() => {
                let mut guard = r?;
                tracker.drain();
                guard.clear_ready();
            }
            _ = poll.tick() => {
                if tracker.is_ebpf() { tracker.drain(); } else { tracker.rescan_procfs(); }
            }
            _ = gc.tick() => tracker.gc(),
            Some((sample, status)) = gpu_rx.recv() => {
                let sample: Option<GpuSample> = sample;
                let cpu0 = thread_cpu_ns();
                let snap = match sample {
                    Some(s) => {
                        stats.nvml_samples.fetch_add(1, Ordering::Relaxed);
                        // Apply what the kernel queued before the sample, so new GPU
                        // processes are already in the cache.
                        tracker.drain();
                        let md = metadata.read().unwrap().clone();
                        let snap = tracker.join_gpu(&md, &s, &status, max_gap, config.nvml.process_detail);
                        if let Some(r) = name_requests.as_mut() {
                            r.ask(&snap);
                        }
                        snap
                    }
                    None => Snapshot { taken_at_ms: now_ms(), nvml: status, ..Default::default() },
                };
                *snapshot.write().unwrap() = Arc::new(snap);
                stats.join_cpu_ns.fetch_add(thread_cpu_ns() - cpu0, Ordering::Relaxed);
            }
        }
    }
    tracing::info!("shutting down");
    let _ = meta_stop_tx.send(true);
    if let Some(handle) = exporter {
        // One last export of the latest snapshot, bounded by the export timeout.
        let _ = stop_tx.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(30), handle).await;
    }
    if let Some(server) = server {
        server.abort();
    }
    drop(ring);
    Ok(())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

type GpuMessage = (Option<GpuSample>, SourceStatus);

fn spawn_nvml_thread(
    cfg: NvmlConfig,
    tx: tokio::sync::mpsc::Sender<GpuMessage>,
    stats: Arc<Stats>,
) -> std::io::Result<()> {
    let interval = Duration::from_millis(cfg.interval_ms);
    std::thread::Builder::new()
        .name("nvml".into())
        .spawn(move || {
            let mut sampler = NvmlSampler::new(cfg.lib_path);
            let mut next = Instant::now();
            loop {
                let cpu0 = thread_cpu_ns();
                let sample = sampler.sample();
                stats
                    .nvml_sample_cpu_ns
                    .fetch_add(thread_cpu_ns() - cpu0, Ordering::Relaxed);
                if tx
                    .blocking_send((sample, sampler.status().clone()))
                    .is_err()
                {
                    return; // the agent is shutting down
                }
                next += interval;
                let now = Instant::now();
                if next > now {
                    std::thread::sleep(next - now);
                } else {
                    next = now; // fell behind (slow driver): do not burst
                }
            }
        })?;
    Ok(())
}

/// host.name from the kernel; k8s.node.name from the config or the NODE_NAME variable.
pub fn node_identity(config: &Config) -> otel::NodeIdentity {
    let host_name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let node_name = config
        .node_name
        .clone()
        .or_else(|| std::env::var("NODE_NAME").ok())
        .filter(|n| !n.is_empty());
    otel::NodeIdentity {
        host_name,
        node_name,
    }
}

/// Pushes the latest snapshot every interval; on stop, one final flush.
async fn run_exporter(
    mut ex: otel::export::OtlpExporter,
    ctx: otel::otlp::ExportContext,
    snapshot: Arc<RwLock<Arc<Snapshot>>>,
    stats: Arc<Stats>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let interval = ex.settings().interval;
    let timeout = ex.settings().timeout;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let snap = snapshot.read().unwrap().clone();
                let st = stats.report(&snap.nvml);
                let now = now_ms();
                ex.export(|| otel::otlp::build_request(&snap, &st, &ctx, now)).await;
            }
            _ = stop.changed() => {
                let snap = snapshot.read().unwrap().clone();
                let st = stats.report(&snap.nvml);
                ex.enqueue(otel::otlp::build_request(&snap, &st, &ctx, now_ms()));
                match tokio::time::timeout(timeout, ex.flush(true)).await {
                    Ok(true) => tracing::info!("final OTLP export sent"),
                    _ => tracing::warn!(queued = ex.queued(), "final OTLP export failed; exiting anyway"),
                }
                return;
            }
        }
    }
}
