//! deploy/15-admission-policy.yaml against recorded admission requests.
//!
//! The ValidatingAdmissionPolicy lets only the pod holding the leader Lease
//! write Nodes other than its own and Services, and evict or delete Pods. Its CEL expressions are
//! evaluated here with a CEL interpreter, the way the API server applies them:
//! a request in the policy's `matchConstraints` whose `matchConditions` are all
//! true is matched; a matched request is allowed when every validation is true
//! with the Lease as `params`, and denied otherwise (or when the Lease is
//! missing: `parameterNotFoundAction: Deny`). The requests are
//! AdmissionReviews as the API server sends them, in tests/fixtures/admission/.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::admissionregistration::v1::{
    NamedRuleWithOperations, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use serde_json::Value;

const POLICY_FILE: &str = "deploy/15-admission-policy.yaml";
/// The operator's ServiceAccount, as the API server names it.
const AGENT_USER: &str = "system:serviceaccount:kube-amd-gpu:gpu-operator";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixture(name: &str) -> Value {
    let path = repo().join("tests/fixtures/admission").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn policy() -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let text = std::fs::read_to_string(repo().join(POLICY_FILE)).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    assert_eq!(docs.len(), 2, "{POLICY_FILE}: a policy and its binding");
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(docs[0].clone()).unwrap();
    let binding: ValidatingAdmissionPolicyBinding =
        serde_json::from_value(docs[1].clone()).unwrap();
    let (policy_doc, binding_doc) = (&docs[0], &docs[1]);
    // Nothing k8s-openapi does not know (a typo would be dropped silently).
    assert_eq!(&serde_json::to_value(&policy).unwrap(), policy_doc);
    assert_eq!(&serde_json::to_value(&binding).unwrap(), binding_doc);
    (policy, binding)
}

/// What the API server decides for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    /// Outside `matchConstraints`, or a match condition is false.
    NotMatched,
    Allowed,
    Denied,
}

/// Whether `rule` covers the request (group, version, resource[/subresource],
/// operation), as `matchConstraints.resourceRules` are matched.
fn rule_covers(rule: &NamedRuleWithOperations, request: &Value) -> bool {
    let has = |list: &Option<Vec<String>>, value: &str| {
        list.as_ref()
            .is_some_and(|l| l.iter().any(|v| v == "*" || v == value))
    };
    let resource = &request["resource"];
    let mut name = resource["resource"].as_str().unwrap_or("").to_owned();
    if let Some(sub) = request["subResource"].as_str().filter(|s| !s.is_empty()) {
        name = format!("{name}/{sub}");
    }
    has(&rule.api_groups, resource["group"].as_str().unwrap_or(""))
        && has(
            &rule.api_versions,
            resource["version"].as_str().unwrap_or(""),
        )
        && has(&rule.resources, &name)
        && has(
            &rule.operations,
            request["operation"].as_str().unwrap_or(""),
        )
}

fn value(json: &Value) -> cel::Value {
    cel::to_value(json).expect("JSON converts to a CEL value")
}

/// Evaluates one boolean expression; an error is a failure of the test (the
/// policy's expressions guard every optional field).
fn eval(expression: &str, vars: &[(&str, &Value)]) -> bool {
    let program = cel::Program::compile(expression)
        .unwrap_or_else(|e| panic!("CEL does not compile: {expression}\n{e}"));
    let mut context = cel::Context::default();
    for (name, json) in vars {
        context.add_variable_from_value(*name, value(json));
    }
    match program.execute(&context) {
        Ok(cel::Value::Bool(b)) => b,
        other => panic!("{expression}\n  evaluated to {other:?}, not a bool"),
    }
}

