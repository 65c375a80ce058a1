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
//! The tasks that keep those feeds current are followers
//! ([`crate::service::Followers`]): one that ends unasked is named in the
//! status's problems and the log, and the loop waits on all its feeds at
//! once through [`Wakes`], so that a feed that closed never wakes it again.
//!
//! This module owns the node's side of the contract with the cluster: which
//! DeviceConfig it follows, the status annotation, GPU labels and the Events it
//! records on its Node. It must not write DeviceConfig status: that is the
//! leader's job (`cluster`).

pub mod configmaps;
pub mod node_services;
pub mod node_side;
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
use tokio_util::task::AbortOnDropHandle;

use crate::api::DeviceConfig;
use crate::api::agent_status::STATUS_ANNOTATION;
use crate::driver::decision;
use crate::events::{EventSink, EventType, NodeEvent};
use crate::host::HostRoot;
use crate::node_writer::{
    Concern, NodeIntent, NodeWriteError, NodeWriter, RETRY_AFTER_FAILURE, StatusIntent,
};
use crate::service::{Followers, Slot, Wake, Wakes};
use configmaps::ConfigMapFollower;
use node_side::{DRIVER_MANAGER, DRIVER_REPORT, NodeSide};
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

impl AgentConfig {
    /// What the command line overrides in the services a DeviceConfig asks
    /// for (applied in [`plan::apply_overrides`]).
    fn overrides(&self) -> plan::Overrides {
        plan::Overrides {
            metrics_listen: self.metrics_listen,
            test_commands: self.test_commands.clone(),
            cdi_dir: Some(self.cdi_dir.clone()),
            dra_device_taints: Some(self.dra_device_taints),
            reload: Some(crate::driver::reload::Reloader {
                commands: self.driver.commands.clone(),
                handoff: self.driver.handoff.clone(),
            }),
            access: None,
        }
    }
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

/// The followers' names, as the status and the log name one that ended.
const NODE_WATCH: &str = "node-watch";
const DEVICE_CONFIG_WATCH: &str = "device-config-watch";
const METRICS_CONFIG_VERDICT: &str = "metrics-config-verdict";
const METRICS_CONFIG_MAP: &str = "metrics-config-map";
const TEST_CONFIG_MAP: &str = "test-config-map";
const PARTITION_CONFIG_MAP: &str = "partition-config-map";
/// The discovery watch's task (not a follower here: the device watch owns it).
const DEVICE_WATCH: &str = "device-watch";
/// Feeds whose senders the agent itself holds: they close only with it.
const SERVICE_STATES: &str = "service-states";
const PLUGIN_STATUS: &str = "device-plugin-status";
const METRICS_ACCESS: &str = "metrics-access";
const FOLLOWER_ENDS: &str = "follower-ends";

/// How long a failed write of the Node's GPU health waits before the next.
const HEALTH_RETRY: Duration = Duration::from_secs(5);

/// Runs the agent until `shutdown` fires, then stops every service (removing
/// their sockets) and returns.
pub async fn run(
    client: Client,
    config: AgentConfig,
    shutdown: CancellationToken,
) -> Result<(), AgentError> {
    run_with_followers(client, config, shutdown, Followers::new()).await
}

/// As [`run`], with the agent's followers run under `followers`, whose
/// ends its caller can read too (and a test can cause).
pub async fn run_with_followers(
    client: Client,
    config: AgentConfig,
    shutdown: CancellationToken,
    followers: Followers,
) -> Result<(), AgentError> {
    let node_name = config.node_name.clone();
    tracing::info!(node = %node_name, namespace = ?config.namespace, host_root = %config.host.root().display(), "agent starting");
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

    let (node_rx, _node_watch) = spawn_node_watch(nodes.clone(), &node_name, &followers);
    let (configs, configs_changed, _config_watch) =
        spawn_config_reflector(&client, config.namespace.as_deref(), &followers);

    // Every Event about this Node goes through it.
    let events = EventSink::kubernetes(client.clone(), node_name.clone(), node_rx.clone());
    // The driver is reported whatever the DeviceConfig says about drivers,
    // and loaded as the selected one asks (each pass says).
    let mut node_side = NodeSide::start(
        node_side::Start {
            host: config.host.clone(),
            rescan_interval: config.rescan_interval,
            driver: config.driver.clone(),
            driver_wanted: None,
        },
        Some(node_services::KubeSide {
            client: client.clone(),
            writer: writer.clone(),
            node: node_rx.clone(),
            events: events.clone(),
        }),
        followers.clone(),
    );
    let report_stop = node_side.stopping();
    let inventory = node_side.devices.inventory();
    let driver_report = node_side.driver_report.clone();
    let driver_load = node_side.driver_load.clone();
    let plugin_status = node_side.services.plugin_status.clone();
    let discovery = node_side.services.discovery();
    // Partition changes of this node (configManager), once the leader drained it.
    let (partition_wanted, partition_wanted_rx) = watch::channel(None);
    let (partition_report, _partition_task) = partition::spawn(
        partition::Feeds {
            node: node_rx.clone(),
            inventory: inventory.clone(),
            discovered: node_side.services.discovery(),
            rescan: node_side.devices.rescan(),
            writer: writer.clone(),
            events: events.clone(),
            store: crate::simulate::kernel::store_for(&config.host),
            reader: node_side.reader.clone(),
            limits: crate::partition::Limits::default(),
        },
        partition_wanted_rx,
        &followers,
        report_stop.clone(),
    );
    // What the leader's remediation record asks of this node: a reboot, the
    // validation tests, a GPU reset. It asks the kubelet which pods hold a
    // GPU where the metrics exporter does (the DeviceConfig may move it).
    let (pod_resources, pod_resources_rx) =
        watch::channel(crate::pod_resources::socket("", &config.kubelet_dir));
    let (remediation_report, _remediation_task) = remediation::spawn(
        remediation::Feeds {
            node: node_rx.clone(),
            driver: driver_report.clone(),
            inventory: inventory.clone(),
            events: events.clone(),
            reboot: config.driver.reboot.clone(),
            leader: leader.clone(),
            health: node_side.services.health_snapshot.clone(),
            pod_resources: pod_resources_rx,
            gpu_reset: config.driver.gpu_reset.clone(),
            reader: node_side.reader.clone(),
            gpu_locks: node_side.services.gpu_locks.clone(),
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
        &followers,
        report_stop.clone(),
    );
    let (metrics_config_error, _forward_config_error) =
        config_error_changes(node_side.services.exporter_status.clone(), &followers);
    let metrics_config =
        ConfigMapFollower::new(client.clone(), followers.clone(), METRICS_CONFIG_MAP);
    let test_config = ConfigMapFollower::new(client.clone(), followers.clone(), TEST_CONFIG_MAP);
    let partition_config =
        ConfigMapFollower::new(client.clone(), followers.clone(), PARTITION_CONFIG_MAP);
    let partition_text = partition_config.subscribe();
    // The Secret and ConfigMap that metricsExporter.rbacConfig names.
    let access = configmaps::AccessFollower::new(client.clone(), followers.clone());
    let ended = followers.ended();

    // One wait for every trigger of a pass; a feed that closed (its
    // follower ended) wakes it once, to say so, and never again.
    let mut wakes = Wakes::new();
    wakes.watch(NODE_WATCH, node_rx.clone());
    wakes.watch(DEVICE_CONFIG_WATCH, configs_changed.clone());
    wakes.watch(DEVICE_WATCH, inventory.clone());
    wakes.watch(DEVICE_WATCH, discovery.clone());
    wakes.watch(DRIVER_REPORT, driver_report.clone());
    wakes.watch(DRIVER_MANAGER, driver_load.clone());
    wakes.watch(PLUGIN_STATUS, plugin_status.clone());
    wakes.watch(METRICS_CONFIG_VERDICT, metrics_config_error.clone());
    wakes.watch(METRICS_CONFIG_MAP, metrics_config.subscribe());
    wakes.watch(TEST_CONFIG_MAP, test_config.subscribe());
    wakes.watch(PARTITION_CONFIG_MAP, partition_text.clone());
    wakes.watch(partition::FOLLOWER, partition_report.clone());
    wakes.watch(remediation::FOLLOWER, remediation_report.clone());
    wakes.watch(METRICS_ACCESS, access.subscribe());
    wakes.watch(FOLLOWER_ENDS, ended.clone());
    for states in node_side.services.state_changes() {
        wakes.watch(SERVICE_STATES, states);
    }
    let node_health = Slot::new(crate::health::NodeHealthPublisher {
        writer: writer.clone(),
        node: node_rx.clone(),
        snapshots: node_side.services.health_snapshot.clone(),
        transitions: node_side.services.transitions(),
        events: events.clone(),
    });
    wakes.watch(SERVICE_STATES, node_health.subscribe());

    let mut edges = Edges {
        client: client.clone(),
        config: &config,
        nodes,
        writer,
        events,
        metrics_config,
        test_config,
        partition_config,
        access,
        node_health,
        driver_condition_failed: false,
    };
    let mut state = plan::LoopState::default();

    loop {
        let node = node_rx.borrow().clone();
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
            // The driver: what is asked of it, and how that shows on the Node
            // (decided in `driver::decision`; written here).
            let governing = selection.for_driver();
            if let Some(labels) = state.driver.labels_to_apply(governing, node.labels())
                && edges.apply_driver_labels(&labels).await
            {
                state.driver.labels_written(labels);
            }
            let wanted = decision::wanted(governing, node.annotations());
            node_side.want_driver(wanted.clone());
            let load = driver_load.borrow().clone();
            if let Some((type_, action, reason, note)) = state.driver.load_event(load.as_ref()) {
                edges
                    .events
                    .record(NodeEvent::agent(type_, action, reason, note))
                    .await;
            }
            let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            );
            let condition = decision::condition_intent(
                governing,
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
                    .chain(select::auto_partition_problem(
                        &selected.spec,
                        node.labels(),
                    ))
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
            let auto_partition = desired.dra.as_ref().is_some_and(|d| d.auto_partition);
            let applied = node_side.services.apply(desired).await;
            let config_verdict = metrics_config_error.borrow().clone();
            let followers_ended: Vec<String> =
                ended.borrow().iter().map(ToString::to_string).collect();
            let report = plan::report(
                &mut state,
                plan::Observed {
                    selection: &selection,
                    annotated: node.annotations().contains_key(STATUS_ANNOTATION),
                    plugin: &plugin_status.borrow(),
                    metrics_config_error: config_verdict.error.as_deref(),
                    metrics_config_warnings: &config_verdict.warnings,
                    discovery: &discovery.borrow(),
                    access_problems: &access_problems,
                    node_label_problems: &node_label_problems,
                    services: node_side.services.states(),
                    inventory: &inventory.borrow(),
                    auto_partition,
                    driver: driver_report.borrow().as_ref(),
                    driver_load: load.as_ref(),
                    partition: partition_report.borrow().as_ref(),
                    remediation: remediation_report.borrow().as_ref(),
                    applied,
                    health_running: node_side.services.health.is_running(),
                    publishing_health: edges.node_health.is_running(),
                    followers_ended: &followers_ended,
                    now: k8s_openapi::jiff::Timestamp::now().to_string(),
                },
            );
            if let Some((update, written)) = edges.carry_out(report, &node).await {
                state.status_written(update, written);
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            wake = wakes.next() => match wake {
                Wake::Changed(_) => {}
                // Without DeviceConfigs the agent cannot decide anything.
                Wake::Closed(DEVICE_CONFIG_WATCH) => {
                    followers.feed_closed(DEVICE_CONFIG_WATCH);
                    return Err(AgentError::WatchEnded);
                }
                Wake::Closed(feed) => followers.feed_closed(feed),
            },
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
    tokio::join!(node_side.services.stop(), edges.node_health.stop(), release);
    drop(node_side);
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

/// Watches the agent's own Node, as one of `followers`; `None` until it is
/// seen, or after it is deleted.
fn spawn_node_watch(
    nodes: Api<Node>,
    name: &str,
    followers: &Followers,
) -> (watch::Receiver<Option<Arc<Node>>>, AbortOnDropHandle<()>) {
    let (tx, rx) = watch::channel(None);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let name = name.to_owned();
    let stop = followers.stopping();
    let task = followers.spawn(NODE_WATCH, async move {
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
    (rx, task)
}

/// Reflects DeviceConfigs into a store; the counter changes on every event
/// after the initial list, and first when that list is complete
/// (`InitDone`): 0 means not listed yet. Runs as one of `followers`.
fn spawn_config_reflector(
    client: &Client,
    namespace: Option<&str>,
    followers: &Followers,
) -> (
    Store<DeviceConfig>,
    watch::Receiver<u64>,
    AbortOnDropHandle<()>,
) {
    let api: Api<DeviceConfig> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (store, writer) = reflector::store();
    let (tx, rx) = watch::channel(0u64);
    let stop = followers.stopping();
    let task = followers.spawn(DEVICE_CONFIG_WATCH, async move {
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
    (store, rx, task)
}

/// The exporter's verdict on its config (why it was rejected, and the
/// values and keys it ignored), changing only when it does (the exporter's
/// status itself changes with every sample). Runs as one of `followers`.
fn config_error_changes(
    mut exporter: watch::Receiver<crate::metrics::ExporterStatus>,
    followers: &Followers,
) -> (watch::Receiver<ConfigVerdict>, AbortOnDropHandle<()>) {
    let verdict = |status: &crate::metrics::ExporterStatus| ConfigVerdict {
        error: status.config_error.clone(),
        warnings: status.config_warnings.clone(),
    };
    let (tx, rx) = watch::channel(verdict(&exporter.borrow()));
    let task = followers.spawn(METRICS_CONFIG_VERDICT, async move {
        while exporter.changed().await.is_ok() {
            let now = verdict(&exporter.borrow_and_update());
            tx.send_if_modified(|current| {
                let changed = *current != now;
                *current = now;
                changed
            });
        }
    });
    (rx, task)
}

/// What the exporter made of its config.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct ConfigVerdict {
    error: Option<String>,
    warnings: Vec<String>,
}

/// The agent's I/O for one pass: the followers, the Node's writers and the
/// Event sink, which carry out what [`plan`] decided.
struct Edges<'a> {
    client: Client,
    config: &'a AgentConfig,
    nodes: Api<Node>,
    writer: NodeWriter,
    events: EventSink,
    metrics_config: ConfigMapFollower,
    test_config: ConfigMapFollower,
    /// The ConfigMap of configManager's partition profiles.
    partition_config: ConfigMapFollower,
    /// The Secret and ConfigMap that metricsExporter.rbacConfig names.
    access: configmaps::AccessFollower,
    /// The Node's AMDGPUUnhealthy condition, unhealthy labels and health
    /// Events follow the health monitor while it runs.
    node_health: Slot<crate::health::NodeHealthPublisher>,
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
            access: Some((
                self.access.material(),
                crate::metrics::access::ReviewClient(self.client.clone()),
            )),
            ..self.config.overrides()
        };
        plan::services(selection, &context, &overrides)
    }

    /// Carries out a report on the watched `node`; returns the status update
    /// it tried and whether it was written.
    async fn carry_out(
        &mut self,
        report: plan::Report,
        node: &Node,
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
                self.node_health.apply(Some(HEALTH_RETRY)).await;
            }
            plan::HealthPublishing::StopAndClear => {
                // Stopped, and its last write finished (or aborted), before
                // the removal: a write still in flight would put the
                // condition back.
                self.node_health.apply(None).await;
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
