//! The generated blocks of a doc: each sits between a pair of markers,
//!
//! ```text
//! <!-- BEGIN GENERATED NAME: cargo xtask COMMAND, from SOURCE -->
//! <!-- END GENERATED NAME -->
//! ```
//!
//! and the prose around them is left alone. `check` writes nothing and fails, naming each
//! stale block, when the file differs from what the command would write.
use std::fs;

use anyhow::{bail, Context, Result};

use crate::workspace_root;

/// One doc with generated blocks: where it is, the xtask command that writes it, and what
/// it is generated from.
pub struct Generated {
    pub doc: &'static str,
    pub command: &'static str,
    pub source: &'static str,
}

impl Generated {
    /// Rewrites the stale blocks of the doc, or with `check` only fails on them.
    pub fn run(&self, check: bool, blocks: &[(&'static str, String)]) -> Result<()> {
        let doc = self.doc;
        let path = workspace_root().join(doc);
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        if check {
            self.check(&text, blocks)?;
            println!("{doc}: every block matches {}", self.source);
            return Ok(());
        }
        let (new, stale) = self.splice(&text, blocks)?;
        if stale.is_empty() {
            println!("{doc}: up to date");
            return Ok(());
        }
        fs::write(&path, new).with_context(|| format!("writing {}", path.display()))?;
        println!("{doc}: regenerated {}", stale.join(", "));
        Ok(())
    }

    /// Fails, naming the stale blocks, when `text` is not what [`Self::splice`] would make
    /// of it.
    pub fn check(&self, text: &str, blocks: &[(&'static str, String)]) -> Result<()> {
        let (_, stale) = self.splice(text, blocks)?;
        if !stale.is_empty() {
            bail!(
                "{} is stale: block(s) {} differ from {}; run `cargo xtask {}`",
                self.doc,
                stale.join(", "),
                self.source,
                self.command
            );
        }
        Ok(())
    }

    pub fn begin(&self, name: &str) -> String {
        let (command, source) = (self.command, self.source);
        format!("<!-- BEGIN GENERATED {name}: cargo xtask {command}, from {source} -->")
    }

    pub fn end(&self, name: &str) -> String {
        format!("<!-- END GENERATED {name} -->")
    }

    /// `text` with every generated block replaced, and the names of those that changed.
    /// Each block must have exactly one pair of markers, and every marker must name a block.
    pub fn splice(
        &self,
        text: &str,
        blocks: &[(&'static str, String)],
    ) -> Result<(String, Vec<&'static str>)> {
        let doc = self.doc;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("<!-- BEGIN GENERATED ") {
                let name = rest.split(':').next().unwrap_or_default();
                if !blocks.iter().any(|(n, _)| *n == name) {
                    let names: Vec<&str> = blocks.iter().map(|b| b.0).collect();
                    bail!(
                        "{doc}: marker {line:?} names no block (blocks: {})",
                        names.join(", ")
                    );
                }
            }
        }
        let mut out = text.to_string();
        let mut stale = vec![];
        for (name, body) in blocks {
            let (b, e) = (self.begin(name), self.end(name));
            let at = |m: &str| -> Result<usize> {
                let mut found = out.match_indices(m);
                match (found.next(), found.next()) {
                    (Some((i, _)), None) => Ok(i),
                    (None, _) => {
                        bail!("{doc}: no marker for block `{name}`; add the lines\n{b}\n{e}")
                    }
                    (Some(_), Some(_)) => bail!("{doc}: marker {m:?} twice"),
                }
            };
            let (start, stop) = (at(&b)? + b.len(), at(&e)?);
            if stop < start {
                bail!("{doc}: the END marker of block `{name}` comes before its BEGIN");
            }
            let want = format!("\n{body}");
            if out[start..stop] != want {
                stale.push(*name);
                out.replace_range(start..stop, &want);
            }
        }
        Ok((out, stale))
    }
}
