//! Usage records as OTLP log records (opentelemetry-proto's logs service): one log record
//! per record, on the container's resource so that the Collector's k8sattributes processor
//! enriches it and any logs pipeline can route it to a store. Sent with the logs' own
//! settings (`Signal::Logs`: their endpoint, or the base endpoint's `/v1/logs`), with a
//! queue bounded in records that survives a collector outage; what falls off the queue is
//! counted.
use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc, RwLock,
    },
    time::{Duration, Instant},
};

use gpu_model::{ContainerUsage, SourceStatus, UsageRecord, Workload, WorkloadKind};
use opentelemetry_proto::tonic::{
    collector::logs::v1::{logs_service_client::LogsServiceClient, ExportLogsServiceRequest},
    common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue},
    logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber},
    resource::v1::Resource,
};
use prost::Message;

use crate::{
    export::{
        grpc_channel, grpc_error, grpc_request, http_client, post_http, read_ca, OtlpSettings,
        Protocol, SendError,
    },
    otlp::{container_attributes, kv, ExportContext},
    settings::redact_url,
};

/// Usage-record counters and the state of each destination, shared with the agent's
/// stats.
#[derive(Debug, Default)]
pub struct UsageCounters {
    /// Records the join emitted.
    pub emitted: AtomicU64,
    /// Copies given up for good, one per destination that gave up: a queue over its bound
    /// (the collector or the file failing meanwhile), refused by the collector, still
    /// queued at exit, or the sink's channel full.
    pub dropped: AtomicU64,
    /// Records waiting for the collector.
    pub queued: AtomicU64,
    /// Records the collector accepted.
    pub sent: AtomicU64,
    /// Records appended to the file.
    pub written: AtomicU64,
    /// Records waiting for the file (it failed: a full disk).
    pub file_queued: AtomicU64,
    /// The file's state: `disabled` (no `usage.file`), `ok`, `unavailable: <error>`.
    pub file: RwLock<SourceStatus>,
    /// The collector's, for usage records: `disabled` (no logs endpoint), `ok` (the last
    /// send went through), `unavailable: <error>`.
    pub logs: RwLock<SourceStatus>,
}

/// The log record attributes of a usage record, besides `hw.id` and `hw.parent`
/// (docs/usage.md lists them).
pub const RECORD_ATTRIBUTES: [&str; 10] = [
    "gpu_agent.usage.start_ms",
    "gpu_agent.usage.end_ms",
    "gpu_agent.usage.duration_s",
    "gpu_agent.usage.gpu_seconds",
    "gpu_agent.usage.memory_byte_seconds",
    "gpu_agent.usage.memory_peak_bytes",
    "gpu_agent.usage.energy_joules",
    "gpu_agent.usage.accounted_processes",
    "gpu_agent.usage.accounted_gpu_seconds",
    "gpu_agent.usage.reason",
];

/// The profile's attributes: its SM percentiles and the device's model and memory, the part
/// of a GPU allocated, the MIG profile, the workload and the DRA claim, each where the
/// record knows it; the memory's p95 always.
pub const PROFILE_ATTRIBUTES: [&str; 12] = [
    "gpu_agent.usage.sm_p50",
    "gpu_agent.usage.sm_p95",
    "gpu_agent.usage.sm_max",
    "gpu_agent.usage.memory_p95_bytes",
    "hw.model",
    "gpu_agent.usage.device_memory_bytes",
    "gpu_agent.usage.gpus_allocated",
    "gpu_agent.usage.mig_profile",
    "gpu_agent.usage.workload_kind",
    "gpu_agent.usage.workload",
    "gpu_agent.usage.claim",
    "gpu_agent.usage.claim_namespace",
];

/// The `event.name`-like body prefix, so that a log query can pick the records out.
pub const EVENT_NAME: &str = "gpu_agent.usage_record";

fn int(key: &str, v: i64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(v)),
        }),
        ..Default::default()
    }
}

fn double(key: &str, v: f64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::DoubleValue(v)),
        }),
        ..Default::default()
    }
}

