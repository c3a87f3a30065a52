//! The data flows one way through agent/src: kernel events -> process state -> GPU sample
//! and join -> billing -> pipeline (snapshots) -> sinks -> wiring. A module may use the
//! ones below it, never one above or beside it, so the dependencies between the top-level
//! modules have no cycle. This reads the sources and checks every `crate::` path against
//! that order, the sink crate (`otel`) against the modules that may use it, and the files
//! of gpu/nvml, gpu/join and billing against each other.
use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

/// Top-level modules by layer, lowest first.
const LAYERS: &[&[&str]] = &[
    &["config", "stats"],
    &["ebpf"],
    &["process", "metadata"],
    &["gpu"],
    &["billing"],
    &["pipeline"],
    &["sinks"],
    &["rightsize"],
    &["run"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
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

/// A file's path under `src`, and the top-level module it belongs to.
fn top_module<'a>(src: &Path, file: &'a Path) -> (&'a Path, String) {
    let rel = file.strip_prefix(src).unwrap();
    let top = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    (rel, top.trim_end_matches(".rs").to_string())
}

/// The top-level module each `crate::` path in `text` names, with `crate::{a, b::c}`
/// groups expanded. Comments are skipped.
fn crate_paths(text: &str) -> BTreeSet<String> {
    paths_after(text, "crate::")
}

/// The first segment of each path in `text` that starts with `prefix` (`crate::`,
/// `super::`), with `prefix{a, b::c}` groups expanded. Comments are skipped.
fn paths_after(text: &str, prefix: &str) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find(prefix) {
        rest = &rest[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut start = 0;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.insert(first_ident(&group[start..j]));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(first_ident(&group[start..j]));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(first_ident(rest));
        }
    }
    out.remove("");
    out
}

fn first_ident(s: &str) -> String {
    s.trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

#[test]
fn no_module_uses_one_above_or_beside_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![];
    rust_files(&src, &mut files);
    let mut problems = vec![];
    let mut seen = BTreeSet::new();
    for file in &files {
        let (rel, module) = top_module(&src, file);
        if module == "lib" || module == "main" {
            continue;
        }
        let Some(own) = layer_of(&module) else {
            problems.push(format!("{}: module {module} has no layer", rel.display()));
            continue;
        };
        seen.insert(module.clone());
        for used in crate_paths(&fs::read_to_string(file).unwrap()) {
            if used == module {
                continue;
            }
            match layer_of(&used) {
                Some(l) if l < own => {}
                Some(_) => problems.push(format!(
                    "{}: {module} uses crate::{used}, which is not below it",
                    rel.display()
                )),
                None => problems.push(format!("{}: crate::{used} is unknown", rel.display())),
            }
        }
    }
    let all: BTreeSet<String> = LAYERS
        .iter()
        .flat_map(|l| l.iter())
        .map(|m| m.to_string())
        .collect();
    assert_eq!(seen, all, "every layer's module exists");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_check_sees_grouped_and_nested_paths() {
    let text = "use crate::{\n    gpu::{join::Joiner, sampler},\n    stats::Stats, // crate::run\n};\nlet x = crate::pipeline::now_ms();";
    let got: Vec<String> = crate_paths(text).into_iter().collect();
    assert_eq!(got, ["gpu", "pipeline", "stats"]);
}

/// The files of one folder of agent/src (`dir`, as a `crate::` path `module`) and the
/// siblings each one uses (`super::x`, `crate::module::x`), mod.rs left out: it only
/// declares them.
fn folder_graph(dir: &str, module: &str) -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
    let mut files = vec![];
    for entry in fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    let name = |f: &Path| f.file_stem().unwrap().to_string_lossy().to_string();
    let siblings: BTreeSet<String> = files.iter().map(|f| name(f)).collect();
    let mut graph = std::collections::BTreeMap::new();
    for f in &files {
        let me = name(f);
        if me == "mod" {
            continue;
        }
        let text = fs::read_to_string(f).unwrap();
        let mut uses = paths_after(&text, "super::");
        uses.extend(paths_after(&text, &format!("crate::{module}::")));
        uses.retain(|u| siblings.contains(u) && *u != me && u != "mod");
        graph.insert(me, uses);
    }
    graph
}

/// A cycle in `graph`, as the chain of its nodes, if it has one.
fn find_cycle(graph: &std::collections::BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &std::collections::BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut cycle = path[i..].to_vec();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut vec![], &mut done))
}

