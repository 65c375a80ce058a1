//! Test results in the reference's shapes: per-iteration results, the overall
//! outcome, the Event message and labels, and the running-state Node label.
//!
//! The Event message is the reference's JSON list of iterations:
//!
//! ```json
//! [{"number":1,"suitesResult":{"0":{"gpustress-3000-dgemm-false":"success"}},"status":"completed"}]
//! ```
//!
//! keyed by GPU index, then test action. Pure: no I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::config::{CATEGORY, Framework, Trigger};

/// Prefix of the Event labels.
pub const LABEL_PREFIX: &str = "testrunner.amd.com/";
/// `source.component` of the Events, as the reference writes it.
pub const EVENT_COMPONENT: &str = "amd-test-runner";
/// Value of the running-state Node label.
pub const RUNNING: &str = "running";
/// The action name used when a tool reported nothing for a GPU.
pub const NO_RESULT_ACTION: &str = "result";

/// What an Event says, before it becomes an object (that is
/// [`super::kube::result_event`]'s job).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventContent {
    pub type_: String,
    pub reason: String,
    pub message: String,
    pub labels: BTreeMap<String, String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActionResult {
    Success,
    Failure,
    Skipped,
    Queued,
    Cancelled,
    Timedout,
}

/// How an iteration ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum IterationStatus {
    #[serde(rename = "completed")]
    Completed,
    #[serde(rename = "timed_out")]
    TimedOut,
}

/// GPU index (as a string, like the reference) → action → result.
pub type SuitesResult = BTreeMap<String, BTreeMap<String, ActionResult>>;

/// One iteration of a test case.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IterationResult {
    pub number: u32,
    #[serde(rename = "suitesResult", default)]
    pub suites_result: SuitesResult,
    pub status: IterationStatus,
}

/// The overall result of a test case: the Event reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Outcome {
    Passed,
    Failed,
    TimedOut,
}

impl Outcome {
    /// The Event reason.
    pub fn reason(self) -> &'static str {
        match self {
            Outcome::Passed => "TestPassed",
            Outcome::Failed => "TestFailed",
            Outcome::TimedOut => "TestTimedOut",
        }
    }

    /// Exit status of `gpu-operator check`: 0 passed, 1 failed, 2 timed out.
    pub fn exit_code(self) -> i32 {
        match self {
            Outcome::Passed => 0,
            Outcome::Failed => 1,
            Outcome::TimedOut => 2,
        }
    }

    /// `Normal` for a pass, `Warning` otherwise, as the reference assigns them.
    pub fn event_type(self) -> &'static str {
        match self {
            Outcome::Passed => "Normal",
            _ => "Warning",
        }
    }
}

/// How a test process ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    Exited {
        success: bool,
    },
    TimedOut,
    /// The program could not be started (missing, not executable).
    NotStarted(String),
}

/// Builds an iteration's result from how the process ended and what the tool's
/// result file said (`parsed`, empty when there was none), for the GPUs tested.
///
/// As in the reference, an RVS or AGFHC run that leaves no results fails (the
/// test did not run, or its output could not be read), with a `result` action
/// per GPU so the failure is visible. A COMMAND test has no result file: its exit
/// status is its result, under the recipe's name.
pub fn iteration_result(
    number: u32,
    ending: &Ending,
    parsed: SuitesResult,
    framework: Framework,
    recipe: &str,
    gpu_indexes: &[u32],
) -> IterationResult {
    let each = |action: &str, result: ActionResult| -> SuitesResult {
        gpu_indexes
            .iter()
            .map(|i| (i.to_string(), [(action.to_owned(), result)].into()))
            .collect()
    };
    let (suites_result, status) = match ending {
        Ending::TimedOut => (
            if parsed.is_empty() {
                each(NO_RESULT_ACTION, ActionResult::Timedout)
            } else {
                parsed
            },
            IterationStatus::TimedOut,
        ),
        Ending::NotStarted(_) => (
            each(NO_RESULT_ACTION, ActionResult::Failure),
            IterationStatus::Completed,
        ),
        Ending::Exited { success } if framework == Framework::Command => (
            each(
                recipe,
                if *success {
                    ActionResult::Success
                } else {
                    ActionResult::Failure
                },
            ),
            IterationStatus::Completed,
        ),
        Ending::Exited { .. } if parsed.is_empty() => (
            each(NO_RESULT_ACTION, ActionResult::Failure),
            IterationStatus::Completed,
        ),
        Ending::Exited { .. } => (parsed, IterationStatus::Completed),
    };
    IterationResult {
        number,
        suites_result,
        status,
    }
}

