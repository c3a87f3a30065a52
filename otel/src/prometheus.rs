//! Prometheus text exposition (format 0.0.4) of a snapshot and the agent's own stats.
//!
//! Names are the OpenTelemetry -> Prometheus mapping of the OTLP names (`hw.gpu.memory.usage`
//! in By -> `hw_gpu_memory_usage_bytes`), so that the two sinks can be joined in queries.
//! Every family has HELP and TYPE and passes `promtool check metrics`; the one exception is
//! dcgm-exporter's own `modelName` label in the compatibility families (see `dcgm`).
use std::{cmp::Ordering, fmt::Write};

use gpu_model::{AgentStats, ContainerUsage, DeviceSample, Snapshot};

use crate::{
    catalogue::{
        Attr, Dropped, MetricId as M, MetricId, CATALOGUE, CLOCKS, ECC_ERROR_TYPES, GPU_TASKS,
        HW_STATES, OWNERS, OWNER_IDLE,
    },
    Groups, NodeIdentity,
};

#[derive(Debug, Clone, Default)]
pub struct PromOptions {
    pub node: NodeIdentity,
    pub groups: Groups,
    /// Also emit dcgm-exporter's names (DCGM_FI_DEV_*), per container.
    pub dcgm_compat: bool,
}

type Labels = Vec<(Attr, String)>;

/// The series of each family, indexed by [`MetricId`]: families render in catalogue order,
/// so the output does not depend on which values a snapshot happens to have.
struct Out {
    series: Vec<Vec<(Labels, f64)>>,
    /// Labels configured away (metrics.drop_attributes).
    drop: Dropped,
}

impl Out {
    fn new(drop: Dropped) -> Out {
        Out {
            series: vec![vec![]; CATALOGUE.len()],
            drop,
        }
    }

    fn add(&mut self, id: MetricId, mut labels: Labels, value: f64) {
        debug_assert!(
            labels.iter().all(|(a, _)| id.def().carries_label(*a)),
            "{id:?}: {labels:?} not all in the catalogue"
        );
        if !self.drop.is_empty() {
            labels.retain(|(a, _)| !self.drop.contains(*a));
        }
        self.series[id as usize].push((labels, value));
    }

    /// Skips unknown values: an absent series, not a made-up 0.
    fn opt(&mut self, id: MetricId, labels: &Labels, value: Option<f64>) {
        if let Some(v) = value {
            self.add(id, labels.clone(), v);
        }
    }

    fn render(self) -> String {
        let mut s = String::new();
        for (def, mut series) in CATALOGUE.iter().zip(self.series) {
            let Some(name) = def.prometheus.filter(|_| !series.is_empty()) else {
                continue;
            };
            // Sorted for stable output; a repeated label set would make Prometheus reject
            // the whole scrape, so only its first value is kept.
            series.sort_by(|a, b| cmp_labels(&a.0, &b.0));
            series.dedup_by(|a, b| a.0 == b.0);
            let _ = writeln!(s, "# HELP {name} {}", escape_help(def.help));
            let _ = writeln!(s, "# TYPE {name} {}", def.kind.prometheus_type());
            for (labels, value) in series {
                s.push_str(name);
                if !labels.is_empty() {
                    s.push('{');
                    for (i, (k, v)) in labels.iter().enumerate() {
                        if i > 0 {
                            s.push(',');
                        }
                        let _ = write!(s, "{}=\"{}\"", k.label(), escape_label(v));
                    }
                    s.push('}');
                }
                let _ = writeln!(s, " {}", format_value(value));
            }
        }
        s
    }
}

/// Orders label sets as their text would sort: by name, then value, pair by pair.
fn cmp_labels(a: &Labels, b: &Labels) -> Ordering {
    for ((ka, va), (kb, vb)) in a.iter().zip(b) {
        // Label names are unique per attribute: different attributes, different names.
        if ka != kb {
            return ka.label().cmp(kb.label());
        }
        let o = va.cmp(vb);
        if o != Ordering::Equal {
            return o;
        }
    }
    a.len().cmp(&b.len())
}

fn with(base: &Labels, extra: &[(Attr, &str)]) -> Labels {
    let mut l = Vec::with_capacity(base.len() + extra.len());
    l.extend_from_slice(base);
    l.extend(extra.iter().map(|&(k, v)| (k, v.to_string())));
    l
}

fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Rust's `Display` for f64 is the shortest round-trip form and never uses an exponent, so
/// integers print as integers (1536, not 1.536e3); only the non-finite ones need spelling.
fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v == 0.0 {
        "0".into() // not "-0"
    } else {
        v.to_string()
    }
}

fn pct(p: Option<u32>) -> Option<f64> {
    p.map(|p| p as f64 / 100.0)
}

fn ratio(used: Option<u64>, total: Option<u64>) -> Option<f64> {
    match (used, total) {
        (Some(u), Some(t)) if t > 0 => Some(u as f64 / t as f64),
        _ => None,
    }
}

const MIB: f64 = (1u64 << 20) as f64;

/// Renders the snapshot and the agent's own stats in the Prometheus text format 0.0.4.
pub fn render(snap: &Snapshot, stats: &AgentStats, opts: &PromOptions) -> String {
    let node = opts
        .node
        .node_name
        .as_deref()
        .unwrap_or(&opts.node.host_name);
    let mut out = Out::new(Dropped::of(&opts.groups));
    if opts.groups.device {
        devices(&mut out, snap, node);
    }
    if opts.groups.container {
        containers(&mut out, snap, node);
    }
    if opts.groups.process {
        processes(&mut out, snap, node);
    }
    if opts.groups.self_metrics {
        self_metrics(&mut out, stats);
    }
    if opts.dcgm_compat {
        dcgm(&mut out, snap, node, &opts.groups);
    }
    out.render()
}

