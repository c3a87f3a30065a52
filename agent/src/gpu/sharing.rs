//! The join owner's side of sharing and billing, across cycles: HAMi limits of GPU
//! processes (read once per PID), GPU processes the kernel reported exited (their NVML
//! accounting stats are read on the NVML thread and charged on a later cycle to the owner
//! they had when they exited), and the usage records sent to the usage sink.
use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{atomic::Ordering::Relaxed, Arc},
    time::{Duration, Instant},
};

use gpu_model::{ContainerUsage, UsageRecord};
use otel::usage::UsageCounters;

use super::{
    account::Accounted,
    ledger::RecordNames,
    naming::name,
    owner::{is_mps_server, owner_of, Owner},
    sampler::AccountingRequests,
    GpuSample,
};
use crate::{
    config::UsageConfig,
    metadata::{hami::HamiLimits, Metadata},
    process::Resolver,
};

/// A PID NVML listed that the cache cannot place is forgotten after this long.
const UNPLACED_FOR: Duration = Duration::from_secs(30);
/// Exits waiting for their accounting stats are forgotten after this long.
const AWAIT_FOR: Duration = Duration::from_secs(60);
/// At most this many PIDs are watched for their exit.
const MAX_WATCHED: usize = 16_384;

#[derive(Debug)]
pub struct Sharing {
    /// Where usage records go (None: records are off).
    pub records: Option<tokio::sync::mpsc::Sender<UsageRecord>>,
    pub counters: Arc<UsageCounters>,
    /// Where exits go to have their accounting stats read (None: accounting is off).
    pub accounting: Option<AccountingRequests>,
    /// Read HAMi's limits from GPU processes' environments.
    pub hami: bool,
    pub proc_root: PathBuf,
    /// The window of the peak-memory gauge.
    pub peak_window_ms: u64,
    /// `usage.max_record_secs`, ms.
    pub max_record_ms: u64,
    limits: rustc_hash::FxHashMap<u32, Option<HamiLimits>>,
    /// The sample's PIDs at the last `before`, in its order, and the limits of those that
    /// have one: the same PIDs next cycle (the usual case) need no lookup at all.
    last_pids: Vec<u32>,
    sample_limits: HashMap<u32, HamiLimits>,
    /// (GPU uuid, pid) NVML listed on a GPU in accounting mode, until the kernel says it
    /// exited: since when.
    watched: HashMap<(String, u32), Instant>,
    /// Exited, stats requested: whom to charge.
    awaiting: HashMap<(String, u32), (Owner, RecordNames, Instant)>,
}

impl Default for Sharing {
    fn default() -> Self {
        Sharing {
            records: None,
            counters: Arc::default(),
            accounting: None,
            hami: true,
            proc_root: PathBuf::from("/proc"),
            peak_window_ms: 60_000,
            max_record_ms: 3_600_000,
            limits: Default::default(),
            last_pids: vec![],
            sample_limits: HashMap::new(),
            watched: HashMap::new(),
            awaiting: HashMap::new(),
        }
    }
}

impl Sharing {
    /// Set up from `[usage]`: where records go (None: nowhere), and the request queue the
    /// NVML thread reads accounting requests from (None: accounting off).
    pub fn configure(
        &mut self,
        usage: &UsageConfig,
        proc_root: &std::path::Path,
        records: Option<tokio::sync::mpsc::Sender<UsageRecord>>,
        counters: Arc<UsageCounters>,
    ) -> Option<AccountingRequests> {
        self.records = records.filter(|_| usage.records);
        self.counters = counters;
        self.hami = usage.hami_limits;
        self.proc_root = proc_root.to_path_buf();
        self.peak_window_ms = usage.peak_window_secs * 1000;
        self.max_record_ms = usage.max_record_secs * 1000;
        self.accounting = usage.accounting.then(AccountingRequests::default);
        self.accounting.clone()
    }

    /// Before the join: the HAMi limits of the sample's processes (a PID's environment is
    /// read once), and the accounting stats the NVML thread read, with whom to charge.
    pub fn before(&mut self, sample: &GpuSample) -> (&HashMap<u32, HamiLimits>, Vec<Accounted>) {
        let pids = sample.pids();
        if !self.hami {
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
        let mut accounted = vec![];
        for d in &sample.devices {
            for a in &d.sharing.accounting {
                if let Some((owner, names, _)) = self.awaiting.remove(&(d.uuid.clone(), a.pid)) {
                    accounted.push(Accounted {
                        owner,
                        names,
                        uuid: d.uuid.clone(),
                        sample: a.clone(),
                    });
                }
            }
        }
        self.awaiting.retain(|_, (_, _, t)| t.elapsed() < AWAIT_FOR);
        (&self.sample_limits, accounted)
    }

    /// After the join: watches the PIDs NVML listed on GPUs in accounting mode; those the
    /// kernel reported exited (a tombstone in the cache) are handed to the NVML thread.
    pub fn after(&mut self, sample: &GpuSample, procs: &impl Resolver, metadata: &Metadata) {
        let Some(requests) = &self.accounting else {
            return;
        };
        let now = Instant::now();
        for d in sample
            .devices
            .iter()
            .filter(|d| d.sharing.accounting_mode == Some(true))
        {
            let listed = d.processes.iter().map(|p| p.pid);
            for pid in listed.chain(d.sharing.accounting_pids.iter().copied()) {
                if self.watched.len() < MAX_WATCHED {
                    self.watched.entry((d.uuid.clone(), pid)).or_insert(now);
                }
            }
        }
        let mut exited = vec![];
        self.watched
            .retain(|(uuid, pid), since| match procs.place(*pid) {
                Some(pl) if !pl.live => {
                    if !is_mps_server(pl.comm) {
                        exited.push((uuid.clone(), *pid, owner_of(Some(pl))));
                    }
                    false
                }
                Some(_) => true,
                None => now.duration_since(*since) < UNPLACED_FOR,
            });
        for (uuid, pid, (owner, meta)) in exited {
            let mut c = ContainerUsage {
                container_id: meta.as_ref().and_then(|m| m.container_id.clone()),
                pod_uid: meta.as_ref().and_then(|m| m.pod_uid.clone()),
                ..Default::default()
            };
            name(&mut c, metadata);
            let names = RecordNames::of(&c);
            requests.push(uuid.clone(), pid);
            self.awaiting.insert((uuid, pid), (owner, names, now));
        }
    }

    /// Hands records to the usage sink; a full or closed channel loses them, counted.
    pub fn emit(&self, records: Vec<UsageRecord>) {
        let Some(tx) = &self.records else {
            return;
        };
        for r in records {
            self.counters.emitted.fetch_add(1, Relaxed);
            if tx.try_send(r).is_err() {
                self.counters.dropped.fetch_add(1, Relaxed);
            }
        }
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
        let mut s = Sharing {
            proc_root: root.clone(),
            ..Default::default()
        };
        let of = |s: &mut Sharing, pids: &[u32]| {
            let (l, _) = s.before(&sample(pids));
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
        s.hami = false;
        assert_eq!(of(&mut s, &[11, 12]), vec![]);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
