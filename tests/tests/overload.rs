//! Exact after overload: the agent is stopped (SIGSTOP) while an exec storm floods its ring
//! buffer and new pods start; once it runs again, every live process in a container cgroup
//! must be attributed, with its command, within 2 s. The real agent, real eBPF, real cgroups;
//! NVML is the fake library.
use std::{
    collections::HashMap,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use tests::{
    cgroups::{sleeper, systemd_container, Proc, TestCgroup},
    fake_nvml_lib,
    nvml::Scenario,
    random_hex, random_uid, Agent,
};

const GIB: u64 = 1 << 30;
/// How soon after SIGCONT the agent must be exact again.
const CONVERGE: Duration = Duration::from_secs(2);

fn scenario(processes: Value) -> Value {
    json!({"driver_version": "580.159.04", "devices": [{
        "uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3", "memory_total": 85520809984u64,
        "memory_used": 3 * GIB, "utilization_gpu": 60, "utilization_memory": 20,
        "power_mw": 350000, "temperature_c": 45, "processes": processes
    }]})
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: signalling the agent this test started.
    assert_eq!(
        unsafe { libc::kill(pid as i32, sig) },
        0,
        "kill({pid}, {sig})"
    );
}

/// A pod whose container runs one `sleep`.
struct Pod {
    uid: String,
    id: String,
    _cg: TestCgroup,
    sleep: Proc,
}

impl Pod {
    fn start() -> Pod {
        let (uid, id) = (random_uid(), random_hex(64));
        let cg = TestCgroup::v2(&systemd_container(&uid, &id));
        let sleep = Proc(cg.spawn(&mut sleeper()));
        Pod {
            uid,
            id,
            _cg: cg,
            sleep,
        }
    }
}

/// `n` fork+exec of /bin/true in a pod's cgroup, by one shell: the storm.
fn storm(cg: &TestCgroup, n: u32) -> std::process::Child {
    let script = format!("i=0; while [ $i -lt {n} ]; do /bin/true; i=$((i+1)); done");
    cg.spawn(Command::new("sh").args(["-c", &script]))
}

/// Stops the agent while `storm` floods the ring and `pods` new pods start; lists their
/// sleeps on the GPU with 2 GiB each; resumes the agent. Returns the pods and when it
/// resumed.
fn overflow_while_stopped(agent: &Agent, sc: &Scenario, pods: usize) -> (Vec<Pod>, Instant) {
    let (uid, id) = (random_uid(), random_hex(64));
    let pod_a = TestCgroup::v2(&systemd_container(&uid, &id));
    let mut flood = storm(&pod_a, 40_000);
    std::thread::sleep(Duration::from_millis(500));
    signal(agent.pid(), libc::SIGSTOP);
    let stopped = Instant::now();
    // The pods start once the ring has overflowed, so their notifications are lost.
    std::thread::sleep(Duration::from_secs(3));
    let pods: Vec<Pod> = (0..pods).map(|_| Pod::start()).collect();
    let procs: Vec<Value> = pods
        .iter()
        .map(|p| json!({"pid": p.sleep.pid(), "used_memory": 2 * GIB, "sm_util": 10}))
        .collect();
    sc.write(&scenario(Value::Array(procs)));
    std::thread::sleep(Duration::from_secs(6).saturating_sub(stopped.elapsed()));
    signal(agent.pid(), libc::SIGCONT);
    let resumed = Instant::now();
    let _ = flood.kill();
    let _ = flood.wait();
    drop(pod_a);
    (pods, resumed)
}

/// A 64 KiB ring buffer: the storm fills it within a fraction of a second of the stop, so
/// the new pods' notifications are surely lost.
fn start(sc: &Scenario) -> Agent {
    let lib = fake_nvml_lib();
    Agent::start_env(
        "[nvml]\ninterval_ms = 200\n[ebpf]\nring_buffer_bytes = 65536\nwakeup_bytes = 65536\n",
        &["--nvml-lib", lib.to_str().unwrap()],
        &[("FAKE_NVML_SCENARIO", sc.path())],
    )
}

/// Pods whose process is not yet attributed (container id and command) or whose 2 GiB is
/// not yet charged to that container.
fn unattributed<'a>(agent: &Agent, pods: &'a [Pod]) -> Vec<&'a Pod> {
    let snap = agent.json("/debug/snapshot");
    let charged = |p: &Pod| {
        snap["containers"].as_array().is_some_and(|cs| {
            cs.iter().any(|c| {
                c["container_id"] == json!(p.id)
                    && c["gpus"][0]["memory_used_bytes"] == json!(2 * GIB)
            })
        })
    };
    let rows: HashMap<u64, Value> = agent
        .processes()
        .into_iter()
        .map(|r| (r["pid"].as_u64().unwrap(), r))
        .collect();
    pods.iter()
        .filter(|p| {
            let row = rows.get(&(p.sleep.pid() as u64));
            let attributed = row.is_some_and(|r| {
                r["container_id"] == json!(p.id)
                    && r["pod_uid"] == json!(p.uid)
                    && r["comm"] == json!("sleep")
                    && r["cgroup_path"].is_string()
            });
            !attributed || !charged(p)
        })
        .collect()
}

