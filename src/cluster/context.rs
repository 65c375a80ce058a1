//! What every leader step works with: the [`Context`] of a leadership term
//! (client, caches, lease guard, Event recorder, the term's memory), the
//! [`Error`] they return, and the lease-gated writes they share
//! ([`guarded`] Node writes, [`node_event_for`]). Below the reconciler and
//! the executors, which all import it; it must not import them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::events::SeriesRecorder;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::time::Instant;

use super::lease::LeaderGuard;
use super::term::{Remediations, Upgrades};
use super::upgrade::Timeouts;
use crate::api::DeviceConfig;
use crate::api::agent_status::ConfigKey;
use crate::node_writer::{NodeWriteError, NodeWriter};

/// How long a reconcile waits for the Node cache's first list before it
/// tries again later.
const NODES_LISTED_WITHIN: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("not the leader any more; write skipped")]
    NotLeader,
    /// The lease is held but close to its expiry: a write started now might
    /// land after a successor took over. Tried again after the renewal.
    #[error("the lease is about to be renewed; write postponed")]
    LeaseRenewalDue,
    #[error("{action} {object}: {source}")]
    Kube {
        action: &'static str,
        object: String,
        #[source]
        source: kube::Error,
    },
    #[error("driver upgrade of node {node}: {source}")]
    Node {
        node: String,
        #[source]
        source: Box<crate::node_writer::NodeWriteError>,
    },
    #[error("{config}: a node could not be released from its driver upgrade yet")]
    Release { config: String },
}

pub(super) fn kube_err(
    action: &'static str,
    object: impl Into<String>,
) -> impl FnOnce(kube::Error) -> Error {
    let object = object.into();
    move |source| Error::Kube {
        action,
        object,
        source,
    }
}

/// Everything a reconcile needs besides the DeviceConfig itself.
pub struct Context {
    pub client: Client,
    pub nodes: Store<Node>,
    pub configs: Store<DeviceConfig>,
    pub guard: LeaderGuard,
    pub recorder: SeriesRecorder,
    /// Minimum time between two status writes of one DeviceConfig.
    pub status_interval: Duration,
    /// How long deletion waits for agents on NotReady nodes to tear down.
    pub teardown_timeout: Duration,
    pub(super) last_status_write: Mutex<HashMap<ConfigKey, Instant>>,
    /// The selected Nodes' views, made once per Node version.
    pub(super) views: super::status::ViewMemo,
    /// Counts reconciles and writes, for tests, benchmarks and metrics.
    pub stats: Arc<Stats>,
    /// The owned Services the leader watches, and the namespace watched (`None`:
    /// all). Outside it, nothing is known and deletes are simply sent.
    pub owned_services: Option<(Store<Service>, Option<String>)>,
    /// The agents' namespace, where the metrics Service and ServiceMonitor
    /// of every DeviceConfig are kept (see [`resources::owned_namespace`]);
    /// `None`: each DeviceConfig's own.
    pub operator_namespace: Option<String>,
    /// Look up the Secrets a DeviceConfig names too (see
    /// [`super::ClusterConfig::check_secret_references`]).
    pub check_secret_references: bool,
    /// This term's driver upgrades: the records written.
    pub upgrades: Upgrades,
    /// This term's drains, of upgrades, partition changes and remediation.
    pub drains: super::drain::Drains,
    /// This term's remediation notices and pace.
    pub remediations: Remediations,
    /// The Node cache has finished its first list (see [`Context::nodes_ready`]).
    nodes_listed: std::sync::atomic::AtomicBool,
    /// The DRA DeviceClasses this term last made the operator's (their
    /// names), and when; `None` until it first looked. Spares a read per
    /// reconcile.
    pub(super) device_class: Mutex<Option<(Vec<String>, Instant)>>,
    /// The Node watch `nodes` is made from: which labels it holds, and the
    /// layouts DRA nodes report. `None` (a cache filled by hand, in tests):
    /// the cache holds every label, and the layouts are read from it.
    pub node_watch: Option<Arc<super::node_watch::NodeWatch>>,
}

#[derive(Debug, Default)]
pub struct Stats {
    pub reconciles: std::sync::atomic::AtomicU64,
    pub status_writes: std::sync::atomic::AtomicU64,
}

impl Context {
    pub fn new(
        client: Client,
        nodes: Store<Node>,
        configs: Store<DeviceConfig>,
        guard: LeaderGuard,
        recorder: SeriesRecorder,
    ) -> Self {
        // Without a caller's own (see `super::reconcile_until_cancelled`),
        // drains evict through the main client and wake nobody early.
        let (drains, _) = super::drain::Drains::new(client.clone());
        let upgrades = Upgrades::new(Timeouts::default());
        Self {
            client,
            nodes,
            configs,
            guard,
            recorder,
            status_interval: Duration::from_secs(1),
            teardown_timeout: Duration::from_secs(300),
            last_status_write: Mutex::new(HashMap::new()),
            views: super::status::ViewMemo::default(),
            stats: Arc::default(),
            owned_services: None,
            operator_namespace: None,
            check_secret_references: false,
            upgrades,
            drains,
            remediations: Remediations::default(),
            nodes_listed: std::sync::atomic::AtomicBool::new(false),
            device_class: Mutex::new(None),
            node_watch: None,
        }
    }

