//! One sink for the Events this node records, whoever makes them: the agent
//! (conflicts, rejected configs, discovery), the health monitor's Node
//! publisher (GPU transitions), the test runner (results, config errors) and
//! standalone mode (start, stop, test results).
//!
//! An Event is made once, as a [`NodeEvent`], and handed to an [`EventSink`],
//! which has three forms:
//!
//! - [`EventSink::kubernetes`]: Events about the agent's Node, in `default`
//!   (the namespace the API server takes Events about cluster-scoped objects
//!   in). The agent's own go through [`SeriesRecorder`] (`events.k8s.io`,
//!   reportingController `gpu-operator`, a repeat patches the series);
//!   labelled ones ([`Origin::Labelled`], the test runner's, which the
//!   recorder cannot label) are created as core/v1 Events.
//! - [`EventSink::file`]: one JSON object per line appended to a file
//!   (`time`, `type`, `reason`, `note`, `object`), for standalone mode.
//! - [`EventSink::log`]: the log only.
//!
//! Every form logs each Event (a Warning at `warn`, the rest at `info`).
//!
//! This module owns how an Event becomes an API object, a line of the file
//! and a log line. It must not decide which Events to record (its callers
//! do), write anything but Events (Node writes go through
//! [`crate::node_writer`]), or fail its caller: a lost Event is logged and
//! counted as an API error, never returned.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
pub use kube::runtime::events::{Event as KubeEvent, Reporter};
use kube::{Api, Client};
use tokio::sync::watch;

pub use kube::runtime::events::EventType;

use crate::api::field_manager;

/// Namespace of the Events about the Node.
pub const NODE_EVENT_NAMESPACE: &str = "default";
/// The `reportingController` of the agent's own Events.
pub const CONTROLLER: &str = "gpu-operator";

/// One Event about this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEvent {
    pub type_: EventType,
    pub reason: String,
    pub note: Option<String>,
    /// What within the node it is about: a GPU's PCI address; `None` for the
    /// node itself. Under Kubernetes every Event regards the Node; the events
    /// file names this as its `object`.
    pub about: Option<String>,
    pub origin: Origin,
}

/// Who makes an Event, which decides its form under Kubernetes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The agent itself, doing `action` (kube-runtime's Event action, e.g.
    /// `SelectDeviceConfig`, `HealthCheck`).
    Agent { action: &'static str },
    /// A component that labels its Events, as the reference's test runner does.
    Labelled(Labelled),
}

/// A labelled Event's maker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Labelled {
    /// `source.component` and `reportingComponent`.
    pub component: &'static str,
    /// The Event's `generateName`.
    pub name_prefix: String,
    pub labels: BTreeMap<String, String>,
}

impl NodeEvent {
    /// An Event of the agent's own.
    pub fn agent(
        type_: EventType,
        action: &'static str,
        reason: impl Into<String>,
        note: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            reason: reason.into(),
            note: Some(note.into()),
            about: None,
            origin: Origin::Agent { action },
        }
    }

    /// The same Event about `object` within the node.
    pub fn about(self, object: impl Into<String>) -> Self {
        Self {
            about: Some(object.into()),
            ..self
        }
    }

    fn is_warning(&self) -> bool {
        matches!(self.type_, EventType::Warning)
    }
}

