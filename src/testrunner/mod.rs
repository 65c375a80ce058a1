//! GPU test runner: runs GPU validation tests (RVS, AGFHC, or any command a
//! recipe names) when a trigger fires, and reports the results the way AMD's
//! test runner does.
//!
//! Triggers ([`Trigger`]): a GPU turning unhealthy (`AUTO_UNHEALTHY_GPU_WATCH`,
//! fed by the health monitor as [`GpuUnhealthy`]), the runner starting
//! (`PRE_START_JOB_CHECK`, once per agent process), an interval (`PERIODIC`, an
//! extension), and manual requests (`MANUAL`): the Node annotation
//! `amd.com/gpu-test-request=<recipe>` (removed once handled, leaving
//! `testrunner.amd.com/request-handled=<receipt>` so that a stale copy of
//! the Node does not run it twice) or `gpu-operator check --recipe R`
//! ([`check`], no Kubernetes needed). At most one run per GPU at a time; later
//! requests queue ([`decide`]). Each test process leads its own process group,
//! killed as a whole on timeout ([`process`]).
//!
//! Results: a core/v1 Event per test case with reason `TestPassed`,
//! `TestFailed` or `TestTimedOut`, the reference's `testrunner.amd.com/...`
//! labels and its JSON message ([`report`], [`kube`]), recorded through the
//! agent's [`crate::events::EventSink`]; log files in the logs directory
//! ([`execute`]); the Node label
//! `testrunner.amd.com.gpu_health_check.<recipe>.gpu<index>=running` while a
//! test runs; each finished case on [`TestRunnerService::results`] (standalone
//! mode's events file); and [`TestRunnerStats`] for the metrics exporter
//! ([`TestRunnerService::stats`]).
//!
//! Layout: [`config`] (the ConfigMap's `config.json`, pure), [`decide`] (what
//! runs when, pure), [`report`] (result shapes, pure), [`gpus`] and [`command`]
//! (GPU numbering, command lines and result files), [`process`] and [`execute`]
//! (running tests), [`kube`] (its Events and Node writes), [`service`] (the node service),
//! and [`run_now`], a run on demand for callers outside the runner's triggers.
//!
//! This module must not decide GPU health (it is told which GPU is unhealthy),
//! watch the API itself (the agent hands it its Node and the ConfigMap text),
//! or touch the host outside the logs directory, the test programs it starts and
//! reading the KFD topology.

pub mod command;
pub mod config;
pub mod decide;
mod exclusive;
pub mod execute;
pub mod gpus;
pub mod kube;
mod on_demand;
pub mod process;
pub mod report;
pub mod service;
pub mod stats;

use std::path::PathBuf;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::api::TestRunnerSpec;
use crate::host::HostRoot;

pub use command::{AllowedCommands, Commands};
pub use config::{ConfigError, Framework, TestCase, TestConfig, Trigger, parse_config};
pub use decide::TEST_REQUEST_ANNOTATION;
pub use exclusive::GpuLocks;
pub use execute::{CaseReport, LogLimits};
pub use on_demand::{OnDemandRun, run_now};
pub use report::Outcome;
pub use service::TestRunnerService;
pub use stats::TestRunnerStats;

/// The health monitor's news that a GPU became unhealthy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuUnhealthy {
    /// PCI address, as in the inventory.
    pub bdf: String,
    /// Why, for the log.
    pub reasons: Vec<String>,
}

/// Configuration of [`TestRunnerService`].
#[derive(Clone, Debug, PartialEq)]
pub struct TestRunnerConfig {
    /// This Node's name: picks the `TestLocationTrigger` entry and names the
    /// Node that gets labels and Events.
    pub node_name: String,
    /// The ConfigMap's `config.json`; `None` for the built-in default
    /// ([`TestConfig::default`]).
    pub config_text: Option<String>,
    /// Where log files go; created when missing.
    pub logs_dir: PathBuf,
    /// Where the test tools are.
    pub commands: Commands,
    /// For reading the GPUs' KFD ids.
    pub host: HostRoot,
    /// Size cap of each log file, retention of the logs directory.
    pub log_limits: LogLimits,
    /// Why the logs directory the DeviceConfig names is refused
    /// ([`crate::api::validate::logs_host_path_problem`]); the service then
    /// does not start, and says why.
    pub logs_refused: Option<String>,
    /// Why the node's GPUs cannot be tested yet, if so (amdgpu not loaded
    /// for this boot, the driver manager's load not done:
    /// [`crate::driver::condition::gpus_pending`], set by the agent). Tests
    /// that come meanwhile (the pre-start check after a reboot, a request)
    /// wait in the queue instead of failing on a node with no GPU.
    pub gpus_pending: Option<String>,
}

impl TestRunnerConfig {
    pub fn new(host: HostRoot, node_name: impl Into<String>, logs_dir: impl Into<PathBuf>) -> Self {
        Self {
            node_name: node_name.into(),
            config_text: None,
            logs_dir: logs_dir.into(),
            commands: Commands::default(),
            host,
            log_limits: LogLimits::default(),
            logs_refused: None,
            gpus_pending: None,
        }
    }

