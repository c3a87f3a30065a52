//! OTLP settings: the `[otlp]` config section under the standard OTEL_* variables, resolved
//! once and validated whole, so that a bad value stops start-up with its name instead of
//! failing every export later. Secrets (URL credentials, header values) never appear in
//! what this module prints.
use std::{collections::BTreeMap, fmt, path::PathBuf, time::Duration};

use serde::Deserialize;

/// The `[otlp]` section of the config file. Each key is overridden by its standard
/// environment variable when that is set, the signal's own (`OTEL_EXPORTER_OTLP_METRICS_*`,
/// `OTEL_EXPORTER_OTLP_LOGS_*`) over the general one.
#[derive(Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OtlpConfig {
    /// Base URL (…:4317 for gRPC, …:4318 for HTTP). OTEL_EXPORTER_OTLP_ENDPOINT; a
    /// signal's own OTEL_EXPORTER_OTLP_{METRICS,LOGS}_ENDPOINT is used as is. Unset: no push.
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
    /// How big an OTLP request grows (whole resources) before the next one starts. Default
    /// 8 MiB over HTTP/protobuf (an OpenTelemetry Collector takes 20 MiB), 1 MiB over gRPC
    /// (it takes 4 MiB a message). Lowered by itself when the collector refuses a request
    /// as too large.
    pub max_request_bytes: Option<usize>,
}

/// Header values are secrets (API keys, tokens): never printed.
impl fmt::Debug for OtlpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OtlpConfig")
            .field("endpoint", &self.endpoint.as_deref().map(redact_url))
            .field("protocol", &self.protocol)
            .field("headers", &redacted(self.headers.keys()))
            .field("timeout_ms", &self.timeout_ms)
            .field("interval_ms", &self.interval_ms)
            .field("resource_attributes", &self.resource_attributes)
            .field("certificate", &self.certificate)
            .field("compression", &self.compression)
            .field("max_queue_bytes", &self.max_queue_bytes)
            .field("max_request_bytes", &self.max_request_bytes)
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
}

/// Everything resolved: what the exporter runs with.
#[derive(Clone, PartialEq)]
pub struct OtlpSettings {
    /// Full URL: the gRPC endpoint, or the HTTP URL including the signal's path. May hold
    /// credentials: print `redacted_url()`.
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
    pub max_request_bytes: usize,
}

impl OtlpSettings {
    /// The URL as logs and endpoints may show it: user and password replaced.
    pub fn redacted_url(&self) -> String {
        redact_url(&self.url)
    }
}

impl fmt::Debug for OtlpSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OtlpSettings")
            .field("url", &self.redacted_url())
            .field("protocol", &self.protocol)
            .field("headers", &redacted(self.headers.iter().map(|(k, _)| k)))
            .field("timeout", &self.timeout)
            .field("interval", &self.interval)
            .field("resource_attributes", &self.resource_attributes)
            .field("service_name", &self.service_name)
            .field("certificate", &self.certificate)
            .field("gzip", &self.gzip)
            .field("max_queue_bytes", &self.max_queue_bytes)
            .field("max_request_bytes", &self.max_request_bytes)
            .finish()
    }
}

fn redacted<'a>(keys: impl Iterator<Item = &'a String>) -> Vec<String> {
    keys.map(|k| format!("{k}: <redacted>")).collect()
}

/// `scheme://user:password@host/...` -> `scheme://<redacted>@host/...`; anything else as
/// it is.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://<redacted>@{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

/// Comma-separated k=v pairs, values percent-decoded (the OTEL_*_HEADERS format). Errors
/// name the entry by position: its text may be a secret.
pub fn parse_pairs(s: &str) -> Result<Vec<(String, String)>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .enumerate()
        .map(|(i, p)| {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| format!("entry {} is not key=value", i + 1))?;
            Ok((percent_decode(k.trim()), percent_decode(v.trim())))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The metrics' push interval (the logs go as records come).
const INTERVAL: &str = "OTEL_METRIC_EXPORT_INTERVAL";

/// Looks a variable up, blank counting as unset.
type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// What is pushed over OTLP. Each signal resolves its own settings, by the OTLP exporter
/// spec's rules: `OTEL_EXPORTER_OTLP_{SIGNAL}_*` over `OTEL_EXPORTER_OTLP_*` over the
/// `[otlp]` key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Metrics,
    /// Usage records.
    Logs,
}