/// The name of an Event type, as the API and the events file write it.
pub fn type_name(type_: EventType) -> &'static str {
    match type_ {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

/// Where this node's Events go; cheap to clone, shared by every maker.
#[derive(Clone)]
pub struct EventSink {
    /// This node's name: the Node the Events regard, the file's default `object`.
    node: String,
    to: To,
}

#[derive(Clone)]
enum To {
    Kubernetes(Arc<Kubernetes>),
    File(Arc<JsonLines>),
    Log,
}

struct Kubernetes {
    recorder: SeriesRecorder,
    events: Api<CoreEvent>,
    /// The agent's Node as watched, for its uid.
    watched: watch::Receiver<Option<Arc<Node>>>,
}

struct JsonLines {
    path: String,
    file: Mutex<std::fs::File>,
}

impl EventSink {
    /// Events about the Node `node_name`; `watched` is the agent's watch of
    /// it, whose uid the Events carry once it is seen.
    pub fn kubernetes(
        client: Client,
        node_name: impl Into<String>,
        watched: watch::Receiver<Option<Arc<Node>>>,
    ) -> Self {
        let node = node_name.into();
        let recorder = SeriesRecorder::new(
            client.clone(),
            Reporter {
                controller: CONTROLLER.into(),
                instance: Some(node.clone()),
            },
        );
        Self {
            to: To::Kubernetes(Arc::new(Kubernetes {
                recorder,
                events: Api::namespaced(client, NODE_EVENT_NAMESPACE),
                watched,
            })),
            node,
        }
    }

    /// Appends Events to `path` as JSON lines (creating it and its directory
    /// when missing), and logs them.
    pub fn file(node_name: impl Into<String>, path: &Path) -> std::io::Result<Self> {
        if let Some(parent) = path.parent() {
            // A failure shows when the file cannot be opened.
            let _ = std::fs::create_dir_all(parent);
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Self {
            node: node_name.into(),
            to: To::File(Arc::new(JsonLines {
                path: path.display().to_string(),
                file: Mutex::new(file),
            })),
        })
    }

    /// Logs Events only.
    pub fn log(node_name: impl Into<String>) -> Self {
        Self {
            node: node_name.into(),
            to: To::Log,
        }
    }

    /// Records `event`: logs it and sends it where this sink sends Events. A
    /// failure is logged (and counted as an API error), never returned.
    pub async fn record(&self, event: NodeEvent) {
        let object = event.about.as_deref().unwrap_or(&self.node);
        let note = event.note.as_deref().unwrap_or_default();
        let reason = event.reason.as_str();
        if event.is_warning() {
            tracing::warn!(reason, object, "{note}");
        } else {
            tracing::info!(reason, object, "{note}");
        }
        match &self.to {
            To::Log => {}
            To::File(file) => {
                let line = json_line(&event, &self.node, Timestamp::now());
                let written = match file.file.lock() {
                    Ok(mut f) => writeln!(f, "{line}"),
                    Err(_) => Err(std::io::Error::other("the events file's lock is poisoned")),
                };
                if let Err(e) = written {
                    tracing::warn!(path = %file.path, error = %e, "cannot append to the events file");
                }
            }
            To::Kubernetes(kube) => {
                let uid = kube
                    .watched
                    .borrow()
                    .as_ref()
                    .and_then(|n| n.metadata.uid.clone());
                let sent = match &event.origin {
                    Origin::Agent { action } => {
                        let made = KubeEvent {
                            type_: event.type_,
                            reason: event.reason.clone(),
                            note: event.note.clone(),
                            action: (*action).into(),
                            secondary: None,
                        };
                        let regarding = node_reference(&self.node, uid.as_deref());
                        kube.recorder.publish(&made, &regarding).await
                    }
                    Origin::Labelled(labelled) => {
                        let made = core_event(
                            &event,
                            labelled,
                            &self.node,
                            uid.as_deref(),
                            Timestamp::now(),
                        );
                        kube.events
                            .create(&field_manager::post(field_manager::AGENT), &made)
                            .await
                            .map(drop)
                    }
                };
                if let Err(e) = sent {
                    crate::counters::record_api_error();
                    tracing::warn!(error = %e, reason, "cannot record Event");
                }
            }
        }
    }
}

/// How long a series is continued: a repeat after this starts a new Event
/// (kube-runtime's `Recorder` keeps its cache as long).
const SERIES_TTL: std::time::Duration = std::time::Duration::from_secs(6 * 60);
/// At most this many series are remembered; past it the oldest go.
const MAX_SERIES: usize = 1024;

/// What makes two Events one series: the same object, type, reason and
/// action, and the same note. kube-runtime's `Recorder` leaves the note
/// out, so a series kept its first note while later ones said otherwise
/// (`PartitionApplied (x2) … cpx_nps4_all` after the node went back to
/// `default`; `GPUUnhealthy (x40) GPU 0` for eight GPUs). The Events API
/// counts a series of the same happening; another note is another one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SeriesKey {
    regarding: (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ),
    type_: &'static str,
    reason: String,
    action: String,
    note: Option<String>,
}

/// The Event a series last wrote, and when.
struct SeriesEntry {
    name: String,
    namespace: String,
    count: i32,
    last: Timestamp,
}

/// Records `events.k8s.io/v1` Events about objects, each repeat of the same
/// Event (same object, type, reason, action and note) patching the count
/// of one series. The one recorder of this crate, for the agent's Events
/// and the leader's alike.
#[derive(Clone)]
pub struct SeriesRecorder {
    client: Client,
    reporter: Reporter,
    series: Arc<tokio::sync::Mutex<std::collections::HashMap<SeriesKey, SeriesEntry>>>,
}

