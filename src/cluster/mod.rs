//! The cluster role: one agent, elected through a Lease, reconciles DeviceConfigs
//! for the whole cluster. There is no separate controller Deployment.
//!
//! [`lease`] decides who leads; [`run`] starts kube-runtime's `Controller` when
//! this agent becomes leader and aborts it the moment leadership is lost, so no
//! leader work outlives the lease. The reconciler ([`reconcile`]) is fed by a
//! DeviceConfig watch and by Node changes that matter (labels, the agent status
//! annotation, conditions, unschedulable); heartbeat-only Node updates are
//! filtered out before they can trigger anything. It never requeues while all is
//! well.
//!
//! This module must not do node work: the agent on each node does that, and the
//! leader only reads what agents report.

pub mod context;
pub mod device_classes;
pub mod drain;
pub mod lease;
pub mod node_cache;
pub mod node_watch;
pub mod partitioner;
pub mod reconcile;
pub mod remediator;
pub mod resources;
pub mod status;
pub mod steps;
pub mod term;
pub mod upgrade;
pub mod upgrader;

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use crate::events::{Reporter, SeriesRecorder};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::api::DeviceConfig;
use crate::api::agent_status::STATUS_ANNOTATION;
use context::{Context, Stats};
use lease::LeaderGuard;
use reconcile::error_policy;
use term::{Remediations, Upgrades};

/// Tunables of the leader's reconciler.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Minimum time between two status writes of one DeviceConfig.
    pub status_interval: Duration,
    /// How long deletion waits for agents on NotReady nodes.
    pub teardown_timeout: Duration,
    /// Identity shown on Events.
    pub instance: String,
    /// The operator's namespace, where the agents run: the metrics Service
    /// (and ServiceMonitor) of every DeviceConfig lives there, since a
    /// Service selects pods of its own namespace only, and is watched there
    /// so that a deleted or edited one is put back at once; remediation's
    /// default drain leaves its pods alone. `None` (a leader without a
    /// Lease) takes each DeviceConfig's own namespace for it and watches
    /// owned Services in every namespace.
    pub namespace: Option<String>,
    /// The one namespace whose DeviceConfigs are followed (`--watch-namespace`,
    /// the agents' too); `None`, the default, follows every namespace.
    pub watch_namespace: Option<String>,
    /// Also report Secrets the DeviceConfig names that do not exist. Needs the
    /// optional Role in deploy/optional/ (the agents hold no right on Secrets
    /// by default); off, a missing Secret is reported where it is consumed.
    pub check_secret_references: bool,
    /// The time limits of each driver upgrade step (the drain's comes from
    /// the DeviceConfig's drain policy).
    pub upgrade_timeouts: upgrade::Timeouts,
    /// The pace of remediation's confirmation (two checks a minute apart
    /// within 15 minutes, as the reference's wait step).
    pub remediation_confirm: crate::remediation::plan::Confirm,
    /// The client drains evict through: one that does not retry on its own,
    /// so that a PodDisruptionBudget's refusal reaches the drain at once
    /// (see [`drain::drain`]). `None` evicts through the main client, whose
    /// retries hide such refusals for minutes.
    pub eviction_client: Option<EvictionClient>,
}

/// A client for evictions, made from the same configuration as the main
/// client with kube's own retries off.
#[derive(Clone)]
pub struct EvictionClient(pub Client);

impl std::fmt::Debug for EvictionClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EvictionClient")
    }
}

impl EvictionClient {
    /// The client for `config`, without kube's retries.
    pub fn from_config(mut config: kube::Config) -> Result<Self, kube::Error> {
        config.default_retry = false;
        Client::try_from(config).map(Self)
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            status_interval: Duration::from_secs(1),
            teardown_timeout: Duration::from_secs(300),
            instance: "gpu-operator".into(),
            namespace: None,
            watch_namespace: None,
            check_secret_references: false,
            upgrade_timeouts: upgrade::Timeouts::default(),
            remediation_confirm: crate::remediation::plan::Confirm::default(),
            eviction_client: None,
        }
    }
}

