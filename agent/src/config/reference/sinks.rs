//! The keys of the sinks' tables: `[otlp]` (its rules are otel/src/settings.rs's) and
//! `[usage]`.
use super::{key, KeyDoc, Type};
use crate::config::{Bounds, UsageConfig};

/// otel/src/settings.rs's rules for `[otlp]`: the otel crate validates them, and the tests
/// here check that it enforces these.
pub(super) const OTLP_TIMEOUT_MS: Bounds = Bounds::new(100, 600_000, "ms");
pub(super) const OTLP_INTERVAL_MS: Bounds = Bounds::new(100, 86_400_000, "ms");
pub(super) const OTLP_MIN_BYTES: u64 = otel::settings::MIN_BYTES as u64;
pub(super) const OTLP_QUEUE_BYTES: Bounds = Bounds::new(OTLP_MIN_BYTES, 1 << 30, "bytes");
pub(super) const OTLP_REQUEST_BYTES: Bounds = Bounds::new(OTLP_MIN_BYTES, 64 << 20, "bytes");
/// What otel uses for an unset key (tested too).
pub(super) const OTLP_TIMEOUT_DEFAULT_MS: u64 = 10_000;
pub(super) const OTLP_INTERVAL_DEFAULT_MS: u64 = 60_000;
pub(super) const OTLP_QUEUE_DEFAULT_MIB: usize = 8;
pub(super) const OTLP_REQUEST_DEFAULT_MIB: (usize, usize) = (8, 1);

