//! Carries out rolling driver upgrades: [`super::upgrade::plan`] decides,
//! this file reads the facts it decides on and does what it says.
//!
//! Per DeviceConfig with `driver.upgradePolicy.enable` and a
//! `driver.version`, each reconcile:
//! 1. reads every selected Node into [`NodeFacts`] ([`facts_of`], pure):
//!    its upgrade record ([`UpgradeRecord`], on the Node), its cordon and
//!    taint, what its agent reports of the driver and the boot, and the
//!    drain this leader runs for it, if any;
//! 2. plans;
//! 3. carries out each node's decision, several nodes at once: the record
//!    and the state label (server-side apply, field manager
//!    `gpu-operator-upgrade`), the cordon and taint (a guarded patch), the
//!    drain (a task per node, through [`super::drain`]), and an Event on
//!    the Node at the start, the end and on a failure;
//! 4. returns when to look again: the plan's nearest timeout. Everything
//!    else that moves an upgrade (an agent reporting its driver, a cordon
//!    taking, a drain ending) is an event that reconciles at once.
//!
//! The record is written before the step it announces, and the release
//! (uncordon, untaint) before the record says `Upgrade-Complete`: a leader
//! that dies between two writes leaves a record from which its successor
//! resumes without a second drain, and never a cordon nobody owns. The
//! records this leader wrote are kept for its term and preferred to its
//! Node cache, which may lag its own writes: a stale cache must not let it
//! pick more nodes than the policy allows. A write that got no answer (it
//! may have landed) counts as written for deciding, and is sent again until
//! one is answered. No write starts in the lease's last seconds.
//!
//! A node that another DeviceConfig is upgrading (it was relabelled) stays
//! that one's until it lets go; its record, cordon and drain are left alone.
//!
//! When upgrades stop applying to a node (the DeviceConfig turns the policy
//! or the driver off, stops selecting the node, or is deleted) its record
//! and state label are removed, and a cordon and taint the upgrade holds
//! are released.
//!
//! This module must not decide (the planner does) and writes Nodes only
//! through [`crate::node_writer`], each write checked against the lease.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::context::{Context, Error, guarded, node_error, node_event_for};
use super::drain::{DrainPolicy, Purpose};
use super::upgrade::{self, Action, Decision, DrainOutcome, NodeFacts, Policy};
use crate::api::agent_status::{
    AgentStatus, ConfigKey, DriverLoadState, ModuleOrigin, STATUS_ANNOTATION,
};
use crate::api::driver_upgrade::{
    RECORD_ANNOTATION, RETRY_VALUE, STATE_LABEL, TAINT_KEY, UpgradeRecord,
};
use crate::api::{DeviceConfig, Operand, UpgradeState};
use crate::driver::decision::REBOOT_FAILED;
use crate::node_writer::{Concern, CordonIntent, NodeIntent, NodeWriteError, NodeWriter};

/// Nodes whose decisions are carried out at once.
const CONCURRENT_NODES: usize = 16;
/// When to look again after a write failed.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// The upgrade taint, as the reference writes it.
pub fn upgrade_taint() -> Taint {
    Taint {
        key: TAINT_KEY.to_owned(),
        value: Some("true".to_owned()),
        effect: "NoSchedule".to_owned(),
        time_added: None,
    }
}

/// How long ago `at` (RFC 3339) was; zero when it cannot be read.
fn since(at: Option<&str>, now: Timestamp) -> Duration {
    at.and_then(|t| t.parse::<Timestamp>().ok())
        .and_then(|t| Duration::try_from(now.duration_since(t)).ok())
        .unwrap_or_default()
}

/// What the planner knows of `node` for DeviceConfig `key`, upgrading to
/// `target`. Pure.
pub fn facts_of(
    node: &Node,
    key: &ConfigKey,
    target: Option<&str>,
    record: Option<&UpgradeRecord>,
    drain: Option<DrainOutcome>,
    now: Timestamp,
) -> NodeFacts {
    let record = record.filter(|r| r.device_config == *key);
    let spec = node.spec.as_ref();
    let status = node.status.as_ref();
    let agent = node
        .annotations()
        .get(STATUS_ANNOTATION)
        .and_then(|text| AgentStatus::parse(text).ok());
    let told = record.and_then(|r| r.target.clone());
    let load = agent.as_ref().and_then(|a| a.driver_load.as_ref());
    let why = |l: &crate::api::agent_status::DriverLoad| format!("{}: {}", l.reason, l.message);
    // A refusal of the target the record tells, answering this very step
    // (`told_at` is the record's `since` the agent acted on), not an earlier
    // one; or a reboot it could not ask the host for (a command that fails
    // now fails at every retry). Waiting would not help either.
    let refused = load
        .filter(|l| {
            let gave_up = l.state == DriverLoadState::Refused
                || (l.state == DriverLoadState::Failed && l.reason == REBOOT_FAILED);
            gave_up
                && told.is_some()
                && l.asked == told
                && l.told_at.as_deref() == record.map(|r| r.since.as_str())
        })
        .map(why);
    // The agent refuses the target now, told or not.
    let refuses_target = load
        .filter(|l| {
            l.state == DriverLoadState::Refused && target.is_some() && l.asked.as_deref() == target
        })
        .map(why);
    let report = agent.and_then(|a| a.driver);
    let node_boot_id = status
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.clone())
        .filter(|b| !b.is_empty());
    NodeFacts {
        name: node.name_any(),
        ready: status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
        unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        holds_cordon: record.is_some_and(UpgradeRecord::holds_cordon),
        cordoned_before: record.and_then(|r| r.cordoned_before),
        tainted: spec
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| t.key == TAINT_KEY)),
        state: record.map(|r| r.state.clone()),
        in_state: record.map_or(Duration::ZERO, |r| since(Some(&r.since), now)),
        in_upgrade: record.map_or(Duration::ZERO, |r| since(r.started.as_deref(), now)),
        retry_requested: node.labels().get(STATE_LABEL).map(String::as_str) == Some(RETRY_VALUE),
        reported: report.is_some(),
        loaded: report.as_ref().is_some_and(|r| r.loaded),
        inbox: report
            .as_ref()
            .is_some_and(|r| r.loaded && r.origin.is_inbox()),
        builtin: report
            .as_ref()
            .is_some_and(|r| r.loaded && r.origin == ModuleOrigin::BuiltIn),
        refused,
        refuses_target,
        reason: record.and_then(|r| r.reason.clone()),
        version: report
            .as_ref()
            .filter(|r| r.loaded && !r.origin.is_inbox())
            .and_then(|r| r.version.clone()),
        boot_id: report.and_then(|r| r.boot_id).or(node_boot_id),
        boot_id_before: record.and_then(|r| r.reboot_from.clone()),
        told,
        drain,
    }
}

