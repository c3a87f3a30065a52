//! `cargo xtask <command>`: the project's chores.
mod bench;
mod deploy;
mod ebpf;
mod metrics_doc;
mod overhead;

use std::{path::PathBuf, process::Command};

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
    /// build-ebpf, build the agent, then run every test of the workspace.
    Test {
        /// Extra arguments for `cargo test`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Benchmarks (see docs/benchmarks.md). Without a subcommand: gpu-agent against the
    /// /proc-based approaches on one synthetic node, side by side.
    Bench {
        #[command(subcommand)]
        which: Option<bench::Which>,
        /// The reduced set (under 5 minutes on 2 cores), ending with one RESULT line.
        #[arg(long)]
        quick: bool,
        /// Print only; do not rewrite docs/benchmarks.md.
        #[arg(long)]
        no_write: bool,
    },
    /// Render and validate deploy/ (kustomize, Kubernetes schemas, Collector config, Grafana
    /// dashboards): see docs/deploy.md.
    CheckDeploy,
    /// Regenerate the tables of docs/metrics.md from the metric catalogue
    /// (otel/src/catalogue.rs).
    MetricsDoc {
        /// Write nothing; fail, naming each stale table, when the file is out of date.
        #[arg(long)]
        check: bool,
    },
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::BuildEbpf => ebpf::build().map(|_| ()),
        Cmd::Build => {
            ebpf::build()?;
            cargo(&["build", "--release", "-p", "agent"])
        }
        Cmd::Test { args } => {
            ebpf::build()?;
            // The integration tests spawn target/debug/gpu-agent and load the fake
            // libnvidia-ml.so: build both first.
            cargo(&["build", "-p", "agent", "-p", "fake-nvml"])?;
            let mut a = vec!["test", "--workspace", "--exclude", "agent-ebpf"];
            a.extend(args.iter().map(String::as_str));
            cargo(&a)
        }
        Cmd::Bench {
            which: Some(which), ..
        } => bench::run(which),
        Cmd::Bench {
            which: None,
            quick,
            no_write,
        } => overhead::run(quick, no_write),
        Cmd::CheckDeploy => deploy::run(),
        Cmd::MetricsDoc { check } => metrics_doc::run(check),
    }
}

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

pub fn cargo(args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args(args)
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("running {cargo}"))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}
