//! Patch algorithms over `serde_json::Value`: strategic merge patch (for built-in types) and
//! the structural merge that server-side apply uses. JSON merge patch and JSON patch come from
//! the `json-patch` crate and are called from the store.
//!
//! The list merge behaviour comes from a `ListType` lookup by field path, so the same code
//! serves built-ins (Go struct tags, approximated in `resources`) and CRDs (schema markers).
//! Pure functions only.

use serde_json::{Map, Value};

use crate::resources::ListType;

/// Looks up how the list at a field path merges.
pub type ListLookup<'a> = &'a dyn Fn(&[String]) -> ListType;

/// Removes `$`-directives (`$patch`, `$setElementOrder/..`, ...) from a value that is being
/// inserted as a whole.
fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(
            a.iter()
                .filter(|x| x.get("$patch").is_none())
                .map(strip_directives)
                .collect(),
        ),
        other => other.clone(),
    }
}

/// An item's key: its value of each key field, an optional one absent as null.
fn key_of<'a>(item: &'a Value, keys: &[String]) -> Option<Vec<&'a Value>> {
    keys.iter()
        .map(|k| match item.get(k) {
            None if crate::resources::OPTIONAL_LIST_MAP_KEYS.contains(&k.as_str()) => {
                Some(&Value::Null)
            }
            found => found,
        })
        .collect()
}

/// Applies a strategic merge patch (`application/strategic-merge-patch+json`) to `original`.
///
/// Supports: null to delete a field, keyed lists (merge by key), set lists (union),
/// `$patch: replace|delete` on maps and list items, `$retainKeys`,
/// `$deleteFromPrimitiveList/<field>`. `$setElementOrder/<field>` is accepted and ignored
/// (list order then follows the original with new items appended).
pub fn strategic_merge(
    original: &Value,
    patch: &Value,
    lists: ListLookup<'_>,
) -> Result<Value, String> {
    let Value::Object(p) = patch else {
        return Err("strategic merge patch must be a JSON object".into());
    };
    let mut out = original.clone();
    if !out.is_object() {
        out = Value::Object(Map::new());
    }
    let mut path = Vec::new();
    match smp_object(&mut out, p, &mut path, lists)? {
        MapResult::Keep => Ok(out),
        MapResult::Delete => Ok(Value::Object(Map::new())),
    }
}

enum MapResult {
    Keep,
    Delete,
}

fn smp_object(
    orig: &mut Value,
    patch: &Map<String, Value>,
    path: &mut Vec<String>,
    lists: ListLookup<'_>,
) -> Result<MapResult, String> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *orig = strip_directives(&Value::Object(patch.clone()));
            return Ok(MapResult::Keep);
        }
        Some("delete") => return Ok(MapResult::Delete),
        Some("merge") | None => {}
        Some(other) => return Err(format!("unknown patch type: {other}")),
    }
    if !orig.is_object() {
        *orig = Value::Object(Map::new());
    }
    for (k, pv) in patch {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let Some(del) = pv.as_array() else {
                return Err(format!("{k} must be a list"));
            };
            if let Some(Value::Array(items)) = orig.get_mut(field) {
                items.retain(|x| !del.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        let o = orig.as_object_mut().expect("made an object above");
        path.push(k.clone());
        match pv {
            Value::Null => {
                o.remove(k);
            }
            Value::Object(pm) => {
                let entry = o.entry(k.clone()).or_insert(Value::Null);
                if entry.is_object() {
                    if let MapResult::Delete = smp_object(entry, pm, path, lists)? {
                        o.remove(k);
                    }
                } else if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                    o.remove(k);
                } else {
                    *entry = strip_directives(pv);
                }
            }
            Value::Array(pa) => {
                let lt = lists(path);
                let merged = match (o.get(k), lt) {
                    (Some(Value::Array(oa)), ListType::Map(keys)) => {
                        Value::Array(merge_keyed_list(oa, pa, &keys, path, lists)?)
                    }
                    (Some(Value::Array(oa)), ListType::Set) => {
                        if pa
                            .iter()
                            .any(|x| x.get("$patch").and_then(Value::as_str) == Some("replace"))
                        {
                            strip_directives(pv)
                        } else {
                            let mut out = oa.clone();
                            for x in pa {
                                if !out.contains(x) {
                                    out.push(x.clone());
                                }
                            }
                            Value::Array(out)
                        }
                    }
                    _ => strip_directives(pv),
                };
                o.insert(k.clone(), merged);
            }
            scalar => {
                o.insert(k.clone(), scalar.clone());
            }
        }
        path.pop();
    }
    if let Some(retain) = patch.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = retain.iter().filter_map(Value::as_str).collect();
        if let Some(o) = orig.as_object_mut() {
            o.retain(|k, _| keep.contains(&k.as_str()));
        }
    }
    Ok(MapResult::Keep)
}