/// The record after `decision` for a node whose facts are `facts`: what
/// the planner changed, with `now` as the time of a new state. Pure.
pub fn next_record(
    key: &ConfigKey,
    current: Option<&UpgradeRecord>,
    facts: &NodeFacts,
    decision: &Decision,
    now: &str,
) -> UpgradeRecord {
    let mut record = current
        .filter(|r| r.device_config == *key)
        .cloned()
        .unwrap_or_else(|| UpgradeRecord::new(key.clone(), UpgradeState::NotStarted, now));
    if let Some(state) = &decision.state {
        let before = std::mem::replace(&mut record.state, state.clone());
        record.since = now.to_owned();
        record.reason = decision.reason.clone();
        match state {
            UpgradeState::Started | UpgradeState::InstallInProgress => {
                record.started = Some(now.to_owned());
                record.from = facts.version.clone();
                record.target = None;
                record.reboot_from = None;
            }
            UpgradeState::NotStarted => {
                // A retry, or a new target: nothing of the last run counts,
                // but a cordon the upgrade still holds stays its own. It
                // goes from what runs now, not from where the last run began.
                record.from = facts.version.clone();
                record.started = None;
                record.target = None;
                record.reboot_from = None;
                let held = before.is_failed()
                    && before != UpgradeState::CordonFailed
                    && record.cordoned_before == Some(false);
                if !held {
                    record.cordoned_before = None;
                }
            }
            s if s.is_complete() => {
                record.target = None;
                record.reboot_from = None;
                record.cordoned_before = None;
            }
            // A failed node is not rebooted again by its agent.
            s if s.is_failed() => record.reboot_from = None,
            _ => {}
        }
    } else if decision.reason.is_some() {
        record.reason = decision.reason.clone();
    }
    for action in &decision.actions {
        match action {
            Action::Cordon { was_cordoned } => {
                record.cordoned_before.get_or_insert(*was_cordoned);
            }
            Action::Tell { target, reboot } => {
                record.target = Some(target.clone());
                record.reboot_from = if *reboot { facts.boot_id.clone() } else { None };
            }
            Action::ForgetCordon => record.cordoned_before = None,
            Action::Drain | Action::Release { .. } => {}
        }
    }
    record
}

/// The Event a state change deserves, if any: the start and end of a
/// node's upgrade, and every failure. Other steps show in the record and
/// the state label, and are not worth an API write each. Pure.
pub fn state_event(
    from: Option<&UpgradeState>,
    to: &UpgradeState,
    record: &UpgradeRecord,
    target: &str,
) -> Option<(EventType, &'static str, String)> {
    match to {
        UpgradeState::Started => Some((
            EventType::Normal,
            "DriverUpgradeStarted",
            format!(
                "driver upgrade to {target} {} from {}: the node is cordoned and tainted \
                 {TAINT_KEY}; its GPU pods are being drained",
                match from {
                    Some(failed) if failed.is_failed() => {
                        format!("started again after {} (retry asked for)", failed.as_str())
                    }
                    _ => "started".to_owned(),
                },
                record.from.as_deref().unwrap_or("no driver")
            ),
        )),
        UpgradeState::InstallInProgress => Some((
            EventType::Normal,
            "DriverInstallStarted",
            format!("no amdgpu loaded: installing driver {target}"),
        )),
        UpgradeState::Complete | UpgradeState::InstallComplete
            if from.is_some_and(UpgradeState::is_in_progress) =>
        {
            Some((
                EventType::Normal,
                "DriverUpgradeComplete",
                match (to, record.from.as_deref()) {
                    (UpgradeState::Complete, Some(was)) => {
                        format!("{}: driver {target} runs, upgraded from {was}", to.as_str())
                    }
                    _ => format!("{}: driver {target} runs", to.as_str()),
                },
            ))
        }
        s if s.is_failed() => Some((
            EventType::Warning,
            "DriverUpgradeFailed",
            format!(
                "{}: {} (to {target}); label the node {STATE_LABEL}={RETRY_VALUE} to try again",
                s.as_str(),
                record.reason.as_deref().unwrap_or("no reason recorded")
            ),
        )),
        _ => None,
    }
}

