//! The devices of DRA claims that match no device of the sample: each such claim said once
//! at WARN, while the kubelet lists it, and counted (`dra_devices_unmatched` in
//! /debug/stats). Matched again whenever the naming matches the allocations again (the
//! metadata or the sample's devices changed): dynamic MIG makes a claim's MIG device as
//! the claim is prepared, so a claim may be listed before its device exists.
use rustc_hash::FxHashSet;

use gpu_model::{DraDevice, GpuSample};

use super::naming::{devices_signature, locate};
use crate::metadata::{DeviceRef, Metadata};

/// Which claims' devices matched nothing the last time they were matched.
#[derive(Debug, Default)]
pub struct Unmatched {
    /// (the metadata's generation, `devices_signature` of the sample) last checked under.
    checked_under: Option<(u64, u64)>,
    /// Claims said at WARN (namespace, name), forgotten once the kubelet no longer lists
    /// them.
    warned: FxHashSet<(String, String)>,
    /// Devices of listed claims that match nothing, each counted once however many
    /// containers hold it.
    count: usize,
}

/// Why a device of a claim matches nothing.
enum Miss<'a> {
    /// Its name is none of the driver's forms gpu-agent reads.
    Unreadable,
    /// It reads as this device, which NVML does not list.
    Absent(&'a DeviceRef),
}

impl Unmatched {
    /// Matches every DRA device the metadata lists against the sample, where either changed
    /// since the last check; says the claims whose devices matched nothing, those not said
    /// already. How many it said.
    pub fn check(&mut self, metadata: &Metadata, sample: &GpuSample) -> usize {
        // No claims (every node without DRA): nothing to match, every cycle.
        if !metadata.has_claims() && self.count == 0 && self.warned.is_empty() {
            return 0;
        }
        let under = (metadata.generation(), devices_signature(&sample.devices));
        if self.checked_under == Some(under) {
            return 0;
        }
        self.checked_under = Some(under);
        let mut listed = FxHashSet::default();
        let mut missed: FxHashSet<&DraDevice> = FxHashSet::default();
        let mut said = 0;
        for (a, refs) in metadata.allocations().iter().zip(metadata.refs()) {
            let Some(dra) = a.claim.as_deref() else {
                continue;
            };
            let claim = (dra.claim_namespace.clone(), dra.claim_name.clone());
            listed.insert(claim.clone());
            let miss = match refs.first() {
                None => Miss::Unreadable,
                Some(r) if !absent(r, sample) => continue,
                Some(r) => Miss::Absent(r),
            };
            if !missed.insert(dra) || self.warned.contains(&claim) {
                continue;
            }
            warn(dra, &miss);
            self.warned.insert(claim);
            said += 1;
        }
        self.count = missed.len();
        self.warned.retain(|c| listed.contains(c));
        said
    }

    /// How many devices of listed claims matched nothing at the last check.
    pub fn count(&self) -> usize {
        self.count
    }
}

/// Whether the sample says that device `r` is not there: a device it matches is there, and
/// a MIG device of a GPU the sample did not read (stalled, lost) may be.
fn absent(r: &DeviceRef, sample: &GpuSample) -> bool {
    if locate(r, &sample.devices).is_some() {
        return false;
    }
    let DeviceRef::Mig { parent_minor, .. } = *r else {
        return true;
    };
    let parent = (sample.devices.iter()).find(|d| d.sharing.minor_number == Some(parent_minor));
    parent.is_none_or(|d| d.status.is_ok())
}

