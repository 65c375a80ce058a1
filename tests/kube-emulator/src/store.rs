//! The object store: one generic map of JSON objects keyed by group/resource/namespace/name,
//! a global resourceVersion counter (like etcd's revision), and the event history that
//! watches resume from.
//!
//! Everything the API verbs mean lives here (create/update/patch/apply/delete semantics,
//! finalizers, generation, status subresource rules, list snapshots, eviction). The HTTP
//! layer only parses requests and serialises answers. The store never blocks and never does
//! I/O; committed events are pushed to a broadcast channel for open watches.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use base64::Engine as _;
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use crate::admission::{self, Caller, Operation as Op, Param, Target, Verdict};
use crate::error::{ApiError, ApiResult, Cause, Qualified};
use crate::fields::{self, ManagerKey, Operation, Ownership, Scope};
use crate::frozen::Frozen;
use crate::patch;
use crate::rbac;
use crate::resource_claim;
use crate::resource_slice;
use crate::resources::{ResourceType, builtin_types, type_from_crd};
use crate::selector::{FieldSelector, LabelSelector};
use crate::validation::{self, Directive, FieldCheck, Origin};
use crate::views;

/// The largest object stored: etcd's default `--max-request-bytes`, 1.5 MiB. The
/// request body limit (3 MiB, `server::MAX_BODY`) is larger, so an object can be
/// refused here after its request was read.
pub const MAX_STORED_BYTES: usize = 1536 * 1024;

/// The key of one stored object. Cluster-scoped objects have an empty namespace. The served
/// version is not part of the key: all versions of a resource share one object, as they do in
/// a real cluster (the emulator converts between versions by rewriting `apiVersion` only).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjKey {
    pub group: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
}

/// An object as the store keeps it: frozen (see [`crate::frozen`]), with its field
/// ownership.
#[derive(Clone, Debug)]
struct Stored {
    value: Frozen,
    owners: Ownership,
}

/// A stored object thawed for one write: its value to read and change, its ownership,
/// and the frozen form it came from (the `prev` of the write's event, shared, not copied).
struct Live {
    value: Value,
    owners: Ownership,
    frozen: Frozen,
}

impl Stored {
    fn thaw(&self) -> Live {
        Live {
            value: self.value.thaw(),
            owners: self.owners.clone(),
            frozen: self.value.clone(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One committed change, as kept in the history and sent to watches.
#[derive(Debug)]
pub struct Record {
    pub rv: u64,
    pub etype: EventType,
    pub key: ObjKey,
    /// The object after the change (for deletions: its last state, at the deletion's rv).
    pub object: Frozen,
    /// The object before the change (modifications and deletions).
    pub prev: Option<Frozen>,
}

/// Who is writing, for field ownership, and whether to persist.
#[derive(Clone, Debug)]
pub struct WriteCtx {
    pub manager: String,
    pub dry_run: bool,
    /// The write's `fieldValidation` directive, and where its warnings go.
    pub validation: FieldCheck,
    /// The request's user and options, for admission; `None` for the
    /// emulator's own writes (seeding, the well-known namespaces), which no
    /// policy judges.
    pub caller: Option<Caller>,
}

/// The `DeleteOptions` fields the emulator honours.
#[derive(Clone, Debug, Default)]
pub struct DeleteOpts {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub dry_run: bool,
    /// As [`WriteCtx::caller`]: `None` for the emulator's own deletions
    /// (namespace contents, the pod an eviction removes).
    pub caller: Option<Caller>,
}

impl DeleteOpts {
    /// Reads a `DeleteOptions` body (or the `deleteOptions` of an Eviction).
    pub fn from_body(body: &Value, dry_run: bool) -> Self {
        let s = |p: &str| body.pointer(p).and_then(Value::as_str).map(str::to_string);
        let body_dry = body
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|x| x == "All"));
        Self {
            uid: s("/preconditions/uid"),
            resource_version: s("/preconditions/resourceVersion"),
            dry_run: dry_run || body_dry,
            caller: None,
        }
    }
}

/// List query parameters.
#[derive(Clone, Debug, Default)]
pub struct ListOpts {
    pub label: LabelSelector,
    pub field: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
}

/// Watch query parameters.
#[derive(Clone, Debug, Default)]
pub struct WatchOpts {
    pub label: LabelSelector,
    pub field: FieldSelector,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
    pub send_initial_events: bool,
    pub bookmarks: bool,
}

/// Which events a watch wants.
#[derive(Clone, Debug)]
pub struct WatchFilter {
    pub group: String,
    pub resource: String,
    pub namespace: Option<String>,
    pub label: LabelSelector,
    pub field: FieldSelector,
}

impl WatchFilter {
    fn matches_obj(&self, v: &Value) -> bool {
        self.label.matches_object(v) && self.field.matches(v)
    }

    fn selects_all(&self) -> bool {
        self.label.is_empty() && self.field.is_empty()
    }

    /// The event a watch with this filter sees for a record, if any. Objects that start or
    /// stop matching a selector appear as ADDED or DELETED, as with the real watch cache.
    /// The object stays frozen: a replay of 100,000 events is thawed one at a time, as sent.
    pub fn event_for(&self, rec: &Record) -> Option<(EventType, Frozen)> {
        if rec.key.group != self.group || rec.key.resource != self.resource {
            return None;
        }
        if let Some(ns) = &self.namespace
            && &rec.key.namespace != ns
        {
            return None;
        }
        // Without selectors every version matches: none needs to be thawed.
        let selects_all = self.selects_all();
        let now = selects_all || self.matches_obj(&rec.object.thaw());
        let before = || {
            rec.prev
                .as_ref()
                .is_some_and(|p| selects_all || self.matches_obj(&p.thaw()))
        };
        let object = rec.object.clone();
        match rec.etype {
            EventType::Added => now.then_some((EventType::Added, object)),
            EventType::Deleted => (now || before()).then_some((EventType::Deleted, object)),
            EventType::Modified => match (before(), now) {
                (true, true) => Some((EventType::Modified, object)),
                (false, true) => Some((EventType::Added, object)),
                (true, false) => Some((EventType::Deleted, object)),
                (false, false) => None,
            },
        }
    }
}

/// How a watch starts.
pub enum WatchStart {
    /// The requested resourceVersion is compacted: send this as an `ERROR` event and close.
    Expired(ApiError),
    Stream {
        /// Events to send before live ones (initial state or history replay), thawed as
        /// they are sent.
        initial: Vec<(EventType, Frozen)>,
        rx: broadcast::Receiver<Arc<Record>>,
        /// Which live events the watch wants.
        filter: WatchFilter,
        /// The revision the live part starts after.
        start_rv: u64,
        /// Send the `k8s.io/initial-events-end` bookmark after `initial`.
        initial_events_end: bool,
    },
}

/// The current time as the API server writes timestamps.
pub fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn meta(v: &Value) -> Option<&Map<String, Value>> {
    v.get("metadata").and_then(Value::as_object)
}

fn meta_str<'a>(v: &'a Value, field: &str) -> Option<&'a str> {
    meta(v).and_then(|m| m.get(field)).and_then(Value::as_str)
}

fn meta_mut(v: &mut Value) -> &mut Map<String, Value> {
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    let o = v.as_object_mut().expect("made an object above");
    let m = o
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !m.is_object() {
        *m = Value::Object(Map::new());
    }
    m.as_object_mut().expect("made an object above")
}

fn finalizers(v: &Value) -> Vec<String> {
    meta(v)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// A DNS-1123 subdomain, as most object names must be.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// The part of an object that decides `metadata.generation`: all but metadata, and all but
/// status when the type has a status subresource.
fn generation_view(v: &Value, rt: &ResourceType) -> Value {
    let mut c = v.clone();
    if let Some(o) = c.as_object_mut() {
        o.remove("metadata");
        o.remove("apiVersion");
        o.remove("kind");
        if rt.status {
            o.remove("status");
        }
    }
    c
}

/// The object without the fields every write changes, to detect no-op writes.
fn content_view(v: &Value) -> Value {
    let mut c = v.clone();
    if let Some(o) = c.as_object_mut() {
        o.remove("apiVersion");
        if let Some(Value::Object(m)) = o.get_mut("metadata") {
            m.remove("resourceVersion");
            m.remove("managedFields");
        }
    }
    c
}

fn decode_continue(token: &str) -> ApiResult<(u64, String)> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token}"));
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    let rv = v.get("rv").and_then(Value::as_u64).ok_or_else(bad)?;
    let start = v.get("start").and_then(Value::as_str).ok_or_else(bad)?;
    Ok((rv, start.to_string()))
}

fn encode_continue(rv: u64, start: &str) -> String {
    let v = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
}

fn parse_rv(s: &str) -> ApiResult<u64> {
    s.parse::<u64>()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version \"{s}\"")))
}

fn q(rt: &ResourceType) -> Qualified<'_> {
    Qualified {
        group: &rt.group,
        resource: &rt.plural,
    }
}

fn invalid_one(
    rt: &ResourceType,
    name: &str,
    reason: &str,
    field: &str,
    message: impl Into<String>,
) -> ApiError {
    ApiError::invalid(
        &rt.kind,
        &rt.group,
        name,
        vec![Cause {
            reason: reason.into(),
            message: message.into(),
            field: Some(field.into()),
        }],
    )
}

/// A small non-cryptographic generator for uids and generated names (splitmix64).
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn uid(&mut self) -> String {
        let a = self.next();
        let b = self.next();
        let a = (a & 0xFFFF_FFFF_FFFF_0FFF) | 0x0000_0000_0000_4000;
        let b = (b & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000;
        format!(
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xFFFF,
            a & 0xFFFF,
            b >> 48,
            b & 0xFFFF_FFFF_FFFF
        )
    }

    /// Five characters from the alphabet the real server uses for `generateName`.
    fn suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (0..5)
            .map(|_| ALPHABET[(self.next() % ALPHABET.len() as u64) as usize] as char)
            .collect()
    }
}

/// The store. See the module docs.
pub struct Store {
    rv: u64,
    /// History covers revisions after this one; resuming from an older one is `410 Gone`.
    compacted: u64,
    history_limit: usize,
    objects: BTreeMap<ObjKey, Stored>,
    history: VecDeque<Arc<Record>>,
    types: BTreeMap<(String, String), ResourceType>,
    events: broadcast::Sender<Arc<Record>>,
    rng: Rng,
}

