//! Rightsizing's known answer, end to end: an 8-GPU node (seven H100s and an L4) with real
//! processes in pod cgroups, pods named and labelled by the fake CRI server and allocated
//! GPUs by the fake kubelet, the agent writing its usage records (cut into checkpoints),
//! and `gpu-agent rightsize` reading them back; and a real Prometheus scraping the same
//! agent with the recording rules, from which `rightsize --prometheus` gives the same
//! answer.
use std::{collections::BTreeMap, time::Duration};

use serde_json::{json, Value};
use tests::{
    cgroups::{sleeper, systemd_container, Proc, TestCgroup},
    container,
    fake_node::{metadata_config, FakeContainer, FakeNode, World},
    fake_nvml_lib,
    nvml::Scenario,
    prom::Prometheus,
    random_hex, random_uid, read_json_lines,
    rightsize::{rightsize, rightsize_json, rightsize_json_from},
    Agent, TempDir as Dir,
};

const GIB: u64 = 1 << 30;
const H100: &str = "NVIDIA H100 80GB HBM3";
const L4: &str = "NVIDIA L4";
/// The L4's memory as NVML gives it: 23,034 MiB.
const L4_MEMORY: u64 = 23_034 << 20;

fn uuid(i: usize) -> String {
    format!("GPU-{i:08}-5555-6666-7777-888888888888")
}

/// A pod of the node: its names and labels, the GPU it is allocated, and what its process
/// holds there (none: it runs nothing).
struct Pod {
    namespace: &'static str,
    name: &'static str,
    labels: &'static [(&'static str, &'static str)],
    gpu: usize,
    uses: Option<(u64, u32)>,
}

const PODS: [Pod; 5] = [
    Pod {
        namespace: "chat",
        name: "chat-api-7d9f8b6c5d-x2k9p",
        labels: &[("app", "chat-api"), ("pod-template-hash", "7d9f8b6c5d")],
        gpu: 0,
        uses: Some((7 * GIB, 10)),
    },
    Pod {
        namespace: "search",
        name: "vectordb-0",
        labels: &[
            ("app", "vectordb"),
            ("controller-revision-hash", "vectordb-6c8f9d7b5"),
            ("statefulset.kubernetes.io/pod-name", "vectordb-0"),
        ],
        gpu: 1,
        uses: Some((30 * GIB, 35)),
    },
    Pod {
        namespace: "research",
        name: "train-llm-q7x2m",
        labels: &[
            ("batch.kubernetes.io/job-name", "train-llm"),
            ("job-name", "train-llm"),
        ],
        gpu: 2,
        uses: Some((75 * GIB, 98)),
    },
    Pod {
        namespace: "chat",
        name: "idle-api-5b6c7d8f9-q8w7e",
        labels: &[("app", "idle-api"), ("pod-template-hash", "5b6c7d8f9")],
        gpu: 3,
        uses: None,
    },
    Pod {
        namespace: "docs",
        name: "ocr-6f7c8d9b4-k2j4h",
        labels: &[("app", "ocr"), ("pod-template-hash", "6f7c8d9b4")],
        gpu: 4,
        uses: Some((6 * GIB, 15)),
    },
];

/// GPU 4 is the L4; the others H100s.
fn scenario(pids: &BTreeMap<usize, u32>) -> Value {
    let devices: Vec<Value> = (0..8)
        .map(|i| {
            let procs: Vec<Value> = PODS
                .iter()
                .filter(|p| p.gpu == i)
                .filter_map(|p| Some((p.uses?, pids[&p.gpu])))
                .map(|((mem, sm), pid)| {
                    json!({"pid": pid, "used_memory": mem, "sm_util": sm, "mem_util": 5})
                })
                .collect();
            let mut d = json!({"index": i, "uuid": uuid(i), "processes": procs});
            if i == 4 {
                d["name"] = json!(L4);
                d["memory_total"] = json!(L4_MEMORY);
            }
            d
        })
        .collect();
    json!({ "devices": devices })
}

