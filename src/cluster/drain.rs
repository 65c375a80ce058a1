//! Draining a node of the pods that use its GPUs: the one drain that driver
//! upgrades use, and that remediation and repartitioning are to use.
//!
//! A GPU pod is a pod on the node that requests an `amd.com/*` resource, holds
//! a DRA claim allocated by `gpu.amd.com`, or mounts `/dev/dri` or `/dev/kfd`
//! from the host. DaemonSet pods (our own agent among them), mirror pods and
//! pods in `ignoreNamespaces` are left alone, as are pods that already ended.
//!
//! [`pod_facts`] reduces a Pod to what the decision needs; [`next_step`] is the
//! decision, pure: remove these pods, wait for those, done, or failed and why
//! (the PodDisruptionBudget that refuses an eviction, a pod no controller would
//! recreate, a pod that will not terminate). [`drain`] carries it out through
//! the Eviction API (so budgets hold) or by deletion, per the policy, and
//! reports what blocked it.
//!
//! [`Drains`] runs them: one task per node a leadership term drains, for a
//! driver upgrade, a partition change or a remediation ([`Purpose`]), whose
//! end wakes the reconciler.
//!
//! This module must not cordon or taint (the caller's step) and must not
//! decide which node to drain.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{DeleteParams, EvictParams, ListParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client};
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio_util::task::AbortOnDropHandle;

use super::lease::LeaderGuard;
use crate::api::agent_status::ConfigKey;
use crate::api::{DeviceConfig, DrainSpec, DriverUpgradePolicySpec, PodDeletionSpec};

/// The DRA driver name whose claims mark a pod as a GPU pod.
pub const DRA_DRIVER: &str = "gpu.amd.com";
/// The extended-resource prefix of GPU requests (`amd.com/gpu`, partitions).
pub const RESOURCE_PREFIX: &str = "amd.com/";
/// Host paths whose mount gives a pod the GPUs without a resource request.
pub const DEVICE_PATHS: [&str; 2] = ["/dev/dri", "/dev/kfd"];
/// How long [`drain`] waits before it looks at the node's pods again while
/// something is still to go (an eviction refused, a pod terminating).
pub const RECHECK_AFTER: Duration = Duration::from_secs(2);

/// How pods are removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Removal {
    /// The Eviction API: PodDisruptionBudgets are respected.
    Evict,
    /// Plain deletion (`podDeletionPolicy`): budgets do not apply.
    Delete,
}

/// What a drain may do, from `nodeDrainPolicy` or `podDeletionPolicy`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DrainPolicy {
    pub removal: Removal,
    /// Remove pods that no controller would recreate too.
    pub force: bool,
    /// Give up after this long; `None` waits as long as it takes.
    pub timeout: Option<Duration>,
    /// Termination grace period; `None` keeps each pod's own.
    pub grace_period_seconds: Option<u32>,
    pub ignore_namespaces: BTreeSet<String>,
    /// Only these pods, when set: a GPU reset evicts just the pods that
    /// hold the one faulty GPU.
    pub only: Option<BTreeSet<PodKey>>,
}

impl DrainPolicy {
    /// The drain an upgrade policy asks for: `nodeDrainPolicy` wins over
    /// `podDeletionPolicy`, as the API documents; with neither, a drain with
    /// the defaults of `nodeDrainPolicy`.
    pub fn of_upgrade(policy: &DriverUpgradePolicySpec) -> Self {
        match (&policy.node_drain_policy, &policy.pod_deletion_policy) {
            (Some(drain), _) => Self::of_drain(drain),
            (None, Some(deletion)) => Self::of_deletion(deletion),
            (None, None) => Self::of_drain(&DrainSpec::default()),
        }
    }

    pub fn of_drain(spec: &DrainSpec) -> Self {
        Self {
            removal: Removal::Evict,
            force: spec.force,
            timeout: timeout(spec.timeout_seconds),
            grace_period_seconds: grace(spec.grace_period_seconds),
            ignore_namespaces: spec.ignore_namespaces.iter().cloned().collect(),
            only: None,
        }
    }

