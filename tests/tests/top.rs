//! `gpu-agent top` in a real terminal: tmux runs it, `send-keys` types, `capture-pane`
//! reads the screen. The sources are real (eBPF, processes in pod cgroups); NVML is the
//! fake library driven by a scenario. Needs root and tmux (`cargo xtask test` installs tmux
//! as root).
use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use tests::{
    agent_binary,
    cgroups::{sleeper, systemd_container, Proc, TestCgroup},
    fake_nvml_lib,
    nvml::Scenario,
    random_hex, random_uid,
};

const GIB: u64 = 1 << 30;
const GPU_NAME: &str = "NVIDIA H100 80GB HBM3";

/// A scenario file, removed on drop.
fn p(pid: u32, mem: u64, sm: u32) -> Value {
    json!({"pid": pid, "used_memory": mem, "sm_util": sm, "mem_util": 3, "enc_util": 0, "dec_util": 0})
}

fn one_gpu(processes: Value) -> Value {
    json!({"driver_version": "580.159.04", "devices": [{
        "uuid": "GPU-6663f2bc-da9f-4cff-88fe-d84cc95fe598", "name": GPU_NAME,
        "memory_total": 85520809984u64, "memory_used": 6 * GIB, "utilization_gpu": 85,
        "utilization_memory": 20, "power_mw": 412000, "temperature_c": 51,
        "processes": processes
    }]})
}

/// A pod container with sleepers in it: what a GPU workload looks like to the agent.
struct Workload {
    id: String,
    procs: Vec<Proc>,
    _cg: TestCgroup,
}

impl Workload {
    fn new(n: usize) -> Workload {
        let id = random_hex(64);
        let cg = TestCgroup::v2(&systemd_container(&random_uid(), &id));
        let procs = (0..n).map(|_| Proc(cg.spawn(&mut sleeper()))).collect();
        Workload { id, procs, _cg: cg }
    }

    fn short(&self) -> &str {
        &self.id[..12]
    }

    fn pid(&self, i: usize) -> u32 {
        self.procs[i].pid()
    }
}

/// tmux is a requirement, not a reason to skip: `cargo xtask test` installs it as root.
fn require_tmux(test: &str) {
    let ok = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "{test}: tmux is missing (`apt-get install -y tmux`; `cargo xtask test` installs it as root)"
    );
}

/// `gpu-agent top` in a detached tmux session on a server of its own; killed on drop.
struct Top {
    socket: String,
    dir: PathBuf,
}

