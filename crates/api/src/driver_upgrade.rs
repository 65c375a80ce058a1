//! The leader↔agent contract of rolling driver upgrades: the leader's record
//! of one node's upgrade, kept on that Node, where the node's agent reads
//! what it is to load and a newly elected leader finds where every node
//! stood.
//!
//! The record is the annotation [`RECORD_ANNOTATION`], compact JSON:
//!
//! ```json
//! {"v":1,"deviceConfig":"kube-amd-gpu/default","state":"Upgrade-In-Progress",
//!  "since":"2026-12-02T08:00:05Z","started":"2026-12-02T08:00:00Z",
//!  "from":"6.3.0","target":"6.4.1","rebootFrom":"3f1c…","cordonedBefore":false}
//! ```
//!
//! - `deviceConfig`: whose upgrade; an agent follows a record only when its
//!   node's DeviceConfig is that one.
//! - `state`: the reference operator's state names ([`UpgradeState`]), also
//!   mirrored in the label [`STATE_LABEL`] so that `kubectl get nodes -L`
//!   and the reference's runbooks see it. A person sets that label to
//!   [`RETRY_VALUE`] to have a failed node tried again.
//! - `since`, `started`: when the node entered `state`, and when its
//!   upgrade began (RFC 3339); timeouts are counted from these, so a new
//!   leader keeps the old leader's clock.
//! - `from`, `target`: the version it ran when picked, and the version its
//!   agent is to load. `target` is set once the node is drained (at once for
//!   a first install) and cleared when the upgrade completes.
//! - `rebootFrom`: reboot while the boot id is still this one. A boot id
//!   changes at every boot, so an agent reboots once for it, and a restarted
//!   agent on a rebooted node does not reboot again.
//! - `cordonedBefore`: whether the node was cordoned already when the leader
//!   picked it, written before the leader cordons it: a leader that resumes
//!   never takes its own cordon for a person's, nor a person's for its own.
//! - `reason`: why the node failed, or what blocks its current step.
//!
//! Both sides use these types, so what the leader writes and what the agent
//! reads cannot drift apart. Plain data: this module must not depend on the
//! agent or the cluster role.

use serde::{Deserialize, Serialize};

use super::UpgradeState;
use super::agent_status::ConfigKey;

/// The Node annotation holding the [`UpgradeRecord`].
pub const RECORD_ANNOTATION: &str = "operator.amd.com/gpu-driver-upgrade";
/// The Node label mirroring the record's state (the reference's key).
pub const STATE_LABEL: &str = "operator.amd.com/gpu-driver-upgrade-state";
/// The value of [`STATE_LABEL`] a person sets to retry a failed node.
pub const RETRY_VALUE: &str = "upgrade-required";
/// The taint a node carries while it is upgraded (the reference's).
pub const TAINT_KEY: &str = "amd-gpu-driver-upgrade";
pub const RECORD_VERSION: u32 = 1;

/// The leader's record of one node's driver upgrade.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeRecord {
    pub v: u32,
    pub device_config: ConfigKey,
    pub state: UpgradeState,
    pub since: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reboot_from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cordoned_before: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl UpgradeRecord {
    pub fn new(device_config: ConfigKey, state: UpgradeState, since: impl Into<String>) -> Self {
        Self {
            v: RECORD_VERSION,
            device_config,
            state,
            since: since.into(),
            started: None,
            from: None,
            target: None,
            reboot_from: None,
            cordoned_before: None,
            reason: None,
        }
    }

    pub fn to_json(&self) -> String {
        // Plain strings and options: serialising cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The record among a Node's annotations, if there is one that parses.
    pub fn of_annotations(
        annotations: &std::collections::BTreeMap<String, String>,
    ) -> Option<Self> {
        annotations
            .get(RECORD_ANNOTATION)
            .and_then(|text| Self::parse(text).ok())
    }

    /// The version the agent of a node that `key` selects is to load: the
    /// record's target, when the record is that DeviceConfig's.
    pub fn target_for(&self, key: &ConfigKey) -> Option<&str> {
        (self.device_config == *key)
            .then_some(self.target.as_deref())
            .flatten()
    }

    /// The leader cordoned this node itself and has not released it: it
    /// picked the node when nobody had cordoned it, and the upgrade is
    /// under way, failed (a failed node stays cordoned) or waiting for its
    /// retry. Not after a cordon that did not take (`Cordon-Failed`, which
    /// undoes whatever part did), nor once complete (released).
    pub fn holds_cordon(&self) -> bool {
        self.cordoned_before == Some(false)
            && !self.state.is_complete()
            && self.state != UpgradeState::CordonFailed
    }
}

impl UpgradeState {
    /// A node counted as being upgraded: picked and not done.
    pub fn is_in_progress(&self) -> bool {
        matches!(
            self,
            Self::Started | Self::InProgress | Self::RebootInProgress | Self::InstallInProgress
        )
    }

    /// One of the failure states, left only when a person asks for a retry.
    pub fn is_failed(&self) -> bool {
        matches!(
            self,
            Self::Failed
                | Self::TimedOut
                | Self::CordonFailed
                | Self::UncordonFailed
                | Self::DrainFailed
                | Self::RebootFailed
        )
    }

    /// Done: the node runs the target.
    pub fn is_complete(&self) -> bool {
        matches!(self, Self::Complete | Self::InstallComplete)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_in_the_documented_shape() {
        let mut record = UpgradeRecord::new(
            ConfigKey::new("kube-amd-gpu", "default"),
            UpgradeState::InProgress,
            "2026-12-02T08:00:05Z",
        );
        record.started = Some("2026-12-02T08:00:00Z".into());
        record.target = Some("6.4.1".into());
        record.cordoned_before = Some(false);
        let json = record.to_json();
        assert!(
            json.starts_with(
                r#"{"v":1,"deviceConfig":"kube-amd-gpu/default","state":"Upgrade-In-Progress","#
            ),
            "{json}"
        );
        assert_eq!(UpgradeRecord::parse(&json).unwrap(), record);
        assert_eq!(
            record.target_for(&ConfigKey::new("kube-amd-gpu", "default")),
            Some("6.4.1")
        );
        assert_eq!(record.target_for(&ConfigKey::new("other", "default")), None);
        assert!(record.holds_cordon());
        record.state = UpgradeState::Complete;
        assert!(!record.holds_cordon(), "released on completion");
        record.state = UpgradeState::DrainFailed;
        assert!(record.holds_cordon(), "a failed node stays cordoned");
        record.state = UpgradeState::NotStarted;
        assert!(
            record.holds_cordon(),
            "and through a retry that waits its turn"
        );
        record.state = UpgradeState::CordonFailed;
        assert!(
            !record.holds_cordon(),
            "a cordon that did not take is undone"
        );
        record.state = UpgradeState::DrainFailed;
        record.cordoned_before = Some(true);
        assert!(!record.holds_cordon(), "a person's cordon is the person's");
    }

    #[test]
    fn states_fall_into_one_class_each() {
        for text in UpgradeState::KNOWN {
            let state = UpgradeState::from(*text);
            let classes = [
                state.is_in_progress(),
                state.is_failed(),
                state.is_complete(),
                state == UpgradeState::NotStarted,
            ];
            assert_eq!(
                classes.iter().filter(|c| **c).count(),
                1,
                "{text} must be in exactly one class"
            );
        }
    }
}
