//! The one writer of Nodes: the agent's own Node, and the Nodes the leader
//! upgrades.
//!
//! Every concern that puts something on a Node (the labeller, the health
//! monitor, the test runner, the agent status, the driver; the leader's
//! driver upgrades) says what it wants there as a whole
//! [`NodeIntent`], and the writer applies it with server-side apply under that
//! concern's own field manager ([`Concern::field_manager`]). The API server then
//! records which keys each concern owns: a key a concern stops applying is
//! removed, and two concerns never remove each other's keys. Nothing is kept
//! in memory or in annotations to remember what was written.
//!
//! Ownership is the server's `managedFields`. Two cases need more than the
//! apply, and the writer handles both the same way:
//! - Taking over. The apply is forced, so a key another writer set to another
//!   value becomes ours. A key someone else set to the *same* value is shared,
//!   and would outlive our omitting it; so a key this concern owned before and
//!   no longer wants is removed explicitly when the apply left it behind. That
//!   is how labels the reference operator wrote under the same keys are taken
//!   over: once applied, they are ours to remove.
//! - Writes of earlier versions, made with merge patches (operation `Update`)
//!   under the same field manager, count as the concern's own. Earlier
//!   versions wrote the GPU labels under the agent's manager and listed them
//!   in an annotation: the labeller names those keys in
//!   [`NodeIntent::retired_labels`] and the annotation in
//!   [`NodeIntent::retired_annotations`], and the writer treats them as owned.
//!
//! Cordon and taint are the exception to server-side apply: `spec.taints` is
//! an atomic list, so an apply of one taint would claim every taint on the
//! Node, and drop a taint another writer adds between our read and our write.
//! [`NodeWriter::set_cordon`] sends a JSON Patch instead, guarded by the
//! resourceVersion it decided on, and decides again when the Node changed
//! meanwhile ([`cordon_patch`]).
//!
//! Every write is retried on transient errors with one policy ([`retry_policy`]);
//! a write that still fails returns its error to the concern, which says so in
//! its readiness and tries again after [`RETRY_AFTER_FAILURE`] or on its next
//! change. Every failed request counts in the agent's API-error metric.
//!
//! This module must not decide what a concern wants (the concerns do, in pure
//! functions), and writes nothing but Nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::api::Patch;
use kube::{Api, ResourceExt};
use serde_json::{Map, Value, json};

use crate::api::field_manager;

/// Who writes to the Node, each under a field manager of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Concern {
    /// The GPU labels (`amd.com/gpu.*`, `beta.amd.com/gpu.*`, ...).
    Labeller,
    /// The `AMDGPUUnhealthy` condition and `metricsexporter.amd.com.gpu.<id>.state` labels.
    Health,
    /// The running-state labels of test runs.
    TestRunner,
    /// The agent status annotation the leader aggregates.
    AgentStatus,
    /// The operator-side driver-type label the reference writes.
    Driver,
    /// The leader's driver upgrade of a node: its record, state label,
    /// cordon and taint.
    Upgrade,
    /// The agent's partition change: the state label.
    Partition,
    /// The leader's part of a partition change: its record, cordon and taint.
    PartitionLeader,
    /// The leader's remediation of a node: its record, labels and taints.
    Remediation,
    /// `gpu-operator detect`: the NFD labels of the node's AMD GPUs, where
    /// Node Feature Discovery is not installed.
    Detect,
}

impl Concern {
    pub const fn field_manager(self) -> &'static str {
        match self {
            Self::Labeller => field_manager::LABELLER,
            Self::Health => field_manager::HEALTH,
            Self::TestRunner => field_manager::TEST_RUNNER,
            Self::AgentStatus => field_manager::AGENT_STATUS,
            Self::Driver => field_manager::DRIVER,
            Self::Upgrade => field_manager::UPGRADE,
            Self::Partition => field_manager::PARTITION,
            Self::PartitionLeader => field_manager::PARTITION_LEADER,
            Self::Remediation => field_manager::REMEDIATION,
            Self::Detect => field_manager::DETECT,
        }
    }

    fn is_ours(self, manager: Option<&str>) -> bool {
        manager == Some(self.field_manager())
    }
}

