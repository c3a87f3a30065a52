//! What `top` shows, computed from a snapshot by pure functions (no terminal): the rows and
//! their order, units, the lines about degraded sources, and what each key does.
use std::collections::BTreeSet;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use gpu_model::{AgentStats, DeviceSample, DeviceStatus, Snapshot, SourceStatus, TrackingMode};

/// Hex digits of a container id shown when its name is unknown (as `docker ps` does).
pub const SHORT_ID_LEN: usize = 12;

/// Width of a device's memory bar, brackets included.
pub const BAR_WIDTH: usize = 22;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SortBy {
    #[default]
    Memory,
    Utilization,
}

impl SortBy {
    pub fn label(self) -> &'static str {
        match self {
            SortBy::Memory => "memory",
            SortBy::Utilization => "SM utilization",
        }
    }
}

/// A row's identity across refreshes: its owner and the device charged.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RowKey {
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    pub uuid: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Util {
    pub sm: Option<u32>,
    pub mem: Option<u32>,
    pub enc: Option<u32>,
    pub dec: Option<u32>,
}

/// One container (or pod, or the host) on one device: utilization is a percent of *that*
/// device, so a container on two GPUs gets two rows rather than a meaningless sum.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerRow {
    pub key: RowKey,
    pub pod: String,
    pub namespace: String,
    pub container: String,
    pub gpu: String,
    pub memory_bytes: u64,
    pub util: Util,
    pub pids: Vec<u32>,
    /// The kubelet allocated this device to the container, which leaves it idle.
    pub idle_allocation: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ProcessRow {
    pub pid: u32,
    pub comm: String,
    pub memory_bytes: u64,
    pub util: Util,
    pub exited: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Container { row: ContainerRow, expanded: bool },
    Process(ProcessRow),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Info,
    Warn,
    Error,
}

/// A line above the tables saying a source is degraded (or not there yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub level: Level,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeviceRow {
    pub index: u32,
    pub name: String,
    /// "97%", "MIG" (the driver has no whole-GPU figure under MIG), "-", or the status.
    pub util: String,
    pub memory_fraction: Option<f64>,
    pub memory: String,
    pub power: String,
    pub temperature: String,
    pub ok: bool,
}

/// Everything one frame shows.
#[derive(Debug, Clone)]
pub struct Model {
    pub title: String,
    pub notices: Vec<Notice>,
    pub devices: Vec<DeviceRow>,
    pub lines: Vec<Line>,
    pub selected_line: Option<usize>,
    /// The container rows' keys in display order (what the movement keys walk).
    pub order: Vec<RowKey>,
    pub sort: SortBy,
    pub interactive: bool,
}

/// `1.5 GiB`: binary units, one decimal above bytes.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64;
    let mut i = 0;
    // 1023.96 MiB would print as "1024.0 MiB": move up a unit before rounding does.
    while v >= 1023.95 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1} {}", UNITS[i])
}

