//! The repository describes the product as it is; how it was made belongs in git log. No
//! tracked doc, Rust file, script or config may number the work periods that built it
//! (an ordinal before "session", "session" or "sessions" before a number) or cite issue
//! numbers. The rule is the project's stop hook's (`diary=` in hooks/before-stop), with
//! more forms: test names, plural issues, an issue's number joined to the word by a
//! hyphen, an underscore or nothing, ordinals written as numbers, and a phrase that a
//! comment or paragraph wraps across two lines.
//!
//! This file's own examples of the bad forms are built at run time (`unmask`), so that the
//! file is checked like any other.
use std::{process::Command, sync::LazyLock};

use regex::Regex;
use tests::root;

/// The kinds of file that speak for the project. The tracked protobuf definitions
/// (node-api/proto, xtask/proto) are Kubernetes' text, not ours, and are not among them.
const CHECKED: &[&str] = &[".md", ".rs", ".sh", ".py", ".toml", ".yaml", ".yml"];

/// Ordinals of the spelled-out kind, from one to ninety-nine, and as digits ("24th"). In
/// the verbose syntax of the patterns below: `\ ` is a space, `\#` a hash.
const ORDINAL: &str = r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth
    | eleventh|twelfth|[a-z]+teenth|(?:twen|thir|for|fif|six|seven|eigh|nine)ty[-\ ][a-z]+
    | [a-z]+tieth|[0-9]+(?:st|nd|rd|th)";

/// In prose, comments and strings.
static PROSE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"(?ix)
          \b(?:{ORDINAL}|this|last|next|previous|earlier|later)\ session\b
        | \bsessions?\ [0-9]+
        | \bissue(?:\ |-|_)?\#?[0-9]+
        | \bissues\ \#?[0-9]+(?:\ ?(?:,|and|or|to|-)\ ?\#?[0-9]+)+"
    ))
    .unwrap()
});

/// In identifiers (a test's name), where words are joined by `_`. Only the ordinals no
/// usage record would count to: "first_session" or "last_session" can name a container's
/// own sessions (agent/src/billing/account.rs).
static IDENTIFIER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?ix)
          (?:^|[^a-z0-9])
          (?:eleventh|twelfth|[a-z]+teenth|(?:twen|thir|for|fif|six|seven|eigh|nine)ty_[a-z]+
            | [a-z]+tieth)
          _sessions?(?:$|[^a-z0-9])
        | (?:^|[^a-z0-9])issues?_[0-9]+",
    )
    .unwrap()
});

/// A comment's or a list's leader, dropped from a line before it is joined to the one above.
static LEADER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\s*(?://[/!]?|#+|\*|>|-)?\s*").unwrap());

/// The first history phrase in `text`, if any.
fn history_talk(text: &str) -> Option<&str> {
    [&*PROSE, &*IDENTIFIER]
        .iter()
        .filter_map(|re| re.find(text))
        .min_by_key(|m| m.start())
        .map(|m| m.as_str())
}

/// The lines (numbered from 1) of `text` that talk history: alone, or with the next line
/// where a phrase is wrapped across the two.
fn history_lines(text: &str) -> Vec<(usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut hits = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if history_talk(line).is_some() {
            hits.push((i + 1, line.trim().to_string()));
            continue;
        }
        let Some(next) = lines.get(i + 1) else {
            continue;
        };
        let next = LEADER.replace(next, "");
        if history_talk(&next).is_some() {
            continue; // reported on its own line
        }
        let joined = format!("{} {next}", line.trim_end());
        if history_talk(&joined).is_some() {
            hits.push((i + 1, format!("{} / {next}", line.trim())));
        }
    }
    hits
}

#[test]
fn no_tracked_file_talks_about_how_the_project_was_made() {
    let out = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root())
        .output()
        .expect("git ls-files: this test reads the repository's tracked files");
    assert!(out.status.success(), "git ls-files failed: {out:?}");
    let mut hits = Vec::new();
    for path in String::from_utf8_lossy(&out.stdout).split('\0') {
        // As the stop hook: a changelog is where history goes.
        if !CHECKED.iter().any(|ext| path.ends_with(ext)) || path.starts_with("CHANGELOG") {
            continue;
        }
        // A tracked file deleted in the working tree is not read.
        let Ok(bytes) = std::fs::read(root().join(path)) else {
            continue;
        };
        for (line, text) in history_lines(&String::from_utf8_lossy(&bytes)) {
            hits.push(format!("{path}:{line}: {text}"));
        }
    }
    assert!(
        hits.is_empty(),
        "{} lines speak of work sessions or issue numbers; say what the product does, \
         history belongs in git log:\n{}",
        hits.len(),
        hits.join("\n")
    );
}

/// `~` stands for a space, `^` for an underscore, `=` for a hyphen, and `|` joins its two
/// sides, so that this file holds none of the phrases it tests.
fn unmask(s: &str) -> String {
    s.replace('~', " ")
        .replace('^', "_")
        .replace('=', "-")
        .replace('|', "")
}

#[test]
fn the_matcher_catches_work_periods_and_issue_numbers() {
    for bad in [
        "as tried in the twenty-fourth~session, the exits",
        "the agent of the tenth~session's build",
        "The First~Session measured it",
        "see the 24th~session",
        "in this~session, the ring",
        "a later~session replaced it",
        "the previous~session",
        "work of sessions~19-27",
        "session~12 measured",
        "the attacks of issue~11",
        "the issue=15 targets",
        "as issue^15 asked",
        "see issue|15",
        "(docs/benchmarks.md, issue~#15).",
        "## Issue~15: headroom",
        "issues~11 and 15",
        "issues~#11, #15",
        "fn regression_of_the_twenty_fourth^session() {",
        "fn fixed_in_the_fourteenth^session() {",
        "fn the_attacks_of_issue^11() {",
    ] {
        let bad = unmask(bad);
        assert!(history_talk(&bad).is_some(), "not caught: {bad}");
    }
}

#[test]
fn the_matcher_passes_sessions_that_are_not_work_periods() {
    for good in [
        "tmux new-session -d -s agent",
        "inside a tmux session, run",
        "a session opens when a container's first process appears on a GPU",
        "pub struct Session {",
        "the session's energy and GPU time",
        "sessions of a container are kept until exported",
        "0::/user.slice/session-1.scope",
        "(\"/user.slice/user-1000.slice/session-3.scope\".into(), None),",
        "TLS session resumption",
        "let last_session = sessions.last();",
        "fn the_first_session_ends_when_the_process_exits() {",
        "an issue with the driver",
        "ring #15 of the array",
        "the twenty-four containers",
    ] {
        assert_eq!(history_talk(good), None, "flagged: {good}");
    }
}

#[test]
fn a_phrase_wrapped_across_two_lines_is_found_once() {
    let text = unmask(
        "/// a reordering of exits, such as the batches tried in the twenty-fourth\n\
         /// session, would end the second\n\
         the attacks of issue~11\n\
         fine\n",
    );
    let hits = history_lines(&text);
    let lines: Vec<usize> = hits.iter().map(|h| h.0).collect();
    assert_eq!(lines, [1, 3], "{hits:?}");
    let text = unmask("- measured in the\n  tenth~session\n");
    assert_eq!(history_lines(&text).len(), 1);
    assert!(history_lines("tmux new-\nsession -d\n").is_empty());
}
