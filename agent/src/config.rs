//! Agent configuration: a TOML file, overridden by flags. Unknown or invalid fields are
//! errors that name the field. A new key needs its entry in `reference` (the tests fail
//! without one), from which `cargo xtask config-doc` writes docs/configuration.md.
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

mod http;
mod reference;
mod serialize;
pub use http::{AuthConfig, ClientAuthType, HttpConfig, TlsConfig};
pub use reference::{reference, Allowed, KeyDoc, Type, ENV_ONLY, TABLES};

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub http: HttpConfig,
    pub ebpf: EbpfConfig,
    pub cache: CacheConfig,
    pub cgroup: CgroupConfig,
    pub nvml: NvmlConfig,
    pub prometheus: PrometheusConfig,
    /// OTLP push; the standard OTEL_* variables override each key.
    #[serde(serialize_with = "serialize::otlp")]
    pub otlp: otel::export::OtlpConfig,
    /// Metric groups every sink emits.
    #[serde(serialize_with = "serialize::groups")]
    pub metrics: otel::Groups,
    /// k8s.node.name; the NODE_NAME variable (downward API) when unset.
    pub node_name: Option<String>,
    pub metadata: MetadataConfig,
    /// dcgm-exporter compatibility and XID events: see [`DcgmConfig`], [`XidConfig`].
    pub dcgm: DcgmConfig,
    pub xid: XidConfig,
    /// Usage records, NVML accounting, peaks and quotas (see `UsageConfig`).
    pub usage: UsageConfig,
}

/// The node's sockets for names and GPU allocations.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MetadataConfig {
    pub enabled: bool,
    /// CRI runtime socket; autodetected at the usual containerd/CRI-O paths when unset.
    pub cri_socket: Option<PathBuf>,
    pub pod_resources_socket: PathBuf,
    /// Docker Engine API, for names on plain Docker hosts.
    pub docker_socket: PathBuf,
    /// How often GPU allocations are re-read from the kubelet.
    pub allocation_interval_secs: u64,
}

impl MetadataConfig {
    pub fn allocation_interval(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.allocation_interval_secs)
    }
}

