//! Field ownership for server-side apply: which field manager owns which fields, conflict
//! detection, and the `metadata.managedFields` rendering.
//!
//! This is a simplified model of structured-merge-diff. Paths are lists of `fieldsV1` path
//! elements (`f:spec`, `k:{"type":"Ready"}`, `v:"x"`); ownership is tracked at leaves
//! (scalars, atomic lists, empty maps, set items). Where it differs from the real field
//! manager is listed in the README. Pure data, no I/O.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::resources::{ListType, ResourceType};

/// A field path in `fieldsV1` element syntax.
pub type FieldPath = Vec<String>;

/// Which part of an object a write touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// The main resource: everything except `status` when the type has a status subresource.
    Main,
    /// The `/status` subresource: only `status`.
    Status,
}

/// How a manager last wrote its fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    Apply,
    Update,
}

/// Identity of one `managedFields` entry.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ManagerKey {
    pub manager: String,
    pub operation: Operation,
    pub scope: Scope,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ManagedEntry {
    pub fields: BTreeSet<FieldPath>,
    pub api_version: String,
    pub time: String,
}

/// All managers of one object.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ownership(pub BTreeMap<ManagerKey, ManagedEntry>);

/// A server-side apply conflict: another manager owns a field with a different value.
#[derive(Clone, Debug, PartialEq)]
pub struct Conflict {
    pub manager: String,
    pub api_version: String,
    pub path: FieldPath,
}

/// Renders a path the way conflict messages do: `.spec.holderIdentity`.
pub fn dotted(path: &FieldPath) -> String {
    let mut s = String::new();
    for e in path {
        if let Some(f) = e.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(k) = e.strip_prefix("k:") {
            s.push('[');
            s.push_str(k);
            s.push(']');
        } else if let Some(v) = e.strip_prefix("v:") {
            s.push_str("[=");
            s.push_str(v);
            s.push(']');
        }
    }
    s
}

fn is_prefix(a: &FieldPath, b: &FieldPath) -> bool {
    a.len() <= b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

/// Two paths overlap when one contains the other.
fn overlaps(a: &FieldPath, b: &FieldPath) -> bool {
    is_prefix(a, b) || is_prefix(b, a)
}

/// Whether an applied empty map at `applied` merges over another manager's
/// field `owned` below it rather than contending with it: applying
/// `spec: {}` leaves the fields others set in `spec` as they are, so the
/// real server sees no conflict there (Helm applies a Lease with `spec: {}`
/// that the leader's fields then fill).
fn merges_over(value: &Value, applied: &FieldPath, owned: &FieldPath) -> bool {
    value.as_object().is_some_and(Map::is_empty)
        && owned.len() > applied.len()
        && is_prefix(applied, owned)
}

fn key_element(item: &Value, keys: &[String]) -> Option<String> {
    let mut m = Map::new();
    for k in keys {
        match item.get(k) {
            Some(v) => {
                m.insert(k.clone(), v.clone());
            }
            None if crate::resources::OPTIONAL_LIST_MAP_KEYS.contains(&k.as_str()) => {}
            None => return None,
        }
    }
    Some(format!("k:{}", Value::Object(m)))
}

/// The leaves of `obj` that a manager can own within `scope`, with their values.
pub fn owned_leaves(obj: &Value, rt: &ResourceType, scope: Scope) -> BTreeMap<FieldPath, Value> {
    let mut out = BTreeMap::new();
    let Some(m) = obj.as_object() else {
        return out;
    };
    for (k, v) in m {
        let include = match (scope, k.as_str()) {
            (_, "apiVersion" | "kind") => false,
            (Scope::Status, key) => key == "status",
            (Scope::Main, "status") => !rt.status,
            (Scope::Main, _) => true,
        };
        if !include {
            continue;
        }
        if k == "metadata" {
            let Some(meta) = v.as_object() else { continue };
            for (mk, mv) in meta {
                if matches!(
                    mk.as_str(),
                    "labels" | "annotations" | "finalizers" | "ownerReferences"
                ) {
                    let mut names = vec!["metadata".to_string(), mk.clone()];
                    let mut path = vec!["f:metadata".to_string(), format!("f:{mk}")];
                    walk(mv, rt, &mut names, &mut path, &mut out);
                }
            }
            continue;
        }
        let mut names = vec![k.clone()];
        let mut path = vec![format!("f:{k}")];
        walk(v, rt, &mut names, &mut path, &mut out);
    }
    out
}

fn walk(
    v: &Value,
    rt: &ResourceType,
    names: &mut Vec<String>,
    path: &mut FieldPath,
    out: &mut BTreeMap<FieldPath, Value>,
) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                names.push(k.clone());
                path.push(format!("f:{k}"));
                walk(child, rt, names, path, out);
                path.pop();
                names.pop();
            }
        }
        // Keyed and set lists are owned item by item (an empty one owns nothing, so applying
        // `[]` lets go of one's own items without touching anybody else's).
        Value::Array(items) => match rt.list_type(names) {
            ListType::Map(keys) if items.iter().all(|i| key_element(i, &keys).is_some()) => {
                for item in items {
                    let Some(ke) = key_element(item, &keys) else {
                        continue;
                    };
                    path.push(ke);
                    walk(item, rt, names, path, out);
                    path.pop();
                }
            }
            ListType::Set => {
                for item in items {
                    path.push(format!("v:{item}"));
                    out.insert(path.clone(), item.clone());
                    path.pop();
                }
            }
            _ => {
                out.insert(path.clone(), v.clone());
            }
        },
        _ => {
            out.insert(path.clone(), v.clone());
        }
    }
}

