//! A real Prometheus (Debian's `prometheus`, which `cargo xtask test` installs as root)
//! scraping test agents every second, and its HTTP API: instant queries, series and label
//! values, as Grafana and prometheus-adapter ask them.
use std::{
    net::TcpListener,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{http, random_hex};

pub const INSTALL: &str = "apt-get install -y --no-install-recommends prometheus";

/// A program on PATH, or a failure that says how to install it.
pub fn which(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} is not installed: this test needs Debian's Prometheus (`{INSTALL}`)")
        })
}

pub fn free_port() -> u16 {
    // Released before the server binds it: a small race, good enough on a test machine.
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One series of a query's result: its labels and value.
#[derive(Debug, Clone)]
pub struct Sample {
    pub labels: serde_json::Map<String, Value>,
    pub value: f64,
}

impl Sample {
    /// A label's value, "" when the series has none (as PromQL treats it).
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).and_then(Value::as_str).unwrap_or("")
    }
}

/// A Prometheus server scraping `targets` (job name -> address) every second; killed, and
/// its data removed, on drop.
pub struct Prometheus {
    child: Child,
    dir: PathBuf,
    pub addr: String,
}

impl Prometheus {
    pub fn start(targets: &[(&str, &str)]) -> Prometheus {
        let jobs: String = targets
            .iter()
            .map(|(job, addr)| {
                format!("  - job_name: {job}\n    static_configs:\n      - targets: ['{addr}']\n")
            })
            .collect();
        Prometheus::start_with(&jobs)
    }

    /// A Prometheus server with these `scrape_configs` entries (YAML), every job at 1 s.
    pub fn start_with(jobs: &str) -> Prometheus {
        Prometheus::start_with_rules(jobs, &[])
    }

    /// As `start_with`, evaluating these rule files (name, YAML).
    pub fn start_with_rules(jobs: &str, rules: &[(&str, &str)]) -> Prometheus {
        let bin = which("prometheus");
        let dir = std::env::temp_dir().join(format!("gpu-agent-prometheus-{}", random_hex(12)));
        std::fs::create_dir_all(&dir).unwrap();
        let mut files = String::new();
        for (name, text) in rules {
            std::fs::write(dir.join(name), text).unwrap();
            files.push_str(&format!("  - {}\n", dir.join(name).display()));
        }
        let files = match files.is_empty() {
            true => String::new(),
            false => format!("rule_files:\n{files}"),
        };
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n{files}scrape_configs:\n{jobs}"),
        )
        .unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting prometheus");
        Prometheus { child, dir, addr }
    }

    /// The active targets: (job, health, lastError).
    pub fn targets(&self) -> Vec<(String, String, String)> {
        let Some(v) = self.get("/api/v1/targets") else {
            return vec![];
        };
        let targets = v["activeTargets"].as_array().cloned().unwrap_or_default();
        targets
            .iter()
            .map(|t| {
                let s = |v: &Value| v.as_str().unwrap_or("").to_string();
                (s(&t["labels"]["job"]), s(&t["health"]), s(&t["lastError"]))
            })
            .collect()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    fn get(&self, path: &str) -> Option<Value> {
        let (status, body) = http::get(&self.addr, path).ok()?;
        if status != 200 {
            return None;
        }
        let v: Value = serde_json::from_str(&body).ok()?;
        (v["status"] == "success").then(|| v["data"].clone())
    }

    /// An instant query's vector (a scalar becomes one unlabelled sample); None while
    /// Prometheus is not answering, or for a query it refuses.
    pub fn query(&self, promql: &str) -> Option<Vec<Sample>> {
        let data = self.get(&format!("/api/v1/query?query={}", urlencode(promql)))?;
        let value = |v: &Value| v[1].as_str().and_then(|s| s.parse::<f64>().ok());
        if data["resultType"] == "scalar" {
            let v = value(&data["result"])?;
            return Some(vec![Sample {
                labels: Default::default(),
                value: v,
            }]);
        }
        let out = data["result"].as_array()?.iter().map(|s| Sample {
            labels: s["metric"].as_object().cloned().unwrap_or_default(),
            value: value(&s["value"]).unwrap_or(f64::NAN),
        });
        Some(out.collect())
    }

    /// The series a selector matches (`/api/v1/series`), as prometheus-adapter lists them.
    pub fn series(&self, selector: &str) -> Vec<serde_json::Map<String, Value>> {
        let data = self.get(&format!("/api/v1/series?match[]={}", urlencode(selector)));
        let list = data
            .as_ref()
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        list.into_iter()
            .filter_map(|v| v.as_object().cloned())
            .collect()
    }

    /// A label's values over the series `selector` matches (Grafana's `label_values`).
    pub fn label_values(&self, label: &str, selector: &str) -> Vec<String> {
        let path = format!(
            "/api/v1/label/{label}/values?match[]={}",
            urlencode(selector)
        );
        let data = self.get(&path);
        let list = data
            .as_ref()
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        list.iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect()
    }

    /// Polls `promql` until `ok` holds for its result; returns it. Panics, with the last
    /// result and Prometheus's log, after 40 s.
    pub fn wait(&self, promql: &str, mut ok: impl FnMut(&[Sample]) -> bool) -> Vec<Sample> {
        let deadline = Instant::now() + Duration::from_secs(40);
        let mut last = None;
        while Instant::now() < deadline {
            last = self.query(promql);
            if let Some(r) = &last {
                if ok(r) {
                    return r.clone();
                }
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let targets = http::get(&self.addr, "/api/v1/targets").map(|r| r.1);
        panic!(
            "Prometheus never answered {promql} as wanted; last result: {last:#?}\ntargets: {targets:?}\nprometheus log:\n{}",
            self.log()
        );
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
