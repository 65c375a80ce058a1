//! `gpu-operator leader`: the cluster role alone, without node work.
//!
//! It owns the subcommand's arguments and starts the reconciler, behind a
//! Lease or unconditionally; the reconciling is `cluster`'s. It must not
//! reconcile anything itself.

use std::process::ExitCode;

use clap::Args;

use super::args::{UpgradeTimeoutArgs, kube_clients};
use super::output::fail;
use super::runtime::{run_to_end, shutdown_on_signals};

#[derive(Args, Debug)]
pub struct LeaderArgs {
    /// Namespace of the leader-election Lease; without it, lead unconditionally.
    #[arg(long, value_name = "NS", env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Follow DeviceConfigs in this namespace only; by default those of
    /// every namespace.
    #[arg(long, value_name = "NS", env = "WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Identity in the Lease.
    #[arg(long, value_name = "ID", default_value = "standalone-leader")]
    pub identity: String,
    #[command(flatten)]
    pub upgrade_timeouts: UpgradeTimeoutArgs,
    #[command(flatten)]
    pub remediation_confirm: super::args::RemediationConfirmArgs,
}

pub fn run(args: LeaderArgs) -> ExitCode {
    run_to_end(async move {
        let (client, eviction_client) = match kube_clients().await {
            Ok(clients) => clients,
            Err(message) => return fail(message, 1),
        };
        let shutdown = shutdown_on_signals();
        let config = crate::cluster::ClusterConfig {
            namespace: args.lease_namespace.clone(),
            watch_namespace: args.watch_namespace.clone(),
            upgrade_timeouts: args.upgrade_timeouts.timeouts(),
            remediation_confirm: args.remediation_confirm.confirm(),
            eviction_client: Some(eviction_client),
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
