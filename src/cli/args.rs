//! The arguments more than one subcommand takes (the host root, how often the
//! node is sampled, the output format) and the small readers that turn such
//! values into what a subcommand needs: the opened host root, the text of an
//! optional config file, this machine's name, the Kubernetes client.
//!
//! It must not hold a subcommand's work or print: each subcommand's own
//! arguments are in its file.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::host::HostRoot;

#[derive(Args, Debug)]
pub struct HostRootArg {
    /// Directory that stands for the host's `/` (e.g. /host in a container, or a
    /// directory written by `gpu-operator simulate`).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/",
        env = "GPU_OPERATOR_HOST_ROOT"
    )]
    pub host_root: PathBuf,
}

impl HostRootArg {
    /// The host root, checked to be a readable directory.
    pub fn open(&self) -> Result<HostRoot, String> {
        match std::fs::metadata(&self.host_root) {
            Ok(meta) if meta.is_dir() => Ok(HostRoot::new(&self.host_root)),
            Ok(_) => Err(format!(
                "host root {} is not a directory",
                self.host_root.display()
            )),
            Err(e) => Err(format!("host root {}: {e}", self.host_root.display())),
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

/// How often the node is looked at. Shared by `agent` and `standalone`.
#[derive(Args, Debug)]
pub struct SamplingArgs {
    /// Seconds between discovery rescans. udev events trigger rescans at once
    /// when the host root is /; in a pod (host root /host) the rescan is what
    /// notices hotplug and repartitioning, so keep it short (a scan of a
    /// 64-partition node takes ~3 ms).
    #[arg(long, value_name = "SECONDS", default_value = "1", value_parser = positive_seconds)]
    pub rescan_interval: Duration,
    /// Seconds between metrics samples; a scrape always serves the latest one.
    #[arg(long, value_name = "SECONDS", default_value = "5", value_parser = positive_seconds)]
    pub metrics_interval: Duration,
    /// Seconds between health samples while every GPU's state is settled.
    #[arg(long, value_name = "SECONDS", default_value = "0.5", value_parser = positive_seconds)]
    pub health_interval: Duration,
    /// Seconds between health samples while a sample disagrees with a GPU's
    /// state and --unhealthy-after/--healthy-after have not decided yet. A
    /// problem is so reported within about --health-interval plus this.
    #[arg(long, value_name = "SECONDS", default_value = "0.1", value_parser = positive_seconds)]
    pub health_confirm_interval: Duration,
    /// Consecutive bad health samples before a GPU is marked Unhealthy.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub unhealthy_after: u32,
    /// Consecutive good health samples before an Unhealthy GPU is Healthy again.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub healthy_after: u32,
}

impl SamplingArgs {
    pub(super) fn sampling(&self) -> crate::agent::select::Sampling {
        crate::agent::select::Sampling {
            metrics_interval: self.metrics_interval,
            health_interval: self.health_interval,
            health_confirm_interval: self.health_confirm_interval,
            damping: crate::health::Damping {
                unhealthy_after: self.unhealthy_after,
                healthy_after: self.healthy_after,
            },
        }
    }
}

/// The reference exporter's health socket, which AMD's device plugin reads
/// GPU health from. Shared by `agent` and `standalone`.
#[derive(Args, Debug)]
pub struct HealthSocketArgs {
    /// Serve the health monitor's verdicts on this socket, as AMD's
    /// device-metrics-exporter does (gRPC `metricssvc.MetricsService`, mode
    /// 0600), wherever the health monitor runs. A host path: under --host-root.
    #[arg(long, value_name = "HOST_PATH", default_value = crate::metricssvc::DEFAULT_SOCKET)]
    pub health_socket: PathBuf,
    /// Do not serve the health socket (say, AMD's device-metrics-exporter
    /// serves it on this node). A socket another process serves is never
    /// taken over anyway.
    #[arg(long)]
    pub no_health_socket: bool,
}

impl HealthSocketArgs {
    /// The socket's host path; `None` with --no-health-socket.
    pub(super) fn path(&self) -> Option<PathBuf> {
        (!self.no_health_socket).then(|| self.health_socket.clone())
    }
}

/// A positive, finite number of seconds (fractions allowed), as clap parses
/// a flag value.
pub(super) fn positive_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    crate::api::syntax::positive_seconds(seconds).map_err(|why| format!("{text}: {why}"))
}

/// This machine's host name, for the `hostname` label.
pub(super) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// The text of `path`, refused when it is larger than `max` bytes.
pub(super) fn read_capped(path: &std::path::Path, max: usize) -> Result<String, String> {
    use std::io::Read as _;
    let named = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let file = std::fs::File::open(path).map_err(|e| named(&e))?;
    let mut text = String::new();
    file.take(max as u64 + 1)
        .read_to_string(&mut text)
        .map_err(|e| named(&e))?;
    if text.len() > max {
        return Err(named(&format!("larger than {max} bytes")));
    }
    Ok(text)
}

pub(super) fn read_optional(path: Option<&PathBuf>) -> Result<Option<String>, String> {
    path.map(|p| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display())))
        .transpose()
}

