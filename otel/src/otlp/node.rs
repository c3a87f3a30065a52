//! What the node resource reports: each GPU's and MIG device's figures, each GPU's energy
//! charged to no container, and the agent's own counters.
use gpu_model::{AgentStats, DeviceSample, DeviceStatus, Snapshot};

use crate::catalogue::{
    Attr, MetricId as M, CLOCKS, DIRECTIONS, ECC_ERROR_TYPES, ERROR_TYPES, GPU_ENGINES, GPU_LINKS,
    GPU_TASKS, HW_STATES, HW_TYPE_GPU, HW_VENDOR_NVIDIA, OWNER_IDLE, THROTTLE_REASONS,
};

use super::metrics::{int, s, Attribute, Attrs, Metrics};

fn device_attributes(d: &DeviceSample) -> [Attribute<'_>; 5] {
    [
        s(Attr::HwId, &d.uuid),
        s(Attr::HwType, HW_TYPE_GPU),
        s(Attr::HwVendor, HW_VENDOR_NVIDIA),
        s(Attr::HwModel, &d.name),
        int(Attr::GpuIndex, d.index as i64),
    ]
}

pub(super) fn device_metrics(m: &mut Metrics, snap: &Snapshot) {
    let f = |v: Option<u64>| v.map(|v| v as f64);
    let pct = |v: Option<u32>| v.map(|v| v as f64 / 100.0);
    let mhz = |v: Option<u32>| v.map(|v| v as f64 * 1e6);
    for d in &snap.devices {
        let a = m.attrs(device_attributes(d));
        let ok = d.status.is_ok() as u8 as f64;
        let [ok_state, failed_state] = HW_STATES;
        m.points(
            M::HwStatus,
            a,
            Attr::HwState,
            [(ok_state, Some(ok)), (failed_state, Some(1.0 - ok))],
        );
        let stalled = matches!(d.status, DeviceStatus::Stalled { .. });
        m.point(M::NvmlStalled, stalled as u8 as f64, a);
        memory(m, a, d.memory_used_bytes, d.memory_total_bytes);
        let [general, memctl, ..] = GPU_TASKS;
        let [.., encoder, decoder] = GPU_TASKS;
        m.points(
            M::HwGpuUtilization,
            a,
            Attr::HwGpuTask,
            [
                (general, pct(d.utilization_gpu)),
                (memctl, pct(d.utilization_memory)),
                (encoder, pct(d.fields.encoder_util)),
                (decoder, pct(d.fields.decoder_util)),
            ],
        );
        if let Some(v) = d.power_mw {
            m.point(M::HwPower, v as f64 / 1000.0, a);
        }
        if let Some(v) = d.energy_mj {
            m.point(M::HwEnergy, v as f64 / 1000.0, a);
        }
        if let Some(v) = d.temperature_c {
            m.point(M::HwTemperature, v as f64, a);
        }
        let [corrected, uncorrected] = ECC_ERROR_TYPES;
        m.points(
            M::HwErrors,
            a,
            Attr::ErrorType,
            [
                (corrected, f(d.ecc_corrected)),
                (uncorrected, f(d.ecc_uncorrected)),
            ],
        );
        let [sm, memory_clock] = CLOCKS;
        m.points(
            M::HwGpuClock,
            a,
            Attr::Clock,
            [
                (sm, mhz(d.sm_clock_mhz)),
                (memory_clock, mhz(d.mem_clock_mhz)),
            ],
        );
        health_metrics(m, a, d);
        if let Some(g) = &d.fields.gpm {
            gpm_metrics(m, a, g);
        }
        for mig in &d.mig_devices {
            let ma = m.attrs([
                s(Attr::HwId, &mig.uuid),
                s(Attr::HwType, HW_TYPE_GPU),
                s(Attr::HwVendor, HW_VENDOR_NVIDIA),
                s(Attr::HwModel, &d.name),
                s(Attr::HwParent, &d.uuid),
            ]);
            // NVML tells a MIG device's memory (and GPM) only; no utilization of it.
            if let Some(g) = &mig.gpm {
                gpm_metrics(m, ma, g);
            }
            if let Some(v) = mig.memory_used_bytes {
                m.point(M::HwGpuMemoryUsage, v as f64, ma);
            }
            if let Some(v) = mig.memory_total_bytes {
                m.point(M::HwGpuMemoryLimit, v as f64, ma);
            }
        }
    }
}

