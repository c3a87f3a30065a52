//! `gpu-agent check-config` on what the agent's container is given: its config, flags,
//! mounted ConfigMaps and Secrets, and environment.
use std::{
    fs,
    path::Path,
    process::Command,
    sync::atomic::{AtomicUsize, Ordering},
};

use serde_yaml::Value;

use super::{agent, arg_after, mounted_config, run, s, scalar, scratch, seq, Rendered};

/// What a Secret that a rendering refers to but does not hold would give a container:
/// (Secret name, key) to the bytes the kubelet would mount or put in the environment.
pub type SecretData<'a> = &'a dyn Fn(&str, &str) -> Option<Vec<u8>>;

/// No Secret: for renderings that refer to none.
pub fn no_secrets(_: &str, _: &str) -> Option<Vec<u8>> {
    None
}

/// The run flags in a container's args that stand for config keys, put in the config as
/// `gpu-agent run` applies them (agent/src/main.rs): `check-config` reads only the file.
fn apply_flags(cfg: &mut toml::Table, c: &Value) {
    fn set(cfg: &mut toml::Table, table: &str, key: &str, v: toml::Value, keep: bool) {
        let t = cfg.entry(table).or_insert(toml::Table::new().into());
        if let Some(t) = t.as_table_mut() {
            if !(keep && t.contains_key(key)) {
                t.insert(key.into(), v);
            }
        }
    }
    for (flag, key) in [("--http-addr", "addr"), ("--metrics-addr", "metrics_addr")] {
        if let Some(a) = arg_after(c, flag) {
            set(cfg, "http", key, a.into(), false);
        }
    }
    let compat = arg_after(c, "--prometheus-compat");
    let collectors = arg_after(c, "--collectors").or(arg_after(c, "-f"));
    let prometheus = seq(&c["args"]).iter().any(|a| a == "--prometheus");
    if prometheus || compat.is_some() || collectors.is_some() {
        set(cfg, "prometheus", "enabled", true.into(), false);
    }
    if let Some(m) = compat {
        set(cfg, "prometheus", "compat", m.into(), false);
    }
    if let Some(p) = collectors {
        set(cfg, "dcgm", "collectors", p.into(), false);
        set(cfg, "prometheus", "compat", "dcgm".into(), true);
    }
}

/// `gpu-agent check-config` on what the agent's container is given, as the kubelet gives it:
/// the ConfigMap'd config, the run flags that stand for config keys, the files of every
/// ConfigMap and Secret volume it mounts (under a scratch directory, with the config's paths
/// into them moved there), and its environment (`$(VAR)` expanded; the OTEL_* variables are
/// configuration too). A key, a file or a value the agent refuses would crash-loop the pod on
/// every node. Secrets the rendering does not hold come from `secrets`.
pub fn check_config(r: &Rendered, secrets: SecretData) -> (bool, String) {
    let (_, pod, c) = agent(r).expect("the gpu-agent DaemonSet");
    let (path, text) = mounted_config(r, pod, c).unwrap_or_else(|e| panic!("{e}"));
    let fail = |e: String| (false, format!("{}: {path}: {e}", r.name));
    // One directory per call: the tests run in parallel threads.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let dir = scratch("agent-config").join(n.to_string());
    let _ = fs::remove_dir_all(&dir);
    let mounts = match mount_volumes(r, pod, c, &dir, secrets) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let mut cfg: toml::Table = match toml::from_str(&text) {
        Ok(t) => t,
        Err(e) => return fail(e.to_string()),
    };
    apply_flags(&mut cfg, c);
    let moved = |v: &str| {
        let under = mounts.iter().any(|m| v.starts_with(&format!("{m}/")));
        under.then(|| format!("{}{v}", dir.display()))
    };
    move_paths(&mut cfg, &moved);
    let file = dir.join("config.toml");
    fs::write(&file, toml::to_string(&cfg).unwrap()).unwrap();
    let mut cmd = Command::new(crate::agent_binary());
    cmd.args(["check-config", &file.display().to_string()]);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("OTEL_") || k == "NODE_NAME") {
        cmd.env_remove(k);
    }
    let mut env: Vec<(String, String)> = vec![];
    for e in seq(&c["env"]) {
        let from = &e["valueFrom"];
        let secret = &from["secretKeyRef"];
        let mut value = if !secret.is_null() {
            let (name, key) = (s(&secret["name"]), s(&secret["key"]));
            match secrets(name, key) {
                Some(b) => String::from_utf8_lossy(&b).into_owned(),
                None => {
                    return fail(format!(
                        "env {}: no data for Secret {name} key {key}",
                        s(&e["name"])
                    ))
                }
            }
        } else {
            match s(&from["fieldRef"]["fieldPath"]) {
                "" => s(&e["value"]).to_string(),
                "spec.nodeName" => "gpu-node-1".into(),
                "metadata.name" => "gpu-agent-x7k2p".into(),
                "metadata.namespace" => "gpu-agent".into(),
                _ => "192.0.2.10".into(),
            }
        };
        // The kubelet expands $(VAR) in `value` only.
        if secret.is_null() {
            for (k, v) in &env {
                value = value.replace(&format!("$({k})"), v);
            }
        }
        env.push((s(&e["name"]).to_string(), value));
    }
    let (ok, out) = run(cmd.envs(env));
    (
        ok,
        format!("{}: {path}: gpu-agent check-config: {out}", r.name),
    )
}

