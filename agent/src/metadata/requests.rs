//! What the pipeline asks of the metadata task: names for the containers the join could not
//! name, each at most once a minute, and to forget the containers that are gone.
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use gpu_model::Name;

/// What the pipeline tells the metadata source.
#[derive(Debug)]
pub enum NameRequest {
    /// Containers the join could not name.
    Unknown(Vec<String>),
    /// Containers whose cgroups are gone.
    Gone(Vec<String>),
}

/// The sending side: asks the source about container ids the join could not name, each at
/// most once a minute, so a container no runtime knows is not asked about every cycle.
pub struct NameRequests {
    tx: tokio::sync::mpsc::Sender<NameRequest>,
    /// By the snapshot's shared ids, hashed with Fx and compared by pointer first: on a
    /// node no runtime names, every container is looked up here every cycle (with SipHash
    /// over 64-character ids; comparing the ids' text,
    /// each a cache miss a cycle later, cost more).
    asked: hashbrown::HashMap<Name, Instant, rustc_hash::FxBuildHasher>,
    /// When the ids asked about more than a minute ago were last let go: a walk of all of
    /// them every cycle cost that node's agent measurably, and an id is asked again once its
    /// minute is up whether or not it was let go.
    swept: Option<Instant>,
    /// The last cycle's unnamed ids in the snapshot's order, with when each was asked
    /// about: an id found at its place, the very same name, skips `asked`, whose buckets,
    /// 2,000 random reads a cycle, were a visible part of the large node's agent. Each holds its
    /// name, so no other name takes its address while it is here.
    last: Vec<(Name, Instant)>,
}

/// A shared name to look up: the very same name, or one with the same text.
#[derive(Hash)]
struct SameName<'a>(&'a Name);

impl hashbrown::Equivalent<Name> for SameName<'_> {
    fn equivalent(&self, key: &Name) -> bool {
        gpu_model::same(self.0, key)
    }
}

/// How long an id asked about is not asked about again.
const ASK_AGAIN_AFTER: Duration = Duration::from_secs(60);

impl NameRequests {
    pub fn new(tx: tokio::sync::mpsc::Sender<NameRequest>) -> NameRequests {
        NameRequests {
            tx,
            asked: Default::default(),
            swept: None,
            last: vec![],
        }
    }

    pub fn ask(&mut self, snap: &gpu_model::Snapshot) {
        self.ask_at(snap, Instant::now())
    }

    fn ask_at(&mut self, snap: &gpu_model::Snapshot, now: Instant) {
        let recent = |t: &Instant| now.duration_since(*t) < ASK_AGAIN_AFTER;
        if !self.swept.as_ref().is_some_and(recent) {
            self.asked.retain(|_, t| recent(t));
            self.swept = Some(now);
        }
        let mut unknown = vec![];
        let ids = snap
            .containers
            .iter()
            .filter(|c| c.pod_name.is_none() && c.container_name.is_none())
            .filter_map(|c| c.container_id.as_ref());
        let mut at = 0;
        for id in ids {
            let kept = self.last.get(at).filter(|(n, _)| Arc::ptr_eq(n, id));
            if kept.is_some_and(|(_, t)| recent(t)) {
                at += 1;
                continue;
            }
            // Asked about within the minute, maybe under another copy of the name.
            let t = match self.asked.get(&SameName(id)).filter(|t| recent(t)) {
                Some(&t) => t,
                None => {
                    self.asked.insert(id.clone(), now);
                    unknown.push(id.to_string());
                    now
                }
            };
            match self.last.get_mut(at) {
                Some(slot) => *slot = (id.clone(), t),
                None => self.last.push((id.clone(), t)),
            }
            at += 1;
        }
        self.last.truncate(at);
        if unknown.is_empty() {
            return;
        }
        let _ = self.tx.try_send(NameRequest::Unknown(unknown));
    }

    /// How many ids were asked about lately (`asked`).
    pub fn kept(&self) -> usize {
        self.asked.len()
    }

