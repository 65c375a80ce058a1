//! Running one test process: output to files, each capped in size
//! ([`LogCap`]), with a time limit, through [`crate::command`], which runs
//! it in a process group of its own and kills the whole group at the end
//! (test tools fork workers: RVS runs one per GPU).

use std::fs::File;
use std::path::Path;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use crate::command::LogCap;
use crate::command::{self, End, Invocation, Sink};

use super::command::CommandLine;
use super::report::Ending;

/// How a process run ended, including being cancelled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcessEnd {
    Ended(Ending),
    Cancelled,
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
    let what = Invocation {
        program: line.program.clone(),
        args: line.args.iter().map(Into::into).collect(),
        env: line.env.iter().map(|(k, v)| (k.into(), v.into())).collect(),
        workdir: Some(workdir.to_owned()),
    };
    let done = command::run(
        &what,
        Sink::File(stdout, cap),
        Sink::File(stderr, cap),
        timeout,
        Some(cancel),
    )
    .await;
    match done.end {
        End::Exited { success, .. } => ProcessEnd::Ended(Ending::Exited { success }),
        End::TimedOut => ProcessEnd::Ended(Ending::TimedOut),
        End::NotStarted(why) => ProcessEnd::Ended(Ending::NotStarted(why)),
        End::Cancelled => ProcessEnd::Cancelled,
    }
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