/// Whether rolling upgrades apply to `dc`, and to which version.
fn target_of(dc: &DeviceConfig) -> Option<&str> {
    let driver = dc.spec.driver();
    let rolling = dc.spec.is_enabled(Operand::Driver)
        && driver.upgrade_policy.as_ref().and_then(|p| p.enable) == Some(true)
        && dc.metadata.deletion_timestamp.is_none();
    driver.version.as_deref().filter(|_| rolling)
}

/// One pass of `dc`'s driver upgrade over `selected` (the Nodes it
/// selects, read from a Node cache that has finished its first list: the
/// caller waits for it). Returns when to look again.
pub async fn reconcile(
    dc: &DeviceConfig,
    selected: &[Arc<Node>],
    ctx: &Context,
) -> Result<Option<Duration>, Error> {
    let key = ConfigKey::of(dc);
    let Some(target) = target_of(dc) else {
        stop(&key, ctx).await?;
        return Ok(None);
    };
    // Nodes this DeviceConfig no longer selects keep nothing of its upgrade.
    let released = release_all(&key, selected, ctx).await?;
    let upgrades = &ctx.upgrades;
    // A node another DeviceConfig is upgrading (it was relabelled) is that
    // one's until it lets go: its record, cordon and drain are left alone.
    let selected: Vec<&Arc<Node>> = selected
        .iter()
        .filter(|node| {
            let foreign = upgrades
                .record_of(node)
                .filter(|r| r.device_config != key)
                .filter(|r| r.holds_cordon() || r.state.is_in_progress());
            if let Some(r) = &foreign {
                tracing::debug!(node = %node.name_any(), other = %r.device_config, "left to the DeviceConfig whose upgrade it is in");
            }
            foreign.is_none()
        })
        .collect();
    let policy = Policy::of_spec(dc.spec.driver(), upgrades.timeouts);
    let now = Timestamp::now();
    let mut blocked_by: HashMap<String, Vec<String>> = HashMap::new();
    let mut records: HashMap<String, Option<UpgradeRecord>> = HashMap::new();
    let facts: Vec<NodeFacts> = selected
        .iter()
        .map(|node| {
            let name = node.name_any();
            let record = upgrades.record_of(node);
            let drain =
                ctx.drains
                    .outcome(&key, Purpose::Upgrade, &name)
                    .map(|(outcome, blocked)| {
                        blocked_by.insert(name.clone(), blocked);
                        outcome
                    });
            let facts = facts_of(node, &key, Some(target), record.as_ref(), drain, now);
            records.insert(name, record);
            facts
        })
        .collect();
    let mut plan = upgrade::plan(target, &policy, &facts);
    // A record write that got no answer is sent again, whatever the plan.
    for f in &facts {
        if upgrades.unconfirmed(&f.name) && !plan.decisions.iter().any(|d| d.node == f.name) {
            plan.decisions.push(Decision {
                node: f.name.clone(),
                state: None,
                actions: Vec::new(),
                reason: None,
            });
        }
    }
    // A drain the planner gives up on names what still held it.
    for decision in &mut plan.decisions {
        if decision.state == Some(UpgradeState::DrainFailed)
            && let Some(blocked) = blocked_by.get(&decision.node).filter(|b| !b.is_empty())
        {
            let why = decision.reason.take().unwrap_or_default();
            decision.reason = Some(format!("{why}: {}", blocked.join("; ")));
        }
    }
    // What keeps a drain is the node's reason while it drains, for `upgrade
    // status`: recorded once per change.
    for (name, blocked) in blocked_by.iter().filter(|(_, b)| !b.is_empty()) {
        let reason = format!("draining: {}", blocked.join("; "));
        let recorded = records.get(name).cloned().flatten().and_then(|r| r.reason);
        if recorded.as_deref() == Some(reason.as_str()) {
            continue;
        }
        match plan.decisions.iter_mut().find(|d| d.node == *name) {
            Some(decision) if decision.state.is_none() && decision.reason.is_none() => {
                decision.reason = Some(reason);
            }
            Some(_) => {}
            None => plan.decisions.push(Decision {
                node: name.clone(),
                state: None,
                actions: Vec::new(),
                reason: Some(reason),
            }),
        }
    }
    let drain_policy = DrainPolicy::of_upgrade(
        dc.spec
            .driver()
            .upgrade_policy
            .as_ref()
            .unwrap_or(&Default::default()),
    );
    let by_name: HashMap<String, (&Arc<Node>, &NodeFacts)> = selected
        .iter()
        .copied()
        .zip(&facts)
        .map(|(n, f)| (f.name.clone(), (n, f)))
        .collect();
    let now_text = now.to_string();
    let mut work = Vec::with_capacity(plan.decisions.len());
    for decision in &plan.decisions {
        if let Some((node, facts)) = by_name.get(&decision.node) {
            let step = carry_out(
                dc,
                &key,
                node,
                facts,
                decision,
                &drain_policy,
                &now_text,
                ctx,
            );
            work.push(async move { (decision, step.await) });
        }
    }
    let results: Vec<(&Decision, Result<(), Error>)> = futures::stream::iter(work)
        .buffer_unordered(CONCURRENT_NODES)
        .collect()
        .await;
    // A node's drain is done with once the node has left draining: its next
    // state was written. After a failed write it stays as it was, and so
    // does its drain (a finished drain is not run twice).
    let mut next: HashMap<&str, Option<UpgradeState>> = facts
        .iter()
        .map(|f| (f.name.as_str(), f.state.clone()))
        .collect();
    let mut wake = plan.wake_after;
    for (decision, result) in results {
        match result {
            Ok(()) => {
                if let Some(state) = &decision.state {
                    next.insert(decision.node.as_str(), Some(state.clone()));
                }
            }
            Err(e @ (Error::NotLeader | Error::LeaseRenewalDue)) => return Err(e),
            Err(e) => {
                tracing::warn!(deviceconfig = %key, node = %decision.node, error = %e, "driver upgrade step failed; trying again");
                crate::counters::record_api_error();
                wake = Some(wake.map_or(RETRY_AFTER, |w| w.min(RETRY_AFTER)));
            }
        }
    }
    let draining: Vec<String> = next
        .iter()
        .filter(|(_, state)| **state == Some(UpgradeState::Started))
        .map(|(name, _)| (*name).to_owned())
        .collect();
    ctx.drains.prune(&key, Purpose::Upgrade, &draining);
    crate::counters::set_upgrade_nodes(&key.to_string(), plan.counts.clone());
    if !released {
        wake = Some(wake.map_or(RETRY_AFTER, |w| w.min(RETRY_AFTER)));
    }
    Ok(wake)
}

