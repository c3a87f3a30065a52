//! Every way pods share a GPU, end to end: the real agent with real eBPF, processes in pod
//! cgroups, the fake NVML library (MPS lists), and fake kubelet pod-resources and CRI
//! servers (DRA claims, time-slicing replicas, the runtime's name).
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use serde_json::{json, Value};
use tests::{
    cgroups::{cgroupfs_container, sleeper, systemd_container, Proc, TestCgroup},
    container,
    fake_node::{kubelet_claim, metadata_config, FakeClaim, FakeContainer, FakeNode, World},
    fake_nvml_lib,
    nvml::Scenario,
    random_hex, random_uid, Agent, TempDir as Dir,
};

const GIB: u64 = 1 << 30;
const G0: &str = "GPU-00000000-aaaa-2222-3333-444444444444";
const G1: &str = "GPU-11111111-aaaa-2222-3333-444444444444";

/// The agent on the fake library, with the node's sockets at `node` (or nowhere).
fn start_agent(sc: &Scenario, dir: &Path, node: Option<&FakeNode>, extra: &str) -> Agent {
    let lib = fake_nvml_lib();
    let cfg = format!(
        "[nvml]\ninterval_ms = 200\n{}{extra}",
        metadata_config(dir, node)
    );
    Agent::start_env(
        &cfg,
        &["--nvml-lib", lib.to_str().unwrap(), "--prometheus"],
        &[("FAKE_NVML_SCENARIO", sc.path())],
    )
}

fn wait_snapshot(agent: &Agent, what: &str, pred: impl FnMut(&Value) -> bool) -> Value {
    agent.wait_snapshot(Duration::from_secs(25), what, pred)
}

fn metrics(agent: &Agent) -> String {
    tests::http::get(&agent.addr, "/metrics").unwrap().1
}

/// The line of `family` whose labels contain all of `with`.
fn line<'a>(text: &'a str, family: &str, with: &[&str]) -> Option<&'a str> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .find(|l| with.iter().all(|w| l.contains(w)))
}

fn proc_json(pid: u32, mem: u64, sm: u32) -> Value {
    json!({"pid": pid, "used_memory": mem, "sm_util": sm, "mem_util": 1, "enc_util": 0, "dec_util": 0})
}

/// A copy of `sleep` named like the MPS server, so that the kernel's comm for it is the
/// server's (`nvidia-cuda-mps`, 15 characters).
fn mps_server_binary(dir: &Path) -> PathBuf {
    let sleep =
        String::from_utf8(Command::new("which").arg("sleep").output().unwrap().stdout).unwrap();
    let bin = dir.join("nvidia-cuda-mps-server");
    std::fs::copy(sleep.trim(), &bin).unwrap();
    bin
}

/// tests/scenarios/mps.json with its placeholder PIDs replaced.
fn mps_scenario(pids: &[(u64, u32)]) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/mps.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for list in ["processes", "mps_processes"] {
        for p in v["devices"][0][list].as_array_mut().unwrap() {
            let old = p["pid"].as_u64().unwrap();
            let new = pids.iter().find(|(o, _)| *o == old).unwrap().1;
            p["pid"] = json!(new);
        }
    }
    v
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn mps_clients_in_two_pods_are_attributed_and_the_server_is_not_charged() {
    let dir = Dir::new("sharing");
    let ids: Vec<(String, String)> = (0..3).map(|_| (random_uid(), random_hex(64))).collect();
    let cgs: Vec<TestCgroup> = ids
        .iter()
        .map(|(u, i)| TestCgroup::v2(&systemd_container(u, i)))
        .collect();
    // The MPS control daemon's pod runs the server; two workload pods run the clients.
    let mut server_cmd = Command::new(mps_server_binary(&dir.0));
    server_cmd.arg("600");
    let server = Proc(cgs[0].spawn(&mut server_cmd));
    let (a1, a2) = (
        Proc(cgs[1].spawn(&mut sleeper())),
        Proc(cgs[1].spawn(&mut sleeper())),
    );
    let b = Proc(cgs[2].spawn(&mut sleeper()));
    let sc = Scenario::new(&mps_scenario(&[
        (4000, server.pid()),
        (4001, a1.pid()),
        (4002, a2.pid()),
        (4003, b.pid()),
    ]));
    let agent = start_agent(&sc, &dir.0, None, "");
    let snap = wait_snapshot(&agent, "both client pods", |s| {
        container(s, &ids[1].1).is_some() && container(s, &ids[2].1).is_some()
    });
    let ga = &container(&snap, &ids[1].1).unwrap()["gpus"][0];
    // 4001 is listed twice (compute and MPS lists): one process, counted once.
    assert_eq!(ga["memory_used_bytes"], json!(12 * GIB), "{ga}");
    assert_eq!(ga["sm_util"], json!(35 + 10));
    let mut pids = vec![a1.pid(), a2.pid()];
    pids.sort();
    assert_eq!(ga["pids"], json!(pids));
    let gb = &container(&snap, &ids[2].1).unwrap()["gpus"][0];
    assert_eq!(gb["memory_used_bytes"], json!(6 * GIB));
    assert_eq!(gb["sm_util"], json!(25));
    // The server's pod is not charged as a workload, and the device names the server.
    assert!(container(&snap, &ids[0].1).is_none(), "{snap:#}");
    assert_eq!(snap["containers"].as_array().unwrap().len(), 2, "{snap:#}");
    assert_eq!(snap["devices"][0]["mps_server_pids"], json!([server.pid()]));
    assert_eq!(agent.stats()["gpu_processes"], json!(4));
}

