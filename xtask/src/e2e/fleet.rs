//! The run's workloads: docker containers, CRI pods and podman containers started before
//! and after the agent, one host process, and the fake NVML scenario that names them all.
use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
};

use anyhow::{Context, Result};

use super::{
    checks::Expect,
    containerd::Containerd,
    dockerd::Dockerd,
    host,
    podman::Podman,
    tally::Tally,
    workloads::{self, GpuProcess, BUSYBOX},
};

/// One workload: a container (or the host process) with a GPU process in the scenario.
pub struct Workload {
    pub group: &'static str,
    pub what: String,
    pub pid: u32,
    pub expect: Expect,
}

/// The cgroup directories the run's containers made, so that their removal can be checked.
pub type Cgroups = Vec<PathBuf>;

/// The runtimes of the run. Dropped in field order: podman's containers, containerd's
/// pods (and their cgroups), then dockerd with the agent and the docker containers.
pub struct Runtimes {
    pub podman: Option<Podman>,
    pub ctd: Option<Containerd>,
    pub dockerd: Dockerd,
}

/// The workloads started so far, and the cgroups they live in (checked gone at the end).
#[derive(Default)]
pub struct Fleet {
    pub wl: Vec<Workload>,
    pub cgroups: Cgroups,
}

impl Fleet {
    /// A distinct GPU memory figure per workload.
    fn next_memory(&self) -> u64 {
        let n = self.wl.len() as u64;
        (n + 1) * (256 << 20) + n * 4096
    }

    fn add(
        &mut self,
        group: &'static str,
        what: String,
        pid: u32,
        cgroups: Vec<PathBuf>,
        expect: Expect,
    ) {
        self.cgroups.extend(cgroups);
        self.wl.push(Workload {
            group,
            what,
            pid,
            expect,
        });
    }
}

/// A host process, killed on drop.
pub struct HostProcess(Child);

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts one set of workloads: two docker containers, one CRI pod, one podman container.
/// Each start is a case of its runtime.
pub fn start_workloads(t: &mut Tally, phase: &str, rt: &mut Runtimes, fleet: &mut Fleet) {
    let run_id = tests::random_hex(4);
    for n in ["a", "b"] {
        docker_workload(
            t,
            &format!("e2e-{phase}-{n}-{run_id}"),
            phase,
            &rt.dockerd,
            fleet,
        );
    }
    if let Some(ctd) = rt.ctd.as_mut() {
        cri_workload(t, phase, &run_id, ctd, fleet);
    }
    if let Some(podman) = rt.podman.as_mut() {
        podman_workload(t, &format!("e2e-pm-{phase}-{run_id}"), phase, podman, fleet);
    }
}

const SLEEP: [&str; 2] = ["/bin/sleep", "100000"];

fn docker_workload(t: &mut Tally, name: &str, phase: &str, dockerd: &Dockerd, fleet: &mut Fleet) {
    let started = t.step(
        "docker",
        &format!("{phase} the agent: docker run {name}"),
        || {
            let id = dockerd.run(&[
                "run",
                "--detach",
                "--network=none",
                "--name",
                name,
                BUSYBOX,
                SLEEP[0],
                SLEEP[1],
            ])?;
            let pid = dockerd.run(&["inspect", "--format", "{{.State.Pid}}", &id])?;
            Ok((id, pid.parse::<u32>()?))
        },
    );
    if let Some((id, pid)) = started {
        let expect = Expect {
            container_id: id.clone(),
            labels: vec![("container", name.into()), ("runtime", "docker".into())],
            memory_bytes: fleet.next_memory(),
        };
        let what = format!("docker container {name} ({phase} the agent)");
        let cgroups = host::in_every_hierarchy(&format!("/docker/{id}"));
        fleet.add("docker", what, pid, cgroups, expect);
    }
}

/// A pod the kubelet way: BestEffort before the agent, Guaranteed after (the two cgroupfs
/// layouts), in two namespaces.
fn cri_workload(t: &mut Tally, phase: &str, run_id: &str, ctd: &mut Containerd, fleet: &mut Fleet) {
    let (ns, pod, qos) = match phase {
        "before" => ("team-a", format!("trainer-{run_id}"), "besteffort"),
        _ => ("team-b", format!("notebook-{run_id}"), "guaranteed"),
    };
    let started = t.step(
        "containerd",
        &format!("{phase} the agent: CRI pod {ns}/{pod} ({qos})"),
        || ctd.run_pod(ns, &pod, "main", qos, BUSYBOX, &SLEEP),
    );
    if let Some(c) = started {
        let expect = Expect {
            container_id: c.id.clone(),
            labels: vec![
                ("namespace", c.namespace.clone()),
                ("pod", c.pod_name.clone()),
                ("container", c.container_name.clone()),
                ("pod_uid", c.pod_uid.clone()),
            ],
            memory_bytes: fleet.next_memory(),
        };
        let what = format!("CRI pod {ns}/{pod} ({})", c.cgroup_parent);
        let cgroup = format!("{}/{}", c.cgroup_parent, c.id);
        let mut cgroups = host::in_every_hierarchy(&cgroup);
        cgroups.extend(c.created_cgroups.iter().cloned());
        fleet.add("containerd", what, c.pid, cgroups, expect);
    }
}

fn podman_workload(t: &mut Tally, name: &str, phase: &str, podman: &mut Podman, fleet: &mut Fleet) {
    let started = t.step(
        "podman",
        &format!("{phase} the agent: podman run {name}"),
        || podman.start(name, BUSYBOX, &SLEEP),
    );
    if let Some((id, pid)) = started {
        let expect = Expect {
            container_id: id.clone(),
            labels: vec![("runtime", "podman".into())],
            memory_bytes: fleet.next_memory(),
        };
        let what = format!("podman container {name} ({phase} the agent)");
        fleet.add(
            "podman",
            what,
            pid,
            host::in_every_hierarchy(&format!("/libpod_parent/libpod-{id}")),
            expect,
        );
    }
}

/// A GPU process outside any container: charged to the node (`owner="host"`).
pub fn start_host_process(fleet: &mut Fleet) -> Result<HostProcess> {
    let child = Command::new(SLEEP[0])
        .arg(SLEEP[1])
        .stdin(Stdio::null())
        .spawn()
        .context("starting a host process")?;
    let expect = Expect {
        container_id: String::new(),
        labels: vec![("owner", "host".into())],
        memory_bytes: fleet.next_memory(),
    };
    fleet.add(
        "host",
        format!("host process {}", child.id()),
        child.id(),
        vec![],
        expect,
    );
    Ok(HostProcess(child))
}

pub fn write_scenario(path: &std::path::Path, wl: &[Workload]) -> Result<()> {
    let procs: Vec<GpuProcess> = wl
        .iter()
        .enumerate()
        .map(|(i, w)| GpuProcess {
            pid: w.pid,
            memory: w.expect.memory_bytes,
            sm_util: 5 + 7 * i as u32,
        })
        .collect();
    workloads::write_scenario(path, &procs)
}
