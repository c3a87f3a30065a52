//! `cargo xtask config-doc [--check]`: the generated blocks of docs/configuration.md, from
//! the agent's configuration reference (agent/src/config/reference.rs: every key, its
//! type, range and purpose, with the defaults read from `Config::default()`). Each block
//! sits between a pair of markers,
//!
//! ```text
//! <!-- BEGIN GENERATED keys: cargo xtask config-doc, from agent/src/config/reference.rs -->
//! <!-- END GENERATED keys -->
//! ```
//!
//! and the prose around them is left alone. `--check` writes nothing and fails, naming each
//! stale block, when the file differs from what the command would write.
//!
//! The same reference makes the `config` part of the Helm chart's values.schema.json: every
//! table an object that admits exactly its keys, every key its type, range or values, so that
//! Helm refuses a bad `config` value at install time, naming it. The rest of that file is
//! written by hand; the command rewrites the whole file, keys sorted.
use std::{fmt::Write, fs};

use anyhow::{bail, Context, Result};
#[cfg(test)]
use gpu_agent::config::Bounds;
use gpu_agent::config::{reference, Allowed, Config, KeyDoc, Type, ENV_ONLY, TABLES};
use serde_json::{json, Map, Value};

use crate::{generated::Generated, workspace_root};

const DOC: &str = "docs/configuration.md";
const SOURCE: &str = "agent/src/config/reference.rs";
const CHART_SCHEMA: &str = "deploy/helm/gpu-agent/values.schema.json";

const GEN: Generated = Generated {
    doc: DOC,
    command: "config-doc",
    source: SOURCE,
};

pub fn run(check: bool) -> Result<()> {
    GEN.run(check, &blocks(&reference(), &Config::default_toml()))?;
    run_schema(check)
}

fn run_schema(check: bool) -> Result<()> {
    let path = workspace_root().join(CHART_SCHEMA);
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let new = with_config_schema(&text, &reference())?;
    if new == text {
        println!("{CHART_SCHEMA}: up to date");
    } else if check {
        bail!("{CHART_SCHEMA} is stale: its `config` schema differs from {SOURCE}; run `cargo xtask config-doc`");
    } else {
        fs::write(&path, new).with_context(|| format!("writing {}", path.display()))?;
        println!("{CHART_SCHEMA}: regenerated its `config` schema");
    }
    Ok(())
}

/// The chart's schema `text` with `properties.config` made from `keys`, as the file is
/// written: pretty JSON, keys sorted, a final newline.
pub fn with_config_schema(text: &str, keys: &[KeyDoc]) -> Result<String> {
    let mut schema: Value =
        serde_json::from_str(text).with_context(|| format!("{CHART_SCHEMA}: not JSON"))?;
    let Some(props) = schema["properties"].as_object_mut() else {
        bail!("{CHART_SCHEMA}: no top-level `properties`");
    };
    props.insert("config".into(), config_schema(keys));
    Ok(serde_json::to_string_pretty(&schema)? + "\n")
}

/// An object that admits the properties it is given, and nothing else.
fn closed(description: &str) -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "description": description,
        "properties": {},
    })
}

/// `config`: the top-level keys, and a closed object per table (`http.tls` inside `http`).
pub fn config_schema(keys: &[KeyDoc]) -> Value {
    let mut root = closed(
        "The agent's configuration (docs/configuration.md), rendered into config.toml: \
         exactly its tables and keys.",
    );
    for (table, about) in TABLES.iter().filter(|(t, _)| !t.is_empty()) {
        if !keys
            .iter()
            .any(|k| k.table() == *table || k.table().starts_with(&format!("{table}.")))
        {
            continue;
        }
        let mut node = &mut root;
        for part in table.split('.') {
            node = node["properties"]
                .as_object_mut()
                .expect("a closed object")
                .entry(part)
                .or_insert_with(|| closed(""));
        }
        node["description"] = (*about).into();
    }
    for k in keys {
        let mut node = &mut root;
        for part in k.table().split('.').filter(|p| !p.is_empty()) {
            node = &mut node["properties"][part];
        }
        node["properties"][k.name()] = key_schema(k);
    }
    root
}