pub fn percent(v: Option<u32>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// `[||||||       ]`: ASCII, so it reads the same in a plain-text frame.
pub fn bar(fraction: f64, width: usize) -> String {
    let inner = width.saturating_sub(2);
    let f = fraction.clamp(0.0, 1.0);
    let mut n = (f * inner as f64).round() as usize;
    if f > 0.0 && n == 0 {
        n = 1; // something is held: never show an empty bar
    }
    format!("[{}{}]", "|".repeat(n), " ".repeat(inner - n))
}

pub fn short_id(id: &str) -> &str {
    id.get(..SHORT_ID_LEN).unwrap_or(id)
}

/// "0" for a GPU, "0/gi2" for a MIG device (its GPU instance), else a short UUID.
fn gpu_label(devices: &[DeviceSample], uuid: &str) -> String {
    for d in devices {
        if d.uuid == uuid {
            return d.index.to_string();
        }
        if let Some(m) = d.mig_devices.iter().find(|m| &*m.uuid == uuid) {
            return format!("{}/gi{}", d.index, m.gpu_instance_id);
        }
    }
    uuid.chars().take(12).collect()
}

/// One row per (owner, device), unsorted.
pub fn container_rows(snap: &Snapshot) -> Vec<ContainerRow> {
    let mut rows = vec![];
    for c in &snap.containers {
        let is_host = c.container_id.is_none() && c.pod_uid.is_none();
        let pod = c
            .pod_name
            .as_deref()
            .or(c.pod_uid.as_deref())
            .unwrap_or("-")
            .to_string();
        let namespace = c.namespace.as_deref().unwrap_or("-").to_string();
        let container = match (&c.container_name, &c.container_id) {
            (Some(name), _) => name.to_string(),
            (None, Some(id)) => short_id(id).to_string(),
            (None, None) if is_host => "host".into(),
            // A process in the pod's own cgroup, in no container of it.
            (None, None) => "(pod)".into(),
        };
        let idle = c.idle_allocations();
        let row = |uuid: &str| ContainerRow {
            key: RowKey {
                container_id: c.container_id.as_deref().map(str::to_string),
                pod_uid: c.pod_uid.as_deref().map(str::to_string),
                uuid: uuid.to_string(),
            },
            pod: pod.clone(),
            namespace: namespace.clone(),
            container: container.clone(),
            gpu: gpu_label(&snap.devices, uuid),
            memory_bytes: 0,
            util: Util::default(),
            pids: vec![],
            idle_allocation: idle.contains(&uuid),
        };
        for g in &c.gpus {
            rows.push(ContainerRow {
                memory_bytes: g.memory_used_bytes,
                util: Util {
                    sm: g.sm_util,
                    mem: g.mem_util,
                    enc: g.enc_util,
                    dec: g.dec_util,
                },
                pids: g.pids.clone(),
                ..row(&g.uuid)
            });
        }
        // Held and unused: what a platform team most wants to see, so it gets a row.
        for &u in &idle {
            if !c.gpus.iter().any(|g| &*g.uuid == u) {
                rows.push(row(u));
            }
        }
    }
    rows
}

/// Largest first; ties broken by the other figure, then by identity, so that rows do not
/// swap places between refreshes.
pub fn sort_rows(rows: &mut [ContainerRow], by: SortBy) {
    let util = |r: &ContainerRow| r.util.sm.map_or(-1, |v| v as i64);
    rows.sort_by(|a, b| {
        let primary = match by {
            SortBy::Memory => b
                .memory_bytes
                .cmp(&a.memory_bytes)
                .then(util(b).cmp(&util(a))),
            SortBy::Utilization => util(b)
                .cmp(&util(a))
                .then(b.memory_bytes.cmp(&a.memory_bytes)),
        };
        primary.then_with(|| a.key.cmp(&b.key))
    });
}

/// The row's processes, with detail where the snapshot has it (`nvml.process_detail`).
pub fn process_rows(snap: &Snapshot, row: &ContainerRow) -> Vec<ProcessRow> {
    let mut out: Vec<ProcessRow> = row
        .pids
        .iter()
        .map(|&pid| {
            match snap
                .processes
                .iter()
                .find(|p| p.pid == pid && p.uuid == row.key.uuid)
            {
                Some(p) => ProcessRow {
                    pid,
                    comm: p.comm.clone().unwrap_or_else(|| "?".into()),
                    memory_bytes: p.used_memory_bytes,
                    util: Util {
                        sm: p.sm_util,
                        mem: p.mem_util,
                        enc: p.enc_util,
                        dec: p.dec_util,
                    },
                    exited: p.exited,
                },
                None => ProcessRow {
                    pid,
                    comm: "?".into(),
                    memory_bytes: 0,
                    util: Util::default(),
                    exited: false,
                },
            }
        })
        .collect();
    out.sort_by(|a, b| b.memory_bytes.cmp(&a.memory_bytes).then(a.pid.cmp(&b.pid)));
    out
}

pub fn device_rows(snap: &Snapshot) -> Vec<DeviceRow> {
    snap.devices
        .iter()
        .map(|d| {
            let ok = d.status.is_ok();
            let util = if !ok {
                d.status.to_string()
            } else if let Some(u) = d.utilization_gpu {
                format!("{u}%")
            } else if d.mig_enabled {
                "MIG".into()
            } else {
                "-".into()
            };
            let (memory_fraction, memory) = match (d.memory_used_bytes, d.memory_total_bytes) {
                (Some(u), Some(t)) if t > 0 => (
                    Some(u as f64 / t as f64),
                    format!("{} / {}", human_bytes(u), human_bytes(t)),
                ),
                (Some(u), _) => (None, human_bytes(u)),
                _ => (None, "-".into()),
            };
            DeviceRow {
                index: d.index,
                name: d.name.clone(),
                util,
                memory_fraction,
                memory,
                power: d
                    .power_mw
                    .map_or("-".into(), |p| format!("{} W", (p + 500) / 1000)),
                temperature: d.temperature_c.map_or("-".into(), |t| format!("{t}°C")),
                ok,
            }
        })
        .collect()
}

/// Clear lines for whatever is missing or degraded: an SRE must not mistake "no driver"
/// for "no GPU use".
pub fn notices(snap: &Snapshot, stats: &AgentStats) -> Vec<Notice> {
    let mut out = vec![];
    if snap.nvml == SourceStatus::Disabled {
        out.push(Notice {
            level: Level::Warn,
            text: "NVML disabled by configuration (nvml.enabled = false): no GPU data".into(),
        });
    } else if snap.taken_at_ms == 0 {
        out.push(Notice {
            level: Level::Info,
            text: "waiting for the first GPU sample...".into(),
        });
    } else if let Some(reason) = snap.nvml.reason() {
        out.push(Notice {
            level: Level::Error,
            text: format!("NVML unavailable: {reason} (no GPU data; retrying with backoff)"),
        });
    } else if let (SourceStatus::Stalled(why), true) = (&snap.nvml, snap.devices.is_empty()) {
        out.push(Notice {
            level: Level::Error,
            text: format!("NVML not answering: {why} (no GPU data until it returns)"),
        });
    }
    // A wedged driver: its GPU's last readings are not shown as if they were current.
    for d in &snap.devices {
        if let DeviceStatus::Stalled { call, secs } = &d.status {
            out.push(Notice {
                level: Level::Error,
                text: format!(
                    "GPU {} not answering for {secs} s ({call} has not returned)",
                    d.index
                ),
            });
        }
    }
    // The runtimes that name containers; a source not reported yet says nothing.
    let name_sources: Vec<(&str, &SourceStatus)> = ["cri", "docker"]
        .into_iter()
        .filter_map(|k| Some((k, stats.metadata.get(k)?)))
        .collect();
    if !name_sources.is_empty() && name_sources.iter().all(|(_, v)| !v.is_ok()) {
        let why: Vec<String> = name_sources
            .iter()
            .map(|(k, v)| match v.reason() {
                Some(r) => format!("{k}: {r}"),
                None => format!("{k}: {v}"),
            })
            .collect();
        out.push(Notice {
            level: Level::Info,
            text: format!(
                "container names unknown ({}): pods by UID, containers by short id",
                why.join("; ")
            ),
        });
    }
    if let (TrackingMode::Ebpf, Some(reason)) = (stats.mode, &stats.degraded_reason) {
        // A stalled NVML alone is said above.
        if *reason != snap.nvml.to_string() {
            out.push(Notice {
                level: Level::Warn,
                text: format!("degraded: {reason}"),
            });
        }
    }
    if stats.mode == TrackingMode::Procfs {
        let reason = stats.degraded_reason.as_deref().unwrap_or("unknown reason");
        out.push(Notice {
            level: Level::Warn,
            text: format!(
                "/proc mode (degraded, eBPF unavailable: {reason}): containers found by rescanning /proc"
            ),
        });
    }
    out
}

/// What a key press asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Nothing,
    Redraw,
    Quit,
}

