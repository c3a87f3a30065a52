//! The OTLP push: a snapshot every interval, sent as it arrives, and one final flush when
//! stopped.
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
    let timeout = ex.settings().timeout;
    let mut when = Schedule::new(Instant::now(), ex.settings().interval, collect);
    // False once the pipeline is gone: the timer alone then.
    let mut open = true;
    // Each export's requests, patched into the next one's where exports are close.
    let mut reuse = otel::otlp::Reuse::for_interval(ex.settings().interval);
    loop {
        let on_time = tokio::select! {
            // A snapshot that arrives with the deadline goes out.
            biased;
            changed = snapshot.changed(), if open => {
                open = changed.is_ok();
                if !open || !when.takes(Instant::now()) {
                    continue;
                }
                true
            }
            _ = tokio::time::sleep_until(when.deadline()) => false,
            _ = stop.cancelled() => {
                let (snap, report) = latest(&snapshot, &stats);
                let max = ex.max_request_bytes();
                for request in otel::otlp::requests(&snap, &report, &ctx, now_ms(), max, &mut reuse) {
                    ex.enqueue(request);
                }
                match tokio::time::timeout(timeout, ex.flush(true)).await {
                    Ok(true) => tracing::info!("final OTLP export sent"),
                    _ => tracing::warn!(queued = ex.queued(), "final OTLP export failed; exiting anyway"),
                }
                return;
            }
        };
        when.exported(Instant::now(), on_time);
        // Request by request: each is encoded once the one before it is sent.
        let (snap, report) = latest(&snapshot, &stats);
        let max = ex.max_request_bytes();
        for request in otel::otlp::requests(&snap, &report, &ctx, now_ms(), max, &mut reuse) {
            ex.export(request).await;
        }
        for sent in ex.take_sent() {
            reuse.give_back(sent);
        }
        if !reuse.is_on() {
            release_free_heap();
        }
    }
}