impl SeriesRecorder {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            series: Arc::default(),
        }
    }

    /// Creates the Event, or patches its series when the same one was
    /// recorded within [`SERIES_TTL`]. The Event goes in `regarding`'s
    /// namespace (`default` for cluster-scoped objects).
    pub async fn publish(
        &self,
        event: &KubeEvent,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        use k8s_openapi::api::events::v1::{Event as ApiEvent, EventSeries};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        let type_ = match event.type_ {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        };
        let key = SeriesKey {
            regarding: (
                regarding.kind.clone(),
                regarding.namespace.clone(),
                regarding.name.clone(),
                regarding.uid.clone(),
            ),
            type_,
            reason: event.reason.clone(),
            action: event.action.clone(),
            note: event.note.clone(),
        };
        let now = Timestamp::now();
        // Held across the write: one series is never created twice.
        let mut series = self.series.lock().await;
        series.retain(|_, entry| within_ttl(entry.last, now));
        if series.len() >= MAX_SERIES
            && let Some(oldest) = series
                .iter()
                .min_by_key(|(_, entry)| entry.last)
                .map(|(key, _)| key.clone())
        {
            series.remove(&oldest);
        }
        if let Some(entry) = series.get_mut(&key) {
            let count = entry.count.saturating_add(1);
            let api: Api<ApiEvent> = Api::namespaced(self.client.clone(), &entry.namespace);
            let patch = serde_json::json!({
                "series": EventSeries { count, last_observed_time: MicroTime(now) },
            });
            api.patch(
                &entry.name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await?;
            entry.count = count;
            entry.last = now;
            return Ok(());
        }
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| NODE_EVENT_NAMESPACE.to_owned());
        let name = format!(
            "{}.{:x}",
            regarding
                .name
                .as_deref()
                .unwrap_or(&self.reporter.controller),
            now.as_nanosecond()
        );
        let made = ApiEvent {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: event.note.clone(),
            type_: Some(type_.to_owned()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: event.secondary.clone(),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            ..ApiEvent::default()
        };
        let api: Api<ApiEvent> = Api::namespaced(self.client.clone(), &namespace);
        api.create(&kube::api::PostParams::default(), &made).await?;
        series.insert(
            key,
            SeriesEntry {
                name,
                namespace,
                count: 1,
                last: now,
            },
        );
        Ok(())
    }
}

fn within_ttl(last: Timestamp, now: Timestamp) -> bool {
    now.duration_since(last).unsigned_abs() < SERIES_TTL
}

/// The Node `name` as an Event's `regarding`.
fn node_reference(name: &str, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.into()),
        uid: uid.map(str::to_owned),
        ..ObjectReference::default()
    }
}

/// The line of the events file for `event` on node `node` at `now`.
pub fn json_line(event: &NodeEvent, node: &str, now: Timestamp) -> String {
    serde_json::json!({
        "time": now.to_string(),
        "type": type_name(event.type_),
        "reason": event.reason,
        "note": event.note.as_deref().unwrap_or_default(),
        "object": event.about.as_deref().unwrap_or(node),
    })
    .to_string()
}

