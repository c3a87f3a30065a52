//! Prometheus text exposition (format 0.0.4) of a snapshot and the agent's own stats.
//!
//! Names are the OpenTelemetry -> Prometheus mapping of the OTLP names (`hw.gpu.memory.usage`
//! in By -> `hw_gpu_memory_usage_bytes`), so that the two sinks can be joined in queries.
//! Every family has HELP and TYPE and passes `promtool check metrics`; the one exception is
//! dcgm-exporter's own `modelName` label in the compatibility families (dcgm.rs).
//!
//! The text is made one family at a time ([`chunks`]), so that /metrics streams it: the
//! whole body never sits in memory, and the first bytes leave before the last are made.
//! Each series' label block is written once per object (device, container) and reused by
//! every family of it.
use std::{
    collections::HashSet,
    fmt::Write,
    hash::{BuildHasherDefault, Hasher},
    sync::Arc,
};

use gpu_model::{AgentStats, ContainerUsage, DeviceSample, DeviceStatus, Snapshot};

use crate::{
    catalogue::{
        Attr, Dropped, Group, Kind, MetricId as M, MetricId, CLOCKS, DIRECTIONS, ECC_ERROR_TYPES,
        ERROR_TYPES, GPU_ENGINES, GPU_LINKS, GPU_TASKS, HW_STATES, OWNERS, OWNER_IDLE,
        THROTTLE_REASONS,
    },
    dcgm::{self, DcgmCompat, Entity, Mode},
    Groups, NodeIdentity,
};

#[derive(Debug, Clone, Default)]
pub struct PromOptions {
    pub node: NodeIdentity,
    pub groups: Groups,
    /// Also serve dcgm-exporter's names (`--prometheus-compat dcgm` or `dcgm-virtual-gpus`).
    pub dcgm: Option<DcgmCompat>,
}

/// Renders the snapshot and the agent's own stats in the Prometheus text format 0.0.4.
pub fn render(snap: &Snapshot, stats: &AgentStats, opts: &PromOptions) -> String {
    let b = Blocks::new(snap, opts);
    let r = Renderer {
        snap,
        stats,
        opts,
        b: &b,
    };
    let mut s = String::new();
    for &id in &b.plan {
        r.family(id, &mut s);
    }
    s
}

/// The same text in pieces of about `CHUNK` bytes (a family at least), made as they are
/// asked for: what /metrics streams.
pub fn chunks(
    snap: Arc<Snapshot>,
    stats: AgentStats,
    opts: Arc<PromOptions>,
) -> impl Iterator<Item = String> + Send + 'static {
    let b = Blocks::new(&snap, &opts);
    let mut next = 0;
    std::iter::from_fn(move || {
        if next >= b.plan.len() {
            return None;
        }
        let r = Renderer {
            snap: &snap,
            stats: &stats,
            opts: &opts,
            b: &b,
        };
        let mut s = String::with_capacity(CHUNK + CHUNK / 4);
        while next < b.plan.len() && s.len() < CHUNK {
            r.family(b.plan[next], &mut s);
            next += 1;
        }
        Some(s)
    })
}

const CHUNK: usize = 256 << 10;

/// A fast hash of a series' label block, to drop a repeated one: a repeated label set would
/// make Prometheus reject the whole scrape.
#[derive(Default)]
struct Fx(u64);

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        let mix = |h: u64, w: u64| (h.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        let mut words = bytes.chunks_exact(8);
        for c in &mut words {
            self.0 = mix(self.0, u64::from_le_bytes(c.try_into().unwrap()));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.0 = mix(self.0, u64::from_le_bytes(w));
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// One family being written: HELP and TYPE go out with its first series.
struct Family<'o> {
    out: &'o mut String,
    name: &'static str,
    help: &'o str,
    kind: Kind,
    started: bool,
    seen: HashSet<u64, BuildHasherDefault<Fx>>,
    drop: Dropped,
}

impl Family<'_> {
    /// A series: `prefix` is a ready label block (`a="x",b="y"`), `extra` more labels.
    fn series(&mut self, prefix: &str, extra: &[(Attr, &str)], value: f64) {
        if !self.started {
            self.started = true;
            let _ = writeln!(self.out, "# HELP {} {}", self.name, escape_help(self.help));
            let _ = writeln!(
                self.out,
                "# TYPE {} {}",
                self.name,
                self.kind.prometheus_type()
            );
        }
        let start = self.out.len();
        self.out.push_str(self.name);
        let open = self.out.len();
        self.out.push('{');
        self.out.push_str(prefix);
        let mut first = prefix.is_empty();
        for &(k, v) in extra {
            if !self.drop.contains(k) {
                push_label(self.out, &mut first, k, v);
            }
        }
        if first {
            self.out.truncate(open); // no labels at all
        } else {
            self.out.push('}');
        }
        let mut h = Fx::default();
        h.write(&self.out.as_bytes()[open..]);
        if !self.seen.insert(h.finish()) {
            self.out.truncate(start);
            return;
        }
        self.out.push(' ');
        write_value(self.out, value);
        self.out.push('\n');
    }

    /// Skips unknown values: an absent series, not a made-up 0.
    fn opt(&mut self, prefix: &str, extra: &[(Attr, &str)], value: Option<f64>) {
        if let Some(v) = value {
            self.series(prefix, extra, v);
        }
    }
}

