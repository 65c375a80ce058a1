//! The node's driver decision, in one place: what the DeviceConfig and the
//! node's upgrade record ask of the driver ([`DriverWanted`], [`wanted`]),
//! when the driver manager looks again and what an outcome that needs no
//! command says, and how what the manager did shows on the Node: its Event,
//! the driver-type label and the `AMDGPUDriverReady` condition ([`Shown`],
//! [`condition_intent`]).
//!
//! Which version, and when to replace one that runs, depends on whether the
//! DeviceConfig rolls upgrades (`driver.upgradePolicy.enable`,
//! [`DriverWanted::for_node`]): without, the agent loads `driver.version`
//! and replaces another as soon as nothing holds it; with, the leader picks
//! the node, drains it and writes the target in the node's upgrade record,
//! and until then the agent installs a driver only where none is loaded and
//! leaves a running one alone (`UpgradePending`). When the record asks for
//! a reboot from the boot id the node runs, the manager reboots it
//! ([`reboot_due`]).
//!
//! Pure: this module must not do I/O (no host, no commands, no Kubernetes
//! API, no clock). The driver manager ([`super::manager`]) carries out what
//! it decides on the host; the agent writes what it returns on the Node.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::blacklist::{self, Blacklisted};
use super::bundle::Verified;
use super::condition::{CONDITION_TYPE, UPGRADE_PENDING, driver_condition};
use super::load::LoadDecision;
use crate::api::agent_status::{
    ConfigKey, DriverLoad, DriverLoadState, DriverReport, ModuleOrigin,
};
use crate::api::driver_upgrade::UpgradeRecord;
use crate::api::{DeviceConfigSpec, DriverSpec, DriverType, KernelModuleConfigSpec, Operand};
use crate::events::EventType;
use crate::node_writer::{StatusIntent, condition_to_apply, find_condition};

/// The DeviceConfig governing the node, as the driver's decisions see it.
#[derive(Clone, Copy, Debug)]
pub enum Governing<'a> {
    /// No DeviceConfig selects the node.
    None,
    /// One does.
    One {
        key: &'a ConfigKey,
        spec: &'a DeviceConfigSpec,
    },
    /// More than one does: nothing about the driver changes until a person
    /// resolves it.
    Conflict,
}

/// What the DeviceConfig governing the node asks of its driver, given the
/// node's annotations (where the leader writes its upgrade record): `None`
/// unless one DeviceConfig selects the node and asks for a driver. Pure.
pub fn wanted(
    governing: Governing<'_>,
    annotations: &BTreeMap<String, String>,
) -> Option<DriverWanted> {
    match governing {
        Governing::One { key, spec } => DriverWanted::for_node(
            spec.driver(),
            key,
            UpgradeRecord::of_annotations(annotations).as_ref(),
        ),
        Governing::None | Governing::Conflict => None,
    }
}

/// What the selected DeviceConfig asks of the driver, when it asks for one.
#[derive(Clone, Debug, PartialEq)]
pub struct DriverWanted {
    pub driver_type: DriverType,
    /// The version to load: the upgrade record's target, else
    /// `spec.driver.version`; `None` takes whichever bundle the store has.
    pub version: Option<String>,
    /// `spec.driver.blacklist` ([`super::blacklist`]).
    pub blacklist: Option<bool>,
    pub module: KernelModuleConfigSpec,
    /// A running amdgpu of another version may be replaced now. False while
    /// a rolling upgrade governs replacements and the leader has not told
    /// this node its target.
    pub replace: bool,
    /// Reboot while the node's boot id is this one (the leader's request).
    pub reboot_from: Option<String>,
    /// The `since` of the upgrade record the target came from.
    pub told_at: Option<String>,
}

impl DriverWanted {
    /// What `spec` asks for, managed by hand: `None` when
    /// `spec.driver.enable` is false.
    pub fn from_spec(spec: &DriverSpec) -> Option<Self> {
        spec.enable.then(|| Self {
            driver_type: spec.driver_type.clone(),
            version: spec.version.clone(),
            blacklist: spec.blacklist,
            module: spec.kernel_module_config.clone(),
            replace: true,
            reboot_from: None,
            told_at: None,
        })
    }

    /// What the DeviceConfig `key`, whose driver section is `spec`, asks of
    /// a node whose upgrade record is `record`. Pure.
    ///
    /// - The record names a target for this DeviceConfig: load it, replacing
    ///   what runs, and reboot as it asks.
    /// - Else, with `upgradePolicy.enable`: `spec.driver.version` where no
    ///   amdgpu runs (a first install needs no drain), but a running one is
    ///   not replaced: the leader's upgrade does that, node by node.
    /// - Else (upgrades by hand): `spec.driver.version`, replacing another
    ///   as soon as nothing holds it.
    pub fn for_node(
        spec: &DriverSpec,
        key: &ConfigKey,
        record: Option<&UpgradeRecord>,
    ) -> Option<Self> {
        let mut wanted = Self::from_spec(spec)?;
        if let Some(record) = record.filter(|r| r.target_for(key).is_some()) {
            wanted.version = record.target.clone();
            wanted.reboot_from = record.reboot_from.clone();
            wanted.told_at = Some(record.since.clone());
        } else if spec.upgrade_policy.as_ref().and_then(|p| p.enable) == Some(true) {
            wanted.replace = false;
        }
        Some(wanted)
    }
}

