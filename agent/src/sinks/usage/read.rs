//! Reading the usage-record file back, one record at a time, for `gpu-agent report` and
//! `gpu-agent rightsize`: the file and its rotated files, oldest first, streamed (memory
//! does not grow with the records), each record checked before it is counted:
//! - a line that is not a record is unreadable;
//! - a figure out of its range (a percentage above 100, an allocation outside 0-1 GPU of
//!   its one device, an end before its start or more than a day ahead of now, a device of
//!   no memory, a peak above the device's memory, a negative or non-finite sum) is out of
//!   range;
//! - a record with the container, device and start of one already read is a duplicate.
//!
//! What was left out is counted by reason, with the first few places, for stderr.
use std::{
    collections::HashSet,
    hash::{Hash, Hasher},
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
};

use gpu_model::UsageRecord;

use super::file::rotated;

/// How far past now a record may end (clocks a little apart, a record being written).
pub const FUTURE_SLACK_MS: u64 = 86_400_000;

/// Places shown per reason.
const EXAMPLES: usize = 3;

/// Why a line was left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    Unreadable,
    OutOfRange,
    Duplicate,
}

/// What was left out, by reason: how many, and the first few (what and where).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LeftOut {
    pub unreadable: Tally,
    pub out_of_range: Tally,
    pub duplicate: Tally,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    pub count: usize,
    pub examples: Vec<String>,
}

impl LeftOut {
    pub fn add(&mut self, reason: Reason, example: impl FnOnce() -> String) {
        let t = match reason {
            Reason::Unreadable => &mut self.unreadable,
            Reason::OutOfRange => &mut self.out_of_range,
            Reason::Duplicate => &mut self.duplicate,
        };
        t.count += 1;
        if t.examples.len() < EXAMPLES {
            t.examples.push(example());
        }
    }

    pub fn total(&self) -> usize {
        self.unreadable.count + self.out_of_range.count + self.duplicate.count
    }

    /// One line per reason with any, for stderr: `3 records out of range left out:
    /// gpus_allocated 1000000 (one device: 0 to 1) at usage.jsonl:812, ...`.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![];
        for (t, what) in [
            (&self.unreadable, "unreadable lines skipped"),
            (&self.out_of_range, "records out of range left out"),
            (
                &self.duplicate,
                "duplicate records left out (same container, device and start)",
            ),
        ] {
            if t.count == 0 {
                continue;
            }
            let more = match t.count > t.examples.len() {
                true => ", ...",
                false => "",
            };
            out.push(format!(
                "{} {what}: {}{more}",
                t.count,
                t.examples.join(", ")
            ));
        }
        out
    }
}

/// What is wrong with `r`, naming the field and its value; None when every figure is in
/// its range. `now_ms`: records may end at most a day after it.
pub fn check(r: &UsageRecord, now_ms: u64) -> Option<String> {
    if r.end_ms < r.start_ms {
        return Some(format!(
            "end_ms {} before start_ms {}",
            r.end_ms, r.start_ms
        ));
    }
    if r.end_ms > now_ms.saturating_add(FUTURE_SLACK_MS) {
        return Some(format!("end_ms {} in the future", r.end_ms));
    }
    for (name, v) in [
        ("sm_p50", r.sm_p50),
        ("sm_p95", r.sm_p95),
        ("sm_max", r.sm_max),
    ] {
        if let Some(v) = v.filter(|v| *v > 100) {
            return Some(format!("{name} {v} (a percentage)"));
        }
    }
    if let Some(a) = r
        .gpus_allocated
        .filter(|a| !(a.is_finite() && (0.0..=1.0).contains(a)))
    {
        return Some(format!("gpus_allocated {a} (one device: 0 to 1)"));
    }
    match r.device_memory_bytes {
        Some(0) => return Some("device_memory_bytes 0".into()),
        Some(m) if r.memory_peak_bytes > m => {
            return Some(format!(
                "memory_peak_bytes {} above device_memory_bytes {m}",
                r.memory_peak_bytes
            ))
        }
        _ => {}
    }
    let sums = [
        ("gpu_seconds", r.gpu_seconds.unwrap_or(0.0)),
        ("memory_byte_seconds", r.memory_byte_seconds),
        ("energy_joules", r.energy_joules),
        ("accounted_gpu_seconds", r.accounted_gpu_seconds),
    ];
    for (name, v) in sums {
        if !(v.is_finite() && v >= 0.0) {
            return Some(format!("{name} {v}"));
        }
    }
    None
}

/// The file and its rotated files, oldest first; `Err` when there is none.
pub fn files(file: &Path) -> Result<Vec<PathBuf>, String> {
    let mut paths = vec![];
    let mut n = 1;
    while rotated(file, n).exists() {
        paths.push(rotated(file, n));
        n += 1;
    }
    paths.reverse();
    if file.exists() {
        paths.push(file.to_path_buf());
    }
    match paths.is_empty() {
        true => Err(format!("{}: no such file (usage.file)", file.display())),
        false => Ok(paths),
    }
}

