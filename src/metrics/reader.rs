//! Reading host files with a deadline, so that one stuck sysfs attribute costs
//! one value and never a whole sample.
//!
//! A sysfs read can block for seconds (a PCIe attribute of a GPU in trouble) or
//! forever (a hung device). A blocked read cannot be cancelled, so it must not run
//! on a thread anyone else needs: not on the async runtime, and not on tokio's
//! blocking pool, which hung reads would slowly use up. [`BoundedReader`] owns a
//! small pool of threads of its own, at most `max_threads`, started on demand.
//! The caller waits for each file with its own timeout; a read that misses its
//! deadline keeps its thread parked, and until it returns, further reads of the
//! same file are refused at once ([`ReadError::Stuck`]) instead of parking
//! another thread. So at most one thread is ever parked per hung file, and if
//! every thread is parked, reads wait in the queue and time out: the service
//! degrades to missing values, never to a stuck task.
//!
//! This module owns the threads and the deadlines. It must not know what any file
//! means; all paths go through [`HostRoot`].

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::host::{HostError, HostRoot};

/// Why a read produced no value.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path}: an earlier read of this file has not returned yet; skipped")]
    Stuck { path: String },
    #[error("{path}: no answer within {timeout:?}")]
    TimedOut { path: String, timeout: Duration },
    #[error(transparent)]
    Host(#[from] HostError),
    #[error("{path}: the reader is shut down")]
    Closed { path: String },
}

impl ReadError {
    /// True for a file or directory that does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, ReadError::Host(e) if e.is_not_found())
    }
}

/// Counts since the reader was created, for the exporter's own metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReaderStats {
    pub reads: u64,
    pub timeouts: u64,
    pub skipped_stuck: u64,
    /// Threads started so far (idle, busy or parked on a hung file).
    pub threads: u64,
}

enum Op {
    Read,
    Exists,
    List,
}

enum Answer {
    Text(String),
    Exists(bool),
    Names(Vec<String>),
}

struct Job {
    path: String,
    op: Op,
    reply: oneshot::Sender<Result<Answer, HostError>>,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    /// Paths queued or being read. A path stays here while its read is stuck.
    in_flight: HashSet<String>,
    idle: usize,
    threads: usize,
    shutdown: bool,
}

struct Inner {
    host: HostRoot,
    max_threads: usize,
    state: Mutex<State>,
    work: Condvar,
    reads: AtomicU64,
    timeouts: AtomicU64,
    skipped: AtomicU64,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A worker never panics while holding the lock (reads happen outside it),
        // so a poisoned lock still holds consistent state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A handle to the reader's threads. Cheap to clone; the threads stop (except
/// those parked on hung files, which stop when their read returns) when the last
/// handle is dropped.
#[derive(Clone)]
pub struct BoundedReader {
    inner: Arc<Inner>,
    _guard: Arc<ShutdownGuard>,
}

struct ShutdownGuard(Arc<Inner>);

impl Drop for ShutdownGuard {
    fn drop(&mut self) {
        self.0.lock().shutdown = true;
        self.0.work.notify_all();
    }
}

impl std::fmt::Debug for BoundedReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundedReader")
            .field("root", &self.inner.host.root())
            .field("stats", &self.stats())
            .finish()
    }
}

impl BoundedReader {
    /// Default thread cap: enough for every GPU's reads to proceed while a
    /// handful of files hang.
    pub const DEFAULT_MAX_THREADS: usize = 8;

    pub fn new(host: HostRoot, max_threads: usize) -> Self {
        let inner = Arc::new(Inner {
            host,
            max_threads: max_threads.max(1),
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            reads: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        });
        Self {
            _guard: Arc::new(ShutdownGuard(inner.clone())),
            inner,
        }
    }

    pub fn host(&self) -> &HostRoot {
        &self.inner.host
    }

