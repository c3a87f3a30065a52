//! GPU instances: a MIG device's GPU instance handle (`nvmlDeviceGetGpuInstanceById`) and
//! what it says of itself (`nvmlGpuInstanceGetInfo`): its profile id and placement, from
//! the MIG device's `profile_id`, `placement_start` and `placement_size`, or, where they
//! are absent, from its profile (the driver's values, `known_profile`) and the devices
//! before it.
use std::ffi::c_uint;

use crate::scenario::{DeviceSpec, Feature, MigSpec};
use crate::{
    gpu_handle, put, resolve, resolve_gpu, with_loaded, Device, Ret, INVALID_ARGUMENT, NOT_FOUND,
    NOT_SUPPORTED,
};

/// nvmlGpuInstance_t: a tagged integer, like the device handles (lib.rs), naming the
/// parent's NVML index and the GPU instance id:
/// `0x47 << 24 | nvml index << 16 | (gpu instance id + 1) << 8`.
const GI_TAG: usize = 0x47;

fn gi_handle(index: u32, gi: u32) -> Device {
    std::ptr::without_provenance_mut(GI_TAG << 24 | (index as usize) << 16 | (gi as usize + 1) << 8)
}

/// (nvml index, gpu instance id) of a GPU instance handle.
fn decode_gi(h: Device) -> Option<(u32, u32)> {
    let v = h.addr();
    if v >> 24 != GI_TAG || v & 0xFF != 0 || (v >> 8) & 0xFF == 0 {
        return None;
    }
    Some((((v >> 16) & 0xFF) as u32, ((v >> 8) & 0xFF) as u32 - 1))
}

/// nvmlGpuInstancePlacement_t.
#[repr(C)]
pub struct Placement {
    start: c_uint,
    size: c_uint,
}

/// nvmlGpuInstanceInfo_t: 24 bytes (the parent's handle, the instance id, the profile id,
/// the placement).
#[repr(C)]
pub struct GpuInstanceInfo {
    device: Device,
    id: c_uint,
    profile_id: c_uint,
    placement: Placement,
}

const _: () = assert!(std::mem::size_of::<GpuInstanceInfo>() == 24);

/// A GPU instance's profile id and placement (start, size) in memory slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instance {
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
}

/// The driver's GPU instance profile id and placement size (memory slices) of a profile
/// (`nvidia-smi mig -lgip`'s ID; `-lgipp`'s placements): A100 40GB, A100 and H100 80GB,
/// H200 141GB, A30. The one-slice profile with twice the memory (`1g.20gb` on an 80 GB GPU)
/// is 15 and takes two slices; an A100 40GB's `1g.10gb` is that one, an 80 GB GPU's
/// `1g.10gb` the plain one (19): give `profile_id` for the former.
pub fn known_profile(profile: &str) -> Option<(u32, u32)> {
    Some(match profile {
        "7g.40gb" | "7g.80gb" | "7g.141gb" => (0, 8),
        "4g.20gb" | "4g.40gb" | "4g.71gb" => (5, 4),
        "3g.20gb" | "3g.40gb" | "3g.71gb" => (9, 4),
        "2g.10gb" | "2g.20gb" | "2g.35gb" => (14, 2),
        "1g.20gb" | "1g.35gb" => (15, 2),
        "1g.5gb" | "1g.10gb" | "1g.18gb" => (19, 1),
        "1g.5gb+me" | "1g.10gb+me" | "1g.18gb+me" => (20, 1),
        // A30: four memory slices.
        "4g.24gb" => (0, 4),
        "2g.12gb" => (5, 2),
        "2g.12gb+me" => (6, 2),
        "1g.6gb" => (14, 1),
        "1g.6gb+me" => (21, 1),
        _ => return None,
    })
}

/// The profile in a MIG device's name: `NVIDIA H100 80GB HBM3 MIG 1g.10gb` -> `1g.10gb`.
fn profile_of(m: &MigSpec) -> Option<&str> {
    let p = m.name.as_deref()?.rsplit_once("MIG ")?.1.trim();
    (!p.is_empty()).then_some(p)
}

/// The profile id and placement size of `m`: its own keys, else the GPU's `mig_profiles`
/// entry of its profile's name, else the driver's (`known_profile`).
fn profile_and_size(dev: &DeviceSpec, m: &MigSpec) -> Option<(u32, u32)> {
    let profile = profile_of(m);
    let listed = profile.and_then(|p| {
        let e = (dev.mig_profiles.iter()).find(|e| e.name.strip_prefix("MIG ") == Some(p))?;
        Some((e.id, e.placements.first().map(|[_, size]| *size)))
    });
    let known = profile.and_then(known_profile);
    let id = m
        .profile_id
        .or(listed.map(|l| l.0))
        .or(known.map(|k| k.0))?;
    let size = (m.placement_size)
        .or(listed.and_then(|l| l.1))
        .or(known.map(|k| k.1))
        .unwrap_or(1);
    Some((id, size))
}

