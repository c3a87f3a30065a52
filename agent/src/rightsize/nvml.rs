//! This node's GPU models and the MIG profiles their driver lists
//! (`nvmlDeviceGetGpuInstanceProfileInfoV`, for each NVML_GPU_INSTANCE_PROFILE_* index) with
//! where each may be placed (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`), read on a
//! thread of their own: a wedged driver blocks the call, not the command.
use std::{mem, path::PathBuf, sync::mpsc, time::Duration};

use nvml_wrapper::{error::NvmlError, Device, Nvml};
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_v2_t,
    nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT as INVALID_ARGUMENT,
    nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED as NOT_SUPPORTED, nvmlReturn_enum_NVML_SUCCESS as OK,
    NVML_GPU_INSTANCE_PROFILE_COUNT,
};

use super::profiles::{MigProfile, NvmlModel, Placement};
use crate::gpu::nvml::{describe_init_error, open};

/// nvmlGpuInstanceProfileInfo_v2: NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2).
const INFO_V2: u32 = (mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32) | (2 << 24);

/// Every GPU model on this node (one entry per name and memory size) with its MIG
/// profiles; `Err` says why there is nothing to say (no NVML, no answer within `timeout`).
pub fn read(lib_path: Option<PathBuf>, timeout: Duration) -> Result<Vec<NvmlModel>, String> {
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("nvml-profiles".into())
        .spawn(move || {
            let _ = tx.send(read_now(lib_path));
        });
    if let Err(e) = spawned {
        return Err(format!("starting the NVML thread: {e}"));
    }
    // A call that never returns keeps its thread; the command goes on without it.
    match rx.recv_timeout(timeout) {
        Ok(r) => r,
        Err(_) => Err(format!(
            "NVML did not answer within {} s (a wedged driver?)",
            timeout.as_secs()
        )),
    }
}

fn read_now(lib_path: Option<PathBuf>) -> Result<Vec<NvmlModel>, String> {
    let nvml =
        open(lib_path.as_deref()).map_err(|e| describe_init_error(&e, lib_path.as_deref()))?;
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML device count: {e}"))?;
    let mut models: Vec<NvmlModel> = vec![];
    for i in 0..count {
        let Ok(dev) = nvml.device_by_index(i) else {
            continue;
        };
        let (Ok(name), Ok(memory)) = (dev.name(), dev.memory_info()) else {
            continue;
        };
        if models
            .iter()
            .any(|m| m.name == name && m.memory_bytes == memory.total)
        {
            continue;
        }
        let (profiles, error) = match profiles(&nvml, &dev) {
            Ok(p) => (p, None),
            Err(e) => (vec![], Some(e.to_string())),
        };
        models.push(NvmlModel {
            name,
            memory_bytes: memory.total,
            profiles,
            error,
        });
    }
    Ok(models)
}

/// The profiles the driver lists for `dev`: an index it answers NOT_SUPPORTED or
/// INVALID_ARGUMENT for is one this GPU does not have (all of them on a GPU without MIG).
/// The driver lists them whatever the MIG mode (`nvidia-smi mig -lgip` does on an H200
/// with MIG off).
fn profiles(nvml: &Nvml, dev: &Device) -> Result<Vec<MigProfile>, NvmlError> {
    let Ok(f) = nvml.lib().nvmlDeviceGetGpuInstanceProfileInfoV.as_ref() else {
        // A driver older than the versioned call lists nothing here; the table serves.
        return Ok(vec![]);
    };
    let mut out = vec![];
    for index in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
        // SAFETY: a plain C struct; all-zero is a valid value.
        let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { mem::zeroed() };
        info.version = INFO_V2;
        // SAFETY: a live handle from this library; a valid out-pointer with its version set.
        let ret = unsafe { f(dev.handle(), index, &mut info) };
        match ret {
            OK => {}
            NOT_SUPPORTED | INVALID_ARGUMENT => continue,
            other => return Err(nvml_error(other)),
        }
        let name: Vec<u8> = (info.name.iter())
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        let name = String::from_utf8_lossy(&name);
        out.push(MigProfile {
            name: name.trim_start_matches("MIG ").trim().to_string(),
            slices: info.sliceCount,
            memory_mib: info.memorySizeMB,
            // SAFETY: the handle of a device this library gave, used while it lives.
            placements: placements(nvml, unsafe { dev.handle() }, info.id),
        });
    }
    out.sort_by(|a, b| (a.slices, a.memory_mib, &a.name).cmp(&(b.slices, b.memory_mib, &b.name)));
    Ok(out)
}

/// Where instances of the profile with id `id` may sit: asked for the count, then for that
/// many. Empty where the driver does not say (an older driver, NOT_SUPPORTED): the table's
/// placements serve then.
fn placements(nvml: &Nvml, dev: nvmlDevice_t, id: u32) -> Vec<Placement> {
    let Ok(f) = nvml
        .lib()
        .nvmlDeviceGetGpuInstancePossiblePlacements_v2
        .as_ref()
    else {
        return vec![];
    };
    let mut count: u32 = 0;
    // SAFETY: a live handle; NULL placements asks for the count only (nvml.h).
    if unsafe { f(dev, id, std::ptr::null_mut(), &mut count) } != OK || count == 0 {
        return vec![];
    }
    let empty = nvmlGpuInstancePlacement_t { start: 0, size: 0 };
    let mut buf = vec![empty; count as usize];
    // SAFETY: a buffer of `count` placements, and `count` saying so.
    if unsafe { f(dev, id, buf.as_mut_ptr(), &mut count) } != OK {
        return vec![];
    }
    buf.truncate(count as usize);
    let mut out: Vec<Placement> = (buf.iter())
        .map(|p| Placement {
            start: p.start,
            size: p.size,
        })
        .collect();
    out.sort();
    out
}

fn nvml_error(code: u32) -> NvmlError {
    nvml_wrapper::error::nvml_try(code)
        .err()
        .unwrap_or(NvmlError::Unknown)
}
