//! The set of node services, one slot each, shared by the Kubernetes agent and
//! standalone mode: device plugin, node labeller (Kubernetes only), health
//! monitor, metrics exporter, the reference exporter's health socket and test
//! runner. It wires their feeds together — health into the device plugin, the
//! exporter and the health socket, the exporter's pods into the health
//! socket, unhealthy transitions into the test runner — so that the two
//! modes cannot drift apart.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::task::AbortOnDropHandle;

use super::select::DesiredServices;
use super::services::{DraService, LabellerService, PluginService};
use crate::api::agent_status::{ServiceName, ServiceStatus};
use crate::device::Inventory;
use crate::device::watch::ScanState;
use crate::events::EventSink;
use crate::health::{HealthMonitor, HealthSnapshot, HealthTransition};
use crate::metrics::server::Published;
use crate::metrics::{ExporterStatus, MetricsService};
use crate::metricssvc::HealthSocket;
use crate::node_writer::NodeWriter;
use crate::plugin::PluginStatus;
use crate::service::{ServiceState, Slot, SlotChange};
use crate::testrunner::stats::LastRun;
use crate::testrunner::{GpuUnhealthy, TestRunnerService};

pub struct NodeServices {
    pub plugin: Slot<PluginService>,
    pub labeller: Option<Slot<LabellerService>>,
    /// The DRA plugin; only with the Kubernetes side (claims and slices live
    /// in the API).
    pub dra: Option<Slot<DraService>>,
    pub health: Slot<HealthMonitor>,
    pub metrics: Slot<MetricsService>,
    /// The reference exporter's health socket, for AMD's device plugin.
    pub health_socket: Slot<HealthSocket>,
    pub test_runner: Slot<TestRunnerService>,
    pub plugin_status: watch::Receiver<PluginStatus>,
    pub exporter_status: watch::Receiver<ExporterStatus>,
    /// What the metrics endpoints serve, for in-process readers.
    pub metrics_published: watch::Receiver<Arc<Published>>,
    pub health_snapshot: watch::Receiver<Arc<HealthSnapshot>>,
    /// The GPU locks the test runner takes before each test case; whoever
    /// else runs tests on the node's GPUs takes them too.
    pub gpu_locks: crate::testrunner::GpuLocks,
    transitions: broadcast::Sender<HealthTransition>,
    /// Each finished test case, for standalone mode's event log (kept only to
    /// subscribe from).
    test_results: broadcast::Receiver<LastRun>,
    /// The discovery watch's progress, reduced to what changes what runs.
    discovery: watch::Receiver<DiscoveryProgress>,
    /// Services the last `apply` wanted but held back until discovery.
    held_back: Vec<ServiceName>,
    /// The last `apply` asked for DRA where it cannot run (no Kubernetes
    /// API: standalone mode).
    dra_unserved: bool,
    _forward: AbortOnDropHandle<()>,
    _forward_discovery: AbortOnDropHandle<()>,
}

/// What the agent loops need to know of the discovery watch: whether the host
/// has been seen whole once, and why the latest scan was not trusted. Unlike
/// [`ScanState`] it does not change on every scan, so a loop that wakes on it
/// wakes only when something it shows changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiscoveryProgress {
    pub discovered: bool,
    pub last_incomplete: Option<String>,
}

/// Why a held-back service is not available yet.
pub const DISCOVERING: &str = "waiting for the first complete GPU discovery";

/// Why DRA does not run in standalone mode.
pub const DRA_UNSERVED: &str = "draDriver is enabled, but DRA needs a Kubernetes API server and scheduler: not served in standalone mode";

/// The Kubernetes side of the node services.
pub struct KubeSide {
    pub client: kube::Client,
    /// Every write to the agent's own Node goes through it.
    pub writer: NodeWriter,
    /// The agent's own Node as watched.
    pub node: watch::Receiver<Option<Arc<Node>>>,
    /// Where the services' Events go.
    pub events: EventSink,
}

/// What changed when desired services were applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// The labeller was stopped: its labels should be removed.
    pub labeller_stopped: bool,
    /// The health monitor was stopped: its Node condition and labels should be cleared.
    pub health_stopped: bool,
}

