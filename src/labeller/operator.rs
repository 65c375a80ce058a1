//! What the reference decides about labels at the operator, not in its node
//! labeller: which label kinds a DeviceConfig asks for, and the driver-type
//! label its controller writes on Nodes.
//!
//! Rules from ROCm/gpu-operator:
//! - `internal/nodelabeller/nodelabeller.go`, `SetNodeLabellerAsDesired`: the
//!   labeller's flags are `containerCommandArgs` (the seven defaults), or
//!   `vfPassthroughCommandArgs` (`-device-id -driver-version`) or
//!   `pfPassthroughCommandArgs` (`-device-id`) by `spec.driver.driverType`,
//!   whatever `spec.driver.enable` says, and every `nodeLabellerArguments`
//!   entry is appended as a further flag;
//! - `internal/utils.go`, `UpdateDriverTypeNodeLabel` and
//!   `GetDriverTypeNodeLabel`: with `spec.driver.enable`, every Node the
//!   DeviceConfig selects carries `gpu.operator.amd.com/<ns>.<name>.driver=<driverType>`
//!   (`DriverTypeNodeLabelTemplate`). `handleKMMModule` writes it on each
//!   reconcile; `finalizeDeviceConfig` removes it when the DeviceConfig is
//!   deleted (only while `enable` is still true).
//!
//! Pure functions; the caller writes what they return.

use std::collections::BTreeMap;

use crate::api::{DeviceConfigSpec, DriverType, NodeLabellerKind as LabelKind, Operand};

/// The label kinds the node labeller runs for `spec`: the reference's base
/// set for its driver type, plus every recognised `nodeLabellerArguments`
/// entry, sorted and without duplicates. Unrecognised entries are skipped
/// (`validate` reports them).
pub fn kinds_for(spec: &DeviceConfigSpec) -> Vec<LabelKind> {
    let base: &[LabelKind] = match spec.driver().driver_type {
        DriverType::VfPassthrough => &[LabelKind::DeviceId, LabelKind::DriverVersion],
        DriverType::PfPassthrough => &[LabelKind::DeviceId],
        // `container`, and a value the reference does not know (its code
        // falls through to the container flags).
        DriverType::Container | DriverType::Other(_) => LabelKind::DEFAULTS,
    };
    spec.device_plugin().node_labeller_kinds_over(base)
}

/// The driver-type label of the DeviceConfig `namespace/name` on a Node it
/// selects: one label while `spec.driver.enable`, none otherwise (so a writer
/// that applies the whole set removes it once `enable` is off, where the
/// reference leaves it until the DeviceConfig is deleted). A key longer than
/// Kubernetes allows (a long name) is left out: the reference's patch would be
/// refused.
pub fn driver_type_labels(
    namespace: &str,
    name: &str,
    spec: &DeviceConfigSpec,
) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    if !spec.is_enabled(Operand::Driver) {
        return labels;
    }
    let key = format!("gpu.operator.amd.com/{namespace}.{name}.driver");
    if super::key_name_fits(&key) {
        labels.insert(key, spec.driver().driver_type.as_str().to_owned());
    } else {
        tracing::warn!(label = %key, "driver type label key longer than Kubernetes allows; not written");
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(driver_type: &str, enable: bool, arguments: &[&str]) -> DeviceConfigSpec {
        let mut spec = DeviceConfigSpec::default();
        spec.driver_mut().enable = enable;
        spec.driver_mut().driver_type = DriverType::from(driver_type);
        spec.device_plugin_mut().node_labeller_arguments =
            arguments.iter().map(|a| (*a).to_owned()).collect();
        spec
    }

    #[test]
    fn kinds_follow_the_driver_type_then_the_arguments() {
        use LabelKind::*;
        // (driverType, driver.enable, nodeLabellerArguments) -> kinds. The
        // container set is the reference's `containerCommandArgs`, DEFAULTS.
        let table: &[(&str, bool, &[&str], &[LabelKind])] = &[
            ("container", true, &[], LabelKind::DEFAULTS),
            ("vf-passthrough", true, &[], &[DeviceId, DriverVersion]),
            ("pf-passthrough", true, &[], &[DeviceId]),
            // The reference picks the flags by type even with enable off.
            ("pf-passthrough", false, &[], &[DeviceId]),
            // Arguments are appended whatever the type.
            (
                "pf-passthrough",
                true,
                &["-vram", "bogus", "driver-src-version"],
                &[Vram, DeviceId, DriverSrcVersion],
            ),
            ("gpu", true, &[], LabelKind::DEFAULTS),
        ];
        for (driver_type, enable, arguments, expected) in table {
            assert_eq!(
                kinds_for(&spec(driver_type, *enable, arguments)),
                expected.to_vec(),
                "{driver_type} {arguments:?}"
            );
        }
    }

    #[test]
    fn the_driver_type_label_is_there_only_with_driver_enable() {
        let label = |driver_type, enable| {
            driver_type_labels(
                "kube-amd-gpu",
                "gpu-config",
                &spec(driver_type, enable, &[]),
            )
        };
        let key = "gpu.operator.amd.com/kube-amd-gpu.gpu-config.driver";
        for driver_type in ["container", "vf-passthrough", "pf-passthrough"] {
            assert_eq!(
                label(driver_type, true),
                BTreeMap::from([(key.to_owned(), driver_type.to_owned())])
            );
            assert!(label(driver_type, false).is_empty());
        }
        let long = "n".repeat(60);
        assert!(driver_type_labels("ns", &long, &spec("container", true, &[])).is_empty());
    }
}
