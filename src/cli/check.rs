//! `gpu-operator check`: the GPUs' health once, optionally a test recipe,
//! and an exit status for scripts. With `--npd` it is a Node Problem
//! Detector custom plugin (the role the reference's `amdgpuhealth` plays):
//! one line on stdout and exit 0 (healthy), 1 (problem) or 2 (unknown).
//!
//! It owns the subcommand's arguments, its report (table or JSON) and its exit
//! statuses; the checks are `health::check_once` and the test is
//! `testrunner::check`. It must not hold a health rule or run a test tool
//! itself.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::args::{HostRootArg, OutputFormat, host_name, positive_seconds, read_optional};
use super::output::{fail, unbound_lines};
use super::runtime::{run_to_end, shutdown_on_signals};
use crate::device;

#[derive(Args, Debug)]
pub struct CheckArgs {
    #[command(flatten)]
    pub host: HostRootArg,
    /// Also run this test recipe (e.g. gst_single) on the GPUs.
    #[arg(long, value_name = "RECIPE")]
    pub recipe: Option<String>,
    /// The test runner's config.json, for the recipe's MANUAL test case.
    #[arg(long, value_name = "FILE")]
    pub test_config: Option<PathBuf>,
    /// The exporter's config.json, for HealthThresholds.
    #[arg(long, value_name = "FILE")]
    pub metrics_config: Option<PathBuf>,
    /// Where test logs go.
    #[arg(long, value_name = "DIR", default_value = "/var/log/amd-test-runner")]
    pub logs_dir: PathBuf,
    /// The rvs binary (default /opt/rocm/bin/rvs, as in the reference's test
    /// runner image). A relative path is taken from the current directory.
    #[arg(long, value_name = "PATH")]
    pub rvs: Option<PathBuf>,
    /// Directory of RVS recipe files (<recipe>.conf).
    #[arg(long, value_name = "DIR")]
    pub rvs_conf_dir: Option<PathBuf>,
    /// Where RVS writes its JSON results.
    #[arg(long, value_name = "DIR")]
    pub rvs_results_dir: Option<PathBuf>,
    /// Seconds before the test is killed.
    #[arg(long, value_name = "SECONDS", value_parser = positive_seconds)]
    pub timeout: Option<Duration>,
    /// Seconds before check gives up as a whole and exits 2 (default 60 plus
    /// the test's --timeout).
    #[arg(long, value_name = "SECONDS", value_parser = positive_seconds)]
    pub deadline: Option<Duration>,
    #[arg(long, short, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// Behave as a Node Problem Detector custom plugin: print one line and
    /// exit 0 when every GPU is healthy, 1 when one is not (or none is
    /// found), 2 when the check itself cannot be made. The deadline defaults
    /// to 8 s, inside the plugin timeout NPD's examples use.
    #[arg(long, conflicts_with_all = ["recipe", "output"])]
    pub npd: bool,
}

/// Node Problem Detector's custom plugin protocol: the exit codes it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NpdStatus {
    Ok = 0,
    Problem = 1,
    Unknown = 2,
}

/// What `check --npd` prints and exits with, from what the check found.
/// `no_gpus_because` is why no GPU was found, when none was. Pure.
///
/// NPD shows the line as the Node condition's message, cut to its
/// `max_output_length` (80 by default), so it leads with the count and the
/// first unhealthy GPU.
pub fn npd_verdict(
    snapshot: &crate::health::HealthSnapshot,
    no_gpus_because: Option<&str>,
) -> (NpdStatus, String) {
    if let Some(why) = no_gpus_because {
        return (NpdStatus::Problem, format!("no AMD GPU found: {why}"));
    }
    let total = snapshot.gpus.len();
    let unhealthy: Vec<_> = snapshot.unhealthy().collect();
    match unhealthy.first() {
        None => (
            NpdStatus::Ok,
            format!(
                "{total} AMD GPU{} healthy",
                if total == 1 { "" } else { "s" }
            ),
        ),
        Some((bdf, health)) => (
            NpdStatus::Problem,
            format!(
                "{} of {total} AMD GPUs unhealthy: {bdf}: {}",
                unhealthy.len(),
                health.reasons.join("; ")
            ),
        ),
    }
}

/// `check --npd`'s answer when the check cannot be made: one line, exit 2.
fn npd_unknown(why: impl std::fmt::Display) -> ExitCode {
    println!("cannot check AMD GPUs: {why}");
    ExitCode::from(NpdStatus::Unknown as u8)
}

