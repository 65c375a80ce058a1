//! RBAC decisions over the Roles, ClusterRoles and their bindings the emulator
//! stores: for requests, once `Emulator::authorize_requests` turned that on
//! (the server's `authorize`), and for the checks the API server makes
//! *inside* a write (a ResourceClaim's status, see [`crate::resource_claim`]), worded
//! after the real `rbac/v1` evaluation (`pkg/registry/rbac/validation` and
//! `plugin/pkg/auth/authorizer/rbac`).
//!
//! Owns: whether one user may do one verb on one resource (group, resource,
//! subresource, namespace, name), given the stored RBAC objects: the
//! `system:masters` group is always allowed (the real server's privileged
//! group); otherwise a ClusterRoleBinding, or a RoleBinding in the request's
//! namespace, naming the user (kind `User`), one of its groups (`Group`) or
//! its ServiceAccount (`ServiceAccount`, `system:serviceaccount:<ns>:<name>`)
//! must refer to a role with a matching rule (verbs, apiGroups, resources as
//! `name`, `name/sub`, `*` or `*/sub`, resourceNames).
//!
//! Must not: read a request (the server turns it into [`Attributes`]), or
//! read anything but the objects it is given.
//! Aggregated ClusterRoles count with the rules they store (no aggregation
//! controller fills them in). Pure functions.

use serde_json::Value;

use crate::reviews::UserInfo;

/// The superuser group: the real server allows it everything before RBAC.
const MASTERS: &str = "system:masters";

/// What is authorized: the request attributes RBAC looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    /// Empty: a cluster-wide check (only ClusterRoleBindings apply).
    pub namespace: String,
    pub name: String,
}

/// The stored RBAC objects, as JSON.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    pub roles: Vec<Value>,
    pub cluster_roles: Vec<Value>,
    pub role_bindings: Vec<Value>,
    pub cluster_role_bindings: Vec<Value>,
}

