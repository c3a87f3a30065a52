//! dcgm-exporter compatibility (`--prometheus-compat dcgm`, `dcgm-virtual-gpus`): its field
//! names, units, types and labels, served from NVML, with the kubelet's GPU allocations as
//! its pod labels. docs/metrics.md says, per choice, how dcgm-exporter does it.
//!
//! - `dcgm` is dcgm-exporter's default mode: one series per GPU (per MIG device under MIG)
//!   and field; every series of a device the kubelet allocated carries that pod's `pod`,
//!   `namespace` and `container`. A shared device (time-slicing or MPS replicas `<uuid>::N`)
//!   names one pod, as dcgm-exporter's device -> pod map keeps one (see `default_pod`).
//! - `dcgm-virtual-gpus` is its `--kubernetes-virtual-gpus`: a device's series is copied
//!   once per allocated pod (and replica, labelled `vgpu`); FB_USED and GPU_UTIL keep the
//!   device series and give each pod its own processes' value, with `pod_uid`.
//! - In both, as dcgm-exporter's `KUBERNETES_ENABLE_DRA` does, a device a DRA claim
//!   allocated has its series copied once per container holding it, with that pod's labels
//!   and the claim's `dra_*`; a MIG device's on its own series (dcgm-exporter keys MIG
//!   claims by the parent GPU).
use std::fmt;

use gpu_model::{ContainerUsage, DeviceSample, DraDevice, MigSample, Snapshot};

use crate::catalogue::{Attr, Group, Kind, MetricId as M, MetricId, CATALOGUE, DCGM_UNSERVED};

/// Which of dcgm-exporter's layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// dcgm-exporter's default: one series per device, the allocated pod's labels on it.
    Default,
    /// `--kubernetes-virtual-gpus`: device series copied per allocated pod.
    VirtualGpus,
}

impl Mode {
    /// The `--prometheus-compat` value.
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "dcgm" => Some(Mode::Default),
            "dcgm-virtual-gpus" => Some(Mode::VirtualGpus),
            _ => None,
        }
    }
}

/// A field to serve, with the type and help its counters CSV line gave it.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub id: MetricId,
    pub kind: Kind,
    pub help: String,
}

/// What `--prometheus-compat` serves.
#[derive(Debug, Clone, PartialEq)]
pub struct DcgmCompat {
    pub mode: Mode,
    /// In the order the counters CSV lists them.
    pub fields: Vec<Field>,
    /// `DCGM_FI_DRIVER_VERSION, label, ...`: the driver version as a label on every series.
    pub driver_version_label: bool,
    /// The host label's name: `Hostname` as dcgm-exporter releases spell it, or `hostname`
    /// as its main branch does (`dcgm.host_label`).
    pub host_label: HostLabel,
}

/// The spelling of dcgm-exporter's host label.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HostLabel {
    /// `Hostname`, as released.
    #[default]
    Hostname,
    /// `hostname`, as dcgm-exporter's main branch renames it for its next release.
    Lowercase,
}

impl HostLabel {
    pub fn parse(s: &str) -> Option<HostLabel> {
        match s {
            "Hostname" => Some(HostLabel::Hostname),
            "hostname" => Some(HostLabel::Lowercase),
            _ => None,
        }
    }

    /// The attribute that carries it.
    pub fn attr(self) -> Attr {
        match self {
            HostLabel::Hostname => Attr::DcgmHostname,
            HostLabel::Lowercase => Attr::DcgmHostnameLower,
        }
    }
}

/// A counters CSV line gpu-agent cannot serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvError {
    /// 1-based line number in the file.
    pub line: usize,
    pub text: String,
    pub message: String,
}

impl fmt::Display for CsvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {} (`{}`): {}", self.line, self.text, self.message)
    }
}

/// The field named `name`, if gpu-agent serves it.
fn served(name: &str) -> Option<MetricId> {
    MetricId::ALL
        .iter()
        .copied()
        .find(|id| id.def().group == Group::Dcgm && id.def().prometheus == Some(name))
}

impl DcgmCompat {
    /// dcgm-exporter's default counters CSV (etc/default-counters.csv): every field in it
    /// that NVML can give, and the driver version label.
    pub fn defaults(mode: Mode) -> DcgmCompat {
        let fields = CATALOGUE
            .iter()
            .zip(MetricId::ALL)
            .filter(|(m, _)| m.dcgm.is_some_and(|d| d.default))
            .map(|(m, &id)| Field {
                id,
                kind: m.kind,
                help: m.help.to_string(),
            })
            .collect();
        DcgmCompat {
            mode,
            fields,
            driver_version_label: true,
            host_label: HostLabel::default(),
        }
    }

