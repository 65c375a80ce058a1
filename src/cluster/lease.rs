//! Leader election on a `coordination.k8s.io/v1` Lease.
//!
//! A small implementation rather than a crate, because the guarantees matter more
//! than the code saved: every leader write asks a [`LeaderGuard`] whether the
//! lease is still held *by this process's own clock*, so no write happens after
//! the lease has expired even while the API server is unreachable (the usual
//! crates keep reporting leadership until they manage to talk to the server).
//!
//! - Writes use optimistic concurrency: a PUT carrying the resourceVersion that
//!   was read, so two candidates can never both win.
//! - The holder renews every `renew_every`. Its lease counts as held until
//!   `duration` after the *start* of the last successful renewal, measured on the
//!   local monotonic clock.
//! - Standbys watch the Lease rather than polling it. A standby takes over when the
//!   record it last saw has not changed for `duration` (local clock again, so
//!   clock skew between nodes does not matter), or at once when the holder
//!   releases it.
//! - On shutdown the holder releases the lease (clears the holder), so a standby
//!   takes over immediately instead of after expiry.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::ObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::field_manager;

pub const DEFAULT_LEASE_NAME: &str = "gpu-operator-leader";

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    /// Who we are: node name plus pod name.
    pub identity: String,
    pub duration: Duration,
    pub renew_every: Duration,
}

impl LeaseConfig {
    pub fn new(namespace: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            name: DEFAULT_LEASE_NAME.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
        }
    }
}

/// Answers "is the lease still ours right now?" without asking the API server.
/// Cheap to clone; check it immediately before every leader write.
#[derive(Clone, Debug, Default)]
pub struct LeaderGuard {
    held_until: Arc<Mutex<Option<Instant>>>,
}

impl LeaderGuard {
    pub fn is_held(&self) -> bool {
        self.held_until
            .lock()
            .map(|until| until.is_some_and(|t| Instant::now() < t))
            .unwrap_or(false)
    }

    /// A guard that is always held: for single-node tools and tests that run the
    /// reconciler without an election.
    pub fn always() -> Self {
        let guard = Self::default();
        guard.set(Some(
            Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600),
        ));
        guard
    }

    fn set(&self, until: Option<Instant>) {
        if let Ok(mut held) = self.held_until.lock() {
            *held = until;
        }
    }

    fn until(&self) -> Option<Instant> {
        self.held_until.lock().ok().and_then(|held| *held)
    }

    /// When the lease lapses by the local clock, if it is held now. Leader
    /// writes must complete before this instant or not at all.
    pub fn deadline(&self) -> Option<Instant> {
        self.until().filter(|t| Instant::now() < *t)
    }
}

/// A running election. Dropping it stops campaigning at once, without releasing
/// the lease (as a crash would); cancel its shutdown token for a clean release.
pub struct Election {
    pub guard: LeaderGuard,
    /// `true` while this process leads. Flips to `false` the moment the lease
    /// expires locally, even if the API server cannot be reached.
    pub leading: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Election {
    /// Starts campaigning. When `shutdown` fires, the lease is released (if held)
    /// and [`Election::finished`] resolves.
    pub fn start(client: Client, config: LeaseConfig, shutdown: CancellationToken) -> Self {
        let guard = LeaderGuard::default();
        let (tx, leading) = watch::channel(false);
        let api: Api<Lease> = Api::namespaced(client, &config.namespace);
        let task = tokio::spawn(campaign(api, config, guard.clone(), tx, shutdown));
        Self {
            guard,
            leading,
            task,
        }
    }

    /// Waits for the campaign (and the release on shutdown) to finish.
    pub async fn finished(mut self) {
        let _ = (&mut self.task).await;
    }
}

impl Drop for Election {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The last version of the Lease this candidate saw, and when it first saw it.
struct Observed {
    lease: Option<Lease>,
    since: Instant,
}

impl Observed {
    fn holder(&self) -> Option<&str> {
        self.lease
            .as_ref()
            .and_then(|l| l.spec.as_ref())
            .and_then(|s| s.holder_identity.as_deref())
            .filter(|h| !h.is_empty())
    }

    fn duration(&self, default: Duration) -> Duration {
        self.lease
            .as_ref()
            .and_then(|l| l.spec.as_ref())
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .map_or(default, Duration::from_secs)
    }

