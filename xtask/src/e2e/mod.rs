//! `cargo xtask e2e-container`: the agent's image, run for real with the DaemonSet's
//! privileges, attributing real containers of three runtimes.
//!
//! 1. Starts Debian's dockerd (its own data root and socket) and builds the image there
//!    (`cargo xtask image`'s build); makes a busybox image for the workloads.
//! 2. Starts containerd 1.6 with its CRI plugin and prepares root podman (runc, cgroupfs).
//! 3. Starts workloads before the agent: docker containers, CRI pods driven the way the
//!    kubelet drives them, podman containers; and one host process.
//! 4. Runs the agent's image with the flags derived from the rendered DaemonSet
//!    (`manifest.rs`): capabilities, user, read-only root, `--pid=host`, the same host
//!    mounts read-only, no `--privileged`; plus the fake NVML library and a scenario that
//!    names the workloads' host PIDs. Checks the container got exactly those privileges.
//! 5. Starts more workloads after the agent, and checks that `/metrics` and OTLP attribute
//!    each one to its container id, with Docker's names and the pod names, namespaces and
//!    UIDs from CRI.
//! 6. Stops the agent (SIGTERM), removes every container, pod, image, daemon, cgroup,
//!    mount and directory it made, and checks nothing is left.
//!
//! Prints one `RESULT e2e-container passed=N failed=M` line; exits non-zero on any failure.
pub mod checks;
pub mod containerd;
pub mod dockerd;
pub mod host;
pub mod manifest;
pub mod otlp;
pub mod plain;
pub mod podman;
pub mod proc;
pub mod workloads;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use self::{
    checks::Expect,
    containerd::Containerd,
    dockerd::Dockerd,
    host::{HostLeftovers, WorkDir},
    manifest::{AgentSpec, MountSource, Placement},
    podman::Podman,
    workloads::{GpuProcess, BUSYBOX},
};
use crate::{
    benchkit::host::release_agent, cargo, ebpf, image, is_root, tools::Tools, workspace_root,
};

/// The whole run's bound: CI allows about 10 minutes.
const BUDGET: Duration = Duration::from_secs(540);

/// Pass/fail of each check, grouped by runtime, printed as it happens.
#[derive(Default)]
struct Tally {
    cases: Vec<(String, String, Result<(), String>)>,
}

impl Tally {
    fn case(&mut self, group: &str, name: &str, r: Result<(), String>) {
        match &r {
            Ok(()) => eprintln!("e2e: {} ok    {group}: {name}", proc::stamp()),
            Err(e) => eprintln!("e2e: {} FAIL  {group}: {name}: {e}", proc::stamp()),
        }
        self.cases.push((group.into(), name.into(), r));
    }

    /// Runs a setup step; a failure is a failed case of its group.
    fn step<T>(&mut self, group: &str, name: &str, f: impl FnOnce() -> Result<T>) -> Option<T> {
        match proc::check_interrupt().and_then(|_| f()) {
            Ok(v) => {
                self.case(group, name, Ok(()));
                Some(v)
            }
            Err(e) => {
                self.case(group, name, Err(format!("{e:#}")));
                None
            }
        }
    }

    fn failed(&self) -> usize {
        self.cases.iter().filter(|c| c.2.is_err()).count()
    }

    /// `elapsed`: the whole run; `session`: from dockerd's start to the end of cleanup.
    fn report(&self, elapsed: Duration, session: Duration) {
        let mut groups: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for (g, _, r) in &self.cases {
            let e = groups.entry(g).or_default();
            if r.is_ok() {
                e.0 += 1
            } else {
                e.1 += 1
            }
        }
        for (g, (p, f)) in &groups {
            let verdict = if *f == 0 { "passed" } else { "FAILED" };
            eprintln!("e2e: {g:<12} {verdict} ({p} ok, {f} failed)");
        }
        eprintln!(
            "e2e: took {:.0} s, {:.0} s of them after the builds",
            elapsed.as_secs_f64(),
            session.as_secs_f64()
        );
        println!(
            "RESULT e2e-container passed={} failed={}",
            self.cases.len() - self.failed(),
            self.failed()
        );
    }
}

/// One workload: a container (or the host process) with a GPU process in the scenario.
struct Workload {
    group: &'static str,
    what: String,
    pid: u32,
    expect: Expect,
}

