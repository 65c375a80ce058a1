//! The agent's side of a remediation of its own Node: what the leader's
//! record ([`crate::remediation::Record`]) asks of the node itself.
//! - `Rebooting` from the boot id the node runs: reboot, through the
//!   agent's reboot command (`--reboot-command`, the same one driver
//!   upgrades use), once per boot id; the new boot id in the agent's status
//!   tells the leader it is back. When this agent leads, it first stops its
//!   cluster role and releases the Lease, so that a standby takes over at
//!   once rather than when the Lease expires: the leader's own node is
//!   remediated like any other.
//! - `Validating` with a request id not answered yet: run the entry's
//!   `validationTestsProfile` on every GPU of the node, through the test
//!   runner's own execution ([`crate::testrunner::execute::run_case`]: the
//!   same commands, process groups, timeouts and logs), and publish the
//!   result, which the agent puts in its status for the leader.
//!
//! This module must not write the Node or decide the remediation's steps:
//! it only answers the record.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::api::agent_status::{DriverReport, RemediationTestReport};
use crate::device::Inventory;
use crate::driver::reboot::{self, RebootCommand};
use crate::events::{EventSink, NodeEvent};
use crate::remediation::mapping::ValidationTestsProfile;
use crate::remediation::{Phase, Record};
use crate::testrunner::config::{Framework, TestCase, Trigger};
use crate::testrunner::execute::{Logs, run_case};
use crate::testrunner::gpus::read_targets;
use crate::testrunner::{Outcome, TestRunnerConfig};

/// Where the task gets its facts.
pub struct Feeds {
    pub node: watch::Receiver<Option<Arc<Node>>>,
    pub driver: watch::Receiver<Option<DriverReport>>,
    pub inventory: watch::Receiver<Arc<Inventory>>,
    pub events: EventSink,
    /// How the node reboots; `None`: a reboot request fails, with an Event.
    pub reboot: Option<RebootCommand>,
    /// Where the test tools are and where logs go.
    pub tests: TestRunnerConfig,
    /// The agent's cluster role, if it campaigns: stopped before a reboot.
    pub leader: Arc<tokio::sync::Mutex<Option<super::LeaderRole>>>,
}

/// What the record asks of this node now. Pure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Asked {
    Nothing,
    Reboot {
        from: String,
    },
    Validate {
        id: String,
        profile: ValidationTestsProfile,
    },
}

/// Reads the record's request, given the boot id the node runs.
pub fn asked(record: &Record, boot_id: Option<&str>) -> Asked {
    let Some(run) = &record.run else {
        return Asked::Nothing;
    };
    match run.phase {
        Phase::Rebooting => match (&run.reboot_from, boot_id) {
            (Some(from), Some(boot)) if from == boot => Asked::Reboot { from: from.clone() },
            _ => Asked::Nothing,
        },
        Phase::Validating => match (&run.test, &run.entry.validation_tests_profile) {
            (Some(id), Some(profile)) => Asked::Validate {
                id: id.clone(),
                profile: profile.clone(),
            },
            _ => Asked::Nothing,
        },
        _ => Asked::Nothing,
    }
}

/// The test case a profile asks for. Pure.
pub fn test_case(profile: &ValidationTestsProfile) -> TestCase {
    let mut case = TestCase::new(profile.recipe.clone());
    case.framework = Framework::parse(&profile.framework).unwrap_or(Framework::Agfhc);
    if profile.iterations > 0 {
        case.iterations = profile.iterations;
    }
    case.stop_on_failure = profile.stop_on_failure;
    if profile.timeout_seconds > 0 {
        case.timeout = std::time::Duration::from_secs(profile.timeout_seconds);
    }
    case
}

/// Starts the task; it ends when `stop` fires. The receiver carries the
/// answer to the latest validation request.
pub fn spawn(
    feeds: Feeds,
    stop: CancellationToken,
) -> (
    watch::Receiver<Option<RemediationTestReport>>,
    AbortOnDropHandle<()>,
) {
    let (report_tx, report_rx) = watch::channel(None);
    let task = tokio::spawn(run(feeds, report_tx, stop));
    (report_rx, AbortOnDropHandle::new(task))
}

