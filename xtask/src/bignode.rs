//! The largest node `cargo xtask bench` builds: 50,000 real processes in 1,000 pods of
//! kubelet's systemd shape, each pod a slice with nine container scopes (10,000 cgroups),
//! five of them with ten processes (started by sleeper.c, pausing). Everything it makes is removed on drop,
//! also when the benchmark fails half-way.
use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use tests::{
    cgroups::{proc_cgroup, systemd_container, v2_mount, TestCgroup},
    fake_node::{FakeContainer, FakeNode, World},
    random_hex, random_uid,
};

use crate::{
    benchkit::{
        agent::{
            other_protocol, start_agent, start_agent_env, start_agent_with, window, write_scenario,
            Layout, Mark,
        },
        figures::{finish, BigFigures, Deployed, Memory, OtherProtocol, Row},
        host::{hwm_kib, rss_kib, settle},
    },
    classic, workspace_root,
};

pub(crate) const PODS: usize = 1000;
/// Container scopes per pod: with the pod's slice, ten cgroups per pod.
const CONTAINERS: usize = 9;
/// Containers that run processes; the others are empty (exited sidecars, init containers).
const BUSY: usize = 5;
/// Processes per busy container.
const PER_CONTAINER: usize = 10;
pub(crate) const PROCESSES: usize = PODS * BUSY * PER_CONTAINER;
pub(crate) const CGROUPS: usize = PODS * (1 + CONTAINERS);

/// kernel.pid_max raised for the run, put back on drop (also on error or panic).
pub(crate) struct PidMax {
    old: Option<String>,
}

const PID_MAX: &str = "/proc/sys/kernel/pid_max";

impl PidMax {
    /// Raises pid_max to at least `want`; a higher value is left alone.
    pub fn raise(want: u64) -> Result<PidMax> {
        let old = std::fs::read_to_string(PID_MAX).context("reading kernel.pid_max")?;
        let cur: u64 = old.trim().parse().context("kernel.pid_max")?;
        if cur >= want {
            return Ok(PidMax { old: None });
        }
        std::fs::write(PID_MAX, want.to_string()).context("raising kernel.pid_max")?;
        eprintln!("kernel.pid_max {cur} -> {want} for the benchmark");
        Ok(PidMax { old: Some(old) })
    }
}

impl Drop for PidMax {
    fn drop(&mut self) {
        if let Some(old) = self.old.take() {
            match std::fs::write(PID_MAX, old.trim()) {
                Ok(()) => eprintln!("kernel.pid_max restored to {}", old.trim()),
                Err(e) => eprintln!("could not restore kernel.pid_max to {}: {e}", old.trim()),
            }
        }
    }
}

/// MemAvailable in KiB.
pub(crate) fn mem_available_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// A sleeper (exec'd, static) costs about 120 KiB of the machine's memory (measured: 5.8
/// GiB for the 50k node), a `sleep` up to 200 KiB. Refuse a node that could push the
/// machine into the OOM killer, and stop filling one when memory runs low.
const KIB_PER_PROCESS: u64 = 160;
const RESERVE_KIB: u64 = 3 << 20;

pub(crate) fn check_memory(processes: usize) -> Result<()> {
    let need = processes as u64 * KIB_PER_PROCESS + RESERVE_KIB;
    let have = mem_available_kib();
    if have < need {
        bail!(
            "{processes} processes need about {} MiB free, {} MiB available: not starting them",
            need >> 10,
            have >> 10
        );
    }
    Ok(())
}

fn check_low_memory() -> Result<()> {
    let have = mem_available_kib();
    if have < RESERVE_KIB / 2 {
        bail!("memory ran low ({} MiB available): stopping", have >> 10);
    }
    Ok(())
}

