//! Supervised node services with one start / reconfigure / stop interface.
//!
//! A [`Service`] is a long-running async task that reads its configuration from a
//! `watch` channel (so reconfiguring never needs a restart unless the service
//! chooses one) and stops when its cancellation token fires. A [`Slot`] holds at
//! most one running instance: [`Slot::apply`] with `Some(config)` starts it or
//! sends it the new configuration, with `None` stops it. When a service fails
//! (returns an error or panics) the slot restarts it with exponential backoff;
//! the other slots are not affected.
//!
//! A live task is not an available service. Each run starts
//! [`ServiceState::Unavailable`] and the service itself says, through its
//! [`Readiness`], when it does its job for users (the kubelet accepted the
//! device plugin, the first metrics are served, labels are written) and when it
//! stops doing so, and why.
//!
//! Beside the services run their followers ([`Followers`]): tasks that keep a
//! feed current and are not restarted, but whose end is reported; and a loop
//! waiting on many feeds waits on [`Wakes`], so that a feed that closed wakes
//! it once, not forever.
//!
//! This module owns the service kernel every node service is written against:
//! the [`Service`] trait, [`Slot`], [`Readiness`], [`ServiceState`],
//! [`Followers`], [`Wakes`] and the process-wide restart counter
//! ([`SERVICE_RESTARTS`]). It sits low in the
//! module order so that the services (`health`, `metrics`, `testrunner`, ...)
//! can implement it without importing the agent that runs them. It must not
//! know any particular service, nor talk to the host or the Kubernetes API.

use std::fmt::{Debug, Display};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use futures::FutureExt;
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long a stopping service may take before its task is aborted.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// A run that lasted this long counts as healthy: the next failure starts the
/// backoff from the beginning again.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// Restarts across all services since the process started, for the agent's own metrics.
pub static SERVICE_RESTARTS: AtomicU64 = AtomicU64::new(0);

pub type ServiceFuture = Pin<Box<dyn Future<Output = Result<(), ServiceError>> + Send>>;

/// A service failure: what went wrong, in words for the log and the node status.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ServiceError(pub String);

impl ServiceError {
    pub fn new(message: impl Display) -> Self {
        Self(message.to_string())
    }
}

/// A node service.
pub trait Service: Send + Sync + 'static {
    type Config: Clone + PartialEq + Debug + Send + Sync + 'static;

    /// Stable name, used in logs and in the node status.
    fn name(&self) -> &'static str;

    /// Runs until `cancel` fires (then returns `Ok`) or the service fails. Called
    /// again after a failure. Configuration changes arrive on `config`; the
    /// service reports through `readiness` whether it is available, and is
    /// unavailable until it says so.
    fn run(
        self: Arc<Self>,
        config: watch::Receiver<Self::Config>,
        cancel: CancellationToken,
        readiness: Readiness,
    ) -> ServiceFuture;
}

/// What a service's run says about its availability. Only the run it was
/// given to can change the state, and only while that run is alive: a task
/// left behind by an earlier run cannot mark a newer one available.
#[derive(Clone, Debug)]
pub struct Readiness {
    state: watch::Sender<ServiceState>,
    run: u64,
    current_run: Arc<AtomicU64>,
}

impl Readiness {
    /// A handle with no slot behind it, for driving a service by hand (tests,
    /// one-shot commands); reports go to the returned receiver.
    pub fn detached() -> (Self, watch::Receiver<ServiceState>) {
        let state = watch::Sender::new(ServiceState::Unavailable {
            reason: STARTING.to_owned(),
        });
        let rx = state.subscribe();
        let readiness = Self {
            state,
            run: 0,
            current_run: Arc::new(AtomicU64::new(0)),
        };
        (readiness, rx)
    }

    /// The service does its job for users.
    pub fn available(&self) {
        self.set(ServiceState::Running);
    }

    /// The service runs but does not do its job, for `reason`.
    pub fn unavailable(&self, reason: impl Display) {
        self.set(ServiceState::Unavailable {
            reason: reason.to_string(),
        });
    }

    fn set(&self, next: ServiceState) {
        if self.current_run.load(Ordering::SeqCst) != self.run {
            return;
        }
        self.state.send_if_modified(|state| {
            let live = matches!(
                state,
                ServiceState::Running | ServiceState::Unavailable { .. }
            );
            if live && *state != next {
                *state = next;
                true
            } else {
                false
            }
        });
    }
}