/// The agent runs the node for over 30 s with records cut every 10 s; its records name
/// each pod's workload and profile, and `rightsize` gives the known answers.
#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn the_known_node_gets_the_known_recommendations() {
    let dir = Dir::new("rightsize");
    let world = World::default();
    let mut containers = vec![];
    let mut held = vec![];
    let mut pids = BTreeMap::new();
    for p in &PODS {
        let (uid, id) = (random_uid(), random_hex(64));
        if p.uses.is_some() {
            let cg = TestCgroup::v2(&systemd_container(&uid, &id));
            let proc = Proc(cg.spawn(&mut sleeper()));
            pids.insert(p.gpu, proc.pid());
            held.push((cg, proc));
        }
        containers.push(FakeContainer {
            id,
            pod_uid: uid,
            namespace: p.namespace.into(),
            pod: p.name.into(),
            name: "main".into(),
            gpus: vec![uuid(p.gpu)],
        });
        world.set_pod_labels(p.namespace, p.name, p.labels);
    }
    world.set(containers.clone());
    let sc = Scenario::new(&scenario(&pids));
    let node = FakeNode::start(&dir.0, world);
    let file = dir.0.join("usage.jsonl");
    let cfg = format!(
        "[nvml]\ninterval_ms = 200\n[usage]\nfile = \"{}\"\nmax_record_secs = 10\n{}",
        file.display(),
        metadata_config(&dir.0, Some(&node))
    );
    let lib = fake_nvml_lib();
    let agent = Agent::start_env(
        &cfg,
        &["--nvml-lib", lib.to_str().unwrap(), "--prometheus"],
        &[("FAKE_NVML_SCENARIO", sc.path())],
    );
    let prom = prometheus_with_rules(&agent.addr);
    agent.wait_snapshot(Duration::from_secs(30), "every pod named", |s| {
        containers
            .iter()
            .all(|c| container(s, &c.id).is_some_and(|c| !c["workload"].is_null()))
    });
    // Past the 30 s of coverage asked below, from the first sample with the names.
    std::thread::sleep(Duration::from_secs(34));
    assert!(agent.stop().success());
    let records = read_json_lines(&file);
    check_records(&records, &containers);
    let got: BTreeMap<String, Value> = rightsize_json(&file, &["--min-coverage", "30s"], &[])
        .into_iter()
        .filter(|r| r["namespace"] != "-")
        .map(|r| (r["workload"].as_str().unwrap().to_string(), r))
        .collect();
    let want = [
        (
            "chat-api",
            "Deployment",
            "mig",
            json!("1g.10gb"),
            Value::Null,
            1.0 - 1.0 / 7.0,
        ),
        (
            "vectordb",
            "StatefulSet",
            "mig",
            json!("3g.40gb"),
            Value::Null,
            1.0 - 3.0 / 7.0,
        ),
        ("train-llm", "Job", "keep", Value::Null, Value::Null, 0.0),
        (
            "idle-api",
            "Deployment",
            "release",
            Value::Null,
            Value::Null,
            1.0,
        ),
        (
            "ocr",
            "Deployment",
            "time-slice",
            Value::Null,
            json!(1.0 / 3.0),
            2.0 / 3.0,
        ),
    ];
    assert_eq!(got.len(), want.len(), "{got:#?}");
    for (workload, kind, rec, profile, share, saved) in want {
        let r = &got[workload];
        assert_eq!(r["workload_kind"], kind, "{r}");
        assert_eq!(r["recommendation"]["kind"], rec, "{r}");
        assert_eq!(r["recommendation"]["profile"], profile, "{r}");
        let got_share = r["recommendation"]["share"].as_f64();
        // Both given to four decimals.
        let round = |s: f64| (s * 1e4).round();
        assert_eq!(got_share.map(round), share.as_f64().map(round), "{r}");
        let saved_got = r["gpus_saved"].as_f64().unwrap();
        assert!((saved_got - saved).abs() < 1e-4, "{r}");
        assert_eq!(r["gpus_allocated"], json!(1.0), "{r}");
        assert!(r["coverage_s"].as_f64().unwrap() >= 30.0, "{r}");
    }
    same_answer_from_prometheus(&prom, &file);
    dashboard_row_renders(&prom);
    assert_eq!(got["ocr"]["device_model"], L4);
    assert_eq!(got["chat-api"]["device_model"], H100);
    assert_eq!(got["chat-api"]["memory_peak_bytes"], json!(7 * GIB));
    assert_eq!(got["vectordb"]["sm_p95"].as_f64(), Some(35.0));
    // Asked for more coverage than there is: no advice yet.
    let early = rightsize_json(&file, &["--min-coverage", "1h"], &[]);
    assert!(!early.is_empty());
    for r in early {
        assert_eq!(r["recommendation"]["kind"], "insufficient-data", "{r}");
    }
}

/// A Prometheus scraping the agent every second, with the shipped recording rules
/// evaluated every 2 s instead of 5 minutes.
fn prometheus_with_rules(agent: &str) -> Prometheus {
    let root = tests::root();
    let rules = std::fs::read_to_string(root.join("deploy/prometheus/gpu-agent-rightsizing.yaml"));
    let rules = rules.unwrap();
    let fast = rules.replacen("    interval: 5m\n", "    interval: 2s\n", 1);
    assert_ne!(fast, rules, "the group's interval moved: update this test");
    let job =
        format!("  - job_name: gpu-agent\n    static_configs:\n      - targets: ['{agent}']\n");
    Prometheus::start_with_rules(&job, &[("gpu-agent-rightsizing.yaml", &fast)])
}

