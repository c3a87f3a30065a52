//! The smallest share of a GPU a workload's use fits, and the GPUs that gives back: a pure
//! function of a `Usage`, the settings and the MIG profiles (docs/rightsizing.md).
use serde::Serialize;

use super::{
    profiles::{ModelProfiles, Profiles},
    usage::Usage,
};

/// The most replicas time-slicing is asked to make of one GPU.
pub const MAX_TIME_SLICES: u32 = 8;

/// Float slack: 0.1 x 1.2 is 0.12000000000000001, which must not round up to 13 %.
const EPS: f64 = 1e-9;

#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Added to the needs: 0.2 asks for 20 % above the peak memory and the p95 SM use.
    pub headroom: f64,
    /// Less coverage than this (seconds, all containers together): insufficient data.
    pub min_coverage_s: f64,
    /// Consider MIG profiles (`--no-mig` turns it off: time-slicing instead).
    pub mig: bool,
    /// Recommend MPS limits instead of MIG or time-slicing.
    pub mps: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A MIG profile.
    Mig,
    /// One of `1/share` time-slicing replicas.
    TimeSlice,
    /// MPS limits.
    Mps,
    /// It needs the whole GPU.
    Keep,
    /// Allocated, never used: give it back.
    Release,
    /// Too little coverage to say.
    InsufficientData,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Mig => "mig",
            Kind::TimeSlice => "time-slice",
            Kind::Mps => "mps",
            Kind::Keep => "keep",
            Kind::Release => "release",
            Kind::InsufficientData => "insufficient-data",
        }
    }
}

/// What a workload should ask for instead of what it holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recommendation {
    pub kind: Kind,
    /// The MIG profile (`1g.10gb`).
    pub profile: Option<String>,
    /// The part of a GPU a time-slicing replica is: 1/k.
    pub share: Option<f64>,
    /// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE.
    pub mps_thread_pct: Option<u32>,
    /// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, bytes (whole MiB).
    pub mps_mem_limit_bytes: Option<u64>,
    /// The part of a GPU one container would hold (0 for release; 1 for keep).
    #[serde(skip)]
    pub fraction: f64,
    /// GPUs given back: max(0, allocated - instances x fraction); 0 for keep and
    /// insufficient data.
    #[serde(skip)]
    pub gpus_saved: f64,
}

impl Recommendation {
    fn of(kind: Kind) -> Recommendation {
        Recommendation {
            kind,
            profile: None,
            share: None,
            mps_thread_pct: None,
            mps_mem_limit_bytes: None,
            fraction: 1.0,
            gpus_saved: 0.0,
        }
    }

    /// `u`'s saving at `fraction` of a GPU per container.
    fn saving(mut self, u: &Usage, fraction: f64) -> Recommendation {
        self.fraction = fraction;
        self.gpus_saved = (u.gpus_allocated - u.instances * fraction).max(0.0);
        self
    }
}

/// What one container needs: memory (bytes) and SM (part of a whole GPU), headroom added.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Need {
    pub memory_bytes: f64,
    pub sm: f64,
}

/// Peak memory and the highest p95 of SM use, each x (1 + headroom). A workload that never
/// said its SM use needs the whole slice it held (no headroom: it fit there); where some
/// of its stretches said, theirs stands for all (a stretch's first moments may say none).
pub fn need(u: &Usage, headroom: f64) -> Need {
    let grow = 1.0 + headroom;
    let sm = match u.sm_p95 {
        Some(s) => s * grow,
        None => u.sm_unknown_share.unwrap_or(0.0),
    };
    Need {
        memory_bytes: u.memory_peak_bytes as f64 * grow,
        sm,
    }
}