/// An item with nothing but its key fields, and lists or maps its removed
/// fields emptied (a nested keyed list whose last item went): it was owned
/// only through what has been removed, and goes as a whole.
fn only_keys_left(item: &Value, key: &Map<String, Value>) -> bool {
    item.as_object().is_some_and(|m| {
        m.iter().all(|(k, v)| {
            key.contains_key(k)
                || v.as_array().is_some_and(Vec::is_empty)
                || v.as_object().is_some_and(Map::is_empty)
        })
    })
}

/// Removes the field a path names from `obj`; returns whether anything was removed.
pub fn remove_path(obj: &mut Value, path: &[String]) -> bool {
    let Some((first, rest)) = path.split_first() else {
        return false;
    };
    if let Some(f) = first.strip_prefix("f:") {
        let Some(m) = obj.as_object_mut() else {
            return false;
        };
        if rest.is_empty() {
            return m.remove(f).is_some();
        }
        return m.get_mut(f).is_some_and(|c| remove_path(c, rest));
    }
    let Some(items) = obj.as_array_mut() else {
        return false;
    };
    if let Some(k) = first.strip_prefix("k:") {
        let Ok(Value::Object(key)) = serde_json::from_str::<Value>(k) else {
            return false;
        };
        let pos = items
            .iter()
            .position(|i| key.iter().all(|(kk, kv)| i.get(kk) == Some(kv)));
        let Some(pos) = pos else { return false };
        if rest.is_empty() {
            items.remove(pos);
            return true;
        }
        // A key field goes only with its item, once nothing else is left in it.
        if let [only] = rest
            && only.strip_prefix("f:").is_some_and(|f| key.contains_key(f))
        {
            let keys_only = only_keys_left(&items[pos], &key);
            if keys_only {
                items.remove(pos);
            }
            return keys_only;
        }
        let removed = remove_path(&mut items[pos], rest);
        // An item left with nothing but its keys was owned only through those fields.
        if removed && only_keys_left(&items[pos], &key) {
            items.remove(pos);
        }
        return removed;
    }
    if let Some(v) = first.strip_prefix("v:") {
        let Ok(val) = serde_json::from_str::<Value>(v) else {
            return false;
        };
        let before = items.len();
        items.retain(|i| i != &val);
        return items.len() != before;
    }
    false
}