/// The health fields dcgm-exporter serves, in our names: reserved memory, memory
/// temperature, PCIe replays, XIDs per code, remapped rows, NVLink bytes, throttling, vGPU
/// licensing.
fn health_metrics(m: &mut Metrics, a: Attrs, d: &DeviceSample) {
    let x = &d.fields;
    let one = |m: &mut Metrics, id, v: Option<f64>| {
        if let Some(v) = v {
            m.point(id, v, a);
        }
    };
    one(
        m,
        M::HwGpuMemoryReserved,
        x.memory_reserved_bytes.map(|v| v as f64),
    );
    one(
        m,
        M::HwGpuMemoryTemperature,
        x.memory_temperature_c.map(f64::from),
    );
    let [.., replay, xid] = ERROR_TYPES;
    m.points(
        M::HwErrors,
        a,
        Attr::ErrorType,
        [(replay, x.pcie_replay.map(|v| v as f64))],
    );
    for c in x.xid_errors.iter().flatten() {
        let pa = m.with(a, [s(Attr::ErrorType, xid), int(Attr::Xid, c.xid as i64)]);
        m.point(M::HwErrors, c.count as f64, pa);
    }
    if let Some(r) = x.remapped_rows {
        let [corrected, uncorrected] = ECC_ERROR_TYPES;
        m.points(
            M::HwGpuMemoryRemappedRows,
            a,
            Attr::ErrorType,
            [
                (corrected, Some(r.correctable as f64)),
                (uncorrected, Some(r.uncorrectable as f64)),
            ],
        );
        one(
            m,
            M::HwGpuMemoryRowRemapPending,
            Some(r.pending as u8 as f64),
        );
        one(
            m,
            M::HwGpuMemoryRowRemapFailed,
            Some(r.failure as u8 as f64),
        );
    }
    let nvlink = m.with(a, [s(Attr::HwGpuLink, GPU_LINKS[1])]);
    let [tx, rx] = DIRECTIONS;
    let kib = |v: Option<u64>| v.map(|k| k as f64 * 1024.0);
    m.points(
        M::HwGpuIo,
        nvlink,
        Attr::NetworkIoDirection,
        [(tx, kib(x.nvlink_tx_kib)), (rx, kib(x.nvlink_rx_kib))],
    );
    if let Some(mask) = d.throttle_reasons {
        for (bit, reason) in THROTTLE_REASONS {
            let pa = m.with(a, [s(Attr::ThrottleReason, reason)]);
            m.point(M::HwGpuClockThrottled, (mask & bit != 0) as u8 as f64, pa);
        }
    }
    one(
        m,
        M::HwGpuVgpuLicensed,
        x.vgpu_licensed.map(|b| b as u8 as f64),
    );
}