/// The reason of a [`DriverLoadState::Loaded`] outcome when this manager
/// loaded the driver, and when it found it running.
pub use super::condition::LOADED_HERE;
pub const RUNNING: &str = "DriverRunning";
/// The reasons of a reboot asked for, and of one that could not be asked.
pub const REBOOT_REQUESTED: &str = "RebootRequested";
pub const REBOOT_FAILED: &str = "RebootFailed";

/// The outcome for a decision that needs no command. Pure.
pub(super) fn outcome_of(decision: &LoadDecision) -> Option<DriverLoad> {
    let outcome = |state, reason: &str, message: String, bundle: Option<&str>| DriverLoad {
        state,
        reason: reason.to_owned(),
        message,
        bundle: bundle.map(str::to_owned),
        version: None,
        asked: None,
        told_at: None,
    };
    match decision {
        LoadDecision::Load { .. } | LoadDecision::Replace { .. } => None,
        LoadDecision::Nothing { version } => Some(DriverLoad {
            version: Some(version.clone()),
            ..outcome(
                DriverLoadState::Loaded,
                RUNNING,
                format!("amdgpu {version} runs"),
                None,
            )
        }),
        LoadDecision::Refuse { reason, message } => Some(outcome(
            DriverLoadState::Refused,
            reason,
            message.clone(),
            None,
        )),
        LoadDecision::ReplaceNeeded { why, .. } => Some(outcome(
            DriverLoadState::ReplaceNeeded,
            "DriverReplaceNeeded",
            why.clone(),
            None,
        )),
    }
}

/// What woke the manager, besides a change of the report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Trigger {
    /// What is asked for changed (the DeviceConfig, the upgrade record).
    pub asked_changed: bool,
    /// The recheck of a refused or failed load, or of a load the report has
    /// not shown within [`super::manager::ManagerConfig::recheck`], is due.
    pub recheck_due: bool,
}

/// Whether to look again (decide, and maybe run `modprobe`) now. Pure.
///
/// Not while the report does not show yet the version this manager just
/// loaded (`loaded_here`) and what is asked still is that version: a report
/// read before the load says "not loaded", and acting on it would run
/// `modprobe` a second time. A change of what is asked for (the leader
/// rewriting the node's upgrade record after its reboot, a DeviceConfig
/// edit that keeps the version) does not make that report any newer. A
/// change of the version asked, a reboot asked for, or the recheck do look
/// again.
pub(super) fn looks_again(
    trigger: Trigger,
    last: Option<&DriverLoad>,
    loaded_here: Option<&str>,
    asked: &DriverWanted,
    report: &DriverReport,
) -> bool {
    let awaiting_own_load = loaded_here.is_some_and(|v| {
        report.version.as_deref() != Some(v)
            && asked.version.as_deref().is_none_or(|wanted| wanted == v)
            && !reboot_due(asked, report)
    });
    if trigger.recheck_due {
        return true;
    }
    if awaiting_own_load {
        return false;
    }
    trigger.asked_changed || acts_on_report(last, loaded_here, report)
}

/// Whether a change of the report alone is reason to look again, after
/// `last`. Not after a failed load (that waits for the recheck, so a failing
/// `modprobe` is not retried at the pace the report moves), and not while
/// the report does not show yet the version this manager just loaded
/// (`loaded_here`): a report read during the load would have it load, or
/// unload, a second time. Pure.
pub(super) fn acts_on_report(
    last: Option<&DriverLoad>,
    loaded_here: Option<&str>,
    report: &DriverReport,
) -> bool {
    let failed = last.is_some_and(|l| l.state == DriverLoadState::Failed);
    let stale = loaded_here.is_some_and(|v| report.version.as_deref() != Some(v));
    !(failed || stale)
}

/// Whether the node is to reboot now: the leader asked for a reboot from
/// the boot id it runs. Pure.
pub fn reboot_due(wanted: &DriverWanted, report: &DriverReport) -> bool {
    wanted.reboot_from.is_some() && wanted.reboot_from == report.boot_id
}

/// The outcome while a rolling upgrade has not reached this node: what runs
/// stays. Pure.
pub(super) fn upgrade_pending(report: &DriverReport, wanted: &DriverWanted) -> DriverLoad {
    let running = match (&report.version, report.origin.is_inbox()) {
        (Some(v), _) => format!("amdgpu {v}"),
        (None, true) => "the in-box amdgpu".to_owned(),
        (None, false) => "amdgpu".to_owned(),
    };
    DriverLoad {
        state: DriverLoadState::Loaded,
        reason: UPGRADE_PENDING.to_owned(),
        message: format!(
            "{running} runs; {} comes with the rolling upgrade (driver.upgradePolicy), \
             when the leader has drained this node",
            wanted.version.as_deref().unwrap_or("another driver")
        ),
        bundle: None,
        version: report.version.clone(),
        asked: None,
        told_at: None,
    }
}

/// What the manager does after a look, when no reboot is due.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Next {
    /// Load the bundle; nothing runs that must go first.
    Load(Box<Verified>),
    /// Unload the amdgpu that runs (once nothing holds it), then load the
    /// bundle.
    Replace(Box<Verified>),
    /// Nothing to run: this is the outcome.
    Done(DriverLoad),
}

