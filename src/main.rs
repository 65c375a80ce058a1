//! The `gpu-operator` binary: parse the command line, run the subcommand, map the
//! outcome to an exit code. Everything else lives in the library.

use std::process::ExitCode;

fn main() -> ExitCode {
    // As servers do: use the whole descriptor budget the administrator allows.
    // The metrics endpoint takes at most a quarter of it (see metrics::limits).
    if let Err(e) = gpu_operator::host::descriptors::raise_nofile_limit() {
        eprintln!("warning: cannot raise RLIMIT_NOFILE to its hard limit: {e}");
    }
    gpu_operator::cli::main()
}