    /// Containers gone: their names can be forgotten.
    pub fn gone(&mut self, ids: Vec<String>) {
        for id in &ids {
            self.asked.remove(id.as_str());
        }
        // One that comes back is asked about again: the next cycle looks each id up.
        self.last.clear();
        let _ = self.tx.try_send(NameRequest::Gone(ids));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot of unnamed containers with these ids (the very names given).
    fn unnamed(ids: &[&Name]) -> gpu_model::Snapshot {
        gpu_model::Snapshot {
            containers: (ids.iter())
                .map(|id| gpu_model::ContainerUsage {
                    container_id: Some((*id).clone()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    /// What the requests sent since the last call say: the ids asked about, or each id
    /// forgotten as "gone ID".
    fn sent(rx: &mut tokio::sync::mpsc::Receiver<NameRequest>) -> Vec<String> {
        match rx.try_recv() {
            Ok(NameRequest::Unknown(ids)) => ids,
            Ok(NameRequest::Gone(ids)) => ids.iter().map(|i| format!("gone {i}")).collect(),
            Err(_) => vec![],
        }
    }

    #[test]
    fn an_unnamed_container_is_asked_about_once_a_minute() {
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let mut r = NameRequests::new(tx);
        // Each snapshot its own copies of the ids.
        let fresh = |ids: &[&str]| {
            let names: Vec<Name> = ids.iter().map(|&id| id.into()).collect();
            unnamed(&names.iter().collect::<Vec<_>>())
        };
        let t0 = Instant::now();
        let s = |secs| t0 + Duration::from_secs(secs);
        r.ask_at(&fresh(&["a", "b"]), t0);
        assert_eq!(sent(&mut rx), ["a", "b"]);
        r.ask_at(&fresh(&["a", "b", "c"]), s(30));
        assert_eq!(sent(&mut rx), ["c"]);
        r.ask_at(&fresh(&["a", "b", "c"]), s(59));
        assert!(sent(&mut rx).is_empty());
        // a and b's minute is up, not c's.
        r.ask_at(&fresh(&["a", "b", "c"]), s(61));
        assert_eq!(sent(&mut rx), ["a", "b"]);
        r.ask_at(&fresh(&["a", "b", "c"]), s(91));
        assert_eq!(sent(&mut rx), ["c"]);
        // A named container is not asked about.
        let mut named = fresh(&["d"]);
        named.containers[0].pod_name = Some("p".into());
        r.ask_at(&named, s(92));
        assert!(sent(&mut rx).is_empty());
    }

    #[test]
    fn the_same_names_cycle_after_cycle_are_asked_about_as_any_are() {
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let mut r = NameRequests::new(tx);
        // The join hands out the same names each cycle.
        let [a, b, c, d]: [Name; 4] = ["a", "b", "c", "d"].map(Into::into);
        let t0 = Instant::now();
        let s = |secs| t0 + Duration::from_secs(secs);
        r.ask_at(&unnamed(&[&a, &b, &c]), t0);
        assert_eq!(sent(&mut rx), ["a", "b", "c"]);
        r.ask_at(&unnamed(&[&a, &b, &c]), s(1));
        assert!(sent(&mut rx).is_empty());
        // One come between the others, one gone.
        r.ask_at(&unnamed(&[&a, &d, &c]), s(30));
        assert_eq!(sent(&mut rx), ["d"]);
        r.ask_at(&unnamed(&[&a, &d, &c]), s(31));
        assert!(sent(&mut rx).is_empty());
        // a's and c's minute is up, not d's.
        r.ask_at(&unnamed(&[&a, &d, &c]), s(61));
        assert_eq!(sent(&mut rx), ["a", "c"]);
        r.ask_at(&unnamed(&[&a, &d, &c]), s(62));
        assert!(sent(&mut rx).is_empty());
        // Gone, then back under the same name: asked about at once.
        r.gone(vec!["c".into()]);
        assert_eq!(sent(&mut rx), ["gone c"]);
        r.ask_at(&unnamed(&[&a, &d, &c]), s(63));
        assert_eq!(sent(&mut rx), ["c"]);
    }
}