fn push_label(out: &mut String, first: &mut bool, k: Attr, v: &str) {
    if !*first {
        out.push(',');
    }
    *first = false;
    out.push_str(k.label());
    out.push_str("=\"");
    escape_label_into(out, v);
    out.push('"');
}

/// A label block from pairs, leaving out the dropped ones.
fn block(drop: Dropped, pairs: &[(Attr, &str)]) -> String {
    block_of(drop, pairs.iter().copied())
}

fn block_of<'a>(drop: Dropped, pairs: impl IntoIterator<Item = (Attr, &'a str)>) -> String {
    let pairs = pairs.into_iter();
    let mut s = String::with_capacity(pairs.size_hint().0 * 24);
    let mut first = true;
    for (k, v) in pairs {
        if !drop.contains(k) {
            push_label(&mut s, &mut first, k, v);
        }
    }
    s
}

/// A container's names, then `workload_kind` and `workload` where its pod's owner is
/// known.
fn container_labels(c: &ContainerUsage) -> impl Iterator<Item = (Attr, &str)> {
    let names = [
        (Attr::ContainerId, s(&c.container_id)),
        (Attr::PodUid, s(&c.pod_uid)),
        (Attr::Namespace, s(&c.namespace)),
        (Attr::PodName, s(&c.pod_name)),
        (Attr::ContainerName, s(&c.container_name)),
    ];
    let w = c.workload.as_deref();
    let owner = w.map(|w| {
        [
            (Attr::WorkloadKind, w.kind.as_str()),
            (Attr::Workload, &*w.name),
        ]
    });
    names.into_iter().chain(owner.into_iter().flatten())
}

fn escape_label_into(out: &mut String, v: &str) {
    // Nearly every value (ids, uuids, names) needs no escaping: one copy, not a push per char.
    if !v.bytes().any(|b| matches!(b, b'\\' | b'"' | b'\n')) {
        out.push_str(v);
        return;
    }
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Rust's `Display` for f64 is the shortest round-trip form and never uses an exponent, so
/// integers print as integers (1536, not 1.536e3); only the non-finite ones need spelling.
fn write_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else if v == 0.0 {
        out.push('0'); // not "-0"
    } else {
        let _ = write!(out, "{v}");
    }
}

#[cfg(test)]
fn format_value(v: f64) -> String {
    let mut s = String::new();
    write_value(&mut s, v);
    s
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

fn f(v: Option<u64>) -> Option<f64> {
    v.map(|v| v as f64)
}

const MIB: f64 = (1u64 << 20) as f64;

/// What one render writes, made once: the families, in order, and the label blocks of
/// every object (owned, so that a stream can keep them between chunks).
struct Blocks {
    drop: Dropped,
    plan: Vec<MetricId>,
    /// Per device (GPU), and per MIG device of it.
    devices: Vec<String>,
    migs: Vec<Vec<String>>,
    /// Per container, per device it uses.
    containers: Vec<Vec<String>>,
    /// Per container, per device allocated to it.
    allocations: Vec<Vec<String>>,
    processes: Vec<String>,
    /// Per XID charge to a container.
    xids: Vec<String>,
    /// Per container, per device it is accounted on (energy, peaks, limits).
    accounts: Vec<Vec<String>>,
    /// Per device: its idle energy's entry (`owner="idle"`, no container).
    idle: Vec<String>,
    dcgm: Vec<Entity>,
}

/// One render's inputs.
struct Renderer<'a> {
    snap: &'a Snapshot,
    stats: &'a AgentStats,
    opts: &'a PromOptions,
    b: &'a Blocks,
}

