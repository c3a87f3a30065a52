//! GPU processes the kernel reported exited, on GPUs in NVML's accounting mode: their
//! accounting stats are read on the NVML thread and charged on a later cycle to the owner
//! they had when they exited.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use gpu_model::{ContainerUsage, GpuSample};

use super::{account::Accounted, ledger::RecordNames};
use crate::{
    gpu::{
        join::{
            naming::name,
            owner::{is_mps_server, owner_of, Owner},
        },
        nvml::sampler::AccountingRequests,
    },
    metadata::Metadata,
    process::Resolver,
};

/// A PID NVML listed that the cache cannot place is forgotten after this long.
const UNPLACED_FOR: Duration = Duration::from_secs(30);
/// Exits waiting for their accounting stats are forgotten after this long.
const AWAIT_FOR: Duration = Duration::from_secs(60);
/// At most this many PIDs are watched for their exit.
const MAX_WATCHED: usize = 16_384;

#[derive(Debug, Default)]
pub struct Exits {
    /// Where exits go to have their accounting stats read (None: accounting is off).
    requests: Option<AccountingRequests>,
    /// (GPU uuid, pid) NVML listed on a GPU in accounting mode, until the kernel says it
    /// exited: since when.
    watched: HashMap<(String, u32), Instant>,
    /// Exited, stats requested: whom to charge.
    awaiting: HashMap<(String, u32), (Owner, RecordNames, Instant)>,
}

impl Exits {
    pub fn new(requests: Option<AccountingRequests>) -> Exits {
        Exits {
            requests,
            ..Default::default()
        }
    }

    /// How many PIDs are watched, and how many exits await their stats.
    pub fn lengths(&self) -> (usize, usize) {
        (self.watched.len(), self.awaiting.len())
    }

    /// The accounting stats the NVML thread read for the exits handed to it, with whom
    /// to charge.
    pub fn accounted(&mut self, sample: &GpuSample) -> Vec<Accounted> {
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
        accounted
    }

    /// Watches the PIDs NVML listed on GPUs in accounting mode; those the kernel reported
    /// exited (a tombstone in the cache) are handed to the NVML thread.
    pub fn watch(&mut self, sample: &GpuSample, procs: &impl Resolver, metadata: &Metadata) {
        let Some(requests) = &self.requests else {
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
}
