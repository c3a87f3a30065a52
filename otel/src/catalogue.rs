//! The metric catalogue: every metric and every attribute gpu-agent can emit, once. The
//! OTLP encoding (`otlp`), the Prometheus text (`prometheus`: family order, HELP, TYPE), the
//! dcgm-exporter compatibility names and docs/metrics.md (`cargo xtask metrics-doc`) are
//! all driven by these two tables; code names an entry by its [`MetricId`] or [`Attr`],
//! never by a string.
//!
//! Conventions: OTLP names and units follow the OpenTelemetry semantic conventions (`hw.*`)
//! where one exists. Prometheus names are spelled out, not derived, because a few differ
//! from the OpenTelemetry mapping (`gpu_agent.cache.processes` is
//! `gpu_agent_cached_processes`). The Prometheus type follows the kind: a Counter is a
//! `counter`, a Gauge or an UpDownCounter a `gauge`.

/// Declares an enum naming the rows of a table, and the table (a static array indexed by the
/// enum's discriminant), from one list, so that the two cannot disagree.
macro_rules! table {
    (
        $(#[$meta:meta])*
        pub enum $Id:ident in $TABLE:ident: [$Row:ty] {
            $($(#[$vmeta:meta])* $variant:ident => $row:expr,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $Id {
            $($(#[$vmeta])* $variant,)*
        }

        impl $Id {
            /// Every row, in table order.
            pub const ALL: &'static [$Id] = &[$($Id::$variant,)*];
        }

        /// Indexed by the discriminant of the enum naming its rows.
        pub static $TABLE: [$Row; $Id::ALL.len()] = [$($row,)*];
    };
}

// ---------------------------------------------------------------------------------------
// Attributes

/// Where an attribute travels in OTLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// On every resource (the node's and each container's).
    EveryResource,
    /// On each container (or pod-level cgroup) resource.
    ContainerResource,
    /// On each data point.
    DataPoint,
    /// Not in OTLP: a Prometheus label only.
    PrometheusOnly,
}

/// One attribute (OTLP) / label (Prometheus). Either name may be absent where that sink
/// does not carry it.
#[derive(Clone, Debug)]
pub struct Attribute {
    pub otlp: Option<&'static str>,
    pub prometheus: Option<&'static str>,
    pub place: Place,
    /// The closed set of values, where there is one.
    pub values: &'static [&'static str],
    /// Its value, and where it comes from.
    pub doc: &'static str,
}

const RESOURCE: Attribute = Attribute {
    otlp: None,
    prometheus: None,
    place: Place::ContainerResource,
    values: &[],
    doc: "",
};
const POINT: Attribute = Attribute {
    place: Place::DataPoint,
    ..RESOURCE
};
const LABEL: Attribute = Attribute {
    place: Place::PrometheusOnly,
    ..RESOURCE
};

/// Values of `hw.gpu.task`: the engines NVML samples (SM, memory controller, encoder,
/// decoder). Devices report the first two.
pub const GPU_TASKS: [&str; 4] = ["general", "memory_controller", "encoder", "decoder"];
/// Values of `hw.state`: a GPU that fell off the bus, or has no handle, is `failed`.
pub const HW_STATES: [&str; 2] = ["ok", "failed"];
/// Values of `error.type` on `hw.errors`.
pub const ECC_ERROR_TYPES: [&str; 2] = ["corrected", "uncorrected"];
/// Values of `clock` on `hw.gpu.clock`.
pub const CLOCKS: [&str; 2] = ["sm", "memory"];
/// Values of `owner`: a container, a pod-level cgroup, or processes outside any container.
pub const OWNERS: [&str; 3] = ["container", "pod", "host"];
/// The `owner` of a GPU's energy that no container was charged (idle, not allocated).
pub const OWNER_IDLE: &str = "idle";
/// Every value of `owner`.
pub const OWNER_VALUES: [&str; 4] = ["container", "pod", "host", OWNER_IDLE];
/// Values of `limit.source` (gpu_model::LimitSource).
pub const LIMIT_SOURCES: [&str; 3] = ["hami", "mig", "timeslice"];
/// The value of `hw.type`.
pub const HW_TYPE_GPU: &str = "gpu";
/// The value of `hw.vendor`.
pub const HW_VENDOR_NVIDIA: &str = "NVIDIA";

table! {
    /// Names an attribute in [`ATTRIBUTES`].
    pub enum Attr in ATTRIBUTES: [Attribute] {
        // Resource attributes.
        ServiceName => Attribute {
            otlp: Some("service.name"),
            place: Place::EveryResource,
            doc: "`gpu-agent` (or `OTEL_SERVICE_NAME`)",
            ..RESOURCE
        },
        ServiceVersion => Attribute {
            otlp: Some("service.version"),
            place: Place::EveryResource,
            doc: "the agent's version",
            ..RESOURCE
        },
        HostName => Attribute {
            otlp: Some("host.name"),
            place: Place::EveryResource,
            doc: "the kernel's host name (`/proc/sys/kernel/hostname`)",
            ..RESOURCE
        },
        K8sNodeName => Attribute {
            otlp: Some("k8s.node.name"),
            place: Place::EveryResource,
            doc: "when known: `node_name` in the config, or `NODE_NAME` (downward API)",
            ..RESOURCE
        },
        ContainerId => Attribute {
            otlp: Some("container.id"),
            prometheus: Some("container_id"),
            doc: "full 64-hex container id, from the cgroup path",
            ..RESOURCE
        },
        PodUid => Attribute {
            otlp: Some("k8s.pod.uid"),
            prometheus: Some("pod_uid"),
            doc: "dashed pod uid, from the cgroup path",
            ..RESOURCE
        },
        PodName => Attribute {
            otlp: Some("k8s.pod.name"),
            prometheus: Some("pod"),
            doc: "when the runtime told us: CRI `ListContainers` labels (`io.kubernetes.*`)",
            ..RESOURCE
        },
        Namespace => Attribute {
            otlp: Some("k8s.namespace.name"),
            prometheus: Some("namespace"),
            doc: "when the runtime told us, as `k8s.pod.name`",
            ..RESOURCE
        },
        ContainerName => Attribute {
            otlp: Some("k8s.container.name"),
            prometheus: Some("container"),
            doc: "when the runtime told us: CRI labels, or the Docker API's container name",
            ..RESOURCE
        },
        Runtime => Attribute {
            otlp: Some("container.runtime.name"),
            prometheus: Some("runtime"),
            values: &["containerd", "cri-o", "docker", "podman"],
            doc: "the runtime, when the cgroup path says",
            ..RESOURCE
        },
        // Data-point attributes.
        HwId => Attribute {
            otlp: Some("hw.id"),
            prometheus: Some("hw_id"),
            doc: "the device: GPU UUID, or MIG device UUID (the one charged, on container series)",
            ..POINT
        },
        HwType => Attribute {
            otlp: Some("hw.type"),
            values: &[HW_TYPE_GPU],
            doc: "",
            ..POINT
        },
        HwVendor => Attribute {
            otlp: Some("hw.vendor"),
            values: &[HW_VENDOR_NVIDIA],
            doc: "",
            ..POINT
        },
        HwModel => Attribute {
            otlp: Some("hw.model"),
            prometheus: Some("model"),
            doc: "product name, e.g. `NVIDIA H100 80GB HBM3`",
            ..POINT
        },
        GpuIndex => Attribute {
            otlp: Some("hw.gpu.index"),
            prometheus: Some("gpu"),
            doc: "NVML index (OTLP: not on MIG devices)",
            ..POINT
        },
        HwParent => Attribute {
            otlp: Some("hw.parent"),
            prometheus: Some("hw_parent"),
            doc: "the GPU UUID, on MIG devices only",
            ..POINT
        },
        HwState => Attribute {
            otlp: Some("hw.state"),
            prometheus: Some("hw_state"),
            values: &HW_STATES,
            doc: "the GPU's state (`failed`: lost, or no handle)",
            ..POINT
        },
        HwGpuTask => Attribute {
            otlp: Some("hw.gpu.task"),
            prometheus: Some("hw_gpu_task"),
            values: &GPU_TASKS,
            doc: "the engine (`general`: the SMs)",
            ..POINT
        },
        ErrorType => Attribute {
            otlp: Some("error.type"),
            prometheus: Some("error_type"),
            values: &ECC_ERROR_TYPES,
            doc: "ECC error kind",
            ..POINT
        },
        Clock => Attribute {
            otlp: Some("clock"),
            prometheus: Some("clock"),
            values: &CLOCKS,
            doc: "which clock",
            ..POINT
        },
        ProcessPid => Attribute {
            otlp: Some("process.pid"),
            prometheus: Some("pid"),
            doc: "host PID",
            ..POINT
        },
        LimitSource => Attribute {
            otlp: Some("limit.source"),
            prometheus: Some("limit_source"),
            values: &LIMIT_SOURCES,
            doc: "where the limit comes from: HAMi's environment (enforced by HAMi), the MIG device's size, or the container's share of a time-sliced GPU (not enforced)",
            ..POINT
        },
        Mode => Attribute {
            otlp: Some("mode"),
            prometheus: Some("mode"),
            values: &["ebpf", "procfs"],
            doc: "process tracking mode",
            ..POINT
        },
        // Prometheus-only labels.
        PciBusId => Attribute {
            prometheus: Some("pci_bus_id"),
            doc: "PCI bus id from NVML",
            ..LABEL
        },
        Node => Attribute {
            prometheus: Some("node"),
            doc: "`k8s.node.name` when known, else `host.name`",
            ..LABEL
        },
        GpuUuid => Attribute {
            prometheus: Some("gpu_uuid"),
            doc: "the physical GPU's UUID (differs from `hw_id` under MIG)",
            ..LABEL
        },
        Owner => Attribute {
            otlp: Some("gpu_agent.owner"),
            prometheus: Some("owner"),
            values: &OWNER_VALUES,
            doc: "what the series is charged to: a container, a pod-level cgroup, processes outside any container, or (energy only) nobody: `idle`. OTLP: on the idle entry's energy only",
            ..POINT
        },
        Qos => Attribute {
            prometheus: Some("qos"),
            values: &["guaranteed", "burstable", "besteffort"],
            doc: "pod QoS class, from the cgroup path",
            ..LABEL
        },
        Comm => Attribute {
            prometheus: Some("comm"),
            doc: "process name",
            ..LABEL
        },
        Version => Attribute {
            prometheus: Some("version"),
            doc: "the agent's version",
            ..LABEL
        },
        // dcgm-exporter's labels.
        DcgmUuid => Attribute {
            prometheus: Some("UUID"),
            doc: "dcgm-exporter: the physical GPU's UUID, also on MIG series",
            ..LABEL
        },
        DcgmDevice => Attribute {
            prometheus: Some("device"),
            doc: "dcgm-exporter: `nvidia<index>`",
            ..LABEL
        },
        DcgmModelName => Attribute {
            prometheus: Some("modelName"),
            doc: "dcgm-exporter: product name (camelCase, which promtool flags; kept for existing queries)",
            ..LABEL
        },
        DcgmGpuInstance => Attribute {
            prometheus: Some("GPU_I_ID"),
            doc: "dcgm-exporter: MIG GPU instance id, on MIG series",
            ..LABEL
        },
        DcgmHostname => Attribute {
            prometheus: Some("Hostname"),
            doc: "dcgm-exporter: the node name when known, else the host name",
            ..LABEL
        },
        DcgmDriverVersion => Attribute {
            prometheus: Some("DCGM_FI_DRIVER_VERSION"),
            doc: "dcgm-exporter: driver version, when NVML tells it",
            ..LABEL
        },
    }
}

impl Attr {
    pub fn def(self) -> &'static Attribute {
        &ATTRIBUTES[self as usize]
    }

    /// The OTLP key. Panics (a bug) for a Prometheus-only label.
    pub fn otlp(self) -> &'static str {
        self.def()
            .otlp
            .unwrap_or_else(|| panic!("{self:?} has no OTLP key"))
    }

    /// The Prometheus label name. Panics (a bug) for an OTLP-only attribute.
    pub fn label(self) -> &'static str {
        self.def()
            .prometheus
            .unwrap_or_else(|| panic!("{self:?} has no Prometheus label"))
    }
}