/// The step after a look: `decision` ([`super::load::decide`]'s), with the
/// amdgpu blacklist as it now stands (`blacklisted`), for `wanted` on the
/// node `report` describes. A replacement waits while `wanted` may not
/// replace (a rolling upgrade has not reached the node: `UpgradePending`);
/// an in-box amdgpu that must go says how the blacklist stands, since only
/// a reboot replaces it. Pure.
pub(super) fn next_step(
    decision: LoadDecision,
    blacklisted: Blacklisted,
    wanted: &DriverWanted,
    report: &DriverReport,
) -> Next {
    let decision = match decision {
        LoadDecision::ReplaceNeeded {
            loaded: ModuleOrigin::InTree,
            version,
            why,
        } => {
            let why = match blacklisted {
                Blacklisted::Yes => format!(
                    "the in-box amdgpu is loaded and is blacklisted for the next boot \
                     ({}): reboot the node to load the bundle's (a rolling upgrade \
                     reboots it; by hand, a person does)",
                    blacklist::BLACKLIST_FILE
                ),
                Blacklisted::BlockedByForeignFile => format!(
                    "the in-box amdgpu is loaded, and driver.blacklist cannot take effect: \
                     {} was not written by an operator and has no `blacklist amdgpu` line, \
                     so it is left as it is; add the line or remove the file, then reboot",
                    blacklist::BLACKLIST_FILE
                ),
                Blacklisted::No => why,
            };
            LoadDecision::ReplaceNeeded {
                loaded: ModuleOrigin::InTree,
                version,
                why,
            }
        }
        decision => decision,
    };
    match decision {
        LoadDecision::Load { bundle } => Next::Load(bundle),
        LoadDecision::Replace { .. }
        | LoadDecision::ReplaceNeeded {
            loaded: ModuleOrigin::InTree,
            ..
        } if !wanted.replace => Next::Done(upgrade_pending(report, wanted)),
        LoadDecision::Replace { bundle } => Next::Replace(bundle),
        other => Next::Done(
            outcome_of(&other)
                .unwrap_or_else(|| failed("Internal", format!("no outcome for {other:?}"), None)),
        ),
    }
}

/// Why a reboot the upgrade asks for must not happen, as the outcome to
/// publish: the in-box amdgpu runs and the blacklist (`written`, as it was
/// just brought in line, or why that failed) is not in effect, so the
/// reboot would bring the in-box driver back and end every pod on the node
/// for nothing. `None`: the reboot may go ahead. Pure.
pub(super) fn reboot_blocked(
    report: &DriverReport,
    written: &Result<Blacklisted, String>,
) -> Option<DriverLoad> {
    if !report.origin.is_inbox() || matches!(written, Ok(Blacklisted::Yes)) {
        return None;
    }
    let why = match written {
        Ok(Blacklisted::BlockedByForeignFile) => format!(
            "{} was not written by an operator and has no `blacklist amdgpu` line",
            blacklist::BLACKLIST_FILE
        ),
        Ok(_) => "driver.blacklist is not true".to_owned(),
        Err(e) => e.clone(),
    };
    Some(
        outcome_of(&LoadDecision::Refuse {
            reason: "BlacklistNotInEffect",
            message: format!(
                "not rebooting for the upgrade: the in-box amdgpu would load again at \
                 boot ({why})"
            ),
        })
        .unwrap_or_else(|| failed("BlacklistNotInEffect", why, None)),
    )
}

/// A failed outcome. Pure.
pub(super) fn failed(reason: &str, message: String, bundle: Option<&str>) -> DriverLoad {
    DriverLoad {
        state: DriverLoadState::Failed,
        reason: reason.to_owned(),
        message,
        bundle: bundle.map(str::to_owned),
        version: None,
        asked: None,
        told_at: None,
    }
}

/// What the agent last showed of the driver on the Node: the driver-type
/// labels it applied and what the driver manager did, as last recorded in an
/// Event. The agent keeps one between passes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Shown {
    /// The driver-type labels last applied; `None` before the first write.
    labels: Option<BTreeMap<String, String>>,
    /// What the driver manager did, as last recorded in an Event.
    load: Option<DriverLoad>,
}

impl Shown {
    /// The Event for what the driver manager did, when it differs from what
    /// was last recorded (state and reason): a Warning for a refusal, a
    /// failure or a driver that must be replaced, a Normal one when the
    /// manager's own load took (`DriverLoaded`). A load under way is skipped,
    /// so that a failure retried at each recheck is one Event, not one per
    /// try; a driver found running is not worth one. Pure.
    pub fn load_event(
        &mut self,
        load: Option<&DriverLoad>,
    ) -> Option<(EventType, &'static str, String, String)> {
        if load.is_some_and(|l| l.state == DriverLoadState::Loading) {
            return None;
        }
        let same = |a: &DriverLoad, b: &DriverLoad| a.state == b.state && a.reason == b.reason;
        let changed = match (&self.load, load) {
            (Some(last), Some(now)) => !same(last, now),
            (None, None) => false,
            _ => true,
        };
        if !changed {
            return None;
        }
        self.load = load.cloned();
        let load = load?;
        let type_ = match load.state {
            DriverLoadState::Loaded if load.reason == LOADED_HERE => EventType::Normal,
            DriverLoadState::Loaded | DriverLoadState::Loading => return None,
            // A reboot asked for is news to whoever looks at the node.
            DriverLoadState::Rebooting => EventType::Normal,
            DriverLoadState::Refused | DriverLoadState::ReplaceNeeded | DriverLoadState::Failed => {
                EventType::Warning
            }
        };
        Some((
            type_,
            "LoadDriver",
            load.reason.clone(),
            load.message.clone(),
        ))
    }

