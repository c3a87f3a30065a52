//! Counts every exported NVML call, so a benchmark can check what a caller asks per cycle.
//!
//! With `FAKE_NVML_CALLS=path` set, the counts are written to `path` on every
//! `nvmlDeviceGetCount[_v2]`: a sampler calls it once at the start of each cycle, so two
//! reads of the file are two cycle boundaries, and the difference of the
//! `nvmlDeviceGetCount*` counts is the number of cycles between them.
//!
//! The write runs on the caller's thread and so counts in a benchmark's figures for the
//! agent: it is one `pwrite` over the previous record (a temp file, JSON value and rename
//! cost 0.7 ms a cycle on the 50,000-process node). The record opens and closes with the
//! same sequence number (`"seq"`, `"end"`); a reader that finds them unequal read it
//! half-written and reads again.
//!
//! It also lists the exported functions by whether they work on one device (`scope`),
//! which the scenario's `hang` entries name.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

pub const ENV_CALLS: &str = "FAKE_NVML_CALLS";

/// Every counted call, all functions together.
static TOTAL: AtomicU64 = AtomicU64::new(0);

/// One exported function's count; registered on its first call so the file can name it.
pub struct Counter {
    n: AtomicU64,
    /// The function's name, set (and the counter registered) on its first call.
    name: OnceLock<&'static str>,
    /// What a real driver takes for the call, µs (`cost`), once registered.
    cost_us: AtomicU64,
}

static REGISTRY: Mutex<Vec<(&'static str, &'static Counter)>> = Mutex::new(Vec::new());

impl Counter {
    pub const fn new() -> Counter {
        Counter {
            n: AtomicU64::new(0),
            name: OnceLock::new(),
            cost_us: AtomicU64::new(0),
        }
    }

    /// Counts a call and answers the function's name. `path` is the type name of a fn
    /// item nested in the exported function
    /// (`nvidia_ml::fields::nvmlDeviceGetFieldValues::f`): its second-to-last segment.
    /// A `size_query` is charged as a cheap call (`cost::SIZE_QUERY_US`).
    pub fn hit(&'static self, path: fn() -> &'static str, size_query: bool) -> &'static str {
        TOTAL.fetch_add(1, Ordering::Relaxed);
        self.n.fetch_add(1, Ordering::Relaxed);
        let name = *self.name.get_or_init(|| {
            let name = path().rsplit("::").nth(1).unwrap_or("?");
            self.cost_us
                .store(crate::cost::per_call_us(name), Ordering::Relaxed);
            REGISTRY
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((name, self));
            name
        });
        if crate::cost::on() {
            crate::cost::spend(match size_query {
                true => crate::cost::SIZE_QUERY_US,
                false => self.cost_us.load(Ordering::Relaxed),
            });
        }
        name
    }
}

/// The exported functions that take no device handle (a `hang` entry's `device` does not
/// apply to them).
pub const NO_DEVICE: [&str; 17] = [
    "nvmlInit_v2",
    "nvmlInit",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetCount_v2",
    "nvmlEventSetCreate",
    "nvmlEventSetFree",
    "nvmlEventSetWait_v2",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
    "nvmlGpmMetricsGet",
];

/// The exported functions on one device: a handle, or (the handle look-ups) an index,
/// UUID or bus id that names one. A `hang` entry's `"*"` blocks all of them.
const PER_DEVICE: [&str; 52] = [
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetHandleByPciBusId_v2",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetAccountingMode",
    "nvmlDeviceGetAccountingPids",
    "nvmlDeviceGetAccountingStats",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetGpuInstanceById",
    "nvmlGpuInstanceGetInfo",
    "nvmlDeviceGetGpuInstanceProfileInfo",
    "nvmlDeviceGetGpuInstanceProfileInfoV",
    "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetGridLicensableFeatures_v4",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmQueryIfStreamingEnabled",
    "nvmlGpmSampleGet",
    "nvmlGpmMigSampleGet",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceRegisterEvents",
];

/// Whether an exported function works on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Device,
    NoDevice,
}

