//! What the health state means to others, as pure functions of a
//! [`HealthSnapshot`]: the device plugin's [`HealthReport`], the Node condition
//! `AMDGPUUnhealthy`, the reference exporter's node labels, Events on
//! transitions and the `gpu_health` metric value.
//!
//! Labels: the reference exporter labels the Node
//! `metricsexporter.amd.com.gpu.<gpu_id>.state=unhealthy` for each unhealthy GPU
//! and removes the label when the GPU recovers; `<gpu_id>` is the same number
//! as the `gpu_id` metric label. Every partition of a partitioned GPU is a GPU
//! there, so an unhealthy MI300X in CPX mode gets eight labels.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{HealthSnapshot, HealthTransition};
use crate::events::{EventType, NodeEvent};
use crate::node_writer::condition_at;
use crate::plugin::{DeviceRef, HealthReport};

/// Type of the Node condition (defined with the node-leader contract, which
/// remediation reads it through).
pub use crate::api::agent_status::HEALTH_CONDITION as CONDITION_TYPE;
/// Condition reasons.
pub const REASON_UNHEALTHY: &str = "GPUUnhealthy";
pub const REASON_HEALTHY: &str = "AllGPUsHealthy";
/// Event reasons.
pub const EVENT_UNHEALTHY: &str = "GPUUnhealthy";
pub const EVENT_HEALTHY: &str = "GPUHealthy";
/// Node label key parts: `metricsexporter.amd.com.gpu.<id>.state`.
pub const LABEL_PREFIX: &str = "metricsexporter.amd.com.gpu.";
pub const LABEL_SUFFIX: &str = ".state";
pub const LABEL_VALUE: &str = "unhealthy";

/// The device plugin's view: every unhealthy GPU, whole (all its partitions).
pub fn health_report(snapshot: &HealthSnapshot) -> HealthReport {
    HealthReport {
        unhealthy: snapshot
            .gpus
            .iter()
            .filter(|(_, h)| !h.healthy)
            .map(|(bdf, h)| (DeviceRef::gpu(bdf.clone()), h.reasons.join("; ")))
            .collect(),
    }
}

/// `gpu_health` of a GPU: 1 healthy, 0 unhealthy, `None` when unknown.
pub fn gpu_health_value(snapshot: &HealthSnapshot, bdf: &str) -> Option<f64> {
    snapshot
        .gpus
        .get(bdf)
        .map(|h| if h.healthy { 1.0 } else { 0.0 })
}

