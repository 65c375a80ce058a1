//! Server-side printing: `meta.k8s.io/v1` Table answers for clients that ask for them with
//! `Accept: application/json;as=Table;...` (`kubectl get` does).
//!
//! Columns follow the real printers for the kinds kubectl users look at most (pods, nodes,
//! namespaces, config maps, secrets) and CRD `additionalPrinterColumns`; everything else gets
//! Name and Age. Pure functions.

use serde_json::{Value, json};

use crate::resources::ResourceType;
use crate::selector::field_value;

/// Renders an age like the real server's `HumanDuration` (`42s`, `5m`, `3h20m`, `12d`).
pub fn human_age(secs: i64) -> String {
    let s = secs.max(0);
    let (m, h, d) = (s / 60, s / 3600, s / 86400);
    match s {
        _ if s < 120 => format!("{s}s"),
        _ if m < 10 => format!("{m}m{}s", s % 60),
        _ if h < 3 => format!("{m}m"),
        _ if h < 8 => format!("{h}h{}m", m % 60),
        _ if h < 48 => format!("{h}h"),
        _ if d < 8 => format!("{d}d{}h", h % 24),
        _ => format!("{d}d"),
    }
}

fn age(obj: &Value) -> String {
    let created = obj
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<jiff::Timestamp>().ok());
    match created {
        Some(t) => human_age(jiff::Timestamp::now().as_second() - t.as_second()),
        None => "<unknown>".into(),
    }
}

fn col(name: &str, type_: &str, format: &str) -> Value {
    json!({"name": name, "type": type_, "format": format, "description": name, "priority": 0})
}

fn str_at<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn columns(rt: &ResourceType) -> Vec<Value> {
    let name = col("Name", "string", "name");
    let age = col("Age", "string", "");
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => vec![
            name,
            col("Ready", "string", ""),
            col("Status", "string", ""),
            col("Restarts", "string", ""),
            age,
        ],
        ("", "nodes") => vec![
            name,
            col("Status", "string", ""),
            col("Roles", "string", ""),
            age,
            col("Version", "string", ""),
        ],
        ("", "namespaces") => vec![name, col("Status", "string", ""), age],
        ("", "configmaps") => vec![name, col("Data", "integer", ""), age],
        ("", "secrets") => vec![
            name,
            col("Type", "string", ""),
            col("Data", "integer", ""),
            age,
        ],
        _ if !rt.printer_columns.is_empty() => {
            let mut cols = vec![name];
            for c in &rt.printer_columns {
                let t = if c.type_ == "date" {
                    "string"
                } else {
                    c.type_.as_str()
                };
                cols.push(col(&c.name, t, ""));
            }
            cols.push(age);
            cols
        }
        _ => vec![name, age],
    }
}