/// The cgroup directories the run's containers made, so that their removal can be checked.
type Cgroups = Vec<PathBuf>;

/// `release`: the image gets the release agent (what `cargo xtask image` ships), which on
/// a fresh CI target costs a release build of every dependency (6-10 minutes on 2 cores);
/// otherwise the debug agent that `cargo xtask test` has just built and tested, in the same
/// Dockerfile stage. The eBPF object is the same release object in both. `from_helm`: the
/// container (securityContext, mounts, probes, ...) is the Helm chart's default render
/// rather than the kustomize base's.
pub fn run(release: bool, from_helm: bool) -> Result<()> {
    if !is_root() {
        bail!(
            "cargo xtask e2e-container starts dockerd, containerd and podman and loads eBPF \
             programs: run it as root"
        );
    }
    proc::catch_signals();
    let started = Instant::now();
    image::ensure_packages(&[
        ("dockerd", "docker.io"),
        ("containerd", "containerd"),
        ("podman", "podman"),
        ("runc", "runc"),
        ("conmon", "conmon"),
        ("busybox", "busybox-static"),
        ("debootstrap", "debootstrap"),
    ])?;
    // kubectl (or kustomize) renders the manifest: the venv's when the host has none.
    Tools::ensure().apply_to_self();
    let agent = if release {
        let a = release_agent()?;
        cargo(&["build", "-p", "fake-nvml"])?;
        a
    } else {
        ebpf::build()?;
        // Exactly `cargo xtask test`'s build: built apart, the two packages unify their
        // dependencies' features differently and the agent would be compiled again.
        cargo(&["build", "-p", "agent", "-p", "fake-nvml"])?;
        workspace_root().join("target/debug/gpu-agent")
    };
    eprintln!("e2e: the image's agent: {}", agent.display());
    let nvml = workspace_root().join("target/debug/libnvidia_ml.so");
    let spec = manifest::agent_spec(from_helm)?;
    proc::check_interrupt()?;

    let mut tally = Tally::default();
    let session_started = Instant::now();
    let leftovers = HostLeftovers::snapshot();
    let mut work = WorkDir::create()?;
    let deadline = Instant::now() + BUDGET;
    let mut fleet = Fleet::default();
    let tag = match release {
        true => image::default_tag(),
        false => format!("{}-debug", image::default_tag()),
    };
    let inputs = Inputs {
        spec: &spec,
        agent_bin: &agent,
        tag: &tag,
        nvml: &nvml,
        deadline,
    };
    let tracefs = HostTracefs::ensure()?;
    let r = session(&mut tally, &work, &inputs, &mut fleet);
    if let Err(e) = &r {
        tally.case("harness", "ran to the end", Err(format!("{e:#}")));
    }
    let work_path = work.path.clone();
    work.remove();
    leftovers.remove();
    tracefs.restore();
    tally.case(
        "cleanup",
        "no container, cgroup, mount, process or directory left",
        nothing_left(&work_path, &fleet.cgroups),
    );
    tally.report(started.elapsed(), session_started.elapsed());
    if tally.failed() > 0 {
        bail!("e2e-container: {} failed", tally.failed());
    }
    Ok(())
}

/// The runtimes of the run. Dropped in field order: podman's containers, containerd's
/// pods (and their cgroups), then dockerd with the agent and the docker containers.
/// tracefs on the host's /sys/kernel/tracing, as systemd mounts it at boot on a node: the
/// DaemonSet mounts that path read-only and no longer carries CAP_SYS_ADMIN to mount it
/// itself (components/tracefs-mount does). Mounted here only when missing, and unmounted
/// after.
struct HostTracefs {
    mounted_here: bool,
}

const TRACEFS: &str = "/sys/kernel/tracing";

impl HostTracefs {
    fn ensure() -> Result<HostTracefs> {
        let mounted = std::fs::read_to_string("/proc/self/mountinfo")?
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(TRACEFS) && l.contains(" - tracefs "));
        if mounted {
            return Ok(HostTracefs {
                mounted_here: false,
            });
        }
        let ok = std::process::Command::new("mount")
            .args(["-t", "tracefs", "tracefs", TRACEFS])
            .status()?
            .success();
        anyhow::ensure!(ok, "mount -t tracefs tracefs {TRACEFS} failed");
        eprintln!("e2e: mounted tracefs on {TRACEFS} (as systemd does on a node); unmounted after");
        Ok(HostTracefs { mounted_here: true })
    }

    fn restore(self) {
        if self.mounted_here {
            let _ = std::process::Command::new("umount").arg(TRACEFS).status();
        }
    }
}

