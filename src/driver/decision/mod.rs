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

/// An outcome in `state`, of no version, not yet told. Pure.
fn outcome(
    state: DriverLoadState,
    reason: &str,
    message: String,
    bundle: Option<&str>,
) -> DriverLoad {
    DriverLoad {
        state,
        reason: reason.to_owned(),
        message,
        bundle: bundle.map(str::to_owned),
        version: None,
        asked: None,
        told_at: None,
    }
}

/// The outcome for a decision that needs no command. Pure.
pub(super) fn outcome_of(decision: &LoadDecision) -> Option<DriverLoad> {
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
    outcome(DriverLoadState::Failed, reason, message, bundle)
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
mod tests;
