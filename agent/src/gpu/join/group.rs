//! A sample's GPU processes grouped by owner: each process placed in the process state,
//! its owner's ledger slot found (hinted from the cycle before), its use added to its
//! owner's devices, and the groups put in their owners' order.
use gpu_model::{
    ContainerGpu, ContainerUsage, GpuAccount, GpuSample, Name, ProcessSample, ProcessUsage,
};

use super::{
    counters::{Counters, Order},
    ledger::{Accumulated, Ledgers, Slot},
    owner::{is_mps_server, owner, owner_name, same, set_name, DeviceNames, Owner, OwnerKey},
    spare::Spare,
};
use crate::process::{cgroup::ContainerRef, Placement, Resolver};

pub(super) struct Group<'a> {
    pub(super) owner: Owner,
    /// Where the owner's ledgers are.
    pub(super) slot: Slot,
    /// `order_key` of the owner, read once: the sort compared the owners' ids, each a
    /// cache miss, about 11 times per group.
    order: (u8, u128),
    /// Borrowed from the process state: the names are cloned only into a snapshot entry
    /// that does not hold them already (`fill_entry`).
    pub(super) meta: Option<MetaRef<'a>>,
    /// A few devices per owner: a scan, not a map.
    pub(super) gpus: Vec<ContainerGpu>,
}

fn add_util(a: Option<u32>, b: Option<u32>) -> Option<u32> {
    match (a, b) {
        (None, None) => None,
        (x, y) => Some((x.unwrap_or(0) + y.unwrap_or(0)).min(100)),
    }
}

/// How many processes ahead the grouping asks for what it will read (`prefetch_ahead`).
pub(super) const AHEAD: usize = 8;

/// What grouping process `k + AHEAD` will read (its cgroup's container reference and
/// path) and, from the reference asked for then, what `k + AHEAD / 2` will read (the
/// names whose counts the grouping bumps): each a miss otherwise, one after another.
fn prefetch_ahead(placed: &[Option<Placement<'_>>], k: usize) {
    use gpu_model::prefetch;
    if let Some(Some(pl)) = placed.get(k + AHEAD) {
        if let Some(c) = pl.container {
            prefetch(c);
        }
        if let Some(p) = pl.cgroup_path {
            prefetch(p);
        }
    }
    if let Some(Some(pl)) = placed.get(k + AHEAD / 2) {
        let names = pl.container.map(|c| [&c.container_id, &c.pod_uid]);
        let path = pl.cgroup_path.map(std::sync::Arc::as_ptr);
        for n in names.into_iter().flatten().flatten() {
            prefetch(std::sync::Arc::as_ptr(n));
        }
        if let Some(p) = path {
            prefetch(p);
        }
    }
}

/// What a placed process's cgroup says about its owner, borrowed from the process state.
#[derive(Debug, Clone, Copy)]
pub(super) struct MetaRef<'a> {
    container: &'a ContainerRef,
    cgroup_path: Option<&'a Name>,
}

