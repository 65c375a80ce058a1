//! The remediation decisions, pure: [`node_step`] takes one node's facts
//! and says what to do next with it; [`admit`] decides, across every
//! selected node, which new runs may start (`maxParallelWorkflows`, the
//! circuit breaker, force-resumed nodes first). The leader carries the
//! [`Decision`]s out. Neither reads the clock: `now` is passed in.
//!
//! Per node, the steps of a run are (`Phase`):
//! gate → [GPU reset first, when the entry asks (`gpuResetFirst`):
//! quarantine, the agent isolates the faulty GPU (`IsolatingGpu`), only its
//! pods are drained (`DrainingGpu`), the agent resets it and tests it alone
//! (`ResettingGpu`) → confirm; a fault on several GPUs or a failed reset
//! escalates to the whole-node steps:] quarantine + drain (`Draining`) → notify → a person, when the entry
//! needs physical action (`AwaitingPerson`) → reboot (`Rebooting`, unless
//! `skipRebootStep`) → validate (`Validating`, when the entry has a test
//! profile) → confirm (`Confirming`: the condition False at
//! [`Confirm::checks`] checks, [`Confirm::interval`] apart, within
//! [`Confirm::within`]) → release. Any failure is `Failed`; the abort label
//! makes it `Aborted`; a full recovery window makes it `Held`. In those three
//! the node stays quarantined until a person removes the taint (then the
//! labels go too), or sets the force-resume label (a new run starts,
//! whatever the window and the breaker say).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::mapping::{Entry, Mapping};
use super::record::{Attempt, Phase, Record, Run};
use crate::api::syntax::CountOrPercent;

/// Set to `true` by a person: start, resume or restart the node's run.
pub const FORCE_RESUME_LABEL: &str = "operator.amd.com/gpu-force-resume-workflow";
/// Set to `true` by a person: stop the node's run where it is.
pub const ABORT_LABEL: &str = "operator.amd.com/gpu-abort-workflow";
/// `true` on a Node or on the DeviceConfig: no new run starts there;
/// running ones go on.
pub const PAUSE_LABEL: &str = "operator.amd.com/gpu-remediation-paused";
/// `true` on the DeviceConfig: decide and report (Events, status), write no
/// Node.
pub const DRY_RUN_LABEL: &str = "operator.amd.com/gpu-remediation-dry-run";
/// DeviceConfig annotation: how many selected nodes may be quarantined
/// within the breaker's window, a count or a percentage (default 20%).
pub const BREAKER_ANNOTATION: &str = "operator.amd.com/gpu-remediation-max-quarantined";
/// DeviceConfig annotation: the circuit breaker's window (default 1h).
pub const BREAKER_WINDOW_ANNOTATION: &str = "operator.amd.com/gpu-remediation-breaker-window";
/// The taint key when `nodeRemediationTaints` is empty; its value is the
/// condition, its effect NoSchedule (the reference's).
pub const DEFAULT_TAINT_KEY: &str = "amd-gpu-unhealthy";
/// How long runs are remembered for the recovery policy (the reference's).
pub const ATTEMPTS_KEPT: Duration = Duration::from_secs(72 * 3600);

/// Event reasons. The first three are the reference's event names.
pub const EVENT_REQUIRED: &str = "amd-gpu-remediation-required";
pub const EVENT_FAILED: &str = "amd-gpu-remediation-failed";
pub const EVENT_SUCCEEDED: &str = "amd-gpu-remediation-succeeded";
pub const EVENT_STARTED: &str = "RemediationStarted";
pub const EVENT_HELD: &str = "RemediationHeld";
pub const EVENT_ABORTED: &str = "RemediationAborted";
pub const EVENT_RELEASED: &str = "RemediationReleased";
pub const EVENT_STEP: &str = "RemediationStep";
pub const EVENT_DRY_RUN: &str = "RemediationDryRun";
pub const EVENT_BREAKER: &str = "RemediationCircuitBreakerOpen";
pub const EVENT_ESCALATED: &str = "RemediationEscalated";
pub const EVENT_VALIDATION_NOT_RUN: &str = "RemediationValidationNotRun";
/// How long the agent may take to say which GPU is at fault and which pods
/// hold it (a status write and a kubelet query).
pub const GPU_ISOLATION_LIMIT: Duration = Duration::from_secs(120);
/// How long a GPU reset may take before the GPU's own tests start.
pub const GPU_RESET_LIMIT: Duration = Duration::from_secs(300);

/// The confirmation after the tests: the reference's wait step (two checks a
/// minute apart within 15 minutes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Confirm {
    pub checks: u32,
    pub interval: Duration,
    pub within: Duration,
}

impl Default for Confirm {
    fn default() -> Self {
        Self {
            checks: 2,
            interval: Duration::from_secs(60),
            within: Duration::from_secs(15 * 60),
        }
    }
}

/// The circuit breaker: at most `limit` of the selected nodes quarantined
/// within `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Breaker {
    pub limit: CountOrPercent,
    pub window: Duration,
}

