//! MIG device handles: the mode, the MIG devices under a GPU and their instance ids.
use std::ffi::c_uint;

use crate::scenario::{DeviceSpec, Feature};
use crate::{
    gpu_handle, gpu_reading, mig_handle, put, resolve, resolve_gpu, with_loaded, Device, Ret,
    INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED,
};

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: Device,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve_gpu(l, device, Some(Feature::Mig))?;
        if current.is_null() || pending.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let mode = c_uint::from(t.dev.mig_enabled());
        put(current, mode)?;
        put(pending, mode)
    })
}

/// Zero when MIG is disabled, as documented for the real call.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(device: Device, count: *mut c_uint) -> Ret {
    counted!();
    gpu_reading(device, Feature::Mig, count, DeviceSpec::max_migs)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: Device,
    index: c_uint,
    mig_device: *mut Device,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve_gpu(l, device, Some(Feature::Mig))?;
        if index >= t.dev.max_migs() {
            return Err(INVALID_ARGUMENT);
        }
        let m = t.dev.mig_devices.get(index as usize).ok_or(NOT_FOUND)?;
        put(mig_device, mig_handle(t.index, m))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(device: Device, is_mig: *mut c_uint) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve(l, device)?;
        put(is_mig, c_uint::from(t.mig.is_some()))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(device: Device, id: *mut c_uint) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let (_, m) = resolve(l, device)?.mig.ok_or(NOT_SUPPORTED)?;
        put(id, m.gpu_instance_id)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(device: Device, id: *mut c_uint) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let (_, m) = resolve(l, device)?.mig.ok_or(NOT_SUPPORTED)?;
        put(id, m.compute_instance_id)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: Device,
    device: *mut Device,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve(l, mig_device)?;
        if t.mig.is_none() {
            return Err(INVALID_ARGUMENT);
        }
        put(device, gpu_handle(t.index))
    })
}