/// The policy's decision on `review` with `lease` (None: the Lease does not exist).
fn decide(policy: &ValidatingAdmissionPolicy, review: &Value, lease: Option<&Value>) -> Decision {
    let spec = policy.spec.as_ref().unwrap();
    let request = &review["request"];
    let rules = spec
        .match_constraints
        .as_ref()
        .and_then(|m| m.resource_rules.clone())
        .unwrap_or_default();
    if !rules.iter().any(|r| rule_covers(r, request)) {
        return Decision::NotMatched;
    }
    let object = request.get("object").cloned().unwrap_or(Value::Null);
    let old_object = request.get("oldObject").cloned().unwrap_or(Value::Null);
    // Match conditions see the request and objects, not the params.
    let vars = [
        ("request", request),
        ("object", &object),
        ("oldObject", &old_object),
    ];
    for condition in spec.match_conditions.iter().flatten() {
        if !eval(&condition.expression, &vars) {
            return Decision::NotMatched;
        }
    }
    let Some(params) = lease else {
        // parameterNotFoundAction: Deny (checked in the binding test).
        return Decision::Denied;
    };
    let vars = [
        ("request", request),
        ("object", &object),
        ("oldObject", &old_object),
        ("params", params),
    ];
    let all = spec
        .validations
        .iter()
        .flatten()
        .all(|v| eval(&v.expression, &vars));
    if all {
        Decision::Allowed
    } else {
        Decision::Denied
    }
}

/// Every fixture, with the Lease it is judged against and the decision.
fn cases() -> Vec<(&'static str, Option<&'static str>, Decision)> {
    use Decision::*;
    let lease = Some("lease.json");
    vec![
        // The leader (gpu-node-1/gpu-operator-x7k2p holds the Lease).
        ("leader-patches-another-node.json", lease, Allowed),
        ("leader-patches-its-own-node.json", lease, NotMatched),
        ("leader-creates-service.json", lease, Allowed),
        ("leader-deletes-service.json", lease, Allowed),
        // The drains of rolling driver upgrades.
        ("leader-evicts-a-pod.json", lease, Allowed),
        ("leader-deletes-a-pod.json", lease, Allowed),
        // A non-leader agent (gpu-node-2/gpu-operator-4kq9z).
        ("non-leader-patches-another-node.json", lease, Denied),
        ("non-leader-patches-another-node-status.json", lease, Denied),
        ("non-leader-patches-its-own-node.json", lease, NotMatched),
        (
            "non-leader-patches-its-own-node-status.json",
            lease,
            NotMatched,
        ),
        ("non-leader-creates-service.json", lease, Denied),
        ("non-leader-deletes-service.json", lease, Denied),
        ("non-leader-evicts-a-pod.json", lease, Denied),
        ("non-leader-deletes-a-pod.json", lease, Denied),
        // A token without node and pod claims cannot prove anything: refused.
        (
            "token-without-node-claims-patches-a-node.json",
            lease,
            Denied,
        ),
        // Not the operator's ServiceAccount: the policy does not apply, even
        // with the leader's node and pod claims.
        ("kubelet-patches-node-status.json", lease, NotMatched),
        ("admin-patches-a-node.json", lease, NotMatched),
        (
            "other-service-account-creates-service.json",
            lease,
            NotMatched,
        ),
        // Nobody leads: a released Lease, or none at all.
        (
            "leader-patches-another-node.json",
            Some("lease-released.json"),
            Denied,
        ),
        (
            "leader-creates-service.json",
            Some("lease-released.json"),
            Denied,
        ),
        ("leader-creates-service.json", None, Denied),
        // Own-node writes do not depend on the Lease.
        ("non-leader-patches-its-own-node.json", None, NotMatched),
    ]
}