struct Runtimes {
    podman: Option<Podman>,
    ctd: Option<Containerd>,
    dockerd: Dockerd,
}

/// The workloads started so far, and the cgroups they live in (checked gone at the end).
#[derive(Default)]
struct Fleet {
    wl: Vec<Workload>,
    cgroups: Cgroups,
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
struct HostProcess(Child);

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the run works with.
#[derive(Clone, Copy)]
struct Inputs<'a> {
    spec: &'a AgentSpec,
    agent_bin: &'a std::path::Path,
    /// The image's tag.
    tag: &'a str,
    nvml: &'a std::path::Path,
    /// When the attribution checks give up.
    deadline: Instant,
}

/// Everything with a daemon in it; daemons and containers are dropped (stopped, removed)
/// at its end, also on an early return.
fn session(t: &mut Tally, work: &WorkDir, inputs: &Inputs, fleet: &mut Fleet) -> Result<()> {
    let Inputs {
        spec,
        agent_bin,
        tag,
        nvml,
        deadline,
    } = *inputs;
    // Rewritten with the capabilities dockerd cannot name before the agent starts.
    let oci_dir = work.join("oci");
    let caps_wrapper = workloads::write_caps_wrapper(&oci_dir, &[])?;
    let runtimes = [(workloads::CAPS_RUNTIME.to_string(), caps_wrapper)];
    let Some(dockerd) = t.step("docker", "start dockerd", || {
        Dockerd::start(&work.join("docker"), &runtimes)
    }) else {
        bail!("no dockerd, no agent container");
    };
    let img_opts = image::Options {
        tag: tag.into(),
        refresh_base: false,
        base: None,
    };
    t.step(
        "image",
        "docker build deploy/Dockerfile (prebuilt) on a bookworm base",
        || image::build(&dockerd, agent_bin, &img_opts),
    )
    .context("the image did not build")?;
    let archive = workloads::busybox_images(&dockerd, &work.path)?;
    let ctd = t.step(
        "containerd",
        "start containerd with CRI, import images",
        || {
            let c = Containerd::start(
                &work.join("containerd"),
                &work.join("run-containerd"),
                workloads::PAUSE,
            )?;
            c.import(&archive)?;
            Ok(c)
        },
    );
    let podman = t.step(
        "podman",
        "root podman (runc, cgroupfs): load images",
        || {
            let p = Podman::new(&work.join("podman"))?;
            eprintln!("e2e: podman {}", p.version()?);
            p.load(&archive)?;
            Ok(p)
        },
    );
    let mut rt = Runtimes {
        podman,
        ctd,
        dockerd,
    };

    start_workloads(t, "before", &mut rt, fleet);
    let _host = start_host_process(fleet)?;
    let scenario_dir = work.join("scenario");
    std::fs::create_dir_all(&scenario_dir)?;
    let scenario = scenario_dir.join("scenario.json");
    write_scenario(&scenario, &fleet.wl)?;

    let receiver = otlp::Receiver::start()?;
    let agent = run_agent(
        t,
        &AgentRun {
            dockerd: &rt.dockerd,
            work,
            spec,
            tag,
            nvml,
            scenario_dir: &scenario_dir,
            receiver: &receiver,
            oci_dir: &oci_dir,
        },
    )?;
    fleet
        .cgroups
        .extend(host::in_every_hierarchy(&format!("/docker/{}", agent.id)));

    start_workloads(t, "after", &mut rt, fleet);
    write_scenario(&scenario, &fleet.wl)?;
    check_attribution(t, &agent, &receiver, &fleet.wl, deadline);

    // The agent first (SIGTERM, as the kubelet stops it); the rest when `rt` drops.
    let d = &rt.dockerd;
    let stop = d
        .run(&["stop", "--time", "30", &agent.id])
        .and_then(|_| d.run(&["inspect", "--format", "{{.State.ExitCode}}", &agent.id]));
    t.case(
        "agent",
        "stops on SIGTERM within its grace period, exit 0",
        match stop {
            Ok(code) if code == "0" => Ok(()),
            Ok(code) => Err(format!(
                "exit code {code}; log:\n{}",
                agent_logs(d, &agent.id)
            )),
            Err(e) => Err(format!("{e:#}")),
        },
    );
    Ok(())
}

