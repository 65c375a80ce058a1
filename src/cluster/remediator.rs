//! The leader's part of node remediation (`spec.remediationWorkflow`): for
//! each selected node, the facts [`crate::remediation::plan`] decides on (its
//! conditions, the record, a person's labels, the drain this term runs, what
//! its agent reported), the admission of new runs across the DeviceConfig,
//! and the decisions carried out:
//! - the record first, with `nodeRemediationLabels` in the same
//!   server-side apply; then the taints; then the drain. On release the
//!   taints go first and the record last, so a leader that dies midway still
//!   finds whose taint it is;
//! - the person's force-resume and abort labels removed once acted on;
//! - Events on the Node (the reference's `amd-gpu-remediation-*` names) and,
//!   when the circuit breaker opens, on the DeviceConfig;
//! - the metrics counters.
//!
//! The reboot and the tests are the agent's: it reads the record
//! (`agent::remediation`) and answers in its status. With the DeviceConfig
//! labelled for a dry run, this module decides and reports, and writes no
//! Node. Every write is checked against the lease. This module must not
//! decide (the plan does) and writes Nodes only through
//! [`crate::node_writer`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Taint};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};

use super::context::{Context, Error, guarded, node_error, node_event_for};
use super::drain::DrainOutcome;
use super::drain::DrainPolicy;
use super::drain::Purpose;
use super::term::CREATE_AGAIN_AFTER;
use crate::api::agent_status::{AgentStatus, ConfigKey, STATUS_ANNOTATION};
use crate::api::remediation_status::{self, RunEntry, Runs};
use crate::api::syntax::parse_count_or_percent;
use crate::api::{DeviceConfig, DrainSpec, RemediationWorkflowSpec};
use crate::driver::condition::gpus_pending;
use crate::node_writer::{Concern, CordonIntent, NodeIntent};
use crate::remediation::mapping::CONFIGMAP_KEY;
use crate::remediation::plan::{
    self, ABORT_LABEL, Answer, BREAKER_ANNOTATION, BREAKER_WINDOW_ANNOTATION, Breaker, Candidate,
    Confirm, DEFAULT_TAINT_KEY, DRY_RUN_LABEL, Decision, DrainOrder, DrainState, EVENT_BREAKER,
    EVENT_DRY_RUN, EVENT_HELD, FORCE_RESUME_LABEL, NodeFacts, NodeStep, Outcome, PAUSE_LABEL,
    Policy,
};
use crate::remediation::{Mapping, Phase, RECORD_ANNOTATION, Record};

/// What remediation contributes to the DeviceConfig's status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Nodes with a run that is not over.
    pub running: usize,
    /// Nodes quarantined (running, failed, aborted or held).
    pub quarantined: usize,
    /// Why remediation cannot work as asked (an unreadable mapping).
    pub problems: Vec<String>,
    /// The mapping in force (the status condition's reason and message),
    /// while remediation is enabled.
    pub mapping: Option<(&'static str, String)>,
    pub wake: Option<Duration>,
}

/// The policy the DeviceConfig asks for.
pub fn policy_of(dc: &DeviceConfig, confirm: Confirm) -> Policy {
    let rw = &dc.spec.remediation_workflow;
    let default = Policy::default();
    let annotations = dc.annotations();
    let breaker = Breaker {
        limit: annotations
            .get(BREAKER_ANNOTATION)
            .and_then(|v| parse_count_or_percent(&int_or_string(v)).ok())
            .unwrap_or(default.breaker.limit),
        window: annotations
            .get(BREAKER_WINDOW_ANNOTATION)
            .and_then(|v| crate::api::syntax::parse_duration(v).ok())
            .unwrap_or(default.breaker.window),
    };
    Policy {
        auto_start: rw.auto_start_workflow,
        max_parallel: rw.parallel_limit(),
        breaker,
        reboot_timeout: rw.reboot_timeout().unwrap_or(default.reboot_timeout),
        confirm,
        paused: is_true(dc.labels(), PAUSE_LABEL),
    }
}

fn int_or_string(text: &str) -> k8s_openapi::apimachinery::pkg::util::intstr::IntOrString {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    text.trim().parse::<i32>().map_or_else(
        |_| IntOrString::String(text.trim().to_owned()),
        IntOrString::Int,
    )
}

fn is_true(labels: &BTreeMap<String, String>, key: &str) -> bool {
    labels.get(key).is_some_and(|v| v == "true")
}

