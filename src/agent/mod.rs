//! The node agent: finds its Node, works out which DeviceConfig selects that
//! Node, and runs the node services that DeviceConfig enables.
//!
//! Everything is driven by watches, never by polling the API: one watch on the
//! agent's own Node (by field selector), one reflector on DeviceConfigs, and the
//! discovery change stream. Each time any of them changes, the agent makes one
//! pass: [`plan`] decides (pure: what to follow, what should run, which Events
//! to record, which status to write) and the loop here carries that out on its
//! service slots ([`crate::service`]), its followers and the Node, publishing
//! the status annotation if, and only if, it changed. An idle agent therefore
//! makes no request besides its watches.
//!
//! This module owns the node's side of the contract with the cluster: which
//! DeviceConfig it follows, the status annotation, GPU labels and the Events it
//! records on its Node. It must not write DeviceConfig status: that is the
//! leader's job (`cluster`).

pub mod configmaps;
pub mod node_services;
pub mod partition;
pub mod plan;
pub mod remediation;
pub mod select;
pub mod services;
pub mod standalone;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::api::DeviceConfig;
use crate::api::agent_status::STATUS_ANNOTATION;
use crate::api::driver_upgrade::UpgradeRecord;
use crate::device::watch::{DeviceWatch, WatchConfig};
use crate::events::{EventSink, EventType, NodeEvent};
use crate::host::HostRoot;
use crate::node_writer::{
    Concern, NodeIntent, NodeWriteError, NodeWriter, RETRY_AFTER_FAILURE, StatusIntent,
};
use configmaps::ConfigMapFollower;
use node_services::NodeServices;
use select::{DesiredServices, NodeContext, Selection, select_config};

/// How the agent was started.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub node_name: String,
    /// Namespace whose DeviceConfigs are watched; all namespaces when `None`.
    pub namespace: Option<String>,
    pub host: HostRoot,
    /// The kubelet's root directory as this process sees it.
    pub kubelet_dir: PathBuf,
    /// Discovery rescan interval (the safety net behind udev).
    pub rescan_interval: Duration,
    /// Metrics and health sampling.
    pub sampling: select::Sampling,
    /// Campaign for the cluster role; `None` runs node work only.
    pub leader: Option<LeaderConfig>,
    /// Where the metrics endpoint listens, overriding `metricsExporter.port`
    /// (e.g. to bind one interface only).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Where the test tools are, overriding the reference image's locations.
    pub test_commands: Option<crate::testrunner::Commands>,
    /// The driver bundle store and the commands that load from it.
    pub driver: crate::driver::manager::ManagerConfig,
    /// Where the DRA plugin writes CDI specs.
    pub cdi_dir: PathBuf,
    /// Taint unhealthy devices in the DRA ResourceSlices.
    pub dra_device_taints: bool,
    /// The host path of the reference exporter's health socket
    /// ([`crate::metricssvc::DEFAULT_SOCKET`]); `None` serves none.
    pub health_socket: Option<PathBuf>,
}

/// How this agent takes part in leader election.
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    pub lease: crate::cluster::lease::LeaseConfig,
    pub cluster: crate::cluster::ClusterConfig,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("the DeviceConfig watch ended unexpectedly")]
    WatchEnded,
}