impl Ownership {
    fn overlapping_owners(
        &self,
        except: &ManagerKey,
        path: &FieldPath,
    ) -> Vec<(&ManagerKey, &FieldPath)> {
        self.0
            .iter()
            .filter(|(k, _)| *k != except)
            .flat_map(|(k, e)| e.fields.iter().map(move |p| (k, p)))
            .filter(|(_, p)| overlaps(p, path))
            .collect()
    }

    /// Conflicts an apply by `applier` would have: another manager owns an overlapping
    /// field whose live value differs from the applied one.
    pub fn apply_conflicts(
        &self,
        applier: &ManagerKey,
        applied: &BTreeMap<FieldPath, Value>,
        live: &BTreeMap<FieldPath, Value>,
    ) -> Vec<Conflict> {
        let mut out: Vec<Conflict> = Vec::new();
        for (q, val) in applied {
            for (owner, p) in self.overlapping_owners(applier, q) {
                if owner.scope != applier.scope || merges_over(val, q, p) {
                    continue;
                }
                // A live map under an applied scalar has no leaf at `q`, so it differs too.
                if live.get(q) != Some(val) {
                    let c = Conflict {
                        manager: owner.manager.clone(),
                        api_version: self.0[owner].api_version.clone(),
                        path: p.clone(),
                    };
                    if !out.contains(&c) {
                        out.push(c);
                    }
                }
            }
        }
        out
    }

    /// Paths `applier` owned before this apply but no longer applies, that nobody else owns:
    /// these fields are removed from the object.
    pub fn fields_to_remove(
        &self,
        applier: &ManagerKey,
        applied: &BTreeMap<FieldPath, Value>,
    ) -> Vec<FieldPath> {
        let Some(prev) = self.0.get(applier) else {
            return Vec::new();
        };
        prev.fields
            .iter()
            .filter(|p| !applied.contains_key(*p))
            .filter(|p| self.overlapping_owners(applier, p).is_empty())
            .cloned()
            .collect()
    }

    /// Records an apply: the applier owns exactly the applied leaves. With `force`, other
    /// managers lose overlapping fields; without it they keep them (shared ownership of equal
    /// values, since conflicting ones were already rejected).
    pub fn record_apply(
        &mut self,
        applier: ManagerKey,
        applied: &BTreeMap<FieldPath, Value>,
        force: bool,
        api_version: &str,
        time: &str,
    ) {
        if force {
            for (k, e) in self.0.iter_mut() {
                if *k != applier && k.scope == applier.scope {
                    e.fields.retain(|p| {
                        !applied
                            .iter()
                            .any(|(q, val)| overlaps(p, q) && !merges_over(val, q, p))
                    });
                }
            }
        }
        let fields: BTreeSet<FieldPath> = applied.keys().cloned().collect();
        let changed = self.0.get(&applier).is_none_or(|e| e.fields != fields);
        let entry = self.0.entry(applier).or_insert_with(|| ManagedEntry {
            fields: BTreeSet::new(),
            api_version: api_version.to_string(),
            time: time.to_string(),
        });
        if changed {
            entry.fields = fields;
            entry.time = time.to_string();
            entry.api_version = api_version.to_string();
        }
        self.0.retain(|_, e| !e.fields.is_empty());
    }

