//! Names and allocations from the node's sockets, end to end: fake kubelet pod-resources
//! and CRI servers (from the same protos as the agent's clients) on unix sockets, the real
//! agent with real eBPF, processes in pod cgroups, and the fake NVML library.
use std::{path::PathBuf, time::Duration};

use serde_json::{json, Value};
use tests::{
    cgroups::{sleeper, systemd_container, Proc, TestCgroup},
    container,
    fake_node::{FakeContainer, FakeNode, World},
    fake_nvml_lib, random_hex, random_uid, Agent,
};

const G0: &str = "GPU-00000000-1111-2222-3333-444444444444";
const G1: &str = "GPU-11111111-1111-2222-3333-444444444444";

fn scenario(path: &PathBuf, procs_on_g0: &[u32]) {
    let ps: Vec<Value> = procs_on_g0
        .iter()
        .map(|p| json!({"pid": p, "used_memory": 1u64 << 30, "sm_util": 20, "mem_util": 1, "enc_util": 0, "dec_util": 0}))
        .collect();
    let dev = |i: u32, uuid: &str, ps: Vec<Value>| {
        json!({"index": i, "uuid": uuid, "name": "NVIDIA H100 80GB HBM3", "memory_total": 85520809984u64,
               "memory_used": 1u64 << 30, "utilization_gpu": 20, "utilization_memory": 1, "processes": ps})
    };
    let v = json!({"devices": [dev(0, G0, ps), dev(1, G1, vec![])]});
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, v.to_string()).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