/// Starts one set of workloads: two docker containers, one CRI pod, one podman container.
/// Each start is a case of its runtime.
fn start_workloads(t: &mut Tally, phase: &str, rt: &mut Runtimes, fleet: &mut Fleet) {
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
fn start_host_process(fleet: &mut Fleet) -> Result<HostProcess> {
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

fn write_scenario(path: &std::path::Path, wl: &[Workload]) -> Result<()> {
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

struct AgentContainer {
    id: String,
    addr: String,
}

/// What running the agent's container needs.
struct AgentRun<'a> {
    dockerd: &'a Dockerd,
    work: &'a WorkDir,
    spec: &'a AgentSpec,
    tag: &'a str,
    nvml: &'a std::path::Path,
    scenario_dir: &'a std::path::Path,
    receiver: &'a otlp::Receiver,
    oci_dir: &'a std::path::Path,
}

/// Runs the agent's container with the DaemonSet's flags; checks it came up with exactly
/// the DaemonSet's privileges and loaded its programs.
fn run_agent(t: &mut Tally, r: &AgentRun) -> Result<AgentContainer> {
    let port = free_port()?;
    // A capability outside this process's bounding set can be given to no container (this
    // sandbox lacks CAP_SYS_RESOURCE); one dockerd cannot name goes through the wrapper.
    let bounding = own_bounding_set();
    let (grantable, not_here): (Vec<String>, Vec<String>) = r
        .spec
        .cap_add
        .iter()
        .cloned()
        .partition(|c| bounding.contains(c));
    let unnamed = workloads::caps_unknown_to(r.dockerd, &grantable);
    workloads::write_caps_wrapper(r.oci_dir, &unnamed)?;
    let mut left_out = unnamed.clone();
    left_out.extend(not_here.iter().cloned());
    // Always the wrapper: it grants capabilities the way a CRI runtime does (see there).
    let placement = e2e_placement(r, port, &left_out, true)?;
    let mut cli = vec!["run".to_string()];
    cli.extend(r.spec.docker_run_args(&placement)?);
    eprintln!("e2e: docker {}", plain::shell_words(&cli));
    if !unnamed.is_empty() {
        eprintln!(
            "e2e: dockerd {} cannot name {}: runtime {} adds them (Docker 23+ takes \
             --cap-add for them)",
            r.dockerd.server_version().unwrap_or_default(),
            unnamed.join(", "),
            workloads::CAPS_RUNTIME
        );
    }
    if !not_here.is_empty() {
        eprintln!(
            "e2e: NOTE {} left out: not in this host's capability bounding set, so no \
             runtime can grant it here (the agent needs it only on kernels before 5.11)",
            not_here.join(", ")
        );
    }
    let cli_ref: Vec<&str> = cli.iter().map(String::as_str).collect();
    let id = t
        .step(
            "agent",
            "docker run with the DaemonSet's securityContext and mounts",
            || r.dockerd.run(&cli_ref),
        )
        .context("the agent's container did not start")?;
    let addr = format!("127.0.0.1:{port}");
    let ready = proc::wait_for("the agent's /readyz", Duration::from_secs(60), || {
        tests::http::get(&addr, "/readyz").is_ok_and(|(s, _)| s == 200)
    });
    t.case(
        "agent",
        "/readyz answers 200 (programs attached, start-up walk done)",
        ready.map_err(|e| format!("{e:#}; container log:\n{}", agent_logs(r.dockerd, &id))),
    );
    let pid: u32 = r
        .dockerd
        .run(&["inspect", "--format", "{{.State.Pid}}", &id])?
        .parse()
        .context("docker inspect pid")?;
    let what = match not_here.as_slice() {
        [] => "holds exactly the DaemonSet's privileges".to_string(),
        n => format!(
            "holds exactly the DaemonSet's privileges, less {} (not in this host's bounding set)",
            n.join(", ")
        ),
    };
    t.case("agent", &what, privileges(r.spec, pid, &not_here));
    t.case(
        "agent",
        "tracks processes with eBPF, NVML up",
        agent_mode(&addr),
    );
    eprintln!("e2e: the agent's log (docker logs):");
    for l in agent_logs(r.dockerd, &id).lines() {
        eprintln!("e2e: | {l}");
    }
    Ok(AgentContainer { id, addr })
}

/// Capability names in this process's bounding set.
fn own_bounding_set() -> Vec<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    checks::cap_names(mask)
}

/// The e2e run's placement: the harness's directories behind the hostPaths, the rendered
/// ConfigMap's files, the Docker socket (names), the fake NVML library and scenario, the
/// OTLP receiver, a port of its own.
fn e2e_placement(
    r: &AgentRun,
    port: u16,
    caps_left_out: &[String],
    use_wrapper: bool,
) -> Result<Placement> {
    let mut host_path = BTreeMap::new();
    let mut config_dir = BTreeMap::new();
    for m in &r.spec.mounts {
        match &m.source {
            MountSource::HostPath { path, kind } => {
                let src = e2e_host_path(r.work, path, kind.as_deref(), m.propagation.is_some())?;
                host_path.insert(path.clone(), src);
            }
            MountSource::ConfigMap { files } => {
                let dir = r.work.join(&format!("configmap-{}", m.volume));
                std::fs::create_dir_all(&dir)?;
                for (name, content) in files {
                    std::fs::write(dir.join(name), content)?;
                }
                config_dir.insert(m.volume.clone(), dir);
            }
        }
    }
    let mut extra_flags = vec![
        // Names on a plain Docker host come from the Docker API (README's docker run line).
        format!(
            "--mount=type=bind,source={},target=/var/run/docker.sock,readonly",
            r.dockerd.sock.display()
        ),
        // This machine has no GPU: the fake NVML library and its scenario.
        format!(
            "--mount=type=bind,source={},target=/opt/fake-nvml/libnvidia_ml.so,readonly",
            r.nvml.display()
        ),
        format!(
            "--mount=type=bind,source={},target=/etc/fake-nvml,readonly",
            r.scenario_dir.display()
        ),
    ];
    if use_wrapper {
        extra_flags.push(format!("--runtime={}", workloads::CAPS_RUNTIME));
    }
    Ok(Placement {
        node_name: std::fs::read_to_string("/proc/sys/kernel/hostname")?
            .trim()
            .to_string(),
        host_ip: "127.0.0.1".into(),
        image: r.tag.into(),
        name: format!("gpu-agent-e2e-{}", tests::random_hex(6)),
        host_path,
        skip_host_paths: vec![],
        config_dir,
        caps_elsewhere: caps_left_out.to_vec(),
        extra_flags,
        extra_env: vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), r.receiver.url()),
            ("OTEL_METRIC_EXPORT_INTERVAL".into(), "2000".into()),
            (
                "FAKE_NVML_SCENARIO".into(),
                "/etc/fake-nvml/scenario.json".into(),
            ),
        ],
        extra_args: vec![
            // Host network: a port of its own instead of the config's 0.0.0.0:9464.
            "--http-addr".into(),
            format!("127.0.0.1:{port}"),
            "--nvml-lib".into(),
            "/opt/fake-nvml/libnvidia_ml.so".into(),
        ],
        user: None,
    })
}