    /// The fields a dcgm-exporter counters CSV (`-f`, `--collectors`) chooses: `field,
    /// type, help` lines, `#` comments and blank lines skipped, fields quoted as in CSV.
    /// The type and help become the family's TYPE and HELP, as dcgm-exporter does.
    pub fn from_csv(mode: Mode, text: &str) -> Result<DcgmCompat, CsvError> {
        let mut out = DcgmCompat {
            mode,
            fields: vec![],
            driver_version_label: false,
            host_label: HostLabel::default(),
        };
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let err = |message: String| CsvError {
                line: i + 1,
                text: line.to_string(),
                message,
            };
            let rec = split_csv(line).map_err(|m| err(m.into()))?;
            let [name, ty, help] = rec.as_slice() else {
                return Err(err(format!(
                    "expected 3 fields (DCGM field, Prometheus type, help), got {}",
                    rec.len()
                )));
            };
            out.add(name, ty, help).map_err(err)?;
        }
        if out.fields.is_empty() {
            return Err(CsvError {
                line: 0,
                text: String::new(),
                message: "no fields: the file lists no DCGM field to serve".into(),
            });
        }
        Ok(out)
    }

    fn add(&mut self, name: &str, ty: &str, help: &str) -> Result<(), String> {
        if name == "DCGM_FI_DRIVER_VERSION" {
            if ty != "label" {
                return Err(format!("{name} is a label field: its type must be `label`"));
            }
            self.driver_version_label = true;
            return Ok(());
        }
        let Some(id) = served(name) else {
            if let Some((_, why)) = DCGM_UNSERVED.iter().find(|(n, _)| *n == name) {
                return Err(format!("gpu-agent does not serve {name}: {why}"));
            }
            return Err(format!(
                "unknown field {name}: not a DCGM field gpu-agent serves (docs/metrics.md lists them)"
            ));
        };
        let kind = match ty {
            "gauge" => Kind::Gauge,
            "counter" => Kind::Counter,
            "label" => {
                return Err(format!(
                    "{name} is a value, not a label: use gauge or counter"
                ))
            }
            "histogram" | "summary" => {
                return Err(format!(
                    "{name}: type {ty} is not served; use gauge or counter"
                ))
            }
            t => {
                return Err(format!(
                    "unknown Prometheus type `{t}` (gauge, counter or label)"
                ))
            }
        };
        if self.fields.iter().any(|f| f.id == id) {
            return Err(format!("{name} is listed twice"));
        }
        self.fields.push(Field {
            id,
            kind,
            help: help.to_string(),
        });
        Ok(())
    }
}

/// One CSV record: comma-separated, each field trimmed of spaces, `"..."` quoting with `""`
/// for a quote (Go's encoding/csv, which dcgm-exporter reads it with).
fn split_csv(line: &str) -> Result<Vec<String>, &'static str> {
    let mut out = vec![];
    let mut cur = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', false) if cur.trim().is_empty() => {
                cur.clear();
                quoted = true;
            }
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                cur.push('"');
            }
            ('"', true) => quoted = false,
            (',', false) => out.push(std::mem::take(&mut cur).trim().to_string()),
            (c, _) => cur.push(c),
        }
    }
    if quoted {
        return Err("a quoted field is not closed");
    }
    out.push(cur.trim().to_string());
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Rendering

/// A pod the kubelet allocated a device to, as dcgm-exporter labels it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Pod {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub uid: String,
    /// The time-slicing replica (`GPU-x::3` -> `3`), under `dcgm-virtual-gpus`.
    pub vgpu: Option<String>,
    /// The DRA claim's device it holds the device through.
    pub dra: Option<Dra>,
}

/// A DRA claim's device as dcgm-exporter labels the series of the device (`dra_*`, from
/// `internal/pkg/transformation/kubernetes.go`): the claim, the driver, its pool, the
/// driver's name for the device, and of a MIG device its profile and UUID (dcgm-exporter
/// reads those from the ResourceSlice; NVML gives them here).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Dra {
    pub claim_name: String,
    pub claim_namespace: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
    /// (profile, MIG UUID) of a MIG device.
    pub mig: Option<(String, String)>,
}

