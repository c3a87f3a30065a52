//! Usage records out: each record the join closes goes to the local JSON-lines file (when
//! configured) and to the collector as an OTLP log record (when a logs endpoint is
//! configured). Each destination has a bounded queue that keeps records while it fails (a
//! full disk, a collector outage) and retries with backoff. `report` reads the file back
//! for `gpu-agent report`.
pub mod file;
pub mod read;
pub mod report;

use std::{
    sync::{atomic::Ordering::Relaxed, Arc},
    time::Duration,
};

use gpu_model::{ExportTarget, SourceStatus, UsageRecord};
use otel::usage::{LogsExporter, UsageCounters};
use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::{config::Loaded, pipeline::now_ms, stats::Stats};

/// At shutdown: how long the join's last records (`agent_stopped`) are waited for.
const DRAIN_FOR: Duration = Duration::from_secs(3);

pub struct UsageSink {
    pub file: Option<file::RecordQueue>,
    pub logs: Option<LogsExporter>,
    /// Stamped on every record: k8s.node.name, else the host name.
    pub node: Option<String>,
    pub counters: Arc<UsageCounters>,
}

impl UsageSink {
    /// Opens the file now: a torn last line is ended, and a file that cannot be written
    /// is said at start-up. The destinations' states start in `counters`.
    pub fn new(
        mut file: Option<file::RecordQueue>,
        logs: Option<LogsExporter>,
        node: Option<String>,
        counters: Arc<UsageCounters>,
    ) -> UsageSink {
        match &mut file {
            Some(f) => f.open(),
            None => *counters.file.write().unwrap() = SourceStatus::Disabled,
        }
        if logs.is_none() {
            *counters.logs.write().unwrap() = SourceStatus::Disabled;
        }
        UsageSink {
            file,
            logs,
            node,
            counters,
        }
    }

    /// Somewhere to put records: without, the join need not close any.
    pub fn has_destination(&self) -> bool {
        self.file.is_some() || self.logs.is_some()
    }

    fn take(&mut self, mut r: UsageRecord) {
        r.node = r.node.or_else(|| self.node.clone());
        match (&mut self.file, &mut self.logs) {
            (Some(f), Some(l)) => {
                f.push(r.clone());
                l.push(r);
            }
            (Some(f), None) => f.push(r),
            (None, Some(l)) => l.push(r),
            (None, None) => {}
        }
    }

    /// Writes and sends what waits, each destination unless it is backing off.
    async fn flush(&mut self, ignore_backoff: bool) {
        if let Some(f) = &mut self.file {
            f.write(ignore_backoff);
        }
        if let Some(l) = &mut self.logs {
            l.flush(ignore_backoff, now_ms()).await;
        }
    }

    /// When the next retry is due: None when nothing waits.
    fn next_attempt(&self) -> Option<Instant> {
        let file = self.file.as_ref().and_then(|f| f.next_attempt());
        let logs = self.logs.as_ref().and_then(|l| l.next_attempt());
        file.into_iter().chain(logs.map(Instant::from_std)).min()
    }
}

/// The sink `[usage]` asks for, running until `stop`: the sender the join hands records
/// to, or None when records are off or have nowhere to go (no file, no OTLP logs
/// endpoint). Never fails: a destination that does not work is retried, and said in
/// `/debug/stats`.
pub fn start(
    loaded: &Loaded,
    node: &otel::NodeIdentity,
    ctx: otel::otlp::ExportContext,
    stats: &Stats,
    stop: &CancellationToken,
) -> Option<(mpsc::Sender<UsageRecord>, tokio::task::JoinHandle<()>)> {
    let cfg = &loaded.config.usage;
    let counters = stats.usage.clone();
    if !cfg.records {
        *counters.file.write().unwrap() = SourceStatus::Disabled;
        *counters.logs.write().unwrap() = SourceStatus::Disabled;
        return None;
    }
    let file = cfg.file.clone().map(|p| {
        let f = file::RecordFile::new(p, cfg.file_max_bytes, cfg.file_keep);
        file::RecordQueue::new(f, cfg.queue_records, counters.clone())
    });
    let mut timeout = Duration::from_secs(10);
    let logs = match &loaded.otlp_logs {
        Some(settings) => {
            timeout = settings.timeout;
            let ex = LogsExporter::new(settings.clone(), ctx, cfg.queue_records, counters.clone());
            tracing::info!(url = %ex.redacted_url(), protocol = ?settings.protocol,
                "sending usage records as OTLP logs");
            *stats.otlp_logs.write().unwrap() = ExportTarget::Url(ex.redacted_url());
            Some(ex)
        }
        None => {
            if loaded.otlp.is_some() {
                tracing::info!(
                    "usage records are not sent over OTLP: no logs endpoint \
                    (OTEL_EXPORTER_OTLP_LOGS_ENDPOINT) and no base endpoint \
                    (OTEL_EXPORTER_OTLP_ENDPOINT or otlp.endpoint)"
                );
            }
            None
        }
    };
    let name = node.node_name.clone().or(Some(node.host_name.clone()));
    let sink = UsageSink::new(file, logs, name.filter(|n| !n.is_empty()), counters);
    if !sink.has_destination() {
        tracing::info!("usage records: no usage.file and no OTLP endpoint, none kept");
        return None;
    }
    if let Some(f) = &sink.file {
        tracing::info!(file = %f.path().display(), "writing usage records");
    }
    let (tx, rx) = mpsc::channel(4096);
    let task = tokio::spawn(run(rx, sink, timeout, stop.clone()));
    Some((tx, task))
}

