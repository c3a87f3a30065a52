//! Wiring: builds the sources, the pipeline and the sinks, and stops them all with one
//! cancellation token and one deadline. `gpu-agent run` serves and exports; `gpu-agent top`
//! runs the same sources in-process and only reads.
use std::{
    sync::{atomic::AtomicBool, atomic::Ordering, Arc, RwLock},
    time::Duration,
};

use anyhow::{Context, Result};
use gpu_model::{ExportTarget, Snapshot, SourceStatus, TrackingMode};
use tokio::{signal::unix::SignalKind, sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::{
    billing::{Billing, Deliver},
    config::{Config, Loaded},
    ebpf::EbpfSource,
    gpu::nvml::sampler,
    metadata::{MetadataSource, NameRequests},
    pipeline::{now_ms, Pipeline, Published},
    process::{cgroup::Hierarchies, procfs::Procfs, State, Tracker},
    sinks::{export, http},
    stats::{CpuTimed, Stats},
};

/// How long the tasks get to finish once stopped: the final OTLP flush is the longest.
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(30);

/// What the sinks read: the published snapshots, the stats, the process state.
#[derive(Clone)]
pub struct Handles {
    pub snapshot: Published,
    pub stats: Arc<Stats>,
    pub state: Arc<RwLock<State>>,
}

/// The sources before they run: the tracker (eBPF attached, or /proc mode chosen) and the
/// channel its snapshots will be published on.
struct Sources {
    tracker: Tracker,
    publish: watch::Sender<Arc<Snapshot>>,
    handles: Handles,
}

impl Sources {
    /// Attaches the programs first (nothing that happens during the walk is missed), or
    /// says why not and chooses /proc mode.
    fn load(config: &Config, prep_error: Option<String>) -> Sources {
        let stats = Arc::new(Stats::new(now_ms()));
        let procfs = Procfs::new(&config.cgroup.proc_root);
        let hierarchies = Hierarchies::detect(procfs.root(), &config.cgroup.v1_hierarchy);
        tracing::info!(
            cgroup2 = ?hierarchies.v2.as_ref().map(|h| &h.mount_point),
            v1 = ?hierarchies.v1.as_ref().map(|h| (&h.name, h.id, &h.mount_point)),
            "cgroup hierarchies"
        );
        let source = load_ebpf(config, &hierarchies, prep_error, &stats);
        let tracker = Tracker::new(hierarchies, procfs, source, &config.cache, stats.clone());
        let first = Snapshot {
            nvml: if config.nvml.enabled {
                SourceStatus::Starting
            } else {
                SourceStatus::Disabled
            },
            ..Default::default()
        };
        let (publish, snapshot) = watch::channel(Arc::new(first));
        let handles = Handles {
            snapshot,
            stats,
            state: tracker.shared_state(),
        };
        Sources {
            tracker,
            publish,
            handles,
        }
    }

    /// The one start-up walk of /proc and the cgroup filesystem.
    fn walk(&mut self) {
        self.tracker.startup();
        let nvml = self.handles.snapshot.borrow().nvml.clone();
        let st = self.handles.stats.report(&nvml);
        tracing::info!(
            mode = %st.mode,
            processes = st.cached_processes,
            cgroups = st.cgroups_known,
            walk_ms = st.startup_walk_ms,
            "ready"
        );
    }

    /// Starts NVML sampling, the metadata source and the pipeline; all stop with `stop`.
    /// `records`: where the join sends usage records (the usage sink), if anywhere.
    fn spawn(
        self,
        config: &Config,
        records: Option<tokio::sync::mpsc::Sender<gpu_model::UsageRecord>>,
        stop: &CancellationToken,
    ) -> Result<Vec<JoinHandle<()>>> {
        let stats = self.handles.stats.clone();
        // Billing's usage records go to the usage sink, counted; a full or closed channel
        // loses them, counted too.
        let counters = stats.usage.clone();
        let deliver = records.map(|tx| -> Deliver {
            Box::new(move |r| {
                counters.emitted.fetch_add(1, Ordering::Relaxed);
                if tx.try_send(r).is_err() {
                    counters.dropped.fetch_add(1, Ordering::Relaxed);
                }
            })
        });
        // Exits billing notices go to the NVML thread, for their accounting stats.
        let (billing, accounting) = Billing::new(&config.usage, &config.cgroup.proc_root, deliver);
        let mut pipeline = Pipeline::new(self.tracker, billing, self.publish, config);
        // NVML calls block: they run on a thread of their own and send samples here.
        let (gpu_tx, gpu_rx) = tokio::sync::mpsc::channel(2);
        if config.nvml.enabled {
            let (nvml, xid, stop) = (config.nvml.clone(), config.xid.clone(), stop.clone());
            sampler::spawn(nvml, xid, gpu_tx, stats.clone(), stop, accounting)?;
        }
        let mut tasks = vec![];
        // Names and allocations: their own task, asked when an unknown container id shows up.
        if config.metadata.enabled {
            let src = MetadataSource::new(config.metadata.clone(), stats.clone());
            pipeline.metadata = src.published();
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            pipeline.names = Some(NameRequests::new(tx));
            let stop = stop.clone();
            tasks.push(tokio::spawn(crate::metadata::run(src, rx, stop)));
        }
        let pipeline_stop = stop.clone();
        let on_error = stop.clone();
        let task = async move {
            if let Err(e) = pipeline.run(gpu_rx, pipeline_stop).await {
                tracing::error!("the pipeline stopped: {e:#}");
                on_error.cancel();
            }
        };
        let timed = CpuTimed::new(task, stats.clone(), |s| &s.pipeline_cpu_ns);
        tasks.push(tokio::spawn(timed));
        Ok(tasks)
    }
}

fn load_ebpf(
    config: &Config,
    hierarchies: &Hierarchies,
    prep_error: Option<String>,
    stats: &Stats,
) -> Option<EbpfSource> {
    let source = if !config.ebpf.enabled {
        Err("disabled by configuration (ebpf.enabled = false)".to_string())
    } else {
        let v1 = hierarchies.v1.as_ref().map(|h| (h.id, h.name.as_str()));
        EbpfSource::load(&config.ebpf, v1).map_err(|e| match &prep_error {
            Some(p) => format!("{e} ({p})"),
            None => e,
        })
    };
    match source {
        Ok(s) => {
            let load_ms = s.load_time.as_millis() as u64;
            let programs = s.process_programs.as_str();
            tracing::info!(
                load_ms,
                process_programs = programs,
                "eBPF programs attached"
            );
            *stats.process_programs.write().unwrap() = programs;
            stats.ebpf_load_ms.store(load_ms, Ordering::Relaxed);
            stats.set_mode(TrackingMode::Ebpf, None);
            Some(s)
        }
        Err(reason) => {
            tracing::warn!(%reason, "eBPF unavailable: running in /proc mode (degraded: rescans /proc)");
            stats.set_mode(TrackingMode::Procfs, Some(reason));
            None
        }
    }
}

/// Loads the configuration again (the file, the flags, the environment), for SIGHUP.
pub type Reload = Box<dyn Fn() -> Result<Loaded, crate::config::ConfigError>>;

/// `gpu-agent run`: until SIGTERM or SIGINT. `prep_error`: why tracefs could not be
/// prepared, if so.
pub async fn run(loaded: Loaded, prep_error: Option<String>, reload: Reload) -> Result<()> {
    // First: a signal during the start-up walk must not kill the agent by default action.
    let mut sigterm = tokio::signal::unix::signal(SignalKind::terminate())?;
    let mut sigint = tokio::signal::unix::signal(SignalKind::interrupt())?;
    let mut sighup = tokio::signal::unix::signal(SignalKind::hangup())?;
    let config = &loaded.config;
    let stop = CancellationToken::new();
    let mut sources = Sources::load(config, prep_error);
    let handles = sources.handles.clone();
    let ready = Arc::new(AtomicBool::new(false));
    // Serving before the walk: /healthz answers and /readyz says "starting" meanwhile.
    let mut tasks = vec![serve_http(config, &handles, ready.clone(), &stop).await?];
    sources.walk();
    ready.store(true, Ordering::Release);
    // The sinks cannot fail from here on: one that does not work says so and retries.
    tasks.extend(start_exporter(&loaded, &handles, &stop));
    let records = start_usage_sink(&loaded, &handles, &stop).map(|(tx, task)| {
        tasks.push(task);
        tx
    });
    tasks.extend(sources.spawn(config, records, &stop)?);
    loop {
        tokio::select! {
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
            _ = stop.cancelled() => break,
            _ = sighup.recv() => on_hangup(&loaded, &reload),
        }
    }
    tracing::info!("shutting down");
    stop.cancel();
    shut_down(tasks).await;
    Ok(())
}

/// SIGHUP: the configuration is loaded and checked again. Nothing is swapped in a running
/// agent (every section shapes a source or a sink at start), so a change is reported as
/// needing a restart; a configuration that no longer loads is reported too. Never fatal.
fn on_hangup(running: &Loaded, reload: &Reload) {
    match reload() {
        Err(e) => tracing::error!(
            "SIGHUP: the configuration does not load ({e}); running on with the one loaded at start"
        ),
        Ok(newer) => match running.changed_sections(&newer).as_slice() {
            [] => tracing::info!("SIGHUP: the configuration is unchanged"),
            changed => tracing::warn!(
                sections = %changed.join(", "),
                "SIGHUP: the configuration changed; restart the agent to apply it (nothing is reloaded live)"
            ),
        },
    }
}

/// Waits for the stopped tasks, all within one deadline.
async fn shut_down(tasks: Vec<JoinHandle<()>>) {
    let all = join_all(tasks);
    if tokio::time::timeout(SHUTDOWN_DEADLINE, all).await.is_err() {
        tracing::warn!("tasks still running after {SHUTDOWN_DEADLINE:?}; exiting anyway");
    }
}

async fn join_all(tasks: Vec<JoinHandle<()>>) {
    for t in tasks {
        let _ = t.await;
    }
}

/// Binds `http.addr` (every endpoint) and `http.metrics_addr` (/metrics, /healthz,
/// /readyz) and serves them on a thread of their own; the returned task keeps the heartbeat
/// that /healthz checks, and ends once that thread has stopped.
async fn serve_http(
    config: &Config,
    handles: &Handles,
    ready: Arc<AtomicBool>,
    stop: &CancellationToken,
) -> Result<JoinHandle<()>> {
    let node = node_identity(config);
    let dcgm = config.dcgm_compat()?;
    let prometheus = config.prometheus.enabled.then(|| {
        Arc::new(otel::prometheus::PromOptions {
            node,
            groups: config.metrics.clone(),
            dcgm,
        })
    });
    let heartbeat = Arc::new(http::Heartbeat::default());
    heartbeat.beat();
    let app = http::AppState {
        state: handles.state.clone(),
        stats: handles.stats.clone(),
        ready,
        snapshot: handles.snapshot.clone(),
        prometheus,
        heartbeat: heartbeat.clone(),
    };
    let listeners = http_listeners(&config.http, app)?;
    let thread = http::spawn(listeners, stop.clone())?;
    let stop = stop.clone();
    Ok(tokio::spawn(async move {
        // Beats on this runtime, the agent's main loop: /healthz fails when it stalls (30
        // s). Every 5 s: an idle agent's wake-ups are its cost.
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tick.tick() => heartbeat.beat(),
            }
        }
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }))
}

