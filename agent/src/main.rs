use std::{
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use clap::{Parser, Subcommand};
use gpu_agent::{
    config::{Config, ConfigError, Loaded},
    rightsize,
    sinks::{top, usage::report},
};

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
    /// A live terminal view of the node's GPUs and the containers using them.
    Top(TopArgs),
    /// Validate a config file and exit (non-zero, naming the field, when it is bad), or
    /// print the default one.
    CheckConfig {
        #[arg(required_unless_present = "print_default")]
        file: Option<PathBuf>,
        /// Print the default configuration as TOML instead (docs/configuration.md lists
        /// every key).
        #[arg(long, conflicts_with = "file")]
        print_default: bool,
    },
    /// GPU usage per namespace (pod, container, node, GPU) from the usage-record file.
    Report(ReportArgs),
    /// Which workloads fit a smaller share of a GPU (a MIG profile, time-slicing, MPS), and
    /// how many GPUs that gives back, from the usage-record file (docs/rightsizing.md).
    Rightsize(RightsizeArgs),
}

#[derive(clap::Args)]
struct ReportArgs {
    /// The usage-record file (rotated files beside it are read too)
    /// [default: usage.file of --config]
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,
    /// Config file whose usage.file to read.
    #[arg(long)]
    config: Option<PathBuf>,
    /// How far back: 30m, 24h, 7d, 4w.
    #[arg(long, default_value = "24h", value_parser = report::parse_duration)]
    since: Duration,
    /// Group by these, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "namespace")]
    by: Vec<report::By>,
    #[arg(long, value_enum, default_value = "table")]
    format: report::Format,
}

#[derive(clap::Args)]
struct RightsizeArgs {
    /// The usage-record file (rotated files beside it are read too)
    /// [default: usage.file of --config]
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,
    /// Config file whose usage.file (and nvml.lib_path) to use.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Read the cluster's usage from the recording rules' series in Prometheus (or Thanos
    /// Query, or Mimir's `.../prometheus`) at this URL instead of a records file
    /// (deploy/prometheus/gpu-agent-rightsizing.yaml).
    #[arg(long, value_name = "URL", conflicts_with = "file")]
    prometheus: Option<String>,
    /// A header for every request to --prometheus, `Name: value` (repeatable):
    /// `X-Scope-OrgID: <tenant>` for Mimir, `Authorization: Bearer <token>`.
    #[arg(long, value_name = "HEADER", value_parser = rightsize::prometheus::parse_header)]
    prometheus_header: Vec<(String, String)>,
    /// How long each request to --prometheus may take: 10s, 2m (connecting: at most 5 s
    /// of it).
    #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = report::parse_duration)]
    prometheus_timeout: Duration,
    /// The recording rules' evaluation interval, where the API does not serve
    /// /api/v1/rules [default: the group's interval from /api/v1/rules].
    #[arg(long, value_name = "DURATION", value_parser = report::parse_duration)]
    rule_interval: Option<Duration>,
    /// How far back: 24h, 7d, 4w.
    #[arg(long, default_value = "7d", value_parser = report::parse_duration)]
    since: Duration,
    /// Added to the peak memory and the p95 SM use before fitting: 0.2 is 20 %.
    #[arg(long, default_value = "0.2", value_parser = rightsize::parse_headroom, allow_negative_numbers = true)]
    headroom: f64,
    /// Less coverage than this (records' time, all containers together): insufficient data.
    #[arg(long, default_value = "24h", value_parser = report::parse_duration)]
    min_coverage: Duration,
    /// One row per workload and GPU model, or per namespace.
    #[arg(long, value_enum, default_value = "workload")]
    by: rightsize::By,
    #[arg(long, value_enum, default_value = "table")]
    format: report::Format,
    /// Never recommend MIG: time-slicing on every GPU.
    #[arg(long)]
    no_mig: bool,
    /// Recommend MPS limits instead of MIG or time-slicing.
    #[arg(long)]
    mps: bool,
    /// Load NVML from this path instead of the system's libnvidia-ml.so.1 (to read the MIG
    /// profiles of this node's GPUs) [default: nvml.lib_path of --config].
    #[arg(long, value_name = "PATH")]
    nvml_lib: Option<PathBuf>,
    /// Print the MIG profiles this node's NVML lists beside the built-in table's, one per
    /// line, and exit.
    #[arg(long)]
    profiles: bool,
    /// Plan a layout per GPU model (MIG devices packed under the placement rules,
    /// time-slicing and MPS replicas per GPU) and say how many GPUs it frees.
    #[arg(long)]
    plan: bool,
    /// Write the files that apply the plan into this directory (implies --plan):
    /// mig-parted.yaml, device-plugin-sharing.yaml, workloads/, dra/ and a README.md.
    #[arg(long, value_name = "DIR")]
    emit: Option<PathBuf>,
    /// Write into a --emit directory that is not empty.
    #[arg(long, requires = "emit")]
    force: bool,
}

