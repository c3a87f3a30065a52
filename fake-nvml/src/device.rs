//! Device queries: enumeration and handle look-ups, identity and PCI, memory and
//! utilization, power, thermals, clocks, ECC and throttle reasons.
use std::ffi::{c_char, c_uint, c_ulonglong};

use crate::scenario::{parse_bus_id, Feature};
use crate::{
    calls, fill_chars, find_by_index, gpu_handle, gpu_reading, hang, mig_handle, nvml_index, put,
    put_str, read_cstr, resolve, resolve_gpu, with_loaded, Device, Ret, Target,
    ARGUMENT_VERSION_MISMATCH, INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED, UNKNOWN,
};

#[repr(C)]
pub struct Memory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

#[repr(C)]
pub struct MemoryV2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

#[repr(C)]
pub struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

#[repr(C)]
pub struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

// Layouts checked against nvml.h (shared/TESTING.md).
const _: () = {
    assert!(std::mem::size_of::<MemoryV2>() == 40);
    assert!(std::mem::size_of::<Memory>() == 24);
    assert!(std::mem::size_of::<PciInfo>() == 68);
};

/// NVML_STRUCT_VERSION(Memory, 2).
const MEMORY_V2_VERSION: c_uint = (std::mem::size_of::<MemoryV2>() as c_uint) | (2 << 24);

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    counted!();
    device_count(count)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> Ret {
    counted!();
    device_count(count)
}

/// A sampler's cycle starts here: the call counts are written (FAKE_NVML_CALLS).
fn device_count(count: *mut c_uint) -> Ret {
    calls::write();
    with_loaded(|l, _| put(count, l.scenario.devices.len() as c_uint))
}

/// Handles of lost GPUs are still handed out; calls on them then fail.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut Device) -> Ret {
    counted!();
    handle_by_index(index, device)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut Device) -> Ret {
    counted!();
    handle_by_index(index, device)
}

fn handle_by_index(index: c_uint, device: *mut Device) -> Ret {
    with_loaded(|l, _| {
        find_by_index(l, index).ok_or(INVALID_ARGUMENT)?;
        hang::device(l, index)?;
        put(device, gpu_handle(index))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut Device,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let uuid = read_cstr(uuid)?;
        for (pos, d) in l.scenario.devices.iter().enumerate() {
            let index = nvml_index(pos, d);
            if d.uuid == uuid {
                hang::device(l, index)?;
                return put(device, gpu_handle(index));
            }
            if let Some(m) = d.mig_devices.iter().find(|m| m.uuid == uuid) {
                hang::device(l, index)?;
                return put(device, mig_handle(index, m));
            }
        }
        Err(NOT_FOUND)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    pci_bus_id: *const c_char,
    device: *mut Device,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let wanted = parse_bus_id(read_cstr(pci_bus_id)?).ok_or(INVALID_ARGUMENT)?;
        l.scenario
            .devices
            .iter()
            .enumerate()
            .map(|(pos, d)| nvml_index(pos, d))
            .zip(&l.scenario.devices)
            .find(|(index, d)| parse_bus_id(&d.bus_id(*index)) == Some(wanted))
            .map_or(Err(NOT_FOUND), |(index, _)| {
                hang::device(l, index)?;
                put(device, gpu_handle(index))
            })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: Device,
    uuid: *mut c_char,
    length: c_uint,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve(l, device)?;
        let s = t.mig.map_or(t.dev.uuid.as_str(), |(_, m)| m.uuid.as_str());
        put_str(uuid, length, s)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: Device,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve(l, device)?;
        let s = match t.mig {
            None => t.dev.name.clone(),
            Some((_, m)) => m
                .name
                .clone()
                .unwrap_or_else(|| format!("{} MIG", t.dev.name)),
        };
        put_str(name, length, &s)
    })
}

/// On a MIG handle: its index under the parent, as the real driver does.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: Device, index: *mut c_uint) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve(l, device)?;
        put(index, t.mig.map_or(t.index, |(mpos, _)| mpos))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(device: Device, minor: *mut c_uint) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve_gpu(l, device, None)?;
        put(minor, t.dev.minor_number.unwrap_or(t.index))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(device: Device, pci: *mut PciInfo) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve_gpu(l, device, Some(Feature::Pci))?;
        let bus_id = t.dev.bus_id(t.index);
        let (domain, bus, dev, func) = parse_bus_id(&bus_id).ok_or(UNKNOWN)?;
        let legacy = format!("{:04x}:{bus:02x}:{dev:02x}.{func:x}", domain & 0xFFFF);
        put(
            pci,
            PciInfo {
                bus_id_legacy: fill_chars(&legacy.to_uppercase()),
                domain,
                bus,
                device: dev,
                pci_device_id: t.dev.pci_device_id,
                pci_sub_system_id: t.dev.pci_subsystem_id,
                bus_id: fill_chars(&bus_id),
            },
        )
    })
}

