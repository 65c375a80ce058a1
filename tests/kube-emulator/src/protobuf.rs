//! Request bodies in `application/vnd.kubernetes.protobuf`, turned into the JSON objects the
//! store keeps.
//!
//! kubectl's typed clients (`kubectl create namespace|configmap|secret|serviceaccount|role|
//! clusterrole|rolebinding|clusterrolebinding`) send protobuf whatever discovery says, so the
//! emulator reads it for those kinds. The format is the real server's: the 4-byte magic
//! `k8s\0`, then a `runtime.Unknown` message (`typeMeta`, `raw`, `contentEncoding`,
//! `contentType`) whose `raw` is the object in the protobuf encoding of its Go type
//! (`generated.proto` of each API group). The field numbers of the messages read here are
//! listed below, one table per message; any other kind is answered 415, and a field the table
//! does not know is a 400 naming it, so nothing is dropped unseen.
//!
//! The Go encoder writes every non-pointer field, empty or not, while JSON omits empty ones;
//! so empty strings, zero numbers, `false` and empty messages are left out of the JSON except
//! for pointer fields (`Opt*`) and map values. Responses are always JSON (clients accept it).
//! Pure functions.

use base64::Engine as _;
use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// The protobuf media type of the Kubernetes API.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

const MAGIC: &[u8] = b"k8s\0";

