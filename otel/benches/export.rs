//! `cargo bench -p otel --bench export [CONTAINERS [GPUS]]`: CPU to build and encode one
//! OTLP export, and to render /metrics, for CONTAINERS (default 200) containers x GPUS
//! (default 8) GPUs.
//! Prints one `BENCH ...` line; `cargo xtask bench export` reads it.

/// A synthetic snapshot: `n` containers, each using all `gpus` GPUs.
fn synthetic_snapshot(n: u32, gpus: u32) -> gpu_model::Snapshot {
    use gpu_model::{
        ContainerGpu, ContainerUsage, DeviceSample, DeviceStatus, Snapshot, SourceStatus,
    };
    let devices = (0..gpus)
        .map(|i| DeviceSample {
            index: i,
            uuid: format!("GPU-{:08x}-0000-0000-0000-000000000000", i),
            name: "NVIDIA H100 80GB HBM3".into(),
            status: DeviceStatus::Ok,
            memory_total_bytes: Some(85520809984),
            memory_used_bytes: Some(1 << 34),
            utilization_gpu: Some(50),
            utilization_memory: Some(20),
            power_mw: Some(400_000),
            energy_mj: Some(1 << 30),
            temperature_c: Some(50),
            sm_clock_mhz: Some(1980),
            mem_clock_mhz: Some(2619),
            ecc_corrected: Some(0),
            ecc_uncorrected: Some(0),
            ..Default::default()
        })
        .collect::<Vec<_>>();
    let containers = (0..n)
        .map(|c| ContainerUsage {
            container_id: Some(format!("{:064x}", c as u128 * 7919 + 1).into()),
            pod_uid: Some(format!("{:08x}-0000-4000-8000-{:012x}", c, c).into()),
            qos: Some("burstable"),
            runtime: Some("containerd"),
            pod_name: Some(format!("trainer-{c}").into()),
            namespace: Some("ml".into()),
            container_name: Some("main".into()),
            gpus: devices
                .iter()
                .map(|d| ContainerGpu {
                    uuid: d.uuid.as_str().into(),
                    gpu_uuid: d.uuid.as_str().into(),
                    memory_used_bytes: 1 << 30,
                    sm_util: Some(10),
                    mem_util: Some(5),
                    enc_util: Some(0),
                    dec_util: Some(0),
                    pids: vec![1000 + c],
                    gpu_time_seconds: Some(12.5),
                    memory_byte_seconds: 1e12,
                    counters_since_ms: 1,
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    Snapshot {
        taken_at_ms: 1_700_000_000_000,
        nvml: SourceStatus::Ok,
        devices,
        containers,
        ..Default::default()
    }
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn main() {
    // CONTAINERS [GPUS]: each container uses every GPU (8 by default).
    let nums: Vec<u32> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let n = nums.first().copied().unwrap_or(200);
    let gpus = nums.get(1).copied().unwrap_or(8);
    let snap = synthetic_snapshot(n, gpus);
    let stats = gpu_model::AgentStats {
        started_ms: 1,
        ..Default::default()
    };
    let ctx = otel::otlp::ExportContext {
        node: otel::NodeIdentity {
            host_name: "node-1".into(),
            node_name: Some("node-1".into()),
        },
        service_name: "gpu-agent".into(),
        ..Default::default()
    };
    let iters = 50;
    let mut bytes = 0;
    // One `Reuse` for every export, as the export loop has: each request's buffer is made the
    // last export's size at once. Off, as at the default interval: every export is encoded.
    let mut reuse = otel::otlp::Reuse::off();
    let cpu0 = thread_cpu_ns();
    for _ in 0..iters {
        bytes = otel::otlp::requests(&snap, &stats, &ctx, 0, usize::MAX, &mut reuse)
            .map(|r| r.len())
            .sum();
    }
    let build_us = (thread_cpu_ns() - cpu0) as f64 / iters as f64 / 1000.0;
    // /metrics as it is served: the stream of chunks, consumed (dcgm-exporter's default
    // fields on, every container allocated its GPUs as dcgm's pod labels need).
    let prom = std::sync::Arc::new(otel::prometheus::PromOptions {
        node: ctx.node.clone(),
        groups: otel::Groups::default(),
        dcgm: Some(otel::dcgm::DcgmCompat::defaults(otel::dcgm::Mode::Default)),
    });
    let snap = std::sync::Arc::new(snap);
    let mut prom_bytes = 0;
    let cpu0 = thread_cpu_ns();
    for _ in 0..iters {
        prom_bytes = otel::prometheus::chunks(snap.clone(), stats.clone(), prom.clone())
            .map(|c| c.len())
            .sum();
    }
    let prom_us = (thread_cpu_ns() - cpu0) as f64 / iters as f64 / 1000.0;
    println!("BENCH containers={n} gpus={gpus} build_us={build_us:.0} bytes={bytes} prom_us={prom_us:.0} prom_bytes={prom_bytes}");
}
