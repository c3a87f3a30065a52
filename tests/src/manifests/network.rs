//! Where the agent listens and who reaches it: its addresses, container ports and probes,
//! the ServiceMonitor and PodMonitor, and the NetworkPolicy.
use serde_yaml::Value;

use super::{
    agent, agent_config, arg_after, container_port, get, labels_match, port_of, s, scalar, seq,
    Rendered, DEFAULT_HTTP_ADDR,
};

/// An address of the agent: from its flag, else its config key, else `default`:
/// (address, where it came from).
pub fn agent_addr(
    r: &Rendered,
    pod: &Value,
    c: &Value,
    flag: &str,
    key: &str,
    default: Option<&str>,
) -> Result<Option<(String, String)>, String> {
    if let Some(a) = arg_after(c, flag) {
        return Ok(Some((a.to_string(), flag.to_string())));
    }
    let (path, cfg) = agent_config(r, pod, c)?;
    let found = get(&cfg, "http", key).or(default);
    Ok(found.map(|a| (a.to_string(), format!("http.{key} in {path}"))))
}

pub fn is_loopback(addr: &str) -> bool {
    addr.starts_with("127.") || addr.starts_with("[::1]:") || addr.starts_with("localhost:")
}

/// The agent's metrics address (--metrics-addr, or http.metrics_addr): (address, source).
pub fn metrics_addr(r: &Rendered, pod: &Value, c: &Value) -> Result<(String, String), String> {
    let found = agent_addr(r, pod, c, "--metrics-addr", "metrics_addr", None)?;
    found.ok_or_else(|| {
        format!(
            "{}: the agent has no --metrics-addr or http.metrics_addr: the probes and \
            Prometheus need /metrics, /healthz and /readyz on the pod IP",
            r.name
        )
    })
}

/// The agent's http.addr (every endpoint, /debug/* included) stays on loopback and has no
/// containerPort; its metrics address listens on the pod IP, and the probes and the container
/// port are on it; a ServiceMonitor reaches that port through its Service, and a PodMonitor
/// directly, and both keep the workload labels.
pub fn port_problems(r: &Rendered) -> Vec<String> {
    let Some((ds, pod, c)) = agent(r) else {
        return vec![];
    };
    let (at, mut p) = (r.at(ds), vec![]);
    match agent_addr(r, pod, c, "--http-addr", "addr", Some(DEFAULT_HTTP_ADDR)) {
        Ok(Some((debug, from))) => {
            flag!(
                p,
                !is_loopback(&debug),
                "{at}: {from} is {debug}: it serves /debug/* (every process on the host), \
                which must stay on the pod's loopback; the network gets the metrics address"
            );
            let port = port_of(&debug);
            let exposed = seq(&c["ports"])
                .iter()
                .any(|cp| cp["containerPort"].as_u64() == port);
            flag!(
                p,
                exposed,
                "{at}: a containerPort is {from}'s port ({debug}), which listens on loopback only"
            );
        }
        Ok(None) => {}
        Err(e) => return vec![e],
    }
    let (addr, from) = match metrics_addr(r, pod, c) {
        Ok(a) => a,
        Err(e) => return vec![e],
    };
    let port = port_of(&addr);
    let all = addr.starts_with("0.0.0.0:") || addr.starts_with("[::]:");
    flag!(
        p,
        !all,
        "{at}: {from} is {addr}: the kubelet's probes and Prometheus come to the pod IP"
    );
    let has_port = seq(&c["ports"])
        .iter()
        .any(|cp| cp["containerPort"].as_u64() == port);
    flag!(p, !has_port, "{at}: no containerPort for {from} ({addr})");
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        let ok = s(&get["path"]) == path && container_port(c, &get["port"]) == port;
        let (got_path, got_port) = (scalar(&get["path"]), scalar(&get["port"]));
        flag!(
            p,
            !ok,
            "{at}: {probe}.httpGet is {got_path} on port {got_port}, not {path} on \
            {from}'s port ({addr})"
        );
    }
    p.extend(service_monitor_problems(r, ds, c, port, &addr, &from));
    p.extend(pod_monitor_problems(r, ds, c, port, &addr, &from));
    p
}

