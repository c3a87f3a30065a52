//! The device families: each GPU's figures, and its MIG devices' memory and profiling.
use gpu_model::{DeviceSample, DeviceStatus};

use crate::catalogue::{
    Attr, MetricId as M, MetricId, CLOCKS, DIRECTIONS, ECC_ERROR_TYPES, ERROR_TYPES, GPU_ENGINES,
    GPU_LINKS, GPU_TASKS, HW_STATES, THROTTLE_REASONS,
};

use super::{
    text::{f, pct, ratio, Family, MIB},
    Renderer,
};

/// The four engines NVML samples: SM, memory controller, encoder, decoder.
pub(super) fn utilizations(f: &mut Family, l: &str, v: [Option<u32>; 4]) {
    for (task, v) in GPU_TASKS.into_iter().zip(v) {
        f.opt(l, &[(Attr::HwGpuTask, task)], pct(v));
    }
}

/// A device's memory usage, size or their ratio.
fn memory(id: MetricId, f: &mut Family, l: &str, used: Option<u64>, total: Option<u64>) {
    let v = match id {
        M::HwGpuMemoryUsage => self::f(used),
        M::HwGpuMemoryLimit => self::f(total),
        _ => ratio(used, total),
    };
    f.opt(l, &[], v);
}

/// NVML GPM's metrics of a GPU or MIG device; bandwidths from MiB/s to bytes per second.
fn gpm(id: MetricId, f: &mut Family, l: &str, g: Option<&gpu_model::GpmMetrics>) {
    let Some(g) = g else { return };
    match id {
        M::HwGpuActivity => {
            let v = [
                g.gr_engine_active,
                g.sm_active,
                g.tensor_active,
                g.dram_active,
                g.fp64_active,
                g.fp32_active,
                g.fp16_active,
            ];
            for (engine, v) in GPU_ENGINES.into_iter().zip(v) {
                f.opt(l, &[(Attr::HwGpuEngine, engine)], v);
            }
        }
        M::HwGpuSmOccupancy => f.opt(l, &[], g.sm_occupancy),
        _ => {
            let [pcie, nvlink] = GPU_LINKS;
            let [tx, rx] = DIRECTIONS;
            for (link, dir, v) in [
                (pcie, tx, g.pcie_tx_mibps),
                (pcie, rx, g.pcie_rx_mibps),
                (nvlink, tx, g.nvlink_tx_mibps),
                (nvlink, rx, g.nvlink_rx_mibps),
            ] {
                let labels = [(Attr::HwGpuLink, link), (Attr::NetworkIoDirection, dir)];
                f.opt(l, &labels, v.map(|v| v * MIB));
            }
        }
    }
}

/// ECC errors, PCIe replays and XIDs per code.
fn errors(f: &mut Family, l: &str, d: &DeviceSample) {
    let [corrected, uncorrected, replay, xid] = ERROR_TYPES;
    f.opt(l, &[(Attr::ErrorType, corrected)], self::f(d.ecc_corrected));
    f.opt(
        l,
        &[(Attr::ErrorType, uncorrected)],
        self::f(d.ecc_uncorrected),
    );
    f.opt(
        l,
        &[(Attr::ErrorType, replay)],
        self::f(d.fields.pcie_replay),
    );
    for x in d.fields.xid_errors.iter().flatten() {
        let code = x.xid.to_string();
        let labels = [(Attr::ErrorType, xid), (Attr::Xid, code.as_str())];
        f.series(l, &labels, x.count as f64);
    }
}

