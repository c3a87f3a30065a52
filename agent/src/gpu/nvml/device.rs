//! One device's readings in a cycle: its memory, the fixed ones read once per uuid, the slow
//! ones (everything else the device says of itself) read when due (slow.rs) and held in
//! between, its MIG devices, its processes (processes.rs), and dcgm-exporter's further
//! fields.
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use nvml_wrapper::{
    enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor},
    Device, Nvml,
};

use gpu_model::{DeviceFields, DeviceStatus, GpmMetrics, GpuInstance};

use super::{
    fields::{self, NvlinkRates},
    gpm::Gpm,
    processes::{sample_processes, Lists},
    reader::{in_call, Reader},
    xid::{self, Xids},
    DeviceSample, MigSample,
};

/// What a device's uuid fixes, read once per uuid rather than every cycle: a GPU's name,
/// PCI bus id and minor number; a MIG device's instance ids and profile. A uuid names one
/// device for its life (a MIG device made again gets a new one), and each cycle reads the
/// uuid at the device's index. A reading that failed is not kept: it is asked again, with
/// the rest, next cycle. On the large node's 8 GPUs x 7 MIG devices this is 192 of 533
/// NVML calls a cycle.
#[derive(Debug, Default)]
pub(super) struct Fixed {
    gpus: Kept<GpuFixed>,
    migs: Kept<MigFixed>,
}

impl Fixed {
    /// Forgets what the uuids not seen this cycle fixed.
    pub(super) fn end_cycle(&mut self, devices: &[DeviceSample]) {
        let migs = devices.iter().map(|d| d.mig_devices.len()).sum();
        self.gpus.end_cycle(devices.len());
        self.migs.end_cycle(migs);
    }
}

/// Per uuid, what it fixes and the last cycle that saw it.
#[derive(Debug)]
struct Kept<T> {
    by_uuid: HashMap<String, (T, u64)>,
    cycle: u64,
}

impl<T> Default for Kept<T> {
    fn default() -> Self {
        Kept {
            by_uuid: HashMap::new(),
            cycle: 0,
        }
    }
}

impl<T: Clone> Kept<T> {
    /// What `uuid` fixes, if kept; this cycle saw it.
    fn get(&mut self, uuid: &str) -> Option<T> {
        let (v, seen) = self.by_uuid.get_mut(uuid).filter(|_| !uuid.is_empty())?;
        *seen = self.cycle;
        Some(v.clone())
    }

    fn keep(&mut self, uuid: &str, v: &T) {
        if !uuid.is_empty() {
            self.by_uuid
                .insert(uuid.to_string(), (v.clone(), self.cycle));
        }
    }

    /// Forgets the uuids not seen this cycle, once there are more than twice those seen.
    fn end_cycle(&mut self, seen: usize) {
        let cycle = self.cycle;
        if self.by_uuid.len() > 2 * seen {
            self.by_uuid.retain(|_, (_, s)| *s == cycle);
        }
        self.cycle += 1;
    }
}

#[derive(Debug, Clone)]
struct GpuFixed {
    name: Option<String>,
    pci_bus_id: Option<String>,
    minor_number: Option<u32>,
    /// The readings among these the device does not support, as `Reader` names them.
    unsupported: Vec<&'static str>,
}

#[derive(Debug, Clone)]
struct MigFixed {
    /// The uuid itself, shared by every cycle's sample and the processes on the device.
    uuid: gpu_model::Name,
    gpu_instance_id: u32,
    compute_instance_id: u32,
    profile: Option<String>,
    gpu_instance: Option<GpuInstance>,
}

/// Names of the slow readings, as `DeviceSample::unsupported` lists them.
const SLOW_READINGS: [&str; 13] = [
    "utilization",
    "power",
    "temperature",
    "clocks",
    "ecc",
    "throttle",
    "mig",
    "encoder_utilization",
    "decoder_utilization",
    "remapped_rows",
    "vgpu_license",
    "field_values",
    "accounting",
];

/// A GPU's own gauges and counters (`read_own`), as last read.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Own {
    utilization_gpu: Option<u32>,
    utilization_memory: Option<u32>,
    power_mw: Option<u32>,
    temperature_c: Option<u32>,
    sm_clock_mhz: Option<u32>,
    mem_clock_mhz: Option<u32>,
    ecc_corrected: Option<u64>,
    ecc_uncorrected: Option<u64>,
    throttle_reasons: Option<u64>,
}

