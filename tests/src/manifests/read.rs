//! Reading the objects: YAML values as strings, sequences and keys, the agent's DaemonSet
//! and container, its flags and mounted config; and the assertions on a list of problems.
use serde_yaml::Value;

use super::Rendered;

pub fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

pub fn seq(v: &Value) -> &[Value] {
    v.as_sequence().map(Vec::as_slice).unwrap_or(&[])
}

pub fn keys(v: &Value) -> impl Iterator<Item = &str> {
    v.as_mapping().into_iter().flat_map(|m| m.keys()).map(s)
}

/// A scalar as YAML writes it, for messages.
pub fn scalar(v: &Value) -> String {
    serde_yaml::to_string(v)
        .unwrap_or_default()
        .trim_end()
        .to_string()
}

/// The port of "host:port" or "scheme://host:port/path".
pub fn port_of(addr: &str) -> Option<u64> {
    let hostport = addr.split("://").last()?.split('/').next()?;
    hostport.rsplit(':').next()?.parse().ok()
}

/// A port (a number, or the name of one of the container's ports) as a number.
pub fn container_port(c: &Value, port: &Value) -> Option<u64> {
    let named = || seq(&c["ports"]).iter().find(|cp| cp["name"] == *port);
    port.as_u64().or_else(|| named()?["containerPort"].as_u64())
}

pub fn labels_match(selector: &Value, labels: &Value) -> bool {
    let m = selector.as_mapping();
    m.is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// The gpu-agent DaemonSet (the one with a container named gpu-agent, whatever a Helm
/// release calls it), its pod spec and its container, where this rendering has them.
pub fn agent(r: &Rendered) -> Option<(&Value, &Value, &Value)> {
    r.of_kind("DaemonSet").find_map(|ds| {
        let pod = &ds["spec"]["template"]["spec"];
        let c = seq(&pod["containers"])
            .iter()
            .find(|c| c["name"] == "gpu-agent")?;
        Some((ds, pod, c))
    })
}

pub fn arg_after<'a>(c: &'a Value, flag: &str) -> Option<&'a str> {
    let args = seq(&c["args"]);
    let next = args.windows(2).find(|w| w[0] == flag).map(|w| s(&w[1]));
    next.or_else(|| {
        args.iter()
            .find_map(|a| s(a).strip_prefix(flag)?.strip_prefix('='))
    })
}

/// The file a container reads (`--config PATH`), from the ConfigMap mounted at its
/// directory: (PATH, text).
pub fn mounted_config(r: &Rendered, pod: &Value, c: &Value) -> Result<(String, String), String> {
    let at = format!("{}: container {}", r.name, s(&c["name"]));
    let path = arg_after(c, "--config").ok_or_else(|| format!("{at}: no --config in args"))?;
    let (dir, file) = path.rsplit_once('/').unwrap_or(("", path));
    let mount = seq(&c["volumeMounts"])
        .iter()
        .find(|m| s(&m["mountPath"]).trim_end_matches('/') == dir);
    let volume = mount.and_then(|m| seq(&pod["volumes"]).iter().find(|v| v["name"] == m["name"]));
    let cm = r.find(
        "ConfigMap",
        volume.map_or("", |v| s(&v["configMap"]["name"])),
    );
    match cm.and_then(|cm| cm["data"][file].as_str()) {
        Some(text) => Ok((path.to_string(), text.to_string())),
        None => Err(format!(
            "{at}: --config {path}: no ConfigMap key {file} is mounted at {dir}"
        )),
    }
}

pub fn agent_config(r: &Rendered, pod: &Value, c: &Value) -> Result<(String, toml::Table), String> {
    let (path, text) = mounted_config(r, pod, c)?;
    let cfg = toml::from_str(&text).map_err(|e| format!("{}: {path}: {e}", r.name))?;
    Ok((path, cfg))
}

pub fn get<'a>(t: &'a toml::Table, section: &str, key: &str) -> Option<&'a str> {
    t.get(section)?.get(key)?.as_str()
}

pub fn assert_none(problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

pub fn assert_found(problems: &[String], needle: &str) {
    let found = problems.iter().any(|p| p.contains(needle));
    assert!(found, "no problem says {needle:?}: {problems:#?}");
}