/// The attributes configured away (`metrics.drop_attributes`), resolved once per export
/// through [`crate::Groups::drops`]: a bit per [`Attr`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropped(u128);

const _: () = assert!(Attr::ALL.len() <= 128, "Dropped holds a bit per attribute");

impl Dropped {
    pub fn of(groups: &crate::Groups) -> Dropped {
        let mut bits = 0;
        if !groups.drop_attributes.is_empty() {
            for &a in Attr::ALL {
                let d = a.def();
                if groups.drops(d.otlp, d.prometheus) {
                    bits |= 1 << a as u32;
                }
            }
        }
        Dropped(bits)
    }

    pub fn contains(self, a: Attr) -> bool {
        self.0 & (1 << a as u32) != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

// ---------------------------------------------------------------------------------------
// Metrics

/// The instrument. The Prometheus type follows: `counter` for a Counter, else `gauge`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    /// Non-monotonic cumulative sum.
    UpDownCounter,
    /// Monotonic cumulative sum.
    Counter,
}

impl Kind {
    pub fn prometheus_type(self) -> &'static str {
        match self {
            Kind::Gauge | Kind::UpDownCounter => "gauge",
            Kind::Counter => "counter",
        }
    }

    pub fn otlp_name(self) -> &'static str {
        match self {
            Kind::Gauge => "Gauge",
            Kind::UpDownCounter => "UpDownCounter",
            Kind::Counter => "Counter",
        }
    }
}