fn meta_ref(pl: Placement<'_>) -> Option<MetaRef<'_>> {
    pl.container.map(|container| MetaRef {
        container,
        cgroup_path: pl.cgroup_path,
    })
}

/// Makes `c` the entry of an owner whose cgroup says `meta` (None: the host), with devices
/// `gpus`, whatever entry it was before: as `ContainerUsage { .., gpus, ..Default }` would
/// be, with the names it holds already kept. Its lists were taken out when it was recycled.
/// The names and allocations the runtime and the kubelet give are left as they are:
/// `Naming::name_all`, which runs next, sets every one of them (the same names, mostly,
/// and then nothing is touched; cleared here and cloned there, seven reference counts in
/// memory cold since the last cycle were a fifth of the large node's join).
pub(super) fn fill_entry(
    c: &mut ContainerUsage,
    meta: Option<MetaRef<'_>>,
    gpus: Vec<ContainerGpu>,
    accounts_list: Vec<GpuAccount>,
) {
    // Every field named: one added to the entry must be filled here or by the naming.
    let ContainerUsage {
        container_id,
        pod_uid,
        qos,
        runtime,
        cgroup_path,
        pod_name: _,
        namespace: _,
        container_name: _,
        gpus: old_gpus,
        allocated_gpus: _,
        allocated_device_ids: _,
        claims: _,
        accounts,
        workload: _,
    } = c;
    let r = meta.map(|m| m.container);
    set_name(container_id, r.and_then(|r| r.container_id.as_ref()));
    set_name(pod_uid, r.and_then(|r| r.pod_uid.as_ref()));
    set_name(cgroup_path, meta.and_then(|m| m.cgroup_path));
    *qos = r.and_then(|r| r.qos).map(|q| q.as_str());
    *runtime = r.and_then(|r| r.runtime).map(|r| r.as_str());
    // Taken out when the snapshot was recycled.
    debug_assert!(old_gpus.is_empty() && accounts.is_empty());
    *old_gpus = gpus;
    // An empty list for the billing stage's accounts.
    *accounts = accounts_list;
}

/// Where an owner sorts, as far as its kind and the first 16 bytes of its id tell: owners
/// in the order of these keys are in `Owner`'s order, and equal keys are compared whole.
/// The bytes are read as a big-endian number with zeros after a shorter id, which orders
/// as the bytes do (an id that ends first sorts first, unless it ends in zeros: then the
/// keys are equal).
fn order_key(o: &Owner) -> (u8, u128) {
    let (kind, id) = match o {
        Owner::Container(id) => (0, id.as_bytes()),
        Owner::Pod(id) => (1, id.as_bytes()),
        Owner::Host => return (2, 0),
    };
    let mut b = [0u8; 16];
    let n = id.len().min(16);
    b[..n].copy_from_slice(&id[..n]);
    (kind, u128::from_be_bytes(b))
}

impl Group<'_> {
    /// Adds one process's use of device `uuid` (of GPU `gpu_uuid`).
    fn add(&mut self, uuid: Name, gpu_uuid: &Name, p: &ProcessSample, spare: &mut Spare) {
        let i = match self.gpus.iter().position(|g| same(&g.uuid, &uuid)) {
            Some(i) => i,
            None => {
                // Most containers use one device: room for one, not four.
                self.gpus.reserve_exact(1);
                self.gpus.push(ContainerGpu {
                    uuid,
                    gpu_uuid: gpu_uuid.clone(),
                    memory_used_bytes: 0,
                    sm_util: None,
                    mem_util: None,
                    enc_util: None,
                    dec_util: None,
                    pids: spare.pids(),
                    gpu_time_seconds: None,
                    memory_byte_seconds: 0.0,
                    counters_since_ms: 0,
                });
                self.gpus.len() - 1
            }
        };
        let cg = &mut self.gpus[i];
        cg.memory_used_bytes += p.used_memory_bytes;
        cg.sm_util = add_util(cg.sm_util, p.sm_util);
        cg.mem_util = add_util(cg.mem_util, p.mem_util);
        cg.enc_util = add_util(cg.enc_util, p.enc_util);
        cg.dec_util = add_util(cg.dec_util, p.dec_util);
        cg.pids.push(p.pid);
    }
}

/// GPU processes by owner (in owner order), the per-process rows, and the MPS servers
/// (device uuid, pid).
type Grouped<'a> = (Vec<Group<'a>>, Vec<ProcessUsage>, Vec<(String, u32)>);

/// One per-process row of the detail.
fn process_row(p: &ProcessSample, uuid: &Name, placed: Option<Placement<'_>>) -> ProcessUsage {
    let m = placed.and_then(|pl| pl.container);
    ProcessUsage {
        pid: p.pid,
        comm: placed.map(|pl| pl.comm.to_string()),
        container_id: m.and_then(|m| m.container_id.as_deref().map(str::to_string)),
        pod_uid: m.and_then(|m| m.pod_uid.as_deref().map(str::to_string)),
        uuid: uuid.to_string(),
        used_memory_bytes: p.used_memory_bytes,
        sm_util: p.sm_util,
        mem_util: p.mem_util,
        enc_util: p.enc_util,
        dec_util: p.dec_util,
        exited: placed.is_some_and(|pl| !pl.live),
    }
}

