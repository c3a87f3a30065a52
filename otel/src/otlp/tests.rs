//! The OTLP encoding end to end: the requests' resources, points and attributes, decoded
//! as prost reads them; their splitting by size; and the last export's requests patched.
use gpu_model::{
    AgentStats, ContainerGpu, ContainerUsage, ContainerXid, DeviceSample, DeviceStatus, Snapshot,
    Workload, WorkloadKind,
};
use opentelemetry_proto::tonic::{
    collector::metrics::v1::ExportMetricsServiceRequest,
    metrics::v1::{metric::Data, number_data_point, ResourceMetrics},
};
use prost::Message;

use super::{
    batch::{is_host, MAX_MOVES},
    *,
};

#[test]
fn an_export_splits_into_requests_of_whole_resources_that_add_up_to_the_one() {
    let mut sn = snap();
    let c = sn.containers.iter().find(|c| !is_host(c)).unwrap().clone();
    sn.containers = (0..60)
        .map(|i| ContainerUsage {
            container_id: Some(format!("{i:064x}").into()),
            ..c.clone()
        })
        .collect();
    let stats = AgentStats::default();
    let whole = encode_request(&sn, &stats, &ctx(), 1);
    let max = whole.len() / 5;
    let parts: Vec<Vec<u8>> =
        requests(&sn, &stats, &ctx(), 1, max, &mut Reuse::default()).collect();
    assert!(parts.len() >= 5, "{} requests", parts.len());
    assert_eq!(
        parts.concat(),
        whole,
        "the same resources, in the same order"
    );
    let resources = |b: &[u8]| {
        ExportMetricsServiceRequest::decode(b)
            .unwrap()
            .resource_metrics
            .len()
    };
    assert_eq!(
        parts.iter().map(|p| resources(p)).sum::<usize>(),
        resources(&whole)
    );
    assert!(parts[..parts.len() - 1].iter().all(|p| p.len() >= max));
    assert!(
        parts.iter().all(|p| p.len() < max + 4096),
        "closed at max_bytes"
    );
    // Nothing to say: one empty request, as before.
    let quiet = ExportContext {
        groups: crate::Groups {
            device: false,
            container: false,
            process: false,
            self_metrics: false,
            drop_attributes: vec![],
        },
        ..ctx()
    };
    let empty: Vec<Vec<u8>> = requests(
        &Snapshot::default(),
        &stats,
        &quiet,
        1,
        max,
        &mut Reuse::default(),
    )
    .collect();
    assert_eq!(
        empty,
        [encode_request(&Snapshot::default(), &stats, &quiet, 1)]
    );
}

