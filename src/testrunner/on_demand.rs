//! "Run this test case on these GPUs now", for callers outside the runner's
//! own triggers (a remediation's validation): the node's GPUs as the runner
//! numbers them, narrowed to one GPU if asked, the GPUs' locks shared with
//! the runner held for the run, and the runner's own execution (the same
//! commands, process groups, timeouts and logs).
//!
//! This module must not decide whether a run is wanted, judge its result
//! beyond the [`CaseReport`], nor write Events or the Node: the caller does.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::exclusive::GpuLocks;
use super::execute::{CaseReport, Logs, run_case};
use super::gpus::read_targets;
use super::{TestCase, TestRunnerConfig, Trigger};
use crate::device::Inventory;

/// One run on demand, as it ended.
#[derive(Clone, Debug)]
pub struct OnDemandRun {
    /// How many GPUs it ran on (none: nothing was run).
    pub gpus: usize,
    pub report: CaseReport,
}

/// Runs `case` now (as a manual trigger) on every GPU of `inventory`, or on
/// GPU `only`, once `locks` hold them; `stop` cancels the wait and the run.
/// The logs directory must exist.
pub async fn run_now(
    config: &TestRunnerConfig,
    inventory: Arc<Inventory>,
    only: Option<&str>,
    case: &TestCase,
    locks: &GpuLocks,
    stop: &CancellationToken,
) -> OnDemandRun {
    let host = config.host.clone();
    let mut gpus = tokio::task::spawn_blocking(move || read_targets(&inventory, &host))
        .await
        .unwrap_or_default();
    if let Some(bdf) = only {
        gpus.retain(|g| g.bdf == bdf);
    }
    tracing::info!(recipe = %case.recipe, framework = case.framework.name(), gpus = gpus.len(), "running a test case on demand");
    let logs = Logs {
        dir: &config.logs_dir,
        limits: &config.log_limits,
    };
    let report = tokio::select! {
        held = locks.hold(gpus.iter().map(|g| g.bdf.as_str())) => {
            let ran = run_case(
                Trigger::Manual,
                case,
                &gpus,
                false,
                &config.commands,
                logs,
                stop,
            )
            .await;
            drop(held);
            ran
        }
        _ = stop.cancelled() => CaseReport::cancelled_before_start(Trigger::Manual, case),
    };
    OnDemandRun {
        gpus: gpus.len(),
        report,
    }
}
