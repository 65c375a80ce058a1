//! `gpu-operator standalone`: the node services without Kubernetes (bare
//! metal, under systemd).
//!
//! It owns the subcommand's arguments, the simulated host of `--simulate`, and
//! the systemd notifications; the services are run by `agent::standalone`.
//! It must not run a service itself; the `--show-metrics` table is drawn in
//! `output`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::args::{DriverLoadArgs, HostRootArg, SamplingArgs, host_name, read_optional};
use super::output::{fail, show_live_metrics};
use super::runtime::{run_to_end, shutdown_on_signals};
use crate::host::HostRoot;
use crate::simulate;

#[derive(Args, Debug)]
pub struct StandaloneArgs {
    /// DeviceConfig spec to follow (default: metrics and health on).
    #[arg(long, value_name = "FILE", env = "GPU_OPERATOR_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub host: HostRootArg,
    /// Simulate a host of this profile in a temporary directory (mi300x,
    /// mi250x, mi210, radeon-w7900, mi300x-vf) and use it as the host root;
    /// its telemetry moves over time. Ignores --host-root.
    #[arg(long, value_name = "PROFILE")]
    pub simulate: Option<String>,
    /// Partition mode of the simulated host, e.g. cpx_nps4.
    #[arg(long, value_name = "COMPUTE_MEMORY", requires = "simulate")]
    pub partition: Option<String>,
    /// The kubelet's root directory; the device plugin runs only if its
    /// device-plugins/ exists.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,
    /// Address of the metrics endpoint, overriding metricsExporter.port.
    #[arg(long, value_name = "ADDR")]
    pub metrics_bind: Option<std::net::SocketAddr>,
    /// Append Events here as JSON lines [default: /var/log/gpu-operator/events.jsonl,
    /// or events.jsonl in the simulated host's directory with --simulate].
    #[arg(long, value_name = "FILE")]
    pub events_file: Option<PathBuf>,
    /// The exporter's config.json (Fields, Labels, HealthThresholds...).
    #[arg(long, value_name = "FILE")]
    pub metrics_config: Option<PathBuf>,
    /// The test runner's config.json.
    #[arg(long, value_name = "FILE")]
    pub test_config: Option<PathBuf>,
    /// Name used as the `hostname` metric label (default: this host's name).
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// Print a live table of every GPU's readings every 5 s (what /gpumetrics
    /// serves, read in process, so it works whatever rbacConfig says).
    #[arg(long)]
    pub show_metrics: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub health_socket: super::args::HealthSocketArgs,
    /// Let COMMAND tests of the test runner start this program, or any program
    /// under this directory (repeatable). Without it COMMAND tests are refused:
    /// the programs are named by a ConfigMap and would run as root on the node.
    /// RVS and AGFHC recipes need no entry.
    #[arg(long = "allow-test-command", value_name = "DIR_OR_PATH")]
    pub allow_test_command: Vec<PathBuf>,
    #[command(flatten)]
    pub test_tools: super::args::TestToolArgs,
    #[command(flatten)]
    pub driver: DriverLoadArgs,
    /// A partition profile to apply before the services start, as
    /// `gpu-operator partition apply` does (the GPU client systemd services
    /// of the profile set stopped meanwhile, with --systemctl). A profile
    /// that does not fit, or a change that fails, is logged and the services
    /// start on the GPUs as they are.
    #[arg(long, value_name = "NAME", env = "GPU_OPERATOR_PARTITION_PROFILE")]
    pub partition_profile: Option<String>,
    /// The partition profiles, a config.json in the reference's format;
    /// without it the built-in profiles.
    #[arg(long, value_name = "FILE", requires = "partition_profile")]
    pub partition_config: Option<PathBuf>,
    /// systemctl, for --partition-profile; "none" leaves services alone.
    #[arg(long, value_name = "PATH", default_value = "/usr/bin/systemctl")]
    pub systemctl: PathBuf,
}

