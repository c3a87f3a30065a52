use std::{cell::RefCell, collections::BTreeSet, time::Duration};

use super::*;

fn value(toml_value: &str) -> toml::Value {
    let mut t: toml::Table = toml::from_str(&format!("v = {toml_value}"))
        .unwrap_or_else(|e| panic!("{toml_value}: {e}"));
    t.remove("v").unwrap()
}

/// `t` with the dotted `key` set to `v`, tables made on the way.
fn set(t: &mut toml::Table, key: &str, v: toml::Value) {
    let (tables, last) = key
        .rsplit_once('.')
        .map_or((None, key), |(a, b)| (Some(a), b));
    let mut t = t;
    for name in tables.into_iter().flat_map(|s| s.split('.')) {
        t = t
            .entry(name)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .unwrap();
    }
    t.insert(last.into(), v);
}

/// Every key that is unset by default set to its example.
fn examples() -> toml::Table {
    let mut t = toml::Table::new();
    for k in reference() {
        if let Some(e) = &k.example {
            set(&mut t, k.key, value(e));
        }
    }
    t
}

/// Parsed only: files named in it need not exist, but an unknown key is refused.
fn parse(t: &toml::Table) -> Result<Config, String> {
    toml::from_str(&toml::to_string(t).unwrap()).map_err(|e| e.to_string())
}

