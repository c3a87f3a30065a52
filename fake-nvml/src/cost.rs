//! An optional cost model. With `FAKE_NVML_COST=measured`, each call spins for about the CPU
//! time a real driver took for it (docs/validation: an H100 and an H200, driver 580), so that
//! a benchmark's NVML thread weighs its calls as on a real node: the driver spins, it does
//! not sleep. Off by default, where every call answers in about a microsecond.
//!
//! Where a reading takes two calls, a size query (a NULL buffer or a zero count) and then
//! the data call, and only their sum was measured, the model is conservative: the size query
//! costs what a cheap call does and the data call the rest. A change that skips size queries
//! is then credited with no more than a driver is sure to give.

use std::sync::OnceLock;

pub const ENV_COST: &str = "FAKE_NVML_COST";

/// The compute list's cost per process it lists, µs (3,286 µs for 64 on the H200, 142 for
/// none), charged on the data call.
pub const PER_PROCESS_US: u64 = 49;

/// A cheap call, and a size query: 4-46 µs each on the H100, 350 µs for 20 of them.
pub const SIZE_QUERY_US: u64 = 17;

pub fn on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var(ENV_COST).is_ok_and(|v| v == "measured"))
}

/// CPU per call, µs, by function; for a two-call reading, its data call (the size query
/// costs `SIZE_QUERY_US`, the measured total less that here).
pub fn per_call_us(name: &str) -> u64 {
    match name {
        "nvmlDeviceGetTotalEnergyConsumption" => 5_081,
        // 1.7 ms for both calls (1,589-1,897 µs over the runs).
        "nvmlDeviceGetProcessUtilization" => 1_700 - SIZE_QUERY_US,
        "nvmlGpmSampleGet" | "nvmlGpmMetricsGet" => 800,
        "nvmlDeviceGetPcieReplayCounter" => 363,
        "nvmlDeviceGetMigMode" => 279,
        "nvmlDeviceGetFieldValues" => 74,
        // 142 µs for both calls, plus `PER_PROCESS_US` a process listed.
        n if n.starts_with("nvmlDeviceGetComputeRunningProcesses") => 142 - SIZE_QUERY_US,
        // 58 µs for both calls.
        n if n.starts_with("nvmlDeviceGetGraphicsRunningProcesses") => 58 - SIZE_QUERY_US,
        n if n.starts_with("nvmlDeviceGetMemoryInfo") => 100,
        // The other calls: 4-46 µs each on the H100, 350 µs for 20 of them.
        _ => SIZE_QUERY_US,
    }
}

/// Spins for `us` of this thread's CPU time.
pub fn spend(us: u64) {
    if us == 0 {
        return;
    }
    let end = thread_cpu_ns() + us * 1_000;
    while thread_cpu_ns() < end {
        std::hint::spin_loop();
    }
}

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

fn thread_cpu_ns() -> u64 {
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer for the call.
    unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.sec as u64 * 1_000_000_000 + ts.nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_cost_what_the_driver_took_and_spending_takes_thread_cpu() {
        assert_eq!(per_call_us("nvmlDeviceGetTotalEnergyConsumption"), 5_081);
        assert_eq!(per_call_us("nvmlDeviceGetComputeRunningProcesses_v3"), 125);
        assert_eq!(
            per_call_us("nvmlDeviceGetProcessUtilization") + SIZE_QUERY_US,
            1_700,
            "the size query and the data call together: the measured total"
        );
        assert_eq!(per_call_us("nvmlDeviceGetUUID"), 17);
        let t0 = thread_cpu_ns();
        spend(2_000);
        let spent = thread_cpu_ns() - t0;
        assert!((2_000_000..50_000_000).contains(&spent), "{spent} ns");
    }
}
