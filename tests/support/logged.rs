//! The real `gpu-operator` binary as a child process, with its log read
//! line by line as it comes: the evidence a test waits on (the address it
//! listens on, a service restarting), and a SIGTERM with a bound on the exit.
//! Also systemd's notification socket, for the readiness a `Type=notify`
//! unit waits for.

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::wait;

/// The binary under test.
pub fn gpu_operator() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
}

/// Runs `command` to its exit: its exit code (-1 for a signal), stdout and
/// stderr.
pub fn run(command: &mut Command) -> (i32, String, String) {
    let out = command.output().expect("run gpu-operator");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A child whose log (stderr, plain text at `info`) is read on a thread of
/// its own, so that it never blocks on a full pipe. Killed on drop.
pub struct Logged {
    pub child: Child,
    lines: mpsc::Receiver<String>,
}

impl Logged {
    /// Starts `command` with its log at `info`, uncoloured, on a pipe; its
    /// stdout goes nowhere.
    pub fn start(command: &mut Command) -> Self {
        let mut child = command
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gpu-operator");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self { child, lines }
    }

    /// The next log line that `wanted` accepts.
    pub fn wait_line(&self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        wait::poll_until_blocking(
            &format!("the log line {what}"),
            || self.lines.try_iter().find(|l| wanted(l)),
            Option::is_some,
        )
        .expect("a line")
    }

    /// The address the log says the metrics endpoint listens on.
    pub fn metrics_address(&self) -> String {
        let line = self.wait_line("metrics on", |l| l.contains("metrics on http://"));
        line.split("metrics on http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .expect("an address after `metrics on http://`")
            .to_owned()
    }

    /// SIGTERM, and its exit within `bound`.
    pub fn terminate_within(&mut self, bound: Duration) -> ExitStatus {
        let stopping = Instant::now();
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        loop {
            if let Some(status) = self.child.try_wait().expect("the child's status") {
                return status;
            }
            if stopping.elapsed() > bound {
                let _ = self.child.kill();
                panic!("no exit {bound:?} after SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// systemd's notification socket (`NOTIFY_SOCKET`), bound in a test's
/// directory.
pub struct Notify {
    socket: UnixDatagram,
    path: PathBuf,
}

impl Notify {
    pub fn bind(path: &Path) -> Self {
        let socket = UnixDatagram::bind(path).expect("bind the notify socket");
        socket
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("a read timeout");
        Self {
            socket,
            path: path.to_owned(),
        }
    }

    /// What to set `NOTIFY_SOCKET` to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits for `READY=1`, as a `Type=notify` unit does.
    pub fn wait_ready(&self) {
        let mut buf = [0u8; 256];
        let n = self.socket.recv(&mut buf).expect("READY=1 from sd_notify");
        let message = String::from_utf8_lossy(&buf[..n]);
        assert!(message.contains("READY=1"), "{message}");
    }
}
