//! `gpu-operator partition`: each GPU's partition modes (`show`), and a
//! partition profile applied to this host (`apply`).
//!
//! It owns the subcommand's arguments and printing; the work is in
//! [`crate::partition`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::args::{HostRootArg, OutputFormat};
use super::output::fail;
use crate::device;
use crate::partition::local::{self, LocalConfig};
use crate::partition::{Limits, ProfileSet};

#[derive(Args, Debug)]
pub struct PartitionArgs {
    #[command(subcommand)]
    pub command: PartitionCommand,
}

#[derive(Subcommand, Debug)]
pub enum PartitionCommand {
    /// Print each GPU's current and available compute and memory modes.
    Show(ShowArgs),
    /// Apply a partition profile to this host.
    ///
    /// The profile is checked against the GPUs first (the GPUs it assigns
    /// plus those it skips must be all of them, every mode must be one the
    /// GPU offers and the driver pairs); then the profile set's
    /// gpuClientSystemdServices that are active are stopped, the memory and
    /// then the compute modes are written (a process holding /dev/kfd or a
    /// GPU's DRM node blocks the change and is named), the new partitions
    /// awaited, and the services started again. A host already in the
    /// profile is left alone.
    ///
    /// On a Kubernetes node, label the Node instead
    /// (dcm.amd.com/gpu-config-profile=<profile>): the leader drains it
    /// first.
    ///
    /// Exit status: 0 applied (or nothing to do), 1 the change failed, 2 the
    /// profile is unknown, does not fit the host, or an argument is bad.
    Apply(ApplyArgs),
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    #[command(flatten)]
    pub host: HostRootArg,
    /// `table` for people, `json` for tools.
    #[arg(long, short, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

#[derive(Args, Debug)]
pub struct ApplyArgs {
    /// The profile's name (e.g. cpx_nps4_all, default).
    pub profile: String,
    #[command(flatten)]
    pub host: HostRootArg,
    /// A config.json in the reference's format (gpu-config-profiles,
    /// gpuClientSystemdServices); without it the built-in profiles apply:
    /// default, cpx_nps1_all, cpx_nps4_all, dpx_nps2_all, qpx_nps1_all.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// systemctl, to stop and start the GPU client services.
    #[arg(long, value_name = "PATH", default_value = "/usr/bin/systemctl")]
    pub systemctl: PathBuf,
    /// Leave the GPU client services alone.
    #[arg(long)]
    pub no_services: bool,
    /// Seconds to wait for the new partitions to appear.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub timeout: u64,
    /// `table` for people, `json` for tools.
    #[arg(long, short, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

pub fn run(args: PartitionArgs) -> ExitCode {
    match args.command {
        PartitionCommand::Show(args) => show(args),
        PartitionCommand::Apply(args) => apply(args),
    }
}

/// The profiles of a config.json (the built-in ones without a file), its
/// warnings logged. Shared by `partition apply` and `standalone
/// --partition-profile`.
pub(super) fn load_profiles(path: Option<&std::path::Path>) -> Result<ProfileSet, String> {
    let set = match path {
        None => ProfileSet::builtin(),
        Some(path) => {
            let text =
                super::args::read_capped(path, crate::partition::profiles::MAX_CONFIG_BYTES)?;
            ProfileSet::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?
        }
    };
    for warning in &set.warnings {
        tracing::warn!(%warning, "profile configuration");
    }
    Ok(set)
}

/// One GPU's modes, as `show` prints them (upper case, as the kernel spells
/// them).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ModesRow {
    index: usize,
    bdf: String,
    product: Option<String>,
    compute: String,
    memory: String,
    available_compute: Vec<String>,
    available_memory: Vec<String>,
    partitions: usize,
}

fn show(args: ShowArgs) -> ExitCode {
    let host = match args.host.open() {
        Ok(host) => host,
        Err(message) => return fail(message, 2),
    };
    let inventory = device::discover(&host);
    let upper = |m: &Option<String>| m.as_deref().unwrap_or("-").to_ascii_uppercase();
    let list = |l: &[String]| l.iter().map(|m| m.to_ascii_uppercase()).collect();
    let rows: Vec<ModesRow> = inventory
        .gpus
        .iter()
        .enumerate()
        .map(|(index, gpu)| ModesRow {
            index,
            bdf: gpu.bdf.clone(),
            product: gpu.product_name.clone(),
            compute: upper(&gpu.compute_partition),
            memory: upper(&gpu.memory_partition),
            available_compute: list(&gpu.available_compute_partitions),
            available_memory: list(&gpu.available_memory_partitions),
            partitions: gpu.partitions.len().max(1),
        })
        .collect();
    match args.output {
        OutputFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        ),
        OutputFormat::Table => {
            println!(
                "{:<5} {:<13} {:<8} {:<7} {:<6} {:<20} {:<12}",
                "GPU", "BDF", "COMPUTE", "MEMORY", "PARTS", "AVAILABLE COMPUTE", "AVAILABLE MEMORY"
            );
            let join = |modes: &[String]| match modes {
                [] => "-".to_owned(),
                modes => modes.join(","),
            };
            for row in &rows {
                println!(
                    "{:<5} {:<13} {:<8} {:<7} {:<6} {:<20} {:<12}",
                    row.index,
                    row.bdf,
                    row.compute,
                    row.memory,
                    row.partitions,
                    join(&row.available_compute),
                    join(&row.available_memory),
                );
            }
        }
    }
    ExitCode::SUCCESS
}

fn apply(args: ApplyArgs) -> ExitCode {
    let host = match args.host.open() {
        Ok(host) => host,
        Err(message) => return fail(message, 2),
    };
    let set = match load_profiles(args.config.as_deref()) {
        Ok(set) => set,
        Err(e) => return fail(e, 2),
    };
    let config = LocalConfig {
        store: crate::simulate::kernel::store_for(&host),
        host,
        systemctl: (!args.no_services).then_some(args.systemctl),
        limits: Limits {
            appear: Duration::from_secs(args.timeout),
            ..Limits::default()
        },
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(format!("cannot start the runtime: {e}"), 1),
    };
    match runtime.block_on(local::apply_profile(&config, &set, &args.profile)) {
        Ok(outcome) => {
            match args.output {
                OutputFormat::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&outcome).unwrap_or_default()
                ),
                OutputFormat::Table if outcome.changed.is_empty() => println!(
                    "profile {}: nothing to change ({} partitions)",
                    outcome.profile, outcome.partitions
                ),
                OutputFormat::Table => println!(
                    "profile {}: {} GPU(s) changed, {} partitions now{}",
                    outcome.profile,
                    outcome.changed.len(),
                    outcome.partitions,
                    if outcome.services.is_empty() {
                        String::new()
                    } else {
                        format!("; restarted {}", outcome.services.join(", "))
                    }
                ),
            }
            ExitCode::SUCCESS
        }
        Err(e) if e.is_rejection() => fail(e, 2),
        Err(e) => fail(e, 1),
    }
}
