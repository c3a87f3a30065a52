//! The pieces of the HTTP attack tests: a node with 5,400 processes, a fork storm, the
//! attackers, a /healthz prober, and the agent's memory read from /proc.
use std::{
    ffi::CString,
    fmt,
    io::{Read, Write},
    net::TcpStream,
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tests::{
    cgroups::{systemd_container, TestCgroup},
    random_hex, random_uid, Agent,
};

/// The node size of the measurements in docs/reliability.md.
pub const PROCESSES: usize = 5_400;

/// The agent under test: `GPU_AGENT_BIN` when set (the release build, or an older one to
/// compare), else the debug build the tests use.
pub fn agent_bin() -> PathBuf {
    std::env::var_os("GPU_AGENT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(tests::agent_binary)
}

/// A running agent and its metrics address (its `http.addr` when `GPU_AGENT_ONE_ADDR` is
/// set, to measure a build that has no `--metrics-addr`).
pub struct Started {
    pub agent: Agent,
    pub metrics: String,
    config: PathBuf,
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
    }
}

fn one_addr() -> bool {
    std::env::var_os("GPU_AGENT_ONE_ADDR").is_some()
}

/// The agent in eBPF mode with /metrics on, no NVML; `nofile` sets its RLIMIT_NOFILE.
pub fn start_agent(nofile: Option<u64>) -> Started {
    start_with("[nvml]\nenabled = false\n", &["--prometheus"], nofile)
}

pub fn start_with(config: &str, args: &[&str], nofile: Option<u64>) -> Started {
    let path = std::env::temp_dir().join(format!("gpu-agent-http-{}.toml", random_hex(12)));
    std::fs::write(&path, config).unwrap();
    let mut cmd = Command::new(agent_bin());
    cmd.args(["run", "--http-addr", "127.0.0.1:0", "--config"])
        .arg(&path)
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if !one_addr() {
        cmd.args(["--metrics-addr", "127.0.0.1:0"]);
    }
    if let Some(n) = nofile {
        // SAFETY: setrlimit only, between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: n,
                    rlim_max: n,
                };
                match libc::setrlimit(libc::RLIMIT_NOFILE, &lim) {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            });
        }
    }
    let agent = Agent::spawn(cmd, None);
    let metrics = if one_addr() {
        agent.addr.clone()
    } else {
        // The line may be written after /readyz answers: waited for, with a deadline.
        let mut addr = None;
        agent.wait_until(
            "the metrics address in the log",
            Duration::from_secs(10),
            || {
                let log = agent.log();
                let line = log.lines().find(|l| l.contains("metrics server listening"));
                addr = line.and_then(|l| Some(l[l.find("addr=")? + 5..].trim().to_string()));
                addr.is_some()
            },
        );
        addr.expect("waited for")
    };
    Started {
        agent,
        metrics,
        config: path,
    }
}

/// (VmRSS, VmHWM) of `pid`, in bytes.
pub fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (kb("VmRSS:"), kb("VmHWM:"))
}

fn count_processes() -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .count()
}

/// Idle processes in 20 pods' cgroups, enough to bring the host to `total`; killed and
/// reaped on drop.
pub struct Population {
    pids: Vec<i32>,
    _cgroups: Vec<TestCgroup>,
}

impl Population {
    pub fn grow_to(total: usize) -> Population {
        let want = total.saturating_sub(count_processes());
        let cgroups: Vec<TestCgroup> = (0..20)
            .map(|_| TestCgroup::v2(&systemd_container(&random_uid(), &random_hex(64))))
            .collect();
        let procs: Vec<CString> = cgroups
            .iter()
            .map(|c| CString::new(c.dir.join("cgroup.procs").to_str().unwrap()).unwrap())
            .collect();
        let mut pids = Vec::with_capacity(want);
        for i in 0..want {
            let path = procs[i % procs.len()].as_ptr();
            // SAFETY: the child only makes async-signal-safe calls, and never returns.
            match unsafe { libc::fork() } {
                0 => unsafe {
                    let fd = libc::open(path, libc::O_WRONLY);
                    libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                    loop {
                        libc::pause();
                    }
                },
                -1 => panic!("fork: {}", std::io::Error::last_os_error()),
                pid => pids.push(pid),
            }
        }
        Population {
            pids,
            _cgroups: cgroups,
        }
    }
}