/// Runs the agent until `shutdown` fires, then stops every service (removing
/// their sockets) and returns.
pub async fn run(
    client: Client,
    config: AgentConfig,
    shutdown: CancellationToken,
) -> Result<(), AgentError> {
    let node_name = config.node_name.clone();
    tracing::info!(node = %node_name, namespace = ?config.namespace, host_root = %config.host.root().display(), "agent starting");
    // Not waiting for the first scan: a hung host must not keep the metrics
    // endpoint (and /healthz) down. The other services wait for discovery.
    let devices = DeviceWatch::start_undiscovered(
        config.host.clone(),
        WatchConfig {
            rescan_interval: config.rescan_interval,
            use_udev: true,
            ..WatchConfig::default()
        },
    );
    let mut inventory = devices.inventory();
    // What driver and kernel the node runs, for the status, whatever the
    // DeviceConfig says about drivers.
    let report_stop = CancellationToken::new();
    let _stop_report = report_stop.clone().drop_guard();
    // One small reader pool for the driver's own host reads: the report
    // and the holder scans of the driver manager and of partition changes.
    let driver_reader = crate::host::reader::BoundedReader::new(config.host.clone(), 2);
    let mut driver_report = crate::driver::report::follow(
        driver_reader.clone(),
        inventory.clone(),
        devices.state(),
        report_stop.clone(),
    );
    // Loads the driver the selected DeviceConfig asks for, if any.
    let (driver_wanted, wanted_rx) = watch::channel(None);
    let mut driver_load = crate::driver::manager::spawn(
        driver_reader.clone(),
        config.driver.clone(),
        wanted_rx,
        driver_report.clone(),
        report_stop.clone(),
    );
    let nodes: Api<Node> = Api::all(client.clone());
    // Every write to this agent's own Node goes through it.
    let writer = NodeWriter::new(nodes.clone(), node_name.clone());

    // The cluster role runs beside node work and stops with it: on shutdown the
    // election releases the lease so that a standby takes over at once.
    // Shared with the remediation task, which hands leadership over before
    // it reboots this node.
    let leader = Arc::new(tokio::sync::Mutex::new(config.leader.clone().map(
        |leader| {
            let stop = shutdown.child_token();
            LeaderRole {
                role: crate::cluster::ClusterRole::start(
                    client.clone(),
                    leader.lease,
                    leader.cluster,
                    stop.clone(),
                ),
                stop,
            }
        },
    )));

    let watches = CancellationToken::new();
    let _stop_watches = watches.clone().drop_guard();
    let mut node_rx = spawn_node_watch(nodes.clone(), &node_name, watches.clone());
    let (configs, mut configs_changed) =
        spawn_config_reflector(&client, config.namespace.as_deref(), watches.clone());

    // Every Event about this Node goes through it.
    let events = EventSink::kubernetes(client.clone(), node_name.clone(), node_rx.clone());
    let mut services = NodeServices::new(
        inventory.clone(),
        devices.state(),
        Some(node_services::KubeSide {
            client: client.clone(),
            writer: writer.clone(),
            node: node_rx.clone(),
            events: events.clone(),
        }),
    );
    let mut plugin_status = services.plugin_status.clone();
    let mut discovery = services.discovery();
    // Partition changes of this node (configManager), once the leader drained it.
    let (partition_wanted, partition_wanted_rx) = watch::channel(None);
    let (mut partition_report, _partition_task) = partition::spawn(
        partition::Feeds {
            node: node_rx.clone(),
            inventory: inventory.clone(),
            discovered: services.discovery(),
            rescan: devices.rescan(),
            writer: writer.clone(),
            events: events.clone(),
            store: crate::simulate::kernel::store_for(&config.host),
            reader: driver_reader.clone(),
            limits: crate::partition::Limits::default(),
        },
        partition_wanted_rx,
        report_stop.clone(),
    );
    // What the leader's remediation record asks of this node: a reboot, the
    // validation tests, a GPU reset. It asks the kubelet which pods hold a
    // GPU where the metrics exporter does (the DeviceConfig may move it).
    let (pod_resources, pod_resources_rx) = watch::channel(crate::metrics::pod_resources_socket(
        "",
        &config.kubelet_dir,
    ));
    let (mut remediation_report, _remediation_task) = remediation::spawn(
        remediation::Feeds {
            node: node_rx.clone(),
            driver: driver_report.clone(),
            inventory: inventory.clone(),
            events: events.clone(),
            reboot: config.driver.reboot.clone(),
            leader: leader.clone(),
            health: services.health_snapshot.clone(),
            pod_resources: pod_resources_rx,
            gpu_reset: config.driver.gpu_reset.clone(),
            reader: driver_reader.clone(),
            gpu_locks: services.gpu_locks.clone(),
            tests: crate::testrunner::TestRunnerConfig {
                commands: config.test_commands.clone().unwrap_or_default(),
                ..crate::testrunner::TestRunnerConfig::for_spec(
                    &crate::api::TestRunnerSpec::default(),
                    config.host.clone(),
                    node_name.clone(),
                    None,
                )
            },
        },
        report_stop.clone(),
    );
    let (mut metrics_config_error, _forward_config_error) =
        config_error_changes(services.exporter_status.clone());
    let mut state_changes = services.state_changes();
    let metrics_config = ConfigMapFollower::new(client.clone());
    let test_config = ConfigMapFollower::new(client.clone());
    let partition_config = ConfigMapFollower::new(client.clone());
    let mut metrics_text = metrics_config.subscribe();
    let mut test_text = test_config.subscribe();
    let mut partition_text = partition_config.subscribe();
    // The Secret and ConfigMap that metricsExporter.rbacConfig names.
    let access = configmaps::AccessFollower::new(client.clone());
    let mut access_material = access.subscribe();

    let mut edges = Edges {
        client: client.clone(),
        config: &config,
        nodes,
        writer,
        events,
        watches: watches.clone(),
        metrics_config,
        test_config,
        partition_config,
        access,
        node_health: None,
        driver_condition_failed: false,
    };
    let mut state = plan::LoopState::default();

    loop {
        let node = node_rx.borrow_and_update().clone();
        configs_changed.borrow_and_update();
        metrics_text.borrow_and_update();
        test_text.borrow_and_update();
        partition_text.borrow_and_update();
        access_material.borrow_and_update();
        discovery.borrow_and_update();
        for rx in &mut state_changes {
            rx.borrow_and_update();
        }
        // Nothing is decided about selection before the first full list of
        // DeviceConfigs: an empty store then means "not known yet", not "no
        // DeviceConfig selects this node", and deciding on it would remove
        // the agent's own label, condition and status for a moment on every
        // restart.
        let configs_listed = *configs_changed.borrow() > 0;
        if let Some(node) = node.filter(|_| configs_listed) {
            // One pass over the node's desired state: the agent's reconcile.
            crate::counters::record_reconcile();
            let selection = select_config(node.labels(), configs.state().iter().map(Arc::as_ref));
            let following = plan::follow(&mut state, &selection);
            if let Some(labels) = plan::driver_labels(&state, &selection, node.labels())
                && edges.apply_driver_labels(&labels).await
            {
                state.driver_labels_written(labels);
            }
            let wanted = match &selection {
                Selection::One(selected) => crate::driver::manager::DriverWanted::for_node(
                    selected.spec.driver(),
                    &selected.key,
                    UpgradeRecord::of_annotations(node.annotations()).as_ref(),
                ),
                _ => None,
            };
            driver_wanted.send_if_modified(|current| {
                let changed = *current != wanted;
                *current = wanted.clone();
                changed
            });
            let load = driver_load.borrow_and_update().clone();
            if let Some((type_, action, reason, note)) =
                plan::driver_load_event(&mut state, load.as_ref())
            {
                edges
                    .events
                    .record(NodeEvent::agent(type_, action, reason, note))
                    .await;
            }
            let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            );
            let condition = plan::driver_condition_intent(
                &selection,
                driver_report.borrow().as_ref(),
                load.as_ref(),
                wanted.as_ref(),
                &node,
                &now,
            );
            if let Some(intent) = condition {
                edges.apply_driver_condition(&intent).await;
            }
            let mut desired = edges.follow(&selection, &following, node.labels());
            plan::hold_for_node_work(
                &mut desired,
                plan::NodeWork {
                    driver: driver_report.borrow().as_ref(),
                    load: load.as_ref(),
                    partition: partition_report.borrow().as_ref(),
                },
            );
            let profiles_text = partition_text.borrow().clone();
            let wanted_partition = plan::partition_wanted(
                &mut state,
                &selection,
                node.labels(),
                profiles_text.as_ref(),
            );
            partition_wanted.send_if_modified(|current| {
                let changed = *current != wanted_partition;
                *current = wanted_partition;
                changed
            });
            let node_label_problems: Vec<String> = match &selection {
                Selection::One(selected) => select::sharing_for(&selected.spec, node.labels())
                    .1
                    .into_iter()
                    .collect(),
                _ => Vec::new(),
            };
            if let Some(socket) = desired
                .metrics
                .as_ref()
                .and_then(|m| m.pod_resources_socket.clone())
            {
                pod_resources.send_if_modified(|current| {
                    let changed = *current != socket;
                    *current = socket;
                    changed
                });
            }
            let access_problems = desired
                .metrics
                .as_ref()
                .map(|m| crate::metrics::access::problems(&m.access))
                .unwrap_or_default();
            let applied = services.apply(desired).await;
            let config_verdict = metrics_config_error.borrow_and_update().clone();
            let report = plan::report(
                &mut state,
                plan::Observed {
                    selection: &selection,
                    annotated: node.annotations().contains_key(STATUS_ANNOTATION),
                    plugin: &plugin_status.borrow_and_update(),
                    metrics_config_error: config_verdict.error.as_deref(),
                    metrics_config_warnings: &config_verdict.warnings,
                    discovery: &discovery.borrow(),
                    access_problems: &access_problems,
                    node_label_problems: &node_label_problems,
                    services: services.states(),
                    inventory: &inventory.borrow_and_update(),
                    driver: driver_report.borrow_and_update().as_ref(),
                    driver_load: load.as_ref(),
                    partition: partition_report.borrow_and_update().as_ref(),
                    remediation: remediation_report.borrow_and_update().as_ref(),
                    applied,
                    health_running: services.health.is_running(),
                    publishing_health: edges.node_health.is_some(),
                    now: k8s_openapi::jiff::Timestamp::now().to_string(),
                },
            );
            if let Some((update, written)) = edges.carry_out(report, &node, &services).await {
                state.status_written(update, written);
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = node_rx.changed() => {}
            changed = configs_changed.changed() => if changed.is_err() { return Err(AgentError::WatchEnded) },
            _ = inventory.changed() => {}
            _ = driver_report.changed() => {}
            _ = driver_load.changed() => {}
            _ = plugin_status.changed() => {}
            _ = metrics_config_error.changed() => {}
            _ = metrics_text.changed() => {}
            _ = test_text.changed() => {}
            _ = partition_text.changed() => {}
            _ = partition_report.changed() => {}
            _ = remediation_report.changed() => {}
            _ = access_material.changed() => {}
            _ = discovery.changed() => {}
            _ = node_services::any_changed(&mut state_changes) => {}
            // A failed status write is retried without waiting for another change.
            _ = tokio::time::sleep(RETRY_AFTER_FAILURE), if state.status_write_failed() || edges.driver_condition_failed => {}
        }
    }
    tracing::info!("agent stopping");
    let release = async {
        let role = leader.lock().await.take();
        if let Some(role) = role {
            role.step_down().await;
        }
    };
    tokio::join!(services.stop(), release);
    drop(devices);
    Ok(())
}

