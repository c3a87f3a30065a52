//! The agent's privileges: no GPU taken (no `nvidia.com/*` resource, DRA claims with admin
//! access only), the driver reached through the NVIDIA runtime, hostPID, read-only host
//! paths, the capabilities it needs and, unless privileged, a non-root user with the image's
//! file capabilities.
use std::{collections::BTreeSet, fs};

use serde_yaml::Value;

use super::{agent, keys, s, scalar, seq, Rendered, AGENT_CAPS, TRACEFS_MOUNT_CAP};
use crate::root;

/// No GPU taken from workloads; hostPID; host paths read-only; the capabilities the agent
/// needs, unless privileged.
pub fn privilege_problems(r: &Rendered) -> Vec<String> {
    let Some((ds, pod, c)) = agent(r) else {
        return vec![];
    };
    let (at, mut p) = (r.at(ds), vec![]);
    flag!(
        p,
        pod["hostPID"] != true,
        "{at}: hostPID must be true: NVML reports host PIDs, joined by PID with eBPF's"
    );
    for ctr in seq(&pod["containers"])
        .iter()
        .chain(seq(&pod["initContainers"]))
    {
        for section in ["requests", "limits"] {
            for k in keys(&ctr["resources"][section]).filter(|k| k.starts_with("nvidia.com/")) {
                let name = s(&ctr["name"]);
                p.push(format!(
                    "{at}: container {name} resources.{section}.{k}: the agent must never \
                    take a GPU from workloads (NVIDIA_VISIBLE_DEVICES=all gives it NVML)"
                ));
            }
        }
    }
    p.extend(claim_problems(r, &at, pod));
    p.extend(driver_problems(&at, c));
    for m in seq(&c["volumeMounts"]) {
        let volume = seq(&pod["volumes"]).iter().find(|v| v["name"] == m["name"]);
        let host = volume.is_some_and(|v| !v["hostPath"].is_null());
        flag!(
            p,
            host && m["readOnly"] != true,
            "{at}: hostPath mount {} must be readOnly: true",
            s(&m["mountPath"])
        );
    }
    let sc = &c["securityContext"];
    let added: BTreeSet<&str> = seq(&sc["capabilities"]["add"])
        .iter()
        .map(|c| s(c).trim_start_matches("CAP_"))
        .collect();
    for (cap, why) in AGENT_CAPS {
        flag!(
            p,
            sc["privileged"] != true && !added.contains(cap),
            "{at}: securityContext.capabilities.add lacks {cap} ({why}), and it is not privileged"
        );
    }
    if sc["privileged"] != true {
        p.extend(non_root_problems(r, &at, sc, &added));
    }
    p
}

/// NVML and every GPU's device node from the NVIDIA container runtime, with no GPU taken:
/// `NVIDIA_VISIBLE_DEVICES=all` and driver capabilities that include `utility` (NVML).
fn driver_problems(at: &str, c: &Value) -> Vec<String> {
    let env = |name: &str| {
        let e = seq(&c["env"]).iter().find(|e| e["name"] == name);
        e.map(|e| s(&e["value"]).to_string()).unwrap_or_default()
    };
    let mut p = vec![];
    let devices = env("NVIDIA_VISIBLE_DEVICES");
    flag!(
        p,
        devices != "all",
        "{at}: NVIDIA_VISIBLE_DEVICES is {devices:?}, not \"all\": the NVIDIA runtime gives \
        the agent every GPU's device node only so"
    );
    let caps = env("NVIDIA_DRIVER_CAPABILITIES");
    flag!(
        p,
        !caps
            .split(',')
            .any(|c| matches!(c.trim(), "utility" | "all")),
        "{at}: NVIDIA_DRIVER_CAPABILITIES {caps:?} lacks utility: NVML (libnvidia-ml) is in it"
    );
    p
}

