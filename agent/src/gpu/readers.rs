//! The thread that reads the GPUs, and what happens when a read does not return. An NVML
//! call cannot be cancelled, and on a GPU that fell off the bus every call on it blocks:
//! read on the sampler's own thread, one such GPU would stop every other GPU's readings
//! and leave the last values standing. So the GPUs are read on a reader thread, one after
//! another, and the cycle waits for it until its deadline. A reader still in a call then
//! is retired: it is never joined, it ends once the call returns, and the next cycle asks
//! a new reader. The GPU it was stuck on stays locked (each GPU's reading state is behind a
//! lock of its own) and is left out until its read comes back; the others are read as
//! before. So each stuck GPU holds at most one thread, and a healthy node pays for one
//! thread hand-off a cycle.
use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        atomic::{AtomicBool, AtomicU32, Ordering::Relaxed},
        mpsc, Arc, Mutex, TryLockError,
    },
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
use crate::stats::thread_cpu_ns;

/// One GPU's part of a cycle's request.
struct Ask {
    index: u32,
    state: Arc<Mutex<State>>,
    /// Read the slow readings afresh rather than hold the last ones.
    due: bool,
    /// Accounting stats to read: (device uuid, pid) of processes that exited.
    accounting: Vec<(String, u32)>,
}

struct Request {
    cycle: u64,
    asks: Vec<Ask>,
}

/// A GPU's reading for the request of `cycle`.
pub(super) struct Answer {
    pub index: u32,
    pub cycle: u64,
    pub sample: DeviceSample,
    /// Profiling's status on this GPU (and its MIG devices), when it changed.
    pub gpm: Option<BTreeMap<String, SourceStatus>>,
}

/// What every GPU's reading state is made with.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    pub crowded_list_interval: Duration,
    pub accounting: bool,
}

/// A reader thread, as the sampler sees it.
struct Reader {
    requests: mpsc::Sender<Request>,
    progress: Arc<Progress>,
    /// The GPU it reads now (`NONE` between GPUs).
    device: Arc<AtomicU32>,
    retired: Arc<AtomicBool>,
}

const NONE: u32 = u32::MAX;

/// (cycle, the reader's CPU time for it), when a reader is done with a request.
type Done = (u64, u64);

/// The GPUs' reading states and the reader thread that reads them.
pub(super) struct Readers {
    nvml: Arc<Nvml>,
    xids: Arc<Mutex<Xids>>,
    settings: Settings,
    /// Per GPU index.
    states: Vec<Arc<Mutex<State>>>,
    /// Per GPU index: asked at, while a retired reader is stuck on it.
    stuck: Vec<Option<Instant>>,
    /// Per GPU index: its next read takes every reading afresh (it answered late).
    afresh: Vec<bool>,
    reader: Option<Reader>,
    /// Retired readers still in a call: the GPU each is stuck on, and its progress.
    retired: Vec<(u32, Arc<Progress>)>,
    answers: Arc<Mutex<Vec<Answer>>>,
    done: (mpsc::Sender<Done>, mpsc::Receiver<Done>),
    /// The readers' CPU time since `take_cpu_ns`, NVML's calls included.
    cpu_ns: u64,
}

/// One cycle's outcome: the GPUs that answered, and those a stuck read holds, with the
/// call it is in and since when it was asked.
pub(super) struct Cycle {
    pub answers: Vec<Answer>,
    pub stuck: Vec<(u32, &'static str, Duration)>,
}

impl Readers {
    pub fn new(nvml: Arc<Nvml>, xids: Arc<Mutex<Xids>>, settings: Settings) -> Readers {
        Readers {
            nvml,
            xids,
            settings,
            states: vec![],
            stuck: vec![],
            afresh: vec![],
            reader: None,
            retired: vec![],
            answers: Arc::default(),
            done: mpsc::channel(),
            cpu_ns: 0,
        }
    }

