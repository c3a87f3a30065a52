//! DRA as NVIDIA's driver (`gpu.nvidia.com`) reports it, end to end: the real agent on the
//! fake NVML library, a fake kubelet whose pod-resources answer carries each
//! `ClaimResource` verbatim, with the device names and CDI names of the driver's releases
//! (v25.12: `claim=<claim UID>-<device>`; v25.3 and v25.8: `device=<device>`), each claim's
//! CDI list accumulated as the kubelet declares it.
use std::time::Duration;

use serde_json::{json, Value};
use tests::{
    container,
    fake_node::{kubelet_claim, metadata_config, FakeClaim, FakeContainer, FakeNode, World},
    fake_nvml_lib,
    nvml::Scenario,
    random_hex, random_uid, Agent, TempDir as Dir,
};

const GIB: u64 = 1 << 30;
const MIG_A: &str = "MIG-a0000000-1111-2222-3333-444444444444";
const MIG_ME: &str = "MIG-e0000000-1111-2222-3333-444444444444";
const MIG_B: &str = "MIG-b0000000-1111-2222-3333-444444444444";
const MIG_NEW: &str = "MIG-f0000000-1111-2222-3333-444444444444";
const G2: &str = "GPU-22222222-aaaa-2222-3333-444444444444";
const G3: &str = "GPU-33333333-aaaa-2222-3333-444444444444";
const G4: &str = "GPU-44444444-aaaa-2222-3333-444444444444";

fn mig(uuid: &str, gi: u32, name: &str, more: Value) -> Value {
    let mut m =
        json!({"uuid": uuid, "gpu_instance_id": gi, "memory_total": 10 * GIB, "name": name});
    m.as_object_mut()
        .unwrap()
        .extend(more.as_object().unwrap().clone());
    m
}

/// GPU 0 (/dev/nvidia0), an H100 80GB with MIG: a 1g.10gb (GPU instance profile 19, at 0)
/// and a 1g.10gb+me (20, at 6), and `more` MIG devices. GPU 1 (/dev/nvidia1), an H100 NVL
/// with a 2g.47gb (14, at 0). Whole GPUs /dev/nvidia4, 5 and 6 at NVML indexes 2, 3 and 4:
/// the driver names GPUs by minor number, not index.
fn node(more: Vec<Value>) -> Value {
    let h100 = "NVIDIA H100 80GB HBM3";
    let mut migs = vec![
        mig(MIG_A, 9, &format!("{h100} MIG 1g.10gb"), json!({})),
        mig(
            MIG_ME,
            13,
            &format!("{h100} MIG 1g.10gb+me"),
            json!({"placement_start": 6}),
        ),
    ];
    migs.extend(more);
    let whole = |index: u32, minor: u32, uuid: &str| json!({"index": index, "minor_number": minor, "uuid": uuid, "name": h100, "memory_total": 80 * GIB});
    json!({"devices": [
        {"index": 0, "minor_number": 0, "uuid": "GPU-00000000-aaaa-2222-3333-444444444444",
         "name": h100, "memory_total": 80 * GIB, "mig_devices": migs},
        {"index": 1, "minor_number": 1, "uuid": "GPU-11111111-aaaa-2222-3333-444444444444",
         "name": "NVIDIA H100 NVL", "memory_total": 94 * GIB, "mig_devices": [
            mig(MIG_B, 5, "NVIDIA H100 NVL MIG 2g.47gb",
                json!({"profile_id": 14, "placement_start": 0, "placement_size": 2}))
        ]},
        whole(2, 4, G2),
        whole(3, 5, G3),
        whole(4, 6, G4),
    ]})
}

fn start_agent(sc: &Scenario, dir: &Dir, node: &FakeNode, extra: &[&str]) -> Agent {
    let lib = fake_nvml_lib();
    let cfg = format!(
        "[nvml]\ninterval_ms = 200\n{}",
        metadata_config(&dir.0, Some(node))
    );
    let mut args = vec!["--nvml-lib", lib.to_str().unwrap(), "--prometheus"];
    args.extend(extra);
    Agent::start_env(&cfg, &args, &[("FAKE_NVML_SCENARIO", sc.path())])
}

