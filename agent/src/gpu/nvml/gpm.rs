//! Profiling through NVML GPM (Hopper and later): one sample per GPU and per GPU instance
//! each cycle, and the metrics between it and the previous one. Where GPM is unsupported the
//! metrics stay None (never 0) and `status` says why, per GPU.
use std::collections::{BTreeMap, HashMap};

use gpu_model::{GpmMetrics, SourceStatus};
use nvml_wrapper::{
    enums::gpm::GpmMetricId as Id,
    error::NvmlError,
    gpm::{gpm_metrics_get, GpmSample},
    Device, Nvml,
};
use nvml_wrapper_sys::bindings::nvmlGpmSample_t;

use super::DeviceSample;

/// The metrics asked for, in [`GpmMetrics`] field order.
const IDS: [Id; 12] = [
    Id::GraphicsUtil,
    Id::SmUtil,
    Id::SmOccupancy,
    Id::AnyTensorUtil,
    Id::DramBwUtil,
    Id::Fp64Util,
    Id::Fp32Util,
    Id::Fp16Util,
    Id::PcieTxPerSec,
    Id::PcieRxPerSec,
    Id::NvlinkTotalTxPerSec,
    Id::NvlinkTotalRxPerSec,
];

/// Samples kept from one cycle to the next, and what each GPU said about GPM.
#[derive(Debug, Default)]
pub struct Gpm {
    /// (GPU UUID, GPU instance id) -> the previous sample's raw handle (owned: freed when
    /// replaced, or by `release`). Raw, because a `GpmSample` borrows the `Nvml` it came
    /// from and this outlives a cycle.
    previous: HashMap<(String, Option<u32>), nvmlGpmSample_t>,
    /// Per GPU UUID; a GPU marked unsupported is not asked again until NVML restarts.
    pub status: BTreeMap<String, SourceStatus>,
}

// SAFETY: the samples are buffers NVML allocated for this process; NVML's calls are
// thread-safe, and a `Gpm` is used by one reader thread at a time (moved, never shared).
unsafe impl Send for Gpm {}

fn why(e: &NvmlError) -> String {
    match e {
        NvmlError::NotSupported => "GPM is not supported on this GPU (Hopper and later)".into(),
        NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound => {
            "this NVML has no GPM (driver 520 or later)".into()
        }
        NvmlError::NoPermission => "no permission to sample GPM".into(),
        e => e.to_string(),
    }
}

impl Gpm {
    /// Samples the GPU and its GPU instances, and fills their metrics where a previous
    /// sample exists.
    pub fn sample(&mut self, nvml: &Nvml, dev: &Device, d: &mut DeviceSample) {
        if self.status.get(&d.uuid).is_some_and(|s| !s.is_ok()) {
            return;
        }
        match dev.gpm_support() {
            Ok(true) => {}
            Ok(false) => {
                return self.unsupported(
                    &d.uuid,
                    "GPM is not supported on this GPU (Hopper and later)".into(),
                )
            }
            Err(e) => return self.unsupported(&d.uuid, why(&e)),
        }
        match self.step(nvml, (d.uuid.clone(), None), dev.gpm_sample()) {
            Ok(m) => d.fields.gpm = m,
            Err(e) => return self.unsupported(&d.uuid, why(&e)),
        }
        for m in &mut d.mig_devices {
            let key = (d.uuid.clone(), Some(m.gpu_instance_id));
            match self.step(nvml, key, dev.gpm_mig_sample(m.gpu_instance_id)) {
                Ok(g) => m.gpm = g,
                Err(e) => tracing::debug!(uuid = &*m.uuid, "GPM of the GPU instance: {e}"),
            }
        }
        self.status.insert(d.uuid.clone(), SourceStatus::Ok);
    }

    fn unsupported(&mut self, uuid: &str, reason: String) {
        if self.status.get(uuid).and_then(SourceStatus::reason) != Some(reason.as_str()) {
            tracing::info!(uuid, %reason, "no profiling (DCGM_FI_PROF_*) for this GPU");
        }
        self.status
            .insert(uuid.to_string(), SourceStatus::Unavailable(reason));
    }

    /// Keeps `new` as the previous sample of `key`, and returns the metrics between the
    /// one it replaces and it (None at the first sample).
    fn step(
        &mut self,
        nvml: &Nvml,
        key: (String, Option<u32>),
        new: Result<GpmSample<'_>, NvmlError>,
    ) -> Result<Option<GpmMetrics>, NvmlError> {
        let new = new?;
        let old = self.previous.remove(&key).map(|h| {
            // SAFETY: `h` was allocated by this library (`release` frees every kept handle
            // before NVML goes) and owned by the map alone: wrapped again, it is freed once.
            unsafe { GpmSample::from_handle(nvml, h) }
        });
        let metrics = match &old {
            Some(old) => Some(metrics(nvml, old, &new)?),
            None => None,
        };
        self.previous.insert(key, new.into_handle());
        Ok(metrics)
    }

    /// Frees every kept sample: NVML is about to shut down or restart.
    pub fn release(&mut self, nvml: &Nvml) {
        for (_, h) in self.previous.drain() {
            // SAFETY: as in `step`: owned by this map, allocated by this library.
            drop(unsafe { GpmSample::from_handle(nvml, h) });
        }
        self.status.clear();
    }
}

/// The metrics between two samples; one NVML cannot give stays None. Activities come in
/// percent and become ratios, as DCGM reports them.
fn metrics(nvml: &Nvml, old: &GpmSample<'_>, new: &GpmSample<'_>) -> Result<GpmMetrics, NvmlError> {
    let got = gpm_metrics_get(nvml, old, new, &IDS)?;
    let v: Vec<Option<f64>> = got
        .into_iter()
        .map(|r| r.ok().map(|m| m.value).filter(|v| v.is_finite()))
        .collect();
    let ratio = |i: usize| v[i].map(|p| p / 100.0);
    Ok(GpmMetrics {
        gr_engine_active: ratio(0),
        sm_active: ratio(1),
        sm_occupancy: ratio(2),
        tensor_active: ratio(3),
        dram_active: ratio(4),
        fp64_active: ratio(5),
        fp32_active: ratio(6),
        fp16_active: ratio(7),
        pcie_tx_mibps: v[8],
        pcie_rx_mibps: v[9],
        nvlink_tx_mibps: v[10],
        nvlink_rx_mibps: v[11],
    })
}