/// The hand-written encoding is byte for byte what prost writes for the same message.
#[test]
fn the_encoding_is_what_prost_writes() {
    use gpu_model::{ContainerXid, GpmMetrics, MigSample, XidCount};
    let mut sn = snap();
    let d = &mut sn.devices[0];
    d.fields.xid_errors = Some(vec![XidCount { xid: 79, count: 2 }]);
    d.fields.gpm = Some(GpmMetrics {
        sm_active: Some(0.5),
        ..Default::default()
    });
    d.throttle_reasons = Some(0x20);
    d.sharing.idle_energy_joules = Some(4.0);
    d.mig_devices = vec![MigSample {
        uuid: "MIG-1".into(),
        memory_used_bytes: Some(0),
        ..Default::default()
    }];
    sn.containers[0].allocated_gpus = vec!["GPU-a".into()].into();
    sn.containers[0].accounts = vec![gpu_model::GpuAccount {
        uuid: "GPU-a".into(),
        gpu_uuid: "GPU-a".into(),
        energy_joules: 6.0,
        energy_since_ms: 1_500,
        ..Default::default()
    }];
    sn.container_xids = ["c1", "gone"]
        .map(|id| ContainerXid {
            container_id: Some(id.into()),
            pod_uid: Some("p1".into()),
            uuid: "GPU-a".into(),
            gpu_uuid: "GPU-a".into(),
            xid: 43,
            count: 1,
            ..Default::default()
        })
        .into();
    sn.processes = vec![gpu_model::ProcessUsage {
        pid: 7,
        container_id: Some("c1".into()),
        pod_uid: Some("p1".into()),
        uuid: "GPU-a".into(),
        comm: None,
        used_memory_bytes: 1 << 20,
        sm_util: Some(3),
        mem_util: None,
        enc_util: None,
        dec_util: None,
        exited: false,
    }];
    let mut cx = ctx();
    cx.groups.process = true;
    cx.resource_attributes = vec![("deployment.environment".into(), "prod".into())];
    let stats = AgentStats {
        started_ms: 5,
        events_received: 3,
        ..Default::default()
    };
    for drop in [
        vec![],
        vec!["hw.gpu.index".to_string(), "k8s.pod.uid".into()],
    ] {
        cx.groups.drop_attributes = drop;
        let bytes = encode_request(&sn, &stats, &cx, 9);
        let decoded = ExportMetricsServiceRequest::decode(&bytes[..]).unwrap();
        assert_eq!(
            decoded.resource_metrics.len(),
            3,
            "the node (with the host entry), c1, gone"
        );
        assert_eq!(decoded.encode_to_vec(), bytes);
    }
}

fn snap() -> Snapshot {
    Snapshot {
        taken_at_ms: 2_000,
        devices: vec![DeviceSample {
            uuid: "GPU-a".into(),
            name: "H100".into(),
            status: DeviceStatus::Ok,
            memory_used_bytes: Some(7),
            ..Default::default()
        }],
        containers: vec![
            ContainerUsage {
                container_id: Some("c1".into()),
                pod_uid: Some("p1".into()),
                runtime: Some("cri-o"),
                gpus: vec![ContainerGpu {
                    uuid: "MIG-1".into(),
                    gpu_uuid: "GPU-a".into(),
                    memory_used_bytes: 3,
                    sm_util: None,
                    mem_util: None,
                    enc_util: None,
                    dec_util: None,
                    pids: vec![1],
                    // A MIG device cannot say its processes' SM utilization.
                    gpu_time_seconds: None,
                    memory_byte_seconds: 9.0,
                    counters_since_ms: 1_000,
                }],
                ..Default::default()
            },
            ContainerUsage {
                ..Default::default()
            },
        ],
        ..Default::default()
    }
}

fn ctx() -> ExportContext {
    ExportContext {
        node: NodeIdentity {
            host_name: "h".into(),
            node_name: Some("n".into()),
        },
        service_name: "gpu-agent".into(),
        groups: Groups::default(),
        ..Default::default()
    }
}

fn names(rm: &ResourceMetrics) -> Vec<&str> {
    rm.scope_metrics[0]
        .metrics
        .iter()
        .map(|m| m.name.as_str())
        .collect()
}

#[test]
fn one_resource_for_the_node_and_one_per_container() {
    let stats = AgentStats {
        started_ms: 500,
        ..Default::default()
    };
    let r = build_request(&snap(), &stats, &ctx(), 0);
    assert_eq!(r.resource_metrics.len(), 2);
    let c = &r.resource_metrics[1];
    let keys: Vec<&str> = c
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .map(|k| k.key.as_str())
        .collect();
    assert!(
        keys.contains(&"container.id")
            && keys.contains(&"k8s.pod.uid")
            && keys.contains(&"k8s.node.name")
    );
    let time = c.scope_metrics[0]
        .metrics
        .iter()
        .find(|m| m.name == "container.gpu.memory.time")
        .unwrap();
    let Some(Data::Sum(s)) = &time.data else {
        panic!()
    };
    assert_eq!(
        s.data_points[0].start_time_unix_nano,
        1_000 * MS,
        "since the container was first seen"
    );
    assert_eq!(s.data_points[0].time_unix_nano, 2_000 * MS);
    // MIG: charged to the MIG device, parent named.
    let a = &s.data_points[0].attributes;
    assert!(a.iter().any(|k| k.key == "hw.parent"));
    // No utilization known, nor GPU time: no point rather than a zero.
    assert!(!names(c).contains(&"container.gpu.utilization"));
    assert!(!names(c).contains(&"container.gpu.time"));
    assert!(names(&r.resource_metrics[0]).contains(&"hw.gpu.memory.usage"));
}

