//! `gpu-agent rightsize --prometheus URL`: each workload's `Usage` from the recording rules'
//! series (deploy/prometheus/gpu-agent-rightsizing.yaml), read over the Prometheus HTTP API
//! (Prometheus, Thanos Query, Mimir), for the same `recommend` as the usage records.
//!
//! The rules sample each workload every evaluation interval: a point of a count is that
//! many containers for one interval. So the records' sums have their like here: coverage is
//! the count's points summed times the interval, GPU-seconds the held share's, and the
//! lifespan runs from the first point to the last plus one interval.
use std::{collections::BTreeMap, time::Duration};

use serde_json::Value;

use super::{
    profiles::Profiles,
    usage::{max_opt, Usage, Window, WorkloadKey},
};
use crate::sinks::usage::read::{LeftOut, Reason};

/// The rules' group, whose interval the sums are counted in.
pub const GROUP: &str = "gpu-agent-rightsizing";

/// Where to read, and how.
#[derive(Debug, Clone)]
pub struct Source {
    /// The API's base: `http://prometheus:9090`, Thanos Query's, or Mimir's
    /// `http://mimir/prometheus`.
    pub url: String,
    /// Sent with every request (`X-Scope-OrgID: tenant` for Mimir, `Authorization`).
    pub headers: Vec<(String, String)>,
    /// The group's evaluation interval; None: read from /api/v1/rules.
    pub interval: Option<Duration>,
    /// Each request's (`--prometheus-timeout`); connecting takes at most `CONNECT_TIMEOUT`
    /// of it.
    pub timeout: Duration,
}

/// How long connecting may take: a wrong address fails in seconds, whatever the timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// `--prometheus-header`: `Name: value`.
pub fn parse_header(s: &str) -> Result<(String, String), String> {
    match s.split_once(':') {
        Some((k, v)) if !k.trim().is_empty() && !k.contains(char::is_whitespace) => {
            Ok((k.trim().to_string(), v.trim().to_string()))
        }
        _ => Err(format!("{s:?}: give `Name: value`")),
    }
}

/// What each query reads, per workload, model and MIG profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Q {
    Count,
    Held,
    First,
    Last,
    Peak,
    Sm,
    SmUnknown,
}

impl Q {
    const ALL: [Q; 7] = [
        Q::Count,
        Q::Held,
        Q::First,
        Q::Last,
        Q::Peak,
        Q::Sm,
        Q::SmUnknown,
    ];

    /// What is wrong with a value of this query, as `read::check` says it of a record:
    /// None when it is in its range (`to_s`: the window's end, unix seconds).
    fn check(self, v: f64, to_s: f64) -> Option<&'static str> {
        let range = match self {
            Q::Count | Q::Held | Q::Peak => 0.0..=f64::MAX,
            Q::First | Q::Last => 0.0..=to_s + 86_400.0,
            // Parts of a GPU.
            Q::Sm | Q::SmUnknown => 0.0..=1.0 + 1e-9,
        };
        (!(v.is_finite() && range.contains(&v))).then_some(match self {
            Q::Count => "count",
            Q::Held => "held share",
            Q::First | Q::Last => "seen_at",
            Q::Peak => "memory peak",
            Q::Sm => "SM share p95 (a part of a GPU, 0 to 1)",
            Q::SmUnknown => "unknown SM share (0 to 1)",
        })
    }

    /// Its PromQL over a window of `w` seconds.
    fn promql(self, w: u64) -> String {
        let count = "workload_model:container_gpu_share:count";
        match self {
            Q::Count => format!("sum_over_time({count}[{w}s])"),
            Q::Held => format!("sum_over_time(workload_model:container_gpu_share:sum[{w}s])"),
            Q::First => format!("min_over_time(workload_model:container_gpu_share:seen_at[{w}s])"),
            Q::Last => format!("max_over_time(workload_model:container_gpu_share:seen_at[{w}s])"),
            Q::Peak => {
                format!("max_over_time(workload_model:container_gpu_memory_peak_bytes:max5m[{w}s])")
            }
            Q::Sm => format!(
                "quantile_over_time(0.95, workload_model:container_gpu_sm_share:p95_5m[{w}s])"
            ),
            Q::SmUnknown => {
                format!("max_over_time(workload_model:container_gpu_sm_unknown_share:max[{w}s])")
            }
        }
    }
}

