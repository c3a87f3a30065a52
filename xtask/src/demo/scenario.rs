//! The demo node's fake NVML scenario at one tick (the format: docs/fake-nvml.md): eight
//! H100s, a MIG GPU, an MPS GPU, the hot one, and accounting records of finished jobs.
use serde_json::{json, Value};

use super::{
    cast::{Slot, GPU_UUIDS, HOT_GPU, JOB_GPU, MIG, MIG_GPU, MPS_GPU},
    timeline::{hot_temperature, jitter, THROTTLE_AT},
};

/// A process on a GPU this tick.
#[derive(Debug, Clone, PartialEq)]
pub struct OnGpu {
    pub pid: u32,
    pub slot: Slot,
    pub memory: u64,
    pub sm: Option<u32>,
}

/// A process that has exited, as NVML's accounting remembers it.
#[derive(Debug, Clone, PartialEq)]
pub struct Accounted {
    pub pid: u32,
    pub gpu: usize,
    pub max_memory: u64,
    pub sm: u32,
    pub time_ms: u64,
}

const NAME: &str = "NVIDIA H100 80GB HBM3";
const MEMORY_TOTAL: u64 = 85_520_809_984;
/// A 3g.40gb instance's memory, as the driver reports it (40 320 MiB).
const MIG_MEMORY: u64 = 40_320 << 20;
const BUS: [&str; 8] = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"];
/// How busy the MIG GPU is, for its power and temperature (the driver gives no whole-GPU
/// utilization under MIG).
const MIG_LOAD: u32 = 45;

pub fn scenario(t: u64, procs: &[OnGpu], accounted: &[Accounted]) -> Value {
    let devices: Vec<Value> = (0..GPU_UUIDS.len())
        .map(|i| device(t, i, procs, accounted))
        .collect();
    json!({
        "description": "cargo xtask demo: a DGX H100-like node whose PIDs are the demo's own \
                        processes in pod cgroups; rewritten every tick",
        "driver_version": "580.159.04",
        "cuda_driver_version": 13000,
        "devices": devices,
    })
}

fn process(p: &OnGpu) -> Value {
    let mut v = json!({"pid": p.pid, "used_memory": p.memory});
    // The driver samples no per-process utilization under MIG.
    if let Some(sm) = p.sm.filter(|_| !matches!(p.slot, Slot::Mig(..))) {
        v["sm_util"] = json!(sm);
        v["mem_util"] = json!(sm * 11 / 20);
        v["enc_util"] = json!(0);
        v["dec_util"] = json!(0);
    }
    v
}

fn device(t: u64, i: usize, procs: &[OnGpu], accounted: &[Accounted]) -> Value {
    let here: Vec<&OnGpu> = procs.iter().filter(|p| p.slot.gpu() == i).collect();
    let busy = here.iter().filter_map(|p| p.sm).sum::<u32>().min(100);
    let load = if i == MIG_GPU { MIG_LOAD } else { busy };
    let temperature = if i == HOT_GPU {
        hot_temperature(t)
    } else {
        33 + load * 35 / 100 + jitter(t, i as u64, 1).unsigned_abs() as u32
    };
    let hot = i == HOT_GPU && temperature >= THROTTLE_AT;
    let power_w = ((70 + load * 63 / 10) as i64 + jitter(t, 100 + i as u64, 8)).clamp(60, 700);
    let mut throttle = 0u64;
    if load == 0 {
        throttle |= 0x1; // idle
    }
    if power_w >= 650 {
        throttle |= 0x4; // software power cap
    }
    if hot {
        throttle |= 0x20; // software thermal slowdown
    }
    let sm_clock = match (load, hot) {
        (0, _) => 345,
        (_, true) => 1410,
        _ => 1980,
    };
    let listed = |f: fn(&Slot) -> bool| -> Vec<Value> {
        here.iter()
            .filter(|p| f(&p.slot))
            .map(|p| process(p))
            .collect()
    };
    let mut d = json!({
        "uuid": GPU_UUIDS[i], "name": NAME, "index": i,
        "pci_bus_id": format!("00000000:{}:00.0", BUS[i]), "memory_total": MEMORY_TOTAL,
        "utilization_gpu": busy, "utilization_memory": busy * 3 / 5,
        "power_mw": power_w * 1000, "energy_mj": (i as u64 + 3) * 97_000_000_000u64,
        "temperature_c": temperature, "memory_temperature_c": temperature + 9,
        "sm_clock_mhz": sm_clock, "mem_clock_mhz": 2619, "throttle_reasons": throttle,
        "processes": listed(|s| matches!(s, Slot::Gpu(_) | Slot::MpsServer(_))),
    });
    match i {
        MIG_GPU => d["mig_devices"] = mig_devices(&here),
        MPS_GPU => d["mps_processes"] = json!(listed(|s| matches!(s, Slot::MpsClient(_)))),
        JOB_GPU => {
            d["accounting_mode"] = json!(true);
            d["accounting"] = accounted
                .iter()
                .filter(|a| a.gpu == i)
                .map(|a| {
                    json!({"pid": a.pid, "gpu_util": a.sm, "mem_util": a.sm / 2,
                           "max_memory": a.max_memory, "time_ms": a.time_ms, "running": false})
                })
                .collect();
        }
        _ => {}
    }
    d
}