/// The flags that choose and configure the sources: shared by `run` and `top`.
#[derive(clap::Args, Clone, Default)]
struct SourceArgs {
    /// Config file (TOML); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Do not try eBPF: run in /proc mode.
    #[arg(long)]
    no_ebpf: bool,
    /// Load NVML from this path instead of the system's libnvidia-ml.so.1.
    #[arg(long, value_name = "PATH")]
    nvml_lib: Option<PathBuf>,
    /// CRI runtime socket for pod and container names [default: autodetect containerd/CRI-O]
    #[arg(long, value_name = "PATH")]
    cri_socket: Option<PathBuf>,
    /// kubelet pod-resources socket for GPU allocations
    /// [default: /var/lib/kubelet/pod-resources/kubelet.sock]
    #[arg(long, value_name = "PATH")]
    pod_resources_socket: Option<PathBuf>,
    /// Docker Engine socket for names on plain Docker hosts [default: /var/run/docker.sock]
    #[arg(long, value_name = "PATH")]
    docker_socket: Option<PathBuf>,
}

#[derive(clap::Args)]
struct RunArgs {
    #[command(flatten)]
    sources: SourceArgs,
    /// Address of every endpoint (/healthz, /readyz, /metrics, /debug/*); loopback only
    /// unless http.expose_debug [default: 127.0.0.1:9464]
    #[arg(long)]
    http_addr: Option<std::net::SocketAddr>,
    /// Address of /metrics, /healthz and /readyz only (http.metrics_addr): the one to expose
    /// to Prometheus and the kubelet's probes [default: none]
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Serve Prometheus text at /metrics on the HTTP address.
    #[arg(long)]
    prometheus: bool,
    /// Also serve dcgm-exporter's metrics at /metrics (implies --prometheus): `dcgm`, its
    /// default layout (the allocated pod's labels on each device's series), or
    /// `dcgm-virtual-gpus`, its --kubernetes-virtual-gpus layout (a series per pod).
    #[arg(long, value_name = "MODE", value_parser = ["dcgm", "dcgm-virtual-gpus"])]
    prometheus_compat: Option<String>,
    /// dcgm-exporter's counters CSV (`field, type, help` lines) choosing its fields (implies
    /// --prometheus-compat dcgm unless given) [default: dcgm-exporter's default counters].
    #[arg(short = 'f', long = "collectors", value_name = "PATH")]
    collectors: Option<PathBuf>,
}

#[derive(clap::Args)]
struct TopArgs {
    #[command(flatten)]
    sources: SourceArgs,
    /// Print one plain-text frame to stdout and exit (for scripts and bug reports).
    #[arg(long)]
    once: bool,
    /// Where the live view writes the agent's log (it would scribble over the screen).
    #[arg(long, value_name = "PATH", default_value = "/tmp/gpu-agent-top.log")]
    log_file: PathBuf,
}

