//! The demo node's real parts: for each workload process a sleeper, named as the workload's
//! process would be, in the kubelet's cgroup for its pod; the CRI and pod-resources servers
//! that name the pods and allocate them GPUs; and the scenario file that puts their PIDs on
//! the GPUs. A thread of its own moves the node every tick; everything it made goes when it
//! stops (or panics): processes, cgroups, sockets, the scenario.
use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{anyhow, Context, Result};
use serde_json::json;
use tests::{
    cgroups::{kubelet_container, v2_mount, Proc, TestCgroup},
    fake_node::{FakeContainer, FakeNode, World},
    nvml::Scenario,
    random_hex, random_uid,
};

use super::{
    cast::{self, Home, Workload},
    dir::Ledger,
    scenario::{scenario, Accounted, OnGpu},
    timeline::{job_step, usage, JobStep, FIRST_JOB_AGE, FIRST_TICK, TICK},
};

/// Where the agent finds the node.
pub struct Paths {
    pub scenario: PathBuf,
    pub cri: PathBuf,
    pub pod_resources: PathBuf,
}

/// A workload made real.
struct Live {
    w: Workload,
    uid: String,
    id: String,
    /// An evaluation job (it finishes, and another takes its place).
    job: bool,
    started: u64,
    finished: Option<u64>,
    /// One per `w.processes`; emptied (killed) when a job finishes, before its cgroup goes.
    procs: Vec<Proc>,
    cgroup: TestCgroup,
}

/// Fields drop in order (after the workloads, which drop goes through last to first): the
/// servers and their sockets, then the scenario file.
struct Node {
    lives: Vec<Live>,
    fake: FakeNode,
    scenario: Scenario,
    accounted: Vec<Accounted>,
    t: u64,
    jobs: u32,
    last_finish: Option<u64>,
    /// The names the sleepers run under: links to `sleep`.
    bin: PathBuf,
    ledger: Ledger,
}

impl Node {
    fn start(dir: &Path, ledger: Ledger) -> Result<Node> {
        let bin = dir.join("bin");
        link_sleepers(&bin)?;
        let world = World::default();
        world.set_runtime_name("containerd");
        world.set_allocatable(cast::allocatable());
        let fake = FakeNode::start(dir, world);
        let scenario = Scenario::at(dir.join("scenario.json"), &json!({"devices": []}));
        let mut node = Node {
            lives: vec![],
            fake,
            scenario,
            accounted: vec![],
            t: FIRST_TICK,
            jobs: 1,
            last_finish: None,
            bin,
            ledger,
        };
        for w in cast::resident() {
            node.add(w, 0, false)?;
        }
        node.add(cast::eval_job(1), FIRST_TICK - FIRST_JOB_AGE, true)?;
        node.publish();
        Ok(node)
    }

    fn paths(&self) -> Paths {
        Paths {
            scenario: self.scenario.path().into(),
            cri: self.fake.cri.clone(),
            pod_resources: self.fake.pod_resources.clone(),
        }
    }

    /// Its cgroup, the runtime's record of it (before its process runs, as a runtime
    /// does), then its processes.
    fn add(&mut self, w: Workload, started: u64, job: bool) -> Result<()> {
        let (uid, id) = (random_uid(), random_hex(64));
        let path = match w.home {
            Home::Pod(driver, qos) => kubelet_container(driver, qos, &uid, &id),
            // A service of that name that really runs here keeps its cgroup: the demo's
            // goes beside it (dropping a cgroup kills what is in it).
            Home::Service(name) => [
                format!("/system.slice/{name}"),
                format!("/system.slice/gpu-agent-demo-{name}"),
            ]
            .into_iter()
            .find(|p| !v2_mount().join(&p[1..]).exists())
            .with_context(|| format!("/system.slice/{name} and its demo twin exist already"))?,
        };
        let cgroup = TestCgroup::v2(&path);
        self.ledger.record(&cgroup)?;
        // What the kubelet gives the pod's sandbox: its workload's labels.
        let labels: Vec<(&str, &str)> = w.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.fake.world.set_pod_labels(w.namespace, &w.pod, &labels);
        self.lives.push(Live {
            w,
            uid,
            id,
            job,
            started,
            finished: None,
            procs: vec![],
            cgroup,
        });
        self.fake.world.set(self.containers());
        let live = self.lives.last_mut().expect("just pushed");
        for p in &live.w.processes {
            live.procs.push(spawn(&self.bin, p.comm, &live.cgroup));
        }
        Ok(())
    }

    /// One tick: the evaluation job moves on, then everything is published.
    fn advance(&mut self) -> Result<()> {
        self.t += 1;
        let job = self.lives.iter().position(|l| l.job);
        let (started, finished) = match job {
            Some(i) => (Some(self.lives[i].started), self.lives[i].finished),
            None => (None, self.last_finish),
        };
        match (job_step(self.t, started, finished), job) {
            (JobStep::Finish, Some(i)) => self.finish(i),
            (JobStep::Remove, Some(i)) => drop(self.lives.remove(i)),
            (JobStep::Start, _) => {
                self.jobs += 1;
                self.add(cast::eval_job(self.jobs), self.t, true)?;
            }
            _ => {}
        }
        self.publish();
        Ok(())
    }