/// One workload's figures on one model, its MIG profiles together.
#[derive(Default)]
struct Sums {
    count: f64,
    held: f64,
    first: Option<f64>,
    last: Option<f64>,
    peak: f64,
    sm: Option<f64>,
    sm_unknown: Option<f64>,
    mig: Option<(f64, String)>,
}

impl Sums {
    fn add(&mut self, q: Q, v: f64) {
        match q {
            Q::Count => self.count += v,
            Q::Held => self.held += v,
            Q::First => self.first = Some(self.first.map_or(v, |f| f.min(v))),
            Q::Last => self.last = max_opt(self.last, v),
            Q::Peak => self.peak = self.peak.max(v),
            Q::Sm => self.sm = max_opt(self.sm, v),
            Q::SmUnknown => self.sm_unknown = max_opt(self.sm_unknown, v),
        }
    }

    fn finish(self, key: WorkloadKey, step: f64, memory: Option<u64>) -> Usage {
        let coverage = self.count * step;
        let lifespan = match (self.first, self.last) {
            (Some(f), Some(l)) => (l - f + step).max(step),
            _ => coverage.max(step),
        };
        Usage {
            key,
            coverage_s: coverage,
            lifespan_s: lifespan,
            gpus_allocated: self.held * step / lifespan,
            instances: coverage / lifespan,
            memory_peak_bytes: self.peak as u64,
            sm_p95: self.sm,
            sm_unknown_share: self.sm_unknown,
            used: self.peak > 0.0 || self.sm.is_some_and(|s| s > 0.0),
            device_memory_bytes: memory,
            mig_profile: self.mig.map(|(_, p)| p),
            containers: vec![],
        }
    }
}

/// The rules' answers by query: (labels, value) per series.
type Answers = Vec<(Q, Vec<(BTreeMap<String, String>, f64)>)>;

/// Each workload's `Usage`, what was left out (one line per reason), and notes for the
/// footer.
pub type Read = (Vec<Usage>, Vec<String>, Vec<String>);

/// Each workload's `Usage` over `window`, what was left out (one line per reason), and
/// notes for the footer (where it read, the interval; series without a workload).
pub fn usages(src: &Source, window: Window, profiles: &Profiles) -> Result<Read, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the HTTP client: {e}"))?;
    rt.block_on(read(src, window, profiles))
}

async fn read(src: &Source, window: Window, profiles: &Profiles) -> Result<Read, String> {
    let client = Client::new(src)?;
    let (step, whence) = match src.interval {
        Some(i) => (i.as_secs().max(1), "--rule-interval"),
        None => (client.group_interval().await?, "/api/v1/rules"),
    };
    let w = (window.to_ms - window.from_ms) / 1000;
    // One interval back: an evaluation under way has written some of its rules' points and
    // not others (a count without its seen_at).
    let at = window.to_ms as f64 / 1000.0 - step as f64;
    let mut tasks = vec![];
    for q in Q::ALL {
        let (c, promql) = (client.clone(), q.promql(w));
        tasks.push((q, tokio::spawn(async move { c.query(&promql, at).await })));
    }
    let memory = client.clone();
    let memory = tokio::spawn(async move {
        let q = format!("max_over_time(model:hw_gpu_memory_limit_bytes:max[{w}s])");
        memory.query(&q, at).await
    });
    let names = client.clone();
    let names = tokio::spawn(async move { names.query(&containers_promql(w), at).await });
    let mut answers: Answers = vec![];
    for (q, t) in tasks {
        answers.push((q, t.await.map_err(|e| e.to_string())??));
    }
    let memory = memory.await.map_err(|e| e.to_string())??;
    let to_s = window.to_ms as f64 / 1000.0;
    let (mut usages, unnamed, left) = assemble(&answers, &memory, step as f64, profiles, to_s);
    // Names for the patches only: a Prometheus that no longer has the raw series still
    // gives the plan.
    let names = names.await.map_err(|e| e.to_string())?.unwrap_or_default();
    name_containers(&mut usages, &names);
    let mut notes = vec![format!(
        "read from {} (rules every {} s, from {whence})",
        src.url, step
    )];
    if unnamed > 0 {
        notes.push(format!(
            "{unnamed} series without a workload left out (containers the runtime gave no pod labels)"
        ));
    }
    if usages.is_empty() {
        notes.push(format!(
            "no workload series in the window: are the rules of group {GROUP} loaded, and gpu-agent scraped?"
        ));
    }
    Ok((usages, left.lines(), notes))
}