impl NodeServices {
    /// `kube` is the Kubernetes side (client, Node writer, the agent's own Node
    /// feed and the Event sink); `None` in standalone mode, where nothing
    /// writes to a Node and the loop records Events from what the services
    /// hand over ([`Self::transitions`], [`Self::test_results`]).
    ///
    /// Until `scan` says the host was seen whole, only the metrics endpoint runs
    /// (serving `/healthz`, with `/readyz` answering `discovering`): every other
    /// service would act on an empty inventory, e.g. register no GPUs with the
    /// kubelet or remove the GPU labels.
    pub fn new(
        inventory: watch::Receiver<Arc<Inventory>>,
        scan: watch::Receiver<ScanState>,
        kube: Option<KubeSide>,
    ) -> Self {
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

        let dra = kube.as_ref().map(|k| {
            Slot::new(DraService {
                inventory: inventory.clone(),
                health: monitor.report(),
                client: k.client.clone(),
                events: k.events.clone(),
            })
        });
        let (client, nodes, node, events) = match kube {
            Some(KubeSide {
                client,
                writer,
                node,
                events,
            }) => (Some(client), Some(writer), node, Some(events)),
            None => (None, None, watch::channel(None).1, None),
        };
        // The exporter asks the API server for the metadata of this node's
        // pods (POD_UUID, ExtraPodLabels) only when its config wants them.
        let pod_metadata_client = client.clone();
        let test_runner = TestRunnerService::new(
            client,
            events,
            inventory.clone(),
            node.clone(),
            unhealthy_rx,
        );
        let test_stats = test_runner.stats();
        let test_results = test_runner.results();
        let gpu_locks = test_runner.gpu_locks();
        let mut exporter = MetricsService::new(inventory.clone(), Some(health_snapshot.clone()))
            .with_test_stats(test_stats)
            .with_discovery(scan.clone());
        if let Some(client) = pod_metadata_client {
            exporter = exporter.with_kube(client);
        }
        let (discovery_tx, discovery) = watch::channel(progress_of(&scan.borrow()));
        let forward_discovery = tokio::spawn(forward_progress(scan, discovery_tx));
        let exporter_status = exporter.status();
        let metrics_published = exporter.published();
        let health_socket =
            HealthSocket::new(inventory.clone(), health_snapshot.clone(), exporter.pods());
        let labeller = nodes.map(|writer| {
            Slot::new(LabellerService {
                writer,
                inventory,
                node,
            })
        });
        Self {
            plugin,
            dra,
            labeller,
            health: Slot::new(monitor),
            metrics: Slot::new(exporter),
            health_socket: Slot::new(health_socket),
            test_runner: Slot::new(test_runner),
            plugin_status,
            exporter_status,
            metrics_published,
            health_snapshot,
            gpu_locks,
            transitions,
            test_results,
            discovery,
            held_back: Vec::new(),
            dra_unserved: false,
            _forward: AbortOnDropHandle::new(forward),
            _forward_discovery: AbortOnDropHandle::new(forward_discovery),
        }
    }

    /// The discovery watch's progress; `changed()` wakes only when it changes.
    pub fn discovery(&self) -> watch::Receiver<DiscoveryProgress> {
        self.discovery.clone()
    }

    /// Health transitions, re-broadcast for the Node publisher and the event log.
    pub fn transitions(&self) -> broadcast::Receiver<HealthTransition> {
        self.transitions.subscribe()
    }

    /// Each test case as it finishes.
    pub fn test_results(&self) -> broadcast::Receiver<LastRun> {
        self.test_results.resubscribe()
    }

    pub async fn apply(&mut self, desired: DesiredServices) -> Applied {
        let (desired, held_back) = hold_back_until_discovered(desired, &self.discovery.borrow());
        self.held_back = held_back;
        let mut applied = Applied::default();
        // The old kubelet service goes before the new one starts, so that
        // the kubelet never sees both for one GPU.
        if desired.dra.is_some() {
            self.plugin.apply(None).await;
        }
        if let Some(dra) = self.dra.as_mut() {
            dra.apply(desired.dra).await;
        } else if desired.dra.is_some() {
            tracing::warn!(
                "draDriver is enabled, but DRA needs the Kubernetes API: not served in standalone mode"
            );
        }
        self.plugin.apply(desired.device_plugin).await;
        if let Some(labeller) = self.labeller.as_mut() {
            applied.labeller_stopped =
                labeller.apply(desired.labeller).await == SlotChange::Stopped;
        }
        applied.health_stopped = self.health.apply(desired.health).await == SlotChange::Stopped;
        self.metrics.apply(desired.metrics).await;
        self.health_socket.apply(desired.health_socket).await;
        self.test_runner.apply(desired.test_runner).await;
        applied
    }