    /// The configuration a DeviceConfig's `testRunner` asks for: logs under
    /// `logsLocation.hostPath` on the host (mapped under the host root), tools at
    /// their default locations.
    pub fn for_spec(
        spec: &TestRunnerSpec,
        host: HostRoot,
        node_name: impl Into<String>,
        config_text: Option<String>,
    ) -> Self {
        // `logsLocation.hostPath` is a host path: like every host path it lives
        // under the host root (in a container, the host's filesystem mount).
        // The agent runs as root: the path must stay under /var/log/ whatever
        // the DeviceConfig's validation said (validate() reports it too).
        let host_path = &spec.logs_location.host_path;
        let logs_refused = crate::api::validate::logs_host_path_problem(host_path)
            .map(|why| format!("testRunner.logsLocation.hostPath: {why}"));
        let logs_dir = host.path(host_path);
        Self {
            config_text,
            logs_refused,
            ..Self::new(host, node_name, logs_dir)
        }
    }
}

/// Why [`check`] could not run.
#[derive(Debug, thiserror::Error)]
pub enum TestRunnerError {
    #[error("test runner config: {0}")]
    Config(#[from] ConfigError),
    #[error("recipe: {0}")]
    Recipe(String),
    #[error("{0}")]
    Invalid(String),
    #[error("test logs directory {path}: {source}")]
    Logs {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("stopped before the test finished")]
    Cancelled,
    /// The test tool cannot be started: not a GPU failure, nothing was tested.
    #[error("{why}")]
    ToolUnavailable {
        framework: Framework,
        program: PathBuf,
        why: String,
    },
}

/// What `gpu-operator check` runs.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckOptions {
    pub recipe: String,
    /// Picks the MANUAL test case of the recipe in `config_text`.
    pub node_name: String,
    pub host: HostRoot,
    pub config_text: Option<String>,
    pub commands: Commands,
    pub logs_dir: PathBuf,
    pub log_limits: LogLimits,
    /// Overrides of the test case.
    pub framework: Option<Framework>,
    pub iterations: Option<u32>,
    pub timeout: Option<Duration>,
    /// GPU indexes; empty keeps the test case's (all GPUs by default).
    pub device_ids: Vec<u32>,
}

impl CheckOptions {
    pub fn new(
        recipe: impl Into<String>,
        host: HostRoot,
        node_name: impl Into<String>,
        logs_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            recipe: recipe.into(),
            node_name: node_name.into(),
            host,
            config_text: None,
            commands: Commands::default(),
            logs_dir: logs_dir.into(),
            log_limits: LogLimits::default(),
            framework: None,
            iterations: None,
            timeout: None,
            device_ids: Vec::new(),
        }
    }
}

/// Runs one recipe once on this machine's GPUs, as a MANUAL test, without
/// Kubernetes: discovers the GPUs, runs the test case (the MANUAL one of that
/// recipe in the configuration, else the recipe with the reference's
/// defaults), writes the log files and returns the result. The caller prints it
/// ([`CaseReport::message`] is the reference's JSON) and exits with
/// [`Outcome::exit_code`].
pub async fn check(
    options: &CheckOptions,
    cancel: &CancellationToken,
) -> Result<CaseReport, TestRunnerError> {
    let tests = match &options.config_text {
        Some(text) => parse_config(text)?.config,
        None => TestConfig::default(),
    };
    let mut case = decide::manual_case(&tests, &options.node_name, &options.recipe)
        .map_err(TestRunnerError::Recipe)?;
    if let Some(framework) = options.framework {
        if framework == Framework::Command && case.command.is_empty() {
            return Err(TestRunnerError::Invalid(format!(
                "recipe {:?} has no Command in the configuration",
                case.recipe
            )));
        }
        case.framework = framework;
    }
    match options.iterations {
        Some(0) => {
            return Err(TestRunnerError::Invalid(
                "iterations must be at least 1".into(),
            ));
        }
        Some(n) => case.iterations = n,
        None => {}
    }
    match options.timeout {
        Some(t) if t.is_zero() => {
            return Err(TestRunnerError::Invalid(
                "the timeout must be more than 0".into(),
            ));
        }
        Some(t) => case.timeout = t,
        None => {}
    }
    if !options.device_ids.is_empty() {
        case.device_ids = options.device_ids.clone();
    }
    // `check` is run by hand by the node's administrator, who may run any
    // program anyway: COMMAND tests need no allow-list here.
    let commands = Commands {
        allowed: AllowedCommands::Any,
        ..options.commands.clone()
    };
    // A missing tool is told apart from a failing GPU before anything runs.
    if let Some((program, why)) = command::tool_unavailable(&case, &commands) {
        return Err(TestRunnerError::ToolUnavailable {
            framework: case.framework,
            program,
            why,
        });
    }
    std::fs::create_dir_all(&options.logs_dir).map_err(|source| TestRunnerError::Logs {
        path: options.logs_dir.clone(),
        source,
    })?;
    let inventory = crate::device::discover(&options.host);
    let targets = gpus::read_targets(&inventory, &options.host);
    let report = match decide::select_gpus(&decide::Target::All, &case, &targets) {
        Err(why) => CaseReport::nothing_tested(Trigger::Manual, &case, &why),
        Ok(selection) => {
            execute::run_case(
                Trigger::Manual,
                &case,
                &selection.gpus,
                selection.pass_ids,
                &commands,
                execute::Logs {
                    dir: &options.logs_dir,
                    limits: &options.log_limits,
                },
                cancel,
            )
            .await
        }
    };
    if report.cancelled {
        return Err(TestRunnerError::Cancelled);
    }
    Ok(report)
}