impl Default for Breaker {
    fn default() -> Self {
        Self {
            limit: CountOrPercent::Percent(20),
            window: Duration::from_secs(3600),
        }
    }
}

/// What the DeviceConfig asks, as the planner uses it.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    pub auto_start: bool,
    /// `maxParallelWorkflows`; `None` is no limit.
    pub max_parallel: Option<u32>,
    pub breaker: Breaker,
    pub reboot_timeout: Duration,
    pub confirm: Confirm,
    /// A pause label on the DeviceConfig.
    pub paused: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            auto_start: true,
            max_parallel: None,
            breaker: Breaker::default(),
            reboot_timeout: Duration::from_secs(15 * 60),
            confirm: Confirm::default(),
            paused: false,
        }
    }
}

/// How the node's drain for remediation stands, in this leader's term.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DrainState {
    Running,
    Done,
    Failed(String),
}

/// The agent's answer to the record's latest request (isolating the faulty
/// GPU, resetting it, validating the node).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    pub id: String,
    /// The tests passed; for an isolation, one GPU is at fault.
    pub passed: bool,
    pub message: String,
    /// An isolation's GPU (PCI address) and the pods that hold it.
    pub gpu: Option<String>,
    pub pods: Vec<String>,
    /// The tests did not run: their tool cannot be started on the node (why,
    /// naming it and the agent's flag). Not a verdict on the GPUs.
    pub not_run: Option<String>,
}

/// One node, as the planner sees it.
#[derive(Clone, Debug, Default)]
pub struct NodeFacts {
    pub name: String,
    /// Condition types and whether each is `True`, in the Node's order.
    pub conditions: Vec<(String, bool)>,
    pub record: Record,
    pub force_resume: bool,
    pub abort: bool,
    /// A pause label on the Node.
    pub paused: bool,
    /// The node carries the run's first taint (key and effect).
    pub tainted: bool,
    /// Another change holds the node ("a driver upgrade", ...).
    pub busy: Option<&'static str>,
    pub ready: bool,
    pub boot_id: Option<String>,
    /// What the node's agent has not yet reported for the boot it runs,
    /// before its GPUs can be tested: amdgpu loaded (the driver the
    /// DeviceConfig manages, when it does). `None`: nothing is pending.
    pub driver_pending: Option<String>,
    pub answer: Option<Answer>,
    /// `None`: no drain of this node runs in this term.
    pub drain: Option<DrainState>,
}

impl NodeFacts {
    fn condition_true(&self, condition: &str) -> bool {
        self.conditions
            .iter()
            .any(|(type_, is_true)| type_ == condition && *is_true)
    }
}

/// An Event to record about the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// A run's end, for the metrics.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Started { condition: String },
    Succeeded { condition: String, seconds: f64 },
    Failed { condition: String },
}

/// What to do with the drain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DrainOrder {
    #[default]
    Keep,
    Start,
    Stop,
}

/// What to do with one node now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// The record to write, when it changes.
    pub record: Option<Record>,
    /// `Some(true)`: put the taints and labels on; `Some(false)`: lift them.
    pub quarantine: Option<bool>,
    pub drain: DrainOrder,
    pub notes: Vec<Note>,
    /// Person's labels handled now, to remove.
    pub consume: Vec<&'static str>,
    pub outcomes: Vec<Outcome>,
    /// When to look at the node again, if nothing else changes.
    pub wake: Option<Duration>,
}

/// A run that may start, subject to [`admit`].
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub node: String,
    pub condition: String,
    pub entry: Entry,
    /// A person asked (force-resume): the breaker does not hold it.
    pub forced: bool,
}

/// One node's next step.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeStep {
    Nothing,
    /// A run may start, if [`admit`] lets it.
    Candidate(Box<Candidate>),
    /// A running or held run moves (or the record is pruned).
    Act(Box<Decision>),
    /// A mapped condition is True but no run starts, and why (for status
    /// and dry-run Events; nothing is written).
    Blocked {
        condition: String,
        why: String,
    },
}

fn ts(text: &str) -> Option<Timestamp> {
    text.parse().ok()
}

fn elapsed(since: &str, now: Timestamp) -> Duration {
    ts(since)
        .and_then(|s| Duration::try_from(now.duration_since(s)).ok())
        .unwrap_or_default()
}

/// The run's name, as the reference names its workflows.
pub fn run_name(node: &str, entry: &Entry, started: Timestamp) -> String {
    let template = if entry.workflow_template.is_empty() {
        "remediation"
    } else {
        &entry.workflow_template
    };
    format!("{node}-{template}-{}", started.as_second())
}

/// The attempts within `window` of `now` for `condition`.
pub fn attempts_within(
    record: &Record,
    condition: Option<&str>,
    window: Duration,
    now: Timestamp,
) -> usize {
    record
        .attempts
        .iter()
        .filter(|a| condition.is_none_or(|c| a.condition == c))
        .filter(|a| elapsed(&a.started, now) < window)
        .count()
}

