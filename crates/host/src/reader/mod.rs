//! Reading host files with a deadline, so that one stuck sysfs attribute costs
//! one value and never a whole sample.
//!
//! A sysfs read can block for seconds (a PCIe attribute of a GPU in trouble) or
//! forever (a hung device). A blocked read cannot be cancelled, so it must not run
//! on a thread anyone else needs: not on the async runtime, and not on tokio's
//! blocking pool, which hung reads would slowly use up. [`BoundedReader`] owns a
//! small pool of threads of its own, at most `max_threads`, started on demand.
//! The caller waits for its reads with its own timeout; a read that misses its
//! deadline keeps its thread parked, and until it returns, further reads of the
//! same file are refused at once ([`ReadError::Stuck`]) instead of parking
//! another thread. So at most one thread is ever parked per hung file, and if
//! every thread is parked, reads wait in the queue and time out: the service
//! degrades to missing values, never to a stuck task.
//!
//! Hand-offs are per request, not per file. A request ([`BoundedReader::batch`];
//! a single read is a request of one) is queued as one unit: the threads take
//! its reads one after another, each answer goes straight into the request,
//! and the thread that stores the last answer wakes the caller once. The
//! health monitor's few hundred reads a second so cost a few hand-offs, not a
//! few hundred. Each caller keeps its own request's deadlines, on the clock
//! it already sleeps on: an async caller ([`BoundedReader::batch`]) with the
//! runtime's timer, a thread ([`BoundedReader::batch_blocking`]) with a timed
//! park. A request answered within [`STALL`], the usual case, so costs no
//! timer firing and no thread but the one that read it: a timekeeper thread
//! would have to be woken for every request, and again [`STALL`] later. When
//! a request has waited [`STALL`] with reads not yet started (a thread may be
//! stuck on one of them), its caller wakes or starts another thread, one more
//! each [`STALL`] while reads still wait; at its deadline, the request's
//! missing answers time out. So a hung file delays the other files by about
//! [`STALL`], and slow files are read in parallel after it.
//! [`wake_decision`] is the pure rule for when a queued read needs another
//! thread; [`Inner::look_at`] the one rule both clocks apply.
//!
//! This module owns the threads and the deadlines. It must not know what any file
//! means; all paths go through [`HostRoot`].

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::hash::{BuildHasherDefault, DefaultHasher, Hash, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;

use crate::descriptors::current_kept_descriptor_cap;
use crate::{HostError, HostRoot};

mod kept;
use kept::{KeptFiles, Replacements, read_kept};

/// How long a request waits before its caller checks on it (capped at a
/// quarter of its timeout), and how long a thread may be on one file before
/// it no longer counts as making progress.
pub const STALL: Duration = Duration::from_millis(5);

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
    /// Attribute files opened; the other reads went through a kept descriptor.
    pub opened: u64,
}

/// What to do with a path, in a [`BoundedReader::batch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Read an attribute (trimmed).
    Read,
    /// Read a binary attribute (`gpu_metrics`): its bytes, at most 64 KiB,
    /// through the same kept descriptors as [`Op::Read`].
    Bytes,
    /// Whether the path exists.
    Exists,
    /// List a directory, sorted; an absent directory is empty.
    List,
    /// Read a symbolic link's target, as a host path
    /// ([`HostRoot::read_link`]): the file a `/proc/<pid>/fd/<n>` names.
    Link,
}

/// The answer to one [`Op`].
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    Text(String),
    Bytes(Vec<u8>),
    Exists(bool),
    Names(Vec<String>),
}

/// A path with its hash, worked out once when a request is made. The
/// in-flight set and the kept descriptors look a path up at every read, and
/// a sample plan asks for the same paths sample after sample: hashing each
/// path once, not three times per read, is most of what those lookups cost.
#[derive(Clone, Debug)]
pub(crate) struct PathKey {
    hash: u64,
    path: Arc<str>,
}

impl PathKey {
    pub(crate) fn new(path: Arc<str>) -> Self {
        let mut hasher = DefaultHasher::new();
        path.hash(&mut hasher);
        Self {
            hash: hasher.finish(),
            path,
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.path
    }
}

impl From<&str> for PathKey {
    fn from(path: &str) -> Self {
        Self::new(Arc::from(path))
    }
}

impl PartialEq for PathKey {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.path == other.path
    }
}

