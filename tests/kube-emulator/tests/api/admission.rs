//! ValidatingAdmissionPolicies, evaluated on every write as the real API
//! server does: clients of distinct identities (`Emulator::client_as`), the
//! denial's code, reason and message, params from a Lease, what `object` and
//! `oldObject` are for each kind of write, and the failure policy.

use crate::common;

use common::{api_error, create_pod, pod};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{
    Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams, ResourceExt,
};
use kube_emulator::{Emulator, UserInfo};
use serde_json::{Value, json};

/// The node-name claim of a pod's bound ServiceAccount token.
const NODE_CLAIM: &str = "authentication.kubernetes.io/node-name";

/// An agent on `node`: the ServiceAccount default/agent, with its node claim.
fn agent(node: &str) -> UserInfo {
    UserInfo::service_account("default", "agent").with_extra(NODE_CLAIM, &[node])
}

/// Creates `policy` and a binding `<name>-binding` for it with `binding_spec`
/// (plus `policyName`; `validationActions: [Deny]` unless it says).
async fn install(emu: &Emulator, policy: Value, mut binding_spec: Value) {
    let name = policy["metadata"]["name"].as_str().unwrap().to_owned();
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(emu.client());
    let p: ValidatingAdmissionPolicy = serde_json::from_value(policy).unwrap();
    policies.create(&PostParams::default(), &p).await.unwrap();
    binding_spec["policyName"] = json!(name);
    if binding_spec.get("validationActions").is_none() {
        binding_spec["validationActions"] = json!(["Deny"]);
    }
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(emu.client());
    let b: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-binding")},
        "spec": binding_spec,
    }))
    .unwrap();
    bindings.create(&PostParams::default(), &b).await.unwrap();
}

fn config_map(name: &str, labels: Value, data: Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "data": data}))
        .unwrap()
}

/// The own-node policy: an agent writes only config maps labelled with its
/// own node.
fn own_node_policy() -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "own-node"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                "operations": ["CREATE", "UPDATE"]}]},
            "matchConditions": [{"name": "agents",
                "expression": "request.userInfo.username.startsWith('system:serviceaccount:')"}],
            "variables": [{"name": "node", "expression":
                "has(request.userInfo.extra) && 'authentication.kubernetes.io/node-name' in request.userInfo.extra ? request.userInfo.extra['authentication.kubernetes.io/node-name'][0] : ''"}],
            "validations": [{
                "expression": "has(object.metadata.labels) && 'node' in object.metadata.labels && object.metadata.labels['node'] == variables.node",
                "reason": "Forbidden",
                "messageExpression": "'the agent on ' + variables.node + ' writes its own node only'",
            }],
        },
    })
}