/// The first condition of the node that is True and mapped.
pub fn triggering<'a>(facts: &NodeFacts, mapping: &'a Mapping) -> Option<&'a Entry> {
    facts
        .conditions
        .iter()
        .filter(|(_, is_true)| *is_true)
        .find_map(|(type_, _)| mapping.entry(type_))
}

/// The record with attempts older than [`ATTEMPTS_KEPT`] dropped.
fn pruned(record: &Record, now: Timestamp) -> Record {
    let mut record = record.clone();
    record
        .attempts
        .retain(|a| elapsed(&a.started, now) < ATTEMPTS_KEPT);
    record
}

/// A new run of `candidate`, as [`admit`] let it start: the record first,
/// then the quarantine and the drain (or the wait for approval).
pub fn start(
    facts: &NodeFacts,
    candidate: &Candidate,
    policy: &Policy,
    now: Timestamp,
) -> Decision {
    let mut record = pruned(&facts.record, now);
    let approval = !policy.auto_start && !candidate.forced;
    let reset_first = candidate.entry.gpu_reset_first;
    let phase = if approval {
        Phase::AwaitingApproval
    } else if reset_first {
        Phase::IsolatingGpu
    } else {
        Phase::Draining
    };
    let mut run = Run {
        condition: candidate.condition.clone(),
        ..Run::begin(&candidate.entry, phase, !approval, &now.to_string())
    };
    if phase == Phase::IsolatingGpu {
        run.test = Some(request_id("isolate", &run.condition, now));
    }
    record.attempts.push(Attempt {
        condition: candidate.condition.clone(),
        started: now.to_string(),
        name: run_name(&facts.name, &candidate.entry, now),
        healed: false,
    });
    record.run = Some(run);
    let template = &candidate.entry.workflow_template;
    let message = if approval {
        format!(
            "{} is True: remediation (built-in steps{}) waits for a person to approve it: \
             label the node {FORCE_RESUME_LABEL}=true",
            candidate.condition,
            named_template(template)
        )
    } else if reset_first {
        format!(
            "{} is True: quarantined; finding the faulty GPU to reset it first (built-in steps{})",
            candidate.condition,
            named_template(template)
        )
    } else {
        format!(
            "{} is True: quarantined; draining the GPU pods (built-in steps{})",
            candidate.condition,
            named_template(template)
        )
    };
    Decision {
        record: Some(record),
        quarantine: (!approval).then_some(true),
        drain: if phase == Phase::Draining {
            DrainOrder::Start
        } else {
            DrainOrder::Keep
        },
        notes: vec![Note {
            warning: true,
            reason: EVENT_STARTED,
            message,
        }],
        consume: if candidate.forced && facts.force_resume {
            vec![FORCE_RESUME_LABEL]
        } else {
            Vec::new()
        },
        outcomes: vec![Outcome::Started {
            condition: candidate.condition.clone(),
        }],
        wake: None,
    }
}

/// A request id for the agent: what is asked, of which run, when.
fn request_id(what: &str, condition: &str, now: Timestamp) -> String {
    format!("{what}-{condition}-{}", now.as_millisecond())
}

/// The agent's answer to the run's current request, if it gave one.
fn answer_to<'a>(facts: &'a NodeFacts, run: &Run) -> Option<&'a Answer> {
    facts
        .answer
        .as_ref()
        .filter(|a| Some(&a.id) == run.test.as_ref())
}

fn named_template(template: &str) -> String {
    if template.is_empty() {
        String::new()
    } else {
        format!(" in place of workflow template {template}")
    }
}

/// The node's next step: the idle node's, or the step of its run's phase
/// (a person's abort first).
pub fn node_step(
    facts: &NodeFacts,
    mapping: &Mapping,
    policy: &Policy,
    now: Timestamp,
) -> NodeStep {
    let Some(run) = &facts.record.run else {
        return idle_step(facts, mapping, now);
    };
    let step = RunStep {
        facts,
        policy,
        run,
        now,
        in_phase: elapsed(&run.since, now),
        decision: Decision::default(),
        record: pruned(&facts.record, now),
    };
    let next = run.clone();
    // A person's abort stops any run that is not over.
    if facts.abort && !run.phase.is_terminal() {
        return aborted(step, next);
    }
    match run.phase {
        Phase::AwaitingApproval => awaiting_approval(step, next),
        Phase::IsolatingGpu => isolating_gpu(step, next),
        Phase::DrainingGpu => draining_gpu(step, next),
        Phase::ResettingGpu => resetting_gpu(step, next),
        Phase::Draining => draining(step, next),
        Phase::AwaitingPerson => awaiting_person(step, next),
        Phase::Rebooting => rebooting(step, next),
        Phase::Validating => validating(step, next),
        Phase::Confirming => confirming(step, next),
        Phase::Failed | Phase::Aborted | Phase::Held => ended(step, mapping),
    }
}

