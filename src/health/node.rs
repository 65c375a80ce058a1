//! Writing health to the Node: the `AMDGPUUnhealthy` condition through the
//! `status` subresource and the reference's health labels, each only when it
//! changes, and Events on transitions (through the agent's [`EventSink`]).
//!
//! Both go through the Node writer ([`crate::node_writer`]) under the health
//! monitor's own field manager: the condition is applied to the `status`
//! subresource by type, so the kubelet's own conditions are never touched, and
//! the labels are the monitor's alone (the reference exporter's labels of the
//! same form are handed over). The decisions are [`super::outputs`]'s.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Api, ResourceExt};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::outputs::{health_labels, is_health_label, node_condition, transition_event};
use super::{HealthSnapshot, HealthTransition};
use crate::events::EventSink;
use crate::node_writer::{
    Concern, NodeIntent, NodeWriteError, NodeWriter, StatusIntent, Written, condition_to_apply,
};

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct NodeHealthError(#[from] NodeWriteError);

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
    let writer = NodeWriter::new(nodes.clone(), node_name);
    let node = writer.read().await?;
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    // A condition that says the same keeps its times: no write for a heartbeat.
    let condition = condition_to_apply(&node, node_condition(snapshot, &now));
    let status = writer
        .apply_status_to(
            &node,
            Concern::Health,
            &StatusIntent {
                conditions: vec![condition.clone()],
            },
        )
        .await?;
    if status.applied {
        tracing::info!(node = %node_name, status = %condition.status, "updated the AMDGPUUnhealthy condition");
    }
    let labels = writer
        .apply_to(&node, Concern::Health, &label_intent(&node, snapshot))
        .await?;
    if labels != Written::default() {
        tracing::info!(node = %node_name, "updated the GPU health labels");
    }
    Ok(NodeHealthWrite {
        condition: status != Written::default(),
        labels: labels != Written::default(),
    })
}

/// The health labels `snapshot` calls for. Labels of the same form already on
/// the Node are handed over: the reference's exporter, which this monitor
/// replaces, writes them too, and a stale one must not outlive the migration.
fn label_intent(node: &Node, snapshot: &HealthSnapshot) -> NodeIntent {
    NodeIntent {
        labels: health_labels(snapshot),
        retired_labels: node
            .labels()
            .keys()
            .filter(|k| is_health_label(k))
            .cloned()
            .collect(),
        ..NodeIntent::default()
    }
}

/// Removes what the monitor wrote on the Node: the health labels and the
/// `AMDGPUUnhealthy` condition itself (not just set to False). For teardown, when
/// no DeviceConfig asks for health on this node any more.
pub async fn remove_node_health(nodes: &Api<Node>, node_name: &str) -> Result<(), NodeHealthError> {
    let writer = NodeWriter::new(nodes.clone(), node_name);
    let node = writer.read().await?;
    writer
        .apply_to(
            &node,
            Concern::Health,
            &label_intent(&node, &HealthSnapshot::default()),
        )
        .await?;
    let removed = writer
        .apply_status_to(&node, Concern::Health, &StatusIntent::default())
        .await?;
    if removed != Written::default() {
        tracing::info!(node = %node_name, "removed the AMDGPUUnhealthy condition");
    }
    Ok(())
}

/// Keeps the Node in line with the monitor until `cancel` fires: applies each
/// new snapshot (retrying failed writes every `retry`), and records an Event
/// for each transition in `events`. For the agent to spawn next to the
/// [`super::HealthMonitor`].
pub async fn publish_node_health(
    nodes: Api<Node>,
    node_name: String,
    mut snapshots: watch::Receiver<Arc<HealthSnapshot>>,
    mut transitions: broadcast::Receiver<HealthTransition>,
    events: EventSink,
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
                Ok(t) => events.record(transition_event(&t)).await,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "GPU health Events dropped: too many transitions at once");
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = tokio::time::sleep(retry), if pending => {}
        }
    }
}
