//! Server-side field validation (KEP-2885, GA in 1.27), as the real API server does it.
//!
//! Every write (create, update, patch) names a `fieldValidation` directive: `Ignore`, `Warn`
//! (the server's default when the parameter is unset) or `Strict`. Fields the kind does not
//! know are dropped from what is stored whatever the directive; `Warn` answers one
//! `Warning: 299 - "unknown field \"spec.foo\""` header for each, `Strict` refuses the write.
//! Duplicate fields in a JSON body count the same way (the last value wins).
//!
//! Which fields a kind knows:
//! - built-in kinds: the k8s-openapi struct of the kind (the Go types the real server
//!   decodes into); the object is decoded into it and the keys its decoder skipped are the
//!   unknown ones;
//! - custom resources: the version's structural `openAPIV3Schema`, pruned as the real
//!   server prunes (`properties`, `additionalProperties`, `items`,
//!   `x-kubernetes-preserve-unknown-fields`, `x-kubernetes-embedded-resource`); `apiVersion`
//!   and `kind` are always known and `metadata` is an ObjectMeta.
//!
//! Server-side apply is stricter: an applied configuration with a field the schema does not
//! declare fails whatever the directive (the real server answers 500 for it).
//!
//! An object whose values do not decode (a string where a number belongs, say) is not
//! checked here: the emulator does not validate types. Pure functions, no I/O.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex};

use serde::de::{DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::error::{ApiError, Cause};
use crate::resources::{ListType, ResourceType};

/// The `fieldValidation` query parameter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Directive {
    Ignore,
    /// The server's default.
    #[default]
    Warn,
    Strict,
}

impl Directive {
    /// Parses the parameter of a write; `options` is the kind of options the verb takes
    /// (`CreateOptions`, `UpdateOptions`, `PatchOptions`), for the error message.
    pub fn parse(value: Option<&str>, options: &str) -> Result<Self, ApiError> {
        match value.unwrap_or("") {
            "" | "Warn" => Ok(Directive::Warn),
            "Ignore" => Ok(Directive::Ignore),
            "Strict" => Ok(Directive::Strict),
            other => {
                let message = format!(
                    "Unsupported value: \"{other}\": supported values: \"\", \"Ignore\", \"Strict\", \"Warn\""
                );
                let mut e = ApiError::new(
                    422,
                    "Invalid",
                    format!("{options}.meta.k8s.io \"\" is invalid: fieldValidation: {message}"),
                );
                e.details.kind = Some(format!("{options}.meta.k8s.io"));
                e.details.name = Some(String::new());
                e.details.causes = vec![Cause {
                    reason: "FieldValueNotSupported".into(),
                    message,
                    field: Some("fieldValidation".into()),
                }];
                Err(e)
            }
        }
    }
}

/// The directive of one write, the problems found in its raw body, and the warnings the
/// answer carries. Cheap to clone; clones share the warnings.
#[derive(Clone, Debug, Default)]
pub struct FieldCheck {
    pub directive: Directive,
    /// `duplicate field "..."` problems of the request body (see [`duplicate_fields`]).
    pub duplicates: Vec<String>,
    warnings: Arc<Mutex<Vec<String>>>,
}

/// Where the checked object came from: it decides how a strict failure is worded.
#[derive(Clone, Copy, Debug)]
pub enum Origin<'a> {
    /// A create or update body.
    Body,
    /// The result of a JSON or JSON merge patch.
    JsonPatch,
    /// The result of a strategic merge patch (the patch itself, for the message).
    StrategicPatch(&'a Value),
}

impl FieldCheck {
    pub fn new(directive: Directive) -> Self {
        Self {
            directive,
            ..Self::default()
        }
    }