impl Own {
    fn of(d: &DeviceSample) -> Own {
        Own {
            utilization_gpu: d.utilization_gpu,
            utilization_memory: d.utilization_memory,
            power_mw: d.power_mw,
            temperature_c: d.temperature_c,
            sm_clock_mhz: d.sm_clock_mhz,
            mem_clock_mhz: d.mem_clock_mhz,
            ecc_corrected: d.ecc_corrected,
            ecc_uncorrected: d.ecc_uncorrected,
            throttle_reasons: d.throttle_reasons,
        }
    }

    fn set(&self, d: &mut DeviceSample) {
        d.utilization_gpu = self.utilization_gpu;
        d.utilization_memory = self.utilization_memory;
        d.power_mw = self.power_mw;
        d.temperature_c = self.temperature_c;
        d.sm_clock_mhz = self.sm_clock_mhz;
        d.mem_clock_mhz = self.mem_clock_mhz;
        d.ecc_corrected = self.ecc_corrected;
        d.ecc_uncorrected = self.ecc_uncorrected;
        d.throttle_reasons = self.throttle_reasons;
    }
}

/// One device's slow readings, as last read: all it says of itself but its memory, its
/// energy and PCIe replay counters (`HeldCounters`) and its XIDs (events, every cycle).
#[derive(Debug, Default, PartialEq)]
pub(super) struct Held {
    uuid: String,
    own: Own,
    mig_enabled: bool,
    /// The fields' slow readings; its memory reserved, XIDs and GPM are not restored from it.
    fields: DeviceFields,
    accounting_mode: Option<bool>,
    /// Per GPU instance id.
    mig_gpm: Vec<(u32, Option<GpmMetrics>)>,
    unsupported: Vec<&'static str>,
}

impl Held {
    pub(super) fn of(d: &DeviceSample) -> Held {
        Held {
            uuid: d.uuid.clone(),
            own: Own::of(d),
            mig_enabled: d.mig_enabled,
            fields: d.fields.clone(),
            accounting_mode: d.sharing.accounting_mode,
            mig_gpm: d
                .mig_devices
                .iter()
                .map(|m| (m.gpu_instance_id, m.gpm))
                .collect(),
            unsupported: d
                .unsupported
                .iter()
                .filter(|n| SLOW_READINGS.contains(n))
                .copied()
                .collect(),
        }
    }

    /// The device's own slow readings (read before its MIG devices are listed).
    fn restore_device(&self, d: &mut DeviceSample) {
        self.own.set(d);
        d.mig_enabled = self.mig_enabled;
        d.unsupported.extend(&self.unsupported);
    }

    /// The accounting mode, as last read.
    pub(super) fn accounting_mode(&self) -> Option<bool> {
        self.accounting_mode
    }

    /// The fields' slow readings: all but what is read every cycle (the memory reserved),
    /// on a cycle of its own (PCIe replays, GPM) or from events (XIDs).
    fn restore_fields(&self, d: &mut DeviceSample) {
        let f = std::mem::take(&mut d.fields);
        d.fields = DeviceFields {
            memory_reserved_bytes: f.memory_reserved_bytes,
            pcie_replay: f.pcie_replay,
            gpm: f.gpm,
            xid_errors: f.xid_errors,
            last_xid: f.last_xid,
            xid_processes: f.xid_processes,
            ..self.fields.clone()
        };
    }

    /// Profiling, the GPU's and its MIG devices' by GPU instance.
    fn restore_gpm(&self, d: &mut DeviceSample) {
        d.fields.gpm = self.fields.gpm;
        for m in &mut d.mig_devices {
            m.gpm = self
                .mig_gpm
                .iter()
                .find(|(gi, _)| *gi == m.gpu_instance_id)
                .and_then(|(_, g)| *g);
        }
    }
}

/// Names of the counters read every `nvml.energy_interval_ms`.
const COUNTERS: [&str; 2] = ["energy", "pcie_replay"];

/// One device's costly counters, as last read (every `nvml.energy_interval_ms`): energy
/// (5 ms a read on a real driver) and PCIe replays (0.36 ms). A counter read less often
/// loses nothing: its increase is the same, only known later.
#[derive(Debug, Default, PartialEq)]
pub(super) struct HeldCounters {
    uuid: String,
    mj: Option<u64>,
    pcie_replay: Option<u64>,
    unsupported: Vec<&'static str>,
}

