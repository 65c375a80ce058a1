//! The set of node services, one slot each, shared by the Kubernetes agent and
//! standalone mode: device plugin, node labeller (Kubernetes only), health
//! monitor, metrics exporter and test runner. It wires their feeds together —
//! health into the device plugin and the exporter, unhealthy transitions into
//! the test runner — so that the two modes cannot drift apart.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::task::AbortOnDropHandle;

use super::select::DesiredServices;
use super::services::{LabellerService, PluginService};
use crate::api::agent_status::{ServiceName, ServiceStatus};
use crate::device::Inventory;
use crate::health::{HealthMonitor, HealthSnapshot, HealthTransition};
use crate::metrics::{ExporterStatus, MetricsService};
use crate::plugin::PluginStatus;
use crate::service::{ServiceState, Slot, SlotChange};
use crate::testrunner::{GpuUnhealthy, TestRunnerService, TestRunnerStats};

pub struct NodeServices {
    pub plugin: Slot<PluginService>,
    pub labeller: Option<Slot<LabellerService>>,
    pub health: Slot<HealthMonitor>,
    pub metrics: Slot<MetricsService>,
    pub test_runner: Slot<TestRunnerService>,
    pub plugin_status: watch::Receiver<PluginStatus>,
    pub exporter_status: watch::Receiver<ExporterStatus>,
    pub health_snapshot: watch::Receiver<Arc<HealthSnapshot>>,
    pub test_stats: watch::Receiver<TestRunnerStats>,
    transitions: broadcast::Sender<HealthTransition>,
    _forward: AbortOnDropHandle<()>,
}

/// The Kubernetes side of the node services: the client, the Node API and the
/// agent's own Node as watched.
pub type KubeSide = (kube::Client, Api<Node>, watch::Receiver<Option<Arc<Node>>>);

/// What changed when desired services were applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// The labeller was stopped: its labels should be removed.
    pub labeller_stopped: bool,
    /// The health monitor was stopped: its Node condition and labels should be cleared.
    pub health_stopped: bool,
}

impl NodeServices {
    /// `kube` is the Kubernetes side (client, Node API and the agent's own Node
    /// feed); `None` in standalone mode, where nothing writes to a Node.
    pub fn new(inventory: watch::Receiver<Arc<Inventory>>, kube: Option<KubeSide>) -> Self {
        let monitor = HealthMonitor::new(inventory.clone());
        let health_snapshot = monitor.snapshot();
        let (plugin_status_tx, plugin_status) = watch::channel(PluginStatus::default());
        let plugin = Slot::new(PluginService {
            inventory: inventory.clone(),
            health: monitor.report(),
            status: plugin_status_tx,
        });

        // Unhealthy transitions start AUTO_UNHEALTHY_GPU_WATCH test runs.
        let (unhealthy_tx, unhealthy_rx) = mpsc::channel(64);
        let (transitions, _) = broadcast::channel(64);
        let forward = tokio::spawn(forward_unhealthy(
            monitor.subscribe(),
            unhealthy_tx,
            transitions.clone(),
        ));

        let (client, nodes, node) = match kube {
            Some((client, nodes, node)) => (Some(client), Some(nodes), node),
            None => (None, None, watch::channel(None).1),
        };
        let test_runner =
            TestRunnerService::new(client, inventory.clone(), node.clone(), unhealthy_rx);
        let test_stats = test_runner.stats();
        let exporter = MetricsService::new(inventory.clone(), Some(health_snapshot.clone()))
            .with_test_stats(test_stats.clone());
        let exporter_status = exporter.status();
        let labeller = nodes.map(|nodes| {
            Slot::new(LabellerService {
                nodes,
                inventory,
                node,
            })
        });
        Self {
            plugin,
            labeller,
            health: Slot::new(monitor),
            metrics: Slot::new(exporter),
            test_runner: Slot::new(test_runner),
            plugin_status,
            exporter_status,
            health_snapshot,
            test_stats,
            transitions,
            _forward: AbortOnDropHandle::new(forward),
        }
    }