/// The agent's cluster role and what stops its campaign.
pub struct LeaderRole {
    role: crate::cluster::ClusterRole,
    stop: CancellationToken,
}

impl LeaderRole {
    /// Stops leading and campaigning, and releases the Lease, so that a
    /// standby takes over at once.
    pub async fn step_down(self) {
        self.stop.cancel();
        self.role.stop().await;
    }
}

/// Watches the agent's own Node; `None` until it is seen, or after it is deleted.
fn spawn_node_watch(
    nodes: Api<Node>,
    name: &str,
    stop: CancellationToken,
) -> watch::Receiver<Option<Arc<Node>>> {
    let (tx, rx) = watch::channel(None);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let name = name.to_owned();
    tokio::spawn(async move {
        let mut events = watcher::watcher(nodes, config).default_backoff().boxed();
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                event = events.next() => event,
            };
            match event {
                Some(Ok(WatchEvent::Apply(node) | WatchEvent::InitApply(node))) => {
                    tx.send_replace(Some(Arc::new(node)));
                }
                Some(Ok(WatchEvent::Delete(_))) => {
                    tracing::warn!(node = %name, "own Node deleted");
                    tx.send_replace(None);
                }
                Some(Ok(WatchEvent::Init | WatchEvent::InitDone)) => {}
                Some(Err(e)) => {
                    tracing::warn!(node = %name, error = %e, "Node watch error; retrying")
                }
                None => return,
            }
        }
    });
    rx
}