    /// The operator-side driver-type label the reference writes on each Node
    /// a DeviceConfig with `driver.enable` selects ([`type_labels`]), when it
    /// differs from what was last applied: `Some(labels)` is the whole set to
    /// apply (empty removes it). Under a conflict nothing changes. Before the
    /// first write, an empty set is applied only if the Node carries such a
    /// label (`node_labels`), so that an agent on a node nothing selects
    /// writes nothing at start. Pure.
    pub fn labels_to_apply(
        &self,
        governing: Governing<'_>,
        node_labels: &BTreeMap<String, String>,
    ) -> Option<BTreeMap<String, String>> {
        let wanted = match governing {
            Governing::One { key, spec } => type_labels(&key.namespace, &key.name, spec),
            Governing::None => BTreeMap::new(),
            Governing::Conflict => return None,
        };
        match &self.labels {
            Some(last) if *last == wanted => None,
            None if wanted.is_empty()
                && !node_labels
                    .keys()
                    .any(|k| k.starts_with("gpu.operator.amd.com/") && k.ends_with(".driver")) =>
            {
                None
            }
            _ => Some(wanted),
        }
    }

    /// Takes in that `labels` were applied as the driver-type labels.
    pub fn labels_written(&mut self, labels: BTreeMap<String, String>) {
        self.labels = Some(labels);
    }
}

/// The driver-type label of the DeviceConfig `namespace/name` on a Node it
/// selects: one label while `spec.driver.enable`, none otherwise (so a writer
/// that applies the whole set removes it once `enable` is off, where the
/// reference leaves it until the DeviceConfig is deleted). A key longer than
/// Kubernetes allows (a long name) is left out: the reference's patch would be
/// refused.
///
/// The reference's rule (ROCm/gpu-operator `internal/utils.go`,
/// `UpdateDriverTypeNodeLabel` and `GetDriverTypeNodeLabel`): with
/// `spec.driver.enable`, every Node the DeviceConfig selects carries
/// `gpu.operator.amd.com/<ns>.<name>.driver=<driverType>`
/// (`DriverTypeNodeLabelTemplate`). `handleKMMModule` writes it on each
/// reconcile; `finalizeDeviceConfig` removes it when the DeviceConfig is
/// deleted (only while `enable` is still true). Pure.
pub fn type_labels(
    namespace: &str,
    name: &str,
    spec: &DeviceConfigSpec,
) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    if !spec.is_enabled(Operand::Driver) {
        return labels;
    }
    let key = format!("gpu.operator.amd.com/{namespace}.{name}.driver");
    // Kubernetes allows at most 63 characters after the `prefix/` of a key.
    if key
        .rsplit_once('/')
        .map_or(key.as_str(), |(_, name)| name)
        .len()
        <= 63
    {
        labels.insert(key, spec.driver().driver_type.as_str().to_owned());
    } else {
        tracing::warn!(label = %key, "driver type label key longer than Kubernetes allows; not written");
    }
    labels
}

