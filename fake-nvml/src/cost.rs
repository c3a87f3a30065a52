//! An optional cost model. With `FAKE_NVML_COST=measured`, each call spins for about the CPU
//! time a real driver took for it (docs/validation: an H100 and an H200, driver 580), so that
//! a benchmark's NVML thread weighs its calls as on a real node: the driver spins, it does
//! not sleep. Off by default, where every call answers in about a microsecond.

use std::sync::OnceLock;

pub const ENV_COST: &str = "FAKE_NVML_COST";

/// The compute list's cost per process it lists, µs (3,286 µs for 64 on the H200, 142 for
/// none).
pub const PER_PROCESS_US: u64 = 49;

pub fn on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var(ENV_COST).is_ok_and(|v| v == "measured"))
}

/// CPU per call, µs, by function. Where nvml-wrapper makes two calls for one reading (the
/// size, then the data), the measured total is split between them.
pub fn per_call_us(name: &str) -> u64 {
    match name {
        "nvmlDeviceGetTotalEnergyConsumption" => 5_081,
        "nvmlDeviceGetProcessUtilization" => 850,
        "nvmlGpmSampleGet" | "nvmlGpmMetricsGet" => 800,
        "nvmlDeviceGetPcieReplayCounter" => 363,
        "nvmlDeviceGetMigMode" => 279,
        "nvmlDeviceGetFieldValues" => 74,
        n if n.starts_with("nvmlDeviceGetComputeRunningProcesses") => 71,
        n if n.starts_with("nvmlDeviceGetGraphicsRunningProcesses") => 29,
        n if n.starts_with("nvmlDeviceGetMemoryInfo") => 100,
        // The other calls: 4-46 µs each on the H100, 350 µs for 20 of them.
        _ => 17,
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
        assert_eq!(per_call_us("nvmlDeviceGetComputeRunningProcesses_v3"), 71);
        assert_eq!(per_call_us("nvmlDeviceGetUUID"), 17);
        let t0 = thread_cpu_ns();
        spend(2_000);
        let spent = thread_cpu_ns() - t0;
        assert!((2_000_000..50_000_000).contains(&spent), "{spent} ns");
    }
}
