//! One NVML call on one device, its error sorted: a metric the device does not support is
//! named (and absent, never 0), a lost device stops further calls, any other failure leaves
//! the value absent. Each call is recorded in its thread's `Progress` while it runs, so that
//! a call that does not return (a wedged driver) can be named by another thread.
use std::{
    cell::RefCell,
    sync::{
        atomic::{AtomicPtr, AtomicU64, Ordering::Relaxed},
        Arc,
    },
};

use nvml_wrapper::error::NvmlError;

/// What one thread is doing in NVML: the call in flight (none between calls), and how many
/// calls it has begun, so that another thread can tell one call that lasts from many. Each
/// call costs two plain stores (one thread writes; no clock is read: whoever watches times
/// it).
#[derive(Debug, Default)]
pub struct Progress {
    /// Points at the call's name (a `&'static &'static str`), or is null.
    call: AtomicPtr<&'static str>,
    begun: AtomicU64,
}

impl Progress {
    /// The call in flight, and the number of the last call begun.
    pub fn now(&self) -> (Option<&'static str>, u64) {
        let p = self.call.load(Relaxed);
        // SAFETY: only `in_call` stores here, and only pointers made from a
        // `&'static &'static str` (or null).
        let call = (!p.is_null()).then(|| unsafe { *p });
        (call, self.begun.load(Relaxed))
    }
}

thread_local! {
    static PROGRESS: RefCell<Option<Arc<Progress>>> = const { RefCell::new(None) };
}

/// This thread's NVML calls are recorded in `p` from now on.
pub fn track(p: Arc<Progress>) {
    PROGRESS.with(|t| *t.borrow_mut() = Some(p));
}

/// Runs `f`, one NVML call (or a few that belong together), recorded as `call` while it
/// runs on a thread that `track`s; the enclosing call's record comes back after it.
pub fn in_call<T>(call: &'static &'static str, f: impl FnOnce() -> T) -> T {
    let set = |to: *mut &'static str, begin: bool| {
        PROGRESS.with(|t| {
            let t = t.borrow();
            let p = t.as_ref()?;
            let outer = p.call.load(Relaxed);
            p.call.store(to, Relaxed);
            if begin {
                p.begun.store(p.begun.load(Relaxed) + 1, Relaxed);
            }
            Some(outer)
        })
    };
    let outer = set(std::ptr::from_ref(call).cast_mut(), true);
    let r = f();
    if let Some(outer) = outer {
        set(outer, false);
    }
    r
}

enum Metric<T> {
    Value(T),
    Unsupported,
    Lost,
    Failed,
}

fn metric<T>(r: Result<T, NvmlError>) -> Metric<T> {
    match r {
        Ok(v) => Metric::Value(v),
        Err(NvmlError::NotSupported) | Err(NvmlError::FunctionNotFound) => Metric::Unsupported,
        Err(NvmlError::FailedToLoadSymbol(_)) => Metric::Unsupported,
        Err(NvmlError::GpuLost) => Metric::Lost,
        Err(e) => {
            tracing::debug!("nvml: {e}");
            Metric::Failed
        }
    }
}

/// Reads metrics off one device: records the unsupported ones, and stops asking once the
/// device is lost.
pub struct Reader {
    pub(super) unsupported: Vec<&'static str>,
    pub(super) lost: bool,
}

impl Reader {
    pub fn read<T>(
        &mut self,
        name: &'static &'static str,
        call: impl FnOnce() -> Result<T, NvmlError>,
    ) -> Option<T> {
        if self.lost {
            return None;
        }
        match metric(in_call(name, call)) {
            Metric::Value(v) => Some(v),
            Metric::Unsupported => {
                self.unsupported.push(*name);
                None
            }
            Metric::Lost => {
                self.lost = true;
                None
            }
            Metric::Failed => None,
        }
    }
}