/// `check --npd`: the health half of `check`, reported by NPD's rules.
fn run_npd(args: CheckArgs) -> ExitCode {
    let host = match args.host.open() {
        Ok(host) => host,
        Err(message) => return npd_unknown(message),
    };
    let metrics_config = match read_optional(args.metrics_config.as_ref()) {
        Ok(text) => text,
        Err(e) => return npd_unknown(e),
    };
    let deadline = args.deadline.unwrap_or(NPD_DEADLINE);
    let work = async move {
        let (inventory, snapshot) = match health_once(&host, metrics_config.as_deref()).await {
            Ok(found) => found,
            Err(e) => return npd_unknown(format!("--metrics-config: {e}")),
        };
        let no_gpus_because = inventory.gpus.is_empty().then(|| no_gpu_reason(&inventory));
        let (status, line) = npd_verdict(&snapshot, no_gpus_because);
        println!("{line}");
        ExitCode::from(status as u8)
    };
    run_to_end(async move {
        match tokio::time::timeout(deadline, work).await {
            Ok(code) => code,
            Err(_) => npd_unknown(format!("no answer within {deadline:?} (--deadline)")),
        }
    })
}

/// Discovers the GPUs and checks each once; `exporter_config` gives the
/// thresholds.
async fn health_once(
    host: &crate::host::HostRoot,
    exporter_config: Option<&str>,
) -> Result<(device::Inventory, crate::health::HealthSnapshot), crate::telemetry::ConfigError> {
    // Off the runtime's thread: discovery blocks on host reads, and check's
    // deadline must be able to end the wait.
    let inventory = device::discover_off_runtime(host).await;
    let snapshot =
        crate::health::check_once(host, &inventory, exporter_config, Duration::from_secs(2))
            .await?;
    Ok((inventory, snapshot))
}

/// Why discovery found no GPU.
fn no_gpu_reason(inventory: &device::Inventory) -> &'static str {
    if inventory.driver.loaded {
        "none is bound to amdgpu"
    } else {
        "the amdgpu driver is not loaded"
    }
}

pub fn run(args: CheckArgs) -> ExitCode {
    if args.npd {
        return run_npd(args);
    }
    let host = match args.host.open() {
        Ok(host) => host,
        Err(message) => return fail(message, 2),
    };
    let (metrics_config, test_config) = match (
        read_optional(args.metrics_config.as_ref()),
        read_optional(args.test_config.as_ref()),
    ) {
        (Ok(m), Ok(t)) => (m, t),
        (Err(e), _) | (_, Err(e)) => return fail(e, 2),
    };
    // Everything check does is bounded; this is the promise over the sum.
    let deadline = args
        .deadline
        .unwrap_or(CHECK_DEADLINE + args.timeout.unwrap_or_default());
    let work = async move {
        let (inventory, snapshot) = match health_once(&host, metrics_config.as_deref()).await {
            Ok(found) => found,
            Err(e) => return fail(format!("--metrics-config: {e}"), 2),
        };
        let unhealthy = snapshot.gpus.values().filter(|g| !g.healthy).count();
        let mut test = None;
        let mut tool_missing: Option<String> = None;
        if let Some(recipe) = &args.recipe {
            let mut options = crate::testrunner::CheckOptions::new(
                recipe,
                host.clone(),
                host_name(),
                &args.logs_dir,
            );
            options.config_text = test_config;
            // Tests run in the logs directory: relative paths are made absolute
            // first, so that they mean what they mean in the caller's shell.
            let from_here =
                |path: &PathBuf| std::path::absolute(path).unwrap_or_else(|_| path.clone());
            if let Some(rvs) = &args.rvs {
                options.commands.rvs = from_here(rvs);
            }
            if let Some(dir) = &args.rvs_conf_dir {
                options.commands.rvs_conf_dir = from_here(dir);
            }
            if let Some(dir) = &args.rvs_results_dir {
                options.commands.rvs_results_dir = from_here(dir);
            }
            options.timeout = args.timeout;
            match crate::testrunner::check(&options, &shutdown_on_signals()).await {
                Ok(report) => test = Some(report),
                Err(crate::testrunner::TestRunnerError::ToolUnavailable {
                    framework,
                    program,
                    why,
                }) => {
                    let hint = match framework {
                        crate::testrunner::Framework::Rvs => " (point --rvs at the rvs binary)",
                        crate::testrunner::Framework::Agfhc => {
                            " (the reference's test runner image has it there)"
                        }
                        crate::testrunner::Framework::Command => {
                            " (see the recipe's Command in --test-config)"
                        }
                    };
                    tool_missing = Some(format!(
                        "test {recipe} not run: the {} test tool {} cannot be started: {why}{hint}",
                        framework.name(),
                        program.display()
                    ));
                }
                Err(e) => return fail(format!("test {recipe}: {e}"), 3),
            }
        }
        let test_code = test.as_ref().map_or(0, |r| r.outcome.exit_code());
        match args.output {
            OutputFormat::Json => {
                let json = serde_json::json!({
                    "gpus": snapshot.gpus.iter().map(|(bdf, g)| serde_json::json!({
                        "bdf": bdf, "healthy": g.healthy, "reasons": g.reasons, "gpu_ids": g.gpu_ids,
                    })).collect::<Vec<_>>(),
                    "unhealthy": unhealthy,
                    "test": match (&test, &tool_missing) {
                        (Some(r), _) => Some(serde_json::json!({
                            "recipe": args.recipe, "exit_code": test_code,
                            "result": serde_json::from_str::<serde_json::Value>(&r.message()).unwrap_or_default(),
                        })),
                        (None, Some(why)) => Some(serde_json::json!({
                            "recipe": args.recipe, "exit_code": TOOL_UNAVAILABLE_EXIT,
                            "result": "not-run", "reason": why,
                        })),
                        (None, None) => None,
                    },
                });
                println!(
                    "{}",
                    serde_json::to_string_pretty(&json).unwrap_or_default()
                );
            }
            OutputFormat::Table => {
                println!("{:<13} {:<24} {:<10} REASONS", "BDF", "PRODUCT", "HEALTH");
                for gpu in &inventory.gpus {
                    let health = snapshot.gpus.get(&gpu.bdf);
                    println!(
                        "{:<13} {:<24} {:<10} {}",
                        gpu.bdf,
                        gpu.product_name.as_deref().unwrap_or("-"),
                        match health {
                            Some(h) if h.healthy => "healthy",
                            Some(_) => "UNHEALTHY",
                            None => "unknown",
                        },
                        health.map(|h| h.reasons.join("; ")).unwrap_or_default()
                    );
                }
                if let (Some(recipe), Some(report)) = (&args.recipe, &test) {
                    println!("test {recipe}: exit {test_code}: {}", report.message());
                }
            }
        }
        if inventory.gpus.is_empty() {
            let why = no_gpu_reason(&inventory);
            eprintln!("no GPUs found under {}: {why}", host.root().display());
            eprint!(
                "{}",
                unbound_lines(&device::unbound::unbound_amd_gpus(&host))
            );
            return ExitCode::from(1);
        }
        if let Some(why) = &tool_missing {
            eprintln!("error: {why}");
        }
        if unhealthy > 0 {
            ExitCode::from(1)
        } else if tool_missing.is_some() {
            ExitCode::from(TOOL_UNAVAILABLE_EXIT)
        } else {
            ExitCode::from(u8::try_from(test_code).unwrap_or(1))
        }
    };
    run_to_end(async move {
        match tokio::time::timeout(deadline, work).await {
            Ok(code) => code,
            Err(_) => fail(
                format!(
                    "check did not finish within its {deadline:?} deadline (--deadline); nothing more to report"
                ),
                2,
            ),
        }
    })
}