impl Default for MetadataConfig {
    fn default() -> Self {
        MetadataConfig {
            enabled: true,
            cri_socket: None,
            pod_resources_socket: PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock"),
            docker_socket: PathBuf::from("/var/run/docker.sock"),
            allocation_interval_secs: 30,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PrometheusConfig {
    /// Serve /metrics on the HTTP address.
    pub enabled: bool,
    /// "dcgm": also serve dcgm-exporter's metric names, per container.
    pub compat: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct NvmlConfig {
    /// false: no GPU sampling (the process cache alone).
    pub enabled: bool,
    /// libnvidia-ml.so to load; the system's (libnvidia-ml.so.1) when unset.
    pub lib_path: Option<PathBuf>,
    /// Collection interval.
    pub interval_ms: u64,
    /// Per-process rows in the snapshot (and later as metrics): cardinality, so opt-in.
    pub process_detail: bool,
    /// How often each GPU's own readings are taken (everything but its memory in use, its
    /// processes and their utilization, which charge containers every cycle); held in
    /// between.
    pub slow_interval_ms: u64,
    /// How often GPM profiling is sampled (1.6 ms a GPU on a real driver), on one of the
    /// GPU's slow cycles; its metrics average over the time between samples.
    pub gpm_interval_ms: u64,
    /// How often the costly counters are read (energy 5 ms a read on a real driver, PCIe
    /// replays 0.36 ms); held in between.
    /// Longer than `slow_interval_ms`, on a cycle where no GPU takes its slow readings.
    pub energy_interval_ms: u64,
    /// How long the process lists of a GPU with many processes (`CROWDED_GPU_PROCESSES`)
    /// may be held between reads: a real driver takes about 50 µs per listed process. Read
    /// at once when the device's memory moves or a new PID shows up in its utilization.
    /// Another GPU's lists are held only while nothing moves, for `LISTS_MAX_AGE`; zero
    /// reads every GPU's lists every cycle.
    pub crowded_list_interval_ms: u64,
    /// A GPU whose NVML call or cycle has not returned for this long is reported stalled
    /// (a wedged driver). Unset: three intervals, at least 5 s.
    pub stall_timeout_ms: Option<u64>,
}

impl Default for NvmlConfig {
    fn default() -> Self {
        NvmlConfig {
            enabled: true,
            lib_path: None,
            interval_ms: 1000,
            process_detail: false,
            slow_interval_ms: 10_000,
            gpm_interval_ms: 30_000,
            energy_interval_ms: 60_000,
            crowded_list_interval_ms: 5_000,
            stall_timeout_ms: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct EbpfConfig {
    /// false: run in /proc mode without trying eBPF.
    pub enabled: bool,
    /// Capacity of the kernel PROCS map (processes tracked at once). Unset: the host's
    /// kernel.pid_max (no more processes can exist), capped at 131072 (15 MiB of kernel
    /// memory). The SLOTS array beside it has as many slots, rounded up to a power of two
    /// (64 bytes each: 8 MiB at 131072).
    pub max_processes: Option<u32>,
    /// Ring buffer size in bytes: a power of two, a multiple of the page size.
    pub ring_buffer_bytes: u32,
    /// How often the consumer drains the ring buffer when the kernel did not wake it.
    pub poll_interval_ms: u64,
    /// Bytes waiting in the ring buffer that make the kernel wake the consumer early.
    /// 0 wakes it on every event (costly under exec storms).
    pub wakeup_bytes: u32,
    /// Enable the kernel's per-program run-time statistics (kernel.bpf_stats_enabled),
    /// shown in /debug/stats. Costs a little on every program run.
    pub program_stats: bool,
    /// The start-up walk lets the kernel iterate its tasks (Linux 5.8 with BTF) instead of
    /// reading /proc/PID/stat per process; false reads /proc.
    pub task_iterator: bool,
    /// The process programs attach to BTF tracepoints (Linux 5.5 with BTF) and read the
    /// task with plain loads; false, or where they cannot load, the classic tracepoints.
    pub btf_tracepoints: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    /// How long an exited process stays joinable (an NVML sample taken just before exit).
    pub tombstone_secs: u64,
    /// At most this many exited processes are kept; an exit storm evicts the oldest.
    pub max_tombstones: usize,
    /// /proc mode only: how often /proc is rescanned.
    pub procfs_rescan_secs: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CgroupConfig {
    /// The cgroup v1 hierarchy followed on hybrid hosts: "auto" (memory, then cpu, pids,
    /// name=systemd), a controller name such as "memory", or "none".
    pub v1_hierarchy: String,
    /// Where /proc is read from.
    pub proc_root: PathBuf,
}

impl Default for EbpfConfig {
    fn default() -> Self {
        EbpfConfig {
            enabled: true,
            max_processes: None,
            ring_buffer_bytes: 1 << 20,
            poll_interval_ms: 500,
            wakeup_bytes: 256 << 10,
            program_stats: false,
            task_iterator: true,
            btf_tracepoints: true,
        }
    }
}

/// The default capacity of the kernel process map: no more than pid_max processes can
/// exist, and beyond the cap the map's memory outweighs what a node runs.
const MAX_PROCESSES_CAP: u32 = 131_072;

impl EbpfConfig {
    /// The PROCS map's capacity: `max_processes`, or the host's pid_max capped.
    pub fn capacity(&self) -> u32 {
        self.max_processes.unwrap_or_else(|| {
            let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
                .unwrap_or(MAX_PROCESSES_CAP);
            pid_max.clamp(1024, MAX_PROCESSES_CAP)
        })
    }

    /// The SLOTS array's length: the capacity rounded up to a power of two (a process's
    /// slot is its tgid masked), so that where pid_max is no larger every tgid has a slot
    /// of its own; at most `MAX_PROCESSES_CAP` (64 bytes each: 8 MiB).
    pub fn slots(&self) -> u32 {
        self.capacity()
            .checked_next_power_of_two()
            .unwrap_or(MAX_PROCESSES_CAP)
            .min(MAX_PROCESSES_CAP)
    }
}

impl CacheConfig {
    pub fn tombstone(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.tombstone_secs)
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            tombstone_secs: 5,
            max_tombstones: 16_384,
            procfs_rescan_secs: 5,
        }
    }
}

impl Default for CgroupConfig {
    fn default() -> Self {
        CgroupConfig {
            v1_hierarchy: "auto".into(),
            proc_root: PathBuf::from("/proc"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config: {field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
}

/// A validated configuration, with the OTEL_* environment resolved once: what `run`,
/// `top` and `check-config` all start from.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    /// Where and how to push OTLP metrics; None when no endpoint is configured for them.
    pub otlp: Option<otel::export::OtlpSettings>,
    /// Where and how usage records go as OTLP logs; None when neither
    /// OTEL_EXPORTER_OTLP_LOGS_ENDPOINT nor a base endpoint is set.
    pub otlp_logs: Option<otel::export::OtlpSettings>,
}

impl Loaded {
    /// The sections (and top-level keys) that differ in `newer`: what a SIGHUP would
    /// change. Compared as written out, so that a section added later is compared too.
    pub fn changed_sections(&self, newer: &Loaded) -> Vec<String> {
        let json = |c: &Config| serde_json::to_value(c).expect("the config serializes");
        let (a, b) = (json(&self.config), json(&newer.config));
        let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
            unreachable!("a config is a table")
        };
        let mut out: Vec<String> = a
            .iter()
            .filter(|(k, v)| b.get(*k) != Some(v))
            .map(|(k, _)| k.clone())
            .collect();
        // The OTEL_* variables are part of [otlp].
        let same_otlp = self.otlp == newer.otlp && self.otlp_logs == newer.otlp_logs;
        if !same_otlp && !out.iter().any(|s| s == "otlp") {
            out.push("otlp".into());
        }
        out
    }
}

impl Config {
    /// Validates, and resolves the OTLP settings of each signal against the environment
    /// (`env` looks a variable up): the OTEL_* variables are configuration too, and a bad
    /// one is named.
    pub fn resolve(self, env: impl Fn(&str) -> Option<String>) -> Result<Loaded, ConfigError> {
        use otel::settings::Signal;
        self.validate()?;
        let resolve = |signal| {
            self.otlp
                .resolve_signal(signal, &env)
                .map_err(|message| ConfigError::Invalid {
                    field: "otlp",
                    message,
                })
        };
        let otlp = resolve(Signal::Metrics)?;
        let otlp_logs = resolve(Signal::Logs)?;
        Ok(Loaded {
            config: self,
            otlp,
            otlp_logs,
        })
    }

    pub fn from_file(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        let yaml = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml") | Some("yml")
        );
        let parsed = if yaml {
            Config::from_yaml(&text)
        } else {
            Config::from_toml(&text)
        };
        parsed.map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.into(),
                message,
            },
            other => other,
        })
    }

    pub fn from_yaml(text: &str) -> Result<Config, ConfigError> {
        // An empty YAML document is "no settings", as an empty TOML file is.
        let config: Config = if text.trim().is_empty() {
            Config::default()
        } else {
            serde_yaml::from_str(text).map_err(|e| ConfigError::Parse {
                path: PathBuf::new(),
                message: e.to_string(),
            })?
        };
        config.validate()?;
        Ok(config)
    }

    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: e.to_string().trim().replace('\n', " "),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Every value in range, so that nothing downstream can overflow or fail forever on
    /// it. Errors name the field and what it allows.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.ebpf.validate()?;
        self.nvml.validate()?;
        self.cache.validate()?;
        self.cgroup.validate()?;
        self.metadata.validate()?;
        self.validate_dcgm()?;
        self.http.validate()?;
        self.usage.validate()?;
        Ok(())
    }
}

fn invalid(field: &'static str, message: impl Into<String>) -> Result<(), ConfigError> {
    Err(ConfigError::Invalid {
        field,
        message: message.into(),
    })
}

/// The values an integer key takes: validation checks them, and docs/configuration.md
/// shows them (from the same constant, through [`reference`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub min: u64,
    pub max: u64,
    /// "ms", "s", "bytes", or "" for a count.
    pub unit: &'static str,
}

impl Bounds {
    pub const fn new(min: u64, max: u64, unit: &'static str) -> Bounds {
        Bounds { min, max, unit }
    }

    /// `value` within `min..=max`, or an error naming the field and the range.
    fn check(self, field: &'static str, value: u64) -> Result<(), ConfigError> {
        if (self.min..=self.max).contains(&value) {
            return Ok(());
        }
        let unit = match self.unit {
            "" => String::new(),
            u => format!(" {u}"),
        };
        invalid(
            field,
            format!("{value} is outside {}..={}{unit}", self.min, self.max),
        )
    }
}

/// A ring buffer larger than this pins more kernel memory than any node needs.
const RING_BUFFER_MAX: u32 = 256 << 20;

impl EbpfConfig {
    const MAX_PROCESSES: Bounds = Bounds::new(1024, 4_194_304, "");
    const POLL_INTERVAL_MS: Bounds = Bounds::new(1, 10_000, "ms");

    fn validate(&self) -> Result<(), ConfigError> {
        let page = page_size();
        let rb = self.ring_buffer_bytes;
        if !rb.is_power_of_two() || !(page..=RING_BUFFER_MAX).contains(&rb) {
            return invalid(
                "ebpf.ring_buffer_bytes",
                format!(
                    "must be a power of two between the page size ({page}) and \
                     {RING_BUFFER_MAX}, got {rb}"
                ),
            );
        }
        if let Some(m) = self.max_processes {
            Self::MAX_PROCESSES.check("ebpf.max_processes", m.into())?;
        }
        Self::POLL_INTERVAL_MS.check("ebpf.poll_interval_ms", self.poll_interval_ms)?;
        if self.wakeup_bytes > rb {
            return invalid(
                "ebpf.wakeup_bytes",
                "must not exceed ebpf.ring_buffer_bytes (equal: never wake early)",
            );
        }
        Ok(())
    }
}

impl NvmlConfig {
    const INTERVAL_MS: Bounds = Bounds::new(100, 60_000, "ms");
    const SLOW_INTERVAL_MS: Bounds = Bounds::new(100, 600_000, "ms");
    const GPM_INTERVAL_MS: Bounds = Bounds::new(100, 600_000, "ms");
    const ENERGY_INTERVAL_MS: Bounds = Bounds::new(100, 600_000, "ms");
    const CROWDED_LIST_INTERVAL_MS: Bounds = Bounds::new(0, 60_000, "ms");
    const STALL_TIMEOUT_MS: Bounds = Bounds::new(1_000, 3_600_000, "ms");

    /// `stall_timeout_ms`, or its default: three intervals, at least 5 s.
    pub fn stall_timeout(&self) -> std::time::Duration {
        let ms = (self.stall_timeout_ms).unwrap_or((3 * self.interval_ms).max(5_000));
        std::time::Duration::from_millis(ms)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if let Some(ms) = self.stall_timeout_ms {
            Self::STALL_TIMEOUT_MS.check("nvml.stall_timeout_ms", ms)?;
        }
        Self::INTERVAL_MS.check("nvml.interval_ms", self.interval_ms)?;
        Self::SLOW_INTERVAL_MS.check("nvml.slow_interval_ms", self.slow_interval_ms)?;
        Self::GPM_INTERVAL_MS.check("nvml.gpm_interval_ms", self.gpm_interval_ms)?;
        Self::ENERGY_INTERVAL_MS.check("nvml.energy_interval_ms", self.energy_interval_ms)?;
        Self::CROWDED_LIST_INTERVAL_MS.check(
            "nvml.crowded_list_interval_ms",
            self.crowded_list_interval_ms,
        )
    }
}

impl CacheConfig {
    const TOMBSTONE_SECS: Bounds = Bounds::new(1, 3600, "s");
    const MAX_TOMBSTONES: Bounds = Bounds::new(16, 1 << 20, "");
    const PROCFS_RESCAN_SECS: Bounds = Bounds::new(1, 3600, "s");

    fn validate(&self) -> Result<(), ConfigError> {
        Self::TOMBSTONE_SECS.check("cache.tombstone_secs", self.tombstone_secs)?;
        Self::MAX_TOMBSTONES.check("cache.max_tombstones", self.max_tombstones as u64)?;
        Self::PROCFS_RESCAN_SECS.check("cache.procfs_rescan_secs", self.procfs_rescan_secs)
    }
}

/// The v1 controllers a hierarchy can be named by (Linux's cgroup_subsys list), besides
/// named hierarchies (`name=...`).
const V1_CONTROLLERS: [&str; 14] = [
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "net_cls",
    "net_prio",
    "blkio",
    "perf_event",
    "hugetlb",
    "pids",
    "rdma",
    "misc",
];

impl CgroupConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let h = self.v1_hierarchy.as_str();
        let named = h.strip_prefix("name=").is_some_and(|n| {
            !n.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        });
        if !(matches!(h, "auto" | "none") || named || V1_CONTROLLERS.contains(&h)) {
            return invalid(
                "cgroup.v1_hierarchy",
                format!(
                    "{h:?} is not auto, none, name=<hierarchy> or a v1 controller ({})",
                    V1_CONTROLLERS.join(", ")
                ),
            );
        }
        if !self.proc_root.join("self").is_dir() {
            return invalid(
                "cgroup.proc_root",
                format!("{} is not a mounted /proc", self.proc_root.display()),
            );
        }
        Ok(())
    }
}