/// The reason a run gives until it reports otherwise.
pub const STARTING: &str = "starting";

/// What a slot's service is doing, as published in the node status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state")]
pub enum ServiceState {
    /// Running and available.
    Running,
    /// Running, but not doing its job (yet), and why.
    Unavailable {
        reason: String,
    },
    /// Failed and waiting to be restarted.
    Restarting {
        error: String,
        restarts: u64,
    },
    /// Finished on its own without being asked to stop.
    Finished,
    Stopped,
}

struct Running<C> {
    config: watch::Sender<C>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

/// Holds at most one running instance of a service.
pub struct Slot<S: Service> {
    service: Arc<S>,
    backoff: ExponentialBuilder,
    state: watch::Sender<ServiceState>,
    running: Option<Running<S::Config>>,
}

impl<S: Service> Slot<S> {
    pub fn new(service: S) -> Self {
        Self {
            service: Arc::new(service),
            backoff: ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(500))
                .with_max_delay(Duration::from_secs(30))
                .with_jitter()
                .without_max_times(),
            state: watch::Sender::new(ServiceState::Stopped),
            running: None,
        }
    }

    /// Uses a different backoff (tests use short delays).
    pub fn with_backoff(mut self, backoff: ExponentialBuilder) -> Self {
        self.backoff = backoff.without_max_times();
        self
    }

    pub fn name(&self) -> &'static str {
        self.service.name()
    }

    pub fn state(&self) -> ServiceState {
        self.state.borrow().clone()
    }

    /// Wakes on every state change.
    pub fn subscribe(&self) -> watch::Receiver<ServiceState> {
        self.state.subscribe()
    }

    pub fn is_running(&self) -> bool {
        self.running.as_ref().is_some_and(|r| !r.task.is_finished())
    }

    /// Starts, reconfigures or stops the service. Returns what it did.
    pub async fn apply(&mut self, desired: Option<S::Config>) -> SlotChange {
        match (desired, self.running.as_ref()) {
            (None, None) => SlotChange::Unchanged,
            (None, Some(_)) => {
                self.stop().await;
                SlotChange::Stopped
            }
            (Some(config), Some(running)) if !running.task.is_finished() => {
                let changed = running.config.send_if_modified(|current| {
                    if *current == config {
                        false
                    } else {
                        *current = config;
                        true
                    }
                });
                if changed {
                    tracing::info!(service = self.name(), "reconfigured");
                    SlotChange::Reconfigured
                } else {
                    SlotChange::Unchanged
                }
            }
            (Some(config), _) => {
                self.start(config);
                SlotChange::Started
            }
        }
    }

    fn start(&mut self, config: S::Config) {
        let (config_tx, config_rx) = watch::channel(config);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(supervise(
            self.service.clone(),
            config_rx,
            cancel.clone(),
            self.state.clone(),
            self.backoff,
        ));
        tracing::info!(service = self.name(), "started");
        self.running = Some(Running {
            config: config_tx,
            cancel,
            task,
        });
    }

    /// Asks the service to stop and waits for it, at most a few seconds.
    pub async fn stop(&mut self) {
        let Some(running) = self.running.take() else {
            return;
        };
        running.cancel.cancel();
        let mut task = running.task;
        if tokio::time::timeout(STOP_GRACE, &mut task).await.is_err() {
            tracing::warn!(service = self.name(), "did not stop in time; aborted");
            task.abort();
        }
        self.state.send_replace(ServiceState::Stopped);
        tracing::info!(service = self.name(), "stopped");
    }
}

