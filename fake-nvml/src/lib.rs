//! A fake `libnvidia-ml.so` driven by a JSON scenario file (docs/fake-nvml.md).
//!
//! It exports the NVML C functions that nvml-wrapper calls for gpu-agent, with
//! the real ABI: struct layouts, return codes and the INSUFFICIENT_SIZE protocol.
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
// Health fields, profiling and XID events (dcgm-exporter's fields).
mod events;
mod fields;
mod gpm;
// MIG profiles a GPU can be partitioned into.
mod mig_profiles;

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use scenario::{parse_bus_id, DeviceSpec, Feature, MigSpec, ProcessSpec, NO_INSTANCE};
use state::{InitError, Loaded};

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
    assert!(std::mem::size_of::<ProcessInfo>() == 24);
    assert!(std::mem::size_of::<ProcessUtilizationSample>() == 32);
    assert!(std::mem::size_of::<MemoryV2>() == 40);
    assert!(std::mem::size_of::<Memory>() == 24);
    assert!(std::mem::size_of::<PciInfo>() == 68);
};

/// NVML_STRUCT_VERSION(Memory, 2).
const MEMORY_V2_VERSION: c_uint = (std::mem::size_of::<MemoryV2>() as c_uint) | (2 << 24);

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

/// Writes one value through a caller's out-pointer.
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

fn process_info(p: &ProcessSpec, ids: Option<(u32, u32)>) -> ProcessInfo {
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
fn put_processes(list: &[ProcessInfo], count: *mut c_uint, infos: *mut ProcessInfo) -> Ret {
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

// ---- init / shutdown / system ----

fn init() -> Ret {
    guard(|| {
        let env = std::env::var_os(state::ENV_SCENARIO);
        match state::lock().init(env) {
            Ok(()) => SUCCESS,
            Err(InitError::NoScenario | InitError::DriverNotLoaded) => DRIVER_NOT_LOADED,
        }
    })
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> Ret {
    counted!();
    init()
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> Ret {
    counted!();
    init()
}

/// Flags only relax failures this fake never has, so they are ignored.
#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    counted!();
    init()
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> Ret {
    counted!();
    guard(|| {
        if state::lock().shutdown() {
            SUCCESS
        } else {
            UNINITIALIZED
        }
    })
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    counted!();
    let s: &'static CStr = match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt request issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"GPU access blocked by the operating system",
        18 => c"RM has detected an NVML/RM version mismatch",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        25 => c"Argument version mismatch",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    counted!();
    with_loaded(|l, _| put_str(version, length, &l.scenario.driver_version))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    counted!();
    with_loaded(|l, _| put_str(version, length, &l.scenario.nvml_version_string()))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> Ret {
    counted!();
    with_loaded(|l, _| put(version, l.scenario.cuda_version()))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> Ret {
    counted!();
    with_loaded(|l, _| put(version, l.scenario.cuda_version()))
}

// ---- device enumeration ----

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

// ---- identity ----

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

// ---- memory / utilization ----

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

// ---- processes ----

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: Device,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    counted!();
    running_processes(device, count, infos, false)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: Device,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    counted!();
    running_processes(device, count, infos, true)
}

// The _v2 entries share v3's 24-byte nvmlProcessInfo_v2_t.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: Device,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    counted!();
    running_processes(device, count, infos, false)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    device: Device,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    counted!();
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
    counted!();
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

// ---- power, thermals, clocks, health ----

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

// ---- MIG ----

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