    pub fn of_deletion(spec: &PodDeletionSpec) -> Self {
        Self {
            removal: Removal::Delete,
            force: spec.force,
            timeout: timeout(spec.timeout_seconds),
            grace_period_seconds: grace(spec.grace_period_seconds),
            ignore_namespaces: BTreeSet::new(),
            only: None,
        }
    }
}

/// `0` (and anything not positive) waits forever, as the API documents.
fn timeout(seconds: i64) -> Option<Duration> {
    u64::try_from(seconds)
        .ok()
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
}

/// A negative grace period keeps the pod's own.
fn grace(seconds: i64) -> Option<u32> {
    u32::try_from(seconds).ok()
}

/// Namespace and name.
pub type PodKey = (String, String);

/// Why a pod counts as a GPU pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum GpuUse {
    Resource(String),
    Claim(String),
    DeviceMount(String),
}

/// What the drain decision needs to know of a pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PodFacts {
    pub namespace: String,
    pub name: String,
    pub gpu: Option<GpuUse>,
    pub daemon_set: bool,
    pub mirror: bool,
    /// Some controller (ReplicaSet, Job, StatefulSet…) would recreate it.
    pub controlled: bool,
    /// Deletion already asked for.
    pub terminating: bool,
    /// Succeeded or Failed: it holds no devices any more.
    pub finished: bool,
}

impl PodFacts {
    pub fn key(&self) -> PodKey {
        (self.namespace.clone(), self.name.clone())
    }
}

/// Reduces a Pod to [`PodFacts`]. `gpu_claims` holds the `(namespace, claim)`
/// pairs of ResourceClaims allocated by [`DRA_DRIVER`].
pub fn pod_facts(pod: &Pod, gpu_claims: &BTreeSet<PodKey>) -> PodFacts {
    let meta = &pod.metadata;
    let namespace = meta.namespace.clone().unwrap_or_default();
    let owners = meta.owner_references.as_deref().unwrap_or_default();
    let controller = owners.iter().find(|o| o.controller == Some(true));
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    PodFacts {
        gpu: gpu_use(pod, &namespace, gpu_claims),
        daemon_set: controller.is_some_and(|o| o.kind == "DaemonSet"),
        mirror: meta
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror")),
        controlled: controller.is_some(),
        terminating: meta.deletion_timestamp.is_some(),
        finished: matches!(phase, Some("Succeeded" | "Failed")),
        name: meta.name.clone().unwrap_or_default(),
        namespace,
    }
}

fn gpu_use(pod: &Pod, namespace: &str, gpu_claims: &BTreeSet<PodKey>) -> Option<GpuUse> {
    let spec = pod.spec.as_ref()?;
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for container in containers {
        let resources = container.resources.as_ref();
        let requested = resources
            .into_iter()
            .flat_map(|r| r.requests.iter().chain(r.limits.iter()))
            .flat_map(|m| m.keys());
        if let Some(name) = requested
            .into_iter()
            .find(|name| name.starts_with(RESOURCE_PREFIX))
        {
            return Some(GpuUse::Resource(name.clone()));
        }
    }
    // A pod's claim is named in its status (generated claims) or is the
    // ResourceClaim named in its spec.
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_deref())
        .unwrap_or_default();
    for claim in spec.resource_claims.iter().flatten() {
        let generated = statuses
            .iter()
            .find(|s| s.name == claim.name)
            .and_then(|s| s.resource_claim_name.clone());
        let Some(claim_name) = generated.or_else(|| claim.resource_claim_name.clone()) else {
            continue;
        };
        if gpu_claims.contains(&(namespace.to_owned(), claim_name.clone())) {
            return Some(GpuUse::Claim(claim_name));
        }
    }
    spec.volumes
        .iter()
        .flatten()
        .filter_map(|v| v.host_path.as_ref())
        .map(|h| h.path.trim_end_matches('/'))
        // All of /dev gives the GPUs as well.
        .find(|path| {
            *path == "/dev"
                || DEVICE_PATHS.iter().any(|dev| {
                    path == dev || path.strip_prefix(dev).is_some_and(|r| r.starts_with('/'))
                })
        })
        .map(|path| GpuUse::DeviceMount(path.to_owned()))
}