#[tokio::test]
async fn a_policy_refuses_one_agent_allows_another_and_does_not_match_the_admin() {
    let emu = common::start().await;
    install(&emu, own_node_policy(), json!({})).await;
    let as_a: Api<ConfigMap> = Api::default_namespaced(emu.client_as(&agent("gpu-node-2")));
    let as_b: Api<ConfigMap> = Api::default_namespaced(emu.client_as(&agent("gpu-node-1")));
    let as_admin: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let for_node_1 = config_map("node-1", json!({"node": "gpu-node-1"}), json!({"k": "v"}));

    let rv = emu.resource_version();
    let before = emu.requests();
    let e = api_error(as_a.create(&PostParams::default(), &for_node_1).await);
    let message = "ValidatingAdmissionPolicy 'own-node' with binding 'own-node-binding' denied \
                   request: the agent on gpu-node-2 writes its own node only";
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        e.message,
        format!("configmaps \"node-1\" is forbidden: {message}")
    );
    let details = e.details.unwrap();
    assert_eq!(
        (details.name.as_str(), details.kind.as_str()),
        ("node-1", "configmaps")
    );
    assert_eq!(details.causes.len(), 1);
    assert_eq!(details.causes[0].message, message);
    // Nothing stored, no revision spent; the request is counted and logged,
    // under the agent's name.
    assert!(emu.get("v1", "ConfigMap", "default", "node-1").is_none());
    assert_eq!(emu.resource_version(), rv);
    assert_eq!(emu.requests().since(&before).get("create", "configmaps"), 1);
    let last = emu.writes().pop().unwrap();
    assert_eq!(
        (last.verb.as_str(), last.user.as_str()),
        ("create", "system:serviceaccount:default:agent")
    );

    // The agent of that node may; the administrator is not matched at all.
    as_b.create(&PostParams::default(), &for_node_1)
        .await
        .unwrap();
    let for_node_3 = config_map("node-3", json!({"node": "gpu-node-3"}), json!({}));
    as_admin
        .create(&PostParams::default(), &for_node_3)
        .await
        .unwrap();
    assert_eq!(emu.writes().pop().unwrap().user, "system:admin");
    // An update is judged too: agent A cannot relabel B's config map.
    let e = api_error(
        as_a.patch(
            "node-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "w"}})),
        )
        .await,
    );
    assert_eq!(e.code, 403, "{e:?}");
    assert_eq!(
        emu.get("v1", "ConfigMap", "default", "node-1").unwrap()["data"]["k"],
        "v"
    );
}

#[tokio::test]
async fn the_token_registry_is_shared_with_token_reviews() {
    let emu = common::start().await;
    emu.reviews().add_token("alice-token", "alice", &["ops"]);
    let mut config = emu.config();
    config.auth_info = serde_json::from_value(json!({"token": "alice-token"})).unwrap();
    let alice: Api<ConfigMap> = Api::default_namespaced(kube::Client::try_from(config).unwrap());
    alice
        .create(
            &PostParams::default(),
            &config_map("a", json!({}), json!({})),
        )
        .await
        .unwrap();
    assert_eq!(emu.writes().pop().unwrap().user, "alice");
    // An unknown token is the administrator, as no token is.
    let mut config = emu.config();
    config.auth_info = serde_json::from_value(json!({"token": "nobody's"})).unwrap();
    let unknown: Api<ConfigMap> = Api::default_namespaced(kube::Client::try_from(config).unwrap());
    unknown.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(emu.writes().pop().unwrap().user, "system:admin");
    // The same identity gets the same token; clear() keeps the clients' tokens.
    let carol = UserInfo::new("carol", &["ops"]);
    assert_eq!(
        emu.kubeconfig_yaml_as(&carol),
        emu.kubeconfig_yaml_as(&carol)
    );
    assert!(emu.kubeconfig_yaml_as(&carol).contains("token: "));
    let as_carol: Api<ConfigMap> = Api::default_namespaced(emu.client_as(&carol));
    emu.reviews().clear();
    as_carol
        .create(
            &PostParams::default(),
            &config_map("c", json!({}), json!({})),
        )
        .await
        .unwrap();
    assert_eq!(emu.writes().pop().unwrap().user, "carol");
}

fn lease(holder: &str) -> Lease {
    serde_json::from_value(json!({"metadata": {"name": "leader"},
        "spec": {"holderIdentity": holder}}))
    .unwrap()
}

