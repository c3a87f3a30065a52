//! Process-wide library state: init refcount, the loaded scenario and its reloads.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use crate::scenario::Scenario;

pub const ENV_SCENARIO: &str = "FAKE_NVML_SCENARIO";
const RECHECK: Duration = Duration::from_millis(100);

/// What identifies one version of the file; mtime alone misses same-tick rewrites.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint {
    mtime: Option<SystemTime>,
    len: u64,
    ino: u64,
}

fn fingerprint(path: &Path) -> Option<Fingerprint> {
    let m = std::fs::metadata(path).ok()?;
    Some(Fingerprint {
        mtime: m.modified().ok(),
        len: m.len(),
        ino: m.ino(),
    })
}

/// Energy counter origin for one device: value = base + power x time since.
#[derive(Debug, Clone, Copy)]
struct EnergyBase {
    base_mj: u64,
    since: Instant,
}

pub struct Loaded {
    pub scenario: Scenario,
    energy: Vec<EnergyBase>,
    /// Per device, per `xid_events` entry: when it first appeared in a loaded scenario.
    pub xid_seen: Vec<Vec<Instant>>,
    /// Per device: since when its NVLink counters grow (carried while the spec is unchanged).
    nvlink_since: Vec<Instant>,
}

impl Loaded {
    fn new(scenario: Scenario, previous: Option<&Loaded>, now: Instant) -> Loaded {
        let energy = scenario
            .devices
            .iter()
            .map(|d| {
                // Carry a device's counter across reloads so it never goes back,
                // unless the new file sets a different starting value on purpose.
                let carried = previous.and_then(|p| {
                    let pos = p.scenario.devices.iter().position(|o| o.uuid == d.uuid)?;
                    (p.scenario.devices[pos].energy_mj == d.energy_mj)
                        .then(|| p.energy_at(pos, now))
                });
                EnergyBase {
                    base_mj: carried.unwrap_or(d.energy_mj),
                    since: now,
                }
            })
            .collect();
        let xid_seen = first_seen(&scenario, previous, now);
        let nvlink_since = scenario
            .devices
            .iter()
            .map(|d| {
                previous
                    .and_then(|p| {
                        let pos = p.scenario.devices.iter().position(|o| o.uuid == d.uuid)?;
                        (p.scenario.devices[pos].nvlink_bandwidth == d.nvlink_bandwidth)
                            .then(|| p.nvlink_since[pos])
                    })
                    .unwrap_or(now)
            })
            .collect();
        Loaded {
            scenario,
            energy,
            xid_seen,
            nvlink_since,
        }
    }

    /// NVLink (tx, rx) KiB of the device at `pos`: the start values plus rate x time.
    pub fn nvlink_at(&self, pos: usize, now: Instant) -> Option<(u64, u64)> {
        let n = self.scenario.devices[pos].nvlink_bandwidth?;
        let ms = u128::from(
            u64::try_from(
                now.saturating_duration_since(self.nvlink_since[pos])
                    .as_millis(),
            )
            .unwrap_or(u64::MAX),
        );
        let grow = |base: u64, rate: u64| {
            base.saturating_add(u64::try_from(u128::from(rate) * ms / 1000).unwrap_or(u64::MAX))
        };
        Some((
            grow(n.tx_kib, n.tx_kib_per_s),
            grow(n.rx_kib, n.rx_kib_per_s),
        ))
    }

    /// Total energy in millijoules of the device at position `pos`.
    pub fn energy_at(&self, pos: usize, now: Instant) -> u64 {
        let dev = &self.scenario.devices[pos];
        let Some(e) = self.energy.get(pos) else {
            return dev.energy_mj;
        };
        if !self.scenario.energy_grows {
            return e.base_mj;
        }
        // mW x ms = uJ.
        let ms = now.saturating_duration_since(e.since).as_millis();
        let grown = u128::from(dev.power_mw) * ms / 1000;
        e.base_mj
            .saturating_add(u64::try_from(grown).unwrap_or(u64::MAX))
    }
}

