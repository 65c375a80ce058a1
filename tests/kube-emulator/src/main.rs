//! `kube-emulator`: runs the emulator as a process, for `kubectl` and scripts.
//!
//! Prints `listening on http://127.0.0.1:<port>` and `kubeconfig: <path>` once ready, then
//! serves until SIGINT or SIGTERM. Faults are injected over HTTP (`/debug/faults/...`, see the
//! README); request counts are at `/debug/requests`.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use kube_emulator::{Emulator, EmulatorConfig};

#[derive(Parser, Debug)]
#[command(
    name = "kube-emulator",
    about = "Kubernetes API emulator for tests (plain HTTP on 127.0.0.1)"
)]
struct Args {
    /// Port on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Also write the kubeconfig here.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Change events kept for watch resumes (older resourceVersions get 410 Gone).
    #[arg(long, default_value_t = 10_000)]
    history_limit: usize,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 60)]
    bookmark_interval: u64,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let config = EmulatorConfig::default()
        .port(args.port)
        .history_limit(args.history_limit)
        .bookmark_interval(Duration::from_secs(args.bookmark_interval.max(1)));
    let emu = match Emulator::start(config).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("kube-emulator: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let kubeconfig = match &args.kubeconfig {
        Some(p) => {
            if let Err(e) = emu.write_kubeconfig(p) {
                eprintln!("kube-emulator: {e}");
                return std::process::ExitCode::FAILURE;
            }
            p.clone()
        }
        None => emu.kubeconfig_path().to_path_buf(),
    };
    let mut out = std::io::stdout();
    // Scripts wait for these lines; a closed stdout just means nobody is reading.
    let _ = writeln!(out, "listening on {}", emu.url());
    let _ = writeln!(out, "kubeconfig: {}", kubeconfig.display());
    let _ = out.flush();

    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kube-emulator: cannot watch SIGTERM: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    drop(emu);
    std::process::ExitCode::SUCCESS
}
