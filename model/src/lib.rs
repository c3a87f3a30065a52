//! The data the agent produces and every sink reads: GPU samples and the joined snapshot.
//! Plain values, no behaviour that reaches back into sources.
use std::{collections::BTreeMap, fmt, sync::Arc};

/// A name or id shared, not copied, between the process state, each cycle's snapshot and
/// the sinks: a clone is a reference count.
pub type Name = Arc<str>;

/// Equal names: by pointer first (the same shared name), by content otherwise. `Arc<str>`
/// compares the bytes even for one pointer (std's pointer shortcut needs a sized type).
pub fn same(a: &Name, b: &Name) -> bool {
    Arc::ptr_eq(a, b) || a == b
}

/// `same` for names that may be missing: both missing, or both there and the same.
pub fn same_opt(a: &Option<Name>, b: &Option<Name>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => same(a, b),
        (a, b) => a.is_none() && b.is_none(),
    }
}

use serde::{Deserialize, Serialize, Serializer};

/// Asks the CPU to start loading the memory at `p` (a hint: it never faults). A cycle on a
/// large node walks thousands of entries whose names and lists live apart on the heap, out
/// of the caches since the last cycle; asked a few entries ahead, they arrive while the
/// ones before are worked on, rather than one miss after another.
#[inline(always)]
pub fn prefetch<T: ?Sized>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it reads nothing the program sees and never faults,
    // whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// `prefetch` of a container entry's names and lists: what encoding or dropping it reads.
pub fn prefetch_container(c: &ContainerUsage) {
    let names = [&c.container_id, &c.pod_uid, &c.pod_name, &c.namespace];
    for n in names
        .into_iter()
        .chain([&c.container_name, &c.cgroup_path])
        .flatten()
    {
        prefetch(Arc::as_ptr(n));
    }
    prefetch(c.gpus.as_ptr());
    prefetch(c.accounts.as_ptr());
}

mod dra;
mod fields;
pub use dra::{ClaimDevice, DraDevice};
pub use fields::{
    ContainerXid, DeviceFields, GpmMetrics, NvmlFeatures, RemappedRows, XidCount, XidProcess,
};

/// One collection cycle over every device.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct GpuSample {
    /// Unix time of the sample, milliseconds.
    pub taken_at_ms: u64,
    pub driver_version: Option<String>,
    pub devices: Vec<DeviceSample>,
}

impl GpuSample {
    /// Every device's process PIDs, device by device (a process on two GPUs twice).
    pub fn pids(&self) -> impl Iterator<Item = u32> + Clone + '_ {
        self.devices
            .iter()
            .flat_map(|d| &d.processes)
            .map(|p| p.pid)
    }
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct DeviceSample {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub pci_bus_id: Option<String>,
    pub status: DeviceStatus,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    /// Percent of time a kernel ran over the last sample period.
    pub utilization_gpu: Option<u32>,
    pub utilization_memory: Option<u32>,
    pub power_mw: Option<u32>,
    pub energy_mj: Option<u64>,
    pub temperature_c: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub ecc_corrected: Option<u64>,
    pub ecc_uncorrected: Option<u64>,
    pub throttle_reasons: Option<u64>,
    /// Metrics this device does not support: marked once, then skipped.
    pub unsupported: Vec<&'static str>,
    pub mig_enabled: bool,
    pub mig_devices: Vec<MigSample>,
    pub processes: Vec<ProcessSample>,
    /// The further fields dcgm-exporter serves (health, profiling, XIDs), from NVML.
    #[serde(flatten)]
    pub fields: DeviceFields,
    /// Sharing and accounting (see [`DeviceSharing`]).
    #[serde(flatten)]
    pub sharing: DeviceSharing,
}

