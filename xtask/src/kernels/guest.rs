//! What runs in each kernel of the matrix (`xtask kernel-matrix --guest DIR`, inside a VM or
//! directly on the host): one end-to-end run of the agent, which also tells the mode the
//! agent chose, then the prebuilt root-only test binaries. Reads DIR/plan.json, writes
//! DIR/result.json.
use std::{
    io::{BufRead, BufReader},
    panic::AssertUnwindSafe,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use tests::{
    cgroups::{sleeper, systemd_container, v1_memory_mount, Proc, TestCgroup},
    random_hex, random_uid, Agent,
};

use super::install::version_key;

/// Needs a cgroup v1 memory hierarchy: hybrid hosts only (VMs boot pure cgroup v2).
const V1_TEST: &str = "process_only_in_a_cgroup_v1_hierarchy_is_attributed";
/// agent_cli's tests of the degraded /proc mode: run on every kernel.
const PROCFS_TESTS: &[&str] = &[
    "proc_mode_keeps_answering_and_says_why",
    "without_privilege_it_names_the_missing_capability_and_runs_on",
];
const EBPF_CLI_TEST: &str = "sigterm_exits_zero_in_ebpf_mode";

/// The programs need the BPF ring buffer (5.8); below it the agent must run in /proc mode.
pub fn expected_mode(release: &str) -> &'static str {
    if version_key(release).as_slice() >= [5, 8].as_slice() {
        "ebpf"
    } else {
        "procfs"
    }
}

/// "v2" (pure cgroup v2), "hybrid" (v1 controllers, cgroup2 beside them) or "v1".
pub fn cgroup_layout() -> &'static str {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let fstypes: Vec<&str> = mi
        .lines()
        .filter_map(|l| l.split_once(" - ")?.1.split(' ').next())
        .collect();
    match (fstypes.contains(&"cgroup2"), fstypes.contains(&"cgroup")) {
        (true, false) => "v2",
        (true, true) => "hybrid",
        (false, true) => "v1",
        (false, false) => "none",
    }
}

#[derive(Default)]
struct Tally {
    passed: u64,
    failed: u64,
    failures: Vec<String>,
}

impl Tally {
    fn fail(&mut self, what: String) {
        println!("xtask: guest: FAILED {what}");
        self.failed += 1;
        self.failures.push(what);
    }
}

pub fn run(dir: &Path) -> Result<()> {
    let started = Instant::now();
    let plan: Value =
        serde_json::from_slice(&std::fs::read(dir.join("plan.json")).context("reading the plan")?)?;
    let path = |k: &str| PathBuf::from(plan[k].as_str().unwrap_or_default());
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")?
        .trim()
        .to_string();
    let layout = cgroup_layout();
    let expected = expected_mode(&release);
    let tracefs = Path::new("/sys/kernel/tracing/events").is_dir();
    // Newer kernels say whether an exit ends the thread group; older ones leave the
    // programs to compare pid and tgid.
    let group_dead =
        std::fs::read_to_string("/sys/kernel/tracing/events/sched/sched_process_exit/format")
            .ok()
            .map(|f| f.contains(" group_dead;"));
    println!(
        "xtask: guest: kernel {release}, cgroup {layout}, tracefs {}, BTF {}, \
         sched_process_exit.group_dead {}, expecting {expected} mode",
        if tracefs {
            "mounted"
        } else {
            "not mounted (the agent mounts it)"
        },
        if Path::new("/sys/kernel/btf/vmlinux").exists() {
            "yes"
        } else {
            "no"
        },
        group_dead.map_or("unknown", |g| if g { "yes" } else { "no" }),
    );
    if let Some(scale) = plan["time_scale"].as_u64() {
        // Read by the tests' waits (tests::slow) and by the end-to-end check below.
        std::env::set_var("GPU_AGENT_TEST_TIME_SCALE", scale.to_string());
    }
    let left_out: Vec<(String, String)> = plan["left_out"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| Some((l[0].as_str()?.into(), l[1].as_str()?.into())))
        .collect();
    let mut t = Tally::default();
    let (mode, reason) = match std::panic::catch_unwind(AssertUnwindSafe(|| {
        end_to_end(&path("agent"), &path("fake_nvml"), &path("scenario"))
    })) {
        Ok(Ok((mode, reason))) => {
            println!("xtask: guest: end-to-end check ok (mode {mode})");
            t.passed += 1;
            (mode, reason)
        }
        Ok(Err(e)) => {
            t.fail(format!("end-to-end check: {e:#}"));
            ("none".into(), None)
        }
        Err(_) => {
            t.fail("end-to-end check panicked (message above)".into());
            ("none".into(), None)
        }
    };
    if mode != expected && mode != "none" {
        t.fail(format!(
            "mode {mode}, expected {expected} on {release} ({})",
            reason.as_deref().unwrap_or("no reason given")
        ));
    }
    // The process-cache tests assert eBPF mode: they run where the programs should load.
    if expected == "ebpf" {
        let mut args = vec!["--include-ignored"];
        if v1_memory_mount().is_none() {
            args.extend(["--skip", V1_TEST]);
        }
        for (name, why) in &left_out {
            println!("xtask: guest: LEFT OUT {name}: {why}");
            args.extend(["--skip", name.as_str()]);
        }
        run_tests(&path("process_cache"), &args, None, &mut t);
    }
    let mut cli: Vec<&str> = PROCFS_TESTS.to_vec();
    if expected == "ebpf" {
        cli.push(EBPF_CLI_TEST);
    }
    let mut args = vec!["--include-ignored", "--exact"];
    args.extend(&cli);
    run_tests(&path("agent_cli"), &args, Some(cli.len() as u64), &mut t);

    let result = json!({
        "release": release, "cgroup_layout": layout, "mode": mode,
        "expected_mode": expected, "degraded_reason": reason, "tracefs_mounted": tracefs,
        "exit_group_dead_field": group_dead,
        "passed": t.passed, "failed": t.failed, "failures": t.failures,
        "seconds": started.elapsed().as_secs(), "left_out": left_out,
    });
    std::fs::write(dir.join("result.json"), serde_json::to_vec_pretty(&result)?)
        .context("writing result.json")?;
    if t.failed > 0 {
        bail!("{} check(s) failed on {release}", t.failed);
    }
    Ok(())
}

