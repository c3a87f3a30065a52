//! dcgm-exporter's families (`--prometheus-compat dcgm` or `dcgm-virtual-gpus`): the
//! devices and MIG devices it has series for, with its labels, and their series.
use gpu_model::Snapshot;

use crate::{
    catalogue::{Attr, Dropped, MetricId as M, MetricId},
    dcgm::{self, DcgmCompat, Entity, Mode},
};

use super::{
    text::{block, Family},
    Renderer,
};

impl Renderer<'_> {
    /// One dcgm-exporter field: a series per device (and per pod, under
    /// `dcgm-virtual-gpus`), as dcgm.rs describes.
    pub(super) fn dcgm_family(&self, id: MetricId, f: &mut Family) {
        let Some(compat) = &self.opts.dcgm else {
            return;
        };
        for e in &self.b.dcgm {
            let d = &self.snap.devices[e.device];
            let v = match e.mig {
                None => dcgm::device_value(id, d),
                Some(m) => dcgm::mig_value(id, &d.mig_devices[m]),
            };
            let Some(v) = v else { continue };
            let code = (id == M::DcgmXidErrors).then(|| v.to_string());
            let xid = code.as_deref().map(|c| (c, dcgm::xid_message(v as u64)));
            match compat.mode {
                // dcgm-exporter's DRA transformation: a copy per container holding the
                // device through a claim, the device's value in each.
                _ if e.dra_pods().next().is_some() => {
                    for p in e.dra_pods() {
                        f.series(&e.labels, &dcgm::attributes(Some(p), false, xid), v);
                    }
                }
                Mode::Default => {
                    let pod = dcgm::default_pod(&e.pods);
                    f.series(&e.labels, &dcgm::attributes(pod, false, xid), v);
                }
                Mode::VirtualGpus => self.virtual_gpus(id, e, v, xid, f),
            }
        }
    }

    /// dcgm-exporter's `--kubernetes-virtual-gpus`: a copy of the device series per pod;
    /// FB_USED and GPU_UTIL keep the device series and give each pod its own value.
    fn virtual_gpus(
        &self,
        id: MetricId,
        e: &Entity,
        v: f64,
        xid: Option<(&str, &str)>,
        f: &mut Family,
    ) {
        if e.pods.is_empty() {
            return f.series(&e.labels, &dcgm::attributes(None, false, xid), v);
        }
        let per_pod = dcgm::per_pod(id);
        if per_pod {
            f.series(&e.labels, &dcgm::attributes(None, false, xid), v);
        }
        let d = &self.snap.devices[e.device];
        let uuid: &str = e.mig.map_or(&d.uuid, |m| &d.mig_devices[m].uuid);
        for p in &e.pods {
            let value = if per_pod {
                dcgm::pod_value(id, self.snap, uuid, &p.uid)
            } else {
                v
            };
            f.series(&e.labels, &dcgm::attributes(Some(p), per_pod, xid), value);
        }
    }
}

/// Every GPU that answers, and its MIG devices, with dcgm-exporter's labels: `gpu`, `UUID`
/// (the physical GPU's, also on MIG series), `pci_bus_id`, `device` (nvidia<index>),
/// `modelName`, `GPU_I_PROFILE` and `GPU_I_ID` on MIG series, `Hostname` (its released
/// spelling; the node name when known, as it does) and the driver version when the CSV
/// asks for it. `modelName` is camelCase, which promtool flags; kept so that existing
/// queries by it keep working.
pub(super) fn dcgm_entities(
    snap: &Snapshot,
    node: &str,
    compat: &DcgmCompat,
    drop: Dropped,
) -> Vec<Entity> {
    let driver = snap.driver_version.as_deref().unwrap_or_default();
    let mut out = vec![];
    for (i, d) in snap.devices.iter().enumerate() {
        if !d.status.is_ok() {
            continue; // DCGM has no values for a lost GPU either
        }
        let index = d.index.to_string();
        let device = format!("nvidia{}", d.index);
        let pci = d.pci_bus_id.as_deref().unwrap_or_default();
        let labels = |mig: Option<(&str, &str)>| {
            let mut p = vec![
                (Attr::GpuIndex, index.as_str()),
                (Attr::DcgmUuid, d.uuid.as_str()),
                (Attr::PciBusId, pci),
                (Attr::DcgmDevice, device.as_str()),
                (Attr::DcgmModelName, d.name.as_str()),
            ];
            if let Some((profile, gi)) = mig {
                if !profile.is_empty() {
                    p.push((Attr::DcgmGpuProfile, profile));
                }
                p.push((Attr::DcgmGpuInstance, gi));
            }
            p.push((compat.host_label.attr(), node));
            if compat.driver_version_label && !driver.is_empty() {
                p.push((Attr::DcgmDriverVersion, driver));
            }
            block(drop, &p)
        };
        out.push(Entity {
            device: i,
            mig: None,
            labels: labels(None),
            pods: dcgm::pods_of(snap, &d.uuid, None, compat.mode),
        });
        for (j, m) in d.mig_devices.iter().enumerate() {
            let gi = m.gpu_instance_id.to_string();
            let profile = m.profile.as_deref().unwrap_or_default();
            out.push(Entity {
                device: i,
                mig: Some(j),
                labels: labels(Some((profile, gi.as_str()))),
                pods: dcgm::pods_of(snap, &m.uuid, Some(m), compat.mode),
            });
        }
    }
    out
}