/// The bound addresses with their routers, limits and (for the metrics address) TLS and
/// credentials. Binding here, on the caller's thread, makes a taken port an error of `run`.
fn http_listeners(
    cfg: &crate::config::HttpConfig,
    app: http::AppState,
) -> Result<Vec<http::Listener>> {
    let count = 1 + usize::from(cfg.metrics_addr.is_some());
    let (max_connections, nofile) = http::connection_budget(cfg.max_connections, count);
    if max_connections < cfg.max_connections as usize {
        tracing::warn!(
            max_connections,
            nofile,
            "http.max_connections lowered to fit the descriptor limit (RLIMIT_NOFILE)"
        );
    }
    let limits = http::Limits {
        max_connections,
        header_read_timeout: cfg.header_read_timeout(),
        max_header_bytes: cfg.max_request_header_bytes as usize,
    };
    let gate = || http::Gate::new(cfg.max_concurrent_requests as usize, cfg.request_timeout());
    let socket = bind(cfg.addr, "http.addr")?;
    // The tests read the address from this line: keep `addr` its last field.
    tracing::info!(addr = %socket.local_addr()?, "http server listening");
    let mut listeners = vec![http::Listener {
        socket,
        exposure: http::Exposure::All,
        router: http::full_router(app.clone(), gate()),
        tls: None,
        limits: limits.clone(),
    }];
    if let Some(addr) = cfg.metrics_addr {
        let tls = cfg.tls.as_ref().map(|t| t.server_config()).transpose();
        let tls = tls.map_err(|(field, e)| anyhow::anyhow!("{field}: {e}"))?;
        let auth = http::Auth::new(&cfg.auth)
            .map_err(|e| anyhow::anyhow!("http.auth.bearer_token_file: {e}"))?;
        let socket = bind(addr, "http.metrics_addr")?;
        tracing::info!(tls = tls.is_some(), auth = auth.is_some(),
            addr = %socket.local_addr()?, "metrics server listening");
        listeners.push(http::Listener {
            socket,
            exposure: http::Exposure::Metrics,
            router: http::metrics_router(app, gate(), auth),
            tls,
            limits,
        });
    }
    Ok(listeners)
}

