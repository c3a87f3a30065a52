//! The lists of a snapshot nobody holds any more, kept for the next join to fill again.
//! Each cycle made a list of devices, of PIDs and of accounts per container and freed the
//! last cycle's: on the large node 6,000 mallocs and as many frees a cycle, each free a
//! cache miss in memory gone cold since the last cycle, and the frees of the large lists
//! made malloc consolidate its free chunks (docs/benchmarks.md, "Kept").
use gpu_model::{ContainerGpu, ContainerUsage, GpuAccount, Snapshot};

/// A list is kept only while it has room for this many at most: one that grew for a
/// container of many devices, processes or accounts is freed, not handed to every
/// container after it.
const KEEP: usize = 8;

/// How many containers ahead a recycling asks for the lists it will read.
const AHEAD: usize = 4;

#[derive(Debug, Default)]
pub struct Spare {
    containers: Vec<ContainerUsage>,
    gpus: Vec<Vec<ContainerGpu>>,
    pids: Vec<Vec<u32>>,
    accounts: Vec<Vec<GpuAccount>>,
}

/// A kept list, and memory asked for the one that the next call hands out: the first write
/// into a kept list waited on a miss (in the large node's agent, the grouping's first
/// write to each container's devices), as the lists were last written a cycle ago.
fn take<T>(kept: &mut Vec<Vec<T>>) -> Vec<T> {
    let v = kept.pop().unwrap_or_default();
    if let Some(next) = kept.last() {
        gpu_model::prefetch(next.as_ptr());
    }
    v
}

fn worth_keeping(capacity: usize) -> bool {
    (1..=KEEP).contains(&capacity)
}

impl Spare {
    /// Takes a snapshot apart for its lists (what is left of the one before is freed): the
    /// lists are kept empty, the containers' entries are kept with their names, for the
    /// join to fill again in place (a name it gives the same entry again is neither cloned
    /// nor let go). At most one snapshot's lists and entries are kept.
    pub fn recycle(&mut self, mut snap: Snapshot) {
        self.gpus.clear();
        self.pids.clear();
        self.accounts.clear();
        let mut containers = std::mem::take(&mut snap.containers);
        for i in 0..containers.len() {
            // Its lists are each a cache miss otherwise, one after another.
            if let Some(next) = containers.get(i + AHEAD) {
                gpu_model::prefetch(next.gpus.as_ptr());
                gpu_model::prefetch(next.accounts.as_ptr());
            }
            let c = &mut containers[i];
            let (gpus, accounts) = (std::mem::take(&mut c.gpus), std::mem::take(&mut c.accounts));
            self.keep(gpus, accounts);
        }
        self.containers = containers;
    }

    fn keep(&mut self, mut gpus: Vec<ContainerGpu>, mut accounts: Vec<GpuAccount>) {
        for g in gpus.drain(..) {
            let mut pids = g.pids;
            pids.clear();
            if worth_keeping(pids.capacity()) {
                self.pids.push(pids);
            }
        }
        if worth_keeping(gpus.capacity()) {
            self.gpus.push(gpus);
        }
        accounts.clear();
        if worth_keeping(accounts.capacity()) {
            self.accounts.push(accounts);
        }
    }

    /// An empty list of a container's devices.
    pub fn gpus(&mut self) -> Vec<ContainerGpu> {
        take(&mut self.gpus)
    }

    /// An empty list of PIDs.
    pub fn pids(&mut self) -> Vec<u32> {
        take(&mut self.pids)
    }

    /// An empty list of accounts with room for `n`.
    pub fn accounts(&mut self, n: usize) -> Vec<GpuAccount> {
        let mut v = take(&mut self.accounts);
        v.reserve_exact(n);
        v
    }

    /// The first `n` of the recycled snapshot's entries (names kept, lists empty), with
    /// room for `n`.
    pub fn containers(&mut self, n: usize) -> Vec<ContainerUsage> {
        let mut v = std::mem::take(&mut self.containers);
        v.truncate(n);
        v.reserve(n - v.len());
        v
    }

    /// How many lists are kept.
    #[cfg(test)]
    pub fn kept(&self) -> usize {
        usize::from(self.containers.capacity() > 0)
            + self.gpus.len()
            + self.pids.len()
            + self.accounts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_model::Name;

    fn container(n: &Name, devices: usize, pids: usize, accounts: usize) -> ContainerUsage {
        ContainerUsage {
            container_id: Some("c".into()),
            gpus: (0..devices)
                .map(|_| ContainerGpu {
                    uuid: n.clone(),
                    gpu_uuid: n.clone(),
                    memory_used_bytes: 0,
                    sm_util: None,
                    mem_util: None,
                    enc_util: None,
                    dec_util: None,
                    pids: (0..pids as u32).collect(),
                    gpu_time_seconds: None,
                    memory_byte_seconds: 0.0,
                    counters_since_ms: 0,
                })
                .collect(),
            accounts: (0..accounts)
                .map(|_| GpuAccount {
                    uuid: n.clone(),
                    gpu_uuid: n.clone(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_recycled_snapshot_gives_its_lists_back_empty_keeps_its_entries_and_no_large_list() {
        let name: Name = "GPU-1".into();
        let mut spare = Spare::default();
        let snap = |containers| Snapshot {
            containers,
            ..Default::default()
        };
        spare.recycle(snap(vec![
            container(&name, 1, 1, 1),
            container(&name, 2, 3, 0),
            container(&name, KEEP + 1, KEEP + 1, KEEP + 1),
        ]));
        // The names held by the lists are let go.
        let held = |n: &Name| std::sync::Arc::strong_count(n);
        assert_eq!(held(&name), 1);
        // 1 + 2 device lists, pids 1 + 2 (the large ones freed); 1 account list (an empty
        // list has no room to keep).
        assert_eq!(
            (spare.gpus.len(), spare.pids.len(), spare.accounts.len()),
            (2, 3, 1)
        );
        let mut kept = vec![];
        while let Some(v) = spare.gpus.pop() {
            assert!(v.is_empty() && v.capacity() > 0 && v.capacity() <= KEEP);
            kept.push(v);
        }
        let p = spare.pids();
        assert!(p.is_empty() && p.capacity() > 0);
        let a = spare.accounts(3);
        assert!(a.is_empty() && a.capacity() >= 3);
        // Empty pools hand out new lists.
        assert_eq!(spare.gpus().capacity(), 0);
        // The entries stay, names and all, their lists taken out.
        let c = spare.containers(5);
        assert_eq!(c.len(), 3);
        assert!(c.capacity() >= 5);
        for e in &c {
            assert_eq!(e.container_id.as_deref(), Some("c"));
            assert!(e.gpus.is_empty() && e.accounts.is_empty());
            assert_eq!((e.gpus.capacity(), e.accounts.capacity()), (0, 0));
        }
        // A second snapshot replaces what is left of the first.
        spare.recycle(snap(vec![container(&name, 1, 1, 1)]));
        assert_eq!(
            (spare.gpus.len(), spare.pids.len(), spare.accounts.len()),
            (1, 1, 1)
        );
    }
}
