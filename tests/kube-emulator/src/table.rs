//! Server-side printing: `meta.k8s.io/v1` Table answers for clients that ask for them with
//! `Accept: application/json;as=Table;...` (`kubectl get` does).
//!
//! Columns follow the real printers for the kinds kubectl users look at most (pods, nodes,
//! namespaces, config maps, secrets) and CRD `additionalPrinterColumns`; everything else gets
//! Name and Age. Pure functions.

use serde_json::{Value, json};

use jsonpath_rust::JsonPath as _;

use crate::resources::ResourceType;
use crate::views;

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
        ("", "events") | ("events.k8s.io", "events") => {
            let wide = |mut c: Value| {
                c["priority"] = json!(1);
                c
            };
            vec![
                col("Last Seen", "string", ""),
                col("Type", "string", ""),
                col("Reason", "string", ""),
                col("Object", "string", ""),
                wide(col("Subobject", "string", "")),
                wide(col("Source", "string", "")),
                col("Message", "string", ""),
                wide(col("First Seen", "string", "")),
                wide(col("Count", "integer", "")),
                wide(col("Name", "string", "name")),
            ]
        }
        ("", "configmaps") => vec![name, col("Data", "integer", ""), age],
        ("", "secrets") => vec![
            name,
            col("Type", "string", ""),
            col("Data", "integer", ""),
            age,
        ],
        // The real server's default Age column is only for CRDs without printer columns:
        // the CRD's columns replace it (most CRDs list their own Age).
        _ if !rt.printer_columns.is_empty() => {
            let mut cols = vec![name];
            for c in &rt.printer_columns {
                let t = if c.type_ == "date" {
                    "string"
                } else {
                    c.type_.as_str()
                };
                cols.push(json!({
                    "name": c.name,
                    "type": t,
                    "format": c.format,
                    "description": c.description,
                    "priority": c.priority,
                }));
            }
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
        ("", "events") | ("events.k8s.io", "events") => event_cells(&views::to_storage(rt, obj)),
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
                out.push(printer_cell(&c.type_, &c.json_path, obj));
            }
            out
        }
        _ => vec![name, json!(age(obj))],
    }
}

/// The age of a timestamp field, `<unknown>` when unset (the real printer's wording).
fn since(obj: &Value, pointer: &str) -> Option<String> {
    let t = obj
        .pointer(pointer)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())?;
    let t = t.parse::<jiff::Timestamp>().ok()?;
    Some(human_age(
        jiff::Timestamp::now().as_second() - t.as_second(),
    ))
}

/// A core Event's row, as the real server prints it (also for events.k8s.io, which is the
/// same resource): the deprecated timestamps, else `eventTime` and the series.
fn event_cells(ev: &Value) -> Vec<Value> {
    let unknown = || "<unknown>".to_string();
    let first = since(ev, "/firstTimestamp")
        .or_else(|| since(ev, "/eventTime"))
        .unwrap_or_else(unknown);
    let mut last = since(ev, "/lastTimestamp").unwrap_or_else(|| first.clone());
    let mut count = ev.get("count").and_then(Value::as_i64).unwrap_or(0);
    if ev.get("series").is_some_and(Value::is_object) {
        last = since(ev, "/series/lastObservedTime").unwrap_or_else(unknown);
        count = ev
            .pointer("/series/count")
            .and_then(Value::as_i64)
            .unwrap_or(0);
    } else if count == 0 {
        // Singleton events have no count in the events.k8s.io API.
        count = 1;
    }
    let kind = str_at(ev, "/involvedObject/kind").to_ascii_lowercase();
    let target = match str_at(ev, "/involvedObject/name") {
        "" => kind,
        n => format!("{kind}/{n}"),
    };
    let first_non_empty = |a: &str, b: &str| if a.is_empty() { b } else { a }.to_string();
    let component = first_non_empty(
        str_at(ev, "/source/component"),
        str_at(ev, "/reportingComponent"),
    );
    let instance = first_non_empty(str_at(ev, "/source/host"), str_at(ev, "/reportingInstance"));
    let source = if instance.is_empty() {
        component
    } else {
        format!("{component}, {instance}")
    };
    vec![
        json!(last),
        json!(str_at(ev, "/type")),
        json!(str_at(ev, "/reason")),
        json!(target),
        json!(str_at(ev, "/involvedObject/fieldPath")),
        json!(source),
        json!(str_at(ev, "/message").trim()),
        json!(first),
        json!(count),
        json!(str_at(ev, "/metadata/name")),
    ]
}

/// A Kubernetes JSONPath (`.status.x`, `{.status.x}`, `$.status.x`, with filters such as
/// `[?(@.type=="Ready")]`) as an RFC 9535 query, checked by the JSONPath parser. Kubernetes
/// writes paths without the root `$` and allows one pair of template braces around them.
pub fn compile_json_path(k8s: &str) -> Result<String, String> {
    let mut p = k8s.trim();
    if let Some(inner) = p.strip_prefix('{').and_then(|x| x.strip_suffix('}')) {
        p = inner.trim();
    }
    let query = if p.starts_with('$') {
        p.to_string()
    } else if p.starts_with('.') || p.starts_with('[') {
        format!("${p}")
    } else {
        format!("$.{p}")
    };
    Value::Null
        .query(&query)
        .map(|_| query.clone())
        .map_err(|e| format!("not a valid JSONPath: {e}"))
}

