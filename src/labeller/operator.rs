//! What the reference decides about labels at the operator, not in its node
//! labeller: which label kinds a DeviceConfig asks for. (The driver-type
//! label its controller writes on Nodes is the driver's decision:
//! `crate::driver::decision::type_labels`.)
//!
//! Rules from ROCm/gpu-operator:
//! - `internal/nodelabeller/nodelabeller.go`, `SetNodeLabellerAsDesired`: the
//!   labeller's flags are `containerCommandArgs` (the seven defaults), or
//!   `vfPassthroughCommandArgs` (`-device-id -driver-version`) or
//!   `pfPassthroughCommandArgs` (`-device-id`) by `spec.driver.driverType`,
//!   whatever `spec.driver.enable` says, and every `nodeLabellerArguments`
//!   entry is appended as a further flag.
//!
//! Pure functions; the caller writes what they return.

use crate::api::{DeviceConfigSpec, DriverType, NodeLabellerKind as LabelKind};

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
}
