//! The thread that reads the GPUs, and what happens when a read does not return. An NVML
//! call cannot be cancelled, and on a GPU that fell off the bus every call on it blocks:
//! read on the sampler's own thread, one such GPU would stop every other GPU's readings
//! and leave the last values standing. So the GPUs are read on a reader thread, one after
//! another, and the cycle waits for it until its deadline. A reader still in a call then
//! is retired: it is never joined and ends once the call returns. The GPUs it had not begun
//! go to a fresh reader at once, with a second deadline, so that the others are read every
//! cycle. The GPU it was stuck on stays locked (each GPU's reading state is behind a lock of
//! its own) and is left out until its read comes back. So each stuck GPU holds at most one
//! thread, and a healthy node pays for one thread hand-off a cycle.
use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{mpsc, Arc, Mutex, TryLockError},
    time::{Duration, Instant},
};

use nvml_wrapper::{error::NvmlError, Device, Nvml};
use nvml_wrapper_sys::bindings::nvmlDevice_t;

use gpu_model::{DeviceStatus, SourceStatus};

use super::{
    device::{sample_device, DeviceCtx, Extras, Fixed, Held, HeldCounters, Holding},
    fields::NvlinkRates,
    gpm::Gpm,
    processes::{read_accounting, Accounting, Lists},
    reader::{in_call, track, Progress},
    slow::Due,
    xid::Xids,
    DeviceSample,
};
use crate::stats::thread_cpu_ns;

/// What reads a GPU into its state: NVML, or a test's stand-in.
pub(super) trait Source: Send + Sync + 'static {
    /// The GPU's sample; what is `due` is read afresh.
    fn read(
        &self,
        state: &mut DeviceState,
        due: Due,
        accounting: Vec<(String, u32)>,
    ) -> DeviceSample;
    /// Frees what the source allocated for the GPU.
    fn release(&self, state: &mut DeviceState);
}

impl Source for Nvml {
    fn read(
        &self,
        state: &mut DeviceState,
        due: Due,
        accounting: Vec<(String, u32)>,
    ) -> DeviceSample {
        state.read(self, due, accounting)
    }

    fn release(&self, state: &mut DeviceState) {
        state.extras.gpm.release(self);
    }
}

/// One GPU's part of a cycle's request.
struct Ask {
    index: u32,
    /// The device count this cycle: a handle is kept while it stays.
    count: u32,
    state: Arc<Mutex<DeviceState>>,
    /// The slow readings to read afresh rather than hold.
    due: Due,
    /// Accounting stats to read: (device uuid, pid) of processes that exited.
    accounting: Vec<(String, u32)>,
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

/// What a reader and the sampler share: the GPUs not begun, the one in hand. Taking the
/// next GPU, answering for it and retiring the reader each happen under its lock, so a
/// retire finds a GPU either answered or in hand, never both.
#[derive(Default)]
struct Job {
    asks: VecDeque<Ask>,
    on: Option<u32>,
    retired: bool,
}

impl Job {
    /// The next GPU to read, now in hand; None when none is left or the reader is retired.
    fn next(&mut self) -> Option<Ask> {
        let ask = (!self.retired).then(|| self.asks.pop_front()).flatten()?;
        self.on = Some(ask.index);
        Some(ask)
    }

    /// The GPU in hand is done: its answer goes out in the same step.
    fn done(&mut self, answer: Option<Answer>, answers: &Mutex<Vec<Answer>>) {
        answers.lock().unwrap().extend(answer);
        self.on = None;
    }