/// Every GPU process grouped by owner, the per-process rows when asked for, and the MPS
/// servers (device uuid, pid), which are charged to nobody.
pub(super) fn group_processes<'a>(
    procs: &'a impl Resolver,
    sample: &GpuSample,
    names: &DeviceNames,
    process_detail: bool,
    counters: &mut Counters,
    spare: &mut Spare,
) -> Grouped<'a> {
    let Counters {
        ledgers,
        order,
        hints,
        ..
    } = counters;
    // Every process placed first: a placement is a chain of cache misses (the process
    // cache, the cgroup registry) and, with nothing else in the loop, the CPU overlaps the
    // chains of several processes. The grouping below bumps reference counts, atomic
    // operations that would wait for each chain in turn.
    // Sized at once: collected from a flat map, the list grew by doubling.
    let n = sample.devices.iter().map(|d| d.processes.len()).sum();
    let mut placed: Vec<Option<Placement<'_>>> = Vec::with_capacity(n);
    let all = sample.devices.iter().flat_map(|d| &d.processes);
    procs.place_all(all.map(|p| p.pid), &mut placed);
    // Each owner's group by its slot: the process's hint from the cycle before, else the
    // owner's one lookup this cycle, by its name, borrowed (cloned only for an owner new
    // to the ledgers).
    let mut group_of: Vec<u32> = vec![];
    let last = std::mem::replace(hints, Vec::with_capacity(n));
    // As many as the cycle before, mostly.
    let mut groups: Vec<Group<'_>> = Vec::with_capacity(order.came.len());
    let mut processes = vec![];
    let mut mps_servers = vec![];
    let mut k = 0;
    for (i, dev) in sample.devices.iter().enumerate() {
        for p in &dev.processes {
            prefetch_ahead(&placed, k);
            let placed = placed[k];
            k += 1;
            let uuid = names.of(i, p);
            if process_detail {
                processes.push(process_row(p, &uuid, placed));
            }
            if placed.is_some_and(|pl| is_mps_server(pl.comm)) {
                mps_servers.push((dev.uuid.clone(), p.pid));
                hints.push(Slot::MAX);
                continue;
            }
            let slot = slot_of(ledgers, last.get(k - 1).copied(), placed);
            hints.push(slot);
            if group_of.len() <= slot as usize {
                group_of.resize(slot as usize + 1, u32::MAX);
            }
            if group_of[slot as usize] == u32::MAX {
                group_of[slot as usize] = groups.len() as u32;
                let owner = owner(placed);
                groups.push(Group {
                    order: order_key(&owner),
                    owner,
                    slot,
                    meta: placed.and_then(meta_ref),
                    gpus: spare.gpus(),
                });
            }
            let g = group_of[slot as usize] as usize;
            groups[g].add(uuid, names.gpu(i), p, spare);
        }
    }
    let groups = sort_groups(groups, order);
    (groups, processes, mps_servers)
}

/// The slot of a placed process's owner: the slot of the process at the same position of
/// the sample the cycle before, where it holds the very same name (no byte of the id read,
/// no map probed: the lookup was a visible part of the large node's agent), else the ledgers' lookup.
fn slot_of(
    ledgers: &mut Ledgers<Accumulated>,
    hint: Option<Slot>,
    placed: Option<Placement<'_>>,
) -> Slot {
    let name = owner_name(placed);
    if let Some(s) = hint.filter(|&s| ledgers.holds(s, name)) {
        return s;
    }
    let key = OwnerKey(name.map(|(c, n)| (c, &**n)));
    let s = ledgers.slot(&key, || owner(placed));
    // Found by content: the slot was made for another copy of the id (an allocated
    // container's, from the metadata, before its first GPU process: on a Kubernetes node,
    // most). It takes this one, the cgroup's, so that the next cycle's hint holds; else
    // every cycle read each such id whole in memory gone cold (a visible part of the named large
    // node's agent).
    ledgers.adopt(s, name, || owner(placed));
    s
}

