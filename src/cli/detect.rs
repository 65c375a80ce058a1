//! `gpu-operator detect`: the NFD-free GPU node labeller's process. It owns
//! the subcommand's arguments and its start; what it decides and writes is
//! `crate::detect`'s.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use k8s_openapi::api::core::v1::Node;
use kube::Api;

use super::args::{HostRootArg, kube_client};
use super::output::fail;
use super::runtime::{run_to_end, shutdown_on_signals};
use crate::node_writer::NodeWriter;

/// Label this Node as Node Feature Discovery would for its AMD GPUs.
///
/// For clusters without NFD: run on every node (the Helm chart's
/// gpu-operator-detect DaemonSet). It reads the PCI bus under the host root
/// and keeps feature.node.kubernetes.io/amd-gpu=true (physical GPUs),
/// amd-vgpu=true (SR-IOV virtual functions) and the per-model labels of AMD's
/// NodeFeatureRule on its own Node, which is what the agent DaemonSet selects;
/// a node without an AMD GPU gets none. It writes only those labels of its
/// own Node (field manager gpu-operator-detect), then waits, looking again
/// every --recheck-interval, until SIGTERM.
#[derive(Args, Debug)]
pub struct DetectArgs {
    /// This Node's name (the downward API's spec.nodeName).
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: String,
    #[command(flatten)]
    pub host: HostRootArg,
    /// Seconds between looks at the PCI bus after the first.
    #[arg(long, value_name = "SECONDS", default_value = "600", value_parser = super::args::positive_seconds)]
    pub recheck_interval: Duration,
}

pub fn run(args: DetectArgs) -> ExitCode {
    let host = match args.host.open() {
        Ok(host) => host,
        Err(message) => return fail(message, 2),
    };
    run_to_end(async move {
        let client = match kube_client().await {
            Ok(client) => client,
            Err(message) => return fail(message, 2),
        };
        let writer = NodeWriter::new(Api::<Node>::all(client), args.node_name);
        let stop = shutdown_on_signals();
        let config = crate::detect::DetectConfig {
            host,
            recheck: args.recheck_interval,
        };
        crate::detect::run(writer, config, stop).await;
        ExitCode::SUCCESS
    })
}