/// What a device says about sharing and per-process accounting, and what the join adds.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct DeviceSharing {
    /// The N in /dev/nvidiaN: how the NVIDIA DRA driver names a GPU (`gpu-N`).
    pub minor_number: Option<u32>,
    /// NVML per-process accounting mode; None where the device cannot say.
    pub accounting_mode: Option<bool>,
    /// PIDs that appeared in NVML's accounting list this cycle (processes that had a GPU
    /// context, running or ended, including ones too short for any sample).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub accounting_pids: Vec<u32>,
    /// Accounting stats read for processes the kernel reported exited.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub accounting: Vec<AccountingSample>,
    /// Set by the join: MPS server processes on the device, which are not charged to any
    /// container (their memory is the clients' shared context).
    pub mps_server_pids: Vec<u32>,
    /// Set by the join: cumulative energy of this GPU that no container was charged
    /// (idle, and nobody allocated the GPU), joules since the agent first sampled it.
    pub idle_energy_joules: Option<f64>,
}

/// NVML's accounting stats of one process (`nvmlDeviceGetAccountingStats`), over its life.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct AccountingSample {
    pub pid: u32,
    /// Percent of its life a kernel of it ran; None where the device cannot say.
    pub gpu_util: Option<u32>,
    pub mem_util: Option<u32>,
    pub max_memory_bytes: Option<u64>,
    /// How long its context was active, ms (0 while running).
    pub time_ms: u64,
    /// When it started, µs since the Unix epoch.
    pub start_time_us: u64,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct MigSample {
    /// Shared from one cycle to the next (the NVML thread keeps it by uuid), and by the
    /// processes on the device: a clone is a reference count, a comparison a pointer's.
    pub uuid: Name,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    /// The MIG profile, e.g. `1g.10gb` (from the MIG device's name).
    pub profile: Option<String>,
    /// Its GPU instance's profile id and placement (`nvmlGpuInstanceGetInfo`): what NVIDIA's
    /// DRA driver names a MIG device by. None where NVML does not say.
    pub gpu_instance: Option<GpuInstance>,
    /// Profiling (GPM) of this GPU instance; None where GPM cannot say.
    pub gpm: Option<GpmMetrics>,
}

/// A MIG device's GPU instance as NVML describes it (`nvmlGpuInstanceInfo_t`).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct GpuInstance {
    /// The GPU instance profile's id (`nvidia-smi mig -lgip`'s ID: 19 for an H100's
    /// 1g.10gb), not its `NVML_GPU_INSTANCE_PROFILE_*` index.
    pub profile_id: u32,
    /// Where it sits on the GPU, in memory slices: its first slice and how many.
    pub placement_start: u32,
    pub placement_size: u32,
}

/// A process NVML reports on a device, by host PID.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ProcessSample {
    pub pid: u32,
    pub used_memory_bytes: u64,
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
    /// The MIG device the process runs on, from its GPU/compute instance ids: its position
    /// in the device's `mig_devices`. A position, not the MIG device's name: a name per
    /// process would be a reference count bumped by the NVML thread and dropped by the
    /// join, 2,000 atomic operations a cycle on a large node, each on a line the other
    /// thread had just written.
    pub mig: Option<u8>,
    /// Utilization since the previous sample; None when the device cannot say (MIG,
    /// unsupported), Some(0) when it had no samples for the process.
    pub sm_util: Option<u32>,
    pub mem_util: Option<u32>,
    pub enc_util: Option<u32>,
    pub dec_util: Option<u32>,
    /// Listed by NVML's MPS list (`nvmlDeviceGetMPSComputeRunningProcesses`): an MPS
    /// client (or the server).
    pub mps: bool,
}

