//! Waiting on evidence, for every test crate (the emulator's tests include this
//! file too, by path). A test waits for what it expects to see, never for a
//! fixed time: each helper polls a check and returns as soon as it holds, and
//! fails after [`WAIT`] with what it waited for and, where the caller can say,
//! the state it saw last.
//!
//! Plain `fn` checks come in an async form ([`eventually`]) and a blocking
//! one ([`eventually_blocking`]) for tests that drive child processes from
//! plain threads. Checks that must await (an API call, an HTTP request) use
//! [`poll_until`], which also keeps the last answer for the failure message.
#![allow(dead_code)] // each test binary uses a different subset

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

/// How long a test waits for anything it expects. One bound for every test:
/// generous, because the machine may be loaded (two cores running a build),
/// and harmless, because a passing wait returns as soon as its check holds.
pub const WAIT: Duration = Duration::from_secs(20);

/// Time between two looks.
const POLL: Duration = Duration::from_millis(20);

/// Polls `check` until it holds; panics after [`WAIT`] naming `what`.
pub async fn eventually(what: &str, check: impl FnMut() -> bool) {
    eventually_explained(what, check, String::new).await
}

/// As [`eventually`], adding `explain()` (e.g. the object last seen) to the
/// failure message.
pub async fn eventually_explained(
    what: &str,
    check: impl FnMut() -> bool,
    explain: impl FnOnce() -> String,
) {
    eventually_within(what, WAIT, check, explain).await
}

/// As [`eventually_explained`], for work that takes longer than any single
/// step may: a whole rolling upgrade over several nodes, say. `limit` is
/// that work's bound, not a guess at how long it takes.
pub async fn eventually_within(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> bool,
    explain: impl FnOnce() -> String,
) {
    let deadline = Instant::now() + limit;
    while !check() {
        if Instant::now() >= deadline {
            panic!(
                "timed out after {limit:?} waiting for {what}\n{}",
                explain()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Awaits `probe()` until `done` holds for its answer, and returns that
/// answer; panics after [`WAIT`] with the last answer.
pub async fn poll_until<T: Debug, F: Future<Output = T>>(
    what: &str,
    mut probe: impl FnMut() -> F,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        let answer = probe().await;
        if done(&answer) {
            return answer;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {WAIT:?} waiting for {what}; last answer: {answer:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Runs `work`, panicking if it takes longer than [`WAIT`].
pub async fn within<T>(what: &str, work: impl Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT, work).await {
        Ok(value) => value,
        Err(_) => panic!("timed out after {WAIT:?}: {what}"),
    }
}

/// [`eventually`] for plain threads.
pub fn eventually_blocking(what: &str, check: impl FnMut() -> bool) {
    eventually_blocking_explained(what, check, String::new)
}

/// [`eventually_explained`] for plain threads.
pub fn eventually_blocking_explained(
    what: &str,
    mut check: impl FnMut() -> bool,
    explain: impl FnOnce() -> String,
) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        if Instant::now() >= deadline {
            panic!("timed out after {WAIT:?} waiting for {what}\n{}", explain());
        }
        std::thread::sleep(POLL);
    }
}

/// [`poll_until`] for plain threads.
pub fn poll_until_blocking<T: Debug>(
    what: &str,
    mut probe: impl FnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        let answer = probe();
        if done(&answer) {
            return answer;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {WAIT:?} waiting for {what}; last answer: {answer:?}");
        }
        std::thread::sleep(POLL);
    }
}
