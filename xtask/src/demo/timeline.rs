//! How the demo node moves, tick by tick, as pure functions: what a process holds and how
//! hard it works at a given age, the hot GPU's temperature, and when evaluation jobs start,
//! finish and are gone.
use std::time::Duration;

use super::cast::Load;

/// How often the node moves (the scenario is rewritten, jobs start and finish).
pub const TICK: Duration = Duration::from_secs(2);
/// The tick the demo starts at: its resident workloads have been up for a while.
pub const FIRST_TICK: u64 = 10;
/// An evaluation job runs this many ticks...
pub const JOB_TICKS: u64 = 15;
/// ...the runtime still lists its exited container for this many...
pub const JOB_LINGER: u64 = 2;
/// ...and the next job starts this many ticks after it finished.
pub const JOB_GAP: u64 = 4;
/// The first job is this far into its run when the demo starts.
pub const FIRST_JOB_AGE: u64 = 5;

const GIB: f64 = (1u64 << 30) as f64;

/// A process's memory (bytes) and SM % at `age` ticks after it started, at tick `t`;
/// `salt` tells processes apart so that they do not wobble in step.
pub fn usage(load: &Load, age: u64, t: u64, salt: u64) -> (u64, Option<u32>) {
    let gib = (load.gib + load.grow * age as f64).min(load.max_gib);
    let sm = load
        .sm
        .map(|s| (s as i64 + jitter(t, salt, 4)).clamp(1, 100) as u32);
    ((gib * GIB) as u64, sm)
}

/// A deterministic wobble in -amp..=amp (splitmix64 of the tick and the salt).
pub fn jitter(t: u64, salt: u64, amp: i64) -> i64 {
    let mut z = t
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(salt.wrapping_mul(0xBF58_476D_1CE4_E5B9));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z % (2 * amp as u64 + 1)) as i64 - amp
}

/// The hot GPU's temperature, °C: it climbs 2 °C a tick from 58 to 88, stays there
/// (throttling) for 6 ticks, then cools 3 °C a tick, and again.
pub fn hot_temperature(t: u64) -> u32 {
    const LOW: u64 = 58;
    const HIGH: u64 = 88;
    let climb = (HIGH - LOW) / 2;
    let hold = 6;
    let cool = (HIGH - LOW) / 3;
    let phase = t % (climb + hold + cool);
    let c = if phase < climb {
        LOW + 2 * phase
    } else if phase < climb + hold {
        HIGH
    } else {
        HIGH - 3 * (phase - climb - hold)
    };
    c as u32
}

/// The temperature at which the hot GPU slows its clocks (throttle reason 0x20).
pub const THROTTLE_AT: u32 = 85;

/// What happens to the evaluation job at tick `t`, given when the current one started and
/// when the last one finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStep {
    Nothing,
    /// Its time is up: its process exits.
    Finish,
    /// The runtime and the kubelet forget the exited container.
    Remove,
    /// A new job starts.
    Start,
}

/// The job's state: `started` the tick it started (None: no job listed), `finished` the
/// tick its process exited (None: still running).
pub fn job_step(t: u64, started: Option<u64>, finished: Option<u64>) -> JobStep {
    match (started, finished) {
        (Some(s), None) if t >= s + JOB_TICKS => JobStep::Finish,
        (Some(_), Some(f)) if t >= f + JOB_LINGER => JobStep::Remove,
        (None, Some(f)) if t >= f + JOB_GAP => JobStep::Start,
        (None, None) => JobStep::Start,
        _ => JobStep::Nothing,
    }
}

#[cfg(test)]
mod t {
    use super::*;

    #[test]
    fn memory_grows_to_its_cap_and_work_wobbles_a_little() {
        let load = Load {
            gib: 4.0,
            grow: 2.0,
            max_gib: 10.0,
            sm: Some(50),
        };
        assert_eq!(usage(&load, 0, 0, 1).0, 4 << 30);
        assert_eq!(usage(&load, 2, 0, 1).0, 8 << 30);
        assert_eq!(usage(&load, 30, 0, 1).0, 10 << 30);
        let sms: Vec<u32> = (0..50).map(|t| usage(&load, 0, t, 1).1.unwrap()).collect();
        assert!(sms.iter().all(|s| (46..=54).contains(s)), "{sms:?}");
        assert!(sms.windows(2).any(|w| w[0] != w[1]), "it moves");
        let idle = Load { sm: None, ..load };
        assert_eq!(usage(&idle, 0, 3, 1).1, None, "no sample, not 0 %");
    }

    #[test]
    fn the_hot_gpu_heats_throttles_and_cools() {
        let temps: Vec<u32> = (0..40).map(hot_temperature).collect();
        assert_eq!(temps[0], 58);
        assert_eq!(*temps.iter().max().unwrap(), 88);
        assert!(temps.iter().filter(|&&c| c >= THROTTLE_AT).count() >= 6);
        assert!(
            temps.windows(2).all(|w| w[0].abs_diff(w[1]) <= 3),
            "{temps:?}"
        );
        assert!(temps[30..].contains(&58), "it comes round: {temps:?}");
    }

    #[test]
    fn a_job_runs_finishes_is_removed_and_the_next_starts() {
        let (mut started, mut finished) = (Some(0), None);
        let mut events = vec![];
        for t in 0..60 {
            let step = job_step(t, started, finished);
            match step {
                JobStep::Nothing => continue,
                JobStep::Finish => finished = Some(t),
                JobStep::Remove => started = None,
                JobStep::Start => (started, finished) = (Some(t), None),
            }
            events.push((t, step));
        }
        let end = JOB_TICKS;
        let next = end + JOB_GAP;
        assert_eq!(
            events[..4],
            [
                (end, JobStep::Finish),
                (end + JOB_LINGER, JobStep::Remove),
                (next, JobStep::Start),
                (next + JOB_TICKS, JobStep::Finish),
            ]
        );
    }
}