/// True when the iteration failed or timed out: what stops a test case whose
/// `StopOnFailure` is set.
pub fn iteration_failed(iteration: &IterationResult) -> bool {
    iteration.status == IterationStatus::TimedOut
        || iteration.suites_result.is_empty()
        || actions(iteration).any(|r| r != ActionResult::Success)
}

fn actions(iteration: &IterationResult) -> impl Iterator<Item = ActionResult> + '_ {
    iteration
        .suites_result
        .values()
        .flat_map(|actions| actions.values().copied())
}

/// The overall outcome, by the reference's rule: any failed, skipped or queued
/// action (or an iteration with no result at all) fails the run; otherwise any
/// timeout makes it time out; otherwise it passed.
pub fn outcome(iterations: &[IterationResult]) -> Outcome {
    let failed = iterations.is_empty()
        || iterations.iter().any(|it| {
            (it.status == IterationStatus::Completed && it.suites_result.is_empty())
                || actions(it).any(|r| {
                    matches!(
                        r,
                        ActionResult::Failure | ActionResult::Skipped | ActionResult::Queued
                    )
                })
        });
    if failed {
        return Outcome::Failed;
    }
    let timed_out = iterations.iter().any(|it| {
        it.status == IterationStatus::TimedOut || actions(it).any(|r| r == ActionResult::Timedout)
    });
    if timed_out {
        Outcome::TimedOut
    } else {
        Outcome::Passed
    }
}

/// The iterations of a run that tested no GPU: one failed `detect_gpu` action
/// under `why`, as the reference reports a node without GPUs.
pub fn no_gpu_result(why: &str) -> Vec<IterationResult> {
    vec![IterationResult {
        number: 1,
        suites_result: [(
            why.to_owned(),
            [("detect_gpu".to_owned(), ActionResult::Failure)].into(),
        )]
        .into(),
        status: IterationStatus::Completed,
    }]
}

/// The Event message: the iterations as compact JSON.
pub fn event_message(iterations: &[IterationResult]) -> String {
    // A list of plain structs and string maps always serialises.
    serde_json::to_string(iterations).unwrap_or_else(|_| "[]".into())
}

/// A GPU as the labels name it: its index and, when known, its KFD id (the
/// topology `gpu_id`, which amd-smi calls `kfd_id`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuLabel {
    pub index: u32,
    pub kfd_id: Option<u64>,
}

/// The Event's labels, with the reference's keys: category, trigger, recipe,
/// hostname, framework, and per GPU `gpu.id.<index>=<kfd id>` and
/// `gpu.kfd.<kfd id>=<index>` (left out for a GPU whose KFD id is unknown).
pub fn event_labels(
    trigger: Trigger,
    recipe: &str,
    framework: Framework,
    hostname: &str,
    gpus: &[GpuLabel],
) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = [
        ("category", CATEGORY.to_ascii_lowercase()),
        ("trigger", trigger.label_value()),
        ("recipe", label_value(recipe)),
        ("hostname", label_value(hostname)),
        ("framework", framework.name().to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (format!("{LABEL_PREFIX}{k}"), v))
    .collect();
    for gpu in gpus {
        if let Some(kfd) = gpu.kfd_id {
            labels.insert(
                format!("{LABEL_PREFIX}gpu.id.{}", gpu.index),
                kfd.to_string(),
            );
            labels.insert(
                format!("{LABEL_PREFIX}gpu.kfd.{kfd}"),
                gpu.index.to_string(),
            );
        }
    }
    labels
}

