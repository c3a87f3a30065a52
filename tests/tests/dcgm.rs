//! `--prometheus-compat dcgm` and `dcgm-virtual-gpus` end to end, through a real Prometheus
//! (Debian's; `cargo xtask test` installs it as root): an 8-GPU node whose pods the kubelet
//! allocated GPUs (pod-resources and CRI servers from the real protos), real processes in
//! their cgroups, the fake NVML library. What dashboards, HPA rules and alerts written for
//! dcgm-exporter ask: the allocated pod's labels on every series, sums that count a GPU
//! once, idle pods with the device's values, `sum by (namespace)`; and the per-pod layout.
use std::time::{Duration, Instant};

use tests::{
    dcgm_node::{bus, uuid, DcgmNode, GPUS},
    http,
    prom::{Prometheus, Sample},
    random_hex, Agent,
};

const NO_KMSG: &str = "[xid]\nkmsg = \"\"\n";

fn value_of(r: &[Sample], label: &str, want: &str) -> Option<f64> {
    r.iter().find(|s| s.label(label) == want).map(|s| s.value)
}

fn by(r: &[Sample], label: &str) -> Vec<(String, f64)> {
    let mut v: Vec<(String, f64)> = r
        .iter()
        .map(|s| (s.label(label).to_string(), s.value))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// Waits until the agent's /metrics has every pod's allocation (the kubelet is read every
/// second) and its processes joined.
fn wait_ready(agent: &Agent, node: &DcgmNode, family: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, text) = http::get(&agent.addr, "/metrics").unwrap();
        let named = node.pods.iter().all(|p| {
            text.contains(&format!(
                "container_gpu_allocated{{container_id=\"{}\"",
                p.id
            ))
        });
        if named && text.contains(family) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "allocations never showed:\n{text}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn dcgm_layouts_through_prometheus() {
    tests::prom::which("prometheus");
    let node = DcgmNode::start(true);
    let dcgm = node.agent(NO_KMSG, &["--prometheus-compat", "dcgm"]);
    let virt = node.agent(NO_KMSG, &["--prometheus-compat", "dcgm-virtual-gpus"]);
    wait_ready(&dcgm, &node, "DCGM_FI_PROF_GR_ENGINE_ACTIVE{");
    wait_ready(&virt, &node, "DCGM_FI_PROF_GR_ENGINE_ACTIVE{");
    let prom = Prometheus::start(&[("dcgm", &dcgm.addr), ("virtual", &virt.addr)]);
    default_layout(&prom, &node);
    virtual_gpus_layout(&prom, &node);
    profiling_absent_where_unsupported(&prom, &dcgm);
}