impl HeldCounters {
    pub(super) fn of(d: &DeviceSample) -> HeldCounters {
        HeldCounters {
            uuid: d.uuid.clone(),
            mj: d.energy_mj,
            pcie_replay: d.fields.pcie_replay,
            unsupported: (d.unsupported.iter())
                .filter(|n| COUNTERS.contains(n))
                .copied()
                .collect(),
        }
    }

    fn restore(&self, d: &mut DeviceSample) {
        d.energy_mj = self.mj;
        d.fields.pcie_replay = self.pcie_replay;
        d.unsupported.extend(&self.unsupported);
    }
}

/// What a device's read holds rather than reads this cycle; None: read afresh.
#[derive(Clone, Copy, Default)]
pub(super) struct Holding<'h> {
    pub(super) slow: Option<&'h Held>,
    /// GPM, from the slow readings last read.
    pub(super) gpm: Option<&'h Held>,
    pub(super) energy: Option<&'h HeldCounters>,
}

/// What dcgm-exporter's further fields keep between cycles: profiling samples, the XID
/// event set, NVLink counters (gpm.rs, xid.rs, fields.rs).
pub(super) struct Extras {
    pub(super) gpm: Gpm,
    /// Shared with the sampler, which drains the events each cycle.
    pub(super) xids: Arc<Mutex<Xids>>,
    pub(super) nvlink: NvlinkRates,
}

impl Extras {
    /// dcgm-exporter's further fields of a device that answers: health, profiling, and its
    /// registration for XID events. What `held` holds is not read.
    pub(super) fn device(
        &mut self,
        nvml: &Nvml,
        dev: &Device,
        mut d: DeviceSample,
        held: Holding,
    ) -> DeviceSample {
        if !d.status.is_ok() {
            return d;
        }
        let mut r = Reader {
            unsupported: std::mem::take(&mut d.unsupported),
            lost: false,
        };
        match held.slow {
            Some(h) => h.restore_fields(&mut d),
            None => fields::read(&mut r, nvml, dev, &mut d, &mut self.nvlink),
        }
        d.unsupported = r.unsupported;
        if r.lost {
            d.status = DeviceStatus::Lost;
            d.processes.clear();
            return d;
        }
        match held.gpm {
            Some(h) => h.restore_gpm(&mut d),
            None => self.gpm.sample(nvml, dev, &mut d),
        }
        let set = self.xids.lock().unwrap().set_for(nvml, &d.uuid);
        if let Some(set) = set {
            let r = in_call(&"nvmlDeviceRegisterEvents", || {
                xid::register_device(nvml, dev, set)
            });
            // SAFETY: the handle is only kept as a key, never called through.
            let handle = unsafe { dev.handle() };
            self.xids.lock().unwrap().registered(&d.uuid, handle, r);
        }
        d
    }
}

/// What `sample_device` keeps across cycles.
pub(super) struct DeviceCtx<'a> {
    /// The uuid its kept handle names; None: read it.
    pub(super) uuid: Option<&'a str>,
    /// Per device uuid: the newest process-utilization timestamp seen.
    pub(super) last_seen: &'a mut HashMap<String, u64>,
    pub(super) fixed: &'a mut Fixed,
    pub(super) lists: &'a mut Lists,
}

