//! The markdown and the `RESULT` line of `cargo xtask bench [--quick]`.
use std::fmt::Write;

use crate::{
    bench::{ExportBench, StormFigures},
    benchkit::{
        figures::{Memory, Row, ShortLived},
        host::counter,
    },
};

pub(crate) struct Report<'a> {
    pub quick: bool,
    pub machine: String,
    pub elapsed_s: f64,
    /// The regular nodes (8 GPUs, 320 GPU processes), by N.
    pub rows: &'a [Row],
    /// The 50k-process node.
    pub big: &'a Row,
    pub short: &'a ShortLived,
    pub storm: &'a StormFigures,
    pub storm_n: u32,
    pub export: Option<&'a ExportBench>,
}

impl Report<'_> {
    /// The N = 5000 row (the first row when there is none).
    pub fn r5(&self) -> &Row {
        self.rows
            .iter()
            .find(|r| r.n >= 4000 && r.n <= 6000)
            .unwrap_or(&self.rows[0])
    }

    fn calls(r: &Row) -> f64 {
        r.calls.as_ref().map_or(f64::NAN, |c| c.per_cycle)
    }

    fn calls_320(&self) -> f64 {
        self.big
            .big
            .as_ref()
            .and_then(|b| b.calls_320.as_ref())
            .map_or(f64::NAN, |c| c.per_cycle)
    }

    fn export_ms(&self) -> (f64, f64) {
        self.export.map_or((f64::NAN, f64::NAN), |e| {
            (e.prom_us / 1000.0, e.build_us / 1000.0)
        })
    }
}

pub(crate) fn markdown(r: &Report) -> String {
    let mut md = format!(
        "Measured by `cargo xtask bench{}` on {} in {:.0} s. The agent's figures are its whole \
         process (eBPF cache, NVML sampling through the fake library, join, OTLP push over \
         {} to an in-process receiver) from its schedstat; the baselines time only their own \
         work, in the harness (thread CPU; (c) also wall time), on the same node state, so the \
         comparison favours them. The fake library writes its call counts once per cycle \
         (FAKE_NVML_CALLS), in the agent's NVML thread: part of the agent's figures.\n\n",
        if r.quick { " --quick" } else { "" },
        r.machine,
        r.elapsed_s,
        shown(&crate::benchkit::agent::protocol()),
    );
    rows_table(&mut md, r);
    big_node(&mut md, r);
    nvml_calls(&mut md, r);
    others(&mut md, r);
    targets(&mut md, r);
    md
}

fn rows_table(md: &mut String, r: &Report) {
    md.push_str(
        "| N processes | GPU processes (attributed) | agent CPU per cycle (NVML thread / join / OTLP export) | \
         agent % of a core at 1 Hz | agent RSS | ready | NVML calls per cycle | (a) per-PID \
         /proc reads | (b) full /proc scan | (c) classic script, CPU (wall) | (b) / agent | \
         (a) / agent | (c) / agent |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | \
         --- | --- | --- | --- |\n",
    );
    for row in r.rows.iter().chain([r.big]) {
        let n = match &row.big {
            None => row.n.to_string(),
            Some(b) => format!(
                "{} ({} pods, {} cgroups, 8 GPUs x 7 MIG)",
                row.n, row.pods, b.cgroups
            ),
        };
        let a = row.agent_ns_per_cycle;
        let _ = writeln!(
            md,
            "| {n} | {} ({}) | {:.2} ms ({:.2} / {:.2} / {:.2}) | {:.3} % | {:.1} MiB | {:.2} s | {:.0} | \
             {:.2} ms | {:.1} ms | {:.2} ms ({:.2} ms) | {:.1}x | {:.2}x | {:.2}x |",
            row.gpu_procs,
            row.attributed,
            a / 1e6,
            row.nvml_ns / 1e6,
            row.join_ns / 1e6,
            row.export_ns / 1e6,
            row.agent_cpu_pct,
            row.rss_mb,
            row.ready_s,
            Report::calls(row),
            row.pid_read_ns / 1e6,
            row.proc_scan_ns / 1e6,
            row.classic.cpu_ns / 1e6,
            row.classic.wall_ns / 1e6,
            row.proc_scan_ns / a,
            row.pid_read_ns / a,
            row.classic.cpu_ns / a
        );
    }
    let c = &r.big.classic;
    let _ = write!(
        md,
        "\nOn the large node (c) found {} GPU processes in {} containers per cycle.",
        c.gpu_procs_listed, c.containers
    );
    md.push_str(&match c.docker_calls {
        Some(n) => format!(
            " (c) per cycle: the GPU processes listed through NVML (nvidia-smi's calls), \
             /proc/PID/cgroup of each, and {n} Docker API calls (`GET /containers/ID/json`, \
             one per container) at 2,000 GPU processes; dockerd's own CPU on top: {}.\n",
            c.dockerd_cpu_ns
                .map_or("unknown (its pid unknown)".into(), |ns| format!(
                    "{:.2} ms per cycle",
                    ns / 1e6
                ))
        ),
        None => " (c) per cycle: the GPU processes listed through NVML (nvidia-smi's calls) and \
                 /proc/PID/cgroup of each. Its Docker API calls (one per container) are left \
                 out: no dockerd answered on /var/run/docker.sock (or DOCKER_HOST) here.\n"
            .into(),
    });
}

