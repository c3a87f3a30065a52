//! dcgm-exporter's layouts in the text: one series per device with the allocated pod's
//! labels (`dcgm`), a series per pod (`dcgm-virtual-gpus`), and every field restating its
//! gpu-agent source in dcgm-exporter's unit.
use gpu_model::{ContainerUsage, ContainerXid, GpmMetrics, RemappedRows, XidCount};

use super::tests::{has, lines_of, opts, snapshot, stats, value_of, CID, GIB};
use super::*;
use crate::{
    catalogue::{Source, CATALOGUE},
    dcgm::{Field, HostLabel, Mode},
};

const A: &str = r#"gpu="0",UUID="GPU-a",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-a",DCGM_FI_DRIVER_VERSION="580.159.04""#;
const B: &str = r#"gpu="1",UUID="GPU-b",pci_bus_id="00000000:19:00.0",device="nvidia1",modelName="NVIDIA A100-SXM4-80GB",Hostname="node-a",DCGM_FI_DRIVER_VERSION="580.159.04""#;
const MIG: &str = r#"gpu="1",UUID="GPU-b",pci_bus_id="00000000:19:00.0",device="nvidia1",modelName="NVIDIA A100-SXM4-80GB",GPU_I_PROFILE="2g.20gb",GPU_I_ID="2",Hostname="node-a",DCGM_FI_DRIVER_VERSION="580.159.04""#;
const TRAINER: &str = r#"container="main",namespace="ml",pod="trainer""#;

/// Every field gpu-agent serves, the optional ones included.
pub(super) fn every_dcgm_field(mode: Mode) -> DcgmCompat {
    let fields = CATALOGUE
        .iter()
        .zip(MetricId::ALL)
        .filter(|(m, _)| m.dcgm.is_some())
        .map(|(m, &id)| Field {
            id,
            kind: m.kind,
            help: m.help.into(),
        })
        .collect();
    DcgmCompat {
        mode,
        fields,
        driver_version_label: true,
        host_label: Default::default(),
    }
}

fn gpm(v: f64) -> GpmMetrics {
    GpmMetrics {
        gr_engine_active: Some(v),
        sm_active: Some(v + 0.01),
        sm_occupancy: Some(v + 0.02),
        tensor_active: Some(v + 0.03),
        dram_active: Some(v + 0.04),
        fp64_active: Some(v + 0.05),
        fp32_active: Some(v + 0.06),
        fp16_active: Some(v + 0.07),
        pcie_tx_mibps: Some(1000.0),
        pcie_rx_mibps: Some(2000.5),
        nvlink_tx_mibps: Some(3000.0),
        nvlink_rx_mibps: Some(4000.0),
    }
}

/// The shared snapshot with every field known: GPU-a has them all, the MIG device its
/// profile and profiling, and the container an XID charged to it.
pub(super) fn full_snapshot() -> Snapshot {
    let mut snap = snapshot();
    let a = &mut snap.devices[0];
    a.throttle_reasons = Some(0x24);
    let f = &mut a.fields;
    f.memory_reserved_bytes = Some(GIB / 2);
    f.memory_temperature_c = Some(52);
    f.encoder_util = Some(3);
    f.decoder_util = Some(4);
    f.pcie_replay = Some(7);
    f.remapped_rows = Some(RemappedRows {
        correctable: 2,
        uncorrectable: 1,
        pending: true,
        failure: false,
    });
    f.nvlink_tx_kib = Some(1000);
    f.nvlink_rx_kib = Some(3000);
    f.nvlink_bandwidth_total = Some(120);
    f.vgpu_licensed = Some(false);
    f.gpm = Some(gpm(0.5));
    f.xid_errors = Some(vec![
        XidCount { xid: 43, count: 1 },
        XidCount { xid: 79, count: 2 },
    ]);
    f.last_xid = Some(79);
    let m = &mut snap.devices[1].mig_devices[0];
    m.profile = Some("2g.20gb".into());
    m.gpm = Some(gpm(0.25));
    snap.container_xids = vec![ContainerXid {
        container_id: Some(CID.into()),
        pod_uid: Some("uid-1".into()),
        pod_name: Some("trainer".into()),
        namespace: Some("ml".into()),
        container_name: Some("main".into()),
        uuid: "GPU-a".into(),
        gpu_uuid: "GPU-a".into(),
        xid: 79,
        count: 1,
    }];
    snap
}