/// The Node label set while `recipe` runs on GPU `index`, as the reference
/// names it: `testrunner.amd.com.gpu_health_check.<recipe>.gpu<index>`, lower
/// case. A label name holds at most 63 characters of `[a-z0-9._-]`, so `/` in a
/// recipe (`levels/rvs_level_1`) becomes `.` and a long recipe is shortened.
pub fn running_label_key(recipe: &str, index: u32) -> String {
    let prefix = format!("testrunner.amd.com.{}.", CATEGORY.to_ascii_lowercase());
    let suffix = format!(".gpu{index}");
    let room = 63usize.saturating_sub(prefix.len() + suffix.len());
    let recipe: String = recipe
        .to_ascii_lowercase()
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '_' | '-' | '.' => c,
            _ => '.',
        })
        .take(room)
        .collect();
    format!("{prefix}{recipe}{suffix}")
}

/// Makes `value` a valid label value: at most 63 characters of
/// `[A-Za-z0-9._-]`, starting and ending with an alphanumeric character; `/`
/// becomes `.` and anything else not allowed becomes `_`.
pub fn label_value(value: &str) -> String {
    let mapped: String = value
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | '-' | '.' => c,
            '/' => '.',
            _ => '_',
        })
        .take(63)
        .collect();
    mapped
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

