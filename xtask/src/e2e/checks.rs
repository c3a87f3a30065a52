//! What the harness asserts: each workload's GPU memory reaches `/metrics` and OTLP under
//! its own container id (and names, where the runtime tells them), and the agent's
//! container holds exactly the DaemonSet's privileges.
use std::collections::BTreeMap;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use tests::otlp_receiver::{attr_str, metric, points, value};

use super::manifest::AgentSpec;

/// One sample of the Prometheus text format.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the text exposition format (comments skipped); a malformed line is an error.
pub fn parse_prometheus(text: &str) -> Result<Vec<Sample>, String> {
    let mut out = vec![];
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || format!("/metrics line {}: {line:?}", n + 1);
        let i = line.find(['{', ' ']).ok_or_else(bad)?;
        let (name, rest) = line.split_at(i);
        let (labels, rest) = match rest.strip_prefix('{') {
            Some(body) => parse_labels(body).ok_or_else(bad)?,
            None => (BTreeMap::new(), rest),
        };
        let value = match rest.split_whitespace().next().ok_or_else(bad)? {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().map_err(|_| bad())?,
        };
        out.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    Ok(out)
}

/// `a="1",b="x\"y"}` -> the labels and what follows the `}`.
fn parse_labels(mut s: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        if let Some(rest) = s.strip_prefix('}') {
            return Some((labels, rest));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim().to_string();
        s = s[eq + 1..].strip_prefix('"')?;
        let mut val = String::new();
        let mut it = s.char_indices();
        let end = loop {
            match it.next()? {
                (_, '\\') => match it.next()?.1 {
                    'n' => val.push('\n'),
                    c => val.push(c),
                },
                (i, '"') => break i,
                (_, c) => val.push(c),
            }
        };
        s = &s[end + 1..];
        labels.insert(key, val);
    }
}

/// What a workload should look like in the agent's output.
#[derive(Debug, Clone)]
pub struct Expect {
    pub container_id: String,
    /// Label -> value on `/metrics` (and the matching OTLP resource attribute).
    pub labels: Vec<(&'static str, String)>,
    pub memory_bytes: u64,
}

/// Prometheus label -> OTLP resource attribute.
fn otlp_key(label: &str) -> Option<&'static str> {
    Some(match label {
        "container_id" => "container.id",
        "pod_uid" => "k8s.pod.uid",
        "namespace" => "k8s.namespace.name",
        "pod" => "k8s.pod.name",
        "container" => "k8s.container.name",
        "runtime" => "container.runtime.name",
        "node" => "k8s.node.name",
        _ => return None,
    })
}

/// Checks `/metrics`: `container_gpu_memory_usage_bytes` of this container id with the
/// expected labels and value. Ok(()) or what is wrong.
pub fn check_metrics(samples: &[Sample], e: &Expect) -> Result<(), String> {
    let mine: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.name == "container_gpu_memory_usage_bytes")
        .filter(|s| s.labels.get("container_id") == Some(&e.container_id))
        .collect();
    let Some(s) = mine.first() else {
        let ids: Vec<&str> = samples
            .iter()
            .filter(|s| s.name == "container_gpu_memory_usage_bytes")
            .map(|s| {
                s.labels
                    .get("container_id")
                    .map_or("(none)", |v| v.as_str())
            })
            .collect();
        return Err(format!(
            "no container_gpu_memory_usage_bytes{{container_id=\"{}\"}}; series have container_id {ids:?}",
            short(&e.container_id)
        ));
    };
    let mut wrong = vec![];
    for (k, want) in &e.labels {
        let got = s.labels.get(*k).map(String::as_str).unwrap_or("");
        if got != want {
            wrong.push(format!("{k}={got:?} (want {want:?})"));
        }
    }
    if s.value != e.memory_bytes as f64 {
        wrong.push(format!("value {} (want {})", s.value, e.memory_bytes));
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join(", "))
    }
}