#[tokio::test]
async fn params_come_from_the_lease_and_a_missing_lease_denies() {
    let emu = common::start().await;
    install(
        &emu,
        json!({
            "metadata": {"name": "leader-only"},
            "spec": {
                "paramKind": {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"},
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                    "operations": ["CREATE"]}]},
                "matchConditions": [{"name": "agents",
                    "expression": "request.userInfo.username.startsWith('system:serviceaccount:')"}],
                "validations": [{
                    "expression": "params.spec.holderIdentity == request.userInfo.extra['authentication.kubernetes.io/node-name'][0]",
                    "reason": "Forbidden", "message": "only the leader"}],
            },
        }),
        json!({"paramRef": {"name": "leader", "namespace": "kube-system",
            "parameterNotFoundAction": "Deny"}}),
    )
    .await;
    let cms = |user: &UserInfo| -> Api<ConfigMap> { Api::default_namespaced(emu.client_as(user)) };
    let leader = cms(&agent("gpu-node-1"));
    let other = cms(&agent("gpu-node-2"));
    let admin = cms(&UserInfo::admin());
    let cm = |name: &str| config_map(name, json!({}), json!({}));

    // No Lease: refused before any match condition, so for everybody the
    // policy's rules cover, the administrator too (422: the error has no reason).
    let missing = "ValidatingAdmissionPolicy 'leader-only' with binding 'leader-only-binding' \
                   denied request: failed to configure binding: no params found for policy \
                   binding with `Deny` parameterNotFoundAction";
    for api in [&leader, &admin] {
        let e = api_error(api.create(&PostParams::default(), &cm("x")).await);
        assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
        assert_eq!(
            e.message,
            format!("configmaps \"x\" is forbidden: {missing}")
        );
    }
    // A Lease in another namespace is not the param.
    let default_leases: Api<Lease> = Api::default_namespaced(emu.client());
    default_leases
        .create(&PostParams::default(), &lease("gpu-node-1"))
        .await
        .unwrap();
    assert_eq!(
        api_error(leader.create(&PostParams::default(), &cm("x")).await).code,
        422
    );

    let leases: Api<Lease> = Api::namespaced(emu.client(), "kube-system");
    leases
        .create(&PostParams::default(), &lease("gpu-node-1"))
        .await
        .unwrap();
    leader
        .create(&PostParams::default(), &cm("a"))
        .await
        .unwrap();
    admin
        .create(&PostParams::default(), &cm("b"))
        .await
        .unwrap();
    let e = api_error(other.create(&PostParams::default(), &cm("c")).await);
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    assert!(
        e.message.ends_with("denied request: only the leader"),
        "{e:?}"
    );
    // The param is read at each request: the Lease changes hands.
    leases
        .patch(
            "leader",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "gpu-node-2"}})),
        )
        .await
        .unwrap();
    other
        .create(&PostParams::default(), &cm("c"))
        .await
        .unwrap();
    assert_eq!(
        api_error(leader.create(&PostParams::default(), &cm("d")).await).code,
        403
    );
}

/// A policy that refuses every write of `resources` by user `probe`, saying
/// in its message what it saw: `message` is the messageExpression.
async fn probe(emu: &Emulator, group: &str, resources: &[&str], message: &str) {
    install(
        emu,
        json!({
            "metadata": {"name": "probe"},
            "spec": {
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [group], "apiVersions": ["*"], "resources": resources,
                    "operations": ["*"]}]},
                "matchConditions": [{"name": "probe",
                    "expression": "request.userInfo.username == 'probe'"}],
                "validations": [{"expression": "false", "reason": "Forbidden",
                    "messageExpression": message}],
            },
        }),
        json!({}),
    )
    .await;
}

/// What the probe said about a refused write.
fn seen<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> String {
    let e = api_error(r);
    assert_eq!(e.code, 403, "{e:?}");
    let cause = &e.details.unwrap().causes[0].message;
    cause
        .split_once("denied request: ")
        .map(|(_, m)| m.to_owned())
        .unwrap_or_else(|| panic!("not the probe's denial: {cause}"))
}

/// The probe's message: operation, subresource, name, kind, and label `v`
/// of the new and the stored object.
const LABEL_V: &str = "request.operation + ' ' + \
    (has(request.subResource) ? request.subResource : '-') + ' ' + \
    (has(request.name) ? request.name : '-') + ' ' + request.kind.kind + \
    ' new=' + (object == null ? 'null' : object.metadata.labels.v) + \
    ' old=' + (oldObject == null ? 'null' : oldObject.metadata.labels.v) + \
    ' dryRun=' + string(request.dryRun) + ' ' + request.options.kind";

