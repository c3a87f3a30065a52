//! rightsize's JSON lines against the generator's answer: the same workloads, the same
//! recommendations, the same coverage and peaks, GPUs within 1e-3.
use std::collections::BTreeMap;

use serde_json::Value;

use super::cluster::Answer;

type Key = (String, String, String, String);

fn key_of(v: &Value) -> Key {
    let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
    (
        s("namespace"),
        s("workload_kind"),
        s("workload"),
        s("device_model"),
    )
}

/// What differs, one line each (empty: the answer was reproduced).
pub fn differences(expected: &[Answer], got: &str) -> Vec<String> {
    let mut out = vec![];
    let mut lines: BTreeMap<Key, Value> = BTreeMap::new();
    for l in got.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<Value>(l) {
            Ok(v) => {
                lines.insert(key_of(&v), v);
            }
            Err(e) => out.push(format!("not JSON ({e}): {l}")),
        }
    }
    for a in expected {
        let key = (
            a.namespace.clone(),
            a.workload_kind.clone(),
            a.workload.clone(),
            a.device_model.clone(),
        );
        match lines.remove(&key) {
            None => out.push(format!("missing: {key:?}")),
            Some(v) => {
                out.extend(compare(a, &v).map(|d| format!("{}/{}: {d}", a.namespace, a.workload)))
            }
        }
    }
    out.extend(lines.keys().map(|k| format!("not expected: {k:?}")));
    out
}

fn compare(a: &Answer, v: &Value) -> Option<String> {
    let r = &v["recommendation"];
    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let near = |x: f64, y: f64, tol: f64| (x - y).abs() <= tol;
    let got_share = r["share"].as_f64();
    let wrong = [
        (r["kind"] != a.kind, "kind"),
        (r["profile"].as_str() != a.profile, "profile"),
        (
            match (got_share, a.share) {
                (Some(x), Some(y)) => !near(x, y, 1e-9),
                (x, y) => x.is_some() != y.is_some(),
            },
            "share",
        ),
        (!near(f(&v["coverage_s"]), a.coverage_s, 1e-3), "coverage_s"),
        (
            v["memory_peak_bytes"].as_u64() != Some(a.memory_peak_bytes),
            "memory_peak_bytes",
        ),
        (
            !near(f(&v["gpus_allocated"]), a.gpus_allocated, 1e-3),
            "gpus_allocated",
        ),
        (!near(f(&v["gpus_saved"]), a.gpus_saved, 1e-3), "gpus_saved"),
    ];
    let fields: Vec<&str> = wrong.iter().filter(|(w, _)| *w).map(|(_, n)| *n).collect();
    (!fields.is_empty()).then(|| {
        format!(
            "{} differ: expected {} {:?} {:?} coverage {} allocated {:.4} peak {} saved {:.4}, got {v}",
            fields.join(", "),
            a.kind,
            a.profile,
            a.share,
            a.coverage_s,
            a.gpus_allocated,
            a.memory_peak_bytes,
            a.gpus_saved
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer() -> Answer {
        Answer {
            namespace: "team-1".into(),
            workload_kind: "Deployment".into(),
            workload: "infer-3".into(),
            device_model: "NVIDIA L4".into(),
            kind: "time-slice",
            profile: None,
            share: Some(0.3333),
            coverage_s: 1_209_600.0,
            gpus_allocated: 4.0,
            memory_peak_bytes: 6 << 30,
            gpus_saved: 8.0 / 3.0,
        }
    }

    const LINE: &str = r#"{"namespace":"team-1","workload_kind":"Deployment","workload":"infer-3","device_model":"NVIDIA L4","gpus_allocated":4.0,"coverage_s":1209600.0,"memory_peak_bytes":6442450944,"sm_p95":15.0,"recommendation":{"kind":"time-slice","profile":null,"share":0.3333,"mps_thread_pct":null,"mps_mem_limit_bytes":null},"gpus_saved":2.6667}"#;

    #[test]
    fn the_same_answer_has_no_differences() {
        assert_eq!(differences(&[answer()], LINE), Vec::<String>::new());
    }

    #[test]
    fn a_different_answer_says_what_differs() {
        let other = LINE.replace("\"share\":0.3333", "\"share\":0.25");
        let d = differences(&[answer()], &other);
        assert_eq!(d.len(), 1);
        assert!(d[0].contains("share differ"), "{d:?}");
        let d = differences(&[], LINE);
        assert!(d[0].starts_with("not expected"), "{d:?}");
        let d = differences(&[answer()], "");
        assert!(d[0].starts_with("missing"), "{d:?}");
    }
}
