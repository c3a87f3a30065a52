//! No import circles: in agent/, xtask/ and fake-nvml/, the graph of file-level module
//! dependencies has no cycle, so that every file can be read (and moved) after the ones
//! it uses.
//!
//! A file depends on a module when its code names a path into it: `crate::b`, `super::b`,
//! `self::b`, with `use` groups expanded (`crate::{a, b::c}`), or a bare `b::` that names a
//! child module, or a sibling in the same directory (what `use super::*` brings in). The
//! path's target is the deepest module file it reaches. A path into the file itself or into
//! one of its ancestors (`crate::workspace_root`, `super::Snapshot`) makes no edge: a module
//! declares its children, and they may use what it holds.
//!
//! The sources are read as text with comments and literals blanked out, as
//! agent/tests/layers.rs reads them for the agent's top-level modules.
use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    fs,
    path::{Path, PathBuf},
};

use tests::root;

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `text` with its comments and string and char literals replaced by spaces; the lines
/// stay where they were.
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        match blanked_end(&c, i) {
            Some(end) => {
                for &ch in &c[i..end] {
                    out.push(if ch == '\n' { '\n' } else { ' ' });
                }
                i = end;
            }
            None => {
                out.push(c[i]);
                i += 1;
            }
        }
    }
    out
}

/// Where the comment or literal that starts at `i` ends (exclusive), if one starts there.
fn blanked_end(c: &[char], i: usize) -> Option<usize> {
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    let after_ident = i > 0 && is_ident(c[i - 1]);
    match at(i) {
        '/' if at(i + 1) == '/' => Some((i..c.len()).find(|&k| c[k] == '\n').unwrap_or(c.len())),
        '/' if at(i + 1) == '*' => Some(block_comment_end(c, i)),
        '"' => Some(string_end(c, i + 1)),
        'b' | 'c' | 'r' if !after_ident => prefixed_literal_end(c, i),
        '\'' => char_end(c, i),
        _ => None,
    }
}

fn block_comment_end(c: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            depth += 1;
            i += 2;
        } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    c.len()
}