/// These tests flood the machine on purpose: one at a time, or each measures the others.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn assert_converges(agent: &Agent, pods: &[Pod], resumed: Instant) {
    let stats = agent.stats();
    loop {
        let asked = resumed.elapsed();
        let missing = unattributed(agent, pods);
        if missing.is_empty() {
            // Converged before the check that saw it ended: report both ends.
            eprintln!(
                "FIGURE converged {} pods between {asked:?} and {:?} after SIGCONT",
                pods.len(),
                resumed.elapsed()
            );
            assert!(
                asked < CONVERGE,
                "the first exact answer came {asked:?} after SIGCONT"
            );
            break;
        }
        assert!(
            resumed.elapsed() < CONVERGE,
            "{} of {} pods still unattributed {:?} after SIGCONT, e.g. pid {}: {:#}\nstats: {stats:#}",
            missing.len(),
            pods.len(),
            resumed.elapsed(),
            missing[0].sleep.pid(),
            agent.process(missing[0].sleep.pid()).unwrap_or_default(),
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let stats = agent.stats();
    assert!(
        stats["events_lost"].as_u64().unwrap() > 0,
        "the ring never overflowed: {stats:#}"
    );
    assert!(stats["resyncs"].as_u64().unwrap() >= 1, "{stats:#}");
}

#[test]
#[ignore = "needs root: loads the eBPF programs, creates pod cgroups, stops the agent"]
fn attribution_converges_after_lost_events() {
    let _serial = serial();
    let sc = Scenario::new(&scenario(json!([])));
    let agent = start(&sc);
    let (pods, resumed) = overflow_while_stopped(&agent, &sc, 1);
    assert_converges(&agent, &pods, resumed);
}

#[test]
#[ignore = "needs root: loads the eBPF programs, creates pod cgroups, stops the agent"]
fn attribution_converges_after_lost_events_at_scale() {
    let _serial = serial();
    let sc = Scenario::new(&scenario(json!([])));
    let agent = start(&sc);
    let (pods, resumed) = overflow_while_stopped(&agent, &sc, 450);
    assert_converges(&agent, &pods, resumed);
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates a pod cgroup with 2,500 processes"]
fn a_full_kernel_map_is_loud_and_lookups_still_fall_back() {
    let _serial = serial();
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&systemd_container(&uid, &id));
    // More processes than the smallest map holds (1,024 slots and 1,024 entries beside
    // them), all on the GPU.
    let sleepers: Vec<Proc> = (0..2500).map(|_| Proc(cg.spawn(&mut sleeper()))).collect();
    let procs: Vec<Value> = sleepers
        .iter()
        .map(|p| json!({"pid": p.pid(), "used_memory": 1 << 20, "sm_util": 0}))
        .collect();
    let sc = Scenario::new(&scenario(Value::Array(procs)));
    let lib = fake_nvml_lib();
    let agent = Agent::start_env(
        "[nvml]\ninterval_ms = 200\n[ebpf]\nmax_processes = 1024\n",
        &["--nvml-lib", lib.to_str().unwrap()],
        &[("FAKE_NVML_SCENARIO", sc.path())],
    );
    let stats = agent.stats();
    assert_eq!(stats["mode"], "ebpf", "{stats:#}");
    assert!(stats["kernel_map_full"].as_u64().unwrap() > 0, "{stats:#}");
    let reason = stats["degraded_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("ebpf.max_processes = 1024"), "{stats:#}");
    assert!(
        agent
            .log()
            .lines()
            .any(|l| l.contains("WARN") && l.contains("max_processes")),
        "{}",
        agent.log()
    );
    // Every sleeper is still listed and attributed, in the map or not...
    let rows: HashMap<u64, Value> = agent
        .processes()
        .into_iter()
        .map(|r| (r["pid"].as_u64().unwrap(), r))
        .collect();
    let missing: Vec<u32> = sleepers
        .iter()
        .map(|p| p.pid())
        .filter(|pid| {
            rows.get(&(*pid as u64))
                .is_none_or(|r| r["container_id"] != json!(id))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "{} not attributed, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    // ...and all their GPU memory is charged to their container.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let snap = agent.json("/debug/snapshot");
        let charged = snap["containers"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["container_id"] == json!(id)))
            .map(|c| c["gpus"][0]["pids"].as_array().map_or(0, |p| p.len()));
        if charged == Some(sleepers.len()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "charged {charged:?} of {}: {snap:#}",
            sleepers.len()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates a pod cgroup"]
fn an_exit_storm_keeps_at_most_max_tombstones() {
    let _serial = serial();
    let agent = Agent::start("[cache]\ntombstone_secs = 600\nmax_tombstones = 500\n");
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&systemd_container(&uid, &id));
    let mut flood = storm(&cg, 3000);
    assert!(flood.wait().unwrap().success());
    agent.wait_until("the storm's exits", Duration::from_secs(20), || {
        agent.stats()["tombstones_evicted"].as_u64().unwrap_or(0) >= 2000
    });
    let stats = agent.stats();
    assert!(stats["tombstones"].as_u64().unwrap() <= 500, "{stats:#}");
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.pid())).unwrap();
    let rss: Vec<&str> = status
        .lines()
        .filter(|l| l.starts_with("VmRSS") || l.starts_with("VmHWM"))
        .collect();
    eprintln!(
        "FIGURE after the exit storm: tombstones {} evicted {} {rss:?}",
        stats["tombstones"], stats["tombstones_evicted"]
    );
    // The newest exits are the ones kept.
    let exited = agent
        .json("/debug/processes?all=true")
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["exited"] == json!(true))
        .count();
    assert!(
        (400..=500).contains(&exited),
        "{exited} tombstones listed: {stats:#}"
    );
}
