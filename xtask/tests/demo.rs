//! `cargo xtask demo` as a newcomer runs it: its rows name pods and namespaces, the live
//! view moves, `--serve` says what to try and serves the pods, without root it says why in
//! one line, and nothing the demo made is left once it ends. The demo runs from the
//! agent and fake-nvml that `cargo xtask test` built (`--no-build`: a cargo inside cargo
//! test would wait for the build lock).
use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tests::{cgroups::v2_mount, random_hex};

const XTASK: &str = env!("CARGO_BIN_EXE_xtask");
const DEMO_DIR: &str = "/run/gpu-agent-demo";
/// The names the demo's sleepers run under (`comm`, 15 characters at most).
const COMMS: [&str; 6] = [
    "python3",
    "vllm-engine",
    "ipykernel",
    "tritonserver",
    "nvidia-cuda-mps",
    "ollama",
];

/// One demo at a time holds its directory.
static ONE_DEMO: Mutex<()> = Mutex::new(());

/// What a demo could leave behind.
#[derive(Debug, PartialEq)]
struct Traces {
    cgroups: BTreeSet<PathBuf>,
    sleepers: Vec<(u32, String)>,
    /// gpu-agent processes the demo started: `top` or `run` on the demo's configuration.
    agents: Vec<u32>,
    dir: bool,
}

fn traces() -> Traces {
    let mount = v2_mount();
    let mut cgroups = BTreeSet::new();
    for top in [
        "kubepods.slice",
        "kubepods",
        "system.slice/ollama.service",
        "system.slice/gpu-agent-demo-ollama.service",
    ] {
        walk(&mount.join(top), &mut cgroups);
    }
    let mut sleepers = vec![];
    let mut agents = vec![];
    let demo_config = format!("{DEMO_DIR}/agent.toml");
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let exe = std::fs::read_link(e.path().join("exe")).unwrap_or_default();
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        let comm = comm.trim();
        if exe.ends_with("sleep") && COMMS.contains(&comm) {
            sleepers.push((pid, comm.to_string()));
        }
        // By its arguments, not its binary, which a build may have replaced meanwhile.
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if cmdline
            .split(|&b| b == 0)
            .any(|a| a == demo_config.as_bytes())
        {
            agents.push(pid);
        }
    }
    Traces {
        cgroups,
        sleepers,
        agents,
        dir: Path::new(DEMO_DIR).exists(),
    }
}

fn walk(dir: &Path, out: &mut BTreeSet<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    out.insert(dir.to_path_buf());
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&e.path(), out);
        }
    }
}

/// Nothing of the demo's is left: its cgroups, processes (sleepers and the agent) and
/// directory are gone.
fn assert_clean(before: &Traces) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = traces();
        if now.cgroups == before.cgroups
            && now.sleepers.is_empty()
            && now.agents.is_empty()
            && !now.dir
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the demo left: {:?}\nsleepers: {:?}, agents: {:?}, {DEMO_DIR} still there: {}",
            now.cgroups.difference(&before.cgroups).collect::<Vec<_>>(),
            now.sleepers,
            now.agents,
            now.dir
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The frame's row (not a process line) for this pod on this GPU: its words, without the
/// box and the expansion mark, start with the pod, namespace, container and GPU.
fn row<'a>(frame: &'a str, pod: &str, gpu: &str) -> Option<&'a str> {
    frame.lines().find(|l| {
        let cols: Vec<&str> = (l.split_whitespace())
            .filter(|w| w.chars().any(char::is_alphanumeric))
            .collect();
        cols.first() == Some(&pod) && cols.get(3) == Some(&gpu)
    })
}

/// Without root the demo says why in one line and exits 2, before it makes anything. As
/// root, the test runs xtask as nobody (util-linux's setpriv), so it runs for everyone.
#[test]
fn demo_without_root_says_why_in_one_line_and_exits_2() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut cmd = if root {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", XTASK]);
        c
    } else {
        Command::new(XTASK)
    };
    let out = cmd
        .args(["demo", "--once", "--no-build"])
        .stdin(Stdio::null())
        .output()
        .expect("running xtask demo (as root: through setpriv, from util-linux)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    for word in ["needs root", "cgroups", "eBPF"] {
        assert!(stderr.contains(word), "no {word:?} in: {stderr}");
    }
}

