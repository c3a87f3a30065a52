//! When each GPU reads its slow readings: everything the device says of itself, rather than
//! of its processes. Some cost milliseconds of CPU per call on a real driver (H100, driver
//! 580, docs/validation: energy 3-6 ms, GPM 1.6 ms, PCIe replays 0.2-0.4 ms, MIG mode 0.3
//! ms, against 1.7 ms for a busy GPU's per-process utilization); the rest (utilization,
//! power, temperature, clocks, ECC, throttle reasons, encoder and decoder, remapped rows,
//! NVLink, memory temperature, vGPU licence, accounting mode) cost 17 µs each, 0.3 ms a GPU
//! together, a sixth of what a busy GPU's cycle must read. The two costly counters, energy
//! and PCIe replays, are read together. None of them is needed to charge
//! a container: that takes the GPU's memory, its processes and their utilization, read every
//! cycle. So they are read every `nvml.slow_interval_ms` and held in between: a counter's
//! rate and GPM's averages then span the interval, and the energy split charges each read's
//! increase by the mean of the shares of the cycles since the last read
//! (`billing::ledger::EnergyShares`).
//!
//! Read on one cycle for every GPU, they would make that cycle three times the others on an
//! 8-GPU node. So each GPU reads them at its own point of the interval (GPU i of n at i+1
//! n-ths), and out of turn on the cycle after an XID on it, which moves its health
//! readings; GPM every `nvml.gpm_interval_ms` (30 s), on the first of the GPU's slow cycles
//! when due; and the energy and PCIe replay counters, the costliest call and a counter,
//! every `nvml.energy_interval_ms` (60 s: every 10 s energy would cost 4 ms a cycle on 8
//! GPUs, the largest single cost of a cycle) on
//! a cycle where no GPU reads the others, unless it is a slow interval late. The energy split
//! spreads each increase over the cycles since the last read, so a container's energy is as
//! complete, only known later.
use std::time::{Duration, Instant};

/// What one GPU reads afresh this cycle, rather than hold what it read last.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Due {
    /// The device's own readings, PCIe replays and MIG mode.
    pub slow: bool,
    /// GPM profiling: only with `slow`.
    pub gpm: bool,
    pub energy: bool,
}

impl Due {
    pub(super) const ALL: Due = Due {
        slow: true,
        gpm: true,
        energy: true,
    };
}

/// The schedule of every GPU's slow readings.
pub(super) struct Slow {
    interval: Duration,
    gpm_interval: Duration,
    energy_interval: Duration,
    /// Per GPU index.
    gpus: Vec<GpuSlow>,
}

#[derive(Debug, Clone, Copy)]
struct GpuSlow {
    /// Cycles that read everything since NVML was initialised: the first two do, so that
    /// rates (GPM, the energy split) are known from the second cycle on.
    reads: u32,
    next: Instant,
    gpm_next: Instant,
    energy_next: Instant,
    /// The slow readings are due next cycle whatever `next` says (an XID).
    soon: bool,
}

impl Slow {
    pub(super) fn new(
        interval: Duration,
        gpm_interval: Duration,
        energy_interval: Duration,
    ) -> Slow {
        Slow {
            interval,
            gpm_interval,
            energy_interval,
            gpus: vec![],
        }
    }