/// `key`'s upgrades stop applying (the policy or the driver was turned off,
/// or the DeviceConfig is deleted): its drains stop, every Node gives back
/// what the upgrade holds, and its counts go.
pub async fn stop(key: &ConfigKey, ctx: &Context) -> Result<(), Error> {
    ctx.drains.prune(key, Purpose::Upgrade, &[]);
    crate::counters::set_upgrade_nodes(&key.to_string(), BTreeMap::new());
    if release_all(key, &[], ctx).await? {
        Ok(())
    } else {
        Err(Error::Release {
            config: key.to_string(),
        })
    }
}

/// Carries out one node's decision: the record before the step it
/// announces, the release before the record that says complete.
#[allow(clippy::too_many_arguments)]
async fn carry_out(
    dc: &DeviceConfig,
    key: &ConfigKey,
    node: &Node,
    facts: &NodeFacts,
    decision: &Decision,
    drain_policy: &DrainPolicy,
    now: &str,
    ctx: &Context,
) -> Result<(), Error> {
    let name = node.name_any();
    // Only a DeviceConfig that rolls upgrades gets here; its version names
    // the target in the Events.
    let target = target_of(dc).unwrap_or("driver.version");
    let writer = ctx.node_writer(&name);
    let current = ctx.upgrades.record_of(node);
    let mut record = next_record(key, current.as_ref(), facts, decision, now);
    let releasing = decision.actions.iter().find_map(|a| match a {
        Action::Release { keep_cordon } => Some(*keep_cordon),
        _ => None,
    });
    if let Some(keep_cordon) = releasing {
        // Released before the record says so: a record of completion over
        // a cordon nobody owns would keep the node out for good.
        let intent = CordonIntent {
            unschedulable: (!keep_cordon).then_some(false),
            taints: vec![upgrade_taint()],
            tainted: false,
        };
        if let Err(e) = guarded(ctx, &name, writer.set_cordon(Concern::Upgrade, &intent)).await? {
            // Refused for good only by a rejection; anything else is tried
            // again, the node staying where it is.
            if !refused_for_good(&e) {
                return Err(node_error(&name, e));
            }
            // Still the upgrade's cordon: the failure keeps what a release
            // later needs.
            let uncordon_failed = Decision {
                node: name.clone(),
                state: Some(UpgradeState::UncordonFailed),
                actions: Vec::new(),
                reason: Some(format!("the node could not be uncordoned: {e}")),
            };
            record = next_record(key, current.as_ref(), facts, &uncordon_failed, now);
        }
    }
    if ctx.upgrades.needs_write(&name, current.as_ref(), &record) {
        write_record(ctx, &writer, node, &record).await?;
        if facts.state.as_ref() != Some(&record.state) {
            if let Some(previous) = facts.state.as_ref().filter(|s| s.is_in_progress()) {
                crate::counters::record_upgrade_step(
                    previous.as_str(),
                    facts.in_state.as_secs_f64(),
                );
                if record.state.is_complete() {
                    crate::counters::record_upgrade_step("Upgrade", facts.in_upgrade.as_secs_f64());
                }
            }
            tracing::info!(node = %name, deviceconfig = %key, from = ?facts.state.as_ref().map(UpgradeState::as_str), to = record.state.as_str(), reason = ?record.reason, "driver upgrade state");
        }
    }
    let (mut cordoned_now, mut cordon_held) = (false, false);
    for action in &decision.actions {
        match action {
            Action::Cordon { was_cordoned } => {
                let intent = CordonIntent {
                    unschedulable: (!*was_cordoned).then_some(true),
                    taints: vec![upgrade_taint()],
                    tainted: true,
                };
                match guarded(ctx, &name, writer.set_cordon(Concern::Upgrade, &intent)).await? {
                    Ok(written) => (cordoned_now, cordon_held) = (written.applied, true),
                    Err(e) => {
                        // The planner gives up after its cordon timeout.
                        tracing::warn!(node = %name, error = %e, "cannot cordon the node yet");
                        return Err(node_error(&name, e));
                    }
                }
            }
            Action::Drain => ctx.drains.start(
                &ctx.guard,
                dc,
                Purpose::Upgrade,
                &name,
                drain_policy.clone(),
            ),
            Action::Tell { .. } | Action::Release { .. } | Action::ForgetCordon => {}
        }
    }
    // The Event once what it tells has happened: the start when the cordon
    // takes (on the pass it does, the first try or a later one), or, on a
    // retry of a failed node still cordoned, when the cordon is confirmed
    // in the pass that starts it again; every other one with its state.
    let event = if record.state == UpgradeState::Started {
        let entered = facts.state.as_ref() != Some(&UpgradeState::Started);
        (cordoned_now || (cordon_held && entered))
            .then(|| state_event(facts.state.as_ref(), &record.state, &record, target))
    } else {
        (facts.state.as_ref() != Some(&record.state))
            .then(|| state_event(facts.state.as_ref(), &record.state, &record, target))
    };
    if let Some(Some((type_, reason, note))) = event {
        node_event(ctx, node, type_, reason, note).await;
    }
    Ok(())
}