impl Drop for Population {
    fn drop(&mut self) {
        for &pid in &self.pids {
            // SAFETY: signalling and reaping this test's own children.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        for &pid in &self.pids {
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        }
    }
}

/// fork+exec of /bin/true in a loop, in a pod's cgroup, until dropped.
pub struct Storm {
    child: Child,
    _cgroup: TestCgroup,
}

impl Storm {
    pub fn start() -> Storm {
        let cg = TestCgroup::v2(&systemd_container(&random_uid(), &random_hex(64)));
        let child = cg.spawn(Command::new("sh").args(["-c", "while :; do /bin/true; done"]));
        Storm { child, _cgroup: cg }
    }
}

impl Drop for Storm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `request`, reads until the server closes: (status, body).
pub fn raw(addr: &str, request: &str) -> (Option<u16>, String) {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return (None, String::new());
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(request.as_bytes());
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok());
    (status, text)
}

/// Sends `request` and waits up to `max` for the server to close the connection: whether
/// it did.
pub fn held_open(addr: &str, request: &str, max: Duration) -> bool {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(max)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
        if started.elapsed() > max {
            return false;
        }
    }
}

/// GET `path`, reading and dropping the body, 16 KiB at most every `pace` (a slow reader
/// leaves the answer in the server's hands): (status, body bytes).
pub fn get_discard(
    addr: &str,
    path: &str,
    timeout: Duration,
    pace: Duration,
) -> std::io::Result<(u16, u64)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(timeout))?;
    // A small receive buffer, so that the kernel does not read ahead for us.
    let size: libc::c_int = 16 << 10;
    // SAFETY: setsockopt on our own socket with a valid int.
    unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&s),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = vec![0u8; 16 << 10];
    let (mut head, mut total) = (Vec::new(), 0u64);
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if head.len() < 64 {
            head.extend_from_slice(&buf[..n.min(64)]);
        }
        total += n as u64;
        std::thread::sleep(pace);
    }
    let text = String::from_utf8_lossy(&head);
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok());
    status
        .map(|s| (s, total))
        .ok_or_else(|| std::io::Error::other(format!("no status in {text:?}")))
}

/// /healthz probes on one address.
#[derive(Debug, Default, Clone)]
pub struct Probes {
    pub probes: u32,
    pub failures: u32,
    pub max: Duration,
    pub latencies: Vec<Duration>,
    pub first_failure: Option<String>,
}

impl Probes {
    fn add(&mut self, r: Result<Duration, String>) {
        self.probes += 1;
        match r {
            Ok(d) => {
                self.max = self.max.max(d);
                self.latencies.push(d);
            }
            Err(e) => {
                self.failures += 1;
                self.first_failure.get_or_insert(e);
            }
        }
    }

    pub fn percentile(&self, p: f64) -> Duration {
        let mut v = self.latencies.clone();
        v.sort();
        v.get(((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    }
}

/// One kubelet-style probe: a new connection, GET /healthz, the whole answer, within 1 s.
fn probe(addr: &str) -> Result<Duration, String> {
    let started = Instant::now();
    let sock = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let mut s = TcpStream::connect_timeout(&sock, Duration::from_secs(1))
        .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)
        .map_err(|e| format!("read after {:?}: {e}", started.elapsed()))?;
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&buf);
    if !text.starts_with("HTTP/1.1 200") {
        return Err(format!("answer: {:?}", text.lines().next()));
    }
    Ok(took)
}

/// Probes /healthz on two addresses every 100 ms until stopped.
pub struct Prober {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<(Probes, Probes)>,
}

impl Prober {
    pub fn start(attacked: String, other: String) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            // The kubelet is a process of its own: the prober must not queue for the CPU
            // behind this process's hundreds of attacking threads.
            // SAFETY: setpriority on this thread only (a thread id).
            unsafe {
                let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                libc::setpriority(libc::PRIO_PROCESS, tid, -10);
            }
            let (mut a, mut o) = (Probes::default(), Probes::default());
            while !flag.load(Ordering::Relaxed) {
                let next = Instant::now() + Duration::from_millis(100);
                a.add(probe(&attacked));
                o.add(probe(&other));
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            (a, o)
        });
        Prober { stop, thread }
    }

    pub fn stop(self) -> (Probes, Probes) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// What an attack did to the agent.
