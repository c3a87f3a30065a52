//! Schema validation of the rendered objects with kubernetes-validate.
use std::process::Command;

use serde_yaml::Value;

use super::{run, s, tool, CRD_API_GROUP, K8S_VERSIONS};
use crate::root;

/// `kubernetes-validate --strict` against each of [`K8S_VERSIONS`] on `files` (relative to the
/// workspace root), which hold `objs`: every object but the CRDs' must pass.
pub fn kubernetes_validate_problems<'a>(
    files: &[String],
    objs: impl Iterator<Item = &'a Value>,
) -> Vec<String> {
    let how = "pip install kubernetes-validate==1.37.0 \
        (`cargo xtask test` installs it into a venv under target/)";
    let kv = tool("kubernetes-validate", how);
    let expected = objs
        .filter(|o| !s(&o["apiVersion"]).starts_with(CRD_API_GROUP))
        .count();
    let mut p = vec![];
    for v in K8S_VERSIONS {
        let (ok, text) = run(Command::new(&kv)
            .args(["--strict", "-k", v])
            .args(files)
            .current_dir(root()));
        let passed = text
            .lines()
            .filter(|l| l.starts_with("INFO") && l.contains(" passed for resource "))
            .count();
        // Its way of skipping a CRD is a warning that it has no schema for the kind; any other
        // warning (an apiVersion typo reads the same) is a failure.
        let crd = format!("with api version {CRD_API_GROUP}");
        let bad = text
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with("INFO") && !l.contains(&crd));
        p.extend(bad.map(|l| format!("Kubernetes {v}: {l}")));
        flag!(
            p,
            !ok || passed != expected,
            "kubernetes-validate -k {v}: {passed} of {expected} objects passed"
        );
    }
    p
}
