//! The local JSON-lines file of usage records, one record a line, rotated by size:
//! `usage.jsonl` -> `usage.jsonl.1` -> ... -> `usage.jsonl.<keep>` (the oldest is removed).
//!
//! A line is whole or absent: a failed or short write (a full disk) is cut off again, and
//! a line torn by a crash is ended when the file is opened, so that the next record starts
//! a line of its own. `RecordQueue` keeps the records the file could not take yet and
//! writes them, in order, once it can.
use std::{
    collections::VecDeque,
    fs::{File, OpenOptions},
    io::Write,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    sync::{atomic::Ordering::Relaxed, Arc},
    time::Duration,
};

use gpu_model::{SourceStatus, UsageRecord};
use otel::usage::UsageCounters;
use tokio::time::Instant;

pub struct RecordFile {
    path: PathBuf,
    max_bytes: u64,
    keep: u32,
    file: Option<File>,
}

/// `path.N`.
pub fn rotated(path: &Path, n: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

impl RecordFile {
    pub fn new(path: PathBuf, max_bytes: u64, keep: u32) -> RecordFile {
        RecordFile {
            path,
            max_bytes,
            keep,
            file: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the file (once), and ends a last line a crash left without its newline: the
    /// fragment stays, one unreadable line, and the next record is a line of its own.
    pub fn open(&mut self) -> std::io::Result<&mut File> {
        if self.file.is_none() {
            if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            let mut f = OpenOptions::new()
                .create(true)
                .read(true)
                .append(true)
                .open(&self.path)?;
            let size = f.metadata()?.len();
            let mut last = [0u8];
            if size > 0 && f.read_at(&mut last, size - 1)? == 1 && last[0] != b'\n' {
                tracing::warn!(file = %self.path.display(),
                    "usage-record file ends in a torn line (a crash while writing?): ending it");
                if let Err(e) = f.write_all(b"\n").and_then(|()| f.sync_data()) {
                    let _ = f.set_len(size);
                    return Err(e);
                }
            }
            self.file = Some(f);
        }
        Ok(self.file.as_mut().unwrap())
    }

    /// The current file goes to `.1`, `.1` to `.2`, ...; the one past `keep` is removed.
    fn rotate(&mut self) -> std::io::Result<()> {
        self.file = None;
        let _ = std::fs::remove_file(rotated(&self.path, self.keep));
        for n in (1..self.keep).rev() {
            let from = rotated(&self.path, n);
            if from.exists() {
                std::fs::rename(&from, rotated(&self.path, n + 1))?;
            }
        }
        std::fs::rename(&self.path, rotated(&self.path, 1))
    }

    /// Appends one line, rotating first when it would pass `max_bytes`; synced, since a
    /// record is what someone bills from. On an error nothing of the line is left.
    pub fn append(&mut self, r: &UsageRecord) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(r).map_err(std::io::Error::other)?;
        line.push(b'\n');
        // The size as it is now, not as counted: something else may have cut the file
        // (logrotate's copytruncate), and an undo must not extend it.
        let size = self.open()?.metadata()?.len();
        if size > 0 && size + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        let f = self.open()?;
        let before = f.metadata()?.len();
        let Err(e) = f.write_all(&line).and_then(|()| f.sync_data()) else {
            return Ok(());
        };
        // A short write (a full disk) left part of the line: cut it off again.
        if f.set_len(before).and_then(|()| f.sync_data()).is_err() {
            // Not undone: a line written whole stays written (writing it again would
            // count it twice); a part is ended as a torn line when the file is reopened.
            let len = f.metadata().map_or(0, |m| m.len());
            self.file = None;
            if len == before + line.len() as u64 {
                return Ok(());
            }
        }
        Err(e)
    }
}

/// Backoff between attempts while the file fails: from the first to the second.
const RETRY: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(30));
/// While the file keeps failing, a WARN at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The records waiting for the file, written oldest first. A failure keeps them and
/// retries with backoff; beyond `max_queued` the oldest are given up, counted as dropped.
pub struct RecordQueue {
    file: RecordFile,
    queue: VecDeque<UsageRecord>,
    max_queued: usize,
    counters: Arc<UsageCounters>,
    retry: (Duration, Duration),
    backoff: Duration,
    next_attempt: Instant,
    /// While failing: when the last WARN was.
    warned: Option<Instant>,
}

impl RecordQueue {
    pub fn new(file: RecordFile, max_queued: usize, counters: Arc<UsageCounters>) -> RecordQueue {
        RecordQueue {
            file,
            queue: VecDeque::new(),
            max_queued: max_queued.max(1),
            counters,
            retry: RETRY,
            backoff: RETRY.0,
            next_attempt: Instant::now(),
            warned: None,
        }
    }

    /// Shorter backoff bounds, for tests.
    #[cfg(test)]
    pub fn with_retry(mut self, min: Duration, max: Duration) -> RecordQueue {
        self.retry = (min, max);
        self.backoff = min;
        self
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Opens the file at start-up: a directory that cannot be written is said now, and a
    /// torn last line ended before any record comes.
    pub fn open(&mut self) {
        match self.file.open() {
            Ok(_) => self.set_status(SourceStatus::Ok),
            Err(e) => self.failed(e),
        }
    }

    /// Queues a record; beyond the bound the oldest is given up and counted.
    pub fn push(&mut self, r: UsageRecord) {
        self.queue.push_back(r);
        while self.queue.len() > self.max_queued {
            self.queue.pop_front();
            self.counters.dropped.fetch_add(1, Relaxed);
        }
        self.counters
            .file_queued
            .store(self.queue.len() as u64, Relaxed);
    }

    /// When a retry is due: None when nothing waits.
    pub fn next_attempt(&self) -> Option<Instant> {
        (!self.queue.is_empty()).then_some(self.next_attempt)
    }

    /// Writes what is queued, oldest first, unless backing off; stops at the first
    /// failure, which keeps the record for a retry.
    pub fn write(&mut self, ignore_backoff: bool) {
        if self.queue.is_empty() || (!ignore_backoff && Instant::now() < self.next_attempt) {
            return;
        }
        while let Some(r) = self.queue.front() {
            match self.file.append(r) {
                Ok(()) => {
                    self.queue.pop_front();
                    self.counters.written.fetch_add(1, Relaxed);
                    if self.warned.take().is_some() {
                        tracing::info!(file = %self.file.path().display(), "usage records: writing again");
                    }
                    self.backoff = self.retry.0;
                    self.set_status(SourceStatus::Ok);
                }
                Err(e) => {
                    self.failed(e);
                    self.next_attempt = Instant::now() + self.backoff;
                    self.backoff = (self.backoff * 2).min(self.retry.1);
                    break;
                }
            }
        }
        self.counters
            .file_queued
            .store(self.queue.len() as u64, Relaxed);
    }

    /// Says so: the status at once, a WARN at the first failure and then at most once per
    /// `WARN_EVERY` while it lasts.
    fn failed(&mut self, e: std::io::Error) {
        self.set_status(SourceStatus::Unavailable(e.to_string()));
        let now = Instant::now();
        if self
            .warned
            .is_none_or(|t| now.duration_since(t) >= WARN_EVERY)
        {
            self.warned = Some(now);
            tracing::warn!(file = %self.file.path().display(), queued = self.queue.len(),
                dropped = self.counters.dropped.load(Relaxed),
                "usage records not written, kept and retried: {e}");
        }
    }

    fn set_status(&self, s: SourceStatus) {
        *self.counters.file.write().unwrap() = s;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fresh directory, removed on drop.
    pub struct TempDir(pub PathBuf);

    impl TempDir {
        pub fn new(name: &str) -> TempDir {
            static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let seq = SEQ.fetch_add(1, Relaxed);
            let p = std::env::temp_dir().join(format!("usage-{name}-{}-{seq}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    pub fn record(start_ms: u64) -> UsageRecord {
        UsageRecord {
            uuid: "GPU-1".into(),
            gpu_uuid: "GPU-1".into(),
            reason: "exited".into(),
            start_ms,
            // A record that ends before it starts is left out where records are read.
            end_ms: start_ms + 1,
            ..Default::default()
        }
    }

    fn read(p: &Path) -> Vec<u64> {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<UsageRecord>(l).unwrap().start_ms)
            .collect()
    }

    #[test]
    fn rotates_by_size_and_keeps_the_newest_files() {
        let dir = TempDir::new("rotate");
        let path = dir.0.join("sub").join("usage.jsonl");
        let line = serde_json::to_vec(&record(0)).unwrap().len() as u64 + 1;
        // Two lines per file, two rotated files kept.
        let mut f = RecordFile::new(path.clone(), line * 2, 2);
        for i in 0..7 {
            f.append(&record(i)).unwrap();
        }
        assert_eq!(read(&path), [6]);
        assert_eq!(read(&rotated(&path, 1)), [4, 5]);
        assert_eq!(read(&rotated(&path, 2)), [2, 3]);
        assert!(!rotated(&path, 3).exists());
    }

    #[test]
    fn a_record_after_a_torn_last_line_is_a_line_of_its_own() {
        let dir = TempDir::new("torn");
        let path = dir.0.join("usage.jsonl");
        let mut whole = serde_json::to_vec(&record(1)).unwrap();
        whole.push(b'\n');
        // A crash in the middle of the second record's write, inside a character.
        let second = UsageRecord {
            pod_name: Some("zürich-0".into()),
            ..record(2)
        };
        let second = serde_json::to_vec(&second).unwrap();
        let cut = second.iter().position(|b| *b == 0xc3).unwrap() + 1;
        std::fs::write(&path, [&whole[..], &second[..cut]].concat()).unwrap();
        let mut f = RecordFile::new(path.clone(), 1 << 20, 2);
        f.append(&record(3)).unwrap();
        let text = std::fs::read(&path).unwrap();
        let third = serde_json::to_vec(&record(3)).unwrap();
        assert_eq!(
            text,
            [&whole[..], &second[..cut], b"\n", &third, b"\n"].concat()
        );
        // Both records read back whole, and the fragment is one bad line (report.rs's
        // tests read such a file through `gpu-agent report`'s reader).
        let lines = text.split(|b| *b == b'\n').filter(|l| !l.is_empty());
        let parsed: Vec<Option<u64>> = lines
            .map(|l| {
                serde_json::from_slice::<UsageRecord>(l)
                    .ok()
                    .map(|r| r.start_ms)
            })
            .collect();
        assert_eq!(parsed, [Some(1), None, Some(3)]);
    }
}
