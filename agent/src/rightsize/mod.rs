//! `gpu-agent rightsize`: which workloads fit a smaller share of a GPU (a MIG profile, a
//! time-slicing replica, MPS limits), and how many GPUs that gives back, from the usage
//! records (docs/rightsizing.md).
//!
//! The arithmetic is in steps that another source of the same figures (Prometheus'
//! recording rules) can share:
//! 1. usage.rs: records -> one `Usage` per workload and GPU model (`aggregate`);
//! 2. recommend.rs: `recommend(&Usage, &Settings, &Profiles) -> Recommendation`, pure.
//!
//! The MIG profiles come from profiles.rs: the built-in table (mig_table.rs).
pub mod mig_table;
pub mod profiles;
pub mod recommend;
pub mod usage;

pub use profiles::{MigProfile, ModelProfiles, NvmlModel, Profiles, Source};
pub use recommend::{recommend, Kind, Recommendation, Settings};
pub use usage::{aggregate, Usage, WorkloadKey, Window};