impl Store {
    /// A store with the built-in types and the namespaces every cluster has.
    pub fn new(history_limit: usize, events: broadcast::Sender<Arc<Record>>) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x1234_5678);
        let mut s = Self {
            rv: 0,
            compacted: 0,
            history_limit: history_limit.max(1),
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            types: BTreeMap::new(),
            events,
            rng: Rng(seed),
        };
        for t in builtin_types() {
            s.types.insert((t.group.clone(), t.plural.clone()), t);
        }
        let ns_type = s.types[&(String::new(), "namespaces".to_string())].clone();
        let ctx = WriteCtx {
            manager: "kube-apiserver".into(),
            dry_run: false,
            validation: FieldCheck::new(Directive::Strict),
            caller: None,
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let body = json!({"metadata": {"name": ns}});
            // Creating the well-known namespaces in an empty store cannot fail.
            let _ = s.create(&ns_type, "v1", None, body, &ctx);
        }
        s
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    pub fn compacted_revision(&self) -> u64 {
        self.compacted
    }

    /// All served types.
    pub fn types(&self) -> impl Iterator<Item = &ResourceType> {
        self.types.values()
    }

    /// Finds the type served at `group/version` under `plural`.
    pub fn find_type(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceType> {
        self.types
            .get(&(group.to_string(), plural.to_string()))
            .filter(|t| t.serves(version))
    }

    /// Forgets all history and advances the revision, so that every resourceVersion a client
    /// holds is now too old: resumes and exact lists answer `410 Gone`.
    pub fn compact(&mut self) {
        self.rv += 1;
        self.compacted = self.rv;
        self.history.clear();
    }

    fn key(rt: &ResourceType, ns: Option<&str>, name: &str) -> ObjKey {
        ObjKey {
            group: rt.storage_group().to_string(),
            resource: rt.storage_resource().to_string(),
            namespace: if rt.namespaced {
                ns.unwrap_or_default().to_string()
            } else {
                String::new()
            },
            name: name.to_string(),
        }
    }

    /// The object as served at `version` (converted when `rt` is a view, see `views`).
    pub(crate) fn output(rt: &ResourceType, version: &str, v: &Value) -> Value {
        let mut out = views::to_view(rt, v);
        if let Some(o) = out.as_object_mut() {
            o.insert("apiVersion".into(), json!(rt.api_version(version)));
            o.insert("kind".into(), json!(rt.kind));
        }
        out
    }

    /// `object` frozen for the store, or the error the real server gives when it is
    /// larger than etcd stores ([`MAX_STORED_BYTES`]). Custom resources are stored as
    /// JSON, so their JSON size is what counts; built-in types are stored as protobuf,
    /// a little smaller, which this ignores.
    fn freeze_for_storage(object: &Value) -> ApiResult<Frozen> {
        let frozen = Frozen::new(object);
        if frozen.json_len() > MAX_STORED_BYTES {
            // The API server passes etcd's refusal on as an internal error
            // (kubernetes/kubernetes#112152 is still open).
            return Err(ApiError::internal("etcdserver: request is too large"));
        }
        Ok(frozen)
    }

    /// Records a change in the history and sends it to the watches. Returns the object
    /// frozen, for the store to keep: the record and the store share it.
    fn commit(
        &mut self,
        etype: EventType,
        key: ObjKey,
        object: Frozen,
        prev: Option<Frozen>,
    ) -> Frozen {
        let rec = Arc::new(Record {
            rv: self.rv,
            etype,
            key,
            object: object.clone(),
            prev,
        });
        self.history.push_back(rec.clone());
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
        // No receivers is fine: nobody is watching.
        let _ = self.events.send(rec);
        object
    }

    fn check_type_meta(rt: &ResourceType, version: &str, body: &Value) -> ApiResult<()> {
        if let Some(av) = body.get("apiVersion").and_then(Value::as_str)
            && !av.is_empty()
            && av != rt.api_version(version)
        {
            // Another served version of the same resource is accepted.
            let ok = rt.versions.iter().any(|v| rt.api_version(v) == av);
            if !ok {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({av}) does not match the expected API version ({})",
                    rt.api_version(version)
                )));
            }
        }
        if let Some(k) = body.get("kind").and_then(Value::as_str)
            && !k.is_empty()
            && k != rt.kind
        {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                rt.kind
            )));
        }
        Ok(())
    }

    fn check_namespace_open(&self, ns: &str) -> ApiResult<()> {
        let key = ObjKey {
            group: String::new(),
            resource: "namespaces".into(),
            namespace: String::new(),
            name: ns.to_string(),
        };
        match self.objects.get(&key) {
            None => Err(ApiError::not_found(
                Qualified {
                    group: "",
                    resource: "namespaces",
                },
                ns,
            )),
            Some(s)
                if meta(&s.value.thaw()).is_some_and(|m| m.contains_key("deletionTimestamp")) =>
            {
                Err(ApiError::forbidden(format!(
                    "unable to create new content in namespace {ns} because it is being terminated"
                )))
            }
            Some(_) => Ok(()),
        }
    }

    /// Kind-specific changes the real server makes on every write.
    fn normalize(rt: &ResourceType, v: &mut Value) -> ApiResult<()> {
        if rt.group.is_empty() && rt.plural == "secrets" {
            // `stringData` is write-only: merged into `data`, base64-encoded.
            if let Some(Value::Object(sd)) = v.as_object_mut().and_then(|o| o.remove("stringData"))
            {
                let o = v.as_object_mut().expect("checked above");
                let data = o.entry("data").or_insert_with(|| json!({}));
                if let Some(d) = data.as_object_mut() {
                    for (k, val) in sd {
                        let text = val.as_str().unwrap_or_default();
                        d.insert(
                            k,
                            json!(base64::engine::general_purpose::STANDARD.encode(text)),
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// The kind's own validation (the real server's `pkg/apis/<group>/validation`),
    /// for the kinds the emulator knows the rules of: `422 Invalid` with one cause
    /// per problem, before admission, as the real server orders them.
    fn validate_kind(rt: &ResourceType, name: &str, v: &Value) -> ApiResult<()> {
        let problems = match (rt.group.as_str(), rt.plural.as_str()) {
            ("resource.k8s.io", "resourceslices") => resource_slice::validate(v),
            _ => return Ok(()),
        };
        if problems.is_empty() {
            return Ok(());
        }
        let causes = problems
            .into_iter()
            .map(|(field, message)| Cause {
                reason: resource_slice::cause_reason(&message).into(),
                message,
                field: Some(field),
            })
            .collect();
        Err(ApiError::invalid(&rt.kind, &rt.group, name, causes))
    }

    fn is_claim(rt: &ResourceType) -> bool {
        rt.group == "resource.k8s.io" && rt.plural == "resourceclaims"
    }

    /// The stored RBAC objects, for the checks the server makes inside a
    /// write and, when on, of requests.
    pub(crate) fn rbac_policy(&self) -> rbac::Policy {
        let mut p = rbac::Policy::default();
        for (k, o) in &self.objects {
            if k.group != "rbac.authorization.k8s.io" {
                continue;
            }
            let list = match k.resource.as_str() {
                "roles" => &mut p.roles,
                "clusterroles" => &mut p.cluster_roles,
                "rolebindings" => &mut p.role_bindings,
                "clusterrolebindings" => &mut p.cluster_role_bindings,
                _ => continue,
            };
            list.push(o.value.thaw());
        }
        p
    }

    /// A ResourceClaim status write's validation and the granular
    /// authorization of what it changes ([`resource_claim`]): one `422 Invalid`
    /// with a cause per problem, as the strategy's `ValidateUpdate` answers.
    /// The emulator's own writes (no caller) are not authorized.
    fn check_claim_status(
        &self,
        rt: &ResourceType,
        key: &ObjKey,
        new: &Value,
        old: &Value,
        ctx: &WriteCtx,
        verb: &str,
    ) -> ApiResult<()> {
        let mut causes: Vec<Cause> = resource_claim::validate_status(new)
            .into_iter()
            .map(|(field, message)| Cause {
                reason: resource_slice::cause_reason(&message).into(),
                message,
                field: Some(field),
            })
            .collect();
        if let Some(caller) = &ctx.caller {
            let needs =
                resource_claim::status_authorization(new, old, &caller.user, verb, &key.namespace);
            if !needs.is_empty() {
                let policy = self.rbac_policy();
                for need in needs {
                    if !need
                        .attempts
                        .iter()
                        .any(|a| rbac::allows(&policy, &caller.user, a))
                    {
                        causes.push(Cause {
                            reason: "FieldValueForbidden".into(),
                            message: format!("Forbidden: {}", need.message),
                            field: Some(need.field.into()),
                        });
                    }
                }
            }
        }
        if causes.is_empty() {
            return Ok(());
        }
        Err(ApiError::invalid(&rt.kind, &rt.group, &key.name, causes))
    }

    /// `GET` one object.
    pub fn get(
        &self,
        rt: &ResourceType,
        version: &str,
        ns: Option<&str>,
        name: &str,
    ) -> ApiResult<Value> {
        let key = Self::key(rt, ns, name);
        self.objects
            .get(&key)
            .map(|s| Self::output(rt, version, &s.value.thaw()))
            .ok_or_else(|| ApiError::not_found(q(rt), name))
    }

    /// `POST` a new object. `owners` is set when the write is a server-side apply.
    pub fn create(
        &mut self,
        rt: &ResourceType,
        version: &str,
        ns: Option<&str>,
        body: Value,
        ctx: &WriteCtx,
    ) -> ApiResult<Value> {
        self.create_inner(rt, version, ns, body, ctx, None)
    }

    fn create_inner(
        &mut self,
        rt: &ResourceType,
        version: &str,
        ns: Option<&str>,
        body: Value,
        ctx: &WriteCtx,
        apply_owner: Option<(ManagerKey, bool)>,
    ) -> ApiResult<Value> {
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request is not a JSON object",
            ));
        }
        Self::check_type_meta(rt, version, &body)?;
        // Server-side apply checked its configuration already (see `apply`).
        let body = match apply_owner {
            None => ctx.validation.check(rt, version, body, Origin::Body)?,
            Some(_) => body,
        };
        let mut body = views::to_storage(rt, &body);
        let given_name = meta_str(&body, "name").unwrap_or("").to_string();
        let generate = meta_str(&body, "generateName").unwrap_or("").to_string();
        if given_name.is_empty() && generate.is_empty() {
            return Err(invalid_one(
                rt,
                "",
                "FieldValueRequired",
                "metadata.name",
                "Required value: name or generateName is required",
            ));
        }
        // Namespace: from the URL, and the body must agree.
        let namespace = if rt.namespaced {
            let url_ns = ns.unwrap_or_default();
            if let Some(bns) = meta_str(&body, "namespace")
                && !bns.is_empty()
                && bns != url_ns
            {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            self.check_namespace_open(url_ns)?;
            Some(url_ns.to_string())
        } else {
            None
        };
        let mut name = given_name.clone();
        if name.is_empty() {
            let prefix: String = generate.chars().take(253 - 5).collect();
            for _ in 0..8 {
                name = format!("{prefix}{}", self.rng.suffix());
                if !self
                    .objects
                    .contains_key(&Self::key(rt, namespace.as_deref(), &name))
                {
                    break;
                }
            }
        }
        if !valid_name(&name) {
            return Err(invalid_one(
                rt,
                &name,
                "FieldValueInvalid",
                "metadata.name",
                format!(
                    "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case \
                     alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
                ),
            ));
        }
        let key = Self::key(rt, namespace.as_deref(), &name);

        // Kind-specific defaults and validation.
        let is_core = rt.group.is_empty();
        if rt.status && !(is_core && rt.plural == "nodes") {
            // The status subresource owns status: creates start without one.
            if let Some(o) = body.as_object_mut() {
                o.remove("status");
            }
        }
        if is_core && rt.plural == "pods" {
            body["status"] = json!({"phase": "Pending"});
        }
        if is_core && rt.plural == "namespaces" {
            body["status"] = json!({"phase": "Active"});
            body["spec"] = json!({"finalizers": ["kubernetes"]});
            let labels = meta_mut(&mut body)
                .entry("labels")
                .or_insert_with(|| json!({}));
            if let Some(l) = labels.as_object_mut() {
                l.insert("kubernetes.io/metadata.name".into(), json!(name));
            }
        }
        let crd_type =
            if rt.group == "apiextensions.k8s.io" && rt.plural == "customresourcedefinitions" {
                let mut probe = body.clone();
                meta_mut(&mut probe).insert("name".into(), json!(name));
                let t = type_from_crd(&probe).map_err(|problems| crd_invalid(&name, problems))?;
                if let Some(existing) = self.types.get(&(t.group.clone(), t.plural.clone()))
                    && !existing.custom
                {
                    return Err(crd_invalid(
                        &name,
                        vec![(
                            "spec.names.plural".into(),
                            "is already served by a built-in type".into(),
                        )],
                    ));
                }
                body["status"] = crd_status(&body, &t);
                Some(t)
            } else {
                None
            };
        Self::normalize(rt, &mut body)?;
        Self::validate_kind(rt, &name, &body)?;

        let now = now();
        let uid = self.rng.uid();
        // As the real server does, a create that states its managedFields
        // (a restore, or a fixture of what other writers did) keeps them.
        let stated_owners = match apply_owner {
            None => body
                .pointer("/metadata/managedFields")
                .and_then(Ownership::parse),
            Some(_) => None,
        };
        {
            let m = meta_mut(&mut body);
            m.insert("name".into(), json!(name));
            match &namespace {
                Some(n) => m.insert("namespace".into(), json!(n)),
                None => m.remove("namespace"),
            };
            m.insert("uid".into(), json!(uid));
            m.insert("creationTimestamp".into(), json!(now));
            if rt.generation {
                m.insert("generation".into(), json!(1));
            } else {
                m.remove("generation");
            }
            for f in [
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "selfLink",
                "managedFields",
                "resourceVersion",
            ] {
                m.remove(f);
            }
        }
        let obj = body.as_object_mut().expect("checked above");
        obj.insert("apiVersion".into(), json!(rt.api_version(version)));
        obj.insert("kind".into(), json!(rt.kind));

        let mut owners = Ownership::default();
        let api_version = rt.api_version(version);
        match (apply_owner, stated_owners) {
            (Some((key, force)), _) => {
                let leaves = fields::owned_leaves(&body, rt, key.scope);
                owners.record_apply(key, &leaves, force, &api_version, &now);
            }
            (None, Some(stated)) => owners = stated,
            (None, None) => {
                let leaves = fields::owned_leaves(&body, rt, Scope::Main);
                owners.record_update(
                    ManagerKey {
                        manager: ctx.manager.clone(),
                        operation: Operation::Update,
                        scope: Scope::Main,
                    },
                    &BTreeMap::new(),
                    &leaves,
                    &api_version,
                    &now,
                );
            }
        }
        if !owners.0.is_empty() {
            meta_mut(&mut body).insert("managedFields".into(), owners.render());
        }
        // Admission sees the object as it would be stored, and comes before
        // the storage's own refusal of a second object of the name.
        let target = Target {
            name: &given_name,
            namespace: namespace.as_deref().unwrap_or_default(),
            ..Self::target(rt, version, Scope::Main, Op::Create)
        };
        self.admit(
            ctx.caller.as_ref(),
            &target,
            Some((rt, version)),
            Some(&body),
            None,
        )?;
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(q(rt), &name));
        }
        if ctx.dry_run {
            return Ok(Self::output(rt, version, &body));
        }
        meta_mut(&mut body).insert("resourceVersion".into(), json!((self.rv + 1).to_string()));
        let frozen = Self::freeze_for_storage(&body)?;
        self.rv += 1;
        let value = self.commit(EventType::Added, key.clone(), frozen, None);
        self.objects.insert(key, Stored { value, owners });
        if let Some(t) = crd_type {
            self.types.insert((t.group.clone(), t.plural.clone()), t);
        }
        Ok(Self::output(rt, version, &body))
    }

    /// `PUT` an object (or its status).
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &mut self,
        rt: &ResourceType,
        version: &str,
        ns: Option<&str>,
        name: &str,
        scope: Scope,
        body: Value,
        ctx: &WriteCtx,
    ) -> ApiResult<Value> {
        let key = Self::key(rt, ns, name);
        let Some(old) = self.objects.get(&key).map(Stored::thaw) else {
            return Err(ApiError::not_found(q(rt), name));
        };
        let owner = ManagerKey {
            manager: ctx.manager.clone(),
            operation: Operation::Update,
            scope,
        };
        Self::check_type_meta(rt, version, &body)?;
        let body = ctx.validation.check(rt, version, body, Origin::Body)?;
        let body = views::to_storage(rt, &body);
        self.finish_update(
            rt,
            version,
            key,
            old,
            body,
            scope,
            OwnerChange::Update(owner),
            ctx,
            "update",
        )
    }

    /// `PATCH` with a JSON merge, JSON or strategic merge patch.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        rt: &ResourceType,
        version: &str,
        ns: Option<&str>,
        name: &str,
        scope: Scope,
        kind: PatchKind,
        body: &[u8],
        ctx: &WriteCtx,
    ) -> ApiResult<Value> {
        let key = Self::key(rt, ns, name);
        let Some(old) = self.objects.get(&key).map(Stored::thaw) else {
            return Err(ApiError::not_found(q(rt), name));
        };
        let base = Self::output(rt, version, &old.value);
        let mut strategic = None;
        let candidate = match kind {
            PatchKind::Merge => {
                let p: Value = serde_json::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
                let mut c = base;
                json_patch::merge(&mut c, &p);
                c
            }
            PatchKind::Json => {
                let ops: json_patch::Patch = serde_json::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
                let mut c = base;
                json_patch::patch(&mut c, &ops).map_err(|e| {
                    ApiError::new(
                        422,
                        "Invalid",
                        format!(
                            "the server rejected our request due to an error in our request: {e}"
                        ),
                    )
                })?;
                c
            }
            PatchKind::Strategic => {
                if rt.custom {
                    return Err(ApiError::unsupported_media_type(
                        "the body of the request was in an unknown format - accepted media types include: \
                         application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                    ));
                }
                let p: Value = serde_json::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
                let lookup = |path: &[String]| rt.strategic_list_type(path);
                let merged = patch::strategic_merge(&base, &p, &lookup).map_err(|e| {
                    ApiError::new(
                        422,
                        "Invalid",
                        format!(
                            "the server rejected our request due to an error in our request: {e}"
                        ),
                    )
                })?;
                strategic = Some(p);
                merged
            }
        };
        // The patched object is what field validation checks, as on the real server.
        let origin = match &strategic {
            Some(p) => Origin::StrategicPatch(p),
            None => Origin::JsonPatch,
        };
        let candidate = ctx.validation.check(rt, version, candidate, origin)?;
        let owner = ManagerKey {
            manager: ctx.manager.clone(),
            operation: Operation::Update,
            scope,
        };
        // Patches apply to the object as this type serves it.
        let candidate = views::to_storage(rt, &candidate);
        self.finish_update(
            rt,
            version,
            key,
            old,
            candidate,
            scope,
            OwnerChange::Update(owner),
            ctx,
            "patch",
        )
    }

    /// Server-side apply (`application/apply-patch+yaml`). Creates the object when missing.
    #[allow(clippy::too_many_arguments)]
    pub fn apply(
        &mut self,
        rt: &ResourceType,
        version: &str,
        ns: Option<&str>,
        name: &str,
        scope: Scope,
        applied: Value,
        force: bool,
        ctx: &WriteCtx,
    ) -> ApiResult<Value> {
        if !applied.is_object() {
            return Err(ApiError::bad_request("apply patch must be an object"));
        }
        for f in ["apiVersion", "kind"] {
            if applied
                .get(f)
                .and_then(Value::as_str)
                .unwrap_or("")
                .is_empty()
            {
                return Err(ApiError::bad_request(format!(
                    "{f} must be set in an apply patch"
                )));
            }
        }
        Self::check_type_meta(rt, version, &applied)?;
        if let Some(n) = meta_str(&applied, "name")
            && !n.is_empty()
            && n != name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        validation::check_apply(rt, version, ns, name, &applied)?;
        // An apply configuration names fields as this type serves them; ownership is kept
        // in the stored form.
        let applied = views::to_storage(rt, &applied);
        let applier = ManagerKey {
            manager: ctx.manager.clone(),
            operation: Operation::Apply,
            scope,
        };
        let key = Self::key(rt, ns, name);
        let Some(old) = self.objects.get(&key).map(Stored::thaw) else {
            if scope == Scope::Status {
                return Err(ApiError::not_found(q(rt), name));
            }
            let mut body = strip_nulls(&applied);
            meta_mut(&mut body).insert("name".into(), json!(name));
            return self.create_inner(rt, version, ns, body, ctx, Some((applier, force)));
        };
        let applied_leaves = fields::owned_leaves(&applied, rt, scope);
        let live_leaves = fields::owned_leaves(&old.value, rt, scope);
        if !force {
            let conflicts = old
                .owners
                .apply_conflicts(&applier, &applied_leaves, &live_leaves);
            if !conflicts.is_empty() {
                return Err(apply_conflict_error(rt, name, &conflicts));
            }
        }
        let mut candidate = old.value.clone();
        for p in old.owners.fields_to_remove(&applier, &applied_leaves) {
            fields::remove_path(&mut candidate, &p);
        }
        // Only the parts of the applied config a manager can own are merged in.
        let mut scoped = Map::new();
        for (k, v) in applied.as_object().expect("checked above") {
            match (scope, k.as_str()) {
                (_, "apiVersion" | "kind") => {}
                (Scope::Status, "status") => {
                    scoped.insert(k.clone(), v.clone());
                }
                (Scope::Status, _) => {}
                (Scope::Main, "status") if rt.status => {}
                (Scope::Main, "metadata") => {
                    let mut m = Map::new();
                    if let Some(am) = v.as_object() {
                        for (mk, mv) in am {
                            if matches!(
                                mk.as_str(),
                                "labels" | "annotations" | "finalizers" | "ownerReferences"
                            ) {
                                m.insert(mk.clone(), mv.clone());
                            }
                        }
                    }
                    scoped.insert(k.clone(), Value::Object(m));
                }
                (Scope::Main, _) => {
                    scoped.insert(k.clone(), v.clone());
                }
            }
        }
        let lookup = |path: &[String]| rt.list_type(path);
        patch::apply_merge(
            &mut candidate,
            &Value::Object(scoped),
            &mut Vec::new(),
            &lookup,
        );
        // A resourceVersion in the applied config is a precondition.
        match meta_str(&applied, "resourceVersion") {
            Some(rv) if !rv.is_empty() => {
                meta_mut(&mut candidate).insert("resourceVersion".into(), json!(rv));
            }
            _ => {}
        }
        let mut owners = old.owners.clone();
        owners.record_apply(
            applier,
            &applied_leaves,
            force,
            &rt.api_version(version),
            &now(),
        );
        self.finish_update(
            rt,
            version,
            key,
            old,
            candidate,
            scope,
            OwnerChange::Set(owners),
            ctx,
            "patch",
        )
    }

    /// The shared tail of update, patch and apply.
    #[allow(clippy::too_many_arguments)]
    fn finish_update(
        &mut self,
        rt: &ResourceType,
        version: &str,
        key: ObjKey,
        old: Live,
        candidate: Value,
        scope: Scope,
        owner_change: OwnerChange,
        ctx: &WriteCtx,
        verb: &'static str,
    ) -> ApiResult<Value> {
        if !candidate.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request is not a JSON object",
            ));
        }
        Self::check_type_meta(rt, version, &candidate)?;
        if let Some(n) = meta_str(&candidate, "name")
            && n != key.name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({})",
                key.name
            )));
        }
        if rt.namespaced
            && let Some(n) = meta_str(&candidate, "namespace")
            && !n.is_empty()
            && n != key.namespace
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let old_rv = meta_str(&old.value, "resourceVersion")
            .unwrap_or("")
            .to_string();
        if let Some(rv) = meta_str(&candidate, "resourceVersion")
            && !rv.is_empty()
            && rv != old_rv
        {
            return Err(ApiError::conflict(q(rt), &key.name));
        }

        // Scope rules: main writes keep the old status, status writes change only status.
        let mut new = match scope {
            Scope::Main => {
                let mut n = candidate;
                if rt.status {
                    let o = n.as_object_mut().expect("checked above");
                    match old.value.get("status") {
                        Some(s) => o.insert("status".into(), s.clone()),
                        None => o.remove("status"),
                    };
                }
                n
            }
            Scope::Status => {
                let mut n = old.value.clone();
                let o = n.as_object_mut().expect("stored objects are objects");
                match candidate.get("status") {
                    Some(s) => o.insert("status".into(), s.clone()),
                    None => o.remove("status"),
                };
                n
            }
        };
        Self::normalize(rt, &mut new)?;
        if scope == Scope::Status && Self::is_claim(rt) {
            resource_claim::drop_deallocated_devices(&mut new, &old.value);
            self.check_claim_status(rt, &key, &new, &old.value, ctx, verb)?;
        }
        Self::validate_kind(rt, &key.name, &new)?;

        // System metadata is the server's.
        let old_meta = meta(&old.value).cloned().unwrap_or_default();
        let new_fin = finalizers(&new);
        {
            let m = meta_mut(&mut new);
            for f in [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "generateName",
            ] {
                match old_meta.get(f) {
                    Some(v) => m.insert(f.into(), v.clone()),
                    None => m.remove(f),
                };
            }
            m.remove("managedFields");
            m.remove("selfLink");
            m.insert("resourceVersion".into(), json!(old_rv));
        }
        if old_meta.contains_key("deletionTimestamp") {
            let old_fin = finalizers(&old.value);
            if new_fin.iter().any(|f| !old_fin.contains(f)) {
                return Err(invalid_one(
                    rt,
                    &key.name,
                    "FieldValueForbidden",
                    "metadata.finalizers",
                    "Forbidden: no new finalizers can be added if the object is being deleted",
                ));
            }
        }
        let o = new.as_object_mut().expect("checked above");
        o.insert("apiVersion".into(), json!(rt.api_version(version)));
        o.insert("kind".into(), json!(rt.kind));

        let crd_type =
            if rt.group == "apiextensions.k8s.io" && rt.plural == "customresourcedefinitions" {
                let t = type_from_crd(&new).map_err(|p| crd_invalid(&key.name, p))?;
                let old_group = old.value.pointer("/spec/group");
                let old_plural = old.value.pointer("/spec/names/plural");
                if old_group != new.pointer("/spec/group")
                    || old_plural != new.pointer("/spec/names/plural")
                {
                    return Err(crd_invalid(
                        &key.name,
                        vec![("spec.names.plural".into(), "field is immutable".into())],
                    ));
                }
                if scope == Scope::Main {
                    new["status"] = crd_status(&new, &t);
                }
                Some(t)
            } else {
                None
            };

        if rt.generation && generation_view(&new, rt) != generation_view(&old.value, rt) {
            let g = old_meta
                .get("generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            meta_mut(&mut new).insert("generation".into(), json!(g + 1));
        }

        let now = now();
        let api_version = rt.api_version(version);
        let mut owners = match owner_change {
            OwnerChange::Set(o) => o,
            OwnerChange::Update(mgr) => {
                let mut o = old.owners.clone();
                let before = fields::owned_leaves(&old.value, rt, scope);
                let after = fields::owned_leaves(&new, rt, scope);
                o.record_update(mgr, &before, &after, &api_version, &now);
                o
            }
        };
        let mut all = fields::owned_leaves(&new, rt, Scope::Main);
        all.extend(fields::owned_leaves(&new, rt, Scope::Status));
        owners.prune(&all);

        // Admission judges every update, one that changes nothing too.
        {
            let mut admitted = new.clone();
            if !owners.0.is_empty() {
                meta_mut(&mut admitted).insert("managedFields".into(), owners.render());
            }
            let target = Target {
                name: &key.name,
                namespace: &key.namespace,
                ..Self::target(rt, version, scope, Op::Update)
            };
            self.admit(
                ctx.caller.as_ref(),
                &target,
                Some((rt, version)),
                Some(&admitted),
                Some(&old.value),
            )?;
        }

        // A write that changes nothing is not a write: no new revision, no event.
        if content_view(&new) == content_view(&old.value) && owners == old.owners {
            return Ok(Self::output(rt, version, &old.value));
        }
        if !owners.0.is_empty() {
            meta_mut(&mut new).insert("managedFields".into(), owners.render());
        }
        if ctx.dry_run {
            return Ok(Self::output(rt, version, &new));
        }
        meta_mut(&mut new).insert("resourceVersion".into(), json!((self.rv + 1).to_string()));
        let frozen = Self::freeze_for_storage(&new)?;
        self.rv += 1;
        let terminating = meta(&new).is_some_and(|m| m.contains_key("deletionTimestamp"));
        if terminating && finalizers(&new).is_empty() {
            // The last finalizer is gone: the deletion completes now.
            self.objects.remove(&key);
            self.commit(EventType::Deleted, key.clone(), frozen, Some(old.frozen));
            self.after_removal(rt, &key);
            return Ok(Self::output(rt, version, &new));
        }
        let value = self.commit(EventType::Modified, key.clone(), frozen, Some(old.frozen));
        self.objects.insert(key, Stored { value, owners });
        if let Some(t) = crd_type {
            self.types.insert((t.group.clone(), t.plural.clone()), t);
        }
        Ok(Self::output(rt, version, &new))
    }

    /// `DELETE` one object. Objects with finalizers only get a `deletionTimestamp`.
    pub fn delete(
        &mut self,
        rt: &ResourceType,
        version: &str,
        ns: Option<&str>,
        name: &str,
        opts: &DeleteOpts,
    ) -> ApiResult<Value> {
        let key = Self::key(rt, ns, name);
        let Some(old) = self.objects.get(&key).map(Stored::thaw) else {
            return Err(ApiError::not_found(q(rt), name));
        };
        let uid = meta_str(&old.value, "uid").unwrap_or("");
        if let Some(p) = &opts.uid
            && p != uid
        {
            return Err(ApiError::conflict_msg(
                q(rt),
                name,
                format!("Precondition failed: UID in precondition: {p}, UID in object meta: {uid}"),
            ));
        }
        let rv = meta_str(&old.value, "resourceVersion").unwrap_or("");
        if let Some(p) = &opts.resource_version
            && p != rv
        {
            return Err(ApiError::conflict_msg(
                q(rt),
                name,
                format!(
                    "Precondition failed: ResourceVersion in precondition: {p}, ResourceVersion in object meta: {rv}"
                ),
            ));
        }
        let is_namespace = rt.group.is_empty() && rt.plural == "namespaces";
        if is_namespace && matches!(name, "default" | "kube-system" | "kube-public") {
            return Err(ApiError::forbidden(format!(
                "namespaces \"{name}\" is forbidden: this namespace may not be deleted"
            )));
        }
        let target = Target {
            name,
            namespace: &key.namespace,
            ..Self::target(rt, version, Scope::Main, Op::Delete)
        };
        self.admit(
            opts.caller.as_ref(),
            &target,
            Some((rt, version)),
            None,
            Some(&old.value),
        )?;
        if !finalizers(&old.value).is_empty() || is_namespace {
            if meta(&old.value).is_some_and(|m| m.contains_key("deletionTimestamp")) {
                return Ok(Self::output(rt, version, &old.value));
            }
            let mut new = old.value.clone();
            {
                let m = meta_mut(&mut new);
                m.insert("deletionTimestamp".into(), json!(now()));
                m.insert("deletionGracePeriodSeconds".into(), json!(0));
                if rt.generation {
                    let g = m.get("generation").and_then(Value::as_i64).unwrap_or(1);
                    m.insert("generation".into(), json!(g + 1));
                }
            }
            if is_namespace {
                new["status"] = json!({"phase": "Terminating"});
            }
            if opts.dry_run {
                return Ok(Self::output(rt, version, &new));
            }
            self.rv += 1;
            meta_mut(&mut new).insert("resourceVersion".into(), json!(self.rv.to_string()));
            let value = self.commit(
                EventType::Modified,
                key.clone(),
                Frozen::new(&new),
                Some(old.frozen),
            );
            let owners = old.owners;
            self.objects.insert(key, Stored { value, owners });
            if is_namespace {
                self.terminate_namespace(name);
                // It may be gone already, when nothing in it had finalizers.
                if let Ok(v) = self.get(rt, version, None, name) {
                    return Ok(v);
                }
            }
            return Ok(Self::output(rt, version, &new));
        }
        if opts.dry_run {
            return Ok(Self::output(rt, version, &old.value));
        }
        let out = self.remove_now(&key, &old.value, old.frozen);
        self.after_removal(rt, &key);
        Ok(Self::output(rt, version, &out))
    }

    /// Removes an object at a new revision and records the DELETED event.
    fn remove_now(&mut self, key: &ObjKey, last: &Value, last_frozen: Frozen) -> Value {
        self.objects.remove(key);
        self.rv += 1;
        let mut fin = last.clone();
        meta_mut(&mut fin).insert("resourceVersion".into(), json!(self.rv.to_string()));
        self.commit(
            EventType::Deleted,
            key.clone(),
            Frozen::new(&fin),
            Some(last_frozen),
        );
        fin
    }

    /// What follows an object's removal: a deleted CRD stops being served (and its objects
    /// go); a terminating namespace that became empty goes.
    fn after_removal(&mut self, rt: &ResourceType, key: &ObjKey) {
        if rt.group == "apiextensions.k8s.io" && rt.plural == "customresourcedefinitions" {
            let found = self
                .types
                .iter()
                .find(|(_, t)| t.custom && format!("{}.{}", t.plural, t.group) == key.name)
                .map(|(k, _)| k.clone());
            if let Some(gr) = found {
                let keys: Vec<ObjKey> = self
                    .objects
                    .keys()
                    .filter(|k| k.group == gr.0 && k.resource == gr.1)
                    .cloned()
                    .collect();
                for k in keys {
                    if let Some(s) = self.objects.get(&k).map(Stored::thaw) {
                        self.remove_now(&k, &s.value, s.frozen);
                    }
                }
                self.types.remove(&gr);
            }
        }
        if !key.namespace.is_empty() {
            self.finish_namespace_if_empty(&key.namespace.clone());
        }
    }

    fn terminate_namespace(&mut self, ns: &str) {
        let keys: Vec<ObjKey> = self
            .objects
            .keys()
            .filter(|k| k.namespace == ns)
            .cloned()
            .collect();
        for k in keys {
            let Some(rt) = self
                .types
                .get(&(k.group.clone(), k.resource.clone()))
                .cloned()
            else {
                continue;
            };
            let version = rt.preferred_version().to_string();
            // Objects with finalizers stay (terminating) until those are removed.
            let _ = self.delete(&rt, &version, Some(ns), &k.name, &DeleteOpts::default());
        }
        self.finish_namespace_if_empty(ns);
    }

    fn finish_namespace_if_empty(&mut self, ns: &str) {
        let key = ObjKey {
            group: String::new(),
            resource: "namespaces".into(),
            namespace: String::new(),
            name: ns.to_string(),
        };
        let Some(s) = self.objects.get(&key).map(Stored::thaw) else {
            return;
        };
        let terminating = meta(&s.value).is_some_and(|m| m.contains_key("deletionTimestamp"));
        if !terminating || !finalizers(&s.value).is_empty() {
            return;
        }
        if self.objects.keys().any(|k| k.namespace == ns) {
            return;
        }
        self.remove_now(&key, &s.value, s.frozen);
    }

    /// Objects of one resource as they were at revision `at`, rebuilt from the history, in
    /// key order. Borrowed and frozen: a page of a list of 100,000 Nodes thaws its own
    /// items only.
    fn snapshot(&self, rt: &ResourceType, at: u64) -> Vec<(&ObjKey, &Frozen)> {
        let (group, resource) = (rt.storage_group(), rt.storage_resource());
        // Each object changed after `at`, as it was then (None: it did not exist). The
        // oldest change after `at` says, so later ones are overwritten walking back.
        let mut then: BTreeMap<&ObjKey, Option<&Frozen>> = BTreeMap::new();
        for rec in self.history.iter().rev().take_while(|r| r.rv > at) {
            if rec.key.group == group && rec.key.resource == resource {
                let before = match rec.etype {
                    EventType::Added => None,
                    EventType::Modified | EventType::Deleted => rec.prev.as_ref(),
                };
                then.insert(&rec.key, before);
            }
        }
        let first = ObjKey {
            group: group.to_string(),
            resource: resource.to_string(),
            namespace: String::new(),
            name: String::new(),
        };
        let mut objects: Vec<(&ObjKey, &Frozen)> = self
            .objects
            .range(first..)
            .take_while(|(k, _)| k.group == group && k.resource == resource)
            .filter(|(k, _)| !then.contains_key(k))
            .map(|(k, s)| (k, &s.value))
            .collect();
        if !then.is_empty() {
            objects.extend(then.into_iter().filter_map(|(k, v)| Some((k, v?))));
            objects.sort_by(|a, b| a.0.cmp(b.0));
        }
        objects
    }

    fn check_fields(rt: &ResourceType, field: &FieldSelector) -> ApiResult<()> {
        for r in &field.0 {
            if !rt.supports_field(&r.field) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {}",
                    r.field
                )));
            }
        }
        Ok(())
    }

    fn too_large(rv: u64, current: u64) -> ApiError {
        let mut e = ApiError::new(
            504,
            "Timeout",
            format!("Too large resource version: {rv}, current: {current}"),
        );
        e.details.causes.push(Cause {
            reason: "ResourceVersionTooLarge".into(),
            message: "Too large resource version".into(),
            field: None,
        });
        e.details.retry_after_seconds = Some(1);
        e
    }

    /// `LIST` (one namespace, or all when `ns` is `None`).
    pub fn list(
        &self,
        rt: &ResourceType,
        version: &str,
        ns: Option<&str>,
        opts: &ListOpts,
    ) -> ApiResult<Value> {
        Self::check_fields(rt, &opts.field)?;
        // Continue after this (namespace, name); compared as a pair, the order of the store.
        let mut start_after: Option<(String, String)> = None;
        let at = if let Some(token) = opts.continue_token.as_deref().filter(|t| !t.is_empty()) {
            let (rv, start) = decode_continue(token)?;
            if rv < self.compacted {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. \
                     You can start a new list without the continue parameter.",
                ));
            }
            let (sns, sname) = start.split_once('/').unwrap_or(("", start.as_str()));
            start_after = Some((sns.to_string(), sname.to_string()));
            rv
        } else {
            let rv = opts.resource_version.as_deref().filter(|s| !s.is_empty());
            match (
                rv,
                opts.resource_version_match
                    .as_deref()
                    .filter(|s| !s.is_empty()),
            ) {
                (None, None) => self.rv,
                (None, Some(_)) => {
                    return Err(ApiError::new(
                        422,
                        "Invalid",
                        "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: \
                         resourceVersionMatch is forbidden unless resourceVersion is provided",
                    ));
                }
                (Some(rv), Some("Exact")) => {
                    let n = parse_rv(rv)?;
                    if n == 0 {
                        return Err(ApiError::new(
                            422,
                            "Invalid",
                            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: \
                             resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                        ));
                    }
                    if n > self.rv {
                        return Err(Self::too_large(n, self.rv));
                    }
                    if n < self.compacted {
                        return Err(ApiError::expired(format!(
                            "The resourceVersion for the provided list is too old. Requested {n}, oldest available {}",
                            self.compacted
                        )));
                    }
                    n
                }
                (Some(rv), Some("NotOlderThan") | None) => {
                    let n = parse_rv(rv)?;
                    if n > self.rv {
                        return Err(Self::too_large(n, self.rv));
                    }
                    self.rv
                }
                (Some(_), Some(other)) => {
                    return Err(ApiError::new(
                        422,
                        "Invalid",
                        format!(
                            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Unsupported value: \"{other}\""
                        ),
                    ));
                }
            }
        };
        let snap = if at == self.rv {
            self.snapshot(rt, u64::MAX)
        } else {
            self.snapshot(rt, at)
        };
        let position = |k: &ObjKey| format!("{}/{}", k.namespace, k.name);
        // Without selectors, only the page's items are thawed.
        let selects_all = opts.label.is_empty() && opts.field.is_empty();
        let matching: Vec<(&ObjKey, &Frozen)> = snap
            .into_iter()
            .filter(|(k, v)| {
                ns.is_none_or(|n| k.namespace == n)
                    && start_after
                        .as_ref()
                        .is_none_or(|(sns, sname)| (&k.namespace, &k.name) > (sns, sname))
                    && (selects_all || {
                        let v = v.thaw();
                        opts.label.matches_object(&v) && opts.field.matches(&v)
                    })
            })
            .collect();
        let take = opts
            .limit
            .filter(|l| *l > 0)
            .map_or(matching.len(), |l| l.min(matching.len()));
        let items: Vec<Value> = matching[..take]
            .iter()
            .map(|(_, v)| Self::output(rt, version, &v.thaw()))
            .collect();
        let remaining = matching.len() - take;
        let last_key = take.checked_sub(1).map(|i| position(matching[i].0));
        let mut list_meta = json!({"resourceVersion": at.to_string()});
        if remaining > 0
            && let Some(last) = &last_key
        {
            list_meta["continue"] = json!(encode_continue(at, last));
            if opts.label.is_empty() && opts.field.is_empty() {
                list_meta["remainingItemCount"] = json!(remaining);
            }
        }
        Ok(json!({
            "kind": rt.list_kind,
            "apiVersion": rt.api_version(version),
            "metadata": list_meta,
            "items": items,
        }))
    }

    /// `DELETE` on a collection: deletes what a list with the same selectors returns.
    pub fn delete_collection(
        &mut self,
        rt: &ResourceType,
        version: &str,
        ns: Option<&str>,
        opts: &ListOpts,
        del: &DeleteOpts,
    ) -> ApiResult<Value> {
        let listed = self.list(
            rt,
            version,
            ns,
            &ListOpts {
                label: opts.label.clone(),
                field: opts.field.clone(),
                ..Default::default()
            },
        )?;
        let mut deleted = Vec::new();
        for item in listed["items"].as_array().cloned().unwrap_or_default() {
            let name = meta_str(&item, "name").unwrap_or_default().to_string();
            let item_ns = meta_str(&item, "namespace").map(str::to_string);
            let one = DeleteOpts {
                dry_run: del.dry_run,
                caller: del.caller.clone().map(|c| Caller {
                    collection: true,
                    ..c
                }),
                ..Default::default()
            };
            match self.delete(rt, version, item_ns.as_deref(), &name, &one) {
                Ok(v) => deleted.push(v),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(json!({
            "kind": rt.list_kind,
            "apiVersion": rt.api_version(version),
            "metadata": {"resourceVersion": self.rv.to_string()},
            "items": deleted,
        }))
    }

    /// Starts a watch: validates the parameters and collects what to send first, all under
    /// the store lock so that no event falls between the initial part and the live part.
    pub fn watch(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        opts: &WatchOpts,
    ) -> ApiResult<WatchStart> {
        Self::check_fields(rt, &opts.field)?;
        let filter = WatchFilter {
            group: rt.storage_group().to_string(),
            resource: rt.storage_resource().to_string(),
            namespace: ns.map(str::to_string),
            label: opts.label.clone(),
            field: opts.field.clone(),
        };
        let rv_match = opts
            .resource_version_match
            .as_deref()
            .filter(|s| !s.is_empty());
        if opts.send_initial_events {
            if rv_match != Some("NotOlderThan") {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: \
                     sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                ));
            }
            if !opts.bookmarks {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "ListOptions.meta.k8s.io \"\" is invalid: allowWatchBookmarks: Forbidden: \
                     sendInitialEvents requires setting allowWatchBookmarks to true",
                ));
            }
        } else if rv_match.is_some() {
            return Err(ApiError::new(
                422,
                "Invalid",
                "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: \
                 resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            ));
        }
        let rv = opts.resource_version.as_deref().filter(|s| !s.is_empty());
        let current_state = |s: &Self| -> Vec<(EventType, Frozen)> {
            s.objects
                .iter()
                .filter(|(k, st)| {
                    k.group == rt.storage_group()
                        && k.resource == rt.storage_resource()
                        && ns.is_none_or(|n| k.namespace == n)
                        && (filter.selects_all() || filter.matches_obj(&st.value.thaw()))
                })
                .map(|(_, st)| (EventType::Added, st.value.clone()))
                .collect()
        };
        let initial = match rv {
            None | Some("0") => current_state(self),
            Some(_) if opts.send_initial_events => current_state(self),
            Some(s) => {
                let n = parse_rv(s)?;
                if n < self.compacted {
                    return Ok(WatchStart::Expired(ApiError::expired(format!(
                        "too old resource version: {n} ({})",
                        self.compacted
                    ))));
                }
                self.history
                    .iter()
                    .filter(|r| r.rv > n)
                    .filter_map(|r| filter.event_for(r))
                    .collect()
            }
        };
        Ok(WatchStart::Stream {
            initial,
            rx: self.events.subscribe(),
            filter,
            start_rv: self.rv,
            initial_events_end: opts.send_initial_events,
        })
    }

    /// `POST pods/<name>/eviction`: deletes the pod unless a PodDisruptionBudget forbids it.
    ///
    /// Admission judges it as a CREATE of `pods/eviction` (kind `policy/v1`
    /// Eviction) before the pod is looked up; the deletion that follows is
    /// not judged again, as on the real server.
    pub fn evict(
        &mut self,
        ns: &str,
        name: &str,
        body: &Value,
        dry_run: bool,
        caller: Option<&Caller>,
    ) -> ApiResult<Value> {
        let pods = self.types[&(String::new(), "pods".to_string())].clone();
        if let Some(n) = meta_str(body, "name")
            && n != name
        {
            return Err(ApiError::bad_request(format!(
                "name in URL does not match name in Eviction object: {name} != {n}"
            )));
        }
        let target = Target {
            kind: ("policy", "v1", "Eviction"),
            resource: ("", "v1", "pods"),
            sub_resource: "eviction",
            name,
            namespace: ns,
            operation: Op::Create,
        };
        self.admit(caller, &target, None, Some(body), None)?;
        let pod = self.get(&pods, "v1", Some(ns), name)?;
        let del = DeleteOpts::from_body(body.get("deleteOptions").unwrap_or(&Value::Null), dry_run);
        let phase = pod
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("");
        let terminating = meta(&pod).is_some_and(|m| m.contains_key("deletionTimestamp"));
        if !(terminating || matches!(phase, "Succeeded" | "Failed" | "Pending")) {
            self.check_disruption_budget(ns, &pod)?;
        }
        self.delete(&pods, "v1", Some(ns), name, &del)?;
        Ok(json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "code": 201,
        }))
    }

    /// What a write of `rt` at `version` is to, for admission (name and
    /// namespace still to be filled in).
    fn target<'a>(
        rt: &'a ResourceType,
        version: &'a str,
        scope: Scope,
        operation: Op,
    ) -> Target<'a> {
        Target {
            kind: (&rt.group, version, &rt.kind),
            resource: (&rt.group, version, &rt.plural),
            sub_resource: match scope {
                Scope::Main => "",
                Scope::Status => "status",
            },
            name: "",
            namespace: "",
            operation,
        }
    }

    /// Judges one write by every ValidatingAdmissionPolicy and each of its
    /// bindings (by name), as the API server's policy plugin does; the first
    /// refusal is the answer. `object` and `old` are stored objects when
    /// `served` names their type (they are judged as served at that
    /// version), else as given. No caller: the emulator's own write.
    fn admit(
        &self,
        caller: Option<&Caller>,
        target: &Target<'_>,
        served: Option<(&ResourceType, &str)>,
        object: Option<&Value>,
        old: Option<&Value>,
    ) -> ApiResult<()> {
        let Some(caller) = caller else {
            return Ok(());
        };
        let bound = self.bound_policies();
        if bound.is_empty() {
            return Ok(());
        }
        let convert = |v: Option<&Value>| {
            v.map(|v| match served {
                Some((rt, version)) => Self::output(rt, version, v),
                None => v.clone(),
            })
        };
        let object = convert(object);
        let old = convert(old);
        let mut target = target.clone();
        // The API server gives a Namespace's requests (other than its
        // create) the namespace of its own name.
        if target.kind == ("", "v1", "Namespace") && target.operation != Op::Create {
            target.namespace = target.name;
        }
        let request = target.request(caller, object.as_ref(), old.as_ref());
        let namespace = self.namespace_object(target.namespace);
        for (policy, bindings) in &bound {
            for binding in bindings {
                let lookup = self.param_for(policy, binding, target.namespace);
                let param = match &lookup {
                    Ok(Some(v)) => Param::Found(v),
                    Ok(None) => Param::Missing,
                    Err(e) => Param::Error(e),
                };
                let inputs = admission::Inputs {
                    request: &request,
                    namespace: namespace.as_ref(),
                    param,
                };
                if let Verdict::Denied {
                    code,
                    reason,
                    message,
                    ..
                } = admission::evaluate(policy, binding, &inputs)
                {
                    return Err(Self::denial(
                        &request,
                        object.as_ref(),
                        code,
                        &reason,
                        message,
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every policy with the bindings that name it, by name; objects that do
    /// not decode as their type are skipped.
    fn bound_policies(
        &self,
    ) -> Vec<(
        k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy,
        Vec<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding>,
    )> {
        const GROUP: &str = "admissionregistration.k8s.io";
        let of = |resource: &'static str| {
            let start = ObjKey {
                group: GROUP.into(),
                resource: resource.into(),
                namespace: String::new(),
                name: String::new(),
            };
            self.objects
                .range(start..)
                .take_while(move |(k, _)| k.group == GROUP && k.resource == resource)
                .map(|(k, s)| (k.name.clone(), s.value.thaw()))
        };
        let mut bindings = Vec::new();
        for (name, v) in of("validatingadmissionpolicybindings") {
            match serde_json::from_value::<
                k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding,
            >(v)
            {
                Ok(b) => bindings.push(b),
                Err(e) => tracing::warn!("ValidatingAdmissionPolicyBinding {name} skipped: {e}"),
            }
        }
        if bindings.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (name, v) in of("validatingadmissionpolicies") {
            let policy = match serde_json::from_value::<
                k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy,
            >(v)
            {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!("ValidatingAdmissionPolicy {name} skipped: {e}");
                    continue;
                }
            };
            let mine: Vec<_> = bindings
                .iter()
                .filter(|b| {
                    b.spec.as_ref().and_then(|s| s.policy_name.as_deref()) == Some(name.as_str())
                })
                .cloned()
                .collect();
            if !mine.is_empty() {
                out.push((policy, mine));
            }
        }
        out
    }

    /// The param `binding` names for a request in `request_ns`: the object
    /// as its `paramKind` version serves it, `None` if it does not exist (or
    /// none is needed), or why the binding cannot name one.
    fn param_for(
        &self,
        policy: &k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy,
        binding: &k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding,
        request_ns: &str,
    ) -> Result<Option<Value>, String> {
        let kind = policy.spec.as_ref().and_then(|s| s.param_kind.as_ref());
        let param_ref = binding.spec.as_ref().and_then(|s| s.param_ref.as_ref());
        let (Some(kind), Some(param_ref)) = (kind, param_ref) else {
            return Ok(None);
        };
        let api_version = kind.api_version.as_deref().unwrap_or_default();
        let kind = kind.kind.as_deref().unwrap_or_default();
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let Some(rt) = self
            .types
            .values()
            .find(|t| t.group == group && t.kind == kind && t.serves(version))
        else {
            return Err(format!(
                "paramKind kind `{api_version}, Kind={kind}` not known"
            ));
        };
        let Some(name) = param_ref.name.as_deref().filter(|n| !n.is_empty()) else {
            return Err("paramRef.selector is not supported by kube-emulator".into());
        };
        let given = param_ref.namespace.as_deref().filter(|n| !n.is_empty());
        let namespace = match (rt.namespaced, given) {
            (true, Some(n)) => n,
            (true, None) if !request_ns.is_empty() => request_ns,
            (true, None) => {
                return Err("cannot use namespaced paramRef in policy binding that matches                             cluster-scoped resources"
                    .into());
            }
            (false, Some(_)) => {
                return Err(
                    "paramRef.namespace must not be provided for a cluster-scoped `paramKind`"
                        .into(),
                );
            }
            (false, None) => "",
        };
        Ok(self.get(rt, version, Some(namespace), name).ok())
    }

    /// The Namespace object `name`, if there is one.
    fn namespace_object(&self, name: &str) -> Option<Value> {
        if name.is_empty() {
            return None;
        }
        let key = ObjKey {
            group: String::new(),
            resource: "namespaces".into(),
            namespace: String::new(),
            name: name.to_string(),
        };
        self.objects.get(&key).map(|s| s.value.thaw())
    }

    /// A policy's refusal as the API server answers it: a Forbidden error on
    /// the object, with the policy's code and reason, and its message as the
    /// one cause.
    fn denial(
        request: &Value,
        object: Option<&Value>,
        code: u16,
        reason: &str,
        message: String,
    ) -> ApiError {
        let group = request
            .pointer("/resource/group")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let resource = request
            .pointer("/resource/resource")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let from_object = |field: &str| {
            object
                .and_then(|o| meta_str(o, field))
                .filter(|n| !n.is_empty())
        };
        let name = request
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .or_else(|| from_object("name"))
            .or_else(|| from_object("generateName"))
            .unwrap_or("Unknown");
        let q = Qualified { group, resource };
        let mut e = ApiError::new(
            code,
            reason,
            format!("{q} \"{name}\" is forbidden: {message}"),
        );
        e.details.name = Some(name.to_owned());
        if !group.is_empty() {
            e.details.group = Some(group.to_owned());
        }
        e.details.kind = Some(resource.to_owned());
        e.details.causes.push(Cause {
            reason: String::new(),
            message,
            field: None,
        });
        e
    }

    fn check_disruption_budget(&self, ns: &str, pod: &Value) -> ApiResult<()> {
        let pod_labels = pod.pointer("/metadata/labels").and_then(Value::as_object);
        let pdbs: Vec<Value> = self
            .objects
            .iter()
            .filter(|(k, _)| {
                k.group == "policy" && k.resource == "poddisruptionbudgets" && k.namespace == ns
            })
            .map(|(_, s)| s.value.thaw())
            .filter(|pdb| {
                pdb.pointer("/spec/selector")
                    .and_then(LabelSelector::from_object)
                    .is_some_and(|sel| !sel.is_empty() && sel.matches(pod_labels))
            })
            .collect();
        match pdbs.len() {
            0 => Ok(()),
            1 => {
                let pdb = &pdbs[0];
                let sel = pdb
                    .pointer("/spec/selector")
                    .and_then(LabelSelector::from_object)
                    .unwrap_or_default();
                let covered: Vec<Value> = self
                    .objects
                    .iter()
                    .filter(|(k, _)| {
                        k.group.is_empty() && k.resource == "pods" && k.namespace == ns
                    })
                    .map(|(_, s)| s.value.thaw())
                    .filter(|p| sel.matches_object(p))
                    .filter(|p| !meta(p).is_some_and(|m| m.contains_key("deletionTimestamp")))
                    .collect();
                let expected = covered.len() as i64;
                let healthy = covered.iter().filter(|p| pod_ready(p)).count() as i64;
                let desired = desired_healthy(pdb, expected);
                let pdb_name = meta_str(pdb, "name").unwrap_or_default();
                let this_ready = pod_ready(pod);
                let always_allow_unhealthy = pdb
                    .pointer("/spec/unhealthyPodEvictionPolicy")
                    .and_then(Value::as_str)
                    == Some("AlwaysAllow");
                let allowed = if this_ready {
                    healthy - desired > 0
                } else {
                    always_allow_unhealthy || healthy >= desired
                };
                if allowed {
                    return Ok(());
                }
                let mut e = ApiError::too_many_requests(
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                );
                e.details.causes.push(Cause {
                    reason: "DisruptionBudget".into(),
                    message: format!(
                        "The disruption budget {pdb_name} needs {desired} healthy pods and has {healthy} currently"
                    ),
                    field: None,
                });
                Err(e)
            }
            _ => Err(ApiError::internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            )),
        }
    }
}

/// Which patch format a `PATCH` carries (apply is separate: [`Store::apply`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    Json,
    Strategic,
}

enum OwnerChange {
    Update(ManagerKey),
    Set(Ownership),
}

fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_nulls).collect()),
        other => other.clone(),
    }
}

