//! Every configuration key, documented once: `cargo xtask config-doc` writes
//! docs/configuration.md from [`reference`]. Defaults are read from `Config::default()`, and
//! ranges are the constants validation checks, so neither is written here twice. The
//! tests below fail when a key of the config is missing here, when this names a key the
//! config does not have, and when a documented range, value or variable is not what the
//! code enforces or reads.
use super::{
    Bounds, CacheConfig, Config, EbpfConfig, HttpConfig, MetadataConfig, NvmlConfig,
    MAX_PROCESSES_CAP, RING_BUFFER_MAX, V1_CONTROLLERS,
};

/// One key: its full dotted TOML path, what it holds and what it does.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyDoc {
    /// `http.tls.cert_file`; a top-level key has no dot.
    pub key: &'static str,
    pub ty: Type,
    /// The default as a TOML value, from `Config::default()`; None: unset.
    pub default: Option<String>,
    pub allowed: Allowed,
    /// A TOML value, for a key unset by default: the docs show it, the tests set it. Where
    /// unset stands for a fixed value, that value.
    pub example: Option<String>,
    /// Environment variables that stand for the key: the OTEL_* ones override it, NODE_NAME
    /// fills it in when unset.
    pub env: &'static [&'static str],
    /// The `run` flag that overrides the key.
    pub flag: Option<&'static str>,
    pub doc: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    Bool,
    Count,
    Millis,
    Secs,
    Bytes,
    String,
    Path,
    /// `host:port`.
    Address,
    /// A table of strings by string.
    Map,
    /// An array of strings.
    List,
}

impl Type {
    pub fn name(self) -> &'static str {
        match self {
            Type::Bool => "boolean",
            Type::Count => "integer",
            Type::Millis => "integer (ms)",
            Type::Secs => "integer (s)",
            Type::Bytes => "integer (bytes)",
            Type::String => "string",
            Type::Path => "path",
            Type::Address => "address (host:port)",
            Type::Map => "table of strings",
            Type::List => "array of strings",
        }
    }

    /// The unit of an integer, as [`Bounds::unit`] spells it.
    pub fn unit(self) -> Option<&'static str> {
        match self {
            Type::Count => Some(""),
            Type::Millis => Some("ms"),
            Type::Secs => Some("s"),
            Type::Bytes => Some("bytes"),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Allowed {
    /// Anything of the type.
    Any,
    Range(Bounds),
    /// Exactly one of these strings.
    OneOf(&'static [&'static str]),
    /// A rule in words.
    Rule(String),
}

/// Every table, in the order the docs list them, with what it is for; "" is the top level.
pub const TABLES: &[(&str, &str)] = &[
    ("", "Keys outside any table."),
    (
        "http",
        "Where the endpoints listen, and the limits that keep a hostile client from \
         exhausting the agent. `addr` serves everything and stays on loopback; \
         `metrics_addr` serves only /metrics, /healthz and /readyz and may face the \
         network (docs/deploy.md).",
    ),
    (
        "http.tls",
        "TLS on `http.metrics_addr`, with the keys of Prometheus exporters' \
         `tls_server_config` (web.yml). The certificate and key are read and checked at \
         start-up and by `check-config`.",
    ),
    (
        "http.auth",
        "Credentials that /metrics on `http.metrics_addr` requires; either admits. \
         /healthz and /readyz stay open.",
    ),
    (
        "ebpf",
        "The kernel programs that follow processes and their cgroups.",
    ),
    ("cache", "The process cache."),
    ("cgroup", "How a process's cgroup is read."),
    ("nvml", "GPU sampling through NVML."),
    (
        "metadata",
        "Pod and container names and GPU allocations, from the node's sockets.",
    ),
    (
        "prometheus",
        "Prometheus text at /metrics on the HTTP addresses.",
    ),
    ("dcgm", "dcgm-exporter compatibility (`prometheus.compat`)."),
    (
        "xid",
        "XID errors: NVML's event API counts them per GPU; the kernel log names the \
         process.",
    ),
    (
        "otlp",
        "OTLP push of metrics (and usage records as logs). The standard OTEL_* variables \
         override each key.",
    ),
    (
        "metrics",
        "The metric groups every sink emits (docs/metrics.md).",
    ),
    (
        "usage",
        "Usage records, NVML accounting, peaks and quotas: what a chargeback system bills \
         from (docs/usage.md).",
    ),
];