/// A run in progress, at one step: what its phase reads (the node's facts,
/// the policy, the time) and what it writes (the decision, the record). The
/// phase functions below take it with `next`, the run as it is to be.
struct RunStep<'a> {
    facts: &'a NodeFacts,
    policy: &'a Policy,
    /// The run as the record holds it.
    run: &'a Run,
    now: Timestamp,
    /// How long the run has been in its phase.
    in_phase: Duration,
    decision: Decision,
    record: Record,
}

impl RunStep<'_> {
    /// `next` enters `phase` now.
    fn moved(&self, next: &mut Run, phase: Phase) {
        next.phase = phase;
        next.since = self.now.to_string();
    }

    /// Acts on the decision and writes the record.
    fn written(mut self) -> NodeStep {
        self.decision.record = Some(self.record);
        NodeStep::Act(Box::new(self.decision))
    }

    /// Acts on the decision (a wake, a lost quarantine put back) and leaves
    /// the record as it is: a wait writes no record.
    fn waiting(self) -> NodeStep {
        NodeStep::Act(Box::new(self.decision))
    }

    /// Puts back a quarantine a write did not land (or a leader died before
    /// it).
    fn keep_quarantine(&mut self) {
        if self.run.quarantined && !self.facts.tainted {
            self.decision.quarantine = Some(true);
        }
    }

    /// The run failed: the node stays tainted for a person.
    fn fail(&mut self, mut next: Run, why: String) {
        // A failed drain's entry goes too: a run started later drains anew.
        self.decision.drain = DrainOrder::Stop;
        next.phase = Phase::Failed;
        next.since = self.now.to_string();
        next.reason = Some(why.clone());
        let message = if next.entry.notify_test_failure_message.is_empty() {
            format!(
                "remediation of {} failed: {why}; the node stays tainted",
                next.condition
            )
        } else {
            format!(
                "{} ({why}; the node stays tainted)",
                next.entry.notify_test_failure_message
            )
        };
        self.decision.notes.push(Note {
            warning: true,
            reason: EVENT_FAILED,
            message,
        });
        self.decision.outcomes.push(Outcome::Failed {
            condition: next.condition.clone(),
        });
        self.record.run = Some(next);
    }

    /// The GPU reset path gave up: on to the whole-node steps (drain every
    /// GPU pod, then reboot or a person).
    fn escalate(&mut self, mut next: Run, why: &str) {
        self.decision.notes.push(Note {
            warning: true,
            reason: EVENT_ESCALATED,
            message: format!(
                "{}: {why}; going on with the whole node: draining every GPU pod",
                next.condition
            ),
        });
        next.phase = Phase::Draining;
        next.since = self.now.to_string();
        next.test = None;
        // Off the reset path for good: a later failure fails the run.
        next.gpu = None;
        next.gpu_pods.clear();
        self.decision.drain = DrainOrder::Start;
        self.record.run = Some(next);
    }

    /// After the drain (and a person, when needed): reboot, or straight to
    /// the tests when the entry skips the reboot.
    fn after_person(&mut self, mut next: Run) {
        if next.entry.skip_reboot_step {
            self.validate(next);
            return;
        }
        let facts = self.facts;
        next.phase = Phase::Rebooting;
        next.since = self.now.to_string();
        next.reboot_from = facts.boot_id.clone();
        self.decision.notes.push(Note {
            warning: false,
            reason: EVENT_STEP,
            message: format!(
                "{}: asking the node's agent to reboot (from boot {})",
                next.condition,
                facts.boot_id.as_deref().unwrap_or("unknown")
            ),
        });
        self.record.run = Some(next);
    }

    /// The tests could not run (their tool cannot start on the node): not a
    /// verdict on the GPUs, so the run goes on to the confirmation (the
    /// node's own health checks, the condition staying False), with a
    /// Warning that names the tool and the agent's flag.
    fn tested_nothing(&mut self, answer: &Answer) {
        self.decision.notes.push(Note {
            warning: true,
            reason: EVENT_VALIDATION_NOT_RUN,
            message: format!(
                "{}: {}; the node is judged by its health checks alone (the condition must stay False)",
                self.run.condition,
                answer.not_run.as_deref().unwrap_or("the tests did not run")
            ),
        });
    }

    /// Starts the validation, or skips to the confirmation when the entry
    /// has no test profile.
    fn validate(&mut self, mut next: Run) {
        let now = self.now;
        next.since = now.to_string();
        next.reboot_from = None;
        if next.entry.validation_tests_profile.is_some() {
            next.phase = Phase::Validating;
            next.test = Some(request_id("validate", &next.condition, now));
            self.decision.notes.push(Note {
                warning: false,
                reason: EVENT_STEP,
                message: format!("{}: running the validation tests", next.condition),
            });
        } else {
            next.phase = Phase::Confirming;
            next.checks = 0;
            next.last_check = None;
        }
        self.record.run = Some(next);
    }

    /// On to the confirmation, its count from zero.
    fn confirm(&mut self, mut next: Run) {
        self.moved(&mut next, Phase::Confirming);
        next.checks = 0;
        next.last_check = None;
        self.decision.wake = Some(self.policy.confirm.interval);
        self.record.run = Some(next);
    }
}

