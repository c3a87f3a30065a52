//! The config written back out: the defaults that [`reference`] reads (and its tests walk),
//! and `gpu-agent check-config --print-default`. The two sections whose types live in the
//! otel crate, which only reads them, are written through mirrors here.
use std::{collections::BTreeMap, fmt::Write, path::PathBuf};

use serde::{Serialize, Serializer};

use super::{reference, Config, KeyDoc, TABLES};

/// `[otlp]` as the file spells it. The destructuring in [`otlp`] names every field, so a
/// field added to `OtlpConfig` does not compile until it is written here too.
#[derive(Serialize)]
struct Otlp<'a> {
    endpoint: &'a Option<String>,
    protocol: &'a Option<String>,
    headers: &'a BTreeMap<String, String>,
    timeout_ms: &'a Option<u64>,
    interval_ms: &'a Option<u64>,
    resource_attributes: &'a BTreeMap<String, String>,
    certificate: &'a Option<PathBuf>,
    compression: &'a Option<String>,
    max_queue_bytes: &'a Option<usize>,
    max_request_bytes: &'a Option<usize>,
}

pub(super) fn otlp<S: Serializer>(c: &otel::export::OtlpConfig, s: S) -> Result<S::Ok, S::Error> {
    let otel::export::OtlpConfig {
        endpoint,
        protocol,
        headers,
        timeout_ms,
        interval_ms,
        resource_attributes,
        certificate,
        compression,
        max_queue_bytes,
        max_request_bytes,
    } = c;
    Otlp {
        endpoint,
        protocol,
        headers,
        timeout_ms,
        interval_ms,
        resource_attributes,
        certificate,
        compression,
        max_queue_bytes,
        max_request_bytes,
    }
    .serialize(s)
}

/// `[metrics]` as the file spells it (`self`, not `self_metrics`).
#[derive(Serialize)]
struct Groups<'a> {
    device: bool,
    container: bool,
    process: bool,
    #[serde(rename = "self")]
    self_metrics: bool,
    drop_attributes: &'a [String],
}

pub(super) fn groups<S: Serializer>(g: &otel::Groups, s: S) -> Result<S::Ok, S::Error> {
    let otel::Groups {
        device,
        container,
        process,
        self_metrics,
        drop_attributes,
    } = g;
    Groups {
        device: *device,
        container: *container,
        process: *process,
        self_metrics: *self_metrics,
        drop_attributes,
    }
    .serialize(s)
}

impl Config {
    /// The default configuration as a TOML file that `check-config` accepts: every key of
    /// [`reference`], in its table, at its default; a key unset by default (TOML has no
    /// null) commented out with its example, as is a table whose keys all are.
    pub fn default_toml() -> String {
        let keys = reference();
        let mut out = String::from(
            "# gpu-agent's default configuration (gpu-agent check-config --print-default).\n\
             # Commented out: keys unset by default, with an example value.\n",
        );
        for (table, _) in TABLES {
            let keys: Vec<&KeyDoc> = keys.iter().filter(|k| k.table() == *table).collect();
            let unset = keys.iter().all(|k| k.default.is_none());
            if !table.is_empty() {
                let _ = writeln!(out, "\n{}[{table}]", if unset { "# " } else { "" });
            }
            for k in keys {
                let _ = match (&k.default, &k.example) {
                    (Some(v), _) => writeln!(out, "{} = {v}", k.name()),
                    (None, e) => writeln!(out, "# {} = {}", k.name(), e.as_deref().unwrap_or("")),
                };
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_printed_default_is_accepted_and_reads_back_as_the_default() {
        let text = Config::default_toml();
        let parsed = Config::from_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(parsed, Config::default());
        // What check-config does after parsing: the OTEL_* variables (none here).
        parsed.resolve(|_| None).unwrap();
    }

    #[test]
    fn the_mirrors_write_what_the_otel_sections_read() {
        let text = "[otlp]\nendpoint = \"http://c:4318\"\ntimeout_ms = 2000\n\
                    headers = { k = \"v\" }\n[metrics]\nself = false\n\
                    drop_attributes = [\"gpu\"]\n";
        let c = Config::from_toml(text).unwrap();
        let again = toml::to_string(&c).unwrap();
        assert_eq!(Config::from_toml(&again).unwrap(), c, "{again}");
    }
}