/// The taints of a run for `condition`: `nodeRemediationTaints`, else the
/// reference's `amd-gpu-unhealthy=<condition>:NoSchedule`.
pub fn taints_for(rw: &RemediationWorkflowSpec, condition: &str) -> Vec<Taint> {
    if !rw.node_remediation_taints.is_empty() {
        return rw.node_remediation_taints.clone();
    }
    vec![Taint {
        key: DEFAULT_TAINT_KEY.to_owned(),
        value: Some(condition.to_owned()),
        effect: "NoSchedule".to_owned(),
        ..Taint::default()
    }]
}

/// The drain policy: `nodeDrainPolicy`, else what the reference uses when
/// it is unset (force, 300 s, kube-system, cert-manager and the operator's
/// namespace left alone).
pub fn drain_policy(rw: &RemediationWorkflowSpec, operator_namespace: &str) -> DrainPolicy {
    match &rw.node_drain_policy {
        Some(spec) => DrainPolicy::of_drain(spec),
        None => {
            let mut policy = DrainPolicy::of_drain(&DrainSpec {
                force: true,
                timeout_seconds: 300,
                ..DrainSpec::default()
            });
            policy.ignore_namespaces.extend(
                ["kube-system", "cert-manager", operator_namespace]
                    .into_iter()
                    .filter(|n| !n.is_empty())
                    .map(str::to_owned),
            );
            policy
        }
    }
}

/// The mapping the DeviceConfig names, or the built-in one.
async fn mapping_of(dc: &DeviceConfig, ctx: &Context) -> Result<Mapping, String> {
    let rw = &dc.spec.remediation_workflow;
    let Some(name) = rw
        .config
        .as_ref()
        .map(|c| c.name.as_str())
        .filter(|n| !n.is_empty())
    else {
        return Ok(Mapping::builtin());
    };
    let namespace = dc.namespace().unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(deadline) = ctx.guard.deadline() else {
        return Err("not leading".into());
    };
    let read = tokio::time::timeout_at(deadline, api.get_opt(name)).await;
    let map = match read {
        Ok(Ok(Some(map))) => map,
        Ok(Ok(None)) => {
            return Err(format!(
                "spec.remediationWorkflow.config: ConfigMap {namespace}/{name} does not exist; no node is remediated"
            ));
        }
        Ok(Err(e)) => return Err(format!("cannot read ConfigMap {namespace}/{name}: {e}")),
        Err(_) => return Err("not leading".into()),
    };
    let text = map
        .data
        .as_ref()
        .and_then(|d| d.get(CONFIGMAP_KEY))
        .ok_or_else(|| {
            format!(
                "ConfigMap {namespace}/{name} has no key {CONFIGMAP_KEY:?}; no node is remediated"
            )
        })?;
    Mapping::parse(text)
        .map_err(|why| format!("ConfigMap {namespace}/{name}: {why}; no node is remediated"))
}

/// The facts of `node` for the plan, given how this term's drain of it
/// stands. Pure.
pub fn facts_of(node: &Node, rw: &RemediationWorkflowSpec, drain: Option<DrainState>) -> NodeFacts {
    let name = node.name_any();
    let record = Record::of_annotations(node.annotations());
    let conditions: Vec<(String, bool)> = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| {
            cs.iter()
                .map(|c| (c.type_.clone(), c.status == "True"))
                .collect()
        })
        .unwrap_or_default();
    let ready = conditions.iter().any(|(t, on)| t == "Ready" && *on);
    let node_taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let tainted = record.run.as_ref().is_some_and(|run| {
        taints_for(rw, &run.condition).first().is_some_and(|t| {
            node_taints
                .iter()
                .any(|n| n.key == t.key && n.effect == t.effect)
        })
    });
    let agent = node
        .annotations()
        .get(STATUS_ANNOTATION)
        .and_then(|t| AgentStatus::parse(t).ok());
    let boot_id = agent
        .as_ref()
        .and_then(|a| a.driver.as_ref())
        .and_then(|d| d.boot_id.clone())
        .or_else(|| {
            node.status
                .as_ref()
                .and_then(|s| s.node_info.as_ref())
                .map(|i| i.boot_id.clone())
                .filter(|b| !b.is_empty())
        });
    let upgrading = crate::api::driver_upgrade::UpgradeRecord::of_annotations(node.annotations())
        .is_some_and(|u| u.state.is_in_progress());
    let partitioning = node
        .annotations()
        .contains_key(crate::partition::state::RECORD_ANNOTATION);
    NodeFacts {
        conditions,
        force_resume: is_true(node.labels(), FORCE_RESUME_LABEL),
        abort: is_true(node.labels(), ABORT_LABEL),
        paused: is_true(node.labels(), PAUSE_LABEL),
        tainted,
        busy: if upgrading {
            Some("a driver upgrade")
        } else if partitioning {
            Some("a partition change")
        } else {
            None
        },
        ready,
        boot_id,
        driver_pending: driver_pending(agent.as_ref()),
        answer: agent.and_then(|a| a.remediation).map(|r| Answer {
            id: r.id,
            passed: r.passed,
            message: r.message,
            gpu: r.gpu,
            pods: r.pods,
            not_run: r.not_run,
        }),
        drain,
        record,
        name,
    }
}

