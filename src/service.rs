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
//! This module owns the service kernel every node service is written against:
//! the [`Service`] trait, [`Slot`], [`Readiness`], [`ServiceState`] and the
//! process-wide restart counter ([`SERVICE_RESTARTS`]). It sits low in the
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
                panic
                    .downcast_ref::<&str>()
                    .copied()
                    .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
                    .unwrap_or("unknown cause")
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
}
