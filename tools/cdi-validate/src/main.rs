//! `cdi-validate FILE...`: reads each CDI spec with `container-device-interface`'s
//! `read_spec`, which applies the JSON schema and the reference rules (kind
//! `vendor/class`, device names, known `cdiVersion`, fields the version
//! allows). Prints one line per file and exits 1 if any is invalid.
//!
//! A test tool, built by `.ci/run`; the DRA tests (`tests/dra.rs`) run it on
//! the specs the plugin writes.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let files: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    if files.is_empty() {
        eprintln!("usage: cdi-validate FILE...");
        return ExitCode::from(2);
    }
    let mut failed = false;
    for file in &files {
        match container_device_interface::spec::read_spec(file, 0) {
            Ok(_) => println!("{}: valid", file.display()),
            Err(e) => {
                println!("{}: invalid: {e:#}", file.display());
                failed = true;
            }
        }
    }
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