/// `rightsize --prometheus` over the rules' series gives the records' recommendations,
/// workload for workload, and the same figures; and `--plan` the same plan, model for
/// model: on the H100s chat-api's 1g.10gb and vectordb's 3g.40gb share one GPU, train-llm
/// keeps its own and idle-api's comes back (4 held, 2 needed); the L4 stays one GPU, now
/// cut into three time-slicing replicas.
fn same_answer_from_prometheus(prom: &Prometheus, file: &std::path::Path) {
    let args = ["--since", "10m", "--min-coverage", "20s", "--plan"];
    let url = format!("http://{}", prom.addr);
    let plans = |lines: &[Value]| -> BTreeMap<String, Value> {
        (lines.iter())
            .filter_map(|l| l.get("plan"))
            .map(|p| (p["model"].as_str().unwrap().to_string(), p.clone()))
            .collect()
    };
    let by_workload = |lines: Vec<Value>| -> BTreeMap<String, Value> {
        (lines.into_iter())
            .filter(|r| r["namespace"] != "-" && r.get("plan").is_none())
            .map(|r| (r["workload"].as_str().unwrap().to_string(), r))
            .collect()
    };
    let from_records = rightsize_json(file, &args, &[]);
    let from_rules = rightsize_json_from(&["--prometheus", &url], &args, &[]);
    let (plan, rules_plan) = (plans(&from_records), plans(&from_rules));
    assert_eq!(plan, rules_plan, "records' plan, then the rules'");
    let h100 = &plan[H100];
    assert_eq!(
        (
            &h100["gpus_held"],
            &h100["gpus_needed"],
            &h100["gpus_freed"]
        ),
        (&json!(4), &json!(2), &json!(2)),
        "{h100:#}"
    );
    assert_eq!(
        h100["layouts"][0]["mig_devices"],
        json!({"1g.10gb": 4, "3g.40gb": 1}),
        "{h100:#}"
    );
    assert_eq!(plan[L4]["layouts"][0]["replicas"], 3);
    same_files_from_prometheus(&url, file, &args);
    let records = by_workload(from_records);
    let rules = by_workload(from_rules);
    let same = [
        "namespace",
        "workload_kind",
        "device_model",
        "recommendation",
    ];
    assert_eq!(records.len(), PODS.len(), "{records:#?}");
    assert_eq!(
        records.keys().collect::<Vec<_>>(),
        rules.keys().collect::<Vec<_>>(),
        "{rules:#?}"
    );
    for (w, r) in &records {
        let p = &rules[w];
        for k in same {
            assert_eq!(r[k], p[k], "{w}: {k}:\nrecords {r}\nprometheus {p}");
        }
        for k in ["memory_peak_bytes", "sm_p95", "gpus_allocated"] {
            assert_eq!(r[k], p[k], "{w}: {k}:\nrecords {r}\nprometheus {p}");
        }
        let saved = |v: &Value| v["gpus_saved"].as_f64().unwrap();
        assert!((saved(r) - saved(p)).abs() < 1e-3, "{w}:\n{r}\n{p}");
    }
}

/// `--emit` from the records and from the rules writes the same files, the workloads'
/// patches (their container names from the raw series) included.
fn same_files_from_prometheus(url: &str, file: &std::path::Path, args: &[&str]) {
    let dir = Dir::new("rightsize-emit");
    let read = |from: &[&str], out: &std::path::Path| {
        let all = [from, args, &["--emit", out.to_str().unwrap()]].concat();
        let o = rightsize(&all, &[]);
        assert_eq!(o.code, 0, "{all:?}: {}", o.stderr);
        let mut files = BTreeMap::new();
        let mut stack = vec![out.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                match p.is_dir() {
                    true => stack.push(p),
                    false => {
                        let rel = p.strip_prefix(out).unwrap().display().to_string();
                        files.insert(rel, std::fs::read_to_string(&p).unwrap());
                    }
                }
            }
        }
        files
    };
    let records = read(&["--file", file.to_str().unwrap()], &dir.0.join("records"));
    let rules = read(&["--prometheus", url], &dir.0.join("rules"));
    assert!(
        records.contains_key("workloads/chat-deployment-chat-api.yaml"),
        "{records:#?}"
    );
    assert_eq!(records, rules);
}

