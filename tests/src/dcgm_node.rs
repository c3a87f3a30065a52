//! An 8-GPU H100 node as dcgm-exporter's users run it: pods allocated GPUs through the
//! kubelet's pod-resources (a whole GPU each, two time-slicing replicas of one GPU, a MIG
//! device, one pod that holds a GPU and runs nothing), names from CRI, the fake NVML
//! library, and, as root, a real process in each working pod's cgroup.
use std::path::PathBuf;

use serde_json::{json, Value};

use crate::{
    cgroups::{sleeper, systemd_container, Proc, TestCgroup},
    fake_node::{FakeContainer, FakeNode, World},
    fake_nvml_lib,
    nvml::Scenario,
    random_hex, random_uid, Agent,
};

pub const GIB: u64 = 1 << 30;

/// Where NVIDIA's dcgm-exporter dashboard files and the prometheus-adapter chart's configmap
/// template are, for the one test that checks tests/tests/dcgm_artefacts.rs' transcription
/// of them: `GPU_AGENT_DCGM_ARTEFACTS`, else `shared/dcgm-exporter` beside the checkout.
/// None when absent (docs/metrics.md).
pub fn artefacts_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("GPU_AGENT_DCGM_ARTEFACTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/dcgm-exporter")
        });
    dir.is_dir().then_some(dir)
}

/// The artefacts the tests read from [`artefacts_dir`], and where each comes from.
pub const ARTEFACTS: [(&str, &str); 3] = [
    ("dcgm-exporter-dashboard.json", "NVIDIA/dcgm-exporter tag 4.5.3-4.8.2, grafana/dcgm-exporter-dashboard.json"),
    ("dcgm-exporter-dashboard-hostname.json", "NVIDIA/dcgm-exporter commit a52c9c0561c216b9deb848093f1459a0a946a3b5 (pull request 355), grafana/dcgm-exporter-dashboard.json"),
    ("prometheus-adapter-configmap.yaml", "prometheus-community/helm-charts commit cf408a290aec489277a94450bb3511432477a53a, charts/prometheus-adapter/templates/configmap.yaml"),
];

pub fn uuid(i: usize) -> String {
    format!("GPU-{i:08}-1111-2222-3333-444444444444")
}

pub const MIG_UUID: &str = "MIG-77777777-1111-2222-3333-444444444444";

/// PCI bus of GPU `i`: 0x18, 0x28, ...
pub fn bus(i: usize) -> String {
    format!("00000000:{:02X}:00.0", 0x18 + 0x10 * i)
}

/// Per GPU: utilization %, power W, memory used GiB (device), GPM on.
pub const GPUS: [(u32, u32, u64, bool); 8] = [
    (70, 600, 10, true),
    (40, 500, 20, true),
    (50, 450, 10, true),
    // Held by a pod that runs nothing: memory the driver's own context holds.
    (0, 80, 1, true),
    (10, 100, 1, true),
    (5, 90, 1, false),
    (0, 70, 0, true),
    (0, 75, 0, true),
];

/// A pod the kubelet allocated a device to.
#[derive(Clone, Debug)]
pub struct Pod {
    pub namespace: &'static str,
    pub pod: &'static str,
    pub container: &'static str,
    /// The device plugin's ids.
    pub devices: Vec<String>,
    /// Its process on the GPU: (GPU index, SM %, memory GiB), None: runs nothing.
    pub work: Option<(usize, u32, u64)>,
    pub uid: String,
    pub id: String,
}

pub fn pods() -> Vec<Pod> {
    let pod = |namespace, pod, container, devices: Vec<String>, work| Pod {
        namespace,
        pod,
        container,
        devices,
        work,
        uid: random_uid(),
        id: random_hex(64),
    };
    vec![
        pod(
            "team-a",
            "trainer-a",
            "main",
            vec![uuid(0)],
            Some((0, 70, 10)),
        ),
        pod(
            "team-b",
            "trainer-b",
            "main",
            vec![uuid(1)],
            Some((1, 40, 20)),
        ),
        pod(
            "team-a",
            "shared-1",
            "worker",
            vec![format!("{}::1", uuid(2))],
            Some((2, 20, 4)),
        ),
        pod(
            "team-b",
            "shared-2",
            "worker",
            vec![format!("{}::2", uuid(2))],
            Some((2, 30, 6)),
        ),
        pod("team-c", "idle-d", "notebook", vec![uuid(3)], None),
        pod("team-c", "mig-e", "main", vec![MIG_UUID.into()], None),
    ]
}

fn gpm(u: f64) -> Value {
    json!({"gr_engine_active": u, "sm_active": u * 0.9, "sm_occupancy": u * 0.5,
           "tensor_active": u * 0.6, "dram_active": u * 0.4, "fp64_active": 0.0,
           "fp32_active": u * 0.3, "fp16_active": u * 0.2,
           "pcie_tx_bytes": 1_048_576_000.0 * u, "pcie_rx_bytes": 524_288_000.0 * u})
}