/// dcgm-exporter's default mode.
fn default_layout(prom: &Prometheus, node: &DcgmNode) {
    // One series per GPU (GPU 7 has MIG on: no utilization), none per container.
    let util = prom.wait(r#"DCGM_FI_DEV_GPU_UTIL{job="dcgm"}"#, |r| r.len() == 7);
    // No sum counts a GPU twice: the node's utilization is the devices'.
    let devices: f64 = GPUS[..7].iter().map(|g| g.0 as f64).sum();
    let sum = prom
        .query(r#"sum(DCGM_FI_DEV_GPU_UTIL{job="dcgm"})"#)
        .unwrap();
    assert_eq!(sum[0].value, devices, "{util:#?}");
    // The allocated pod's labels on every series of its GPU, every field.
    let g0 = uuid(0);
    let families = prom.wait(
        &format!(r#"count by (__name__) ({{job="dcgm",UUID="{g0}",__name__=~"DCGM_.*"}})"#),
        |r| r.len() >= 25,
    );
    let with_pod = prom
        .query(&format!(r#"count by (__name__) ({{job="dcgm",UUID="{g0}",__name__=~"DCGM_.*",namespace="team-a",pod="trainer-a",container="main"}})"#))
        .unwrap();
    assert_eq!(with_pod.len(), families.len(), "every field: {with_pod:#?}");
    assert!(
        with_pod.iter().all(|s| s.value == 1.0),
        "one series each: {with_pod:#?}"
    );
    let temp = prom
        .query(r#"DCGM_FI_DEV_GPU_TEMP{job="dcgm",pod="trainer-a"}"#)
        .unwrap();
    assert_eq!((temp.len(), temp[0].label("UUID")), (1, g0.as_str()));
    // The pod that holds a GPU and runs nothing gets the device's values.
    let idle = prom
        .query(r#"DCGM_FI_DEV_GPU_UTIL{job="dcgm",pod="idle-d"}"#)
        .unwrap();
    assert_eq!(
        (idle.len(), idle[0].value, idle[0].label("namespace")),
        (1, 0.0, "team-c")
    );
    let fb = prom
        .query(r#"DCGM_FI_DEV_FB_USED{job="dcgm",pod="idle-d"}"#)
        .unwrap();
    assert_eq!(fb[0].label("UUID"), uuid(3));
    // The MIG device is mig-e's, with its profile; the GPU's own series name no pod.
    let mig = prom
        .query(r#"DCGM_FI_DEV_FB_FREE{job="dcgm",pod="mig-e"}"#)
        .unwrap();
    assert_eq!(
        (
            mig.len(),
            mig[0].label("GPU_I_PROFILE"),
            mig[0].label("GPU_I_ID")
        ),
        (1, "1g.10gb", "1")
    );
    assert_eq!(mig[0].value, 10240.0);
    // Power split by namespace: a shared GPU counts once, for the pod named on it (the
    // first of its pods by namespace); unallocated GPUs under "".
    let power = prom
        .query(r#"sum by (namespace) (DCGM_FI_DEV_POWER_USAGE{job="dcgm"})"#)
        .unwrap();
    let w = |i: usize| GPUS[i].1 as f64;
    assert_eq!(
        by(&power, "namespace"),
        [
            ("".into(), w(4) + w(5) + w(6) + w(7)),
            ("team-a".into(), w(0) + w(2)),
            ("team-b".into(), w(1)),
            ("team-c".into(), w(3)),
        ],
        "{power:#?}"
    );
    // An HPA per pod (prometheus-adapter's query shape): each pod its GPU's value.
    let hpa = prom
        .query(r#"sum(DCGM_FI_DEV_GPU_UTIL{job="dcgm",namespace="team-a",pod=~"trainer-a|shared-1"}) by (pod)"#)
        .unwrap();
    assert_eq!(
        by(&hpa, "pod"),
        [("shared-1".into(), 50.0), ("trainer-a".into(), 70.0)]
    );
    // gpu-agent's own per-container truth beside it.
    let own = prom.wait(
        r#"container_gpu_utilization_ratio{job="dcgm",hw_gpu_task="general",namespace="team-b"}"#,
        |r| r.len() == 2,
    );
    assert_eq!(value_of(&own, "pod", "shared-2"), Some(0.3));
    assert_eq!(node.pod("shared-2").namespace, "team-b");
}

/// dcgm-exporter's --kubernetes-virtual-gpus.
fn virtual_gpus_layout(prom: &Prometheus, node: &DcgmNode) {
    let g2 = uuid(2);
    // FB_USED and GPU_UTIL: the device's series, and each pod its own processes, with
    // pod_uid and the replica.
    let util = prom.wait(
        &format!(r#"DCGM_FI_DEV_GPU_UTIL{{job="virtual",UUID="{g2}"}}"#),
        |r| r.len() == 3,
    );
    assert_eq!(value_of(&util, "pod", ""), Some(50.0));
    let s1 = util.iter().find(|s| s.label("pod") == "shared-1").unwrap();
    assert_eq!(
        (s1.value, s1.label("vgpu"), s1.label("pod_uid")),
        (20.0, "1", node.pod("shared-1").uid.as_str())
    );
    assert_eq!(value_of(&util, "pod", "shared-2"), Some(30.0));
    let fb = prom
        .query(&format!(
            r#"DCGM_FI_DEV_FB_USED{{job="virtual",UUID="{g2}",pod="shared-2"}}"#
        ))
        .unwrap();
    assert_eq!(fb[0].value, 6144.0);
    // Other fields: the device's value once per pod, no device series.
    let temp = prom
        .query(&format!(
            r#"DCGM_FI_DEV_GPU_TEMP{{job="virtual",UUID="{g2}"}}"#
        ))
        .unwrap();
    assert_eq!(
        by(&temp, "pod"),
        [("shared-1".into(), 42.0), ("shared-2".into(), 42.0)]
    );
    assert!(
        temp.iter().all(|s| s.label("pod_uid").is_empty()),
        "{temp:#?}"
    );
    // The idle pod: its own use, 0.
    let idle = prom
        .query(r#"DCGM_FI_DEV_FB_USED{job="virtual",pod="idle-d"}"#)
        .unwrap();
    assert_eq!(idle[0].value, 0.0);
    // A GPU nobody holds keeps its one series.
    let free = prom
        .query(&format!(
            r#"DCGM_FI_DEV_GPU_TEMP{{job="virtual",UUID="{}"}}"#,
            uuid(4)
        ))
        .unwrap();
    assert_eq!((free.len(), free[0].label("pod")), (1, ""));
}

fn profiling_absent_where_unsupported(prom: &Prometheus, agent: &Agent) {
    let gr = prom
        .query(r#"DCGM_FI_PROF_GR_ENGINE_ACTIVE{job="dcgm"}"#)
        .unwrap();
    // Seven GPUs and the MIG device; not GPU 5 (no GPM): absent, not 0.
    assert_eq!(gr.len(), 8, "{gr:#?}");
    assert!(gr.iter().all(|s| s.label("UUID") != uuid(5)), "{gr:#?}");
    assert_eq!(value_of(&gr, "UUID", &uuid(0)), Some(0.7));
    let tx = prom
        .query(&format!(
            r#"DCGM_FI_PROF_PCIE_TX_BYTES{{job="dcgm",UUID="{}"}}"#,
            uuid(0)
        ))
        .unwrap();
    assert_eq!(tx[0].value, 700.0, "NVML GPM's MiB/s, as DCGM passes it on");
    let ours = prom.query(&format!(r#"hw_gpu_bandwidth_bytes_per_second{{job="dcgm",hw_id="{}",hw_gpu_link="pcie",network_io_direction="transmit"}}"#, uuid(0))).unwrap();
    assert_eq!(ours[0].value, 700.0 * 1_048_576.0, "gpu-agent's own: bytes");
    let st = agent.stats();
    let gpm = &st["nvml_features"]["gpm"];
    assert_eq!(gpm[uuid(0)], "ok", "{st}");
    let why = gpm[uuid(5)].as_str().unwrap_or_default();
    assert!(why.starts_with("unavailable: GPM is not supported"), "{st}");
}

/// A counters CSV chooses the fields, types and help; a bad line is refused, named.
#[test]
fn counters_csv_selects_fields_and_names_a_bad_line() {
    let dir = std::env::temp_dir().join(format!("dcgm-csv-{}", random_hex(8)));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("counters.csv");
    std::fs::write(
        &good,
        "# Format\n# DCGM FIELD, Prometheus metric type, help message\n\n\
         DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).\n\
         DCGM_FI_PROF_SM_ACTIVE, gauge, SMs busy.\n\
         DCGM_FI_DEV_GPU_UTIL, counter, \"Utilization, as a counter\"\n",
    )
    .unwrap();
    let bad = dir.join("bad.csv");
    std::fs::write(
        &bad,
        "DCGM_FI_DEV_SM_CLOCK, gauge, x\n# fine so far\nDCGM_FI_DEV_POWER_VIOLATION, counter, y\n",
    )
    .unwrap();
    // Refused at start, and by check-config, naming the file and the line.
    for args in [
        vec![
            "run".to_string(),
            "--no-ebpf".into(),
            "-f".into(),
            bad.display().to_string(),
        ],
        vec!["check-config".to_string(), write_config(&dir, &bad)],
    ] {
        let out = std::process::Command::new(tests::agent_binary())
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("dcgm.collectors") && err.contains("bad.csv: line 3 (`DCGM_FI_DEV_POWER_VIOLATION, counter, y`): gpu-agent does not serve DCGM_FI_DEV_POWER_VIOLATION"),
            "{args:?}: {err}"
        );
    }
    let node = DcgmNode::start(false);
    let agent = node.agent(NO_KMSG, &["-f", good.to_str().unwrap()]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let (_, t) = http::get(&agent.addr, "/metrics").unwrap();
        if t.contains("DCGM_FI_PROF_SM_ACTIVE{") || Instant::now() > deadline {
            break t;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let families: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("# TYPE DCGM"))
        .collect();
    assert_eq!(
        families,
        [
            "# TYPE DCGM_FI_DEV_SM_CLOCK gauge",
            "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge",
            "# TYPE DCGM_FI_DEV_GPU_UTIL counter"
        ],
        "{text}"
    );
    assert!(
        text.contains("# HELP DCGM_FI_DEV_GPU_UTIL Utilization, as a counter\n"),
        "{text}"
    );
    assert!(
        !text.contains("DCGM_FI_DRIVER_VERSION="),
        "no label line, no label: {text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn write_config(dir: &std::path::Path, csv: &std::path::Path) -> String {
    let cfg = dir.join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "[prometheus]\nenabled = true\ncompat = \"dcgm\"\n[dcgm]\ncollectors = \"{}\"\n",
            csv.display()
        ),
    )
    .unwrap();
    cfg.display().to_string()
}

/// XIDs from NVML's event API, counted per GPU and code; the kernel log's line for the
/// same GPU and code charges it to the process's container. /dev/kmsg when this process
/// can write it (root), else a plain file the agent reads the same way.
#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn xid_events_are_counted_and_charged_to_the_container_the_kernel_log_names() {
    let node = DcgmNode::start(true);
    let kmsg = kmsg_source(&node);
    let agent = node.agent(
        &format!("[xid]\nkmsg = \"{}\"\n", kmsg.display()),
        &["--prometheus-compat", "dcgm"],
    );
    wait_ready(&agent, &node, "DCGM_FI_DEV_XID_ERRORS{");
    let trainer = node.pod("trainer-b");
    let pid = node.procs[1].as_ref().unwrap().pid();
    // The driver's line, then the event NVML delivers for it.
    let pci = &bus(1)[4..bus(1).len() - 2]; // "0000:28:00"
    let line = format!(
        "NVRM: Xid (PCI:{}): 43, pid={pid}, name=sleep, Ch 00000008\n",
        pci.to_lowercase()
    );
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .open(&kmsg)
        .unwrap();
    std::io::Write::write_all(&mut log, line.as_bytes()).unwrap();
    node.xids(&[(1, 43), (6, 79)]);
    let text = wait_metrics(&agent, |t| {
        t.contains("container_gpu_errors_total{") && t.contains(r#"xid="79""#)
    });
    let g1 = uuid(1);
    let has = |l: &str| assert!(text.lines().any(|x| x == l), "missing\n{l}\nin\n{text}");
    has(&format!(
        r#"hw_errors_total{{hw_id="{g1}",gpu="1",model="NVIDIA H100 80GB HBM3",pci_bus_id="{}",node="{}",error_type="xid",xid="43"}} 1"#,
        bus(1),
        node_name(&text)
    ));
    let xid_line = text
        .lines()
        .find(|l| l.starts_with("DCGM_FI_DEV_XID_ERRORS{") && l.contains(&g1))
        .unwrap();
    assert!(
        xid_line.contains(
            r#"err_code="43",err_msg="GPU stopped processing",namespace="team-b",pod="trainer-b""#
        ) && xid_line.ends_with(" 43"),
        "{xid_line}"
    );
    let charged: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("container_gpu_errors_total{"))
        .collect();
    assert_eq!(charged.len(), 1, "only the XID the log named: {charged:?}");
    assert!(
        charged[0].contains(&format!(r#"container_id="{}",pod_uid="{}",namespace="team-b",pod="trainer-b",container="main",hw_id="{g1}""#, trainer.id, trainer.uid))
            && charged[0].ends_with(r#"error_type="xid",xid="43"} 1"#),
        "{}",
        charged[0]
    );
    // The XID on GPU 6 has no line: counted on its GPU, charged to nobody.
    assert!(text.contains(&format!(r#"hw_id="{}",gpu="6""#, uuid(6))));
    let st = agent.stats();
    let f = &st["nvml_features"];
    assert_eq!(
        (f["xid_events"].as_str(), f["kmsg"].as_str()),
        (Some("ok"), Some("ok")),
        "{st}"
    );
}

/// /dev/kmsg when writable; otherwise a file in the node's directory (removed with it)
/// that the agent reads the same way.
fn kmsg_source(node: &DcgmNode) -> std::path::PathBuf {
    if std::fs::OpenOptions::new()
        .append(true)
        .open("/dev/kmsg")
        .is_ok()
    {
        return "/dev/kmsg".into();
    }
    eprintln!("/dev/kmsg is not writable here: the agent reads a file instead");
    let path = node.dir.join("kmsg");
    std::fs::write(&path, "").unwrap();
    path
}

fn node_name(text: &str) -> String {
    let l = text.lines().find(|l| l.starts_with("hw_status{")).unwrap();
    let i = l.find("node=\"").unwrap() + 6;
    l[i..i + l[i..].find('"').unwrap()].to_string()
}

fn wait_metrics(agent: &Agent, mut ok: impl FnMut(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, t) = http::get(&agent.addr, "/metrics").unwrap();
        if ok(&t) {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "timed out; last /metrics:\n{t}\nagent log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