fn wait(agent: &Agent, what: &str, mut pred: impl FnMut(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(25);
    let mut last = Value::Null;
    while std::time::Instant::now() < deadline {
        last = agent.json("/debug/snapshot");
        if pred(&last) {
            return last;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "timed out waiting for {what}; last snapshot:\n{last:#}\nagent log:\n{}",
        agent.log()
    );
}

struct Env {
    dir: PathBuf,
    scenario: PathBuf,
}

impl Env {
    fn new() -> Env {
        let dir = std::env::temp_dir().join(format!("fake-node-{}", random_hex(8)));
        std::fs::create_dir_all(&dir).unwrap();
        let scenario = dir.join("nvml.json");
        Env { dir, scenario }
    }

    /// A pod's container with one sleeping process, the GPU scenario's only one.
    fn gpu_pod(&self) -> (String, String, TestCgroup, Proc) {
        let (uid, id) = (random_uid(), random_hex(64));
        let cg = TestCgroup::v2(&systemd_container(&uid, &id));
        let p = Proc(cg.spawn(&mut sleeper()));
        scenario(&self.scenario, &[p.pid()]);
        (uid, id, cg, p)
    }

    fn agent(&self, node: &FakeNode) -> Agent {
        self.agent_with(node, "")
    }

    fn agent_with(&self, node: &FakeNode, extra_config: &str) -> Agent {
        let lib = fake_nvml_lib();
        let cfg = format!(
            "{extra_config}[nvml]\ninterval_ms = 200\n[metadata]\ncri_socket = \"{}\"\npod_resources_socket = \"{}\"\ndocker_socket = \"{}\"\nallocation_interval_secs = 1\n",
            node.cri.display(),
            node.pod_resources.display(),
            self.dir.join("no-docker.sock").display()
        );
        Agent::start_env(
            &cfg,
            &["--nvml-lib", lib.to_str().unwrap(), "--prometheus"],
            &[("FAKE_NVML_SCENARIO", self.scenario.to_str().unwrap())],
        )
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn names_allocations_and_allocated_but_idle_containers() {
    let env = Env::new();
    let (uid, id, _cg, _p) = env.gpu_pod();
    let idle_id = random_hex(64);
    let world = World::default();
    world.set(vec![
        FakeContainer {
            id: id.clone(),
            pod_uid: uid.clone(),
            namespace: "ml".into(),
            pod: "trainer-0".into(),
            name: "main".into(),
            // Time-slicing replica 1 of GPU 0.
            gpus: vec![format!("{G0}::1")],
        },
        FakeContainer {
            id: idle_id.clone(),
            pod_uid: random_uid(),
            namespace: "ml".into(),
            pod: "idle-0".into(),
            name: "sleepy".into(),
            // An index, as some device plugins name GPUs.
            gpus: vec!["1".into()],
        },
    ]);
    let node = FakeNode::start(&env.dir, world.clone());
    let agent = env.agent(&node);
    let snap = wait(&agent, "names and the idle allocation", |s| {
        container(s, &id).is_some_and(|c| c["pod_name"] == "trainer-0")
            && container(s, &idle_id).is_some()
    });
    let c = container(&snap, &id).unwrap();
    assert_eq!(c["namespace"], "ml");
    assert_eq!(c["container_name"], "main");
    assert_eq!(c["allocated_gpus"], json!([G0]));
    let idle = container(&snap, &idle_id).unwrap();
    assert_eq!(idle["pod_name"], "idle-0");
    assert_eq!(idle["gpus"], json!([]));
    assert_eq!(idle["allocated_gpus"], json!([G1]));
    // The Prometheus view says who holds a GPU without using it.
    let (_, text) = tests::http::get(&agent.addr, "/metrics").unwrap();
    let idle_line = text
        .lines()
        .find(|l| l.starts_with("container_gpu_allocated_idle{") && l.contains("pod=\"idle-0\""))
        .unwrap_or_else(|| panic!("no idle series:\n{text}"));
    assert!(idle_line.ends_with(" 1"), "{idle_line}");
    let busy_line = text
        .lines()
        .find(|l| l.starts_with("container_gpu_allocated_idle{") && l.contains("pod=\"trainer-0\""))
        .unwrap();
    assert!(busy_line.ends_with(" 0"), "{busy_line}");
    assert!(text.contains(&format!("container_gpu_memory_usage_bytes{{container_id=\"{id}\",pod_uid=\"{uid}\",namespace=\"ml\",pod=\"trainer-0\",container=\"main\"")), "{text}");
    // Names come from a listing when an unknown id appears, not from polling: steady. Nor
    // from the timer's retry of an id the join asked about before the first listing
    // named it (on a node of 9,000 containers, a listing costs 130 ms).
    let calls = world.list_calls();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        world.list_calls(),
        calls,
        "CRI listed again with every container named"
    );
    let st = agent.stats();
    assert_eq!(st["metadata"]["cri"], "ok", "{st}");
    assert_eq!(st["metadata"]["pod_resources"], "ok", "{st}");
    // The kubelet allocates the busy container another GPU: the join, which keeps each
    // container's allocation from one cycle to the next, follows the new listing.
    let mut next = world.containers();
    next[0].gpus = vec![G1.into()];
    world.set(next);
    wait(&agent, "the new allocation", |s| {
        container(s, &id).is_some_and(|c| c["allocated_gpus"] == json!([G1]))
    });
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn sockets_that_vanish_leave_ids_and_names_come_back_with_them() {
    let env = Env::new();
    let (uid, id, _cg, p) = env.gpu_pod();
    let world = World::default();
    let first = FakeContainer {
        id: id.clone(),
        pod_uid: uid.clone(),
        namespace: "team-a".into(),
        pod: "job-1".into(),
        name: "worker".into(),
        gpus: vec![G0.into()],
    };
    world.set(vec![first.clone()]);
    let mut node = FakeNode::start(&env.dir, world.clone());
    let agent = env.agent(&node);
    wait(&agent, "the first name", |s| {
        container(s, &id).is_some_and(|c| c["pod_name"] == "job-1")
    });
    // Both sockets vanish; a new GPU container appears.
    node.stop();
    let (uid2, id2) = (random_uid(), random_hex(64));
    let cg2 = TestCgroup::v2(&systemd_container(&uid2, &id2));
    let p2 = Proc(cg2.spawn(&mut sleeper()));
    scenario(&env.scenario, &[p.pid(), p2.pid()]);
    let snap = wait(&agent, "the new container by id", |s| {
        container(s, &id2).is_some()
    });
    let c2 = container(&snap, &id2).unwrap();
    assert_eq!(c2["pod_uid"], json!(uid2), "ids are always there");
    assert_eq!(c2["pod_name"], Value::Null);
    agent.wait_until(
        "the CRI failure to be reported",
        Duration::from_secs(15),
        || {
            agent.stats()["metadata"]["cri"]
                .as_str()
                .is_some_and(|s| s.starts_with("unavailable"))
        },
    );
    assert!(
        agent.log().contains("running on with container ids only"),
        "{}",
        agent.log()
    );
    // The sockets come back: the pending name resolves by itself.
    world.set(vec![
        first,
        FakeContainer {
            id: id2.clone(),
            pod_uid: uid2.clone(),
            namespace: "team-b".into(),
            pod: "job-2".into(),
            name: "trainer".into(),
            gpus: vec![G1.into()],
        },
    ]);
    let _node = FakeNode::start(&env.dir, world.clone());
    let snap = wait(&agent, "the new container's name", |s| {
        container(s, &id2).is_some_and(|c| c["pod_name"] == "job-2")
    });
    assert_eq!(
        container(&snap, &id2).unwrap()["allocated_gpus"],
        json!([G1])
    );
    assert_eq!(agent.stats()["mode"], "ebpf", "the agent ran on throughout");
}

/// A Docker Engine API stand-in: answers GET /containers/<id>/json for one container.
fn fake_docker(sock: PathBuf, id: String, name: &'static str) -> std::thread::JoinHandle<()> {
    use std::io::{BufRead, BufReader, Write};
    let _ = std::fs::remove_file(&sock);
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).unwrap_or(0);
            let (status, body) = if line.contains(&format!("/containers/{id}/json")) {
                (
                    "200 OK",
                    json!({"Id": id, "Name": format!("/{name}"), "Config": {"Labels": {}}})
                        .to_string(),
                )
            } else if line.contains("/stop") {
                return;
            } else {
                (
                    "404 Not Found",
                    r#"{"message":"No such container"}"#.to_string(),
                )
            };
            let _ = write!(
                s,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    })
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn plain_docker_host_names_come_from_the_docker_api() {
    let env = Env::new();
    let id = random_hex(64);
    let cg = TestCgroup::v2(&format!("/system.slice/docker-{id}.scope"));
    let p = Proc(cg.spawn(&mut sleeper()));
    scenario(&env.scenario, &[p.pid()]);
    let docker = env.dir.join("docker.sock");
    let _srv = fake_docker(docker.clone(), id.clone(), "llm-server");
    let lib = fake_nvml_lib();
    let cfg = format!(
        "[nvml]\ninterval_ms = 200\n[metadata]\ncri_socket = \"{}\"\npod_resources_socket = \"{}\"\nallocation_interval_secs = 1\n",
        env.dir.join("no-cri.sock").display(),
        env.dir.join("no-kubelet.sock").display(),
    );
    let agent = Agent::start_env(
        &cfg,
        &[
            "--nvml-lib",
            lib.to_str().unwrap(),
            "--docker-socket",
            docker.to_str().unwrap(),
        ],
        &[("FAKE_NVML_SCENARIO", env.scenario.to_str().unwrap())],
    );
    let snap = wait(&agent, "the docker name", |s| {
        container(s, &id).is_some_and(|c| c["container_name"] == "llm-server")
    });
    let c = container(&snap, &id).unwrap();
    assert_eq!(c["runtime"], "docker");
    assert_eq!(c["pod_name"], Value::Null);
    // Stop the stand-in's accept loop.
    let _ = std::os::unix::net::UnixStream::connect(&docker)
        .and_then(|mut s| std::io::Write::write_all(&mut s, b"GET /stop HTTP/1.1\r\n\r\n"));
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn names_of_removed_containers_are_forgotten() {
    let env = Env::new();
    let (uid, id, cg, p) = env.gpu_pod();
    let world = World::default();
    world.set(vec![FakeContainer {
        id: id.clone(),
        pod_uid: uid.clone(),
        namespace: "ml".into(),
        pod: "trainer-0".into(),
        name: "main".into(),
        gpus: vec![],
    }]);
    let node = FakeNode::start(&env.dir, world.clone());
    let agent = env.agent_with(&node, "[cache]\ntombstone_secs = 1\n");
    wait(&agent, "the name", |s| {
        container(s, &id).is_some_and(|c| c["pod_name"] == "trainer-0")
    });
    assert!(agent.stats()["metadata_names"].as_u64() >= Some(1));
    // The container goes: its process, its cgroup, and (as a runtime would) its listing.
    scenario(&env.scenario, &[]);
    drop(p);
    drop(cg);
    world.set(vec![]);
    agent.wait_until("the name forgotten", Duration::from_secs(15), || {
        agent.stats()["metadata_names"].as_u64() == Some(0)
    });
}

type Labels = &'static [(&'static str, &'static str)];

/// Pods of three workloads, each a container with one GPU process: (namespace, pod, its
/// own labels). The pods' names are the controllers' (`<deployment>-<hash>-<suffix>`,
/// `<statefulset>-<ordinal>`, `<cronjob>-<minute>-<suffix>`).
const WORKLOAD_PODS: [(&str, &str, Labels); 3] = [
    (
        "inference",
        "vllm-7f9c6d5b8-x2k8p",
        &[("app", "vllm"), ("pod-template-hash", "7f9c6d5b8")],
    ),
    (
        "speech",
        "whisper-1",
        &[
            ("controller-revision-hash", "whisper-6c4f9d8b7"),
            ("statefulset.kubernetes.io/pod-name", "whisper-1"),
        ],
    ),
    (
        "ml",
        "nightly-eval-28948930-9cd7w",
        &[
            ("batch.kubernetes.io/job-name", "nightly-eval-28948930"),
            ("controller-uid", "5a1b"),
        ],
    ),
];

/// The pods of `WORKLOAD_PODS` in `world`, their processes on G0: (id, cgroup, process)
/// per pod.
fn workload_pods(env: &Env, world: &World) -> Vec<(String, TestCgroup, Proc)> {
    let mut pods = vec![];
    let mut containers = vec![];
    for (namespace, pod, labels) in WORKLOAD_PODS {
        let (uid, id) = (random_uid(), random_hex(64));
        let cg = TestCgroup::v2(&systemd_container(&uid, &id));
        let p = Proc(cg.spawn(&mut sleeper()));
        containers.push(FakeContainer {
            id: id.clone(),
            pod_uid: uid,
            namespace: namespace.into(),
            pod: pod.into(),
            name: "main".into(),
            gpus: vec![],
        });
        world.set_pod_labels(namespace, pod, labels);
        pods.push((id, cg, p));
    }
    world.set(containers);
    let pids: Vec<u32> = pods.iter().map(|(_, _, p)| p.pid()).collect();
    scenario(&env.scenario, &pids);
    pods
}

/// The `k8s.*.name` attributes of a pod's owner on container `id`'s resource, as
/// `key=value`.
fn owner_attributes(
    req: &opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest,
    id: &str,
) -> Vec<String> {
    use tests::otlp_receiver::{attr_str, container_resource};
    let Some(rm) = container_resource(req, id) else {
        return vec![];
    };
    let a = &rm.resource.as_ref().unwrap().attributes;
    let keys = [
        "k8s.deployment.name",
        "k8s.replicaset.name",
        "k8s.statefulset.name",
        "k8s.daemonset.name",
        "k8s.job.name",
        "k8s.cronjob.name",
    ];
    let found = keys
        .into_iter()
        .filter_map(|k| Some(format!("{k}={}", attr_str(a, k)?)));
    found.collect()
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn workloads_from_the_pods_labels_in_the_snapshot_metrics_and_otlp() {
    use tests::otlp_receiver::{Kind, Receiver};
    let env = Env::new();
    let world = World::default();
    let pods = workload_pods(&env, &world);
    let node = FakeNode::start(&env.dir, world.clone());
    let rx = Receiver::start(Kind::Http, 0);
    let url = rx.url();
    let cfg = format!(
        "[nvml]\ninterval_ms = 200\n{}",
        tests::fake_node::metadata_config(&env.dir, Some(&node))
    );
    let lib = fake_nvml_lib();
    let agent = Agent::start_env(
        &cfg,
        &["--nvml-lib", lib.to_str().unwrap(), "--prometheus"],
        &[
            ("FAKE_NVML_SCENARIO", env.scenario.to_str().unwrap()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &url),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
        ],
    );
    let ids: Vec<&str> = pods.iter().map(|(id, _, _)| id.as_str()).collect();
    let snap = wait(&agent, "every pod's workload", |s| {
        ids.iter()
            .all(|id| container(s, id).is_some_and(|c| !c["workload"].is_null()))
    });
    let workload = |id: &str| container(&snap, id).unwrap()["workload"].clone();
    assert_eq!(
        workload(ids[0]),
        json!({"kind": "Deployment", "name": "vllm", "replicaset": "vllm-7f9c6d5b8", "job": null})
    );
    assert_eq!(
        workload(ids[1]),
        json!({"kind": "StatefulSet", "name": "whisper", "replicaset": null, "job": null})
    );
    assert_eq!(
        workload(ids[2]),
        json!({"kind": "CronJob", "name": "nightly-eval", "replicaset": null, "job": "nightly-eval-28948930"})
    );
    // Prometheus: one pair of labels after the container's names.
    let (_, text) = tests::http::get(&agent.addr, "/metrics").unwrap();
    for (id, kind, name) in [
        (ids[0], "Deployment", "vllm"),
        (ids[1], "StatefulSet", "whisper"),
        (ids[2], "CronJob", "nightly-eval"),
    ] {
        let line = text
            .lines()
            .find(|l| {
                l.starts_with("container_gpu_memory_usage_bytes{")
                    && l.contains(&format!("container_id=\"{id}\""))
            })
            .unwrap_or_else(|| panic!("no series of {id}:\n{text}"));
        let labels = format!("container=\"main\",workload_kind=\"{kind}\",workload=\"{name}\",");
        assert!(line.contains(&labels), "{line}");
    }
    // OTLP: the semantic conventions' names on each container's resource.
    let req = rx
        .received
        .wait_for(Duration::from_secs(20), |r| {
            ids.iter().all(|id| !owner_attributes(r, id).is_empty())
        })
        .unwrap_or_else(|| panic!("no export naming the workloads\n{}", agent.log()));
    let attrs = |id: &str| owner_attributes(&req, id);
    assert_eq!(
        attrs(ids[0]),
        [
            "k8s.deployment.name=vllm",
            "k8s.replicaset.name=vllm-7f9c6d5b8"
        ]
    );
    assert_eq!(attrs(ids[1]), ["k8s.statefulset.name=whisper"]);
    assert_eq!(
        attrs(ids[2]),
        [
            "k8s.job.name=nightly-eval-28948930",
            "k8s.cronjob.name=nightly-eval"
        ]
    );
    drop(node);
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn a_runtime_without_list_pod_sandbox_names_containers_without_workloads() {
    let env = Env::new();
    let world = World::default();
    world.set_sandboxes_unimplemented(true);
    let pods = workload_pods(&env, &world);
    let node = FakeNode::start(&env.dir, world.clone());
    let agent = env.agent(&node);
    let id = pods[0].0.as_str();
    let snap = wait(&agent, "the name", |s| {
        container(s, id).is_some_and(|c| c["pod_name"] == "vllm-7f9c6d5b8-x2k8p")
    });
    assert_eq!(container(&snap, id).unwrap()["workload"], Value::Null);
    let (_, text) = tests::http::get(&agent.addr, "/metrics").unwrap();
    assert!(text.contains("pod=\"vllm-7f9c6d5b8-x2k8p\""), "{text}");
    assert!(!text.contains("workload"), "{text}");
    let said = agent
        .log()
        .matches("does not implement ListPodSandbox")
        .count();
    assert_eq!(said, 1, "said once:\n{}", agent.log());
    assert_eq!(agent.stats()["metadata"]["cri"], "ok");
}