/// The containers of each workload and model seen in the raw per-container series over
/// the window's last day at most (their retention may be short, and a longer look costs a
/// scan of every container's samples).
fn containers_promql(w: u64) -> String {
    let w = w.min(86_400);
    format!(
        "group by (namespace, workload_kind, workload, model, container) \
         (last_over_time(container_gpu_share[{w}s]))"
    )
}

/// Each usage's container names, from `containers_promql`'s answer.
fn name_containers(usages: &mut [Usage], series: &[(BTreeMap<String, String>, f64)]) {
    let label = |m: &BTreeMap<String, String>, k: &str| m.get(k).cloned().unwrap_or_default();
    let mut by_key: BTreeMap<WorkloadKey, std::collections::BTreeSet<String>> = BTreeMap::new();
    for (m, _) in series {
        let key = WorkloadKey {
            namespace: label(m, "namespace"),
            workload_kind: label(m, "workload_kind"),
            workload: label(m, "workload"),
            device_model: label(m, "model"),
        };
        let c = label(m, "container");
        if !c.is_empty() {
            by_key.entry(key).or_default().insert(c);
        }
    }
    for u in usages {
        if let Some(names) = by_key.remove(&u.key) {
            u.containers = names.into_iter().collect();
        }
    }
}

/// The answers summed per workload and model; how many series had no workload; and the
/// values out of their range, left out (`to_s`: the window's end, unix seconds).
fn assemble(
    answers: &Answers,
    memory: &[(BTreeMap<String, String>, f64)],
    step: f64,
    profiles: &Profiles,
    to_s: f64,
) -> (Vec<Usage>, usize, LeftOut) {
    let label = |m: &BTreeMap<String, String>, k: &str| m.get(k).cloned().unwrap_or_default();
    let mut sums: BTreeMap<WorkloadKey, Sums> = BTreeMap::new();
    let (mut unnamed, mut left) = (0, LeftOut::default());
    for (q, series) in answers {
        for (m, v) in series {
            if let Some(what) = q.check(*v, to_s) {
                left.add(Reason::OutOfRange, || {
                    let (ns, w) = (label(m, "namespace"), label(m, "workload"));
                    format!("{what} {v} of {ns}/{w} ({})", label(m, "model"))
                });
                continue;
            }
            let key = WorkloadKey {
                namespace: label(m, "namespace"),
                workload_kind: label(m, "workload_kind"),
                workload: label(m, "workload"),
                device_model: label(m, "model"),
            };
            if key.workload.is_empty() || key.workload_kind.is_empty() {
                unnamed += usize::from(*q == Q::Count);
                continue;
            }
            // Only workloads the count saw: the others' figures have no time to go with.
            if *q != Q::Count && !sums.contains_key(&key) {
                continue;
            }
            let s = sums.entry(key).or_default();
            s.add(*q, *v);
            if let Some(p) = m.get("mig_profile").filter(|p| !p.is_empty()) {
                let model = m.get("model").map_or("", String::as_str);
                let part = profiles.mig_fraction(model, None, p);
                if s.mig.as_ref().is_none_or(|(f, _)| part > *f) {
                    s.mig = Some((part, p.clone()));
                }
            }
        }
    }
    let memory_of = |model: &str| {
        (memory.iter())
            .find(|(m, _)| m.get("model").is_some_and(|x| x == model))
            .map(|(_, v)| *v as u64)
    };
    let usages = sums
        .into_iter()
        .map(|(k, s)| {
            let memory = memory_of(&k.device_model);
            s.finish(k, step, memory)
        })
        .collect();
    (usages, unnamed, left)
}

/// The HTTP API, with the source's headers on every request.
#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    base: String,
    timeout: Duration,
}