impl Eq for PathKey {}

impl Hash for PathKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// Hashes a [`PathKey`] by the hash it carries.
#[derive(Default)]
pub(crate) struct CarriedHash(u64);

impl Hasher for CarriedHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `PathKey`s are hashed with it, and they write one u64; mix
        // anything else in rather than lose it.
        for &b in bytes {
            self.0 = self.0.rotate_left(5) ^ u64::from(b);
        }
    }
}

/// Sets and maps keyed by [`PathKey`].
pub(crate) type ByPath = BuildHasherDefault<CarriedHash>;

/// The paths of one request, shared by the caller and the threads. A caller
/// that reads the same paths again and again (a sample plan) keeps its
/// `Requests` and hands over a reference each time, so queueing copies and
/// hashes no path.
#[derive(Clone, Debug, Default)]
pub struct Requests(Arc<[(Op, PathKey)]>);

impl PartialEq for Requests {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for Requests {}

impl Requests {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (Op, &str)> {
        self.0.iter().map(|(op, path)| (*op, path.as_str()))
    }
}

impl From<Vec<(Op, String)>> for Requests {
    fn from(requests: Vec<(Op, String)>) -> Self {
        requests.into_iter().collect()
    }
}

impl FromIterator<(Op, String)> for Requests {
    fn from_iter<I: IntoIterator<Item = (Op, String)>>(requests: I) -> Self {
        Requests(
            requests
                .into_iter()
                .map(|(op, path)| (op, PathKey::new(Arc::from(path))))
                .collect(),
        )
    }
}

type Outcome = Option<Result<Answer, HostError>>;

/// One request's reads, queued as one unit (see the module doc).
struct Batch {
    requests: Requests,
    /// Indices into `requests` of the reads the threads do (the others were
    /// refused when queued); `answers[k]` answers `todo[k]`.
    todo: Vec<usize>,
    answers: Vec<Mutex<Outcome>>,
    /// The next read (index into `todo`) a thread takes. Changed under the
    /// state lock only.
    next: AtomicUsize,
    /// Reads answered, or skipped for a caller that no longer waits.
    done: AtomicUsize,
    waker: AtomicWaker,
    /// When it was asked for: replacements before it must be seen.
    queued_at: Instant,
    /// When its caller first checks on it, and when it gives up on it.
    stall_at: Instant,
    deadline: Instant,
    /// The deadline passed: the caller returns timeouts for missing answers.
    expired: AtomicBool,
    /// The caller stopped waiting (took its answers or was cancelled).
    abandoned: AtomicBool,
}

impl Batch {
    fn new(requests: Requests, todo: Vec<usize>, now: Instant, timeout: Duration) -> Self {
        Self {
            answers: todo.iter().map(|_| Mutex::new(None)).collect(),
            requests,
            todo,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            waker: AtomicWaker::new(),
            queued_at: now,
            stall_at: now + STALL.min(timeout / 4),
            deadline: now + timeout,
            expired: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
        }
    }

    fn len(&self) -> usize {
        self.todo.len()
    }

    fn read(&self, k: usize) -> (Op, &PathKey) {
        let (op, path) = &self.requests.0[self.todo[k]];
        (*op, path)
    }

    fn answer(&self, k: usize) -> MutexGuard<'_, Outcome> {
        // A poisoned slot still holds an answer or none: both are safe.
        self.answers[k].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn complete(&self) -> bool {
        self.done.load(Ordering::Acquire) >= self.todo.len()
    }

    /// Reads no thread has taken yet.
    fn unstarted(&self) -> usize {
        self.len().saturating_sub(self.next.load(Ordering::Relaxed))
    }