/// A listening socket with a deep accept queue: under a connection flood, the kubelet's
/// probe waits in it for a moment instead of having its SYN dropped (a 1 s retransmit).
fn bind(addr: std::net::SocketAddr, field: &str) -> Result<std::net::TcpListener> {
    let socket = match addr {
        std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }?;
    socket.set_reuseaddr(true)?;
    let listener = socket
        .bind(addr)
        .and_then(|()| socket.listen(1024))
        .with_context(|| format!("binding {field} {addr}"))?;
    Ok(listener.into_std()?)
}

/// File capabilities granted without the effective bit (`setcap ...+p`, as the image
/// does, so that a container without them still starts) are permitted but not in effect:
/// puts every permitted capability in effect. Returns the ones it raised (none as root).
pub fn raise_permitted_capabilities() -> Result<Vec<String>, String> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    let word =
        |d: &[Data; 2], f: fn(&Data) -> u32| (u64::from(f(&d[1])) << 32) | u64::from(f(&d[0]));
    // SAFETY: capget/capset with a v3 header and two data structs, as the ABI wants.
    if unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } != 0 {
        return Err(format!("capget: {}", std::io::Error::last_os_error()));
    }
    let before = word(&data, |d| d.effective);
    for d in &mut data {
        d.effective = d.permitted;
    }
    let after = word(&data, |d| d.effective);
    if after == before {
        return Ok(vec![]);
    }
    // SAFETY: as above.
    if unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) } != 0 {
        return Err(format!("capset: {}", std::io::Error::last_os_error()));
    }
    const NAMES: [(u32, &str); 6] = [
        (1, "DAC_OVERRIDE"),
        (2, "DAC_READ_SEARCH"),
        (21, "SYS_ADMIN"),
        (24, "SYS_RESOURCE"),
        (38, "PERFMON"),
        (39, "BPF"),
    ];
    let raised = after & !before;
    let mut names: Vec<String> = (0..64)
        .filter(|bit| raised & (1u64 << bit) != 0)
        .map(|bit| match NAMES.iter().find(|(b, _)| *b == bit) {
            Some((_, n)) => n.to_string(),
            None => format!("capability {bit}"),
        })
        .collect();
    names.sort();
    Ok(names)
}

