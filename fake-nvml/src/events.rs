//! NVML's event API for critical XID errors: event sets, registration per device, and
//! `nvmlEventSetWait_v2` delivering the scenario's `xid_events` when they are due.
use std::collections::{HashMap, HashSet};
use std::ffi::{c_uint, c_ulonglong, c_void};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::scenario::Feature;
use crate::state::Loaded;
use crate::{gpu_handle, guard, put, resolve_gpu, state, with_loaded, Device, Ret};
use crate::{INVALID_ARGUMENT, SUCCESS, UNINITIALIZED};

const TIMEOUT: Ret = 10;
/// nvmlEventTypeXidCriticalError.
pub const XID_CRITICAL_ERROR: u64 = 0x8;
/// What the fake's devices can deliver: XIDs, plus the ECC and P-state bits real GPUs
/// list (never delivered here).
const SUPPORTED_EVENTS: u64 = 0x1 | 0x2 | 0x4 | XID_CRITICAL_ERROR;
const NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// nvmlEventData_t: 32 bytes.
#[repr(C)]
pub struct EventData {
    device: Device,
    event_type: c_ulonglong,
    event_data: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

const _: () = assert!(std::mem::size_of::<EventData>() == 32);

/// One event: its device, code, delay, and when it first appeared.
type EventKey = (String, u64, u64, Instant);

#[derive(Default)]
struct EventSet {
    /// (nvml index, event type mask) per registration.
    registered: Vec<(u32, u64)>,
    delivered: HashSet<EventKey>,
}

static SETS: Mutex<Option<HashMap<usize, EventSet>>> = Mutex::new(None);

fn sets() -> MutexGuard<'static, Option<HashMap<usize, EventSet>>> {
    SETS.lock().unwrap_or_else(PoisonError::into_inner)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut *mut c_void) -> Ret {
    counted!();
    guard(|| {
        if !state::lock().initialized() {
            return UNINITIALIZED;
        }
        let handle = Box::into_raw(Box::new(0u8)).cast::<c_void>();
        sets()
            .get_or_insert_with(HashMap::new)
            .insert(handle.addr(), EventSet::default());
        put(set, handle).err().unwrap_or(SUCCESS)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetFree(set: *mut c_void) -> Ret {
    counted!();
    guard(|| {
        if sets()
            .as_mut()
            .and_then(|m| m.remove(&set.addr()))
            .is_none()
        {
            return INVALID_ARGUMENT;
        }
        // SAFETY: allocated by nvmlEventSetCreate as a Box<u8>, freed once (removed above).
        drop(unsafe { Box::from_raw(set.cast::<u8>()) });
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: Device,
    event_types: *mut c_ulonglong,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        resolve_gpu(l, device, Some(Feature::Events))?;
        put(event_types, SUPPORTED_EVENTS)
    })
}

/// Event types a device cannot deliver are refused (NOT_SUPPORTED), as the driver does.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: Device,
    event_types: c_ulonglong,
    set: *mut c_void,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve_gpu(l, device, Some(Feature::Events))?;
        if event_types & !SUPPORTED_EVENTS != 0 {
            return Err(crate::NOT_SUPPORTED);
        }
        let mut guard = sets();
        let s = guard
            .as_mut()
            .and_then(|m| m.get_mut(&set.addr()))
            .ok_or(INVALID_ARGUMENT)?;
        s.registered.push((t.index, event_types));
        Ok(())
    })
}

/// The earliest due event this set has not had: its data, or when the next one is due.
fn next_event(
    l: &Loaded,
    set: usize,
    now: Instant,
) -> Result<Result<EventData, Option<Instant>>, Ret> {
    let mut guard = sets();
    let s = guard
        .as_mut()
        .and_then(|m| m.get_mut(&set))
        .ok_or(INVALID_ARGUMENT)?;
    let mut best: Option<(Instant, EventKey, u32, u64)> = None;
    let mut later: Option<Instant> = None;
    for &(index, mask) in &s.registered {
        if mask & XID_CRITICAL_ERROR == 0 {
            continue;
        }
        let Some((pos, d)) = crate::find_by_index(l, index) else {
            continue;
        };
        for (e, seen) in d.xid_events.iter().zip(&l.xid_seen[pos]) {
            let due = *seen + Duration::from_millis(e.at_ms);
            let key = (d.uuid.clone(), e.xid, e.at_ms, *seen);
            if s.delivered.contains(&key) {
                continue;
            }
            if due > now {
                later = Some(later.map_or(due, |t| t.min(due)));
            } else if best.as_ref().is_none_or(|b| due < b.0) {
                best = Some((due, key, index, e.xid));
            }
        }
    }
    let Some((_, key, index, xid)) = best else {
        return Ok(Err(later));
    };
    s.delivered.insert(key);
    Ok(Ok(EventData {
        device: gpu_handle(index),
        event_type: XID_CRITICAL_ERROR,
        event_data: xid,
        gpu_instance_id: NO_INSTANCE,
        compute_instance_id: NO_INSTANCE,
    }))
}

/// Delivers one due event, waiting up to `timeout_ms` for one; TIMEOUT (10) otherwise.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: *mut c_void,
    data: *mut EventData,
    timeout_ms: c_uint,
) -> Ret {
    counted!();
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    loop {
        let mut wait_until = None;
        let ret = with_loaded(|l, now| match next_event(l, set.addr(), now)? {
            Ok(event) => put(data, event),
            Err(next) => {
                wait_until = Some(next.map_or(deadline, |n| n.min(deadline)));
                Err(TIMEOUT)
            }
        });
        let Some(until) = wait_until.filter(|_| ret == TIMEOUT) else {
            return ret;
        };
        let now = Instant::now();
        if now >= deadline {
            return TIMEOUT;
        }
        // Short naps: a scenario edit may add an event meanwhile.
        std::thread::sleep(
            (until.max(now) - now).clamp(Duration::from_millis(1), Duration::from_millis(50)),
        );
    }
}