/// Runs one prebuilt libtest binary (its output passes through) and counts its verdicts.
/// `want`: how many tests must have run, so that a filter matching nothing is a failure.
fn run_tests(bin: &Path, args: &[&str], want: Option<u64>, t: &mut Tally) {
    let name = bin
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    println!("xtask: guest: {name} {}", args.join(" "));
    // The tests find the scenarios through paths fixed at build time, not the cwd.
    let child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return t.fail(format!("{}: {e}", bin.display())),
    };
    let (mut passed, mut failed) = (0, 0);
    for line in BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
    {
        println!("{line}");
        if let Some((test, verdict)) = line
            .strip_prefix("test ")
            .and_then(|l| l.split_once(" ... "))
        {
            match verdict {
                "ok" => passed += 1,
                "FAILED" => {
                    failed += 1;
                    t.failures.push(format!("{name}: {test}"));
                }
                _ => {}
            }
        }
    }
    let status = child.wait();
    t.passed += passed;
    t.failed += failed;
    if failed == 0 && !status.as_ref().is_ok_and(|s| s.success()) {
        t.fail(format!("{name} exited with {status:?} and no failed test"));
    } else if passed + failed == 0 || want.is_some_and(|w| passed + failed != w) {
        t.fail(format!(
            "{name}: {} tests ran, expected {}",
            passed + failed,
            want.map_or("some".into(), |w| w.to_string())
        ));
    }
}

/// The agent (debug build) with the fake NVML library on the 8-GPU scenario, one of whose
/// GPU processes is a real process in a kubelet-shaped (systemd driver) pod cgroup:
/// /debug/snapshot must charge that pod. Returns the agent's mode and degraded reason.
fn end_to_end(agent_bin: &Path, lib: &Path, scenario: &Path) -> Result<(String, Option<String>)> {
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&systemd_container(&uid, &id));
    let p = Proc(cg.spawn(&mut sleeper()));
    let mut sc: Value = serde_json::from_slice(
        &std::fs::read(scenario).with_context(|| format!("reading {}", scenario.display()))?,
    )?;
    let gpu = sc["devices"][0]["uuid"].clone();
    let proc0 = &mut sc["devices"][0]["processes"][0];
    let memory = proc0["used_memory"].clone();
    proc0["pid"] = json!(p.pid());
    let sc_path = std::env::temp_dir().join(format!("kernel-matrix-{}.json", random_hex(8)));
    std::fs::write(&sc_path, sc.to_string())?;
    // The library reads it on every call: it stays until the agent has stopped.
    let _scenario = RemoveOnDrop(sc_path.clone());
    let agent = Agent::start_full(
        agent_bin,
        "[nvml]\ninterval_ms = 200\n[cache]\nprocfs_rescan_secs = 1\n",
        &["--nvml-lib", lib.to_str().context("library path")?],
        &[("FAKE_NVML_SCENARIO", sc_path.to_str().unwrap())],
    );
    let stats = agent.stats();
    let mode = stats["mode"].as_str().unwrap_or("unknown").to_string();
    let reason = stats["degraded_reason"].as_str().map(String::from);
    let deadline = Instant::now() + tests::slow(Duration::from_secs(30));
    let want = json!({"uuid": gpu, "memory_used_bytes": memory, "pids": [p.pid()]});
    let charged = loop {
        let snap = agent.json("/debug/snapshot");
        let row = snap["containers"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["container_id"] == json!(id)).cloned());
        let ok = row.as_ref().is_some_and(|c| {
            c["pod_uid"] == json!(uid)
                && c["qos"] == "burstable"
                && c["gpus"].as_array().is_some_and(|g| {
                    g.iter().any(|g| {
                        ["uuid", "memory_used_bytes", "pids"]
                            .iter()
                            .all(|k| g[k] == want[k])
                    })
                })
        });
        if ok || Instant::now() > deadline {
            break ok.then_some(()).ok_or(snap);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if let Err(snap) = charged {
        bail!(
            "pod {uid} container {id} not charged {want} in time ({mode} mode); last \
             snapshot:\n{snap:#}\nagent log:\n{}",
            agent.log()
        );
    }
    let log = agent.log();
    if !agent.stop().success() {
        bail!("the agent did not exit 0 on SIGTERM\n{log}");
    }
    Ok((mode, reason))
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
