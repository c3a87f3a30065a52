//! A stretch of use's profile: how its SM utilization and its memory were distributed over
//! its samples, in fixed histograms (the same size however long the stretch runs), read
//! back as the percentiles of its usage record.

/// SM utilization: one bucket per percent, 0 to 100.
const SM_BUCKETS: usize = 101;

/// Memory, log-linear: exact below 4 MiB (bucket 0 is under 1 MiB), then four buckets per
/// doubling, each at most 1/4 of its lower bound wide, up to 2 TiB.
const MEMORY_BUCKETS: usize = 4 + 19 * 4;

/// Where a sample's SM figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmSource {
    /// NVML's per-process utilization, summed over the container's processes.
    Process,
    /// GPM's SM activity of a device (GPU or MIG instance) the container had to itself.
    Gpm,
}

/// Counts per bucket, a byte each: a profile is 200 bytes, held for every open stretch (2,000
/// on a large node). A full bucket halves them all, which keeps the quantiles (ratios) to
/// within a count in 256; the largest SM figure is kept apart, since halving can empty the
/// bucket of a rare one.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    sm: [u8; SM_BUCKETS],
    memory: [u8; MEMORY_BUCKETS],
    sm_max: Option<u8>,
    /// Whether an SM sample came from process utilization, from GPM.
    sources: [bool; 2],
}

impl Default for Profile {
    fn default() -> Self {
        Profile {
            sm: [0; SM_BUCKETS],
            memory: [0; MEMORY_BUCKETS],
            sm_max: None,
            sources: [false; 2],
        }
    }
}

/// The memory bucket of `bytes`.
fn memory_bucket(bytes: u64) -> usize {
    let mib = bytes >> 20;
    if mib < 4 {
        return mib as usize;
    }
    let e = 63 - mib.leading_zeros() as usize;
    let sub = (mib >> (e - 2)) as usize - 4;
    (4 + (e - 2) * 4 + sub).min(MEMORY_BUCKETS - 1)
}

/// The largest value bucket `i` holds (its upper bound), bytes.
fn memory_upper(i: usize) -> u64 {
    if i < 4 {
        return ((i as u64 + 1) << 20) - 1;
    }
    let (e, sub) = (2 + (i - 4) / 4, (i - 4) % 4);
    (((4 + sub as u64 + 1) << (e - 2)) << 20) - 1
}

/// The bucket holding the `q` quantile: the first whose running count reaches q of all.
fn quantile(counts: &[u8], q: f64) -> Option<usize> {
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

fn bump(counts: &mut [u8], i: usize) {
    if counts[i] == u8::MAX {
        counts.iter_mut().for_each(|c| *c /= 2);
    }
    counts[i] += 1;
}

impl Profile {
    /// One sample: the SM utilization (percent, where known, and whence) and the memory
    /// held.
    pub fn add(&mut self, sm: Option<(u32, SmSource)>, memory_bytes: u64) {
        if let Some((pct, source)) = sm {
            let pct = pct.min(100) as u8;
            bump(&mut self.sm, pct as usize);
            self.sm_max = self.sm_max.max(Some(pct));
            self.sources[source as usize] = true;
        }
        bump(&mut self.memory, memory_bucket(memory_bytes));
    }

    /// The SM utilization's `q` quantile, percent; None without an SM sample.
    pub fn sm(&self, q: f64) -> Option<u32> {
        quantile(&self.sm, q).map(|i| i as u32)
    }

    /// The largest SM utilization, percent.
    pub fn sm_max(&self) -> Option<u32> {
        self.sm_max.map(u32::from)
    }

    /// The memory's `q` quantile: the upper bound of its bucket (within 1/4 above the
    /// truth), never above `peak`.
    pub fn memory(&self, q: f64, peak: u64) -> u64 {
        quantile(&self.memory, q).map_or(0, |i| memory_upper(i).min(peak))
    }

    /// `process_utilization`, `gpm` or `mixed`; None without an SM sample.
    pub fn sm_source(&self) -> Option<&'static str> {
        match self.sources {
            [false, false] => None,
            [true, false] => Some("process_utilization"),
            [false, true] => Some("gpm"),
            [true, true] => Some("mixed"),
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
        assert_eq!((p.sm_max(), p.sm_source()), (Some(100), Some("mixed")));
        p.add(None, 0);
        assert_eq!(
            p.sm.iter().map(|&c| c as u32).sum::<u32>(),
            101,
            "memory only"
        );
    }

    #[test]
    fn memory_buckets_cover_every_size_within_a_quarter() {
        for bytes in [
            0,
            MIB - 1,
            MIB,
            3 * MIB,
            4 * MIB,
            7 * MIB,
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
                upper - lower < lower / 4 + MIB,
                "{bytes}: bucket {i} too wide"
            );
        }
        assert_eq!(memory_bucket(u64::MAX), MEMORY_BUCKETS - 1);
    }

    #[test]
    fn memory_p95_is_within_a_quarter_and_never_above_the_peak() {
        let mut p = Profile::default();
        for i in 0..100u64 {
            p.add(None, if i < 96 { 6 << 30 } else { 7 << 30 });
        }
        let p95 = p.memory(0.95, 7 << 30);
        assert!((6 << 30..(6 << 30) + (6 << 30) / 4).contains(&p95), "{p95}");
        assert_eq!(p.memory(1.0, 7 << 30), 7 << 30, "capped at the peak");
        assert_eq!(Profile::default().memory(0.95, 0), 0);
    }

    #[test]
    fn a_full_bucket_halves_them_all_and_the_quantiles_and_the_largest_hold() {
        let mut p = Profile::default();
        // An hour of 1 s samples: a quarter at 90 %, the rest at 20 %, one at 99 %.
        for i in 0..3600u32 {
            let pct = match i {
                7 => 99,
                i if i % 4 == 0 => 90,
                _ => 20,
            };
            p.add(Some((pct, SmSource::Process)), 0);
        }
        assert!(p.sm[20] > 127 && p.sm[90] > 40, "{} {}", p.sm[20], p.sm[90]);
        assert_eq!(p.sm[99], 0, "halved away");
        let got = [p.sm(0.5), p.sm(0.95), p.sm_max()];
        assert_eq!(got, [Some(20), Some(90), Some(99)]);
    }
}