/// `check`'s global deadline, on top of the test's own `--timeout`.
const CHECK_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// `check --npd`'s deadline: NPD's own examples give a plugin 10 s.
const NPD_DEADLINE: Duration = Duration::from_secs(8);

/// `check`'s exit status when the test tool cannot be started.
const TOOL_UNAVAILABLE_EXIT: u8 = 4;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::{GpuHealth, HealthSnapshot};

    fn snapshot(gpus: Gpus) -> HealthSnapshot {
        HealthSnapshot {
            gpus: gpus
                .iter()
                .map(|(bdf, reasons)| {
                    let health = GpuHealth {
                        healthy: reasons.is_empty(),
                        reasons: reasons.iter().map(|r| r.to_string()).collect(),
                        gpu_ids: vec![0],
                    };
                    (bdf.to_string(), health)
                })
                .collect(),
        }
    }

    /// GPUs by address with their reasons (none: healthy).
    type Gpus<'a> = &'a [(&'a str, &'a [&'a str])];

    #[test]
    fn npd_lines_lead_with_the_count_and_the_first_unhealthy_gpu() {
        let cases: &[(Gpus, Option<&str>, NpdStatus, &str)] = &[
            (
                &[("0000:05:00.0", &[]), ("0000:27:00.0", &[])],
                None,
                NpdStatus::Ok,
                "2 AMD GPUs healthy",
            ),
            (
                &[("0000:05:00.0", &[])],
                None,
                NpdStatus::Ok,
                "1 AMD GPU healthy",
            ),
            (
                &[
                    ("0000:05:00.0", &[]),
                    ("0000:27:00.0", &["umc: 1 uncorrectable ECC error", "hot"]),
                    ("0000:47:00.0", &["gone"]),
                ],
                None,
                NpdStatus::Problem,
                "2 of 3 AMD GPUs unhealthy: 0000:27:00.0: umc: 1 uncorrectable ECC error; hot",
            ),
            (
                &[],
                Some("the amdgpu driver is not loaded"),
                NpdStatus::Problem,
                "no AMD GPU found: the amdgpu driver is not loaded",
            ),
        ];
        for (gpus, no_gpus, status, line) in cases {
            assert_eq!(
                npd_verdict(&snapshot(gpus), *no_gpus),
                (*status, line.to_string()),
                "{gpus:?}"
            );
        }
        assert_eq!(
            [NpdStatus::Ok, NpdStatus::Problem, NpdStatus::Unknown].map(|s| s as u8),
            [0, 1, 2],
            "NPD's plugin protocol"
        );
    }
}
