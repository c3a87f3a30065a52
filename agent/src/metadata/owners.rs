//! Each pod's owner, from the runtime's pod sandboxes (`ListPodSandbox`), kept per sandbox
//! while a listed container is in it.
use std::{collections::HashSet, path::Path, sync::Arc};

use gpu_model::Workload;

use super::{cri, workload::PodWorkloads};

/// How the last `ListPodSandbox` went, logged on change.
#[derive(Debug, Default, PartialEq)]
enum Sandboxes {
    #[default]
    NotAsked,
    Listed,
    Unimplemented,
    Failing(String),
}

/// The pods' owners, and how the runtime answered last.
#[derive(Debug, Default)]
pub struct PodOwners {
    pods: PodWorkloads,
    sandboxes: Sandboxes,
}

impl PodOwners {
    /// How many pods' owners are kept.
    pub fn kept(&self) -> usize {
        self.pods.kept()
    }

    /// The owners of the pods of a listing's containers. A sandbox's labels never change
    /// (CRI has no call to change them): `ListPodSandbox` is asked only when a container's
    /// sandbox is new, after the containers, so that it exists by then; the sandboxes no
    /// container is in any more are let go.
    pub async fn refresh(&mut self, sock: &Path, list: &[cri::Listed]) {
        let sandboxes: HashSet<&str> = list.iter().map(|c| c.sandbox.as_str()).collect();
        self.pods.retain(&sandboxes);
        if sandboxes.iter().any(|s| !self.pods.knows(s)) {
            self.list_sandboxes(sock).await;
        }
    }

    /// The pods' owners from `ListPodSandbox`. A runtime without it leaves them unknown
    /// (said once); a failed listing keeps those of the last one.
    async fn list_sandboxes(&mut self, sock: &Path) {
        let now = match cri::sandboxes(sock).await {
            Ok(Some(all)) => {
                self.pods.update(all);
                Sandboxes::Listed
            }
            Ok(None) => {
                self.pods = Default::default();
                Sandboxes::Unimplemented
            }
            Err(e) => Sandboxes::Failing(e),
        };
        if now == self.sandboxes {
            return;
        }
        match &now {
            Sandboxes::Unimplemented => tracing::info!(
                "CRI: the runtime does not implement ListPodSandbox; pods' workloads unknown"
            ),
            Sandboxes::Failing(e) => {
                tracing::warn!("CRI {e}; pods' workloads as last listed, retrying")
            }
            Sandboxes::Listed if matches!(self.sandboxes, Sandboxes::Failing(_)) => {
                tracing::info!("CRI: ListPodSandbox answers again")
            }
            _ => {}
        }
        self.sandboxes = now;
    }

    /// The owner of the pod of sandbox `id`.
    pub fn of_sandbox(&self, id: &str) -> Option<Arc<Workload>> {
        self.pods.of_sandbox(id)
    }

    /// The owner of the pod with uid `uid`.
    pub fn of_pod(&self, uid: &str) -> Option<Arc<Workload>> {
        self.pods.of_pod(uid)
    }
}
