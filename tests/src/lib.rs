//! Test support: the real agent binary, real cgroups shaped like kubelet's, real processes.
//! Nothing here fakes the kernel; only what this machine lacks (a GPU) is faked elsewhere.
pub mod cgroups;
pub mod dcgm_node;
pub mod fake_node;
pub mod http;
pub mod manifests;
pub mod nvml;
pub mod otlp_receiver;
pub mod prom;
pub mod rightsize;
pub mod rules;

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{mpsc, Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::Value;

/// target/<profile>/ of this test binary: the agent binary sits there.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/debug/deps/<test>-<hash>
    exe.parent()
        .and_then(|p| p.parent())
        .expect("target dir")
        .to_path_buf()
}

pub fn agent_binary() -> PathBuf {
    let bin = target_dir().join("gpu-agent");
    assert!(
        bin.exists(),
        "{} is missing: build it first (`cargo xtask test` does)",
        bin.display()
    );
    bin
}

/// The fake libnvidia-ml.so built from fake-nvml/ (`cargo xtask test` builds it).
pub fn fake_nvml_lib() -> PathBuf {
    let lib = target_dir().join("libnvidia_ml.so");
    assert!(
        lib.exists(),
        "{} is missing: build it first (`cargo build -p fake-nvml`; `cargo xtask test` does)",
        lib.display()
    );
    lib
}

/// `d` times `$GPU_AGENT_TEST_TIME_SCALE` (default 1): the kernel matrix sets it in its
/// emulated VMs, where loading the programs alone takes seconds. Only waits are stretched;
/// what the tests assert stays the same.
pub fn slow(d: Duration) -> Duration {
    let scale = std::env::var("GPU_AGENT_TEST_TIME_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 1.0)
        .unwrap_or(1.0);
    d.mul_f64(scale)
}

/// A directory under the system's temp dir, `<prefix>-<random>`, made now and removed with
/// everything in it on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("{prefix}-{}", random_hex(8)));
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A JSON-lines file (usage records), one value a line; none where it does not exist yet.
pub fn read_json_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// A snapshot's entry of container `id` (/debug/snapshot's JSON).
pub fn container<'a>(snap: &'a Value, id: &str) -> Option<&'a Value> {
    snap["containers"]
        .as_array()?
        .iter()
        .find(|c| c["container_id"] == id)
}

/// The repository's root (the tests crate sits one below it).
pub fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn random_hex(len: usize) -> String {
    let mut buf = vec![0u8; len.div_ceil(2)];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut buf))
        .expect("urandom");
    let s: String = buf.iter().map(|b| format!("{b:02x}")).collect();
    s[..len].to_string()
}

