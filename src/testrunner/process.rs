//! Running one test process: in a process group of its own, with a time limit,
//! output to files.
//!
//! Test tools fork workers (RVS runs one per GPU), so killing only the direct
//! child would leave the workers holding the GPU. Each test process therefore
//! leads its own process group, and the whole group is killed with SIGKILL: on
//! timeout, on cancellation, when the runner is dropped mid-test, and after a
//! normal exit (so nothing a test left running outlives it). A program that
//! moves itself into another session or group escapes this; test tools do not.

use std::fs::File;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::command::CommandLine;
use super::report::Ending;

/// How a process run ended, including being cancelled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcessEnd {
    Ended(Ending),
    Cancelled,
}

/// Kills a process group when dropped or asked to.
struct GroupKiller {
    pgid: Option<libc::pid_t>,
}

impl GroupKiller {
    fn kill(&self) {
        if let Some(pgid) = self.pgid.filter(|p| *p > 1) {
            // SAFETY: killpg only sends a signal; a group that no longer exists
            // yields ESRCH, which is the desired end state.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for GroupKiller {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `line` with stdout and stderr going to the given files, in a new
/// process group, for at most `timeout`. Returns how it ended; the group is
/// gone when this returns (or when the future is dropped).
pub async fn run(
    line: &CommandLine,
    stdout: File,
    stderr: File,
    workdir: &Path,
    timeout: Duration,
    cancel: &CancellationToken,
) -> ProcessEnd {
    let mut command = tokio::process::Command::new(&line.program);
    command
        .args(&line.args)
        .envs(line.env.iter().map(|(k, v)| (k, v)))
        .current_dir(workdir)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            return ProcessEnd::Ended(Ending::NotStarted(format!(
                "cannot start {}: {e}",
                line.program.display()
            )));
        }
    };
    let killer = GroupKiller {
        pgid: child.id().and_then(|id| libc::pid_t::try_from(id).ok()),
    };
    let end = tokio::select! {
        status = child.wait() => ProcessEnd::Ended(Ending::Exited {
            success: status.is_ok_and(|s| s.success()),
        }),
        _ = tokio::time::sleep(timeout) => ProcessEnd::Ended(Ending::TimedOut),
        _ = cancel.cancelled() => ProcessEnd::Cancelled,
    };
    killer.kill();
    // Reap the leader (immediate after SIGKILL); a failure here leaves a zombie
    // that tokio's orphan reaper collects.
    let _ = child.wait().await;
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> CommandLine {
        CommandLine {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            env: vec![("GREETING".into(), "hello".into())],
        }
    }

    async fn run_sh(script: &str, timeout: Duration) -> (ProcessEnd, String) {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let end = run(
            &sh(script),
            File::create(&out).unwrap(),
            File::create(dir.path().join("err")).unwrap(),
            dir.path(),
            timeout,
            &CancellationToken::new(),
        )
        .await;
        (end, std::fs::read_to_string(out).unwrap())
    }

    #[tokio::test]
    async fn exit_status_and_output() {
        let (end, out) = run_sh("echo $GREETING; exit 0", Duration::from_secs(10)).await;
        assert_eq!(end, ProcessEnd::Ended(Ending::Exited { success: true }));
        assert_eq!(out, "hello\n");
        let (end, _) = run_sh("exit 3", Duration::from_secs(10)).await;
        assert_eq!(end, ProcessEnd::Ended(Ending::Exited { success: false }));
    }

    #[tokio::test]
    async fn a_missing_program_does_not_start() {
        let dir = tempfile::tempdir().unwrap();
        let line = CommandLine {
            program: dir.path().join("absent"),
            args: vec![],
            env: vec![],
        };
        let end = run(
            &line,
            File::create(dir.path().join("o")).unwrap(),
            File::create(dir.path().join("e")).unwrap(),
            dir.path(),
            Duration::from_secs(1),
            &CancellationToken::new(),
        )
        .await;
        assert!(
            matches!(&end, ProcessEnd::Ended(Ending::NotStarted(m)) if m.contains("absent")),
            "{end:?}"
        );
    }

    #[tokio::test]
    async fn cancellation_kills_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let cancel = CancellationToken::new();
        let trigger = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            trigger.cancel();
        });
        let started = std::time::Instant::now();
        let end = run(
            &sh("sleep 30"),
            File::create(dir.path().join("o")).unwrap(),
            File::create(dir.path().join("e")).unwrap(),
            dir.path(),
            Duration::from_secs(30),
            &cancel,
        )
        .await;
        assert_eq!(end, ProcessEnd::Cancelled);
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
