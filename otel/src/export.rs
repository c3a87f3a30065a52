//! Pushing OTLP: settings from the standard OTEL_* variables over the config file, gRPC
//! (tonic) or HTTP/protobuf (reqwest) with TLS through rustls, and a bounded queue that
//! retries with backoff while the collector is down and drops the oldest batches first.
//! Cumulative temporality means a dropped batch loses resolution, never totals.
use std::{
    collections::{BTreeMap, VecDeque},
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc,
    },
    time::{Duration, Instant},
};

use opentelemetry_proto::tonic::collector::metrics::v1::{
    metrics_service_client::MetricsServiceClient, ExportMetricsServiceRequest,
};
use prost::Message;
use serde::Deserialize;

/// The `[otlp]` section of the config file. Each key is overridden by its standard
/// environment variable when that is set.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OtlpConfig {
    /// Base URL (…:4317 for gRPC, …:4318 for HTTP). OTEL_EXPORTER_OTLP_ENDPOINT, or
    /// OTEL_EXPORTER_OTLP_METRICS_ENDPOINT (used as is). Unset: no push.
    pub endpoint: Option<String>,
    /// "grpc" or "http/protobuf" (default). OTEL_EXPORTER_OTLP_PROTOCOL.
    pub protocol: Option<String>,
    /// OTEL_EXPORTER_OTLP_HEADERS ("k=v,k2=v2").
    pub headers: BTreeMap<String, String>,
    /// Per-export timeout. OTEL_EXPORTER_OTLP_TIMEOUT (ms). Default 10000.
    pub timeout_ms: Option<u64>,
    /// Push interval. OTEL_METRIC_EXPORT_INTERVAL (ms). Default 60000.
    pub interval_ms: Option<u64>,
    /// Extra resource attributes. OTEL_RESOURCE_ATTRIBUTES ("k=v,k2=v2") adds to them.
    pub resource_attributes: BTreeMap<String, String>,
    /// CA bundle for https endpoints. OTEL_EXPORTER_OTLP_CERTIFICATE.
    pub certificate: Option<PathBuf>,
    /// "gzip" or "none". OTEL_EXPORTER_OTLP_COMPRESSION.
    pub compression: Option<String>,
    /// Bytes of unsent batches kept while the collector is unreachable. Default 8 MiB.
    pub max_queue_bytes: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
}

/// Everything resolved: what the exporter runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpSettings {
    /// Full URL: the gRPC endpoint, or the HTTP URL including /v1/metrics.
    pub url: String,
    pub protocol: Protocol,
    pub headers: Vec<(String, String)>,
    pub timeout: Duration,
    pub interval: Duration,
    pub resource_attributes: Vec<(String, String)>,
    pub service_name: String,
    pub certificate: Option<PathBuf>,
    pub gzip: bool,
    pub max_queue_bytes: usize,
}