/// What the agent has not reported yet before the node's GPUs can be
/// tested, from its status ([`gpus_pending`]: its driver report, whose boot
/// id is the one the facts take, amdgpu loaded in it, and, when the
/// DeviceConfig manages the driver, its own load done). `None`: ready. Pure.
pub fn driver_pending(agent: Option<&AgentStatus>) -> Option<String> {
    let Some(agent) = agent else {
        return Some("the node's agent has reported nothing".to_owned());
    };
    gpus_pending(agent.driver.as_ref(), agent.driver_load.as_ref())
}

/// How this term's drain of `node` stands.
fn drain_of(ctx: &Context, key: &ConfigKey, node: &str) -> Option<DrainState> {
    ctx.drains
        .outcome(key, Purpose::Remediation, node)
        .map(|(outcome, _)| match outcome {
            DrainOutcome::Running => DrainState::Running,
            DrainOutcome::Done => DrainState::Done,
            DrainOutcome::Failed(why) => DrainState::Failed(why),
        })
}

/// Decides and carries out every selected node's step.
pub async fn reconcile(
    dc: &DeviceConfig,
    nodes: &[Arc<Node>],
    ctx: &Context,
) -> Result<Summary, Error> {
    let key = ConfigKey::of(dc);
    let rw = &dc.spec.remediation_workflow;
    if !rw.is_enabled() {
        ctx.drains.prune(&key, Purpose::Remediation, &[]);
        release_all(dc, nodes, ctx).await?;
        return Ok(Summary::default());
    }
    let mapping = match mapping_of(dc, ctx).await {
        Ok(mapping) => mapping,
        Err(problem) => {
            // Runs already going keep their own copy of their entry and go on.
            tracing::warn!(deviceconfig = %key, %problem, "remediation mapping");
            let mut summary = Box::pin(advance(dc, nodes, &Mapping::default(), ctx)).await?;
            summary.mapping = Some((
                crate::api::REASON_NO_MAPPING,
                format!("no mapping in force, no new run starts: {problem}"),
            ));
            summary.problems.push(problem);
            return Ok(summary);
        }
    };
    let mut summary = advance(dc, nodes, &mapping, ctx).await?;
    summary.mapping = Some(mapping_in_force(dc, &mapping));
    Ok(summary)
}

/// What the status says of the mapping in force: the ConfigMap `config`
/// names, or the built-in one (the reference does not remediate without a
/// mapping; ours does, and says so), and that `configMapImage` is not acted
/// on. Pure.
pub fn mapping_in_force(dc: &DeviceConfig, mapping: &Mapping) -> (&'static str, String) {
    let rw = &dc.spec.remediation_workflow;
    let image = rw
        .config_map_image
        .as_deref()
        .map(|image| {
            format!(
                "; configMapImage {image} is not acted on: no image is pulled, this mapping is \
                 used instead"
            )
        })
        .unwrap_or_default();
    match rw
        .config
        .as_ref()
        .map(|c| c.name.as_str())
        .filter(|n| !n.is_empty())
    {
        Some(name) => (
            crate::api::REASON_CONFIGMAP_MAPPING,
            format!(
                "ConfigMap {}/{name} ({} conditions){image}",
                dc.namespace().unwrap_or_default(),
                mapping.entries.len()
            ),
        ),
        None => (
            crate::api::REASON_BUILTIN_MAPPING,
            format!(
                "built-in mapping ({} conditions): spec.remediationWorkflow.config names no \
                 ConfigMap{image}",
                mapping.entries.len()
            ),
        ),
    }
}

