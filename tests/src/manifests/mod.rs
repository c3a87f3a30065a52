//! Manifests as a cluster receives them, and the checks that are specific to gpu-agent:
//! tests/tests/deploy.rs runs them over every kustomization under deploy/, and
//! tests/tests/helm.rs over every render of the Helm chart. Each check returns the problems
//! it finds, naming the object and field; docs/deploy.md, "What CI checks", lists them.
//!
//! Here: the constants the checks share and the `flag!` macro. `render.rs` renders the
//! kustomizations, `read.rs` reads values out of the objects, and the checks are by area:
//! `namespace.rs`, `network.rs` (addresses, ports, probes, monitors, NetworkPolicy),
//! `privileges.rs`, `collector.rs`, `config.rs` (`gpu-agent check-config` on what the pod
//! is given) and `validate.rs` (kubernetes-validate).

/// Adds a problem when `bad` holds. Defined before the modules below, which use it.
#[macro_export]
macro_rules! flag {
    ($p:expr, $bad:expr, $($msg:tt)+) => {
        if $bad {
            $p.push(format!($($msg)+));
        }
    };
}

mod collector;
mod config;
mod namespace;
mod network;
mod privileges;
mod read;
mod render;
mod validate;

pub use self::{
    collector::*, config::*, namespace::*, network::*, privileges::*, read::*, render::*,
    validate::*,
};
pub use crate::root;

/// Capabilities the unprivileged agent adds, and why (deploy/kubernetes/daemonset.yaml).
pub const AGENT_CAPS: [(&str, &str); 5] = [
    ("BPF", "load the eBPF programs and maps"),
    ("PERFMON", "attach them to tracepoints (perf_event_open)"),
    (
        "DAC_READ_SEARCH",
        "open_by_handle_at on cgroup ids; read tracefs and every process's /proc entries",
    ),
    (
        "DAC_OVERRIDE",
        "connect to the root-owned CRI and kubelet sockets as a non-root user",
    ),
    (
        "SYS_RESOURCE",
        "raise RLIMIT_MEMLOCK for the maps before 5.11",
    ),
];
/// Only with components/tracefs-mount: mounting tracefs where the host has none.
pub const TRACEFS_MOUNT_CAP: &str = "SYS_ADMIN";
/// The agent's http.addr when its config has none (docs/configuration.md).
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9464";
pub const CLUSTER_SCOPED: [&str; 5] = [
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "RuntimeClass",
];
/// The oldest Kubernetes the manifests support (securityContext.appArmorProfile is 1.30+) and
/// the newest kubernetes-validate 1.37.0 bundles.
pub const K8S_VERSIONS: [&str; 2] = ["1.30.0", "1.37.0"];
/// Where DRA's `resource.k8s.io/v1` is (GA in 1.34): the versions a manifest that claims
/// devices through it is validated against.
pub const DRA_K8S_VERSIONS: [&str; 2] = ["1.34.0", "1.37.0"];
/// CRDs kubernetes-validate has no schema for: it warns and skips them, and so do we.
pub const CRD_API_GROUP: &str = "monitoring.coreos.com/";