    /// The warnings recorded so far (each one `Warning` header of the answer).
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.lock().map(|w| w.clone()).unwrap_or_default()
    }

    fn warn(&self, messages: Vec<String>) {
        if let Ok(mut w) = self.warnings.lock() {
            w.extend(messages);
        }
    }

    /// Checks an object about to be written at `version` (in the form `rt` serves it):
    /// drops its unknown fields and, per the directive, records warnings or fails.
    pub fn check(
        &self,
        rt: &ResourceType,
        version: &str,
        mut obj: Value,
        origin: Origin<'_>,
    ) -> Result<Value, ApiError> {
        let unknown = unknown_fields(rt, version, &obj);
        // A strict JSON patch failure quotes the patched object as it was.
        let as_patched = (self.directive == Directive::Strict
            && matches!(origin, Origin::JsonPatch)
            && !(unknown.is_empty() && self.duplicates.is_empty()))
        .then(|| obj.clone());
        for p in &unknown {
            remove_path(&mut obj, p);
        }
        let mut problems = self.duplicates.clone();
        problems.extend(
            unknown
                .iter()
                .map(|p| format!("unknown field \"{}\"", dotted(p))),
        );
        if problems.is_empty() {
            return Ok(obj);
        }
        match self.directive {
            Directive::Ignore => Ok(obj),
            Directive::Warn => {
                self.warn(problems);
                Ok(obj)
            }
            Directive::Strict => {
                let strict = format!("strict decoding error: {}", problems.join(", "));
                Err(match origin {
                    Origin::Body => ApiError::bad_request(format!(
                        "{kind} in version \"{version}\" cannot be handled as a {kind}: {strict}",
                        kind = rt.kind
                    )),
                    Origin::JsonPatch => {
                        // The real server quotes the patched object as JSON.
                        let mut shown = as_patched.unwrap_or_default();
                        if let Some(o) = shown.as_object_mut() {
                            o.insert("apiVersion".into(), Value::from(rt.api_version(version)));
                            o.insert("kind".into(), Value::from(rt.kind.clone()));
                        }
                        patch_invalid(&serde_json::to_string(&shown).unwrap_or_default(), &strict)
                    }
                    Origin::StrategicPatch(patch) => patch_invalid(&go_format(patch), &strict),
                })
            }
        }
    }
}

/// `422 Invalid` with no kind or name and one cause on `patch`, as the real server answers a
/// patch whose result has unknown fields under `Strict` (kubectl: "The request is invalid").
fn patch_invalid(value: &str, strict: &str) -> ApiError {
    let quoted = serde_json::to_string(value).unwrap_or_default();
    let message = format!("Invalid value: {quoted}: {strict}");
    let mut e = ApiError::new(
        422,
        "Invalid",
        format!(" \"\" is invalid: patch: {message}"),
    );
    e.details.causes = vec![Cause {
        reason: "FieldValueInvalid".into(),
        message,
        field: Some("patch".into()),
    }];
    e
}

/// Go's `%+v` of a decoded JSON value (`map[a:1 b:[x y]]`), for patch error messages.
fn go_format(v: &Value) -> String {
    match v {
        Value::Null => "<nil>".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 1e21 => format!("{f:.0}"),
            Some(f) => f.to_string(),
            None => n.to_string(),
        },
        Value::String(s) => s.clone(),
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(go_format).collect::<Vec<_>>().join(" ")
        ),
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{k}:{}", go_format(&o[k])))
                .collect();
            format!("map[{}]", parts.join(" "))
        }
    }
}