/// Takes records until `stop`, retrying what waits when its backoff ends; then the join's
/// last ones, one final write and send within `final_timeout`. What still waits then is
/// counted as dropped.
pub async fn run(
    mut rx: mpsc::Receiver<UsageRecord>,
    mut sink: UsageSink,
    final_timeout: Duration,
    stop: CancellationToken,
) {
    loop {
        let retry = sink.next_attempt();
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
            _ = tokio::time::sleep_until(retry.unwrap_or_else(Instant::now)), if retry.is_some() => {
                sink.flush(false).await;
            }
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
    let unwritten = sink.file.as_ref().map_or(0, |f| f.queued()) as u64;
    if unwritten > 0 {
        tracing::warn!(records = unwritten, "usage records not written before exit");
    }
    let unsent = sink.logs.as_ref().map_or(0, |l| l.queued()) as u64;
    if unsent > 0 {
        tracing::warn!(records = unsent, "usage records not sent before exit");
    }
    sink.counters.dropped.fetch_add(unwritten + unsent, Relaxed);
}

#[cfg(test)]
mod tests {
    use std::{ffi::CString, io::Write, os::unix::ffi::OsStrExt, path::Path};

    use super::{
        file::tests::{record, TempDir},
        *,
    };

    /// A tmpfs of `bytes` on a fresh directory, unmounted on drop.
    struct Tmpfs(TempDir);

    impl Tmpfs {
        fn mount(bytes: usize) -> Tmpfs {
            let dir = TempDir::new("tmpfs");
            let target = CString::new(dir.0.as_os_str().as_bytes()).unwrap();
            let opts = CString::new(format!("size={bytes},mode=700")).unwrap();
            // SAFETY: NUL-terminated strings that outlive the call.
            let rc = unsafe {
                libc::mount(
                    c"tmpfs".as_ptr(),
                    target.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    opts.as_ptr().cast(),
                )
            };
            assert_eq!(rc, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
            Tmpfs(dir)
        }
    }

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let target = CString::new(self.0 .0.as_os_str().as_bytes()).unwrap();
            // SAFETY: as above. Detached: a file still open must not keep it mounted.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }

    fn line(start_ms: u64) -> Vec<u8> {
        let mut l = serde_json::to_vec(&record(start_ms)).unwrap();
        l.push(b'\n');
        l
    }

    /// Fills the filesystem of `dir` to the last byte.
    fn fill(dir: &Path) {
        let mut f = std::fs::File::create(dir.join("filler")).unwrap();
        for chunk in [4096, 1] {
            while f.write_all(&vec![0u8; chunk]).is_ok() {}
        }
    }

    /// The file holds `before`, no part of a line more.
    fn unchanged(path: &Path, before: &[u8]) {
        let now = std::fs::read(path).unwrap();
        let tail = String::from_utf8_lossy(&now[before.len().min(now.len())..]);
        assert!(
            now == before,
            "{} bytes, {} before: {tail:?}",
            now.len(),
            before.len()
        );
    }

    async fn until(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A full disk: the record that does not fit leaves no part of itself, waits, and is
    /// written once there is room again; the queue's bound gives up the oldest, counted.
    #[test]
    #[ignore = "needs root: mounts a tmpfs"]
    fn a_full_disk_leaves_no_torn_line_and_the_records_follow_once_there_is_room() {
        let fs = Tmpfs::mount(64 << 10);
        let path = fs.0 .0.join("usage.jsonl");
        // Whole records up to less than a line before the end of a page: the next one
        // fits in part only once the disk is full.
        let len = line(1000).len();
        let mut before = vec![];
        while before.len() % 4096 <= 4096 - len {
            before.extend(line(1000 + before.len() as u64 / len as u64));
        }
        std::fs::write(&path, &before).unwrap();
        fill(&fs.0 .0);
        let counters = Arc::new(UsageCounters::default());
        let f = file::RecordFile::new(path.clone(), 1 << 20, 2);
        let queue = file::RecordQueue::new(f, 3, counters.clone())
            .with_retry(Duration::from_millis(10), Duration::from_millis(50));
        let sink = UsageSink::new(Some(queue), None, None, counters.clone());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (tx, rx) = mpsc::channel(16);
            let stop = CancellationToken::new();
            let task = tokio::spawn(run(rx, sink, Duration::from_secs(1), stop.clone()));
            let status = || counters.file.read().unwrap().clone();
            tx.send(record(5000)).await.unwrap();
            until("the file failing", || status().reason().is_some()).await;
            // Retried meanwhile, every time cut back to whole lines.
            tokio::time::sleep(Duration::from_millis(200)).await;
            unchanged(&path, &before);
            for start in [5001, 5002, 5003] {
                tx.send(record(start)).await.unwrap();
            }
            until("the oldest given up", || {
                counters.dropped.load(Relaxed) == 1
            })
            .await;
            assert_eq!(counters.file_queued.load(Relaxed), 3);
            unchanged(&path, &before);
            std::fs::remove_file(fs.0 .0.join("filler")).unwrap();
            until("the kept records written", || {
                counters.written.load(Relaxed) == 3
            })
            .await;
            assert_eq!(status(), SourceStatus::Ok);
            assert_eq!(counters.file_queued.load(Relaxed), 0);
            stop.cancel();
            drop(tx);
            task.await.unwrap();
        });
        let (records, bad) = report::read_records(&path).unwrap();
        let starts: Vec<u64> = records
            .iter()
            .map(|r| r.start_ms)
            .skip(before.len() / len)
            .collect();
        assert_eq!((starts, bad), (vec![5001, 5002, 5003], 0));
        assert_eq!(counters.dropped.load(Relaxed), 1);
    }
}
