//! The churning node of the soak: pods that are real processes in kubelet-shaped cgroups,
//! named by the test CRI server with Deployment labels whose ReplicaSet hash rolls over,
//! allocated a device by the test pod-resources server, and on the fake 8-GPU library,
//! whose devices change from whole GPUs to time-slicing replicas to MIG devices made anew.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicUsize, Ordering::Relaxed},
        mpsc, Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde_json::{json, Value};
use tests::{
    cgroups::{systemd_container, TestCgroup},
    fake_node::{FakeContainer, World},
    random_hex, random_uid,
};

use crate::workspace_root;

/// What the GPUs are during a phase.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Phase {
    /// Eight whole GPUs, one allocated to each pod.
    Gpus,
    /// Each GPU shared as this many time-slicing replicas (`<uuid>::N`).
    Replicas(u32),
    /// Seven MIG devices a GPU, made anew (new uuids) each time the phase begins.
    Mig,
}

/// A pod: one container, one process, one allocated device.
struct Pod {
    /// Killed and reaped (by the reaper) before the cgroup goes.
    process: Child,
    _cgroup: TestCgroup,
    container: FakeContainer,
    /// Where its process shows in the scenario: (GPU index, MIG index).
    on: (usize, Option<usize>),
    dies_at: Instant,
}

/// The node: the pods alive, the world the test servers describe, the scenario file.
pub(super) struct ChurnNode {
    world: World,
    scenario: PathBuf,
    base_gpus: Value,
    base_mig: Value,
    /// This phase's scenario (MIG uuids made anew each time it is MIG).
    devices: Value,
    phase: Phase,
    pods: Vec<Pod>,
    /// Deployments (name, current pod-template-hash); one rolls over each `roll`.
    deployments: Vec<(String, String)>,
    next_roll: usize,
    lifetime: Duration,
    sleeper: PathBuf,
    /// Made first and kept, so that no pod's cgroup makes (and later waits to remove) the
    /// shared parents.
    _parent: TestCgroup,
    /// Threads that reap the pods killed and remove their cgroups (each removal waits for
    /// the kernel, tens of milliseconds under load): the churn does not wait for them.
    reaper: Option<mpsc::Sender<Pod>>,
    reapers: Vec<std::thread::JoinHandle<()>>,
    /// Pods killed and not yet reaped and removed.
    backlog: Arc<AtomicUsize>,
    pub started: u64,
    pub retired: u64,
    n: u64,
}

const DEPLOYMENTS: usize = 24;
/// Enough for 100 pods a second on two cores.
const REAPERS: usize = 8;
const NAMESPACES: [&str; 4] = ["ml-train", "ml-serve", "batch", "ci"];

impl ChurnNode {
    pub fn new(world: World, scenario: PathBuf, lifetime: Duration) -> Result<ChurnNode> {
        let read = |f: &str| -> Result<Value> {
            Ok(serde_json::from_str(&std::fs::read_to_string(
                workspace_root().join(f),
            )?)?)
        };
        let (reaper, rx) = mpsc::channel::<Pod>();
        let backlog = Arc::new(AtomicUsize::new(0));
        let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
        let reapers = (0..REAPERS)
            .map(|_| {
                let (rx, backlog) = (rx.clone(), backlog.clone());
                std::thread::spawn(move || loop {
                    let next = rx.lock().unwrap().recv();
                    let Ok(mut p) = next else { return };
                    let _ = p.process.wait();
                    drop(p);
                    backlog.fetch_sub(1, Relaxed);
                })
            })
            .collect();
        let mut node = ChurnNode {
            world,
            scenario,
            base_gpus: read("tests/scenarios/h100-8gpu.json")?,
            base_mig: read("tests/scenarios/h100-8gpu-mig.json")?,
            devices: Value::Null,
            phase: Phase::Gpus,
            pods: vec![],
            deployments: (0..DEPLOYMENTS)
                .map(|i| (format!("trainer-{i}"), hash()))
                .collect(),
            next_roll: 0,
            lifetime,
            sleeper: crate::bignode::sleeper_binary()?,
            _parent: TestCgroup::v2("/kubepods.slice/kubepods-burstable.slice"),
            reaper: Some(reaper),
            reapers,
            backlog,
            started: 0,
            retired: 0,
            n: 0,
        };
        node.set_phase(Phase::Gpus);
        node.publish()?;
        Ok(node)
    }

