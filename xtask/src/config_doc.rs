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
use std::fmt::Write;

use anyhow::Result;
#[cfg(test)]
use gpu_agent::config::Bounds;
use gpu_agent::config::{reference, Allowed, Config, KeyDoc, ENV_ONLY, TABLES};

use crate::generated::Generated;

const DOC: &str = "docs/configuration.md";
const SOURCE: &str = "agent/src/config/reference.rs";

const GEN: Generated = Generated {
    doc: DOC,
    command: "config-doc",
    source: SOURCE,
};

pub fn run(check: bool) -> Result<()> {
    GEN.run(check, &blocks(&reference(), &Config::default_toml()))
}

#[cfg(test)]
fn check(text: &str, blocks: &[(&'static str, String)]) -> Result<()> {
    GEN.check(text, blocks)
}

#[cfg(test)]
fn splice(text: &str, blocks: &[(&'static str, String)]) -> Result<(String, Vec<&'static str>)> {
    GEN.splice(text, blocks)
}

#[cfg(test)]
fn begin(name: &str) -> String {
    GEN.begin(name)
}

#[cfg(test)]
fn end(name: &str) -> String {
    GEN.end(name)
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
        if let Err(e) = check(&repository_doc(), &current()) {
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
        let err = check(&repository_doc(), &blocks(&keys, &Config::default_toml())).unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("block(s) keys differ") && msg.contains("run `cargo xtask config-doc`"),
            "{msg}"
        );
        let err = check(&repository_doc(), &blocks(&reference(), "x = 1\n")).unwrap_err();
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
        let (new, stale) = splice(&doc, &t).unwrap();
        assert_eq!(stale, ["keys", "env"]);
        assert!(!new.contains("`otlp.compression`"));
        check(&new, &t).unwrap();
        let outside = |s: &str| {
            let (b, e) = (begin("keys"), end("env"));
            let (i, j) = (s.find(&b).unwrap(), s.find(&e).unwrap());
            format!("{}{}", &s[..i], &s[j..])
        };
        assert_eq!(outside(&new), outside(&doc));
    }

    #[test]
    fn markers_are_checked() {
        let t = current();
        let err = splice("# Configuration\n", &t).unwrap_err();
        assert!(
            format!("{err}").contains("no marker for block `default`"),
            "{err}"
        );
        let doc = repository_doc();
        let unknown = format!("{doc}\n<!-- BEGIN GENERATED nonsense: x -->\n");
        let err = splice(&unknown, &t).unwrap_err();
        assert!(format!("{err}").contains("names no block"), "{err}");
        let twice = format!("{doc}\n{}\n", end("env"));
        let err = splice(&twice, &t).unwrap_err();
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
}