fn merge_keyed_list(
    orig: &[Value],
    patch: &[Value],
    keys: &[String],
    path: &mut Vec<String>,
    lists: ListLookup<'_>,
) -> Result<Vec<Value>, String> {
    if patch
        .iter()
        .any(|x| x.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        return Ok(patch
            .iter()
            .filter(|x| x.get("$patch").is_none())
            .map(strip_directives)
            .collect());
    }
    let mut out: Vec<Value> = orig.to_vec();
    for item in patch {
        let Some(pm) = item.as_object() else {
            // Scalars in a keyed list: nothing to key on, append as the real server would
            // reject or append; appending keeps the data.
            out.push(item.clone());
            continue;
        };
        let Some(key) = key_of(item, keys) else {
            return Err(format!(
                "map: {} does not contain declared merge key: {}",
                Value::Object(pm.clone()),
                keys.join(",")
            ));
        };
        let pos = out
            .iter()
            .position(|o| key_of(o, keys).as_ref() == Some(&key));
        let delete = pm.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                out.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => {
                if let MapResult::Delete = smp_object(&mut out[i], pm, path, lists)? {
                    out.remove(i);
                }
            }
            (None, false) => out.push(strip_directives(item)),
        }
    }
    Ok(out)
}

/// Merges an applied configuration into a live object, the way server-side apply combines
/// them: maps merge recursively, keyed lists merge by key, set lists take the union, other
/// lists and scalars are replaced, and `null` removes the field.
pub fn apply_merge(
    live: &mut Value,
    applied: &Value,
    path: &mut Vec<String>,
    lists: ListLookup<'_>,
) {
    let (Some(l), Some(a)) = (live.as_object_mut(), applied.as_object()) else {
        *live = applied.clone();
        return;
    };
    for (k, av) in a {
        path.push(k.clone());
        match av {
            Value::Null => {
                l.remove(k);
            }
            Value::Object(_) => {
                let entry = l.entry(k.clone()).or_insert(Value::Null);
                if entry.is_object() {
                    apply_merge(entry, av, path, lists);
                } else {
                    *entry = av.clone();
                }
            }
            Value::Array(aa) => {
                let merged = match (l.get(k), lists(path)) {
                    (Some(Value::Array(la)), ListType::Map(keys)) => {
                        let mut out = la.clone();
                        for item in aa {
                            let key = key_of(item, &keys);
                            let pos = key.as_ref().and_then(|key| {
                                out.iter()
                                    .position(|o| key_of(o, &keys).as_ref() == Some(key))
                            });
                            match pos {
                                Some(i) => apply_merge(&mut out[i], item, path, lists),
                                None => out.push(item.clone()),
                            }
                        }
                        Value::Array(out)
                    }
                    (Some(Value::Array(la)), ListType::Set) => {
                        let mut out = la.clone();
                        for x in aa {
                            if !out.contains(x) {
                                out.push(x.clone());
                            }
                        }
                        Value::Array(out)
                    }
                    _ => av.clone(),
                };
                l.insert(k.clone(), merged);
            }
            scalar => {
                l.insert(k.clone(), scalar.clone());
            }
        }
        path.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{builtin_list_type, builtin_strategic_list_type};
    use serde_json::json;

    /// As the store patches built-ins: by their strategic-merge tags.
    fn smp(orig: Value, patch: Value) -> Value {
        strategic_merge(&orig, &patch, &builtin_strategic_list_type).unwrap()
    }

    #[test]
    fn a_claims_status_devices_are_replaced_and_its_reservations_merged_by_uid() {
        // status.devices has `+listType=map` but no `patchStrategy`: a strategic
        // merge patch replaces the list (server-side apply merges it, see
        // fields.rs); status.reservedFor merges by uid.
        let entry =
            |driver: &str, device: &str| json!({"driver": driver, "pool": "n1", "device": device});
        let claim = json!({"status": {
            "devices": [entry("gpu.amd.com", "gpu-0"), entry("net.example.com", "eth0")],
            "reservedFor": [{"resource": "pods", "name": "a", "uid": "1"}]
        }});
        let out = smp(
            claim,
            json!({"status": {
                "devices": [entry("gpu.amd.com", "gpu-1")],
                "reservedFor": [{"resource": "pods", "name": "b", "uid": "2"}]
            }}),
        );
        assert_eq!(
            out["status"]["devices"],
            json!([entry("gpu.amd.com", "gpu-1")])
        );
        let uids: Vec<&str> = out["status"]["reservedFor"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["uid"].as_str().unwrap())
            .collect();
        assert_eq!(uids, ["1", "2"]);
    }

    #[test]
    fn cordon_and_labels() {
        let node = json!({"metadata": {"name": "n", "labels": {"a": "1", "b": "2"}}, "spec": {}});
        let out = smp(
            node,
            json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": {"unschedulable": true}}),
        );
        assert_eq!(out["metadata"]["labels"], json!({"b": "2", "c": "3"}));
        assert_eq!(out["spec"]["unschedulable"], true);
    }

    #[test]
    fn keyed_lists_merge_by_key() {
        let pod = json!({"spec": {"containers": [
            {"name": "a", "image": "x:1", "env": [{"name": "E", "value": "1"}]},
            {"name": "b", "image": "y:1"}
        ]}});
        let out = smp(
            pod,
            json!({"spec": {"$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
                "containers": [
                {"name": "a", "image": "x:2", "env": [{"name": "F", "value": "2"}]},
                {"name": "b", "$patch": "delete"},
                {"name": "c", "image": "z:1"}
            ]}}),
        );
        let cs = out["spec"]["containers"].as_array().unwrap();
        assert_eq!(cs.len(), 2);
        assert_eq!(cs[0]["image"], "x:2");
        assert_eq!(cs[0]["env"].as_array().unwrap().len(), 2);
        assert_eq!(cs[1]["name"], "c");
    }

    #[test]
    fn conditions_merge_by_type() {
        let node = json!({"status": {"conditions": [
            {"type": "Ready", "status": "False"}, {"type": "DiskPressure", "status": "False"}]}});
        let out = smp(
            node,
            json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
        );
        let cs = out["status"]["conditions"].as_array().unwrap();
        assert_eq!(cs.len(), 2);
        assert_eq!(cs[0]["status"], "True");
    }

    #[test]
    fn finalizers_are_a_set_and_directives_work() {
        let obj = json!({"metadata": {"finalizers": ["a", "b"]}, "spec": {"x": {"y": 1, "z": 2}}});
        let out = smp(
            obj.clone(),
            json!({"metadata": {"finalizers": ["b", "c"]}, "spec": {"x": {"$patch": "replace", "q": 1}}}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b", "c"]));
        assert_eq!(out["spec"]["x"], json!({"q": 1}));
        let out = smp(
            obj,
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn atomic_lists_are_replaced() {
        let node = json!({"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}});
        let out = smp(
            node,
            json!({"spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}}),
        );
        assert_eq!(
            out["spec"]["taints"],
            json!([{"key": "b", "effect": "NoSchedule"}])
        );
    }

    #[test]
    fn missing_merge_key_is_an_error() {
        let pod = json!({"spec": {"containers": [{"name": "a"}]}});
        assert!(
            strategic_merge(
                &pod,
                &json!({"spec": {"containers": [{"image": "x"}]}}),
                &builtin_list_type
            )
            .is_err()
        );
        assert!(strategic_merge(&pod, &json!([1]), &builtin_list_type).is_err());
    }

    #[test]
    fn apply_merge_semantics() {
        let mut live = json!({"spec": {"a": 1, "b": {"c": 2}}, "status": {"conditions": [
            {"type": "Ready", "status": "False", "reason": "x"}]}});
        let applied = json!({"spec": {"b": {"d": 3}, "a": null}, "status": {"conditions": [
            {"type": "Ready", "status": "True"}, {"type": "Other", "status": "True"}]}});
        apply_merge(&mut live, &applied, &mut Vec::new(), &builtin_list_type);
        assert_eq!(live["spec"], json!({"b": {"c": 2, "d": 3}}));
        let cs = live["status"]["conditions"].as_array().unwrap();
        assert_eq!(cs.len(), 2);
        assert_eq!(
            cs[0],
            json!({"type": "Ready", "status": "True", "reason": "x"})
        );
    }
}