    /// Reads an attribute (trimmed, as [`HostRoot::read_attr`]).
    pub async fn read_attr(&self, path: &str, timeout: Duration) -> Result<String, ReadError> {
        match self.run(path, Op::Read, timeout).await? {
            Answer::Text(text) => Ok(text),
            _ => unreachable_answer(path),
        }
    }

    /// Whether a path exists. `stat` on sysfs can block like a read can.
    pub async fn exists(&self, path: &str, timeout: Duration) -> Result<bool, ReadError> {
        match self.run(path, Op::Exists, timeout).await? {
            Answer::Exists(exists) => Ok(exists),
            _ => unreachable_answer(path),
        }
    }

    /// Lists a directory, sorted; an absent directory is empty.
    pub async fn list_dir(&self, path: &str, timeout: Duration) -> Result<Vec<String>, ReadError> {
        match self.run(path, Op::List, timeout).await? {
            Answer::Names(names) => Ok(names),
            _ => unreachable_answer(path),
        }
    }

    pub fn stats(&self) -> ReaderStats {
        ReaderStats {
            reads: self.inner.reads.load(Ordering::Relaxed),
            timeouts: self.inner.timeouts.load(Ordering::Relaxed),
            skipped_stuck: self.inner.skipped.load(Ordering::Relaxed),
            threads: self.inner.lock().threads as u64,
        }
    }

    /// Paths whose read has been queued or running (stuck ones included).
    pub fn in_flight(&self) -> Vec<String> {
        let mut paths: Vec<String> = self.inner.lock().in_flight.iter().cloned().collect();
        paths.sort();
        paths
    }

    async fn run(&self, path: &str, op: Op, timeout: Duration) -> Result<Answer, ReadError> {
        let (reply, answer) = oneshot::channel();
        {
            let mut state = self.inner.lock();
            if state.shutdown {
                return Err(ReadError::Closed { path: path.into() });
            }
            if !state.in_flight.insert(path.to_owned()) {
                drop(state);
                self.inner.skipped.fetch_add(1, Ordering::Relaxed);
                return Err(ReadError::Stuck { path: path.into() });
            }
            state.queue.push_back(Job {
                path: path.to_owned(),
                op,
                reply,
            });
            if state.idle == 0 && state.threads < self.inner.max_threads {
                if self.spawn_worker(state.threads).is_ok() {
                    state.threads += 1;
                } else if state.threads == 0 {
                    // No thread at all: give the path back so that the caller
                    // can retry later rather than have it marked stuck forever.
                    state.queue.pop_back();
                    state.in_flight.remove(path);
                    return Err(ReadError::Closed { path: path.into() });
                }
            }
        }
        self.inner.work.notify_one();
        self.inner.reads.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(result)) => Ok(result?),
            Ok(Err(_)) => Err(ReadError::Closed { path: path.into() }),
            Err(_) => {
                self.inner.timeouts.fetch_add(1, Ordering::Relaxed);
                Err(ReadError::TimedOut {
                    path: path.into(),
                    timeout,
                })
            }
        }
    }

    fn spawn_worker(&self, index: usize) -> std::io::Result<()> {
        let inner = self.inner.clone();
        std::thread::Builder::new()
            .name(format!("sysfs-reader-{index}"))
            .spawn(move || worker(inner))
            .map(drop)
            .inspect_err(|e| tracing::warn!(error = %e, "cannot start a sysfs reader thread"))
    }
}

fn unreachable_answer<T>(path: &str) -> Result<T, ReadError> {
    // Each operation has exactly one answer kind; this is only reachable through
    // a bug in this module, and a missing value is the safe outcome.
    Err(ReadError::Closed { path: path.into() })
}

