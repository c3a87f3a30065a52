//! A fake `libnvidia-ml.so` driven by a JSON scenario file (docs/fake-nvml.md).
//!
//! It exports the NVML C functions that nvml-wrapper calls for gpu-agent, with
//! the real ABI: struct layouts, return codes and the INSUFFICIENT_SIZE protocol.
//!
//! This file holds the return codes, the device handle encoding and the helpers every
//! export shares (resolving a handle, running on the loaded scenario, writing through
//! the caller's pointers); the exports live in the modules by area.
// Exported names must match nvml.h; their safety contract is nvml.h's.
#![allow(non_snake_case, clippy::missing_safety_doc)]
#![warn(unsafe_op_in_unsafe_fn)]

// First: its `counted!` macro is used by every module below.
#[macro_use]
mod hang;
mod calls;
mod cost;
mod scenario;
mod sharing;
mod state;
// The core NVML calls.
mod device;
mod mig;
mod processes;
mod system;
// Health fields, profiling and XID events (dcgm-exporter's fields).
mod events;
mod fields;
mod gpm;
// MIG profiles a GPU can be partitioned into, and its GPU instances.
mod gpu_instance;
mod mig_profiles;

use std::ffi::{c_char, c_uint, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use scenario::{DeviceSpec, Feature, MigSpec};
use state::Loaded;

type Ret = c_uint;
type Device = *mut c_void;

const SUCCESS: Ret = 0;
const UNINITIALIZED: Ret = 1;
const INVALID_ARGUMENT: Ret = 2;
const NOT_SUPPORTED: Ret = 3;
const NOT_FOUND: Ret = 6;
const INSUFFICIENT_SIZE: Ret = 7;
const DRIVER_NOT_LOADED: Ret = 9;
const GPU_IS_LOST: Ret = 15;
const ARGUMENT_VERSION_MISMATCH: Ret = 25;
const UNKNOWN: Ret = 999;

const NVML_VALUE_NOT_AVAILABLE: u64 = u64::MAX;

// Handles are tagged integers, not pointers: stable across scenario reloads,
// and a MIG handle names its parent index and gpu/compute instance ids.
// Layout: 0x4E << 24 | nvml index << 16 | (gpu instance id + 1) << 8 | compute instance id.
const HANDLE_TAG: usize = 0x4E;

fn gpu_handle(index: u32) -> Device {
    std::ptr::without_provenance_mut(HANDLE_TAG << 24 | (index as usize) << 16)
}

fn mig_handle(index: u32, m: &MigSpec) -> Device {
    std::ptr::without_provenance_mut(
        HANDLE_TAG << 24
            | (index as usize) << 16
            | (m.gpu_instance_id as usize + 1) << 8
            | m.compute_instance_id as usize,
    )
}

/// (nvml index, Some((gpu instance id, compute instance id)) for MIG handles).
fn decode_handle(h: Device) -> Option<(u32, Option<(u32, u32)>)> {
    let v = h.addr();
    if v >> 24 != HANDLE_TAG {
        return None;
    }
    let index = ((v >> 16) & 0xFF) as u32;
    let gi = ((v >> 8) & 0xFF) as u32;
    let ci = (v & 0xFF) as u32;
    match gi {
        0 if ci == 0 => Some((index, None)),
        0 => None,
        _ => Some((index, Some((gi - 1, ci)))),
    }
}

fn nvml_index(pos: usize, d: &DeviceSpec) -> u32 {
    d.index.unwrap_or(pos as u32)
}

fn find_by_index(l: &Loaded, index: u32) -> Option<(usize, &DeviceSpec)> {
    l.scenario
        .devices
        .iter()
        .enumerate()
        .find(|(pos, d)| nvml_index(*pos, d) == index)
}

/// A resolved device handle.
struct Target<'a> {
    pos: usize,
    index: u32,
    dev: &'a DeviceSpec,
    /// MIG position under the parent and the MIG device itself.
    mig: Option<(u32, &'a MigSpec)>,
}

/// Resolves a handle; every call on a lost GPU (or its MIG devices) fails, and one the
/// scenario hangs on the GPU is `hang::BLOCKED`.
fn resolve(l: &Loaded, h: Device) -> Result<Target<'_>, Ret> {
    let (index, mig_ids) = decode_handle(h).ok_or(INVALID_ARGUMENT)?;
    let (pos, dev) = find_by_index(l, index).ok_or(INVALID_ARGUMENT)?;
    hang::device(l, index)?;
    let mig = match mig_ids {
        None => None,
        Some((gi, ci)) => {
            let (mpos, m) = dev
                .mig_devices
                .iter()
                .enumerate()
                .find(|(_, m)| m.gpu_instance_id == gi && m.compute_instance_id == ci)
                .ok_or(INVALID_ARGUMENT)?;
            Some((mpos as u32, m))
        }
    };
    if dev.lost {
        return Err(GPU_IS_LOST);
    }
    Ok(Target {
        pos,
        index,
        dev,
        mig,
    })
}

/// Resolves a handle for a whole-GPU query that MIG device handles do not support.
fn resolve_gpu(l: &Loaded, h: Device, feature: Option<Feature>) -> Result<Target<'_>, Ret> {
    let t = resolve(l, h)?;
    if t.mig.is_some() || feature.is_some_and(|f| !t.dev.supports(f)) {
        return Err(NOT_SUPPORTED);
    }
    Ok(t)
}

fn guard(f: impl FnOnce() -> Ret) -> Ret {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(UNKNOWN)
}

