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

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;

use super::drain::DrainPolicy;
use crate::api::{DriverSpec, DriverUpgradePolicySpec, UpgradeState};

pub use crate::api::driver_upgrade::{RETRY_VALUE, STATE_LABEL, TAINT_KEY};

/// Step limits. The reboot wait and the whole-upgrade limit are the
/// reference's (60 minutes, 2 hours).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Timeouts {
    /// Cordoning (the write being accepted).
    pub cordon: Duration,
    /// Draining; `None` waits as long as the drain policy does.
    pub drain: Option<Duration>,
    /// The agent reporting the target version after it was told.
    pub load: Duration,
    /// The node coming back with a new boot id.
    pub reboot: Duration,
    /// The whole upgrade of one node.
    pub upgrade: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            cordon: Duration::from_secs(60),
            drain: Some(Duration::from_secs(300)),
            load: Duration::from_secs(600),
            reboot: Duration::from_secs(3600),
            upgrade: Duration::from_secs(2 * 3600),
        }
    }
}

/// The upgrade policy as the planner uses it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Policy {
    /// Nodes in progress at once; 0 is no limit.
    pub max_parallel: usize,
    pub max_unavailable: MaxUnavailable,
    pub reboot_required: bool,
    /// `driver.blacklist: true`: the in-box amdgpu does not come back at
    /// boot, so a reboot can replace it.
    pub blacklist: bool,
    pub timeouts: Timeouts,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum MaxUnavailable {
    Count(usize),
    /// Percent of the selected nodes, rounded up.
    Percent(u32),
}

impl MaxUnavailable {
    /// Reads `maxUnavailableNodes`: an integer, or a string `N%`. Anything
    /// else is an error for `validate` to report.
    pub fn parse(value: &IntOrString) -> Result<Self, String> {
        match value {
            IntOrString::Int(n) => usize::try_from(*n)
                .map(Self::Count)
                .map_err(|_| format!("maxUnavailableNodes must not be negative, got {n}")),
            IntOrString::String(text) => {
                let number = text.strip_suffix('%').unwrap_or(text);
                let parsed = number.trim().parse::<u32>().map_err(|_| {
                    format!("maxUnavailableNodes must be an integer or a percentage, got {text:?}")
                })?;
                Ok(if text.ends_with('%') {
                    Self::Percent(parsed.min(100))
                } else {
                    Self::Count(parsed as usize)
                })
            }
        }
    }

    /// How many nodes of `total` may be unavailable. At least one, so that
    /// an upgrade of a small cluster (25 % of 3 nodes) can start at all.
    pub fn of(&self, total: usize) -> usize {
        let n = match self {
            Self::Count(n) => *n,
            Self::Percent(p) => (total * *p as usize).div_ceil(100),
        };
        n.max(1)
    }
}

impl Policy {
    /// The policy the `driver` section asks for (the API's defaults where
    /// unset), with the step limits of `timeouts` but the drain's own from
    /// the drain policy. Only planned while `upgradePolicy.enable` is true.
    pub fn of_spec(driver: &DriverSpec, timeouts: Timeouts) -> Self {
        let default = DriverUpgradePolicySpec::default();
        let spec = driver.upgrade_policy.as_ref().unwrap_or(&default);
        Self {
            blacklist: driver.blacklist == Some(true),
            max_parallel: usize::try_from(spec.max_parallel_upgrades).unwrap_or(0),
            max_unavailable: MaxUnavailable::parse(&spec.max_unavailable_nodes)
                .unwrap_or(MaxUnavailable::Percent(25)),
            reboot_required: spec.reboot_required,
            timeouts: Timeouts {
                drain: DrainPolicy::of_upgrade(spec).timeout,
                ..timeouts
            },
        }
    }
}

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

/// Asks for a look again after `after` (at least [`MIN_WAKE`]), unless an
/// earlier one is due.
fn wake(plan: &mut Plan, after: Duration) {
    let after = after.max(MIN_WAKE);
    plan.wake_after = Some(plan.wake_after.map_or(after, |w| w.min(after)));
}

fn in_progress(state: &Option<UpgradeState>) -> bool {
    state.as_ref().is_some_and(UpgradeState::is_in_progress)
}

fn failed(state: &Option<UpgradeState>) -> bool {
    state.as_ref().is_some_and(UpgradeState::is_failed)
}