/// The Kubernetes client, from the in-cluster service account or KUBECONFIG
/// (what `agent` and `leader` take instead of a flag).
pub(super) async fn kube_client() -> Result<kube::Client, String> {
    kube_clients().await.map(|(client, _)| client)
}

/// [`kube_client`], and a second client from the same configuration without
/// kube's own retries, for the leader's evictions.
pub(super) async fn kube_clients() -> Result<(kube::Client, crate::cluster::EvictionClient), String>
{
    let unreachable = |e: &dyn std::fmt::Display| {
        format!("cannot reach Kubernetes (in-cluster config or KUBECONFIG): {e}")
    };
    let config = kube::Config::infer().await.map_err(|e| unreachable(&e))?;
    let eviction =
        crate::cluster::EvictionClient::from_config(config.clone()).map_err(|e| unreachable(&e))?;
    let client = kube::Client::try_from(config).map_err(|e| unreachable(&e))?;
    Ok((client, eviction))
}

/// Where driver bundles are and how amdgpu is loaded from them. Shared by
/// `agent` and `standalone`.
#[derive(Args, Debug)]
pub struct DriverLoadArgs {
    /// The host's driver bundle store (a host path under --host-root): one
    /// directory per driver version and kernel, as docs/driver.md describes.
    /// With `spec.driver.enable`, the bundle built for the running kernel is
    /// loaded from here, after verifying it.
    #[arg(long, value_name = "DIR", default_value = crate::driver::preflight::DEFAULT_STORE)]
    pub driver_store: String,
    /// The modprobe amdgpu is loaded and unloaded with.
    #[arg(long, value_name = "PATH", default_value = "/usr/sbin/modprobe")]
    pub modprobe: PathBuf,
}

impl DriverLoadArgs {
    /// The driver manager's configuration, rebooting with `reboot`.
    pub(super) fn manager_config(
        &self,
        reboot: Option<crate::driver::reboot::RebootCommand>,
    ) -> crate::driver::manager::ManagerConfig {
        crate::driver::manager::ManagerConfig {
            store: self.driver_store.clone(),
            commands: crate::driver::load::LoadCommands {
                modprobe: self.modprobe.clone(),
                ..Default::default()
            },
            reboot,
            ..Default::default()
        }
    }
}

/// The time limits of the leader's driver upgrade steps: the DeviceConfig
/// has no field for them. Shared by `agent` and `leader`.
#[derive(Args, Debug)]
pub struct UpgradeTimeoutArgs {
    /// Seconds a picked node may take to be cordoned before its upgrade is
    /// Cordon-Failed.
    #[arg(long, value_name = "SECONDS", default_value = "60", value_parser = positive_seconds)]
    pub upgrade_cordon_timeout: Duration,
    /// Seconds the agent may take to report the target driver loaded after it
    /// was told (Upgrade-Failed after that).
    #[arg(long, value_name = "SECONDS", default_value = "600", value_parser = positive_seconds)]
    pub upgrade_load_timeout: Duration,
    /// Seconds a node may take to come back with a new boot id after it was
    /// asked to reboot (Reboot-Failed after that; the reference's 60 minutes).
    #[arg(long, value_name = "SECONDS", default_value = "3600", value_parser = positive_seconds)]
    pub upgrade_reboot_timeout: Duration,
    /// Seconds one node's whole upgrade may take (Upgrade-Timed-Out after
    /// that; the reference's 2 hours).
    #[arg(long, value_name = "SECONDS", default_value = "7200", value_parser = positive_seconds)]
    pub upgrade_timeout: Duration,
}

