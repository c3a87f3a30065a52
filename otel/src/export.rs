//! Pushing OTLP: settings from the standard OTEL_* variables over the config file, gRPC
//! (tonic) or HTTP/protobuf (reqwest) with TLS through rustls, and a bounded queue that
//! retries with backoff while the collector is down and drops the oldest batches first.
//! Cumulative temporality means a dropped batch loses resolution, never totals.
use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc, RwLock,
    },
    time::{Duration, Instant},
};

use gpu_model::SourceStatus;
use prost::bytes::Bytes;

pub use crate::settings::{parse_pairs, OtlpConfig, OtlpSettings, Protocol};

/// Export counters, shared with the agent's self-metrics.
#[derive(Debug, Default)]
pub struct ExportCounters {
    pub sent: AtomicU64,
    pub failures: AtomicU64,
    pub dropped_batches: AtomicU64,
    pub queued_bytes: AtomicU64,
    /// `starting` until the first send, then `ok` or `unavailable: <its error>`.
    pub status: RwLock<SourceStatus>,
}

#[derive(Debug)]
pub enum SendError {
    /// Try again later (collector down, overloaded, timed out), not before `after` when
    /// the collector said so (Retry-After).
    Retryable(String, Option<Duration>),
    /// The collector refused this batch: retrying would not help.
    Permanent(String),
    /// The collector refused this batch as too large (HTTP 413, gRPC's message limit):
    /// smaller requests would go through.
    TooLarge(String),
}

enum Transport {
    Grpc(tonic::transport::Channel),
    Http(reqwest::Client),
}

pub struct OtlpExporter {
    settings: OtlpSettings,
    /// Made at the first send: a failure to make it (no TLS roots, the CA bundle gone) is
    /// a failed export, retried with backoff as a collector that is down.
    transport: Option<Transport>,
    /// Encoded requests: in memory exactly what the byte budget counts.
    queue: VecDeque<Bytes>,
    queued_bytes: usize,
    backoff: Duration,
    next_attempt: Instant,
    counters: Arc<ExportCounters>,
    /// The settings' `max_request_bytes`, lowered while the collector refuses requests of
    /// that size.
    max_request_bytes: usize,
    /// The requests that left the queue (sent, or refused for good) since `take_sent`,
    /// where nothing else held them: the encoder patches them into the next export's
    /// (`otlp::Reuse`). At most the queue's byte budget: the oldest go first.
    sent: VecDeque<Vec<u8>>,
}

const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(120);

/// The settings' CA bundle, if any (a regular file of at most 1 MiB).
pub(crate) fn read_ca(settings: &OtlpSettings) -> Result<Option<Vec<u8>>, String> {
    match &settings.certificate {
        Some(p) => crate::settings::read_small_file(p)
            .map(Some)
            .map_err(|e| format!("reading {}: {e}", p.display())),
        None => Ok(None),
    }
}

/// What every OTLP request names its exporter with: name, version, language and transport,
/// as the OpenTelemetry specification asks of exporters (protocol/exporter.md).
pub const USER_AGENT_HTTP: &str = concat!(
    "gpu-agent/",
    env!("CARGO_PKG_VERSION"),
    " (Rust; OTLP/HTTP)"
);
pub const USER_AGENT_GRPC: &str = concat!(
    "gpu-agent/",
    env!("CARGO_PKG_VERSION"),
    " (Rust; OTLP/gRPC)"
);

/// A gRPC channel to `url` that connects on first use, with the settings' timeout, and TLS
/// (native roots plus `ca`) for https. `shown` names the endpoint in errors, redacted.
pub(crate) fn grpc_channel(
    url: &str,
    shown: &str,
    settings: &OtlpSettings,
    ca: Option<&[u8]>,
) -> Result<tonic::transport::Channel, String> {
    let mut ep = tonic::transport::Endpoint::from_shared(url.to_string())
        .map_err(|e| format!("{shown}: {e}"))?
        .timeout(settings.timeout)
        .connect_timeout(settings.timeout)
        .user_agent(USER_AGENT_GRPC)
        .map_err(|e| format!("user agent: {e}"))?;
    if url.starts_with("https://") {
        let mut tls = tonic::transport::ClientTlsConfig::new().with_native_roots();
        if let Some(ca) = ca {
            tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(ca));
        }
        ep = ep.tls_config(tls).map_err(|e| format!("TLS: {e}"))?;
    }
    Ok(ep.connect_lazy())
}