#[tokio::test]
async fn object_and_old_object_are_what_each_write_makes() {
    let emu = common::start().await;
    probe(&emu, "", &["configmaps"], LABEL_V).await;
    let probe_user = UserInfo::new("probe", &[]);
    let cms: Api<ConfigMap> = Api::default_namespaced(emu.client_as(&probe_user));
    let admin: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let cm = |v: &str| config_map("cm", json!({"v": v}), json!({}));
    let apply = |v: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "cm", "labels": {"v": v}}})
    };
    let pp = PatchParams::apply("probe-manager");

    assert_eq!(
        seen(cms.create(&PostParams::default(), &cm("1")).await),
        "CREATE - cm ConfigMap new=1 old=null dryRun=false CreateOptions"
    );
    // Server-side apply that creates is a CREATE (with CreateOptions).
    assert_eq!(
        seen(cms.patch("cm", &pp, &Patch::Apply(apply("1"))).await),
        "CREATE - cm ConfigMap new=1 old=null dryRun=false CreateOptions"
    );
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    assert_eq!(
        seen(cms.create(&dry, &cm("1")).await),
        "CREATE - cm ConfigMap new=1 old=null dryRun=true CreateOptions"
    );
    admin
        .create(&PostParams::default(), &cm("1"))
        .await
        .unwrap();
    let rv = emu.resource_version();
    // Every patch is an UPDATE, the patched object against the stored one.
    assert_eq!(
        seen(
            cms.patch(
                "cm",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"v": "2"}}}))
            )
            .await
        ),
        "UPDATE - cm ConfigMap new=2 old=1 dryRun=false UpdateOptions"
    );
    assert_eq!(
        seen(
            cms.patch(
                "cm",
                &PatchParams::default(),
                &Patch::<Value>::Json(
                    serde_json::from_value(
                        json!([{"op": "replace", "path": "/metadata/labels/v", "value": "3"}])
                    )
                    .unwrap()
                )
            )
            .await
        ),
        "UPDATE - cm ConfigMap new=3 old=1 dryRun=false UpdateOptions"
    );
    assert_eq!(
        // (forced: the label is the creator's, a conflict comes first)
        seen(
            cms.patch("cm", &pp.clone().force(), &Patch::Apply(apply("4")))
                .await
        ),
        "UPDATE - cm ConfigMap new=4 old=1 dryRun=false UpdateOptions"
    );
    let mut replaced = admin.get("cm").await.unwrap();
    replaced.labels_mut().insert("v".into(), "5".into());
    assert_eq!(
        seen(cms.replace("cm", &PostParams::default(), &replaced).await),
        "UPDATE - cm ConfigMap new=5 old=1 dryRun=false UpdateOptions"
    );
    assert_eq!(
        seen(cms.delete("cm", &DeleteParams::default()).await),
        "DELETE - cm ConfigMap new=null old=1 dryRun=false DeleteOptions"
    );
    // A deletecollection judges each object, without a request name.
    assert_eq!(
        seen(
            cms.delete_collection(&DeleteParams::default(), &ListParams::default())
                .await
        ),
        "DELETE - - ConfigMap new=null old=1 dryRun=false DeleteOptions"
    );
    // None of it happened.
    assert_eq!(emu.resource_version(), rv);
    assert_eq!(admin.get("cm").await.unwrap().labels()["v"], "1");
}