/// What keeps a pod on the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Blocker {
    /// No controller would recreate it, and the policy does not force.
    NoController,
    /// An eviction was refused by this PodDisruptionBudget.
    DisruptionBudget { budget: String },
    /// Deletion was asked for; the pod has not gone yet.
    Terminating,
    /// The API server refused the removal otherwise.
    Refused { message: String },
}

impl std::fmt::Display for Blocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Blocker::NoController => write!(f, "no controller would recreate it (force is off)"),
            Blocker::DisruptionBudget { budget } => {
                write!(f, "the PodDisruptionBudget {budget} refuses its eviction")
            }
            Blocker::Terminating => write!(f, "it is still terminating"),
            Blocker::Refused { message } => write!(f, "its removal was refused: {message}"),
        }
    }
}

/// One pod and what keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Blocked {
    pub namespace: String,
    pub name: String,
    pub blocker: Blocker,
}

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pod {}/{}: {}", self.namespace, self.name, self.blocker)
    }
}

/// The decision of one look at the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Next {
    /// Ask for these pods' removal.
    Remove(Vec<PodKey>),
    /// Look again after [`RECHECK_AFTER`]; these are still there.
    Wait(Vec<Blocked>),
    /// No GPU pod is left.
    Done,
    /// Give up: these pods stay.
    Failed(Vec<Blocked>),
}

/// The pods the drain must remove: GPU pods that are not DaemonSet or mirror
/// pods, not in an ignored namespace, not finished, and among
/// [`DrainPolicy::only`] when it is set.
pub fn to_drain<'a>(pods: &'a [PodFacts], policy: &DrainPolicy) -> Vec<&'a PodFacts> {
    pods.iter()
        .filter(|p| p.gpu.is_some() && !p.daemon_set && !p.mirror && !p.finished)
        .filter(|p| !policy.ignore_namespaces.contains(&p.namespace))
        .filter(|p| {
            policy
                .only
                .as_ref()
                .is_none_or(|only| only.contains(&p.key()))
        })
        .collect()
}

/// A removal the API server refused, and when (time since the drain began).
pub type Refusals = BTreeMap<PodKey, (Blocker, Duration)>;

/// Decides the next step. `refused` holds the last refusal of each pod; a
/// refused pod is asked for again [`RECHECK_AFTER`] later (a budget allows
/// an eviction once other pods are back). `elapsed` is the time since the
/// drain began.
pub fn next_step(
    pods: &[PodFacts],
    policy: &DrainPolicy,
    refused: &Refusals,
    elapsed: Duration,
) -> Next {
    let left = to_drain(pods, policy);
    if left.is_empty() {
        return Next::Done;
    }
    let blocked = |p: &PodFacts, blocker: Blocker| Blocked {
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        blocker,
    };
    // A pod nothing would recreate is never removed without force: kubectl
    // drain refuses at once rather than wait, and so does this.
    let orphans: Vec<Blocked> = left
        .iter()
        .filter(|p| !p.controlled && !policy.force && !p.terminating)
        .map(|p| blocked(p, Blocker::NoController))
        .collect();
    if !orphans.is_empty() {
        return Next::Failed(orphans);
    }
    let still: Vec<Blocked> = left
        .iter()
        .map(|p| {
            let why = if p.terminating {
                Blocker::Terminating
            } else {
                refused
                    .get(&p.key())
                    .map_or(Blocker::Terminating, |(why, _)| why.clone())
            };
            blocked(p, why)
        })
        .collect();
    if policy.timeout.is_some_and(|t| elapsed >= t) {
        return Next::Failed(still);
    }
    let removable: Vec<PodKey> = left
        .iter()
        .filter(|p| !p.terminating)
        .filter(|p| {
            refused
                .get(&p.key())
                .is_none_or(|(_, at)| elapsed.saturating_sub(*at) >= RECHECK_AFTER)
        })
        .map(|p| p.key())
        .collect();
    if removable.is_empty() {
        Next::Wait(still)
    } else {
        Next::Remove(removable)
    }
}

