//! The command line: one subcommand per job, each with help a user can act on.
//!
//! This module owns argument parsing, logging set-up and printing. It must not
//! hold logic of its own: each subcommand hands over to its module.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::device::{self, Inventory};
use crate::host::HostRoot;
use crate::simulate;

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

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
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
    /// Run only the cluster role: reconcile DeviceConfigs, without node work.
    ///
    /// Normally every agent campaigns for this role itself. This runs it alone,
    /// for debugging and benchmarks: with --lease-namespace it campaigns like an
    /// agent does; without, it leads unconditionally (do not run it beside agents).
    Leader(LeaderArgs),
    /// Print the DeviceConfig CustomResourceDefinition as YAML.
    ///
    /// The output is the same as deploy/crd/deviceconfigs.amd.com.yaml; apply it
    /// with `gpu-operator crd | kubectl apply -f -`.
    Crd(crate::api::cli::CrdArgs),
    /// Check DeviceConfig YAML files without a cluster.
    ///
    /// Each file may hold several documents; documents of other kinds are skipped.
    /// Every problem is printed with its file, document index and field path, with
    /// notes on fields that are accepted but ignored in this design. Exit status:
    /// 0 when every file is valid, 1 when a file has problems, 2 when a file cannot
    /// be read or parsed (the error names its line and column).
    Validate(crate::api::cli::ValidateArgs),
}

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

#[derive(Args, Debug)]
pub struct DiscoverArgs {
    #[command(flatten)]
    pub host: HostRootArg,
    /// `table` for people, `json` for tools (shape documented in README).
    #[arg(long, short, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// Machine to simulate: mi300x, mi250x, mi210, radeon-w7900 or mi300x-vf.
    #[arg(long, value_name = "NAME", value_parser = clap::builder::PossibleValuesParser::new(simulate::PROFILES.iter().map(|p| p.name)))]
    pub profile: String,
    /// Directory to write into: empty, new, or written by an earlier `simulate`.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Number of GPUs as discovery reports them (an MI250X card counts as two).
    /// Defaults to the profile's usual count.
    // Negative numbers are parsed as values, so that `--gpus -1` is a range error
    // rather than an unknown argument; each profile checks its own maximum.
    #[arg(long, value_name = "N", allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(1..=simulate::MAX_GPUS as i64))]
    pub gpus: Option<i64>,
    /// Partition mode of partitionable profiles, COMPUTE_MEMORY, e.g. cpx_nps4 or
    /// spx_nps1 (the default).
    #[arg(long, value_name = "COMPUTE_MEMORY")]
    pub partition: Option<String>,
    /// Give one GPU its own partition mode, INDEX=COMPUTE_MEMORY (e.g. 0=cpx_nps4),
    /// to simulate a heterogeneous node. Repeatable.
    #[arg(long, value_name = "INDEX=COMPUTE_MEMORY")]
    pub gpu_partition: Vec<String>,
    /// Simulate the GPUs with no amdgpu driver bound (no module, KFD or DRM nodes).
    #[arg(long)]
    pub no_driver: bool,
}

