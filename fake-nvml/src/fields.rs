//! The health fields dcgm-exporter serves: encoder and decoder utilization, PCIe replays,
//! remapped rows, field values (memory temperature, NVLink throughput) and vGPU licensing.
use std::ffi::{c_char, c_int, c_uint, c_ulonglong};
use std::time::Instant;

use crate::scenario::Feature;
use crate::{put, resolve_gpu, with_loaded, Device, Ret, INVALID_ARGUMENT, NOT_SUPPORTED};

const SUCCESS: Ret = crate::SUCCESS;

/// nvmlFieldValue_t: 40 bytes.
#[repr(C)]
pub struct FieldValue {
    field_id: c_uint,
    scope_id: c_uint,
    timestamp: i64,
    latency_usec: i64,
    value_type: c_uint,
    nvml_return: Ret,
    value: c_ulonglong,
}

/// nvmlGridLicenseExpiry_t.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GridLicenseExpiry {
    year: c_uint,
    month: u16,
    day: u16,
    hour: u16,
    min: u16,
    sec: u16,
    status: u8,
}

/// nvmlGridLicensableFeature_t.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GridLicensableFeature {
    feature_code: c_uint,
    feature_state: c_uint,
    license_info: [c_char; 128],
    product_name: [c_char; 128],
    feature_enabled: c_uint,
    license_expiry: GridLicenseExpiry,
}

/// nvmlGridLicensableFeatures_t (v4).
#[repr(C)]
pub struct GridLicensableFeatures {
    is_grid_license_supported: c_int,
    licensable_features_count: c_uint,
    features: [GridLicensableFeature; 3],
}

// Layouts checked against nvml.h (nvml-wrapper-sys 0.10's bindgen output).
const _: () = {
    assert!(std::mem::size_of::<FieldValue>() == 40);
    assert!(std::mem::size_of::<GridLicenseExpiry>() == 16);
    assert!(std::mem::size_of::<GridLicensableFeature>() == 284);
    assert!(std::mem::size_of::<GridLicensableFeatures>() == 860);
};

// Field ids, as nvml.h numbers them (NVML_FI_DEV_*). Each folded id answers what its own
// call does: ECC_SBE/DBE_VOL_TOTAL = nvmlDeviceGetTotalEccErrors(corrected / uncorrected,
// volatile); REMAPPED_* = nvmlDeviceGetRemappedRows; POWER_AVERAGE / POWER_INSTANT =
// nvmlDeviceGetPowerUsage (the fake has one power figure; a real driver's call answers the
// 1 s average from Ampere on, except GA100); TOTAL_ENERGY_CONSUMPTION = the energy counter.
pub const FI_DEV_ECC_SBE_VOL_TOTAL: c_uint = 3;
pub const FI_DEV_ECC_DBE_VOL_TOTAL: c_uint = 4;
pub const FI_DEV_MEMORY_TEMP: c_uint = 82;
pub const FI_DEV_TOTAL_ENERGY_CONSUMPTION: c_uint = 83;
pub const FI_DEV_PCIE_REPLAY_COUNTER: c_uint = 94;
pub const FI_DEV_REMAPPED_COR: c_uint = 142;
pub const FI_DEV_REMAPPED_UNC: c_uint = 143;
pub const FI_DEV_REMAPPED_PENDING: c_uint = 144;
pub const FI_DEV_REMAPPED_FAILURE: c_uint = 145;
pub const FI_DEV_POWER_AVERAGE: c_uint = 185;
pub const FI_DEV_POWER_INSTANT: c_uint = 186;
pub const FI_DEV_NVLINK_THROUGHPUT_DATA_TX: c_uint = 138;
pub const FI_DEV_NVLINK_THROUGHPUT_DATA_RX: c_uint = 139;
const VALUE_TYPE_UNSIGNED_INT: c_uint = 1;
const VALUE_TYPE_UNSIGNED_LONG_LONG: c_uint = 3;
const GRID_LICENSE_FEATURE_CODE_VGPU: c_uint = 1;