impl<S: Service> Drop for Slot<S> {
    /// A slot dropped without [`Slot::stop`] (the agent itself was dropped, as in
    /// a crash) must not leave its service running behind.
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            running.cancel.cancel();
            running.task.abort();
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotChange {
    Unchanged,
    Started,
    Reconfigured,
    Stopped,
}

async fn supervise<S: Service>(
    service: Arc<S>,
    config: watch::Receiver<S::Config>,
    cancel: CancellationToken,
    state: watch::Sender<ServiceState>,
    backoff: ExponentialBuilder,
) {
    let name = service.name();
    let mut delays = backoff.build();
    let mut restarts = 0u64;
    let current_run = Arc::new(AtomicU64::new(0));
    loop {
        let run_id = current_run.fetch_add(1, Ordering::SeqCst) + 1;
        state.send_replace(ServiceState::Unavailable {
            reason: STARTING.to_owned(),
        });
        let readiness = Readiness {
            state: state.clone(),
            run: run_id,
            current_run: current_run.clone(),
        };
        let started = Instant::now();
        let run = service
            .clone()
            .run(config.clone(), cancel.child_token(), readiness);
        let result = match AssertUnwindSafe(run).catch_unwind().await {
            Ok(result) => result,
            Err(panic) => Err(ServiceError::new(format!(
                "panicked: {}",
                panic_message(panic.as_ref())
            ))),
        };
        // The run is over: nothing it left behind may report for it any more.
        current_run.fetch_add(1, Ordering::SeqCst);
        if cancel.is_cancelled() {
            return;
        }
        let error = match result {
            Ok(()) => {
                tracing::info!(service = name, "finished");
                state.send_replace(ServiceState::Finished);
                return;
            }
            Err(error) => error,
        };
        if started.elapsed() >= HEALTHY_RUN {
            delays = backoff.build();
        }
        let delay = delays.next().unwrap_or(Duration::from_secs(30));
        restarts += 1;
        SERVICE_RESTARTS.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(service = name, %error, restarts, ?delay, "service failed; restarting after backoff");
        state.send_replace(ServiceState::Restarting {
            error: error.0,
            restarts,
        });
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = cancel.cancelled() => return,
        }
    }
}

/// What a caught panic said.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("unknown cause")
}

/// A follower that ended while the node side still needed it, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FollowerEnd {
    pub name: &'static str,
    pub reason: String,
}

impl Display for FollowerEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "follower {} ended: {}; what it fed stays as last seen until the agent restarts",
            self.name, self.reason
        )
    }
}

/// Why a follower's end is reported.
const STOPPED_ON_ITS_OWN: &str = "it stopped on its own";
const ENDED_BY_HAND: &str = "it was ended by hand";
const FEED_CLOSED: &str = "its feed closed";

/// The node side's followers: the long-running tasks that keep a feed
/// current (a watch on the Node or on DeviceConfigs, the driver report, the
/// partition and remediation tasks, ...). Unlike a [`Slot`]'s service, a
/// follower is not restarted: it owns the sending side of what it feeds, so a
/// new run could not feed the same receivers. Instead its end, unless asked
/// for ([`Followers::stopping`]), is logged and published
/// ([`Followers::ended`]) with its reason, so that the agent's status names
/// it; and a loop that waits on what it fed uses [`Wakes`], which never
/// wakes on a closed feed again.
#[derive(Clone)]
pub struct Followers {
    inner: Arc<FollowersInner>,
}

struct FollowersInner {
    ended: watch::Sender<Vec<FollowerEnd>>,
    /// Each running follower's own end, by name, with the id of its run.
    running: std::sync::Mutex<std::collections::BTreeMap<&'static str, (u64, CancellationToken)>>,
    next_run: AtomicU64,
    stopping: CancellationToken,
}

impl Default for Followers {
    fn default() -> Self {
        Self::new()
    }
}

impl Followers {
    pub fn new() -> Self {
        Self {
            inner: Arc::new(FollowersInner {
                ended: watch::Sender::new(Vec::new()),
                running: Default::default(),
                next_run: AtomicU64::new(0),
                stopping: CancellationToken::new(),
            }),
        }
    }

    /// The token the followers stop on. Once it fires, their ends are
    /// expected and no longer reported.
    pub fn stopping(&self) -> CancellationToken {
        self.inner.stopping.clone()
    }

    /// The followers that ended unasked, in the order they did (one entry a
    /// name). Never closes while this handle lives.
    pub fn ended(&self) -> watch::Receiver<Vec<FollowerEnd>> {
        self.inner.ended.subscribe()
    }