fn cells(rt: &ResourceType, obj: &Value) -> Vec<Value> {
    let name = json!(str_at(obj, "/metadata/name"));
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => {
            let statuses = obj
                .pointer("/status/containerStatuses")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let total = obj
                .pointer("/spec/containers")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let ready = statuses.iter().filter(|s| s["ready"] == true).count();
            let restarts: i64 = statuses
                .iter()
                .filter_map(|s| s["restartCount"].as_i64())
                .sum();
            let mut status = str_at(obj, "/status/phase").to_string();
            if obj.pointer("/metadata/deletionTimestamp").is_some() {
                status = "Terminating".into();
            }
            vec![
                name,
                json!(format!("{ready}/{total}")),
                json!(status),
                json!(restarts.to_string()),
                json!(age(obj)),
            ]
        }
        ("", "nodes") => {
            let ready = obj
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
                .map(|c| c["status"] == "True");
            let mut status = match ready {
                Some(true) => "Ready".to_string(),
                Some(false) => "NotReady".to_string(),
                None => "Unknown".to_string(),
            };
            if obj.pointer("/spec/unschedulable") == Some(&json!(true)) {
                status.push_str(",SchedulingDisabled");
            }
            let mut roles: Vec<String> = obj
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .map(|l| {
                    l.keys()
                        .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            if roles.is_empty() {
                roles.push("<none>".into());
            }
            vec![
                name,
                json!(status),
                json!(roles.join(",")),
                json!(age(obj)),
                json!(str_at(obj, "/status/nodeInfo/kubeletVersion")),
            ]
        }
        ("", "namespaces") => vec![name, json!(str_at(obj, "/status/phase")), json!(age(obj))],
        ("", "configmaps") => {
            let n = obj
                .get("data")
                .and_then(Value::as_object)
                .map_or(0, |m| m.len())
                + obj
                    .get("binaryData")
                    .and_then(Value::as_object)
                    .map_or(0, |m| m.len());
            vec![name, json!(n), json!(age(obj))]
        }
        ("", "secrets") => {
            let n = obj
                .get("data")
                .and_then(Value::as_object)
                .map_or(0, |m| m.len());
            vec![name, json!(str_at(obj, "/type")), json!(n), json!(age(obj))]
        }
        _ if !rt.printer_columns.is_empty() => {
            let mut out = vec![name];
            for c in &rt.printer_columns {
                let path = c.json_path.trim_start_matches('.');
                let v = field_value(obj, path);
                if c.type_ == "date" {
                    let secs = v
                        .parse::<jiff::Timestamp>()
                        .map(|t| jiff::Timestamp::now().as_second() - t.as_second());
                    out.push(json!(secs.map(human_age).unwrap_or(v)));
                } else if c.type_ == "integer" || c.type_ == "number" {
                    out.push(v.parse::<f64>().map(|n| json!(n)).unwrap_or(Value::Null));
                } else {
                    out.push(json!(v));
                }
            }
            out.push(json!(age(obj)));
            out
        }
        _ => vec![name, json!(age(obj))],
    }
}

/// An object's `PartialObjectMetadata`: the row object kubectl uses for namespaces and
/// labels, and what metadata-only clients get.
pub fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// Turns a list (or a single object) into a Table.
pub fn to_table(rt: &ResourceType, v: &Value, is_list: bool) -> Value {
    let objects: Vec<&Value> = if is_list {
        v.get("items")
            .and_then(Value::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default()
    } else {
        vec![v]
    };
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| json!({"cells": cells(rt, o), "object": partial_metadata(o)}))
        .collect();
    let mut meta = json!({});
    if is_list {
        if let Some(rv) = v.pointer("/metadata/resourceVersion") {
            meta["resourceVersion"] = rv.clone();
        }
        if let Some(c) = v.pointer("/metadata/continue") {
            meta["continue"] = c.clone();
        }
    } else if let Some(rv) = v.pointer("/metadata/resourceVersion") {
        meta["resourceVersion"] = rv.clone();
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": columns(rt),
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtin_types;

    #[test]
    fn ages() {
        assert_eq!(human_age(5), "5s");
        assert_eq!(human_age(150), "2m30s");
        assert_eq!(human_age(3600), "60m");
        assert_eq!(human_age(4 * 3600 + 60), "4h1m");
        assert_eq!(human_age(86400 * 3 + 3600), "3d1h");
        assert_eq!(human_age(86400 * 30), "30d");
    }

    #[test]
    fn node_table() {
        let rt = builtin_types()
            .into_iter()
            .find(|t| t.plural == "nodes")
            .unwrap();
        let list = json!({"metadata": {"resourceVersion": "9"}, "items": [{
            "metadata": {"name": "n1", "labels": {"node-role.kubernetes.io/worker": ""}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        }]});
        let t = to_table(&rt, &list, true);
        assert_eq!(t["kind"], "Table");
        assert_eq!(t["metadata"]["resourceVersion"], "9");
        assert_eq!(t["rows"][0]["cells"][1], "Ready,SchedulingDisabled");
        assert_eq!(t["rows"][0]["cells"][2], "worker");
        assert_eq!(t["rows"][0]["object"]["metadata"]["name"], "n1");
        assert_eq!(t["columnDefinitions"].as_array().unwrap().len(), 5);
    }
}