/// The Grafana dashboard's rightsizing row, over the run, from the same rules:
/// the chat namespace gives back its idle GPU and most of chat-api's (need 1.2 x 10 % SM),
/// docs most of the L4 (need 1.2 x 6 GiB of 22.5); the idle allocation's GPU-hours.
fn dashboard_row_renders(prom: &Prometheus) {
    let root = tests::root();
    let text = std::fs::read_to_string(root.join("deploy/grafana/gpu-agent.json")).unwrap();
    let d: Value = serde_json::from_str(&text).unwrap();
    let panels = d["panels"].as_array().unwrap();
    let row = panels
        .iter()
        .position(|p| p["title"] == "Rightsizing (recording rules)");
    let query = |title: &str| {
        let p = panels[row.expect("a rightsizing row")..]
            .iter()
            .find(|p| p["title"] == title)
            .unwrap_or_else(|| panic!("no panel {title}"));
        let expr = p["targets"][0]["expr"].as_str().unwrap();
        // A range as long as the run: the panels take the rules' points in it as the
        // whole range (as they are on a Prometheus that has run longer than it).
        let expr = (expr.replace("$namespace", ".*"))
            .replace("$__range_s", "40")
            .replace("$__range", "40s");
        let r = prom
            .query(&expr)
            .unwrap_or_else(|| panic!("{title}: {expr}"));
        assert!(!r.is_empty(), "{title}: no data from {expr}");
        r
    };
    let of = |r: &[tests::prom::Sample], label: &str, value: &str| {
        (r.iter().find(|s| s.label(label) == value))
            .unwrap_or_else(|| panic!("no {label}={value} in {r:?}"))
            .value
    };
    let by_ns = query("Reclaimable GPUs by namespace (range)");
    let near = |got: f64, want: f64| (got - want).abs() < 0.05;
    let chat = of(&by_ns, "namespace", "chat");
    assert!(near(chat, 1.0 + (1.0 - 0.12)), "chat: {chat}");
    let docs = of(&by_ns, "namespace", "docs");
    assert!(
        near(docs, 1.0 - 1.2 * 6.0 * GIB as f64 / L4_MEMORY as f64),
        "docs: {docs}"
    );
    assert!(near(of(&by_ns, "namespace", "research"), 0.0));
    let total = query("Reclaimable GPUs (range)")[0].value;
    let sum: f64 = by_ns.iter().map(|s| s.value).sum();
    assert!((total - sum).abs() < 1e-9, "{total} {sum}");
    let top = query("Workloads with the most to give back (range)");
    let most = top
        .iter()
        .max_by(|a, b| a.value.total_cmp(&b.value))
        .unwrap();
    assert_eq!(most.label("workload"), "idle-api", "{top:?}");
    let idle = query("Allocated-idle GPU-hours by namespace (range)");
    let hours = of(&idle, "namespace", "chat");
    assert!(hours > 20.0 / 3600.0 && hours < 60.0 / 3600.0, "{hours}");
}

/// Each pod's records: its workload, device, allocation and profile, cut into checkpoints
/// that follow on each other, the last ended when the agent stopped.
fn check_records(records: &[Value], containers: &[FakeContainer]) {
    for (p, c) in PODS.iter().zip(containers) {
        let mine: Vec<&Value> = records
            .iter()
            .filter(|r| r["container_id"] == json!(c.id))
            .collect();
        assert!(mine.len() >= 3, "{}: {mine:#?}", p.name);
        let reasons: Vec<&str> = mine.iter().map(|r| r["reason"].as_str().unwrap()).collect();
        assert!(
            reasons[..reasons.len() - 1]
                .iter()
                .all(|r| *r == "checkpoint"),
            "{reasons:?}"
        );
        assert_eq!(reasons.last(), Some(&"agent_stopped"));
        for w in mine.windows(2) {
            assert_eq!(
                w[0]["end_ms"], w[1]["start_ms"],
                "{}: one follows the other",
                p.name
            );
        }
        let model = if p.gpu == 4 { L4 } else { H100 };
        for r in &mine {
            assert_eq!(r["namespace"], p.namespace, "{r}");
            assert_eq!(r["device_model"], model, "{r}");
            assert_eq!(r["gpus_allocated"], json!(1.0), "{r}");
            let (mem, sm) = p.uses.unwrap_or((0, 0));
            assert_eq!(r["memory_peak_bytes"], json!(mem), "{r}");
            assert_eq!(
                (&r["sm_p50"], &r["sm_p95"], &r["sm_max"]),
                (&json!(sm), &json!(sm), &json!(sm)),
                "{r}"
            );
            if p.uses.is_none() {
                assert_eq!(r["gpu_seconds"], json!(0.0), "{r}");
            }
        }
    }
    let kinds: Vec<&str> = PODS
        .iter()
        .zip(containers)
        .map(|(_, c)| {
            let r = records
                .iter()
                .find(|r| r["container_id"] == json!(c.id))
                .unwrap();
            r["workload_kind"].as_str().unwrap_or("-")
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "Deployment",
            "StatefulSet",
            "Job",
            "Deployment",
            "Deployment"
        ]
    );
}
