//! `cargo xtask <command>`: the project's chores.
mod bench;
mod benchkit;
mod bignode;
mod chart_doc;
mod classic;
mod config_doc;
mod demo;
mod e2e;
mod ebpf;
mod floor;
mod generated;
mod gpu_cost;
mod helm;
mod image;
mod kernels;
mod metrics_doc;
mod overhead;
mod report;
mod rightsize_bench;
mod soak;
mod test;
mod tools;

use std::{os::unix::process::CommandExt, path::PathBuf, process::Command};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "gpu-agent build chores")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build the eBPF object into target/bpfel-unknown-none/release/agent-ebpf, installing
    /// rust-src and bpf-linker first when missing.
    BuildEbpf,
    /// build-ebpf, then `cargo build --release -p agent` (the object embedded).
    Build,
    /// As root: a GPU node made of real parts on this machine (processes in pod cgroups,
    /// CRI and pod-resources servers, the fake NVML library on eight GPUs, moving every few
    /// seconds), and `gpu-agent top` on it; everything is removed on quitting.
    Demo(demo::Args),
    /// build, then `target/release/gpu-agent run ARGS`: directly as root, else through sudo
    /// (keeping RUST_LOG, OTEL_*, FAKE_NVML_SCENARIO and NODE_NAME).
    Run {
        /// Arguments for `gpu-agent run` (after `--`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Install the test tools (apt-get as root; a virtualenv under target/), build-ebpf,
    /// build the agent and fake-nvml, then run every test of the workspace; as root the
    /// root-only tests too, otherwise it says how many were left out.
    Test {
        /// Extra arguments for `cargo test` (after `--`: for the test binaries).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Only the first step of `test`: install what the tests need, then print the shell
    /// lines that give a direct `cargo test` the same tools (`eval "$(cargo xtask test-tools)"`).
    TestTools,
    /// Benchmarks (see docs/benchmarks.md). Without a subcommand: gpu-agent against the
    /// /proc-based approaches on one synthetic node, side by side.
    Bench {
        #[command(subcommand)]
        which: Option<bench::Which>,
        /// The reduced set (N = 5000 and the 50,000-process node; under 8 minutes on 2
        /// cores), ending with one RESULT line.
        #[arg(long)]
        quick: bool,
        /// Print only; do not rewrite docs/benchmarks.md.
        #[arg(long)]
        no_write: bool,
    },
    /// Render and check deploy/: builds the agent (for `check-config`), then runs exactly
    /// `cargo test -p tests --test deploy --test helm` (docs/deploy.md, "What CI checks").
    CheckDeploy,
    /// As root: install Debian's 5.10, 6.1 and 6.12 kernels, qemu and virtme-ng if missing,
    /// boot each under qemu and run the process-cache tests and an end-to-end agent check
    /// in it, and the same on the host kernel (docs/compatibility.md).
    KernelMatrix(kernels::Args),
    /// Build the agent's image with a dockerd of its own (root): `cargo xtask build`, a
    /// Debian bookworm base from debootstrap (cached) unless --base, deploy/Dockerfile's
    /// `prebuilt` stage; saved to target/image/<name>-<tag>.tar.
    Image {
        /// The image's name and tag.
        #[arg(long, default_value_t = image::default_tag())]
        tag: String,
        /// Rebuild the cached debootstrap base (target/image/debian-bookworm-minbase-setcap.tar).
        #[arg(long)]
        refresh_base: bool,
        /// A base image to build on instead (pulled: pin it by digest).
        #[arg(long)]
        base: Option<String>,
    },
    /// The image run for real (root): under dockerd with the rendered DaemonSet's
    /// securityContext and mounts, attributing docker, containerd (CRI) and podman
    /// containers on /metrics and OTLP; ends with `RESULT e2e-container passed=N failed=M`.
    E2eContainer {
        /// Put the release agent in the image (what `cargo xtask image` ships) instead of
        /// the debug one `cargo xtask test` built: a release build of everything first.
        #[arg(long)]
        release: bool,
        /// Take the agent's container from the Helm chart's default render
        /// (deploy/helm/gpu-agent) instead of the kustomize base.
        #[arg(long)]
        from_helm: bool,
    },
    /// Regenerate the tables of docs/metrics.md from the metric catalogue
    /// (otel/src/catalogue.rs).
    MetricsDoc {
        /// Write nothing; fail, naming each stale table, when the file is out of date.
        #[arg(long)]
        check: bool,
    },
    /// Regenerate docs/configuration.md's tables of keys and variables and its default file,
    /// and the `config` part of the Helm chart's values.schema.json, from the agent's
    /// configuration reference (agent/src/config/reference.rs).
    ConfigDoc {
        /// Write nothing; fail, naming each stale block, when the file is out of date.
        #[arg(long)]
        check: bool,
    },
    /// Regenerate the values table of the Helm chart's README (deploy/helm/gpu-agent/README.md,
    /// what `helm show readme` prints) from its values.schema.json and values.yaml.
    ChartDoc {
        /// Write nothing; fail when the table is out of date.
        #[arg(long)]
        check: bool,
    },
    /// Lint the Helm chart (deploy/helm/gpu-agent) and package it as
    /// target/helm/gpu-agent-<version>.tgz, with the workspace's version; Helm is the test
    /// tools' helm-python-sdk (installed first when missing).
    HelmPackage,
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::BuildEbpf => ebpf::build().map(|_| ()),
        Cmd::Build => {
            ebpf::build()?;
            cargo(&["build", "--release", "-p", "agent"])
        }
        Cmd::Demo(args) => {
            let code = demo::run(args)?;
            std::process::exit(code)
        }
        Cmd::Run { args } => run_agent(&args),
        Cmd::Test { args } => test::run(&with_leading_double_dash(
            &std::env::args().collect::<Vec<_>>(),
            args,
        )),
        Cmd::TestTools => {
            tools::Tools::ensure().print_exports();
            Ok(())
        }
        Cmd::Bench {
            which: Some(which), ..
        } => bench::run(which),
        Cmd::Bench {
            which: None,
            quick,
            no_write,
        } => overhead::run(quick, no_write),
        Cmd::CheckDeploy => {
            // Its tools (kubernetes-validate, kubectl, node, the venv's python3 with
            // helm_python) are found on PATH. The agent
            // binary without the eBPF object will do: check-config needs none.
            tools::Tools::ensure().apply_to_self();
            cargo(&["build", "-p", "agent"])?;
            cargo(&["test", "-p", "tests", "--test", "deploy", "--test", "helm"])
        }
        Cmd::KernelMatrix(args) => kernels::run(args),
        Cmd::Image {
            tag,
            refresh_base,
            base,
        } => image::run(&image::Options {
            tag,
            refresh_base,
            base,
        }),
        Cmd::E2eContainer { release, from_helm } => e2e::run(release, from_helm),
        Cmd::MetricsDoc { check } => metrics_doc::run(check),
        Cmd::ConfigDoc { check } => config_doc::run(check),
        Cmd::ChartDoc { check } => chart_doc::run(check),
        Cmd::HelmPackage => helm::run(),
    }
}

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// clap drops a `--` that comes first (`cargo xtask test -- --nocapture`); it means, as for
/// `cargo test`, that what follows is for the test binaries: put it back.
fn with_leading_double_dash(argv: &[String], mut args: Vec<String>) -> Vec<String> {
    if argv.get(2).is_some_and(|a| a == "--") {
        args.insert(0, "--".into());
    }
    args
}

