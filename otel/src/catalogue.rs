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
/// Values of `hw.state`: a GPU that fell off the bus, does not answer, or has no handle, is
/// `failed`.
pub const HW_STATES: [&str; 2] = ["ok", "failed"];
/// Values of `error.type` on `hw.errors` for memory ECC errors (and, on
/// `hw.gpu.memory.remapped_rows`, the errors that made a row be remapped).
pub const ECC_ERROR_TYPES: [&str; 2] = ["corrected", "uncorrected"];
/// Every value of `error.type`: ECC, PCIe link replays, and XID errors (with `xid`).
pub const ERROR_TYPES: [&str; 4] = ["corrected", "uncorrected", "pcie_replay", "xid"];
/// Values of `hw.gpu.engine` on `hw.gpu.activity` (NVML GPM; DCGM's profiling fields).
pub const GPU_ENGINES: [&str; 7] = ["graphics", "sm", "tensor", "dram", "fp64", "fp32", "fp16"];
/// Values of `hw.gpu.link`.
pub const GPU_LINKS: [&str; 2] = ["pcie", "nvlink"];
/// Values of `network.io.direction`.
pub const DIRECTIONS: [&str; 2] = ["transmit", "receive"];
/// NVML's clock throttle reasons: the bit of `nvmlDeviceGetCurrentClocksThrottleReasons`
/// and the value of `hw.gpu.throttle_reason`.
pub const THROTTLE_REASONS: [(u64, &str); 9] = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];
const THROTTLE_REASON_NAMES: [&str; 9] = {
    let mut out = [""; 9];
    let mut i = 0;
    while i < 9 {
        out[i] = THROTTLE_REASONS[i].1;
        i += 1;
    }
    out
};
/// Values of `clock` on `hw.gpu.clock`.
pub const CLOCKS: [&str; 2] = ["sm", "memory"];
/// Values of `owner`: a container, a pod-level cgroup, or processes outside any container.
pub const OWNERS: [&str; 3] = ["container", "pod", "host"];
/// The `owner` of a GPU's energy that no container was charged (idle, not allocated).
pub const OWNER_IDLE: &str = "idle";
/// Every value of `owner`.
pub const OWNER_VALUES: [&str; 4] = ["container", "pod", "host", OWNER_IDLE];
/// Values of `workload_kind` (gpu_model::WorkloadKind).
pub const WORKLOAD_KINDS: [&str; 7] = [
    "Deployment",
    "ReplicaSet",
    "StatefulSet",
    "DaemonSet",
    "Job",
    "CronJob",
    "Pod",
];
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
        // The pod's owner, inferred on the node (docs/metrics.md, "Workloads"): the
        // attributes of its kind, none for a pod no controller owns.
        DeploymentName => Attribute {
            otlp: Some("k8s.deployment.name"),
            doc: "the pod's Deployment, where its labels and name say (see [Workloads](#workloads))",
            ..RESOURCE
        },
        ReplicaSetName => Attribute {
            otlp: Some("k8s.replicaset.name"),
            doc: "the pod's ReplicaSet: the Deployment's, or one no Deployment owns",
            ..RESOURCE
        },
        StatefulSetName => Attribute {
            otlp: Some("k8s.statefulset.name"),
            doc: "the pod's StatefulSet",
            ..RESOURCE
        },
        DaemonSetName => Attribute {
            otlp: Some("k8s.daemonset.name"),
            doc: "the pod's DaemonSet",
            ..RESOURCE
        },
        JobName => Attribute {
            otlp: Some("k8s.job.name"),
            doc: "the pod's Job, a CronJob's too",
            ..RESOURCE
        },
        CronJobName => Attribute {
            otlp: Some("k8s.cronjob.name"),
            doc: "the CronJob of the pod's Job",
            ..RESOURCE
        },
        WorkloadKind => Attribute {
            prometheus: Some("workload_kind"),
            values: &WORKLOAD_KINDS,
            doc: "the kind of the pod's top-level owner, where the runtime lists pod sandboxes (see [Workloads](#workloads)); `Pod` for a pod no controller owns",
            ..LABEL
        },
        Workload => Attribute {
            prometheus: Some("workload"),
            doc: "the name of the pod's top-level owner, with `workload_kind`",
            ..LABEL
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
            doc: "the GPU's state (`failed`: lost, stalled, or no handle)",
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
            values: &ERROR_TYPES,
            doc: "the kind of error: memory ECC (corrected, uncorrected), a PCIe link replay, an XID",
            ..POINT
        },
        Xid => Attribute {
            otlp: Some("xid"),
            prometheus: Some("xid"),
            doc: "the XID code (NVIDIA's GPU error numbers), with `error.type` = `xid`",
            ..POINT
        },
        HwGpuEngine => Attribute {
            otlp: Some("hw.gpu.engine"),
            prometheus: Some("hw_gpu_engine"),
            values: &GPU_ENGINES,
            doc: "the unit profiled (NVML GPM): graphics engine, SMs, tensor pipes, DRAM interface, FP pipes",
            ..POINT
        },
        HwGpuLink => Attribute {
            otlp: Some("hw.gpu.link"),
            prometheus: Some("hw_gpu_link"),
            values: &GPU_LINKS,
            doc: "the interconnect",
            ..POINT
        },
        NetworkIoDirection => Attribute {
            otlp: Some("network.io.direction"),
            prometheus: Some("network_io_direction"),
            values: &DIRECTIONS,
            doc: "from the GPU (transmit) or to it (receive)",
            ..POINT
        },
        ThrottleReason => Attribute {
            otlp: Some("hw.gpu.throttle_reason"),
            prometheus: Some("hw_gpu_throttle_reason"),
            values: &THROTTLE_REASON_NAMES,
            doc: "why NVML holds the clocks down (`nvmlClocksThrottleReason*`)",
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
        MigProfile => Attribute {
            prometheus: Some("mig_profile"),
            doc: "the MIG device's profile (`3g.40gb`), on MIG devices only",
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
        DcgmGpuProfile => Attribute {
            prometheus: Some("GPU_I_PROFILE"),
            doc: "dcgm-exporter: MIG profile (e.g. `1g.10gb`), on MIG series",
            ..LABEL
        },
        DcgmVgpu => Attribute {
            prometheus: Some("vgpu"),
            doc: "dcgm-exporter (`dcgm-virtual-gpus`): the time-slicing replica the pod holds (`::N`)",
            ..LABEL
        },
        DcgmErrCode => Attribute {
            prometheus: Some("err_code"),
            doc: "dcgm-exporter: the XID code, on `DCGM_FI_DEV_XID_ERRORS`",
            ..LABEL
        },
        DcgmErrMsg => Attribute {
            prometheus: Some("err_msg"),
            doc: "dcgm-exporter: what the XID means, on `DCGM_FI_DEV_XID_ERRORS`",
            ..LABEL
        },
        DcgmHostname => Attribute {
            prometheus: Some("Hostname"),
            doc: "dcgm-exporter: the node name when known, else the host name (`dcgm.host_label = \"Hostname\"`, the default, as released)",
            ..LABEL
        },
        DcgmHostnameLower => Attribute {
            prometheus: Some("hostname"),
            doc: "dcgm-exporter: `Hostname` as dcgm-exporter's main branch spells it (`dcgm.host_label = \"hostname\"`)",
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

/// The identity of a container resource (OTLP), then `$more`.
macro_rules! container_resource {
    ($($more:expr),*) => {
        &[
            Attr::ContainerId,
            Attr::PodUid,
            Attr::PodName,
            Attr::Namespace,
            Attr::ContainerName,
            Attr::Runtime,
            Attr::DeploymentName,
            Attr::ReplicaSetName,
            Attr::StatefulSetName,
            Attr::DaemonSetName,
            Attr::JobName,
            Attr::CronJobName,
            $($more),*
        ]
    };
}

/// A container on a device as Prometheus labels it, then `$more`.
macro_rules! container_labels {
    ($($more:expr),*) => {
        &[
            Attr::ContainerId,
            Attr::PodUid,
            Attr::Namespace,
            Attr::PodName,
            Attr::ContainerName,
            Attr::WorkloadKind,
            Attr::Workload,
            Attr::Qos,
            Attr::Runtime,
            Attr::HwId,
            Attr::GpuUuid,
            Attr::Node,
            Attr::Owner,
            $($more),*
        ]
    };
}

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
    otlp: container_resource!(Attr::HwId, Attr::HwParent),
    prometheus: container_labels!(),
};
/// A container's open stretch on a device, as rightsizing reads it (Prometheus only): the
/// container's labels, then the GPU's model and the MIG profile.
pub const HELD: AttrSet = AttrSet {
    name: "held",
    otlp: &[],
    prometheus: container_labels!(Attr::HwModel, Attr::MigProfile),
};
/// A device the kubelet allocated to a container.
pub const ALLOCATION: AttrSet = AttrSet {
    name: "allocation",
    otlp: container_resource!(Attr::HwId),
    prometheus: &[
        Attr::ContainerId,
        Attr::PodUid,
        Attr::Namespace,
        Attr::PodName,
        Attr::ContainerName,
        Attr::WorkloadKind,
        Attr::Workload,
        Attr::HwId,
        Attr::Node,
    ],
};
/// A process on a device.
pub const PROCESS: AttrSet = AttrSet {
    name: "process",
    otlp: container_resource!(Attr::ProcessPid, Attr::HwId),
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
/// XID errors charged to a container: its identity (OTLP: its resource) and the device.
pub const XID_CHARGE: AttrSet = AttrSet {
    name: "xid charge",
    otlp: container_resource!(Attr::HwId, Attr::HwParent),
    prometheus: &[
        Attr::ContainerId,
        Attr::PodUid,
        Attr::Namespace,
        Attr::PodName,
        Attr::ContainerName,
        Attr::HwId,
        Attr::GpuUuid,
        Attr::Node,
    ],
};
/// dcgm-exporter's labels: `GPU_I_PROFILE`, `GPU_I_ID` on MIG series; the allocated pod's
/// where the kubelet allocated the device; `pod_uid` and `vgpu` on the per-pod series of
/// `dcgm-virtual-gpus`; `err_code`, `err_msg` on `DCGM_FI_DEV_XID_ERRORS`.
pub const DCGM: AttrSet = AttrSet {
    name: "dcgm",
    otlp: &[],
    prometheus: &[
        Attr::GpuIndex,
        Attr::DcgmUuid,
        Attr::PciBusId,
        Attr::DcgmDevice,
        Attr::DcgmModelName,
        Attr::DcgmGpuProfile,
        Attr::DcgmGpuInstance,
        Attr::DcgmHostname,
        Attr::DcgmHostnameLower,
        Attr::DcgmDriverVersion,
        Attr::ContainerName,
        Attr::Namespace,
        Attr::PodName,
        Attr::PodUid,
        Attr::DcgmVgpu,
        Attr::DcgmErrCode,
        Attr::DcgmErrMsg,
    ],
};

/// Which gpu-agent value a dcgm-exporter series restates (converted to the dcgm unit).
#[derive(Clone, Copy, Debug)]
pub enum Source {
    /// The metric's value; its data point with the attribute at that value, where it has
    /// several.
    Metric(MetricId, Option<(Attr, &'static str)>),
    /// The metric's data point with the attributes at these values.
    Metrics(MetricId, &'static [(Attr, &'static str)]),
    /// The first metric's value minus the others'.
    Difference(MetricId, &'static [MetricId]),
    /// No gpu-agent metric carries it: how it is made.
    Derived(&'static str),
}

/// A dcgm-exporter field (the entry's Prometheus name is the field name; its `unit`,
/// `kind` and `help` are dcgm-exporter's, as its default counters CSV declares them).
#[derive(Clone, Copy, Debug)]
pub struct Dcgm {
    /// What its series restate.
    pub source: Source,
    /// gpu-agent's value per dcgm-exporter unit (MiB: 1048576 bytes; %: 0.01).
    pub per: f64,
    /// The NVML call behind it.
    pub nvml: &'static str,
    /// In dcgm-exporter's default counters CSV, so served without `-f`.
    pub default: bool,
    /// Also served per MIG device (GPU instance), as DCGM does.
    pub mig: bool,
    /// Under `dcgm-virtual-gpus`, a pod's own series carries this instead of the device's
    /// value (dcgm-exporter's per-process fields: FB_USED and GPU_UTIL).
    pub per_pod: Option<Source>,
}

const DCGM_DEFAULT: Dcgm = Dcgm {
    source: Source::Derived(""),
    per: 1.0,
    nvml: "",
    default: true,
    mig: false,
    per_pod: None,
};

/// dcgm-exporter fields gpu-agent does not serve, and why: a counters CSV naming one is
/// refused with the reason.
pub const DCGM_UNSERVED: &[(&str, &str)] = &[
    ("DCGM_FI_DEV_POWER_VIOLATION", "not in dcgm-exporter's default set, and not read (NVML has it: nvmlDeviceGetViolationStatus); `hw_gpu_clock_throttled{hw_gpu_throttle_reason=\"sw_power_cap\"}` says the same"),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "not in dcgm-exporter's default set, and not read; `hw_gpu_clock_throttled{hw_gpu_throttle_reason=~\".*thermal.*\"}` says the same"),
    ("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "not in dcgm-exporter's default set, and not read"),
    ("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "not in dcgm-exporter's default set, and not read"),
    ("DCGM_FI_DEV_LOW_UTIL_VIOLATION", "not in dcgm-exporter's default set, and not read"),
    ("DCGM_FI_DEV_RELIABILITY_VIOLATION", "not in dcgm-exporter's default set, and not read"),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "aggregate ECC counts are not read (volatile ones are: DCGM_FI_DEV_ECC_SBE_VOL_TOTAL)"),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "aggregate ECC counts are not read (volatile ones are: DCGM_FI_DEV_ECC_DBE_VOL_TOTAL)"),
    ("DCGM_FI_DEV_RETIRED_SBE", "page retirement predates row remapping (Ampere and later use DCGM_FI_DEV_*_REMAPPED_ROWS)"),
    ("DCGM_FI_DEV_RETIRED_DBE", "page retirement predates row remapping (Ampere and later use DCGM_FI_DEV_*_REMAPPED_ROWS)"),
    ("DCGM_FI_DEV_RETIRED_PENDING", "page retirement predates row remapping (Ampere and later use DCGM_FI_DEV_ROW_REMAP_PENDING)"),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "per-link NVLink error counters are not read"),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "per-link NVLink error counters are not read"),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "per-link NVLink error counters are not read"),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "per-link NVLink error counters are not read"),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_L0", "per-link NVLink bandwidth is not read (all links: DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL)"),
    ("DCGM_FI_NVML_VERSION", "only DCGM_FI_DRIVER_VERSION is served as a label"),
    ("DCGM_FI_DEV_BRAND", "only DCGM_FI_DRIVER_VERSION is served as a label"),
    ("DCGM_FI_DEV_SERIAL", "only DCGM_FI_DRIVER_VERSION is served as a label"),
    ("DCGM_FI_DEV_OEM_INFOROM_VER", "only DCGM_FI_DRIVER_VERSION is served as a label"),
    ("DCGM_FI_DEV_ECC_INFOROM_VER", "only DCGM_FI_DRIVER_VERSION is served as a label"),
    ("DCGM_FI_DEV_POWER_INFOROM_VER", "only DCGM_FI_DRIVER_VERSION is served as a label"),
    ("DCGM_FI_DEV_INFOROM_IMAGE_VER", "only DCGM_FI_DRIVER_VERSION is served as a label"),
    ("DCGM_FI_DEV_VBIOS_VERSION", "only DCGM_FI_DRIVER_VERSION is served as a label"),
    ("DCGM_EXP_CLOCK_EVENTS_COUNT", "dcgm-exporter's own counter of DCGM clock events, which need DCGM's policy engine"),
    ("DCGM_EXP_XID_ERRORS_COUNT", "dcgm-exporter's own windowed count; gpu-agent counts every XID: `hw_errors_total{error_type=\"xid\"}`"),
    ("DCGM_EXP_GPU_HEALTH_STATUS", "DCGM's health watches, which need the DCGM host engine"),
    ("DCGM_EXP_P2P_STATUS", "DCGM's P2P status, which needs the DCGM host engine"),
    ("DCGM_FI_PROF_PIPE_INT_ACTIVE", "not among the GPM metrics gpu-agent samples"),
    ("DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE", "not among the GPM metrics gpu-agent samples"),
    ("DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE", "not among the GPM metrics gpu-agent samples"),
    ("DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE", "not among the GPM metrics gpu-agent samples"),
];

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