fn utilization(device: Device, util: *mut c_uint, period: *mut c_uint, encoder: bool) -> Ret {
    let feature = if encoder {
        Feature::EncoderUtilization
    } else {
        Feature::DecoderUtilization
    };
    with_loaded(|l, _| {
        let t = resolve_gpu(l, device, Some(feature))?;
        let v = if encoder {
            t.dev.encoder_util
        } else {
            t.dev.decoder_util
        };
        put(util, v)?;
        // The driver samples the codecs over about 167 ms.
        put(period, 166_667)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEncoderUtilization(
    device: Device,
    util: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> Ret {
    counted!();
    utilization(device, util, sampling_period_us, true)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDecoderUtilization(
    device: Device,
    util: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> Ret {
    counted!();
    utilization(device, util, sampling_period_us, false)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(device: Device, value: *mut c_uint) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve_gpu(l, device, Some(Feature::PcieReplay))?;
        put(value, t.dev.pcie_replay)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: Device,
    corr_rows: *mut c_uint,
    unc_rows: *mut c_uint,
    is_pending: *mut c_uint,
    failure_occurred: *mut c_uint,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve_gpu(l, device, Some(Feature::RemappedRows))?;
        let r = t.dev.remapped_rows;
        put(corr_rows, r.correctable)?;
        put(unc_rows, r.uncorrectable)?;
        put(is_pending, c_uint::from(r.pending))?;
        put(failure_occurred, c_uint::from(r.failure))
    })
}

/// One field's answer: (value type, value), or the per-field error.
fn field(l: &crate::Loaded, pos: usize, id: c_uint, now: Instant) -> Result<(c_uint, u64), Ret> {
    let d = &l.scenario.devices[pos];
    let uint = |v: u32| Ok((VALUE_TYPE_UNSIGNED_INT, u64::from(v)));
    let r = d.remapped_rows;
    match id {
        FI_DEV_ECC_SBE_VOL_TOTAL if d.supports(Feature::Ecc) => {
            Ok((VALUE_TYPE_UNSIGNED_LONG_LONG, d.ecc_corrected.get(false)))
        }
        FI_DEV_ECC_DBE_VOL_TOTAL if d.supports(Feature::Ecc) => {
            Ok((VALUE_TYPE_UNSIGNED_LONG_LONG, d.ecc_uncorrected.get(false)))
        }
        FI_DEV_TOTAL_ENERGY_CONSUMPTION if d.supports(Feature::Energy) => {
            Ok((VALUE_TYPE_UNSIGNED_LONG_LONG, l.energy_at(pos, now)))
        }
        FI_DEV_REMAPPED_COR if d.supports(Feature::RemappedRows) => uint(r.correctable),
        FI_DEV_REMAPPED_UNC if d.supports(Feature::RemappedRows) => uint(r.uncorrectable),
        FI_DEV_REMAPPED_PENDING if d.supports(Feature::RemappedRows) => uint(r.pending.into()),
        FI_DEV_REMAPPED_FAILURE if d.supports(Feature::RemappedRows) => uint(r.failure.into()),
        FI_DEV_POWER_AVERAGE | FI_DEV_POWER_INSTANT if d.supports(Feature::PowerUsage) => {
            uint(d.power_mw)
        }
        FI_DEV_MEMORY_TEMP => d
            .memory_temperature_c
            .map(|t| (VALUE_TYPE_UNSIGNED_INT, u64::from(t)))
            .ok_or(NOT_SUPPORTED),
        FI_DEV_PCIE_REPLAY_COUNTER if d.supports(Feature::PcieReplay) => {
            Ok((VALUE_TYPE_UNSIGNED_INT, u64::from(d.pcie_replay)))
        }
        FI_DEV_NVLINK_THROUGHPUT_DATA_TX | FI_DEV_NVLINK_THROUGHPUT_DATA_RX => {
            let (tx, rx) = l.nvlink_at(pos, now).ok_or(NOT_SUPPORTED)?;
            let v = if id == FI_DEV_NVLINK_THROUGHPUT_DATA_TX {
                tx
            } else {
                rx
            };
            Ok((VALUE_TYPE_UNSIGNED_LONG_LONG, v))
        }
        _ => Err(NOT_SUPPORTED),
    }
}

/// Each value gets its own return code; the call succeeds when the device answers at all.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: Device,
    values_count: c_int,
    values: *mut FieldValue,
) -> Ret {
    counted!();
    with_loaded(|l, now| {
        let t = resolve_gpu(l, device, Some(Feature::FieldValues))?;
        let n = usize::try_from(values_count).map_err(|_| INVALID_ARGUMENT)?;
        if values.is_null() || n == 0 {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: nvml.h makes the caller pass `values_count` valid, writable entries.
        let values = unsafe { std::slice::from_raw_parts_mut(values, n) };
        let stamp = crate::now_us() as i64;
        if crate::cost::on() {
            crate::cost::spend(values.iter().map(|v| field_us(v.field_id)).sum());
        }
        for v in values {
            v.timestamp = stamp;
            v.latency_usec = 0;
            match field(l, t.pos, v.field_id, now) {
                Ok((ty, value)) => {
                    v.value_type = ty;
                    v.value = value;
                    v.nvml_return = SUCCESS;
                }
                Err(e) => v.nvml_return = e,
            }
        }
        Ok(())
    })
}

/// No GRID licensing on the device (the usual bare-metal answer) unless the scenario sets
/// `vgpu_licensed`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGridLicensableFeatures_v4(
    device: Device,
    features: *mut GridLicensableFeatures,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve_gpu(l, device, Some(Feature::VgpuLicense))?;
        let empty = GridLicensableFeature {
            feature_code: 0,
            feature_state: 0,
            license_info: [0; 128],
            product_name: [0; 128],
            feature_enabled: 0,
            license_expiry: GridLicenseExpiry {
                year: 0,
                month: 0,
                day: 0,
                hour: 0,
                min: 0,
                sec: 0,
                status: 0,
            },
        };
        let mut out = GridLicensableFeatures {
            is_grid_license_supported: 0,
            licensable_features_count: 0,
            features: [empty; 3],
        };
        if let Some(licensed) = t.dev.vgpu_licensed {
            out.is_grid_license_supported = 1;
            out.licensable_features_count = 1;
            out.features[0].feature_code = GRID_LICENSE_FEATURE_CODE_VGPU;
            out.features[0].feature_state = c_uint::from(licensed);
            out.features[0].feature_enabled = 1;
        }
        put(features, out)
    })
}

/// What one more field id adds to a `nvmlDeviceGetFieldValues` call, beyond the call's own
/// cost (74 µs measured for the three ids the agent asks: memory temperature, NVLink tx and
/// rx). Through field values the energy counter and the PCIe replays took what their own
/// calls take (docs/validation, H100); another id is charged a cheap call until measured.
pub fn field_us(id: u32) -> u64 {
    match id {
        FI_DEV_TOTAL_ENERGY_CONSUMPTION => 5_081,
        FI_DEV_PCIE_REPLAY_COUNTER => 363,
        FI_DEV_MEMORY_TEMP
        | FI_DEV_NVLINK_THROUGHPUT_DATA_TX
        | FI_DEV_NVLINK_THROUGHPUT_DATA_RX => 0,
        _ => crate::cost::SIZE_QUERY_US,
    }
}