/// The OTLP metrics push, if an endpoint is configured.
fn start_exporter(
    loaded: &Loaded,
    handles: &Handles,
    stop: &CancellationToken,
) -> Option<JoinHandle<()>> {
    let Some(settings) = loaded.otlp.clone() else {
        *handles.stats.otlp.write().unwrap() = ExportTarget::Disabled;
        *handles.stats.export.status.write().unwrap() = SourceStatus::Disabled;
        tracing::info!("no OTLP metrics endpoint configured (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_METRICS_ENDPOINT or [otlp] endpoint): not pushing");
        return None;
    };
    let config = &loaded.config;
    *handles.stats.otlp.write().unwrap() = ExportTarget::Url(settings.redacted_url());
    let ctx = export_context(config, &settings);
    tracing::info!(url = %settings.redacted_url(), protocol = ?settings.protocol,
        interval = ?settings.interval, "pushing OTLP metrics");
    let ex = otel::export::OtlpExporter::new(settings, handles.stats.export.clone());
    let task = export::run(
        ex,
        ctx,
        Duration::from_millis(config.nvml.interval_ms),
        handles.snapshot.clone(),
        handles.stats.clone(),
        stop.clone(),
    );
    let timed = CpuTimed::new(task, handles.stats.clone(), |s| &s.export_cpu_ns);
    Some(tokio::spawn(timed))
}

