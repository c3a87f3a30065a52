//! `cargo xtask helm-package`: the chart, deploy/helm/gpu-agent, linted (--strict) and
//! packaged as target/helm/gpu-agent-<version>.tgz, its version and appVersion the
//! workspace's (Cargo.toml). Helm itself is helm-python-sdk's library in the test tools'
//! virtualenv (no helm binary); tests/tests/helm.rs tests the chart.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::{tools::Tools, workspace_root};

pub const CHART: &str = "deploy/helm/gpu-agent";

/// Lints the chart, then packages it into `dest`: `sys.argv` is the chart, `dest` and the
/// version. Prints the archive's path.
const SCRIPT: &str = r#"
import sys
from helm_python import chart as H
chart, dest, version = sys.argv[1:4]
report = H.lint(chart, {}, strict=True)
problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
if problems:
    sys.exit("helm lint --strict %s: %s" % (chart, problems))
print(H.package(chart, destination=dest, version=version, app_version=version))
"#;

/// Renders the chart with its default values (release `gpu-agent` in namespace
/// `gpu-agent`), every template's YAML one after another.
const RENDER: &str = r#"
import sys
from helm_python import chart as H
out = H.Chart.load(sys.argv[1]).render({}, name="gpu-agent", namespace="gpu-agent", is_install=True)
print("\n---\n".join(y for p, y in sorted(out.items()) if p.endswith(".yaml")))
"#;

/// The chart's objects with its default values, as YAML.
pub fn render_default() -> Result<String> {
    let python = Tools::ensure().python();
    let out = Command::new(&python)
        .arg("-c")
        .arg(RENDER)
        .arg(workspace_root().join(CHART))
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    if !out.status.success() {
        bail!(
            "rendering {CHART}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn run() -> Result<()> {
    let tools = Tools::ensure();
    let out = package(&tools.python(), &workspace_root().join("target/helm"))?;
    println!("{}", out.display());
    Ok(())
}

/// target/helm/gpu-agent-<version>.tgz, or the same name in `dest`.
pub fn package(python: &Path, dest: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
    let version = env!("CARGO_PKG_VERSION");
    let out = Command::new(python)
        .arg("-c")
        .arg(SCRIPT)
        .arg(workspace_root().join(CHART))
        .arg(dest)
        .arg(version)
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("No module named 'helm_python'") {
        bail!(
            "{} has no helm_python: {} -m pip install helm-python-sdk==0.2.2 \
             (`cargo xtask test-tools` installs it)",
            python.display(),
            python.display()
        );
    }
    if !out.status.success() {
        bail!("packaging {CHART}: {err}");
    }
    let want = dest.join(format!("gpu-agent-{version}.tgz"));
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if Path::new(&said) != want || !want.is_file() {
        bail!(
            "packaging {CHART}: Helm wrote {said:?}, not {}",
            want.display()
        );
    }
    Ok(want)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::on_path;

    /// `tar ARGS ARCHIVE [MEMBER]`'s output.
    fn tar(args: &str, archive: &Path, member: Option<&str>) -> String {
        let out = Command::new("tar")
            .arg(args)
            .arg(archive)
            .args(member)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tar {args} {}: {out:?}",
            archive.display()
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `cargo xtask test` puts the venv's python3, with helm_python, first on PATH.
    #[test]
    fn packages_the_chart_under_the_workspace_version() {
        let python = on_path("python3").expect("python3 on PATH");
        let dest = std::env::temp_dir().join(format!("helm-package-{}", std::process::id()));
        let archive = package(&python, &dest).unwrap_or_else(|e| panic!("{e:#}"));
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(
            archive.file_name().unwrap().to_string_lossy(),
            format!("gpu-agent-{version}.tgz")
        );
        let listing = tar("-tzf", &archive, None);
        for file in [
            "Chart.yaml",
            "README.md",
            "values.yaml",
            "values.schema.json",
            "templates/daemonset.yaml",
            "templates/NOTES.txt",
            "files/prometheus/gpu-agent-alerts.yaml",
            "files/grafana/gpu-agent.json",
        ] {
            let path = format!("gpu-agent/{file}");
            assert!(
                listing.lines().any(|l| l == path),
                "{path} not in:\n{listing}"
            );
        }
        let meta = tar("-xzOf", &archive, Some("gpu-agent/Chart.yaml"));
        let meta: serde_yaml::Value = serde_yaml::from_str(&meta).unwrap();
        assert_eq!(meta["version"].as_str(), Some(version), "{meta:?}");
        assert_eq!(meta["appVersion"].as_str(), Some(version), "{meta:?}");
        let _ = std::fs::remove_dir_all(&dest);
    }
}