/// Published to every sink; never mutated after the join.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Snapshot {
    pub taken_at_ms: u64,
    /// NVML's health when the snapshot was taken: its one owner is the NVML sampler.
    pub nvml: SourceStatus,
    pub driver_version: Option<String>,
    /// Devices without their process lists (those are joined into `containers`).
    pub devices: Vec<DeviceSample>,
    /// One entry per container (or pod, or the host) using a GPU.
    pub containers: Vec<ContainerUsage>,
    /// Per-process detail, only when enabled (cardinality).
    pub processes: Vec<ProcessUsage>,
    /// XID errors the kernel log charged to containers' processes.
    pub container_xids: Vec<ContainerXid>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ContainerUsage {
    /// Full 64-hex id; null for the host entry and for pod-level cgroups.
    pub container_id: Option<Name>,
    pub pod_uid: Option<Name>,
    pub qos: Option<&'static str>,
    pub runtime: Option<&'static str>,
    pub cgroup_path: Option<Name>,
    /// Names, when the node's runtime or kubelet told us (null otherwise).
    pub pod_name: Option<Name>,
    pub namespace: Option<Name>,
    pub container_name: Option<Name>,
    pub gpus: Vec<ContainerGpu>,
    /// Devices the kubelet allocated to this container (GPU or MIG UUIDs), whether it uses
    /// them or not; empty when unknown or none. Shared names (the sample's own for its
    /// devices, the metadata's otherwise), in one shared list that the join keeps from one
    /// cycle to the next: a clone per container per cycle is one reference count.
    pub allocated_gpus: Arc<[Name]>,
    /// The same allocation as the device plugin named it (`GPU-<uuid>::3` for a
    /// time-slicing replica): dcgm-exporter's `vgpu` label.
    pub allocated_device_ids: Arc<[Name]>,
    /// Those of `allocated_gpus` that came through DRA claims, each with its claim; shared
    /// like `allocated_gpus`.
    pub claims: Arc<[ClaimDevice]>,
    /// Energy, peak memory, limits and accounting per device it used or was allocated.
    pub accounts: Vec<GpuAccount>,
    /// The pod's top-level owner, inferred from its labels and name; None outside
    /// Kubernetes and where the runtime gave no labels.
    pub workload: Option<Arc<Workload>>,
}

/// The kind of a pod's top-level owner: a Kubernetes kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum WorkloadKind {
    Deployment,
    /// A ReplicaSet with no Deployment to climb to.
    ReplicaSet,
    StatefulSet,
    DaemonSet,
    Job,
    CronJob,
    /// A pod no controller owns (or none the node can tell).
    Pod,
}

impl WorkloadKind {
    pub const ALL: [WorkloadKind; 7] = [
        WorkloadKind::Deployment,
        WorkloadKind::ReplicaSet,
        WorkloadKind::StatefulSet,
        WorkloadKind::DaemonSet,
        WorkloadKind::Job,
        WorkloadKind::CronJob,
        WorkloadKind::Pod,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "Deployment",
            WorkloadKind::ReplicaSet => "ReplicaSet",
            WorkloadKind::StatefulSet => "StatefulSet",
            WorkloadKind::DaemonSet => "DaemonSet",
            WorkloadKind::Job => "Job",
            WorkloadKind::CronJob => "CronJob",
            WorkloadKind::Pod => "Pod",
        }
    }

    pub fn parse(s: &str) -> Option<WorkloadKind> {
        WorkloadKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// A pod's top-level owner and the controller between, as the node can infer them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Workload {
    pub kind: WorkloadKind,
    pub name: Name,
    /// A Deployment's ReplicaSet.
    pub replicaset: Option<Name>,
    /// A CronJob's Job.
    pub job: Option<Name>,
}

/// Where a container's GPU memory limit comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LimitSource {
    /// HAMi's `CUDA_DEVICE_MEMORY_LIMIT[_N]` in the process environment (enforced by HAMi).
    Hami,
    /// The MIG device's size (enforced by the hardware).
    Mig,
    /// The container's share of a time-sliced GPU: its replicas over all replicas of the
    /// GPU, times the GPU's memory (a fair share; time-slicing enforces no memory limit).
    Timeslice,
}

impl LimitSource {
    pub const ALL: [LimitSource; 3] = [LimitSource::Hami, LimitSource::Mig, LimitSource::Timeslice];

    pub fn as_str(self) -> &'static str {
        match self {
            LimitSource::Hami => "hami",
            LimitSource::Mig => "mig",
            LimitSource::Timeslice => "timeslice",
        }
    }
}