#[test]
#[ignore = "needs root: the demo makes pod cgroups and the agent loads the eBPF programs"]
fn demo_once_names_every_pod_and_leaves_nothing_behind() {
    let _one = ONE_DEMO.lock().unwrap_or_else(|e| e.into_inner());
    let before = traces();
    assert!(before.sleepers.is_empty(), "{:?}", before.sleepers);
    assert!(before.agents.is_empty(), "{:?}", before.agents);
    let out = Command::new(XTASK)
        .args(["demo", "--once", "--no-build"])
        .output()
        .expect("running xtask demo");
    let frame = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{frame}\n{stderr}");
    for (pod, namespace, container, gpu) in [
        ("llama3-finetune-0", "ml-training", "trainer", "0"),
        ("llama3-finetune-0", "ml-training", "trainer", "1"),
        ("vllm-llama3-8b-6f7d9c5b4-x2k8p", "inference", "vllm", "2"),
        ("vllm-llama3-8b-6f7d9c5b4-m4hbt", "inference", "vllm", "2"),
        ("jupyter-alice", "research", "notebook", "3"),
        ("hparam-sweep-7", "ml-training", "worker", "4"),
        ("reranker-b9f4c2-lp6sd", "inference", "reranker", "5"),
        ("whisper-large-v3-0", "speech", "asr", "6/gi1"),
        ("whisper-large-v3-1", "speech", "asr", "6/gi2"),
        ("llama3-eval-1", "ml-training", "eval", "7"),
    ] {
        let r = row(&frame, pod, gpu).unwrap_or_else(|| panic!("no row {pod} on {gpu}:\n{frame}"));
        assert!(r.contains(namespace) && r.contains(container), "{r}");
    }
    // The MPS server serves the clients: charged to nobody, so its pod has no row.
    assert!(!frame.contains("mps-control-daemon"), "{frame}");
    let idle = row(&frame, "hparam-sweep-7", "4").unwrap();
    assert!(idle.contains("0 idle"), "allocated and unused: {idle}");
    let notebook = row(&frame, "jupyter-alice", "3").unwrap();
    assert!(notebook.contains("23.5 GiB"), "{notebook}");
    // The one row outside Kubernetes is the host's service.
    let host: Vec<&str> = frame.lines().filter(|l| l.contains(" host ")).collect();
    assert_eq!(host.len(), 1, "{frame}");
    assert!(frame.contains(" ollama"), "{frame}");
    assert!(
        frame.contains(" vllm-engine") && frame.contains(" ipykernel"),
        "{frame}"
    );
    assert!(stderr.contains("demo node removed"), "{stderr}");
    assert_clean(&before);
}

/// A running `xtask demo --serve`, its stderr gathered by a thread (with whether it has
/// ended); stopped on drop if the test did not end it.
struct Serve {
    child: std::process::Child,
    stderr: Arc<Mutex<(String, bool)>>,
}

impl Serve {
    fn start() -> Serve {
        let mut child = Command::new(XTASK)
            .args(["demo", "--serve", "--no-build"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running xtask demo --serve");
        let stderr = Arc::new(Mutex::new((String::new(), false)));
        let (pipe, text) = (child.stderr.take().unwrap(), stderr.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                let mut t = text.lock().unwrap();
                t.0.push_str(&line);
                t.0.push('\n');
            }
            text.lock().unwrap().1 = true;
        });
        Serve { child, stderr }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().0.clone()
    }