/// Comma-separated k=v pairs, values percent-decoded (the OTEL_*_HEADERS format).
pub fn parse_pairs(s: &str) -> Result<Vec<(String, String)>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| format!("{p:?} is not key=value"))?;
            Ok((percent_decode(k.trim()), percent_decode(v.trim())))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl OtlpConfig {
    /// Resolves the config against the environment (`env` looks a variable up). None when
    /// no endpoint is configured anywhere. Errors name the variable or key.
    pub fn resolve(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<OtlpSettings>, String> {
        let env = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        let protocol = match env("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
            .or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
            .or_else(|| self.protocol.clone())
            .as_deref()
        {
            None | Some("http/protobuf") => Protocol::HttpProtobuf,
            Some("grpc") => Protocol::Grpc,
            Some(other) => {
                return Err(format!(
                    "otlp.protocol / OTEL_EXPORTER_OTLP_PROTOCOL: {other:?} is not grpc or http/protobuf \
                     (http/json is not supported)"
                ))
            }
        };
        let url = if let Some(u) = env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") {
            u
        } else if let Some(base) =
            env("OTEL_EXPORTER_OTLP_ENDPOINT").or_else(|| self.endpoint.clone())
        {
            match protocol {
                Protocol::Grpc => base,
                Protocol::HttpProtobuf if base.ends_with("/v1/metrics") => base,
                Protocol::HttpProtobuf => format!("{}/v1/metrics", base.trim_end_matches('/')),
            }
        } else {
            return Ok(None);
        };
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "otlp.endpoint / OTEL_EXPORTER_OTLP_ENDPOINT: {url:?} must start with http:// or https://"
            ));
        }
        let ms =
            |var: &str, key: &str, cfg: Option<u64>, default: u64| -> Result<Duration, String> {
                let v = match env(var) {
                    Some(v) => v
                        .trim()
                        .parse::<u64>()
                        .map_err(|_| format!("{var}: {v:?} is not a number of milliseconds"))?,
                    None => cfg.unwrap_or(default),
                };
                if v == 0 {
                    return Err(format!("{key} / {var} must be positive"));
                }
                Ok(Duration::from_millis(v))
            };
        let timeout = ms(
            "OTEL_EXPORTER_OTLP_TIMEOUT",
            "otlp.timeout_ms",
            self.timeout_ms,
            10_000,
        )?;
        let interval = ms(
            "OTEL_METRIC_EXPORT_INTERVAL",
            "otlp.interval_ms",
            self.interval_ms,
            60_000,
        )?;
        let mut headers: Vec<(String, String)> = self
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for var in [
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
        ] {
            if let Some(h) = env(var) {
                for (k, v) in parse_pairs(&h).map_err(|e| format!("{var}: {e}"))? {
                    headers.retain(|(hk, _)| !hk.eq_ignore_ascii_case(&k));
                    headers.push((k, v));
                }
            }
        }
        let mut resource_attributes: Vec<(String, String)> = self
            .resource_attributes
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if let Some(r) = env("OTEL_RESOURCE_ATTRIBUTES") {
            for (k, v) in parse_pairs(&r).map_err(|e| format!("OTEL_RESOURCE_ATTRIBUTES: {e}"))? {
                resource_attributes.retain(|(rk, _)| rk != &k);
                resource_attributes.push((k, v));
            }
        }
        let service_name = env("OTEL_SERVICE_NAME")
            .or_else(|| {
                resource_attributes
                    .iter()
                    .find(|(k, _)| k == "service.name")
                    .map(|(_, v)| v.clone())
            })
            .unwrap_or_else(|| "gpu-agent".into());
        let gzip = match env("OTEL_EXPORTER_OTLP_COMPRESSION")
            .or_else(|| self.compression.clone())
            .as_deref()
        {
            None | Some("none") => false,
            Some("gzip") => true,
            Some(o) => {
                return Err(format!(
                    "otlp.compression / OTEL_EXPORTER_OTLP_COMPRESSION: {o:?} is not gzip or none"
                ))
            }
        };
        let certificate = env("OTEL_EXPORTER_OTLP_CERTIFICATE")
            .map(PathBuf::from)
            .or_else(|| self.certificate.clone());
        if let Some(c) = &certificate {
            if !c.exists() {
                return Err(format!(
                    "otlp.certificate / OTEL_EXPORTER_OTLP_CERTIFICATE: {} does not exist",
                    c.display()
                ));
            }
        }
        Ok(Some(OtlpSettings {
            url,
            protocol,
            headers,
            timeout,
            interval,
            resource_attributes,
            service_name,
            certificate,
            gzip,
            max_queue_bytes: self.max_queue_bytes.unwrap_or(8 << 20),
        }))
    }
}

/// Export counters, shared with the agent's self-metrics.
#[derive(Debug, Default)]
pub struct ExportCounters {
    pub sent: AtomicU64,
    pub failures: AtomicU64,
    pub dropped_batches: AtomicU64,
    pub queued_bytes: AtomicU64,
}

#[derive(Debug)]
pub enum SendError {
    /// Try again later (collector down, overloaded, timed out).
    Retryable(String),
    /// The collector refused this batch: retrying would not help.
    Permanent(String),
}