/// What the agent accounts to one container on one device besides `ContainerGpu`: the
/// device the container used or was allocated (MIG device UUID under MIG).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct GpuAccount {
    pub uuid: Name,
    pub gpu_uuid: Name,
    /// Cumulative: the container's share of the GPU's energy (its SM-utilization share, or
    /// memory share where no utilization is known, plus the idle remainder of a GPU
    /// allocated to it), joules.
    pub energy_joules: f64,
    /// When the energy counter started, unix ms.
    pub energy_since_ms: u64,
    /// Peak memory held on the device over the peak window (the export interval).
    pub memory_peak_bytes: Option<u64>,
    pub memory_limit_bytes: Option<u64>,
    pub memory_limit_source: Option<LimitSource>,
    /// HAMi's `CUDA_DEVICE_SM_LIMIT`, percent.
    pub sm_limit_percent: Option<u32>,
    /// Cumulative: exited processes whose NVML accounting stats were charged.
    pub accounted_processes: u64,
    /// Cumulative: their run time x average GPU utilization, seconds.
    pub accounted_gpu_seconds: f64,
    /// While the container's stretch on the device is open (it has a process there or
    /// holds its allocation): the part of a GPU it holds (its allocation: 1, the replicas
    /// it holds over the GPU's, a MIG profile's compute slices over the GPU's; else the
    /// device's part). What rightsizing's GPU-hours count.
    pub gpus_held: Option<f64>,
    /// The stretch's last SM utilization as a part of a whole GPU (0-1): its usage
    /// profile's figure times the device's part; None where unknown.
    pub sm_share: Option<f64>,
}

/// One container's use of one device from its first process there to its last: what a
/// chargeback system bills from. Written as one JSON line and sent as one OTLP log record.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct UsageRecord {
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    pub pod_name: Option<String>,
    pub namespace: Option<String>,
    pub container_name: Option<String>,
    /// The node (k8s.node.name, else the host name), set by the sink.
    #[serde(default)]
    pub node: Option<String>,
    /// The device charged: the MIG device UUID under MIG, else the GPU UUID.
    pub uuid: String,
    pub gpu_uuid: String,
    /// First and last sample that saw the container on the device, unix ms.
    pub start_ms: u64,
    pub end_ms: u64,
    /// SM-utilization-weighted seconds, from the samples; None where the device never gave
    /// its processes' SM utilization (MIG devices): unknown, not 0.
    #[serde(default)]
    pub gpu_seconds: Option<f64>,
    pub memory_byte_seconds: f64,
    pub memory_peak_bytes: u64,
    pub energy_joules: f64,
    /// From NVML accounting at process exit (where accounting mode is on).
    #[serde(default)]
    pub accounted_processes: u64,
    #[serde(default)]
    pub accounted_gpu_seconds: f64,
    /// Why it ended: `exited` (its last process on the device ended, or its allocation of
    /// an unused device ended), `checkpoint` (cut at `usage.max_record_secs`; the next
    /// record starts where this one ends), `accounting` (a job seen only through NVML
    /// accounting), `agent_stopped` (still running when the agent stopped; the rest comes
    /// in a later record).
    pub reason: String,
    /// The pod's top-level owner (`WorkloadKind`'s names) and its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    /// A Deployment's ReplicaSet; a CronJob's Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicaset: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// SM utilization over the stretch's samples, percent of the device charged: median,
    /// 95th percentile and largest. None where the device never said (a MIG device
    /// without GPM).
    #[serde(default)]
    pub sm_p50: Option<u32>,
    #[serde(default)]
    pub sm_p95: Option<u32>,
    #[serde(default)]
    pub sm_max: Option<u32>,
    /// Where the SM figures come from: `process_utilization` (NVML's per-process
    /// utilization), `gpm` (GPM's SM activity of a device the container had to itself) or
    /// `mixed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_source: Option<String>,
    /// The 95th percentile of the memory held over the stretch's samples.
    #[serde(default)]
    pub memory_p95_bytes: u64,
    /// The GPU of the device charged: its model name and its memory (under MIG, the parent
    /// GPU's; the MIG device's own follows from `mig_profile`).
    #[serde(default)]
    pub device_model: Option<String>,
    #[serde(default)]
    pub device_memory_bytes: Option<u64>,
    /// The part of a GPU the kubelet (or DRA) gave the container on this device: 1 for a
    /// whole GPU, 1/N for one of N time-slicing replicas, a MIG profile's compute slices
    /// over the GPU's, each divided by N where one DRA claim's device is held by N
    /// containers; None where no allocation is known.
    #[serde(default)]
    pub gpus_allocated: Option<f64>,
    /// The MIG device's profile (`1g.10gb`), under MIG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    /// The DRA claim the device was allocated through, and its namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_namespace: Option<String>,
}