/// How one field is decoded.
#[derive(Clone, Copy)]
enum Ty {
    Str,
    /// A `*string`: kept when present, even if empty.
    OptStr,
    /// Base64 in JSON.
    Bytes,
    /// A `*bool`: kept when present, even if `false`.
    OptBool,
    Int,
    /// A `*int32`/`*int64`.
    OptInt,
    /// `map<string, string>`.
    MapStr,
    /// `map<string, bytes>`.
    MapBytes,
    /// `metav1.Time`: `{seconds, nanos}`, written as RFC 3339.
    Time,
    Msg(&'static [Field]),
}

/// One field of a message: number, JSON name, type, repeated.
type Field = (u32, &'static str, Ty, bool);

use Ty::*;

const OWNER_REFERENCE: &[Field] = &[
    (1, "kind", Str, false),
    (3, "name", Str, false),
    (4, "uid", Str, false),
    (5, "apiVersion", Str, false),
    (6, "controller", OptBool, false),
    (7, "blockOwnerDeletion", OptBool, false),
];

const OBJECT_META: &[Field] = &[
    (1, "name", Str, false),
    (2, "generateName", Str, false),
    (3, "namespace", Str, false),
    (4, "selfLink", Str, false),
    (5, "uid", Str, false),
    (6, "resourceVersion", Str, false),
    (7, "generation", Int, false),
    (8, "creationTimestamp", Time, false),
    (9, "deletionTimestamp", Time, false),
    (10, "deletionGracePeriodSeconds", OptInt, false),
    (11, "labels", MapStr, false),
    (12, "annotations", MapStr, false),
    (13, "ownerReferences", Msg(OWNER_REFERENCE), true),
    (14, "finalizers", Str, true),
];

const TYPE_META: &[Field] = &[(1, "apiVersion", Str, false), (2, "kind", Str, false)];

const UNKNOWN: &[Field] = &[
    (1, "typeMeta", Msg(TYPE_META), false),
    (2, "raw", Bytes, false),
    (3, "contentEncoding", Str, false),
    (4, "contentType", Str, false),
];

const NAMESPACE_SPEC: &[Field] = &[(1, "finalizers", Str, true)];
const NAMESPACE_STATUS: &[Field] = &[(1, "phase", Str, false)];
const NAMESPACE: &[Field] = &[
    (1, "metadata", Msg(OBJECT_META), false),
    (2, "spec", Msg(NAMESPACE_SPEC), false),
    (3, "status", Msg(NAMESPACE_STATUS), false),
];

const CONFIG_MAP: &[Field] = &[
    (1, "metadata", Msg(OBJECT_META), false),
    (2, "data", MapStr, false),
    (3, "binaryData", MapBytes, false),
    (4, "immutable", OptBool, false),
];

const SECRET: &[Field] = &[
    (1, "metadata", Msg(OBJECT_META), false),
    (2, "data", MapBytes, false),
    (3, "type", Str, false),
    (4, "stringData", MapStr, false),
    (5, "immutable", OptBool, false),
];

const OBJECT_REFERENCE: &[Field] = &[
    (1, "kind", Str, false),
    (2, "namespace", Str, false),
    (3, "name", Str, false),
    (4, "uid", Str, false),
    (5, "apiVersion", Str, false),
    (6, "resourceVersion", Str, false),
    (7, "fieldPath", Str, false),
];
const LOCAL_OBJECT_REFERENCE: &[Field] = &[(1, "name", Str, false)];
const SERVICE_ACCOUNT: &[Field] = &[
    (1, "metadata", Msg(OBJECT_META), false),
    (2, "secrets", Msg(OBJECT_REFERENCE), true),
    (3, "imagePullSecrets", Msg(LOCAL_OBJECT_REFERENCE), true),
    (4, "automountServiceAccountToken", OptBool, false),
];

const POLICY_RULE: &[Field] = &[
    (1, "verbs", Str, true),
    (2, "apiGroups", Str, true),
    (3, "resources", Str, true),
    (4, "resourceNames", Str, true),
    (5, "nonResourceURLs", Str, true),
];
const LABEL_SELECTOR_REQUIREMENT: &[Field] = &[
    (1, "key", Str, false),
    (2, "operator", Str, false),
    (3, "values", Str, true),
];
const LABEL_SELECTOR: &[Field] = &[
    (1, "matchLabels", MapStr, false),
    (2, "matchExpressions", Msg(LABEL_SELECTOR_REQUIREMENT), true),
];
const AGGREGATION_RULE: &[Field] = &[(1, "clusterRoleSelectors", Msg(LABEL_SELECTOR), true)];
const ROLE: &[Field] = &[
    (1, "metadata", Msg(OBJECT_META), false),
    (2, "rules", Msg(POLICY_RULE), true),
];
const CLUSTER_ROLE: &[Field] = &[
    (1, "metadata", Msg(OBJECT_META), false),
    (2, "rules", Msg(POLICY_RULE), true),
    (3, "aggregationRule", Msg(AGGREGATION_RULE), false),
];
const SUBJECT: &[Field] = &[
    (1, "kind", Str, false),
    (2, "apiGroup", Str, false),
    (3, "name", Str, false),
    (4, "namespace", Str, false),
];
const ROLE_REF: &[Field] = &[
    (1, "apiGroup", Str, false),
    (2, "kind", Str, false),
    (3, "name", Str, false),
];
const ROLE_BINDING: &[Field] = &[
    (1, "metadata", Msg(OBJECT_META), false),
    (2, "subjects", Msg(SUBJECT), true),
    (3, "roleRef", Msg(ROLE_REF), false),
];

const PRECONDITIONS: &[Field] = &[
    (1, "uid", OptStr, false),
    (2, "resourceVersion", OptStr, false),
];
const DELETE_OPTIONS: &[Field] = &[
    (1, "gracePeriodSeconds", OptInt, false),
    (2, "preconditions", Msg(PRECONDITIONS), false),
    (3, "orphanDependents", OptBool, false),
    (4, "propagationPolicy", OptStr, false),
    (5, "dryRun", Str, true),
];
const EVICTION: &[Field] = &[
    (1, "metadata", Msg(OBJECT_META), false),
    (2, "deleteOptions", Msg(DELETE_OPTIONS), false),
];

/// The kinds whose protobuf bodies the emulator reads, by `apiVersion` and `kind`.
const KINDS: &[(&str, &str, &[Field])] = &[
    ("v1", "Namespace", NAMESPACE),
    ("v1", "ConfigMap", CONFIG_MAP),
    ("v1", "Secret", SECRET),
    ("v1", "ServiceAccount", SERVICE_ACCOUNT),
    ("rbac.authorization.k8s.io/v1", "Role", ROLE),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", CLUSTER_ROLE),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", ROLE_BINDING),
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        ROLE_BINDING,
    ),
    ("policy/v1", "Eviction", EVICTION),
];

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(format!("error decoding protobuf body: {}", message.into()))
}