/// A person's abort: the run stops where it is; a quarantined node stays
/// tainted until a person removes the taint.
fn aborted(mut s: RunStep<'_>, mut next: Run) -> NodeStep {
    let run = s.run;
    s.decision.consume.push(ABORT_LABEL);
    s.decision.drain = DrainOrder::Stop;
    if run.quarantined {
        s.moved(&mut next, Phase::Aborted);
        next.reason = Some("aborted by a person".into());
        s.record.run = Some(next);
    } else {
        // Never quarantined (it awaited approval): nothing to keep.
        s.record.run = None;
    }
    s.decision.notes.push(Note {
        warning: true,
        reason: EVENT_ABORTED,
        message: format!(
            "remediation of {} aborted at step {}{}",
            run.condition,
            run.phase.name(),
            if run.quarantined {
                "; the node stays tainted until a person removes the taint"
            } else {
                ""
            }
        ),
    });
    s.decision.outcomes.push(Outcome::Failed {
        condition: run.condition.clone(),
    });
    s.written()
}

/// `AwaitingApproval`: the force-resume label quarantines the node and
/// starts the first step; a condition that clears first ends the wait.
fn awaiting_approval(mut s: RunStep<'_>, mut next: Run) -> NodeStep {
    let (facts, run, now) = (s.facts, s.run, s.now);
    if facts.force_resume {
        s.decision.consume.push(FORCE_RESUME_LABEL);
        next.quarantined = true;
        s.decision.quarantine = Some(true);
        let step = if run.entry.gpu_reset_first {
            s.moved(&mut next, Phase::IsolatingGpu);
            next.test = Some(request_id("isolate", &run.condition, now));
            "finding the faulty GPU to reset it first"
        } else {
            s.moved(&mut next, Phase::Draining);
            s.decision.drain = DrainOrder::Start;
            "draining the GPU pods"
        };
        s.decision.notes.push(Note {
            warning: true,
            reason: EVENT_STEP,
            message: format!("{}: approved; quarantined, {step}", run.condition),
        });
        s.record.run = Some(next);
    } else if !facts.condition_true(&run.condition) {
        // It cleared before anyone approved: nothing was done.
        s.record.run = None;
        s.decision.notes.push(Note {
            warning: false,
            reason: EVENT_RELEASED,
            message: format!(
                "{} cleared before the remediation was approved",
                run.condition
            ),
        });
    } else {
        return NodeStep::Nothing;
    }
    s.written()
}

/// `IsolatingGpu`: the agent names the one faulty GPU and its pods (on to
/// draining those), or cannot (escalate), or has not yet.
fn isolating_gpu(mut s: RunStep<'_>, mut next: Run) -> NodeStep {
    let (facts, run, in_phase) = (s.facts, s.run, s.in_phase);
    s.keep_quarantine();
    match answer_to(facts, run) {
        Some(Answer {
            passed: true,
            gpu: Some(gpu),
            pods,
            ..
        }) => {
            s.moved(&mut next, Phase::DrainingGpu);
            next.gpu = Some(gpu.clone());
            next.gpu_pods = pods.clone();
            next.test = None;
            s.decision.drain = DrainOrder::Start;
            s.decision.notes.push(Note {
                warning: true,
                reason: EVENT_STEP,
                message: format!(
                    "{}: the fault is confined to GPU {gpu}; evicting only the pods that hold it ({})",
                    run.condition,
                    if pods.is_empty() {
                        "none".to_owned()
                    } else {
                        pods.join(", ")
                    }
                ),
            });
            s.record.run = Some(next);
        }
        Some(answer) => {
            let why = format!("no GPU reset: {}", answer.message);
            s.escalate(next, &why);
        }
        None if in_phase >= GPU_ISOLATION_LIMIT => {
            let why = format!(
                "no GPU reset: the agent did not say which GPU is at fault within {}s",
                GPU_ISOLATION_LIMIT.as_secs()
            );
            s.escalate(next, &why);
        }
        None => {
            // Waiting (a lost quarantine put back): no record write.
            s.decision.wake = Some(GPU_ISOLATION_LIMIT - in_phase);
            return s.waiting();
        }
    }
    s.written()
}

/// `DrainingGpu`: the pods on the faulty GPU are evicted; then the agent is
/// asked to reset the GPU and test it. A failed drain escalates.
fn draining_gpu(mut s: RunStep<'_>, mut next: Run) -> NodeStep {
    let (facts, run, now) = (s.facts, s.run, s.now);
    s.keep_quarantine();
    match &facts.drain {
        None => s.decision.drain = DrainOrder::Start,
        Some(DrainState::Running) => s.decision.wake = Some(Duration::from_secs(30)),
        Some(DrainState::Failed(why)) => {
            let why = format!("the pods on the GPU could not be drained: {why}");
            s.escalate(next, &why);
        }
        Some(DrainState::Done) => {
            s.decision.drain = DrainOrder::Stop;
            s.moved(&mut next, Phase::ResettingGpu);
            next.test = Some(request_id("reset", &run.condition, now));
            s.decision.notes.push(Note {
                warning: true,
                reason: EVENT_STEP,
                message: format!(
                    "{}: the pods on GPU {} are drained; asking the node's agent to reset it and test it",
                    run.condition,
                    run.gpu.as_deref().unwrap_or("?")
                ),
            });
            s.record.run = Some(next);
        }
    }
    s.written()
}

