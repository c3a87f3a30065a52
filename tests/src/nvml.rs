//! The fake NVML library's scenario file, written by a test and edited while the agent
//! runs (the library re-reads it when it changes; format: docs/fake-nvml.md).
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::Value;

use crate::random_hex;

/// A scenario file, removed on drop.
pub struct Scenario(PathBuf);

impl Scenario {
    pub fn new(v: &Value) -> Scenario {
        Scenario::at(
            std::env::temp_dir().join(format!("fake-nvml-{}.json", random_hex(12))),
            v,
        )
    }

    /// A scenario file at `path`.
    pub fn at(path: PathBuf, v: &Value) -> Scenario {
        let s = Scenario(path);
        s.write(v);
        s
    }

    /// Atomic replace, so the library never reads half a file.
    pub fn write(&self, v: &Value) {
        let tmp = self.0.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(v).unwrap()).unwrap();
        std::fs::rename(&tmp, &self.0).unwrap();
    }

    pub fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The fake library's call counts (`FAKE_NVML_CALLS`, fake-nvml/src/calls.rs). It rewrites
/// the file in place each cycle: a record read while it was being written does not parse,
/// or its `seq` and `end` differ, and is read again. None after 100 tries.
pub fn read_calls(path: &Path) -> Option<Value> {
    for _ in 0..100 {
        let v: Option<Value> = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok());
        if let Some(v) = v.filter(|v| v["seq"].is_u64() && v["seq"] == v["end"]) {
            return Some(v);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}
