//! The test runner's writes to the Kubernetes API: result Events, the
//! running-state Node labels, and removing a handled test request.
//!
//! Results are core/v1 Events because the reference labels them
//! (`testrunner.amd.com/...`), which kube-runtime's `Recorder` cannot do. They
//! are about the Node, so they live in the `default` namespace: the API server
//! accepts Events about cluster-scoped objects only there (`kubectl get events
//! -A -l testrunner.amd.com/category=gpu_health_check` finds them; `kubectl
//! describe node` shows them). The name prefix is the reference's
//! `amd-test-runner-<category>-` with `_` written as `-`, since an object name
//! must be an RFC 1123 subdomain.
//!
//! Building the objects is pure ([`result_event`], [`running_labels_patch`],
//! [`remove_request_patch`]); [`Kube`] sends them.

use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::config::CATEGORY;
use super::decide::TEST_REQUEST_ANNOTATION;
use super::report::{EVENT_COMPONENT, EventContent, RUNNING};
use crate::api::field_manager;

/// Namespace of the Events about the Node.
pub const EVENT_NAMESPACE: &str = "default";
/// Event reason for a configuration or request the runner cannot use.
pub const CONFIG_ERROR_REASON: &str = "TestConfigError";

/// `amd-test-runner-gpu-health-check-`.
pub fn event_name_prefix() -> String {
    format!(
        "{EVENT_COMPONENT}-{}-",
        CATEGORY.to_ascii_lowercase().replace('_', "-")
    )
}

/// The core/v1 Event about `node`.
pub fn result_event(
    content: EventContent,
    node: &str,
    node_uid: Option<&str>,
    now: Timestamp,
) -> Event {
    Event {
        metadata: ObjectMeta {
            generate_name: Some(event_name_prefix()),
            namespace: Some(EVENT_NAMESPACE.into()),
            labels: Some(content.labels),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            uid: node_uid.map(str::to_owned),
            ..ObjectReference::default()
        },
        type_: Some(content.type_),
        reason: Some(content.reason),
        message: Some(content.message),
        source: Some(EventSource {
            component: Some(EVENT_COMPONENT.into()),
            host: Some(node.into()),
        }),
        reporting_component: Some(EVENT_COMPONENT.into()),
        reporting_instance: Some(node.into()),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        ..Event::default()
    }
}

/// A merge patch setting (`running`) or removing the running-state labels.
pub fn running_labels_patch(keys: &[String], running: bool) -> Value {
    let labels: serde_json::Map<String, Value> = keys
        .iter()
        .map(|k| {
            (
                k.clone(),
                if running { json!(RUNNING) } else { Value::Null },
            )
        })
        .collect();
    json!({ "metadata": { "labels": labels } })
}

/// A JSON Patch removing the test-request annotation only while it still holds
/// `value`: a request made meanwhile is kept.
pub fn remove_request_patch(value: &str) -> json_patch::Patch {
    let path = format!(
        "/metadata/annotations/{}",
        TEST_REQUEST_ANNOTATION
            .replace('~', "~0")
            .replace('/', "~1")
    );
    // The operations are well-formed by construction.
    serde_json::from_value(json!([
        {"op": "test", "path": path, "value": value},
        {"op": "remove", "path": path},
    ]))
    .unwrap_or_else(|_| json_patch::Patch(Vec::new()))
}

/// The resourceVersion of an object, as a number (the agent's convention).
pub fn resource_version(node: &Node) -> Option<u64> {
    node.metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
}

/// Sends the runner's writes for one Node.
#[derive(Clone)]
pub struct Kube {
    nodes: Api<Node>,
    events: Api<Event>,
    node: String,
}

impl Kube {
    pub fn new(client: Client, node: impl Into<String>) -> Self {
        Self {
            nodes: Api::all(client.clone()),
            events: Api::namespaced(client, EVENT_NAMESPACE),
            node: node.into(),
        }
    }

    fn params() -> PatchParams {
        field_manager::patch(field_manager::AGENT)
    }

    pub async fn set_running(&self, keys: &[String], running: bool) -> Result<(), kube::Error> {
        if keys.is_empty() {
            return Ok(());
        }
        self.nodes
            .patch(
                &self.node,
                &Self::params(),
                &Patch::Merge(running_labels_patch(keys, running)),
            )
            .await
            .map(drop)
    }

    pub async fn publish(
        &self,
        content: EventContent,
        node_uid: Option<&str>,
    ) -> Result<(), kube::Error> {
        let event = result_event(content, &self.node, node_uid, Timestamp::now());
        self.events
            .create(&field_manager::post(field_manager::AGENT), &event)
            .await
            .map(drop)
    }

    /// Removes the test request if it still is `value`. Returns the Node's
    /// resourceVersion after the removal, or `None` when the annotation had
    /// changed (or was gone) and was left alone.
    pub async fn remove_request(&self, value: &str) -> Result<Option<u64>, kube::Error> {
        match self
            .nodes
            .patch(
                &self.node,
                &Self::params(),
                &Patch::Json::<()>(remove_request_patch(value)),
            )
            .await
        {
            Ok(node) => Ok(resource_version(&node)),
            // The `test` operation failed: someone changed or removed the request.
            Err(kube::Error::Api(status)) if status.code == 422 => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn patches() {
        let keys = vec!["testrunner.amd.com.gpu_health_check.mem.gpu0".to_owned()];
        assert_eq!(
            running_labels_patch(&keys, true),
            json!({"metadata": {"labels": {"testrunner.amd.com.gpu_health_check.mem.gpu0": "running"}}})
        );
        assert_eq!(
            running_labels_patch(&keys, false),
            json!({"metadata": {"labels": {"testrunner.amd.com.gpu_health_check.mem.gpu0": null}}})
        );
        let patch = serde_json::to_value(remove_request_patch("babel")).unwrap();
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/metadata/annotations/amd.com~1gpu-test-request", "value": "babel"},
                {"op": "remove", "path": "/metadata/annotations/amd.com~1gpu-test-request"}
            ])
        );
    }
}