async fn advance(
    dc: &DeviceConfig,
    nodes: &[Arc<Node>],
    mapping: &Mapping,
    ctx: &Context,
) -> Result<Summary, Error> {
    let key = ConfigKey::of(dc);
    let rw = &dc.spec.remediation_workflow;
    let policy = policy_of(dc, ctx.remediations.confirm);
    let dry_run = is_true(dc.labels(), DRY_RUN_LABEL);
    let now = Timestamp::now();
    let mut summary = Summary::default();
    let mut candidates = Vec::new();
    let mut acts = Vec::new();
    let mut running = 0;
    let mut recent = std::collections::BTreeSet::new();
    let mut draining = Vec::new();
    for node in nodes {
        let facts = facts_of(node, rw, drain_of(ctx, &key, &node.name_any()));
        if plan::is_running(&facts.record) {
            running += 1;
        }
        if facts.record.run.as_ref().is_some_and(|r| r.quarantined) {
            summary.quarantined += 1;
        }
        if plan::recently_quarantined(&facts.record, policy.breaker.window, now) {
            recent.insert(facts.name.clone());
        }
        if facts.drain.is_some() {
            draining.push(facts.name.clone());
        }
        match plan::node_step(&facts, mapping, &policy, now) {
            NodeStep::Nothing => {}
            NodeStep::Candidate(candidate) => candidates.push((*candidate, facts, node.clone())),
            NodeStep::Act(decision) => acts.push((*decision, facts, node.clone())),
            NodeStep::Blocked { condition, why } => {
                tracing::debug!(node = %facts.name, %condition, %why, "remediation blocked");
                if dry_run {
                    dry_run_event(
                        ctx,
                        node,
                        format!("{key}/{}/blocked/{condition}", facts.name),
                        format!(
                            "dry run: {condition} is True, but no remediation would start: {why}"
                        ),
                    )
                    .await;
                }
            }
        }
    }
    summary.running = running;

    let admission = plan::admit(
        candidates.iter().map(|(c, _, _)| c.clone()).collect(),
        running,
        &recent,
        nodes.len(),
        &policy,
    );
    let breaker_key = format!("{key}/breaker");
    match &admission.breaker {
        Some((held, message)) => {
            tracing::warn!(deviceconfig = %key, held = held.len(), "{message}");
            if ctx.remediations.first_notice(breaker_key.clone()) {
                dc_event(ctx, dc, EventType::Warning, EVENT_BREAKER, message.clone()).await;
            }
        }
        None => ctx.remediations.forget(&breaker_key),
    }
    // Each node held says so on itself, once per hold: whoever reads the
    // Node (kubectl describe) sees why no run starts there.
    let mut held: Vec<(&Candidate, &'static str, String)> = Vec::new();
    if let Some((candidates, _)) = &admission.breaker {
        for c in candidates {
            let why = format!(
                "{}: no run starts yet: the circuit breaker holds it (too many nodes of the \
                 DeviceConfig quarantined within {}s; label the node {FORCE_RESUME_LABEL}=true \
                 to remediate it, or raise {BREAKER_ANNOTATION})",
                c.condition,
                policy.breaker.window.as_secs()
            );
            held.push((c, "breaker", why));
        }
    }
    for c in &admission.waiting {
        let why = format!(
            "{}: no run starts yet: maxParallelWorkflows runs are going",
            c.condition
        );
        held.push((c, "parallel", why));
    }
    for c in &admission.paused {
        let why = format!(
            "{}: no run starts: the DeviceConfig carries {PAUSE_LABEL}=true",
            c.condition
        );
        held.push((c, "paused", why));
    }
    for (candidate, kind, why) in &held {
        tracing::info!(node = %candidate.node, condition = %candidate.condition, "remediation held: {why}");
        let notice = format!("{key}/{}/held/{kind}", candidate.node);
        if !dry_run
            && ctx.remediations.first_notice(notice)
            && let Some((_, _, node)) = candidates.iter().find(|(c, _, _)| c.node == candidate.node)
        {
            node_event_for(
                ctx,
                node,
                "Remediation",
                EventType::Warning,
                EVENT_HELD,
                why.clone(),
            )
            .await;
        }
    }
    // A node no longer held may be told again the next time it is.
    for (candidate, _, _) in &candidates {
        for kind in ["breaker", "parallel", "paused"] {
            if !held
                .iter()
                .any(|(c, k, _)| c.node == candidate.node && *k == kind)
            {
                ctx.remediations
                    .forget(&format!("{key}/{}/held/{kind}", candidate.node));
            }
        }
    }

    if dry_run {
        for candidate in &admission.start {
            let Some((_, _, node)) = candidates.iter().find(|(c, _, _)| c.node == candidate.node)
            else {
                continue;
            };
            dry_run_event(
                ctx,
                node,
                format!("{key}/{}/start/{}", candidate.node, candidate.condition),
                would_do(rw, candidate),
            )
            .await;
        }
        for (decision, facts, _) in &acts {
            if decision.record.is_some() {
                tracing::info!(node = %facts.name, "dry run: a remediation step is due and is not taken");
            }
        }
        return Ok(summary);
    }

    // The agents' namespace, whatever the DeviceConfig's (which may hold
    // workloads of its own).
    let operator_namespace = ctx
        .operator_namespace
        .clone()
        .unwrap_or_else(|| dc.namespace().unwrap_or_default());
    let drains = drain_policy(rw, &operator_namespace);
    for candidate in &admission.start {
        let Some((_, facts, node)) = candidates.iter().find(|(c, _, _)| c.node == candidate.node)
        else {
            continue;
        };
        let decision = plan::start(facts, candidate, &policy, now);
        carry_out(ctx, dc, node, facts, &decision, &drains).await?;
        if decision.drain == DrainOrder::Start {
            draining.push(facts.name.clone());
        }
        summary.running += 1;
    }
    for (decision, facts, node) in &acts {
        carry_out(ctx, dc, node, facts, decision, &drains).await?;
        match decision.drain {
            DrainOrder::Start => draining.push(facts.name.clone()),
            DrainOrder::Stop => draining.retain(|n| *n != facts.name),
            DrainOrder::Keep => {}
        }
        if let Some(wake) = decision.wake {
            summary.wake = Some(summary.wake.map_or(wake, |w: Duration| w.min(wake)));
        }
    }
    ctx.drains.prune(&key, Purpose::Remediation, &draining);
    sync_runs(dc, nodes, ctx).await?;
    if !draining.is_empty() {
        // Drains report their end themselves; a slow look covers a lost wake-up.
        let slow = Duration::from_secs(30);
        summary.wake = Some(summary.wake.map_or(slow, |w| w.min(slow)));
    }
    Ok(summary)
}

/// The runs of `nodes`' records, as the RemediationWorkflowStatus lists
/// them. Pure.
pub fn runs_of(nodes: &[Arc<Node>]) -> Runs {
    let mut runs = Runs::new();
    for node in nodes {
        let record = Record::of_annotations(node.annotations());
        for attempt in &record.attempts {
            runs.entry(node.name_any())
                .or_default()
                .entry(attempt.condition.clone())
                .or_default()
                .push(RunEntry {
                    name: attempt.name.clone(),
                    start_time: remediation_status::start_time(&attempt.started),
                });
        }
    }
    runs
}

/// Keeps the RemediationWorkflowStatus `default` of the DeviceConfig's
/// namespace listing the runs of its selected nodes, leaving other nodes'
/// entries (another DeviceConfig's) alone. Without the CRD installed, it
/// warns once and remediation goes on.
async fn sync_runs(dc: &DeviceConfig, nodes: &[Arc<Node>], ctx: &Context) -> Result<(), Error> {
    use kube::api::{DynamicObject, PostParams};
    let key = ConfigKey::of(dc);
    let mine = runs_of(nodes);
    let unchanged = ctx
        .remediations
        .written_runs
        .lock()
        .map(|w| w.get(&key) == Some(&mine))
        .unwrap_or(false);
    if unchanged {
        return Ok(());
    }
    let namespace = dc.namespace().unwrap_or_default();
    let waiting = ctx
        .remediations
        .create_again
        .lock()
        .map(|c| {
            c.get(&namespace)
                .is_some_and(|at| std::time::Instant::now() < *at)
        })
        .unwrap_or(false);
    if waiting {
        return Ok(());
    }
    let resource = remediation_status::api_resource();
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &namespace, &resource);
    let name = remediation_status::OBJECT_NAME;
    let object = format!("{namespace}/remediationworkflowstatus/{name}");
    let current = match ctx
        .leader_write("reading", &object, api.get_opt(name))
        .await?
    {
        Some(current) => current,
        None => {
            let new = DynamicObject::new(name, &resource).within(&namespace);
            match ctx
                .leader_write(
                    "creating",
                    &object,
                    api.create(&PostParams::default(), &new),
                )
                .await
            {
                Ok(created) => created,
                Err(error) => {
                    if let Ok(mut again) = ctx.remediations.create_again.lock() {
                        again.insert(
                            namespace.clone(),
                            std::time::Instant::now() + CREATE_AGAIN_AFTER,
                        );
                    }
                    if ctx.remediations.first_notice(format!("{key}/rwfstatus")) {
                        tracing::warn!(%error, "cannot keep the RemediationWorkflowStatus (is deploy/crd/remediationworkflowstatuses.amd.com.yaml applied?); remediation goes on");
                    }
                    return Ok(());
                }
            }
        }
    };
    let before: Runs = serde_json::from_value(current.data["status"].clone()).unwrap_or_default();
    let mut status = before.clone();
    for node in nodes {
        status.remove(&node.name_any());
    }
    status.extend(mine.clone());
    if status != before {
        let patch: json_patch::Patch = serde_json::from_value(
            serde_json::json!([{"op": "add", "path": "/status", "value": status}]),
        )
        .map_err(|e| Error::Kube {
            action: "encoding the runs of",
            object: object.clone(),
            source: kube::Error::SerdeError(e),
        })?;
        let params = crate::api::field_manager::patch(crate::api::field_manager::REMEDIATION);
        ctx.leader_write(
            "writing the runs to",
            &object,
            api.patch_status(name, &params, &kube::api::Patch::Json::<()>(patch)),
        )
        .await?;
    }
    if let Ok(mut written) = ctx.remediations.written_runs.lock() {
        written.insert(key, mine);
    }
    Ok(())
}