    /// The names of the followers running now.
    pub fn running(&self) -> Vec<&'static str> {
        self.inner.lock().keys().copied().collect()
    }

    /// Ends the follower `name` as a failure would: its task is dropped, so
    /// what it fed closes. For tests and diagnosis. False when no follower
    /// of that name runs.
    pub fn end(&self, name: &str) -> bool {
        match self.inner.lock().get(name) {
            Some((_, end)) => {
                end.cancel();
                true
            }
            None => false,
        }
    }

    /// Records that the feed `name` closed, for a feed whose task is not a
    /// follower here (or before its follower's own report, which then
    /// replaces this one).
    pub fn feed_closed(&self, name: &'static str) {
        if self.inner.stopping.is_cancelled() {
            return;
        }
        self.inner.ended.send_if_modified(|ended| {
            if ended.iter().any(|e| e.name == name) {
                return false;
            }
            tracing::warn!(follower = name, "{FEED_CLOSED}");
            ended.push(FollowerEnd {
                name,
                reason: FEED_CLOSED.to_owned(),
            });
            true
        });
    }

    /// Runs `task` as the follower `name`; dropping the handle aborts it
    /// quietly (a follower replaced by another).
    pub fn spawn<F>(&self, name: &'static str, task: F) -> tokio_util::task::AbortOnDropHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let run = self.inner.next_run.fetch_add(1, Ordering::Relaxed);
        let end = CancellationToken::new();
        self.inner.lock().insert(name, (run, end.clone()));
        let registered = Registered {
            inner: Arc::downgrade(&self.inner),
            name,
            run,
        };
        let handle = tokio::spawn(async move {
            let reason = tokio::select! {
                caught = AssertUnwindSafe(task).catch_unwind() => match caught {
                    Ok(()) => STOPPED_ON_ITS_OWN.to_owned(),
                    Err(panic) => format!("it panicked: {}", panic_message(panic.as_ref())),
                },
                _ = end.cancelled() => ENDED_BY_HAND.to_owned(),
            };
            // The task, and with it what it fed, is gone by now.
            registered.finished(reason);
        });
        tokio_util::task::AbortOnDropHandle::new(handle)
    }
}

impl FollowersInner {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<&'static str, (u64, CancellationToken)>>
    {
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One follower run's entry among the running; gone with the run, however
/// it ends.
struct Registered {
    inner: std::sync::Weak<FollowersInner>,
    name: &'static str,
    run: u64,
}

impl Registered {
    fn finished(self, reason: String) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        self.unregister(&inner);
        if inner.stopping.is_cancelled() {
            tracing::debug!(follower = self.name, "stopped");
            return;
        }
        tracing::warn!(follower = self.name, %reason, "follower ended; what it fed stays as last seen");
        let end = FollowerEnd {
            name: self.name,
            reason,
        };
        inner.ended.send_modify(
            |ended| match ended.iter_mut().find(|e| e.name == end.name) {
                Some(earlier) => *earlier = end,
                None => ended.push(end),
            },
        );
    }
}

impl Registered {
    /// Takes this run off the running (not a later run of the same name).
    fn unregister(&self, inner: &FollowersInner) {
        let mut running = inner.lock();
        if running
            .get(self.name)
            .is_some_and(|(run, _)| *run == self.run)
        {
            running.remove(self.name);
        }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.upgrade() {
            self.unregister(&inner);
        }
    }
}

/// What woke a loop waiting on [`Wakes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    Changed(&'static str),
    /// The feed closed: it wakes the loop this once and never again.
    Closed(&'static str),
}

/// One wait over many `watch` feeds, each named. A closed feed (its sender
/// dropped, as when the task that fed it ended) wakes the loop once, as
/// [`Wake::Closed`], and is then dropped: unlike a bare `changed()` arm in a
/// `select!`, which returns at once forever and makes its loop spin.
#[derive(Default)]
pub struct Wakes {
    feeds: futures::stream::SelectAll<futures::stream::BoxStream<'static, Wake>>,
}

impl Wakes {
    pub fn new() -> Self {
        Self::default()
    }

    /// Wakes on each change of `feed` after now.
    pub fn watch<T: Send + Sync + 'static>(
        &mut self,
        name: &'static str,
        feed: watch::Receiver<T>,
    ) {
        let changes = futures::stream::unfold(Some(feed), move |feed| async move {
            let mut feed = feed?;
            match feed.changed().await {
                Ok(()) => Some((Wake::Changed(name), Some(feed))),
                Err(_) => Some((Wake::Closed(name), None)),
            }
        });
        self.feeds.push(Box::pin(changes));
    }

