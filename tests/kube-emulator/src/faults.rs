//! Fault injection and request accounting.
//!
//! [`Faults`] is the handle tests use to make the server misbehave: fail the next N matching
//! requests with a status code, add latency, drop every open watch, compact the history.
//! [`RequestCounts`] is a snapshot of how many requests the server has seen, by verb,
//! resource and watch-ness, that tests can diff (`later.since(&earlier)`).
//!
//! Request keys use the resource's plural name, qualified by its group when it has one, and
//! the subresource after a slash: `pods`, `pods/eviction`, `nodes/status`,
//! `leases.coordination.k8s.io`, `deviceconfigs.amd.com/status`. Requests that name no
//! resource (discovery, `/version`) use their path: `/api`, `/apis/apps/v1`. Verbs are the
//! Kubernetes ones: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
//! `deletecollection`.
//!
//! This module only records rules and counts; the server applies them at the door, before a
//! request reaches the store, so faults never change stored state.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::server::Shared;

/// What a request was, for counting and fault matching.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKey {
    pub verb: String,
    pub resource: String,
    /// True for watch requests (the `watch` verb).
    pub watch: bool,
}

impl fmt::Display for RequestKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)
    }
}

/// One write request (create, update, patch, delete), in the order the
/// server received it: what a test reads to check that steps happened in
/// order. Reads and watches are only counted ([`RequestCounts`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedWrite {
    pub verb: String,
    /// As in [`RequestKey::resource`]: `nodes`, `pods/eviction`, ...
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The request's `fieldManager`, if it gave one.
    pub field_manager: Option<String>,
    /// Who sent it: the username of its bearer token (`system:admin` without
    /// one, see `Emulator::client_as`).
    pub user: String,
}

impl fmt::Display for LoggedWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if let Some(ns) = &self.namespace {
            write!(f, " {ns}/")?;
        } else {
            write!(f, " ")?;
        }
        write!(f, "{}", self.name.as_deref().unwrap_or(""))
    }
}

/// How many writes [`LoggedWrite`]s the server keeps, oldest dropped first.
pub const WRITE_LOG_LIMIT: usize = 100_000;

/// A snapshot of request counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestCounts(pub BTreeMap<RequestKey, u64>);

impl RequestCounts {
    /// Requests with this verb and resource.
    pub fn get(&self, verb: &str, resource: &str) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| k.verb == verb && k.resource == resource)
            .map(|(_, n)| n)
            .sum()
    }

    /// All requests.
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// Watch requests.
    pub fn watches(&self) -> u64 {
        self.0.iter().filter(|(k, _)| k.watch).map(|(_, n)| n).sum()
    }

    /// Everything but watch requests.
    pub fn non_watch(&self) -> RequestCounts {
        self.filter(|k| !k.watch)
    }

    /// The counts for which `keep` holds.
    pub fn filter(&self, keep: impl Fn(&RequestKey) -> bool) -> RequestCounts {
        RequestCounts(
            self.0
                .iter()
                .filter(|(k, _)| keep(k))
                .map(|(k, n)| (k.clone(), *n))
                .collect(),
        )
    }

    /// Requests made after `earlier` was taken (counts never go down).
    pub fn since(&self, earlier: &RequestCounts) -> RequestCounts {
        RequestCounts(
            self.0
                .iter()
                .filter_map(|(k, n)| {
                    let d = n.saturating_sub(earlier.0.get(k).copied().unwrap_or(0));
                    (d > 0).then(|| (k.clone(), d))
                })
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.total() == 0
    }

    /// The `/debug/requests` document.
    pub fn to_json(&self) -> Value {
        let requests: Vec<Value> = self
            .0
            .iter()
            .map(|(k, n)| json!({"verb": k.verb, "resource": k.resource, "watch": k.watch, "count": n}))
            .collect();
        json!({
            "total": self.total(),
            "watches": self.watches(),
            "requests": requests,
        })
    }
}

impl fmt::Display for RequestCounts {
    /// One `verb resource: count` line per key, for assertion messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return write!(f, "(no requests)");
        }
        for (k, n) in &self.0 {
            writeln!(f, "{k}: {n}")?;
        }
        Ok(())
    }
}

/// A rule that fails matching requests.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FailRule {
    pub verb: String,
    pub resource: String,
    pub remaining: u32,
    pub code: u16,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LatencyRule {
    pub verb: String,
    pub resource: String,
    pub delay: Duration,
}

/// Injected faults; lives inside the server state.
#[derive(Debug, Default)]
pub(crate) struct FaultState {
    pub fail: Vec<FailRule>,
    pub latency: Vec<LatencyRule>,
}

fn pattern_matches(pattern: &str, value: &str) -> bool {
    pattern == "*" || pattern == value
}

