//! Who a request is from, and TokenReview (`authentication.k8s.io/v1`) and
//! SubjectAccessReview (`authorization.k8s.io/v1`) creates, answered from what
//! the test registered through [`Reviews`]: bearer tokens and the users
//! ([`UserInfo`]) they stand for, and grants of a verb on a non-resource path
//! (or a resource) to users or groups.
//!
//! Owns: the token registry (one for both: a token a TokenReview
//! authenticates is also the identity the server gives a request sending it),
//! the default identity of a request without a known token (an
//! administrator), and the answers to those two creates. Reviews are never
//! stored, as on the real server; they are counted like any request (`create
//! tokenreviews.authentication.k8s.io`, `create
//! subjectaccessreviews.authorization.k8s.io`).
//!
//! Must not: enforce anything on other requests (the emulator authorizes
//! nothing: admission policies are the `admission` module's), or read the
//! RBAC objects it stores.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};

use crate::faults::RequestKey;

/// The tokens [`Reviews::token_for`] hands out start with this.
const ISSUED_PREFIX: &str = "kube-emulator-token-";

/// Which review a request creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Review {
    Token,
    Access,
}

/// The review a request is, if it is a create of one.
pub(crate) fn kind(key: &RequestKey) -> Option<Review> {
    if key.verb != "create" {
        return None;
    }
    match key.resource.as_str() {
        "tokenreviews.authentication.k8s.io" => Some(Review::Token),
        "subjectaccessreviews.authorization.k8s.io" => Some(Review::Access),
        _ => None,
    }
}

/// The user a request is attributed to, as the API server's authenticator
/// hands it to admission (`request.userInfo` of an AdmissionRequest).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub username: String,
    /// Empty: none (left out of `userInfo`).
    pub uid: String,
    pub groups: Vec<String>,
    /// E.g. `authentication.kubernetes.io/node-name: [gpu-node-2]`, as a pod's
    /// bound ServiceAccount token carries it.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The group every authenticated user is in.
const AUTHENTICATED: &str = "system:authenticated";

impl UserInfo {
    /// A user with these groups (and no uid or extra).
    pub fn new(username: &str, groups: &[&str]) -> Self {
        Self {
            username: username.to_owned(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Self::default()
        }
    }

    /// What a request without a (known) token is: an administrator, which no
    /// policy scoped to a ServiceAccount matches.
    pub fn admin() -> Self {
        Self::new("system:admin", &["system:masters", AUTHENTICATED])
    }

    /// ServiceAccount `namespace/name` as the API server names it
    /// (`system:serviceaccount:<ns>:<name>`, groups `system:serviceaccounts`,
    /// `system:serviceaccounts:<ns>`, `system:authenticated`).
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Self::new(
            &format!("system:serviceaccount:{namespace}:{name}"),
            &[
                "system:serviceaccounts",
                &format!("system:serviceaccounts:{namespace}"),
                AUTHENTICATED,
            ],
        )
    }

    /// Adds (replaces) one `extra` entry.
    pub fn with_extra(mut self, key: &str, values: &[&str]) -> Self {
        self.extra.insert(
            key.to_owned(),
            values.iter().map(|v| v.to_string()).collect(),
        );
        self
    }

    pub fn with_uid(mut self, uid: &str) -> Self {
        self.uid = uid.to_owned();
        self
    }

    /// `userInfo` as an AdmissionRequest (and a TokenReview's status) carries
    /// it: empty fields are left out, as the API server's JSON omits them.
    pub fn to_json(&self) -> Value {
        let mut m = serde_json::Map::new();
        if !self.username.is_empty() {
            m.insert("username".into(), json!(self.username));
        }
        if !self.uid.is_empty() {
            m.insert("uid".into(), json!(self.uid));
        }
        if !self.groups.is_empty() {
            m.insert("groups".into(), json!(self.groups));
        }
        if !self.extra.is_empty() {
            m.insert("extra".into(), json!(self.extra));
        }
        Value::Object(m)
    }
}