/// gpu/nvml, gpu/join and billing file by file: the types each folder's files all use sit
/// in files of their own below them, so no file reaches back up.
#[test]
fn no_file_of_gpu_or_billing_uses_one_that_uses_it() {
    let folders = [
        ("gpu/nvml", "gpu::nvml", ("cycle", "readers")),
        ("gpu/join", "gpu::join", ("joiner", "group")),
        ("billing", "billing", ("account", "stretch")),
    ];
    for (dir, module, (user, used)) in folders {
        let graph = folder_graph(dir, module);
        assert!(graph[user].contains(used), "{dir}: {user} uses {used}");
        if let Some(cycle) = find_cycle(&graph) {
            panic!("{dir} has an import circle: {}", cycle.join(" -> "));
        }
    }
}

/// The two halves of gpu/ know nothing of each other: the NVML side sends samples, the
/// join reads them (gpu_model's types are all they share).
#[test]
fn the_nvml_side_and_the_join_import_nothing_of_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/gpu");
    let mut problems = vec![];
    for (dir, other) in [("nvml", "join"), ("join", "nvml")] {
        let mut files = vec![];
        rust_files(&src.join(dir), &mut files);
        for f in files {
            let text = fs::read_to_string(&f).unwrap();
            let gpu = paths_after(&text, "crate::gpu::");
            let up = paths_after(&text, "super::super::");
            if gpu.contains(other) || up.contains(other) {
                problems.push(format!("gpu/{dir}/{}: uses gpu::{other}", f.display()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The modules that may name the sink crate (`otel`): the sinks, the wiring, and the
/// configuration and stats that carry the sinks' settings and counters. Sources, the join,
/// billing and the pipeline hand data on and never reach a sink.
const MAY_USE_OTEL: &[&str] = &["config", "stats", "sinks", "rightsize", "run"];

#[test]
fn only_sinks_and_wiring_import_the_sink_crate() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![];
    rust_files(&src, &mut files);
    let mut problems = vec![];
    let mut checked = 0;
    for file in &files {
        let (rel, module) = top_module(&src, file);
        let module = module.as_str();
        if ["lib", "main"].contains(&module) || MAY_USE_OTEL.contains(&module) {
            continue;
        }
        checked += 1;
        if uses_crate(&fs::read_to_string(file).unwrap(), "otel") {
            problems.push(format!("{}: {module} uses the otel crate", rel.display()));
        }
    }
    assert!(checked > 40, "the sources were read ({checked} files)");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Whether `text` names crate `name` in code: `name::` at the start of a path (not
/// `crate::name::`, `super::name::` or part of a longer identifier). Comments are skipped.
fn uses_crate(text: &str, name: &str) -> bool {
    let needle = format!("{name}::");
    text.lines()
        .map(|l| l.split("//").next().unwrap())
        .any(|l| {
            l.match_indices(&needle).any(|(i, _)| {
                let before = l[..i].chars().next_back();
                !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
            })
        })
}

#[test]
fn the_crate_check_sees_a_path_and_not_a_module_of_the_same_name() {
    assert!(uses_crate("use otel::usage::UsageCounters;", "otel"));
    assert!(uses_crate(
        "    pub usage: Arc<otel::usage::UsageCounters>,",
        "otel"
    ));
    assert!(uses_crate("use {otel::x, y};", "otel"));
    assert!(!uses_crate("use crate::sinks::otel::x;", "otel"));
    assert!(!uses_crate("use hotel::x;", "otel"));
    assert!(!uses_crate("// otel::usage is the sink's", "otel"));
}

#[test]
fn the_cycle_check_finds_a_circle_and_passes_a_chain() {
    let g = |edges: &[(&str, &str)]| {
        let mut g = std::collections::BTreeMap::<String, BTreeSet<String>>::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    assert_eq!(find_cycle(&g(&[("a", "b"), ("b", "c"), ("a", "c")])), None);
    assert_eq!(
        find_cycle(&g(&[("a", "b"), ("b", "c"), ("c", "a")])),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    let text =
        "use super::{\n    owner::{same, Owner},\n    ledger::Slot,\n};\nsuper::naming::name();";
    let got: Vec<String> = paths_after(text, "super::").into_iter().collect();
    assert_eq!(got, ["ledger", "naming", "owner"]);
}