    /// Whether anyone still waits for its answers.
    fn wanted(&self) -> bool {
        !(self.abandoned.load(Ordering::Acquire) || self.expired.load(Ordering::Acquire))
    }
}

/// The caller's side of a [`Batch`]: ready once every read has its answer or
/// the deadline passed. It keeps the request's time itself (see the module
/// doc): awaited, on the runtime's timer; in [`BatchAnswered::wait_here`], by
/// parking the calling thread.
struct BatchAnswered {
    inner: Arc<Inner>,
    /// `None` once the answers are taken, or when nothing was queued.
    batch: Option<Arc<Batch>>,
    /// The reads refused when queued (stuck, or the reader shut down), by
    /// their index in `requests`, in order; usually none.
    refused: Vec<(usize, ReadError)>,
    requests: Requests,
    timeout: Duration,
    /// When the caller looks at the request next ([`Inner::look_at`]).
    next_look: Instant,
    /// The runtime timer for `next_look`, made at the first poll that has to
    /// wait: a request answered before that needs none.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// Where a request stands for its caller.
enum Standing {
    /// Every read answered, or the deadline passed: the answers can be taken.
    Done,
    /// Still waiting; look again at this time.
    WaitUntil(Instant),
}

impl BatchAnswered {
    /// Looks at the request when it is time to, and says whether the caller
    /// can take the answers or until when it waits.
    fn standing(&mut self) -> Standing {
        let Some(batch) = &self.batch else {
            return Standing::Done;
        };
        loop {
            if batch.complete() || batch.expired.load(Ordering::Acquire) {
                return Standing::Done;
            }
            let now = Instant::now();
            if now < self.next_look {
                return Standing::WaitUntil(self.next_look);
            }
            match self.inner.look_at(batch, now) {
                Some(at) => self.next_look = at,
                // Answered or expired meanwhile: the loop sees which.
                None => continue,
            }
        }
    }

    /// Takes the answers, in the order of `requests`: the refusals, and the
    /// batch's answers for the others; missing ones time out.
    fn take(&mut self) -> Vec<Result<Answer, ReadError>> {
        let batch = self.batch.take();
        let mut refused = std::mem::take(&mut self.refused).into_iter().peekable();
        let mut answers = Vec::with_capacity(self.requests.len());
        // The batch's reads are the requests not refused, in order.
        let mut queued = batch
            .iter()
            .flat_map(|b| b.todo.iter().enumerate())
            .peekable();
        for (i, (_, path)) in self.requests.iter().enumerate() {
            let answer = if let Some((_, refusal)) = refused.next_if(|(at, _)| *at == i) {
                Err(refusal)
            } else if let Some((k, _)) = queued.next_if(|(_, at)| **at == i) {
                let answer = batch.as_ref().and_then(|b| b.answer(k).take());
                match answer {
                    Some(answer) => answer.map_err(ReadError::Host),
                    None => {
                        self.inner.timeouts.fetch_add(1, Ordering::Relaxed);
                        Err(ReadError::TimedOut {
                            path: path.to_owned(),
                            timeout: self.timeout,
                        })
                    }
                }
            } else {
                // Neither refused nor queued: only if this module has a bug.
                Err(ReadError::Closed { path: path.into() })
            };
            answers.push(answer);
        }
        if let Some(batch) = batch {
            // Nobody waits any more: threads skip what is left.
            batch.abandoned.store(true, Ordering::Release);
        }
        answers
    }