fn devices(out: &mut Out, snap: &Snapshot, node: &str) {
    let f = |v: Option<u64>| v.map(|v| v as f64);
    let mhz = |v: Option<u32>| v.map(|v| v as f64 * 1e6);
    for d in &snap.devices {
        let l: Labels = vec![
            (Attr::HwId, d.uuid.clone()),
            (Attr::GpuIndex, d.index.to_string()),
            (Attr::HwModel, d.name.clone()),
            (Attr::PciBusId, d.pci_bus_id.clone().unwrap_or_default()),
            (Attr::Node, node.to_string()),
        ];
        memory(out, &l, d.memory_used_bytes, d.memory_total_bytes);
        let [general, memctl, ..] = GPU_TASKS;
        let task = |t| with(&l, &[(Attr::HwGpuTask, t)]);
        out.opt(M::HwGpuUtilization, &task(general), pct(d.utilization_gpu));
        out.opt(
            M::HwGpuUtilization,
            &task(memctl),
            pct(d.utilization_memory),
        );
        out.opt(M::HwPower, &l, d.power_mw.map(|v| v as f64 / 1000.0));
        out.opt(M::HwEnergy, &l, d.energy_mj.map(|v| v as f64 / 1000.0));
        out.opt(M::HwTemperature, &l, d.temperature_c.map(f64::from));
        let [corrected, uncorrected] = ECC_ERROR_TYPES;
        let error = |t| with(&l, &[(Attr::ErrorType, t)]);
        out.opt(M::HwErrors, &error(corrected), f(d.ecc_corrected));
        out.opt(M::HwErrors, &error(uncorrected), f(d.ecc_uncorrected));
        // "lost" and "error: ..." (no handle) both mean the device cannot be used.
        let ok = d.status.is_ok() as u8 as f64;
        let [ok_state, failed_state] = HW_STATES;
        out.add(M::HwStatus, with(&l, &[(Attr::HwState, ok_state)]), ok);
        out.add(
            M::HwStatus,
            with(&l, &[(Attr::HwState, failed_state)]),
            1.0 - ok,
        );
        let [sm, memory_clock] = CLOCKS;
        let clock = |c| with(&l, &[(Attr::Clock, c)]);
        out.opt(M::HwGpuClock, &clock(sm), mhz(d.sm_clock_mhz));
        out.opt(M::HwGpuClock, &clock(memory_clock), mhz(d.mem_clock_mhz));
        // MIG devices: NVML tells only their memory; the rest is the parent's.
        for m in &d.mig_devices {
            let mut ml = l.clone();
            ml[0].1 = m.uuid.clone();
            ml.push((Attr::HwParent, d.uuid.clone()));
            memory(out, &ml, m.memory_used_bytes, m.memory_total_bytes);
        }
    }
}

/// A device's memory usage, size and their ratio.
fn memory(out: &mut Out, l: &Labels, used: Option<u64>, total: Option<u64>) {
    out.opt(M::HwGpuMemoryUsage, l, used.map(|v| v as f64));
    out.opt(M::HwGpuMemoryLimit, l, total.map(|v| v as f64));
    out.opt(M::HwGpuMemoryUtilization, l, ratio(used, total));
}

/// A container, a pod-level cgroup, or the host (outside any container).
fn owner(c: &ContainerUsage) -> &'static str {
    let [container, pod, host] = OWNERS;
    match (&c.container_id, &c.pod_uid) {
        (Some(_), _) => container,
        (None, Some(_)) => pod,
        (None, None) => host,
    }
}

fn s(v: &Option<String>) -> String {
    v.clone().unwrap_or_default()
}

fn containers(out: &mut Out, snap: &Snapshot, node: &str) {
    accounts(out, snap, node);
    for c in &snap.containers {
        for g in &c.gpus {
            let l: Labels = vec![
                (Attr::ContainerId, s(&c.container_id)),
                (Attr::PodUid, s(&c.pod_uid)),
                (Attr::Namespace, s(&c.namespace)),
                (Attr::PodName, s(&c.pod_name)),
                (Attr::ContainerName, s(&c.container_name)),
                (Attr::Qos, c.qos.unwrap_or_default().to_string()),
                (Attr::Runtime, c.runtime.unwrap_or_default().to_string()),
                (Attr::HwId, g.uuid.clone()),
                (Attr::GpuUuid, g.gpu_uuid.clone()),
                (Attr::Node, node.to_string()),
                (Attr::Owner, owner(c).to_string()),
            ];
            let memory = g.memory_used_bytes as f64;
            out.add(M::ContainerGpuMemoryUsage, l.clone(), memory);
            let util = [g.sm_util, g.mem_util, g.enc_util, g.dec_util];
            utilizations(out, M::ContainerGpuUtilization, &l, util);
            out.add(M::ContainerGpuTime, l.clone(), g.gpu_time_seconds);
            out.add(M::ContainerGpuMemoryTime, l.clone(), g.memory_byte_seconds);
            out.add(M::ContainerGpuProcesses, l, g.pids.len() as f64);
        }
        let idle = c.idle_allocations();
        for u in &c.allocated_gpus {
            let l: Labels = vec![
                (Attr::ContainerId, s(&c.container_id)),
                (Attr::PodUid, s(&c.pod_uid)),
                (Attr::Namespace, s(&c.namespace)),
                (Attr::PodName, s(&c.pod_name)),
                (Attr::ContainerName, s(&c.container_name)),
                (Attr::HwId, u.clone()),
                (Attr::Node, node.to_string()),
            ];
            out.add(M::ContainerGpuAllocated, l.clone(), 1.0);
            let is_idle = idle.contains(&u.as_str()) as u8 as f64;
            out.add(M::ContainerGpuAllocatedIdle, l, is_idle);
        }
    }
}