/// Per device and `xid_events` entry: when it first appeared in a loaded scenario, carried
/// over from `previous` for the same (uuid, xid, at_ms, occurrence), so that a reload does
/// not postpone nor repeat an event.
fn first_seen(s: &Scenario, previous: Option<&Loaded>, now: Instant) -> Vec<Vec<Instant>> {
    s.devices
        .iter()
        .map(|d| {
            let old = previous.and_then(|p| {
                let pos = p.scenario.devices.iter().position(|o| o.uuid == d.uuid)?;
                Some((&p.scenario.devices[pos].xid_events, &p.xid_seen[pos]))
            });
            d.xid_events
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    let nth = d.xid_events[..i].iter().filter(|x| *x == e).count();
                    old.and_then(|(events, seen)| {
                        events
                            .iter()
                            .zip(seen)
                            .filter(|(x, _)| *x == e)
                            .nth(nth)
                            .map(|(_, t)| *t)
                    })
                    .unwrap_or(now)
                })
                .collect()
        })
        .collect()
}

pub struct State {
    init_count: u32,
    path: Option<PathBuf>,
    loaded: Option<Loaded>,
    fingerprint: Option<Fingerprint>,
    bad_fingerprint: Option<Fingerprint>,
    last_check: Option<Instant>,
}

static STATE: Mutex<State> = Mutex::new(State {
    init_count: 0,
    path: None,
    loaded: None,
    fingerprint: None,
    bad_fingerprint: None,
    last_check: None,
});

/// A panic while holding the lock must not wedge every later call.
pub fn lock() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(PoisonError::into_inner)
}

pub fn log(msg: &str) {
    let _ = writeln!(std::io::stderr(), "fake-nvml: {msg}");
}

pub fn read_scenario(path: &Path) -> Result<Scenario, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Scenario::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

pub enum InitError {
    NoScenario,
    DriverNotLoaded,
}

impl State {
    pub fn initialized(&self) -> bool {
        self.init_count > 0
    }

    /// nvmlInit: reads the env on every call so each init can pick a scenario.
    pub fn init(&mut self, env: Option<OsString>) -> Result<(), InitError> {
        let Some(path) = env.filter(|p| !p.is_empty()).map(PathBuf::from) else {
            log(&format!("{ENV_SCENARIO} is not set"));
            return Err(InitError::NoScenario);
        };
        let fp = fingerprint(&path);
        let scenario = read_scenario(&path).map_err(|e| {
            log(&e);
            InitError::NoScenario
        })?;
        if !scenario.driver_loaded {
            return Err(InitError::DriverNotLoaded);
        }
        let now = Instant::now();
        self.loaded = Some(Loaded::new(scenario, self.loaded.as_ref(), now));
        self.path = Some(path);
        self.fingerprint = fp;
        self.bad_fingerprint = None;
        self.last_check = Some(now);
        self.init_count += 1;
        Ok(())
    }

    pub fn shutdown(&mut self) -> bool {
        if self.init_count == 0 {
            return false;
        }
        self.init_count -= 1;
        true
    }

    /// Picks up edits to the scenario file, at most once per RECHECK.
    pub fn refresh(&mut self, now: Instant) {
        if self
            .last_check
            .is_some_and(|t| now.saturating_duration_since(t) < RECHECK)
        {
            return;
        }
        self.last_check = Some(now);
        let Some(path) = self.path.clone() else {
            return;
        };
        let fp = fingerprint(&path);
        if fp.is_none() || fp == self.fingerprint || fp == self.bad_fingerprint {
            // A vanished file keeps the last good scenario.
            return;
        }
        match read_scenario(&path) {
            Ok(s) => {
                self.loaded = Some(Loaded::new(s, self.loaded.as_ref(), now));
                self.fingerprint = fp;
                self.bad_fingerprint = None;
            }
            Err(e) => {
                log(&format!("{e} (keeping the previous scenario)"));
                self.bad_fingerprint = fp;
            }
        }
    }

    pub fn loaded(&self) -> Option<&Loaded> {
        self.loaded.as_ref()
    }
}
