//! deploy/prometheus's rules files as the tests read them: parsed, their rules listed,
//! promtool run on them, and a copy with one rule broken (to show a unit test catches it).
use std::{path::Path, process::Command};

use serde_yaml::Value;

use crate::{prom::which, random_hex};

pub use crate::root;

/// A YAML file of the repository, by its path from the root.
pub fn yaml(rel: &str) -> Value {
    let text = std::fs::read_to_string(root().join(rel)).unwrap();
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every rule of a rules file's groups.
pub fn rules(groups: &Value) -> Vec<&Value> {
    groups["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap())
        .collect()
}

/// promtool with `args`, in `dir`: (passed, what it printed).
pub fn promtool(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(which("promtool"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// promtool with `args` in `dir` succeeds and says SUCCESS; panics with what it printed.
pub fn assert_promtool(dir: &Path, args: &[&str]) {
    let (ok, text) = promtool(dir, args);
    assert!(ok && text.contains("SUCCESS"), "promtool {args:?}:\n{text}");
}

/// `promtool test rules` of deploy/prometheus's `tests` file (beside `rules`), with `from`
/// replaced by `to` once in the rules: (passed, what it printed).
pub fn test_broken(rules: &str, tests: &str, from: &str, to: &str) -> (bool, String) {
    let dir = std::env::temp_dir().join(format!("rules-{}", random_hex(8)));
    std::fs::create_dir_all(&dir).unwrap();
    let src = root().join("deploy/prometheus");
    let text = std::fs::read_to_string(src.join(rules)).unwrap();
    let broken = text.replacen(from, to, 1);
    assert_ne!(broken, text, "{rules}: {from:?} moved: update the test");
    std::fs::write(dir.join(rules), broken).unwrap();
    std::fs::copy(src.join(tests), dir.join(tests)).unwrap();
    let out = promtool(&dir, &["test", "rules", tests]);
    let _ = std::fs::remove_dir_all(&dir);
    out
}