/// Energy, peak memory, limits and NVML accounting per container and device, and each
/// GPU's idle energy under `owner="idle"`.
fn accounts(out: &mut Out, snap: &Snapshot, node: &str) {
    let labels = |c: &ContainerUsage, uuid: &str, gpu: &str, owner: &str| -> Labels {
        vec![
            (Attr::ContainerId, s(&c.container_id)),
            (Attr::PodUid, s(&c.pod_uid)),
            (Attr::Namespace, s(&c.namespace)),
            (Attr::PodName, s(&c.pod_name)),
            (Attr::ContainerName, s(&c.container_name)),
            (Attr::Qos, c.qos.unwrap_or_default().to_string()),
            (Attr::Runtime, c.runtime.unwrap_or_default().to_string()),
            (Attr::HwId, uuid.to_string()),
            (Attr::GpuUuid, gpu.to_string()),
            (Attr::Node, node.to_string()),
            (Attr::Owner, owner.to_string()),
        ]
    };
    for c in &snap.containers {
        for a in &c.accounts {
            let l = labels(c, &a.uuid, &a.gpu_uuid, owner(c));
            if a.energy_since_ms > 0 {
                out.add(M::ContainerGpuEnergy, l.clone(), a.energy_joules);
            }
            out.opt(
                M::ContainerGpuMemoryPeak,
                &l,
                a.memory_peak_bytes.map(|v| v as f64),
            );
            if let (Some(v), Some(src)) = (a.memory_limit_bytes, a.memory_limit_source) {
                let ll = with(&l, &[(Attr::LimitSource, src.as_str())]);
                out.add(M::ContainerGpuMemoryLimit, ll, v as f64);
            }
            out.opt(M::ContainerGpuUtilizationLimit, &l, pct(a.sm_limit_percent));
            if a.accounted_processes > 0 {
                out.add(
                    M::ContainerGpuAccountingTime,
                    l.clone(),
                    a.accounted_gpu_seconds,
                );
                let n = a.accounted_processes as f64;
                out.add(M::ContainerGpuAccountingProcesses, l, n);
            }
        }
    }
    let nobody = ContainerUsage::default();
    for d in &snap.devices {
        if let Some(j) = d.sharing.idle_energy_joules {
            out.add(
                M::ContainerGpuEnergy,
                labels(&nobody, &d.uuid, &d.uuid, OWNER_IDLE),
                j,
            );
        }
    }
}

/// The four engines NVML samples per process: SM, memory controller, encoder, decoder.
fn utilizations(out: &mut Out, id: MetricId, l: &Labels, v: [Option<u32>; 4]) {
    for (task, v) in GPU_TASKS.into_iter().zip(v) {
        out.opt(id, &with(l, &[(Attr::HwGpuTask, task)]), pct(v));
    }
}

fn processes(out: &mut Out, snap: &Snapshot, node: &str) {
    for p in &snap.processes {
        let l: Labels = vec![
            (Attr::ProcessPid, p.pid.to_string()),
            (Attr::Comm, s(&p.comm)),
            (Attr::ContainerId, s(&p.container_id)),
            (Attr::PodUid, s(&p.pod_uid)),
            (Attr::HwId, p.uuid.clone()),
            (Attr::Node, node.to_string()),
        ];
        out.add(
            M::ProcessGpuMemoryUsage,
            l.clone(),
            p.used_memory_bytes as f64,
        );
        let util = [p.sm_util, p.mem_util, p.enc_util, p.dec_util];
        utilizations(out, M::ProcessGpuUtilization, &l, util);
    }
}

fn self_metrics(out: &mut Out, st: &AgentStats) {
    let counters = [
        (M::EventsReceived, st.events_received),
        (M::EventsLost, st.events_lost),
        (M::Resyncs, st.resyncs),
        (M::ProcfsFallbackLookups, st.procfs_fallback_lookups),
        (M::CachedProcesses, st.cached_processes),
        (M::ExportFailures, st.export_failures),
        (M::ExportDroppedBatches, st.export_dropped_batches),
        (M::UsageRecordsEmitted, st.usage_records),
        (M::UsageRecordsDropped, st.usage_records_dropped),
    ];
    for (id, v) in counters {
        out.add(id, vec![], v as f64);
    }
    out.add(M::Mode, vec![(Attr::Mode, st.mode.to_string())], 1.0);
    out.add(M::NvmlUp, vec![], st.nvml.is_ok() as u8 as f64);
    let version = env!("CARGO_PKG_VERSION").to_string();
    out.add(M::Info, vec![(Attr::Version, version)], 1.0);
}

/// dcgm-exporter's labels for a device: `gpu`, `UUID` (the physical GPU's, also on MIG
/// series), `pci_bus_id`, `device` (nvidia<index>), `modelName`, `GPU_I_ID` on MIG series,
/// `Hostname` (its released versions' spelling; the node name when known, as it does) and
/// the driver version label it attaches by default. `modelName` is camelCase, which promtool
/// flags; it is kept so that existing queries by it keep working.
fn dcgm_device_labels(d: &DeviceSample, gi: Option<u32>, node: &str, driver: &str) -> Labels {
    let mut l: Labels = vec![
        (Attr::GpuIndex, d.index.to_string()),
        (Attr::DcgmUuid, d.uuid.clone()),
        (Attr::PciBusId, d.pci_bus_id.clone().unwrap_or_default()),
        (Attr::DcgmDevice, format!("nvidia{}", d.index)),
        (Attr::DcgmModelName, d.name.clone()),
    ];
    // No GPU_I_PROFILE: the snapshot does not carry the MIG profile name.
    if let Some(gi) = gi {
        l.push((Attr::DcgmGpuInstance, gi.to_string()));
    }
    l.push((Attr::DcgmHostname, node.to_string()));
    if !driver.is_empty() {
        l.push((Attr::DcgmDriverVersion, driver.to_string()));
    }
    l
}