/// Builds target/bench-tools/sleeper from sleeper.c (the project needs a C compiler
/// already), again when the source changed.
pub(crate) fn sleeper_binary() -> Result<PathBuf> {
    const SRC: &str = include_str!("sleeper.c");
    let dir = workspace_root().join("target/bench-tools");
    let (src, bin) = (dir.join("sleeper.c"), dir.join("sleeper"));
    if bin.exists() && std::fs::read_to_string(&src).ok().as_deref() == Some(SRC) {
        return Ok(bin);
    }
    std::fs::create_dir_all(&dir)?;
    std::fs::write(&src, SRC)?;
    // Static when libc.a is there: fewer mappings, so smaller page tables per process.
    for flags in [&["-O2", "-static"][..], &["-O2"][..]] {
        let ok = Command::new("cc")
            .args(flags)
            .arg("-o")
            .arg(&bin)
            .arg(&src)
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(bin);
        }
    }
    bail!("cannot build {} with cc", src.display())
}

/// The sleeper that started a node's processes; killed and reaped on drop (its children
/// go with their cgroups).
pub(crate) struct Sleepers(Child);

impl Sleepers {
    /// Forks `per` pausing processes into each of `cgroups`.
    pub fn spawn(cgroups: &[&TestCgroup], per: usize) -> Result<Sleepers> {
        let own = proc_cgroup(std::process::id(), "0").context("no cgroup2 path of our own")?;
        let home = v2_mount()
            .join(own.trim_start_matches('/'))
            .join("cgroup.procs");
        let mut child = Command::new(sleeper_binary()?)
            .arg(&home)
            .arg(per.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .context("starting the sleeper")?;
        let mut list = String::new();
        for c in cgroups {
            list.push_str(&format!("{}\n", c.dir.join("cgroup.procs").display()));
        }
        let mut stdin = child.stdin.take().unwrap();
        let s = Sleepers(child);
        stdin.write_all(list.as_bytes())?;
        Ok(s)
    }

    /// Fails when the sleeper gave up (it says why on stderr).
    pub fn check(&mut self) -> Result<()> {
        match self.0.try_wait()? {
            Some(status) => bail!("the sleeper exited: {status}"),
            None => Ok(()),
        }
    }
}

impl Drop for Sleepers {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct BigPod {
    /// Dropped first (fields drop in order): the slice can only go once they are gone.
    containers: Vec<TestCgroup>,
    slice: TestCgroup,
}

pub(crate) struct BigNode {
    pods: Vec<BigPod>,
    sleepers: Option<Sleepers>,
    /// GPU_AGENT_BENCH_NAMED=1: the runtime and the kubelet that describe the node.
    named: Option<(FakeNode, PathBuf)>,
    /// MemAvailable fell by this much while the processes started (KiB).
    pub mem_used_kib: u64,
    pub started_in: Duration,
}

impl BigNode {
    pub fn build() -> Result<BigNode> {
        check_memory(PROCESSES)?;
        let mem0 = mem_available_kib();
        let t0 = Instant::now();
        let mut node = BigNode {
            pods: Vec::with_capacity(PODS),
            sleepers: None,
            named: None,
            mem_used_kib: 0,
            started_in: Duration::ZERO,
        };
        for _ in 0..PODS {
            let uid = random_uid();
            let first = systemd_container(&uid, &random_hex(64));
            let slice = TestCgroup::v2(first.rsplit_once('/').unwrap().0);
            let containers: Vec<TestCgroup> = (0..CONTAINERS)
                .map(|i| match i {
                    0 => TestCgroup::v2(&first),
                    _ => TestCgroup::v2(&systemd_container(&uid, &random_hex(64))),
                })
                .collect();
            node.pods.push(BigPod { containers, slice });
        }
        let busy: Vec<&TestCgroup> = node
            .pods
            .iter()
            .flat_map(|p| &p.containers[..BUSY])
            .collect();
        node.sleepers = Some(Sleepers::spawn(&busy, PER_CONTAINER)?);
        node.wait_started()?;
        node.mem_used_kib = mem0.saturating_sub(mem_available_kib());
        node.started_in = t0.elapsed();
        if std::env::var("GPU_AGENT_BENCH_NAMED").is_ok_and(|v| v == "1") {
            node.name()?;
        }
        eprintln!(
            "big node: {PROCESSES} processes, {CGROUPS} cgroups in {:.1} s, {} MiB",
            node.started_in.as_secs_f64(),
            node.mem_used_kib >> 10
        );
        Ok(node)
    }