/// `ResettingGpu`: a reset GPU that passed its tests (or could not be
/// tested) goes on to the confirmation; a failure or silence past the limit
/// escalates.
fn resetting_gpu(mut s: RunStep<'_>, next: Run) -> NodeStep {
    let (facts, run, in_phase) = (s.facts, s.run, s.in_phase);
    match answer_to(facts, run) {
        Some(answer) if answer.not_run.is_some() || answer.passed => {
            if answer.not_run.is_some() {
                s.tested_nothing(answer);
            } else {
                s.decision.notes.push(Note {
                    warning: false,
                    reason: EVENT_STEP,
                    message: format!(
                        "{}: GPU {} was reset and passed its tests: {}",
                        run.condition,
                        run.gpu.as_deref().unwrap_or("?"),
                        answer.message
                    ),
                });
            }
            let mut next = next;
            next.test = None;
            s.confirm(next);
        }
        Some(answer) => {
            let why = format!("the GPU reset did not repair it: {}", answer.message);
            s.escalate(next, &why);
        }
        None => {
            let limit = GPU_RESET_LIMIT + run.entry.validation_limit();
            if in_phase >= limit {
                let why = format!(
                    "the GPU reset and its tests did not report within {}s",
                    limit.as_secs()
                );
                s.escalate(next, &why);
            } else {
                s.decision.wake = Some(limit - in_phase);
                return s.waiting();
            }
        }
    }
    s.written()
}

/// `Draining`: the node's GPU pods are evicted; then a person (when the
/// entry needs physical action) or the reboot. A failed drain fails the run.
fn draining(mut s: RunStep<'_>, mut next: Run) -> NodeStep {
    let (facts, run) = (s.facts, s.run);
    s.keep_quarantine();
    match &facts.drain {
        None => s.decision.drain = DrainOrder::Start,
        Some(DrainState::Running) => s.decision.wake = Some(Duration::from_secs(30)),
        Some(DrainState::Failed(why)) => s.fail(next, format!("the drain failed: {why}")),
        Some(DrainState::Done) => {
            s.decision.drain = DrainOrder::Stop;
            let mut message = format!("{}: the node's GPU pods are drained", run.condition);
            if !run.entry.notify_remediation_message.is_empty() {
                message = format!("{message}: {}", run.entry.notify_remediation_message);
            }
            if run.entry.physical_action_needed {
                message.push_str(&format!(
                    "; physical action is needed: label the node {FORCE_RESUME_LABEL}=true once done"
                ));
            }
            s.decision.notes.push(Note {
                warning: true,
                reason: EVENT_REQUIRED,
                message,
            });
            if run.entry.physical_action_needed {
                s.moved(&mut next, Phase::AwaitingPerson);
                s.record.run = Some(next);
            } else {
                s.after_person(next);
            }
        }
    }
    s.written()
}

/// `AwaitingPerson`: the force-resume label says the hardware is seen to.
fn awaiting_person(mut s: RunStep<'_>, next: Run) -> NodeStep {
    if !s.facts.force_resume {
        return NodeStep::Nothing;
    }
    s.decision.consume.push(FORCE_RESUME_LABEL);
    s.after_person(next);
    s.written()
}

/// `Rebooting`: the node back Ready with a new boot id and its driver
/// loaded goes on to the tests; past the timeout the run fails.
fn rebooting(mut s: RunStep<'_>, next: Run) -> NodeStep {
    let (facts, run, policy, in_phase) = (s.facts, s.run, s.policy, s.in_phase);
    let back = facts.ready && facts.boot_id.is_some() && facts.boot_id != run.reboot_from;
    // Tests on a node whose driver is not loaded yet find no GPU and
    // fail: validation waits for the driver of this boot.
    if back && facts.driver_pending.is_none() {
        s.decision.notes.push(Note {
            warning: false,
            reason: EVENT_STEP,
            message: format!(
                "{}: the node rebooted, is Ready and its driver is loaded",
                run.condition
            ),
        });
        s.validate(next);
    } else if in_phase >= policy.reboot_timeout {
        let why = match (&facts.driver_pending, back) {
            (Some(pending), true) => format!(
                "the node rebooted, but its driver was not ready within {}s: {pending}",
                policy.reboot_timeout.as_secs()
            ),
            _ => format!(
                "the node did not come back Ready with a new boot id within {}s",
                policy.reboot_timeout.as_secs()
            ),
        };
        s.fail(next, why);
    } else {
        s.decision.wake = Some(policy.reboot_timeout - in_phase);
        return s.waiting();
    }
    s.written()
}