/// The container a record belongs to, as the metrics' resources name it.
fn owner_of(r: &UsageRecord) -> ContainerUsage {
    ContainerUsage {
        container_id: r.container_id.as_deref().map(Into::into),
        pod_uid: r.pod_uid.as_deref().map(Into::into),
        pod_name: r.pod_name.as_deref().map(Into::into),
        namespace: r.namespace.as_deref().map(Into::into),
        container_name: r.container_name.as_deref().map(Into::into),
        workload: workload_of(r),
        ..Default::default()
    }
}

/// The record's pod owner, for its resource's `k8s.*.name` attributes.
fn workload_of(r: &UsageRecord) -> Option<Arc<Workload>> {
    let kind = r.workload_kind.as_deref().and_then(WorkloadKind::parse)?;
    Some(Arc::new(Workload {
        kind,
        name: r.workload.as_deref()?.into(),
        replicaset: r.replicaset.as_deref().map(Into::into),
        job: r.job.as_deref().map(Into::into),
    }))
}

/// One log record: the JSON line as its body, the values as attributes.
pub fn log_record(r: &UsageRecord, observed_ms: u64) -> LogRecord {
    let [start, end, duration, gpu_s, mem_bs, peak, energy, procs, acct_s, reason] =
        RECORD_ATTRIBUTES;
    let mut attributes = vec![
        kv("event.name", EVENT_NAME),
        kv("hw.id", r.uuid.clone()),
        int(start, r.start_ms as i64),
        int(end, r.end_ms as i64),
        double(
            duration,
            r.end_ms.saturating_sub(r.start_ms) as f64 / 1000.0,
        ),
        double(mem_bs, r.memory_byte_seconds),
        int(peak, r.memory_peak_bytes as i64),
        double(energy, r.energy_joules),
        int(procs, r.accounted_processes as i64),
        double(acct_s, r.accounted_gpu_seconds),
        kv(reason, r.reason.clone()),
    ];
    // Absent where the device cannot say its processes' SM utilization (MIG).
    if let Some(s) = r.gpu_seconds {
        attributes.push(double(gpu_s, s));
    }
    if r.gpu_uuid != r.uuid {
        attributes.push(kv("hw.parent", r.gpu_uuid.clone()));
    }
    profile_attributes(r, &mut attributes);
    LogRecord {
        time_unix_nano: r.end_ms * 1_000_000,
        observed_time_unix_nano: observed_ms * 1_000_000,
        severity_number: SeverityNumber::Info as i32,
        severity_text: "INFO".into(),
        body: Some(AnyValue {
            value: Some(any_value::Value::StringValue(
                serde_json::to_string(r).unwrap_or_default(),
            )),
        }),
        attributes,
        ..Default::default()
    }
}

/// `PROFILE_ATTRIBUTES`, each where the record knows it.
fn profile_attributes(r: &UsageRecord, out: &mut Vec<KeyValue>) {
    let [p50, p95, max, mem_p95, model, dev_mem, alloc, mig, kind, workload, claim, claim_ns] =
        PROFILE_ATTRIBUTES;
    for (key, v) in [(p50, r.sm_p50), (p95, r.sm_p95), (max, r.sm_max)] {
        out.extend(v.map(|v| int(key, v as i64)));
    }
    out.push(int(mem_p95, r.memory_p95_bytes as i64));
    out.extend(r.device_memory_bytes.map(|v| int(dev_mem, v as i64)));
    out.extend(r.gpus_allocated.map(|v| double(alloc, v)));
    for (key, v) in [
        (model, &r.device_model),
        (mig, &r.mig_profile),
        (kind, &r.workload_kind),
        (workload, &r.workload),
        (claim, &r.claim),
        (claim_ns, &r.claim_namespace),
    ] {
        out.extend(v.as_ref().map(|v| kv(key, v.clone())));
    }
}

