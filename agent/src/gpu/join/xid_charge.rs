//! XID errors charged to containers: each XID the kernel log tied to a process (a host
//! PID) goes to that process's container, counted since the agent started. The process
//! may have died of it: a tombstone still places it for a few seconds. A container's
//! counts outlive it by `KEEP_GONE_MS`.
use std::collections::BTreeMap;

use gpu_model::{ContainerXid, GpuSample};

use crate::{metadata::Metadata, process::Resolver};

/// (container id, pod uid, device uuid, GPU uuid, xid) -> count.
type Key = (Option<String>, Option<String>, String, String, u64);

/// How long a gone container's counts are still exported. The container's processes died
/// (often of the XID itself), so its series ends with it; a scrape or export interval of up
/// to a few minutes must still see its last count, or the XID that ended it is never
/// counted anywhere.
pub const KEEP_GONE_MS: u64 = 10 * 60 * 1000;

#[derive(Debug, Default)]
pub struct XidCharges {
    counts: BTreeMap<Key, u64>,
    /// The containers with counts that are gone, and when they went (ms).
    gone: BTreeMap<String, u64>,
}

impl XidCharges {
    /// Containers whose cgroups are gone at `now_ms`: their counts go `KEEP_GONE_MS` later.
    pub fn gone(&mut self, ids: &[String], now_ms: u64) {
        for id in ids {
            let charged = (self.counts.keys()).any(|k| k.0.as_deref() == Some(id.as_str()));
            if charged {
                self.gone.entry(id.clone()).or_insert(now_ms);
            }
        }
    }

    /// Forgets the counts of containers gone `KEEP_GONE_MS` before `now_ms`.
    fn expire(&mut self, now_ms: u64) {
        let due = |t: &u64| now_ms.saturating_sub(*t) >= KEEP_GONE_MS;
        if !self.gone.values().any(due) {
            return;
        }
        let expired: Vec<String> = (self.gone.iter())
            .filter(|(_, t)| due(t))
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            self.gone.remove(id);
        }
        self.counts
            .retain(|k, _| !k.0.as_ref().is_some_and(|id| expired.contains(id)));
    }

    /// How many (container, device, XID) counts are kept.
    pub fn kept(&self) -> usize {
        self.counts.len()
    }

    /// Adds this sample's XIDs to the containers of their processes, and returns every
    /// container's totals, named from the metadata where it knows them.
    pub fn charge(
        &mut self,
        procs: &impl Resolver,
        metadata: &Metadata,
        sample: &GpuSample,
    ) -> Vec<ContainerXid> {
        self.expire(sample.taken_at_ms);
        for d in &sample.devices {
            for x in &d.fields.xid_processes {
                let Some(c) = procs.place(x.pid).and_then(|p| p.container) else {
                    tracing::info!(
                        pid = x.pid,
                        xid = x.xid,
                        uuid = d.uuid,
                        "XID of a process outside any container (or already gone)"
                    );
                    continue;
                };
                let uuid = x.mig_uuid.clone().unwrap_or_else(|| d.uuid.clone());
                let key = (
                    c.container_id.as_deref().map(str::to_string),
                    c.pod_uid.as_deref().map(str::to_string),
                    uuid,
                    d.uuid.clone(),
                    x.xid,
                );
                tracing::warn!(pid = x.pid, comm = ?x.comm, xid = x.xid, container = ?key.0, pod_uid = ?key.1, "XID charged to a container");
                *self.counts.entry(key).or_default() += 1;
            }
        }
        self.counts
            .iter()
            .map(|((container_id, pod_uid, uuid, gpu_uuid, xid), &count)| {
                let names = container_id.as_deref().and_then(|id| metadata.names_of(id));
                ContainerXid {
                    container_id: container_id.clone(),
                    pod_uid: pod_uid
                        .clone()
                        .or_else(|| names.and_then(|n| n.pod_uid.as_deref().map(str::to_string))),
                    pod_name: names.and_then(|n| n.pod_name.as_deref().map(str::to_string)),
                    namespace: names.and_then(|n| n.namespace.as_deref().map(str::to_string)),
                    container_name: names
                        .and_then(|n| n.container_name.as_deref().map(str::to_string)),
                    uuid: uuid.clone(),
                    gpu_uuid: gpu_uuid.clone(),
                    xid: *xid,
                    count,
                }
            })
            .collect()
    }
}