/// `Validating`: tests that passed (or could not run) go on to the
/// confirmation; a failure or silence past the limit fails the run.
fn validating(mut s: RunStep<'_>, next: Run) -> NodeStep {
    let (facts, run, in_phase) = (s.facts, s.run, s.in_phase);
    match answer_to(facts, run) {
        Some(result) if result.not_run.is_some() => {
            s.tested_nothing(result);
            s.confirm(next);
        }
        Some(result) if result.passed => {
            s.decision.notes.push(Note {
                warning: false,
                reason: EVENT_STEP,
                message: format!("{}: the validation tests passed", run.condition),
            });
            s.confirm(next);
        }
        Some(result) => {
            let why = format!("the validation tests failed: {}", result.message);
            s.fail(next, why);
        }
        None => {
            let limit = run.entry.validation_limit();
            if in_phase >= limit {
                let why = format!(
                    "the validation tests did not report within {}s",
                    limit.as_secs()
                );
                s.fail(next, why);
            } else {
                s.decision.wake = Some(limit - in_phase);
                return s.waiting();
            }
        }
    }
    s.written()
}

/// `Confirming`: the condition must stay False at [`Confirm::checks`]
/// checks; then the node is released. Past [`Confirm::within`] a GPU reset
/// escalates and a whole-node run fails.
fn confirming(mut s: RunStep<'_>, mut next: Run) -> NodeStep {
    let (facts, run, now, in_phase) = (s.facts, s.run, s.now, s.in_phase);
    let confirm = s.policy.confirm;
    let last = run.last_check.as_deref().unwrap_or(&run.since);
    let since_last = elapsed(last, now);
    if since_last < confirm.interval {
        s.decision.wake = Some(confirm.interval - since_last);
        return s.waiting();
    }
    next.last_check = Some(now.to_string());
    next.checks = if facts.condition_true(&run.condition) {
        0
    } else {
        run.checks + 1
    };
    if next.checks >= confirm.checks {
        let seconds = elapsed(&run.started, now).as_secs_f64();
        s.decision.quarantine = Some(false);
        s.decision.notes.push(Note {
            warning: false,
            reason: EVENT_SUCCEEDED,
            message: format!(
                "{} stayed False at {} checks: remediation succeeded; the taints and labels are lifted",
                run.condition, next.checks
            ),
        });
        s.decision.outcomes.push(Outcome::Succeeded {
            condition: run.condition.clone(),
            seconds,
        });
        if let Some(attempt) = s
            .record
            .attempts
            .iter_mut()
            .rev()
            .find(|a| a.condition == run.condition)
        {
            attempt.healed = true;
        }
        s.record.run = None;
    } else if in_phase + confirm.interval > confirm.within {
        let why = format!(
            "{} did not stay False at {} checks {}s apart within {}s",
            run.condition,
            confirm.checks,
            confirm.interval.as_secs(),
            confirm.within.as_secs()
        );
        if run.gpu.is_some() {
            // The reset did not repair it: on to the node's steps.
            next.checks = 0;
            next.last_check = None;
            let why = format!("the GPU reset did not repair it: {why}");
            s.escalate(next, &why);
        } else {
            s.fail(next, why);
        }
    } else {
        s.decision.wake = Some(confirm.interval);
        s.record.run = Some(next);
    }
    s.written()
}

/// `Failed`, `Aborted`, `Held`: the node is quarantined until a person
/// forces a new run (the window and the breaker do not hold it) or removes
/// the taint (the run is closed).
fn ended(mut s: RunStep<'_>, mapping: &Mapping) -> NodeStep {
    let (facts, run) = (s.facts, s.run);
    if facts.force_resume {
        // A person asks for a new run: the window and the breaker
        // do not hold it.
        let entry = mapping
            .entry(&run.condition)
            .cloned()
            .unwrap_or_else(|| run.entry.clone());
        return NodeStep::Candidate(Box::new(Candidate {
            node: facts.name.clone(),
            condition: run.condition.clone(),
            entry,
            forced: true,
        }));
    }
    if run.quarantined && !facts.tainted {
        // A person removed the taint: the node is theirs again.
        s.decision.quarantine = Some(false);
        s.decision.notes.push(Note {
            warning: false,
            reason: EVENT_RELEASED,
            message: format!(
                "a person removed the remediation taint: the {} run ({}) is closed and its labels lifted",
                run.condition,
                run.phase.name()
            ),
        });
        s.record.run = None;
        s.written()
    } else {
        NodeStep::Nothing
    }
}