fn with_dcgm(mode: Mode) -> PromOptions {
    PromOptions {
        dcgm: Some(every_dcgm_field(mode)),
        ..opts()
    }
}

#[test]
fn default_mode_puts_the_allocated_pod_on_every_series_of_its_device() {
    let t = render(&full_snapshot(), &stats(), &with_dcgm(Mode::Default));
    // GPU-a is the trainer's: every one of its series says so, once per field.
    has(&t, &format!("DCGM_FI_DEV_FB_USED{{{A},{TRAINER}}} 3072"));
    has(&t, &format!("DCGM_FI_DEV_FB_FREE{{{A},{TRAINER}}} 78336"));
    has(&t, &format!("DCGM_FI_DEV_FB_RESERVED{{{A},{TRAINER}}} 512"));
    has(&t, &format!("DCGM_FI_DEV_GPU_UTIL{{{A},{TRAINER}}} 60"));
    has(&t, &format!("DCGM_FI_DEV_GPU_TEMP{{{A},{TRAINER}}} 45"));
    has(
        &t,
        &format!("DCGM_FI_DEV_POWER_USAGE{{{A},{TRAINER}}} 350.5"),
    );
    has(
        &t,
        &format!("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{A},{TRAINER}}} 123456789"),
    );
    has(
        &t,
        &format!("DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{A},{TRAINER}}} 0.5"),
    );
    has(
        &t,
        &format!("DCGM_FI_PROF_PCIE_RX_BYTES{{{A},{TRAINER}}} 2000.5"),
    );
    has(
        &t,
        &format!("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{{{A},{TRAINER}}} 120"),
    );
    has(
        &t,
        &format!("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{A},{TRAINER}}} 36"),
    );
    // The XID field's own labels sort in among the pod's, as dcgm-exporter prints them.
    has(
        &t,
        &format!(
            r#"DCGM_FI_DEV_XID_ERRORS{{{A},container="main",err_code="79",err_msg="GPU has fallen off the bus",namespace="ml",pod="trainer"}} 79"#
        ),
    );
    // GPU-b is nobody's: no pod labels at all (dcgm-exporter adds none). Its MIG device
    // has its memory and profiling with the profile and instance.
    has(&t, &format!("DCGM_FI_DEV_FB_USED{{{B}}} 5120"));
    has(&t, &format!("DCGM_FI_DEV_FB_USED{{{MIG}}} 5120"));
    has(&t, &format!("DCGM_FI_DEV_FB_FREE{{{MIG}}} 15360"));
    has(&t, &format!("DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{MIG}}} 0.25"));
    assert!(
        !t.contains(&format!("DCGM_FI_DEV_GPU_UTIL{{{B}")),
        "no utilization under MIG: {t}"
    );
    // One series per device and field: never a container's on top of the device's, and
    // never the lost GPU.
    assert_eq!(lines_of(&t, "DCGM_FI_DEV_FB_USED").len(), 3, "{t}");
    assert_eq!(lines_of(&t, "DCGM_FI_DEV_GPU_TEMP").len(), 1, "{t}");
    for l in t.lines().filter(|l| l.starts_with("DCGM_")) {
        assert!(
            !l.contains("pod_uid=") && !l.contains("vgpu=") && !l.contains("GPU-d"),
            "{l}"
        );
    }
    // No profiling where GPM gave none (GPU-b itself): absent, not 0.
    assert!(
        !t.contains(&format!("DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{B}}}")),
        "{t}"
    );
}