/// One request for a batch: one resource per container, its records under it.
pub fn build_logs_request(
    records: &[UsageRecord],
    ctx: &ExportContext,
    now_ms: u64,
) -> ExportLogsServiceRequest {
    let mut resource_logs: Vec<ResourceLogs> = vec![];
    let mut keys: Vec<(Option<String>, Option<String>)> = vec![];
    for r in records {
        let key = (r.container_id.clone(), r.pod_uid.clone());
        let i = match keys.iter().position(|k| *k == key) {
            Some(i) => i,
            None => {
                keys.push(key);
                resource_logs.push(ResourceLogs {
                    resource: Some(Resource {
                        attributes: container_attributes(ctx, &owner_of(r)),
                        ..Default::default()
                    }),
                    scope_logs: vec![ScopeLogs {
                        scope: Some(InstrumentationScope {
                            name: "gpu-agent".into(),
                            version: env!("CARGO_PKG_VERSION").into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                });
                resource_logs.len() - 1
            }
        };
        resource_logs[i].scope_logs[0]
            .log_records
            .push(log_record(r, now_ms));
    }
    ExportLogsServiceRequest { resource_logs }
}

enum Transport {
    Grpc(LogsServiceClient<tonic::transport::Channel>),
    Http(reqwest::Client),
}

/// The transport in `slot`, made first if it is not there yet.
fn connect<'a>(
    slot: &'a mut Option<Transport>,
    settings: &OtlpSettings,
) -> Result<&'a mut Transport, String> {
    if slot.is_none() {
        let ca = read_ca(settings)?;
        let url = &settings.url;
        *slot = Some(match settings.protocol {
            Protocol::Grpc => {
                let shown = format!("OTLP logs endpoint {}", redact_url(url));
                let channel = grpc_channel(url, &shown, settings, ca.as_deref())?;
                let mut client = LogsServiceClient::new(channel);
                if settings.gzip {
                    client = client.send_compressed(tonic::codec::CompressionEncoding::Gzip);
                }
                Transport::Grpc(client)
            }
            Protocol::HttpProtobuf => Transport::Http(http_client(settings, ca.as_deref())?),
        });
    }
    Ok(slot.as_mut().unwrap())
}

/// Sends usage records as OTLP logs; keeps up to `max_queued` records while the collector
/// is down, dropping (and counting) the oldest beyond that.
pub struct LogsExporter {
    settings: OtlpSettings,
    ctx: ExportContext,
    /// Made at the first send: a failure to make it (no TLS roots, the CA bundle gone) is
    /// a failed send, retried as the collector being down is.
    transport: Option<Transport>,
    queue: VecDeque<UsageRecord>,
    max_queued: usize,
    backoff: Duration,
    next_attempt: Instant,
    counters: Arc<UsageCounters>,
}

const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(120);
/// Records per request.
const BATCH: usize = 512;

impl LogsExporter {
    /// To the logs settings' URL (`OtlpConfig::resolve_signal(Signal::Logs, ..)`). Nothing
    /// connects yet.
    pub fn new(
        settings: OtlpSettings,
        ctx: ExportContext,
        max_queued: usize,
        counters: Arc<UsageCounters>,
    ) -> LogsExporter {
        LogsExporter {
            settings,
            ctx,
            transport: None,
            queue: VecDeque::new(),
            max_queued: max_queued.max(1),
            backoff: BACKOFF_MIN,
            next_attempt: Instant::now(),
            counters,
        }
    }

    /// The logs URL with any credentials in it masked, for logs and errors.
    pub fn redacted_url(&self) -> String {
        self.settings.redacted_url()
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// When a retry is due: None when nothing waits.
    pub fn next_attempt(&self) -> Option<Instant> {
        (!self.queue.is_empty()).then_some(self.next_attempt)
    }

    /// Queues a record; beyond the bound the oldest is dropped and counted.
    pub fn push(&mut self, r: UsageRecord) {
        self.queue.push_back(r);
        while self.queue.len() > self.max_queued {
            self.queue.pop_front();
            self.counters.dropped.fetch_add(1, Relaxed);
        }
        self.counters.queued.store(self.queue.len() as u64, Relaxed);
    }

    /// Sends what is queued, oldest first, unless backing off. Returns false while the
    /// collector is unreachable (the records stay queued).
    pub async fn flush(&mut self, ignore_backoff: bool, now_ms: u64) -> bool {
        if !ignore_backoff && Instant::now() < self.next_attempt {
            return self.queue.is_empty();
        }
        while !self.queue.is_empty() {
            let n = self.queue.len().min(BATCH);
            let batch: Vec<UsageRecord> = self.queue.iter().take(n).cloned().collect();
            let req = build_logs_request(&batch, &self.ctx, now_ms);
            let result = self.send(req).await;
            let status = match &result {
                Ok(()) => SourceStatus::Ok,
                Err(
                    SendError::Permanent(e) | SendError::TooLarge(e) | SendError::Retryable(e, _),
                ) => SourceStatus::Unavailable(e.clone()),
            };
            *self.counters.logs.write().unwrap() = status;
            match result {
                Ok(()) => {
                    self.queue.drain(..n);
                    self.counters.sent.fetch_add(n as u64, Relaxed);
                    if self.backoff > BACKOFF_MIN {
                        tracing::info!(url = %self.redacted_url(), "OTLP usage records: sending again");
                    }
                    self.backoff = BACKOFF_MIN;
                }
                Err(SendError::Permanent(e) | SendError::TooLarge(e)) => {
                    tracing::warn!(url = %self.redacted_url(), records = n,
                        "OTLP usage records rejected and dropped: {e}");
                    self.queue.drain(..n);
                    self.counters.dropped.fetch_add(n as u64, Relaxed);
                }
                Err(SendError::Retryable(e, after)) => {
                    if self.backoff == BACKOFF_MIN {
                        tracing::warn!(url = %self.redacted_url(), queued = self.queue.len(),
                            "OTLP usage records not sent, kept and retried: {e}");
                    }
                    // The collector's Retry-After is honoured within the backoff bounds.
                    let wait = after.map_or(self.backoff, |a| a.clamp(self.backoff, BACKOFF_MAX));
                    self.next_attempt = Instant::now() + wait;
                    self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                    break;
                }
            }
        }
        self.counters.queued.store(self.queue.len() as u64, Relaxed);
        self.queue.is_empty()
    }

    async fn send(&mut self, req: ExportLogsServiceRequest) -> Result<(), SendError> {
        let settings = &self.settings;
        match connect(&mut self.transport, settings).map_err(|e| SendError::Retryable(e, None))? {
            Transport::Grpc(client) => client
                .export(grpc_request(req, settings))
                .await
                .map(|_| ())
                .map_err(grpc_error),
            Transport::Http(client) => {
                post_http(client, &settings.url, settings, req.encode_to_vec().into()).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{export::OtlpConfig, settings::Signal};

    fn record(reason: &str) -> UsageRecord {
        UsageRecord {
            container_id: Some("c".repeat(64)),
            pod_uid: Some("uid-1".into()),
            pod_name: Some("trainer-0".into()),
            namespace: Some("ml".into()),
            container_name: Some("main".into()),
            uuid: "MIG-1".into(),
            gpu_uuid: "GPU-1".into(),
            start_ms: 1_000,
            end_ms: 61_000,
            gpu_seconds: Some(30.0),
            memory_byte_seconds: 6e10,
            memory_peak_bytes: 1 << 30,
            energy_joules: 12_000.0,
            reason: reason.into(),
            ..Default::default()
        }
    }

    fn settings(url: &str, protocol: &str) -> OtlpSettings {
        OtlpConfig {
            endpoint: Some(url.into()),
            protocol: Some(protocol.into()),
            ..Default::default()
        }
        .resolve_signal(Signal::Logs, |_| None)
        .unwrap()
        .unwrap()
    }

    #[test]
    fn one_log_record_per_record_on_its_container_resource() {
        let ctx = ExportContext {
            service_name: "gpu-agent".into(),
            ..Default::default()
        };
        let req = build_logs_request(&[record("exited"), record("exited")], &ctx, 99_000);
        assert_eq!(req.resource_logs.len(), 1, "one container, one resource");
        let rl = &req.resource_logs[0];
        let keys: Vec<&str> = rl
            .resource
            .as_ref()
            .unwrap()
            .attributes
            .iter()
            .map(|k| k.key.as_str())
            .collect();
        assert!(
            keys.contains(&"container.id") && keys.contains(&"k8s.namespace.name"),
            "{keys:?}"
        );
        let logs = &rl.scope_logs[0].log_records;
        assert_eq!(logs.len(), 2);
        assert_eq!(logs[0].time_unix_nano, 61_000 * 1_000_000);
        let body = match &logs[0].body.as_ref().unwrap().value {
            Some(any_value::Value::StringValue(s)) => s.clone(),
            other => panic!("{other:?}"),
        };
        let back: UsageRecord = serde_json::from_str(&body).unwrap();
        assert_eq!(back, record("exited"));
        let a = &logs[0].attributes;
        assert!(a.iter().any(|k| k.key == "hw.parent"));
        for key in RECORD_ATTRIBUTES {
            assert!(a.iter().any(|k| k.key == key), "{key}");
        }
        // The record has no profile: none of what it does not know is sent as 0 or empty.
        for key in PROFILE_ATTRIBUTES {
            let sent = a.iter().any(|k| k.key == key);
            assert_eq!(sent, key == "gpu_agent.usage.memory_p95_bytes", "{key}");
        }
        let profiled = UsageRecord {
            sm_p50: Some(10),
            sm_p95: Some(35),
            sm_max: Some(60),
            memory_p95_bytes: 1 << 29,
            device_model: Some("NVIDIA H100 80GB HBM3".into()),
            device_memory_bytes: Some(80 << 30),
            gpus_allocated: Some(0.25),
            mig_profile: Some("1g.10gb".into()),
            workload_kind: Some("Deployment".into()),
            workload: Some("chat".into()),
            claim: Some("chat-gpu".into()),
            claim_namespace: Some("ml".into()),
            ..record("exited")
        };
        let a = log_record(&profiled, 99_000).attributes;
        for key in PROFILE_ATTRIBUTES {
            assert!(a.iter().any(|k| k.key == key), "{key}");
        }
        // A MIG device cannot say its processes' SM utilization: no GPU seconds, not 0.
        let mig = UsageRecord {
            gpu_seconds: None,
            ..record("exited")
        };
        let log = log_record(&mig, 99_000);
        let gpu_s = RECORD_ATTRIBUTES[3];
        assert!(!log.attributes.iter().any(|k| k.key == gpu_s));
        let body = match &log.body.as_ref().unwrap().value {
            Some(any_value::Value::StringValue(s)) => s.clone(),
            other => panic!("{other:?}"),
        };
        assert!(body.contains("\"gpu_seconds\":null"), "{body}");
        // The pod's owner on the resource, as on the metrics'.
        let cron = UsageRecord {
            workload_kind: Some("CronJob".into()),
            workload: Some("nightly".into()),
            job: Some("nightly-28948930".into()),
            ..record("exited")
        };
        let req = build_logs_request(&[cron], &ctx, 99_000);
        let attrs = &req.resource_logs[0].resource.as_ref().unwrap().attributes;
        let text = |key: &str| {
            let kv = attrs.iter().find(|kv| kv.key == key)?;
            match kv.value.as_ref()?.value.as_ref()? {
                any_value::Value::StringValue(s) => Some(s.clone()),
                _ => None,
            }
        };
        assert_eq!(text("k8s.cronjob.name").as_deref(), Some("nightly"));
        assert_eq!(text("k8s.job.name").as_deref(), Some("nightly-28948930"));
    }

    #[test]
    fn the_queue_is_bounded_and_kept_while_the_collector_is_down() {
        let s = settings("http://127.0.0.1:9", "http/protobuf");
        let counters = Arc::new(UsageCounters::default());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut ex = LogsExporter::new(s, ExportContext::default(), 3, counters.clone());
            for _ in 0..5 {
                ex.push(record("exited"));
            }
            assert_eq!(ex.queued(), 3);
            assert_eq!(counters.dropped.load(Relaxed), 2);
            // Port 9 refuses: kept for a retry, nothing more lost.
            assert!(!ex.flush(true, 1).await);
            assert_eq!(ex.queued(), 3);
            assert_eq!(counters.dropped.load(Relaxed), 2);
            assert_eq!(counters.queued.load(Relaxed), 3);
            let st = counters.logs.read().unwrap().clone();
            assert!(st.reason().is_some(), "{st}");
        });
    }
}
