//! Sinks and endpoints: they read the published snapshots and the agent's stats, and never
//! reach back into the sources.
pub mod export;
pub mod http;
pub mod top;
pub mod usage;