/// A record's identity for duplicates: its container, device and start, hashed (64 bits
/// a record, not the record).
fn identity(r: &UsageRecord) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&r.container_id, &r.pod_uid, &r.uuid, r.start_ms).hash(&mut h);
    h.finish()
}

/// Each good record of `file` and its rotated files, oldest first, handed to `each`; what
/// was left out. Lines are read as bytes: a line torn inside a character is one unreadable
/// line, not a bad file.
pub fn for_each_record(
    file: &Path,
    now_ms: u64,
    mut each: impl FnMut(UsageRecord),
) -> Result<LeftOut, String> {
    let mut left = LeftOut::default();
    let mut seen: HashSet<u64> = HashSet::new();
    for p in files(file)? {
        let f = std::fs::File::open(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        let name = p.file_name().map_or(p.display().to_string(), |n| {
            n.to_string_lossy().into_owned()
        });
        let mut reader = BufReader::with_capacity(1 << 16, f);
        let mut line = Vec::new();
        let mut n = 0;
        loop {
            line.clear();
            let read = (reader.read_until(b'\n', &mut line))
                .map_err(|e| format!("{}: {e}", p.display()))?;
            if read == 0 {
                break;
            }
            n += 1;
            if line.trim_ascii().is_empty() {
                continue;
            }
            let r = match serde_json::from_slice::<UsageRecord>(&line) {
                Ok(r) => r,
                Err(_) => {
                    left.add(Reason::Unreadable, || format!("{name}:{n}"));
                    continue;
                }
            };
            if let Some(why) = check(&r, now_ms) {
                left.add(Reason::OutOfRange, || format!("{why} at {name}:{n}"));
                continue;
            }
            if !seen.insert(identity(&r)) {
                left.add(Reason::Duplicate, || format!("{name}:{n}"));
                continue;
            }
            each(r);
        }
    }
    Ok(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 10_000_000;

    fn rec(start_ms: u64) -> UsageRecord {
        UsageRecord {
            container_id: Some("c1".into()),
            uuid: "GPU-1".into(),
            gpu_uuid: "GPU-1".into(),
            start_ms,
            end_ms: start_ms + 1000,
            memory_peak_bytes: 1 << 30,
            device_memory_bytes: Some(80 << 30),
            gpus_allocated: Some(1.0),
            sm_p95: Some(50),
            reason: "checkpoint".into(),
            ..Default::default()
        }
    }

    #[test]
    fn each_figure_out_of_its_range_is_named() {
        assert_eq!(check(&rec(0), NOW), None);
        type Edit = fn(&mut UsageRecord);
        let cases: [(Edit, &str); 8] = [
            (|r| r.gpus_allocated = Some(1e6), "gpus_allocated 1000000"),
            (|r| r.gpus_allocated = Some(f64::NAN), "gpus_allocated NaN"),
            (|r| r.end_ms = 10, "end_ms 10 before start_ms 500"),
            (|r| r.end_ms = NOW + 2 * FUTURE_SLACK_MS, "in the future"),
            (|r| r.sm_p95 = Some(150), "sm_p95 150"),
            (|r| r.device_memory_bytes = Some(0), "device_memory_bytes 0"),
            (|r| r.memory_peak_bytes = 81 << 30, "memory_peak_bytes"),
            (|r| r.energy_joules = -1.0, "energy_joules -1"),
        ];
        for (bad, want) in cases {
            let mut r = rec(500);
            bad(&mut r);
            let got = check(&r, NOW).unwrap_or_default();
            assert!(got.contains(want), "{got:?} should say {want:?}");
        }
    }

    #[test]
    fn the_file_streams_and_what_is_left_out_is_counted_by_reason() {
        let dir = std::env::temp_dir().join(format!("read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("usage.jsonl");
        let line = |r: &UsageRecord| serde_json::to_string(r).unwrap();
        let mut big = rec(3000);
        big.gpus_allocated = Some(1e6);
        let text = [
            line(&rec(1000)),
            line(&rec(1000)),
            "{not json".into(),
            line(&rec(2000)),
            line(&big),
            String::new(),
        ]
        .join("\n");
        std::fs::write(&file, text).unwrap();
        let mut starts = vec![];
        let left = for_each_record(&file, NOW, |r| starts.push(r.start_ms)).unwrap();
        assert_eq!(starts, [1000, 2000]);
        assert_eq!(
            (
                left.unreadable.count,
                left.out_of_range.count,
                left.duplicate.count
            ),
            (1, 1, 1)
        );
        assert_eq!(
            left.lines(),
            [
                "1 unreadable lines skipped: usage.jsonl:3",
                "1 records out of range left out: gpus_allocated 1000000 (one device: 0 to 1) at usage.jsonl:5",
                "1 duplicate records left out (same container, device and start): usage.jsonl:2",
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
