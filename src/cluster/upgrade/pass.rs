//! One planning pass over every selected node ([`plan`]): each node's step
//! in its state (an install; the pick within `maxParallelUpgrades` and
//! `maxUnavailableNodes`; the cordon and the drain; the load or the reboot)
//! and when to look again. Pure: it must not do I/O or read the clock, and
//! it carries nothing out (the caller does). The facts, decisions and
//! policy it works on are the parent's and `policy.rs`'s.

use std::time::Duration;

use super::{
    Action, DRAIN_GRACE, Decision, DrainOutcome, MIN_WAKE, NodeFacts, Plan, Policy, failed,
    in_progress,
};
use crate::api::UpgradeState;

/// Asks for a look again after `after` (at least [`MIN_WAKE`]), unless an
/// earlier one is due.
fn wake(plan: &mut Plan, after: Duration) {
    let after = after.max(MIN_WAKE);
    plan.wake_after = Some(plan.wake_after.map_or(after, |w| w.min(after)));
}

/// The agent's refusal of `target`, once it was told it. Pure.
fn refused(node: &NodeFacts, target: &str) -> Option<String> {
    node.refused
        .clone()
        .filter(|_| node.told.as_deref() == Some(target))
        .map(|why| format!("the agent refused driver {target}: {why}"))
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

/// A failed node a person asked to retry: it starts again from the
/// beginning.
fn retried(node: &NodeFacts) -> bool {
    failed(&node.state) && node.retry_requested
}

/// The state a node starts the pass in: `Upgrade-Not-Started` for a retry.
fn start_state(node: &NodeFacts) -> Option<UpgradeState> {
    if retried(node) {
        Some(UpgradeState::NotStarted)
    } else {
        node.state.clone()
    }
}

/// One pass over every selected node, for `target`.
pub fn plan(target: &str, policy: &Policy, nodes: &[NodeFacts]) -> Plan {
    // Nodes already moving, then the ones to pick; by name for a stable order.
    let mut order: Vec<&NodeFacts> = nodes.iter().collect();
    order.sort_by(|a, b| a.name.cmp(&b.name));
    let mut pass = Pass {
        target,
        policy,
        plan: Plan::default(),
        busy: nodes.iter().filter(|n| in_progress(&n.state)).count(),
        unavailable: nodes
            .iter()
            .filter(|n| n.unavailable_in(&start_state(n)))
            .count(),
        unavailable_cap: policy.max_unavailable.of(nodes.len()),
    };
    let mut next_states: Vec<Option<UpgradeState>> = Vec::with_capacity(order.len());
    for node in order {
        let mut turn = Turn::of(node, target);
        pass.step(&mut turn);
        next_states.push(pass.settle(turn));
    }
    for state in next_states.into_iter().flatten() {
        *pass
            .plan
            .counts
            .entry(state.as_str().to_owned())
            .or_default() += 1;
    }
    pass.plan
}

/// A pass in the making: what it is for, the counts the picking keeps as
/// nodes are picked, and the plan so far.
struct Pass<'a> {
    target: &'a str,
    policy: &'a Policy,
    plan: Plan,
    /// Nodes in progress, for `maxParallelUpgrades`.
    busy: usize,
    /// Nodes unavailable, for `maxUnavailableNodes`, and how many may be.
    unavailable: usize,
    unavailable_cap: usize,
}

/// One node's turn in a pass: its facts, the state it is to have, and what
/// to do with it.
struct Turn<'a> {
    node: &'a NodeFacts,
    /// The agent reports the target loaded.
    at_target: bool,
    state: Option<UpgradeState>,
    decision: Decision,
}

impl<'a> Turn<'a> {
    /// The node as the pass finds it (a retry back at the beginning).
    fn of(node: &'a NodeFacts, target: &str) -> Self {
        let mut decision = Decision {
            node: node.name.clone(),
            state: None,
            actions: Vec::new(),
            reason: None,
        };
        if retried(node) {
            decision.reason = Some("retry asked for by the upgrade-required label".into());
        }
        Self {
            node,
            at_target: node.version.as_deref() == Some(target),
            state: start_state(node),
            decision,
        }
    }
}

