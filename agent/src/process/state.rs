//! What the tracker owns and the readers see: the process cache, the cgroup registry and
//! the hierarchies, plus the attribution of a process to a container.
use std::sync::Arc;

use gpu_model::Name;
use serde::Serialize;

use super::{
    cache::{ProcessCache, ProcessEntry},
    cgroup::{CgroupNode, CgroupRegistry, ContainerRef, Hierarchies, Hierarchy},
};

/// Where a host PID belongs: what the GPU join charges its use to.
#[derive(Debug, Clone, Copy)]
pub struct Placement<'a> {
    pub comm: &'a str,
    /// false for a tombstone (the process exited, its last samples still join).
    pub live: bool,
    /// The container or pod its cgroup names; None for a host process.
    pub container: Option<&'a ContainerRef>,
    pub cgroup_path: Option<&'a Name>,
}

/// pid -> process and container. `State` is the real one; a test of the join can use any
/// map of its own.
pub trait Resolver {
    fn place(&self, pid: u32) -> Option<Placement<'_>>;

    /// `place` of each pid, in order, appended to `out`.
    fn place_all<'a>(
        &'a self,
        pids: impl Iterator<Item = u32>,
        out: &mut Vec<Option<Placement<'a>>>,
    ) {
        out.extend(pids.map(|pid| self.place(pid)));
    }
}

impl Resolver for State {
    fn place(&self, pid: u32) -> Option<Placement<'_>> {
        self.cache.get(pid).map(|e| self.placement(e))
    }

    /// Every process looked up first, then every cgroup. Each lookup is a chain of cache
    /// misses (a table's control bytes, then its slot) in memory gone cold since the cycle
    /// before: in a loop of one kind of lookup the CPU overlaps the chains of several pids,
    /// where a loop of both waited for each cgroup's lookup behind its process's (the
    /// cgroup slot's miss was a visible part of the large node's agent).
    fn place_all<'a>(
        &'a self,
        pids: impl Iterator<Item = u32>,
        out: &mut Vec<Option<Placement<'a>>>,
    ) {
        let entries: Vec<Option<&ProcessEntry>> = pids.map(|pid| self.cache.get(pid)).collect();
        out.extend(entries.into_iter().map(|e| e.map(|e| self.placement(e))));
    }
}

#[derive(Debug)]
pub struct State {
    pub cache: ProcessCache,
    pub registry: CgroupRegistry,
    pub hierarchies: Hierarchies,
}

/// Where a process belongs.
#[derive(Debug, Clone)]
pub struct Attribution<'a> {
    pub cgroup_id: Option<u64>,
    pub cgroup_version: u8,
    pub node: Option<&'a CgroupNode>,
}

impl Attribution<'_> {
    pub fn container(&self) -> Option<&Arc<ContainerRef>> {
        self.node.and_then(|n| n.container.as_ref())
    }
}

impl State {
    /// A state that follows one cgroup2 hierarchy mounted at `/sys/fs/cgroup` and no v1
    /// one: the unified layout, for tests and benches of what reads the state.
    pub fn on_cgroup2(cache: ProcessCache, registry: CgroupRegistry) -> State {
        State {
            cache,
            registry,
            hierarchies: Hierarchies {
                v2: Some(Hierarchy {
                    id: 0,
                    name: "cgroup2".into(),
                    mount_point: "/sys/fs/cgroup".into(),
                    mount_root: "/".into(),
                }),
                v1: None,
            },
        }
    }

    /// The cgroup2 cgroup when it names a container or pod; else the followed v1 cgroup
    /// when that does (hybrid hosts); else the cgroup2 cgroup (a host process).
    pub fn attribute(&self, e: &ProcessEntry) -> Attribution<'_> {
        let v2 = self.hierarchies.v2.as_ref().map(|h| h.id).unwrap_or(0);
        let v2_node = e.cgroup_v2().and_then(|id| self.registry.get(v2, id));
        let v2_attr = Attribution {
            cgroup_id: e.cgroup_v2(),
            cgroup_version: 2,
            node: v2_node,
        };
        if v2_attr.container().is_some() {
            return v2_attr;
        }
        if let (Some(h), Some(id)) = (&self.hierarchies.v1, e.cgroup_v1()) {
            let node = self.registry.get(h.id, id);
            if node.is_some_and(|n| n.container.is_some()) {
                return Attribution {
                    cgroup_id: Some(id),
                    cgroup_version: 1,
                    node,
                };
            }
        }
        v2_attr
    }

    /// Where the process of entry `e` belongs.
    fn placement<'a>(&'a self, e: &'a ProcessEntry) -> Placement<'a> {
        let a = self.attribute(e);
        Placement {
            comm: &e.comm,
            live: e.is_live(),
            container: a.node.and_then(|n| n.container.as_deref()),
            cgroup_path: a.node.map(|n| &n.path),
        }
    }

    pub fn view(&self, e: &ProcessEntry) -> ProcessView {
        let a = self.attribute(e);
        let c = a.container();
        ProcessView {
            pid: e.pid,
            start_time_ns: e.start_ns,
            ppid: e.ppid,
            comm: e.comm.to_string(),
            cgroup_id: a.cgroup_id,
            cgroup_path: a.node.map(|n| n.path.to_string()),
            cgroup_version: a.cgroup_version,
            container_id: c.and_then(|c| c.container_id.as_deref().map(str::to_string)),
            pod_uid: c.and_then(|c| c.pod_uid.as_deref().map(str::to_string)),
            qos: c.and_then(|c| c.qos).map(|q| q.as_str()),
            runtime: c.and_then(|c| c.runtime).map(|r| r.as_str()),
            exited: !e.is_live(),
        }
    }

    pub fn views(&self, include_exited: bool) -> Vec<ProcessView> {
        let mut v: Vec<ProcessView> = self
            .cache
            .iter()
            .filter(|e| include_exited || e.is_live())
            .map(|e| self.view(e))
            .collect();
        v.sort_unstable_by_key(|p| p.pid);
        v
    }
}

/// One row of `GET /debug/processes`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ProcessView {
    pub pid: u32,
    pub start_time_ns: u64,
    pub ppid: u32,
    pub comm: String,
    pub cgroup_id: Option<u64>,
    pub cgroup_path: Option<String>,
    pub cgroup_version: u8,
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    pub qos: Option<&'static str>,
    pub runtime: Option<&'static str>,
    pub exited: bool,
}