#[tokio::test]
async fn status_writes_and_evictions_are_judged_as_their_subresources() {
    let emu = common::start().await;
    probe(
        &emu,
        "",
        &["nodes/status", "pods/eviction"],
        "request.operation + ' ' + request.resource.resource + '/' + request.subResource + ' ' + \
         request.kind.group + '/' + request.kind.kind + ' ' + \
         (request.kind.kind == 'Node' ? object.status.phase + ' old=' + oldObject.status.phase + \
         ' labels=' + object.metadata.labels.v : 'pod=' + object.metadata.name + ' old=' + \
         (oldObject == null ? 'null' : 'set'))",
    )
    .await;
    let probe_user = UserInfo::new("probe", &[]);
    let admin: Api<Node> = Api::all(emu.client());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "n1", "labels": {"v": "1"}},
        "status": {"phase": "Pending"},
    }))
    .unwrap();
    admin.create(&PostParams::default(), &node).await.unwrap();
    let nodes: Api<Node> = Api::all(emu.client_as(&probe_user));
    assert_eq!(
        seen(
            nodes
                .patch_status(
                    "n1",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"phase": "Running"},
                                         "metadata": {"labels": {"v": "2"}}}))
                )
                .await
        ),
        // A status write changes status only: the labels stay.
        "UPDATE nodes/status /Node Running old=Pending labels=1"
    );
    // The main resource is not covered by the rule.
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"v": "3"}}})),
        )
        .await
        .unwrap();

    create_pod(
        &emu.client(),
        "default",
        pod("p", "n1", json!({"app": "x"}), true),
    )
    .await;
    let pods: Api<Pod> = Api::default_namespaced(emu.client_as(&probe_user));
    assert_eq!(
        seen(pods.evict("p", &EvictParams::default()).await),
        "CREATE pods/eviction policy/Eviction pod=p old=null"
    );
    // Refused before the pod is looked up, and the pod stays.
    assert_eq!(
        seen(pods.evict("gone", &EvictParams::default()).await),
        "CREATE pods/eviction policy/Eviction pod=gone old=null"
    );
    assert!(emu.get("v1", "Pod", "default", "p").is_some());
    // Deleting it is not an eviction: allowed.
    pods.delete("p", &DeleteParams::default()).await.unwrap();
}

async fn set_failure_policy(policies: &Api<ValidatingAdmissionPolicy>, to: &str) {
    policies
        .patch(
            "typo",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"failurePolicy": to}})),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn an_expression_error_fails_closed_unless_the_policy_ignores_it() {
    let emu = common::start().await;
    install(
        &emu,
        json!({
            "metadata": {"name": "typo"},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                    "operations": ["CREATE"]}]},
                "validations": [{"expression": "object.spec.replicas > 0", "reason": "Forbidden"}],
            },
        }),
        json!({}),
    )
    .await;
    let cms: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let e = api_error(
        cms.create(
            &PostParams::default(),
            &config_map("a", json!({}), json!({})),
        )
        .await,
    );
    // An error is not the validation's reason: Invalid.
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(
        e.message.starts_with(
            "configmaps \"a\" is forbidden: ValidatingAdmissionPolicy 'typo' with binding \
             'typo-binding' denied request: expression 'object.spec.replicas > 0' resulted in error: "
        ),
        "{}",
        e.message
    );
    assert!(emu.get("v1", "ConfigMap", "default", "a").is_none());
    // The policies themselves are never judged: it can be fixed, or ignored.
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(emu.client());
    set_failure_policy(&policies, "Ignore").await;
    cms.create(
        &PostParams::default(),
        &config_map("a", json!({}), json!({})),
    )
    .await
    .unwrap();
    // A binding without Deny refuses nothing either.
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(emu.client());
    set_failure_policy(&policies, "Fail").await;
    assert_eq!(
        api_error(
            cms.create(
                &PostParams::default(),
                &config_map("b", json!({}), json!({}))
            )
            .await
        )
        .code,
        422
    );
    bindings
        .patch(
            "typo-binding",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"validationActions": ["Warn"]}})),
        )
        .await
        .unwrap();
    cms.create(
        &PostParams::default(),
        &config_map("b", json!({}), json!({})),
    )
    .await
    .unwrap();
    assert_eq!(
        cms.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|c| c.name_any())
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
}