pub fn random_uid() -> String {
    let h = random_hex(32);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// A running `gpu-agent run`. Stopped (SIGTERM) on drop.
pub struct Agent {
    child: Child,
    pub addr: String,
    log: Arc<Mutex<Vec<String>>>,
    config: Option<tempfile_path::TempPath>,
}

mod tempfile_path {
    pub struct TempPath(pub std::path::PathBuf);
    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

impl Agent {
    pub fn start(config_toml: &str) -> Agent {
        Self::start_with(config_toml, &[])
    }

    pub fn start_with(config_toml: &str, extra_args: &[&str]) -> Agent {
        Self::start_binary(&agent_binary(), config_toml, extra_args)
    }

    /// Starts a given build of the agent (the benchmarks use the release one).
    pub fn start_binary(bin: &std::path::Path, config_toml: &str, extra_args: &[&str]) -> Agent {
        Self::start_full(bin, config_toml, extra_args, &[])
    }

    /// Starts the agent with extra environment variables (e.g. FAKE_NVML_SCENARIO).
    pub fn start_env(config_toml: &str, extra_args: &[&str], env: &[(&str, &str)]) -> Agent {
        Self::start_full(&agent_binary(), config_toml, extra_args, env)
    }

    pub fn start_full(
        bin: &std::path::Path,
        config_toml: &str,
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> Agent {
        let path = std::env::temp_dir().join(format!("gpu-agent-test-{}.toml", random_hex(12)));
        std::fs::write(&path, config_toml).expect("writing the test config");
        let mut cmd = Command::new(bin);
        cmd.args(["run", "--http-addr", "127.0.0.1:0", "--config"])
            .arg(&path)
            .args(extra_args)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        Self::spawn(cmd, Some(tempfile_path::TempPath(path)))
    }

    /// Spawns a prepared command (e.g. with another uid) and waits until it is ready.
    pub fn spawn(mut cmd: Command, config: Option<tempfile_path::TempPath>) -> Agent {
        let mut child = cmd.spawn().expect("spawning gpu-agent");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(i) = line.find("addr=") {
                    if line.contains("http server listening") {
                        let _ = tx.send(line[i + 5..].trim().to_string());
                    }
                }
                log2.lock().unwrap().push(line);
            }
        });
        let addr = match rx.recv_timeout(slow(Duration::from_secs(30))) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "gpu-agent did not start listening:\n{}",
                    log.lock().unwrap().join("\n")
                );
            }
        };
        let agent = Agent {
            child,
            addr,
            log,
            config,
        };
        agent.wait_until("readyz", Duration::from_secs(30), || {
            http::get(&agent.addr, "/readyz").is_ok_and(|(s, _)| s == 200)
        });
        agent
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How the agent exited, if it has.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("wait")
    }

    /// The config file the agent was started with (a test may edit it, then SIGHUP).
    pub fn config_path(&self) -> Option<&std::path::Path> {
        self.config.as_ref().map(|c| c.0.as_path())
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    pub fn json(&self, path: &str) -> Value {
        let (status, body) = http::get(&self.addr, path)
            .unwrap_or_else(|e| panic!("GET {path}: {e}\nagent log:\n{}", self.log()));
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
    }

    pub fn stats(&self) -> Value {
        self.json("/debug/stats")
    }

    /// Polls /debug/snapshot every 100 ms until `pred` finds what it wants; panics after
    /// `within` with the last snapshot and the agent's log.
    pub fn wait_snapshot(
        &self,
        within: std::time::Duration,
        what: &str,
        mut pred: impl FnMut(&Value) -> bool,
    ) -> Value {
        let deadline = std::time::Instant::now() + within;
        let mut last = Value::Null;
        while std::time::Instant::now() < deadline {
            last = self.json("/debug/snapshot");
            if pred(&last) {
                return last;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!(
            "timed out waiting for {what}; last snapshot:\n{last:#}\nagent log:\n{}",
            self.log()
        );
    }

    pub fn processes(&self) -> Vec<Value> {
        self.json("/debug/processes")
            .as_array()
            .expect("an array")
            .clone()
    }

    pub fn process(&self, pid: u32) -> Option<Value> {
        self.processes()
            .into_iter()
            .find(|p| p["pid"].as_u64() == Some(pid as u64))
    }

    /// Polls `cond` until it holds; panics with the agent's log after `timeout`.
    pub fn wait_until(&self, what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + slow(timeout);
        while Instant::now() < deadline {
            if cond() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("timed out waiting for {what}\nagent log:\n{}", self.log());
    }

    /// Waits until the agent shows `pid` with `field == value`; returns its row.
    pub fn wait_for_process(&self, pid: u32, field: &str, value: &Value) -> Value {
        let mut last = None;
        let deadline = Instant::now() + slow(Duration::from_secs(10));
        while Instant::now() < deadline {
            last = self.process(pid);
            if last.as_ref().is_some_and(|p| &p[field] == value) {
                return last.unwrap();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "pid {pid}: wanted {field} = {value}, last seen {last:?}\nagent log:\n{}",
            self.log()
        );
    }

    /// SIGKILL and wait, as an OOM kill ends it: no final export, no last records.
    pub fn kill(mut self) -> std::process::ExitStatus {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("wait")
    }

    /// SIGTERM and wait; returns the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        self.terminate()
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                return s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return self.child.wait().expect("wait");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.terminate();
        }
    }
}