/// An HTTP client with the settings' timeout that also trusts `ca`.
pub(crate) fn http_client(
    settings: &OtlpSettings,
    ca: Option<&[u8]>,
) -> Result<reqwest::Client, String> {
    let mut b = reqwest::Client::builder()
        .timeout(settings.timeout)
        .user_agent(USER_AGENT_HTTP);
    if let Some(ca) = ca {
        let cert = reqwest::Certificate::from_pem(ca).map_err(|e| format!("CA bundle: {e}"))?;
        b = b.add_root_certificate(cert);
    }
    b.build().map_err(|e| format!("HTTP client: {e}"))
}

/// The transport in `slot`, made first if it is not there yet.
fn connect<'a>(
    slot: &'a mut Option<Transport>,
    settings: &OtlpSettings,
) -> Result<&'a mut Transport, String> {
    if slot.is_none() {
        let ca = read_ca(settings)?;
        *slot = Some(match settings.protocol {
            Protocol::Grpc => {
                let shown = format!("OTLP endpoint {}", settings.redacted_url());
                Transport::Grpc(grpc_channel(
                    &settings.url,
                    &shown,
                    settings,
                    ca.as_deref(),
                )?)
            }
            Protocol::HttpProtobuf => Transport::Http(http_client(settings, ca.as_deref())?),
        });
    }
    Ok(slot.as_mut().unwrap())
}

impl OtlpExporter {
    /// Nothing connects yet: a collector that is down at start-up, or a client that cannot
    /// be made, is just a failed first export.
    pub fn new(settings: OtlpSettings, counters: Arc<ExportCounters>) -> OtlpExporter {
        OtlpExporter {
            max_request_bytes: settings.max_request_bytes,
            settings,
            transport: None,
            queue: VecDeque::new(),
            queued_bytes: 0,
            backoff: BACKOFF_MIN,
            next_attempt: Instant::now(),
            counters,
            sent: VecDeque::new(),
        }
    }