/// What to write of the `AMDGPUDriverReady` condition on `node`: `None`
/// when the Node already says it. With a DeviceConfig selecting the node and
/// the driver report read, the condition ([`driver_condition`], from the report
/// and what the driver manager did, `load`; keeping the
/// Node's times when it says the same); with none selecting it, an empty
/// intent that removes it, if there. Under a conflict nothing changes.
///
/// While the manager's last answer (`load`) answers an earlier ask than
/// what is asked of it now (`wanted`: a new `driver.version`, a new upgrade
/// record), nothing changes either: judging the new ask by the old answer
/// would write `DriverVersionMismatch` for the moment the manager takes to
/// answer, and move `lastTransitionTime` twice. Pure.
pub fn condition_intent(
    governing: Governing<'_>,
    report: Option<&DriverReport>,
    load: Option<&DriverLoad>,
    wanted: Option<&DriverWanted>,
    node: &Node,
    now: &Time,
) -> Option<StatusIntent> {
    let on_node = find_condition(node, CONDITION_TYPE);
    let answers_an_earlier_ask = match (load, wanted) {
        (Some(load), Some(wanted)) => {
            load.asked != wanted.version || load.told_at != wanted.told_at
        }
        _ => false,
    };
    match (governing, report) {
        (Governing::One { .. }, Some(_)) if answers_an_earlier_ask => None,
        (Governing::One { spec, .. }, Some(report)) => {
            let desired = driver_condition(report, spec.driver(), load, now);
            let condition = condition_to_apply(node, desired);
            (on_node != Some(&condition)).then(|| StatusIntent {
                conditions: vec![condition],
            })
        }
        (Governing::None, _) => on_node.map(|_| StatusIntent::default()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_without_a_command_have_their_outcome_and_a_load_has_none() {
        let refuse = LoadDecision::Refuse {
            reason: "ChecksumMismatch",
            message: "lib/modules/x/amdgpu.ko: sha256 differs".into(),
        };
        let outcome = outcome_of(&refuse).unwrap();
        assert_eq!(
            (outcome.state, outcome.reason.as_str()),
            (DriverLoadState::Refused, "ChecksumMismatch")
        );
        assert!(outcome.message.contains("sha256 differs"));
        let nothing = outcome_of(&LoadDecision::Nothing {
            version: "6.12.12".into(),
        })
        .unwrap();
        assert_eq!(nothing.state, DriverLoadState::Loaded);
        let replace = outcome_of(&LoadDecision::ReplaceNeeded {
            loaded: crate::api::agent_status::ModuleOrigin::InTree,
            version: None,
            why: "the in-box amdgpu is loaded".into(),
        })
        .unwrap();
        assert_eq!(
            (replace.state, replace.reason.as_str()),
            (DriverLoadState::ReplaceNeeded, "DriverReplaceNeeded")
        );
    }

    #[test]
    fn a_report_alone_wakes_no_retry_of_a_failure_and_no_second_load() {
        let report = |version: &str| DriverReport {
            loaded: true,
            version: Some(version.into()),
            ..DriverReport::default()
        };
        let outcome = |state| DriverLoad {
            state,
            reason: "r".into(),
            message: "m".into(),
            bundle: None,
            version: None,
            asked: None,
            told_at: None,
        };
        let old = report("6.12.12");
        assert!(acts_on_report(None, None, &old));
        assert!(acts_on_report(
            Some(&outcome(DriverLoadState::Refused)),
            None,
            &old
        ));
        // A failed load waits for its recheck.
        assert!(!acts_on_report(
            Some(&outcome(DriverLoadState::Failed)),
            None,
            &old
        ));
        // Just loaded 6.14.1: a report still saying 6.12.12 was read before.
        let loaded = outcome(DriverLoadState::Loaded);
        assert!(!acts_on_report(Some(&loaded), Some("6.14.1"), &old));
        assert!(acts_on_report(
            Some(&loaded),
            Some("6.14.1"),
            &report("6.14.1")
        ));
    }

    #[test]
    fn a_new_ask_does_not_load_again_while_the_report_lags_behind_the_load() {
        let not_loaded = DriverReport {
            loaded: false,
            boot_id: Some("boot-2".into()),
            ..DriverReport::default()
        };
        let loaded = DriverLoad {
            state: DriverLoadState::Loaded,
            reason: LOADED_HERE.into(),
            message: "loaded".into(),
            bundle: None,
            version: Some("6.14.1".into()),
            asked: Some("6.14.1".into()),
            told_at: Some("t1".into()),
        };
        let asked = |version: Option<&str>, told_at: &str| DriverWanted {
            driver_type: DriverType::Container,
            version: version.map(str::to_owned),
            blacklist: None,
            module: KernelModuleConfigSpec::default(),
            replace: true,
            reboot_from: None,
            told_at: Some(told_at.into()),
        };
        let changed = Trigger {
            asked_changed: true,
            recheck_due: false,
        };
        // The leader rewrote the record after the reboot: same version.
        assert!(!looks_again(
            changed,
            Some(&loaded),
            Some("6.14.1"),
            &asked(Some("6.14.1"), "t2"),
            &not_loaded
        ));
        // Any bundle asked for: the one just loaded is it.
        assert!(!looks_again(
            changed,
            Some(&loaded),
            Some("6.14.1"),
            &asked(None, "t2"),
            &not_loaded
        ));
        // Another version asked for: look again.
        assert!(looks_again(
            changed,
            Some(&loaded),
            Some("6.14.1"),
            &asked(Some("6.15.0"), "t2"),
            &not_loaded
        ));
        // A reboot asked for from this boot: look again.
        let mut reboot = asked(Some("6.14.1"), "t2");
        reboot.reboot_from = Some("boot-2".into());
        assert!(looks_again(
            changed,
            Some(&loaded),
            Some("6.14.1"),
            &reboot,
            &not_loaded
        ));
        // The recheck looks again even so: a report that never shows the
        // load is not waited for forever.
        assert!(looks_again(
            Trigger {
                asked_changed: false,
                recheck_due: true
            },
            Some(&loaded),
            Some("6.14.1"),
            &asked(Some("6.14.1"), "t1"),
            &not_loaded
        ));
        // Nothing loaded here: a new ask is looked at.
        assert!(looks_again(
            changed,
            None,
            None,
            &asked(Some("6.14.1"), "t2"),
            &not_loaded
        ));
    }

    #[test]
    fn only_an_enabled_driver_section_asks_for_a_driver() {
        let mut spec = DriverSpec {
            enable: false,
            ..DriverSpec::default()
        };
        assert_eq!(DriverWanted::from_spec(&spec), None);
        spec.enable = true;
        spec.version = Some("6.12.12".into());
        let wanted = DriverWanted::from_spec(&spec).unwrap();
        assert_eq!(wanted.version.as_deref(), Some("6.12.12"));
        assert_eq!(wanted.driver_type, DriverType::Container);
    }

    fn key_of(namespace: &str, name: &str) -> ConfigKey {
        ConfigKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn driver_spec(driver_type: &str, enable: bool) -> DeviceConfigSpec {
        let mut spec = DeviceConfigSpec::default();
        spec.driver_mut().enable = enable;
        spec.driver_mut().driver_type = DriverType::from(driver_type);
        spec
    }

    #[test]
    fn driver_load_events_mark_refusals_once_and_a_load_that_took() {
        let load = |state, reason: &str| DriverLoad {
            state,
            reason: reason.into(),
            message: format!("{reason} message"),
            bundle: None,
            version: None,
            asked: None,
            told_at: None,
        };
        let mut state = Shown::default();
        let refused = load(DriverLoadState::Refused, "ChecksumMismatch");
        let event = state.load_event(Some(&refused)).unwrap();
        assert_eq!(
            (event.0, event.2.as_str(), event.3.as_str()),
            (
                EventType::Warning,
                "ChecksumMismatch",
                "ChecksumMismatch message"
            )
        );
        // The same refusal again (a recheck) is not a second Event.
        assert_eq!(state.load_event(Some(&refused)), None);
        let unsigned = load(DriverLoadState::Refused, "UnsignedModule");
        assert!(state.load_event(Some(&unsigned)).is_some());
        let loading = load(DriverLoadState::Loading, "DriverLoading");
        assert_eq!(state.load_event(Some(&loading)), None);
        let loaded = load(DriverLoadState::Loaded, "DriverLoaded");
        let event = state.load_event(Some(&loaded)).unwrap();
        assert_eq!(
            (event.0, event.2.as_str()),
            (EventType::Normal, "DriverLoaded")
        );
        // Found running, not loaded by us: no Event.
        let mut fresh = Shown::default();
        let running = load(DriverLoadState::Loaded, "DriverRunning");
        assert_eq!(fresh.load_event(Some(&running)), None);
        // A failure retried at each recheck (loading, failed, ...) is one Event.
        let failed = load(DriverLoadState::Failed, "ModprobeFailed");
        assert!(fresh.load_event(Some(&failed)).is_some());
        assert_eq!(fresh.load_event(Some(&loading)), None);
        assert_eq!(fresh.load_event(Some(&failed)), None);
        assert_eq!(fresh.load_event(None), None);
    }

    #[test]
    fn the_driver_condition_is_written_once_kept_while_true_and_removed_when_deselected() {
        use crate::api::agent_status::ModuleOrigin;
        use k8s_openapi::api::core::v1::{Node, NodeStatus};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap());
        let report = DriverReport {
            loaded: true,
            origin: ModuleOrigin::InTree,
            kernel_release: Some("6.8.0".into()),
            ..DriverReport::default()
        };
        let (key, spec) = (key_of("ns", "gpus"), DeviceConfigSpec::default());
        let selection = Governing::One {
            key: &key,
            spec: &spec,
        };
        let mut node = Node::default();
        // Nothing until the report is read.
        assert_eq!(
            condition_intent(selection, None, None, None, &node, &now),
            None
        );
        let intent = condition_intent(selection, Some(&report), None, None, &node, &now)
            .expect("a first condition");
        assert_eq!(intent.conditions[0].type_, CONDITION_TYPE);
        assert_eq!(intent.conditions[0].status, "True");
        node.status = Some(NodeStatus {
            conditions: Some(intent.conditions.clone()),
            ..NodeStatus::default()
        });
        let later = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_100).unwrap());
        assert_eq!(
            condition_intent(selection, Some(&report), None, None, &node, &later),
            None,
            "the Node says it already: no write for a heartbeat"
        );
        let unloaded = DriverReport {
            loaded: false,
            origin: ModuleOrigin::NotLoaded,
            ..report.clone()
        };
        let intent =
            condition_intent(selection, Some(&unloaded), None, None, &node, &later).unwrap();
        assert_eq!(intent.conditions[0].status, "False");
        assert_eq!(
            condition_intent(Governing::None, Some(&report), None, None, &node, &later),
            Some(StatusIntent::default()),
            "deselected: removed"
        );
        let conflict = Governing::Conflict;
        assert_eq!(
            condition_intent(conflict, Some(&unloaded), None, None, &node, &later),
            None
        );
        assert_eq!(
            condition_intent(Governing::None, None, None, None, &Node::default(), &later),
            None
        );
    }

    #[test]
    fn a_new_driver_version_is_not_judged_by_the_answer_to_the_old_one() {
        use crate::api::agent_status::ModuleOrigin;
        use crate::api::{DriverSpec, DriverUpgradePolicySpec};
        use k8s_openapi::api::core::v1::{Node, NodeStatus};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap());
        let report = DriverReport {
            loaded: true,
            origin: ModuleOrigin::OutOfTree,
            version: Some("6.12.12".into()),
            kernel_release: Some("6.8.0".into()),
            ..DriverReport::default()
        };
        let spec_of = |version: &str| {
            let driver = DriverSpec {
                enable: true,
                version: Some(version.into()),
                upgrade_policy: Some(DriverUpgradePolicySpec {
                    enable: Some(true),
                    ..DriverUpgradePolicySpec::default()
                }),
                ..DriverSpec::default()
            };
            DeviceConfigSpec {
                driver: Some(driver),
                ..DeviceConfigSpec::default()
            }
        };
        let key = key_of("ns", "gpus");
        let wanted_of = |spec: &DeviceConfigSpec| DriverWanted::for_node(spec.driver(), &key, None);
        let old = spec_of("6.12.12");
        let running = DriverLoad {
            state: DriverLoadState::Loaded,
            reason: RUNNING.into(),
            message: "amdgpu 6.12.12 runs".into(),
            bundle: None,
            version: Some("6.12.12".into()),
            asked: Some("6.12.12".into()),
            told_at: None,
        };
        let intent = condition_intent(
            Governing::One {
                key: &key,
                spec: &old,
            },
            Some(&report),
            Some(&running),
            wanted_of(&old).as_ref(),
            &Node::default(),
            &now,
        )
        .expect("the first condition");
        assert_eq!(intent.conditions[0].status, "True");
        let node = Node {
            status: Some(NodeStatus {
                conditions: Some(intent.conditions.clone()),
                ..NodeStatus::default()
            }),
            ..Node::default()
        };
        // driver.version moves on: until the manager answers the new ask,
        // the Node keeps what it says (no DriverVersionMismatch blip).
        let new = spec_of("6.14.1");
        assert_eq!(
            condition_intent(
                Governing::One {
                    key: &key,
                    spec: &new,
                },
                Some(&report),
                Some(&running),
                wanted_of(&new).as_ref(),
                &node,
                &now,
            ),
            None
        );
        // The manager's answer to the new ask: the upgrade is pending.
        let pending = DriverLoad {
            reason: UPGRADE_PENDING.into(),
            asked: Some("6.14.1".into()),
            ..running.clone()
        };
        let intent = condition_intent(
            Governing::One {
                key: &key,
                spec: &new,
            },
            Some(&report),
            Some(&pending),
            wanted_of(&new).as_ref(),
            &node,
            &now,
        )
        .expect("the answer to the new ask");
        assert_eq!(
            (
                intent.conditions[0].status.as_str(),
                intent.conditions[0].reason.as_deref()
            ),
            ("True", Some("UpgradePending"))
        );
    }

    #[test]
    fn the_driver_type_label_follows_the_selected_config() {
        let mut spec = DeviceConfigSpec::default();
        spec.driver_mut().enable = true;
        let config = key_of("kube-amd-gpu", "gpus");
        let one = Governing::One {
            key: &config,
            spec: &spec,
        };
        let key = "gpu.operator.amd.com/kube-amd-gpu.gpus.driver";
        let no_labels = BTreeMap::new();
        let mut state = Shown::default();
        assert_eq!(
            state.labels_to_apply(Governing::None, &no_labels),
            None,
            "nothing selects a clean node: no write at start"
        );
        let wanted = state
            .labels_to_apply(one, &no_labels)
            .expect("a first write");
        assert_eq!(wanted, [(key.to_owned(), "container".to_owned())].into());
        state.labels_written(wanted.clone());
        assert_eq!(state.labels_to_apply(one, &wanted), None, "unchanged");
        assert_eq!(state.labels_to_apply(Governing::Conflict, &wanted), None);
        assert_eq!(
            state.labels_to_apply(Governing::None, &wanted),
            Some(BTreeMap::new()),
            "deselected: removed"
        );
        let restarted = Shown::default();
        assert_eq!(
            restarted.labels_to_apply(Governing::None, &wanted),
            Some(BTreeMap::new()),
            "a restarted agent removes a label it finds"
        );
    }

    #[test]
    fn the_driver_type_label_is_there_only_with_driver_enable() {
        let label = |driver_type, enable| {
            type_labels(
                "kube-amd-gpu",
                "gpu-config",
                &driver_spec(driver_type, enable),
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
        assert!(type_labels("ns", &long, &driver_spec("container", true)).is_empty());
    }

    #[test]
    fn what_is_wanted_follows_the_governing_config_and_its_upgrade_record() {
        use crate::api::DriverUpgradePolicySpec;
        use crate::api::UpgradeState;
        use crate::api::driver_upgrade::{RECORD_ANNOTATION, UpgradeRecord};
        let key = key_of("ns", "gpus");
        let other = key_of("ns", "other");
        let mut spec = DeviceConfigSpec::default();
        spec.driver_mut().enable = true;
        spec.driver_mut().version = Some("6.12.12".into());
        let mut rolling = spec.clone();
        rolling.driver_mut().upgrade_policy = Some(DriverUpgradePolicySpec {
            enable: Some(true),
            ..DriverUpgradePolicySpec::default()
        });
        let mut disabled = spec.clone();
        disabled.driver_mut().enable = false;
        let record_of = |config: &ConfigKey| {
            let mut record = UpgradeRecord::new(config.clone(), UpgradeState::InProgress, "t1");
            record.target = Some("6.14.1".into());
            record.reboot_from = Some("boot-1".into());
            BTreeMap::from([(RECORD_ANNOTATION.to_owned(), record.to_json())])
        };
        let (ours, others) = (record_of(&key), record_of(&other));
        let none = BTreeMap::new();
        let garbled = BTreeMap::from([(RECORD_ANNOTATION.to_owned(), "{".to_owned())]);
        let one = |spec| Governing::One { key: &key, spec };
        // (governing, annotations, (version, replace, reboot_from, told_at))
        type Asked<'a> = Option<(&'a str, bool, Option<&'a str>, Option<&'a str>)>;
        let table: Vec<(Governing<'_>, &BTreeMap<String, String>, Asked<'_>)> = vec![
            (Governing::None, &none, None),
            (Governing::Conflict, &ours, None),
            (one(&disabled), &ours, None),
            (one(&spec), &none, Some(("6.12.12", true, None, None))),
            (one(&spec), &garbled, Some(("6.12.12", true, None, None))),
            (one(&rolling), &none, Some(("6.12.12", false, None, None))),
            (one(&rolling), &others, Some(("6.12.12", false, None, None))),
            (
                one(&rolling),
                &ours,
                Some(("6.14.1", true, Some("boot-1"), Some("t1"))),
            ),
        ];
        for (i, (governing, annotations, expected)) in table.into_iter().enumerate() {
            let got = wanted(governing, annotations);
            let got = got.as_ref().map(|w| {
                (
                    w.version.as_deref().unwrap_or_default(),
                    w.replace,
                    w.reboot_from.as_deref(),
                    w.told_at.as_deref(),
                )
            });
            assert_eq!(got, expected, "row {i}");
        }
    }

    #[test]
    fn after_a_look_a_replacement_waits_for_the_rolling_upgrade_and_the_in_box_driver_names_its_blacklist()
     {
        let bundle = Box::new(Verified {
            dir: "/var/lib/amd-gpu-operator/bundles/6.14.1".into(),
            version: "6.14.1".into(),
            kernel_release: "6.8.0".into(),
            module: "amdgpu.ko".into(),
            files: 1,
            bytes: 1,
            signatures_checked: false,
        });
        let report = DriverReport {
            loaded: true,
            origin: ModuleOrigin::OutOfTree,
            version: Some("6.12.12".into()),
            ..DriverReport::default()
        };
        let wanted = |replace| DriverWanted {
            driver_type: DriverType::Container,
            version: Some("6.14.1".into()),
            blacklist: Some(true),
            module: KernelModuleConfigSpec::default(),
            replace,
            reboot_from: None,
            told_at: None,
        };
        let in_box = || LoadDecision::ReplaceNeeded {
            loaded: ModuleOrigin::InTree,
            version: None,
            why: "the in-box amdgpu is loaded".into(),
        };
        let load = LoadDecision::Load {
            bundle: bundle.clone(),
        };
        let replace = LoadDecision::Replace {
            bundle: bundle.clone(),
        };
        let step = |decision, blacklisted, replace| {
            next_step(decision, blacklisted, &wanted(replace), &report)
        };
        assert_eq!(
            step(load.clone(), Blacklisted::No, true),
            Next::Load(bundle.clone())
        );
        assert_eq!(
            step(load, Blacklisted::No, false),
            Next::Load(bundle.clone())
        );
        assert_eq!(
            step(replace.clone(), Blacklisted::No, true),
            Next::Replace(bundle.clone())
        );
        let done = |next: Next| match next {
            Next::Done(outcome) => (outcome.state, outcome.reason, outcome.message),
            other => panic!("not an outcome: {other:?}"),
        };
        let pending = done(step(replace, Blacklisted::No, false));
        assert_eq!(
            (pending.0, pending.1.as_str()),
            (DriverLoadState::Loaded, UPGRADE_PENDING)
        );
        assert!(pending.2.contains("amdgpu 6.12.12 runs"), "{}", pending.2);
        let pending = done(step(in_box(), Blacklisted::Yes, false));
        assert_eq!(pending.1, UPGRADE_PENDING);
        // Replacing the in-box driver needs a reboot: the message says how the
        // blacklist stands.
        let (state, reason, message) = done(step(in_box(), Blacklisted::Yes, true));
        assert_eq!(
            (state, reason.as_str()),
            (DriverLoadState::ReplaceNeeded, "DriverReplaceNeeded")
        );
        assert!(
            message.contains("blacklisted for the next boot"),
            "{message}"
        );
        let (_, _, message) = done(step(in_box(), Blacklisted::BlockedByForeignFile, true));
        assert!(
            message.contains("was not written by an operator"),
            "{message}"
        );
        let (_, _, message) = done(step(in_box(), Blacklisted::No, true));
        assert_eq!(message, "the in-box amdgpu is loaded");
        let refused = done(step(
            LoadDecision::Refuse {
                reason: "BundleMissingForKernel",
                message: "none for 6.8.0".into(),
            },
            Blacklisted::No,
            true,
        ));
        assert_eq!(
            (refused.0, refused.1.as_str()),
            (DriverLoadState::Refused, "BundleMissingForKernel")
        );
        let running = done(step(
            LoadDecision::Nothing {
                version: "6.14.1".into(),
            },
            Blacklisted::No,
            true,
        ));
        assert_eq!(
            (running.0, running.1.as_str()),
            (DriverLoadState::Loaded, RUNNING)
        );
    }

    #[test]
    fn a_reboot_that_would_bring_the_in_box_driver_back_is_refused() {
        let report = |origin| DriverReport {
            loaded: true,
            origin,
            ..DriverReport::default()
        };
        let in_box = report(ModuleOrigin::InTree);
        let table: Vec<(&DriverReport, Result<Blacklisted, String>, Option<&str>)> = vec![
            (&in_box, Ok(Blacklisted::Yes), None),
            (
                &in_box,
                Ok(Blacklisted::No),
                Some("driver.blacklist is not true"),
            ),
            (
                &in_box,
                Ok(Blacklisted::BlockedByForeignFile),
                Some("was not written by an operator"),
            ),
            (
                &in_box,
                Err("read-only file system".into()),
                Some("read-only file system"),
            ),
        ];
        for (report, written, why) in table {
            let refused = reboot_blocked(report, &written);
            match why {
                None => assert_eq!(refused, None, "{written:?}"),
                Some(why) => {
                    let refused = refused.expect("refused");
                    assert_eq!(
                        (refused.state, refused.reason.as_str()),
                        (DriverLoadState::Refused, "BlacklistNotInEffect"),
                        "{written:?}"
                    );
                    assert!(refused.message.contains(why), "{}", refused.message);
                }
            }
        }
        // An out-of-tree driver does not come back at boot: reboot.
        let out_of_tree = report(ModuleOrigin::OutOfTree);
        assert_eq!(reboot_blocked(&out_of_tree, &Ok(Blacklisted::No)), None);
    }
}
