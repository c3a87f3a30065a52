//! GPU use joined to containers, end to end: the real agent with real eBPF, processes in
//! pod cgroups, and NVML answered by the fake libnvidia-ml.so (loaded through nvml-wrapper
//! exactly as the real one is) driven by a scenario file the test writes and edits.
use std::{
    process::Command,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use tests::{
    cgroups::{first_child, sleeper, systemd_container, Proc, TestCgroup},
    fake_nvml_lib,
    nvml::{read_calls, Scenario},
    random_hex, random_uid, Agent,
};

const GIB: u64 = 1 << 30;

fn gpu(uuid: &str, processes: Value) -> Value {
    json!({
        "uuid": uuid, "name": "NVIDIA H100 80GB HBM3", "memory_total": 85520809984u64,
        "memory_used": 3 * GIB, "utilization_gpu": 60, "utilization_memory": 20,
        "power_mw": 350000, "temperature_c": 45, "processes": processes
    })
}

fn p(pid: u32, mem: u64, sm: u32) -> Value {
    json!({"pid": pid, "used_memory": mem, "sm_util": sm, "mem_util": 5, "enc_util": 0, "dec_util": 0})
}

fn scenario(devices: Value) -> Value {
    json!({"driver_version": "580.159.04", "devices": devices})
}

fn start(sc: &Scenario, extra_config: &str) -> Agent {
    let lib = fake_nvml_lib();
    Agent::start_env(
        &format!("[nvml]\ninterval_ms = 200\n{extra_config}"),
        &["--nvml-lib", lib.to_str().unwrap()],
        &[("FAKE_NVML_SCENARIO", sc.path())],
    )
}

/// `start`, with the fake library's call counts recorded in `calls`.
fn start_counting(sc: &Scenario, extra_config: &str, calls: &Calls) -> Agent {
    let lib = fake_nvml_lib();
    Agent::start_env(
        &format!("[nvml]\ninterval_ms = 200\n{extra_config}"),
        &["--nvml-lib", lib.to_str().unwrap()],
        &[
            ("FAKE_NVML_SCENARIO", sc.path()),
            ("FAKE_NVML_CALLS", calls.0.to_str().unwrap()),
        ],
    )
}

fn pod_path(uid: &str, id: &str) -> String {
    systemd_container(uid, id)
}

/// Polls /debug/snapshot until `pred` finds what it wants.
fn wait_snapshot(agent: &Agent, what: &str, pred: impl FnMut(&Value) -> bool) -> Value {
    agent.wait_snapshot(Duration::from_secs(15), what, pred)
}

fn container<'a>(snap: &'a Value, id: Option<&str>) -> Option<&'a Value> {
    snap["containers"]
        .as_array()?
        .iter()
        .find(|c| c["container_id"] == json!(id))
}

/// The fake library's call record (`FAKE_NVML_CALLS`), written at the start of each cycle.
struct Calls(std::path::PathBuf);

impl Calls {
    fn new() -> Calls {
        Calls(std::env::temp_dir().join(format!("calls-{}.json", random_hex(8))))
    }

    /// Calls so far of the functions whose names start with `prefix`.
    fn count(&self, prefix: &str) -> u64 {
        let c = read_calls(&self.0).expect("a call record");
        let calls = c["calls"].as_object().unwrap();
        let n = calls.iter().filter(|(k, _)| k.starts_with(prefix));
        n.map(|(_, v)| v.as_u64().unwrap()).sum()
    }

    fn cycles(&self) -> u64 {
        self.count("nvmlDeviceGetCount")
    }