    /// True when the owned-Service cache covers `namespace`, has finished its
    /// first list, and holds no Service `name` there.
    pub(super) async fn service_known_absent(&self, namespace: &str, name: &str) -> bool {
        let Some((store, watched)) = &self.owned_services else {
            return false;
        };
        if watched.as_deref().is_some_and(|w| w != namespace) {
            return false;
        }
        let ready = tokio::time::timeout(Duration::from_secs(5), store.wait_until_ready()).await;
        matches!(ready, Ok(Ok(()))) && store.get(&ObjectRef::new(name).within(namespace)).is_none()
    }

    /// Waits (a bounded while) for the Node cache's first list; false when
    /// it has not come. Until then the cache holds only some Nodes, or none:
    /// status would count too few, teardown would wait for too few agents,
    /// and an upgrade would take every node it does not see for one that
    /// left.
    pub(super) async fn wait_for_nodes(&self) -> bool {
        if self.nodes_ready() {
            return true;
        }
        let listed = tokio::time::timeout(NODES_LISTED_WITHIN, self.nodes.wait_until_ready()).await;
        let ready = matches!(listed, Ok(Ok(())));
        self.nodes_listed
            .store(ready, std::sync::atomic::Ordering::Relaxed);
        ready
    }

    /// The writer of Node `name`, through the leader's client.
    pub fn node_writer(&self, name: &str) -> NodeWriter {
        NodeWriter::new(Api::all(self.client.clone()), name.to_owned())
    }

    /// The Node cache has finished its first list.
    pub fn nodes_ready(&self) -> bool {
        self.nodes_listed.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(super) fn check_leader(&self) -> Result<(), Error> {
        if self.guard.is_held() {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }

    /// Sends one leader write: only while the lease is held, and never past its
    /// local expiry. kube's client retries 429, 503 and 504 on its own, with
    /// backoff of up to minutes, and waits for as long as the server takes to
    /// answer; the deadline drops such a write once the lease has lapsed, since a
    /// standby may be leading by then.
    pub(super) async fn leader_write<T>(
        &self,
        action: &'static str,
        object: &(impl std::fmt::Display + ?Sized),
        write: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, Error> {
        let deadline = self.guard.deadline().ok_or(Error::NotLeader)?;
        match tokio::time::timeout_at(deadline, write).await {
            Ok(result) => result.map_err(kube_err(action, object.to_string())),
            Err(_) => Err(Error::NotLeader),
        }
    }

    /// Records an Event about `dc` (while leading).
    pub(super) async fn dc_event(
        &self,
        dc: &DeviceConfig,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        self.event(dc, type_, reason, note).await;
    }

    pub(super) async fn event(
        &self,
        dc: &DeviceConfig,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        let reference = dc.object_ref(&());
        let publish = self.recorder.publish(&event, &reference);
        match self
            .leader_write("recording an Event about", &ConfigKey::of(dc), publish)
            .await
        {
            Ok(()) => {}
            Err(Error::NotLeader) => tracing::debug!("Event dropped: not leading any more"),
            Err(e) => tracing::warn!(error = %e, "cannot record Event"),
        }
    }
}

/// How long before the lease's expiry no upgrade write is started: one that
/// is already sent is cut off at the expiry, but a write the server received
/// may still land after it, when a successor may already lead.
const LEASE_MARGIN: Duration = Duration::from_secs(2);

/// Runs one Node write while the lease is held, starting it only well
/// before the lease's expiry and cutting it off before it. The outer error
/// is leadership lost; the inner one the write's.
pub async fn guarded<T>(
    ctx: &Context,
    node: &str,
    write: impl Future<Output = Result<T, NodeWriteError>>,
) -> Result<Result<T, NodeWriteError>, Error> {
    let deadline = ctx.guard.deadline().ok_or(Error::NotLeader)?;
    let cutoff = deadline
        .checked_sub(LEASE_MARGIN)
        .filter(|c| *c > tokio::time::Instant::now())
        .ok_or(Error::LeaseRenewalDue)?;
    tracing::trace!(node, "upgrade write");
    tokio::time::timeout_at(cutoff, write).await.map_err(|_| {
        // Cut off, but the lease may well have been renewed meanwhile: try
        // again soon rather than wait for another change.
        if ctx.guard.is_held() {
            Error::LeaseRenewalDue
        } else {
            Error::NotLeader
        }
    })
}

pub fn node_error(node: &str, e: NodeWriteError) -> Error {
    Error::Node {
        node: node.to_owned(),
        source: Box::new(e),
    }
}

/// Records an Event about `node` for `action` (a failure is logged).
pub async fn node_event_for(
    ctx: &Context,
    node: &Node,
    action: &str,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: action.to_owned(),
        secondary: None,
    };
    let reference = node.object_ref(&());
    let Some(deadline) = ctx.guard.deadline() else {
        return;
    };
    match tokio::time::timeout_at(deadline, ctx.recorder.publish(&event, &reference)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(node = %node.name_any(), error = %e, "cannot record Event"),
        Err(_) => tracing::debug!("Event dropped: not leading any more"),
    }
}