pub fn run(args: StandaloneArgs) -> ExitCode {
    let spec = match &args.config {
        Some(path) => match crate::agent::standalone::read_config(path) {
            Ok(spec) => spec,
            Err(e) => return fail(e, 2),
        },
        None => crate::agent::standalone::default_spec(),
    };
    let (metrics_config, test_config) = match (
        read_optional(args.metrics_config.as_ref()),
        read_optional(args.test_config.as_ref()),
    ) {
        (Ok(m), Ok(t)) => (m, t),
        (Err(e), _) | (_, Err(e)) => return fail(e, 2),
    };
    // A simulated host lives in a temporary directory for as long as we run.
    let mut _sim_dir = None;
    let (host, simulate) = match &args.simulate {
        Some(profile) => {
            let spec = match simulate::SimSpec::new(profile, None, args.partition.as_deref()) {
                Ok(spec) => spec,
                Err(e) => return fail(e, 2),
            };
            let dir = match tempfile::Builder::new()
                .prefix("gpu-operator-sim-")
                .tempdir()
            {
                Ok(dir) => dir,
                Err(e) => return fail(format!("cannot create a temporary directory: {e}"), 1),
            };
            let host = HostRoot::new(dir.path());
            if let Err(e) = simulate::write_host(&host, &spec) {
                return fail(e, 1);
            }
            eprintln!(
                "simulated {} host in {}",
                spec.profile.name,
                dir.path().display()
            );
            _sim_dir = Some(dir);
            (host, Some(spec))
        }
        None => match args.host.open() {
            Ok(host) => (host, None),
            Err(message) => return fail(message, 2),
        },
    };
    let partition = match &args.partition_profile {
        None => None,
        Some(name) => {
            let set = match super::partition::load_profiles(args.partition_config.as_deref()) {
                Ok(set) => set,
                Err(e) => return fail(e, 2),
            };
            let local = crate::partition::local::LocalConfig {
                store: simulate::kernel::store_for(&host),
                host: host.clone(),
                systemctl: (args.systemctl != std::path::Path::new("none"))
                    .then(|| args.systemctl.clone()),
                limits: crate::partition::Limits::default(),
            };
            Some((name.clone(), set, local))
        }
    };
    let events_file = args.events_file.unwrap_or_else(|| match &_sim_dir {
        Some(dir) => dir.path().join("events.jsonl"),
        None => PathBuf::from(crate::agent::standalone::DEFAULT_EVENTS_FILE),
    });
    let config =
        crate::agent::standalone::StandaloneConfig {
            host,
            spec,
            node_name: args.node_name.unwrap_or_else(host_name),
            kubelet_dir: args.kubelet_dir,
            events_file: Some(events_file),
            metrics_listen: args.metrics_bind,
            metrics_config,
            test_config,
            rescan_interval: args.sampling.rescan_interval,
            sampling: args.sampling.sampling(),
            simulate,
            test_commands: args.test_tools.commands(
                crate::testrunner::AllowedCommands::from_flags(args.allow_test_command),
            ),
            // No leader asks a standalone host to reboot.
            driver: args.driver.manager_config(None),
            health_socket: args.health_socket.path(),
        };
    let show_metrics = args.show_metrics;
    run_to_end(async move {
        if let Some((name, set, local)) = partition {
            match crate::partition::local::apply_profile(&local, &set, &name).await {
                Ok(outcome) => tracing::info!(
                    profile = %name,
                    changed = outcome.changed.len(),
                    partitions = outcome.partitions,
                    "partition profile applied"
                ),
                Err(e) => {
                    tracing::error!(profile = %name, error = %e, "partition profile not applied; starting on the GPUs as they are")
                }
            }
        }
        let shutdown = shutdown_on_signals();
        let show_stop = shutdown.clone();
        let ready = move |started: crate::agent::standalone::Started| {
            if let Err(e) = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
                tracing::warn!(error = %e, "cannot notify systemd");
            }
            match (show_metrics, started.listening) {
                (true, Some(_)) => {
                    tokio::spawn(show_live_metrics(started.published, show_stop));
                }
                (true, None) => eprintln!("--show-metrics: the metrics exporter is not running"),
                _ => {}
            }
        };
        let result = crate::agent::standalone::run_observed(config, shutdown, ready).await;
        let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(e, 1),
        }
    })
}
