//! The Node condition `AMDGPUDriverReady`: whether the driver a node's
//! DeviceConfig asks for is the one running, with a reason a runbook can
//! match. Pure.
//!
//! With `spec.driver.enable`, the agent's driver manager decides and loads
//! ([`crate::driver::manager`]); while what it did leaves the driver not
//! running (a refused bundle, a failed `modprobe`, another amdgpu that
//! would have to be replaced), the condition is `False` with the manager's
//! reason (`BundleMissingForKernel`, `ChecksumMismatch`, `UnsignedModule`,
//! `ModprobeFailed`, `DriverReplaceNeeded`, …) and message. Otherwise it
//! says what runs: the module loaded (and, when `spec.driver.version` names
//! one, whether it is that version), or not loaded at all.

use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::DriverSpec;
use crate::api::agent_status::{DriverLoad, DriverLoadState, DriverReport};
use crate::node_writer::condition_at;

pub const CONDITION_TYPE: &str = "AMDGPUDriverReady";
/// amdgpu is loaded, at the version asked for if one is.
pub const REASON_LOADED: &str = "DriverLoaded";
/// `/sys/module/amdgpu` does not exist.
pub const REASON_NOT_LOADED: &str = "DriverNotLoaded";
/// Loaded, but not the version `spec.driver.version` asks for.
pub const REASON_VERSION_MISMATCH: &str = "DriverVersionMismatch";
/// The driver manager's reason for a load it did itself (the manager's
/// [`DriverLoadState::Loaded`] outcome).
pub const LOADED_HERE: &str = "DriverLoaded";
/// The manager's reason while it unloads or loads, and the condition's
/// while the kernel does not show yet a module the manager just loaded.
pub const REASON_LOADING: &str = "DriverLoading";
/// A working amdgpu of another version runs while the leader's rolling
/// upgrade has not reached this node (the driver manager's outcome, and
/// the condition's reason then).
pub const UPGRADE_PENDING: &str = "UpgradePending";

/// What must still happen before the node's GPUs can be tested, if
/// anything: the driver report read (for the boot the node runs), amdgpu
/// loaded in it, and the driver manager's own load (`load`, when the
/// DeviceConfig manages the driver) done. Tests started earlier find no
/// GPU and fail, blaming the GPUs. The one rule for the test runner's
/// triggers and the leader's remediation validation. Pure.
pub fn gpus_pending(report: Option<&DriverReport>, load: Option<&DriverLoad>) -> Option<String> {
    let Some(report) = report else {
        return Some("the driver is not reported yet".to_owned());
    };
    if let Some(load) = load.filter(|l| l.state != DriverLoadState::Loaded) {
        return Some(format!(
            "the driver load is {:?} ({}: {})",
            load.state, load.reason, load.message
        ));
    }
    if !report.loaded {
        return Some("amdgpu is not loaded yet".to_owned());
    }
    None
}