/// The value of one `Warning` response header for `message` (RFC 7234 `warn-code 299`).
pub fn warning_header(message: &str) -> String {
    let mut quoted = String::with_capacity(message.len() + 2);
    for c in message.chars() {
        if c == '"' || c == '\\' {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    format!("299 - \"{quoted}\"")
}

/// One step of a field path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Seg {
    Key(String),
    Index(usize),
}

/// `spec.containers[0].foo`, as the real server names fields in decoding errors.
pub fn dotted(path: &[Seg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

fn remove_path(obj: &mut Value, path: &[Seg]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    for seg in parents {
        let next = match (seg, cur) {
            (Seg::Key(k), Value::Object(o)) => o.get_mut(k),
            (Seg::Index(i), Value::Array(a)) => a.get_mut(*i),
            _ => None,
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    match (last, cur) {
        (Seg::Key(k), Value::Object(o)) => {
            o.remove(k);
        }
        (Seg::Index(i), Value::Array(a)) if *i < a.len() => {
            a.remove(*i);
        }
        _ => {}
    }
}

/// The paths of the fields of `obj` (as served at `version`) that `rt` does not know, in
/// document order. Empty when the kind has no known shape or the object does not decode.
pub fn unknown_fields(rt: &ResourceType, version: &str, obj: &Value) -> Vec<Vec<Seg>> {
    let mut out = Vec::new();
    if rt.custom {
        if let Some(schema) = rt.schemas.get(version) {
            resource_root(schema, obj, &mut Vec::new(), &mut out);
        }
        return out;
    }
    let mut probe = obj.clone();
    if let Some(o) = probe.as_object_mut() {
        // The typed decoders insist on their own apiVersion and kind.
        o.insert("apiVersion".into(), Value::from(rt.api_version(version)));
        o.insert("kind".into(), Value::from(rt.kind.clone()));
    }
    builtin_unknowns(&rt.group, &rt.kind, probe).unwrap_or_default()
}

/// Decodes `v` into `T`, collecting the paths its decoder skipped; `None` if it does not
/// decode at all.
fn typed_unknowns<T: DeserializeOwned>(v: Value) -> Option<Vec<Vec<Seg>>> {
    let mut out = Vec::new();
    let decoded: Result<T, _> = serde_ignored::deserialize(v, |p| out.push(segs(&p)));
    decoded.ok().map(|_| out)
}

fn segs(p: &serde_ignored::Path<'_>) -> Vec<Seg> {
    use serde_ignored::Path;
    match p {
        Path::Root => Vec::new(),
        Path::Seq { parent, index } => {
            let mut v = segs(parent);
            v.push(Seg::Index(*index));
            v
        }
        Path::Map { parent, key } => {
            let mut v = segs(parent);
            v.push(Seg::Key(key.clone()));
            v
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => segs(parent),
    }
}

/// The built-in kinds the emulator serves, by their k8s-openapi types.
fn builtin_unknowns(group: &str, kind: &str, v: Value) -> Option<Vec<Vec<Seg>>> {
    use k8s_openapi::api;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
    match (group, kind) {
        ("", "Namespace") => typed_unknowns::<api::core::v1::Namespace>(v),
        ("", "Node") => typed_unknowns::<api::core::v1::Node>(v),
        ("", "Pod") => typed_unknowns::<api::core::v1::Pod>(v),
        ("", "ConfigMap") => typed_unknowns::<api::core::v1::ConfigMap>(v),
        ("", "Secret") => typed_unknowns::<api::core::v1::Secret>(v),
        ("", "Service") => typed_unknowns::<api::core::v1::Service>(v),
        ("", "ServiceAccount") => typed_unknowns::<api::core::v1::ServiceAccount>(v),
        ("", "Event") => typed_unknowns::<api::core::v1::Event>(v),
        ("events.k8s.io", "Event") => typed_unknowns::<api::events::v1::Event>(v),
        ("coordination.k8s.io", "Lease") => typed_unknowns::<api::coordination::v1::Lease>(v),
        ("rbac.authorization.k8s.io", "Role") => typed_unknowns::<api::rbac::v1::Role>(v),
        ("rbac.authorization.k8s.io", "RoleBinding") => {
            typed_unknowns::<api::rbac::v1::RoleBinding>(v)
        }
        ("rbac.authorization.k8s.io", "ClusterRole") => {
            typed_unknowns::<api::rbac::v1::ClusterRole>(v)
        }
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => {
            typed_unknowns::<api::rbac::v1::ClusterRoleBinding>(v)
        }
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy") => {
            typed_unknowns::<api::admissionregistration::v1::ValidatingAdmissionPolicy>(v)
        }
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding") => {
            typed_unknowns::<api::admissionregistration::v1::ValidatingAdmissionPolicyBinding>(v)
        }
        ("networking.k8s.io", "NetworkPolicy") => {
            typed_unknowns::<api::networking::v1::NetworkPolicy>(v)
        }
        ("apps", "DaemonSet") => typed_unknowns::<api::apps::v1::DaemonSet>(v),
        ("policy", "PodDisruptionBudget") => {
            typed_unknowns::<api::policy::v1::PodDisruptionBudget>(v)
        }
        ("resource.k8s.io", "ResourceSlice") => {
            typed_unknowns::<api::resource::v1::ResourceSlice>(v)
        }
        ("resource.k8s.io", "ResourceClaim") => {
            typed_unknowns::<api::resource::v1::ResourceClaim>(v)
        }
        ("resource.k8s.io", "DeviceClass") => typed_unknowns::<api::resource::v1::DeviceClass>(v),
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            typed_unknowns::<apiext::CustomResourceDefinition>(v)
        }
        _ => None,
    }
}

/// `metadata` of a resource: an ObjectMeta.
fn object_meta(v: &Value, path: &[Seg], out: &mut Vec<Vec<Seg>>) {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    if let Some(found) = typed_unknowns::<ObjectMeta>(v.clone()) {
        for p in found {
            let mut full = path.to_vec();
            full.extend(p);
            out.push(full);
        }
    }
}

fn flag(schema: &Value, name: &str) -> bool {
    schema.get(name).and_then(Value::as_bool).unwrap_or(false)
}

/// The root of a custom resource, or an embedded resource: `apiVersion` and `kind` are
/// known, `metadata` is an ObjectMeta, the rest follows the schema.
fn resource_root(schema: &Value, obj: &Value, path: &mut Vec<Seg>, out: &mut Vec<Vec<Seg>>) {
    let Some(o) = obj.as_object() else {
        return;
    };
    for (k, v) in o {
        path.push(Seg::Key(k.clone()));
        match k.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" if v.is_object() => object_meta(v, path, out),
            _ => field(schema, k, v, path, out),
        }
        path.pop();
    }
}

/// Field `k` (value `v`, at `path`) of an object with schema `schema`.
fn field(schema: &Value, k: &str, v: &Value, path: &mut Vec<Seg>, out: &mut Vec<Vec<Seg>>) {
    if let Some(s) = schema.get("properties").and_then(|p| p.get(k)) {
        prune(Some(s), v, path, out);
        return;
    }
    match schema.get("additionalProperties") {
        Some(s @ Value::Object(_)) => prune(Some(s), v, path, out),
        Some(Value::Bool(true)) => {}
        _ if flag(schema, "x-kubernetes-preserve-unknown-fields") => {}
        _ => out.push(path.clone()),
    }
}

/// The real server's pruning walk over a structural schema (`None`: no schema here, so an
/// object's fields are all unknown).
fn prune(schema: Option<&Value>, v: &Value, path: &mut Vec<Seg>, out: &mut Vec<Vec<Seg>>) {
    match v {
        Value::Object(o) => {
            let Some(s) = schema else {
                for k in o.keys() {
                    path.push(Seg::Key(k.clone()));
                    out.push(path.clone());
                    path.pop();
                }
                return;
            };
            if flag(s, "x-kubernetes-embedded-resource") {
                resource_root(s, v, path, out);
                return;
            }
            for (k, child) in o {
                path.push(Seg::Key(k.clone()));
                field(s, k, child, path, out);
                path.pop();
            }
        }
        Value::Array(a) => {
            let items = schema.and_then(|s| s.get("items"));
            if schema.is_some_and(|s| flag(s, "x-kubernetes-preserve-unknown-fields"))
                && items.is_none()
            {
                return;
            }
            for (i, x) in a.iter().enumerate() {
                path.push(Seg::Index(i));
                prune(items, x, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

/// Server-side apply: fields of the applied configuration the schema does not declare fail
/// the request whatever the directive, worded like structured-merge-diff (`.spec.foo`, list
/// items by their keys) with the real server's 500.
pub fn check_apply(
    rt: &ResourceType,
    version: &str,
    ns: Option<&str>,
    name: &str,
    applied: &Value,
) -> Result<(), ApiError> {
    let unknown = unknown_fields(rt, version, applied);
    if unknown.is_empty() {
        return Ok(());
    }
    let errors: Vec<String> = unknown
        .iter()
        .map(|p| format!("{}: field not declared in schema", smd_path(rt, applied, p)))
        .collect();
    let joined = if errors.len() == 1 {
        errors[0].clone()
    } else {
        let mut lines = vec!["errors:".to_string()];
        lines.extend(errors.iter().map(|e| format!("  {e}")));
        lines.join("\n")
    };
    let gvk = format!("{}/{version}, Kind={}", rt.group, rt.kind);
    Err(ApiError::internal(format!(
        "failed to create typed patch object ({}/{name}; {gvk}): {joined}",
        ns.filter(|_| rt.namespaced).unwrap_or("")
    )))
}

/// A structured-merge-diff path: `.spec.containers[name="app"].foo`, `.spec.items[0].x`.
fn smd_path(rt: &ResourceType, obj: &Value, path: &[Seg]) -> String {
    let mut s = String::new();
    let mut names: Vec<String> = Vec::new();
    let mut cur = Some(obj);
    for seg in path {
        match seg {
            Seg::Key(k) => {
                s.push('.');
                s.push_str(k);
                names.push(k.clone());
                cur = cur.and_then(|c| c.get(k));
            }
            Seg::Index(i) => {
                let item = cur.and_then(|c| c.get(*i));
                match (rt.list_type(&names), item) {
                    (ListType::Map(keys), Some(item)) => {
                        let parts: Vec<String> = keys
                            .iter()
                            .filter_map(|k| item.get(k).map(|v| format!("{k}={v}")))
                            .collect();
                        s.push_str(&format!("[{}]", parts.join(",")));
                    }
                    _ => s.push_str(&format!("[{i}]")),
                }
                cur = item;
            }
        }
    }
    s
}

/// The `duplicate field "..."` problems of a JSON body (keys given twice in one object).
/// Not JSON, or not parseable: none (the body's own decoding reports that).
pub fn duplicate_fields(body: &[u8]) -> Vec<String> {
    let mut path = Vec::new();
    let mut found = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(body);
    let seed = Dups {
        path: &mut path,
        out: &mut found,
    };
    if seed.deserialize(&mut de).is_err() {
        return Vec::new();
    }
    found
        .into_iter()
        .map(|p| format!("duplicate field \"{}\"", dotted(&p)))
        .collect()
}

struct Dups<'a> {
    path: &'a mut Vec<Seg>,
    out: &'a mut Vec<Vec<Seg>>,
}

impl<'de> DeserializeSeed<'de> for Dups<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Dups<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        loop {
            self.path.push(Seg::Index(i));
            let more = seq.next_element_seed(Dups {
                path: &mut *self.path,
                out: &mut *self.out,
            })?;
            self.path.pop();
            if more.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = BTreeSet::new();
        while let Some(k) = map.next_key::<String>()? {
            self.path.push(Seg::Key(k.clone()));
            if !seen.insert(k) {
                self.out.push(self.path.clone());
            }
            map.next_value_seed(Dups {
                path: &mut *self.path,
                out: &mut *self.out,
            })?;
            self.path.pop();
        }
        Ok(())
    }
}

/// The field check of one request: its directive (for writes; other verbs take none) and
/// the duplicate fields of a JSON body, unless the directive ignores them.
pub fn for_request(
    verb: &str,
    value: Option<&str>,
    content_type: &str,
    body: &[u8],
) -> Result<FieldCheck, ApiError> {
    let options = match verb {
        "create" => "CreateOptions",
        "update" => "UpdateOptions",
        "patch" => "PatchOptions",
        _ => return Ok(FieldCheck::default()),
    };
    let mut check = FieldCheck::new(Directive::parse(value, options)?);
    let mime = content_type.split(';').next().unwrap_or("").trim();
    let json_body = matches!(
        mime,
        "application/json"
            | "application/merge-patch+json"
            | "application/strategic-merge-patch+json"
    );
    if check.directive != Directive::Ignore && json_body {
        check.duplicates = duplicate_fields(body);
    }
    Ok(check)
}

/// Adds one `Warning` header per recorded warning to a successful answer.
pub fn add_warnings(headers: &mut http::HeaderMap, check: &FieldCheck) {
    for w in check.warnings() {
        if let Ok(v) = http::HeaderValue::from_str(&warning_header(&w)) {
            headers.append(http::header::WARNING, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{builtin_types, type_from_crd};
    use serde_json::json;

    fn builtin(plural: &str) -> ResourceType {
        builtin_types()
            .into_iter()
            .find(|t| t.plural == plural && t.view_of.is_none())
            .unwrap()
    }

    fn widget_type() -> ResourceType {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "size": {"type": "integer"},
                "items": {"type": "array", "items": {"type": "object", "properties": {
                    "name": {"type": "string"}}}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "ports": {"type": "object", "additionalProperties": {"type": "object",
                    "properties": {"port": {"type": "integer"}}}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                    "properties": {"known": {"type": "object", "properties": {"a": {"type": "string"}}}}},
                "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                    "x-kubernetes-preserve-unknown-fields": true},
                "strict": {"type": "object", "x-kubernetes-embedded-resource": true,
                    "properties": {"spec": {"type": "object"}}},
                "raw": {"x-kubernetes-int-or-string": true},
            }},
            "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
        }});
        type_from_crd(&json!({
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": schema}}]}
        }))
        .unwrap()
    }

    fn unknown(rt: &ResourceType, obj: &Value) -> Vec<String> {
        unknown_fields(rt, "v1", obj)
            .iter()
            .map(|p| dotted(p))
            .collect()
    }

    #[test]
    fn directives_parse_like_the_real_server() {
        assert_eq!(
            Directive::parse(None, "CreateOptions").unwrap(),
            Directive::Warn
        );
        assert_eq!(
            Directive::parse(Some(""), "CreateOptions").unwrap(),
            Directive::Warn
        );
        assert_eq!(
            Directive::parse(Some("Strict"), "PatchOptions").unwrap(),
            Directive::Strict
        );
        assert_eq!(
            Directive::parse(Some("Ignore"), "PatchOptions").unwrap(),
            Directive::Ignore
        );
        let e = Directive::parse(Some("strict"), "UpdateOptions").unwrap_err();
        assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
        assert!(
            e.message.starts_with(
                "UpdateOptions.meta.k8s.io \"\" is invalid: fieldValidation: Unsupported value: \"strict\""
            ),
            "{}",
            e.message
        );
        // Reads and deletes take no directive.
        assert_eq!(
            for_request("get", Some("bogus"), "application/json", b"")
                .unwrap()
                .directive,
            Directive::Warn
        );
    }

    #[test]
    fn builtin_unknown_fields_are_found_with_their_paths() {
        let cm = builtin("configmaps");
        let obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "labelz": {"a": "b"}},
            "data": {"k": "v"}, "dataa": {"k": "v"}});
        assert_eq!(unknown(&cm, &obj), vec!["dataa", "metadata.labelz"]);
        let pods = builtin("pods");
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "image": "i"},
            {"name": "b", "image": "i", "imagePullPolice": "Always", "ports": [{"containerPort": 80, "prot": "TCP"}]},
        ]}});
        assert_eq!(
            unknown(&pods, &pod),
            vec![
                "spec.containers[1].imagePullPolice",
                "spec.containers[1].ports[0].prot"
            ]
        );
        // A fully known object, and one that does not decode (not checked here).
        let ok = json!({"metadata": {"name": "p", "labels": {"a": "b"}}, "spec": {"containers": [{"name": "a"}]}});
        assert!(unknown(&pods, &ok).is_empty());
        let bad = json!({"metadata": {"name": "p"}, "spec": {"containers": "nope", "zzz": 1}});
        assert!(unknown(&pods, &bad).is_empty());
        // The view of core Events is checked against its own type.
        let ev = builtin_types()
            .into_iter()
            .find(|t| t.group == "events.k8s.io")
            .unwrap();
        let e = json!({"metadata": {"name": "e"}, "note": "n", "message": "core only"});
        assert_eq!(unknown(&ev, &e), vec!["message"]);
    }

    #[test]
    fn custom_resources_are_pruned_by_their_structural_schema() {
        let rt = widget_type();
        let obj = json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "bogus": 1},
            "spec": {
                "size": 1, "sise": 2,
                "items": [{"name": "a"}, {"name": "b", "nmae": "c"}],
                "labels": {"any": "thing"},
                "ports": {"http": {"port": 80, "prot": "TCP"}},
                "free": {"anything": {"goes": 1}, "known": {"a": "x", "b": "pruned"}},
                "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "t", "nam": 1},
                    "spec": {"whatever": true}},
                "strict": {"apiVersion": "v1", "kind": "X", "spec": {"inner": 1}, "extra": 1},
                "raw": "50%",
            },
            "status": {"ready": true, "readdy": false},
            "top": 1,
        });
        assert_eq!(
            unknown(&rt, &obj),
            vec![
                "metadata.bogus",
                "spec.free.known.b",
                "spec.items[1].nmae",
                "spec.ports.http.prot",
                "spec.sise",
                "spec.strict.extra",
                "spec.strict.spec.inner",
                "spec.template.metadata.nam",
                "status.readdy",
                "top",
            ]
        );
        // A version without a schema keeps everything.
        let mut loose = rt.clone();
        loose.schemas.clear();
        assert!(unknown(&loose, &obj).is_empty());
    }

    #[test]
    fn directives_decide_between_failing_warning_and_silence() {
        let cm = builtin("configmaps");
        let obj = json!({"metadata": {"name": "x"}, "data": {"k": "v"}, "dataa": 1});
        let pruned = json!({"metadata": {"name": "x"}, "data": {"k": "v"}});

        let strict = FieldCheck::new(Directive::Strict);
        let e = strict
            .check(&cm, "v1", obj.clone(), Origin::Body)
            .unwrap_err();
        assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"));
        assert_eq!(
            e.message,
            "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: strict decoding error: unknown field \"dataa\""
        );

        let warn = FieldCheck::new(Directive::Warn);
        assert_eq!(
            warn.check(&cm, "v1", obj.clone(), Origin::Body).unwrap(),
            pruned
        );
        assert_eq!(warn.warnings(), vec!["unknown field \"dataa\""]);

        let ignore = FieldCheck::new(Directive::Ignore);
        assert_eq!(
            ignore.check(&cm, "v1", obj.clone(), Origin::Body).unwrap(),
            pruned
        );
        assert!(ignore.warnings().is_empty());

        // Duplicates count like unknown fields, listed first.
        let mut dup = FieldCheck::new(Directive::Strict);
        dup.duplicates = duplicate_fields(br#"{"metadata":{"name":"x","name":"y"},"data":{}}"#);
        let e = dup.check(&cm, "v1", obj.clone(), Origin::Body).unwrap_err();
        assert!(
            e.message.ends_with(
                "strict decoding error: duplicate field \"metadata.name\", unknown field \"dataa\""
            ),
            "{}",
            e.message
        );

        // Patches fail as 422 with the cause on `patch`.
        let e = strict
            .check(&cm, "v1", obj.clone(), Origin::JsonPatch)
            .unwrap_err();
        assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
        assert_eq!(e.details.causes[0].field.as_deref(), Some("patch"));
        assert!(
            e.details.causes[0].message.contains("\\\"dataa\\\":1"),
            "{e:?}"
        );
        assert!(
            e.message
                .ends_with("strict decoding error: unknown field \"dataa\""),
            "{}",
            e.message
        );
        let patch = json!({"dataa": 1, "data": {"k": "v"}});
        let e = strict
            .check(&cm, "v1", obj, Origin::StrategicPatch(&patch))
            .unwrap_err();
        assert!(
            e.details.causes[0].message.starts_with(
                "Invalid value: \"map[data:map[k:v] dataa:1]\": strict decoding error"
            ),
            "{e:?}"
        );
        // A clean object passes every directive untouched.
        assert_eq!(
            strict
                .check(&cm, "v1", pruned.clone(), Origin::Body)
                .unwrap(),
            pruned
        );
    }

    #[test]
    fn duplicate_fields_are_found_at_any_depth() {
        assert_eq!(
            duplicate_fields(br#"{"a":1,"b":[{"c":1,"c":2}],"a":{"x":[1,2]}}"#),
            vec!["duplicate field \"b[0].c\"", "duplicate field \"a\""]
        );
        assert!(duplicate_fields(br#"{"a":{"a":1},"b":[1,[2]]}"#).is_empty());
        assert!(duplicate_fields(b"not json").is_empty());
    }

    #[test]
    fn server_side_apply_refuses_undeclared_fields() {
        let pods = builtin("pods");
        let applied = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "app", "imagePullPolice": "Always"}]}});
        let e = check_apply(&pods, "v1", Some("ns"), "p", &applied).unwrap_err();
        assert_eq!(e.code, 500);
        assert_eq!(
            e.message,
            "failed to create typed patch object (ns/p; /v1, Kind=Pod): \
             .spec.containers[name=\"app\"].imagePullPolice: field not declared in schema"
        );
        let two = json!({"metadata": {"name": "p", "x": 1}, "spec": {"y": 2}});
        let e = check_apply(&pods, "v1", Some("ns"), "p", &two).unwrap_err();
        assert!(
            e.message.ends_with(
                "errors:\n  .metadata.x: field not declared in schema\n  .spec.y: field not declared in schema"
            ),
            "{}",
            e.message
        );
        let rt = widget_type();
        let ok = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
            "spec": {"items": [{"name": "a"}]}});
        assert!(check_apply(&rt, "v1", Some("ns"), "w", &ok).is_ok());
        let bad = json!({"spec": {"items": [{"name": "a", "nmae": 1}]}});
        let e = check_apply(&rt, "v1", Some("ns"), "w", &bad).unwrap_err();
        assert!(
            e.message.ends_with(
                "(ns/w; example.com/v1, Kind=Widget): .spec.items[0].nmae: field not declared in schema"
            ),
            "{}",
            e.message
        );
    }

    #[test]
    fn warnings_are_quoted_for_the_header() {
        assert_eq!(
            warning_header("unknown field \"spec.foo\""),
            "299 - \"unknown field \\\"spec.foo\\\"\""
        );
        let check = FieldCheck::new(Directive::Warn);
        let cm = builtin("configmaps");
        check
            .check(
                &cm,
                "v1",
                json!({"metadata": {"name": "x"}, "a": 1, "b": 2}),
                Origin::Body,
            )
            .unwrap();
        let mut h = http::HeaderMap::new();
        add_warnings(&mut h, &check);
        let got: Vec<&str> = h
            .get_all(http::header::WARNING)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(
            got,
            vec![
                "299 - \"unknown field \\\"a\\\"\"",
                "299 - \"unknown field \\\"b\\\"\""
            ]
        );
    }

    #[test]
    fn go_format_matches_percent_plus_v() {
        assert_eq!(
            go_format(&json!({"b": [1, "x", null], "a": {"z": true, "y": 1.5}})),
            "map[a:map[y:1.5 z:true] b:[1 x <nil>]]"
        );
    }
}