#[test]
fn energy_limits_and_the_idle_entry() {
    let mut sn = snap();
    sn.devices[0].sharing.idle_energy_joules = Some(40.0);
    sn.containers[0].accounts = vec![gpu_model::GpuAccount {
        uuid: "MIG-1".into(),
        gpu_uuid: "GPU-a".into(),
        energy_joules: 60.0,
        energy_since_ms: 1_500,
        memory_limit_bytes: Some(10),
        memory_limit_source: Some(gpu_model::LimitSource::Mig),
        ..Default::default()
    }];
    let r = build_request(&sn, &AgentStats::default(), &ctx(), 0);
    let point = |rm: &ResourceMetrics, name: &str| {
        let m = rm.scope_metrics[0].metrics.iter().find(|m| m.name == name);
        match m.and_then(|m| m.data.clone()) {
            Some(Data::Sum(s)) => s.data_points[0].clone(),
            other => panic!("{name}: {other:?}"),
        }
    };
    let e = point(&r.resource_metrics[1], "container.gpu.energy");
    assert_eq!(e.start_time_unix_nano, 1_500 * MS);
    assert!(e.attributes.iter().any(|k| k.key == "hw.parent"));
    let l = point(&r.resource_metrics[1], "container.gpu.memory.limit");
    assert!(l.attributes.iter().any(|k| k.key == "limit.source"));
    // The idle entry is on the node resource, told apart by its owner.
    let idle = point(&r.resource_metrics[0], "container.gpu.energy");
    assert!(idle.attributes.iter().any(|k| k.key == "gpu_agent.owner"
        && k.value
            == Some(AnyValue {
                value: Some(any_value::Value::StringValue("idle".into()))
            })));
}

#[test]
fn groups_and_dropped_attributes_apply() {
    let mut cx = ctx();
    cx.groups.device = false;
    cx.groups.drop_attributes = vec!["k8s.node.name".into(), "hw.parent".into()];
    let r = build_request(&snap(), &AgentStats::default(), &cx, 0);
    assert!(!names(&r.resource_metrics[0]).contains(&"hw.gpu.memory.usage"));
    for rm in &r.resource_metrics {
        assert!(rm
            .resource
            .as_ref()
            .unwrap()
            .attributes
            .iter()
            .all(|k| k.key != "k8s.node.name"));
        for m in &rm.scope_metrics[0].metrics {
            let pts = match &m.data {
                Some(Data::Gauge(g)) => &g.data_points,
                Some(Data::Sum(s)) => &s.data_points,
                _ => continue,
            };
            assert!(pts
                .iter()
                .all(|p| p.attributes.iter().all(|k| k.key != "hw.parent")));
        }
    }
}

