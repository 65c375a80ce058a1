//! The partition change of a node, as the Node shows it, and the next step of
//! each side. Pure.
//!
//! Three keys on the Node, each with one writer:
//! - [`PROFILE_LABEL`](super::PROFILE_LABEL): a person's (or a tool's) choice;
//! - [`STATE_LABEL`](super::STATE_LABEL): the agent's, derived by
//!   [`agent_step`] from the profile, the node's GPUs and the leader's record:
//!   `pending` (checked, waiting for the drain), `draining`, `applying`,
//!   `success` or `failed`;
//! - [`RECORD_ANNOTATION`]: the leader's [`Record`] of its part: which
//!   profile it drains for, whether a person had cordoned the node before,
//!   and whether the drain is under way, done or failed. Written before the
//!   step it announces, so that a new leader resumes from it (a drained
//!   node is not drained again) and never leaves a cordon nobody owns.
//!
//! The flow: the agent checks the profile against the GPUs (`failed` with the
//! reason if it does not fit, `success` if the node already runs it,
//! `pending` otherwise); the leader records, cordons and drains ([`leader_step`]);
//! once the record says drained the agent writes the modes (`applying`), and
//! says `success` or `failed`; on `success` the leader lifts its cordon and
//! drops its record. On `failed` the node stays cordoned. Removing the
//! profile label releases the node; setting it again starts over.

use serde::{Deserialize, Serialize};

use super::plan::Plan;

/// The leader's record of its part in a node's change.
pub const RECORD_ANNOTATION: &str = "dcm.amd.com/gpu-config-profile-drain";
/// The taint the leader puts on the node while it changes (with its cordon).
pub const TAINT_KEY: &str = "dcm.amd.com/gpu-config-profile-change";
/// The reference's taint of a node being repartitioned (`amd-dcm=up`,
/// NoExecute), which its runbooks have people tolerate in kube-system and
/// its operands tolerate. The leader adds it once its own drain is done (so
/// that the drain, not the taint, moves the GPU pods, respecting their
/// budgets) and lifts it with the rest; a node that already carries it (a
/// person's, as the reference's docs have them set it) is left as it is.
pub const REFERENCE_TAINT_KEY: &str = "amd-dcm";
pub const REFERENCE_TAINT_VALUE: &str = "up";

/// The agent's state label values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Pending,
    Draining,
    Applying,
    Success,
    Failed,
}

impl State {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Draining => "draining",
            Self::Applying => "applying",
            Self::Success => "success",
            Self::Failed => "failed",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        [
            Self::Pending,
            Self::Draining,
            Self::Applying,
            Self::Success,
            Self::Failed,
        ]
        .into_iter()
        .find(|s| s.as_str() == value)
    }
}

/// Where the leader's drain stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    Draining,
    Drained,
    Failed,
}

/// The leader's record, as JSON in [`RECORD_ANNOTATION`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub profile: String,
    pub phase: Phase,
    /// The node was cordoned before the change: its cordon is a person's,
    /// and stays.
    pub person_cordoned: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The leader put the reference's `amd-dcm` taint on (it was not there
    /// before): it lifts it at the release, and only then.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reference_taint: bool,
}