/// The fake NVML scenario: each working pod's process on its GPU when `pids` has it.
pub fn scenario(pods: &[Pod], pids: &[Option<u32>], xids: &[(usize, u64)]) -> Value {
    let devices: Vec<Value> = GPUS
        .iter()
        .enumerate()
        .map(|(i, &(util, watts, used_gib, has_gpm))| {
            let processes: Vec<Value> = pods
                .iter()
                .zip(pids)
                .filter_map(|(p, pid)| {
                    let (gpu, sm, gib) = p.work?;
                    (gpu == i).then_some(())?;
                    Some(json!({"pid": (*pid)?, "used_memory": gib * GIB, "sm_util": sm,
                                "mem_util": sm / 2, "enc_util": 0, "dec_util": 0}))
                })
                .collect();
            let mut d = json!({
                "uuid": uuid(i), "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": bus(i),
                "memory_used": used_gib * GIB, "memory_reserved": 512u64 << 20,
                "utilization_gpu": util, "utilization_memory": util / 2, "power_mw": watts * 1000,
                "temperature_c": 40 + i, "memory_temperature_c": 50 + i,
                "sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "processes": processes,
                "nvlink_bandwidth": {"tx_kib_per_s": 100_000, "rx_kib_per_s": 50_000},
                "xid_events": xids.iter().filter(|x| x.0 == i).map(|x| json!({"xid": x.1})).collect::<Vec<_>>(),
            });
            if has_gpm {
                d["gpm"] = gpm(util as f64 / 100.0);
            }
            if i == 7 {
                d["mig_devices"] = json!([{"uuid": MIG_UUID, "name": "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
                    "gpu_instance_id": 1, "memory_total": 10u64 * GIB, "memory_used": 0,
                    "gpm": gpm(0.0)}]);
            }
            d
        })
        .collect();
    json!({"driver_version": "580.159.04", "devices": devices})
}

/// The node: scenario, CRI and pod-resources servers, and (`with_processes`, as root) a
/// process in each working pod's container cgroup.
pub struct DcgmNode {
    pub dir: PathBuf,
    pub scenario: Scenario,
    pub pods: Vec<Pod>,
    pub procs: Vec<Option<Proc>>,
    _cgroups: Vec<TestCgroup>,
    pub node: FakeNode,
}

impl DcgmNode {
    pub fn start(with_processes: bool) -> DcgmNode {
        let dir = std::env::temp_dir().join(format!("dcgm-node-{}", random_hex(8)));
        std::fs::create_dir_all(&dir).unwrap();
        let pods = pods();
        let mut cgroups = vec![];
        let mut procs = vec![];
        for p in &pods {
            if with_processes && p.work.is_some() {
                let cg = TestCgroup::v2(&systemd_container(&p.uid, &p.id));
                procs.push(Some(Proc(cg.spawn(&mut sleeper()))));
                cgroups.push(cg);
            } else {
                procs.push(None);
            }
        }
        let pids: Vec<Option<u32>> = procs.iter().map(|p| p.as_ref().map(Proc::pid)).collect();
        let scenario = Scenario::new(&scenario(&pods, &pids, &[]));
        let world = World::default();
        world.set(
            pods.iter()
                .map(|p| FakeContainer {
                    id: p.id.clone(),
                    pod_uid: p.uid.clone(),
                    namespace: p.namespace.into(),
                    pod: p.pod.into(),
                    name: p.container.into(),
                    gpus: p.devices.clone(),
                })
                .collect(),
        );
        let node = FakeNode::start(&dir, world);
        DcgmNode {
            dir,
            scenario,
            pods,
            procs,
            _cgroups: cgroups,
            node,
        }
    }

    pub fn pids(&self) -> Vec<Option<u32>> {
        self.procs
            .iter()
            .map(|p| p.as_ref().map(Proc::pid))
            .collect()
    }

    /// Rewrites the scenario with XID events (GPU index, code) added.
    pub fn xids(&self, xids: &[(usize, u64)]) {
        self.scenario
            .write(&scenario(&self.pods, &self.pids(), xids));
    }

    /// A `gpu-agent run` on this node with `args` (and `--no-ebpf` without processes).
    pub fn agent(&self, extra_config: &str, args: &[&str]) -> Agent {
        self.agent_nvml("", extra_config, args)
    }

    /// `agent`, with `nvml` added to its `[nvml]` table.
    pub fn agent_nvml(&self, nvml: &str, extra_config: &str, args: &[&str]) -> Agent {
        let lib = fake_nvml_lib();
        let cfg = format!(
            "[nvml]\ninterval_ms = 200\n{nvml}\n[metadata]\ncri_socket = \"{}\"\npod_resources_socket = \"{}\"\n\
             docker_socket = \"{}\"\nallocation_interval_secs = 1\n{extra_config}",
            self.node.cri.display(),
            self.node.pod_resources.display(),
            self.dir.join("no-docker.sock").display()
        );
        let mut all = vec!["--nvml-lib", lib.to_str().unwrap()];
        if self.procs.iter().all(Option::is_none) {
            all.push("--no-ebpf");
        }
        all.extend(args);
        Agent::start_env(&cfg, &all, &[("FAKE_NVML_SCENARIO", self.scenario.path())])
    }

    pub fn pod(&self, name: &str) -> &Pod {
        self.pods.iter().find(|p| p.pod == name).unwrap()
    }
}

impl Drop for DcgmNode {
    fn drop(&mut self) {
        self.node.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
