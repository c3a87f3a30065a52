//! The run's report: each check's pass or fail, grouped by runtime, printed as it happens,
//! and the closing summary with the `RESULT` line.
use std::{collections::BTreeMap, time::Duration};

use anyhow::Result;

use super::proc;

/// Pass/fail of each check, grouped by runtime, printed as it happens.
#[derive(Default)]
pub struct Tally {
    cases: Vec<(String, String, Result<(), String>)>,
}

impl Tally {
    pub fn case(&mut self, group: &str, name: &str, r: Result<(), String>) {
        match &r {
            Ok(()) => eprintln!("e2e: {} ok    {group}: {name}", proc::stamp()),
            Err(e) => eprintln!("e2e: {} FAIL  {group}: {name}: {e}", proc::stamp()),
        }
        self.cases.push((group.into(), name.into(), r));
    }

    /// Runs a setup step; a failure is a failed case of its group.
    pub fn step<T>(&mut self, group: &str, name: &str, f: impl FnOnce() -> Result<T>) -> Option<T> {
        match proc::check_interrupt().and_then(|_| f()) {
            Ok(v) => {
                self.case(group, name, Ok(()));
                Some(v)
            }
            Err(e) => {
                self.case(group, name, Err(format!("{e:#}")));
                None
            }
        }
    }

    pub fn failed(&self) -> usize {
        self.cases.iter().filter(|c| c.2.is_err()).count()
    }

    /// `elapsed`: the whole run; `session`: from dockerd's start to the end of cleanup.
    pub fn report(&self, elapsed: Duration, session: Duration) {
        let mut groups: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for (g, _, r) in &self.cases {
            let e = groups.entry(g).or_default();
            if r.is_ok() {
                e.0 += 1
            } else {
                e.1 += 1
            }
        }
        for (g, (p, f)) in &groups {
            let verdict = if *f == 0 { "passed" } else { "FAILED" };
            eprintln!("e2e: {g:<12} {verdict} ({p} ok, {f} failed)");
        }
        eprintln!(
            "e2e: took {:.0} s, {:.0} s of them after the builds",
            elapsed.as_secs_f64(),
            session.as_secs_f64()
        );
        println!(
            "RESULT e2e-container passed={} failed={}",
            self.cases.len() - self.failed(),
            self.failed()
        );
    }
}
