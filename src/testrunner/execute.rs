//! Running one test case on its GPUs: the iterations, stop-on-failure, the log
//! files, and the result.
//!
//! Log files go to the logs directory (`testRunner.logsLocation.hostPath`), named
//! like the reference's (`<time>_<trigger>_<recipe>_<what>`), uncompressed:
//! `..._iteration<N>_stdout.log` and `..._stderr.log` per iteration (the test's
//! own output, streamed to the file while it runs), and `..._result.json` with
//! the outcome, the command line and the iteration results.
//!
//! Limits ([`LogLimits`]): each output file keeps at most 16 MiB (the start,
//! then a note and the last 64 KiB, [`process::LogCap`]); after each case,
//! the directory's test logs older than 30 days are removed, then the oldest
//! beyond the newest 1000. Only files named like ours are touched.

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
use super::process::{self, LogCap, ProcessEnd};
use super::report::EventContent;
use super::report::{
    Ending, IterationResult, Outcome, SuitesResult, event_labels, event_message, file_part,
    iteration_failed, iteration_result, no_gpu_result, outcome,
};

/// How much of a test's stdout is searched for its result file: tools print the
/// path at the end.
const STDOUT_TAIL_BYTES: u64 = 1024 * 1024;

/// How much the logs directory may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogLimits {
    /// The cap of each output file.
    pub cap: LogCap,
    /// At most this many test log files are kept (the newest).
    pub max_files: usize,
    /// Test log files older than this are removed.
    pub max_age: Duration,
}

impl Default for LogLimits {
    fn default() -> Self {
        Self {
            cap: LogCap::default(),
            max_files: 1000,
            max_age: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

/// Whether `name` is a log file [`run_case`] writes:
/// `<YYYY-MM-DDTHH-MM-SS.ffffffZ>_..._{stdout.log,stderr.log,result.json}`.
fn is_test_log(name: &str) -> bool {
    let stamped = name.len() > 27
        && name.as_bytes()[..4].iter().all(u8::is_ascii_digit)
        && name.as_bytes()[4] == b'-'
        && name.as_bytes()[26] == b'Z';
    stamped
        && ["_stdout.log", "_stderr.log", "_result.json"]
            .iter()
            .any(|end| name.ends_with(end))
}

/// Removes test logs in `dir` beyond `limits` (age, then count, oldest first:
/// the names start with their time); returns how many were removed. Errors
/// are logged: retention must never stop a test.
pub fn prune_logs(dir: &Path, limits: &LogLimits) -> usize {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot list the test logs");
            return 0;
        }
    };
    let mut logs: Vec<(String, Option<std::time::SystemTime>)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            is_test_log(&name).then(|| (name, e.metadata().and_then(|m| m.modified()).ok()))
        })
        .collect();
    logs.sort();
    let now = std::time::SystemTime::now();
    let too_old = |modified: &Option<std::time::SystemTime>| {
        modified
            .and_then(|m| now.duration_since(m).ok())
            .is_some_and(|age| age > limits.max_age)
    };
    let (old, young): (Vec<_>, Vec<_>) = logs.into_iter().partition(|(_, m)| too_old(m));
    let excess = young.len().saturating_sub(limits.max_files);
    let mut removed = 0;
    for (name, _) in old.iter().chain(&young[..excess]) {
        match std::fs::remove_file(dir.join(name)) {
            Ok(()) => removed += 1,
            Err(e) => tracing::warn!(file = %name, error = %e, "cannot remove an old test log"),
        }
    }
    if removed > 0 {
        tracing::info!(dir = %dir.display(), removed, "removed old test logs");
    }
    removed
}

/// Where a case's logs go, and the limits of that directory.
#[derive(Clone, Copy, Debug)]
pub(super) struct Logs<'a> {
    pub dir: &'a Path,
    pub limits: &'a LogLimits,
}

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
    /// Why the case failed without a verdict of the tool's, if so: it ran
    /// to its end, and no iteration's output named a result file where the
    /// results are read from. Says where they were looked for, and the flag
    /// that moves it (a tool that writes elsewhere fails every GPU
    /// otherwise, with no hint that the GPUs were never judged).
    pub fn missing_results(&self, commands: &super::Commands) -> Option<String> {
        let dir = match self.case.framework {
            super::Framework::Rvs => (&commands.rvs_results_dir, "--rvs-results-dir"),
            super::Framework::Agfhc => (&commands.agfhc_results_dir, "--agfhc-results-dir"),
            super::Framework::Command => return None,
        };
        let only_missing = !self.iterations.is_empty()
            && self.iterations.iter().all(|i| {
                i.status == super::report::IterationStatus::Completed
                    && !i.suites_result.is_empty()
                    && i.suites_result.values().all(|actions| {
                        actions.len() == 1 && actions.contains_key(super::report::NO_RESULT_ACTION)
                    })
            });
        (only_missing && !self.cancelled && self.outcome != Outcome::Passed).then(|| {
            format!(
                "{} ran, but its output named no result file under {} (its results are \
                 read from there: the agent's {})",
                self.case.framework.name(),
                dir.0.display(),
                dir.1
            )
        })
    }

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

    /// A case cancelled while it waited for its GPUs: nothing ran.
    pub fn cancelled_before_start(trigger: Trigger, case: &TestCase) -> Self {
        Self {
            cancelled: true,
            ..Self::nothing_tested(trigger, case, "cancelled before its GPUs were free")
        }
    }
}