/// The `[usage]` section: what a chargeback system bills from.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct UsageConfig {
    /// Emit a usage record when a container stops using a device (OTLP logs when an
    /// endpoint is configured, and `file` when set).
    pub records: bool,
    /// Append each record to this JSON-lines file (`gpu-agent report` reads it).
    pub file: Option<PathBuf>,
    /// Rotate the file beyond this size: `file` -> `file.1` -> ... -> `file.<file_keep>`.
    pub file_max_bytes: u64,
    pub file_keep: u32,
    /// Records kept for each destination while it fails (the collector unreachable, the
    /// file's disk full); the oldest beyond are given up and counted
    /// (`usage_records_dropped`).
    pub queue_records: usize,
    /// Read NVML's per-process accounting stats when a GPU process exits (needs
    /// accounting mode on the GPU: `nvidia-smi -am 1`).
    pub accounting: bool,
    /// Read HAMi's `CUDA_DEVICE_MEMORY_LIMIT*`/`CUDA_DEVICE_SM_LIMIT` from GPU processes'
    /// environments (/proc/PID/environ).
    pub hami_limits: bool,
    /// The window of `container.gpu.memory.peak`; match it to the export interval.
    pub peak_window_secs: u64,
    /// A stretch of use longer than this is cut into records (`checkpoint`), each starting
    /// where the last ended: at most this much is lost to a crash.
    pub max_record_secs: u64,
}