/// The end of a string whose text starts at `i`.
fn string_end(c: &[char], mut i: usize) -> usize {
    while i < c.len() {
        match c[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    c.len()
}

/// `'x'`, `'\n'`, `'\u{1F600}'`; `None` for a lifetime or a label (`'a`, `'outer:`).
fn char_end(c: &[char], i: usize) -> Option<usize> {
    if c.get(i + 1) == Some(&'\\') {
        return (i + 3..c.len()).find(|&k| c[k] == '\'').map(|k| k + 1);
    }
    (c.get(i + 2) == Some(&'\'')).then_some(i + 3)
}

/// `b"..."`, `b'x'`, `c"..."`, `r"..."`, `r#"..."#`, `br#"..."#`: where it ends; `None` for
/// an identifier that starts with b, c or r (raw identifiers `r#type` included).
fn prefixed_literal_end(c: &[char], i: usize) -> Option<usize> {
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    let mut j = i;
    if at(j) == 'b' || at(j) == 'c' {
        j += 1;
        match at(j) {
            '"' => return Some(string_end(c, j + 1)),
            '\'' if at(i) == 'b' => return char_end(c, j),
            _ => {}
        }
    }
    if at(j) != 'r' {
        return None;
    }
    let hashes = (j + 1..c.len()).take_while(|&k| c[k] == '#').count();
    let open = j + 1 + hashes;
    if at(open) != '"' {
        return None;
    }
    let closes = |k: usize| c[k] == '"' && (1..=hashes).all(|h| at(k + h) == '#');
    Some(
        (open + 1..c.len())
            .find(|&k| closes(k))
            .map_or(c.len(), |k| k + 1 + hashes),
    )
}

#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Open,
    Close,
    Comma,
    Star,
    Other,
}

struct Token {
    tok: Tok,
    line: usize,
}

fn tokens(code: &str) -> Vec<Token> {
    let mut out = vec![];
    for (n, text) in code.lines().enumerate() {
        let c: Vec<char> = text.chars().collect();
        let mut i = 0;
        while i < c.len() {
            let (tok, len) = match c[i] {
                ch if ch.is_whitespace() => {
                    i += 1;
                    continue;
                }
                ch if is_ident(ch) => {
                    let len = c[i..].iter().take_while(|&&ch| is_ident(ch)).count();
                    (Tok::Ident(c[i..i + len].iter().collect()), len)
                }
                ':' if c.get(i + 1) == Some(&':') => (Tok::Sep, 2),
                '{' => (Tok::Open, 1),
                '}' => (Tok::Close, 1),
                ',' => (Tok::Comma, 1),
                '*' => (Tok::Star, 1),
                _ => (Tok::Other, 1),
            };
            out.push(Token { tok, line: n + 1 });
            i += len;
        }
    }
    out
}

/// A path the code names, `use` groups expanded.
#[derive(Debug, PartialEq)]
struct Named {
    segments: Vec<String>,
    line: usize,
    /// The inline modules (`mod tests { .. }`) it is written in, outermost first.
    scope: Vec<String>,
}

/// Every path of two or more segments in `code` (comments and literals blanked), from its
/// first segment: `a::b::c` once, not also `b::c`.
fn named_paths(code: &str) -> Vec<Named> {
    let t = tokens(code);
    let mut out = vec![];
    let mut depth = 0;
    let mut inline: Vec<(String, usize)> = vec![];
    let mut i = 0;
    while i < t.len() {
        match &t[i].tok {
            Tok::Open => {
                depth += 1;
                if let (Some(Tok::Ident(m)), Some(Tok::Ident(name))) = (
                    i.checked_sub(2).map(|k| &t[k].tok),
                    i.checked_sub(1).map(|k| &t[k].tok),
                ) {
                    if m == "mod" {
                        inline.push((name.clone(), depth));
                    }
                }
            }
            Tok::Close => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Tok::Ident(_) if t.get(i + 1).is_some_and(|x| x.tok == Tok::Sep) => {
                let before = i.checked_sub(1).map(|k| &t[k].tok);
                // `pub(in crate::a)` is a visibility, not a use.
                let visibility = matches!(before, Some(Tok::Ident(w)) if w == "in");
                if before != Some(&Tok::Sep) && !visibility {
                    let (paths, next) = use_tree(&t, i);
                    let scope: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
                    out.extend(paths.into_iter().map(|(segments, line)| Named {
                        segments,
                        line,
                        scope: scope.clone(),
                    }));
                    i = next;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// A path's segments, and the line of its last one.
type Written = (Vec<String>, usize);

/// The paths of the use tree (or plain path) at `t[i..]`, and the index after it.
fn use_tree(t: &[Token], mut i: usize) -> (Vec<Written>, usize) {
    let mut prefix = vec![];
    let mut line = t[i].line;
    loop {
        match t.get(i).map(|x| &x.tok) {
            Some(Tok::Ident(s)) => {
                prefix.push(s.clone());
                line = t[i].line;
                i += 1;
            }
            Some(Tok::Open) => return use_group(t, i + 1, &prefix),
            Some(Tok::Star) => return (vec![(prefix, line)], i + 1),
            _ => return (vec![(prefix, line)], i),
        }
        if t.get(i).map(|x| &x.tok) != Some(&Tok::Sep) {
            return (vec![(prefix, line)], i);
        }
        i += 1;
    }
}

/// `{a, b::c, self}` after `prefix`, from its first item at `t[i]`.
fn use_group(t: &[Token], mut i: usize, prefix: &[String]) -> (Vec<Written>, usize) {
    let mut out = vec![];
    while i < t.len() {
        match t[i].tok {
            Tok::Close => return (out, i + 1),
            Tok::Comma => i += 1,
            _ => {
                let (subs, next) = use_tree(t, i);
                out.extend(
                    subs.into_iter()
                        .map(|(s, line)| (prefix.iter().cloned().chain(s).collect(), line)),
                );
                i = next.max(i + 1);
                // `a as b`: the rest of the item.
                while i < t.len() && !matches!(t[i].tok, Tok::Comma | Tok::Close) {
                    i += 1;
                }
            }
        }
    }
    (out, i)
}

/// One crate's source files by module path (`[]` for the crate root).
struct Crate {
    dir: PathBuf,
    files: BTreeMap<Vec<String>, PathBuf>,
    /// Names its code can use for other crates: a bare `name::` is one of those, not a
    /// sibling module.
    externs: BTreeSet<String>,
}

impl Crate {
    fn read(dir: &Path) -> Crate {
        let src = dir.join("src");
        let mut paths = vec![];
        rust_files(&src, &mut paths);
        let has_lib = src.join("lib.rs").exists();
        let mut files = BTreeMap::new();
        for path in paths {
            let rel = path.strip_prefix(&src).unwrap();
            let mut module: Vec<String> = rel
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if module == ["main"] && has_lib || module.first().is_some_and(|m| m == "bin") {
                continue; // crate roots of their own, which use the library by its name
            }
            if module == ["lib"] || module == ["main"] || module.last().unwrap() == "mod" {
                module.pop();
            }
            files.insert(module, rel.to_path_buf());
        }
        Crate {
            dir: dir.to_path_buf(),
            files,
            externs: extern_names(&dir.join("Cargo.toml")),
        }
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn extern_names(manifest: &Path) -> BTreeSet<String> {
    let text = fs::read_to_string(manifest).unwrap();
    let doc: toml::Table = toml::from_str(&text).unwrap();
    let mut out: BTreeSet<String> = ["std", "core", "alloc"].map(String::from).into();
    for table in ["dependencies", "dev-dependencies", "build-dependencies"] {
        if let Some(deps) = doc.get(table).and_then(|d| d.as_table()) {
            out.extend(deps.keys().map(|k| k.replace('-', "_")));
        }
    }
    out
}

/// The module file that `named`, written in the file of module `file`, depends on; `None`
/// for another crate's path, or one into the file itself or an ancestor of it.
fn target(k: &Crate, file: &[String], named: &Named) -> Option<Vec<String>> {
    let here: Vec<String> = file.iter().chain(&named.scope).cloned().collect();
    // `crate::a::{self, b}` names `crate::a`.
    let segs: Vec<String> = named
        .segments
        .iter()
        .enumerate()
        .filter(|(i, s)| *i == 0 || *s != "self")
        .map(|(_, s)| s.clone())
        .collect();
    let join = |base: &[String], rest: &[String]| -> Vec<String> {
        base.iter().chain(rest).cloned().collect()
    };
    let absolute = match segs[0].as_str() {
        "crate" => segs[1..].to_vec(),
        "self" => join(&here, &segs[1..]),
        "super" => {
            let ups = segs.iter().take_while(|s| *s == "super").count();
            join(&here[..here.len().checked_sub(ups)?], &segs[ups..])
        }
        first => {
            let is_module = |base: &[String]| k.files.contains_key(&join(base, &segs[..1]));
            let parent = file
                .split_last()
                .map(|(_, p)| p)
                .filter(|_| !k.externs.contains(first));
            let base = [Some(&here[..]), Some(file), parent]
                .into_iter()
                .flatten()
                .find(|b| is_module(b))?;
            join(base, &segs)
        }
    };
    let module = (0..=absolute.len())
        .rev()
        .map(|n| &absolute[..n])
        .find(|p| k.files.contains_key(*p))?;
    (!file.starts_with(module)).then(|| module.to_vec())
}

/// One file's dependency on another, with the first line that makes it.
struct Edge {
    from: PathBuf,
    to: PathBuf,
    line: usize,
    text: String,
}

fn edges(k: &Crate) -> Vec<Edge> {
    let mut out = vec![];
    for (module, rel) in &k.files {
        let text = fs::read_to_string(k.dir.join("src").join(rel)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mut seen = BTreeSet::new();
        for named in named_paths(&code_only(&text)) {
            let Some(to) = target(k, module, &named) else {
                continue;
            };
            if seen.insert(to.clone()) {
                out.push(Edge {
                    from: rel.clone(),
                    to: k.files[&to].clone(),
                    line: named.line,
                    text: lines[named.line - 1].trim().to_string(),
                });
            }
        }
    }
    out
}

/// A group of files that reach each other (a strongly connected component of more than
/// one file), and one shortest cycle through its first file, as the chain of its files.
struct Circle {
    files: BTreeSet<PathBuf>,
    chain: Vec<PathBuf>,
}

fn circles(edges: &[Edge]) -> Vec<Circle> {
    let mut next: BTreeMap<&PathBuf, BTreeSet<&PathBuf>> = BTreeMap::new();
    for e in edges {
        next.entry(&e.from).or_default().insert(&e.to);
        next.entry(&e.to).or_default();
    }
    let reach = |from: &PathBuf| -> BTreeSet<&PathBuf> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from];
        while let Some(f) = todo.pop() {
            for t in &next[f] {
                if seen.insert(*t) {
                    todo.push(t);
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&PathBuf, BTreeSet<&PathBuf>> =
        next.keys().map(|f| (*f, reach(f))).collect();
    let mut done = BTreeSet::new();
    let mut out = vec![];
    for (f, r) in &reached {
        if done.contains(f) || !r.contains(f) {
            continue;
        }
        let group: BTreeSet<&PathBuf> = r
            .iter()
            .copied()
            .filter(|g| reached[g].contains(f))
            .collect();
        done.extend(group.iter().copied());
        out.push(Circle {
            chain: shortest_cycle(f, &next, &group),
            files: group.into_iter().cloned().collect(),
        });
    }
    out
}

/// Breadth first from `start` back to it, within `group`.
fn shortest_cycle(
    start: &PathBuf,
    next: &BTreeMap<&PathBuf, BTreeSet<&PathBuf>>,
    group: &BTreeSet<&PathBuf>,
) -> Vec<PathBuf> {
    let mut came_from: BTreeMap<&PathBuf, &PathBuf> = BTreeMap::new();
    let mut todo = VecDeque::from([start]);
    while let Some(f) = todo.pop_front() {
        for t in &next[f] {
            if *t == start {
                let mut chain = vec![start.clone(), f.clone()];
                let mut at = f;
                while at != start {
                    at = came_from[at];
                    chain.push(at.clone());
                }
                chain.reverse();
                return chain;
            }
            if group.contains(t) && !came_from.contains_key(t) {
                came_from.insert(t, f);
                todo.push_back(t);
            }
        }
    }
    unreachable!("{} is in a cycle", start.display())
}

/// The circles among `krate`'s files: for each, one cycle as a chain of files and the
/// lines that make its edges, then every other edge among the circle's files.
fn report(krate: &str) -> Option<String> {
    let k = Crate::read(&root().join(krate));
    let edges = edges(&k);
    let found = circles(&edges);
    if found.is_empty() {
        return None;
    }
    let src = |p: &PathBuf| format!("{krate}/src/{}", p.display());
    let mut out = format!("{} import circle(s) among {krate}/'s files:\n", found.len());
    for circle in &found {
        let names: Vec<String> = circle.chain.iter().map(src).collect();
        out.push_str(&format!("\n{}\n", names.join(" -> ")));
        let on_chain = |e: &Edge| {
            circle
                .chain
                .windows(2)
                .any(|w| w[0] == e.from && w[1] == e.to)
        };
        let mut inside: Vec<&Edge> = edges
            .iter()
            .filter(|e| circle.files.contains(&e.from) && circle.files.contains(&e.to))
            .collect();
        inside.sort_by_key(|e| !on_chain(e));
        if inside.len() > circle.chain.len() - 1 {
            out.push_str(&format!(
                "  (the circle holds {} files; every edge among them:)\n",
                circle.files.len()
            ));
        }
        for e in inside {
            out.push_str(&format!(
                "  {}:{} -> {}: {}\n",
                src(&e.from),
                e.line,
                src(&e.to),
                e.text
            ));
        }
    }
    Some(out)
}

#[test]
fn agent_has_no_import_cycle() {
    if let Some(r) = report("agent") {
        panic!("{r}");
    }
}

#[test]
fn xtask_has_no_import_cycle() {
    if let Some(r) = report("xtask") {
        panic!("{r}");
    }
}

#[test]
fn fake_nvml_has_no_import_cycle() {
    if let Some(r) = report("fake-nvml") {
        panic!("{r}");
    }
}

/// The reading of the sources, on small examples.
mod parser {
    use super::*;

    fn paths(code: &str) -> Vec<String> {
        named_paths(&code_only(code))
            .into_iter()
            .map(|n| {
                let scope = n.scope.iter().map(|s| format!("{s}/")).collect::<String>();
                format!("{scope}{}@{}", n.segments.join("::"), n.line)
            })
            .collect()
    }

    #[test]
    fn groups_are_expanded() {
        let code = "use crate::{\n    gpu::{self, join::Joiner, sampler as s},\n    stats::*,\n};";
        assert_eq!(
            paths(code),
            [
                "crate::gpu::self@2",
                "crate::gpu::join::Joiner@2",
                "crate::gpu::sampler@2",
                "crate::stats@3"
            ]
        );
    }

    #[test]
    fn super_self_and_bare_paths_from_their_first_segment() {
        let code = "use super::naming::Name;\nlet x = self::a::f(std::mem::take(&mut y));\n\
                    naming::g(); pub(in crate::gpu) fn h() {}";
        assert_eq!(
            paths(code),
            [
                "super::naming::Name@1",
                "self::a::f@2",
                "std::mem::take@2",
                "naming::g@3"
            ]
        );
    }

    #[test]
    fn comments_and_literals_name_nothing() {
        let code = "// crate::a\n/* crate::b /* nested */ crate::c */ let s = \"crate::d\";\n\
                    let r = r#\"crate::e \"q\"\"#; let c = '\"'; fn f<'a>(x: &'a str) { crate::g::h(); }\n\
                    let b = b'{'; let e = '\\''; crate::i::j();";
        assert_eq!(paths(code), ["crate::g::h@3", "crate::i::j@4"]);
    }

    #[test]
    fn inline_modules_are_a_scope() {
        let code = "fn f() { a::b(); }\nmod tests {\n    use super::*;\n    mod deeper { fn g() { super::super::c::d(); } }\n    fn h() { e::f(); }\n}\nfn i() { j::k(); }";
        assert_eq!(
            paths(code),
            [
                "a::b@1",
                "tests/super@3",
                "tests/deeper/super::super::c::d@4",
                "tests/e::f@5",
                "j::k@7"
            ]
        );
    }

    fn krate(modules: &[&str]) -> Crate {
        let files = modules
            .iter()
            .map(|m| {
                let module: Vec<String> = m
                    .split('/')
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect();
                (module, PathBuf::from(format!("{m}.rs")))
            })
            .collect();
        Crate {
            dir: PathBuf::new(),
            files,
            externs: ["std", "http"].map(String::from).into(),
        }
    }

    fn resolved(k: &Crate, file: &str, scope: &[&str], path: &str) -> Option<String> {
        let file: Vec<String> = file
            .split('/')
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        let named = Named {
            segments: path.split("::").map(String::from).collect(),
            line: 1,
            scope: scope.iter().map(|s| s.to_string()).collect(),
        };
        target(k, &file, &named).map(|m| m.join("/"))
    }

    #[test]
    fn a_path_depends_on_the_deepest_module_file_it_reaches() {
        let k = krate(&[
            "",
            "gpu",
            "gpu/join",
            "gpu/naming",
            "gpu/http",
            "stats",
            "sinks",
            "sinks/http",
        ]);
        let r = |file, scope: &[&str], path| resolved(&k, file, scope, path);
        assert_eq!(
            r("gpu/join", &[], "super::naming::Name").as_deref(),
            Some("gpu/naming")
        );
        assert_eq!(
            r("gpu/join", &[], "crate::gpu::self::naming::f").as_deref(),
            Some("gpu/naming")
        );
        assert_eq!(
            r("gpu/join", &[], "crate::stats::Stats").as_deref(),
            Some("stats")
        );
        assert_eq!(r("gpu", &[], "join::Joiner").as_deref(), Some("gpu/join"));
        assert_eq!(r("gpu", &[], "self::naming").as_deref(), Some("gpu/naming"));
        // A sibling named bare (through `use super::*`), unless a crate has its name.
        assert_eq!(
            r("gpu/join", &[], "naming::f").as_deref(),
            Some("gpu/naming")
        );
        assert_eq!(
            r("sinks", &[], "http::serve").as_deref(),
            Some("sinks/http")
        );
        assert_eq!(r("gpu/join", &[], "http::StatusCode"), None);
        // Into the file itself or an ancestor: no edge.
        assert_eq!(r("gpu/join", &[], "super::Snapshot"), None);
        assert_eq!(r("gpu/join", &[], "crate::gpu::Snapshot"), None);
        assert_eq!(r("gpu/join", &[], "crate::workspace_root"), None);
        assert_eq!(r("gpu/join", &["tests"], "super::Joiner"), None);
        assert_eq!(
            r(
                "gpu/join",
                &["tests", "deeper"],
                "super::super::super::naming::f"
            )
            .as_deref(),
            Some("gpu/naming")
        );
        assert_eq!(r("gpu/join", &[], "std::mem::take"), None);
    }

    #[test]
    fn a_cycle_is_found_as_a_chain() {
        let edge = |from: &str, to: &str| Edge {
            from: from.into(),
            to: to.into(),
            line: 1,
            text: String::new(),
        };
        let edges = [
            edge("d", "a"),
            edge("a", "b"),
            edge("b", "c"),
            edge("c", "a"),
            edge("c", "e"),
        ];
        let found = circles(&edges);
        let chains: Vec<Vec<&str>> = found
            .iter()
            .map(|c| c.chain.iter().map(|p| p.to_str().unwrap()).collect())
            .collect();
        assert_eq!(chains, [["a", "b", "c", "a"]]);
        let files: Vec<&str> = found[0].files.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(files, ["a", "b", "c"]);
        assert!(circles(&[edge("a", "b"), edge("b", "c")]).is_empty());
    }
}