fn metrics(agent: &Agent) -> String {
    tests::http::get(&agent.addr, "/metrics").unwrap().1
}

/// A pod of one container `main` in namespace ml, running nothing: allocated, idle.
fn pod(name: &str) -> FakeContainer {
    FakeContainer {
        id: random_hex(64),
        pod_uid: random_uid(),
        namespace: "ml".into(),
        pod: name.into(),
        name: "main".into(),
        gpus: vec![],
    }
}

/// Pod `pod`'s container holding claim ml/`claim` of `devices`, each with its CDI name as
/// the driver of v25.12 (`v25_12`) or before names it.
fn claim(pod: &str, claim: &str, devices: &[&str], v25_12: bool) -> FakeClaim {
    let uid = random_uid();
    let cdi = |d: &str| match v25_12 {
        true => format!("k8s.gpu.nvidia.com/claim={uid}-{d}"),
        false => format!("k8s.gpu.nvidia.com/device={d}"),
    };
    let named: Vec<(String, String)> = devices.iter().map(|d| (d.to_string(), cdi(d))).collect();
    let named: Vec<(&str, &str)> = named.iter().map(|(d, c)| (&**d, &**c)).collect();
    FakeClaim {
        namespace: "ml".into(),
        pod: pod.into(),
        container: "main".into(),
        claim: kubelet_claim("ml", claim, "node-1", &named),
    }
}

fn allocated(snap: &Value, id: &str) -> Option<Value> {
    container(snap, id).map(|c| c["allocated_gpus"].clone())
}

/// The line of `family` whose labels contain all of `with`.
fn line<'a>(text: &'a str, family: &str, with: &[&str]) -> Option<&'a str> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .find(|l| with.iter().all(|w| l.contains(w)))
}

/// Every name of the table, as a v25.12 node reports them and then as a node of v25.8
/// does: a GPU by its minor number, a MIG device by its parent's minor number, GPU
/// instance profile id and placement start; a claim of two GPUs is two devices, whatever
/// the second one's CDI list carries.
#[test]
#[ignore = "needs root: loads the eBPF programs"]
fn every_name_of_nvidias_dra_driver_resolves_to_its_device_on_both_releases() {
    let dir = Dir::new("dra");
    let sc = Scenario::new(&node(vec![]));
    let pods = ["pair", "small", "small-me", "nvl"].map(pod);
    let world = World::default();
    world.set(pods.to_vec());
    world.set_claims(vec![
        claim("pair", "pair-gpus", &["gpu-4", "gpu-5"], true),
        claim("small", "small-gpu", &["gpu-0-mig-1g10gb-19-0"], true),
        claim(
            "small-me",
            "small-me-gpu",
            &["gpu-0-mig-1g10gb-me-20-6"],
            true,
        ),
        claim("nvl", "nvl-gpu", &["gpu-1-mig-2g47gb-14-0"], true),
    ]);
    let node = FakeNode::start(&dir.0, world.clone());
    let agent = start_agent(&sc, &dir, &node, &[]);
    let want = [
        json!([G2, G3]),
        json!([MIG_A]),
        json!([MIG_ME]),
        json!([MIG_B]),
    ];
    let snap = agent.wait_snapshot(Duration::from_secs(25), "v25.12's names", |s| {
        (pods.iter().zip(&want)).all(|(p, w)| allocated(s, &p.id).as_ref() == Some(w))
    });
    let pair = container(&snap, &pods[0].id).unwrap();
    let devices: Vec<&Value> = pair["claims"].as_array().unwrap().iter().collect();
    let names: Vec<(&Value, &Value)> = (devices.iter())
        .map(|d| (&d["uuid"], &d["dra"]["device"]))
        .collect();
    assert_eq!(
        names,
        [(&json!(G2), &json!("gpu-4")), (&json!(G3), &json!("gpu-5"))]
    );
    let text = metrics(&agent);
    let small = line(
        &text,
        "container_gpu_allocated",
        &[
            "pod=\"small\"",
            MIG_A,
            "claim=\"small-gpu\"",
            "claim_namespace=\"ml\"",
        ],
    );
    assert!(small.is_some_and(|l| l.ends_with(" 1")), "{text}");
    assert_eq!(agent.stats()["dra_devices_unmatched"], 0);
    // The same node's driver before v25.12: `device=` CDI names, the all-digit MIG name.
    world.set_claims(vec![
        claim("pair", "pair-gpus", &["gpu-4", "gpu-5"], false),
        claim("small", "small-gpu", &["gpu-0-mig-19-0-1"], false),
    ]);
    agent.wait_snapshot(Duration::from_secs(25), "v25.8's names", |s| {
        allocated(s, &pods[0].id) == Some(json!([G2, G3]))
            && allocated(s, &pods[1].id) == Some(json!([MIG_A]))
            && container(s, &pods[3].id).is_none()
    });
    assert_eq!(agent.stats()["dra_devices_unmatched"], 0);
}