impl Default for UsageConfig {
    fn default() -> Self {
        UsageConfig {
            records: true,
            file: None,
            file_max_bytes: 64 << 20,
            file_keep: 5,
            queue_records: 10_000,
            accounting: true,
            hami_limits: true,
            peak_window_secs: 60,
            max_record_secs: 3600,
        }
    }
}

impl MetadataConfig {
    const ALLOCATION_INTERVAL_SECS: Bounds = Bounds::new(1, 86_400, "s");

    fn validate(&self) -> Result<(), ConfigError> {
        Self::ALLOCATION_INTERVAL_SECS.check(
            "metadata.allocation_interval_secs",
            self.allocation_interval_secs,
        )
    }
}

/// dcgm-exporter compatibility (`--prometheus-compat dcgm` or `dcgm-virtual-gpus`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DcgmConfig {
    /// A dcgm-exporter counters CSV (`-f`, `--collectors`): the DCGM fields to serve, with
    /// their types and help. dcgm-exporter's default counters when unset.
    pub collectors: Option<PathBuf>,
    /// The host label's name: "Hostname" (dcgm-exporter as released) or "hostname" (its
    /// main branch, for its next release).
    pub host_label: String,
}

impl Default for DcgmConfig {
    fn default() -> Self {
        DcgmConfig {
            collectors: None,
            host_label: "Hostname".into(),
        }
    }
}

