//! Who runs on the demo node: the pods, the GPUs the kubelet allocated them, and their
//! processes, with where each shows in NVML and how it loads its GPU.
use tests::cgroups::{Driver, QosClass};

/// The eight GPUs' UUIDs (a DGX H100's, as in tests/scenarios/h100-8gpu.json).
pub const GPU_UUIDS: [&str; 8] = [
    "GPU-6663f2bc-da9f-4cff-88fe-d84cc95fe598",
    "GPU-04e45efc-098c-4084-abe1-55ceac90c86e",
    "GPU-8e3a41c5-9347-4a5b-a376-d44cde6fd94b",
    "GPU-2b1ad5c6-1f0e-4a8d-9e57-5c3f0d7a6e21",
    "GPU-93c7e0d4-6b8a-4f25-a1d9-0e4b7c2f5a38",
    "GPU-5f0a9c13-7d2e-4b6f-8c41-a92e3d6b0f74",
    "GPU-c4d8e2f1-0a7b-4c93-b5e6-1f8a2d7c9e05",
    "GPU-7a1e5b90-3c6d-4e2f-9b08-d4c1f6a3e827",
];

/// GPU 6 runs MIG: two 3g.40gb instances, (UUID, GPU instance id).
pub const MIG_GPU: usize = 6;
pub const MIG: [(&str, u32); 2] = [
    ("MIG-1d6b3f0a-8e2c-5a47-b9d1-3c7e0f5a2b68", 1),
    ("MIG-8f2c7a1e-4b9d-5e03-a6c8-0d3f7b1e9a45", 2),
];

/// GPU 5 is shared through MPS; GPU 2 by time-slicing, and it runs hot.
pub const MPS_GPU: usize = 5;
pub const HOT_GPU: usize = 2;
/// The GPU where evaluation jobs come and go, beside a service on the host.
pub const JOB_GPU: usize = 7;

/// Where a process shows in NVML.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// GPU n's compute list.
    Gpu(usize),
    /// The compute list of GPU n's MIG device with this GPU instance id.
    Mig(usize, u32),
    /// GPU n's MPS list, as a client.
    MpsClient(usize),
    /// GPU n's compute list, as the MPS server.
    MpsServer(usize),
}

impl Slot {
    pub fn gpu(self) -> usize {
        match self {
            Slot::Gpu(g) | Slot::Mig(g, _) | Slot::MpsClient(g) | Slot::MpsServer(g) => g,
        }
    }
}

/// How a process uses its GPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Load {
    /// Memory it holds when it starts, GiB.
    pub gib: f64,
    /// What it adds each tick, GiB, up to `max_gib`.
    pub grow: f64,
    pub max_gib: f64,
    /// SM % it works at; None: no utilization sample (it holds memory and does nothing).
    pub sm: Option<u32>,
}