impl Blocks {
    fn new(snap: &Snapshot, opts: &PromOptions) -> Blocks {
        let g = &opts.groups;
        let drop = Dropped::of(g);
        let node = opts
            .node
            .node_name
            .as_deref()
            .unwrap_or(&opts.node.host_name);
        let on = |group: Group| match group {
            Group::Device => g.device,
            Group::Container => g.container,
            Group::Process => g.process,
            Group::SelfMetrics => g.self_metrics,
            Group::Dcgm => false, // in the CSV's order, below
        };
        let mut plan: Vec<MetricId> = MetricId::ALL
            .iter()
            .copied()
            .filter(|id| id.def().prometheus.is_some() && on(id.def().group))
            .collect();
        // dcgm-exporter's series are device series.
        let dcgm = opts.dcgm.as_ref().filter(|_| g.device);
        if let Some(d) = dcgm {
            plan.extend(d.fields.iter().map(|f| f.id));
        }
        let mut b = Blocks {
            drop,
            plan,
            devices: vec![],
            migs: vec![],
            containers: vec![],
            allocations: vec![],
            processes: vec![],
            xids: vec![],
            accounts: vec![],
            idle: vec![],
            dcgm: vec![],
        };
        if g.device {
            b.device_blocks(snap, node);
        }
        if g.container {
            b.container_blocks(snap, node);
        }
        if g.process {
            b.process_blocks(snap, node);
        }
        if let Some(d) = dcgm {
            b.dcgm = dcgm_entities(snap, node, d, drop);
        }
        b
    }

    fn device_blocks(&mut self, snap: &Snapshot, node: &str) {
        for d in &snap.devices {
            let index = d.index.to_string();
            let pci = d.pci_bus_id.as_deref().unwrap_or_default();
            let pairs = |id: &str| {
                block(
                    self.drop,
                    &[
                        (Attr::HwId, id),
                        (Attr::GpuIndex, index.as_str()),
                        (Attr::HwModel, d.name.as_str()),
                        (Attr::PciBusId, pci),
                        (Attr::Node, node),
                    ],
                )
            };
            let dev = pairs(&d.uuid);
            let migs = d.mig_devices.iter().map(|m| {
                let mut b = pairs(&m.uuid);
                let mut first = b.is_empty();
                if !self.drop.contains(Attr::HwParent) {
                    push_label(&mut b, &mut first, Attr::HwParent, &d.uuid);
                }
                b
            });
            let migs = migs.collect();
            self.devices.push(dev);
            self.migs.push(migs);
        }
    }

    fn container_blocks(&mut self, snap: &Snapshot, node: &str) {
        let drop = self.drop;
        // A container's series on one device; `who` is its `owner`.
        let on_device = |c: &ContainerUsage, uuid: &str, gpu_uuid: &str, who: &str| {
            let rest = [
                (Attr::Qos, c.qos.unwrap_or_default()),
                (Attr::Runtime, c.runtime.unwrap_or_default()),
                (Attr::HwId, uuid),
                (Attr::GpuUuid, gpu_uuid),
                (Attr::Node, node),
                (Attr::Owner, who),
            ];
            block_of(drop, container_labels(c).chain(rest))
        };
        for c in &snap.containers {
            let per_gpu = c.gpus.iter();
            let per_gpu = per_gpu.map(|g| on_device(c, &g.uuid, &g.gpu_uuid, owner(c)));
            self.containers.push(per_gpu.collect());
            let accounts = c.accounts.iter();
            let accounts = accounts.map(|a| on_device(c, &a.uuid, &a.gpu_uuid, owner(c)));
            self.accounts.push(accounts.collect());
            let allocated = c.allocated_gpus.iter().map(|u| {
                let device = [(Attr::HwId, &**u), (Attr::Node, node)];
                block_of(drop, container_labels(c).chain(device))
            });
            self.allocations.push(allocated.collect());
        }
        for x in &snap.container_xids {
            let p = [
                (Attr::ContainerId, s(&x.container_id)),
                (Attr::PodUid, s(&x.pod_uid)),
                (Attr::Namespace, s(&x.namespace)),
                (Attr::PodName, s(&x.pod_name)),
                (Attr::ContainerName, s(&x.container_name)),
                (Attr::HwId, &x.uuid),
                (Attr::GpuUuid, &x.gpu_uuid),
                (Attr::Node, node),
            ];
            self.xids.push(block(self.drop, &p));
        }
        let nobody = ContainerUsage::default();
        let idle = snap.devices.iter();
        let idle = idle.map(|d| on_device(&nobody, &d.uuid, &d.uuid, OWNER_IDLE));
        self.idle = idle.collect();
    }