/// Variables the agent reads that override no key.
pub const ENV_ONLY: &[(&str, &str)] = &[(
    "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
    "Where usage records are pushed as OTLP logs, used as is. Unset: the base endpoint \
     (OTEL_EXPORTER_OTLP_ENDPOINT, else otlp.endpoint) with /v1/logs over HTTP, as is over \
     gRPC; never the metrics URL. Neither set: usage records are not pushed (said once).",
)];

/// Every key, with its default from `Config::default()`.
pub fn reference() -> Vec<KeyDoc> {
    let defaults = serde_json::to_value(Config::default()).expect("the config serializes");
    let mut keys = [
        top(),
        http(),
        http_security(),
        ebpf(),
        process(),
        nvml(),
        metadata(),
        prometheus(),
        otlp(),
        usage(),
    ]
    .concat();
    for k in &mut keys {
        k.default = defaults.pointer(&pointer(k.key)).and_then(toml_value);
    }
    keys
}

/// The JSON pointer of a dotted key.
pub(super) fn pointer(key: &str) -> String {
    format!("/{}", key.replace('.', "/"))
}

/// A JSON value as a TOML value; None for null (TOML has none).
fn toml_value(v: &serde_json::Value) -> Option<String> {
    toml::Value::try_from(v).ok().map(|t| t.to_string())
}

fn key(key: &'static str, ty: Type, doc: impl Into<String>) -> KeyDoc {
    KeyDoc {
        key,
        ty,
        default: None,
        allowed: Allowed::Any,
        example: None,
        env: &[],
        flag: None,
        doc: doc.into(),
    }
}

impl KeyDoc {
    fn range(mut self, b: Bounds) -> Self {
        self.allowed = Allowed::Range(b);
        self
    }

    fn one_of(mut self, values: &'static [&'static str]) -> Self {
        self.allowed = Allowed::OneOf(values);
        self
    }

    fn rule(mut self, rule: impl Into<String>) -> Self {
        self.allowed = Allowed::Rule(rule.into());
        self
    }

    fn example(mut self, toml: impl Into<String>) -> Self {
        self.example = Some(toml.into());
        self
    }

    fn env(mut self, vars: &'static [&'static str]) -> Self {
        self.env = vars;
        self
    }

    fn flag(mut self, flag: &'static str) -> Self {
        self.flag = Some(flag);
        self
    }

    /// The key within its table.
    pub fn name(&self) -> &'static str {
        self.key.rsplit('.').next().unwrap_or(self.key)
    }

    /// The table the key sits in: "" for the top level.
    pub fn table(&self) -> &'static str {
        self.key.rsplit_once('.').map_or("", |(t, _)| t)
    }
}

