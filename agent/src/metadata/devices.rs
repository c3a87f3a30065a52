//! Device ids as the kubelet hands them out, a device plugin's or a DRA driver's, parsed
//! into the `DeviceRef` the join matches NVML's devices by. No sockets here: the
//! pod-resources listing and `Allocation` both parse with it.
use gpu_model::Name;

/// Is this an NVIDIA GPU resource (whole GPUs, MIG profiles, shared replicas)?
pub fn is_gpu_resource(name: &str) -> bool {
    name.starts_with("nvidia.com/")
}

/// A device id as the join can match it: a UUID (`GPU-…`/`MIG-…`), an NVML index, or the
/// minor number (/dev/nvidiaN) the NVIDIA DRA driver names GPUs by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceRef {
    Uuid(Name),
    Index(u32),
    Minor(u32),
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

/// `gpu-3` -> 3.
pub fn parse_dra_minor(name: &str) -> Option<u32> {
    name.strip_prefix("gpu-")?.parse().ok()
}

/// A DRA device id as stored in an allocation: a UUID or `gpu-<minor>`.
pub fn parse_dra_device(id: &str) -> Option<DeviceRef> {
    if id.starts_with("GPU-") || id.starts_with("MIG-") {
        return Some(DeviceRef::Uuid(id.into()));
    }
    parse_dra_minor(id).map(DeviceRef::Minor)
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
}
