//! `gpu-agent run`: wires the sources, the state owner and the endpoints together.
use std::{
    os::fd::{AsFd, OwnedFd},
    sync::{atomic::AtomicBool, atomic::Ordering, Arc},
    time::Duration,
};

use anyhow::{Context, Result};
use tokio::{io::unix::AsyncFd, net::TcpListener, signal::unix::SignalKind};

use crate::{
    cgroup::Hierarchies,
    config::Config,
    ebpf::EbpfSource,
    http::{self, AppState},
    procfs::Procfs,
    stats::Stats,
    tracker::Tracker,
};

/// Runs until SIGTERM or SIGINT. `prep_error`: why tracefs could not be prepared, if so.
pub async fn run(config: Config, prep_error: Option<String>) -> Result<()> {
    let stats = Arc::new(Stats::default());
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
            stats.set_mode("ebpf", None);
            Some(s)
        }
        Err(reason) => {
            tracing::warn!(%reason, "eBPF unavailable: running in /proc mode (degraded: rescans /proc)");
            stats.set_mode("procfs", Some(reason));
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

    let listener = TcpListener::bind(config.http.addr)
        .await
        .with_context(|| format!("binding the HTTP endpoint {}", config.http.addr))?;
    tracing::info!(addr = %listener.local_addr()?, "http server listening");
    let app = http::router(AppState {
        state: tracker.state.clone(),
        stats: stats.clone(),
        ready: ready.clone(),
    });
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    tracker.startup();
    ready.store(true, Ordering::Release);
    let st = stats.view();
    tracing::info!(
        mode = st.mode,
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
        }
    }
    tracing::info!("shutting down");
    server.abort();
    drop(ring);
    Ok(())
}
