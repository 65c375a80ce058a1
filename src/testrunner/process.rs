//! Running one test process: in a process group of its own, with a time limit,
//! output to files, each capped in size ([`LogCap`]).
//!
//! Test tools fork workers (RVS runs one per GPU), so killing only the direct
//! child would leave the workers holding the GPU. Each test process therefore
//! leads its own process group, and the whole group is killed with SIGKILL: on
//! timeout, on cancellation, when the runner is dropped mid-test, and after a
//! normal exit (so nothing a test left running outlives it). A program that
//! moves itself into another session or group escapes this; test tools do not.

use std::collections::VecDeque;
use std::fs::File;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
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

/// The size cap of one output file. Output beyond it is read and dropped (the
/// test is never blocked on a full pipe), except its last `tail_bytes`, which
/// follow a note saying how much was left out: tools print their result
/// file's path at the end.
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

/// How long the output relays may run on after the process group is gone: a
/// process that left the group may still hold the pipes.
const RELAY_GRACE: Duration = Duration::from_secs(2);

/// Copies `from` to `to` under `cap` until end of file; returns how many bytes
/// were left out. A write error stops the writing, not the reading.
async fn relay(mut from: impl AsyncRead + Unpin, to: File, cap: LogCap) -> u64 {
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
                tracing::warn!(error = %e, "cannot read test output");
                break;
            }
        };
        let mut chunk = &buf[..n];
        if written < head_limit {
            let take = usize::try_from(head_limit - written)
                .unwrap_or(usize::MAX)
                .min(chunk.len());
            if !broken && let Err(e) = to.write_all(&chunk[..take]).await {
                tracing::warn!(error = %e, "cannot write test log");
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
                "\n[gpu-operator: {omitted} bytes of output left out here: a test log keeps at \
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
        tracing::warn!(error = %e, "cannot write test log");
    }
    if let Err(e) = to.flush().await {
        tracing::warn!(error = %e, "cannot write test log");
    }
    omitted
}

/// Runs `line` with stdout and stderr going to the given files (each capped
/// by `cap`), in a new process group, for at most `timeout`. Returns how it
/// ended; the group is gone when this returns (or when the future is dropped),
/// and so is the output, written.
pub async fn run(
    line: &CommandLine,
    stdout: File,
    stderr: File,
    workdir: &Path,
    timeout: Duration,
    cap: LogCap,
    cancel: &CancellationToken,
) -> ProcessEnd {
    let mut command = tokio::process::Command::new(&line.program);
    command
        .args(&line.args)
        .envs(line.env.iter().map(|(k, v)| (k, v)))
        .current_dir(workdir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
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
    let mut relays = tokio::task::JoinSet::new();
    if let Some(out) = child.stdout.take() {
        relays.spawn(relay(out, stdout, cap));
    }
    if let Some(err) = child.stderr.take() {
        relays.spawn(relay(err, stderr, cap));
    }
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
    // The pipes close when the last process holding them is gone.
    let drained = tokio::time::timeout(RELAY_GRACE, async {
        while relays.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(program = %line.program.display(), "test output still open after the test ended: a process left its group; the rest of its output is not logged");
        relays.abort_all();
    }
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
            LogCap::default(),
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
            LogCap::default(),
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
            LogCap::default(),
            &cancel,
        )
        .await;
        assert_eq!(end, ProcessEnd::Cancelled);
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[tokio::test]
    async fn output_beyond_the_cap_is_cut_with_a_note_and_its_tail_kept() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let err = dir.path().join("err");
        let cap = LogCap {
            max_bytes: 64 * 1024,
            tail_bytes: 1024,
        };
        // 4 MiB of "x" on stdout, then the line a tool ends with; a little on stderr.
        let script = "head -c 4194304 /dev/zero | tr '\\0' x; echo; echo 'results in /var/tmp/r_1.json'; echo small >&2";
        let end = run(
            &sh(script),
            File::create(&out).unwrap(),
            File::create(&err).unwrap(),
            dir.path(),
            Duration::from_secs(60),
            cap,
            &CancellationToken::new(),
        )
        .await;
        assert_eq!(end, ProcessEnd::Ended(Ending::Exited { success: true }));
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(
            text.len() < 64 * 1024 + 200,
            "{} bytes written, cap 64 KiB",
            text.len()
        );
        assert!(text.starts_with("xxxx"));
        let total = 4 * 1024 * 1024 + 1 + "results in /var/tmp/r_1.json\n".len();
        let omitted = total - (64 * 1024 - 1024) - 1024;
        assert!(
            text.contains(&format!(
                "[gpu-operator: {omitted} bytes of output left out here"
            )),
            "note missing: {}",
            &text[text.len().saturating_sub(1500)..]
        );
        assert!(text.ends_with("x\nresults in /var/tmp/r_1.json\n"));
        assert_eq!(std::fs::read_to_string(&err).unwrap(), "small\n");
    }

    #[tokio::test]
    async fn output_under_the_cap_is_kept_whole() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let cap = LogCap {
            max_bytes: 4096,
            tail_bytes: 1024,
        };
        // 4000 bytes: past the head (3 KiB), within the cap.
        let end = run(
            &sh("head -c 4000 /dev/zero | tr '\\0' y"),
            File::create(&out).unwrap(),
            File::create(dir.path().join("err")).unwrap(),
            dir.path(),
            Duration::from_secs(10),
            cap,
            &CancellationToken::new(),
        )
        .await;
        assert_eq!(end, ProcessEnd::Ended(Ending::Exited { success: true }));
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "y".repeat(4000));
    }
}