/// A hash of what in a Node matters to DeviceConfig status, driver
/// upgrades and partition changes: labels, the agent status annotation, the
/// upgrade and partition records,
/// condition statuses (not their heartbeat times), `unschedulable` and the
/// taints. Nodes whose hash did not change trigger no reconcile.
pub fn node_relevance(node: &Node) -> u64 {
    let mut hasher = DefaultHasher::new();
    node.labels().hash(&mut hasher);
    node.annotations().get(STATUS_ANNOTATION).hash(&mut hasher);
    for step in steps::STEPS {
        node.annotations()
            .get(step.record_annotation())
            .hash(&mut hasher);
    }
    let spec = node.spec.as_ref();
    spec.and_then(|s| s.unschedulable).hash(&mut hasher);
    for taint in spec.and_then(|s| s.taints.as_deref()).unwrap_or_default() {
        (&taint.key, &taint.value, &taint.effect).hash(&mut hasher);
    }
    if let Some(conditions) = node.status.as_ref().and_then(|s| s.conditions.as_ref()) {
        for c in conditions {
            (&c.type_, &c.status, &c.reason, &c.message).hash(&mut hasher);
        }
    }
    hasher.finish()
}

/// The Node changes that may change a DeviceConfig's status: a relevant change
/// ([`node_relevance`]) of a Node, and every Node that goes away. kube-runtime's
/// `predicate_filter` would drop deletions (a deleted Node hashes like its last
/// version), and a Node deleted while the watch was down only shows as missing
/// from the re-list; both must reconcile, or counts stay stale with no requeue.
pub fn relevant_node_changes<S>(events: S) -> impl Stream<Item = Result<Node, watcher::Error>>
where
    S: Stream<Item = Result<watcher::Event<Node>, watcher::Error>>,
{
    let mut seen: HashMap<String, u64> = HashMap::new();
    let mut relisted: Option<HashSet<String>> = None;
    events.filter_map(move |event| {
        let out = match event {
            Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                let name = node.name_any();
                if let Some(names) = relisted.as_mut() {
                    names.insert(name.clone());
                }
                let hash = node_relevance(&node);
                (seen.insert(name, hash) != Some(hash)).then_some(Ok(node))
            }
            Ok(watcher::Event::Delete(node)) => {
                seen.remove(&node.name_any());
                Some(Ok(node))
            }
            Ok(watcher::Event::Init) => {
                relisted = Some(HashSet::new());
                None
            }
            Ok(watcher::Event::InitDone) => {
                let present = relisted.take().unwrap_or_default();
                let gone: Vec<String> = seen
                    .keys()
                    .filter(|name| !present.contains(*name))
                    .cloned()
                    .collect();
                for name in &gone {
                    seen.remove(name);
                }
                // Any one of them stands for all: every Node change maps to
                // every DeviceConfig.
                gone.into_iter().next().map(|name| {
                    let mut node = Node::default();
                    node.metadata.name = Some(name);
                    Ok(node)
                })
            }
            Err(e) => Some(Err(e)),
        };
        futures::future::ready(out)
    })
}

/// The cluster role of one process: a campaign for the Lease, and the
/// reconciler that runs while it is held. Both `agent --leader-election` and
/// `leader` start it through [`ClusterRole::start`].
pub struct ClusterRole {
    election: lease::Election,
    /// Aborted when dropped: the role never outlives its caller.
    task: tokio_util::task::AbortOnDropHandle<()>,
}

impl ClusterRole {
    /// Campaigns for `lease` and leads while it holds it, until `shutdown`.
    /// The operator's own namespace is where its Lease lives, and where the
    /// leader's owned objects are watched unless `config` says otherwise.
    pub fn start(
        client: Client,
        lease: lease::LeaseConfig,
        mut config: ClusterConfig,
        shutdown: CancellationToken,
    ) -> Self {
        config
            .namespace
            .get_or_insert_with(|| lease.namespace.clone());
        let election = lease::Election::start(client.clone(), lease, shutdown.child_token());
        let task = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(run(
            client,
            config,
            election.leading.clone(),
            election.guard.clone(),
            shutdown.child_token(),
        )));
        Self { election, task }
    }

    /// Waits for the reconciler to end (it does once `shutdown` fires), then
    /// for the election to release the Lease.
    pub async fn finished(self) {
        if let Err(e) = self.task.await {
            tracing::warn!(error = %e, "the cluster role ended abnormally");
        }
        self.election.finished().await;
    }

    /// Stops the reconciler at once (no leader write outlives its Lease
    /// anyway), then waits for the election to release the Lease, so that a
    /// standby takes over without waiting for it to expire.
    pub async fn stop(self) {
        self.task.abort();
        self.election.finished().await;
    }
}