    /// Waits on the calling thread, which may block: parked until the last
    /// answer unparks it or it is time to look at the request.
    fn wait_here(mut self) -> Vec<Result<Answer, ReadError>> {
        if let Some(batch) = &self.batch {
            let thread = Arc::new(ParkedThread(std::thread::current()));
            batch.waker.register(&std::task::Waker::from(thread));
        }
        while let Standing::WaitUntil(at) = self.standing() {
            // Woken early by the answer, or spuriously: `standing` tells.
            std::thread::park_timeout(at.saturating_duration_since(Instant::now()));
        }
        self.take()
    }
}

/// Wakes a thread parked in [`BatchAnswered::wait_here`].
struct ParkedThread(std::thread::Thread);

impl std::task::Wake for ParkedThread {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

impl Future for BatchAnswered {
    type Output = Vec<Result<Answer, ReadError>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let Some(batch) = &this.batch {
            batch.waker.register(cx.waker());
        }
        loop {
            let at = match this.standing() {
                Standing::Done => return Poll::Ready(this.take()),
                Standing::WaitUntil(at) => tokio::time::Instant::from_std(at),
            };
            if tokio::runtime::Handle::try_current().is_err() {
                // No runtime, so no clock to keep the deadline with: give up
                // on what is not answered rather than wait for ever.
                tracing::error!(
                    "a host read was awaited outside the async runtime; use batch_blocking"
                );
                if let Some(batch) = &this.batch {
                    batch.expired.store(true, Ordering::Release);
                }
                continue;
            }
            let timer = this
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
            if timer.deadline() != at {
                timer.as_mut().reset(at);
            }
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

impl Drop for BatchAnswered {
    fn drop(&mut self) {
        if let Some(batch) = &self.batch {
            batch.abandoned.store(true, Ordering::Release);
        }
    }
}

#[derive(Default)]
struct State {
    queue: VecDeque<Arc<Batch>>,
    /// Paths queued or being read. A path stays here while its read is stuck.
    in_flight: HashSet<PathKey, ByPath>,
    /// When each thread (by index) started the file it is on, if any.
    busy_since: Vec<Option<Instant>>,
    /// Threads waiting for work, notified or not.
    idle: usize,
    /// Notifications sent to idle threads that have not woken yet.
    waking: usize,
    /// The idle threads not yet notified, the one that went idle last on
    /// top: it is woken first, while what it touched is still in the
    /// caches (a pool woken in turn runs each thread cold).
    sleeping: Vec<usize>,
    /// Which threads (by index) have been notified and not yet woken.
    notified: Vec<bool>,
    threads: usize,
    shutdown: bool,
}

impl State {
    /// Takes the next read off the queue: its request and its index there.
    fn claim(&mut self) -> Option<(Arc<Batch>, usize)> {
        loop {
            let front = self.queue.front()?;
            let k = front.next.load(Ordering::Relaxed);
            if k >= front.len() {
                self.queue.pop_front();
                continue;
            }
            front.next.store(k + 1, Ordering::Relaxed);
            if k + 1 < front.len() {
                return Some((front.clone(), k));
            }
            return self.queue.pop_front().map(|batch| (batch, k));
        }
    }
}

/// How a request's reads are going, at a look after [`STALL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    /// Since it was queued.
    pub elapsed: Duration,
    /// Reads answered, and reads no thread has started.
    pub done: usize,
    pub waiting: usize,
    /// Until its deadline.
    pub left: Duration,
}

impl Pace {
    /// Whether, at the pace of the reads answered so far, those still
    /// waiting end within half the time left. A request of a thousand
    /// reads (a full discovery) outlasts [`STALL`] on one thread without any
    /// file being slow, and more threads would only start, contend for the
    /// queue and keep a memory arena each.
    pub fn keeps_up(&self) -> bool {
        let Ok(done) = u32::try_from(self.done) else {
            return true;
        };
        if done == 0 {
            return false;
        }
        let waiting = u32::try_from(self.waiting).unwrap_or(u32::MAX);
        let per_read = self.elapsed / done;
        per_read
            .checked_mul(waiting)
            .is_some_and(|rest| rest <= self.left / 2)
    }
}

/// What a queued read needs so that some thread gets to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// A thread that is making progress will get to it.
    Nothing,
    /// Wake an idle thread.
    Idle,
    /// Start a thread.
    Spawn,
}

/// The facts [`wake_decision`] decides from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolFacts {
    pub threads: usize,
    pub max_threads: usize,
    /// Threads waiting for work, and how many of them were already woken.
    pub idle: usize,
    pub waking: usize,
    /// Threads between two files (they look at the queue next).
    pub between: usize,
    /// Threads on a file they started less than [`STALL`] ago.
    pub recent: usize,
}

/// Whether a read just queued (`stalled == false`) or one that has waited
/// [`STALL`] without being started, in a request that does not keep its pace
/// ([`Pace::keeps_up`]; `stalled == true`), needs another thread.
/// A thread that is between files, on a file it started recently, or about
/// to wake will get to a new read; one that has been on a file longer may be
/// stuck, so it does not count. A stalled read wants one more thread whatever
/// the others do: they are slow.
pub fn wake_decision(facts: PoolFacts, stalled: bool) -> Wake {
    let progressing = facts.between + facts.recent + facts.waking > 0;
    if progressing && !stalled {
        Wake::Nothing
    } else if facts.idle > facts.waking {
        Wake::Idle
    } else if facts.threads < facts.max_threads {
        Wake::Spawn
    } else {
        Wake::Nothing
    }
}

struct Inner {
    host: HostRoot,
    max_threads: usize,
    state: Mutex<State>,
    /// One per thread (by index), so that a notification goes to the thread
    /// chosen for it.
    work: Vec<Condvar>,
    reads: AtomicU64,
    timeouts: AtomicU64,
    skipped: AtomicU64,
    opened: AtomicU64,
    kept: Mutex<KeptFiles>,
    replacements: Mutex<Replacements>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A worker never panics while holding the lock (reads happen outside it),
        // so a poisoned lock still holds consistent state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn facts(&self, state: &State, now: Instant) -> PoolFacts {
        let busy = state.busy_since.iter().flatten();
        let (mut on_file, mut recent) = (0, 0);
        for since in busy {
            on_file += 1;
            if now.saturating_duration_since(*since) < STALL {
                recent += 1;
            }
        }
        PoolFacts {
            threads: state.threads,
            max_threads: self.max_threads,
            idle: state.idle,
            waking: state.waking,
            between: state.threads.saturating_sub(state.idle + on_file),
            recent,
        }
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
        for work in &self.0.work {
            work.notify_all();
        }
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
            work: (0..max_threads.max(1)).map(|_| Condvar::new()).collect(),
            reads: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            opened: AtomicU64::new(0),
            kept: Mutex::new(KeptFiles::new(current_kept_descriptor_cap())),
            replacements: Mutex::new(Replacements::default()),
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
        match self.one(path, Op::Read, timeout).await? {
            Answer::Text(text) => Ok(text),
            _ => unreachable_answer(path),
        }
    }

