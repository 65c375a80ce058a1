//! Deadline-bounded host reads for discovery and the change stream.
//!
//! Discovery is plain synchronous code over [`HostRead`]; [`BoundedHost`] is the
//! one implementation it runs on. Each read is handed to the metrics'
//! [`BoundedReader`] (its own small thread pool; a hung file parks at most one
//! of its threads, and further reads of that file are refused at once), and
//! waited for on the calling thread ([`BoundedReader::batch_blocking`]: the
//! thread keeps the deadlines itself, so no runtime is needed) with a
//! per-file timeout and, for a whole scan, a deadline after which every read
//! fails at once. So a scan of any host
//! returns within about its deadline, whatever hangs.
//!
//! [`run_bounded`] runs a scan on a thread of its own, so that it can be called
//! from any context (an async task, a test, the CLI); [`run_bounded_here`]
//! runs it on the calling thread, for callers already on a thread that may
//! block (the change stream's `spawn_blocking`), so that a scan a second costs
//! no thread start; [`read_ahead`] runs one that needs a single request of
//! known reads (the fingerprint, while the bound GPUs stay) over answers
//! awaited on the runtime, with no blocking thread at all. This module owns
//! the deadlines of discovery's reads; it must not know what any file means.

use std::cell::Cell;
use std::time::{Duration, Instant};

use crate::host::reader::{Answer, BoundedReader, Op, ReadError, Requests};
use crate::host::{HostAnswer, HostError, HostOp, HostRead, HostRoot, Result};

/// How long discovery waits for one file, and for one whole scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub file_timeout: Duration,
    pub scan_deadline: Duration,
}

impl Default for Limits {
    /// sysfs answers in microseconds; an SMU-backed attribute during a reset
    /// can take a while. A scan that needs longer than 5 s is not trusted.
    fn default() -> Self {
        Self {
            file_timeout: Duration::from_secs(1),
            scan_deadline: Duration::from_secs(5),
        }
    }
}

/// A [`HostRead`] whose every read returns within its limits.
pub struct BoundedHost {
    reader: BoundedReader,
    file_timeout: Duration,
    deadline: Instant,
    deadline_missed: Cell<bool>,
}

impl BoundedHost {
    /// Starts a scan through `reader` with `limits`. Must not be used on a
    /// thread that runs async tasks: reads block this thread (see [`run_bounded`]).
    pub fn new(reader: BoundedReader, limits: Limits) -> Self {
        Self {
            reader,
            file_timeout: limits.file_timeout,
            deadline: Instant::now() + limits.scan_deadline,
            deadline_missed: Cell::new(false),
        }
    }

    /// True once a read was cut short by the scan's deadline: what the scan
    /// saw is not the whole host.
    pub fn deadline_missed(&self) -> bool {
        self.deadline_missed.get()
    }

    /// The time a read may take now, or the error when the scan is out of time.
    fn budget(&self, host_path: &str) -> Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            self.deadline_missed.set(true);
            return Err(HostError::timed_out(
                self.host().path(host_path),
                "not read: the scan's deadline passed",
            ));
        }
        Ok(left.min(self.file_timeout))
    }

    /// An answer of another kind than asked for: only a bug in the reader
    /// gives one, and a missing value is the safe outcome.
    fn unexpected(&self, path: &str) -> HostError {
        HostError::wrong_answer(self.host().path(path))
    }

    fn hung(&self, path: &str) -> HostError {
        HostError::timed_out(
            self.host().path(path),
            format!("hung: no answer within {:?}", self.file_timeout),
        )
    }

    fn convert(&self, error: ReadError) -> HostError {
        match error {
            ReadError::Host(e) => e,
            // One wording for a read that timed out and for one refused
            // because the earlier read still hangs: the inventory stays the
            // same from scan to scan while the file hangs.
            ReadError::TimedOut { path, .. } => {
                if Instant::now() >= self.deadline {
                    self.deadline_missed.set(true);
                }
                self.hung(&path)
            }
            ReadError::Stuck { path } => self.hung(&path),
            ReadError::Closed { path } => HostError::Io {
                path: self.host().path(path),
                source: std::io::Error::other("the reader is shut down"),
            },
        }
    }
}