#[derive(Args, Debug)]
pub struct AgentArgs {
    /// Name of the Node this agent runs on (the DaemonSet sets it from the downward API).
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: String,
    #[command(flatten)]
    pub host: HostRootArg,
    /// The kubelet's root directory; device plugin sockets live in its
    /// `device-plugins/` unless the DeviceConfig's kubeletSocketPath says otherwise.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/kubelet",
        env = "KUBELET_DIR"
    )]
    pub kubelet_dir: PathBuf,
    /// Watch DeviceConfigs in this namespace only; all namespaces when unset.
    #[arg(long, value_name = "NS", env = "WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Namespace of the leader-election Lease (normally the agent's own, from the
    /// downward API). Without it the agent does node work only and never leads.
    #[arg(long, value_name = "NS", env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// This pod's name; with the node name it forms the leader identity.
    #[arg(long, value_name = "NAME", env = "POD_NAME", default_value = "agent")]
    pub pod_name: String,
    /// Seconds a leader's lease stays valid without renewal.
    #[arg(long, value_name = "SECONDS", default_value_t = 15)]
    pub lease_duration: u64,
    /// Seconds between lease renewals by the leader.
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    pub lease_renew: u64,
    /// Do not campaign for the cluster role even when --lease-namespace is set.
    #[arg(long)]
    pub no_leader_election: bool,
    /// Address of the metrics and probe endpoint, overriding
    /// metricsExporter.port (e.g. 127.0.0.1:5000 to keep it off other interfaces).
    #[arg(long, value_name = "ADDR")]
    pub metrics_bind: Option<std::net::SocketAddr>,
    /// Let COMMAND tests of the test runner start this program, or any program
    /// under this directory (repeatable). Without it COMMAND tests are refused:
    /// the programs are named by a ConfigMap and would run as root on the node.
    /// RVS and AGFHC recipes need no entry.
    #[arg(long = "allow-test-command", value_name = "DIR_OR_PATH")]
    pub allow_test_command: Vec<PathBuf>,
    /// As leader, also report Secrets a DeviceConfig names that do not exist.
    /// Needs the optional Role deploy/optional/secret-references.yaml: by
    /// default the agents may not read Secrets.
    #[arg(long)]
    pub check_secret_references: bool,
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
    /// Seconds between health samples.
    #[arg(long, value_name = "SECONDS", default_value = "0.25", value_parser = positive_seconds)]
    pub health_interval: Duration,
    /// Consecutive bad health samples before a GPU is marked Unhealthy.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub unhealthy_after: u32,
    /// Consecutive good health samples before an Unhealthy GPU is Healthy again.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub healthy_after: u32,
}

impl SamplingArgs {
    fn sampling(&self) -> crate::agent::select::Sampling {
        crate::agent::select::Sampling {
            metrics_interval: self.metrics_interval,
            health_interval: self.health_interval,
            damping: crate::health::Damping {
                unhealthy_after: self.unhealthy_after,
                healthy_after: self.healthy_after,
            },
        }
    }
}

/// A positive, finite number of seconds (fractions allowed), as clap parses
/// a flag value.
fn positive_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    crate::api::syntax::positive_seconds(seconds).map_err(|why| format!("{text}: {why}"))
}

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
    /// Let COMMAND tests of the test runner start this program, or any program
    /// under this directory (repeatable). Without it COMMAND tests are refused:
    /// the programs are named by a ConfigMap and would run as root on the node.
    /// RVS and AGFHC recipes need no entry.
    #[arg(long = "allow-test-command", value_name = "DIR_OR_PATH")]
    pub allow_test_command: Vec<PathBuf>,
}

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
}

#[derive(Args, Debug)]
pub struct LeaderArgs {
    /// Namespace of the leader-election Lease; without it, lead unconditionally.
    #[arg(long, value_name = "NS", env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Identity in the Lease.
    #[arg(long, value_name = "ID", default_value = "standalone-leader")]
    pub identity: String,
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Command::Discover(args) => run_discover(args),
        Command::Simulate(args) => run_simulate(args),
        Command::Agent(args) => run_agent(args),
        Command::Leader(args) => run_leader(args),
        Command::Standalone(args) => run_standalone(args),
        Command::Check(args) => run_check(args),
        Command::Crd(args) => crate::api::cli::run_crd(args),
        Command::Validate(args) => crate::api::cli::run_validate(args),
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(log_colour(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
            std::env::var_os("NO_COLOR").as_deref(),
        ))
        .with_writer(std::io::stderr);
    // A second initialisation (in tests) is harmless, so its error is ignored.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Colour in logs only on a terminal, and never when `NO_COLOR` is set to
/// anything but the empty string (<https://no-color.org>): files, pipes and
/// journald get plain text.
pub fn log_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Prints `error: <message>` and returns the given exit code.
pub fn fail(message: impl std::fmt::Display, code: u8) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(code)
}