/// XID errors: NVML's event API counts them per GPU; the kernel log names the process.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct XidConfig {
    /// Where the kernel log is read to charge an XID to the process (and container) it
    /// names; "" does not read it. Needs CAP_SYSLOG (or kernel.dmesg_restrict=0).
    pub kmsg: PathBuf,
}

impl Default for XidConfig {
    fn default() -> Self {
        XidConfig {
            kmsg: PathBuf::from("/dev/kmsg"),
        }
    }
}

impl XidConfig {
    pub fn kmsg_path(&self) -> Option<PathBuf> {
        (!self.kmsg.as_os_str().is_empty()).then(|| self.kmsg.clone())
    }
}

impl Config {
    /// `prometheus.compat` and `dcgm.collectors`: a counters CSV that names a field gpu-agent
    /// cannot serve is refused, naming the line.
    fn validate_dcgm(&self) -> Result<(), ConfigError> {
        self.dcgm_compat().map(|_| ())
    }

    /// What `--prometheus-compat` serves, with the counters CSV read; None without it.
    pub fn dcgm_compat(&self) -> Result<Option<otel::dcgm::DcgmCompat>, ConfigError> {
        use otel::dcgm::{DcgmCompat, HostLabel, Mode};
        let invalid = |field, message: String| ConfigError::Invalid { field, message };
        let label = &self.dcgm.host_label;
        let host_label = HostLabel::parse(label).ok_or_else(|| {
            let why = format!("expected \"Hostname\" or \"hostname\", got {label:?}");
            invalid("dcgm.host_label", why)
        })?;
        let Some(c) = &self.prometheus.compat else {
            if self.dcgm.collectors.is_some() {
                return Err(invalid(
                    "dcgm.collectors",
                    "needs prometheus.compat (\"dcgm\" or \"dcgm-virtual-gpus\")".into(),
                ));
            }
            return Ok(None);
        };
        let mode = Mode::parse(c).ok_or_else(|| {
            invalid(
                "prometheus.compat",
                format!("expected \"dcgm\" or \"dcgm-virtual-gpus\", got {c:?}"),
            )
        })?;
        let compat = match &self.dcgm.collectors {
            None => DcgmCompat::defaults(mode),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    let why = format!("cannot read {}: {e}", path.display());
                    invalid("dcgm.collectors", why)
                })?;
                DcgmCompat::from_csv(mode, &text)
                    .map_err(|e| invalid("dcgm.collectors", format!("{}: {e}", path.display())))?
            }
        };
        Ok(Some(DcgmCompat {
            host_label,
            ..compat
        }))
    }
}