    /// Reads GPUs `0..count` for `cycle`, waiting up to `wait`. `accounting` holds each
    /// GPU's accounting requests, by index.
    pub fn read(
        &mut self,
        cycle: u64,
        count: u32,
        due: bool,
        mut accounting: HashMap<u32, Vec<(String, u32)>>,
        wait: Duration,
    ) -> Cycle {
        self.resize(count as usize);
        let mut answers = self.take_answers(cycle);
        // A reader that finished a cycle late is free again.
        while let Ok((_, cpu)) = self.done.1.try_recv() {
            self.cpu_ns += cpu;
        }
        let asks = (0..count)
            .filter(|&i| self.stuck[i as usize].is_none())
            .map(|index| Ask {
                index,
                state: self.states[index as usize].clone(),
                due: due || std::mem::take(&mut self.afresh[index as usize]),
                accounting: accounting.remove(&index).unwrap_or_default(),
            })
            .collect::<Vec<_>>();
        let asked_at = Instant::now();
        let finished = asks.is_empty()
            || (self.ask(Request { cycle, asks }) && self.wait_done(cycle, asked_at + wait));
        if !finished {
            self.retire(asked_at);
        }
        answers.extend(self.take_answers(cycle));
        let stuck = self.stuck_reads();
        Cycle { answers, stuck }
    }

