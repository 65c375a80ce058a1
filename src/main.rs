//! The `gpu-operator` binary: parse the command line, run the subcommand, map the
//! outcome to an exit code. Everything else lives in the library.

use std::process::ExitCode;

fn main() -> ExitCode {
    gpu_operator::cli::main()
}