impl UsageConfig {
    const FILE_MAX_BYTES: Bounds = Bounds::new(4096, 1 << 40, "bytes");
    const FILE_KEEP: Bounds = Bounds::new(1, 1000, "");
    const QUEUE_RECORDS: Bounds = Bounds::new(1, 1_000_000, "");
    const PEAK_WINDOW_SECS: Bounds = Bounds::new(1, 86_400, "s");
    const MAX_RECORD_SECS: Bounds = Bounds::new(1, 7 * 86_400, "s");

    pub fn validate(&self) -> Result<(), ConfigError> {
        Self::FILE_MAX_BYTES.check("usage.file_max_bytes", self.file_max_bytes)?;
        Self::FILE_KEEP.check("usage.file_keep", self.file_keep.into())?;
        Self::QUEUE_RECORDS.check("usage.queue_records", self.queue_records as u64)?;
        Self::PEAK_WINDOW_SECS.check("usage.peak_window_secs", self.peak_window_secs)?;
        Self::MAX_RECORD_SECS.check("usage.max_record_secs", self.max_record_secs)?;
        if self
            .file
            .as_ref()
            .is_some_and(|f| f.as_os_str().is_empty() || f.is_dir())
        {
            return invalid("usage.file", "must name a file, not a directory");
        }
        Ok(())
    }
}