/// NVML GPM's profiling of a GPU or MIG device; bandwidths in bytes per second.
fn gpm_metrics(m: &mut Metrics, a: Attrs, g: &gpu_model::GpmMetrics) {
    let activity = [
        g.gr_engine_active,
        g.sm_active,
        g.tensor_active,
        g.dram_active,
        g.fp64_active,
        g.fp32_active,
        g.fp16_active,
    ];
    let [e0, e1, e2, e3, e4, e5, e6] = GPU_ENGINES;
    let [a0, a1, a2, a3, a4, a5, a6] = activity;
    m.points(
        M::HwGpuActivity,
        a,
        Attr::HwGpuEngine,
        [
            (e0, a0),
            (e1, a1),
            (e2, a2),
            (e3, a3),
            (e4, a4),
            (e5, a5),
            (e6, a6),
        ],
    );
    if let Some(v) = g.sm_occupancy {
        m.point(M::HwGpuSmOccupancy, v, a);
    }
    let [tx, rx] = DIRECTIONS;
    let bps = |v: Option<f64>| v.map(|v| v * 1_048_576.0);
    for (link, t, r) in [
        (GPU_LINKS[0], g.pcie_tx_mibps, g.pcie_rx_mibps),
        (GPU_LINKS[1], g.nvlink_tx_mibps, g.nvlink_rx_mibps),
    ] {
        let la = m.with(a, [s(Attr::HwGpuLink, link)]);
        m.points(
            M::HwGpuBandwidth,
            la,
            Attr::NetworkIoDirection,
            [(tx, bps(t)), (rx, bps(r))],
        );
    }
}

/// A GPU's memory usage, size and their ratio.
fn memory(m: &mut Metrics, a: Attrs, used: Option<u64>, total: Option<u64>) {
    if let Some(v) = used {
        m.point(M::HwGpuMemoryUsage, v as f64, a);
    }
    if let Some(v) = total {
        m.point(M::HwGpuMemoryLimit, v as f64, a);
    }
    if let (Some(u), Some(l)) = (used, total) {
        if l > 0 {
            m.point(M::HwGpuMemoryUtilization, u as f64 / l as f64, a);
        }
    }
}

/// Each GPU's energy charged to no container: the idle entry, on the node resource.
pub(super) fn idle_energy(m: &mut Metrics, snap: &Snapshot) {
    for d in &snap.devices {
        if let Some(j) = d.sharing.idle_energy_joules {
            let a = m.attrs([s(Attr::HwId, &d.uuid), s(Attr::Owner, OWNER_IDLE)]);
            m.point(M::ContainerGpuEnergy, j, a);
        }
    }
}

