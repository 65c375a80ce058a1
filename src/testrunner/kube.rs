//! The test runner's side of the Kubernetes API: what its result Events are,
//! the running-state Node labels, and removing a handled test request.
//!
//! Results are core/v1 Events because the reference labels them
//! (`testrunner.amd.com/...`), which the `events.k8s.io` recorder does not do: they
//! are [`Origin::Labelled`] Events ([`node_event`]), which the agent's
//! [`crate::events::EventSink`] creates. They are about the Node, so they live
//! in the `default` namespace: the API server accepts Events about
//! cluster-scoped objects only there (`kubectl get events -A -l
//! testrunner.amd.com/category=gpu_health_check` finds them; `kubectl describe
//! node` shows them). The name prefix is the reference's
//! `amd-test-runner-<category>-` with `_` written as `-`, since an object name
//! must be an RFC 1123 subdomain.
//!
//! Building them is pure ([`node_event`], [`result_event`], [`running_labels`]);
//! [`Kube`] writes the Node, through the Node writer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client};

use super::config::CATEGORY;
use super::decide::{REQUEST_RECEIPT_ANNOTATION, TEST_REQUEST_ANNOTATION};
use super::report::{EVENT_COMPONENT, EventContent, RUNNING};
use crate::events::{EventType, Labelled, NodeEvent, Origin, core_event};
use crate::node_writer::{Concern, NodeIntent, NodeWriteError, NodeWriter};

/// Namespace of the Events about the Node.
pub const EVENT_NAMESPACE: &str = crate::events::NODE_EVENT_NAMESPACE;
/// Event reason for a configuration or request the runner cannot use.
pub const CONFIG_ERROR_REASON: &str = "TestConfigError";

/// `amd-test-runner-gpu-health-check-`.
pub fn event_name_prefix() -> String {
    format!(
        "{EVENT_COMPONENT}-{}-",
        CATEGORY.to_ascii_lowercase().replace('_', "-")
    )
}

/// The Event `content` is: labelled, from `amd-test-runner`, about the Node.
pub fn node_event(content: EventContent) -> NodeEvent {
    NodeEvent {
        type_: if content.type_ == "Warning" {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: content.reason,
        note: Some(content.message),
        about: None,
        origin: Origin::Labelled(labelled(content.labels)),
    }
}

fn labelled(labels: BTreeMap<String, String>) -> Labelled {
    Labelled {
        component: EVENT_COMPONENT,
        name_prefix: event_name_prefix(),
        labels,
    }
}

/// The core/v1 Event about `node`.
pub fn result_event(
    content: EventContent,
    node: &str,
    node_uid: Option<&str>,
    now: Timestamp,
) -> Event {
    let labelled = labelled(content.labels.clone());
    core_event(&node_event(content), &labelled, node, node_uid, now)
}

/// The running-state labels of the test cases running now: the test
/// runner's whole intent for the Node's labels.
pub fn running_labels(keys: &BTreeSet<String>) -> BTreeMap<String, String> {
    keys.iter()
        .map(|k| (k.clone(), RUNNING.to_owned()))
        .collect()
}

/// A receipt value unique to one handling of a request: the time in
/// nanoseconds and a per-process count (two handlings in one nanosecond, or
/// two agents' clocks, cannot collide on one Node's single runner).
fn new_receipt() -> String {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{nanos:x}-{n}")
}

/// Sends the runner's writes for one Node, through the Node writer: the
/// running-state labels and request removal.
#[derive(Clone)]
pub struct Kube {
    writer: NodeWriter,
    /// Running-state label keys of the cases running now, across concurrent
    /// runs; held while writing, so that each write carries the whole set.
    running: Arc<tokio::sync::Mutex<BTreeSet<String>>>,
}

impl Kube {
    pub fn new(client: Client, node: impl Into<String>) -> Self {
        Self {
            writer: NodeWriter::new(Api::all(client), node.into()),
            running: Arc::default(),
        }
    }

    /// Marks `keys` running (or no longer), and writes the running set.
    pub async fn set_running(&self, keys: &[String], running: bool) -> Result<(), NodeWriteError> {
        if keys.is_empty() {
            return Ok(());
        }
        let mut set = self.running.lock().await;
        for key in keys {
            if running {
                set.insert(key.clone());
            } else {
                set.remove(key);
            }
        }
        let intent = NodeIntent {
            labels: running_labels(&set),
            ..NodeIntent::default()
        };
        self.writer
            .apply(Concern::TestRunner, &intent)
            .await
            .map(drop)
    }

    /// Removes the test request if it still is `value`, writing a new receipt
    /// with it ([`super::decide::ManualTracker`]). Returns the receipt, or
    /// `None` when the annotation had changed (or was gone) and was left
    /// alone.
    pub async fn remove_request(&self, value: &str) -> Result<Option<String>, NodeWriteError> {
        let receipt = new_receipt();
        let removed = self
            .writer
            .remove_annotation_if(
                Concern::TestRunner,
                TEST_REQUEST_ANNOTATION,
                value,
                (REQUEST_RECEIPT_ANNOTATION, &receipt),
            )
            .await?;
        Ok(removed.map(|_| receipt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_follow_the_reference() {
        let content = EventContent {
            type_: "Warning".into(),
            reason: "TestFailed".into(),
            message: "[]".into(),
            labels: [("testrunner.amd.com/recipe".to_owned(), "mem".to_owned())].into(),
        };
        let event = result_event(content, "n1", Some("u1"), Timestamp::UNIX_EPOCH);
        let v = serde_json::to_value(&event).unwrap();
        assert_eq!(
            v["metadata"]["generateName"],
            "amd-test-runner-gpu-health-check-"
        );
        assert_eq!(v["metadata"]["namespace"], "default");
        assert_eq!(v["metadata"]["labels"]["testrunner.amd.com/recipe"], "mem");
        assert_eq!(v["involvedObject"]["kind"], "Node");
        assert_eq!(v["involvedObject"]["uid"], "u1");
        assert_eq!(v["source"]["component"], "amd-test-runner");
        assert_eq!(v["source"]["host"], "n1");
        assert_eq!(v["type"], "Warning");
        assert_eq!(v["count"], 1);
    }

    #[test]
    fn the_running_set_is_the_whole_intent() {
        let keys = BTreeSet::from([
            "testrunner.amd.com.gpu_health_check.mem.gpu0".to_owned(),
            "testrunner.amd.com.gpu_health_check.mem.gpu1".to_owned(),
        ]);
        assert_eq!(
            serde_json::to_value(running_labels(&keys)).unwrap(),
            json!({
                "testrunner.amd.com.gpu_health_check.mem.gpu0": "running",
                "testrunner.amd.com.gpu_health_check.mem.gpu1": "running",
            })
        );
        assert!(running_labels(&BTreeSet::new()).is_empty());
    }
}
