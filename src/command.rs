//! Running a host command (a test tool, `modprobe`): the one way this program
//! starts a process. Each runs in a process group of its own, with a time
//! limit and optional cancellation, and each output stream goes to a
//! [`Sink`] under a size cap.
//!
//! Tools fork workers (RVS runs one per GPU), so killing only the direct child
//! would leave the workers holding the GPU. The whole group is therefore
//! killed with SIGKILL: on timeout, on cancellation, when the future is
//! dropped mid-run, and after a normal exit (so nothing a command left running
//! outlives it). A program that moves itself into another session or group
//! escapes this; the tools we run do not.
//!
//! This module owns processes and their output; it must not know what any
//! command means. Program paths come from configuration, so that tests run
//! recorders instead of the real tools.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::File;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// A command line given to this program (a flag's value): split at
/// whitespace, no shell. `what` names it when it is empty.
pub fn split_line(text: &str, what: &str) -> Result<(PathBuf, Vec<OsString>), String> {
    let mut words = text.split_whitespace();
    let program = words.next().ok_or_else(|| format!("{what} is empty"))?;
    Ok((PathBuf::from(program), words.map(OsString::from).collect()))
}

/// What to run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Invocation {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
    /// The working directory; the agent's own when `None`.
    pub workdir: Option<PathBuf>,
}

/// The size cap of an output file. Output beyond it is read and dropped (the
/// command is never blocked on a full pipe), except its last `tail_bytes`,
/// which follow a note saying how much was left out: tools print their
/// result file's path at the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogCap {
    /// At most this much of the output is kept (the note comes on top).
    pub max_bytes: u64,
    /// Of which the last this many bytes of the output, when it is cut.
    pub tail_bytes: u64,
}

impl Default for LogCap {
    fn default() -> Self {
        Self {
            max_bytes: 16 * 1024 * 1024,
            tail_bytes: 64 * 1024,
        }
    }
}

/// Where one output stream goes.
#[derive(Debug)]
pub enum Sink {
    /// Dropped.
    Discard,
    /// Written to a file, under a cap.
    File(File, LogCap),
    /// Kept in memory: the first this many bytes, the rest read and dropped.
    Memory(usize),
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// The program exited (or was killed by a signal); `status` as the
    /// standard library shows it (`exit status: 1`).
    Exited {
        success: bool,
        status: String,
    },
    TimedOut,
    Cancelled,
    /// The program could not be started (missing, not executable): why.
    NotStarted(String),
}

/// A finished run: how it ended, and what [`Sink::Memory`] streams kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finished {
    pub end: End,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Finished {
    /// Why the command did not succeed, for a message: its exit status and
    /// what it kept of its error output, the time limit it ran into
    /// (`timeout`, as it was run with), a cancellation, or why it could not
    /// start; `None` when it exited 0.
    pub fn failure(&self, timeout: Duration) -> Option<String> {
        match &self.end {
            End::Exited { success: true, .. } => None,
            End::Exited { status, .. } => Some(format!(
                "{status}: {}",
                String::from_utf8_lossy(&self.stderr).trim()
            )),
            End::TimedOut => Some(format!("did not finish within {timeout:?}")),
            End::Cancelled => Some("cancelled".to_owned()),
            End::NotStarted(why) => Some(why.clone()),
        }
    }
}

/// How long the output relays may run on after the process group is gone: a
/// process that left the group may still hold the pipes.
const RELAY_GRACE: Duration = Duration::from_secs(2);

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

