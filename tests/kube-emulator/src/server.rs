//! The HTTP side: accepting connections, routing Kubernetes API paths, serving discovery,
//! streaming watches, and applying injected faults and request counting at the door.
//!
//! It owns sockets and tasks, and turns requests into calls on the [`Store`]; it must not
//! decide API semantics itself (those live in the store), so that the store stays testable
//! without HTTP.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::admission::Caller;
use crate::error::ApiError;
use crate::faults::{FaultState, RequestCounts, RequestKey};
use crate::fields::Scope;
use crate::frozen::Frozen;
use crate::resources::ResourceType;
use crate::selector::{FieldReq, FieldSelector, LabelSelector};
use crate::store::{
    DeleteOpts, EventType, ListOpts, PatchKind, Record, Store, WatchFilter, WatchOpts, WatchStart,
    WriteCtx,
};
use crate::{openapi, protobuf, table, validation};

/// Response body: whole documents or watch streams.
pub(crate) type Body = UnsyncBoxBody<Bytes, std::io::Error>;

/// Largest request body accepted (the real server's limit is 3 MiB as well).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// Server timing knobs.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub bookmark_interval: Duration,
    pub default_watch_timeout: Duration,
}

/// State shared by all connections, and kept across stop/restart.
pub(crate) struct Shared {
    store: Mutex<Store>,
    faults: Mutex<FaultState>,
    counts: Mutex<BTreeMap<RequestKey, u64>>,
    writes: Mutex<std::collections::VecDeque<crate::faults::LoggedWrite>>,
    watch_drop: Mutex<CancellationToken>,
    open_watches: AtomicUsize,
    /// Per resource (plural), the newest revision a watch has sent an event of:
    /// how far behind the writes its watchers are.
    delivered: Mutex<BTreeMap<String, u64>>,
    port: AtomicU16,
    settings: Settings,
    pub reviews: crate::reviews::Reviews,
    /// Whether requests are authorized by the stored RBAC objects
    /// ([`authorize`]); off, every authenticated request is allowed.
    pub(crate) authorize_requests: AtomicBool,
    /// What [`authorize`] refused, each as its `403`'s message, in order.
    pub(crate) refused: Mutex<Vec<String>>,
}

/// Locks a mutex even if a panicking thread poisoned it: the data is plain and every
/// critical section leaves it consistent.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub fn new(history_limit: usize, settings: Settings) -> Arc<Self> {
        let (tx, _) = broadcast::channel(4096);
        Arc::new(Self {
            store: Mutex::new(Store::new(history_limit, tx)),
            faults: Mutex::new(FaultState::default()),
            counts: Mutex::new(BTreeMap::new()),
            writes: Mutex::new(std::collections::VecDeque::new()),
            watch_drop: Mutex::new(CancellationToken::new()),
            open_watches: AtomicUsize::new(0),
            authorize_requests: AtomicBool::new(false),
            refused: Mutex::new(Vec::new()),
            delivered: Mutex::new(BTreeMap::new()),
            port: AtomicU16::new(0),
            settings,
            reviews: Default::default(),
        })
    }

    pub fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }

    pub fn faults(&self) -> MutexGuard<'_, FaultState> {
        lock(&self.faults)
    }

    /// The newest revision a watch of `plural` has sent an event of (0: none).
    pub fn delivered(&self, plural: &str) -> u64 {
        lock(&self.delivered).get(plural).copied().unwrap_or(0)
    }

    fn note_delivered(&self, plural: &str, rv: u64) {
        let mut delivered = lock(&self.delivered);
        let newest = delivered.entry(plural.to_owned()).or_default();
        *newest = (*newest).max(rv);
    }

    pub fn counts(&self) -> RequestCounts {
        RequestCounts(lock(&self.counts).clone())
    }

    pub fn open_watches(&self) -> usize {
        self.open_watches.load(Ordering::SeqCst)
    }

    pub fn drop_watches(&self) -> usize {
        let n = self.open_watches();
        let mut t = lock(&self.watch_drop);
        t.cancel();
        *t = CancellationToken::new();
        n
    }

    fn count(&self, key: &RequestKey) {
        *lock(&self.counts).entry(key.clone()).or_insert(0) += 1;
    }

    /// The write requests so far, oldest first.
    pub fn writes(&self) -> Vec<crate::faults::LoggedWrite> {
        lock(&self.writes).iter().cloned().collect()
    }

    fn log_write(&self, write: crate::faults::LoggedWrite) {
        let mut writes = lock(&self.writes);
        if writes.len() >= crate::faults::WRITE_LOG_LIMIT {
            writes.pop_front();
        }
        writes.push_back(write);
    }
}