/// The health, profiling and XID values reach OTLP under their semantic-convention
/// style names, and an XID charged to a container that is gone keeps a resource.
#[test]
fn health_profiling_and_xids_in_otlp() {
    use gpu_model::{ContainerXid, GpmMetrics, XidCount};
    let mut sn = snap();
    let f = &mut sn.devices[0].fields;
    f.pcie_replay = Some(4);
    f.xid_errors = Some(vec![XidCount { xid: 79, count: 2 }]);
    f.gpm = Some(GpmMetrics {
        sm_active: Some(0.5),
        pcie_tx_mibps: Some(2.0),
        ..Default::default()
    });
    sn.devices[0].throttle_reasons = Some(0x20);
    sn.container_xids = vec![ContainerXid {
        container_id: Some("gone".into()),
        pod_uid: Some("p9".into()),
        uuid: "GPU-a".into(),
        gpu_uuid: "GPU-a".into(),
        xid: 43,
        count: 1,
        ..Default::default()
    }];
    let r = build_request(&sn, &AgentStats::default(), &ctx(), 0);
    let points = |rm: &ResourceMetrics, name: &str| -> Vec<(Vec<(String, String)>, f64)> {
        let m = rm.scope_metrics[0].metrics.iter().find(|m| m.name == name);
        let pts = match m.and_then(|m| m.data.as_ref()) {
            Some(Data::Gauge(g)) => &g.data_points,
            Some(Data::Sum(s)) => &s.data_points,
            _ => return vec![],
        };
        pts.iter()
            .map(|p| {
                let a = p.attributes.iter().map(|kv| {
                    let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                        Some(any_value::Value::StringValue(s)) => s.clone(),
                        Some(any_value::Value::IntValue(i)) => i.to_string(),
                        _ => String::new(),
                    };
                    (kv.key.clone(), v)
                });
                let v = match p.value {
                    Some(number_data_point::Value::AsDouble(v)) => v,
                    _ => f64::NAN,
                };
                (a.collect(), v)
            })
            .collect()
    };
    let node = &r.resource_metrics[0];
    let has = |pts: &[(Vec<(String, String)>, f64)], kv: (&str, &str), v: f64| {
        pts.iter()
            .any(|(a, x)| *x == v && a.iter().any(|(k, val)| k == kv.0 && val == kv.1))
    };
    let errors = points(node, "hw.errors");
    assert!(
        has(&errors, ("error.type", "pcie_replay"), 4.0),
        "{errors:?}"
    );
    assert!(has(&errors, ("xid", "79"), 2.0), "{errors:?}");
    let activity = points(node, "hw.gpu.activity");
    assert!(has(&activity, ("hw.gpu.engine", "sm"), 0.5), "{activity:?}");
    assert_eq!(
        activity.len(),
        1,
        "unknown activities have no point: {activity:?}"
    );
    let bw = points(node, "hw.gpu.bandwidth");
    assert!(
        has(&bw, ("network.io.direction", "transmit"), 2.0 * 1_048_576.0),
        "{bw:?}"
    );
    let throttled = points(node, "hw.gpu.clock.throttled");
    assert!(has(
        &throttled,
        ("hw.gpu.throttle_reason", "sw_thermal_slowdown"),
        1.0
    ));
    assert!(has(&throttled, ("hw.gpu.throttle_reason", "gpu_idle"), 0.0));
    // The gone container: a resource of its own with its XID count.
    let gone = r
        .resource_metrics
        .iter()
        .find(|rm| {
            rm.resource.as_ref().unwrap().attributes.iter().any(|kv| {
                kv.key == "container.id"
                    && kv.value.as_ref().and_then(|v| v.value.as_ref())
                        == Some(&any_value::Value::StringValue("gone".into()))
            })
        })
        .expect("a resource for the gone container");
    assert!(has(
        &points(gone, "container.gpu.errors"),
        ("xid", "43"),
        1.0
    ));
    // A stalled GPU (the sampler sends it without readings): said stalled and failed;
    // the same GPU answering says 0.
    assert!(has(
        &points(node, "gpu_agent.nvml.stalled"),
        ("hw.id", "GPU-a"),
        0.0
    ));
    let mut sn = snap();
    sn.devices[0].status = gpu_model::DeviceStatus::Stalled {
        call: "nvmlDeviceGetPowerUsage".into(),
        secs: 7,
    };
    let r = build_request(&sn, &AgentStats::default(), &ctx(), 0);
    let node = &r.resource_metrics[0];
    assert!(has(
        &points(node, "gpu_agent.nvml.stalled"),
        ("hw.id", "GPU-a"),
        1.0
    ));
    assert!(has(&points(node, "hw.status"), ("hw.state", "failed"), 1.0));
}

