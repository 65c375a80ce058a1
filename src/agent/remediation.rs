//! The agent's side of a remediation of its own Node: what the leader's
//! record ([`crate::remediation::Record`]) asks of the node itself.
//! - `Rebooting` from the boot id the node runs: reboot, through the
//!   agent's reboot command (`--reboot-command`, the same one driver
//!   upgrades use), once per boot id; the new boot id in the agent's status
//!   tells the leader it is back. When this agent leads, it first stops its
//!   cluster role and releases the Lease, so that a standby takes over at
//!   once rather than when the Lease expires: the leader's own node is
//!   remediated like any other.
//! - `IsolatingGpu` (`gpuResetFirst`): say which one GPU is at fault, from
//!   the health monitor, and which pods hold it, from the kubelet's
//!   PodResources API ([`crate::pod_resources`]: device plugin devices and
//!   DRA claims alike); no answer naming a GPU when none or several are
//!   unhealthy.
//! - `ResettingGpu`: reset that GPU through the driver's recovery interface
//!   ([`crate::driver::gpu_reset`]), then run the entry's
//!   `validationTestsProfile` on that GPU only, and answer.
//! - `Validating` with a request id not answered yet: run the entry's
//!   `validationTestsProfile` on every GPU of the node, through the test
//!   runner's own execution ([`crate::testrunner::run_now`]: the
//!   same commands, process groups, timeouts and logs), and publish the
//!   result, which the agent puts in its status for the leader.
//!
//! This module must not write the Node or decide the remediation's steps:
//! it only answers the record.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::api::agent_status::{DriverReport, RemediationTestReport};
use crate::device::Inventory;
use crate::driver::gpu_reset::{self, GpuReset};
use crate::driver::reboot::{self, RebootCommand};
use crate::events::{EventSink, NodeEvent};
use crate::health::HealthSnapshot;
use crate::host::reader::BoundedReader;
use crate::remediation::mapping::ValidationTestsProfile;
use crate::remediation::{Phase, Record};
use crate::service::Followers;
use crate::testrunner::command::{tool_flag, tool_unavailable};
use crate::testrunner::config::{Framework, TestCase};
use crate::testrunner::{GpuLocks, OnDemandRun, Outcome, TestRunnerConfig, run_now};

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
    /// The health monitor's view: which GPU is at fault.
    pub health: watch::Receiver<Arc<HealthSnapshot>>,
    /// The kubelet's PodResources socket (the metrics exporter's, as the
    /// DeviceConfig sets it): which pods hold that GPU.
    pub pod_resources: watch::Receiver<PathBuf>,
    /// How a GPU is reset, and the host reader a debugfs reset goes through.
    pub gpu_reset: GpuReset,
    pub reader: BoundedReader,
    /// The node's GPU locks, which the test runner takes too: a validation
    /// waits for a test the runner has going on its GPUs, and the other way
    /// round.
    pub gpu_locks: GpuLocks,
}

impl Feeds {
    /// Records a Warning Event of reason `reason` about the node's
    /// remediation.
    async fn warn(&self, reason: &str, message: String) {
        self.events
            .record(NodeEvent::agent(
                EventType::Warning,
                "Remediation",
                reason,
                message,
            ))
            .await;
    }
}

/// How long the kubelet may take to list pod resources.
const POD_RESOURCES_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

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
    IsolateGpu {
        id: String,
    },
    ResetGpu {
        id: String,
        gpu: String,
        profile: Option<ValidationTestsProfile>,
    },
}