/// The interactive state: sort, selection and expanded rows, all keyed by row identity so
/// they follow a container when rows move.
#[derive(Debug, Default)]
pub struct App {
    pub sort: SortBy,
    pub selected: Option<RowKey>,
    /// Where the selection was, for when its row goes away.
    selected_index: usize,
    pub expanded: BTreeSet<RowKey>,
    /// Every row expanded (the plain-text frame: a bug report wants the processes).
    pub expand_all: bool,
}

impl App {
    /// For the plain-text frame: every row expanded.
    pub fn expanding_all() -> App {
        App {
            expand_all: true,
            ..Default::default()
        }
    }

    pub fn model(
        &mut self,
        snap: &Snapshot,
        stats: &AgentStats,
        host: &str,
        interactive: bool,
    ) -> Model {
        let mut rows = container_rows(snap);
        sort_rows(&mut rows, self.sort);
        let order: Vec<RowKey> = rows.iter().map(|r| r.key.clone()).collect();
        self.resolve_selection(&order, interactive);
        // Forget expansions of rows that are gone, so that a returning row starts closed.
        self.expanded.retain(|k| order.contains(k));
        let mut lines = vec![];
        let mut selected_line = None;
        for row in rows {
            if self.selected.as_ref() == Some(&row.key) {
                selected_line = Some(lines.len());
            }
            let expanded = self.expand_all || self.expanded.contains(&row.key);
            let procs = if expanded {
                process_rows(snap, &row)
            } else {
                vec![]
            };
            lines.push(Line::Container { row, expanded });
            lines.extend(procs.into_iter().map(Line::Process));
        }
        Model {
            title: title(snap, stats, host),
            notices: notices(snap, stats),
            devices: device_rows(snap),
            lines,
            selected_line,
            order,
            sort: self.sort,
            interactive,
        }
    }

