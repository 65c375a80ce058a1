//! Device health as the plugin advertises it: a pure combination of the plugin's
//! own checks and whatever other health sources report.
//!
//! The plugin's own checks are the preconditions for handing a device to a
//! container: the amdgpu driver is loaded, `/dev/kfd` exists, and the device's
//! `/dev/dri/cardN` and `/dev/dri/renderDN` exist. Everything else (ECC errors,
//! hangs, thermal trips...) comes from other health sources through a
//! [`HealthReport`], the small interface a health monitor feeds through a
//! `tokio::sync::watch` channel. This module must not do I/O: presence of device
//! nodes arrives as [`NodeChecks`].

use std::collections::{BTreeMap, BTreeSet};

use super::devices::PluginDevice;

/// Whether a device may be allocated, and if not, why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    Healthy,
    Unhealthy { reason: String },
}

impl Health {
    pub fn is_healthy(&self) -> bool {
        matches!(self, Health::Healthy)
    }
}

/// Names a GPU, or one partition of it, independently of device IDs and
/// resource names (which depend on the naming strategy and partition mode).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceRef {
    /// PCI address of the GPU, `dddd:bb:dd.f`, lowercase.
    pub bdf: String,
    /// Partition index; `None` means the whole GPU, all partitions included.
    pub partition: Option<u32>,
}

impl DeviceRef {
    pub fn gpu(bdf: impl Into<String>) -> Self {
        Self {
            bdf: bdf.into(),
            partition: None,
        }
    }

    pub fn partition(bdf: impl Into<String>, index: u32) -> Self {
        Self {
            bdf: bdf.into(),
            partition: Some(index),
        }
    }
}

/// What health sources other than the plugin know: the devices that are
/// unhealthy, each with a reason. Anything not listed is healthy as far as they
/// know. A health monitor owns a `watch::Sender<HealthReport>` and replaces the
/// whole report when anything changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HealthReport {
    pub unhealthy: BTreeMap<DeviceRef, String>,
}

impl HealthReport {
    /// The reason a device is unhealthy: an entry for its partition, else one
    /// for its whole GPU.
    pub fn problem(&self, device: &PluginDevice) -> Option<&str> {
        let gpu = DeviceRef::gpu(device.gpu_bdf.clone());
        device
            .partition
            .and_then(|p| {
                self.unhealthy
                    .get(&DeviceRef::partition(device.gpu_bdf.clone(), p))
            })
            .or_else(|| self.unhealthy.get(&gpu))
            .map(String::as_str)
    }
}

/// Results of the plugin's own host checks, gathered at the edge.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeChecks {
    /// The amdgpu driver is loaded (from discovery).
    pub driver_loaded: bool,
    /// `/dev/kfd` exists.
    pub kfd_present: bool,
    /// Host paths of DRM nodes that do not exist.
    pub missing_nodes: BTreeSet<String>,
}

/// The health of one device. The first failing check gives the reason, so
/// the reason names the most basic problem.
pub fn device_health(device: &PluginDevice, checks: &NodeChecks, report: &HealthReport) -> Health {
    let unhealthy = |reason: String| Health::Unhealthy { reason };
    if !checks.driver_loaded {
        return unhealthy("the amdgpu driver is not loaded".into());
    }
    if !checks.kfd_present {
        return unhealthy("/dev/kfd does not exist".into());
    }
    if device.card.is_none() || device.render_minor.is_none() {
        return unhealthy("discovery found no DRM card or render node for it".into());
    }
    if let Some(node) = device
        .dri_nodes()
        .into_iter()
        .find(|n| checks.missing_nodes.contains(n))
    {
        return unhealthy(format!("{node} does not exist"));
    }
    match report.problem(device) {
        Some(reason) => unhealthy(reason.to_owned()),
        None => Health::Healthy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(partition: Option<u32>) -> PluginDevice {
        PluginDevice {
            id: "x".into(),
            gpu_bdf: "0000:05:00.0".into(),
            partition,
            numa_node: None,
            card: Some(1),
            render_minor: Some(129),
        }
    }

    fn ok_checks() -> NodeChecks {
        NodeChecks {
            driver_loaded: true,
            kfd_present: true,
            missing_nodes: BTreeSet::new(),
        }
    }

    fn reason(h: Health) -> String {
        match h {
            Health::Unhealthy { reason } => reason,
            Health::Healthy => panic!("expected unhealthy"),
        }
    }

    #[test]
    fn healthy_when_everything_is_present() {
        let h = device_health(&device(None), &ok_checks(), &HealthReport::default());
        assert_eq!(h, Health::Healthy);
    }

    #[test]
    fn driver_kfd_and_nodes_are_required() {
        let report = HealthReport::default();
        let mut checks = ok_checks();
        checks.driver_loaded = false;
        assert!(reason(device_health(&device(None), &checks, &report)).contains("driver"));

        let mut checks = ok_checks();
        checks.kfd_present = false;
        assert!(reason(device_health(&device(None), &checks, &report)).contains("/dev/kfd"));

        let mut checks = ok_checks();
        checks.missing_nodes.insert("/dev/dri/renderD129".into());
        assert_eq!(
            reason(device_health(&device(None), &checks, &report)),
            "/dev/dri/renderD129 does not exist"
        );

        let mut no_render = device(None);
        no_render.render_minor = None;
        assert!(reason(device_health(&no_render, &ok_checks(), &report)).contains("render"));
    }

    #[test]
    fn reports_apply_to_the_partition_or_its_whole_gpu() {
        let mut report = HealthReport::default();
        report
            .unhealthy
            .insert(DeviceRef::partition("0000:05:00.0", 2), "ECC".into());
        assert_eq!(
            device_health(&device(Some(1)), &ok_checks(), &report),
            Health::Healthy
        );
        assert_eq!(
            reason(device_health(&device(Some(2)), &ok_checks(), &report)),
            "ECC"
        );

        report
            .unhealthy
            .insert(DeviceRef::gpu("0000:05:00.0"), "hung".into());
        assert_eq!(
            reason(device_health(&device(Some(1)), &ok_checks(), &report)),
            "hung"
        );
        assert_eq!(
            reason(device_health(&device(None), &ok_checks(), &report)),
            "hung"
        );
        // The partition's own entry is more specific than the GPU's.
        assert_eq!(
            reason(device_health(&device(Some(2)), &ok_checks(), &report)),
            "ECC"
        );
    }
}