/// (total, reserved, used) for a GPU or MIG handle.
fn memory(t: &Target) -> Result<(u64, u64, u64), Ret> {
    if !t.dev.supports(Feature::Memory) {
        return Err(NOT_SUPPORTED);
    }
    Ok(match t.mig {
        None => (t.dev.memory_total, t.dev.memory_reserved, t.dev.used()),
        Some((_, m)) => (m.memory_total, 0, m.used()),
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: Device,
    memory_out: *mut MemoryV2,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve(l, device)?;
        if memory_out.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller sets `version` before the call.
        if unsafe { (*memory_out).version } != MEMORY_V2_VERSION {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let (total, reserved, used) = memory(&t)?;
        put(
            memory_out,
            MemoryV2 {
                version: MEMORY_V2_VERSION,
                total,
                reserved,
                free: total.saturating_sub(reserved).saturating_sub(used),
                used,
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: Device, memory_out: *mut Memory) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let (total, reserved, used) = memory(&resolve(l, device)?)?;
        // v1 counts reserved memory as used.
        let used = used.saturating_add(reserved);
        put(
            memory_out,
            Memory {
                total,
                free: total.saturating_sub(used),
                used,
            },
        )
    })
}

/// Not supported on MIG handles nor on MIG-enabled GPUs (nvidia-smi shows N/A).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: Device,
    util: *mut Utilization,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve_gpu(l, device, Some(Feature::Utilization))?;
        if t.dev.mig_enabled() {
            return Err(NOT_SUPPORTED);
        }
        put(
            util,
            Utilization {
                gpu: t.dev.utilization_gpu,
                memory: t.dev.utilization_memory,
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(device: Device, power: *mut c_uint) -> Ret {
    counted!();
    gpu_reading(device, Feature::PowerUsage, power, |d| d.power_mw)
}

/// Grows by `power_mw` x time since load (see `energy_grows`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: Device,
    energy: *mut c_ulonglong,
) -> Ret {
    counted!();
    with_loaded(|l, now| {
        let t = resolve_gpu(l, device, Some(Feature::Energy))?;
        put(energy, l.energy_at(t.pos, now))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: Device,
    sensor: c_uint,
    temp: *mut c_uint,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve_gpu(l, device, Some(Feature::Temperature))?;
        if sensor != 0 {
            return Err(INVALID_ARGUMENT);
        }
        put(temp, t.dev.temperature_c)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: Device,
    clock_type: c_uint,
    clock: *mut c_uint,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve_gpu(l, device, Some(Feature::Clocks))?;
        let d = t.dev;
        let mhz = match clock_type {
            0 => d.graphics_clock_mhz.unwrap_or(d.sm_clock_mhz),
            1 => d.sm_clock_mhz,
            2 => d.mem_clock_mhz,
            3 => d.video_clock_mhz.unwrap_or(d.sm_clock_mhz),
            _ => return Err(INVALID_ARGUMENT),
        };
        put(clock, mhz)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: Device,
    error_type: c_uint,
    counter_type: c_uint,
    count: *mut c_ulonglong,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve_gpu(l, device, Some(Feature::Ecc))?;
        let counter = match error_type {
            0 => t.dev.ecc_corrected,
            1 => t.dev.ecc_uncorrected,
            _ => return Err(INVALID_ARGUMENT),
        };
        let aggregate = match counter_type {
            0 => false,
            1 => true,
            _ => return Err(INVALID_ARGUMENT),
        };
        put(count, counter.get(aggregate))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: Device,
    reasons: *mut c_ulonglong,
) -> Ret {
    counted!();
    throttle_reasons(device, reasons)
}

/// The newer name of the same query.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    device: Device,
    reasons: *mut c_ulonglong,
) -> Ret {
    counted!();
    throttle_reasons(device, reasons)
}

fn throttle_reasons(device: Device, reasons: *mut c_ulonglong) -> Ret {
    gpu_reading(device, Feature::Throttle, reasons, |d| d.throttle_reasons)
}