/// Runs the reconciler whenever `leading` is true, until `shutdown`. Returns the
/// counters of the last leadership term's reconciler (for tests and benchmarks).
pub async fn run(
    client: Client,
    config: ClusterConfig,
    mut leading: watch::Receiver<bool>,
    guard: LeaderGuard,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            held = leading.wait_for(|l| *l) => if held.is_err() { return },
        }
        tracing::info!("leading: starting the DeviceConfig reconciler");
        let stats = Arc::new(Stats::default());
        let term = tokio::spawn(reconcile_until_cancelled(
            client.clone(),
            config.clone(),
            guard.clone(),
            stats,
        ));
        tokio::select! {
            _ = shutdown.cancelled() => {
                term.abort();
                return;
            }
            _ = leading.wait_for(|l| !*l) => {}
        }
        // Leadership lost: stop at once. Writes in flight were checked against the
        // guard before they were sent; nothing new is sent after this.
        term.abort();
        // The next leader counts the upgrade's nodes.
        crate::counters::clear_upgrade_nodes();
        tracing::warn!("no longer leading: reconciler stopped");
    }
}

/// Runs the Controller until the task is aborted.
pub async fn reconcile_until_cancelled(
    client: Client,
    config: ClusterConfig,
    guard: LeaderGuard,
    stats: Arc<Stats>,
) {
    let device_configs: Api<DeviceConfig> = match &config.watch_namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    // The leader keeps every Node of the cluster in memory: only what its
    // decisions read (see `node_cache`), and of the labels those the
    // DeviceConfigs' selectors name (see `node_watch`), which follows the
    // DeviceConfigs for it. Otherwise what `Controller::new` makes.
    let node_watch = Arc::new(node_watch::NodeWatch::default());
    let (configs, configs_writer) = reflector::store::<DeviceConfig>();
    let config_events = reflector::reflector(
        configs_writer,
        watcher::watcher(device_configs, watcher::Config::default()),
    )
    .inspect({
        let node_watch = node_watch.clone();
        move |event| {
            if let Ok(event) = event {
                node_watch.follow_configs(event);
            }
        }
    })
    .applied_objects();
    let controller = Controller::for_stream(config_events, configs.clone())
        .with_config(controller::Config::default().debounce(Duration::from_millis(200)));

    let (nodes, node_writer) = reflector::store::<Node>();
    let node_events = node_watch
        .events(
            Api::<Node>::all(client.clone()),
            configs.clone(),
            node_writer,
        )
        .default_backoff();
    let node_events = relevant_node_changes(node_events);
    let recorder = SeriesRecorder::new(
        client.clone(),
        Reporter {
            controller: "gpu-operator".into(),
            instance: Some(config.instance.clone()),
        },
    );
    // Owned Services, selected by label, cached: one deleted or edited by hand
    // reconciles its DeviceConfig, which applies it again, and the cache spares
    // a DELETE per reconcile when metrics are off and there is nothing to delete.
    let services_api: Api<Service> = match &config.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (services, services_writer) = reflector::store::<Service>();
    let service_events = reflector::reflector(
        services_writer,
        watcher::watcher(
            services_api,
            watcher::Config::default().labels(&resources::owned_label_selector()),
        ),
    )
    .default_backoff()
    .touched_objects();
    let eviction_client = config
        .eviction_client
        .clone()
        .map_or_else(|| client.clone(), |c| c.0);
    let (drains, drain_moved) = drain::Drains::new(eviction_client);
    let mut context = Context::new(client, nodes, configs.clone(), guard, recorder);
    context.upgrades = Upgrades::new(config.upgrade_timeouts);
    context.drains = drains;
    context.remediations = Remediations::new(config.remediation_confirm);
    context.status_interval = config.status_interval;
    context.teardown_timeout = config.teardown_timeout;
    context.stats = stats;
    context.owned_services = Some((services, config.namespace.clone()));
    context.operator_namespace = config.namespace.clone();
    context.check_secret_references = config.check_secret_references;
    context.node_watch = Some(node_watch.clone());
    let mapper_configs = configs.clone();
    controller
        // Each owned Service back to its DeviceConfig: by owner reference, or
        // for a DeviceConfig elsewhere than the agents' namespace (no owner
        // reference crosses namespaces) by its annotation.
        .watches_stream(service_events, |service: Service| {
            resources::owner_of(&service.metadata)
        })
        // A drain that ended, or is stuck on something new, moves its upgrade.
        .reconcile_on(drain_moved)
        // A list that holds the labels a DeviceConfig waited for.
        .reconcile_all_on(node_watch.label_lists())
        .watches_stream(node_events, move |_node: Node| {
            // Any relevant Node change may change which DeviceConfigs select it and
            // what their status says; there are few DeviceConfigs.
            mapper_configs
                .state()
                .iter()
                .map(|dc| ObjectRef::from_obj(dc.as_ref()))
                .collect::<Vec<_>>()
        })
        .run(reconcile::reconcile, error_policy, Arc::new(context))
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile error");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn node(heartbeat: i64, ready: &str) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some("n".into());
        node.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                last_heartbeat_time: Some(Time(
                    k8s_openapi::jiff::Timestamp::from_second(heartbeat).unwrap(),
                )),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        });
        node
    }

    #[tokio::test]
    async fn deletions_and_nodes_missing_from_a_relist_are_relevant() {
        use watcher::Event::*;
        let named = |name: &str, heartbeat: i64| {
            let mut n = node(heartbeat, "True");
            n.metadata.name = Some(name.into());
            n
        };
        let mut labelled = named("a", 3);
        labelled.labels_mut().insert("x".into(), "y".into());
        let events = vec![
            Init,
            InitApply(named("a", 1)),
            InitApply(named("b", 1)),
            InitDone,
            Apply(named("a", 2)),  // heartbeat only: dropped
            Apply(labelled),       // relevant
            Delete(named("b", 2)), // deleted: relevant though unchanged
            Init,                  // a re-list after the watch broke...
            InitApply(named("c", 1)),
            InitDone, // ...in which "a" is gone
        ];
        let out: Vec<String> =
            relevant_node_changes(futures::stream::iter(events.into_iter().map(Ok)))
                .map(|n| n.unwrap().name_any())
                .collect()
                .await;
        assert_eq!(out, ["a", "b", "a", "b", "c", "a"]);
    }

    #[test]
    fn heartbeats_are_not_relevant_but_readiness_labels_and_status_are() {
        let base = node(1, "True");
        assert_eq!(node_relevance(&base), node_relevance(&node(99, "True")));
        assert_ne!(node_relevance(&base), node_relevance(&node(1, "False")));
        let mut labelled = base.clone();
        labelled.labels_mut().insert("a".into(), "b".into());
        assert_ne!(node_relevance(&base), node_relevance(&labelled));
        let mut annotated = base.clone();
        annotated
            .annotations_mut()
            .insert(STATUS_ANNOTATION.into(), "{}".into());
        assert_ne!(node_relevance(&base), node_relevance(&annotated));
        let mut other_annotation = base.clone();
        other_annotation
            .annotations_mut()
            .insert("unrelated".into(), "x".into());
        assert_eq!(node_relevance(&base), node_relevance(&other_annotation));
        let mut cordoned = base.clone();
        cordoned
            .spec
            .get_or_insert_with(Default::default)
            .unschedulable = Some(true);
        assert_ne!(node_relevance(&base), node_relevance(&cordoned));
    }
}