/// Runs `what` for at most `timeout` (and until `cancel`, if given), each
/// output stream to its sink. The group is gone when this returns (or when
/// the future is dropped), and the output is written.
pub async fn run(
    what: &Invocation,
    stdout: Sink,
    stderr: Sink,
    timeout: Duration,
    cancel: Option<&CancellationToken>,
) -> Finished {
    let mut command = tokio::process::Command::new(&what.program);
    command
        .args(&what.args)
        .envs(what.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(stdio_for(&stdout))
        .stderr(stdio_for(&stderr))
        .process_group(0)
        .kill_on_drop(true);
    if let Some(dir) = &what.workdir {
        command.current_dir(dir);
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            return Finished {
                end: End::NotStarted(format!("cannot start {}: {e}", what.program.display())),
                stdout: Vec::new(),
                stderr: Vec::new(),
            };
        }
    };
    let killer = GroupKiller {
        pgid: child.id().and_then(|id| libc::pid_t::try_from(id).ok()),
    };
    let out = child
        .stdout
        .take()
        .map(|pipe| tokio::spawn(relay(pipe, stdout)));
    let err = child
        .stderr
        .take()
        .map(|pipe| tokio::spawn(relay(pipe, stderr)));
    let cancelled = async {
        match cancel {
            Some(cancel) => cancel.cancelled().await,
            None => std::future::pending().await,
        }
    };
    let end = tokio::select! {
        status = child.wait() => match status {
            Ok(status) => End::Exited { success: status.success(), status: status.to_string() },
            Err(e) => End::Exited { success: false, status: format!("cannot wait for it: {e}") },
        },
        _ = tokio::time::sleep(timeout) => End::TimedOut,
        _ = cancelled => End::Cancelled,
    };
    killer.kill();
    // Reap the leader (immediate after SIGKILL); a failure here leaves a zombie
    // that tokio's orphan reaper collects.
    let _ = child.wait().await;
    // The pipes close when the last process holding them is gone.
    let collect = async {
        let take = async |relay: Option<tokio::task::JoinHandle<Vec<u8>>>| match relay {
            Some(relay) => relay.await.unwrap_or_default(),
            None => Vec::new(),
        };
        tokio::join!(take(out), take(err))
    };
    let (stdout, stderr) = match tokio::time::timeout(RELAY_GRACE, collect).await {
        Ok(kept) => kept,
        Err(_) => {
            tracing::warn!(program = %what.program.display(), "output still open after the command ended: a process left its group; the rest of its output is dropped");
            (Vec::new(), Vec::new())
        }
    };
    Finished {
        end,
        stdout,
        stderr,
    }
}

fn stdio_for(sink: &Sink) -> Stdio {
    match sink {
        Sink::Discard => Stdio::null(),
        Sink::File(..) | Sink::Memory(_) => Stdio::piped(),
    }
}

/// Copies `from` into `sink` until end of file; what a memory sink kept.
async fn relay(from: impl AsyncRead + Unpin, sink: Sink) -> Vec<u8> {
    match sink {
        Sink::Discard => Vec::new(),
        Sink::File(to, cap) => {
            relay_to_file(from, to, cap).await;
            Vec::new()
        }
        Sink::Memory(cap) => relay_to_memory(from, cap).await,
    }
}

async fn relay_to_memory(mut from: impl AsyncRead + Unpin, cap: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len()).min(n);
                kept.extend_from_slice(&buf[..room]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    kept
}