impl Top {
    /// Runs `top` with `args` in a 200x50 pane. The wrapper records the terminal settings
    /// before and after and top's status, then waits for the test to look at the screen
    /// (a dead pane always reports a hidden cursor) before it exits with that status.
    fn start(scenario: &Scenario, args: &[&str]) -> Top {
        let dir = std::env::temp_dir().join(format!("gpu-agent-top-test-{}", random_hex(10)));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("tmux.conf"),
            "set -g remain-on-exit on\nset -g default-shell /bin/sh\n",
        )
        .unwrap();
        let d = dir.display();
        let cmd = format!(
            "stty -g > {d}/stty.before; FAKE_NVML_SCENARIO={sc} {bin} top --nvml-lib {lib} \
             --log-file {d}/top.log {args}; rc=$?; stty -g > {d}/stty.after; echo $rc > {d}/rc; \
             while [ ! -e {d}/go ]; do sleep 0.05; done; exit $rc",
            sc = scenario.path(),
            bin = agent_binary().display(),
            lib = fake_nvml_lib().display(),
            args = args.join(" "),
        );
        let top = Top {
            socket: format!("gpu-agent-test-{}", random_hex(8)),
            dir,
        };
        let conf = top.dir.join("tmux.conf");
        top.tmux(&[
            "-f",
            conf.to_str().unwrap(),
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            "200",
            "-y",
            "50",
            &cmd,
        ]);
        top
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("running tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", "top"])
    }

    fn pane(&self, format: &str) -> String {
        self.tmux(&["display-message", "-p", "-t", "top", format])
            .trim()
            .to_string()
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "top"];
        args.extend_from_slice(keys);
        self.tmux(&args);
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("top.log")).unwrap_or_default()
    }

    /// Polls the screen until `pred` holds; returns it.
    fn wait_screen(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut last = String::new();
        while Instant::now() < deadline {
            last = self.screen();
            if pred(&last) {
                return last;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "timed out waiting for {what}; screen:\n{last}\ntop's log:\n{}",
            self.log()
        );
    }

    /// Waits for top to exit, checks that it restored the terminal, and returns the
    /// status its pane ends with.
    fn wait_exit_restored(&self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !self.dir.join("rc").exists() {
            assert!(
                Instant::now() < deadline,
                "top did not exit; screen:\n{}\nlog:\n{}",
                self.screen(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            self.pane("#{alternate_on}"),
            "0",
            "still on the alternate screen"
        );
        assert_eq!(self.pane("#{cursor_flag}"), "1", "cursor left hidden");
        let read = |f: &str| std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
        let (before, after) = (read("stty.before"), read("stty.after"));
        assert!(!before.is_empty(), "the wrapper did not record the tty");
        assert_eq!(before, after, "tty settings (raw mode) not restored");
        std::fs::write(self.dir.join("go"), "").unwrap();
        // The pane goes dead at the pty's EOF; its status comes when tmux reaps the child.
        // tmux 3.3a sometimes misses that SIGCHLD (the child stays a zombie); a job of the
        // server's own exiting makes it reap every child, so one is started each round.
        loop {
            let s = self.pane("#{pane_dead}|#{pane_dead_status}|#{pane_dead_signal}");
            match s.split('|').collect::<Vec<_>>()[..] {
                ["1", "", ""] => {
                    self.tmux(&["run-shell", "true"]);
                }
                ["1", "", signal] => panic!("top's wrapper was killed by signal {signal}"),
                ["1", status, _] => {
                    let rc = std::fs::read_to_string(self.dir.join("rc")).unwrap();
                    assert_eq!(status, rc.trim(), "the wrapper exits with top's status");
                    return status.parse().unwrap();
                }
                _ => {}
            }
            assert!(Instant::now() < deadline, "the wrapper did not exit: {s:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Top {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The screen line of the container row with this short id.
fn row_index(screen: &str, short: &str) -> Option<usize> {
    screen.lines().position(|l| l.contains(short))
}

fn above(screen: &str, a: &str, b: &str) -> bool {
    matches!((row_index(screen, a), row_index(screen, b)), (Some(x), Some(y)) if x < y)
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups (and tmux)"]
fn top_shows_containers_sorts_expands_and_quits_cleanly() {
    require_tmux("top_shows_containers");
    // A holds less memory but works harder than B.
    let a = Workload::new(2);
    let b = Workload::new(1);
    let sc = Scenario::new(&one_gpu(json!([
        p(a.pid(0), GIB, 50),
        p(a.pid(1), GIB / 2, 30),
        p(b.pid(0), 4 * GIB, 5)
    ])));
    let top = Top::start(&sc, &[]);
    let screen = top.wait_screen("both containers", |s| {
        row_index(s, a.short()).is_some() && row_index(s, b.short()).is_some()
    });
    assert!(screen.contains(GPU_NAME), "{screen}");
    let row_a = screen.lines().find(|l| l.contains(a.short())).unwrap();
    assert!(row_a.contains("1.5 GiB"), "{row_a}");
    assert!(
        row_a.contains(" 80 "),
        "SM% summed over its processes: {row_a}"
    );
    assert!(
        screen.contains("sort by memory"),
        "the footer names the keys: {screen}"
    );
    assert!(above(&screen, b.short(), a.short()), "by memory:\n{screen}");

    top.keys(&["u"]);
    top.wait_screen("A first by utilization", |s| above(s, a.short(), b.short()));
    top.keys(&["m"]);
    top.wait_screen("B first by memory", |s| above(s, b.short(), a.short()));

    // Select A (second row) and expand it into its processes.
    let proc_line = |s: &str, pid: u32| s.lines().any(|l| l.contains(&format!("└ {pid} sleep")));
    assert!(!proc_line(&screen, a.pid(0)), "collapsed at first");
    top.keys(&["Home", "j"]);
    top.wait_screen("A selected", |s| {
        s.lines()
            .find(|l| l.contains(a.short()))
            .is_some_and(|l| l.contains('>'))
    });
    top.keys(&["Enter"]);
    let screen = top.wait_screen("A's processes", |s| {
        proc_line(s, a.pid(0)) && proc_line(s, a.pid(1))
    });
    assert!(!proc_line(&screen, b.pid(0)), "only A expanded:\n{screen}");
    top.keys(&["e"]);
    top.wait_screen("A collapsed", |s| !proc_line(s, a.pid(0)));

    top.keys(&["q"]);
    assert_eq!(top.wait_exit_restored(), 0, "log:\n{}", top.log());
}

#[test]
#[ignore = "needs root: runs top as an operator does (and tmux)"]
fn top_says_when_nvml_and_ebpf_are_unavailable_and_quits_on_ctrl_c() {
    require_tmux("top_says_when_nvml_and_ebpf_are_unavailable");
    let sc = Scenario::new(&json!({"driver_loaded": false, "devices": []}));
    let top = Top::start(&sc, &["--no-ebpf"]);
    let screen = top.wait_screen("the degraded lines", |s| {
        s.contains("NVML unavailable") && s.contains("/proc mode")
    });
    assert!(screen.contains("ebpf.enabled = false"), "{screen}");
    assert!(screen.contains("no GPU seen"), "{screen}");
    top.keys(&["C-c"]);
    assert_eq!(top.wait_exit_restored(), 0, "log:\n{}", top.log());
}

fn run_once(scenario: &Scenario, extra: &[&str]) -> (std::process::Output, String) {
    let out = Command::new(agent_binary())
        .args(["top", "--once", "--nvml-lib"])
        .arg(fake_nvml_lib())
        .args(extra)
        .env("FAKE_NVML_SCENARIO", scenario.path())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("running gpu-agent top --once");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out, text)
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn top_once_prints_one_plain_frame() {
    let a = Workload::new(2);
    let host = Proc(sleeper().spawn().unwrap());
    let sc = Scenario::new(&one_gpu(json!([
        p(a.pid(0), GIB, 50),
        p(a.pid(1), GIB / 2, 30),
        p(host.pid(), 64 << 20, 0)
    ])));
    let started = Instant::now();
    let (out, text) = run_once(&sc, &[]);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "waits a few seconds at most"
    );
    assert!(
        !out.stdout.contains(&0x1b),
        "escape codes in the plain frame:\n{text}"
    );
    assert!(text.starts_with("gpu-agent top"), "{text}");
    assert!(text.contains(GPU_NAME), "{text}");
    let row = text
        .lines()
        .find(|l| l.contains(a.short()))
        .unwrap_or_else(|| panic!("no row for {}:\n{text}", a.short()));
    assert!(row.contains("1.5 GiB"), "{row}");
    let host_row = text
        .lines()
        .find(|l| l.contains(" host "))
        .unwrap_or_else(|| panic!("no host row:\n{text}"));
    assert!(host_row.contains("64.0 MiB"), "{host_row}");
    // A bug report wants the processes: the plain frame shows them all.
    for pid in [a.pid(0), a.pid(1), host.pid()] {
        assert!(
            text.contains(&format!("└ {pid} sleep")),
            "pid {pid} missing:\n{text}"
        );
    }
    assert!(!text.contains(" quit "), "no key help in a plain frame");
}

#[test]
#[ignore = "needs root: loads the eBPF programs"]
fn top_once_without_a_driver_says_so() {
    let sc = Scenario::new(&json!({"driver_loaded": false, "devices": []}));
    let (out, text) = run_once(&sc, &[]);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("NVML unavailable"), "{text}");
    assert!(!text.contains("waiting for the first GPU sample"), "{text}");
}

/// Not root-only: the flags parse like `run`'s.
#[test]
fn top_rejects_a_bad_config_like_run() {
    let cfg = std::env::temp_dir().join(format!("gpu-agent-top-{}.toml", random_hex(8)));
    std::fs::write(&cfg, "[ebpf]\nring_bufer_bytes = 4096\n").unwrap();
    let out = Command::new(agent_binary())
        .args(["top", "--once", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&cfg);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ring_bufer_bytes"));
}