impl Record {
    pub fn parse(value: &str) -> Option<Self> {
        serde_json::from_str(value).ok()
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// What the agent does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentStep {
    /// No profile asked for: no state label.
    Clear,
    /// Show this state (with why, for `failed`).
    Show(State, Option<String>),
    /// Write the modes now (show `applying` first).
    Apply(Plan),
}

/// The agent's next step for the profile `label` names, given the plan of
/// that profile against the node's GPUs (`Err` with why it does not fit, or
/// why the profile cannot be read), the leader's record, and the failure the
/// agent last had for this profile, if any.
pub fn agent_step(
    label: Option<&str>,
    plan: Result<&Plan, &str>,
    record: Option<&Record>,
    failed: Option<(&str, &str)>,
) -> AgentStep {
    let Some(profile) = label else {
        return AgentStep::Clear;
    };
    let plan = match plan {
        Ok(plan) => plan,
        Err(why) => return AgentStep::Show(State::Failed, Some(why.to_owned())),
    };
    if let Some((failed_profile, why)) = failed
        && failed_profile == profile
    {
        return AgentStep::Show(State::Failed, Some(why.to_owned()));
    }
    if plan.is_done() {
        return AgentStep::Show(State::Success, None);
    }
    match record.filter(|r| r.profile == profile).map(|r| r.phase) {
        Some(Phase::Drained) => AgentStep::Apply(plan.clone()),
        Some(Phase::Draining) => AgentStep::Show(State::Draining, None),
        Some(Phase::Failed) => {
            AgentStep::Show(State::Failed, record.and_then(|r| r.reason.clone()))
        }
        None => AgentStep::Show(State::Pending, None),
    }
}

/// What the leader does next for a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaderStep {
    Nothing,
    /// Record (`draining`, and whether a person had cordoned it), cordon,
    /// then drain.
    Start {
        person_cordoned: bool,
    },
    /// Keep (or resume) the drain the record announces.
    Drain,
    /// Lift the cordon (unless it is a person's) and drop the record.
    Release {
        uncordon: bool,
    },
}

