//! GPU Performance Monitoring (Hopper and later): samples of a GPU or of one GPU instance,
//! and metrics between two of them, from the scenario's `gpm` keys.
use std::collections::HashMap;
use std::ffi::{c_char, c_uint, c_void};
use std::sync::Mutex;
use std::time::Instant;

use crate::scenario::{Feature, GpmSpec};
use crate::{
    guard, put, resolve_gpu, with_loaded, Device, Ret, ARGUMENT_VERSION_MISMATCH, INVALID_ARGUMENT,
    NOT_SUPPORTED, SUCCESS,
};

/// nvmlGpmSupport_t.
#[repr(C)]
pub struct GpmSupport {
    version: c_uint,
    is_supported_device: c_uint,
}

/// nvmlGpmMetric_t: 40 bytes.
#[repr(C)]
pub struct GpmMetric {
    metric_id: c_uint,
    nvml_return: Ret,
    value: f64,
    short_name: *mut c_char,
    long_name: *mut c_char,
    unit: *mut c_char,
}

/// The head of nvmlGpmMetricsGet_t; `metrics[numMetrics]` follows at offset 24 (the array
/// is 98 long in NVML 12 headers and 210 in NVML 13: only `numMetrics` entries are used).
#[repr(C)]
pub struct GpmMetricsGetHead {
    version: c_uint,
    num_metrics: c_uint,
    sample1: *mut c_void,
    sample2: *mut c_void,
}

const _: () = {
    assert!(std::mem::size_of::<GpmSupport>() == 8);
    assert!(std::mem::size_of::<GpmMetric>() == 40);
    assert!(std::mem::size_of::<GpmMetricsGetHead>() == 24);
};

/// NVML_GPM_SUPPORT_VERSION and NVML_GPM_METRICS_GET_VERSION.
const GPM_SUPPORT_VERSION: c_uint = 1;
const GPM_METRICS_GET_VERSION: c_uint = 1;

/// What a sample handle holds once filled: which GPU (and GPU instance) and when.
#[derive(Clone, Copy)]
struct Taken {
    index: u32,
    gpu_instance: Option<u32>,
    at: Instant,
}

/// Allocated sample handles (the address of a leaked byte, freed by nvmlGpmSampleFree).
static SAMPLES: Mutex<Option<HashMap<usize, Option<Taken>>>> = Mutex::new(None);

