//! Resources that are views of another resource's objects, as on the real server.
//!
//! `events.k8s.io/v1` Events and core `v1` Events are one resource in the real API server
//! (one etcd key space, converted per version), so an Event written through either API is
//! read, listed and watched through both. The store keeps such objects once, in the core
//! form, under the core resource's key; this module converts between the forms. The field
//! mapping is the real server's conversion (`k8s.io/kubernetes/pkg/apis/events/v1`):
//!
//! | events.k8s.io/v1 | core v1 |
//! | --- | --- |
//! | `note` | `message` |
//! | `regarding` | `involvedObject` |
//! | `reportingController` | `reportingComponent` |
//! | `deprecatedSource` | `source` |
//! | `deprecatedFirstTimestamp`, `deprecatedLastTimestamp` | `firstTimestamp`, `lastTimestamp` |
//! | `deprecatedCount` | `count` |
//! | `eventTime`, `series`, `reportingInstance`, `action`, `reason`, `related`, `type` | the same |
//!
//! Pure functions.

use serde_json::{Map, Value};

use crate::resources::ResourceType;

/// `(events.k8s.io name, core name)` of each renamed field.
const EVENT_RENAMES: &[(&str, &str)] = &[
    ("note", "message"),
    ("regarding", "involvedObject"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

/// Fields of one form that do not exist in the other: dropped in conversion, as the real
/// conversion has nowhere to put them.
fn renamed(v: &Value, to_core: bool) -> Value {
    let Some(o) = v.as_object() else {
        return v.clone();
    };
    let mut out = Map::new();
    for (k, val) in o {
        let target = EVENT_RENAMES.iter().find_map(|(view, core)| {
            if to_core {
                (k == view).then_some(*core)
            } else {
                (k == core).then_some(*view)
            }
        });
        // A field that carries the other form's name is the other form's field: drop it
        // (the real decoder does not know it either).
        let foreign = EVENT_RENAMES
            .iter()
            .any(|(view, core)| if to_core { k == core } else { k == view });
        match target {
            Some(t) => {
                out.insert(t.to_string(), val.clone());
            }
            None if foreign => {}
            None => {
                out.insert(k.clone(), val.clone());
            }
        }
    }
    Value::Object(out)
}

/// The object (or partial object, such as an apply configuration) in the stored form.
pub fn to_storage(rt: &ResourceType, v: &Value) -> Value {
    match rt.view_of.as_ref() {
        Some(_) if is_events_v1(rt) => renamed(v, true),
        _ => v.clone(),
    }
}

/// A stored object in the form of the view `rt`.
pub fn to_view(rt: &ResourceType, v: &Value) -> Value {
    match rt.view_of.as_ref() {
        Some(_) if is_events_v1(rt) => renamed(v, false),
        _ => v.clone(),
    }
}

fn is_events_v1(rt: &ResourceType) -> bool {
    rt.group == "events.k8s.io" && rt.plural == "events"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtin_types;
    use serde_json::json;

    #[test]
    fn events_round_trip_between_the_forms() {
        let rt = builtin_types()
            .into_iter()
            .find(|t| t.group == "events.k8s.io")
            .unwrap();
        assert_eq!(rt.view_of, Some((String::new(), "events".to_string())));
        let view = json!({
            "metadata": {"name": "e1", "namespace": "ns"},
            "eventTime": "2025-01-01T00:00:00.000000Z",
            "reportingController": "gpu-operator",
            "reportingInstance": "node-1",
            "action": "Reconcile",
            "reason": "Ready",
            "note": "all good",
            "type": "Normal",
            "regarding": {"kind": "Node", "name": "node-1"},
            "series": {"count": 2, "lastObservedTime": "2025-01-01T00:00:01.000000Z"},
            "deprecatedCount": 2,
        });
        let core = to_storage(&rt, &view);
        assert_eq!(core["message"], "all good");
        assert_eq!(core["involvedObject"]["name"], "node-1");
        assert_eq!(core["reportingComponent"], "gpu-operator");
        assert_eq!(core["reportingInstance"], "node-1");
        assert_eq!(core["count"], 2);
        assert_eq!(core["series"]["count"], 2);
        assert!(core.get("note").is_none() && core.get("regarding").is_none());
        assert_eq!(to_view(&rt, &core), view);
        // Core-only names sent to the events.k8s.io API are unknown there.
        let odd = to_storage(&rt, &json!({"message": "x", "note": "y"}));
        assert_eq!(odd, json!({"message": "y"}));
    }
}