/// A dcgm-exporter field: its name, unit, type and help as its counters CSV declares them.
const fn dcgm(
    name: &'static str,
    unit: &'static str,
    kind: Kind,
    help: &'static str,
    d: Dcgm,
) -> Metric {
    Metric {
        prometheus: Some(name),
        unit,
        kind,
        help,
        dcgm: Some(d),
        ..DCGM_FIELD
    }
}

/// A field that restates `id` (its point with `sel`), `per` of ours to one of theirs.
const fn restates(
    id: MetricId,
    sel: Option<(Attr, &'static str)>,
    per: f64,
    nvml: &'static str,
) -> Dcgm {
    Dcgm {
        source: Source::Metric(id, sel),
        per,
        nvml,
        ..DCGM_DEFAULT
    }
}

/// The same, also per MIG device.
const fn restates_mig(
    id: MetricId,
    sel: Option<(Attr, &'static str)>,
    per: f64,
    nvml: &'static str,
) -> Dcgm {
    Dcgm {
        mig: true,
        ..restates(id, sel, per, nvml)
    }
}

/// Not in dcgm-exporter's default CSV: served when a counters CSV names it.
const fn optional(d: Dcgm) -> Dcgm {
    Dcgm {
        default: false,
        ..d
    }
}

const MIB_: f64 = 1_048_576.0;
const PCT: f64 = 0.01;
const GPM: &str = "nvmlGpmSampleGet, nvmlGpmMigSampleGet, nvmlGpmMetricsGet";

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
            help: "GPU errors: memory ECC (since the driver loaded), PCIe link replays, XIDs (since the agent started).",
            extra: &[Attr::ErrorType, Attr::Xid],
            note: "ECC: volatile counts, `error.type` = `corrected` / `uncorrected`; `pcie_replay`: link-level retries; `xid`: critical XID errors from NVML's event API, one series per code (`xid`)",
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
        NvmlStalled => Metric {
            otlp: Some("gpu_agent.nvml.stalled"),
            prometheus: Some("gpu_agent_nvml_stalled"),
            kind: UpDownCounter,
            help: "1 while an NVML call on the GPU has not returned for nvml.stall_timeout_ms (a wedged driver), else 0.",
            note: "A stalled GPU is `failed` in `hw.status` and has no other series: its last readings are not repeated",
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
        // Health, profiling and interconnect (dcgm-exporter's fields, in our names).
        HwGpuMemoryReserved => Metric {
            otlp: Some("hw.gpu.memory.reserved"),
            prometheus: Some("hw_gpu_memory_reserved_bytes"),
            unit: "By",
            kind: UpDownCounter,
            help: "GPU memory the driver reserves for itself, bytes.",
            ..DEVICE_METRIC
        },
        HwGpuMemoryTemperature => Metric {
            otlp: Some("hw.gpu.memory.temperature"),
            prometheus: Some("hw_gpu_memory_temperature_celsius"),
            unit: "Cel",
            help: "GPU memory (HBM) temperature, degrees Celsius.",
            ..DEVICE_METRIC
        },
        HwGpuMemoryRemappedRows => Metric {
            otlp: Some("hw.gpu.memory.remapped_rows"),
            prometheus: Some("hw_gpu_memory_remapped_rows_total"),
            unit: "{row}",
            kind: Counter,
            help: "GPU memory rows remapped after ECC errors, by the kind of error.",
            extra: &[Attr::ErrorType],
            note: "Ampere and later; `error.type` = `corrected` / `uncorrected`",
            ..DEVICE_METRIC
        },
        HwGpuMemoryRowRemapPending => Metric {
            otlp: Some("hw.gpu.memory.row_remap.pending"),
            prometheus: Some("hw_gpu_memory_row_remap_pending"),
            help: "1 while a row remapping waits for the next GPU reset.",
            ..DEVICE_METRIC
        },
        HwGpuMemoryRowRemapFailed => Metric {
            otlp: Some("hw.gpu.memory.row_remap.failed"),
            prometheus: Some("hw_gpu_memory_row_remap_failed"),
            help: "1 when a row remapping failed: the GPU needs service.",
            ..DEVICE_METRIC
        },
        HwGpuIo => Metric {
            otlp: Some("hw.gpu.io"),
            prometheus: Some("hw_gpu_io_bytes_total"),
            unit: "By",
            kind: Counter,
            help: "Bytes moved over the GPU's NVLinks since the driver loaded, all links.",
            extra: &[Attr::HwGpuLink, Attr::NetworkIoDirection],
            note: "`hw.gpu.link` = `nvlink`; NVML counts KiB (`NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX`/`_RX`)",
            ..DEVICE_METRIC
        },
        HwGpuBandwidth => Metric {
            otlp: Some("hw.gpu.bandwidth"),
            prometheus: Some("hw_gpu_bandwidth_bytes_per_second"),
            unit: "By/s",
            help: "PCIe and NVLink traffic over the last profiling period (nvml.slow_interval_ms), bytes per second (NVML GPM).",
            extra: &[Attr::HwGpuLink, Attr::NetworkIoDirection],
            note: "GPU and MIG devices, Hopper and later; absent where GPM is unsupported (`/debug/stats` says why)",
            ..DEVICE_METRIC
        },
        HwGpuActivity => Metric {
            otlp: Some("hw.gpu.activity"),
            prometheus: Some("hw_gpu_activity_ratio"),
            help: "Fraction of the last profiling period (nvml.slow_interval_ms) each unit was active (NVML GPM).",
            extra: &[Attr::HwGpuEngine],
            note: "GPU and MIG devices, Hopper and later; absent where GPM is unsupported (`/debug/stats` says why)",
            ..DEVICE_METRIC
        },
        HwGpuSmOccupancy => Metric {
            otlp: Some("hw.gpu.sm.occupancy"),
            prometheus: Some("hw_gpu_sm_occupancy_ratio"),
            help: "Warps resident on the SMs over the maximum, averaged over the last profiling period (nvml.slow_interval_ms; NVML GPM).",
            note: "As `hw.gpu.activity`",
            ..DEVICE_METRIC
        },
        HwGpuClockThrottled => Metric {
            otlp: Some("hw.gpu.clock.throttled"),
            prometheus: Some("hw_gpu_clock_throttled"),
            help: "1 while the clocks are held down for this reason, 0 otherwise.",
            extra: &[Attr::ThrottleReason],
            note: "One series per reason NVML knows",
            ..DEVICE_METRIC
        },
        HwGpuVgpuLicensed => Metric {
            otlp: Some("hw.gpu.vgpu.licensed"),
            prometheus: Some("hw_gpu_vgpu_licensed"),
            help: "1 when the vGPU license is held, 0 otherwise (also where the GPU has no GRID licensing).",
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
            note: "Absent where the device cannot say its processes' SM utilization (MIG: see the MIG device's `hw.gpu.activity`), never 0 for unknown. OTLP start time: when the agent first saw this container on this device",
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
        ContainerGpuErrors => Metric {
            otlp: Some("container.gpu.errors"),
            prometheus: Some("container_gpu_errors_total"),
            unit: "{error}",
            kind: Counter,
            help: "XID errors of the device that the kernel log charged to the container's processes.",
            base: XID_CHARGE,
            extra: &[Attr::ErrorType, Attr::Xid],
            note: "From `NVRM: Xid (...): N, pid=P` lines of /dev/kmsg, since the agent started; the series stays after the process (or container) is gone",
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
        // Rightsizing's inputs (deploy/prometheus/gpu-agent-rightsizing.yaml): what an
        // open stretch holds, with the GPU's model, as the usage records say it.
        ContainerGpuShare => Metric {
            prometheus: Some("container_gpu_share"),
            unit: "{gpu}",
            help: "The part of a GPU the container holds on the device while it has a process there or holds its allocation.",
            base: HELD,
            note: "Its allocation: 1 for a whole GPU, the time-slicing replicas it holds over the GPU's, a MIG profile's compute slices over the GPU's; a device it uses without an allocation counts its part of the GPU. `model` is the GPU's (a MIG device's parent's). As the usage records' `gpus_allocated`; Prometheus only (OTLP has the records' logs)",
            ..CONTAINER_METRIC
        },
        ContainerGpuSmShare => Metric {
            prometheus: Some("container_gpu_sm_share"),
            unit: "{gpu}",
            help: "The container's SM use on the device as a part of a whole GPU (0-1), over the last sample period.",
            base: HELD,
            note: "The figure its usage profile takes (GPM's SM activity where the container is the device's only user, else its processes' utilization), times a MIG device's part of the GPU. Absent where unknown. Prometheus only",
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
            help: "Usage records given up for good, once per destination (the file, the collector): a queue over its bound while it failed, refused by the collector, or still queued at exit.",
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
        // dcgm-exporter's fields: its names, units, types and help, Prometheus only. Table
        // order is dcgm-exporter's default counters CSV; the optional ones follow.
        DcgmSmClock => dcgm("DCGM_FI_DEV_SM_CLOCK", "MHz", Gauge, "SM clock frequency (in MHz).",
            restates(M::HwGpuClock, Some((Attr::Clock, CLOCKS[0])), 1e6, "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)")),
        DcgmMemClock => dcgm("DCGM_FI_DEV_MEM_CLOCK", "MHz", Gauge, "Memory clock frequency (in MHz).",
            restates(M::HwGpuClock, Some((Attr::Clock, CLOCKS[1])), 1e6, "nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)")),
        DcgmMemoryTemp => dcgm("DCGM_FI_DEV_MEMORY_TEMP", "C", Gauge, "Memory temperature (in C).",
            restates(M::HwGpuMemoryTemperature, None, 1.0, "nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)")),
        DcgmGpuTemp => dcgm("DCGM_FI_DEV_GPU_TEMP", "C", Gauge, "GPU temperature (in C).",
            restates(M::HwTemperature, None, 1.0, "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)")),
        DcgmPowerUsage => dcgm("DCGM_FI_DEV_POWER_USAGE", "W", Gauge, "Power draw (in W).",
            restates(M::HwPower, None, 1.0, "nvmlDeviceGetPowerUsage")),
        DcgmTotalEnergy => dcgm("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "mJ", Counter, "Total energy consumption since boot (in mJ).",
            restates(M::HwEnergy, None, 0.001, "nvmlDeviceGetTotalEnergyConsumption")),
        DcgmPcieReplay => dcgm("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "{retry}", Counter, "Total number of PCIe retries.",
            restates(M::HwErrors, Some((Attr::ErrorType, ERROR_TYPES[2])), 1.0, "nvmlDeviceGetPcieReplayCounter")),
        DcgmGpuUtil => dcgm("DCGM_FI_DEV_GPU_UTIL", "%", Gauge, "GPU utilization (in %).",
            Dcgm {
                per_pod: Some(Source::Metric(M::ContainerGpuUtilization, Some((Attr::HwGpuTask, GPU_TASKS[0])))),
                ..restates(M::HwGpuUtilization, Some((Attr::HwGpuTask, GPU_TASKS[0])), PCT, "nvmlDeviceGetUtilizationRates")
            }),
        DcgmMemCopyUtil => dcgm("DCGM_FI_DEV_MEM_COPY_UTIL", "%", Gauge, "Memory utilization (in %).",
            restates(M::HwGpuUtilization, Some((Attr::HwGpuTask, GPU_TASKS[1])), PCT, "nvmlDeviceGetUtilizationRates")),
        DcgmEncUtil => dcgm("DCGM_FI_DEV_ENC_UTIL", "%", Gauge, "Encoder utilization (in %).",
            restates(M::HwGpuUtilization, Some((Attr::HwGpuTask, GPU_TASKS[2])), PCT, "nvmlDeviceGetEncoderUtilization")),
        DcgmDecUtil => dcgm("DCGM_FI_DEV_DEC_UTIL", "%", Gauge, "Decoder utilization (in %).",
            restates(M::HwGpuUtilization, Some((Attr::HwGpuTask, GPU_TASKS[3])), PCT, "nvmlDeviceGetDecoderUtilization")),
        DcgmXidErrors => dcgm("DCGM_FI_DEV_XID_ERRORS", "{xid}", Gauge, "Value of the last XID error encountered.",
            Dcgm {
                source: Source::Derived("the last XID code NVML's event API delivered since the agent started, 0 before any, with `err_code` and `err_msg` (every XID is counted in `hw_errors_total{error_type=\"xid\"}`)"),
                nvml: "nvmlDeviceRegisterEvents(nvmlEventTypeXidCriticalError), nvmlEventSetWait_v2",
                ..DCGM_DEFAULT
            }),
        DcgmFbFree => dcgm("DCGM_FI_DEV_FB_FREE", "MiB", Gauge, "Framebuffer memory free (in MiB).",
            Dcgm {
                source: Source::Difference(M::HwGpuMemoryLimit, &[M::HwGpuMemoryUsage, M::HwGpuMemoryReserved]),
                ..restates_mig(M::HwGpuMemoryLimit, None, MIB_, "nvmlDeviceGetMemoryInfo_v2")
            }),
        DcgmFbUsed => dcgm("DCGM_FI_DEV_FB_USED", "MiB", Gauge, "Framebuffer memory used (in MiB).",
            Dcgm {
                per_pod: Some(Source::Metric(M::ContainerGpuMemoryUsage, None)),
                ..restates_mig(M::HwGpuMemoryUsage, None, MIB_, "nvmlDeviceGetMemoryInfo_v2")
            }),
        DcgmFbReserved => dcgm("DCGM_FI_DEV_FB_RESERVED", "MiB", Gauge, "Framebuffer memory reserved (in MiB).",
            restates(M::HwGpuMemoryReserved, None, MIB_, "nvmlDeviceGetMemoryInfo_v2")),
        DcgmNvlinkBandwidthTotal => dcgm("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "MB/s", Counter, "Total number of NVLink bandwidth counters for all lanes.",
            Dcgm {
                source: Source::Derived("the rate of `hw_gpu_io_bytes_total{hw_gpu_link=\"nvlink\"}`, both directions, over the last sample: KiB per second / 1000, truncated, as DCGM computes it (a rate, though the CSV says counter); absent at the first sample"),
                nvml: "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _RX; all links)",
                ..DCGM_DEFAULT
            }),
        DcgmVgpuLicenseStatus => dcgm("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "1", Gauge, "vGPU License status",
            restates(M::HwGpuVgpuLicensed, None, 1.0, "nvmlDeviceGetGridLicensableFeatures_v4")),
        DcgmUncorrectableRemappedRows => dcgm("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "{row}", Counter, "Number of remapped rows for uncorrectable errors",
            restates(M::HwGpuMemoryRemappedRows, Some((Attr::ErrorType, ECC_ERROR_TYPES[1])), 1.0, "nvmlDeviceGetRemappedRows")),
        DcgmCorrectableRemappedRows => dcgm("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "{row}", Counter, "Number of remapped rows for correctable errors",
            restates(M::HwGpuMemoryRemappedRows, Some((Attr::ErrorType, ECC_ERROR_TYPES[0])), 1.0, "nvmlDeviceGetRemappedRows")),
        DcgmRowRemapFailure => dcgm("DCGM_FI_DEV_ROW_REMAP_FAILURE", "1", Gauge, "Whether remapping of rows has failed",
            restates(M::HwGpuMemoryRowRemapFailed, None, 1.0, "nvmlDeviceGetRemappedRows")),
        DcgmProfGrEngineActive => dcgm("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "1", Gauge, "Ratio of time the graphics engine is active.",
            restates_mig(M::HwGpuActivity, Some((Attr::HwGpuEngine, GPU_ENGINES[0])), 1.0, GPM)),
        DcgmProfPipeTensorActive => dcgm("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "1", Gauge, "Ratio of cycles the tensor (HMMA) pipe is active.",
            restates_mig(M::HwGpuActivity, Some((Attr::HwGpuEngine, GPU_ENGINES[2])), 1.0, GPM)),
        DcgmProfDramActive => dcgm("DCGM_FI_PROF_DRAM_ACTIVE", "1", Gauge, "Ratio of cycles the device memory interface is active sending or receiving data.",
            restates_mig(M::HwGpuActivity, Some((Attr::HwGpuEngine, GPU_ENGINES[3])), 1.0, GPM)),
        DcgmProfPcieTxBytes => dcgm("DCGM_FI_PROF_PCIE_TX_BYTES", "B/s", Gauge, "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
            Dcgm {
                source: Source::Metrics(M::HwGpuBandwidth, &[(Attr::HwGpuLink, GPU_LINKS[0]), (Attr::NetworkIoDirection, DIRECTIONS[0])]),
                ..restates_mig(M::HwGpuBandwidth, None, MIB_, GPM)
            }),
        DcgmProfPcieRxBytes => dcgm("DCGM_FI_PROF_PCIE_RX_BYTES", "B/s", Gauge, "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
            Dcgm {
                source: Source::Metrics(M::HwGpuBandwidth, &[(Attr::HwGpuLink, GPU_LINKS[0]), (Attr::NetworkIoDirection, DIRECTIONS[1])]),
                ..restates_mig(M::HwGpuBandwidth, None, MIB_, GPM)
            }),
        // Optional: served when a counters CSV names them.
        DcgmProfSmActive => dcgm("DCGM_FI_PROF_SM_ACTIVE", "1", Gauge, "The ratio of cycles an SM has at least 1 warp assigned.",
            optional(restates_mig(M::HwGpuActivity, Some((Attr::HwGpuEngine, GPU_ENGINES[1])), 1.0, GPM))),
        DcgmProfSmOccupancy => dcgm("DCGM_FI_PROF_SM_OCCUPANCY", "1", Gauge, "The ratio of number of warps resident on an SM.",
            optional(restates_mig(M::HwGpuSmOccupancy, None, 1.0, GPM))),
        DcgmProfPipeFp64Active => dcgm("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "1", Gauge, "Ratio of cycles the fp64 pipes are active.",
            optional(restates_mig(M::HwGpuActivity, Some((Attr::HwGpuEngine, GPU_ENGINES[4])), 1.0, GPM))),
        DcgmProfPipeFp32Active => dcgm("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "1", Gauge, "Ratio of cycles the fp32 pipes are active.",
            optional(restates_mig(M::HwGpuActivity, Some((Attr::HwGpuEngine, GPU_ENGINES[5])), 1.0, GPM))),
        DcgmProfPipeFp16Active => dcgm("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "1", Gauge, "Ratio of cycles the fp16 pipes are active.",
            optional(restates_mig(M::HwGpuActivity, Some((Attr::HwGpuEngine, GPU_ENGINES[6])), 1.0, GPM))),
        DcgmProfNvlinkTxBytes => dcgm("DCGM_FI_PROF_NVLINK_TX_BYTES", "B/s", Gauge, "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
            optional(Dcgm {
                source: Source::Metrics(M::HwGpuBandwidth, &[(Attr::HwGpuLink, GPU_LINKS[1]), (Attr::NetworkIoDirection, DIRECTIONS[0])]),
                ..restates_mig(M::HwGpuBandwidth, None, MIB_, GPM)
            })),
        DcgmProfNvlinkRxBytes => dcgm("DCGM_FI_PROF_NVLINK_RX_BYTES", "B/s", Gauge, "The rate of data received over NVLink, not including protocol headers, in bytes per second.",
            optional(Dcgm {
                source: Source::Metrics(M::HwGpuBandwidth, &[(Attr::HwGpuLink, GPU_LINKS[1]), (Attr::NetworkIoDirection, DIRECTIONS[1])]),
                ..restates_mig(M::HwGpuBandwidth, None, MIB_, GPM)
            })),
        DcgmClockThrottleReasons => dcgm("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "1", Gauge, "Current clock throttle reasons (bitmask of DCGM_CLOCKS_THROTTLE_REASON_*).",
            optional(Dcgm {
                source: Source::Derived("the bitmask NVML returns (`hw_gpu_clock_throttled` has one series per reason)"),
                nvml: "nvmlDeviceGetCurrentClocksThrottleReasons",
                ..DCGM_DEFAULT
            })),
        DcgmRowRemapPending => dcgm("DCGM_FI_DEV_ROW_REMAP_PENDING", "1", Gauge, "Whether remapping of rows is pending.",
            optional(restates(M::HwGpuMemoryRowRemapPending, None, 1.0, "nvmlDeviceGetRemappedRows"))),
        DcgmEccSbeVolTotal => dcgm("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "{error}", Counter, "Total number of single-bit volatile ECC errors.",
            optional(restates(M::HwErrors, Some((Attr::ErrorType, ECC_ERROR_TYPES[0])), 1.0, "nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE_ECC)"))),
        DcgmEccDbeVolTotal => dcgm("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "{error}", Counter, "Total number of double-bit volatile ECC errors.",
            optional(restates(M::HwErrors, Some((Attr::ErrorType, ECC_ERROR_TYPES[1])), 1.0, "nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE_ECC)"))),
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
        Source::Metric(m, _) | Source::Metrics(m, _) => m == id,
        Source::Difference(a, b) => a == id || b.contains(&id),
        Source::Derived(_) => false,
    };
    table
        .iter()
        .filter(|m| {
            m.dcgm
                .is_some_and(|d| restates(&d.source) || d.per_pod.as_ref().is_some_and(restates))
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
            // dcgm-exporter's names are its own: DCGM_FI_DEV_PCIE_REPLAY_COUNTER is a counter.
            if let Some(p) = m.prometheus.filter(|_| m.group != Group::Dcgm) {
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
    fn workload_kinds_are_the_models() {
        let kinds = gpu_model::WorkloadKind::ALL.map(gpu_model::WorkloadKind::as_str);
        assert_eq!(Attr::WorkloadKind.def().values, kinds);
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
                MetricId::DcgmMemCopyUtil.prometheus(),
                MetricId::DcgmEncUtil.prometheus(),
                MetricId::DcgmDecUtil.prometheus(),
            ]
        );
    }
}