    /// The GPUs become `phase`'s devices; MIG devices get new uuids.
    pub fn set_phase(&mut self, phase: Phase) {
        self.phase = phase;
        self.devices = match phase {
            Phase::Mig => {
                let mut v = self.base_mig.clone();
                for d in v["devices"].as_array_mut().unwrap() {
                    for m in d["mig_devices"].as_array_mut().unwrap() {
                        m["uuid"] = json!(format!("MIG-{}", random_uid()));
                    }
                }
                v
            }
            _ => self.base_gpus.clone(),
        };
        let uuids = self.gpu_uuids();
        self.world.set_allocatable(match phase {
            Phase::Replicas(n) => uuids
                .iter()
                .flat_map(|u| (0..n).map(move |k| format!("{u}::{k}")))
                .collect(),
            _ => uuids,
        });
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    fn gpu_uuids(&self) -> Vec<String> {
        self.devices["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["uuid"].as_str().unwrap().to_string())
            .collect()
    }

    /// The next deployment's ReplicaSet hash rolls over (a rollout).
    pub fn roll(&mut self) {
        let i = self.next_roll % self.deployments.len();
        self.deployments[i].1 = hash();
        self.next_roll += 1;
    }

    /// Starts one pod: its cgroups, its process, its names and its allocation.
    pub fn start_pod(&mut self) -> Result<()> {
        let n = self.n;
        self.n += 1;
        let (deploy, h) = self.deployments[n as usize % self.deployments.len()].clone();
        let (uid, id) = (random_uid(), random_hex(64));
        let cg = TestCgroup::v2(&systemd_container(&uid, &id));
        let mut cmd = Command::new(&self.sleeper);
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        let process = cg.spawn(&mut cmd);
        let gpu = (n % 8) as usize;
        let (device, on) = match self.phase {
            Phase::Gpus => (self.gpu_uuids()[gpu].clone(), (gpu, None)),
            Phase::Replicas(r) => (
                format!("{}::{}", self.gpu_uuids()[gpu], n % r as u64),
                (gpu, None),
            ),
            Phase::Mig => {
                let m = (n / 8 % 7) as usize;
                let uuid = self.devices["devices"][gpu]["mig_devices"][m]["uuid"].clone();
                (uuid.as_str().unwrap().to_string(), (gpu, Some(m)))
            }
        };
        let namespace = NAMESPACES[n as usize % NAMESPACES.len()].to_string();
        let pod = format!("{deploy}-{h}-{}", &random_hex(5));
        self.world.set_pod_labels(
            &namespace,
            &pod,
            &[("app", &deploy), ("pod-template-hash", &h)],
        );
        self.pods.push(Pod {
            process,
            _cgroup: cg,
            container: FakeContainer {
                id,
                pod_uid: uid,
                namespace,
                pod,
                name: "main".into(),
                gpus: vec![device],
            },
            on,
            dies_at: Instant::now() + self.lifetime,
        });
        self.started += 1;
        Ok(())
    }

    /// Pods past their lifetime go: out of the servers' world, their process killed and
    /// their cgroups removed (by the reaper).
    pub fn retire_due(&mut self) {
        let now = Instant::now();
        let (gone, live): (Vec<Pod>, Vec<Pod>) =
            self.pods.drain(..).partition(|p| p.dies_at <= now);
        self.pods = live;
        for mut p in gone {
            // Killed here, on time; reaped and removed by the reapers.
            let _ = p.process.kill();
            let c = &p.container;
            self.world.remove_pod_labels(&c.namespace, &c.pod);
            self.retired += 1;
            if let Some(r) = &self.reaper {
                self.backlog.fetch_add(1, Relaxed);
                let _ = r.send(p);
            }
        }
    }

    /// The world and the scenario as the pods now are: the runtime and the kubelet list
    /// them, and NVML shows each process on its device.
    pub fn publish(&mut self) -> Result<()> {
        self.world
            .set(self.pods.iter().map(|p| p.container.clone()).collect());
        let mut v = self.devices.clone();
        let devices = v["devices"].as_array_mut().context("devices")?;
        for d in devices.iter_mut() {
            d["processes"] = json!([]);
            if let Some(ms) = d.get_mut("mig_devices").and_then(Value::as_array_mut) {
                ms.iter_mut().for_each(|m| m["processes"] = json!([]));
            }
        }
        let mig = self.phase == Phase::Mig;
        for (i, p) in self.pods.iter().enumerate() {
            let (gpu, m) = p.on;
            let list = match (m, mig) {
                (Some(m), true) => &mut devices[gpu]["mig_devices"][m]["processes"],
                (None, false) => &mut devices[gpu]["processes"],
                // A pod of another phase whose device is gone: its process runs on no GPU.
                _ => continue,
            };
            list.as_array_mut().unwrap().push(json!({
                "pid": p.process.id(), "used_memory": 1u64 << 28,
                "sm_util": i % 90, "mem_util": 3, "enc_util": 0, "dec_util": 0,
            }));
        }
        write_atomic(&self.scenario, &v)
    }

    pub fn live(&self) -> usize {
        self.pods.len()
    }

    /// Pods killed whose process and cgroups are not gone yet.
    pub fn backlog(&self) -> usize {
        self.backlog.load(Relaxed)
    }
}

impl Drop for ChurnNode {
    fn drop(&mut self) {
        for mut p in self.pods.drain(..) {
            let _ = p.process.kill();
            if let Some(r) = &self.reaper {
                let _ = r.send(p);
            }
        }
        self.reaper.take();
        for t in self.reapers.drain(..) {
            let _ = t.join();
        }
        self.world.set(vec![]);
    }
}

/// A ReplicaSet hash as the Deployment controller writes them (10 characters).
fn hash() -> String {
    random_hex(10)
}

fn write_atomic(path: &Path, v: &Value) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, v.to_string())?;
    std::fs::rename(tmp, path)?;
    Ok(())
}
