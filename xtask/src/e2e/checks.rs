//! What the harness asserts: each workload's GPU memory reaches `/metrics` and OTLP under
//! its own container id (and names, where the runtime tells them), and the agent's
//! container holds exactly the DaemonSet's privileges.
use std::collections::BTreeMap;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use tests::otlp_receiver::{attr_str, metric, points, value};

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