#[test]
fn only_the_lease_holder_writes_other_nodes_and_services() {
    let (policy, _) = policy();
    let mut failures = Vec::new();
    for (review, lease, expected) in cases() {
        let lease_doc = lease.map(fixture);
        let got = decide(&policy, &fixture(review), lease_doc.as_ref());
        if got != expected {
            failures.push(format!(
                "{review} with {}: {got:?}, expected {expected:?}",
                lease.unwrap_or("no Lease")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_fixture_is_judged_and_is_what_the_api_server_sends() {
    let judged: Vec<&str> = cases()
        .iter()
        .flat_map(|(r, l, _)| [Some(*r), *l])
        .flatten()
        .collect();
    let dir = repo().join("tests/fixtures/admission");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert!(files.len() >= 10, "{files:?}");
    for file in &files {
        assert!(judged.contains(&file.as_str()), "{file} is not in cases()");
        let doc = fixture(file);
        if file.starts_with("lease") {
            let lease: k8s_openapi::api::coordination::v1::Lease =
                serde_json::from_value(doc).unwrap();
            assert_eq!(
                lease.metadata.name.as_deref(),
                Some(gpu_operator::cluster::lease::DEFAULT_LEASE_NAME)
            );
            continue;
        }
        // An AdmissionReview v1 request: the fields the policy reads are there.
        assert_eq!(doc["apiVersion"], "admission.k8s.io/v1", "{file}");
        assert_eq!(doc["kind"], "AdmissionReview", "{file}");
        let request = &doc["request"];
        for field in ["uid", "kind", "resource", "operation", "userInfo", "name"] {
            assert!(!request[field].is_null(), "{file}: request.{field}");
        }
        assert!(request["userInfo"]["username"].is_string(), "{file}");
        // The agents' tokens carry one node and one pod name, or none.
        if request["userInfo"]["username"] == AGENT_USER {
            let extra = request["userInfo"]["extra"].as_object().unwrap();
            for key in [
                "authentication.kubernetes.io/node-name",
                "authentication.kubernetes.io/pod-name",
            ] {
                assert!(
                    extra
                        .get(key)
                        .is_none_or(|v| v.as_array().is_some_and(|a| a.len() == 1)),
                    "{file}: {key}"
                );
            }
        }
    }
}

#[test]
fn the_leaders_identity_is_the_node_and_pod_the_token_names() {
    // The policy compares holderIdentity with "<node-name>/<pod-name>" from
    // the token: the agent's identity is built the same way (agent::run in
    // src/cli/agent.rs; tests/deploy_manifests.rs checks the real binary's Lease).
    let lease = fixture("lease.json");
    let review = fixture("leader-patches-another-node.json");
    let extra = &review["request"]["userInfo"]["extra"];
    let identity = format!(
        "{}/{}",
        extra["authentication.kubernetes.io/node-name"][0]
            .as_str()
            .unwrap(),
        extra["authentication.kubernetes.io/pod-name"][0]
            .as_str()
            .unwrap()
    );
    assert_eq!(lease["spec"]["holderIdentity"], identity.as_str());
}

#[test]
fn the_binding_uses_the_leader_lease_and_denies_without_it() {
    let (policy, binding) = policy();
    let spec = policy.spec.as_ref().unwrap();
    let param = spec.param_kind.as_ref().unwrap();
    assert_eq!(param.api_version.as_deref(), Some("coordination.k8s.io/v1"));
    assert_eq!(param.kind.as_deref(), Some("Lease"));
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
    let binding = binding.spec.unwrap();
    assert_eq!(
        binding.policy_name.as_deref(),
        policy.metadata.name.as_deref()
    );
    assert_eq!(binding.validation_actions, Some(vec!["Deny".to_owned()]));
    let param_ref = binding.param_ref.unwrap();
    assert_eq!(
        param_ref.name.as_deref(),
        Some(gpu_operator::cluster::lease::DEFAULT_LEASE_NAME)
    );
    assert_eq!(param_ref.namespace.as_deref(), Some("kube-amd-gpu"));
    assert_eq!(
        param_ref.parameter_not_found_action.as_deref(),
        Some("Deny")
    );
    // The DaemonSet's agents run as the user the policy is scoped to.
    let conditions: BTreeMap<String, String> = spec
        .match_conditions
        .iter()
        .flatten()
        .map(|c| (c.name.clone(), c.expression.clone()))
        .collect();
    assert!(
        conditions["gpu-operator-service-account"].contains(AGENT_USER),
        "{conditions:?}"
    );
}
