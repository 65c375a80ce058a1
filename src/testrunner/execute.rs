//! Running one test case on its GPUs: the iterations, stop-on-failure, the log
//! files, and the result.
//!
//! Log files go to the logs directory (`testRunner.logsLocation.hostPath`), named
//! like the reference's (`<time>_<trigger>_<recipe>_<what>`), uncompressed:
//! `..._iteration<N>_stdout.log` and `..._stderr.log` per iteration (the test's
//! own output, streamed to the file while it runs), and `..._result.json` with
//! the outcome, the command line and the iteration results.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::command::{CommandLine, Commands, command_line, read_results, rvs_conf};
use super::config::{Framework, TestCase, Trigger};
use super::gpus::TargetGpu;
use super::kube::EventContent;
use super::process::{self, ProcessEnd};
use super::report::{
    Ending, IterationResult, Outcome, SuitesResult, event_labels, event_message, file_part,
    iteration_failed, iteration_result, no_gpu_result, outcome,
};

/// How much of a test's stdout is searched for its result file: tools print the
/// path at the end.
const STDOUT_TAIL_BYTES: u64 = 1024 * 1024;

/// The result of one test case.
#[derive(Clone, Debug, PartialEq)]
pub struct CaseReport {
    pub trigger: Trigger,
    pub case: TestCase,
    /// The GPUs tested, in index order; empty when none could be.
    pub gpus: Vec<TargetGpu>,
    /// The command line of the iterations; empty when nothing ran.
    pub command: String,
    pub iterations: Vec<IterationResult>,
    pub outcome: Outcome,
    /// When the case started (also the time in its log file names).
    pub started: Timestamp,
    pub duration: Duration,
    pub log_files: Vec<PathBuf>,
    /// Stopped before its end because the runner is stopping: no result.
    pub cancelled: bool,
}

impl CaseReport {
    /// The reference's Event message: the iterations as JSON.
    pub fn message(&self) -> String {
        event_message(&self.iterations)
    }

    /// The result Event.
    pub fn event(&self, hostname: &str) -> EventContent {
        let gpus: Vec<_> = self.gpus.iter().map(TargetGpu::label).collect();
        EventContent {
            type_: self.outcome.event_type().into(),
            reason: self.outcome.reason().into(),
            message: self.message(),
            labels: event_labels(
                self.trigger,
                &self.case.recipe,
                self.case.framework,
                hostname,
                &gpus,
            ),
        }
    }

    /// GPU indexes tested.
    pub fn gpu_indexes(&self) -> Vec<u32> {
        self.gpus.iter().map(|g| g.index).collect()
    }

    /// A failed report for a case that tested nothing, for the reason `why`.
    pub fn nothing_tested(trigger: Trigger, case: &TestCase, why: &str) -> Self {
        let iterations = no_gpu_result(why);
        Self {
            trigger,
            case: case.clone(),
            gpus: Vec::new(),
            command: String::new(),
            outcome: outcome(&iterations),
            iterations,
            started: Timestamp::now(),
            duration: Duration::ZERO,
            log_files: Vec::new(),
            cancelled: false,
        }
    }
}

