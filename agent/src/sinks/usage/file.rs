//! The local JSON-lines file of usage records, one record a line, rotated by size:
//! `usage.jsonl` -> `usage.jsonl.1` -> ... -> `usage.jsonl.<keep>` (the oldest is removed).
use std::{
    fs::{File, OpenOptions},
    io::Write,
    path::{Path, PathBuf},
};

use gpu_model::UsageRecord;

pub struct RecordFile {
    path: PathBuf,
    max_bytes: u64,
    keep: u32,
    file: Option<File>,
    size: u64,
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
            size: 0,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open(&mut self) -> std::io::Result<&mut File> {
        if self.file.is_none() {
            if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)?;
            self.size = f.metadata()?.len();
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
        std::fs::rename(&self.path, rotated(&self.path, 1))?;
        self.size = 0;
        Ok(())
    }

    /// Appends one line, rotating first when it would pass `max_bytes`; synced, since a
    /// record is what someone bills from.
    pub fn append(&mut self, r: &UsageRecord) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(r).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.open()?;
        if self.size > 0 && self.size + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        let f = self.open()?;
        f.write_all(&line)?;
        f.sync_data()?;
        self.size += line.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_by_size_and_keeps_the_newest_files() {
        let dir = std::env::temp_dir().join(format!("usage-file-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("sub").join("usage.jsonl");
        let r = UsageRecord {
            uuid: "GPU-1".into(),
            gpu_uuid: "GPU-1".into(),
            reason: "exited".into(),
            ..Default::default()
        };
        let line = serde_json::to_vec(&r).unwrap().len() as u64 + 1;
        // Two lines per file, two rotated files kept.
        let mut f = RecordFile::new(path.clone(), line * 2, 2);
        for i in 0..7 {
            let mut r = r.clone();
            r.start_ms = i;
            f.append(&r).unwrap();
        }
        let read = |p: &Path| -> Vec<u64> {
            std::fs::read_to_string(p)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<UsageRecord>(l).unwrap().start_ms)
                .collect()
        };
        assert_eq!(read(&path), [6]);
        assert_eq!(read(&rotated(&path, 1)), [4, 5]);
        assert_eq!(read(&rotated(&path, 2)), [2, 3]);
        assert!(!rotated(&path, 3).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