/// A cursor over protobuf wire data.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, ApiError> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = *self
                .buf
                .get(self.pos)
                .ok_or_else(|| bad("truncated varint"))?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(bad("varint longer than 10 bytes"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ApiError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or_else(|| bad("length-delimited field runs past the end"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }
}

/// A field's value as read from the wire.
enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

/// Reads every `(field number, value)` of a message.
fn fields(buf: &[u8]) -> Result<Vec<(u32, Wire<'_>)>, ApiError> {
    let mut r = Reader { buf, pos: 0 };
    let mut out = Vec::new();
    while !r.done() {
        let tag = r.varint()?;
        let num = u32::try_from(tag >> 3).map_err(|_| bad("field number out of range"))?;
        let value = match tag & 7 {
            0 => Wire::Varint(r.varint()?),
            2 => {
                let len = usize::try_from(r.varint()?).map_err(|_| bad("length out of range"))?;
                Wire::Bytes(r.take(len)?)
            }
            1 => Wire::Bytes(r.take(8)?),
            5 => Wire::Bytes(r.take(4)?),
            w => return Err(bad(format!("unsupported wire type {w} for field {num}"))),
        };
        out.push((num, value));
    }
    Ok(out)
}

fn utf8(b: &[u8], field: &str) -> Result<String, ApiError> {
    String::from_utf8(b.to_vec()).map_err(|_| bad(format!("{field} is not UTF-8")))
}

fn varint_of(w: &Wire<'_>, field: &str) -> Result<u64, ApiError> {
    match w {
        Wire::Varint(v) => Ok(*v),
        Wire::Bytes(_) => Err(bad(format!("{field}: expected a varint"))),
    }
}

fn bytes_of<'a>(w: &Wire<'a>, field: &str) -> Result<&'a [u8], ApiError> {
    match w {
        Wire::Bytes(b) => Ok(b),
        Wire::Varint(_) => Err(bad(format!("{field}: expected length-delimited data"))),
    }
}

/// A map entry message: key 1, value 2.
fn map_entry(b: &[u8], field: &str, value_bytes: bool) -> Result<(String, Value), ApiError> {
    let mut key = String::new();
    let mut value = json!("");
    for (num, w) in fields(b)? {
        match num {
            1 => key = utf8(bytes_of(&w, field)?, field)?,
            2 => {
                let raw = bytes_of(&w, field)?;
                value = if value_bytes {
                    json!(base64::engine::general_purpose::STANDARD.encode(raw))
                } else {
                    json!(utf8(raw, field)?)
                };
            }
            n => return Err(bad(format!("{field}: map entry field {n}"))),
        }
    }
    Ok((key, value))
}

fn time(b: &[u8], field: &str) -> Result<Option<Value>, ApiError> {
    let mut seconds: i64 = 0;
    for (num, w) in fields(b)? {
        match num {
            // int64 on the wire is the two's complement in a varint.
            1 => seconds = varint_of(&w, field)? as i64,
            2 => {}
            n => return Err(bad(format!("{field}: Time field {n}"))),
        }
    }
    if seconds == 0 {
        return Ok(None);
    }
    let t = jiff::Timestamp::from_second(seconds).map_err(|e| bad(format!("{field}: {e}")))?;
    Ok(Some(json!(t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())))
}

/// Decodes one message by its field table. `path` names it in errors.
fn message(b: &[u8], table: &'static [Field], path: &str) -> Result<Map<String, Value>, ApiError> {
    let mut out = Map::new();
    for (num, w) in fields(b)? {
        let Some(&(_, name, ty, repeated)) = table.iter().find(|f| f.0 == num) else {
            return Err(bad(format!(
                "field {num} of {path} is not known to the emulator"
            )));
        };
        let field = if path.is_empty() {
            name.to_string()
        } else {
            format!("{path}.{name}")
        };
        let value: Option<Value> = match ty {
            Str => {
                Some(json!(utf8(bytes_of(&w, &field)?, &field)?)).filter(|v| repeated || v != "")
            }
            OptStr => Some(json!(utf8(bytes_of(&w, &field)?, &field)?)),
            Bytes => Some(json!(
                base64::engine::general_purpose::STANDARD.encode(bytes_of(&w, &field)?)
            ))
            .filter(|v| repeated || v != ""),
            OptBool => Some(json!(varint_of(&w, &field)? != 0)),
            Int => Some(json!(varint_of(&w, &field)? as i64)).filter(|v| repeated || v != 0),
            OptInt => Some(json!(varint_of(&w, &field)? as i64)),
            MapStr | MapBytes => {
                let (k, v) = map_entry(bytes_of(&w, &field)?, &field, matches!(ty, MapBytes))?;
                let m = out.entry(name).or_insert_with(|| Value::Object(Map::new()));
                if let Some(m) = m.as_object_mut() {
                    m.insert(k, v);
                }
                continue;
            }
            Time => time(bytes_of(&w, &field)?, &field)?,
            Msg(sub) => {
                let m = message(bytes_of(&w, &field)?, sub, &field)?;
                (repeated || !m.is_empty()).then_some(Value::Object(m))
            }
        };
        let Some(value) = value else { continue };
        if repeated {
            let list = out.entry(name).or_insert_with(|| Value::Array(Vec::new()));
            if let Some(a) = list.as_array_mut() {
                a.push(value);
            }
        } else {
            out.insert(name.to_string(), value);
        }
    }
    Ok(out)
}

