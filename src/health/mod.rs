//! GPU health monitor: decides, every fraction of a second, whether each GPU is
//! fit to be handed to a container, and tells the device plugin, the Node and
//! anyone listening.
//!
//! Checks per GPU ([`checks`], pure): the PCI function is present and bound to
//! amdgpu; `/dev/kfd` and the GPU's DRM nodes exist; uncorrectable ECC errors of
//! every RAS block stay within their threshold (default 0); the junction
//! temperature stays below its critical limit; the PCIe link runs at its maximum
//! width and speed; no GPU seen since the monitor started has disappeared.
//! Thresholds come from the exporter's `config.json` (`HealthThresholds`), the
//! same ConfigMap as the metrics. Flapping is damped ([`damping`]): several bad
//! samples in a row make a GPU Unhealthy, several good ones Healthy again.
//!
//! Outputs of a running [`HealthMonitor`]:
//! - [`HealthMonitor::report`]: the [`HealthReport`] the device plugin consumes
//!   (its devices turn Unhealthy within about 0.6 s at the default 500 ms
//!   interval and 100 ms confirmation, see [`monitor`]);
//! - [`HealthMonitor::snapshot`]: per-GPU state and reasons, for `gpu_health`
//!   and the Node;
//! - [`HealthMonitor::subscribe`]: a stream of [`HealthTransition`]s.
//!
//! Device nodes and `/dev/kfd` are not stat'ed every sample: [`nodes`]
//! watches `/dev` and `/dev/dri` with inotify and checks them when something
//! there changed (and at least every 10 s). A GPU's missing nodes are no
//! evidence while its partition modes on sysfs differ from the inventory's:
//! the host was repartitioned and the device watch has not looked again yet,
//! so the inventory still names the old layout's nodes, gone on purpose.
//!
//! Pure decisions for the Node ([`outputs`]): the `AMDGPUUnhealthy` condition,
//! the reference's `metricsexporter.amd.com.gpu.<id>.state=unhealthy` labels,
//! Events; [`node`] writes condition and labels. Samples and thresholds come
//! from [`crate::telemetry`] (read through [`crate::host::reader`]), so a hung
//! sysfs file costs one value, not the monitor; the exporter reads the same
//! module, and neither imports the other. This module must not serve metrics or touch
//! the Kubernetes API outside [`node`].

pub mod checks;
pub mod damping;
pub mod monitor;
pub mod node;
pub mod nodes;
pub mod outputs;

use std::collections::BTreeMap;

use serde::Serialize;

pub use checks::Thresholds;
pub use damping::Damping;
pub use monitor::{HealthConfig, HealthMonitor, MonitorState, check_once};
pub use node::{
    NODE_HEALTH_PUBLISHER, NodeHealthError, NodeHealthPublisher, NodeHealthWrite,
    apply_node_health, apply_node_health_to, remove_node_health,
};

pub use crate::plugin::HealthReport;

/// One GPU's health.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GpuHealth {
    pub healthy: bool,
    /// Why it is unhealthy; empty when healthy.
    pub reasons: Vec<String>,
    /// Its logical GPU ids (`gpu_id` label; one per partition), as last seen.
    pub gpu_ids: Vec<u32>,
}

/// Every GPU's health, by PCI address.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HealthSnapshot {
    pub gpus: BTreeMap<String, GpuHealth>,
}

impl HealthSnapshot {
    pub fn unhealthy(&self) -> impl Iterator<Item = (&String, &GpuHealth)> {
        self.gpus.iter().filter(|(_, h)| !h.healthy)
    }
}

/// A GPU changed state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HealthTransition {
    pub bdf: String,
    pub healthy: bool,
    /// Why it became unhealthy; empty on recovery.
    pub reasons: Vec<String>,
    pub gpu_ids: Vec<u32>,
}
