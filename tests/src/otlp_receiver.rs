//! An in-process OTLP receiver built from opentelemetry-proto, for exact assertions: gRPC
//! (tonic MetricsService and LogsService) and HTTP/protobuf (POST /v1/metrics, /v1/logs)
//! on loopback.
use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use opentelemetry_proto::tonic::{
    collector::logs::v1::{
        logs_service_server::{LogsService, LogsServiceServer},
        ExportLogsServiceRequest, ExportLogsServiceResponse,
    },
    collector::metrics::v1::{
        metrics_service_server::{MetricsService, MetricsServiceServer},
        ExportMetricsServiceRequest, ExportMetricsServiceResponse,
    },
    common::v1::{any_value, KeyValue},
    logs::v1::LogRecord,
    metrics::v1::{metric::Data, Metric, NumberDataPoint, ResourceMetrics},
};
use prost::Message;

/// One request with the headers it came with.
pub type Arrival = (ExportMetricsServiceRequest, Vec<(String, String)>);

/// What arrived.
#[derive(Clone, Default)]
pub struct Received(Arc<Mutex<Vec<Arrival>>>);

impl Received {
    pub fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Drops all but the last arrival: a receiver left running for long (a held
    /// benchmark node: 3 MB a second) must not keep every request.
    pub fn keep_last(&self) {
        let mut all = self.0.lock().unwrap();
        let n = all.len().saturating_sub(1);
        all.drain(..n);
    }

    pub fn all(&self) -> Vec<Arrival> {
        self.0.lock().unwrap().clone()
    }

    pub fn last(&self) -> Option<ExportMetricsServiceRequest> {
        self.0.lock().unwrap().last().map(|(r, _)| r.clone())
    }

    /// Waits until `pred` holds for some request received so far.
    pub fn wait_for(
        &self,
        timeout: Duration,
        mut pred: impl FnMut(&ExportMetricsServiceRequest) -> bool,
    ) -> Option<ExportMetricsServiceRequest> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(r) = self
                .all()
                .into_iter()
                .rev()
                .map(|(r, _)| r)
                .find(|r| pred(r))
            {
                return Some(r);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

/// The log requests that arrived (usage records), and whether the receiver answers them:
/// switched off, it refuses with UNAVAILABLE (gRPC) or 503 (HTTP), as a collector that is
/// down or overloaded does.
#[derive(Clone, Default)]
pub struct ReceivedLogs {
    requests: Arc<Mutex<Vec<LogsArrival>>>,
    refuse: Arc<std::sync::atomic::AtomicBool>,
}

/// One logs request with the headers it came with.
pub type LogsArrival = (ExportLogsServiceRequest, Vec<(String, String)>);

impl ReceivedLogs {
    pub fn requests(&self) -> Vec<ExportLogsServiceRequest> {
        self.all().into_iter().map(|(r, _)| r).collect()
    }

    /// Every request with its headers.
    pub fn all(&self) -> Vec<LogsArrival> {
        self.requests.lock().unwrap().clone()
    }

    /// Every log record received, with its resource's attributes.
    pub fn records(&self) -> Vec<(Vec<KeyValue>, LogRecord)> {
        let mut out = vec![];
        for req in self.requests() {
            for rl in req.resource_logs {
                let ra = rl.resource.map(|r| r.attributes).unwrap_or_default();
                for sl in rl.scope_logs {
                    for lr in sl.log_records {
                        out.push((ra.clone(), lr));
                    }
                }
            }
        }
        out
    }

    /// Drops every request received so far (a long run must not keep them all).
    pub fn clear(&self) {
        self.requests.lock().unwrap().clear();
    }

    pub fn set_refusing(&self, refuse: bool) {
        self.refuse
            .store(refuse, std::sync::atomic::Ordering::SeqCst);
    }

    fn refusing(&self) -> bool {
        self.refuse.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn push(&self, r: ExportLogsServiceRequest, headers: Vec<(String, String)>) {
        self.requests.lock().unwrap().push((r, headers));
    }
}

struct LogsSvc(ReceivedLogs);

#[tonic::async_trait]
impl LogsService for LogsSvc {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        if self.0.refusing() {
            return Err(tonic::Status::unavailable("collector down (test)"));
        }
        let headers = header_pairs(&request.metadata().clone().into_headers());
        self.0.push(request.into_inner(), headers);
        Ok(tonic::Response::new(ExportLogsServiceResponse::default()))
    }
}

/// POST /v1/logs.
async fn http_logs(
    logs: ReceivedLogs,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> (axum::http::StatusCode, Vec<u8>) {
    if logs.refusing() {
        return (axum::http::StatusCode::SERVICE_UNAVAILABLE, vec![]);
    }
    if !is_protobuf(&headers) {
        return (axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE, vec![]);
    }
    let Ok(req) = ExportLogsServiceRequest::decode(body) else {
        return (axum::http::StatusCode::BAD_REQUEST, vec![]);
    };
    logs.push(req, header_pairs(&headers));
    (
        axum::http::StatusCode::OK,
        ExportLogsServiceResponse::default().encode_to_vec(),
    )
}

struct Svc(Received);

#[tonic::async_trait]
impl MetricsService for Svc {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let headers = header_pairs(&request.metadata().clone().into_headers());
        self.0
             .0
            .lock()
            .unwrap()
            .push((request.into_inner(), headers));
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

pub enum Kind {
    Grpc,
    /// gRPC over TLS with this PEM certificate chain and key.
    GrpcTls {
        cert: Vec<u8>,
        key: Vec<u8>,
    },
    Http,
    /// gRPC and HTTP/protobuf on one port, as a Collector whose one address takes both
    /// (a signal's own protocol under one base endpoint).
    GrpcAndHttp,
}

/// A receiver on its own runtime thread; stops when dropped.
pub struct Receiver {
    pub addr: SocketAddr,
    pub received: Received,
    pub logs: ReceivedLogs,
    /// HTTP requests that no route took (answered 404), as "METHOD /path".
    pub misses: Arc<Mutex<Vec<String>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the receiver records, shared with its services.
#[derive(Clone)]
struct Sinks {
    received: Received,
    logs: ReceivedLogs,
    misses: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    /// Binds 127.0.0.1:`port` (0: any free port).
    pub fn start(kind: Kind, port: u16) -> Receiver {
        Self::start_at(kind, port, "/v1/metrics")
    }

    /// As `start`, with HTTP metrics taken at `metrics_path` only (logs at /v1/logs): a
    /// request to any other path is refused (404).
    pub fn start_at(kind: Kind, port: u16, metrics_path: &str) -> Receiver {
        Self::start_paths(kind, port, metrics_path, "/v1/logs")
    }

    /// As `start_at`, with HTTP logs taken at `logs_path` only.
    pub fn start_paths(kind: Kind, port: u16, metrics_path: &str, logs_path: &str) -> Receiver {
        let paths = (metrics_path.to_string(), logs_path.to_string());
        let sinks = Sinks {
            received: Received::default(),
            logs: ReceivedLogs::default(),
            misses: Arc::default(),
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let s = sinks.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
                    .await
                    .expect("binding the receiver");
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                let stopped = async {
                    let _ = stop_rx.await;
                };
                serve(kind, listener, s, paths, stopped).await;
            });
        });
        let addr = addr_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("receiver start");
        Receiver {
            addr,
            received: sinks.received,
            logs: sinks.logs,
            misses: sinks.misses,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serves `kind` on `listener` until `stopped`.
async fn serve(
    kind: Kind,
    listener: tokio::net::TcpListener,
    s: Sinks,
    (metrics_path, logs_path): (String, String),
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let incoming = tokio_stream::wrappers::TcpListenerStream::new;
    let metrics = MetricsServiceServer::new(Svc(s.received.clone()))
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
    let logs = LogsServiceServer::new(LogsSvc(s.logs.clone()))
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
    let mut builder = tonic::transport::Server::builder();
    let served = match kind {
        Kind::Http => {
            let app = http_app(&s, &metrics_path, &logs_path);
            return axum::serve(listener, app)
                .with_graceful_shutdown(stopped)
                .await
                .unwrap();
        }
        Kind::GrpcAndHttp => {
            let routes = tonic::service::Routes::from(http_app(&s, &metrics_path, &logs_path))
                .add_service(metrics)
                .add_service(logs);
            builder
                .accept_http1(true)
                .add_routes(routes)
                .serve_with_incoming_shutdown(incoming(listener), stopped)
                .await
        }
        Kind::Grpc | Kind::GrpcTls { .. } => {
            if let Kind::GrpcTls { cert, key } = &kind {
                let id = tonic::transport::Identity::from_pem(cert, key);
                builder = builder
                    .tls_config(tonic::transport::ServerTlsConfig::new().identity(id))
                    .expect("server TLS config");
            }
            builder
                .add_service(metrics)
                .add_service(logs)
                .serve_with_incoming_shutdown(incoming(listener), stopped)
                .await
        }
    };
    served.unwrap();
}

/// The HTTP/protobuf routes: metrics at `metrics_path`, logs at `logs_path`, any other
/// request recorded as a miss and refused with 404.
fn http_app(s: &Sinks, metrics_path: &str, logs_path: &str) -> axum::Router {
    let (r, l, misses) = (s.received.clone(), s.logs.clone(), s.misses.clone());
    axum::Router::new()
        .route(
            metrics_path,
            axum::routing::post(move |h, b| http_metrics(r.clone(), h, b)),
        )
        .route(
            logs_path,
            axum::routing::post(move |h, b| http_logs(l.clone(), h, b)),
        )
        .fallback(move |m: axum::http::Method, u: axum::http::Uri| {
            misses.lock().unwrap().push(format!("{m} {}", u.path()));
            async { axum::http::StatusCode::NOT_FOUND }
        })
        // An OpenTelemetry Collector's HTTP receiver takes 20 MiB by default
        // (`max_request_body_size`); axum's own default is 2 MB.
        .layer(axum::extract::DefaultBodyLimit::max(20 << 20))
}

/// POST of metrics over HTTP/protobuf.
async fn http_metrics(
    r: Received,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> (axum::http::StatusCode, Vec<u8>) {
    if !is_protobuf(&headers) {
        return (axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE, vec![]);
    }
    let Some(body) = decoded(&headers, body) else {
        return (axum::http::StatusCode::BAD_REQUEST, vec![]);
    };
    let Ok(req) = ExportMetricsServiceRequest::decode(body) else {
        return (axum::http::StatusCode::BAD_REQUEST, vec![]);
    };
    r.0.lock().unwrap().push((req, header_pairs(&headers)));
    (
        axum::http::StatusCode::OK,
        ExportMetricsServiceResponse::default().encode_to_vec(),
    )
}

/// Headers as (name, value) pairs; a value that is not text reads as "".
fn header_pairs(h: &axum::http::HeaderMap) -> Vec<(String, String)> {
    h.iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
        .collect()
}

// ---- helpers to read requests ----

/// The body as sent, or unzipped where its Content-Encoding says gzip (as a Collector's
/// HTTP receiver takes it); None for a gzip body that does not unzip.
fn decoded(headers: &axum::http::HeaderMap, body: axum::body::Bytes) -> Option<axum::body::Bytes> {
    let gzip = headers
        .get("content-encoding")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
    if !gzip {
        return Some(body);
    }
    let mut out = vec![];
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&body[..]), &mut out).ok()?;
    Some(out.into())
}

pub fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

pub fn attr_str<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match attr(attrs, key) {
        Some(any_value::Value::StringValue(s)) => Some(s),
        _ => None,
    }
}

/// The resource whose `container.id` is `id`.
pub fn container_resource<'a>(
    req: &'a ExportMetricsServiceRequest,
    id: &str,
) -> Option<&'a ResourceMetrics> {
    req.resource_metrics.iter().find(|rm| {
        rm.resource
            .as_ref()
            .is_some_and(|r| attr_str(&r.attributes, "container.id") == Some(id))
    })
}

pub fn metric<'a>(rm: &'a ResourceMetrics, name: &str) -> Option<&'a Metric> {
    rm.scope_metrics
        .iter()
        .flat_map(|s| s.metrics.iter())
        .find(|m| m.name == name)
}

pub fn points(m: &Metric) -> &[NumberDataPoint] {
    match &m.data {
        Some(Data::Gauge(g)) => &g.data_points,
        Some(Data::Sum(s)) => &s.data_points,
        _ => &[],
    }
}

pub fn value(p: &NumberDataPoint) -> f64 {
    use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value;
    match p.value {
        Some(Value::AsDouble(d)) => d,
        Some(Value::AsInt(i)) => i as f64,
        None => f64::NAN,
    }
}

/// Whether an HTTP request's body is OTLP's protobuf.
fn is_protobuf(headers: &axum::http::HeaderMap) -> bool {
    let ct = headers.get("content-type").and_then(|v| v.to_str().ok());
    ct == Some("application/x-protobuf")
}