    /// A job's process exits; NVML's accounting keeps its record.
    fn finish(&mut self, i: usize) {
        let t = self.t;
        let live = &mut self.lives[i];
        for (p, proc) in live.w.processes.iter().zip(&live.procs) {
            let Some(slot) = p.slot else { continue };
            let (max_memory, _) = usage(&p.load, t - live.started, t, 0);
            self.accounted.push(Accounted {
                pid: proc.pid(),
                gpu: slot.gpu(),
                max_memory,
                sm: p.load.sm.unwrap_or(0),
                time_ms: (t - live.started) * TICK.as_millis() as u64,
            });
        }
        live.procs.clear();
        live.finished = Some(t);
        self.last_finish = Some(t);
        let keep = self.accounted.len().saturating_sub(5);
        self.accounted.drain(..keep);
    }

    fn containers(&self) -> Vec<FakeContainer> {
        self.lives
            .iter()
            .filter(|l| matches!(l.w.home, Home::Pod(..)))
            .map(|l| FakeContainer {
                id: l.id.clone(),
                pod_uid: l.uid.clone(),
                namespace: l.w.namespace.into(),
                pod: l.w.pod.clone(),
                name: l.w.container.into(),
                gpus: l.w.devices.clone(),
            })
            .collect()
    }

    fn on_gpu(&self) -> Vec<OnGpu> {
        let mut out = vec![];
        for (li, l) in self.lives.iter().enumerate() {
            for (k, (p, proc)) in l.w.processes.iter().zip(&l.procs).enumerate() {
                let Some(slot) = p.slot else { continue };
                let salt = (li * 8 + k) as u64;
                let (memory, sm) = usage(&p.load, self.t - l.started, self.t, salt);
                out.push(OnGpu {
                    pid: proc.pid(),
                    slot,
                    memory,
                    sm,
                });
            }
        }
        out
    }

    fn publish(&self) {
        self.fake.world.set(self.containers());
        self.scenario
            .write(&scenario(self.t, &self.on_gpu(), &self.accounted));
    }
}

impl Drop for Node {
    /// The workloads in the reverse of their making: a cgroup parent that one made and a
    /// later one shares (kubepods/burstable) is empty by the time its maker removes it.
    fn drop(&mut self) {
        while let Some(live) = self.lives.pop() {
            drop(live);
        }
    }
}

/// A sleeper named `comm` (the kernel names a process after the file it runs: a link to
/// `sleep` under that name), in `cgroup` from its first instruction, in a process group of
/// its own (the terminal's Ctrl-C is the demo's to handle), and killed if the thread that
/// made it dies, even by SIGKILL.
fn spawn(bin: &Path, comm: &str, cgroup: &TestCgroup) -> Proc {
    let mut cmd = Command::new(bin.join(comm));
    // argv[0] `sleep`: a multi-call binary (busybox) picks its applet by it.
    cmd.arg0("sleep")
        .arg("infinity")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    // SAFETY: prctl is async-signal-safe and touches nothing of the parent's.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    Proc(cgroup.spawn(&mut cmd))
}

/// `bin/<comm>` -> sleep, for every process name of the cast.
fn link_sleepers(bin: &Path) -> Result<()> {
    let sleep = crate::on_path("sleep").context("no `sleep` on PATH (coreutils)")?;
    let sleep = sleep.canonicalize()?;
    std::fs::create_dir_all(bin)?;
    let everyone = cast::resident().into_iter().chain([cast::eval_job(1)]);
    for p in everyone.flat_map(|w| w.processes) {
        let link = bin.join(p.comm);
        if !link.exists() {
            std::os::unix::fs::symlink(&sleep, &link)
                .with_context(|| format!("linking {}", link.display()))?;
        }
    }
    Ok(())
}

/// The node on its own thread, moving every tick until dropped.
pub struct Moving {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Moving {
    /// Builds the node (on the thread that will own it: the sleepers die with that thread)
    /// and returns once it is up.
    pub fn start(dir: &Path, ledger: Ledger) -> Result<(Moving, Paths)> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let (dir, s) = (dir.to_path_buf(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("demo-node".into())
            .spawn(move || {
                let mut node = match Node::start(&dir, ledger) {
                    Ok(n) => n,
                    Err(e) => return drop(tx.send(Err(e))),
                };
                let _ = tx.send(Ok(node.paths()));
                let mut next = Instant::now() + TICK;
                while !s.load(Ordering::SeqCst) {
                    if Instant::now() >= next {
                        if let Err(e) = node.advance() {
                            eprintln!("xtask: the demo node: {e:#}");
                            return;
                        }
                        next += TICK;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })?;
        let moving = Moving {
            stop,
            thread: Some(thread),
        };
        match rx.recv() {
            Ok(Ok(paths)) => Ok((moving, paths)),
            Ok(Err(e)) => Err(e.context("starting the demo node")),
            Err(_) => Err(anyhow!(
                "the demo node failed to start (its panic is above)"
            )),
        }
    }

    /// The node's thread ended by itself (an error or a panic, said on stderr).
    pub fn failed(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| t.is_finished())
    }
}

impl Drop for Moving {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