    /// The requests that left the queue since the last call, where nothing else holds
    /// them, oldest first: for `otlp::Reuse::give_back`.
    pub fn take_sent(&mut self) -> impl Iterator<Item = Vec<u8>> + '_ {
        self.sent.drain(..)
    }

    pub fn settings(&self) -> &OtlpSettings {
        &self.settings
    }

    /// How big the requests of the next export grow (`otlp::requests`).
    pub fn max_request_bytes(&self) -> usize {
        self.max_request_bytes
    }

    /// Queues an encoded batch, dropping the oldest ones beyond the byte budget.
    pub fn enqueue(&mut self, bytes: Vec<u8>) {
        self.queued_bytes += bytes.len();
        self.queue.push_back(Bytes::from(bytes));
        while self.queued_bytes > self.settings.max_queue_bytes && self.queue.len() > 1 {
            let old = self.queue.pop_front().unwrap();
            self.queued_bytes -= old.len();
            self.counters.dropped_batches.fetch_add(1, Relaxed);
        }
        self.counters
            .queued_bytes
            .store(self.queued_bytes as u64, Relaxed);
    }

    /// Exports one encoded batch (otlp::encode_request), queued behind any earlier ones
    /// that failed; a failed one is kept for a retry.
    pub async fn export(&mut self, batch: Vec<u8>) {
        self.enqueue(batch);
        self.flush(false).await;
    }

    /// Counts and logs one send's outcome, and arms the backoff on a retryable failure.
    /// Returns false when the batch should be kept for a retry.
    fn settle(&mut self, result: Result<(), SendError>) -> bool {
        *self.counters.status.write().unwrap() = match &result {
            Ok(()) => SourceStatus::Ok,
            Err(SendError::Permanent(e) | SendError::TooLarge(e) | SendError::Retryable(e, _)) => {
                SourceStatus::Unavailable(e.clone())
            }
        };
        match result {
            Ok(()) => {
                self.counters.sent.fetch_add(1, Relaxed);
                if self.backoff > BACKOFF_MIN {
                    tracing::info!(url = %self.settings.redacted_url(), "OTLP export recovered");
                }
                self.backoff = BACKOFF_MIN;
                true
            }
            Err(SendError::Permanent(e) | SendError::TooLarge(e)) => {
                tracing::warn!(url = %self.settings.redacted_url(), "OTLP export rejected, batch dropped: {e}");
                self.counters.failures.fetch_add(1, Relaxed);
                self.counters.dropped_batches.fetch_add(1, Relaxed);
                true
            }
            Err(SendError::Retryable(e, after)) => {
                self.counters.failures.fetch_add(1, Relaxed);
                if self.backoff == BACKOFF_MIN {
                    tracing::warn!(url = %self.settings.redacted_url(), queued = self.queue.len(),
                        "OTLP export failed, retrying with backoff: {e}");
                } else {
                    tracing::debug!("OTLP export failed again: {e}");
                }
                // The collector's Retry-After is honoured within the backoff bounds.
                let wait = after.map_or(self.backoff, |a| a.clamp(self.backoff, BACKOFF_MAX));
                self.next_attempt = Instant::now() + wait;
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
            let result = self.send(body.clone()).await;
            if let Err(SendError::TooLarge(e)) = &result {
                if self.split_refused(&body, e) {
                    continue;
                }
            }
            if !self.settle(result) {
                self.queue.push_front(body);
                return false;
            }
            self.queued_bytes -= len;
            self.counters
                .queued_bytes
                .store(self.queued_bytes as u64, Relaxed);
            // The client dropped its reference once the response came: the buffer is
            // this one's alone, and goes back as a `Vec` without a copy.
            if let Ok(b) = body.try_into_mut() {
                self.sent.push_back(Vec::from(b));
                let mut held: usize = self.sent.iter().map(Vec::len).sum();
                while held > self.settings.max_queue_bytes && self.sent.len() > 1 {
                    held -= self.sent.pop_front().map_or(0, |b| b.len());
                }
            }
        }
        true
    }

    /// A request the collector refused as too large goes back to the head of the queue as
    /// pieces of at most half its size (whole resources, no copy), and the next exports'
    /// requests are made no bigger: a proxy in front of the collector may take less than
    /// the collector does (nginx takes 1 MiB by default). False when it holds one resource
    /// only, or is no bigger than the smallest size a request is cut to (a collector that
    /// refuses that is not asked again per resource): then it is dropped as any refused
    /// batch.
    fn split_refused(&mut self, body: &Bytes, e: &str) -> bool {
        let min = crate::settings::MIN_BYTES;
        if body.len() <= min {
            return false;
        }
        let max = (body.len() / 2).max(min);
        let pieces = match split_request(body, max) {
            Some(p) if p.len() > 1 => p,
            _ => return false,
        };
        self.counters.failures.fetch_add(1, Relaxed);
        if max < self.max_request_bytes {
            self.max_request_bytes = max;
            tracing::warn!(url = %self.settings.redacted_url(), bytes = body.len(),
                "OTLP request refused as too large ({e}); sent again in {} pieces, and \
                 requests are now at most {max} bytes (otlp.max_request_bytes)", pieces.len());
        }
        for p in pieces.into_iter().rev() {
            self.queue.push_front(p);
        }
        true
    }

    /// Sends one batch; `Bytes` so that the queued copy is not duplicated.
    async fn send(&mut self, body: Bytes) -> Result<(), SendError> {
        let settings = &self.settings;
        match connect(&mut self.transport, settings).map_err(|e| SendError::Retryable(e, None))? {
            Transport::Grpc(channel) => crate::grpc::unary(
                channel,
                "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
                body,
                settings,
            )
            .await
            .map_err(grpc_error),
            Transport::Http(client) => post_http(client, &settings.url, settings, body).await,
        }
    }
}

