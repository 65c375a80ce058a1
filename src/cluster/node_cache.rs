//! What the leader keeps of each Node in its cache, and why.
//!
//! The leader caches every Node of the cluster (130,000 in the largest ones),
//! and a Node as a kubelet writes it is 10-30 KB of JSON: mostly
//! `status.images`, `managedFields`, capacity, addresses and `nodeInfo`. No
//! decision of the leader reads those, so [`keep_decided`] rebuilds each
//! watched Node from an allow-list before it enters the cache: a field a
//! kubelet or Kubernetes adds later is dropped too, not kept by default.
//!
//! Kept, and who reads it:
//! - `metadata.name`, `uid`, `resourceVersion`: the cache's key, and the
//!   object Events about a Node refer to.
//! - `metadata.labels`, only those [`KeptLabels`] keeps: the keys a selector
//!   of a DeviceConfig names (`spec.selector` and each operand's own:
//!   `draDriver`, `metricsExporter`, `testRunner`, `configManager`), and the
//!   operator's own labels that decisions read ([`OWN_LABEL_PREFIXES`]: the
//!   upgrade state label, remediation's force-resume, abort and pause
//!   labels, the partition profile and state labels). A kubelet's and NFD's
//!   labels (`kubernetes.io/hostname`, ~100 `feature.node.kubernetes.io/*`
//!   on a real GPU node) and the labeller's `amd.com/gpu.*` are read by no
//!   leader decision unless a selector names them, and were ~60 % of the
//!   cached bytes. When a DeviceConfig names a key not kept so far, the
//!   Node watch lists again keeping it (`cluster::node_watch`), and that
//!   DeviceConfig waits for the list.
//! - `metadata.annotations`, only [`KEPT_ANNOTATIONS`]: the agent's status,
//!   the upgrade, partition and remediation records. Other writers'
//!   annotations (CNI, CSI, kubeadm) are never read.
//! - `metadata.managedFields`, only who owns the labels and kept annotations
//!   that an entry of [`LEADER_WRITERS`] owns: the leader writes Node
//!   metadata through one concern alone, the upgrade
//!   ([`crate::node_writer::NodeWriter::apply_to`] deciding on the cached
//!   Node), and [`crate::node_writer::plan_metadata`] reads which keys that
//!   concern's manager owns and whether another manager owns them too; it
//!   asks about no other key. Everything else (the kubelet's, NFD's and the
//!   agent's ownership, status fields, times) is dropped, so a Node no
//!   upgrade has touched keeps no managedFields at all: each kept entry is a
//!   few nested JSON maps, ~3 KB of heap, twice the rest of the Node's
//!   metadata (`tests/leader_node_memory.rs`).
//! - `spec.unschedulable`, `spec.taints`: cordons and the taints of
//!   upgrades, partition changes and remediation.
//! - `status.conditions`: `type`, `status`, `reason` and `message`, for
//!   readiness and remediation's mapped conditions; their heartbeat and
//!   transition times are read by nobody (and a heartbeat would only churn).
//! - `status.nodeInfo.bootID` and `kernelVersion`: a reboot ends an upgrade
//!   or remediation step, and the status reports the kernel.
//!
//! `tests/leader_node_cache.rs` runs the leader's decisions over a kubelet's
//! full Node and over what this module keeps of it, and fails when they
//! differ: a decision that starts reading a dropped field must add it here.

use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, ObjectMeta};
use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use crate::api::DeviceConfig;

/// The prefixes of the operator's own Node labels that a leader decision
/// reads: `operator.amd.com/` (the upgrade state label, remediation's
/// force-resume, abort and pause labels) and `dcm.amd.com/` (the partition
/// profile and its state).
pub const OWN_LABEL_PREFIXES: [&str; 2] = ["operator.amd.com/", "dcm.amd.com/"];

/// The Node label keys the cache keeps: the operator's own
/// ([`OWN_LABEL_PREFIXES`]) and every key a selector of the DeviceConfigs
/// it was made for names. Pure data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeptLabels {
    selector_keys: BTreeSet<String>,
}