pub(super) fn self_metrics(m: &mut Metrics, st: &AgentStats) {
    let counters = [
        (M::EventsReceived, st.events_received),
        (M::EventsLost, st.events_lost),
        (M::Resyncs, st.resyncs),
        (M::ProcfsFallbackLookups, st.procfs_fallback_lookups),
        (M::ExportFailures, st.export_failures),
        (M::ExportDroppedBatches, st.export_dropped_batches),
        (M::CachedProcesses, st.cached_processes),
        (M::UsageRecordsEmitted, st.usage_records),
        (M::UsageRecordsDropped, st.usage_records_dropped),
    ];
    for (id, v) in counters {
        let none = m.attrs([]);
        m.point(id, v as f64, none);
    }
    let none = m.attrs([]);
    m.point(M::NvmlUp, st.nvml.is_ok() as u8 as f64, none);
    let mode = m.attrs([s(Attr::Mode, st.mode.as_str())]);
    m.point(M::Mode, 1.0, mode);
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::{
        common::v1::any_value,
        metrics::v1::{metric::Data, number_data_point, ResourceMetrics},
    };

    use super::*;
    use crate::otlp::{
        build_request,
        fixtures::{ctx, snap},
    };

    /// The health, profiling and XID values reach OTLP under their semantic-convention
    /// style names, and an XID charged to a container that is gone keeps a resource.
    #[test]
    fn health_profiling_and_xids_in_otlp() {
        use gpu_model::{ContainerXid, GpmMetrics, XidCount};
        let mut sn = snap();
        let f = &mut sn.devices[0].fields;
        f.pcie_replay = Some(4);
        f.xid_errors = Some(vec![XidCount { xid: 79, count: 2 }]);
        f.gpm = Some(GpmMetrics {
            sm_active: Some(0.5),
            pcie_tx_mibps: Some(2.0),
            ..Default::default()
        });
        sn.devices[0].throttle_reasons = Some(0x20);
        sn.container_xids = vec![ContainerXid {
            container_id: Some("gone".into()),
            pod_uid: Some("p9".into()),
            uuid: "GPU-a".into(),
            gpu_uuid: "GPU-a".into(),
            xid: 43,
            count: 1,
            ..Default::default()
        }];
        let r = build_request(&sn, &AgentStats::default(), &ctx(), 0);
        let points = |rm: &ResourceMetrics, name: &str| -> Vec<(Vec<(String, String)>, f64)> {
            let m = rm.scope_metrics[0].metrics.iter().find(|m| m.name == name);
            let pts = match m.and_then(|m| m.data.as_ref()) {
                Some(Data::Gauge(g)) => &g.data_points,
                Some(Data::Sum(s)) => &s.data_points,
                _ => return vec![],
            };
            pts.iter()
                .map(|p| {
                    let a = p.attributes.iter().map(|kv| {
                        let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                            Some(any_value::Value::StringValue(s)) => s.clone(),
                            Some(any_value::Value::IntValue(i)) => i.to_string(),
                            _ => String::new(),
                        };
                        (kv.key.clone(), v)
                    });
                    let v = match p.value {
                        Some(number_data_point::Value::AsDouble(v)) => v,
                        _ => f64::NAN,
                    };
                    (a.collect(), v)
                })
                .collect()
        };
        let node = &r.resource_metrics[0];
        let has = |pts: &[(Vec<(String, String)>, f64)], kv: (&str, &str), v: f64| {
            pts.iter()
                .any(|(a, x)| *x == v && a.iter().any(|(k, val)| k == kv.0 && val == kv.1))
        };
        let errors = points(node, "hw.errors");
        assert!(
            has(&errors, ("error.type", "pcie_replay"), 4.0),
            "{errors:?}"
        );
        assert!(has(&errors, ("xid", "79"), 2.0), "{errors:?}");
        let activity = points(node, "hw.gpu.activity");
        assert!(has(&activity, ("hw.gpu.engine", "sm"), 0.5), "{activity:?}");
        assert_eq!(
            activity.len(),
            1,
            "unknown activities have no point: {activity:?}"
        );
        let bw = points(node, "hw.gpu.bandwidth");
        assert!(
            has(&bw, ("network.io.direction", "transmit"), 2.0 * 1_048_576.0),
            "{bw:?}"
        );
        let throttled = points(node, "hw.gpu.clock.throttled");
        assert!(has(
            &throttled,
            ("hw.gpu.throttle_reason", "sw_thermal_slowdown"),
            1.0
        ));
        assert!(has(&throttled, ("hw.gpu.throttle_reason", "gpu_idle"), 0.0));
        // The gone container: a resource of its own with its XID count.
        let gone = r
            .resource_metrics
            .iter()
            .find(|rm| {
                rm.resource.as_ref().unwrap().attributes.iter().any(|kv| {
                    kv.key == "container.id"
                        && kv.value.as_ref().and_then(|v| v.value.as_ref())
                            == Some(&any_value::Value::StringValue("gone".into()))
                })
            })
            .expect("a resource for the gone container");
        assert!(has(
            &points(gone, "container.gpu.errors"),
            ("xid", "43"),
            1.0
        ));
        // A stalled GPU (the sampler sends it without readings): said stalled and failed;
        // the same GPU answering says 0.
        assert!(has(
            &points(node, "gpu_agent.nvml.stalled"),
            ("hw.id", "GPU-a"),
            0.0
        ));
        let mut sn = snap();
        sn.devices[0].status = gpu_model::DeviceStatus::Stalled {
            call: "nvmlDeviceGetPowerUsage".into(),
            secs: 7,
        };
        let r = build_request(&sn, &AgentStats::default(), &ctx(), 0);
        let node = &r.resource_metrics[0];
        assert!(has(
            &points(node, "gpu_agent.nvml.stalled"),
            ("hw.id", "GPU-a"),
            1.0
        ));
        assert!(has(&points(node, "hw.status"), ("hw.state", "failed"), 1.0));
    }
}
