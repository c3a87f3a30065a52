//! `cargo xtask test`: brings the test tools, builds what the integration tests spawn, runs
//! every test of the workspace, and says loudly what it left out.
//!
//! Root-only tests are `#[ignore = "needs root: ..."]`. As root they run
//! (`--include-ignored`); as another user they are left out, counted from libtest's own
//! output, and the command that runs them is printed at the end.
//!
//! `GPU_AGENT_TEST_LOAD=1` runs the suite beside `stress-ng` (a CPU worker per core, one
//! on I/O and one on memory), as a busy CI machine would, with the tests' waits stretched
//! threefold (`GPU_AGENT_TEST_TIME_SCALE`, unless set): what they assert stays the same.
use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    process::Stdio,
};

use anyhow::{bail, Context, Result};

use crate::{cargo, cargo_command, ebpf, is_root, tools::Tools};

/// Needs a cgroup v1 memory hierarchy: left out, and said so, on pure cgroup v2 hosts.
const V1_TEST: &str = "process_only_in_a_cgroup_v1_hierarchy_is_attributed";
/// Needs NVIDIA's dcgm-exporter dashboard files and the prometheus-adapter chart, which this
/// repository does not hold: read from ../shared/dcgm-exporter, which CI has. Elsewhere,
/// without them, it is left out and said so; the transcribed checks in
/// tests/tests/dcgm_artefacts.rs always run (docs/metrics.md).
const DCGM_ARTEFACT_FILES_TEST: &str = "dcgm_real_artefact_files";

pub fn run(user_args: &[String]) -> Result<()> {
    let tools = Tools::ensure();
    ebpf::build()?;
    // The integration tests spawn target/debug/gpu-agent and load the fake
    // libnvidia-ml.so: build both first.
    cargo(&["build", "-p", "agent", "-p", "fake-nvml"])?;

    let root = is_root();
    let mut skips = vec![];
    if root && tests::cgroups::v1_memory_mount().is_none() {
        skips.push((V1_TEST, "this host has no cgroup v1 memory hierarchy"));
    }
    // CI has shared/ beside its clone: there the test runs, and fails if the files are gone.
    let ci = std::env::var_os("CI").is_some();
    if root && !ci && tests::dcgm_node::artefacts_dir().is_none() {
        skips.push((
            DCGM_ARTEFACT_FILES_TEST,
            "no ../shared/dcgm-exporter nor GPU_AGENT_DCGM_ARTEFACTS (NVIDIA's dashboard \
             files and the prometheus-adapter chart; docs/metrics.md names them): the \
             transcribed dashboard and adapter checks ran",
        ));
    }
    let args = cargo_test_args(user_args, root, &skips);
    eprintln!("xtask: cargo {}", args.join(" "));
    let mut cmd = cargo_command();
    cmd.args(&args).stdout(Stdio::piped());
    tools.apply(&mut cmd);
    let _load = match std::env::var_os("GPU_AGENT_TEST_LOAD").is_some_and(|v| v != "0") {
        true => Some(Load::start(&mut cmd)?),
        false => None,
    };
    let mut child = cmd.spawn().context("running cargo test")?;
    let mut tally = Tally::default();
    // libtest's stdout passes through unchanged; its summary lines are counted on the way.
    let mut out = std::io::stdout();
    for line in BufReader::new(child.stdout.take().expect("piped")).split(b'\n') {
        let line = line.context("reading cargo test's output")?;
        out.write_all(&line)?;
        out.write_all(b"\n")?;
        tally.read(&String::from_utf8_lossy(&line));
    }
    let status = child.wait()?;
    tally.report(root, user_args, &skips);
    if !status.success() {
        bail!("cargo test failed ({status})");
    }
    Ok(())
}

/// `stress-ng` beside the tests, stopped when dropped.
struct Load(std::process::Child);

