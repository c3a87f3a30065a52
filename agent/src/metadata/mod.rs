//! Names and GPU allocations from the node's own sockets: the container runtime (CRI) for
//! container id -> pod/namespace/container names, the kubelet's pod-resources service for
//! which container is *allocated* which GPU, and the Docker API on plain Docker hosts.
//! The runtime's pod sandboxes name each pod's owner (`owners.rs`, `workload.rs`). Nothing needs
//! cluster-wide RBAC, and unknown names never block export.
//!
//! model.rs holds the published value (`Metadata`: names, allocations, replicas) and its
//! lookups, devices.rs parses the kubelet's device ids, sources.rs is the task that asks the
//! sockets (cri.rs, docker.rs, podresources.rs, owners.rs), backs off and publishes, and
//! requests.rs is the pipeline's side, which asks it for names. hami.rs reads HAMi's limits
//! for the join.
pub mod cri;
mod devices;
pub mod docker;
pub mod hami;
mod model;
pub mod owners;
pub mod podresources;
mod requests;
mod sources;
pub mod workload;

pub use devices::{is_gpu_resource, parse_device_id, DeviceRef};
pub use model::{Allocation, ContainerNames, Metadata};
pub use requests::{NameRequest, NameRequests};
pub use sources::{run, MetadataSource, CRI_CANDIDATES};