/// One device's sample. What `held` holds (for the same uuid) is not read; the `Holding`
/// returned is what was used.
pub(super) fn sample_device<'h>(
    nvml: &Nvml,
    dev: &Device,
    index: u32,
    ctx: &mut DeviceCtx,
    held: Holding<'h>,
) -> (DeviceSample, Holding<'h>) {
    let mut d = DeviceSample {
        index,
        status: DeviceStatus::Ok,
        ..Default::default()
    };
    let mut r = Reader {
        unsupported: vec![],
        lost: false,
    };
    read_device_metrics(&mut r, dev, &mut d, ctx);
    // A device that was replaced at this index since (another uuid) is read afresh.
    let held = Holding {
        slow: held.slow.filter(|h| h.uuid == d.uuid),
        gpm: held.gpm.filter(|h| h.uuid == d.uuid),
        energy: held.energy.filter(|h| h.uuid == d.uuid),
    };
    match held.slow {
        Some(h) => h.restore_device(&mut d),
        None => {
            read_own(&mut r, dev, &mut d);
            d.mig_enabled = r
                .read(&"mig", || dev.mig_mode())
                .is_some_and(|m| m.current == 1)
        }
    }
    match held.energy {
        Some(h) => h.restore(&mut d),
        None => {
            d.energy_mj = r.read(&"energy", || dev.total_energy_consumption());
            d.fields.pcie_replay = r
                .read(&"pcie_replay", || dev.pcie_replay_counter())
                .map(u64::from);
        }
    }
    if d.mig_enabled && !r.lost {
        read_mig_devices(&mut r, nvml, dev, &mut d, ctx.fixed);
    }
    let state = (&mut *ctx.last_seen, &mut *ctx.lists);
    d.processes = sample_processes(&mut r, dev, &d, state, held.slow.is_none());
    debug_assert!(d.processes.is_sorted_by_key(|p| p.pid));
    d.unsupported = r.unsupported;
    if r.lost {
        d.status = DeviceStatus::Lost;
        d.processes.clear();
    }
    (d, held)
}

/// The uuid (where no kept handle names it), what it fixes and the memory: every cycle.
fn read_device_metrics(r: &mut Reader, dev: &Device, d: &mut DeviceSample, ctx: &mut DeviceCtx) {
    d.uuid = match ctx.uuid {
        Some(uuid) => uuid.to_string(),
        None => r.read(&"uuid", || dev.uuid()).unwrap_or_default(),
    };
    let fixed = &mut *ctx.fixed;
    let f = match fixed.gpus.get(&d.uuid) {
        Some(f) => f,
        None => read_gpu_fixed(r, dev, d, &mut fixed.gpus),
    };
    d.name = f.name.unwrap_or_default();
    d.pci_bus_id = f.pci_bus_id;
    // Where `Reader` would have named them, in the order of the reads.
    let unsupported = |name| f.unsupported.contains(&name).then_some(name);
    r.unsupported
        .extend(["name", "pci_info"].into_iter().filter_map(unsupported));
    if let Some(m) = r.read(&"memory", || dev.memory_info()) {
        d.memory_total_bytes = Some(m.total);
        d.memory_used_bytes = Some(m.used);
        d.fields.memory_reserved_bytes = Some(m.reserved);
    }
    d.sharing.minor_number = f.minor_number;
    r.unsupported.extend(unsupported("minor_number"));
}

/// The GPU's own gauges and counters: slow readings.
fn read_own(r: &mut Reader, dev: &Device, d: &mut DeviceSample) {
    if let Some(u) = r.read(&"utilization", || dev.utilization_rates()) {
        d.utilization_gpu = Some(u.gpu);
        d.utilization_memory = Some(u.memory);
    }
    d.power_mw = r.read(&"power", || dev.power_usage());
    d.temperature_c = r.read(&"temperature", || dev.temperature(TemperatureSensor::Gpu));
    d.sm_clock_mhz = r.read(&"clocks", || dev.clock_info(Clock::SM));
    d.mem_clock_mhz = r.read(&"clocks", || dev.clock_info(Clock::Memory));
    d.ecc_corrected = r.read(&"ecc", || {
        dev.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
    });
    d.ecc_uncorrected = r.read(&"ecc", || {
        dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
    });
    d.throttle_reasons = r
        .read(&"throttle", || dev.current_throttle_reasons())
        .map(|t| t.bits());
}

/// A GPU's fixed readings, read now and kept when every one answered (or is unsupported).
/// The reader's unsupported list is left as it was: the caller names them in their places.
fn read_gpu_fixed(
    r: &mut Reader,
    dev: &Device,
    d: &DeviceSample,
    kept: &mut Kept<GpuFixed>,
) -> GpuFixed {
    let mut own = Reader {
        unsupported: vec![],
        lost: r.lost,
    };
    let f = GpuFixed {
        name: own.read(&"name", || dev.name()),
        pci_bus_id: own.read(&"pci_info", || dev.pci_info()).map(|p| p.bus_id),
        minor_number: own.read(&"minor_number", || dev.minor_number()),
        unsupported: own.unsupported,
    };
    r.lost |= own.lost;
    let answered = |v: bool, name| v || f.unsupported.contains(&name);
    let complete = answered(f.name.is_some(), "name")
        && answered(f.pci_bus_id.is_some(), "pci_info")
        && answered(f.minor_number.is_some(), "minor_number");
    if complete && !r.lost {
        kept.keep(&d.uuid, &f);
    }
    f
}