/// The condition for `report` under the DeviceConfig's `driver` section and
/// what the driver manager last did (`load`), with its times set to `now`.
pub fn driver_condition(
    report: &DriverReport,
    spec: &DriverSpec,
    load: Option<&DriverLoad>,
    now: &Time,
) -> NodeCondition {
    let kernel = report
        .kernel_release
        .as_deref()
        .unwrap_or("an unknown kernel");
    let running = match (&report.version, report.origin.is_inbox()) {
        (Some(v), _) => format!("amdgpu {v} ({:?})", report.origin),
        (None, true) => format!("the in-box amdgpu ({:?})", report.origin),
        (None, false) => format!("amdgpu ({:?})", report.origin),
    };
    let wanted = spec.version.as_deref().filter(|_| spec.enable);
    if let Some(load) = load.filter(|l| spec.enable && l.state != DriverLoadState::Loaded) {
        let message = format!("{} (kernel {kernel})", load.message);
        return condition_at(CONDITION_TYPE, "False", &load.reason, message, now);
    }
    // A driver that works while the rolling upgrade has not reached the
    // node is ready: the new version is on its way, not missing.
    if let Some(load) = load.filter(|l| spec.enable && l.reason == UPGRADE_PENDING) {
        let message = format!("{} (kernel {kernel})", load.message);
        return condition_at(CONDITION_TYPE, "True", UPGRADE_PENDING, message, now);
    }
    // The manager's `modprobe` returned, and the report (read by discovery,
    // which runs on its own pace) does not show the module yet: still
    // loading, not "not loaded", which would flap the condition on every
    // load.
    if let Some(load) = load.filter(|l| spec.enable && l.reason == LOADED_HERE && !report.loaded) {
        let message = format!(
            "{}; waiting for the kernel to show the module (kernel {kernel})",
            load.message
        );
        return condition_at(CONDITION_TYPE, "False", REASON_LOADING, message, now);
    }
    let (status, reason, message) = match (report.loaded, wanted) {
        (false, None) => (
            "False",
            REASON_NOT_LOADED,
            format!("amdgpu is not loaded on kernel {kernel}"),
        ),
        (false, Some(v)) => (
            "False",
            REASON_NOT_LOADED,
            format!("amdgpu is not loaded on kernel {kernel}; the DeviceConfig asks for {v}"),
        ),
        (true, Some(v)) if report.version.as_deref() != Some(v) => (
            "False",
            REASON_VERSION_MISMATCH,
            format!("{running} runs on kernel {kernel}; the DeviceConfig asks for {v}"),
        ),
        (true, _) => (
            "True",
            REASON_LOADED,
            format!("{running} runs on kernel {kernel}"),
        ),
    };
    condition_at(CONDITION_TYPE, status, reason, message, now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::agent_status::ModuleOrigin;

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap())
    }

    fn report(origin: ModuleOrigin, version: Option<&str>) -> DriverReport {
        DriverReport {
            loaded: origin != ModuleOrigin::NotLoaded,
            version: version.map(str::to_owned),
            origin,
            kernel_release: Some("6.8.0-49-generic".into()),
            ..DriverReport::default()
        }
    }

    fn spec(enable: bool, version: Option<&str>) -> DriverSpec {
        DriverSpec {
            enable,
            version: version.map(str::to_owned),
            ..DriverSpec::default()
        }
    }

    fn said(c: &NodeCondition) -> (&str, &str, &str) {
        (
            c.status.as_str(),
            c.reason.as_deref().unwrap_or_default(),
            c.message.as_deref().unwrap_or_default(),
        )
    }

    #[test]
    fn loaded_drivers_are_ready_unless_another_version_is_asked_for() {
        let inbox = report(ModuleOrigin::InTree, None);
        let c = driver_condition(&inbox, &spec(false, None), None, &now());
        assert_eq!(c.type_, CONDITION_TYPE);
        assert_eq!(
            said(&c),
            (
                "True",
                REASON_LOADED,
                "the in-box amdgpu (InTree) runs on kernel 6.8.0-49-generic"
            )
        );
        // A version asked for while `enable` is false asks for nothing.
        assert_eq!(
            driver_condition(&inbox, &spec(false, Some("6.4.1")), None, &now()).status,
            "True"
        );

        let rocm = report(ModuleOrigin::OutOfTree, Some("6.12.12"));
        let c = driver_condition(&rocm, &spec(true, Some("6.12.12")), None, &now());
        assert_eq!(said(&c).0, "True");
        let c = driver_condition(&rocm, &spec(true, Some("6.14.1")), None, &now());
        let (status, reason, message) = said(&c);
        assert_eq!((status, reason), ("False", REASON_VERSION_MISMATCH));
        assert!(
            message.contains("asks for 6.14.1") && message.contains("6.12.12"),
            "{message}"
        );
        // No version named: whatever is loaded is what was asked for.
        assert_eq!(
            driver_condition(&rocm, &spec(true, None), None, &now()).status,
            "True"
        );
    }

    #[test]
    fn an_unloaded_driver_is_not_ready_and_says_what_was_asked_for() {
        let none = report(ModuleOrigin::NotLoaded, None);
        let c = driver_condition(&none, &spec(false, None), None, &now());
        assert_eq!(
            said(&c),
            (
                "False",
                REASON_NOT_LOADED,
                "amdgpu is not loaded on kernel 6.8.0-49-generic"
            )
        );
        let c = driver_condition(&none, &spec(true, Some("6.14.1")), None, &now());
        assert!(said(&c).2.contains("asks for 6.14.1"), "{:?}", c.message);
        assert_eq!(c.last_transition_time, Some(now()));
    }

    #[test]
    fn what_the_manager_did_wins_until_the_driver_runs() {
        let none = report(ModuleOrigin::NotLoaded, None);
        let refused = DriverLoad {
            state: DriverLoadState::Refused,
            reason: "ChecksumMismatch".into(),
            message: "amdgpu.ko: sha256 is 00, the manifest says ff".into(),
            bundle: None,
            version: None,
            asked: None,
            told_at: None,
        };
        let c = driver_condition(&none, &spec(true, Some("6.12.12")), Some(&refused), &now());
        let (status, reason, message) = said(&c);
        assert_eq!((status, reason), ("False", "ChecksumMismatch"));
        assert!(
            message.contains("sha256") && message.contains("6.8.0-49-generic"),
            "{message}"
        );
        // With driver management off, the manager's word counts for nothing.
        let c = driver_condition(&none, &spec(false, None), Some(&refused), &now());
        assert_eq!(said(&c).1, REASON_NOT_LOADED);
        // Loaded: the report says what runs.
        let rocm = report(ModuleOrigin::OutOfTree, Some("6.12.12"));
        let loaded = DriverLoad {
            state: DriverLoadState::Loaded,
            reason: "DriverLoaded".into(),
            message: "loaded".into(),
            bundle: None,
            version: None,
            asked: None,
            told_at: None,
        };
        let c = driver_condition(&rocm, &spec(true, Some("6.12.12")), Some(&loaded), &now());
        assert_eq!(said(&c).0, "True");
    }

    #[test]
    fn a_load_the_kernel_does_not_show_yet_is_loading_not_unloaded() {
        let none = report(ModuleOrigin::NotLoaded, None);
        let loaded_here = DriverLoad {
            state: DriverLoadState::Loaded,
            reason: LOADED_HERE.into(),
            message: "loaded amdgpu 6.14.1 from /var/lib/gpu-operator/drivers/b".into(),
            bundle: None,
            version: Some("6.14.1".into()),
            asked: Some("6.14.1".into()),
            told_at: None,
        };
        let c = driver_condition(
            &none,
            &spec(true, Some("6.14.1")),
            Some(&loaded_here),
            &now(),
        );
        let (status, reason, message) = said(&c);
        assert_eq!((status, reason), ("False", REASON_LOADING));
        assert!(message.contains("waiting for the kernel"), "{message}");
        // Once the report shows it: ready.
        let rocm = report(ModuleOrigin::OutOfTree, Some("6.14.1"));
        let c = driver_condition(
            &rocm,
            &spec(true, Some("6.14.1")),
            Some(&loaded_here),
            &now(),
        );
        assert_eq!(said(&c).1, REASON_LOADED);
    }
}