/// GPU instance `gi` of `dev`: the first MIG device on it says. A placement start not given
/// is the first free one, a multiple of its size, after those of the GPU instances before
/// it in `mig_devices` (the first of each instance id); None where its profile id is
/// unknown.
pub fn instance(dev: &DeviceSpec, gi: u32) -> Option<Instance> {
    let mut taken: Vec<(u32, u32, u32)> = vec![]; // (gi, start, size)
    let mut out = None;
    for m in &dev.mig_devices {
        if taken.iter().any(|t| t.0 == m.gpu_instance_id) {
            continue;
        }
        let Some((profile_id, size)) = profile_and_size(dev, m) else {
            continue;
        };
        let free = |s: u32| (taken.iter()).all(|&(_, t, n)| s + size <= t || t + n <= s);
        let start = m.placement_start.unwrap_or_else(|| {
            (0..)
                .step_by(size.max(1) as usize)
                .find(|&s| free(s))
                .unwrap_or(0)
        });
        taken.push((m.gpu_instance_id, start, size));
        if m.gpu_instance_id == gi {
            out = Some(Instance {
                profile_id,
                start,
                size,
            });
        }
    }
    out
}

/// On a GPU with MIG on: the handle of its GPU instance `id` (NOT_FOUND where no MIG device
/// is on one of that id). A MIG handle, or a GPU without MIG: NOT_SUPPORTED.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: Device,
    id: c_uint,
    gpu_instance: *mut Device,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve_gpu(l, device, Some(Feature::Mig))?;
        if !t.dev.mig_enabled() {
            return Err(NOT_SUPPORTED);
        }
        if !t.dev.mig_devices.iter().any(|m| m.gpu_instance_id == id) {
            return Err(NOT_FOUND);
        }
        put(gpu_instance, gi_handle(t.index, id))
    })
}

/// The instance's parent, id, profile id and placement; NOT_SUPPORTED where its profile id
/// is not known (no `profile_id`, and a profile `known_profile` does not list).
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gpu_instance: Device,
    info: *mut GpuInstanceInfo,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let (index, gi) = decode_gi(gpu_instance).ok_or(INVALID_ARGUMENT)?;
        // The parent's hangs and loss apply.
        let t = resolve(l, gpu_handle(index))?;
        if !t.dev.mig_devices.iter().any(|m| m.gpu_instance_id == gi) {
            return Err(INVALID_ARGUMENT);
        }
        let i = instance(t.dev, gi).ok_or(NOT_SUPPORTED)?;
        put(
            info,
            GpuInstanceInfo {
                device: gpu_handle(index),
                id: gi,
                profile_id: i.profile_id,
                placement: Placement {
                    start: i.start,
                    size: i.size,
                },
            },
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(migs: &str) -> DeviceSpec {
        let s = crate::scenario::Scenario::parse(&format!(
            r#"{{"devices":[{{"uuid":"GPU-a","name":"NVIDIA H100 80GB HBM3","mig_devices":[{migs}]}}]}}"#
        ))
        .unwrap();
        s.devices.into_iter().next().unwrap()
    }

    fn mig(uuid: &str, gi: u32, profile: &str, more: &str) -> String {
        format!(
            r#"{{"uuid":"{uuid}","gpu_instance_id":{gi},"memory_total":1,"name":"NVIDIA H100 80GB HBM3 MIG {profile}"{more}}}"#
        )
    }

    #[test]
    fn instances_take_their_profiles_ids_and_pack_where_no_placement_is_given() {
        let d = gpu(&[
            mig("MIG-a", 1, "3g.40gb", ""),
            mig("MIG-b", 5, "2g.20gb", ""),
            mig("MIG-c", 13, "1g.10gb", ""),
            mig("MIG-d", 14, "1g.10gb+me", r#","placement_start":7"#),
            mig(
                "MIG-e",
                7,
                "MIG x",
                r#","profile_id":33,"placement_size":1"#,
            ),
        ]
        .join(","));
        let at = |gi| instance(&d, gi).map(|i| (i.profile_id, i.start, i.size));
        assert_eq!(at(1), Some((9, 0, 4)));
        assert_eq!(at(5), Some((14, 4, 2)));
        assert_eq!(at(13), Some((19, 6, 1)), "the first free start");
        assert_eq!(at(14), Some((20, 7, 1)), "as given");
        assert_eq!(at(7), Some((33, 8, 1)));
        assert_eq!(at(2), None);
        let unknown = gpu(&mig("MIG-u", 1, "9g.9gb", ""));
        assert_eq!(instance(&unknown, 1), None);
    }

    #[test]
    fn gpu_instance_handles_round_trip() {
        assert_eq!(decode_gi(gi_handle(3, 13)), Some((3, 13)));
        assert_eq!(decode_gi(gi_handle(0, 0)), Some((0, 0)));
        assert_eq!(decode_gi(gpu_handle(3)), None);
        assert_eq!(decode_gi(std::ptr::null_mut()), None);
    }
}
