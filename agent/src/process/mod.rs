//! Process state: for every host PID, its process and the cgroup (so the container or pod)
//! it belongs to. The tracker is its one owner; readers get the state behind a lock, and
//! the join reads it through `Resolver`.
pub mod cache;
pub mod cgroup;
pub mod procfs;
pub mod state;
pub mod tracker;

pub use state::{Placement, Resolver, State};
pub use tracker::Tracker;

/// The process state as the GPU join's owner asks it about PIDs the cache lacks.
pub trait Lookup {
    /// The PIDs of `pids` the cache does not place yet, in their order. One look at the
    /// state for all of them: a lock taken per PID (two atomic operations) made the CPU
    /// wait for each PID's cache misses before the next one's.
    fn missing(&self, pids: impl Iterator<Item = u32>) -> Vec<u32>;
    /// Places it from the kernel map, else /proc for that PID alone (counted). Whether
    /// that worked.
    fn look_up(&mut self, pid: u32) -> bool;
}