    /// Reads a binary attribute's bytes (at most 64 KiB), as [`Op::Bytes`].
    pub async fn read_bytes(&self, path: &str, timeout: Duration) -> Result<Vec<u8>, ReadError> {
        match self.one(path, Op::Bytes, timeout).await? {
            Answer::Bytes(bytes) => Ok(bytes),
            _ => unreachable_answer(path),
        }
    }

    /// Whether a path exists. `stat` on sysfs can block like a read can.
    pub async fn exists(&self, path: &str, timeout: Duration) -> Result<bool, ReadError> {
        match self.one(path, Op::Exists, timeout).await? {
            Answer::Exists(exists) => Ok(exists),
            _ => unreachable_answer(path),
        }
    }

    /// Lists a directory, sorted; an absent directory is empty.
    pub async fn list_dir(&self, path: &str, timeout: Duration) -> Result<Vec<String>, ReadError> {
        match self.one(path, Op::List, timeout).await? {
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
            opened: self.inner.opened.load(Ordering::Relaxed),
        }
    }

    /// Attribute descriptors kept open now.
    pub fn kept(&self) -> usize {
        self.inner
            .kept
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Paths whose read has been queued or running (stuck ones included).
    pub fn in_flight(&self) -> Vec<String> {
        let mut paths: Vec<String> = self
            .inner
            .lock()
            .in_flight
            .iter()
            .map(|p| p.as_str().to_owned())
            .collect();
        paths.sort();
        paths
    }

    async fn one(&self, path: &str, op: Op, timeout: Duration) -> Result<Answer, ReadError> {
        only_answer(self.batch(vec![(op, path.to_owned())], timeout).await, path)
    }

    /// Reads many paths at once, each with `timeout`, queued as one request:
    /// one hand-off to the threads and one wake-up of the caller. Each path
    /// is treated as a read on its own: a hung one costs its own value, and
    /// one still stuck from an earlier read is refused. Answers come back in
    /// the order of `requests`. A path given twice is refused the second
    /// time, as a concurrent read of the same file is.
    ///
    /// Await it on the tokio runtime (its timer keeps the deadlines); a
    /// thread outside the runtime uses [`BoundedReader::batch_blocking`].
    pub async fn batch(
        &self,
        requests: impl Into<Requests>,
        timeout: Duration,
    ) -> Vec<Result<Answer, ReadError>> {
        self.queue(requests.into(), timeout).await
    }

    /// [`BoundedReader::batch`] for a thread that may block (not an async
    /// worker): it waits parked, and keeps the deadlines itself.
    pub fn batch_blocking(
        &self,
        requests: impl Into<Requests>,
        timeout: Duration,
    ) -> Vec<Result<Answer, ReadError>> {
        self.queue(requests.into(), timeout).wait_here()
    }

    /// One read of [`BoundedReader::batch_blocking`].
    pub fn one_blocking(&self, op: Op, path: &str, timeout: Duration) -> Result<Answer, ReadError> {
        only_answer(
            self.batch_blocking(vec![(op, path.to_owned())], timeout),
            path,
        )
    }

    fn queue(&self, requests: Requests, timeout: Duration) -> BatchAnswered {
        let now = Instant::now();
        let mut refused = Vec::new();
        let mut todo = Vec::with_capacity(requests.len());
        let mut state = self.inner.lock();
        for (i, (_, path)) in requests.0.iter().enumerate() {
            if state.shutdown {
                refused.push((
                    i,
                    ReadError::Closed {
                        path: path.as_str().to_owned(),
                    },
                ));
            } else if !state.in_flight.insert(path.clone()) {
                self.inner.skipped.fetch_add(1, Ordering::Relaxed);
                refused.push((
                    i,
                    ReadError::Stuck {
                        path: path.as_str().to_owned(),
                    },
                ));
            } else {
                todo.push(i);
            }
        }
        let mut batch = None;
        let mut woken = Woken::Nothing;
        if !todo.is_empty() {
            let queued = Arc::new(Batch::new(requests.clone(), todo, now, timeout));
            state.queue.push_back(queued.clone());
            woken = wake(&self.inner, &mut state, false);
            if woken != Woken::Failed || state.threads > 0 {
                self.inner
                    .reads
                    .fetch_add(queued.len() as u64, Ordering::Relaxed);
                batch = Some(queued);
            } else {
                // No thread at all, so none took a read: give the paths back,
                // so that the caller can retry later rather than have them
                // marked stuck forever.
                state.queue.retain(|b| !Arc::ptr_eq(b, &queued));
                for (k, &i) in queued.todo.iter().enumerate() {
                    let path = queued.read(k).1;
                    state.in_flight.remove(path);
                    refused.push((
                        i,
                        ReadError::Closed {
                            path: path.as_str().to_owned(),
                        },
                    ));
                }
                refused.sort_by_key(|(i, _)| *i);
            }
        }
        drop(state);
        // After the lock is let go: the woken thread takes it at once.
        woken.notify(&self.inner);
        let next_look = batch.as_ref().map_or(now, |b| b.stall_at);
        BatchAnswered {
            inner: self.inner.clone(),
            batch,
            refused,
            requests,
            timeout,
            next_look,
            timer: None,
        }
    }
}

/// The answer to a request of one read.
fn only_answer(answers: Vec<Result<Answer, ReadError>>, path: &str) -> Result<Answer, ReadError> {
    answers
        .into_iter()
        .next()
        .unwrap_or_else(|| Err(ReadError::Closed { path: path.into() }))
}

/// What [`wake`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Woken {
    /// No thread was needed.
    Nothing,
    /// This idle thread is to be notified, once the state lock is let go.
    Notify(usize),
    /// A thread was started.
    Spawned,
    /// A thread was needed and could not be started.
    Failed,
}

impl Woken {
    fn notify(self, inner: &Inner) {
        if let Woken::Notify(index) = self
            && let Some(work) = inner.work.get(index)
        {
            work.notify_one();
        }
    }
}

/// Wakes or starts a thread if a queued read needs one (see [`Woken`]).
fn wake(inner: &Arc<Inner>, state: &mut State, stalled: bool) -> Woken {
    match wake_decision(inner.facts(state, Instant::now()), stalled) {
        Wake::Nothing => Woken::Nothing,
        Wake::Idle => match state.sleeping.pop() {
            Some(index) => {
                state.waking += 1;
                if let Some(notified) = state.notified.get_mut(index) {
                    *notified = true;
                }
                Woken::Notify(index)
            }
            // `idle > waking` means someone sleeps un-notified; only a bug
            // in this module gets here, and the caller's next look retries.
            None => Woken::Nothing,
        },
        Wake::Spawn => {
            let index = state.threads;
            let worker_inner = inner.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("sysfs-reader-{index}"))
                .spawn(move || worker(worker_inner, index));
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start a sysfs reader thread");
                return Woken::Failed;
            }
            state.threads += 1;
            if state.busy_since.len() <= index {
                state.busy_since.resize(index + 1, None);
                state.notified.resize(index + 1, false);
            }
            Woken::Spawned
        }
    }
}

