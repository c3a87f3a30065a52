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
//!
//! `text` writes a family's series; `blocks` makes every label block of a render once;
//! `device`, `container` and `compat` (dcgm-exporter's) write the families of each group.
use std::{collections::HashSet, sync::Arc};

use gpu_model::{AgentStats, Snapshot};

use crate::{
    catalogue::{Attr, Group, MetricId as M, MetricId},
    dcgm::DcgmCompat,
    Groups, NodeIdentity,
};

mod blocks;
mod compat;
mod container;
mod device;
mod text;

use blocks::Blocks;
use text::Family;

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

/// One render's inputs.
struct Renderer<'a> {
    snap: &'a Snapshot,
    stats: &'a AgentStats,
    opts: &'a PromOptions,
    b: &'a Blocks,
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

#[cfg(test)]
mod dcgm_tests;
#[cfg(test)]
mod dra_tests;

#[cfg(test)]
mod tests {
    use gpu_model::{
        ContainerGpu, ContainerUsage, DeviceSample, DeviceStatus, GpuAccount, LimitSource,
        MigSample, ProcessUsage, SourceStatus, TrackingMode,
    };

    use super::dcgm_tests::{every_dcgm_field, full_snapshot};
    use super::text::{format_value, pct};
    use super::*;
    use crate::dcgm::Mode;

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
    use gpu_model::ContainerUsage;

    use super::tests::{lines_of, opts, snapshot, stats};
    use super::*;
    use crate::dcgm;

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
    use gpu_model::DeviceSample;

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