fn big_node(md: &mut String, r: &Report) {
    let (row, Some(b)) = (r.big, r.big.big.as_ref()) else {
        return;
    };
    let s = &row.stats;
    let _ = writeln!(
        md,
        "\nThe large node ({} processes in {} pods, {} cgroups, {} GPU processes on 8 H100 x 7 \
         MIG devices, built in {:.0} s, {:.0} MiB of the machine's memory): ready {:.2} s after \
         start (start-up walk {} ms, eBPF load {} ms), {} processes cached, {} cgroups known, \
         kernel map full {} times, {} GPU processes unresolved.",
        row.n,
        row.pods,
        b.cgroups,
        row.gpu_procs,
        b.node_start_s,
        b.node_mem_mib,
        row.ready_s,
        counter(s, "startup_walk_ms"),
        counter(s, "ebpf_load_ms"),
        counter(s, "cached_processes"),
        counter(s, "cgroups_known"),
        counter(s, "kernel_map_full"),
        counter(s, "gpu_processes_unresolved"),
    );
    if let Some(d) = &b.deployed {
        let _ = writeln!(
            md,
            "\nAs deploy/kubernetes/config.toml runs it ({}, an export every {} s, compression \
             {}; the bench's agents export every second, uncompressed): a cycle costs {:.3} \
             times as much (side by side with the bench's agent on this node, {} windows of \
             one export interval, {} exports in them, CPU summed over them; the bench's agent \
             started first, so the bias of the agent started second, about 3 %, is against \
             the deployed one), which puts it at {:.3} % of a core. {} Its RSS after the \
             windows: {:.1} MiB (its peak {:.1} MiB).",
            shown(&d.protocol),
            d.interval_ms as f64 / 1000.0,
            d.compression,
            d.ratio,
            d.windows,
            d.exports,
            d.cpu_pct,
            if d.named {
                "As deploy/'s `[metadata]` has it, the deployed agent names every container \
                 from the node's runtime (CRI) and kubelet (pod-resources), here servers \
                 built from their protos answering for the node's 9,000 containers and the \
                 2,000 MIG devices allocated; the bench's agent names none."
            } else {
                "deploy/'s `[metadata]` is off: neither agent names the containers."
            },
            d.rss_mib,
            d.peak_mib,
        );
    }
    if let Some(o) = &b.other {
        let (protocol, ratio, pct) = (shown(&o.protocol), o.ratio, o.cpu_pct);
        let _ = writeln!(
            md,
            "\nOver {protocol} instead of {}: a cycle costs {ratio:.3} times as much (the two \
             agents side by side on this node, after the baselines, the median of six windows; \
             the {protocol} one started first, so the bias of the agent started second, about \
             3 %, is against {}), which puts it at {pct:.3} % of a core.",
            shown(&crate::benchkit::agent::protocol()),
            shown(&crate::benchkit::agent::protocol()),
        );
    }
    memory(md, &b.memory, b.deployed.as_ref().map(|d| &d.memory));
}

/// Where the large node's agents' RSS is, and the state behind the heap.
fn memory(md: &mut String, bench: &Memory, deployed: Option<&Memory>) {
    md.push_str(
        "\nWhere the RSS is (MiB; /proc/PID/smaps, and the allocator's live heap from \
         `/debug/stats?heap=true`):\n\n| | the bench's agent | as deployed |\n| --- | --- | --- |\n",
    );
    let (b, d) = (bench.cells(), deployed.map(Memory::cells));
    let what = [
        "the agent's binary (text and data)",
        "shared libraries (libc, the NVML library)",
        "heap and thread stacks",
        "of which the live heap",
        "BPF maps and the ring",
        "other",
        "state lengths",
    ];
    for (i, what) in what.iter().enumerate() {
        let d = d.as_ref().map_or("", |d| d[i].as_str());
        let _ = writeln!(md, "| {what} | {} | {d} |", b[i]);
    }
}