pub struct Report {
    pub name: String,
    pub processes: usize,
    pub rss_before: u64,
    pub peak_rss: u64,
    pub rss_after: u64,
    pub attacked: Probes,
    pub other: Probes,
    pub requests_ok: u64,
    pub requests_refused: u64,
    pub connections_opened: u64,
    /// Mean size of an answer, for the attacks that get answers.
    pub answer_bytes: u64,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        writeln!(
            f,
            "{}: {} processes; RSS before {:.1} MiB, peak (VmHWM) {:.1} MiB, after {:.1} MiB; \
             requests answered {} ({} KiB each), refused {}; attacking connections opened {}",
            self.name,
            self.processes,
            mib(self.rss_before),
            mib(self.peak_rss),
            mib(self.rss_after),
            self.requests_ok,
            self.answer_bytes >> 10,
            self.requests_refused,
            self.connections_opened
        )?;
        for (name, p) in [
            ("attacked address", &self.attacked),
            ("other address", &self.other),
        ] {
            writeln!(
                f,
                "  /healthz on the {name}: {} probes, {} failed, p50 {:?}, p90 {:?}, p99 {:?}, \
                 max {:?}",
                p.probes,
                p.failures,
                p.percentile(0.5),
                p.percentile(0.9),
                p.percentile(0.99),
                p.max
            )?;
        }
        Ok(())
    }
}

/// Runs `attack` (given the attacked address and a deadline) with the prober on, and a
/// fork storm with it when `storm`, then lets the agent settle and reads its memory.
fn measured(
    name: &str,
    s: &Started,
    attacked: &str,
    duration: Duration,
    storm: bool,
    attack: impl FnOnce(Instant) -> (u64, u64, u64, u64),
) -> Report {
    let pid = s.agent.pid();
    let other = if attacked == s.metrics {
        s.agent.addr.clone()
    } else {
        s.metrics.clone()
    };
    // The tombstones and caches of start-up settle first.
    std::thread::sleep(Duration::from_secs(2));
    let (rss_before, _) = memory(pid);
    let processes = count_processes();
    let storm = storm.then(Storm::start);
    let prober = Prober::start(attacked.to_string(), other);
    let (requests_ok, requests_refused, connections_opened, answer_bytes) =
        attack(Instant::now() + duration);
    let (a, o) = prober.stop();
    drop(storm);
    // Tombstones of the storm's processes expire after 5 s; the agent trims its heap every
    // 10 s after a burst of connections.
    std::thread::sleep(Duration::from_secs(11));
    let (rss_after, peak_rss) = memory(pid);
    Report {
        name: name.into(),
        processes,
        rss_before,
        peak_rss,
        rss_after,
        attacked: a,
        other: o,
        requests_ok,
        requests_refused,
        connections_opened,
        answer_bytes,
    }
}