fn run_discover(args: DiscoverArgs) -> ExitCode {
    let host = match args.host.open() {
        Ok(host) => host,
        Err(message) => return fail(message, 2),
    };
    let inventory = device::discover(&host);
    for warning in &inventory.warnings {
        tracing::warn!(%warning, "discovery");
    }
    let unbound = device::unbound::unbound_amd_gpus(&host);
    match args.output {
        OutputFormat::Json => {
            let mut json = match serde_json::to_value(&inventory) {
                Ok(json) => json,
                Err(e) => return fail(format!("cannot encode inventory: {e}"), 1),
            };
            json["unbound"] = serde_json::json!(unbound);
            println!(
                "{}",
                serde_json::to_string_pretty(&json).unwrap_or_default()
            );
        }
        OutputFormat::Table => {
            print!("{}", inventory_table(&inventory));
            print!("{}", unbound_lines(&unbound));
        }
    }
    ExitCode::SUCCESS
}

/// The AMD GPUs that amdgpu does not serve, one line each, for a person.
pub fn unbound_lines(unbound: &[device::unbound::UnboundGpu]) -> String {
    let mut out = String::new();
    if !unbound.is_empty() {
        let _ = writeln!(
            out,
            "{} AMD GPU(s) not bound to amdgpu, so not listed above:",
            unbound.len()
        );
    }
    for gpu in unbound {
        let _ = writeln!(out, "  {gpu}");
    }
    out
}

/// One row per GPU, its partitions beneath, then problems.
pub fn inventory_table(inventory: &Inventory) -> String {
    let mut out = String::new();
    let driver = &inventory.driver;
    let _ = writeln!(
        out,
        "driver: {} (version {}, /dev/kfd {})",
        if driver.loaded {
            "loaded"
        } else {
            "not loaded"
        },
        driver.version.as_deref().unwrap_or("inbox/unknown"),
        if driver.kfd_present {
            "present"
        } else {
            "absent"
        },
    );
    let _ = writeln!(out, "{} GPU(s)", inventory.gpus.len());
    if inventory.gpus.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "{:<13} {:<24} {:<6} {:>4} {:>5} {:>7} {:>4} {:>7} {:>5} {:<8} {:<10} {:<20}",
        "BDF",
        "PRODUCT",
        "DEVICE",
        "NUMA",
        "CARD",
        "RENDER",
        "KFD",
        "VRAM",
        "CUS",
        "PARTS",
        "GFX",
        "HIVE"
    );
    let opt = |v: Option<u32>| v.map_or("-".to_owned(), |v| v.to_string());
    for gpu in &inventory.gpus {
        let _ = writeln!(
            out,
            "{:<13} {:<24} {:<6} {:>4} {:>5} {:>7} {:>4} {:>7} {:>5} {:<8} {:<10} {:<20}",
            gpu.bdf,
            gpu.product_name.as_deref().unwrap_or("-"),
            format!("{:04x}", gpu.device_id),
            gpu.numa_node.map_or("-".to_owned(), |n| n.to_string()),
            opt(gpu.card),
            opt(gpu.render_minor),
            opt(gpu.kfd_node),
            gpu.vram_bytes
                .map_or("-".to_owned(), |b| format!("{}G", b >> 30)),
            opt(gpu.cu_count),
            gpu.partition_profile().unwrap_or_else(|| "-".into()),
            gpu.gfx_target_version
                .map_or("-".to_owned(), device::gfx_target_name),
            gpu.hive_id.map_or("-".to_owned(), |h| h.to_string()),
        );
        for part in &gpu.partitions {
            let _ = writeln!(
                out,
                "  partition {:<2} card {:>3}  render {:>3}  kfd {:>3}",
                part.id,
                opt(part.card),
                opt(part.render_minor),
                opt(part.kfd_node),
            );
        }
        if !gpu.links.is_empty() {
            let xgmi = gpu
                .links
                .iter()
                .filter(|l| l.kind == device::LinkKind::Xgmi)
                .count();
            let _ = writeln!(
                out,
                "  links: {} xgmi, {} other",
                xgmi,
                gpu.links.len() - xgmi
            );
        }
        for problem in &gpu.problems {
            let _ = writeln!(out, "  problem: {problem}");
        }
    }
    for warning in &inventory.warnings {
        let _ = writeln!(out, "warning: {warning}");
    }
    out
}

