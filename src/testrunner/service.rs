//! [`TestRunnerService`]: the supervised node service that turns triggers into
//! test runs and reports their results.
//!
//! Inputs: the configuration (a `watch`, through the supervisor), the GPU
//! inventory, the agent's own Node (for the test-request annotation), and an
//! mpsc stream of [`GpuUnhealthy`] from the health monitor. Outputs: Events
//! through the agent's [`EventSink`], each finished test case on
//! [`TestRunnerService::results`], and [`TestRunnerStats`]. One loop owns the [`Scheduler`] and [`ManualTracker`]; each started
//! run is a task of its own that runs its test cases one after the other and
//! reports each. Stopping the service kills the running tests' process groups,
//! removes their running labels and publishes no result for them; a manual
//! request cut short this way keeps its annotation and runs again on the next
//! start, like the reference reruns tests interrupted by a restart.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Node;
use kube::{Client, ResourceExt};
use tokio::sync::{Mutex, broadcast, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::command::{Commands, programs_needed, refused_commands, unstartable};
use super::config::{CATEGORY, TestConfig, Trigger, parse_config};
use super::decide::{
    ManualTracker, REQUEST_RECEIPT_ANNOTATION, RunId, Scheduler, Start, Submitted,
    TEST_REQUEST_ANNOTATION, manual_request, periodic_request, pre_start_request, select_gpus,
    unhealthy_request,
};
use super::exclusive::GpuLocks;
use super::execute::{CaseReport, LogLimits, Logs, run_case};
use super::gpus::{TargetGpu, read_targets};
use super::kube::{CONFIG_ERROR_REASON, Kube, node_event};
use super::report::EventContent;
use super::report::{LABEL_PREFIX, label_value, running_label_key};
use super::stats::{LastRun, RunningTest, TestRunnerStats};
use super::{GpuUnhealthy, TestRunnerConfig};
use crate::api::agent_status::ServiceName;
use crate::device::Inventory;
use crate::events::EventSink;
use crate::service::{Readiness, Service, ServiceError, ServiceFuture};

/// The test runner as a node service.
pub struct TestRunnerService {
    client: Option<Client>,
    events: Option<EventSink>,
    inventory: watch::Receiver<Arc<Inventory>>,
    node: watch::Receiver<Option<Arc<Node>>>,
    unhealthy: Mutex<mpsc::Receiver<GpuUnhealthy>>,
    stats: watch::Sender<TestRunnerStats>,
    results: broadcast::Sender<LastRun>,
    pre_start_done: AtomicBool,
    /// The node's GPU locks, shared with whoever else runs tests.
    locks: GpuLocks,
}

impl TestRunnerService {
    /// `client` is `None` without Kubernetes: tests still run and log, but no
    /// labels or annotations are written. `events` is where the result and
    /// config-error Events go (`None`: nowhere; standalone mode records the
    /// [`results`](Self::results) in its own words). `node` is the agent's
    /// watch of its own Node (`None` until seen).
    pub fn new(
        client: Option<Client>,
        events: Option<EventSink>,
        inventory: watch::Receiver<Arc<Inventory>>,
        node: watch::Receiver<Option<Arc<Node>>>,
        unhealthy: mpsc::Receiver<GpuUnhealthy>,
    ) -> Self {
        Self {
            client,
            events,
            inventory,
            node,
            unhealthy: Mutex::new(unhealthy),
            stats: watch::Sender::new(TestRunnerStats::default()),
            results: broadcast::Sender::new(RESULTS_BACKLOG),
            pre_start_done: AtomicBool::new(false),
            locks: GpuLocks::default(),
        }
    }

    /// The GPU locks this runner takes before each test case: whoever else
    /// runs tests on the node's GPUs (a remediation's validation) takes them
    /// too.
    pub fn gpu_locks(&self) -> GpuLocks {
        self.locks.clone()
    }

    /// The runner's figures for the metrics exporter; changes on every run
    /// start, end and queue change.
    pub fn stats(&self) -> watch::Receiver<TestRunnerStats> {
        self.stats.subscribe()
    }

    /// Each test case as it finishes (not one cut short by a stop).
    pub fn results(&self) -> broadcast::Receiver<LastRun> {
        self.results.subscribe()
    }
}

/// Finished test cases a slow reader of [`TestRunnerService::results`] may
/// fall behind by before it misses some.
const RESULTS_BACKLOG: usize = 64;

/// What a run needs, fixed when it starts.
struct RunContext {
    node_name: String,
    logs_dir: PathBuf,
    commands: Commands,
    log_limits: LogLimits,
    kube: Option<Kube>,
    events: Option<EventSink>,
    stats: watch::Sender<TestRunnerStats>,
    results: broadcast::Sender<LastRun>,
    locks: GpuLocks,
}

/// A finished run, for the loop's bookkeeping.
struct Finished {
    id: RunId,
    /// The annotation value it answered and the receipt written with its
    /// removal; `None` when the run was cancelled.
    manual: Option<(String, Option<String>)>,
}

fn parse(config: &TestRunnerConfig) -> Result<TestConfig, String> {
    match &config.config_text {
        None => Ok(TestConfig::default()),
        Some(text) => {
            let parsed = parse_config(text).map_err(|e| e.to_string())?;
            for warning in &parsed.warnings {
                tracing::warn!(%warning, "testRunner config");
            }
            Ok(parsed.config)
        }
    }
}

fn periodic_interval(tests: &TestConfig, node: &str) -> Option<Duration> {
    tests
        .trigger(node, Trigger::Periodic)
        .and_then(|t| t.interval)
}

impl Service for TestRunnerService {
    type Config = TestRunnerConfig;

    fn name(&self) -> &'static str {
        ServiceName::TestRunner.as_str()
    }

    /// Available while every test tool its configuration names can be started;
    /// checked at start, on every config change and after every run.
    fn run(
        self: Arc<Self>,
        mut config: watch::Receiver<TestRunnerConfig>,
        cancel: CancellationToken,
        readiness: Readiness,
    ) -> ServiceFuture {
        Box::pin(async move {
            // Held for the whole run: the supervisor runs one instance at a time.
            let mut unhealthy = self.unhealthy.lock().await;
            let mut current = config.borrow_and_update().clone();
            let mut tests = parse(&current)
                .map_err(|e| ServiceError::new(format!("testRunner config: {e}")))?;
            let mut ctx = self.context(&current)?;
            let report_readiness = |tests: &TestConfig, current: &TestRunnerConfig| {
                let mut problems: Vec<String> =
                    programs_needed(tests, &current.node_name, &current.commands)
                        .iter()
                        .filter_map(|program| unstartable(program))
                        .collect();
                problems.extend(refused_commands(
                    tests,
                    &current.node_name,
                    &current.commands,
                ));
                if let Some(why) = &current.gpus_pending {
                    problems.push(format!("tests wait until the GPUs can be tested: {why}"));
                }
                if problems.is_empty() {
                    readiness.available();
                } else {
                    readiness.unavailable(format!("tests cannot start: {}", problems.join("; ")));
                }
            };
            report_readiness(&tests, &current);
            let mut scheduler = Scheduler::default();
            let mut manual = ManualTracker::default();
            let mut runs: JoinSet<Finished> = JoinSet::new();
            let runs_cancel = CancellationToken::new();
            let mut node = self.node.clone();
            let mut inventory = self.inventory.clone();
            // A closed input (its sender dropped) is no longer polled: `changed`
            // would return at once, forever.
            let mut unhealthy_open = true;
            let mut node_open = true;
            let mut inventory_open = true;
            let mut failure = None;
            // Why queued tests last waited, so that the wait is logged once.
            let mut held_for: Option<String> = None;

            let mut period = periodic_interval(&tests, &current.node_name);
            let mut next_periodic = period.map(|p| Instant::now() + p);

            loop {
                // Once per agent process, with the first configuration that
                // has a pre-start check: the DeviceConfig's ConfigMap often
                // arrives after the service started on the built-in one.
                if !self.pre_start_done.load(Ordering::SeqCst)
                    && let Some(request) = pre_start_request(&tests, &current.node_name)
                {
                    self.pre_start_done.store(true, Ordering::SeqCst);
                    scheduler.submit(request);
                }
                let node_copy = node.borrow_and_update().clone();
                if let Some(n) = &node_copy {
                    let annotation = n.annotations().get(TEST_REQUEST_ANNOTATION);
                    if let Some(value) = manual.observe(
                        annotation.map(String::as_str),
                        n.annotations()
                            .get(REQUEST_RECEIPT_ANNOTATION)
                            .map(String::as_str),
                        &scheduler.manual_in_flight(),
                    ) {
                        match manual_request(&tests, &current.node_name, &value) {
                            Ok(request) => {
                                tracing::info!(recipe = %value, "test requested by Node annotation");
                                scheduler.submit(request);
                            }
                            Err(why) => {
                                let removed = self.reject_request(&ctx, &value, &why).await;
                                manual.handled(value, removed);
                            }
                        }
                    }
                }
                // Marks the inventory seen, so that `changed` waits for the next one.
                let gpus_now = inventory.borrow_and_update().clone();
                // The KFD ids are read only when something may start.
                let targets = if scheduler.queued() > 0 {
                    read_targets(&gpus_now, &current.host)
                } else {
                    Vec::new()
                };
                let bdfs = targets.iter().map(|t| t.bdf.clone()).collect();
                let starts = match &current.gpus_pending {
                    None => scheduler.start_ready(&bdfs),
                    Some(why) => {
                        if scheduler.queued() > 0 && held_for.as_ref() != Some(why) {
                            tracing::info!(
                                queued = scheduler.queued(),
                                "tests wait until the GPUs can be tested: {why}"
                            );
                        }
                        Vec::new()
                    }
                };
                held_for = current
                    .gpus_pending
                    .clone()
                    .filter(|_| scheduler.queued() > 0);
                for start in starts {
                    runs.spawn(execute(
                        ctx.clone(),
                        start,
                        targets.clone(),
                        runs_cancel.child_token(),
                    ));
                }
                let queued = scheduler.queued();
                self.stats.send_if_modified(|s| {
                    let changed = s.queued != queued;
                    s.queued = queued;
                    changed
                });

                tokio::select! {
                    _ = cancel.cancelled() => break,
                    changed = config.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let next = config.borrow_and_update().clone();
                        // A bad update keeps the last good configuration: tests
                        // keep running and the Node gets a Warning Event.
                        match parse(&next) {
                            Ok(parsed) => tests = parsed,
                            Err(e) => {
                                tracing::warn!(error = %e, "testRunner config rejected; keeping the previous one");
                                config_error(&ctx, &e).await;
                            }
                        }
                        if next.logs_dir != current.logs_dir
                            || next.logs_refused != current.logs_refused
                            || next.log_limits != current.log_limits
                            || next.commands != current.commands
                            || next.node_name != current.node_name
                            || next.host != current.host
                        {
                            match self.context(&next) {
                                Ok(next_ctx) => ctx = next_ctx,
                                Err(e) => {
                                    failure = Some(e);
                                    break;
                                }
                            }
                        }
                        current = next;
                        report_readiness(&tests, &current);
                        let interval = periodic_interval(&tests, &current.node_name);
                        if interval != period {
                            period = interval;
                            next_periodic = period.map(|p| Instant::now() + p);
                        }
                    }
                    changed = node.changed(), if node_open => node_open = changed.is_ok(),
                    changed = inventory.changed(), if inventory_open => inventory_open = changed.is_ok(),
                    message = unhealthy.recv(), if unhealthy_open => match message {
                        Some(gpu) => {
                            if let Some(request) = unhealthy_request(&tests, &current.node_name, &gpu.bdf) {
                                let submitted = scheduler.submit(request);
                                tracing::info!(bdf = %gpu.bdf, reasons = ?gpu.reasons, ?submitted, "unhealthy GPU");
                            }
                        }
                        None => unhealthy_open = false,
                    },
                    _ = sleep_until(next_periodic), if next_periodic.is_some() => {
                        if let Some(request) = periodic_request(&tests, &current.node_name)
                            && scheduler.submit(request) == Submitted::Duplicate
                        {
                            tracing::info!("periodic test still waiting for its GPUs; not queued twice");
                        }
                        next_periodic = period.map(|p| Instant::now() + p);
                    }
                    Some(done) = runs.join_next(), if !runs.is_empty() => {
                        match done {
                            Ok(finished) => {
                                scheduler.finish(finished.id);
                                report_readiness(&tests, &current);
                                if let Some((value, removed)) = finished.manual {
                                    manual.handled(value, removed);
                                }
                            }
                            // A run task cannot panic short of a bug; its GPUs
                            // stay claimed, which is the safe side.
                            Err(e) => tracing::error!(error = %e, "test run task failed"),
                        }
                    }
                }
            }
            runs_cancel.cancel();
            while runs.join_next().await.is_some() {}
            self.stats.send_modify(|s| {
                s.running.clear();
                s.queued = 0;
            });
            failure.map_or(Ok(()), Err)
        })
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

impl TestRunnerService {
    fn context(&self, config: &TestRunnerConfig) -> Result<Arc<RunContext>, ServiceError> {
        if let Some(why) = &config.logs_refused {
            return Err(ServiceError::new(why.clone()));
        }
        std::fs::create_dir_all(&config.logs_dir).map_err(|e| {
            ServiceError::new(format!(
                "test logs directory {}: {e}",
                config.logs_dir.display()
            ))
        })?;
        Ok(Arc::new(RunContext {
            node_name: config.node_name.clone(),
            logs_dir: config.logs_dir.clone(),
            commands: config.commands.clone(),
            log_limits: config.log_limits,
            kube: self
                .client
                .clone()
                .map(|c| Kube::new(c, config.node_name.clone())),
            events: self.events.clone(),
            stats: self.stats.clone(),
            results: self.results.clone(),
            locks: self.locks.clone(),
        }))
    }

    /// An unusable test request: say why on the Node and remove it.
    async fn reject_request(&self, ctx: &RunContext, value: &str, why: &str) -> Option<String> {
        let message = format!("{TEST_REQUEST_ANNOTATION}={value:?}: {why}");
        tracing::warn!(%message, "test request rejected");
        config_error(ctx, &message).await;
        let kube = ctx.kube.as_ref()?;
        match kube.remove_request(value).await {
            Ok(removed) => removed,
            Err(e) => {
                tracing::warn!(error = %e, "cannot remove the rejected test request");
                None
            }
        }
    }
}

/// A configuration or request the runner cannot use: a Warning Event.
async fn config_error(ctx: &RunContext, message: &str) {
    let Some(events) = &ctx.events else {
        return;
    };
    let labels = [
        ("category", CATEGORY.to_ascii_lowercase()),
        ("hostname", label_value(&ctx.node_name)),
    ]
    .into_iter()
    .map(|(k, v)| (format!("{LABEL_PREFIX}{k}"), v))
    .collect();
    let content = EventContent {
        type_: "Warning".into(),
        reason: CONFIG_ERROR_REASON.into(),
        message: message.to_owned(),
        labels,
    };
    events.record(node_event(content)).await;
}

/// Runs a started request's test cases and reports each.
async fn execute(
    ctx: Arc<RunContext>,
    start: Start,
    targets: Vec<TargetGpu>,
    cancel: CancellationToken,
) -> Finished {
    let trigger = start.request.trigger;
    let mut cancelled = false;
    for case in &start.request.cases {
        let report = match select_gpus(&start.request.target, case, &targets) {
            Err(why) => {
                tracing::warn!(trigger = %trigger, recipe = %case.recipe, %why, "nothing to test");
                CaseReport::nothing_tested(trigger, case, &why)
            }
            Ok(selection) => {
                let running: Vec<RunningTest> = selection
                    .gpus
                    .iter()
                    .map(|g| RunningTest {
                        gpu_index: g.index,
                        bdf: g.bdf.clone(),
                        trigger,
                        recipe: case.recipe.clone(),
                    })
                    .collect();
                let keys: Vec<String> = selection
                    .gpus
                    .iter()
                    .map(|g| running_label_key(&case.recipe, g.index))
                    .collect();
                ctx.stats.send_modify(|s| s.set_running(&running, true));
                if let Some(kube) = &ctx.kube
                    && let Err(e) = kube.set_running(&keys, true).await
                {
                    tracing::warn!(error = %e, "cannot set the test running labels");
                }
                let bdfs = selection.gpus.iter().map(|g| g.bdf.as_str());
                let report = tokio::select! {
                    held = ctx.locks.hold(bdfs) => {
                        let report = run_case(
                            trigger,
                            case,
                            &selection.gpus,
                            selection.pass_ids,
                            &ctx.commands,
                            Logs {
                                dir: &ctx.logs_dir,
                                limits: &ctx.log_limits,
                            },
                            &cancel,
                        )
                        .await;
                        drop(held);
                        report
                    }
                    _ = cancel.cancelled() => CaseReport::cancelled_before_start(trigger, case),
                };
                if let Some(kube) = &ctx.kube
                    && let Err(e) = kube.set_running(&keys, false).await
                {
                    tracing::warn!(error = %e, "cannot remove the test running labels");
                }
                ctx.stats.send_modify(|s| s.set_running(&running, false));
                report
            }
        };
        if report.cancelled {
            cancelled = true;
            break;
        }
        let finished = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        let result = LastRun {
            trigger,
            recipe: case.recipe.clone(),
            outcome: report.outcome,
            duration_seconds: report.duration.as_secs_f64(),
            finished_unix_seconds: finished,
            gpu_indexes: report.gpu_indexes(),
        };
        let gpu_indexes = result.gpu_indexes.clone();
        // Handed over before it is counted, so that whoever sees the count can
        // have it. No reader (the agent's Events go through the sink) is not an
        // error.
        let _ = ctx.results.send(result);
        ctx.stats.send_modify(|s| {
            s.record(
                trigger,
                &case.recipe,
                report.outcome,
                report.duration,
                finished,
                gpu_indexes,
            )
        });
        if let Some(events) = &ctx.events {
            events
                .record(node_event(report.event(&ctx.node_name)))
                .await;
        }
    }
    let manual = match (&start.request.manual, cancelled) {
        (Some(value), false) => {
            let removed = match &ctx.kube {
                Some(kube) => match kube.remove_request(value).await {
                    Ok(removed) => removed,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot remove the handled test request");
                        None
                    }
                },
                None => None,
            };
            Some((value.clone(), removed))
        }
        _ => None,
    };
    Finished {
        id: start.id,
        manual,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_logs_directory_outside_var_log_is_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let host = crate::host::HostRoot::new(dir.path());
        let mut spec = crate::api::TestRunnerSpec::default();
        spec.logs_location.host_path = "/etc/cron.d".into();
        let config = TestRunnerConfig::for_spec(&spec, host.clone(), "node-a", None);
        let (_inventory_tx, inventory) = watch::channel(Arc::new(Inventory::default()));
        let (_node_tx, node) = watch::channel(None);
        let (_unhealthy_tx, unhealthy) = mpsc::channel(1);
        let service = TestRunnerService::new(None, None, inventory, node, unhealthy);
        let Err(error) = service.context(&config) else {
            panic!("a logs directory under /etc was accepted");
        };
        assert!(
            error.0.contains("logsLocation.hostPath") && error.0.contains("/var/log/"),
            "{}",
            error.0
        );
        assert!(!dir.path().join("etc").exists(), "nothing is created");
        // The default is accepted, and created under the host root.
        let config = TestRunnerConfig::for_spec(
            &crate::api::TestRunnerSpec::default(),
            host,
            "node-a",
            None,
        );
        assert!(service.context(&config).is_ok());
        assert!(dir.path().join("var/log/amd-test-runner").is_dir());
    }
}