/// A write the API server rejected: trying again would not help (as opposed
/// to no answer, a conflict that persisted, or a busy server).
fn refused_for_good(e: &NodeWriteError) -> bool {
    matches!(
        e,
        NodeWriteError::Write { source: kube::Error::Api(status), .. }
            if (400..500).contains(&status.code) && !matches!(status.code, 409 | 422 | 429)
    )
}

/// Whether a failed write may still have been applied: no answer came (a
/// transport error), as opposed to a refusal.
fn maybe_applied(e: &NodeWriteError) -> bool {
    match e {
        // An internal error or a gateway timeout may come after the store
        // took the write ("etcdserver: request timed out").
        NodeWriteError::Write {
            source: kube::Error::Api(status),
            ..
        } => matches!(status.code, 500 | 504),
        NodeWriteError::Read { .. } => false,
        NodeWriteError::Write { .. } => true,
    }
}

/// Writes `record` and its state label on `node`, and remembers it: as
/// written when the server took it, as maybe written when no answer came
/// (it is sent again, and counts meanwhile), not at all when refused.
async fn write_record(
    ctx: &Context,
    writer: &NodeWriter,
    node: &Node,
    record: &UpgradeRecord,
) -> Result<(), Error> {
    let intent = NodeIntent {
        labels: [(STATE_LABEL.to_owned(), record.state.as_str().to_owned())].into(),
        annotations: [(RECORD_ANNOTATION.to_owned(), record.to_json())].into(),
        ..NodeIntent::default()
    };
    let name = node.name_any();
    let written = guarded(ctx, &name, writer.apply_to(node, Concern::Upgrade, &intent));
    match written.await {
        Ok(Ok(_)) => {
            ctx.upgrades.remember(&name, Some(record.clone()), true);
            Ok(())
        }
        Ok(Err(e)) => {
            if maybe_applied(&e) {
                ctx.upgrades.remember(&name, Some(record.clone()), false);
            }
            Err(node_error(&name, e))
        }
        Err(e) => {
            // Cut off mid-flight, or not started at all: either way it may
            // not have landed, and it is sent again.
            ctx.upgrades.remember(&name, Some(record.clone()), false);
            Err(e)
        }
    }
}

/// Removes `key`'s upgrade from every Node not in `keep` that carries its
/// record: the record and the state label, the taint, and the cordon when
/// the upgrade holds it. Each Node is read afresh first, and left alone
/// unless its record is still `key`'s: another DeviceConfig may have taken
/// the node over since. A node that cannot be released now is logged and
/// left for the next pass; returns whether every one was.
pub async fn release_all(
    key: &ConfigKey,
    keep: &[Arc<Node>],
    ctx: &Context,
) -> Result<bool, Error> {
    // A partial cache would make every node look like it left.
    if !ctx.nodes_ready() {
        return Ok(true);
    }
    // A set: this runs on every reconcile of a DeviceConfig with rolling
    // upgrades, over every cached Node (130,000 in the largest clusters).
    let kept: HashSet<&str> = keep
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    let leaving: Vec<Arc<Node>> = ctx
        .nodes
        .state()
        .into_iter()
        .filter(|n| {
            !n.metadata
                .name
                .as_deref()
                .is_some_and(|name| kept.contains(name))
        })
        .filter(|n| {
            ctx.upgrades
                .record_of(n)
                .is_some_and(|r| r.device_config == *key)
        })
        .collect();
    let mut all = true;
    for node in leaving {
        let name = node.name_any();
        match release(key, &name, ctx).await {
            Ok(()) => {}
            Err(e @ (Error::NotLeader | Error::LeaseRenewalDue)) => return Err(e),
            Err(e) => {
                tracing::warn!(node = %name, deviceconfig = %key, error = %e, "cannot release the node from its driver upgrade yet");
                crate::counters::record_api_error();
                all = false;
            }
        }
    }
    Ok(all)
}