fn warn(d: &DraDevice, miss: &Miss) {
    let claim = format!(
        "DRA claim {}/{}: device {:?} of driver {} (pool {:?})",
        d.claim_namespace, d.claim_name, d.device, d.driver, d.pool
    );
    match miss {
        Miss::Unreadable => tracing::warn!(
            "{claim} is none of the names gpu-agent reads (gpu-<minor>, \
             gpu-<minor>-mig-<profile>-<GI profile id>-<placement start>, \
             gpu-<minor>-mig-<GI profile id>-<start>-<size>): its container is not \
             allocated it"
        ),
        Miss::Absent(DeviceRef::Mig {
            parent_minor,
            profile_id,
            placement_start,
        }) => tracing::warn!(
            "{claim} matches no MIG device NVML lists now (a GPU instance of profile id \
             {profile_id} at placement {placement_start} on /dev/nvidia{parent_minor}); \
             matched again as MIG devices are made"
        ),
        Miss::Absent(DeviceRef::Minor(m)) => tracing::warn!(
            "{claim} matches no GPU NVML lists now (none is /dev/nvidia{m}); matched again \
             as devices change"
        ),
        Miss::Absent(r) => tracing::warn!("{claim} matches no device NVML lists now ({r:?})"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use gpu_model::{ContainerUsage, DeviceSample, DeviceStatus, GpuInstance, MigSample, Name};

    use super::*;
    use crate::{
        gpu::join::{naming::name_and_allocate, owner::DeviceNames},
        metadata::Allocation,
    };

    fn mig(uuid: &str, profile: &str, profile_id: u32, start: u32, size: u32) -> MigSample {
        MigSample {
            uuid: uuid.into(),
            profile: Some(profile.into()),
            gpu_instance: Some(GpuInstance {
                profile_id,
                placement_start: start,
                placement_size: size,
            }),
            ..Default::default()
        }
    }

    /// GPU 0 (minor 0) with MIG devices 1g.10gb at 0 and 1g.10gb+me at 6; GPU 1 (minor 1)
    /// with a 2g.47gb at 0; GPU 2 (minor 5) whole.
    fn node(t: u64) -> GpuSample {
        let gpu = |index: u32, minor: u32, migs: Vec<MigSample>| {
            let mut d = DeviceSample {
                index,
                uuid: format!("GPU-{index}"),
                status: DeviceStatus::Ok,
                mig_enabled: !migs.is_empty(),
                mig_devices: migs,
                ..Default::default()
            };
            d.sharing.minor_number = Some(minor);
            d
        };
        GpuSample {
            taken_at_ms: t,
            driver_version: None,
            devices: vec![
                gpu(
                    0,
                    0,
                    vec![
                        mig("MIG-a", "1g.10gb", 19, 0, 1),
                        mig("MIG-me", "1g.10gb+me", 20, 6, 1),
                    ],
                ),
                gpu(1, 1, vec![mig("MIG-b", "2g.47gb", 14, 0, 2)]),
                gpu(2, 5, vec![]),
            ],
        }
    }

    /// Container ml/`pod`/main holding `device` of claim ml/`claim`.
    fn claimed(pod: &str, claim: &str, device: &str) -> Allocation {
        Allocation {
            namespace: "ml".into(),
            pod_name: pod.into(),
            container_name: "main".into(),
            resource_name: "gpu.nvidia.com".into(),
            device_ids: vec![device.into()],
            claim: Some(Arc::new(DraDevice {
                claim_namespace: "ml".into(),
                claim_name: claim.into(),
                driver: "gpu.nvidia.com".into(),
                pool: "node-1".into(),
                device: device.into(),
            })),
        }
    }

    /// What container ml/`pod`/main is allocated, and through which claims (holders).
    fn allocated(md: &Metadata, sample: &GpuSample, pod: &str) -> (Vec<Name>, Vec<u32>) {
        let mut c = ContainerUsage {
            namespace: Some("ml".into()),
            pod_name: Some(pod.into()),
            container_name: Some("main".into()),
            ..Default::default()
        };
        let names = DeviceNames::new(sample, &Default::default());
        name_and_allocate(&mut c, md, &sample.devices, &names);
        let holders = c.claims.iter().map(|d| d.holders).collect();
        (c.allocated_gpus.to_vec(), holders)
    }

    /// Each of the names in the driver's forms, both driver versions, resolves to its
    /// device: a GPU by its minor number (not its index), a MIG device by its parent's
    /// minor number, GPU instance profile id and placement start.
    #[test]
    fn every_form_of_the_drivers_names_resolves_to_its_device() {
        let sample = node(1000);
        let cases = [
            ("gpu-5", "GPU-2"),
            ("gpu-0-mig-1g10gb-19-0", "MIG-a"),
            ("gpu-1-mig-2g47gb-14-0", "MIG-b"),
            ("gpu-0-mig-1g10gb-me-20-6", "MIG-me"),
            ("gpu-0-mig-19-0-1", "MIG-a"),
        ];
        let mut md = Metadata::default();
        md.set_allocations(
            (cases.iter().enumerate())
                .map(|(i, (device, _))| claimed(&format!("p{i}"), &format!("c{i}"), device))
                .collect(),
        );
        for (i, (device, uuid)) in cases.iter().enumerate() {
            let (gpus, holders) = allocated(&md, &sample, &format!("p{i}"));
            assert_eq!(
                (gpus, holders),
                (vec![Name::from(*uuid)], vec![1]),
                "{device}"
            );
        }
        assert_eq!(Unmatched::default().check(&md, &sample), 0);
    }

    /// A claim of two GPUs is two devices; a claim two pods share counts two holders.
    #[test]
    fn a_claims_devices_are_its_own_and_its_holders_counted() {
        let sample = node(1000);
        let mut md = Metadata::default();
        md.set_allocations(vec![
            claimed("two", "pair", "gpu-0-mig-1g10gb-19-0"),
            claimed("two", "pair", "gpu-5"),
            claimed("p", "shared", "gpu-1-mig-2g47gb-14-0"),
            claimed("q", "shared", "gpu-1-mig-2g47gb-14-0"),
        ]);
        let (gpus, holders) = allocated(&md, &sample, "two");
        assert_eq!(
            (gpus, holders),
            (vec!["GPU-2".into(), "MIG-a".into()], vec![1, 1])
        );
        for pod in ["p", "q"] {
            assert_eq!(
                allocated(&md, &sample, pod),
                (vec!["MIG-b".into()], vec![2])
            );
        }
    }

    /// A name that reads as a device NVML does not list is said once per claim and
    /// counted; matched again when the sample changes, it resolves once its MIG device is
    /// made (dynamic MIG makes it as the claim is prepared). A name of no known form
    /// counts too.
    #[test]
    fn a_device_not_made_yet_is_said_once_counted_and_found_once_made() {
        let mut md = Metadata::default();
        md.set_allocations(vec![
            claimed("p", "later", "gpu-0-mig-1g20gb-15-2"),
            claimed("p", "later", "gpu-0-mig-1g20gb-15-4"),
            claimed("q", "odd", "gpu-0-part-1"),
        ]);
        let mut u = Unmatched::default();
        let before = node(1000);
        assert_eq!(u.check(&md, &before), 2, "one warning per claim");
        assert_eq!(u.count(), 3);
        assert_eq!(allocated(&md, &before, "p").0, Vec::<Name>::new());
        assert_eq!(u.check(&md, &before), 0, "nothing changed");
        // Another cycle of the same devices, a new listing of the same claims: not again.
        md.set_allocations(md.allocations().to_vec());
        assert_eq!(u.check(&md, &node(2000)), 0);
        // Dynamic MIG makes the first device.
        let mut after = node(3000);
        let made = mig("MIG-new", "1g.20gb", 15, 2, 2);
        after.devices[0].mig_devices.push(made);
        assert_eq!(u.check(&md, &after), 0);
        assert_eq!(u.count(), 2);
        assert_eq!(allocated(&md, &after, "p").0, vec![Name::from("MIG-new")]);
        // A GPU the sample could not read says nothing of its MIG devices.
        let mut stalled = after.clone();
        stalled.devices[0].status = DeviceStatus::Lost;
        stalled.devices[0].mig_devices.clear();
        u.check(&md, &stalled);
        assert_eq!(u.count(), 1, "the odd name only");
        // A claim no longer listed is forgotten: listed again, it is said again.
        md.set_allocations(vec![]);
        assert_eq!((u.check(&md, &after), u.count()), (0, 0));
        md.set_allocations(vec![claimed("q", "odd", "gpu-0-part-1")]);
        assert_eq!(u.check(&md, &after), 1);
    }
}