fn meta_str<'a>(v: &'a Value, field: &str) -> &'a str {
    v.pointer(&format!("/metadata/{field}"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn strings(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Whether a binding's subject is this user (`appliesToUser`); `namespace` is
/// the binding's, the default for a ServiceAccount subject without one.
fn applies_to(subject: &Value, user: &UserInfo, namespace: &str) -> bool {
    let s = |k: &str| subject.get(k).and_then(Value::as_str).unwrap_or("");
    match s("kind") {
        "User" => s("name") == user.username,
        "Group" => user.groups.iter().any(|g| g == s("name")),
        "ServiceAccount" => {
            let ns = if s("namespace").is_empty() {
                namespace
            } else {
                s("namespace")
            };
            user.username == format!("system:serviceaccount:{ns}:{}", s("name"))
        }
        _ => false,
    }
}

/// Whether one policy rule covers the attributes (`RuleAllows`).
fn rule_allows(rule: &Value, a: &Attributes) -> bool {
    let verbs = strings(rule.get("verbs"));
    if !verbs.iter().any(|v| *v == "*" || *v == a.verb) {
        return false;
    }
    let groups = strings(rule.get("apiGroups"));
    if !groups.iter().any(|g| *g == "*" || *g == a.group) {
        return false;
    }
    let combined = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let resources = strings(rule.get("resources"));
    let resource_ok = resources.iter().any(|r| {
        *r == "*"
            || *r == combined
            || (!a.subresource.is_empty() && r.strip_prefix("*/") == Some(a.subresource.as_str()))
    });
    if !resource_ok {
        return false;
    }
    let names = strings(rule.get("resourceNames"));
    names.is_empty() || names.iter().any(|n| *n == a.name)
}

fn role_allows(role: Option<&Value>, a: &Attributes) -> bool {
    role.and_then(|r| r.get("rules"))
        .and_then(Value::as_array)
        .is_some_and(|rules| rules.iter().any(|rule| rule_allows(rule, a)))
}

fn named<'a>(objects: &'a [Value], namespace: &str, name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| meta_str(o, "name") == name && meta_str(o, "namespace") == namespace)
}

fn binds(binding: &Value, user: &UserInfo) -> bool {
    let ns = meta_str(binding, "namespace");
    binding
        .get("subjects")
        .and_then(Value::as_array)
        .is_some_and(|subjects| subjects.iter().any(|s| applies_to(s, user, ns)))
}

/// Whether `user` may do what `a` describes under `policy`.
pub fn allows(policy: &Policy, user: &UserInfo, a: &Attributes) -> bool {
    if user.groups.iter().any(|g| g == MASTERS) {
        return true;
    }
    let role_ref = |b: &Value, k: &str| {
        b.pointer(&format!("/roleRef/{k}"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let cluster_wide = policy.cluster_role_bindings.iter().any(|b| {
        binds(b, user)
            && role_ref(b, "kind") == "ClusterRole"
            && role_allows(named(&policy.cluster_roles, "", &role_ref(b, "name")), a)
    });
    if cluster_wide || a.namespace.is_empty() {
        return cluster_wide;
    }
    policy
        .role_bindings
        .iter()
        .filter(|b| meta_str(b, "namespace") == a.namespace && binds(b, user))
        .any(|b| {
            let name = role_ref(b, "name");
            match role_ref(b, "kind").as_str() {
                "ClusterRole" => role_allows(named(&policy.cluster_roles, "", &name), a),
                "Role" => role_allows(named(&policy.roles, &a.namespace, &name), a),
                _ => false,
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn driver_check(verb: &str, namespace: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            group: "resource.k8s.io".into(),
            resource: "resourceclaims".into(),
            subresource: "driver".into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn policy(rules: Value, binding_kind: &str) -> Policy {
        let subjects = json!([{"kind": "ServiceAccount", "name": "op", "namespace": "ops"}]);
        let mut p = Policy {
            cluster_roles: vec![json!({"metadata": {"name": "r"}, "rules": rules})],
            ..Policy::default()
        };
        let binding = json!({"metadata": {"name": "b", "namespace": "apps"},
            "roleRef": {"kind": "ClusterRole", "name": "r"}, "subjects": subjects});
        if binding_kind == "ClusterRoleBinding" {
            let mut b = binding;
            b["metadata"] = json!({"name": "b"});
            p.cluster_role_bindings.push(b);
        } else {
            p.role_bindings.push(binding);
        }
        p
    }

    #[test]
    fn a_driver_grant_covers_its_verb_and_name_only() {
        let sa = UserInfo::service_account("ops", "op");
        let p = policy(
            json!([{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
                    "resourceNames": ["gpu.amd.com"], "verbs": ["associated-node:patch"]}]),
            "ClusterRoleBinding",
        );
        assert!(allows(
            &p,
            &sa,
            &driver_check("associated-node:patch", "apps", "gpu.amd.com")
        ));
        assert!(!allows(
            &p,
            &sa,
            &driver_check("arbitrary-node:patch", "apps", "gpu.amd.com")
        ));
        assert!(!allows(
            &p,
            &sa,
            &driver_check("associated-node:update", "apps", "gpu.amd.com")
        ));
        assert!(!allows(
            &p,
            &sa,
            &driver_check("associated-node:patch", "apps", "net.example.com")
        ));
        let other = UserInfo::service_account("ops", "someone-else");
        assert!(!allows(
            &p,
            &other,
            &driver_check("associated-node:patch", "apps", "gpu.amd.com")
        ));
        assert!(allows(
            &p,
            &UserInfo::admin(),
            &driver_check("arbitrary-node:patch", "x", "y")
        ));
    }

    #[test]
    fn wildcards_and_role_bindings_match_as_rbac_does() {
        let sa = UserInfo::service_account("ops", "op");
        let p = policy(
            json!([{"apiGroups": ["*"], "resources": ["*/driver"], "verbs": ["*"]}]),
            "RoleBinding",
        );
        // A RoleBinding grants in its own namespace only, never cluster-wide.
        assert!(allows(
            &p,
            &sa,
            &driver_check("arbitrary-node:update", "apps", "d")
        ));
        assert!(!allows(
            &p,
            &sa,
            &driver_check("arbitrary-node:update", "other", "d")
        ));
        assert!(!allows(
            &p,
            &sa,
            &driver_check("arbitrary-node:update", "", "d")
        ));
        // `*/driver` is not `*/status`; `resourceclaims/status` is not the driver's.
        let mut status = driver_check("patch", "apps", "c");
        status.subresource = "status".into();
        assert!(!allows(&p, &sa, &status));
        let p = policy(
            json!([{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"],
                    "verbs": ["patch"]}]),
            "ClusterRoleBinding",
        );
        assert!(allows(&p, &sa, &status));
        assert!(!allows(&p, &sa, &driver_check("patch", "apps", "c")));
    }
}