/// How a drain ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DrainReport {
    /// Removals asked for (evictions or deletions), counting repeats.
    pub removals: u32,
    /// Why it failed; empty when it succeeded.
    pub blocked: Vec<Blocked>,
}

impl DrainReport {
    pub fn succeeded(&self) -> bool {
        self.blocked.is_empty()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("listing the pods of node {node}: {source}")]
    List {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("not the leader any more; the drain of node {node} stopped")]
    NotLeader { node: String },
}

/// Drains `node` per `policy`: looks at its pods, removes what
/// [`next_step`] says, and looks again every [`RECHECK_AFTER`] until it is
/// done or has failed. An error is returned only when the pods cannot be
/// listed, or when leadership is lost (`guard`: a removal is a leader
/// write, never sent past the lease); refusals are the report's. While it
/// waits, `on_wait` is told what keeps the pods that are still there.
///
/// `client` must not retry on its own (`kube::Config::default_retry` off):
/// a budget refuses an eviction with 429, which kube's default retry would
/// repeat with a backoff of minutes, hiding the refusal from this loop and
/// overrunning the drain's timeout.
pub async fn drain(
    client: &Client,
    node: &str,
    policy: &DrainPolicy,
    guard: &LeaderGuard,
    mut on_wait: impl FnMut(&[Blocked]),
) -> Result<DrainReport, DrainError> {
    let started = tokio::time::Instant::now();
    let mut report = DrainReport {
        removals: 0,
        blocked: Vec::new(),
    };
    let mut refused = Refusals::new();
    loop {
        let pods = node_pods(client, node).await?;
        let claims = gpu_claims(client, &pods).await;
        let facts: Vec<PodFacts> = pods.iter().map(|p| pod_facts(p, &claims)).collect();
        match next_step(&facts, policy, &refused, started.elapsed()) {
            Next::Done => return Ok(report),
            Next::Failed(blocked) => {
                report.blocked = blocked;
                return Ok(report);
            }
            Next::Remove(keys) => {
                for (namespace, name) in keys {
                    let not_leader = || DrainError::NotLeader {
                        node: node.to_owned(),
                    };
                    let deadline = guard.deadline().ok_or_else(not_leader)?;
                    report.removals += 1;
                    let removal = remove(client, &namespace, &name, policy);
                    let removed = tokio::time::timeout_at(deadline, removal)
                        .await
                        .map_err(|_| not_leader())?;
                    if let Err(blocker) = removed {
                        tracing::info!(node, pod = %format!("{namespace}/{name}"), %blocker, "GPU pod not removed yet");
                        refused.insert((namespace, name), (blocker, started.elapsed()));
                    }
                }
                continue;
            }
            Next::Wait(blocked) => {
                on_wait(&blocked);
                let pause = match policy.timeout {
                    Some(t) => RECHECK_AFTER.min(t.saturating_sub(started.elapsed())),
                    None => RECHECK_AFTER,
                };
                tokio::time::sleep(pause.max(Duration::from_millis(10))).await;
            }
        }
    }
}

async fn node_pods(client: &Client, node: &str) -> Result<Vec<Pod>, DrainError> {
    let pods: Api<Pod> = Api::all(client.clone());
    let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
    pods.list(&params)
        .await
        .map(|list| list.items)
        .map_err(|source| DrainError::List {
            node: node.to_owned(),
            source,
        })
}