impl DeviceSample {
    /// The device's readings without its process list: what a snapshot keeps of it (the
    /// processes are in the containers). Every field is named, so a new one cannot be
    /// forgotten; cloning the whole device would copy thousands of processes a cycle.
    pub fn readings(&self) -> DeviceSample {
        DeviceSample {
            index: self.index,
            uuid: self.uuid.clone(),
            name: self.name.clone(),
            pci_bus_id: self.pci_bus_id.clone(),
            status: self.status.clone(),
            memory_total_bytes: self.memory_total_bytes,
            memory_used_bytes: self.memory_used_bytes,
            utilization_gpu: self.utilization_gpu,
            utilization_memory: self.utilization_memory,
            power_mw: self.power_mw,
            energy_mj: self.energy_mj,
            temperature_c: self.temperature_c,
            sm_clock_mhz: self.sm_clock_mhz,
            mem_clock_mhz: self.mem_clock_mhz,
            ecc_corrected: self.ecc_corrected,
            ecc_uncorrected: self.ecc_uncorrected,
            throttle_reasons: self.throttle_reasons,
            unsupported: self.unsupported.clone(),
            mig_enabled: self.mig_enabled,
            mig_devices: self.mig_devices.clone(),
            fields: self.fields.clone(),
            processes: vec![],
            sharing: self.sharing.clone(),
        }
    }
}

impl ContainerUsage {
    /// The claim through which the container holds device `uuid`, if it does.
    pub fn claim_of(&self, uuid: &str) -> Option<&ClaimDevice> {
        self.claims.iter().find(|c| *c.uuid == *uuid)
    }