    /// Retires the reader: the GPU it is in a call on, and those it has not begun.
    fn retire(&mut self) -> (Option<u32>, Vec<Ask>) {
        self.retired = true;
        (self.on, self.asks.drain(..).collect())
    }
}

/// A reader thread, as the sampler sees it.
struct ReaderThread {
    id: u64,
    /// Wakes it for a cycle, its asks in `job`.
    wake: mpsc::Sender<u64>,
    job: Arc<Mutex<Job>>,
    progress: Arc<Progress>,
}

/// (reader, cycle, the reader's CPU time for it), when a reader is done with a request.
type Done = (u64, u64, u64);

/// The GPUs' reading states and the reader thread that reads them.
pub(super) struct Readers<S: Source = Nvml> {
    source: Arc<S>,
    xids: Arc<Mutex<Xids>>,
    settings: Settings,
    /// Per GPU index.
    states: Vec<Arc<Mutex<DeviceState>>>,
    /// Per GPU index: asked at, while a retired reader is stuck on it.
    stuck: Vec<Option<Instant>>,
    /// Per GPU index: its next read takes every reading afresh (it answered late).
    afresh: Vec<bool>,
    reader: Option<ReaderThread>,
    readers_made: u64,
    /// Retired readers still in a call: the GPU each is stuck on, and its progress.
    retired: Vec<(u32, Arc<Progress>)>,
    answers: Arc<Mutex<Vec<Answer>>>,
    /// Stuck GPUs that answered since the last cycle, and how long they had not.
    recovered: Vec<(u32, Duration)>,
    /// Accounting requests of GPUs a cycle did not reach, by index: for the next one.
    unasked: HashMap<u32, Vec<(String, u32)>>,
    done: (mpsc::Sender<Done>, mpsc::Receiver<Done>),
    /// The readers' CPU time since `take_cpu_ns`, NVML's calls included.
    cpu_ns: u64,
}

/// One cycle's outcome: the GPUs that answered, those a stuck read holds (with the call it
/// is in and since when it was asked), and the stuck ones that answered again (with how
/// long they had not).
pub(super) struct Cycle {
    pub answers: Vec<Answer>,
    pub stuck: Vec<(u32, &'static str, Duration)>,
    pub recovered: Vec<(u32, Duration)>,
}

impl<S: Source> Readers<S> {
    pub fn new(source: Arc<S>, xids: Arc<Mutex<Xids>>, settings: Settings) -> Readers<S> {
        Readers {
            source,
            xids,
            settings,
            states: vec![],
            stuck: vec![],
            afresh: vec![],
            reader: None,
            readers_made: 0,
            retired: vec![],
            answers: Arc::default(),
            recovered: vec![],
            unasked: HashMap::new(),
            done: mpsc::channel(),
            cpu_ns: 0,
        }
    }

    /// Reads GPUs `0..count` for `cycle`, waiting up to `wait`, and up to `wait` again for
    /// the GPUs after one that is stuck. `due` says what each reads afresh, `accounting`
    /// holds each GPU's accounting requests, by index.
    pub fn read(
        &mut self,
        cycle: u64,
        count: u32,
        due: &[Due],
        mut accounting: HashMap<u32, Vec<(String, u32)>>,
        wait: Duration,
    ) -> Cycle {
        self.resize(count as usize);
        let mut answers = self.take_answers(cycle);
        // The CPU time of readers retired just as they finished.
        while let Ok((_, _, cpu)) = self.done.1.try_recv() {
            self.cpu_ns += cpu;
        }
        for (i, mut waiting) in self.unasked.drain() {
            waiting.extend(accounting.remove(&i).unwrap_or_default());
            accounting.insert(i, waiting);
        }
        let mut left = (0..count)
            .filter(|&i| self.stuck[i as usize].is_none())
            .map(|index| Ask {
                index,
                count,
                state: self.states[index as usize].clone(),
                due: match std::mem::take(&mut self.afresh[index as usize]) {
                    true => Due::ALL,
                    false => due.get(index as usize).copied().unwrap_or(Due::ALL),
                },
                accounting: accounting.remove(&index).unwrap_or_default(),
            })
            .collect::<Vec<_>>();
        let asked_at = Instant::now();
        // Each pass retires at most one stuck reader; two bound the cycle to two waits.
        for deadline in [asked_at + wait, asked_at + wait * 2] {
            if left.is_empty() {
                break;
            }
            let asks = std::mem::take(&mut left);
            if !(self.ask(cycle, asks) && self.wait_done(cycle, deadline)) {
                left = self.retire(asked_at);
            }
        }
        for a in left.into_iter().filter(|a| !a.accounting.is_empty()) {
            self.unasked.insert(a.index, a.accounting);
        }
        answers.extend(self.take_answers(cycle));
        let stuck = self.stuck_reads();
        let recovered = std::mem::take(&mut self.recovered);
        Cycle {
            answers,
            stuck,
            recovered,
        }
    }

