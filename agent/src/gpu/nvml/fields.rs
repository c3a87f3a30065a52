//! The health fields dcgm-exporter serves, read from NVML: encoder and decoder utilization,
//! PCIe replays, remapped rows, memory temperature, NVLink throughput and vGPU licensing.
//! nvml-wrapper has no method for some of these: the library's own symbols are called, each
//! checked first (a missing one would panic).
use std::{collections::HashMap, mem, time::Instant};

use nvml_wrapper::{
    error::{nvml_try as check, NvmlError},
    sys_exports::field_id,
    Device, Nvml,
};
use nvml_wrapper_sys::bindings::{
    nvmlFieldValue_t, nvmlGridLicensableFeatures_t,
    nvmlGridLicenseFeatureCode_t_NVML_GRID_LICENSE_FEATURE_CODE_VGPU as FEATURE_CODE_VGPU,
    nvmlReturn_enum_NVML_SUCCESS as OK,
};

use super::{reader::Reader, DeviceSample};
use gpu_model::RemappedRows;

/// Per GPU UUID, the NVLink counters at the previous sample: the rate is taken over the
/// time between two samples, as DCGM does.
#[derive(Debug, Default)]
pub struct NvlinkRates {
    last: HashMap<String, (u64, Instant)>,
}

/// Reads the fields into `d.fields` (the PCIe replay counter is read with the energy
/// counter, device.rs); an unsupported one is recorded and skipped. Slow readings (slow.rs):
/// the NVLink rate spans the time since the last read.
pub fn read(
    r: &mut Reader,
    nvml: &Nvml,
    dev: &Device,
    d: &mut DeviceSample,
    rates: &mut NvlinkRates,
) {
    let f = &mut d.fields;
    f.encoder_util = r
        .read(&"encoder_utilization", || dev.encoder_utilization())
        .map(|u| u.utilization);
    f.decoder_util = r
        .read(&"decoder_utilization", || dev.decoder_utilization())
        .map(|u| u.utilization);
    f.remapped_rows = r.read(&"remapped_rows", || remapped_rows(nvml, dev));
    f.vgpu_licensed = r.read(&"vgpu_license", || vgpu_licensed(nvml, dev));
    let Some(values) = r.read(&"field_values", || field_values(nvml, dev)) else {
        return;
    };
    let [mem_temp, tx, rx] = values;
    f.memory_temperature_c = mem_temp.map(|v| v as u32);
    if let (Some(tx), Some(rx)) = (tx, rx) {
        f.nvlink_tx_kib = Some(tx);
        f.nvlink_rx_kib = Some(rx);
        f.nvlink_bandwidth_total = rates.rate(&d.uuid, tx.saturating_add(rx), Instant::now());
    }
}

impl NvlinkRates {
    /// DCGM's `DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`: KiB moved since the previous sample per
    /// second, divided by 1000 and truncated. None at the first sample.
    fn rate(&mut self, uuid: &str, kib: u64, now: Instant) -> Option<u64> {
        let prev = self.last.insert(uuid.to_string(), (kib, now));
        let (before, then) = prev?;
        let secs = now.duration_since(then).as_secs_f64();
        (secs > 0.0 && kib >= before).then(|| ((kib - before) as f64 / secs / 1000.0) as u64)
    }

    /// Forgets every device (NVML was reinitialised).
    pub fn clear(&mut self) {
        self.last.clear();
    }
}

fn remapped_rows(nvml: &Nvml, dev: &Device) -> Result<RemappedRows, NvmlError> {
    let f = nvml
        .lib()
        .nvmlDeviceGetRemappedRows
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let (mut corr, mut unc, mut pending, mut failure) = (0, 0, 0, 0);
    // SAFETY: a live handle from this library; valid out-pointers.
    check(unsafe {
        f(
            dev.handle(),
            &mut corr,
            &mut unc,
            &mut pending,
            &mut failure,
        )
    })?;
    Ok(RemappedRows {
        correctable: corr.into(),
        uncorrectable: unc.into(),
        pending: pending != 0,
        failure: failure != 0,
    })
}

/// Whether the vGPU license is held; false where the device has no GRID licensing (what
/// DCGM reports there).
fn vgpu_licensed(nvml: &Nvml, dev: &Device) -> Result<bool, NvmlError> {
    let f = nvml
        .lib()
        .nvmlDeviceGetGridLicensableFeatures_v4
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    // SAFETY: a plain C struct; all-zero is a valid value.
    let mut lic: nvmlGridLicensableFeatures_t = unsafe { mem::zeroed() };
    // SAFETY: a live handle from this library; a valid out-pointer.
    check(unsafe { f(dev.handle(), &mut lic) })?;
    if lic.isGridLicenseSupported == 0 {
        return Ok(false);
    }
    let n = (lic.licensableFeaturesCount as usize).min(lic.gridLicensableFeatures.len());
    Ok(lic.gridLicensableFeatures[..n]
        .iter()
        .any(|f| f.featureCode == FEATURE_CODE_VGPU && f.featureState > 0))
}

/// Memory temperature, and NVLink tx / rx KiB over all links (scope `u32::MAX`, as DCGM
/// asks), in one call; a field the device cannot give is None.
fn field_values(nvml: &Nvml, dev: &Device) -> Result<[Option<u64>; 3], NvmlError> {
    let f = nvml
        .lib()
        .nvmlDeviceGetFieldValues
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let ids = [
        (field_id::NVML_FI_DEV_MEMORY_TEMP, 0),
        (field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, u32::MAX),
        (field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, u32::MAX),
    ];
    let mut values = ids.map(|(id, scope)| {
        // SAFETY: a plain C struct; all-zero is a valid value.
        let mut v: nvmlFieldValue_t = unsafe { mem::zeroed() };
        v.fieldId = id;
        v.scopeId = scope;
        v
    });
    // SAFETY: a live handle; `values` holds as many entries as the count says.
    check(unsafe { f(dev.handle(), values.len() as i32, values.as_mut_ptr()) })?;
    Ok(values.map(|v| {
        // SAFETY: the union member follows `valueType` (nvml.h: 1 unsigned int, 3 u64).
        (v.nvmlReturn == OK).then(|| unsafe {
            match v.valueType {
                1 => u64::from(v.value.uiVal),
                2 => v.value.ulVal,
                3 => v.value.ullVal,
                4 => v.value.sllVal.max(0) as u64,
                5 => v.value.siVal.max(0) as u64,
                6 => u64::from(v.value.usVal),
                _ => v.value.dVal.max(0.0) as u64,
            }
        })
    }))
}
