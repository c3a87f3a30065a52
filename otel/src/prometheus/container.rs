//! The container and process families: each container's use of its devices, its
//! allocations, XID charges and accounts (energy, peaks, limits, what it holds), and each
//! GPU's idle energy; each process's use of its device.
use crate::catalogue::{Attr, MetricId as M, MetricId, ERROR_TYPES};

use super::{
    device::utilizations,
    text::{f, pct, Family},
    Renderer,
};

impl Renderer<'_> {
    pub(super) fn container_family(&self, id: MetricId, f: &mut Family) {
        let snap = self.snap;
        match id {
            M::ContainerGpuAllocated | M::ContainerGpuAllocatedIdle => {
                for (c, blocks) in snap.containers.iter().zip(&self.b.allocations) {
                    let idle = c.idle_allocations();
                    for (u, l) in c.allocated_gpus.iter().zip(blocks) {
                        let v = match id {
                            M::ContainerGpuAllocated => 1.0,
                            _ => idle.contains(&&**u) as u8 as f64,
                        };
                        f.series(l, &[], v);
                    }
                }
            }
            M::ContainerGpuEnergy
            | M::ContainerGpuMemoryPeak
            | M::ContainerGpuShare
            | M::ContainerGpuSmShare
            | M::ContainerGpuMemoryLimit
            | M::ContainerGpuUtilizationLimit
            | M::ContainerGpuAccountingTime
            | M::ContainerGpuAccountingProcesses => self.account_family(id, f),
            M::ContainerGpuErrors => {
                for (x, l) in snap.container_xids.iter().zip(&self.b.xids) {
                    let code = x.xid.to_string();
                    let labels = [
                        (Attr::ErrorType, ERROR_TYPES[3]),
                        (Attr::Xid, code.as_str()),
                    ];
                    f.series(l, &labels, x.count as f64);
                }
            }
            id => {
                for (c, blocks) in snap.containers.iter().zip(&self.b.containers) {
                    for (g, l) in c.gpus.iter().zip(blocks) {
                        match id {
                            M::ContainerGpuMemoryUsage => {
                                f.series(l, &[], g.memory_used_bytes as f64)
                            }
                            M::ContainerGpuUtilization => {
                                utilizations(f, l, [g.sm_util, g.mem_util, g.enc_util, g.dec_util])
                            }
                            M::ContainerGpuTime => {
                                if let Some(t) = g.gpu_time_seconds {
                                    f.series(l, &[], t)
                                }
                            }
                            M::ContainerGpuMemoryTime => f.series(l, &[], g.memory_byte_seconds),
                            M::ContainerGpuProcesses => f.series(l, &[], g.pids.len() as f64),
                            _ => {}
                        }
                    }
                }
            }
        }
    }

    /// Energy, peak memory, limits and NVML accounting per container and device, and each
    /// GPU's idle energy under `owner="idle"`.
    fn account_family(&self, id: MetricId, f: &mut Family) {
        let snap = self.snap;
        for (c, blocks) in snap.containers.iter().zip(&self.b.accounts) {
            for (a, l) in c.accounts.iter().zip(blocks) {
                let accounted = a.accounted_processes > 0;
                match id {
                    // No energy charged yet: no series rather than a 0.
                    M::ContainerGpuEnergy if a.energy_since_ms > 0 => {
                        f.series(l, &[], a.energy_joules)
                    }
                    M::ContainerGpuMemoryPeak => f.opt(l, &[], self::f(a.memory_peak_bytes)),
                    M::ContainerGpuShare | M::ContainerGpuSmShare => {
                        let v = match id {
                            M::ContainerGpuShare => a.gpus_held,
                            _ => a.sm_share,
                        };
                        if let Some(v) = v {
                            let (labels, n) = self.held_labels(a);
                            f.series(l, &labels[..n], v);
                        }
                    }
                    M::ContainerGpuMemoryLimit => {
                        if let (Some(v), Some(src)) = (a.memory_limit_bytes, a.memory_limit_source)
                        {
                            f.series(l, &[(Attr::LimitSource, src.as_str())], v as f64);
                        }
                    }
                    M::ContainerGpuUtilizationLimit => f.opt(l, &[], pct(a.sm_limit_percent)),
                    M::ContainerGpuAccountingTime if accounted => {
                        f.series(l, &[], a.accounted_gpu_seconds)
                    }
                    M::ContainerGpuAccountingProcesses if accounted => {
                        f.series(l, &[], a.accounted_processes as f64)
                    }
                    _ => {}
                }
            }
        }
        if id == M::ContainerGpuEnergy {
            for (d, l) in snap.devices.iter().zip(&self.b.idle) {
                f.opt(l, &[], d.sharing.idle_energy_joules);
            }
        }
    }

    /// `model` (the GPU's) and, on a MIG device, `mig_profile`: what rightsizing groups an
    /// account's series by.
    fn held_labels(&self, a: &gpu_model::GpuAccount) -> ([(Attr, &str); 2], usize) {
        let mut labels = [(Attr::HwModel, ""), (Attr::MigProfile, "")];
        let Some(d) = self.snap.devices.iter().find(|d| *d.uuid == *a.gpu_uuid) else {
            return (labels, 0);
        };
        labels[0].1 = &d.name;
        let mig = d.mig_devices.iter().find(|m| *m.uuid == *a.uuid);
        match mig.and_then(|m| m.profile.as_deref()) {
            Some(p) => {
                labels[1].1 = p;
                (labels, 2)
            }
            None => (labels, 1),
        }
    }

    pub(super) fn process_family(&self, id: MetricId, f: &mut Family) {
        for (p, l) in self.snap.processes.iter().zip(&self.b.processes) {
            match id {
                M::ProcessGpuMemoryUsage => f.series(l, &[], p.used_memory_bytes as f64),
                M::ProcessGpuUtilization => {
                    utilizations(f, l, [p.sm_util, p.mem_util, p.enc_util, p.dec_util])
                }
                _ => {}
            }
        }
    }
}