    fn version(&self) -> Option<&str> {
        self.lease
            .as_ref()
            .and_then(|l| l.metadata.resource_version.as_deref())
    }
}

async fn campaign(
    api: Api<Lease>,
    config: LeaseConfig,
    guard: LeaderGuard,
    leading: watch::Sender<bool>,
    shutdown: CancellationToken,
) {
    let mut observed = Observed {
        lease: None,
        since: Instant::now(),
    };
    let mut events = watcher::watcher(
        api.clone(),
        watcher::Config::default().fields(&format!("metadata.name={}", config.name)),
    )
    .default_backoff()
    .boxed();
    let mut next_attempt = Instant::now();
    let retry = (config.renew_every / 2).max(Duration::from_millis(200));
    loop {
        let now = Instant::now();
        // Expiry is judged locally and first: leadership ends at this instant
        // whether or not the API server can be reached.
        if *leading.borrow() && !guard.is_held() {
            tracing::warn!(identity = %config.identity, "lost leadership: lease expired before it could be renewed");
            leading.send_replace(false);
        }
        if now >= next_attempt {
            let is_holder = observed.holder() == Some(config.identity.as_str());
            let may_take = observed.holder().is_none()
                || is_holder
                || now >= observed.since + observed.duration(config.duration);
            next_attempt = if may_take {
                // A renewal the server never answers must not keep us leading
                // past expiry, nor hold up shutdown: the write gets until the
                // lease lapses (a retry interval when not holding it).
                let deadline = guard.deadline().unwrap_or(now + retry);
                let write =
                    tokio::time::timeout_at(deadline, write_lease(&api, &config, &observed));
                let written = tokio::select! {
                    _ = shutdown.cancelled() => break,
                    written = write => written,
                };
                match written
                    .unwrap_or_else(|_| Err(kube::Error::Service("lease write timed out".into())))
                {
                    Ok(lease) => {
                        guard.set(Some(now + config.duration));
                        if !leading.send_replace(true) {
                            tracing::info!(identity = %config.identity, "became leader");
                        }
                        observed = Observed {
                            lease: Some(lease),
                            since: now,
                        };
                        now + config.renew_every
                    }
                    Err(e) => {
                        tracing::debug!(identity = %config.identity, error = %e, "lease write failed");
                        if matches!(&e, kube::Error::Api(s) if s.code == 409) {
                            // Someone else wrote it: re-read before trying again.
                            let read = tokio::time::timeout(retry, api.get_opt(&config.name));
                            if let Ok(Ok(current)) = read.await {
                                observe(&mut observed, current, &config, &guard, &leading);
                            }
                        }
                        now + retry
                    }
                }
            } else {
                observed.since + observed.duration(config.duration)
            };
        }
        let wake = match guard.until() {
            Some(expiry) if expiry > now => next_attempt.min(expiry),
            _ => next_attempt,
        };
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep_until(wake) => {}
            event = events.next() => match event {
                Some(Ok(Event::Apply(lease) | Event::InitApply(lease))) => {
                    let was_free = observed.holder().is_none();
                    observe(&mut observed, Some(lease), &config, &guard, &leading);
                    if observed.holder().is_none() && !was_free {
                        next_attempt = Instant::now();
                    }
                }
                Some(Ok(Event::Delete(_))) => {
                    observe(&mut observed, None, &config, &guard, &leading);
                    next_attempt = Instant::now();
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => tracing::debug!(error = %e, "lease watch error; retrying"),
                None => break,
            },
        }
    }
    release(&api, &config, &observed, &guard).await;
    leading.send_replace(false);
}

/// Records a newly seen Lease. A new record restarts the expiry clock; seeing
/// someone else hold it ends our leadership at once.
fn observe(
    observed: &mut Observed,
    lease: Option<Lease>,
    config: &LeaseConfig,
    guard: &LeaderGuard,
    leading: &watch::Sender<bool>,
) {
    let version = lease
        .as_ref()
        .and_then(|l| l.metadata.resource_version.clone());
    if version.as_deref() != observed.version() || lease.is_none() {
        *observed = Observed {
            lease,
            since: Instant::now(),
        };
    }
    if let Some(holder) = observed.holder()
        && holder != config.identity
        && guard.until().is_some()
    {
        tracing::warn!(identity = %config.identity, holder, "lost leadership: another candidate holds the lease");
        guard.set(None);
        leading.send_replace(false);
    }
}

fn now_micro() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// Takes or renews the lease with optimistic concurrency.
async fn write_lease(
    api: &Api<Lease>,
    config: &LeaseConfig,
    observed: &Observed,
) -> Result<Lease, kube::Error> {
    let duration = i32::try_from(config.duration.as_secs()).unwrap_or(i32::MAX);
    let Some(current) = observed.lease.clone() else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                namespace: Some(config.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(config.identity.clone()),
                lease_duration_seconds: Some(duration),
                acquire_time: Some(now_micro()),
                renew_time: Some(now_micro()),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match api
            .create(&field_manager::post(field_manager::LEADER), &lease)
            .await
        {
            // It exists already (we had not seen it yet): read it and go on as usual.
            Err(kube::Error::Api(s)) if s.code == 409 => Err(kube::Error::Api(s)),
            other => other,
        };
    };
    let mut spec = current.spec.clone().unwrap_or_default();
    let renewing = spec.holder_identity.as_deref() == Some(config.identity.as_str());
    if !renewing {
        spec.holder_identity = Some(config.identity.clone());
        spec.acquire_time = Some(now_micro());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    spec.renew_time = Some(now_micro());
    spec.lease_duration_seconds = Some(duration);
    let lease = Lease {
        metadata: current.metadata.clone(),
        spec: Some(spec),
    };
    api.replace(
        &config.name,
        &field_manager::post(field_manager::LEADER),
        &lease,
    )
    .await
}

/// Gives the lease up so that a standby can take it at once.
async fn release(api: &Api<Lease>, config: &LeaseConfig, observed: &Observed, guard: &LeaderGuard) {
    let held = guard.is_held();
    guard.set(None);
    if !held || observed.holder() != Some(config.identity.as_str()) {
        return;
    }
    let Some(mut lease) = observed.lease.clone() else {
        return;
    };
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = None;
        spec.renew_time = Some(now_micro());
    }
    let params = field_manager::post(field_manager::LEADER);
    let release = api.replace(&config.name, &params, &lease);
    match tokio::time::timeout(Duration::from_secs(2), release).await {
        Ok(Ok(_)) => tracing::info!(identity = %config.identity, "released leadership"),
        Ok(Err(e)) => tracing::warn!(error = %e, "could not release the lease; it will expire"),
        Err(_) => tracing::warn!("releasing the lease timed out; it will expire"),
    }
}
