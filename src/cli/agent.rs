//! `gpu-operator agent`: the node agent, normally a DaemonSet pod on every
//! GPU node.
//!
//! It owns the subcommand's arguments and turns them into an `AgentConfig`
//! (with the Lease when it campaigns); the agent itself is `agent::run`. It
//! must not do node or cluster work of its own.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::args::{DriverLoadArgs, HostRootArg, SamplingArgs, UpgradeTimeoutArgs, kube_clients};
use super::output::fail;
use super::runtime::{run_to_end, shutdown_on_signals};

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
    /// Where the DRA plugin writes the CDI spec of each prepared claim; the
    /// container runtime must read CDI specs from here (containerd and CRI-O
    /// read /etc/cdi and /var/run/cdi by default).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/run/cdi",
        env = "CDI_DIR"
    )]
    pub cdi_dir: PathBuf,
    /// Taint unhealthy GPUs in the DRA ResourceSlices (`gpu.amd.com/unhealthy`,
    /// NoSchedule), so the scheduler allocates them to no new claim; on by
    /// default (device taints are GA in Kubernetes 1.37, beta and on by
    /// default from 1.36; an API server without them drops the taints).
    /// `--dra-device-taints=false` turns them off.
    #[arg(
        long,
        default_value_t = true,
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub dra_device_taints: bool,
    /// Follow DeviceConfigs in this namespace only, as leader too; by
    /// default those of every namespace. Restricting needs the RBAC to
    /// match (deploy/README.md: "DeviceConfigs in one namespace only").
    #[arg(
        long = "watch-namespace",
        visible_alias = "namespace",
        value_name = "NS",
        env = "WATCH_NAMESPACE"
    )]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub health_socket: super::args::HealthSocketArgs,
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
    #[command(flatten)]
    pub test_tools: super::args::TestToolArgs,
    /// As leader, also report Secrets a DeviceConfig names that do not exist.
    /// Needs the optional Role deploy/optional/secret-references.yaml: by
    /// default the agents may not read Secrets.
    #[arg(long)]
    pub check_secret_references: bool,
    #[command(flatten)]
    pub driver: DriverLoadArgs,
    /// The command that reboots this node when its driver upgrade asks for a
    /// reboot (driver.upgradePolicy.rebootRequired, or replacing the in-box
    /// amdgpu) or its remediation does, split at spaces, e.g. "nsenter --target 1 --all systemctl
    /// reboot". Default: this program's own `driver reboot-host`, which
    /// flushes file systems and runs the host's `systemctl reboot` in the
    /// host's mount namespace (needs hostPID and CAP_SYS_ADMIN in a pod).
    #[arg(long, value_name = "COMMAND", value_parser = crate::driver::reboot::RebootCommand::parse)]
    pub reboot_command: Option<crate::driver::reboot::RebootCommand>,
    /// How one GPU is reset when its remediation's entry says
    /// `gpuResetFirst`: `debugfs` reads amdgpu's
    /// /sys/kernel/debug/dri/<GPU>/amdgpu_gpu_recover under --host-root
    /// (debugfs must be mounted there); anything else is a command, split at
    /// spaces, run with the GPU's PCI address as its last argument (e.g.
    /// "amd-smi reset -G -g" wrapped in a script that maps the address).
    #[arg(long, value_name = "debugfs|COMMAND", default_value = "debugfs", value_parser = crate::driver::gpu_reset::GpuReset::parse)]
    pub gpu_reset: crate::driver::gpu_reset::GpuReset,
    #[command(flatten)]
    pub upgrade_timeouts: UpgradeTimeoutArgs,
    #[command(flatten)]
    pub remediation_confirm: super::args::RemediationConfirmArgs,
}

/// The reboot command: the one given, else this program's own.
pub(super) fn reboot_command(
    given: Option<crate::driver::reboot::RebootCommand>,
) -> Option<crate::driver::reboot::RebootCommand> {
    given.or_else(|| {
        std::env::current_exe()
            .ok()
            .map(|exe| crate::driver::reboot::RebootCommand::built_in(&exe))
    })
}

pub fn run(args: AgentArgs) -> ExitCode {
    let host = match args.host.open() {
        Ok(host) => host,
        Err(message) => return fail(message, 2),
    };
    run_to_end(async move {
        let (client, eviction_client) = match kube_clients().await {
            Ok(clients) => clients,
            Err(message) => return fail(message, 1),
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
                        watch_namespace: args.namespace.clone(),
                        check_secret_references: args.check_secret_references,
                        upgrade_timeouts: args.upgrade_timeouts.timeouts(),
                        remediation_confirm: args.remediation_confirm.confirm(),
                        eviction_client: Some(eviction_client),
                        ..Default::default()
                    },
                })
            }
            _ => None,
        };
        let config = crate::agent::AgentConfig {
            leader,
            metrics_listen: args.metrics_bind,
            test_commands: Some(args.test_tools.commands(
                crate::testrunner::AllowedCommands::from_flags(args.allow_test_command),
            )),
            node_name: args.node_name,
            namespace: args.namespace,
            host,
            kubelet_dir: args.kubelet_dir,
            cdi_dir: args.cdi_dir,
            dra_device_taints: args.dra_device_taints,
            health_socket: args.health_socket.path(),
            rescan_interval: args.sampling.rescan_interval,
            sampling: args.sampling.sampling(),
            driver: crate::driver::manager::ManagerConfig {
                gpu_reset: args.gpu_reset,
                ..args
                    .driver
                    .manager_config(reboot_command(args.reboot_command))
            },
        };
        match crate::agent::run(client, config, shutdown_on_signals()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(e, 1),
        }
    })
}
