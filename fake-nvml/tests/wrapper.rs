//! Loads the built libnvidia_ml.so through nvml-wrapper, as the agent does.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use serde_json::{json, Value};

/// The library keeps one scenario per process: tests take turns.
static LOCK: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Longer than the library's 100 ms recheck interval.
const RELOAD_WAIT: Duration = Duration::from_millis(250);

/// `cargo test` builds the .so into target/<profile>/deps/, beside this test
/// binary (the crate is also an rlib for that); `cargo build` also copies it
/// to target/<profile>/. deps/ first: the copy may be older.
fn lib_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    let candidates = [
        Some(deps.join("libnvidia_ml.so")),
        deps.parent().map(|p| p.join("libnvidia_ml.so")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "libnvidia_ml.so not found near {}: run `cargo build -p fake-nvml` first",
                exe.display()
            )
        })
}

fn scenario_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/scenarios")
        .join(name)
}

fn load_json(name: &str) -> Value {
    let text = std::fs::read_to_string(scenario_path(name)).expect("scenario file");
    serde_json::from_str(&text).expect("scenario json")
}

/// A scenario file in a temp dir that tests can rewrite mid-run.
struct TempScenario(PathBuf);

impl TempScenario {
    fn new(tag: &str, v: &Value) -> Self {
        let p =
            std::env::temp_dir().join(format!("fake-nvml-test-{}-{tag}.json", std::process::id()));
        let s = TempScenario(p);
        s.write(v);
        s
    }

    /// Write-then-rename, so the library never reads a half-written file.
    fn write_text(&self, text: &str) {
        let tmp = self.0.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.0).unwrap();
    }

    fn write(&self, v: &Value) {
        self.write_text(&serde_json::to_string_pretty(v).unwrap());
    }
}