const fn steady(gib: f64, sm: Option<u32>) -> Load {
    Load {
        gib,
        grow: 0.0,
        max_gib: gib,
        sm,
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Process {
    /// Its name (`comm`): the demo runs a sleeper under this name.
    pub comm: &'static str,
    /// None: a process of the pod that does not use the GPU.
    pub slot: Option<Slot>,
    pub load: Load,
}

fn on(comm: &'static str, slot: Slot, load: Load) -> Process {
    Process {
        comm,
        slot: Some(slot),
        load,
    }
}

/// Where a workload's processes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Home {
    /// A pod's container, in the kubelet's cgroup layout for this driver and QoS class.
    Pod(Driver, QosClass),
    /// A systemd service on the host, outside Kubernetes: /system.slice/<name>.
    Service(&'static str),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub namespace: &'static str,
    pub pod: String,
    pub container: &'static str,
    pub home: Home,
    /// The device plugin's ids the kubelet allocated (time-slicing and MPS: `<uuid>::n`).
    pub devices: Vec<String>,
    pub processes: Vec<Process>,
    /// The pod's labels as its controller sets them: what names its workload.
    pub labels: Vec<(&'static str, String)>,
}

impl Workload {
    fn labelled(self, labels: Vec<(&'static str, String)>) -> Workload {
        Workload { labels, ..self }
    }
}

/// A Deployment's pod (`<deployment>-<hash>-<suffix>`).
fn deployment(hash: &str) -> Vec<(&'static str, String)> {
    vec![("pod-template-hash", hash.into())]
}

/// A StatefulSet's pod (`<statefulset>-<ordinal>`).
fn statefulset(pod: &str) -> Vec<(&'static str, String)> {
    vec![
        ("controller-revision-hash", "7d4b9c6f58".into()),
        ("statefulset.kubernetes.io/pod-name", pod.into()),
    ]
}

/// A Job's pod.
fn job(name: &str) -> Vec<(&'static str, String)> {
    vec![
        ("batch.kubernetes.io/job-name", name.into()),
        ("job-name", name.into()),
    ]
}

fn pod(
    namespace: &'static str,
    pod: &str,
    container: &'static str,
    home: Home,
    devices: Vec<String>,
    processes: Vec<Process>,
) -> Workload {
    Workload {
        namespace,
        pod: pod.to_string(),
        container,
        home,
        devices,
        processes,
        labels: vec![],
    }
}

fn gpu(i: usize) -> String {
    GPU_UUIDS[i].to_string()
}

fn replica(i: usize, n: usize) -> String {
    format!("{}::{n}", GPU_UUIDS[i])
}

/// The workloads that stay for the whole demo.
pub fn resident() -> Vec<Workload> {
    [training(), inference(), elsewhere()].concat()
}

/// A training job on two GPUs, a notebook that holds memory and does nothing, and a pod
/// allocated a GPU that it never touches.
fn training() -> Vec<Workload> {
    let trainer = Load {
        gib: 58.0,
        grow: 0.5,
        max_gib: 71.5,
        sm: Some(96),
    };
    vec![
        // A rank per GPU, in one container.
        pod(
            "ml-training",
            "llama3-finetune-0",
            "trainer",
            Home::Pod(Driver::Systemd, QosClass::Guaranteed),
            vec![gpu(0), gpu(1)],
            vec![
                on("python3", Slot::Gpu(0), trainer),
                on("python3", Slot::Gpu(1), trainer),
            ],
        )
        .labelled(statefulset("llama3-finetune-0")),
        pod(
            "research",
            "jupyter-alice",
            "notebook",
            Home::Pod(Driver::Systemd, QosClass::BestEffort),
            vec![gpu(3)],
            vec![on("ipykernel", Slot::Gpu(3), steady(23.5, None))],
        ),
        // Its process waits for data and never opens the GPU.
        pod(
            "ml-training",
            "hparam-sweep-7",
            "worker",
            Home::Pod(Driver::Systemd, QosClass::Burstable),
            vec![gpu(4)],
            vec![Process {
                comm: "python3",
                slot: None,
                load: steady(0.0, None),
            }],
        )
        .labelled(job("hparam-sweep")),
    ]
}

/// Three vLLM replicas time-sliced on the hot GPU, whose KV caches grow; an embedder and a
/// reranker sharing a GPU through MPS, with the MPS server in the device plugin's pod.
fn inference() -> Vec<Workload> {
    let burstable = Home::Pod(Driver::Systemd, QosClass::Burstable);
    let vllm = |n: usize, suffix: &str, sm: u32| {
        let kv_cache = Load {
            gib: 9.0,
            grow: 0.375,
            max_gib: 24.0,
            sm: Some(sm),
        };
        pod(
            "inference",
            &format!("vllm-llama3-8b-6f7d9c5b4-{suffix}"),
            "vllm",
            burstable,
            vec![replica(HOT_GPU, n)],
            vec![on("vllm-engine", Slot::Gpu(HOT_GPU), kv_cache)],
        )
        .labelled(deployment("6f7d9c5b4"))
    };
    let mps = |namespace, name: &str, container, devices, process| {
        pod(
            namespace,
            name,
            container,
            burstable,
            devices,
            vec![process],
        )
    };
    vec![
        vllm(0, "x2k8p", 34),
        vllm(1, "q7wzn", 26),
        vllm(2, "m4hbt", 14),
        mps(
            "gpu-operator",
            "mps-control-daemon-8mnpz",
            "mps-control-daemon",
            vec![],
            on(
                "nvidia-cuda-mps-server",
                Slot::MpsServer(MPS_GPU),
                steady(0.3, None),
            ),
        )
        .labelled(vec![
            ("controller-revision-hash", "5b8c7d9f4".into()),
            ("pod-template-generation", "1".into()),
        ]),
        mps(
            "inference",
            "text-embedder-5c8d7f-7xq2v",
            "embedder",
            vec![replica(MPS_GPU, 0)],
            on("python3", Slot::MpsClient(MPS_GPU), steady(6.0, Some(22))),
        )
        .labelled(deployment("5c8d7f")),
        mps(
            "inference",
            "reranker-b9f4c2-lp6sd",
            "reranker",
            vec![replica(MPS_GPU, 1)],
            on(
                "tritonserver",
                Slot::MpsClient(MPS_GPU),
                steady(10.0, Some(31)),
            ),
        )
        .labelled(deployment("b9f4c2")),
    ]
}

/// Two speech pods on the MIG GPU's instances (this kubelet's cgroupfs layout), and a
/// model server on the host itself, outside Kubernetes.
fn elsewhere() -> Vec<Workload> {
    let whisper = |n: usize| {
        let load = steady(17.5 - n as f64 * 4.0, Some(40));
        pod(
            "speech",
            &format!("whisper-large-v3-{n}"),
            "asr",
            Home::Pod(Driver::Cgroupfs, QosClass::Burstable),
            vec![MIG[n].0.to_string()],
            vec![on("python3", Slot::Mig(MIG_GPU, MIG[n].1), load)],
        )
        .labelled(statefulset(&format!("whisper-large-v3-{n}")))
    };
    vec![
        whisper(0),
        whisper(1),
        Workload {
            namespace: "",
            pod: String::new(),
            container: "",
            home: Home::Service("ollama.service"),
            devices: vec![],
            processes: vec![on("ollama", Slot::Gpu(JOB_GPU), steady(9.5, Some(7)))],
            labels: vec![],
        },
    ]
}

/// The `n`th evaluation job: it loads a model (its memory climbs), works, and finishes.
pub fn eval_job(n: u32) -> Workload {
    let load = Load {
        gib: 4.0,
        grow: 2.5,
        max_gib: 36.0,
        sm: Some(81),
    };
    pod(
        "ml-training",
        &format!("llama3-eval-{n}"),
        "eval",
        Home::Pod(Driver::Systemd, QosClass::Burstable),
        vec![gpu(JOB_GPU)],
        vec![on("python3", Slot::Gpu(JOB_GPU), load)],
    )
    .labelled(job(&format!("llama3-eval-{n}")))
}

/// Every device id the kubelet can allocate (the device plugin's advertisement).
pub fn allocatable() -> Vec<String> {
    let mut ids = vec![];
    for i in 0..GPU_UUIDS.len() {
        match i {
            HOT_GPU => ids.extend((0..4).map(|n| replica(i, n))),
            MPS_GPU => ids.extend((0..2).map(|n| replica(i, n))),
            MIG_GPU => ids.extend(MIG.iter().map(|m| m.0.to_string())),
            _ => ids.push(gpu(i)),
        }
    }
    ids
}

#[cfg(test)]
mod t {
    use super::*;
    use gpu_agent::process::cgroup::parse::parse_cgroup_path;
    use tests::cgroups::kubelet_container;

    #[test]
    fn every_pod_cgroup_is_one_the_agent_attributes_and_the_service_is_the_host() {
        let uid = "0f6a2c1e-3b4d-4e5f-8a9b-1c2d3e4f5a6b";
        let id = "ab".repeat(32);
        for w in resident().into_iter().chain([eval_job(1)]) {
            match w.home {
                Home::Pod(driver, qos) => {
                    let path = kubelet_container(driver, qos, uid, &id);
                    let r = parse_cgroup_path(&path).unwrap_or_else(|| panic!("{path}"));
                    assert_eq!(r.container_id.as_deref(), Some(id.as_str()), "{path}");
                    assert_eq!(r.pod_uid.as_deref(), Some(uid), "{path}");
                }
                Home::Service(name) => {
                    assert_eq!(parse_cgroup_path(&format!("/system.slice/{name}")), None);
                }
            }
        }
    }

    #[test]
    fn the_pods_labels_name_their_workloads() {
        use gpu_agent::metadata::workload::infer;
        let owners: Vec<String> = resident()
            .into_iter()
            .chain([eval_job(3)])
            .filter(|w| matches!(w.home, Home::Pod(..)))
            .map(|w| {
                let labels = w.labels.iter().map(|(k, v)| (k.to_string(), v.clone()));
                let o = infer(&labels.collect(), &w.pod);
                format!("{} {}: {:?} {}", w.namespace, w.pod, o.kind, o.name)
            })
            .collect();
        assert_eq!(
            owners,
            [
                "ml-training llama3-finetune-0: StatefulSet llama3-finetune",
                "research jupyter-alice: Pod jupyter-alice",
                "ml-training hparam-sweep-7: Job hparam-sweep",
                "inference vllm-llama3-8b-6f7d9c5b4-x2k8p: Deployment vllm-llama3-8b",
                "inference vllm-llama3-8b-6f7d9c5b4-q7wzn: Deployment vllm-llama3-8b",
                "inference vllm-llama3-8b-6f7d9c5b4-m4hbt: Deployment vllm-llama3-8b",
                "gpu-operator mps-control-daemon-8mnpz: DaemonSet mps-control-daemon",
                "inference text-embedder-5c8d7f-7xq2v: Deployment text-embedder",
                "inference reranker-b9f4c2-lp6sd: Deployment reranker",
                "speech whisper-large-v3-0: StatefulSet whisper-large-v3",
                "speech whisper-large-v3-1: StatefulSet whisper-large-v3",
                "ml-training llama3-eval-3: Job llama3-eval-3",
            ]
        );
    }

    #[test]
    fn allocations_are_devices_the_plugin_advertises() {
        let all = allocatable();
        for w in resident().into_iter().chain([eval_job(1)]) {
            for d in &w.devices {
                assert!(all.contains(d), "{} holds {d}", w.pod);
            }
        }
    }
}