impl Signal {
    fn var(self, option: &str) -> String {
        let signal = match self {
            Signal::Metrics => "METRICS",
            Signal::Logs => "LOGS",
        };
        format!("OTEL_EXPORTER_OTLP_{signal}_{option}")
    }

    /// Appended to the base endpoint over HTTP.
    fn path(self) -> &'static str {
        match self {
            Signal::Metrics => "/v1/metrics",
            Signal::Logs => "/v1/logs",
        }
    }
}

/// The signal's variable for `option` when set, else the general one: (name, value).
fn option(env: Env, signal: Signal, option: &str) -> Option<(String, String)> {
    [signal.var(option), format!("OTEL_EXPORTER_OTLP_{option}")]
        .into_iter()
        .find_map(|var| env(&var).map(|v| (var, v)))
}

/// The HTTP URL of `signal` under a base endpoint: the base, its trailing slash dropped,
/// plus `/v1/metrics` or `/v1/logs`. A base that already ends in `/v1/metrics` (the
/// metrics URL given as the base) counts without it.
pub fn signal_url(base: &str, signal: Signal) -> String {
    let base = base.trim_end_matches('/');
    let base = base.strip_suffix("/v1/metrics").unwrap_or(base);
    format!("{base}{}", signal.path())
}

impl OtlpConfig {
    /// The metrics' settings: `resolve_signal(Signal::Metrics, env)`.
    pub fn resolve(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<OtlpSettings>, String> {
        self.resolve_signal(Signal::Metrics, env)
    }

    /// Resolves the config against the environment (`env` looks a variable up) for one
    /// signal. None when no endpoint is configured for it anywhere. Errors name the
    /// variable or key and the range.
    pub fn resolve_signal(
        &self,
        signal: Signal,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<OtlpSettings>, String> {
        let env = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        let env: Env = &env;
        let protocol = self.protocol(env, signal)?;
        let Some(url) = self.url(env, signal, protocol)? else {
            return Ok(None);
        };
        let (resource_attributes, service_name) = self.resource(env)?;
        Ok(Some(OtlpSettings {
            url,
            protocol,
            headers: self.headers(env, signal)?,
            timeout: millis(
                option(env, signal, "TIMEOUT"),
                ("otlp.timeout_ms", "OTEL_EXPORTER_OTLP_TIMEOUT"),
                self.timeout_ms,
                (10_000, 100, 600_000),
            )?,
            interval: millis(
                env(INTERVAL).map(|v| (INTERVAL.into(), v)),
                ("otlp.interval_ms", INTERVAL),
                self.interval_ms,
                (60_000, 100, 86_400_000),
            )?,
            resource_attributes,
            service_name,
            certificate: self.certificate(env, signal)?,
            gzip: self.gzip(env, signal)?,
            max_queue_bytes: self.queue_bytes()?,
            max_request_bytes: self.request_bytes(protocol)?,
        }))
    }

    fn protocol(&self, env: Env, signal: Signal) -> Result<Protocol, String> {
        let (from, v) = match option(env, signal, "PROTOCOL") {
            Some((var, v)) => (var, Some(v)),
            None => ("OTEL_EXPORTER_OTLP_PROTOCOL".into(), self.protocol.clone()),
        };
        match v.as_deref() {
            None | Some("http/protobuf") => Ok(Protocol::HttpProtobuf),
            Some("grpc") => Ok(Protocol::Grpc),
            Some(other) => Err(format!(
                "otlp.protocol / {from}: {other:?} is not grpc or http/protobuf (http/json is \
                 not supported)"
            )),
        }
    }

    /// The URL to push to, checked to be one: a typo here would otherwise fail every export.
    /// The signal's own endpoint is used as it is; the base gets the signal's path over
    /// HTTP and is the target itself over gRPC.
    fn url(&self, env: Env, signal: Signal, protocol: Protocol) -> Result<Option<String>, String> {
        let specific = signal.var("ENDPOINT");
        let (url, from) = if let Some(u) = env(&specific) {
            (u, specific)
        } else if let Some(base) =
            env("OTEL_EXPORTER_OTLP_ENDPOINT").or_else(|| self.endpoint.clone())
        {
            let url = match protocol {
                Protocol::Grpc => base,
                Protocol::HttpProtobuf => signal_url(&base, signal),
            };
            (url, "otlp.endpoint / OTEL_EXPORTER_OTLP_ENDPOINT".into())
        } else {
            return Ok(None);
        };
        let shown = redact_url(&url);
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "{from}: {shown:?} must start with http:// or https://"
            ));
        }
        let parsed = reqwest::Url::parse(&url)
            .map_err(|e| format!("{from}: {shown:?} is not a valid URL: {e}"))?;
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(format!("{from}: {shown:?} has no host"));
        }
        // gRPC's own parser is stricter than the URL one (a space in the path).
        if protocol == Protocol::Grpc
            && tonic::transport::Endpoint::from_shared(url.clone()).is_err()
        {
            return Err(format!("{from}: {shown:?} is not a valid gRPC target"));
        }
        Ok(Some(url))
    }

    /// Header names must be HTTP tokens and values printable: checked here, not at the
    /// first send. Values are never echoed. The signal's variable replaces the general
    /// one; either overrides the config's headers by name.
    fn headers(&self, env: Env, signal: Signal) -> Result<Vec<(String, String)>, String> {
        let mut headers: Vec<(String, String)> = self
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut from = "OTEL_EXPORTER_OTLP_HEADERS".to_string();
        if let Some((var, h)) = option(env, signal, "HEADERS") {
            for (k, v) in parse_pairs(&h).map_err(|e| format!("{var}: {e}"))? {
                headers.retain(|(hk, _)| !hk.eq_ignore_ascii_case(&k));
                headers.push((k, v));
            }
            from = var;
        }
        for (k, v) in &headers {
            if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err() {
                return Err(format!(
                    "otlp.headers / {from}: {k:?} is not a valid header name"
                ));
            }
            if reqwest::header::HeaderValue::from_str(v).is_err() {
                return Err(format!(
                    "otlp.headers / {from}: the value of {k:?} is not a valid header value \
                     (control characters such as a newline?)"
                ));
            }
        }
        Ok(headers)
    }

    /// Resource attributes, and the service name they or OTEL_SERVICE_NAME give.
    fn resource(&self, env: Env) -> Result<(Vec<(String, String)>, String), String> {
        let mut attributes: Vec<(String, String)> = self
            .resource_attributes
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if let Some(r) = env("OTEL_RESOURCE_ATTRIBUTES") {
            for (k, v) in parse_pairs(&r).map_err(|e| format!("OTEL_RESOURCE_ATTRIBUTES: {e}"))? {
                attributes.retain(|(rk, _)| rk != &k);
                attributes.push((k, v));
            }
        }
        let service_name = env("OTEL_SERVICE_NAME")
            .or_else(|| {
                attributes
                    .iter()
                    .find(|(k, _)| k == "service.name")
                    .map(|(_, v)| v.clone())
            })
            .unwrap_or_else(|| "gpu-agent".into());
        Ok((attributes, service_name))
    }

    fn gzip(&self, env: Env, signal: Signal) -> Result<bool, String> {
        let (from, v) = match option(env, signal, "COMPRESSION") {
            Some((var, v)) => (var, Some(v)),
            None => (
                "OTEL_EXPORTER_OTLP_COMPRESSION".into(),
                self.compression.clone(),
            ),
        };
        match v.as_deref() {
            None | Some("none") => Ok(false),
            Some("gzip") => Ok(true),
            Some(o) => Err(format!(
                "otlp.compression / {from}: {o:?} is not gzip or none"
            )),
        }
    }

    /// The CA bundle must be there and hold PEM certificates.
    fn certificate(&self, env: Env, signal: Signal) -> Result<Option<PathBuf>, String> {
        let (from, c) = match option(env, signal, "CERTIFICATE") {
            Some((var, v)) => (var, PathBuf::from(v)),
            None => match &self.certificate {
                Some(c) => ("OTEL_EXPORTER_OTLP_CERTIFICATE".into(), c.clone()),
                None => return Ok(None),
            },
        };
        let at = format!("otlp.certificate / {from}: {}", c.display());
        let pem = read_small_file(&c).map_err(|e| format!("{at}: {e}"))?;
        match reqwest::Certificate::from_pem_bundle(&pem) {
            Ok(certs) if !certs.is_empty() => Ok(Some(c)),
            _ => Err(format!("{at} holds no PEM certificate")),
        }
    }

    fn queue_bytes(&self) -> Result<usize, String> {
        bytes(
            "otlp.max_queue_bytes",
            self.max_queue_bytes,
            8 << 20,
            1 << 30,
        )
    }

    /// One request per export on most nodes over HTTP: each request costs the agent about
    /// 0.15 ms of CPU besides its bytes (measured on the large node, docs/benchmarks.md).
    fn request_bytes(&self, protocol: Protocol) -> Result<usize, String> {
        let default = match protocol {
            Protocol::HttpProtobuf => 8 << 20,
            Protocol::Grpc => 1 << 20,
        };
        bytes(
            "otlp.max_request_bytes",
            self.max_request_bytes,
            default,
            64 << 20,
        )
    }
}