    fn resolve_selection(&mut self, order: &[RowKey], interactive: bool) {
        if !interactive || order.is_empty() {
            self.selected = None;
            return;
        }
        match self
            .selected
            .as_ref()
            .and_then(|k| order.iter().position(|o| o == k))
        {
            Some(i) => self.selected_index = i,
            None => {
                self.selected_index = self.selected_index.min(order.len() - 1);
                self.selected = Some(order[self.selected_index].clone());
            }
        }
    }

    /// `order`: the container rows as last shown.
    pub fn on_key(&mut self, key: KeyEvent, order: &[RowKey]) -> Action {
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        let step = |app: &mut App, delta: isize| {
            if order.is_empty() {
                return Action::Nothing;
            }
            let cur = app
                .selected
                .as_ref()
                .and_then(|k| order.iter().position(|o| o == k))
                .unwrap_or(0) as isize;
            let i = (cur + delta).clamp(0, order.len() as isize - 1) as usize;
            app.selected = Some(order[i].clone());
            app.selected_index = i;
            Action::Redraw
        };
        match key.code {
            KeyCode::Char('q') | KeyCode::Char('Q') => Action::Quit,
            // Raw mode turns Ctrl-C into a key, not SIGINT.
            KeyCode::Char('c') if ctrl => Action::Quit,
            KeyCode::Down | KeyCode::Char('j') => step(self, 1),
            KeyCode::Up | KeyCode::Char('k') => step(self, -1),
            KeyCode::PageDown => step(self, 10),
            KeyCode::PageUp => step(self, -10),
            KeyCode::Home => step(self, isize::MIN / 2),
            KeyCode::End => step(self, isize::MAX / 2),
            KeyCode::Enter | KeyCode::Char('e') | KeyCode::Char(' ') => {
                match &self.selected {
                    Some(k) if !self.expanded.remove(k) => {
                        self.expanded.insert(k.clone());
                    }
                    Some(_) => {}
                    None => return Action::Nothing,
                }
                Action::Redraw
            }
            KeyCode::Char('m') => {
                self.sort = SortBy::Memory;
                Action::Redraw
            }
            KeyCode::Char('u') => {
                self.sort = SortBy::Utilization;
                Action::Redraw
            }
            _ => Action::Nothing,
        }
    }
}