/// One GPU, or one MIG device of it (indexes into the snapshot): what its series come from.
pub(crate) struct Entity {
    pub device: usize,
    pub mig: Option<usize>,
    /// Its dcgm-exporter label block, through `DCGM_FI_DRIVER_VERSION`.
    pub labels: String,
    pub pods: Vec<Pod>,
}

impl Entity {
    /// The pods holding the device through DRA claims: dcgm-exporter copies each of the
    /// device's series once per such container, in either layout.
    pub(crate) fn dra_pods(&self) -> impl Iterator<Item = &Pod> {
        self.pods.iter().filter(|p| p.dra.is_some())
    }
}

/// The replica suffix of a device plugin's id: `::N` (NVIDIA's plugin) or `/vgpuN` (GKE).
fn replica(id: &str) -> Option<&str> {
    id.split_once("::")
        .map(|(_, r)| r)
        .or_else(|| id.split_once("/vgpu").map(|(_, r)| r))
}

/// The pods allocated `uuid` (MIG device `mig`, where it is one): one per container and
/// replica, in (namespace, pod, container, replica) order; a container that holds it
/// through a DRA claim, with the claim's labels.
pub(crate) fn pods_of(
    snap: &Snapshot,
    uuid: &str,
    mig: Option<&MigSample>,
    mode: Mode,
) -> Vec<Pod> {
    let mut pods = vec![];
    for c in &snap.containers {
        if !c.allocated_gpus.iter().any(|u| **u == *uuid) {
            continue;
        }
        let (Some(namespace), Some(pod), Some(container)) =
            (&c.namespace, &c.pod_name, &c.container_name)
        else {
            continue;
        };
        let base = Pod {
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            container: container.to_string(),
            uid: c.pod_uid.as_deref().unwrap_or_default().to_string(),
            vgpu: None,
            dra: c.claim_of(uuid).map(|d| dra_labels(&d.dra, mig)),
        };
        let replicas = matching_ids(c, uuid).filter_map(replica);
        let before = pods.len();
        if mode == Mode::VirtualGpus && base.dra.is_none() {
            pods.extend(replicas.map(|r| Pod {
                vgpu: Some(r.to_string()),
                ..base.clone()
            }));
        }
        if pods.len() == before {
            pods.push(base);
        }
    }
    pods.sort();
    pods.dedup();
    pods
}

fn dra_labels(d: &DraDevice, mig: Option<&MigSample>) -> Dra {
    Dra {
        claim_name: d.claim_name.clone(),
        claim_namespace: d.claim_namespace.clone(),
        driver: d.driver.clone(),
        pool: d.pool.clone(),
        device: d.device.clone(),
        mig: mig.map(|m| (m.profile.clone().unwrap_or_default(), m.uuid.to_string())),
    }
}

/// The device ids of `c`'s allocation that name `uuid` (with or without a replica).
fn matching_ids<'c>(c: &'c ContainerUsage, uuid: &'c str) -> impl Iterator<Item = &'c str> {
    c.allocated_device_ids
        .iter()
        .map(|id| &**id)
        .filter(move |id| id.split("::").next() == Some(uuid))
}

/// What NVIDIA documents each XID code as, for dcgm-exporter's `err_msg`: the codes an SRE
/// meets; others read "Unknown Error", as dcgm-exporter says past its table.
pub fn xid_message(code: u64) -> &'static str {
    match code {
        0 => "No Error",
        1..=4 | 6 | 11 | 32 => "Invalid or corrupted push buffer stream",
        7 => "Invalid or corrupted push buffer address",
        8 | 43 => "GPU stopped processing",
        9 => "Driver error programming GPU",
        12 => "Driver error handling GPU exception",
        13 => "Graphics Engine Exception",
        31 => "GPU memory page fault",
        38 => "Driver firmware error",
        44 => "Graphics Engine fault during context switch",
        45 => "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda",
        48 => "Double Bit ECC Error",
        61 => "Internal micro-controller breakpoint/warning",
        62 | 169 => "Internal micro-controller halt",
        63 => "ECC page retirement or row remapping recording event",
        64 => "ECC page retirement or row remapper recording failure",
        68 => "NVDEC0 Exception",
        69 => "Graphics Engine class error",
        74 => "NVLINK Error",
        79 => "GPU has fallen off the bus",
        92 => "High single-bit ECC error rate",
        94 => "Contained ECC error",
        95 => "Uncontained ECC error",
        109 => "Context Switch Timeout Error",
        119 => "GSP RPC Timeout",
        120 => "GSP Error",
        121 => "C2C Link Error",
        140 => "Unrecovered ECC Error",
        143 => "GPU Initialization Failure",
        154 => "GPU Recovery Action Changed",
        170 => "NVLINK: Interrupt seen in CC mode",
        171 => "Uncorrectable DRAM Error",
        172 => "Uncorrectable SRAM Error",
        _ => "Unknown Error",
    }
}

