//! The OTLP push: the latest snapshot every interval, and one final flush when stopped.
use std::{sync::Arc, time::Duration};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{
    pipeline::{now_ms, Published},
    stats::Stats,
};

/// Pushes until `stop`, then flushes once within the export timeout.
///
/// An export goes out with the snapshot nearest to when it is due, within half a
/// collection interval either way (`collect`, NVML's), not on a timer of its own: the
/// metrics are then as fresh as the collection (a timer out of phase with the NVML cycle
/// sent each snapshot up to an interval late), and the export reads the snapshot while the
/// join's data is still in the CPU's caches (on the largest nodes the export of a cold
/// snapshot was mostly cache misses on its names). When no snapshot comes in that window
/// (NVML slower than that, or off), the latest goes out at its end; the next window then
/// catches the snapshots again, wherever their phase.
pub async fn run(
    mut ex: otel::export::OtlpExporter,
    ctx: otel::otlp::ExportContext,
    collect: Duration,
    mut snapshot: Published,
    stats: Arc<Stats>,
    stop: CancellationToken,
) {
    let interval = ex.settings().interval;
    let timeout = ex.settings().timeout;
    // Never more than half the export interval either, so that exports keep their rate.
    let half = collect.min(interval) / 2;
    let mut due = Instant::now() + interval;
    // False once the pipeline is gone: the timer alone then.
    let mut open = true;
    loop {
        let on_time = tokio::select! {
            changed = snapshot.changed(), if open => {
                open = changed.is_ok();
                if !open || Instant::now() + half < due {
                    continue;
                }
                true
            }
            _ = tokio::time::sleep_until(due + half) => false,
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
        };
        let now = Instant::now();
        // Without snapshots the timer keeps the interval (a late export does not bring the
        // next one forward).
        due = match on_time {
            true => now + interval,
            false => (due + interval).max(now + interval - half),
        };
        // Request by request: each is encoded once the one before it is sent.
        let (snap, report) = latest(&snapshot, &stats);
        for request in otel::otlp::requests(&snap, &report, &ctx, now_ms(), MAX) {
            ex.export(request).await;
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