fn fake_container(id: &str, uid: &str, ns: &str, pod: &str, gpus: Vec<String>) -> FakeContainer {
    FakeContainer {
        id: id.into(),
        pod_uid: uid.into(),
        namespace: ns.into(),
        pod: pod.into(),
        name: "main".into(),
        gpus,
    }
}

fn two_gpus(procs_on_g0: Vec<Value>) -> Value {
    json!({"devices": [
        {"index": 0, "minor_number": 0, "uuid": G0, "memory_total": 80 * GIB, "processes": procs_on_g0},
        {"index": 1, "minor_number": 5, "uuid": G1, "memory_total": 80 * GIB, "processes": []}
    ]})
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn dra_claims_feed_the_allocation_metrics() {
    let dir = Dir::new("sharing");
    let (uid, id) = (random_uid(), random_hex(64));
    let (idle_uid, idle_id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&systemd_container(&uid, &id));
    let p = Proc(cg.spawn(&mut sleeper()));
    let sc = Scenario::new(&two_gpus(vec![proc_json(p.pid(), GIB, 20)]));
    let world = World::default();
    world.set(vec![
        fake_container(&id, &uid, "ml", "dra-0", vec![]),
        fake_container(&idle_id, &idle_uid, "ml", "dra-idle", vec![]),
    ]);
    // NVIDIA's DRA driver names a GPU by its minor number: GPU 1's is 5.
    let claim = |pod: &str, device: &str| FakeClaim {
        namespace: "ml".into(),
        pod: pod.into(),
        container: "main".into(),
        claim: kubelet_claim(
            "ml",
            &format!("{pod}-gpu"),
            "node-1",
            &[(
                device,
                &format!("k8s.gpu.nvidia.com/claim={}-{device}", random_uid()),
            )],
        ),
    };
    world.set_claims(vec![claim("dra-0", "gpu-0"), claim("dra-idle", "gpu-5")]);
    let node = FakeNode::start(&dir.0, world);
    let agent = start_agent(&sc, &dir.0, Some(&node), "");
    let snap = wait_snapshot(&agent, "both DRA allocations", |s| {
        container(s, &id).is_some_and(|c| c["allocated_gpus"] == json!([G0]))
            && container(s, &idle_id).is_some_and(|c| c["allocated_gpus"] == json!([G1]))
    });
    assert_eq!(container(&snap, &idle_id).unwrap()["gpus"], json!([]));
    let text = metrics(&agent);
    let busy = line(
        &text,
        "container_gpu_allocated_idle",
        &["pod=\"dra-0\"", G0],
    )
    .unwrap_or_else(|| panic!("{text}"));
    assert!(busy.ends_with(" 0"), "{busy}");
    let idle = line(
        &text,
        "container_gpu_allocated_idle",
        &["pod=\"dra-idle\"", G1],
    )
    .unwrap_or_else(|| panic!("{text}"));
    assert!(idle.ends_with(" 1"), "{idle}");
    let allocated = line(&text, "container_gpu_allocated", &["pod=\"dra-idle\"", G1]).unwrap();
    assert!(allocated.ends_with(" 1"), "{allocated}");
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn the_runtime_is_filled_from_cri_when_the_cgroup_path_does_not_name_it() {
    let dir = Dir::new("sharing");
    let (uid, id) = (random_uid(), random_hex(64));
    // kubelet's cgroupfs driver: /kubepods/besteffort/pod<uid>/<id> names no runtime.
    let cg = TestCgroup::v2(&cgroupfs_container(&uid, &id));
    let p = Proc(cg.spawn(&mut sleeper()));
    let sc = Scenario::new(&two_gpus(vec![proc_json(p.pid(), GIB, 10)]));
    let world = World::default();
    world.set(vec![fake_container(&id, &uid, "web", "api-0", vec![])]);
    world.set_runtime_name("containerd");
    let node = FakeNode::start(&dir.0, world);
    let proc_row = {
        let agent = start_agent(&sc, &dir.0, None, "");
        let row = agent.wait_for_process(p.pid(), "container_id", &json!(id));
        assert_eq!(row["runtime"], Value::Null, "the path alone does not say");
        row
    };
    assert_eq!(proc_row["qos"], "besteffort");
    let agent = start_agent(&sc, &dir.0, Some(&node), "");
    let snap = wait_snapshot(&agent, "the runtime", |s| {
        container(s, &id).is_some_and(|c| c["runtime"] == "containerd")
    });
    assert_eq!(container(&snap, &id).unwrap()["pod_name"], "api-0");
    let text = metrics(&agent);
    assert!(
        line(
            &text,
            "container_gpu_memory_usage_bytes",
            &[&id, "runtime=\"containerd\""]
        )
        .is_some(),
        "{text}"
    );
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn hami_limits_from_the_environment_and_time_slice_shares_are_exported() {
    let dir = Dir::new("sharing");
    let (uid, id) = (random_uid(), random_hex(64));
    let (ts_uid, ts_id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&systemd_container(&uid, &id));
    let ts_cg = TestCgroup::v2(&systemd_container(&ts_uid, &ts_id));
    // What HAMi's device plugin puts in a container's environment.
    let mut hami = sleeper();
    hami.env("NVIDIA_VISIBLE_DEVICES", G0)
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "3000m")
        .env("CUDA_DEVICE_SM_LIMIT", "40");
    let p = Proc(cg.spawn(&mut hami));
    let q = Proc(ts_cg.spawn(&mut sleeper()));
    let sc = Scenario::new(&two_gpus(vec![
        proc_json(p.pid(), 2 * GIB, 30),
        proc_json(q.pid(), GIB, 10),
    ]));
    let world = World::default();
    world.set(vec![
        fake_container(&id, &uid, "team-a", "hami-0", vec![]),
        // Two of GPU 0's four time-slicing replicas.
        fake_container(
            &ts_id,
            &ts_uid,
            "team-b",
            "ts-0",
            vec![format!("{G0}::1"), format!("{G0}::2")],
        ),
    ]);
    world.set_allocatable((0..4).map(|i| format!("{G0}::{i}")).collect());
    let node = FakeNode::start(&dir.0, world);
    let agent = start_agent(&sc, &dir.0, Some(&node), "");
    let snap = wait_snapshot(&agent, "both limits", |s| {
        let limit =
            |id: &str| container(s, id).map(|c| c["accounts"][0]["memory_limit_bytes"].clone());
        limit(&id) == Some(json!(3000u64 << 20)) && limit(&ts_id) == Some(json!(40 * GIB))
    });
    let a = &container(&snap, &id).unwrap()["accounts"][0];
    assert_eq!(a["memory_limit_source"], "hami");
    assert_eq!(a["sm_limit_percent"], 40);
    let t = &container(&snap, &ts_id).unwrap()["accounts"][0];
    assert_eq!(t["memory_limit_source"], "timeslice");
    assert_eq!(t["sm_limit_percent"], Value::Null);
    // "Near its quota" is one query: usage over limit.
    let text = metrics(&agent);
    let limit = line(
        &text,
        "container_gpu_memory_limit_bytes",
        &[&id, "limit_source=\"hami\""],
    )
    .unwrap_or_else(|| panic!("{text}"));
    assert!(limit.ends_with(&format!(" {}", 3000u64 << 20)), "{limit}");
    let sm = line(&text, "container_gpu_utilization_limit_ratio", &[&id]).unwrap();
    assert!(sm.ends_with(" 0.4"), "{sm}");
}

#[test]
#[ignore = "needs root: loads the eBPF programs"]
fn metadata_status_says_not_found_without_sockets_and_ok_after_a_call() {
    let dir = Dir::new("sharing");
    let sc = Scenario::new(&two_gpus(vec![]));
    let agent = start_agent(&sc, &dir.0, None, "");
    agent.wait_until("the metadata status", Duration::from_secs(10), || {
        !agent.stats()["metadata"]["pod_resources"].is_null()
    });
    let st = agent.stats();
    for source in ["cri", "pod_resources", "docker"] {
        assert_eq!(st["metadata"][source], "not found", "{source}: {st}");
    }
    drop(agent);
    let node = FakeNode::start(&dir.0, World::default());
    let agent = start_agent(&sc, &dir.0, Some(&node), "");
    agent.wait_until("cri and pod-resources ok", Duration::from_secs(10), || {
        let st = agent.stats();
        st["metadata"]["cri"] == "ok" && st["metadata"]["pod_resources"] == "ok"
    });
    assert_eq!(agent.stats()["metadata"]["docker"], "not found");
}