/// [`release_all`] for one node.
async fn release(key: &ConfigKey, name: &str, ctx: &Context) -> Result<(), Error> {
    let writer = ctx.node_writer(name);
    let fresh = guarded(ctx, name, writer.read())
        .await?
        .map_err(|e| node_error(name, e))?;
    let record = UpgradeRecord::of_annotations(fresh.annotations());
    let Some(record) = record.filter(|r| r.device_config == *key) else {
        // Gone, or another DeviceConfig's now: not ours to remove.
        ctx.upgrades.forget(name);
        return Ok(());
    };
    ctx.drains.stop(name, Purpose::Upgrade);
    let intent = CordonIntent {
        unschedulable: record.holds_cordon().then_some(false),
        taints: vec![upgrade_taint()],
        tainted: false,
    };
    guarded(ctx, name, writer.set_cordon(Concern::Upgrade, &intent))
        .await?
        .map_err(|e| node_error(name, e))?;
    // The fresh read carries the server's record of who owns what, which
    // the removal needs.
    guarded(
        ctx,
        name,
        writer.apply_to(&fresh, Concern::Upgrade, &NodeIntent::default()),
    )
    .await?
    .map_err(|e| node_error(name, e))?;
    ctx.upgrades.remember(name, None, true);
    tracing::info!(node = %name, deviceconfig = %key, "driver upgrade no longer applies: record removed and the node released");
    Ok(())
}

/// Records an Event about `node` (a failure to record one is logged).
async fn node_event(ctx: &Context, node: &Node, type_: EventType, reason: &str, note: String) {
    node_event_for(ctx, node, "DriverUpgrade", type_, reason, note).await
}

/// One node's upgrade as a person reads it (`gpu-operator upgrade status`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeProgress {
    pub node: String,
    pub device_config: String,
    /// The record's state; `None` when no upgrade touched the node.
    pub state: Option<String>,
    /// The version the node ran when picked, else the one it runs.
    pub from: Option<String>,
    /// The version it is upgraded to.
    pub to: Option<String>,
    /// How long the node has been in its state, in seconds.
    pub for_seconds: Option<u64>,
    /// What blocks it, or why it failed.
    pub blocked_by: Option<String>,
    /// A person cordoned the node, or it is not Ready: it will not be picked.
    pub held: Option<String>,
}

