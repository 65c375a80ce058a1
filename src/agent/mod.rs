//! The node agent: finds its Node, works out which DeviceConfig selects that
//! Node, and runs the node services that DeviceConfig enables.
//!
//! Everything is driven by watches, never by polling the API: one watch on the
//! agent's own Node (by field selector), one reflector on DeviceConfigs, and the
//! discovery change stream. Each time any of them changes, the agent recomputes
//! what should run ([`select`], pure), applies it to its service slots
//! ([`crate::service`]), and publishes its status annotation ([`status`]) if, and only
//! if, it changed. An idle agent therefore makes no request besides its watches.
//!
//! This module owns the node's side of the contract with the cluster: which
//! DeviceConfig it follows, the status annotation, GPU labels and the Events it
//! records on its Node. It must not write DeviceConfig status: that is the
//! leader's job (`cluster`).

pub mod configmaps;
pub mod node_services;
pub mod select;
pub mod services;
pub mod standalone;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::api::DeviceConfig;
use crate::api::agent_status::{AgentStatus, STATUS_ANNOTATION, STATUS_VERSION};
use crate::device::watch::{DeviceWatch, WatchConfig};
use crate::host::HostRoot;
use crate::node_writer::{Concern, NodeIntent, NodeWriteError, NodeWriter, RETRY_AFTER_FAILURE};
use crate::plugin::PluginStatus;
use configmaps::ConfigMapFollower;
use node_services::{DiscoveryProgress, NodeServices};
use select::{NodeContext, Selection, idle_services, plan_services, select_config};

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
    let nodes: Api<Node> = Api::all(client.clone());
    // Every write to this agent's own Node goes through it.
    let writer = NodeWriter::new(nodes.clone(), node_name.clone());

    // The cluster role runs beside node work and stops with it: on shutdown the
    // election releases the lease so that a standby takes over at once.
    let leader = config.leader.clone().map(|leader| {
        crate::cluster::ClusterRole::start(
            client.clone(),
            leader.lease,
            leader.cluster,
            shutdown.child_token(),
        )
    });

    let watches = CancellationToken::new();
    let _stop_watches = watches.clone().drop_guard();
    let mut node_rx = spawn_node_watch(nodes.clone(), &node_name, watches.clone());
    let (configs, mut configs_changed) =
        spawn_config_reflector(&client, config.namespace.as_deref(), watches.clone());

    let mut services = NodeServices::new(
        inventory.clone(),
        devices.state(),
        Some((client.clone(), writer.clone(), node_rx.clone())),
    );
    let mut plugin_status = services.plugin_status.clone();
    let mut discovery = services.discovery();
    let (mut metrics_config_error, _forward_config_error) =
        config_error_changes(services.exporter_status.clone());
    let mut state_changes = services.state_changes();
    let mut metrics_config = ConfigMapFollower::new(client.clone());
    let mut test_config = ConfigMapFollower::new(client.clone());
    let mut metrics_text = metrics_config.subscribe();
    let mut test_text = test_config.subscribe();
    // The Secret and ConfigMap that metricsExporter.rbacConfig names.
    let mut access = configmaps::AccessFollower::new(client.clone());
    let mut access_material = access.subscribe();

    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "gpu-operator".into(),
            instance: Some(node_name.clone()),
        },
    );
    // The Node's AMDGPUUnhealthy condition, unhealthy labels and health Events
    // follow the health monitor while it runs (see `node_health` below).
    let mut node_health: Option<tokio_util::task::AbortOnDropHandle<()>> = None;
    let mut reported = BTreeSet::<String>::new();
    // What was last written: `Some(None)` means the annotation was removed.
    let mut last_status: Option<Option<AgentStatus>> = None;
    // Set while the latest status write failed: it is retried on a timer.
    let mut status_write_failed = false;
    // What the agent follows, to log when that changes.
    let mut followed: Option<String> = None;

    loop {
        let node = node_rx.borrow_and_update().clone();
        configs_changed.borrow_and_update();
        metrics_text.borrow_and_update();
        test_text.borrow_and_update();
        access_material.borrow_and_update();
        discovery.borrow_and_update();
        for rx in &mut state_changes {
            rx.borrow_and_update();
        }
        if let Some(node) = node {
            // One pass over the node's desired state: the agent's reconcile.
            crate::counters::record_reconcile();
            let labels = node.labels().clone();
            let selection = select_config(&labels, configs.state().iter().map(Arc::as_ref));
            let now_following = match &selection {
                Selection::One(selected) => format!("following DeviceConfig {}", selected.key),
                Selection::Conflict(keys) => format!(
                    "DeviceConfigs {} all select this node; running only the metrics endpoint",
                    keys.join(", ")
                ),
                Selection::None => {
                    "no DeviceConfig selects this node; running only the metrics endpoint".into()
                }
            };
            if followed.as_ref() != Some(&now_following) {
                tracing::info!(node = %node_name, "{now_following}");
                followed = Some(now_following);
            }
            if let Selection::One(selected) = &selection {
                let namespace = selected.key.namespace.clone();
                let spec = &selected.spec;
                metrics_config.follow(
                    spec.metrics_exporter
                        .config
                        .name
                        .clone()
                        .map(|n| (namespace.clone(), n)),
                );
                test_config.follow(
                    spec.test_runner
                        .config
                        .as_ref()
                        .map(|c| (namespace.clone(), c.name.clone())),
                );
                access.follow(Some((&namespace, &spec.metrics_exporter.rbac_config)));
            } else {
                metrics_config.follow(None);
                test_config.follow(None);
                access.follow(None);
            }
            let (metrics_text_now, test_text_now) = (metrics_config.text(), test_config.text());
            let context = NodeContext {
                node_name: &node_name,
                sampling: &config.sampling,
                labels: &labels,
                kubelet_dir: &config.kubelet_dir,
                host: &config.host,
                metrics_config: metrics_text_now.as_deref(),
                test_config: test_text_now.as_deref(),
            };
            let mut desired = match &selection {
                Selection::One(selected) => plan_services(&selected.spec, &context),
                Selection::None | Selection::Conflict(_) => idle_services(&context),
            };
            if let Selection::One(selected) = &selection {
                let namespace = selected.key.namespace.as_str();
                let api = crate::metrics::access::ReviewClient(client.clone());
                select::with_access_material(
                    &mut desired,
                    &selected.spec,
                    namespace,
                    access.material(),
                    api,
                );
            }
            let access_problems = desired
                .metrics
                .as_ref()
                .map(|m| crate::metrics::access::problems(&m.access));
            if let (Some(listen), Some(metrics)) = (config.metrics_listen, desired.metrics.as_mut())
            {
                metrics.listen = listen;
            }
            if let (Some(commands), Some(tests)) =
                (&config.test_commands, desired.test_runner.as_mut())
            {
                tests.commands = commands.clone();
            }
            let applied = services.apply(desired).await;
            if applied.labeller_stopped {
                // Disabled or deselected: remove the labels the labeller wrote.
                if let Err(e) = services::remove_labels(&writer, &node).await {
                    tracing::warn!(error = %e, "cannot remove GPU labels");
                }
            }
            if services.health.is_running() && node_health.is_none() {
                node_health = Some(tokio_util::task::AbortOnDropHandle::new(tokio::spawn(
                    crate::health::publish_node_health(
                        nodes.clone(),
                        node_name.clone(),
                        services.health_snapshot.clone(),
                        services.transitions(),
                        Some(recorder.clone()),
                        Duration::from_secs(5),
                        watches.clone(),
                    ),
                )));
            }
            if applied.health_stopped {
                // No monitor, no verdict: stop publishing, then remove the
                // condition and labels it wrote.
                node_health = None;
                if let Err(e) = crate::health::remove_node_health(&nodes, &node_name).await {
                    crate::counters::record_api_error();
                    tracing::warn!(error = %e, "cannot remove the GPU health condition");
                }
            }
            let mut problems = problems(
                &selection,
                &plugin_status.borrow_and_update(),
                metrics_config_error.borrow_and_update().as_deref(),
            );
            problems.extend(discovery_problem(&discovery.borrow()));
            problems.extend(
                access_problems
                    .into_iter()
                    .flatten()
                    .map(|message| Problem {
                        event_reason: Some("MetricsAccessProblem"),
                        message: format!("metrics endpoint: {message}"),
                    }),
            );
            for problem in &problems {
                if let Some(reason) = problem.event_reason
                    && reported.insert(problem.message.clone())
                {
                    record_warning(&recorder, &node, reason, &problem.message).await;
                }
            }
            reported.retain(|p| problems.iter().any(|q| &q.message == p));
            let problems: Vec<String> = problems.into_iter().map(|p| p.message).collect();
            // The status annotation exists while a DeviceConfig selects the node
            // (or several do, which needs a person); with none, the agent
            // removes it, and the leader reads its absence as torn down.
            let status = match &selection {
                Selection::None => None,
                _ => Some(build_status(
                    &selection,
                    &services,
                    &plugin_status.borrow(),
                    &inventory.borrow_and_update(),
                    problems,
                )),
            };
            let changed = match (&status, &last_status) {
                (Some(now), Some(Some(last))) => now.differs_from(last),
                (None, Some(None)) => false,
                _ => true,
            };
            if changed {
                match write_status(&writer, &node, status.as_ref()).await {
                    Ok(()) => {
                        last_status = Some(status);
                        status_write_failed = false;
                    }
                    Err(e) => {
                        status_write_failed = true;
                        tracing::warn!(error = %e, "cannot publish agent status; retrying in {RETRY_AFTER_FAILURE:?} or on the next change")
                    }
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = node_rx.changed() => {}
            changed = configs_changed.changed() => if changed.is_err() { return Err(AgentError::WatchEnded) },
            _ = inventory.changed() => {}
            _ = plugin_status.changed() => {}
            _ = metrics_config_error.changed() => {}
            _ = metrics_text.changed() => {}
            _ = test_text.changed() => {}
            _ = access_material.changed() => {}
            _ = discovery.changed() => {}
            _ = node_services::any_changed(&mut state_changes) => {}
            // A failed status write is retried without waiting for another change.
            _ = tokio::time::sleep(RETRY_AFTER_FAILURE), if status_write_failed => {}
        }
    }
    tracing::info!("agent stopping");
    let release = async {
        if let Some(role) = leader {
            role.stop().await;
        }
    };
    tokio::join!(services.stop(), release);
    drop(devices);
    Ok(())
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

/// Reflects DeviceConfigs into a store; the counter changes on every event.
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

/// Something on this node that needs a person's attention.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Problem {
    /// The Reason of the Warning Event it is worth, if any.
    event_reason: Option<&'static str>,
    message: String,
}

/// The exporter's config error, changing only when it does (the exporter's
/// status itself changes with every sample).
fn config_error_changes(
    mut exporter: watch::Receiver<crate::metrics::ExporterStatus>,
) -> (
    watch::Receiver<Option<String>>,
    tokio_util::task::AbortOnDropHandle<()>,
) {
    let (tx, rx) = watch::channel(exporter.borrow().config_error.clone());
    let task = tokio::spawn(async move {
        while exporter.changed().await.is_ok() {
            let error = exporter.borrow_and_update().config_error.clone();
            tx.send_if_modified(|current| {
                let changed = *current != error;
                *current = error;
                changed
            });
        }
    });
    (rx, tokio_util::task::AbortOnDropHandle::new(task))
}

/// What needs a person's attention on this node. Conflicts and a rejected
/// metrics config are worth an Event; device plugin errors (a failed
/// registration, say) often clear on their own as the plugin retries, so they
/// show in the status annotation only.
fn problems(
    selection: &Selection,
    plugin: &PluginStatus,
    metrics_config_error: Option<&str>,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    if let Selection::Conflict(keys) = selection {
        problems.push(Problem {
            event_reason: Some("ConflictingDeviceConfigs"),
            message: format!(
                "DeviceConfigs {} all select this node; nothing runs until exactly one does",
                keys.join(", ")
            ),
        });
    }
    let conflict = plugin.conflict.as_ref().map(ToString::to_string);
    if let Some(conflict) = &conflict {
        problems.push(Problem {
            event_reason: Some("PartitionLayoutConflict"),
            message: conflict.clone(),
        });
    }
    if let Some(error) = &plugin.error
        && Some(error) != conflict.as_ref()
    {
        problems.push(Problem {
            event_reason: None,
            message: format!("device plugin: {error}"),
        });
    }
    if let Some(error) = metrics_config_error {
        problems.push(Problem {
            event_reason: Some("MetricsConfigError"),
            message: format!("metrics config rejected, the last good one stays in force: {error}"),
        });
    }
    problems
}

/// What the discovery watch's progress means for the node: not discovered
/// yet (only the metrics endpoint runs), or the latest scan was not trusted
/// and the last inventory stays (a warning Event, once per reason).
fn discovery_problem(progress: &DiscoveryProgress) -> Option<Problem> {
    match (progress.discovered, &progress.last_incomplete) {
        (false, reason) => Some(Problem {
            event_reason: reason.as_ref().map(|_| "DiscoveryIncomplete"),
            message: match reason {
                Some(reason) => format!(
                    "GPU discovery has not completed yet; only the metrics endpoint runs: {reason}"
                ),
                None => {
                    "GPU discovery has not completed yet; only the metrics endpoint runs".into()
                }
            },
        }),
        (true, Some(reason)) => Some(Problem {
            event_reason: Some("DiscoveryIncomplete"),
            message: format!("GPU discovery incomplete, the last inventory stays in use: {reason}"),
        }),
        (true, None) => None,
    }
}

fn build_status(
    selection: &Selection,
    services: &NodeServices,
    plugin_status: &PluginStatus,
    inventory: &crate::device::Inventory,
    problems: Vec<String>,
) -> AgentStatus {
    let (device_config, uid, generation) = match selection {
        Selection::One(s) => (Some(s.key.clone()), s.uid.clone(), s.generation),
        _ => (None, None, None),
    };
    AgentStatus {
        v: STATUS_VERSION,
        device_config,
        uid,
        generation,
        services: services.states(),
        resources: plugin_status
            .resources
            .iter()
            .map(|r| (r.name.clone(), r.devices))
            .collect(),
        gpus: inventory.gpus.len(),
        driver_version: inventory.driver.version.clone(),
        problems,
        since: k8s_openapi::jiff::Timestamp::now().to_string(),
    }
}

/// Writes the status annotation (`None` removes it) through the Node writer,
/// under the agent status's own field manager. The annotation is the agent's
/// whoever wrote it last (earlier versions used a merge patch), so it is
/// always handed over.
async fn write_status(
    writer: &NodeWriter,
    watched: &Node,
    status: Option<&AgentStatus>,
) -> Result<(), NodeWriteError> {
    if status.is_none() && !watched.annotations().contains_key(STATUS_ANNOTATION) {
        return Ok(());
    }
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

async fn record_warning(recorder: &Recorder, node: &Node, reason: &str, note: &str) {
    tracing::warn!(reason, note, "recording Warning Event on the Node");
    let event = KubeEvent {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(note.to_owned()),
        action: "SelectDeviceConfig".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &node.object_ref(&())).await {
        crate::counters::record_api_error();
        tracing::warn!(error = %e, "cannot record Event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::LayoutConflict;

    #[test]
    fn discovery_problems_say_what_runs_and_warn_once_per_reason() {
        let whole = DiscoveryProgress {
            discovered: true,
            last_incomplete: None,
        };
        assert_eq!(discovery_problem(&whole), None);

        let starting = DiscoveryProgress::default();
        let problem = discovery_problem(&starting).expect("not discovered is a problem");
        assert_eq!(
            problem.event_reason, None,
            "a normal start is not worth an Event"
        );
        assert!(problem.message.contains("only the metrics endpoint runs"));

        let stuck = DiscoveryProgress {
            discovered: false,
            last_incomplete: Some("discovery missed its 5s deadline".into()),
        };
        let problem = discovery_problem(&stuck).expect("a stuck first scan");
        assert_eq!(problem.event_reason, Some("DiscoveryIncomplete"));
        assert!(
            problem
                .message
                .ends_with("discovery missed its 5s deadline")
        );

        let later = DiscoveryProgress {
            discovered: true,
            ..stuck
        };
        let problem = discovery_problem(&later).expect("an untrusted later scan");
        assert_eq!(problem.event_reason, Some("DiscoveryIncomplete"));
        assert!(problem.message.contains("the last inventory stays in use"));
    }

    #[test]
    fn conflicts_are_worth_events_plugin_errors_only_status() {
        let conflict = Selection::Conflict(vec!["ns/a".into(), "ns/b".into()]);
        let found = problems(&conflict, &PluginStatus::default(), None);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].event_reason, Some("ConflictingDeviceConfigs"));
        assert!(found[0].message.contains("ns/a, ns/b"));

        let failing = PluginStatus {
            error: Some("registering amd.com/gpu: kubelet.sock refused".into()),
            ..PluginStatus::default()
        };
        let found = problems(&Selection::None, &failing, None);
        assert_eq!(
            found,
            [Problem {
                event_reason: None,
                message: "device plugin: registering amd.com/gpu: kubelet.sock refused".into()
            }]
        );

        // A layout conflict is also the plugin's error line: reported once.
        let layout = LayoutConflict {
            profiles: [
                ("cpx_nps4".to_owned(), vec!["0000:05:00.0".to_owned()]),
                ("spx_nps1".to_owned(), vec!["0000:27:00.0".to_owned()]),
            ]
            .into(),
        };
        let with_layout = PluginStatus {
            error: Some(layout.to_string()),
            conflict: Some(layout),
            ..PluginStatus::default()
        };
        let found = problems(&Selection::None, &with_layout, None);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].event_reason, Some("PartitionLayoutConflict"));

        let found = problems(
            &Selection::None,
            &PluginStatus::default(),
            Some("line 1: bad"),
        );
        assert_eq!(found[0].event_reason, Some("MetricsConfigError"));
        assert!(found[0].message.ends_with("line 1: bad"));
    }
}
