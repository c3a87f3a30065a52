//! Calls that do not return while the scenario's `hang` list names them: a wedged driver
//! (a GPU fallen off the bus, XID 79), where every NVML call that touches the device
//! blocks, nvidia-smi included (docs/fake-nvml.md).
//!
//! Every exported function enters here first (`counted!`), which records the call's name
//! for this thread. Then, by the kind of call:
//! - init: while the scenario file names it, sleep and read the file again;
//! - a call that takes no device: while the loaded scenario names it, sleep and look
//!   again, picking up edits as any call does;
//! - a call on a device: `device` (under the state lock) answers [`BLOCKED`] while the
//!   loaded scenario names the call, or `"*"`, on that device, and `with_loaded` then
//!   releases the lock, sleeps and runs the call again from the start.
//!
//! No lock is held while a call sleeps, so calls on other devices, from other threads,
//! go on, and so do reloads.

use std::cell::Cell;
use std::time::{Duration, Instant};

use crate::state::{self, Loaded};
use crate::{calls, Ret};

/// How often a blocked call looks at the loaded scenario again (edits to the file are
/// still picked up at most every 100 ms).
pub const STEP: Duration = Duration::from_millis(25);

/// How often a blocked init reads the scenario file again.
const INIT_STEP: Duration = Duration::from_millis(50);

/// Answered under the state lock by a call that must block; never returned to C
/// (`with_loaded` sleeps and retries instead).
pub const BLOCKED: Ret = 0xB10C_B10C;

const INIT: [&str; 3] = ["nvmlInit_v2", "nvmlInit", "nvmlInitWithFlags"];

thread_local! {
    /// The exported function this thread is in.
    static CALL: Cell<&'static str> = const { Cell::new("") };
}

/// The first thing every exported function does after counting itself: remembers its
/// name for [`device`], and blocks here while the scenario hangs a call that takes no
/// device.
pub fn enter(call: &'static str) {
    CALL.with(|c| c.set(call));
    if INIT.contains(&call) {
        init_wait(call);
    } else if calls::NO_DEVICE.contains(&call) {
        loaded_wait(call);
    }
}

/// Init reads the file itself, as nothing is loaded yet. A file that fails to load ends
/// the wait, and init then reports why.
fn init_wait(call: &str) {
    let Some(path) = std::env::var_os(state::ENV_SCENARIO).filter(|p| !p.is_empty()) else {
        return;
    };
    while state::read_scenario(path.as_ref()).is_ok_and(|s| s.hangs(call, None)) {
        std::thread::sleep(INIT_STEP);
    }
}

/// Looks at the loaded scenario (after picking up edits) with the lock held, sleeps
/// without it.
fn loaded_wait(call: &str) {
    loop {
        {
            let mut st = state::lock();
            if !st.initialized() {
                return;
            }
            st.refresh(Instant::now());
            if !st.loaded().is_some_and(|l| l.scenario.hangs(call, None)) {
                return;
            }
        }
        std::thread::sleep(STEP);
    }
}

/// For a call on the device with NVML index `index`: `Err(BLOCKED)` while the scenario
/// hangs the current call, or every call, on it.
pub fn device(l: &Loaded, index: u32) -> Result<(), Ret> {
    if l.scenario.hang.is_empty() {
        return Ok(());
    }
    let call = CALL.with(Cell::get);
    if l.scenario.hangs(call, Some(index)) {
        Err(BLOCKED)
    } else {
        Ok(())
    }
}

/// The first statement of every exported function (a test checks that): counts the call,
/// then enters `hang`, which blocks while the scenario hangs it. Here, beside `enter`, so
/// that the call counts (calls.rs) know nothing of the hangs.
macro_rules! counted {
    () => {
        counted!(size_query = false)
    };
    // A size query (a NULL buffer or a zero count, asking how many entries there are) is
    // charged as a cheap call; the data call the rest (`cost`).
    (size_query = $size:expr) => {{
        fn f() {}
        static COUNTER: $crate::calls::Counter = $crate::calls::Counter::new();
        $crate::hang::enter(COUNTER.hit(|| std::any::type_name_of_val(&f), $size));
    }};
}

#[cfg(test)]
mod tests {
    use crate::scenario::Scenario;

    #[test]
    fn entries_match_by_call_and_device() {
        let s = Scenario::parse(
            r#"{"devices":[{"uuid":"GPU-a"},{"uuid":"GPU-b"}],"hang":[
                {"call":"nvmlDeviceGetPowerUsage","device":1},
                {"call":"*","device":0},
                {"call":"nvmlDeviceGetTemperature"},
                {"call":"nvmlDeviceGetCount_v2"}]}"#,
        )
        .unwrap();
        assert!(s.hangs("nvmlDeviceGetPowerUsage", Some(1)));
        // "*" on device 0: every per-device call there.
        assert!(s.hangs("nvmlDeviceGetPowerUsage", Some(0)));
        assert!(s.hangs("nvmlDeviceGetUUID", Some(0)));
        assert!(!s.hangs("nvmlDeviceGetUUID", Some(1)));
        // No device: every device.
        assert!(s.hangs("nvmlDeviceGetTemperature", Some(1)));
        assert!(s.hangs("nvmlDeviceGetCount_v2", None));
        assert!(!s.hangs("nvmlDeviceGetCount", None));
        // "*" is about devices, not the calls that take none.
        assert!(!s.hangs("nvmlSystemGetDriverVersion", None));
    }

    #[test]
    fn unknown_calls_and_devices_are_rejected() {
        let bad = [
            r#"{"hang":[{"call":"nvmlDeviceGetPowerUsag"}]}"#,
            r#"{"hang":[{"call":"nvmlDeviceGetPowerUsage","device":0}]}"#,
            r#"{"devices":[{"uuid":"GPU-a"}],"hang":[{"call":"*","device":0,"typo":1}]}"#,
            r#"{"hang":[{"device":0}]}"#,
        ];
        for text in bad {
            assert!(Scenario::parse(text).is_err(), "{text}");
        }
        // A call without a device may name one; it does not apply.
        Scenario::parse(r#"{"hang":[{"call":"nvmlInit_v2","device":5}]}"#).unwrap();
    }
}
