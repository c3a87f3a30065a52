//! A wedged driver, as on a GPU fallen off the bus (Xid 79): every NVML call on the GPU
//! blocks. Simulated with fake-nvml's `hang` entries on the 8-GPU node, through the real
//! nvml-wrapper path. The agent must say so, export nothing of that GPU as current, keep
//! reading the others, recover by itself, and still stop on SIGTERM.
use std::{
    collections::BTreeMap,
    io::Write,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering::Relaxed},
        Arc,
    },
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use tests::{
    dcgm_node::{scenario, uuid, DcgmNode, MIG_UUID},
    http, read_json_lines, slow, Agent,
};

const NO_KMSG: &str = "[xid]\nkmsg = \"\"\n";
/// The agent samples every 200 ms (the node's config); a GPU is stalled after 1 s.
const STALL: &str = "stall_timeout_ms = 1000";
const CYCLE: Duration = Duration::from_millis(200);

/// The node's scenario with `hang` entries.
fn hang(node: &DcgmNode, entries: Value) {
    hang_with_xids(node, entries, &[]);
}

/// `hang`, with XID events (GPU index, code) delivered through NVML's event API.
fn hang_with_xids(node: &DcgmNode, entries: Value, xids: &[(usize, u64)]) {
    let mut v = scenario(&node.pods, &node.pids(), xids);
    v["hang"] = entries;
    node.scenario.write(&v);
}

/// The node's kernel log, as the agent reads it: a file that exists before it starts.
fn kmsg(node: &DcgmNode) -> PathBuf {
    let path = node.dir.join("kmsg");
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap();
    path
}

fn metrics(agent: &Agent) -> String {
    http::get(&agent.addr, "/metrics").unwrap().1
}

/// The series of `family` for GPU `i` (by its uuid), as lines.
fn series<'a>(text: &'a str, family: &str, i: usize) -> Vec<&'a str> {
    let id = format!("hw_id=\"{}\"", uuid(i));
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")) && l.contains(&id))
        .collect()
}

fn device(snap: &Value, i: usize) -> Option<&Value> {
    snap["devices"]
        .as_array()?
        .iter()
        .find(|d| d["index"].as_u64() == Some(i as u64))
}

