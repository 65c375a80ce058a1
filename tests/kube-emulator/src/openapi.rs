//! A minimal `/openapi/v3`: enough for clients that probe it, not a schema.
//!
//! `kubectl create/apply` (with the default `--validate=strict`) asks the OpenAPI v3 document
//! of a group/version whether the PATCH operation of a kind takes the `fieldValidation` query
//! parameter; when it does, kubectl leaves validation to the server instead of downloading
//! schemas. So each group/version document lists, per kind, its object path with a PATCH
//! operation that carries the `x-kubernetes-group-version-kind` extension and that parameter.
//! There are no component schemas (`kubectl explain` has nothing to show); the server checks
//! fields itself (see `validation`). Pure functions.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use serde_json::{Map, Value, json};

use crate::resources::ResourceType;
use crate::store::Store;

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn types_in<'a>(store: &'a Store, group: &str, version: &str) -> Vec<&'a ResourceType> {
    store
        .types()
        .filter(|t| t.group == group && t.serves(version))
        .collect()
}

/// Changes whenever the set of kinds in a group/version changes, so cached copies expire.
fn hash_of(types: &[&ResourceType]) -> String {
    let mut h = DefaultHasher::new();
    for t in types {
        (&t.group, &t.plural, &t.kind, t.namespaced, &t.versions).hash(&mut h);
    }
    format!("{:016X}", h.finish())
}

/// `/openapi/v3`: where each group/version document is.
pub fn root(store: &Store) -> Value {
    let mut paths = Map::new();
    let mut gvs: Vec<(String, String)> = Vec::new();
    for t in store.types() {
        for v in &t.versions {
            let gv = (t.group.clone(), v.clone());
            if !gvs.contains(&gv) {
                gvs.push(gv);
            }
        }
    }
    for (g, v) in gvs {
        let p = gv_path(&g, &v);
        let hash = hash_of(&types_in(store, &g, &v));
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={hash}")}),
        );
    }
    json!({"paths": paths})
}

/// `/openapi/v3/api/v1`, `/openapi/v3/apis/<group>/<version>`.
pub fn group_version(store: &Store, rest: &[&str]) -> Option<Value> {
    let (group, version) = match rest {
        ["api", v] => ("", *v),
        ["apis", g, v] => (*g, *v),
        _ => return None,
    };
    let types = types_in(store, group, version);
    if types.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    for t in types {
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let path = if t.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", t.plural)
        } else {
            format!("{prefix}/{}/{{name}}", t.plural)
        };
        let gvk = json!({"group": group, "version": version, "kind": t.kind});
        let params = json!([
            {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": true}},
        ]);
        paths.insert(
            path,
            json!({
                "patch": {
                    "operationId": format!("patch{}", t.kind),
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": gvk,
                    "parameters": params,
                    "responses": {"200": {"description": "OK"}},
                }
            }),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.34.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::broadcast;

    #[test]
    fn documents_name_every_kind_with_field_validation() {
        let (tx, _) = broadcast::channel(4);
        let store = Store::new(10, tx);
        let r = root(&store);
        assert!(
            r["paths"]["api/v1"]["serverRelativeURL"]
                .as_str()
                .unwrap()
                .starts_with("/openapi/v3/api/v1?hash=")
        );
        assert!(r["paths"]["apis/coordination.k8s.io/v1"].is_object());
        let doc = group_version(&store, &["api", "v1"]).unwrap();
        let cm = &doc["paths"]["/api/v1/namespaces/{namespace}/configmaps/{name}"]["patch"];
        assert_eq!(cm["x-kubernetes-group-version-kind"]["kind"], "ConfigMap");
        assert!(
            cm["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "fieldValidation")
        );
        assert!(doc["paths"]["/api/v1/nodes/{name}"].is_object());
        assert!(group_version(&store, &["apis", "nope", "v1"]).is_none());
    }
}