/// Runs `case` on `gpus` (naming them on the command line when `pass_ids`),
/// writing logs under `logs_dir`. Never fails: what cannot be done becomes a
/// failed iteration, explained in the logs and the process's own error output.
pub async fn run_case(
    trigger: Trigger,
    case: &TestCase,
    gpus: &[TargetGpu],
    pass_ids: bool,
    commands: &Commands,
    logs_dir: &Path,
    cancel: &CancellationToken,
) -> CaseReport {
    let started = Timestamp::now();
    let clock = Instant::now();
    let indexes: Vec<u32> = gpus.iter().map(|g| g.index).collect();
    let mut line = describe(case, commands, gpus, pass_ids);
    // `GPU_TEST_GPUS` names the GPUs under test even when `-i` is not passed.
    line.env.retain(|(k, _)| k != "GPU_TEST_GPUS");
    line.env.extend([
        ("GPU_TEST_TRIGGER".into(), trigger.name().into()),
        (
            "GPU_TEST_GPUS".into(),
            indexes
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
        ),
    ]);
    let stem = format!(
        "{}_{}_{}",
        started.strftime("%Y-%m-%dT%H-%M-%S%.6fZ"),
        trigger.label_value(),
        file_part(&case.recipe)
    );
    tracing::info!(
        trigger = %trigger,
        recipe = %case.recipe,
        gpus = ?indexes,
        command = %line.display(),
        iterations = case.iterations,
        "test case starting"
    );

    let mut iterations = Vec::new();
    let mut log_files = Vec::new();
    let mut cancelled = false;
    for number in 1..=case.iterations {
        let out_path = logs_dir.join(format!("{stem}_iteration{number}_stdout.log"));
        let err_path = logs_dir.join(format!("{stem}_iteration{number}_stderr.log"));
        let mut line = line.clone();
        line.env
            .push(("GPU_TEST_ITERATION".into(), number.to_string()));
        let end = match (log_file(&out_path), log_file(&err_path)) {
            (Ok(out), Ok(err)) => {
                log_files.extend([out_path.clone(), err_path.clone()]);
                process::run(&line, out, err, logs_dir, case.timeout, cancel).await
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(error = %e, "cannot create test log files");
                ProcessEnd::Ended(Ending::NotStarted(e))
            }
        };
        let ending = match end {
            ProcessEnd::Cancelled => {
                cancelled = true;
                break;
            }
            ProcessEnd::Ended(ending) => ending,
        };
        let parsed = parsed_results(case.framework, commands, &out_path, &ending);
        let result = iteration_result(
            number,
            &ending,
            parsed,
            case.framework,
            &case.recipe,
            &indexes,
        );
        tracing::info!(
            recipe = %case.recipe,
            iteration = number,
            ending = ?ending,
            failed = iteration_failed(&result),
            "test iteration finished"
        );
        let stop = case.stop_on_failure && iteration_failed(&result);
        iterations.push(result);
        if stop {
            break;
        }
    }
    let mut report = CaseReport {
        trigger,
        case: case.clone(),
        gpus: gpus.to_vec(),
        command: line.display(),
        outcome: outcome(&iterations),
        iterations,
        started,
        duration: clock.elapsed(),
        log_files,
        cancelled,
    };
    if !report.cancelled {
        let path = logs_dir.join(format!("{stem}_result.json"));
        match write_summary(&path, &report) {
            Ok(()) => report.log_files.push(path),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot write test result")
            }
        }
    }
    tracing::info!(
        recipe = %case.recipe,
        outcome = ?report.outcome,
        cancelled = report.cancelled,
        duration = ?report.duration,
        "test case finished"
    );
    report
}

fn log_file(path: &Path) -> Result<File, String> {
    // Append: two runs starting in the same microsecond share files rather than fail.
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The tool's results, read from the file its output names.
fn parsed_results(
    framework: Framework,
    commands: &Commands,
    stdout_path: &Path,
    ending: &Ending,
) -> SuitesResult {
    if matches!(ending, Ending::NotStarted(_)) || framework == Framework::Command {
        return SuitesResult::new();
    }
    let tail = match read_tail(stdout_path, STDOUT_TAIL_BYTES) {
        Ok(tail) => tail,
        Err(e) => {
            tracing::warn!(path = %stdout_path.display(), error = %e, "cannot read test output");
            return SuitesResult::new();
        }
    };
    read_results(framework, commands, &tail).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot read test results");
        SuitesResult::new()
    })
}

fn read_tail(path: &Path, max: u64) -> std::io::Result<String> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(max)))?;
    let mut bytes = Vec::new();
    file.take(max).read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Summary<'a> {
    reason: &'a str,
    trigger: &'a str,
    recipe: &'a str,
    framework: &'a str,
    command: &'a str,
    gpus: Vec<SummaryGpu<'a>>,
    started: String,
    duration_seconds: f64,
    iterations: &'a [IterationResult],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SummaryGpu<'a> {
    bdf: &'a str,
    index: u32,
    kfd_id: Option<u64>,
}

fn write_summary(path: &Path, report: &CaseReport) -> Result<(), String> {
    let summary = Summary {
        reason: report.outcome.reason(),
        trigger: report.trigger.name(),
        recipe: &report.case.recipe,
        framework: report.case.framework.name(),
        command: &report.command,
        gpus: report
            .gpus
            .iter()
            .map(|g| SummaryGpu {
                bdf: &g.bdf,
                index: g.index,
                kfd_id: g.kfd_id,
            })
            .collect(),
        started: report.started.to_string(),
        duration_seconds: report.duration.as_secs_f64(),
        iterations: &report.iterations,
    };
    let text = serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n").map_err(|e| e.to_string())
}

/// The command line of `case` on `gpus` (without the per-iteration environment).
pub fn describe(
    case: &TestCase,
    commands: &Commands,
    gpus: &[TargetGpu],
    pass_ids: bool,
) -> CommandLine {
    let indexes: Vec<u32> = gpus.iter().map(|g| g.index).collect();
    let selected: &[u32] = if pass_ids { &indexes } else { &[] };
    let conf = match case.framework {
        Framework::Rvs => rvs_conf(commands, gpus.iter().find_map(|g| g.model), &case.recipe),
        _ => PathBuf::new(),
    };
    command_line(case, commands, &conf, selected)
}