/// The switch that turns a metric on: a `[metrics]` group, or `--prometheus-compat dcgm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    Device,
    Container,
    Process,
    SelfMetrics,
    /// dcgm-exporter's names, Prometheus only (`--prometheus-compat dcgm`).
    Dcgm,
}

/// The attributes every series of a kind may carry, per sink, named for the docs. OTLP
/// lists resource attributes too (see [`Attribute::place`]).
#[derive(Clone, Copy, Debug)]
pub struct AttrSet {
    pub name: &'static str,
    pub otlp: &'static [Attr],
    pub prometheus: &'static [Attr],
}

/// The identity of a container resource (OTLP).
const CONTAINER_RESOURCE: [Attr; 6] = [
    Attr::ContainerId,
    Attr::PodUid,
    Attr::PodName,
    Attr::Namespace,
    Attr::ContainerName,
    Attr::Runtime,
];

/// GPUs and MIG devices: MIG devices have `hw.parent` (and, in OTLP, no index).
pub const DEVICE: AttrSet = AttrSet {
    name: "device",
    otlp: &[
        Attr::HwId,
        Attr::HwType,
        Attr::HwVendor,
        Attr::HwModel,
        Attr::GpuIndex,
        Attr::HwParent,
    ],
    prometheus: &[
        Attr::HwId,
        Attr::GpuIndex,
        Attr::HwModel,
        Attr::PciBusId,
        Attr::Node,
        Attr::HwParent,
    ],
};
/// A container (pod-level cgroup, host entry) on a device: OTLP sends the container's
/// identity on its resource, Prometheus as labels.
pub const CONTAINER: AttrSet = AttrSet {
    name: "container",
    otlp: &{
        let [a, b, c, d, e, f] = CONTAINER_RESOURCE;
        [a, b, c, d, e, f, Attr::HwId, Attr::HwParent]
    },
    prometheus: &[
        Attr::ContainerId,
        Attr::PodUid,
        Attr::Namespace,
        Attr::PodName,
        Attr::ContainerName,
        Attr::Qos,
        Attr::Runtime,
        Attr::HwId,
        Attr::GpuUuid,
        Attr::Node,
        Attr::Owner,
    ],
};
/// A device the kubelet allocated to a container.
pub const ALLOCATION: AttrSet = AttrSet {
    name: "allocation",
    otlp: &{
        let [a, b, c, d, e, f] = CONTAINER_RESOURCE;
        [a, b, c, d, e, f, Attr::HwId]
    },
    prometheus: &[
        Attr::ContainerId,
        Attr::PodUid,
        Attr::Namespace,
        Attr::PodName,
        Attr::ContainerName,
        Attr::HwId,
        Attr::Node,
    ],
};
/// A process on a device.
pub const PROCESS: AttrSet = AttrSet {
    name: "process",
    otlp: &{
        let [a, b, c, d, e, f] = CONTAINER_RESOURCE;
        [a, b, c, d, e, f, Attr::ProcessPid, Attr::HwId]
    },
    prometheus: &[
        Attr::ProcessPid,
        Attr::Comm,
        Attr::ContainerId,
        Attr::PodUid,
        Attr::HwId,
        Attr::Node,
    ],
};
/// The agent itself (on the node resource).
pub const AGENT: AttrSet = AttrSet {
    name: "agent",
    otlp: &[],
    prometheus: &[],
};
/// dcgm-exporter's labels: `GPU_I_ID` on MIG series; the pod's on per-container series.
pub const DCGM: AttrSet = AttrSet {
    name: "dcgm",
    otlp: &[],
    prometheus: &[
        Attr::GpuIndex,
        Attr::DcgmUuid,
        Attr::PciBusId,
        Attr::DcgmDevice,
        Attr::DcgmModelName,
        Attr::DcgmGpuInstance,
        Attr::DcgmHostname,
        Attr::DcgmDriverVersion,
        Attr::ContainerName,
        Attr::Namespace,
        Attr::PodName,
        Attr::PodUid,
        Attr::ContainerId,
    ],
};