/// The top line: where, which driver, how the cache runs, when the sample was taken.
fn title(snap: &Snapshot, stats: &AgentStats, host: &str) -> String {
    let mut parts = vec![format!("gpu-agent top | {host}")];
    if let Some(v) = &snap.driver_version {
        parts.push(format!("driver {v}"));
    }
    parts.push(format!("{} GPUs", snap.devices.len()));
    let mode = match stats.mode {
        TrackingMode::Ebpf => "eBPF cache",
        TrackingMode::Procfs => "/proc cache",
        TrackingMode::Starting => "starting",
    };
    parts.push(format!("{mode}: {} processes", stats.cached_processes));
    if snap.taken_at_ms != 0 {
        parts.push(format!("sampled {}", clock(snap.taken_at_ms)));
    }
    parts.join(" | ")
}

/// HH:MM:SS in local time.
fn clock(unix_ms: u64) -> String {
    let t = (unix_ms / 1000) as libc::time_t;
    // SAFETY: zeroed tm is a valid out-parameter; localtime_r is thread-safe.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return String::from("?");
    }
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use gpu_model::{ContainerGpu, ContainerUsage, MigSample, ProcessUsage};

    pub const GIB: u64 = 1 << 30;
    pub const ID_A: &str = "aaaaaaaaaaaa1111111111111111111111111111111111111111111111111111";
    pub const ID_B: &str = "bbbbbbbbbbbb2222222222222222222222222222222222222222222222222222";

    fn gpu(uuid: &str, mem: u64, sm: u32, pids: &[u32]) -> ContainerGpu {
        ContainerGpu {
            uuid: uuid.into(),
            gpu_uuid: uuid.into(),
            memory_used_bytes: mem,
            sm_util: Some(sm),
            mem_util: Some(5),
            enc_util: Some(0),
            dec_util: None,
            pids: pids.to_vec(),
            gpu_time_seconds: None,
            memory_byte_seconds: 0.0,
            counters_since_ms: 0,
        }
    }

    fn owner(id: Option<&str>, pod: Option<&str>, gpus: Vec<ContainerGpu>) -> ContainerUsage {
        ContainerUsage {
            container_id: id.map(Into::into),
            pod_uid: pod.map(Into::into),
            gpus,
            ..Default::default()
        }
    }

    fn proc(pid: u32, comm: &str, uuid: &str, mem: u64) -> ProcessUsage {
        ProcessUsage {
            pid,
            comm: Some(comm.into()),
            container_id: None,
            pod_uid: None,
            uuid: uuid.into(),
            used_memory_bytes: mem,
            sm_util: Some(1),
            mem_util: Some(2),
            enc_util: Some(0),
            dec_util: Some(0),
            exited: false,
        }
    }

    /// Two containers on GPU 0: A holds less memory but works harder; one host process.
    pub fn snapshot() -> Snapshot {
        Snapshot {
            taken_at_ms: 1_700_000_000_000,
            nvml: SourceStatus::Ok,
            driver_version: Some("580.159.04".into()),
            devices: vec![DeviceSample {
                index: 0,
                uuid: "GPU-0".into(),
                name: "NVIDIA H100 80GB HBM3".into(),
                status: gpu_model::DeviceStatus::Ok,
                memory_total_bytes: Some(80 * GIB),
                memory_used_bytes: Some(6 * GIB),
                utilization_gpu: Some(97),
                power_mw: Some(688_494),
                temperature_c: Some(67),
                ..Default::default()
            }],
            containers: vec![
                owner(
                    Some(ID_A),
                    Some("0c1f7c1e-0000-4000-8000-000000000001"),
                    vec![gpu("GPU-0", GIB + GIB / 2, 80, &[101, 102])],
                ),
                owner(
                    Some(ID_B),
                    Some("0c1f7c1e-0000-4000-8000-000000000002"),
                    vec![gpu("GPU-0", 4 * GIB, 5, &[201])],
                ),
                owner(None, None, vec![gpu("GPU-0", GIB / 2, 0, &[301])]),
            ],
            processes: vec![
                proc(101, "python", "GPU-0", GIB),
                proc(102, "worker", "GPU-0", GIB / 2),
                proc(201, "trainer", "GPU-0", 4 * GIB),
                proc(301, "Xorg", "GPU-0", GIB / 2),
            ],
            ..Default::default()
        }
    }

    fn sources() -> AgentStats {
        AgentStats {
            nvml: SourceStatus::Ok,
            mode: TrackingMode::Ebpf,
            cached_processes: 42,
            ..Default::default()
        }
    }

    fn key(c: KeyCode) -> KeyEvent {
        KeyEvent::new(c, KeyModifiers::NONE)
    }

    fn containers(m: &Model) -> Vec<String> {
        m.lines
            .iter()
            .filter_map(|l| match l {
                Line::Container { row, .. } => Some(row.container.clone()),
                Line::Process(_) => None,
            })
            .collect()
    }

    #[test]
    fn bytes_read_like_a_person_writes_them() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1024), "1.0 KiB");
        assert_eq!(human_bytes(GIB + GIB / 2), "1.5 GiB");
        assert_eq!(human_bytes(85_520_809_984), "79.6 GiB");
        assert_eq!(human_bytes(GIB - 1), "1.0 GiB", "no 1024.0 MiB");
        assert_eq!(human_bytes(u64::MAX), "16384.0 PiB");
    }

    #[test]
    fn bars_are_proportional_and_never_empty_when_something_is_held() {
        assert_eq!(bar(0.0, 12), "[          ]");
        assert_eq!(bar(0.5, 12), "[|||||     ]");
        assert_eq!(bar(1.0, 12), "[||||||||||]");
        assert_eq!(bar(0.001, 12), "[|         ]");
        assert_eq!(bar(7.0, 4), "[||]");
    }

    #[test]
    fn rows_name_containers_by_short_id_and_the_host_as_host() {
        let rows = container_rows(&snapshot());
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].container, "aaaaaaaaaaaa");
        assert_eq!(rows[0].pod, "0c1f7c1e-0000-4000-8000-000000000001");
        assert_eq!(rows[0].namespace, "-");
        assert_eq!(rows[0].gpu, "0");
        assert_eq!(rows[2].container, "host");
        assert_eq!(rows[2].pod, "-");
    }

    #[test]
    fn names_win_over_ids_when_known() {
        let mut s = snapshot();
        s.containers[0].pod_name = Some("trainer-0".into());
        s.containers[0].namespace = Some("ml".into());
        s.containers[0].container_name = Some("pytorch".into());
        s.containers[1].container_id = None; // a pod-level cgroup
        let rows = container_rows(&s);
        assert_eq!(
            (
                rows[0].pod.as_str(),
                rows[0].namespace.as_str(),
                rows[0].container.as_str()
            ),
            ("trainer-0", "ml", "pytorch")
        );
        assert_eq!(rows[1].container, "(pod)");
    }

    #[test]
    fn an_allocated_idle_gpu_gets_a_row() {
        let mut s = snapshot();
        s.devices.push(DeviceSample {
            index: 1,
            uuid: "GPU-1".into(),
            ..Default::default()
        });
        s.containers[0].allocated_gpus = vec!["GPU-0".into(), "GPU-1".into()].into();
        let mut notebook = owner(Some(ID_B), None, vec![]);
        notebook.allocated_gpus = vec!["GPU-1".into()].into();
        s.containers[1] = notebook;
        let rows = container_rows(&s);
        let idle: Vec<(&str, &str, bool)> = rows
            .iter()
            .map(|r| (r.container.as_str(), r.gpu.as_str(), r.idle_allocation))
            .collect();
        assert_eq!(
            idle,
            [
                ("aaaaaaaaaaaa", "0", false),
                ("aaaaaaaaaaaa", "1", true),
                ("bbbbbbbbbbbb", "1", true),
                ("host", "0", false),
            ]
        );
        assert_eq!(rows[1].memory_bytes, 0);
        assert!(rows[1].pids.is_empty());
    }

    #[test]
    fn mig_devices_are_labelled_by_gpu_and_instance() {
        let mut s = snapshot();
        s.devices[0].mig_enabled = true;
        s.devices[0].utilization_gpu = None;
        s.devices[0].mig_devices = vec![MigSample {
            uuid: "MIG-1".into(),
            gpu_instance_id: 2,
            ..Default::default()
        }];
        s.containers[0].gpus[0].uuid = "MIG-1".into();
        let rows = container_rows(&s);
        assert_eq!(rows[0].gpu, "0/gi2");
        assert_eq!(device_rows(&s)[0].util, "MIG");
    }

    #[test]
    fn sort_keys_flip_the_order() {
        let mut app = App::default();
        let m = app.model(&snapshot(), &sources(), "node", true);
        assert_eq!(containers(&m), ["bbbbbbbbbbbb", "aaaaaaaaaaaa", "host"]);
        assert_eq!(
            app.on_key(key(KeyCode::Char('u')), &m.order),
            Action::Redraw
        );
        let m = app.model(&snapshot(), &sources(), "node", true);
        assert_eq!(containers(&m), ["aaaaaaaaaaaa", "bbbbbbbbbbbb", "host"]);
        app.on_key(key(KeyCode::Char('m')), &m.order);
        let m = app.model(&snapshot(), &sources(), "node", true);
        assert_eq!(m.sort, SortBy::Memory);
        assert_eq!(containers(&m)[0], "bbbbbbbbbbbb");
    }

    #[test]
    fn selection_follows_its_container_and_enter_expands_it() {
        let mut app = App::default();
        let m = app.model(&snapshot(), &sources(), "node", true);
        assert_eq!(m.selected_line, Some(0), "the first row is selected");
        app.on_key(key(KeyCode::Char('j')), &m.order);
        let m = app.model(&snapshot(), &sources(), "node", true);
        assert_eq!(m.selected_line, Some(1));
        assert_eq!(
            app.selected.as_ref().unwrap().container_id.as_deref(),
            Some(ID_A)
        );
        // Re-sorting moves the row; the selection goes with it.
        app.on_key(key(KeyCode::Char('u')), &m.order);
        let m = app.model(&snapshot(), &sources(), "node", true);
        assert_eq!(m.selected_line, Some(0));
        app.on_key(key(KeyCode::Enter), &m.order);
        let m = app.model(&snapshot(), &sources(), "node", true);
        let procs: Vec<(u32, &str)> = m
            .lines
            .iter()
            .filter_map(|l| match l {
                Line::Process(p) => Some((p.pid, p.comm.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(procs, [(101, "python"), (102, "worker")]);
        assert!(matches!(
            &m.lines[0],
            Line::Container { expanded: true, .. }
        ));
        app.on_key(key(KeyCode::Char('e')), &m.order);
        let m = app.model(&snapshot(), &sources(), "node", true);
        assert_eq!(m.lines.len(), 3, "collapsed again");
    }

    #[test]
    fn movement_stops_at_the_ends_and_survives_a_vanished_row() {
        let mut app = App::default();
        let m = app.model(&snapshot(), &sources(), "node", true);
        app.on_key(key(KeyCode::Up), &m.order);
        assert_eq!(app.selected.as_ref(), Some(&m.order[0]));
        app.on_key(key(KeyCode::End), &m.order);
        app.on_key(key(KeyCode::Down), &m.order);
        assert_eq!(app.selected.as_ref(), Some(&m.order[2]));
        let mut s = snapshot();
        s.containers.pop(); // the host entry (selected) goes away
        let m = app.model(&s, &sources(), "node", true);
        assert_eq!(m.selected_line, Some(1), "the nearest row is selected");
    }

    #[test]
    fn q_and_ctrl_c_quit() {
        let mut app = App::default();
        assert_eq!(app.on_key(key(KeyCode::Char('q')), &[]), Action::Quit);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(app.on_key(ctrl_c, &[]), Action::Quit);
        assert_eq!(app.on_key(key(KeyCode::Char('c')), &[]), Action::Nothing);
        assert_eq!(app.on_key(key(KeyCode::Enter), &[]), Action::Nothing);
    }

    #[test]
    fn the_plain_frame_expands_everything_and_selects_nothing() {
        let mut app = App {
            expand_all: true,
            ..Default::default()
        };
        let m = app.model(&snapshot(), &sources(), "node", false);
        assert_eq!(m.selected_line, None);
        assert_eq!(m.lines.len(), 3 + 4);
    }

    #[test]
    fn a_process_without_detail_still_shows_its_pid() {
        let mut s = snapshot();
        s.processes.clear();
        let rows = container_rows(&s);
        let p = process_rows(&s, &rows[0]);
        assert_eq!(p.iter().map(|p| p.pid).collect::<Vec<_>>(), [101, 102]);
        assert_eq!(p[0].comm, "?");
    }

    #[test]
    fn degraded_sources_are_said_plainly() {
        let snap = snapshot();
        assert!(notices(&snap, &sources()).is_empty());
        let waiting = Snapshot::default();
        assert!(notices(&waiting, &sources())[0].text.contains("waiting"));
        let no_driver = Snapshot {
            taken_at_ms: 1,
            nvml: SourceStatus::Unavailable("Driver Not Loaded".into()),
            ..Default::default()
        };
        let n = notices(&no_driver, &sources());
        assert_eq!(n[0].level, Level::Error);
        assert!(
            n[0].text.starts_with("NVML unavailable: Driver Not Loaded"),
            "{n:?}"
        );
        let procfs = AgentStats {
            mode: TrackingMode::Procfs,
            degraded_reason: Some("disabled by configuration (ebpf.enabled = false)".into()),
            ..sources()
        };
        let n = notices(&snap, &procfs);
        assert!(n[0].text.starts_with("/proc mode"), "{n:?}");
        assert!(n[0].text.contains("ebpf.enabled = false"));
        // NVML's status travels in the snapshot, its one owner.
        let disabled = Snapshot {
            nvml: SourceStatus::Disabled,
            ..Default::default()
        };
        assert!(notices(&disabled, &sources())[0]
            .text
            .contains("NVML disabled"));
        let mut no_names = sources();
        no_names.metadata = [
            ("cri", "unavailable: no runtime socket found"),
            ("docker", "unavailable: /var/run/docker.sock: not found"),
            ("pod_resources", "ok"),
        ]
        .into_iter()
        .map(|(k, v)| {
            let v = match v.strip_prefix("unavailable: ") {
                Some(r) => SourceStatus::Unavailable(r.into()),
                None => SourceStatus::Ok,
            };
            (k.to_string(), v)
        })
        .collect();
        let n = notices(&snap, &no_names);
        assert_eq!(n[0].level, Level::Info);
        assert!(n[0].text.starts_with("container names unknown (cri: no runtime socket found; docker: /var/run/docker.sock"), "{n:?}");
        no_names.metadata.insert("cri".into(), SourceStatus::Ok);
        assert!(notices(&snap, &no_names).is_empty());
    }

    #[test]
    fn a_stalled_gpu_or_nvml_thread_is_said_in_red() {
        let mut snap = snapshot();
        snap.devices[0].index = 3;
        snap.devices[0].status = DeviceStatus::Stalled {
            call: "power".into(),
            secs: 42,
        };
        let n = notices(&snap, &sources());
        assert_eq!(n.len(), 1, "{n:?}");
        assert_eq!(n[0].level, Level::Error);
        assert_eq!(
            n[0].text,
            "GPU 3 not answering for 42 s (power has not returned)"
        );
        let wedged = Snapshot {
            taken_at_ms: 1,
            nvml: SourceStatus::Stalled("nvmlInit_v2 for 9 s".into()),
            ..Default::default()
        };
        let n = notices(&wedged, &sources());
        assert_eq!(n[0].level, Level::Error);
        assert!(
            n[0].text
                .starts_with("NVML not answering: nvmlInit_v2 for 9 s"),
            "{n:?}"
        );
    }

    #[test]
    fn devices_show_units_and_status() {
        let mut s = snapshot();
        let d = &device_rows(&s)[0];
        assert_eq!(d.util, "97%");
        assert_eq!(d.memory, "6.0 GiB / 80.0 GiB");
        assert_eq!(d.power, "688 W");
        assert_eq!(d.temperature, "67°C");
        s.devices[0].status = gpu_model::DeviceStatus::Lost;
        assert_eq!(device_rows(&s)[0].util, "lost");
    }
}