fn mib(b: u64) -> f64 {
    (b / (1 << 20)) as f64
}

/// A GPU's value of field `id`, in dcgm-exporter's unit (MiB whole, as DCGM reports them).
pub(crate) fn device_value(id: MetricId, d: &DeviceSample) -> Option<f64> {
    let f = &d.fields;
    let g = f.gpm.as_ref();
    let n = |v: Option<u32>| v.map(f64::from);
    let u = |v: Option<u64>| v.map(|v| v as f64);
    let rows = f.remapped_rows;
    Some(match id {
        M::DcgmSmClock => n(d.sm_clock_mhz)?,
        M::DcgmMemClock => n(d.mem_clock_mhz)?,
        M::DcgmMemoryTemp => n(f.memory_temperature_c)?,
        M::DcgmGpuTemp => n(d.temperature_c)?,
        M::DcgmPowerUsage => d.power_mw? as f64 / 1000.0,
        M::DcgmTotalEnergy => u(d.energy_mj)?,
        M::DcgmPcieReplay => u(f.pcie_replay)?,
        M::DcgmGpuUtil => n(d.utilization_gpu)?,
        M::DcgmMemCopyUtil => n(d.utilization_memory)?,
        M::DcgmEncUtil => n(f.encoder_util)?,
        M::DcgmDecUtil => n(f.decoder_util)?,
        M::DcgmXidErrors => u(f.last_xid)?,
        M::DcgmFbFree => free(
            d.memory_total_bytes,
            d.memory_used_bytes,
            f.memory_reserved_bytes,
        )?,
        M::DcgmFbUsed => mib(d.memory_used_bytes?),
        M::DcgmFbReserved => mib(f.memory_reserved_bytes?),
        M::DcgmNvlinkBandwidthTotal => u(f.nvlink_bandwidth_total)?,
        M::DcgmVgpuLicenseStatus => f.vgpu_licensed? as u8 as f64,
        M::DcgmUncorrectableRemappedRows => rows?.uncorrectable as f64,
        M::DcgmCorrectableRemappedRows => rows?.correctable as f64,
        M::DcgmRowRemapFailure => rows?.failure as u8 as f64,
        M::DcgmRowRemapPending => rows?.pending as u8 as f64,
        M::DcgmClockThrottleReasons => u(d.throttle_reasons)?,
        M::DcgmEccSbeVolTotal => u(d.ecc_corrected)?,
        M::DcgmEccDbeVolTotal => u(d.ecc_uncorrected)?,
        id => gpm_value(id, g?)?,
    })
}

/// A MIG device's value of field `id`: its memory and its GPU instance's profiling.
pub(crate) fn mig_value(id: MetricId, m: &MigSample) -> Option<f64> {
    match id {
        M::DcgmFbFree => free(m.memory_total_bytes, m.memory_used_bytes, None),
        M::DcgmFbUsed => m.memory_used_bytes.map(mib),
        id if id.def().dcgm.is_some_and(|d| d.mig) => gpm_value(id, m.gpm.as_ref()?),
        _ => None,
    }
}

fn free(total: Option<u64>, used: Option<u64>, reserved: Option<u64>) -> Option<f64> {
    let left = total?
        .saturating_sub(used?)
        .saturating_sub(reserved.unwrap_or(0));
    Some(mib(left))
}

