//! The fake NVML library's scenario file, written by a test and edited while the agent
//! runs (the library re-reads it when it changes; format: docs/fake-nvml.md).
use std::path::PathBuf;

use serde_json::Value;

use crate::random_hex;

/// A scenario file, removed on drop.
pub struct Scenario(PathBuf);

impl Scenario {
    pub fn new(v: &Value) -> Scenario {
        let s = Scenario(std::env::temp_dir().join(format!("fake-nvml-{}.json", random_hex(12))));
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
