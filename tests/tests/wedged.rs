//! A wedged driver, as on a GPU fallen off the bus (Xid 79): every NVML call on the GPU
//! blocks. Simulated with fake-nvml's `hang` entries on the 8-GPU node, through the real
//! nvml-wrapper path. The agent must say so, export nothing of that GPU as current, keep
//! reading the others, recover by itself, and still stop on SIGTERM.
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tests::{
    dcgm_node::{scenario, uuid, DcgmNode},
    http, Agent,
};

const NO_KMSG: &str = "[xid]\nkmsg = \"\"\n";
/// The agent samples every 200 ms (the node's config); a GPU is stalled after 1 s.
const STALL: &str = "stall_timeout_ms = 1000";

/// The node's scenario with `hang` entries.
fn hang(node: &DcgmNode, entries: Value) {
    let mut v = scenario(&node.pods, &node.pids(), &[]);
    v["hang"] = entries;
    node.scenario.write(&v);
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
    let agent = node.agent_nvml(STALL, NO_KMSG, &["--prometheus-compat", "dcgm"]);
    agent.wait_snapshot(Duration::from_secs(20), "8 GPUs answering", all_ok);
    agent
}

#[test]
fn one_hung_gpu_is_stalled_while_the_other_seven_stay_fresh_and_it_recovers() {
    let node = DcgmNode::start(false);
    let agent = start(&node);
    assert_eq!(series(&metrics(&agent), "hw_power_watts", 3).len(), 1);
    let hung = Instant::now();
    hang(&node, json!([{"call": "*", "device": 3}]));
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
        nvml.starts_with("stalled: ") && nvml.contains(&format!("on GPU 3 ({})", uuid(3))),
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
    assert!(
        agent.log().contains("GPU 3 not answering"),
        "{}",
        agent.log()
    );

    // Held for 30 s: the other seven are read every cycle all along.
    let end = Instant::now() + Duration::from_secs(30);
    let mut last = snap["taken_at_ms"].as_u64().unwrap();
    let (mut fresh, mut oldest) = (0, 0);
    while Instant::now() < end {
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
    assert!(fresh >= 25);

    // The call returns: fresh values within two cycles of the next read, and a log line.
    hang(&node, json!([]));
    let back = Instant::now();
    agent.wait_snapshot(Duration::from_secs(5), "GPU 3 answering again", |s| {
        device(s, 3).is_some_and(|d| d["status"] == "ok" && d["power_mw"].is_u64())
    });
    let took = back.elapsed();
    assert!(took < Duration::from_secs(2), "recovered in {took:?}");
    eprintln!(
        "wedged GPU: stalled reported {:.1} s after the hang (timeout 1 s, 200 ms cycles); \
         the other seven fresh in {fresh} of {fresh} checks, the newest sample at most \
         {oldest} ms old; fresh values {} ms after the call returned",
        detected.as_secs_f64(),
        took.as_millis()
    );
    assert_eq!(agent.stats()["nvml"], "ok");
    assert!(
        agent.log().contains("GPU 3 answers again"),
        "{}",
        agent.log()
    );
    let text = metrics(&agent);
    assert!(series(&text, "gpu_agent_nvml_stalled", 3)[0].ends_with(" 0"));
    assert_eq!(series(&text, "hw_power_watts", 3).len(), 1);
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