impl Client {
    fn new(src: &Source) -> Result<Client, String> {
        let mut headers = reqwest::header::HeaderMap::new();
        for (k, v) in &src.headers {
            let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| format!("--prometheus-header {k}: {e}"))?;
            let value = reqwest::header::HeaderValue::from_str(v)
                .map_err(|e| format!("--prometheus-header {k}: {e}"))?;
            headers.insert(name, value);
        }
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .timeout(src.timeout)
            .connect_timeout(CONNECT_TIMEOUT.min(src.timeout))
            .user_agent(concat!(
                "gpu-agent/",
                env!("CARGO_PKG_VERSION"),
                " rightsize"
            ))
            .build()
            .map_err(|e| format!("the HTTP client: {e}"))?;
        Ok(Client {
            http,
            base: src.url.trim_end_matches('/').to_string(),
            timeout: src.timeout,
        })
    }

    /// GET `path` with `params`: the answer's `data`, or what the API said was wrong.
    async fn get(&self, path: &str, params: &[(&str, String)]) -> Result<Value, String> {
        let url = format!("{}{path}", self.base);
        let failed = |e: reqwest::Error| match (e.is_timeout(), e.is_connect()) {
            (true, true) => format!(
                "{url}: could not connect within {} s",
                CONNECT_TIMEOUT.min(self.timeout).as_secs_f64()
            ),
            (true, false) => format!(
                "{url}: no answer within {} s (--prometheus-timeout)",
                self.timeout.as_secs_f64()
            ),
            _ => format!("{url}: {:#}", anyhow::Error::new(e)),
        };
        let resp = (self.http.get(&url).query(params).send().await).map_err(failed)?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(failed)?;
        let v: Value = serde_json::from_slice(&body).map_err(|_| {
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            format!("{url}: HTTP {status}, not the Prometheus API: {text}")
        })?;
        if v["status"] != "success" {
            let (kind, e) = (&v["errorType"], &v["error"]);
            return Err(format!("{url}: HTTP {status}: {kind}: {e}"));
        }
        Ok(v["data"].clone())
    }

    /// An instant query at `at` (unix seconds): each series' labels and value.
    async fn query(
        &self,
        promql: &str,
        at: f64,
    ) -> Result<Vec<(BTreeMap<String, String>, f64)>, String> {
        let params = [("query", promql.to_string()), ("time", format!("{at:.3}"))];
        let data = self.get("/api/v1/query", &params).await?;
        let result = data["result"].as_array().cloned().unwrap_or_default();
        Ok(result.iter().filter_map(sample).collect())
    }

    /// The rules' group's evaluation interval, seconds.
    async fn group_interval(&self) -> Result<u64, String> {
        let data = (self
            .get("/api/v1/rules", &[("type", "record".into())])
            .await)
            .map_err(
                |e| match e.contains("HTTP 404") || e.contains("not the Prometheus API") {
                    true => format!("{e} (give --rule-interval where the rules API is not served)"),
                    false => e,
                },
            )?;
        let groups = data["groups"].as_array().cloned().unwrap_or_default();
        let group = groups.iter().find(|g| g["name"] == GROUP).ok_or_else(|| {
            format!(
                "{}: no rule group {GROUP}: load deploy/prometheus/gpu-agent-rightsizing.yaml (or give --rule-interval)",
                self.base
            )
        })?;
        match group["interval"].as_f64() {
            Some(i) if i >= 1.0 => Ok(i.round() as u64),
            _ => Err(format!("{}: group {GROUP} has no interval", self.base)),
        }
    }
}

