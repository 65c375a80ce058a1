//! The remediation record: one Node annotation, written by the leader only,
//! that says how far the node's remediation got and which runs it had. It
//! is written before the step it announces, so that a new leader resumes
//! from it (no second drain, no second reboot), and it keeps the runs of the
//! last 72 hours for the recovery policy. Plain data; the decisions are in
//! [`super::plan`].

use serde::{Deserialize, Serialize};

use super::mapping::Entry;

/// The Node annotation that holds the record.
pub const RECORD_ANNOTATION: &str = "operator.amd.com/gpu-remediation";

/// Where a node's remediation stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// `autoStartWorkflow: false`: a person is to start it (force-resume).
    AwaitingApproval,
    /// `gpuResetFirst`: the agent is asked (`test` is the request) which one
    /// GPU is at fault and which pods hold it.
    IsolatingGpu,
    /// Quarantined; the pods holding the faulty GPU (`gpu_pods`) are being
    /// evicted, the others stay.
    DrainingGpu,
    /// The agent resets the GPU and tests that GPU only (`test`).
    ResettingGpu,
    /// Quarantined (taints, labels); its GPU pods are being drained.
    Draining,
    /// `physicalActionNeeded`: a person acts on the hardware, then sets the
    /// force-resume label.
    AwaitingPerson,
    /// The agent was asked to reboot from `reboot_from`.
    Rebooting,
    /// The agent runs the validation tests (`test`).
    Validating,
    /// The condition must stay False for a few checks.
    Confirming,
    /// A step failed; the node stays quarantined for a person.
    Failed,
    /// A person aborted it; the node stays quarantined.
    Aborted,
    /// The recovery policy's window is full; the node stays quarantined.
    Held,
}

impl Phase {
    /// Whether the run waits for a person and counts no more as running.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Failed | Self::Aborted | Self::Held)
    }

    /// The name shown in status, Events and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::AwaitingApproval => "AwaitingApproval",
            Self::IsolatingGpu => "IsolatingGpu",
            Self::DrainingGpu => "DrainingGpu",
            Self::ResettingGpu => "ResettingGpu",
            Self::Draining => "Draining",
            Self::AwaitingPerson => "AwaitingPerson",
            Self::Rebooting => "Rebooting",
            Self::Validating => "Validating",
            Self::Confirming => "Confirming",
            Self::Failed => "Failed",
            Self::Aborted => "Aborted",
            Self::Held => "Held",
        }
    }
}

/// The node's current remediation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    /// The Node condition it remediates.
    pub condition: String,
    pub phase: Phase,
    /// When it started, and when it entered its phase (RFC 3339).
    pub started: String,
    pub since: String,
    /// The mapping entry as it was when the run started: a new leader
    /// finishes the run the way it began even if the mapping changed.
    pub entry: Entry,
    /// Whether the taints and labels were put on the node.
    #[serde(default)]
    pub quarantined: bool,
    /// Asked to reboot while the node runs this boot id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reboot_from: Option<String>,
    /// The request the agent answers (isolating, resetting, validating),
    /// by this id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test: Option<String>,
    /// The GPU reset path's GPU (PCI address), as the agent isolated it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// The pods (`namespace/name`) that held that GPU: the only ones evicted
    /// before the reset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_pods: Vec<String>,
    /// Consecutive checks that found the condition False.
    #[serde(default)]
    pub checks: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_check: Option<String>,
    /// Why it failed, was held or aborted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Run {
    /// A run of `entry` beginning at `now` (RFC 3339) in `phase`.
    pub fn begin(entry: &Entry, phase: Phase, quarantined: bool, now: &str) -> Self {
        Self {
            condition: entry.node_condition.clone(),
            phase,
            started: now.to_owned(),
            since: now.to_owned(),
            entry: entry.clone(),
            quarantined,
            reboot_from: None,
            test: None,
            gpu: None,
            gpu_pods: Vec::new(),
            checks: 0,
            last_check: None,
            reason: None,
        }
    }
}

/// A run that started, for the recovery policy and the
/// RemediationWorkflowStatus.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    pub condition: String,
    /// RFC 3339.
    pub started: String,
    /// The run's name: `<node>-<workflowTemplate>-<start>`, as the
    /// reference names its workflows.
    pub name: String,
    /// It ended in success (confirmed and released): it still counts for
    /// the recovery policy, not for the circuit breaker, which guards
    /// against quarantining too many nodes at once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub healed: bool,
}

/// The whole annotation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<Run>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<Attempt>,
}

impl Record {
    /// Reads the annotation; an unreadable one counts as none (and is
    /// replaced at the next write), with a warning.
    pub fn parse(text: &str) -> Self {
        serde_json::from_str(text).unwrap_or_else(|error| {
            tracing::warn!(%error, "unreadable remediation record; starting afresh");
            Self::default()
        })
    }

    pub fn of_annotations(annotations: &std::collections::BTreeMap<String, String>) -> Self {
        annotations
            .get(RECORD_ANNOTATION)
            .map(|t| Self::parse(t))
            .unwrap_or_default()
    }

    /// The annotation text; `None` when there is nothing to keep.
    pub fn to_annotation(&self) -> Option<String> {
        (self.run.is_some() || !self.attempts.is_empty())
            .then(|| serde_json::to_string(self).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_an_empty_one_is_no_annotation() {
        let record = Record {
            run: Some(Run {
                since: "2026-12-02T10:01:00Z".into(),
                reboot_from: Some("boot-1".into()),
                ..Run::begin(
                    &Entry {
                        node_condition: "AMDGPUUnhealthy".into(),
                        ..Entry::default()
                    },
                    Phase::Rebooting,
                    true,
                    "2026-12-02T10:00:00Z",
                )
            }),
            attempts: vec![Attempt {
                condition: "AMDGPUUnhealthy".into(),
                started: "2026-12-02T10:00:00Z".into(),
                name: "n1-default-template-20261202100000".into(),
                healed: false,
            }],
        };
        let text = record.to_annotation().unwrap();
        assert_eq!(Record::parse(&text), record);
        assert_eq!(Record::default().to_annotation(), None);
        assert_eq!(Record::parse("{not json"), Record::default());
    }
}