/// One cell of a CRD printer column, as the real server computes it: the first JSONPath
/// result (none: a null cell); `string` columns print it (strings as they are, other values
/// as JSON), `date` columns show the age of a timestamp, and the other types keep values of
/// their own type only.
pub fn printer_cell(type_: &str, json_path: &str, obj: &Value) -> Value {
    let Ok(query) = compile_json_path(json_path) else {
        return Value::Null;
    };
    let Some(v) = obj.query(&query).ok().and_then(|r| r.first().copied()) else {
        return Value::Null;
    };
    match (type_, v) {
        ("string", Value::String(s)) => json!(s),
        ("string", Value::Null) => Value::Null,
        ("string", other) => json!(other.to_string()),
        ("date", Value::String(s)) => match s.parse::<jiff::Timestamp>() {
            Ok(t) => json!(human_age(
                jiff::Timestamp::now().as_second() - t.as_second()
            )),
            Err(_) => json!("<invalid>"),
        },
        ("integer", Value::Number(n)) => n
            .as_i64()
            .map(|i| json!(i))
            .or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0)
                    .map(|f| json!(f as i64))
            })
            .unwrap_or(Value::Null),
        ("number", Value::Number(n)) => json!(n),
        ("boolean", Value::Bool(b)) => json!(b),
        _ => Value::Null,
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
    fn kubernetes_json_paths_become_rfc9535_queries() {
        assert_eq!(
            compile_json_path(".status.phase").unwrap(),
            "$.status.phase"
        );
        assert_eq!(compile_json_path("{.spec.x}").unwrap(), "$.spec.x");
        assert_eq!(compile_json_path("$.a").unwrap(), "$.a");
        assert_eq!(
            compile_json_path(r#".status.conditions[?(@.type=="Ready")].status"#).unwrap(),
            r#"$.status.conditions[?(@.type=="Ready")].status"#
        );
        assert!(compile_json_path(".status.conditions[?(@.type==").is_err());
    }

    #[test]
    fn printer_cells_follow_the_column_type() {
        let obj = json!({
            "metadata": {"creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"n": 3, "f": 2.5, "flag": true, "list": ["a"]},
            "status": {"conditions": [
                {"type": "Progressing", "status": "False"},
                {"type": "Ready", "status": "True"}
            ]}
        });
        let ready = r#".status.conditions[?(@.type=="Ready")].status"#;
        assert_eq!(printer_cell("string", ready, &obj), "True");
        let missing = r#".status.conditions[?(@.type=="Other")].status"#;
        assert_eq!(printer_cell("string", missing, &obj), Value::Null);
        assert_eq!(printer_cell("integer", ".spec.n", &obj), 3);
        assert_eq!(printer_cell("integer", ".spec.f", &obj), Value::Null);
        assert_eq!(printer_cell("number", ".spec.f", &obj), 2.5);
        assert_eq!(printer_cell("boolean", ".spec.flag", &obj), true);
        assert_eq!(printer_cell("string", ".spec.n", &obj), "3");
        assert_eq!(printer_cell("string", ".spec.list", &obj), r#"["a"]"#);
        assert_eq!(printer_cell("integer", ".status.nope", &obj), Value::Null);
        let age = printer_cell("date", ".metadata.creationTimestamp", &obj);
        assert!(age.as_str().unwrap().ends_with('d'), "{age}");
    }

    #[test]
    fn crd_columns_replace_the_default_age() {
        let crd = json!({
            "metadata": {"name": "things.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "things", "kind": "Thing"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "additionalPrinterColumns": [
                        {"name": "Ready", "type": "string",
                         "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                        {"name": "Detail", "type": "string", "jsonPath": ".spec.d", "priority": 1}
                    ]}]}
        });
        let rt = crate::resources::type_from_crd(&crd).unwrap();
        let obj = json!({"metadata": {"name": "a", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let t = to_table(&rt, &obj, false);
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["Name", "Ready", "Age", "Detail"]);
        assert_eq!(t["columnDefinitions"][3]["priority"], 1);
        assert_eq!(t["rows"][0]["cells"][1], "True");
        assert_eq!(t["rows"][0]["cells"].as_array().unwrap().len(), 4);

        // Without printer columns the server adds Name and Age.
        let mut plain = crd.clone();
        plain["spec"]["versions"][0]
            .as_object_mut()
            .unwrap()
            .remove("additionalPrinterColumns");
        let rt = crate::resources::type_from_crd(&plain).unwrap();
        let t = to_table(&rt, &obj, false);
        assert_eq!(t["columnDefinitions"].as_array().unwrap().len(), 2);
        assert_eq!(t["columnDefinitions"][1]["name"], "Age");

        // An invalid path is refused when the CRD is created, as the real server does.
        let mut bad = crd.clone();
        bad["spec"]["versions"][0]["additionalPrinterColumns"][0]["jsonPath"] =
            json!(".status.conditions[?(@.type==");
        let problems = crate::resources::type_from_crd(&bad).unwrap_err();
        assert!(
            problems[0]
                .0
                .contains("additionalPrinterColumns[0].jsonPath"),
            "{problems:?}"
        );
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