/// Reflects DeviceConfigs into a store; the counter changes on every event
/// after the initial list, and first when that list is complete
/// (`InitDone`): 0 means not listed yet.
fn spawn_config_reflector(
    client: &Client,
    namespace: Option<&str>,
    stop: CancellationToken,
) -> (Store<DeviceConfig>, watch::Receiver<u64>) {
    let api: Api<DeviceConfig> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (store, writer) = reflector::store();
    let (tx, rx) = watch::channel(0u64);
    tokio::spawn(async move {
        let mut events =
            reflector::reflector(writer, watcher::watcher(api, watcher::Config::default()))
                .default_backoff()
                .boxed();
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                event = events.next() => event,
            };
            match event {
                Some(Ok(WatchEvent::Init | WatchEvent::InitApply(_))) => {}
                Some(Ok(_)) => tx.send_modify(|n| *n += 1),
                Some(Err(e)) => {
                    crate::counters::record_api_error();
                    tracing::warn!(error = %e, "DeviceConfig watch error; retrying")
                }
                None => return,
            }
        }
    });
    (store, rx)
}

/// The exporter's verdict on its config (why it was rejected, and the
/// values and keys it ignored), changing only when it does (the exporter's
/// status itself changes with every sample).
fn config_error_changes(
    mut exporter: watch::Receiver<crate::metrics::ExporterStatus>,
) -> (
    watch::Receiver<ConfigVerdict>,
    tokio_util::task::AbortOnDropHandle<()>,
) {
    let verdict = |status: &crate::metrics::ExporterStatus| ConfigVerdict {
        error: status.config_error.clone(),
        warnings: status.config_warnings.clone(),
    };
    let (tx, rx) = watch::channel(verdict(&exporter.borrow()));
    let task = tokio::spawn(async move {
        while exporter.changed().await.is_ok() {
            let now = verdict(&exporter.borrow_and_update());
            tx.send_if_modified(|current| {
                let changed = *current != now;
                *current = now;
                changed
            });
        }
    });
    (rx, tokio_util::task::AbortOnDropHandle::new(task))
}