fn deployment(name: &str, replicaset: &str) -> std::sync::Arc<Workload> {
    std::sync::Arc::new(Workload {
        kind: WorkloadKind::Deployment,
        name: name.into(),
        replicaset: Some(replicaset.into()),
        job: None,
    })
}

#[test]
fn a_containers_resource_names_its_pods_owner_in_the_semantic_conventions() {
    let of = |kind, rs: Option<&str>, job: Option<&str>| {
        let c = ContainerUsage {
            container_id: Some("c".into()),
            workload: Some(std::sync::Arc::new(Workload {
                kind,
                name: "w".into(),
                replicaset: rs.map(Into::into),
                job: job.map(Into::into),
            })),
            ..Default::default()
        };
        let attrs = container_attributes(&ctx(), &c);
        let k8s = attrs
            .iter()
            .filter(|kv| kv.key.starts_with("k8s.") && kv.key != "k8s.node.name");
        let text = |kv: &KeyValue| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(any_value::Value::StringValue(v)) => format!("{}={v}", kv.key),
            v => panic!("{v:?}"),
        };
        k8s.map(text).collect::<Vec<_>>()
    };
    use WorkloadKind::*;
    assert_eq!(
        of(Deployment, Some("w-5d8f"), None),
        ["k8s.deployment.name=w", "k8s.replicaset.name=w-5d8f"]
    );
    assert_eq!(of(ReplicaSet, None, None), ["k8s.replicaset.name=w"]);
    assert_eq!(of(StatefulSet, None, None), ["k8s.statefulset.name=w"]);
    assert_eq!(of(DaemonSet, None, None), ["k8s.daemonset.name=w"]);
    assert_eq!(of(Job, None, None), ["k8s.job.name=w"]);
    assert_eq!(
        of(CronJob, None, Some("w-28948930")),
        ["k8s.cronjob.name=w", "k8s.job.name=w-28948930"]
    );
    assert!(
        of(Pod, None, None).is_empty(),
        "a bare pod has no owner to name"
    );
    // An attribute dropped by the config goes from every resource.
    let mut cx = ctx();
    cx.groups.drop_attributes = vec!["k8s.replicaset.name".into()];
    let c = ContainerUsage {
        container_id: Some("c".into()),
        workload: Some(deployment("w", "w-5d8f")),
        ..Default::default()
    };
    let keys: Vec<String> = container_attributes(&cx, &c)
        .into_iter()
        .map(|kv| kv.key)
        .collect();
    assert!(keys.contains(&"k8s.deployment.name".into()), "{keys:?}");
    assert!(!keys.contains(&"k8s.replicaset.name".into()), "{keys:?}");
}

