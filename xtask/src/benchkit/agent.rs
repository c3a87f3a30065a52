//! The agent under measurement on a benchmark node: started on the fake NVML library with
//! an in-process OTLP receiver, the scenario that library reads, and windows of the agent's
//! counters (CPU, cycles, NVML calls).
use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde_json::{json, Value};
use tests::{
    otlp_receiver::{Kind, Receiver},
    random_hex, Agent,
};

use crate::{
    benchkit::host::{counter, cpu_ns},
    classic, workspace_root,
};

/// Where the GPU processes go: round robin over the 8 GPUs of h100-8gpu.json, or over the
/// 56 MIG devices of h100-8gpu-mig.json.
#[derive(Clone, Copy)]
pub(crate) enum Layout {
    Gpus,
    Mig,
}

pub(crate) fn write_scenario(path: &Path, layout: Layout, gpu_pids: &[u32]) -> Result<()> {
    let file = match layout {
        Layout::Gpus => "tests/scenarios/h100-8gpu.json",
        Layout::Mig => "tests/scenarios/h100-8gpu-mig.json",
    };
    let mut v: Value =
        serde_json::from_str(&std::fs::read_to_string(workspace_root().join(file))?)?;
    let devices = v["devices"].as_array_mut().context("devices")?;
    let mut slots: Vec<&mut Value> = match layout {
        Layout::Gpus => devices.iter_mut().collect(),
        Layout::Mig => devices
            .iter_mut()
            .flat_map(|d| d["mig_devices"].as_array_mut().unwrap().iter_mut())
            .collect(),
    };
    for s in slots.iter_mut() {
        s["processes"] = json!([]);
    }
    let n = slots.len();
    for (i, pid) in gpu_pids.iter().enumerate() {
        // MIG devices have no per-process utilization: the library ignores the fields.
        slots[i % n]["processes"]
            .as_array_mut()
            .unwrap()
            .push(json!({"pid": pid, "used_memory": 1u64 << 28, "sm_util": i % 90, "mem_util": 3, "enc_util": 0, "dec_util": 0}));
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, v.to_string())?;
    std::fs::rename(tmp, path)?;
    Ok(())
}

/// NVML calls per cycle between two FAKE_NVML_CALLS snapshots (both cycle starts).
#[derive(Clone)]
pub(crate) struct Calls {
    pub per_cycle: f64,
    /// Busiest functions, calls per cycle.
    pub top: Vec<(String, f64)>,
}

/// The fake library's counts, Null when no whole record could be read.
fn read_calls(path: &Path) -> Value {
    tests::nvml::read_calls(path).unwrap_or(Value::Null)
}

fn calls_between(a: &Value, b: &Value) -> Option<Calls> {
    let f = |v: &Value, k: &str| v["calls"][k].as_u64().unwrap_or(0) as f64;
    let count = |v: &Value| f(v, "nvmlDeviceGetCount_v2") + f(v, "nvmlDeviceGetCount");
    let cycles = count(b) - count(a);
    if cycles < 1.0 {
        return None;
    }
    let mut top: Vec<(String, f64)> = b["calls"]
        .as_object()?
        .keys()
        .map(|k| (k.clone(), (f(b, k) - f(a, k)) / cycles))
        .filter(|(_, n)| *n > 0.0)
        .collect();
    top.sort_by(|x, y| y.1.total_cmp(&x.1));
    top.truncate(8);
    let total = |v: &Value| v["total"].as_u64().unwrap_or(0) as f64;
    Some(Calls {
        per_cycle: (total(b) - total(a)) / cycles,
        top,
    })
}

/// Every row's agent: 1 Hz, OTLP every second, FAKE_NVML_CALLS on (one small file written
/// per cycle by the library, in the agent's NVML thread: part of what is measured).
const AGENT_CONFIG: &str = "[nvml]\ninterval_ms = 1000\n\n[ebpf]\n\
    # Room for the 50k-process node (the default follows kernel.pid_max, raised for the run).\n\
    max_processes = 131072\n";