/// The host directory behind a manifest hostPath in the harness: containerd's state
/// directory is the harness's containerd; a `DirectoryOrCreate` path this host lacks is an
/// empty directory (what the kubelet would create) of the harness's own; a path mounted
/// with propagation is rbind-mounted into the harness's shared work directory (see
/// `WorkDir`); anything else is the host's own.
fn e2e_host_path(
    work: &WorkDir,
    path: &str,
    kind: Option<&str>,
    propagates: bool,
) -> Result<PathBuf> {
    let name = path.trim_start_matches('/').replace('/', "-");
    if path == "/run/containerd" {
        return Ok(work.join("run-containerd"));
    }
    let exists = std::path::Path::new(path).exists();
    if !exists {
        if kind == Some("DirectoryOrCreate") {
            let d = work.join(&format!("hostpath-{name}"));
            std::fs::create_dir_all(&d)?;
            return Ok(d);
        }
        bail!("hostPath {path} does not exist on this host");
    }
    if propagates {
        return work.rbind(std::path::Path::new(path), &format!("host-{name}"));
    }
    Ok(PathBuf::from(path))
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn agent_logs(dockerd: &Dockerd, id: &str) -> String {
    let mut c = dockerd.cmd(&["logs", "--tail", "40", id]);
    match c.output() {
        Ok(o) => format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => e.to_string(),
    }
}

/// The agent process's privileges as the kernel sees them, against the manifest.
fn privileges(spec: &AgentSpec, pid: u32, not_here: &[String]) -> Result<(), String> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k}:")))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    let mut wrong = vec![];
    let mut want: Vec<String> = if spec.cap_drop.iter().any(|c| c == "ALL") {
        let mut w = spec.cap_add.clone();
        w.retain(|c| !not_here.contains(c));
        w
    } else {
        return Err("the harness checks capabilities only for drop: [ALL]".into());
    };
    want.sort();
    for set in ["CapEff", "CapPrm", "CapBnd"] {
        let mask = u64::from_str_radix(&field(set), 16).unwrap_or(u64::MAX);
        let mut got = checks::cap_names(mask);
        got.sort();
        if got != want {
            wrong.push(format!("{set} {got:?} (want {want:?})"));
        }
    }
    if field("CapAmb") != "0000000000000000" {
        wrong.push(format!("CapAmb {}", field("CapAmb")));
    }
    if let Some(u) = spec.run_as_user {
        let uids: Vec<String> = field("Uid").split_whitespace().map(String::from).collect();
        if uids.iter().any(|x| x != &u.to_string()) {
            wrong.push(format!("Uid {uids:?} (want {u})"));
        }
    }
    let nnp = if spec.allow_privilege_escalation == Some(false) {
        "1"
    } else {
        "0"
    };
    if field("NoNewPrivs") != nnp {
        wrong.push(format!("NoNewPrivs {} (want {nnp})", field("NoNewPrivs")));
    }
    if spec.seccomp.as_deref() == Some("RuntimeDefault") && field("Seccomp") != "2" {
        wrong.push(format!(
            "Seccomp {} (want 2: the runtime's filter)",
            field("Seccomp")
        ));
    }
    // The host's: dockerd's, which is the harness's own.
    let ns = |p: &str| std::fs::read_link(p).ok();
    if spec.host_pid && ns(&format!("/proc/{pid}/ns/pid")) != ns("/proc/self/ns/pid") {
        wrong.push("not in the host's PID namespace".into());
    }
    wrong.extend(read_only_mounts(spec, pid));
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// The root filesystem and every readOnly volume, read-only in the agent's mount table;
/// HostToContainer volumes slaves of the host's.
fn read_only_mounts(spec: &AgentSpec, pid: u32) -> Vec<String> {
    let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    // (mount point, per-mount options, optional fields)
    let rows: Vec<(String, String, String)> = info
        .lines()
        .filter_map(|l| {
            let (pre, _) = l.split_once(" - ")?;
            let f: Vec<&str> = pre.split(' ').collect();
            Some((
                f.get(4)?.to_string(),
                f.get(5)?.to_string(),
                f[6..].join(" "),
            ))
        })
        .collect();
    let ro = |mp: &str| {
        rows.iter()
            .any(|(m, o, _)| m == mp && o.split(',').any(|x| x == "ro"))
    };
    let mut wrong = vec![];
    if spec.read_only_root && !ro("/") {
        wrong.push("root filesystem not read-only".into());
    }
    for m in &spec.mounts {
        if m.read_only && !ro(&m.mount_path) {
            wrong.push(format!("{} not read-only", m.mount_path));
        }
        if m.propagation.as_deref() == Some("HostToContainer")
            && !rows
                .iter()
                .any(|(mp, _, opt)| mp == &m.mount_path && opt.contains("master:"))
        {
            wrong.push(format!(
                "{} not a slave of the host's mount (HostToContainer)",
                m.mount_path
            ));
        }
    }
    wrong
}