/// Every DRA claim of the agent's pod is rendered beside it, and asks for admin access in
/// each request: a claim without it would take its devices from the workloads.
fn claim_problems(r: &Rendered, at: &str, pod: &Value) -> Vec<String> {
    let mut p = vec![];
    for claim in seq(&pod["resourceClaims"]) {
        let name = s(&claim["name"]);
        let spec = match (
            claim["resourceClaimTemplateName"].as_str(),
            claim["resourceClaimName"].as_str(),
        ) {
            (Some(t), _) => r
                .find("ResourceClaimTemplate", t)
                .map(|o| &o["spec"]["spec"]),
            (None, Some(c)) => r.find("ResourceClaim", c).map(|o| &o["spec"]),
            (None, None) => None,
        };
        let Some(spec) = spec else {
            p.push(format!(
                "{at}: resourceClaims {name}: its ResourceClaimTemplate or ResourceClaim is \
                not in this rendering"
            ));
            continue;
        };
        for req in seq(&spec["devices"]["requests"]) {
            flag!(
                p,
                req["exactly"]["adminAccess"] != true,
                "{at}: resourceClaims {name}: request {} lacks exactly.adminAccess: true: \
                the agent must never take a GPU from workloads",
                s(&req["name"])
            );
        }
    }
    p
}

/// The capabilities the image's binary carries (deploy/Dockerfile's `setcap CAPS+p`).
pub fn image_file_caps() -> BTreeSet<String> {
    let text = fs::read_to_string(root().join("deploy/Dockerfile")).unwrap();
    let spec = text
        .split_whitespace()
        .skip_while(|w| *w != "setcap")
        .nth(1)
        .expect("deploy/Dockerfile: no setcap line");
    let caps = spec.split('+').next().unwrap();
    caps.split(',')
        .map(|c| c.trim_start_matches("cap_").to_ascii_uppercase())
        .collect()
}

/// Unless privileged: a non-root user, no privilege escalation (unless SYS_ADMIN, which the
/// API server refuses with it), capabilities the image's file capabilities carry (a non-root
/// process gets no other), and SYS_ADMIN and AppArmor unconfined only where the rendering
/// asks for the agent to mount tracefs.
pub fn non_root_problems(
    r: &Rendered,
    at: &str,
    sc: &Value,
    added: &BTreeSet<&str>,
) -> Vec<String> {
    let mut p = vec![];
    let root = sc["runAsUser"].as_u64().is_none_or(|u| u == 0);
    flag!(
        p,
        root || sc["runAsNonRoot"] != true,
        "{at}: securityContext runs as root (runAsUser {}, runAsNonRoot {}): the image's file \
        capabilities give a non-root user what it needs",
        scalar(&sc["runAsUser"]),
        scalar(&sc["runAsNonRoot"])
    );
    let sys_admin = added.contains(TRACEFS_MOUNT_CAP);
    flag!(
        p,
        !sys_admin && sc["allowPrivilegeEscalation"] != false,
        "{at}: securityContext.allowPrivilegeEscalation must be false"
    );
    flag!(
        p,
        sys_admin && sc["allowPrivilegeEscalation"] == false,
        "{at}: allowPrivilegeEscalation: false with {TRACEFS_MOUNT_CAP}: the API server \
        refuses the pod"
    );
    let file_caps = image_file_caps();
    for cap in added.iter().filter(|c| !file_caps.contains(**c)) {
        p.push(format!(
            "{at}: capabilities.add {cap} is not in deploy/Dockerfile's setcap: the non-root \
            agent never gets it"
        ));
    }
    let unconfined = sc["appArmorProfile"]["type"] == "Unconfined";
    flag!(
        p,
        !r.tracefs_mount && (sys_admin || unconfined),
        "{at}: {TRACEFS_MOUNT_CAP} or AppArmor Unconfined outside \
        components/tracefs-mount (the chart's tracefsMount.enabled): only mounting tracefs \
        needs them"
    );
    flag!(
        p,
        r.tracefs_mount && !(sys_admin && unconfined),
        "{at}: components/tracefs-mount (the chart's tracefsMount.enabled) must add \
        {TRACEFS_MOUNT_CAP} and AppArmor Unconfined"
    );
    p
}