/// Copies `from` to `to` under `cap` until end of file; returns how many bytes
/// were left out. A write error stops the writing, not the reading.
async fn relay_to_file(mut from: impl AsyncRead + Unpin, to: File, cap: LogCap) -> u64 {
    let mut to = tokio::fs::File::from_std(to);
    let head_limit = cap.max_bytes.saturating_sub(cap.tail_bytes);
    let tail_limit = usize::try_from(cap.tail_bytes.min(cap.max_bytes)).unwrap_or(usize::MAX);
    let mut written = 0u64;
    let mut tail: VecDeque<u8> = VecDeque::new();
    let mut omitted = 0u64;
    let mut broken = false;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read a command's output");
                break;
            }
        };
        let mut chunk = &buf[..n];
        if written < head_limit {
            let take = usize::try_from(head_limit - written)
                .unwrap_or(usize::MAX)
                .min(chunk.len());
            if !broken && let Err(e) = to.write_all(&chunk[..take]).await {
                tracing::warn!(error = %e, "cannot write a command's log");
                broken = true;
            }
            written += take as u64;
            chunk = &chunk[take..];
        }
        tail.extend(chunk);
        let excess = tail.len().saturating_sub(tail_limit);
        if excess > 0 {
            tail.drain(..excess);
            omitted += excess as u64;
        }
    }
    let mut end = Vec::new();
    if omitted > 0 {
        end.extend_from_slice(
            format!(
                "\n[gpu-operator: {omitted} bytes of output left out here: a log keeps at \
                 most {} bytes; the last {} bytes follow]\n",
                cap.max_bytes,
                tail.len()
            )
            .as_bytes(),
        );
    }
    end.extend(tail);
    if !broken
        && !end.is_empty()
        && let Err(e) = to.write_all(&end).await
    {
        tracing::warn!(error = %e, "cannot write a command's log");
    }
    if let Err(e) = to.flush().await {
        tracing::warn!(error = %e, "cannot write a command's log");
    }
    omitted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Invocation {
        Invocation {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            ..Invocation::default()
        }
    }

    #[tokio::test]
    async fn memory_sinks_keep_their_cap_and_the_status_says_how_it_exited() {
        let done = run(
            &sh("printf 0123456789; printf oops >&2; exit 3"),
            Sink::Memory(4),
            Sink::Memory(64),
            Duration::from_secs(10),
            None,
        )
        .await;
        assert_eq!(done.stdout, b"0123");
        assert_eq!(done.stderr, b"oops");
        match done.end {
            End::Exited { success, status } => {
                assert!(!success);
                assert!(status.contains('3'), "{status}");
            }
            other => panic!("{other:?}"),
        }
    }

    /// Whether `pid` is gone (or a zombie nobody reaped yet).
    fn gone(pid: &str) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z')),
        }
    }

    #[tokio::test]
    async fn cancelling_kills_the_whole_group_and_a_missing_program_is_not_started() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("worker");
        // A forked worker, as test tools have, that would outlive its parent.
        let script = format!(
            "sh -c 'echo $$ > {}.tmp && mv {0}.tmp {0}; exec sleep 30' & sleep 30",
            pid_file.display()
        );
        let cancel = CancellationToken::new();
        let (stop, seen) = (cancel.clone(), pid_file.clone());
        tokio::spawn(async move {
            while !seen.exists() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            stop.cancel();
        });
        let done = run(
            &sh(&script),
            Sink::Discard,
            Sink::Discard,
            Duration::from_secs(60),
            Some(&cancel),
        )
        .await;
        assert_eq!(done.end, End::Cancelled);
        let worker = std::fs::read_to_string(&pid_file).unwrap();
        let worker = worker.trim();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !gone(worker) {
            assert!(
                std::time::Instant::now() < deadline,
                "worker {worker} outlived its group"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        let missing = Invocation {
            program: dir.path().join("no-such-tool"),
            ..Invocation::default()
        };
        let done = run(
            &missing,
            Sink::Discard,
            Sink::Discard,
            Duration::from_secs(1),
            None,
        )
        .await;
        assert!(
            matches!(&done.end, End::NotStarted(why) if why.contains("no-such-tool")),
            "{:?}",
            done.end
        );
    }

    #[tokio::test]
    async fn a_timeout_ends_the_run() {
        let done = run(
            &sh("sleep 30"),
            Sink::Discard,
            Sink::Discard,
            Duration::from_millis(100),
            None,
        )
        .await;
        assert_eq!(done.end, End::TimedOut);
    }

    #[test]
    fn a_failure_says_how_the_command_ended() {
        let finished = |end: End, stderr: &str| Finished {
            end,
            stdout: Vec::new(),
            stderr: stderr.as_bytes().to_vec(),
        };
        let limit = Duration::from_secs(60);
        let ok = End::Exited {
            success: true,
            status: "exit status: 0".into(),
        };
        assert_eq!(finished(ok, "noise").failure(limit), None);
        let failed = End::Exited {
            success: false,
            status: "exit status: 1".into(),
        };
        assert_eq!(
            finished(failed, " no such GPU\n").failure(limit).as_deref(),
            Some("exit status: 1: no such GPU")
        );
        assert_eq!(
            finished(End::TimedOut, "").failure(limit).as_deref(),
            Some("did not finish within 60s")
        );
        assert_eq!(
            finished(End::Cancelled, "").failure(limit).as_deref(),
            Some("cancelled")
        );
        assert_eq!(
            finished(End::NotStarted("cannot start x".into()), "")
                .failure(limit)
                .as_deref(),
            Some("cannot start x")
        );
    }
}