fn all_ok(snap: &Value) -> bool {
    (0..8).all(|i| device(snap, i).is_some_and(|d| d["status"] == "ok"))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn start(node: &DcgmNode) -> Agent {
    start_with(node, NO_KMSG)
}

fn start_with(node: &DcgmNode, extra_config: &str) -> Agent {
    let agent = node.agent_nvml(STALL, extra_config, &["--prometheus-compat", "dcgm"]);
    agent.wait_snapshot(Duration::from_secs(20), "8 GPUs answering", all_ok);
    agent
}

/// The seconds the agent logged GPU `i` had not answered for when it answered again.
fn logged_recovery_secs(agent: &Agent, i: usize) -> u64 {
    let log = agent.log();
    let head = format!("GPU {i} answers again, after ");
    let at = log
        .find(&head)
        .unwrap_or_else(|| panic!("no `{head}`:\n{log}"));
    let rest = &log[at + head.len()..];
    rest[..rest.find(' ').unwrap()].parse().unwrap()
}

#[test]
fn one_hung_gpu_is_stalled_while_the_other_seven_stay_fresh_and_it_recovers() {
    let node = DcgmNode::start(false);
    let log = kmsg(&node);
    let agent = start_with(&node, &format!("[xid]\nkmsg = \"{}\"\n", log.display()));
    assert_eq!(series(&metrics(&agent), "hw_power_watts", 3).len(), 1);
    // The pod that holds GPU 3 (and runs nothing) has an open stretch there, once the
    // kubelet's allocations are read.
    let deadline = Instant::now() + Duration::from_secs(10);
    while series(&metrics(&agent), "container_gpu_share", 3).len() != 1 {
        assert!(Instant::now() < deadline, "{}", metrics(&agent));
        std::thread::sleep(Duration::from_millis(50));
    }
    let hung = Instant::now();
    // Fallen off the bus: the driver says so in the kernel log and through NVML's events,
    // whose device the agent must not ask for its uuid (that call blocks too).
    hang_with_xids(&node, json!([{"call": "*", "device": 3}]), &[(3, 79)]);
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    writeln!(
        f,
        "NVRM: Xid (PCI:0000:48:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off \
         the bus."
    )
    .unwrap();
    let snap = agent.wait_snapshot(Duration::from_secs(10), "GPU 3 stalled", |s| {
        device(s, 3).is_some_and(|d| d["status"].as_str().unwrap_or("").starts_with("stalled: "))
    });
    let detected = hung.elapsed();
    let d3 = device(&snap, 3).unwrap();
    assert!(
        d3["power_mw"].is_null(),
        "no reading of a stalled GPU: {d3}"
    );
    let stats = agent.stats();
    let nvml = stats["nvml"].as_str().unwrap();
    assert!(
        nvml.starts_with("stalled: ")
            && nvml.contains(&format!("on GPU 3 ({})", uuid(3)))
            && nvml.ends_with("; Xid 79: the GPU has fallen off the bus"),
        "{stats:#}"
    );
    // Besides the /proc mode's reason (this node runs without eBPF).
    let degraded = stats["degraded_reason"].as_str().unwrap();
    assert!(degraded.ends_with(nvml), "{stats:#}");
    let text = metrics(&agent);
    let stalled = series(&text, "gpu_agent_nvml_stalled", 3);
    assert!(stalled.len() == 1 && stalled[0].ends_with(" 1"), "{text}");
    assert!(series(&text, "gpu_agent_nvml_stalled", 0)[0].ends_with(" 0"));
    assert!(series(&text, "hw_power_watts", 3).is_empty(), "{text}");
    // Nor its container's: the stretch on it ended at its last good sample.
    for family in ["container_gpu_share", "container_gpu_sm_share"] {
        assert!(series(&text, family, 3).is_empty(), "{text}");
    }
    // dcgm-exporter's names: the GPU's series go absent, as when DCGM stops answering.
    let dcgm_power = |i: usize| {
        let id = format!("UUID=\"{}\"", uuid(i));
        text.lines()
            .filter(|l| l.starts_with("DCGM_FI_DEV_POWER_USAGE{") && l.contains(&id))
            .count()
    };
    assert!(dcgm_power(3) == 0 && dcgm_power(0) > 0, "{text}");
    assert!(series(&text, "hw_status", 3)
        .iter()
        .any(|l| l.contains("hw_state=\"failed\"") && l.ends_with(" 1")));
    let warned = agent.log();
    let warn = warned.lines().find(|l| l.contains("GPU 3 not answering"));
    assert!(
        warn.is_some_and(|l| l.contains("Xid 79: the GPU has fallen off the bus")),
        "{warned}"
    );

    // Held for 30 s and at least 25 checks (a loaded machine makes fewer a second): the
    // other seven are read every cycle all along.
    let end = Instant::now() + Duration::from_secs(30);
    let mut last = snap["taken_at_ms"].as_u64().unwrap();
    let (mut fresh, mut oldest) = (0, 0);
    while Instant::now() < end || fresh < 25 {
        std::thread::sleep(Duration::from_millis(1000));
        let s = agent.json("/debug/snapshot");
        let t = s["taken_at_ms"].as_u64().unwrap();
        assert!(t > last, "no new sample in a second: {s:#}");
        oldest = oldest.max(now_ms().saturating_sub(t));
        last = t;
        for i in (0..8).filter(|&i| i != 3) {
            let d = device(&s, i).unwrap_or_else(|| panic!("GPU {i} missing: {s:#}"));
            assert_eq!(d["status"], "ok", "{d}");
            assert!(d["power_mw"].as_u64().is_some(), "{d}");
        }
        assert!(device(&s, 3).unwrap()["power_mw"].is_null());
        fresh += 1;
        let text = metrics(&agent);
        assert_eq!(series(&text, "hw_power_watts", 0).len(), 1, "{text}");
    }

    // The call returns: fresh values within two cycles, and a log line that says how long
    // it had not answered.
    hang(&node, json!([]));
    let back = Instant::now();
    let hang_secs = (back - hung).as_secs_f64();
    let deadline = back + Duration::from_secs(5);
    while !device(&agent.json("/debug/snapshot"), 3)
        .is_some_and(|d| d["status"] == "ok" && d["power_mw"].is_u64())
    {
        assert!(
            Instant::now() < deadline,
            "GPU 3 not back:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = back.elapsed();
    // Two cycles, fake-nvml's look at its file (every 100 ms, the blocked call every
    // 25 ms), and room for a loaded 2-core machine; stretched as every wait is
    // (`GPU_AGENT_TEST_TIME_SCALE`, which `cargo xtask test --under-load` sets).
    let bound = slow(CYCLE * 2 + Duration::from_millis(125 + 375));
    assert!(took < bound, "recovered in {took:?}, more than {bound:?}");
    eprintln!(
        "wedged GPU: stalled reported {:.1} s after the hang (timeout 1 s, 200 ms cycles); \
         the other seven fresh in {fresh} of {fresh} checks, the newest sample at most \
         {oldest} ms old; fresh values {} ms after the call returned",
        detected.as_secs_f64(),
        took.as_millis()
    );
    assert_eq!(agent.stats()["nvml"], "ok");
    // Whole seconds, truncated: the hang as the agent timed it, from its call to the
    // answer, is `said` to `said + 1`. The test's own timing differs from it by the time
    // the hang took to reach the call and the answer to reach the log.
    let said = logged_recovery_secs(&agent, 3) as f64;
    let slack = slow(Duration::from_millis(500)).as_secs_f64();
    assert!(
        said <= hang_secs + slack && said + 1.0 >= hang_secs - slack,
        "logged {said} s without an answer, the hang lasted {hang_secs:.1} s"
    );
    let text = metrics(&agent);
    assert!(series(&text, "gpu_agent_nvml_stalled", 3)[0].ends_with(" 0"));
    assert_eq!(series(&text, "hw_power_watts", 3).len(), 1);
    // A new stretch of the allocation once the GPU answers.
    assert_eq!(series(&text, "container_gpu_share", 3).len(), 1, "{text}");
}

#[test]
fn every_gpu_hung_exports_no_reading_and_the_agent_stays_up() {
    let node = DcgmNode::start(false);
    let agent = start(&node);
    hang(&node, json!([{"call": "*"}]));
    agent.wait_snapshot(Duration::from_secs(10), "every GPU stalled", |s| {
        (0..8).all(|i| {
            device(s, i).is_some_and(|d| d["status"].as_str().unwrap_or("").starts_with("stalled"))
        })
    });
    let nvml = agent.stats()["nvml"].as_str().unwrap().to_string();
    assert!(nvml.contains("(and 7 more GPUs)"), "{nvml}");
    let text = metrics(&agent);
    for family in [
        "hw_power_watts",
        "hw_gpu_utilization_ratio",
        "hw_temperature_celsius",
    ] {
        assert!(
            !text.lines().any(|l| l.starts_with(&format!("{family}{{"))),
            "{family} served for a stalled GPU:\n{text}"
        );
    }
    assert_eq!(text.matches("gpu_agent_nvml_stalled{").count(), 8);
    assert_eq!(http::get(&agent.addr, "/healthz").unwrap().0, 200);
    hang(&node, json!([]));
    agent.wait_snapshot(Duration::from_secs(5), "every GPU back", all_ok);
}

#[test]
fn a_hung_init_leaves_the_agent_up_saying_why_until_it_returns() {
    let node = DcgmNode::start(false);
    hang(&node, json!([{"call": "nvmlInit_v2"}]));
    let agent = node.agent_nvml(STALL, NO_KMSG, &["--prometheus"]);
    agent.wait_until(
        "NVML reported stalled in init",
        Duration::from_secs(10),
        || {
            agent.stats()["nvml"]
                .as_str()
                .is_some_and(|s| s.starts_with("stalled: nvmlInit_v2 for "))
        },
    );
    assert!(agent.json("/debug/snapshot")["devices"]
        .as_array()
        .unwrap()
        .is_empty());
    assert!(
        agent.log().contains("NVML not answering"),
        "{}",
        agent.log()
    );
    hang(&node, json!([]));
    agent.wait_snapshot(
        Duration::from_secs(10),
        "8 GPUs after init returned",
        all_ok,
    );
    assert_eq!(agent.stats()["nvml"], "ok");
    agent.wait_until("NVML said to answer again", Duration::from_secs(2), || {
        agent.log().contains("NVML answers again, after ")
    });
}

#[test]
fn sigterm_ends_the_agent_while_a_gpu_call_is_blocked() {
    let node = DcgmNode::start(false);
    let agent = start(&node);
    hang(&node, json!([{"call": "*", "device": 5}]));
    agent.wait_snapshot(Duration::from_secs(10), "GPU 5 stalled", |s| {
        device(s, 5).is_some_and(|d| d["status"].as_str().unwrap_or("").starts_with("stalled"))
    });
    let t = Instant::now();
    let status = agent.stop();
    let took = t.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(5), "stopped in {took:?}");
}

/// Each sample the snapshot showed, by its time: whether GPUs 1 to 7 were all in it, ok.
fn watch_samples(addr: &str, stop: &AtomicBool) -> BTreeMap<u64, bool> {
    let mut seen = BTreeMap::new();
    while !stop.load(Relaxed) {
        let s: Value =
            serde_json::from_str(&http::get(addr, "/debug/snapshot").unwrap().1).unwrap();
        let healthy = (1..8).all(|i| device(&s, i).is_some_and(|d| d["status"] == "ok"));
        seen.insert(s["taken_at_ms"].as_u64().unwrap(), healthy);
        std::thread::sleep(Duration::from_millis(10));
    }
    seen
}

/// A GPU that hangs now and then (slow, or about to fall off the bus) costs the GPUs after
/// it nothing: they are in every sample, so the usage records of their containers run on
/// unbroken. A GPU missing from one sample would end its stretches there.
#[test]
fn the_gpus_after_one_that_hangs_at_times_are_in_every_sample() {
    let node = DcgmNode::start(false);
    let file = node.dir.join("usage.jsonl");
    // Stalled only after 3 s: the hangs of 600 ms below stay well short of it on a loaded
    // machine too, where lifting one can be late.
    let config = format!("{NO_KMSG}[usage]\nfile = \"{}\"\n", file.display());
    let args = ["--prometheus-compat", "dcgm"];
    let agent = node.agent_nvml("stall_timeout_ms = 3000", &config, &args);
    agent.wait_snapshot(Duration::from_secs(20), "8 GPUs answering", all_ok);
    // Every pod's allocation has its stretch open.
    agent.wait_snapshot(Duration::from_secs(10), "the pods' allocations", |s| {
        let held = |c: &&Value| {
            c["allocated_gpus"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
        };
        s["containers"]
            .as_array()
            .map_or(0, |cs| cs.iter().filter(held).count())
            == 6
    });
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (addr, stop) = (agent.addr.clone(), stop.clone());
        std::thread::spawn(move || watch_samples(&addr, &stop))
    };
    // GPU 0 blocks for 600 ms at a time, three cycles; lifted before it is stalled (3 s).
    for _ in 0..5 {
        hang(&node, json!([{"call": "*", "device": 0}]));
        std::thread::sleep(Duration::from_millis(600));
        hang(&node, json!([]));
        std::thread::sleep(Duration::from_millis(600));
    }
    stop.store(true, Relaxed);
    let seen = watcher.join().unwrap();
    let missing: Vec<_> = seen.iter().filter(|(_, ok)| !**ok).collect();
    assert!(seen.len() >= 20, "{} samples seen", seen.len());
    assert!(missing.is_empty(), "samples without GPUs 1-7: {missing:?}");
    let log = agent.log();
    assert!(!log.contains("not answering"), "never stalled:\n{log}");
    assert!(agent.stop().success());

    // One record per container and device, cut by nothing but the agent's stop.
    let records = read_json_lines(&file);
    let on = |pod: &str, device: &str| -> Vec<&Value> {
        let id = &node.pod(pod).id;
        let mine = |r: &&Value| r["container_id"] == *id && r["uuid"] == device;
        records.iter().filter(mine).collect()
    };
    for (pod, device) in [
        ("trainer-b", uuid(1)),
        ("shared-1", uuid(2)),
        ("shared-2", uuid(2)),
        ("idle-d", uuid(3)),
        ("mig-e", MIG_UUID.to_string()),
    ] {
        let rs = on(pod, &device);
        assert!(
            rs.len() == 1 && rs[0]["reason"] == "agent_stopped",
            "{pod} on {device}: {rs:#?}"
        );
    }
    // GPU 0's own stretch ends each time it misses a sample.
    assert!(on("trainer-a", &uuid(0)).len() > 1, "{records:#?}");
}

/// The device count hangs on a running node (a cycle's first call): NVML is said stalled
/// in it, no GPU's last readings are served, the agent stays up, and it recovers.
#[test]
fn a_hung_device_count_serves_no_readings_and_recovers() {
    let node = DcgmNode::start(false);
    let agent = start(&node);
    agent.wait_snapshot(Duration::from_secs(10), "8 GPUs", all_ok);
    assert_eq!(series(&metrics(&agent), "hw_power_watts", 0).len(), 1);
    hang(&node, json!([{"call": "nvmlDeviceGetCount_v2"}]));
    agent.wait_until("NVML stalled in the count", Duration::from_secs(10), || {
        agent.stats()["nvml"]
            .as_str()
            .is_some_and(|s| s.starts_with("stalled: nvmlDeviceGetCount"))
    });
    let text = metrics(&agent);
    assert!(
        !text.lines().any(|l| l.starts_with("hw_power_watts{")),
        "last readings served while NVML is stalled:\n{text}"
    );
    assert_eq!(http::get(&agent.addr, "/healthz").unwrap().0, 200);
    hang(&node, json!([]));
    agent.wait_snapshot(
        Duration::from_secs(10),
        "8 GPUs after the count returned",
        all_ok,
    );
    assert_eq!(agent.stats()["nvml"], "ok");
    assert_eq!(series(&metrics(&agent), "hw_power_watts", 0).len(), 1);
}