impl Pass<'_> {
    /// The node's step in its state.
    fn step(&mut self, turn: &mut Turn<'_>) {
        let (node, target) = (turn.node, self.target);
        match turn.state.clone() {
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
            ) if node.reported && !node.loaded && !node.holds_cordon => self.install(turn),
            Some(UpgradeState::InstallInProgress) => self.installing(turn),
            None | Some(UpgradeState::Complete | UpgradeState::InstallComplete)
                if !turn.at_target && node.reported =>
            {
                turn.state = Some(UpgradeState::NotStarted);
            }
            Some(UpgradeState::NotStarted) if turn.at_target => {
                turn.decision.actions.extend(release_if_held(node));
                turn.state = Some(UpgradeState::Complete);
            }
            // Failed, yet it runs the target and the upgrade holds nothing
            // of it (an install that got there after all): nothing is left
            // for a person to do.
            Some(s) if s.is_failed() && turn.at_target && !node.holds_cordon && !node.tainted => {
                turn.state = Some(UpgradeState::Complete);
                turn.decision.reason = Some(format!("runs driver {target}"));
            }
            Some(UpgradeState::NotStarted) => self.pick(turn),
            Some(UpgradeState::Started) => self.cordon_and_drain(turn),
            Some(UpgradeState::InProgress | UpgradeState::RebootInProgress) => {
                self.upgrading(turn);
            }
            _ => {}
        }
    }

    /// Ends a node's turn: its decision joins the plan when it says
    /// anything; returns the state the node is in after the pass.
    fn settle(&mut self, mut turn: Turn<'_>) -> Option<UpgradeState> {
        let node = turn.node;
        // A cordon the upgrade held on a node that waits (failed, or
        // retried and not picked yet) and that someone lifted is theirs now.
        let waiting = failed(&turn.state) || turn.state == Some(UpgradeState::NotStarted);
        if waiting && node.holds_cordon && !node.unschedulable && turn.decision.actions.is_empty() {
            turn.decision.actions.push(Action::ForgetCordon);
        }
        if turn.state != node.state {
            turn.decision.state = turn.state.clone();
        }
        let decision = turn.decision;
        if decision.state.is_some() || !decision.actions.is_empty() || decision.reason.is_some() {
            self.plan.decisions.push(decision);
        }
        turn.state
    }

    /// No amdgpu loaded: the agent is told the target, no drain.
    fn install(&mut self, turn: &mut Turn<'_>) {
        turn.decision.actions.push(Action::Tell {
            target: self.target.into(),
            reboot: false,
        });
        turn.state = Some(UpgradeState::InstallInProgress);
        wake(&mut self.plan, self.policy.timeouts.load);
    }

    /// `Install-In-Progress`: complete at the target; failed on a refusal
    /// or past the load's limit; else told (again) and waited for.
    fn installing(&mut self, turn: &mut Turn<'_>) {
        let (node, target, policy) = (turn.node, self.target, self.policy);
        if turn.at_target {
            turn.decision.actions.extend(release_if_held(node));
            turn.state = Some(UpgradeState::InstallComplete);
        } else if let Some(why) = refused(node, target) {
            turn.state = Some(UpgradeState::Failed);
            turn.decision.reason = Some(why);
        } else if node.in_state >= policy.timeouts.load {
            turn.state = Some(UpgradeState::Failed);
            turn.decision.reason = Some(format!(
                "the agent did not report driver {target} within {:?}",
                policy.timeouts.load
            ));
        } else {
            if node.told.as_deref() != Some(target) {
                turn.decision.actions.push(Action::Tell {
                    target: target.into(),
                    reboot: false,
                });
            }
            wake(
                &mut self.plan,
                policy.timeouts.load.saturating_sub(node.in_state),
            );
        }
    }

    /// `Upgrade-Not-Started`, not at the target: picked within both limits
    /// (cordoned next), held back saying why, or failed at once when its
    /// driver cannot be replaced.
    fn pick(&mut self, turn: &mut Turn<'_>) {
        let (node, target, policy) = (turn.node, self.target, self.policy);
        let unavailable_cap = self.unavailable_cap;
        let parallel_ok = policy.max_parallel == 0 || self.busy < policy.max_parallel;
        // Only a Ready node nobody else cordoned, whose agent has
        // reported, is picked. One this upgrade holds cordoned (a
        // retry) is unavailable already.
        let pickable = node.ready && node.reported && !node.cordoned_by_someone_else();
        let counted = node.unavailable_in(&turn.state);
        if let Some(why) = node.refuses_target.as_ref().filter(|_| pickable) {
            // It would be drained only to fail: held back, saying why.
            let reason = format!("not picked: the agent refuses driver {target}: {why}");
            if node.reason.as_deref() != Some(reason.as_str()) {
                turn.decision.reason = Some(reason);
            }
        } else if pickable && !(parallel_ok && (counted || self.unavailable < unavailable_cap)) {
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
                turn.decision.reason = Some(reason);
            }
        } else if pickable {
            if let Some(why) = cannot_replace(policy, node) {
                // Failed before anything is done to it: a person acts.
                turn.state = Some(UpgradeState::Failed);
                turn.decision.reason = Some(why);
                if !counted {
                    self.unavailable += 1;
                }
            } else {
                self.busy += 1;
                if !counted {
                    self.unavailable += 1;
                }
                turn.state = Some(UpgradeState::Started);
                turn.decision.actions.push(Action::Cordon {
                    was_cordoned: node.cordoned_before.unwrap_or(false),
                });
            }
        }
    }

    /// `Upgrade-Started`: cordoned and tainted, then drained; then the agent
    /// is told its target (to reboot into it, when it must). Each step has
    /// its limit, and the whole upgrade too.
    fn cordon_and_drain(&mut self, turn: &mut Turn<'_>) {
        let (node, target, policy) = (turn.node, self.target, self.policy);
        let started = node.unschedulable && node.tainted;
        let drain_limit = policy.timeouts.drain.map(|d| d + DRAIN_GRACE);
        match &node.drain {
            _ if node.in_upgrade >= policy.timeouts.upgrade => {
                turn.state = Some(UpgradeState::TimedOut);
                turn.decision.reason =
                    Some(format!("not done within {:?}", policy.timeouts.upgrade));
            }
            _ if !started && node.in_state >= policy.timeouts.cordon => {
                // Undo whatever part of the cordon did take: the
                // failed node is left as it was.
                turn.decision.actions.push(Action::Release {
                    keep_cordon: node
                        .cordoned_before
                        .unwrap_or(node.cordoned_by_someone_else()),
                });
                turn.state = Some(UpgradeState::CordonFailed);
                turn.decision.reason = Some(format!(
                    "the node was not cordoned within {:?}",
                    policy.timeouts.cordon
                ));
            }
            _ if !started => {
                turn.decision.actions.push(Action::Cordon {
                    was_cordoned: node
                        .cordoned_before
                        .unwrap_or(node.cordoned_by_someone_else()),
                });
                wake(
                    &mut self.plan,
                    policy.timeouts.cordon.saturating_sub(node.in_state),
                );
            }
            Some(DrainOutcome::Failed(why)) => {
                turn.state = Some(UpgradeState::DrainFailed);
                turn.decision.reason = Some(why.clone());
            }
            Some(DrainOutcome::Done) => {
                let reboot = wants_reboot(policy, node);
                turn.state = Some(if reboot {
                    UpgradeState::RebootInProgress
                } else {
                    UpgradeState::InProgress
                });
                turn.decision.actions.push(Action::Tell {
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
                turn.state = Some(UpgradeState::DrainFailed);
                turn.decision.reason = Some(format!(
                    "the drain did not finish within {:?}",
                    policy.timeouts.drain.unwrap_or_default()
                ));
            }
            None | Some(DrainOutcome::Running) => {
                turn.decision.actions.push(Action::Drain);
                if let Some(limit) = drain_limit {
                    wake(&mut self.plan, limit.saturating_sub(node.in_state));
                }
                wake(
                    &mut self.plan,
                    policy.timeouts.upgrade.saturating_sub(node.in_upgrade),
                );
            }
        }
    }

    /// `Upgrade-In-Progress` or `Reboot-In-Progress`: complete (released)
    /// at the target after any reboot asked for; failed on a refusal or past
    /// a limit; else back from the reboot, told again after a change of
    /// target, or waited for.
    fn upgrading(&mut self, turn: &mut Turn<'_>) {
        let (node, target, policy) = (turn.node, self.target, self.policy);
        let rebooting = turn.state == Some(UpgradeState::RebootInProgress);
        // The agent was told to reboot, and has: its boot id moved on.
        let asked_reboot = node.boot_id_before.is_some();
        let rebooted =
            asked_reboot && node.boot_id.is_some() && node.boot_id != node.boot_id_before;
        let limit = if rebooting {
            policy.timeouts.reboot
        } else {
            policy.timeouts.load
        };
        if turn.at_target && (!asked_reboot || rebooted) {
            turn.decision.actions.push(Action::Release {
                keep_cordon: node.cordoned_before.unwrap_or(false),
            });
            turn.state = Some(UpgradeState::Complete);
        } else if let Some(why) = refused(node, target) {
            turn.state = Some(UpgradeState::Failed);
            turn.decision.reason = Some(why);
        } else if node.in_upgrade >= policy.timeouts.upgrade {
            turn.state = Some(UpgradeState::TimedOut);
            turn.decision.reason = Some(format!("not done within {:?}", policy.timeouts.upgrade));
        } else if rebooting && rebooted {
            // Back from the reboot: the agent loads the target now,
            // with the load's own time limit.
            turn.state = Some(UpgradeState::InProgress);
            wake(&mut self.plan, policy.timeouts.load);
        } else if node.in_state >= limit {
            turn.state = Some(if rebooting {
                UpgradeState::RebootFailed
            } else {
                UpgradeState::Failed
            });
            turn.decision.reason = Some(if rebooting {
                format!("the node did not come back from its reboot within {limit:?}")
            } else {
                format!("the agent did not report driver {target} within {limit:?}")
            });
        } else {
            // A target changed mid-upgrade is told again; the node is
            // drained already and is not drained twice, nor rebooted
            // twice.
            if node.told.as_deref() != Some(target) {
                turn.decision.actions.push(Action::Tell {
                    target: target.into(),
                    reboot: wants_reboot(policy, node) && !rebooted,
                });
            } else if asked_reboot && !rebooting && !rebooted {
                turn.state = Some(UpgradeState::RebootInProgress);
            }
            wake(&mut self.plan, limit.saturating_sub(node.in_state));
            wake(
                &mut self.plan,
                policy.timeouts.upgrade.saturating_sub(node.in_upgrade),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::upgrade::{MaxUnavailable, Timeouts};

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
