//! The host facts the plugin reads itself, beyond the inventory: whether the
//! device nodes it hands to containers exist.
//!
//! All reads go through [`HostRoot`]. This module must not decide anything; the
//! pure modules turn these facts into device IDs and health.

use crate::host::HostRoot;

use super::devices::PluginDevice;
use super::health::NodeChecks;
use super::state::KFD_PATH;

/// Presence of `/dev/kfd` and of every device's DRM nodes.
pub(crate) fn node_checks<'a>(
    host: &HostRoot,
    driver_loaded: bool,
    devices: impl IntoIterator<Item = &'a PluginDevice>,
) -> NodeChecks {
    let mut checks = NodeChecks {
        driver_loaded,
        kfd_present: host.exists(KFD_PATH),
        ..NodeChecks::default()
    };
    for device in devices {
        for node in device.dri_nodes() {
            if !checks.missing_nodes.contains(&node) && !host.exists(&node) {
                checks.missing_nodes.insert(node);
            }
        }
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_presence_of_kfd_and_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        host.write("/dev/kfd", "").unwrap();
        host.write("/dev/dri/card0", "").unwrap();
        let device = PluginDevice {
            id: "0000:05:00.0".into(),
            gpu_bdf: "0000:05:00.0".into(),
            partition: None,
            numa_node: None,
            card: Some(0),
            render_minor: Some(128),
        };
        let checks = node_checks(&host, true, [&device]);
        assert!(checks.kfd_present && checks.driver_loaded);
        assert_eq!(
            checks.missing_nodes.into_iter().collect::<Vec<_>>(),
            ["/dev/dri/renderD128"]
        );
    }
}