/// A protocol as the docs name it.
fn shown(protocol: &str) -> &str {
    match protocol {
        "grpc" => "gRPC",
        "http/protobuf" => "HTTP/protobuf",
        other => other,
    }
}

fn nvml_calls(md: &mut String, r: &Report) {
    let _ = writeln!(
        md,
        "\nNVML calls per cycle (counted by the fake library, FAKE_NVML_CALLS): {:.1} with 320 \
         GPU processes and {:.1} with 2,000 on the same 8 x 7 MIG layout; {:.1} on the \
         8-GPU node with 320. The busiest calls at 2,000 GPU processes:\n\n\
         | NVML function | calls per cycle |\n| --- | --- |",
        r.calls_320(),
        Report::calls(r.big),
        Report::calls(r.r5())
    );
    for (name, n) in r.big.calls.iter().flat_map(|c| &c.top) {
        let _ = writeln!(md, "| {name} | {n:.1} |");
    }
}

fn others(md: &mut String, r: &Report) {
    let (s, st) = (r.short, r.storm);
    let pct = |k: usize| 100.0 * k as f64 / s.total.max(1) as f64;
    let _ = writeln!(
        md,
        "\nShort-lived GPU processes (5-50 ms, {} of them in rounds of {}, each round looked up \
         after NVML listed it, at the next sample): \
         gpu-agent attributed {} ({:.0}%), per-PID /proc reads {} ({:.0}%), full /proc scan {} \
         ({:.0}%).\n\n\
         Exec storm ({} fork+exec): {} notifications lost, slowdown {:.3}x, agent {:.2} us CPU \
         per event, eBPF {:.0} ns per event (mean of the programs), proc_fork {:.0} ns per run.",
        s.total,
        crate::benchkit::figures::SHORT_ROUND,
        s.agent,
        pct(s.agent),
        s.pid_read,
        pct(s.pid_read),
        s.proc_scan,
        pct(s.proc_scan),
        r.storm_n,
        st.lost,
        st.slowdown,
        st.cpu_us_per_event,
        st.bpf_ns_per_event,
        st.fork_ns
    );
    if let Some(e) = r.export {
        let _ = writeln!(
            md,
            "\n200 containers x 8 GPUs (`cargo bench -p otel --bench export -- 200`): OTLP \
             build + encode {:.2} ms CPU ({:.0} KiB), /metrics render {:.2} ms CPU ({:.0} KiB).",
            e.build_us / 1000.0,
            e.bytes / 1024.0,
            e.prom_us / 1000.0,
            e.prom_bytes / 1024.0
        );
    }
}

/// A row of a target that is an upper bound: `value` shown with `decimals`, in `unit`.
fn at_most(what: &str, value: f64, limit: f64, unit: &str, decimals: usize) -> [String; 4] {
    let met = if value <= limit { "met" } else { "not met" };
    [
        what.into(),
        format!("<= {limit} {unit}"),
        format!("{value:.decimals$} {unit}"),
        met.into(),
    ]
}