    /// Whether the reader says it finished `cycle` by `deadline`.
    fn wait_done(&mut self, cycle: u64, deadline: Instant) -> bool {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.done.1.recv_timeout(left) {
                Ok((c, cpu)) => {
                    self.cpu_ns += cpu;
                    if c == cycle {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
    }

    /// The readers' CPU time since the last call.
    pub fn take_cpu_ns(&mut self) -> u64 {
        std::mem::take(&mut self.cpu_ns)
    }

    fn resize(&mut self, n: usize) {
        self.states.truncate(n);
        self.stuck.resize(n, None);
        self.afresh.resize(n, false);
        while self.states.len() < n {
            let index = self.states.len() as u32;
            let state = State::new(index, self.xids.clone(), &self.settings);
            self.states.push(Arc::new(Mutex::new(state)));
        }
    }

    /// The answers of `cycle`; an answer of an earlier one is a stuck read come back: its
    /// GPU is free again, and its reading stale.
    fn take_answers(&mut self, cycle: u64) -> Vec<Answer> {
        let all = std::mem::take(&mut *self.answers.lock().unwrap());
        let (now, late): (Vec<Answer>, Vec<Answer>) =
            all.into_iter().partition(|a| a.cycle == cycle);
        for a in late {
            let i = a.index as usize;
            if let Some(since) = self.stuck.get_mut(i).and_then(Option::take) {
                tracing::warn!(
                    index = a.index,
                    uuid = a.sample.uuid,
                    "GPU {} answers again, after {} s without an answer",
                    a.index,
                    since.elapsed().as_secs()
                );
            }
            if let Some(f) = self.afresh.get_mut(i) {
                *f = true;
            }
        }
        now
    }

    /// Hands `req` to the reader, started first if there is none; false if it cannot be.
    fn ask(&mut self, req: Request) -> bool {
        if self.reader.is_none() {
            match self.spawn() {
                Ok(r) => self.reader = Some(r),
                Err(e) => {
                    tracing::warn!("cannot start the GPU reader thread: {e}");
                    return false;
                }
            }
        }
        let reader = self.reader.as_ref().expect("started above");
        reader.requests.send(req).is_ok()
    }

    /// The reader did not finish by the deadline: it is left to its call and ends when it
    /// returns. The GPU it is on stays held; the GPUs after it are read by the next reader.
    fn retire(&mut self, asked_at: Instant) {
        let Some(r) = self.reader.take() else {
            return;
        };
        r.retired.store(true, Relaxed);
        let i = r.device.load(Relaxed);
        if let Some(s) = self.stuck.get_mut(i as usize) {
            s.get_or_insert(asked_at);
        }
        // Its progress, to name the call it is in.
        self.retired.push((i, r.progress));
    }

    fn stuck_reads(&mut self) -> Vec<(u32, &'static str, Duration)> {
        self.retired
            .retain(|(i, _)| self.stuck.get(*i as usize).is_some_and(Option::is_some));
        self.retired
            .iter()
            .filter_map(|(i, p)| {
                let since = self.stuck.get(*i as usize).copied().flatten()?;
                let call = p.now().0.unwrap_or("device read");
                Some((*i, call, since.elapsed()))
            })
            .collect()
    }

    fn spawn(&self) -> std::io::Result<Reader> {
        let (requests, rx) = mpsc::channel::<Request>();
        let progress = Arc::new(Progress::default());
        let device = Arc::new(AtomicU32::new(NONE));
        let retired = Arc::new(AtomicBool::new(false));
        let (p, d, r) = (progress.clone(), device.clone(), retired.clone());
        let (nvml, answers, done) = (self.nvml.clone(), self.answers.clone(), self.done.0.clone());
        std::thread::Builder::new()
            .name("nvml-reader".into())
            .spawn(move || {
                track(p);
                while let Ok(req) = rx.recv() {
                    let cpu0 = thread_cpu_ns();
                    for ask in req.asks {
                        if r.load(Relaxed) {
                            return;
                        }
                        d.store(ask.index, Relaxed);
                        if let Some(a) = read_one(&nvml, ask, req.cycle) {
                            answers.lock().unwrap().push(a);
                        }
                    }
                    d.store(NONE, Relaxed);
                    let cpu = thread_cpu_ns() - cpu0;
                    if r.load(Relaxed) || done.send((req.cycle, cpu)).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Reader {
            requests,
            progress,
            device,
            retired,
        })
    }

    /// Frees what NVML allocated for the GPUs that no read holds.
    pub fn release(&mut self) {
        self.reader = None;
        for s in &self.states {
            if let Ok(mut st) = s.try_lock() {
                st.extras.gpm.release(&self.nvml);
            }
        }
    }
}

/// One GPU's read, under its lock; None if a stuck reader holds it.
fn read_one(nvml: &Nvml, ask: Ask, cycle: u64) -> Option<Answer> {
    let mut state = match ask.state.try_lock() {
        Ok(s) => s,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        Err(TryLockError::WouldBlock) => return None,
    };
    let sample = state.read(nvml, ask.due, ask.accounting);
    let gpm = state.gpm_changed();
    Some(Answer {
        index: ask.index,
        cycle,
        sample,
        gpm,
    })
}

/// One GPU's reading state, used by one reader at a time.
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
    /// Profiling's status as last answered.
    gpm_said: BTreeMap<String, SourceStatus>,
}

impl State {
    fn new(index: u32, xids: Arc<Mutex<Xids>>, settings: &Settings) -> State {
        State {
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
            gpm_said: BTreeMap::new(),
        }
    }

    /// The device's sample; `due` reads the slow readings afresh.
    fn read(&mut self, nvml: &Nvml, due: bool, accounting: Vec<(String, u32)>) -> DeviceSample {
        let index = self.index;
        let dev = match in_call(&"nvmlDeviceGetHandleByIndex", || {
            nvml.device_by_index(index)
        }) {
            Ok(dev) => dev,
            Err(e) => {
                let status = match e {
                    NvmlError::GpuLost => DeviceStatus::Lost,
                    e => DeviceStatus::Error(e.to_string()),
                };
                return DeviceSample {
                    index,
                    status,
                    ..Default::default()
                };
            }
        };
        self.accounting.request(accounting);
        let held = (!due).then_some(self.held.as_ref()).flatten();
        let mut ctx = DeviceCtx {
            last_seen: &mut self.last_seen,
            fixed: &mut self.fixed,
            lists: &mut self.lists,
        };
        let (mut d, held) = sample_device(nvml, &dev, index, &mut ctx, held);
        if self.accounting.enabled && d.status.is_ok() && !d.mig_enabled {
            in_call(&"accounting", || {
                read_accounting(&dev, &mut d, &mut self.accounting)
            });
        }
        let fresh = held.is_none();
        let d = self.extras.device(nvml, &dev, d, held);
        if fresh && d.status.is_ok() {
            self.held = Some(Held::of(&d));
        }
        self.fixed.end_cycle(std::slice::from_ref(&d));
        d
    }

    /// Profiling's status, when it differs from what was last answered.
    fn gpm_changed(&mut self) -> Option<BTreeMap<String, SourceStatus>> {
        let now = &self.extras.gpm.status;
        (*now != self.gpm_said).then(|| {
            self.gpm_said = now.clone();
            now.clone()
        })
    }
}