/// The agent's refusal of `target`, once it was told it. Pure.
fn refused(node: &NodeFacts, target: &str) -> Option<String> {
    node.refused
        .clone()
        .filter(|_| node.told.as_deref() == Some(target))
        .map(|why| format!("the agent refused driver {target}: {why}"))
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

/// Whether the node reboots into the target: the policy asks for it, or
/// the in-box amdgpu runs there, which goes only at a boot (blacklisted).
fn wants_reboot(policy: &Policy, node: &NodeFacts) -> bool {
    policy.reboot_required || node.inbox
}

/// Why the node cannot be upgraded at all, if so: its driver cannot be
/// replaced, whatever is done to it.
fn cannot_replace(policy: &Policy, node: &NodeFacts) -> Option<String> {
    if node.builtin {
        Some(
            "amdgpu is built into this node's kernel and cannot be replaced; boot a kernel \
             that has it as a module"
                .to_owned(),
        )
    } else if node.inbox && !policy.blacklist {
        Some(
            "the in-box amdgpu runs and would load again at the reboot that replaces it; \
             set driver.blacklist: true"
                .to_owned(),
        )
    } else {
        None
    }
}

/// The release of a node that leaves its upgrade for good (complete), when
/// the upgrade holds its cordon or its taint is still there.
fn release_if_held(node: &NodeFacts) -> Option<Action> {
    (node.holds_cordon || node.tainted).then(|| Action::Release {
        keep_cordon: node.cordoned_before.unwrap_or(false) || !node.holds_cordon,
    })
}

/// One pass over every selected node, for `target`.
pub fn plan(target: &str, policy: &Policy, nodes: &[NodeFacts]) -> Plan {
    let mut plan = Plan::default();
    // Nodes already moving, then the ones to pick; by name for a stable order.
    let mut order: Vec<&NodeFacts> = nodes.iter().collect();
    order.sort_by(|a, b| a.name.cmp(&b.name));
    // A failed node a person asked to retry starts again from the beginning.
    let retried = |n: &NodeFacts| failed(&n.state) && n.retry_requested;
    let start_state = |n: &NodeFacts| {
        if retried(n) {
            Some(UpgradeState::NotStarted)
        } else {
            n.state.clone()
        }
    };
    let mut busy = nodes.iter().filter(|n| in_progress(&n.state)).count();
    let mut unavailable = nodes
        .iter()
        .filter(|n| n.unavailable_in(&start_state(n)))
        .count();
    let unavailable_cap = policy.max_unavailable.of(nodes.len());
    let mut next_states: Vec<Option<UpgradeState>> = Vec::with_capacity(order.len());
    for node in order {
        let mut decision = Decision {
            node: node.name.clone(),
            state: None,
            actions: Vec::new(),
            reason: None,
        };
        let at_target = node.version.as_deref() == Some(target);
        let mut state = start_state(node);
        if retried(node) {
            decision.reason = Some("retry asked for by the upgrade-required label".into());
        }
        match state.clone() {
            // Through an upgrade or install, its driver gone for now (a
            // remediation's reboot, a person's): with no amdgpu loaded the
            // agent loads driver.version by itself, no drain needed (a
            // first install needs none either). Nothing to relabel, pick or
            // drain; the node's AMDGPUDriverReady says how the load goes.
            Some(UpgradeState::Complete | UpgradeState::InstallComplete)
                if node.reported && !node.loaded => {}
            // No amdgpu loaded at all: an install, without the policy and
            // without a drain (nothing can use the GPUs), as in the
            // reference. Also a node already through an upgrade whose
            // driver is gone (an unrelated reboot, say).
            None
            | Some(
                UpgradeState::NotStarted | UpgradeState::Complete | UpgradeState::InstallComplete,
            ) if node.reported && !node.loaded && !node.holds_cordon => {
                decision.actions.push(Action::Tell {
                    target: target.into(),
                    reboot: false,
                });
                state = Some(UpgradeState::InstallInProgress);
                wake(&mut plan, policy.timeouts.load);
            }
            Some(UpgradeState::InstallInProgress) => {
                if at_target {
                    decision.actions.extend(release_if_held(node));
                    state = Some(UpgradeState::InstallComplete);
                } else if let Some(why) = refused(node, target) {
                    state = Some(UpgradeState::Failed);
                    decision.reason = Some(why);
                } else if node.in_state >= policy.timeouts.load {
                    state = Some(UpgradeState::Failed);
                    decision.reason = Some(format!(
                        "the agent did not report driver {target} within {:?}",
                        policy.timeouts.load
                    ));
                } else {
                    if node.told.as_deref() != Some(target) {
                        decision.actions.push(Action::Tell {
                            target: target.into(),
                            reboot: false,
                        });
                    }
                    wake(
                        &mut plan,
                        policy.timeouts.load.saturating_sub(node.in_state),
                    );
                }
            }
            None | Some(UpgradeState::Complete | UpgradeState::InstallComplete)
                if !at_target && node.reported =>
            {
                state = Some(UpgradeState::NotStarted);
            }
            Some(UpgradeState::NotStarted) if at_target => {
                decision.actions.extend(release_if_held(node));
                state = Some(UpgradeState::Complete);
            }
            // Failed, yet it runs the target and the upgrade holds nothing
            // of it (an install that got there after all): nothing is left
            // for a person to do.
            Some(s) if s.is_failed() && at_target && !node.holds_cordon && !node.tainted => {
                state = Some(UpgradeState::Complete);
                decision.reason = Some(format!("runs driver {target}"));
            }
            Some(UpgradeState::NotStarted) => {
                let parallel_ok = policy.max_parallel == 0 || busy < policy.max_parallel;
                // Only a Ready node nobody else cordoned, whose agent has
                // reported, is picked. One this upgrade holds cordoned (a
                // retry) is unavailable already.
                let pickable = node.ready && node.reported && !node.cordoned_by_someone_else();
                let counted = node.unavailable_in(&state);
                if let Some(why) = node.refuses_target.as_ref().filter(|_| pickable) {
                    // It would be drained only to fail: held back, saying why.
                    let reason = format!("not picked: the agent refuses driver {target}: {why}");
                    if node.reason.as_deref() != Some(reason.as_str()) {
                        decision.reason = Some(reason);
                    }
                } else if pickable && !(parallel_ok && (counted || unavailable < unavailable_cap)) {
                    // It waits for room: say which limit holds it, in
                    // words that do not change with the count, so that the
                    // record is written once per wait.
                    let reason = if parallel_ok {
                        format!(
                            "not picked yet: maxUnavailableNodes allows {unavailable_cap} node(s) \
                             unavailable at once, and {unavailable_cap} already are (cordoned, \
                             not Ready or being upgraded)"
                        )
                    } else {
                        format!(
                            "not picked yet: maxParallelUpgrades allows {0} upgrade(s) at once, \
                             and {0} are under way",
                            policy.max_parallel
                        )
                    };
                    if node.reason.as_deref() != Some(reason.as_str()) {
                        decision.reason = Some(reason);
                    }
                } else if pickable {
                    if let Some(why) = cannot_replace(policy, node) {
                        // Failed before anything is done to it: a person acts.
                        state = Some(UpgradeState::Failed);
                        decision.reason = Some(why);
                        if !counted {
                            unavailable += 1;
                        }
                    } else {
                        busy += 1;
                        if !counted {
                            unavailable += 1;
                        }
                        state = Some(UpgradeState::Started);
                        decision.actions.push(Action::Cordon {
                            was_cordoned: node.cordoned_before.unwrap_or(false),
                        });
                    }
                }
            }
            Some(UpgradeState::Started) => {
                let started = node.unschedulable && node.tainted;
                let drain_limit = policy.timeouts.drain.map(|d| d + DRAIN_GRACE);
                match &node.drain {
                    _ if node.in_upgrade >= policy.timeouts.upgrade => {
                        state = Some(UpgradeState::TimedOut);
                        decision.reason =
                            Some(format!("not done within {:?}", policy.timeouts.upgrade));
                    }
                    _ if !started && node.in_state >= policy.timeouts.cordon => {
                        // Undo whatever part of the cordon did take: the
                        // failed node is left as it was.
                        decision.actions.push(Action::Release {
                            keep_cordon: node
                                .cordoned_before
                                .unwrap_or(node.cordoned_by_someone_else()),
                        });
                        state = Some(UpgradeState::CordonFailed);
                        decision.reason = Some(format!(
                            "the node was not cordoned within {:?}",
                            policy.timeouts.cordon
                        ));
                    }
                    _ if !started => {
                        decision.actions.push(Action::Cordon {
                            was_cordoned: node
                                .cordoned_before
                                .unwrap_or(node.cordoned_by_someone_else()),
                        });
                        wake(
                            &mut plan,
                            policy.timeouts.cordon.saturating_sub(node.in_state),
                        );
                    }
                    Some(DrainOutcome::Failed(why)) => {
                        state = Some(UpgradeState::DrainFailed);
                        decision.reason = Some(why.clone());
                    }
                    Some(DrainOutcome::Done) => {
                        let reboot = wants_reboot(policy, node);
                        state = Some(if reboot {
                            UpgradeState::RebootInProgress
                        } else {
                            UpgradeState::InProgress
                        });
                        decision.actions.push(Action::Tell {
                            target: target.into(),
                            reboot,
                        });
                    }
                    // Only a drain of this term: after a change of leader
                    // the drain runs again first (on an emptied node it ends
                    // at once), bounded by its own limit.
                    Some(DrainOutcome::Running)
                        if drain_limit.is_some_and(|limit| node.in_state >= limit) =>
                    {
                        state = Some(UpgradeState::DrainFailed);
                        decision.reason = Some(format!(
                            "the drain did not finish within {:?}",
                            policy.timeouts.drain.unwrap_or_default()
                        ));
                    }
                    None | Some(DrainOutcome::Running) => {
                        decision.actions.push(Action::Drain);
                        if let Some(limit) = drain_limit {
                            wake(&mut plan, limit.saturating_sub(node.in_state));
                        }
                        wake(
                            &mut plan,
                            policy.timeouts.upgrade.saturating_sub(node.in_upgrade),
                        );
                    }
                }
            }
            Some(UpgradeState::InProgress | UpgradeState::RebootInProgress) => {
                let rebooting = state == Some(UpgradeState::RebootInProgress);
                // The agent was told to reboot, and has: its boot id moved on.
                let asked_reboot = node.boot_id_before.is_some();
                let rebooted =
                    asked_reboot && node.boot_id.is_some() && node.boot_id != node.boot_id_before;
                let limit = if rebooting {
                    policy.timeouts.reboot
                } else {
                    policy.timeouts.load
                };
                if at_target && (!asked_reboot || rebooted) {
                    decision.actions.push(Action::Release {
                        keep_cordon: node.cordoned_before.unwrap_or(false),
                    });
                    state = Some(UpgradeState::Complete);
                } else if let Some(why) = refused(node, target) {
                    state = Some(UpgradeState::Failed);
                    decision.reason = Some(why);
                } else if node.in_upgrade >= policy.timeouts.upgrade {
                    state = Some(UpgradeState::TimedOut);
                    decision.reason =
                        Some(format!("not done within {:?}", policy.timeouts.upgrade));
                } else if rebooting && rebooted {
                    // Back from the reboot: the agent loads the target now,
                    // with the load's own time limit.
                    state = Some(UpgradeState::InProgress);
                    wake(&mut plan, policy.timeouts.load);
                } else if node.in_state >= limit {
                    state = Some(if rebooting {
                        UpgradeState::RebootFailed
                    } else {
                        UpgradeState::Failed
                    });
                    decision.reason = Some(if rebooting {
                        format!("the node did not come back from its reboot within {limit:?}")
                    } else {
                        format!("the agent did not report driver {target} within {limit:?}")
                    });
                } else {
                    // A target changed mid-upgrade is told again; the node is
                    // drained already and is not drained twice, nor rebooted
                    // twice.
                    if node.told.as_deref() != Some(target) {
                        decision.actions.push(Action::Tell {
                            target: target.into(),
                            reboot: wants_reboot(policy, node) && !rebooted,
                        });
                    } else if asked_reboot && !rebooting && !rebooted {
                        state = Some(UpgradeState::RebootInProgress);
                    }
                    wake(&mut plan, limit.saturating_sub(node.in_state));
                    wake(
                        &mut plan,
                        policy.timeouts.upgrade.saturating_sub(node.in_upgrade),
                    );
                }
            }
            _ => {}
        }
        // A cordon the upgrade held on a node that waits (failed, or
        // retried and not picked yet) and that someone lifted is theirs now.
        let waiting = failed(&state) || state == Some(UpgradeState::NotStarted);
        if waiting && node.holds_cordon && !node.unschedulable && decision.actions.is_empty() {
            decision.actions.push(Action::ForgetCordon);
        }
        if state != node.state {
            decision.state = state.clone();
        }
        next_states.push(state);
        if decision.state.is_some() || !decision.actions.is_empty() || decision.reason.is_some() {
            plan.decisions.push(decision);
        }
    }
    for state in next_states.into_iter().flatten() {
        *plan.counts.entry(state.as_str().to_owned()).or_default() += 1;
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    const TARGET: &str = "6.4.1";

    fn node(name: &str, state: Option<UpgradeState>, version: &str) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            ready: true,
            state,
            version: Some(version.into()),
            reported: true,
            loaded: true,
            boot_id: Some("boot-1".into()),
            ..NodeFacts::default()
        }
    }

    fn policy(max_parallel: usize, max_unavailable: MaxUnavailable) -> Policy {
        Policy {
            max_parallel,
            max_unavailable,
            reboot_required: false,
            blacklist: true,
            timeouts: Timeouts::default(),
        }
    }

    fn states(plan: &Plan) -> Vec<(String, Option<UpgradeState>)> {
        plan.decisions
            .iter()
            .map(|d| (d.node.clone(), d.state.clone()))
            .collect()
    }

    /// The nodes whose state changes.
    fn moved(plan: &Plan) -> Vec<(String, Option<UpgradeState>)> {
        states(plan)
            .into_iter()
            .filter(|(_, s)| s.is_some())
            .collect()
    }

    /// The nodes that wait to be picked, and the reason each gives.
    fn waiting_reasons(plan: &Plan) -> Vec<(String, String)> {
        plan.decisions
            .iter()
            .filter(|d| d.state.is_none())
            .filter_map(|d| Some((d.node.clone(), d.reason.clone()?)))
            .collect()
    }

    #[test]
    fn max_unavailable_reads_counts_and_rounds_percentages_up() {
        let parse = |v: IntOrString| MaxUnavailable::parse(&v);
        assert_eq!(parse(IntOrString::Int(2)), Ok(MaxUnavailable::Count(2)));
        assert_eq!(
            parse(IntOrString::String("25%".into())),
            Ok(MaxUnavailable::Percent(25))
        );
        assert_eq!(
            parse(IntOrString::String("3".into())),
            Ok(MaxUnavailable::Count(3))
        );
        assert!(parse(IntOrString::Int(-1)).is_err());
        assert!(parse(IntOrString::String("a quarter".into())).is_err());
        assert_eq!(MaxUnavailable::Percent(25).of(5), 2);
        assert_eq!(MaxUnavailable::Percent(25).of(1000), 250);
        assert_eq!(MaxUnavailable::Percent(1).of(3), 1);
        assert_eq!(MaxUnavailable::Count(0).of(10), 1);
        // No upgradePolicy fields set: the API's defaults.
        let unset = Policy::of_spec(&DriverSpec::default(), Timeouts::default());
        assert!(!unset.blacklist);
        assert_eq!(unset.max_parallel, 1);
        assert_eq!(unset.max_unavailable, MaxUnavailable::Percent(25));
        assert!(unset.reboot_required);
        // The drain's limit is the drain policy's (300 s by default).
        assert_eq!(unset.timeouts.drain, Some(Duration::from_secs(300)));
    }

    #[test]
    fn a_version_change_moves_every_node_to_not_started_then_picks_within_both_limits() {
        let nodes: Vec<NodeFacts> = (1..=5)
            .map(|i| node(&format!("n{i}"), Some(UpgradeState::Complete), "6.3.0"))
            .collect();
        let p = policy(2, MaxUnavailable::Count(3));
        let first = plan(TARGET, &p, &nodes);
        assert!(
            states(&first)
                .iter()
                .all(|(_, s)| *s == Some(UpgradeState::NotStarted))
        );
        let waiting: Vec<NodeFacts> = nodes
            .iter()
            .map(|n| NodeFacts {
                state: Some(UpgradeState::NotStarted),
                ..n.clone()
            })
            .collect();
        let second = plan(TARGET, &p, &waiting);
        // The others wait, and their records say for which limit.
        let waits = waiting_reasons(&second);
        assert_eq!(
            waits.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["n3", "n4", "n5"]
        );
        assert!(
            waits
                .iter()
                .all(|(_, why)| why.contains("maxParallelUpgrades allows 2")),
            "{waits:?}"
        );
        assert_eq!(
            moved(&second),
            [
                ("n1".into(), Some(UpgradeState::Started)),
                ("n2".into(), Some(UpgradeState::Started)),
            ]
        );
        assert_eq!(
            second.decisions[0].actions,
            [Action::Cordon {
                was_cordoned: false
            }]
        );
        // A cordoned node (a person's) and a failed one the upgrade holds
        // cordoned count as unavailable: with 3 allowed, only one more may
        // start.
        let mut busy = waiting.clone();
        busy[0].unschedulable = true;
        busy[1].state = Some(UpgradeState::DrainFailed);
        busy[1].unschedulable = true;
        busy[1].holds_cordon = true;
        busy[1].cordoned_before = Some(false);
        let third = plan(TARGET, &policy(0, MaxUnavailable::Count(3)), &busy);
        assert_eq!(moved(&third), [("n3".into(), Some(UpgradeState::Started))]);
        let waits = waiting_reasons(&third);
        assert!(
            !waits.is_empty()
                && waits
                    .iter()
                    .all(|(_, why)| why.contains("maxUnavailableNodes allows 3")),
            "{waits:?}"
        );
        // A wait already recorded is not written again.
        let mut recorded = busy.clone();
        for node in &mut recorded {
            if let Some((_, why)) = waits.iter().find(|(n, _)| *n == node.name) {
                node.reason = Some(why.clone());
            }
        }
        let again = plan(TARGET, &policy(0, MaxUnavailable::Count(3)), &recorded);
        assert!(waiting_reasons(&again).is_empty(), "{:?}", again.decisions);
        // A failed node that still takes pods (it failed before anything was
        // done to it) does not count.
        busy[1].unschedulable = false;
        busy[1].holds_cordon = false;
        busy[1].cordoned_before = None;
        let fourth = plan(TARGET, &policy(0, MaxUnavailable::Count(3)), &busy);
        assert_eq!(
            moved(&fourth),
            [
                ("n3".into(), Some(UpgradeState::Started)),
                ("n4".into(), Some(UpgradeState::Started)),
            ]
        );
    }

    #[test]
    fn a_node_that_is_not_ready_or_cordoned_by_a_person_is_not_picked() {
        let mut nodes = vec![
            node("a", Some(UpgradeState::NotStarted), "6.3.0"),
            node("b", Some(UpgradeState::NotStarted), "6.3.0"),
            node("c", Some(UpgradeState::NotStarted), "6.3.0"),
        ];
        nodes[0].ready = false;
        nodes[1].unschedulable = true;
        let plan = plan(TARGET, &policy(0, MaxUnavailable::Percent(100)), &nodes);
        assert_eq!(states(&plan), [("c".into(), Some(UpgradeState::Started))]);
    }

    #[test]
    fn a_node_goes_cordon_drain_tell_release_and_keeps_a_persons_cordon() {
        let p = policy(1, MaxUnavailable::Count(1));
        let mut n = node("a", Some(UpgradeState::Started), "6.3.0");
        n.cordoned_before = Some(true);
        // Not yet cordoned by us: cordon (again), remembering the person's.
        let step = plan(TARGET, &p, std::slice::from_ref(&n));
        assert_eq!(
            step.decisions[0].actions,
            [Action::Cordon { was_cordoned: true }]
        );
        n.unschedulable = true;
        n.tainted = true;
        let step = plan(TARGET, &p, std::slice::from_ref(&n));
        assert_eq!(step.decisions[0].actions, [Action::Drain]);
        // The drain's limit, and the grace for it to say why it gave up.
        assert_eq!(
            step.wake_after,
            Some(Duration::from_secs(300) + DRAIN_GRACE)
        );
        n.drain = Some(DrainOutcome::Done);
        let step = plan(TARGET, &p, std::slice::from_ref(&n));
        assert_eq!(step.decisions[0].state, Some(UpgradeState::InProgress));
        assert_eq!(
            step.decisions[0].actions,
            [Action::Tell {
                target: TARGET.into(),
                reboot: false
            }]
        );
        n.state = Some(UpgradeState::InProgress);
        n.told = Some(TARGET.into());
        n.version = Some(TARGET.into());
        let step = plan(TARGET, &p, std::slice::from_ref(&n));
        assert_eq!(step.decisions[0].state, Some(UpgradeState::Complete));
        assert_eq!(
            step.decisions[0].actions,
            [Action::Release { keep_cordon: true }]
        );
    }

    #[test]
    fn a_reboot_completes_on_a_new_boot_id_and_fails_after_its_timeout() {
        let mut p = policy(1, MaxUnavailable::Count(1));
        p.reboot_required = true;
        let mut n = node("a", Some(UpgradeState::InProgress), "6.3.0");
        n.told = Some(TARGET.into());
        n.boot_id_before = Some("boot-1".into());
        let step = plan(TARGET, &p, std::slice::from_ref(&n));
        assert_eq!(
            step.decisions[0].state,
            Some(UpgradeState::RebootInProgress)
        );
        n.state = Some(UpgradeState::RebootInProgress);
        // The version alone is not enough: the node must have rebooted.
        n.version = Some(TARGET.into());
        assert!(
            plan(TARGET, &p, std::slice::from_ref(&n))
                .decisions
                .is_empty()
        );
        n.boot_id = Some("boot-2".into());
        let step = plan(TARGET, &p, std::slice::from_ref(&n));
        assert_eq!(step.decisions[0].state, Some(UpgradeState::Complete));
        // Back from the reboot without the target loaded yet: loading, with
        // the load's time limit.
        let mut back = n.clone();
        back.version = None;
        let step = plan(TARGET, &p, std::slice::from_ref(&back));
        assert_eq!(step.decisions[0].state, Some(UpgradeState::InProgress));
        back.state = Some(UpgradeState::InProgress);
        assert!(
            plan(TARGET, &p, std::slice::from_ref(&back))
                .decisions
                .is_empty(),
            "not rebooted twice"
        );
        // One that never comes back.
        let mut lost = node("b", Some(UpgradeState::RebootInProgress), "6.3.0");
        lost.told = Some(TARGET.into());
        lost.boot_id_before = Some("boot-1".into());
        lost.in_state = p.timeouts.reboot;
        let step = plan(TARGET, &p, &[lost]);
        assert_eq!(step.decisions[0].state, Some(UpgradeState::RebootFailed));
        assert!(
            step.decisions[0]
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("reboot"))
        );
    }

    #[test]
    fn the_in_box_driver_is_replaced_through_a_reboot_whatever_the_policy() {
        let mut p = policy(1, MaxUnavailable::Count(1));
        p.reboot_required = false;
        let mut n = node("a", Some(UpgradeState::Started), "unused");
        n.version = None;
        n.inbox = true;
        n.unschedulable = true;
        n.tainted = true;
        n.drain = Some(DrainOutcome::Done);
        let step = plan(TARGET, &p, std::slice::from_ref(&n));
        assert_eq!(
            step.decisions[0].actions,
            [Action::Tell {
                target: TARGET.into(),
                reboot: true
            }]
        );
        assert_eq!(
            step.decisions[0].state,
            Some(UpgradeState::RebootInProgress)
        );
        // Not a first install either: the in-box driver may be in use.
        let mut inbox = node("b", None, "unused");
        inbox.version = None;
        inbox.inbox = true;
        let step = plan(TARGET, &p, std::slice::from_ref(&inbox));
        assert_eq!(step.decisions[0].state, Some(UpgradeState::NotStarted));
    }

    #[test]
    fn a_node_that_leaves_for_good_is_released_whatever_path_it_took() {
        let p = policy(1, MaxUnavailable::Count(1));
        // Reboot-Failed, yet it came back on the target; a person retries.
        let mut back = node("a", Some(UpgradeState::RebootFailed), TARGET);
        back.retry_requested = true;
        back.unschedulable = true;
        back.tainted = true;
        back.holds_cordon = true;
        back.cordoned_before = Some(false);
        let step = plan(TARGET, &p, std::slice::from_ref(&back));
        assert_eq!(step.decisions[0].state, Some(UpgradeState::Complete));
        assert_eq!(
            step.decisions[0].actions,
            [Action::Release { keep_cordon: false }]
        );
        // A retried node left waiting (the parallel limit) is still the
        // upgrade's to release later: not "cordoned by someone else".
        let mut busy = node("b", Some(UpgradeState::InProgress), "6.3.0");
        busy.told = Some(TARGET.into());
        let mut waiting = back.clone();
        waiting.version = Some("6.3.0".into());
        waiting.name = "c".into();
        let step = plan(TARGET, &p, &[busy, waiting.clone()]);
        assert_eq!(
            states(&step),
            [("c".into(), Some(UpgradeState::NotStarted))]
        );
        assert!(!waiting.cordoned_by_someone_else());
    }

    #[test]
    fn a_cordon_that_does_not_take_is_undone_and_drains_and_upgrades_keep_their_limits() {
        let p = policy(1, MaxUnavailable::Count(1));
        let mut n = node("a", Some(UpgradeState::Started), "6.3.0");
        n.cordoned_before = Some(false);
        n.tainted = true;
        n.in_state = p.timeouts.cordon;
        let step = plan(TARGET, &p, std::slice::from_ref(&n));
        assert_eq!(step.decisions[0].state, Some(UpgradeState::CordonFailed));
        assert_eq!(
            step.decisions[0].actions,
            [Action::Release { keep_cordon: false }],
            "the taint that did take goes"
        );
        // A drain past its limit (and the grace for it to say why) fails
        // from the record's clock, whoever leads.
        let mut draining = node("b", Some(UpgradeState::Started), "6.3.0");
        draining.unschedulable = true;
        draining.tainted = true;
        draining.drain = Some(DrainOutcome::Running);
        draining.in_state = Duration::from_secs(100);
        let step = plan(TARGET, &p, std::slice::from_ref(&draining));
        assert_eq!(step.decisions[0].actions, [Action::Drain]);
        assert_eq!(
            step.wake_after,
            Some(Duration::from_secs(300) + DRAIN_GRACE - Duration::from_secs(100))
        );
        draining.in_state = Duration::from_secs(300) + DRAIN_GRACE;
        let step = plan(TARGET, &p, std::slice::from_ref(&draining));
        assert_eq!(step.decisions[0].state, Some(UpgradeState::DrainFailed));
        // No drain of this term yet (a new leader): the drain runs again
        // first, rather than the node failing without one.
        draining.drain = None;
        let step = plan(TARGET, &p, std::slice::from_ref(&draining));
        assert_eq!(step.decisions[0].actions, [Action::Drain]);
        assert_eq!(step.decisions[0].state, None);
        // The whole upgrade's limit holds while draining too.
        draining.in_state = Duration::ZERO;
        draining.in_upgrade = p.timeouts.upgrade;
        let step = plan(TARGET, &p, std::slice::from_ref(&draining));
        assert_eq!(step.decisions[0].state, Some(UpgradeState::TimedOut));
        // A limit reached but not yet acted on never asks for a burst of
        // looks.
        let mut cordoning = node("c", Some(UpgradeState::Started), "6.3.0");
        cordoning.in_state = p.timeouts.cordon - Duration::from_millis(1);
        assert_eq!(
            plan(TARGET, &p, std::slice::from_ref(&cordoning)).wake_after,
            Some(MIN_WAKE)
        );
    }

    #[test]
    fn a_driver_that_cannot_be_replaced_or_a_refused_target_fails_at_once() {
        let mut p = policy(0, MaxUnavailable::Percent(100));
        let mut builtin = node("a", Some(UpgradeState::NotStarted), "x");
        builtin.version = None;
        builtin.inbox = true;
        builtin.builtin = true;
        let mut inbox = node("b", Some(UpgradeState::NotStarted), "x");
        inbox.version = None;
        inbox.inbox = true;
        p.blacklist = false;
        let step = plan(TARGET, &p, &[builtin, inbox]);
        assert_eq!(
            states(&step),
            [
                ("a".into(), Some(UpgradeState::Failed)),
                ("b".into(), Some(UpgradeState::Failed)),
            ]
        );
        assert!(
            step.decisions[0].actions.is_empty(),
            "nothing is done to it"
        );
        assert!(
            step.decisions[1]
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("blacklist"))
        );
        // The agent refused the target (no bundle for its kernel): failed
        // now, not at the load's time limit.
        let mut told = node("c", Some(UpgradeState::RebootInProgress), "6.3.0");
        told.told = Some(TARGET.into());
        told.boot_id_before = Some("boot-1".into());
        told.refused = Some("BundleMissingForKernel: no bundle".into());
        let step = plan(TARGET, &p, std::slice::from_ref(&told));
        assert_eq!(step.decisions[0].state, Some(UpgradeState::Failed));
        assert!(
            step.decisions[0]
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("BundleMissingForKernel"))
        );
        // A refusal of an earlier target does not count.
        told.told = Some("6.4.0".into());
        let step = plan(TARGET, &p, std::slice::from_ref(&told));
        assert_ne!(step.decisions[0].state, Some(UpgradeState::Failed));
    }

    #[test]
    fn a_node_whose_agent_refuses_the_target_is_not_picked_and_says_why() {
        let p = policy(0, MaxUnavailable::Percent(100));
        let mut n = node("a", Some(UpgradeState::NotStarted), "6.3.0");
        n.refuses_target = Some("BundleMissingForKernel: none for 6.8.0".into());
        let step = plan(TARGET, &p, std::slice::from_ref(&n));
        assert_eq!(step.decisions[0].state, None, "not picked");
        assert!(step.decisions[0].actions.is_empty());
        let reason = step.decisions[0].reason.clone().unwrap();
        assert!(reason.contains("BundleMissingForKernel"), "{reason}");
        // Said once: no write while nothing changes.
        n.reason = Some(reason);
        assert!(
            plan(TARGET, &p, std::slice::from_ref(&n))
                .decisions
                .is_empty()
        );
        // A node whose agent has not reported is not picked either.
        let mut silent = node("b", Some(UpgradeState::NotStarted), "6.3.0");
        silent.reported = false;
        assert!(
            plan(TARGET, &p, std::slice::from_ref(&silent))
                .decisions
                .is_empty()
        );
    }

    #[test]
    fn a_held_cordon_someone_lifts_is_theirs_after() {
        let p = policy(1, MaxUnavailable::Count(1));
        let mut n = node("a", Some(UpgradeState::DrainFailed), "6.3.0");
        n.holds_cordon = true;
        n.cordoned_before = Some(false);
        n.tainted = true;
        // A person uncordoned the failed node.
        let step = plan(TARGET, &p, std::slice::from_ref(&n));
        assert_eq!(step.decisions[0].actions, [Action::ForgetCordon]);
        // Still cordoned by the upgrade: nothing to say.
        n.unschedulable = true;
        assert!(
            plan(TARGET, &p, std::slice::from_ref(&n))
                .decisions
                .is_empty()
        );
        // Failed, yet it runs the target and nothing of it is held: done.
        let mut there = node("b", Some(UpgradeState::Failed), TARGET);
        there.told = Some(TARGET.into());
        let step = plan(TARGET, &p, std::slice::from_ref(&there));
        assert_eq!(step.decisions[0].state, Some(UpgradeState::Complete));
    }

    #[test]
    fn a_failed_node_stays_failed_until_a_person_asks_for_a_retry() {
        let p = policy(0, MaxUnavailable::Percent(100));
        let mut n = node("a", Some(UpgradeState::DrainFailed), "6.3.0");
        assert!(
            plan(TARGET, &p, std::slice::from_ref(&n))
                .decisions
                .is_empty()
        );
        n.retry_requested = true;
        let step = plan(TARGET, &p, std::slice::from_ref(&n));
        // Reset and picked in the same pass.
        assert_eq!(step.decisions[0].state, Some(UpgradeState::Started));
    }

    #[test]
    fn a_retried_node_the_upgrade_holds_cordoned_is_picked_again_without_a_second_count() {
        // Two nodes allowed unavailable: one failed node still cordoned by
        // the upgrade, retried, and one waiting. Both may go.
        let p = policy(0, MaxUnavailable::Count(2));
        let mut failed = node("a", Some(UpgradeState::DrainFailed), "6.3.0");
        failed.unschedulable = true;
        failed.tainted = true;
        failed.holds_cordon = true;
        failed.cordoned_before = Some(false);
        failed.retry_requested = true;
        let waiting = node("b", Some(UpgradeState::NotStarted), "6.3.0");
        let step = plan(TARGET, &p, &[failed.clone(), waiting.clone()]);
        assert_eq!(
            states(&step),
            [
                ("a".into(), Some(UpgradeState::Started)),
                ("b".into(), Some(UpgradeState::Started)),
            ]
        );
        assert_eq!(
            step.decisions[0].actions,
            [Action::Cordon {
                was_cordoned: false
            }],
            "the cordon stays the upgrade's own"
        );
        // A person's cordon on the same failed node keeps it out.
        let mut persons = failed;
        persons.holds_cordon = false;
        let step = plan(TARGET, &p, &[persons, waiting]);
        assert_eq!(
            states(&step),
            [
                ("a".into(), Some(UpgradeState::NotStarted)),
                ("b".into(), Some(UpgradeState::Started)),
            ]
        );
    }

    #[test]
    fn a_target_changed_mid_upgrade_is_told_again_without_a_second_drain() {
        let p = policy(1, MaxUnavailable::Count(1));
        let mut n = node("a", Some(UpgradeState::InProgress), "6.3.0");
        n.told = Some("6.4.0".into());
        let step = plan(TARGET, &p, std::slice::from_ref(&n));
        assert_eq!(
            step.decisions[0].actions,
            [Action::Tell {
                target: TARGET.into(),
                reboot: false
            }]
        );
        assert_eq!(step.decisions[0].state, None);
    }

    #[test]
    fn a_first_install_needs_no_policy_and_an_up_to_date_node_nothing() {
        // No room for a single upgrade: an install goes on regardless.
        let mut p = policy(1, MaxUnavailable::Count(1));
        p.max_parallel = 1;
        let fresh = NodeFacts {
            name: "new".into(),
            ready: true,
            reported: true,
            ..NodeFacts::default()
        };
        // A node whose agent has not reported yet is left alone: it may run
        // a driver that pods use.
        let unknown = NodeFacts {
            name: "unknown".into(),
            ready: true,
            ..NodeFacts::default()
        };
        assert!(plan(TARGET, &p, &[unknown]).decisions.is_empty());
        let current = node("done", Some(UpgradeState::Complete), TARGET);
        let mut busy = node("busy", Some(UpgradeState::InProgress), "6.3.0");
        busy.told = Some(TARGET.into());
        let step = plan(TARGET, &p, &[fresh, current, busy]);
        assert_eq!(
            states(&step),
            [("new".into(), Some(UpgradeState::InstallInProgress))]
        );
        assert_eq!(step.counts.get("Upgrade-Complete"), Some(&1));
        // A node through an earlier upgrade whose driver is gone after a
        // reboot for another reason (a remediation, a person), whether or
        // not its record still names the target: its agent loads
        // driver.version by itself; the node is neither relabelled
        // Install-In-Progress nor counted as upgrading, nor drained.
        let mut gone = node("gone", Some(UpgradeState::Complete), "x");
        gone.loaded = false;
        gone.version = None;
        let mut rebooted = node("rebooted", Some(UpgradeState::InstallComplete), "x");
        rebooted.loaded = false;
        rebooted.version = None;
        rebooted.told = Some(TARGET.into());
        let step = plan(TARGET, &p, &[gone, rebooted]);
        assert!(
            step.decisions
                .iter()
                .all(|d| d.state.is_none() && d.actions.is_empty()),
            "{:?}",
            step.decisions
        );
        assert_eq!(step.counts.get("Upgrade-Complete"), Some(&1));
        assert_eq!(step.counts.get("Install-Complete"), Some(&1));
    }

    #[test]
    fn timeouts_fail_the_step_and_the_nearest_one_is_the_wake_up() {
        let p = policy(0, MaxUnavailable::Percent(100));
        let mut slow = node("slow", Some(UpgradeState::InProgress), "6.3.0");
        slow.told = Some(TARGET.into());
        slow.in_state = Duration::from_secs(590);
        let mut stuck = node("stuck", Some(UpgradeState::InProgress), "6.3.0");
        stuck.told = Some(TARGET.into());
        stuck.in_state = Duration::from_secs(100);
        stuck.in_upgrade = p.timeouts.upgrade;
        let step = plan(TARGET, &p, &[slow, stuck]);
        assert_eq!(step.wake_after, Some(Duration::from_secs(10)));
        assert_eq!(
            states(&step),
            [("stuck".into(), Some(UpgradeState::TimedOut))]
        );
    }

    /// Carries out a plan as the cluster would, instantly: the executor's
    /// job, reduced to what the facts show afterwards.
    fn carry_out(plan: &Plan, nodes: &mut [NodeFacts]) {
        for d in &plan.decisions {
            let n = nodes
                .iter_mut()
                .find(|n| n.name == d.node)
                .expect("planned node");
            if let Some(state) = &d.state {
                n.state = Some(state.clone());
                n.in_state = Duration::ZERO;
            }
            for action in &d.actions {
                match action {
                    Action::Cordon { was_cordoned } => {
                        n.cordoned_before.get_or_insert(*was_cordoned);
                        n.holds_cordon = !*was_cordoned;
                        n.unschedulable = true;
                        n.tainted = true;
                    }
                    Action::Drain => n.drain = Some(DrainOutcome::Done),
                    Action::Tell { target, .. } => {
                        n.told = Some(target.clone());
                        n.version = Some(target.clone());
                    }
                    Action::Release { keep_cordon } => {
                        n.unschedulable = *keep_cordon;
                        n.holds_cordon = false;
                        n.tainted = false;
                        n.drain = None;
                    }
                    Action::ForgetCordon => {
                        n.holds_cordon = false;
                        n.cordoned_before = None;
                    }
                }
            }
        }
    }

    #[test]
    fn a_rolling_upgrade_of_five_nodes_never_has_more_than_two_in_progress() {
        let p = policy(2, MaxUnavailable::Count(2));
        let mut nodes: Vec<NodeFacts> = (1..=5)
            .map(|i| node(&format!("n{i}"), Some(UpgradeState::Complete), "6.3.0"))
            .collect();
        let mut most = 0;
        for _pass in 0..50 {
            let step = plan(TARGET, &p, &nodes);
            carry_out(&step, &mut nodes);
            let busy = nodes.iter().filter(|n| in_progress(&n.state)).count();
            let unavailable = nodes
                .iter()
                .filter(|n| n.unschedulable || in_progress(&n.state))
                .count();
            assert!(busy <= 2, "{busy} in progress");
            assert!(unavailable <= 2, "{unavailable} unavailable");
            most = most.max(busy);
            if step.decisions.is_empty() {
                break;
            }
        }
        assert_eq!(most, 2, "the two allowed were used");
        for n in &nodes {
            assert_eq!(n.state, Some(UpgradeState::Complete), "{}", n.name);
            assert_eq!(n.version.as_deref(), Some(TARGET));
            assert!(!n.unschedulable && !n.tainted, "{} released", n.name);
        }
    }
}