/// `clients` threads asking `GET /debug/processes?all=true` over and over until the
/// deadline, on `http.addr` (the only address with /debug), each reading its answer at about
/// 1.6 MB/s.
pub fn attack_heavy_requests(
    s: &Started,
    clients: usize,
    duration: Duration,
    storm: bool,
) -> Report {
    let addr = s.agent.addr.clone();
    let name = format!(
        "{clients} x GET /debug/processes?all=true{}",
        if storm { " during a fork storm" } else { "" }
    );
    measured(&name, s, &addr.clone(), duration, storm, |deadline| {
        let (ok, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let bytes = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..clients)
            .map(|_| {
                let (addr, ok, refused) = (addr.clone(), ok.clone(), refused.clone());
                let bytes = bytes.clone();
                std::thread::spawn(move || {
                    while Instant::now() < deadline {
                        match get_discard(
                            &addr,
                            "/debug/processes?all=true",
                            Duration::from_secs(30),
                            Duration::from_millis(10),
                        ) {
                            Ok((200, n)) => {
                                bytes.fetch_add(n, Ordering::Relaxed);
                                ok.fetch_add(1, Ordering::Relaxed)
                            }
                            Ok(_) => refused.fetch_add(1, Ordering::Relaxed),
                            Err(_) => refused.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                })
            })
            .collect();
        for t in threads {
            let _ = t.join();
        }
        let ok = ok.load(Ordering::Relaxed);
        let refused = refused.load(Ordering::Relaxed);
        (
            ok,
            refused,
            ok + refused,
            bytes.load(Ordering::Relaxed) / ok.max(1),
        )
    })
}

/// `conns` connections each sending `bytes` of one request header that never ends, on the
/// metrics address; a connection the agent closes is opened again.
pub fn attack_huge_headers(s: &Started, conns: usize, bytes: usize, duration: Duration) -> Report {
    let addr = s.metrics.clone();
    let name = format!("{conns} unfinished {} KB request headers", bytes >> 10);
    measured(&name, s, &addr.clone(), duration, false, |deadline| {
        let threads: Vec<_> = (0..conns)
            .map(|_| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    let pad = vec![b'a'; 16 << 10];
                    let mut opened = 0u64;
                    while Instant::now() < deadline {
                        let Ok(mut s) = TcpStream::connect(&addr) else {
                            std::thread::sleep(Duration::from_millis(50));
                            continue;
                        };
                        opened += 1;
                        let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
                        let mut sent = s
                            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: ")
                            .is_ok();
                        let mut n = 0;
                        while sent && n < bytes && Instant::now() < deadline {
                            sent = s.write_all(&pad[..(bytes - n).min(pad.len())]).is_ok();
                            n += pad.len();
                        }
                        // Held, unfinished, until the agent closes it or time is up.
                        let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
                        let mut b = [0u8; 512];
                        while sent && Instant::now() < deadline {
                            match s.read(&mut b) {
                                Ok(0) => break,
                                Ok(_) => {}
                                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                                Err(_) => break,
                            }
                        }
                        // Closed: opened again a second later, as an attacker that keeps
                        // this many in flight would.
                        std::thread::sleep(Duration::from_secs(1));
                    }
                    opened
                })
            })
            .collect();
        let opened: u64 = threads.into_iter().map(|t| t.join().unwrap_or(0)).sum();
        (0, 0, opened, 0)
    })
}

/// Raises this process's descriptor limit so that it can hold `n` connections.
fn allow_descriptors(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a valid struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        let want = (n + 512).max(lim.rlim_cur);
        let new = libc::rlimit {
            rlim_cur: want,
            rlim_max: want.max(lim.rlim_max),
        };
        assert_eq!(
            libc::setrlimit(libc::RLIMIT_NOFILE, &new),
            0,
            "raising RLIMIT_NOFILE to {want}: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// `conns` slowloris connections on the metrics address: each sends a request line and
/// then one header line a second, never the end; a connection the agent closes is opened
/// again.
pub fn attack_slowloris(s: &Started, conns: usize, duration: Duration) -> Report {
    allow_descriptors(conns as u64);
    let addr = s.metrics.clone();
    let name = format!("{conns} slowloris connections, agent RLIMIT_NOFILE 1024");
    measured(&name, s, &addr.clone(), duration, false, |deadline| {
        let sock: std::net::SocketAddr = addr.parse().unwrap();
        let mut slots: Vec<Option<TcpStream>> = (0..conns).map(|_| None).collect();
        let mut opened = 0u64;
        let mut next_header = Instant::now();
        while Instant::now() < deadline {
            let beat = Instant::now() >= next_header;
            // Closed ones are opened again once a second, as slowloris does.
            for slot in slots.iter_mut().filter(|s| beat && s.is_none()) {
                if Instant::now() >= deadline {
                    break;
                }
                if let Ok(mut c) = TcpStream::connect_timeout(&sock, Duration::from_millis(100)) {
                    if c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n").is_ok() {
                        let _ = c.set_nonblocking(true);
                        *slot = Some(c);
                        opened += 1;
                    }
                }
            }

            for slot in slots.iter_mut() {
                let Some(c) = slot else { continue };
                let mut b = [0u8; 256];
                let closed = matches!(c.read(&mut b), Ok(0))
                    || (beat && c.write_all(b"X-Slow: 1\r\n").is_err());
                if closed {
                    *slot = None;
                }
            }
            if beat {
                next_header = Instant::now() + Duration::from_secs(1);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (0, 0, opened, 0)
    })
}