/// A container of the kept-request test: `i` picks its devices and figures.
fn kept_container(i: u32, names: &[gpu_model::Name]) -> ContainerUsage {
    use gpu_model::{GpuAccount, LimitSource};
    let n = |k: usize| names[k % names.len()].clone();
    let mig = !i.is_multiple_of(3);
    let (uuid, gpu) = if mig { (n(1), n(0)) } else { (n(0), n(0)) };
    ContainerUsage {
        container_id: Some(format!("{i:064x}").into()),
        pod_uid: Some(format!("pod-{i}").into()),
        pod_name: (!i.is_multiple_of(4)).then(|| format!("trainer-{i}").into()),
        namespace: Some(n(2)),
        container_name: Some(n(3)),
        runtime: Some("containerd"),
        gpus: vec![ContainerGpu {
            uuid: uuid.clone(),
            gpu_uuid: gpu.clone(),
            memory_used_bytes: 1 << 30,
            sm_util: Some(10),
            mem_util: (i.is_multiple_of(2)).then_some(5),
            enc_util: None,
            dec_util: None,
            pids: vec![i, i + 1],
            gpu_time_seconds: Some(1.0),
            memory_byte_seconds: 2.0,
            counters_since_ms: 1_000 + i as u64,
        }],
        allocated_gpus: if i.is_multiple_of(5) {
            vec![uuid.clone()].into()
        } else {
            Default::default()
        },
        accounts: vec![GpuAccount {
            uuid,
            gpu_uuid: gpu,
            energy_joules: 3.0,
            energy_since_ms: if i.is_multiple_of(2) { 900 } else { 0 },
            memory_peak_bytes: Some(1 << 31),
            memory_limit_bytes: (i % 3 == 1).then_some(10 << 30),
            memory_limit_source: (i % 3 == 1).then_some(LimitSource::Mig),
            sm_limit_percent: None,
            accounted_processes: 0,
            accounted_gpu_seconds: 0.0,
            gpus_held: Some(1.0),
            sm_share: None,
        }],
        ..Default::default()
    }
}

/// `n` containers of the kept-request tests, the names they share, and the stats.
fn kept_snapshot(n: u32) -> (Snapshot, Vec<gpu_model::Name>, AgentStats) {
    let names: Vec<gpu_model::Name> = ["GPU-a", "MIG-b", "ml", "main"]
        .into_iter()
        .map(Into::into)
        .collect();
    let mut sn = snap();
    sn.containers = (0..n).map(|i| kept_container(i, &names)).collect();
    let stats = AgentStats {
        started_ms: 5,
        ..Default::default()
    };
    (sn, names, stats)
}

/// An XID charged to `c`.
fn xid_of(c: &ContainerUsage) -> ContainerXid {
    ContainerXid {
        container_id: c.container_id.as_deref().map(Into::into),
        pod_uid: c.pod_uid.as_deref().map(Into::into),
        uuid: "MIG-b".into(),
        gpu_uuid: "GPU-a".into(),
        xid: 79,
        count: 1,
        ..Default::default()
    }
}

/// An export of `sn` through `reuse`, in requests of `max` bytes, checked against a
/// fresh encoding and handed back: its requests' addresses, and how many resources it
/// patched.
fn export_kept(
    sn: &Snapshot,
    stats: &AgentStats,
    max: usize,
    reuse: &mut Reuse,
    what: &str,
) -> (Vec<usize>, usize) {
    let all: Vec<Vec<u8>> = requests(sn, stats, &ctx(), 1, max, reuse).collect();
    let want = encode_request(sn, stats, &ctx(), 1);
    assert!(
        all.concat() == want,
        "{what}: the requests are what a fresh encoding writes"
    );
    let n = all.len();
    let ptrs = all.iter().map(|r| r.as_ptr() as usize).collect();
    for r in all {
        reuse.give_back(r);
    }
    assert_eq!(reuse.holds(), n, "{what}: every request is taken back");
    (ptrs, reuse.patched)
}

#[test]
fn a_request_patched_from_the_last_is_what_a_fresh_encoding_writes() {
    patched_through_changes(false);
}

#[test]
fn an_export_of_several_requests_patches_each_from_the_last_export_s() {
    patched_through_changes(true);
}

#[test]
fn reuse_off_keeps_no_request_and_patches_nothing() {
    let (sn, _, stats) = kept_snapshot(12);
    let want = encode_request(&sn, &stats, &ctx(), 1);
    let mut reuse = Reuse::off();
    for round in 0..3 {
        let all: Vec<Vec<u8>> =
            requests(&sn, &stats, &ctx(), 1, want.len() / 3, &mut reuse).collect();
        assert!(all.len() > 1, "round {round}: {} requests", all.len());
        assert!(all.concat() == want, "round {round}: a fresh encoding");
        for r in all {
            reuse.give_back(r);
        }
        assert_eq!(reuse.holds(), 0, "round {round}: nothing kept");
        assert_eq!(reuse.patched, 0, "round {round}: nothing patched");
    }
    assert!(!reuse.is_on() && Reuse::default().is_on());
}

