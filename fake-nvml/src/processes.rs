//! Process lists (compute and graphics, MIG-aware) and per-process utilization samples.
use std::ffi::{c_uint, c_ulonglong};

use crate::scenario::{Feature, MigSpec, ProcessSpec, NO_INSTANCE};
use crate::{
    cost, guard, now_us, resolve, with_loaded, Device, Ret, INSUFFICIENT_SIZE, INVALID_ARGUMENT,
    NOT_FOUND, NOT_SUPPORTED, NVML_VALUE_NOT_AVAILABLE, SUCCESS,
};

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

#[repr(C)]
pub struct ProcessUtilizationSample {
    pid: c_uint,
    time_stamp: c_ulonglong,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

// Layouts checked against nvml.h (shared/TESTING.md).
const _: () = {
    assert!(std::mem::size_of::<ProcessInfo>() == 24);
    assert!(std::mem::size_of::<ProcessUtilizationSample>() == 32);
};

pub(crate) fn process_info(p: &ProcessSpec, ids: Option<(u32, u32)>) -> ProcessInfo {
    let (gi, ci) = ids.unwrap_or((NO_INSTANCE, NO_INSTANCE));
    ProcessInfo {
        pid: p.pid,
        used_gpu_memory: p.used_memory.unwrap_or(NVML_VALUE_NOT_AVAILABLE),
        gpu_instance_id: p.gpu_instance_id.unwrap_or(gi),
        compute_instance_id: p.compute_instance_id.unwrap_or(ci),
    }
}

fn mig_processes(m: &MigSpec) -> impl Iterator<Item = ProcessInfo> + '_ {
    let ids = Some((m.gpu_instance_id, m.compute_instance_id));
    m.processes.iter().map(move |p| process_info(p, ids))
}

/// The size-query-then-fill protocol shared by the process list calls.
pub(crate) fn put_processes(
    list: &[ProcessInfo],
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    if count.is_null() {
        return INVALID_ARGUMENT;
    }
    let n = list.len();
    // SAFETY: non-null; nvml.h makes it a valid in/out count.
    let capacity = unsafe { *count } as usize;
    let fits = !infos.is_null() && capacity >= n;
    // SAFETY: as above.
    unsafe { *count = n as c_uint };
    if n == 0 {
        return SUCCESS;
    }
    if !fits {
        return INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller's array holds `capacity` >= n entries.
    unsafe { std::ptr::copy_nonoverlapping(list.as_ptr(), infos, n) };
    SUCCESS
}

fn running_processes(
    device: Device,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
    graphics: bool,
) -> Ret {
    let mut list = Vec::new();
    let ret = with_loaded(|l, _| {
        let t = resolve(l, device)?;
        let feature = if graphics {
            Feature::GraphicsProcesses
        } else {
            Feature::Processes
        };
        if !t.dev.supports(feature) {
            return Err(NOT_SUPPORTED);
        }
        match (t.mig, graphics) {
            // MIG does not run graphics work.
            (Some(_), true) => {}
            (Some((_, m)), false) => list.extend(mig_processes(m)),
            (None, true) => list.extend(
                t.dev
                    .graphics_processes
                    .iter()
                    .map(|p| process_info(p, None)),
            ),
            // A MIG-enabled parent lists its MIG devices' processes too, with
            // their instance ids, as the driver does for privileged callers.
            (None, false) => {
                list.extend(t.dev.processes.iter().map(|p| process_info(p, None)));
                for m in &t.dev.mig_devices {
                    list.extend(mig_processes(m));
                }
            }
        }
        Ok(())
    });
    if ret != SUCCESS {
        return ret;
    }
    if !graphics && !infos.is_null() && cost::on() {
        cost::spend(cost::PER_PROCESS_US * list.len() as u64);
    }
    guard(|| put_processes(&list, count, infos))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: Device,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    counted!(size_query = infos.is_null());
    running_processes(device, count, infos, false)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: Device,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    counted!(size_query = infos.is_null());
    running_processes(device, count, infos, true)
}

// The _v2 entries share v3's 24-byte nvmlProcessInfo_v2_t.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: Device,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    counted!(size_query = infos.is_null());
    running_processes(device, count, infos, false)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    device: Device,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    counted!(size_query = infos.is_null());
    running_processes(device, count, infos, true)
}

/// One sample per process that has utilization values, stamped "now", when now
/// is past `last_seen`; otherwise NOT_FOUND, which NVML uses for "no samples".
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: Device,
    utilization: *mut ProcessUtilizationSample,
    count: *mut c_uint,
    last_seen: c_ulonglong,
) -> Ret {
    counted!(size_query = utilization.is_null());
    with_loaded(|l, _| {
        let t = resolve(l, device)?;
        // The driver has no per-process utilization under MIG.
        if t.mig.is_some() || t.dev.mig_enabled() || !t.dev.supports(Feature::ProcessUtilization) {
            return Err(NOT_SUPPORTED);
        }
        if count.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let now = now_us();
        let mut samples: Vec<ProcessUtilizationSample> = Vec::new();
        let d = t.dev;
        for p in d
            .processes
            .iter()
            .chain(&d.graphics_processes)
            .chain(&d.mps_processes)
        {
            if p.has_utilization() && !samples.iter().any(|s| s.pid == p.pid) {
                samples.push(ProcessUtilizationSample {
                    pid: p.pid,
                    time_stamp: now,
                    sm_util: p.sm_util.unwrap_or(0),
                    mem_util: p.mem_util.unwrap_or(0),
                    enc_util: p.enc_util.unwrap_or(0),
                    dec_util: p.dec_util.unwrap_or(0),
                });
            }
        }
        // SAFETY: non-null; nvml.h makes it a valid in/out count.
        let capacity = unsafe { *count } as usize;
        if samples.is_empty() || now <= last_seen {
            // SAFETY: as above.
            unsafe { *count = 0 };
            return Err(NOT_FOUND);
        }
        let n = samples.len();
        // SAFETY: as above.
        unsafe { *count = n as c_uint };
        if utilization.is_null() || capacity < n {
            return Err(INSUFFICIENT_SIZE);
        }
        // SAFETY: the caller's array holds `capacity` >= n samples.
        unsafe { std::ptr::copy_nonoverlapping(samples.as_ptr(), utilization, n) };
        Ok(())
    })
}