    /// What each of `count` GPUs reads afresh this cycle (and records that it does).
    pub(super) fn due(&mut self, now: Instant, count: usize) -> Vec<Due> {
        let (interval, gpm_interval) = (self.interval, self.gpm_interval);
        let energy_interval = self.energy_interval;
        // An energy interval no longer than the slow one reads it when due, as they are.
        let own_cycle = energy_interval > interval;
        let first = GpuSlow {
            reads: 0,
            next: now,
            gpm_next: now,
            energy_next: now,
            soon: false,
        };
        self.gpus.resize(count, first);
        let n = count.max(1) as u32;
        let mut due = vec![Due::default(); count];
        for (i, (g, d)) in self.gpus.iter_mut().zip(&mut due).enumerate() {
            if g.reads < 2 {
                g.reads += 1;
                *d = Due::ALL;
                // GPU i of n next at i+1 n-ths of each interval.
                let k = i as u32 + 1;
                g.next = now + interval * k / n;
                g.gpm_next = now + gpm_interval * k / n;
                g.energy_next = now + energy_interval * k / n;
            } else if std::mem::take(&mut g.soon) && now < g.next {
                // Out of turn: the GPU keeps its point of the interval.
                d.slow = true;
            } else if now >= g.next {
                d.slow = true;
                g.next = step(g.next, interval, now);
                // On this slow cycle if due since the last: a GPM interval no longer than
                // the slow one reads it on every slow cycle.
                if now >= g.gpm_next {
                    d.gpm = true;
                    g.gpm_next = step(g.gpm_next, gpm_interval, now);
                }
            }
        }
        let mut busy = due.iter().any(|d| d.slow);
        for (g, d) in self.gpus.iter_mut().zip(&mut due) {
            let late = now >= g.energy_next + interval;
            if d.energy || now < g.energy_next || (own_cycle && busy && !late) {
                continue;
            }
            d.energy = true;
            busy = true;
            g.energy_next = step(g.energy_next, energy_interval, now);
        }
        due
    }

    /// GPU `index` reads its slow readings next cycle, out of turn (GPM and energy keep their
    /// own schedules).
    pub(super) fn soon(&mut self, index: usize) {
        if let Some(g) = self.gpus.get_mut(index) {
            g.soon = true;
        }
    }

    /// NVML restarted: every GPU reads everything at once.
    pub(super) fn forget(&mut self) {
        self.gpus.clear();
    }
}