/// Claims allocated by [`DRA_DRIVER`], in the namespaces of `pods` that
/// hold claims at all: most drains list none. A cluster that does not serve
/// the DRA API (or refuses to list it) has none.
async fn gpu_claims(client: &Client, pods: &[Pod]) -> BTreeSet<PodKey> {
    let namespaces: BTreeSet<&str> = pods
        .iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .is_some_and(|s| s.resource_claims.as_ref().is_some_and(|c| !c.is_empty()))
        })
        .filter_map(|p| p.metadata.namespace.as_deref())
        .collect();
    let mut found = BTreeSet::new();
    for namespace in namespaces {
        let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), namespace);
        let Ok(list) = claims.list(&ListParams::default()).await else {
            continue;
        };
        found.extend(
            list.items
                .iter()
                .filter(|c| {
                    c.status
                        .as_ref()
                        .and_then(|s| s.allocation.as_ref())
                        .and_then(|a| a.devices.as_ref())
                        .and_then(|d| d.results.as_ref())
                        .is_some_and(|results| results.iter().any(|r| r.driver == DRA_DRIVER))
                })
                .filter_map(|c| c.metadata.name.clone())
                .map(|name| (namespace.to_owned(), name)),
        );
    }
    found
}

/// Asks for one pod's removal. A pod already gone counts as removed.
async fn remove(
    client: &Client,
    namespace: &str,
    name: &str,
    policy: &DrainPolicy,
) -> Result<(), Blocker> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let delete = DeleteParams {
        grace_period_seconds: policy.grace_period_seconds,
        ..DeleteParams::default()
    };
    let result = match policy.removal {
        Removal::Evict => pods
            .evict(
                name,
                &EvictParams {
                    delete_options: Some(delete),
                    ..EvictParams::default()
                },
            )
            .await
            .map(drop),
        Removal::Delete => pods.delete(name, &delete).await.map(drop),
    };
    match result {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 429 => Err(budget_of(&status)
            .map(|budget| Blocker::DisruptionBudget { budget })
            .unwrap_or(Blocker::Refused {
                message: status.message.clone(),
            })),
        Err(e) => Err(Blocker::Refused {
            message: e.to_string(),
        }),
    }
}

/// The budget an eviction refusal names: the API server's cause reads "The
/// disruption budget NAME needs …".
fn budget_of(status: &kube::core::Status) -> Option<String> {
    status
        .details
        .as_ref()?
        .causes
        .iter()
        .filter(|c| c.reason == "DisruptionBudget")
        .find_map(|c| {
            c.message
                .strip_prefix("The disruption budget ")
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_owned)
        })
}

// ---------------------------------------------------------------------------
// The runner: the drains one leadership term runs, one per node, for the
// driver upgrades, partition changes and remediation alike.

/// How a drain of a node stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum DrainOutcome {
    Running,
    Done,
    Failed(String),
}

/// What a drain is for: one node is drained for one change at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    Upgrade,
    Partition,
    Remediation,
}

/// A drain this leader runs for one node.
struct RunningDrain {
    config: ConfigKey,
    purpose: Purpose,
    progress: watch::Receiver<DrainProgress>,
    _task: AbortOnDropHandle<()>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum DrainProgress {
    /// Still going; what keeps the pods that are left, when it waits.
    Running(Vec<String>),
    Done,
    Failed(String),
}

/// The drains of one leadership term, and how a drain that moves wakes the
/// reconciler.
pub struct Drains {
    /// Evictions go through a client that does not retry (see [`drain`]).
    eviction_client: Client,
    trigger: mpsc::UnboundedSender<ObjectRef<DeviceConfig>>,
    drains: Mutex<HashMap<String, RunningDrain>>,
}

impl Drains {
    /// The drains of a new term, and the stream of DeviceConfigs to
    /// reconcile because one of their drains moved.
    pub fn new(
        eviction_client: Client,
    ) -> (
        Self,
        impl futures::Stream<Item = ObjectRef<DeviceConfig>> + use<>,
    ) {
        let (trigger, rx) = mpsc::unbounded_channel();
        let drains = Self {
            eviction_client,
            trigger,
            drains: Mutex::new(HashMap::new()),
        };
        (
            drains,
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
        )
    }