/// A dry run's Event about `node`, once per term for `notice`.
async fn dry_run_event(ctx: &Context, node: &Node, notice: String, message: String) {
    if ctx.remediations.first_notice(notice) {
        node_event_for(
            ctx,
            node,
            "Remediation",
            EventType::Normal,
            EVENT_DRY_RUN,
            message,
        )
        .await;
    }
}

/// What a dry run says a run would do.
fn would_do(rw: &RemediationWorkflowSpec, candidate: &Candidate) -> String {
    let entry = &candidate.entry;
    let taints: Vec<String> = taints_for(rw, &candidate.condition)
        .iter()
        .map(|t| {
            format!(
                "{}={}:{}",
                t.key,
                t.value.as_deref().unwrap_or(""),
                t.effect
            )
        })
        .collect();
    let mut steps = vec![format!("taint {}", taints.join(", "))];
    if entry.gpu_reset_first {
        steps.push(
            "reset the faulty GPU after draining its pods, if the fault is confined to one GPU \
             (else, or if that fails, go on)"
                .to_owned(),
        );
    }
    steps.push("drain the GPU pods".to_owned());
    if entry.physical_action_needed {
        steps.push("wait for a person".into());
    }
    if !entry.skip_reboot_step {
        steps.push("reboot".into());
    }
    if let Some(profile) = &entry.validation_tests_profile {
        steps.push(format!("run {} {}", profile.framework, profile.recipe));
    }
    steps.push("confirm the condition cleared and untaint".into());
    format!(
        "dry run: {} is True; remediation would {}",
        candidate.condition,
        steps.join(", then ")
    )
}

