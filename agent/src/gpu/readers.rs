//! One reader thread per GPU. An NVML call cannot be cancelled, and on a GPU that fell off
//! the bus every call on it blocks: read in line, one such GPU would stop every other GPU's
//! readings and leave the last values standing. Each GPU is read on a thread of its own,
//! and a cycle waits for it only until its deadline: a GPU that has not answered is left
//! out of that cycle, and reported stalled once it has not answered for
//! `nvml.stall_timeout_ms`. A reader stuck in a call is never joined; it is asked again
//! only once that call returns, so a GPU has at most one stuck thread.
use std::{
    collections::{BTreeMap, HashMap},
    sync::{mpsc, Arc, Mutex},
    time::{Duration, Instant},
};

use nvml_wrapper::{error::NvmlError, Nvml};

use gpu_model::{DeviceStatus, SourceStatus};

use super::{
    device::{sample_device, DeviceCtx, Extras, Fixed, Held},
    fields::NvlinkRates,
    gpm::Gpm,
    processes::{read_accounting, Accounting, Lists},
    reader::{in_call, track, Progress},
    xid::Xids,
    DeviceSample,
};

/// One cycle's ask of a reader.
pub(super) struct Request {
    pub cycle: u64,
    /// Read the slow readings afresh rather than hold the last ones.
    pub due: bool,
    /// Accounting stats to read: (device uuid, pid) of processes that exited.
    pub accounting: Vec<(String, u32)>,
}

/// A reader's answer to the request of `cycle`.
pub(super) struct Answer {
    pub index: u32,
    pub cycle: u64,
    pub sample: DeviceSample,
    /// Profiling's status on this GPU (and its MIG devices), for /debug/stats.
    pub gpm: BTreeMap<String, SourceStatus>,
}

/// What every reader is made with.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    pub crowded_list_interval: Duration,
    pub accounting: bool,
}

/// The sampler's handle on one GPU's reader thread.
pub(super) struct DeviceReader {
    requests: mpsc::Sender<Request>,
    progress: Arc<Progress>,
    /// Asked at (cycle, when), until it answers.
    pub asked: Option<(u64, Instant)>,
    /// Reported stalled since, until it answers.
    pub stalled: Option<Instant>,
    /// It answered late: its next read takes every reading afresh.
    pub afresh: bool,
}

impl DeviceReader {
    pub fn spawn(
        nvml: Arc<Nvml>,
        index: u32,
        answers: mpsc::Sender<Answer>,
        xids: Arc<Mutex<Xids>>,
        settings: &Settings,
    ) -> std::io::Result<DeviceReader> {
        let (requests, rx) = mpsc::channel();
        let progress = Arc::new(Progress::default());
        let mut state = State {
            index,
            last_seen: HashMap::new(),
            fixed: Fixed::default(),
            lists: Lists::new(settings.crowded_list_interval),
            held: None,
            extras: Extras {
                gpm: Gpm::default(),
                xids,
                nvlink: NvlinkRates::default(),
            },
            accounting: Accounting::new(settings.accounting),
        };
        let p = progress.clone();
        std::thread::Builder::new()
            .name(format!("nvml-gpu{index}"))
            .spawn(move || {
                track(p);
                while let Ok(req) = rx.recv() {
                    let sample = state.read(&nvml, req);
                    let gpm = state.extras.gpm.status.clone();
                    let cycle = sample.1;
                    let answer = Answer {
                        index,
                        cycle,
                        sample: sample.0,
                        gpm,
                    };
                    if answers.send(answer).is_err() {
                        break;
                    }
                }
                state.extras.gpm.release(&nvml);
            })?;
        Ok(DeviceReader {
            requests,
            progress,
            asked: None,
            stalled: None,
            afresh: false,
        })
    }

    /// Asks for this cycle's reading; false if the reader is gone.
    pub fn ask(&mut self, cycle: u64, due: bool, accounting: Vec<(String, u32)>) -> bool {
        let due = due || std::mem::take(&mut self.afresh);
        let sent = self.requests.send(Request {
            cycle,
            due,
            accounting,
        });
        self.asked = Some((cycle, Instant::now()));
        sent.is_ok()
    }

    /// The call it is in (the whole read where no single call is named), and how long it
    /// has been asked for without an answer.
    pub fn waiting(&self) -> Option<(&'static str, Duration)> {
        let (_, since) = self.asked?;
        let call = self.progress.busy().map_or("device read", |(c, _)| c);
        Some((call, since.elapsed()))
    }
}

/// One GPU's reading state, owned by its reader thread.
struct State {
    index: u32,
    /// Its newest process-utilization timestamp seen (NVML's µs clock), by uuid.
    last_seen: HashMap<String, u64>,
    fixed: Fixed,
    lists: Lists,
    /// Its slow readings as last read.
    held: Option<Held>,
    extras: Extras,
    accounting: Accounting,
}

impl State {
    /// The device's sample for `req`, and the cycle it answers.
    fn read(&mut self, nvml: &Nvml, req: Request) -> (DeviceSample, u64) {
        let index = self.index;
        let dev = match in_call("nvmlDeviceGetHandleByIndex", || nvml.device_by_index(index)) {
            Ok(dev) => dev,
            Err(e) => {
                let status = match e {
                    NvmlError::GpuLost => DeviceStatus::Lost,
                    e => DeviceStatus::Error(e.to_string()),
                };
                let d = DeviceSample {
                    index,
                    status,
                    ..Default::default()
                };
                return (d, req.cycle);
            }
        };
        self.accounting.request(req.accounting);
        let held = (!req.due).then_some(self.held.as_ref()).flatten();
        let mut ctx = DeviceCtx {
            last_seen: &mut self.last_seen,
            fixed: &mut self.fixed,
            lists: &mut self.lists,
        };
        let (mut d, held) = sample_device(nvml, &dev, index, &mut ctx, held);
        if self.accounting.enabled && d.status.is_ok() && !d.mig_enabled {
            in_call("accounting", || {
                read_accounting(&dev, &mut d, &mut self.accounting)
            });
        }
        let fresh = held.is_none();
        let d = self.extras.device(nvml, &dev, d, held);
        if fresh && d.status.is_ok() {
            self.held = Some(Held::of(&d));
        }
        self.fixed.end_cycle(std::slice::from_ref(&d));
        (d, req.cycle)
    }
}
