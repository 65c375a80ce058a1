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

/// How to make a simulated host misbehave, for `simulate --help`: the files
/// are the kernel's, so a fault is a file written the way the kernel would
/// change it.
pub const FAULTS_HELP: &str = "\
Faults, injected into the written tree (DIR is --out, BDF a GPU's PCI address
as `discover --host-root DIR` lists it, e.g. 0000:05:00.0):

  ECC errors: write the block's RAS counters, as amdgpu reports them, in one
  rename (a reader never sees half a file):
    printf 'ue: 3\nce: 0\n' > DIR/sys/bus/pci/devices/BDF/ras/umc_err_count.new
    mv DIR/sys/bus/pci/devices/BDF/ras/umc_err_count.new \\
       DIR/sys/bus/pci/devices/BDF/ras/umc_err_count
  Any block the GPU has works (ls DIR/sys/bus/pci/devices/BDF/ras). An
  uncorrectable count above 0 makes the health monitor mark the GPU unhealthy
  within about a second; 0 again makes it healthy.

  A hung file: replace an attribute with a FIFO that nobody writes, so that
  open() blocks as a stuck sysfs read does:
    rm DIR/sys/bus/pci/devices/BDF/current_link_speed
    mkfifo DIR/sys/bus/pci/devices/BDF/current_link_speed
  Readers give up at their deadline and report the file as unreadable. To
  release them, open the FIFO for writing (echo x > FILE) and write the file
  back.

  A driver unloaded: rm -r DIR/sys/module/amdgpu (or --no-driver for a host
  with no KFD or DRM nodes either).
";

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The files the help tells a person to change are where a simulated
    /// host has them.
    #[test]
    fn the_faults_help_names_files_a_simulated_host_has() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let spec = simulate::SimSpec::new("mi210", Some(1), None).unwrap();
        simulate::write_host(&host, &spec).unwrap();
        let bdf = crate::device::discover(&host).gpus[0].bdf.clone();
        for file in ["ras/umc_err_count", "current_link_speed"] {
            assert!(FAULTS_HELP.contains(&format!("BDF/{file}")), "{file}");
            let path = format!("/sys/bus/pci/devices/{bdf}/{file}");
            assert!(host.path(&path).is_file(), "{path}");
        }
        assert!(FAULTS_HELP.contains("DIR/sys/module/amdgpu"));
        assert!(host.path("/sys/module/amdgpu").is_dir());
    }
}