/// A gRPC request of `msg` with the settings' headers (as metadata) and timeout.
pub(crate) fn grpc_request<T>(msg: T, settings: &OtlpSettings) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    for (k, v) in &settings.headers {
        if let (Ok(k), Ok(v)) = (
            k.to_ascii_lowercase()
                .parse::<tonic::metadata::MetadataKey<_>>(),
            v.parse(),
        ) {
            r.metadata_mut().insert(k, v);
        }
    }
    r.set_timeout(settings.timeout);
    r
}

/// A failed gRPC export: retried where OTLP says the status is transient; a message over
/// the server's limit (grpc-go: RESOURCE_EXHAUSTED "received message larger than max";
/// tonic: OUT_OF_RANGE "message length too large") is too large, not transient, and so is
/// a proxy's HTTP 413 (nginx's `client_max_body_size`, 1 MiB by default and in
/// ingress-nginx): it sends no gRPC status, and the HTTP one maps to UNKNOWN
/// (`grpc::unary`'s "HTTP 413 ..."; tonic's "... mapped from HTTP status code 413").
pub(crate) fn grpc_error(s: tonic::Status) -> SendError {
    use tonic::Code::*;
    let msg = format!("{}: {}", s.code(), s.message());
    let m = s.message();
    let too_large = m.contains("larger than max") || m.contains("too large");
    let proxy_413 = m.starts_with("HTTP 413") || m.ends_with("mapped from HTTP status code 413");
    match s.code() {
        ResourceExhausted | OutOfRange if too_large => SendError::TooLarge(msg),
        Unknown if proxy_413 => SendError::TooLarge(msg),
        Unavailable | ResourceExhausted | DeadlineExceeded | Aborted | Cancelled | Unknown
        | Internal | OutOfRange | DataLoss => SendError::Retryable(msg, None),
        _ => SendError::Permanent(msg),
    }
}

/// POSTs an encoded OTLP protobuf `body` to `url` (gzipped when the settings say so), with
/// the settings' headers; 408, 429 and 5xx are retried, honouring Retry-After.
pub(crate) async fn post_http(
    client: &reqwest::Client,
    url: &str,
    settings: &OtlpSettings,
    mut body: Bytes,
) -> Result<(), SendError> {
    let mut rb = client
        .post(url)
        .header("content-type", "application/x-protobuf");
    if settings.gzip {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&body).ok();
        body = enc.finish().unwrap_or_default().into();
        rb = rb.header("content-encoding", "gzip");
    }
    for (k, v) in &settings.headers {
        rb = rb.header(k, v);
    }
    match rb.body(body).send().await {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => {
            let st = r.status();
            let msg = format!("HTTP {st}");
            if st == reqwest::StatusCode::PAYLOAD_TOO_LARGE {
                Err(SendError::TooLarge(msg))
            } else if matches!(st.as_u16(), 408 | 429) || st.is_server_error() {
                Err(SendError::Retryable(msg, retry_after(&r)))
            } else {
                Err(SendError::Permanent(msg))
            }
        }
        // Without the URL: it may carry credentials.
        Err(e) => Err(SendError::Retryable(e.without_url().to_string(), None)),
    }
}

