//! Writing health to the Node: the `AMDGPUUnhealthy` condition through the
//! `status` subresource and the reference's health labels, each only when it
//! changes, and Events on transitions (through the agent's [`EventSink`]).
//!
//! Both go through the Node writer ([`crate::node_writer`]) under the health
//! monitor's own field manager: the condition is applied to the `status`
//! subresource by type, so the kubelet's own conditions are never touched, and
//! the labels are the monitor's alone (the reference exporter's labels of the
//! same form are handed over). The decisions are [`super::outputs`]'s. The
//! agent runs [`NodeHealthPublisher`] as a supervised service beside the
//! monitor; it decides on the agent's watched Node, so that a snapshot costs
//! no read.

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
use crate::service::{Readiness, Service, ServiceFuture};

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
    apply_node_health_to(&writer, &node, snapshot).await
}

/// As [`apply_node_health`], decided on `node` as watched (no read): a copy
/// that predates a write only repeats an apply, and the next copy corrects
/// a decision made on a stale one.
pub async fn apply_node_health_to(
    writer: &NodeWriter,
    node: &Node,
    snapshot: &HealthSnapshot,
) -> Result<NodeHealthWrite, NodeHealthError> {
    let node_name = writer.name();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    // A condition that says the same keeps its times: no write for a heartbeat.
    let condition = condition_to_apply(node, node_condition(snapshot, &now));
    let status = writer
        .apply_status_to(
            node,
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
        .apply_to(node, Concern::Health, &label_intent(node, snapshot))
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

/// Keeps the Node's `AMDGPUUnhealthy` condition and health labels in line
/// with the monitor, deciding on the agent's watched Node (no read per
/// snapshot), and records an Event for each transition. The config is how
/// long a failed write waits before it is tried again.
pub struct NodeHealthPublisher {
    pub writer: NodeWriter,
    /// The agent's own Node as watched.
    pub node: watch::Receiver<Option<Arc<Node>>>,
    pub snapshots: watch::Receiver<Arc<HealthSnapshot>>,
    /// Kept only to subscribe from, once a run.
    pub transitions: broadcast::Receiver<HealthTransition>,
    pub events: EventSink,
}

/// The publisher's name in logs.
pub const NODE_HEALTH_PUBLISHER: &str = "node-health-publisher";

impl Service for NodeHealthPublisher {
    type Config = Duration;

    fn name(&self) -> &'static str {
        NODE_HEALTH_PUBLISHER
    }

    /// Available once the Node shows the latest snapshot. Looks again at
    /// each snapshot and each change of the watched Node (which writes only
    /// where the Node differs); a failed write is tried again after the
    /// configured delay.
    fn run(
        self: Arc<Self>,
        mut retry: watch::Receiver<Duration>,
        cancel: CancellationToken,
        readiness: Readiness,
    ) -> ServiceFuture {
        Box::pin(async move {
            let mut snapshots = self.snapshots.clone();
            let mut node = self.node.clone();
            let mut transitions = self.transitions.resubscribe();
            // A Node feed that closed (its follower ended) keeps its last
            // copy and is not waited on again.
            let mut node_open = true;
            let mut pending = true;
            loop {
                let mut failed = false;
                if pending {
                    let snapshot = snapshots.borrow_and_update().clone();
                    let watched = node.borrow_and_update().clone();
                    match watched {
                        Some(current) => {
                            match apply_node_health_to(&self.writer, &current, &snapshot).await {
                                Ok(_) => {
                                    pending = false;
                                    readiness.available();
                                }
                                Err(e) => {
                                    tracing::warn!(error = %e, "cannot write GPU health to the Node; will retry");
                                    readiness.unavailable(format!(
                                        "cannot write GPU health to the Node: {e}"
                                    ));
                                    failed = true;
                                }
                            }
                        }
                        None => readiness.unavailable("waiting to see this agent's Node"),
                    }
                }
                let delay = *retry.borrow_and_update();
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(()),
                    changed = snapshots.changed() => {
                        if changed.is_err() {
                            return Ok(());
                        }
                        pending = true;
                    }
                    changed = node.changed(), if node_open => {
                        node_open = changed.is_ok();
                        pending = true;
                    }
                    changed = retry.changed() => if changed.is_err() { return Ok(()) },
                    t = transitions.recv() => match t {
                        Ok(t) => self.events.record(transition_event(&t)).await,
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            tracing::warn!(missed = n, "GPU health Events dropped: too many transitions at once");
                        }
                        Err(broadcast::error::RecvError::Closed) => return Ok(()),
                    },
                    _ = tokio::time::sleep(delay), if failed => {}
                }
            }
        })
    }
}