    fn process_blocks(&mut self, snap: &Snapshot, node: &str) {
        for p in &snap.processes {
            let pid = p.pid.to_string();
            let pairs = [
                (Attr::ProcessPid, pid.as_str()),
                (Attr::Comm, s(&p.comm)),
                (Attr::ContainerId, s(&p.container_id)),
                (Attr::PodUid, s(&p.pod_uid)),
                (Attr::HwId, &p.uuid),
                (Attr::Node, node),
            ];
            self.processes.push(block(self.drop, &pairs));
        }
    }
}

impl Renderer<'_> {
    /// Writes one family (nothing when it has no series).
    fn family(&self, id: MetricId, out: &mut String) {
        let def = id.def();
        let (kind, help) = match self.opts.dcgm.as_ref().filter(|_| def.group == Group::Dcgm) {
            Some(d) => match d.fields.iter().find(|f| f.id == id) {
                Some(f) => (f.kind, f.help.as_str()),
                None => return,
            },
            None => (def.kind, def.help),
        };
        let mut fam = Family {
            out,
            name: id.prometheus(),
            help,
            kind,
            started: false,
            seen: HashSet::default(),
            drop: self.b.drop,
        };
        match def.group {
            Group::Device => self.device_family(id, &mut fam),
            Group::Container => self.container_family(id, &mut fam),
            Group::Process => self.process_family(id, &mut fam),
            Group::SelfMetrics => self_family(id, self.stats, &mut fam),
            Group::Dcgm => self.dcgm_family(id, &mut fam),
        }
    }
}