/// The core/v1 Event a labelled `event` about `node` is, created at `now`.
pub fn core_event(
    event: &NodeEvent,
    labelled: &Labelled,
    node: &str,
    node_uid: Option<&str>,
    now: Timestamp,
) -> CoreEvent {
    CoreEvent {
        metadata: ObjectMeta {
            generate_name: Some(labelled.name_prefix.clone()),
            namespace: Some(NODE_EVENT_NAMESPACE.into()),
            labels: Some(labelled.labels.clone()),
            ..ObjectMeta::default()
        },
        involved_object: node_reference(node, node_uid),
        type_: Some(type_name(event.type_).into()),
        reason: Some(event.reason.clone()),
        message: event.note.clone(),
        source: Some(EventSource {
            component: Some(labelled.component.into()),
            host: Some(node.into()),
        }),
        reporting_component: Some(labelled.component.into()),
        reporting_instance: Some(node.into()),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        ..CoreEvent::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two partition profiles, one after the other and back: each note is a
    /// series of its own, and the count is the one of its note, as the API
    /// and `kubectl describe node` show them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_series_is_one_note_repeated_not_one_reason() {
        let emu = kube_emulator::Emulator::start(kube_emulator::EmulatorConfig::default())
            .await
            .expect("emulator starts");
        let node = emu
            .create(serde_json::json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "gpu-node-1"}}))
            .expect("node");
        // The Events carry the Node's uid, as the agent's watch gives it
        // (kubectl describe selects Events by it).
        let node: Node = serde_json::from_value(node).expect("a Node");
        let (_tx, watched) = watch::channel(Some(Arc::new(node)));
        let sink = EventSink::kubernetes(emu.client(), "gpu-node-1", watched);
        let applied = |profile: &str| {
            NodeEvent::agent(
                EventType::Normal,
                "Partition",
                "PartitionApplied",
                format!("profile {profile} applied"),
            )
        };
        for profile in ["cpx_nps4_all", "default", "cpx_nps4_all"] {
            sink.record(applied(profile)).await;
        }
        let events = emu.list("v1", "Event");
        let mut seen: Vec<(String, i64)> = events
            .iter()
            .filter(|e| e["reason"] == "PartitionApplied")
            .map(|e| {
                (
                    e["message"].as_str().unwrap_or_default().to_owned(),
                    // As kubectl reads a core Event: its series, else its count.
                    e["series"]["count"]
                        .as_i64()
                        .or(e["count"].as_i64())
                        .unwrap_or(1),
                )
            })
            .collect();
        seen.sort();
        assert_eq!(
            seen,
            [
                ("profile cpx_nps4_all applied".to_owned(), 2),
                ("profile default applied".to_owned(), 1)
            ],
            "{events:#?}"
        );
        // kubectl, where it is installed, shows the same.
        let kubectl = std::env::var_os("KUBECTL")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| "/usr/bin/kubectl".into());
        if !kubectl.exists() {
            assert!(
                std::env::var_os("REQUIRE_KUBECTL").is_none(),
                "REQUIRE_KUBECTL is set but {} does not exist",
                kubectl.display()
            );
            return;
        }
        let out = tokio::process::Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(emu.kubeconfig_path())
            .args(["describe", "node", "gpu-node-1"])
            .output()
            .await
            .expect("kubectl runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("PartitionApplied"))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines
                .iter()
                .any(|l| l.contains("(x2 over") && l.contains("cpx_nps4_all")),
            "{text}"
        );
        assert!(
            lines
                .iter()
                .any(|l| !l.contains("(x2") && l.contains("profile default")),
            "{text}"
        );
    }

    #[test]
    fn a_line_of_the_events_file_names_the_gpu_or_else_the_node() {
        let started = NodeEvent::agent(
            EventType::Normal,
            "Standalone",
            "Started",
            "services started",
        );
        assert_eq!(
            json_line(&started, "bare-metal", Timestamp::UNIX_EPOCH),
            r#"{"note":"services started","object":"bare-metal","reason":"Started","time":"1970-01-01T00:00:00Z","type":"Normal"}"#
        );
        let gpu = NodeEvent::agent(EventType::Warning, "HealthCheck", "GPUUnhealthy", "hot")
            .about("0000:27:00.0");
        let line: serde_json::Value =
            serde_json::from_str(&json_line(&gpu, "bare-metal", Timestamp::UNIX_EPOCH)).unwrap();
        assert_eq!(line["object"], "0000:27:00.0");
        assert_eq!(line["type"], "Warning");
    }

    #[tokio::test]
    async fn the_file_sink_appends_one_line_per_event() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logs/events.jsonl");
        let sink = EventSink::file("n1", &path).unwrap();
        for reason in ["Started", "Stopping"] {
            sink.record(NodeEvent::agent(
                EventType::Normal,
                "Standalone",
                reason,
                "x",
            ))
            .await;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let reasons: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["reason"].to_string())
            .collect();
        assert_eq!(reasons, [r#""Started""#, r#""Stopping""#]);
        assert!(EventSink::file("n1", dir.path()).is_err(), "a directory");
    }

    #[test]
    fn a_labelled_event_is_a_core_event_about_the_node() {
        let event = NodeEvent {
            type_: EventType::Warning,
            reason: "TestFailed".into(),
            note: Some("[]".into()),
            about: None,
            origin: Origin::Agent { action: "unused" },
        };
        let labelled = Labelled {
            component: "maker",
            name_prefix: "maker-".into(),
            labels: [("k".to_owned(), "v".to_owned())].into(),
        };
        let v = serde_json::to_value(core_event(
            &event,
            &labelled,
            "n1",
            Some("u1"),
            Timestamp::UNIX_EPOCH,
        ))
        .unwrap();
        assert_eq!(v["metadata"]["generateName"], "maker-");
        assert_eq!(v["metadata"]["namespace"], "default");
        assert_eq!(v["metadata"]["labels"]["k"], "v");
        assert_eq!(v["involvedObject"]["kind"], "Node");
        assert_eq!(v["involvedObject"]["uid"], "u1");
        assert_eq!(v["message"], "[]");
        assert_eq!(v["reportingComponent"], "maker");
        assert_eq!(v["source"]["host"], "n1");
    }
}