fn key_schema(k: &KeyDoc) -> Value {
    let mut s = Map::new();
    let string = json!("string");
    match k.ty {
        Type::Bool => {
            s.insert("type".into(), "boolean".into());
        }
        Type::Count | Type::Millis | Type::Secs | Type::Bytes => {
            s.insert("type".into(), "integer".into());
            let (min, max) = match &k.allowed {
                Allowed::Range(b) => (b.min, Some(b.max)),
                _ => (0, None),
            };
            s.insert("minimum".into(), min.into());
            if let Some(max) = max {
                s.insert("maximum".into(), max.into());
            }
        }
        Type::String | Type::Path | Type::Address => {
            s.insert("type".into(), string.clone());
            if let Allowed::OneOf(values) = &k.allowed {
                s.insert("enum".into(), json!(values));
            }
        }
        Type::Map => {
            s.insert("type".into(), "object".into());
            s.insert("additionalProperties".into(), json!({"type": string}));
        }
        Type::List => {
            s.insert("type".into(), "array".into());
            s.insert("items".into(), json!({"type": string}));
        }
    }
    let mut doc = k.doc.clone();
    if let Allowed::Rule(rule) = &k.allowed {
        let _ = write!(doc, " Allowed: {rule}.");
    }
    s.insert("description".into(), doc.into());
    Value::Object(s)
}

/// Every generated block, by marker name: the default file (`gpu-agent check-config
/// --print-default`), the keys table by table, and the environment variables.
pub fn blocks(keys: &[KeyDoc], default_toml: &str) -> Vec<(&'static str, String)> {
    vec![
        ("default", format!("```toml\n{default_toml}```\n")),
        ("keys", keys_block(keys)),
        ("env", env_block(keys)),
    ]
}

/// A table cell: no line breaks, pipes escaped.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// `s` in backticks, long enough a fence for any backtick inside.
fn code(s: &str) -> String {
    match s.contains('`') {
        true => format!("`` {s} ``"),
        false => format!("`{s}`"),
    }
}

fn keys_block(keys: &[KeyDoc]) -> String {
    let mut s = String::new();
    for (table, about) in TABLES {
        let in_table: Vec<&KeyDoc> = keys.iter().filter(|k| k.table() == *table).collect();
        if in_table.is_empty() {
            continue;
        }
        match *table {
            "" => s.push_str("### Top level\n\n"),
            t => {
                let _ = writeln!(s, "### `[{t}]`\n");
            }
        }
        let _ = writeln!(s, "{about}\n");
        s.push_str("| key | type | default | allowed | what |\n");
        s.push_str("| --- | --- | --- | --- | --- |\n");
        for k in in_table {
            let default = k.default.as_deref().map_or("unset".into(), code);
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                code(k.key),
                k.ty.name(),
                cell(&default),
                cell(&allowed(&k.allowed)),
                cell(&what(k))
            );
        }
        s.push('\n');
    }
    s
}

fn allowed(a: &Allowed) -> String {
    match a {
        Allowed::Any => String::new(),
        Allowed::Range(b) if b.unit == "bytes" => {
            format!("{} to {}", bytes(b.min), bytes(b.max))
        }
        Allowed::Range(b) if b.unit.is_empty() => format!("{} to {}", b.min, b.max),
        Allowed::Range(b) => format!("{} to {} {}", b.min, b.max, b.unit),
        Allowed::OneOf(values) => {
            let v: Vec<String> = values.iter().map(|v| code(&format!("{v:?}"))).collect();
            v.join(", ")
        }
        Allowed::Rule(rule) => rule.clone(),
    }
}

/// `n` bytes, as a whole number of KiB, MiB, GiB or TiB where it is one.
fn bytes(n: u64) -> String {
    let (mut v, mut i) = (n, 0);
    while v >= 1024 && v % 1024 == 0 && i < 4 {
        v /= 1024;
        i += 1;
    }
    format!("{v} {}", ["bytes", "KiB", "MiB", "GiB", "TiB"][i])
}

