//! The leader's steps over a DeviceConfig's selected Nodes, in the order
//! they run: driver upgrades, partition changes, remediation. Each has one
//! shape: what a reconcile does and when it wants to be woken, what a spec
//! that fails validation stops, what a deletion releases, and the Node
//! record annotation whose changes must wake the leader. `reconcile`,
//! `tear_down` and [`super::node_relevance`] iterate [`STEPS`]; a new step
//! is a new variant, and the compiler asks for each of its arms.
//!
//! This module only dispatches: each step's work is its executor's
//! (`upgrader`, `partitioner`, `remediator`). It must not select Nodes or
//! write the DeviceConfig's status; `reconcile` does.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;

use super::context::{Context, Error};
use super::{partitioner, remediator, upgrader};
use crate::api::DeviceConfig;
use crate::api::agent_status::ConfigKey;

/// One of the leader's steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Rolling driver upgrades (`driver.upgradePolicy`).
    Upgrades,
    /// Partition changes (`configManager`).
    Partitions,
    /// Remediation of nodes whose mapped conditions are True.
    Remediation,
}

/// Every step, in the order a reconcile runs them.
pub const STEPS: [Step; 3] = [Step::Upgrades, Step::Partitions, Step::Remediation];

/// What a step's reconcile brings to the DeviceConfig's status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// When the step wants to look again (its nearest timeout).
    pub wake: Option<Duration>,
    /// Why it cannot work as asked.
    pub problems: Vec<String>,
    /// Remediation's mapping in force (the status condition's reason and
    /// message).
    pub remediation_mapping: Option<(&'static str, String)>,
}

impl Step {
    /// The Node annotation in which the step keeps its per-node record.
    pub fn record_annotation(self) -> &'static str {
        match self {
            Step::Upgrades => crate::api::driver_upgrade::RECORD_ANNOTATION,
            Step::Partitions => crate::partition::state::RECORD_ANNOTATION,
            Step::Remediation => crate::remediation::RECORD_ANNOTATION,
        }
    }

    /// Moves the step on for `dc` over its `nodes`.
    pub async fn reconcile(
        self,
        dc: &DeviceConfig,
        nodes: &[Arc<Node>],
        ctx: &Context,
    ) -> Result<Outcome, Error> {
        Ok(match self {
            Step::Upgrades => Outcome {
                wake: upgrader::reconcile(dc, nodes, ctx).await?,
                ..Outcome::default()
            },
            // With configManager off, a node still under a change is released.
            Step::Partitions => Outcome {
                wake: partitioner::reconcile(dc, nodes, ctx).await?,
                ..Outcome::default()
            },
            // With remediation off, a node still quarantined is released.
            Step::Remediation => {
                let summary = remediator::reconcile(dc, nodes, ctx).await?;
                Outcome {
                    wake: summary.wake,
                    problems: summary.problems,
                    remediation_mapping: summary.mapping,
                }
            }
        })
    }

    /// The spec fails validation: nothing moves, and no pod is evicted for
    /// it.
    pub fn hold(self, key: &ConfigKey, ctx: &Context) {
        match self {
            Step::Upgrades => ctx.drains.stop_all(key),
            // Their drains are the same registry's, stopped above; their
            // records stay until the spec is valid again.
            Step::Partitions | Step::Remediation => {}
        }
    }

    /// The DeviceConfig is being deleted: releases what the step holds of
    /// its `nodes` (drains, records, cordons, taints, counts).
    pub async fn tear_down(
        self,
        dc: &DeviceConfig,
        nodes: &[Arc<Node>],
        ctx: &Context,
    ) -> Result<(), Error> {
        match self {
            Step::Upgrades => upgrader::stop(&ConfigKey::of(dc), ctx).await,
            Step::Partitions => partitioner::release_all(nodes, ctx).await,
            Step::Remediation => remediator::release_all(dc, nodes, ctx).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_keeps_its_record_in_an_annotation_of_its_own() {
        let mut annotations: Vec<&str> = STEPS.iter().map(|s| s.record_annotation()).collect();
        annotations.sort_unstable();
        annotations.dedup();
        assert_eq!(annotations.len(), STEPS.len(), "{annotations:?}");
    }
}