    fn count(&self) -> usize {
        self.pods
            .iter()
            .flat_map(|p| &p.containers[..BUSY])
            .map(|c| c.procs().len())
            .sum()
    }

    fn wait_started(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let n = self.count();
            if n >= PROCESSES {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("only {n} of {PROCESSES} processes started in time");
            }
            check_low_memory()?;
            self.sleepers.as_mut().unwrap().check()?;
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Two processes of each pod (first two containers) are GPU processes: 2,000.
    pub fn gpu_pids(&self) -> Vec<u32> {
        self.pods
            .iter()
            .flat_map(|p| &p.containers[..2])
            .filter_map(|c| c.procs().into_iter().nth(1))
            .collect()
    }

    /// The node as a Kubernetes node's runtime (CRI) and kubelet (pod-resources) describe
    /// it, served from sockets the bench's agents are configured with
    /// (`benchkit::agent::set_metadata`): every container named (pod `pod-K` in namespace
    /// `bench`, container `c-J`), and each GPU process's container allocated the MIG
    /// device that `write_scenario` puts its process on (its position among `gpu_pids`,
    /// round-robin over the scenario's MIG devices).
    fn name(&mut self) -> Result<()> {
        let scenario = workspace_root().join("tests/scenarios/h100-8gpu-mig.json");
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(scenario)?)?;
        let migs: Vec<String> = (v["devices"].as_array().context("devices")?.iter())
            .flat_map(|d| d["mig_devices"].as_array().into_iter().flatten())
            .filter_map(|m| m["uuid"].as_str().map(str::to_string))
            .collect();
        if migs.is_empty() {
            bail!("the MIG scenario has no MIG devices to allocate");
        }
        let mut containers = vec![];
        let mut gpu = 0;
        for (k, p) in self.pods.iter().enumerate() {
            for (j, c) in p.containers.iter().enumerate() {
                let r = gpu_agent::process::cgroup::parse_cgroup_path(&c.path)
                    .context("a bench container's cgroup path")?;
                let mut gpus = vec![];
                // As `gpu_pids` counts them.
                if j < 2 && c.procs().into_iter().nth(1).is_some() {
                    gpus.push(migs[gpu % migs.len()].clone());
                    gpu += 1;
                }
                containers.push(FakeContainer {
                    id: r.container_id.as_deref().unwrap_or_default().to_string(),
                    pod_uid: r.pod_uid.as_deref().unwrap_or_default().to_string(),
                    namespace: "bench".into(),
                    pod: format!("pod-{k}"),
                    name: format!("c-{j}"),
                    gpus,
                });
            }
        }
        let dir = std::env::temp_dir().join(format!("bench-node-{}", random_hex(8)));
        std::fs::create_dir_all(&dir)?;
        let world = World::default();
        world.set(containers);
        let fake = FakeNode::start(&dir, world);
        crate::benchkit::agent::set_metadata(Some(format!(
            "\n[metadata]\ncri_socket = \"{}\"\npod_resources_socket = \"{}\"\n",
            fake.cri.display(),
            fake.pod_resources.display()
        )));
        eprintln!(
            "big node named: {} containers, {gpu} allocated a MIG device",
            CGROUPS - PODS
        );
        self.named = Some((fake, dir));
        Ok(())
    }
}

impl Drop for BigNode {
    fn drop(&mut self) {
        let t0 = Instant::now();
        // cgroup.kill: every process of a pod at once; TestCgroup's own kill loop would
        // take 20 ms per busy container.
        for p in &self.pods {
            let _ = std::fs::write(p.slice.dir.join("cgroup.kill"), "1");
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        for p in &self.pods {
            let events = p.slice.dir.join("cgroup.events");
            while std::fs::read_to_string(&events).is_ok_and(|e| e.contains("populated 1"))
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.sleepers = None;
        if let Some((mut fake, dir)) = self.named.take() {
            crate::benchkit::agent::set_metadata(None);
            fake.stop();
            let _ = std::fs::remove_dir_all(dir);
        }
        // The first pod made the shared parents: it goes last.
        while let Some(p) = self.pods.pop() {
            drop(p);
        }
        eprintln!("big node removed in {:.1} s", t0.elapsed().as_secs_f64());
    }
}

/// GPU_AGENT_BENCH_HOLD=SECS keeps the node and its agent that long after the window, to
/// profile it (`perf record -p PID`).
pub(crate) fn hold(r: &crate::benchkit::agent::Running) {
    let secs: u64 = match std::env::var("GPU_AGENT_BENCH_HOLD")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(s) => s,
        None => return,
    };
    eprintln!(
        "  holding the node for {secs} s: agent pid {}",
        r.agent.pid()
    );
    // The receiver would keep every 3 MB request of the hold (it was OOM-killed at 19 GB
    // after 15 minutes): only the last is kept.
    let until = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < until {
        std::thread::sleep(Duration::from_secs(10).min(until - Instant::now()));
        r.rx.received.keep_last();
        // GPU_AGENT_BENCH_DUMP=FILE: the last request, to study what its bytes are.
        if let (Ok(path), Some(req)) = (std::env::var("GPU_AGENT_BENCH_DUMP"), r.rx.received.last())
        {
            let _ = std::fs::write(path, prost::Message::encode_to_vec(&req));
        }
    }
}

/// The 50k node with the agent: ready time, then NVML calls per cycle with 320 GPU
/// processes, then everything at 2,000 GPU processes on 8 GPUs x 7 MIG devices.
pub(crate) fn measure(bin: &Path, lib: &Path, secs: u64) -> Result<Row> {
    eprintln!("overhead: N={PROCESSES} processes in {PODS} pods, {CGROUPS} cgroups");
    let mut node = BigNode::build()?;
    let pids = node.gpu_pids();
    if pids.len() < 2 * PODS {
        bail!("only {} GPU processes found of {}", pids.len(), 2 * PODS);
    }
    let scenario = classic::scenario_path();
    write_scenario(&scenario, Layout::Mig, &pids[..320])?;
    let r = start_agent(bin, lib)?;
    eprintln!("  agent ready in {:.2} s", r.ready_s);
    settle(&r.agent);
    std::thread::sleep(Duration::from_secs(2));
    let small = window(&r, 5)?;
    write_scenario(&scenario, Layout::Mig, &pids)?;
    // The library reloads the file within 100 ms; let a cycle pass on it.
    std::thread::sleep(Duration::from_millis(2500));
    let w = window(&r, secs)?;
    hold(&r);
    let memory = Memory::read(&r.agent)?;
    print_memory("the bench's agent", &memory);
    let mut row = finish(r, &w, lib, &pids, PROCESSES)?;
    let (protocol, ratio) = protocols(bin, lib, secs)?;
    let deployed = deployed(&mut node, bin, lib, secs, row.agent_cpu_pct)?;
    row.pods = PODS;
    row.big = Some(BigFigures {
        other: Some(OtherProtocol {
            protocol,
            ratio,
            cpu_pct: ratio * row.agent_cpu_pct,
        }),
        deployed: Some(deployed),
        cgroups: CGROUPS,
        calls_320: small.calls,
        node_mem_mib: node.mem_used_kib as f64 / 1024.0,
        node_start_s: node.started_in.as_secs_f64(),
        memory,
    });
    drop(node);
    Ok(row)
}

/// The other protocol (`other_protocol`) against this one on the large node, side by side
/// (as the pair bench runs two builds) over six windows of `secs / 2`, each agent with its
/// own receiver: their costs drift apart less than two runs one after the other would. The
/// other protocol's agent starts first, so the bias of the agent started second (about 3 %)
/// counts against the bench's own protocol. Returns the other protocol and the median ratio
/// of its cost a cycle to this one's.
fn protocols(bin: &Path, lib: &Path, secs: u64) -> Result<(String, f64)> {
    let this = crate::benchkit::agent::protocol();
    let other = other_protocol(&this);
    eprintln!("  {other} against {this}, side by side:");
    let b = start_agent_with(bin, lib, other)?;
    let a = start_agent_with(bin, lib, &this)?;
    settle(&b.agent);
    settle(&a.agent);
    std::thread::sleep(Duration::from_secs(2));
    let mut ratios = side_by_side(&a, &b, 6, (secs / 2).max(5))?;
    if a.rx.received.count() == 0 || b.rx.received.count() == 0 {
        bail!("an agent exported nothing over {this} or {other}");
    }
    let median = median(&mut ratios);
    eprintln!("  {other}/{this}: median {median:.3}");
    Ok((other.to_string(), median))
}

/// deploy/kubernetes/config.toml, parsed, and its path.
fn deployed_config() -> Result<(toml::Table, PathBuf)> {
    let path = workspace_root().join("deploy/kubernetes/config.toml");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let doc: toml::Table = text.parse().with_context(|| path.display().to_string())?;
    Ok((doc, path))
}

/// Whether deploy/kubernetes/config.toml has the agent name containers (`[metadata]`
/// enabled, the agent's default): then the deployed agent asks the node's runtime and
/// kubelet, as the DaemonSet's does.
fn deployed_names() -> Result<bool> {
    let (doc, _) = deployed_config()?;
    let metadata = doc.get("metadata").and_then(|t| t.as_table());
    let enabled = metadata
        .and_then(|t| t.get("enabled"))
        .and_then(|v| v.as_bool());
    Ok(enabled.unwrap_or(true))
}

/// deploy/kubernetes/config.toml's `[otlp]` table: the protocol, the export interval and
/// the compression the DaemonSet's agent runs with.
fn deployed_otlp() -> Result<(String, u64, String)> {
    let (doc, path) = deployed_config()?;
    let otlp = doc.get("otlp").and_then(|t| t.as_table());
    let get = |k: &str| otlp.and_then(|t| t.get(k));
    let protocol = get("protocol").and_then(|v| v.as_str());
    let interval = get("interval_ms").and_then(|v| v.as_integer());
    let compression = get("compression")
        .and_then(|v| v.as_str())
        .unwrap_or("none");
    match (protocol, interval) {
        (Some(p), Some(i)) if i > 0 => Ok((p.into(), i as u64, compression.into())),
        _ => bail!("{}: no [otlp] protocol and interval_ms", path.display()),
    }
}

/// The agent as the DaemonSet runs it (`deployed_otlp`: an export every 30 s, gzipped)
/// against the bench's own (an export every second, not compressed), side by side on the
/// large node. Each window is one export interval long, so that each holds one export
/// whatever its phase; as many as fit in three of the bench's windows, at least two; the
/// ratio is of their CPU summed. The bench's agent starts first, so the bias of the agent
/// started second (about 3 %) counts against the deployed one. `bench_pct` is the bench's
/// agent's figure, which the ratio scales.
fn deployed(
    node: &mut BigNode,
    bin: &Path,
    lib: &Path,
    secs: u64,
    bench_pct: f64,
) -> Result<Deployed> {
    let (protocol, interval_ms, compression) = deployed_otlp()?;
    let named = deployed_names()?;
    let this = crate::benchkit::agent::protocol();
    let window = interval_ms.div_ceil(1000).max(1);
    let n = (3 * secs / window).clamp(2, 6) as usize;
    eprintln!(
        "  as deployed ({protocol}, an export every {interval_ms} ms, compression {compression}) \
         against the bench's, side by side, {n} windows of {window} s:"
    );
    let interval = interval_ms.to_string();
    let env = [
        ("OTEL_METRIC_EXPORT_INTERVAL", interval.as_str()),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", compression.as_str()),
    ];
    let a = start_agent_with(bin, lib, &this)?;
    // The deployed agent names the containers where deploy/'s `[metadata]` is on (the
    // runtime and the kubelet answer it as a Kubernetes node's would), whatever the bench's
    // agents do; their setting is put back after.
    let bench_metadata = crate::benchkit::agent::metadata();
    if named && node.named.is_none() {
        node.name()?;
    }
    crate::benchkit::agent::set_metadata(crate::benchkit::agent::metadata().filter(|_| named));
    let b = start_agent_env(bin, lib, &protocol, &env);
    crate::benchkit::agent::set_metadata(bench_metadata);
    let b = b?;
    settle(&a.agent);
    settle(&b.agent);
    std::thread::sleep(Duration::from_secs(2));
    let sent = || b.agent.stats()["export_sent"].as_u64().unwrap_or(0);
    let before = sent();
    let (wa, wb) = rounds(&a, &b, n, window)?;
    let exports = sent() - before;
    if exports == 0 {
        bail!(
            "the agent as deployed exported nothing in {} s",
            n as u64 * window
        );
    }
    eprintln!("  the deployed agent exported {exports} times in the {n} windows");
    let ratio = (wb.0 / wb.1) / (wa.0 / wa.1);
    eprintln!("  as deployed/the bench's: {ratio:.3} (CPU a cycle, summed over the windows)");
    let rss_mib = rss_kib(b.agent.pid())? as f64 / 1024.0;
    let peak_mib = hwm_kib(b.agent.pid())? as f64 / 1024.0;
    eprintln!("  the deployed agent's RSS {rss_mib:.1} MiB (its peak {peak_mib:.1} MiB)");
    let memory = Memory::read(&b.agent)?;
    print_memory("the deployed agent", &memory);
    Ok(Deployed {
        named,
        rss_mib,
        peak_mib,
        memory,
        protocol,
        interval_ms,
        compression,
        windows: n,
        exports,
        ratio,
        cpu_pct: ratio * bench_pct,
    })
}

/// Measures `a` and `b` over the same `rounds` windows of `secs`; each one's CPU (ns) and
/// cycles summed over them.
fn rounds(
    a: &crate::benchkit::agent::Running,
    b: &crate::benchkit::agent::Running,
    rounds: usize,
    secs: u64,
) -> Result<((f64, f64), (f64, f64))> {
    let (mut sa, mut sb) = ((0.0, 0.0), (0.0, 0.0));
    for round in 1..=rounds {
        let (ma, mb) = marks(a, b, round)?;
        std::thread::sleep(Duration::from_secs(secs));
        let (wa, wb) = (ma.window(a)?, mb.window(b)?);
        (sa.0, sa.1, sb.0, sb.1) = (
            sa.0 + wa.cpu_ns,
            sa.1 + wa.cycles,
            sb.0 + wb.cpu_ns,
            sb.1 + wb.cycles,
        );
        a.rx.received.keep_last();
        b.rx.received.keep_last();
    }
    Ok((sa, sb))
}

/// Both agents' marks, in alternate order by round, so that neither is always measured a
/// little longer.
fn marks(
    a: &crate::benchkit::agent::Running,
    b: &crate::benchkit::agent::Running,
    round: usize,
) -> Result<(Mark, Mark)> {
    Ok(if round % 2 == 1 {
        let ma = Mark::take(a)?;
        (ma, Mark::take(b)?)
    } else {
        let mb = Mark::take(b)?;
        (Mark::take(a)?, mb)
    })
}

/// Measures `a` and `b` over the same `rounds` windows of `secs`; each round's ratio of
/// b's cost a cycle to a's.
fn side_by_side(
    a: &crate::benchkit::agent::Running,
    b: &crate::benchkit::agent::Running,
    rounds: usize,
    secs: u64,
) -> Result<Vec<f64>> {
    let us = |w: &crate::benchkit::agent::Window| w.cpu_ns / w.cycles / 1e3;
    let parts = |w: &crate::benchkit::agent::Window| {
        format!(
            "NVML {:.0} / join {:.0} / export {:.0}",
            w.nvml_ns / 1e3,
            w.join_ns / 1e3,
            w.export_ns / 1e3
        )
    };
    let mut ratios = vec![];
    for round in 1..=rounds {
        let (ma, mb) = marks(a, b, round)?;
        std::thread::sleep(Duration::from_secs(secs));
        let (wa, wb) = (ma.window(a)?, mb.window(b)?);
        let ratio = us(&wb) / us(&wa);
        eprintln!(
            "  round {round}: this {:.0} us/cycle ({}), other {:.0} us/cycle ({}): other/this {ratio:.3}",
            us(&wa),
            parts(&wa),
            us(&wb),
            parts(&wb),
        );
        ratios.push(ratio);
        a.rx.received.keep_last();
        b.rx.received.keep_last();
    }
    Ok(ratios)
}

/// The median of an even number of ratios, which it sorts.
fn median(ratios: &mut [f64]) -> f64 {
    ratios.sort_by(f64::total_cmp);
    let n = ratios.len();
    (ratios[n / 2 - 1] + ratios[n / 2]) / 2.0
}

/// Rounds of the pair bench.
const PAIR_ROUNDS: usize = 6;

/// GPU_AGENT_BENCH_PAIR=PATH with GPU_AGENT_BENCH_ONLY=big: this build and another one side
/// by side on the large node, each with its own receiver, measured over the same windows.
/// This VM's speed drifts 10-30 % between runs minutes apart, which hid changes of a few
/// percent in before/after runs; a drift hits both agents of a pair alike, so their ratio
/// holds much closer. Prints each round and the median ratio (RESULT pair_ratio).
/// GPU_AGENT_BENCH_PAIR_PROTOCOL gives the other build's export protocol (default: the
/// same as this one's), so that two protocols can be compared with one build.
pub(crate) fn pair(bin: &Path, other: &Path, lib: &Path, secs: u64) -> Result<()> {
    let protocol = crate::benchkit::agent::protocol();
    let other_protocol = std::env::var("GPU_AGENT_BENCH_PAIR_PROTOCOL").unwrap_or(protocol.clone());
    eprintln!(
        "pair: {} ({protocol}) against {} ({other_protocol})",
        bin.display(),
        other.display()
    );
    let node = BigNode::build()?;
    let pids = node.gpu_pids();
    if pids.len() < 2 * PODS {
        bail!("only {} GPU processes found of {}", pids.len(), 2 * PODS);
    }
    write_scenario(&classic::scenario_path(), Layout::Mig, &pids)?;
    let a = start_agent_with(bin, lib, &protocol)?;
    let b = start_agent_with(other, lib, &other_protocol)?;
    settle(&a.agent);
    settle(&b.agent);
    std::thread::sleep(Duration::from_millis(2500));
    let mut ratios = side_by_side(&a, &b, PAIR_ROUNDS, secs)?;
    if a.rx.received.count() == 0 || b.rx.received.count() == 0 {
        bail!("an agent of the pair exported nothing");
    }
    let median = median(&mut ratios);
    eprintln!(
        "  other/this: median {median:.3}, range {:.3}-{:.3}",
        ratios[0],
        ratios[PAIR_ROUNDS - 1]
    );
    println!("RESULT pair_ratio={median:.3}");
    drop((a, b));
    drop(node);
    Ok(())
}

fn print_memory(who: &str, m: &Memory) {
    let c = m.cells();
    eprintln!(
        "  {who}'s RSS: binary {}, libraries {}, heap and stacks {} (live heap {}), BPF {}, \
         other {} MiB; state {}",
        c[0], c[1], c[2], c[3], c[4], c[5], c[6]
    );
}
