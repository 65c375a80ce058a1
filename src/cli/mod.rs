//! The command line: one subcommand per job, each with help a user can act on.
//!
//! This module owns the `Cli` and `Command` types clap parses and the dispatch
//! to the subcommands, one file each. It must not hold logic of its own: each
//! subcommand hands over to its module; shared arguments are in [`args`],
//! printing in [`output`], logging set-up in [`logging`], the async runtime
//! and signal handling in [`runtime`].

pub mod agent;
pub mod args;
pub mod check;
pub mod detect;
pub mod discover;
pub mod driver;
pub mod install;
pub mod leader;
pub mod logging;
pub mod output;
pub mod partition;
pub mod runtime;
pub mod simulate;
pub mod standalone;
pub mod upgrade;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use self::agent::AgentArgs;
use self::check::CheckArgs;
use self::discover::DiscoverArgs;
use self::driver::DriverArgs;
use self::leader::LeaderArgs;
use self::logging::LogFormat;
use self::partition::PartitionArgs;
use self::simulate::SimulateArgs;
use self::standalone::StandaloneArgs;
use self::upgrade::UpgradeArgs;

#[derive(Parser, Debug)]
#[command(
    name = "gpu-operator",
    version,
    about = "Runs AMD Instinct and Radeon GPUs on Kubernetes and on bare metal",
    long_about = "Runs AMD Instinct and Radeon GPUs on Kubernetes and on bare metal.\n\n\
        One binary does the node work (discovery, device plugin, labels, metrics, health) \
        and, on the elected agent, reconciles DeviceConfig resources cluster-wide.\n\n\
        Try it without a GPU:\n  \
        gpu-operator simulate --profile mi300x --partition cpx_nps4 --out /tmp/h\n  \
        gpu-operator discover --host-root /tmp/h"
)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "GPU_OPERATOR_LOG_FORMAT")]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// List the AMD GPUs on this host, their partitions and links.
    ///
    /// Reads sysfs and the KFD topology under the host root. Problems with single
    /// GPUs are reported in the output, not as failures; the exit code is non-zero
    /// only when the host root itself cannot be read.
    Discover(DiscoverArgs),
    /// Write a simulated GPU host (sysfs, devfs, /sys/module/amdgpu) into a directory.
    ///
    /// Every other subcommand reads the result exactly as it reads a real host:
    /// pass the directory as --host-root. Writing again into the same directory
    /// replaces the simulated GPUs, which is how to repartition or hot-add.
    #[command(after_long_help = simulate::FAULTS_HELP)]
    Simulate(SimulateArgs),
    /// Run the node agent (normally as a DaemonSet pod on every GPU node).
    ///
    /// Watches its own Node and the DeviceConfigs, runs the services that the
    /// DeviceConfig selecting this node enables (device plugin, node labeller),
    /// and publishes its status in the Node annotation amd.com/gpu-agent-status.
    /// Kubernetes access comes from the in-cluster service account, or KUBECONFIG.
    /// Stops cleanly on SIGTERM or SIGINT.
    Agent(AgentArgs),
    /// Run the node services without Kubernetes (bare metal, under systemd).
    ///
    /// Reads a DeviceConfig spec from --config (a whole DeviceConfig, a document
    /// with just `spec:`, or the bare spec) and runs what it enables: GPU metrics
    /// and health on the metrics port, the test runner, and the device plugin if
    /// a kubelet device-plugin directory exists. Without --config, metrics and
    /// health run with defaults. Events go to the log and to --events-file as
    /// JSON lines. Tells systemd it is ready (Type=notify) once serving.
    ///
    /// Try it without a GPU: gpu-operator standalone --simulate mi300x
    Standalone(StandaloneArgs),
    /// Check the GPUs once, and optionally run a test recipe; exit non-zero if any
    /// GPU is unhealthy, no GPU is found, or the test fails.
    ///
    /// For scripts and cron on a node: the same checks as the health monitor
    /// (presence, device nodes, uncorrectable ECC, junction temperature, PCIe
    /// link), then, with --recipe, the test (e.g. rvs gst_single). A node with
    /// no GPU bound to amdgpu (driver not loaded, say) fails the check: a GPU
    /// node that shows none is not healthy.
    ///
    /// Exit status: 0 all healthy (and the test passed), 1 a GPU is unhealthy,
    /// none is found, or the test failed, 2 the test timed out or an argument is
    /// bad, 3 the test could not be run, 4 the test tool cannot be started
    /// (missing or not executable: nothing was tested, see --rvs).
    Check(CheckArgs),
    /// The amdgpu driver: what this host runs (`status`), whether a driver
    /// bundle exists and verifies for a kernel (`check`, before a reboot), and
    /// putting bundles in the store (`manifest`, `import`, `fetch`).
    ///
    /// The agent loads drivers from this store itself (spec.driver.enable);
    /// the leader rolls upgrades across nodes (spec.driver.upgradePolicy;
    /// `gpu-operator upgrade status` shows where each node stands).
    Driver(DriverArgs),
    /// GPU partitioning: each GPU's modes (`show`), and a partition profile
    /// applied to this host (`apply`), as the reference's device config
    /// manager's profiles describe them.
    ///
    /// On Kubernetes nodes, label the Node dcm.amd.com/gpu-config-profile=<name>
    /// instead; see docs/partitioning.md.
    Partition(PartitionArgs),
    /// Rolling driver upgrades across the cluster: `status` prints where
    /// each node stands, and what blocks it.
    Upgrade(UpgradeArgs),
    /// Run only the cluster role: reconcile DeviceConfigs, without node work.
    ///
    /// Normally every agent campaigns for this role itself. This runs it alone,
    /// for debugging and benchmarks: with --lease-namespace it campaigns like an
    /// agent does; without, it leads unconditionally (do not run it beside agents).
    Leader(LeaderArgs),
    /// Print the DeviceConfig CustomResourceDefinition as YAML, or (--apply)
    /// apply both of the operator's CRDs to the cluster.
    ///
    /// The output is the same as deploy/crd/deviceconfigs.amd.com.yaml; apply it
    /// with `gpu-operator crd | kubectl apply -f -`. With --apply the binary
    /// applies the DeviceConfig and RemediationWorkflowStatus CRDs itself
    /// (server-side), as the Helm chart's pre-upgrade hook does; with
    /// --refuse-while-upgrading it first refuses (exit 3) while a driver
    /// upgrade is pending or in progress.
    Crd(crate::api::cli::CrdArgs),
    /// Delete this namespace's DeviceConfigs and wait until the leader has
    /// cleaned every Node of them (the Helm chart's pre-delete hook).
    Uninstall(install::UninstallArgs),
    /// Label this Node as Node Feature Discovery would for its AMD GPUs, for
    /// clusters without NFD (the Helm chart's gpu-operator-detect DaemonSet).
    Detect(detect::DetectArgs),
    /// Check DeviceConfig YAML files without a cluster.
    ///
    /// Each file may hold several documents; documents of other kinds are skipped.
    /// Every problem is printed with its file, document index and field path, with
    /// notes on fields that are accepted but ignored in this design. Exit status:
    /// 0 when every file is valid, 1 when a file has problems, 2 when a file cannot
    /// be read or parsed (the error names its line and column).
    Validate(crate::api::cli::ValidateArgs),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init_logging(cli.log_format);
    match cli.command {
        Command::Discover(args) => discover::run(args),
        Command::Simulate(args) => simulate::run(args),
        Command::Agent(args) => agent::run(args),
        Command::Leader(args) => leader::run(args),
        Command::Standalone(args) => standalone::run(args),
        Command::Check(args) => check::run(args),
        Command::Driver(args) => driver::run(args),
        Command::Upgrade(args) => upgrade::run(args),
        Command::Partition(args) => partition::run(args),
        Command::Crd(args) if args.apply => install::run_apply(args),
        Command::Crd(args) => crate::api::cli::run_crd(args),
        Command::Uninstall(args) => install::run_uninstall(args),
        Command::Detect(args) => detect::run(args),
        Command::Validate(args) => crate::api::cli::run_validate(args),
    }
}