/// Checks OTLP: the latest request that has a resource with this `container.id` carries
/// the expected attributes and `container.gpu.memory.usage`.
pub fn check_otlp(requests: &[ExportMetricsServiceRequest], e: &Expect) -> Result<(), String> {
    let Some(rm) = requests
        .iter()
        .rev()
        .find_map(|r| tests::otlp_receiver::container_resource(r, &e.container_id))
    else {
        return Err(format!(
            "no resource with container.id {} in {} OTLP requests",
            short(&e.container_id),
            requests.len()
        ));
    };
    let attrs = &rm.resource.as_ref().expect("matched on it").attributes;
    let mut wrong = vec![];
    for (k, want) in &e.labels {
        let Some(key) = otlp_key(k) else { continue };
        let got = attr_str(attrs, key).unwrap_or("");
        if got != want {
            wrong.push(format!("{key}={got:?} (want {want:?})"));
        }
    }
    match metric(rm, "container.gpu.memory.usage") {
        None => wrong.push("no container.gpu.memory.usage".into()),
        Some(m) => {
            let vals: Vec<f64> = points(m).iter().map(value).collect();
            if vals.iter().sum::<f64>() != e.memory_bytes as f64 {
                wrong.push(format!(
                    "container.gpu.memory.usage {vals:?} (want {})",
                    e.memory_bytes
                ));
            }
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join(", "))
    }
}

pub fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// Capability names (without `CAP_`) in a /proc status mask.
pub fn cap_names(mask: u64) -> Vec<String> {
    const NAMES: [&str; 41] = [
        "CHOWN",
        "DAC_OVERRIDE",
        "DAC_READ_SEARCH",
        "FOWNER",
        "FSETID",
        "KILL",
        "SETGID",
        "SETUID",
        "SETPCAP",
        "LINUX_IMMUTABLE",
        "NET_BIND_SERVICE",
        "NET_BROADCAST",
        "NET_ADMIN",
        "NET_RAW",
        "IPC_LOCK",
        "IPC_OWNER",
        "SYS_MODULE",
        "SYS_RAWIO",
        "SYS_CHROOT",
        "SYS_PTRACE",
        "SYS_PACCT",
        "SYS_ADMIN",
        "SYS_BOOT",
        "SYS_NICE",
        "SYS_RESOURCE",
        "SYS_TIME",
        "SYS_TTY_CONFIG",
        "MKNOD",
        "LEASE",
        "AUDIT_WRITE",
        "AUDIT_CONTROL",
        "SETFCAP",
        "MAC_OVERRIDE",
        "MAC_ADMIN",
        "SYSLOG",
        "WAKE_ALARM",
        "BLOCK_SUSPEND",
        "AUDIT_READ",
        "PERFMON",
        "BPF",
        "CHECKPOINT_RESTORE",
    ];
    (0..64)
        .filter(|b| mask & (1u64 << b) != 0)
        .map(|b| NAMES.get(b).map_or(format!("CAP_{b}"), |n| n.to_string()))
        .collect()
}

