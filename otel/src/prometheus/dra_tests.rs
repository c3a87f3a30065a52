//! Devices allocated through DRA claims in the text: the claim on the allocation series,
//! and dcgm-exporter's `dra_*` labels on the series of the device in both of its layouts.
use std::sync::Arc;

use gpu_model::{ClaimDevice, ContainerUsage, DraDevice, Snapshot};

use super::dcgm_tests::{every_dcgm_field, full_snapshot};
use super::tests::{has, lines_of, opts, stats};
use super::*;
use crate::dcgm::Mode;

const A: &str = r#"gpu="0",UUID="GPU-a",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-a",DCGM_FI_DRIVER_VERSION="580.159.04""#;
const MIG: &str = r#"gpu="1",UUID="GPU-b",pci_bus_id="00000000:19:00.0",device="nvidia1",modelName="NVIDIA A100-SXM4-80GB",GPU_I_PROFILE="2g.20gb",GPU_I_ID="2",Hostname="node-a",DCGM_FI_DRIVER_VERSION="580.159.04""#;

fn claim(name: &str, device: &str, uuid: &str, holders: u32) -> ClaimDevice {
    ClaimDevice {
        uuid: uuid.into(),
        dra: Arc::new(DraDevice {
            claim_namespace: "ml".into(),
            claim_name: name.into(),
            driver: "gpu.nvidia.com".into(),
            pool: "node-a".into(),
            device: device.into(),
        }),
        holders,
    }
}

/// Pods `p1` and `p2` share GPU-a through claim ml/shared (`gpu-0`); pod `m` holds the MIG
/// device MIG-c through ml/small (`gpu-1-mig-2g20gb-14-0`); the trainer holds nothing.
fn claimed() -> Snapshot {
    let mut snap = full_snapshot();
    snap.containers[0].allocated_gpus = Arc::default();
    let pod = |name: &str, uuid: &str, c: ClaimDevice| ContainerUsage {
        container_id: Some(name.repeat(32).into()),
        pod_uid: Some(format!("uid-{name}").into()),
        pod_name: Some(name.into()),
        namespace: Some("ml".into()),
        container_name: Some("main".into()),
        allocated_gpus: vec![uuid.into()].into(),
        allocated_device_ids: vec![c.dra.device.as_str().into()].into(),
        claims: vec![c].into(),
        ..Default::default()
    };
    snap.containers.extend([
        pod("p1", "GPU-a", claim("shared", "gpu-0", "GPU-a", 2)),
        pod("p2", "GPU-a", claim("shared", "gpu-0", "GPU-a", 2)),
        pod(
            "m",
            "MIG-c",
            claim("small", "gpu-1-mig-2g20gb-14-0", "MIG-c", 1),
        ),
    ]);
    snap
}

const SHARED: &str = r#"dra_claim_name="shared",dra_claim_namespace="ml",dra_device_name="gpu-0",dra_driver_name="gpu.nvidia.com",dra_pool_name="node-a""#;
const SMALL: &str = r#"dra_claim_name="small",dra_claim_namespace="ml",dra_device_name="gpu-1-mig-2g20gb-14-0",dra_driver_name="gpu.nvidia.com",dra_mig_device_uuid="MIG-c",dra_mig_profile="2g.20gb",dra_pool_name="node-a""#;

#[test]
fn allocation_series_name_the_claim() {
    let t = render(&claimed(), &stats(), &opts());
    let p1 = "p1".repeat(32);
    has(
        &t,
        &format!(
            r#"container_gpu_allocated{{container_id="{p1}",pod_uid="uid-p1",namespace="ml",pod="p1",container="main",hw_id="GPU-a",node="node-a",claim="shared",claim_namespace="ml"}} 1"#
        ),
    );
    let idle = lines_of(&t, "container_gpu_allocated_idle");
    assert_eq!(
        idle.iter()
            .filter(|l| l.contains(r#"claim="shared""#))
            .count(),
        2,
        "{t}"
    );
}

/// dcgm-exporter's DRA transformation: a copy of each series of a claimed device per
/// container holding it, the device's value in each, whichever layout; a MIG device's on
/// its own series, with its profile and UUID.
#[test]
fn dcgm_layouts_copy_a_claimed_devices_series_per_holder_with_the_dra_labels() {
    for mode in [Mode::Default, Mode::VirtualGpus] {
        let o = PromOptions {
            dcgm: Some(every_dcgm_field(mode)),
            ..opts()
        };
        let t = render(&claimed(), &stats(), &o);
        for pod in ["p1", "p2"] {
            let labels = format!(r#"container="main",{SHARED},namespace="ml",pod="{pod}""#);
            has(&t, &format!("DCGM_FI_DEV_GPU_TEMP{{{A},{labels}}} 45"));
            has(&t, &format!("DCGM_FI_DEV_GPU_UTIL{{{A},{labels}}} 60"));
        }
        let on_a = |f: &str| {
            (lines_of(&t, f).into_iter())
                .filter(|l| l.contains(A))
                .count()
        };
        assert_eq!(
            (on_a("DCGM_FI_DEV_GPU_TEMP"), on_a("DCGM_FI_DEV_GPU_UTIL")),
            (2, 2),
            "{mode:?}"
        );
        let labels = format!(r#"container="main",{SMALL},namespace="ml",pod="m""#);
        has(&t, &format!("DCGM_FI_DEV_FB_USED{{{MIG},{labels}}} 5120"));
        // The parent GPU's own series name no claim.
        assert!(
            lines_of(&t, "DCGM_FI_DEV_GPU_TEMP")
                .iter()
                .all(|l| !l.contains(r#"UUID="GPU-b""#) || !l.contains("dra_")),
            "{t}"
        );
    }
}