/// A file name part for a recipe (`levels/rvs_level_1` → `levels.rvs_level_1`).
pub fn file_part(recipe: &str) -> String {
    recipe.replace('/', ".")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn it(
        number: u32,
        status: IterationStatus,
        results: &[(&str, &str, ActionResult)],
    ) -> IterationResult {
        let mut suites_result = SuitesResult::new();
        for (gpu, action, result) in results {
            suites_result
                .entry(gpu.to_string())
                .or_default()
                .insert(action.to_string(), *result);
        }
        IterationResult {
            number,
            suites_result,
            status,
        }
    }

    use ActionResult::*;
    use IterationStatus::*;

    #[test]
    fn message_has_the_reference_shape() {
        let iterations = vec![it(
            1,
            Completed,
            &[
                ("0", "gpustress-3000-dgemm-false", Success),
                ("0", "gst-8096-150000-fp16", Failure),
            ],
        )];
        assert_eq!(
            event_message(&iterations),
            r#"[{"number":1,"suitesResult":{"0":{"gpustress-3000-dgemm-false":"success","gst-8096-150000-fp16":"failure"}},"status":"completed"}]"#
        );
        let back: Vec<IterationResult> = serde_json::from_str(&event_message(&iterations)).unwrap();
        assert_eq!(back, iterations);
    }

    #[test]
    fn outcome_follows_the_reference_rule() {
        let pass = it(1, Completed, &[("0", "a", Success)]);
        let fail = it(2, Completed, &[("0", "a", Failure)]);
        let skipped = it(2, Completed, &[("0", "a", Skipped)]);
        let timeout = it(2, TimedOut, &[("0", "result", Timedout)]);
        let empty = it(2, Completed, &[]);
        assert_eq!(outcome(std::slice::from_ref(&pass)), Outcome::Passed);
        assert_eq!(outcome(&[pass.clone(), fail.clone()]), Outcome::Failed);
        assert_eq!(outcome(&[pass.clone(), skipped]), Outcome::Failed);
        assert_eq!(outcome(&[pass.clone(), timeout.clone()]), Outcome::TimedOut);
        // A failure anywhere wins over a timeout.
        assert_eq!(outcome(&[timeout.clone(), fail]), Outcome::Failed);
        assert_eq!(outcome(&[pass, empty]), Outcome::Failed);
        assert_eq!(outcome(&[]), Outcome::Failed);
        assert!(iteration_failed(&timeout));
    }

    #[test]
    fn iteration_results_by_ending() {
        let parsed: SuitesResult = [("1".to_owned(), [("gst".to_owned(), Success)].into())].into();
        let r = iteration_result(
            1,
            &Ending::Exited { success: true },
            parsed.clone(),
            Framework::Rvs,
            "gst_single",
            &[1],
        );
        assert_eq!(r.suites_result, parsed);
        assert!(!iteration_failed(&r));
        // RVS without a result file fails, whatever its exit status.
        let r = iteration_result(
            1,
            &Ending::Exited { success: true },
            SuitesResult::new(),
            Framework::Rvs,
            "gst_single",
            &[0, 1],
        );
        assert_eq!(r.suites_result["1"]["result"], Failure);
        assert_eq!(outcome(&[r]), Outcome::Failed);
        // COMMAND: the exit status is the result.
        let r = iteration_result(
            2,
            &Ending::Exited { success: false },
            SuitesResult::new(),
            Framework::Command,
            "smoke",
            &[3],
        );
        assert_eq!(r.number, 2);
        assert_eq!(r.suites_result["3"]["smoke"], Failure);
        let r = iteration_result(
            1,
            &Ending::Exited { success: true },
            SuitesResult::new(),
            Framework::Command,
            "smoke",
            &[3],
        );
        assert_eq!(outcome(&[r]), Outcome::Passed);
        let r = iteration_result(
            1,
            &Ending::TimedOut,
            SuitesResult::new(),
            Framework::Command,
            "smoke",
            &[0],
        );
        assert_eq!(r.status, TimedOut);
        assert_eq!(r.suites_result["0"]["result"], Timedout);
        assert_eq!(outcome(&[r]), Outcome::TimedOut);
        let r = iteration_result(
            1,
            &Ending::NotStarted("no such file".into()),
            SuitesResult::new(),
            Framework::Rvs,
            "x",
            &[0],
        );
        assert_eq!(outcome(&[r]), Outcome::Failed);
    }

    #[test]
    fn labels_use_the_reference_keys() {
        let labels = event_labels(
            Trigger::AutoUnhealthyGpuWatch,
            "gst_single",
            Framework::Rvs,
            "leto",
            &[
                GpuLabel {
                    index: 0,
                    kfd_id: Some(35824),
                },
                GpuLabel {
                    index: 1,
                    kfd_id: None,
                },
            ],
        );
        let expected: BTreeMap<String, String> = [
            ("testrunner.amd.com/category", "gpu_health_check"),
            ("testrunner.amd.com/trigger", "auto_unhealthy_gpu_watch"),
            ("testrunner.amd.com/recipe", "gst_single"),
            ("testrunner.amd.com/hostname", "leto"),
            ("testrunner.amd.com/framework", "RVS"),
            ("testrunner.amd.com/gpu.id.0", "35824"),
            ("testrunner.amd.com/gpu.kfd.35824", "0"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(labels, expected);
        assert_eq!(label_value("levels/rvs_level_1"), "levels.rvs_level_1");
        assert_eq!(label_value(&"n".repeat(80)).len(), 63);
        assert_eq!(label_value("-a b-"), "a_b");
    }

    #[test]
    fn running_label_keys_are_valid_label_names() {
        assert_eq!(
            running_label_key("gst_single", 3),
            "testrunner.amd.com.gpu_health_check.gst_single.gpu3"
        );
        assert_eq!(
            running_label_key("NPS4/CPX/gst_single", 0),
            "testrunner.amd.com.gpu_health_check.nps4.cpx.gst_single.gpu0"
        );
        let long = running_label_key(&"x".repeat(100), 12);
        assert_eq!(long.len(), 63, "{long}");
        assert!(long.ends_with(".gpu12"));
    }
}