/// Decodes a protobuf request body (magic, `runtime.Unknown`, object) into the object's JSON.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| bad("the body does not start with the k8s protobuf magic"))?;
    let unknown = message(rest, UNKNOWN, "")?;
    let s = |p: &str| {
        unknown
            .get(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let api_version = unknown
        .get("typeMeta")
        .and_then(|t| t.get("apiVersion"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let kind = unknown
        .get("typeMeta")
        .and_then(|t| t.get("kind"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if !s("contentEncoding").is_empty() {
        return Err(bad(format!(
            "contentEncoding {:?} is not supported",
            s("contentEncoding")
        )));
    }
    let Some((_, _, table)) = KINDS
        .iter()
        .find(|(av, k, _)| *av == api_version && *k == kind)
    else {
        let known: Vec<String> = KINDS.iter().map(|(av, k, _)| format!("{av} {k}")).collect();
        return Err(ApiError::unsupported_media_type(format!(
            "the emulator reads protobuf bodies only for {}; {api_version} {kind} must be sent as application/json",
            known.join(", ")
        )));
    };
    let raw = match unknown.get("raw").and_then(Value::as_str) {
        Some(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| bad(format!("raw: {e}")))?,
        None => Vec::new(),
    };
    let mut obj = message(&raw, table, "")?;
    obj.insert("apiVersion".into(), json!(api_version));
    obj.insert("kind".into(), json!(kind));
    Ok(Value::Object(obj))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The body kubectl v1.32 sends for `kubectl create namespace x` (from `-v=8`).
    const CREATE_NAMESPACE_X: &[u8] = &[
        0x6b, 0x38, 0x73, 0x00, 0x0a, 0x0f, 0x0a, 0x02, 0x76, 0x31, 0x12, 0x09, 0x4e, 0x61, 0x6d,
        0x65, 0x73, 0x70, 0x61, 0x63, 0x65, 0x12, 0x19, 0x0a, 0x11, 0x0a, 0x01, 0x78, 0x12, 0x00,
        0x1a, 0x00, 0x22, 0x00, 0x2a, 0x00, 0x32, 0x00, 0x38, 0x00, 0x42, 0x00, 0x12, 0x00, 0x1a,
        0x02, 0x0a, 0x00, 0x1a, 0x00, 0x22, 0x00,
    ];

    #[test]
    fn kubectl_create_namespace_body() {
        let v = decode(CREATE_NAMESPACE_X).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}})
        );
    }

    fn field(num: u32, wire: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![((num << 3) as u8) | wire];
        if wire == 2 {
            out.push(payload.len() as u8);
        }
        out.extend_from_slice(payload);
        out
    }

    fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let tm = [
            field(1, 2, api_version.as_bytes()),
            field(2, 2, kind.as_bytes()),
        ]
        .concat();
        [MAGIC.to_vec(), field(1, 2, &tm), field(2, 2, raw)].concat()
    }

    #[test]
    fn config_map_maps_keep_empty_values() {
        let meta = [
            field(1, 2, b"cm"),
            field(11, 2, &[field(1, 2, b"app"), field(2, 2, b"x")].concat()),
        ]
        .concat();
        let raw = [
            field(1, 2, &meta),
            field(2, 2, &[field(1, 2, b"a"), field(2, 2, b"1")].concat()),
            field(2, 2, &[field(1, 2, b"empty"), field(2, 2, b"")].concat()),
            field(3, 2, &[field(1, 2, b"bin"), field(2, 2, &[0xff])].concat()),
        ]
        .concat();
        let v = decode(&envelope("v1", "ConfigMap", &raw)).unwrap();
        assert_eq!(v["metadata"], json!({"name": "cm", "labels": {"app": "x"}}));
        assert_eq!(v["data"], json!({"a": "1", "empty": ""}));
        assert_eq!(v["binaryData"], json!({"bin": "/w=="}));
    }

    #[test]
    fn unknown_kinds_and_fields_are_refused() {
        let e = decode(&envelope("apps/v1", "Deployment", &[])).unwrap_err();
        assert_eq!(e.code, 415, "{e}");
        let e = decode(&envelope("v1", "ConfigMap", &field(9, 2, b"?"))).unwrap_err();
        assert_eq!(e.code, 400);
        assert!(e.message.contains("field 9"), "{e}");
        assert_eq!(decode(b"{}").unwrap_err().code, 400);
        // Truncated length.
        assert_eq!(
            decode(&[MAGIC, &[0x0a, 0x20]].concat()).unwrap_err().code,
            400
        );
    }
}