    /// Waits for `n` more cycles to start.
    fn wait_cycles(&self, n: u64) {
        let c0 = self.cycles();
        for _ in 0..100 {
            if self.cycles() >= c0 + n {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("no {n} cycles in 5 s");
    }
}

impl Drop for Calls {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn two_processes_of_one_container_are_summed() {
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&pod_path(&uid, &id));
    let a = Proc(cg.spawn(&mut sleeper()));
    let b = Proc(cg.spawn(&mut sleeper()));
    let sc = Scenario::new(&scenario(json!([gpu(
        "GPU-11111111-2222-3333-4444-555555555555",
        json!([p(a.pid(), GIB, 30), p(b.pid(), GIB / 2, 20)])
    )])));
    let agent = start(&sc, "");
    let snap = wait_snapshot(&agent, "the container", |s| {
        container(s, Some(&id)).is_some()
    });
    let c = container(&snap, Some(&id)).unwrap();
    assert_eq!(c["pod_uid"], json!(uid));
    assert_eq!(c["qos"], "burstable");
    let g = &c["gpus"][0];
    assert_eq!(g["uuid"], "GPU-11111111-2222-3333-4444-555555555555");
    assert_eq!(g["memory_used_bytes"], json!(GIB + GIB / 2));
    assert_eq!(g["sm_util"], 50);
    assert_eq!(
        g["pids"],
        json!([a.pid().min(b.pid()), a.pid().max(b.pid())])
    );
    assert_eq!(snap["nvml"], "ok");
    assert_eq!(snap["driver_version"], "580.159.04");
    let d = &snap["devices"][0];
    assert_eq!(d["memory_total_bytes"], json!(85520809984u64));
    assert_eq!(d["utilization_gpu"], 60);
    // The cumulative counters grow with time.
    let later = wait_snapshot(&agent, "GPU time to accumulate", |s| {
        container(s, Some(&id))
            .is_some_and(|c| c["gpus"][0]["gpu_time_seconds"].as_f64() > Some(0.2))
    });
    let g = &container(&later, Some(&id)).unwrap()["gpus"][0];
    assert!(g["memory_byte_seconds"].as_f64().unwrap() > 0.0);
    assert_eq!(agent.stats()["nvml"], "ok");
}

/// dcgm-exporter reads /proc/PID/cgroup for each new GPU process; the agent's eBPF cache
/// already knows where a process is, started before the agent or after it.
#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn gpu_processes_are_placed_without_reading_proc() {
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&pod_path(&uid, &id));
    let before = Proc(cg.spawn(&mut sleeper()));
    let gpu0 = "GPU-11111111-2222-3333-4444-555555555555";
    let sc = Scenario::new(&scenario(json!([gpu(
        gpu0,
        json!([p(before.pid(), GIB, 30)])
    )])));
    let agent = start(&sc, "");
    assert_eq!(agent.stats()["mode"], "ebpf");
    let after = Proc(cg.spawn(&mut sleeper()));
    let both = json!([p(before.pid(), GIB, 30), p(after.pid(), GIB, 20)]);
    sc.write(&scenario(json!([gpu(gpu0, both)])));
    wait_snapshot(&agent, "both processes in their container", |s| {
        container(s, Some(&id))
            .is_some_and(|c| c["gpus"][0]["pids"].as_array().map(Vec::len) == Some(2))
    });
    let stats = agent.stats();
    assert_eq!(stats["procfs_fallback_lookups"], 0, "{stats:#}");
    assert_eq!(stats["gpu_processes_unresolved"], 0, "{stats:#}");
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn process_in_its_own_pid_namespace_lands_in_its_container() {
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&pod_path(&uid, &id));
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", "sleep", "600"]);
    let outer = Proc(cg.spawn(&mut cmd));
    let inner = first_child(outer.pid());
    // NVML reports host PIDs: the inner process is PID 1 in its namespace, `inner` here.
    let sc = Scenario::new(&scenario(json!([gpu(
        "GPU-0",
        json!([p(inner, 2 * GIB, 10)])
    )])));
    let agent = start(&sc, "");
    let snap = wait_snapshot(&agent, "the namespaced process", |s| {
        container(s, Some(&id)).is_some()
    });
    let c = container(&snap, Some(&id)).unwrap();
    assert_eq!(c["gpus"][0]["memory_used_bytes"], json!(2 * GIB));
    assert_eq!(c["gpus"][0]["pids"], json!([inner]));
}

