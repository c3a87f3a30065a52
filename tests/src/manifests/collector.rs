//! The Collector against the agent: the OTLP receiver where the agent sends, and
//! k8sattributes associating the agent's resources.
use serde_yaml::Value;

use super::{agent, agent_config, get, keys, mounted_config, port_of, s, seq, Rendered};

/// The Collector receives where and how the agent sends (its OTEL_EXPORTER_OTLP_ENDPOINT, else
/// otlp.endpoint; on the node's address through a hostPort), and k8sattributes associates the
/// agent's resources by container.id and k8s.pod.uid.
pub fn collector_problems(agent_r: &Rendered, col: &Rendered) -> Vec<String> {
    let (endpoint, proto, port) = match agent_endpoint(agent_r) {
        Ok(e) => e,
        Err(e) => return vec![e],
    };
    let ds = col
        .of_kind("DaemonSet")
        .next()
        .expect("the Collector's DaemonSet");
    let cpod = &ds["spec"]["template"]["spec"];
    let cc = seq(&cpod["containers"])
        .first()
        .expect("the Collector's container");
    let conf: Value = match mounted_config(col, cpod, cc) {
        Ok((path, text)) => {
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {path}: {e}", col.name))
        }
        Err(e) => return vec![e],
    };
    let (at, mut p) = (format!("{}: collector config", col.name), vec![]);
    let ids = |section: &str, kinds: &[&str]| -> Vec<String> {
        keys(&conf[section])
            .filter(|k| kinds.contains(&k.split('/').next().unwrap()))
            .map(String::from)
            .collect()
    };
    let receivers = ids("receivers", &["otlp"]);
    let endpoint_of =
        |id: &String| s(&conf["receivers"][id.as_str()]["protocols"][proto]["endpoint"]);
    let listens = receivers
        .iter()
        .any(|id| port_of(endpoint_of(id)) == Some(port));
    flag!(
        p,
        !listens,
        "{at}: no otlp receiver's protocols.{proto}.endpoint is on port {port}, \
        where the agent sends ({endpoint})"
    );
    let forwards = |cp: &Value| {
        cp["hostPort"].as_u64() == Some(port) && cp["containerPort"].as_u64() == Some(port)
    };
    let via_node = endpoint.contains("$(HOST_IP)");
    let (no_hostport, cat) = (!seq(&cc["ports"]).iter().any(forwards), col.at(ds));
    flag!(
        p,
        via_node && no_hostport,
        "{cat}: the agent sends to the node's address \
        ({endpoint}) but no hostPort {port} reaches containerPort {port}"
    );
    let pipelines = conf["service"]["pipelines"]
        .as_mapping()
        .into_iter()
        .flat_map(|m| m.values());
    let fed_by_otlp = |pl: &&Value| {
        seq(&pl["receivers"])
            .iter()
            .any(|r| receivers.iter().any(|id| id == s(r)))
    };
    let fed: Vec<&str> = pipelines
        .filter(fed_by_otlp)
        .flat_map(|pl| seq(&pl["processors"]).iter().map(s))
        .collect();
    let k8s = ids("processors", &["k8sattributes", "k8s_attributes"]);
    flag!(
        p,
        !k8s.iter().any(|id| fed.contains(&id.as_str())),
        "{at}: no k8sattributes processor in a pipeline fed by the otlp receiver"
    );
    for id in &k8s {
        let sources = seq(&conf["processors"][id.as_str()]["pod_association"])
            .iter()
            .flat_map(|r| seq(&r["sources"]));
        let names: Vec<&str> = sources
            .filter(|src| src["from"] == "resource_attribute")
            .map(|src| s(&src["name"]))
            .collect();
        for need in ["container.id", "k8s.pod.uid"] {
            flag!(
                p,
                !names.contains(&need),
                "{at}: processors.{id}.pod_association has no \
                resource_attribute {need}: gpu-agent's container resources are identified by it"
            );
        }
    }
    p
}

/// Where and how the agent sends: (endpoint, "grpc" or "http", the endpoint's port).
fn agent_endpoint(agent_r: &Rendered) -> Result<(String, &'static str, u64), String> {
    let (_, pod, c) = agent(agent_r).expect("the base has the gpu-agent DaemonSet");
    let (_, cfg) = agent_config(agent_r, pod, c)?;
    let env = |k: &str| {
        seq(&c["env"])
            .iter()
            .find(|e| e["name"] == k)
            .and_then(|e| e["value"].as_str())
    };
    let endpoint = env("OTEL_EXPORTER_OTLP_ENDPOINT")
        .or(get(&cfg, "otlp", "endpoint"))
        .unwrap_or("");
    let protocol = env("OTEL_EXPORTER_OTLP_PROTOCOL").or(get(&cfg, "otlp", "protocol"));
    let proto = if protocol == Some("grpc") {
        "grpc"
    } else {
        "http"
    };
    let Some(port) = port_of(endpoint) else {
        return Err(format!(
            "{}: the agent's OTLP endpoint {endpoint:?} has no port",
            agent_r.name
        ));
    };
    Ok((endpoint.to_string(), proto, port))
}