    /// The next change of any feed. Cancel-safe; waits forever once every
    /// feed is closed.
    pub async fn next(&mut self) -> Wake {
        match futures::StreamExt::next(&mut self.feeds).await {
            Some(wake) => wake,
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;

    /// Records the configs it saw; fails its first `failures` runs.
    #[derive(Default)]
    struct Probe {
        runs: AtomicUsize,
        failures: usize,
        panic_first: bool,
        seen: Mutex<Vec<u32>>,
        /// Unavailable while the config is below this.
        unavailable_until_config: Option<u32>,
        /// A readiness handle kept past its run.
        stale: Mutex<Option<Readiness>>,
    }

    impl Service for Probe {
        type Config = u32;

        fn name(&self) -> &'static str {
            "probe"
        }

        fn run(
            self: Arc<Self>,
            mut config: watch::Receiver<u32>,
            cancel: CancellationToken,
            readiness: Readiness,
        ) -> ServiceFuture {
            Box::pin(async move {
                let run = self.runs.fetch_add(1, Ordering::SeqCst);
                if self
                    .unavailable_until_config
                    .is_some_and(|c| *config.borrow() < c)
                {
                    readiness.unavailable("config too small");
                    *self.stale.lock().unwrap() = Some(readiness.clone());
                } else {
                    readiness.available();
                }
                if run == 0 && self.panic_first {
                    panic!("boom");
                }
                if run < self.failures {
                    return Err(ServiceError::new(format!("failure {run}")));
                }
                loop {
                    let seen = *config.borrow_and_update();
                    if self.unavailable_until_config.is_some_and(|c| seen >= c) {
                        readiness.available();
                    }
                    self.seen.lock().unwrap().push(seen);
                    tokio::select! {
                        _ = cancel.cancelled() => return Ok(()),
                        changed = config.changed() => if changed.is_err() { return Ok(()) },
                    }
                }
            })
        }
    }

    fn fast() -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(5))
            .with_max_delay(Duration::from_millis(20))
    }

    async fn wait_for(slot: &Slot<Probe>, want: impl Fn(&ServiceState) -> bool) {
        let mut rx = slot.subscribe();
        tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|s| want(s)))
            .await
            .expect("state reached in time")
            .expect("slot alive");
    }

    #[tokio::test]
    async fn start_reconfigure_stop() {
        let mut slot = Slot::new(Probe::default()).with_backoff(fast());
        assert_eq!(slot.apply(Some(1)).await, SlotChange::Started);
        wait_for(&slot, |s| *s == ServiceState::Running).await;
        assert_eq!(slot.apply(Some(1)).await, SlotChange::Unchanged);
        assert_eq!(slot.apply(Some(2)).await, SlotChange::Reconfigured);
        tokio::time::timeout(Duration::from_secs(5), async {
            while !slot.service.seen.lock().unwrap().contains(&2) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("new config seen without a restart");
        assert_eq!(slot.service.runs.load(Ordering::SeqCst), 1);
        assert_eq!(slot.apply(None).await, SlotChange::Stopped);
        assert_eq!(slot.state(), ServiceState::Stopped);
        assert!(!slot.is_running());
        assert_eq!(slot.apply(None).await, SlotChange::Unchanged);
    }

    #[tokio::test]
    async fn a_live_service_is_unavailable_until_it_says_otherwise() {
        let mut slot = Slot::new(Probe {
            unavailable_until_config: Some(5),
            ..Probe::default()
        })
        .with_backoff(fast());
        slot.apply(Some(1)).await;
        wait_for(&slot, |s| {
            *s == ServiceState::Unavailable {
                reason: "config too small".into(),
            }
        })
        .await;
        slot.apply(Some(5)).await;
        wait_for(&slot, |s| *s == ServiceState::Running).await;
        slot.stop().await;
        // A handle from a finished run changes nothing.
        let stale = slot.service.stale.lock().unwrap().take().unwrap();
        stale.unavailable("from the past");
        assert_eq!(slot.state(), ServiceState::Stopped);
    }

    #[tokio::test]
    async fn failures_and_panics_are_restarted_with_backoff() {
        let mut slot = Slot::new(Probe {
            failures: 3,
            panic_first: true,
            ..Probe::default()
        })
        .with_backoff(fast());
        let before = SERVICE_RESTARTS.load(Ordering::Relaxed);
        slot.apply(Some(7)).await;
        tokio::time::timeout(Duration::from_secs(5), async {
            while slot.service.seen.lock().unwrap().is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("service eventually runs");
        assert_eq!(slot.service.runs.load(Ordering::SeqCst), 4);
        assert!(SERVICE_RESTARTS.load(Ordering::Relaxed) >= before + 3);
        wait_for(&slot, |s| *s == ServiceState::Running).await;
        slot.stop().await;
    }

    #[tokio::test]
    async fn a_failing_service_reports_why() {
        let mut slot = Slot::new(Probe {
            failures: usize::MAX,
            ..Probe::default()
        })
        .with_backoff(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_secs(10))
                .with_max_delay(Duration::from_secs(10)),
        );
        slot.apply(Some(1)).await;
        wait_for(&slot, |s| matches!(s, ServiceState::Restarting { .. })).await;
        match slot.state() {
            ServiceState::Restarting { error, restarts } => {
                assert_eq!(error, "failure 0");
                assert_eq!(restarts, 1);
            }
            other => panic!("unexpected {other:?}"),
        }
        // Stopping during backoff is immediate.
        let started = Instant::now();
        slot.stop().await;
        assert!(started.elapsed() < STOP_GRACE);
    }

    #[tokio::test]
    async fn a_closed_feed_wakes_once_and_never_again() {
        let (tx, rx) = watch::channel(0u32);
        let (other_tx, other_rx) = watch::channel(0u32);
        let mut wakes = Wakes::new();
        wakes.watch("one", rx);
        wakes.watch("other", other_rx);
        tx.send_replace(1);
        assert_eq!(wakes.next().await, Wake::Changed("one"));
        drop(tx);
        assert_eq!(wakes.next().await, Wake::Closed("one"));
        // Nothing else to say: the closed feed does not wake the loop again.
        let idle = tokio::time::timeout(Duration::from_millis(50), wakes.next()).await;
        assert!(idle.is_err(), "woke on a closed feed: {idle:?}");
        other_tx.send_replace(1);
        assert_eq!(wakes.next().await, Wake::Changed("other"));
        drop(other_tx);
        assert_eq!(wakes.next().await, Wake::Closed("other"));
        let idle = tokio::time::timeout(Duration::from_millis(50), wakes.next()).await;
        assert!(idle.is_err(), "all feeds closed, yet woke: {idle:?}");
    }

    async fn ended(followers: &Followers, count: usize) -> Vec<FollowerEnd> {
        let mut rx = followers.ended();
        tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|e| e.len() >= count))
            .await
            .expect("ends reported in time")
            .expect("followers alive")
            .clone()
    }

    #[tokio::test]
    async fn a_follower_that_ends_unasked_is_named_with_why() {
        let followers = Followers::new();
        let (tx, mut fed) = watch::channel(0u32);
        let _feeding = followers.spawn("feeder", async move {
            let _tx = tx;
            std::future::pending::<()>().await
        });
        let _returns = followers.spawn("returns", async {});
        let _panics = followers.spawn("panics", async { panic!("boom") });
        let ends = ended(&followers, 2).await;
        assert_eq!(followers.running(), ["feeder"]);
        assert!(followers.end("feeder"));
        assert!(!followers.end("feeder-typo"));
        assert!(fed.changed().await.is_err(), "what the follower fed closes");
        followers.feed_closed("feeder");
        let mut all = ended(&followers, 3).await;
        all.sort_by_key(|e| e.name);
        assert_eq!(
            all,
            [
                FollowerEnd {
                    name: "feeder",
                    reason: ENDED_BY_HAND.into()
                },
                FollowerEnd {
                    name: "panics",
                    reason: "it panicked: boom".into()
                },
                FollowerEnd {
                    name: "returns",
                    reason: STOPPED_ON_ITS_OWN.into()
                },
            ],
            "first two seen: {ends:?}"
        );
        assert!(followers.running().is_empty());
        assert!(
            all[0]
                .to_string()
                .contains("follower feeder ended: it was ended by hand")
        );
        // A feed that closes with no follower's report behind it is named too.
        followers.feed_closed("device-watch");
        assert_eq!(ended(&followers, 4).await[3].reason, FEED_CLOSED);
    }

    #[tokio::test]
    async fn ends_once_stopping_and_aborted_followers_are_not_reported() {
        let followers = Followers::new();
        let stop = followers.stopping();
        let replaced = followers.spawn("replaced", std::future::pending());
        let _stops = followers.spawn("stops", async move { stop.cancelled().await });
        drop(replaced);
        followers.stopping().cancel();
        followers.feed_closed("stops");
        tokio::time::timeout(Duration::from_secs(5), async {
            while !followers.running().is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("both gone");
        assert!(followers.ended().borrow().is_empty());
    }
}