impl KeptLabels {
    /// What the cache must keep for `configs` to be decided on.
    pub fn for_configs<'a>(configs: impl IntoIterator<Item = &'a DeviceConfig>) -> Self {
        let mut selector_keys = BTreeSet::new();
        for dc in configs {
            selector_keys.extend(selector_keys_of(dc).cloned());
        }
        Self { selector_keys }
    }

    /// Whether the label `key` is kept.
    pub fn keeps(&self, key: &str) -> bool {
        OWN_LABEL_PREFIXES.iter().any(|p| key.starts_with(p)) || self.selector_keys.contains(key)
    }

    /// Whether a cache made keeping `self` holds every label `other` keeps.
    pub fn covers(&self, other: &Self) -> bool {
        other.selector_keys.is_subset(&self.selector_keys)
    }

    /// Keeps what `other` keeps too.
    pub fn extend(&mut self, other: &Self) {
        self.selector_keys
            .extend(other.selector_keys.iter().cloned());
    }

    /// The selector keys kept, for logs.
    pub fn selector_keys(&self) -> impl Iterator<Item = &str> {
        self.selector_keys.iter().map(String::as_str)
    }
}

/// Every label key a selector of `dc` names, whether its operand is enabled
/// or not (enabling one is a spec change, which would otherwise have to
/// wait for a list).
fn selector_keys_of(dc: &DeviceConfig) -> impl Iterator<Item = &String> {
    let spec = &dc.spec;
    [
        &spec.selector,
        &spec.dra_driver.selector,
        &spec.metrics_exporter.selector,
        &spec.test_runner.selector,
        &spec.config_manager.selector,
    ]
    .into_iter()
    .flat_map(BTreeMap::keys)
}

/// The Node annotations some leader decision reads.
pub const KEPT_ANNOTATIONS: [&str; 4] = [
    crate::api::agent_status::STATUS_ANNOTATION,
    crate::api::driver_upgrade::RECORD_ANNOTATION,
    crate::partition::state::RECORD_ANNOTATION,
    crate::remediation::RECORD_ANNOTATION,
];

/// Replaces `node` with what the leader's decisions read of it (see the
/// module docs), keeping the labels `labels` keeps; for the Node
/// reflector's `modify` step.
pub fn keep_decided(node: &mut Node, labels: &KeptLabels) {
    let full = std::mem::take(node);
    *node = kept_of(full, labels);
}

/// What the leader keeps of `node`, of its labels those `kept_labels` keeps.
pub fn kept_of(node: Node, kept_labels: &KeptLabels) -> Node {
    let meta = node.metadata;
    let labels = meta
        .labels
        .map(|all| {
            all.into_iter()
                .filter(|(k, _)| kept_labels.keeps(k))
                .collect::<BTreeMap<_, _>>()
        })
        .filter(|kept| !kept.is_empty());
    let annotations = meta
        .annotations
        .map(|all| {
            all.into_iter()
                .filter(|(k, _)| KEPT_ANNOTATIONS.contains(&k.as_str()))
                .collect::<BTreeMap<_, _>>()
        })
        .filter(|kept| !kept.is_empty());
    let managed_fields = meta.managed_fields.map(|entries| {
        let ours = keys_owned_by_us(&entries);
        if ours.is_empty() {
            return Vec::new();
        }
        let mut kept: Vec<_> = entries
            .into_iter()
            .filter_map(|e| metadata_ownership(e, &ours, kept_labels))
            .collect();
        // Collected in place, it still has room for all the kubelet's entries.
        kept.shrink_to_fit();
        kept
    });
    let spec = node
        .spec
        .map(|s| NodeSpec {
            unschedulable: s.unschedulable,
            taints: s.taints,
            ..NodeSpec::default()
        })
        .filter(|s| s.unschedulable.is_some() || s.taints.is_some());
    let status = node.status.map(|s| NodeStatus {
        conditions: s.conditions.map(|cs| {
            cs.into_iter()
                .map(|c| NodeCondition {
                    type_: c.type_,
                    status: c.status,
                    reason: c.reason,
                    message: c.message,
                    ..NodeCondition::default()
                })
                .collect()
        }),
        node_info: s.node_info.map(|i| NodeSystemInfo {
            boot_id: i.boot_id,
            kernel_version: i.kernel_version,
            ..NodeSystemInfo::default()
        }),
        ..NodeStatus::default()
    });
    Node {
        metadata: ObjectMeta {
            name: meta.name,
            uid: meta.uid,
            resource_version: meta.resource_version,
            labels,
            annotations,
            managed_fields: managed_fields.filter(|m| !m.is_empty()),
            ..ObjectMeta::default()
        },
        spec,
        status,
    }
}

/// The field managers the leader writes Node metadata as, deciding on the
/// cached Node (`cluster::upgrader`, `Concern::Upgrade`). A leader decision
/// that writes through another concern must add its manager here, and its
/// `plan_metadata` to the decisions of `tests/leader_node_cache.rs`.
pub const LEADER_WRITERS: [&str; 1] = [crate::api::field_manager::UPGRADE];