/// A running accept loop.
pub(crate) struct Running {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Running {
    /// Stops accepting and cuts every open connection, watches included.
    pub async fn stop(self) {
        self.stop.cancel();
        // The accept loop only ends by cancellation; a join error means it panicked, and
        // there is nothing left to stop then.
        let _ = self.task.await;
    }

    pub fn abort(&self) {
        self.stop.cancel();
        self.task.abort();
    }
}

/// Serves `listener` until stopped.
pub(crate) fn serve(shared: Arc<Shared>, listener: TcpListener) -> Running {
    if let Ok(addr) = listener.local_addr() {
        shared.port.store(addr.port(), Ordering::SeqCst);
    }
    let stop = CancellationToken::new();
    let token = stop.clone();
    let task = tokio::spawn(async move {
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                _ = token.cancelled() => break,
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else {
                        // Accept errors (e.g. too many open files) are transient.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let shared = shared.clone();
                    conns.spawn(async move {
                        let svc = service_fn(move |req| {
                            let shared = shared.clone();
                            async move { Ok::<_, Infallible>(handle(shared, req).await) }
                        });
                        // Connection errors are the client's business (resets, aborted bodies).
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
            }
        }
        conns.abort_all();
        while conns.join_next().await.is_some() {}
    });
    Running { stop, task }
}

fn full(code: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(
        Full::new(body.into())
            .map_err(|never: Infallible| match never {})
            .boxed_unsync(),
    );
    *r.status_mut() = code;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    full(
        code,
        "application/json",
        serde_json::to_vec(v).unwrap_or_default(),
    )
}

fn error_response(e: &ApiError) -> Response<Body> {
    let mut r = json_response(e.code, &e.to_status());
    if let Some(s) = e.details.retry_after_seconds
        && let Ok(v) = header::HeaderValue::from_str(&s.to_string())
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

/// Query parameters (last value wins).
#[derive(Default, Debug)]
struct Params(BTreeMap<String, String>);

impl Params {
    fn parse(q: Option<&str>) -> Self {
        Self(
            form_urlencoded::parse(q.unwrap_or("").as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
    }

    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1"))
    }
}

/// A parsed resource path.
#[derive(Debug, Clone, PartialEq)]
struct ResPath {
    group: String,
    version: String,
    namespace: Option<String>,
    plural: String,
    name: Option<String>,
    sub: Option<String>,
    watch_path: bool,
}

fn parse_resource_path(group: &str, version: &str, rest: &[&str]) -> Option<ResPath> {
    let (watch_path, rest) = match rest.split_first() {
        Some((&"watch", r)) => (true, r),
        _ => (false, rest),
    };
    let build = |namespace: Option<&str>, plural: &str, tail: &[&str]| -> Option<ResPath> {
        if tail.len() > 2 || plural.is_empty() || tail.iter().any(|s| s.is_empty()) {
            return None;
        }
        Some(ResPath {
            group: group.to_string(),
            version: version.to_string(),
            namespace: namespace.map(str::to_string),
            plural: plural.to_string(),
            name: tail.first().map(|s| s.to_string()),
            sub: tail.get(1).map(|s| s.to_string()),
            watch_path,
        })
    };
    match rest {
        ["namespaces", ns, plural, tail @ ..]
            if !(group.is_empty()
                && tail.is_empty()
                && matches!(*plural, "status" | "finalize")) =>
        {
            build(Some(ns), plural, tail)
        }
        [plural, tail @ ..] => build(None, plural, tail),
        [] => None,
    }
}

fn manager_for(params: &Params, headers: &HeaderMap) -> String {
    if let Some(m) = params.get("fieldManager").filter(|m| !m.is_empty()) {
        return m.to_string();
    }
    headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .filter(|s| !s.is_empty())
        .unwrap_or("unknown")
        .to_string()
}

fn resource_key(rp: &ResPath) -> String {
    let mut s = rp.plural.clone();
    if !rp.group.is_empty() {
        s.push('.');
        s.push_str(&rp.group);
    }
    if let Some(sub) = &rp.sub {
        s.push('/');
        s.push_str(sub);
    }
    s
}

fn verb_for(method: &Method, rp: &ResPath, params: &Params) -> &'static str {
    let watch = rp.watch_path || params.flag("watch");
    match (method.as_str(), rp.name.is_some()) {
        ("GET", _) if watch => "watch",
        ("GET", false) => "list",
        ("GET", true) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", false) => "deletecollection",
        ("DELETE", true) => "delete",
        _ => "unknown",
    }
}

/// RBAC over one request, as the real server's authorizer sees it (its
/// `RequestInfo`): the verb, group, resource, subresource, namespace and
/// name; a list or watch of one object by `fieldSelector=metadata.name=<n>`
/// is authorized for that name, as the server does. A server-side apply of
/// an object that does not exist is also a create, and needs `create` too.
/// Refused: `403 Forbidden`, worded as the server words it.
fn authorize(
    shared: &Shared,
    rt: &ResourceType,
    rp: &ResPath,
    params: &Params,
    verb: &str,
    apply: bool,
    user: &crate::reviews::UserInfo,
) -> Result<(), ApiError> {
    let name = match (&rp.name, verb) {
        (Some(name), _) => name.clone(),
        (None, "list" | "watch") => params
            .get("fieldSelector")
            .and_then(|f| f.strip_prefix("metadata.name="))
            .filter(|n| !n.contains(','))
            .unwrap_or_default()
            .to_owned(),
        _ => String::new(),
    };
    let namespace = rp.namespace.clone().unwrap_or_default();
    let store = shared.store();
    let policy = store.rbac_policy();
    let missing = apply
        && store
            .get(rt, &rp.version, rp.namespace.as_deref(), &name)
            .is_err();
    drop(store);
    let verbs: &[&str] = if missing { &[verb, "create"] } else { &[verb] };
    for verb in verbs {
        let attributes = crate::rbac::Attributes {
            verb: (*verb).to_owned(),
            group: rt.group.clone(),
            resource: rt.plural.clone(),
            subresource: rp.sub.clone().unwrap_or_default(),
            namespace: namespace.clone(),
            name: name.clone(),
        };
        if crate::rbac::allows(&policy, user, &attributes) {
            continue;
        }
        let resource = match &rp.sub {
            Some(sub) => format!("{}/{sub}", rt.plural),
            None => rt.plural.clone(),
        };
        let what = if name.is_empty() {
            rt.plural.clone()
        } else {
            format!("{} \"{name}\"", rt.plural)
        };
        let scope = if namespace.is_empty() {
            "at the cluster scope".to_owned()
        } else {
            format!("in the namespace \"{namespace}\"")
        };
        let message = format!(
            "{what} is forbidden: User \"{}\" cannot {verb} resource \"{resource}\" in API group \"{}\" {scope}",
            user.username, rt.group
        );
        shared
            .refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(message.clone());
        return Err(ApiError::forbidden(message));
    }
    Ok(())
}

async fn read_body(body: Incoming) -> Result<Bytes, ApiError> {
    match Limited::new(body, MAX_BODY).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => Err(ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("unable to read the request body: {e}"),
        )),
    }
}

/// Reads a JSON (or YAML) object body.
fn parse_object(body: &[u8], content_type: &str) -> Result<Value, ApiError> {
    if content_type.contains("cbor")
        || (content_type.contains("protobuf") && !content_type.starts_with(protobuf::MEDIA_TYPE))
    {
        return Err(ApiError::unsupported_media_type(format!(
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, {} (got {content_type})",
            protobuf::MEDIA_TYPE
        )));
    }
    let v: Value = if content_type.starts_with(protobuf::MEDIA_TYPE) {
        protobuf::decode(body)?
    } else if content_type.contains("yaml") {
        serde_saphyr::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?
    } else {
        serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
        })?
    };
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request is not an object",
        ));
    }
    Ok(v)
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let params = Params::parse(req.uri().query());
    if let Some(rest) = path.strip_prefix("/debug/") {
        let body = read_body(req.into_body()).await.unwrap_or_default();
        return handle_debug(&shared, rest, &params, &body);
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rp = match segments.as_slice() {
        ["api", "v1", rest @ ..] if !rest.is_empty() => parse_resource_path("", "v1", rest),
        ["apis", g, v, rest @ ..] if !rest.is_empty() => parse_resource_path(g, v, rest),
        _ => None,
    };
    let key = match &rp {
        Some(rp) => {
            let verb = verb_for(req.method(), rp, &params);
            RequestKey {
                verb: verb.to_string(),
                resource: resource_key(rp),
                watch: verb == "watch",
            }
        }
        None => RequestKey {
            verb: req.method().as_str().to_ascii_lowercase(),
            resource: if path.is_empty() {
                "/".into()
            } else {
                path.clone()
            },
            watch: false,
        },
    };
    shared.count(&key);
    let user = shared.reviews.user_for(req.headers());
    if let Some(rp) = &rp
        && matches!(key.verb.as_str(), "create" | "update" | "patch" | "delete")
    {
        shared.log_write(crate::faults::LoggedWrite {
            verb: key.verb.clone(),
            resource: key.resource.clone(),
            namespace: rp.namespace.clone(),
            name: rp.name.clone(),
            field_manager: params.get("fieldManager").map(str::to_owned),
            user: user.username.clone(),
        });
    }
    let (delay, failure) = {
        let mut f = shared.faults();
        (f.latency(&key), f.take_failure(&key))
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(code) = failure {
        let mut e = ApiError::new(
            code,
            ApiError::reason_for_code(code),
            format!(
                "injected fault: {} {} fails with {code}",
                key.verb, key.resource
            ),
        );
        if code == 429 {
            e.details.retry_after_seconds = Some(1);
        }
        return error_response(&e);
    }
    if let Some(review) = crate::reviews::kind(&key) {
        let body = read_body(req.into_body()).await.unwrap_or_default();
        let (code, answer) = shared.reviews.answer(review, &body);
        return json_response(code, &answer);
    }
    match rp {
        Some(rp) => handle_resource(&shared, req, rp, params, user).await,
        None => handle_nonresource(&shared, req.method(), &segments),
    }
}

fn handle_debug(shared: &Arc<Shared>, rest: &str, params: &Params, _body: &[u8]) -> Response<Body> {
    let faults = crate::faults::Faults {
        shared: shared.clone(),
    };
    let get = |k: &str, d: &str| params.get(k).unwrap_or(d).to_string();
    match rest {
        "requests" => json_response(200, &shared.counts().to_json()),
        "faults/fail" => {
            let count = get("count", "1").parse().unwrap_or(1);
            let code = get("code", "500").parse().unwrap_or(500);
            faults.fail_next(count, &get("verb", "*"), &get("resource", "*"), code);
            json_response(200, &json!({"pendingFailures": faults.pending_failures()}))
        }
        "faults/latency" => {
            let ms: u64 = get("ms", "0").parse().unwrap_or(0);
            faults.add_latency(
                &get("verb", "*"),
                &get("resource", "*"),
                Duration::from_millis(ms),
            );
            json_response(200, &json!({}))
        }
        "faults/clear" => {
            faults.clear();
            json_response(200, &json!({}))
        }
        "faults/drop-watches" => json_response(200, &json!({"dropped": faults.drop_watches()})),
        "faults/compact" => json_response(200, &json!({"compactedRevision": faults.compact()})),
        _ => error_response(&ApiError::no_route()),
    }
}

fn handle_nonresource(shared: &Arc<Shared>, method: &Method, segments: &[&str]) -> Response<Body> {
    if method != Method::GET && method != Method::HEAD {
        return error_response(&ApiError::method_not_allowed("only GET is served here"));
    }
    let store = shared.store();
    let port = shared.port.load(Ordering::SeqCst);
    match segments {
        ["version"] => json_response(
            200,
            &json!({
                "major": "1", "minor": "34", "gitVersion": "v1.34.0",
                "gitCommit": "kube-emulator", "gitTreeState": "clean",
                "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24.0",
                "compiler": "gc", "platform": "linux/amd64"
            }),
        ),
        ["healthz" | "livez" | "readyz"] => full(StatusCode::OK, "text/plain; charset=utf-8", "ok"),
        ["api"] => json_response(
            200,
            &json!({
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": format!("127.0.0.1:{port}")}]
            }),
        ),
        ["api", "v1"] => resource_list(&store, "", "v1")
            .map(|v| json_response(200, &v))
            .unwrap_or_else(|| error_response(&ApiError::no_route())),
        ["apis"] => json_response(200, &group_list(&store)),
        ["apis", g] => group_list(&store)["groups"]
            .as_array()
            .and_then(|gs| gs.iter().find(|x| x["name"] == *g).cloned())
            .map(|mut g| {
                g["kind"] = json!("APIGroup");
                g["apiVersion"] = json!("v1");
                json_response(200, &g)
            })
            .unwrap_or_else(|| error_response(&ApiError::no_route())),
        ["apis", g, v] => resource_list(&store, g, v)
            .map(|v| json_response(200, &v))
            .unwrap_or_else(|| error_response(&ApiError::no_route())),
        ["openapi", "v3"] => json_response(200, &openapi::root(&store)),
        ["openapi", "v3", rest @ ..] => openapi::group_version(&store, rest)
            .map(|v| json_response(200, &v))
            .unwrap_or_else(|| error_response(&ApiError::no_route())),
        _ => error_response(&ApiError::no_route()),
    }
}

/// `/apis`: every non-core group, with its versions.
fn group_list(store: &Store) -> Value {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for t in store.types().filter(|t| !t.group.is_empty()) {
        match groups.iter_mut().find(|(g, _)| *g == t.group) {
            Some((_, vs)) => {
                for v in &t.versions {
                    if !vs.contains(v) {
                        vs.push(v.clone());
                    }
                }
            }
            None => groups.push((t.group.clone(), t.versions.clone())),
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(g, vs)| {
            let versions: Vec<Value> = vs
                .iter()
                .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                .collect();
            json!({"name": g, "versions": versions, "preferredVersion": versions[0].clone()})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/api/v1` and `/apis/<group>/<version>`.
fn resource_list(store: &Store, group: &str, version: &str) -> Option<Value> {
    let types: Vec<&ResourceType> = store
        .types()
        .filter(|t| t.group == group && t.serves(version))
        .collect();
    if types.is_empty() {
        return None;
    }
    let verbs = json!([
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch"
    ]);
    let mut resources = Vec::new();
    for t in types {
        let mut r = json!({
            "name": t.plural, "singularName": t.singular, "namespaced": t.namespaced,
            "kind": t.kind, "verbs": verbs,
        });
        if !t.short_names.is_empty() {
            r["shortNames"] = json!(t.short_names);
        }
        if !t.categories.is_empty() {
            r["categories"] = json!(t.categories);
        }
        resources.push(r);
        if t.status {
            resources.push(json!({
                "name": format!("{}/status", t.plural), "singularName": "", "namespaced": t.namespaced,
                "kind": t.kind, "verbs": ["get", "patch", "update"],
            }));
        }
        if t.eviction {
            resources.push(json!({
                "name": format!("{}/eviction", t.plural), "singularName": "", "namespaced": t.namespaced,
                "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"],
            }));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

/// The shape a client asked for in `Accept`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Render {
    Full,
    /// `meta.k8s.io` Table (as `kubectl get` asks).
    Table,
    /// `meta.k8s.io` PartialObjectMetadata(List) (kube's `*_metadata` calls, metadata watchers).
    Metadata,
}

fn render_mode(headers: &HeaderMap) -> Render {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // The first acceptable entry wins; both of these fall back to plain JSON last.
    match accept.split(',').next().unwrap_or("") {
        a if a.contains("as=Table") => Render::Table,
        a if a.contains("as=PartialObjectMetadata") => Render::Metadata,
        _ => Render::Full,
    }
}

/// Renders an object (or a list) as the client asked.
fn render(rt: &ResourceType, v: &Value, is_list: bool, mode: Render) -> Value {
    let is_object = v.get("metadata").is_some() && v.get("kind") != Some(&json!("Status"));
    match mode {
        Render::Full => v.clone(),
        _ if !is_object => v.clone(),
        Render::Table => table::to_table(rt, v, is_list),
        Render::Metadata if is_list => json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": v.get("metadata").cloned().unwrap_or_else(|| json!({})),
            "items": v.get("items").and_then(Value::as_array).map(|items| {
                items.iter().map(table::partial_metadata).collect::<Vec<_>>()
            }).unwrap_or_default(),
        }),
        Render::Metadata => table::partial_metadata(v),
    }
}

async fn handle_resource(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    rp: ResPath,
    params: Params,
    user: crate::reviews::UserInfo,
) -> Response<Body> {
    let rt = {
        let store = shared.store();
        match store.find_type(&rp.group, &rp.version, &rp.plural) {
            Some(t) => t.clone(),
            None => return error_response(&ApiError::no_route()),
        }
    };
    // Scope checks: namespaced objects live under /namespaces/<ns>/.
    if rt.namespaced && rp.namespace.is_none() && rp.name.is_some() {
        return error_response(&ApiError::no_route());
    }
    if !rt.namespaced && rp.namespace.is_some() {
        return error_response(&ApiError::no_route());
    }
    let scope = match rp.sub.as_deref() {
        None => Scope::Main,
        Some("status") if rt.status => Scope::Status,
        Some("eviction") if rt.eviction => Scope::Main,
        Some(_) => return error_response(&ApiError::no_route()),
    };
    let method = req.method().clone();
    let headers = req.headers().clone();
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_ascii_lowercase();
    let body = match read_body(req.into_body()).await {
        Ok(b) => b,
        Err(e) => return error_response(&e),
    };
    let ns = rp.namespace.as_deref();
    let version = rp.version.as_str();
    let verb = verb_for(&method, &rp, &params);
    let validation =
        match validation::for_request(verb, params.get("fieldValidation"), &content_type, &body) {
            Ok(v) => v,
            Err(e) => return error_response(&e),
        };
    if shared.authorize_requests.load(Ordering::Relaxed) {
        let apply = verb == "patch" && content_type.starts_with("application/apply-patch");
        if let Err(e) = authorize(shared, &rt, &rp, &params, verb, apply, &user) {
            return error_response(&e);
        }
    }
    let dry_run = params.get("dryRun") == Some("All");
    let caller = Caller {
        user,
        dry_run,
        field_manager: params.get("fieldManager").map(str::to_owned),
        field_validation: params.get("fieldValidation").map(str::to_owned),
        delete_options: Value::Null,
        collection: verb == "deletecollection",
    };
    let ctx = WriteCtx {
        manager: manager_for(&params, &headers),
        dry_run,
        validation,
        caller: Some(caller),
    };
    let name = rp.name.clone().unwrap_or_default();
    let result: Result<(u16, Value), ApiError> = match verb {
        "watch" => {
            return start_watch(
                shared,
                &rt,
                version,
                ns,
                rp.name.as_deref(),
                &params,
                &headers,
            );
        }
        "list" => list_opts(&params)
            .and_then(|o| shared.store().list(&rt, version, ns, &o).map(|v| (200, v))),
        "get" => shared
            .store()
            .get(&rt, version, ns, &name)
            .map(|v| (200, v)),
        "create" if rp.sub.as_deref() == Some("eviction") => parse_object(&body, &content_type)
            .and_then(|b| {
                shared.store().evict(
                    ns.unwrap_or_default(),
                    &name,
                    &b,
                    ctx.dry_run,
                    ctx.caller.as_ref(),
                )
            })
            .map(|v| (201, v)),
        "create" if rp.name.is_some() => Err(ApiError::method_not_allowed(
            "POST is not supported on a named resource",
        )),
        "create" => {
            if rt.namespaced && ns.is_none() {
                Err(ApiError::method_not_allowed(
                    "POST needs a namespace for a namespaced resource",
                ))
            } else {
                parse_object(&body, &content_type)
                    .and_then(|b| shared.store().create(&rt, version, ns, b, &ctx))
                    .map(|v| (201, v))
            }
        }
        "update" => parse_object(&body, &content_type)
            .and_then(|b| {
                shared
                    .store()
                    .update(&rt, version, ns, &name, scope, b, &ctx)
            })
            .map(|v| (200, v)),
        "patch" => patch(
            shared,
            &rt,
            version,
            ns,
            &name,
            scope,
            &content_type,
            &body,
            &params,
            &ctx,
        ),
        "delete" => {
            let b: Value = if body.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&body).unwrap_or(Value::Null)
            };
            let mut opts = DeleteOpts::from_body(&b, ctx.dry_run);
            opts.caller = ctx.caller.clone().map(|c| Caller {
                delete_options: b.clone(),
                ..c
            });
            shared
                .store()
                .delete(&rt, version, ns, &name, &opts)
                .map(|v| (200, v))
        }
        "deletecollection" => list_opts(&params).and_then(|o| {
            let b: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let mut opts = DeleteOpts::from_body(&b, ctx.dry_run);
            opts.caller = ctx.caller.clone().map(|c| Caller {
                delete_options: b.clone(),
                ..c
            });
            shared
                .store()
                .delete_collection(&rt, version, ns, &o, &opts)
                .map(|v| (200, v))
        }),
        _ => Err(ApiError::method_not_allowed(format!(
            "{method} is not supported"
        ))),
    };
    let mode = match render_mode(&headers) {
        // Only reads answer tables; writes answer the object.
        Render::Table if verb != "list" && verb != "get" => Render::Full,
        m => m,
    };
    match result {
        Ok((code, v)) => {
            let mut r = json_response(
                code,
                &render(&rt, &v, verb == "list" || verb == "deletecollection", mode),
            );
            validation::add_warnings(r.headers_mut(), &ctx.validation);
            r
        }
        Err(e) => error_response(&e),
    }
}

#[allow(clippy::too_many_arguments)]
fn patch(
    shared: &Arc<Shared>,
    rt: &ResourceType,
    version: &str,
    ns: Option<&str>,
    name: &str,
    scope: Scope,
    content_type: &str,
    body: &[u8],
    params: &Params,
    ctx: &WriteCtx,
) -> Result<(u16, Value), ApiError> {
    let mime = content_type.split(';').next().unwrap_or("").trim();
    let kind = match mime {
        "application/merge-patch+json" => PatchKind::Merge,
        "application/json-patch+json" => PatchKind::Json,
        "application/strategic-merge-patch+json" => PatchKind::Strategic,
        "application/apply-patch+yaml" => {
            if params.get("fieldManager").is_none_or(str::is_empty) {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                ));
            }
            let applied: Value = serde_saphyr::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
            let mut store = shared.store();
            let existed = store.get(rt, version, ns, name).is_ok();
            let v = store.apply(
                rt,
                version,
                ns,
                name,
                scope,
                applied,
                params.flag("force"),
                ctx,
            )?;
            return Ok((if existed { 200 } else { 201 }, v));
        }
        other => {
            return Err(ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format - accepted media types include: \
                 application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, \
                 application/strategic-merge-patch+json (got \"{other}\")"
            )));
        }
    };
    shared
        .store()
        .patch(rt, version, ns, name, scope, kind, body, ctx)
        .map(|v| (200, v))
}

fn list_opts(params: &Params) -> Result<ListOpts, ApiError> {
    Ok(ListOpts {
        label: LabelSelector::parse(params.get("labelSelector").unwrap_or(""))
            .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?,
        field: FieldSelector::parse(params.get("fieldSelector").unwrap_or(""))
            .map_err(ApiError::bad_request)?,
        limit: match params.get("limit") {
            Some(l) => Some(
                l.parse()
                    .map_err(|_| ApiError::bad_request(format!("invalid limit \"{l}\"")))?,
            ),
            None => None,
        },
        continue_token: params.get("continue").map(str::to_string),
        resource_version: params.get("resourceVersion").map(str::to_string),
        resource_version_match: params.get("resourceVersionMatch").map(str::to_string),
    })
}

/// The object as a watch at `version` sends it.
fn served(rt: &ResourceType, version: &str, obj: &Value) -> Value {
    Store::output(rt, version, obj)
}

fn event_line(etype: &str, obj: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": etype, "object": obj})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

fn bookmark(rt: &ResourceType, version: &str, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    event_line(
        "BOOKMARK",
        &json!({"kind": rt.kind, "apiVersion": rt.api_version(version), "metadata": meta}),
    )
}

type Chunk = Result<Frame<Bytes>, std::io::Error>;

fn stream_response(rx: mpsc::Receiver<Chunk>) -> Response<Body> {
    let stream =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
    let mut r = Response::new(BodyExt::boxed_unsync(StreamBody::new(stream.boxed())));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

fn start_watch(
    shared: &Arc<Shared>,
    rt: &ResourceType,
    version: &str,
    ns: Option<&str>,
    name: Option<&str>,
    params: &Params,
    headers: &HeaderMap,
) -> Response<Body> {
    let lo = match list_opts(params) {
        Ok(o) => o,
        Err(e) => return error_response(&e),
    };
    let mut field = lo.field;
    if let Some(n) = name {
        field.0.push(FieldReq {
            field: "metadata.name".into(),
            value: n.to_string(),
            equal: true,
        });
    }
    let bookmarks = params.flag("allowWatchBookmarks");
    let opts = WatchOpts {
        label: lo.label,
        field,
        resource_version: lo.resource_version,
        resource_version_match: lo.resource_version_match,
        send_initial_events: params.flag("sendInitialEvents"),
        bookmarks,
    };
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(shared.settings.default_watch_timeout);
    let start = shared.store().watch(rt, ns, &opts);
    let (tx, rx) = mpsc::channel::<Chunk>(256);
    let mode = render_mode(headers);
    match start {
        Err(e) => error_response(&e),
        Ok(WatchStart::Expired(e)) => {
            let line = event_line("ERROR", &e.to_status());
            // The channel has room; the receiver is in the response below.
            let _ = tx.try_send(Ok(Frame::data(line)));
            stream_response(rx)
        }
        Ok(WatchStart::Stream {
            initial,
            rx: events,
            filter,
            start_rv,
            initial_events_end,
        }) => {
            let drop = lock(&shared.watch_drop).clone();
            let job = WatchJob {
                shared: shared.clone(),
                tx,
                rt: rt.clone(),
                version: version.to_string(),
                filter,
                start_rv,
                initial_events_end,
                bookmarks,
                timeout,
                drop,
                mode,
            };
            tokio::spawn(job.run(initial, events));
            stream_response(rx)
        }
    }
}

/// Counts an open watch for as long as it lives.
struct OpenWatch(Arc<Shared>);

impl OpenWatch {
    fn new(shared: Arc<Shared>) -> Self {
        shared.open_watches.fetch_add(1, Ordering::SeqCst);
        Self(shared)
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.0.open_watches.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One watch stream's pump: initial events, then live events and bookmarks, until the
/// timeout, the client leaving, or an injected drop.
struct WatchJob {
    shared: Arc<Shared>,
    tx: mpsc::Sender<Chunk>,
    rt: ResourceType,
    version: String,
    filter: WatchFilter,
    start_rv: u64,
    initial_events_end: bool,
    bookmarks: bool,
    timeout: Duration,
    drop: CancellationToken,
    mode: Render,
}

impl WatchJob {
    fn line(&self, etype: EventType, obj: &Value) -> Bytes {
        let obj = served(&self.rt, &self.version, obj);
        event_line(etype.as_str(), &render(&self.rt, &obj, false, self.mode))
    }

    async fn send(&self, b: Bytes) -> bool {
        self.tx.send(Ok(Frame::data(b))).await.is_ok()
    }

    async fn run(
        self,
        initial: Vec<(EventType, Frozen)>,
        mut events: broadcast::Receiver<Arc<Record>>,
    ) {
        let _open = OpenWatch::new(self.shared.clone());
        for (t, obj) in &initial {
            let obj = obj.thaw();
            if !self.send(self.line(*t, &obj)).await {
                return;
            }
            let rv = obj["metadata"]["resourceVersion"].as_str();
            if let Some(rv) = rv.and_then(|rv| rv.parse().ok()) {
                self.shared.note_delivered(&self.rt.plural, rv);
            }
        }
        if self.initial_events_end
            && !self
                .send(bookmark(&self.rt, &self.version, self.start_rv, true))
                .await
        {
            return;
        }
        let mut last_rv = self.start_rv;
        let deadline = tokio::time::sleep(self.timeout);
        tokio::pin!(deadline);
        let every = self.shared.settings.bookmark_interval;
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            tokio::select! {
                _ = &mut deadline => break,
                _ = self.drop.cancelled() => {
                    // An error in the body makes hyper cut the connection mid-stream.
                    let _ = self.tx.send(Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        "watch dropped by fault injection",
                    ))).await;
                    break;
                }
                _ = self.tx.closed() => break,
                _ = ticker.tick(), if self.bookmarks => {
                    if !self.send(bookmark(&self.rt, &self.version, last_rv, false)).await {
                        break;
                    }
                }
                r = events.recv() => match r {
                    Ok(rec) => {
                        if rec.rv <= self.start_rv {
                            continue;
                        }
                        last_rv = last_rv.max(rec.rv);
                        if let Some((t, obj)) = self.filter.event_for(&rec) {
                            if !self.send(self.line(t, &obj.thaw())).await {
                                break;
                            }
                            self.shared.note_delivered(&self.rt.plural, rec.rv);
                        }
                    }
                    // A watcher too slow to keep up is closed, as the real server does; the
                    // client resumes from its last resourceVersion.
                    Err(broadcast::error::RecvError::Lagged(_)) | Err(broadcast::error::RecvError::Closed) => break,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(group: &str, rest: &str) -> Option<ResPath> {
        let segs: Vec<&str> = rest.split('/').collect();
        parse_resource_path(group, "v1", &segs)
    }

    #[test]
    fn paths() {
        let r = p("", "namespaces/default/pods/p1/status").unwrap();
        assert_eq!(r.namespace.as_deref(), Some("default"));
        assert_eq!(
            (r.plural.as_str(), r.name.as_deref(), r.sub.as_deref()),
            ("pods", Some("p1"), Some("status"))
        );
        let r = p("", "namespaces/default").unwrap();
        assert_eq!(
            (r.plural.as_str(), r.name.as_deref(), r.namespace),
            ("namespaces", Some("default"), None)
        );
        let r = p("", "namespaces/kube-system/status").unwrap();
        assert_eq!(
            (r.plural.as_str(), r.name.as_deref(), r.sub.as_deref()),
            ("namespaces", Some("kube-system"), Some("status"))
        );
        let r = p("", "namespaces/ns/configmaps").unwrap();
        assert_eq!(
            (r.plural.as_str(), r.name, r.namespace.as_deref()),
            ("configmaps", None, Some("ns"))
        );
        let r = p("", "pods").unwrap();
        assert_eq!((r.plural.as_str(), r.namespace), ("pods", None));
        let r = p("", "watch/namespaces/ns/pods/x").unwrap();
        assert!(r.watch_path);
        assert!(p("", "namespaces/ns/pods/a/b/c").is_none());
    }

    #[test]
    fn verbs_and_keys() {
        let rp = p("coordination.k8s.io", "namespaces/ns/leases").unwrap();
        let params = Params::parse(Some("watch=true&resourceVersion=5"));
        assert_eq!(verb_for(&Method::GET, &rp, &params), "watch");
        assert_eq!(verb_for(&Method::GET, &rp, &Params::default()), "list");
        assert_eq!(
            verb_for(&Method::DELETE, &rp, &Params::default()),
            "deletecollection"
        );
        assert_eq!(resource_key(&rp), "leases.coordination.k8s.io");
        let rp = p("", "namespaces/ns/pods/x/eviction").unwrap();
        assert_eq!(verb_for(&Method::POST, &rp, &Params::default()), "create");
        assert_eq!(resource_key(&rp), "pods/eviction");
    }
}