/// The leader's next step, from the profile label, the agent's state, the
/// leader's record, whether the node is cordoned, and whether another change
/// holds the node (a driver upgrade under way or failed): a partition
/// change does not start then, and waits.
pub fn leader_step(
    label: Option<&str>,
    state: Option<State>,
    record: Option<&Record>,
    cordoned: bool,
    held_by_another_change: bool,
) -> LeaderStep {
    let Some(record) = record else {
        return match (label, state) {
            (Some(_), Some(State::Pending)) if held_by_another_change => LeaderStep::Nothing,
            (Some(_), Some(State::Pending)) => LeaderStep::Start {
                person_cordoned: cordoned,
            },
            _ => LeaderStep::Nothing,
        };
    };
    let release = LeaderStep::Release {
        uncordon: !record.person_cordoned,
    };
    let Some(profile) = label else {
        return release;
    };
    if profile != record.profile {
        // Another profile while one was under way: the node is ours and
        // cordoned already; start over for the new one once the agent
        // checked it.
        return match state {
            Some(State::Pending) => LeaderStep::Start {
                person_cordoned: record.person_cordoned,
            },
            Some(State::Success) => release,
            _ => LeaderStep::Nothing,
        };
    }
    match (state, record.phase) {
        (Some(State::Success), _) => release,
        (_, Phase::Draining) => LeaderStep::Drain,
        _ => LeaderStep::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::plan::Assignment;

    fn plan(changes: bool) -> Plan {
        Plan {
            assignments: vec![Assignment {
                index: 0,
                bdf: "0000:05:00.0".into(),
                compute: "CPX".into(),
                memory: "NPS4".into(),
                current_compute: if changes { "SPX" } else { "CPX" }.into(),
                current_memory: if changes { "NPS1" } else { "NPS4" }.into(),
            }],
            skipped: vec![],
        }
    }

    fn record(profile: &str, phase: Phase, person: bool) -> Record {
        Record {
            profile: profile.into(),
            phase,
            person_cordoned: person,
            reason: (phase == Phase::Failed).then(|| "a budget refused".into()),
            reference_taint: false,
        }
    }

    #[test]
    fn the_agent_walks_pending_draining_applying_success() {
        let p = plan(true);
        let cpx = Some("cpx");
        assert_eq!(agent_step(None, Ok(&p), None, None), AgentStep::Clear);
        assert_eq!(
            agent_step(cpx, Ok(&p), None, None),
            AgentStep::Show(State::Pending, None)
        );
        let draining = record("cpx", Phase::Draining, false);
        assert_eq!(
            agent_step(cpx, Ok(&p), Some(&draining), None),
            AgentStep::Show(State::Draining, None)
        );
        let drained = record("cpx", Phase::Drained, false);
        assert_eq!(
            agent_step(cpx, Ok(&p), Some(&drained), None),
            AgentStep::Apply(p.clone())
        );
        // Applied: the plan has nothing left to change.
        assert_eq!(
            agent_step(cpx, Ok(&plan(false)), Some(&drained), None),
            AgentStep::Show(State::Success, None)
        );
        // A record for another profile does not count.
        let other = record("default", Phase::Drained, false);
        assert_eq!(
            agent_step(cpx, Ok(&p), Some(&other), None),
            AgentStep::Show(State::Pending, None)
        );
    }

    #[test]
    fn the_agent_says_failed_for_a_bad_profile_its_own_failure_or_the_drains() {
        let p = plan(true);
        assert_eq!(
            agent_step(Some("x"), Err("no GPUs"), None, None),
            AgentStep::Show(State::Failed, Some("no GPUs".into()))
        );
        let drained = record("cpx", Phase::Drained, false);
        assert_eq!(
            agent_step(Some("cpx"), Ok(&p), Some(&drained), Some(("cpx", "EINVAL"))),
            AgentStep::Show(State::Failed, Some("EINVAL".into()))
        );
        // A failure of another profile is not this one's.
        assert_eq!(
            agent_step(Some("cpx"), Ok(&p), Some(&drained), Some(("qpx", "EINVAL"))),
            AgentStep::Apply(p.clone())
        );
        let failed = record("cpx", Phase::Failed, false);
        assert_eq!(
            agent_step(Some("cpx"), Ok(&p), Some(&failed), None),
            AgentStep::Show(State::Failed, Some("a budget refused".into()))
        );
    }

    #[test]
    fn the_leader_starts_drains_waits_and_releases_only_its_own_cordon() {
        use LeaderStep::*;
        let (cpx, pending) = (Some("cpx"), Some(State::Pending));
        assert_eq!(leader_step(cpx, None, None, false, false), Nothing);
        assert_eq!(
            leader_step(cpx, Some(State::Failed), None, false, false),
            Nothing
        );
        // A driver upgrade holds the node: the change waits for it.
        assert_eq!(leader_step(cpx, pending, None, false, true), Nothing);
        assert_eq!(
            leader_step(cpx, pending, None, true, false),
            Start {
                person_cordoned: true
            }
        );
        let draining = record("cpx", Phase::Draining, false);
        assert_eq!(
            leader_step(cpx, Some(State::Draining), Some(&draining), true, false),
            Drain
        );
        let drained = record("cpx", Phase::Drained, false);
        // A new leader finding the drain done waits for the agent: no
        // second drain.
        assert_eq!(
            leader_step(cpx, Some(State::Applying), Some(&drained), true, false),
            Nothing
        );
        assert_eq!(
            leader_step(cpx, Some(State::Success), Some(&drained), true, false),
            Release { uncordon: true }
        );
        let persons = record("cpx", Phase::Drained, true);
        assert_eq!(
            leader_step(cpx, Some(State::Success), Some(&persons), true, false),
            Release { uncordon: false }
        );
        // A failure holds the node cordoned.
        assert_eq!(
            leader_step(cpx, Some(State::Failed), Some(&drained), true, false),
            Nothing
        );
        // The label removed: released.
        assert_eq!(
            leader_step(None, None, Some(&drained), true, false),
            Release { uncordon: true }
        );
        // Another profile: started over once the agent checked it.
        assert_eq!(
            leader_step(Some("qpx"), pending, Some(&persons), true, false),
            Start {
                person_cordoned: true
            }
        );
        assert_eq!(
            leader_step(
                Some("qpx"),
                Some(State::Failed),
                Some(&drained),
                true,
                false
            ),
            Nothing
        );
    }

    #[test]
    fn records_and_states_round_trip() {
        let r = record("cpx", Phase::Failed, true);
        assert_eq!(Record::parse(&r.to_json()), Some(r));
        assert_eq!(Record::parse("{"), None);
        for s in ["pending", "draining", "applying", "success", "failed"] {
            assert_eq!(State::parse(s).map(State::as_str), Some(s));
        }
        assert_eq!(State::parse("failure"), None);
    }
}