/// An encoded request cut at its resources (each a length-delimited field 1 at the top
/// level) into pieces of at most `max` bytes, a resource bigger than that a piece of its
/// own. None when `body` is not such a sequence.
fn split_request(body: &Bytes, max: usize) -> Option<Vec<Bytes>> {
    use prost::encoding::decode_varint;
    let key = u64::from(crate::pb::key(1, crate::pb::LEN));
    let (mut pieces, mut start, mut rest) = (vec![], 0, &body[..]);
    while !rest.is_empty() {
        let field = body.len() - rest.len();
        if decode_varint(&mut rest).ok()? != key {
            return None;
        }
        let len = usize::try_from(decode_varint(&mut rest).ok()?).ok()?;
        rest = rest.get(len..)?;
        if body.len() - rest.len() - start > max && field > start {
            pieces.push(body.slice(start..field));
            start = field;
        }
    }
    pieces.push(body.slice(start..));
    Some(pieces)
}

/// Retry-After on a 429 or 503: seconds, or an HTTP date.
pub(crate) fn retry_after(r: &reqwest::Response) -> Option<Duration> {
    if !matches!(r.status().as_u16(), 429 | 503) {
        return None;
    }
    let v = r
        .headers()
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?;
    if let Ok(secs) = v.trim().parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    at.duration_since(std::time::SystemTime::now()).ok()
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
    fn queue_is_bounded_by_bytes_and_drops_oldest() {
        let stats = gpu_model::AgentStats {
            started_ms: 1,
            ..Default::default()
        };
        let ctx = crate::otlp::ExportContext {
            service_name: "t".into(),
            ..Default::default()
        };
        let batch = || crate::otlp::encode_request(&Default::default(), &stats, &ctx, 5);
        let one = batch().len();
        // Room for three and a half batches.
        let budget = one * 7 / 2;
        let mut settings = OtlpConfig {
            endpoint: Some("http://127.0.0.1:9".into()),
            ..Default::default()
        }
        .resolve(env(&[]))
        .unwrap()
        .unwrap();
        // Smaller than the config allows: a few batches are enough to show the bound.
        settings.max_queue_bytes = budget;
        let counters = Arc::new(ExportCounters::default());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut ex = OtlpExporter::new(settings, counters.clone());
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

    /// An exporter to `url` with the default settings, and its counters.
    fn exporter_to(url: String) -> (OtlpExporter, Arc<ExportCounters>) {
        let settings = OtlpConfig {
            endpoint: Some(url),
            ..Default::default()
        }
        .resolve(env(&[]))
        .unwrap()
        .unwrap();
        let counters = Arc::new(ExportCounters::default());
        (OtlpExporter::new(settings, counters.clone()), counters)
    }

    /// A request of one resource per size, each resource's bytes its index.
    fn request_of(sizes: &[usize]) -> Vec<u8> {
        let mut out = vec![];
        for (i, &n) in sizes.iter().enumerate() {
            crate::pb::bytes(&mut out, 1, &vec![i as u8; n]);
        }
        out
    }

    #[test]
    fn a_grpc_message_over_the_servers_limit_is_too_large_not_transient() {
        let kind = |s: tonic::Status| match grpc_error(s) {
            SendError::TooLarge(_) => "too large",
            SendError::Retryable(..) => "retryable",
            SendError::Permanent(_) => "permanent",
        };
        // grpc-go's server (the OpenTelemetry Collector) and tonic's.
        let go = "grpc: received message larger than max (5242880 vs. 4194304)";
        assert_eq!(kind(tonic::Status::resource_exhausted(go)), "too large");
        let tonic = "Error, decoded message length too large: found 5242880 bytes, the limit is: 4194304 bytes";
        assert_eq!(kind(tonic::Status::out_of_range(tonic)), "too large");
        // A proxy's 413 without a gRPC status, as `grpc::unary` and tonic report it; its
        // 500 (UNKNOWN too) is transient.
        let theirs = |code| {
            tonic::Status::unknown(format!(
                "grpc-status header missing, mapped from HTTP status code {code}"
            ))
        };
        assert_eq!(kind(theirs(413)), "too large");
        assert_eq!(kind(theirs(500)), "retryable");
        let ours = |code| {
            crate::grpc::from_http(tonic::codegen::http::StatusCode::from_u16(code).unwrap())
        };
        assert_eq!(kind(ours(413)), "too large");
        assert_eq!(kind(ours(500)), "retryable");
        // A collector out of memory or quota is transient.
        let busy = "data refused due to high memory usage";
        assert_eq!(kind(tonic::Status::resource_exhausted(busy)), "retryable");
        assert_eq!(kind(tonic::Status::invalid_argument("bad")), "permanent");
    }

    #[test]
    fn a_request_splits_at_its_resources() {
        let body = Bytes::from(request_of(&[100, 200, 50, 300, 10]));
        let pieces = split_request(&body, 320).unwrap();
        let lens: Vec<usize> = pieces.iter().map(Bytes::len).collect();
        // With their headers: 102 + 203 fit in 320, 52 more would not; 52 + 303 would not
        // either; 303 + 12 fit.
        assert_eq!(lens, [305, 52, 315]);
        assert_eq!(pieces.concat(), body);
        // A resource over the size is a piece of its own; one piece when all fit.
        let lens: Vec<usize> = split_request(&body, 10)
            .unwrap()
            .iter()
            .map(Bytes::len)
            .collect();
        assert_eq!(lens, [102, 203, 52, 303, 12]);
        assert_eq!(
            split_request(&body, 1 << 20).unwrap(),
            std::slice::from_ref(&body)
        );
        // Not a request's framing: no guess.
        assert_eq!(split_request(&Bytes::from_static(b"\x12\x01a"), 10), None);
        assert_eq!(split_request(&Bytes::from_static(b"\x0a\x05ab"), 10), None);
    }

    /// An HTTP/1.1 collector that refuses bodies over `limit` bytes with 413 and takes the
    /// others; the bodies it took, in order.
    async fn limited_collector(limit: usize) -> (String, Arc<std::sync::Mutex<Vec<Vec<u8>>>>) {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let taken = Arc::new(std::sync::Mutex::new(vec![]));
        let t = taken.clone();
        tokio::spawn(async move {
            while let Ok((c, _)) = listener.accept().await {
                let t = t.clone();
                tokio::spawn(async move {
                    let mut c = BufReader::new(c);
                    loop {
                        let mut len = None;
                        loop {
                            let mut line = String::new();
                            if c.read_line(&mut line).await.unwrap_or(0) == 0 {
                                return;
                            }
                            let line = line.trim_end().to_ascii_lowercase();
                            if line.is_empty() {
                                break;
                            }
                            if let Some(n) = line.strip_prefix("content-length: ") {
                                len = Some(n.parse::<usize>().unwrap());
                            }
                        }
                        let mut body = vec![0; len.expect("a length")];
                        c.read_exact(&mut body).await.unwrap();
                        let status = if body.len() > limit {
                            "413 Payload Too Large"
                        } else {
                            t.lock().unwrap().push(body);
                            "200 OK"
                        };
                        let reply = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
                        c.get_mut().write_all(reply.as_bytes()).await.unwrap();
                    }
                });
            }
        });
        (url, taken)
    }

    #[test]
    fn a_sent_request_comes_back_without_a_copy_and_a_queued_one_does_not() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (url, taken) = limited_collector(1 << 20).await;
            let (mut ex, _) = exporter_to(url);
            let body = request_of(&[1000, 2000]);
            let ptr = body.as_ptr();
            ex.export(body).await;
            let back: Vec<Vec<u8>> = ex.take_sent().collect();
            assert_eq!(back.len(), 1, "the sent request comes back");
            assert_eq!(back[0].as_ptr(), ptr, "the same buffer");
            assert_eq!(back[0], taken.lock().unwrap()[0]);
            assert_eq!(ex.take_sent().count(), 0, "once");
            // An export of several requests: each comes back, in order.
            let bodies = [request_of(&[100]), request_of(&[200, 300])];
            let ptrs: Vec<_> = bodies.iter().map(|b| b.as_ptr()).collect();
            for b in bodies {
                ex.export(b).await;
            }
            let back: Vec<_> = ex.take_sent().map(|b| b.as_ptr()).collect();
            assert_eq!(back, ptrs);
            // Never taken back: at most the queue's byte budget is held, the newest.
            ex.settings.max_queue_bytes = 64 << 10;
            let bodies = [40_000, 40_000, 10_000].map(|n| request_of(&[n]));
            let newest: Vec<_> = bodies[1..].iter().map(|b| b.as_ptr()).collect();
            for b in bodies {
                ex.export(b).await;
            }
            let back: Vec<_> = ex.take_sent().map(|b| b.as_ptr()).collect();
            assert_eq!(back, newest);
        });
        rt.block_on(async {
            // Nobody listens: the request stays queued for a retry, and is not handed out.
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            drop(listener);
            let (mut ex, _) = exporter_to(url);
            ex.export(request_of(&[1000])).await;
            assert_eq!(ex.queued(), 1);
            assert_eq!(ex.take_sent().count(), 0);
        });
    }

    #[test]
    fn a_request_refused_as_too_large_goes_again_in_pieces_and_later_ones_are_smaller() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            // A proxy that takes 250 KB in front of the collector.
            let (url, taken) = limited_collector(250_000).await;
            let (mut ex, counters) = exporter_to(url);
            assert_eq!(ex.max_request_bytes(), 8 << 20);
            let sizes = [100_000; 7];
            let body = request_of(&sizes);
            ex.export(body.clone()).await;
            // 700 KB refused; its pieces of 3, 3 and 1 resources (at most 350 KB): the two of
            // 300 KB refused, the last taken; their pieces of one resource each taken.
            let taken = taken.lock().unwrap().clone();
            assert_eq!(taken.concat(), body, "every resource once, in order");
            assert!(taken.iter().all(|b| b.len() <= 250_000));
            assert_eq!(ex.queued(), 0);
            assert_eq!(counters.queued_bytes.load(Relaxed), 0);
            assert_eq!(counters.dropped_batches.load(Relaxed), 0);
            assert_eq!(counters.failures.load(Relaxed), 3);
            // The next exports' requests fit: half the smallest refused (300,012 bytes).
            assert_eq!(ex.max_request_bytes(), 150_006);
            // One resource over the limit cannot be cut: dropped, and the queue goes on.
            ex.enqueue(request_of(&[300_000]));
            ex.export(request_of(&[1000])).await;
            assert_eq!(counters.dropped_batches.load(Relaxed), 1);
            assert_eq!(ex.queued(), 0);
            assert_eq!(ex.queued_bytes, 0);
        });
        // A collector that refuses even the smallest size a request is cut to: such a
        // request is dropped whole, not sent again per resource.
        rt.block_on(async {
            let (url, taken) = limited_collector(1000).await;
            let (mut ex, counters) = exporter_to(url);
            ex.export(request_of(&[10_000; 6])).await;
            assert_eq!(counters.failures.load(Relaxed), 1);
            assert_eq!(counters.dropped_batches.load(Relaxed), 1);
            assert_eq!(ex.max_request_bytes(), 8 << 20);
            assert!(taken.lock().unwrap().is_empty());
        });
    }

    #[test]
    fn retry_after_is_honoured_within_the_backoff_bounds() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            // A collector that sheds load: 503 with Retry-After, to every request.
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                while let Ok((mut c, _)) = listener.accept().await {
                    let mut buf = vec![0u8; 65536];
                    let _ = c.read(&mut buf).await;
                    let reply = "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 7\r\n\
                                 Content-Length: 0\r\nConnection: close\r\n\r\n";
                    let _ = c.write_all(reply.as_bytes()).await;
                }
            });
            let (mut ex, counters) = exporter_to(format!("http://{addr}"));
            ex.enqueue(vec![]);
            let before = Instant::now();
            assert!(!ex.flush(true).await);
            assert_eq!(counters.failures.load(Relaxed), 1);
            let wait = ex.next_attempt - before;
            assert!(
                wait >= Duration::from_secs(7) && wait < Duration::from_secs(9),
                "{wait:?}"
            );
        });
    }
}