/// `/debug/stats`: eBPF mode (not the /proc fallback), and NVML up once its first sample
/// is in (it says "starting" until then).
fn agent_mode(addr: &str) -> Result<(), String> {
    let mut last = String::new();
    let done = proc::wait_for("eBPF mode and NVML ok", Duration::from_secs(20), || {
        let stats = tests::http::get(addr, "/debug/stats")
            .map_err(|e| e.to_string())
            .and_then(|(_, body)| {
                serde_json::from_str::<serde_json::Value>(&body).map_err(|e| e.to_string())
            });
        match stats {
            Ok(v) if v["mode"] == "ebpf" && v["nvml"] == "ok" => true,
            Ok(v) => {
                last = format!(
                    "mode {} (degraded_reason {}), nvml {}",
                    v["mode"], v["degraded_reason"], v["nvml"]
                );
                false
            }
            Err(e) => {
                last = format!("/debug/stats: {e}");
                false
            }
        }
    });
    done.map_err(|e| format!("{last} ({e:#})"))
}

/// Waits until every workload shows on `/metrics` and in OTLP as expected (or the time is
/// up), then records one case per workload and output.
fn check_attribution(
    t: &mut Tally,
    agent: &AgentContainer,
    receiver: &otlp::Receiver,
    wl: &[Workload],
    deadline: Instant,
) {
    let scrape = || -> Result<Vec<checks::Sample>, String> {
        let (s, body) = tests::http::get(&agent.addr, "/metrics").map_err(|e| e.to_string())?;
        if s != 200 {
            return Err(format!("/metrics: HTTP {s}"));
        }
        checks::parse_prometheus(&body)
    };
    let metrics_of = |w: &Workload, samples: &[checks::Sample]| {
        if w.group == "host" {
            check_host(samples, &w.expect)
        } else {
            checks::check_metrics(samples, &w.expect)
        }
    };
    let limit = Duration::from_secs(60).min(deadline.saturating_duration_since(Instant::now()));
    let _ = proc::wait_for("every workload on /metrics and in OTLP", limit, || {
        let Ok(samples) = scrape() else { return false };
        let reqs = receiver.all();
        wl.iter().all(|w| {
            metrics_of(w, &samples).is_ok()
                && (w.group == "host" || checks::check_otlp(&reqs, &w.expect).is_ok())
        })
    });
    let samples = scrape();
    let reqs = receiver.all();
    for w in wl {
        let m = match &samples {
            Ok(s) => metrics_of(w, s),
            Err(e) => Err(e.clone()),
        };
        t.case(w.group, &format!("/metrics attributes {}", w.what), m);
        if w.group != "host" {
            t.case(
                w.group,
                &format!("OTLP attributes {}", w.what),
                checks::check_otlp(&reqs, &w.expect),
            );
        }
    }
}

