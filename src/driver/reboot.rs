//! Rebooting the node into a new driver, when the leader's upgrade record
//! asks for it ([`crate::api::driver_upgrade::UpgradeRecord::reboot_from`]):
//! the agent records the boot id it reboots from (the record carries it),
//! and runs the reboot command, which flushes the host's file systems and
//! asks the host's systemd to reboot.
//!
//! The command is configurable, so that tests run a recorder. The one the
//! agent runs by default is this program's own `driver reboot-host`
//! ([`reboot_host`]): `sync(2)`, then, in the mount namespace of the host's
//! PID 1, `systemctl reboot`; what `nsenter --target 1 --mount systemctl
//! reboot` does, without needing `nsenter` in the image. From a pod that
//! takes `hostPID` and CAP_SYS_ADMIN (for `setns`); on a host, root.
//!
//! This module must not decide when to reboot (the driver manager does,
//! from the record) and never reboots without being asked.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::command::{self, Invocation, Sink};

/// How long the reboot command may take: `systemctl reboot` returns once
/// systemd has queued the reboot.
pub const REBOOT_COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// The host's systemctl, looked up in the host's mount namespace.
pub const SYSTEMCTL_PATHS: [&str; 2] = ["/usr/bin/systemctl", "/bin/systemctl"];

/// The command that reboots the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RebootCommand {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub timeout: Duration,
}

impl RebootCommand {
    /// A command line, split at whitespace (`nsenter --target 1 --all
    /// systemctl reboot`); an empty one is refused.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (program, args) = command::split_line(text, "the reboot command")?;
        Ok(Self {
            program,
            args,
            timeout: REBOOT_COMMAND_TIMEOUT,
        })
    }

    /// This program's own `driver reboot-host`, at `exe`.
    pub fn built_in(exe: &Path) -> Self {
        Self {
            program: exe.to_path_buf(),
            args: vec!["driver".into(), "reboot-host".into()],
            timeout: REBOOT_COMMAND_TIMEOUT,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RebootError {
    #[error("no reboot command is configured (agent --reboot-command)")]
    NotConfigured,
    #[error("{program}: {why}")]
    Failed { program: String, why: String },
}

/// Runs the reboot command. `Ok` means the host accepted the request; the
/// reboot itself shows as a new boot id.
pub async fn reboot(command: Option<&RebootCommand>) -> Result<(), RebootError> {
    let command = command.ok_or(RebootError::NotConfigured)?;
    let invocation = Invocation {
        program: command.program.clone(),
        args: command.args.clone(),
        ..Invocation::default()
    };
    tracing::warn!(program = %command.program.display(), args = ?command.args, "rebooting the node for its driver upgrade");
    let done = command::run(
        &invocation,
        Sink::Discard,
        Sink::Memory(4096),
        command.timeout,
        None,
    )
    .await;
    match done.failure(command.timeout) {
        None => Ok(()),
        Some(why) => Err(RebootError::Failed {
            program: command.program.display().to_string(),
            why,
        }),
    }
}

/// The built-in reboot: flushes every file system, enters the mount
/// namespace of the host's PID 1 (`/proc/1/ns/mnt`, the host's when the
/// process sees the host's PIDs) and replaces this process with the host's
/// `systemctl reboot`. Returns only on failure, with what failed.
pub fn reboot_host() -> String {
    // SAFETY: sync(2) has no arguments and cannot fail.
    unsafe { libc::sync() };
    let ns = match std::fs::File::open("/proc/1/ns/mnt") {
        Ok(ns) => ns,
        Err(e) => return format!("cannot open /proc/1/ns/mnt (is hostPID set?): {e}"),
    };
    use std::os::fd::AsRawFd;
    // SAFETY: setns only reads the descriptor, which stays open until after
    // the call; this process is single-threaded here (a command, not the
    // agent), as setns of a mount namespace requires.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNS) } != 0 {
        return format!(
            "cannot enter the host's mount namespace (CAP_SYS_ADMIN is needed): {}",
            std::io::Error::last_os_error()
        );
    }
    let Some(systemctl) = SYSTEMCTL_PATHS
        .iter()
        .find(|p| Path::new(p).exists())
        .copied()
    else {
        return format!("no systemctl on the host ({})", SYSTEMCTL_PATHS.join(", "));
    };
    use std::os::unix::process::CommandExt;
    let error = std::process::Command::new(systemctl).arg("reboot").exec();
    format!("cannot run {systemctl} reboot: {error}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_line_is_split_at_whitespace_and_an_empty_one_refused() {
        let c = RebootCommand::parse("  nsenter --target 1 --all  systemctl reboot ").unwrap();
        assert_eq!(c.program, PathBuf::from("nsenter"));
        assert_eq!(
            c.args,
            ["--target", "1", "--all", "systemctl", "reboot"].map(OsString::from)
        );
        assert!(RebootCommand::parse("   ").is_err());
        let built_in = RebootCommand::built_in(Path::new("/usr/local/bin/gpu-operator"));
        assert_eq!(built_in.args, ["driver", "reboot-host"].map(OsString::from));
    }

    #[tokio::test]
    async fn a_failing_or_missing_command_says_why_and_none_configured_is_an_error() {
        assert!(matches!(
            reboot(None).await,
            Err(RebootError::NotConfigured)
        ));
        let missing = RebootCommand::parse("/nonexistent/gpu-operator-test/reboot").unwrap();
        let Err(RebootError::Failed { why, .. }) = reboot(Some(&missing)).await else {
            panic!("a missing program is a failure");
        };
        assert!(why.contains("cannot start"), "{why}");
        let failing = RebootCommand::parse("false").unwrap();
        assert!(reboot(Some(&failing)).await.is_err());
        let ok = RebootCommand::parse("true").unwrap();
        assert!(reboot(Some(&ok)).await.is_ok());
    }
}