impl HostRead for BoundedHost {
    fn host(&self) -> &HostRoot {
        self.reader.host()
    }

    fn read_attr(&self, host_path: &str) -> Result<String> {
        let timeout = self.budget(host_path)?;
        match self.reader.one_blocking(Op::Read, host_path, timeout) {
            Ok(Answer::Text(text)) => Ok(text),
            Ok(_) => Err(self.unexpected(host_path)),
            Err(e) => Err(self.convert(e)),
        }
    }

    fn list_dir(&self, host_path: &str) -> Result<Vec<String>> {
        let timeout = self.budget(host_path)?;
        let names = match self.reader.one_blocking(Op::List, host_path, timeout) {
            Ok(Answer::Names(names)) => names,
            Ok(_) => return Err(self.unexpected(host_path)),
            Err(e) => return Err(self.convert(e)),
        };
        // The reader lists an absent directory as empty; callers need to
        // tell the two apart.
        if names.is_empty() && !self.exists(host_path)? {
            return Err(HostError::Io {
                path: self.host().path(host_path),
                source: std::io::ErrorKind::NotFound.into(),
            });
        }
        Ok(names)
    }

    fn exists(&self, host_path: &str) -> Result<bool> {
        let timeout = self.budget(host_path)?;
        match self.reader.one_blocking(Op::Exists, host_path, timeout) {
            Ok(Answer::Exists(exists)) => Ok(exists),
            Ok(_) => Err(self.unexpected(host_path)),
            Err(e) => Err(self.convert(e)),
        }
    }

    /// One hand-off to the reader for all of them, each with the time a
    /// single read would have now.
    fn read_many(&self, requests: &[(HostOp, &str)]) -> Vec<Result<HostAnswer>> {
        let Some((_, first)) = requests.first() else {
            return Vec::new();
        };
        let timeout = match self.budget(first) {
            Ok(timeout) => timeout,
            Err(_) => {
                return requests
                    .iter()
                    .map(|(_, path)| {
                        Err(HostError::timed_out(
                            self.host().path(path),
                            "not read: the scan's deadline passed",
                        ))
                    })
                    .collect();
            }
        };
        let batch: Requests = requests
            .iter()
            .map(|(op, path)| (reader_op(*op), (*path).to_owned()))
            .collect();
        let answers = self.reader.batch_blocking(batch, timeout);
        answers
            .into_iter()
            .zip(requests)
            .map(|(answer, (op, path))| match answer {
                Ok(Answer::Text(text)) => Ok(HostAnswer::Text(text)),
                Ok(Answer::Exists(exists)) => Ok(HostAnswer::Exists(exists)),
                // As `list_dir`: an empty listing may be an absent directory.
                Ok(Answer::Names(names)) if names.is_empty() && *op == HostOp::List => {
                    match self.exists(path)? {
                        true => Ok(HostAnswer::Names(names)),
                        false => Err(HostError::Io {
                            path: self.host().path(path),
                            source: std::io::ErrorKind::NotFound.into(),
                        }),
                    }
                }
                Ok(Answer::Names(names)) => Ok(HostAnswer::Names(names)),
                // Discovery asks for no binary reads.
                Ok(Answer::Bytes(_)) => Err(self.unexpected(path)),
                Err(e) => Err(self.convert(e)),
            })
            .collect()
    }
}

/// Runs `scan` over a [`BoundedHost`] on a thread of its own and returns its
/// result with whether the deadline cut it short. `Err` when the scan could
/// not run at all (no thread, a panic).
pub fn run_bounded<T: Send>(
    reader: &BoundedReader,
    limits: Limits,
    scan: impl FnOnce(&BoundedHost) -> T + Send,
) -> std::result::Result<(T, bool), String> {
    std::thread::scope(|s| {
        let worker = std::thread::Builder::new()
            .name("discovery".into())
            .spawn_scoped(s, || Ok(run_bounded_here(reader, limits, scan)))
            .map_err(|e| format!("cannot start a discovery thread: {e}"))?;
        worker
            .join()
            .unwrap_or_else(|_| Err("discovery panicked".to_owned()))
    })
}