/// The drain a run's step asks for: before a GPU reset only the pods the
/// agent found on that GPU, else every GPU pod. Pure.
pub fn drain_for(record: &Record, policy: &DrainPolicy) -> DrainPolicy {
    let mut policy = policy.clone();
    if let Some(run) = record
        .run
        .as_ref()
        .filter(|r| r.phase == Phase::DrainingGpu)
    {
        policy.only = Some(
            run.gpu_pods
                .iter()
                .filter_map(|pod| pod.split_once('/'))
                .map(|(namespace, name)| (namespace.to_owned(), name.to_owned()))
                .collect(),
        );
    }
    policy
}

/// Carries one decision out, in the order that keeps a new leader right.
async fn carry_out(
    ctx: &Context,
    dc: &DeviceConfig,
    node: &Node,
    facts: &NodeFacts,
    decision: &Decision,
    drains: &DrainPolicy,
) -> Result<(), Error> {
    let name = node.name_any();
    let rw = &dc.spec.remediation_workflow;
    let record = decision.record.as_ref().unwrap_or(&facts.record);
    // The run the taints are for: the new one, else the one that ends.
    let condition = record
        .run
        .as_ref()
        .or(facts.record.run.as_ref())
        .map(|r| r.condition.clone())
        .unwrap_or_default();
    let taints = taints_for(rw, &condition);
    // The step's Events first: the record below is what the node's agent
    // acts on, and when this leader runs on that node its agent hands the
    // Lease over at once before a reboot, after which no Event of this
    // leader's would be written.
    for note in &decision.notes {
        tracing::info!(node = %name, reason = note.reason, "{}", note.message);
        let type_ = if note.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        node_event_for(
            ctx,
            node,
            "Remediation",
            type_,
            note.reason,
            note.message.clone(),
        )
        .await;
    }
    match decision.quarantine {
        Some(true) => {
            if decision.record.is_some() {
                write_record(ctx, node, record, rw).await?;
            }
            set_taints(ctx, &name, &taints, true).await?;
        }
        Some(false) => {
            set_taints(ctx, &name, &taints, false).await?;
            if decision.record.is_some() {
                write_record(ctx, node, record, rw).await?;
            }
        }
        None => {
            if decision.record.is_some() {
                write_record(ctx, node, record, rw).await?;
            }
        }
    }
    match decision.drain {
        DrainOrder::Start => {
            // The plan starts a drain only when it wants a fresh one: a
            // drain this term ran before (the GPU's pods, a failed run's)
            // must not stand in for it.
            ctx.drains.stop(&name, Purpose::Remediation);
            let policy = drain_for(record, drains);
            ctx.drains
                .start(&ctx.guard, dc, Purpose::Remediation, &name, policy);
        }
        DrainOrder::Stop => ctx.drains.stop(&name, Purpose::Remediation),
        DrainOrder::Keep => {}
    }
    let writer = ctx.node_writer(&name);
    for label in &decision.consume {
        guarded(
            ctx,
            &name,
            writer.remove_label_if(Concern::Remediation, label, "true"),
        )
        .await?
        .map_err(|e| node_error(&name, e))?;
    }
    for outcome in &decision.outcomes {
        match outcome {
            Outcome::Started { condition } => {
                crate::counters::record_remediation(condition, "started", None)
            }
            Outcome::Succeeded { condition, seconds } => {
                crate::counters::record_remediation(condition, "succeeded", Some(*seconds));
            }
            Outcome::Failed { condition } => {
                crate::counters::record_remediation(condition, "failed", None)
            }
        }
    }
    Ok(())
}

