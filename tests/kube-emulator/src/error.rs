//! API errors as the real API server reports them: a `metav1.Status` body with a code and a
//! reason. Every failure the emulator answers goes through [`ApiError`], so clients see the
//! same `kind: Status` objects (and kube-rs the same `Error::Api`) as against a real cluster.
//!
//! This module only builds values; it does no I/O.

use serde_json::{Value, json};

/// One cause inside `status.details.causes`, as the real server lists for `Invalid` errors.
#[derive(Clone, Debug, PartialEq)]
pub struct Cause {
    pub reason: String,
    pub message: String,
    pub field: Option<String>,
}

/// An error answer: HTTP code plus the `metav1.Status` fields.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    /// `status.details`, boxed to keep results small.
    pub details: Box<Details>,
}

/// `metav1.StatusDetails`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Details {
    /// `details.name`, `details.group`, `details.kind` (the resource name, as the server writes it).
    pub name: Option<String>,
    pub group: Option<String>,
    pub kind: Option<String>,
    pub causes: Vec<Cause>,
    /// `details.retryAfterSeconds`; also sent as the `Retry-After` header.
    pub retry_after_seconds: Option<u32>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

/// A group/resource pair, used to word messages like `leases.coordination.k8s.io "x" not found`.
#[derive(Clone, Copy, Debug)]
pub struct Qualified<'a> {
    pub group: &'a str,
    pub resource: &'a str,
}

impl std::fmt::Display for Qualified<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.group.is_empty() {
            write!(f, "{}", self.resource)
        } else {
            write!(f, "{}.{}", self.resource, self.group)
        }
    }
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: Box::default(),
        }
    }

    fn with_target(mut self, q: Qualified<'_>, name: &str) -> Self {
        self.details.name = Some(name.to_string());
        if !q.group.is_empty() {
            self.details.group = Some(q.group.to_string());
        }
        self.details.kind = Some(q.resource.to_string());
        self
    }

    pub fn not_found(q: Qualified<'_>, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{q} \"{name}\" not found")).with_target(q, name)
    }

    /// The answer for a path that names no resource the server knows.
    pub fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    pub fn already_exists(q: Qualified<'_>, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{q} \"{name}\" already exists"),
        )
        .with_target(q, name)
    }

    /// Optimistic-concurrency failure: the client sent a stale `resourceVersion`.
    pub fn conflict(q: Qualified<'_>, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {q} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again"
            ),
        )
        .with_target(q, name)
    }

    /// A conflict with a custom message (failed preconditions, server-side apply conflicts).
    pub fn conflict_msg(q: Qualified<'_>, name: &str, message: impl Into<String>) -> Self {
        Self::new(409, "Conflict", message).with_target(q, name)
    }

    /// `422 Invalid`, worded like the real server: `Kind "name" is invalid: field: detail`.
    pub fn invalid(kind: &str, group: &str, name: &str, causes: Vec<Cause>) -> Self {
        let joined = causes
            .iter()
            .map(|c| match &c.field {
                Some(f) => format!("{f}: {}", c.message),
                None => c.message.clone(),
            })
            .collect::<Vec<_>>()
            .join(", ");
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {joined}"),
        );
        e.details.name = Some(name.to_string());
        if !group.is_empty() {
            e.details.group = Some(group.to_string());
        }
        e.details.kind = Some(kind.to_string());
        e.details.causes = causes;
        e
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// `410` for a `resourceVersion` or continue token older than the retained history.
    /// The real server uses reason `Expired` here (and kube-runtime only looks at the code).
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn too_many_requests(message: impl Into<String>) -> Self {
        Self::new(429, "TooManyRequests", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The reason the real server pairs with a bare HTTP code; used for injected faults.
    pub fn reason_for_code(code: u16) -> &'static str {
        match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            405 => "MethodNotAllowed",
            406 => "NotAcceptable",
            409 => "Conflict",
            410 => "Gone",
            415 => "UnsupportedMediaType",
            422 => "Invalid",
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "Unknown",
        }
    }

    /// The `metav1.Status` object for this error.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        let mut details = serde_json::Map::new();
        let d = &self.details;
        if let Some(n) = &d.name {
            details.insert("name".into(), json!(n));
        }
        if let Some(g) = &d.group {
            details.insert("group".into(), json!(g));
        }
        if let Some(k) = &d.kind {
            details.insert("kind".into(), json!(k));
        }
        if !d.causes.is_empty() {
            let causes: Vec<Value> = d
                .causes
                .iter()
                .map(|c| {
                    // A cause without a reason (an admission policy's) has none.
                    let mut m = json!({"message": c.message});
                    if !c.reason.is_empty() {
                        m["reason"] = json!(c.reason);
                    }
                    if let Some(f) = &c.field {
                        m["field"] = json!(f);
                    }
                    m
                })
                .collect();
            details.insert("causes".into(), Value::Array(causes));
        }
        if let Some(s) = d.retry_after_seconds {
            details.insert("retryAfterSeconds".into(), json!(s));
        }
        if !details.is_empty() {
            status["details"] = Value::Object(details);
        }
        status
    }
}

/// Shorthand for `Result<T, ApiError>`.
pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_is_a_real_status() {
        let q = Qualified {
            group: "coordination.k8s.io",
            resource: "leases",
        };
        let s = ApiError::not_found(q, "l1").to_status();
        assert_eq!(s["kind"], "Status");
        assert_eq!(s["code"], 404);
        assert_eq!(s["reason"], "NotFound");
        assert_eq!(s["message"], "leases.coordination.k8s.io \"l1\" not found");
        assert_eq!(s["details"]["group"], "coordination.k8s.io");
        assert_eq!(s["details"]["kind"], "leases");
    }

    #[test]
    fn invalid_lists_causes() {
        let e = ApiError::invalid(
            "Pod",
            "",
            "p",
            vec![Cause {
                reason: "FieldValueRequired".into(),
                message: "Required value".into(),
                field: Some("metadata.name".into()),
            }],
        );
        let s = e.to_status();
        assert_eq!(s["code"], 422);
        assert_eq!(s["details"]["causes"][0]["field"], "metadata.name");
        assert!(s["message"].as_str().unwrap().contains("is invalid"));
    }
}
