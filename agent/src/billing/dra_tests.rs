//! Billing of devices allocated through DRA claims: a claim's device held by several
//! containers is shared among them.
use gpu_model::ProcessSample;

use super::tests::{cycle, h100, p, run_with, Carried, Inputs, A, B};
use crate::metadata::{Allocation, ContainerNames, Metadata};

/// A (ns/p/a) and B (ns/q/b) both holding device `device` of DRA claim ns/shared (a claim
/// shared by two pods, time-slicing or MPS in its config): the kubelet lists it in each.
fn shared_claim(device: &str) -> Metadata {
    let mut md = Metadata::default();
    let dra = std::sync::Arc::new(gpu_model::DraDevice {
        claim_namespace: "ns".into(),
        claim_name: "shared".into(),
        driver: "gpu.nvidia.com".into(),
        pool: "node-1".into(),
        device: device.into(),
    });
    let mut allocations = vec![];
    for (id, pod, name) in [(A, "p", "a"), (B, "q", "b")] {
        let names = ContainerNames {
            pod_name: Some(pod.into()),
            namespace: Some("ns".into()),
            container_name: Some(name.into()),
            ..Default::default()
        };
        md.learn(id.into(), names);
        allocations.push(Allocation {
            namespace: "ns".into(),
            pod_name: pod.into(),
            container_name: name.into(),
            resource_name: "gpu.nvidia.com".into(),
            device_ids: vec![device.into()],
            claim: Some(dra.clone()),
        });
    }
    md.set_allocations(allocations);
    md
}

/// One DRA claim's GPU held by two pods counts once: each holds half of it, in its open
/// stretch's account (`container_gpu_share`) and in its record (`gpus_allocated`), and the
/// record names the claim. A MIG device of 3 of 7 slices so shared: 3/14 each.
#[test]
fn a_claim_shared_by_two_pods_counts_its_gpu_once() {
    let md = shared_claim("gpu-7");
    let gpu7 = |t: u64, procs: Vec<ProcessSample>| {
        let mut s = h100(t, procs);
        s.devices[0].sharing.minor_number = Some(7);
        s
    };
    let both = vec![p(100, 10, Some(20)), p(200, 10, Some(30))];
    let (snap, _) = cycle(
        &md,
        &gpu7(1000, both.clone()),
        &mut Carried::default(),
        &Inputs::default(),
    );
    let held: Vec<Option<f64>> = (snap.containers.iter())
        .map(|c| c.accounts[0].gpus_held)
        .collect();
    assert_eq!(held, [Some(0.5), Some(0.5)], "the GPU sums to 1");
    let claims = &snap.containers[0].claims;
    assert_eq!((claims.len(), claims[0].holders), (1, 2));
    let none = Metadata::default();
    let steps = [(&md, gpu7(1000, both)), (&none, gpu7(2000, vec![]))];
    let records = run_with(&steps, &Inputs::default());
    assert_eq!(records.len(), 2);
    for r in &records {
        assert_eq!(r.gpus_allocated, Some(0.5), "{r:?}");
        assert_eq!(
            (r.claim.as_deref(), r.claim_namespace.as_deref()),
            (Some("shared"), Some("ns"))
        );
    }
    // A MIG device named as NVIDIA's driver names it from v25.12 on.
    let md = shared_claim("gpu-7-mig-3g40gb-9-0");
    let mig = |t: u64, procs: Vec<ProcessSample>| {
        let mut s = gpu7(t, procs);
        s.devices[0].mig_devices = vec![gpu_model::MigSample {
            uuid: "MIG-1".into(),
            profile: Some("3g.40gb".into()),
            gpu_instance: Some(gpu_model::GpuInstance {
                profile_id: 9,
                placement_start: 0,
                placement_size: 4,
            }),
            ..Default::default()
        }];
        s
    };
    let on_mig = |pid| ProcessSample {
        mig: Some(0),
        ..p(pid, 10, None)
    };
    let steps = [
        (&md, mig(1000, vec![on_mig(100), on_mig(200)])),
        (&none, mig(2000, vec![])),
    ];
    let records = run_with(&steps, &Inputs::default());
    let got: Vec<(&str, Option<f64>)> = (records.iter())
        .map(|r| (r.uuid.as_str(), r.gpus_allocated))
        .collect();
    assert_eq!(
        got,
        [("MIG-1", Some(3.0 / 14.0)), ("MIG-1", Some(3.0 / 14.0))]
    );
}