fn top() -> Vec<KeyDoc> {
    vec![key(
        "node_name",
        Type::String,
        "The node's name: `k8s.node.name` on every resource. Unset: the NODE_NAME \
             variable \
         (the downward API's `spec.nodeName`).",
    )
    .example(r#""gpu-node-1""#)
    .env(&["NODE_NAME"])]
}

fn http() -> Vec<KeyDoc> {
    vec![
        key(
            "http.addr",
            Type::Address,
            "Every endpoint: /healthz, /readyz, /metrics and /debug/* (which lists every \
             process on the host).",
        )
        .rule("a loopback address, unless `http.expose_debug`")
        .flag("--http-addr"),
        key(
            "http.metrics_addr",
            Type::Address,
            "/metrics, /healthz and /readyz only, on any address: the one to expose to \
             Prometheus and the kubelet's probes. TLS and authentication apply here. \
             Unset: not served.",
        )
        .rule("not `http.addr`")
        .example(r#""0.0.0.0:9465""#)
        .flag("--metrics-addr"),
        key(
            "http.expose_debug",
            Type::Bool,
            "Let `http.addr`, and so /debug/*, listen on a non-loopback address, on \
             purpose.",
        ),
        key(
            "http.max_connections",
            Type::Count,
            "Open connections per address. At the cap a new connection closes the oldest \
             one that is not being answered, so a flood of idle connections cannot lock \
             out the probes.",
        )
        .range(HttpConfig::MAX_CONNECTIONS),
        key(
            "http.max_concurrent_requests",
            Type::Count,
            "Expensive requests (/metrics, /debug/*) answered at once per address; more \
             wait for a turn until `http.request_timeout_ms`, then get 503. /healthz and \
             /readyz never wait.",
        )
        .range(HttpConfig::MAX_CONCURRENT_REQUESTS),
        key(
            "http.header_read_timeout_ms",
            Type::Millis,
            "Time a client has to send a request's headers; also how long an idle \
             keep-alive connection is kept.",
        )
        .range(HttpConfig::HEADER_READ_TIMEOUT_MS),
        key(
            "http.max_request_header_bytes",
            Type::Bytes,
            "Request line and headers; a larger request gets 431.",
        )
        .range(HttpConfig::MAX_REQUEST_HEADER_BYTES),
        key(
            "http.request_timeout_ms",
            Type::Millis,
            "From a request's headers to the last byte of its answer, waiting for a turn \
             included; a client that reads slower than this loses the answer.",
        )
        .range(HttpConfig::REQUEST_TIMEOUT_MS),
    ]
}

/// `[http.tls]` and `[http.auth]`.
fn http_security() -> Vec<KeyDoc> {
    vec![
        key(
            "http.tls.cert_file",
            Type::Path,
            "PEM certificate chain, the server's own certificate first. Required in \
             `[http.tls]`.",
        )
        .example(r#""/etc/gpu-agent/tls/tls.crt""#),
        key(
            "http.tls.key_file",
            Type::Path,
            "PEM private key (PKCS#8, PKCS#1 or SEC1) of `cert_file`. Required in \
             `[http.tls]`.",
        )
        .example(r#""/etc/gpu-agent/tls/tls.key""#),
        key(
            "http.tls.client_ca_file",
            Type::Path,
            "PEM CA bundle that client certificates must chain to.",
        )
        .example(r#""/etc/gpu-agent/tls/ca.crt""#),
        key(
            "http.tls.client_auth_type",
            Type::String,
            "Unset: RequireAndVerifyClientCert with a `client_ca_file`, NoClientCert \
             without. The two that verify need a `client_ca_file`; NoClientCert refuses \
             one.",
        )
        .one_of(&[
            "NoClientCert",
            "VerifyClientCertIfGiven",
            "RequireAndVerifyClientCert",
        ])
        .example(r#""VerifyClientCertIfGiven""#),
        key(
            "http.auth.basic_auth_users",
            Type::Map,
            "User name to bcrypt hash (`htpasswd -nBC 10 USER`), as exporter-toolkit's \
             `basic_auth_users`.",
        )
        .rule("bcrypt hashes; user names without `:`")
        .example(r#"{ prometheus = "$2y$10$..." }"#),
        key(
            "http.auth.bearer_token_file",
            Type::Path,
            "A file holding the bearer token (a mounted Secret), read at start-up: one \
             token, no whitespace inside.",
        )
        .example(r#""/etc/gpu-agent/auth/token""#),
    ]
}

fn ebpf() -> Vec<KeyDoc> {
    vec![
        key(
            "ebpf.enabled",
            Type::Bool,
            "false: run in /proc mode without trying eBPF.",
        )
        .flag("--no-ebpf"),
        key(
            "ebpf.max_processes",
            Type::Count,
            format!(
                "Capacity of the kernel PROCS map (processes tracked at once). Unset: the \
             host's kernel.pid_max, at most {MAX_PROCESSES_CAP} (15 MiB of kernel \
             memory). The SLOTS array beside it has as many slots, rounded up to a power \
             of two (64 bytes each). When it is full: a warning, `degraded_reason` in \
             /debug/stats, and /proc lookups for what does not fit."
            ),
        )
        .range(EbpfConfig::MAX_PROCESSES)
        .example("65536"),
        key(
            "ebpf.ring_buffer_bytes",
            Type::Bytes,
            "The ring buffer the kernel programs notify the agent through.",
        )
        .rule(format!(
            "a power of two from the page size to {} MiB",
            RING_BUFFER_MAX >> 20
        )),
        key(
            "ebpf.poll_interval_ms",
            Type::Millis,
            "How often the agent drains the ring buffer when the kernel did not wake it.",
        )
        .range(EbpfConfig::POLL_INTERVAL_MS),
        key(
            "ebpf.wakeup_bytes",
            Type::Bytes,
            "Bytes waiting in the ring buffer that make the kernel wake the agent early; \
             0 wakes it on every event (costly under exec storms), \
             `ebpf.ring_buffer_bytes` never early.",
        )
        .rule("0 to `ebpf.ring_buffer_bytes`"),
        key(
            "ebpf.program_stats",
            Type::Bool,
            "Turn on the kernel's per-program run-time statistics \
             (kernel.bpf_stats_enabled), shown in /debug/stats. Costs a little on every \
             program run.",
        ),
        key(
            "ebpf.task_iterator",
            Type::Bool,
            "The start-up walk lets the kernel iterate its tasks (Linux 5.8 with BTF) \
             instead of reading /proc/PID/stat per process; false reads /proc.",
        ),
        key(
            "ebpf.btf_tracepoints",
            Type::Bool,
            "fork, exec and exit on BTF tracepoints (Linux 5.5 with BTF), reading the \
             task with plain loads; false, or where they cannot load, the classic \
             tracepoints (`process_programs` in /debug/stats).",
        ),
    ]
}

/// `[cache]`, `[cgroup]` and `[xid]`: what the agent reads about processes.
fn process() -> Vec<KeyDoc> {
    vec![
        key(
            "cache.tombstone_secs",
            Type::Secs,
            "How long an exited process stays joinable (to an NVML sample taken just \
             before it exited).",
        )
        .range(CacheConfig::TOMBSTONE_SECS),
        key(
            "cache.max_tombstones",
            Type::Count,
            "At most this many exited processes are kept; an exit storm evicts the \
             oldest.",
        )
        .range(CacheConfig::MAX_TOMBSTONES),
        key(
            "cache.procfs_rescan_secs",
            Type::Secs,
            "/proc mode only: how often /proc is rescanned.",
        )
        .range(CacheConfig::PROCFS_RESCAN_SECS),
        key(
            "cgroup.v1_hierarchy",
            Type::String,
            "The cgroup v1 hierarchy followed on hybrid hosts: `auto` tries memory, then \
             cpu, pids and name=systemd; `none` follows none.",
        )
        .rule(format!(
            "`auto`, `none`, `name=<hierarchy>` or a v1 controller: {}",
            V1_CONTROLLERS.join(", ")
        )),
        key("cgroup.proc_root", Type::Path, "Where /proc is read from.").rule("a mounted /proc"),
        key(
            "xid.kmsg",
            Type::Path,
            "Where the kernel log is read to charge an XID error to the process (and \
             container) it names; \"\" does not read it. Needs CAP_SYSLOG (or \
             kernel.dmesg_restrict=0).",
        ),
    ]
}

fn nvml() -> Vec<KeyDoc> {
    vec![
        key(
            "nvml.enabled",
            Type::Bool,
            "false: no GPU sampling (the process cache alone).",
        ),
        key(
            "nvml.lib_path",
            Type::Path,
            "The libnvidia-ml.so to load. Unset: the system's libnvidia-ml.so.1.",
        )
        .example(r#""/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1""#)
        .flag("--nvml-lib"),
        key(
            "nvml.interval_ms",
            Type::Millis,
            "How often the GPUs are sampled.",
        )
        .range(NvmlConfig::INTERVAL_MS),
        key(
            "nvml.process_detail",
            Type::Bool,
            "Per-process rows in the snapshot (and in metrics with `metrics.process`): \
             cardinality, so opt-in.",
        ),
        key(
            "nvml.slow_interval_ms",
            Type::Millis,
            "How often each GPU's own readings are taken (utilization, power, temperature, \
             clocks, ECC, throttle reasons, encoder and decoder, remapped rows, NVLink, \
             memory temperature, vGPU licence, accounting mode, MIG mode), \
             each GPU at its own point of the interval and on the cycle after an XID on \
             it; held in between. What charges \
             containers (the GPU's memory in use, its processes and their utilization) is \
             read every cycle.",
        )
        .range(NvmlConfig::SLOW_INTERVAL_MS),
        key(
            "nvml.gpm_interval_ms",
            Type::Millis,
            "How often GPM profiling is sampled (1.6 ms of CPU a GPU on a real driver), on \
             the first of the GPU's slow cycles when due; the profiling metrics average \
             over the time between two samples.",
        )
        .range(NvmlConfig::GPM_INTERVAL_MS),
        key(
            "nvml.energy_interval_ms",
            Type::Millis,
            "How often each GPU's costly counters are read: energy (3-6 ms of CPU a read on \
             a real driver) and PCIe replays (0.36 ms); held in between, each energy \
             increase split over the cycles since the last read. Longer than \
             `nvml.slow_interval_ms`: on a cycle where no GPU takes its slow readings, at \
             most one slow interval late.",
        )
        .range(NvmlConfig::ENERGY_INTERVAL_MS),
        key(
            "nvml.crowded_list_interval_ms",
            Type::Millis,
            "How long the process lists of a GPU with many processes (32 or more) may be \
             held between reads (a real driver takes about 50 µs per listed process); read \
             at once when the GPU's memory in use moves by 64 MiB or a new PID shows up in \
             its utilization. A GPU with fewer has its lists held while its memory in use \
             and the PIDs in its utilization samples stay exactly the same, for 10 s at \
             most. 0: every GPU's lists every cycle.",
        )
        .range(NvmlConfig::CROWDED_LIST_INTERVAL_MS),
        key(
            "nvml.stall_timeout_ms",
            Type::Millis,
            "A GPU whose NVML call has not returned for this long is reported stalled \
             (a wedged driver: every call on a GPU fallen off the bus blocks): its \
             readings are left out rather than repeated, `/debug/stats` and \
             `gpu_agent_nvml_stalled` say so, and the other GPUs are read as before. \
             Unset: three intervals, at least 5 s.",
        )
        .range(NvmlConfig::STALL_TIMEOUT_MS)
        .example("10000"),
    ]
}

fn metadata() -> Vec<KeyDoc> {
    vec![
        key(
            "metadata.enabled",
            Type::Bool,
            "Read names and GPU allocations from the sockets below.",
        ),
        key(
            "metadata.cri_socket",
            Type::Path,
            "The CRI runtime socket, for pod and container names. Unset: autodetected at \
             the usual containerd and CRI-O paths.",
        )
        .example(r#""/run/containerd/containerd.sock""#)
        .flag("--cri-socket"),
        key(
            "metadata.pod_resources_socket",
            Type::Path,
            "The kubelet's pod-resources socket, for GPU allocations.",
        )
        .flag("--pod-resources-socket"),
        key(
            "metadata.docker_socket",
            Type::Path,
            "The Docker Engine API, for names on plain Docker hosts.",
        )
        .flag("--docker-socket"),
        key(
            "metadata.allocation_interval_secs",
            Type::Secs,
            "How often GPU allocations are re-read from the kubelet.",
        )
        .range(MetadataConfig::ALLOCATION_INTERVAL_SECS),
    ]
}

/// `[prometheus]`, `[dcgm]` and `[metrics]`.
fn prometheus() -> Vec<KeyDoc> {
    vec![
        key(
            "prometheus.enabled",
            Type::Bool,
            "Serve Prometheus text at /metrics (404 otherwise).",
        )
        .flag("--prometheus"),
        key(
            "prometheus.compat",
            Type::String,
            "Also serve dcgm-exporter's metrics at /metrics, per container: `dcgm`, its \
             default layout (the allocated pod's labels on each device's series), or \
             `dcgm-virtual-gpus`, its --kubernetes-virtual-gpus layout (a series per \
             pod).",
        )
        .one_of(&["dcgm", "dcgm-virtual-gpus"])
        .example(r#""dcgm""#)
        .flag("--prometheus-compat"),
        key(
            "dcgm.collectors",
            Type::Path,
            "A dcgm-exporter counters CSV (its `-f`): the DCGM fields to serve, with \
             their types and help; a field gpu-agent cannot serve is refused, naming the \
             line. Unset: dcgm-exporter's default counters. Needs `prometheus.compat`.",
        )
        .example(r#""/etc/dcgm-exporter/default-counters.csv""#)
        .flag("--collectors"),
        key(
            "dcgm.host_label",
            Type::String,
            "The name of dcgm-exporter's host label: `Hostname`, as its releases spell it, \
             or `hostname`, as its main branch does for its next release.",
        )
        .one_of(&["Hostname", "hostname"]),
        key("metrics.device", Type::Bool, "Per-GPU series."),
        key("metrics.container", Type::Bool, "Per-container series."),
        key(
            "metrics.process",
            Type::Bool,
            "Per-process series (cardinality).",
        ),
        key("metrics.self", Type::Bool, "The agent's own series."),
        key(
            "metrics.drop_attributes",
            Type::List,
            "Attributes left off every resource, data point and series (cardinality \
             control), by OTLP key (e.g. `hw.gpu.index`) or Prometheus label name (e.g. \
             `gpu`).",
        ),
    ]
}

mod sinks;
use sinks::*;

#[cfg(test)]
mod tests;