/// A node with no run: a candidate when a mapped condition is True and the
/// gates pass; a held run when the recovery window is full; the record
/// pruned when old attempts fall out of it.
fn idle_step(facts: &NodeFacts, mapping: &Mapping, now: Timestamp) -> NodeStep {
    let Some(entry) = triggering(facts, mapping) else {
        let pruned = pruned(&facts.record, now);
        return if pruned != facts.record {
            NodeStep::Act(Box::new(Decision {
                record: Some(pruned),
                ..Decision::default()
            }))
        } else {
            NodeStep::Nothing
        };
    };
    let condition = entry.node_condition.clone();
    if let Some(busy) = facts.busy {
        return NodeStep::Blocked {
            condition,
            why: format!("{busy} holds the node"),
        };
    }
    if facts.paused && !facts.force_resume {
        return NodeStep::Blocked {
            condition,
            why: format!("the node is labelled {PAUSE_LABEL}=true"),
        };
    }
    let runs = attempts_within(&facts.record, Some(&condition), entry.window(), now);
    if runs >= entry.max_runs() as usize && !facts.force_resume {
        let mut record = pruned(&facts.record, now);
        let why = format!(
            "{condition} was remediated {runs} times within {}s (recoveryPolicy allows {}): \
             a person must act; label the node {FORCE_RESUME_LABEL}=true to run again, or remove the taint",
            entry.window().as_secs(),
            entry.max_runs()
        );
        record.run = Some(Run {
            reason: Some(why.clone()),
            ..Run::begin(entry, Phase::Held, true, &now.to_string())
        });
        return NodeStep::Act(Box::new(Decision {
            record: Some(record),
            quarantine: Some(true),
            notes: vec![Note {
                warning: true,
                reason: EVENT_HELD,
                message: why,
            }],
            ..Decision::default()
        }));
    }
    NodeStep::Candidate(Box::new(Candidate {
        node: facts.name.clone(),
        condition,
        entry: entry.clone(),
        forced: facts.force_resume,
    }))
}

/// Which candidates start now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Admission {
    pub start: Vec<Candidate>,
    /// Held by `maxParallelWorkflows`.
    pub waiting: Vec<Candidate>,
    /// Held by the open circuit breaker, and its message.
    pub breaker: Option<(Vec<Candidate>, String)>,
    /// Held by the DeviceConfig's pause label.
    pub paused: Vec<Candidate>,
}

/// Decides which candidates start: every candidate a person forced; the
/// others only while the breaker holds (the nodes quarantined within its
/// window, `recently_quarantined`, with all of them, stay within the limit:
/// a burst that would pass it starts none) and within
/// `maxParallelWorkflows` (`running` runs in progress now).
pub fn admit(
    mut candidates: Vec<Candidate>,
    running: usize,
    recently_quarantined: &BTreeSet<String>,
    selected: usize,
    policy: &Policy,
) -> Admission {
    candidates.sort_by(|a, b| b.forced.cmp(&a.forced).then(a.node.cmp(&b.node)));
    let (forced, automatic): (Vec<_>, Vec<_>) = candidates.into_iter().partition(|c| c.forced);
    let mut admission = Admission::default();
    let mut running = running;
    let limit = policy.breaker.limit.resolve(selected as u32) as usize;
    // Nodes, not runs: a node that fails again counts once; a node a
    // person forces counts too.
    let quarantined = forced
        .iter()
        .chain(&automatic)
        .filter(|c| !recently_quarantined.contains(&c.node))
        .count()
        + recently_quarantined.len();
    let recently_quarantined = recently_quarantined.len();
    let automatic = if policy.paused {
        admission.paused = automatic;
        Vec::new()
    } else if !automatic.is_empty() && quarantined > limit {
        let message = format!(
            "circuit breaker open: {} node(s) to quarantine with {recently_quarantined} quarantined \
             and not healed within {}s would pass the limit of {limit} of {selected} selected \
             node(s); no new run starts until a person acts (label nodes \
             {FORCE_RESUME_LABEL}=true to remediate them, or raise {BREAKER_ANNOTATION})",
            automatic.len(),
            policy.breaker.window.as_secs(),
        );
        admission.breaker = Some((automatic, message));
        Vec::new()
    } else {
        automatic
    };
    for candidate in forced.into_iter().chain(automatic) {
        let room = policy.max_parallel.is_none_or(|max| running < max as usize);
        if room || candidate.forced {
            running += 1;
            admission.start.push(candidate);
        } else {
            admission.waiting.push(candidate);
        }
    }
    admission
}

/// Whether a run counts against `maxParallelWorkflows`.
pub fn is_running(record: &Record) -> bool {
    record.run.as_ref().is_some_and(|r| !r.phase.is_terminal())
}

/// Whether the node counts against the breaker: quarantined now, or a run
/// started within the window that did not heal it (failed, held, aborted).
/// A node remediated and released is healthy again: on a small cluster it
/// would otherwise hold the next node for the whole window.
pub fn recently_quarantined(record: &Record, window: Duration, now: Timestamp) -> bool {
    record.run.as_ref().is_some_and(|r| r.quarantined)
        || record
            .attempts
            .iter()
            .any(|a| !a.healed && elapsed(&a.started, now) < window)
}

#[cfg(test)]
mod tests;