/// Writes the files of the ConfigMap and Secret volumes the container mounts under `dir`, at
/// their mount paths; returns those mount paths.
fn mount_volumes(
    r: &Rendered,
    pod: &Value,
    c: &Value,
    dir: &Path,
    secrets: SecretData,
) -> Result<Vec<String>, String> {
    let mut mounts = vec![];
    for m in seq(&c["volumeMounts"]) {
        let at = s(&m["mountPath"]).trim_end_matches('/');
        let Some(v) = seq(&pod["volumes"]).iter().find(|v| v["name"] == m["name"]) else {
            return Err(format!(
                "volumeMount {at}: no volume {}",
                scalar(&m["name"])
            ));
        };
        let (name, files): (&str, Vec<(String, Vec<u8>)>) = if !v["configMap"].is_null() {
            let name = s(&v["configMap"]["name"]);
            let cm = r
                .find("ConfigMap", name)
                .ok_or_else(|| format!("volume {}: no ConfigMap {name}", s(&v["name"])))?;
            let data = cm["data"].as_mapping().cloned().unwrap_or_default();
            let files = data
                .iter()
                .map(|(k, d)| (s(k).to_string(), s(d).as_bytes().to_vec()));
            (name, files.collect())
        } else if !v["secret"].is_null() {
            let name = s(&v["secret"]["secretName"]);
            let mut files = vec![];
            for item in seq(&v["secret"]["items"]) {
                let key = s(&item["key"]);
                let data = secrets(name, key).ok_or_else(|| {
                    format!(
                        "volume {}: no data for Secret {name} key {key}",
                        s(&v["name"])
                    )
                })?;
                files.push((s(&item["path"]).to_string(), data));
            }
            (name, files)
        } else {
            continue;
        };
        let to = dir.join(at.trim_start_matches('/'));
        fs::create_dir_all(&to).unwrap();
        for (file, data) in files {
            fs::write(to.join(&file), data).unwrap_or_else(|e| panic!("{name}: {file}: {e}"));
        }
        mounts.push(at.to_string());
    }
    Ok(mounts)
}

/// Every string of a TOML table that `moved` maps, replaced.
fn move_paths(t: &mut toml::Table, moved: &dyn Fn(&str) -> Option<String>) {
    for (_, v) in t.iter_mut() {
        match v {
            toml::Value::String(p) => {
                if let Some(m) = moved(p) {
                    *p = m;
                }
            }
            toml::Value::Table(t) => move_paths(t, moved),
            _ => {}
        }
    }
}