/// Releases every node of `nodes` a remediation quarantines: remediation
/// was switched off, or the DeviceConfig is going. Attempts are kept.
pub async fn release_all(
    dc: &DeviceConfig,
    nodes: &[Arc<Node>],
    ctx: &Context,
) -> Result<(), Error> {
    let rw = &dc.spec.remediation_workflow;
    for node in nodes {
        let mut record = Record::of_annotations(node.annotations());
        let Some(run) = record.run.take() else {
            continue;
        };
        let name = node.name_any();
        ctx.drains.stop(&name, Purpose::Remediation);
        if run.quarantined {
            set_taints(ctx, &name, &taints_for(rw, &run.condition), false).await?;
        }
        write_record(ctx, node, &record, rw).await?;
        tracing::info!(node = %name, condition = %run.condition, phase = run.phase.name(), "remediation is off for this node: released");
    }
    Ok(())
}

async fn set_taints(ctx: &Context, name: &str, taints: &[Taint], on: bool) -> Result<(), Error> {
    let writer = ctx.node_writer(name);
    let intent = CordonIntent {
        unschedulable: None,
        taints: taints.to_vec(),
        tainted: on,
    };
    guarded(ctx, name, writer.set_cordon(Concern::Remediation, &intent))
        .await?
        .map_err(|e| node_error(name, e))?;
    Ok(())
}

/// Makes the Node's record `record`, with `nodeRemediationLabels` while its
/// run is quarantined: one server-side apply, so both go together.
async fn write_record(
    ctx: &Context,
    node: &Node,
    record: &Record,
    rw: &RemediationWorkflowSpec,
) -> Result<(), Error> {
    let name = node.name_any();
    let writer = ctx.node_writer(&name);
    let quarantined = record.run.as_ref().is_some_and(|r| r.quarantined);
    let intent = NodeIntent {
        annotations: record
            .to_annotation()
            .map(|text| BTreeMap::from([(RECORD_ANNOTATION.to_owned(), text)]))
            .unwrap_or_default(),
        labels: if quarantined {
            rw.node_remediation_labels.clone()
        } else {
            BTreeMap::new()
        },
        ..NodeIntent::default()
    };
    // `apply` reads the Node fresh: a removal needs the server's record of
    // who owns what, and the cache may lag this term's own writes.
    guarded(ctx, &name, writer.apply(Concern::Remediation, &intent))
        .await?
        .map_err(|e| node_error(&name, e))?;
    Ok(())
}