impl Load {
    fn start(tests: &mut std::process::Command) -> Result<Load> {
        crate::image::ensure_packages(&[("stress-ng", "stress-ng")])?;
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let child = std::process::Command::new("stress-ng")
            .args(["--cpu", &cpus.to_string(), "--io", "1", "--vm", "1"])
            .args(["--vm-bytes", "256M", "--timeout", "3h", "--quiet"])
            .stdout(Stdio::null())
            .spawn()
            .context("starting stress-ng")?;
        if std::env::var_os("GPU_AGENT_TEST_TIME_SCALE").is_none() {
            tests.env("GPU_AGENT_TEST_TIME_SCALE", "3");
        }
        eprintln!("xtask: the tests run beside stress-ng ({cpus} CPU workers, I/O, memory)");
        Ok(Load(child))
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `cargo test --workspace --exclude agent-ebpf --no-fail-fast [user cargo args] --
/// [--include-ignored] [--skip ...] [user test args]`; the user's own `--` is merged into
/// ours. No fail-fast: one failing test file must not hide the results of the others.
fn cargo_test_args(user: &[String], root: bool, skips: &[(&str, &str)]) -> Vec<String> {
    let (cargo_args, test_args) = match user.iter().position(|a| a == "--") {
        Some(i) => (&user[..i], &user[i + 1..]),
        None => (user, &[][..]),
    };
    let mut a: Vec<String> = [
        "test",
        "--workspace",
        "--exclude",
        "agent-ebpf",
        "--no-fail-fast",
    ]
    .map(String::from)
    .into();
    a.extend(cargo_args.iter().cloned());
    a.push("--".into());
    let chose = |f: &str| test_args.iter().any(|t| t == f);
    if root && !chose("--ignored") && !chose("--include-ignored") {
        a.push("--include-ignored".into());
    }
    for (name, _) in skips {
        a.extend(["--skip".into(), name.to_string()]);
    }
    a.extend(test_args.iter().cloned());
    a
}

/// Counts from libtest's output: its `test result:` lines, and the reason of each ignored test.
#[derive(Default)]
struct Tally {
    passed: u64,
    failed: u64,
    ignored: u64,
    reasons: BTreeMap<String, u64>,
}

impl Tally {
    fn read(&mut self, line: &str) {
        if let Some(rest) = line.strip_prefix("test result: ") {
            for part in rest.split(';') {
                let mut words = part.split_whitespace().rev();
                let (Some(kind), Some(n)) = (words.next(), words.next()) else {
                    continue;
                };
                let Ok(n) = n.parse::<u64>() else { continue };
                match kind {
                    "passed" => self.passed += n,
                    "failed" => self.failed += n,
                    "ignored" => self.ignored += n,
                    _ => {}
                }
            }
        } else if let Some((_, verdict)) = line
            .strip_prefix("test ")
            .and_then(|l| l.split_once(" ... "))
        {
            if let Some(rest) = verdict.strip_prefix("ignored") {
                let why = rest.trim_start_matches(", ").trim();
                let why = if why.is_empty() {
                    "no reason given"
                } else {
                    why
                };
                *self.reasons.entry(why.to_string()).or_default() += 1;
            }
        }
    }

    fn report(&self, root: bool, user_args: &[String], skips: &[(&str, &str)]) {
        eprintln!(
            "xtask: RESULT tests passed={} failed={} ignored={}",
            self.passed, self.failed, self.ignored
        );
        if self.ignored == 0 && skips.is_empty() {
            return;
        }
        let bar = "=".repeat(78);
        eprintln!("{bar}");
        if self.ignored > 0 {
            let who = if root { "ignored as asked" } else { "not root" };
            eprintln!(
                "xtask: {} TESTS WERE LEFT OUT ({who}); they did not run:",
                self.ignored
            );
            for (why, n) in &self.reasons {
                eprintln!("xtask:   {n:>4}  {why}");
            }
        }
        for (name, why) in skips {
            eprintln!("xtask: LEFT OUT {name}: {why}");
        }
        if !root && self.ignored > 0 {
            let args: String = user_args.iter().map(|a| format!(" {a}")).collect();
            eprintln!("xtask: they load eBPF programs and create cgroups. Run them as root:");
            eprintln!("xtask:   sudo env \"PATH=$PATH\" cargo xtask test{args}");
            eprintln!("xtask:   (already root, e.g. on a fresh VM: cargo xtask test{args})");
        }
        eprintln!("{bar}");
    }
}

#[cfg(test)]
mod t {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn root_includes_ignored_and_merges_the_users_double_dash() {
        let base = "test --workspace --exclude agent-ebpf --no-fail-fast";
        let join = |v: Vec<String>| v.join(" ");
        assert_eq!(
            join(cargo_test_args(&[], true, &[])),
            format!("{base} -- --include-ignored")
        );
        assert_eq!(join(cargo_test_args(&[], false, &[])), format!("{base} --"));
        assert_eq!(
            join(cargo_test_args(
                &s(&["-p", "tests", "--", "--nocapture", "grpc"]),
                true,
                &[("v1", "why")]
            )),
            format!("{base} -p tests -- --include-ignored --skip v1 --nocapture grpc")
        );
        assert_eq!(
            join(cargo_test_args(&s(&["--", "--ignored"]), true, &[])),
            format!("{base} -- --ignored"),
            "the user's choice of ignored tests stands"
        );
    }

    #[test]
    fn counts_libtest_summaries_and_reasons() {
        let mut t = Tally::default();
        for l in [
            "test a ... ok",
            "test b ... ignored, needs root: loads the eBPF programs",
            "test c ... ignored, needs root: loads the eBPF programs",
            "test d ... ignored",
            "test result: ok. 1 passed; 0 failed; 3 ignored; 0 measured; 0 filtered out; finished in 0.01s",
            "test result: FAILED. 4 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s",
        ] {
            t.read(l);
        }
        assert_eq!((t.passed, t.failed, t.ignored), (5, 2, 3));
        assert_eq!(t.reasons["needs root: loads the eBPF programs"], 2);
        assert_eq!(t.reasons["no reason given"], 1);
    }
}
