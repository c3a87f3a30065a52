//! The health fields, GPM and XID events of the fake library, through nvml-wrapper as the
//! agent calls them (and the raw symbols where nvml-wrapper has no method).

use std::path::PathBuf;
use std::thread::sleep;
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::gpm_metrics_get;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::*;
use nvml_wrapper::Nvml;
use serde_json::{json, Value};

fn lib_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    [
        Some(deps.join("libnvidia_ml.so")),
        deps.parent().map(|p| p.join("libnvidia_ml.so")),
    ]
    .into_iter()
    .flatten()
    .find(|p| p.exists())
    .expect("libnvidia_ml.so: run `cargo build -p fake-nvml` first")
}

struct TempScenario(PathBuf);

impl TempScenario {
    fn new(v: &Value) -> Self {
        let p = std::env::temp_dir().join(format!("fake-nvml-health-{}.json", std::process::id()));
        let s = TempScenario(p);
        s.write(v);
        s
    }

    fn write(&self, v: &Value) {
        let tmp = self.0.with_extension("tmp");
        std::fs::write(&tmp, v.to_string()).unwrap();
        std::fs::rename(&tmp, &self.0).unwrap();
    }
}

impl Drop for TempScenario {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn scenario(extra_xid: Option<u64>) -> Value {
    let mut xids = vec![json!({"xid": 79}), json!({"xid": 43, "at_ms": 400})];
    if let Some(x) = extra_xid {
        xids.push(json!({"xid": x}));
    }
    json!({"devices": [
        {"uuid": "GPU-00000000-0000-0000-0000-000000000000", "fb_reserved": 536870912u64,
         "memory_temperature_c": 61, "encoder_util": 12, "decoder_util": 34, "pcie_replay": 5,
         "ecc_corrected": {"volatile": 7, "aggregate": 70}, "ecc_uncorrected": 2,
         "power_mw": 250000, "energy_mj": 1000,
         "remapped_rows": {"correctable": 3, "uncorrectable": 1, "pending": true},
         "nvlink_bandwidth": {"tx_kib": 1000, "rx_kib": 2000, "tx_kib_per_s": 100000},
         "gpm": {"gr_engine_active": 0.75, "sm_active": 0.5, "tensor_active": 0.25,
                 "pcie_tx_bytes": 2097152.0},
         "xid_events": xids},
        {"uuid": "GPU-11111111-0000-0000-0000-000000000000", "name": "NVIDIA H100 80GB HBM3",
         "gpm": {"sm_active": 0.9},
         "mig_devices": [{"uuid": "MIG-22222222-0000-0000-0000-000000000000",
                          "gpu_instance_id": 5, "memory_total": 10737418240u64,
                          "gpm": {"sm_active": 0.3, "dram_active": 0.2}}]},
        {"uuid": "GPU-33333333-0000-0000-0000-000000000000", "name": "NVIDIA A10G",
         "unsupported": ["remapped_rows", "events", "pcie_replay"]}
    ]})
}

/// One test: the library keeps one scenario per process.
#[test]
fn health_fields_gpm_and_xid_events() {
    let sc = TempScenario::new(&scenario(None));
    std::env::set_var("FAKE_NVML_SCENARIO", &sc.0);
    let nvml = Nvml::builder()
        .lib_path(lib_path().as_os_str())
        .init()
        .unwrap();
    fields(&nvml);
    gpm(&nvml);
    events(&nvml, &sc);
}

fn fields(nvml: &Nvml) {
    let d = nvml.device_by_index(0).unwrap();
    assert_eq!(
        d.memory_info().unwrap().reserved,
        536_870_912,
        "fb_reserved"
    );
    assert_eq!(d.encoder_utilization().unwrap().utilization, 12);
    assert_eq!(d.decoder_utilization().unwrap().utilization, 34);
    assert_eq!(d.pcie_replay_counter().unwrap(), 5);
    let ids = [
        NVML_FI_DEV_MEMORY_TEMP,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        NVML_FI_DEV_ECC_CURRENT,
    ];
    let v = d.field_values_for(&ids.map(FieldId)).unwrap();
    let value = |i: usize| match &v[i] {
        Ok(s) => match &s.value {
            Ok(SampleValue::U32(x)) => Ok(u64::from(*x)),
            Ok(SampleValue::U64(x)) => Ok(*x),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(format!("{e:?}")),
        },
        Err(e) => Err(format!("{e:?}")),
    };
    assert_eq!(value(0), Ok(61), "memory temperature");
    assert!(
        value(1).unwrap() >= 1000,
        "the counter starts at tx_kib and grows"
    );
    assert_eq!(value(2), Ok(2000), "no rate: stays");
    assert_eq!(
        value(3),
        Err("NotSupported".into()),
        "a field the fake has not"
    );
    folded_ids_answer_what_their_own_calls_do(nvml);
    // Remapped rows: no nvml-wrapper method; the raw symbol.
    let f = nvml.lib().nvmlDeviceGetRemappedRows.as_ref().unwrap();
    let (mut c, mut u, mut p, mut fail) = (0, 0, 0, 9);
    // SAFETY: a live handle; valid out-pointers.
    assert_eq!(
        unsafe { f(d.handle(), &mut c, &mut u, &mut p, &mut fail) },
        0
    );
    assert_eq!((c, u, p, fail), (3, 1, 1, 0));
    let a10 = nvml.device_by_index(2).unwrap();
    // SAFETY: as above.
    assert_eq!(
        unsafe { f(a10.handle(), &mut c, &mut u, &mut p, &mut fail) },
        3,
        "NOT_SUPPORTED"
    );
    assert!(matches!(
        a10.pcie_replay_counter(),
        Err(NvmlError::NotSupported)
    ));
    assert!(a10.encoder_utilization().is_ok());
}

/// The readings that have a field id (nvml.h's NVML_FI_DEV_*) give, through one
/// `nvmlDeviceGetFieldValues`, what their own calls give.
fn folded_ids_answer_what_their_own_calls_do(nvml: &Nvml) {
    use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
    let d = nvml.device_by_index(0).unwrap();
    let ids = [
        NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
        NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
        NVML_FI_DEV_REMAPPED_COR,
        NVML_FI_DEV_REMAPPED_UNC,
        NVML_FI_DEV_REMAPPED_PENDING,
        NVML_FI_DEV_REMAPPED_FAILURE,
        NVML_FI_DEV_POWER_INSTANT,
        NVML_FI_DEV_POWER_AVERAGE,
        NVML_FI_DEV_PCIE_REPLAY_COUNTER,
        NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    ];
    let energy_before = d.total_energy_consumption().unwrap();
    let v = d.field_values_for(&ids.map(FieldId)).unwrap();
    let energy_after = d.total_energy_consumption().unwrap();
    let value = |i: usize| match v[i].as_ref().unwrap().value.as_ref().unwrap() {
        SampleValue::U32(x) => u64::from(*x),
        SampleValue::U64(x) => *x,
        other => panic!("{other:?}"),
    };
    let ecc = |e| d.total_ecc_errors(e, EccCounter::Volatile).unwrap();
    let f = nvml.lib().nvmlDeviceGetRemappedRows.as_ref().unwrap();
    let (mut c, mut u, mut p, mut fail) = (0, 0, 0, 0);
    // SAFETY: a live handle; valid out-pointers.
    assert_eq!(
        unsafe { f(d.handle(), &mut c, &mut u, &mut p, &mut fail) },
        0
    );
    let power = u64::from(d.power_usage().unwrap());
    let calls = [
        ecc(MemoryError::Corrected),
        ecc(MemoryError::Uncorrected),
        c.into(),
        u.into(),
        p.into(),
        fail.into(),
        power,
        power,
        d.pcie_replay_counter().unwrap().into(),
    ];
    for (i, call) in calls.iter().enumerate() {
        assert_eq!(value(i), *call, "field id {}", ids[i]);
    }
    assert!(
        (energy_before..=energy_after).contains(&value(9)),
        "the energy counter between the calls before and after"
    );
}

fn gpm(nvml: &Nvml) {
    let d = nvml.device_by_index(0).unwrap();
    assert!(d.gpm_support().unwrap());
    assert!(
        !nvml.device_by_index(2).unwrap().gpm_support().unwrap(),
        "no gpm key"
    );
    let ids = [
        GpmMetricId::GraphicsUtil,
        GpmMetricId::SmUtil,
        GpmMetricId::AnyTensorUtil,
        GpmMetricId::PcieTxPerSec,
        GpmMetricId::Fp64Util,
    ];
    let s1 = d.gpm_sample().unwrap();
    sleep(Duration::from_millis(10));
    let s2 = d.gpm_sample().unwrap();
    let got = gpm_metrics_get(nvml, &s1, &s2, &ids).unwrap();
    let v: Vec<_> = got
        .iter()
        .map(|r| r.as_ref().map(|m| m.value).ok())
        .collect();
    // NVML's units: percent, and MiB/s.
    assert_eq!(
        v,
        [Some(75.0), Some(50.0), Some(25.0), Some(2.0), None],
        "{got:?}"
    );
    // Samples the wrong way round are refused, as the driver does.
    assert!(gpm_metrics_get(nvml, &s2, &s1, &ids).is_err());
    let h = nvml.device_by_index(1).unwrap();
    let m1 = h.gpm_mig_sample(5).unwrap();
    sleep(Duration::from_millis(10));
    let m2 = h.gpm_mig_sample(5).unwrap();
    let got = gpm_metrics_get(
        nvml,
        &m1,
        &m2,
        &[GpmMetricId::SmUtil, GpmMetricId::DramBwUtil],
    )
    .unwrap();
    let v: Vec<f64> = got.into_iter().map(|r| r.unwrap().value).collect();
    assert_eq!(v, [30.0, 20.0], "the GPU instance's own");
    assert!(h.gpm_mig_sample(6).is_err(), "no such GPU instance");
}

fn events(nvml: &Nvml, sc: &TempScenario) {
    let d = nvml.device_by_index(0).unwrap();
    let set = nvml.create_event_set().unwrap();
    let set = d
        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        .unwrap();
    let xid = |timeout| {
        set.wait(timeout).map(|e| {
            assert_eq!(
                e.device.uuid().unwrap(),
                "GPU-00000000-0000-0000-0000-000000000000"
            );
            match e.event_data {
                Some(XidError::Value(x)) => Some(x),
                _ => None,
            }
        })
    };
    assert_eq!(xid(0).unwrap(), Some(79), "due at once");
    assert!(
        matches!(xid(0), Err(NvmlError::Timeout)),
        "43 is not due yet"
    );
    let t = Instant::now();
    assert_eq!(xid(2000).unwrap(), Some(43), "waited for");
    assert!(t.elapsed() < Duration::from_millis(1500));
    assert!(matches!(xid(0), Err(NvmlError::Timeout)), "each event once");
    // An edit adds one; the old ones are not delivered again.
    sc.write(&scenario(Some(48)));
    sleep(Duration::from_millis(250));
    assert_eq!(xid(1000).unwrap(), Some(48));
    assert!(matches!(xid(100), Err(NvmlError::Timeout)));
    let a10 = nvml.device_by_index(2).unwrap();
    let other = nvml.create_event_set().unwrap();
    let err = a10
        .register_events(EventTypes::CRITICAL_XID_ERROR, other)
        .unwrap_err();
    assert!(matches!(err.error, NvmlError::NotSupported), "{err:?}");
}
