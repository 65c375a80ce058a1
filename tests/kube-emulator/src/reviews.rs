//! TokenReview (`authentication.k8s.io/v1`) and SubjectAccessReview
//! (`authorization.k8s.io/v1`) creates, answered from what the test registered
//! through [`Reviews`]: bearer tokens and the users they stand for, and grants
//! of a verb on a non-resource path (or a resource) to users or groups.
//!
//! Owns: the answers to those two creates. Reviews are never stored, as on the
//! real server; they are counted like any request (`create
//! tokenreviews.authentication.k8s.io`, `create
//! subjectaccessreviews.authorization.k8s.io`).
//!
//! Must not: enforce anything on other requests (the emulator authorizes
//! nothing), or read the RBAC objects it stores.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};

use crate::faults::RequestKey;

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

#[derive(Clone, Debug)]
struct User {
    name: String,
    uid: String,
    groups: Vec<String>,
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
    tokens: HashMap<String, User>,
    grants: Vec<Grant>,
}

/// The registry a test fills; cheap to clone, shared with the server.
#[derive(Clone, Default)]
pub struct Reviews(Arc<Mutex<State>>);

impl Reviews {
    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A TokenReview of `token` authenticates it as `user` in `groups`
    /// (plus `system:authenticated`). Unknown tokens are not authenticated.
    pub fn add_token(&self, token: &str, user: &str, groups: &[&str]) {
        let mut groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        groups.push("system:authenticated".into());
        self.state().tokens.insert(
            token.to_owned(),
            User {
                name: user.to_owned(),
                uid: format!("uid-{user}"),
                groups,
            },
        );
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

    /// Forgets every token and grant.
    pub fn clear(&self) {
        let mut state = self.state();
        state.tokens.clear();
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
                "user": {"username": user.name, "uid": user.uid, "groups": user.groups},
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