impl Drop for TempScenario {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn init_with(scenario: Option<&Path>) -> Result<Nvml, NvmlError> {
    match scenario {
        Some(p) => std::env::set_var("FAKE_NVML_SCENARIO", p),
        None => std::env::remove_var("FAKE_NVML_SCENARIO"),
    }
    let lib = lib_path();
    Nvml::builder().lib_path(lib.as_os_str()).init()
}

fn init(scenario: &Path) -> Nvml {
    init_with(Some(scenario)).expect("nvml init")
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

fn pids(procs: &[nvml_wrapper::struct_wrappers::device::ProcessInfo]) -> Vec<u32> {
    procs.iter().map(|p| p.pid).collect()
}

fn u64_of(v: &Value) -> u64 {
    v.as_u64().expect("number")
}

#[test]
fn h100_inventory_and_metrics() {
    let _g = serial();
    let spec = load_json("h100-8gpu.json");
    let nvml = init(&scenario_path("h100-8gpu.json"));

    assert_eq!(nvml.sys_driver_version().unwrap(), "580.159.04");
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 13000);
    assert_eq!(nvml.device_count().unwrap(), 8);

    for (i, d) in spec["devices"].as_array().unwrap().iter().enumerate() {
        let dev = nvml.device_by_index(i as u32).unwrap();
        assert_eq!(dev.uuid().unwrap(), d["uuid"].as_str().unwrap());
        assert!(dev.uuid().unwrap().starts_with("GPU-"));
        assert_eq!(dev.name().unwrap(), "NVIDIA H100 80GB HBM3");
        assert_eq!(dev.index().unwrap(), i as u32);

        let mem = dev.memory_info().unwrap();
        assert_eq!(mem.total, 85_520_809_984);
        assert_eq!(mem.used, u64_of(&d["memory_used"]));
        assert_eq!(mem.free, mem.total - mem.used);
        assert_eq!(mem.reserved, 0);

        let pci = dev.pci_info().unwrap();
        assert_eq!(pci.bus_id, d["pci_bus_id"].as_str().unwrap());
        assert_eq!(pci.pci_device_id, 0x2330_10DE);

        let util = dev.utilization_rates().unwrap();
        assert_eq!(u64::from(util.gpu), u64_of(&d["utilization_gpu"]));
        assert_eq!(u64::from(util.memory), u64_of(&d["utilization_memory"]));
        assert_eq!(
            u64::from(dev.power_usage().unwrap()),
            u64_of(&d["power_mw"])
        );
        assert!(dev.total_energy_consumption().unwrap() >= u64_of(&d["energy_mj"]));
        assert_eq!(
            u64::from(dev.temperature(TemperatureSensor::Gpu).unwrap()),
            u64_of(&d["temperature_c"])
        );
        assert_eq!(
            u64::from(dev.clock_info(Clock::SM).unwrap()),
            u64_of(&d["sm_clock_mhz"])
        );
        assert_eq!(dev.clock_info(Clock::Memory).unwrap(), 2619);
        assert_eq!(dev.mig_mode().unwrap().current, 0);
        assert_eq!(dev.mig_device_count().unwrap(), 0);
        assert!(!dev.mig_is_mig_device_handle().unwrap());
        assert_eq!(
            dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                .unwrap(),
            0
        );
    }

    let gpu0 = nvml.device_by_index(0).unwrap();
    assert!(gpu0
        .current_throttle_reasons()
        .unwrap()
        .contains(ThrottleReasons::SW_POWER_CAP));
    let gpu4 = nvml.device_by_index(4).unwrap();
    assert_eq!(
        gpu4.current_throttle_reasons().unwrap(),
        ThrottleReasons::GPU_IDLE
    );
    let gpu3 = nvml.device_by_index(3).unwrap();
    let ecc = |kind, counter| gpu3.total_ecc_errors(kind, counter).unwrap();
    assert_eq!(ecc(MemoryError::Corrected, EccCounter::Aggregate), 2);
    assert_eq!(ecc(MemoryError::Corrected, EccCounter::Volatile), 0);

    // The energy counter grows with power_mw (about 690 J/s on GPU 0).
    let e1 = gpu0.total_energy_consumption().unwrap();
    sleep(Duration::from_millis(50));
    let e2 = gpu0.total_energy_consumption().unwrap();
    assert!(e2 > e1, "{e1} -> {e2}");

    let uuid5 = spec["devices"][5]["uuid"].as_str().unwrap();
    assert_eq!(nvml.device_by_uuid(uuid5).unwrap().index().unwrap(), 5);
    let by_bus = nvml.device_by_pci_bus_id("00000000:9A:00.0").unwrap();
    assert_eq!(by_bus.index().unwrap(), 4);
    assert!(matches!(
        nvml.device_by_index(8),
        Err(NvmlError::InvalidArg)
    ));
    assert_eq!(nvml.sys_nvml_version().unwrap(), "13.580.159.04");
    assert_eq!(gpu3.minor_number().unwrap(), 3);

    // Init is reference-counted: shutting a second handle down keeps the first.
    let second = init(&scenario_path("h100-8gpu.json"));
    second.shutdown().unwrap();
    assert_eq!(nvml.device_count().unwrap(), 8);
}

#[test]
fn processes_and_utilization_samples() {
    let _g = serial();
    let spec = load_json("h100-8gpu.json");
    let nvml = init(&scenario_path("h100-8gpu.json"));

    let gpu2 = nvml.device_by_index(2).unwrap();
    let procs = gpu2.running_compute_processes().unwrap();
    assert_eq!(pids(&procs), [1201, 1202]);
    for (p, want) in procs
        .iter()
        .zip(spec["devices"][2]["processes"].as_array().unwrap())
    {
        assert_eq!(
            p.used_gpu_memory,
            UsedGpuMemory::Used(u64_of(&want["used_memory"]))
        );
        assert_eq!(p.gpu_instance_id, None);
        assert_eq!(p.compute_instance_id, None);
    }
    assert!(gpu2.running_graphics_processes().unwrap().is_empty());
    assert_eq!(gpu2.running_compute_processes_count().unwrap(), 2);

    let before = now_us();
    let samples = gpu2.process_utilization_stats(None).unwrap();
    assert_eq!(samples.len(), 2);
    assert_eq!(
        (samples[0].pid, samples[0].sm_util, samples[0].mem_util),
        (1201, 40, 18)
    );
    assert_eq!(
        (samples[1].pid, samples[1].sm_util, samples[1].mem_util),
        (1202, 31, 15)
    );
    assert!(samples[0].timestamp >= before);
    // Nothing newer than the last sample, or a future lastSeen: NOT_FOUND.
    let future = now_us() + 3_600_000_000;
    assert!(matches!(
        gpu2.process_utilization_stats(future),
        Err(NvmlError::NotFound)
    ));
    sleep(Duration::from_millis(2));
    let newer = gpu2
        .process_utilization_stats(samples[0].timestamp)
        .unwrap();
    assert_eq!(newer.len(), 2);

    let idle = nvml.device_by_index(4).unwrap();
    assert!(idle.running_compute_processes().unwrap().is_empty());
    assert!(matches!(
        idle.process_utilization_stats(None),
        Err(NvmlError::NotFound)
    ));

    let ts = init(&scenario_path("timesliced.json"));
    let a10 = ts.device_by_index(0).unwrap();
    assert_eq!(a10.name().unwrap(), "NVIDIA A10G");
    assert_eq!(
        pids(&a10.running_compute_processes().unwrap()),
        [3001, 3002, 3003, 3004, 3005]
    );
    // The idle process has no sample.
    let samples = a10.process_utilization_stats(None).unwrap();
    let sampled: Vec<u32> = samples.iter().map(|s| s.pid).collect();
    assert_eq!(sampled, [3001, 3002, 3003, 3004]);
    assert_eq!(samples[3].dec_util, 12);
    assert!(matches!(a10.mig_mode(), Err(NvmlError::NotSupported)));
}

#[test]
fn lost_gpu_and_unsupported_metrics() {
    let _g = serial();
    let mut spec = load_json("h100-8gpu.json");
    spec["devices"][1]["lost"] = json!(true);
    spec["devices"][2]["unsupported"] = json!([
        "power_usage",
        "ecc",
        "process_utilization",
        "energy",
        "temperature"
    ]);
    let file = TempScenario::new("lost", &spec);
    let nvml = init(&file.0);

    assert_eq!(nvml.device_count().unwrap(), 8);
    let lost = nvml
        .device_by_index(1)
        .expect("a lost GPU still has a handle");
    assert!(matches!(lost.uuid(), Err(NvmlError::GpuLost)));
    assert!(matches!(lost.memory_info(), Err(NvmlError::GpuLost)));
    assert!(matches!(
        lost.running_compute_processes(),
        Err(NvmlError::GpuLost)
    ));
    assert!(matches!(lost.power_usage(), Err(NvmlError::GpuLost)));
    assert!(matches!(
        lost.process_utilization_stats(None),
        Err(NvmlError::GpuLost)
    ));

    let ok = nvml.device_by_index(0).unwrap();
    assert_eq!(
        ok.uuid().unwrap(),
        spec["devices"][0]["uuid"].as_str().unwrap()
    );
    assert_eq!(pids(&ok.running_compute_processes().unwrap()), [1001]);

    let partial = nvml.device_by_index(2).unwrap();
    assert!(matches!(
        partial.power_usage(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        partial.total_energy_consumption(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        partial.temperature(TemperatureSensor::Gpu),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        partial.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        partial.process_utilization_stats(None),
        Err(NvmlError::NotSupported)
    ));
    // Everything else on it still answers.
    assert_eq!(partial.running_compute_processes().unwrap().len(), 2);
    assert!(partial.memory_info().is_ok());
    assert!(partial.clock_info(Clock::SM).is_ok());
}

fn raw_instance_ids(nvml: &Nvml, dev: &Device) -> (u32, u32) {
    let (mut gi, mut ci) = (0, 0);
    // SAFETY: a live handle from this Nvml; nvml-wrapper has no wrapper for these.
    unsafe {
        let h = dev.handle();
        assert_eq!(nvml.lib().nvmlDeviceGetGpuInstanceId(h, &mut gi), 0);
        assert_eq!(nvml.lib().nvmlDeviceGetComputeInstanceId(h, &mut ci), 0);
    }
    (gi, ci)
}

/// GPU instance `gi` of `parent` (`nvmlDeviceGetGpuInstanceById`, `nvmlGpuInstanceGetInfo`):
/// (id, profile id, placement start, size), or the first call's error.
fn raw_gpu_instance(nvml: &Nvml, parent: &Device, gi: u32) -> Result<(u32, u32, u32, u32), u32> {
    use nvml_wrapper_sys::bindings::{nvmlGpuInstanceInfo_t, nvmlGpuInstance_t};
    let mut h: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: a plain C struct; all-zero is a valid value.
    let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: live handles from this Nvml; valid out-pointers.
    unsafe {
        let r = nvml
            .lib()
            .nvmlDeviceGetGpuInstanceById(parent.handle(), gi, &mut h);
        if r != 0 {
            return Err(r);
        }
        assert_eq!(nvml.lib().nvmlGpuInstanceGetInfo(h, &mut info), 0);
        assert_eq!(info.device, parent.handle());
    }
    let p = info.placement;
    Ok((info.id, info.profileId, p.start, p.size))
}

#[test]
fn mig_enumeration_and_processes() {
    let _g = serial();
    let spec = load_json("a100-mig.json");
    let nvml = init(&scenario_path("a100-mig.json"));
    assert_eq!(nvml.device_count().unwrap(), 2);

    let parent = nvml.device_by_index(0).unwrap();
    let parent_uuid = parent.uuid().unwrap();
    let mode = parent.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (1, 1));
    assert_eq!(parent.mig_device_count().unwrap(), 7);
    assert!(!parent.mig_is_mig_device_handle().unwrap());

    let want = spec["devices"][0]["mig_devices"].as_array().unwrap();
    let mut migs = Vec::new();
    for i in 0..parent.mig_device_count().unwrap() {
        match parent.mig_device_by_index(i) {
            Ok(m) => migs.push(m),
            Err(NvmlError::NotFound) => {}
            Err(e) => panic!("mig {i}: {e}"),
        }
    }
    assert_eq!(migs.len(), 3);
    assert!(matches!(
        parent.mig_device_by_index(7),
        Err(NvmlError::InvalidArg)
    ));

    for (i, (m, w)) in migs.iter().zip(want).enumerate() {
        assert_eq!(m.uuid().unwrap(), w["uuid"].as_str().unwrap());
        assert!(m.uuid().unwrap().starts_with("MIG-"));
        assert_eq!(m.name().unwrap(), w["name"].as_str().unwrap());
        assert!(m.mig_is_mig_device_handle().unwrap());
        assert_eq!(m.mig_parent_device().unwrap().uuid().unwrap(), parent_uuid);
        assert_eq!(m.index().unwrap(), i as u32);
        let mem = m.memory_info().unwrap();
        assert_eq!(mem.total, u64_of(&w["memory_total"]));
        assert_eq!(mem.used, u64_of(&w["memory_used"]));
        let ids = raw_instance_ids(&nvml, m);
        assert_eq!(
            ids,
            (
                u64_of(&w["gpu_instance_id"]) as u32,
                u64_of(&w["compute_instance_id"]) as u32
            )
        );
        let procs = m.running_compute_processes().unwrap();
        let want_pids: Vec<u32> = w["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| u64_of(&p["pid"]) as u32)
            .collect();
        assert_eq!(pids(&procs), want_pids);
        for p in &procs {
            assert_eq!(
                (p.gpu_instance_id, p.compute_instance_id),
                (Some(ids.0), Some(ids.1))
            );
        }
        // MIG handles have no per-process or whole-device utilization.
        assert!(matches!(
            m.process_utilization_stats(None),
            Err(NvmlError::NotSupported)
        ));
        assert!(matches!(
            m.utilization_rates(),
            Err(NvmlError::NotSupported)
        ));
        assert!(matches!(m.power_usage(), Err(NvmlError::NotSupported)));
    }
    // Same handle by MIG uuid.
    let by_uuid = nvml
        .device_by_uuid(want[1]["uuid"].as_str().unwrap())
        .unwrap();
    assert_eq!(raw_instance_ids(&nvml, &by_uuid), (3, 0));
    // Each GPU instance's profile id and placement: the driver's for its profile, packed
    // in order where the scenario gives none (3g.40gb, 2g.20gb, 1g.10gb).
    let gis: Vec<_> = [2, 3, 9]
        .into_iter()
        .map(|gi| raw_gpu_instance(&nvml, &parent, gi))
        .collect();
    assert_eq!(
        gis,
        [Ok((2, 9, 0, 4)), Ok((3, 14, 4, 2)), Ok((9, 19, 6, 1))]
    );
    assert_eq!(
        raw_gpu_instance(&nvml, &parent, 4),
        Err(6),
        "no such instance"
    );
    assert_eq!(raw_gpu_instance(&nvml, &migs[0], 2), Err(3), "a MIG handle");

    // The parent lists all MIG processes with their instance ids.
    let all = parent.running_compute_processes().unwrap();
    let tagged: Vec<(u32, Option<u32>)> = all.iter().map(|p| (p.pid, p.gpu_instance_id)).collect();
    assert_eq!(tagged, [(2001, Some(2)), (2101, Some(3)), (2102, Some(3))]);
    assert!(matches!(
        parent.process_utilization_stats(None),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        parent.utilization_rates(),
        Err(NvmlError::NotSupported)
    ));
    assert!(parent.power_usage().unwrap() > 0);

    // GPU 1 has MIG disabled.
    let plain = nvml.device_by_index(1).unwrap();
    assert_eq!(plain.mig_mode().unwrap().current, 0);
    assert_eq!(plain.mig_device_count().unwrap(), 0);
    assert!(matches!(
        plain.mig_device_by_index(0),
        Err(NvmlError::InvalidArg)
    ));
    let procs = plain.running_compute_processes().unwrap();
    assert_eq!(pids(&procs), [2201]);
    assert_eq!(procs[0].gpu_instance_id, None);
    assert_eq!(plain.process_utilization_stats(None).unwrap().len(), 1);
}

#[test]
fn init_fails_without_a_usable_scenario() {
    let _g = serial();
    assert!(matches!(init_with(None), Err(NvmlError::DriverNotLoaded)));
    let missing = std::env::temp_dir().join("fake-nvml-test-does-not-exist.json");
    assert!(matches!(
        init_with(Some(&missing)),
        Err(NvmlError::DriverNotLoaded)
    ));

    let file = TempScenario::new("broken", &json!({}));
    file.write_text("{ not json");
    assert!(matches!(
        init_with(Some(&file.0)),
        Err(NvmlError::DriverNotLoaded)
    ));
    file.write(&json!({"driver_loaded": false, "devices": []}));
    assert!(matches!(
        init_with(Some(&file.0)),
        Err(NvmlError::DriverNotLoaded)
    ));
    // A typo in a key is rejected, not ignored.
    file.write(&json!({"devices": [{"uuid": "GPU-x", "memory_totl": 1}]}));
    assert!(matches!(
        init_with(Some(&file.0)),
        Err(NvmlError::DriverNotLoaded)
    ));
    // A node with the driver but no GPUs.
    file.write(&json!({"devices": []}));
    let nvml = init_with(Some(&file.0)).unwrap();
    assert_eq!(nvml.device_count().unwrap(), 0);
}

#[test]
fn scenario_edits_are_picked_up_mid_run() {
    let _g = serial();
    let mut spec = load_json("timesliced.json");
    let file = TempScenario::new("reload", &spec);
    let nvml = init(&file.0);
    let dev = nvml.device_by_index(0).unwrap();
    assert_eq!(dev.running_compute_processes().unwrap().len(), 5);
    let energy_before = dev.total_energy_consumption().unwrap();

    // A new process starts.
    spec["devices"][0]["processes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"pid": 3006, "used_memory": 1_073_741_824u64, "sm_util": 5}));
    spec["devices"][0]["power_mw"] = json!(95_000);
    file.write(&spec);
    sleep(RELOAD_WAIT);
    let procs = dev.running_compute_processes().unwrap();
    assert_eq!(procs.last().unwrap().pid, 3006);
    assert_eq!(dev.power_usage().unwrap(), 95_000);
    // The energy counter carries over the reload instead of restarting.
    assert!(dev.total_energy_consumption().unwrap() >= energy_before);

    // A broken write keeps the previous scenario.
    file.write_text("{ half a file");
    sleep(RELOAD_WAIT);
    assert_eq!(dev.running_compute_processes().unwrap().len(), 6);

    // The GPU falls off the bus.
    spec["devices"][0]["lost"] = json!(true);
    file.write(&spec);
    sleep(RELOAD_WAIT);
    assert!(matches!(dev.memory_info(), Err(NvmlError::GpuLost)));
    assert!(matches!(
        dev.running_compute_processes(),
        Err(NvmlError::GpuLost)
    ));
    assert_eq!(nvml.device_count().unwrap(), 1);
}

#[test]
fn mps_processes_and_accounting_stats() {
    let _g = serial();
    let mut v = load_json("mps.json");
    v["devices"][0]["accounting"] = json!([
        {"pid": 4100, "gpu_util": 64, "mem_util": 20, "max_memory": 2147483648u64,
         "time_ms": 300, "start_time_us": 1_700_000_000_000_000u64}
    ]);
    let sc = TempScenario::new("mps", &v);
    let nvml = init(&sc.0);
    let gpu = nvml.device_by_index(0).unwrap();
    assert_eq!(
        pids(&gpu.running_compute_processes().unwrap()),
        [4000, 4001]
    );
    let mps = gpu.mps_running_compute_processes().unwrap();
    assert_eq!(pids(&mps), [4001, 4002, 4003]);
    assert_eq!(mps[2].used_gpu_memory, UsedGpuMemory::Used(6442450944));
    // Utilization samples cover the MPS clients, each pid once.
    let sampled: Vec<u32> = gpu
        .process_utilization_stats(None)
        .unwrap()
        .iter()
        .map(|s| s.pid)
        .collect();
    assert_eq!(sampled, [4001, 4002, 4003]);
    // The server counts once, a client listed twice once.
    let used = gpu.memory_info().unwrap().used;
    assert_eq!(used, 318767104 + 8589934592 + 4294967296 + 6442450944);

    assert!(gpu.is_accounting_enabled().unwrap());
    assert_eq!(
        gpu.accounting_pids().unwrap(),
        [4000, 4001, 4002, 4003, 4100]
    );
    let s = gpu.accounting_stats_for(4100).unwrap();
    assert_eq!(
        (s.gpu_utilization, s.memory_utilization, s.max_memory_usage),
        (Some(64), Some(20), Some(2147483648))
    );
    assert_eq!(
        (s.time, s.start_time, s.is_running),
        (300, 1_700_000_000_000_000, false)
    );
    let running = gpu.accounting_stats_for(4003).unwrap();
    assert!(running.is_running);
    assert_eq!(running.time, 0);
    assert!(matches!(
        gpu.accounting_stats_for(9),
        Err(NvmlError::NotFound)
    ));

    // Accounting off: the mode says so and the lists are NOT_SUPPORTED, as documented.
    v["devices"][0]["accounting_mode"] = json!(false);
    sc.write(&v);
    sleep(RELOAD_WAIT);
    assert!(!gpu.is_accounting_enabled().unwrap());
    assert!(matches!(
        gpu.accounting_pids(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        gpu.accounting_stats_for(4100),
        Err(NvmlError::NotSupported)
    ));
}

/// Runs `f` on a thread of its own; the channel bounds a test's wait for a call that
/// may block.
fn on_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx
}

fn still_blocked<T: std::fmt::Debug>(rx: &mpsc::Receiver<T>, wait: Duration) {
    match rx.recv_timeout(wait) {
        Err(RecvTimeoutError::Timeout) => {}
        other => panic!("the call returned while hung: {other:?}"),
    }
}

/// Writes `spec` (the scenario without its `hang`) back when dropped, so that a test
/// that fails still lifts its hang and its blocked threads end.
struct RestoreOnDrop<'a> {
    file: &'a TempScenario,
    spec: Value,
}

impl Drop for RestoreOnDrop<'_> {
    fn drop(&mut self) {
        self.file.write(&self.spec);
        if std::thread::panicking() {
            // Give blocked calls time to see it before the file goes.
            sleep(RELOAD_WAIT);
        }
    }
}

#[test]
fn a_hung_call_blocks_on_its_device_until_the_entry_goes() {
    let _g = serial();
    let mut spec = load_json("h100-8gpu.json");
    let file = TempScenario::new("hang-call", &spec);
    let nvml = Arc::new(init(&file.0));
    let _restore = RestoreOnDrop {
        file: &file,
        spec: spec.clone(),
    };

    // GPU 1's power reading wedges mid-run.
    spec["hang"] = json!([{"call": "nvmlDeviceGetPowerUsage", "device": 1}]);
    file.write(&spec);
    sleep(RELOAD_WAIT);
    let n = Arc::clone(&nvml);
    let hung = on_thread(move || n.device_by_index(1).and_then(|d| d.power_usage()));
    still_blocked(&hung, Duration::from_millis(400));

    // Meanwhile the same call on GPU 0, and another call on GPU 1, answer at once
    // from other threads.
    let n = Arc::clone(&nvml);
    let gpu0 = on_thread(move || n.device_by_index(0).and_then(|d| d.power_usage()));
    let answer = gpu0.recv_timeout(Duration::from_secs(2));
    assert_eq!(answer.expect("GPU 0 answers").unwrap(), 688_494);
    let n = Arc::clone(&nvml);
    let temp = on_thread(move || {
        n.device_by_index(1)
            .and_then(|d| d.temperature(TemperatureSensor::Gpu))
    });
    let answer = temp.recv_timeout(Duration::from_secs(2));
    assert_eq!(answer.expect("GPU 1's temperature answers").unwrap(), 64);
    still_blocked(&hung, Duration::ZERO);

    // The entry goes and the reading changes. Nothing else calls NVML meanwhile: the
    // blocked call itself picks up the edit, and answers from it.
    spec.as_object_mut().unwrap().remove("hang");
    spec["devices"][1]["power_mw"] = json!(321_000);
    let lifted = Instant::now();
    file.write(&spec);
    let answer = hung.recv_timeout(Duration::from_secs(2));
    assert_eq!(
        answer.expect("unblocked once the entry is gone").unwrap(),
        321_000
    );
    assert!(
        lifted.elapsed() < Duration::from_secs(1),
        "{:?}",
        lifted.elapsed()
    );
}

#[test]
fn a_star_entry_blocks_every_call_on_its_device() {
    let _g = serial();
    let mut spec = load_json("h100-8gpu.json");
    let file = TempScenario::new("hang-star", &spec);
    let nvml = Arc::new(init(&file.0));
    let _restore = RestoreOnDrop {
        file: &file,
        spec: spec.clone(),
    };

    // A thread holds GPU 1's handle from before the GPU falls off the bus.
    let (ready_tx, ready) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    let n = Arc::clone(&nvml);
    let hung = on_thread(move || {
        let d = n.device_by_index(1)?;
        let _ = ready_tx.send(());
        let _ = go_rx.recv_timeout(Duration::from_secs(5));
        d.memory_info().map(|m| m.used)
    });
    ready
        .recv_timeout(Duration::from_secs(2))
        .expect("GPU 1's handle");
    spec["hang"] = json!([{"call": "*", "device": 1}]);
    file.write(&spec);
    sleep(RELOAD_WAIT);
    go.send(()).unwrap();
    still_blocked(&hung, Duration::from_millis(400));
    // Looking the device up is a call on it too.
    let n = Arc::clone(&nvml);
    let lookup = on_thread(move || n.device_by_index(1).and_then(|d| d.uuid()));
    still_blocked(&lookup, Duration::from_millis(200));

    // GPU 0 and the calls on no device answer.
    let n = Arc::clone(&nvml);
    let gpu0 = on_thread(move || {
        let used = n.device_by_index(0)?.memory_info()?.used;
        Ok::<_, NvmlError>((used, n.device_count()?))
    });
    let answer = gpu0.recv_timeout(Duration::from_secs(2));
    let used0 = u64_of(&spec["devices"][0]["memory_used"]);
    assert_eq!(answer.expect("GPU 0 answers").unwrap(), (used0, 8));

    spec.as_object_mut().unwrap().remove("hang");
    file.write(&spec);
    let answer = hung.recv_timeout(Duration::from_secs(2));
    let used1 = u64_of(&spec["devices"][1]["memory_used"]);
    assert_eq!(answer.expect("memory_info unblocked").unwrap(), used1);
    let answer = lookup.recv_timeout(Duration::from_secs(2));
    let uuid1 = spec["devices"][1]["uuid"].as_str().unwrap();
    assert_eq!(answer.expect("lookup unblocked").unwrap(), uuid1);
}

#[test]
fn a_hung_init_returns_once_the_entry_goes() {
    let _g = serial();
    let mut spec = load_json("timesliced.json");
    let file = TempScenario::new("hang-init", &spec);
    let _restore = RestoreOnDrop {
        file: &file,
        spec: spec.clone(),
    };
    spec["hang"] = json!([{"call": "nvmlInit_v2"}]);
    file.write(&spec);

    std::env::set_var("FAKE_NVML_SCENARIO", &file.0);
    let lib = lib_path();
    let init = on_thread(move || {
        Nvml::builder()
            .lib_path(lib.as_os_str())
            .init()
            .and_then(|nvml| nvml.device_count())
    });
    still_blocked(&init, Duration::from_millis(400));

    spec.as_object_mut().unwrap().remove("hang");
    file.write(&spec);
    let answer = init.recv_timeout(Duration::from_secs(2));
    assert_eq!(answer.expect("init unblocked").unwrap(), 1);
}

/// `nvmlDeviceGetGpuInstanceProfileInfoV` with the version nvml.h's
/// `nvmlGpuInstanceProfileInfo_v2` macro gives, or `version`.
fn profile_info_v(
    nvml: &Nvml,
    dev: &Device,
    profile: u32,
    version: Option<u32>,
) -> Result<nvml_wrapper_sys::bindings::nvmlGpuInstanceProfileInfo_v2_t, u32> {
    use nvml_wrapper_sys::bindings::nvmlGpuInstanceProfileInfo_v2_t as Info;
    // SAFETY: a plain C struct; all-zero is valid.
    let mut info: Info = unsafe { std::mem::zeroed() };
    info.version = version.unwrap_or(std::mem::size_of::<Info>() as u32 | (2 << 24));
    // SAFETY: a live handle from this Nvml; a valid out-pointer.
    let ret = unsafe {
        nvml.lib()
            .nvmlDeviceGetGpuInstanceProfileInfoV(dev.handle(), profile, &mut info)
    };
    if ret == 0 {
        Ok(info)
    } else {
        Err(ret)
    }
}

#[test]
fn gpu_instance_profiles_follow_nvml_h() {
    let _g = serial();
    let profile = |profile: u32, id: u32, name: &str, slices: u32, memory_mib: u64| {
        json!({"profile": profile, "id": id, "name": name, "slices": slices,
               "instances": 7, "multiprocessors": 16 * slices, "memory_mib": memory_mib})
    };
    let sc = TempScenario::new(
        "mig-profiles",
        &json!({"devices": [
            {"uuid": "GPU-h100", "mig_profiles": [
                profile(0, 19, "MIG 1g.10gb", 1, 9984),
                profile(7, 20, "MIG 1g.10gb+me", 1, 9984),
                profile(4, 0, "MIG 7g.80gb", 7, 81152)]},
            {"uuid": "GPU-l4", "name": "NVIDIA L4", "unsupported": ["mig"]},
            {"uuid": "GPU-h100-bare"},
            {"uuid": "GPU-h100-mig", "mig_devices": [
                {"uuid": "MIG-a", "gpu_instance_id": 1, "memory_total": 1}],
             "mig_profiles": [profile(0, 19, "MIG 1g.10gb", 1, 9984)]}
        ]}),
    );
    let nvml = init(&sc.0);
    let h100 = nvml.device_by_index(0).unwrap();
    let info = profile_info_v(&nvml, &h100, 0, None).unwrap();
    let name: Vec<u8> = info
        .name
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    assert_eq!(String::from_utf8(name).unwrap(), "MIG 1g.10gb");
    assert_eq!((info.id, info.sliceCount, info.instanceCount), (19, 1, 7));
    assert_eq!((info.multiprocessorCount, info.memorySizeMB), (16, 9984));
    let whole = profile_info_v(&nvml, &h100, 4, None).unwrap();
    assert_eq!((whole.sliceCount, whole.memorySizeMB), (7, 81152));
    // The v1 call answers the same profile, without a name.
    let v1 = h100.profile_info(7).unwrap();
    assert_eq!((v1.id, v1.slice_count, v1.memory_size_mb), (20, 1, 9984));
    // A profile this GPU lacks: NOT_SUPPORTED (3); one nvml.h does not define (17 and on):
    // INVALID_ARGUMENT (2); a version other than v2's: ARGUMENT_VERSION_MISMATCH (25).
    assert_eq!(profile_info_v(&nvml, &h100, 1, None).err(), Some(3));
    assert_eq!(profile_info_v(&nvml, &h100, 17, None).err(), Some(2));
    assert_eq!(
        profile_info_v(&nvml, &h100, 0, Some(152 | (3 << 24))).err(),
        Some(25)
    );
    assert!(matches!(h100.profile_info(17), Err(NvmlError::InvalidArg)));
    // A GPU without MIG, and one the scenario gives no profiles: NOT_SUPPORTED.
    for i in [1, 2] {
        let dev = nvml.device_by_index(i).unwrap();
        assert_eq!(
            profile_info_v(&nvml, &dev, 0, None).err(),
            Some(3),
            "device {i}"
        );
    }
    // A MIG device has no GPU instance profiles of its own.
    let parent = nvml.device_by_index(3).unwrap();
    let mig = parent.mig_device_by_index(0).unwrap();
    assert_eq!(profile_info_v(&nvml, &mig, 0, None).err(), Some(3));
    assert!(profile_info_v(&nvml, &parent, 0, None).is_ok());
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2` as nvml.h has it: by profile *id*, a
/// NULL buffer asks for the count, a short one is INSUFFICIENT_SIZE with the count.
#[test]
fn gpu_instance_placements_follow_nvml_h() {
    use nvml_wrapper_sys::bindings::nvmlGpuInstancePlacement_t as Placement;
    let _g = serial();
    let sc = TempScenario::new(
        "mig-placements",
        &json!({"devices": [
            {"uuid": "GPU-h100", "mig_profiles": [
                {"profile": 2, "id": 9, "name": "MIG 3g.40gb", "slices": 3, "memory_mib": 40448,
                 "placements": [[0, 4], [4, 4]]},
                {"profile": 4, "id": 0, "name": "MIG 7g.80gb", "slices": 7, "memory_mib": 81152}]},
            {"uuid": "GPU-l4", "name": "NVIDIA L4", "unsupported": ["mig"]}
        ]}),
    );
    let nvml = init(&sc.0);
    let f = nvml
        .lib()
        .nvmlDeviceGetGpuInstancePossiblePlacements_v2
        .as_ref()
        .unwrap();
    let h100 = nvml.device_by_index(0).unwrap();
    // SAFETY: a live handle from this Nvml.
    let h = unsafe { h100.handle() };
    let mut count = 0u32;
    // SAFETY: NULL placements asks for the count.
    assert_eq!(unsafe { f(h, 9, std::ptr::null_mut(), &mut count) }, 0);
    assert_eq!(count, 2);
    let mut buf = vec![Placement { start: 9, size: 9 }; 2];
    let mut short = 1u32;
    // SAFETY: a buffer of 2, told 1.
    assert_eq!(unsafe { f(h, 9, buf.as_mut_ptr(), &mut short) }, 7);
    assert_eq!(short, 2);
    // SAFETY: a buffer of `count`.
    assert_eq!(unsafe { f(h, 9, buf.as_mut_ptr(), &mut count) }, 0);
    let got: Vec<(u32, u32)> = buf.iter().map(|p| (p.start, p.size)).collect();
    assert_eq!(got, [(0, 4), (4, 4)]);
    // The profile index (2) is not its id; a profile without placements; no MIG.
    for (dev, id) in [(&h100, 2), (&h100, 0)] {
        // SAFETY: as above.
        let ret = unsafe { f(dev.handle(), id, std::ptr::null_mut(), &mut count) };
        assert_eq!(ret, 3, "id {id}");
    }
    let l4 = nvml.device_by_index(1).unwrap();
    // SAFETY: as above.
    let ret = unsafe { f(l4.handle(), 9, std::ptr::null_mut(), &mut count) };
    assert_eq!(ret, 3);
}
