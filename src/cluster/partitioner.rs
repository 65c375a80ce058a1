//! The leader's part of partition changes: for each node a DeviceConfig with
//! `configManager` selects, [`crate::partition::state::leader_step`] decides
//! from the profile label, the agent's state label and the leader's record;
//! this file carries it out:
//! - start: the record (`draining`, and whether a person had cordoned the
//!   node) first, then the cordon and taint, then the drain, through the
//!   drain runner the upgrades use ([`super::drain`]);
//! - drain: keep the node's drain running (a new leader resumes one that
//!   its predecessor left unfinished); when it ends, the record says
//!   `drained` (or `failed`, with why, and an Event), and the agent writes
//!   the modes;
//! - release: the cordon and taint lifted (a person's cordon stays), then
//!   the record removed.
//!
//! The record is written before the step it announces, so a leader killed
//! between the drain and the change leaves `drained`, and its successor
//! waits for the agent instead of draining again. Every write is checked
//! against the lease. This module must not decide (the state module does)
//! and writes Nodes only through [`crate::node_writer`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::context::{Context, Error, guarded, node_error, node_event_for};
use super::drain::DrainOutcome;
use super::drain::DrainPolicy;
use super::drain::Purpose;
use crate::api::agent_status::ConfigKey;
use crate::api::semantics::Operand;
use crate::api::{DeviceConfig, DrainSpec};
use crate::node_writer::{Concern, CordonIntent, NodeIntent};
use crate::partition::state::{
    LeaderStep, Phase, RECORD_ANNOTATION, REFERENCE_TAINT_KEY, REFERENCE_TAINT_VALUE, Record,
    State, TAINT_KEY, leader_step,
};
use crate::partition::{PROFILE_LABEL, STATE_LABEL};

/// What the partitioner reads of one Node, and the step it decides on. Pure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionFacts {
    /// The profile label, where `dc` runs the config manager.
    pub label: Option<String>,
    pub record: Option<Record>,
    /// The node carries the reference's `amd-dcm=up:NoExecute` taint.
    pub reference_tainted: bool,
    pub step: LeaderStep,
}

/// The facts of `node` under `dc`, and its step. Pure.
pub fn facts_of(dc: &DeviceConfig, node: &Node) -> PartitionFacts {
    let runs = dc.spec.runs_on(Operand::ConfigManager, node.labels());
    let label = runs
        .then(|| node.labels().get(PROFILE_LABEL).cloned())
        .flatten();
    let state = node.labels().get(STATE_LABEL).and_then(|s| State::parse(s));
    let record = node
        .annotations()
        .get(RECORD_ANNOTATION)
        .and_then(|r| Record::parse(r));
    let cordoned = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let upgrading = crate::api::driver_upgrade::UpgradeRecord::of_annotations(node.annotations())
        .is_some_and(|u| u.state.is_in_progress() || u.state.is_failed());
    let step = leader_step(
        label.as_deref(),
        state,
        record.as_ref(),
        cordoned,
        upgrading,
    );
    PartitionFacts {
        label,
        record,
        reference_tainted: has_reference_taint(node),
        step,
    }
}

