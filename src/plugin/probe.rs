//! The host facts the plugin reads itself, beyond the inventory: which platform
//! device (`amdgpu_xcp_N`) backs each partition's render node, and whether the
//! device nodes it hands to containers exist.
//!
//! All reads go through [`HostRoot`]. This module must not decide anything; the
//! pure modules turn these facts into device IDs and health.

use crate::host::HostRoot;

use super::devices::{PluginDevice, XcpNames};
use super::health::NodeChecks;
use super::state::KFD_PATH;

const PLATFORM_DIR: &str = "/sys/devices/platform";
/// Platform devices are `amdgpu_xcp_N` on some kernels and `amdgpu_xcp.N`
/// (the platform bus's own `name.id` form) on others.
const XCP_PREFIXES: [&str; 2] = ["amdgpu_xcp_", "amdgpu_xcp."];

/// Render minor → platform device name, for every `amdgpu_xcp_N` that has a
/// render node. Unreadable directories are logged and skipped: a missing name
/// only means the fallback device ID is used.
pub(crate) fn xcp_names(host: &HostRoot) -> XcpNames {
    let mut names = XcpNames::new();
    let entries = match host.list_dir_or_empty(PLATFORM_DIR) {
        Ok(entries) => entries,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list platform devices; partition IDs use the fallback form");
            return names;
        }
    };
    for name in entries
        .into_iter()
        .filter(|n| XCP_PREFIXES.iter().any(|p| n.starts_with(p)))
    {
        let drm = format!("{PLATFORM_DIR}/{name}/drm");
        match host.list_dir_or_empty(&drm) {
            Ok(nodes) => {
                for node in nodes {
                    if let Some(minor) = node.strip_prefix("renderD").and_then(|m| m.parse().ok()) {
                        names.insert(minor, name.clone());
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot list DRM nodes of {name}"),
        }
    }
    names
}

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
    fn finds_platform_devices_by_render_minor() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        host.create_dir_all("/sys/devices/platform/amdgpu_xcp_3/drm/renderD131")
            .unwrap();
        host.create_dir_all("/sys/devices/platform/amdgpu_xcp_3/drm/card3")
            .unwrap();
        host.create_dir_all("/sys/devices/platform/amdgpu_xcp.5/drm/renderD133")
            .unwrap();
        host.create_dir_all("/sys/devices/platform/amdgpu_xcp_4/drm/renderDx")
            .unwrap();
        host.create_dir_all("/sys/devices/platform/serial8250")
            .unwrap();
        assert_eq!(
            xcp_names(&host),
            XcpNames::from([
                (131, "amdgpu_xcp_3".to_owned()),
                (133, "amdgpu_xcp.5".to_owned())
            ])
        );
        assert!(xcp_names(&HostRoot::new(dir.path().join("absent"))).is_empty());
    }

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