/// DCGM's profiling fields from NVML GPM: ratios, and bandwidths in MiB/s as NVML gives
/// them (DCGM passes them on unchanged).
fn gpm_value(id: MetricId, g: &gpu_model::GpmMetrics) -> Option<f64> {
    match id {
        M::DcgmProfGrEngineActive => g.gr_engine_active,
        M::DcgmProfPipeTensorActive => g.tensor_active,
        M::DcgmProfDramActive => g.dram_active,
        M::DcgmProfPcieTxBytes => g.pcie_tx_mibps,
        M::DcgmProfPcieRxBytes => g.pcie_rx_mibps,
        M::DcgmProfSmActive => g.sm_active,
        M::DcgmProfSmOccupancy => g.sm_occupancy,
        M::DcgmProfPipeFp64Active => g.fp64_active,
        M::DcgmProfPipeFp32Active => g.fp32_active,
        M::DcgmProfPipeFp16Active => g.fp16_active,
        M::DcgmProfNvlinkTxBytes => g.nvlink_tx_mibps,
        M::DcgmProfNvlinkRxBytes => g.nvlink_rx_mibps,
        _ => None,
    }
}

/// Under `dcgm-virtual-gpus`, a pod's own value of a per-process field on `uuid`: its
/// containers' processes summed (memory in whole MiB), 0 for a pod that runs nothing there.
pub(crate) fn pod_value(id: MetricId, snap: &Snapshot, uuid: &str, pod_uid: &str) -> f64 {
    let gpus = snap
        .containers
        .iter()
        .filter(|c| !pod_uid.is_empty() && c.pod_uid.as_deref() == Some(pod_uid))
        .flat_map(|c| &c.gpus)
        .filter(|g| &*g.uuid == uuid);
    match id {
        M::DcgmFbUsed => mib(gpus.map(|g| g.memory_used_bytes).sum()),
        M::DcgmGpuUtil => gpus.map(|g| g.sm_util.unwrap_or(0) as f64).sum(),
        _ => 0.0,
    }
}

/// Whether a field gives pods their own value under `dcgm-virtual-gpus`.
pub(crate) fn per_pod(id: MetricId) -> bool {
    id.def().dcgm.is_some_and(|d| d.per_pod.is_some())
}

/// The labels of one series of `entity` beyond its block, sorted by name as dcgm-exporter
/// prints its attributes: the pod's (with `pod_uid` when `uid`, and its DRA claim's
/// `dra_*`), and `err_code` / `err_msg` on the XID field.
pub(crate) fn attributes<'a>(
    pod: Option<&'a Pod>,
    uid: bool,
    xid: Option<(&'a str, &'a str)>,
) -> Vec<(Attr, &'a str)> {
    let mut a = vec![];
    if let Some(p) = pod {
        a.push((Attr::ContainerName, p.container.as_str()));
        a.push((Attr::Namespace, p.namespace.as_str()));
        a.push((Attr::PodName, p.pod.as_str()));
        if uid {
            a.push((Attr::PodUid, p.uid.as_str()));
        }
        if let Some(v) = &p.vgpu {
            a.push((Attr::DcgmVgpu, v.as_str()));
        }
        if let Some(d) = &p.dra {
            a.extend([
                (Attr::DcgmDraClaimName, d.claim_name.as_str()),
                (Attr::DcgmDraClaimNamespace, d.claim_namespace.as_str()),
                (Attr::DcgmDraDriverName, d.driver.as_str()),
                (Attr::DcgmDraPoolName, d.pool.as_str()),
                (Attr::DcgmDraDeviceName, d.device.as_str()),
            ]);
            if let Some((profile, uuid)) = &d.mig {
                a.push((Attr::DcgmDraMigProfile, profile.as_str()));
                a.push((Attr::DcgmDraMigDeviceUuid, uuid.as_str()));
            }
        }
    }
    if let Some((code, msg)) = xid {
        a.push((Attr::DcgmErrCode, code));
        a.push((Attr::DcgmErrMsg, msg));
    }
    a.sort_by_key(|(k, _)| k.label());
    a
}