fn run_simulate(args: SimulateArgs) -> ExitCode {
    // clap has checked the range, so the count is positive.
    let gpus = args.gpus.and_then(|n| usize::try_from(n).ok());
    let mut spec = match simulate::SimSpec::new(&args.profile, gpus, args.partition.as_deref()) {
        Ok(spec) => spec,
        Err(e) => return fail(e, 2),
    };
    spec.driver_loaded = !args.no_driver;
    for entry in &args.gpu_partition {
        let parsed = entry
            .split_once('=')
            .and_then(|(index, mode)| Some((index.parse::<usize>().ok()?, mode)));
        let Some((index, mode)) = parsed else {
            return fail(
                format!("--gpu-partition {entry:?}: expected INDEX=COMPUTE_MEMORY"),
                2,
            );
        };
        spec = match spec.with_gpu_partition(index, mode) {
            Ok(spec) => spec,
            Err(e) => return fail(e, 2),
        };
    }
    let host = HostRoot::new(&args.out);
    match simulate::write_host(&host, &spec) {
        Ok(summary) => {
            // Without a driver there is no KFD topology: say so rather than count
            // nodes that were not written.
            let nodes = if spec.driver_loaded {
                format!("{} KFD GPU node(s)", summary.partitions)
            } else {
                "no driver bound (no KFD or DRM nodes)".to_owned()
            };
            println!(
                "simulated {} with {} GPU(s), {nodes}, {} files in {}",
                spec.profile.name,
                summary.gpus,
                summary.files,
                args.out.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(e, 1),
    }
}

/// Builds the async runtime the long-running subcommands use.
fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}

/// Runs a subcommand's future to its end, then gives the runtime at most
/// [`RUNTIME_SHUTDOWN`] to wind down: a blocking thread stuck on a hung sysfs
/// read must not keep the process alive after its work is done.
fn run_to_end(
    runtime: tokio::runtime::Runtime,
    work: impl std::future::Future<Output = ExitCode>,
) -> ExitCode {
    let code = runtime.block_on(work);
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
    code
}

/// How long a finished subcommand waits for its runtime's tasks and threads.
const RUNTIME_SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a shutdown may take after the first signal before the process
/// exits outright.
const SHUTDOWN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// A token cancelled on SIGTERM or SIGINT. A second signal, or 5 s after the
/// first, exits the process outright so that a stuck shutdown cannot hang a
/// node drain. The 5 s timer is an OS thread, not a task: it fires even when
/// the runtime itself is stuck or being dropped.
pub fn shutdown_on_signals() -> tokio_util::sync::CancellationToken {
    use tokio::signal::unix::{SignalKind, signal};
    let token = tokio_util::sync::CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers; stop with SIGKILL");
            return;
        };
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::info!("shutdown requested");
        cancel.cancel();
        std::thread::spawn(|| {
            std::thread::sleep(SHUTDOWN_DEADLINE);
            eprintln!("error: shutdown did not finish within {SHUTDOWN_DEADLINE:?}; exiting");
            std::process::exit(1);
        });
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::error!("second signal during shutdown; exiting");
        std::process::exit(1);
    });
    token
}