/// The resource every OTLP request of the agent starts from.
fn export_context(
    config: &Config,
    settings: &otel::export::OtlpSettings,
) -> otel::otlp::ExportContext {
    otel::otlp::ExportContext {
        node: node_identity(config),
        service_name: settings.service_name.clone(),
        resource_attributes: settings.resource_attributes.clone(),
        groups: config.metrics.clone(),
    }
}

/// The usage-record sink (`[usage]`): the local file and OTLP logs.
fn start_usage_sink(
    loaded: &Loaded,
    handles: &Handles,
    stop: &CancellationToken,
) -> Option<(
    tokio::sync::mpsc::Sender<gpu_model::UsageRecord>,
    JoinHandle<()>,
)> {
    let config = &loaded.config;
    let node = node_identity(config);
    let ctx = match &loaded.otlp_logs {
        Some(settings) => export_context(config, settings),
        None => otel::otlp::ExportContext {
            node: node.clone(),
            groups: config.metrics.clone(),
            ..Default::default()
        },
    };
    crate::sinks::usage::start(loaded, &node, ctx, &handles.stats, stop)
}

/// Runs the sources (eBPF cache, NVML, metadata, the pipeline) on a thread of their own,
/// without endpoints or export, for a caller that only reads (`gpu-agent top`). Returns
/// once the start-up walk is done; cancel the token to stop them.
pub fn spawn_embedded(
    config: Config,
    prep_error: Option<String>,
) -> Result<(Handles, CancellationToken, std::thread::JoinHandle<()>)> {
    let (handles_tx, handles_rx) = std::sync::mpsc::channel();
    let stop = CancellationToken::new();
    let token = stop.clone();
    let thread = std::thread::Builder::new()
        .name("sources".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            let run = async {
                let mut sources = Sources::load(&config, prep_error);
                sources.walk();
                let _ = handles_tx.send(sources.handles.clone());
                let tasks = sources.spawn(&config, None, &stop)?;
                stop.cancelled().await;
                shut_down(tasks).await;
                anyhow::Ok(())
            };
            if let Err(e) = rt.block_on(run) {
                tracing::error!("sources stopped: {e:#}");
            }
        })?;
    let handles = handles_rx
        .recv()
        .map_err(|_| anyhow::anyhow!("the sources failed to start (see the log)"))?;
    Ok((handles, token, thread))
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