async fn run(
    mut feeds: Feeds,
    report: watch::Sender<Option<RemediationTestReport>>,
    stop: CancellationToken,
) {
    // The boot id this process asked to reboot from: once per boot.
    let mut rebooted_from: Option<String> = None;
    loop {
        let node = feeds.node.borrow_and_update().clone();
        let boot_id = feeds
            .driver
            .borrow_and_update()
            .as_ref()
            .and_then(|d| d.boot_id.clone());
        if let Some(node) = node {
            let record = Record::of_annotations(node.annotations());
            match asked(&record, boot_id.as_deref()) {
                Asked::Nothing => {}
                Asked::Reboot { from } => {
                    if rebooted_from.as_deref() != Some(from.as_str()) {
                        rebooted_from = Some(from.clone());
                        reboot_now(&feeds, &from).await;
                    }
                }
                Asked::Validate { id, profile } => {
                    let answered = report.borrow().as_ref().is_some_and(|r| r.id == id);
                    if !answered {
                        match validate_while_asked(&feeds, &id, &profile, &stop).await {
                            Some(result) => {
                                report.send_replace(Some(result));
                            }
                            None if stop.is_cancelled() => return,
                            // The record stopped asking (an abort): no answer.
                            None => {}
                        }
                    }
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = feeds.node.changed() => if changed.is_err() { return },
            changed = feeds.driver.changed() => if changed.is_err() { return },
        }
    }
}

/// Runs the validation `id` asks for, and stops it when the record no
/// longer asks for it (a person aborted the run, say) or the agent stops:
/// then `None`.
async fn validate_while_asked(
    feeds: &Feeds,
    id: &str,
    profile: &ValidationTestsProfile,
    stop: &CancellationToken,
) -> Option<RemediationTestReport> {
    let run_stop = stop.child_token();
    let mut node = feeds.node.clone();
    let validation = validate(feeds, id, profile, &run_stop);
    tokio::pin!(validation);
    loop {
        tokio::select! {
            result = &mut validation => {
                return (!run_stop.is_cancelled()).then_some(result);
            }
            changed = node.changed(), if !run_stop.is_cancelled() => {
                let still_asked = changed.is_ok()
                    && node.borrow_and_update().as_ref().is_some_and(|n| {
                        matches!(
                            asked(&Record::of_annotations(n.annotations()), None),
                            Asked::Validate { id: ref asked, .. } if asked == id
                        )
                    });
                if !still_asked {
                    tracing::info!(%id, "the remediation no longer asks for its tests: stopping them");
                    run_stop.cancel();
                }
            }
        }
    }
}

async fn reboot_now(feeds: &Feeds, from: &str) {
    let role = feeds.leader.lock().await.take();
    if let Some(role) = role {
        tracing::info!("handing the cluster role over before the reboot");
        role.step_down().await;
    }
    tracing::warn!(boot = %from, "rebooting the node: its remediation asks");
    feeds
        .events
        .record(NodeEvent::agent(
            EventType::Warning,
            "Remediation",
            "RemediationReboot",
            format!("rebooting the node for its remediation (from boot {from})"),
        ))
        .await;
    if let Err(e) = reboot::reboot(feeds.reboot.as_ref()).await {
        tracing::error!(error = %e, "cannot reboot the node for its remediation");
        feeds
            .events
            .record(NodeEvent::agent(
                EventType::Warning,
                "Remediation",
                "RemediationRebootFailed",
                format!("cannot reboot the node for its remediation: {e}"),
            ))
            .await;
    }
}

async fn validate(
    feeds: &Feeds,
    id: &str,
    profile: &ValidationTestsProfile,
    stop: &CancellationToken,
) -> RemediationTestReport {
    let case = test_case(profile);
    let tests = &feeds.tests;
    if let Some(why) = &tests.logs_refused {
        return RemediationTestReport {
            id: id.to_owned(),
            passed: false,
            message: why.clone(),
        };
    }
    let dir = tests.logs_dir.clone();
    let created = tokio::task::spawn_blocking(move || std::fs::create_dir_all(&dir)).await;
    if let Ok(Err(e)) | Err(e) = created.map_err(std::io::Error::other) {
        return RemediationTestReport {
            id: id.to_owned(),
            passed: false,
            message: format!(
                "cannot create the test logs directory {}: {e}",
                tests.logs_dir.display()
            ),
        };
    }
    let inventory = feeds.inventory.borrow().clone();
    let host = tests.host.clone();
    let gpus = tokio::task::spawn_blocking(move || read_targets(&inventory, &host))
        .await
        .unwrap_or_default();
    tracing::info!(%id, recipe = %case.recipe, framework = case.framework.name(), gpus = gpus.len(), "running the remediation's validation tests");
    let logs = Logs {
        dir: &tests.logs_dir,
        limits: &tests.log_limits,
    };
    let ran = run_case(
        Trigger::Manual,
        &case,
        &gpus,
        false,
        &tests.commands,
        logs,
        stop,
    )
    .await;
    let passed = ran.outcome == Outcome::Passed && !gpus.is_empty();
    let message = if gpus.is_empty() {
        "no GPU to test".to_owned()
    } else {
        format!(
            "{} {} on {} GPU(s): {:?} ({})",
            case.framework.name(),
            case.recipe,
            gpus.len(),
            ran.outcome,
            ran.message()
        )
    };
    feeds
        .events
        .record(NodeEvent::agent(
            if passed {
                EventType::Normal
            } else {
                EventType::Warning
            },
            "Remediation",
            if passed {
                "RemediationTestPassed"
            } else {
                "RemediationTestFailed"
            },
            message.clone(),
        ))
        .await;
    RemediationTestReport {
        id: id.to_owned(),
        passed,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remediation::mapping::Entry;
    use crate::remediation::record::Run;

    fn record(phase: Phase) -> Record {
        Record {
            run: Some(Run {
                condition: "AMDGPUUnhealthy".into(),
                phase,
                started: String::new(),
                since: String::new(),
                entry: Entry {
                    validation_tests_profile: Some(ValidationTestsProfile {
                        framework: "rvs".into(),
                        recipe: "gst_single".into(),
                        iterations: 2,
                        stop_on_failure: true,
                        timeout_seconds: 30,
                    }),
                    ..Entry::default()
                },
                quarantined: true,
                reboot_from: Some("boot-1".into()),
                test: Some("t-1".into()),
                checks: 0,
                last_check: None,
                reason: None,
            }),
            attempts: Vec::new(),
        }
    }

    #[test]
    fn a_reboot_is_asked_only_from_the_boot_the_node_runs() {
        let r = record(Phase::Rebooting);
        assert_eq!(
            asked(&r, Some("boot-1")),
            Asked::Reboot {
                from: "boot-1".into()
            }
        );
        assert_eq!(
            asked(&r, Some("boot-2")),
            Asked::Nothing,
            "rebooted already"
        );
        assert_eq!(asked(&r, None), Asked::Nothing);
        assert_eq!(
            asked(&record(Phase::Draining), Some("boot-1")),
            Asked::Nothing
        );
    }

    #[test]
    fn validation_runs_the_profile_as_a_test_case() {
        let Asked::Validate { id, profile } = asked(&record(Phase::Validating), None) else {
            panic!("no validation asked");
        };
        assert_eq!(id, "t-1");
        let case = test_case(&profile);
        assert_eq!(
            case.framework,
            Framework::Rvs,
            "framework names ignore case"
        );
        assert_eq!(case.iterations, 2);
        assert_eq!(case.timeout, std::time::Duration::from_secs(30));
        assert!(case.stop_on_failure);
    }
}