pub fn page_size() -> u32 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_defaults() {
        assert_eq!(Config::from_toml("").unwrap(), Config::default());
    }

    /// Three intervals, but never under 5 s (a busy driver's slow call is not a stall);
    /// a set value wins, within 1 s to 1 h.
    #[test]
    fn the_stall_timeout_is_three_intervals_at_least_five_seconds() {
        use std::time::Duration;
        let t = |toml: &str| Config::from_toml(toml).unwrap().nvml.stall_timeout();
        assert_eq!(t(""), Duration::from_secs(5));
        assert_eq!(t("[nvml]\ninterval_ms = 4000\n"), Duration::from_secs(12));
        assert_eq!(
            t("[nvml]\nstall_timeout_ms = 2000\n"),
            Duration::from_secs(2)
        );
        let e = Config::from_toml("[nvml]\nstall_timeout_ms = 10\n").unwrap_err();
        assert!(e.to_string().contains("nvml.stall_timeout_ms"), "{e}");
    }

    #[test]
    fn unknown_field_is_named() {
        let e = Config::from_toml("[ebpf]\nring_bufer_bytes = 4096\n").unwrap_err();
        assert!(e.to_string().contains("ring_bufer_bytes"), "{e}");
    }

    #[test]
    fn invalid_value_names_the_field() {
        let e = Config::from_toml("[ebpf]\nring_buffer_bytes = 5000\n").unwrap_err();
        assert!(e.to_string().contains("ebpf.ring_buffer_bytes"), "{e}");
        let e = Config::from_toml("[http]\naddr = \"nope\"\n").unwrap_err();
        assert!(e.to_string().contains("addr"), "{e}");
    }

    #[test]
    fn yaml_works_and_names_bad_fields() {
        let c = Config::from_yaml("http:\n  addr: 127.0.0.1:1\notlp:\n  endpoint: http://c:4318\n")
            .unwrap();
        assert_eq!(c.http.addr.port(), 1);
        assert_eq!(c.otlp.endpoint.as_deref(), Some("http://c:4318"));
        let e = Config::from_yaml("otlp:\n  endpiont: x\n").unwrap_err();
        assert!(e.to_string().contains("endpiont"), "{e}");
    }

    #[test]
    fn every_changed_section_is_named() {
        let load = |text: &str| Config::from_toml(text).unwrap().resolve(|_| None).unwrap();
        let base = load("");
        assert!(base.changed_sections(&load("")).is_empty());
        let newer = load("node_name = \"n\"\n[usage]\nfile_keep = 2\n[xid]\nkmsg = \"\"\n");
        let mut changed = base.changed_sections(&newer);
        changed.sort();
        assert_eq!(changed, ["node_name", "usage", "xid"]);
        let env = Config::default()
            .resolve(|k| (k == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "http://c:4318".into()))
            .unwrap();
        assert_eq!(base.changed_sections(&env), ["otlp"]);
    }

    #[test]
    fn overrides_parse() {
        let c = Config::from_toml(
            "[http]\naddr = \"127.0.0.1:1234\"\n[ebpf]\nring_buffer_bytes = 8192\nwakeup_bytes = 0\n",
        )
        .unwrap();
        assert_eq!(c.http.addr.port(), 1234);
        assert_eq!(c.ebpf.ring_buffer_bytes, 8192);
    }
}