fn read_mig_devices(
    r: &mut Reader,
    nvml: &Nvml,
    dev: &Device,
    d: &mut DeviceSample,
    fixed: &mut Fixed,
) {
    let n = r.read(&"mig", || dev.mig_device_count()).unwrap_or(0);
    for i in 0..n {
        // Empty slots answer NotFound: skip them.
        let Ok(mig) = dev.mig_device_by_index(i) else {
            continue;
        };
        let mem = mig.memory_info().ok();
        let uuid = mig.uuid().unwrap_or_default();
        let f = match fixed.migs.get(&uuid) {
            Some(f) => f,
            None => read_mig_fixed(nvml, dev, &mig, &uuid, &mut fixed.migs),
        };
        d.mig_devices.push(MigSample {
            uuid: f.uuid,
            gpu_instance_id: f.gpu_instance_id,
            compute_instance_id: f.compute_instance_id,
            memory_total_bytes: mem.as_ref().map(|m| m.total),
            memory_used_bytes: mem.as_ref().map(|m| m.used),
            profile: f.profile,
            gpu_instance: f.gpu_instance,
            gpm: None,
        });
    }
}

/// A MIG device's instance ids, profile and GPU instance (of `parent`), read now; kept when
/// each answered, or said for good that it cannot.
fn read_mig_fixed(
    nvml: &Nvml,
    parent: &Device,
    mig: &Device,
    uuid: &str,
    kept: &mut Kept<MigFixed>,
) -> MigFixed {
    let (gi, ci) = instance_ids(nvml, mig);
    let name = mig.name().ok();
    let gpu_instance = gi.map(|gi| gpu_instance(nvml, parent, gi));
    let f = MigFixed {
        uuid: uuid.into(),
        gpu_instance_id: gi.unwrap_or(u32::MAX),
        compute_instance_id: ci.unwrap_or(u32::MAX),
        profile: name.as_deref().and_then(mig_profile),
        gpu_instance: gpu_instance.and_then(|g| g.ok().flatten()),
    };
    if ci.is_some() && name.is_some() && gpu_instance.is_some_and(|g| g.is_ok()) {
        kept.keep(uuid, &f);
    }
    f
}

/// The profile in a MIG device's name: `NVIDIA A100-SXM4-80GB MIG 1g.10gb` -> `1g.10gb`.
fn mig_profile(name: &str) -> Option<String> {
    let p = name.rsplit_once("MIG ")?.1.trim();
    (!p.is_empty()).then(|| p.to_string())
}

/// GPU and compute instance ids of a MIG device handle. nvml-wrapper has no method for
/// these, so the library's own symbols are called, checked first (a missing one panics).
fn instance_ids(nvml: &Nvml, mig: &Device) -> (Option<u32>, Option<u32>) {
    let lib = nvml.lib();
    // SAFETY: `mig` is a live handle from this library; the out-pointers are valid.
    unsafe {
        let handle = mig.handle();
        let gi = lib.nvmlDeviceGetGpuInstanceId.as_ref().ok().and_then(|f| {
            let mut id = 0;
            (f(handle, &mut id) == 0).then_some(id)
        });
        let ci = lib
            .nvmlDeviceGetComputeInstanceId
            .as_ref()
            .ok()
            .and_then(|f| {
                let mut id = 0;
                (f(handle, &mut id) == 0).then_some(id)
            });
        (gi, ci)
    }
}