/// The recommendation for one workload on one GPU model.
pub fn recommend(u: &Usage, s: &Settings, profiles: &Profiles) -> Recommendation {
    if u.coverage_s < s.min_coverage_s {
        return Recommendation::of(Kind::InsufficientData);
    }
    if !u.used {
        return Recommendation::of(Kind::Release).saving(u, 0.0);
    }
    let need = need(u, s.headroom);
    let model = profiles.for_model(&u.key.device_model, u.device_memory_bytes);
    // The GPU's memory: what the records said, else the largest profile of its model.
    let device_memory = u.device_memory_bytes.or_else(|| {
        let largest = model?.profiles.iter().map(|p| p.memory_bytes()).max()?;
        Some(largest)
    });
    let r = match (s.mps, model.filter(|_| s.mig)) {
        (true, _) => mps(need, device_memory),
        (false, Some(m)) => mig(need, m),
        (false, None) => time_slice(need, device_memory),
    };
    match r {
        Some((r, fraction)) => r.saving(u, fraction),
        None => Recommendation::of(Kind::Keep),
    }
}

/// The smallest profile both needs fit: fewest compute slices, then least memory, plain
/// before variants. None when only the whole GPU fits.
fn mig(need: Need, m: &ModelProfiles) -> Option<(Recommendation, f64)> {
    let total = f64::from(m.total_slices.max(1));
    let fits = m.candidates().filter(|p| {
        p.slices < m.total_slices
            && need.memory_bytes <= p.memory_bytes() as f64
            && need.sm <= f64::from(p.slices) / total + EPS
    });
    let best = fits.min_by_key(|p| (p.slices, p.memory_mib, !p.is_plain()))?;
    let r = Recommendation {
        profile: Some(best.name.clone()),
        ..Recommendation::of(Kind::Mig)
    };
    Some((r, f64::from(best.slices) / total))
}

/// k replicas of the GPU, as many as both needs allow (at most 8); None below 2.
fn time_slice(need: Need, device_memory: Option<u64>) -> Option<(Recommendation, f64)> {
    let by_sm = 1.0 / need.sm;
    let by_memory = device_memory? as f64 / need.memory_bytes;
    let k = (by_sm.min(by_memory) + EPS)
        .floor()
        .min(f64::from(MAX_TIME_SLICES));
    if k < 2.0 {
        return None;
    }
    let r = Recommendation {
        share: Some(1.0 / k),
        ..Recommendation::of(Kind::TimeSlice)
    };
    Some((r, 1.0 / k))
}