/// Carries out each selected node's step. Returns when to look again (a
/// running drain wakes the reconciler itself when it ends).
pub async fn reconcile(
    dc: &DeviceConfig,
    nodes: &[Arc<Node>],
    ctx: &Context,
) -> Result<Option<Duration>, Error> {
    let key = ConfigKey::of(dc);
    let mut draining = Vec::new();
    let mut wake = None;
    for node in nodes {
        let name = node.name_any();
        let PartitionFacts {
            label,
            record,
            reference_tainted,
            step,
        } = facts_of(dc, node);
        match step {
            LeaderStep::Nothing => {}
            LeaderStep::Start { .. }
                if ctx
                    .drains
                    .outcome(&key, Purpose::Partition, &name)
                    .is_some() =>
            {
                // Started already; the cache has not caught up with the record.
                draining.push(name);
            }
            LeaderStep::Start { person_cordoned } => {
                let profile = label.clone().unwrap_or_default();
                let record = Record {
                    profile: profile.clone(),
                    phase: Phase::Draining,
                    person_cordoned,
                    reason: None,
                    reference_taint: false,
                };
                write_record(ctx, node, Some(&record)).await?;
                cordon(ctx, &name, &profile, true, true).await?;
                tracing::info!(node = %name, %profile, person_cordoned, "partition change: cordoned; draining the GPU pods");
                node_event_for(
                    ctx,
                    node,
                    "Partition",
                    EventType::Normal,
                    "PartitionDraining",
                    format!("cordoned and draining the GPU pods for profile {profile}"),
                )
                .await;
                ctx.drains
                    .start(&ctx.guard, dc, Purpose::Partition, &name, drain_policy());
                draining.push(name);
            }
            LeaderStep::Drain => {
                let Some(record) = record else { continue };
                match ctx.drains.outcome(&key, Purpose::Partition, &name) {
                    None => {
                        // A drain this term did not start (the last leader's):
                        // resumed, never restarted from scratch by a record.
                        ctx.drains
                            .start(&ctx.guard, dc, Purpose::Partition, &name, drain_policy());
                        draining.push(name);
                    }
                    Some((DrainOutcome::Running, _)) => draining.push(name),
                    Some((DrainOutcome::Done, _)) => {
                        // The reference's taint too, once the GPU pods are
                        // gone by the drain; unless it is there already
                        // (a person's), which stays theirs.
                        let reference_taint = record.reference_taint || !reference_tainted;
                        let done = Record {
                            phase: Phase::Drained,
                            reference_taint,
                            ..record
                        };
                        write_record(ctx, node, Some(&done)).await?;
                        if reference_taint {
                            set_reference_taint(ctx, &name, true).await?;
                        }
                        // Kept until the cache shows the record: a stale
                        // copy must not start the drain again.
                        draining.push(name.clone());
                        tracing::info!(node = %name, profile = %done.profile, "partition change: drained; the agent writes the modes");
                    }
                    Some((DrainOutcome::Failed(why), _)) => {
                        let failed = Record {
                            phase: Phase::Failed,
                            reason: Some(format!("drain failed: {why}")),
                            ..record
                        };
                        write_record(ctx, node, Some(&failed)).await?;
                        node_event_for(
                            ctx,
                            node,
                            "Partition",
                            EventType::Warning,
                            "PartitionDrainFailed",
                            format!(
                                "profile {}: the drain failed: {why}; the node stays cordoned",
                                failed.profile
                            ),
                        )
                        .await;
                    }
                }
            }
            LeaderStep::Release { uncordon } => {
                let reference_taint = record.as_ref().is_some_and(|r| r.reference_taint);
                let profile = record.map(|r| r.profile).unwrap_or_default();
                if reference_taint {
                    set_reference_taint(ctx, &name, false).await?;
                }
                release(ctx, node, &profile, uncordon).await?;
                tracing::info!(node = %name, %profile, uncordoned = uncordon, "partition change: released the node");
                node_event_for(
                    ctx,
                    node,
                    "Partition",
                    EventType::Normal,
                    "PartitionReleased",
                    if uncordon {
                        format!("profile {profile}: the node is schedulable again")
                    } else {
                        format!("profile {profile}: done; the node stays cordoned, as a person cordoned it before")
                    },
                )
                .await;
            }
        }
        if !draining.is_empty() {
            // Drains report their end themselves; a slow look now and then
            // covers a wake-up lost to a leadership change.
            wake = Some(Duration::from_secs(30));
        }
    }
    ctx.drains.prune(&key, Purpose::Partition, &draining);
    Ok(wake)
}

/// Releases every node of `nodes` a partition change holds: the DeviceConfig
/// is going.
pub async fn release_all(nodes: &[Arc<Node>], ctx: &Context) -> Result<(), Error> {
    for node in nodes {
        let Some(record) = node
            .annotations()
            .get(RECORD_ANNOTATION)
            .and_then(|r| Record::parse(r))
        else {
            continue;
        };
        if record.reference_taint {
            set_reference_taint(ctx, &node.name_any(), false).await?;
        }
        release(ctx, node, &record.profile, !record.person_cordoned).await?;
        tracing::info!(node = %node.name_any(), profile = %record.profile, "the DeviceConfig is going: partition change released");
    }
    Ok(())
}