fn s<S: AsRef<str>>(v: &Option<S>) -> &str {
    v.as_ref().map_or("", AsRef::as_ref)
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

/// The four engines NVML samples: SM, memory controller, encoder, decoder.
fn utilizations(f: &mut Family, l: &str, v: [Option<u32>; 4]) {
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
    fn device_family(&self, id: MetricId, f: &mut Family) {
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

    fn container_family(&self, id: MetricId, f: &mut Family) {
        let snap = self.snap;
        match id {
            M::ContainerGpuAllocated | M::ContainerGpuAllocatedIdle => {
                for (c, blocks) in snap.containers.iter().zip(&self.b.allocations) {
                    let idle = c.idle_allocations();
                    for (u, l) in c.allocated_gpus.iter().zip(blocks) {
                        let v = match id {
                            M::ContainerGpuAllocated => 1.0,
                            _ => idle.contains(&&**u) as u8 as f64,
                        };
                        f.series(l, &[], v);
                    }
                }
            }
            M::ContainerGpuEnergy
            | M::ContainerGpuMemoryPeak
            | M::ContainerGpuShare
            | M::ContainerGpuSmShare
            | M::ContainerGpuMemoryLimit
            | M::ContainerGpuUtilizationLimit
            | M::ContainerGpuAccountingTime
            | M::ContainerGpuAccountingProcesses => self.account_family(id, f),
            M::ContainerGpuErrors => {
                for (x, l) in snap.container_xids.iter().zip(&self.b.xids) {
                    let code = x.xid.to_string();
                    let labels = [
                        (Attr::ErrorType, ERROR_TYPES[3]),
                        (Attr::Xid, code.as_str()),
                    ];
                    f.series(l, &labels, x.count as f64);
                }
            }
            id => {
                for (c, blocks) in snap.containers.iter().zip(&self.b.containers) {
                    for (g, l) in c.gpus.iter().zip(blocks) {
                        match id {
                            M::ContainerGpuMemoryUsage => {
                                f.series(l, &[], g.memory_used_bytes as f64)
                            }
                            M::ContainerGpuUtilization => {
                                utilizations(f, l, [g.sm_util, g.mem_util, g.enc_util, g.dec_util])
                            }
                            M::ContainerGpuTime => {
                                if let Some(t) = g.gpu_time_seconds {
                                    f.series(l, &[], t)
                                }
                            }
                            M::ContainerGpuMemoryTime => f.series(l, &[], g.memory_byte_seconds),
                            M::ContainerGpuProcesses => f.series(l, &[], g.pids.len() as f64),
                            _ => {}
                        }
                    }
                }
            }
        }
    }

    /// Energy, peak memory, limits and NVML accounting per container and device, and each
    /// GPU's idle energy under `owner="idle"`.
    fn account_family(&self, id: MetricId, f: &mut Family) {
        let snap = self.snap;
        for (c, blocks) in snap.containers.iter().zip(&self.b.accounts) {
            for (a, l) in c.accounts.iter().zip(blocks) {
                let accounted = a.accounted_processes > 0;
                match id {
                    // No energy charged yet: no series rather than a 0.
                    M::ContainerGpuEnergy if a.energy_since_ms > 0 => {
                        f.series(l, &[], a.energy_joules)
                    }
                    M::ContainerGpuMemoryPeak => f.opt(l, &[], self::f(a.memory_peak_bytes)),
                    M::ContainerGpuShare | M::ContainerGpuSmShare => {
                        let v = match id {
                            M::ContainerGpuShare => a.gpus_held,
                            _ => a.sm_share,
                        };
                        if let Some(v) = v {
                            let (labels, n) = self.held_labels(a);
                            f.series(l, &labels[..n], v);
                        }
                    }
                    M::ContainerGpuMemoryLimit => {
                        if let (Some(v), Some(src)) = (a.memory_limit_bytes, a.memory_limit_source)
                        {
                            f.series(l, &[(Attr::LimitSource, src.as_str())], v as f64);
                        }
                    }
                    M::ContainerGpuUtilizationLimit => f.opt(l, &[], pct(a.sm_limit_percent)),
                    M::ContainerGpuAccountingTime if accounted => {
                        f.series(l, &[], a.accounted_gpu_seconds)
                    }
                    M::ContainerGpuAccountingProcesses if accounted => {
                        f.series(l, &[], a.accounted_processes as f64)
                    }
                    _ => {}
                }
            }
        }
        if id == M::ContainerGpuEnergy {
            for (d, l) in snap.devices.iter().zip(&self.b.idle) {
                f.opt(l, &[], d.sharing.idle_energy_joules);
            }
        }
    }

    /// `model` (the GPU's) and, on a MIG device, `mig_profile`: what rightsizing groups an
    /// account's series by.
    fn held_labels(&self, a: &gpu_model::GpuAccount) -> ([(Attr, &str); 2], usize) {
        let mut labels = [(Attr::HwModel, ""), (Attr::MigProfile, "")];
        let Some(d) = self.snap.devices.iter().find(|d| *d.uuid == *a.gpu_uuid) else {
            return (labels, 0);
        };
        labels[0].1 = &d.name;
        let mig = d.mig_devices.iter().find(|m| *m.uuid == *a.uuid);
        match mig.and_then(|m| m.profile.as_deref()) {
            Some(p) => {
                labels[1].1 = p;
                (labels, 2)
            }
            None => (labels, 1),
        }
    }

    fn process_family(&self, id: MetricId, f: &mut Family) {
        for (p, l) in self.snap.processes.iter().zip(&self.b.processes) {
            match id {
                M::ProcessGpuMemoryUsage => f.series(l, &[], p.used_memory_bytes as f64),
                M::ProcessGpuUtilization => {
                    utilizations(f, l, [p.sm_util, p.mem_util, p.enc_util, p.dec_util])
                }
                _ => {}
            }
        }
    }

    /// One dcgm-exporter field: a series per device (and per pod, under
    /// `dcgm-virtual-gpus`), as dcgm.rs describes.
    fn dcgm_family(&self, id: MetricId, f: &mut Family) {
        let Some(compat) = &self.opts.dcgm else {
            return;
        };
        for e in &self.b.dcgm {
            let d = &self.snap.devices[e.device];
            let v = match e.mig {
                None => dcgm::device_value(id, d),
                Some(m) => dcgm::mig_value(id, &d.mig_devices[m]),
            };
            let Some(v) = v else { continue };
            let code = (id == M::DcgmXidErrors).then(|| v.to_string());
            let xid = code.as_deref().map(|c| (c, dcgm::xid_message(v as u64)));
            match compat.mode {
                Mode::Default => {
                    let pod = dcgm::default_pod(&e.pods);
                    f.series(&e.labels, &dcgm::attributes(pod, false, xid), v);
                }
                Mode::VirtualGpus => self.virtual_gpus(id, e, v, xid, f),
            }
        }
    }

    /// dcgm-exporter's `--kubernetes-virtual-gpus`: a copy of the device series per pod;
    /// FB_USED and GPU_UTIL keep the device series and give each pod its own value.
    fn virtual_gpus(
        &self,
        id: MetricId,
        e: &Entity,
        v: f64,
        xid: Option<(&str, &str)>,
        f: &mut Family,
    ) {
        if e.pods.is_empty() {
            return f.series(&e.labels, &dcgm::attributes(None, false, xid), v);
        }
        let per_pod = dcgm::per_pod(id);
        if per_pod {
            f.series(&e.labels, &dcgm::attributes(None, false, xid), v);
        }
        let d = &self.snap.devices[e.device];
        let uuid: &str = e.mig.map_or(&d.uuid, |m| &d.mig_devices[m].uuid);
        for p in &e.pods {
            let value = if per_pod {
                dcgm::pod_value(id, self.snap, uuid, &p.uid)
            } else {
                v
            };
            f.series(&e.labels, &dcgm::attributes(Some(p), per_pod, xid), value);
        }
    }
}

fn self_family(id: MetricId, st: &AgentStats, f: &mut Family) {
    let v = match id {
        M::EventsReceived => st.events_received,
        M::EventsLost => st.events_lost,
        M::Resyncs => st.resyncs,
        M::ProcfsFallbackLookups => st.procfs_fallback_lookups,
        M::CachedProcesses => st.cached_processes,
        M::ExportFailures => st.export_failures,
        M::ExportDroppedBatches => st.export_dropped_batches,
        M::UsageRecordsEmitted => st.usage_records,
        M::UsageRecordsDropped => st.usage_records_dropped,
        M::Mode => return f.series("", &[(Attr::Mode, st.mode.as_str())], 1.0),
        M::NvmlUp => return f.series("", &[], st.nvml.is_ok() as u8 as f64),
        M::Info => {
            let version = env!("CARGO_PKG_VERSION");
            return f.series("", &[(Attr::Version, version)], 1.0);
        }
        _ => return,
    };
    f.series("", &[], v as f64);
}

/// Every GPU that answers, and its MIG devices, with dcgm-exporter's labels: `gpu`, `UUID`
/// (the physical GPU's, also on MIG series), `pci_bus_id`, `device` (nvidia<index>),
/// `modelName`, `GPU_I_PROFILE` and `GPU_I_ID` on MIG series, `Hostname` (its released
/// spelling; the node name when known, as it does) and the driver version when the CSV
/// asks for it. `modelName` is camelCase, which promtool flags; kept so that existing
/// queries by it keep working.
fn dcgm_entities(snap: &Snapshot, node: &str, compat: &DcgmCompat, drop: Dropped) -> Vec<Entity> {
    let driver = snap.driver_version.as_deref().unwrap_or_default();
    let mut out = vec![];
    for (i, d) in snap.devices.iter().enumerate() {
        if !d.status.is_ok() {
            continue; // DCGM has no values for a lost GPU either
        }
        let index = d.index.to_string();
        let device = format!("nvidia{}", d.index);
        let pci = d.pci_bus_id.as_deref().unwrap_or_default();
        let labels = |mig: Option<(&str, &str)>| {
            let mut p = vec![
                (Attr::GpuIndex, index.as_str()),
                (Attr::DcgmUuid, d.uuid.as_str()),
                (Attr::PciBusId, pci),
                (Attr::DcgmDevice, device.as_str()),
                (Attr::DcgmModelName, d.name.as_str()),
            ];
            if let Some((profile, gi)) = mig {
                if !profile.is_empty() {
                    p.push((Attr::DcgmGpuProfile, profile));
                }
                p.push((Attr::DcgmGpuInstance, gi));
            }
            p.push((compat.host_label.attr(), node));
            if compat.driver_version_label && !driver.is_empty() {
                p.push((Attr::DcgmDriverVersion, driver));
            }
            block(drop, &p)
        };
        out.push(Entity {
            device: i,
            mig: None,
            labels: labels(None),
            pods: dcgm::pods_of(snap, &d.uuid, compat.mode),
        });
        for (j, m) in d.mig_devices.iter().enumerate() {
            let gi = m.gpu_instance_id.to_string();
            let profile = m.profile.as_deref().unwrap_or_default();
            out.push(Entity {
                device: i,
                mig: Some(j),
                labels: labels(Some((profile, gi.as_str()))),
                pods: dcgm::pods_of(snap, &m.uuid, compat.mode),
            });
        }
    }
    out
}
#[cfg(test)]
mod dcgm_tests;

#[cfg(test)]
mod tests {
    use gpu_model::{
        ContainerGpu, DeviceStatus, GpuAccount, LimitSource, MigSample, ProcessUsage, SourceStatus,
        TrackingMode,
    };

    use super::dcgm_tests::{every_dcgm_field, full_snapshot};
    use super::*;

    pub(super) const GIB: u64 = 1 << 30;
    pub(super) const CID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const H100: &str = r#"hw_id="GPU-a",gpu="0",model="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:18:00.0",node="node-a""#;

    pub(super) fn gpu(index: u32, uuid: &str, name: &str) -> DeviceSample {
        DeviceSample {
            index,
            uuid: uuid.into(),
            name: name.into(),
            pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x18 + index)),
            status: DeviceStatus::Ok,
            ..Default::default()
        }
    }

    pub(super) fn cgpu(
        uuid: &str,
        gpu_uuid: &str,
        mem: u64,
        sm: Option<u32>,
        pids: &[u32],
    ) -> ContainerGpu {
        ContainerGpu {
            uuid: uuid.into(),
            gpu_uuid: gpu_uuid.into(),
            memory_used_bytes: mem,
            sm_util: sm,
            mem_util: sm.map(|_| 10),
            enc_util: sm.map(|_| 0),
            dec_util: None,
            pids: pids.to_vec(),
            // Unknown where the SM utilization is (MIG).
            gpu_time_seconds: sm.map(|_| 12.5),
            memory_byte_seconds: 1.5e12,
            counters_since_ms: 1,
        }
    }

    /// Two GPUs (the second with MIG on and one MIG device), a lost third, a container on
    /// the first GPU and the MIG device, a pod-level cgroup and the host entry.
    pub(super) fn snapshot() -> Snapshot {
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
            profile: Some("3g.40gb".into()),
            ..Default::default()
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
                    allocated_gpus: vec!["GPU-a".into(), "GPU-d".into()].into(),
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
                            gpus_held: Some(1.0),
                            sm_share: Some(0.5),
                        },
                        GpuAccount {
                            uuid: "MIG-c".into(),
                            gpu_uuid: "GPU-b".into(),
                            memory_limit_bytes: Some(20 * GIB),
                            memory_limit_source: Some(LimitSource::Mig),
                            gpus_held: Some(0.5),
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
            container_xids: vec![],
        }
    }

    pub(super) fn stats() -> AgentStats {
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

    pub(super) fn opts() -> PromOptions {
        PromOptions {
            node: NodeIdentity {
                host_name: "host-a".into(),
                node_name: Some("node-a".into()),
            },
            groups: Groups::default(),
            dcgm: None,
        }
    }

    #[track_caller]
    pub(super) fn has(text: &str, line: &str) {
        assert!(
            text.lines().any(|l| l == line),
            "missing line\n  {line}\nin\n{text}"
        );
    }

    pub(super) fn lines_of<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
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

    /// The labels of the test snapshot's container's series on device `hw` of GPU `gpu`.
    fn main_on(hw: &str, gpu: &str) -> String {
        format!(
            r#"container_id="{CID}",pod_uid="uid-1",namespace="ml",pod="trainer",container="main",qos="burstable",runtime="containerd",hw_id="{hw}",gpu_uuid="{gpu}",node="node-a",owner="container""#
        )
    }

    #[test]
    fn container_series() {
        let t = render(&snapshot(), &stats(), &opts());
        let on_a = main_on("GPU-a", "GPU-a");
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
        let on_mig = main_on("MIG-c", "GPU-b");
        has(
            &t,
            &format!("container_gpu_memory_usage_bytes{{{on_mig}}} 5368709120"),
        );
        assert!(!t.contains(&format!("container_gpu_utilization_ratio{{{on_mig}")));
        assert!(!t.contains(&format!("container_gpu_time_seconds_total{{{on_mig}")));
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
        let on_a = main_on("GPU-a", "GPU-a");
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
        let on_mig = main_on("MIG-c", "GPU-b");
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
        // Rightsizing's: the GPU's model on both, the profile on the MIG device; no SM
        // figure where none is known.
        let h100 = r#"model="NVIDIA H100 80GB HBM3""#;
        has(&t, &format!("container_gpu_share{{{on_a},{h100}}} 1"));
        has(&t, &format!("container_gpu_sm_share{{{on_a},{h100}}} 0.5"));
        let a100 = r#"model="NVIDIA A100-SXM4-80GB",mig_profile="3g.40gb""#;
        has(&t, &format!("container_gpu_share{{{on_mig},{a100}}} 0.5"));
        assert!(
            !t.contains(&format!("container_gpu_sm_share{{{on_mig}")),
            "{t}"
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
        o.dcgm = Some(every_dcgm_field(Mode::Default));
        let t = render(&full_snapshot(), &stats(), &o);
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
        assert_eq!(t, render(&full_snapshot(), &stats(), &o));
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
        o.dcgm = Some(DcgmCompat::defaults(Mode::Default));
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
    pub(super) fn value_of(text: &str, family: &str, with: &[String]) -> f64 {
        let line = lines_of(text, family)
            .into_iter()
            .find(|l| with.iter().all(|w| l.contains(w.as_str())))
            .unwrap_or_else(|| panic!("no {family} series with {with:?} in\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }
}

#[cfg(test)]
mod allocation_tests {
    use super::tests::{lines_of, opts, snapshot, stats};
    use super::*;

    #[test]
    fn a_known_pod_owner_labels_its_containers_series_and_no_dcgm_series() {
        use gpu_model::{Workload, WorkloadKind};
        let mut snap = snapshot();
        snap.containers[0].workload = Some(std::sync::Arc::new(Workload {
            kind: WorkloadKind::Deployment,
            name: "trainer-web".into(),
            replicaset: Some("trainer-web-5d8f".into()),
            job: None,
        }));
        let owner = r#"container="main",workload_kind="Deployment",workload="trainer-web",qos="#;
        let t = render(&snap, &stats(), &opts());
        for family in [
            "container_gpu_memory_usage_bytes",
            "container_gpu_energy_joules_total",
            "container_gpu_allocated",
        ] {
            let lines = lines_of(&t, family);
            let main = lines.iter().filter(|l| l.contains("pod=\"trainer\""));
            let main: Vec<_> = main.collect();
            assert!(!main.is_empty(), "{family}\n{t}");
            for l in main {
                let want = match family {
                    "container_gpu_allocated" => r#"workload="trainer-web",hw_id="#,
                    _ => owner,
                };
                assert!(l.contains(want), "{l}");
            }
            // The pod-level cgroup and the host entry: no owner known, no labels.
            let others = lines.iter().filter(|l| !l.contains("pod=\"trainer\""));
            assert!(
                others.clone().all(|l| !l.contains("workload")),
                "{family}\n{t}"
            );
        }
        // dcgm-exporter's series keep dcgm-exporter's labels.
        let opts = PromOptions {
            dcgm: Some(super::dcgm_tests::every_dcgm_field(dcgm::Mode::Default)),
            ..opts()
        };
        let t = render(&snap, &stats(), &opts);
        assert!(t.contains("DCGM_FI_DEV_FB_USED{"), "{t}");
        let dcgm = t.lines().filter(|l| l.starts_with("DCGM_"));
        assert!(dcgm.clone().count() > 0 && dcgm.clone().all(|l| !l.contains("workload")));
    }

    #[test]
    fn allocated_and_idle_series() {
        let snap = Snapshot {
            containers: vec![ContainerUsage {
                container_id: Some("c1".into()),
                pod_uid: Some("u1".into()),
                pod_name: Some("p".into()),
                namespace: Some("ns".into()),
                container_name: Some("c".into()),
                allocated_gpus: vec!["GPU-z".into()].into(),
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