fn worker(inner: Arc<Inner>) {
    let mut state = inner.lock();
    loop {
        let Some(job) = state.queue.pop_front() else {
            if state.shutdown {
                state.threads -= 1;
                return;
            }
            state.idle += 1;
            state = inner.work.wait(state).unwrap_or_else(|p| p.into_inner());
            state.idle -= 1;
            continue;
        };
        drop(state);
        // A caller that already gave up does not need the value; skipping keeps a
        // queue that built up behind hung files from being read for nothing.
        let result = (!job.reply.is_closed()).then(|| {
            let host = &inner.host;
            match job.op {
                Op::Read => host.read_attr(&job.path).map(Answer::Text),
                Op::Exists => Ok(Answer::Exists(host.exists(&job.path))),
                Op::List => host.list_dir_or_empty(&job.path).map(Answer::Names),
            }
        });
        // The path is free again before the caller hears back, so that it can
        // read the same file again right away.
        inner.lock().in_flight.remove(&job.path);
        if let Some(result) = result {
            let _ = job.reply.send(result);
        }
        state = inner.lock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate;
    use std::time::Instant;

    const SHORT: Duration = Duration::from_millis(100);

    fn host() -> (tempfile::TempDir, HostRoot) {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        host.write("/sys/a", "1\n").unwrap();
        host.write("/sys/b", "2\n").unwrap();
        (dir, host)
    }

    #[tokio::test]
    async fn reads_lists_and_checks_existence() {
        let (_dir, host) = host();
        let reader = BoundedReader::new(host, 2);
        assert_eq!(reader.read_attr("/sys/a", SHORT).await.unwrap(), "1");
        assert!(reader.exists("/sys/b", SHORT).await.unwrap());
        assert!(!reader.exists("/sys/c", SHORT).await.unwrap());
        assert_eq!(reader.list_dir("/sys", SHORT).await.unwrap(), ["a", "b"]);
        assert!(reader.list_dir("/nope", SHORT).await.unwrap().is_empty());
        let err = reader.read_attr("/sys/c", SHORT).await.unwrap_err();
        assert!(err.is_not_found(), "{err}");
        assert!(reader.in_flight().is_empty());
    }

    #[tokio::test]
    async fn a_hung_file_costs_one_value_and_parks_one_thread() {
        let (_dir, host) = host();
        simulate::hang_file(&host, "/sys/a").unwrap();
        let reader = BoundedReader::new(host.clone(), 2);
        let err = reader.read_attr("/sys/a", SHORT).await.unwrap_err();
        assert!(matches!(err, ReadError::TimedOut { .. }), "{err}");
        // The next read of the same file is refused at once; others still work.
        let started = Instant::now();
        let err = reader.read_attr("/sys/a", SHORT).await.unwrap_err();
        assert!(matches!(err, ReadError::Stuck { .. }), "{err}");
        assert!(started.elapsed() < SHORT);
        for _ in 0..20 {
            assert_eq!(reader.read_attr("/sys/b", SHORT).await.unwrap(), "2");
        }
        let stats = reader.stats();
        assert_eq!(stats.threads, 2, "one parked, one serving: {stats:?}");
        assert_eq!((stats.timeouts, stats.skipped_stuck), (1, 1));
        // Releasing the file frees the thread and the path.
        simulate::release_hung_file(&host, "/sys/a", "3").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !reader.in_flight().is_empty() {
            assert!(Instant::now() < deadline, "released read did not return");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(reader.read_attr("/sys/a", SHORT).await.unwrap(), "3");
    }

    #[tokio::test]
    async fn when_every_thread_is_parked_reads_time_out_instead_of_blocking() {
        let (_dir, host) = host();
        simulate::hang_file(&host, "/sys/a").unwrap();
        let reader = BoundedReader::new(host.clone(), 1);
        assert!(reader.read_attr("/sys/a", SHORT).await.is_err());
        let err = reader.read_attr("/sys/b", SHORT).await.unwrap_err();
        assert!(matches!(err, ReadError::TimedOut { .. }), "{err}");
        assert_eq!(reader.stats().threads, 1);
        simulate::release_hung_file(&host, "/sys/a", "1").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match reader.read_attr("/sys/b", SHORT).await {
                Ok(v) => break assert_eq!(v, "2"),
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                Err(e) => panic!("reader did not recover: {e}"),
            }
        }
    }
}