/// The config file, the flags over it, and the OTEL_* environment: validated once, the
/// same way for `run`, `top` and `check-config`.
fn load_config(sources: &SourceArgs, run: Option<&RunArgs>) -> Result<Loaded, ConfigError> {
    let mut config = match &sources.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    if sources.no_ebpf {
        config.ebpf.enabled = false;
    }
    if let Some(p) = &sources.cri_socket {
        config.metadata.cri_socket = Some(p.clone());
    }
    if let Some(p) = &sources.pod_resources_socket {
        config.metadata.pod_resources_socket = p.clone();
    }
    if let Some(p) = &sources.docker_socket {
        config.metadata.docker_socket = p.clone();
    }
    if let Some(p) = &sources.nvml_lib {
        config.nvml.lib_path = Some(p.clone());
    }
    if let Some(args) = run {
        if let Some(addr) = args.http_addr {
            config.http.addr = addr;
        }
        if let Some(addr) = args.metrics_addr {
            config.http.metrics_addr = Some(addr);
        }
        if args.prometheus || args.prometheus_compat.is_some() {
            config.prometheus.enabled = true;
        }
        if let Some(c) = &args.prometheus_compat {
            config.prometheus.compat = Some(c.clone());
        }
        if let Some(p) = &args.collectors {
            config.dcgm.collectors = Some(p.clone());
            config.prometheus.enabled = true;
            config
                .prometheus
                .compat
                .get_or_insert_with(|| "dcgm".into());
        }
    }
    config.resolve(|k| std::env::var(k).ok())
}

/// Before any thread exists: unshare(CLONE_NEWNS) refuses multi-threaded callers.
/// Returns why tracefs could not be prepared, if so.
fn prepare_tracefs(config: &Config) -> Option<String> {
    // First, so that a non-root agent's file capabilities count for all that follows.
    match gpu_agent::run::raise_permitted_capabilities() {
        Ok(raised) if !raised.is_empty() => {
            tracing::info!(?raised, "file capabilities put in effect")
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("putting permitted capabilities in effect: {e}"),
    }
    // Any mode reads cgroup paths: they must be the host's, not the pod's relative ones.
    match gpu_agent::ebpf::tracefs::join_host_cgroup_namespace() {
        Ok(Some(done)) => tracing::info!("{done}"),
        Ok(None) => {}
        Err(e) => tracing::warn!("{e}"),
    }
    if !config.ebpf.enabled {
        return None;
    }
    match gpu_agent::ebpf::tracefs::prepare_mount_namespace() {
        Ok(Some(done)) => {
            tracing::info!("{done}");
            None
        }
        Ok(None) => None,
        Err(e) => Some(e),
    }
}

fn main() -> ExitCode {
    // One malloc arena: glibc gives each thread that allocates (NVML, HTTP, the start-up
    // walk's readers) an arena of its own, which a node agent pays for in RSS, not speed.
    // SAFETY: mallopt has no preconditions; called before any other thread exists.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::CheckConfig {
            file,
            print_default,
        } => check_config(file, print_default),
        Cmd::Run(args) => run(args),
        Cmd::Top(args) => top(args),
        Cmd::Report(args) => report(args),
        Cmd::Rightsize(args) => rightsize(args),
    }
}