    /// How `config`'s drain of `node` for `purpose` stands, if it runs one.
    pub fn outcome(
        &self,
        config: &ConfigKey,
        purpose: Purpose,
        node: &str,
    ) -> Option<(DrainOutcome, Vec<String>)> {
        let drains = self.drains.lock().ok()?;
        let drain = drains
            .get(node)
            .filter(|d| d.config == *config && d.purpose == purpose)?;
        let progress = drain.progress.borrow().clone();
        Some(match progress {
            DrainProgress::Running(blocked) => (DrainOutcome::Running, blocked),
            DrainProgress::Done => (DrainOutcome::Done, Vec::new()),
            DrainProgress::Failed(why) => (DrainOutcome::Failed(why), Vec::new()),
        })
    }

    /// Starts draining `node` for `purpose` unless a drain of it runs already.
    pub fn start(
        &self,
        guard: &LeaderGuard,
        dc: &DeviceConfig,
        purpose: Purpose,
        node: &str,
        policy: DrainPolicy,
    ) {
        let Ok(mut drains) = self.drains.lock() else {
            return;
        };
        if drains.contains_key(node) {
            return;
        }
        let (tx, progress) = watch::channel(DrainProgress::Running(Vec::new()));
        let (client, guard, trigger) = (
            self.eviction_client.clone(),
            guard.clone(),
            self.trigger.clone(),
        );
        let wake = ObjectRef::from_obj(dc);
        let name = node.to_owned();
        let task = tokio::spawn(async move {
            tracing::info!(node = %name, "draining the node's GPU pods");
            let on_wait = |blocked: &[Blocked]| {
                let now: Vec<String> = blocked.iter().map(ToString::to_string).collect();
                let changed = tx.send_if_modified(|p| {
                    let differs = *p != DrainProgress::Running(now.clone());
                    *p = DrainProgress::Running(now.clone());
                    differs
                });
                if changed {
                    let _ = trigger.send(wake.clone());
                }
            };
            let ended = match drain(&client, &name, &policy, &guard, on_wait).await {
                Ok(report) if report.succeeded() => DrainProgress::Done,
                Ok(report) => DrainProgress::Failed(format!(
                    "the drain gave up: {}",
                    report
                        .blocked
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                )),
                Err(e) => DrainProgress::Failed(e.to_string()),
            };
            tracing::info!(node = %name, outcome = ?ended, "drain ended");
            tx.send_replace(ended);
            let _ = trigger.send(wake);
        });
        drains.insert(
            node.to_owned(),
            RunningDrain {
                config: ConfigKey::of(dc),
                purpose,
                progress,
                _task: AbortOnDropHandle::new(task),
            },
        );
    }

    /// Stops and forgets the drains of `config` for `purpose` but those of
    /// `draining`.
    pub fn prune(&self, config: &ConfigKey, purpose: Purpose, draining: &[String]) {
        if let Ok(mut drains) = self.drains.lock() {
            drains.retain(|node, d| {
                d.config != *config || d.purpose != purpose || draining.contains(node)
            });
        }
    }

    /// Stops the drain of `node` for `purpose`, if one runs.
    pub fn stop(&self, node: &str, purpose: Purpose) {
        if let Ok(mut drains) = self.drains.lock() {
            drains.retain(|n, d| n != node || d.purpose != purpose);
        }
    }