fn run_agent(args: AgentArgs) -> ExitCode {
    let host = match args.host.open() {
        Ok(host) => host,
        Err(message) => return fail(message, 2),
    };
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(message) => return fail(message, 1),
    };
    run_to_end(runtime, async move {
        let client = match kube::Client::try_default().await {
            Ok(client) => client,
            Err(e) => {
                return fail(
                    format!("cannot reach Kubernetes (in-cluster config or KUBECONFIG): {e}"),
                    1,
                );
            }
        };
        let leader = match (&args.lease_namespace, args.no_leader_election) {
            (Some(namespace), false) => {
                if args.lease_renew == 0 || args.lease_renew >= args.lease_duration {
                    return fail(
                        "--lease-renew must be positive and shorter than --lease-duration",
                        2,
                    );
                }
                let mut lease = crate::cluster::lease::LeaseConfig::new(
                    namespace.clone(),
                    format!("{}/{}", args.node_name, args.pod_name),
                );
                lease.duration = std::time::Duration::from_secs(args.lease_duration);
                lease.renew_every = std::time::Duration::from_secs(args.lease_renew);
                Some(crate::agent::LeaderConfig {
                    lease,
                    cluster: crate::cluster::ClusterConfig {
                        instance: args.node_name.clone(),
                        check_secret_references: args.check_secret_references,
                        ..Default::default()
                    },
                })
            }
            _ => None,
        };
        let config = crate::agent::AgentConfig {
            leader,
            metrics_listen: args.metrics_bind,
            test_commands: Some(crate::testrunner::Commands {
                allowed: crate::testrunner::AllowedCommands::from_flags(args.allow_test_command),
                ..Default::default()
            }),
            node_name: args.node_name,
            namespace: args.namespace,
            host,
            kubelet_dir: args.kubelet_dir,
            rescan_interval: args.sampling.rescan_interval,
            sampling: args.sampling.sampling(),
        };
        match crate::agent::run(client, config, shutdown_on_signals()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(e, 1),
        }
    })
}

fn run_leader(args: LeaderArgs) -> ExitCode {
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(message) => return fail(message, 1),
    };
    run_to_end(runtime, async move {
        let client = match kube::Client::try_default().await {
            Ok(client) => client,
            Err(e) => {
                return fail(
                    format!("cannot reach Kubernetes (in-cluster config or KUBECONFIG): {e}"),
                    1,
                );
            }
        };
        let shutdown = shutdown_on_signals();
        let config = crate::cluster::ClusterConfig {
            namespace: args.lease_namespace.clone(),
            ..Default::default()
        };
        match args.lease_namespace {
            Some(namespace) => {
                let lease = crate::cluster::lease::LeaseConfig::new(namespace, args.identity);
                crate::cluster::ClusterRole::start(client, lease, config, shutdown)
                    .finished()
                    .await;
            }
            None => {
                tracing::warn!("no --lease-namespace: leading unconditionally");
                let (_tx, leading) = tokio::sync::watch::channel(true);
                crate::cluster::run(
                    client,
                    config,
                    leading,
                    crate::cluster::lease::LeaderGuard::always(),
                    shutdown,
                )
                .await;
            }
        }
        ExitCode::SUCCESS
    })
}

/// This machine's host name, for the `hostname` label.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

fn read_optional(path: Option<&PathBuf>) -> Result<Option<String>, String> {
    path.map(|p| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display())))
        .transpose()
}

