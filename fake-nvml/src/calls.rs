//! Counts every exported NVML call, so a benchmark can check what a caller asks per cycle.
//!
//! With `FAKE_NVML_CALLS=path` set, the counts are written to `path` (temp file, then
//! rename) on every `nvmlDeviceGetCount[_v2]`: a sampler calls it once at the start of each
//! cycle, so two reads of the file are two cycle boundaries, and the difference of the
//! `nvmlDeviceGetCount*` counts is the number of cycles between them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

pub const ENV_CALLS: &str = "FAKE_NVML_CALLS";

/// Every counted call, all functions together.
static TOTAL: AtomicU64 = AtomicU64::new(0);

/// One exported function's count; registered on its first call so the file can name it.
pub struct Counter {
    n: AtomicU64,
    registered: AtomicBool,
}

static REGISTRY: Mutex<Vec<(&'static str, &'static Counter)>> = Mutex::new(Vec::new());

impl Counter {
    pub const fn new() -> Counter {
        Counter {
            n: AtomicU64::new(0),
            registered: AtomicBool::new(false),
        }
    }

    /// `path` is the type name of a fn item nested in the exported function
    /// (`nvidia_ml::fields::nvmlDeviceGetFieldValues::f`): its second-to-last segment.
    pub fn hit(&'static self, path: fn() -> &'static str) {
        TOTAL.fetch_add(1, Ordering::Relaxed);
        self.n.fetch_add(1, Ordering::Relaxed);
        if !self.registered.load(Ordering::Relaxed) && !self.registered.swap(true, Ordering::AcqRel)
        {
            let name = path().rsplit("::").nth(1).unwrap_or("?");
            REGISTRY
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((name, self));
        }
    }
}

/// The first statement of every exported function (a test checks that).
macro_rules! counted {
    () => {{
        fn f() {}
        static COUNTER: $crate::calls::Counter = $crate::calls::Counter::new();
        COUNTER.hit(|| std::any::type_name_of_val(&f));
    }};
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

/// `{"total": N, "calls": {"nvmlX": n, ...}}`.
pub fn snapshot() -> serde_json::Value {
    let calls: BTreeMap<&str, u64> = REGISTRY
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|(name, c)| (*name, c.n.load(Ordering::Relaxed)))
        .collect();
    serde_json::json!({"total": TOTAL.load(Ordering::Relaxed), "calls": calls})
}

/// Writes the counts when FAKE_NVML_CALLS asks for them; failures are ignored (a
/// benchmark aid must never fail an NVML call).
pub fn write() {
    let Some(path) = target() else {
        return;
    };
    let mut tmp = path.clone().into_os_string();
    tmp.push(format!(".{}.tmp", std::process::id()));
    if std::fs::write(&tmp, snapshot().to_string()).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
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
                if !first.starts_with("counted!();") {
                    let name = body.lines().nth(1).unwrap_or("?").trim().to_string();
                    missing.push(format!("{}: {name}", path.display()));
                }
            }
        }
        assert!(missing.is_empty(), "not counted: {missing:#?}");
    }

    #[test]
    fn counts_name_their_function() {
        fn nvmlProbe() {
            counted!();
        }
        nvmlProbe();
        nvmlProbe();
        let s = super::snapshot();
        assert_eq!(s["calls"]["nvmlProbe"], 2, "{s}");
        assert!(s["total"].as_u64().unwrap() >= 2);
    }
}