pub fn service_monitor_problems(
    r: &Rendered,
    ds: &Value,
    c: &Value,
    port: Option<u64>,
    addr: &str,
    from: &str,
) -> Vec<String> {
    let mut p = vec![];
    let pod_labels = &ds["spec"]["template"]["metadata"]["labels"];
    for sm in r.of_kind("ServiceMonitor") {
        let sel = &sm["spec"]["selector"]["matchLabels"];
        let services: Vec<&Value> = r
            .of_kind("Service")
            .filter(|v| labels_match(sel, &v["metadata"]["labels"]))
            .collect();
        flag!(
            p,
            services.is_empty(),
            "{}: spec.selector.matchLabels selects no Service",
            r.at(sm)
        );
        for (i, ep) in seq(&sm["spec"]["endpoints"]).iter().enumerate() {
            let sm_at = r.at(sm);
            flag!(
                p,
                ep["honorLabels"] != true,
                "{sm_at}: endpoints[{i}].honorLabels must be true, \
                or Prometheus renames the workload's namespace/pod/container labels to exported_*"
            );
            for svc in &services {
                let sp = seq(&svc["spec"]["ports"])
                    .iter()
                    .find(|sp| sp["name"] == ep["port"]);
                let target = sp.map(|sp| {
                    if sp["targetPort"].is_null() {
                        &sp["port"]
                    } else {
                        &sp["targetPort"]
                    }
                });
                let reaches = labels_match(&svc["spec"]["selector"], pod_labels)
                    && target.and_then(|t| container_port(c, t)) == port;
                let ep_port = scalar(&ep["port"]);
                let via = r.at(svc);
                flag!(
                    p,
                    !reaches,
                    "{sm_at}: endpoints[{i}].port {ep_port} does not reach the agent's \
                    pods on {from}'s port ({addr}) through {via}"
                );
            }
        }
    }
    p
}

/// A PodMonitor selects the agent's pods and scrapes the metrics port by name, keeping the
/// workload's labels.
pub fn pod_monitor_problems(
    r: &Rendered,
    ds: &Value,
    c: &Value,
    port: Option<u64>,
    addr: &str,
    from: &str,
) -> Vec<String> {
    let mut p = vec![];
    let pod_labels = &ds["spec"]["template"]["metadata"]["labels"];
    for pm in r.of_kind("PodMonitor") {
        let at = r.at(pm);
        flag!(
            p,
            !labels_match(&pm["spec"]["selector"]["matchLabels"], pod_labels),
            "{at}: spec.selector.matchLabels does not select the agent's pods"
        );
        for (i, ep) in seq(&pm["spec"]["podMetricsEndpoints"]).iter().enumerate() {
            flag!(
                p,
                ep["honorLabels"] != true,
                "{at}: podMetricsEndpoints[{i}].honorLabels must be true, \
                or Prometheus renames the workload's namespace/pod/container labels to exported_*"
            );
            // A PodMonitor names the container port; a number would need portNumber.
            let named = ep["port"].as_str().is_some();
            flag!(
                p,
                !named || container_port(c, &ep["port"]) != port,
                "{at}: podMetricsEndpoints[{i}].port {} is not the name of the container port \
                on {from}'s port ({addr})",
                scalar(&ep["port"])
            );
        }
    }
    p
}

/// A NetworkPolicy selects the agent's pods, restricts their ingress, and admits traffic only
/// to the metrics port and only from a selected namespace (Prometheus's), never from
/// everywhere.
pub fn network_policy_problems(r: &Rendered) -> Vec<String> {
    let Some((ds, pod, c)) = agent(r) else {
        return vec![];
    };
    let at = r.at(ds);
    let port = match metrics_addr(r, pod, c) {
        Ok((addr, _)) => port_of(&addr),
        Err(e) => return vec![e],
    };
    let labels = &ds["spec"]["template"]["metadata"]["labels"];
    let policies: Vec<&Value> = r
        .of_kind("NetworkPolicy")
        .filter(|np| labels_match(&np["spec"]["podSelector"]["matchLabels"], labels))
        .collect();
    if policies.is_empty() {
        return vec![format!(
            "{at}: no NetworkPolicy selects the agent's pods: any pod may scrape them"
        )];
    }
    let mut p = vec![];
    for np in policies {
        let npat = r.at(np);
        let ingress = seq(&np["spec"]["policyTypes"])
            .iter()
            .any(|t| t == "Ingress");
        flag!(
            p,
            !ingress,
            "{npat}: policyTypes lacks Ingress: it restricts nothing coming in"
        );
        for (i, rule) in seq(&np["spec"]["ingress"]).iter().enumerate() {
            let from = seq(&rule["from"]);
            let open = from.is_empty()
                || from.iter().any(|f| {
                    f["namespaceSelector"].is_null() && f["podSelector"].is_null()
                        || f["namespaceSelector"]
                            .as_mapping()
                            .is_some_and(|m| m.is_empty())
                });
            flag!(
                p,
                open,
                "{npat}: ingress[{i}] admits every namespace: name Prometheus's in from[].namespaceSelector"
            );
            let ports = seq(&rule["ports"]);
            let only_metrics = !ports.is_empty()
                && ports
                    .iter()
                    .all(|pp| container_port(c, &pp["port"]) == port);
            flag!(
                p,
                !only_metrics,
                "{npat}: ingress[{i}].ports must be the metrics port only ({})",
                port.map_or("none".into(), |n| n.to_string())
            );
        }
    }
    p
}