/// Each node `dc` selects, in name order, as [`NodeProgress`]. Pure.
pub fn progress_of(dc: &DeviceConfig, nodes: &[Node], now: Timestamp) -> Vec<NodeProgress> {
    let key = ConfigKey::of(dc);
    let target = dc.spec.driver().version.clone();
    let mut rows: Vec<NodeProgress> = nodes
        .iter()
        .filter(|n| dc.spec.selects(n.labels()))
        .map(|node| {
            let record = UpgradeRecord::of_annotations(node.annotations())
                .filter(|r| r.device_config == key);
            let facts = facts_of(node, &key, target.as_deref(), record.as_ref(), None, now);
            let held = if !facts.ready {
                Some("the Node is not Ready".to_owned())
            } else if facts.unschedulable && !facts.holds_cordon {
                Some("cordoned by someone else: not picked".to_owned())
            } else {
                None
            };
            NodeProgress {
                node: facts.name.clone(),
                device_config: key.to_string(),
                state: record.as_ref().map(|r| r.state.as_str().to_owned()),
                from: record
                    .as_ref()
                    .and_then(|r| r.from.clone())
                    .or_else(|| facts.version.clone()),
                to: record
                    .as_ref()
                    .and_then(|r| r.target.clone())
                    .or_else(|| target.clone()),
                for_seconds: record.as_ref().map(|_| facts.in_state.as_secs()),
                // What blocks a step under way, why it failed, or why a node
                // waits to be picked; a retry's reason is history.
                blocked_by: record
                    .filter(|r| {
                        r.state.is_in_progress()
                            || r.state.is_failed()
                            || r.state == UpgradeState::NotStarted
                    })
                    .and_then(|r| r.reason),
                held,
            }
        })
        .collect();
    rows.sort_by(|a, b| a.node.cmp(&b.node));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: &str = "2026-12-02T08:10:00Z";

    fn key() -> ConfigKey {
        ConfigKey::new("kube-amd-gpu", "default")
    }

    fn node(value: serde_json::Value) -> Node {
        serde_json::from_value(value).expect("a Node")
    }

    fn agent_annotation(version: Option<&str>, origin: &str, boot: &str) -> String {
        json!({"v": 1, "gpus": 1, "driver": {
            "loaded": version.is_some() || origin != "NotLoaded",
            "version": version, "origin": origin, "bootId": boot,
            "secureBoot": "NotUefi"}})
        .to_string()
    }

    #[test]
    fn progress_says_why_a_waiting_node_is_not_picked_and_drops_history() {
        let dc: DeviceConfig = serde_json::from_value(json!({
            "apiVersion": "amd.com/v1alpha1", "kind": "DeviceConfig",
            "metadata": {"name": "default", "namespace": "kube-amd-gpu"},
            "spec": {"driver": {"enable": true, "version": "6.4.1"}}
        }))
        .expect("a DeviceConfig");
        let with_record = |name: &str, state: UpgradeState, reason: &str| {
            let mut record = UpgradeRecord::new(key(), state, "2026-12-02T08:09:00Z");
            record.reason = Some(reason.into());
            node(json!({
                "metadata": {"name": name,
                    "annotations": {RECORD_ANNOTATION: record.to_json()}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}
            }))
        };
        let nodes = [
            with_record(
                "a",
                UpgradeState::NotStarted,
                "not picked yet: maxParallelUpgrades allows 1 upgrade(s) at once, and 1 are under way",
            ),
            with_record("b", UpgradeState::Complete, "runs driver 6.4.1"),
        ];
        let rows = progress_of(&dc, &nodes, NOW.parse().unwrap());
        assert!(
            rows[0]
                .blocked_by
                .as_deref()
                .is_some_and(|b| b.contains("maxParallelUpgrades")),
            "{rows:?}"
        );
        assert_eq!(
            rows[1].blocked_by, None,
            "a finished node's reason is history"
        );
    }

    #[test]
    fn facts_come_from_the_record_the_cordon_and_the_agents_report() {
        let mut record =
            UpgradeRecord::new(key(), UpgradeState::InProgress, "2026-12-02T08:09:00Z");
        record.started = Some("2026-12-02T08:00:00Z".into());
        record.cordoned_before = Some(false);
        record.target = Some("6.4.1".into());
        record.reboot_from = Some("boot-1".into());
        let n = node(json!({
            "metadata": {"name": "gpu-1",
                "labels": {STATE_LABEL: RETRY_VALUE},
                "annotations": {STATUS_ANNOTATION: agent_annotation(Some("6.3.0"), "OutOfTree", "boot-2")}},
            "spec": {"unschedulable": true, "taints": [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        }));
        let now: Timestamp = NOW.parse().unwrap();
        let f = facts_of(
            &n,
            &key(),
            Some("6.4.1"),
            Some(&record),
            Some(DrainOutcome::Done),
            now,
        );
        assert!(f.ready && f.unschedulable && f.tainted && f.holds_cordon);
        assert_eq!(f.cordoned_before, Some(false));
        assert_eq!(f.state, Some(UpgradeState::InProgress));
        assert_eq!(f.in_state, Duration::from_secs(60));
        assert_eq!(f.in_upgrade, Duration::from_secs(600));
        assert!(f.retry_requested && f.reported && f.loaded && !f.inbox);
        assert_eq!(f.version.as_deref(), Some("6.3.0"));
        assert_eq!(f.boot_id.as_deref(), Some("boot-2"));
        assert_eq!(f.boot_id_before.as_deref(), Some("boot-1"));
        assert_eq!(f.told.as_deref(), Some("6.4.1"));
        // Another DeviceConfig's record is none of this one's business.
        let other = facts_of(
            &n,
            &ConfigKey::new("ns", "other"),
            Some("6.4.1"),
            Some(&record),
            None,
            now,
        );
        assert_eq!(
            (other.state, other.told, other.holds_cordon),
            (None, None, false)
        );
        // The in-box driver has no version of ours.
        let inbox = node(json!({"metadata": {"name": "gpu-2", "annotations": {
            STATUS_ANNOTATION: agent_annotation(None, "InTree", "b")}}}));
        let f = facts_of(&inbox, &key(), Some("6.4.1"), None, None, now);
        assert!(f.reported && f.loaded && f.inbox && !f.ready);
        assert_eq!(f.version, None);
        // No agent report: nothing known.
        let silent = node(json!({"metadata": {"name": "gpu-3"}}));
        assert!(!facts_of(&silent, &key(), Some("6.4.1"), None, None, now).reported);
        // The agent gave up on the target it was told: a refusal, or a
        // reboot it could not ask for; not a refusal of an earlier target,
        // nor a failure it retries (modprobe).
        // The agent's outcome, answering the record's step `told_at`.
        let facts_with = |state: &str, reason: &str, asked: &str, told_at: &str| {
            let mut status: serde_json::Value =
                serde_json::from_str(&agent_annotation(Some("6.3.0"), "OutOfTree", "boot-2"))
                    .unwrap();
            status["driverLoad"] = json!({"state": state, "reason": reason, "message": "m",
                "asked": asked, "toldAt": told_at});
            let n = node(json!({"metadata": {"name": "gpu-4",
                "annotations": {STATUS_ANNOTATION: status.to_string()}}}));
            facts_of(&n, &key(), Some("6.4.1"), Some(&record), None, now)
        };
        let step = record.since.clone();
        let gave_up = |state: &str, reason: &str, asked: &str, told_at: &str| {
            facts_with(state, reason, asked, told_at).refused
        };
        assert_eq!(
            gave_up("refused", "BundleMissingForKernel", "6.4.1", &step).as_deref(),
            Some("BundleMissingForKernel: m")
        );
        assert!(gave_up("failed", "RebootFailed", "6.4.1", &step).is_some());
        assert_eq!(
            gave_up("refused", "BundleMissingForKernel", "6.4.0", &step),
            None
        );
        assert_eq!(gave_up("failed", "ModprobeFailed", "6.4.1", &step), None);
        // A refusal from before this step (before the Tell) does not fail it,
        // but still says the agent refuses the target: the node is not picked.
        let before = facts_with("refused", "BundleMissingForKernel", "6.4.1", "earlier");
        assert_eq!(before.refused, None);
        assert!(before.refuses_target.is_some());
    }

    #[test]
    fn records_follow_the_decision_and_keep_what_a_resume_needs() {
        let facts = NodeFacts {
            name: "gpu-1".into(),
            version: Some("6.3.0".into()),
            boot_id: Some("boot-1".into()),
            ..NodeFacts::default()
        };
        let picked = Decision {
            node: "gpu-1".into(),
            state: Some(UpgradeState::Started),
            actions: vec![Action::Cordon {
                was_cordoned: false,
            }],
            reason: None,
        };
        let started = next_record(&key(), None, &facts, &picked, "t1");
        assert_eq!(started.state, UpgradeState::Started);
        assert_eq!(
            (
                started.started.as_deref(),
                started.from.as_deref(),
                started.cordoned_before
            ),
            (Some("t1"), Some("6.3.0"), Some(false))
        );
        let told = Decision {
            node: "gpu-1".into(),
            state: Some(UpgradeState::RebootInProgress),
            actions: vec![Action::Tell {
                target: "6.4.1".into(),
                reboot: true,
            }],
            reason: None,
        };
        let rebooting = next_record(&key(), Some(&started), &facts, &told, "t2");
        assert_eq!(rebooting.target.as_deref(), Some("6.4.1"));
        assert_eq!(rebooting.reboot_from.as_deref(), Some("boot-1"));
        assert_eq!(
            rebooting.started.as_deref(),
            Some("t1"),
            "the upgrade's start stays"
        );
        assert_eq!(rebooting.since, "t2");
        let failed = Decision {
            node: "gpu-1".into(),
            state: Some(UpgradeState::RebootFailed),
            actions: vec![],
            reason: Some("did not come back".into()),
        };
        let failed = next_record(&key(), Some(&rebooting), &facts, &failed, "t3");
        assert_eq!(
            failed.reboot_from, None,
            "a failed node is not rebooted again"
        );
        assert!(failed.holds_cordon());
        // A retry keeps the cordon the upgrade's own.
        let retry = Decision {
            node: "gpu-1".into(),
            state: Some(UpgradeState::NotStarted),
            actions: vec![],
            reason: Some("retry".into()),
        };
        let now_runs = NodeFacts {
            version: Some("6.3.1".into()),
            ..facts.clone()
        };
        let retried = next_record(&key(), Some(&failed), &now_runs, &retry, "t4");
        assert_eq!(retried.cordoned_before, Some(false));
        assert_eq!((&retried.target, &retried.started), (&None, &None));
        // Waiting to be picked, it goes from what runs now.
        assert_eq!(retried.from.as_deref(), Some("6.3.1"));
        let done = Decision {
            node: "gpu-1".into(),
            state: Some(UpgradeState::Complete),
            actions: vec![Action::Release { keep_cordon: false }],
            reason: None,
        };
        let complete = next_record(&key(), Some(&rebooting), &facts, &done, "t5");
        assert_eq!((&complete.target, &complete.reboot_from), (&None, &None));
        assert!(!complete.holds_cordon());
    }

    #[test]
    fn events_mark_the_start_the_end_and_failures_only() {
        let mut record = UpgradeRecord::new(key(), UpgradeState::Started, "t");
        record.from = Some("6.3.0".into());
        let start = state_event(
            Some(&UpgradeState::NotStarted),
            &UpgradeState::Started,
            &record,
            "6.4.1",
        );
        assert!(
            matches!(start, Some((EventType::Normal, "DriverUpgradeStarted", ref n)) if n.contains("6.3.0"))
        );
        // A retry is a new start, with a note of its own (a series of its
        // own, not a count on the first start's).
        let again = state_event(
            Some(&UpgradeState::Failed),
            &UpgradeState::Started,
            &record,
            "6.4.1",
        );
        assert!(
            matches!(again, Some((EventType::Normal, "DriverUpgradeStarted", ref n))
                if n.contains("started again after Upgrade-Failed") && n.contains("6.3.0")),
            "{again:?}"
        );
        assert_eq!(
            state_event(
                Some(&UpgradeState::Started),
                &UpgradeState::InProgress,
                &record,
                "6.4.1"
            ),
            None
        );
        assert_eq!(
            state_event(None, &UpgradeState::NotStarted, &record, "6.4.1"),
            None
        );
        record.reason = Some("the PodDisruptionBudget train-pdb refuses its eviction".into());
        let failed = state_event(
            Some(&UpgradeState::Started),
            &UpgradeState::DrainFailed,
            &record,
            "6.4.1",
        )
        .expect("a failure is an Event");
        assert_eq!(
            (failed.0, failed.1),
            (EventType::Warning, "DriverUpgradeFailed")
        );
        assert!(
            failed.2.contains("train-pdb")
                && failed.2.contains(RETRY_VALUE)
                && failed.2.contains("to 6.4.1"),
            "{}",
            failed.2
        );
        let done = state_event(
            Some(&UpgradeState::InProgress),
            &UpgradeState::Complete,
            &record,
            "6.4.1",
        )
        .expect("the end of an upgrade is an Event");
        assert!(
            done.2.contains("driver 6.4.1 runs, upgraded from 6.3.0"),
            "{}",
            done.2
        );
        // Found complete with no upgrade run: no news.
        assert_eq!(
            state_event(None, &UpgradeState::Complete, &record, "6.4.1"),
            None
        );
    }
}
