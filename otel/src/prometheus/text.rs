//! The text format's pieces: a family being written (HELP, TYPE, its series, repeated label
//! sets dropped), label blocks and their escaping, and the values as they print.
use std::{
    collections::HashSet,
    fmt::Write,
    hash::{BuildHasherDefault, Hasher},
};

use crate::catalogue::{Attr, Dropped, Kind};

/// A fast hash of a series' label block, to drop a repeated one: a repeated label set would
/// make Prometheus reject the whole scrape.
#[derive(Default)]
pub(super) struct Fx(u64);

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        let mix = |h: u64, w: u64| (h.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        let mut words = bytes.chunks_exact(8);
        for c in &mut words {
            self.0 = mix(self.0, u64::from_le_bytes(c.try_into().unwrap()));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.0 = mix(self.0, u64::from_le_bytes(w));
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// One family being written: HELP and TYPE go out with its first series.
pub(super) struct Family<'o> {
    pub(super) out: &'o mut String,
    pub(super) name: &'static str,
    pub(super) help: &'o str,
    pub(super) kind: Kind,
    pub(super) started: bool,
    pub(super) seen: HashSet<u64, BuildHasherDefault<Fx>>,
    pub(super) drop: Dropped,
}

impl Family<'_> {
    /// A series: `prefix` is a ready label block (`a="x",b="y"`), `extra` more labels.
    pub(super) fn series(&mut self, prefix: &str, extra: &[(Attr, &str)], value: f64) {
        if !self.started {
            self.started = true;
            let _ = writeln!(self.out, "# HELP {} {}", self.name, escape_help(self.help));
            let _ = writeln!(
                self.out,
                "# TYPE {} {}",
                self.name,
                self.kind.prometheus_type()
            );
        }
        let start = self.out.len();
        self.out.push_str(self.name);
        let open = self.out.len();
        self.out.push('{');
        self.out.push_str(prefix);
        let mut first = prefix.is_empty();
        for &(k, v) in extra {
            if !self.drop.contains(k) {
                push_label(self.out, &mut first, k, v);
            }
        }
        if first {
            self.out.truncate(open); // no labels at all
        } else {
            self.out.push('}');
        }
        let mut h = Fx::default();
        h.write(&self.out.as_bytes()[open..]);
        if !self.seen.insert(h.finish()) {
            self.out.truncate(start);
            return;
        }
        self.out.push(' ');
        write_value(self.out, value);
        self.out.push('\n');
    }

    /// Skips unknown values: an absent series, not a made-up 0.
    pub(super) fn opt(&mut self, prefix: &str, extra: &[(Attr, &str)], value: Option<f64>) {
        if let Some(v) = value {
            self.series(prefix, extra, v);
        }
    }
}

pub(super) fn push_label(out: &mut String, first: &mut bool, k: Attr, v: &str) {
    if !*first {
        out.push(',');
    }
    *first = false;
    out.push_str(k.label());
    out.push_str("=\"");
    escape_label_into(out, v);
    out.push('"');
}

/// A label block from pairs, leaving out the dropped ones.
pub(super) fn block(drop: Dropped, pairs: &[(Attr, &str)]) -> String {
    block_of(drop, pairs.iter().copied())
}

pub(super) fn block_of<'a>(
    drop: Dropped,
    pairs: impl IntoIterator<Item = (Attr, &'a str)>,
) -> String {
    let pairs = pairs.into_iter();
    let mut s = String::with_capacity(pairs.size_hint().0 * 24);
    let mut first = true;
    for (k, v) in pairs {
        if !drop.contains(k) {
            push_label(&mut s, &mut first, k, v);
        }
    }
    s
}

fn escape_label_into(out: &mut String, v: &str) {
    // Nearly every value (ids, uuids, names) needs no escaping: one copy, not a push per char.
    if !v.bytes().any(|b| matches!(b, b'\\' | b'"' | b'\n')) {
        out.push_str(v);
        return;
    }
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Rust's `Display` for f64 is the shortest round-trip form and never uses an exponent, so
/// integers print as integers (1536, not 1.536e3); only the non-finite ones need spelling.
fn write_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else if v == 0.0 {
        out.push('0'); // not "-0"
    } else {
        let _ = write!(out, "{v}");
    }
}

pub(super) fn pct(p: Option<u32>) -> Option<f64> {
    p.map(|p| p as f64 / 100.0)
}

pub(super) fn ratio(used: Option<u64>, total: Option<u64>) -> Option<f64> {
    match (used, total) {
        (Some(u), Some(t)) if t > 0 => Some(u as f64 / t as f64),
        _ => None,
    }
}

pub(super) fn f(v: Option<u64>) -> Option<f64> {
    v.map(|v| v as f64)
}

pub(super) const MIB: f64 = (1u64 << 20) as f64;

#[cfg(test)]
pub(super) fn format_value(v: f64) -> String {
    let mut s = String::new();
    write_value(&mut s, v);
    s
}