fn targets(md: &mut String, r: &Report) {
    let (st, big, r5) = (r.storm, r.big, r.r5());
    let (prom_ms, build_ms) = r.export_ms();
    let (c320, c2000) = (r.calls_320(), Report::calls(big));
    let verdict = |met: bool| if met { "met" } else { "not met" }.to_string();
    let big_cpu = "agent CPU, 50,000 processes, 1,000 pods, 2,000 GPU processes, 8 x 7 MIG";
    let per_200x8 = |what: &str| format!("{what}, 200 containers x 8 GPUs");
    let rows = [
        at_most(
            "eBPF mean run time per event",
            st.bpf_ns_per_event,
            600.0,
            "ns",
            0,
        ),
        at_most("proc_fork run time", st.fork_ns, 900.0, "ns", 0),
        at_most("agent CPU, 5,000 processes", r5.agent_cpu_pct, 0.2, "%", 3),
        at_most(
            &format!(
                "{big_cpu}, over {}",
                shown(&crate::benchkit::agent::protocol())
            ),
            big.agent_cpu_pct,
            0.5,
            "%",
            3,
        ),
        at_most("agent RSS, 50,000 processes", big.rss_mb, 32.0, "MiB", 1),
        at_most(
            "ready, 50,000 processes, 10,000 cgroups",
            big.ready_s,
            1.5,
            "s",
            2,
        ),
        [
            "exec storm".into(),
            "<= 1.03x, 0 lost".into(),
            format!("{:.3}x, {} lost", st.slowdown, st.lost),
            verdict(st.slowdown <= 1.03 && st.lost == 0),
        ],
        // A per-process call would add at least 1,680 calls between the two. The slow
        // readings (every 10 s) move each window's mean by a few calls.
        [
            "NVML calls per cycle".into(),
            "counted, none per process".into(),
            format!("{c320:.1} at 320, {c2000:.1} at 2,000 GPU processes"),
            verdict(c2000 - c320 < 100.0),
        ],
        at_most(&per_200x8("/metrics render"), prom_ms, 5.0, "ms", 2),
        at_most(&per_200x8("OTLP build + encode"), build_ms, 2.0, "ms", 2),
    ];
    let other = big.big.as_ref().and_then(|b| b.other.as_ref());
    let deployed = big.big.as_ref().and_then(|b| b.deployed.as_ref());
    let mut rows = rows.to_vec();
    if let Some(d) = deployed {
        let how = format!(
            "{big_cpu}, as deploy/kubernetes exports (every {} s, {}, {})",
            d.interval_ms as f64 / 1000.0,
            shown(&d.protocol),
            d.compression
        );
        rows.insert(4, at_most(&how, d.cpu_pct, 0.5, "%", 3));
        let named = if d.named { ", named" } else { "" };
        let rss = format!("agent RSS, 50,000 processes, as deployed{named}");
        let at = rows
            .iter()
            .position(|r| r[0].starts_with("agent RSS"))
            .unwrap_or(5);
        rows.insert(at + 1, at_most(&rss, d.rss_mib, 32.0, "MiB", 1));
    }
    if let Some(o) = other {
        rows.insert(
            4,
            at_most(
                &format!("{big_cpu}, over {}", shown(&o.protocol)),
                o.cpu_pct,
                0.5,
                "%",
                3,
            ),
        );
    }
    md.push_str("\n| target | goal | measured | |\n| --- | --- | --- | --- |\n");
    for [what, goal, got, verdict] in rows {
        let _ = writeln!(md, "| {what} | {goal} | {got} | {verdict} |");
    }
}

pub(crate) fn result_line(r: &Report) -> String {
    let (r5, big, st) = (r.r5(), r.big, r.storm);
    let (prom_ms, build_ms) = r.export_ms();
    format!(
        "RESULT agent_cpu_pct={:.3} rss_mb={:.1} ratio_vs_procscan={:.1} ratio_vs_pidread={:.2} \
         lost={} bpf_ns_per_event={:.0} agent_cpu_pct_50k={:.3} rss_mb_50k={:.1} \
         ready_s_50k={:.2} fork_ns={:.0} nvml_calls_per_cycle={:.1} metrics_render_ms={:.2} \
         otlp_build_ms={:.2} agent_cpu_pct_50k_{}={:.3} agent_cpu_pct_50k_deployed={:.3} \
         rss_mb_50k_deployed={:.1}",
        r5.agent_cpu_pct,
        r5.rss_mb,
        r5.proc_scan_ns / r5.agent_ns_per_cycle,
        r5.pid_read_ns / r5.agent_ns_per_cycle,
        st.lost,
        st.bpf_ns_per_event,
        big.agent_cpu_pct,
        big.rss_mb,
        big.ready_s,
        st.fork_ns,
        Report::calls(big),
        prom_ms,
        build_ms,
        match crate::benchkit::agent::other_protocol(&crate::benchkit::agent::protocol()) {
            "grpc" => "grpc",
            _ => "http",
        },
        big.big
            .as_ref()
            .and_then(|b| b.other.as_ref())
            .map_or(f64::NAN, |o| o.cpu_pct),
        big.big
            .as_ref()
            .and_then(|b| b.deployed.as_ref())
            .map_or(f64::NAN, |d| d.cpu_pct),
        big.big
            .as_ref()
            .and_then(|b| b.deployed.as_ref())
            .map_or(f64::NAN, |d| d.rss_mib),
    )
}