/// One claim's GPU held by two pods: each holds half of it (`container_gpu_share`), so the
/// GPU sums to 1; in dcgm-exporter's layout the GPU's series are copied per pod with the
/// claim's `dra_*` labels, and a claimed MIG device's carry its profile and UUID.
#[test]
#[ignore = "needs root: loads the eBPF programs"]
fn a_claim_shared_by_two_pods_sums_to_one_gpu_and_carries_the_dra_labels() {
    let dir = Dir::new("dra");
    let sc = Scenario::new(&node(vec![]));
    let pods = ["shared-a", "shared-b", "small"].map(pod);
    let world = World::default();
    world.set(pods.to_vec());
    world.set_claims(vec![
        claim("shared-a", "shared-gpu", &["gpu-6"], true),
        claim("shared-b", "shared-gpu", &["gpu-6"], true),
        claim("small", "small-gpu", &["gpu-0-mig-1g10gb-19-0"], true),
    ]);
    let node = FakeNode::start(&dir.0, world);
    let agent = start_agent(&sc, &dir, &node, &["--prometheus-compat", "dcgm"]);
    let mut text = String::new();
    agent.wait_until("the shares", Duration::from_secs(25), || {
        text = metrics(&agent);
        text.lines()
            .filter(|l| l.starts_with("container_gpu_share{") && l.contains(G4))
            .count()
            == 2
    });
    let shares: Vec<f64> = (text.lines())
        .filter(|l| l.starts_with("container_gpu_share{") && l.contains(G4))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(shares, [0.5, 0.5], "{text}");
    assert_eq!(shares.iter().sum::<f64>(), 1.0);
    for p in ["shared-a", "shared-b"] {
        let with = [
            &*format!("pod=\"{p}\""),
            G4,
            "claim=\"shared-gpu\"",
            "claim_namespace=\"ml\"",
        ];
        assert!(
            line(&text, "container_gpu_allocated", &with).is_some(),
            "{text}"
        );
        let dra = [
            &*format!("pod=\"{p}\""),
            G4,
            "dra_claim_name=\"shared-gpu\"",
            "dra_claim_namespace=\"ml\"",
            "dra_device_name=\"gpu-6\"",
            "dra_driver_name=\"gpu.nvidia.com\"",
            "dra_pool_name=\"node-1\"",
        ];
        assert!(
            line(&text, "DCGM_FI_DEV_GPU_TEMP", &dra).is_some(),
            "{text}"
        );
    }
    let mig = [
        "pod=\"small\"",
        "GPU_I_PROFILE=\"1g.10gb\"",
        "dra_device_name=\"gpu-0-mig-1g10gb-19-0\"",
        "dra_mig_profile=\"1g.10gb\"",
        &*format!("dra_mig_device_uuid=\"{MIG_A}\""),
    ];
    assert!(line(&text, "DCGM_FI_DEV_FB_USED", &mig).is_some(), "{text}");
}

