//! The run between the builds and the cleanup: the daemons, the image, the workloads
//! before and after the agent, the agent's container, and the attribution checks.
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::{
    agent::{agent_logs, run_agent, AgentContainer, AgentRun},
    checks,
    containerd::Containerd,
    dockerd::Dockerd,
    fleet::{start_host_process, start_workloads, write_scenario, Fleet, Runtimes, Workload},
    host::{self, WorkDir},
    manifest::AgentSpec,
    otlp,
    podman::Podman,
    proc,
    tally::Tally,
    workloads,
};
use crate::image;

/// What the run works with.
#[derive(Clone, Copy)]
pub struct Inputs<'a> {
    pub spec: &'a AgentSpec,
    pub agent_bin: &'a std::path::Path,
    /// The image's tag.
    pub tag: &'a str,
    pub nvml: &'a std::path::Path,
    /// When the attribution checks give up.
    pub deadline: Instant,
}

/// Everything with a daemon in it; daemons and containers are dropped (stopped, removed)
/// at its end, also on an early return.
pub fn session(t: &mut Tally, work: &WorkDir, inputs: &Inputs, fleet: &mut Fleet) -> Result<()> {
    let Inputs {
        spec,
        agent_bin,
        tag,
        nvml,
        deadline,
    } = *inputs;
    // Rewritten with the capabilities dockerd cannot name before the agent starts.
    let oci_dir = work.join("oci");
    let mut rt = start_runtimes(t, work, agent_bin, tag, &oci_dir)?;

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

/// Starts dockerd (with the capabilities wrapper as a runtime), builds the image there,
/// then containerd and podman with the workloads' images. Without dockerd the run stops;
/// containerd or podman failing to start is a failed case, and the runtime left out.
fn start_runtimes(
    t: &mut Tally,
    work: &WorkDir,
    agent_bin: &std::path::Path,
    tag: &str,
    oci_dir: &std::path::Path,
) -> Result<Runtimes> {
    let caps_wrapper = workloads::write_caps_wrapper(oci_dir, &[])?;
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
    Ok(Runtimes {
        podman,
        ctd,
        dockerd,
    })
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
            checks::check_host(samples, &w.expect)
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
