//! Sharing and per-process accounting: the MPS process list and the accounting calls
//! (`mps_processes`, `accounting_mode`, `accounting` in docs/fake-nvml.md).
use std::ffi::{c_uint, c_ulonglong};

use crate::processes::{process_info, put_processes, ProcessInfo};
use crate::scenario::{AccountingSpec, Feature, ProcessSpec};
use crate::{
    guard, now_us, put, resolve, resolve_gpu, with_loaded, Device, Ret, INSUFFICIENT_SIZE,
    INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED, NVML_VALUE_NOT_AVAILABLE,
};

/// `nvmlAccountingStats_t` (nvml.h): 56 bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AccountingStats {
    gpu_utilization: c_uint,
    memory_utilization: c_uint,
    max_memory_usage: c_ulonglong,
    time: c_ulonglong,
    start_time: c_ulonglong,
    is_running: c_uint,
    reserved: [c_uint; 5],
}

const _: () = assert!(std::mem::size_of::<AccountingStats>() == 56);

const NVML_FEATURE_DISABLED: c_uint = 0;
const NVML_FEATURE_ENABLED: c_uint = 1;

/// MPS clients (and the server) with a compute context; MIG handles list none.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: Device,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    counted!(size_query = infos.is_null());
    let mut list = Vec::new();
    let ret = with_loaded(|l, _| {
        let t = resolve(l, device)?;
        if !t.dev.supports(Feature::MpsProcesses) {
            return Err(NOT_SUPPORTED);
        }
        if t.mig.is_none() {
            list.extend(t.dev.mps_processes.iter().map(|p| process_info(p, None)));
        }
        Ok(())
    });
    if ret != 0 {
        return ret;
    }
    guard(|| put_processes(&list, count, infos))
}

/// Accounting is per GPU; the driver does not support it on MIG devices nor with MIG on.
fn accounting_target(l: &crate::state::Loaded, device: Device) -> Result<crate::Target<'_>, Ret> {
    let t = resolve_gpu(l, device, Some(Feature::Accounting))?;
    if t.dev.mig_enabled() {
        return Err(NOT_SUPPORTED);
    }
    Ok(t)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAccountingMode(device: Device, mode: *mut c_uint) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = accounting_target(l, device)?;
        let on = if t.dev.accounting_mode {
            NVML_FEATURE_ENABLED
        } else {
            NVML_FEATURE_DISABLED
        };
        put(mode, on)
    })
}

/// Every process with a context (running) and every accounting record, each pid once.
fn accounting_pids(dev: &crate::scenario::DeviceSpec) -> Vec<c_uint> {
    let running = dev
        .processes
        .iter()
        .chain(&dev.graphics_processes)
        .chain(&dev.mps_processes)
        .map(|p| p.pid);
    let mut pids: Vec<c_uint> = vec![];
    for pid in running.chain(dev.accounting.iter().map(|a| a.pid)) {
        if !pids.contains(&pid) {
            pids.push(pid);
        }
    }
    pids
}

/// NOT_SUPPORTED while accounting mode is off, as documented for the real call.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAccountingPids(
    device: Device,
    count: *mut c_uint,
    pids: *mut c_uint,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = accounting_target(l, device)?;
        if !t.dev.accounting_mode {
            return Err(NOT_SUPPORTED);
        }
        if count.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let list = accounting_pids(t.dev);
        // SAFETY: non-null; nvml.h makes it a valid in/out count.
        let capacity = unsafe { *count } as usize;
        // SAFETY: as above.
        unsafe { *count = list.len() as c_uint };
        if list.is_empty() {
            return Ok(());
        }
        if pids.is_null() || capacity < list.len() {
            return Err(INSUFFICIENT_SIZE);
        }
        // SAFETY: the caller's array holds `capacity` >= len entries.
        unsafe { std::ptr::copy_nonoverlapping(list.as_ptr(), pids, list.len()) };
        Ok(())
    })
}

fn or_not_available(v: Option<u32>) -> c_uint {
    v.unwrap_or(NVML_VALUE_NOT_AVAILABLE as c_uint)
}

fn stats_of_record(a: &AccountingSpec) -> AccountingStats {
    let start = if a.start_time_us > 0 {
        a.start_time_us
    } else {
        now_us().saturating_sub(a.time_ms * 1000)
    };
    AccountingStats {
        gpu_utilization: or_not_available(a.gpu_util),
        memory_utilization: or_not_available(a.mem_util),
        max_memory_usage: a.max_memory.unwrap_or(NVML_VALUE_NOT_AVAILABLE),
        time: if a.running { 0 } else { a.time_ms },
        start_time: start,
        is_running: c_uint::from(a.running),
        reserved: [0; 5],
    }
}

/// A running process the record list does not name: what the driver says mid-life.
fn stats_of_running(p: &ProcessSpec) -> AccountingStats {
    AccountingStats {
        gpu_utilization: p.sm_util.unwrap_or(0),
        memory_utilization: p.mem_util.unwrap_or(0),
        max_memory_usage: p.used_memory.unwrap_or(NVML_VALUE_NOT_AVAILABLE),
        time: 0,
        start_time: now_us(),
        is_running: 1,
        reserved: [0; 5],
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAccountingStats(
    device: Device,
    pid: c_uint,
    stats: *mut AccountingStats,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = accounting_target(l, device)?;
        if !t.dev.accounting_mode {
            return Err(NOT_SUPPORTED);
        }
        let d = t.dev;
        if let Some(a) = d.accounting.iter().find(|a| a.pid == pid) {
            return put(stats, stats_of_record(a));
        }
        let running = d
            .processes
            .iter()
            .chain(&d.graphics_processes)
            .chain(&d.mps_processes)
            .find(|p| p.pid == pid);
        match running {
            Some(p) => put(stats, stats_of_running(p)),
            None => Err(NOT_FOUND),
        }
    })
}