pub(super) fn otlp() -> Vec<KeyDoc> {
    vec![
        key(
            "otlp.endpoint",
            Type::String,
            "Base URL of the collector (…:4318 for http/protobuf, …:4317 for gRPC); over \
             HTTP /v1/metrics (and /v1/logs for usage records) is appended. \
             OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is used as is. Unset, with no variable: \
             no push.",
        )
        .rule("an http:// or https:// URL")
        .example(r#""http://otel-collector:4318""#)
        .env(&[
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        ]),
        key(
            "otlp.protocol",
            Type::String,
            "Unset: http/protobuf (http/json is not supported).",
        )
        .one_of(&["http/protobuf", "grpc"])
        .example(r#""grpc""#)
        .env(&[
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
            "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL",
        ]),
        key(
            "otlp.headers",
            Type::Map,
            "Headers sent with every export (API keys); the variables (`k=v,k2=v2`, \
             percent-encoded) add to them, replacing a header of the same name; a \
             signal's own variable replaces the general one. Values are never printed.",
        )
        .example(r#"{ "x-api-key" = "secret" }"#)
        .env(&[
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
            "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
        ]),
        key(
            "otlp.timeout_ms",
            Type::Millis,
            format!("Per-export timeout. Unset: {OTLP_TIMEOUT_DEFAULT_MS}."),
        )
        .range(OTLP_TIMEOUT_MS)
        .example(OTLP_TIMEOUT_DEFAULT_MS.to_string())
        .env(&[
            "OTEL_EXPORTER_OTLP_TIMEOUT",
            "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
            "OTEL_EXPORTER_OTLP_LOGS_TIMEOUT",
        ]),
        key(
            "otlp.interval_ms",
            Type::Millis,
            format!("Push interval. Unset: {OTLP_INTERVAL_DEFAULT_MS}."),
        )
        .range(OTLP_INTERVAL_MS)
        .example(OTLP_INTERVAL_DEFAULT_MS.to_string())
        .env(&["OTEL_METRIC_EXPORT_INTERVAL"]),
        key(
            "otlp.resource_attributes",
            Type::Map,
            "Extra attributes on every resource; OTEL_RESOURCE_ATTRIBUTES (`k=v,k2=v2`) \
             adds to them. `service.name` is OTEL_SERVICE_NAME, else the `service.name` \
             given here, else gpu-agent.",
        )
        .example(r#"{ "deployment.environment" = "prod" }"#)
        .env(&["OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME"]),
    ]
    .into_iter()
    .chain(otlp_transport())
    .collect()
}

/// `[otlp]`'s transport keys: TLS, compression, the queue and request sizes.
fn otlp_transport() -> Vec<KeyDoc> {
    vec![
        key(
            "otlp.certificate",
            Type::Path,
            "CA bundle (PEM) for an https endpoint. Unset: the system's roots.",
        )
        .example(r#""/etc/ssl/collector-ca.pem""#)
        .env(&[
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE",
        ]),
        key("otlp.compression", Type::String, "Unset: none.")
            .one_of(&["gzip", "none"])
            .example(r#""gzip""#)
            .env(&[
                "OTEL_EXPORTER_OTLP_COMPRESSION",
                "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION",
                "OTEL_EXPORTER_OTLP_LOGS_COMPRESSION",
            ]),
        key(
            "otlp.max_queue_bytes",
            Type::Bytes,
            format!(
                "Unsent batches kept while the collector is unreachable. Unset: \
             {OTLP_QUEUE_DEFAULT_MIB} MiB."
            ),
        )
        .range(OTLP_QUEUE_BYTES)
        .example((OTLP_QUEUE_DEFAULT_MIB << 20).to_string()),
        key(
            "otlp.max_request_bytes",
            Type::Bytes,
            format!(
                "How big one request grows (whole resources) before the next one starts; \
             lowered by itself when the collector refuses a request as too large. Unset: \
             {} MiB over http/protobuf, {} MiB over gRPC.",
                OTLP_REQUEST_DEFAULT_MIB.0, OTLP_REQUEST_DEFAULT_MIB.1
            ),
        )
        .range(OTLP_REQUEST_BYTES)
        .example((OTLP_REQUEST_DEFAULT_MIB.0 << 20).to_string()),
    ]
}

pub(super) fn usage() -> Vec<KeyDoc> {
    vec![
        key(
            "usage.records",
            Type::Bool,
            "Emit a usage record when a container stops using a device: as OTLP logs when \
             an endpoint is configured, and to `usage.file` when set.",
        ),
        key(
            "usage.file",
            Type::Path,
            "Append each record to this JSON-lines file (`gpu-agent report` reads it).",
        )
        .rule("a file, not a directory")
        .example(r#""/var/lib/gpu-agent/usage.jsonl""#),
        key(
            "usage.file_max_bytes",
            Type::Bytes,
            "Rotate the file beyond this size: file -> file.1 -> ... -> file.<file_keep>.",
        )
        .range(UsageConfig::FILE_MAX_BYTES),
        key("usage.file_keep", Type::Count, "Rotated files kept.").range(UsageConfig::FILE_KEEP),
        key(
            "usage.queue_records",
            Type::Count,
            "Records kept while the collector is unreachable; the oldest beyond are \
             dropped and counted (`usage_records_dropped`).",
        )
        .range(UsageConfig::QUEUE_RECORDS),
        key(
            "usage.accounting",
            Type::Bool,
            "Read NVML's per-process accounting stats when a GPU process exits (needs \
             accounting mode on the GPU: `nvidia-smi -am 1`).",
        ),
        key(
            "usage.hami_limits",
            Type::Bool,
            "Read HAMi's CUDA_DEVICE_MEMORY_LIMIT* and CUDA_DEVICE_SM_LIMIT from GPU \
             processes' environments (/proc/PID/environ).",
        ),
        key(
            "usage.peak_window_secs",
            Type::Secs,
            "The window of `container.gpu.memory.peak`; match it to the export interval.",
        )
        .range(UsageConfig::PEAK_WINDOW_SECS),
        key(
            "usage.max_record_secs",
            Type::Secs,
            "A stretch of use longer than this is cut into records (reason `checkpoint`), \
             each starting where the last ended: a crash loses at most this much.",
        )
        .range(UsageConfig::MAX_RECORD_SECS),
    ]
}