/// What one concern wants on the main Node object: all of it, every time.
/// A key left out is a key the concern no longer wants.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeIntent {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Labels the concern wrote by earlier means (before it had a field
    /// manager of its own): treated as its own, so removed when not wanted.
    pub retired_labels: BTreeSet<String>,
    /// Annotations to remove when present and not wanted, likewise.
    pub retired_annotations: BTreeSet<String>,
}

/// What one concern wants in the Node's status: its conditions, by type.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatusIntent {
    pub conditions: Vec<NodeCondition>,
}

/// A condition as a concern wants it now: both times `now` (see
/// [`condition_to_apply`] for what is kept of the Node's).
pub fn condition_at(
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> NodeCondition {
    NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    }
}

/// The condition of `type_` on `node`, if it has one.
pub fn find_condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == type_))
}

/// What a concern should apply for `desired` (its times set to now), given
/// the Node: the condition it has, unchanged, when that says the same (no
/// write for a heartbeat); else `desired`, keeping the existing transition
/// time when the status did not change. Pure.
pub fn condition_to_apply(node: &Node, desired: NodeCondition) -> NodeCondition {
    match find_condition(node, &desired.type_) {
        Some(existing)
            if existing.status == desired.status
                && existing.reason == desired.reason
                && existing.message == desired.message =>
        {
            existing.clone()
        }
        Some(existing)
            if existing.status == desired.status && existing.last_transition_time.is_some() =>
        {
            NodeCondition {
                last_transition_time: existing.last_transition_time.clone(),
                ..desired
            }
        }
        _ => desired,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NodeWriteError {
    #[error("reading Node {node}: {source}")]
    Read {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing the {what} of Node {node} (as {manager}): {source}")]
    Write {
        node: String,
        what: &'static str,
        manager: &'static str,
        #[source]
        source: kube::Error,
    },
}

/// What a concern wants of a Node's scheduling: its cordon, and its taints.
#[derive(Clone, Debug, PartialEq)]
pub struct CordonIntent {
    /// `Some(true)` cordons, `Some(false)` uncordons, `None` leaves
    /// `spec.unschedulable` as it is (a person's cordon stays).
    pub unschedulable: Option<bool>,
    /// The concern's taints, each told apart from others by its key and
    /// effect.
    pub taints: Vec<Taint>,
    /// Whether the Node should carry them.
    pub tainted: bool,
}

/// How often [`NodeWriter::set_cordon`] decides again when the Node changed
/// between its read and its write.
const CONFLICT_TRIES: usize = 5;

/// The JSON Patch that makes `node` carry `intent`, guarded by the Node's
/// resourceVersion so that it fails, rather than drop someone's taint,
/// when the Node changed since it was read; `None` when the Node already
/// carries it. Pure.
pub fn cordon_patch(node: &Node, intent: &CordonIntent) -> Option<json_patch::Patch> {
    let spec = node.spec.as_ref();
    let taints = spec.and_then(|s| s.taints.clone()).unwrap_or_default();
    let same = |a: &Taint, b: &Taint| a.key == b.key && a.effect == b.effect;
    let ours = |t: &Taint| intent.taints.iter().any(|w| same(w, t));
    let mut wanted: Vec<Taint> = taints.iter().filter(|t| !ours(t)).cloned().collect();
    if intent.tainted {
        wanted.extend(intent.taints.iter().cloned());
    }
    let taints_change = if intent.tainted {
        // Each of ours present once, as wanted.
        intent.taints.iter().any(|w| {
            let mut alike = taints.iter().filter(|t| same(w, t));
            !matches!((alike.next(), alike.next()), (Some(t), None) if t == w)
        })
    } else {
        taints.iter().any(ours)
    };
    let unschedulable = spec.and_then(|s| s.unschedulable).unwrap_or(false);
    let cordon_change = intent
        .unschedulable
        .is_some_and(|want| want != unschedulable);
    if !taints_change && !cordon_change {
        return None;
    }
    let mut ops = Vec::new();
    if let Some(version) = node.metadata.resource_version.as_deref() {
        ops.push(json!({"op": "test", "path": "/metadata/resourceVersion", "value": version}));
    }
    if spec.is_none() {
        ops.push(json!({"op": "add", "path": "/spec", "value": {}}));
    }
    if taints_change {
        if wanted.is_empty() {
            ops.push(json!({"op": "remove", "path": "/spec/taints"}));
        } else {
            ops.push(json!({"op": "add", "path": "/spec/taints", "value": wanted}));
        }
    }
    match intent.unschedulable {
        Some(true) if cordon_change => {
            ops.push(json!({"op": "add", "path": "/spec/unschedulable", "value": true}));
        }
        Some(false) if cordon_change => {
            ops.push(json!({"op": "remove", "path": "/spec/unschedulable"}));
        }
        _ => {}
    }
    serde_json::from_value(Value::Array(ops)).ok()
}

/// How long a concern waits before trying a failed write again (unless a
/// change comes first): the same for every concern.
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(5);

/// The retry policy of every Node write: a few quick tries, about 3 s in all,
/// for what a loaded or restarting API server answers; longer outages are the
/// concern's to report and retry on its next change.
pub fn retry_policy() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(2))
        .with_max_times(4)
        .with_jitter()
}

/// Errors worth retrying: the server was busy, unavailable, or not reached.
/// A rejection (400, 403, 404, 409, 422) will not change by retrying.
pub fn is_transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => matches!(status.code, 429 | 500 | 502 | 503 | 504),
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// What a write did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// The apply was sent (something differed).
    pub applied: bool,
    /// Keys the apply left behind were removed explicitly.
    pub removed_leftovers: bool,
}