/// Which gpu-agent value a dcgm-exporter series restates (converted to the dcgm unit).
#[derive(Clone, Copy, Debug)]
pub enum Source {
    /// The metric's value; its data point with the attribute at that value, where it has
    /// several.
    Metric(MetricId, Option<(Attr, &'static str)>),
    /// The first metric's value minus the second's.
    Difference(MetricId, MetricId),
}

/// A dcgm-exporter field (the entry's Prometheus name is the field name).
#[derive(Clone, Copy, Debug)]
pub struct Dcgm {
    /// What its device series (one per GPU and MIG device, empty pod labels) restates.
    pub device: Source,
    /// What its per-container series restate; None: device series only.
    pub container: Option<Source>,
}

/// One metric. `otlp` or `prometheus` is None where that sink does not emit it.
#[derive(Clone, Debug)]
pub struct Metric {
    pub otlp: Option<&'static str>,
    pub prometheus: Option<&'static str>,
    /// UCUM, as OTLP sends it; dcgm fields: dcgm-exporter's unit.
    pub unit: &'static str,
    pub kind: Kind,
    pub group: Group,
    /// OTLP description and Prometheus HELP.
    pub help: &'static str,
    /// The attributes its series share with the others of their kind.
    pub base: AttrSet,
    /// The attributes that tell its data points apart.
    pub extra: &'static [Attr],
    pub dcgm: Option<Dcgm>,
    /// Docs only: what the help text leaves out (a sentence, without its final stop).
    pub note: &'static str,
}

impl Metric {
    /// Whether its OTLP data points or resources may carry `a`.
    pub fn carries_otlp(&self, a: Attr) -> bool {
        self.base.otlp.contains(&a) || self.extra.contains(&a)
    }

    /// Whether its Prometheus series may carry the label of `a`.
    pub fn carries_label(&self, a: Attr) -> bool {
        self.base.prometheus.contains(&a) || self.extra.contains(&a)
    }
}

const DEVICE_METRIC: Metric = Metric {
    otlp: None,
    prometheus: None,
    unit: "1",
    kind: Kind::Gauge,
    group: Group::Device,
    help: "",
    base: DEVICE,
    extra: &[],
    dcgm: None,
    note: "",
};
const CONTAINER_METRIC: Metric = Metric {
    group: Group::Container,
    base: CONTAINER,
    ..DEVICE_METRIC
};
const PROCESS_METRIC: Metric = Metric {
    group: Group::Process,
    base: PROCESS,
    ..DEVICE_METRIC
};
const SELF_METRIC: Metric = Metric {
    group: Group::SelfMetrics,
    base: AGENT,
    ..DEVICE_METRIC
};
const DCGM_FIELD: Metric = Metric {
    group: Group::Dcgm,
    base: DCGM,
    ..DEVICE_METRIC
};

use self::{Kind::*, MetricId as M};

table! {
    /// Names a metric in [`CATALOGUE`]. Table order is the Prometheus family order.
    pub enum MetricId in CATALOGUE: [Metric] {
        // Device group (node resource).
        HwGpuMemoryUsage => Metric {
            otlp: Some("hw.gpu.memory.usage"),
            prometheus: Some("hw_gpu_memory_usage_bytes"),
            unit: "By",
            kind: UpDownCounter,
            help: "GPU memory in use, bytes.",
            note: "GPU and MIG devices",
            ..DEVICE_METRIC
        },
        HwGpuMemoryLimit => Metric {
            otlp: Some("hw.gpu.memory.limit"),
            prometheus: Some("hw_gpu_memory_limit_bytes"),
            unit: "By",
            kind: UpDownCounter,
            help: "GPU memory size, bytes.",
            note: "GPU and MIG devices",
            ..DEVICE_METRIC
        },
        HwGpuMemoryUtilization => Metric {
            otlp: Some("hw.gpu.memory.utilization"),
            prometheus: Some("hw_gpu_memory_utilization_ratio"),
            help: "GPU memory in use over its size (0-1).",
            note: "GPU and MIG devices",
            ..DEVICE_METRIC
        },
        HwGpuUtilization => Metric {
            otlp: Some("hw.gpu.utilization"),
            prometheus: Some("hw_gpu_utilization_ratio"),
            help: "Fraction of the last sample period the GPU was busy (general: a kernel ran; memory_controller: memory was read or written).",
            extra: &[Attr::HwGpuTask],
            note: "Devices report `general` and `memory_controller` (NVML utilization rates); absent under MIG",
            ..DEVICE_METRIC
        },
        HwPower => Metric {
            otlp: Some("hw.power"),
            prometheus: Some("hw_power_watts"),
            unit: "W",
            help: "GPU power draw, watts.",
            ..DEVICE_METRIC
        },
        HwEnergy => Metric {
            otlp: Some("hw.energy"),
            prometheus: Some("hw_energy_joules_total"),
            unit: "J",
            kind: Counter,
            help: "GPU energy consumed since the driver loaded, joules.",
            ..DEVICE_METRIC
        },
        HwTemperature => Metric {
            otlp: Some("hw.temperature"),
            prometheus: Some("hw_temperature_celsius"),
            unit: "Cel",
            help: "GPU core temperature, degrees Celsius.",
            ..DEVICE_METRIC
        },
        HwErrors => Metric {
            otlp: Some("hw.errors"),
            prometheus: Some("hw_errors_total"),
            unit: "{error}",
            kind: Counter,
            help: "GPU memory ECC errors since the driver loaded.",
            extra: &[Attr::ErrorType],
            note: "Volatile ECC counts",
            ..DEVICE_METRIC
        },
        HwStatus => Metric {
            otlp: Some("hw.status"),
            prometheus: Some("hw_status"),
            kind: UpDownCounter,
            help: "1 for the GPU's current state (ok, or failed when lost or unreachable), 0 for the other.",
            extra: &[Attr::HwState],
            note: "A lost GPU gets this metric only",
            ..DEVICE_METRIC
        },
        HwGpuClock => Metric {
            otlp: Some("hw.gpu.clock"),
            prometheus: Some("hw_gpu_clock_hertz"),
            unit: "Hz",
            help: "GPU clock frequency, hertz.",
            extra: &[Attr::Clock],
            ..DEVICE_METRIC
        },
        // Container group (container resource; the host entry's on the node resource).
        ContainerGpuMemoryUsage => Metric {
            otlp: Some("container.gpu.memory.usage"),
            prometheus: Some("container_gpu_memory_usage_bytes"),
            unit: "By",
            kind: UpDownCounter,
            help: "GPU memory held by the container's processes, bytes.",
            ..CONTAINER_METRIC
        },
        ContainerGpuUtilization => Metric {
            otlp: Some("container.gpu.utilization"),
            prometheus: Some("container_gpu_utilization_ratio"),
            help: "The container's share of the device's engines over the last sample period (0-1).",
            extra: &[Attr::HwGpuTask],
            note: "Its processes' utilization since the last sample, summed and capped at 1; absent where the device cannot say (MIG)",
            ..CONTAINER_METRIC
        },
        ContainerGpuTime => Metric {
            otlp: Some("container.gpu.time"),
            prometheus: Some("container_gpu_time_seconds_total"),
            unit: "s",
            kind: Counter,
            help: "GPU time used: seconds weighted by SM utilization.",
            note: "OTLP start time: when the agent first saw this container on this device",
            ..CONTAINER_METRIC
        },
        ContainerGpuMemoryTime => Metric {
            otlp: Some("container.gpu.memory.time"),
            prometheus: Some("container_gpu_memory_byte_seconds_total"),
            unit: "By.s",
            kind: Counter,
            help: "GPU memory held over time, byte-seconds.",
            note: "For chargeback; OTLP start time as `container.gpu.time`",
            ..CONTAINER_METRIC
        },
        ContainerGpuProcesses => Metric {
            otlp: Some("container.gpu.processes"),
            prometheus: Some("container_gpu_processes"),
            unit: "{process}",
            kind: UpDownCounter,
            help: "Processes of the container on the device.",
            ..CONTAINER_METRIC
        },
        ContainerGpuAllocated => Metric {
            otlp: Some("container.gpu.allocated"),
            prometheus: Some("container_gpu_allocated"),
            unit: "{gpu}",
            kind: UpDownCounter,
            help: "1 for each device the kubelet allocated to the container.",
            base: ALLOCATION,
            ..CONTAINER_METRIC
        },
        ContainerGpuAllocatedIdle => Metric {
            otlp: Some("container.gpu.allocated.idle"),
            prometheus: Some("container_gpu_allocated_idle"),
            help: "1 when the container holds this allocated device but used neither its memory nor its SMs.",
            base: ALLOCATION,
            ..CONTAINER_METRIC
        },
        // Sharing and billing (container resource; the idle entry on the node resource).
        ContainerGpuEnergy => Metric {
            otlp: Some("container.gpu.energy"),
            prometheus: Some("container_gpu_energy_joules_total"),
            unit: "J",
            kind: Counter,
            help: "The container's share of the GPU's energy, joules.",
            extra: &[Attr::Owner],
            note: "Each interval's energy is split by SM-utilization share (memory share where none is known, e.g. MIG); the idle rest goes to the containers the GPU is allocated to, else to an `owner=\"idle\"` entry per GPU, so the containers and the idle entry sum to `hw.energy`. OTLP start time: the first charge",
            ..CONTAINER_METRIC
        },
        ContainerGpuMemoryPeak => Metric {
            otlp: Some("container.gpu.memory.peak"),
            prometheus: Some("container_gpu_memory_peak_bytes"),
            unit: "By",
            help: "Most GPU memory the container held on the device over the peak window, bytes.",
            note: "Window: `usage.peak_window_secs` (match it to the export interval); includes NVML accounting's max memory of processes that exited",
            ..CONTAINER_METRIC
        },
        ContainerGpuMemoryLimit => Metric {
            otlp: Some("container.gpu.memory.limit"),
            prometheus: Some("container_gpu_memory_limit_bytes"),
            unit: "By",
            kind: UpDownCounter,
            help: "The container's GPU memory limit on the device, bytes, where one is known.",
            extra: &[Attr::LimitSource],
            note: "HAMi's `CUDA_DEVICE_MEMORY_LIMIT[_N]`, else the MIG device's size, else the container's time-slicing replicas over the GPU's, times its memory. `container_gpu_memory_usage_bytes / container_gpu_memory_limit_bytes` is how near its quota it is",
            ..CONTAINER_METRIC
        },
        ContainerGpuUtilizationLimit => Metric {
            otlp: Some("container.gpu.utilization.limit"),
            prometheus: Some("container_gpu_utilization_limit_ratio"),
            help: "The container's SM utilization limit on the device (0-1): HAMi's CUDA_DEVICE_SM_LIMIT.",
            ..CONTAINER_METRIC
        },
        ContainerGpuAccountingTime => Metric {
            otlp: Some("container.gpu.accounting.time"),
            prometheus: Some("container_gpu_accounting_time_seconds_total"),
            unit: "s",
            kind: Counter,
            help: "GPU time of the container's exited processes from NVML accounting: run time x average utilization.",
            note: "Read when the kernel reports the exit of a process NVML listed, on GPUs in accounting mode; catches jobs shorter than the sampling interval",
            ..CONTAINER_METRIC
        },
        ContainerGpuAccountingProcesses => Metric {
            otlp: Some("container.gpu.accounting.processes"),
            prometheus: Some("container_gpu_accounting_processes_total"),
            unit: "{process}",
            kind: Counter,
            help: "Exited processes of the container whose NVML accounting stats were charged.",
            ..CONTAINER_METRIC
        },
        // Process group (opt-in; container resource).
        ProcessGpuMemoryUsage => Metric {
            otlp: Some("process.gpu.memory.usage"),
            prometheus: Some("process_gpu_memory_usage_bytes"),
            unit: "By",
            kind: UpDownCounter,
            help: "GPU memory held by the process on the device, bytes.",
            ..PROCESS_METRIC
        },
        ProcessGpuUtilization => Metric {
            otlp: Some("process.gpu.utilization"),
            prometheus: Some("process_gpu_utilization_ratio"),
            help: "The process's share of the device's engines over the last sample period (0-1).",
            extra: &[Attr::HwGpuTask],
            ..PROCESS_METRIC
        },
        // Self group (node resource).
        EventsReceived => Metric {
            otlp: Some("gpu_agent.events.received"),
            prometheus: Some("gpu_agent_events_received_total"),
            kind: Counter,
            help: "Process and cgroup notifications received from the kernel.",
            ..SELF_METRIC
        },
        EventsLost => Metric {
            otlp: Some("gpu_agent.events.lost"),
            prometheus: Some("gpu_agent_events_lost_total"),
            kind: Counter,
            help: "Kernel notifications lost (ring buffer full).",
            note: "The kernel's own count; each loss triggers a resync",
            ..SELF_METRIC
        },
        Resyncs => Metric {
            otlp: Some("gpu_agent.resyncs"),
            prometheus: Some("gpu_agent_resyncs_total"),
            kind: Counter,
            help: "Resyncs of the process cache from the kernel map after lost notifications.",
            ..SELF_METRIC
        },
        ProcfsFallbackLookups => Metric {
            otlp: Some("gpu_agent.procfs.fallback_lookups"),
            prometheus: Some("gpu_agent_procfs_fallback_lookups_total"),
            kind: Counter,
            help: "Processes looked up in /proc because no kernel notification described them.",
            ..SELF_METRIC
        },
        CachedProcesses => Metric {
            otlp: Some("gpu_agent.cache.processes"),
            prometheus: Some("gpu_agent_cached_processes"),
            unit: "{process}",
            kind: UpDownCounter,
            help: "Processes in the agent's cache.",
            ..SELF_METRIC
        },
        ExportFailures => Metric {
            otlp: Some("gpu_agent.export.failures"),
            prometheus: Some("gpu_agent_export_failures_total"),
            kind: Counter,
            help: "OTLP exports that failed.",
            ..SELF_METRIC
        },
        ExportDroppedBatches => Metric {
            otlp: Some("gpu_agent.export.dropped_batches"),
            prometheus: Some("gpu_agent_export_dropped_batches_total"),
            kind: Counter,
            help: "OTLP batches dropped: the queue over its byte budget, or refused by the collector.",
            ..SELF_METRIC
        },
        UsageRecordsEmitted => Metric {
            otlp: Some("gpu_agent.usage.records.emitted"),
            prometheus: Some("gpu_agent_usage_records_emitted_total"),
            unit: "{record}",
            kind: Counter,
            help: "Usage records emitted: a container stopped using a device.",
            ..SELF_METRIC
        },
        UsageRecordsDropped => Metric {
            otlp: Some("gpu_agent.usage.records.dropped"),
            prometheus: Some("gpu_agent_usage_records_dropped_total"),
            unit: "{record}",
            kind: Counter,
            help: "Usage records lost: the queue full while the collector was down, refused, or not written to the file.",
            ..SELF_METRIC
        },
        Mode => Metric {
            otlp: Some("gpu_agent.mode"),
            prometheus: Some("gpu_agent_mode"),
            help: "1 for the agent's current process-tracking mode.",
            extra: &[Attr::Mode],
            ..SELF_METRIC
        },
        NvmlUp => Metric {
            otlp: Some("gpu_agent.nvml.up"),
            prometheus: Some("gpu_agent_nvml_up"),
            help: "1 when NVML answers, 0 otherwise.",
            ..SELF_METRIC
        },
        Info => Metric {
            prometheus: Some("gpu_agent_info"),
            help: "The agent's version, value 1.",
            extra: &[Attr::Version],
            ..SELF_METRIC
        },
        // dcgm-exporter compatibility: its field names and units, Prometheus only.
        DcgmFbUsed => Metric {
            prometheus: Some("DCGM_FI_DEV_FB_USED"),
            unit: "MiB",
            help: "Framebuffer memory used (in MiB); with pod labels, that container's memory on the device.",
            dcgm: Some(Dcgm {
                device: Source::Metric(M::HwGpuMemoryUsage, None),
                container: Some(Source::Metric(M::ContainerGpuMemoryUsage, None)),
            }),
            ..DCGM_FIELD
        },
        DcgmFbFree => Metric {
            prometheus: Some("DCGM_FI_DEV_FB_FREE"),
            unit: "MiB",
            help: "Framebuffer memory free (in MiB).",
            dcgm: Some(Dcgm {
                device: Source::Difference(M::HwGpuMemoryLimit, M::HwGpuMemoryUsage),
                container: None,
            }),
            ..DCGM_FIELD
        },
        DcgmGpuUtil => Metric {
            prometheus: Some("DCGM_FI_DEV_GPU_UTIL"),
            unit: "%",
            help: "GPU utilization (in %); with pod labels, that container's SM utilization.",
            dcgm: Some(Dcgm {
                device: Source::Metric(M::HwGpuUtilization, Some((Attr::HwGpuTask, GPU_TASKS[0]))),
                container: Some(Source::Metric(
                    M::ContainerGpuUtilization,
                    Some((Attr::HwGpuTask, GPU_TASKS[0])),
                )),
            }),
            ..DCGM_FIELD
        },
        DcgmMemCopyUtil => Metric {
            prometheus: Some("DCGM_FI_DEV_MEM_COPY_UTIL"),
            unit: "%",
            help: "Memory utilization (in %); with pod labels, that container's.",
            dcgm: Some(Dcgm {
                device: Source::Metric(M::HwGpuUtilization, Some((Attr::HwGpuTask, GPU_TASKS[1]))),
                container: Some(Source::Metric(
                    M::ContainerGpuUtilization,
                    Some((Attr::HwGpuTask, GPU_TASKS[1])),
                )),
            }),
            ..DCGM_FIELD
        },
        DcgmPowerUsage => Metric {
            prometheus: Some("DCGM_FI_DEV_POWER_USAGE"),
            unit: "W",
            help: "Power draw (in W).",
            dcgm: Some(Dcgm {
                device: Source::Metric(M::HwPower, None),
                container: None,
            }),
            ..DCGM_FIELD
        },
        DcgmGpuTemp => Metric {
            prometheus: Some("DCGM_FI_DEV_GPU_TEMP"),
            unit: "C",
            help: "GPU temperature (in C).",
            dcgm: Some(Dcgm {
                device: Source::Metric(M::HwTemperature, None),
                container: None,
            }),
            ..DCGM_FIELD
        },
        DcgmSmClock => Metric {
            prometheus: Some("DCGM_FI_DEV_SM_CLOCK"),
            unit: "MHz",
            help: "SM clock frequency (in MHz).",
            dcgm: Some(Dcgm {
                device: Source::Metric(M::HwGpuClock, Some((Attr::Clock, CLOCKS[0]))),
                container: None,
            }),
            ..DCGM_FIELD
        },
        DcgmMemClock => Metric {
            prometheus: Some("DCGM_FI_DEV_MEM_CLOCK"),
            unit: "MHz",
            help: "Memory clock frequency (in MHz).",
            dcgm: Some(Dcgm {
                device: Source::Metric(M::HwGpuClock, Some((Attr::Clock, CLOCKS[1]))),
                container: None,
            }),
            ..DCGM_FIELD
        },
    }
}

impl MetricId {
    pub fn def(self) -> &'static Metric {
        &CATALOGUE[self as usize]
    }

    /// The OTLP name. Panics (a bug) for a Prometheus-only metric.
    pub fn otlp(self) -> &'static str {
        self.def()
            .otlp
            .unwrap_or_else(|| panic!("{self:?} has no OTLP name"))
    }