/// [`run_bounded`] on the calling thread, which must be one that may block
/// (not an async worker; a `spawn_blocking` closure is fine).
pub fn run_bounded_here<T>(
    reader: &BoundedReader,
    limits: Limits,
    scan: impl FnOnce(&BoundedHost) -> T,
) -> (T, bool) {
    let host = BoundedHost::new(reader.clone(), limits);
    let value = scan(&host);
    (value, host.deadline_missed())
}

/// Runs `scan` over answers read ahead: `requests` in one request to
/// `reader`, awaited on the runtime, so that no blocking thread is woken
/// for a scan that needs nothing else (the change stream's usual tick).
/// `None` when `scan` asked for anything but exactly `requests`, or an answer
/// is one only a bounded scan can judge (a read that timed out or was
/// refused as stuck, an empty listing that may be an absent directory): the
/// caller then scans as usual ([`run_bounded_here`]).
pub async fn read_ahead<T>(
    reader: &BoundedReader,
    limits: Limits,
    requests: &[(HostOp, String)],
    scan: impl FnOnce(&dyn HostRead) -> T,
) -> Option<T> {
    let batch: Requests = requests
        .iter()
        .map(|(op, path)| (reader_op(*op), path.clone()))
        .collect();
    let mut answers = Vec::with_capacity(requests.len());
    for (answer, (op, _)) in reader
        .batch(batch, limits.file_timeout)
        .await
        .into_iter()
        .zip(requests)
    {
        answers.push(match answer {
            Ok(Answer::Text(text)) => Ok(HostAnswer::Text(text)),
            Ok(Answer::Exists(exists)) => Ok(HostAnswer::Exists(exists)),
            Ok(Answer::Names(names)) if names.is_empty() || *op != HostOp::List => return None,
            Ok(Answer::Names(names)) => Ok(HostAnswer::Names(names)),
            Ok(Answer::Bytes(_)) => return None,
            Err(ReadError::Host(e)) => Err(e),
            Err(_) => return None,
        });
    }
    let host = ReadAhead {
        host: reader.host(),
        requests,
        answers: std::cell::RefCell::new(Some(answers)),
        missed: Cell::new(false),
    };
    let value = scan(&host);
    (!host.missed.get()).then_some(value)
}

fn reader_op(op: HostOp) -> Op {
    match op {
        HostOp::Read => Op::Read,
        HostOp::Exists => Op::Exists,
        HostOp::List => Op::List,
    }
}

/// The [`HostRead`] of [`read_ahead`]: answers its one request, and notes
/// any other.
struct ReadAhead<'a> {
    host: &'a HostRoot,
    requests: &'a [(HostOp, String)],
    answers: std::cell::RefCell<Option<Vec<Result<HostAnswer>>>>,
    missed: Cell<bool>,
}

impl ReadAhead<'_> {
    fn not_read(&self, host_path: &str) -> HostError {
        self.missed.set(true);
        HostError::Io {
            path: self.host.path(host_path),
            source: std::io::Error::other("not read ahead"),
        }
    }
}

