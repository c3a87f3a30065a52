use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use gpu_agent::config::Config;

#[derive(Parser)]
#[command(
    name = "gpu-agent",
    version,
    about = "Per-container GPU memory and time"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the agent.
    Run(RunArgs),
    /// Validate a config file and exit (non-zero, naming the field, when it is bad).
    CheckConfig { file: PathBuf },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Config file (TOML); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address of /healthz, /readyz and /debug/* [default: 127.0.0.1:9464]
    #[arg(long)]
    http_addr: Option<std::net::SocketAddr>,
    /// Do not try eBPF: run in /proc mode.
    #[arg(long)]
    no_ebpf: bool,
    /// Load NVML from this path instead of the system's libnvidia-ml.so.1.
    #[arg(long, value_name = "PATH")]
    nvml_lib: Option<PathBuf>,
    /// Serve Prometheus text at /metrics on the HTTP address.
    #[arg(long)]
    prometheus: bool,
    /// Also serve dcgm-exporter's metric names at /metrics (implies --prometheus).
    #[arg(long, value_name = "MODE", value_parser = ["dcgm"])]
    prometheus_compat: Option<String>,
}

fn load_config(args: &RunArgs) -> Result<Config, String> {
    let mut config = match &args.config {
        Some(path) => Config::from_file(path).map_err(|e| e.to_string())?,
        None => Config::default(),
    };
    if let Some(addr) = args.http_addr {
        config.http.addr = addr;
    }
    if args.no_ebpf {
        config.ebpf.enabled = false;
    }
    if let Some(p) = &args.nvml_lib {
        config.nvml.lib_path = Some(p.clone());
    }
    if args.prometheus || args.prometheus_compat.is_some() {
        config.prometheus.enabled = true;
    }
    if let Some(c) = &args.prometheus_compat {
        config.prometheus.compat = Some(c.clone());
    }
    config.validate().map_err(|e| e.to_string())?;
    // The OTEL_* variables are configuration too: a bad one stops start-up, named.
    config
        .otlp
        .resolve(|k| std::env::var(k).ok())
        .map_err(|e| format!("invalid OTLP configuration: {e}"))?;
    Ok(config)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::CheckConfig { file } => match Config::from_file(&file).and_then(|c| {
            c.otlp.resolve(|k| std::env::var(k).ok()).map_err(|e| {
                gpu_agent::config::ConfigError::Invalid {
                    field: "otlp",
                    message: e,
                }
            })
        }) {
            Ok(_) => {
                println!("{}: ok", file.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("gpu-agent: {e}");
                ExitCode::from(2)
            }
        },
        Cmd::Run(args) => {
            let config = match load_config(&args) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("gpu-agent: {e}");
                    return ExitCode::from(2);
                }
            };
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "info".into()),
                )
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .init();
            // Before any thread exists: unshare(CLONE_NEWNS) refuses multi-threaded callers.
            let prep_error = if config.ebpf.enabled {
                match gpu_agent::ebpf::tracefs::prepare_mount_namespace() {
                    Ok(Some(done)) => {
                        tracing::info!("{done}");
                        None
                    }
                    Ok(None) => None,
                    Err(e) => Some(e),
                }
            } else {
                None
            };
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("gpu-agent: starting the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(gpu_agent::run::run(config, prep_error)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
