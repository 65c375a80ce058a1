//! The async runtime of the long-running subcommands, and how they stop.
//!
//! It owns building the tokio runtime, bounding how long it winds down once
//! a subcommand's work is done, and turning SIGTERM and SIGINT into a
//! `CancellationToken`, with a forced exit when a shutdown hangs. It must not
//! know what a subcommand does: it runs the future it is given.

use std::process::ExitCode;

use super::output::fail;

/// Builds the async runtime the long-running subcommands use.
///
/// One worker thread: the agent's work on the runtime is short (blocking
/// reads run on the host reader's threads, discovery on the blocking pool),
/// and a second worker only adds wake-ups of its own, which on an idle node
/// are most of what the process costs (`AGENT_BENCH=idle cargo bench --bench
/// agent`). Still the multi-thread scheduler, so that a task that blocks by
/// mistake can be moved off with `block_in_place`.
fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}

/// Runs a subcommand's future to its end on a new [`runtime`] (exit status 1
/// if it cannot be built), then gives the runtime at most
/// [`RUNTIME_SHUTDOWN`] to wind down: a blocking thread stuck on a hung sysfs
/// read must not keep the process alive after its work is done.
pub(super) fn run_to_end(work: impl std::future::Future<Output = ExitCode>) -> ExitCode {
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(message) => return fail(message, 1),
    };
    let code = runtime.block_on(work);
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
    code
}

/// How long a finished subcommand waits for its runtime's tasks and threads.
const RUNTIME_SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a shutdown may take after the first signal before the process
/// exits outright.
const SHUTDOWN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// A token cancelled on SIGTERM or SIGINT. A second signal, or 5 s after the
/// first, exits the process outright so that a stuck shutdown cannot hang a
/// node drain. The 5 s timer is an OS thread, not a task: it fires even when
/// the runtime itself is stuck or being dropped.
pub fn shutdown_on_signals() -> tokio_util::sync::CancellationToken {
    use tokio::signal::unix::{SignalKind, signal};
    let token = tokio_util::sync::CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers; stop with SIGKILL");
            return;
        };
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::info!("shutdown requested");
        cancel.cancel();
        std::thread::spawn(|| {
            std::thread::sleep(SHUTDOWN_DEADLINE);
            eprintln!("error: shutdown did not finish within {SHUTDOWN_DEADLINE:?}; exiting");
            std::process::exit(1);
        });
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::error!("second signal during shutdown; exiting");
        std::process::exit(1);
    });
    token
}