fn crd_invalid(name: &str, problems: Vec<(String, String)>) -> ApiError {
    ApiError::invalid(
        "CustomResourceDefinition",
        "apiextensions.k8s.io",
        name,
        problems
            .into_iter()
            .map(|(f, m)| Cause {
                reason: "FieldValueInvalid".into(),
                message: m,
                field: Some(f),
            })
            .collect(),
    )
}

/// The status the CRD controllers would write: names accepted, established.
fn crd_status(crd: &Value, t: &ResourceType) -> Value {
    let now = now();
    let mut names = crd
        .pointer("/spec/names")
        .cloned()
        .unwrap_or_else(|| json!({}));
    names["singular"] = json!(t.singular);
    names["listKind"] = json!(t.list_kind);
    let stored = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .and_then(|vs| {
            vs.iter()
                .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        })
        .and_then(|v| v.get("name").cloned())
        .unwrap_or_else(|| json!(t.preferred_version()));
    json!({
        "acceptedNames": names,
        "storedVersions": [stored],
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
             "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
    })
}

fn pod_ready(p: &Value) -> bool {
    p.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
        && p.pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
}

/// How many covered pods a PodDisruptionBudget wants healthy. The real server reads this
/// from the PDB status, written by the disruption controller; the emulator runs no
/// controllers, so it computes it from the spec.
fn desired_healthy(pdb: &Value, expected: i64) -> i64 {
    let scaled = |v: &Value| -> Option<i64> {
        match v {
            Value::Number(n) => n.as_i64(),
            Value::String(s) => {
                let pct: i64 = s.strip_suffix('%')?.parse().ok()?;
                Some((pct * expected + 99) / 100)
            }
            _ => None,
        }
    };
    if let Some(n) = pdb.pointer("/spec/minAvailable").and_then(scaled) {
        return n;
    }
    if let Some(n) = pdb.pointer("/spec/maxUnavailable").and_then(scaled) {
        return (expected - n).max(0);
    }
    0
}