    /// Each running service's state, for the status annotation.
    pub fn states(&self) -> BTreeMap<ServiceName, ServiceStatus> {
        let mut states = vec![
            (ServiceName::DevicePlugin, self.plugin.state()),
            (ServiceName::HealthMonitor, self.health.state()),
            (ServiceName::MetricsExporter, self.metrics.state()),
            (ServiceName::HealthSocket, self.health_socket.state()),
            (ServiceName::TestRunner, self.test_runner.state()),
        ];
        if let Some(labeller) = &self.labeller {
            states.push((ServiceName::Labeller, labeller.state()));
        }
        if let Some(dra) = &self.dra {
            states.push((ServiceName::DraDriver, dra.state()));
        }
        let mut states: BTreeMap<ServiceName, ServiceStatus> = states
            .into_iter()
            .filter_map(|(name, state)| annotation_state(&state).map(|s| (name, s)))
            .collect();
        if self.dra_unserved {
            states.insert(
                ServiceName::DraDriver,
                ServiceStatus::Unavailable {
                    reason: DRA_UNSERVED.to_owned(),
                },
            );
        }
        for name in &self.held_back {
            states.insert(
                *name,
                ServiceStatus::Unavailable {
                    reason: DISCOVERING.to_owned(),
                },
            );
        }
        states
    }

    /// One receiver per slot, to wake a loop on any state change.
    pub fn state_changes(&self) -> Vec<watch::Receiver<ServiceState>> {
        let mut all = vec![
            self.plugin.subscribe(),
            self.health.subscribe(),
            self.metrics.subscribe(),
            self.health_socket.subscribe(),
            self.test_runner.subscribe(),
        ];
        if let Some(labeller) = &self.labeller {
            all.push(labeller.subscribe());
        }
        if let Some(dra) = &self.dra {
            all.push(dra.subscribe());
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
        let dra = async {
            if let Some(dra) = self.dra.as_mut() {
                dra.stop().await;
            }
        };
        tokio::join!(
            self.plugin.stop(),
            dra,
            self.health.stop(),
            self.metrics.stop(),
            self.health_socket.stop(),
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

/// Until the host has been seen whole, only the metrics endpoint may run; the
/// rest is held back, and named so that the status can say why.
pub fn hold_back_until_discovered(
    desired: DesiredServices,
    progress: &DiscoveryProgress,
) -> (DesiredServices, Vec<ServiceName>) {
    if progress.discovered {
        return (desired, Vec::new());
    }
    let held_back = [
        (ServiceName::DevicePlugin, desired.device_plugin.is_some()),
        (ServiceName::DraDriver, desired.dra.is_some()),
        (ServiceName::Labeller, desired.labeller.is_some()),
        (ServiceName::HealthMonitor, desired.health.is_some()),
        (ServiceName::HealthSocket, desired.health_socket.is_some()),
        (ServiceName::TestRunner, desired.test_runner.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, wanted)| wanted.then_some(name))
    .collect();
    let metrics_only = DesiredServices {
        metrics: desired.metrics,
        ..DesiredServices::default()
    };
    (metrics_only, held_back)
}

fn progress_of(scan: &ScanState) -> DiscoveryProgress {
    DiscoveryProgress {
        discovered: scan.discovered,
        last_incomplete: scan.last_incomplete.clone(),
    }
}

async fn forward_progress(
    mut scan: watch::Receiver<ScanState>,
    progress: watch::Sender<DiscoveryProgress>,
) {
    while scan.changed().await.is_ok() {
        let now = progress_of(&scan.borrow_and_update());
        progress.send_if_modified(|last| {
            let modified = *last != now;
            *last = now;
            modified
        });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::select::LabellerConfig;
    use crate::host::HostRoot;
    use crate::metrics::MetricsConfig;

    #[test]
    fn before_discovery_only_the_metrics_endpoint_runs_and_the_rest_is_named() {
        let desired = DesiredServices {
            labeller: Some(LabellerConfig {
                kinds: Vec::new(),
                sharing: None,
            }),
            metrics: Some(MetricsConfig::new(HostRoot::new("/h"), "n1")),
            ..DesiredServices::default()
        };
        let (now, held_back) =
            hold_back_until_discovered(desired.clone(), &DiscoveryProgress::default());
        assert_eq!(now.metrics, desired.metrics);
        assert_eq!(
            (now.labeller, now.device_plugin, now.health, now.test_runner),
            (None, None, None, None)
        );
        assert_eq!(held_back, [ServiceName::Labeller]);

        let discovered = DiscoveryProgress {
            discovered: true,
            last_incomplete: Some("a later scan missed its deadline".into()),
        };
        let (now, held_back) = hold_back_until_discovered(desired.clone(), &discovered);
        assert_eq!(
            now, desired,
            "once discovered, an untrusted scan holds nothing back"
        );
        assert!(held_back.is_empty());
    }
}