impl Inner {
    /// A caller's look at its waiting request at `now` (see the module doc):
    /// at the deadline the request expires; while reads wait unstarted past
    /// the stall time, one more thread for them if no thread is making
    /// progress or the reads go too slowly to end well inside the deadline
    /// ([`Pace::keeps_up`]), and another look after
    /// [`STALL`] as long as more threads could help (on a busy machine any
    /// thread is late now and then, and waking the whole pool at once costs
    /// more than the wait). Returns when to look next, or `None` when the
    /// request is answered or expired.
    fn look_at(self: &Arc<Self>, batch: &Batch, now: Instant) -> Option<Instant> {
        if batch.complete() {
            return None;
        }
        if now >= batch.deadline {
            batch.expired.store(true, Ordering::Release);
            return None;
        }
        if now < batch.stall_at {
            return Some(batch.stall_at);
        }
        if batch.unstarted() == 0 {
            return Some(batch.deadline);
        }
        let mut state = self.lock();
        let pace = Pace {
            elapsed: now.saturating_duration_since(batch.queued_at),
            done: batch.done.load(Ordering::Acquire),
            waiting: batch.unstarted(),
            left: batch.deadline.saturating_duration_since(now),
        };
        // A request that keeps its pace is only waiting, like one just
        // queued: a thread making progress gets to it.
        let woken = wake(self, &mut state, !pace.keeps_up());
        let more_could_help = woken != Woken::Failed
            && batch.unstarted() > state.waking
            && (state.threads < self.max_threads || state.idle > state.waking);
        drop(state);
        woken.notify(self);
        Some(if more_could_help {
            (now + STALL).min(batch.deadline)
        } else {
            batch.deadline
        })
    }
}