/// GPU instance `gi` of `parent`: its profile id and placement (`nvmlDeviceGetGpuInstanceById`,
/// `nvmlGpuInstanceGetInfo`, which nvml-wrapper has no method for). Ok(None) where NVML
/// says for good that it cannot (no such call, not supported, no permission: in a
/// container, the MIG monitor capability); Err where it may answer next time.
fn gpu_instance(nvml: &Nvml, parent: &Device, gi: u32) -> Result<Option<GpuInstance>, ()> {
    use nvml_wrapper_sys::bindings::{
        nvmlGpuInstanceInfo_t, nvmlGpuInstance_t,
        nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND as FUNCTION_NOT_FOUND,
        nvmlReturn_enum_NVML_ERROR_NOT_FOUND as NOT_FOUND,
        nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED as NOT_SUPPORTED,
        nvmlReturn_enum_NVML_ERROR_NO_PERMISSION as NO_PERMISSION,
        nvmlReturn_enum_NVML_SUCCESS as OK,
    };
    let lib = nvml.lib();
    let (Ok(by_id), Ok(info_of)) = (
        lib.nvmlDeviceGetGpuInstanceById.as_ref(),
        lib.nvmlGpuInstanceGetInfo.as_ref(),
    ) else {
        return Ok(None);
    };
    let answer = |r| match r {
        OK => Ok(()),
        FUNCTION_NOT_FOUND | NOT_SUPPORTED | NO_PERMISSION | NOT_FOUND => Err(Ok(None)),
        _ => Err(Err(())),
    };
    let mut handle: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: a plain C struct; all-zero is a valid value.
    let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `parent` is a live handle from this library; the out-pointers are valid, and
    // the instance handle is used only after the call that wrote it succeeded.
    let read = unsafe {
        answer(by_id(parent.handle(), gi, &mut handle))
            .and_then(|()| answer(info_of(handle, &mut info)))
    };
    match read {
        Ok(()) => Ok(Some(GpuInstance {
            profile_id: info.profileId,
            placement_start: info.placement.start,
            placement_size: info.placement.size,
        })),
        Err(r) => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_readings_restore_what_was_read_and_only_that() {
        let gpm = |v: f64| GpmMetrics {
            sm_active: Some(v),
            ..Default::default()
        };
        let mig = |gi: u32, g: Option<GpmMetrics>| MigSample {
            gpu_instance_id: gi,
            gpm: g,
            ..Default::default()
        };
        let mut read = DeviceSample {
            uuid: "GPU-a".into(),
            memory_used_bytes: Some(1 << 30),
            power_mw: Some(350_000),
            temperature_c: Some(61),
            ecc_corrected: Some(3),
            energy_mj: Some(7_000),
            mig_enabled: true,
            unsupported: vec!["energy", "memory", "ecc"],
            mig_devices: vec![mig(1, Some(gpm(0.5))), mig(2, None)],
            ..Default::default()
        };
        read.fields.pcie_replay = Some(4);
        read.fields.encoder_util = Some(12);
        read.fields.memory_reserved_bytes = Some(512);
        read.fields.gpm = Some(gpm(0.75));
        read.sharing.accounting_mode = Some(true);
        let held = Held::of(&read);
        let energy = HeldCounters::of(&read);
        assert_eq!(held.unsupported, ["ecc"], "only the slow readings'");
        assert_eq!(energy.unsupported, ["energy"], "only the counters'");
        assert_eq!(held.accounting_mode(), Some(true));

        // A later cycle: what charges containers is new, the slow readings are not read.
        let mut later = DeviceSample {
            uuid: "GPU-a".into(),
            memory_used_bytes: Some(2 << 30),
            unsupported: vec!["memory"],
            mig_devices: vec![mig(2, None), mig(1, None)],
            ..Default::default()
        };
        later.fields.memory_reserved_bytes = Some(1024);
        held.restore_device(&mut later);
        held.restore_fields(&mut later);
        assert_eq!(later.energy_mj, None, "energy is held on its own");
        assert_eq!(later.fields.pcie_replay, None, "with energy");
        energy.restore(&mut later);
        assert_eq!(later.energy_mj, Some(7_000));
        assert_eq!(later.fields.pcie_replay, Some(4));
        assert!(later.mig_enabled);
        assert_eq!(
            (later.power_mw, later.temperature_c, later.ecc_corrected),
            (Some(350_000), Some(61), Some(3))
        );
        assert_eq!(later.memory_used_bytes, Some(2 << 30), "read every cycle");
        assert_eq!(later.fields.memory_reserved_bytes, Some(1024));
        assert_eq!(later.fields.encoder_util, Some(12));
        assert_eq!(later.unsupported, ["memory", "ecc", "energy"]);
        assert_eq!(later.fields.gpm, None, "GPM is held on its own");
        held.restore_gpm(&mut later);
        assert_eq!(later.fields.gpm, Some(gpm(0.75)));
        assert_eq!(later.mig_devices[0].gpm, None);
        assert_eq!(later.mig_devices[1].gpm, Some(gpm(0.5)), "by GPU instance");
    }
}