/// Runs `f` on the current scenario, after picking up edits to its file. While `f`
/// answers `hang::BLOCKED` (the scenario hangs the call), sleeps without the lock and
/// runs it again, so `f` must not act before it resolves its device.
fn with_loaded(mut f: impl FnMut(&Loaded, Instant) -> Result<(), Ret>) -> Ret {
    guard(|| loop {
        let mut st = state::lock();
        if !st.initialized() {
            return UNINITIALIZED;
        }
        let now = Instant::now();
        st.refresh(now);
        let Some(l) = st.loaded() else {
            return UNINITIALIZED;
        };
        match f(l, now) {
            Err(hang::BLOCKED) => {
                drop(st);
                std::thread::sleep(hang::STEP);
            }
            r => return r.err().unwrap_or(SUCCESS),
        }
    })
}

/// A physical GPU's reading behind `feature`, written to `out`.
fn gpu_reading<T>(
    device: Device,
    feature: Feature,
    out: *mut T,
    read: impl Fn(&DeviceSpec) -> T,
) -> Ret {
    with_loaded(|l, _| {
        let t = resolve_gpu(l, device, Some(feature))?;
        put(out, read(t.dev))
    })
}

/// Writes one value through a caller's out-pointer.
fn put<T>(out: *mut T, v: T) -> Result<(), Ret> {
    if out.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null; nvml.h makes the caller pass a valid, writable T.
    unsafe { out.write(v) };
    Ok(())
}

/// Copies `s` and a NUL into a caller buffer of `len` bytes.
fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), Ret> {
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    if s.len() + 1 > len as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: the caller's buffer holds `len` bytes, checked above to be enough.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, s.len());
        buf.add(s.len()).write(0);
    }
    Ok(())
}

/// Fills a fixed C char array, truncating like strncpy (always NUL-terminated).
fn fill_chars<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (dst, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *dst = b as c_char;
    }
    out
}

fn read_cstr<'a>(p: *const c_char) -> Result<&'a str, Ret> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null; nvml.h makes the caller pass a NUL-terminated string.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| INVALID_ARGUMENT)
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip() {
        let m: MigSpec = serde_json::from_str(
            r#"{"uuid":"MIG-x","gpu_instance_id":13,"compute_instance_id":2,"memory_total":1}"#,
        )
        .unwrap();
        assert_eq!(decode_handle(gpu_handle(7)), Some((7, None)));
        assert_eq!(
            decode_handle(mig_handle(255, &m)),
            Some((255, Some((13, 2))))
        );
        assert_eq!(decode_handle(std::ptr::null_mut()), None);
        assert!(!gpu_handle(0).is_null());
    }

    #[test]
    fn put_str_needs_room_for_nul() {
        let mut buf = [1 as c_char; 4];
        assert_eq!(put_str(buf.as_mut_ptr(), 4, "abcd"), Err(INSUFFICIENT_SIZE));
        assert_eq!(put_str(buf.as_mut_ptr(), 4, "abc"), Ok(()));
        assert_eq!(buf, [97, 98, 99, 0]);
    }

    #[test]
    fn scenario_validation() {
        let bad = [
            r#"{"devices":[{"uuid":"GPU-a"},{"uuid":"GPU-a"}]}"#,
            r#"{"devices":[{"uuid":"GPU-a","index":3}]}"#,
            r#"{"devices":[{"uuid":"GPU-a","unsupported":["bogus"]}]}"#,
            r#"{"devices":[{"uuid":"GPU-a","typo":1}]}"#,
            r#"{"devices":[{"uuid":"GPU-a","mig_mode":false,
                "mig_devices":[{"uuid":"MIG-a","gpu_instance_id":1,"memory_total":1}]}]}"#,
            r#"{"devices":[{"uuid":"GPU-a","mig_profiles":[
                {"profile":17,"id":0,"name":"MIG 7g.80gb","slices":7,"memory_mib":1}]}]}"#,
            r#"{"devices":[{"uuid":"GPU-a","mig_profiles":[
                {"profile":0,"id":19,"name":"MIG 1g.10gb","slices":1,"memory_mib":1},
                {"profile":0,"id":20,"name":"MIG 1g.10gb+me","slices":1,"memory_mib":1}]}]}"#,
            r#"{"devices":[{"uuid":"GPU-a","mig_profiles":[
                {"profile":0,"id":19,"name":"MIG 1g.10gb","memory_mib":1}]}]}"#,
        ];
        for text in bad {
            assert!(scenario::Scenario::parse(text).is_err(), "{text}");
        }
        let s = scenario::Scenario::parse(
            r#"{"driver_version":"550.54.15","devices":[{"uuid":"GPU-a",
               "ecc_corrected":{"volatile":1,"aggregate":5},"unsupported":["power"],
               "pci_device_id":"0x233010DE","throttle_reasons":"0x4"}]}"#,
        )
        .unwrap();
        assert_eq!(s.cuda_version(), 12040);
        assert_eq!(s.nvml_version_string(), "12.550.54.15");
        assert_eq!(s.devices[0].ecc_corrected.get(true), 5);
        assert!(!s.devices[0].supports(Feature::PowerUsage));
        assert_eq!(s.devices[0].pci_device_id, 0x2330_10DE);
        assert_eq!(s.devices[0].throttle_reasons, 4);
        for f in [
            "h100-8gpu.json",
            "h100-8gpu-mig.json",
            "a100-mig.json",
            "timesliced.json",
            "mps.json",
        ] {
            let path = format!("{}/../tests/scenarios/{f}", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).unwrap();
            scenario::Scenario::parse(&text).unwrap_or_else(|e| panic!("{f}: {e}"));
        }
    }
}
