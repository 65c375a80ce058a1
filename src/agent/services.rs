//! The node services the agent supervises, adapted to the [`Service`] interface.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::select::LabellerConfig;
use crate::api::agent_status::ServiceName;
use crate::device::Inventory;
use crate::dra::{DraConfig, DraPlugin};
use crate::events::EventSink;
use crate::labeller::{add_sharing_labels, desired_labels, label_intent};
use crate::node_writer::{Concern, NodeWriteError, NodeWriter, RETRY_AFTER_FAILURE};
use crate::plugin::{DevicePluginService, HealthReport, PluginConfig, PluginStatus};
use crate::service::{Readiness, Service, ServiceError, ServiceFuture};

/// Keeps the Node's GPU labels equal to what the inventory says.
pub struct LabellerService {
    pub writer: NodeWriter,
    pub inventory: watch::Receiver<Arc<Inventory>>,
    pub node: watch::Receiver<Option<Arc<Node>>>,
}

impl Service for LabellerService {
    type Config = LabellerConfig;

    fn name(&self) -> &'static str {
        ServiceName::Labeller.as_str()
    }

    /// Available once the Node carries the labels the inventory calls for. A
    /// write that fails (after the writer's retries) makes it unavailable,
    /// with the reason, and is tried again after [`RETRY_AFTER_FAILURE`] or on
    /// the next change; the service itself keeps running.
    fn run(
        self: Arc<Self>,
        mut config: watch::Receiver<LabellerConfig>,
        cancel: CancellationToken,
        readiness: Readiness,
    ) -> ServiceFuture {
        Box::pin(async move {
            let mut inventory = self.inventory.clone();
            let mut node = self.node.clone();
            // A feed whose follower ended is not waited on again: its
            // `changed()` would return at once, forever.
            let (mut inventory_open, mut node_open) = (true, true);
            loop {
                let LabellerConfig { kinds, sharing } = config.borrow_and_update().clone();
                let mut desired = desired_labels(&inventory.borrow_and_update(), &kinds);
                if let Some(sharing) = &sharing {
                    add_sharing_labels(&mut desired, sharing);
                }
                let watched = node.borrow_and_update().clone();
                let mut failed = false;
                match watched {
                    Some(current) => {
                        // Decided on the watched copy (it carries managedFields):
                        // no read per Node change. A copy that predates our
                        // last write only repeats an apply the server finds
                        // already done.
                        let intent = label_intent(desired, current.annotations());
                        match self
                            .writer
                            .apply_to(&current, Concern::Labeller, &intent)
                            .await
                        {
                            Ok(_) => readiness.available(),
                            Err(e) => {
                                tracing::warn!(error = %e, "cannot write the GPU labels; will retry");
                                readiness.unavailable(format!("cannot write the GPU labels: {e}"));
                                failed = true;
                            }
                        }
                    }
                    None => readiness.unavailable("waiting to see this agent's Node"),
                }
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(()),
                    changed = inventory.changed(), if inventory_open => inventory_open = changed.is_ok(),
                    changed = node.changed(), if node_open => node_open = changed.is_ok(),
                    _ = config.changed() => {}
                    _ = tokio::time::sleep(RETRY_AFTER_FAILURE), if failed => {}
                }
            }
        })
    }
}

/// Removes every GPU label the labeller wrote (it was disabled, or the node
/// deselected).
pub async fn remove_labels(writer: &NodeWriter, node: &Node) -> Result<(), NodeWriteError> {
    let intent = label_intent(BTreeMap::new(), node.annotations());
    writer.apply(Concern::Labeller, &intent).await.map(drop)
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

/// Runs the DRA kubelet plugin.
pub struct DraService {
    pub inventory: watch::Receiver<Arc<Inventory>>,
    pub health: watch::Receiver<HealthReport>,
    pub client: kube::Client,
    /// Where a refused slice or registration is recorded.
    pub events: EventSink,
}

impl Service for DraService {
    type Config = DraConfig;

    fn name(&self) -> &'static str {
        ServiceName::DraDriver.as_str()
    }

    /// Available while the kubelet has registered the plugin and this node's
    /// ResourceSlices are published. A changed configuration restarts the
    /// plugin: its sockets and directories may have moved.
    fn run(
        self: Arc<Self>,
        mut config: watch::Receiver<DraConfig>,
        cancel: CancellationToken,
        readiness: Readiness,
    ) -> ServiceFuture {
        Box::pin(async move {
            let mut plugin = DraPlugin::start(
                config.borrow_and_update().clone(),
                self.inventory.clone(),
                self.health.clone(),
                self.client.clone(),
                self.events.clone(),
            );
            let mut status = plugin.status();
            let result = loop {
                let current = status.borrow_and_update().clone();
                match current.unavailable_reason() {
                    None => readiness.available(),
                    Some(reason) => readiness.unavailable(reason),
                }
                if !current.running {
                    break Err(ServiceError::new("the DRA plugin stopped unexpectedly"));
                }
                tokio::select! {
                    _ = cancel.cancelled() => break Ok(()),
                    changed = config.changed() => {
                        if changed.is_err() {
                            break Ok(());
                        }
                        plugin.stop().await;
                        plugin = DraPlugin::start(
                            config.borrow_and_update().clone(),
                            self.inventory.clone(),
                            self.health.clone(),
                            self.client.clone(),
                            self.events.clone(),
                        );
                        status = plugin.status();
                    }
                    changed = status.changed() => {
                        if changed.is_err() {
                            break Err(ServiceError::new("the DRA plugin stopped unexpectedly"));
                        }
                    }
                }
            };
            plugin.stop().await;
            result
        })
    }
}
