//! Devices allocated through DRA claims, as the kubelet's pod-resources names them.
use std::sync::Arc;

use serde::Serialize;

use crate::Name;

/// One device of a DRA claim as the kubelet's pod-resources names it (a `ClaimResource` of a
/// `DynamicResource`): what dcgm-exporter's `dra_*` labels say.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize)]
pub struct DraDevice {
    pub claim_namespace: String,
    pub claim_name: String,
    pub driver: String,
    pub pool: String,
    /// The driver's name for it: `gpu-0`, `gpu-0-mig-1g10gb-19-0`.
    pub device: String,
}

/// A device a container holds through a DRA claim: the device it is (a GPU's or MIG
/// device's UUID), the claim's device, and how many containers hold that claim's device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClaimDevice {
    pub uuid: Name,
    pub dra: Arc<DraDevice>,
    /// The containers the kubelet lists holding this claim's device (1 or more): a claim
    /// shared by N containers gives each 1/N of the device.
    pub holders: u32,
}