/// A vector sample: its labels and value.
fn sample(v: &Value) -> Option<(BTreeMap<String, String>, f64)> {
    let labels = (v["metric"].as_object()?.iter())
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect();
    let value = v["value"].get(1)?.as_str()?.parse().ok()?;
    Some((labels, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const H100: &str = "NVIDIA H100 80GB HBM3";

    /// A Deployment on two MIG profiles for an hour of 12 evaluations 5 minutes apart
    /// (two containers throughout), and a series without a workload.
    #[test]
    fn the_rules_answers_make_the_records_usage() {
        let chat = |mig: &str| {
            labels(&[
                ("namespace", "ml"),
                ("workload_kind", "Deployment"),
                ("workload", "chat"),
                ("model", H100),
                ("mig_profile", mig),
            ])
        };
        let (one, three) = (chat("1g.10gb"), chat("3g.40gb"));
        let answers: Answers = vec![
            (
                Q::Count,
                vec![
                    (one.clone(), 12.0),
                    (three.clone(), 12.0),
                    (labels(&[("model", H100)]), 3.0),
                ],
            ),
            (
                Q::Held,
                vec![(one.clone(), 12.0 / 7.0), (three.clone(), 36.0 / 7.0)],
            ),
            (
                Q::First,
                vec![(one.clone(), 1000.0), (three.clone(), 1300.0)],
            ),
            (
                Q::Last,
                vec![(one.clone(), 4300.0), (three.clone(), 4300.0)],
            ),
            (Q::Peak, vec![(one.clone(), 8e9), (three.clone(), 3e10)]),
            (Q::SmUnknown, vec![(three.clone(), 3.0 / 7.0)]),
        ];
        let memory = vec![(labels(&[("model", H100)]), 85e9)];
        let (u, unnamed, left) = assemble(&answers, &memory, 300.0, &Profiles::table(), 5000.0);
        assert_eq!(left.total(), 0);
        assert_eq!((u.len(), unnamed), (1, 1));
        let u = &u[0];
        assert_eq!(u.key.workload, "chat");
        assert_eq!(u.coverage_s, 24.0 * 300.0);
        assert_eq!(
            u.lifespan_s, 3600.0,
            "first point to the last, and one interval"
        );
        assert!((u.instances - 2.0).abs() < 1e-9, "{}", u.instances);
        assert!((u.gpus_allocated - 4.0 / 7.0).abs() < 1e-9);
        assert_eq!(u.memory_peak_bytes, 30_000_000_000);
        assert_eq!((u.sm_p95, u.sm_unknown_share), (None, Some(3.0 / 7.0)));
        assert!(u.used);
        assert_eq!(u.device_memory_bytes, Some(85_000_000_000));
        assert_eq!(u.mig_profile.as_deref(), Some("3g.40gb"), "the larger");
    }

    #[test]
    fn an_idle_workload_is_unused_and_figures_without_a_count_are_dropped() {
        let job = labels(&[
            ("namespace", "r"),
            ("workload_kind", "Job"),
            ("workload", "sweep"),
            ("model", H100),
        ]);
        let ghost = labels(&[
            ("namespace", "r"),
            ("workload_kind", "Job"),
            ("workload", "x"),
        ]);
        let answers: Answers = vec![
            (Q::Count, vec![(job.clone(), 4.0)]),
            (Q::Held, vec![(job.clone(), 4.0)]),
            (Q::Peak, vec![(job.clone(), 0.0), (ghost, 5.0)]),
            (Q::Sm, vec![(job, 0.0)]),
        ];
        let (u, _, _) = assemble(&answers, &[], 60.0, &Profiles::table(), 5000.0);
        assert_eq!(u.len(), 1);
        assert!(!u[0].used);
        assert_eq!((u[0].coverage_s, u[0].gpus_allocated), (240.0, 1.0));
    }

    #[test]
    fn values_out_of_their_range_are_left_out_and_counted() {
        let job = labels(&[
            ("namespace", "r"),
            ("workload_kind", "Job"),
            ("workload", "sweep"),
            ("model", H100),
        ]);
        let answers: Answers = vec![
            (Q::Count, vec![(job.clone(), 4.0)]),
            (Q::Held, vec![(job.clone(), -1.0)]),
            (Q::Peak, vec![(job.clone(), f64::NAN)]),
            (Q::Sm, vec![(job, 1.5)]),
        ];
        let (u, _, left) = assemble(&answers, &[], 60.0, &Profiles::table(), 5000.0);
        assert_eq!(left.out_of_range.count, 3);
        assert_eq!(
            left.out_of_range.examples[2],
            "SM share p95 (a part of a GPU, 0 to 1) 1.5 of r/sweep (NVIDIA H100 80GB HBM3)"
        );
        assert_eq!((u[0].gpus_allocated, u[0].sm_p95), (0.0, None));
    }

    #[test]
    fn headers_are_name_colon_value() {
        assert_eq!(
            parse_header("X-Scope-OrgID: team-a").unwrap(),
            ("X-Scope-OrgID".into(), "team-a".into())
        );
        assert_eq!(
            parse_header("Authorization: Bearer a:b").unwrap().1,
            "Bearer a:b"
        );
        for bad in ["no-colon", ": v", "two words: v"] {
            assert!(parse_header(bad).is_err(), "{bad}");
        }
    }
}