/// The `[metadata]` table the bench's agents get while a named large node stands
/// (`bignode`, GPU_AGENT_BENCH_NAMED=1); none otherwise, as the default bench runs.
static METADATA: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

pub(crate) fn set_metadata(table: Option<String>) {
    *METADATA.lock().unwrap() = table;
}

/// The `[metadata]` table the next agent gets (`set_metadata`).
pub(crate) fn metadata() -> Option<String> {
    METADATA.lock().unwrap().clone()
}

pub(crate) struct Running {
    pub agent: Agent,
    pub ready_s: f64,
    pub calls_file: PathBuf,
    pub rx: Receiver,
}

pub(crate) fn start_agent(bin: &Path, lib: &Path) -> Result<Running> {
    start_agent_with(bin, lib, &protocol())
}

/// The export protocol of the bench's agents: the agent's default, HTTP/protobuf, which is
/// also what deploy/ configures; GPU_AGENT_BENCH_PROTOCOL=grpc for gRPC. (Until 26 November
/// the bench used gRPC, which costs more on the large node: its 16 KiB HTTP/2 frames each
/// go out with a write of their own. The large node is measured with both.)
pub(crate) fn protocol() -> String {
    std::env::var("GPU_AGENT_BENCH_PROTOCOL").unwrap_or_else(|_| "http/protobuf".into())
}

/// The protocol that is not `protocol`.
pub(crate) fn other_protocol(protocol: &str) -> &'static str {
    match protocol {
        "grpc" => "http/protobuf",
        _ => "grpc",
    }
}

/// `start_agent`, exporting with `protocol` (`grpc` or `http/protobuf`).
pub(crate) fn start_agent_with(bin: &Path, lib: &Path, protocol: &str) -> Result<Running> {
    start_agent_env(bin, lib, protocol, &[])
}

/// `start_agent_with`, with `env` set after the bench's own (which it overrides).
pub(crate) fn start_agent_env(
    bin: &Path,
    lib: &Path,
    protocol: &str,
    env: &[(&str, &str)],
) -> Result<Running> {
    let kind = if protocol == "http/protobuf" {
        Kind::Http
    } else {
        Kind::Grpc
    };
    let rx = Receiver::start(kind, 0);
    let url = rx.url();
    let calls_file = std::env::temp_dir().join(format!("bench-calls-{}.json", random_hex(8)));
    let scenario = classic::scenario_path();
    let t0 = Instant::now();
    let config = format!(
        "{AGENT_CONFIG}{}",
        METADATA.lock().unwrap().as_deref().unwrap_or_default()
    );
    let agent = Agent::start_full(
        bin,
        &config,
        &["--nvml-lib", lib.to_str().unwrap()],
        &[
            ("FAKE_NVML_SCENARIO", scenario.to_str().unwrap()),
            ("FAKE_NVML_CALLS", calls_file.to_str().unwrap()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &url),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
            ("OTEL_METRIC_EXPORT_INTERVAL", "1000"),
        ]
        .into_iter()
        .chain(env.iter().copied())
        .collect::<Vec<_>>(),
    );
    let ready_s = t0.elapsed().as_secs_f64();
    Ok(Running {
        agent,
        ready_s,
        calls_file,
        rx,
    })
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.calls_file);
    }
}

/// The agent's cost over `secs` of sleeping (polling it would be measured as its cost).
pub(crate) struct Window {
    pub cpu_ns: f64,
    pub wall_ns: f64,
    pub cycles: f64,
    pub nvml_ns: f64,
    pub join_ns: f64,
    pub export_ns: f64,
    pub calls: Option<Calls>,
}

pub(crate) fn window(r: &Running, secs: u64) -> Result<Window> {
    let m = Mark::take(r)?;
    std::thread::sleep(Duration::from_secs(secs));
    m.window(r)
}

/// An agent's counters at the start of a window: several agents can be measured over the
/// same one (the pair bench).
pub(crate) struct Mark {
    stats: Value,
    calls: Value,
    cpu_ns: u64,
    at: Instant,
}