/// A device's own families other than memory and GPM.
fn device_series(id: MetricId, f: &mut Family, l: &str, d: &DeviceSample) {
    let x = &d.fields;
    let n = |v: Option<u32>| v.map(f64::from);
    let flag = |v: Option<bool>| v.map(|b| b as u8 as f64);
    let rows = x.remapped_rows;
    match id {
        M::HwGpuUtilization => utilizations(
            f,
            l,
            [
                d.utilization_gpu,
                d.utilization_memory,
                x.encoder_util,
                x.decoder_util,
            ],
        ),
        M::HwPower => f.opt(l, &[], d.power_mw.map(|v| v as f64 / 1000.0)),
        M::HwEnergy => f.opt(l, &[], d.energy_mj.map(|v| v as f64 / 1000.0)),
        M::HwTemperature => f.opt(l, &[], n(d.temperature_c)),
        M::HwErrors => errors(f, l, d),
        M::HwStatus => {
            // "lost" and "error: ..." (no handle) both mean the device cannot be used.
            let ok = d.status.is_ok() as u8 as f64;
            let [ok_state, failed_state] = HW_STATES;
            f.series(l, &[(Attr::HwState, ok_state)], ok);
            f.series(l, &[(Attr::HwState, failed_state)], 1.0 - ok);
        }
        M::NvmlStalled => {
            let stalled = matches!(d.status, DeviceStatus::Stalled { .. });
            f.series(l, &[], stalled as u8 as f64);
        }
        M::HwGpuClock => {
            let [sm, memory_clock] = CLOCKS;
            let mhz = |v: Option<u32>| v.map(|v| v as f64 * 1e6);
            f.opt(l, &[(Attr::Clock, sm)], mhz(d.sm_clock_mhz));
            f.opt(l, &[(Attr::Clock, memory_clock)], mhz(d.mem_clock_mhz));
        }
        M::HwGpuMemoryReserved => f.opt(l, &[], self::f(x.memory_reserved_bytes)),
        M::HwGpuMemoryTemperature => f.opt(l, &[], n(x.memory_temperature_c)),
        M::HwGpuMemoryRemappedRows => {
            let [corrected, uncorrected] = ECC_ERROR_TYPES;
            let count = |v: fn(&gpu_model::RemappedRows) -> u64| rows.as_ref().map(|r| v(r) as f64);
            f.opt(l, &[(Attr::ErrorType, corrected)], count(|r| r.correctable));
            f.opt(
                l,
                &[(Attr::ErrorType, uncorrected)],
                count(|r| r.uncorrectable),
            );
        }
        M::HwGpuMemoryRowRemapPending => f.opt(l, &[], flag(rows.map(|r| r.pending))),
        M::HwGpuMemoryRowRemapFailed => f.opt(l, &[], flag(rows.map(|r| r.failure))),
        M::HwGpuIo => {
            let [tx, rx] = DIRECTIONS;
            let nvlink = GPU_LINKS[1];
            let bytes = |kib: Option<u64>| kib.map(|k| k as f64 * 1024.0);
            let link = |dir| [(Attr::HwGpuLink, nvlink), (Attr::NetworkIoDirection, dir)];
            f.opt(l, &link(tx), bytes(x.nvlink_tx_kib));
            f.opt(l, &link(rx), bytes(x.nvlink_rx_kib));
        }
        M::HwGpuClockThrottled => {
            let Some(mask) = d.throttle_reasons else {
                return;
            };
            for (bit, reason) in THROTTLE_REASONS {
                let on = (mask & bit != 0) as u8 as f64;
                f.series(l, &[(Attr::ThrottleReason, reason)], on);
            }
        }
        M::HwGpuVgpuLicensed => f.opt(l, &[], flag(x.vgpu_licensed)),
        _ => {}
    }
}

impl Renderer<'_> {
    pub(super) fn device_family(&self, id: MetricId, f: &mut Family) {
        for (i, d) in self.snap.devices.iter().enumerate() {
            let l = &self.b.devices[i];
            let migs = d.mig_devices.iter().zip(&self.b.migs[i]);
            match id {
                M::HwGpuMemoryUsage | M::HwGpuMemoryLimit | M::HwGpuMemoryUtilization => {
                    memory(id, f, l, d.memory_used_bytes, d.memory_total_bytes);
                    // MIG devices: NVML tells only their memory (and GPM); the rest is the
                    // parent's.
                    for (m, ml) in migs {
                        memory(id, f, ml, m.memory_used_bytes, m.memory_total_bytes);
                    }
                }
                M::HwGpuActivity | M::HwGpuSmOccupancy | M::HwGpuBandwidth => {
                    gpm(id, f, l, d.fields.gpm.as_ref());
                    for (m, ml) in migs {
                        gpm(id, f, ml, m.gpm.as_ref());
                    }
                }
                id => device_series(id, f, l, d),
            }
        }
    }
}