    /// Waits until stderr holds `what`; returns it all.
    fn wait_stderr(&self, what: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let (text, closed) = self.stderr.lock().unwrap().clone();
            if text.contains(what) {
                return text;
            }
            assert!(
                !closed && Instant::now() < deadline,
                "waiting for {what:?} (stderr closed: {closed}); xtask's stderr:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            // SAFETY: signalling our own child: the demo's handler ends it and removes the node.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(30);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
#[ignore = "needs root: the demo makes pod cgroups and the agent loads the eBPF programs"]
fn demo_serve_prints_what_to_try_serves_the_pods_and_ctrl_c_removes_the_node() {
    let _one = ONE_DEMO.lock().unwrap_or_else(|e| e.into_inner());
    let before = traces();
    assert!(before.agents.is_empty(), "{:?}", before.agents);
    let mut demo = Serve::start();
    let text = demo.wait_stderr("Ctrl-C stops", Duration::from_secs(90));
    // The lines to try, with the address the agent serves on.
    let curl = text
        .lines()
        .find(|l| l.trim_start().starts_with("curl -s ") && l.contains("/metrics"))
        .unwrap_or_else(|| panic!("no curl line for /metrics:\n{text}"));
    let url = curl.split_whitespace().nth(2).unwrap();
    let addr = url.strip_suffix("/metrics").unwrap();
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("curl -s ") && l.contains("/debug/snapshot")),
        "{text}"
    );
    // The usage file is in the demo's root-only directory: the line says sudo.
    let report = text
        .lines()
        .find(|l| l.contains(" report --file "))
        .unwrap_or_else(|| panic!("no report line:\n{text}"));
    assert!(report.trim_start().starts_with("sudo "), "{report}");
    assert!(report.contains(&format!("{DEMO_DIR}/")), "{report}");
    // /metrics names the demo's pods once the runtime and the kubelet have named them.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = tests::http::get(addr, "/metrics").map(|(_, body)| body);
        let body = metrics.as_deref().unwrap_or_default();
        if body.contains("pod=\"llama3-finetune-0\"") && body.contains("namespace=\"ml-training\"")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/metrics on {addr} names no demo pod: {metrics:?}\n{}",
            demo.stderr()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Ctrl-C: SIGINT to xtask (the agent has a process group of its own).
    // SAFETY: signalling our own child.
    unsafe { libc::kill(demo.child.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = demo.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the demo did not end:\n{}",
            demo.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status.code(), Some(128 + libc::SIGINT), "{}", demo.stderr());
    demo.wait_stderr("demo node removed", Duration::from_secs(5));
    assert_clean(&before);
}

/// The demo in a detached tmux session on a server of its own; killed on drop.
struct Tmux {
    socket: String,
    dir: PathBuf,
}

impl Tmux {
    fn start(cmd: &str) -> Tmux {
        let dir = std::env::temp_dir().join(format!("xtask-demo-test-{}", random_hex(8)));
        std::fs::create_dir_all(&dir).unwrap();
        let t = Tmux {
            socket: format!("xtask-demo-{}", random_hex(8)),
            dir,
        };
        let conf = t.dir.join("tmux.conf");
        std::fs::write(
            &conf,
            "set -g remain-on-exit on\nset -g default-shell /bin/sh\n",
        )
        .unwrap();
        let d = t.dir.display();
        let script = format!("{cmd} 2> {d}/stderr; echo $? > {d}/rc");
        let conf = conf.to_str().unwrap();
        t.tmux(&[
            "-f",
            conf,
            "new-session",
            "-d",
            "-s",
            "demo",
            "-x",
            "160",
            "-y",
            "50",
            &script,
        ]);
        t
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux: `cargo xtask test` installs it as root");
        assert!(out.status.success(), "tmux {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", "demo"])
    }

    fn wait_screen(&self, what: &str, within: Duration, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + within;
        loop {
            let s = self.screen();
            if pred(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "waiting for {what}; screen:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn read(&self, f: &str) -> String {
        std::fs::read_to_string(self.dir.join(f)).unwrap_or_default()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
#[ignore = "needs root: the demo makes pod cgroups and the agent loads the eBPF programs (and tmux)"]
fn demo_top_moves_and_q_removes_the_node() {
    let _one = ONE_DEMO.lock().unwrap_or_else(|e| e.into_inner());
    let before = traces();
    let t = Tmux::start(&format!("{XTASK} demo --no-build"));
    let screen = t.wait_screen("the pods", Duration::from_secs(60), |s| {
        s.contains("llama3-finetune-0") && s.contains("whisper-large-v3-1")
    });
    assert!(screen.contains("NVIDIA H100 80GB HBM3"), "{screen}");
    assert!(screen.contains("demo-gpu-node"), "{screen}");
    // Sorted by SM %, the trainer comes first; Enter shows its processes.
    t.tmux(&["send-keys", "-t", "demo", "u", "Home", "Enter"]);
    t.wait_screen("the trainer's processes", Duration::from_secs(10), |s| {
        s.lines()
            .filter(|l| l.contains("python3") && l.contains('└'))
            .count()
            >= 1
    });
    // The first evaluation job finishes and the next one starts, named.
    t.wait_screen("llama3-eval-2", Duration::from_secs(60), |s| {
        s.contains("llama3-eval-2") && !s.contains("llama3-eval-1")
    });
    t.tmux(&["send-keys", "-t", "demo", "q"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while t.read("rc").is_empty() {
        assert!(
            Instant::now() < deadline,
            "the demo did not end:\n{}",
            t.screen()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(t.read("rc").trim(), "0", "{}", t.read("stderr"));
    assert!(
        t.read("stderr").contains("demo node removed"),
        "{}",
        t.read("stderr")
    );
    assert_clean(&before);
}
