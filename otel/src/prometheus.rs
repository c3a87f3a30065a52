//! Prometheus text exposition of a snapshot (work in progress).
use gpu_model::{AgentStats, Snapshot};

use crate::{Groups, NodeIdentity};

#[derive(Debug, Clone, Default)]
pub struct PromOptions {
    pub node: NodeIdentity,
    pub groups: Groups,
    /// Also emit dcgm-exporter's names (DCGM_FI_DEV_*), per container.
    pub dcgm_compat: bool,
}

/// Renders the snapshot and the agent's own stats in the Prometheus text format 0.0.4.
pub fn render(_snap: &Snapshot, _stats: &AgentStats, _opts: &PromOptions) -> String {
    String::new()
}