/// Stops the node's drain, lifts the taint and (with `uncordon`) the
/// cordon, then drops the record: the record goes last, so that a leader
/// that dies midway still finds whose cordon it is.
async fn release(ctx: &Context, node: &Node, profile: &str, uncordon: bool) -> Result<(), Error> {
    let name = node.name_any();
    ctx.drains.stop(&name, Purpose::Partition);
    cordon(ctx, &name, profile, false, uncordon).await?;
    write_record(ctx, node, None).await
}

/// A partition change drains with the defaults of `nodeDrainPolicy`: the
/// reference's configManager has no drain settings.
fn drain_policy() -> DrainPolicy {
    DrainPolicy::of_drain(&DrainSpec::default())
}

fn taint(profile: &str) -> Taint {
    Taint {
        key: TAINT_KEY.to_owned(),
        value: Some(profile.to_owned()).filter(|p| !p.is_empty()),
        effect: "NoSchedule".to_owned(),
        ..Taint::default()
    }
}

/// The reference's `amd-dcm=up:NoExecute`
/// ([`crate::partition::state::REFERENCE_TAINT_KEY`]).
fn reference_taint() -> Taint {
    Taint {
        key: REFERENCE_TAINT_KEY.to_owned(),
        value: Some(REFERENCE_TAINT_VALUE.to_owned()),
        effect: "NoExecute".to_owned(),
        ..Taint::default()
    }
}

/// Whether the node carries the reference's taint already.
fn has_reference_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| {
            ts.iter()
                .any(|t| t.key == REFERENCE_TAINT_KEY && t.effect == "NoExecute")
        })
}

/// Puts the reference's taint on (`on`) or lifts it; the cordon stays as
/// it is.
async fn set_reference_taint(ctx: &Context, name: &str, on: bool) -> Result<(), Error> {
    let intent = CordonIntent {
        unschedulable: None,
        taints: vec![reference_taint()],
        tainted: on,
    };
    set_cordon(ctx, name, &intent).await
}

/// Cordons and taints (`on`), or lifts the taint and, with `uncordon`, the
/// cordon.
async fn cordon(
    ctx: &Context,
    name: &str,
    profile: &str,
    on: bool,
    uncordon: bool,
) -> Result<(), Error> {
    let intent = CordonIntent {
        unschedulable: if on {
            Some(true)
        } else {
            uncordon.then_some(false)
        },
        taints: vec![taint(profile)],
        tainted: on,
    };
    set_cordon(ctx, name, &intent).await
}

/// Writes `intent` to Node `name` as the partition leader, while the lease
/// is held.
async fn set_cordon(ctx: &Context, name: &str, intent: &CordonIntent) -> Result<(), Error> {
    let writer = ctx.node_writer(name);
    guarded(
        ctx,
        name,
        writer.set_cordon(Concern::PartitionLeader, intent),
    )
    .await?
    .map_err(|e| node_error(name, e))?;
    Ok(())
}

/// Makes the Node's record `record` (none: removed).
async fn write_record(ctx: &Context, node: &Node, record: Option<&Record>) -> Result<(), Error> {
    let name = node.name_any();
    let writer = ctx.node_writer(&name);
    let intent = NodeIntent {
        annotations: record
            .map(|r| BTreeMap::from([(RECORD_ANNOTATION.to_owned(), r.to_json())]))
            .unwrap_or_default(),
        ..NodeIntent::default()
    };
    // `apply` reads the Node fresh: the removal needs the server's record
    // of who owns what, and the cache may lag this term's own writes.
    guarded(ctx, &name, writer.apply(Concern::PartitionLeader, &intent))
        .await?
        .map_err(|e| node_error(&name, e))?;
    Ok(())
}