    /// Allocated devices the container used neither memory nor SM time on this sample.
    pub fn idle_allocations(&self) -> Vec<&str> {
        self.allocated_gpus
            .iter()
            .filter(|u| {
                !self.gpus.iter().any(|g| {
                    (g.uuid == **u || g.gpu_uuid == **u)
                        && (g.memory_used_bytes > 0 || g.sm_util.unwrap_or(0) > 0)
                })
            })
            .map(|u| &**u)
            .collect()
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ContainerGpu {
    /// The device charged: the MIG device UUID under MIG, else the GPU UUID.
    pub uuid: Name,
    /// The physical GPU.
    pub gpu_uuid: Name,
    pub memory_used_bytes: u64,
    /// Summed over the container's processes, capped at 100 (percent of this device).
    pub sm_util: Option<u32>,
    pub mem_util: Option<u32>,
    pub enc_util: Option<u32>,
    pub dec_util: Option<u32>,
    pub pids: Vec<u32>,
    /// Cumulative: SM-utilization-weighted seconds on this device; None while the device
    /// never gave the SM utilization of the container's processes (MIG devices cannot):
    /// unknown, not 0.
    pub gpu_time_seconds: Option<f64>,
    /// Cumulative: memory held x seconds.
    pub memory_byte_seconds: f64,
    /// When the two cumulative counters started (first sight of this owner on this
    /// device), unix ms: the OTLP start time of those series.
    pub counters_since_ms: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProcessUsage {
    pub pid: u32,
    pub comm: Option<String>,
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    pub uuid: String,
    pub used_memory_bytes: u64,
    pub sm_util: Option<u32>,
    pub mem_util: Option<u32>,
    pub enc_util: Option<u32>,
    pub dec_util: Option<u32>,
    /// The process had exited when joined (kept as a tombstone).
    pub exited: bool,
}

/// The agent's own health: served as JSON at `/debug/stats`, read by `gpu-agent top` and
/// turned into self-metrics by every sink. Counters are cumulative since start.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct AgentStats {
    /// Unix ms when the agent started: start time of its cumulative series.
    pub started_ms: u64,
    pub mode: TrackingMode,
    /// Why the agent is in /proc mode.
    pub degraded_reason: Option<String>,
    pub events_received: u64,
    /// Notifications the kernel could not put in the ring buffer (its own count).
    pub events_lost: u64,
    pub resyncs: u64,
    pub procfs_fallback_lookups: u64,
    pub procfs_rescans: u64,
    pub cgroup_walks: u64,
    /// Cgroups nobody announced (lost notifications, truncated paths), looked up by id.
    pub cgroup_lookups: u64,
    pub kernel_map_full: u64,
    pub kernel_read_errors: u64,
    pub cached_processes: u64,
    pub tombstones: u64,
    /// Exited processes dropped by `cache.max_tombstones` before they expired.
    pub tombstones_evicted: u64,
    pub cgroups_known: u64,
    pub startup_walk_ms: u64,
    /// Where the start-up walk learnt the processes: "task_iterator" (the kernel filled its
    /// own map) or "procfs" (one read per process).
    pub startup_source: String,
    /// Which programs follow the processes in eBPF mode: "tp_btf" (BTF tracepoints, plain
    /// loads from the task) or "tracepoint" (the classic ones: no BTF, or they did not
    /// load); empty in /proc mode.
    pub process_programs: String,
    pub ebpf_load_ms: u64,
    pub nvml: SourceStatus,
    pub nvml_samples: u64,
    /// CPU time (thread clock) of the NVML sampling thread, NVML's own calls included.
    pub nvml_sample_cpu_ns: u64,
    /// CPU time of joining samples and publishing snapshots.
    pub join_cpu_ns: u64,
    /// CPU time of the pipeline task (join, kernel notifications, gc), and of the OTLP
    /// export task (encode, send).
    pub pipeline_cpu_ns: u64,
    pub export_cpu_ns: u64,
    pub gpu_processes: u64,
    /// GPU processes neither the cache nor /proc could place (charged to the host entry).
    pub gpu_processes_unresolved: u64,
    /// Devices of DRA claims (NVIDIA's driver) that the kubelet lists and that match no
    /// device NVML lists now (a name gpu-agent cannot read, or a MIG device not made yet).
    pub dra_devices_unmatched: u64,
    /// Where OTLP metrics are pushed.
    pub otlp: ExportTarget,
    /// The OTLP push's state: `disabled`, `starting`, `ok` (the last send went through),
    /// `unavailable: <error>` (retried with backoff).
    pub export_status: SourceStatus,
    /// Where usage records go as OTLP logs.
    pub otlp_logs: ExportTarget,
    /// Each metadata source's health: "cri", "pod_resources", "docker".
    pub metadata: BTreeMap<String, SourceStatus>,
    /// Containers the metadata sources can name now (removed containers are forgotten).
    pub metadata_names: u64,
    pub export_sent: u64,
    pub export_failures: u64,
    pub export_dropped_batches: u64,
    pub export_queued_bytes: u64,
    /// Per-program kernel statistics, when `ebpf.program_stats` is on.
    pub programs: Vec<ProgramStats>,
    /// NVML's optional features (profiling, XID events) and why one is unavailable.
    pub nvml_features: NvmlFeatures,
    /// Usage records emitted; copies given up for good (a queue over its bound while the
    /// file or the collector failed, refused, still queued at exit); waiting for the
    /// collector; appended to the file; waiting for the file.
    pub usage_records: u64,
    pub usage_records_dropped: u64,
    pub usage_records_queued: u64,
    pub usage_records_written: u64,
    pub usage_file_queued: u64,
    /// The usage-record file's state and the collector's for usage records: `disabled`,
    /// `ok`, `unavailable: <error>` (retried).
    pub usage_file: SourceStatus,
    pub usage_logs: SourceStatus,
    /// How many entries each structure kept per process, container, pod, device or
    /// request holds now, by name (docs/api.md): what grows with pods churned shows here.
    pub state_lengths: BTreeMap<String, u64>,
    /// Bytes the allocator has handed out and not had back (glibc's `mallinfo2`: in use in
    /// its heaps plus its own mappings); 0 where unknown. Unlike RSS, it does not move with
    /// pages the allocator keeps or returns.
    pub heap_bytes: u64,
}

/// One eBPF program's run count and run time, from the kernel.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ProgramStats {
    pub name: String,
    pub run_count: u64,
    pub run_time_ns: u64,
}

/// A source's health. Serialized as the strings the endpoints show: `starting` (it has not
/// reported yet), `ok` (its last call succeeded), `disabled`, `not found` (no socket or
/// library where it was looked for), `unavailable: <reason>`, `stalled: <what>` (a call
/// that has not returned: a wedged driver).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SourceStatus {
    #[default]
    Starting,
    Ok,
    /// Switched off by configuration.
    Disabled,
    /// Nothing to talk to where it was looked for (e.g. no socket).
    NotFound,
    Unavailable(String),
    /// A call that has not returned for long (a wedged driver): what, where, how long.
    Stalled(String),
}