/// The writer of one Node.
#[derive(Clone)]
pub struct NodeWriter {
    nodes: Api<Node>,
    name: String,
}

impl NodeWriter {
    pub fn new(nodes: Api<Node>, name: impl Into<String>) -> Self {
        Self {
            nodes,
            name: name.into(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Makes the Node carry exactly `intent` among `concern`'s keys; writes
    /// nothing when it already does.
    pub async fn apply(
        &self,
        concern: Concern,
        intent: &NodeIntent,
    ) -> Result<Written, NodeWriteError> {
        let node = self.read().await?;
        self.apply_to(&node, concern, intent).await
    }

    /// As [`NodeWriter::apply`], deciding on `node`: a copy just read (by
    /// [`NodeWriter::read`]), for concerns that need it to build their intent.
    pub async fn apply_to(
        &self,
        node: &Node,
        concern: Concern,
        intent: &NodeIntent,
    ) -> Result<Written, NodeWriteError> {
        let plan = plan_metadata(node, concern, intent);
        let mut written = Written::default();
        if plan.apply {
            let body = metadata_apply_body(&self.name, intent);
            self.send(concern, "metadata", Write::Apply(body)).await?;
            written.applied = true;
        }
        if let Some(patch) = plan.leftovers_patch() {
            self.send(concern, "leftover keys", Write::Merge(patch))
                .await?;
            written.removed_leftovers = true;
        }
        if written != Written::default() {
            tracing::debug!(node = %self.name, manager = concern.field_manager(), ?written, "wrote the Node");
        }
        Ok(written)
    }

    /// Makes the Node's status carry exactly `intent`'s conditions among
    /// `concern`'s; writes nothing when it already does. Conditions of other
    /// writers (the kubelet's) are never touched.
    pub async fn apply_status(
        &self,
        concern: Concern,
        intent: &StatusIntent,
    ) -> Result<Written, NodeWriteError> {
        let node = self.read().await?;
        self.apply_status_to(&node, concern, intent).await
    }

    /// As [`NodeWriter::apply_status`], deciding on `node` (a copy just read).
    pub async fn apply_status_to(
        &self,
        node: &Node,
        concern: Concern,
        intent: &StatusIntent,
    ) -> Result<Written, NodeWriteError> {
        let plan = plan_conditions(node, concern, intent);
        let mut written = Written::default();
        if plan.apply {
            let body = status_apply_body(&self.name, intent);
            self.send(concern, "status", Write::ApplyStatus(body))
                .await?;
            written.applied = true;
        }
        // A condition shared with an earlier write of the same value: removed
        // by type, guarded so that a concurrent change to the list fails the
        // patch instead of removing someone else's entry.
        for kind in plan.leftover_conditions {
            let Some(patch) = self.condition_removal(&kind).await? else {
                continue;
            };
            self.send(concern, "leftover condition", Write::JsonStatus(patch))
                .await?;
            written.removed_leftovers = true;
        }
        Ok(written)
    }

    /// Removes label `key` if it still holds `value`: for a person's
    /// request (a force-resume label) once it is acted on. Returns whether
    /// it was removed; a label that changed or went meanwhile is left alone.
    pub async fn remove_label_if(
        &self,
        concern: Concern,
        key: &str,
        value: &str,
    ) -> Result<bool, NodeWriteError> {
        let patch = guarded_removal("labels", key, value);
        match self.send(concern, "label", Write::Json(patch)).await {
            Ok(_) => Ok(true),
            Err(NodeWriteError::Write {
                source: kube::Error::Api(status),
                ..
            }) if status.code == 422 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes annotation `key` if it still holds `value`: for requests
    /// someone else wrote (a test request) once they are handled. In the same
    /// patch, `receipt` (a key and a value unique to this handling) is set, so
    /// that every copy of the Node written after the removal carries it and
    /// a copy without it is known to be older (resourceVersions are opaque
    /// and cannot be ordered). Returns the Node after the removal, or `None`
    /// when the annotation had changed or was gone and was left alone.
    pub async fn remove_annotation_if(
        &self,
        concern: Concern,
        key: &str,
        value: &str,
        receipt: (&str, &str),
    ) -> Result<Option<Node>, NodeWriteError> {
        let patch = guarded_annotation_removal(key, value, receipt);
        let result = self.send(concern, "annotation", Write::Json(patch)).await;
        match result {
            Ok(node) => Ok(Some(node)),
            // The guard failed: the annotation changed or is gone.
            Err(NodeWriteError::Write {
                source: kube::Error::Api(status),
                ..
            }) if status.code == 422 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Makes the Node's cordon and `intent.taints` what `intent` says, with
    /// a guarded JSON Patch ([`cordon_patch`]); writes nothing when the Node
    /// already says it. When the Node changed between the read and the
    /// write, it reads and decides again, a few times.
    pub async fn set_cordon(
        &self,
        concern: Concern,
        intent: &CordonIntent,
    ) -> Result<Written, NodeWriteError> {
        let mut tries = 0;
        loop {
            tries += 1;
            let node = self.read().await?;
            let Some(patch) = cordon_patch(&node, intent) else {
                return Ok(Written::default());
            };
            match self
                .send(concern, "cordon and taint", Write::Json(patch))
                .await
            {
                Ok(_) => {
                    tracing::debug!(node = %self.name, manager = concern.field_manager(), ?intent, "wrote the cordon and taint");
                    return Ok(Written {
                        applied: true,
                        removed_leftovers: false,
                    });
                }
                // The guard failed: the Node changed since it was read.
                Err(NodeWriteError::Write {
                    source: kube::Error::Api(status),
                    ..
                }) if matches!(status.code, 409 | 422) && tries < CONFLICT_TRIES => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads the Node (with the writer's retries).
    pub async fn read(&self) -> Result<Node, NodeWriteError> {
        let get = || {
            let nodes = self.nodes.clone();
            let name = self.name.clone();
            async move { nodes.get(&name).await }
        };
        get.retry(retry_policy())
            .when(is_transient)
            .notify(|_, _| crate::counters::record_api_error())
            .await
            .map_err(|source| {
                crate::counters::record_api_error();
                NodeWriteError::Read {
                    node: self.name.clone(),
                    source,
                }
            })
    }

    async fn condition_removal(
        &self,
        kind: &str,
    ) -> Result<Option<json_patch::Patch>, NodeWriteError> {
        let node = self.read().await?;
        let conditions = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        let Some(index) = conditions.iter().position(|c| c.type_ == kind) else {
            return Ok(None);
        };
        Ok(serde_json::from_value(json!([
            {"op": "test", "path": format!("/status/conditions/{index}/type"), "value": kind},
            {"op": "remove", "path": format!("/status/conditions/{index}")},
        ]))
        .ok())
    }

    /// Sends one write under `concern`'s field manager, with the writer's
    /// retry policy; every failed request is counted.
    async fn send(
        &self,
        concern: Concern,
        what: &'static str,
        write: Write,
    ) -> Result<Node, NodeWriteError> {
        let manager = concern.field_manager();
        let attempt = || async {
            let (nodes, name) = (&self.nodes, self.name.as_str());
            match &write {
                Write::Apply(body) => {
                    let params = field_manager::apply(manager);
                    nodes.patch(name, &params, &Patch::Apply(body)).await
                }
                Write::ApplyStatus(body) => {
                    let params = field_manager::apply(manager);
                    nodes.patch_status(name, &params, &Patch::Apply(body)).await
                }
                Write::Merge(patch) => {
                    let params = field_manager::patch(manager);
                    nodes.patch(name, &params, &Patch::Merge(patch)).await
                }
                Write::Json(patch) => {
                    let params = field_manager::patch(manager);
                    nodes
                        .patch(name, &params, &Patch::Json::<()>(patch.clone()))
                        .await
                }
                Write::JsonStatus(patch) => {
                    let params = field_manager::patch(manager);
                    let patch = Patch::Json::<()>(patch.clone());
                    nodes.patch_status(name, &params, &patch).await
                }
            }
        };
        attempt
            .retry(retry_policy())
            .when(is_transient)
            .notify(|error, after| {
                crate::counters::record_api_error();
                tracing::debug!(node = %self.name, manager, %error, ?after, "Node write failed; retrying")
            })
            .await
            .inspect_err(|_| crate::counters::record_api_error())
            .map_err(|source| NodeWriteError::Write {
                node: self.name.clone(),
                what,
                manager,
                source,
            })
    }
}

/// One request to the Node, as [`NodeWriter::send`] makes it.
enum Write {
    /// Server-side apply of the main resource.
    Apply(Value),
    /// Server-side apply of the status subresource.
    ApplyStatus(Value),
    /// A JSON merge patch of the main resource (removing leftovers).
    Merge(Value),
    /// A JSON Patch of the main resource (a guarded removal).
    Json(json_patch::Patch),
    /// A JSON Patch of the status subresource (a guarded removal).
    JsonStatus(json_patch::Patch),
}

/// What to do to the Node's metadata for one concern.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetadataPlan {
    /// The intent differs from what the Node shows as the concern's.
    pub apply: bool,
    /// Labels the concern owned and no longer wants that an apply cannot
    /// remove (shared with an earlier, equal write), or that are on the Node
    /// already and would stay.
    pub leftover_labels: BTreeSet<String>,
    pub leftover_annotations: BTreeSet<String>,
}

impl MetadataPlan {
    /// A merge patch removing the leftovers; `None` when there are none.
    pub fn leftovers_patch(&self) -> Option<Value> {
        if self.leftover_labels.is_empty() && self.leftover_annotations.is_empty() {
            return None;
        }
        let nulls = |keys: &BTreeSet<String>| -> Map<String, Value> {
            keys.iter().map(|k| (k.clone(), Value::Null)).collect()
        };
        let mut metadata = Map::new();
        if !self.leftover_labels.is_empty() {
            metadata.insert("labels".into(), Value::Object(nulls(&self.leftover_labels)));
        }
        if !self.leftover_annotations.is_empty() {
            metadata.insert(
                "annotations".into(),
                Value::Object(nulls(&self.leftover_annotations)),
            );
        }
        Some(json!({ "metadata": metadata }))
    }
}

/// Decides the metadata writes of `concern` for `intent` on `node`. Pure.
///
/// The apply is needed when a wanted key is missing or differs, or when the
/// concern's Apply entry owns a key it no longer wants. Leftovers are keys
/// the concern owned (under any operation, or retired by the intent) that
/// it no longer wants and that stay on the Node after the apply: they are
/// present and owned by another entry too.
pub fn plan_metadata(node: &Node, concern: Concern, intent: &NodeIntent) -> MetadataPlan {
    let labels = node.labels();
    let annotations = node.annotations();
    let entries = node.metadata.managed_fields.as_deref().unwrap_or_default();
    let applied = owned_keys(entries, |e| applied_by(e, concern), "");
    let ours = owned_keys(entries, |e| concern.is_ours(e.manager.as_deref()), "");
    let mut ours_labels = ours.labels;
    ours_labels.extend(intent.retired_labels.iter().cloned());
    let ours_annotations = ours.annotations;
    let mut leftover_annotations: BTreeSet<String> = intent
        .retired_annotations
        .iter()
        .filter(|k| !intent.annotations.contains_key(*k))
        .cloned()
        .collect();
    let differs = |want: &BTreeMap<String, String>, have: &BTreeMap<String, String>| {
        want.iter().any(|(k, v)| have.get(k) != Some(v))
    };
    let stale_applied = applied
        .labels
        .iter()
        .any(|k| !intent.labels.contains_key(k))
        || applied
            .annotations
            .iter()
            .any(|k| !intent.annotations.contains_key(k));
    // Wanted keys our Apply entry does not own yet (set by someone else to
    // the same value): applying makes them ours, so that we may remove them.
    let unclaimed = intent.labels.keys().any(|k| !applied.labels.contains(k))
        || intent
            .annotations
            .keys()
            .any(|k| !applied.annotations.contains(k));
    let apply = differs(&intent.labels, labels)
        || differs(&intent.annotations, annotations)
        || stale_applied
        || unclaimed;
    // After the apply, the keys only our Apply entry owned are gone; the rest
    // of what we owned and no longer want stays unless removed.
    let leftover_labels = ours_labels
        .into_iter()
        .filter(|k| !intent.labels.contains_key(k) && labels.contains_key(k))
        .filter(|k| {
            owned_elsewhere(entries, concern, "", &["f:metadata", "f:labels", &field(k)])
                || !applied.labels.contains(k)
        })
        .collect();
    leftover_annotations.extend(
        ours_annotations
            .into_iter()
            .filter(|k| !intent.annotations.contains_key(k) && annotations.contains_key(k))
            .filter(|k| {
                owned_elsewhere(
                    entries,
                    concern,
                    "",
                    &["f:metadata", "f:annotations", &field(k)],
                ) || !applied.annotations.contains(k)
            }),
    );
    leftover_annotations.retain(|k| annotations.contains_key(k));
    MetadataPlan {
        apply,
        leftover_labels,
        leftover_annotations,
    }
}

/// What to do to the Node's conditions for one concern.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConditionPlan {
    pub apply: bool,
    /// Condition types the concern owned, no longer wants, and that an apply
    /// would leave behind.
    pub leftover_conditions: Vec<String>,
}

/// Decides the status writes of `concern` for `intent` on `node`. Pure.
pub fn plan_conditions(node: &Node, concern: Concern, intent: &StatusIntent) -> ConditionPlan {
    let live = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let entries = node.metadata.managed_fields.as_deref().unwrap_or_default();
    let applied = owned_condition_types(entries, |e| applied_by(e, concern));
    let ours = owned_condition_types(entries, |e| concern.is_ours(e.manager.as_deref()));
    let wanted: BTreeSet<&str> = intent.conditions.iter().map(|c| c.type_.as_str()).collect();
    let differs = intent
        .conditions
        .iter()
        .any(|want| live.iter().find(|c| c.type_ == want.type_) != Some(want));
    let stale_applied = applied.iter().any(|t| !wanted.contains(t.as_str()));
    let unclaimed = wanted.iter().any(|t| !applied.contains(*t));
    let leftover_conditions = ours
        .into_iter()
        .filter(|t| !wanted.contains(t.as_str()) && live.iter().any(|c| &c.type_ == t))
        .filter(|t| {
            let key = condition_key(t);
            owned_elsewhere(
                entries,
                concern,
                "status",
                &["f:status", "f:conditions", &key],
            ) || !applied.contains(t)
        })
        .collect();
    ConditionPlan {
        apply: differs || stale_applied || unclaimed,
        leftover_conditions,
    }
}

/// The apply body for the main resource: only the concern's keys.
pub fn metadata_apply_body(name: &str, intent: &NodeIntent) -> Value {
    let mut metadata = Map::new();
    metadata.insert("name".into(), json!(name));
    if !intent.labels.is_empty() {
        metadata.insert("labels".into(), json!(intent.labels));
    }
    if !intent.annotations.is_empty() {
        metadata.insert("annotations".into(), json!(intent.annotations));
    }
    json!({"apiVersion": "v1", "kind": "Node", "metadata": metadata})
}

/// The apply body for the status subresource: only the concern's conditions.
pub fn status_apply_body(name: &str, intent: &StatusIntent) -> Value {
    let mut body = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}});
    if !intent.conditions.is_empty() {
        body["status"] = json!({ "conditions": intent.conditions });
    }
    body
}

/// A JSON Patch removing `metadata.<section>[key]` only while it still
/// holds `value`.
pub fn guarded_removal(section: &str, key: &str, value: &str) -> json_patch::Patch {
    let path = format!(
        "/metadata/{section}/{}",
        key.replace('~', "~0").replace('/', "~1")
    );
    serde_json::from_value(json!([
        {"op": "test", "path": path, "value": value},
        {"op": "remove", "path": path},
    ]))
    .unwrap_or_else(|_| json_patch::Patch(Vec::new()))
}

/// A JSON Patch removing annotation `key` only while it still holds `value`.
pub fn guarded_annotation_removal(
    key: &str,
    value: &str,
    (receipt_key, receipt): (&str, &str),
) -> json_patch::Patch {
    let mut patch = guarded_removal("annotations", key, value);
    let receipt_path = format!(
        "/metadata/annotations/{}",
        receipt_key.replace('~', "~0").replace('/', "~1")
    );
    if let Ok(add) =
        serde_json::from_value(json!({"op": "add", "path": receipt_path, "value": receipt}))
    {
        patch.0.push(add);
    }
    patch
}

/// Keys of labels and annotations an entry set owns.
#[derive(Default)]
struct OwnedKeys {
    labels: BTreeSet<String>,
    annotations: BTreeSet<String>,
}

fn applied_by(entry: &ManagedFieldsEntry, concern: Concern) -> bool {
    entry.manager.as_deref() == Some(concern.field_manager())
        && entry.operation.as_deref() == Some("Apply")
}

fn subresource_is(entry: &ManagedFieldsEntry, subresource: &str) -> bool {
    entry.subresource.as_deref().unwrap_or_default() == subresource
}

fn fields_of(entry: &ManagedFieldsEntry) -> Option<&Map<String, Value>> {
    entry.fields_v1.as_ref()?.0.as_object()
}

fn owned_keys(
    entries: &[ManagedFieldsEntry],
    select: impl Fn(&ManagedFieldsEntry) -> bool,
    subresource: &str,
) -> OwnedKeys {
    let mut owned = OwnedKeys::default();
    for entry in entries
        .iter()
        .filter(|e| select(e) && subresource_is(e, subresource))
    {
        let Some(metadata) = fields_of(entry).and_then(|f| f.get("f:metadata")) else {
            continue;
        };
        let keys = |set: &str| -> Vec<String> {
            metadata
                .get(set)
                .and_then(Value::as_object)
                .map(|m| {
                    m.keys()
                        .filter_map(|k| k.strip_prefix("f:"))
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        owned.labels.extend(keys("f:labels"));
        owned.annotations.extend(keys("f:annotations"));
    }
    owned
}

fn owned_condition_types(
    entries: &[ManagedFieldsEntry],
    select: impl Fn(&ManagedFieldsEntry) -> bool,
) -> BTreeSet<String> {
    let mut types = BTreeSet::new();
    for entry in entries
        .iter()
        .filter(|e| select(e) && subresource_is(e, "status"))
    {
        let Some(conditions) = fields_of(entry)
            .and_then(|f| f.get("f:status"))
            .and_then(|s| s.get("f:conditions"))
            .and_then(Value::as_object)
        else {
            continue;
        };
        for key in conditions.keys() {
            if let Some(kind) = key
                .strip_prefix("k:")
                .and_then(|k| serde_json::from_str::<Value>(k).ok())
                .and_then(|k| k.get("type").and_then(Value::as_str).map(str::to_owned))
            {
                types.insert(kind);
            }
        }
    }
    types
}

/// Whether an entry that is not the concern's Apply entry owns `path`.
fn owned_elsewhere(
    entries: &[ManagedFieldsEntry],
    concern: Concern,
    subresource: &str,
    path: &[&str],
) -> bool {
    entries
        .iter()
        .filter(|e| !applied_by(e, concern) && subresource_is(e, subresource))
        .filter_map(fields_of)
        .any(|fields| {
            let mut at = Some(fields);
            for element in path {
                at = at.and_then(|m| m.get(*element)).and_then(Value::as_object);
            }
            at.is_some()
        })
}

fn field(key: &str) -> String {
    format!("f:{key}")
}

fn condition_key(kind: &str) -> String {
    format!("k:{}", json!({ "type": kind }))
}

#[cfg(test)]
mod tests;
