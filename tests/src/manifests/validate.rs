//! Schema validation of the rendered objects with kubernetes-validate.
use std::process::Command;

use serde_yaml::Value;

use super::{run, s, tool, CRD_API_GROUP, DRA_K8S_VERSIONS, K8S_VERSIONS};
use crate::root;

/// Whether `o` needs DRA's `resource.k8s.io/v1` (Kubernetes 1.34): one of its objects, or a
/// pod (template) that claims devices through one.
pub fn uses_dra(o: &Value) -> bool {
    let pod = |spec: &Value| !spec["resourceClaims"].is_null();
    s(&o["apiVersion"]).starts_with("resource.k8s.io/")
        || pod(&o["spec"])
        || pod(&o["spec"]["template"]["spec"])
        || pod(&o["spec"]["jobTemplate"]["spec"]["template"]["spec"])
}

/// `kubernetes-validate --strict` on each file (relative to the workspace root) with the
/// objects it holds: against each of [`K8S_VERSIONS`], or of [`DRA_K8S_VERSIONS`] for a file
/// with an object that [`uses_dra`]. Every object but the CRDs' must pass.
pub fn kubernetes_validate_problems(files: &[(String, Vec<&Value>)]) -> Vec<String> {
    let how = "pip install kubernetes-validate==1.37.0 \
        (`cargo xtask test` installs it into a venv under target/)";
    let kv = tool("kubernetes-validate", how);
    let mut p = vec![];
    for (versions, dra) in [(&K8S_VERSIONS, false), (&DRA_K8S_VERSIONS, true)] {
        let group: Vec<&(String, Vec<&Value>)> = files
            .iter()
            .filter(|(_, objs)| objs.iter().any(|o| uses_dra(o)) == dra)
            .collect();
        if group.is_empty() {
            continue;
        }
        let names: Vec<&str> = group.iter().map(|(f, _)| f.as_str()).collect();
        let expected = group
            .iter()
            .flat_map(|(_, objs)| objs)
            .filter(|o| !s(&o["apiVersion"]).starts_with(CRD_API_GROUP))
            .count();
        for v in versions {
            p.extend(validate_on(&kv, v, &names, expected));
        }
    }
    p
}

fn validate_on(kv: &std::path::Path, v: &str, files: &[&str], expected: usize) -> Vec<String> {
    let (ok, text) = run(Command::new(kv)
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
    let mut p: Vec<String> = bad.map(|l| format!("Kubernetes {v}: {l}")).collect();
    flag!(
        p,
        !ok || passed != expected,
        "kubernetes-validate -k {v}: {passed} of {expected} objects passed"
    );
    p
}