impl SourceStatus {
    pub fn is_ok(&self) -> bool {
        matches!(self, SourceStatus::Ok)
    }

    /// Why it is unavailable, if it is.
    pub fn reason(&self) -> Option<&str> {
        match self {
            SourceStatus::Unavailable(r) => Some(r),
            _ => None,
        }
    }
}

impl fmt::Display for SourceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceStatus::Starting => f.write_str("starting"),
            SourceStatus::Ok => f.write_str("ok"),
            SourceStatus::Disabled => f.write_str("disabled"),
            SourceStatus::NotFound => f.write_str("not found"),
            SourceStatus::Unavailable(r) => write!(f, "unavailable: {r}"),
            SourceStatus::Stalled(r) => write!(f, "stalled: {r}"),
        }
    }
}

/// A GPU's state: serialized as `ok`, `lost` (fell off the bus: skipped until it answers
/// again), `error: <reason>` (no handle) or `stalled: <call> for <n> s` (a call on it has
/// not returned: its readings are not known, and none is repeated from before).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum DeviceStatus {
    #[default]
    Ok,
    Lost,
    Error(String),
    /// A call on it that has not returned for `secs` seconds.
    Stalled {
        call: String,
        secs: u64,
    },
}

impl DeviceStatus {
    pub fn is_ok(&self) -> bool {
        matches!(self, DeviceStatus::Ok)
    }
}

impl fmt::Display for DeviceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceStatus::Ok => f.write_str("ok"),
            DeviceStatus::Lost => f.write_str("lost"),
            DeviceStatus::Error(e) => write!(f, "error: {e}"),
            DeviceStatus::Stalled { call, secs } => write!(f, "stalled: {call} for {secs} s"),
        }
    }
}

/// How processes are tracked: serialized as `starting`, `ebpf` or `procfs`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TrackingMode {
    #[default]
    Starting,
    Ebpf,
    Procfs,
}

impl TrackingMode {
    pub fn as_str(self) -> &'static str {
        match self {
            TrackingMode::Starting => "starting",
            TrackingMode::Ebpf => "ebpf",
            TrackingMode::Procfs => "procfs",
        }
    }
}

impl fmt::Display for TrackingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where OTLP goes: serialized as `disabled` or the URL (without credentials).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ExportTarget {
    #[default]
    Disabled,
    Url(String),
}

impl fmt::Display for ExportTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExportTarget::Disabled => f.write_str("disabled"),
            ExportTarget::Url(u) => f.write_str(u),
        }
    }
}

/// The statuses travel as the strings the endpoints have always shown.
macro_rules! serialize_as_display {
    ($($t:ty),*) => {$(
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
    )*};
}
serialize_as_display!(SourceStatus, DeviceStatus, TrackingMode, ExportTarget);

/// The compute slices in a profile's name: `3g.40gb` 3, `1c.3g.40gb` (a compute instance
/// of one slice inside a 3-slice GPU instance) 1; 1 where the name says none.
pub fn mig_compute_slices(profile: &str) -> u32 {
    let mut parts = profile.split('.');
    let first = parts.next().unwrap_or("");
    let n = |s: &str, unit: char| s.strip_suffix(unit).and_then(|d| d.parse::<u32>().ok());
    n(first, 'c').or_else(|| n(first, 'g')).unwrap_or(1).max(1)
}