    /// Records a non-apply write: `manager` takes the fields whose values changed, and other
    /// managers lose them.
    pub fn record_update(
        &mut self,
        manager: ManagerKey,
        old: &BTreeMap<FieldPath, Value>,
        new: &BTreeMap<FieldPath, Value>,
        api_version: &str,
        time: &str,
    ) {
        let changed: Vec<&FieldPath> = new
            .iter()
            .filter(|(p, v)| old.get(*p) != Some(*v))
            .map(|(p, _)| p)
            .collect();
        if changed.is_empty() {
            return;
        }
        for (k, e) in self.0.iter_mut() {
            if *k != manager && k.scope == manager.scope {
                e.fields.retain(|p| !changed.iter().any(|q| overlaps(p, q)));
            }
        }
        let entry = self.0.entry(manager).or_insert_with(|| ManagedEntry {
            fields: BTreeSet::new(),
            api_version: api_version.to_string(),
            time: time.to_string(),
        });
        entry.fields.extend(changed.into_iter().cloned());
        entry.time = time.to_string();
        entry.api_version = api_version.to_string();
        self.0.retain(|_, e| !e.fields.is_empty());
    }

    /// Drops ownership of fields that no longer exist in the object.
    pub fn prune(&mut self, all_leaves: &BTreeMap<FieldPath, Value>) {
        for e in self.0.values_mut() {
            e.fields.retain(|p| {
                all_leaves
                    .range(p.clone()..)
                    .next()
                    .is_some_and(|(l, _)| is_prefix(p, l))
            });
        }
        self.0.retain(|_, e| !e.fields.is_empty());
    }

    /// The ownership a `metadata.managedFields` list states, as [`Ownership::render`]
    /// writes it; `None` when it is not such a list (the server then ignores it).
    pub fn parse(managed_fields: &Value) -> Option<Ownership> {
        fn leaves(tree: &Map<String, Value>, at: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
            for (element, child) in tree {
                // Ownership is of leaves: "." stands for the item itself
                // only where nothing inside it is listed.
                if element == "." {
                    if tree.len() == 1 {
                        out.insert(at.clone());
                    }
                    continue;
                }
                at.push(element.clone());
                match child.as_object() {
                    Some(m) if !m.is_empty() => leaves(m, at, out),
                    _ => {
                        out.insert(at.clone());
                    }
                }
                at.pop();
            }
        }
        let mut owners = Ownership::default();
        for entry in managed_fields.as_array()? {
            let operation = match entry.get("operation")?.as_str()? {
                "Apply" => Operation::Apply,
                "Update" => Operation::Update,
                _ => return None,
            };
            let scope = match entry.get("subresource").and_then(Value::as_str) {
                None | Some("") => Scope::Main,
                Some("status") => Scope::Status,
                Some(_) => return None,
            };
            let mut fields = BTreeSet::new();
            leaves(
                entry.get("fieldsV1")?.as_object()?,
                &mut Vec::new(),
                &mut fields,
            );
            let key = ManagerKey {
                manager: entry.get("manager")?.as_str()?.to_owned(),
                operation,
                scope,
            };
            let text = |k: &str| entry.get(k).and_then(Value::as_str).unwrap_or_default();
            owners.0.insert(
                key,
                ManagedEntry {
                    fields,
                    api_version: text("apiVersion").to_owned(),
                    time: text("time").to_owned(),
                },
            );
        }
        owners.0.retain(|_, e| !e.fields.is_empty());
        (!owners.0.is_empty()).then_some(owners)
    }