impl FaultState {
    /// The code to fail this request with, consuming one use of the first matching rule.
    pub fn take_failure(&mut self, key: &RequestKey) -> Option<u16> {
        let rule = self.fail.iter_mut().find(|r| {
            r.remaining > 0
                && pattern_matches(&r.verb, &key.verb)
                && pattern_matches(&r.resource, &key.resource)
        })?;
        rule.remaining -= 1;
        let code = rule.code;
        self.fail.retain(|r| r.remaining > 0);
        Some(code)
    }

    /// Total added latency for this request.
    pub fn latency(&self, key: &RequestKey) -> Duration {
        self.latency
            .iter()
            .filter(|r| {
                pattern_matches(&r.verb, &key.verb) && pattern_matches(&r.resource, &key.resource)
            })
            .map(|r| r.delay)
            .sum()
    }
}

/// Handle for injecting faults into a running emulator. Cheap to clone; `verb` and
/// `resource` use the same names as [`RequestKey`], and `"*"` matches anything.
#[derive(Clone)]
pub struct Faults {
    pub(crate) shared: Arc<Shared>,
}

impl Faults {
    /// Fails the next `count` requests matching `verb` and `resource` with `code`; the body
    /// is a `metav1.Status` with the reason the real server uses for that code. Watches fail
    /// before the stream starts.
    pub fn fail_next(&self, count: u32, verb: &str, resource: &str, code: u16) {
        if count == 0 {
            return;
        }
        self.shared.faults().fail.push(FailRule {
            verb: verb.to_string(),
            resource: resource.to_string(),
            remaining: count,
            code,
        });
    }

    /// How many injected failures are still waiting to happen.
    pub fn pending_failures(&self) -> u32 {
        self.shared.faults().fail.iter().map(|r| r.remaining).sum()
    }

    /// Delays every request matching `verb` and `resource` by `delay` before it is handled.
    /// Rules add up.
    pub fn add_latency(&self, verb: &str, resource: &str, delay: Duration) {
        self.shared.faults().latency.push(LatencyRule {
            verb: verb.to_string(),
            resource: resource.to_string(),
            delay,
        });
    }

    /// Removes all failure and latency rules.
    pub fn clear(&self) {
        let mut f = self.shared.faults();
        f.fail.clear();
        f.latency.clear();
    }

    /// Breaks every open watch connection (the client sees the connection end mid-stream,
    /// as when a network path or an API server instance goes away). Returns how many watches
    /// were open.
    pub fn drop_watches(&self) -> usize {
        self.shared.drop_watches()
    }

    /// Compacts the history: every resourceVersion handed out so far becomes too old, so
    /// watch resumes get a `410` `ERROR` event and exact or continued lists get `410`.
    /// Returns the new oldest usable resourceVersion.
    pub fn compact(&self) -> u64 {
        let mut store = self.shared.store();
        store.compact();
        store.compacted_revision()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(verb: &str, resource: &str) -> RequestKey {
        RequestKey {
            verb: verb.into(),
            resource: resource.into(),
            watch: verb == "watch",
        }
    }

    #[test]
    fn failures_are_consumed_in_order() {
        let mut f = FaultState::default();
        f.fail.push(FailRule {
            verb: "get".into(),
            resource: "pods".into(),
            remaining: 2,
            code: 503,
        });
        f.fail.push(FailRule {
            verb: "*".into(),
            resource: "*".into(),
            remaining: 1,
            code: 500,
        });
        assert_eq!(f.take_failure(&key("get", "pods")), Some(503));
        assert_eq!(f.take_failure(&key("list", "nodes")), Some(500));
        assert_eq!(f.take_failure(&key("list", "nodes")), None);
        assert_eq!(f.take_failure(&key("get", "pods")), Some(503));
        assert_eq!(f.take_failure(&key("get", "pods")), None);
    }

    #[test]
    fn latency_adds_up() {
        let mut f = FaultState::default();
        f.latency.push(LatencyRule {
            verb: "*".into(),
            resource: "*".into(),
            delay: Duration::from_millis(5),
        });
        f.latency.push(LatencyRule {
            verb: "list".into(),
            resource: "pods".into(),
            delay: Duration::from_millis(10),
        });
        assert_eq!(f.latency(&key("list", "pods")), Duration::from_millis(15));
        assert_eq!(f.latency(&key("get", "pods")), Duration::from_millis(5));
    }

    #[test]
    fn counts_diff_and_filter() {
        let mut a = RequestCounts::default();
        a.0.insert(key("list", "pods"), 2);
        a.0.insert(key("watch", "pods"), 1);
        let mut b = a.clone();
        *b.0.get_mut(&key("list", "pods")).unwrap() += 3;
        b.0.insert(key("get", "nodes"), 1);
        let d = b.since(&a);
        assert_eq!(d.get("list", "pods"), 3);
        assert_eq!(d.get("get", "nodes"), 1);
        assert_eq!(d.get("watch", "pods"), 0);
        assert_eq!(d.total(), 4);
        assert_eq!(b.watches(), 1);
        assert_eq!(b.non_watch().total(), 6);
        assert_eq!(b.to_json()["total"], 7);
        assert!(format!("{d}").contains("list pods: 3"));
    }
}