fn run_standalone(args: StandaloneArgs) -> ExitCode {
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
    let events_file = args.events_file.unwrap_or_else(|| match &_sim_dir {
        Some(dir) => dir.path().join("events.jsonl"),
        None => PathBuf::from(crate::agent::standalone::DEFAULT_EVENTS_FILE),
    });
    let config = crate::agent::standalone::StandaloneConfig {
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
        test_commands: crate::testrunner::AllowedCommands::from_flags(args.allow_test_command),
    };
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(message) => return fail(message, 1),
    };
    let show_metrics = args.show_metrics;
    run_to_end(runtime, async move {
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

fn run_check(args: CheckArgs) -> ExitCode {
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
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(message) => return fail(message, 1),
    };
    // Everything check does is bounded; this is the promise over the sum.
    let deadline = args
        .deadline
        .unwrap_or(CHECK_DEADLINE + args.timeout.unwrap_or_default());
    let work = async move {
        let inventory = device::discover(&host);
        let snapshot = match crate::health::check_once(
            &host,
            &inventory,
            metrics_config.as_deref(),
            std::time::Duration::from_secs(2),
        )
        .await
        {
            Ok(snapshot) => snapshot,
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
            let why = if inventory.driver.loaded {
                "none is bound to amdgpu"
            } else {
                "the amdgpu driver is not loaded"
            };
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
    run_to_end(runtime, async move {
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

/// `check`'s exit status when the test tool cannot be started.
const TOOL_UNAVAILABLE_EXIT: u8 = 4;

/// Prints a table of every GPU's readings every 5 s, from what `/gpumetrics`
/// serves, read in process (so it works whatever the endpoint's access
/// control).
async fn show_live_metrics(
    published: tokio::sync::watch::Receiver<std::sync::Arc<crate::metrics::server::Published>>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut ticker = tokio::time::interval(std::time::Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let latest = published.borrow().clone();
        if !latest.ready {
            eprintln!("waiting for the first sample…");
            continue;
        }
        match serde_json::from_slice::<serde_json::Value>(&latest.json) {
            Ok(view) => {
                // Each frame says when it was taken, to the second, in UTC.
                let now = k8s_openapi::jiff::Timestamp::now();
                let now = now.round(k8s_openapi::jiff::Unit::Second).unwrap_or(now);
                print!("{}", live_frame(&now.to_string(), &view));
            }
            Err(e) => eprintln!("cannot read the exporter's GPU view: {e}"),
        }
    }
}

/// A `--show-metrics` frame: the time it was taken, then the table.
pub fn live_frame(time: &str, view: &serde_json::Value) -> String {
    format!("-- {time} --\n{}", live_table(view))
}

/// One line per GPU (partition 0 of partitioned GPUs) from a `/gpumetrics` view.
pub fn live_table(view: &serde_json::Value) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>4} {:<13} {:<8} {:>7} {:>8} {:>7} {:>6} {:>13}",
        "GPU", "BDF", "HEALTH", "EDGE°C", "JUNCT°C", "POWER W", "GFX %", "VRAM USED GiB"
    );
    let number = |v: &serde_json::Value| v.as_f64().map_or("-".to_owned(), |n| format!("{n:.1}"));
    for gpu in view["gpus"].as_array().into_iter().flatten() {
        if gpu["partition_id"].as_u64().unwrap_or(0) != 0 {
            continue;
        }
        let r = &gpu["readings"];
        let vram = r["memory"]["vram_used"]
            .as_f64()
            .map_or("-".to_owned(), |b| {
                format!("{:.1}", b / f64::from(1u32 << 30))
            });
        let _ = writeln!(
            out,
            "{:>4} {:<13} {:<8} {:>7} {:>8} {:>7} {:>6} {:>13}",
            gpu["gpu_id"]
                .as_u64()
                .map_or("-".to_owned(), |id| id.to_string()),
            gpu["bdf"].as_str().unwrap_or("-"),
            if gpu["healthy"].as_bool().unwrap_or(false) {
                "healthy"
            } else {
                "UNHEALTHY"
            },
            number(&r["temperature"]["edge_c"]),
            number(&r["temperature"]["junction_c"]),
            number(&r["power"]["average_w"]),
            number(&r["gfx_activity_pct"]),
            vram,
        );
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(log_colour(true, None));
        assert!(log_colour(true, Some(OsStr::new(""))));
        assert!(!log_colour(true, Some(OsStr::new("1"))));
        assert!(!log_colour(false, None));
    }

    #[test]
    fn live_frames_carry_their_time_and_one_row_per_gpu() {
        let view = serde_json::json!({"gpus": [
            {"gpu_id": 0, "bdf": "0000:05:00.0", "healthy": true, "partition_id": 0,
             "readings": {"temperature": {"edge_c": 40.0}}},
            {"gpu_id": 0, "bdf": "0000:05:00.0", "healthy": true, "partition_id": 1,
             "readings": {}},
        ]});
        let frame = live_frame("2026-12-01T09:30:00Z", &view);
        let lines: Vec<&str> = frame.lines().collect();
        assert_eq!(lines[0], "-- 2026-12-01T09:30:00Z --");
        assert!(lines[1].starts_with(" GPU BDF"), "{frame}");
        assert!(
            lines[2].contains("0000:05:00.0") && lines[2].contains("40.0"),
            "{frame}"
        );
        // The frame ends with a blank line, to set it off from the next.
        assert_eq!(lines[3], "", "{frame}");
        assert_eq!(lines.len(), 4, "{frame}");
    }
}
