//! `gpu-operator simulate`: write a simulated GPU host into a directory.
//!
//! It owns the subcommand's arguments and turns them into a `SimSpec`; the
//! host is written by `simulate`. It must not write any file itself.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::output::fail;
use crate::host::HostRoot;
use crate::simulate;

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

pub fn run(args: SimulateArgs) -> ExitCode {
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