/// `gpu-agent check-config FILE`, or `--print-default`.
fn check_config(file: Option<PathBuf>, print_default: bool) -> ExitCode {
    let Some(file) = file.filter(|_| !print_default) else {
        print!("{}", Config::default_toml());
        return ExitCode::SUCCESS;
    };
    let sources = SourceArgs {
        config: Some(file.clone()),
        ..Default::default()
    };
    match load_config(&sources, None) {
        Ok(_) => {
            println!("{}: ok", file.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gpu-agent: {e}");
            ExitCode::from(2)
        }
    }
}

/// `gpu-agent report`: reads the usage-record file, prints the totals.
fn report(args: ReportArgs) -> ExitCode {
    let file = match (&args.file, &args.config) {
        (Some(f), _) => Some(f.clone()),
        (None, Some(c)) => match Config::from_file(c) {
            Ok(cfg) => cfg.usage.file,
            Err(e) => {
                eprintln!("gpu-agent: {e}");
                return ExitCode::from(2);
            }
        },
        (None, None) => None,
    };
    let Some(file) = file else {
        eprintln!("gpu-agent report: give --file, or --config with usage.file set");
        return ExitCode::from(2);
    };
    let opts = report::Options {
        file,
        since: args.since,
        by: args.by,
        format: args.format,
        now_ms: gpu_agent::pipeline::now_ms(),
    };
    let mut summary = report::Summary::new(&opts);
    let left = gpu_agent::sinks::usage::read::for_each_record(&opts.file, opts.now_ms, |r| {
        summary.add(&r)
    });
    match left {
        Ok(left) => left
            .lines()
            .iter()
            .for_each(|l| eprintln!("gpu-agent report: {l}")),
        Err(e) => {
            eprintln!("gpu-agent report: {e}");
            return ExitCode::FAILURE;
        }
    }
    print!("{}", report::render(&summary.finish(), &opts));
    ExitCode::SUCCESS
}

/// `gpu-agent rightsize`: the usage-record file and this node's MIG profiles in, the
/// recommendations out (or, with `--profiles`, the profiles alone).
fn rightsize(args: RightsizeArgs) -> ExitCode {
    let fail = |e: &dyn std::fmt::Display, code: u8| {
        eprintln!("gpu-agent rightsize: {e}");
        ExitCode::from(code)
    };
    let config = match args.config.as_deref().map(Config::from_file).transpose() {
        Ok(c) => c,
        Err(e) => return fail(&e, 2),
    };
    if args.since.is_zero() {
        return fail(&"--since: give a window longer than 0, e.g. 7d", 2);
    }
    if args.prometheus.is_none()
        && (args.rule_interval.is_some() || !args.prometheus_header.is_empty())
    {
        return fail(
            &"--rule-interval and --prometheus-header go with --prometheus",
            2,
        );
    }
    if args.prometheus_timeout.is_zero() {
        return fail(
            &"--prometheus-timeout: give a duration above 0, e.g. 30s",
            2,
        );
    }
    if let Some(dir) = &args.emit {
        if let Err(e) = rightsize::emit::check_dir(dir, args.force) {
            return fail(&e, 2);
        }
    }
    let nvml_lib = (args.nvml_lib.clone()).or_else(|| config.as_ref()?.nvml.lib_path.clone());
    let from = match (&args.prometheus, args.file.clone()) {
        (Some(url), _) => Some(rightsize::From::Prometheus(rightsize::prometheus::Source {
            url: url.clone(),
            headers: args.prometheus_header.clone(),
            interval: args.rule_interval.filter(|i| !i.is_zero()),
            timeout: args.prometheus_timeout,
        })),
        (None, file) => file
            .or_else(|| config?.usage.file)
            .map(rightsize::From::File),
    };
    if from.is_none() && !args.profiles {
        return fail(
            &"give --file, --prometheus, or --config with usage.file set",
            2,
        );
    }
    // NVML could hang on a wedged driver: the profiles are read with a deadline.
    let read = rightsize::nvml::read(nvml_lib, Duration::from_secs(5));
    let profiles = rightsize::Profiles::with_nvml(read);
    let Some(from) = from.filter(|_| !args.profiles) else {
        print!("{}", rightsize::list_profiles(&profiles));
        return ExitCode::SUCCESS;
    };
    let opts = rightsize::Options {
        from,
        since: args.since,
        now_ms: gpu_agent::pipeline::now_ms(),
        settings: rightsize::Settings {
            headroom: args.headroom,
            min_coverage_s: args.min_coverage.as_secs_f64(),
            mig: !args.no_mig,
            mps: args.mps,
        },
        by: args.by,
        format: args.format,
        plan: args.plan || args.emit.is_some(),
    };
    let outcome = match rightsize::run(&opts, &profiles) {
        Ok(o) => o,
        Err(e) => return fail(&e, 1),
    };
    for l in &outcome.left_out {
        eprintln!("gpu-agent rightsize: {l}");
    }
    print!("{}", outcome.out);
    if let (Some(dir), Some(plan)) = (&args.emit, &outcome.plan) {
        match rightsize::emit::emit(dir, args.force, plan) {
            Ok(files) => eprintln!(
                "gpu-agent rightsize: {} files written to {} (see its README.md)",
                files.len(),
                dir.display()
            ),
            Err(e) => return fail(&e, 1),
        }
    }
    ExitCode::SUCCESS
}

fn run(args: RunArgs) -> ExitCode {
    let loaded = match load_config(&args.sources, Some(&args)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gpu-agent: {e}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let prep_error = prepare_tracefs(&loaded.config);
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
    let reload: gpu_agent::run::Reload = Box::new(move || load_config(&args.sources, Some(&args)));
    match rt.block_on(gpu_agent::run::run(loaded, prep_error, reload)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `gpu-agent top`: the same sources as `run`, in-process, shown until the user quits.
fn top(args: TopArgs) -> ExitCode {
    let mut config = match load_config(&args.sources, None) {
        Ok(c) => c.config,
        Err(e) => {
            eprintln!("gpu-agent: {e}");
            return ExitCode::from(2);
        }
    };
    // Per-process rows are what a container row expands into.
    config.nvml.process_detail = true;
    let opts = top::Options {
        once: args.once,
        log_file: args.log_file,
    };
    if let Err(e) = top::check_terminal(&opts) {
        eprintln!("gpu-agent top: {e}");
        return ExitCode::from(2);
    }
    top::init_logging(&opts);
    let prep_error = prepare_tracefs(&config);
    let node = gpu_agent::run::node_identity(&config);
    let metadata = config.metadata.enabled;
    let (handles, stop, thread) = match gpu_agent::run::spawn_embedded(config, prep_error) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("gpu-agent top: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let feed = top::Feed {
        snapshot: handles.snapshot,
        stats: handles.stats,
        host: node.node_name.unwrap_or(node.host_name),
        metadata,
    };
    let code = top::main(feed, &opts);
    stop.cancel();
    // They stop within a poll interval; a stuck NVML call must not keep us from exiting.
    let deadline = Instant::now() + Duration::from_secs(2);
    while !thread.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if thread.is_finished() {
        let _ = thread.join();
    }
    code
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn check_config_takes_a_file_or_prints_the_default() {
        let parse =
            |args: &[&str]| Cli::try_parse_from([&["gpu-agent", "check-config"], args].concat());
        for ok in [&["f.toml"][..], &["--print-default"]] {
            assert!(parse(ok).is_ok(), "{ok:?}");
        }
        for bad in [&[][..], &["f.toml", "--print-default"]] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rightsize_defaults_to_a_week_a_fifth_of_headroom_and_a_day_of_coverage() {
        let parse =
            |args: &[&str]| Cli::try_parse_from([&["gpu-agent", "rightsize"], args].concat());
        let Ok(Cli {
            cmd: Cmd::Rightsize(a),
        }) = parse(&["--file", "u.jsonl"])
        else {
            panic!("rightsize --file parses");
        };
        assert_eq!(a.since, Duration::from_secs(7 * 86_400));
        assert_eq!(
            (a.headroom, a.min_coverage),
            (0.2, Duration::from_secs(86_400))
        );
        assert_eq!(
            (a.by, a.format),
            (rightsize::By::Workload, report::Format::Table)
        );
        assert!(!a.no_mig && !a.mps && !a.profiles);
        for bad in [
            &["--headroom", "11"][..],
            &["--format", "yaml"],
            &["--min-coverage", "1"],
        ] {
            let e = parse(bad).err().unwrap().to_string();
            assert!(e.contains(bad[0]), "{bad:?}: {e}");
        }
    }

    /// docs/configuration.md names these flags beside their keys.
    #[test]
    fn documented_flags_are_flags_of_run() {
        let cli = Cli::command();
        let run = cli.find_subcommand("run").unwrap();
        for k in gpu_agent::config::reference() {
            let Some(flag) = k.flag else { continue };
            let long = flag.strip_prefix("--").unwrap();
            assert!(
                run.get_arguments().any(|a| a.get_long() == Some(long)),
                "{}: {flag} is not a flag of run",
                k.key
            );
        }
    }
}