/// The host process: charged to the node, `owner="host"`, no container id.
fn check_host(samples: &[checks::Sample], e: &Expect) -> Result<(), String> {
    let host: Vec<&checks::Sample> = samples
        .iter()
        .filter(|s| s.name == "container_gpu_memory_usage_bytes")
        .filter(|s| s.labels.get("owner").map(String::as_str) == Some("host"))
        .collect();
    match host.as_slice() {
        [s] if s.value == e.memory_bytes as f64
            && s.labels.get("container_id").is_none_or(|v| v.is_empty()) =>
        {
            Ok(())
        }
        [] => Err("no series with owner=\"host\"".into()),
        other => Err(format!(
            "host series {:?}, want one of {} bytes",
            other
                .iter()
                .map(|s| (&s.labels, s.value))
                .collect::<Vec<_>>(),
            e.memory_bytes
        )),
    }
}

/// After cleanup: no container cgroup, mount, process or directory of the run is left.
fn nothing_left(work: &std::path::Path, cgroups: &Cgroups) -> Result<(), String> {
    let mut left = vec![];
    if work.exists() {
        left.push(format!("{} still exists", work.display()));
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let w = work.to_string_lossy();
    if info.lines().any(|l| l.contains(&*w)) {
        left.push(format!("mounts under {w} remain"));
    }
    for p in cgroups {
        if p.exists() {
            left.push(format!("cgroup {}", p.display()));
        }
    }
    // Daemons and shims whose command line names the work directory.
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&*w) {
                left.push(format!(
                    "process {} still runs",
                    e.file_name().to_string_lossy()
                ));
            }
        }
    }
    if left.is_empty() {
        Ok(())
    } else {
        Err(left.join("; "))
    }
}
