//! What the DRA plugin currently offers and how each device is: the one
//! snapshot the ResourceSlice publisher, the prepare path and the health
//! streams all read.
//!
//! Health uses the device plugin's rules ([`device_health`]): driver, `/dev/kfd`
//! and the device's DRM nodes present, and nothing reported by the health
//! monitor. Pure; the host checks come in as [`NodeChecks`].

use std::collections::BTreeMap;

use crate::plugin::{
    Health, HealthReport, PluginDevice, health::NodeChecks, health::device_health,
};

use super::devices::DraDevice;
use super::slices::Unhealthy;

/// The longest `message` the kubelet keeps; longer ones it cuts itself, we
/// cut first so the cut is ours and says so.
pub const MAX_MESSAGE: usize = 1024;

/// The devices on offer and each one's health, by device name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Published {
    pub devices: Vec<DraDevice>,
    pub health: BTreeMap<String, Health>,
}

impl Published {
    /// Each device's health, by name: `devices` as the device plugin's rules
    /// see them ([`DraDevice::as_plugin_device`], whose `id` is the name).
    pub fn health_of(
        devices: &[PluginDevice],
        checks: &NodeChecks,
        report: &HealthReport,
    ) -> BTreeMap<String, Health> {
        devices
            .iter()
            .map(|d| (d.id.clone(), device_health(d, checks, report)))
            .collect()
    }

    /// The unhealthy devices with their reasons, for the slices' taints.
    pub fn unhealthy(&self) -> Unhealthy {
        self.health
            .iter()
            .filter_map(|(name, h)| match h {
                Health::Unhealthy { reason } => Some((name.clone(), reason.clone())),
                Health::Healthy => None,
            })
            .collect()
    }
}

/// A health message within the kubelet's limit.
pub fn message(health: &Health) -> String {
    match health {
        Health::Healthy => String::new(),
        Health::Unhealthy { reason } if reason.len() <= MAX_MESSAGE => reason.clone(),
        Health::Unhealthy { reason } => {
            let mut end = MAX_MESSAGE - 3;
            while !reason.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}...", &reason[..end])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_reasons_are_cut_to_the_kubelets_limit() {
        let long = Health::Unhealthy {
            reason: "é".repeat(600),
        };
        let m = message(&long);
        assert!(m.len() <= MAX_MESSAGE && m.ends_with("..."), "{}", m.len());
        assert_eq!(message(&Health::Healthy), "");
        let short = Health::Unhealthy {
            reason: "uncorrectable ECC".into(),
        };
        assert_eq!(message(&short), "uncorrectable ECC");
    }
}
