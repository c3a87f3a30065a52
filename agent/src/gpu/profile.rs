//! A stretch of use's profile: how its SM utilization and its memory were distributed over
//! its samples, in fixed histograms (the same size however long the stretch runs), read
//! back as the percentiles of its usage record.

/// SM utilization: one bucket per percent, 0 to 100.
const SM_BUCKETS: usize = 101;

/// Memory, log-linear: exact below 8 MiB (bucket 0 is under 1 MiB), then eight buckets per
/// doubling, each at most 1/8 of its lower bound wide, up to 2 TiB.
const MEMORY_BUCKETS: usize = 8 + 18 * 8;

/// Where a sample's SM figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmSource {
    /// NVML's per-process utilization, summed over the container's processes.
    Process,
    /// GPM's SM activity of a device (GPU or MIG instance) the container had to itself.
    Gpm,
}

/// Counts per bucket; u16 keeps a profile at 0.5 KB. A full bucket halves them all, which
/// keeps the quantiles (ratios), so a stretch longer than 65,535 samples loses nothing
/// that matters.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    sm: [u16; SM_BUCKETS],
    memory: [u16; MEMORY_BUCKETS],
    /// SM samples by source: process utilization, GPM.
    sources: [u32; 2],
}

impl Default for Profile {
    fn default() -> Self {
        Profile {
            sm: [0; SM_BUCKETS],
            memory: [0; MEMORY_BUCKETS],
            sources: [0; 2],
        }
    }
}

/// The memory bucket of `bytes`.
fn memory_bucket(bytes: u64) -> usize {
    let mib = bytes >> 20;
    if mib < 8 {
        return mib as usize;
    }
    let e = 63 - mib.leading_zeros() as usize;
    let sub = (mib >> (e - 3)) as usize - 8;
    (8 + (e - 3) * 8 + sub).min(MEMORY_BUCKETS - 1)
}

/// The largest value bucket `i` holds (its upper bound), bytes.
fn memory_upper(i: usize) -> u64 {
    if i < 8 {
        return ((i as u64 + 1) << 20) - 1;
    }
    let (e, sub) = (3 + (i - 8) / 8, (i - 8) % 8);
    (((8 + sub as u64 + 1) << (e - 3)) << 20) - 1
}

/// The bucket holding the `q` quantile: the first whose running count reaches q of all.
fn quantile(counts: &[u16], q: f64) -> Option<usize> {
    let n: u64 = counts.iter().map(|&c| c as u64).sum();
    if n == 0 {
        return None;
    }
    let want = ((q * n as f64).ceil() as u64).clamp(1, n);
    let mut seen = 0;
    counts.iter().position(|&c| {
        seen += c as u64;
        seen >= want
    })
}

fn bump(counts: &mut [u16], i: usize) {
    if counts[i] == u16::MAX {
        counts.iter_mut().for_each(|c| *c /= 2);
    }
    counts[i] += 1;
}

impl Profile {
    /// One sample: the SM utilization (percent, where known, and whence) and the memory
    /// held.
    pub fn add(&mut self, sm: Option<(u32, SmSource)>, memory_bytes: u64) {
        if let Some((pct, source)) = sm {
            bump(&mut self.sm, pct.min(100) as usize);
            self.sources[source as usize] += 1;
        }
        bump(&mut self.memory, memory_bucket(memory_bytes));
    }

    /// The SM utilization's `q` quantile, percent; None without an SM sample.
    pub fn sm(&self, q: f64) -> Option<u32> {
        quantile(&self.sm, q).map(|i| i as u32)
    }

    /// The memory's `q` quantile: the upper bound of its bucket (within 1/8 above the
    /// truth), never above `peak`.
    pub fn memory(&self, q: f64, peak: u64) -> u64 {
        quantile(&self.memory, q).map_or(0, |i| memory_upper(i).min(peak))
    }

    /// `process_utilization`, `gpm` or `mixed`; None without an SM sample.
    pub fn sm_source(&self) -> Option<&'static str> {
        match self.sources {
            [0, 0] => None,
            [_, 0] => Some("process_utilization"),
            [0, _] => Some("gpm"),
            _ => Some("mixed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn sm_percentiles_are_exact_to_the_percent() {
        let mut p = Profile::default();
        assert_eq!((p.sm(0.5), p.sm_source()), (None, None));
        // 10 % for 90 samples, 80 % for 10: the median and p90 are 10, p95 and max 80.
        for i in 0..100 {
            let pct = if i < 90 { 10 } else { 80 };
            p.add(Some((pct, SmSource::Process)), 0);
        }
        assert_eq!(
            [p.sm(0.5), p.sm(0.9), p.sm(0.95), p.sm(1.0)],
            [Some(10), Some(10), Some(80), Some(80)]
        );
        assert_eq!(p.sm_source(), Some("process_utilization"));
        p.add(Some((130, SmSource::Gpm)), 0);
        assert_eq!((p.sm(1.0), p.sm_source()), (Some(100), Some("mixed")));
        p.add(None, 0);
        assert_eq!(p.sources, [100, 1], "a sample without SM adds memory only");
    }

    #[test]
    fn memory_buckets_cover_every_size_within_an_eighth() {
        for bytes in [
            0,
            MIB - 1,
            MIB,
            7 * MIB,
            8 * MIB,
            9 * MIB + 5,
            7 << 30,
            30 << 30,
        ]
        .into_iter()
        .chain((0..40).map(|s| (1u64 << s) * 3 + 17))
        {
            let i = memory_bucket(bytes);
            let upper = memory_upper(i);
            assert!(upper >= bytes, "{bytes}: bucket {i} ends at {upper}");
            let lower = if i == 0 { 0 } else { memory_upper(i - 1) + 1 };
            assert!(lower <= bytes, "{bytes}: bucket {i} starts at {lower}");
            assert!(
                upper - lower < lower / 8 + MIB,
                "{bytes}: bucket {i} too wide"
            );
        }
        assert_eq!(memory_bucket(u64::MAX), MEMORY_BUCKETS - 1);
    }

    #[test]
    fn memory_p95_is_within_an_eighth_and_never_above_the_peak() {
        let mut p = Profile::default();
        for i in 0..100u64 {
            p.add(None, if i < 96 { 6 << 30 } else { 7 << 30 });
        }
        let p95 = p.memory(0.95, 7 << 30);
        assert!((6 << 30..(6 << 30) + (6 << 30) / 8).contains(&p95), "{p95}");
        assert_eq!(p.memory(1.0, 7 << 30), 7 << 30, "capped at the peak");
        assert_eq!(Profile::default().memory(0.95, 0), 0);
    }

    #[test]
    fn a_full_bucket_halves_them_all_and_the_quantiles_hold() {
        let mut p = Profile::default();
        for i in 0..200_000u32 {
            p.add(
                Some((if i % 4 == 0 { 90 } else { 20 }, SmSource::Process)),
                0,
            );
        }
        assert!(
            p.sm[20] > 30_000 && p.sm[90] > 10_000,
            "{} {}",
            p.sm[20],
            p.sm[90]
        );
        assert_eq!([p.sm(0.5), p.sm(0.95)], [Some(20), Some(90)]);
    }
}