    /// `metadata.managedFields`.
    pub fn render(&self) -> Value {
        let entries: Vec<Value> = self
            .0
            .iter()
            .map(|(k, e)| {
                let mut tree = Map::new();
                for p in &e.fields {
                    let mut node = &mut tree;
                    for el in p {
                        let child = node
                            .entry(el.clone())
                            .or_insert_with(|| Value::Object(Map::new()));
                        if el.starts_with("k:") {
                            child
                                .as_object_mut()
                                .expect("inserted as object")
                                .entry(".")
                                .or_insert_with(|| json!({}));
                        }
                        node = child.as_object_mut().expect("inserted as object");
                    }
                }
                let mut v = json!({
                    "manager": k.manager,
                    "operation": match k.operation { Operation::Apply => "Apply", Operation::Update => "Update" },
                    "apiVersion": e.api_version,
                    "time": e.time,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": Value::Object(tree),
                });
                if k.scope == Scope::Status {
                    v["subresource"] = json!("status");
                }
                v
            })
            .collect();
        Value::Array(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtin_types;

    fn lease_type() -> ResourceType {
        builtin_types()
            .into_iter()
            .find(|t| t.plural == "leases")
            .unwrap()
    }

    fn key(m: &str, op: Operation) -> ManagerKey {
        ManagerKey {
            manager: m.into(),
            operation: op,
            scope: Scope::Main,
        }
    }

    #[test]
    fn an_applied_empty_map_does_not_contend_with_fields_others_set_in_it() {
        let rt = lease_type();
        let helm = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "l"}, "spec": {}});
        let live = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}});
        let mut own = Ownership::default();
        let applied = owned_leaves(&helm, &rt, Scope::Main);
        own.record_apply(key("helm", Operation::Apply), &applied, false, "v1", "t");
        let leader = owned_leaves(&live, &rt, Scope::Main);
        own.record_update(
            key("leader", Operation::Update),
            &applied,
            &leader,
            "v1",
            "t",
        );
        let live_leaves = owned_leaves(&live, &rt, Scope::Main);
        assert_eq!(
            own.apply_conflicts(&key("helm", Operation::Apply), &applied, &live_leaves),
            vec![]
        );
        // Forced, it takes nothing from the leader either.
        own.record_apply(key("helm", Operation::Apply), &applied, true, "v1", "t");
        assert!(
            own.0[&key("leader", Operation::Update)]
                .fields
                .iter()
                .any(|p| dotted(p) == ".spec.holderIdentity")
        );
        // A value applied there does contend.
        let taker = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "l"}, "spec": {"holderIdentity": "b"}});
        let taken = owned_leaves(&taker, &rt, Scope::Main);
        assert_eq!(
            own.apply_conflicts(&key("helm", Operation::Apply), &taken, &live_leaves)
                .len(),
            1
        );
    }

    #[test]
    fn leaves_skip_identity_fields_and_key_lists() {
        let rt = builtin_types()
            .into_iter()
            .find(|t| t.plural == "nodes")
            .unwrap();
        let node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n", "resourceVersion": "3", "labels": {"a": "b"}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let main = owned_leaves(&node, &rt, Scope::Main);
        let paths: Vec<String> = main.keys().map(dotted).collect();
        assert_eq!(paths, vec![".metadata.labels.a", ".spec.unschedulable"]);
        let status = owned_leaves(&node, &rt, Scope::Status);
        let paths: Vec<String> = status.keys().map(dotted).collect();
        assert_eq!(
            paths,
            vec![
                ".status.conditions[{\"type\":\"Ready\"}].status",
                ".status.conditions[{\"type\":\"Ready\"}].type"
            ]
        );
    }

    #[test]
    fn second_applier_with_other_value_conflicts() {
        let rt = lease_type();
        let a = json!({"spec": {"holderIdentity": "a", "renewTime": "t1"}});
        let leaves_a = owned_leaves(&a, &rt, Scope::Main);
        let mut own = Ownership::default();
        own.record_apply(
            key("a", Operation::Apply),
            &leaves_a,
            false,
            "coordination.k8s.io/v1",
            "t",
        );
        let b = json!({"spec": {"holderIdentity": "b", "renewTime": "t2"}});
        let leaves_b = owned_leaves(&b, &rt, Scope::Main);
        let conflicts = own.apply_conflicts(&key("b", Operation::Apply), &leaves_b, &leaves_a);
        let paths: Vec<String> = conflicts.iter().map(|c| dotted(&c.path)).collect();
        assert_eq!(paths, vec![".spec.holderIdentity", ".spec.renewTime"]);
        // Same values: shared ownership, no conflict.
        assert!(
            own.apply_conflicts(&key("b", Operation::Apply), &leaves_a, &leaves_a)
                .is_empty()
        );
        // Force takes ownership away.
        own.record_apply(key("b", Operation::Apply), &leaves_b, true, "v1", "t");
        assert!(!own.0.contains_key(&key("a", Operation::Apply)));
    }

    #[test]
    fn updates_move_ownership_and_removals_prune() {
        let rt = lease_type();
        let applied = json!({"spec": {"holderIdentity": "a", "renewTime": "t1"}});
        let l1 = owned_leaves(&applied, &rt, Scope::Main);
        let mut own = Ownership::default();
        own.record_apply(key("a", Operation::Apply), &l1, false, "v1", "t");
        let updated = json!({"spec": {"holderIdentity": "a", "renewTime": "t2"}});
        let l2 = owned_leaves(&updated, &rt, Scope::Main);
        own.record_update(key("a", Operation::Update), &l1, &l2, "v1", "t");
        let apply_fields = &own.0[&key("a", Operation::Apply)].fields;
        assert_eq!(apply_fields.len(), 1);
        // Releasing the lease removes the fields, and with them all ownership.
        let released = json!({"spec": {}});
        own.prune(&owned_leaves(&released, &rt, Scope::Main));
        assert!(own.0.is_empty());
    }

    #[test]
    fn fields_dropped_from_an_apply_are_removed() {
        let rt = lease_type();
        let mut own = Ownership::default();
        let first = owned_leaves(
            &json!({"metadata": {"labels": {"x": "1", "y": "2"}}}),
            &rt,
            Scope::Main,
        );
        own.record_apply(key("m", Operation::Apply), &first, false, "v1", "t");
        let second = owned_leaves(
            &json!({"metadata": {"labels": {"x": "1"}}}),
            &rt,
            Scope::Main,
        );
        let gone = own.fields_to_remove(&key("m", Operation::Apply), &second);
        assert_eq!(
            gone.iter().map(dotted).collect::<Vec<_>>(),
            vec![".metadata.labels.y"]
        );
        let mut obj = json!({"metadata": {"labels": {"x": "1", "y": "2"}}});
        assert!(remove_path(&mut obj, &gone[0]));
        assert_eq!(obj["metadata"]["labels"], json!({"x": "1"}));
    }

    #[test]
    fn managed_fields_parse_back_to_the_ownership_they_render() {
        let rt = builtin_types()
            .into_iter()
            .find(|t| t.plural == "nodes")
            .unwrap();
        let mut own = Ownership::default();
        let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        own.record_apply(
            key("kubelet", Operation::Apply),
            &owned_leaves(&status, &rt, Scope::Status),
            false,
            "v1",
            "t",
        );
        let labels = json!({"metadata": {"labels": {"a": "b", "c": "d"}}});
        own.record_update(
            key("agent", Operation::Update),
            &BTreeMap::new(),
            &owned_leaves(&labels, &rt, Scope::Main),
            "v1",
            "t",
        );
        assert_eq!(Ownership::parse(&own.render()), Some(own));
        assert_eq!(Ownership::parse(&json!("not a list")), None);
        assert_eq!(Ownership::parse(&json!([])), None);
    }

    #[test]
    fn render_managed_fields() {
        let rt = builtin_types()
            .into_iter()
            .find(|t| t.plural == "nodes")
            .unwrap();
        let mut own = Ownership::default();
        let l = owned_leaves(
            &json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
            &rt,
            Scope::Status,
        );
        own.record_apply(
            ManagerKey {
                manager: "kubelet".into(),
                operation: Operation::Apply,
                scope: Scope::Status,
            },
            &l,
            false,
            "v1",
            "2024-01-01T00:00:00Z",
        );
        let r = own.render();
        assert_eq!(r[0]["subresource"], "status");
        assert_eq!(r[0]["operation"], "Apply");
        assert!(
            r[0]["fieldsV1"]["f:status"]["f:conditions"]["k:{\"type\":\"Ready\"}"]["."].is_object()
        );
    }
}