/// What the exporter made of its config.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct ConfigVerdict {
    error: Option<String>,
    warnings: Vec<String>,
}

/// The task that keeps the Node's GPU health in line with the monitor.
struct HealthPublisher {
    stop: CancellationToken,
    task: tokio_util::task::AbortOnDropHandle<()>,
}

/// How long a stopping health publisher may take to finish a write.
const PUBLISHER_STOP: Duration = Duration::from_secs(10);

/// The agent's I/O for one pass: the followers, the Node's writers and the
/// Event sink, which carry out what [`plan`] decided.
struct Edges<'a> {
    client: Client,
    config: &'a AgentConfig,
    nodes: Api<Node>,
    writer: NodeWriter,
    events: EventSink,
    watches: CancellationToken,
    metrics_config: ConfigMapFollower,
    test_config: ConfigMapFollower,
    /// The ConfigMap of configManager's partition profiles.
    partition_config: ConfigMapFollower,
    /// The Secret and ConfigMap that metricsExporter.rbacConfig names.
    access: configmaps::AccessFollower,
    /// The Node's AMDGPUUnhealthy condition, unhealthy labels and health
    /// Events follow the health monitor while it runs.
    node_health: Option<HealthPublisher>,
    /// The last write of the AMDGPUDriverReady condition failed.
    driver_condition_failed: bool,
}