#[test]
#[ignore = "needs root: loads the eBPF programs"]
fn host_and_unknown_processes_are_kept_under_the_host_entry() {
    let host = Proc(sleeper().spawn().unwrap());
    // A PID above pid_max can never exist: nobody can place it, and it is still counted.
    let ghost = 4_194_304 + 7;
    let sc = Scenario::new(&scenario(json!([gpu(
        "GPU-0",
        json!([p(host.pid(), 100, 1), p(ghost, 200, 2)])
    )])));
    let agent = start(&sc, "process_detail = true\n");
    let snap = wait_snapshot(&agent, "the host entry", |s| container(s, None).is_some());
    let h = container(&snap, None).unwrap();
    assert_eq!(h["pod_uid"], Value::Null);
    assert_eq!(h["gpus"][0]["memory_used_bytes"], 300);
    assert_eq!(h["gpus"][0]["pids"], json!([host.pid(), ghost]));
    let procs = snap["processes"].as_array().unwrap();
    assert!(procs
        .iter()
        .any(|r| r["pid"] == json!(host.pid()) && r["comm"] == "sleep"));
    assert!(agent.stats()["gpu_processes_unresolved"].as_u64() >= Some(1));
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn mig_process_is_charged_to_its_mig_device() {
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&pod_path(&uid, &id));
    let w = Proc(cg.spawn(&mut sleeper()));
    let mig = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
    let mut dev = gpu("GPU-99999999-2222-3333-4444-555555555555", json!([]));
    dev["mig_devices"] = json!([
        {"uuid": "MIG-00000000-bbbb-cccc-dddd-eeeeeeeeeeee", "gpu_instance_id": 1,
         "compute_instance_id": 0, "memory_total": 10 * GIB, "memory_used": 0, "processes": []},
        {"uuid": mig, "gpu_instance_id": 2, "compute_instance_id": 0,
         "memory_total": 20 * GIB, "memory_used": 5 * GIB, "processes": [p(w.pid(), 5 * GIB, 0)]}
    ]);
    let sc = Scenario::new(&scenario(json!([dev])));
    let agent = start(&sc, "");
    // Two cycles at least: its memory time is credited. The MIG device cannot say its
    // processes' SM utilization (the scenario's 0 is not read): GPU time unknown, not 0.
    let snap = wait_snapshot(&agent, "the MIG container's memory time", |s| {
        container(s, Some(&id))
            .is_some_and(|c| c["gpus"][0]["memory_byte_seconds"].as_f64() > Some(0.0))
    });
    let g = &container(&snap, Some(&id)).unwrap()["gpus"][0];
    assert!(g["gpu_time_seconds"].is_null(), "{g}");
    assert_eq!(g["sm_util"], json!(null), "{g}");
    assert_eq!(g["uuid"], mig);
    assert_eq!(g["gpu_uuid"], "GPU-99999999-2222-3333-4444-555555555555");
    assert_eq!(g["memory_used_bytes"], json!(5 * GIB));
    let d = &snap["devices"][0];
    assert_eq!(d["mig_enabled"], true);
    assert_eq!(d["mig_devices"].as_array().unwrap().len(), 2);
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn a_gpu_lost_mid_run_is_marked_and_the_others_go_on() {
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&pod_path(&uid, &id));
    let a = Proc(cg.spawn(&mut sleeper()));
    let b = Proc(cg.spawn(&mut sleeper()));
    let healthy = scenario(json!([
        gpu("GPU-0", json!([p(a.pid(), GIB, 10)])),
        gpu("GPU-1", json!([p(b.pid(), 2 * GIB, 10)]))
    ]));
    let sc = Scenario::new(&healthy);
    let agent = start(&sc, "");
    wait_snapshot(&agent, "both GPUs", |s| {
        container(s, Some(&id)).is_some_and(|c| c["gpus"].as_array().unwrap().len() == 2)
    });
    let mut lost = healthy.clone();
    lost["devices"][0]["lost"] = json!(true);
    sc.write(&lost);
    let snap = wait_snapshot(&agent, "GPU-0 lost", |s| {
        s["devices"][0]["status"] == "lost"
    });
    assert_eq!(
        snap["devices"][0]["uuid"], "GPU-0",
        "a lost GPU keeps its name"
    );
    assert_eq!(snap["devices"][1]["status"], "ok");
    let g = &container(&snap, Some(&id)).unwrap()["gpus"];
    assert_eq!(g.as_array().unwrap().len(), 1);
    assert_eq!(g[0]["uuid"], "GPU-1");
    sc.write(&healthy);
    wait_snapshot(&agent, "GPU-0 back", |s| s["devices"][0]["status"] == "ok");
    assert_eq!(agent.stats()["mode"], "ebpf");
}