fn apply_conflict_error(rt: &ResourceType, name: &str, conflicts: &[fields::Conflict]) -> ApiError {
    let n = conflicts.len();
    let message = if n == 1 {
        let c = &conflicts[0];
        format!(
            "Apply failed with 1 conflict: conflict with \"{}\" using {}: {}",
            c.manager,
            c.api_version,
            fields::dotted(&c.path)
        )
    } else {
        let lines: Vec<String> = conflicts
            .iter()
            .map(|c| {
                format!(
                    "conflict with \"{}\" using {}: {}",
                    c.manager,
                    c.api_version,
                    fields::dotted(&c.path)
                )
            })
            .collect();
        format!("Apply failed with {n} conflicts: {}", lines.join("\n"))
    };
    let mut e = ApiError::conflict_msg(q(rt), name, message);
    e.details.causes = conflicts
        .iter()
        .map(|c| Cause {
            reason: "FieldManagerConflict".into(),
            message: format!("conflict with \"{}\" using {}", c.manager, c.api_version),
            field: Some(fields::dotted(&c.path)),
        })
        .collect();
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> Store {
        let (tx, _) = broadcast::channel(64);
        Store::new(100, tx)
    }

    fn rt(s: &Store, group: &str, plural: &str) -> ResourceType {
        s.types[&(group.to_string(), plural.to_string())].clone()
    }

    fn ctx(m: &str) -> WriteCtx {
        WriteCtx {
            caller: None,
            manager: m.into(),
            dry_run: false,
            validation: FieldCheck::new(Directive::Strict),
        }
    }

    #[test]
    fn well_known_namespaces_exist() {
        let s = store();
        let ns = rt(&s, "", "namespaces");
        let d = s.get(&ns, "v1", None, "default").unwrap();
        assert_eq!(d["status"]["phase"], "Active");
        assert_eq!(
            d["metadata"]["labels"]["kubernetes.io/metadata.name"],
            "default"
        );
        assert_eq!(s.resource_version(), 4);
    }

    #[test]
    fn an_object_larger_than_etcd_stores_is_refused_and_the_revision_stays() {
        let mut s = store();
        let cm = rt(&s, "", "configmaps");
        let big = "x".repeat(MAX_STORED_BYTES);
        let before = s.resource_version();
        let refused = s
            .create(
                &cm,
                "v1",
                Some("default"),
                json!({"metadata": {"name": "big"}, "data": {"a": big}}),
                &ctx("t"),
            )
            .unwrap_err();
        assert_eq!(
            (refused.code, refused.message.as_str()),
            (500, "etcdserver: request is too large")
        );
        assert_eq!(s.resource_version(), before);
        assert!(s.get(&cm, "v1", Some("default"), "big").is_err());

        // An object that grows past the limit keeps what it had.
        s.create(
            &cm,
            "v1",
            Some("default"),
            json!({"metadata": {"name": "grows"}, "data": {"a": "small"}}),
            &ctx("t"),
        )
        .unwrap();
        let kept = s.resource_version();
        let grown = s
            .update(
                &cm,
                "v1",
                Some("default"),
                "grows",
                Scope::Main,
                json!({"metadata": {"name": "grows"}, "data": {"a": "x".repeat(MAX_STORED_BYTES)}}),
                &ctx("t"),
            )
            .unwrap_err();
        assert_eq!(grown.code, 500);
        assert_eq!(s.resource_version(), kept);
        let read = s.get(&cm, "v1", Some("default"), "grows").unwrap();
        assert_eq!(read["data"]["a"], "small");
    }

    #[test]
    fn create_sets_system_fields_and_rejects_duplicates() {
        let mut s = store();
        let cm = rt(&s, "", "configmaps");
        let out = s
            .create(
                &cm,
                "v1",
                Some("default"),
                json!({"metadata": {"generateName": "cfg-"}, "data": {"a": "b"}}),
                &ctx("t"),
            )
            .unwrap();
        let name = out["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("cfg-") && name.len() == 9);
        assert_eq!(out["metadata"]["uid"].as_str().unwrap().len(), 36);
        assert!(
            out["metadata"].get("generation").is_none(),
            "config maps have no generation"
        );
        assert_eq!(out["metadata"]["resourceVersion"], "5");
        assert_eq!(out["kind"], "ConfigMap");
        let again = s
            .create(
                &cm,
                "v1",
                Some("default"),
                json!({"metadata": {"name": name}}),
                &ctx("t"),
            )
            .unwrap_err();
        assert_eq!((again.code, again.reason.as_str()), (409, "AlreadyExists"));
        let missing_ns = s
            .create(
                &cm,
                "v1",
                Some("nope"),
                json!({"metadata": {"name": "x"}}),
                &ctx("t"),
            )
            .unwrap_err();
        assert_eq!(missing_ns.code, 404);
        let bad = s
            .create(
                &cm,
                "v1",
                Some("default"),
                json!({"metadata": {"name": "Bad_Name"}}),
                &ctx("t"),
            )
            .unwrap_err();
        assert_eq!((bad.code, bad.reason.as_str()), (422, "Invalid"));
    }

    #[test]
    fn a_claims_device_status_is_authorized_per_driver_and_node_and_dropped_on_deallocation() {
        use crate::reviews::UserInfo;
        let mut s = store();
        let as_user = |user: &UserInfo| WriteCtx {
            caller: Some(Caller {
                user: user.clone(),
                dry_run: false,
                field_manager: None,
                field_validation: None,
                delete_options: Value::Null,
                collection: false,
            }),
            ..ctx("gpu-operator-dra")
        };
        let agent = |node: &str| {
            UserInfo::service_account("ops", "agent")
                .with_extra(resource_claim::NODE_NAME_EXTRA, &[node])
        };
        // The agent's grant, as deploy/10-rbac.yaml words it.
        for (plural, obj) in [
            (
                "clusterroles",
                json!({"metadata": {"name": "agent"}, "rules": [
                    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
                     "resourceNames": ["gpu.amd.com"], "verbs": ["associated-node:patch"]}]}),
            ),
            (
                "clusterrolebindings",
                json!({"metadata": {"name": "agent"},
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                   "kind": "ClusterRole", "name": "agent"},
                       "subjects": [{"kind": "ServiceAccount", "name": "agent",
                                     "namespace": "ops"}]}),
            ),
        ] {
            let t = rt(&s, "rbac.authorization.k8s.io", plural);
            s.create(&t, "v1", None, obj, &ctx("t")).unwrap();
        }
        let claims = rt(&s, "resource.k8s.io", "resourceclaims");
        s.create(
            &claims,
            "v1",
            Some("default"),
            json!({"metadata": {"name": "c"}, "spec": {"devices": {}}}),
            &ctx("t"),
        )
        .unwrap();
        let allocation = json!({"devices": {"results": [
                {"request": "r", "driver": "gpu.amd.com", "pool": "n1", "device": "gpu-0"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}});
        let status = |s: &mut Store, status: Value, ctx: &WriteCtx| {
            let body = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                              "metadata": {"name": "c"}, "status": status});
            s.update(
                &claims,
                "v1",
                Some("default"),
                "c",
                Scope::Status,
                body,
                ctx,
            )
        };
        // Allocating needs resourceclaims/binding, which the agent lacks.
        let refused = status(
            &mut s,
            json!({"allocation": allocation}),
            &as_user(&agent("n1")),
        )
        .unwrap_err();
        assert_eq!(
            refused.message,
            "ResourceClaim \"c\" is invalid: status: Forbidden: changing status.allocation or \
             status.reservedFor requires extra permission"
        );
        status(&mut s, json!({"allocation": allocation}), &ctx("scheduler")).unwrap();
        let apply = |s: &mut Store, user: &UserInfo| {
            let body = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "c"}, "status": {"devices": [
                    {"driver": "gpu.amd.com", "pool": "n1", "device": "gpu-0"}]}});
            s.apply(
                &claims,
                "v1",
                Some("default"),
                "c",
                Scope::Status,
                body,
                true,
                &as_user(user),
            )
        };
        // Another node's agent: only arbitrary-node:patch counts, not granted.
        let refused = apply(&mut s, &agent("n2")).unwrap_err();
        assert_eq!(refused.code, 422);
        assert_eq!(
            refused.message,
            "ResourceClaim \"c\" is invalid: status.devices: Forbidden: changing status.devices \
             requires extra permission"
        );
        assert_eq!(refused.details.causes[0].reason, "FieldValueForbidden");
        // The claim's own node's agent: associated-node:patch on gpu.amd.com.
        let written = apply(&mut s, &agent("n1")).unwrap();
        assert_eq!(written["status"]["devices"][0]["device"], "gpu-0");
        // Deallocating takes the entry with it (the scheduler's write: no caller).
        let freed = status(
            &mut s,
            json!({"devices": written["status"]["devices"]}),
            &ctx("s"),
        );
        assert_eq!(freed.unwrap()["status"], json!({}));
    }

    #[test]
    fn resource_slices_are_validated_on_every_write() {
        let mut s = store();
        let slices = rt(&s, "resource.k8s.io", "resourceslices");
        let slice = |version: &str| {
            json!({"metadata": {"name": "n1-gpu.amd.com-0"},
                   "spec": {"driver": "gpu.amd.com", "nodeName": "n1",
                            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                            "devices": [{"name": "gpu-1-128",
                                         "attributes": {"driverVersion": {"version": version}}}]}})
        };
        let bad = s
            .create(&slices, "v1", None, slice("6.19.14.31400000"), &ctx("t"))
            .unwrap_err();
        assert_eq!((bad.code, bad.reason.as_str()), (422, "Invalid"));
        assert_eq!(bad.details.kind.as_deref(), Some("ResourceSlice"));
        assert_eq!(bad.details.causes.len(), 1, "{bad:?}");
        let cause = &bad.details.causes[0];
        assert_eq!(cause.reason, "FieldValueInvalid");
        assert_eq!(
            cause.field.as_deref(),
            Some("spec.devices[0].attributes[driverVersion].version")
        );
        assert!(
            bad.message
                .starts_with("ResourceSlice \"n1-gpu.amd.com-0\" is invalid: spec.devices[0]"),
            "{}",
            bad.message
        );
        assert!(s.get(&slices, "v1", None, "n1-gpu.amd.com-0").is_err());

        let stored = s
            .create(&slices, "v1", None, slice("6.19.14"), &ctx("t"))
            .unwrap();
        let mut changed = stored.clone();
        changed["spec"]["devices"][0]["taints"] =
            json!([{"key": "gpu.amd.com/unhealthy", "effect": "PreferNoSchedule"}]);
        let refused = s
            .update(
                &slices,
                "v1",
                None,
                "n1-gpu.amd.com-0",
                Scope::Main,
                changed,
                &ctx("t"),
            )
            .unwrap_err();
        assert_eq!(refused.code, 422);
        assert_eq!(refused.details.causes[0].reason, "FieldValueNotSupported");
        let kept = s.get(&slices, "v1", None, "n1-gpu.amd.com-0").unwrap();
        assert_eq!(
            kept["metadata"]["resourceVersion"],
            stored["metadata"]["resourceVersion"]
        );
    }

    #[test]
    fn each_driver_applies_its_own_claim_device_status_entries() {
        // ResourceClaim status.devices is a list map keyed by driver, device,
        // pool and (optional) shareID: each driver's apply on /status merges
        // beside the others' entries and removes only its own.
        let mut s = store();
        let claims = rt(&s, "resource.k8s.io", "resourceclaims");
        s.create(
            &claims,
            "v1",
            Some("default"),
            json!({"metadata": {"name": "c"}, "spec": {"devices": {}}}),
            &ctx("t"),
        )
        .unwrap();
        // Entries must name allocated devices, as on the real server.
        let result = |driver: &str, device: &str| json!({"request": "r", "driver": driver, "pool": "n1", "device": device});
        s.update(
            &claims,
            "v1",
            Some("default"),
            "c",
            Scope::Status,
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                   "metadata": {"name": "c"},
                   "status": {"allocation": {"devices": {"results": [
                       result("gpu.amd.com", "gpu-1-128"), result("net.example.com", "eth0")]}}}}),
            &ctx("scheduler"),
        )
        .unwrap();
        let entry = |driver: &str, device: &str, ready: &str| {
            json!({"driver": driver, "pool": "n1", "device": device,
                   "conditions": [{"type": "Ready", "status": ready, "reason": "R", "message": "",
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
        };
        let apply = |s: &mut Store, manager: &str, entries: Value| {
            let body = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                              "metadata": {"name": "c"}, "status": {"devices": entries}});
            s.apply(
                &claims,
                "v1",
                Some("default"),
                "c",
                Scope::Status,
                body,
                true,
                &ctx(manager),
            )
            .unwrap()
        };
        let devices = |v: &Value| -> Vec<(String, String)> {
            v["status"]["devices"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|d| {
                    (
                        d["driver"].as_str().unwrap().to_owned(),
                        d["device"].as_str().unwrap().to_owned(),
                    )
                })
                .collect()
        };
        apply(
            &mut s,
            "gpu",
            json!([entry("gpu.amd.com", "gpu-1-128", "True")]),
        );
        let both = apply(
            &mut s,
            "net",
            json!([entry("net.example.com", "eth0", "True")]),
        );
        assert_eq!(
            devices(&both),
            [("gpu.amd.com", "gpu-1-128"), ("net.example.com", "eth0")]
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
        );
        // A condition changes in place; the other driver's entry stays.
        let changed = apply(
            &mut s,
            "gpu",
            json!([entry("gpu.amd.com", "gpu-1-128", "False")]),
        );
        assert_eq!(
            changed["status"]["devices"][0]["conditions"][0]["status"],
            "False"
        );
        assert_eq!(devices(&changed).len(), 2);
        // Applying none of its entries removes exactly its own.
        let removed = apply(&mut s, "gpu", json!([]));
        assert_eq!(
            devices(&removed),
            [("net.example.com".to_owned(), "eth0".to_owned())]
        );
    }

    #[test]
    fn stale_update_conflicts() {
        let mut s = store();
        let cm = rt(&s, "", "configmaps");
        let v1 = s
            .create(
                &cm,
                "v1",
                Some("default"),
                json!({"metadata": {"name": "c"}, "data": {"a": "1"}}),
                &ctx("t"),
            )
            .unwrap();
        let mut v2 = v1.clone();
        v2["data"]["a"] = json!("2");
        s.update(&cm, "v1", Some("default"), "c", Scope::Main, v2, &ctx("t"))
            .unwrap();
        let mut stale = v1.clone();
        stale["data"]["a"] = json!("3");
        let err = s
            .update(
                &cm,
                "v1",
                Some("default"),
                "c",
                Scope::Main,
                stale,
                &ctx("t"),
            )
            .unwrap_err();
        assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    }

    #[test]
    fn finalizers_hold_deletion() {
        let mut s = store();
        let cm = rt(&s, "", "configmaps");
        s.create(
            &cm,
            "v1",
            Some("default"),
            json!({"metadata": {"name": "f", "finalizers": ["x/y"]}}),
            &ctx("t"),
        )
        .unwrap();
        let d = s
            .delete(&cm, "v1", Some("default"), "f", &DeleteOpts::default())
            .unwrap();
        assert!(d["metadata"]["deletionTimestamp"].is_string());
        assert!(s.get(&cm, "v1", Some("default"), "f").is_ok());
        let p = s
            .patch(
                &cm,
                "v1",
                Some("default"),
                "f",
                Scope::Main,
                PatchKind::Merge,
                br#"{"metadata":{"finalizers":null}}"#,
                &ctx("t"),
            )
            .unwrap();
        assert!(p["metadata"]["deletionTimestamp"].is_string());
        assert_eq!(
            s.get(&cm, "v1", Some("default"), "f").unwrap_err().code,
            404
        );
    }

    #[test]
    fn paging_visits_every_object_once_across_namespaces() {
        let mut s = store();
        let ns = rt(&s, "", "namespaces");
        let cm = rt(&s, "", "configmaps");
        // "a" is a prefix of "a-b": the page order must follow the store's (ns, name) order.
        for n in ["a", "a-b"] {
            s.create(&ns, "v1", None, json!({"metadata": {"name": n}}), &ctx("t"))
                .unwrap();
            for c in ["x", "y"] {
                s.create(
                    &cm,
                    "v1",
                    Some(n),
                    json!({"metadata": {"name": c}}),
                    &ctx("t"),
                )
                .unwrap();
            }
        }
        let mut seen = Vec::new();
        let mut token = None;
        for _ in 0..10 {
            let page = s
                .list(
                    &cm,
                    "v1",
                    None,
                    &ListOpts {
                        limit: Some(1),
                        continue_token: token.clone(),
                        ..Default::default()
                    },
                )
                .unwrap();
            for i in page["items"].as_array().unwrap() {
                seen.push(format!(
                    "{}/{}",
                    i["metadata"]["namespace"].as_str().unwrap(),
                    i["metadata"]["name"].as_str().unwrap()
                ));
            }
            token = page["metadata"]["continue"].as_str().map(str::to_string);
            if token.is_none() {
                break;
            }
        }
        assert_eq!(seen, ["a/x", "a/y", "a-b/x", "a-b/y"]);
    }

    #[test]
    fn list_pages_are_a_consistent_snapshot() {
        let mut s = store();
        let cm = rt(&s, "", "configmaps");
        for i in 0..5 {
            s.create(
                &cm,
                "v1",
                Some("default"),
                json!({"metadata": {"name": format!("c{i}")}}),
                &ctx("t"),
            )
            .unwrap();
        }
        let page1 = s
            .list(
                &cm,
                "v1",
                None,
                &ListOpts {
                    limit: Some(2),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(page1["items"].as_array().unwrap().len(), 2);
        assert_eq!(page1["metadata"]["remainingItemCount"], 3);
        let token = page1["metadata"]["continue"].as_str().unwrap().to_string();
        // A change after the first page does not show in later pages.
        s.delete(&cm, "v1", Some("default"), "c4", &DeleteOpts::default())
            .unwrap();
        let page2 = s
            .list(
                &cm,
                "v1",
                None,
                &ListOpts {
                    limit: Some(10),
                    continue_token: Some(token.clone()),
                    ..Default::default()
                },
            )
            .unwrap();
        let names: Vec<&str> = page2["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, vec!["c2", "c3", "c4"]);
        assert!(page2["metadata"].get("continue").is_none());
        s.compact();
        let gone = s
            .list(
                &cm,
                "v1",
                None,
                &ListOpts {
                    continue_token: Some(token),
                    ..Default::default()
                },
            )
            .unwrap_err();
        assert_eq!(gone.code, 410);
    }

    #[test]
    fn watch_filter_turns_selector_changes_into_add_and_delete() {
        let f = WatchFilter {
            group: String::new(),
            resource: "pods".into(),
            namespace: None,
            label: LabelSelector::parse("app=x").unwrap(),
            field: FieldSelector::default(),
        };
        let key = ObjKey {
            group: String::new(),
            resource: "pods".into(),
            namespace: "d".into(),
            name: "p".into(),
        };
        let with = json!({"metadata": {"labels": {"app": "x"}}});
        let without = json!({"metadata": {"labels": {}}});
        let rec = |prev: &Value, obj: &Value| Record {
            rv: 1,
            etype: EventType::Modified,
            key: key.clone(),
            object: Frozen::new(obj),
            prev: Some(Frozen::new(prev)),
        };
        assert_eq!(
            f.event_for(&rec(&without, &with)).unwrap().0,
            EventType::Added
        );
        assert_eq!(
            f.event_for(&rec(&with, &without)).unwrap().0,
            EventType::Deleted
        );
        assert_eq!(
            f.event_for(&rec(&with, &with)).unwrap().0,
            EventType::Modified
        );
        assert!(f.event_for(&rec(&without, &without)).is_none());
    }

    #[test]
    fn pdb_math() {
        let pdb = json!({"spec": {"minAvailable": "50%"}});
        assert_eq!(desired_healthy(&pdb, 3), 2);
        let pdb = json!({"spec": {"maxUnavailable": 1}});
        assert_eq!(desired_healthy(&pdb, 3), 2);
        let pdb = json!({"spec": {"minAvailable": 2}});
        assert_eq!(desired_healthy(&pdb, 5), 2);
    }
}