enum Transport {
    Grpc(MetricsServiceClient<tonic::transport::Channel>),
    Http(reqwest::Client),
}

pub struct OtlpExporter {
    settings: OtlpSettings,
    transport: Transport,
    /// Encoded requests: in memory exactly what the byte budget counts.
    queue: VecDeque<Vec<u8>>,
    queued_bytes: usize,
    backoff: Duration,
    next_attempt: Instant,
    counters: Arc<ExportCounters>,
}

const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(120);

impl OtlpExporter {
    /// Builds the client. Nothing connects yet: a collector that is down at start-up is
    /// just a failed first export.
    pub fn new(
        settings: OtlpSettings,
        counters: Arc<ExportCounters>,
    ) -> Result<OtlpExporter, String> {
        let ca = match &settings.certificate {
            Some(p) => Some(std::fs::read(p).map_err(|e| format!("reading {}: {e}", p.display()))?),
            None => None,
        };
        let transport = match settings.protocol {
            Protocol::Grpc => {
                let mut ep = tonic::transport::Endpoint::from_shared(settings.url.clone())
                    .map_err(|e| format!("OTLP endpoint {}: {e}", settings.url))?
                    .timeout(settings.timeout)
                    .connect_timeout(settings.timeout);
                if settings.url.starts_with("https://") {
                    let mut tls = tonic::transport::ClientTlsConfig::new().with_native_roots();
                    if let Some(ca) = &ca {
                        tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(ca));
                    }
                    ep = ep.tls_config(tls).map_err(|e| format!("TLS: {e}"))?;
                }
                let mut client = MetricsServiceClient::new(ep.connect_lazy());
                if settings.gzip {
                    client = client.send_compressed(tonic::codec::CompressionEncoding::Gzip);
                }
                Transport::Grpc(client)
            }
            Protocol::HttpProtobuf => {
                let mut b = reqwest::Client::builder().timeout(settings.timeout);
                if let Some(ca) = &ca {
                    let cert = reqwest::Certificate::from_pem(ca)
                        .map_err(|e| format!("CA bundle: {e}"))?;
                    b = b.add_root_certificate(cert);
                }
                Transport::Http(b.build().map_err(|e| format!("HTTP client: {e}"))?)
            }
        };
        Ok(OtlpExporter {
            settings,
            transport,
            queue: VecDeque::new(),
            queued_bytes: 0,
            backoff: BACKOFF_MIN,
            next_attempt: Instant::now(),
            counters,
        })
    }

    pub fn settings(&self) -> &OtlpSettings {
        &self.settings
    }

    /// Queues a batch, dropping the oldest ones beyond the byte budget.
    pub fn enqueue(&mut self, req: ExportMetricsServiceRequest) {
        let bytes = req.encode_to_vec();
        drop(req);
        self.queued_bytes += bytes.len();
        self.queue.push_back(bytes);
        while self.queued_bytes > self.settings.max_queue_bytes && self.queue.len() > 1 {
            let old = self.queue.pop_front().unwrap();
            self.queued_bytes -= old.len();
            self.counters.dropped_batches.fetch_add(1, Relaxed);
        }
        self.counters
            .queued_bytes
            .store(self.queued_bytes as u64, Relaxed);
    }

    /// Exports one batch. With nothing queued and no backoff pending, the request goes out
    /// as built (no encode/decode round trip); only a failed one is encoded and queued, from
    /// `make` again (it builds the same batch from the same snapshot).
    pub async fn export(&mut self, make: impl Fn() -> ExportMetricsServiceRequest) {
        if !self.queue.is_empty() || Instant::now() < self.next_attempt {
            self.enqueue(make());
            self.flush(false).await;
            return;
        }
        let result = match &mut self.transport {
            Transport::Grpc(_) => self.send_grpc(make()).await,
            Transport::Http(_) => self.send(&make().encode_to_vec()).await,
        };
        if !self.settle(result) {
            self.enqueue(make());
        }
    }

    /// Counts and logs one send's outcome, and arms the backoff on a retryable failure.
    /// Returns false when the batch should be kept for a retry.
    fn settle(&mut self, result: Result<(), SendError>) -> bool {
        match result {
            Ok(()) => {
                self.counters.sent.fetch_add(1, Relaxed);
                if self.backoff > BACKOFF_MIN {
                    tracing::info!(url = %self.settings.url, "OTLP export recovered");
                }
                self.backoff = BACKOFF_MIN;
                true
            }
            Err(SendError::Permanent(e)) => {
                tracing::warn!(url = %self.settings.url, "OTLP export rejected, batch dropped: {e}");
                self.counters.failures.fetch_add(1, Relaxed);
                self.counters.dropped_batches.fetch_add(1, Relaxed);
                true
            }
            Err(SendError::Retryable(e)) => {
                self.counters.failures.fetch_add(1, Relaxed);
                if self.backoff == BACKOFF_MIN {
                    tracing::warn!(url = %self.settings.url, queued = self.queue.len(),
                        "OTLP export failed, retrying with backoff: {e}");
                } else {
                    tracing::debug!("OTLP export failed again: {e}");
                }
                self.next_attempt = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                false
            }
        }
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Sends queued batches oldest first, unless backing off. Returns false while the
    /// collector is unreachable.
    pub async fn flush(&mut self, ignore_backoff: bool) -> bool {
        if !ignore_backoff && Instant::now() < self.next_attempt {
            return false;
        }
        while let Some(body) = self.queue.pop_front() {
            let len = body.len();
            let result = self.send(&body).await;
            if !self.settle(result) {
                self.queue.push_front(body);
                return false;
            }
            self.queued_bytes -= len;
            self.counters
                .queued_bytes
                .store(self.queued_bytes as u64, Relaxed);
        }
        true
    }

    async fn send_grpc(&mut self, req: ExportMetricsServiceRequest) -> Result<(), SendError> {
        let Transport::Grpc(client) = &mut self.transport else {
            unreachable!("send_grpc on an HTTP exporter");
        };
        let mut r = tonic::Request::new(req);
        for (k, v) in &self.settings.headers {
            if let (Ok(k), Ok(v)) = (
                k.to_ascii_lowercase()
                    .parse::<tonic::metadata::MetadataKey<_>>(),
                v.parse(),
            ) {
                r.metadata_mut().insert(k, v);
            }
        }
        r.set_timeout(self.settings.timeout);
        match client.export(r).await {
            Ok(_) => Ok(()),
            Err(s) => {
                use tonic::Code::*;
                let msg = format!("{}: {}", s.code(), s.message());
                match s.code() {
                    Unavailable | ResourceExhausted | DeadlineExceeded | Aborted | Cancelled
                    | Unknown | Internal | OutOfRange | DataLoss => Err(SendError::Retryable(msg)),
                    _ => Err(SendError::Permanent(msg)),
                }
            }
        }
    }

    async fn send(&mut self, body: &[u8]) -> Result<(), SendError> {
        match &mut self.transport {
            Transport::Grpc(_) => {
                // tonic's generated client wants the message: decoded only for a retry.
                let req = ExportMetricsServiceRequest::decode(body)
                    .map_err(|e| SendError::Permanent(format!("re-decoding a batch: {e}")))?;
                self.send_grpc(req).await
            }
            Transport::Http(client) => {
                let mut body = body.to_vec();
                let mut rb = client
                    .post(&self.settings.url)
                    .header("content-type", "application/x-protobuf");
                if self.settings.gzip {
                    use std::io::Write;
                    let mut enc =
                        flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                    enc.write_all(&body).ok();
                    body = enc.finish().unwrap_or_default();
                    rb = rb.header("content-encoding", "gzip");
                }
                for (k, v) in &self.settings.headers {
                    rb = rb.header(k, v);
                }
                match rb.body(body).send().await {
                    Ok(r) if r.status().is_success() => Ok(()),
                    Ok(r) => {
                        let st = r.status();
                        let msg = format!("HTTP {st}");
                        if matches!(st.as_u16(), 408 | 429 | 502 | 503 | 504)
                            || st.is_server_error()
                        {
                            Err(SendError::Retryable(msg))
                        } else {
                            Err(SendError::Permanent(msg))
                        }
                    }
                    Err(e) => Err(SendError::Retryable(e.to_string())),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn no_endpoint_means_no_export() {
        assert_eq!(OtlpConfig::default().resolve(env(&[])).unwrap(), None);
    }

    #[test]
    fn env_overrides_the_file_and_http_gets_its_path() {
        let cfg = OtlpConfig {
            endpoint: Some("http://file:4318".into()),
            interval_ms: Some(5000),
            ..Default::default()
        };
        let s = cfg.resolve(env(&[])).unwrap().unwrap();
        assert_eq!(s.url, "http://file:4318/v1/metrics");
        assert_eq!(s.protocol, Protocol::HttpProtobuf);
        assert_eq!(s.interval, Duration::from_secs(5));
        let s = cfg
            .resolve(env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "api-key=se%3Dcret, x-team=gpu",
                ),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "deployment.environment=prod,service.name=gpu-x",
                ),
            ]))
            .unwrap()
            .unwrap();
        assert_eq!(s.url, "http://env:4317");
        assert_eq!(s.protocol, Protocol::Grpc);
        assert_eq!(s.timeout, Duration::from_millis(2500));
        assert!(s.headers.contains(&("api-key".into(), "se=cret".into())));
        assert_eq!(s.service_name, "gpu-x");
        let s = cfg
            .resolve(env(&[(
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                "https://m/custom",
            )]))
            .unwrap()
            .unwrap();
        assert_eq!(s.url, "https://m/custom");
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = OtlpConfig::default()
            .resolve(env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon"),
            ]))
            .unwrap_err();
        assert!(e.contains("OTEL_EXPORTER_OTLP_TIMEOUT"), "{e}");
        let e = OtlpConfig::default()
            .resolve(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317")]))
            .unwrap_err();
        assert!(e.contains("http://"), "{e}");
        let e = OtlpConfig::default()
            .resolve(env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ]))
            .unwrap_err();
        assert!(e.contains("OTEL_EXPORTER_OTLP_PROTOCOL"), "{e}");
    }

    #[test]
    fn queue_is_bounded_by_bytes_and_drops_oldest() {
        let stats = gpu_model::AgentStats {
            started_ms: 1,
            ..Default::default()
        };
        let ctx = crate::otlp::ExportContext {
            service_name: "t".into(),
            ..Default::default()
        };
        let batch = || crate::otlp::build_request(&Default::default(), &stats, &ctx, 5);
        let one = batch().encoded_len();
        // Room for three and a half batches.
        let budget = one * 7 / 2;
        let settings = OtlpConfig {
            endpoint: Some("http://127.0.0.1:9".into()),
            max_queue_bytes: Some(budget),
            ..Default::default()
        }
        .resolve(env(&[]))
        .unwrap()
        .unwrap();
        let counters = Arc::new(ExportCounters::default());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut ex = OtlpExporter::new(settings, counters.clone()).unwrap();
            for _ in 0..50 {
                ex.enqueue(batch());
            }
            assert_eq!(ex.queued(), 3);
            assert!(counters.queued_bytes.load(Relaxed) as usize <= budget);
            assert_eq!(counters.dropped_batches.load(Relaxed), 47);
            // Port 9 (discard) refuses: a retryable failure, the queue stays.
            assert!(!ex.flush(true).await);
            assert_eq!(ex.queued(), 3);
            assert_eq!(counters.failures.load(Relaxed), 1);
            // Backing off: a flush that respects the backoff does not even try.
            assert!(!ex.flush(false).await);
            assert_eq!(counters.failures.load(Relaxed), 1);
        });
    }
}