/// MPS limits: the SM need in whole percent, the memory need in whole MiB. None when they
/// come to the whole GPU.
fn mps(need: Need, device_memory: Option<u64>) -> Option<(Recommendation, f64)> {
    let device_memory = device_memory? as f64;
    let pct = ((need.sm * 100.0 - EPS).ceil() as u32).clamp(1, 100);
    let mib = ((need.memory_bytes / (1u64 << 20) as f64 - EPS).ceil() as u64).max(1);
    let bytes = mib << 20;
    let fraction = (f64::from(pct) / 100.0).max(bytes as f64 / device_memory);
    if fraction >= 1.0 {
        return None;
    }
    let r = Recommendation {
        mps_thread_pct: Some(pct),
        mps_mem_limit_bytes: Some(bytes),
        ..Recommendation::of(Kind::Mps)
    };
    Some((r, fraction))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::rightsize::{
        profiles::{MigProfile, NvmlModel},
        usage::WorkloadKey,
    };

    const GIB: u64 = 1 << 30;
    const H100: &str = "NVIDIA H100 80GB HBM3";
    const H100_MEMORY: u64 = 85_520_809_984;
    const L4: &str = "NVIDIA L4";
    const L4_MEMORY: u64 = 23034 << 20;

    /// A week of one Deployment's use of a GPU of `model` (`memory` bytes): its peak and
    /// SM p95.
    pub(crate) fn usage(model: &str, memory: u64, peak_gib: u64, sm_pct: u32) -> Usage {
        Usage {
            key: WorkloadKey {
                namespace: "ml".into(),
                workload_kind: "Deployment".into(),
                workload: "serve".into(),
                device_model: model.into(),
            },
            coverage_s: 7.0 * 86400.0,
            lifespan_s: 7.0 * 86400.0,
            gpus_allocated: 1.0,
            instances: 1.0,
            memory_peak_bytes: peak_gib * GIB,
            sm_p95: Some(f64::from(sm_pct) / 100.0),
            sm_unknown_share: None,
            used: true,
            device_memory_bytes: Some(memory),
            mig_profile: None,
            containers: vec![],
        }
    }

    pub(crate) fn settings() -> Settings {
        Settings {
            headroom: 0.2,
            min_coverage_s: 86400.0,
            mig: true,
            mps: false,
        }
    }

    fn rec(u: &Usage, s: &Settings) -> Recommendation {
        recommend(u, s, &Profiles::table())
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn the_known_answers() {
        let s = settings();
        let small = rec(&usage(H100, H100_MEMORY, 7, 10), &s);
        assert_eq!(
            (small.kind, small.profile.as_deref()),
            (Kind::Mig, Some("1g.10gb"))
        );
        assert!(close(small.gpus_saved, 6.0 / 7.0), "{small:?}");
        let mid = rec(&usage(H100, H100_MEMORY, 30, 35), &s);
        assert_eq!(
            (mid.kind, mid.profile.as_deref()),
            (Kind::Mig, Some("3g.40gb"))
        );
        assert!(close(mid.gpus_saved, 4.0 / 7.0), "{mid:?}");
        let whole = rec(&usage(H100, H100_MEMORY, 75, 95), &s);
        assert_eq!((whole.kind, whole.gpus_saved), (Kind::Keep, 0.0));
        let mut idle = usage(H100, H100_MEMORY, 0, 0);
        idle.used = false;
        let idle = rec(&idle, &s);
        assert_eq!((idle.kind, idle.gpus_saved), (Kind::Release, 1.0));
        let l4 = rec(&usage(L4, L4_MEMORY, 6, 15), &s);
        assert_eq!((l4.kind, l4.share), (Kind::TimeSlice, Some(1.0 / 3.0)));
        assert!(close(l4.gpus_saved, 2.0 / 3.0), "{l4:?}");
    }

    #[test]
    fn memory_alone_can_ask_for_a_larger_profile() {
        // 15 GiB x 1.2 = 18 GiB: past 1g.10gb, within 1g.20gb (one compute slice).
        let r = rec(&usage(H100, H100_MEMORY, 15, 5), &settings());
        assert_eq!(r.profile.as_deref(), Some("1g.20gb"));
        // SM alone: 20 % x 1.2 = 24 %, more than one slice (14.3 %), within two (28.6 %).
        let r = rec(&usage(H100, H100_MEMORY, 1, 20), &settings());
        assert_eq!(r.profile.as_deref(), Some("2g.20gb"));
        // A need just over a profile's memory takes the next one.
        let mut u = usage(H100, H100_MEMORY, 0, 5);
        u.memory_peak_bytes = (9984u64 << 20) + 1;
        let r = recommend(
            &u,
            &Settings {
                headroom: 0.0,
                ..settings()
            },
            &Profiles::table(),
        );
        assert_eq!(r.profile.as_deref(), Some("1g.20gb"));
    }

    #[test]
    fn the_a30_has_four_slices() {
        let a30 = |peak, sm| rec(&usage("NVIDIA A30", 24 * GIB, peak, sm), &settings());
        let r = a30(4, 20);
        assert_eq!(r.profile.as_deref(), Some("1g.6gb"));
        assert!(close(r.gpus_saved, 0.75));
        // 30 % x 1.2 is more than a quarter: two of four slices (on a 7-slice GPU, three).
        assert_eq!(a30(4, 30).profile.as_deref(), Some("2g.12gb"));
        assert_eq!(a30(4, 70).kind, Kind::Keep);
    }

    #[test]
    fn no_mig_time_slices_a_mig_gpu_and_mps_sets_limits() {
        let no_mig = Settings {
            mig: false,
            ..settings()
        };
        // 1/0.12 = 8.3 and 80 GiB / 8.4 GiB = 9.5: eight replicas (the most).
        let r = rec(&usage(H100, H100_MEMORY, 7, 10), &no_mig);
        assert_eq!((r.kind, r.share), (Kind::TimeSlice, Some(0.125)));
        let mps = Settings {
            mps: true,
            ..settings()
        };
        let r = rec(&usage(H100, H100_MEMORY, 7, 10), &mps);
        assert_eq!(r.kind, Kind::Mps);
        // 12 %, not 13: 0.1 x 1.2 is not quite 0.12 in floating point.
        assert_eq!(r.mps_thread_pct, Some(12));
        // 8.4 GiB is 8601.6 MiB: 8602 MiB.
        assert_eq!(r.mps_mem_limit_bytes, Some(8602 << 20));
        assert!(close(r.fraction, 0.12), "{r:?}");
        assert!(close(r.gpus_saved, 0.88));
        let r = rec(&usage(H100, H100_MEMORY, 75, 95), &mps);
        assert_eq!(r.kind, Kind::Keep);
    }

    #[test]
    fn too_little_coverage_says_so_before_anything_else() {
        let mut u = usage(H100, H100_MEMORY, 7, 10);
        u.coverage_s = 3600.0;
        u.used = false;
        let r = rec(&u, &settings());
        assert_eq!((r.kind, r.gpus_saved), (Kind::InsufficientData, 0.0));
    }

    #[test]
    fn an_unknown_sm_use_needs_the_slice_it_held() {
        let mut u = usage(H100, H100_MEMORY, 7, 0);
        (u.sm_p95, u.sm_unknown_share) = (None, Some(2.0 / 7.0));
        u.gpus_allocated = 2.0 / 7.0;
        let r = rec(&u, &settings());
        assert_eq!(r.profile.as_deref(), Some("2g.20gb"));
        assert_eq!(r.gpus_saved, 0.0);
        // On a GPU without MIG, unknown SM use on the whole GPU keeps it.
        let mut u = usage(L4, L4_MEMORY, 1, 0);
        (u.sm_p95, u.sm_unknown_share) = (None, Some(1.0));
        assert_eq!(rec(&u, &settings()).kind, Kind::Keep);
        // Where some stretch said, its figure stands: a stretch's first moments without one
        // do not make the workload need its whole GPU.
        u.sm_p95 = Some(0.1);
        assert!(close(need(&u, 0.2).sm, 0.12));
    }

    #[test]
    fn replicas_save_per_instance_and_nvml_profiles_are_used() {
        let mut u = usage(H100, H100_MEMORY, 7, 10);
        (u.gpus_allocated, u.instances) = (3.0, 3.0);
        assert!(close(rec(&u, &settings()).gpus_saved, 3.0 - 3.0 / 7.0));
        // This node's NVML says the smallest profile has 8 GiB: 8.4 GiB no longer fits it.
        let read = vec![NvmlModel {
            name: H100.into(),
            memory_bytes: H100_MEMORY,
            profiles: vec![
                MigProfile {
                    name: "1g.8gb".into(),
                    slices: 1,
                    memory_mib: 8192,
                    placements: vec![],
                },
                MigProfile {
                    name: "2g.16gb".into(),
                    slices: 2,
                    memory_mib: 16384,
                    placements: vec![],
                },
                MigProfile {
                    name: "7g.80gb".into(),
                    slices: 7,
                    memory_mib: 81152,
                    placements: vec![],
                },
            ],
            error: None,
        }];
        let r = recommend(&u, &settings(), &Profiles::with_nvml(Ok(read)));
        assert_eq!(r.profile.as_deref(), Some("2g.16gb"));
    }
}