/// The smallest byte budget a key takes.
pub const MIN_BYTES: usize = 64 << 10;

/// A byte budget `key` gives, `default` when unset, within `MIN_BYTES..=max`.
fn bytes(key: &str, v: Option<usize>, default: usize, max: usize) -> Result<usize, String> {
    match v {
        None => Ok(default),
        Some(b) if (MIN_BYTES..=max).contains(&b) => Ok(b),
        Some(b) => Err(format!("{key}: {b} is outside {MIN_BYTES}..={max}")),
    }
}

/// A CA bundle is a few KiB: a path to a device or a huge file (`/dev/zero`) must not
/// hang or exhaust the agent at start.
pub(crate) fn read_small_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    const MAX: u64 = 1 << 20;
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() || meta.len() > MAX {
        return Err(std::io::Error::other(format!(
            "not a regular file of at most {MAX} bytes"
        )));
    }
    std::fs::read(path)
}

/// A duration in milliseconds from a variable (name, value), else the config's key, else
/// the default; `(default, min, max)`. `(key, var)`: what errors name when no variable is
/// set.
fn millis(
    set: Option<(String, String)>,
    (key, var): (&str, &str),
    cfg: Option<u64>,
    (default, min, max): (u64, u64, u64),
) -> Result<Duration, String> {
    let (var, v) = match set {
        Some((var, v)) => {
            let ms = v
                .trim()
                .parse::<u64>()
                .map_err(|_| format!("{var}: {v:?} is not a number of milliseconds"))?;
            (var, ms)
        }
        None => (var.to_string(), cfg.unwrap_or(default)),
    };
    if !(min..=max).contains(&v) {
        return Err(format!("{key} / {var}: {v} ms is outside {min}..={max} ms"));
    }
    Ok(Duration::from_millis(v))
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

    fn resolve_err(vars: &[(&str, &str)]) -> String {
        // The first match wins: the default endpoint goes last.
        let mut all = vars.to_vec();
        all.push(("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"));
        OtlpConfig::default().resolve(env(&all)).unwrap_err()
    }

    #[test]
    fn values_that_would_fail_every_export_are_refused_at_start() {
        let e = resolve_err(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://[::1")]);
        assert!(e.contains("not a valid URL"), "{e}");
        let e = resolve_err(&[("OTEL_EXPORTER_OTLP_HEADERS", "x api key=1")]);
        assert!(e.contains("not a valid header name"), "{e}");
        let e = resolve_err(&[("OTEL_EXPORTER_OTLP_HEADERS", "x-key=s3cr3t%0Aevil: 1")]);
        assert!(e.contains("not a valid header value"), "{e}");
        assert!(!e.contains("s3cr3t"), "a secret in an error: {e}");
        let e = resolve_err(&[("OTEL_METRIC_EXPORT_INTERVAL", "1")]);
        assert!(
            e.contains("otlp.interval_ms") && e.contains("100..="),
            "{e}"
        );
        let e = resolve_err(&[("OTEL_EXPORTER_OTLP_TIMEOUT", "99999999999")]);
        assert!(e.contains("otlp.timeout_ms"), "{e}");
        let not_pem = std::env::temp_dir().join(format!("not-pem-{}", std::process::id()));
        std::fs::write(&not_pem, "hello").unwrap();
        let e = resolve_err(&[("OTEL_EXPORTER_OTLP_CERTIFICATE", not_pem.to_str().unwrap())]);
        let _ = std::fs::remove_file(&not_pem);
        assert!(e.contains("no PEM certificate"), "{e}");
        let e = OtlpConfig {
            endpoint: Some("http://c:4318".into()),
            max_queue_bytes: Some(1),
            ..Default::default()
        }
        .resolve(env(&[]))
        .unwrap_err();
        assert!(e.contains("otlp.max_queue_bytes"), "{e}");
        let e = OtlpConfig {
            endpoint: Some("http://c:4318".into()),
            max_request_bytes: Some(1 << 30),
            ..Default::default()
        }
        .resolve(env(&[]))
        .unwrap_err();
        assert!(e.contains("otlp.max_request_bytes"), "{e}");
    }

    #[test]
    fn requests_are_bigger_over_http_than_over_grpc_unless_configured() {
        let resolve = |protocol: &str, max: Option<usize>| {
            OtlpConfig {
                endpoint: Some("http://c:4318".into()),
                protocol: Some(protocol.into()),
                max_request_bytes: max,
                ..Default::default()
            }
            .resolve(env(&[]))
            .unwrap()
            .unwrap()
            .max_request_bytes
        };
        assert_eq!(resolve("http/protobuf", None), 8 << 20);
        assert_eq!(resolve("grpc", None), 1 << 20);
        assert_eq!(resolve("grpc", Some(3 << 20)), 3 << 20);
    }

    #[test]
    fn secrets_are_never_printed() {
        assert_eq!(
            redact_url("http://user:s3cr3t@host:4318/v1/metrics"),
            "http://<redacted>@host:4318/v1/metrics"
        );
        assert_eq!(redact_url("https://host/p@th"), "https://host/p@th");
        let s = OtlpConfig {
            endpoint: Some("http://user:s3cr3t@host:4318".into()),
            headers: [("authorization".to_string(), "Bearer s3cr3t".to_string())].into(),
            ..Default::default()
        };
        assert!(!format!("{s:?}").contains("s3cr3t"), "{s:?}");
        let settings = s.resolve(env(&[])).unwrap().unwrap();
        assert!(!format!("{settings:?}").contains("s3cr3t"), "{settings:?}");
        assert!(!settings.redacted_url().contains("s3cr3t"));
        let e = resolve_err(&[("OTEL_EXPORTER_OTLP_HEADERS", "Authorization Bearer s3cr3t")]);
        assert!(!e.contains("s3cr3t"), "{e}");
    }

    /// Where each signal goes, and how: (url, protocol), None for no push.
    type Target = Option<(&'static str, Protocol)>;
    type Vars<'a> = Vec<(&'a str, &'a str)>;
    type Headers = Vec<(String, String)>;

    fn target(cfg: &OtlpConfig, signal: Signal, vars: &[(&str, &str)]) -> Target {
        let s = cfg.resolve_signal(signal, env(vars)).unwrap()?;
        Some((s.url.leak(), s.protocol))
    }

    /// The OTLP exporter spec's rules (protocol/exporter.md): a signal's own endpoint as is;
    /// else the base plus `/v1/<signal>` over HTTP, the base itself over gRPC; each option's
    /// signal variable over the general one over the config file.
    #[test]
    fn each_signal_resolves_its_url_and_protocol_by_the_spec() {
        use Protocol::{Grpc, HttpProtobuf as Http};
        const BASE: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
        const METRICS: &str = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT";
        const LOGS: &str = "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT";
        const PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
        let file = |endpoint: &str, protocol: Option<&str>| OtlpConfig {
            endpoint: Some(endpoint.into()),
            protocol: protocol.map(Into::into),
            ..Default::default()
        };
        let none = OtlpConfig::default();
        #[rustfmt::skip]
        let cases: Vec<(&str, OtlpConfig, Vars, Target, Target)> = vec![
            ("the spec's example: a custom metrics path, logs from the base", none.clone(),
                vec![(BASE, "http://collector:4318"), (METRICS, "http://collector:4318/custom/metrics/path")],
                Some(("http://collector:4318/custom/metrics/path", Http)),
                Some(("http://collector:4318/v1/logs", Http))),
            ("a base over HTTP", none.clone(), vec![(BASE, "http://c:4318")],
                Some(("http://c:4318/v1/metrics", Http)), Some(("http://c:4318/v1/logs", Http))),
            ("a base with a path and a trailing slash", none.clone(), vec![(BASE, "https://c/otlp/")],
                Some(("https://c/otlp/v1/metrics", Http)), Some(("https://c/otlp/v1/logs", Http))),
            ("a base over gRPC is the target itself", none.clone(),
                vec![(BASE, "http://c:4317"), (PROTOCOL, "grpc")],
                Some(("http://c:4317", Grpc)), Some(("http://c:4317", Grpc))),
            ("a signal's own protocol", none.clone(),
                vec![(BASE, "http://c:4317"), (PROTOCOL, "grpc"), ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "http/protobuf")],
                Some(("http://c:4317", Grpc)), Some(("http://c:4317/v1/logs", Http))),
            ("the metrics' protocol is not the logs'", none.clone(),
                vec![(BASE, "http://c:4317"), ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc")],
                Some(("http://c:4317", Grpc)), Some(("http://c:4317/v1/logs", Http))),
            ("a metrics endpoint alone: no logs", none.clone(), vec![(METRICS, "http://m:4318/x")],
                Some(("http://m:4318/x", Http)), None),
            ("a logs endpoint alone: no metrics", none.clone(), vec![(LOGS, "http://l:4318/logs")],
                None, Some(("http://l:4318/logs", Http))),
            ("a logs endpoint over gRPC, as is", none.clone(),
                vec![(BASE, "http://c:4317"), (PROTOCOL, "grpc"), (LOGS, "https://l:4317")],
                Some(("http://c:4317", Grpc)), Some(("https://l:4317", Grpc))),
            ("the config file's endpoint is a base", file("http://file:4318", None), vec![],
                Some(("http://file:4318/v1/metrics", Http)), Some(("http://file:4318/v1/logs", Http))),
            ("the environment overrides the file", file("http://file:4318", Some("grpc")),
                vec![(BASE, "http://env:4318"), (PROTOCOL, "http/protobuf")],
                Some(("http://env:4318/v1/metrics", Http)), Some(("http://env:4318/v1/logs", Http))),
            ("a base that is the metrics URL already", file("http://c:4318/v1/metrics", None), vec![],
                Some(("http://c:4318/v1/metrics", Http)), Some(("http://c:4318/v1/logs", Http))),
            ("blank is unset", none.clone(), vec![(METRICS, " "), (LOGS, ""), (BASE, "http://c:4318")],
                Some(("http://c:4318/v1/metrics", Http)), Some(("http://c:4318/v1/logs", Http))),
            ("nothing configured", none.clone(), vec![(PROTOCOL, "grpc")], None, None),
        ];
        for (what, cfg, vars, metrics, logs) in cases {
            assert_eq!(
                target(&cfg, Signal::Metrics, &vars),
                metrics,
                "metrics: {what}"
            );
            assert_eq!(target(&cfg, Signal::Logs, &vars), logs, "logs: {what}");
        }
    }

    #[test]
    fn each_signal_takes_its_own_headers_timeout_compression_and_certificate() {
        let ca = std::env::temp_dir().join(format!("signal-ca-{}.pem", std::process::id()));
        // PEM armour is all the check reads.
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let file = OtlpConfig {
            endpoint: Some("https://c:4318".into()),
            headers: [
                ("a".to_string(), "file".to_string()),
                ("c".into(), "file".into()),
            ]
            .into(),
            ..Default::default()
        };
        let h = |v: &[(&str, &str)]| -> Headers {
            v.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        #[rustfmt::skip]
        let cases: Vec<(&str, Vars, Headers, Headers)> = vec![
            ("the file's headers", vec![], h(&[("a", "file"), ("c", "file")]), h(&[("a", "file"), ("c", "file")])),
            ("the general variable overrides the file by name",
                vec![("OTEL_EXPORTER_OTLP_HEADERS", "a=env,b=env")],
                h(&[("c", "file"), ("a", "env"), ("b", "env")]), h(&[("c", "file"), ("a", "env"), ("b", "env")])),
            ("a signal's variable replaces the general one",
                vec![("OTEL_EXPORTER_OTLP_HEADERS", "a=env,b=env"), ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "b=m%3D")],
                h(&[("a", "file"), ("c", "file"), ("b", "m=")]), h(&[("c", "file"), ("a", "env"), ("b", "env")])),
            ("the logs' own", vec![("OTEL_EXPORTER_OTLP_LOGS_HEADERS", "x-logs=1")],
                h(&[("a", "file"), ("c", "file")]), h(&[("a", "file"), ("c", "file"), ("x-logs", "1")])),
        ];
        for (what, vars, metrics, logs) in cases {
            let m = file
                .resolve_signal(Signal::Metrics, env(&vars))
                .unwrap()
                .unwrap();
            let l = file
                .resolve_signal(Signal::Logs, env(&vars))
                .unwrap()
                .unwrap();
            assert_eq!((m.headers, l.headers), (metrics, logs), "{what}");
        }
        let vars = [
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "3000"),
            ("OTEL_EXPORTER_OTLP_LOGS_TIMEOUT", "2000"),
            ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "gzip"),
            ("OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE", ca.to_str().unwrap()),
        ];
        let m = file
            .resolve_signal(Signal::Metrics, env(&vars))
            .unwrap()
            .unwrap();
        let l = file
            .resolve_signal(Signal::Logs, env(&vars))
            .unwrap()
            .unwrap();
        let _ = std::fs::remove_file(&ca);
        assert_eq!(
            (m.timeout, l.timeout),
            (Duration::from_secs(3), Duration::from_secs(2))
        );
        assert_eq!((m.gzip, l.gzip), (true, false));
        assert_eq!((m.certificate, l.certificate), (None, Some(ca)));
    }

    #[test]
    fn a_bad_signal_variable_is_named() {
        let base = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        let logs_err = |v: (&str, &str)| {
            OtlpConfig::default()
                .resolve_signal(Signal::Logs, env(&[v, base]))
                .unwrap_err()
        };
        for (var, value, says) in [
            (
                "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
                "collector:4318",
                "http://",
            ),
            ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "http/json", "not grpc"),
            (
                "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
                "bad name=1",
                "not a valid header name",
            ),
            ("OTEL_EXPORTER_OTLP_LOGS_TIMEOUT", "soon", "milliseconds"),
            ("OTEL_EXPORTER_OTLP_LOGS_TIMEOUT", "1", "100..="),
            (
                "OTEL_EXPORTER_OTLP_LOGS_COMPRESSION",
                "zstd",
                "gzip or none",
            ),
            (
                "OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE",
                "/nonexistent.pem",
                "No such file",
            ),
        ] {
            let e = logs_err((var, value));
            assert!(e.contains(var) && e.contains(says), "{var}={value}: {e}");
        }
        // The metrics do not read the logs' variables.
        let m = OtlpConfig::default().resolve_signal(
            Signal::Metrics,
            env(&[("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "http/json"), base]),
        );
        assert!(m.is_ok(), "{m:?}");
        // gRPC's parser is stricter than the URL one: refused at start, not at each send.
        let e = OtlpConfig::default()
            .resolve(env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317/a b"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ]))
            .unwrap_err();
        assert!(e.contains("not a valid gRPC target"), "{e}");
    }

    #[test]
    fn percent_decoding_never_splits_a_character() {
        assert_eq!(percent_decode("a%3Db%2"), "a=b%2");
        assert_eq!(percent_decode("%é%"), "%é%");
    }
}