/// Runs `case` on `gpus` (naming them on the command line when `pass_ids`),
/// writing logs under `logs_dir`. Never fails: what cannot be done becomes a
/// failed iteration, explained in the logs and the process's own error output.
pub(super) async fn run_case(
    trigger: Trigger,
    case: &TestCase,
    gpus: &[TargetGpu],
    pass_ids: bool,
    commands: &Commands,
    logs: Logs<'_>,
    cancel: &CancellationToken,
) -> CaseReport {
    let Logs {
        dir: logs_dir,
        limits,
    } = logs;
    let started = Timestamp::now();
    let clock = Instant::now();
    let indexes: Vec<u32> = gpus.iter().map(|g| g.index).collect();
    let mut line = describe(case, commands, gpus, pass_ids);
    if case.framework == Framework::Command {
        // Run what was checked: the resolved path, not the configured one.
        match commands.allowed.permit(&line.program) {
            Ok(program) => line.program = program,
            Err(why) => {
                tracing::warn!(trigger = %trigger, recipe = %case.recipe, %why, "test case refused");
                return CaseReport::nothing_tested(trigger, case, &why);
            }
        }
    }
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
                process::run(&line, out, err, logs_dir, case.timeout, limits.cap, cancel).await
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
    // Retention once the case is written: never in the way of a test starting.
    prune_logs(logs_dir, limits);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testrunner::command::AllowedCommands;

    /// A COMMAND test's result is its exit status, per GPU tested.
    fn one_gpu() -> Vec<TargetGpu> {
        vec![TargetGpu {
            bdf: "0000:03:00.0".into(),
            index: 0,
            kfd_id: None,
            model: None,
        }]
    }

    fn command_case(program: &str, script: &str) -> TestCase {
        TestCase {
            framework: Framework::Command,
            command: vec![program.into(), "-c".into(), script.into()],
            ..TestCase::new("smoke")
        }
    }

    fn allowing(paths: &[&Path]) -> Commands {
        Commands {
            allowed: AllowedCommands::from_flags(paths.iter().map(|p| p.to_path_buf()).collect()),
            ..Commands::default()
        }
    }

    #[tokio::test]
    async fn a_command_test_runs_only_when_the_administrator_allows_it() {
        let logs = tempfile::tempdir().unwrap();
        let marker = logs.path().join("ran");
        let case = command_case("/bin/sh", &format!("touch {}", marker.display()));
        let cancel = CancellationToken::new();
        let run = |commands: Commands| {
            let case = case.clone();
            let cancel = cancel.clone();
            let dir = logs.path().to_path_buf();
            async move {
                run_case(
                    Trigger::Manual,
                    &case,
                    &one_gpu(),
                    false,
                    &commands,
                    Logs {
                        dir: &dir,
                        limits: &LogLimits::default(),
                    },
                    &cancel,
                )
                .await
            }
        };
        // The default: refused, with the reason in the result, nothing started.
        let refused = run(Commands::default()).await;
        assert_eq!(refused.outcome, Outcome::Failed);
        assert!(
            refused.message().contains("--allow-test-command"),
            "{}",
            refused.message()
        );
        assert!(refused.log_files.is_empty());
        assert!(!marker.exists(), "a refused program must not run");
        // Allowed elsewhere only: still refused.
        let refused = run(allowing(&[Path::new("/usr/local/sbin")])).await;
        assert!(
            refused.message().contains("not under"),
            "{}",
            refused.message()
        );
        assert!(!marker.exists());
        // Allowed: runs, as the resolved path.
        let sh = std::fs::canonicalize("/bin/sh").unwrap();
        let ran = run(allowing(&[&sh])).await;
        assert_eq!(ran.outcome, Outcome::Passed, "{}", ran.message());
        assert!(marker.exists());
        assert!(
            ran.command.starts_with(&sh.display().to_string()),
            "{}",
            ran.command
        );
    }

    /// An rvs that writes its results where the agent does not read them
    /// fails with a reason that says so, and names the flag: not a silent
    /// failure of every GPU.
    #[tokio::test]
    async fn results_written_where_they_are_not_read_are_named_as_missing() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (elsewhere, read_from) = (dir.path().join("elsewhere"), dir.path().join("results"));
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::create_dir_all(dir.path().join("conf")).unwrap();
        std::fs::write(dir.path().join("conf/gst_single.conf"), "actions: []\n").unwrap();
        let rvs = dir.path().join("rvs");
        std::fs::write(
            &rvs,
            format!(
                "#!/bin/sh\nf='{}/gst_single_1.json'\n\
                 echo '{{\"gst\":{{\"a\":[{{\"gpu_index\":\"0\",\"pass\":\"true\"}}]}}}}' > \"$f\"\n\
                 echo \"[RESULT] results written to $f\"\n",
                elsewhere.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&rvs, std::fs::Permissions::from_mode(0o755)).unwrap();
        let commands = |results: &Path| Commands {
            rvs: rvs.clone(),
            rvs_conf_dir: dir.path().join("conf"),
            rvs_results_dir: results.to_path_buf(),
            ..Commands::default()
        };
        let logs = dir.path().join("logs");
        std::fs::create_dir_all(&logs).unwrap();
        let run = |commands: Commands| {
            let logs = logs.clone();
            async move {
                run_case(
                    Trigger::Manual,
                    &TestCase::new("gst_single"),
                    &one_gpu(),
                    false,
                    &commands,
                    Logs {
                        dir: &logs,
                        limits: &LogLimits::default(),
                    },
                    &CancellationToken::new(),
                )
                .await
            }
        };
        let missed = commands(&read_from);
        let report = run(missed.clone()).await;
        assert_eq!(report.outcome, Outcome::Failed);
        let why = report.missing_results(&missed).expect("named as missing");
        assert!(
            why.contains(&read_from.display().to_string()) && why.contains("--rvs-results-dir"),
            "{why}"
        );
        // Read from where they are: passed, nothing missing.
        let found = commands(&elsewhere);
        let report = run(found.clone()).await;
        assert_eq!(report.outcome, Outcome::Passed, "{}", report.message());
        assert_eq!(report.missing_results(&found), None);
    }

    #[tokio::test]
    async fn a_test_printing_20_mib_leaves_a_log_of_at_most_16_mib() {
        let logs = tempfile::tempdir().unwrap();
        let case = command_case(
            "/bin/sh",
            "head -c 20971520 /dev/zero | tr '\\0' z; echo; echo last-line",
        );
        let report = run_case(
            Trigger::Manual,
            &case,
            &one_gpu(),
            false,
            &Commands {
                allowed: AllowedCommands::Any,
                ..Commands::default()
            },
            Logs {
                dir: logs.path(),
                limits: &LogLimits::default(),
            },
            &CancellationToken::new(),
        )
        .await;
        assert_eq!(report.outcome, Outcome::Passed, "{}", report.message());
        let stdout = report
            .log_files
            .iter()
            .find(|p| p.to_string_lossy().ends_with("_stdout.log"))
            .expect("a stdout log");
        let len = std::fs::metadata(stdout).unwrap().len();
        assert!(
            len <= 16 * 1024 * 1024 + 512,
            "{len} bytes: over the 16 MiB cap"
        );
        assert!(
            len >= 16 * 1024 * 1024 - 64 * 1024,
            "{len} bytes: too little kept"
        );
        let text = std::fs::read(stdout).unwrap();
        let end = String::from_utf8_lossy(&text[text.len() - 70_000..]).into_owned();
        assert!(end.contains("bytes of output left out here"), "no note");
        assert!(end.ends_with("z\nlast-line\n"));
    }

    #[test]
    fn retention_removes_old_and_excess_test_logs_only() {
        let dir = tempfile::tempdir().unwrap();
        let name =
            |i: u32, what: &str| format!("2026-01-{:02}T10-00-00.000000Z_manual_gst_{what}", i + 1);
        for i in 0..5 {
            for what in [
                "iteration1_stdout.log",
                "iteration1_stderr.log",
                "result.json",
            ] {
                std::fs::write(dir.path().join(name(i, what)), "x").unwrap();
            }
        }
        // Not ours: never touched.
        std::fs::write(dir.path().join("notes.txt"), "keep").unwrap();
        std::fs::write(dir.path().join("2026-01-01_other.log"), "keep").unwrap();
        let old = dir.path().join(name(4, "old_result.json"));
        std::fs::write(&old, "x").unwrap();
        let long_ago = std::time::SystemTime::now() - Duration::from_secs(40 * 24 * 3600);
        File::options()
            .write(true)
            .open(&old)
            .unwrap()
            .set_modified(long_ago)
            .unwrap();

        let limits = LogLimits {
            max_files: 9,
            ..LogLimits::default()
        };
        // 16 test logs: the 40-day-old one goes by age, then the oldest 6 of
        // the other 15 by count.
        assert_eq!(prune_logs(dir.path(), &limits), 7);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert!(left.contains(&"notes.txt".to_owned()));
        assert!(left.contains(&"2026-01-01_other.log".to_owned()));
        assert!(!left.contains(&name(4, "old_result.json")));
        assert!(!left.iter().any(|n| n.starts_with("2026-01-01T")));
        assert!(!left.iter().any(|n| n.starts_with("2026-01-02T")));
        assert!(left.contains(&name(2, "result.json")));
        assert!(left.contains(&name(4, "result.json")));
        assert_eq!(left.len(), 9 + 2, "{left:?}");
        // Within the limits: nothing more.
        assert_eq!(prune_logs(dir.path(), &limits), 0);
    }
}
