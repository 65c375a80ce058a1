//! The node services the agent supervises, adapted to the [`Service`] interface.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::api::Patch;
use kube::{Api, ResourceExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::select::LabellerConfig;
use crate::api::agent_status::ServiceName;
use crate::api::field_manager;
use crate::device::Inventory;
use crate::labeller::{desired_labels, plan_labels};
use crate::plugin::{DevicePluginService, HealthReport, PluginConfig, PluginStatus};
use crate::service::{Readiness, Service, ServiceError, ServiceFuture};

/// Keeps the Node's GPU labels equal to what the inventory says.
pub struct LabellerService {
    pub nodes: Api<Node>,
    pub inventory: watch::Receiver<Arc<Inventory>>,
    pub node: watch::Receiver<Option<Arc<Node>>>,
}

impl Service for LabellerService {
    type Config = LabellerConfig;

    fn name(&self) -> &'static str {
        ServiceName::Labeller.as_str()
    }

    /// Available once the Node carries the labels the inventory calls for.
    fn run(
        self: Arc<Self>,
        mut config: watch::Receiver<LabellerConfig>,
        cancel: CancellationToken,
        readiness: Readiness,
    ) -> ServiceFuture {
        Box::pin(async move {
            let mut inventory = self.inventory.clone();
            let mut node = self.node.clone();
            // The Node as last returned by our own patch: newer than the watch's
            // copy until the watch catches up, so one change is never written twice.
            let mut patched: Option<Arc<Node>> = None;
            loop {
                let kinds = config.borrow_and_update().kinds.clone();
                let desired = desired_labels(&inventory.borrow_and_update(), &kinds);
                let watched = node.borrow_and_update().clone();
                match newest(watched, patched.clone()) {
                    Some(current) => {
                        if let Some(updated) = sync_labels(&self.nodes, &current, &desired).await? {
                            patched = Some(Arc::new(updated));
                        }
                        readiness.available();
                    }
                    None => readiness.unavailable("waiting to see this agent's Node"),
                }
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(()),
                    _ = inventory.changed() => {}
                    _ = node.changed() => {}
                    _ = config.changed() => {}
                }
            }
        })
    }
}

/// The newer of two copies of the Node, by resourceVersion.
fn newest(watched: Option<Arc<Node>>, patched: Option<Arc<Node>>) -> Option<Arc<Node>> {
    let version = |n: &Node| {
        n.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
    };
    match (watched, patched) {
        (Some(w), Some(p)) => match (version(&w), version(&p)) {
            (Some(wv), Some(pv)) if pv > wv => Some(p),
            _ => Some(w),
        },
        (w, p) => w.or(p),
    }
}

/// Patches the Node so that the labels the agent owns are exactly `desired`.
/// Returns the updated Node, or `None` when nothing had to change.
pub async fn sync_labels(
    nodes: &Api<Node>,
    node: &Node,
    desired: &BTreeMap<String, String>,
) -> Result<Option<Node>, ServiceError> {
    let Some(patch) = plan_labels(node.labels(), node.annotations(), desired) else {
        return Ok(None);
    };
    tracing::info!(
        node = %node.name_any(),
        set = patch.set.len(),
        removed = patch.remove.len(),
        "updating GPU labels"
    );
    nodes
        .patch(
            &node.name_any(),
            &field_manager::patch(field_manager::AGENT),
            &Patch::Merge(patch.to_merge_patch()),
        )
        .await
        .map(Some)
        .map_err(|e| ServiceError::new(format!("patching labels of {}: {e}", node.name_any())))
}

/// Runs the kubelet device plugin and forwards its status to the agent.
pub struct PluginService {
    pub inventory: watch::Receiver<Arc<Inventory>>,
    pub health: watch::Receiver<HealthReport>,
    pub status: watch::Sender<PluginStatus>,
}

impl Service for PluginService {
    type Config = PluginConfig;

    fn name(&self) -> &'static str {
        ServiceName::DevicePlugin.as_str()
    }

    /// Available while the kubelet has accepted every resource it serves.
    fn run(
        self: Arc<Self>,
        mut config: watch::Receiver<PluginConfig>,
        cancel: CancellationToken,
        readiness: Readiness,
    ) -> ServiceFuture {
        Box::pin(async move {
            let plugin = DevicePluginService::start(
                config.borrow_and_update().clone(),
                self.inventory.clone(),
                self.health.clone(),
            );
            let mut status = plugin.status();
            let result = loop {
                let current = status.borrow_and_update().clone();
                let running = current.running;
                match current.unavailable_reason() {
                    None => readiness.available(),
                    Some(reason) => readiness.unavailable(reason),
                }
                self.status.send_replace(current);
                if !running {
                    break Err(ServiceError::new("the device plugin stopped unexpectedly"));
                }
                tokio::select! {
                    _ = cancel.cancelled() => break Ok(()),
                    changed = config.changed() => {
                        if changed.is_err() {
                            break Ok(());
                        }
                        let next = config.borrow_and_update().clone();
                        if plugin.reconfigure(next).await.is_err() {
                            break Err(ServiceError::new("the device plugin stopped unexpectedly"));
                        }
                    }
                    changed = status.changed() => {
                        if changed.is_err() {
                            break Err(ServiceError::new("the device plugin stopped unexpectedly"));
                        }
                    }
                }
            };
            plugin.stop().await;
            self.status.send_replace(PluginStatus::default());
            result
        })
    }
}
