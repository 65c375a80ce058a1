//! Requests authorized by the stored RBAC objects (`Emulator::authorize_requests`),
//! as the real server's RBAC authorizer decides them: what a ServiceAccount's
//! Role and ClusterRole grant passes; anything else is `403 Forbidden`,
//! worded as the server words it; a server-side apply of a missing object
//! needs `create` as well as `patch`; a list or watch of one object by name
//! is authorized for that name; and with authorization off, or for a request
//! without a token, everything passes.

use crate::common;

use common::api_error;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube_emulator::{Emulator, UserInfo};
use serde_json::json;

fn agent() -> UserInfo {
    UserInfo::service_account("ops", "agent")
}

/// The agent may read Nodes (all) and patch node `n1` only; in namespace
/// `ops` it may get and patch ConfigMaps, and create none.
fn grant(emu: &Emulator) {
    for object in [
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ops"}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "agent"},
        "rules": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["nodes"], "resourceNames": ["n1"], "verbs": ["patch"]},
        ]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "agent"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "agent"},
            "subjects": [{"kind": "ServiceAccount", "namespace": "ops", "name": "agent"}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "agent", "namespace": "ops"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "patch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "agent", "namespace": "ops"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agent"},
            "subjects": [{"kind": "ServiceAccount", "namespace": "ops", "name": "agent"}]}),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "here", "namespace": "ops"}}),
    ] {
        emu.create(object).expect("fixture created");
    }
}

fn labelled(key: &str) -> Patch<serde_json::Value> {
    Patch::Merge(json!({"metadata": {"labels": {key: "yes"}}}))
}

#[tokio::test]
async fn requests_get_only_what_the_stored_rbac_grants() {
    let emu = common::start().await;
    grant(&emu);
    let nodes: Api<Node> = Api::all(emu.client_as(&agent()));
    let config_maps: Api<ConfigMap> = Api::namespaced(emu.client_as(&agent()), "ops");

    // Off (the default): everything passes, granted or not.
    nodes
        .patch("n2", &PatchParams::default(), &labelled("before"))
        .await
        .expect("no authorization yet");

    emu.authorize_requests(true);
    assert_eq!(
        nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );
    nodes
        .patch("n1", &PatchParams::default(), &labelled("granted"))
        .await
        .expect("n1 may be patched");
    let refused = api_error(
        nodes
            .patch("n2", &PatchParams::default(), &labelled("refused"))
            .await,
    );
    assert_eq!(refused.code, 403, "{refused:?}");
    assert_eq!(refused.reason, "Forbidden");
    assert_eq!(
        refused.message,
        "nodes \"n2\" is forbidden: User \"system:serviceaccount:ops:agent\" cannot patch resource \"nodes\" in API group \"\" at the cluster scope"
    );
    // The status subresource is a resource of its own.
    let status = api_error(
        nodes
            .patch_status("n1", &PatchParams::default(), &labelled("status"))
            .await,
    );
    assert_eq!(status.code, 403, "{status:?}");
    assert!(
        status.message.contains("resource \"nodes/status\""),
        "{status:?}"
    );
    // Nothing was written by a refused request.
    let n2 = emu.get("v1", "Node", "", "n2").unwrap();
    assert!(n2["metadata"]["labels"].get("refused").is_none(), "{n2}");

    // A Role binds in its namespace only; an apply of a missing object is a
    // create too.
    config_maps.get("here").await.expect("granted in ops");
    let apply = PatchParams::apply("agent");
    let made = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "new", "namespace": "ops"}});
    let create = api_error(config_maps.patch("new", &apply, &Patch::Apply(&made)).await);
    assert_eq!(create.code, 403, "{create:?}");
    assert!(
        create
            .message
            .contains("cannot create resource \"configmaps\"")
            && create.message.contains("in the namespace \"ops\""),
        "{create:?}"
    );
    let existing = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "here", "namespace": "ops", "labels": {"applied": "yes"}}});
    config_maps
        .patch("here", &apply, &Patch::Apply(&existing))
        .await
        .expect("an apply of an existing object is a patch");
    let elsewhere: Api<ConfigMap> = Api::namespaced(emu.client_as(&agent()), "default");
    let refused = api_error(elsewhere.list(&ListParams::default()).await);
    assert_eq!(refused.code, 403, "{refused:?}");
    let post = api_error(
        config_maps
            .create(
                &PostParams::default(),
                &serde_json::from_value(made.clone()).unwrap(),
            )
            .await,
    );
    assert_eq!(post.code, 403, "{post:?}");

    // Each refusal is logged, in order.
    let refused = emu.refused();
    assert_eq!(refused.len(), 5, "{refused:#?}");
    assert!(
        refused[0].starts_with("nodes \"n2\" is forbidden"),
        "{refused:#?}"
    );

    // A request without a token is an administrator's.
    let admin: Api<Node> = Api::all(emu.client());
    admin
        .patch("n2", &PatchParams::default(), &labelled("admin"))
        .await
        .expect("the administrator passes");
}

/// A list or watch of one object by `metadata.name` is authorized for that
/// name, so a grant limited by `resourceNames` covers a watch of it.
#[tokio::test]
async fn a_list_of_one_object_by_name_is_authorized_for_that_name() {
    let emu = common::start().await;
    emu.create(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "one-node"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "resourceNames": ["n1"],
            "verbs": ["get", "list", "watch"]}]}),
    )
    .unwrap();
    emu.create(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "one-node"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "one-node"},
        "subjects": [{"kind": "ServiceAccount", "namespace": "ops", "name": "agent"}]}))
    .unwrap();
    emu.create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}))
        .unwrap();
    emu.authorize_requests(true);
    let nodes: Api<Node> = Api::all(emu.client_as(&agent()));
    let one = nodes
        .list(&ListParams::default().fields("metadata.name=n1"))
        .await
        .expect("a list of n1 by name");
    assert_eq!(one.items.len(), 1);
    let all = api_error(nodes.list(&ListParams::default()).await);
    assert_eq!(all.code, 403, "{all:?}");
    let other = api_error(
        nodes
            .list(&ListParams::default().fields("metadata.name=n2"))
            .await,
    );
    assert_eq!(other.code, 403, "{other:?}");
}