/// The agent process's privileges as the kernel sees them, against the manifest.
pub fn privileges(spec: &AgentSpec, pid: u32, not_here: &[String]) -> Result<(), String> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k}:")))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    let mut wrong = vec![];
    let mut want: Vec<String> = if spec.cap_drop.iter().any(|c| c == "ALL") {
        let mut w = spec.cap_add.clone();
        w.retain(|c| !not_here.contains(c));
        w
    } else {
        return Err("the harness checks capabilities only for drop: [ALL]".into());
    };
    want.sort();
    for set in ["CapEff", "CapPrm", "CapBnd"] {
        let mask = u64::from_str_radix(&field(set), 16).unwrap_or(u64::MAX);
        let mut got = cap_names(mask);
        got.sort();
        if got != want {
            wrong.push(format!("{set} {got:?} (want {want:?})"));
        }
    }
    if field("CapAmb") != "0000000000000000" {
        wrong.push(format!("CapAmb {}", field("CapAmb")));
    }
    if let Some(u) = spec.run_as_user {
        let uids: Vec<String> = field("Uid").split_whitespace().map(String::from).collect();
        if uids.iter().any(|x| x != &u.to_string()) {
            wrong.push(format!("Uid {uids:?} (want {u})"));
        }
    }
    let nnp = if spec.allow_privilege_escalation == Some(false) {
        "1"
    } else {
        "0"
    };
    if field("NoNewPrivs") != nnp {
        wrong.push(format!("NoNewPrivs {} (want {nnp})", field("NoNewPrivs")));
    }
    if spec.seccomp.as_deref() == Some("RuntimeDefault") && field("Seccomp") != "2" {
        wrong.push(format!(
            "Seccomp {} (want 2: the runtime's filter)",
            field("Seccomp")
        ));
    }
    // The host's: dockerd's, which is the harness's own.
    let ns = |p: &str| std::fs::read_link(p).ok();
    if spec.host_pid && ns(&format!("/proc/{pid}/ns/pid")) != ns("/proc/self/ns/pid") {
        wrong.push("not in the host's PID namespace".into());
    }
    wrong.extend(read_only_mounts(spec, pid));
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// The root filesystem and every readOnly volume, read-only in the agent's mount table;
/// HostToContainer volumes slaves of the host's.
fn read_only_mounts(spec: &AgentSpec, pid: u32) -> Vec<String> {
    let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    // (mount point, per-mount options, optional fields)
    let rows: Vec<(String, String, String)> = info
        .lines()
        .filter_map(|l| {
            let (pre, _) = l.split_once(" - ")?;
            let f: Vec<&str> = pre.split(' ').collect();
            Some((
                f.get(4)?.to_string(),
                f.get(5)?.to_string(),
                f[6..].join(" "),
            ))
        })
        .collect();
    let ro = |mp: &str| {
        rows.iter()
            .any(|(m, o, _)| m == mp && o.split(',').any(|x| x == "ro"))
    };
    let mut wrong = vec![];
    if spec.read_only_root && !ro("/") {
        wrong.push("root filesystem not read-only".into());
    }
    for m in &spec.mounts {
        if m.read_only && !ro(&m.mount_path) {
            wrong.push(format!("{} not read-only", m.mount_path));
        }
        if m.propagation.as_deref() == Some("HostToContainer")
            && !rows
                .iter()
                .any(|(mp, _, opt)| mp == &m.mount_path && opt.contains("master:"))
        {
            wrong.push(format!(
                "{} not a slave of the host's mount (HostToContainer)",
                m.mount_path
            ));
        }
    }
    wrong
}

/// The host process: charged to the node, `owner="host"`, no container id.
pub fn check_host(samples: &[Sample], e: &Expect) -> Result<(), String> {
    let host: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.name == "container_gpu_memory_usage_bytes")
        .filter(|s| s.labels.get("owner").map(String::as_str) == Some("host"))
        .collect();
    match host.as_slice() {
        [s] if s.value == e.memory_bytes as f64
            && s.labels.get("container_id").is_none_or(|v| v.is_empty()) =>
        {
            Ok(())
        }
        [] => Err("no series with owner=\"host\"".into()),
        other => Err(format!(
            "host series {:?}, want one of {} bytes",
            other
                .iter()
                .map(|s| (&s.labels, s.value))
                .collect::<Vec<_>>(),
            e.memory_bytes
        )),
    }
}

#[cfg(test)]
mod t {
    use super::*;

    #[test]
    fn parses_labels_with_escapes_and_bare_samples() {
        let text = "# HELP x y\nup 1\nm{a=\"1\",b=\"q\\\"x\\\\y\"} 2.5\nn{} 3\n";
        let s = parse_prometheus(text).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[1].labels["b"], "q\"x\\y");
        assert_eq!(s[1].value, 2.5);
        assert!(s[2].labels.is_empty());
        assert!(parse_prometheus("m{a=1} 2").is_err());
    }

    #[test]
    fn capability_masks() {
        // CapEff of the DaemonSet's set: DAC_READ_SEARCH(2) SYS_ADMIN(21) SYS_RESOURCE(24)
        // PERFMON(38) BPF(39).
        let mask = (1 << 2) | (1 << 21) | (1 << 24) | (1 << 38) | (1 << 39);
        assert_eq!(
            cap_names(mask),
            [
                "DAC_READ_SEARCH",
                "SYS_ADMIN",
                "SYS_RESOURCE",
                "PERFMON",
                "BPF"
            ]
        );
    }
}