/// What `check-config` says about the default config with `key` set to `v` (and an OTLP
/// endpoint, so that `[otlp]` is validated too).
fn check(key: &str, v: toml::Value) -> Result<(), String> {
    let mut t = toml::Table::new();
    set(&mut t, "otlp.endpoint", "http://c:4318".into());
    set(&mut t, key, v);
    let text = toml::to_string(&t).unwrap();
    Config::from_toml(&text)
        .and_then(|c| c.resolve(|_| None))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The keys under `v` (at `path`), stopping at documented ones, which go into `found`;
/// what is not documented, or documented but null (so its inside is not seen), is an error.
fn walk(
    v: &serde_json::Value,
    path: &str,
    documented: &BTreeSet<&str>,
    found: &mut BTreeSet<String>,
    errors: &mut Vec<String>,
) {
    if documented.contains(path) {
        if v.is_null() {
            errors.push(format!("{path}: unset by default and has no example"));
        }
        found.insert(path.to_string());
        return;
    }
    match v.as_object() {
        Some(m) => {
            for (k, v) in m {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                walk(v, &p, documented, found, errors);
            }
        }
        None => errors.push(format!("{path}: not in agent/src/config/reference.rs")),
    }
}

/// A new field without an entry fails here, as does an entry for a key that is gone.
/// Every key unset by default has an example, and the config with all of them set is
/// walked, so that the inside of an optional table (`[http.tls]`) is seen too.
#[test]
fn every_key_is_documented_and_every_documented_key_exists() {
    let docs = reference();
    let documented: BTreeSet<&str> = docs.iter().map(|k| k.key).collect();
    assert_eq!(documented.len(), docs.len(), "a key documented twice");
    let full = parse(&examples()).unwrap_or_else(|e| panic!("the examples: {e}"));
    let (mut found, mut errors) = (BTreeSet::new(), vec![]);
    let json = serde_json::to_value(&full).unwrap();
    walk(&json, "", &documented, &mut found, &mut errors);
    for k in &documented {
        if !found.contains(*k) {
            errors.push(format!("{k}: documented, but the config has no such key"));
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

#[test]
fn types_defaults_and_examples_fit_what_is_documented() {
    let full = serde_json::to_value(parse(&examples()).unwrap()).unwrap();
    for k in reference() {
        let v = full.pointer(&pointer(k.key)).unwrap();
        let fits = match k.ty {
            Type::Bool => v.is_boolean(),
            Type::Count | Type::Millis | Type::Secs | Type::Bytes => v.is_u64(),
            Type::String | Type::Path | Type::Address => v.is_string(),
            Type::Map => v
                .as_object()
                .is_some_and(|m| m.values().all(|v| v.is_string())),
            Type::List => v
                .as_array()
                .is_some_and(|a| a.iter().all(|v| v.is_string())),
        };
        assert!(fits, "{}: {v} is not a {}", k.key, k.ty.name());
        match &k.allowed {
            Allowed::Range(b) => {
                assert_eq!(Some(b.unit), k.ty.unit(), "{}: the range's unit", k.key);
                let n = v.as_u64().unwrap();
                assert!(
                    (b.min..=b.max).contains(&n),
                    "{}: {n} is outside its range",
                    k.key
                );
            }
            Allowed::OneOf(values) => {
                assert!(values.contains(&v.as_str().unwrap()), "{}: {v}", k.key);
            }
            Allowed::Any | Allowed::Rule(_) => {}
        }
    }
}

/// The documented range is the one enforced: each end taken, one past it refused naming
/// the key. Catches a range written in the docs and another in validation (`[otlp]`'s live
/// in the otel crate).
#[test]
fn documented_ranges_are_the_ones_enforced() {
    for k in reference() {
        let Allowed::Range(b) = k.allowed else {
            continue;
        };
        let int = |n: u64| toml::Value::Integer(n as i64);
        for n in [b.min, b.max] {
            if let Err(e) = check(k.key, int(n)) {
                panic!("{}: {n} is documented as allowed: {e}", k.key);
            }
        }
        let outside = b.min.checked_sub(1).into_iter().chain([b.max + 1]);
        for n in outside {
            match check(k.key, int(n)) {
                Err(e) if e.contains(k.key) => {}
                other => panic!("{}: {n} is outside its range: {other:?}", k.key),
            }
        }
    }
}

/// Each listed value is taken, and another refused naming the key.
#[test]
fn documented_values_are_the_ones_taken() {
    for k in reference() {
        let Allowed::OneOf(values) = k.allowed else {
            continue;
        };
        let with = |s: &str| {
            let mut t = examples();
            set(&mut t, k.key, s.into());
            t
        };
        for s in values {
            parse(&with(s)).unwrap_or_else(|e| panic!("{}: {s:?}: {e}", k.key));
            if let Err(e) = check(k.key, (*s).into()) {
                assert!(
                    !e.contains(k.key),
                    "{}: {s:?} is documented as allowed: {e}",
                    k.key
                );
            }
        }
        let refused = parse(&with("bogus")).is_err()
            || check(k.key, "bogus".into()).is_err_and(|e| e.contains(k.key));
        assert!(refused, "{}: \"bogus\" is taken", k.key);
    }
}

/// The OTEL_* variables the agent looks up are the documented ones, no more, no fewer.
/// NODE_NAME is read by `run::node_identity` straight from the environment.
#[test]
fn documented_variables_are_the_ones_read() {
    let read = RefCell::new(BTreeSet::new());
    let env = |k: &str| {
        read.borrow_mut().insert(k.to_string());
        None
    };
    let otlp = otel::export::OtlpConfig {
        endpoint: Some("http://c:4318".into()),
        ..Default::default()
    };
    for signal in [
        otel::settings::Signal::Metrics,
        otel::settings::Signal::Logs,
    ] {
        otlp.resolve_signal(signal, env).unwrap().unwrap();
    }
    let docs = reference();
    let documented: BTreeSet<String> = docs
        .iter()
        .flat_map(|k| k.env.iter())
        .chain(ENV_ONLY.iter().map(|(v, _)| v))
        .filter(|v| **v != "NODE_NAME")
        .map(|v| v.to_string())
        .collect();
    assert_eq!(read.into_inner(), documented);
}

/// The defaults of `[otlp]`'s optional keys, as the docs state them.
#[test]
fn documented_otlp_defaults_are_the_ones_used() {
    let resolve = |protocol: &str| {
        let otlp = otel::export::OtlpConfig {
            endpoint: Some("http://c:4318".into()),
            protocol: Some(protocol.into()),
            ..Default::default()
        };
        otlp.resolve(|_| None).unwrap().unwrap()
    };
    let (http, grpc) = (resolve("http/protobuf"), resolve("grpc"));
    assert_eq!(http.timeout, Duration::from_millis(OTLP_TIMEOUT_DEFAULT_MS));
    assert_eq!(
        http.interval,
        Duration::from_millis(OTLP_INTERVAL_DEFAULT_MS)
    );
    assert_eq!(http.max_queue_bytes, OTLP_QUEUE_DEFAULT_MIB << 20);
    assert_eq!(http.max_request_bytes, OTLP_REQUEST_DEFAULT_MIB.0 << 20);
    assert_eq!(grpc.max_request_bytes, OTLP_REQUEST_DEFAULT_MIB.1 << 20);
    assert!(!http.gzip);
}

#[test]
fn every_table_is_described_and_has_keys() {
    let docs = reference();
    for k in &docs {
        assert!(
            TABLES.iter().any(|(t, _)| *t == k.table()),
            "{}: table not in TABLES",
            k.key
        );
    }
    for (t, _) in TABLES {
        assert!(docs.iter().any(|k| k.table() == *t), "[{t}] has no keys");
    }
}