    /// The Prometheus family name. Panics (a bug) for an OTLP-only metric.
    pub fn prometheus(self) -> &'static str {
        self.def()
            .prometheus
            .unwrap_or_else(|| panic!("{self:?} has no Prometheus name"))
    }
}

/// Every Prometheus family name the agent can emit, dcgm-exporter's included, in output
/// order.
pub fn prometheus_names() -> impl Iterator<Item = &'static str> {
    CATALOGUE.iter().filter_map(|m| m.prometheus)
}

/// The dcgm-exporter fields that restate `id` (in `table`, the catalogue or a copy).
pub fn dcgm_fields_of(table: &[Metric], id: MetricId) -> Vec<&'static str> {
    let restates = |s: &Source| match *s {
        Source::Metric(m, _) => m == id,
        Source::Difference(a, b) => a == id || b == id,
    };
    table
        .iter()
        .filter(|m| {
            m.dcgm
                .is_some_and(|d| restates(&d.device) || d.container.as_ref().is_some_and(restates))
        })
        .filter_map(|m| m.prometheus)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn names_are_unique_per_sink() {
        for (what, names) in [
            (
                "OTLP",
                CATALOGUE.iter().filter_map(|m| m.otlp).collect::<Vec<_>>(),
            ),
            ("Prometheus", prometheus_names().collect()),
            (
                "OTLP attribute",
                ATTRIBUTES.iter().filter_map(|a| a.otlp).collect(),
            ),
            (
                "label",
                ATTRIBUTES.iter().filter_map(|a| a.prometheus).collect(),
            ),
        ] {
            let mut seen = HashSet::new();
            for n in names {
                assert!(seen.insert(n), "{what} name {n} twice");
            }
        }
    }

    #[test]
    fn every_entry_is_complete_and_consistent() {
        for &id in MetricId::ALL {
            let m = id.def();
            assert!(
                m.otlp.is_some() || m.prometheus.is_some(),
                "{id:?}: no name"
            );
            assert!(!m.help.is_empty() && !m.unit.is_empty(), "{id:?}");
            assert!(!m.help.contains('\n'), "{id:?}: one-line help");
            assert_eq!(m.group == Group::Dcgm, m.dcgm.is_some(), "{id:?}");
            if m.group == Group::Dcgm {
                assert!(m.otlp.is_none(), "{id:?}: dcgm names are Prometheus only");
            }
            if let Some(p) = m.prometheus {
                assert_eq!(
                    p.ends_with("_total"),
                    m.kind == Kind::Counter,
                    "{p}: a Prometheus counter, and only a counter, ends in _total"
                );
            }
            for &a in m
                .base
                .otlp
                .iter()
                .chain(m.extra.iter().filter(|_| m.otlp.is_some()))
            {
                let place = a.def().place;
                assert!(a.def().otlp.is_some(), "{id:?}: {a:?} has no OTLP key");
                assert_ne!(place, Place::EveryResource, "{id:?}: {a:?}");
            }
            for &a in m
                .base
                .prometheus
                .iter()
                .chain(m.extra.iter().filter(|_| m.prometheus.is_some()))
            {
                assert!(a.def().prometheus.is_some(), "{id:?}: {a:?} has no label");
            }
            if m.otlp.is_none() {
                assert!(
                    m.base.otlp.is_empty(),
                    "{id:?}: OTLP attributes on a Prometheus-only metric"
                );
            }
        }
    }

    #[test]
    fn attributes_have_a_name_in_some_sink() {
        for &a in Attr::ALL {
            let d = a.def();
            assert_eq!(d.otlp.is_none(), d.place == Place::PrometheusOnly, "{a:?}");
            assert!(d.otlp.is_some() || d.prometheus.is_some(), "{a:?}");
            assert!(
                !d.doc.is_empty() || !d.values.is_empty(),
                "{a:?}: say what it is"
            );
        }
    }

    #[test]
    fn mode_values_are_the_models() {
        use gpu_model::TrackingMode;
        let modes = [TrackingMode::Ebpf, TrackingMode::Procfs].map(TrackingMode::as_str);
        assert_eq!(Attr::Mode.def().values, modes);
    }

    #[test]
    fn prometheus_names_include_dcgm_and_prometheus_only_families() {
        let names: Vec<_> = prometheus_names().collect();
        assert!(names.contains(&MetricId::Info.prometheus()));
        assert!(names.contains(&MetricId::DcgmFbUsed.prometheus()));
        assert_eq!(names.len(), CATALOGUE.len(), "no OTLP-only metric today");
        assert_eq!(
            dcgm_fields_of(&CATALOGUE, MetricId::HwGpuUtilization),
            [
                MetricId::DcgmGpuUtil.prometheus(),
                MetricId::DcgmMemCopyUtil.prometheus()
            ]
        );
    }
}