/// The `f:metadata` keys (`f:labels/f:<key>`, `f:annotations/f:<key>`) that
/// an entry of one of [`LEADER_WRITERS`] owns.
fn keys_owned_by_us(entries: &[ManagedFieldsEntry]) -> BTreeSet<(&'static str, String)> {
    let mut ours = BTreeSet::new();
    for entry in entries.iter().filter(|e| {
        e.manager
            .as_deref()
            .is_some_and(|m| LEADER_WRITERS.contains(&m))
    }) {
        let Some(metadata) = entry.fields_v1.as_ref().and_then(|f| f.0.get("f:metadata")) else {
            continue;
        };
        for set in ["f:labels", "f:annotations"] {
            if let Some(keys) = metadata.get(set).and_then(Value::as_object) {
                ours.extend(keys.keys().map(|k| (set, k.clone())));
            }
        }
    }
    ours
}

/// The part of one managedFields entry that says which of `ours` (kept
/// labels and annotations) its manager owns; `None` when it owns none.
fn metadata_ownership(
    entry: ManagedFieldsEntry,
    ours: &BTreeSet<(&'static str, String)>,
    kept_labels: &KeptLabels,
) -> Option<ManagedFieldsEntry> {
    let fields = entry.fields_v1?.0;
    let metadata = fields.get("f:metadata")?.as_object()?;
    let mut kept = Map::new();
    for set in ["f:labels", "f:annotations"] {
        let Some(keys) = metadata.get(set).and_then(Value::as_object) else {
            continue;
        };
        let owned: Map<String, Value> = keys
            .iter()
            .filter(|(k, _)| ours.contains(&(set, (*k).clone())))
            .filter(|(k, _)| {
                k.strip_prefix("f:").is_some_and(|key| {
                    if set == "f:labels" {
                        kept_labels.keeps(key)
                    } else {
                        KEPT_ANNOTATIONS.contains(&key)
                    }
                })
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !owned.is_empty() {
            kept.insert(set.into(), Value::Object(owned));
        }
    }
    if kept.is_empty() {
        return None;
    }
    let mut root = Map::new();
    root.insert("f:metadata".into(), Value::Object(kept));
    Some(ManagedFieldsEntry {
        manager: entry.manager,
        operation: entry.operation,
        subresource: entry.subresource,
        fields_type: entry.fields_type,
        fields_v1: Some(FieldsV1(Value::Object(root))),
        ..ManagedFieldsEntry::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operators_labels_a_decision_reads_are_kept_whatever_the_selectors() {
        let none = KeptLabels::default();
        for key in [
            crate::api::driver_upgrade::STATE_LABEL,
            crate::remediation::plan::FORCE_RESUME_LABEL,
            crate::remediation::plan::ABORT_LABEL,
            crate::remediation::plan::PAUSE_LABEL,
            crate::partition::PROFILE_LABEL,
            crate::partition::STATE_LABEL,
        ] {
            assert!(none.keeps(key), "{key}");
        }
        for key in [
            "kubernetes.io/hostname",
            "feature.node.kubernetes.io/cpu-cpuid.AVX",
            crate::detect::GPU_LABEL,
            "amd.com/gpu.product-name",
        ] {
            assert!(!none.keeps(key), "{key}");
        }
    }

    #[test]
    fn every_selector_of_a_device_config_names_kept_keys() {
        let mut dc = DeviceConfig::new("dc", crate::api::DeviceConfigSpec::default());
        dc.spec.selector = [("global".into(), "x".into())].into();
        dc.spec.dra_driver.selector = [("dra".into(), "x".into())].into();
        dc.spec.metrics_exporter.selector = [("metrics".into(), "x".into())].into();
        dc.spec.test_runner.selector = [("tests".into(), "x".into())].into();
        dc.spec.config_manager.selector = [("dcm".into(), "x".into())].into();
        let kept = KeptLabels::for_configs([&dc]);
        for key in ["global", "dra", "metrics", "tests", "dcm"] {
            assert!(kept.keeps(key), "{key}");
        }
        assert!(!kept.keeps("other"));
        let global_only = KeptLabels::for_configs([&DeviceConfig::new(
            "g",
            crate::api::DeviceConfigSpec {
                selector: [("global".into(), "y".into())].into(),
                ..Default::default()
            },
        )]);
        assert!(kept.covers(&global_only));
        assert!(!global_only.covers(&kept));
        let mut grown = global_only.clone();
        grown.extend(&kept);
        assert!(grown.covers(&kept));
    }
}