impl Edges<'_> {
    /// Applies the driver-type labels (the whole set; empty removes them).
    /// True when written; a failure is logged and the next pass tries again.
    async fn apply_driver_labels(&self, labels: &BTreeMap<String, String>) -> bool {
        let intent = NodeIntent {
            labels: labels.clone(),
            ..NodeIntent::default()
        };
        match self.writer.apply(Concern::Driver, &intent).await {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(error = %e, "cannot write the driver type label; trying again on the next change");
                false
            }
        }
    }

    /// Writes the `AMDGPUDriverReady` condition (an empty intent removes
    /// it). A failure is logged and tried again on the next change.
    async fn apply_driver_condition(&mut self, intent: &StatusIntent) {
        let written = self.writer.apply_status(Concern::Driver, intent).await;
        self.driver_condition_failed = written.is_err();
        match written {
            Ok(_) => match intent.conditions.first() {
                Some(c) => tracing::info!(
                    status = %c.status,
                    reason = c.reason.as_deref().unwrap_or_default(),
                    "updated the AMDGPUDriverReady condition"
                ),
                None => tracing::info!("removed the AMDGPUDriverReady condition"),
            },
            Err(e) => {
                tracing::warn!(error = %e, "cannot write the AMDGPUDriverReady condition; trying again on the next change")
            }
        }
    }

    /// Logs and follows what `following` says, and returns the services the
    /// selection asks for with what the followed objects hold.
    fn follow(
        &mut self,
        selection: &Selection,
        following: &plan::Following,
        labels: &BTreeMap<String, String>,
    ) -> DesiredServices {
        if let Some(line) = &following.log {
            tracing::info!(node = %self.config.node_name, "{line}");
        }
        self.metrics_config.follow(following.metrics_config.clone());
        self.test_config.follow(following.test_config.clone());
        self.partition_config
            .follow(following.partition_config.clone());
        self.access.follow(
            following
                .access
                .as_ref()
                .map(|(namespace, rbac)| (namespace.as_str(), rbac)),
        );
        let (metrics_text, test_text) = (self.metrics_config.text(), self.test_config.text());
        let context = NodeContext {
            node_name: &self.config.node_name,
            sampling: &self.config.sampling,
            labels,
            kubelet_dir: &self.config.kubelet_dir,
            host: &self.config.host,
            metrics_config: metrics_text.as_deref(),
            test_config: test_text.as_deref(),
            health_socket: self.config.health_socket.as_deref(),
        };
        let overrides = plan::Overrides {
            metrics_listen: self.config.metrics_listen,
            test_commands: self.config.test_commands.clone(),
            cdi_dir: Some(self.config.cdi_dir.clone()),
            dra_device_taints: self.config.dra_device_taints,
        };
        let mut desired = plan::services(selection, &context, &overrides);
        if let Selection::One(selected) = selection {
            select::with_access_material(
                &mut desired,
                &selected.spec,
                &selected.key.namespace,
                self.access.material(),
                crate::metrics::access::ReviewClient(self.client.clone()),
            );
        }
        desired
    }

    /// Carries out a report on the watched `node`; returns the status update
    /// it tried and whether it was written.
    async fn carry_out(
        &mut self,
        report: plan::Report,
        node: &Node,
        services: &NodeServices,
    ) -> Option<(plan::StatusUpdate, bool)> {
        if report.remove_labels {
            // Disabled or deselected: remove the labels the labeller wrote.
            if let Err(e) = services::remove_labels(&self.writer, node).await {
                tracing::warn!(error = %e, "cannot remove GPU labels");
            }
        }
        match report.health {
            plan::HealthPublishing::Keep => {}
            plan::HealthPublishing::Start => {
                let stop = self.watches.child_token();
                let task = tokio::spawn(crate::health::publish_node_health(
                    self.nodes.clone(),
                    self.config.node_name.clone(),
                    services.health_snapshot.clone(),
                    services.transitions(),
                    self.events.clone(),
                    Duration::from_secs(5),
                    stop.clone(),
                ));
                self.node_health = Some(HealthPublisher {
                    stop,
                    task: tokio_util::task::AbortOnDropHandle::new(task),
                });
            }
            plan::HealthPublishing::StopAndClear => {
                // Stopped, and its last write finished, before the removal:
                // a write still in flight would put the condition back.
                if let Some(publisher) = self.node_health.take() {
                    publisher.stop.cancel();
                    if tokio::time::timeout(PUBLISHER_STOP, publisher.task)
                        .await
                        .is_err()
                    {
                        tracing::warn!(
                            "the GPU health publisher did not stop in time; removing its condition anyway"
                        );
                    }
                }
                if let Err(e) =
                    crate::health::remove_node_health(&self.nodes, &self.config.node_name).await
                {
                    crate::counters::record_api_error();
                    tracing::warn!(error = %e, "cannot remove the GPU health condition");
                }
            }
        }
        for warning in report.warnings {
            let event = NodeEvent::agent(
                EventType::Warning,
                "SelectDeviceConfig",
                warning.reason,
                warning.message,
            );
            self.events.record(event).await;
        }
        let update = report.status?;
        let written = match write_status(&self.writer, node, &update).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "cannot publish agent status; retrying in {RETRY_AFTER_FAILURE:?} or on the next change");
                false
            }
        };
        Some((update, written))
    }
}

/// Writes the status annotation (`None` removes it; nothing when there is
/// nothing to write) through the Node writer,
/// under the agent status's own field manager. The annotation is the agent's
/// whoever wrote it last (earlier versions used a merge patch), so it is
/// always handed over.
async fn write_status(
    writer: &NodeWriter,
    watched: &Node,
    update: &plan::StatusUpdate,
) -> Result<(), NodeWriteError> {
    if !update.write {
        return Ok(());
    }
    let status = update.status.as_ref();
    let intent = NodeIntent {
        annotations: status
            .map(|s| (STATUS_ANNOTATION.to_owned(), s.to_json()))
            .into_iter()
            .collect(),
        retired_annotations: [STATUS_ANNOTATION.to_owned()].into(),
        ..NodeIntent::default()
    };
    // Decided on the watched copy, as the labeller does: the status is written
    // only when it changed, and a stale copy only repeats an equal apply.
    writer
        .apply_to(watched, Concern::AgentStatus, &intent)
        .await?;
    match status {
        Some(_) => tracing::debug!(node = %writer.name(), "published agent status"),
        None => tracing::info!(node = %writer.name(), "removed the agent status annotation"),
    }
    Ok(())
}