#[test]
#[ignore = "needs root: loads the eBPF programs"]
fn no_driver_degrades_and_recovers_by_itself() {
    let sc = Scenario::new(&json!({"driver_loaded": false, "devices": []}));
    let agent = start(&sc, "");
    agent.wait_until("nvml unavailable", Duration::from_secs(10), || {
        agent.stats()["nvml"]
            .as_str()
            .is_some_and(|s| s.starts_with("unavailable:"))
    });
    assert!(
        !agent.processes().is_empty(),
        "the process cache still answers"
    );
    assert!(agent.log().contains("NVML unavailable"));
    let w = Proc(sleeper().spawn().unwrap());
    sc.write(&scenario(json!([gpu("GPU-0", json!([p(w.pid(), 64, 0)]))])));
    // Retried with backoff (1 s, 2 s, ...): it comes back without a restart.
    let snap = wait_snapshot(&agent, "NVML to come back", |s| s["nvml"] == "ok");
    assert_eq!(snap["devices"].as_array().unwrap().len(), 1);
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn a_process_that_exits_before_the_join_still_counts_for_its_container() {
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&pod_path(&uid, &id));
    let w = Proc(cg.spawn(&mut sleeper()));
    let pid = w.pid();
    let sc = Scenario::new(&scenario(json!([gpu("GPU-0", json!([]))])));
    let agent = start(&sc, "[cache]\ntombstone_secs = 60\n");
    agent.wait_for_process(pid, "container_id", &json!(id));
    drop(w); // exits now; NVML's last sample still lists it
    agent.wait_until("the exit", Duration::from_secs(10), || {
        agent.process(pid).is_none()
    });
    sc.write(&scenario(json!([gpu("GPU-0", json!([p(pid, 123, 0)]))])));
    let snap = wait_snapshot(&agent, "the exited process", |s| {
        container(s, Some(&id)).is_some()
    });
    assert_eq!(
        container(&snap, Some(&id)).unwrap()["gpus"][0]["memory_used_bytes"],
        123
    );
    assert!(
        container(&snap, None).is_none(),
        "not misfiled under the host"
    );
}

