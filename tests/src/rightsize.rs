//! `gpu-agent rightsize` run as an operator runs it: flags and environment in; exit code,
//! output and errors out.
use std::{path::Path, process::Command};

use serde_json::Value;

use crate::agent_binary;

/// What one run of the command gave.
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// `gpu-agent rightsize ARGS` with `env` added to the environment.
pub fn rightsize(args: &[&str], env: &[(&str, &str)]) -> Output {
    let out = Command::new(agent_binary())
        .arg("rightsize")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("running gpu-agent rightsize");
    Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The recommendations for the records in `file`, one JSON object per workload and GPU
/// model (`--format json`); panics, with its stderr, when the command fails.
pub fn rightsize_json(file: &Path, args: &[&str], env: &[(&str, &str)]) -> Vec<Value> {
    rightsize_json_from(&["--file", file.to_str().unwrap()], args, env)
}

/// The same from a source of `from`'s flags (`--file F`, `--prometheus URL`).
pub fn rightsize_json_from(from: &[&str], args: &[&str], env: &[(&str, &str)]) -> Vec<Value> {
    let all = [from, &["--format", "json"], args].concat();
    let out = rightsize(&all, env);
    assert_eq!(out.code, 0, "rightsize {all:?}: {}", out.stderr);
    (out.stdout.lines())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The line of `workload` in `lines` (any namespace and GPU model).
pub fn line<'a>(lines: &'a [Value], workload: &str) -> &'a Value {
    (lines.iter())
        .find(|l| l["workload"] == workload)
        .unwrap_or_else(|| panic!("no line for {workload}: {lines:#?}"))
}

/// One usage record of `pod` (of workload `kind`/`name` in `namespace`) on a whole GPU of
/// `model` from `start_ms` to `end_ms`: its peak memory and SM p95 (percent).
pub struct Record<'a> {
    pub namespace: &'a str,
    pub kind: &'a str,
    pub name: &'a str,
    pub pod: &'a str,
    pub model: &'a str,
    pub memory: u64,
    pub peak: u64,
    pub sm_p95: u32,
}

impl Record<'_> {
    pub fn json(&self, start_ms: u64, end_ms: u64) -> Value {
        let used = self.peak > 0;
        serde_json::json!({
            "container_id": format!("{}-0123456789abcdef", self.pod), "pod_uid": format!("uid-{}", self.pod),
            "pod_name": self.pod, "namespace": self.namespace, "container_name": "main",
            "uuid": format!("GPU-{}", self.pod), "gpu_uuid": format!("GPU-{}", self.pod),
            "start_ms": start_ms, "end_ms": end_ms, "gpu_seconds": if used { 60.0 } else { 0.0 },
            "memory_byte_seconds": 0.0, "memory_peak_bytes": self.peak, "energy_joules": 0.0,
            "reason": "checkpoint", "workload_kind": self.kind, "workload": self.name,
            "sm_p50": self.sm_p95, "sm_p95": self.sm_p95, "sm_max": self.sm_p95,
            "memory_p95_bytes": self.peak, "device_model": self.model,
            "device_memory_bytes": self.memory, "gpus_allocated": 1.0,
        })
    }
}

/// `patch` applied to `base` the way a strategic merge does for these objects: maps merge,
/// `null` removes a key, and lists of objects with a `name` merge by name.
pub fn strategic_merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    b.remove(k);
                } else if let Some(old) = b.get_mut(k) {
                    strategic_merge(old, v);
                } else {
                    b.insert(k.clone(), v.clone());
                }
            }
        }
        (Value::Array(b), Value::Array(p)) if p.iter().all(|x| x["name"].is_string()) => {
            for item in p {
                match b.iter_mut().find(|x| x["name"] == item["name"]) {
                    Some(old) => strategic_merge(old, item),
                    None => b.push(item.clone()),
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

/// What the NVIDIA device plugin's config parser (k8s-device-plugin `api/config/v1`, as
/// ../shared/nvidia/README.md states its rules) would refuse in `config`.
pub fn device_plugin_problems(config: &Value) -> Vec<String> {
    let mut p = vec![];
    if config["version"] != "v1" {
        p.push(format!("version: {}", config["version"]));
    }
    let Some(sharing) = config["sharing"].as_object() else {
        return [p, vec!["no sharing".into()]].concat();
    };
    for (k, v) in sharing {
        if k != "timeSlicing" && k != "mps" {
            p.push(format!("sharing.{k}: unknown"));
            continue;
        }
        let known = [
            "strategy",
            "renameByDefault",
            "failRequestsGreaterThanOne",
            "resources",
        ];
        for key in v.as_object().map(|o| o.keys().collect()).unwrap_or(vec![]) {
            if !known.contains(&key.as_str()) {
                p.push(format!("sharing.{k}.{key}: unknown"));
            }
        }
        if !v["strategy"].is_null() && v["strategy"] != "" {
            p.push(format!("sharing.{k}.strategy: only the empty one is valid"));
        }
        let resources = v["resources"].as_array().cloned().unwrap_or_default();
        if resources.is_empty() {
            p.push(format!("sharing.{k}.resources: empty"));
        }
        for r in resources {
            if !r["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("nvidia.com/"))
            {
                p.push(format!("resource name {}", r["name"]));
            }
            if r["replicas"].as_u64().is_none_or(|n| n == 0) {
                p.push(format!("replicas {}", r["replicas"]));
            }
            let devices_ok = match &r["devices"] {
                Value::Null => true,
                Value::String(s) => s == "all",
                Value::Number(n) => n.as_u64().is_some_and(|n| n > 0),
                Value::Array(a) => !a.is_empty(),
                _ => false,
            };
            if !devices_ok {
                p.push(format!("devices {}", r["devices"]));
            }
        }
    }
    if sharing.len() != 1 {
        p.push("sharing: give one of timeSlicing or mps".into());
    }
    p
}
