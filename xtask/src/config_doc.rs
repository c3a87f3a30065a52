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
use std::{fmt::Write, fs};

use anyhow::{bail, Context, Result};
#[cfg(test)]
use gpu_agent::config::Bounds;
use gpu_agent::config::{reference, Allowed, Config, KeyDoc, ENV_ONLY, TABLES};

use crate::workspace_root;

const DOC: &str = "docs/configuration.md";
const SOURCE: &str = "agent/src/config/reference.rs";

pub fn run(check: bool) -> Result<()> {
    let path = workspace_root().join(DOC);
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let blocks = blocks(&reference(), &Config::default_toml());
    if check {
        self::check(&text, &blocks)?;
        println!("{DOC}: every block matches the code");
        return Ok(());
    }
    let (new, stale) = splice(&text, &blocks)?;
    if stale.is_empty() {
        println!("{DOC}: up to date");
        return Ok(());
    }
    fs::write(&path, new).with_context(|| format!("writing {}", path.display()))?;
    println!("{DOC}: regenerated {}", stale.join(", "));
    Ok(())
}

/// Fails, naming the stale blocks, when `text` is not what [`splice`] would make of it.
pub fn check(text: &str, blocks: &[(&'static str, String)]) -> Result<()> {
    let (_, stale) = splice(text, blocks)?;
    if !stale.is_empty() {
        bail!(
            "{DOC} is stale: block(s) {} differ from {SOURCE}; run `cargo xtask config-doc`",
            stale.join(", ")
        );
    }
    Ok(())
}

fn begin(name: &str) -> String {
    format!("<!-- BEGIN GENERATED {name}: cargo xtask config-doc, from {SOURCE} -->")
}

fn end(name: &str) -> String {
    format!("<!-- END GENERATED {name} -->")
}

/// `text` with every generated block replaced, and the names of those that changed. Each
/// block must have exactly one pair of markers, and every marker must name a block.
pub fn splice(
    text: &str,
    blocks: &[(&'static str, String)],
) -> Result<(String, Vec<&'static str>)> {
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("<!-- BEGIN GENERATED ") {
            let name = rest.split(':').next().unwrap_or_default();
            if !blocks.iter().any(|(n, _)| *n == name) {
                let names: Vec<&str> = blocks.iter().map(|b| b.0).collect();
                bail!(
                    "{DOC}: marker {line:?} names no block (blocks: {})",
                    names.join(", ")
                );
            }
        }
    }
    let mut out = text.to_string();
    let mut stale = vec![];
    for (name, body) in blocks {
        let (b, e) = (begin(name), end(name));
        let at = |m: &str| -> Result<usize> {
            let mut found = out.match_indices(m);
            match (found.next(), found.next()) {
                (Some((i, _)), None) => Ok(i),
                (None, _) => bail!("{DOC}: no marker for block `{name}`; add the lines\n{b}\n{e}"),
                (Some(_), Some(_)) => bail!("{DOC}: marker {m:?} twice"),
            }
        };
        let (start, stop) = (at(&b)? + b.len(), at(&e)?);
        if stop < start {
            bail!("{DOC}: the END marker of block `{name}` comes before its BEGIN");
        }
        let want = format!("\n{body}");
        if out[start..stop] != want {
            stale.push(*name);
            out.replace_range(start..stop, &want);
        }
    }
    Ok((out, stale))
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
        fs::read_to_string(workspace_root().join(DOC)).unwrap()
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