/// A scenario file from tests/scenarios with its placeholder PIDs replaced by real ones.
fn scenario_file(name: &str, pids: &[(u64, u32)]) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(name);
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    fn remap(v: &mut Value, pids: &[(u64, u32)]) {
        match v {
            Value::Object(m) => {
                if let Some(Value::Number(n)) = m.get("pid") {
                    let old = n.as_u64().unwrap();
                    let new = pids.iter().find(|(o, _)| *o == old).map(|(_, n)| *n);
                    m.insert("pid".into(), json!(new.expect("unmapped placeholder pid")));
                }
                m.values_mut().for_each(|x| remap(x, pids));
            }
            Value::Array(a) => a.iter_mut().for_each(|x| remap(x, pids)),
            _ => {}
        }
    }
    remap(&mut v, pids);
    v
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn time_sliced_gpu_from_the_scenario_file_is_split_by_container() {
    let (ua, ia) = (random_uid(), random_hex(64));
    let (ub, ib) = (random_uid(), random_hex(64));
    let a = TestCgroup::v2(&pod_path(&ua, &ia));
    let b = TestCgroup::v2(&format!("/kubepods/besteffort/pod{ub}/{ib}"));
    let (a1, a2) = (Proc(a.spawn(&mut sleeper())), Proc(a.spawn(&mut sleeper())));
    let (b1, b2) = (Proc(b.spawn(&mut sleeper())), Proc(b.spawn(&mut sleeper())));
    let host = Proc(sleeper().spawn().unwrap());
    let v = scenario_file(
        "timesliced.json",
        &[
            (3001, a1.pid()),
            (3002, a2.pid()),
            (3003, b1.pid()),
            (3004, b2.pid()),
            (3005, host.pid()),
        ],
    );
    let sc = Scenario::new(&v);
    let agent = start(&sc, "");
    let snap = wait_snapshot(&agent, "three owners", |s| {
        s["containers"].as_array().is_some_and(|c| c.len() == 3)
    });
    let ga = &container(&snap, Some(&ia)).unwrap()["gpus"][0];
    assert_eq!(ga["memory_used_bytes"], json!(5 * GIB + 4 * GIB));
    assert_eq!(ga["sm_util"], json!(31 + 22));
    let gb = &container(&snap, Some(&ib)).unwrap()["gpus"][0];
    assert_eq!(gb["memory_used_bytes"], json!(3 * GIB + 2 * GIB));
    assert_eq!(gb["sm_util"], json!(17 + 8));
    // The idle process holds memory and has no utilization sample: 0, not missing.
    let gh = &container(&snap, None).unwrap()["gpus"][0];
    assert_eq!(gh["memory_used_bytes"], json!(1610612736u64));
    assert_eq!(gh["sm_util"], 0);
    assert_eq!(ga["uuid"], gb["uuid"], "one physical GPU, shared");
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn mig_node_from_the_scenario_file_charges_each_mig_device() {
    let ids: Vec<(String, String)> = (0..3).map(|_| (random_uid(), random_hex(64))).collect();
    let cgs: Vec<TestCgroup> = ids
        .iter()
        .map(|(u, i)| TestCgroup::v2(&pod_path(u, i)))
        .collect();
    let x = Proc(cgs[0].spawn(&mut sleeper()));
    let (y1, y2) = (
        Proc(cgs[1].spawn(&mut sleeper())),
        Proc(cgs[1].spawn(&mut sleeper())),
    );
    let z = Proc(cgs[2].spawn(&mut sleeper()));
    let v = scenario_file(
        "a100-mig.json",
        &[
            (2001, x.pid()),
            (2101, y1.pid()),
            (2102, y2.pid()),
            (2201, z.pid()),
        ],
    );
    let sc = Scenario::new(&v);
    let agent = start(&sc, "");
    let snap = wait_snapshot(&agent, "three pods", |s| {
        ids.iter().all(|(_, i)| container(s, Some(i)).is_some())
    });
    let gpu_of = |i: usize| container(&snap, Some(&ids[i].1)).unwrap()["gpus"].clone();
    assert_eq!(
        gpu_of(0)[0]["uuid"],
        "MIG-22ac4f22-4f5a-4872-a37f-2aab8a87f66b"
    );
    assert_eq!(
        gpu_of(1)[0]["uuid"],
        "MIG-4f06c904-75ca-4d7d-a0bb-51f2b99055b2"
    );
    assert_eq!(gpu_of(1)[0]["pids"].as_array().unwrap().len(), 2);
    assert_eq!(
        gpu_of(0)[0]["gpu_uuid"],
        "GPU-4e30fb2f-3875-41f4-b9bd-71c8bb5975b1"
    );
    // MIG GPUs give no per-process utilization: unknown, not zero.
    assert_eq!(gpu_of(0)[0]["sm_util"], Value::Null);
    assert_eq!(
        gpu_of(2)[0]["uuid"],
        "GPU-63cec0a8-4407-4d47-b648-2810cfd27329"
    );
}

/// What a device's uuid fixes (a GPU's name, PCI bus and minor number; a MIG device's
/// instance ids and profile) is read once per uuid, not every cycle. A MIG device made
/// again under the running agent has a new uuid: it is read then, and its process is
/// charged to it.
#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn fixed_readings_are_read_once_per_uuid_and_again_after_a_mig_reconfiguration() {
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&pod_path(&uid, &id));
    let w = Proc(cg.spawn(&mut sleeper()));
    let (old, new) = (
        "MIG-11111111-bbbb-cccc-dddd-eeeeeeeeeeee",
        "MIG-22222222-bbbb-cccc-dddd-eeeeeeeeeeee",
    );
    let mig = |uuid: &str, gi: u32, profile: &str| {
        json!({"uuid": uuid, "gpu_instance_id": gi, "compute_instance_id": 0,
               "name": format!("NVIDIA H100 80GB HBM3 MIG {profile}"),
               "memory_total": 10 * GIB, "memory_used": GIB,
               "processes": [p(w.pid(), GIB, 0)]})
    };
    let mut dev = gpu("GPU-99999999-2222-3333-4444-666666666666", json!([]));
    dev["mig_devices"] = json!([mig(old, 1, "1g.10gb")]);
    let sc = Scenario::new(&scenario(json!([dev.clone()])));
    let calls = Calls::new();
    let agent = start_counting(&sc, "", &calls);
    let on = |s: &Value, uuid: &str| {
        container(s, Some(&id)).is_some_and(|c| c["gpus"][0]["uuid"] == uuid)
    };
    wait_snapshot(&agent, "the container on the first MIG device", |s| {
        on(s, old)
    });
    let count = |f: &str| calls.count(f);
    let fixed = [
        "nvmlDeviceGetName",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetMinorNumber",
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetComputeInstanceId",
    ];
    // The record is written at the start of a cycle: two more, and it holds the first.
    calls.wait_cycles(2);
    let before: Vec<u64> = fixed.iter().map(|f| count(f)).collect();
    let c0 = calls.cycles();
    calls.wait_cycles(5);
    assert!(calls.cycles() >= c0 + 5);
    for (f, b) in fixed.iter().zip(&before) {
        assert_eq!(count(f), *b, "{f} is not read again for the same uuids");
    }
    assert!(
        before.iter().all(|b| *b >= 1),
        "each was read once: {before:?}"
    );
    // The MIG device destroyed and made again (another instance, another profile).
    dev["mig_devices"] = json!([mig(new, 3, "2g.20gb")]);
    sc.write(&scenario(json!([dev])));
    let s = wait_snapshot(&agent, "the container on the new MIG device", |s| {
        on(s, new)
    });
    let m = &s["devices"][0]["mig_devices"][0];
    assert_eq!(m["uuid"], new);
    assert_eq!(m["gpu_instance_id"], 3);
    assert_eq!(m["profile"], "2g.20gb");
    calls.wait_cycles(2);
    assert!(
        count("nvmlDeviceGetGpuInstanceId") > before[3],
        "the new uuid was read"
    );
}

