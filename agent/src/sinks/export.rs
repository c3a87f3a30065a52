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
    let request = |now: u64| {
        let snap = snapshot.borrow().clone();
        otel::otlp::encode_request(&snap, &stats.report(&snap.nvml), &ctx, now)
    };
    loop {
        tokio::select! {
            _ = tick.tick() => {
                ex.export(request(now_ms())).await;
            }
            _ = stop.cancelled() => {
                ex.enqueue(request(now_ms()));
                match tokio::time::timeout(timeout, ex.flush(true)).await {
                    Ok(true) => tracing::info!("final OTLP export sent"),
                    _ => tracing::warn!(queued = ex.queued(), "final OTLP export failed; exiting anyway"),
                }
                return;
            }
        }
    }
}