async fn dc_event(ctx: &Context, dc: &DeviceConfig, type_: EventType, reason: &str, note: String) {
    ctx.dc_event(dc, type_, reason, note).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_is_pending_until_the_agent_reports_it_loaded_for_its_boot() {
        use crate::api::agent_status::{DriverLoad, DriverLoadState, DriverReport};
        assert!(driver_pending(None).is_some());
        let mut agent = AgentStatus::default();
        assert!(
            driver_pending(Some(&agent))
                .unwrap_or_default()
                .contains("not reported")
        );
        agent.driver = Some(DriverReport {
            loaded: false,
            boot_id: Some("boot-2".into()),
            ..DriverReport::default()
        });
        assert!(
            driver_pending(Some(&agent))
                .unwrap_or_default()
                .contains("not loaded")
        );
        if let Some(driver) = agent.driver.as_mut() {
            driver.loaded = true;
        }
        // Loaded, and the DeviceConfig manages no driver: ready.
        assert_eq!(driver_pending(Some(&agent)), None);
        // A managed driver still loading (a report of a load decided before
        // the module appeared): pending.
        agent.driver_load = Some(DriverLoad {
            state: DriverLoadState::Loading,
            reason: "DriverLoading".into(),
            message: "loading amdgpu 6.14.1".into(),
            bundle: None,
            version: None,
            asked: None,
            told_at: None,
        });
        assert!(
            driver_pending(Some(&agent))
                .unwrap_or_default()
                .contains("DriverLoading")
        );
        if let Some(load) = agent.driver_load.as_mut() {
            load.state = DriverLoadState::Loaded;
        }
        assert_eq!(driver_pending(Some(&agent)), None);
    }

    #[test]
    fn the_mapping_in_force_is_named_and_a_config_map_image_said_to_be_unused() {
        let mut dc = DeviceConfig::new("gpus", Default::default());
        dc.metadata.namespace = Some("kube-amd-gpu".into());
        let builtin = Mapping::builtin();
        let (reason, message) = mapping_in_force(&dc, &builtin);
        assert_eq!(reason, "BuiltInMapping");
        assert!(
            message.starts_with(&format!(
                "built-in mapping ({} conditions)",
                builtin.entries.len()
            )),
            "{message}"
        );
        dc.spec.remediation_workflow.config_map_image = Some("rocm/remediation:v1".into());
        dc.spec.remediation_workflow.config = Some(crate::api::LocalObjectRef {
            name: "mine".into(),
        });
        let mine = Mapping::parse("- nodeCondition: A\n").unwrap();
        let (reason, message) = mapping_in_force(&dc, &mine);
        assert_eq!(reason, "ConfigMapMapping");
        assert!(
            message.contains("ConfigMap kube-amd-gpu/mine (1 conditions)")
                && message.contains("configMapImage rocm/remediation:v1 is not acted on"),
            "{message}"
        );
    }

    #[test]
    fn default_taint_names_the_condition_and_custom_ones_are_used_as_given() {
        let mut rw = RemediationWorkflowSpec::default();
        let t = taints_for(&rw, "AMDGPUUnhealthy");
        assert_eq!(t[0].key, "amd-gpu-unhealthy");
        assert_eq!(t[0].value.as_deref(), Some("AMDGPUUnhealthy"));
        assert_eq!(t[0].effect, "NoSchedule");
        rw.node_remediation_taints = vec![Taint {
            key: "example.com/gpu".into(),
            effect: "NoExecute".into(),
            ..Taint::default()
        }];
        assert_eq!(taints_for(&rw, "X"), rw.node_remediation_taints);
    }

    #[test]
    fn before_a_gpu_reset_only_the_pods_on_that_gpu_are_drained() {
        let everything = drain_policy(&RemediationWorkflowSpec::default(), "ops");
        let mut run = crate::remediation::Run::begin(
            &crate::remediation::Entry::default(),
            Phase::DrainingGpu,
            true,
            "2026-12-02T00:00:00Z",
        );
        run.gpu_pods = vec!["ml/train".into(), "ml/infer".into()];
        let mut record = Record {
            run: Some(run),
            attempts: Vec::new(),
        };
        let only = drain_for(&record, &everything).only.unwrap();
        assert_eq!(
            only,
            [("ml", "infer"), ("ml", "train")]
                .map(|(n, p)| (n.to_owned(), p.to_owned()))
                .into_iter()
                .collect()
        );
        if let Some(run) = record.run.as_mut() {
            run.phase = Phase::Draining;
        }
        assert_eq!(drain_for(&record, &everything), everything);
    }

    #[test]
    fn the_drain_without_a_policy_is_the_references() {
        let rw = RemediationWorkflowSpec::default();
        let p = drain_policy(&rw, "kube-amd-gpu");
        assert!(p.force);
        assert_eq!(p.timeout, Some(Duration::from_secs(300)));
        for ns in ["kube-system", "cert-manager", "kube-amd-gpu"] {
            assert!(p.ignore_namespaces.contains(ns), "{ns}");
        }
    }

    #[test]
    fn breaker_settings_come_from_the_deviceconfigs_annotations() {
        let mut dc = DeviceConfig::new("gpus", Default::default());
        let p = policy_of(&dc, Confirm::default());
        assert_eq!(p.breaker, Breaker::default());
        dc.metadata.annotations = Some(BTreeMap::from([
            (BREAKER_ANNOTATION.to_owned(), "3".to_owned()),
            (BREAKER_WINDOW_ANNOTATION.to_owned(), "10m".to_owned()),
        ]));
        dc.metadata.labels = Some(BTreeMap::from([(
            PAUSE_LABEL.to_owned(),
            "true".to_owned(),
        )]));
        let p = policy_of(&dc, Confirm::default());
        assert_eq!(
            p.breaker.limit,
            crate::api::syntax::CountOrPercent::Count(3)
        );
        assert_eq!(p.breaker.window, Duration::from_secs(600));
        assert!(p.paused);
        dc.metadata.annotations = Some(BTreeMap::from([(
            BREAKER_ANNOTATION.to_owned(),
            "50%".to_owned(),
        )]));
        assert_eq!(
            policy_of(&dc, Confirm::default()).breaker.limit,
            crate::api::syntax::CountOrPercent::Percent(50)
        );
    }
}
