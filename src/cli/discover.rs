//! `gpu-operator discover`: the GPUs on this host, their partitions and links,
//! as a table or as JSON.
//!
//! It owns the subcommand's arguments and hands the host to `device`; the
//! table is drawn in `output`. It must not read sysfs itself.

use std::process::ExitCode;

use clap::Args;

use super::args::{HostRootArg, OutputFormat};
use super::output::{fail, inventory_table, unbound_lines};
use crate::device;

#[derive(Args, Debug)]
pub struct DiscoverArgs {
    #[command(flatten)]
    pub host: HostRootArg,
    /// `table` for people, `json` for tools (shape documented in README).
    #[arg(long, short, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

pub fn run(args: DiscoverArgs) -> ExitCode {
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