#[derive(Clone, Debug)]
struct Grant {
    /// A user name, or `group:<name>`.
    subject: String,
    verb: String,
    /// A non-resource path (`*` at the end matches a prefix), or a resource
    /// plural.
    target: String,
}

#[derive(Default)]
struct State {
    tokens: HashMap<String, UserInfo>,
    grants: Vec<Grant>,
    /// Tokens handed out by [`Reviews::token_for`], numbered.
    issued: u64,
}

/// The registry a test fills; cheap to clone, shared with the server.
#[derive(Clone, Default)]
pub struct Reviews(Arc<Mutex<State>>);

impl Reviews {
    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A TokenReview of `token` authenticates it as `user` in `groups`
    /// (plus `system:authenticated`), and a request sending it as a bearer
    /// token is that user. Unknown tokens are not authenticated.
    pub fn add_token(&self, token: &str, user: &str, groups: &[&str]) {
        let mut groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        groups.push(AUTHENTICATED.into());
        self.state().tokens.insert(
            token.to_owned(),
            UserInfo {
                username: user.to_owned(),
                uid: format!("uid-{user}"),
                groups,
                extra: BTreeMap::new(),
            },
        );
    }

    /// Registers `user` under `token` as given, but in `system:authenticated`
    /// (the API server adds that group to every authenticated user).
    pub fn add_user_token(&self, token: &str, user: &UserInfo) {
        let mut user = user.clone();
        if !user.groups.iter().any(|g| g == AUTHENTICATED) {
            user.groups.push(AUTHENTICATED.into());
        }
        self.state().tokens.insert(token.to_owned(), user);
    }

    /// A token for `user`: the one registered for that same identity before,
    /// or a new one.
    pub fn token_for(&self, user: &UserInfo) -> String {
        let mut with_group = user.clone();
        if !with_group.groups.iter().any(|g| g == AUTHENTICATED) {
            with_group.groups.push(AUTHENTICATED.into());
        }
        let mut state = self.state();
        if let Some((token, _)) = state
            .tokens
            .iter()
            .filter(|(t, _)| t.starts_with(ISSUED_PREFIX))
            .find(|(_, u)| **u == with_group)
        {
            return token.clone();
        }
        state.issued += 1;
        let token = format!("{ISSUED_PREFIX}{}", state.issued);
        state.tokens.insert(token.clone(), with_group);
        token
    }

    /// Who a request with these headers is: the user of its bearer token, or
    /// (no token, an unknown one) an administrator.
    pub(crate) fn user_for(&self, headers: &http::HeaderMap) -> UserInfo {
        headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .and_then(|token| self.state().tokens.get(token.trim()).cloned())
            .unwrap_or_else(UserInfo::admin)
    }

    /// SubjectAccessReviews allow `user` to `verb` the non-resource `path`
    /// (`/metrics`; `/*` style prefixes) or a resource plural.
    pub fn allow_user(&self, user: &str, verb: &str, path: &str) {
        self.grant(user.to_owned(), verb, path);
    }

    /// The same for every member of `group`.
    pub fn allow_group(&self, group: &str, verb: &str, path: &str) {
        self.grant(format!("group:{group}"), verb, path);
    }

    fn grant(&self, subject: String, verb: &str, target: &str) {
        self.state().grants.push(Grant {
            subject,
            verb: verb.to_owned(),
            target: target.to_owned(),
        });
    }

    /// Forgets every token and grant, except the tokens of clients handed
    /// out by `Emulator::client_as` (those clients keep their identity).
    pub fn clear(&self) {
        let mut state = self.state();
        state.tokens.retain(|t, _| t.starts_with(ISSUED_PREFIX));
        state.grants.clear();
    }