/// A GPU with many processes has its process lists held between reads (a real driver takes
/// about 50 µs per listed process): not read again while nothing moves, read at once when
/// the device's memory in use moves or a new PID shows up in its utilization samples.
#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn a_crowded_gpu_s_process_lists_are_held_until_something_moves() {
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&pod_path(&uid, &id));
    let w = Proc(cg.spawn(&mut sleeper()));
    // 40 processes: the container's, and 39 that no host has (above any pid_max in use).
    let others = |n: u32| (0..n).map(|i| p(4_190_000 + i, 256 << 20, 0));
    let device = |own: u64, used: u64, extra: Vec<Value>| {
        let mut procs: Vec<Value> = vec![p(w.pid(), own, 10)];
        procs.extend(others(39).chain(extra));
        let mut d = gpu("GPU-77777777-2222-3333-4444-666666666666", json!(procs));
        d["memory_used"] = json!(used);
        scenario(json!([d]))
    };
    let sc = Scenario::new(&device(GIB, 50 * GIB, vec![]));
    let calls = Calls::new();
    let agent = start_counting(&sc, "crowded_list_interval_ms = 60000\n", &calls);
    let memory =
        |s: &Value| container(s, Some(&id)).map(|c| c["gpus"][0]["memory_used_bytes"].clone());
    wait_snapshot(&agent, "the container's 1 GiB", |s| {
        memory(s) == Some(json!(GIB))
    });
    let lists = || calls.count("nvmlDeviceGetComputeRunningProcesses");
    let wait_cycles = |n| calls.wait_cycles(n);
    wait_cycles(2);
    let held = lists();
    wait_cycles(5);
    assert_eq!(lists(), held, "the lists are held while nothing moves");
    assert!(
        agent.log().contains("a crowded GPU"),
        "the agent says so once: {}",
        agent.log()
    );
    // The process grows by less than the device's memory moves: still held.
    sc.write(&device(GIB + (32 << 20), 50 * GIB, vec![]));
    wait_cycles(5);
    assert_eq!(lists(), held);
    let s = agent.json("/debug/snapshot");
    assert_eq!(memory(&s), Some(json!(GIB)), "the held list's memory");
    // The device's memory moves by a GiB: read at once.
    sc.write(&device(2 * GIB, 51 * GIB, vec![]));
    wait_snapshot(&agent, "the container's 2 GiB", |s| {
        memory(s) == Some(json!(2 * GIB))
    });
    wait_cycles(2); // the record is written at the start of a cycle
    assert!(lists() > held, "read again");
    let held = lists();
    wait_cycles(5);
    assert_eq!(lists(), held, "and held again");
    // A new process computes (in the utilization samples) and holds no more than the
    // threshold: read at once all the same.
    let new = p(4_190_100, 16 << 20, 50);
    sc.write(&device(2 * GIB, 51 * GIB, vec![new]));
    let host_pids = |s: &Value| container(s, None).map(|c| c["gpus"][0]["pids"].clone());
    wait_snapshot(&agent, "the new process on the host entry", |s| {
        host_pids(s).is_some_and(|p| p.as_array().unwrap().contains(&json!(4_190_100)))
    });
    wait_cycles(2);
    assert!(lists() > held, "read again for the new PID");
}