    /// Stops every drain of `config`: its changes stopped applying.
    pub fn stop_all(&self, config: &ConfigKey) {
        self.prune(config, Purpose::Upgrade, &[]);
        self.prune(config, Purpose::Partition, &[]);
        self.prune(config, Purpose::Remediation, &[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).expect("a valid Pod")
    }

    fn gpu_pod(name: &str, owner: Option<&str>) -> PodFacts {
        PodFacts {
            namespace: "ml".into(),
            name: name.into(),
            gpu: Some(GpuUse::Resource("amd.com/gpu".into())),
            daemon_set: owner == Some("DaemonSet"),
            mirror: false,
            controlled: owner.is_some(),
            terminating: false,
            finished: false,
        }
    }

    fn policy() -> DrainPolicy {
        DrainPolicy::of_drain(&DrainSpec::default())
    }

    #[test]
    fn gpu_pods_are_found_by_request_claim_or_device_mount() {
        let claims = BTreeSet::from([("ml".to_owned(), "train-gpu-abc".to_owned())]);
        let cases = [
            (
                json!({"metadata": {"name": "a", "namespace": "ml"}, "spec": {"containers": [
                    {"name": "c", "resources": {"limits": {"amd.com/gpu": "1"}}}]}}),
                Some(GpuUse::Resource("amd.com/gpu".into())),
            ),
            (
                json!({"metadata": {"name": "b", "namespace": "ml"}, "spec": {
                    "containers": [{"name": "c"}],
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
                    "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "train-gpu-abc"}]}}),
                Some(GpuUse::Claim("train-gpu-abc".into())),
            ),
            (
                json!({"metadata": {"name": "c", "namespace": "ml"}, "spec": {
                    "containers": [{"name": "c"}],
                    "volumes": [{"name": "kfd", "hostPath": {"path": "/dev/kfd"}}]}}),
                Some(GpuUse::DeviceMount("/dev/kfd".into())),
            ),
            (
                json!({"metadata": {"name": "d", "namespace": "ml"}, "spec": {
                    "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                    "resourceClaims": [{"name": "other", "resourceClaimName": "someone-elses"}],
                    "volumes": [{"name": "logs", "hostPath": {"path": "/var/log"}}]}}),
                None,
            ),
        ];
        for (value, want) in cases {
            let facts = pod_facts(&pod(value), &claims);
            assert_eq!(facts.gpu, want, "{}", facts.name);
        }
    }

    #[test]
    fn daemon_set_mirror_finished_and_ignored_pods_stay() {
        let mut policy = policy();
        policy.ignore_namespaces.insert("infra".into());
        let mut in_infra = gpu_pod("infra-job", Some("Job"));
        in_infra.namespace = "infra".into();
        let mut mirror = gpu_pod("static", None);
        mirror.mirror = true;
        let mut done = gpu_pod("done", None);
        done.finished = true;
        let mut no_gpu = gpu_pod("web", Some("ReplicaSet"));
        no_gpu.gpu = None;
        let pods = vec![
            gpu_pod("agent", Some("DaemonSet")),
            in_infra,
            mirror,
            done,
            no_gpu,
        ];
        assert_eq!(
            next_step(&pods, &policy, &Refusals::new(), Duration::ZERO),
            Next::Done
        );
    }

    #[test]
    fn a_drain_limited_to_some_pods_removes_only_those() {
        let mut policy = policy();
        let pods = vec![gpu_pod("train", Some("Job")), gpu_pod("infer", Some("Job"))];
        policy.only = Some(BTreeSet::from([("ml".to_owned(), "train".to_owned())]));
        let Next::Remove(keys) = next_step(&pods, &policy, &Refusals::new(), Duration::ZERO) else {
            panic!("the listed pod is to go");
        };
        assert_eq!(keys, [("ml".to_owned(), "train".to_owned())]);
        policy.only = Some(BTreeSet::new());
        assert_eq!(
            next_step(&pods, &policy, &Refusals::new(), Duration::ZERO),
            Next::Done,
            "no pod on the GPU: nothing to drain"
        );
    }

    #[test]
    fn a_pod_nothing_would_recreate_fails_the_drain_at_once_unless_forced() {
        let pods = vec![gpu_pod("bare", None), gpu_pod("train", Some("Job"))];
        let Next::Failed(blocked) = next_step(&pods, &policy(), &Refusals::new(), Duration::ZERO)
        else {
            panic!("an orphan GPU pod must fail an unforced drain");
        };
        assert_eq!(blocked.len(), 1);
        assert_eq!(blocked[0].name, "bare");
        assert_eq!(blocked[0].blocker, Blocker::NoController);
        let mut forced = policy();
        forced.force = true;
        assert_eq!(
            next_step(&pods, &forced, &Refusals::new(), Duration::ZERO),
            Next::Remove(vec![
                ("ml".into(), "bare".into()),
                ("ml".into(), "train".into())
            ])
        );
    }

    #[test]
    fn refused_and_terminating_pods_are_waited_for_then_named_at_the_timeout() {
        let mut terminating = gpu_pod("stopping", Some("Job"));
        terminating.terminating = true;
        let pods = vec![gpu_pod("guarded", Some("ReplicaSet")), terminating];
        let refused = Refusals::from([(
            ("ml".to_owned(), "guarded".to_owned()),
            (
                Blocker::DisruptionBudget {
                    budget: "train-pdb".into(),
                },
                Duration::from_secs(10),
            ),
        )]);
        let policy = policy();
        let Next::Wait(waiting) = next_step(&pods, &policy, &refused, Duration::from_secs(11))
        else {
            panic!("nothing is removable: wait");
        };
        assert_eq!(waiting.len(), 2);
        // Once the pause has passed, the refused eviction is asked for again.
        assert_eq!(
            next_step(
                &pods,
                &policy,
                &refused,
                Duration::from_secs(10) + RECHECK_AFTER
            ),
            Next::Remove(vec![("ml".into(), "guarded".into())])
        );
        let timeout = policy.timeout.expect("the default drain has a timeout");
        let Next::Failed(blocked) = next_step(&pods, &policy, &refused, timeout) else {
            panic!("past the timeout the drain fails");
        };
        let text: Vec<String> = blocked.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "pod ml/guarded: the PodDisruptionBudget train-pdb refuses its eviction",
                "pod ml/stopping: it is still terminating",
            ]
        );
    }

    #[test]
    fn a_zero_timeout_waits_forever_and_a_negative_grace_keeps_the_pods_own() {
        let spec = DrainSpec {
            timeout_seconds: 0,
            grace_period_seconds: -1,
            ..DrainSpec::default()
        };
        let policy = DrainPolicy::of_drain(&spec);
        assert_eq!(policy.timeout, None);
        assert_eq!(policy.grace_period_seconds, None);
        let mut terminating = gpu_pod("stopping", Some("Job"));
        terminating.terminating = true;
        assert!(matches!(
            next_step(
                &[terminating],
                &policy,
                &Refusals::new(),
                Duration::from_secs(86_400)
            ),
            Next::Wait(_)
        ));
    }

    #[test]
    fn the_drain_policy_wins_over_the_deletion_policy() {
        let deletion = PodDeletionSpec {
            force: true,
            timeout_seconds: 60,
            grace_period_seconds: 5,
        };
        let mut upgrade = DriverUpgradePolicySpec {
            pod_deletion_policy: Some(deletion),
            ..DriverUpgradePolicySpec::default()
        };
        let only_deletion = DrainPolicy::of_upgrade(&upgrade);
        assert_eq!(only_deletion.removal, Removal::Delete);
        assert_eq!(only_deletion.grace_period_seconds, Some(5));
        upgrade.node_drain_policy = Some(DrainSpec::default());
        assert_eq!(DrainPolicy::of_upgrade(&upgrade).removal, Removal::Evict);
        upgrade.pod_deletion_policy = None;
        upgrade.node_drain_policy = None;
        assert_eq!(DrainPolicy::of_upgrade(&upgrade), policy());
    }

    #[test]
    fn the_budget_is_read_from_the_refusal() {
        let status: kube::core::Status = serde_json::from_value(json!({
            "status": "Failure", "code": 429, "reason": "TooManyRequests",
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "details": {"causes": [{"reason": "DisruptionBudget",
                "message": "The disruption budget train-pdb needs 2 healthy pods and has 2 currently"}]}
        }))
        .expect("a Status");
        assert_eq!(budget_of(&status).as_deref(), Some("train-pdb"));
    }
}