/// The scope of the exported function `name`; None if no such function is exported.
pub fn scope(name: &str) -> Option<Scope> {
    if NO_DEVICE.contains(&name) {
        Some(Scope::NoDevice)
    } else if PER_DEVICE.contains(&name) {
        Some(Scope::Device)
    } else {
        None
    }
}

fn target() -> Option<&'static PathBuf> {
    static PATH: OnceLock<Option<PathBuf>> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::var_os(ENV_CALLS)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    })
    .as_ref()
}

/// `{"seq": N, "total": T, "calls": {"nvmlX": n, ...}, "end": N}` into `out`.
fn record(seq: u64, out: &mut String) {
    use std::fmt::Write;
    out.clear();
    let total = TOTAL.load(Ordering::Relaxed);
    let _ = write!(out, "{{\"seq\":{seq},\"total\":{total},\"calls\":{{");
    let registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
    for (i, (name, c)) in registry.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(out, "{sep}\"{name}\":{}", c.n.load(Ordering::Relaxed));
    }
    let _ = write!(out, "}},\"end\":{seq}}}");
}

/// The open counts file, the record buffer, the sequence number and the longest record
/// written (a shorter one is padded with spaces so that no old tail stays behind).
struct Sink {
    file: std::fs::File,
    buf: String,
    seq: u64,
    longest: usize,
}

/// Writes the counts when FAKE_NVML_CALLS asks for them; failures are ignored (a
/// benchmark aid must never fail an NVML call).
pub fn write() {
    use std::os::unix::fs::FileExt;
    static SINK: Mutex<Option<Sink>> = Mutex::new(None);
    let Some(path) = target() else {
        return;
    };
    let mut sink = SINK.lock().unwrap_or_else(PoisonError::into_inner);
    if sink.is_none() {
        let Ok(file) = std::fs::File::create(path) else {
            return;
        };
        *sink = Some(Sink {
            file,
            buf: String::with_capacity(4096),
            seq: 0,
            longest: 0,
        });
    }
    let s = sink.as_mut().expect("opened above");
    s.seq += 1;
    record(s.seq, &mut s.buf);
    let n = s.buf.len();
    s.buf
        .extend(std::iter::repeat_n(' ', s.longest.saturating_sub(n)));
    s.longest = s.longest.max(n);
    let _ = s.file.write_all_at(s.buf.as_bytes(), 0);
}

#[cfg(test)]
mod tests {
    /// Every exported function counts its calls.
    #[test]
    fn every_export_is_counted() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        let mut missing = vec![];
        for e in std::fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            for (i, _) in text.match_indices(concat!("#[no_", "mangle]")) {
                let body = &text[i..];
                let open = body.find('{').unwrap();
                let first = body[open + 1..].trim_start();
                if !first.starts_with("counted!(") {
                    let name = body.lines().nth(1).unwrap_or("?").trim().to_string();
                    missing.push(format!("{}: {name}", path.display()));
                }
            }
        }
        assert!(missing.is_empty(), "not counted: {missing:#?}");
    }

    /// The two lists name every exported function, each once.
    #[test]
    fn lists_cover_the_exports() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        let mut exported = std::collections::BTreeSet::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
            for (i, _) in text.match_indices(concat!("#[no_", "mangle]")) {
                let line = text[i..].lines().nth(1).unwrap();
                let name = line.split("fn ").nth(1).unwrap().split('(').next().unwrap();
                exported.insert(name.to_string());
            }
        }
        let listed: Vec<&str> = super::NO_DEVICE
            .iter()
            .chain(&super::PER_DEVICE)
            .copied()
            .collect();
        let set: std::collections::BTreeSet<String> =
            listed.iter().map(|s| s.to_string()).collect();
        assert_eq!(set.len(), listed.len(), "a name is listed twice");
        assert_eq!(set, exported);
    }

    #[test]
    fn counts_name_their_function() {
        fn nvmlProbe() {
            counted!();
        }
        nvmlProbe();
        nvmlProbe();
        let mut text = String::new();
        super::record(7, &mut text);
        let r: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(r["calls"]["nvmlProbe"], 2, "{text}");
        assert!(r["total"].as_u64().unwrap() >= 2);
        assert_eq!((r["seq"].as_u64(), r["end"].as_u64()), (Some(7), Some(7)));
    }
}