impl HostRead for ReadAhead<'_> {
    fn host(&self) -> &HostRoot {
        self.host
    }

    fn read_attr(&self, host_path: &str) -> Result<String> {
        Err(self.not_read(host_path))
    }

    fn list_dir(&self, host_path: &str) -> Result<Vec<String>> {
        Err(self.not_read(host_path))
    }

    fn exists(&self, host_path: &str) -> Result<bool> {
        Err(self.not_read(host_path))
    }

    fn read_many(&self, requests: &[(HostOp, &str)]) -> Vec<Result<HostAnswer>> {
        let same = requests.len() == self.requests.len()
            && requests
                .iter()
                .zip(self.requests)
                .all(|((op, path), (ahead_op, ahead_path))| op == ahead_op && path == ahead_path);
        match self.answers.borrow_mut().take() {
            Some(answers) if same => answers,
            _ => requests
                .iter()
                .map(|(_, path)| Err(self.not_read(path)))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate;

    fn limits(file_ms: u64, scan_ms: u64) -> Limits {
        Limits {
            file_timeout: Duration::from_millis(file_ms),
            scan_deadline: Duration::from_millis(scan_ms),
        }
    }

    #[tokio::test]
    async fn read_ahead_answers_its_one_request_and_leaves_the_rest_to_a_scan() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        host.write("/sys/a", "1\n").unwrap();
        let reader = BoundedReader::new(host.clone(), 2);
        let requests = vec![
            (HostOp::Read, "/sys/a".to_owned()),
            (HostOp::List, "/sys".to_owned()),
            (HostOp::Read, "/sys/absent".to_owned()),
        ];
        let asked: Vec<(HostOp, &str)> = requests.iter().map(|(o, p)| (*o, p.as_str())).collect();
        let answers = read_ahead(&reader, limits(100, 1000), &requests, |h| {
            h.read_many(&asked)
        })
        .await
        .expect("all read ahead");
        assert_eq!(answers[0].as_ref().unwrap(), &HostAnswer::Text("1".into()));
        assert_eq!(
            answers[1].as_ref().unwrap(),
            &HostAnswer::Names(vec!["a".into()])
        );
        assert!(answers[2].as_ref().unwrap_err().is_not_found());
        // Asking for anything else.
        let other = read_ahead(&reader, limits(100, 1000), &requests, |h| {
            h.read_many(&asked);
            h.read_attr("/sys/a")
        });
        assert!(other.await.is_none());
        let twice = read_ahead(&reader, limits(100, 1000), &requests, |h| {
            (h.read_many(&asked), h.read_many(&asked))
        });
        assert!(twice.await.is_none());
        // A hung file is for a bounded scan to judge.
        simulate::hang_file(&host, "/sys/hung").unwrap();
        let hung = vec![(HostOp::Read, "/sys/hung".to_owned())];
        let started = Instant::now();
        let read = read_ahead(&reader, limits(100, 1000), &hung, |h| {
            h.read_many(&[(HostOp::Read, "/sys/hung")])
        });
        assert!(read.await.is_none());
        assert!(started.elapsed() < Duration::from_secs(2));
        simulate::release_hung_file(&host, "/sys/hung", "2").unwrap();
    }

    #[test]
    fn hung_files_time_out_and_the_deadline_cuts_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        host.write("/sys/a", "1\n").unwrap();
        simulate::hang_file(&host, "/sys/hung").unwrap();
        let reader = BoundedReader::new(host.clone(), 4);
        let started = Instant::now();
        let ((first, again, listed, missing), missed) =
            run_bounded(&reader, limits(100, 10_000), |h| {
                (
                    h.read_attr("/sys/hung"),
                    h.read_attr("/sys/hung"),
                    h.list_dir("/sys"),
                    h.list_dir("/nope"),
                )
            })
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(2));
        let first = first.unwrap_err();
        assert!(
            first.is_timeout() && first.to_string().contains("sys/hung"),
            "{first}"
        );
        assert!(again.unwrap_err().is_timeout(), "refused while stuck");
        assert_eq!(listed.unwrap(), ["a", "hung"]);
        assert!(missing.unwrap_err().is_not_found());
        assert!(!missed);

        // A scan whose deadline passes fails every later read at once.
        let (late, missed) =
            run_bounded(&reader, limits(100, 0), |h| h.read_attr("/sys/a")).unwrap();
        assert!(late.unwrap_err().is_timeout());
        assert!(missed);
        simulate::release_hung_file(&host, "/sys/hung", "2").unwrap();
    }
}
