//! Baseline (c), the classic script: per cycle, an nvidia-smi-style listing of the GPU
//! processes through the same (fake) NVML library, /proc/PID/cgroup read for each, and one
//! Docker API call per container they are in (`GET /containers/{id}/json` over the unix
//! socket, what `docker inspect` does). The ids are not Docker's, so dockerd answers 404;
//! the round trip is what costs. Without a reachable dockerd that part is left out.
use std::{
    collections::BTreeSet,
    os::{fd::AsRawFd, unix::net::UnixStream},
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{Context, Result};
use gpu_agent::stats::thread_cpu_ns;
use nvml_wrapper::Nvml;

use crate::benchkit::host::cpu_ns;

/// The harness's own scenario file: FAKE_NVML_SCENARIO of this process, set once at the
/// start of the run (before any thread exists), rewritten for each node.
pub(crate) fn scenario_path() -> PathBuf {
    PathBuf::from(std::env::var_os("FAKE_NVML_SCENARIO").unwrap_or_default())
}

/// Per cycle, in the harness.
#[derive(Default, Clone)]
pub(crate) struct Cost {
    /// Harness thread CPU: NVML listing (the library's work included), /proc reads, and the
    /// client side of the Docker calls.
    pub cpu_ns: f64,
    /// Wall time of the whole cycle (dockerd's work shows here).
    pub wall_ns: f64,
    /// dockerd's own CPU (its schedstat), when its pid is known.
    pub dockerd_cpu_ns: Option<f64>,
    /// Docker API calls per cycle; None: no dockerd, that part left out.
    pub docker_calls: Option<usize>,
    pub gpu_procs_listed: usize,
    /// Distinct containers the listed processes are in.
    pub containers: usize,
}

/// The Docker socket: DOCKER_HOST when it names a unix socket, else /var/run/docker.sock;
/// None unless dockerd answers `GET /_ping`.
pub(crate) fn docker_socket() -> Option<PathBuf> {
    let path = std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/var/run/docker.sock"));
    (get(&path, "/_ping").ok()? == 200).then_some(path)
}

/// One HTTP/1.1 GET on a fresh connection (as curl or a script's client does); the status.
fn get(sock: &Path, path: &str) -> Result<u16> {
    Ok(tests::http::get_unix(sock, path)?.0)
}

/// dockerd's pid: the peer of a connection to its socket (SO_PEERCRED).
fn dockerd_pid(sock: &Path) -> Option<u32> {
    let s = UnixStream::connect(sock).ok()?;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a connected socket and a buffer of the size given.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0 && cred.pid > 0).then_some(cred.pid as u32)
}

/// The GPU processes' pids, nvidia-smi's way: every device's compute and graphics lists
/// (a MIG-enabled GPU lists its MIG devices' processes too).
fn list_gpu_pids(nvml: &Nvml) -> Result<Vec<u32>> {
    let mut pids = vec![];
    for i in 0..nvml.device_count()? {
        let d = nvml.device_by_index(i)?;
        let _uuid = d.uuid()?;
        for p in d
            .running_compute_processes()?
            .into_iter()
            .chain(d.running_graphics_processes()?)
        {
            pids.push(p.pid);
        }
    }
    Ok(pids)
}

/// One cycle; returns (processes listed, containers they are in, Docker calls made).
fn cycle(nvml: &Nvml, docker: Option<&Path>) -> Result<(usize, usize, usize)> {
    let pids = list_gpu_pids(nvml)?;
    let mut containers = BTreeSet::new();
    for pid in &pids {
        let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            continue;
        };
        if let Some(id) = s
            .lines()
            .filter_map(|l| l.splitn(3, ':').nth(2))
            .filter_map(gpu_agent::process::cgroup::parse_cgroup_path)
            .find_map(|c| c.container_id)
        {
            containers.insert(id);
        }
    }
    let mut calls = 0;
    if let Some(sock) = docker {
        for id in &containers {
            // 404: not Docker's container; any answer is a round trip.
            get(sock, &format!("/containers/{id}/json"))?;
            calls += 1;
        }
    }
    Ok((pids.len(), containers.len(), calls))
}

/// `cycles` cycles on the scenario at `scenario_path()` (already written by the caller).
pub(crate) fn measure(lib: &Path, cycles: u32) -> Result<Cost> {
    let nvml = Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .context("loading the fake NVML library in the harness")?;
    let docker = docker_socket();
    // Untimed: the library parses the scenario on its first calls.
    cycle(&nvml, docker.as_deref())?;
    let dockerd = docker.as_deref().and_then(dockerd_pid);
    let d0 = dockerd.and_then(|p| cpu_ns(p).ok());
    let (c0, w0) = (thread_cpu_ns(), Instant::now());
    let mut last = (0, 0, 0);
    for _ in 0..cycles {
        last = cycle(&nvml, docker.as_deref())?;
    }
    let (cpu, wall) = (thread_cpu_ns() - c0, w0.elapsed());
    let d1 = dockerd.and_then(|p| cpu_ns(p).ok());
    let per = |ns: f64| ns / cycles as f64;
    Ok(Cost {
        cpu_ns: per(cpu as f64),
        wall_ns: per(wall.as_nanos() as f64),
        dockerd_cpu_ns: d0.zip(d1).map(|(a, b)| per((b - a) as f64)),
        docker_calls: docker.map(|_| last.2),
        gpu_procs_listed: last.0,
        containers: last.1,
    })
}
