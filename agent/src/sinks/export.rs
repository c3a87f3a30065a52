//! The OTLP push: the latest snapshot every interval, and one final flush when stopped.
use std::sync::Arc;

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::{
    pipeline::{now_ms, Published},
    stats::Stats,
};

/// Pushes until `stop`, then flushes once within the export timeout.
pub async fn run(
    mut ex: otel::export::OtlpExporter,
    ctx: otel::otlp::ExportContext,
    snapshot: Published,
    stats: Arc<Stats>,
    stop: CancellationToken,
) {
    let interval = ex.settings().interval;
    let timeout = ex.settings().timeout;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                // Request by request: each is encoded once the one before it is sent.
                let (snap, report) = latest(&snapshot, &stats);
                for request in otel::otlp::requests(&snap, &report, &ctx, now_ms(), MAX) {
                    ex.export(request).await;
                }
            }
            _ = stop.cancelled() => {
                let (snap, report) = latest(&snapshot, &stats);
                for request in otel::otlp::requests(&snap, &report, &ctx, now_ms(), MAX) {
                    ex.enqueue(request);
                }
                match tokio::time::timeout(timeout, ex.flush(true)).await {
                    Ok(true) => tracing::info!("final OTLP export sent"),
                    _ => tracing::warn!(queued = ex.queued(), "final OTLP export failed; exiting anyway"),
                }
                return;
            }
        }
    }
}

const MAX: usize = otel::otlp::MAX_REQUEST_BYTES;

/// The snapshot to export and the agent's own figures with it.
fn latest(
    snapshot: &Published,
    stats: &Stats,
) -> (Arc<gpu_model::Snapshot>, gpu_model::AgentStats) {
    let snap = snapshot.borrow().clone();
    let report = stats.report(&snap.nvml);
    (snap, report)
}
