//! `cargo xtask chart-doc [--check]`: the values table of the Helm chart's README
//! (deploy/helm/gpu-agent/README.md, which `helm show readme` prints), from the chart's
//! values.schema.json (each value's type and description) and values.yaml (its default).
//! The table sits between a pair of markers,
//!
//! ```text
//! <!-- BEGIN GENERATED values: cargo xtask chart-doc, from deploy/helm/gpu-agent/values.schema.json and values.yaml -->
//! <!-- END GENERATED values -->
//! ```
//!
//! and the prose around it is left alone. One row per value the schema names down to its
//! leaves, but `config`, whose keys docs/configuration.md lists: a leaf without a
//! description is an error, naming it, so that a value cannot be added undocumented.
//! `--check` writes nothing and fails, naming the stale block, when the file is out of date.
use std::{fmt::Write, fs};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::{generated::Generated, workspace_root};

const CHART: &str = "deploy/helm/gpu-agent";

const GEN: Generated = Generated {
    doc: "deploy/helm/gpu-agent/README.md",
    command: "chart-doc",
    source: "deploy/helm/gpu-agent/values.schema.json and values.yaml",
};

/// A default longer than this is left to values.yaml, where its comments explain it.
const MAX_DEFAULT: usize = 48;

pub fn run(check: bool) -> Result<()> {
    GEN.run(check, &blocks(&schema()?, &values()?)?)
}

fn read(file: &str) -> Result<String> {
    let path = workspace_root().join(CHART).join(file);
    fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

fn schema() -> Result<Value> {
    serde_json::from_str(&read("values.schema.json")?)
        .with_context(|| format!("{CHART}/values.schema.json: not JSON"))
}

fn values() -> Result<Value> {
    serde_yaml::from_str(&read("values.yaml")?)
        .with_context(|| format!("{CHART}/values.yaml: not YAML"))
}

/// The README's generated blocks: the values table.
fn blocks(schema: &Value, values: &Value) -> Result<Vec<(&'static str, String)>> {
    let mut rows = vec![];
    walk(schema, values, "", &mut rows)?;
    let mut s = String::from("| value | type | default | what |\n| --- | --- | --- | --- |\n");
    for (key, ty, default, what) in rows {
        let _ = writeln!(s, "| `{key}` | {ty} | {default} | {} |", cell(&what));
    }
    Ok(vec![("values", s)])
}

/// Rows (key, type, default, description) for `node`'s properties, keys sorted; an object
/// with properties of its own is walked into, but `config`.
fn walk(
    node: &Value,
    values: &Value,
    at: &str,
    rows: &mut Vec<(String, String, String, String)>,
) -> Result<()> {
    let Some(props) = node["properties"].as_object() else {
        return Ok(());
    };
    let mut keys: Vec<&String> = props.keys().collect();
    keys.sort();
    for k in keys {
        let (p, key) = (
            &props[k],
            if at.is_empty() {
                k.clone()
            } else {
                format!("{at}.{k}")
            },
        );
        let value = &values[k.as_str()];
        if p["properties"].is_object() && key != "config" {
            walk(p, value, &key, rows)?;
            continue;
        }
        let Some(what) = p["description"].as_str() else {
            bail!("{CHART}/values.schema.json: `{key}` has no description for the chart's README");
        };
        rows.push((key, type_of(p), default(value), what.to_string()));
    }
    Ok(())
}

/// The schema's type, or its values.
fn type_of(p: &Value) -> String {
    if let Some(values) = p["enum"].as_array() {
        let name = |v: &Value| match v.as_str() {
            Some("") | None => format!("`{v}`"),
            Some(s) => format!("`{s}`"),
        };
        return values.iter().map(name).collect::<Vec<_>>().join(", ");
    }
    p["type"].as_str().unwrap_or("any").to_string()
}

/// The default as compact JSON in backticks, or where to read it when it is long.
fn default(v: &Value) -> String {
    if v.is_null() {
        return String::new();
    }
    let json = v.to_string();
    if json.len() > MAX_DEFAULT {
        return "see values.yaml".into();
    }
    format!("`{}`", json.replace('|', "\\|"))
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// `cargo xtask test` runs this: a value added, removed or changed (its default, type or
    /// description) without `cargo xtask chart-doc` fails the build.
    #[test]
    fn the_charts_readme_matches_its_values() {
        let doc = fs::read_to_string(workspace_root().join(GEN.doc)).unwrap();
        let blocks = blocks(&schema().unwrap(), &values().unwrap()).unwrap();
        if let Err(e) = GEN.check(&doc, &blocks) {
            panic!("{e:#}");
        }
    }

    #[test]
    fn rows_follow_the_schema_and_the_defaults() {
        let schema = json!({"properties": {
            "b": {"type": "object", "properties": {
                "on": {"type": "boolean", "description": "Turn | it on."},
                "mode": {"enum": ["", "x"], "description": "The mode."}}},
            "a": {"type": "object", "description": "A map."},
            "config": {"type": "object", "description": "The agent's.",
                "properties": {"k": {"type": "integer"}}}}});
        let values = json!({"a": {"k": "v".repeat(60)}, "b": {"on": false, "mode": "x"},
            "config": {"k": 1}});
        let (name, table) = &blocks(&schema, &values).unwrap()[0];
        assert_eq!(*name, "values");
        assert_eq!(
            table.lines().skip(2).collect::<Vec<_>>(),
            [
                "| `a` | object | see values.yaml | A map. |",
                "| `b.mode` | `\"\"`, `x` | `\"x\"` | The mode. |",
                "| `b.on` | boolean | `false` | Turn \\| it on. |",
                "| `config` | object | `{\"k\":1}` | The agent's. |",
            ]
        );
    }

    #[test]
    fn a_value_without_a_description_is_named() {
        let schema = json!({"properties": {"x": {"type": "object", "properties": {
            "y": {"type": "string"}}}}});
        let err = blocks(&schema, &json!({})).unwrap_err();
        assert!(
            format!("{err}").contains("`x.y` has no description"),
            "{err}"
        );
    }
}
