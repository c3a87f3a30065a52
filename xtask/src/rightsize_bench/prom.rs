//! The bench's Prometheus (Debian's, as the tests use it) and promtool: a server on a data
//! directory with the rightsizing rules loaded, its HTTP API and its memory.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;
use tests::{
    http,
    prom::{free_port, urlencode},
};

use crate::benchkit::host::{hwm_kib, rss_kib};

/// A running `prometheus` with `rules` loaded; stopped (SIGTERM) on drop.
pub struct Server {
    child: Child,
    pub addr: String,
    log: PathBuf,
}

impl Server {
    /// Starts it on `data` and waits until it is ready (its blocks loaded).
    pub fn start(dir: &Path, data: &Path, rules: &Path) -> Result<Server> {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  evaluation_interval: 5m\nrule_files:\n  - {}\n",
                rules.display()
            ),
        )?;
        let addr = format!("127.0.0.1:{}", free_port());
        let log = dir.join("prometheus.log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", data.display()))
            // The default, said: blocks up to 10 % of it (36 h), so 18 h blocks stay.
            .arg("--storage.tsdb.retention.time=15d")
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting prometheus")?;
        let s = Server { child, addr, log };
        let deadline = Instant::now() + Duration::from_secs(300);
        while !matches!(http::get(&s.addr, "/-/ready"), Ok((200, _))) {
            if Instant::now() > deadline {
                bail!("prometheus not ready after 300 s: {}", s.log_tail());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(s)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// VmRSS and VmHWM, MiB.
    pub fn memory_mib(&self) -> Result<(f64, f64)> {
        let pid = self.pid();
        Ok((rss_kib(pid)? as f64 / 1024.0, hwm_kib(pid)? as f64 / 1024.0))
    }

    /// GET `path`: the API's `data`.
    pub fn api(&self, path: &str) -> Result<Value> {
        let (status, body) = http::get(&self.addr, path).with_context(|| format!("GET {path}"))?;
        let v: Value = serde_json::from_str(&body).with_context(|| {
            format!(
                "GET {path}: HTTP {status}: {}",
                &body[..body.len().min(200)]
            )
        })?;
        if v["status"] != "success" {
            bail!("GET {path}: HTTP {status}: {}", v["error"]);
        }
        Ok(v["data"].clone())
    }

    /// An instant query at `at` (unix seconds): each series' labels and value.
    pub fn query(&self, promql: &str, at: u64) -> Result<Vec<(Value, f64)>> {
        let data = self.api(&format!(
            "/api/v1/query?query={}&time={at}",
            urlencode(promql)
        ))?;
        let result = data["result"].as_array().cloned().unwrap_or_default();
        Ok((result.iter())
            .map(|s| {
                let v = s["value"][1].as_str().and_then(|v| v.parse().ok());
                (s["metric"].clone(), v.unwrap_or(f64::NAN))
            })
            .collect())
    }

    /// A figure of Prometheus's own /metrics (unlabelled).
    pub fn own_metric(&self, name: &str) -> Option<f64> {
        let (_, body) = http::get(&self.addr, "/metrics").ok()?;
        (body.lines())
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    }

    /// The series by metric name over [from, to] (the index only: `/api/v1/series`).
    pub fn series_by_name(&self, from: u64, to: u64) -> Result<Vec<(String, usize)>> {
        let path = format!(
            "/api/v1/series?match[]={}&start={from}&end={to}",
            urlencode("{__name__=~\".+\"}")
        );
        let data = self.api(&path)?;
        let mut by: std::collections::BTreeMap<String, usize> = Default::default();
        for s in data.as_array().map(Vec::as_slice).unwrap_or_default() {
            *by.entry(s["__name__"].as_str().unwrap_or("").into())
                .or_default() += 1;
        }
        Ok(by.into_iter().collect())
    }

    /// Stops it (SIGTERM: it writes its head and closes the blocks) and waits.
    pub fn stop(mut self) -> Result<()> {
        self.terminate();
        Ok(())
    }

    fn terminate(&mut self) {
        // SAFETY: kill on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.terminate();
        }
    }
}

/// `promtool ARGS`, its output kept for the failure's message.
pub fn promtool(args: &[&str]) -> Result<()> {
    let out = Command::new("promtool")
        .args(args)
        .output()
        .context("running promtool")?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(10).collect();
        bail!(
            "promtool {} failed ({}): {}",
            args.join(" "),
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    Ok(())
}

/// The block directories under `data` (ULID-named).
pub fn blocks(data: &Path) -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir(data) else {
        return vec![];
    };
    let mut v: Vec<PathBuf> = dir
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("meta.json").is_file())
        .collect();
    v.sort();
    v
}

/// Bytes under `dir`.
pub fn size(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => size(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}
