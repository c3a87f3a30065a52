//! The label blocks of one render, made once: each device's and MIG device's, each
//! container's per device it uses, is allocated or is accounted on, each XID charge's and
//! each process's.
use gpu_model::{ContainerUsage, Snapshot};

use crate::{
    catalogue::{Attr, Dropped, Group, MetricId, OWNERS, OWNER_IDLE},
    dcgm::Entity,
};

use super::{
    compat::dcgm_entities,
    text::{block, block_of, push_label},
    PromOptions,
};

/// What one render writes, made once: the families, in order, and the label blocks of
/// every object (owned, so that a stream can keep them between chunks).
pub(super) struct Blocks {
    pub(super) drop: Dropped,
    pub(super) plan: Vec<MetricId>,
    /// Per device (GPU), and per MIG device of it.
    pub(super) devices: Vec<String>,
    pub(super) migs: Vec<Vec<String>>,
    /// Per container, per device it uses.
    pub(super) containers: Vec<Vec<String>>,
    /// Per container, per device allocated to it.
    pub(super) allocations: Vec<Vec<String>>,
    pub(super) processes: Vec<String>,
    /// Per XID charge to a container.
    pub(super) xids: Vec<String>,
    /// Per container, per device it is accounted on (energy, peaks, limits).
    pub(super) accounts: Vec<Vec<String>>,
    /// Per device: its idle energy's entry (`owner="idle"`, no container).
    pub(super) idle: Vec<String>,
    pub(super) dcgm: Vec<Entity>,
}

impl Blocks {
    pub(super) fn new(snap: &Snapshot, opts: &PromOptions) -> Blocks {
        let g = &opts.groups;
        let drop = Dropped::of(g);
        let node = opts
            .node
            .node_name
            .as_deref()
            .unwrap_or(&opts.node.host_name);
        let on = |group: Group| match group {
            Group::Device => g.device,
            Group::Container => g.container,
            Group::Process => g.process,
            Group::SelfMetrics => g.self_metrics,
            Group::Dcgm => false, // in the CSV's order, below
        };
        let mut plan: Vec<MetricId> = MetricId::ALL
            .iter()
            .copied()
            .filter(|id| id.def().prometheus.is_some() && on(id.def().group))
            .collect();
        // dcgm-exporter's series are device series.
        let dcgm = opts.dcgm.as_ref().filter(|_| g.device);
        if let Some(d) = dcgm {
            plan.extend(d.fields.iter().map(|f| f.id));
        }
        let mut b = Blocks {
            drop,
            plan,
            devices: vec![],
            migs: vec![],
            containers: vec![],
            allocations: vec![],
            processes: vec![],
            xids: vec![],
            accounts: vec![],
            idle: vec![],
            dcgm: vec![],
        };
        if g.device {
            b.device_blocks(snap, node);
        }
        if g.container {
            b.container_blocks(snap, node);
        }
        if g.process {
            b.process_blocks(snap, node);
        }
        if let Some(d) = dcgm {
            b.dcgm = dcgm_entities(snap, node, d, drop);
        }
        b
    }

    fn device_blocks(&mut self, snap: &Snapshot, node: &str) {
        for d in &snap.devices {
            let index = d.index.to_string();
            let pci = d.pci_bus_id.as_deref().unwrap_or_default();
            let pairs = |id: &str| {
                block(
                    self.drop,
                    &[
                        (Attr::HwId, id),
                        (Attr::GpuIndex, index.as_str()),
                        (Attr::HwModel, d.name.as_str()),
                        (Attr::PciBusId, pci),
                        (Attr::Node, node),
                    ],
                )
            };
            let dev = pairs(&d.uuid);
            let migs = d.mig_devices.iter().map(|m| {
                let mut b = pairs(&m.uuid);
                let mut first = b.is_empty();
                if !self.drop.contains(Attr::HwParent) {
                    push_label(&mut b, &mut first, Attr::HwParent, &d.uuid);
                }
                b
            });
            let migs = migs.collect();
            self.devices.push(dev);
            self.migs.push(migs);
        }
    }