fn unreachable_answer<T>(path: &str) -> Result<T, ReadError> {
    // Each operation has exactly one answer kind; this is only reachable through
    // a bug in this module, and a missing value is the safe outcome.
    Err(ReadError::Closed { path: path.into() })
}

/// One read, on a reader thread.
fn read_one(
    inner: &Inner,
    op: Op,
    key: &PathKey,
    buf: &mut Vec<u8>,
    queued_at: Instant,
) -> Result<Answer, HostError> {
    let path = key.as_str();
    match op {
        Op::Read | Op::Bytes => read_kept(inner, key, op, buf, queued_at),
        Op::Exists => Ok(Answer::Exists(inner.host.exists(path))),
        Op::List => inner.host.list_dir_or_empty(path).map(Answer::Names),
        Op::Link => inner.host.read_link(path).map(Answer::Text),
    }
}

/// Waits, idle, until this thread is notified (see [`State::sleeping`]) or
/// the reader shuts down.
fn sleep<'a>(
    inner: &'a Inner,
    mut state: MutexGuard<'a, State>,
    index: usize,
) -> MutexGuard<'a, State> {
    let Some(work) = inner.work.get(index) else {
        return state;
    };
    state.idle += 1;
    state.sleeping.push(index);
    // A wake-up without a notification (spurious) waits again.
    while !state.shutdown && !state.notified.get(index).copied().unwrap_or(true) {
        state = work.wait(state).unwrap_or_else(|p| p.into_inner());
    }
    state.idle -= 1;
    match state.notified.get_mut(index) {
        Some(notified) if *notified => {
            *notified = false;
            state.waking = state.waking.saturating_sub(1);
        }
        // Shut down while still asleep: no longer one to notify.
        _ => state.sleeping.retain(|&i| i != index),
    }
    state
}