/// dcgm-exporter's names for what we measure, so dashboards built on them (Grafana 12239)
/// and existing alerts keep working.
///
/// Where this differs from dcgm-exporter: it learns from the kubelet which pod was
/// *allocated* a GPU and relabels the device's values with that pod, so a shared
/// (time-sliced) GPU repeats the whole device's value under every pod. Here each container
/// gets a series of its own with its *own* FB_USED (its processes' memory) and GPU_UTIL /
/// MEM_COPY_UTIL (its processes' utilization), labelled also with `pod_uid` (as
/// dcgm-exporter's --kubernetes-enable-pod-uid does) and `container_id`, so containers
/// whose names are unknown stay distinct. The device keeps one series of its own, with
/// empty pod, namespace and container, for the whole device. So summing a DCGM family
/// over all series counts a GPU's usage twice: the device series are those with
/// `pod_uid="",container_id=""`. Processes outside any container are in the device series
/// only. FB_FREE is total - used (NVML's reserved memory is not in the snapshot).
fn dcgm(out: &mut Out, snap: &Snapshot, node: &str, groups: &Groups) {
    let driver = snap.driver_version.as_deref().unwrap_or_default();
    if groups.device {
        for d in &snap.devices {
            dcgm_device(out, d, node, driver);
        }
    }
    if groups.container {
        for c in &snap.containers {
            if c.container_id.is_none() && c.pod_uid.is_none() {
                continue; // not a container: already in the device series
            }
            for g in &c.gpus {
                // A device missing from the snapshot (lost) has no labels to give.
                let Some(d) = snap.devices.iter().find(|d| d.uuid == g.gpu_uuid) else {
                    continue;
                };
                let gi = d
                    .mig_devices
                    .iter()
                    .find(|m| m.uuid == g.uuid)
                    .map(|m| m.gpu_instance_id);
                let l = dcgm_device_labels(d, gi, node, driver);
                let l = with(
                    &l,
                    &[
                        (Attr::ContainerName, &s(&c.container_name)),
                        (Attr::Namespace, &s(&c.namespace)),
                        (Attr::PodName, &s(&c.pod_name)),
                        (Attr::PodUid, &s(&c.pod_uid)),
                        (Attr::ContainerId, &s(&c.container_id)),
                    ],
                );
                out.add(M::DcgmFbUsed, l.clone(), mib(g.memory_used_bytes));
                out.opt(M::DcgmGpuUtil, &l, g.sm_util.map(f64::from));
                out.opt(M::DcgmMemCopyUtil, &l, g.mem_util.map(f64::from));
            }
        }
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB
}

/// One GPU's dcgm series, and its MIG devices' memory, with empty pod labels.
fn dcgm_device(out: &mut Out, d: &DeviceSample, node: &str, driver: &str) {
    let no_pod = [
        (Attr::ContainerName, ""),
        (Attr::Namespace, ""),
        (Attr::PodName, ""),
    ];
    let l = with(&dcgm_device_labels(d, None, node, driver), &no_pod);
    let (used, total) = (d.memory_used_bytes, d.memory_total_bytes);
    out.opt(M::DcgmFbUsed, &l, used.map(mib));
    let free = used.zip(total).map(|(u, t)| mib(t.saturating_sub(u)));
    out.opt(M::DcgmFbFree, &l, free);
    out.opt(M::DcgmGpuUtil, &l, d.utilization_gpu.map(f64::from));
    out.opt(M::DcgmMemCopyUtil, &l, d.utilization_memory.map(f64::from));
    out.opt(M::DcgmPowerUsage, &l, d.power_mw.map(|v| v as f64 / 1000.0));
    out.opt(M::DcgmGpuTemp, &l, d.temperature_c.map(f64::from));
    out.opt(M::DcgmSmClock, &l, d.sm_clock_mhz.map(f64::from));
    out.opt(M::DcgmMemClock, &l, d.mem_clock_mhz.map(f64::from));
    for m in &d.mig_devices {
        let gi = Some(m.gpu_instance_id);
        let ml = with(&dcgm_device_labels(d, gi, node, driver), &no_pod);
        let (used, total) = (m.memory_used_bytes, m.memory_total_bytes);
        out.opt(M::DcgmFbUsed, &ml, used.map(mib));
        let free = used.zip(total).map(|(u, t)| mib(t.saturating_sub(u)));
        out.opt(M::DcgmFbFree, &ml, free);
    }
}

#[cfg(test)]
mod tests {
    use gpu_model::{
        ContainerGpu, DeviceStatus, GpuAccount, LimitSource, MigSample, ProcessUsage, SourceStatus,
        TrackingMode,
    };

    use super::*;

    const GIB: u64 = 1 << 30;
    const CID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const H100: &str = r#"hw_id="GPU-a",gpu="0",model="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:18:00.0",node="node-a""#;

    fn gpu(index: u32, uuid: &str, name: &str) -> DeviceSample {
        DeviceSample {
            index,
            uuid: uuid.into(),
            name: name.into(),
            pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x18 + index)),
            status: DeviceStatus::Ok,
            ..Default::default()
        }
    }

    fn cgpu(uuid: &str, gpu_uuid: &str, mem: u64, sm: Option<u32>, pids: &[u32]) -> ContainerGpu {
        ContainerGpu {
            uuid: uuid.into(),
            gpu_uuid: gpu_uuid.into(),
            memory_used_bytes: mem,
            sm_util: sm,
            mem_util: sm.map(|_| 10),
            enc_util: sm.map(|_| 0),
            dec_util: None,
            pids: pids.to_vec(),
            gpu_time_seconds: 12.5,
            memory_byte_seconds: 1.5e12,
            counters_since_ms: 1,
        }
    }

    /// Two GPUs (the second with MIG on and one MIG device), a lost third, a container on
    /// the first GPU and the MIG device, a pod-level cgroup and the host entry.
    fn snapshot() -> Snapshot {
        let mut a = gpu(0, "GPU-a", "NVIDIA H100 80GB HBM3");
        a.memory_total_bytes = Some(80 * GIB);
        a.memory_used_bytes = Some(3 * GIB);
        a.utilization_gpu = Some(60);
        a.utilization_memory = Some(29);
        a.power_mw = Some(350_500);
        a.energy_mj = Some(123_456_789);
        a.temperature_c = Some(45);
        a.sm_clock_mhz = Some(1980);
        a.mem_clock_mhz = Some(2619);
        a.ecc_corrected = Some(2);
        a.ecc_uncorrected = Some(0);
        a.sharing.idle_energy_joules = Some(250.5);
        let mut b = gpu(1, "GPU-b", "NVIDIA A100-SXM4-80GB");
        b.memory_total_bytes = Some(80 * GIB);
        b.memory_used_bytes = Some(5 * GIB);
        b.mig_enabled = true;
        b.mig_devices = vec![MigSample {
            uuid: "MIG-c".into(),
            gpu_instance_id: 2,
            compute_instance_id: 0,
            memory_total_bytes: Some(20 * GIB),
            memory_used_bytes: Some(5 * GIB),
        }];
        let mut lost = gpu(2, "GPU-d", "NVIDIA H100 80GB HBM3");
        lost.status = DeviceStatus::Lost;
        Snapshot {
            taken_at_ms: 1,
            nvml: SourceStatus::Ok,
            driver_version: Some("580.159.04".into()),
            devices: vec![a, b, lost],
            containers: vec![
                ContainerUsage {
                    container_id: Some(CID.into()),
                    pod_uid: Some("uid-1".into()),
                    qos: Some("burstable"),
                    runtime: Some("containerd"),
                    pod_name: Some("trainer".into()),
                    namespace: Some("ml".into()),
                    container_name: Some("main".into()),
                    allocated_gpus: vec!["GPU-a".into(), "GPU-d".into()],
                    gpus: vec![
                        cgpu("GPU-a", "GPU-a", 3 * GIB / 2, Some(50), &[10, 11]),
                        cgpu("MIG-c", "GPU-b", 5 * GIB, None, &[12]),
                    ],
                    accounts: vec![
                        GpuAccount {
                            uuid: "GPU-a".into(),
                            gpu_uuid: "GPU-a".into(),
                            energy_joules: 1000.25,
                            energy_since_ms: 1,
                            memory_peak_bytes: Some(2 * GIB),
                            memory_limit_bytes: Some(4 * GIB),
                            memory_limit_source: Some(LimitSource::Hami),
                            sm_limit_percent: Some(50),
                            accounted_processes: 3,
                            accounted_gpu_seconds: 0.75,
                        },
                        GpuAccount {
                            uuid: "MIG-c".into(),
                            gpu_uuid: "GPU-b".into(),
                            memory_limit_bytes: Some(20 * GIB),
                            memory_limit_source: Some(LimitSource::Mig),
                            ..Default::default()
                        },
                    ],
                    ..Default::default()
                },
                ContainerUsage {
                    pod_uid: Some("uid-2".into()),
                    qos: Some("besteffort"),
                    gpus: vec![cgpu("GPU-a", "GPU-a", GIB, Some(5), &[20])],
                    ..Default::default()
                },
                ContainerUsage {
                    gpus: vec![cgpu("GPU-a", "GPU-a", GIB / 2, Some(0), &[30])],
                    ..Default::default()
                },
            ],
            processes: vec![ProcessUsage {
                pid: 10,
                comm: Some("python3".into()),
                container_id: Some(CID.into()),
                pod_uid: Some("uid-1".into()),
                uuid: "GPU-a".into(),
                used_memory_bytes: GIB,
                sm_util: Some(30),
                mem_util: None,
                enc_util: None,
                dec_util: None,
                exited: false,
            }],
        }
    }

    fn stats() -> AgentStats {
        AgentStats {
            started_ms: 1,
            mode: TrackingMode::Ebpf,
            events_received: 1234,
            events_lost: 0,
            resyncs: 1,
            procfs_fallback_lookups: 3,
            cached_processes: 250,
            nvml: SourceStatus::Ok,
            ..Default::default()
        }
    }

    fn opts() -> PromOptions {
        PromOptions {
            node: NodeIdentity {
                host_name: "host-a".into(),
                node_name: Some("node-a".into()),
            },
            groups: Groups::default(),
            dcgm_compat: false,
        }
    }

    #[track_caller]
    fn has(text: &str, line: &str) {
        assert!(
            text.lines().any(|l| l == line),
            "missing line\n  {line}\nin\n{text}"
        );
    }

    fn lines_of<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            .collect()
    }

    #[test]
    fn device_series() {
        let t = render(&snapshot(), &stats(), &opts());
        has(
            &t,
            "# HELP hw_gpu_memory_usage_bytes GPU memory in use, bytes.",
        );
        has(&t, "# TYPE hw_gpu_memory_usage_bytes gauge");
        has(
            &t,
            &format!("hw_gpu_memory_usage_bytes{{{H100}}} 3221225472"),
        );
        has(
            &t,
            &format!("hw_gpu_memory_limit_bytes{{{H100}}} 85899345920"),
        );
        has(
            &t,
            &format!("hw_gpu_memory_utilization_ratio{{{H100}}} 0.0375"),
        );
        has(
            &t,
            &format!(r#"hw_gpu_utilization_ratio{{{H100},hw_gpu_task="general"}} 0.6"#),
        );
        has(
            &t,
            &format!(r#"hw_gpu_utilization_ratio{{{H100},hw_gpu_task="memory_controller"}} 0.29"#),
        );
        has(&t, &format!("hw_power_watts{{{H100}}} 350.5"));
        has(&t, "# TYPE hw_energy_joules_total counter");
        has(&t, &format!("hw_energy_joules_total{{{H100}}} 123456.789"));
        has(&t, &format!("hw_temperature_celsius{{{H100}}} 45"));
        has(
            &t,
            &format!(r#"hw_errors_total{{{H100},error_type="corrected"}} 2"#),
        );
        has(
            &t,
            &format!(r#"hw_errors_total{{{H100},error_type="uncorrected"}} 0"#),
        );
        has(&t, &format!(r#"hw_status{{{H100},hw_state="ok"}} 1"#));
        has(&t, &format!(r#"hw_status{{{H100},hw_state="failed"}} 0"#));
        has(
            &t,
            &format!(r#"hw_gpu_clock_hertz{{{H100},clock="sm"}} 1980000000"#),
        );
        has(
            &t,
            &format!(r#"hw_gpu_clock_hertz{{{H100},clock="memory"}} 2619000000"#),
        );
        // The MIG device: memory only, with its parent.
        let mig = r#"hw_id="MIG-c",gpu="1",model="NVIDIA A100-SXM4-80GB",pci_bus_id="00000000:19:00.0",node="node-a",hw_parent="GPU-b""#;
        has(
            &t,
            &format!("hw_gpu_memory_usage_bytes{{{mig}}} 5368709120"),
        );
        has(
            &t,
            &format!("hw_gpu_memory_limit_bytes{{{mig}}} 21474836480"),
        );
        has(
            &t,
            &format!("hw_gpu_memory_utilization_ratio{{{mig}}} 0.25"),
        );
        let hw = |id: &str| {
            t.lines()
                .filter(|l| l.starts_with("hw_") && l.contains(&format!("hw_id=\"{id}\"")))
                .count()
        };
        assert_eq!(hw("MIG-c"), 3, "{t}");
        // No utilization under MIG: no series, not a 0.
        assert!(
            !t.contains(r#"hw_gpu_utilization_ratio{hw_id="GPU-b""#),
            "{t}"
        );
        // The lost GPU: failed, and nothing else.
        let lost = r#"hw_id="GPU-d",gpu="2",model="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:1A:00.0",node="node-a""#;
        has(&t, &format!(r#"hw_status{{{lost},hw_state="ok"}} 0"#));
        has(&t, &format!(r#"hw_status{{{lost},hw_state="failed"}} 1"#));
        assert_eq!(hw("GPU-d"), 2, "{t}");
    }

    #[test]
    fn container_series() {
        let t = render(&snapshot(), &stats(), &opts());
        let c = format!(
            r#"container_id="{CID}",pod_uid="uid-1",namespace="ml",pod="trainer",container="main",qos="burstable",runtime="containerd""#
        );
        let on_a = format!(r#"{c},hw_id="GPU-a",gpu_uuid="GPU-a",node="node-a",owner="container""#);
        has(
            &t,
            &format!("container_gpu_memory_usage_bytes{{{on_a}}} 1610612736"),
        );
        has(
            &t,
            &format!(r#"container_gpu_utilization_ratio{{{on_a},hw_gpu_task="general"}} 0.5"#),
        );
        has(
            &t,
            &format!(
                r#"container_gpu_utilization_ratio{{{on_a},hw_gpu_task="memory_controller"}} 0.1"#
            ),
        );
        has(
            &t,
            &format!(r#"container_gpu_utilization_ratio{{{on_a},hw_gpu_task="encoder"}} 0"#),
        );
        assert!(!t.contains("decoder"), "dec_util is None: {t}");
        has(&t, "# TYPE container_gpu_time_seconds_total counter");
        has(
            &t,
            &format!("container_gpu_time_seconds_total{{{on_a}}} 12.5"),
        );
        has(
            &t,
            &format!("container_gpu_memory_byte_seconds_total{{{on_a}}} 1500000000000"),
        );
        has(&t, &format!("container_gpu_processes{{{on_a}}} 2"));
        // On the MIG device: charged to it, the physical GPU beside it; no utilization.
        let on_mig =
            format!(r#"{c},hw_id="MIG-c",gpu_uuid="GPU-b",node="node-a",owner="container""#);
        has(
            &t,
            &format!("container_gpu_memory_usage_bytes{{{on_mig}}} 5368709120"),
        );
        assert!(!t.contains(&format!("container_gpu_utilization_ratio{{{on_mig}")));
        // A pod-level cgroup and the host entry.
        has(
            &t,
            r#"container_gpu_memory_usage_bytes{container_id="",pod_uid="uid-2",namespace="",pod="",container="",qos="besteffort",runtime="",hw_id="GPU-a",gpu_uuid="GPU-a",node="node-a",owner="pod"} 1073741824"#,
        );
        has(
            &t,
            r#"container_gpu_memory_usage_bytes{container_id="",pod_uid="",namespace="",pod="",container="",qos="",runtime="",hw_id="GPU-a",gpu_uuid="GPU-a",node="node-a",owner="host"} 536870912"#,
        );
        assert_eq!(lines_of(&t, "container_gpu_memory_usage_bytes").len(), 4);
        // Processes are off by default.
        assert!(!t.contains("process_gpu"), "{t}");
    }

    #[test]
    fn self_series() {
        let t = render(&snapshot(), &stats(), &opts());
        has(&t, "# TYPE gpu_agent_events_received_total counter");
        has(&t, "gpu_agent_events_received_total 1234");
        has(&t, "gpu_agent_events_lost_total 0");
        has(&t, "gpu_agent_resyncs_total 1");
        has(&t, "gpu_agent_procfs_fallback_lookups_total 3");
        has(&t, "# TYPE gpu_agent_cached_processes gauge");
        has(&t, "gpu_agent_cached_processes 250");
        has(&t, "gpu_agent_export_failures_total 0");
        has(&t, "gpu_agent_export_dropped_batches_total 0");
        has(&t, r#"gpu_agent_mode{mode="ebpf"} 1"#);
        has(&t, "gpu_agent_nvml_up 1");
        has(
            &t,
            &format!(
                r#"gpu_agent_info{{version="{}"}} 1"#,
                env!("CARGO_PKG_VERSION")
            ),
        );
        let down = AgentStats {
            nvml: SourceStatus::Unavailable("the NVIDIA driver is not loaded".into()),
            ..stats()
        };
        has(
            &render(&Snapshot::default(), &down, &opts()),
            "gpu_agent_nvml_up 0",
        );
    }

    #[test]
    fn energy_limits_peaks_and_accounting_series() {
        let t = render(&snapshot(), &stats(), &opts());
        let c = format!(
            r#"container_id="{CID}",pod_uid="uid-1",namespace="ml",pod="trainer",container="main",qos="burstable",runtime="containerd""#
        );
        let on_a = format!(r#"{c},hw_id="GPU-a",gpu_uuid="GPU-a",node="node-a",owner="container""#);
        has(
            &t,
            &format!("container_gpu_energy_joules_total{{{on_a}}} 1000.25"),
        );
        has(
            &t,
            &format!("container_gpu_memory_peak_bytes{{{on_a}}} 2147483648"),
        );
        has(
            &t,
            &format!(
                r#"container_gpu_memory_limit_bytes{{{on_a},limit_source="hami"}} 4294967296"#
            ),
        );
        let on_mig =
            format!(r#"{c},hw_id="MIG-c",gpu_uuid="GPU-b",node="node-a",owner="container""#);
        has(
            &t,
            &format!(
                r#"container_gpu_memory_limit_bytes{{{on_mig},limit_source="mig"}} 21474836480"#
            ),
        );
        has(
            &t,
            &format!("container_gpu_utilization_limit_ratio{{{on_a}}} 0.5"),
        );
        has(
            &t,
            &format!("container_gpu_accounting_time_seconds_total{{{on_a}}} 0.75"),
        );
        has(
            &t,
            &format!("container_gpu_accounting_processes_total{{{on_a}}} 3"),
        );
        // No energy charged on the MIG device yet: no series rather than a 0.
        assert!(
            !t.contains(&format!("container_gpu_energy_joules_total{{{on_mig}}}")),
            "{t}"
        );
        has(
            &t,
            r#"container_gpu_energy_joules_total{container_id="",pod_uid="",namespace="",pod="",container="",qos="",runtime="",hw_id="GPU-a",gpu_uuid="GPU-a",node="node-a",owner="idle"} 250.5"#,
        );
    }

    #[test]
    fn every_family_has_help_and_type_once_before_its_samples() {
        let mut o = opts();
        o.groups.process = true;
        o.dcgm_compat = true;
        let t = render(&snapshot(), &stats(), &o);
        let mut seen: Vec<&str> = vec![];
        let mut current = "";
        let mut lines = t.lines().peekable();
        while let Some(l) = lines.next() {
            if let Some(rest) = l.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap();
                assert!(!seen.contains(&name), "{name} twice");
                seen.push(name);
                let ty = lines.next().unwrap();
                assert!(ty.starts_with(&format!("# TYPE {name} ")), "{ty}");
                current = name;
            } else {
                let name = l.split(['{', ' ']).next().unwrap();
                assert_eq!(name, current, "{l}");
            }
        }
        // Every family in the table appears with this snapshot.
        assert_eq!(
            seen.len(),
            crate::catalogue::prometheus_names().count(),
            "{seen:?}"
        );
        // Deterministic.
        assert_eq!(t, render(&snapshot(), &stats(), &o));
    }

    #[test]
    fn label_values_are_escaped() {
        let mut snap = snapshot();
        snap.containers[0].pod_name = Some("a\"b\\c\nd".into());
        let mut o = opts();
        o.node.node_name = None;
        o.node.host_name = "h\"\\".into();
        let t = render(&snap, &stats(), &o);
        assert!(t.contains(r#"pod="a\"b\\c\nd""#), "{t}");
        assert!(t.contains(r#"node="h\"\\""#), "{t}");
        // One sample per line: the newline did not split one.
        for l in t.lines().filter(|l| !l.starts_with('#')) {
            assert!(l.ends_with(|c: char| c.is_ascii_digit()), "{l}");
        }
    }

    #[test]
    fn groups_switch_families_off() {
        let mut o = opts();
        o.groups = Groups {
            device: false,
            container: false,
            process: true,
            self_metrics: false,
            drop_attributes: vec![],
        };
        o.dcgm_compat = true;
        let t = render(&snapshot(), &stats(), &o);
        for off in ["hw_", "container_gpu", "gpu_agent", "DCGM", "# HELP hw_"] {
            assert!(!t.lines().any(|l| l.starts_with(off)), "{off}: {t}");
        }
        has(
            &t,
            &format!(
                r#"process_gpu_memory_usage_bytes{{pid="10",comm="python3",container_id="{CID}",pod_uid="uid-1",hw_id="GPU-a",node="node-a"}} 1073741824"#
            ),
        );
        has(
            &t,
            &format!(
                r#"process_gpu_utilization_ratio{{pid="10",comm="python3",container_id="{CID}",pod_uid="uid-1",hw_id="GPU-a",node="node-a",hw_gpu_task="general"}} 0.3"#
            ),
        );
        assert_eq!(lines_of(&t, "process_gpu_utilization_ratio").len(), 1);
        // Device on, container off: DCGM device series only.
        o.groups.device = true;
        let t = render(&snapshot(), &stats(), &o);
        assert!(t.contains("DCGM_FI_DEV_FB_USED"), "{t}");
        assert!(!t.contains("pod_uid=\"uid-1\",container_id"), "{t}");
        // Everything off: nothing at all.
        let none = PromOptions {
            groups: Groups {
                device: false,
                container: false,
                process: false,
                self_metrics: false,
                drop_attributes: vec![],
            },
            ..opts()
        };
        assert_eq!(render(&snapshot(), &stats(), &none), "");
    }

    #[test]
    fn dcgm_series_per_device_and_per_container() {
        let mut o = opts();
        o.dcgm_compat = true;
        let t = render(&snapshot(), &stats(), &o);
        let dev = r#"gpu="0",UUID="GPU-a",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-a",DCGM_FI_DRIVER_VERSION="580.159.04""#;
        let whole = format!(r#"{dev},container="",namespace="",pod="""#);
        has(&t, "# TYPE DCGM_FI_DEV_FB_USED gauge");
        has(&t, &format!("DCGM_FI_DEV_FB_USED{{{whole}}} 3072"));
        has(&t, &format!("DCGM_FI_DEV_FB_FREE{{{whole}}} 78848"));
        has(&t, &format!("DCGM_FI_DEV_GPU_UTIL{{{whole}}} 60"));
        has(&t, &format!("DCGM_FI_DEV_MEM_COPY_UTIL{{{whole}}} 29"));
        has(&t, &format!("DCGM_FI_DEV_POWER_USAGE{{{whole}}} 350.5"));
        has(&t, &format!("DCGM_FI_DEV_GPU_TEMP{{{whole}}} 45"));
        has(&t, &format!("DCGM_FI_DEV_SM_CLOCK{{{whole}}} 1980"));
        has(&t, &format!("DCGM_FI_DEV_MEM_CLOCK{{{whole}}} 2619"));
        // The container: its own memory and utilization, not the device's.
        let mine = format!(
            r#"{dev},container="main",namespace="ml",pod="trainer",pod_uid="uid-1",container_id="{CID}""#
        );
        has(&t, &format!("DCGM_FI_DEV_FB_USED{{{mine}}} 1536"));
        has(&t, &format!("DCGM_FI_DEV_GPU_UTIL{{{mine}}} 50"));
        has(&t, &format!("DCGM_FI_DEV_MEM_COPY_UTIL{{{mine}}} 10"));
        assert!(!t.contains(&format!("DCGM_FI_DEV_FB_FREE{{{mine}")), "{t}");
        assert!(
            !t.contains(&format!("DCGM_FI_DEV_POWER_USAGE{{{mine}")),
            "{t}"
        );
        // The pod-level cgroup, names unknown: told apart by its uid.
        has(
            &t,
            &format!(
                r#"DCGM_FI_DEV_FB_USED{{{dev},container="",namespace="",pod="",pod_uid="uid-2",container_id=""}} 1024"#
            ),
        );
        // The MIG device and the container on it, by GPU instance; the parent's UUID.
        let mig = r#"gpu="1",UUID="GPU-b",pci_bus_id="00000000:19:00.0",device="nvidia1",modelName="NVIDIA A100-SXM4-80GB",GPU_I_ID="2",Hostname="node-a",DCGM_FI_DRIVER_VERSION="580.159.04""#;
        has(
            &t,
            &format!(r#"DCGM_FI_DEV_FB_USED{{{mig},container="",namespace="",pod=""}} 5120"#),
        );
        has(
            &t,
            &format!(r#"DCGM_FI_DEV_FB_FREE{{{mig},container="",namespace="",pod=""}} 15360"#),
        );
        has(
            &t,
            &format!(
                r#"DCGM_FI_DEV_FB_USED{{{mig},container="main",namespace="ml",pod="trainer",pod_uid="uid-1",container_id="{CID}"}} 5120"#
            ),
        );
        // Device series: 3 GPUs (the lost one has no memory) + 1 MIG; containers: 3 (not the host).
        assert_eq!(lines_of(&t, "DCGM_FI_DEV_FB_USED").len(), 2 + 1 + 3, "{t}");
        assert!(
            !t.contains(r#"pod_uid="",container_id="""#),
            "host entry: {t}"
        );
    }

    #[test]
    fn values_print_without_exponent_noise() {
        assert_eq!(format_value(85899345920.0), "85899345920");
        assert_eq!(format_value(1.5e12), "1500000000000");
        assert_eq!(format_value(0.29), "0.29");
        assert_eq!(format_value(-0.0), "0");
        assert_eq!(format_value(f64::INFINITY), "+Inf");
        assert_eq!(format_value(f64::NAN), "NaN");
        assert_eq!(pct(Some(7)).map(format_value).as_deref(), Some("0.07"));
    }

    /// The value of the first series of `family` whose labels contain every one of `with`.
    fn value_of(text: &str, family: &str, with: &[String]) -> f64 {
        let line = lines_of(text, family)
            .into_iter()
            .find(|l| with.iter().all(|w| l.contains(w.as_str())))
            .unwrap_or_else(|| panic!("no {family} series with {with:?} in\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    /// The catalogue's account of each dcgm field (docs/metrics.md prints it) is what the
    /// text holds: each dcgm series restates its source, converted to the dcgm unit.
    #[test]
    fn dcgm_series_restate_their_catalogue_source() {
        use crate::catalogue::{Source, CATALOGUE};
        let mut o = opts();
        o.dcgm_compat = true;
        let t = render(&snapshot(), &stats(), &o);
        let source = |src: &Source, scope: &[String]| -> f64 {
            let one = |id: MetricId, sel: Option<(Attr, &str)>| {
                let mut with = scope.to_vec();
                with.extend(sel.map(|(a, v)| format!("{}=\"{v}\"", a.label())));
                value_of(&t, id.prometheus(), &with)
            };
            match *src {
                Source::Metric(id, sel) => one(id, sel),
                Source::Difference(a, b) => one(a, None) - one(b, None),
            }
        };
        let device = [r#"hw_id="GPU-a""#.to_string()];
        let dcgm_device = [r#"UUID="GPU-a""#.to_string(), r#"pod=""}"#.to_string()];
        let container = [
            r#"hw_id="GPU-a""#.to_string(),
            format!(r#"container_id="{CID}""#),
        ];
        let dcgm_container = [
            r#"UUID="GPU-a""#.to_string(),
            format!(r#"container_id="{CID}""#),
        ];
        let mut checked = 0;
        for m in CATALOGUE.iter() {
            let Some(d) = &m.dcgm else { continue };
            let per_unit = match m.unit {
                "MiB" => MIB,
                "%" => 0.01,
                "MHz" => 1e6,
                "W" | "C" => 1.0,
                u => panic!("{u}: add its conversion"),
            };
            let name = m.prometheus.unwrap();
            let want = source(&d.device, &device) / per_unit;
            let got = value_of(&t, name, &dcgm_device);
            assert!((got - want).abs() < 1e-9, "{name}: {got} != {want}");
            if let Some(c) = &d.container {
                let want = source(c, &container) / per_unit;
                let got = value_of(&t, name, &dcgm_container);
                assert!(
                    (got - want).abs() < 1e-9,
                    "{name} of the container: {got} != {want}"
                );
            } else {
                assert!(!lines_of(&t, name)
                    .iter()
                    .any(|l| l.contains(&dcgm_container[1])));
            }
            checked += 1;
        }
        assert_eq!(checked, 8);
    }
}

#[cfg(test)]
mod allocation_tests {
    use super::*;

    #[test]
    fn allocated_and_idle_series() {
        let snap = Snapshot {
            containers: vec![ContainerUsage {
                container_id: Some("c1".into()),
                pod_uid: Some("u1".into()),
                pod_name: Some("p".into()),
                namespace: Some("ns".into()),
                container_name: Some("c".into()),
                allocated_gpus: vec!["GPU-z".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let t = render(&snap, &AgentStats::default(), &PromOptions::default());
        assert!(t.contains(r#"container_gpu_allocated{container_id="c1",pod_uid="u1",namespace="ns",pod="p",container="c",hw_id="GPU-z",node=""} 1"#), "{t}");
        assert!(t.contains(r#"container_gpu_allocated_idle{container_id="c1",pod_uid="u1",namespace="ns",pod="p",container="c",hw_id="GPU-z",node=""} 1"#), "{t}");
    }
}

#[cfg(test)]
mod drop_tests {
    use super::*;

    #[test]
    fn dropped_labels_are_left_off_every_series() {
        let snap = Snapshot {
            devices: vec![DeviceSample {
                uuid: "GPU-a".into(),
                name: "H100".into(),
                pci_bus_id: Some("0000:01:00.0".into()),
                status: gpu_model::DeviceStatus::Ok,
                memory_used_bytes: Some(5),
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut opts = PromOptions::default();
        opts.groups.drop_attributes = vec!["pci_bus_id".into(), "hw.gpu.index".into()];
        let t = render(&snap, &AgentStats::default(), &opts);
        assert!(
            t.contains("hw_gpu_memory_usage_bytes{hw_id=\"GPU-a\""),
            "{t}"
        );
        assert!(!t.contains("pci_bus_id"), "{t}");
    }
}