impl Asked {
    /// The request's id, for the requests the agent answers.
    pub fn id(&self) -> Option<&str> {
        match self {
            Self::Nothing | Self::Reboot { .. } => None,
            Self::Validate { id, .. } | Self::IsolateGpu { id } | Self::ResetGpu { id, .. } => {
                Some(id)
            }
        }
    }
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
        Phase::IsolatingGpu => match &run.test {
            Some(id) => Asked::IsolateGpu { id: id.clone() },
            None => Asked::Nothing,
        },
        Phase::ResettingGpu => match (&run.test, &run.gpu) {
            (Some(id), Some(gpu)) => Asked::ResetGpu {
                id: id.clone(),
                gpu: gpu.clone(),
                profile: run.entry.validation_tests_profile.clone(),
            },
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

/// The one GPU at fault, by PCI address; why there is none to reset
/// otherwise. Pure.
pub fn faulty_gpu(snapshot: &HealthSnapshot) -> Result<String, String> {
    let unhealthy: Vec<&String> = snapshot.unhealthy().map(|(bdf, _)| bdf).collect();
    match unhealthy.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(
            "the health monitor finds no GPU of the node unhealthy (the condition \
                   may come from another detector, or health is not enabled)"
                .to_owned(),
        ),
        many => Err(format!(
            "{} GPUs are unhealthy ({}): the fault is not confined to one GPU",
            many.len(),
            many.iter()
                .map(|b| b.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
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
    case.command = profile.command.clone();
    if profile.timeout_seconds > 0 {
        case.timeout = std::time::Duration::from_secs(profile.timeout_seconds);
    }
    case
}

/// The follower's name.
pub const FOLLOWER: &str = "remediation";

/// Starts the task, as one of `followers`; it ends when `stop` fires (or
/// the Node or driver feed closes). The receiver carries the answer to the
/// latest validation request.
pub fn spawn(
    feeds: Feeds,
    followers: &Followers,
    stop: CancellationToken,
) -> (
    watch::Receiver<Option<RemediationTestReport>>,
    AbortOnDropHandle<()>,
) {
    let (report_tx, report_rx) = watch::channel(None);
    let task = followers.spawn(FOLLOWER, run(feeds, report_tx, stop));
    (report_rx, task)
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
                Asked::IsolateGpu { id } => {
                    let answered = report.borrow().as_ref().is_some_and(|r| r.id == id);
                    if !answered {
                        let answer = isolate(&feeds, &id).await;
                        report.send_replace(Some(answer));
                    }
                }
                Asked::ResetGpu { id, gpu, profile } => {
                    let answered = report.borrow().as_ref().is_some_and(|r| r.id == id);
                    if !answered {
                        let work = |run_stop| {
                            reset_and_test(&feeds, &id, &gpu, profile.as_ref(), run_stop)
                        };
                        match while_asked(&feeds, &id, work, &stop).await {
                            Some(result) => {
                                report.send_replace(Some(result));
                            }
                            None if stop.is_cancelled() => return,
                            None => {}
                        }
                    }
                }
                Asked::Validate { id, profile } => {
                    let answered = report.borrow().as_ref().is_some_and(|r| r.id == id);
                    if !answered {
                        let work = |run_stop| validate(&feeds, &id, &profile, None, run_stop);
                        match while_asked(&feeds, &id, work, &stop).await {
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

/// Runs `work` (the tests `id` asks for), and stops it when the record no
/// longer asks for `id` (a person aborted the run, say) or the agent stops:
/// then `None`.
async fn while_asked<F, Fut>(
    feeds: &Feeds,
    id: &str,
    work: F,
    stop: &CancellationToken,
) -> Option<RemediationTestReport>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: std::future::Future<Output = RemediationTestReport>,
{
    let run_stop = stop.child_token();
    let mut node = feeds.node.clone();
    let work = work(run_stop.clone());
    tokio::pin!(work);
    loop {
        tokio::select! {
            result = &mut work => {
                return (!run_stop.is_cancelled()).then_some(result);
            }
            changed = node.changed(), if !run_stop.is_cancelled() => {
                let still_asked = changed.is_ok()
                    && node.borrow_and_update().as_ref().is_some_and(|n| {
                        asked(&Record::of_annotations(n.annotations()), None).id() == Some(id)
                    });
                if !still_asked {
                    tracing::info!(%id, "the remediation no longer asks for its tests: stopping them");
                    run_stop.cancel();
                }
            }
        }
    }
}

/// Which GPU is at fault and which pods hold it.
async fn isolate(feeds: &Feeds, id: &str) -> RemediationTestReport {
    let answer = |passed: bool, message: String, gpu: Option<String>, pods: Vec<String>| {
        RemediationTestReport {
            id: id.to_owned(),
            passed,
            message,
            gpu,
            pods,
            not_run: None,
        }
    };
    let snapshot = feeds.health.borrow().clone();
    let bdf = match faulty_gpu(&snapshot) {
        Ok(bdf) => bdf,
        Err(why) => return answer(false, why, None, Vec::new()),
    };
    let pods = match holders(feeds, &bdf).await {
        Ok(pods) => pods,
        Err(why) => return answer(false, why, None, Vec::new()),
    };
    tracing::info!(%id, gpu = %bdf, ?pods, "the remediation's fault is confined to one GPU");
    answer(
        true,
        format!(
            "GPU {bdf} is the one unhealthy GPU; {} pod(s) hold it",
            pods.len()
        ),
        Some(bdf),
        pods,
    )
}

/// The pods that hold GPU `bdf`, as the kubelet says. Not knowing (no
/// PodResources socket, the kubelet not answering) is an error: a reset
/// could pull the GPU from under a pod, so the whole node is drained
/// instead.
async fn holders(feeds: &Feeds, bdf: &str) -> Result<Vec<String>, String> {
    let socket = feeds.pod_resources.borrow().clone();
    let response = match crate::pod_resources::list(&socket, POD_RESOURCES_TIMEOUT).await {
        Ok(Some(response)) => response,
        Ok(None) => {
            return Err(format!(
                "cannot tell which pods hold GPU {bdf}: no kubelet PodResources socket at {}",
                socket.display()
            ));
        }
        Err(e) => return Err(format!("cannot tell which pods hold GPU {bdf}: {e}")),
    };
    let inventory = feeds.inventory.borrow().clone();
    let xcp = crate::plugin::devices::xcp_names_of(&inventory);
    let device_ids = crate::telemetry::devices::device_ids(&inventory, &xcp);
    let dra_devices: BTreeMap<String, String> =
        crate::dra::devices::devices_of(&inventory, &Default::default())
            .into_iter()
            .map(|d| (d.name, d.gpu_bdf))
            .collect();
    Ok(crate::pod_resources::pods_holding(
        &response,
        &device_ids,
        &dra_devices,
        bdf,
    ))
}

/// Resets GPU `bdf`, then runs the profile's tests on it alone.
async fn reset_and_test(
    feeds: &Feeds,
    id: &str,
    bdf: &str,
    profile: Option<&ValidationTestsProfile>,
    stop: CancellationToken,
) -> RemediationTestReport {
    let failed = |message: String| RemediationTestReport {
        id: id.to_owned(),
        passed: false,
        message,
        ..RemediationTestReport::default()
    };
    let inventory = feeds.inventory.borrow().clone();
    let Some(gpu) = inventory.gpus.iter().find(|g| g.bdf == bdf).cloned() else {
        return failed(format!("GPU {bdf} is not on this node any more"));
    };
    // The drain evicted the pods found when the fault was isolated; one that
    // came since (it tolerates the quarantine), or that the drain leaves (a
    // DaemonSet's), still holds the GPU: no reset under it.
    match holders(feeds, bdf).await {
        Ok(pods) if pods.is_empty() => {}
        Ok(pods) => {
            return failed(format!(
                "pods still hold GPU {bdf} ({}): no reset under them",
                pods.join(", ")
            ));
        }
        Err(why) => return failed(why),
    }
    feeds
        .warn(
            "RemediationGpuReset",
            format!("resetting GPU {bdf} for its remediation"),
        )
        .await;
    let reset = tokio::select! {
        reset = gpu_reset::reset(&feeds.gpu_reset, &feeds.reader, &gpu) => reset,
        _ = stop.cancelled() => Err("cancelled".to_owned()),
    };
    let how = match reset {
        Ok(how) => how,
        Err(why) => {
            let message = format!("cannot reset GPU {bdf}: {why}");
            tracing::warn!(%id, "{message}");
            feeds
                .warn("RemediationGpuResetFailed", message.clone())
                .await;
            return failed(message);
        }
    };
    match profile {
        Some(profile) => {
            let mut report = validate(feeds, id, profile, Some(bdf), stop).await;
            report.message = format!("{how}; {}", report.message);
            report
        }
        None => RemediationTestReport {
            id: id.to_owned(),
            passed: true,
            message: how,
            ..RemediationTestReport::default()
        },
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
        .warn(
            "RemediationReboot",
            format!("rebooting the node for its remediation (from boot {from})"),
        )
        .await;
    if let Err(e) = reboot::reboot(feeds.reboot.as_ref()).await {
        tracing::error!(error = %e, "cannot reboot the node for its remediation");
        feeds
            .warn(
                "RemediationRebootFailed",
                format!("cannot reboot the node for its remediation: {e}"),
            )
            .await;
    }
}

/// Runs the profile's tests on every GPU of the node, or on GPU `only`.
async fn validate(
    feeds: &Feeds,
    id: &str,
    profile: &ValidationTestsProfile,
    only: Option<&str>,
    stop: CancellationToken,
) -> RemediationTestReport {
    let case = test_case(profile);
    let tests = &feeds.tests;
    // A tool that cannot start tested nothing: its own answer, naming the
    // tool and the agent's flag, never a verdict on the GPUs.
    if let Some((program, why)) = tool_unavailable(&case, &tests.commands) {
        let message = format!(
            "{} {} not run: the {} test tool {} cannot be used: {why} (give the agent {} \
             and the tool in its pod: deploy/README.md, GPU validation tools)",
            case.framework.name(),
            case.recipe,
            case.framework.name(),
            program.display(),
            tool_flag(case.framework),
        );
        tracing::warn!(%id, "{message}");
        feeds.warn("RemediationTestNotRun", message.clone()).await;
        return RemediationTestReport {
            id: id.to_owned(),
            passed: false,
            message: message.clone(),
            not_run: Some(message),
            ..RemediationTestReport::default()
        };
    }
    if let Some(why) = &tests.logs_refused {
        return RemediationTestReport {
            id: id.to_owned(),
            passed: false,
            message: why.clone(),
            ..RemediationTestReport::default()
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
            ..RemediationTestReport::default()
        };
    }
    let inventory = feeds.inventory.borrow().clone();
    tracing::info!(%id, recipe = %case.recipe, framework = case.framework.name(), only = ?only, "running the remediation's validation tests");
    let OnDemandRun { gpus, report: ran } =
        run_now(tests, inventory, only, &case, &feeds.gpu_locks, &stop).await;
    let passed = ran.outcome == Outcome::Passed && gpus > 0 && !ran.cancelled;
    let message = if gpus == 0 {
        "no GPU to test".to_owned()
    } else if ran.cancelled {
        format!(
            "{} {} on {} GPU(s) stopped before its end: the remediation was aborted",
            case.framework.name(),
            case.recipe,
            gpus
        )
    } else if let Some(why) = ran.missing_results(&tests.commands) {
        format!(
            "{} {} on {} GPU(s): {:?}: {why}",
            case.framework.name(),
            case.recipe,
            gpus,
            ran.outcome,
        )
    } else {
        format!(
            "{} {} on {} GPU(s): {:?} ({})",
            case.framework.name(),
            case.recipe,
            gpus,
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
            } else if ran.cancelled {
                "RemediationTestAborted"
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
        ..RemediationTestReport::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remediation::mapping::Entry;
    use crate::remediation::record::Run;

    fn record(phase: Phase) -> Record {
        let entry = Entry {
            node_condition: "AMDGPUUnhealthy".into(),
            validation_tests_profile: Some(ValidationTestsProfile {
                framework: "rvs".into(),
                recipe: "gst_single".into(),
                iterations: 2,
                stop_on_failure: true,
                timeout_seconds: 30,
                ..ValidationTestsProfile::default()
            }),
            ..Entry::default()
        };
        Record {
            run: Some(Run {
                reboot_from: Some("boot-1".into()),
                test: Some("t-1".into()),
                gpu: Some("0000:03:00.0".into()),
                ..Run::begin(&entry, phase, true, "")
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

    #[test]
    fn a_reset_is_asked_with_its_gpu_and_an_isolation_by_its_id() {
        let reset = asked(&record(Phase::ResettingGpu), Some("boot-1"));
        let Asked::ResetGpu { id, gpu, profile } = &reset else {
            panic!("no reset asked: {reset:?}");
        };
        assert_eq!((id.as_str(), gpu.as_str()), ("t-1", "0000:03:00.0"));
        assert!(profile.is_some());
        assert_eq!(reset.id(), Some("t-1"));
        assert_eq!(
            asked(&record(Phase::IsolatingGpu), None),
            Asked::IsolateGpu { id: "t-1".into() }
        );
    }

    #[test]
    fn only_one_unhealthy_gpu_is_a_fault_to_reset() {
        use crate::health::GpuHealth;
        let health = |healthy: bool| GpuHealth {
            healthy,
            reasons: Vec::new(),
            gpu_ids: Vec::new(),
        };
        let mut snapshot = HealthSnapshot::default();
        snapshot.gpus.insert("0000:03:00.0".into(), health(true));
        assert!(faulty_gpu(&snapshot).unwrap_err().contains("no GPU"));
        snapshot.gpus.insert("0000:04:00.0".into(), health(false));
        assert_eq!(faulty_gpu(&snapshot).unwrap(), "0000:04:00.0");
        snapshot.gpus.insert("0000:05:00.0".into(), health(false));
        let why = faulty_gpu(&snapshot).unwrap_err();
        assert!(
            why.contains("2 GPUs") && why.contains("0000:05:00.0"),
            "{why}"
        );
    }
}