/// The next due time after `at`, keeping its phase; a full interval on if that has passed
/// (the cycles stopped for a while).
fn step(at: Instant, interval: Duration, now: Instant) -> Instant {
    let next = at + interval;
    if next <= now {
        now + interval
    } else {
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per cycle: (GPUs reading the slow readings, GPUs reading energy).
    type Cycle = (Vec<usize>, Vec<usize>);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    /// Cycles of 1 s over `secs` seconds for `n` GPUs.
    fn run(s: &mut Slow, n: usize, secs: u64) -> Vec<Cycle> {
        let t0 = Instant::now();
        (0..secs)
            .map(|k| {
                let due = s.due(t0 + Duration::from_secs(k), n);
                let which = |f: fn(&Due) -> bool| -> Vec<usize> {
                    (0..n).filter(|&i| f(&due[i])).collect()
                };
                (which(|d| d.slow), which(|d| d.energy))
            })
            .collect()
    }

    #[test]
    fn every_gpu_reads_its_slow_readings_every_interval_one_gpu_a_cycle() {
        let mut s = Slow::new(secs(10), secs(30), secs(60));
        let cycles = run(&mut s, 8, 200);
        assert_eq!(
            cycles[0],
            ((0..8).collect(), (0..8).collect()),
            "all at first"
        );
        assert_eq!(cycles[1], cycles[0], "and at the second cycle");
        for (k, (slow, energy)) in cycles.iter().enumerate().skip(2) {
            assert!(
                slow.len() + energy.len() <= 1,
                "cycle {k}: {slow:?} {energy:?}"
            );
        }
        for gpu in 0..8 {
            let at = |f: fn(&Cycle) -> &Vec<usize>| -> Vec<usize> {
                (2..cycles.len())
                    .filter(|&k| f(&cycles[k]).contains(&gpu))
                    .collect()
            };
            let (slow, energy) = (at(|c| &c.0), at(|c| &c.1));
            assert!(slow[0] <= 11, "GPU {gpu} first at {}", slow[0]);
            assert!(
                slow.windows(2).all(|w| w[1] - w[0] <= 10),
                "GPU {gpu}: {slow:?}"
            );
            assert!(energy[0] <= 71, "GPU {gpu}'s energy first at {}", energy[0]);
            assert!(
                energy
                    .windows(2)
                    .all(|w| (59..=70).contains(&(w[1] - w[0]))),
                "GPU {gpu}'s energy: {energy:?}"
            );
        }
    }

    #[test]
    fn energy_waits_for_a_free_cycle_at_most_an_interval() {
        // 16 GPUs at 10 s: every cycle has a GPU's slow readings.
        let mut s = Slow::new(secs(10), secs(30), secs(60));
        let cycles = run(&mut s, 16, 150);
        for gpu in 0..16 {
            let energy: Vec<usize> = (2..cycles.len())
                .filter(|&k| cycles[k].1.contains(&gpu))
                .collect();
            assert!(
                !energy.is_empty() && energy[0] <= 71,
                "GPU {gpu}: {energy:?}"
            );
        }
    }

    #[test]
    fn an_energy_interval_as_short_as_the_slow_one_reads_it_when_due() {
        let mut s = Slow::new(ms(200), ms(200), ms(200));
        let t0 = Instant::now();
        for k in 0..20 {
            let due = s.due(t0 + ms(200 * k), 2);
            assert!(due.iter().all(|d| *d == Due::ALL), "cycle {k}: {due:?}");
        }
    }

    #[test]
    fn gpm_is_read_on_a_slow_cycle_every_gpm_interval() {
        let mut s = Slow::new(secs(10), secs(30), secs(60));
        let t0 = Instant::now();
        let cycles: Vec<Vec<Due>> = (0..200).map(|k| s.due(t0 + secs(k), 8)).collect();
        for gpu in 0..8 {
            let gpm: Vec<usize> = (2..cycles.len()).filter(|&k| cycles[k][gpu].gpm).collect();
            assert!(
                gpm.iter().all(|&k| cycles[k][gpu].slow),
                "GPU {gpu}: GPM only with the slow readings"
            );
            assert!(gpm[0] <= 41, "GPU {gpu}'s GPM first at {}", gpm[0]);
            assert!(
                gpm.windows(2).all(|w| (30..=40).contains(&(w[1] - w[0]))),
                "GPU {gpu}'s GPM: {gpm:?}"
            );
        }
    }

    #[test]
    fn an_xid_brings_a_gpus_slow_readings_to_the_next_cycle_out_of_turn() {
        let mut s = Slow::new(secs(10), secs(30), secs(60));
        let t0 = Instant::now();
        let slow_at = |s: &mut Slow, k: u64| -> Vec<usize> {
            let due = s.due(t0 + secs(k), 4);
            (0..4).filter(|&i| due[i].slow).collect()
        };
        let before: Vec<Vec<usize>> = (0..25).map(|k| slow_at(&mut s, k)).collect();
        let mut t = Slow::new(secs(10), secs(30), secs(60));
        for k in 0..13 {
            assert_eq!(slow_at(&mut t, k), before[k as usize], "cycle {k}");
        }
        t.soon(1);
        let mut after = before[13].clone();
        if !after.contains(&1) {
            after.push(1);
            after.sort();
        }
        assert_eq!(slow_at(&mut t, 13), after, "GPU 1 out of turn");
        for k in 14..25 {
            assert_eq!(
                slow_at(&mut t, k),
                before[k as usize],
                "cycle {k}: its turn kept"
            );
        }
    }

    #[test]
    fn a_new_gpu_and_a_restart_read_everything_at_once() {
        let mut s = Slow::new(secs(10), secs(30), secs(60));
        let t0 = Instant::now();
        s.due(t0, 2);
        s.due(t0 + secs(1), 2);
        let d = s.due(t0 + secs(2), 3);
        assert_eq!(d[2], Due::ALL, "GPU 2 is new");
        s.forget();
        let d = s.due(t0 + secs(3), 3);
        assert!(d.iter().all(|d| *d == Due::ALL));
    }
}