fn mig_devices(here: &[&OnGpu]) -> Value {
    MIG.iter()
        .map(|&(uuid, gi)| {
            let processes: Vec<Value> = here
                .iter()
                .filter(|p| p.slot == Slot::Mig(MIG_GPU, gi))
                .map(|p| process(p))
                .collect();
            json!({"uuid": uuid, "name": format!("{NAME} MIG 3g.40gb"), "gpu_instance_id": gi,
                   "compute_instance_id": 0, "memory_total": MIG_MEMORY, "processes": processes})
        })
        .collect()
}

#[cfg(test)]
mod t {
    use super::*;

    fn p(pid: u32, slot: Slot, sm: Option<u32>) -> OnGpu {
        OnGpu {
            pid,
            slot,
            memory: 1 << 30,
            sm,
        }
    }

    #[test]
    fn each_kind_of_sharing_lands_in_its_list() {
        let procs = [
            p(1, Slot::Gpu(0), Some(97)),
            p(2, Slot::Gpu(HOT_GPU), Some(30)),
            p(3, Slot::Gpu(HOT_GPU), Some(20)),
            p(4, Slot::MpsServer(MPS_GPU), None),
            p(5, Slot::MpsClient(MPS_GPU), Some(25)),
            p(6, Slot::Mig(MIG_GPU, MIG[1].1), Some(40)),
        ];
        let done = [Accounted {
            pid: 9,
            gpu: JOB_GPU,
            max_memory: 1 << 30,
            sm: 80,
            time_ms: 30_000,
        }];
        let s = scenario(FIRST, &procs, &done);
        let d = |i: usize| &s["devices"][i];
        let pids = |v: &Value| -> Vec<u64> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|p| p["pid"].as_u64().unwrap())
                .collect()
        };
        assert_eq!(s["devices"].as_array().unwrap().len(), 8);
        assert_eq!(pids(&d(0)["processes"]), [1]);
        assert_eq!(d(0)["throttle_reasons"], 0x4, "97 % is power-capped");
        assert_eq!(pids(&d(HOT_GPU)["processes"]), [2, 3]);
        assert_eq!(d(HOT_GPU)["utilization_gpu"], 50);
        assert_eq!(pids(&d(MPS_GPU)["processes"]), [4]);
        assert_eq!(pids(&d(MPS_GPU)["mps_processes"]), [5]);
        let mig = &d(MIG_GPU)["mig_devices"];
        assert_eq!(pids(&mig[0]["processes"]), Vec::<u64>::new());
        assert_eq!(pids(&mig[1]["processes"]), [6]);
        assert!(mig[1]["processes"][0].get("sm_util").is_none());
        assert_eq!(d(3)["throttle_reasons"], 0x1, "nothing runs: idle");
        assert_eq!(d(JOB_GPU)["accounting"][0]["pid"], 9);
    }

    const FIRST: u64 = 0;

    #[test]
    fn the_hot_gpu_throttles_when_hot() {
        let procs = [p(2, Slot::Gpu(HOT_GPU), Some(60))];
        let throttled: Vec<bool> = (0..40)
            .map(|t| {
                let d = &scenario(t, &procs, &[])["devices"][HOT_GPU];
                d["throttle_reasons"].as_u64().unwrap() & 0x20 != 0
            })
            .collect();
        assert!(throttled.contains(&true) && throttled.contains(&false));
    }
}