/// Seventeen changes in turn, each export checked (`export_kept`): in one request, or
/// (`split`) in requests of about three containers each.
fn patched_through_changes(split: bool) {
    use gpu_model::LimitSource;
    let (mut sn, _, stats) = kept_snapshot(12);
    sn.containers.insert(3, ContainerUsage::default());
    let one = encode_request(&sn, &stats, &ctx(), 1).len();
    let max = if split { one / 4 } else { 8 << 20 };
    let mut reuse = Reuse::default();
    let (mut last, none) = export_kept(&sn, &stats, max, &mut reuse, "first");
    assert_eq!(none, 0);
    assert_eq!(last.len() > 3, split, "{} requests", last.len());
    // Each change, and the request after it: the last one patched, in its buffer (past
    // more changes than are moved in place, the rest of it is encoded afresh).
    type Change = fn(&mut Snapshot);
    let changes: [(&str, Change); 20] = [
        ("numbers", |s| {
            s.taken_at_ms += 1_000;
            for (k, c) in s.containers.iter_mut().enumerate() {
                for g in &mut c.gpus {
                    g.memory_used_bytes += k as u64;
                    g.sm_util = Some(g.sm_util.unwrap_or(0) + 1);
                    *g.gpu_time_seconds.get_or_insert(0.0) += 0.5;
                    g.counters_since_ms += 1;
                    g.pids.push(7);
                }
                for a in &mut c.accounts {
                    a.energy_joules += 1.0;
                    a.memory_peak_bytes = Some(k as u64);
                }
            }
        }),
        ("a name the same, in another string", |s| {
            s.containers[5].namespace = Some("ml".into());
        }),
        ("a utilization now known", |s| {
            s.containers[2].gpus[0].enc_util = Some(1)
        }),
        ("a GPU time unknown (a MIG device's)", |s| {
            s.containers[4].gpus[0].gpu_time_seconds = None
        }),
        ("that GPU time known", |s| {
            s.containers[4].gpus[0].gpu_time_seconds = Some(3.0)
        }),
        (
            "a GPU time gone as a utilization came: as many points",
            |s| {
                let g = &mut s.containers[4].gpus[0];
                (g.gpu_time_seconds, g.dec_util) = (None, Some(2));
            },
        ),
        ("a pod named", |s| {
            s.containers[5].pod_name = Some("named".into())
        }),
        ("a pod's owner known", |s| {
            s.containers[5].workload = Some(deployment("web", "web-5d8f"))
        }),
        ("the same owner, in another Arc", |s| {
            s.containers[5].workload = Some(deployment("web", "web-5d8f"))
        }),
        ("another owner", |s| {
            s.containers[5].workload = Some(deployment("web", "web-7c9d"))
        }),
        ("a limit from another source", |s| {
            s.containers[2].accounts[0].memory_limit_bytes = Some(1);
            s.containers[2].accounts[0].memory_limit_source = Some(LimitSource::Hami);
        }),
        ("a container gone", |s| {
            s.containers.remove(6);
        }),
        ("nothing", |_| {}),
        ("a container come", |s| {
            let names = ["GPU-a", "MIG-b", "ml", "main"].map(Into::into);
            s.containers.insert(1, kept_container(40, &names));
        }),
        ("an allocation", |s| {
            s.containers[9].allocated_gpus = vec!["GPU-z".into()].into()
        }),
        ("the same two containers swapped", |s| {
            s.containers.swap(10, 11)
        }),
        ("the last container gone", |s| {
            s.containers.pop();
        }),
        ("an XID charged", |s| {
            let x = xid_of(&s.containers[8]);
            s.container_xids.push(x);
        }),
        ("most containers changed", |s| {
            for c in &mut s.containers {
                for g in &mut c.gpus {
                    g.dec_util = Some(g.dec_util.unwrap_or(0) + 1);
                }
            }
        }),
        ("nothing", |_| {}),
    ];
    for (what, change) in changes {
        change(&mut sn);
        let (now, patched) = export_kept(&sn, &stats, max, &mut reuse, what);
        // Each change touches two containers at most, but the last one's; the last
        // one, encoded afresh past the first ones, gets room for it (it may move).
        // Split, a request that closes a container earlier or later than it did
        // moves one container across the border to the next.
        let kept = sn.containers.iter().filter(|c| !is_host(c)).count();
        let slack = if split { 2 + now.len() } else { 2 };
        match what {
            "most containers changed" if !split => {
                assert!(patched < MAX_MOVES as usize, "{what}")
            }
            "most containers changed" => {}
            _ => {
                assert!(
                    patched + slack >= kept,
                    "{what}: {patched} of {kept} patched"
                );
                let n = now.len().min(last.len());
                assert_eq!(now[..n], last[..n], "{what}: the same buffers");
            }
        }
        last = now;
    }
}

