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
//!
//! Here: the builds and the run's frame (budget, cleanup, verdict). `session.rs` drives
//! steps 1-5, `fleet.rs` starts the workloads, `agent.rs` runs and checks the agent's
//! container, `tally.rs` keeps the results and prints the report.
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

mod agent;
mod fleet;
mod session;
mod tally;

use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use self::{
    fleet::Fleet,
    host::{nothing_left, HostLeftovers, HostTracefs, WorkDir},
    session::{session, Inputs},
    tally::Tally,
};
use crate::{
    benchkit::host::release_agent, cargo, ebpf, image, is_root, tools::Tools, workspace_root,
};

/// The whole run's bound: CI allows about 10 minutes.
const BUDGET: Duration = Duration::from_secs(540);

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