/// A claim listed before its MIG device exists (dynamic MIG makes it as the claim is
/// prepared): said once at WARN and counted, then matched once NVML lists the device.
#[test]
#[ignore = "needs root: loads the eBPF programs"]
fn a_mig_device_made_after_its_claim_is_listed_resolves_once_it_exists() {
    let dir = Dir::new("dra");
    let sc = Scenario::new(&node(vec![]));
    let later = pod("later");
    let world = World::default();
    world.set(vec![later.clone()]);
    world.set_claims(vec![claim(
        "later",
        "later-gpu",
        &["gpu-0-mig-1g20gb-15-2"],
        true,
    )]);
    let node_ = FakeNode::start(&dir.0, world);
    let agent = start_agent(&sc, &dir, &node_, &[]);
    agent.wait_until("the unmatched device", Duration::from_secs(25), || {
        agent.stats()["dra_devices_unmatched"] == 1
    });
    let warned = |agent: &Agent| {
        (agent.log().lines())
            .filter(|l| l.contains("WARN") && l.contains("DRA claim ml/later-gpu"))
            .count()
    };
    assert_eq!(warned(&agent), 1, "{}", agent.log());
    // Cycles go by: said once.
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(warned(&agent), 1, "{}", agent.log());
    assert!(container(&agent.json("/debug/snapshot"), &later.id).is_none());
    // The driver makes the 1g.20gb GPU instance (profile 15) at placement 2.
    let made = mig(
        MIG_NEW,
        3,
        "NVIDIA H100 80GB HBM3 MIG 1g.20gb",
        json!({"placement_start": 2}),
    );
    sc.write(&node(vec![made]));
    agent.wait_snapshot(Duration::from_secs(25), "the MIG device made", |s| {
        allocated(s, &later.id) == Some(json!([MIG_NEW]))
    });
    assert_eq!(agent.stats()["dra_devices_unmatched"], 0);
    assert_eq!(warned(&agent), 1);
}

/// The agent's own pod (POD_NAMESPACE and POD_NAME, as the DaemonSet sets them) holding an
/// admin-access claim on a GPU that a workload's claim holds too: the kubelet lists it under
/// the agent's container, and the agent leaves it out, so the workload keeps the whole GPU
/// and the agent is never allocated-but-idle.
#[test]
#[ignore = "needs root: loads the eBPF programs"]
fn the_agents_own_admin_access_claim_is_no_allocation() {
    let dir = Dir::new("dra");
    let sc = Scenario::new(&node(vec![]));
    let work = pod("work");
    let mut own = pod("gpu-agent-x7k2p");
    own.namespace = "gpu-agent".into();
    let world = World::default();
    world.set(vec![work.clone(), own.clone()]);
    let mut admin = claim(
        "gpu-agent-x7k2p",
        "gpu-agent-admin-access",
        &["gpu-6"],
        true,
    );
    admin.namespace = "gpu-agent".into();
    world.set_claims(vec![claim("work", "work-gpu", &["gpu-6"], true), admin]);
    let node = FakeNode::start(&dir.0, world);
    let lib = fake_nvml_lib();
    let cfg = format!(
        "[nvml]\ninterval_ms = 200\n{}",
        metadata_config(&dir.0, Some(&node))
    );
    let env = [
        ("FAKE_NVML_SCENARIO", sc.path()),
        ("POD_NAMESPACE", "gpu-agent"),
        ("POD_NAME", "gpu-agent-x7k2p"),
    ];
    let agent = Agent::start_env(
        &cfg,
        &["--nvml-lib", lib.to_str().unwrap(), "--prometheus"],
        &env,
    );
    let mut text = String::new();
    agent.wait_until("the workload's share", Duration::from_secs(25), || {
        text = metrics(&agent);
        line(&text, "container_gpu_share", &["pod=\"work\"", G4]).is_some()
    });
    let share = line(&text, "container_gpu_share", &["pod=\"work\"", G4]).unwrap();
    assert!(share.ends_with(" 1"), "{text}");
    assert!(!text.contains("pod=\"gpu-agent-x7k2p\""), "{text}");
    assert!(container(&agent.json("/debug/snapshot"), &own.id).is_none());
}