impl Mark {
    pub(crate) fn take(r: &Running) -> Result<Mark> {
        let (stats, calls) = (r.agent.stats(), read_calls(&r.calls_file));
        let cpu_ns = cpu_ns(r.agent.pid())?;
        Ok(Mark {
            stats,
            calls,
            cpu_ns,
            at: Instant::now(),
        })
    }

    /// The window from this mark to now.
    pub(crate) fn window(&self, r: &Running) -> Result<Window> {
        let c1 = cpu_ns(r.agent.pid())?;
        let wall = self.at.elapsed();
        let k1 = read_calls(&r.calls_file);
        let (s0, s1) = (&self.stats, r.agent.stats());
        let cycles = (counter(&s1, "nvml_samples") - counter(s0, "nvml_samples")).max(1) as f64;
        let per = |k: &str| (counter(&s1, k) - counter(s0, k)) as f64 / cycles;
        Ok(Window {
            cpu_ns: (c1 - self.cpu_ns) as f64,
            wall_ns: wall.as_nanos() as f64,
            cycles,
            nvml_ns: per("nvml_sample_cpu_ns"),
            join_ns: per("join_cpu_ns"),
            export_ns: per("export_cpu_ns"),
            calls: calls_between(&self.calls, &k1),
        })
    }
}

/// The 8-GPU scenario with `procs` spread over its devices (in turn: 5 per GPU for 40).
fn gpu_scenario(mut scenario: Value, procs: &[tests::cgroups::Proc]) -> Result<Value> {
    let devices = scenario["devices"].as_array_mut().context("devices")?;
    let ndev = devices.len();
    for d in devices.iter_mut() {
        d["processes"] = Value::Array(vec![]);
    }
    for (i, p) in procs.iter().enumerate() {
        let d = &mut devices[i % ndev];
        d["processes"].as_array_mut().unwrap().push(json!({
            "pid": p.pid(), "used_memory": (1u64 << 28) * (1 + i as u64 % 8),
            "sm_util": i % 100, "mem_util": i % 40, "enc_util": 0, "dec_util": 0
        }));
    }
    Ok(scenario)
}

/// tests/scenarios/h100-8gpu.json's 8 GPUs on the release fake NVML library, with `n` real
/// processes (`sleep`) spread over `pods` pod cgroups and the GPUs (`gpu_scenario`), the
/// scenario written to a file of its own. Dropped: the processes, then their cgroups and
/// the file.
pub(crate) struct GpuNode {
    pub lib: PathBuf,
    pub scenario: PathBuf,
    pub gpus: usize,
    pub procs: Vec<tests::cgroups::Proc>,
    pods: Vec<crate::benchkit::host::Pod>,
}

impl GpuNode {
    pub(crate) fn build(n: u32, pods: u32) -> Result<GpuNode> {
        crate::cargo(&["build", "--release", "-p", "fake-nvml"])?;
        let lib = workspace_root().join("target/release/libnvidia_ml.so");
        let template: Value = serde_json::from_str(&std::fs::read_to_string(
            workspace_root().join("tests/scenarios/h100-8gpu.json"),
        )?)?;
        // Real processes in real pod cgroups, so every GPU PID joins through the cache.
        let pod_cgroups = crate::benchkit::host::make_pods(pods as usize);
        let procs: Vec<_> = (0..n)
            .map(|i| {
                let mut c = std::process::Command::new("sleep");
                c.arg("3600");
                tests::cgroups::Proc(pod_cgroups[(i % pods) as usize].cg.spawn(&mut c))
            })
            .collect();
        let gpus = template["devices"].as_array().map_or(0, Vec::len);
        let scenario = std::env::temp_dir().join(format!("bench-gpu-{}.json", random_hex(8)));
        std::fs::write(
            &scenario,
            serde_json::to_vec(&gpu_scenario(template, &procs)?)?,
        )?;
        Ok(GpuNode {
            lib,
            scenario,
            gpus,
            procs,
            pods: pod_cgroups,
        })
    }
}

impl Drop for GpuNode {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.scenario);
        self.procs.clear();
        self.pods.clear();
    }
}