    /// The status code and body answering a create of `review` with `body`.
    pub(crate) fn answer(&self, review: Review, body: &[u8]) -> (u16, Value) {
        let mut object: Value = match serde_json::from_slice(body) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                return (
                    400,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                           "reason": "BadRequest", "code": 400,
                           "message": "the body of the request is not a JSON object"}),
                );
            }
        };
        let status = match review {
            Review::Token => self.token_status(&object["spec"]),
            Review::Access => self.access_status(&object["spec"]),
        };
        object["status"] = status;
        (201, object)
    }

    fn token_status(&self, spec: &Value) -> Value {
        let token = spec["token"].as_str().unwrap_or_default();
        match self.state().tokens.get(token) {
            Some(user) => json!({
                "authenticated": true,
                "user": user.to_json(),
            }),
            None => json!({"authenticated": false, "error": "invalid bearer token"}),
        }
    }

    fn access_status(&self, spec: &Value) -> Value {
        let user = spec["user"].as_str().unwrap_or_default();
        let groups: Vec<&str> = spec["groups"]
            .as_array()
            .map(|g| g.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let (verb, target) = if spec["nonResourceAttributes"].is_object() {
            let attrs = &spec["nonResourceAttributes"];
            (attrs["verb"].as_str(), attrs["path"].as_str())
        } else {
            let attrs = &spec["resourceAttributes"];
            (attrs["verb"].as_str(), attrs["resource"].as_str())
        };
        let (Some(verb), Some(target)) = (verb, target) else {
            return json!({"allowed": false, "reason": "no verb or target in the review"});
        };
        let allowed = self.state().grants.iter().any(|g| {
            let subject = match g.subject.strip_prefix("group:") {
                Some(group) => groups.contains(&group),
                None => g.subject == user,
            };
            let target_matches = match g.target.strip_suffix('*') {
                Some(prefix) => target.starts_with(prefix),
                None => g.target == target,
            };
            subject && (g.verb == verb || g.verb == "*") && target_matches
        });
        if allowed {
            json!({"allowed": true, "reason": "granted by the test"})
        } else {
            json!({"allowed": false})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(verb: &str, resource: &str) -> RequestKey {
        RequestKey {
            verb: verb.into(),
            resource: resource.into(),
            watch: false,
        }
    }

    #[test]
    fn only_creates_of_the_two_reviews_are_routed_here() {
        assert_eq!(
            kind(&key("create", "tokenreviews.authentication.k8s.io")),
            Some(Review::Token)
        );
        assert_eq!(
            kind(&key("create", "subjectaccessreviews.authorization.k8s.io")),
            Some(Review::Access)
        );
        assert_eq!(
            kind(&key("get", "tokenreviews.authentication.k8s.io")),
            None
        );
        assert_eq!(kind(&key("create", "configmaps")), None);
    }

    #[test]
    fn tokens_authenticate_and_grants_authorize() {
        let reviews = Reviews::default();
        reviews.add_token("t1", "alice", &["monitoring"]);
        reviews.allow_user("alice", "get", "/metrics");
        reviews.allow_group("ops", "get", "/debug/*");
        let token = |t: &str| {
            let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                              "spec": {"token": t}});
            reviews.answer(Review::Token, body.to_string().as_bytes())
        };
        let (code, ok) = token("t1");
        assert_eq!(code, 201);
        assert_eq!(ok["status"]["authenticated"], true);
        assert_eq!(ok["status"]["user"]["username"], "alice");
        assert_eq!(ok["kind"], "TokenReview");
        assert_eq!(token("nope").1["status"]["authenticated"], false);

        let access = |user: &str, groups: &[&str], path: &str| {
            let body = json!({"spec": {"user": user, "groups": groups,
                              "nonResourceAttributes": {"verb": "get", "path": path}}});
            reviews
                .answer(Review::Access, body.to_string().as_bytes())
                .1["status"]["allowed"]
                == true
        };
        assert!(access("alice", &[], "/metrics"));
        assert!(!access("alice", &[], "/gpumetrics"));
        assert!(!access("bob", &[], "/metrics"));
        assert!(access("bob", &["ops"], "/debug/pprof"));
        assert_eq!(reviews.answer(Review::Access, b"[]").0, 400);
        reviews.clear();
        assert!(!access("alice", &[], "/metrics"));
    }
}
