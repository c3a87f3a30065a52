//! Device ids as the kubelet hands them out, a device plugin's or a DRA driver's, parsed
//! into the `DeviceRef` the join matches NVML's devices by. No sockets here: the
//! pod-resources listing and `Allocation` both parse with it.
use gpu_model::Name;

/// Is this an NVIDIA GPU resource (whole GPUs, MIG profiles, shared replicas)?
pub fn is_gpu_resource(name: &str) -> bool {
    name.starts_with("nvidia.com/")
}

/// A device id as the join can match it: a UUID (`GPU-…`/`MIG-…`), an NVML index, the
/// minor number (/dev/nvidiaN) NVIDIA's DRA driver names GPUs by, or the (parent minor, GPU
/// instance profile id, placement start) it names MIG devices by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceRef {
    Uuid(Name),
    Index(u32),
    Minor(u32),
    Mig {
        parent_minor: u32,
        profile_id: u32,
        placement_start: u32,
    },
}

/// Normalises a device plugin's id: strips the `::N` time-slicing suffix, maps an index or
/// GKE's `nvidia0/gi0` to the GPU index.
pub fn parse_device_id(id: &str) -> Option<DeviceRef> {
    let id = id.split("::").next().unwrap_or(id).trim();
    if id.starts_with("GPU-") || id.starts_with("MIG-") {
        return Some(DeviceRef::Uuid(id.into()));
    }
    if let Ok(i) = id.parse() {
        return Some(DeviceRef::Index(i));
    }
    let gke = id.strip_prefix("nvidia")?;
    let idx = gke.split('/').next()?;
    idx.parse().ok().map(DeviceRef::Index)
}

/// A device name of NVIDIA's DRA driver (`gpu.nvidia.com`), as the join matches it:
/// - `gpu-<minor>`: a whole GPU, by the N of /dev/nvidiaN (not its NVML index);
/// - `gpu-<parent minor>-mig-<GI profile id>-<placement start>-<placement size>`: a MIG
///   device, as the driver names one up to v25.8 (`gpu-0-mig-19-0-1`);
/// - `gpu-<parent minor>-mig-<profile>-<GI profile id>-<placement start>`: a MIG device from
///   v25.12 on, the profile without its dots (`gpu-0-mig-1g10gb-19-0`, `1g10gb-me` for
///   `1g.10gb+me`).
///
/// The older, all-digit form is read first: the newer one would take its profile id for a
/// profile. None for anything else.
pub fn parse_dra_device(name: &str) -> Option<DeviceRef> {
    let rest = name.strip_prefix("gpu-")?;
    let Some((minor, mig)) = rest.split_once("-mig-") else {
        return digits(rest).map(DeviceRef::Minor);
    };
    let parent_minor = digits(minor)?;
    let mig_ref = |profile_id, placement_start| DeviceRef::Mig {
        parent_minor,
        profile_id,
        placement_start,
    };
    let parts: Vec<&str> = mig.split('-').collect();
    if let [id, start, size] = parts[..] {
        if let (Some(id), Some(start), Some(_)) = (digits(id), digits(start), digits(size)) {
            return Some(mig_ref(id, start));
        }
    }
    // The profile is all but the last two parts: `1g10gb`, or `1g10gb-me`.
    let [profile @ .., id, start] = &parts[..] else {
        return None;
    };
    if profile.is_empty() || profile.iter().any(|p| p.is_empty()) {
        return None;
    }
    Some(mig_ref(digits(id)?, digits(start)?))
}

/// A number of ASCII digits only (no sign, not empty).
fn digits(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_ids_of_every_plugin_shape() {
        let u = "GPU-6663f2bc-da9f-4cff-88fe-d84cc95fe598";
        assert_eq!(parse_device_id(u), Some(DeviceRef::Uuid(u.into())));
        assert_eq!(
            parse_device_id(&format!("{u}::3")),
            Some(DeviceRef::Uuid(u.into()))
        );
        let m = "MIG-4f06c904-75ca-4d7d-a0bb-51f2b99055b2";
        assert_eq!(parse_device_id(m), Some(DeviceRef::Uuid(m.into())));
        assert_eq!(parse_device_id("2"), Some(DeviceRef::Index(2)));
        assert_eq!(parse_device_id("1::0"), Some(DeviceRef::Index(1)));
        assert_eq!(parse_device_id("nvidia0/gi0"), Some(DeviceRef::Index(0)));
        assert_eq!(parse_device_id("nvidia3"), Some(DeviceRef::Index(3)));
        assert_eq!(parse_device_id("tpu-7"), None);
        assert!(is_gpu_resource("nvidia.com/gpu"));
        assert!(is_gpu_resource("nvidia.com/mig-1g.10gb"));
        assert!(!is_gpu_resource("cpu"));
    }

    fn mig(parent_minor: u32, profile_id: u32, placement_start: u32) -> Option<DeviceRef> {
        Some(DeviceRef::Mig {
            parent_minor,
            profile_id,
            placement_start,
        })
    }

    #[test]
    fn every_name_of_nvidias_dra_driver() {
        // A whole GPU, by its minor number.
        assert_eq!(parse_dra_device("gpu-0"), Some(DeviceRef::Minor(0)));
        assert_eq!(parse_dra_device("gpu-5"), Some(DeviceRef::Minor(5)));
        // v25.12 and later: the profile without dots, the GI profile id, the placement start.
        assert_eq!(parse_dra_device("gpu-0-mig-1g10gb-19-0"), mig(0, 19, 0));
        assert_eq!(parse_dra_device("gpu-1-mig-2g47gb-14-0"), mig(1, 14, 0));
        assert_eq!(parse_dra_device("gpu-0-mig-1g10gb-me-20-6"), mig(0, 20, 6));
        assert_eq!(parse_dra_device("gpu-3-mig-7g80gb-0-0"), mig(3, 0, 0));
        // v25.3 and v25.8: GI profile id, placement start, placement size. Read first: as
        // the newer form it would be profile "19", id 0, start 1.
        assert_eq!(parse_dra_device("gpu-0-mig-19-0-1"), mig(0, 19, 0));
        assert_eq!(parse_dra_device("gpu-2-mig-9-4-4"), mig(2, 9, 4));
        for not_ours in [
            "gpu-",
            "gpu-x",
            "gpu-+1",
            "gpu-0-mig-",
            "gpu-0-mig-19-0",
            "gpu-0-mig--19-0",
            "gpu-0-mig-1g10gb-19-x",
            "gpu-a-mig-1g10gb-19-0",
            "mig-0",
            "GPU-6663f2bc-da9f-4cff-88fe-d84cc95fe598",
            "cd-0",
        ] {
            assert_eq!(parse_dra_device(not_ours), None, "{not_ours}");
        }
    }
}