/// Gives the heap's free pages back to the kernel. glibc keeps freed memory in its heap
/// (and lifts its thresholds past the largest freed block: the start-up's BTF parse of tens
/// of megabytes), so an export's freed requests stayed in the agent's RSS until reused.
/// Once an export, after it is sent: a walk of malloc's free lists, every few tens of
/// seconds.
fn release_free_heap() {
    // SAFETY: malloc_trim has no preconditions.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// When the next export goes out (see `run`).
#[derive(Debug, Clone, Copy)]
struct Schedule {
    due: Instant,
    last: Instant,
    interval: Duration,
    /// Half a collection interval, at most half the export interval, so that exports keep
    /// their rate.
    half: Duration,
}

impl Schedule {
    fn new(now: Instant, interval: Duration, collect: Duration) -> Schedule {
        Schedule {
            due: now + interval,
            last: now,
            interval,
            half: collect.min(interval) / 2,
        }
    }

    /// Does a snapshot that arrives `now` go out? Not right after an export at the
    /// deadline: a window that opens there would send two at once.
    fn takes(&self, now: Instant) -> bool {
        now + self.half >= self.due && now >= self.last + self.half
    }

    /// When the latest goes out if no snapshot comes.
    fn deadline(&self) -> Instant {
        self.due + self.half
    }

    /// After an export with a snapshot (`on_time`) or at the deadline. Without snapshots
    /// the interval is kept, and a late export does not bring the next one forward.
    fn exported(&mut self, now: Instant, on_time: bool) {
        self.last = now;
        self.due = match on_time {
            true => now + self.interval,
            false => (self.due + self.interval).max(now + self.interval - self.half),
        };
    }
}

/// The snapshot to export and the agent's own figures with it.
fn latest(
    snapshot: &Published,
    stats: &Stats,
) -> (Arc<gpu_model::Snapshot>, gpu_model::AgentStats) {
    let snap = snapshot.borrow().clone();
    let report = stats.report(&snap.nvml);
    (snap, report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exports of `total_ms` (ms from the start, and whether a snapshot went out), with
    /// snapshots arriving at `snapshots` (ms, ascending).
    fn exports(
        interval_ms: u64,
        collect_ms: u64,
        snapshots: &[u64],
        total_ms: u64,
    ) -> Vec<(u64, bool)> {
        let t0 = Instant::now();
        let ms = |t: Instant| (t - t0).as_millis() as u64;
        let at = |m: u64| t0 + Duration::from_millis(m);
        let mut when = Schedule::new(
            t0,
            Duration::from_millis(interval_ms),
            Duration::from_millis(collect_ms),
        );
        let (mut out, mut next) = (vec![], snapshots.iter().peekable());
        loop {
            let deadline = ms(when.deadline());
            match next.peek().copied() {
                // A snapshot at the deadline wins (`biased` in `run`).
                Some(&s) if s <= deadline => {
                    next.next();
                    if when.takes(at(s)) {
                        out.push((s, true));
                        when.exported(at(s), true);
                    }
                }
                _ if deadline > total_ms => return out,
                _ => {
                    out.push((deadline, false));
                    when.exported(at(deadline), false);
                }
            }
        }
    }

    /// Every `period` ms from `phase`, each moved by up to `jitter` ms either way.
    fn every(period: u64, phase: u64, jitter: u64, until: u64) -> Vec<u64> {
        (0..)
            .map(|k| phase + k * period + [0, jitter, 2 * jitter][k as usize % 3] - jitter)
            .take_while(|t| *t < until)
            .collect()
    }

    fn gaps(e: &[(u64, bool)]) -> Vec<u64> {
        e.windows(2).map(|w| w[1].0 - w[0].0).collect()
    }

    #[test]
    fn exports_go_out_with_the_snapshots_at_the_export_rate() {
        // Collection and export every second, out of phase by 300 ms, jittered 40 ms.
        let e = exports(1000, 1000, &every(1000, 300, 40, 60_000), 60_000);
        assert!(e.iter().all(|(_, with)| *with), "{e:?}");
        assert!((58..=60).contains(&e.len()), "{}", e.len());
        assert!(
            gaps(&e).iter().all(|g| (920..=1080).contains(g)),
            "{:?}",
            gaps(&e)
        );
        // Export every 10 s, collection every second: each tenth snapshot.
        let e = exports(10_000, 1000, &every(1000, 300, 40, 120_000), 120_000);
        assert!(e.iter().all(|(_, with)| *with), "{e:?}");
        assert!(
            gaps(&e).iter().all(|g| (9920..=10_080).contains(g)),
            "{:?}",
            gaps(&e)
        );
    }

    #[test]
    fn without_snapshots_the_timer_keeps_the_interval_and_the_next_ones_are_caught() {
        // NVML off: an export every interval, half a collection interval after it was due.
        let e = exports(1000, 1000, &[], 10_000);
        let times: Vec<u64> = e.iter().map(|(t, _)| *t).collect();
        assert_eq!(times, (1..=9).map(|k| k * 1000 + 500).collect::<Vec<_>>());
        // Snapshots for 10 s, none for 10 s, then again at another phase: the exports go
        // on at the rate meanwhile, and go with the snapshots again once they are back.
        let mut s = every(1000, 200, 0, 10_000);
        s.extend(every(1000, 20_700, 0, 40_000));
        let e = exports(1000, 1000, &s, 40_000);
        assert!(
            gaps(&e).iter().all(|g| (500..=1500).contains(g)),
            "{:?}",
            gaps(&e)
        );
        assert!((38..=40).contains(&e.len()), "{}", e.len());
        let late: Vec<_> = e.iter().filter(|(t, _)| *t > 22_000).collect();
        assert!(late.iter().all(|(_, with)| *with), "{late:?}");
        // Collection slower than the export: the export keeps its rate.
        let e = exports(1000, 5000, &every(5000, 100, 0, 60_000), 60_000);
        assert!((58..=61).contains(&e.len()), "{}", e.len());
        assert!(
            gaps(&e).iter().all(|g| (500..=1500).contains(g)),
            "{:?}",
            gaps(&e)
        );
    }
}
