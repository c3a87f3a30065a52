//! Usage records out: each record the join closes goes to the local JSON-lines file (when
//! configured) and to the collector as an OTLP log record (when an endpoint is
//! configured), whose queue keeps records through a collector outage. `report` reads the
//! file back for `gpu-agent report`.
pub mod file;
pub mod report;

use std::{
    sync::{atomic::Ordering::Relaxed, Arc},
    time::Duration,
};

use gpu_model::UsageRecord;
use otel::usage::{LogsExporter, UsageCounters};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{config::Loaded, pipeline::now_ms};

/// How often queued records are retried while the collector is down.
const RETRY_EVERY: Duration = Duration::from_secs(5);
/// At shutdown: how long the join's last records (`agent_stopped`) are waited for.
const DRAIN_FOR: Duration = Duration::from_secs(3);

pub struct UsageSink {
    pub file: Option<file::RecordFile>,
    pub logs: Option<LogsExporter>,
    /// Stamped on every record: k8s.node.name, else the host name.
    pub node: Option<String>,
    pub counters: Arc<UsageCounters>,
    /// Warned about once until it works again.
    file_failing: bool,
}

impl UsageSink {
    pub fn new(
        file: Option<file::RecordFile>,
        logs: Option<LogsExporter>,
        node: Option<String>,
        counters: Arc<UsageCounters>,
    ) -> UsageSink {
        UsageSink {
            file,
            logs,
            node,
            counters,
            file_failing: false,
        }
    }

    /// Somewhere to put records: without, the join need not close any.
    pub fn has_destination(&self) -> bool {
        self.file.is_some() || self.logs.is_some()
    }

    fn take(&mut self, mut r: UsageRecord) {
        r.node = r.node.or_else(|| self.node.clone());
        if let Some(f) = &mut self.file {
            match f.append(&r) {
                Ok(()) => {
                    if std::mem::take(&mut self.file_failing) {
                        tracing::info!(file = %f.path().display(), "usage records: writing again");
                    }
                }
                Err(e) => {
                    self.counters.dropped.fetch_add(1, Relaxed);
                    if !std::mem::replace(&mut self.file_failing, true) {
                        tracing::warn!(file = %f.path().display(), "usage record not written: {e}");
                    }
                }
            }
        }
        if let Some(l) = &mut self.logs {
            l.push(r);
        }
    }

    async fn flush(&mut self, ignore_backoff: bool) {
        if let Some(l) = &mut self.logs {
            l.flush(ignore_backoff, now_ms()).await;
        }
    }
}

/// The sink `[usage]` asks for, running until `stop`: the sender the join hands records
/// to, or None when records are off or have nowhere to go (no file, no OTLP endpoint).
pub fn start(
    loaded: &Loaded,
    node: &otel::NodeIdentity,
    ctx: otel::otlp::ExportContext,
    counters: Arc<UsageCounters>,
    stop: &CancellationToken,
) -> anyhow::Result<Option<(mpsc::Sender<UsageRecord>, tokio::task::JoinHandle<()>)>> {
    let cfg = &loaded.config.usage;
    if !cfg.records {
        return Ok(None);
    }
    let file = cfg
        .file
        .clone()
        .map(|p| file::RecordFile::new(p, cfg.file_max_bytes, cfg.file_keep));
    let mut timeout = Duration::from_secs(10);
    let logs = match &loaded.otlp {
        Some(settings) => {
            let url = otel::usage::logs_url(settings, |k| std::env::var(k).ok())
                .map_err(|e| anyhow::anyhow!("usage records: {e}"))?;
            timeout = settings.timeout;
            let ex = LogsExporter::new(
                settings.clone(),
                url,
                ctx,
                cfg.queue_records,
                counters.clone(),
            )
            .map_err(|e| anyhow::anyhow!("usage records: {e}"))?;
            tracing::info!(url = %ex.redacted_url(), "sending usage records as OTLP logs");
            Some(ex)
        }
        None => None,
    };
    let name = node.node_name.clone().or(Some(node.host_name.clone()));
    let sink = UsageSink::new(file, logs, name.filter(|n| !n.is_empty()), counters);
    if !sink.has_destination() {
        tracing::info!("usage records: no usage.file and no OTLP endpoint, none kept");
        return Ok(None);
    }
    if let Some(f) = &sink.file {
        tracing::info!(file = %f.path().display(), "writing usage records");
    }
    let (tx, rx) = mpsc::channel(4096);
    let task = tokio::spawn(run(rx, sink, timeout, stop.clone()));
    Ok(Some((tx, task)))
}

/// Takes records until `stop`; then the join's last ones, and one final send within
/// `final_timeout`. What is still queued then is counted as dropped.
pub async fn run(
    mut rx: mpsc::Receiver<UsageRecord>,
    mut sink: UsageSink,
    final_timeout: Duration,
    stop: CancellationToken,
) {
    let mut retry = tokio::time::interval(RETRY_EVERY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            r = rx.recv() => match r {
                Some(r) => {
                    sink.take(r);
                    while let Ok(r) = rx.try_recv() {
                        sink.take(r);
                    }
                    sink.flush(false).await;
                }
                None => break,
            },
            _ = retry.tick() => sink.flush(false).await,
        }
    }
    // The pipeline drops the join when it stops: its open stretches arrive now.
    let _ = tokio::time::timeout(DRAIN_FOR, async {
        while let Some(r) = rx.recv().await {
            sink.take(r);
        }
    })
    .await;
    if tokio::time::timeout(final_timeout, sink.flush(true))
        .await
        .is_err()
    {
        tracing::warn!("usage records: final send timed out");
    }
    if let Some(l) = &sink.logs {
        let left = l.queued() as u64;
        if left > 0 {
            tracing::warn!(records = left, "usage records not sent before exit");
            sink.counters.dropped.fetch_add(left, Relaxed);
        }
    }
}