/// The agent reads these; sudo would drop them.
const AGENT_ENV: &[&str] = &["RUST_LOG", "FAKE_NVML_SCENARIO", "NODE_NAME"];

fn run_agent(args: &[String]) -> Result<()> {
    let bin = benchkit::host::release_agent()?;
    let own_nvml = args.iter().any(|a| a.starts_with("--nvml-lib"))
        || std::env::var_os("FAKE_NVML_SCENARIO").is_some();
    if !own_nvml && !nvidia_driver_here() {
        eprintln!(
            "xtask: no NVIDIA driver here (no /dev/nvidiactl, no libnvidia-ml.so.1): the agent \
             runs without GPU data; `cargo xtask demo` shows it on a GPU node with pods, on \
             any machine"
        );
    }
    let mut cmd = if is_root() {
        Command::new(&bin)
    } else if let Some(sudo) = on_path("sudo") {
        let keep: Vec<String> = std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .filter(|k| AGENT_ENV.contains(&k.as_str()) || k.starts_with("OTEL_"))
            .collect();
        let mut c = Command::new(sudo);
        // --preserve-env, not `env K=V`: OTEL headers may hold keys, argv is public.
        if !keep.is_empty() {
            c.arg(format!("--preserve-env={}", keep.join(",")));
        }
        c.arg(&bin);
        c
    } else {
        bail!(
            "gpu-agent needs root (or CAP_BPF and CAP_PERFMON) and there is no sudo here: \
             run `cargo xtask run` as root, or `{} run` with those capabilities",
            bin.display()
        );
    };
    cmd.arg("run").args(args);
    Err(cmd.exec()).with_context(|| format!("running {}", bin.display()))
}

/// The driver's device node, or its NVML library where the loader finds it.
fn nvidia_driver_here() -> bool {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return true;
    }
    // SAFETY: dlopen with a constant name; the handle is closed at once.
    unsafe {
        let h = libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_LAZY);
        if h.is_null() {
            return false;
        }
        libc::dlclose(h);
    }
    true
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The first `name` on PATH.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `cargo` (the one that runs xtask), in the workspace root, without the variables that
/// `cargo run` set for xtask: build scripts that watch them (ring's `rerun-if-env-changed=
/// CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`, ...) would otherwise rebuild, here and again in
/// the next `cargo xtask`, every crate above them.
pub fn cargo_command() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(workspace_root());
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_MANIFEST_")
            || [
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
                // xtask's own (it has a build script); ring's build script records it.
                "OUT_DIR",
            ]
            .contains(&&*k)
        {
            c.env_remove(&*k);
        }
    }
    c
}

pub fn cargo(args: &[&str]) -> Result<()> {
    let status = cargo_command()
        .args(args)
        .status()
        .context("running cargo")?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

#[cfg(test)]
mod t {
    use super::*;

    fn test_args(argv: &[&str]) -> Vec<String> {
        let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
        match Cli::try_parse_from(&argv).unwrap().cmd {
            Cmd::Test { args } => with_leading_double_dash(&argv, args),
            _ => unreachable!(),
        }
    }

    #[test]
    fn a_double_dash_reaches_the_test_binaries() {
        assert_eq!(test_args(&["xtask", "test", "--", "-q"]), ["--", "-q"]);
        assert_eq!(
            test_args(&["xtask", "test", "-p", "tests", "--", "-q"]),
            ["-p", "tests", "--", "-q"]
        );
        assert_eq!(
            test_args(&["xtask", "test", "-p", "tests"]),
            ["-p", "tests"]
        );
    }
}