#[test]
fn a_shared_device_names_one_pod_and_sums_count_it_once() {
    let mut snap = full_snapshot();
    // A second pod holds a time-slicing replica of GPU-a and runs nothing.
    snap.containers[0].allocated_device_ids = vec!["GPU-a::1".into(), "GPU-d".into()].into();
    snap.containers.push(ContainerUsage {
        container_id: Some("c".repeat(64).into()),
        pod_uid: Some("uid-3".into()),
        pod_name: Some("idle".into()),
        namespace: Some("analytics".into()),
        container_name: Some("notebook".into()),
        allocated_gpus: vec!["GPU-a".into()].into(),
        allocated_device_ids: vec!["GPU-a::2".into()].into(),
        ..Default::default()
    });
    let t = render(&snap, &stats(), &with_dcgm(Mode::Default));
    // One of them, fixed: the first by namespace, pod and container.
    let util = lines_of(&t, "DCGM_FI_DEV_GPU_UTIL");
    assert_eq!(util.len(), 1, "{t}");
    assert!(
        util[0].contains(r#"namespace="analytics",pod="idle""#),
        "{}",
        util[0]
    );
    let sum: f64 = util
        .iter()
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(sum, 60.0, "the device's utilization, once");
}

#[test]
fn virtual_gpus_copy_the_device_series_per_pod_and_give_pods_their_own_use() {
    let mut snap = full_snapshot();
    snap.containers[0].allocated_device_ids = vec!["GPU-a::1".into(), "GPU-d::1".into()].into();
    snap.containers.push(ContainerUsage {
        container_id: Some("c".repeat(64).into()),
        pod_uid: Some("uid-3".into()),
        pod_name: Some("idle".into()),
        namespace: Some("analytics".into()),
        container_name: Some("notebook".into()),
        allocated_gpus: vec!["GPU-a".into()].into(),
        allocated_device_ids: vec!["GPU-a::2".into()].into(),
        ..Default::default()
    });
    let t = render(&snap, &stats(), &with_dcgm(Mode::VirtualGpus));
    let idle = r#"container="notebook",namespace="analytics",pod="idle""#;
    // FB_USED and GPU_UTIL: the device's own series, and each pod's own processes (the idle
    // pod's 0), with pod_uid.
    has(&t, &format!("DCGM_FI_DEV_FB_USED{{{A}}} 3072"));
    has(
        &t,
        &format!(r#"DCGM_FI_DEV_FB_USED{{{A},{TRAINER},pod_uid="uid-1",vgpu="1"}} 1536"#),
    );
    has(
        &t,
        &format!(r#"DCGM_FI_DEV_FB_USED{{{A},{idle},pod_uid="uid-3",vgpu="2"}} 0"#),
    );
    has(
        &t,
        &format!(r#"DCGM_FI_DEV_GPU_UTIL{{{A},{TRAINER},pod_uid="uid-1",vgpu="1"}} 50"#),
    );
    has(
        &t,
        &format!(r#"DCGM_FI_DEV_GPU_UTIL{{{A},{idle},pod_uid="uid-3",vgpu="2"}} 0"#),
    );
    assert_eq!(lines_of(&t, "DCGM_FI_DEV_GPU_UTIL").len(), 3, "{t}");
    // Any other field: the device's value once per pod, and no device series.
    has(
        &t,
        &format!(r#"DCGM_FI_DEV_GPU_TEMP{{{A},{TRAINER},vgpu="1"}} 45"#),
    );
    has(
        &t,
        &format!(r#"DCGM_FI_DEV_GPU_TEMP{{{A},{idle},vgpu="2"}} 45"#),
    );
    assert_eq!(lines_of(&t, "DCGM_FI_DEV_GPU_TEMP").len(), 2, "{t}");
    // A device nobody holds keeps its one series.
    has(&t, &format!("DCGM_FI_DEV_FB_USED{{{B}}} 5120"));
}

#[test]
fn the_host_label_has_either_spelling() {
    let released = render(&full_snapshot(), &stats(), &with_dcgm(Mode::Default));
    has(
        &released,
        &format!("DCGM_FI_DEV_GPU_TEMP{{{A},{TRAINER}}} 45"),
    );
    assert!(!released.contains("hostname="), "{released}");
    let mut o = with_dcgm(Mode::Default);
    o.dcgm.as_mut().unwrap().host_label = HostLabel::Lowercase;
    let main_branch = render(&full_snapshot(), &stats(), &o);
    let a = A.replace("Hostname=", "hostname=");
    has(
        &main_branch,
        &format!("DCGM_FI_DEV_GPU_TEMP{{{a},{TRAINER}}} 45"),
    );
    assert!(!main_branch.contains("Hostname="), "{main_branch}");
}

#[test]
fn a_counters_csv_sets_the_families_type_and_help() {
    let csv = "DCGM_FI_DEV_GPU_UTIL, counter, my help\nDCGM_FI_DEV_SM_CLOCK, gauge, clocks\n";
    let o = PromOptions {
        dcgm: Some(DcgmCompat::from_csv(Mode::Default, csv).unwrap()),
        ..opts()
    };
    let t = render(&full_snapshot(), &stats(), &o);
    has(&t, "# HELP DCGM_FI_DEV_GPU_UTIL my help");
    has(&t, "# TYPE DCGM_FI_DEV_GPU_UTIL counter");
    let dcgm: Vec<&str> = t.lines().filter(|l| l.starts_with("# TYPE DCGM")).collect();
    assert_eq!(
        dcgm.len(),
        2,
        "only the chosen fields, in the CSV's order: {dcgm:?}"
    );
    assert!(dcgm[0].contains("GPU_UTIL") && dcgm[1].contains("SM_CLOCK"));
    // No DCGM_FI_DRIVER_VERSION line in the CSV: no driver label.
    assert!(!t.contains("DCGM_FI_DRIVER_VERSION="), "{t}");
}

/// The catalogue's account of each dcgm field (docs/metrics.md prints it) is what the
/// text holds: each dcgm series restates its source, converted to the dcgm unit.
#[test]
fn dcgm_series_restate_their_catalogue_source() {
    let t = render(&full_snapshot(), &stats(), &with_dcgm(Mode::Default));
    // A source's value in gpu-agent's own series (a missing subtrahend counts 0: a MIG
    // device has no reserved memory).
    let find = |id: MetricId, scope: &str, sel: &[(Attr, &str)]| -> Option<f64> {
        let wanted: Vec<String> = sel
            .iter()
            .map(|(a, v)| format!("{}=\"{v}\"", a.label()))
            .collect();
        lines_of(&t, id.prometheus())
            .into_iter()
            .find(|l| l.contains(scope) && wanted.iter().all(|w| l.contains(w.as_str())))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
    };
    let source = |src: &Source, scope: &str| -> Option<f64> {
        match *src {
            Source::Metric(id, sel) => find(id, scope, sel.as_slice()),
            Source::Metrics(id, sel) => find(id, scope, sel),
            Source::Difference(a, b) => {
                let first = find(a, scope, &[])?;
                Some(
                    b.iter()
                        .fold(first, |v, &b| v - find(b, scope, &[]).unwrap_or(0.0)),
                )
            }
            Source::Derived(_) => None,
        }
    };
    let (mut checked, mut mig) = (0, 0);
    for m in CATALOGUE.iter() {
        let Some(d) = &m.dcgm else { continue };
        let name = m.prometheus.unwrap();
        let mut scopes = vec![(r#"hw_id="GPU-a""#, r#"UUID="GPU-a""#)];
        if d.mig {
            scopes.push((r#"hw_id="MIG-c""#, r#"GPU_I_ID="2""#));
        }
        for (ours, theirs) in scopes {
            let got = value_of(&t, name, &[theirs.to_string()]);
            let Some(want) = source(&d.source, ours).map(|v| v / d.per) else {
                continue;
            };
            // Memory is whole MiB, as DCGM reports it.
            let want = if m.unit == "MiB" { want.floor() } else { want };
            assert!(
                (got - want).abs() < 1e-9,
                "{name} on {ours}: {got} != {want}"
            );
            checked += 1;
            mig += (ours.contains("MIG")) as u32;
        }
    }
    assert!(
        checked >= 40 && mig >= 10,
        "{checked} checked, {mig} on MIG"
    );
    // The per-pod values of dcgm-virtual-gpus restate the container's.
    let t = render(&full_snapshot(), &stats(), &with_dcgm(Mode::VirtualGpus));
    for m in CATALOGUE.iter() {
        let Some((d, src)) = m.dcgm.as_ref().and_then(|d| Some((d, d.per_pod?))) else {
            continue;
        };
        let theirs = value_of(
            &t,
            m.prometheus.unwrap(),
            &[r#"pod_uid="uid-1""#.into(), r#"UUID="GPU-a""#.into()],
        );
        let Source::Metric(id, sel) = src else {
            panic!("{src:?}")
        };
        let mut with = vec![
            format!(r#"container_id="{CID}""#),
            r#"hw_id="GPU-a""#.into(),
        ];
        with.extend(sel.iter().map(|(a, v)| format!("{}=\"{v}\"", a.label())));
        let ours = value_of(&t, id.prometheus(), &with);
        assert_eq!(theirs, (ours / d.per).floor(), "{:?}", m.prometheus);
    }
}