    /// Health transitions, re-broadcast for the Node publisher and the event log.
    pub fn transitions(&self) -> broadcast::Receiver<HealthTransition> {
        self.transitions.subscribe()
    }

    pub async fn apply(&mut self, desired: DesiredServices) -> Applied {
        let mut applied = Applied::default();
        self.plugin.apply(desired.device_plugin).await;
        if let Some(labeller) = self.labeller.as_mut() {
            applied.labeller_stopped =
                labeller.apply(desired.labeller).await == SlotChange::Stopped;
        }
        applied.health_stopped = self.health.apply(desired.health).await == SlotChange::Stopped;
        self.metrics.apply(desired.metrics).await;
        self.test_runner.apply(desired.test_runner).await;
        applied
    }

    /// Each running service's state, for the status annotation.
    pub fn states(&self) -> BTreeMap<ServiceName, ServiceStatus> {
        let mut states = vec![
            (ServiceName::DevicePlugin, self.plugin.state()),
            (ServiceName::HealthMonitor, self.health.state()),
            (ServiceName::MetricsExporter, self.metrics.state()),
            (ServiceName::TestRunner, self.test_runner.state()),
        ];
        if let Some(labeller) = &self.labeller {
            states.push((ServiceName::Labeller, labeller.state()));
        }
        states
            .into_iter()
            .filter_map(|(name, state)| annotation_state(&state).map(|s| (name, s)))
            .collect()
    }

    /// One receiver per slot, to wake a loop on any state change.
    pub fn state_changes(&self) -> Vec<watch::Receiver<ServiceState>> {
        let mut all = vec![
            self.plugin.subscribe(),
            self.health.subscribe(),
            self.metrics.subscribe(),
            self.test_runner.subscribe(),
        ];
        if let Some(labeller) = &self.labeller {
            all.push(labeller.subscribe());
        }
        all
    }

    /// Stops everything at once (each within a few seconds).
    pub async fn stop(&mut self) {
        let labeller = async {
            if let Some(labeller) = self.labeller.as_mut() {
                labeller.stop().await;
            }
        };
        tokio::join!(
            self.plugin.stop(),
            self.health.stop(),
            self.metrics.stop(),
            self.test_runner.stop(),
            labeller
        );
    }
}

/// The annotation form of a slot state; `None` for a stopped service.
pub fn annotation_state(state: &ServiceState) -> Option<ServiceStatus> {
    match state {
        ServiceState::Running => Some(ServiceStatus::Running),
        ServiceState::Unavailable { reason } => Some(ServiceStatus::Unavailable {
            reason: reason.clone(),
        }),
        ServiceState::Restarting { error, restarts } => Some(ServiceStatus::Restarting {
            error: error.clone(),
            restarts: *restarts,
        }),
        ServiceState::Finished => Some(ServiceStatus::Finished),
        ServiceState::Stopped => None,
    }
}

async fn forward_unhealthy(
    mut transitions: broadcast::Receiver<HealthTransition>,
    unhealthy: mpsc::Sender<GpuUnhealthy>,
    rebroadcast: broadcast::Sender<HealthTransition>,
) {
    loop {
        match transitions.recv().await {
            Ok(t) => {
                let _ = rebroadcast.send(t.clone());
                if !t.healthy {
                    let gpu = GpuUnhealthy {
                        bdf: t.bdf,
                        reasons: t.reasons,
                    };
                    if unhealthy.send(gpu).await.is_err() {
                        return;
                    }
                }
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "health transitions were dropped");
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Waits until any of `changes` changes (all of them closed: waits forever).
pub async fn any_changed(changes: &mut [watch::Receiver<ServiceState>]) {
    let waits = changes.iter_mut().map(|rx| Box::pin(rx.changed()));
    let (result, _, _) = futures::future::select_all(waits).await;
    if result.is_err() {
        std::future::pending::<()>().await;
    }
}