/// A GPU with a few processes has its process lists held while nothing at all moves (its
/// memory in use, the PIDs in its utilization samples): what can be stale is a process's
/// own memory when the device's total stays the same, for 10 s at most. A process that
/// starts or ends computing, or memory the device gains or frees, reads them at once.
/// An XID on a GPU has its own readings (its ECC counts here) read the next cycle, not up
/// to a slow interval later: a fault moves them.
#[test]
#[ignore = "needs root: loads the eBPF programs"]
fn an_xid_has_the_gpus_own_readings_read_at_once() {
    let mut d = gpu("GPU-77777777-2222-3333-4444-666666666666", json!([]));
    d["ecc_uncorrected"] = json!(0);
    let sc = Scenario::new(&scenario(json!([d.clone()])));
    let agent = start(&sc, "slow_interval_ms = 60000\n");
    let ecc = |s: &Value| s["devices"][0]["ecc_uncorrected"].as_u64();
    wait_snapshot(&agent, "the GPU", |s| ecc(s) == Some(0));
    // Past the first two cycles, which read everything.
    std::thread::sleep(Duration::from_millis(600));
    d["ecc_uncorrected"] = json!(1);
    sc.write(&scenario(json!([d.clone()])));
    std::thread::sleep(Duration::from_millis(1000));
    let s = agent.json("/debug/snapshot");
    assert_eq!(ecc(&s), Some(0), "held: the slow interval is a minute");
    d["xid_events"] = json!([{"xid": 48}]);
    sc.write(&scenario(json!([d])));
    let at = Instant::now();
    wait_snapshot(&agent, "the new count", |s| ecc(s) == Some(1));
    assert!(
        at.elapsed() < tests::slow(Duration::from_secs(2)),
        "{:?}",
        at.elapsed()
    );
}

