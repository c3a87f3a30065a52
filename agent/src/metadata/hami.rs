//! HAMi's per-container GPU quotas, from the environment HAMi's device plugin gives the
//! container (HAMi-core enforces them in the container's CUDA calls):
//! `CUDA_DEVICE_MEMORY_LIMIT` (every device), `CUDA_DEVICE_MEMORY_LIMIT_<i>` (the i-th
//! device the container sees, overriding the former), sizes in bytes or with a `k`, `m` or
//! `g` suffix (KiB, MiB, GiB); `CUDA_DEVICE_SM_LIMIT` (percent); and
//! `NVIDIA_VISIBLE_DEVICES`, whose order says which GPU is device i. Read from
//! /proc/PID/environ of GPU processes only.
use std::{collections::BTreeMap, path::Path};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HamiLimits {
    /// `CUDA_DEVICE_MEMORY_LIMIT`: every device.
    pub memory_all: Option<u64>,
    /// `CUDA_DEVICE_MEMORY_LIMIT_<i>`, by the container's device index.
    pub memory_by_index: BTreeMap<u32, u64>,
    /// `CUDA_DEVICE_SM_LIMIT`, percent.
    pub sm_percent: Option<u32>,
    /// `NVIDIA_VISIBLE_DEVICES`, in order (UUIDs under HAMi).
    pub visible: Vec<String>,
}

/// HAMi's size syntax: bytes, or a `k`/`m`/`g` suffix (binary units).
pub fn parse_size(v: &str) -> Option<u64> {
    let v = v.trim();
    let (digits, unit) = match v.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => (&v[..i], c.to_ascii_lowercase()),
        _ => (v, 'b'),
    };
    let n: u64 = digits.trim().parse().ok()?;
    let mul = match unit {
        'b' => 1,
        'k' => 1 << 10,
        'm' => 1 << 20,
        'g' => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mul)
}

impl HamiLimits {
    /// From an environment block (NUL-separated `K=V`); None without any HAMi limit.
    pub fn from_environ(env: &[u8]) -> Option<HamiLimits> {
        let mut l = HamiLimits::default();
        for var in env.split(|b| *b == 0) {
            let Ok(var) = std::str::from_utf8(var) else {
                continue;
            };
            let Some((k, v)) = var.split_once('=') else {
                continue;
            };
            match k {
                "CUDA_DEVICE_MEMORY_LIMIT" => l.memory_all = parse_size(v),
                "CUDA_DEVICE_SM_LIMIT" => l.sm_percent = v.trim().parse().ok(),
                "NVIDIA_VISIBLE_DEVICES" => {
                    l.visible = v.split(',').map(|s| s.trim().to_string()).collect();
                }
                _ => {
                    let index = k.strip_prefix("CUDA_DEVICE_MEMORY_LIMIT_");
                    if let (Some(i), Some(bytes)) =
                        (index.and_then(|i| i.parse().ok()), parse_size(v))
                    {
                        l.memory_by_index.insert(i, bytes);
                    }
                }
            }
        }
        let any = l.memory_all.is_some() || !l.memory_by_index.is_empty() || l.sm_percent.is_some();
        any.then_some(l)
    }

    /// /proc/PID/environ; None when it has no HAMi limit or cannot be read.
    pub fn of_process(proc_root: &Path, pid: u32) -> Option<HamiLimits> {
        let env = std::fs::read(proc_root.join(pid.to_string()).join("environ")).ok()?;
        HamiLimits::from_environ(&env)
    }

    /// The memory limit on device `uuid`: its index in NVIDIA_VISIBLE_DEVICES, or device 0
    /// when the process uses one device and the list does not name it (indexes, `all`).
    pub fn memory_for(&self, uuid: &str, only_device: bool) -> Option<u64> {
        let index = match self.visible.iter().position(|v| v == uuid) {
            Some(i) => i as u32,
            None if only_device => 0,
            None => return self.memory_all,
        };
        self.memory_by_index
            .get(&index)
            .copied()
            .or(self.memory_all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_the_per_device_override() {
        assert_eq!(parse_size("3000m"), Some(3000 << 20));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("1048576"), Some(1 << 20));
        assert_eq!(parse_size("12x"), None);
        assert_eq!(parse_size(""), None);
        let env = b"PATH=/bin\0NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b\0CUDA_DEVICE_MEMORY_LIMIT=1g\0CUDA_DEVICE_MEMORY_LIMIT_1=3000m\0CUDA_DEVICE_SM_LIMIT=40\0";
        let l = HamiLimits::from_environ(env).unwrap();
        assert_eq!(l.sm_percent, Some(40));
        assert_eq!(l.memory_for("GPU-a", false), Some(1 << 30));
        assert_eq!(l.memory_for("GPU-b", false), Some(3000 << 20));
        assert_eq!(l.memory_for("GPU-z", false), Some(1 << 30));
        let single = HamiLimits::from_environ(b"CUDA_DEVICE_MEMORY_LIMIT_0=500m\0").unwrap();
        assert_eq!(single.memory_for("GPU-x", true), Some(500 << 20));
        assert_eq!(single.memory_for("GPU-x", false), None);
        assert_eq!(HamiLimits::from_environ(b"PATH=/bin\0HOME=/\0"), None);
    }
}