/// The description, then the flag and variables that override the key, and an example
/// when it is unset by default.
fn what(k: &KeyDoc) -> String {
    let mut s = k.doc.clone();
    if let Some(flag) = k.flag {
        let _ = write!(s, " Flag: {}.", code(flag));
    }
    if !k.env.is_empty() {
        let vars: Vec<String> = k.env.iter().map(|v| code(v)).collect();
        let _ = write!(s, " Environment: {}.", vars.join(", "));
    }
    if let (None, Some(e)) = (&k.default, &k.example) {
        let _ = write!(s, " Example: {}.", code(&format!("{} = {e}", k.name())));
    }
    s
}

fn env_block(keys: &[KeyDoc]) -> String {
    let mut s = String::from("| variable | key |\n| --- | --- |\n");
    for k in keys {
        for var in k.env {
            let _ = writeln!(s, "| {} | {} |", code(var), code(k.key));
        }
    }
    for (var, what) in ENV_ONLY {
        let _ = writeln!(s, "| {} | {} |", code(var), cell(what));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repository_doc() -> String {
        std::fs::read_to_string(crate::workspace_root().join(DOC)).unwrap()
    }

    fn current() -> Vec<(&'static str, String)> {
        blocks(&reference(), &Config::default_toml())
    }

    /// `cargo xtask test` runs this: a config key added, removed or changed (its default,
    /// range or text) without `cargo xtask config-doc` fails the build. The agent's own
    /// tests (config::reference) hold the reference to the config types.
    #[test]
    fn docs_configuration_md_matches_the_code() {
        if let Err(e) = GEN.check(&repository_doc(), &current()) {
            panic!("{e:#}");
        }
    }

    #[test]
    fn a_changed_key_makes_its_block_stale() {
        let mut keys = reference();
        let k = keys
            .iter_mut()
            .find(|k| k.key == "nvml.interval_ms")
            .unwrap();
        k.default = Some("2000".into());
        let err = GEN
            .check(&repository_doc(), &blocks(&keys, &Config::default_toml()))
            .unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("block(s) keys differ") && msg.contains("run `cargo xtask config-doc`"),
            "{msg}"
        );
        let err = GEN
            .check(&repository_doc(), &blocks(&reference(), "x = 1\n"))
            .unwrap_err();
        assert!(
            format!("{err}").contains("block(s) default differ"),
            "{err}"
        );
    }

    #[test]
    fn regenerating_replaces_only_the_blocks() {
        let mut keys = reference();
        keys.retain(|k| k.key != "otlp.compression");
        let t = blocks(&keys, &Config::default_toml());
        let doc = repository_doc();
        let (new, stale) = GEN.splice(&doc, &t).unwrap();
        assert_eq!(stale, ["keys", "env"]);
        assert!(!new.contains("`otlp.compression`"));
        GEN.check(&new, &t).unwrap();
        let outside = |s: &str| {
            let (b, e) = (GEN.begin("keys"), GEN.end("env"));
            let (i, j) = (s.find(&b).unwrap(), s.find(&e).unwrap());
            format!("{}{}", &s[..i], &s[j..])
        };
        assert_eq!(outside(&new), outside(&doc));
    }

    #[test]
    fn markers_are_checked() {
        let t = current();
        let err = GEN.splice("# Configuration\n", &t).unwrap_err();
        assert!(
            format!("{err}").contains("no marker for block `default`"),
            "{err}"
        );
        let doc = repository_doc();
        let unknown = format!("{doc}\n<!-- BEGIN GENERATED nonsense: x -->\n");
        let err = GEN.splice(&unknown, &t).unwrap_err();
        assert!(format!("{err}").contains("names no block"), "{err}");
        let twice = format!("{doc}\n{}\n", GEN.end("env"));
        let err = GEN.splice(&twice, &t).unwrap_err();
        assert!(format!("{err}").contains("twice"), "{err}");
    }

    #[test]
    fn ranges_read_as_people_write_them() {
        assert_eq!(bytes(1 << 40), "1 TiB");
        assert_eq!(bytes(64 << 10), "64 KiB");
        assert_eq!(bytes(8192 + 1), "8193 bytes");
        assert_eq!(bytes(0), "0 bytes");
        let range = |min, max, unit| allowed(&Allowed::Range(Bounds::new(min, max, unit)));
        assert_eq!(range(100, 60_000, "ms"), "100 to 60000 ms");
        assert_eq!(range(16, 1 << 20, ""), "16 to 1048576");
        assert_eq!(range(4096, 1 << 40, "bytes"), "4 KiB to 1 TiB");
    }

    fn repository_schema() -> String {
        fs::read_to_string(workspace_root().join(CHART_SCHEMA)).unwrap()
    }

    /// A config key added, removed or changed without `cargo xtask config-doc` fails the
    /// build here too: the chart would refuse a key the agent takes, or let through one it
    /// refuses.
    #[test]
    fn the_charts_config_schema_matches_the_code() {
        let text = repository_schema();
        let want = with_config_schema(&text, &reference()).unwrap();
        assert!(
            want == text,
            "{CHART_SCHEMA} is stale: run `cargo xtask config-doc`"
        );
    }

    /// Every key path of a `config` schema: tables recursed into, each one closed.
    fn schema_keys(node: &Value, at: &str, out: &mut Vec<String>) {
        for (name, v) in node["properties"].as_object().unwrap() {
            let path = if at.is_empty() {
                name.clone()
            } else {
                format!("{at}.{name}")
            };
            if v["properties"].is_object() {
                assert_eq!(v["additionalProperties"], false, "{path} is not closed");
                schema_keys(v, &path, out);
            } else {
                out.push(path);
            }
        }
    }

    #[test]
    fn the_config_schema_admits_exactly_the_agents_keys_with_their_types_and_ranges() {
        let schema = config_schema(&reference());
        assert_eq!(schema["additionalProperties"], false);
        let mut got = vec![];
        schema_keys(&schema, "", &mut got);
        got.sort();
        let mut want: Vec<String> = reference().iter().map(|k| k.key.to_string()).collect();
        want.sort();
        assert_eq!(got, want);
        let key = |path: &str| {
            let mut node = &schema;
            for part in path.split('.') {
                node = &node["properties"][part];
            }
            node.clone()
        };
        let interval = key("nvml.interval_ms");
        assert_eq!(interval["type"], "integer");
        let Allowed::Range(b) = reference()
            .into_iter()
            .find(|k| k.key == "nvml.interval_ms")
            .unwrap()
            .allowed
        else {
            panic!("nvml.interval_ms has a range")
        };
        assert_eq!(
            (interval["minimum"].as_u64(), interval["maximum"].as_u64()),
            (Some(b.min), Some(b.max))
        );
        assert_eq!(
            key("otlp.protocol")["enum"],
            json!(["http/protobuf", "grpc"])
        );
        assert_eq!(
            key("http.auth.basic_auth_users")["additionalProperties"]["type"],
            "string"
        );
        assert_eq!(key("metrics.drop_attributes")["items"]["type"], "string");
        assert_eq!(key("ebpf.enabled")["type"], "boolean");
        assert_eq!(key("node_name")["type"], "string");
    }

    #[test]
    fn a_changed_key_makes_the_chart_schema_stale() {
        let mut keys = reference();
        keys.retain(|k| k.key != "otlp.compression");
        let text = repository_schema();
        let new = with_config_schema(&text, &keys).unwrap();
        assert_ne!(new, text);
        assert!(!new.contains("\"compression\""));
        // Everything outside `config` stays as it was.
        let (a, b): (Value, Value) = (
            serde_json::from_str(&text).unwrap(),
            serde_json::from_str(&new).unwrap(),
        );
        let outside = |mut v: Value| {
            v["properties"].as_object_mut().unwrap().remove("config");
            v
        };
        assert_eq!(outside(a), outside(b));
    }
}