/// A GPU's compute slices under MIG: 4 on the A30, 7 on every other MIG-capable GPU
/// (NVIDIA's MIG user guide, "Supported GPUs").
pub fn mig_gpu_slices(model: &str) -> u32 {
    match model.contains("A30") {
        true => 4,
        false => 7,
    }
}

/// The part of a whole GPU that a MIG device of `profile` holds on a GPU of
/// `total_slices` compute slices: its slices over the GPU's. Stretches, usage records and
/// rightsizing all count a MIG device's share this way.
pub fn mig_part(profile: &str, total_slices: u32) -> f64 {
    f64::from(mig_compute_slices(profile).min(total_slices)) / f64::from(total_slices.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_has_seven_compute_slices_or_four_on_an_a30() {
        assert_eq!(mig_gpu_slices("NVIDIA A30"), 4);
        assert_eq!(mig_gpu_slices("NVIDIA H100 80GB HBM3"), 7);
        assert_eq!(mig_part("3g.40gb", 7), 3.0 / 7.0);
        assert_eq!(mig_part("2g.12gb", mig_gpu_slices("NVIDIA A30")), 0.5);
    }

    #[test]
    fn a_mig_profile_names_its_compute_slices() {
        assert_eq!(mig_compute_slices("1g.10gb"), 1);
        assert_eq!(mig_compute_slices("3g.40gb"), 3);
        assert_eq!(mig_compute_slices("1g.10gb+me"), 1);
        assert_eq!(mig_compute_slices("1c.3g.40gb"), 1);
        assert_eq!(mig_compute_slices("7g.141gb"), 7);
        assert_eq!(mig_compute_slices("odd"), 1);
    }

    #[test]
    fn readings_are_the_device_less_its_processes() {
        let d = DeviceSample {
            index: 3,
            uuid: "GPU-3".into(),
            name: "H100".into(),
            pci_bus_id: Some("0000:3b:00.0".into()),
            memory_total_bytes: Some(80),
            energy_mj: Some(7),
            unsupported: vec!["ecc"],
            mig_enabled: true,
            mig_devices: vec![MigSample {
                uuid: "MIG-1".into(),
                ..Default::default()
            }],
            processes: vec![ProcessSample {
                pid: 9,
                ..Default::default()
            }],
            sharing: DeviceSharing {
                minor_number: Some(3),
                accounting_pids: vec![9],
                ..Default::default()
            },
            ..Default::default()
        };
        let mut want = d.clone();
        want.processes.clear();
        assert_eq!(d.readings(), want);
    }

    fn json<T: Serialize>(v: &T) -> String {
        serde_json::to_string(v).unwrap()
    }

    #[test]
    fn statuses_serialize_to_the_strings_the_endpoints_show() {
        assert_eq!(json(&SourceStatus::Ok), "\"ok\"");
        assert_eq!(json(&SourceStatus::Starting), "\"starting\"");
        assert_eq!(json(&SourceStatus::Disabled), "\"disabled\"");
        assert_eq!(json(&SourceStatus::NotFound), "\"not found\"");
        assert_eq!(
            json(&SourceStatus::Unavailable("Driver Not Loaded".into())),
            "\"unavailable: Driver Not Loaded\""
        );
        assert_eq!(json(&DeviceStatus::Lost), "\"lost\"");
        assert_eq!(json(&DeviceStatus::Error("x".into())), "\"error: x\"");
        let stalled = DeviceStatus::Stalled {
            call: "power".into(),
            secs: 42,
        };
        assert_eq!(json(&stalled), "\"stalled: power for 42 s\"");
        assert_eq!(
            json(&SourceStatus::Stalled(
                "power on GPU 3 (GPU-3) for 42 s".into()
            )),
            "\"stalled: power on GPU 3 (GPU-3) for 42 s\""
        );
        assert_eq!(json(&TrackingMode::Procfs), "\"procfs\"");
        assert_eq!(json(&ExportTarget::Disabled), "\"disabled\"");
    }
}