#[test]
fn requests_patched_through_random_changes_are_what_fresh_encodings_write() {
    random_changes(false);
}

#[test]
fn split_requests_patched_through_random_changes_are_what_fresh_encodings_write() {
    random_changes(true);
}

/// 300 rounds of up to three random changes each, every export checked
/// (`export_kept`): in one request, or (`split`) in requests of about six containers.
fn random_changes(split: bool) {
    let (mut sn, names, stats) = kept_snapshot(30);
    let one = encode_request(&sn, &stats, &ctx(), 1).len();
    let max = if split { one / 5 } else { 8 << 20 };
    let mut reuse = Reuse::default();
    let mut patched = 0;
    // xorshift: the same sequence every run.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n.max(1) as u64) as usize
    };
    let mut next_id = 100;
    for round in 0..300 {
        sn.taken_at_ms += 1_000;
        for c in &mut sn.containers {
            for g in &mut c.gpus {
                g.memory_used_bytes += 1;
                if let Some(t) = &mut g.gpu_time_seconds {
                    *t += 0.25;
                }
            }
        }
        for _ in 0..rand(4) {
            let n = sn.containers.len();
            let i = rand(n);
            match rand(7) {
                0 if n > 2 => drop(sn.containers.remove(i)),
                1 => {
                    next_id += 1;
                    sn.containers.insert(i, kept_container(next_id, &names));
                }
                2 => sn.containers.swap(i, rand(n)),
                3 => {
                    let g = &mut sn.containers[i].gpus[0];
                    g.enc_util = g.enc_util.xor(Some(3));
                    // Its GPU time unknown, or known again.
                    g.gpu_time_seconds = g.gpu_time_seconds.xor(Some(1.0));
                }
                4 => {
                    let c = &mut sn.containers[i];
                    c.pod_name = Some(format!("p{round}").into());
                    let rs = format!("p-{}", round % 3);
                    c.workload = (round % 2 == 1).then(|| deployment("p", &rs));
                }
                5 => {
                    let a = &mut sn.containers[i].accounts[0];
                    a.sm_limit_percent = a.sm_limit_percent.xor(Some(50));
                }
                _ if sn.container_xids.is_empty() => {
                    let x = xid_of(&sn.containers[i]);
                    sn.container_xids.push(x);
                }
                _ => sn.container_xids.clear(),
            }
        }
        let (ptrs, n) = export_kept(&sn, &stats, max, &mut reuse, &format!("{round}"));
        assert_eq!(
            ptrs.len() > 3,
            split,
            "round {round}: {} requests",
            ptrs.len()
        );
        patched += n;
    }
    // Most of them are patched: about 30 containers and three changes a round.
    assert!(patched > 300 * 20, "{patched} patched");
}
