//! Rolling driver upgrades across the cluster: the per-node state machine and
//! the policy that picks which nodes go next. Pure: [`plan`] takes plain facts
//! about every selected node and returns what to do with each, and when to
//! look again. Carrying the decisions out (cordon, taint, drain, telling the
//! agent its target, writing `status.nodeModuleStatus` and the state label)
//! belongs to the caller.
//!
//! States use the reference operator's names ([`UpgradeState`]) so that its
//! dashboards and runbooks carry over. Per node:
//! 1. `Upgrade-Not-Started`: the node's driver differs from the target; it
//!    waits to be picked.
//! 2. `Upgrade-Started`: picked. Cordoned and tainted (whether a person had
//!    cordoned it before is recorded first), then drained.
//! 3. `Upgrade-In-Progress`: drained; the agent has its target and unloads
//!    and loads. Or `Reboot-In-Progress`, when the policy asks for a reboot
//!    or the in-box amdgpu runs (it goes only at a boot): the agent reboots,
//!    and once the boot id changes the node is `Upgrade-In-Progress` again
//!    while the agent loads the target.
//! 4. `Upgrade-Complete`: the agent reports the target version; uncordoned
//!    and untainted, unless a person had cordoned it.
//!
//! A node with no driver of ours yet installs without the policy
//! (`Install-In-Progress`, `Install-Complete`), as in the reference. Every
//! step has a timeout; a failure moves the node to its `*-Failed` state and the
//! others go on. A failed node is tried again only when a person labels it
//! `operator.amd.com/gpu-driver-upgrade-state=upgrade-required`.
//!
//! Picking follows `maxParallelUpgrades` (nodes in progress, 0 = no limit) and
//! `maxUnavailableNodes` (nodes unavailable: cordoned, not Ready or in
//! progress; a percentage of the selected nodes, rounded up). A node that is
//! not Ready, that someone else cordoned, whose agent has not reported, or
//! whose agent refuses the target, is not picked.
//!
//! This module must not do I/O or read the clock: the caller passes how long
//! each node has been in its state.
//!
//! This file holds what the planner reads and returns (the facts of a node,
//! the decisions, the plan); `policy.rs` the policy and its limits;
//! `pass.rs` the pass itself, one function per step.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::api::UpgradeState;

mod pass;
mod policy;

pub use crate::api::driver_upgrade::{RETRY_VALUE, STATE_LABEL, TAINT_KEY};
pub use pass::plan;
pub use policy::{MaxUnavailable, Policy, Timeouts};

pub use super::drain::DrainOutcome;

/// Everything the planner knows of one node.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NodeFacts {
    pub name: String,
    pub ready: bool,
    /// `spec.unschedulable`, whoever set it.
    pub unschedulable: bool,
    /// The cordon is this upgrade's own (see
    /// [`crate::api::driver_upgrade::UpgradeRecord::holds_cordon`]): it
    /// does not stop the node from being picked again after a retry.
    pub holds_cordon: bool,
    /// Recorded when the node was picked: a person had cordoned it already.
    /// `None` before the node was picked.
    pub cordoned_before: Option<bool>,
    pub tainted: bool,
    /// The state as last written (status, mirrored by the label).
    pub state: Option<UpgradeState>,
    /// How long the node has been in `state`, and since its upgrade began.
    pub in_state: Duration,
    pub in_upgrade: Duration,
    /// A person labelled the node [`RETRY_VALUE`].
    pub retry_requested: bool,
    /// The node's agent has reported its driver: without that, nothing is
    /// known of it and nothing is done to it.
    pub reported: bool,
    /// Some amdgpu is loaded, in-box or not.
    pub loaded: bool,
    /// The in-box amdgpu is loaded: replacing it takes a reboot.
    pub inbox: bool,
    /// Of which built into the kernel: it cannot be replaced at all.
    pub builtin: bool,
    /// The agent refused the target its record tells it, in the node's
    /// current step (no bundle verifies for its kernel, say): its reason
    /// and message. Waiting would not help.
    pub refused: Option<String>,
    /// The agent refuses the target version now, told or not (it looks at
    /// `driver.version` too): a node not picked yet is held back, rather
    /// than drained only to fail.
    pub refuses_target: Option<String>,
    /// The out-of-tree driver version the agent reports loaded (`None`:
    /// none, or only the in-box driver).
    pub version: Option<String>,
    /// The boot id the agent reports now.
    pub boot_id: Option<String>,
    /// The boot id recorded when the agent was told to reboot.
    pub boot_id_before: Option<String>,
    /// The target the agent was last told.
    pub told: Option<String>,
    pub drain: Option<DrainOutcome>,
    /// The reason the record gives now.
    pub reason: Option<String>,
}

/// What to do with one node now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Action {
    /// Record whether it was cordoned already, then cordon and taint.
    Cordon { was_cordoned: bool },
    /// Start (or keep running) the drain.
    Drain,
    /// Tell the agent its target; with `reboot`, to reboot into it.
    Tell { target: String, reboot: bool },
    /// Remove the taint, and the cordon unless a person had set it.
    Release { keep_cordon: bool },
    /// The cordon the upgrade held was lifted by someone else: it is no
    /// longer the upgrade's, and a cordon set later is theirs.
    ForgetCordon,
}

/// The decision for one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub node: String,
    /// The state to write, when it changes.
    pub state: Option<UpgradeState>,
    pub actions: Vec<Action>,
    /// Why, for the Event and the status.
    pub reason: Option<String>,
}

/// The decisions of one pass and when to look again (the nearest timeout).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub decisions: Vec<Decision>,
    pub wake_after: Option<Duration>,
    /// Nodes per state after this pass, for `gpu_operator_upgrade_nodes`.
    pub counts: BTreeMap<String, usize>,
}

/// The soonest a pass asks to look again: a limit just reached is acted on
/// by the next look, not by a burst of looks while the step's own end (a
/// drain giving up) is on its way.
pub const MIN_WAKE: Duration = Duration::from_secs(1);
/// How long past the drain policy's own timeout the planner waits for the
/// drain to give up by itself (and name what blocked it) before it fails
/// the node: after a change of leader the drain's own clock restarted.
pub const DRAIN_GRACE: Duration = Duration::from_secs(10);

fn in_progress(state: &Option<UpgradeState>) -> bool {
    state.as_ref().is_some_and(UpgradeState::is_in_progress)
}

fn failed(state: &Option<UpgradeState>) -> bool {
    state.as_ref().is_some_and(UpgradeState::is_failed)
}

impl NodeFacts {
    /// Cordoned by someone other than this upgrade: a person, or another tool.
    fn cordoned_by_someone_else(&self) -> bool {
        self.unschedulable && !self.holds_cordon
    }

    /// Counts against `maxUnavailableNodes` while in `state`: cordoned (a
    /// failed node the upgrade holds is), not Ready, or being upgraded. A
    /// failed node that still takes pods (one that failed before anything
    /// was done to it) does not.
    fn unavailable_in(&self, state: &Option<UpgradeState>) -> bool {
        self.unschedulable || !self.ready || in_progress(state)
    }
}