fn samples() -> std::sync::MutexGuard<'static, Option<HashMap<usize, Option<Taken>>>> {
    SAMPLES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    device: Device,
    support: *mut GpmSupport,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve_gpu(l, device, Some(Feature::Gpm))?;
        if support.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller sets `version` before the call.
        if unsafe { (*support).version } != GPM_SUPPORT_VERSION {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        put(
            support,
            GpmSupport {
                version: GPM_SUPPORT_VERSION,
                is_supported_device: c_uint::from(t.dev.gpm.is_some()),
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(sample: *mut *mut c_void) -> Ret {
    counted!();
    guard(|| {
        let handle = Box::into_raw(Box::new(0u8)).cast::<c_void>();
        samples()
            .get_or_insert_with(HashMap::new)
            .insert(handle.addr(), None);
        put(sample, handle).err().unwrap_or(SUCCESS)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleFree(sample: *mut c_void) -> Ret {
    counted!();
    guard(|| {
        let known = samples()
            .as_mut()
            .and_then(|m| m.remove(&sample.addr()))
            .is_some();
        if !known {
            return INVALID_ARGUMENT;
        }
        // SAFETY: allocated by nvmlGpmSampleAlloc as a Box<u8>, freed once (removed above).
        drop(unsafe { Box::from_raw(sample.cast::<u8>()) });
        SUCCESS
    })
}

/// Fills an allocated sample with the device (and GPU instance) and the time.
fn take(device: Device, gpu_instance: Option<u32>, sample: *mut c_void) -> Ret {
    with_loaded(|l, now| {
        let t = resolve_gpu(l, device, Some(Feature::Gpm))?;
        let gpm_of = match gpu_instance {
            None => t.dev.gpm.as_ref(),
            Some(gi) => t
                .dev
                .mig_devices
                .iter()
                .find(|m| m.gpu_instance_id == gi)
                .ok_or(INVALID_ARGUMENT)?
                .gpm
                .as_ref(),
        };
        if t.dev.gpm.is_none() || gpm_of.is_none() {
            return Err(NOT_SUPPORTED);
        }
        let mut guard = samples();
        let slot = guard
            .as_mut()
            .and_then(|m| m.get_mut(&sample.addr()))
            .ok_or(INVALID_ARGUMENT)?;
        *slot = Some(Taken {
            index: t.index,
            gpu_instance,
            at: now,
        });
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleGet(device: Device, sample: *mut c_void) -> Ret {
    counted!();
    take(device, None, sample)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpmMigSampleGet(
    device: Device,
    gpu_instance_id: c_uint,
    sample: *mut c_void,
) -> Ret {
    counted!();
    take(device, Some(gpu_instance_id), sample)
}

const MIB: f64 = 1_048_576.0;

/// A metric's value in NVML's units (percent, MiB/s), from the scenario's DCGM-style one.
fn metric_value(g: &GpmSpec, id: c_uint) -> Option<f64> {
    let pct = |v: Option<f64>| v.map(|v| v * 100.0);
    let mibps = |v: Option<f64>| v.map(|v| v / MIB);
    match id {
        1 => pct(g.gr_engine_active),
        2 => pct(g.sm_active),
        3 => pct(g.sm_occupancy),
        5 => pct(g.tensor_active),
        10 => pct(g.dram_active),
        11 => pct(g.fp64_active),
        12 => pct(g.fp32_active),
        13 => pct(g.fp16_active),
        20 => mibps(g.pcie_tx_bytes),
        21 => mibps(g.pcie_rx_bytes),
        60 => mibps(g.nvlink_rx_bytes),
        61 => mibps(g.nvlink_tx_bytes),
        _ => None,
    }
}

/// Metrics between two samples of the same GPU (instance), the second one later.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmMetricsGet(request: *mut GpmMetricsGetHead) -> Ret {
    counted!();
    if request.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null; nvml.h makes it a valid nvmlGpmMetricsGet_t.
    let head = unsafe { &*request };
    if head.version != GPM_METRICS_GET_VERSION {
        return ARGUMENT_VERSION_MISMATCH;
    }
    let (s1, s2) = {
        let guard = samples();
        let get = |p: *mut c_void| guard.as_ref().and_then(|m| m.get(&p.addr()).copied());
        match (get(head.sample1), get(head.sample2)) {
            (Some(Some(a)), Some(Some(b))) => (a, b),
            _ => return INVALID_ARGUMENT,
        }
    };
    if s1.index != s2.index || s1.gpu_instance != s2.gpu_instance || s2.at <= s1.at {
        return INVALID_ARGUMENT;
    }
    let n = head.num_metrics as usize;
    if n == 0 || n > 210 {
        return INVALID_ARGUMENT;
    }
    with_loaded(|l, _| {
        let (_, dev) = crate::find_by_index(l, s1.index).ok_or(INVALID_ARGUMENT)?;
        let spec = match s1.gpu_instance {
            None => dev.gpm,
            Some(gi) => dev
                .mig_devices
                .iter()
                .find(|m| m.gpu_instance_id == gi)
                .and_then(|m| m.gpm),
        }
        .ok_or(NOT_SUPPORTED)?;
        // SAFETY: the metrics array follows the head, with at least `numMetrics` entries.
        let metrics = unsafe {
            let first = request.cast::<u8>().add(24).cast::<GpmMetric>();
            std::slice::from_raw_parts_mut(first, n)
        };
        for m in metrics {
            match metric_value(&spec, m.metric_id) {
                Some(v) => {
                    m.value = v;
                    m.nvml_return = SUCCESS;
                }
                None => m.nvml_return = NOT_SUPPORTED,
            }
        }
        Ok(())
    })
}

/// Streaming is how NVML samples in the background; the fake needs none.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmQueryIfStreamingEnabled(device: Device, state: *mut c_uint) -> Ret {
    counted!();
    with_loaded(|l, _| {
        resolve_gpu(l, device, Some(Feature::Gpm))?;
        put(state, 0)
    })
}