    /// Whether the current reader says it finished `cycle` by `deadline`.
    fn wait_done(&mut self, cycle: u64, deadline: Instant) -> bool {
        let Some(id) = self.reader.as_ref().map(|r| r.id) else {
            return false;
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.done.1.recv_timeout(left) {
                Ok((r, c, cpu)) => {
                    self.cpu_ns += cpu;
                    if (r, c) == (id, cycle) {
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
            let state = DeviceState::new(index, self.xids.clone(), &self.settings);
            self.states.push(Arc::new(Mutex::new(state)));
        }
    }

    /// The answers of `cycle`; an answer of an earlier one is a stuck read come back, its
    /// reading stale. Any answer frees its GPU, and a GPU that was stuck reads every
    /// reading afresh next.
    fn take_answers(&mut self, cycle: u64) -> Vec<Answer> {
        let mut all = std::mem::take(&mut *self.answers.lock().unwrap());
        for a in &all {
            let i = a.index as usize;
            if let Some(since) = self.stuck.get_mut(i).and_then(Option::take) {
                self.recovered.push((a.index, since.elapsed()));
                self.afresh[i] = true;
            } else if a.cycle != cycle {
                if let Some(f) = self.afresh.get_mut(i) {
                    *f = true;
                }
            }
        }
        all.retain(|a| a.cycle == cycle);
        all
    }

    /// Hands `asks` to the reader, started first if there is none; false if it cannot be.
    fn ask(&mut self, cycle: u64, asks: Vec<Ask>) -> bool {
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
        reader.job.lock().unwrap().asks = asks.into();
        reader.wake.send(cycle).is_ok()
    }

    /// The reader did not finish by the deadline: it is left to its call and ends when it
    /// returns. The GPU it is on stays held; the GPUs it had not begun are returned.
    fn retire(&mut self, asked_at: Instant) -> Vec<Ask> {
        let Some(r) = self.reader.take() else {
            return vec![];
        };
        let (on, left) = r.job.lock().unwrap().retire();
        if let Some(i) = on {
            if let Some(s) = self.stuck.get_mut(i as usize) {
                s.get_or_insert(asked_at);
            }
            // Its progress, to name the call it is in.
            self.retired.push((i, r.progress));
        }
        left
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

    fn spawn(&mut self) -> std::io::Result<ReaderThread> {
        let (wake, rx) = mpsc::channel::<u64>();
        let progress = Arc::new(Progress::default());
        let job = Arc::new(Mutex::new(Job::default()));
        self.readers_made += 1;
        let id = self.readers_made;
        let (p, j) = (progress.clone(), job.clone());
        let (source, answers) = (self.source.clone(), self.answers.clone());
        let done = self.done.0.clone();
        std::thread::Builder::new()
            .name("nvml-reader".into())
            .spawn(move || {
                track(p);
                while let Ok(cycle) = rx.recv() {
                    let cpu0 = thread_cpu_ns();
                    loop {
                        // Not in a `while let`: the lock must go before the read.
                        let next = j.lock().unwrap().next();
                        let Some(ask) = next else { break };
                        let answer = read_one(&*source, ask, cycle);
                        j.lock().unwrap().done(answer, &answers);
                    }
                    let cpu = thread_cpu_ns() - cpu0;
                    let retired = j.lock().unwrap().retired;
                    if retired || done.send((id, cycle, cpu)).is_err() {
                        return;
                    }
                }
            })?;
        Ok(ReaderThread {
            id,
            wake,
            job,
            progress,
        })
    }

    /// Frees what the source allocated for the GPUs that no read holds.
    pub fn release(&mut self) {
        self.reader = None;
        for s in &self.states {
            if let Ok(mut st) = s.try_lock() {
                self.source.release(&mut st);
            }
        }
    }
}

/// One GPU's read, under its lock; None if a stuck reader holds it.
fn read_one<S: Source>(source: &S, ask: Ask, cycle: u64) -> Option<Answer> {
    let mut state = match ask.state.try_lock() {
        Ok(s) => s,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        Err(TryLockError::WouldBlock) => return None,
    };
    if state.count != ask.count {
        state.count = ask.count;
        state.handle = None;
    }
    let sample = source.read(&mut state, ask.due, ask.accounting);
    let gpm = state.gpm_changed();
    Some(Answer {
        index: ask.index,
        cycle,
        sample,
        gpm,
    })
}

/// A device's handle and uuid, as NVML gave them for its index. The handle is NVML's for as
/// long as it is initialised, and the uuid is what the handle names; the GPUs at each index
/// can change only with the device count (a GPU that falls off the bus answers GpuLost, and
/// is then asked for by index again).
struct Handle {
    raw: nvmlDevice_t,
    uuid: String,
}

// SAFETY: a handle is an opaque token NVML's thread-safe calls take; a `DeviceState`
// is used by one reader at a time.
unsafe impl Send for Handle {}

/// One GPU's reading state, used by one reader at a time.
pub(super) struct DeviceState {
    index: u32,
    /// The device count its handle was kept under.
    count: u32,
    handle: Option<Handle>,
    /// Its newest process-utilization timestamp seen (NVML's µs clock), by uuid.
    last_seen: HashMap<String, u64>,
    fixed: Fixed,
    lists: Lists,
    /// Its slow readings and its energy counter as last read.
    held: Option<Held>,
    energy: Option<HeldCounters>,
    extras: Extras,
    accounting: Accounting,
    /// Profiling's status as last answered.
    gpm_said: BTreeMap<String, SourceStatus>,
}

impl DeviceState {
    fn new(index: u32, xids: Arc<Mutex<Xids>>, settings: &Settings) -> DeviceState {
        DeviceState {
            index,
            count: 0,
            handle: None,
            last_seen: HashMap::new(),
            fixed: Fixed::default(),
            lists: Lists::new(settings.crowded_list_interval),
            held: None,
            energy: None,
            extras: Extras {
                gpm: Gpm::default(),
                xids,
                nvlink: NvlinkRates::default(),
            },
            accounting: Accounting::new(settings.accounting),
            gpm_said: BTreeMap::new(),
        }
    }

    /// The device's sample; what is `due` is read afresh.
    fn read(&mut self, nvml: &Nvml, due: Due, accounting: Vec<(String, u32)>) -> DeviceSample {
        let index = self.index;
        let handle = self.handle.take();
        let dev = match &handle {
            // SAFETY: the handle this NVML gave for this index under this device count.
            Some(h) => Ok(unsafe { Device::new(h.raw, nvml) }),
            None => in_call(&"nvmlDeviceGetHandleByIndex", || {
                nvml.device_by_index(index)
            }),
        };
        let dev = match dev {
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
        let held = Holding {
            slow: (!due.slow).then_some(self.held.as_ref()).flatten(),
            gpm: (!due.gpm).then_some(self.held.as_ref()).flatten(),
            energy: (!due.energy).then_some(self.energy.as_ref()).flatten(),
        };
        let mut ctx = DeviceCtx {
            uuid: handle.as_ref().map(|h| h.uuid.as_str()),
            last_seen: &mut self.last_seen,
            fixed: &mut self.fixed,
            lists: &mut self.lists,
        };
        let (mut d, held) = sample_device(nvml, &dev, index, &mut ctx, held);
        if self.accounting.enabled && d.status.is_ok() && !d.mig_enabled {
            let mode = held.slow.map(Held::accounting_mode);
            in_call(&"accounting", || {
                read_accounting(&dev, &mut d, &mut self.accounting, mode)
            });
        }
        let (fresh, fresh_energy) = (held.slow.is_none(), held.energy.is_none());
        let mut d = self.extras.device(nvml, &dev, d, held);
        // In one order, and once, whether read or held.
        d.unsupported.sort_unstable();
        d.unsupported.dedup();
        if d.status.is_ok() && !d.uuid.is_empty() {
            self.handle = handle.or_else(|| {
                // SAFETY: kept as a token for this index; NVML owns and never frees it.
                let raw = unsafe { dev.handle() };
                let uuid = d.uuid.clone();
                Some(Handle { raw, uuid })
            });
        }
        if fresh && d.status.is_ok() {
            self.held = Some(Held::of(&d));
        }
        if fresh_energy && d.status.is_ok() {
            self.energy = Some(HeldCounters::of(&d));
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    const WAIT: Duration = Duration::from_millis(300);
    const NOT_DUE: [Due; 4] = [Due {
        slow: false,
        gpm: false,
        energy: false,
    }; 4];

    /// GPUs that answer at once, but those in `hung`, whose power reading does not return
    /// while they are listed.
    #[derive(Default)]
    struct Gpus {
        hung: Mutex<HashSet<u32>>,
        /// Each read begun: (GPU, due).
        reads: Mutex<Vec<(u32, bool)>>,
    }

    impl Source for Gpus {
        fn read(&self, st: &mut DeviceState, due: Due, acc: Vec<(String, u32)>) -> DeviceSample {
            let index = st.index;
            self.reads.lock().unwrap().push((index, due.slow));
            in_call(&"nvmlDeviceGetPowerUsage", || {
                while self.hung.lock().unwrap().contains(&index) {
                    std::thread::sleep(Duration::from_millis(2));
                }
            });
            DeviceSample {
                index,
                uuid: format!("GPU-{index}"),
                // What accounting requests reached it.
                name: format!("{acc:?}"),
                ..Default::default()
            }
        }

        fn release(&self, _: &mut DeviceState) {}
    }

    impl Gpus {
        fn hang(&self, gpus: &[u32]) {
            *self.hung.lock().unwrap() = gpus.iter().copied().collect();
        }

        fn reads_of(&self, gpu: u32) -> Vec<bool> {
            let reads = self.reads.lock().unwrap();
            reads.iter().filter(|r| r.0 == gpu).map(|r| r.1).collect()
        }
    }

    fn readers(gpus: &Arc<Gpus>) -> Readers<Gpus> {
        let settings = Settings {
            crowded_list_interval: Duration::from_secs(5),
            accounting: false,
        };
        Readers::new(
            gpus.clone(),
            Arc::new(Mutex::new(Xids::new(None))),
            settings,
        )
    }

    fn answered(c: &Cycle) -> Vec<u32> {
        let mut v: Vec<u32> = c.answers.iter().map(|a| a.index).collect();
        v.sort_unstable();
        v
    }

    fn stuck(c: &Cycle) -> Vec<(u32, &'static str)> {
        c.stuck.iter().map(|s| (s.0, s.1)).collect()
    }

    #[test]
    fn the_gpus_after_a_stuck_one_are_read_in_the_same_cycle_and_it_is_asked_once() {
        let gpus = Arc::new(Gpus::default());
        let mut r = readers(&gpus);
        gpus.hang(&[1]);
        let c = r.read(1, 4, &NOT_DUE, HashMap::new(), WAIT);
        assert_eq!(answered(&c), [0, 2, 3]);
        assert_eq!(stuck(&c), [(1, "nvmlDeviceGetPowerUsage")]);
        for cycle in 2..5 {
            let t = Instant::now();
            let c = r.read(cycle, 4, &NOT_DUE, HashMap::new(), WAIT);
            assert_eq!(answered(&c), [0, 2, 3], "cycle {cycle}");
            assert_eq!(stuck(&c), [(1, "nvmlDeviceGetPowerUsage")]);
            assert!(
                t.elapsed() < WAIT,
                "no deadline waited for: {:?}",
                t.elapsed()
            );
        }
        // One thread in the stuck call, never a second.
        assert_eq!(gpus.reads_of(1), [false]);

        gpus.hang(&[]);
        let back = Instant::now() + Duration::from_secs(5);
        while r.answers.lock().unwrap().is_empty() && Instant::now() < back {
            std::thread::sleep(Duration::from_millis(5));
        }
        let c = r.read(5, 4, &NOT_DUE, HashMap::new(), WAIT);
        assert_eq!(
            answered(&c),
            [0, 1, 2, 3],
            "read again in the cycle it answered"
        );
        assert!(c.stuck.is_empty());
        assert_eq!(c.recovered.len(), 1);
        assert_eq!(c.recovered[0].0, 1);
        assert!(c.recovered[0].1 >= WAIT, "{:?}", c.recovered);
        // Its late reading was stale: the next one takes every reading afresh.
        assert_eq!(gpus.reads_of(1), [false, true]);
    }

    #[test]
    fn two_stuck_gpus_bound_the_cycle_to_two_waits_and_the_rest_is_read_next_cycle() {
        let gpus = Arc::new(Gpus::default());
        let mut r = readers(&gpus);
        gpus.hang(&[1, 2]);
        let acc = HashMap::from([(3, vec![("GPU-3".to_string(), 42)])]);
        let t = Instant::now();
        let c = r.read(1, 4, &NOT_DUE, acc, WAIT);
        let took = t.elapsed();
        assert!(took >= WAIT * 2 && took < WAIT * 3, "{took:?}");
        assert_eq!(answered(&c), [0]);
        let mut s: Vec<u32> = c.stuck.iter().map(|s| s.0).collect();
        s.sort_unstable();
        assert_eq!(s, [1, 2]);
        // GPU 3 was not begun: its accounting request waits for the next cycle.
        let c = r.read(2, 4, &NOT_DUE, HashMap::new(), WAIT);
        assert_eq!(answered(&c), [0, 3]);
        let a3 = c.answers.iter().find(|a| a.index == 3).unwrap();
        assert_eq!(a3.sample.name, r#"[("GPU-3", 42)]"#);
        gpus.hang(&[]);
    }

    fn ask(index: u32) -> Ask {
        let settings = Settings {
            crowded_list_interval: Duration::ZERO,
            accounting: false,
        };
        let xids = Arc::new(Mutex::new(Xids::new(None)));
        Ask {
            index,
            count: 4,
            state: Arc::new(Mutex::new(DeviceState::new(index, xids, &settings))),
            due: Due::default(),
            accounting: vec![],
        }
    }

    fn answer(index: u32, cycle: u64) -> Answer {
        Answer {
            index,
            cycle,
            sample: DeviceSample::default(),
            gpm: None,
        }
    }

    #[test]
    fn a_retire_finds_a_gpu_answered_or_in_hand_never_both() {
        let answers = Mutex::new(vec![]);
        let mut job = Job {
            asks: (0..3).map(ask).collect(),
            ..Job::default()
        };
        let a = job.next().unwrap();
        assert_eq!((a.index, job.on), (0, Some(0)));
        // The deadline right after GPU 0 answered, before GPU 1 is begun.
        job.done(Some(answer(0, 1)), &answers);
        let (on, left) = job.retire();
        assert_eq!(on, None, "an answered GPU is not stuck");
        assert_eq!(left.iter().map(|a| a.index).collect::<Vec<_>>(), [1, 2]);
        assert!(job.next().is_none(), "a retired reader begins nothing");

        let mut job = Job {
            asks: (0..2).map(ask).collect(),
            ..Job::default()
        };
        job.next();
        let (on, left) = job.retire();
        assert_eq!((on, left.len()), (Some(0), 1));
        // Its call returns: the answer still goes out, and nothing more is begun.
        job.done(Some(answer(0, 1)), &answers);
        assert!(job.next().is_none());
        assert_eq!(answers.lock().unwrap().len(), 2);
    }

    #[test]
    fn an_answer_frees_its_gpu_whatever_cycle_it_is_of() {
        let gpus = Arc::new(Gpus::default());
        let mut r = readers(&gpus);
        r.resize(2);
        let t = Instant::now();
        r.stuck = vec![Some(t), Some(t)];
        r.answers
            .lock()
            .unwrap()
            .extend([answer(0, 7), answer(1, 6)]);
        let now = r.take_answers(7);
        assert_eq!(now.iter().map(|a| a.index).collect::<Vec<_>>(), [0]);
        assert_eq!(r.stuck, [None, None]);
        assert_eq!(r.afresh, [true, true]);
        let back: Vec<u32> = r.recovered.iter().map(|x| x.0).collect();
        assert_eq!(back, [0, 1]);
    }
}
