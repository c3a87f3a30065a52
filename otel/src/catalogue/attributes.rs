//! The attribute table: every attribute and label, the closed sets of their values, and the
//! attribute sets the metrics' series carry.
use super::{AttrSet, Attribute, Place};

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
        ClaimName => Attribute {
            otlp: Some("k8s.resourceclaim.name"),
            prometheus: Some("claim"),
            doc: "the DRA claim the device was allocated through (pod-resources `dynamic_resources`); absent for a device plugin's allocation",
            ..POINT
        },
        ClaimNamespace => Attribute {
            otlp: Some("k8s.resourceclaim.namespace"),
            prometheus: Some("claim_namespace"),
            doc: "the DRA claim's namespace, with `claim`",
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
        DcgmDraClaimName => Attribute {
            prometheus: Some("dra_claim_name"),
            doc: "dcgm-exporter (`KUBERNETES_ENABLE_DRA`): the DRA claim that allocated the device, on the series of each container holding it",
            ..LABEL
        },
        DcgmDraClaimNamespace => Attribute {
            prometheus: Some("dra_claim_namespace"),
            doc: "dcgm-exporter: the DRA claim's namespace",
            ..LABEL
        },
        DcgmDraDriverName => Attribute {
            prometheus: Some("dra_driver_name"),
            doc: "dcgm-exporter: the DRA driver (`gpu.nvidia.com`)",
            ..LABEL
        },
        DcgmDraPoolName => Attribute {
            prometheus: Some("dra_pool_name"),
            doc: "dcgm-exporter: the DRA driver's pool (NVIDIA's: the node's name)",
            ..LABEL
        },
        DcgmDraDeviceName => Attribute {
            prometheus: Some("dra_device_name"),
            doc: "dcgm-exporter: the DRA driver's name for the device (`gpu-0`, `gpu-0-mig-1g10gb-19-0`)",
            ..LABEL
        },
        DcgmDraMigProfile => Attribute {
            prometheus: Some("dra_mig_profile"),
            doc: "dcgm-exporter: a DRA-allocated MIG device's profile (`1g.10gb`)",
            ..LABEL
        },
        DcgmDraMigDeviceUuid => Attribute {
            prometheus: Some("dra_mig_device_uuid"),
            doc: "dcgm-exporter: a DRA-allocated MIG device's UUID (`MIG-...`), a dynamic MIG device's included",
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
/// A device the kubelet allocated to a container, and the DRA claim it came through.
pub const ALLOCATION: AttrSet = AttrSet {
    name: "allocation",
    otlp: container_resource!(Attr::HwId, Attr::ClaimName, Attr::ClaimNamespace),
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
        Attr::ClaimName,
        Attr::ClaimNamespace,
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
/// `dcgm-virtual-gpus`; the `dra_*` labels on the series of a device a DRA claim
/// allocated, one per container holding it; `err_code`, `err_msg` on
/// `DCGM_FI_DEV_XID_ERRORS`.
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
        Attr::DcgmDraClaimName,
        Attr::DcgmDraClaimNamespace,
        Attr::DcgmDraDriverName,
        Attr::DcgmDraPoolName,
        Attr::DcgmDraDeviceName,
        Attr::DcgmDraMigProfile,
        Attr::DcgmDraMigDeviceUuid,
        Attr::DcgmErrCode,
        Attr::DcgmErrMsg,
    ],
};