/// Per-process utilization is asked in one call, its buffer sized for the processes listed
/// and a few more. Twelve processes that start with no memory of their own, while the
/// GPU's held list names one, do not fit: the call is made again with room for them, and
/// the cycle that first lists them has their utilization.
#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn more_utilization_samples_than_the_buffer_holds_are_read_in_the_same_cycle() {
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&pod_path(&uid, &id));
    let w = Proc(cg.spawn(&mut sleeper()));
    // Above any pid_max in use: the host entry's.
    let others: Vec<u32> = (4_192_000..4_192_012).collect();
    let device = |others: &[u32]| {
        let mut procs = vec![p(w.pid(), GIB, 10)];
        procs.extend(others.iter().map(|&pid| p(pid, 0, 5)));
        let mut d = gpu("GPU-99999999-2222-3333-4444-666666666666", json!(procs));
        d["memory_used"] = json!(20 * GIB);
        scenario(json!([d]))
    };
    let sc = Scenario::new(&device(&[]));
    let calls = Calls::new();
    let agent = start_counting(&sc, "", &calls);
    let host = |s: &Value| container(s, None).map(|c| c["gpus"][0].clone());
    wait_snapshot(&agent, "the container", |s| {
        container(s, Some(&id)).is_some()
    });
    calls.wait_cycles(3);
    let asked = || calls.count("nvmlDeviceGetProcessUtilization");
    let (c0, a0) = (calls.cycles(), asked());
    calls.wait_cycles(3);
    let (c1, a1) = (calls.cycles(), asked());
    assert_eq!(a1 - a0, c1 - c0, "one call a cycle while the samples fit");
    sc.write(&device(&others));
    let s = wait_snapshot(&agent, "the twelve listed", |s| {
        host(s).is_some_and(|g| g["pids"].as_array().is_some_and(|p| p.len() == 12))
    });
    let g = host(&s).unwrap();
    assert_eq!(
        g["sm_util"],
        json!(12 * 5),
        "their samples, in the cycle that lists them"
    );
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn a_gpu_s_process_lists_are_held_while_nothing_moves_and_10_s_at_most() {
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&pod_path(&uid, &id));
    let w = Proc(cg.spawn(&mut sleeper()));
    // The container's process and two that no host has (above any pid_max in use).
    let device = |own: u64, used: u64, others: &[u32]| {
        let mut procs = vec![p(w.pid(), own, 10)];
        procs.extend(others.iter().map(|&pid| p(pid, 256 << 20, 5)));
        let mut d = gpu("GPU-88888888-2222-3333-4444-666666666666", json!(procs));
        d["memory_used"] = json!(used);
        scenario(json!([d]))
    };
    let (a, b) = (4_191_000, 4_191_001);
    let sc = Scenario::new(&device(GIB, 20 * GIB, &[a, b]));
    let calls = Calls::new();
    let agent = start_counting(&sc, "", &calls);
    let memory =
        |s: &Value| container(s, Some(&id)).map(|c| c["gpus"][0]["memory_used_bytes"].clone());
    let host_pids = |s: &Value| {
        container(s, None).map_or(vec![], |c| c["gpus"][0]["pids"].as_array().unwrap().clone())
    };
    wait_snapshot(&agent, "the container's 1 GiB", |s| {
        memory(s) == Some(json!(GIB))
    });
    let lists = || calls.count("nvmlDeviceGetComputeRunningProcesses");
    calls.wait_cycles(2);
    let held = lists();
    calls.wait_cycles(5);
    assert_eq!(lists(), held, "held while nothing moves");

    // The process grows while the device's total stays: stale, then read within 10 s.
    sc.write(&device(2 * GIB, 20 * GIB, &[a, b]));
    let written = Instant::now();
    calls.wait_cycles(5);
    let s = agent.json("/debug/snapshot");
    assert_eq!(memory(&s), Some(json!(GIB)), "the held list's memory");
    agent.wait_snapshot(Duration::from_secs(15), "the 2 GiB, at the latest", |s| {
        memory(s) == Some(json!(2 * GIB))
    });
    let stale = written.elapsed();
    assert!(stale < Duration::from_millis(11_000), "stale for {stale:?}");

    // A process ends (no more utilization samples): read at once.
    calls.wait_cycles(2);
    let held = lists();
    sc.write(&device(2 * GIB, 20 * GIB, &[a]));
    let ended = Instant::now();
    wait_snapshot(&agent, "the ended process gone", |s| {
        !host_pids(s).contains(&json!(b))
    });
    assert!(
        ended.elapsed() < Duration::from_secs(2),
        "{:?}",
        ended.elapsed()
    );
    calls.wait_cycles(2); // the record is written at the start of a cycle
    assert!(lists() > held, "read again");

    // The device's memory moves by a byte: read at once.
    calls.wait_cycles(2);
    sc.write(&device(3 * GIB, 20 * GIB + 1, &[a]));
    let moved = Instant::now();
    wait_snapshot(&agent, "the container's 3 GiB", |s| {
        memory(s) == Some(json!(3 * GIB))
    });
    assert!(
        moved.elapsed() < Duration::from_secs(2),
        "{:?}",
        moved.elapsed()
    );
}
