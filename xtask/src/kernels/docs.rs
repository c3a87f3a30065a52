//! `--write-docs`: this run's rows into the results table of docs/compatibility.md (between
//! its markers); rows of kernels not run this time stay.
use anyhow::{bail, Context, Result};

use super::Outcome;
use crate::workspace_root;

const BEGIN: &str = "<!-- kernel-matrix:begin -->";
const END: &str = "<!-- kernel-matrix:end -->";
const HEADER: &str = "| kernel | release | from | cgroup layout | mode | result | measured |\n\
                      | --- | --- | --- | --- | --- | --- | --- |";
/// Table order: the host first, then the series oldest first.
const ORDER: &[&str] = &["host", "5.10", "6.1", "6.12"];

fn row(o: &Outcome, date: &str) -> String {
    let (p, f) = (o.passed(), o.failed());
    let result = if f == 0 {
        format!("passed {p}/{p}")
    } else {
        format!("**failed** {f} of {}", p + f)
    };
    let left = o.result["left_out"].as_array().map_or(0, |l| l.len());
    let result = match left {
        0 => result,
        n => format!("{result}, {n} left out"),
    };
    let how = if o.name == "host" {
        "direct"
    } else {
        "qemu TCG"
    };
    format!(
        "| {} | {} | {} | {} | {} | {result} | {date} ({} s, {how}) |",
        o.name,
        o.release,
        o.source,
        o.result["cgroup_layout"].as_str().unwrap_or("?"),
        o.mode(),
        o.seconds,
    )
}

/// Replaces the rows of `outcomes` in `doc`'s table, keeping the others.
fn merge(doc: &str, new_rows: &[(String, String)]) -> Result<String> {
    let (Some(b), Some(e)) = (doc.find(BEGIN), doc.find(END)) else {
        bail!("docs/compatibility.md has no {BEGIN} ... {END} markers");
    };
    let mut rows: Vec<(String, String)> = doc[b + BEGIN.len()..e]
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| kernel ") && !l.starts_with("| ---"))
        .filter_map(|l| Some((l[2..].split(" |").next()?.to_string(), l.to_string())))
        .filter(|(k, _)| !new_rows.iter().any(|(n, _)| n == k))
        .collect();
    rows.extend(new_rows.iter().cloned());
    let rank = |k: &str| ORDER.iter().position(|o| *o == k).unwrap_or(ORDER.len());
    rows.sort_by_key(|(k, _)| rank(k));
    let table: Vec<&str> = rows.iter().map(|(_, r)| r.as_str()).collect();
    Ok(format!(
        "{}{BEGIN}\n{HEADER}\n{}\n{}",
        &doc[..b],
        table.join("\n"),
        &doc[e..]
    ))
}

pub fn write(outcomes: &[Outcome]) -> Result<()> {
    let date = std::process::Command::new("date")
        .args(["-u", "+%F"])
        .output()
        .context("running date")?;
    let date = String::from_utf8_lossy(&date.stdout).trim().to_string();
    let path = workspace_root().join("docs/compatibility.md");
    let doc = std::fs::read_to_string(&path).context("reading docs/compatibility.md")?;
    let rows: Vec<(String, String)> = outcomes
        .iter()
        .map(|o| (o.name.clone(), row(o, &date)))
        .collect();
    std::fs::write(&path, merge(&doc, &rows)?).context("writing docs/compatibility.md")?;
    eprintln!("xtask: wrote {} row(s) to {}", rows.len(), path.display());
    Ok(())
}

#[cfg(test)]
mod t {
    use super::*;

    #[test]
    fn replaces_only_the_rows_that_ran() {
        let doc = format!(
            "intro\n{BEGIN}\n{HEADER}\n| host | 6.18 | x | hybrid | ebpf | passed 9/9 | d |\n\
             | 6.1 | 6.1.0-1 | y | v2 | ebpf | passed 8/8 | d |\n{END}\nafter\n"
        );
        let new = vec![
            (
                "6.1".to_string(),
                "| 6.1 | 6.1.0-2 | y | v2 | ebpf | passed 8/8 | e |".into(),
            ),
            (
                "5.10".to_string(),
                "| 5.10 | 5.10.0-3 | z | v2 | ebpf | passed 8/8 | e |".into(),
            ),
        ];
        let out = merge(&doc, &new).unwrap();
        let want = format!(
            "intro\n{BEGIN}\n{HEADER}\n| host | 6.18 | x | hybrid | ebpf | passed 9/9 | d |\n\
             | 5.10 | 5.10.0-3 | z | v2 | ebpf | passed 8/8 | e |\n\
             | 6.1 | 6.1.0-2 | y | v2 | ebpf | passed 8/8 | e |\n{END}\nafter\n"
        );
        assert_eq!(out, want);
        assert!(merge("no markers", &new).is_err());
    }
}