/// "GPU 3" or "GPUs 8-15", from the GPU's logical ids.
fn describe(bdf: &str, ids: &[u32]) -> String {
    match ids {
        [] => format!("GPU {bdf}"),
        [one] => format!("GPU {one} ({bdf})"),
        [first, .., last] if last.abs_diff(*first) as usize + 1 == ids.len() && first < last => {
            format!("GPUs {first}-{last} ({bdf})")
        }
        many => format!(
            "GPUs {} ({bdf})",
            many.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}

/// The desired Node condition. Times are set to `now`;
/// [`crate::node_writer::condition_to_apply`] keeps what the Node has when it
/// says the same, and its transition time when the status did not change.
pub fn node_condition(snapshot: &HealthSnapshot, now: &Time) -> NodeCondition {
    let unhealthy: Vec<String> = snapshot
        .gpus
        .iter()
        .filter(|(_, h)| !h.healthy)
        .map(|(bdf, h)| format!("{}: {}", describe(bdf, &h.gpu_ids), h.reasons.join("; ")))
        .collect();
    let (status, reason, message) = if unhealthy.is_empty() {
        (
            "False",
            REASON_HEALTHY,
            format!("all {} GPUs are healthy", snapshot.gpus.len()),
        )
    } else {
        ("True", REASON_UNHEALTHY, unhealthy.join("\n"))
    };
    condition_at(CONDITION_TYPE, status, reason, message, now)
}

/// The reference's labels for the unhealthy GPUs.
pub fn health_labels(snapshot: &HealthSnapshot) -> BTreeMap<String, String> {
    snapshot
        .gpus
        .values()
        .filter(|h| !h.healthy)
        .flat_map(|h| h.gpu_ids.iter())
        .map(|id| {
            (
                format!("{LABEL_PREFIX}{id}{LABEL_SUFFIX}"),
                LABEL_VALUE.to_owned(),
            )
        })
        .collect()
}

/// Whether a label key has the form of [`health_labels`]'s (whoever wrote it).
pub fn is_health_label(key: &str) -> bool {
    key.strip_prefix(LABEL_PREFIX)
        .and_then(|rest| rest.strip_suffix(LABEL_SUFFIX))
        .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
}

/// The Event a transition is worth, about the GPU.
pub fn transition_event(t: &HealthTransition) -> NodeEvent {
    let who = describe(&t.bdf, &t.gpu_ids);
    let event = if t.healthy {
        NodeEvent::agent(
            EventType::Normal,
            "HealthCheck",
            EVENT_HEALTHY,
            format!("{who} became healthy again"),
        )
    } else {
        NodeEvent::agent(
            EventType::Warning,
            "HealthCheck",
            EVENT_UNHEALTHY,
            format!("{who} became unhealthy: {}", t.reasons.join("; ")),
        )
    };
    event.about(t.bdf.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::GpuHealth;

    #[test]
    fn gpu_ids_are_described_as_a_range_only_when_they_are_one() {
        assert_eq!(describe("b", &[8, 9, 10]), "GPUs 8-10 (b)");
        assert_eq!(describe("b", &[3]), "GPU 3 (b)");
        assert_eq!(describe("b", &[]), "GPU b");
        // Out of order (not what discovery produces) is listed, not a panic.
        assert!(describe("b", &[9, 2]).contains('9'));
        assert!(describe("b", &[1, 5]).contains('5'));
    }

    fn snapshot(unhealthy: bool) -> HealthSnapshot {
        let mut s = HealthSnapshot::default();
        s.gpus.insert(
            "0000:05:00.0".into(),
            GpuHealth {
                healthy: true,
                reasons: vec![],
                gpu_ids: vec![0],
            },
        );
        s.gpus.insert(
            "0000:27:00.0".into(),
            GpuHealth {
                healthy: !unhealthy,
                reasons: if unhealthy {
                    vec!["2 uncorrectable ECC errors in UMC (threshold 0)".into()]
                } else {
                    vec![]
                },
                gpu_ids: vec![8, 9, 10, 11, 12, 13, 14, 15],
            },
        );
        s
    }

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap())
    }

    #[test]
    fn report_names_unhealthy_gpus_whole() {
        assert!(health_report(&snapshot(false)).unhealthy.is_empty());
        let report = health_report(&snapshot(true));
        assert_eq!(
            report.unhealthy,
            BTreeMap::from([(
                DeviceRef::gpu("0000:27:00.0"),
                "2 uncorrectable ECC errors in UMC (threshold 0)".to_owned()
            )])
        );
    }

    #[test]
    fn metric_value() {
        assert_eq!(gpu_health_value(&snapshot(true), "0000:27:00.0"), Some(0.0));
        assert_eq!(gpu_health_value(&snapshot(true), "0000:05:00.0"), Some(1.0));
        assert_eq!(gpu_health_value(&snapshot(true), "0000:99:00.0"), None);
    }

    #[test]
    fn condition_true_names_gpus_false_when_all_healthy() {
        let c = node_condition(&snapshot(true), &now());
        assert_eq!(c.type_, CONDITION_TYPE);
        assert_eq!(c.status, "True");
        assert_eq!(c.reason.as_deref(), Some(REASON_UNHEALTHY));
        assert_eq!(
            c.message.as_deref(),
            Some("GPUs 8-15 (0000:27:00.0): 2 uncorrectable ECC errors in UMC (threshold 0)")
        );
        let c = node_condition(&snapshot(false), &now());
        assert_eq!(c.status, "False");
        assert_eq!(c.reason.as_deref(), Some(REASON_HEALTHY));
        assert_eq!(c.message.as_deref(), Some("all 2 GPUs are healthy"));
    }

    #[test]
    fn labels_for_every_partition_of_unhealthy_gpus() {
        assert!(health_labels(&snapshot(false)).is_empty());
        let labels = health_labels(&snapshot(true));
        assert_eq!(labels.len(), 8);
        assert_eq!(
            labels
                .get("metricsexporter.amd.com.gpu.8.state")
                .map(String::as_str),
            Some("unhealthy")
        );
        assert!(is_health_label("metricsexporter.amd.com.gpu.12.state"));
        assert!(!is_health_label("metricsexporter.amd.com.gpu..state"));
        assert!(!is_health_label("metricsexporter.amd.com.gpu.x.state"));
        assert!(!is_health_label("amd.com/gpu.family"));
    }

    #[test]
    fn events_on_transitions() {
        let down = HealthTransition {
            bdf: "0000:27:00.0".into(),
            healthy: false,
            reasons: vec!["hot".into()],
            gpu_ids: vec![1],
        };
        let e = transition_event(&down);
        assert_eq!(e.type_, EventType::Warning);
        assert_eq!(e.reason, EVENT_UNHEALTHY);
        assert_eq!(
            e.note.as_deref(),
            Some("GPU 1 (0000:27:00.0) became unhealthy: hot")
        );
        let up = HealthTransition {
            healthy: true,
            reasons: vec![],
            gpu_ids: vec![2, 5],
            ..down
        };
        let e = transition_event(&up);
        assert_eq!(e.type_, EventType::Normal);
        assert_eq!(e.reason, EVENT_HEALTHY);
        assert_eq!(
            e.note.as_deref(),
            Some("GPUs 2,5 (0000:27:00.0) became healthy again")
        );
    }
}