/// In dcgm-exporter's default mode a device names one pod: its device -> pod map keeps the
/// last container listed for a device, in an order the kubelet does not fix (a map's).
/// Here the first by (namespace, pod, container), so a shared device's labels hold still.
pub(crate) fn default_pod(pods: &[Pod]) -> Option<&Pod> {
    pods.first()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_set_is_dcgm_exporters_default_csv() {
        let d = DcgmCompat::defaults(Mode::Default);
        let names: Vec<&str> = d.fields.iter().map(|f| f.id.prometheus()).collect();
        assert_eq!(names.len(), 25, "{names:?}");
        for n in [
            "DCGM_FI_DEV_SM_CLOCK",
            "DCGM_FI_DEV_XID_ERRORS",
            "DCGM_FI_DEV_FB_RESERVED",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "DCGM_FI_PROF_PCIE_RX_BYTES",
        ] {
            assert!(names.contains(&n), "{n}");
        }
        assert!(!names.contains(&"DCGM_FI_PROF_SM_ACTIVE"));
        assert!(d.driver_version_label);
        assert_eq!(
            d.fields
                .iter()
                .find(|f| f.id == M::DcgmTotalEnergy)
                .unwrap()
                .kind,
            Kind::Counter
        );
    }

    #[test]
    fn a_counters_csv_chooses_fields_types_and_help() {
        let csv = "# Format\n# DCGM FIELD, Prometheus metric type, help message\n\n\
                   DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).\n\
                   DCGM_FI_PROF_SM_ACTIVE, gauge, \"Ratio, of cycles \"\"active\"\"\"\n\
                   DCGM_FI_DEV_GPU_UTIL ,     counter, made up\n\
                   DCGM_FI_DRIVER_VERSION,        label, Driver Version\n";
        let c = DcgmCompat::from_csv(Mode::VirtualGpus, csv).unwrap();
        assert_eq!(c.mode, Mode::VirtualGpus);
        assert!(c.driver_version_label);
        let got: Vec<(MetricId, Kind, &str)> = c
            .fields
            .iter()
            .map(|f| (f.id, f.kind, f.help.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (M::DcgmSmClock, Kind::Gauge, "SM clock frequency (in MHz)."),
                (
                    M::DcgmProfSmActive,
                    Kind::Gauge,
                    "Ratio, of cycles \"active\""
                ),
                (M::DcgmGpuUtil, Kind::Counter, "made up"),
            ]
        );
    }

    #[test]
    fn a_bad_line_is_named() {
        let bad = |csv: &str| DcgmCompat::from_csv(Mode::Default, csv).unwrap_err();
        let e = bad("DCGM_FI_DEV_SM_CLOCK, gauge, x\n\nDCGM_FI_DEV_NOPE, gauge, y\n");
        assert_eq!(e.line, 3);
        assert!(
            e.to_string().starts_with(
                "line 3 (`DCGM_FI_DEV_NOPE, gauge, y`): unknown field DCGM_FI_DEV_NOPE"
            ),
            "{e}"
        );
        let e = bad("# c\nDCGM_FI_DEV_POWER_VIOLATION, counter, x\n");
        assert_eq!(e.line, 2);
        assert!(
            e.message
                .contains("does not serve DCGM_FI_DEV_POWER_VIOLATION: not in"),
            "{e}"
        );
        let e = bad("DCGM_FI_DEV_SM_CLOCK, gauge\n");
        assert!(e.message.contains("expected 3 fields"), "{e}");
        let e = bad("DCGM_FI_DEV_SM_CLOCK, gage, x\n");
        assert!(e.message.contains("unknown Prometheus type `gage`"), "{e}");
        let e = bad("DCGM_FI_DEV_SM_CLOCK, label, x\n");
        assert!(e.message.contains("not a label"), "{e}");
        let e = bad("DCGM_FI_DRIVER_VERSION, gauge, x\n");
        assert!(e.message.contains("must be `label`"), "{e}");
        let e = bad("DCGM_FI_DEV_SM_CLOCK, gauge, \"x\n");
        assert!(e.message.contains("not closed"), "{e}");
        let e = bad("DCGM_FI_DEV_SM_CLOCK, gauge, x\nDCGM_FI_DEV_SM_CLOCK, gauge, y\n");
        assert_eq!((e.line, e.message.contains("twice")), (2, true), "{e}");
        let e = bad("# only comments\n");
        assert!(e.message.contains("no fields"), "{e}");
    }

    #[test]
    fn unserved_fields_are_not_served_ones() {
        for (n, why) in DCGM_UNSERVED {
            assert!(served(n).is_none(), "{n} is served");
            assert!(!why.is_empty());
        }
    }

    #[test]
    fn replicas_and_xid_messages() {
        assert_eq!(replica("GPU-a::3"), Some("3"));
        assert_eq!(replica("nvidia0/vgpu2"), Some("2"));
        assert_eq!(replica("GPU-a"), None);
        assert_eq!(xid_message(79), "GPU has fallen off the bus");
        assert_eq!(xid_message(0), "No Error");
        assert_eq!(xid_message(100_000), "Unknown Error");
    }
}