/// The pace of a remediation's last step, which the DeviceConfig has no
/// field for: the node's condition must be False at two checks this far
/// apart, within the window (the reference's wait step: a minute, 15
/// minutes). Shared by `agent` and `leader`.
#[derive(Args, Debug)]
pub struct RemediationConfirmArgs {
    /// Seconds between the checks that the remediated condition stays False.
    #[arg(long, value_name = "SECONDS", default_value = "60", value_parser = positive_seconds)]
    pub remediation_confirm_interval: Duration,
    /// Seconds the condition has to stay False at two checks, after the
    /// tests passed, before the remediation fails.
    #[arg(long, value_name = "SECONDS", default_value = "900", value_parser = positive_seconds)]
    pub remediation_confirm_within: Duration,
}

impl RemediationConfirmArgs {
    pub(super) fn confirm(&self) -> crate::remediation::plan::Confirm {
        crate::remediation::plan::Confirm {
            interval: self.remediation_confirm_interval,
            within: self.remediation_confirm_within,
            ..crate::remediation::plan::Confirm::default()
        }
    }
}

impl UpgradeTimeoutArgs {
    pub(super) fn timeouts(&self) -> crate::cluster::upgrade::Timeouts {
        crate::cluster::upgrade::Timeouts {
            cordon: self.upgrade_cordon_timeout,
            // The drain's limit is the DeviceConfig's drain policy.
            drain: None,
            load: self.upgrade_load_timeout,
            reboot: self.upgrade_reboot_timeout,
            upgrade: self.upgrade_timeout,
        }
    }
}

/// Where the GPU validation tools are in the agent's filesystem (its
/// container, or the host for standalone). The defaults are the reference's
/// test runner image's; the agent's image carries neither tool:
/// deploy/README.md ("GPU validation tools") says how a pod gets them.
#[derive(Args, Debug, Clone)]
pub struct TestToolArgs {
    /// The rvs binary, for RVS test recipes and remediation profiles.
    #[arg(long, value_name = "PATH", default_value = crate::testrunner::command::DEFAULT_RVS)]
    pub rvs: PathBuf,
    /// Directory of RVS recipe files (<recipe>.conf, per model <MODEL>/<recipe>.conf).
    #[arg(
        long,
        value_name = "DIR",
        default_value = crate::testrunner::command::DEFAULT_RVS_CONF_DIR
    )]
    pub rvs_conf_dir: PathBuf,
    /// Where rvs writes its JSON results (the directory of the path it
    /// prints); results named elsewhere are not read.
    #[arg(long, value_name = "DIR", default_value = crate::testrunner::command::DEFAULT_RESULTS_DIR)]
    pub rvs_results_dir: PathBuf,
    /// The agfhc binary, for AGFHC test recipes and remediation profiles
    /// (the built-in remediation mapping validates with AGFHC).
    #[arg(long, value_name = "PATH", default_value = crate::testrunner::command::DEFAULT_AGFHC)]
    pub agfhc: PathBuf,
    /// Where agfhc writes its result directories (its -o).
    #[arg(long, value_name = "DIR", default_value = crate::testrunner::command::DEFAULT_RESULTS_DIR)]
    pub agfhc_results_dir: PathBuf,
}

