//! HAMi's limits of the sample's GPU processes, read from `/proc/PID/environ` once per
//! PID and kept while the PID is in the samples.
use std::{collections::HashMap, path::PathBuf};

use super::GpuSample;
use crate::metadata::hami::HamiLimits;

#[derive(Debug)]
pub struct Hami {
    /// Read HAMi's limits at all (`usage.hami_limits`).
    pub enabled: bool,
    pub proc_root: PathBuf,
    limits: rustc_hash::FxHashMap<u32, Option<HamiLimits>>,
    /// The sample's PIDs at the last read, in its order, and the limits of those that
    /// have one: the same PIDs next cycle (the usual case) need no lookup at all.
    last_pids: Vec<u32>,
    sample_limits: HashMap<u32, HamiLimits>,
}

impl Default for Hami {
    fn default() -> Self {
        Hami::new(true, PathBuf::from("/proc"))
    }
}

impl Hami {
    pub fn new(enabled: bool, proc_root: PathBuf) -> Hami {
        Hami {
            enabled,
            proc_root,
            limits: Default::default(),
            last_pids: vec![],
            sample_limits: HashMap::new(),
        }
    }

    /// How many PIDs' limits are kept.
    pub fn kept(&self) -> usize {
        self.limits.len()
    }

    /// The limits of the sample's processes that have one, by PID.
    pub fn of(&mut self, sample: &GpuSample) -> &HashMap<u32, HamiLimits> {
        let pids = sample.pids();
        if !self.enabled {
            self.sample_limits.clear();
            self.last_pids.clear();
        } else if !pids.clone().eq(self.last_pids.iter().copied()) {
            self.last_pids = pids.collect();
            // A set: with thousands of GPU processes, `retain` must not scan a list per entry.
            let set: rustc_hash::FxHashSet<u32> = self.last_pids.iter().copied().collect();
            self.limits.retain(|pid, _| set.contains(pid));
            self.sample_limits.clear();
            for pid in set {
                let root = &self.proc_root;
                let l = self
                    .limits
                    .entry(pid)
                    .or_insert_with(|| HamiLimits::of_process(root, pid));
                if let Some(l) = l {
                    self.sample_limits.insert(pid, l.clone());
                }
            }
        }
        &self.sample_limits
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{DeviceSample, ProcessSample};

    fn sample(pids: &[u32]) -> GpuSample {
        GpuSample {
            taken_at_ms: 1,
            driver_version: None,
            devices: vec![DeviceSample {
                uuid: "GPU-1".into(),
                processes: pids
                    .iter()
                    .map(|&pid| ProcessSample {
                        pid,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
        }
    }

    #[test]
    fn hami_limits_are_kept_while_the_pids_stay_and_follow_them_when_they_change() {
        let root = std::env::temp_dir().join(format!("hami-limits-{}", std::process::id()));
        let limit = |pid: u32, mib: u32| {
            let dir = root.join(pid.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            let env = format!("PATH=/bin\0CUDA_DEVICE_MEMORY_LIMIT={mib}m\0");
            std::fs::write(dir.join("environ"), env).unwrap();
        };
        let mib = |n: u64| Some(n << 20);
        limit(10, 100);
        limit(12, 300);
        let mut s = Hami::new(true, root.clone());
        let of = |s: &mut Hami, pids: &[u32]| {
            let l = s.of(&sample(pids));
            let mut v: Vec<(u32, Option<u64>)> =
                l.iter().map(|(p, l)| (*p, l.memory_all)).collect();
            v.sort();
            v
        };
        assert_eq!(of(&mut s, &[10, 11]), vec![(10, mib(100))]);
        // Read once per PID: a changed environment is not read again.
        limit(10, 200);
        assert_eq!(of(&mut s, &[10, 11]), vec![(10, mib(100))]);
        // Another set: the new PID's limits come in, the gone PID's go.
        assert_eq!(of(&mut s, &[11, 12]), vec![(12, mib(300))]);
        s.enabled = false;
        assert_eq!(of(&mut s, &[11, 12]), vec![]);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