    fn container_blocks(&mut self, snap: &Snapshot, node: &str) {
        let drop = self.drop;
        // A container's series on one device; `who` is its `owner`.
        let on_device = |c: &ContainerUsage, uuid: &str, gpu_uuid: &str, who: &str| {
            let rest = [
                (Attr::Qos, c.qos.unwrap_or_default()),
                (Attr::Runtime, c.runtime.unwrap_or_default()),
                (Attr::HwId, uuid),
                (Attr::GpuUuid, gpu_uuid),
                (Attr::Node, node),
                (Attr::Owner, who),
            ];
            block_of(drop, container_labels(c).chain(rest))
        };
        for c in &snap.containers {
            let per_gpu = c.gpus.iter();
            let per_gpu = per_gpu.map(|g| on_device(c, &g.uuid, &g.gpu_uuid, owner(c)));
            self.containers.push(per_gpu.collect());
            let accounts = c.accounts.iter();
            let accounts = accounts.map(|a| on_device(c, &a.uuid, &a.gpu_uuid, owner(c)));
            self.accounts.push(accounts.collect());
            let allocated = c.allocated_gpus.iter().map(|u| {
                let device = [(Attr::HwId, &**u), (Attr::Node, node)];
                let claim = c.claim_of(u).map(|d| {
                    [
                        (Attr::ClaimName, d.dra.claim_name.as_str()),
                        (Attr::ClaimNamespace, d.dra.claim_namespace.as_str()),
                    ]
                });
                let labels = container_labels(c).chain(device);
                block_of(drop, labels.chain(claim.into_iter().flatten()))
            });
            self.allocations.push(allocated.collect());
        }
        for x in &snap.container_xids {
            let p = [
                (Attr::ContainerId, s(&x.container_id)),
                (Attr::PodUid, s(&x.pod_uid)),
                (Attr::Namespace, s(&x.namespace)),
                (Attr::PodName, s(&x.pod_name)),
                (Attr::ContainerName, s(&x.container_name)),
                (Attr::HwId, &x.uuid),
                (Attr::GpuUuid, &x.gpu_uuid),
                (Attr::Node, node),
            ];
            self.xids.push(block(self.drop, &p));
        }
        let nobody = ContainerUsage::default();
        let idle = snap.devices.iter();
        let idle = idle.map(|d| on_device(&nobody, &d.uuid, &d.uuid, OWNER_IDLE));
        self.idle = idle.collect();
    }

    fn process_blocks(&mut self, snap: &Snapshot, node: &str) {
        for p in &snap.processes {
            let pid = p.pid.to_string();
            let pairs = [
                (Attr::ProcessPid, pid.as_str()),
                (Attr::Comm, s(&p.comm)),
                (Attr::ContainerId, s(&p.container_id)),
                (Attr::PodUid, s(&p.pod_uid)),
                (Attr::HwId, &p.uuid),
                (Attr::Node, node),
            ];
            self.processes.push(block(self.drop, &pairs));
        }
    }
}

/// A container's names, then `workload_kind` and `workload` where its pod's owner is
/// known.
fn container_labels(c: &ContainerUsage) -> impl Iterator<Item = (Attr, &str)> {
    let names = [
        (Attr::ContainerId, s(&c.container_id)),
        (Attr::PodUid, s(&c.pod_uid)),
        (Attr::Namespace, s(&c.namespace)),
        (Attr::PodName, s(&c.pod_name)),
        (Attr::ContainerName, s(&c.container_name)),
    ];
    let w = c.workload.as_deref();
    let owner = w.map(|w| {
        [
            (Attr::WorkloadKind, w.kind.as_str()),
            (Attr::Workload, &*w.name),
        ]
    });
    names.into_iter().chain(owner.into_iter().flatten())
}

fn s<S: AsRef<str>>(v: &Option<S>) -> &str {
    v.as_ref().map_or("", AsRef::as_ref)
}

/// A container, a pod-level cgroup, or the host (outside any container).
fn owner(c: &ContainerUsage) -> &'static str {
    let [container, pod, host] = OWNERS;
    match (&c.container_id, &c.pod_uid) {
        (Some(_), _) => container,
        (None, Some(_)) => pod,
        (None, None) => host,
    }
}