impl TestToolArgs {
    /// The test runner's commands with these tools and `allowed` COMMAND programs.
    pub fn commands(
        &self,
        allowed: crate::testrunner::AllowedCommands,
    ) -> crate::testrunner::Commands {
        crate::testrunner::Commands {
            rvs: self.rvs.clone(),
            rvs_conf_dir: self.rvs_conf_dir.clone(),
            rvs_results_dir: self.rvs_results_dir.clone(),
            agfhc: self.agfhc.clone(),
            agfhc_results_dir: self.agfhc_results_dir.clone(),
            allowed,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};

    #[test]
    fn dra_device_taints_are_on_unless_turned_off() {
        let taints = |extra: &[&str]| {
            let mut argv = vec!["gpu-operator", "agent", "--node-name", "n"];
            argv.extend_from_slice(extra);
            match Cli::try_parse_from(argv).map(|c| c.command) {
                Ok(Command::Agent(args)) => Ok(args.dra_device_taints),
                Ok(_) => panic!("agent parses as agent"),
                Err(e) => Err(e.kind()),
            }
        };
        assert_eq!(taints(&[]), Ok(true));
        assert_eq!(taints(&["--dra-device-taints"]), Ok(true));
        assert_eq!(taints(&["--dra-device-taints=true"]), Ok(true));
        assert_eq!(taints(&["--dra-device-taints=false"]), Ok(false));
        assert!(taints(&["--dra-device-taints=maybe"]).is_err());
    }

    #[test]
    fn sampling_flags_default_parse_and_refuse_nonsense() {
        let cli = Cli::try_parse_from(["gpu-operator", "standalone"]).unwrap();
        let Command::Standalone(args) = cli.command else {
            panic!("standalone parses as standalone");
        };
        assert_eq!(
            args.sampling.sampling(),
            crate::agent::select::Sampling::default()
        );
        assert_eq!(args.sampling.rescan_interval, Duration::from_secs(1));

        let cli = Cli::try_parse_from([
            "gpu-operator",
            "agent",
            "--node-name",
            "n",
            "--metrics-interval",
            "2.5",
            "--health-interval",
            "0.1",
            "--health-confirm-interval",
            "0.05",
            "--unhealthy-after",
            "3",
            "--healthy-after",
            "5",
        ])
        .unwrap();
        let Command::Agent(args) = cli.command else {
            panic!("agent parses as agent");
        };
        let sampling = args.sampling.sampling();
        assert_eq!(sampling.metrics_interval, Duration::from_millis(2500));
        assert_eq!(sampling.health_interval, Duration::from_millis(100));
        assert_eq!(sampling.health_confirm_interval, Duration::from_millis(50));
        assert_eq!(
            (
                sampling.damping.unhealthy_after,
                sampling.damping.healthy_after
            ),
            (3, 5)
        );

        for bad in [
            ["--rescan-interval", "0"],
            ["--metrics-interval", "-1"],
            ["--health-interval", "soon"],
            ["--health-interval", "inf"],
            ["--unhealthy-after", "0"],
        ] {
            let parsed = Cli::try_parse_from(["gpu-operator", "standalone", bad[0], bad[1]]);
            assert!(parsed.is_err(), "{bad:?} is refused");
        }
        // --timeout of check goes through the same parser: no panic on 1e30.
        for bad in ["0", "-3", "1e30", "nan"] {
            let parsed = Cli::try_parse_from(["gpu-operator", "check", "--timeout", bad]);
            assert!(parsed.is_err(), "--timeout {bad} is refused");
        }
    }

    #[test]
    fn test_tool_flags_default_to_the_reference_paths_in_both_modes() {
        let defaults = crate::testrunner::Commands::default();
        for mode in ["agent", "standalone"] {
            let base: &[&str] = match mode {
                "agent" => &["gpu-operator", "agent", "--node-name", "n"],
                _ => &["gpu-operator", "standalone"],
            };
            let cli = Cli::try_parse_from(base).unwrap();
            let tools = match cli.command {
                Command::Agent(args) => args.test_tools,
                Command::Standalone(args) => args.test_tools,
                _ => panic!("{mode} parses as {mode}"),
            };
            let commands = tools.commands(crate::testrunner::AllowedCommands::None);
            assert_eq!(commands, defaults, "{mode}");
            let flags = [
                "--rvs",
                "/usr/local/bin/rvs",
                "--rvs-conf-dir",
                "/etc/rvs",
                "--agfhc",
                "/srv/agfhc/agfhc",
            ];
            let cli = Cli::try_parse_from(base.iter().chain(&flags)).unwrap();
            let tools = match cli.command {
                Command::Agent(args) => args.test_tools,
                Command::Standalone(args) => args.test_tools,
                _ => panic!("{mode} parses as {mode}"),
            };
            let commands = tools.commands(crate::testrunner::AllowedCommands::None);
            assert_eq!(
                (
                    commands.rvs.as_path(),
                    commands.rvs_conf_dir.as_path(),
                    commands.agfhc.as_path()
                ),
                (
                    Path::new("/usr/local/bin/rvs"),
                    Path::new("/etc/rvs"),
                    Path::new("/srv/agfhc/agfhc")
                ),
                "{mode}"
            );
            assert_eq!(commands.rvs_results_dir, defaults.rvs_results_dir);
        }
    }
}
