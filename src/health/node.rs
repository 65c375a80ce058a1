//! Writing health to the Node: the `AMDGPUUnhealthy` condition through the
//! `status` subresource and the reference's health labels, each only when it
//! changes, and Events on transitions.
//!
//! The condition is a strategic merge patch keyed by condition type, so the
//! kubelet's own conditions are never touched; labels are a merge patch that
//! sets and removes only `metricsexporter.amd.com.gpu.<id>.state` keys. The
//! decisions are [`super::outputs`]'s.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Patch;
use kube::runtime::events::Recorder;
use kube::{Api, Resource, ResourceExt};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::outputs::{
    CONDITION_TYPE, condition_differs, find_condition, health_labels, label_patch, merge_condition,
    node_condition, transition_event,
};
use super::{HealthSnapshot, HealthTransition};
use crate::api::field_manager;

#[derive(Debug, thiserror::Error)]
pub enum NodeHealthError {
    #[error("reading Node {node}: {source}")]
    Get {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing the {what} of Node {node}: {source}")]
    Patch {
        node: String,
        what: &'static str,
        #[source]
        source: kube::Error,
    },
}

/// What [`apply_node_health`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeHealthWrite {
    pub condition: bool,
    pub labels: bool,
}

/// Makes the Node's condition and health labels match `snapshot`, writing only
/// what differs.
pub async fn apply_node_health(
    nodes: &Api<Node>,
    node_name: &str,
    snapshot: &HealthSnapshot,
) -> Result<NodeHealthWrite, NodeHealthError> {
    let node = get_node(nodes, node_name).await?;
    apply_to(nodes, &node, snapshot).await
}

async fn apply_to(
    nodes: &Api<Node>,
    node: &Node,
    snapshot: &HealthSnapshot,
) -> Result<NodeHealthWrite, NodeHealthError> {
    let name = node.name_any();
    let params = field_manager::patch(field_manager::HEALTH);
    let mut wrote = NodeHealthWrite::default();
    let existing = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .and_then(find_condition);
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let desired = node_condition(snapshot, &now);
    if condition_differs(existing, &desired) {
        let condition = merge_condition(existing, desired);
        let patch = serde_json::json!({ "status": { "conditions": [condition] } });
        nodes
            .patch_status(&name, &params, &Patch::Strategic(patch))
            .await
            .map_err(|source| NodeHealthError::Patch {
                node: name.clone(),
                what: "AMDGPUUnhealthy condition",
                source,
            })?;
        tracing::info!(node = %name, status = %condition.status, "updated the AMDGPUUnhealthy condition");
        wrote.condition = true;
    }
    if let Some(patch) = label_patch(node.labels(), &health_labels(snapshot)) {
        nodes
            .patch(&name, &params, &Patch::Merge(patch))
            .await
            .map_err(|source| NodeHealthError::Patch {
                node: name.clone(),
                what: "GPU health labels",
                source,
            })?;
        tracing::info!(node = %name, "updated the GPU health labels");
        wrote.labels = true;
    }
    Ok(wrote)
}

/// Removes what the monitor wrote on the Node: the health labels and the
/// `AMDGPUUnhealthy` condition itself (not just set to False). For teardown, when
/// no DeviceConfig asks for health on this node any more.
pub async fn remove_node_health(nodes: &Api<Node>, node_name: &str) -> Result<(), NodeHealthError> {
    let node = get_node(nodes, node_name).await?;
    let params = field_manager::patch(field_manager::HEALTH);
    if let Some(patch) = label_patch(node.labels(), &health_labels(&HealthSnapshot::default())) {
        nodes
            .patch(node_name, &params, &Patch::Merge(patch))
            .await
            .map_err(|source| NodeHealthError::Patch {
                node: node_name.to_owned(),
                what: "GPU health labels",
                source,
            })?;
    }
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    if let Some(index) = conditions.iter().position(|c| c.type_ == CONDITION_TYPE) {
        // Guarded by a test of the type at that index, so a concurrent change
        // to the list fails the patch instead of removing someone else's entry.
        let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
            {"op": "test", "path": format!("/status/conditions/{index}/type"), "value": CONDITION_TYPE},
            {"op": "remove", "path": format!("/status/conditions/{index}")},
        ]))
        .map_err(|e| NodeHealthError::Patch {
            node: node_name.to_owned(),
            what: "AMDGPUUnhealthy condition",
            source: kube::Error::SerdeError(e),
        })?;
        nodes
            .patch_status(node_name, &params, &Patch::Json::<()>(patch))
            .await
            .map_err(|source| NodeHealthError::Patch {
                node: node_name.to_owned(),
                what: "AMDGPUUnhealthy condition",
                source,
            })?;
        tracing::info!(node = %node_name, "removed the AMDGPUUnhealthy condition");
    }
    Ok(())
}

/// Keeps the Node in line with the monitor until `cancel` fires: applies each
/// new snapshot (retrying failed writes every `retry`), and records an Event for
/// each transition when a recorder is given. For the agent to spawn next to the
/// [`super::HealthMonitor`].
pub async fn publish_node_health(
    nodes: Api<Node>,
    node_name: String,
    mut snapshots: watch::Receiver<Arc<HealthSnapshot>>,
    mut transitions: broadcast::Receiver<HealthTransition>,
    recorder: Option<Recorder>,
    retry: Duration,
    cancel: CancellationToken,
) {
    let mut pending = true;
    loop {
        if pending {
            let snapshot = snapshots.borrow_and_update().clone();
            match apply_node_health(&nodes, &node_name, &snapshot).await {
                Ok(_) => pending = false,
                Err(e) => {
                    crate::counters::record_api_error();
                    tracing::warn!(error = %e, "cannot write GPU health to the Node; will retry")
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = snapshots.changed() => {
                if changed.is_err() {
                    return;
                }
                pending = true;
            }
            t = transitions.recv() => match t {
                Ok(t) => {
                    if let Some(recorder) = &recorder {
                        let reference = Node {
                            metadata: kube::api::ObjectMeta {
                                name: Some(node_name.clone()),
                                ..Default::default()
                            },
                            ..Default::default()
                        }
                        .object_ref(&());
                        if let Err(e) = recorder.publish(&transition_event(&t), &reference).await {
                            crate::counters::record_api_error();
                            tracing::warn!(error = %e, "cannot record a GPU health Event");
                        }
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "GPU health Events dropped: too many transitions at once");
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = tokio::time::sleep(retry), if pending => {}
        }
    }
}

/// Reads the Node, naming it in the error.
async fn get_node(nodes: &Api<Node>, node_name: &str) -> Result<Node, NodeHealthError> {
    nodes
        .get(node_name)
        .await
        .map_err(|source| NodeHealthError::Get {
            node: node_name.to_owned(),
            source,
        })
}
