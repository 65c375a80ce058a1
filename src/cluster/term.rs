//! What one leadership term remembers of its leader steps, beside the
//! Nodes: the upgrade records it wrote, and remediation's pace and notices.
//! Held by the [`super::context::Context`] of the term, below the executors
//! that read and fill it; a new term starts empty. This module must not do
//! I/O.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use super::upgrade::Timeouts;
use crate::api::agent_status::ConfigKey;
use crate::api::driver_upgrade::UpgradeRecord;
use crate::api::remediation_status::Runs;
use crate::remediation::plan::Confirm;

/// The upgrade work of one leadership term: the records it wrote (its
/// drains are [`super::drain::Drains`]).
pub struct Upgrades {
    /// Node → the record this term last wrote, or tried to.
    written: Mutex<HashMap<String, Written>>,
    pub timeouts: Timeouts,
}

/// A record this term wrote, or tried to write.
#[derive(Clone, Debug)]
struct Written {
    /// `None`: removed.
    record: Option<UpgradeRecord>,
    /// The API server said it took the write. An unconfirmed write (no
    /// answer, a dropped connection) may have landed: it counts as written
    /// for deciding, so that a node maybe picked counts as busy, and is sent
    /// again.
    confirmed: bool,
}

impl Upgrades {
    /// The upgrade state of a new term.
    pub fn new(timeouts: Timeouts) -> Self {
        Self {
            written: Mutex::new(HashMap::new()),
            timeouts,
        }
    }

    fn written(&self, node: &str) -> Option<Written> {
        self.written.lock().ok().and_then(|w| w.get(node).cloned())
    }

    /// The record to decide on for `node`: the one this term wrote (or
    /// tried to) last, else the Node's own.
    pub(super) fn record_of(&self, node: &Node) -> Option<UpgradeRecord> {
        match self.written(&node.name_any()) {
            Some(written) => written.record,
            None => UpgradeRecord::of_annotations(node.annotations()),
        }
    }

    /// Whether `record` must be written to `node`: it is not what the
    /// decision started from, or a write of it was not confirmed.
    pub(super) fn needs_write(
        &self,
        node: &str,
        current: Option<&UpgradeRecord>,
        record: &UpgradeRecord,
    ) -> bool {
        current != Some(record)
            || self
                .written(node)
                .is_some_and(|w| !w.confirmed && w.record.as_ref() == Some(record))
    }

    pub(super) fn remember(&self, node: &str, record: Option<UpgradeRecord>, confirmed: bool) {
        if let Ok(mut written) = self.written.lock() {
            written.insert(node.to_owned(), Written { record, confirmed });
        }
    }

    /// A write to `node` got no answer and is to be sent again.
    pub(super) fn unconfirmed(&self, node: &str) -> bool {
        self.written(node).is_some_and(|w| !w.confirmed)
    }

    /// Forgets what this term wrote to `node`: its Node is read again.
    pub(super) fn forget(&self, node: &str) {
        if let Ok(mut written) = self.written.lock() {
            written.remove(node);
        }
    }
}

/// What this leadership term remembers of remediation: the confirmation
/// pace, and which notices it gave already (dry-run and breaker Events are
/// given once per term and cause, not at every reconcile).
#[derive(Debug, Default)]
pub struct Remediations {
    pub confirm: Confirm,
    noticed: Mutex<HashSet<String>>,
    /// Per DeviceConfig, the runs this term last wrote to the namespace's
    /// RemediationWorkflowStatus: unchanged runs cost no request.
    pub(super) written_runs: Mutex<HashMap<ConfigKey, Runs>>,
    /// Per namespace, when to try creating the RemediationWorkflowStatus
    /// again after a create failed (its CRD not installed, say).
    pub(super) create_again: Mutex<HashMap<String, std::time::Instant>>,
}

/// How long a failed create of the RemediationWorkflowStatus is not tried
/// again: a missing CRD costs one request per namespace this often.
pub(super) const CREATE_AGAIN_AFTER: Duration = Duration::from_secs(300);

impl Remediations {
    pub fn new(confirm: Confirm) -> Self {
        Self {
            confirm,
            ..Self::default()
        }
    }

    /// True the first time `key` is noticed in this term.
    pub(super) fn first_notice(&self, key: String) -> bool {
        self.noticed
            .lock()
            .map(|mut n| n.insert(key))
            .unwrap_or(false)
    }

    /// Forgets the notices starting with `prefix`: their cause went.
    pub(super) fn forget(&self, prefix: &str) {
        if let Ok(mut noticed) = self.noticed.lock() {
            noticed.retain(|k| !k.starts_with(prefix));
        }
    }
}