/// The groups in their owners' order. The groups come in the order of the sample's
/// processes, the same from one cycle to the next while they stay: then the order of the
/// cycle before is taken again, and the groups (about 140 bytes each) are moved once, not
/// at every step of a sort.
fn sort_groups<'a>(groups: Vec<Group<'a>>, order: &mut Order) -> Vec<Group<'a>> {
    let same = groups.len() == order.came.len()
        && groups
            .iter()
            .zip(&order.came)
            .all(|(g, o)| g.owner.ptr_eq(o));
    if !same {
        let mut sorted: Vec<u32> = (0..groups.len() as u32).collect();
        sorted.sort_unstable_by(|&a, &b| {
            let (a, b) = (&groups[a as usize], &groups[b as usize]);
            a.order.cmp(&b.order).then_with(|| a.owner.cmp(&b.owner))
        });
        order.came = groups.iter().map(|g| g.owner.clone()).collect();
        order.sorted = sorted;
    }
    let mut groups: Vec<Option<Group>> = groups.into_iter().map(Some).collect();
    let take = |i: &u32| groups[*i as usize].take().expect("a permutation");
    order.sorted.iter().map(take).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::cgroup::ContainerRef;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    const UID: &str = "12345678-1234-1234-1234-123456789abc";

    #[test]
    fn a_process_takes_the_hinted_slot_only_where_it_holds_the_very_name() {
        let mut l = Ledgers::default();
        let container = |id: &str| ContainerRef {
            container_id: Some(id.into()),
            pod_uid: None,
            qos: None,
            runtime: None,
        };
        let (ca, cb) = (container("a"), container("b"));
        fn at(c: &ContainerRef) -> Option<Placement<'_>> {
            Some(Placement {
                comm: "python",
                live: true,
                container: Some(c),
                cgroup_path: None,
            })
        }
        let sa = slot_of(&mut l, None, at(&ca));
        let sb = slot_of(&mut l, None, at(&cb));
        assert_ne!(sa, sb);
        assert_eq!(slot_of(&mut l, Some(sa), at(&ca)), sa);
        assert_eq!(
            slot_of(&mut l, Some(sa), at(&cb)),
            sb,
            "a's slot is not b's"
        );
        assert_eq!(slot_of(&mut l, Some(99), at(&ca)), sa, "no such slot");
        let host = slot_of(&mut l, Some(sa), None);
        assert!(host != sa && host != sb);
        assert_eq!(slot_of(&mut l, Some(host), None), host);
        // The same id in another allocation: found by content, in a's slot, which takes
        // this copy: the next cycle's hint holds by pointer.
        let a2 = container("a");
        assert!(!l.holds(sa, owner_name(at(&a2))));
        assert_eq!(slot_of(&mut l, Some(sb), at(&a2)), sa);
        assert!(l.holds(sa, owner_name(at(&a2))));
        assert!(!l.holds(sa, owner_name(at(&ca))), "the old copy is let go");
        assert_eq!(slot_of(&mut l, Some(sa), at(&ca)), sa);
    }

    #[test]
    fn groups_come_out_in_owner_order_when_they_come_as_before_and_otherwise() {
        let owners: Vec<Owner> = ["c", "a", "b"]
            .iter()
            .map(|id| Owner::Container((*id).into()))
            .chain([Owner::Host, Owner::Pod("p".into())])
            .collect();
        let groups = |order: &[usize]| -> Vec<Group> {
            let group = |o: &Owner| Group {
                owner: o.clone(),
                slot: 0,
                order: order_key(o),
                meta: None,
                gpus: vec![],
            };
            order.iter().map(|&i| group(&owners[i])).collect()
        };
        let ids = |g: Vec<Group>| g.into_iter().map(|g| g.owner).collect::<Vec<_>>();
        let mut want = owners.clone();
        want.sort();
        let mut order = Order::default();
        for came in [
            [0, 1, 2, 3, 4],
            [0, 1, 2, 3, 4],
            [4, 3, 2, 1, 0],
            [1, 0, 2, 4, 3],
        ] {
            assert_eq!(
                ids(sort_groups(groups(&came), &mut order)),
                want,
                "{came:?}"
            );
        }
        // One owner fewer than the cycle before (the host, which sorts last).
        let got = ids(sort_groups(groups(&[1, 0, 2, 4]), &mut order));
        assert_eq!(got, want[..4]);
    }

    #[test]
    fn owners_sort_by_their_order_keys_as_they_sort_whole() {
        let ids = [
            A,
            B,
            "",
            "a",
            "ab",
            "ab\0",
            "abc",
            "0123456789abcdef",
            "0123456789abcdef0",
            "0123456789abcdef1",
            "0123456789abcdeg",
            "0123456789abcde",
            "z",
            UID,
        ];
        let mut owners: Vec<Owner> = ids
            .iter()
            .flat_map(|id| [Owner::Container((*id).into()), Owner::Pod((*id).into())])
            .chain([Owner::Host])
            .collect();
        owners.reverse();
        let mut by_key = owners.clone();
        by_key.sort_by(|a, b| order_key(a).cmp(&order_key(b)).then_with(|| a.cmp(b)));
        owners.sort();
        assert_eq!(by_key, owners);
        // The key alone decides where the ids differ in their first 16 bytes.
        let key = |id: &str| order_key(&Owner::Container(id.into()));
        assert!(key("0123456789abcde") < key("0123456789abcdef"));
        assert!(key("ab") < key("abc"));
        assert_eq!(key("0123456789abcdef0"), key("0123456789abcdef1"));
    }
}