fn worker(inner: Arc<Inner>, index: usize) {
    // Each kept attribute is read into this page, reused from read to read.
    let mut buf: Vec<u8> = Vec::new();
    // A request this thread answered last: its caller is woken once the lock
    // is let go.
    let mut finished: Option<Arc<Batch>> = None;
    let mut state = inner.lock();
    loop {
        if let Some(batch) = finished.take() {
            drop(state);
            batch.waker.wake();
            state = inner.lock();
        }
        let Some((batch, k)) = state.claim() else {
            if state.shutdown {
                state.threads -= 1;
                return;
            }
            state = sleep(&inner, state, index);
            continue;
        };
        if let Some(since) = state.busy_since.get_mut(index) {
            *since = Some(Instant::now());
        }
        drop(state);
        let (op, path) = batch.read(k);
        // A caller that already gave up does not need the value; skipping keeps a
        // queue that built up behind hung files from being read for nothing.
        let result = batch
            .wanted()
            .then(|| read_one(&inner, op, path, &mut buf, batch.queued_at));
        state = inner.lock();
        if let Some(since) = state.busy_since.get_mut(index) {
            *since = None;
        }
        // The path is free again before the caller hears back, so that it can
        // read the same file again right away.
        state.in_flight.remove(path);
        if result.is_some() {
            *batch.answer(k) = result;
        }
        if batch.done.fetch_add(1, Ordering::AcqRel) + 1 == batch.len() {
            finished = Some(batch);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) const SHORT: Duration = Duration::from_millis(100);

    pub(super) fn host() -> (tempfile::TempDir, HostRoot) {
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

    #[test]
    fn a_path_is_found_by_a_key_made_anew_and_only_by_its_own() {
        let mut set: HashSet<PathKey, ByPath> = HashSet::default();
        let request: Requests = vec![(Op::Read, "/sys/a".to_owned())].into();
        assert!(set.insert(request.0[0].1.clone()));
        assert!(set.contains(&PathKey::from("/sys/a")));
        assert!(!set.contains(&PathKey::from("/sys/b")));
        assert!(!set.insert(PathKey::from("/sys/a")), "the same path twice");
        assert!(set.remove(&PathKey::from("/sys/a")) && set.is_empty());
    }

    #[test]
    fn a_request_that_keeps_its_pace_needs_no_more_threads() {
        let ms = Duration::from_millis;
        let pace = |elapsed, done, waiting, left| Pace {
            elapsed: ms(elapsed),
            done,
            waiting,
            left: ms(left),
        };
        // A thousand quick reads, a third done after 5 ms: on pace.
        assert!(pace(5, 300, 700, 995).keeps_up());
        // Nothing answered yet: no pace to judge by.
        assert!(!pace(5, 0, 1000, 995).keeps_up());
        // Slow reads: the rest would take 700 ms of the 995 left.
        assert!(!pace(300, 300, 700, 700).keeps_up());
        // At the edge: exactly half the time left.
        assert!(pace(10, 10, 50, 100).keeps_up());
        assert!(!pace(10, 10, 51, 100).keeps_up());
    }

    #[test]
    fn reads_wake_a_thread_only_when_none_is_making_progress() {
        let pool = |threads, idle, waking, between, recent| PoolFacts {
            threads,
            max_threads: 4,
            idle,
            waking,
            between,
            recent,
        };
        // No thread yet: start one.
        assert_eq!(wake_decision(pool(0, 0, 0, 0, 0), false), Wake::Spawn);
        // One idle thread: wake it, once.
        assert_eq!(wake_decision(pool(1, 1, 0, 0, 0), false), Wake::Idle);
        assert_eq!(wake_decision(pool(1, 1, 1, 0, 0), false), Wake::Nothing);
        // A thread between files or on a recent file will get to the read.
        assert_eq!(wake_decision(pool(2, 1, 0, 1, 0), false), Wake::Nothing);
        assert_eq!(wake_decision(pool(2, 1, 0, 0, 1), false), Wake::Nothing);
        // One on an old file may be stuck: wake the idle one, or start one.
        assert_eq!(wake_decision(pool(2, 1, 0, 0, 0), false), Wake::Idle);
        assert_eq!(wake_decision(pool(2, 0, 0, 0, 0), false), Wake::Spawn);
        // A stalled read wants another thread even when others progress.
        assert_eq!(wake_decision(pool(2, 1, 0, 0, 1), true), Wake::Idle);
        assert_eq!(wake_decision(pool(2, 0, 0, 0, 2), true), Wake::Spawn);
        // At the cap with every thread busy, the read waits (and times out).
        assert_eq!(wake_decision(pool(4, 0, 0, 0, 0), true), Wake::Nothing);
        assert_eq!(wake_decision(pool(4, 1, 1, 0, 0), true), Wake::Nothing);
    }
}
